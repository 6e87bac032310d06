"""Old adapter marks: the removals an earlier dsh only marked, put on the surface as removals.

dsh from a12a84a until bef2f0b recorded a framework adapter's clear as an ignorable
``<fmt>/clear {through}`` event and a pop as ``<fmt>/pop {seq, index}`` (``fmt``: one of
:data:`OLD_MARK_FORMATS`), which only the adapter honoured. Since bef2f0b a removal is a
surface operation: an empty ``assistant/message`` replace whose ``source.removal`` names it
(:func:`append_removals`), or, for a popped tool output whose call stays, a placeholder
``tool/result`` rewrite (:func:`append_withheld`).

Invariants this module owns: :func:`apply_old_marks` appends, for the marks of a log, exactly
the removals they stand for that the surface does not already show (nodes off the surface are
skipped), so applying twice adds nothing; the appended events keep the turn/step shape
(each removal in a turn and step of its own). No I/O: the caller appends to a live session
(a writer's resume, which persists them once) or to a detached one (a read, in memory).

Rule: docs/forgetting.md#logs-from-before-surface-removals, docs/formats.md#old-adapter-marks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from dsh.session._events import Event
from dsh.session._session import Session

OLD_MARK_FORMATS: Final = ("openai-agents", "langchain", "pydantic-ai")
"""The record formats whose adapters wrote ``<fmt>/pop`` and ``<fmt>/clear`` marks before
removals went onto the surface (a12a84a until bef2f0b)."""

_CLEARS: Final = {f"{fmt}/clear": fmt for fmt in OLD_MARK_FORMATS}
_POPS: Final = {f"{fmt}/pop": fmt for fmt in OLD_MARK_FORMATS}

OLD_MARK_TYPES: Final = frozenset(_CLEARS) | frozenset(_POPS)
"""Every event type an old mark has (``<fmt>/clear`` and ``<fmt>/pop`` of each format)."""

REMOVAL_MODEL: Final = "surface-removal"
"""``source.model`` (provider ``dsh``) of the empty ``assistant/message`` that takes removed
messages off the surface; its ``source.removal`` says why and what (:func:`append_removals`)."""

REMOVED_RESULT_TEXT: Final = "[removed from the model view: this tool output was popped]"
"""The content of the placeholder result :func:`append_withheld` leaves for a removed tool
output whose call stays (``dsh show`` marks a rewritten result of this text REMOVED)."""

_TURN_START: Final = ("turn/start",)


class OldMarks:
    """What the old marks of a log (or of a prefix of it) say was removed; a value (immutable).

    A plain class, not a dataclass: it is defined at every ``import dsh``, where a dataclass's
    generated methods cost about a millisecond.

    Attributes:
        through: The largest ``through`` of a ``<fmt>/clear`` (every surface node up to that
            seq removed), or -1 when there is none.
        popped: ``(seq, fmt)`` of each ``<fmt>/pop``, in log order (the event ``seq`` removed;
            ``fmt`` the adapter's format, for the ``<fmt>/closed-early`` a withheld result gets).
    """

    __slots__ = ("popped", "through")

    through: int
    popped: tuple[tuple[int, str], ...]

    def __init__(self, through: int = -1, popped: tuple[tuple[int, str], ...] = ()) -> None:
        object.__setattr__(self, "through", through)
        object.__setattr__(self, "popped", popped)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"OldMarks is immutable (cannot set {name})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OldMarks):
            return NotImplemented
        return self.through == other.through and self.popped == other.popped

    def __hash__(self) -> int:
        return hash((self.through, self.popped))

    def __repr__(self) -> str:
        return f"OldMarks(through={self.through!r}, popped={self.popped!r})"

    def __bool__(self) -> bool:
        return self.through >= 0 or bool(self.popped)

    def taking(self, events: Iterable[Mapping[str, Any]]) -> OldMarks:
        """These marks and those among ``events`` (in log order); ``self`` when they hold none.

        A mark of another shape than the adapter wrote (not ``ignorable``, no integer field)
        is skipped: the adapter's own read names it (docs/formats.md#old-adapter-marks).
        """
        through, popped = self.through, list(self.popped)
        for event in events:
            kind = event["type"]
            if kind not in OLD_MARK_TYPES:
                continue
            found = old_mark(event)
            if found is None:
                continue
            if kind in _CLEARS:
                through = max(through, found)
            else:
                popped.append((found, _POPS[kind]))
        if through == self.through and len(popped) == len(self.popped):
            return self
        return OldMarks(through, tuple(popped))

    def to_wire(self) -> dict[str, Any]:
        """``{"through": int, "popped": [[seq, fmt], ...]}`` (a restore point's ``oldMarks``)."""
        return {"through": self.through, "popped": [[seq, fmt] for seq, fmt in self.popped]}

    @classmethod
    def from_wire(cls, value: object) -> OldMarks:
        """Validate and build marks from :meth:`to_wire` output.

        Raises:
            ValueError: a field is missing, extra, or of the wrong type.
        """
        if not isinstance(value, Mapping) or set(value) != {"through", "popped"}:
            raise ValueError("restore state field oldMarks must be an object with through "
                             "and popped")
        through, popped = value["through"], value["popped"]
        if type(through) is not int or through < -1:
            raise ValueError("restore state field oldMarks.through must be -1 or a seq")
        if not isinstance(popped, list) or not all(
                isinstance(p, list) and len(p) == 2 and type(p[0]) is int and p[0] >= 0
                and p[1] in OLD_MARK_FORMATS for p in popped):
            raise ValueError("restore state field oldMarks.popped must be [seq, format] pairs")
        return cls(through, tuple((seq, fmt) for seq, fmt in popped))


NO_OLD_MARKS: Final = OldMarks()
"""A log holding no old mark."""


def old_mark(event: Mapping[str, Any]) -> int | None:
    """The seq an old mark names (a clear's ``through``, a pop's ``seq``), else None.

    None for any other event, and for a mark of another shape than the adapter wrote.
    """
    kind = event["type"]
    if kind not in OLD_MARK_TYPES or event.get("ignorable") is not True:
        return None
    data = event.get("data")
    value = data.get("through" if kind in _CLEARS else "seq") if isinstance(data, Mapping) \
        else None
    return value if type(value) is int and value >= 0 else None


def next_turn(session: Session) -> int:
    """The number a turn appended to ``session`` gets: its last ``turn/start``'s ``turn`` + 1.

    As the agent's recorder numbers turns (a ``turn`` that is no integer counts as 0); a log
    paged in through a restore point that names its last turn reads nothing before its cut.
    """
    events = session.events
    prefix = session.prefix_turns()
    if prefix is not None:
        cut, last_turn, _ = prefix
        for event in reversed(events[cut:]):  # resident: the tail of a paged log
            if event["type"] == "turn/start":
                return _turn_of(event) + 1
        return last_turn + 1
    for start in events.select_back(_TURN_START):
        return _turn_of(start) + 1
    return 1


def _turn_of(event: Mapping[str, Any]) -> int:
    data = event.get("data")
    turn = data.get("turn") if isinstance(data, Mapping) else None
    return turn if type(turn) is int else 0


def removal_runs(session: Session, seqs: Iterable[int]) -> list[list[int]]:
    """The runs of consecutive surface nodes among ``seqs`` (others ignored), in surface order.

    A ``system/message`` at surface node 0 is left out: only a system message may shadow it.
    """
    wanted = set(seqs)
    runs: list[list[int]] = []
    if not wanted:
        return runs
    previous = -2
    for position, seq in enumerate(session.surface.nodes):
        if seq not in wanted or (position == 0 and session.event_at(seq)["type"]
                                 == "system/message"):
            continue
        if position == previous + 1 and runs:
            runs[-1].append(seq)
        else:
            runs.append([seq])
        previous = position
    return runs


def append_removals(session: Session, runs: Sequence[Sequence[int]], *, form: str,
                    turn: int, replacement: Mapping[str, Any] | None = None) -> list[Event]:
    """Take each run of surface nodes off the model view; the log keeps their bytes.

    Each run (:func:`removal_runs`) is shadowed by one ``assistant/message`` replace whose
    content is empty, which projects no message, citing the nodes it shadows in
    ``sourceEventSeqs``; its ``source.removal`` is ``{"form": form, "removed": run}``. All sit
    in one turn numbered ``turn`` (the session's log must end outside a turn), each in a step
    of its own, so the log keeps its turn/step invariants. With ``replacement`` (one run only),
    that assistant message stands in for the run instead.

    Returns:
        The appended events (turn and step brackets included); none for no run.

    Rule: docs/adapters.md#cleared-means-cleared
    """
    if not runs:
        return []
    # (imported here: a session's open, read or append never needs the message constructors,
    # and `import dsh` stays without them)
    from dsh._messages import create_assistant_message

    before = session.seq
    session.append("turn/start", {"turn": turn})
    for step, run in enumerate(runs, start=1):
        where = {"turn": turn, "step": step}
        session.append("step/start", where)
        if replacement is not None:
            made, source = replacement, {**replacement["source"], "replaces": list(run)}
        else:
            made = create_assistant_message(content=[], provider="dsh", model=REMOVAL_MODEL)
            source = {**made["source"], "removal": {"form": form, "removed": list(run)}}
        session.append("assistant/message", {**where, "message": {**made, "source": source}},
                       surface_op={"op": "replace", "start": run[0], "end": run[-1]},
                       source_event_seqs=list(run))
        session.append("step/end", where)
    session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
    return list(session.events[before:])


def append_withheld(session: Session, seq: int, fmt: str, *, turn: int) -> Event:
    """Take the ``tool/result`` at surface node ``seq`` off the model view; its call stays answered.

    The node is replaced, in a turn (numbered ``turn``) and step of its own, by a content-only
    rewrite of the result whose text is :data:`REMOVED_RESULT_TEXT`, and an ignorable
    ``<fmt>/closed-early {seqs: [placeholder]}`` names the placeholder, so the framework reads
    no item for it. The log keeps the result's bytes.

    Returns:
        The placeholder event.

    Rule: docs/adapters.md#cleared-means-cleared
    """
    data = session.event_at(seq)["data"]
    message = data["message"]
    block = message["content"][0]
    text = {"type": "text", "text": REMOVED_RESULT_TEXT}
    where = {"turn": turn, "step": 1}
    session.append("turn/start", {"turn": turn})
    session.append("step/start", where)
    made = session.append("tool/result",
                          {**data, "message": {**message,
                                               "content": [{**block, "content": [text]}]}},
                          surface_op={"op": "replace", "start": seq, "end": seq},
                          source_event_seqs=[seq])
    session.append("step/end", where)
    session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
    session.append(f"{fmt}/closed-early", {"seqs": [made["seq"]]}, ignorable=True)
    return made


def apply_old_marks(session: Session, marks: OldMarks | None = None) -> list[Event]:
    """Append to ``session`` the surface removals its old marks stand for, not yet on it.

    Every surface node up to a clear's ``through`` leaves (:func:`append_removals`, form
    ``clear``); a popped event leaves whole (form ``pop``); a popped ``tool/result`` is
    withheld (:func:`append_withheld`), so its call stays answered. Nodes already off the
    surface are skipped: applying twice adds nothing, nor does a second mark of one event.
    The log must end outside a turn (a resume's repair closed it).

    Args:
        session: A restored session: live (a writer's resume persists what is appended) or
            detached (a read: in memory only).
        marks: The marks of its whole log, when the caller knows them (a resume through a
            restore point that carries them, plus its tail); None: read from the log.

    Returns:
        The events appended to ``session`` (none when nothing is left to remove).

    Rule: docs/forgetting.md#logs-from-before-surface-removals
    """
    if marks is None:
        marks = NO_OLD_MARKS.taking(session.events.select_back(OLD_MARK_TYPES))
        marks = OldMarks(marks.through, marks.popped[::-1])  # (select_back: newest first)
    if not marks:
        return []
    nodes = session.surface.nodes
    through = marks.through
    cleared = [seq for seq in nodes if seq <= through] if through >= 0 else []
    # (sets: a surface of 100k nodes is not searched once a mark)
    on_surface = {seq for seq, _ in marks.popped}.intersection(nodes) if marks.popped \
        else set()
    cleared_set = set(cleared)
    before = session.seq
    runs = removal_runs(session, cleared)
    if runs:
        append_removals(session, runs, form="clear", turn=next_turn(session))
    withheld: list[tuple[int, str]] = []
    gone: list[int] = []
    for seq, fmt in marks.popped:
        if seq in on_surface and seq not in cleared_set:
            on_surface.discard(seq)  # an event two marks name leaves once
            if session.event_at(seq)["type"] == "tool/result":
                withheld.append((seq, fmt))
            else:
                gone.append(seq)
    for seq, fmt in withheld:
        append_withheld(session, seq, fmt, turn=next_turn(session))
    runs = removal_runs(session, gone)
    if runs:
        append_removals(session, runs, form="pop", turn=next_turn(session))
    return list(session.events[before:])

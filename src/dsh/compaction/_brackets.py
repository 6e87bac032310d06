"""The compaction invariant companion: ``compaction/*`` brackets are well formed.

Rule: docs/rules.md#compaction-brackets.

:func:`check_compaction_log` checks a whole log (``dsh verify`` uses it); a
:class:`CompactionInvariant` validates each event before it is committed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dsh._errors import InvariantError
from dsh.compaction._summarizers import (
    is_checkpoint_source,
)
from dsh.session import Event, Violation


@dataclass(frozen=True, slots=True)
class _Bracket:
    compaction_id: str
    owner: int | None
    start_seq: int
    summarized: bool = False


@dataclass(frozen=True, slots=True)
class CompactionTraceState:
    """The bracket trace after a prefix of a log.

    Attributes:
        open_turn: Number of the open turn, or None.
        bracket: The open compaction bracket (id, owner, start seq, summarized), or None.
    """

    open_turn: int | None = None
    bracket: _Bracket | None = None


class _Broken(Exception):
    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule


def _owner_name(owner: int | None) -> str:
    return "the standalone owner" if owner is None else f"turn {owner}"


_WATCHED: Final = frozenset({"turn/start", "turn/end", "session/end-seed", "user/message"})
"""The types besides ``compaction/*`` that :func:`_step` looks at."""


def _step(state: CompactionTraceState, event: Event, tolerated: frozenset[int]
          ) -> CompactionTraceState:
    """Validate ``event`` against ``state`` and return the next state (raises _Broken)."""
    kind = event["type"]
    data = event["data"]
    bracket = state.bracket
    if kind == "turn/start" or kind == "turn/end":
        if bracket is not None and bracket.start_seq not in tolerated:
            raise _Broken("CROSSING", f"{kind} at seq {event['seq']} crosses the open compaction "
                          f"bracket {bracket.compaction_id!r} of {_owner_name(bracket.owner)} "
                          f"(opened at seq {bracket.start_seq})")
        if kind == "turn/end":
            return CompactionTraceState(None, bracket)
        number = data.get("turn") if isinstance(data, dict) else None
        return CompactionTraceState(number if type(number) is int else -1, bracket)
    if kind == "session/end-seed":
        return CompactionTraceState(state.open_turn, None)  # an inherited bracket is dead
    if kind == "user/message":
        source = data.get("source") if isinstance(data, dict) else None
        if not is_checkpoint_source(source):
            return state
        assert isinstance(source, dict)
        if bracket is None or source.get("compactionId") != bracket.compaction_id:
            raise _Broken("CHECKPOINT", f"checkpoint user/message at seq {event['seq']} names "
                          f"compaction {source.get('compactionId')!r}, but the open transaction "
                          f"is {bracket.compaction_id if bracket else None!r}")
        return state
    if not kind.startswith("compaction/") or kind == "compaction/prune":
        return state
    cid = data.get("compactionId") if isinstance(data, dict) else None
    if not isinstance(cid, str) or not cid:
        raise _Broken("ID", f"{kind} at seq {event['seq']} needs a non-empty string "
                      f"compactionId, found {cid!r}")
    if kind == "compaction/start":
        owner = data.get("turn")
        if owner is not None and type(owner) is not int:
            raise _Broken("OWNER", f"compaction/start at seq {event['seq']} has turn {owner!r}; "
                          "expected a turn number or null")
        if bracket is not None:
            raise _Broken("NESTED", f"compaction/start {cid!r} at seq {event['seq']} opens while "
                          f"{bracket.compaction_id!r} of {_owner_name(bracket.owner)} is open")
        if owner is None and state.open_turn is not None:
            raise _Broken("OWNER", f"standalone compaction/start at seq {event['seq']} while "
                          f"turn {state.open_turn} is open")
        if owner is not None and owner != state.open_turn:
            found = "no open turn" if state.open_turn is None else f"open turn {state.open_turn}"
            raise _Broken("OWNER", f"compaction/start at seq {event['seq']} for turn {owner} "
                          f"found {found}")
        return CompactionTraceState(state.open_turn, _Bracket(cid, owner, event["seq"]))
    if bracket is None:
        raise _Broken("UNENCLOSED", f"{kind} at seq {event['seq']} has no open compaction/start")
    if cid != bracket.compaction_id:
        raise _Broken("ID", f"{kind} at seq {event['seq']} names {cid!r}; the open transaction "
                      f"is {bracket.compaction_id!r}")
    if kind == "compaction/summary":
        if bracket.summarized:
            raise _Broken("SUMMARY", f"second compaction/summary for {cid!r} at seq "
                          f"{event['seq']}")
        seqs = data.get("shadowedSeqs")
        shadowed_range = data.get("shadowedRange")
        if (not isinstance(seqs, list) or not seqs
                or not all(type(s) is int for s in seqs)
                or shadowed_range != {"start": seqs[0], "end": seqs[-1]}
                or type(data.get("shadowedTokenCount")) is not int):
            raise _Broken("SUMMARY", f"compaction/summary at seq {event['seq']} needs non-empty "
                          "integer shadowedSeqs, shadowedRange equal to their first and last, "
                          "and an integer shadowedTokenCount")
        return CompactionTraceState(state.open_turn, _Bracket(
            bracket.compaction_id, bracket.owner, bracket.start_seq, True))
    if kind == "compaction/end":
        if "turn" not in data or data["turn"] != bracket.owner:
            raise _Broken("OWNER", f"compaction/end at seq {event['seq']} has turn "
                          f"{data.get('turn')!r}; its start belongs to "
                          f"{_owner_name(bracket.owner)}")
        if "error" not in data and not bracket.summarized:
            raise _Broken("SUMMARY", f"successful compaction/end at seq {event['seq']} has no "
                          "compaction/summary")
        return CompactionTraceState(state.open_turn, None)
    return state


def _cleared_orphans(events: Sequence[Event]) -> frozenset[int]:
    """Starts whose next bracket-relevant event is a ``session/end-seed`` (dead on replay)."""
    cleared: set[int] = set()
    pending: int | None = None
    for event in events:
        kind = event["type"]
        if kind == "compaction/start":
            pending = event["seq"]
        elif kind == "compaction/end":
            pending = None
        elif kind == "session/end-seed" and pending is not None:
            cleared.add(pending)
            pending = None
    return frozenset(cleared)


def check_compaction_log(events: Sequence[Event]) -> list[Violation]:
    """Replay ``events`` under the compaction bracket rules and list every violation.

    Rules (docs/rules.md#compaction-brackets): ids are non-empty and consistent across start,
    summary, checkpoint and end; no start while another bracket is open; a numbered owner equals the
    open turn and a standalone owner needs no open turn; at most one summary, whose
    ``shadowedRange`` equals its first and last ``shadowedSeqs`` with an integer token count;
    a successful end needs a summary; an end names its start's owner; ``turn/start`` and
    ``turn/end`` never cross an open bracket, except an orphan a later ``session/end-seed``
    clears (repair boundaries inside inherited history); a checkpoint ``user/message`` names the
    open transaction. After a violation the event is skipped and replay continues.

    Returns:
        One :class:`~dsh.session.Violation` per broken rule, with rules ``ID``, ``NESTED``,
        ``OWNER``, ``UNENCLOSED``, ``SUMMARY``, ``CROSSING`` or ``CHECKPOINT``.
    """
    tolerated: frozenset[int] | None = None  # found when a rule first needs it
    open_turn: int | None = None
    bracket: _Bracket | None = None
    found: list[Violation] = []
    watched = _WATCHED
    for event in events:
        kind = event["type"]
        # the common events inline, as _step treats them: no state object per event
        if bracket is None and kind == "turn/end":
            open_turn = None
            continue
        if bracket is None and kind == "turn/start":
            data = event["data"]
            number = data.get("turn") if isinstance(data, dict) else None
            open_turn = number if type(number) is int else -1
            continue
        if kind == "user/message":
            data = event["data"]
            source = data.get("source") if isinstance(data, dict) else None
            if source is None or (isinstance(source, dict) and source.get("kind") != "plugin"):
                continue  # not a checkpoint's source: _step leaves the state as it is
        elif type(kind) is str and kind not in watched and not kind.startswith("compaction/"):
            continue  # _step leaves the state as it is (most of a log)
        if tolerated is None:
            tolerated = _cleared_orphans(events)
        try:
            state = _step(CompactionTraceState(open_turn, bracket), event, tolerated)
        except _Broken as broken:
            found.append(Violation(event["seq"], broken.rule, str(broken)))
        else:
            open_turn, bracket = state.open_turn, state.bracket
    return found


class CompactionInvariant:
    """Live companion: vetoes appends that break the bracket rules.

    Rule: docs/rules.md#compaction-brackets.

    ``install(session)`` replays the existing log (tolerating inherited orphans cleared by an
    end-seed), then validates every candidate before commit through ``session.add_validator``
    and advances on commit through ``session.observe``. Returns the uninstaller.

    Raises (from install):
        InvariantError: the existing log already breaks a rule (first violation).
    Raises (from a vetoed append):
        InvariantError: ``compaction invariant violated (RULE): ...`` with ``seq`` and
            ``event_type``.
    """

    def __init__(self) -> None:
        self.state = CompactionTraceState()

    def install(self, session: Any) -> Callable[[], None]:
        """Replay ``session``'s log, then guard its appends; return the uninstaller."""
        events = session.events
        tolerated = _cleared_orphans(events)
        state = CompactionTraceState()
        for event in events:
            try:
                state = _step(state, event, tolerated)
            except _Broken as broken:
                raise InvariantError(f"compaction invariant violated ({broken.rule}): {broken}",
                                     seq=event["seq"], event_type=event["type"]) from None
        self.state = state
        pending: dict[int, CompactionTraceState] = {}

        def validate(_session: Any, candidate: Event) -> None:
            try:
                pending[candidate["seq"]] = _step(self.state, candidate, frozenset())
            except _Broken as broken:
                raise InvariantError(f"compaction invariant violated ({broken.rule}): {broken}",
                                     seq=candidate["seq"],
                                     event_type=candidate["type"]) from None

        def commit(_session: Any, event: Event) -> None:
            staged = pending.pop(event["seq"], None)
            pending.clear()
            if staged is None:  # committed past our validator (installed mid-append)
                try:
                    staged = _step(self.state, event, frozenset())
                except _Broken as broken:
                    raise InvariantError(
                        f"compaction invariant violated ({broken.rule}) by a committed event: "
                        f"{broken}", seq=event["seq"], event_type=event["type"]) from None
            self.state = staged

        remove = session.add_validator(validate)
        unsubscribe = session.observe(commit)

        def uninstall() -> None:
            remove()
            unsubscribe()

        return uninstall

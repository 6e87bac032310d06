"""Quarantine: take messages out of the model view without touching the log, and put them back.

Rule: docs/forgetting.md#quarantine. A quarantine appends, as one batch:

1. ``quarantine/apply {items: [{seq, placeholder}], reason?, by?}`` (ignorable, log-only): which
   messages, the seq of the placeholder that will stand in for each, why and who;
2. when a placeholder is an ``assistant/message`` or a ``tool/result``, a turn and step of their
   own (the log keeps its turn/step invariants, as an adapter's surface removal does);
3. one placeholder per message: a replace of exactly the node that shows it now, of the same
   type and role. A user or system message becomes a text placeholder; an assistant message
   keeps its tool-call blocks (id and name, arguments ``{}``) behind a text placeholder, so each
   call still has its result; a tool result keeps everything but its content (the
   content-only rewrite of docs/rules.md#tool-result-rewrites). Pairing and role order of the
   model view are those of before.

An unquarantine appends ``quarantine/release {items: [{seq, placeholder, restored}], by?}`` and
one replace per message restoring its original message, so the model view is again the one it
was. The log lost nothing in either direction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from dsh._errors import RightsError
from dsh.rights._held import HasPersistence, held
from dsh.session import QUARANTINE_APPLY, QUARANTINE_RELEASE

if TYPE_CHECKING:
    from dsh.persistence import Persistence
    from dsh.session import Clock, Event, Session

PLACEHOLDER_TEXT: Final = "[withheld from the model: this message is quarantined]"
"""The text every quarantine placeholder shows the model in place of the message's content."""

QUARANTINE_PLUGIN: Final = "quarantine"
"""``source.plugin`` of a user or system placeholder."""

_MESSAGE_TYPES: Final = ("user/message", "system/message", "assistant/message", "tool/result")


@dataclass(frozen=True, slots=True)
class QuarantineState:
    """Where one message stands after the quarantine records of a log.

    Attributes:
        seq: The message's own seq.
        node: The seq standing for it on the surface now (its placeholder while quarantined,
            the restoring replace after an unquarantine).
        quarantined: True while its last record is a ``quarantine/apply``.
        record_seq: Seq of that last record.
        time: Epoch ms of that record.
        reason: The quarantine's reason, or None.
    """

    seq: int
    node: int
    quarantined: bool
    record_seq: int
    time: int
    reason: str | None


@dataclass(frozen=True, slots=True)
class QuarantineResult:
    """What one :func:`quarantine` or :func:`unquarantine` did.

    Attributes:
        session_id: The session.
        changed: ``(seq, node)`` pairs: the message and the seq now standing for it (the
            placeholder, or the restoring replace).
        unchanged: Seqs asked for that needed nothing (already in that state, or an assistant
            message with no content, which the model never sees).
        record_seq: Seq of the ``quarantine/apply`` or ``quarantine/release`` record, or None
            when nothing was written.
        written: How many events were appended.
    """

    session_id: str
    changed: tuple[tuple[int, int], ...]
    unchanged: tuple[int, ...]
    record_seq: int | None
    written: int

    def to_json(self) -> dict[str, Any]:
        """``{"id", "changed": [{"seq", "node"}], "unchanged", "recordSeq", "written"}``."""
        return {"id": self.session_id,
                "changed": [{"seq": s, "node": n} for s, n in self.changed],
                "unchanged": list(self.unchanged), "recordSeq": self.record_seq,
                "written": self.written}


def quarantine_state(events: Iterable[Mapping[str, Any]]) -> dict[int, QuarantineState]:
    """Fold the quarantine records of a log: original seq → :class:`QuarantineState`.

    Messages no record names are absent (they stand for themselves). Records whose items are
    malformed are skipped item by item (a reader never fails on them).
    """
    state: dict[int, QuarantineState] = {}
    for event in events:
        kind = event.get("type")
        if kind not in (QUARANTINE_APPLY, QUARANTINE_RELEASE):
            continue
        data = event.get("data")
        if not isinstance(data, Mapping) or not isinstance(data.get("items"), Sequence):
            continue
        reason = data.get("reason")
        for item in data["items"]:
            if not isinstance(item, Mapping):
                continue
            seq = item.get("seq")
            node = item.get("placeholder" if kind == QUARANTINE_APPLY else "restored")
            if type(seq) is not int or type(node) is not int:
                continue
            state[seq] = QuarantineState(
                seq=seq, node=node, quarantined=kind == QUARANTINE_APPLY,
                record_seq=int(event.get("seq", -1)), time=int(event.get("time", 0)),
                reason=reason if isinstance(reason, str) and kind == QUARANTINE_APPLY else None)
    return state


def _placeholder(event: Event, turn: int) -> Any:
    """The data of the placeholder standing in for ``event`` (see the module docstring)."""
    kind = event["type"]
    text = {"type": "text", "text": PLACEHOLDER_TEXT}
    if kind in ("user/message", "system/message"):
        data = event["data"]
        return {"id": data["id"], "role": data["role"], "content": [text],
                "source": {"kind": "plugin", "plugin": QUARANTINE_PLUGIN}}
    if kind == "tool/result":
        data = event["data"]
        message = data["message"]
        block = message["content"][0]
        return {**data, "message": {**message, "content": [{**block, "content": [text]}]}}
    message = event["data"]["message"]
    calls = [{"type": "tool-call", "id": b["id"], "name": b["name"], "arguments": "{}"}
             for b in message["content"]
             if isinstance(b, Mapping) and b.get("type") == "tool-call"]
    source = {k: v for k, v in message["source"].items() if k != "replayState"}
    return {"turn": turn, "step": 1,
            "message": {"id": message["id"], "role": "assistant", "content": [text, *calls],
                        "source": source}}


def _restoring(event: Event, turn: int) -> Any:
    """The data of the replace that gives ``event``'s message back to the model view."""
    if event["type"] == "assistant/message":
        return {"turn": turn, "step": 1, "message": event["data"]["message"]}
    return event["data"]


def _next_turn(events: Sequence[Event]) -> int:
    for event in reversed(events):
        if event["type"] in ("turn/start", "turn/end"):
            turn = event["data"].get("turn")
            if type(turn) is int:
                return turn + 1
    return 1


def _resolve(session: Session, seqs: Iterable[int], *, stored: int, want_quarantined: bool,
             ) -> tuple[list[tuple[Event, int]], list[int]]:
    """Check each seq and return ``(event, current node)`` to change, and seqs to leave.

    Only the ``stored`` events count: past them is the end-seed marker a restore adds in
    memory, which no one can name (NO_SUCH_SEQ, with the stored log's last seq).
    """
    events = session.events
    state = quarantine_state(events)
    on_surface = set(session.surface.nodes)
    todo: list[tuple[Event, int]] = []
    unchanged: list[int] = []
    for seq in sorted(set(seqs)):
        if type(seq) is not int or not 0 <= seq < stored:
            raise RightsError(f"session {session.id!r} has no event {seq!r} (its last seq is "
                              f"{stored - 1}); see 'dsh show {session.id}'",
                              code="NO_SUCH_SEQ", session_id=session.id,
                              seq=seq if type(seq) is int else None)
        event = events[seq]
        if event["type"] not in _MESSAGE_TYPES or event.get("surfaceOp") != "append":
            what = f"a {event['type']!r} event" if event.get("surfaceOp") in (None, "append") \
                else f"a replacing {event['type']!r} event"
            raise RightsError(f"event {seq} of session {session.id!r} is {what}, not a "
                              f"message the model was given; name the seqs of messages "
                              f"('dsh show' prints them as #seq)",
                              code="NOT_A_MESSAGE", session_id=session.id, seq=seq)
        entry = state.get(seq)
        quarantined = entry is not None and entry.quarantined
        if quarantined != want_quarantined:
            if want_quarantined:
                raise RightsError(f"message {seq} of session {session.id!r} is not "
                                  f"quarantined; nothing to give back",
                                  code="NOT_QUARANTINED", session_id=session.id, seq=seq)
            unchanged.append(seq)
            continue
        node = entry.node if entry is not None else seq
        if node not in on_surface:
            raise RightsError(f"message {seq} of session {session.id!r} is not on the model "
                              f"view (seq {node}, which stands for it, is shadowed by a later "
                              f"replace such as a compaction checkpoint); nothing to change",
                              code="NOT_IN_VIEW", session_id=session.id, seq=seq)
        if event["type"] == "assistant/message" and not event["data"]["message"]["content"]:
            unchanged.append(seq)  # projects no message: the model never sees it
            continue
        todo.append((event, node))
    return todo, unchanged


def _apply(store: Persistence | HasPersistence, session_id: str, seqs: Iterable[int], *,
           release: bool, reason: str | None, by: str | None,
           clock: Clock | None) -> QuarantineResult:
    with held(store, session_id, clock=clock) as hold:
        session = hold.session
        todo, unchanged = _resolve(session, seqs, stored=hold.stored,
                                   want_quarantined=release)
        if not todo:
            return QuarantineResult(session_id, (), tuple(unchanged), None, 0)
        needs_turn = any(e["type"] in ("assistant/message", "tool/result") for e, _ in todo)
        record_seq = session.seq
        first = record_seq + (3 if needs_turn else 1)
        turn = _next_turn(session.events)
        items: list[dict[str, Any]] = []
        for offset, (event, node) in enumerate(todo):
            if release:
                items.append({"seq": event["seq"], "placeholder": node, "restored": first + offset})
            else:
                items.append({"seq": event["seq"], "placeholder": first + offset})
        record: dict[str, Any] = {"items": items}
        if reason is not None and not release:
            record["reason"] = reason
        if by is not None:
            record["by"] = by
        session.append(QUARANTINE_RELEASE if release else QUARANTINE_APPLY, record,
                       ignorable=True)
        if needs_turn:
            session.append("turn/start", {"turn": turn})
            session.append("step/start", {"turn": turn, "step": 1})
        changed: list[tuple[int, int]] = []
        for event, node in todo:
            data = _restoring(event, turn) if release else _placeholder(event, turn)
            appended = session.append(event["type"], data,
                                      surface_op={"op": "replace", "start": node, "end": node},
                                      source_event_seqs=[node] if node == event["seq"]
                                      else [node, event["seq"]])
            changed.append((event["seq"], appended["seq"]))
        if needs_turn:
            session.append("step/end", {"turn": turn, "step": 1})
            session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
        written = hold.commit()
    return QuarantineResult(session_id, tuple(changed), tuple(unchanged), record_seq,
                            len(written))


def quarantine(store: Persistence | HasPersistence, session_id: str, seqs: Iterable[int], *,
               reason: str | None = None, by: str | None = None,
               clock: Clock | None = None) -> QuarantineResult:
    """Withhold messages from the model view; the log keeps every byte of them.

    Args:
        store: A ``dsh.Store`` (or its ``persistence`` facade).
        session_id: The stored session (not live in this process).
        seqs: Seqs of messages as appended (``dsh show`` prints them as ``#seq``).
        reason: Why, kept in the record and shown by the transcript (never sent to the model).
        by: Who, kept in the record.
        clock: Epoch-ms clock for the appended events (default: wall clock).

    Returns:
        QuarantineResult: the placeholder seq of each message; already quarantined ones in
        ``unchanged``. Nothing is written when nothing changes.

    Raises:
        RightsError: ``NO_SUCH_SEQ``, ``NOT_A_MESSAGE``, ``NOT_IN_VIEW``, ``OPEN_TURN``;
            nothing is written.
        SessionNotFoundError, SessionBusyError: as every writer.

    Rule: docs/forgetting.md#quarantine (one atomic batch under the session's write ownership).
    """
    return _apply(store, session_id, seqs, release=False, reason=reason, by=by, clock=clock)


def unquarantine(store: Persistence | HasPersistence, session_id: str, seqs: Iterable[int], *,
                 by: str | None = None, clock: Clock | None = None) -> QuarantineResult:
    """Give quarantined messages back to the model view, exactly as they were.

    Args:
        store: A ``dsh.Store`` (or its ``persistence`` facade).
        session_id: The stored session.
        seqs: Seqs of the quarantined messages (their own seqs, not the placeholders').
        by: Who, kept in the record.
        clock: Epoch-ms clock for the appended events.

    Returns:
        QuarantineResult: the seq of each restoring replace in ``changed``.

    Raises:
        RightsError: ``NOT_QUARANTINED``, ``NOT_IN_VIEW`` (the placeholder was compacted
            away since), ``NO_SUCH_SEQ``, ``NOT_A_MESSAGE``; nothing is written.
        SessionNotFoundError, SessionBusyError: as every writer.

    Rule: docs/forgetting.md#quarantine.
    """
    return _apply(store, session_id, seqs, release=True, reason=None, by=by, clock=clock)

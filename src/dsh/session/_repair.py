"""Closers for an open final turn: crash repair ("interrupted") and fork cut points ("forked").

One algorithm serves both causes; they differ only in the model-facing wording and in the
``turn/end`` reason (docs/rules.md#closers). Invariants this module owns (docs/rules.md#closers):

* the closers are a pure, deterministic function of the log: every closer reuses the last
  event's ``time`` and takes the seqs right after it;
* results come before ``step/end`` and ``step/end`` before ``turn/end``;
* only calls registered by an ``assistant/message`` of the still-open step get a synthetic result.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, Final, Literal, TypeAlias

from dsh._errors import ConfigError, EventRejectedError
from dsh.json import FrozenDict, FrozenList, c_seqs_contiguous
from dsh.session._events import Event

TOOL_NOT_STARTED: Final = "TOOL_NOT_STARTED"
"""Error code of a synthetic result for a call with no ``tool/call`` record.

Rule: docs/rules.md#closers.
"""

TOOL_OUTCOME_UNKNOWN: Final = "TOOL_OUTCOME_UNKNOWN"
"""Error code of a synthetic result for a recorded call with no result (docs/rules.md#closers)."""

CloseCause: TypeAlias = Literal["interrupted", "forked"]
"""Why the turn is being closed: a crash (resume) or a fork cut point (docs/rules.md#fork)."""

_CAUSES: Final = ("interrupted", "forked")

_ERROR_NAMES: Final = {
    TOOL_OUTCOME_UNKNOWN: "ToolOutcomeUnknownError",
    TOOL_NOT_STARTED: "ToolNotStartedError",
}

# The model must never guess about side effects: the same guidance closes every text.
_RETRY_GUIDANCE: Final = (
    "Retry only if the operation is read-only or idempotent; if it could have side effects, "
    "first check the external state (or ask the user) to learn whether it already took effect. "
    "Never retry blindly."
)


def _describe(call_id: str, tool_name: str | None) -> str:
    if tool_name:
        return f'the "{tool_name}" tool call {call_id}'
    return f"tool call {call_id} (tool name not recorded)"


def closer_text(cause: CloseCause, *, started: bool, call_id: str,
                tool_name: str | None) -> str:
    """Return the model-facing text of one synthetic tool result.

    Args:
        cause: ``"interrupted"`` or ``"forked"``.
        started: True when the log holds a ``tool/call`` for the call (outcome unknown), False
            when only the assistant's request exists (not recorded as started).
        call_id: The provider call id.
        tool_name: The tool's name as the assistant or ``tool/call`` named it, or None.

    Returns:
        One paragraph naming the tool and call id, saying what the log knows about the call,
        that its outcome is unknown, and how to retry safely. The wording is ours
        (docs/rules.md#model-facing-text fixes only its content; docs/rules.md#fork adds the forked
        variants).
    """
    what = _describe(call_id, tool_name)
    if cause == "interrupted":
        if started:
            known = (f"The session was interrupted after {what} was recorded as started, and no "
                     "result was saved, so its outcome is unknown: it may not have run, or have "
                     "run partly or completely.")
        else:
            known = (f"The session was interrupted before {what} was recorded as started, so it "
                     "most likely never ran, but its outcome is not known for certain.")
    elif started:
        known = (f"The history this branch inherited records {what} starting but holds no "
                 "result for it; the parent session may have completed it after the fork point, "
                 "so its outcome is unknown here.")
    else:
        known = (f"The history this branch inherited has no record of {what} starting; the "
                 "parent session may have executed it after the fork point, so its outcome is "
                 "unknown here.")
    return f"{known} {_RETRY_GUIDANCE}"


class _Pending:
    """One unanswered call: the step that requested it, its tool name, its ``tool/call`` seq."""

    __slots__ = ("call_seq", "name", "step")

    def __init__(self, step: Any, name: str | None) -> None:
        self.step = step
        self.name = name
        self.call_seq: int | None = None


def _malformed(event: Event, what: str) -> EventRejectedError:
    return EventRejectedError(
        f"cannot compute turn closers: {event.get('type')} at seq {event.get('seq')} has "
        f"{what}; expected a valid committed log",
        code="MALFORMED_EVENT", seq=event.get("seq"), event_type=event.get("type"))


def _data(event: Event) -> FrozenDict:
    data = event.get("data")
    if not isinstance(data, dict):
        raise _malformed(event, f"data {type(data).__name__}, not an object")
    return data  # type: ignore[return-value]  # every accepted dict is a FrozenDict


def _message(event: Event) -> Any:
    message = _data(event).get("message")
    if not isinstance(message, dict):
        raise _malformed(event, "no data.message object")
    return message


_TURN_BOUNDARIES: Final = frozenset({"turn/start", "turn/end"})
_get_seq: Final = operator.methodcaller("get", "seq")


def open_turn_closers(events: Sequence[Event], cause: CloseCause, *,
                      base_seq: int = 0) -> tuple[Event, ...]:
    """Return the events that close the log's open final turn, or ``()`` when none is open.

    Scan (docs/rules.md#closers): ``turn/start`` opens a turn and clears the pending calls;
        ``turn/end``
    closes it and clears them; ``step/start`` opens a step; ``step/end`` closes it and clears
    them; each ``tool-call`` block of an ``assistant/message`` registers a pending call (a repeat
    keeps its place and forgets any ``tool/call``); a ``tool/call`` of a pending call records its
    seq; any ``tool/result`` answers its ``source.callId``.

    Args:
        events: A committed log, contiguous from seq 0; it may end inside a turn.
        cause: ``"interrupted"`` (crash repair) or ``"forked"`` (fork cut point).
        base_seq: The seq of ``events[0]`` when ``events`` is the end of a longer log (an
            O(tail) resume); the window must then start at or before the log's last
            ``turn/start`` or ``turn/end``, and the answer is that of the whole log.

    Returns:
        Frozen events with seqs ``last.seq + 1, …`` and the last event's ``time``: one error
        ``tool/result`` per unanswered call in registration order (code TOOL_OUTCOME_UNKNOWN with
        ``sourceEventSeqs [callSeq]`` when a ``tool/call`` was recorded, else TOOL_NOT_STARTED),
        then ``step/end`` if a step is open, then ``turn/end {reason: {kind: cause}}``.
        Empty when the log is empty or ends outside a turn. Result ids are
        ``<cause>-tool-result-<callId>-<seq>``.

    Raises:
        EventRejectedError: an event's seq is not its index (code SEQ_GAP, ``where["seq"]``), or
            an ``assistant/message`` / ``tool/result`` lacks its message (code MALFORMED_EVENT).
        ConfigError: ``cause`` is not one of the two causes.
    Rule: docs/rules.md#closers (one algorithm, two causes).
    """
    if cause not in _CAUSES:
        raise ConfigError(f"closer cause must be 'interrupted' or 'forked', got {cause!r}")
    _check_contiguous(events, base_seq)
    return closers_of_contiguous(events, cause, base_seq=base_seq)


def _check_contiguous(events: Sequence[Event], base_seq: int) -> None:
    """Raise ``SEQ_GAP`` at the first event whose seq is not ``base_seq`` + its index."""
    if c_seqs_contiguous is not None and type(events) in (list, tuple):
        contiguous = c_seqs_contiguous(events, base_seq)
    else:
        seqs = list(map(_get_seq, events))  # C-speed builtins: a contiguous log is the norm
        contiguous = seqs == list(range(base_seq, base_seq + len(seqs))) and (
            not seqs or set(map(type, seqs)) == {int})
    for index, event in enumerate(() if contiguous else events, base_seq):
        seq = event.get("seq")
        if type(seq) is not int or seq != index:
            raise EventRejectedError(
                f"cannot compute turn closers: the log must be contiguous from seq "
                f"{base_seq}, found seq {seq!r} at index {index} (expected {index})",
                code="SEQ_GAP", seq=index, event_type=event.get("type"))


def closers_of_contiguous(events: Sequence[Event], cause: CloseCause, *,
                          base_seq: int = 0) -> tuple[Event, ...]:
    """:func:`open_turn_closers` of a log whose seqs were already checked contiguous.

    For a caller that holds that proof from the same events (the JSONL scanner requires every
    record to carry the next seq, docs/formats.md#reading-the-committed-region, and marks its
    read ``ColdRead.contiguous``): the scan skips the check pass over every event.

    Raises:
        EventRejectedError: code MALFORMED_EVENT, as :func:`open_turn_closers`.
    Rule: docs/rules.md#closers.
    """
    # Every turn/start and turn/end resets the scan state, so the scan may begin at the last
    # turn boundary: repairing a long balanced log costs one backward look, not a full pass.
    start = len(events) - 1
    while start >= 0 and events[start].get("type") not in _TURN_BOUNDARIES:
        start -= 1
    if start < 0 or events[start].get("type") == "turn/end":
        return ()
    open_turn: Any = None
    open_step: Any = None
    pending: dict[str, _Pending] = {}
    for index in range(start, len(events)):
        event = events[index]
        seq = base_seq + index
        kind = event.get("type")
        if kind == "turn/start":
            open_turn = _data(event).get("turn")
            open_step = None
            pending.clear()
        elif kind == "turn/end":
            open_turn = None
            open_step = None
            pending.clear()
        elif kind == "step/start":
            open_step = _data(event).get("step")
        elif kind == "step/end":
            open_step = None
            pending.clear()
        elif kind == "assistant/message":
            step = _data(event).get("step")
            content = _message(event).get("content")
            if not isinstance(content, list):
                raise _malformed(event, "a message content that is not an array")
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool-call":
                    call_id = block.get("id")
                    if type(call_id) is not str:
                        raise _malformed(event, "a tool-call block without a string id")
                    name = block.get("name")
                    # Re-registration keeps the dict position (Python dicts keep the first
                    # insertion slot on overwrite) and drops any recorded tool/call seq.
                    pending[call_id] = _Pending(step, name if type(name) is str else None)
        elif kind == "tool/call":
            data = _data(event)
            call_id = data.get("callId")
            # a non-string id (a list or object is not even hashable) matches no call
            entry = pending.get(call_id) if type(call_id) is str else None
            if entry is not None:
                entry.call_seq = seq
                name = data.get("name")
                if type(name) is str and name:
                    entry.name = name
        elif kind == "tool/result":
            source = _message(event).get("source")
            call_id = source.get("callId") if isinstance(source, dict) else None
            if type(call_id) is str:  # non-string ids match nothing
                pending.pop(call_id, None)
    if open_turn is None or not events:
        return ()
    last = events[-1]
    time = last.get("time")
    next_seq = base_seq + len(events)
    closers: list[Event] = []
    for call_id, entry in pending.items():
        started = entry.call_seq is not None
        code = TOOL_OUTCOME_UNKNOWN if started else TOOL_NOT_STARTED
        text = closer_text(cause, started=started, call_id=call_id, tool_name=entry.name)
        message = FrozenDict({
            "id": f"{cause}-tool-result-{call_id}-{next_seq}",
            "role": "user",
            "source": FrozenDict({"kind": "tool", "callId": call_id}),
            "content": FrozenList([FrozenDict({
                "type": "tool-result",
                "toolCallId": call_id,
                "isError": True,
                "content": FrozenList([FrozenDict({"type": "text", "text": text})]),
            })]),
        })
        fields: dict[str, Any] = {
            "type": "tool/result", "seq": next_seq, "time": time,
            "data": FrozenDict({
                "turn": open_turn, "step": entry.step, "message": message,
                "error": FrozenDict({"name": _ERROR_NAMES[code], "code": code}),
            }),
            "surfaceOp": "append",
        }
        if started:
            fields["sourceEventSeqs"] = FrozenList([entry.call_seq])
        closers.append(Event(fields))
        next_seq += 1
    if open_step is not None:
        closers.append(Event({"type": "step/end", "seq": next_seq, "time": time,
                              "data": FrozenDict({"turn": open_turn, "step": open_step})}))
        next_seq += 1
    closers.append(Event({
        "type": "turn/end", "seq": next_seq, "time": time,
        "data": FrozenDict({"turn": open_turn, "reason": FrozenDict({"kind": cause})}),
    }))
    return tuple(closers)


def interrupted_turn_closers(events: Sequence[Event]) -> tuple[Event, ...]:
    """Return the crash-repair closers of ``events``: ``open_turn_closers(events, "interrupted")``.

    Raises:
        EventRejectedError: as :func:`open_turn_closers`.
    Rule: docs/rules.md#repair, docs/rules.md#closers (run on load, before the session is rebuilt).
    """
    return open_turn_closers(events, "interrupted")

"""Read-time normalisation of older format-v0 record shapes (docs/events.md#legacy-shapes).

Pre-release dsh builds wrote some events in shapes the current core refuses. On read (never on
disk) they are rewritten, per event, in this order: ``turn/start`` → ``turn/end`` → steering →
message wrappers. Three shapes are refused outright: any ``request/header-delta``, any
``mode/set``, and a ``request/header`` with ``reason: "fallback"``.

Events that need no rewrite are returned as the very same objects (no copy).

:func:`stored_prescan` finds, in one pass, the first event this normalisation could touch and
the first event of an unknown, non-ignorable type, so that a log with neither skips both passes.
:func:`legacy_plain` and :func:`python_stored_prescan` are the rule; ``dsh._speedups`` has a C
twin of the pass that must give the same answer (tests/test_speedups_load.py checks it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from dsh._errors import LogCorruptError
from dsh.json import c_stored_prescan, is_safe_int, snapshot_json
from dsh.session import KNOWN_EVENT_TYPES, Event

__all__ = ["legacy_message_id", "legacy_plain", "normalize_legacy_events",
           "python_stored_prescan", "stored_prescan"]

_KEPT_BARE_KINDS = frozenset({"completed", "blocked", "max-tokens", "interrupted"})
_FAILURE_OPTIONAL = {"status": int, "providerRetryAfterMs": int, "requestId": str}


_ALWAYS_LEGACY = frozenset({"request/header-delta", "mode/set", "steering/message"})


def legacy_plain(event: Mapping[str, Any]) -> bool:
    """True when :func:`normalize_legacy_events` leaves ``event`` as it is, without raising.

    The test is per event and errs towards False: a False event only sends the log through the
    normalisation pass, which then decides. Types other than the string-typed legacy ones pass.

    Args:
        event: One stored event (a mapping; its ``data`` is read, never changed).

    Returns:
        bool: False for every ``request/header-delta``, ``mode/set`` and ``steering/message``,
        a ``request/header`` with reason ``"fallback"``, a ``turn/start`` with a ``trigger``,
        a ``turn/end`` whose reason is not already in today's shape, and the three message
        events in their pre-wrapper shapes; True otherwise.

    Rule: docs/events.md#legacy-shapes.
    """
    etype = event.get("type")
    if type(etype) is not str:
        return True
    if etype in _ALWAYS_LEGACY:
        return False
    data = event.get("data")
    if not isinstance(data, dict):
        return True  # every rewrite reads a mapping payload; anything else passes unchanged
    if etype == "request/header":
        reason = data.get("reason")
        return not (type(reason) is str and reason == "fallback")
    if etype == "turn/start":
        return "trigger" not in data
    if etype == "turn/end":
        return _turn_end_plain(data)
    if etype == "user/message":
        return not ("id" not in data and "role" not in data and "message" not in data
                    and "content" in data and "source" in data)
    if etype == "assistant/message":
        return not ("message" not in data and "content" in data and "provenance" in data)
    if etype == "tool/result":
        return not ("message" not in data and "callId" in data and "content" in data
                    and "isError" in data)
    return True


def _turn_end_plain(data: Mapping[str, Any]) -> bool:
    reason = data.get("reason")
    turn = data.get("turn")
    if len(data) != 2 or not isinstance(reason, dict) or type(turn) is not int \
            or not is_safe_int(turn) or turn < 1:
        return False
    kind = reason.get("kind")
    if type(kind) is not str:
        return False
    if kind in _KEPT_BARE_KINDS:
        return len(reason) == 1
    if kind == "aborted":
        return "reason" in reason
    if kind == "error":
        return "error" in reason
    return kind != "disposed"


def python_stored_prescan(events: Sequence[Any], known_types: AbstractSet[str]
                          ) -> tuple[int, int]:
    """The prescan of a stored log in pure Python: the reference :func:`stored_prescan` uses.

    Args:
        events: Stored events, in log order (mappings; anything else counts as both).
        known_types: The event types this dsh reads.

    Returns:
        ``(legacy_at, unknown_at)``: the index of the first event that is not
        :func:`legacy_plain`, and of the first event whose type is not a known string and that
        is not marked ``ignorable: true``; -1 for none.

    Rule: docs/events.md#legacy-shapes, docs/events.md#known-types-and-ignorable-events.
    """
    legacy_at = unknown_at = -1
    for index, event in enumerate(events):
        if legacy_at >= 0 and unknown_at >= 0:
            break
        if not isinstance(event, dict):
            return (index if legacy_at < 0 else legacy_at,
                    index if unknown_at < 0 else unknown_at)
        if legacy_at < 0 and not legacy_plain(event):
            legacy_at = index
        if unknown_at < 0:
            etype = event.get("type")
            known = type(etype) is str and etype in known_types
            if not known and event.get("ignorable") is not True:
                unknown_at = index
    return legacy_at, unknown_at


def stored_prescan(events: Sequence[Any], known_types: AbstractSet[str] = KNOWN_EVENT_TYPES
                   ) -> tuple[int, int]:
    """``(legacy_at, unknown_at)`` of a stored log, as :func:`python_stored_prescan` answers.

    The C accelerator answers for a list or tuple when it is built; otherwise (or with
    ``DSH_NO_SPEEDUPS=1``) the Python reference does, with the same result.

    Args:
        events: Stored events, in log order.
        known_types: The event types this dsh reads.

    Returns:
        The first index that needs legacy normalisation and the first of an unknown,
        non-ignorable type; -1 for none.

    Rule: docs/events.md#legacy-shapes, docs/events.md#known-types-and-ignorable-events.
    """
    if c_stored_prescan is not None and type(events) in (list, tuple) \
            and isinstance(known_types, set | frozenset):
        result: tuple[int, int] = c_stored_prescan(events, known_types)
        return result
    return python_stored_prescan(events, known_types)


def legacy_message_id(session_id: str, seq: int) -> str:
    """The id given to a legacy message that had none: ``legacy-message:<id>:<seq>``.

    Rule: docs/events.md#legacy-shapes.
    """
    return f"legacy-message:{session_id}:{seq}"


def _malformed(what: str, event: Event, session_id: str) -> LogCorruptError:
    return LogCorruptError(f"stored session {session_id!r} failed validation: malformed "
                           f"{what} at seq {event.get('seq')}", code="LEGACY_MALFORMED",
                           seq=event.get("seq") if is_safe_int(event.get("seq")) else None,
                           session_id=session_id, event_type=str(event.get("type")))


def _refused(what: str, event: Event, session_id: str) -> LogCorruptError:
    return LogCorruptError(f"stored session {session_id!r} failed validation: unsupported legacy "
                           f"{what} at seq {event.get('seq')}", code="LEGACY_UNSUPPORTED",
                           seq=event.get("seq") if is_safe_int(event.get("seq")) else None,
                           session_id=session_id, event_type=str(event.get("type")))


def _with_data(event: Event, data: Any, **changes: Any) -> Event:
    fields = dict(event)
    fields["data"] = snapshot_json(data)
    for key, value in changes.items():
        fields[key] = value
    return Event(fields)


def _turn_start(event: Event, sid: str) -> Event:
    data = event.get("data")
    if not isinstance(data, dict) or "trigger" not in data:
        return event
    trigger = data.get("trigger")
    if set(data) != {"turn", "trigger"} or not is_safe_int(data["turn"]) or data["turn"] < 1 \
            or not isinstance(trigger, dict) or type(trigger.get("kind")) is not str \
            or not trigger["kind"]:
        raise _malformed("pre-react-loop turn/start", event, sid)
    return _with_data(event, {"turn": data["turn"]})


def _failure(value: Any) -> bool:
    if not isinstance(value, dict) or type(value.get("message")) is not str \
            or type(value.get("code")) is not str:
        return False
    for key, kind in _FAILURE_OPTIONAL.items():
        if key in value and type(value[key]) is not kind:
            return False
    return set(value) <= {"message", "code", *_FAILURE_OPTIONAL}


def _turn_end(event: Event, sid: str) -> Event:
    data = event.get("data")
    if not isinstance(data, dict):
        return event
    reason = data.get("reason")
    if set(data) != {"turn", "reason"} or not is_safe_int(data["turn"]) or data["turn"] < 1 \
            or not isinstance(reason, dict) or type(reason.get("kind")) is not str:
        raise _malformed("turn/end", event, sid)
    kind = reason["kind"]
    if kind in _KEPT_BARE_KINDS:
        if set(reason) != {"kind"}:
            raise _malformed(f"turn/end reason {kind!r}", event, sid)
        return event
    if kind == "aborted":
        if "reason" in reason:
            return event
        new = {"kind": "aborted", "reason": {"kind": "legacy"}}
    elif kind == "disposed":
        new = {"kind": "aborted", "reason": {"kind": "disposed"}}
    elif kind == "error":
        if "error" in reason:
            return event
        if "failure" in reason:
            if not _failure(reason["failure"]):
                raise _malformed("turn/end error failure", event, sid)
            new = {"kind": "error", "error": reason["failure"]}
        elif type(reason.get("message")) is str:
            code = reason.get("code", "UNKNOWN")
            if type(code) is not str:
                raise _malformed("turn/end error code", event, sid)
            new = {"kind": "error", "error": {"message": reason["message"], "code": code}}
        else:
            raise _malformed("turn/end error reason", event, sid)
    else:
        return event  # unknown kinds are kept (docs/events.md#legacy-shapes)
    return _with_data(event, {"turn": data["turn"], "reason": new})


def _steering(event: Event, sid: str) -> Event:
    data = event.get("data")
    if isinstance(data, dict) and set(data) == {"turn", "message"} \
            and isinstance(data["message"], dict):
        return Event({**event, "type": "user/message", "data": data["message"]})
    if isinstance(data, dict) and set(data) == {"turn", "content", "source"}:
        message = {"content": data["content"], "source": data["source"],
                   "id": legacy_message_id(sid, event["seq"]), "role": "user"}
        return _with_data(Event({**event, "type": "user/message"}), message)
    raise _malformed("steering/message", event, sid)


def _messages(event: Event, sid: str, by_seq: dict[int, Event]) -> Event:
    etype = event["type"]
    data = event.get("data")
    if not isinstance(data, dict):
        return event
    seq = event["seq"]
    if etype == "user/message":
        if "id" not in data and "role" not in data and "message" not in data \
                and "content" in data and "source" in data:
            return _with_data(event, {**data, "id": legacy_message_id(sid, seq), "role": "user"})
        return event
    if etype == "assistant/message":
        if "message" not in data and "content" in data and "provenance" in data:
            provenance = data["provenance"]
            if not isinstance(provenance, dict):
                raise _malformed("assistant/message provenance", event, sid)
            rest = {k: v for k, v in data.items() if k not in ("content", "provenance")}
            message = {"id": legacy_message_id(sid, seq), "role": "assistant",
                       "content": data["content"], "source": {**provenance, "kind": "model"}}
            return _with_data(event, {**rest, "message": message})
        return event
    if etype == "tool/result" and "message" not in data \
            and {"callId", "content", "isError"} <= set(data):
        message_id = legacy_message_id(sid, seq)
        op = event.get("surfaceOp")
        if isinstance(op, dict) and op.get("op") == "replace":
            # a legacy prune inherits the (normalised) id of the result it shadows
            shadowed = by_seq.get(op.get("start"))  # type: ignore[arg-type]
            inner = shadowed.get("data") if shadowed is not None else None
            if isinstance(inner, dict) and isinstance(inner.get("message"), dict):
                message_id = inner["message"].get("id", message_id)
        rest = {k: v for k, v in data.items() if k not in ("callId", "content", "isError")}
        block = {"type": "tool-result", "toolCallId": data["callId"],
                 "content": data["content"], "isError": data["isError"]}
        message = {"id": message_id, "role": "user", "content": [block],
                   "source": {"kind": "tool", "callId": data["callId"]}}
        return _with_data(event, {**rest, "message": message})
    return event


def normalize_legacy_events(events: Sequence[Event], session_id: str) -> tuple[Event, ...]:
    """Normalise legacy v0 shapes in memory (docs/events.md#legacy-shapes).

    Args:
        events: The stored committed prefix, in seq order.
        session_id: Used for legacy message ids and named in errors.

    Returns:
        tuple[Event, ...]: the events, unchanged ones being the same objects.

    Raises:
        LogCorruptError: code ``LEGACY_UNSUPPORTED`` for ``request/header-delta``, ``mode/set``
            or ``request/header`` with reason ``fallback``; code ``LEGACY_MALFORMED`` for a
            legacy shape that does not match its rewrite rule. ``seq`` names the event.
    """
    out: list[Event] = []
    by_seq: dict[int, Event] = {}
    for event in events:
        etype = event.get("type")
        if etype == "request/header-delta":
            raise _refused("request/header-delta event", event, session_id)
        if etype == "mode/set":
            raise _refused("mode/set event", event, session_id)
        if etype == "request/header":
            data = event.get("data")
            if isinstance(data, dict) and data.get("reason") == "fallback":
                raise _refused('request/header reason "fallback"', event, session_id)
        elif etype == "turn/start":
            event = _turn_start(event, session_id)
        elif etype == "turn/end":
            event = _turn_end(event, session_id)
        elif etype == "steering/message":
            event = _steering(event, session_id)
        if event.get("type") in ("user/message", "assistant/message", "tool/result"):
            event = _messages(event, session_id, by_seq)
            if is_safe_int(event.get("seq")):
                by_seq[event["seq"]] = event
        out.append(event)
    return tuple(out)

"""Read-time normalisation of older format-v0 record shapes (docs/events.md#legacy-shapes).

Pre-release dsh builds wrote some events in shapes the current core refuses. On read (never on
disk) they are rewritten, per event, in this order: ``turn/start`` → ``turn/end`` → steering →
message wrappers. Three shapes are refused outright: any ``request/header-delta``, any
``mode/set``, and a ``request/header`` with ``reason: "fallback"``.

Events that need no rewrite are returned as the very same objects (no copy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dsh._errors import LogCorruptError
from dsh.json import is_safe_int, snapshot_json
from dsh.session import Event

__all__ = ["legacy_message_id", "normalize_legacy_events"]

_KEPT_BARE_KINDS = frozenset({"completed", "blocked", "max-tokens", "interrupted"})
_FAILURE_OPTIONAL = {"status": int, "providerRetryAfterMs": int, "requestId": str}


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

"""Session: one append-only event log, its seeds, and the folds derived from it.

Invariants this module owns (docs/rules.md#seeds-and-the-end-seed-marker,
docs/rules.md#what-append-refuses, docs/rules.md#the-request-header, docs/rules.md#resume):

* ``seq`` equals the event's index (contiguous from 0); ``time`` is integer epoch ms and never
  decreases (``max(clock(), last time)``);
* every accepted event is frozen; appends and snapshot-mode seeds are validated and copied once,
  restore-mode seeds are validated without a copy (they are owned, already frozen events);
* the surface only changes through a validated plan applied right after commit, so a refused
  event leaves no trace;
* a seeded (forked) session's inherited event count equals its header ``seedLength``, with at
  most one ``session/end-seed {inherited: true}`` after the cut, and any constructor seed ends
  with a ``session/end-seed``.

The core does no I/O; the default clock only reads the wall clock.
"""

from __future__ import annotations

import contextlib
import logging
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from itertools import islice, repeat
from operator import itemgetter
from time import time_ns
from typing import Any, Final, Literal, Protocol, TypeVar, cast, overload

from dsh._errors import DshError, EventRejectedError, InvalidJsonError, LogCorruptError
from dsh.json import (
    MAX_SAFE_INTEGER,
    FrozenDict,
    c_admit_plain,
    c_append_event,
    c_gather_messages,
    c_message_shape_ok,
    c_snapshot_events,
    dumps,
    snapshot_json,
)
from dsh.session._events import (
    ENVELOPE_KEYS,
    KNOWN_EVENT_TYPES,
    SURFACE_EVENT_TYPES,
    Event,
    as_event,
    is_append_surface_event,
    make_event,
    registered_event_type,
    unknown_type_hint,
)
from dsh.session._header import SessionHeader, validate_header
from dsh.session._paging import EventSource, PagedLog
from dsh.session._surface import (
    LazyNodes,
    NodeSeqs,
    Surface,
    SurfacePlan,
    derive_event_message,
)

logger = logging.getLogger(__name__)

Clock = Callable[[], int]
"""A callable returning the current time in integer epoch milliseconds."""

EventObserver = Callable[["Session", Event], object]
"""``callback(session, event)`` called after an append commits (failures are logged)."""

EventValidator = Callable[["Session", Event], object]
"""``callback(session, candidate)`` called before commit; raising vetoes the append."""

BatchObserver = Callable[["Session", Sequence[Event]], object]
"""``callback(session, events)`` called once with the events committed inside a
:meth:`Session.batch` block, in seq order (failures are logged)."""

_NO_TIME: Final = -MAX_SAFE_INTEGER - 1
_MIN_TIME: Final = -MAX_SAFE_INTEGER
_APPEND: Final = SurfacePlan(-1, -1, -1)  # marker: push the new seq, nothing to validate
_END_SEED: Final = "session/end-seed"
_TYPE_OF: Final = itemgetter("type")

_Log = list[Event] | PagedLog
_T = TypeVar("_T")
"""A session's log: a resident list, or a paged one after an O(tail) resume."""


def wall_clock_ms() -> int:
    """Return the wall-clock time in integer epoch milliseconds (the default session clock)."""
    return time_ns() // 1_000_000


def _reject(message: str, code: str, **where: int | str | None) -> EventRejectedError:
    return EventRejectedError(message, code=code, **where)


def _is_count(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_SAFE_INTEGER


def _non_empty_str(value: object) -> bool:
    return type(value) is str and value != ""


def _unplain(seed: Sequence[Any], base: int, log: _Log, nodes: list[int],
             cache: dict[int, FrozenDict | None], *, snapshot: bool = False
             ) -> Iterator[tuple[int, Any]]:
    """Yield only the seed events the admission loop must look at; admit the others in C.

    The C accelerator admits plain log-only events (they need nothing but appending) and plain
    surface appends (a node and its cached message) up to the next event it leaves to the
    admission loop; those are appended to ``log`` before that event is yielded, so ``log``
    and ``nodes`` always hold the seed prefix when the loop body runs. Yielded positions are
    ``base`` + the seed index. ``snapshot``: a snapshot seed (:meth:`Session.create`): the
    turn-shaped events get the core-shape check only that admission runs; the C pass admits
    those whose data has the common accepted shape and yields the others.
    """
    admit = c_admit_plain
    if admit is None:  # no accelerator: the admission loop looks at every event
        yield from enumerate(seed, base)
        return
    extra = (_TURN_SHAPED,) if snapshot else ()
    pos, count = 0, len(seed)
    while pos < count:
        stop = admit(seed, pos, base, Event, SURFACE_EVENT_TYPES, nodes, cache, *extra)
        if stop > pos:
            log.extend(seed[pos:stop])
        if stop >= count:
            return
        yield base + stop, seed[stop]
        pos = stop + 1


def _frozen_prefix(seed: Sequence[Any], *, owned: bool = False) -> list[Any]:
    """``seed`` with each event snapshotted as an :class:`Event`, up to the first that fails.

    The events from the first one that is not a lossless JSON object on are kept as given:
    the admission loop snapshots them in turn and refuses the first bad one at its place, so
    an earlier event's refusal still comes first (docs/rules.md#seed-validation). ``owned``:
    the caller hands ``seed``'s containers over; the C pass freezes those nothing else
    references in place (the same snapshot, without a copy to build and a plain one to free).
    """
    out: list[Any] = []
    index, count = 0, len(seed)
    while index < count:
        if c_snapshot_events is not None:  # the plain ones in C, up to one Python must judge
            index = c_snapshot_events(seed, index, Event, out, owned)
            if index >= count:
                break
        try:
            event = snapshot_json(seed[index])
        except InvalidJsonError:
            return [*out, *seed[index:]]
        if type(event) is not Event:
            if type(event) is not FrozenDict:
                return [*out, *seed[index:]]
            event = as_event(event)
        out.append(event)
        index += 1
    return out


# --- seed validation (docs/rules.md#seed-validation) ----------------------------------------------


def _check_envelope(event: Any, index: int) -> None:
    """Envelope checks of a seeded event (the legacy type is checked by the caller).

    Rule: docs/rules.md#seed-validation.
    """
    problem = None
    if not event.keys() <= ENVELOPE_KEYS:
        extra = sorted(set(event.keys()) - ENVELOPE_KEYS)
        problem = f"unknown key(s) {', '.join(map(repr, extra))}"
    elif type(event.get("type")) is not str:
        problem = f"type must be a string (found {event.get('type')!r})"
    elif not _is_count(event.get("seq")):
        problem = f"seq must be a non-negative safe integer (found {event.get('seq')!r})"
    elif type(event.get("time")) is not int or abs(event["time"]) > MAX_SAFE_INTEGER:
        problem = f"time must be a safe integer (found {event.get('time')!r})"
    elif "data" not in event:
        problem = "data is missing"
    elif "ignorable" in event and event["ignorable"] is not True:
        problem = f"ignorable must be true when present (found {event['ignorable']!r})"
    if problem is not None:
        raise _reject(f"seed event at index {index} has an invalid event envelope: {problem}",
                      "ENVELOPE", seed_index=index, event_type=event.get("type")
                      if type(event.get("type")) is str else None)


def _check_request_header_shape(event: Any, index: int) -> None:
    """LLM-shape checks of a seeded ``request/header`` (docs/rules.md#seed-validation)."""
    data = event["data"]
    header = data.get("header") if isinstance(data, dict) else None
    config = header.get("config") if isinstance(header, dict) else None
    where: dict[str, Any] = {"seed_index": index, "event_type": "request/header"}
    if not isinstance(config, dict) or not _non_empty_str(config.get("provider")) \
            or not _non_empty_str(config.get("model")):
        raise _reject(f"seed request/header at index {index} lacks provider/model", "SHAPE",
                      **where)
    assert isinstance(header, dict)  # narrowed by the config lookup above
    if "reasoningEffort" in config and not _non_empty_str(config["reasoningEffort"]):
        raise _reject(f"seed request/header at index {index} has an invalid reasoningEffort "
                      f"({config['reasoningEffort']!r}; expected a non-empty string)", "SHAPE",
                      **where)
    if "adapterDefaults" in header:
        defaults = header["adapterDefaults"]
        valid = isinstance(defaults, dict) and all(
            key in ("reasoningEffort", "maxTokens") and value is True and key in config
            for key, value in defaults.items())
        if not valid:
            raise _reject(f"seed request/header at index {index} has invalid adapterDefaults "
                          f"({defaults!r}; expected true flags for configured reasoningEffort "
                          "or maxTokens)", "SHAPE", **where)


_ROLES: Final = {"assistant/message": "assistant", "system/message": "system",
                 "user/message": "user", "tool/result": "user"}


def _never_ok(event: Any) -> bool:
    return False


# True when _check_message_shape would pass (one C call); else that check runs and names why.
_message_shape_ok: Callable[[Any], bool] = (
    c_message_shape_ok if c_message_shape_ok is not None else _never_ok)


def _shape_error(event: Any, index: int, appended: bool, problem: str) -> EventRejectedError:
    etype = event["type"]
    if appended:
        return _reject(f"appended {etype} at seq {index} {problem}; refused because a log "
                       f"holding it could not be read back", "SHAPE", seq=index,
                       event_type=etype)
    return _reject(f"seed {etype} at index {index} {problem}", "SHAPE", seed_index=index,
                   event_type=etype)


_CORE_SHAPED: Final = frozenset({*SURFACE_EVENT_TYPES, "request/header", "turn/start", "turn/end",
                                  "step/start", "step/end", "steering/message", "mode/set"})
_TURN_SHAPED: Final = frozenset({"turn/start", "turn/end", "step/start", "step/end"})
_TURN_BRACKETS: Final = frozenset({"turn/start", "turn/end"})
_BARE_END_KINDS: Final = frozenset({"completed", "blocked", "max-tokens", "interrupted"})


def _positive(value: Any) -> bool:
    return type(value) is int and 1 <= value <= MAX_SAFE_INTEGER


def _check_core_shape(etype: str, data: Any, seq: int, *, seed: bool = False) -> None:
    """Append-time shape checks of the core types, so a log we write always reads back.

    dsh's ``append`` skips them (docs/rules.md#what-append-refuses); its reader then refuses
    the log (seed validation, docs/rules.md#seed-validation; legacy normalisation,
    docs/events.md#legacy-shapes). We refuse at the door instead.

    Raises:
        EventRejectedError: code SHAPE naming the type, seq and what is wrong.
    """
    if etype in SURFACE_EVENT_TYPES:
        _check_message_shape({"type": etype, "data": data}, seq, appended=True)
        return
    if etype == "request/header":
        try:
            _check_request_header_shape({"type": etype, "data": data}, seq)
        except EventRejectedError as exc:
            raise _reject(exc.message.replace(f"seed request/header at index {seq}",
                                              f"appended request/header at seq {seq}"),
                          "SHAPE", seq=seq, event_type=etype) from None
        return
    problem = None
    is_map = isinstance(data, dict)
    if etype == "turn/start":
        turn = data.get("turn") if is_map else None
        if not is_map or len(data) != 1 or type(turn) is not int \
                or not 1 <= turn <= MAX_SAFE_INTEGER:
            problem = "needs data {turn: a positive integer}"
    elif etype == "step/start" or etype == "step/end":
        turn = data.get("turn") if is_map else None
        step = data.get("step") if is_map else None
        if not is_map or len(data) != 2 or type(turn) is not int or type(step) is not int \
                or not 1 <= turn <= MAX_SAFE_INTEGER or not 1 <= step <= MAX_SAFE_INTEGER:
            problem = "needs data {turn, step: positive integers}"
    elif etype == "turn/end":
        reason: Any = data.get("reason") if is_map else None
        kind = reason.get("kind") if isinstance(reason, dict) else None
        if not is_map or len(data) != 2 or not _positive(data.get("turn")) \
                or type(kind) is not str or not kind:
            problem = "needs data {turn: a positive integer, reason: {kind: string}}"
        elif kind in _BARE_END_KINDS and len(reason) != 1:
            problem = f"reason {kind!r} takes no other field"
        elif kind == "aborted" and not isinstance(reason.get("reason"), dict):
            problem = "reason 'aborted' needs a cause object in reason.reason"
        elif kind == "error" and not (isinstance(reason.get("error"), dict)
                                      and isinstance(reason["error"].get("message"), str)
                                      and isinstance(reason["error"].get("code"), str)):
            problem = "reason 'error' needs error {message, code}"
    else:  # steering/message, mode/set
        problem = "is a removed legacy type"
    if problem is not None:
        if seed:
            raise _reject(f"seed {etype} at index {seq} {problem}", "SHAPE", seed_index=seq,
                          event_type=etype)
        raise _reject(f"appended {etype} at seq {seq} {problem}; refused because a log holding "
                      f"it could not be read back", "SHAPE", seq=seq, event_type=etype)


def _expected_shape(etype: str, data: Any) -> str:
    """What a message event's data should look like, and what it held instead."""
    found = (f"found keys {', '.join(sorted(map(str, data)))}" if isinstance(data, dict) and data
             else f"found {'an empty object' if isinstance(data, dict) else _kind_of(data)}")
    if etype in ("user/message", "system/message"):
        role = "user" if etype == "user/message" else "system"
        return (f" (expected data to be the message itself: {{id, role: {role!r}, content, "
                f"source}}, e.g. from create_{role}_message(); {found})")
    maker = "create_assistant_message" if etype == "assistant/message" else \
        "create_tool_result_message"
    return (f" (expected data {{turn, step, message}}: the turn and step numbers and the "
            f"message from {maker}(), e.g. {{'turn': 1, 'step': 1, 'message': ...}}; {found})")


def _kind_of(value: Any) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


def _made_call_ids(data: Any) -> list[str]:
    message = data.get("message") if isinstance(data, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return []
    return [block["id"] for block in content
            if isinstance(block, dict) and block.get("type") == "tool-call"
            and isinstance(block.get("id"), str)]


def _result_call_id(data: Any) -> str:
    """The call id a stored ``tool/result`` answers ('' when its shape has none)."""
    message = data.get("message") if isinstance(data, dict) else None
    source = message.get("source") if isinstance(message, dict) else None
    call_id = source.get("callId") if isinstance(source, dict) else None
    return call_id if isinstance(call_id, str) else ""


def _unknown_type(etype: str, seq: int) -> EventRejectedError:
    guess = unknown_type_hint(etype)
    typo = f' (did you mean "{guess}"?)' if guess else ""
    return _reject(f'unknown event type "{etype}"{typo} at seq {seq}: no dsh reader accepts '
                   "it, so a log holding it could not be read back. For a type of your own, "
                   f'register it with dsh.register_event_type("{etype}") or append it with '
                   "ignorable=True", "UNKNOWN_EVENT_TYPE", seq=seq, event_type=etype)


def _run_custom_validator(check: Callable[[Any], object], etype: str, data: Any,
                          seq: int) -> None:
    try:
        check(data)
    except DshError:
        raise
    except Exception as exc:  # the user's validator said no: refuse with its reason
        raise _reject(f'appended {etype} at seq {seq} was refused by the validator registered '
                      f"for its type: {exc}", "CUSTOM_EVENT_INVALID", seq=seq,
                      event_type=etype) from exc


def _check_message_shape(event: Any, index: int, appended: bool = False) -> None:
    """Message-event shape checks (docs/rules.md#seed-validation), in order.

    ``system/message`` is checked like ``user/message`` with role ``system``
    (docs/rules.md#the-system-head).
    """
    etype = event["type"]
    data = event["data"]
    if etype == "user/message" or etype == "system/message":
        message = data
    else:
        message = data.get("message") if isinstance(data, dict) else None
    if not isinstance(message, dict):
        raise _shape_error(event, index, appended, "lacks an identified message"
                           + _expected_shape(etype, data))
    message_id = message.get("id")
    if type(message_id) is not str or not message_id:
        raise _shape_error(event, index, appended, "lacks an identified message"
                           + _expected_shape(etype, data))
    role = _ROLES[etype]
    if message.get("role") != role:
        raise _shape_error(event, index, appended, f'message must have role "{role}" (found '
                           f"{message.get('role')!r})")
    source = message.get("source")
    if not isinstance(source, dict):
        raise _shape_error(event, index, appended, "message has invalid source")
    kind = source.get("kind")
    if type(kind) is not str or not kind:
        raise _shape_error(event, index, appended, "message has invalid source")
    content = message.get("content")
    if not isinstance(content, list):
        raise _shape_error(event, index, appended,
                           "message has invalid content (expected an array)")
    if etype == "assistant/message":
        if kind != "model" or not _non_empty_str(source.get("provider")) \
                or not _non_empty_str(source.get("model")):
            raise _shape_error(event, index, appended, "message must have model source")
    elif etype == "tool/result":
        call_id = source.get("callId")
        if kind != "tool" or not _non_empty_str(call_id):
            raise _shape_error(event, index, appended, "message must have tool source")
        block = content[0] if len(content) == 1 else None
        if not isinstance(block, dict) or block.get("type") != "tool-result" \
                or not isinstance(block.get("content"), list):
            raise _shape_error(event, index, appended, "message must contain one tool-result block")
        if block.get("toolCallId") != call_id:
            raise _shape_error(event, index, appended,
                               "message has mismatched tool call ids (block "
                               f"{block.get('toolCallId')!r}, source {call_id!r})")


def _is_legacy_header(etype: str, data: Any) -> bool:
    return etype == "request/header" and isinstance(data, dict) and data.get("reason") == "fallback"


def _legacy_error(etype: str, **where: Any) -> EventRejectedError:
    if etype == "request/header-delta":
        return _reject("unsupported legacy request/header-delta event (every request/header is a "
                       "full snapshot since dsh 0.1)", "LEGACY", event_type=etype, **where)
    return _reject('unsupported legacy request/header reason "fallback" (expected initial, '
                   "resume or change)", "LEGACY", event_type=etype, **where)


def _seed_slow_checks(event: Any, index: int) -> None:
    """Report the first seed failure in docs/rules.md#seed-validation; return if there is none."""
    etype = event.get("type")
    if etype == "request/header-delta":
        raise _legacy_error(etype, seed_index=index)
    _check_envelope(event, index)
    if etype in SURFACE_EVENT_TYPES:
        _check_message_shape(event, index)
    elif etype == "request/header":
        _check_request_header_shape(event, index)
        if _is_legacy_header(etype, event["data"]):
            raise _legacy_error(etype, seed_index=index)
    if event["seq"] != index:
        raise _reject(f"seed must be contiguous from 0: event at index {index} has seq "
                      f"{event['seq']}; expected seq {index}", "SEQ_NOT_CONTIGUOUS",
                      seed_index=index, event_type=etype)


def stored_event_problem(event: Mapping[str, Any]) -> EventRejectedError | None:
    """The first rule a stored event breaks on its own, for readers that fold without a Session.

    ``dsh show`` and ``dsh view`` fold a log page by page without the reducer; they ask this of
    each message event (and each event carrying a ``surfaceOp``) so that an event the model
    view would refuse is marked, never skipped (docs/cli.md#dsh-show). Checked: the envelope,
    the message shape and the form of the ``surfaceOp`` marker (docs/rules.md#seed-validation,
    docs/rules.md#surface-ops); not what needs the surface (a replace range's seqs).

    Args:
        event: One stored event (a mapping with ``type``, ``seq``, ``time``, ``data``...).

    Returns:
        None when it passes, else the error the reducer raises for it: code ``ENVELOPE``,
        ``SHAPE`` or ``SURFACE``, naming its seq.
    """
    etype = event.get("type")
    seq = event.get("seq")
    index = seq if type(seq) is int else -1
    try:
        _check_envelope(event, index)
        if etype not in SURFACE_EVENT_TYPES:
            if "surfaceOp" in event:
                raise _reject(f"session event {etype!r} at seq {index} is not surface-eligible "
                              "and cannot carry surfaceOp", "SURFACE", seq=index,
                              event_type=str(etype))
            return None
        if not _message_shape_ok(event):
            _check_message_shape(event, index)
        op = event.get("surfaceOp")
        if op is None:
            raise _reject(f"session event {etype!r} at seq {index} is surface-eligible and "
                          "requires a surfaceOp marker", "SURFACE", seq=index,
                          event_type=str(etype))
        if op != "append" and not (
                isinstance(op, Mapping) and op.keys() == {"op", "start", "end"}
                and op["op"] == "replace" and _is_count(op["start"]) and _is_count(op["end"])):
            raise _reject(f"session event {etype!r} at seq {index} carries an invalid surfaceOp "
                          f"({op!r}); expected \"append\" or a replace object", "SURFACE",
                          seq=index, event_type=str(etype))
    except EventRejectedError as exc:
        # Those checks word it for a seed, by index; a stored event is named by its seq.
        message = exc.message.replace(f"seed {etype} at index {index}", f"{etype} at seq {index}")
        message = message.replace(f"seed event at index {index}", f"event at seq {index}")
        return _reject(message, str(exc.code), seq=index,
                       event_type=etype if type(etype) is str else None)
    return None


# --- request header (docs/rules.md#the-request-header) --------------------------------------------


def canonical_header(header: Mapping[str, Any]) -> FrozenDict:
    """Return the canonical form of a request header: empty optional parts dropped.

    Args:
        header: An ``EpochHeader`` mapping (``config``, ``adapterDefaults``?, ``system``?,
            ``tools``?).

    Returns:
        A frozen header with ``config`` (same object), ``adapterDefaults`` only when a flag is
        ``true``, ``system`` only when non-empty, ``tools`` only when non-empty.

    Rule: docs/rules.md#canonical-header-and-equality.
    """
    out: dict[str, Any] = {"config": header.get("config")}
    defaults = header.get("adapterDefaults")
    if isinstance(defaults, dict) and (defaults.get("reasoningEffort") is True
                                       or defaults.get("maxTokens") is True):
        out["adapterDefaults"] = defaults
    system = header.get("system")
    if system:
        out["system"] = system
    tools = header.get("tools")
    if isinstance(tools, list) and tools:
        out["tools"] = tools
    return FrozenDict(out)


_MISSING: Final = object()


def _strict_equal(a: object, b: object) -> bool:
    """JavaScript ``===`` over JSON scalars (absent is its own value; bool is not a number)."""
    if a is _MISSING or b is _MISSING:
        return a is b
    if (type(a) is bool) != (type(b) is bool):
        return False
    return a == b and not isinstance(a, dict | list)


def call_config_equals(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Return True when two ``LlmCallConfig`` mappings are equal for request purposes.

    ``provider``, ``model``, ``reasoningEffort``, ``temperature``, ``maxTokens`` must be strictly
    equal (absent equals only absent); ``stop`` lists must both be absent or equal element-wise
    (an empty list differs from absent). Rule: docs/rules.md#canonical-header-and-equality.
    """
    for key in ("provider", "model", "reasoningEffort", "temperature", "maxTokens"):
        if not _strict_equal(a.get(key, _MISSING), b.get(key, _MISSING)):
            return False
    stop_a, stop_b = a.get("stop", _MISSING), b.get("stop", _MISSING)
    if stop_a is _MISSING or stop_b is _MISSING:
        return stop_a is stop_b
    if not isinstance(stop_a, list) or not isinstance(stop_b, list) or len(stop_a) != len(stop_b):
        return False
    return all(_strict_equal(x, y) for x, y in zip(stop_a, stop_b, strict=True))


def _flag(header: Mapping[str, Any], key: str) -> object:
    defaults = header.get("adapterDefaults")
    return defaults.get(key, _MISSING) if isinstance(defaults, dict) else _MISSING


def header_equals(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Return True when two canonical request headers are equal.

    Compares the call config (:func:`call_config_equals`), each ``adapterDefaults`` flag,
    ``system`` strictly, and tools position by position as compact JSON text (order- and
    key-order-sensitive; absent and empty tool lists are equal). Rule:
    docs/rules.md#canonical-header-and-equality.
    """
    if not call_config_equals(a["config"], b["config"]):
        return False
    for key in ("reasoningEffort", "maxTokens"):
        if not _strict_equal(_flag(a, key), _flag(b, key)):
            return False
    if not _strict_equal(a.get("system", _MISSING), b.get("system", _MISSING)):
        return False
    tools_a, tools_b = a.get("tools") or [], b.get("tools") or []
    if len(tools_a) != len(tools_b):
        return False
    return all(dumps(x) == dumps(y) for x, y in zip(tools_a, tools_b, strict=True))


def _header_of(event: Event) -> FrozenDict:
    data = event["data"]
    header = data.get("header") if isinstance(data, dict) else None
    if not isinstance(header, dict):
        raise _reject(f"request/header at seq {event['seq']} has no header object", "SHAPE",
                      seq=event["seq"], event_type="request/header")
    return canonical_header(header)


def fold_request_header(events: Iterable[Event],
                        start: FrozenDict | None = None) -> FrozenDict | None:
    """Fold ``request/header`` events: each replaces the state with its canonical header.

    Args:
        events: Events in log order; other types are ignored.
        start: The state before ``events`` (returned itself when no header follows).

    Returns:
        The last canonical header, or ``start``.

    Raises:
        EventRejectedError: code ``SHAPE`` for a ``request/header`` without a header object.

    Rule: docs/rules.md#header-folds.
    """
    state = start
    for event in events:
        if event["type"] == "request/header":
            state = _header_of(event)
    return state


# --- the session ----------------------------------------------------------------------------


class PrefixState(Protocol):
    """What :meth:`Session.restore_paged` reads of the state of a log prefix.

    ``dsh.session.RestoreState`` (what restore points carry) is one; the attributes mean what
    it documents.
    """

    @property
    def event_count(self) -> int:
        """Events covered (seqs ``0 .. event_count - 1``)."""
        ...

    @property
    def last_time(self) -> int:
        """The ``time`` of the last covered event (epoch ms)."""
        ...

    @property
    def last_type(self) -> str:
        """The type of the last covered event."""
        ...

    @property
    def nodes(self) -> Sequence[int]:
        """Surface node seqs in model order."""
        ...

    @property
    def replace_generation(self) -> int:
        """Committed surface replacements."""
        ...

    @property
    def turn_boundary(self) -> int:
        """Seq of the last ``turn/start`` or ``turn/end`` covered, or -1 when none."""
        ...

    @property
    def turn_open(self) -> bool:
        """True when the event at :attr:`turn_boundary` is a ``turn/start``."""
        ...

    @property
    def last_turn(self) -> int | None:
        """The ``turn`` of the last ``turn/start`` covered (0: none), or None when unknown."""
        ...

    @property
    def request_header(self) -> FrozenDict | None:
        """The canonical request header folded so far, or None."""
        ...

    @property
    def request_context(self) -> FrozenDict | None:
        """The latest ``request/context`` data, or None."""
        ...

    @property
    def inherited_markers(self) -> int:
        """Inherited end-seed markers at or after the fork cut."""
        ...

class _Prefix(Sequence[_T]):
    """A snapshot of the first ``len`` items of an append-only sequence: immutable, O(1) to take.

    The backing sequence is only ever appended to (never changed below ``len``), so the
    snapshot shares it instead of copying. Indexing, slicing (returns a tuple), iteration,
    ``len`` and equality with any list, tuple or snapshot behave like a tuple; ``+`` returns a
    tuple. ``_noun`` names the items in errors and ``repr``.
    """

    __slots__ = ("_len", "_log")
    _noun = "item"

    def __init__(self, log: Sequence[_T], length: int) -> None:
        self._log = log
        self._len = length

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> _T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[_T, ...]: ...

    def __getitem__(self, index: int | slice) -> _T | tuple[_T, ...]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            return tuple(self._log[start:stop:step])
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError(f"{self._noun} index {index} out of range "
                             f"(the snapshot holds {self._len})")
        return self._log[index]

    def __iter__(self) -> Iterator[_T]:
        return islice(self._log, self._len)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Prefix | tuple | list):
            return len(other) == self._len and all(a == b for a, b in zip(self, other,
                                                                             strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        raise TypeError(f"unhashable type: {type(self).__name__!r}")

    def __add__(self, other: Sequence[_T]) -> tuple[_T, ...]:
        return (*self, *other)

    def __radd__(self, other: Sequence[_T]) -> tuple[_T, ...]:
        return (*other, *self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._len} {self._noun}s)"


class EventLog(_Prefix[Event]):
    """A snapshot of a session's first ``len`` events: immutable, shares the log, O(1) to take.

    Indexing, slicing (returns a tuple), iteration, ``len`` and equality with any sequence of
    events behave like a tuple; ``log + other`` returns a tuple.
    """

    __slots__ = ()
    _noun = "event"

    def select_back(self, types: Collection[str]) -> Iterator[Mapping[str, Any]]:
        """Yield the events whose type is in ``types``, newest first, as far as iterated.

        A log paged in after an O(tail) resume reads back from its end by type
        (:meth:`PagedLog.select_back`: each stored row checked, only these events decoded),
        not page by page; a resident log is walked in memory. The events come in the form
        a read gives them (``type``, ``seq``, ``data``... of a frozen event, or a plain
        mapping of the same fields).

        Raises:
            LogCorruptError: the stored events paged in no longer match the log.
        """
        log = self._log
        if isinstance(log, PagedLog):
            yield from log.select_back(types, self._len)
            return
        for index in range(self._len - 1, -1, -1):
            event = log[index]
            if event["type"] in types:
                yield event


class MessageLog(_Prefix[FrozenDict]):
    """What :meth:`Session.derive_messages` returns: the first ``len`` derived messages.

    Immutable and O(1) to take: it shares the session's list of derived messages, which only
    grows (a replace starts a new list, so a snapshot taken before it keeps its messages).
    Indexing, slicing (returns a tuple), iteration, ``len`` and equality with any list, tuple
    or snapshot behave like a tuple; ``+`` returns a tuple; ``list(...)`` gives a list to edit
    or serialize. Rule: docs/rules.md#deriving-messages.
    """

    __slots__ = ()
    _noun = "message"


class Session:
    """One session: an append-only, in-memory log of frozen events and what derives from it.

    Build one with :meth:`create` (snapshot mode: the seed is validated and copied),
    :meth:`restore` (restore mode: owned, already frozen events are validated without a copy)
    or :meth:`restore_paged` (an O(tail) resume: the events before a restore point's cut stay in
    storage and are paged in on demand; everything else behaves as after :meth:`restore`).

    Attributes:
        id: The session id (``header.id``).
        header: The frozen :class:`SessionHeader`.
        events: The log as a tuple (cached until the next append; a held tuple never grows).
        seq: The next seq (the log length).
        first_live_seq: The first seq this lifecycle wrote (the constructor seed's length).
        inherited_event_count: Leading events inherited from a fork parent (docs/rules.md#fork).
        surface: The :class:`Surface` (stable identity; ``nodes``, ``replace_generation``).

    Rule: docs/rules.md#the-log.
    """

    __slots__ = (
        "__weakref__",
        "_batch",
        "_batch_observers",
        "_calls_made",
        "_calls_prefix",
        "_calls_scanned",
        "_clock",
        "_derived",
        "_derived_count",
        "_derived_generation",
        "_events_cache",
        "_first_live_seq",
        "_header",
        "_id",
        "_inherited_event_count",
        "_last_time",
        "_log",
        "_message_cache",
        "_nodes",
        "_observers",
        "_pairing",
        "_prefix_turns",
        "_publishing",
        "_rc_count",
        "_rc_value",
        "_rh_count",
        "_rh_value",
        "_seed_markers",
        "_surface",
        "_validators",
    )

    def __init__(self, session_id: str, *, seed: Iterable[Any] | None = None,
                 header: Mapping[str, Any] | None = None, inherited_event_count: int = 0,
                 clock: Clock | None = None) -> None:
        """Same as :meth:`create` (snapshot mode)."""
        self._setup(session_id, clock)
        self._build(seed, header, inherited_event_count, "snapshot")

    # construction ---------------------------------------------------------------------------

    @classmethod
    def create(cls, session_id: str, *, seed: Iterable[Any] | None = None,
               header: Mapping[str, Any] | None = None, inherited_event_count: int = 0,
               clock: Clock | None = None) -> Session:
        """Build a session in snapshot mode: every seed event is validated and copied.

        Args:
            session_id: Non-empty session id.
            seed: Events to start from (plain dicts, frozen dicts or Events); ``None`` for a
                fresh session. Any seed, even ``[]``, ends with a ``session/end-seed`` marker.
            header: A full header mapping; when omitted ``{version: 0, id, createdAt: now}``.
                It is copied, so later changes by the caller are invisible.
            inherited_event_count: Events of ``seed`` inherited from a fork parent; must equal
                the header's ``seedLength`` when it has one, else 0.
            clock: Epoch-ms clock (default: wall clock).

        Returns:
            The session; ``first_live_seq`` is the seed's length.

        Raises:
            EventRejectedError: the first failure among, in order: seed events (codes
                ``NON_JSON``, ``LEGACY``, ``ENVELOPE``, ``SHAPE``, ``SEQ_NOT_CONTIGUOUS``,
                ``SURFACE``, with ``seed_index``), the header (``HEADER``), the seeded contract
                (``SEED``).

        Rule: docs/formats.md#the-session-header, docs/rules.md#seed-validation,
            docs/rules.md#the-end-seed-marker, docs/rules.md#resume.
        """
        return cls(session_id, seed=seed, header=header,
                   inherited_event_count=inherited_event_count, clock=clock)

    @classmethod
    def restore(cls, session_id: str, seed: Iterable[Event], header: Mapping[str, Any], *,
                inherited_event_count: int = 0, clock: Clock | None = None) -> Session:
        """Build a session in restore mode: owned, frozen events are validated, never copied.

        Args:
            session_id: Non-empty session id.
            seed: The stored log as :class:`Event` objects (from :func:`dsh.json.loads` or a
                backend); the session takes ownership.
            header: The full stored header; validated before the seed.
            inherited_event_count: Events inherited from a fork parent; must equal the header's
                ``seedLength`` when it has one, else 0.
            clock: Epoch-ms clock (default: wall clock).

        Returns:
            The session. If the seed does not end with ``session/end-seed``, a plain
            ``session/end-seed {}`` is appended.

        Raises:
            EventRejectedError: ``HEADER`` first, then seed failures (``ENVELOPE`` also for an
                item that is not an :class:`Event`), then ``SEED``.

        Rule: docs/formats.md#the-session-header, docs/rules.md#seed-validation,
            docs/rules.md#the-end-seed-marker (``fromRestore``); docs/rules.md#resume.
        """
        session = cls.__new__(cls)
        session._setup(session_id, clock)
        session._build(seed, header, inherited_event_count, "restore")
        return session

    @classmethod
    def restore_paged(cls, session_id: str, header: Mapping[str, Any], state: PrefixState,
                      source: EventSource, tail: Sequence[Event], *,
                      inherited_event_count: int = 0, clock: Clock | None = None) -> Session:
        """Restore from the prefix behind a restore point plus its tail: O(tail) :meth:`restore`.

        The events before the cut stay in storage and are paged in from ``source`` when asked
        for (``events``, ``event_at``, fork, compaction, a tool-result rewrite check,
        :meth:`derive_messages`); what a restore derives from them comes from ``state``. Nothing
        before the cut is read here: the surface is kept as node seqs, and the first
        :meth:`derive_messages` pages the surface's events in, in seq order, a page at a time
        (the page cache is bounded), keeping only the messages.

        Args:
            session_id: Non-empty session id.
            header: The full stored header (validated as by :meth:`restore`).
            state: The restore state of seqs ``0 .. len(source) - 1``
                (``state.event_count == len(source)``).
            source: Serves the events before the cut.
            tail: The stored events from the cut on (seq ``len(source)`` first), repair
                closers included, validated here exactly as :meth:`restore` validates a seed.
            inherited_event_count: As for :meth:`restore`.
            clock: Epoch-ms clock (default: wall clock).

        Returns:
            A session equal to ``Session.restore(id, prefix + tail, header, ...)`` in events,
            surface, folds, ``first_live_seq`` and what its next appends accept or refuse,
            provided ``state`` is the state of that prefix (persistence verifies the restore point
            carrying it against the stored bytes).

        Raises:
            EventRejectedError: as :meth:`restore`, for the header and the tail; ``SEED`` when
                ``state`` does not cover exactly ``len(source)`` events.
            LogCorruptError: the source served events that are not the prefix.

        Rule: as :meth:`restore`; docs/rules.md#restore-points-are-never-the-truth (restore points
            are derived, never the truth).
        """
        session = cls.__new__(cls)
        session._setup(session_id, clock)
        _check_inherited(session_id, inherited_event_count)
        cut = len(source)
        if state.event_count != cut or cut < 1:
            raise _reject(f"session {session_id!r}: restore state covers {state.event_count} "
                          f"events but the paged prefix holds {cut}", "SEED",
                          session_id=session_id)
        session._header = session._restore_header(header)
        log = session._log = PagedLog(source)
        log.note_last(_TURN_BRACKETS, state.turn_boundary, alone=state.turn_open)
        if state.last_turn is not None:
            session._prefix_turns = (cut, state.last_turn, state.turn_open)
        # the surface stays packed: a state read with its head packed is inflated at first
        # need (LazyNodes), any other is one copy of its int64 buffer; no int per node
        nodes = state.nodes
        session._nodes = (LazyNodes(nodes) if nodes.head_packed else nodes.to_array()) \
            if isinstance(nodes, NodeSeqs) else array("q", nodes)
        session._surface = Surface(session._nodes, state.replace_generation)
        session._derived_generation = state.replace_generation
        session._rh_value, session._rh_count = state.request_header, cut
        session._rc_value, session._rc_count = state.request_context, cut
        session._calls_scanned = cut
        session._calls_prefix = cut
        session._last_time = state.last_time
        markers = state.inherited_markers + session._admit_seed(
            tail, inherited_event_count, copy=False, base=cut)
        session._check_seeded(True, inherited_event_count, markers)
        session._seed_markers = markers
        session._inherited_event_count = inherited_event_count
        session._first_live_seq = len(log)
        last_type = tail[-1]["type"] if tail else state.last_type
        if last_type != _END_SEED:
            session.append(_END_SEED, {})
        return session

    def _setup(self, session_id: str, clock: Clock | None) -> None:
        self._clock: Clock = clock or wall_clock_ms
        self._log: _Log = []
        self._events_cache: EventLog | None = None
        # the surface's node seqs, appended to on the hot path: a list, or for a paged restore
        # an int64 array, or LazyNodes until it is inflated
        # (docs/architecture.md#the-restore-point-path)
        self._nodes: list[int] | array[int] | LazyNodes = []
        self._surface = Surface(self._nodes)
        self._last_time = _NO_TIME
        self._first_live_seq = 0
        self._prefix_turns: tuple[int, int, bool] | None = None  # see prefix_turns()
        self._inherited_event_count = 0
        self._seed_markers = 0  # inherited end-seed markers after the cut, in the seed
        self._observers: tuple[EventObserver, ...] = ()
        self._batch_observers: dict[EventObserver, BatchObserver] = {}
        self._batch: list[Event] | None = None  # events of the open batch() block, unpublished
        self._validators: tuple[EventValidator, ...] = ()
        self._publishing = False
        self._derived: list[FrozenDict] = []
        self._derived_count = 0
        self._derived_generation = 0
        self._message_cache: dict[int, FrozenDict | None] = {}
        self._rh_count = 0
        self._rh_value: FrozenDict | None = None
        self._rc_count = 0
        self._rc_value: FrozenDict | None = None
        self._calls_made: set[str] = set()
        self._calls_scanned = 0
        self._calls_prefix = 0  # paged log: calls before this seq are scanned only on a miss
        # what _open_calls found, with the surface's node count then: (count, open, answered,
        # made_at), carried over each surface change (see _paired)
        self._pairing: tuple[int, list[str], list[str], int] | None = None
        if type(session_id) is not str or not session_id:
            raise _reject(f"session id must be a non-empty string (found {session_id!r})",
                          "HEADER")
        self._id = session_id

    def _build(self, seed: Iterable[Any] | None, header: Mapping[str, Any] | None,
               inherited: int, mode: Literal["snapshot", "restore"]) -> None:
        if not _is_count(inherited):
            raise _reject(f"session {self._id!r}: inherited_event_count must be a non-negative "
                          f"safe integer (found {inherited!r})", "SEED", session_id=self._id)
        if mode == "restore":
            self._header = self._restore_header(header)
            markers = self._admit_seed(seed, inherited, copy=False) if seed is not None else 0
        else:
            markers = self._admit_seed(seed, inherited, copy=True) if seed is not None else 0
            self._header = self._snapshot_header(header)
        self._check_seeded(seed is not None, inherited, markers)
        self._seed_markers = markers
        self._inherited_event_count = inherited
        self._first_live_seq = len(self._log)
        # A fork seed already marks its cut with the inherited end-seed; the closers of a turn
        # left open at the cut follow it and are part of the seed (docs/rules.md#fork),
        # so a second, plain end-seed is added only to a seed without that marker.
        if seed is not None and not (mode == "snapshot" and markers) and (
                not self._log or self._log[-1]["type"] != _END_SEED):
            self.append(_END_SEED, {})

    def _snapshot_header(self, header: Mapping[str, Any] | None) -> SessionHeader:
        if header is None:
            return SessionHeader({"version": 0, "id": self._id, "createdAt": self._now()})
        try:
            snap = snapshot_json(header)
        except InvalidJsonError as exc:
            raise _reject(f"session {self._id!r} header is not losslessly JSON-serializable: "
                          f"{exc.message}", "HEADER", session_id=self._id,
                          json_path=exc.where.get("json_path")) from exc
        validate_header(snap, self._id)
        return snap if type(snap) is SessionHeader else SessionHeader(snap)

    def _restore_header(self, header: object) -> SessionHeader:
        if type(header) is SessionHeader:
            validate_header(header, self._id)
            return header
        if type(header) not in (dict, FrozenDict):
            raise _reject(f"session header is not a plain JSON record (found "
                          f"{type(header).__name__}) for session {self._id!r}", "HEADER",
                          session_id=self._id)
        validate_header(header, self._id)
        try:
            return SessionHeader(snapshot_json(header))
        except InvalidJsonError as exc:
            raise _reject(f"session {self._id!r} header is not losslessly JSON-serializable: "
                          f"{exc.message}", "HEADER", session_id=self._id) from exc

    def _admit_seed(self, seed: Iterable[Any], inherited: int, *, copy: bool,
                    base: int = 0, owned: bool = False) -> int:
        """Run the seed pipeline; return inherited markers after the cut.

        Rule: docs/rules.md#seed-validation.

        The common case (a 4-key envelope, a plain surface append) takes an inlined fast path;
        anything unusual goes through :meth:`_seed_slow_checks`, which reports the first failure
        in the documented order.
        """
        log = self._log
        log_append = log.appender() if isinstance(log, PagedLog) else log.append
        surface = self._surface
        nodes_append = self._nodes.append
        message_cache = self._message_cache
        markers = 0
        last_header = last_context = -1  # primes the request folds: no second pass over the log
        items: Iterable[tuple[int, Any]] = enumerate(seed, base)
        if c_admit_plain is not None and isinstance(seed, list | tuple) \
                and type(seed) in (list, tuple) and type(self._nodes) is list:
            if copy:  # frozen first, so the C pass takes the plain ones (the loop: the rest)
                seed = _frozen_prefix(seed, owned=owned)
            items = _unplain(seed, base, log, self._nodes, message_cache, snapshot=copy)
        for index, raw in items:
            if copy:
                try:
                    event = snapshot_json(raw)
                except InvalidJsonError as exc:
                    raise _reject(f"seed event at index {index} is not losslessly "
                                  f"JSON-serializable: {exc.message}", "NON_JSON",
                                  seed_index=index,
                                  json_path=exc.where.get("json_path")) from exc
                if type(event) is not Event:
                    if not isinstance(event, dict):
                        raise _reject(f"seed event at index {index} has an invalid event "
                                      f"envelope: not an object ({type(event).__name__})",
                                      "ENVELOPE", seed_index=index)
                    event = as_event(event)  # its values are frozen: no copy of them
            else:
                event = raw
                if type(event) is not Event:
                    raise _reject(f"seed event at index {index} has an invalid event envelope: "
                                  f"restore takes frozen Event objects (found "
                                  f"{type(raw).__name__})", "ENVELOPE", seed_index=index)
            etype = event.get("type")
            seq = event.get("seq")
            time = event.get("time")
            size = len(event)
            if (type(etype) is not str or type(seq) is not int or seq != index
                    or type(time) is not int or not _MIN_TIME <= time <= MAX_SAFE_INTEGER
                    or "data" not in event or etype == "request/header-delta"
                    or (size != 4 and not (event.keys() <= ENVELOPE_KEYS
                                           and event.get("ignorable", True) is True))):
                _seed_slow_checks(event, index)
            if etype in SURFACE_EVENT_TYPES:
                if not _message_shape_ok(event):
                    _check_message_shape(event, index)
                message_cache[index] = derive_event_message(event)
                if size == 5 and event.get("surfaceOp") == "append":
                    nodes_append(index)
                else:
                    try:
                        step = surface.plan(event, index, log)
                    except EventRejectedError as exc:
                        raise _reject(f"invalid seed event at index {index}: {exc.message}",
                                      exc.code, seed_index=index, event_type=etype) from exc
                    surface.apply(step)
            else:
                if copy and etype in _TURN_SHAPED:
                    # Snapshot seeds (imports, forks of detached logs) hold only what the
                    # append path would accept, so the resulting log always reads back.
                    _check_core_shape(etype, event["data"], index, seed=True)
                if etype == "request/header":
                    _check_request_header_shape(event, index)
                    if _is_legacy_header(etype, event["data"]):
                        raise _legacy_error(etype, seed_index=index)
                    last_header = index
                elif etype == "request/context":
                    last_context = index
                elif etype == _END_SEED and index >= inherited:
                    data = event["data"]
                    if isinstance(data, dict) and data.get("inherited") is True:
                        markers += 1
                if size != 4 and ("surfaceOp" in event or "sourceEventSeqs" in event):
                    try:
                        surface.plan(event, index, log)  # always refuses: log-only type
                    except EventRejectedError as exc:
                        raise _reject(f"invalid seed event at index {index}: {exc.message}",
                                      exc.code, seed_index=index, event_type=etype) from exc
            log_append(event)
        if len(log) > base:  # a paged restore's empty tail keeps the state's time (no page-in)
            self._last_time = log[-1]["time"]
        if base == 0 and self._rh_count == 0 and self._rc_count == 0:
            # What request_header() and request_context() would find by scanning it all.
            if last_header >= 0:
                self._rh_value = _header_of(log[last_header])
            if last_context >= 0:
                data = log[last_context]["data"]
                self._rc_value = data if isinstance(data, FrozenDict) else snapshot_json(data)
            self._rh_count = self._rc_count = len(log)
        return markers

    def _check_seeded(self, seeded_input: bool, inherited: int, markers: int) -> None:
        """The seeded-session contract of docs/rules.md#resume."""
        seed_length = self._header.get("seedLength")
        sid = self._id
        if seed_length is not None:
            if not seeded_input:
                raise _reject(f"seeded session {sid!r} (header seedLength {seed_length}) requires "
                              "an explicit constructor seed", "SEED", session_id=sid)
            if inherited != seed_length:
                raise _reject(f"seeded session {sid!r} requires an inherited event count equal "
                              f"to header seedLength {seed_length} (found {inherited})", "SEED",
                              session_id=sid)
        elif inherited != 0:
            raise _reject(f"session {sid!r} has no fork seedLength in its header, so its "
                          f"inherited event count must be 0 (found {inherited})", "SEED",
                          session_id=sid)
        if inherited > len(self._log):
            raise _reject(f"session {sid!r}: inherited event count {inherited} exceeds the seed "
                          f"length {len(self._log)}", "SEED", session_id=sid)
        if markers > 1:
            raise _reject(f"session {sid!r}: seed holds {markers} session/end-seed "
                          f"{{inherited: true}} markers after the cut at {inherited}; expected "
                          "at most one", "SEED", session_id=sid)

    def _now(self) -> int:
        now = self._clock()
        return now if type(now) is int else int(now)

    # read API -------------------------------------------------------------------------------

    @property
    def id(self) -> str:
        """The session id."""
        return self._id

    @property
    def header(self) -> SessionHeader:
        """The frozen session header."""
        return self._header

    @property
    def events(self) -> EventLog:
        """The log as a read-only sequence that never grows (docs/rules.md#the-log).

        O(1): the log is append-only, so the first ``len`` events are an immutable snapshot and
        need no copy. The same object is returned until the next append.
        """
        cached = self._events_cache
        if cached is None:
            cached = self._events_cache = EventLog(self._log, len(self._log))
        return cached

    @property
    def log_damage(self) -> LogCorruptError | None:
        """The damage a read of the stored log found under this session, or None.

        A session resumed by page reads the events before its restore point's cut from
        storage, each read checked (docs/rules.md#verified-page-in). Once one of them raised
        :class:`~dsh.LogCorruptError`, the stored log is not the one the session continues:
        its writer appends nothing more (not even the resume's ``session/end-seed``), and
        ``flush`` raises ``WriteFailedError`` caused by this error.
        """
        log = self._log
        return log.damage if isinstance(log, PagedLog) else None

    @property
    def seq(self) -> int:
        """The next seq, i.e. the number of events in the log."""
        return len(self._log)

    def prefix_turns(self) -> tuple[int, int, bool] | None:
        """What a paged restore's state says of the turns before its cut, or None.

        Returns:
            ``(cut, last_turn, turn_open)`` for a session restored by :meth:`restore_paged`
            from a state that names its ``last_turn`` (docs/formats.md#restore-points): the
            events before seq ``cut`` end their turns as ``turn_open`` says, and their last
            ``turn/start`` has ``turn`` ``last_turn`` (0: none). None otherwise (a resident
            log, a format 1 restore point): read the log itself. The recorder of a resumed
            session takes its turn number from here instead of reading before the cut.
        """
        return self._prefix_turns

    @property
    def first_live_seq(self) -> int:
        """The first seq written by this lifecycle (docs/rules.md#the-end-seed-marker)."""
        return self._first_live_seq

    @property
    def inherited_event_count(self) -> int:
        """Leading events inherited from a fork parent; 0 for a session that is no fork child."""
        return self._inherited_event_count

    @property
    def seed_marker_count(self) -> int:
        """Inherited ``session/end-seed`` markers the seed held at or after the fork cut.

        Counted when the seed was admitted (a restore refuses more than one), so a restore
        state can be taken from a paged session without paging its prefix in.
        """
        return self._seed_markers

    @property
    def surface(self) -> Surface:
        """The surface state (same object on every read)."""
        return self._surface

    def event_at(self, seq: int) -> Event:
        """Return the event with ``seq`` (``IndexError`` when absent), without copying the log."""
        if seq < 0:
            raise IndexError(f"seq {seq} is negative")
        return self._log[seq]

    # append ---------------------------------------------------------------------------------

    def append(self, type: str, data: Any, *, surface_op: Any = None,
               source_event_seqs: Any = None, ignorable: bool = False) -> Event:
        """Validate, commit and publish one event; return the frozen event.

        Args:
            type: Event type tag: one of dsh's types (``KNOWN_EVENT_TYPES``), a type
                registered with :func:`dsh.register_event_type` (written ``ignorable``), or
                any ``"namespace/name"`` with ``ignorable=True``. Anything else is refused,
                because no reader would accept the log (dsh's own append does not check).
            data: JSON payload; copied and frozen.
            surface_op: ``"append"`` or ``{"op": "replace", "start": seq, "end": seq}``;
                required for surface-eligible types, refused on others.
            source_event_seqs: Earlier seqs this event cites.
            ignorable: Mark the event ``ignorable: true``, so a reader that does not know its
                type keeps and skips it instead of refusing the log
                (docs/events.md#known-types-and-ignorable-events). Use it for your own event types;
                dsh's readers refuse unknown types without it.

        Returns:
            The committed :class:`Event` with keys ``type, seq, time, data[, sourceEventSeqs]
            [, surfaceOp]``; ``time`` is ``max(clock(), last event time)``.

        Raises:
            EventRejectedError: ``SHAPE`` (a core event a reader would refuse: a message without
                id, role, source or content, a tool result not answering its source's call, a
                turn or step that is not a positive integer, a malformed turn/end reason),
                ``NON_JSON`` (data or surface metadata), ``LEGACY``,
                ``REENTRANT_APPEND`` (called from an observer of this session's own append),
                ``ENVELOPE`` (type not a string), ``UNKNOWN_EVENT_TYPE`` (a type no reader
                accepts; the message names the known type it looks like a typo of),
                ``CUSTOM_EVENT_INVALID`` (a registered type's validator refused the data),
                ``ORPHAN_TOOL_RESULT`` (a fresh ``tool/result`` for a call that no earlier
                ``assistant/message`` of this session made, or that is not open at the end of
                the surface), ``DUPLICATE_TOOL_RESULT`` (a call already answered there),
                ``OPEN_TOOL_CALL`` (a fresh user, system or assistant message while the
                surface ends with unanswered tool calls; ``where`` names ``open_calls`` and
                ``call_seq``, docs/rules.md#a-model-view-any-provider-accepts), ``SURFACE``
                (docs/rules.md#the-surface), or whatever a validator raised. Nothing is committed on
                any failure.

        What append does not refuse, and why: the turn and step rules (turns and steps
        opened one at a time and numbered 1, 2, …; assistant messages, tool calls and fresh
        results inside the open step; a result answering a ``tool/call`` of the same step).
        dsh keeps them out of ``Session`` (docs/rules.md#turns-and-steps) so that any log dsh writes
        can be appended to here, and ``dsh verify`` reports them. To refuse them at append, attach
        :class:`dsh.session.InvariantObserver` (``observer.attach(session)``) or append
        through the agent recorder. A ``user/message`` outside a turn is accepted because it
        is valid: dsh itself writes compaction checkpoints and imported context that way.

        Rule: docs/rules.md#what-append-refuses (steps in that order).
        """
        seq = len(self._log)
        try:
            snap = snapshot_json(data)
        except InvalidJsonError as exc:
            raise _reject(f'session event "{type}" carries non-JSON-serializable data: '
                          f"{exc.message}", "NON_JSON", seq=seq, event_type=str(type),
                          json_path=exc.where.get("json_path")) from exc
        if type == "request/header-delta" or (
                type == "request/header" and _is_legacy_header(type, snap)):
            raise _legacy_error(type, seq=seq)
        sources = op = None
        if source_event_seqs is not None or surface_op is not None:
            try:
                if source_event_seqs is not None:
                    sources = snapshot_json(source_event_seqs)
                if surface_op is not None:
                    op = surface_op if surface_op == "append" else snapshot_json(surface_op)
            except InvalidJsonError as exc:
                raise _reject(f'session event "{type}" carries non-JSON-serializable surface '
                              f"metadata: {exc.message}", "NON_JSON", seq=seq,
                              event_type=str(type)) from exc
        if self._publishing:
            raise _reject(f"session {self._id!r}: session append cannot reenter while another "
                          f"append is being published (refused {type!r})", "REENTRANT_APPEND",
                          seq=seq, event_type=str(type))
        if not isinstance(type, str):
            raise _reject(f"event type must be a string (found {type!r})", "ENVELOPE", seq=seq)
        if type not in KNOWN_EVENT_TYPES and type not in _CORE_SHAPED:  # legacy: SHAPE
            registered, check = registered_event_type(type)
            if registered:
                ignorable = True  # readers that never registered it keep and skip it
                if check is not None:
                    _run_custom_validator(check, type, snap, seq)
            elif not ignorable:
                raise _unknown_type(type, seq)
        clock = self._clock
        # the default clock's body inline: one Python call fewer an event
        now = time_ns() // 1_000_000 if clock is wall_clock_ms else clock()
        if now.__class__ is not int:
            now = int(now)
        if now < self._last_time:
            now = self._last_time
        surface = self._surface
        core = type in _CORE_SHAPED
        # the envelope, and the shape check's accept path, in one C call; None where the
        # Python check must judge (it names the problem) or without the accelerator
        event = (None if c_append_event is None else
                 c_append_event(Event, type, seq, now, snap, sources, op, ignorable, core))
        if core:
            if event is None:
                _check_core_shape(type, snap, seq)
            if op == "append" and type in SURFACE_EVENT_TYPES:
                self._check_pairing(type, snap, seq)
        if event is None:
            event = make_event(type, seq, now, snap, surface_op=op, source_event_seqs=sources)
            if ignorable:
                event = as_event({**event, "ignorable": True})
        # (the surface plan reads the envelope's type, seq, surfaceOp and sourceEventSeqs)
        step: SurfacePlan | None
        if sources is None and op is None:
            step = (surface.plan(event, seq, self._log)  # raises: marker required
                    if type in SURFACE_EVENT_TYPES else None)
        elif sources is None and op == "append" and type in SURFACE_EVENT_TYPES:
            step = _APPEND  # a plain append without sources cannot be refused
        else:
            step = surface.plan(event, seq, self._log)
        if self._validators:
            if self._batch:
                # a validator may read state an observer keeps (InvariantObserver, the
                # compaction brackets): it sees the block's earlier appends published first
                self.publish_pending()
            for validate in self._validators:
                validate(self, event)
        # commit: nothing below may refuse the event
        self._log.append(event)
        self._events_cache = None
        self._last_time = now
        if step is not None:
            if step is _APPEND:
                self._nodes.append(seq)
            else:
                surface.apply(step)
            self._paired(type, op, snap, seq)
            # Project now, while the event is hot in the CPU cache: derive_messages() then only
            # gathers. A malformed message (append does not shape-check) is left for derive.
            try:  # noqa: SIM105 - contextlib.suppress builds a manager object an event
                self._message_cache[seq] = derive_event_message(event)
            except (KeyError, TypeError):
                pass
        if self._observers:
            batch = self._batch
            if batch is None:
                self._publish(event)
            else:
                batch.append(event)  # published when the batch() block ends
        return event

    def _open_calls(self) -> tuple[list[str], list[str], int]:
        """The tool calls open at the end of the surface (docs/rules.md#tool-pairing).

        Returns:
            ``(open, answered, made_at)``: the call ids of the last surface node that is not a
            ``tool/result``, when it is an ``assistant/message``, less those the results after
            it answer; those answered ids; the seq of that assistant message (-1 when the
            surface does not end in one and its results). A message after an assistant message
            closes its exchange, as the provider exporters do (an older log may hold one).
            Reads only the trailing results and the node before them.
        """
        count = len(self._nodes)
        known = self._pairing
        if known is not None and known[0] == count:
            return known[1], known[2], known[3]
        log = self._log
        # a paged log reads these few events alone, not their pages
        event_at = log.lone if type(log) is PagedLog else log.__getitem__
        answered: list[str] = []
        open_calls: list[str] = []
        made_at = -1
        for seq in reversed(self._surface.nodes):
            event = event_at(seq)
            kind = event["type"]
            if kind == "tool/result":
                answered.append(_result_call_id(event["data"]))
                continue
            if kind == "assistant/message":
                made = _made_call_ids(event["data"])
                open_calls, made_at = [c for c in made if c not in answered], seq
            break
        self._pairing = (count, open_calls, answered, made_at)
        return open_calls, answered, made_at

    def _paired(self, type: str, op: Any, data: Any, seq: int) -> None:
        """Carry what :meth:`_open_calls` found over the surface change ``seq`` just made.

        The surface of a live session changes only here, at the commit of a surface event.
        A fresh ``"append"`` of a message passed the pairing check, which found the open
        calls of the surface just before it; the walk :meth:`_open_calls` would make now
        stops at ``seq`` (a message) or passes it (a result answering one of those calls).
        Anything else (a replace, nothing known) forgets it.
        """
        known = self._pairing
        if known is None or op != "append" or known[0] + 1 != len(self._nodes):
            self._pairing = None
        elif type == "tool/result":
            call_id = _result_call_id(data)
            self._pairing = (known[0] + 1, [c for c in known[1] if c != call_id],
                             [call_id, *known[2]], known[3])
        elif type == "assistant/message":
            self._pairing = (known[0] + 1, _made_call_ids(data), [], seq)
        else:
            self._pairing = (known[0] + 1, [], [], -1)

    def _check_pairing(self, type: str, data: Any, seq: int) -> None:
        """Refuse a fresh surface message that would break a tool call/result pair.

        A ``user/message``, ``system/message`` or ``assistant/message`` appended while the
        surface ends with unanswered tool calls is ``OPEN_TOOL_CALL``; a ``tool/result``
        must answer one of those open calls (``ORPHAN_TOOL_RESULT``, ``DUPLICATE_TOOL_RESULT``).
        Rule: docs/rules.md#what-append-refuses.
        """
        if type == "tool/result":
            self._check_call_made(data, seq)
            call_id = data["message"]["source"]["callId"]
            open_calls, answered, made_at = self._open_calls()
            if call_id in open_calls:
                return
            if call_id in answered:
                raise _reject(f"tool/result at seq {seq} answers call {call_id!r} a second time "
                              f"(the assistant message at seq {made_at} made it and it is "
                              "answered); each tool call gets exactly one result, or a provider "
                              "would refuse the model view", "DUPLICATE_TOOL_RESULT", seq=seq,
                              event_type=type, call_id=call_id)
            now_open = ", ".join(open_calls) or "none"
            raise _reject(f"tool/result at seq {seq} answers call {call_id!r}, which is not open "
                          f"at the end of the surface (open calls: {now_open}); a result must "
                          "follow the assistant message that made its call, before any other "
                          "message", "ORPHAN_TOOL_RESULT", seq=seq, event_type=type,
                          call_id=call_id)
        open_calls, _, made_at = self._open_calls()
        if open_calls:
            ids = ", ".join(open_calls)
            raise _reject(f"{type} at seq {seq} would sit inside an open tool call/result pair: "
                          f"the assistant message at seq {made_at} made tool calls {ids}, "
                          "which have no result yet; append a tool/result for each first (a "
                          "provider refuses a message between a tool call and its result)",
                          "OPEN_TOOL_CALL", seq=seq, event_type=type, open_calls=ids,
                          call_seq=made_at)

    def _check_call_made(self, data: Any, seq: int) -> None:
        """Refuse a fresh tool result whose call no earlier assistant message made.

        The call ids of assistant messages are collected incrementally, scanning each event
        once, on the first tool result after them.
        """
        log = self._log
        made = self._calls_made
        for event in log[self._calls_scanned:]:  # a slice: one call, also on a paged log
            if event["type"] == "assistant/message":
                made.update(_made_call_ids(event["data"]))
        self._calls_scanned = len(log)
        call_id = data["message"]["source"]["callId"]
        if call_id not in made and self._calls_prefix:
            # A paged log scans its prefix once, on the first result the tail cannot place.
            for event in islice(log, self._calls_prefix):
                if event["type"] == "assistant/message":
                    made.update(_made_call_ids(event["data"]))
            self._calls_prefix = 0
        if call_id not in made:
            raise _reject(f"tool/result at seq {seq} answers call {call_id!r}, which no earlier "
                          f"assistant message of session {self._id!r} made; append the "
                          "assistant message with that tool call first (dsh verify would "
                          "report this result as an orphan)", "ORPHAN_TOOL_RESULT", seq=seq,
                          event_type="tool/result")

    def _publish(self, event: Event) -> None:
        self._publishing = True
        try:
            for observer in self._observers:
                self._notify(observer, event)
        finally:
            self._publishing = False

    def _notify(self, observer: EventObserver, event: Event) -> None:
        """Call one observer with one committed event; a failure is logged, never raised."""
        try:
            observer(self, event)
        except Exception:
            logger.exception("session %r: observer %r failed on event seq %d (%s); the "
                             "event stays committed", self._id, observer, event["seq"],
                             event["type"])

    def _publish_batch(self, events: list[Event]) -> None:
        """Tell every observer about ``events`` (a batch's, in seq order), each in one call."""
        self._publishing = True
        try:
            for observer in self._observers:
                on_batch = self._batch_observers.get(observer)
                if on_batch is None:
                    for event in events:
                        self._notify(observer, event)
                    continue
                try:
                    on_batch(self, events)
                except Exception:
                    logger.exception("session %r: observer %r failed on events seq %d..%d; "
                                     "the events stay committed", self._id, on_batch,
                                     events[0]["seq"], events[-1]["seq"])
        finally:
            self._publishing = False

    def publish_pending(self) -> None:
        """Publish now the events an open :meth:`batch` block has committed so far.

        A durability barrier (``SessionStore.flush``) calls it first: an event committed
        inside a block is acknowledged, so the flush must see it queued. The block goes on
        collecting the later ones; outside a block, or while observers are being told (a
        flush from an observer), it does nothing. Rule:
        docs/rules.md#write-behind-and-the-flush-barrier.
        """
        events = self._batch
        if events and not self._publishing:
            pending = events[:]
            # the block's own list keeps only what comes after: an append by another thread
            # between the copy and this delete stays in it
            del events[:len(pending)]
            self._publish_batch(pending)

    def batch(self) -> contextlib.AbstractContextManager[None]:
        """Publish the events appended inside the ``with`` block together, when it ends.

        Each append inside the block is validated, committed and refused exactly as outside
        it (the same checks, in the same order, against the log as it is then: an event
        sees the ones appended before it), and returns its committed event. Only the
        observers' notification waits: when the block ends (also by an exception, for the
        events committed before it), each observer is called once with the batch
        (``batch=`` of :meth:`observe`), or, having none, once per event in seq order. A
        persistence observer then queues a batch at once, not event by event. Nested
        blocks publish with the outermost. A flush, dispose or store close inside the block
        publishes what it committed so far first (:meth:`publish_pending`), and so does an
        append before its validators run (:meth:`add_validator`: one fed by an observer sees
        the block's earlier appends).

        Rule: docs/rules.md#what-append-refuses (unchanged inside a batch),
        docs/rules.md#live-sessions (``on_events``).
        """
        return _Batch(self)

    def observe(self, callback: EventObserver, *,
                batch: BatchObserver | None = None) -> Callable[[], None]:
        """Call ``callback(session, event)`` after each committed append; return an unsubscriber.

        Observers run in subscription order; an exception is logged (``logger.exception``) and
        never undoes the commit or stops later observers. An observer cannot append to this
        session (``REENTRANT_APPEND``). Rule: docs/rules.md#what-append-refuses.

        Args:
            callback: Called with each committed event.
            batch: Called instead, once, with the events of a :meth:`batch` block (in seq
                order) when that block ends; without it ``callback`` gets them one by one.
        """
        self._observers = (*self._observers, callback)
        if batch is not None:
            self._batch_observers[callback] = batch

        def unsubscribe() -> None:
            self._observers = tuple(o for o in self._observers if o is not callback)
            if callback not in self._observers:
                self._batch_observers.pop(callback, None)

        return unsubscribe

    def add_validator(self, callback: EventValidator) -> Callable[[], None]:
        """Call ``callback(session, candidate)`` before each commit; raising vetoes the append.

        The candidate is the frozen event that would be committed at ``session.seq``; a veto
        leaves the log, surface and observers untouched. Returns an unsubscriber.
        Rule: docs/rules.md#what-append-refuses (the pre-commit dispatch hook, used by invariant
            companions).
        """
        self._validators = (*self._validators, callback)

        def remove() -> None:
            self._validators = tuple(v for v in self._validators if v is not callback)

        return remove

    # derived views --------------------------------------------------------------------------

    def derive_messages(self, *, last: int | None = None) -> MessageLog:
        """Return the model-visible messages, in surface order, as a :class:`MessageLog`.

        With ``last=N`` (N >= 0): only the last N messages (fewer when the surface has fewer),
        found from the end of the surface, so they cost O(N) whatever the session's length
        (after an O(tail) resume, only the pages holding them are read); the incremental state
        of the full derive is not touched. A ``ValueError`` names a negative or non-integer N.

        Elements are the frozen messages stored in the log (shared, never copied). The result
        is an immutable snapshot that never grows, O(1) to take whatever the surface's length:
        it shares the session's list of derived messages, which is only appended to (a replace
        starts a new one), so holding the previous result costs nothing either. Use
        ``list(...)`` for a list to edit or serialize. Incremental: only nodes added since the
        last call are projected, unless ``replace_generation`` changed, which rebuilds from
        scratch; the gathering runs in the C accelerator when it is built.
        Rule: docs/rules.md#deriving-messages.
        """
        if last is not None:
            return self._last_messages(last)
        nodes = self._nodes
        if isinstance(nodes, LazyNodes):  # every node is asked for: one int64 array from now on
            # a restored session keeps its nodes in an int64 array (Surface.resume)
            nodes = self._nodes = cast("array[int]", self._surface.inflated_nodes())
        generation = self._surface.replace_generation
        if generation != self._derived_generation:
            self._derived = []
            self._derived_count = 0
            self._derived_generation = generation
        count = len(nodes)
        index = self._derived_count
        log = self._log
        if index < count and type(log) is PagedLog:
            self._page_in_messages(log, index)
        if index < count:
            # Each event is projected once per lifetime (events are immutable), so a rebuild after
            # a replace costs one cache lookup per node rather than a projection.
            out = self._derived
            cache = self._message_cache
            log = self._log
            gather = c_gather_messages  # a list or a paged restore's int64 array
            try:
                while index < count:
                    if gather is not None:
                        index = gather(nodes, index, cache, out)  # stops at an uncached node
                        if index == count:
                            break
                    seq = nodes[index]
                    if seq in cache:
                        message = cache[seq]
                    else:
                        message = cache[seq] = derive_event_message(log[seq])
                    if message is not None:
                        out.append(message)
                    index += 1
            finally:
                # should a projection raise, what was gathered stays counted exactly once
                self._derived_count = index
        derived = self._derived
        return MessageLog(derived, len(derived))

    def _last_messages(self, count: int) -> MessageLog:
        """The last ``count`` messages of the surface (see :meth:`derive_messages`)."""
        if type(count) is not int or count < 0:
            raise ValueError(f"last must be a non-negative integer, got {count!r}")
        if count == 0:
            return MessageLog([], 0)
        if self._derived_count == len(self._nodes) \
                and self._derived_generation == self._surface.replace_generation:
            tail = self._derived[-count:]  # the full derive is current: its tail is the answer
            return MessageLog(tail, len(tail))
        cache = self._message_cache
        log = self._log
        out: list[FrozenDict] = []
        for seq in reversed(self._nodes):
            message = cache[seq] if seq in cache else derive_event_message(log[seq])
            if message is not None:
                out.append(message)
                if len(out) == count:
                    break
        out.reverse()
        return MessageLog(out, len(out))

    def _page_in_messages(self, log: PagedLog, start: int) -> None:
        """Cache the messages of surface nodes ``start..`` that lie before the paged cut.

        The uncached seqs are read in ascending order (each page once, the page cache bounded);
        a projection that raises is left uncached, so :meth:`derive_messages` raises it.
        """
        cache = self._message_cache
        cut = log.cut
        missing = sorted(seq for seq in islice(self._nodes, start, None)
                         if seq < cut and seq not in cache)
        undecided = contextlib.suppress(KeyError, TypeError)  # as append: derive decides later
        for seq, event in log.items_at(missing):
            with undecided:  # one reusable manager, not one per node
                cache[seq] = derive_event_message(event)

    def derive_event_message(self, event: Event) -> FrozenDict | None:
        """Return the message ``event`` projects, or None (see :func:`derive_event_message`)."""
        return derive_event_message(event)

    def request_header(self) -> FrozenDict | None:
        """Return the latest canonical request header, or None before the first one.

        Incremental over new events; the result is frozen. Rule: docs/rules.md#header-folds.

        Raises:
            EventRejectedError: code ``SHAPE`` for an appended ``request/header`` with no header.
        """
        log = self._log
        count = len(log)
        if self._rh_count < count:
            value = self._rh_value
            for event in log[self._rh_count:count]:
                if event["type"] == "request/header":
                    value = _header_of(event)
            self._rh_value = value
            self._rh_count = count
        return self._rh_value

    def request_context(self) -> FrozenDict | None:
        """Return the latest ``request/context`` data (provider, model, contextWindow?), or None.

        Incremental over new events; the result is frozen. Rule: docs/rules.md#header-folds.
        """
        log = self._log
        count = len(log)
        if self._rc_count < count:
            value = self._rc_value
            for event in log[self._rc_count:count]:
                if event["type"] == "request/context":
                    data = event["data"]
                    value = data if isinstance(data, FrozenDict) else snapshot_json(data)
            self._rc_value = value
            self._rc_count = count
        return self._rc_value

    def transcript_events(self) -> tuple[Event, ...]:
        """Return the append-origin surface events: the durable material of a human transcript.

        Replacement copies (compaction summaries, rewritten results) are excluded.
        Rule: docs/rules.md#the-surface (``isAppendSurfaceEvent``).
        """
        return tuple(e for e in self._log if is_append_surface_event(e))

    def __repr__(self) -> str:
        return f"Session(id={self._id!r}, events={len(self._log)})"



class _Batch:
    """The context manager :meth:`Session.batch` returns (a class: no generator per call)."""

    __slots__ = ("_events", "_session")

    def __init__(self, session: Session) -> None:
        self._session = session
        self._events: list[Event] | None = None

    def __enter__(self) -> None:
        session = self._session
        if session._batch is None:  # an outer block publishes a nested one's events
            self._events = session._batch = []

    def __exit__(self, *exc: object) -> None:
        events = self._events
        if events is not None:
            session = self._session
            session._batch = None
            if events:
                session._publish_batch(events)


def _check_inherited(session_id: str, count: object) -> None:
    """Refuse an ``inherited_event_count`` that is no non-negative safe integer (``SEED``)."""
    if not _is_count(count):
        raise _reject(f"session {session_id!r}: inherited_event_count must be a "
                      f"non-negative safe integer (found {count!r})", "SEED",
                      session_id=session_id)


class _SettledTypes:
    """The settled part of a :class:`SeedStream`: each event's type, the event on demand.

    What a later seed event's checks read of earlier ones is the type (the node-0 system head
    of a replace) and, for a ``tool/result`` rewrite only, the replaced result itself; so only
    the types are kept (two bytes an event, the index of the type in ``names``; four past
    65,536 kinds) and pages are
    served as envelopes with no data, except while a batch with a ``tool/result`` rewrite is
    admitted: then from ``reader`` (the stored events).
    """

    def __init__(self, reader: Callable[[int, int], Sequence[Event]] | None) -> None:
        self.codes = array("H")
        self.names: list[str] = []
        self._code: dict[str, int] = {}
        self.reader = reader
        self.real = False

    def __len__(self) -> int:
        return len(self.codes)

    def extend(self, types: Iterable[str]) -> None:
        """Keep the types of the next settled events."""
        code = self._code
        types = list(types)
        numbers = list(map(code.get, types))
        if None not in numbers:  # every kind named before (all but a few batches): in C
            self.codes.extend(numbers)  # type: ignore[arg-type]
            return
        for name in types:
            number = code.get(name)
            if number is None:
                number = code[name] = len(self.names)
                self.names.append(name)
                if number > 0xFFFF and self.codes.typecode == "H":
                    self.codes = array("I", self.codes)  # more kinds than two bytes name
            self.codes.append(number)

    def read(self, start: int, stop: int) -> Sequence[Event]:
        if self.real and self.reader is not None:
            return self.reader(start, stop)
        names, codes = self.names, self.codes
        return [Event({"type": names[codes[seq]], "seq": seq, "time": 0, "data": None})
                for seq in range(start, stop)]


_NO_MAPPING: Final = frozenset({type(None), str})
"""Exact types of a ``surfaceOp`` value that is no mapping (a ``str`` subclass is not here:
the exact test judges it)."""


def _rewrites_a_result(batch: Sequence[Any]) -> bool:
    """Whether ``batch`` holds a ``tool/result`` rewrite: :meth:`SeedStream.admit`'s test.

    A rewrite is a mapping of that type with a ``surfaceOp`` mapping; its check reads the
    result it replaces (docs/rules.md#seed-validation).
    """
    try:  # a batch of dicts is told in C, each dict read once for an import's usual batch:
        # no surfaceOp that is a mapping (an import's are None or "append"; one pass, where
        # the per-event test below took ~0.05 s of a 44 MB transcript's import), or no
        # tool/result
        if _NO_MAPPING.issuperset(map(type, map(dict.get, batch, repeat("surfaceOp")))) \
                or "tool/result" not in map(dict.get, batch, repeat("type")):
            return False
    except TypeError:  # not every item is a dict: the exact test
        pass
    # ``type(...) is dict`` first: the ABC check costs a microsecond an event
    return any((type(event) is dict or isinstance(event, Mapping))
               and event.get("type") == "tool/result"
               and isinstance(event.get("surfaceOp"), Mapping) for event in batch)


class SeedStream:
    """Admit a long seed in batches with the checks of :meth:`Session.create`, in bounded memory.

    Rule: docs/rules.md#seed-validation, the same pipeline in the same order per event (a
    batch's events are checked one by one; ``seed_index`` is the seq). Between batches the
    caller stores what was admitted and calls :meth:`settle`: memory then holds the surface's
    node seqs and one type per settled event, not the log (a ``tool/result`` rewrite reads
    the result it replaces through ``reader``).

    Args:
        session_id: Non-empty session id.
        header: The full header (validated first, as :meth:`Session.create` does last).
        reader: ``(start, stop) -> the stored events start <= seq < stop``, for a batch holding
            a ``tool/result`` rewrite; without one such a rewrite is checked against a result
            with no payload (and refused).
        inherited_event_count: As for :meth:`Session.create`.
        restore: Check as :meth:`Session.restore` does instead: the header as a stored one
            (a plain record), the batches as owned frozen :class:`Event` objects (``ENVELOPE``
            for anything else), never copied. ``dsh verify``'s streamed form uses it.
        owned: The caller hands each batch over to :meth:`admit` (an importer's own events):
            the dicts and lists that nothing else references become the frozen events
            themselves, frozen in place instead of copied (the same events, the same checks).
            A batch's containers may then be frozen: read them only, after :meth:`admit`.

    Raises:
        EventRejectedError: as :meth:`Session.create` (``HEADER`` here; the others from
            :meth:`admit` and :meth:`finish`). After a refusal, drop the stream.
    """

    def __init__(self, session_id: str, *, header: Mapping[str, Any],
                 reader: Callable[[int, int], Sequence[Event]] | None = None,
                 inherited_event_count: int = 0, restore: bool = False,
                 owned: bool = False) -> None:
        session = Session.__new__(Session)
        session._setup(session_id, None)
        _check_inherited(session_id, inherited_event_count)
        session._header = (session._restore_header(header) if restore
                           else session._snapshot_header(header))
        self._copy = not restore
        self._owned = owned and not restore
        self._settled = _SettledTypes(reader)
        self._log = session._log = PagedLog(self._settled)
        self._session = session
        self._inherited = inherited_event_count
        self._markers = 0

    @property
    def count(self) -> int:
        """Events admitted so far (the seq the next one must have)."""
        return len(self._log)

    def admit(self, batch: Sequence[Any]) -> list[Event]:
        """Validate the next events; return them frozen, ready to store.

        Raises:
            EventRejectedError: the first refused event (``seed_index`` = its seq).
        """
        log = self._log
        base = len(log)
        self._settled.real = _rewrites_a_result(batch)
        if self._settled.real:
            log.drop_pages()
        try:
            self._markers += self._session._admit_seed(batch, self._inherited, copy=self._copy,
                                                       base=base, owned=self._owned)
        finally:
            if self._settled.real:
                self._settled.real = False
                log.drop_pages()
        self._session._message_cache.clear()  # messages are never derived here: keep none
        return log[base:]

    def settle(self) -> None:
        """Everything admitted is stored now: keep only its types."""
        log = self._log
        tail = log[log.cut:]
        self._settled.extend(map(_TYPE_OF, tail))
        log.settle(len(tail))

    def finish(self) -> None:
        """Check the seeded-session contract on the whole seed (docs/rules.md#resume).

        Raises:
            EventRejectedError: code ``SEED`` (a ``seedLength`` that the seed does not match).
        """
        self._session._check_seeded(True, self._inherited, self._markers)

    @property
    def surface(self) -> Surface:
        """The surface folded from every event admitted so far (docs/rules.md#the-surface)."""
        return self._session._surface

"""Chunk rows: the storage packing of ``assistant/chunk`` delta runs (a durable encoding only).

Invariants this module owns (docs/formats.md#chunk-rows):

* packing is lossless: ``decode(JSON round trip(pack(batch)))`` flattened equals ``batch`` exactly,
  key order included;
* only whitelisted delta shapes pack (anything else is stored verbatim), and only runs of at
  least :data:`MIN_RUN` consecutive members;
* decoding validates every row strictly and passes everything else through unvalidated.

Rows never enter ``Session.events``; their tags have no slash.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from dsh._errors import EventRejectedError
from dsh.json import MAX_SAFE_INTEGER, FrozenDict, FrozenList, JsonValue, is_safe_int
from dsh.session._events import Event, as_event

MIN_RUN: Final = 3
"""Fewest consecutive deltas that pack into one row (decoding is layout-blind).

Rule: docs/formats.md#chunk-rows.
"""

_TEXT: Final = "text-chunks"
_REASONING: Final = "reasoning-chunks"
_TOOL: Final = "tool-call-chunks"

CHUNK_ROW_TAGS: Final = frozenset({_TEXT, _REASONING, _TOOL})
"""The three storage-row tags (docs/formats.md#chunk-rows)."""

# delta chunk type -> row tag, and back
_ROW_OF: Final = {"text-delta": _TEXT, "reasoning-delta": _REASONING, "tool-call-delta": _TOOL}
_DELTA_OF: Final = {tag: delta for delta, tag in _ROW_OF.items()}

_EVENT_KEYS: Final = frozenset({"type", "seq", "time", "data"})
_DATA_KEYS: Final = frozenset({"turn", "step", "chunk"})
_TEXT_CHUNK_KEYS: Final = frozenset({"type", "index", "text"})
_TOOL_CHUNK_KEYS: Final = frozenset({"type", "index", "id", "argumentsDelta"})
_NAMED_TOOL_CHUNK_KEYS: Final = _TOOL_CHUNK_KEYS | {"name"}
_ROW_KEYS: Final = frozenset({"type", "seq0", "time0", "data"})
_TEXT_ROW_DATA_KEYS: Final = frozenset({"turn", "step", "index", "dt", "texts"})
_TOOL_ROW_DATA_KEYS: Final = frozenset({"turn", "step", "index", "dt", "id", "args"})
_NAMED_TOOL_ROW_DATA_KEYS: Final = _TOOL_ROW_DATA_KEYS | {"name"}


def _is_number(value: object) -> bool:
    # JSON numbers only; bool is never a number (docs/formats.md#lossless-json).
    return type(value) is int or type(value) is float


def _delta_kind(event: Any) -> str | None:
    """Return the row tag ``event`` would pack under, or None when it must stay verbatim.

    Rule: docs/formats.md#chunk-rows.
    """
    if not isinstance(event, dict) or event.keys() != _EVENT_KEYS:
        return None
    if event["type"] != "assistant/chunk":
        return None
    seq = event["seq"]
    if not is_safe_int(seq) or seq < 0 or not is_safe_int(event["time"]):
        return None
    data = event["data"]
    if not isinstance(data, dict) or data.keys() != _DATA_KEYS:
        return None
    if not _is_number(data["turn"]) or not _is_number(data["step"]):
        return None
    chunk = data["chunk"]
    if not isinstance(chunk, dict) or not _is_number(chunk.get("index")):
        return None
    ctype = chunk.get("type")
    if ctype == "text-delta" or ctype == "reasoning-delta":
        if chunk.keys() == _TEXT_CHUNK_KEYS and type(chunk["text"]) is str:
            return _ROW_OF[ctype]
        return None
    if ctype == "tool-call-delta":
        keys = chunk.keys()
        if keys != _TOOL_CHUNK_KEYS and (keys != _NAMED_TOOL_CHUNK_KEYS
                                         or type(chunk["name"]) is not str):
            return None
        if type(chunk["id"]) is str and type(chunk["argumentsDelta"]) is str:
            return _TOOL
    return None


def _continues(prev: Any, nxt: Any) -> bool:
    """True when ``nxt`` extends the run ending at ``prev`` (same kind already checked).

    Rule: docs/formats.md#chunk-rows.
    """
    if nxt["seq"] != prev["seq"] + 1 or not is_safe_int(nxt["time"] - prev["time"]):
        return False
    a, b = prev["data"], nxt["data"]
    if a["turn"] != b["turn"] or a["step"] != b["step"]:
        return False
    ca, cb = a["chunk"], b["chunk"]
    if ca["index"] != cb["index"]:
        return False
    if ca["type"] == "tool-call-delta":
        if ca["id"] != cb["id"] or ("name" in ca) != ("name" in cb):
            return False
        if "name" in ca and ca["name"] != cb["name"]:
            return False
    return True


def _row(tag: str, members: list[Any]) -> FrozenDict:
    first = members[0]
    data = first["data"]
    chunk = data["chunk"]
    dt = FrozenList([members[k]["time"] - members[k - 1]["time"] for k in range(1, len(members))])
    fields: dict[str, Any] = {"turn": data["turn"], "step": data["step"],
                              "index": chunk["index"], "dt": dt}
    if tag == _TOOL:
        fields["id"] = chunk["id"]
        if "name" in chunk:
            fields["name"] = chunk["name"]
        fields["args"] = FrozenList([m["data"]["chunk"]["argumentsDelta"] for m in members])
    else:
        fields["texts"] = FrozenList([m["data"]["chunk"]["text"] for m in members])
    return FrozenDict({"type": tag, "seq0": first["seq"], "time0": first["time"],
                       "data": FrozenDict(fields)})


def pack_chunk_runs(events: Iterable[Event]) -> list[FrozenDict | Event]:
    """Pack runs of consecutive stream deltas of one durable batch into chunk rows.

    Args:
        events: One batch of events in seq order (a batch is never merged with another).

    Returns:
        Storage records in order: each run of at least :data:`MIN_RUN` packable deltas becomes
        one frozen row ``{type: <tag>, seq0, time0, data}`` (data ``turn, step, index, dt, texts``
        or ``turn, step, index, dt, id, name?, args``; ``dt`` holds the ms gaps between member
        times, possibly negative); every other event is returned as the same object.
    A delta packs only in its exact whitelisted shape (docs/formats.md#chunk-rows); a run continues
    while seqs are consecutive, the time gap is a safe integer, and turn, step, block index (and for
    tool calls the call id and the presence and value of ``name``) stay the same
    (docs/formats.md#chunk-rows).
    Rule: docs/formats.md#chunk-rows, docs/formats.md#record-lines.
    """
    out: list[FrozenDict | Event] = []
    run: list[Any] = []
    run_tag: str | None = None

    def flush() -> None:
        if len(run) >= MIN_RUN:
            out.append(_row(run_tag, run))  # type: ignore[arg-type]  # a run always has a tag
        else:
            out.extend(run)
        run.clear()

    for event in events:
        tag = _delta_kind(event)
        if tag is None:
            flush()
            out.append(event)
            continue
        if tag == run_tag and run and _continues(run[-1], event):
            run.append(event)
            continue
        flush()
        run_tag = tag
        run.append(event)
    flush()
    return out


def _bad(tag: str, reason: str, seq0: object = None) -> EventRejectedError:
    return EventRejectedError(
        f"malformed {tag} storage row: {reason}",
        code="MALFORMED_CHUNK_ROW", event_type=tag,
        seq=seq0 if is_safe_int(seq0) else None)  # type: ignore[arg-type]  # checked int


def _string_list(value: object) -> bool:
    return isinstance(value, list) and len(value) > 0 and all(type(v) is str for v in value)


def decode_storage_record(value: JsonValue) -> list[Event | JsonValue]:
    """Expand one decoded storage record into the events it stands for.

    Args:
        value: One record as :func:`dsh.json.loads` returned it.

    Returns:
        For a chunk row (``type`` one of :data:`CHUNK_ROW_TAGS`): its members as frozen
        ``assistant/chunk`` events, member k at seq ``seq0 + k`` and time
        ``time0 + dt[0] + … + dt[k-1]``. For any other object: ``[Event(value)]``, unvalidated.
        For a non-object (``null``, a string, …): ``[value]``, unvalidated (the Session and
        persistence pipelines validate events later).

    Raises:
        EventRejectedError: code MALFORMED_CHUNK_ROW, message ``malformed <tag> storage row:
            <reason>``: envelope keys not exactly ``type, seq0, time0, data``; ``seq0`` not a
            non-negative safe integer; ``time0`` not a safe integer; ``data`` not an object or
            with the wrong key set; ``id``/``name`` not strings; ``turn``/``step``/``index`` not
            numbers; payload not a non-empty list of strings; ``dt`` not a list of safe integers
            or of the wrong length; a member seq or time beyond the safe-integer range. The
            persistence layer re-raises it with the file and line.
    Rule: docs/formats.md#chunk-rows, docs/formats.md#record-lines.
    """
    if not isinstance(value, dict):
        return [value]
    tag = value.get("type")
    if type(tag) is not str or tag not in CHUNK_ROW_TAGS:  # a list or object is unhashable
        return [value if isinstance(value, Event) else as_event(value)]
    if value.keys() != _ROW_KEYS:
        extra = sorted(set(value.keys()) ^ _ROW_KEYS)
        raise _bad(tag, f"envelope keys must be exactly type, seq0, time0, data; "
                        f"differs in {', '.join(extra)}")
    seq0, time0, data = value["seq0"], value["time0"], value["data"]
    if not is_safe_int(seq0) or seq0 < 0:
        raise _bad(tag, f"seq0 must be a non-negative safe integer, got {seq0!r}")
    if not is_safe_int(time0):
        raise _bad(tag, f"time0 must be a safe integer, got {time0!r}", seq0)
    if not isinstance(data, dict):
        raise _bad(tag, f"data must be an object, got {type(data).__name__}", seq0)
    tool = tag == _TOOL
    keys = data.keys()
    if tool:
        if keys != _TOOL_ROW_DATA_KEYS and keys != _NAMED_TOOL_ROW_DATA_KEYS:
            raise _bad(tag, "data keys must be turn, step, index, dt, id, name (optional), args; "
                            f"got {', '.join(keys)}", seq0)
        if type(data["id"]) is not str:
            raise _bad(tag, f"id must be a string, got {data['id']!r}", seq0)
        if "name" in data and type(data["name"]) is not str:
            raise _bad(tag, f"name must be a string, got {data['name']!r}", seq0)
    elif keys != _TEXT_ROW_DATA_KEYS:
        raise _bad(tag, f"data keys must be turn, step, index, dt, texts; got {', '.join(keys)}",
                   seq0)
    for field in ("turn", "step", "index"):
        if not _is_number(data[field]):
            raise _bad(tag, f"{field} must be a number, got {data[field]!r}", seq0)
    payload_key = "args" if tool else "texts"
    payload = data[payload_key]
    if not _string_list(payload):
        raise _bad(tag, f"{payload_key} must be a non-empty array of strings", seq0)
    dt = data["dt"]
    if not isinstance(dt, list) or not all(is_safe_int(gap) for gap in dt):
        raise _bad(tag, "dt must be an array of safe integers", seq0)
    if len(dt) != len(payload) - 1:
        raise _bad(tag, f"dt must hold {len(payload) - 1} gaps for {len(payload)} members, "
                        f"got {len(dt)}", seq0)
    if seq0 + len(payload) - 1 > MAX_SAFE_INTEGER:
        raise _bad(tag, "member seqs must stay safe integers", seq0)
    times = [time0]
    for gap in dt:
        nxt = times[-1] + gap
        if not is_safe_int(nxt):
            raise _bad(tag, "member times must stay safe integers", seq0)
        times.append(nxt)
    turn, step, index = data["turn"], data["step"], data["index"]
    delta = _DELTA_OF[tag]
    events: list[Event | JsonValue] = []
    for k, piece in enumerate(payload):
        if tool:
            chunk: dict[str, Any] = {"type": delta, "index": index, "id": data["id"]}
            if "name" in data:
                chunk["name"] = data["name"]
            chunk["argumentsDelta"] = piece
        else:
            chunk = {"type": delta, "index": index, "text": piece}
        events.append(Event({
            "type": "assistant/chunk", "seq": seq0 + k, "time": times[k],
            "data": FrozenDict({"turn": turn, "step": step, "chunk": FrozenDict(chunk)}),
        }))
    return events

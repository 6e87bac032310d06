"""A dsh JSONL session log (or a dsh test snapshot of one) read as is.

Line 1 is the header ``{"type": "session", "version": 0, "id", "createdAt", …}``; every later
line is an event or a packed chunk row (``text-chunks`` / ``reasoning-chunks`` /
``tool-call-chunks``, docs/formats.md#chunk-rows) which is expanded into its ``assistant/chunk``
members. Real logs carry ``seq``/``time`` (kept); dsh's snapshot files drop them, so seq is assigned
by position after expansion and time is the previous event's time (the header's ``createdAt`` at
first). Templated snapshot values (``{{sessionId}}``, ``{{cwd}}``) are replaced: the id by the
stable import id, the cwd dropped. No legacy conversion happens here (persistence owns it).
The log's own seqs are kept, so the ``import/source`` event goes last (ignorable events are
free-standing, docs/events.md#known-types-and-ignorable-events), stamped with the last event's time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from dsh._errors import ImportFormatError
from dsh.interop._common import (
    IMPORT_SOURCE_TYPE,
    ImportedSession,
    JsonObj,
    read_jsonl_records,
    source_event_data,
    stable_session_id,
)

if TYPE_CHECKING:
    from dsh.session import Violation

FORMAT: Final = "dsh"
_ROW_TYPES: Final = {"text-chunks": "text-delta", "reasoning-chunks": "reasoning-delta",
                     "tool-call-chunks": "tool-call-delta"}
_EVENT_KEYS: Final = frozenset({"type", "seq", "time", "data", "surfaceOp", "sourceEventSeqs",
                                "ignorable"})
_HEADER_KEYS: Final = ("version", "id", "createdAt", "cwd", "parentSession", "seedLength",
                       "origin", "delegationDepth", "agentPreset")


def looks_like_dsh_header(record: object) -> bool:
    """True for a dsh JSONL header line ``{"type": "session", "version": …, "id": …}``."""
    return (isinstance(record, dict) and record.get("type") == "session"
            and "version" in record and "id" in record)


def _templated(value: object) -> bool:
    return isinstance(value, str) and "{{" in value


def import_dsh_log(path: Path) -> list[ImportedSession]:
    """Import one dsh JSONL log as one session (events kept verbatim, rows expanded).

    Reads the file whole; :func:`dsh.interop.stream_file` streams it instead
    (docs/interop.md#streaming-imports), with the same events and the same refusals.

    Raises:
        ImportFormatError: unreadable/empty/binary file, torn or non-JSON line, a first line
            that is not a version-0 header, an event with keys outside the envelope, or a
            malformed chunk row.
    """
    records = read_jsonl_records(path, FORMAT)
    first_line, header_rec = records[0]
    session_id, header, time = dsh_log_header(path, first_line, header_rec)
    events: list[JsonObj] = []
    lines: list[int | None] = []
    for line, rec in records[1:]:
        members = dsh_log_events(rec, path, line, len(events), time)
        events.extend(members)
        lines.extend([line] * len(members))
        time = next_time(rec, members, time)
    events.append(source_event(path, len(events), time))
    from dsh._verify import verify_events  # lazy: the verifier pulls in compaction

    refusal = refusal_of(path, verify_events(events, header=header),
                         lambda seq: lines[seq] if 0 <= seq < len(lines) else None)
    if refusal is not None:
        raise refusal
    return [ImportedSession(session_id, header, events, [], FORMAT, str(path.resolve()), lines)]


def dsh_log_header(path: Path, first_line: int, header_rec: object
                   ) -> tuple[str, JsonObj, Any]:
    """The imported ``(session id, header, first event time)`` of a dsh log's first record.

    Raises:
        ImportFormatError: not a session header, or not version 0.
    """
    if not looks_like_dsh_header(header_rec):
        raise ImportFormatError(
            "dsh log must start with a session header {\"type\": \"session\", \"version\", "
            "\"id\"}; this first record is none: pass the --format the file is in",
            path=str(path), line=first_line, format=FORMAT)
    assert isinstance(header_rec, dict)
    if header_rec.get("version") != 0:
        raise ImportFormatError(
            f"dsh log header version is {header_rec.get('version')!r}; this reader imports "
            "version 0", path=str(path), line=first_line, format=FORMAT)
    header: JsonObj = {k: header_rec[k] for k in _HEADER_KEYS if k in header_rec}
    own = header.get("id")
    session_id = stable_session_id(path, FORMAT, None if _templated(own) else own)
    header["id"] = session_id
    for key in ("cwd", "parentSession"):
        if _templated(header.get(key)):
            del header[key]
    created = header.get("createdAt")
    time = created if isinstance(created, int) and created >= 0 else 0
    header["createdAt"] = time
    return session_id, header, time


def dsh_log_events(rec: object, path: Path, line: int, next_seq: int, time: Any
                   ) -> list[JsonObj]:
    """The events of one record line after the header: a chunk row's members, or the event.

    ``next_seq``: the seq the line must start at; ``time``: the time of the event before
    (for lines without one, as in snapshot files).

    Raises:
        ImportFormatError: not an event object with a type, keys outside the envelope, a seq
            out of order, or a malformed chunk row.
    """
    if not isinstance(rec, dict) or not isinstance(rec.get("type"), str):
        raise ImportFormatError("dsh log record must be an event object with a type; fix or "
                                "delete that line",
                                path=str(path), line=line, format=FORMAT)
    if rec["type"] in _ROW_TYPES:
        return _expand_row(rec, path, line, next_seq, time)
    extra = set(rec) - _EVENT_KEYS
    if extra:
        raise ImportFormatError(
            f"dsh event has keys outside the envelope: {sorted(extra)}; remove them",
            path=str(path), line=line, format=FORMAT)
    event: JsonObj = {"type": rec["type"], "seq": rec.get("seq", next_seq),
                      "time": rec.get("time", time), "data": rec.get("data")}
    for key in ("sourceEventSeqs", "surfaceOp", "ignorable"):
        if key in rec:
            event[key] = rec[key]
    if event["seq"] != next_seq:
        raise ImportFormatError(
            f"dsh event has seq {event['seq']}; expected {next_seq} (events are numbered "
            "from 0 without gaps): fix the seq, or cut the log before this line",
            path=str(path), line=line, format=FORMAT)
    return [event]


def next_time(rec: JsonObj, members: list[JsonObj], time: Any) -> Any:
    """The time the line after ``rec`` (its events ``members``) inherits.

    A chunk row passes on its last member's time; an event its own, when an integer.
    """
    last = members[-1]["time"] if members else time
    return last if rec["type"] in _ROW_TYPES or isinstance(last, int) else time


def source_event(path: Path, seq: int, time: Any) -> JsonObj:
    """The trailing ``import/source`` event (ignorable, the last event's time)."""
    return {"type": IMPORT_SOURCE_TYPE, "seq": seq, "time": time,
            "data": source_event_data(path, FORMAT), "ignorable": True}


def refusal_of(path: Path, violations: list[Violation],
               line_of: Callable[[int], int | None]) -> ImportFormatError | None:
    """The refusal of a log ``dsh verify`` rejects (None: it keeps every rule).

    An import never yields an invalid log: the error names the line of the first violation's
    event (``line_of(seq)``, None for the header or the trailing ``import/source``) and its rule.
    """
    if not violations:
        return None
    first = violations[0]
    line = line_of(first.seq) if first.seq is not None else None
    at = "" if line is not None else " at its header"
    more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
    return ImportFormatError(
        f"dsh log breaks a log rule{at}: {first.rule}: {first.message}{more}; run dsh "
        "verify on the source for the full list", path=str(path), line=line, format=FORMAT)


def _expand_row(rec: JsonObj, path: Path, line: int, next_seq: int, time: int) -> list[JsonObj]:
    """Expand one packed chunk row into ``assistant/chunk`` events (docs/formats.md#chunk-rows)."""
    data = rec.get("data")
    tag = rec["type"]
    payload_key = "args" if tag == "tool-call-chunks" else "texts"
    payload: Any = data.get(payload_key) if isinstance(data, dict) else None
    dts: Any = data.get("dt") if isinstance(data, dict) else None
    if (not isinstance(data, dict) or not isinstance(payload, list) or not payload
            or not all(isinstance(p, str) for p in payload) or not isinstance(dts, list)
            or len(dts) != len(payload) - 1 or not all(isinstance(d, int) for d in dts)):
        raise ImportFormatError(
            f"malformed {tag} storage row: needs data.{payload_key} (non-empty strings) and "
            "data.dt (one integer gap fewer); fix or delete that line", path=str(path), line=line,
            format=FORMAT)
    seq = rec.get("seq0", next_seq)
    when = rec.get("time0", time)
    if seq != next_seq:
        raise ImportFormatError(
            f"{tag} storage row starts at seq {seq}; expected {next_seq}: fix the seq0, or "
            "cut the log before this line",
            path=str(path), line=line, format=FORMAT)
    out: list[JsonObj] = []
    for k, piece in enumerate(payload):
        if k:
            when += dts[k - 1]
        chunk: JsonObj = {"type": _ROW_TYPES[tag], "index": data.get("index")}
        if tag == "tool-call-chunks":
            chunk["id"] = data.get("id")
            if "name" in data:
                chunk["name"] = data["name"]
            chunk["argumentsDelta"] = piece
        else:
            chunk["text"] = piece
        out.append({"type": "assistant/chunk", "seq": seq + k, "time": when,
                    "data": {"turn": data.get("turn"), "step": data.get("step"),
                             "chunk": chunk}})
    return out

r"""dsh's JSONL format as pure functions over bytes: no disk, so every rule is fuzzable.

Covers docs/formats.md#layout-and-path-encoding (path encoding), docs/formats.md#header-line (header
line), docs/formats.md#record-lines, docs/formats.md#raw-files (record lines, chunk-row packing),
docs/formats.md#zstandard-files (the Zstandard frame walker) and
docs/formats.md#reading-the-committed-region (the committed-region scanner).

Line numbers in this module are physical lines of the logical text, 1-based, the header being
line 1 (so an editor's line number finds the record). Byte offsets are offsets into the logical
text (raw: the file; zstd: the decompressed text).

Framing is ``\\n`` only: a record may legally hold U+2028, U+2029, U+0085, ``\\x0b``, ``\\x0c``,
``\\x1c``-``\\x1e`` or ``\\r`` raw, so ``str.splitlines`` must never be used
(docs/formats.md#lossless-json).
"""

from __future__ import annotations

import bisect
import json as std_json
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from orjson import loads as _orjson_loads

from dsh._errors import (
    EventRejectedError,
    InvalidJsonError,
    LogCorruptError,
)
from dsh.json import FrozenDict, c_scan_lines, dumps, is_safe_int, loads
from dsh.persistence._contract import format_version_refusal, metadata_problem
from dsh.persistence._paths import SAFE_CHARACTERS, code_units, encode_segment
from dsh.session import (
    KNOWN_EVENT_TYPES,
    SESSION_FORMAT_VERSION,
    Event,
    decode_storage_record,
    pack_chunk_runs,
)

__all__ = [
    "HEADER_TAG",
    "RETIRED_HEADER_KEYS",
    "SEAL_MARK",
    "ZSTD_MAGIC",
    "ScanResult",
    "Scanner",
    "encode_header_line",
    "encode_records",
    "encode_segment",
    "format_version_refusal",
    "has_seal_mark",
    "parse_header_lenient",
    "parse_header_strict",
    "project_dir_name",
    "project_key",
    "scan_picked",
    "scan_zstd_frames",
]

HEADER_TAG: Final = "session"
"""``type`` of the header line: a bare tag, never an event type (docs/formats.md#header-line)."""

RETIRED_HEADER_KEYS: Final = ("sandboxMode", "approvalPolicy")
"""Header keys that make a header invalid (docs/formats.md#header-line)."""

ZSTD_MAGIC: Final = 0xFD2FB528
"""Magic number of a standard Zstandard frame (RFC 8878; docs/formats.md#zstandard-files)."""

_PROJECT_KEY_MAX: Final = 251


# --- path encoding (docs/formats.md#layout-and-path-encoding) -------------------------------------

def project_key(cwd: str) -> str:
    r"""Readable, lossy project directory name ``--<slug>--`` for a cwd.

    Rule: docs/formats.md#layout-and-path-encoding.

    Runs of ``/``, ``\\``, ``:`` become one ``-``; safe characters stay; other UTF-16 code units
    become ``~XXXX``; leading ``-`` are stripped; empty → ``root``; at most 251 slug characters.

    Raises:
        LogCorruptError: ``cwd`` is empty.
    """
    if not cwd:
        raise LogCorruptError("cannot encode an empty project path", code="INVALID_CWD")
    out: list[str] = []
    in_separator = False
    for unit in code_units(cwd):
        ch = chr(unit)
        if ch in "/\\:":
            if not in_separator:
                out.append("-")
                in_separator = True
            continue
        in_separator = False
        out.append(ch if unit < 128 and ch in SAFE_CHARACTERS else f"~{unit:04X}")
    slug = "".join(out).lstrip("-") or "root"
    return f"--{slug[:_PROJECT_KEY_MAX]}--"


def project_dir_name(cwd: str | None) -> str:
    """``_no-cwd`` when the header has no cwd, else :func:`project_key`.

    Rule: docs/formats.md#layout-and-path-encoding.
    """
    return "_no-cwd" if cwd is None else project_key(cwd)


def is_project_dir_name(name: str) -> bool:
    """Whether ``name`` can be a project folder of a JSONL root: ``_no-cwd`` or ``--<slug>--``.

    Rule: docs/formats.md#layout-and-path-encoding. Nothing else at a root is the store's
    (besides its ``.dsh-*`` sidecar files).
    """
    return name == "_no-cwd" or (len(name) > 4 and name.startswith("--") and name.endswith("--"))


# --- header line (docs/formats.md#header-line, docs/formats.md#the-session-header) ----------------

SEAL_MARK: Final = b',"dshSeal":1}\n'
"""How a raw header line this library writes ends: ``"dshSeal": 1``, the last key, says the
log's writers keep an integrity seal beside it, so a reader that finds no seal knows the
sidecar was lost rather than never written (docs/formats.md#integrity-seals). Readers, dsh's
included, drop the unknown key (docs/formats.md#header-line). Only this exact ending counts:
inside a string value the quote would be escaped."""


def has_seal_mark(header_line: bytes) -> bool:
    """Whether a raw log's header line (``\\n`` included) carries :data:`SEAL_MARK`."""
    return header_line.endswith(SEAL_MARK)


def encode_header_line(header: Mapping[str, Any]) -> bytes:
    r"""Encode the header line, ``\\n`` included, in dsh's key order (docs/formats.md#header-line).

    ``type: "session"``, ``version``, ``id``, ``createdAt``, ``cwd``?, ``parentSession``?,
    ``seedLength``?, ``origin``?, ``delegationDepth`` (always; 0 when absent), ``agentPreset``?,
    then ours, ``metadata``? (docs/formats.md#header-metadata; dsh drops it on read). Absent
    optional fields are omitted, never ``null``.
    """
    line: dict[str, Any] = {"type": HEADER_TAG, "version": header["version"],
                            "id": header["id"], "createdAt": header["createdAt"]}
    for key in ("cwd", "parentSession", "seedLength", "origin"):
        if header.get(key) is not None:
            line[key] = header[key]
    depth = header.get("delegationDepth")
    line["delegationDepth"] = 0 if depth is None else depth
    if header.get("agentPreset") is not None:
        line["agentPreset"] = header["agentPreset"]
    if header.get("metadata"):
        line["metadata"] = header["metadata"]
    return dumps(line) + b"\n"


def _header_shape_error(obj: Mapping[str, Any]) -> str | None:
    """Return why ``obj`` is not an acceptable header line object, or None.

    Rule: docs/formats.md#header-line.
    """
    for key in RETIRED_HEADER_KEYS:
        if key in obj:
            return f"header carries retired policy baseline fields ({key})"
    if obj.get("type") != HEADER_TAG:
        return "first line is not a session header (type is not \"session\")"
    version = obj.get("version")
    if type(version) not in (int, float):
        return "header version is not a number"
    if type(obj.get("id")) is not str:
        return "header id is not a string"
    for key in ("createdAt", "delegationDepth"):
        value = obj.get(key)
        if not isinstance(value, int) or not is_safe_int(value) or value < 0:
            return f"header {key} must be a non-negative safe integer, got {value!r}"
    if "origin" in obj and obj["origin"] != "subagent":
        return f"header origin must be \"subagent\", got {obj['origin']!r}"
    if "agentPreset" in obj and type(obj["agentPreset"]) is not str:
        return "header agentPreset must be a string"
    for key in ("cwd", "parentSession"):
        if key in obj and type(obj[key]) is not str:
            return f"header {key} must be a string"
    if "seedLength" in obj and (not is_safe_int(obj["seedLength"]) or obj["seedLength"] < 0):
        return "header seedLength must be a non-negative safe integer"
    if "metadata" in obj:
        problem = metadata_problem(obj["metadata"])
        if problem is not None:
            return f"header metadata must be {problem}"
    return None


def _header_from_line(obj: Mapping[str, Any]) -> FrozenDict:
    """Rebuild the known header keys from an accepted header line object."""
    out: dict[str, Any] = {"version": obj["version"], "id": obj["id"],
                           "createdAt": obj["createdAt"]}
    for key in ("cwd", "parentSession", "seedLength", "origin", "delegationDepth",
                "agentPreset"):
        if key in obj:
            out[key] = obj[key]
    if obj.get("metadata"):
        out["metadata"] = FrozenDict(sorted(obj["metadata"].items()))
    return FrozenDict(out)


def parse_header_strict(line: bytes, *, path: str) -> FrozenDict:
    r"""Parse a targeted read's header line; the version refusal comes first.

    Rule: docs/formats.md#the-session-header, docs/formats.md#header-line.

    Args:
        line: The first line including its ``\\n``.
        path: The log path, named in errors.

    Returns:
        FrozenDict: the header with known keys only (``delegationDepth`` always present).

    Raises:
        LogCorruptError: empty or header-less log, not JSON, not an object, wrong shape.
        SessionFormatUnsupportedError: an object whose numeric ``version`` is not 0 (checked
            before any other shape rule, so an alien future header still says "upgrade").
    """
    if not line.endswith(b"\n") or b"\n" in line[:-1] or len(line) <= 1:
        raise LogCorruptError(f"empty or header-less session log: {path} has no complete "
                              f"header line", path=path, line=1, byte_offset=0)
    try:
        obj = loads(line[:-1])
    except InvalidJsonError as exc:
        raise LogCorruptError(f"corrupt session log: header line is not valid JSON ({exc}) "
                              f"in {path}", path=path, line=1, byte_offset=0) from exc
    if not isinstance(obj, dict):
        raise LogCorruptError(f"corrupt session log: first line is not a session header in "
                              f"{path}", path=path, line=1, byte_offset=0)
    version = obj.get("version")
    if type(version) in (int, float) and version != SESSION_FORMAT_VERSION:
        raise format_version_refusal(obj.get("id"), version, path=path)
    problem = _header_shape_error(obj)
    if problem is not None:
        raise LogCorruptError(f"corrupt session log: {problem} in {path}", path=path, line=1,
                              byte_offset=0)
    return _header_from_line(obj)


def parse_header_lenient(line: bytes, *, path: str) -> FrozenDict | None:
    """Parse a header line for listing: ``None`` for no header, no version check.

    Rule: docs/formats.md#header-line.

    Raises:
        LogCorruptError: only for the retired policy fields.
    """
    if not line.endswith(b"\n"):
        return None
    try:
        obj = loads(line[:-1])
    except InvalidJsonError:
        return None
    if not isinstance(obj, dict):
        return None
    problem = _header_shape_error(obj)
    if problem is not None and problem.startswith("header carries retired"):
        raise LogCorruptError(f"corrupt session log: {problem} in {path}", path=path, line=1)
    if problem is not None:
        return None
    return _header_from_line(obj)


# --- record lines (docs/formats.md#record-lines) --------------------------------------------------

def encode_records(events: Sequence[Event], *, pack_chunks: bool) -> bytes:
    r"""Encode one durable batch: one record per line, the batch ending with ``\\n``.

    Rule: docs/formats.md#record-lines.

    With ``pack_chunks`` runs of at least 3 eligible ``assistant/chunk`` deltas become one
    chunk row; rows never span batches. Returns ``b""`` for an empty batch.
    """
    if not events:
        return b""
    records: Sequence[Any] = pack_chunk_runs(events) if pack_chunks else events
    return b"\n".join([dumps(record) for record in records]) + b"\n"


# --- the committed-region scanner (docs/formats.md#reading-the-committed-region) ------------------

@dataclass(slots=True)
class _Issue:
    line: int
    byte_offset: int
    reason: str
    hole: bool = False  # the bad record holds a power-cut hole: the whole suspect tail is torn


def is_power_cut_hole(raw: bytes) -> bool:
    """Whether the bad record ``raw`` holds a NUL byte: what a power cut leaves, never a writer.

    A log line never holds a NUL byte (JSON escapes every control character), while a block of
    an unsynced write that never reached the disk, or a file grown past the data written into
    it, reads back as zeros. Rule: docs/formats.md#reading-the-committed-region.
    """
    return b"\0" in raw


@dataclass(slots=True)
class ScanResult:
    r"""What :class:`Scanner` found.

    Attributes:
        events: The contiguous valid prefix (chunk rows expanded).
        committed: Logical-text offset just after the last accepted line's ``\\n``.
        end: Logical-text offset just after all the bytes fed.
        issue_line: Physical line of the first bad record, or None.
        issue_offset: Its byte offset (or of the trailing fragment), or None.
        reason: Why the tail is not committed, or None when ``committed == end``.
        lines: Physical line number of the last complete line seen.
        prescan: ``(legacy_at, unknown_at)`` over ``events``, as the read pipeline's prescan
            (``dsh._speedups.stored_prescan``) would answer, found while each event was
            decoded; None when some line took the Python path (the pipeline then looks).
    """

    events: list[Event] = field(default_factory=list)
    committed: int = 0
    end: int = 0
    issue_line: int | None = None
    issue_offset: int | None = None
    reason: str | None = None
    lines: int = 1
    prescan: tuple[int, int] | None = None


def _has_turn_end(records: Sequence[Any]) -> bool:
    return any(isinstance(r, dict) and r.get("type") == "turn/end" for r in records)


class Scanner:
    r"""The committed-region scanner: feed logical text after the header, read the prefix.

    Rules (docs/formats.md#reading-the-committed-region, tightened beyond dsh):

    * every complete line (``\\n``-terminated; an empty line counts) is parsed with
      :func:`dsh.json.loads` and expanded with ``decode_storage_record``; each event's ``seq``
      must equal the number of events accepted so far;
    * a line that is JSON but holds a value no JavaScript reader can represent (bare ``NaN``,
      ``Infinity``, ``1e400``, an unsafe integer) is corruption at once, never a torn tail;
    * a record whose seq was already accepted is corruption naming both lines;
    * the first bad record (unparsable, malformed chunk row, not an event, seq gap) starts a
      suspect tail. A seq-gap record holding a ``turn/end`` is corruption at once (dsh). Any
      later complete line that parses and decodes means the bad record lies inside committed
      data: corruption naming its line and byte offset (dsh only refuses when that later
      record holds a ``turn/end`` and otherwise drops complete records; the port refuses
      rather than deleting them), unless the bad record holds a NUL byte (a power-cut hole,
      see :func:`is_power_cut_hole`): then the whole suspect tail is torn;
    * a trailing fragment without ``\\n`` is a torn tail.

    Args:
        path: Named in errors.
        start_offset: Logical offset of the first byte fed (the header length).
        start_line: Physical line number of the header (1) or of the last line already seen.
        start_seq: Events already accepted (0 unless continuing a previous scan).
    """

    def __init__(self, *, path: str, start_offset: int, start_line: int = 1,
                 start_seq: int = 0) -> None:
        self.path = path
        self._result = ScanResult(committed=start_offset, end=start_offset, lines=start_line)
        self._expected = start_seq
        self._issue: _Issue | None = None
        self._tail = b""
        self._tail_offset = start_offset
        # first seq and physical line of every accepted record, for duplicate-seq errors:
        # machine ints (two int objects a line would be 8 MB at 100k lines)
        self._record_seqs = array("q")
        self._record_lines = array("q")
        # what the C pass found for the read pipeline's prescan; void once Python decodes
        self._prescan: list[int] | None = [-1, -1]

    def _corrupt(self, message: str, *, line: int, offset: int, seq: int | None = None,
                 cause: BaseException | None = None) -> LogCorruptError:
        err = LogCorruptError(f"corrupt session log: {message} in {self.path}", path=self.path,
                              line=line, byte_offset=offset, seq=seq)
        err.__cause__ = cause
        return err

    def _line_of_seq(self, seq: int) -> int:
        index = bisect.bisect_right(self._record_seqs, seq) - 1
        return self._record_lines[index] if index >= 0 else 0

    def _decode(self, raw: bytes, line: int, offset: int) -> list[Any] | str:
        """Return the decoded records of one line, or the reason it is unusable."""
        try:
            value = loads(raw)
        except InvalidJsonError as exc:
            try:
                std_json.loads(raw)
            except ValueError:
                return f"unparsable committed event at line {line}"
            except RecursionError:
                # too deep for the standard parser (any depth is valid): dsh's own parser
                # already read the syntax when it names a value, not the text, as the problem
                if exc.message.startswith(("JSON is malformed", "JSON is not valid UTF-8")):
                    return f"unparsable committed event at line {line}"
            # Complete JSON whose values JavaScript cannot represent: written by a bad writer,
            # never by an interrupted one, so it is not a torn tail.
            raise self._corrupt(f"line {line} is JSON a JavaScript reader cannot represent "
                                f"({exc.message})", line=line, offset=offset,
                                cause=exc) from exc
        try:
            records = decode_storage_record(value)
        except EventRejectedError as exc:
            return f"unparsable committed event at line {line} ({exc.message})"
        for record in records:
            if not isinstance(record, Event) or not is_safe_int(record.get("seq")) \
                    or record["seq"] < 0:
                return f"line {line} is not an event record (no non-negative integer seq)"
            if type(record.get("type")) is not str:
                return f"line {line} is not an event record (its type is not a string)"
        return records

    def _line(self, raw: bytes, offset: int) -> None:
        result = self._result
        result.lines += 1
        line = result.lines
        end = offset + len(raw) + 1
        decoded = self._decode(raw, line, offset)
        if self._issue is not None:
            if isinstance(decoded, str) or self._issue.hole:
                return
            issue = self._issue
            raise self._corrupt(
                f"{issue.reason} at byte {issue.byte_offset}, but the complete record at "
                f"line {line} follows it, so the damage is inside committed data",
                line=issue.line, offset=issue.byte_offset)
        if isinstance(decoded, str):
            hole = is_power_cut_hole(raw)
            if hole:
                decoded += " (NUL bytes: blocks of an unsynced write lost in a power cut)"
            self._issue = _Issue(line, offset, decoded, hole)
            return
        first = decoded[0]["seq"]
        if first < self._expected:
            raise self._corrupt(
                f"seq {first} appears on line {self._line_of_seq(first)} and again on line "
                f"{line}", line=line, offset=offset, seq=first)
        for k, record in enumerate(decoded):
            if record["seq"] != self._expected + k:
                reason = (f"seq gap in committed region at line {line} (expected "
                          f"{self._expected + k}, got {record['seq']})")
                if _has_turn_end(decoded):
                    raise self._corrupt(reason, line=line, offset=offset,
                                        seq=self._expected + k)
                self._issue = _Issue(line, offset, reason)
                return
        self._record_seqs.append(first)
        self._record_lines.append(line)
        self._prescan = None
        result.events.extend(decoded)
        self._expected += len(decoded)
        result.committed = end

    @property
    def accepted(self) -> int:
        """Events accepted so far (the seq the next record must start at)."""
        return len(self._result.events)

    def feed(self, data: bytes, start: int = 0) -> None:
        """Scan ``data[start:]`` (the next bytes of logical text); complete lines are processed now.

        ``start`` skips a prefix without copying the rest (a whole log file after its header
        line is tens of MB).

        Raises:
            LogCorruptError: corruption inside the committed region (see the class rules).
        """
        if start >= len(data):
            return
        if self._tail:
            buf, pos = self._tail + data[start:], 0
        else:
            buf, pos = data, start
        base = self._tail_offset - pos
        find = buf.find
        result = self._result
        while True:
            if c_scan_lines is not None and self._issue is None:
                # The C accelerator takes every ordinary line; it stops before any line this
                # loop must judge (and before a trailing fragment), so the rules stay here.
                began = pos
                pos, result.lines, self._expected = c_scan_lines(
                    buf, pos, self._expected, result.lines, _orjson_loads, Event,
                    result.events, self._record_seqs, self._record_lines, KNOWN_EVENT_TYPES,
                    self._prescan)
                if pos != began:
                    result.committed = base + pos
            nl = find(b"\n", pos)
            if nl < 0:
                break
            self._line(buf[pos:nl], base + pos)
            pos = nl + 1
        self._tail = buf[pos:]
        self._tail_offset = base + pos
        self._result.end = base + len(buf)

    def finish(self) -> ScanResult:
        """Close the scan and return the prefix; a leftover fragment is a torn tail."""
        result = self._result
        result.prescan = (self._prescan[0], self._prescan[1]) if self._prescan is not None \
            else None
        if self._issue is not None:
            result.issue_line = self._issue.line
            result.issue_offset = self._issue.byte_offset
            result.reason = self._issue.reason
        elif self._tail:
            result.issue_offset = self._tail_offset
            result.reason = (f"unterminated final record ({len(self._tail)} bytes without a "
                             f"newline) at byte {self._tail_offset}")
        return result


def scan_picked(text: bytes, seq: int, count: int, picked: Sequence[int]) -> list[Event] | None:
    r"""Decode only the lines of ``picked`` seqs from checked text of one event a line.

    ``text`` is complete record lines (each ending ``\n``) holding the ``count`` events from
    seq ``seq`` on, whose bytes were checked against the log's integrity (seal records or
    Zstandard frame checksums: docs/rules.md#verified-page-in). When it splits into exactly
    ``count`` lines, line ``k`` holds seq ``seq + k`` alone (a record holds at least one event),
    so the lines of ``picked`` (ascending, each in ``seq .. seq + count - 1``) are decoded in
    one pass by the accelerator's committed-region rules, and every decoded event must carry
    the seq of its line; the other lines are not parsed.

    Returns:
        The picked events in order, or None when the text does not map one line to one seq
        (a packed chunk row), the accelerator is absent, or a picked line is one the
        :class:`Scanner` must judge: the caller then scans the whole text.
    """
    if c_scan_lines is None or not text.endswith(b"\n") or not picked \
            or picked[0] < seq or picked[-1] >= seq + count:
        return None
    lines = text.split(b"\n")
    if len(lines) - 1 != count:
        return None
    # one accelerator pass over the picked lines (expected -1: each at its own seq), so the
    # pass's shared short strings are shared by the whole window, as in a page's scan
    buffer = b"\n".join([lines[at - seq] for at in picked]) + b"\n"
    out: list[Event] = []
    pos, _, _ = c_scan_lines(buffer, 0, -1, 0, _orjson_loads, Event, out, array("q"),
                             array("q"), KNOWN_EVENT_TYPES, None)
    if pos != len(buffer) or len(out) != len(picked) \
            or [event["seq"] for event in out] != list(picked):
        return None
    return out


# --- Zstandard frame walker (docs/formats.md#zstandard-files) -------------------------------------

def scan_zstd_frames(data: bytes, *, path: str, max_frames: int | None = None
                     ) -> tuple[list[tuple[int, int]], int | None]:
    """Walk concatenated Zstandard frames structurally, before any decompression.

    Rule: docs/formats.md#zstandard-files.

    Args:
        data: The file bytes.
        path: Named in errors.
        max_frames: Stop after this many complete frames (listing uses 1).

    Returns:
        tuple: ``(frames, torn_start)``: ``[start, end)`` of every complete frame, and the start
        of an incomplete final frame or ``None``.

    Raises:
        LogCorruptError: a bad magic number (this also rejects skippable frames), a reserved
            frame-header bit, or a reserved block type; ``byte_offset`` names the spot.

    A run of NUL bytes where a frame should start is reported as ``torn_start`` (a crash that
    extended the file without writing). ``torn_start`` is only a structural guess: a damaged
    size field of a middle frame also looks incomplete, so the caller must check that no
    complete frame follows (see ``dsh.persistence.jsonl._backend.parse_log``).
    """
    frames: list[tuple[int, int]] = []
    size = len(data)
    pos = 0
    while pos < size:
        if max_frames is not None and len(frames) >= max_frames:
            break
        start = pos
        if size - pos < 4:
            return frames, start
        magic = int.from_bytes(data[pos:pos + 4], "little")
        if magic != ZSTD_MAGIC:
            if not data[pos:].strip(b"\0"):
                # A crash that extended the file but wrote no data leaves zeros: a torn tail.
                return frames, start
            raise LogCorruptError(f"corrupt session log: invalid frame magic at byte {pos} in "
                                  f"{path}", path=path, byte_offset=pos)
        pos += 4
        if pos >= size:
            return frames, start
        descriptor = data[pos]
        pos += 1
        if descriptor & 0x18:
            raise LogCorruptError(f"corrupt session log: reserved frame-header bit set at byte "
                                  f"{pos - 1} in {path}", path=path, byte_offset=pos - 1)
        fcs_flag = descriptor >> 6
        single_segment = bool(descriptor & 0x20)
        has_checksum = bool(descriptor & 0x04)
        dict_bytes = (0, 1, 2, 4)[descriptor & 0x03]
        fcs_bytes = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
        pos += (0 if single_segment else 1) + dict_bytes + fcs_bytes
        if pos > size:
            return frames, start
        while True:
            if pos + 3 > size:
                return frames, start
            block = int.from_bytes(data[pos:pos + 3], "little")
            last = block & 1
            block_type = (block >> 1) & 3
            block_size = block >> 3
            if block_type == 3:
                raise LogCorruptError(f"corrupt session log: reserved block type at byte {pos} "
                                      f"in {path}", path=path, byte_offset=pos)
            pos += 3 + (1 if block_type == 1 else block_size)
            if pos > size:
                return frames, start
            if last:
                break
        if has_checksum:
            pos += 4
            if pos > size:
                return frames, start
        frames.append((start, pos))
    return frames, None

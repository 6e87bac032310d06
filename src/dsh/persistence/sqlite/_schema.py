"""dsh's SQLite physical format, without I/O: DDL, schema checks, row codec, committed scan.

Invariants this module owns (docs/formats.md#schema-17, docs/formats.md#appends-and-reads):

* the schema objects of a file are exactly dsh's (schema 17 for new files, schema 14 as the
  published dsh 0.0.1-rc.1 writes it); we never add tables, indexes, triggers or views;
* a physical row decodes to one event (scalar row) or to 3…1024 ``assistant/chunk`` events
  (packed row, schema 17 only); packed ``data`` stays ≤ 1 MiB uncompressed;
* ``data`` of 4096 bytes or more is stored as one Zstandard frame (level 3) only when smaller;
* a row that fails to decode after the last intact ``turn/end`` row is a removable torn tail;
  before it, the log is corrupt (the committed-region rule, docs/formats.md#appends-and-reads).

Functions here take plain values (rows as tuples) so they can be fuzzed without a database.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import posixpath
import re
import sqlite3
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Final

from orjson import dumps as _orjson_dumps
from orjson import loads as _orjson_loads

from dsh._errors import DshError, EventRejectedError, LogCorruptError
from dsh.json import (
    MAX_SAFE_INTEGER,
    CFallback,
    FrozenDict,
    FrozenList,
    c_decode_rows,
    c_encode_rows,
    c_encode_sealed_rows,
    dumps,
    is_safe_int,
    loads,
)
from dsh.session import ENVELOPE_KEYS, KNOWN_EVENT_TYPES, Event, as_event

if TYPE_CHECKING:
    import zstandard

__all__ = [
    "APPLICATION_ID",
    "LEGACY_SCHEMA_VERSION",
    "MAX_PACKED_DATA_BYTES",
    "MAX_PACKED_ROW_MEMBERS",
    "MIN_PACKED_ROW_MEMBERS",
    "READABLE_SCHEMA_VERSIONS",
    "ROW_COLUMNS",
    "SCHEMA_14_DDL",
    "SCHEMA_17_DDL",
    "SCHEMA_VERSION",
    "SEALED_INCARNATION_TAG",
    "SESSION_ROW_CHECK_SQL",
    "SESSION_ROW_RULES",
    "ZSTD_DATA_THRESHOLD_BYTES",
    "Row",
    "RowError",
    "decode_picked",
    "ScanResult",
    "canonical_schema_objects",
    "has_canonical_schema",
    "is_canonical_schema",
    "cwd_unchecked",
    "decode_row",
    "decode_source_event_seqs",
    "decode_session_row",
    "encode_batch",
    "encode_sealed_batch",
    "encode_source_event_seqs",
    "is_sealed_incarnation",
    "is_uuid",
    "normalize_sql",
    "scan_rows",
    "schema_objects",
    "sealed_incarnation",
    "session_header",
]

SCHEMA_VERSION: Final = 17
"""``PRAGMA user_version`` of files we create (dsh repository head).

Rule: docs/formats.md#files-and-connections.
"""

LEGACY_SCHEMA_VERSION: Final = 14
"""``PRAGMA user_version`` written by the published ``dsh-session-persistence-sqlite`` 0.0.1-rc.1:
one scalar row per event, JSON text columns, no ``ignorable`` column."""

READABLE_SCHEMA_VERSIONS: Final = frozenset({LEGACY_SCHEMA_VERSION, SCHEMA_VERSION})

APPLICATION_ID: Final = 0x44534850
"""``PRAGMA application_id``: ASCII ``DSHP`` = 1146308688.

Rule: docs/formats.md#files-and-connections.
"""

ZSTD_DATA_THRESHOLD_BYTES: Final = 4096
ZSTD_LEVEL: Final = 3
MIN_PACKED_ROW_MEMBERS: Final = 3
MAX_PACKED_ROW_MEMBERS: Final = 1024
MAX_PACKED_DATA_BYTES: Final = 1_048_576

ROW_COLUMNS: Final = "rowid, seq, type, time, data, source_event_seqs, surface_op, ignorable"
"""The ``events`` columns a schema-17 row is read with, in :data:`Row` order."""

# The statement texts must equal dsh's schema.sql up to whitespace (docs/formats.md#schema-17): dsh
# compares whitespace-normalised sqlite_schema text and refuses any other object.
SCHEMA_17_DDL: Final[tuple[str, ...]] = (
    """CREATE TABLE persistence_state (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  store_id  TEXT NOT NULL
) STRICT""",
    """CREATE TABLE sessions (
  id               TEXT PRIMARY KEY,
  version          INTEGER NOT NULL,
  created_at       INTEGER NOT NULL,
  cwd              TEXT,
  parent_session   TEXT,
  seed_length      INTEGER,
  origin           TEXT,
  delegation_depth INTEGER,
  agent_preset     TEXT,
  incarnation      TEXT NOT NULL,
  revision         INTEGER NOT NULL
) STRICT""",
    """CREATE TABLE events (
  session_id        TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  seq               INTEGER NOT NULL,
  type              TEXT NOT NULL,
  time              INTEGER NOT NULL,
  data              ANY NOT NULL,
  source_event_seqs ANY,
  surface_op        TEXT,
  ignorable         INTEGER CHECK (ignorable IS NULL OR ignorable IN (0, 1)),
  PRIMARY KEY (session_id, seq)
) STRICT""",
)
"""dsh's schema 17 (``resources/sql/schema.sql``), one statement per item."""

SCHEMA_14_DDL: Final[tuple[str, ...]] = (
    """CREATE TABLE persistence_state (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  store_id  TEXT NOT NULL
) STRICT""",
    """CREATE TABLE sessions (
  id               TEXT PRIMARY KEY,
  version          INTEGER NOT NULL,
  created_at       INTEGER NOT NULL,
  cwd              TEXT,
  parent_session   TEXT,
  seed_length      INTEGER,
  origin           TEXT,
  delegation_depth INTEGER,
  agent_preset    TEXT,
  incarnation      TEXT NOT NULL,
  revision         INTEGER NOT NULL
) STRICT""",
    """CREATE TABLE events (
  session_id        TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  seq               INTEGER NOT NULL,
  type              TEXT NOT NULL,
  time              INTEGER NOT NULL,
  data              TEXT NOT NULL,
  source_event_seqs TEXT,
  surface_op        TEXT,
  PRIMARY KEY (session_id, seq)
) STRICT""",
)
"""The schema the published dsh SQLite backend (0.0.1-rc.1) writes, as found in
``shared/dsh-logs/sqlite/*.sqlite``; read and appended to, never created."""

_WS: Final = re.compile(r"\s+")
_UUID: Final = re.compile(
    r"^[0-9a-f]{8}-[0-9a-f]{4}-[1-8][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$", re.IGNORECASE)

SchemaObject = tuple[str, str, str, str]
"""``(type, name, tbl_name, normalised sql)`` of one ``sqlite_schema`` row."""


def normalize_sql(sql: str | None) -> str:
    """Collapse whitespace runs to one space and trim (dsh's comparison form).

    Rule: docs/formats.md#schema-17.
    """
    return _WS.sub(" ", sql or "").strip()


def is_uuid(value: object) -> bool:
    """True for an 8-4-4-4-12 hex UUID, version 1 to 8, variant 8/9/a/b.

    Rule: docs/formats.md#files-and-connections.
    """
    return isinstance(value, str) and _UUID.match(value) is not None


SEALED_INCARNATION_TAG: Final = "8d5e"
"""The third group of the incarnation UUID of a session this library creates: version 8 (RFC
9562's custom UUID) with the tag ``d5e``. It says the session's writers keep an integrity seal,
so a reader that finds none knows the sidecar was lost, not never written
(docs/formats.md#integrity-seals). dsh mints version-4 UUIDs, which never match; the column
stays a UUID that dsh's check admits (versions 1-8, docs/formats.md#files-and-connections)."""


def sealed_incarnation() -> str:
    """A fresh random incarnation UUID marked as sealed (:data:`SEALED_INCARNATION_TAG`).

    110 random bits, the RFC 9562 variant, version 8. Rule: docs/formats.md#integrity-seals.
    """
    digits = uuid.uuid4().hex  # digits[16] is the variant nibble (8, 9, a or b): kept
    return (f"{digits[:8]}-{digits[8:12]}-{SEALED_INCARNATION_TAG}-{digits[16:20]}-"
            f"{digits[20:]}")


def is_sealed_incarnation(incarnation: str) -> bool:
    """Whether an incarnation says its session is sealed (:func:`sealed_incarnation`)."""
    return is_uuid(incarnation) and incarnation[14:18].lower() == SEALED_INCARNATION_TAG


_SCHEMA_ROWS: Final = ("SELECT type, name, tbl_name, sql FROM sqlite_schema "
                       "WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY type, name")


def schema_objects(conn: sqlite3.Connection) -> tuple[SchemaObject, ...]:
    """Return the user schema objects of ``conn`` (names not starting ``sqlite_``), sorted.

    Rule: docs/formats.md#schema-17 (ordered by type then name, sql whitespace-normalised).
    """
    return _normalized(conn.execute(_SCHEMA_ROWS).fetchall())


def _normalized(rows: list[Any]) -> tuple[SchemaObject, ...]:
    return tuple((str(t), str(n), str(tb), normalize_sql(s)) for t, n, tb, s in rows)


@cache
def canonical_schema_objects(version: int) -> tuple[SchemaObject, ...]:
    """Return what :func:`schema_objects` yields for a pristine file of schema ``version``.

    Built by running the DDL in a fresh in-memory database with foreign keys on, as dsh does.

    Raises:
        KeyError: ``version`` is neither 14 nor 17.
    """
    ddl = {SCHEMA_VERSION: SCHEMA_17_DDL, LEGACY_SCHEMA_VERSION: SCHEMA_14_DDL}[version]
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        for statement in ddl:
            conn.execute(statement)
        return schema_objects(conn)
    finally:
        conn.close()


CANONICAL_SCHEMA_DIGESTS: Final = {
    SCHEMA_VERSION: "50dd734b39ea4509093dfd660d85d2aeb72477da550691b19b47bc709d4a5b59",
    LEGACY_SCHEMA_VERSION: "fb38e156f286863b86546986bb9666967614d43d7bdedfc8eee8cdcf8f97a73b",
}
"""SHA-256 of ``repr(canonical_schema_objects(version))`` as the SQLite this ships with builds
it (a test checks they still agree): :func:`is_canonical_schema` compares a file's objects with
it first, so opening a store does not run the DDL in a scratch database (0.5 ms, once per
process) unless the objects differ from it."""


STORED_SCHEMA_DIGESTS: Final = {
    SCHEMA_VERSION: "ad416b5852c58324fb69d3e792b6759c988f949ede8470d306a4e3b0d3e0f608",
    LEGACY_SCHEMA_VERSION: "d3d5cd33758ff89f6c30a673818c81bc8bd316dd1fa2b52397fcb26d201ff8ef",
}
"""SHA-256 of ``repr`` of the ``sqlite_schema`` rows (type, name, tbl_name, sql as stored,
not normalised) of a file this library created with schema ``version`` (a test checks they
still agree): :func:`has_canonical_schema` takes rows with this digest as dsh's without
normalising their SQL text (a tenth of a millisecond of every store open)."""


def has_canonical_schema(conn: sqlite3.Connection, version: int) -> bool:
    """Whether the schema objects of ``conn`` are exactly dsh's schema ``version``.

    The rows as stored are compared first (:data:`STORED_SCHEMA_DIGESTS`: the text this
    library's DDL leaves); any others are normalised and compared as
    :func:`is_canonical_schema` compares them, so a file another writer of dsh's schema made
    (other whitespace) is judged exactly as before.

    Rule: docs/formats.md#schema-17.
    """
    rows = conn.execute(_SCHEMA_ROWS).fetchall()
    if hashlib.sha256(repr(rows).encode()).hexdigest() == STORED_SCHEMA_DIGESTS.get(version):
        return True
    return is_canonical_schema(_normalized(rows), version)


def is_canonical_schema(found: tuple[SchemaObject, ...], version: int) -> bool:
    """Whether ``found`` (from :func:`schema_objects`) is exactly dsh's schema ``version``.

    Objects whose digest is :data:`CANONICAL_SCHEMA_DIGESTS`' are the ones dsh's DDL creates;
    any others are compared with :func:`canonical_schema_objects`, built by the SQLite that
    runs (so a SQLite that stores the DDL differently still opens its own files).

    Rule: docs/formats.md#schema-17.
    """
    pinned = CANONICAL_SCHEMA_DIGESTS.get(version)
    if pinned is not None and hashlib.sha256(repr(found).encode()).hexdigest() == pinned:
        return True
    return found == canonical_schema_objects(version)


# --- row primitives -------------------------------------------------------------------------

Row = tuple[int, Any, Any, Any, Any, Any, Any, Any]
"""``(rowid, seq, type, time, data, source_event_seqs, surface_op, ignorable)`` as selected;
schema 14 selects ``NULL`` for ``ignorable``."""


class RowError(Exception):
    """A physical row that does not decode; the scan turns it into torn or corrupt.

    Rule: docs/formats.md#appends-and-reads.
    """


def encode_source_event_seqs(seqs: Sequence[int]) -> bytes:
    """Encode provenance seqs as dsh's varint BLOB (docs/formats.md#schema-17).

    The first value is an unsigned LEB128 varint; each later value ``v`` after ``p`` is the
    ZigZag of ``v - p``: ``(v - p) * 2`` when ``v >= p``, else ``(p - v) * 2 - 1``. ``[]`` is an
    empty BLOB.

    Raises:
        EventRejectedError: a value is not a non-negative safe integer (code ENVELOPE).
    """
    out = bytearray()
    prev = 0
    for i, value in enumerate(seqs):
        if not is_safe_int(value) or value < 0:
            raise EventRejectedError(
                f"sourceEventSeqs values must be non-negative safe integers, got {value!r} at "
                f"index {i}", code="ENVELOPE", json_path=f"$.sourceEventSeqs[{i}]")
        if i == 0:
            n = value
        elif value >= prev:
            n = (value - prev) * 2
        else:
            n = (prev - value) * 2 - 1
        prev = value
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
    return bytes(out)


def decode_source_event_seqs(blob: bytes) -> FrozenList:
    """Decode a varint provenance BLOB (docs/formats.md#schema-17).

    Raises:
        RowError: truncated or non-canonical varint (a final ``0x00`` after a continuation),
            a shift beyond 56 bits, a value out of range, or a decoded seq outside
            ``[0, 2^53 - 1]``.
    """
    values: list[int] = []
    pos = 0
    size = len(blob)
    prev = 0
    while pos < size:
        n = 0
        shift = 0
        while True:
            if pos >= size:
                raise RowError("truncated varint in source_event_seqs")
            byte = blob[pos]
            pos += 1
            if shift > 56:
                raise RowError("varint in source_event_seqs is longer than 57 bits")
            n |= (byte & 0x7F) << shift
            if byte & 0x80 == 0:
                if byte == 0 and shift > 0:
                    raise RowError("non-canonical varint in source_event_seqs")
                break
            shift += 7
        if not values:
            if n > MAX_SAFE_INTEGER:
                raise RowError(f"source_event_seqs first value {n} exceeds 2^53 - 1")
            value = n
        else:
            if n > 2 * MAX_SAFE_INTEGER:
                raise RowError(f"source_event_seqs delta {n} is out of range")
            value = prev + n // 2 if n % 2 == 0 else prev - (n + 1) // 2
        if value < 0 or value > MAX_SAFE_INTEGER:
            raise RowError(f"source_event_seqs value {value} is outside [0, 2^53 - 1]")
        values.append(value)
        prev = value
    return FrozenList(values)


@cache
def _zstd() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    """The row codec (compressor, decompressor), made at first use.

    Most opens never meet a row of 4096 bytes or more, and ``zstandard`` is a third of a
    megabyte of a reader's memory.
    """
    import zstandard

    return (zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=False),
            zstandard.ZstdDecompressor())


def _encode_data(text: bytes) -> str | bytes:
    """TEXT below 4096 bytes; else a zstd frame if strictly smaller (docs/formats.md#schema-17)."""
    if len(text) >= ZSTD_DATA_THRESHOLD_BYTES:
        frame = _zstd()[0].compress(text)
        if len(frame) < len(text):
            return frame
    return text.decode("utf-8")


def _decompress(blob: bytes, limit: int | None) -> bytes:
    """Decode exactly one zstd frame; with ``limit``, refuse output beyond ``limit`` bytes.

    The frame's content-size field is not trusted for allocation (docs/formats.md#schema-17).
    """
    import zstandard

    decompressor = _zstd()[1]
    try:
        declared = zstandard.frame_content_size(blob)
        if limit is not None:
            if declared > limit:
                raise RowError(f"compressed data declares {declared} bytes, over the {limit} "
                               f"byte packed-row limit")
            if declared < 0:
                # Unknown size: the bounded one-shot decoder fails rather than grow past limit.
                try:
                    decompressor.decompress(blob, max_output_size=limit)
                except zstandard.ZstdError as exc:
                    raise RowError(f"compressed data does not decode within the {limit} byte "
                                   f"packed-row limit: {exc}") from exc
        obj = decompressor.decompressobj()
        out = obj.decompress(blob)
    except zstandard.ZstdError as exc:
        raise RowError(f"data is not a valid Zstandard frame: {exc}") from exc
    if not obj.eof or obj.unused_data:
        raise RowError("data is not exactly one complete Zstandard frame")
    if limit is not None and len(out) > limit:
        raise RowError(f"decompressed data exceeds the {limit} byte packed-row limit")
    return out


def _data_text(data: object, *, limit: int | None, allow_blob: bool) -> str | bytes:
    if isinstance(data, str):
        if limit is not None and len(data) > limit // 4 and len(data.encode("utf-8")) > limit:
            raise RowError(f"packed data exceeds the {limit} byte limit before JSON decoding")
        return data
    if isinstance(data, bytes) and allow_blob:
        return _decompress(data, limit)
    raise RowError(f"data must be {'TEXT or BLOB' if allow_blob else 'TEXT'}, "
                   f"got {type(data).__name__}")


def _parse(text: str | bytes, what: str) -> Any:
    try:
        return loads(text)
    except DshError as exc:
        raise RowError(f"{what} is not lossless JSON: {exc.message}") from exc
    except UnicodeDecodeError as exc:
        raise RowError(f"{what} is not valid UTF-8: {exc}") from exc


def decode_row(row: Row, schema_version: int) -> list[Event]:
    """Decode one physical row into its logical events (docs/formats.md#schema-17).

    Args:
        row: ``(rowid, seq, type, time, data, source_event_seqs, surface_op, ignorable)``.
        schema_version: 17 (varint/zstd/packed vocabulary) or 14 (JSON text columns only).

    Returns:
        One event for a scalar row; the members of a packed row (``ignorable = 0``).

    Raises:
        RowError: a wrong column type or value, undecodable data, a malformed packed row.
    """
    _rowid, seq, type_, time, data, ses, sop, ign = row
    if (ign is None and ses is None and type(data) is str and type(seq) is int
            and 0 <= seq <= MAX_SAFE_INTEGER and type(time) is int
            and -MAX_SAFE_INTEGER <= time <= MAX_SAFE_INTEGER and type(type_) is str and type_
            and (sop is None or type(sop) is str)):
        # Fast path for the common row: plain scalar event, JSON text data, no provenance.
        try:
            payload = loads(data)
        except DshError as exc:
            raise RowError(f"data is not lossless JSON: {exc.message}") from exc
        if sop is None:
            return [as_event({"type": type_, "seq": seq, "time": time, "data": payload})]
        op = "append" if sop == '"append"' else _parse(sop, "surface_op")
        return [as_event({"type": type_, "seq": seq, "time": time, "data": payload,
                       "surfaceOp": op})]
    if not is_safe_int(seq) or seq < 0:
        raise RowError(f"seq must be a non-negative safe integer, got {seq!r}")
    if not isinstance(type_, str) or not type_:
        raise RowError(f"type must be non-empty text, got {type_!r}")
    if not is_safe_int(time):
        raise RowError(f"time must be a safe integer, got {time!r}")
    if sop is not None and not isinstance(sop, str):
        raise RowError(f"surface_op must be TEXT or NULL, got {type(sop).__name__}")
    legacy = schema_version == LEGACY_SCHEMA_VERSION
    if ign is not None and (ign not in (0, 1) or type(ign) is not int):
        raise RowError(f"ignorable must be NULL, 0 or 1, got {ign!r}")
    if ign == 0:
        # (the chunk codec loads with the first packed row the pure-Python reader decodes: the
        # accelerator decodes them itself, so an adapter's process never imports it)
        from dsh.session import CHUNK_ROW_TAGS, decode_storage_record
        if type_ not in CHUNK_ROW_TAGS:
            raise RowError(f"packed discriminator requires a chunk tag, got type {type_!r}")
        if ses is not None or sop is not None:
            raise RowError("packed surface fields must be null")
        payload = _parse(_data_text(data, limit=MAX_PACKED_DATA_BYTES, allow_blob=True), "data")
        try:
            members = decode_storage_record(
                FrozenDict({"type": type_, "seq0": seq, "time0": time, "data": payload}))
        except DshError as exc:
            raise RowError(exc.message) from exc
        if not MIN_PACKED_ROW_MEMBERS <= len(members) <= MAX_PACKED_ROW_MEMBERS:
            raise RowError(f"packed row holds {len(members)} members, expected "
                           f"{MIN_PACKED_ROW_MEMBERS} to {MAX_PACKED_ROW_MEMBERS}")
        return members  # tagged rows decode to Events only
    fields: dict[str, Any] = {
        "type": type_, "seq": seq, "time": time,
        "data": _parse(_data_text(data, limit=None, allow_blob=not legacy), "data"),
    }
    if ses is not None:
        if legacy:
            if not isinstance(ses, str):
                raise RowError(f"source_event_seqs must be TEXT or NULL, got {type(ses).__name__}")
            seqs = _parse(ses, "source_event_seqs")
            if not isinstance(seqs, list) or not all(
                    is_safe_int(v) and v >= 0 for v in seqs):
                raise RowError("source_event_seqs must be a JSON array of non-negative integers")
        else:
            if not isinstance(ses, bytes):
                raise RowError(f"source_event_seqs must be a BLOB or NULL, got "
                               f"{type(ses).__name__}")
            seqs = decode_source_event_seqs(ses)
        fields["sourceEventSeqs"] = seqs
    if sop is not None:
        fields["surfaceOp"] = "append" if sop == '"append"' else _parse(sop, "surface_op")
    if ign == 1:
        fields["ignorable"] = True
    return [as_event(fields)]


@dataclass(frozen=True, slots=True)
class ScanResult:
    """The outcome of :func:`scan_rows`.

    Attributes:
        events: The valid committed logical events, contiguous from the scan base.
        torn_seq: Physical ``seq`` of the first removable row, or ``None`` (no torn tail).
        torn_rowid: ``rowid`` of that row, or ``None``.
        torn_reason: Why that row is torn (one sentence), or ``None``.
        prescan: ``(legacy_at, unknown_at)`` over ``events``, as the read pipeline's prescan
            (``dsh._speedups.stored_prescan``) would answer, noted by the C decoder while each
            event was hot; ``None`` when a row was decoded in Python or without the
            accelerator (docs/architecture.md).
    """

    events: list[Event]
    torn_seq: int | None
    torn_rowid: int | None
    torn_reason: str | None
    prescan: tuple[int, int] | None = None


def scan_rows(rows: Sequence[Row], base: int, schema_version: int, *, path: str,
              session_id: str) -> ScanResult:
    """Decode physical rows with dsh's committed-region rule (docs/formats.md#appends-and-reads).

    Args:
        rows: Rows of one session ordered by ``seq``, starting at physical seq ``base``.
        base: The logical seq the first row must start at (0 for a full read).
        schema_version: 14 or 17.
        path: Database path, named in errors.
        session_id: Named in errors.

    Returns:
        ScanResult: the preserved events, and the removable row when the *final* row fails to
        decode or breaks contiguity (and lies after the last intact ``turn/end``).

    Raises:
        LogCorruptError: such a row lies at or before the last intact ``turn/end`` row, or any
            row follows it — stricter than dsh, which drops the later rows (``where``: path,
            seq, session_id).
    """
    decoded: dict[int, list[Event] | RowError] = {}

    def decode(i: int) -> list[Event] | RowError:
        if i not in decoded:
            try:
                decoded[i] = decode_row(rows[i], schema_version)
            except RowError as exc:
                decoded[i] = exc
        return decoded[i]

    def last_turn_end() -> int:
        """Index of the last row that decodes as an intact turn/end (-1: none).

        Asked only when a row does not continue the log: an intact log never needs it,
        so a read decodes no row twice.
        """
        for i in range(len(rows) - 1, -1, -1):
            # Only scalar rows can hold a turn/end; skip packed rows without decoding them.
            if rows[i][2] != "turn/end" or rows[i][7] == 0:
                continue
            if not isinstance(decode(i), RowError):
                return i
        return -1

    events: list[Event] = []
    expected = base
    i = 0
    count = len(rows)
    fast_rows = rows if type(rows) is list else list(rows)
    # what the C pass notes for the read pipeline's prescan; void once Python decodes a row
    prescan: list[int] | None = [-1, -1] if c_decode_rows is not None else None
    while i < count:
        if c_decode_rows is not None:
            # The C accelerator takes every ordinary row and stops before any row this loop
            # must judge, so the rules (and every message) stay here.
            i, expected = c_decode_rows(
                fast_rows, i, expected, _orjson_loads, Event, events,
                schema_version != LEGACY_SCHEMA_VERSION, MAX_PACKED_DATA_BYTES,
                MIN_PACKED_ROW_MEMBERS, MAX_PACKED_ROW_MEMBERS, KNOWN_EVENT_TYPES, prescan)
            if i >= count:
                break
        index = i
        i += 1
        row = rows[index]
        result = decode(index)
        if isinstance(result, RowError):
            reason = str(result)
        elif result[0]["seq"] != expected:
            reason = (f"row starts at seq {result[0]['seq']}, expected {expected} "
                      f"(a gap or an overlapping row)")
        else:
            events.extend(result)
            expected += len(result)
            prescan = None
            continue
        last_end = last_turn_end()
        if index <= last_end or index < len(rows) - 1:
            # dsh tolerates any bad row after the last turn/end; a later row means the damage
            # is inside committed data, so (as for JSONL) refuse rather than hide those rows.
            where = ("it precedes the last intact turn/end" if index <= last_end
                     else f"{len(rows) - 1 - index} later row(s) follow it")
            raise LogCorruptError(
                f"corrupt session log {session_id!r} in {path}: invalid committed physical row "
                f"at seq {row[1]} ({reason}); {where}, so it is not a torn tail", path=path,
                seq=row[1] if is_safe_int(row[1]) else None, session_id=session_id)
        return ScanResult(events, row[1] if is_safe_int(row[1]) else None, row[0],
                          f"physical row at seq {row[1]} does not continue the log: {reason}",
                          _noted(prescan))
    return ScanResult(events, None, None, None, _noted(prescan))


def decode_picked(rows: list[Row], picked: Sequence[int], schema_version: int) -> list[Event]:
    """Decode only the events of ``picked`` seqs from every row of a checked range.

    ``rows`` are all the rows of one seq range in seq order (each row's events run up to the
    next row's seq), checked against the seal records over them (docs/rules.md#verified-page-in);
    ``picked`` is ascending. A scalar row is decoded when its seq is picked, a packed row when
    one of its members is (its other members dropped), by the accelerator's rules in one pass
    where it is built, every row it leaves as :func:`decode_row` decodes it.
    The rows not picked are not decoded.

    Returns:
        The picked events in seq order (a seq no row holds is simply absent: the caller
        compares what it got with what it asked for).

    Raises:
        RowError: a picked row does not decode.
    """
    wanted = set(picked)
    chosen = []
    packed = False
    for index, row in enumerate(rows):
        if row[1] in wanted:
            chosen.append(row)
            packed = packed or row[7] == 0
        elif row[7] == 0:  # a packed row: does it hold a picked member?
            end = rows[index + 1][1] if index + 1 < len(rows) else row[1] + MAX_PACKED_ROW_MEMBERS
            at = bisect.bisect_left(picked, row[1])
            if at < len(picked) and picked[at] < end:
                chosen.append(row)
                packed = True
    events: list[Event] = []
    index, count = 0, len(chosen)
    varints = schema_version != LEGACY_SCHEMA_VERSION
    while index < count:
        if c_decode_rows is not None:
            # expected -1: each picked row at its own seq, in one pass (the pass's shared
            # short strings then serve the whole range, as in a page's decode)
            index, _ = c_decode_rows(chosen, index, -1, _orjson_loads, Event, events, varints,
                                     MAX_PACKED_DATA_BYTES, MIN_PACKED_ROW_MEMBERS,
                                     MAX_PACKED_ROW_MEMBERS)
            if index >= count:
                break
        events.extend(decode_row(chosen[index], schema_version))
        index += 1
    # a packed row's members that were not picked (decoded with it) are dropped
    return [e for e in events if e["seq"] in wanted] if packed else events


def _noted(prescan: list[int] | None) -> tuple[int, int] | None:
    return None if prescan is None else (prescan[0], prescan[1])


# --- writing --------------------------------------------------------------------------------

EncodedRow = tuple[int, str, int, str | bytes, bytes | str | None, str | None, int | None]
"""``(seq, type, time, data, source_event_seqs, surface_op, ignorable)`` ready to bind."""


def _check_envelope(event: Event) -> None:
    get = event.get
    type_, seq, time = get("type"), get("seq"), get("time")
    # Fast path for well-formed envelopes (the common case: events from Session.append).
    if (event.keys() <= ENVELOPE_KEYS and type(type_) is str and type_
            and type(seq) is int and 0 <= seq <= MAX_SAFE_INTEGER
            and type(time) is int and -MAX_SAFE_INTEGER <= time <= MAX_SAFE_INTEGER
            and "data" in event and get("ignorable", True) is True):
        return
    extra = set(event.keys()) - ENVELOPE_KEYS
    if extra:
        raise EventRejectedError(
            f"event envelope has keys {sorted(extra)} that are not part of the envelope; a "
            f"SQLite row cannot hold them", code="ENVELOPE", seq=event.get("seq"),
            event_type=event.get("type"))
    type_ = event.get("type")
    if not isinstance(type_, str) or not type_:
        raise EventRejectedError(f"event type must be a non-empty string, got {type_!r}",
                                 code="ENVELOPE", seq=event.get("seq"))
    if not is_safe_int(event.get("seq")) or event["seq"] < 0:
        raise EventRejectedError(f"event seq must be a non-negative safe integer, got "
                                 f"{event.get('seq')!r}", code="ENVELOPE", event_type=type_)
    if not is_safe_int(event.get("time")):
        raise EventRejectedError(f"event time must be a safe integer, got {event.get('time')!r}",
                                 code="ENVELOPE", seq=event["seq"], event_type=type_)
    if "data" not in event:
        raise EventRejectedError("event data is required", code="ENVELOPE", seq=event["seq"],
                                 event_type=type_)
    if "ignorable" in event and event["ignorable"] is not True:
        raise EventRejectedError(f"ignorable must be literally true when present, got "
                                 f"{event['ignorable']!r}", code="ENVELOPE", seq=event["seq"],
                                 event_type=type_)


def _scalar_row(event: Event, schema_version: int) -> EncodedRow:
    seqs = event.get("sourceEventSeqs")
    op = event.get("surfaceOp")
    text = dumps(event["data"])
    if schema_version == LEGACY_SCHEMA_VERSION:
        if event.get("ignorable") is True:
            raise EventRejectedError(
                f"its {event['type']} event at seq {event['seq']} is ignorable, and a schema-14 "
                "SQLite file (the published dsh's layout, whose reader refuses unknown types) "
                "has no column for that; put this session in a JSONL folder, which the "
                "published dsh reads, or a schema-17 SQLite file (the default: leave out "
                "?schema=14)", code="ENVELOPE", seq=event["seq"], event_type=event["type"])
        return (event["seq"], event["type"], event["time"], text.decode("utf-8"),
                None if seqs is None else dumps(seqs).decode("utf-8"),
                None if op is None else dumps(op).decode("utf-8"), None)
    return (event["seq"], event["type"], event["time"], _encode_data(text),
            None if seqs is None else encode_source_event_seqs(seqs),
            None if op is None else dumps(op).decode("utf-8"),
            1 if event.get("ignorable") is True else None)


def _slice_row_data(data: FrozenDict, start: int, stop: int) -> dict[str, Any]:
    """Members ``[start, stop)`` of a packed row's data, keys in the row's own order."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key == "dt":
            out[key] = list(value[start:stop - 1])
        elif key in ("texts", "args"):
            out[key] = list(value[start:stop])
        else:
            out[key] = value
    return out


def _partition_packed(row: FrozenDict, originals: Sequence[Event]) -> Iterable[EncodedRow]:
    """Split one packed run into rows of ≤ 1024 members and ≤ 1 MiB data.

    Rule: docs/formats.md#schema-17.
    """
    data = row["data"]
    members = len(data["texts"] if "texts" in data else data["args"])
    dt = data["dt"]
    times = [row["time0"]]
    for gap in dt:
        times.append(times[-1] + gap)
    seq0 = row["seq0"]
    encoded: dict[tuple[int, int], bytes] = {}

    def text_of(start: int, stop: int) -> bytes:
        key = (start, stop)
        if key not in encoded:
            encoded[key] = dumps(_slice_row_data(data, start, stop))
        return encoded[key]

    def fits(start: int, stop: int) -> bool:
        return len(text_of(start, stop)) <= MAX_PACKED_DATA_BYTES

    def packed(start: int, stop: int) -> EncodedRow:
        return (seq0 + start, row["type"], times[start], _encode_data(text_of(start, stop)),
                None, None, 0)

    pos = 0
    while members - pos >= MIN_PACKED_ROW_MEMBERS:
        size = min(MAX_PACKED_ROW_MEMBERS, members - pos)
        if fits(pos, pos + size):
            yield packed(pos, pos + size)
            pos += size
            continue
        lo, hi, best = MIN_PACKED_ROW_MEMBERS, size - 1, 0
        while lo <= hi:
            mid = (lo + hi) // 2
            if fits(pos, pos + mid):
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        if best:
            yield packed(pos, pos + best)
            pos += best
        else:
            yield _scalar_row(originals[pos], SCHEMA_VERSION)
            pos += 1
    while pos < members:
        yield _scalar_row(originals[pos], SCHEMA_VERSION)
        pos += 1


def encode_batch(events: Sequence[Event], schema_version: int) -> list[EncodedRow]:
    """Encode one durable append batch into physical rows (docs/formats.md#schema-17).

    Schema 17 packs runs of eligible ``assistant/chunk`` deltas of this batch (never across
    batches) into rows of 3…1024 members and ≤ 1 MiB data; schema 14 writes one scalar row per
    event with JSON text columns, as the published dsh does.

    Args:
        events: The batch in seq order (contiguity is the caller's check).
        schema_version: 14 or 17.

    Returns:
        Rows ``(seq, type, time, data, source_event_seqs, surface_op, ignorable)``.

    Raises:
        EventRejectedError: an envelope a row cannot hold (code ENVELOPE): extra keys, bad
            ``seq``/``time``/``type``, missing ``data``, bad ``sourceEventSeqs``, or an ignorable
            event in a schema-14 file.
        InvalidJsonError: a payload is not lossless JSON.

    The C accelerator encodes a batch of scalar events in one pass (the same rows); this
    Python code is the reference and runs for everything it leaves (chunk packing, errors).
    """
    if c_encode_rows is not None and type(events) in (list, tuple):
        try:
            rows: list[EncodedRow] = c_encode_rows(events, schema_version, _orjson_dumps,
                                                   _encode_data, ZSTD_DATA_THRESHOLD_BYTES)
            return rows
        except CFallback:
            pass
    return _encode_batch(events, schema_version)


def encode_sealed_batch(events: Sequence[Event], schema_version: int, batch_key: bytes
                        ) -> tuple[list[EncodedRow], bytes | None]:
    """:func:`encode_batch`'s rows and, when the C accelerator computes it, the batch's digest.

    The digest is what the seal chain's record of exactly these events under ``batch_key``
    holds (``SHA-256`` of their leaves, docs/formats.md#the-seal-chain): the accelerator writes
    each event's data once and takes both the row's text and the leaf's canonical bytes from
    it. ``None`` when it is not built or leaves the batch to the references (a chunk run to
    pack, an error to name): the chain then computes the leaves itself.

    Args:
        events: The batch in seq order (contiguity is the caller's check).
        schema_version: 14 or 17.
        batch_key: The 16-byte batch key of the chain record these events will get.

    Raises:
        As :func:`encode_batch`.
    """
    if c_encode_sealed_rows is not None and type(events) in (list, tuple):
        try:
            rows, digest = c_encode_sealed_rows(events, schema_version, _orjson_dumps,
                                                _encode_data, ZSTD_DATA_THRESHOLD_BYTES,
                                                batch_key, hashlib.sha256)
            return rows, digest
        except CFallback:
            pass
    return encode_batch(events, schema_version), None


def _encode_batch(events: Sequence[Event], schema_version: int) -> list[EncodedRow]:
    """:func:`encode_batch` in pure Python (the accelerator's reference)."""
    for event in events:
        _check_envelope(event)
    if schema_version == LEGACY_SCHEMA_VERSION:
        return [_scalar_row(event, schema_version) for event in events]
    if not any(event["type"] == "assistant/chunk" for event in events):
        return [_scalar_row(event, schema_version) for event in events]  # nothing to pack
    from dsh.session import CHUNK_ROW_TAGS, pack_chunk_runs  # (see decode_row)
    first_seq = events[0]["seq"] if events else 0
    rows: list[EncodedRow] = []
    for record in pack_chunk_runs(events):
        if "seq0" in record and record.get("type") in CHUNK_ROW_TAGS:
            start = record["seq0"] - first_seq
            count = len(record["data"]["texts"] if "texts" in record["data"]
                        else record["data"]["args"])
            rows.extend(_partition_packed(record, events[start:start + count]))
        else:
            rows.append(_scalar_row(record, schema_version))  # type: ignore[arg-type]  # an Event
    return rows


# --- session rows ---------------------------------------------------------------------------

SessionRow = tuple[Any, Any, Any, Any, Any, Any, Any, Any, Any, Any, Any]
"""``(id, version, created_at, cwd, parent_session, seed_length, origin, delegation_depth,
agent_preset, incarnation, revision)``."""


_HEX: Final = "[0-9a-fA-F]"
_UUID_GLOB: Final = (_HEX * 8 + "-" + _HEX * 4 + "-[1-8]" + _HEX * 3 + "-[89abAB]" + _HEX * 3 + "-"
                     + _HEX * 12)
_SAFE: Final = f"BETWEEN 0 AND {MAX_SAFE_INTEGER}"


def _count(value: object) -> bool:
    return is_safe_int(value) and value >= 0  # type: ignore[operator]  # an int by then


def _absolute(value: object) -> bool:
    return isinstance(value, str) and os.path.isabs(value)


SESSION_ROW_RULES: Final[tuple[tuple[str, bool, str, Callable[[object], bool], str], ...]] = (
    ("id", False, "typeof(s.id) = 'text' AND s.id <> ''",
     lambda v: isinstance(v, str) and v != "", "non-empty text"),
    ("version", False, f"typeof(s.version) = 'integer' AND s.version BETWEEN "
     f"-{MAX_SAFE_INTEGER} AND {MAX_SAFE_INTEGER}", is_safe_int, "a safe integer"),
    ("created_at", False, f"typeof(s.created_at) = 'integer' AND s.created_at {_SAFE}", _count,
     "a non-negative safe integer"),
    ("cwd", True, "typeof(s.cwd) = 'text' AND substr(s.cwd, 1, 1) = '/'", _absolute,
     "an absolute path or NULL"),
    ("parent_session", True, "typeof(s.parent_session) = 'text'",
     lambda v: isinstance(v, str), "text or NULL"),
    ("seed_length", True, f"typeof(s.seed_length) = 'integer' AND s.seed_length {_SAFE}",
     _count, "a non-negative integer or NULL"),
    ("origin", True, "typeof(s.origin) = 'text' AND s.origin = 'subagent'",
     lambda v: v == "subagent", "'subagent' or NULL"),
    ("delegation_depth", True, f"typeof(s.delegation_depth) = 'integer' AND s.delegation_depth "
     f"{_SAFE}", _count, "a non-negative integer or NULL"),
    ("agent_preset", True, "typeof(s.agent_preset) = 'text'", lambda v: isinstance(v, str),
     "text or NULL"),
    ("incarnation", False, f"typeof(s.incarnation) = 'text' AND s.incarnation GLOB "
     f"'{_UUID_GLOB}'", is_uuid, "a UUID"),
    ("revision", False, f"typeof(s.revision) = 'integer' AND s.revision {_SAFE}", _count,
     "a non-negative integer"),
)
"""The checks of a ``sessions`` row, one a column in :data:`SessionRow` order: ``(column,
NULL allowed, the SQL test over ``s.<column>``, the Python test, the rule for messages)``. The
one place both :func:`decode_session_row` (Python) and :data:`SESSION_ROW_CHECK_SQL` (SQLite)
take them from (docs/formats.md#schema-17)."""

SESSION_ROW_CHECK_SQL: Final = "(" + " AND ".join(
    f"(s.{column} IS NULL OR ({sql}))" if nullable else f"({sql})"
    for column, nullable, sql, _test, _rule in SESSION_ROW_RULES) + ")"
"""A SQL expression over a ``sessions`` row aliased ``s``: 1 only when the row passes every
check of :func:`decode_session_row` (built from :data:`SESSION_ROW_RULES`; ``cwd``: a POSIX
absolute path, ``os.path.isabs`` on POSIX; other platforms check it again in Python); SQLite
evaluates it in C for listings of many sessions. A row it does not vouch for (0, or NULL) still
goes through :func:`decode_session_row`, which raises for it or accepts what only the reference
accepts (a UUID the regex matches before a final newline, a drive-letter ``cwd``)."""

_CWD_CHECKED: Final = os.path.isabs is posixpath.isabs
"""Whether :data:`SESSION_ROW_CHECK_SQL`'s ``cwd`` test is ``os.path.isabs`` (POSIX); when
not, a listing checks ``cwd`` again with :func:`cwd_unchecked`."""


def cwd_unchecked(cwd: object) -> bool:
    """Whether :data:`SESSION_ROW_CHECK_SQL` may have passed a ``cwd`` ``os.path.isabs`` refuses.

    Always False on POSIX (the SQL test is ``isabs``); elsewhere True for a text ``cwd`` that
    is not absolute there, whose row must then go through :func:`decode_session_row`.
    """
    return not _CWD_CHECKED and isinstance(cwd, str) and not os.path.isabs(cwd)


def session_header(row: Sequence[Any]) -> FrozenDict:
    """The header of a ``sessions`` row whose columns were checked (docs/formats.md#schema-17).

    Only for a row :func:`decode_session_row` validated, or one
    :data:`SESSION_ROW_CHECK_SQL` vouched for: nothing is checked here.

    Args:
        row: The row; its first nine columns in :data:`SessionRow` order (more are ignored).

    Returns:
        dsh's camelCase keys in ``HEADER_KEYS`` order, NULL columns left out.
    """
    header: dict[str, Any] = {"version": row[1], "id": row[0], "createdAt": row[2]}
    if row[3] is not None:  # one test a column: listings build 100,000s of these
        header["cwd"] = row[3]
    if row[4] is not None:
        header["parentSession"] = row[4]
    if row[5] is not None:
        header["seedLength"] = row[5]
    if row[6] is not None:
        header["origin"] = row[6]
    if row[7] is not None:
        header["delegationDepth"] = row[7]
    if row[8] is not None:
        header["agentPreset"] = row[8]
    return FrozenDict(header)


def decode_session_row(row: SessionRow, *, path: str) -> tuple[FrozenDict, str, int]:
    """Validate a ``sessions`` row and rebuild its header (docs/formats.md#schema-17).

    Returns:
        ``(header, incarnation, revision)``; the header has dsh's camelCase keys in
        ``HEADER_KEYS`` order and omits NULL columns.

    Raises:
        LogCorruptError: an invalid column (empty id, negative created_at, relative cwd, origin
            other than ``subagent``, negative seed_length/delegation_depth, non-UUID
            incarnation, negative revision).
    """
    for (column, nullable, _sql, test, rule), value in zip(SESSION_ROW_RULES, row, strict=True):
        if not (test(value) or (nullable and value is None)):
            id_ = row[0]
            raise LogCorruptError(
                f"invalid durable metadata for session {id_!r} in {path}: column {column} must "
                f"be {rule}, got {value!r}", path=path,
                session_id=id_ if isinstance(id_, str) else None)
    incarnation, revision = row[9], row[10]
    return session_header(row), incarnation, revision

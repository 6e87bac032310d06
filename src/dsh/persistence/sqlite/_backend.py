"""SQLite persistence backend: dsh's database file, read at schema 14 or 17, created at 17.

Invariants this module owns (docs/formats.md#sqlite, docs/stores.md#the-backend-contract):

* a file we create has dsh's layout: ``application_id`` 0x44534850, ``user_version``
  17, dsh's STRICT tables and nothing else (write locks live beside the file, in
  ``<db>.dsh-locks/``, never inside it);
* every ``append`` is one ``BEGIN IMMEDIATE`` transaction that re-derives the stored tail and
  refuses a batch that does not continue it (a stale writer, ours or dsh's), so nothing is ever
  duplicated or overwritten; it commits with ``synchronous = FULL``, so a returned append is
  durable and ``flush()`` has nothing left to do;
* a write handle is exclusive across threads and processes (an OS ``flock`` + ``.owner`` sidecar);
* a torn tail (an undecodable row after the last intact ``turn/end``) is deleted only by a write
  handle that saw it in :meth:`SqliteHandle.read`, after re-checking it under the write lock.

Durability choice: dsh sets ``synchronous = FULL`` (docs/formats.md#files-and-connections,
    docs/rules.md#write-behind-and-the-flush-barrier) and so do
we. In WAL mode FULL syncs the WAL at every commit, making each append durable when it returns;
``NORMAL`` would only sync at checkpoints, and a durable ``flush()`` would then need a full
checkpoint, which costs more than the per-commit WAL sync it saves.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json as std_json
import logging
import os
import sqlite3
import stat
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, Final, Literal, NoReturn, ParamSpec, TypeVar
from urllib.parse import quote

from dsh._errors import (
    ConfigError,
    DshError,
    LogCorruptError,
    PersistenceError,
    SealDamagedError,
    SessionBusyError,
    SessionExistsError,
    SessionFormatUnsupportedError,
    SessionNotFoundError,
)
from dsh._failpoints import failpoint
from dsh.json import FrozenDict, FrozenList, c_seqs_contiguous, is_safe_int
from dsh.persistence import _restore_point as rp
from dsh.persistence._after_commit import AfterCommit
from dsh.persistence._chain import HEAD_EVERY, ChainState, carry, incarnation_bytes, this_writer
from dsh.persistence._contract import (
    Capabilities,
    ColdRead,
    HandleBase,
    OpenMode,
    Resealed,
    TornTail,
    check_session_id,
    metadata_problem,
    normalize_header,
    session_id_problem,
    validate_batch,
)
from dsh.persistence._lock import SessionLock
from dsh.persistence._paths import (
    drop_aside_files,
    fsync_folder,
    mkdir_private,
    open_sidecar,
    read_aside_file,
    refuse_special,
    replace_durably,
    write_all,
    write_aside_file,
)
from dsh.persistence._seal import (
    Seal,
    SealCut,
    append_restore_point_mark_to,
    batch_seal,
    check_row_seals,
    install_seal,
    open_seal_appender,
    publish_head,
    read_elided,
    read_seal,
    read_seal_after,
    refuse_reseal_over_damage,
    reset_seal,
    restore_point_mark,
    row_records,
    seal_binding,
    stage_seal,
    staged_name,
)
from dsh.persistence.sqlite import _restore_point as srp
from dsh.persistence.sqlite._schema import (
    APPLICATION_ID,
    LEGACY_SCHEMA_VERSION,
    MAX_PACKED_ROW_MEMBERS,
    READABLE_SCHEMA_VERSIONS,
    ROW_COLUMNS,
    SCHEMA_14_DDL,
    SCHEMA_17_DDL,
    SCHEMA_VERSION,
    Row,
    RowError,
    canonical_schema_objects,
    decode_row,
    decode_session_row,
    encode_batch,
    encode_sealed_batch,
    has_canonical_schema,
    is_canonical_schema,
    is_sealed_incarnation,
    is_uuid,
    scan_rows,
    schema_objects,
    sealed_incarnation,
)
from dsh.session import SESSION_FORMAT_VERSION, Event

if TYPE_CHECKING:
    from dsh.persistence._listing import ListingEntry, ReadFn
    from dsh.persistence._search import SearchIndex

__all__ = [
    "DEFAULT_BUSY_TIMEOUT_MS",
    "JOURNAL_MODES",
    "JournalMode",
    "SqliteBackend",
    "SqliteHandle",
]

logger = logging.getLogger(__name__)

JournalMode = Literal["wal", "delete", "truncate", "persist"]
JOURNAL_MODES: Final = ("wal", "delete", "truncate", "persist")
DEFAULT_BUSY_TIMEOUT_MS: Final = 5000
"""SQLite busy timeout (ms) for every connection (docs/formats.md#files-and-connections)."""
MAX_BUSY_TIMEOUT_MS: Final = 2_147_483_647
JOURNAL_RETRY_PACING_MS: Final = 10
"""Pause between ``PRAGMA journal_mode`` attempts that met ``SQLITE_BUSY``.

Rule: docs/formats.md#files-and-connections.
"""
SYNCHRONOUS_FULL: Final = 2
_SQLITE_BUSY: Final = 5
_SQLITE_LOCKED: Final = 6
_SQLITE_CORRUPT: Final = 11
_SQLITE_NOTADB: Final = 26
_MAX_LOCK_NAME_BYTES: Final = 200
_FROZEN: Final = (FrozenDict, FrozenList)
OWNER_WAIT_MS: Final = 100
"""Longest wait (ms) for a new holder's ``.owner`` sidecar so a busy error can name it."""

_LEGACY_ROW_COLUMNS: Final = srp.LEGACY_ROW_COLUMNS
_SESSION_COLUMNS: Final = ("id, version, created_at, cwd, parent_session, seed_length, origin, "
                           "delegation_depth, agent_preset, incarnation, revision")
_INSERT_EVENTS_17: Final = (
    "INSERT INTO events (session_id, seq, type, time, data, source_event_seqs, surface_op, "
    "ignorable) VALUES ")
_INSERT_EVENTS_14: Final = (
    "INSERT INTO events (session_id, seq, type, time, data, source_event_seqs, surface_op) "
    "VALUES ")
_INSERT_ROWS_MAX: Final = 256
"""Rows one INSERT statement carries at most (a power of two; fewer when the SQLite build
binds fewer parameters). One statement of 256 rows instead of 256 steps of ``executemany``:
SQLite's statement and the driver's per-row step (and its GIL release) run once per chunk,
about a third less CPU for the 188,481 rows of bench_cli's 44 MB import (bench/RESULTS.md)."""
_INSERT_ROWS_EXACT: Final = 16
"""A rest of up to this many rows goes in one statement of exactly its rows (a per-turn flush
of a few events: one execute, not one per power of two); a longer rest is split into powers of
two. A connection so prepares at most 16 + 5 statement texts per schema."""


# What a row's nullable columns are bound as when they are NULL (docs/formats.md#schema-17): the
# driver (CPython 3.11-3.12) binds None and bytes only after a failed adapter look-up that raises
# and clears an AttributeError, about 0.4 us a value; an exact int or str is bound directly. The
# statement turns each stand-in back into NULL with NULLIF, and a stand-in is of a type the
# column never holds otherwise (an encoded row's provenance is bytes or text and its surface op
# text, never an int; its ignorable flag is an int, never text), so no stored value changes.
_NULL_SOURCES: Final = 0
_NULL_SURFACE_OP: Final = 0
_NULL_IGNORABLE: Final = ""
_ROW_17: Final = "(?1, ?, ?, ?, ?, NULLIF(?, 0), NULLIF(?, 0), NULLIF(?, ''))"
_ROW_14: Final = "(?1, ?, ?, ?, ?, NULLIF(?, 0), NULLIF(?, 0))"


@functools.lru_cache(maxsize=64)
def _insert_statement(columns: int, count: int) -> str:
    """``INSERT INTO events ... VALUES (?1, ?, ...), ...`` of ``count`` rows of ``columns``.

    ``?1`` is the session id, bound once for every row; the others number on from it. The
    nullable columns are bound through NULLIF (see :func:`_bind_values`).
    """
    head, row = (_INSERT_EVENTS_17, _ROW_17) if columns == 8 else (_INSERT_EVENTS_14, _ROW_14)
    return head + ", ".join([row] * count)


def _bind_values(session_id: str, chunk: Sequence[Sequence[Any]], legacy: bool) -> list[Any]:
    """The parameters of one :func:`_insert_statement` over ``chunk`` (encoded rows).

    The session id, then each row's columns, a NULL provenance, surface op or ignorable flag
    as its stand-in (legacy rows: the first six columns).
    """
    out: list[Any] = [session_id]
    extend = out.extend
    if legacy:
        for seq, kind, time, data, sources, op, *_ in chunk:
            extend((seq, kind, time, data, _NULL_SOURCES if sources is None else sources,
                    _NULL_SURFACE_OP if op is None else op))
        return out
    for seq, kind, time, data, sources, op, ignorable in chunk:
        extend((seq, kind, time, data, _NULL_SOURCES if sources is None else sources,
                _NULL_SURFACE_OP if op is None else op,
                _NULL_IGNORABLE if ignorable is None else ignorable))
    return out


def _insert_rows(conn: sqlite3.Connection, session_id: str, rows: Sequence[Sequence[Any]],
                 legacy: bool) -> None:
    """Insert encoded rows (``encode_batch``'s) of one session, in multi-row statements.

    A batch is cut into chunks of :data:`_INSERT_ROWS_MAX` rows, a rest of up to
    :data:`_INSERT_ROWS_EXACT` rows goes in one statement and a longer one is split into
    powers of two, so a connection prepares at most 21 statement texts per schema and its
    statement cache (128) keeps them.

    Raises:
        sqlite3.Error: as ``executemany`` would (the caller's transaction rolls back).
    """
    columns = 7 if legacy else 8
    per = _INSERT_ROWS_MAX
    limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    while per > 1 and per * (columns - 1) + 1 > limit:
        per //= 2
    count = len(rows)
    done = 0
    while done < count:
        left = count - done
        size = per if left >= per else left if left <= _INSERT_ROWS_EXACT \
            else 1 << (left.bit_length() - 1)
        conn.execute(_insert_statement(columns, size),
                     _bind_values(session_id, rows[done:done + size], legacy))
        done += size


BULK_APPEND_ROWS: Final = 1_000
"""Rows from which an append is a bulk one (an import's or a conversion's batch, not a turn)."""
BULK_WAL_AUTOCHECKPOINT: Final = 8_192
"""WAL pages (32 MiB) after which a bulk append's commit checkpoints (SQLite's default: 1,000).

Rule: docs/formats.md#files-and-connections. Each checkpoint syncs the WAL and the database file
whatever it copies: at 1,000 pages the 44 MB import of bench_cli ran ~27 of them and 112
``fdatasync`` calls in all; at 8,192, 58 (bench/RESULTS.md). A commit is as durable either way
(``synchronous = FULL`` syncs the WAL at every commit); the WAL grows to this (plus a batch)
before it is copied back, and SQLite removes it when the last connection closes."""
DEFAULT_WAL_AUTOCHECKPOINT: Final = 1_000
"""SQLite's own ``wal_autocheckpoint``, which every other commit keeps."""


def _bulk_checkpoints(conn: sqlite3.Connection, bulk: bool) -> None:
    """Set the connection's ``wal_autocheckpoint`` for a bulk append's commit, or back after it.

    ``bulk``: :data:`BULK_WAL_AUTOCHECKPOINT` (before the append's transaction), else SQLite's
    default (after it, whatever happened). A setting takes no lock, so it may run inside the
    transaction a held resume opened. Rule: docs/formats.md#files-and-connections.

    Raises:
        sqlite3.Error: the pragma failed.
    """
    pages = BULK_WAL_AUTOCHECKPOINT if bulk else DEFAULT_WAL_AUTOCHECKPOINT
    conn.execute(f"PRAGMA wal_autocheckpoint = {pages}")


IDLE_CONNECTIONS: Final = 2
"""Validated connections a backend keeps for its next handles (see ``SqliteBackend._connect``)."""
_OWNERSHIP_PRAGMAS: Final = ("PRAGMA schema_version", "PRAGMA user_version",
                              "PRAGMA application_id")
"""The ownership cookie's three plain pragmas: the open's check prepares them, and every later
read of the cookie on the connection (an idle one's reuse check, a write's recheck) runs them
from its statement cache; their table-valued join cost a reused connection ~13x as much
(prepared afresh) at its first write."""
_TAIL_FROM_LAST: Final = (
    f"SELECT {ROW_COLUMNS} FROM events WHERE session_id = ? AND seq >= coalesce((SELECT "
    "max(seq) FROM events WHERE session_id = ? AND seq < ?), ?) ORDER BY seq")
"""A restore point's tail (bound: id, id, cut, cut): the last row before the cut, if any, then
every row from the cut on."""
_TAIL_FROM_LAST_LEGACY: Final = _TAIL_FROM_LAST.replace(ROW_COLUMNS, _LEGACY_ROW_COLUMNS, 1)
""":data:`_TAIL_FROM_LAST` for a schema-14 file."""
_PACKED_PREDECESSORS: Final = (
    f"SELECT {ROW_COLUMNS} FROM events WHERE session_id = ? AND ignorable = 0 "
    "AND type IN ('text-chunks', 'reasoning-chunks', 'tool-call-chunks') "
    "AND seq >= ? AND seq < ? ORDER BY seq")


def _fail(exc: sqlite3.Error | UnicodeDecodeError, action: str, path: str,
          session_id: str | None = None) -> NoReturn:
    """Re-raise a driver error as a :class:`PersistenceError` naming the action and file.

    SQLite's own corruption reports (``SQLITE_CORRUPT``, ``SQLITE_NOTADB``, text that is not
    UTF-8) become :class:`LogCorruptError`.
    """
    if isinstance(exc, UnicodeDecodeError):
        # the driver could not decode SQLite's own message: it quotes damaged schema text
        text = bytes(exc.object).decode("utf-8", "replace")
        raise LogCorruptError(
            f"SQLite {action} failed for {path}: {text}; the database file is damaged (run "
            f"`sqlite3 {path} 'PRAGMA integrity_check'` to see where)", path=path,
            session_id=session_id) from exc
    code = getattr(exc, "sqlite_errorcode", None)
    if (code is not None and code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)) \
            or "could not decode to utf-8" in str(exc).lower():
        raise LogCorruptError(
            f"SQLite {action} failed for {path}: {exc}; the database file is damaged (run "
            f"`sqlite3 {path} 'PRAGMA integrity_check'` to see where)", path=path,
            session_id=session_id) from exc
    busy = code is not None and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    raise PersistenceError(
        f"SQLite {action} failed for {path}: {exc}"
        + ("; another connection held the database past the busy timeout" if busy else ""),
        code="DATABASE_BUSY" if busy else "SQLITE", path=path, session_id=session_id) from exc


def _quick_check(conn: sqlite3.Connection) -> str:
    """``PRAGMA quick_check``'s answer (at most 5 lines), for corruption messages."""
    try:
        lines = [str(r[0]) for r in conn.execute("PRAGMA quick_check(5)").fetchall()]
    except sqlite3.Error as exc:
        return f"quick_check itself failed ({exc})"
    return "; ".join(lines) or "no answer"


def _check_owned(path: Path, info: os.stat_result, kind: str, is_kind: Callable[[int], bool],
                 forbidden_mode: int, kind_rule: str, mode_rule: str) -> None:
    """One precondition set: the right kind (never a symlink), ours, no forbidden bits.

    Rule: docs/formats.md#file-modes-and-symlinks.
    """
    if stat.S_ISLNK(info.st_mode) or not is_kind(info.st_mode):
        raise ConfigError(f"SQLite {kind} {path} {kind_rule}", path=str(path))
    if info.st_uid != os.getuid():
        fix = ("keep the database in a folder of your own (mkdir one, e.g. under your "
               "home; the default store is ~/.dsh/sessions.db)" if stat.S_ISDIR(info.st_mode)
               else "use a database file of your own")
        raise ConfigError(f"SQLite {kind} {path} must be owned by you (uid {os.getuid()}), "
                          f"found uid {info.st_uid}: another user could replace or read it; "
                          f"{fix}", path=str(path))
    if info.st_mode & forbidden_mode:
        mode = stat.S_IMODE(info.st_mode)
        # A shared folder (/tmp) must not be chmod-ed: the way out there is another folder.
        fix = (f"fix it with 'chmod {mode & ~forbidden_mode:o} {path}'"
               if stat.S_ISREG(info.st_mode)
               else "keep the database in a folder only you can write to")
        raise ConfigError(f"SQLite {kind} {path} {mode_rule}, found mode {mode:o}; {fix}",
                          path=str(path))


def _check_path(path: Path) -> None:
    """Enforce dsh's filesystem preconditions and create the file 0600.

    Rule: docs/formats.md#file-modes-and-symlinks.

    Raises:
        ConfigError: the parent is a symlink, not a directory, not ours, or group/world
            writable; the file is not a regular file, not ours, or readable by others.
    """
    parent = path.parent
    try:
        try:
            info = os.lstat(parent)
        except FileNotFoundError:  # (a mkdir of a folder that exists raises and catches)
            parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            info = os.lstat(parent)
    except OSError as exc:
        raise ConfigError(f"cannot prepare the SQLite directory {parent}: {exc}",
                          path=str(parent)) from exc
    _check_owned(parent, info, "directory", stat.S_ISDIR, 0o022,
                 "must be a real directory, not a symlink or file",
                 "must not be group or world writable")
    try:  # (an existing file, the common case, is looked at without an exception raised)
        info = os.lstat(path)
    except FileNotFoundError:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass  # (created meanwhile by another process: checked as found below)
        except OSError as exc:
            raise ConfigError(f"cannot create SQLite database {path}: {exc}",
                              path=str(path)) from exc
        else:
            os.close(fd)
        info = os.lstat(path)
    except OSError as exc:  # what the create would have met (a folder we cannot search)
        raise ConfigError(f"cannot create SQLite database {path}: {exc}", path=str(path)) from exc
    if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and info.st_mode & 0o077:
        # another program's file is refused as such: its mode is not ours to advise on
        _refuse_if_foreign(path)
    _check_owned(path, info, "database", stat.S_ISREG, 0o077,
                 "must be a regular file, not a symlink or directory",
                 "must have no group or other permissions (dsh refuses it otherwise)")


_FOREIGN_WHAT_TO_DO: Final = (
    "; dsh leaves it as it is: give the path of a dsh store or a new file name (--store, or "
    "DSH_HOME for the default $DSH_HOME/sessions.db)")
"""The end of a ``FOREIGN_DATABASE`` message: what to do (docs/errors.md)."""


def _foreign_database(path: Path | str, version: int, app_id: int,
                      objects: int) -> PersistenceError:
    """The ``FOREIGN_DATABASE`` error for ``path``, whose header or schema is not dsh's.

    ``version`` and ``app_id`` are the file's ``user_version`` and ``application_id``;
    ``objects`` counts its schema objects (told only for an unversioned file).
    """
    what = (f"has application id {app_id}, expected {APPLICATION_ID}" if version else
            f"has an unversioned schema or application identity (user_version 0, "
            f"application_id {app_id}, {objects} schema objects)")
    return PersistenceError(f"SQLite database {path} {what}; it is not a dsh session "
                            f"store{_FOREIGN_WHAT_TO_DO}", code="FOREIGN_DATABASE", path=str(path))


def _refuse_if_foreign(path: Path) -> None:
    """Refuse ``path`` as ``FOREIGN_DATABASE`` when it is plainly another program's database.

    Called only for a file of ours whose mode dsh refuses, so that the person is not told to
    chmod another program's file (docs/errors.md). It decides nothing else: a file whose
    header carries dsh's application id, a pristine one, one holding exactly dsh's schema
    (a damaged header) or one that cannot be read here returns, and the mode is refused as
    always. The file is read through a read-only connection; nothing is written.

    Raises:
        PersistenceError: code ``FOREIGN_DATABASE``, as opening it with a strict mode would.
    """
    if _header_application_id(path) in (None, APPLICATION_ID):
        return
    try:
        conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            found = schema_objects(conn)
        finally:
            conn.close()
    except sqlite3.Error:
        return  # unreadable here: the mode refusal stands, the open says the rest later
    if app_id == APPLICATION_ID or (version == 0 and app_id == 0 and not found) or any(
            is_canonical_schema(found, v) for v in READABLE_SCHEMA_VERSIONS):
        return
    raise _foreign_database(path, version, app_id, len(found))

_HEADER_APPLICATION_ID: Final = slice(68, 72)
"""Where a SQLite file's header keeps ``PRAGMA application_id`` (big-endian)."""


def _header_application_id(path: Path) -> int | None:
    """The application id in ``path``'s SQLite header on disk, or None (absent, short, unreadable).

    A hint only: a change still in the WAL is not in the header, so a mismatch calls for the
    full open check, never for a refusal on its own.
    """
    try:
        with path.open("rb") as f:
            head = f.read(_HEADER_APPLICATION_ID.stop)
    except OSError:
        return None
    if len(head) < _HEADER_APPLICATION_ID.stop:
        return None
    return int.from_bytes(head[_HEADER_APPLICATION_ID], "big")


def lock_file_name(session_id: str) -> str:
    """The lock file name of ``session_id`` inside ``<db>.dsh-locks/``.

    The id is percent-encoded (no ``/`` or ``.``-only names survive); an encoding longer than
    200 bytes is shortened to a prefix plus its SHA-256 so it stays a valid file name.
    """
    encoded = quote(session_id, safe="")
    if encoded.startswith("."):
        encoded = "%2E" + encoded[1:]
    if len(encoded) > _MAX_LOCK_NAME_BYTES:
        digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()
        encoded = f"{encoded[:100]}~{digest}"
    return encoded + ".lock"


def _seal_identity(incarnation: str) -> bytes:
    # the checksum scheme's version + the session's incarnation: a seal of an older scheme
    # or of an earlier session with the same id is ignored (and rewritten), never trusted
    return b"rows2:" + incarnation.encode()


def _cut_stem(session_id: str) -> str:
    return lock_file_name(session_id).removesuffix(".lock")


def _write_metadata(path: Path, incarnation: str, metadata: Mapping[str, Any]) -> None:
    """Write a session's header ``metadata`` beside the database (docs/formats.md#header-metadata).

    The file holds ``{"incarnation", "metadata"}``: it belongs to the row with that incarnation
    only. Replaced durably (``replace_durably``).
    """
    mkdir_private(path.parent, "header metadata")
    replace_durably(path, std_json.dumps({"incarnation": incarnation, "metadata": dict(metadata)},
                                         ensure_ascii=False, sort_keys=True).encode("utf-8"))


def _with_metadata(header: FrozenDict, incarnation: str, path: Path) -> FrozenDict:
    """``header`` plus the ``metadata`` its sidecar keeps for this incarnation, if any.

    Rule: docs/formats.md#file-modes-and-symlinks.

    Raises:
        PersistenceError: ``SYMLINK`` or ``NOT_A_FILE`` naming ``path``: a link, a folder, a
            FIFO or a device sits there (never opened for a blocking read); ``SQLITE``: it
            cannot be read otherwise.
        LogCorruptError: it is not the JSON a create writes.
    """
    try:  # (opened as every sidecar is: no link followed, nothing but a regular file)
        with os.fdopen(open_sidecar(path, "header metadata"), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return header
    except OSError as exc:
        # what open_sidecar refused (a link: ELOOP, a non-file: EINVAL) is named as a JSONL
        # log's is; lstat only, so a FIFO there is never waited on
        refuse_special(path, "header metadata")
        raise PersistenceError(f"cannot read header metadata {path}: {exc}", code="SQLITE",
                               path=str(path)) from exc
    try:
        kept = std_json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise LogCorruptError(f"header metadata {path} is not JSON", path=str(path)) from exc
    if not isinstance(kept, dict) or kept.get("incarnation") != incarnation:
        return header  # left by an earlier session of the same id, or a create cut short
    metadata = kept.get("metadata")
    problem = metadata_problem(metadata)
    if problem is not None:
        raise LogCorruptError(f"header metadata {path} must be {problem}", path=str(path))
    if not metadata:
        return header
    return FrozenDict({**header, "metadata": FrozenDict(sorted(metadata.items()))})


def _header_row(header: Mapping[str, object]) -> tuple[Any, ...]:
    """Validate a ``SessionHeader`` and return its ``sessions`` columns.

    Rule: docs/formats.md#the-session-header, docs/formats.md#schema-17.

    A foreign ``version`` is stored as given and refused on read, like dsh
    (docs/formats.md#the-session-header).

    Raises:
        EventRejectedError: code HEADER, naming the field.
    """
    h = normalize_header(header)
    return (h["id"], h["version"], h["createdAt"], h.get("cwd"), h.get("parentSession"),
            h.get("seedLength"), h.get("origin"), h.get("delegationDepth"), h.get("agentPreset"))


class _Connection:
    """One opened, validated SQLite connection (docs/formats.md#files-and-connections)."""

    def __init__(self, path: Path, *, journal_mode: JournalMode, busy_timeout_ms: int,
                 create_schema: int = SCHEMA_VERSION) -> None:
        self.path = str(path)
        self._create_schema = create_schema
        self._writes_ready = False  # (ready_for_writes)
        started = time.monotonic()
        try:
            self.conn = sqlite3.connect(
                self.path, timeout=busy_timeout_ms / 1000, isolation_level=None,
                check_same_thread=False)
        except sqlite3.Error as exc:
            _fail(exc, "open", self.path)
        try:
            self._configure(journal_mode, busy_timeout_ms, started)
        except BaseException:
            self.conn.close()
            raise

    def _configure(self, journal_mode: JournalMode, busy_timeout_ms: int, started: float) -> None:
        conn = self.conn
        try:
            conn.execute("PRAGMA trusted_schema = OFF")
            if conn.execute("PRAGMA trusted_schema").fetchone()[0] != 0:
                raise PersistenceError(f"SQLite refused trusted_schema = OFF for {self.path}",
                                       code="SQLITE", path=self.path)
            # (the setting answers with the size in force, as its read-back does)
            mmap = conn.execute("PRAGMA mmap_size = 0").fetchone()
            if mmap is not None and mmap[0] != 0:
                raise PersistenceError(f"SQLite refused mmap_size = 0 for {self.path}",
                                       code="SQLITE", path=self.path)
            # (at open, before any statement is prepared: setting a flag pragma expires every
            # prepared statement of the connection, the statement cache's included)
            conn.execute("PRAGMA foreign_keys = ON")
            self.schema_version = self._validate_or_initialize()
            self._set_journal_mode(journal_mode, started + busy_timeout_ms / 1000)
            row = conn.execute(
                "SELECT store_id FROM persistence_state WHERE singleton = 1").fetchone()
        except (sqlite3.Error, UnicodeDecodeError) as exc:
            _fail(exc, "open", self.path)
        if row is None or not is_uuid(row[0]):
            # The application id, version and schema are dsh's (checked above): damage.
            raise LogCorruptError(
                f"SQLite database {self.path} has no valid store identity (persistence_state "
                f"holds {None if row is None else row[0]!r}, expected a UUID), though its "
                f"schema is dsh's: the file is damaged; PRAGMA quick_check says: "
                f"{_quick_check(conn)}", path=self.path)
        info = os.stat(self.path)
        self.store_identity = f"file:{info.st_dev}:{info.st_ino}:store:{row[0]}"
        self._file = (info.st_dev, info.st_ino)
        self._store_id = row[0]
        self._pid = os.getpid()

    def ready_for_writes(self) -> None:
        """Set what only a write needs: ``synchronous = FULL``, read back.

        Rule: docs/formats.md#files-and-connections. Called outside any transaction (SQLite
        refuses to change the safety level inside one) before the connection's first write: by
        a write handle as it takes the connection, by the store's shared connection (which
        creates sessions) as it is opened, and before a pristine file's schema is created. A
        connection that only reads (a read handle's, a page-in's) commits nothing on it.
        Once per connection. (``foreign_keys`` stays at the open: a flag pragma set later
        would expire the connection's prepared statements.)

        Raises:
            PersistenceError: SQLite refused ``synchronous = FULL``, or failed.
        """
        if self._writes_ready:
            return
        conn = self.conn
        try:
            conn.execute("PRAGMA synchronous = FULL")
            if conn.execute("PRAGMA synchronous").fetchone()[0] != SYNCHRONOUS_FULL:
                raise PersistenceError(f"SQLite refused synchronous = FULL for {self.path}",
                                       code="SQLITE", path=self.path)
        except sqlite3.Error as exc:
            _fail(exc, "open", self.path)
        self._writes_ready = True

    def reusable(self) -> bool:
        """Whether this idle connection may serve another handle as validated.

        Rule: docs/formats.md#files-and-connections. It must be this process's, outside any
        transaction, on the file the path names now (same device and inode: a file moved or
        copied over the path is opened afresh), with the schema cookie, user_version and
        application id it was validated with and the same store identity. Anything else,
        including an error asking, means no: the caller opens a new connection, which
        validates everything again.
        """
        if self._pid != os.getpid() or self.conn.in_transaction:
            return False
        try:
            info = os.stat(self.path)
            if (info.st_dev, info.st_ino) != self._file or self._ownership_cookie() != self._cookie:
                return False
            row = self.conn.execute(
                "SELECT store_id FROM persistence_state WHERE singleton = 1").fetchone()
        except (OSError, sqlite3.Error):
            return False
        return row is not None and row[0] == self._store_id

    def _validate_or_initialize(self) -> int:
        """Check dsh's schema in one read snapshot; create it in a pristine file.

        A file with a schema version is checked inside a deferred transaction (a read
        snapshot: opening a store to read takes no write lock, and waits for no writer), by
        the ownership cookie (schema cookie, ``user_version``, application id: three plain
        pragmas, which a new connection prepares in a quarter of the instructions of their
        table-valued join) and the schema objects. A file without one (pristine, or not
        dsh's) is checked again, and its schema created, inside ``BEGIN IMMEDIATE``
        (:meth:`_initialize`): two processes creating a store at once create it once.
        """
        conn = self.conn
        conn.execute("BEGIN")
        try:
            cookie = self._ownership_cookie()
            _, version, app_id = cookie
            if version != 0:
                self._check_owned(version, app_id)
                self._cookie = cookie
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        return int(version) if version != 0 else self._initialize()

    def _check_owned(self, version: int, app_id: int) -> None:
        """A versioned file's version, application id and schema objects are dsh's.

        Raises:
            SessionFormatUnsupportedError, LogCorruptError, PersistenceError: see the callers.
        """
        self._check_version(version)
        if app_id != APPLICATION_ID and self._has_dsh_schema():
            raise LogCorruptError(
                f"SQLite database {self.path} has application id {app_id}, expected "
                f"{APPLICATION_ID}, yet holds exactly dsh's schema {version}: its header "
                f"is damaged (or another program rewrote it); PRAGMA quick_check says: "
                f"{_quick_check(self.conn)}", path=self.path)
        if app_id != APPLICATION_ID:
            raise _foreign_database(self.path, version, app_id, 0)
        self._check_objects(version)

    def _initialize(self) -> int:
        """Check (or, for a pristine file, create) dsh's schema inside ``BEGIN IMMEDIATE``."""
        self.ready_for_writes()  # (it may create the schema: a write)
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            objects = conn.execute(
                "SELECT count(*) FROM sqlite_schema WHERE name NOT LIKE 'sqlite\\_%' "
                "ESCAPE '\\'").fetchone()[0]
            if version == 0:
                if (app_id != 0 or objects) and self._has_dsh_schema():
                    raise LogCorruptError(
                        f"SQLite database {self.path} has an unversioned schema or application "
                        f"identity (user_version 0, application_id {app_id}) yet holds exactly "
                        f"dsh's schema: its header is damaged (or another program rewrote it); "
                        f"PRAGMA quick_check says: {_quick_check(conn)}", path=self.path)
                if app_id != 0 or objects:
                    raise _foreign_database(self.path, version, app_id, objects)
                # A pristine file: schema 17 by default; 14 when asked, for the published dsh.
                version = self._create_schema
                for statement in (SCHEMA_17_DDL if version == SCHEMA_VERSION
                                  else SCHEMA_14_DDL):
                    conn.execute(statement)
                conn.execute("INSERT INTO persistence_state (singleton, store_id) VALUES (1, ?)",
                             (str(uuid.uuid4()),))
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version = {version}")
                app_id = APPLICATION_ID
            self._check_owned(version, app_id)
            self._cookie = self._ownership_cookie()
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        return int(version)

    def _has_dsh_schema(self) -> bool:
        """Whether the schema objects are exactly dsh's of schema 14 or 17."""
        found = schema_objects(self.conn)
        return any(is_canonical_schema(found, v) for v in READABLE_SCHEMA_VERSIONS)

    def _check_version(self, version: int) -> None:
        if version in READABLE_SCHEMA_VERSIONS:
            return
        if version > SCHEMA_VERSION:
            advice = "it was written by a newer dsh; upgrade dsh to open it"
        else:
            advice = "no upgrade path from that older schema ships with this build"
        raise SessionFormatUnsupportedError(
            f"SQLite database {self.path} has schema version {version}, incompatible with this "
            f"build (reads {LEGACY_SCHEMA_VERSION} and {SCHEMA_VERSION}); {advice}",
            path=self.path, version=version)

    def _check_objects(self, version: int) -> None:
        if not has_canonical_schema(self.conn, version):
            found = schema_objects(self.conn)
            expected = canonical_schema_objects(version)
            extra = sorted({o[1] for o in found} ^ {o[1] for o in expected}) or sorted(
                {o[1] for o in set(found) ^ set(expected)})
            if [o[:3] for o in found] == [o[:3] for o in expected]:
                # the same objects, only their stored SQL text differs: damage (or an edit)
                raise LogCorruptError(
                    f"SQLite database {self.path} does not contain the required schema objects "
                    f"of schema {version}: the stored definition of {', '.join(extra)} differs "
                    f"from dsh's, so the schema text is damaged (or was edited); PRAGMA "
                    f"quick_check says: {_quick_check(self.conn)}", code="SCHEMA_MISMATCH",
                    path=self.path)
            raise PersistenceError(
                f"SQLite database {self.path} does not contain the required schema objects of "
                f"schema {version} (differs in {', '.join(extra)}); dsh refuses any other table, "
                f"index, trigger, view or column", code="SCHEMA_MISMATCH", path=self.path)

    def _ownership_cookie(self) -> tuple[int, int, int]:
        # three plain pragmas, the statements the open prepared (see _OWNERSHIP_PRAGMAS)
        execute = self.conn.execute
        schema, user, application = _OWNERSHIP_PRAGMAS
        return (int(execute(schema).fetchone()[0]), int(execute(user).fetchone()[0]),
                int(execute(application).fetchone()[0]))

    def recheck_ownership(self) -> None:
        """Inside ``BEGIN IMMEDIATE``: app id, user_version and schema unchanged.

        Rule: docs/formats.md#schema-17.

        The full object comparison runs only when the schema cookie moved since it last passed.

        Raises:
            PersistenceError: code SCHEMA_MISMATCH naming what changed before the mutation.
        """
        cookie = self._ownership_cookie()
        if cookie == self._cookie:
            return
        _, version, app_id = cookie
        if app_id != APPLICATION_ID:
            raise PersistenceError(
                f"SQLite database {self.path} application id changed before mutation (found "
                f"{app_id}, expected {APPLICATION_ID})", code="SCHEMA_MISMATCH", path=self.path)
        if version != self.schema_version:
            raise PersistenceError(
                f"SQLite database {self.path} schema changed before mutation (user_version "
                f"{version}, expected {self.schema_version})", code="SCHEMA_MISMATCH",
                path=self.path)
        self._check_objects(self.schema_version)
        self._cookie = cookie

    def _set_journal_mode(self, mode: JournalMode, deadline: float) -> None:
        """``PRAGMA journal_mode``, retried on SQLITE_BUSY every ≤10 ms until ``deadline``."""
        while True:
            try:
                found = self.conn.execute(f"PRAGMA journal_mode = {mode}").fetchone()[0]
                break
            except sqlite3.OperationalError as exc:
                code = getattr(exc, "sqlite_errorcode", None)
                remaining = deadline - time.monotonic()
                if code is None or code & 0xFF != _SQLITE_BUSY or remaining <= 0:
                    raise
                time.sleep(min(JOURNAL_RETRY_PACING_MS / 1000, remaining))
        if str(found).lower() != mode:
            raise PersistenceError(
                f"SQLite database {self.path} kept journal mode {found!r}, expected {mode!r}",
                code="SQLITE", path=self.path)

    def close(self) -> None:
        self.conn.close()


def _sidecar_dir(suffix: str, what: str) -> functools.cached_property[Path]:
    """A backend's folder ``<db><suffix>`` (holding ``what``), made when first asked for."""

    def folder(backend: SqliteBackend) -> Path:
        return backend.path.with_name(backend.path.name + suffix)

    folder.__doc__ = f"``<db>{suffix}``: {what}."
    return functools.cached_property(folder)


def _reaches(row: Row, cut: int) -> bool:
    """Whether stored ``row`` (schema 17 or 14) holds an event at seq ``cut`` or later.

    A packed row (``ignorable`` 0) is decoded for its last member; a row that does not decode
    reaches (fail closed: the full read names it).
    """
    if row[1] >= cut:
        return True
    if row[7] != 0:  # a plain row (schema 14: NULL) holds the one event of its seq
        return False
    try:
        return bool(decode_row(row, SCHEMA_VERSION)[-1]["seq"] >= cut)
    except RowError:
        return True


def _lender(backend: weakref.ref[SqliteBackend]) -> srp.Lender:
    """The page-in pool's lender of ``backend``'s idle connections, while it exists."""

    def lend() -> tuple[sqlite3.Connection, Callable[[bool], None]] | None:
        alive = backend()
        return alive._lend() if alive is not None else None

    return lend


class SqliteBackend:
    """dsh's SQLite session store in one database file (docs/formats.md#sqlite).

    Usage::

        backend = SqliteBackend("/home/me/.dsh/sessions.db")
        backend.create({"version": 0, "id": "s1", "createdAt": 1796030745501})
        with backend.open("s1", "write") as handle:
            handle.append(events)   # one durable transaction
            handle.flush()          # already durable: synchronous = FULL

    Args:
        path: Database file. Its parent is created 0700 and must be ours and not group/world
            writable; the file is created 0600 (dsh refuses anything looser). ``:memory:`` is
            not supported: write locks need a file to sit beside.
        journal_mode: ``wal`` (default, dsh's), ``delete``, ``truncate`` or ``persist``.
        busy_timeout_ms: How long a statement waits for another connection's lock (ms,
            0 to 2^31 - 1; default 5000 like dsh).
        schema: The schema a *new* file is created with: 17 (default, dsh's repository head)
            or 14 (the layout the published ``dsh-session-persistence-sqlite`` 0.0.1-rc.1
            reads: scalar rows, JSON text columns, no packing). An existing file keeps its
            own schema whatever this says.

    Raises:
        ConfigError: a bad option or a path that fails the filesystem preconditions
            (docs/formats.md#file-modes-and-symlinks).

    The database is opened lazily on the first operation (docs/formats.md#files-and-connections). A
    file created here is schema 17 unless ``schema=14``; schema-14 files (published dsh 0.0.1-rc.1)
    are read and appended to in their own scalar layout and never migrated.
    """

    capabilities = Capabilities(restore_points=True, saved_cuts=True, listing=True, ranges=True,
                                after_commit=True, search_index=True, schema_version=True,
                                storable_check=True, torn_tail_hook=True, reseal=True,
                                rewrites=True, scrubs=True, asides=True, change_stamp=True)
    """Restore points (schema 17; a schema-14 file refuses them), saved cuts, listing from its
    tables, a search index beside the file, a schema version (never migrated), and rebuilding
    a lost seal on request."""

    def __init__(self, path: str | os.PathLike[str], *, journal_mode: JournalMode = "wal",
                 busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
                 schema: int = SCHEMA_VERSION) -> None:
        if str(path) == ":memory:" or str(path).startswith("file:"):
            raise ConfigError(f"SQLite path must be a plain file path, got {str(path)!r}; "
                              f"in-memory databases cannot hold cross-process write locks",
                              path=str(path))
        if journal_mode not in JOURNAL_MODES:
            raise ConfigError(f"journal_mode must be one of {', '.join(JOURNAL_MODES)}, got "
                              f"{journal_mode!r}")
        if (type(busy_timeout_ms) is not int
                or not 0 <= busy_timeout_ms <= MAX_BUSY_TIMEOUT_MS):
            raise ConfigError(f"busy_timeout_ms must be an integer in [0, {MAX_BUSY_TIMEOUT_MS}],"
                              f" got {busy_timeout_ms!r}")
        if type(schema) is not int or schema not in READABLE_SCHEMA_VERSIONS:
            raise ConfigError(f"schema must be {SCHEMA_VERSION} (default) or "
                              f"{LEGACY_SCHEMA_VERSION} (readable by the published dsh SQLite "
                              f"backend), got {schema!r}", path=str(path))
        self.schema = schema
        self.path = Path(os.path.abspath(path))
        self.journal_mode: JournalMode = journal_mode
        self.busy_timeout_ms = busy_timeout_ms
        _check_path(self.path)
        self._conn: _Connection | None = None
        self._idle: list[_Connection] = []  # validated connections closed handles left
        # open write handles: a page-in borrows one's connection while the handle is not
        # using it (SqliteHandle._lend), before it would open a read-only connection
        self._writers: weakref.WeakSet[SqliteHandle] = weakref.WeakSet()
        # its sessions' page-ins share read-only connections, or borrow an idle validated one
        # (docs/formats.md#files-and-connections); the pool may outlive this object
        self.page_connections = srp.PageConnections(self.path, _lender(weakref.ref(self)))
        self._mutex = threading.Lock()
        self._closed = False

    @property
    def url(self) -> str:
        """``sqlite:///<absolute path>``."""
        return f"sqlite://{self.path}"

    # The sidecar folders beside the file, each made when first asked for (a path costs what
    # a few statements do, and most opens use one or two of them).
    lock_dir = _sidecar_dir(".dsh-locks", "the session write locks")
    cut_dir = _sidecar_dir(".dsh-cuts", "saved cuts")
    seal_dir = _sidecar_dir(".dsh-seals", "integrity seals and header metadata")
    restore_point_dir = _sidecar_dir(".dsh-checkpoints", "restore points")
    aside_dir = _sidecar_dir(".dsh-asides", "asides")

    def _connect(self) -> _Connection:
        """A validated connection: an idle one a closed handle left, if still valid, else new.

        Opening one runs about twenty statements of pragma and schema checks; a process that
        opens a session to read and then to write (an adapter's cold read, then its resume)
        pays them once (docs/formats.md#files-and-connections).
        """
        while True:
            with self._mutex:
                idle = self._idle.pop() if self._idle else None
            if idle is None:
                return self._new_connection()
            if idle.reusable():
                return idle
            with contextlib.suppress(sqlite3.Error):
                idle.close()

    def _lend(self) -> tuple[sqlite3.Connection, Callable[[bool], None]] | None:
        """A validated connection for one page-in, or None (see ``PageConnections``).

        An idle one, given back to the idle ones after the page-in (closed if it failed); a
        handle that takes it later checks it as it checks any idle one
        (``_Connection.reusable``). Else the connection of an open write handle that is not
        using it (:meth:`SqliteHandle._lend`): a writer's resume pages in the events before
        its restore point's cut on the connection the handle already holds (it took the idle
        one a cold read left), not on a read-only one opened for them.
        """
        with self._mutex:
            if self._closed:
                return None
            if not self._idle or self._idle[-1]._pid != os.getpid():
                writers = list(self._writers)
                idle = None
            else:
                idle = self._idle.pop()
        if idle is None:
            for writer in writers:
                lent = writer._lend()
                if lent is not None:
                    return lent
            return None

        def give_back(ok: bool) -> None:
            if ok:
                self._release(idle)
            else:
                with contextlib.suppress(sqlite3.Error):
                    idle.close()

        return idle.conn, give_back

    def _new_connection(self) -> _Connection:
        return _Connection(self.path, journal_mode=self.journal_mode,
                           busy_timeout_ms=self.busy_timeout_ms, create_schema=self.schema)

    def _release(self, conn: _Connection) -> None:
        """Keep a handle's connection for the next handle (up to :data:`IDLE_CONNECTIONS`)."""
        with self._mutex:
            if not self._closed and len(self._idle) < IDLE_CONNECTIONS \
                    and not conn.conn.in_transaction:
                self._idle.append(conn)
                return
        conn.close()

    @contextlib.contextmanager
    def _shared(self) -> Iterator[_Connection]:
        with self._mutex:
            if self._closed:
                raise PersistenceError(f"SQLite backend for {self.path} is closed",
                                       code="CLOSED", path=str(self.path))
            if self._conn is None:
                conn = self._new_connection()
                try:  # (it creates sessions)
                    conn.ready_for_writes()
                except BaseException:
                    conn.close()
                    raise
                self._conn = conn
            yield self._conn

    def change_stamp(self) -> tuple[int, int]:
        """``PRAGMA data_version`` and ``total_changes`` of the backend's shared connection.

        ``data_version`` moves when any other connection (any process) commits; the changes
        count covers this connection's own writes. Rule: docs/view.md#what-the-viewer-keeps.

        Raises:
            PersistenceError: the backend is closed or the file cannot be read.
        """
        with self._shared() as c:
            try:
                version = c.conn.execute("PRAGMA data_version").fetchone()[0]
            except sqlite3.Error as exc:
                raise PersistenceError(f"cannot read {self.path}: {exc}", code="SQLITE",
                                       path=str(self.path)) from exc
            return int(version), c.conn.total_changes

    @property
    def schema_version(self) -> int:
        """``user_version`` of the file: 17 (created here or by dsh's head) or 14 (published)."""
        with self._shared() as c:
            return c.schema_version

    def search_index(self) -> SearchIndex:
        """The store's search index: the sidecar ``<db>.dsh-search.db`` (docs/stores.md#search).

        Opened on first use; the caller closes it. A file whose header does not carry dsh's
        application id, or that has no index yet, gets the full open check first
        (``schema_version``), so another program's database is refused (``FOREIGN_DATABASE``,
        as ``list`` refuses it) before any index is written beside it, even one that forges
        the id; a marked file with an index is read without a connection of its own.

        Raises:
            PersistenceError: code ``FOREIGN_DATABASE``, and the other errors of opening the file.
        """
        from dsh.persistence._search import SIDECAR_NAME, SidecarIndex, SqliteFreshness

        path = self.path
        sidecar = path.with_name(path.name + SIDECAR_NAME)
        # the header's id is anyone's to write: the first index waits for the full check
        if _header_application_id(path) != APPLICATION_ID or not sidecar.exists():
            self.schema_version  # noqa: B018 - raises for a file that is not dsh's
        return SidecarIndex(sidecar, SqliteFreshness(path))

    def check_storable(self, events: Sequence[Event]) -> None:
        """Refuse, writing nothing, events this file's schema cannot hold (what append would).

        Raises:
            EventRejectedError: as :func:`encode_batch` for this schema (code ``ENVELOPE``),
                e.g. an ignorable event for a schema-14 file.
        """
        encode_batch(events, self.schema_version)

    def create(self, header: Mapping[str, object]) -> None:
        """Store a new session with ``header`` and no events (docs/stores.md#opening-a-store).

        The row gets a fresh incarnation UUID and revision 0, like dsh's first materialization.
        The incarnation is marked as sealed (:func:`sealed_incarnation`) and the session's
        seal, with no record yet, is written and fsynced (its folder too) before the row is
        committed, so a marked session never exists without its seal
        (docs/formats.md#integrity-seals); if that seal cannot be written the row gets an
        unmarked incarnation and the first append seals it. The header's ``metadata`` goes
        to a sidecar beside the database, tied to that incarnation (dsh's schema has no column
        for it: docs/formats.md#header-metadata); other keys than the nine ``SessionHeader``
        fields are not stored.

        Raises:
            SessionExistsError: a session with ``header["id"]`` is already stored.
            EventRejectedError: the header is not a valid ``SessionHeader`` (code HEADER).
            PersistenceError: the database failed or its schema changed (code SCHEMA_MISMATCH).
        """
        values = _header_row(header)
        metadata = normalize_header(header).get("metadata")
        incarnation = sealed_incarnation()
        with self._shared() as c:
            conn = c.conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    c.recheck_ownership()
                    if conn.execute("SELECT 1 FROM sessions WHERE id = ?",
                                    (values[0],)).fetchone():
                        raise SessionExistsError(
                            f"session {values[0]!r} already exists in {self.path}",
                            session_id=values[0], path=str(self.path))
                    incarnation = self._first_seal(values[0], incarnation)
                    if metadata:  # before the row: a crash leaves only an unclaimed file
                        _write_metadata(self._metadata_path(values[0]), incarnation, metadata)
                    conn.execute(
                        f"INSERT INTO sessions ({_SESSION_COLUMNS}) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)",
                        (*values, incarnation))
                    conn.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                _fail(exc, "create", str(self.path), values[0])
        logger.debug("created session %s in %s", values[0], self.path)

    def _first_seal(self, session_id: str, incarnation: str) -> str:
        """Write the empty seal of a new session's row, durably; return the incarnation to use.

        Runs before the row is inserted: a crash leaves a seal whose identity no row has (it
        is ignored, and replaced by the next create of that id). A seal that cannot be written
        gives an unmarked incarnation instead, which promises none
        (docs/formats.md#integrity-seals).
        """
        path = self._seal_path(session_id)
        try:
            if mkdir_private(path.parent, "integrity seals"):
                fsync_folder(path.parent.parent)
            reset_seal(path, _seal_identity(incarnation), [], chain=ChainState([]))
        except Exception as exc:  # the create goes on, unmarked: the first append seals it
            logger.warning("session %s: integrity seal %s could not be created (%s); the "
                           "session is stored without the seal mark and sealed by its first "
                           "append", session_id, path, exc)
            return str(uuid.uuid4())
        return incarnation

    def reseal(self, session_id: str) -> Resealed:
        """Seal the session's committed rows as they are now, under its write lock (explicit).

        What ``dsh verify --reseal`` runs after a seal went missing (``SEAL_MISSING``): the
        rows are read under the format's own rules only, and a fresh seal covering the
        committed ones replaces whatever seal there was. Whatever changed while the seal was
        gone is sealed too; that is why no reader or writer does this by itself
        (docs/formats.md#integrity-seals).

        Returns:
            The seal file's path.

        Raises:
            SessionNotFoundError: no such session. SessionBusyError: a writer holds it.
            LogCorruptError: the rows break the format's rules, or the seal is present and
                readable and the rows fail it (``LOG_CORRUPT``, nothing is sealed:
                :func:`refuse_reseal_over_damage`).
            OSError: the seal could not be written.
        """
        with self.open(session_id, "write") as handle:  # one read: the check's
            read = refuse_reseal_over_damage(handle.read, session_id,
                                             self._seal_path(session_id))
            return handle.reseal_committed(keep=read is not None)

    def seal_chain(self, session_id: str) -> tuple[str, str]:
        """The session's seal and its row's incarnation (see ``Reseals.seal_chain``).

        Raises:
            SessionNotFoundError: no such session.
        """
        with self.open(session_id, "read") as handle:
            _, incarnation, _ = handle._session_row()
            if os.path.lexists(staged_name(self._seal_path(session_id))):
                handle.read()  # a rewrite was killed: the seal that verifies the rows
                return str(handle.seal_used), str(incarnation)
        return str(self._seal_path(session_id)), str(incarnation)

    def exists(self, session_id: str) -> bool:
        """Return whether a session row with this id is stored.

        An id no backend can store (see ``session_id_problem``) is never stored.
        """
        if session_id_problem(session_id) is not None:
            return False
        with self._mutex:
            closed, shared = self._closed, self._conn is not None
        if closed or shared:
            with self._shared() as c:
                return self._stored(c, session_id)
        # no shared connection yet: a validated one borrowed from the idle ones, and left
        # there for the handle that usually follows (a first write's resume or create takes
        # it over instead of validating a second one: docs/formats.md#files-and-connections)
        c = self._connect()
        try:
            return self._stored(c, session_id)
        finally:
            self._release(c)

    def _stored(self, c: _Connection, session_id: str) -> bool:
        try:
            return c.conn.execute("SELECT 1 FROM sessions WHERE id = ?",
                                  (session_id,)).fetchone() is not None
        except sqlite3.Error as exc:
            _fail(exc, "lookup", str(self.path), session_id)

    def list_headers(self) -> Iterator[FrozenDict]:
        """Yield every stored header in row order, without reading events.

        Rule: docs/formats.md#appends-and-reads.

        Raises:
            LogCorruptError: a session row is invalid (docs/formats.md#schema-17).
        """
        with self._shared() as c:
            try:
                rows = c.conn.execute(
                    f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY rowid").fetchall()
            except sqlite3.Error as exc:
                _fail(exc, "list", str(self.path))
        add = self._metadata_of()
        for row in rows:
            header, incarnation, _ = decode_session_row(row, path=str(self.path))
            yield add(header, incarnation)

    def open(self, session_id: str, mode: OpenMode = "read") -> SqliteHandle:
        """Open a stored session for ``"read"`` or exclusive ``"write"``.

        Write ownership is taken first (docs/rules.md#resume: before any read), with a non-blocking
        lock on ``<db>.dsh-locks/<percent-encoded id>.lock``.

        Raises:
            ConfigError: ``mode`` is not ``"read"`` or ``"write"``.
            SessionBusyError: ``"write"`` and another thread or process holds the session
                (``where``: pid, host, since in epoch ms).
            SessionNotFoundError: no such session.
            ConfigError: code ``INVALID_ID``: no backend can store this id.
        """
        if mode not in ("read", "write"):
            raise ConfigError(f"open mode must be 'read' or 'write', got {mode!r}")
        check_session_id(session_id)
        if self._closed:
            raise PersistenceError(f"SQLite backend for {self.path} is closed", code="CLOSED",
                                   path=str(self.path))
        lock = self._take_lock(session_id) if mode == "write" else None
        try:
            return SqliteHandle(self, session_id, mode, lock)
        except BaseException:
            if lock is not None:
                lock.release()
            raise

    def inject_torn_tail(self, session_id: str) -> None:
        """Test hook: add a row with invalid JSON after the last row (docs/rules.md#persistence).

        Plays the part of external damage after the committed log (normal SQLite operation
        never leaves a torn row). Raises SessionNotFoundError for an unknown id.
        """
        with self.open(session_id) as handle:
            events = handle.read().events
        next_seq = events[-1]["seq"] + 1 if events else 0
        time_ms = events[-1]["time"] if events else 0
        with self._shared() as c:
            try:
                c.conn.execute("BEGIN IMMEDIATE")
                c.conn.execute(
                    "INSERT INTO events (session_id, seq, type, time, data) "
                    "VALUES (?, ?, 'request/header', ?, '{\"header\":')",
                    (session_id, next_seq, time_ms))
                c.conn.execute("UPDATE sessions SET revision = revision + 1 WHERE id = ?",
                               (session_id,))
                c.conn.execute("COMMIT")
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):
                    c.conn.execute("ROLLBACK")
                _fail(exc, "torn-tail injection", str(self.path), session_id)

    def _save_cut(self, session_id: str, rows: Sequence[Row]) -> Path:
        """Save rows a torn-tail repair is about to delete, one JSON object a line.

        The file is ``<db>.dsh-cuts/<encoded id>.torn-<UTC time>-<pid>`` (folder 0700); the
        columns are those of ``events`` (BLOB values as ``{"hex": ...}``).

        Raises:
            OSError: the file could not be written (then nothing is deleted).
        """
        from dsh.persistence._salvage import save_cut  # (only a torn tail's repair saves)

        def plain(value: object) -> object:
            return {"hex": value.hex()} if isinstance(value, bytes) else value

        names = ("rowid", "seq", "type", "time", "data", "source_event_seqs", "surface_op",
                 "ignorable")
        lines = [std_json.dumps(dict(zip(names, map(plain, row), strict=False)),
                                ensure_ascii=True) for row in rows]
        mkdir_private(self.cut_dir, "saved torn rows")
        return save_cut(self.cut_dir, _cut_stem(session_id),
                        "".join(line + "\n" for line in lines).encode("ascii"))

    def _seal_path(self, session_id: str) -> Path:
        return self.seal_dir / f"{_cut_stem(session_id)}.seal"

    def _metadata_path(self, session_id: str) -> Path:
        return self.seal_dir / f"{_cut_stem(session_id)}.meta"

    def _metadata_of(self) -> Callable[[FrozenDict, str], FrozenDict]:
        """For a listing: adds each header's metadata, the sidecars found by one scan."""
        try:
            with os.scandir(self.seal_dir) as it:
                names = {entry.name for entry in it if entry.name.endswith(".meta")}
        except FileNotFoundError:
            names = set()

        def add(header: FrozenDict, incarnation: str) -> FrozenDict:
            if not names:
                return header
            name = f"{_cut_stem(str(header['id']))}.meta"
            if name not in names:
                return header
            return _with_metadata(header, incarnation, self.seal_dir / name)

        return add

    def list_entries(self, read: ReadFn) -> tuple[list[ListingEntry], list[DshError]]:
        """Entries of every session from a few queries over the store's tables.

        The sessions rows give the headers; the last physical row of each session gives the
        event count and last time (a packed row: its last member); the rows of
        ``turn/start``, ``session/title``, appended ``user/message`` and ``import/source``
        give the rest. Only those rows are decoded, never a whole log. A session whose needed
        rows do not decode (a torn or damaged tail) is read in full through ``read``, which
        names the damage or excludes the torn row exactly as a read does.

        Returns:
            The entries of sessions with at least one event, and one error per log that
            could not be read (``where["session_id"]`` names it).

        Raises:
            LogCorruptError: a sessions row is invalid.
            PersistenceError: the database failed.
        """
        # (the listing loads here: a session's open, read and append never list)
        from dsh.persistence.sqlite._listing import list_entries

        return list_entries(self, read)

    def list_activity(self, read: ReadFn) -> tuple[list[tuple[FrozenDict, int]], list[DshError]]:
        """``(header, last_activity_ms)`` of every session: two queries, no event decoded.

        Every sessions row is validated, those without events too, as every listing does
        (docs/formats.md#schema-17): SQLite evaluates
        :data:`~dsh.persistence.sqlite._schema.SESSION_ROW_CHECK_SQL` over them and returns
        the rows it does not vouch for, which go through ``decode_session_row`` (an invalid
        one raises ``LogCorruptError``); the headers of the others are built unchecked. The
        second query reads, in the same transaction, each row's session's last physical row
        by its primary key: its time, or for a packed row its last member's (the only row
        decoded), as :meth:`list_entries` computes them. A session whose last row does not
        decode is read in full through ``read``.
        """
        from dsh.persistence.sqlite._listing import list_activity  # (see list_entries)

        return list_activity(self, read)

    def removal_events(self, session_ids: Sequence[str]
                       ) -> dict[str, Sequence[Mapping[str, Any]] | None]:
        """The sessions among ``session_ids`` whose log may have taken a message off the view.

        One query over the events rows of those sessions picks the ones holding a quarantine
        record or an ``assistant/message`` / ``tool/result`` replace
        (:data:`~dsh.persistence._listing.MAY_REMOVE_SQL`); for each, the rows with a surface
        op and the quarantine records are decoded (as the listing titles them), not the
        whole log; a row that does not decode gives None (the caller reads the log whole).
        Contract: :class:`~dsh.persistence._search.KnowsRemovals`.

        Raises:
            PersistenceError: the database failed.
        """
        from dsh.persistence.sqlite._listing import removal_events  # (see list_entries)

        return removal_events(self, session_ids)

    # --- asides (docs/stores.md#asides) -------------------------------------------------

    def read_aside(self, session_id: str, name: str, *, head: bool = False) -> bytes | None:
        """``<db>.dsh-asides/<encoded id>/<name>`` (``head``: its head), or None when not there."""
        return read_aside_file(self.aside_dir / _cut_stem(session_id), name, head=head)

    def write_aside(self, session_id: str, name: str, data: bytes) -> None:
        """Replace ``<db>.dsh-asides/<encoded id>/<name>`` (renamed into place, no fsync)."""
        mkdir_private(self.aside_dir, "asides")
        write_aside_file(self.aside_dir / _cut_stem(session_id), name, data)

    def drop_asides(self, session_id: str) -> None:
        """Delete ``<db>.dsh-asides/<encoded id>/`` and what it holds."""
        drop_aside_files(self.aside_dir / _cut_stem(session_id))

    def saved_cuts(self, session_id: str) -> list[str]:
        """Paths of the files holding rows a torn-tail repair cut from this session.

        Oldest first (``<db>.dsh-cuts/<encoded id>.torn-<UTC time>-<pid>``); empty when none.
        """
        from dsh.persistence._salvage import list_cuts  # (only a repair or a listing of cuts)

        return [str(p) for p in list_cuts(self.cut_dir, _cut_stem(session_id))]

    def _take_lock(self, session_id: str) -> SessionLock:
        """Acquire the session's write lock without waiting for its holder.

        A holder writes its ``.owner`` sidecar just after acquiring; a refusal that could not
        name the holder yet is retried for up to :data:`OWNER_WAIT_MS` so the error says who.
        """
        path = self.lock_dir / lock_file_name(session_id)
        deadline = time.monotonic() + OWNER_WAIT_MS / 1000
        while True:
            try:
                return SessionLock(path, session_id)
            except SessionBusyError as exc:
                if "pid" in exc.where or time.monotonic() >= deadline:
                    raise
                time.sleep(0.002)

    def close(self) -> None:
        """Close the backend's own and idle connections (open handles keep theirs); idempotent."""
        with self._mutex:
            self._closed = True
            idle, self._idle = self._idle, []
            if self._conn is not None:
                idle.append(self._conn)
                self._conn = None
        for conn in idle:
            conn.close()

    def __enter__(self) -> SqliteBackend:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _holding(method: Callable[Concatenate[SqliteHandle, _P], _R]
             ) -> Callable[Concatenate[SqliteHandle, _P], _R]:
    """Run a handle method holding its connection, so no page-in borrows it meanwhile.

    Any method but :meth:`SqliteHandle.append` first ends a held resume transaction
    (:meth:`SqliteHandle.hold_for_append`): only the append it was opened for commits in it.
    """
    ends_hold = method.__name__ != "append"

    @functools.wraps(method)
    def run(self: SqliteHandle, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._use:
            if ends_hold and self._held:
                self._end_hold()
            self._users += 1
            try:
                return method(self, *args, **kwargs)
            finally:
                self._users -= 1

    return run


class SqliteHandle(HandleBase):
    """An open session of a :class:`SqliteBackend`.

    Rule: docs/stores.md#the-backend-contract, docs/rules.md#resume.

    Used from one thread at a time; it owns one SQLite connection. A ``"write"`` handle holds
    the session's exclusive lock until :meth:`close`, and lends its connection to a page-in
    of its store while none of its methods is running and no transaction is open
    (:meth:`_lend`). Obtain it from :meth:`SqliteBackend.open`.
    """

    def __init__(self, backend: SqliteBackend, session_id: str, mode: OpenMode,
                 lock: SessionLock | None) -> None:
        self._backend = backend
        self._id = session_id
        self._mode: OpenMode = mode
        self._lock = lock
        self._path = str(backend.path)
        self._torn_seq: int | None = None
        self._committed_revision: int | None = None
        # after our last commit: (PRAGMA data_version, revision, incarnation, next seq). While
        # data_version stays put no other connection has committed, so the stored tail, the
        # session row and the schema are exactly as that commit left them.
        self._quiet: tuple[int, int, str, int] | None = None
        # write handles: the valid seal records (None until loaded), and whether the next
        # seal write replaces the file (the first one does: a crash may have left garbage)
        self._seals: list[tuple[int, int, int]] | None = None
        # write handles: the seal's hash chain, loaded with the records
        # (docs/formats.md#the-seal-chain)
        self._chain: ChainState | None = None
        self._seal_rewrite = True
        # set after a resume through a restore point whose seal records before its cut were
        # checked by digest, not read: ``_seals`` and ``_chain`` hold the ones after it, and
        # a rewrite of the seal reads them first (``_unelide``)
        self._seal_cut: SealCut | None = None
        # the restore point digests the seal records (kept when the seal is rewritten)
        self._restore_marks: list[bytes] = []
        # the committed prefix last read or written: (event count, incarnation, last row digest)
        self._durable: tuple[int, str, str] | None = None
        # the sidecar paths, named once (the id's encoding and the folder joins are a cold
        # read's work each time otherwise), each parsed from its text: the same paths as
        # ``seal_dir / name`` without pathlib's two steps a join (0.03 ms of a cold open)
        stem = _cut_stem(session_id)
        db = self._path  # (absolute: SqliteBackend makes it so)
        self._seal_file = Path(f"{db}.dsh-seals/{stem}.seal")
        self._metadata_file = Path(f"{db}.dsh-seals/{stem}.meta")
        self._restore_point_file = Path(f"{db}.dsh-checkpoints/{stem}.ckpt")
        # the last session row read and its decode: an open reads the row again inside the
        # read's transaction, and equal values decode alike (the row is still read and compared)
        self._row_seen: tuple[tuple[Any, ...], tuple[FrozenDict, str, int]] | None = None
        # what the open's session-row read returned, header metadata included: served once,
        # to the next read of that same row (the read the open precedes), not probed again
        self._at_open: tuple[FrozenDict, str, int] | None = None
        # the seal file the last read verified the rows with: the seal, or the one a rewrite
        # staged when it was killed after its commit (_adopt_staged_seal)
        self._seal_used = self._seal_file
        self._seal_fd: int | None = None  # kept open between appends (see _seal)
        self._incarnation_kept: tuple[str, bytes] | None = None  # see _incarnation_bytes
        # hold_for_append: the next restore-point read opens BEGIN IMMEDIATE (_hold_next),
        # which stays open (_held) until the append that commits in it, or is ended
        self._hold_next = False
        self._held = False
        # post-commit steps (seal, restore-point anchor): contained and reported, never raised
        self.after_commit = AfterCommit(session_id)
        self._closed = False
        # held by every method that uses the connection, and by a page-in it is lent to
        self._use = threading.RLock()
        # methods running and loans out, under ``_use``: the lock is reentrant, so taking it
        # does not show whether this thread is already inside a method (or lent it)
        self._users = 0
        self._c = backend._connect()
        try:
            if mode == "write":
                self._c.ready_for_writes()
            self._at_open = self._session_row()
        except BaseException:
            backend._release(self._c)
            raise
        if mode == "write":
            with backend._mutex:
                backend._writers.add(self)

    def _lend(self) -> tuple[sqlite3.Connection, Callable[[bool], None]] | None:
        """This write handle's connection for one page-in of its store, or None.

        Only while the handle is open, none of its methods runs, on any thread, this one
        included, and no other loan is out (its lock is free, taken without waiting: a
        page-in never waits for an append), and the connection is
        outside any transaction, or inside the held resume transaction
        (:meth:`hold_for_append`: the page-in then reads the very rows the append builds
        on, under its write lock), in the process that opened it. The page-in holds the
        handle's lock until it gives the connection back, so an append waits for it (one
        indexed range query). A page-in only reads (in autocommit, or inside the held
        transaction, which it neither commits nor ends), and the rows it reads
        are below a restore point's cut: committed, and checked against the seal
        (docs/rules.md#verified-page-in). A failed page-in leaves the connection to the
        handle, which checks it as it always does (its next append re-derives the stored
        tail in its transaction).
        """
        if not self._use.acquire(blocking=False):
            return None
        if (self._users > 0 or self._closed or self._c._pid != os.getpid()
                or (self._c.conn.in_transaction and not self._held)):
            self._use.release()  # (a method runs on this very thread, or a loan is out)
            return None
        self._users += 1

        def give_back(ok: bool) -> None:
            self._users -= 1
            self._use.release()

        return self._c.conn, give_back

    @property
    def session_id(self) -> str:
        """The session id this handle was opened for."""
        return self._id


    @property
    def schema_version(self) -> int:
        """``user_version`` of the file: 14 or 17."""
        return self._c.schema_version

    def _session_row(self) -> tuple[FrozenDict, str, int]:
        """The session's header (with its sidecar metadata), incarnation and revision, validated.

        Raises:
            SessionNotFoundError: no row; LogCorruptError: an invalid row or sidecar.
        """
        try:
            row = self._c.conn.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?",
                                       (self._id,)).fetchone()
        except sqlite3.Error as exc:
            _fail(exc, "read", self._path, self._id)
        if row is None:
            self._refuse_hidden_session()
            raise SessionNotFoundError(f"session {self._id!r} is not stored in {self._path}",
                                       session_id=self._id, path=self._path)
        seen = self._row_seen
        at_open, self._at_open = self._at_open, None
        # the same values of the same types (1 == 1.0, but only the int passes): the same decode
        if seen is not None and seen[0] == row and list(map(type, seen[0])) == list(map(type, row)):
            if at_open is not None:
                # The open read this very row a moment ago, and its sidecar: the sidecar
                # belongs to the row's incarnation (written once, by the create that made
                # it), so that read's header, checked then, is this one (docs/formats.md#
                # header-metadata). Once only: any later read probes the sidecar again.
                return at_open
            header, incarnation, revision = seen[1]
        else:
            decoded = decode_session_row(row, path=self._path)
            self._row_seen = (row, decoded)
            header, incarnation, revision = decoded
        return (_with_metadata(header, incarnation, self._metadata_file),
                incarnation, revision)

    def _refuse_hidden_session(self) -> None:
        """Raise if the session exists though its index lookup found no row (damage).

        Checked only on the not-found path, by a scan of ``sessions`` that bypasses the index.

        Raises:
            LogCorruptError: the row exists.
        """
        conn = self._c.conn
        try:
            hidden = conn.execute("SELECT count(*) FROM sessions NOT INDEXED WHERE id = ?",
                                  (self._id,)).fetchone()[0]
        except sqlite3.Error as exc:
            _fail(exc, "read", self._path, self._id)
        if hidden:
            raise LogCorruptError(
                f"corrupt session store {self._path}: the index lookup of session "
                f"{self._id!r} finds no row, but a scan of the sessions table finds it (a "
                f"damaged index); PRAGMA quick_check says: {_quick_check(conn)}",
                path=self._path, session_id=self._id)

    def _check_header_version(self, header: FrozenDict) -> None:
        version = header["version"]
        if version == SESSION_FORMAT_VERSION:
            return
        if version > SESSION_FORMAT_VERSION:
            advice = (f"it was written by a newer harness (v{version}, this build reads "
                      f"v{SESSION_FORMAT_VERSION}); upgrade dsh to open it")
        else:
            advice = (f"its format v{version} is older than v{SESSION_FORMAT_VERSION} and no "
                      f"upgrade path ships with this build")
        raise SessionFormatUnsupportedError(
            f"session {self._id!r} in {self._path} cannot be read: {advice}",
            session_id=self._id, path=self._path, version=version)

    def _ensure_open(self) -> None:
        if self._closed:
            raise PersistenceError(f"handle for session {self._id!r} is closed",
                                   code="HANDLE_CLOSED",
                                   session_id=self._id, path=self._path)

    @_holding
    def last_stored_seq(self) -> int:
        """The seq of the last stored row (a packed row's first member), -1 for none.

        Contract: :class:`~dsh.persistence._contract.ReadsRanges` (one indexed lookup).

        Raises:
            PersistenceError: the database failed.
        """
        self._ensure_open()
        try:
            row = self._c.conn.execute("SELECT max(seq) FROM events WHERE session_id = ?",
                                       (self._id,)).fetchone()
        except sqlite3.Error as exc:
            _fail(exc, "read", self._path, self._id)
        return int(row[0]) if row is not None and is_safe_int(row[0]) else -1

    def range_source(self, cut: int) -> Any:
        """The events ``0 .. cut - 1`` paged from the database (None for schema 14).

        Contract: :class:`~dsh.persistence._contract.ReadsRanges`.
        """
        if self._c.schema_version == LEGACY_SCHEMA_VERSION:
            return None
        return srp.SqlitePrefixSource(self._backend.path, self._id, cut,
                                      connections=self._backend.page_connections)

    def _rows_from(self, base: int) -> list[Row]:
        columns = _LEGACY_ROW_COLUMNS if self._c.schema_version == LEGACY_SCHEMA_VERSION \
            else ROW_COLUMNS
        rows: list[Row] = self._c.conn.execute(
            f"SELECT {columns} FROM events WHERE session_id = ? AND seq >= ? ORDER BY seq",
            (self._id, base)).fetchall()
        return rows

    def _suffix_base(self, from_seq: int) -> int:
        """Lower ``from_seq`` to any packed row that may cover it.

        Rule: docs/formats.md#appends-and-reads.
        """
        if from_seq == 0 or self._c.schema_version == LEGACY_SCHEMA_VERSION:
            return from_seq
        base = from_seq
        for row in self._c.conn.execute(
                _PACKED_PREDECESSORS,
                (self._id, max(0, from_seq - (MAX_PACKED_ROW_MEMBERS - 1)), from_seq)):
            if _reaches(row, from_seq):
                base = min(base, row[1])
        return base

    def _revision(self, incarnation: str, revision: int) -> str:
        return f"{self._c.store_identity}:incarnation:{incarnation}:revision:{revision}"

    @_holding
    def read(self, offset: int = 0) -> ColdRead:
        """Read the header and the committed events with ``seq >= offset``.

        Rule: docs/formats.md#appends-and-reads.

        One consistent snapshot (a read transaction). Schema-17 suffix reads start at the
        packed row covering ``offset`` without scanning earlier history.

        Args:
            offset: First event seq wanted (an event seq), a non-negative integer.

        Returns:
            ColdRead: header (known keys, NULL columns omitted), events (packed rows expanded),
            ``torn`` (``TornTail(byte_offset=None, line=<rowid>, reason)``) or ``None``, and
            revision ``file:<dev>:<ino>:store:<uuid>:incarnation:<uuid>:revision:<n>``.

        Raises:
            ConfigError: ``offset`` is not a non-negative integer.
            LogCorruptError: an undecodable row precedes the last intact ``turn/end``, or a
                session row is invalid.
            SessionFormatUnsupportedError: the header version is not 0.
            SessionNotFoundError: the session row is gone.
            PersistenceError: the database failed (code SQLITE / DATABASE_BUSY / CLOSED).
        """
        self._ensure_open()
        if not is_safe_int(offset) or offset < 0:
            raise ConfigError(f"read offset must be a non-negative safe integer event seq, got "
                              f"{offset!r}", session_id=self._id)
        self._quiet = None  # the next append re-derives the stored tail in full
        conn = self._c.conn
        # read before the rows: the log only grows under a writer, so every sealed batch is
        # then among the rows read
        seal = read_seal(self._seal_file)
        try:
            conn.execute("BEGIN")
            try:
                header, incarnation, revision = self._session_row()
                base = self._suffix_base(offset)
                rows = self._rows_from(base)
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            _fail(exc, "read", self._path, self._id)
        self._check_header_version(header)
        seal = self._own_seal(seal, incarnation)
        scan = scan_rows(rows, base, self._c.schema_version, path=self._path,
                         session_id=self._id)
        self._seal_used = self._seal_file
        if seal is not None:  # after the scan, whose errors name the row more precisely
            try:
                check_row_seals(rows, seal, base=base, describe=lambda: _quick_check(conn),
                                where=self._path, session_id=self._id)
            except LogCorruptError:
                seal = self._adopt_staged_seal(rows, base, incarnation)
                if seal is None:
                    raise
        if self._mode == "write" and base == 0:
            self._drop_staged_seal()
        if self._mode == "write":
            self._seals = seal.records if seal is not None else []
            self._restore_marks = list(seal.restore_points) if seal is not None else []
            self._chain = seal.chain_state() if seal is not None else ChainState([])
            self._seal_cut = None
        events = scan.events
        if base < offset:
            events = [e for e in events if e["seq"] >= offset]
        torn = None
        if scan.torn_seq is not None:
            torn = TornTail(byte_offset=None, line=scan.torn_rowid,
                            reason=scan.torn_reason or "torn row")
            logger.warning("session %s in %s has a torn tail at seq %s (rowid %s)", self._id,
                           self._path, scan.torn_seq, scan.torn_rowid)
        self._torn_seq = scan.torn_seq
        if offset == 0 and torn is None and rows:
            self._durable = (len(events), incarnation, srp.last_row_digest(rows[-1][1:]))
        # scan_rows took every row at the next seq from 0 (a packed row's members at seq0 + k)
        whole = base == 0 and offset == 0
        return ColdRead(header=header, events=tuple(events), torn=torn,
                        revision=self._revision(incarnation, revision),
                        prescan=scan.prescan if whole else None, contiguous=whole)

    def _stored_next_seq(self, unchanged_since_our_commit: bool) -> int:
        """Inside ``BEGIN IMMEDIATE``: the seq the stored log continues at.

        Rule: docs/formats.md#appends-and-reads.

        Always decodes the last two rows. When the session's revision moved since this
        handle's last commit (another writer, or our first append), it also looks back for a
        packed row that may cover them, as dsh does (docs/formats.md#appends-and-reads); when it did
        not, the rows are the ones we wrote and that ~1000-row look-back is skipped. A torn tail is
        deleted only if this handle's last :meth:`read` reported the same one and a full re-scan
        under the write lock still finds it.
        """
        conn = self._c.conn
        legacy = self._c.schema_version == LEGACY_SCHEMA_VERSION
        columns = _LEGACY_ROW_COLUMNS if legacy else ROW_COLUMNS
        tail: list[Row] = conn.execute(
            f"SELECT {columns} FROM events WHERE session_id = ? ORDER BY seq DESC LIMIT 2",
            (self._id,)).fetchall()
        if not tail:
            return 0
        tail.reverse()
        if not is_safe_int(tail[0][1]):
            base = 0
        elif unchanged_since_our_commit:
            base = tail[0][1]
        else:
            base = self._suffix_base(tail[0][1])
        rows = tail if base == tail[0][1] else self._rows_from(base)
        scan = scan_rows(rows, base, self._c.schema_version, path=self._path,
                         session_id=self._id)
        if scan.torn_seq is None and len(scan.events) > 0:
            return int(scan.events[-1]["seq"]) + 1
        full = scan_rows(self._rows_from(0), 0, self._c.schema_version, path=self._path,
                         session_id=self._id)
        if full.torn_seq is None:
            return len(full.events)
        if self._torn_seq != full.torn_seq:
            raise LogCorruptError(
                f"session {self._id!r} in {self._path} has an invalid physical tail at seq "
                f"{full.torn_seq} ({full.torn_reason}); read() it through this write handle "
                f"before appending so the torn tail can be removed", path=self._path,
                seq=full.torn_seq, session_id=self._id)
        saved = self._backend._save_cut(self._id, conn.execute(
            f"SELECT {columns} FROM events WHERE session_id = ? AND seq >= ? ORDER BY seq",
            (self._id, full.torn_seq)).fetchall())
        conn.execute("DELETE FROM events WHERE session_id = ? AND seq >= ?",
                     (self._id, full.torn_seq))
        logger.warning("removed torn tail of session %s in %s from seq %s (rows saved to %s)",
                       self._id, self._path, full.torn_seq, saved)
        self._torn_seq = None
        return len(full.events)

    @_holding
    def append(self, events: Sequence[Event]) -> None:
        """Append one batch as one durable ``BEGIN IMMEDIATE`` transaction.

        Rule: docs/formats.md#appends-and-reads.

        The stored tail is re-derived inside the transaction; the first event's seq must equal
        the stored next seq (a stale writer — another process or dsh itself — is refused and
        nothing is written). Schema 17 packs chunk runs of this batch (docs/formats.md#schema-17);
        schema 14 writes one JSON-text row per event. On return the batch is durable (synchronous =
        FULL).

        Args:
            events: Events in seq order, contiguous; empty is a no-op.

        Raises:
            PersistenceError: read-only or closed handle (code READ_ONLY / HANDLE_CLOSED), a
                batch that is not contiguous or does not continue the stored tail (code
                SEQ_MISMATCH), or the database failed.
            LogCorruptError: the stored tail is damaged and was not seen by :meth:`read`.
            EventRejectedError: an envelope a row cannot hold (code ENVELOPE).
            InvalidJsonError: a payload is not lossless JSON.
            SessionNotFoundError: the session row is gone.
        """
        self._ensure_open()
        if self._mode != "write":
            raise PersistenceError(f"cannot append to session {self._id!r} through a read "
                                   f"handle; open it with mode 'write'", code="READ_ONLY",
                                   session_id=self._id, path=self._path)
        if not events:
            return
        events = self._admit(events)
        first = int(events[0]["seq"])
        # the chain record's key drawn now: the rows and the batch's digest in one pass
        batch_key = os.urandom(16)
        rows, digest = encode_sealed_batch(events, self._c.schema_version, batch_key)
        c = self._c
        conn = c.conn
        legacy = c.schema_version == LEGACY_SCHEMA_VERSION
        held, self._held = self._held, False
        bulk = len(rows) >= BULK_APPEND_ROWS  # an import's batch: checkpoints 8x fewer
        try:
            if not held:
                conn.execute("BEGIN IMMEDIATE")
            try:
                if bulk:
                    _bulk_checkpoints(conn, True)
                quiet, self._quiet = self._quiet, None
                # held: the resume read the session row and the tail, and checked them, in
                # this transaction (_load_tail): nothing else committed since
                data_version = quiet[0] if held and quiet is not None \
                    else conn.execute("PRAGMA data_version").fetchone()[0]
                if quiet is not None and quiet[0] == data_version:
                    found = (quiet[1], quiet[2])  # nothing committed since our last append
                    revision, next_seq = quiet[1], quiet[3]
                else:
                    c.recheck_ownership()
                    found = conn.execute("SELECT revision, incarnation FROM sessions WHERE "
                                         "id = ?", (self._id,)).fetchone()
                    if found is None:
                        self._refuse_hidden_session()
                        raise SessionNotFoundError(
                            f"session {self._id!r} metadata row is missing in {self._path}",
                            session_id=self._id, path=self._path)
                    revision = found[0]
                    next_seq = self._stored_next_seq(revision == self._committed_revision)
                sealed_end = self._sealed_end(str(found[1]))
                if next_seq < sealed_end or (first > next_seq
                                             and _quick_check(conn) != "ok"):
                    raise LogCorruptError(
                        f"corrupt session log {self._id!r} in {self._path}: the stored log "
                        f"continues at seq {next_seq}, but {max(sealed_end, first)} events were "
                        f"committed; committed rows are missing or hidden by a damaged index; "
                        f"PRAGMA quick_check says: {_quick_check(conn)}", path=self._path,
                        session_id=self._id, seq=next_seq)
                if first != next_seq:
                    raise PersistenceError(
                        f"append seq mismatch for session {self._id!r} in {self._path}: append "
                        f"starts at seq {first}, stored next seq is {next_seq}; another writer "
                        f"moved the log (stale writer), nothing was written",
                        code="SEQ_MISMATCH",
                        session_id=self._id, seq=first, path=self._path)
                # the rows another writer (dsh) added since the last seal are sealed with ours
                gap = conn.execute(
                    f"SELECT {_LEGACY_ROW_COLUMNS if legacy else ROW_COLUMNS} FROM events "
                    f"WHERE session_id = ? AND seq >= ? AND seq < ? ORDER BY seq",
                    (self._id, sealed_end, first)).fetchall() if sealed_end < first else []
                _insert_rows(conn, self._id, rows, legacy)
                conn.execute("UPDATE sessions SET revision = ? WHERE id = ?",
                             (revision + 1, self._id))
                conn.execute("COMMIT")
                self._committed_revision = revision + 1
                self._quiet = (data_version, revision + 1, str(found[1]), first + len(events))
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            _fail(exc, "append", self._path, self._id)
        finally:
            if bulk:  # the default back (committed or not: a failure here changes timing only)
                with contextlib.suppress(sqlite3.Error):
                    _bulk_checkpoints(conn, False)
        # COMMITted: nothing below may fail this append (docs/rules.md#commit-means-committed)
        incarnation = str(found[1])
        stored = [(*r[:6], None) for r in rows] if legacy else rows

        def seal() -> None:
            if self._chain is not None:
                if digest is not None and not self._chain.pending:
                    self._chain.digested = (first, first + len(events), batch_key, digest)
                self._chain.pending.extend(events)
            self._seal([*(row[1:] for row in gap), *stored] if gap else stored, sealed_end,
                       first + len(events), incarnation)

        def unsealed() -> None:  # the next append rewrites the seal; until then these rows
            self._seal_rewrite = True  # are read unsealed (by the format rules)

        def anchor() -> None:
            self._durable = (first + len(events), incarnation, srp.last_row_digest(stored[-1]))

        def no_anchor() -> None:
            self._durable = None

        self.after_commit.run("seal", seal, f"the next append rewrites the integrity seal "
                                            f"{self._seal_file} whole", unsealed)
        self.after_commit.run("anchor", anchor, "no restore point is written until the next "
                                                "read or append gives an anchor", no_anchor)
        logger.debug("appended %d events (%d rows) to session %s", len(events), len(rows),
                     self._id)

    def _sealed_end(self, incarnation: str) -> int:
        """End seq of the sealed prefix (loads the seal on a handle's first append)."""
        if self._seals is None:
            seal = self._own_seal(read_seal(self._seal_file), incarnation)
            if os.path.lexists(staged_name(self._seal_file)):  # a rewrite was killed
                rows = self._rows_from(0)
                try:
                    if seal is None:
                        raise LogCorruptError("no seal")
                    check_row_seals(rows, seal, base=0, describe=lambda: "not run",
                                    where=self._path, session_id=self._id)
                except LogCorruptError:
                    seal = self._adopt_staged_seal(rows, 0, incarnation) or seal
                self._drop_staged_seal()
            self._seals = seal.records if seal is not None else []
            self._restore_marks = list(seal.restore_points) if seal is not None else []
            self._chain = seal.chain_state() if seal is not None else ChainState([])
            self._seal_cut = None
        if self._seals:
            return self._seals[-1][1]
        return self._seal_cut.end if self._seal_cut is not None else 0

    @property
    def seal_used(self) -> Path:
        """The seal file the last read verified the rows with (the seal, or a staged one)."""
        return self._seal_used

    def _adopt_staged_seal(self, rows: Sequence[Row], base: int, incarnation: str
                           ) -> Seal | None:
        """The seal a rewrite staged, if it verifies ``rows`` (read from seq ``base``).

        A rewrite killed between its commit and renaming its staged seal into place leaves the
        new rows beside the old seal (docs/formats.md#integrity-seals); a writer that read
        from seq 0 renames the staged seal into place. A rewrite finishing while this handle
        read is the same case with the seal already renamed: it is read again.

        Raises:
            OSError: a writer could not rename the staged seal into place.
        """
        identity = _seal_identity(incarnation)
        for candidate in (staged_name(self._seal_file), self._seal_file):
            try:
                seal = read_seal(candidate)
                if seal is None or seal.identity != identity:
                    continue
                check_row_seals(rows, seal, base=base, describe=lambda: "not run",
                                where=self._path, session_id=self._id)
            except LogCorruptError:
                continue
            if candidate != self._seal_file:
                if self._mode == "write" and base == 0:
                    install_seal(candidate, self._seal_file)
                    seal.path = self._seal_file
                    logger.warning("session %s: adopted the integrity seal %s that an "
                                   "interrupted rewrite staged for %s", self._id, candidate,
                                   self._path)
                else:
                    self._seal_used = candidate
            return seal
        return None

    def _drop_staged_seal(self) -> None:
        """Delete the seal a killed rewrite staged and never installed (one ``unlink``)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged_name(self._seal_file))

    def _own_seal(self, seal: Seal | None, incarnation: str) -> Seal | None:
        """The seal if it was written for this incarnation, else None; never None if marked.

        Raises:
            LogCorruptError: code ``SEAL_MISSING``: the incarnation says the session is sealed
                (:func:`is_sealed_incarnation`) and its seal is gone, emptied or another's
                (docs/formats.md#integrity-seals).
        """
        if seal is not None and seal.identity != _seal_identity(incarnation):
            seal = None  # written for an earlier session of the same id
        if seal is None and is_sealed_incarnation(incarnation):
            raise SealDamagedError(
                f"integrity seal {self._seal_file} of session {self._id!r} is missing, but the "
                f"session's row in {self._path} says its writer sealed it: its rows cannot be "
                f"verified, so they are neither read nor sealed again; restore the seal from a "
                f"backup, or accept the rows as they are now with 'dsh verify --reseal "
                f"{self._id}'", code="SEAL_MISSING", path=str(self._seal_file),
                session_id=self._id)
        return seal

    @_holding
    def reseal_committed(self, *, keep: bool = False) -> Resealed:
        """Seal this session's committed rows as they are now (:meth:`SqliteBackend.reseal`).

        With ``keep`` (this handle's last read passed the present seal), the seal is kept with
        its records and chain: as it is when it covers every committed row and chains every
        event; else extended by records over the committed rows past its last record and one
        chain record for the events past its chain's end, so a proof kept before still holds.
        Otherwise (a lost, damaged or chainless seal) the seal is rebuilt with a new chain
        (docs/formats.md#integrity-seals). A torn tail is never sealed.

        Returns:
            The seal file's path, whether the present seal was kept, and whether it was
            extended.

        Raises:
            PersistenceError: ``READ_ONLY`` for a read handle, or the database failed.
            LogCorruptError: the rows break the format's rules.
            OSError: the seal could not be written.
        """
        self._ensure_open()
        if self._mode != "write":
            raise PersistenceError(f"cannot reseal session {self._id!r} through a read handle",
                                   code="READ_ONLY", session_id=self._id, path=self._path)
        durable, seals, chain = self._durable, self._seals, self._chain
        keep = keep and durable is not None and seals is not None and chain is not None
        if keep:
            self._unelide()  # a resume's unread records: the kept seal is written whole
            if durable is not None and seals is not None and chain is not None \
                    and self._torn_seq is None \
                    and (seals[-1][1] if seals else 0) == durable[0] == chain.end:
                logger.info("session %s: integrity seal %s kept: the rows pass it and it "
                            "covers every one", self._id, self._seal_file)
                return Resealed(str(self._seal_file), kept=True)
        conn = self._c.conn
        try:
            conn.execute("BEGIN")
            try:
                _, incarnation, _ = self._session_row()
                rows = self._rows_from(0)
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            _fail(exc, "read", self._path, self._id)
        scan = scan_rows(rows, 0, self._c.schema_version, path=self._path,
                         session_id=self._id)
        end = scan.torn_seq if scan.torn_seq is not None else len(scan.events)
        start = seals[-1][1] if keep and seals else 0
        extend = keep and seals is not None and chain is not None and start <= end \
            and chain.end <= end
        if not extend or seals is None or chain is None:
            seals, chain, start = [], ChainState([]), 0  # rebuilt: a new chain
        past = [row[1:] for row in rows if start <= row[1] < end]
        records = [*seals, *(row_records(past, start, end) if end > start else [])]
        self._close_seal_fd()
        if mkdir_private(self._seal_file.parent, "integrity seals"):
            fsync_folder(self._seal_file.parent.parent)
        chain.pending = list(scan.events[chain.end:end])
        chain.take(end, incarnation_bytes(incarnation), this_writer())
        marks = self._restore_marks[-1:] if extend else []
        reset_seal(self._seal_file, _seal_identity(incarnation), records, marks, chain=chain)
        self._seals, self._restore_marks, self._seal_rewrite = records, marks, False
        self._chain, self._seal_cut = chain, None
        if extend:
            logger.warning("session %s: integrity seal %s kept and extended over the committed "
                           "events %d..%d of %s as they are now, its chain going on",
                           self._id, self._seal_file, start, end, self._path)
            return Resealed(str(self._seal_file), kept=True, extended=True)
        logger.warning("session %s: integrity seal %s rebuilt over the %d committed events of "
                       "%s as they are now", self._id, self._seal_file, end, self._path)
        return Resealed(str(self._seal_file), kept=False)

    def _seal(self, rows: list[Any], start: int, end: int, incarnation: str) -> None:
        """Record a committed batch, its rows of seqs ``[start, end)``, in the seal.

        Its page records (``row_records``) and chain record go into one append
        (``batch_seal``: one accelerator call builds the records and the bytes). A failure is
        logged, never raised.

        The batch is durable when this runs; a seal that could not be written leaves the
        rows unsealed on disk (read by the format rules) until the next append rewrites the
        seal file with every record.
        """
        assert self._seals is not None
        path = self._seal_file
        chain = self._chain
        records: list[tuple[int, int, int]] | None = None
        try:
            link = chain.take(end, self._incarnation_bytes(incarnation), this_writer()) \
                if chain is not None else None
            records, data = batch_seal(rows, start, end, link)
            if self._seal_rewrite:
                self._close_seal_fd()  # the rewrite replaces the file it points to
                self._unelide()
                mkdir_private(path.parent, "integrity seals")
                reset_seal(path, _seal_identity(incarnation), [*self._seals, *records],
                           self._restore_marks[-1:], chain=chain)
                self._seal_rewrite = False
            else:
                # one descriptor for the handle's life (an open and a close less per batch):
                # the write lock keeps every other writer of this seal away, so the file stays
                # the one opened. A seal moved aside meanwhile takes the records with it; the
                # next handle finds none and seals the rows again from seq 0.
                if self._seal_fd is None:
                    self._seal_fd = open_seal_appender(path)
                write_all(self._seal_fd, data)  # the records and the chain record: one write
                if chain is not None and chain.count - chain.published >= HEAD_EVERY:
                    publish_head(path, _seal_identity(incarnation), chain)
        except Exception as exc:  # the batch is committed: a seal failure never fails it
            # kept in memory: the next seal write rewrites the whole file, this record included
            self._close_seal_fd()
            self._seal_rewrite = True
            self.after_commit.failed("seal", exc, f"the next append rewrites the integrity "
                                                  f"seal {path} whole")
        self._seals.extend(records if records is not None else row_records(rows, start, end))

    def _incarnation_bytes(self, incarnation: str) -> bytes:
        """``incarnation_bytes(incarnation)``, kept for the handle's last incarnation."""
        kept = self._incarnation_kept
        if kept is None or kept[0] != incarnation:
            kept = self._incarnation_kept = (incarnation, incarnation_bytes(incarnation))
        return kept[1]

    def _publish_head(self) -> None:
        """Publish the chain head if records are not counted by it yet (at close)."""
        chain = self._chain
        if self._mode != "write" or chain is None or self._seal_rewrite \
                or chain.published == chain.count or self._durable is None:
            return
        try:
            publish_head(self._seal_file, _seal_identity(self._durable[1]), chain)
        except Exception as exc:  # the records stay; only the head lags
            self.after_commit.failed("seal", exc, "the chain head is published by the next "
                                     "writer")

    def _close_seal_fd(self) -> None:
        fd, self._seal_fd = self._seal_fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError as exc:  # the records were written; a failed close loses nothing
                logger.debug("closing the integrity seal %s failed: %s", self._seal_file, exc)

    # --- restore points (see dsh.persistence._restore_point) ------------------------

    def restore_point_where(self) -> str:
        """The restore point sidecar's path, for messages."""
        return str(self.restore_point_path())

    def restore_point_path(self) -> Path:
        """The restore point sidecar: ``<db>.dsh-checkpoints/<encoded id>.ckpt``."""
        return self._restore_point_file

    @property
    def durable_bytes(self) -> int:
        """0: SQLite restore points are due by events only (rows are not counted in bytes)."""
        return 0

    @_holding
    def restore_point_anchor(self) -> rp.Anchor | None:
        """The anchor of the committed prefix last read or written here, or None."""
        self._ensure_open()
        durable = self._durable
        if durable is None or durable[0] < 1 or self._seals is None:
            return None
        count, incarnation, tail_digest = durable
        header, found, _ = self._session_row()
        if found != incarnation:
            return None
        seal_digest = self._seal_binding(count)
        if seal_digest is None:
            return None
        return rp.Anchor(backend="sqlite", session_id=self._id, incarnation=incarnation,
                         event_count=count, byte_offset=count,
                         header_digest=srp.header_digest(header, incarnation),
                         tail_digest=tail_digest, seal_digest=seal_digest)

    def _seal_binding(self, count: int) -> str | None:
        """The anchor's ``sealDigest`` for a cut at seq ``count``.

        Where the seal file holds exactly this handle's records up to ``count``, the
        :class:`SealCut` of the file as it is (one digest, which a resume checks without
        parsing the records); else the digest of the records themselves. None: the records
        could not be read (no anchor now).
        """
        seals = self._seals
        assert seals is not None
        durable = self._durable

        def rewrite() -> None:
            assert durable is not None
            self._close_seal_fd()
            self._unelide()
            mkdir_private(self._seal_file.parent, "integrity seals")
            reset_seal(self._seal_file, _seal_identity(durable[1]), seals,
                       self._restore_marks[-1:], chain=self._chain)
            self._seal_rewrite = False

        return seal_binding(self._seal_file, seals, self._seal_cut, count, self._chain,
                            pending=self._seal_rewrite,
                            rewrite=rewrite if durable is not None else None,
                            unelide=self._unelide,
                            digest=lambda: srp.seal_digest(self._seals or [], count),
                            ride_along=True)

    def _unelide(self) -> None:
        """Read the seal records a resume left unread (before its cut) back into the state.

        Raises:
            SealDamagedError: the seal's bytes before the cut changed since the resume.
        """
        cut = self._seal_cut
        if cut is None:
            return
        records, chain = read_elided(self._seal_file, cut)
        if self._seals is not None:
            self._seals[:0] = records
        if self._chain is not None:
            try:
                self._chain.restore_elided(chain)
            except ValueError as exc:
                raise SealDamagedError(f"integrity seal {self._seal_file}: {exc}",
                                       path=str(self._seal_file), code="SEAL_CORRUPT") from None
        self._seal_cut = None

    def write_restore_point(self, data: bytes) -> None:
        """Replace the restore point sidecar with ``data`` (atomic, like the seals).

        Raises:
            OSError: it could not be written.
        """
        path = self.restore_point_path()
        mkdir_private(path.parent, "restore points")
        rp.write_restore_point_file(path, data)
        durable = self._durable
        if self._seals is None or durable is None:
            return
        # bound to the log: the seal records the body's digest, and a resume refuses a restore
        # point whose digest it did not record (docs/rules.md#restore-points-are-never-the-truth)
        mark = restore_point_mark(rp.body_digest(data))
        try:
            if self._seal_rewrite:
                self._close_seal_fd()
                try:
                    self._unelide()
                except LogCorruptError as exc:
                    raise OSError(str(exc)) from exc
                mkdir_private(self._seal_file.parent, "integrity seals")
                reset_seal(self._seal_file, _seal_identity(durable[1]), self._seals, [mark],
                           chain=self._chain)
                self._seal_rewrite = False
            else:
                if self._seal_fd is None:
                    self._seal_fd = open_seal_appender(self._seal_file)
                append_restore_point_mark_to(self._seal_fd, mark)
        except OSError:
            self._close_seal_fd()
            self._seal_rewrite = True  # a partial record may be left: the next seal rewrites
            raise
        self._restore_marks = [mark]

    @_holding
    def read_from_restore_point(self) -> tuple[rp.RestorePoint, ColdRead,
                                               srp.SqlitePrefixSource]:
        """Read through the restore point: its state, the events after its cut, a page-in source.

        Nothing before the cut is read (a page-in is one indexed range query, when asked).

        On success a write handle is ready to append, as after ``read(0)``; the returned
        events are the tail (first seq ``restore_point.state.event_count``), never torn.

        Raises:
            RestorePointRefused: no usable restore point (the caller reads in full).
        """
        self._ensure_open()
        hold, self._hold_next = self._hold_next, False
        data = rp.read_restore_point_file(self.restore_point_path())
        restore_point = rp.decode_restore_point(data, session_id=self._id, backend="sqlite",
                                                where=self.restore_point_where())
        try:
            cold, source = self._load_tail(restore_point, hold=hold)
        except BaseException:
            self._end_hold()
            raise
        return restore_point, cold, source

    def hold_for_append(self) -> None:
        """Make the next :meth:`read_from_restore_point` open the next append's transaction.

        Contract: :class:`~dsh.persistence._contract.HoldsResume`; docs/rules.md#resume.

        That read then runs in ``BEGIN IMMEDIATE`` and leaves it open: the session row, the
        schema, the tail and the seal checks the resume makes, the page-ins before the
        append (on this connection, :meth:`_lend`) and the append itself are one write
        transaction, so no other connection commits between a check and the rows it
        vouches for. A busy database (another writer's transaction past the busy timeout)
        reads in a plain transaction instead, as without this call. Only a write handle.
        """
        if self._mode == "write":
            self._hold_next = True

    def release_hold(self) -> None:
        """End the held resume transaction if no append took it (nothing was written in it).

        Contract: :class:`~dsh.persistence._contract.HoldsResume`; idempotent.
        """
        self._hold_next = False
        if self._held:
            with self._use:
                self._end_hold()

    def _end_hold(self) -> None:
        """Roll the held resume transaction back: it only read (under ``_use``).

        A failed rollback is logged, not raised (it runs before close and every other
        method): the connection then stays inside the transaction, so the backend closes
        it instead of keeping it (``_release``) and the handle's next use of it fails.
        """
        self._held = False
        if self._c.conn.in_transaction:
            try:
                self._c.conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                logger.warning("ending the held resume transaction of session %s in %s "
                               "failed: %r", self._id, self._path, exc)

    def _load_tail(self, restore_point: rp.RestorePoint, *, hold: bool = False
                   ) -> tuple[ColdRead, srp.SqlitePrefixSource]:
        """Check ``restore_point`` against the database and read the events after its cut.

        ``hold`` (:meth:`hold_for_append`): read in ``BEGIN IMMEDIATE`` and leave it open on
        success (``_held``); the caller ends it on failure.

        Raises:
            RestorePointRefused: the stored prefix is not the one the restore point covers
                (``incarnation``, ``header``, ``tail-digest``, ``seal``, ``straddle``), or the
                tail does not read cleanly (``torn-tail``, ``corrupt-tail``).
        """
        anchor = restore_point.anchor
        cut = anchor.event_count
        legacy = self._c.schema_version == LEGACY_SCHEMA_VERSION  # scalar rows, never packed
        conn = self._c.conn
        cut_info = SealCut.decode(anchor.seal_digest)
        try:
            # past a SealCut the records before the cut are checked by one digest, not read;
            # a reader leaves them to whoever needs them (its page-in source, a writer's
            # resume: docs/rules.md#restore-points-are-never-the-truth)
            seal = read_seal(self._seal_file) if cut_info is None \
                else read_seal_after(self._seal_file, cut_info,
                                     check_prefix=self._mode == "write")
            if hold:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                except sqlite3.OperationalError as exc:  # busy past the timeout: read as
                    logger.debug("resume of session %s in %s not held (%s): the append "
                                 "checks the tail in its own transaction", self._id,
                                 self._path, exc)
                    hold = False
            if not hold:
                conn.execute("BEGIN")
            self._held = hold
            try:
                data_version = None
                if self._mode == "write":
                    # before the reads: a commit by another connection after it moves it,
                    # and the schema checked after it, as the first append checks it
                    data_version = conn.execute("PRAGMA data_version").fetchone()[0]
                    self._c.recheck_ownership()
                header, incarnation, revision = self._session_row()
                # the last row before the cut, then the rows from the cut on: one statement
                rows = conn.execute(_TAIL_FROM_LAST_LEGACY if legacy else _TAIL_FROM_LAST,
                                    (self._id, self._id, cut, cut)).fetchall()
            finally:
                if not hold:
                    conn.execute("COMMIT")
        except (sqlite3.Error, DshError):
            raise rp.RestorePointRefused("unreadable") from None
        last = rows.pop(0) if rows and rows[0][1] < cut else None
        # Rows tile the seqs, so the one row that can straddle the cut is the last row before
        # it (the one the tail digest below pins as the anchor's writer left it, ending at
        # the cut); an earlier row reaching past it is damage inside the covered prefix, which
        # these checks do not read (docs/rules.md#restore-points-are-never-the-truth: its
        # seal record refuses it when it is paged in). No scan of the packed rows before it.
        base = cut if last is None or not _reaches(last, cut) else last[1]
        if incarnation != anchor.incarnation:
            raise rp.RestorePointRefused("incarnation")
        if srp.header_digest(header, incarnation) != anchor.header_digest:
            raise rp.RestorePointRefused("header")
        if last is None or srp.last_row_digest(last[1:]) != anchor.tail_digest:
            raise rp.RestorePointRefused("tail-digest")
        if base != cut:
            raise rp.RestorePointRefused("straddle")
        try:
            seal = self._own_seal(seal, incarnation)
        except LogCorruptError:  # the full read that follows names it (SEAL_MISSING)
            raise rp.RestorePointRefused("seal") from None
        records = seal.records if seal is not None else []
        if cut_info is not None:
            if seal is None or cut_info.end != cut:
                raise rp.RestorePointRefused("seal")
        elif srp.seal_digest(records, cut) != anchor.seal_digest:
            raise rp.RestorePointRefused("seal")
        marks = list(seal.restore_points) if seal is not None else []
        # a writer that names a cut records the restore point's digest after it: none there
        # is a cut named past the recorded digests (anyone who reads the seal can digest it)
        try:
            rp.check_bound(restore_point, marks, where=self.restore_point_where(),
                           seal_path=str(self._seal_file), required=cut_info is not None)
        except rp.RestorePointRefused:
            # a reader that did not hash the seal before the cut: a seal rewritten since
            # (other bytes there) makes the restore point stale, as the hash says at once
            if cut_info is not None and self._mode != "write" \
                    and read_seal_after(self._seal_file, cut_info) is None:
                raise rp.RestorePointRefused("seal") from None
            raise
        try:
            self._check_header_version(header)
            scan = scan_rows(rows, cut, self._c.schema_version, path=self._path,
                             session_id=self._id)
            if seal is not None:
                check_row_seals(rows, seal, base=cut, describe=lambda: "not run",
                                where=self._path, session_id=self._id)
        except DshError:
            raise rp.RestorePointRefused("corrupt-tail") from None
        if scan.torn_seq is not None:
            raise rp.RestorePointRefused("torn-tail")
        events = scan.events
        elided = seal.elided if seal is not None else None
        if self._mode == "write":
            self._seals = list(records)
            self._restore_marks = marks
            self._chain = seal.chain_state() if seal is not None else ChainState([])
            self._seal_cut = elided
            # a chained seal that ends cleanly is appended to, not rewritten
            self._seal_rewrite = seal is None or not seal.clean or seal.version != 2
            self._torn_seq = None
        count = cut + len(events)
        if self._mode == "write":
            # The schema, the session row and the rows from the cut on were read and checked
            # above in one transaction, and no row before the cut covers it (``straddle``):
            # while data_version stays put, the first append takes the stored tail from here
            # as it takes it after its own commit (no second look-back, no session row).
            assert data_version is not None  # (read above for a write handle)
            self._quiet = (data_version, revision, incarnation, count)
        self._durable = (count, incarnation,
                         srp.last_row_digest(rows[-1][1:]) if rows else anchor.tail_digest)
        seal_file = self._seal_file
        source = srp.SqlitePrefixSource(
            self._backend.path, self._id, cut, seals=[*elided.tail, *records]
            if elided is not None else records, legacy=legacy,
            elided=None if elided is None
            else lambda: read_elided(seal_file, elided, chain=False)[0],
            connections=self._backend.page_connections)
        return ColdRead(header=header, events=tuple(events), torn=None,
                        revision=self._revision(incarnation, revision)), source

    def _admit(self, events: Sequence[Event]) -> Sequence[Event]:
        """Check a batch is contiguous lossless JSON before any I/O.

        Rule: docs/stores.md#the-backend-contract.

        Events built by ``Session`` (``Event`` with frozen containers) were validated at the
        door and are trusted; anything else is snapshot-validated, naming the bad field.

        Raises:
            PersistenceError: code SEQ_MISMATCH: event ``i`` does not carry ``first + i``.
            InvalidJsonError: a value is not lossless JSON (``json_path`` like ``$[0].data.v``).
        """
        first = events[0].get("seq") if isinstance(events[0], Mapping) else None
        if type(first) is not int or first < 0:
            raise PersistenceError(
                f"append seq mismatch for session {self._id!r}: expected a non-negative integer "
                f"seq at batch index 0, got {first!r}", code="SEQ_MISMATCH",
                session_id=self._id)
        if c_seqs_contiguous is not None and type(events) in (list, tuple) \
                and c_seqs_contiguous(events, first, Event):
            return events  # the checks below in one C pass (a batch Session built, in order)
        if not all(type(e) is Event and isinstance(e.get("data"), _FROZEN) for e in events):
            return validate_batch(events, first, self._id)
        if c_seqs_contiguous is not None and type(events) in (list, tuple) \
                and c_seqs_contiguous(events, first):
            return events
        for i, event in enumerate(events):  # the reference check, naming the first bad seq
            if event["seq"] != first + i:
                raise PersistenceError(
                    f"append seq mismatch for session {self._id!r}: expected seq {first + i} "
                    f"at batch index {i}, got {event['seq']!r}", code="SEQ_MISMATCH",
                    session_id=self._id, seq=event["seq"])
        return events

    def flush(self) -> None:
        """Durability barrier; a no-op because every :meth:`append` commit is already durable.

        Each append committed with ``synchronous = FULL`` (the WAL is synced at commit), so
        nothing is pending when this runs.

        Raises:
            PersistenceError: the handle is closed (code CLOSED).
        """
        self._ensure_open()

    @_holding
    def scrub(self) -> list[dict[str, object]]:
        """Push deleted bytes out of the file: ``wal_checkpoint(TRUNCATE)``, ``VACUUM``, again.

        Run by :meth:`rewrite` after its commit, and by a redaction or erasure that finds
        nothing left to change (a rerun after a crash between the commit and this step). A
        step that cannot run now (another process holds a read transaction) is reported with
        ``done: false``, never raised. Rule: docs/forgetting.md#how-storage-is-rewritten.
        """
        self._ensure_open()
        touched: list[dict[str, object]] = []
        for step in ("PRAGMA wal_checkpoint(TRUNCATE)", "VACUUM",
                     "PRAGMA wal_checkpoint(TRUNCATE)"):
            try:
                answer = self._c.conn.execute(step).fetchone()
                busy = step.startswith("PRAGMA") and answer is not None and answer[0] != 0
                touched.append({"path": self._path, "action": step, "done": not busy})
            except sqlite3.Error as exc:
                touched.append({"path": self._path, "action": step, "done": False,
                                "error": str(exc)})
        return touched

    @_holding
    def rewrite(self, events: Sequence[Event], *, scrub: bool = True
                ) -> list[dict[str, object]]:
        """Replace the session's rows by ``events`` and scrub the file: redaction and erasure.

        The stored rows are read through the seal first (damage is refused, not rewritten).
        Then the new seal (the chain carried over, :func:`carry`) is staged beside the seal
        (``.<id>.seal.new.tmp``, fsynced), the restore point is deleted, and with
        ``secure_delete`` on (freed pages are zeroed) one ``BEGIN IMMEDIATE`` transaction
        deletes the session's rows and inserts the new ones; a crash leaves the old rows with
        the old seal or the new ones with the staged seal, which the next read adopts. After
        the commit: the staged seal is renamed into place, then ``wal_checkpoint(TRUNCATE)``,
        ``VACUUM``, ``wal_checkpoint(TRUNCATE)`` (the old page images leave the WAL and the
        free pages). A step after the commit that fails (another process keeps a read
        transaction open) is reported in the returned list, never raised. Rules:
        docs/forgetting.md#how-storage-is-rewritten, docs/formats.md#integrity-seals.

        Returns:
            What was touched: ``{"path", "action", ...}`` per file, table or step.

        Raises:
            PersistenceError: ``READ_ONLY``, or the database failed (nothing was changed).
            LogCorruptError: the stored rows are damaged.
            OSError: the new seal could not be staged (nothing was changed).
        """
        self._ensure_open()
        if self._mode != "write":
            raise PersistenceError(f"cannot rewrite session {self._id!r} through a read "
                                   f"handle; open it with mode 'write'", code="READ_ONLY",
                                   session_id=self._id, path=self._path)
        old = self.read()  # the whole seal too: nothing elided
        old_chain = self._chain.records if self._chain is not None else []
        batch = validate_batch(events, 0, self._id)
        rows = encode_batch(batch, self._c.schema_version)
        legacy = self._c.schema_version == LEGACY_SCHEMA_VERSION
        conn = self._c.conn
        touched: list[dict[str, object]] = []
        self._close_seal_fd()
        _, incarnation, _ = self._session_row()
        stored = [(*r[:6], None) for r in rows] if legacy else rows
        # staged before the transaction, installed after its commit: the old seal stays in
        # place until then, so a crash leaves the old rows with the old seal or the new rows
        # with the staged seal (adopted by the next read), and the chain survives either way
        # (docs/formats.md#integrity-seals). The chain is kept: tombstoned events keep their
        # leaves (docs/formats.md#the-seal-chain); the events past it get one new record.
        if mkdir_private(self._seal_file.parent, "integrity seals"):
            fsync_folder(self._seal_file.parent.parent)
        chain = ChainState(carry(old_chain, {int(e["seq"]): e for e in old.events}, batch,
                                 incarnation_bytes(incarnation), this_writer()))
        staged = stage_seal(self._seal_file, _seal_identity(incarnation),
                            row_records(stored, 0, len(batch)) if batch else [], chain=chain,
                            tmp=staged_name(self._seal_file))
        failpoint("sqlite.rewrite.staged")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.restore_point_path())
            touched.append({"path": str(self.restore_point_path()), "action": "deleted"})
        try:
            conn.execute("PRAGMA secure_delete = ON")
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._c.recheck_ownership()
                found = conn.execute("SELECT revision, incarnation FROM sessions WHERE id = ?",
                                     (self._id,)).fetchone()
                if found is None:
                    raise SessionNotFoundError(f"session {self._id!r} is not stored in "
                                               f"{self._path}", session_id=self._id,
                                               path=self._path)
                deleted = conn.execute("DELETE FROM events WHERE session_id = ?",
                                       (self._id,)).rowcount
                _insert_rows(conn, self._id, rows, legacy)
                conn.execute("UPDATE sessions SET revision = ? WHERE id = ?",
                             (found[0] + 1, self._id))
                if str(found[1]) != incarnation:  # under our write lock: never, unless
                    raise SessionNotFoundError(   # the row was replaced behind the lock
                        f"session {self._id!r} in {self._path} was deleted and created "
                        f"again during the rewrite", session_id=self._id, path=self._path)
                failpoint("sqlite.rewrite.commit")
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                with contextlib.suppress(OSError):
                    os.unlink(staged)
                raise
        except sqlite3.Error as exc:
            _fail(exc, "rewrite", self._path, self._id)
        # committed: what follows is reported, never raised
        self._committed_revision, self._quiet, self._durable = found[0] + 1, None, None
        touched.append({"path": self._path, "table": "events", "action": "rows replaced",
                        "deleted": deleted, "inserted": len(rows)})
        failpoint("sqlite.rewrite.committed")
        try:
            install_seal(staged, self._seal_file)
            self._seals, self._seal_rewrite = None, False
            touched.append({"path": str(self._seal_file), "action": "written"})
        except OSError as exc:  # the next read adopts the staged seal (_adopt_staged_seal)
            self._seals, self._seal_rewrite = None, True
            self.after_commit.failed("seal", exc, "the next read adopts the staged seal")
        if scrub:  # an erasure of many sessions scrubs once, after the last one
            touched.extend(self.scrub())
        return touched

    @_holding
    def close(self) -> None:
        """Close the connection and release the write lock; idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._backend._mutex:
            self._backend._writers.discard(self)
        try:
            self._close_seal_fd()
            self._publish_head()
            self._backend._release(self._c)
        finally:
            if self._lock is not None:
                self._lock.release()

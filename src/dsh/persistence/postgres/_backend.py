"""PostgreSQL persistence backend: many hosts, one fenced writer per session, live tailing.

Invariants this module owns (docs/stores.md#the-backend-contract,
docs/rules.md#one-writer-per-session):

* the store lives in one schema (``?schema=``, default ``dsh``) migrated forward-only by
  :mod:`dsh.persistence.postgres._schema`; several hosts starting at once apply each migration
  exactly once (a transaction-scoped advisory lock serialises them);
* events are stored as SQLite schema-17 rows (chunk runs of one batch packed, ``data`` of 4 KiB
  or more zstd-compressed when smaller), primary key ``(session_id, seq)``; ``head_seq`` on the
  session row is the commit marker;
* write ownership is a lease on the session row: owner token, epoch, expiry on the database
  clock. Opening for write succeeds only when the lease is free or expired and bumps the epoch;
  every append batch is one transaction that locks the session row and commits only when owner,
  epoch and the expected head seq all match, else it is refused (:class:`LeaseLostError`,
  ``SEQ_MISMATCH``) with nothing written. A background thread renews the lease; a paused or
  partitioned former holder is refused, never merged. No session-level advisory lock is used;
* every commit sends ``NOTIFY`` on the schema's channel (payload: md5 of the session id), so
  :meth:`PostgresBackend.tail` follows a session without polling, never skipping or repeating
  a seq;
* a connection lost in the middle of an append is settled on a fresh connection: the head
  either moved by exactly the batch under our epoch (it is in) or did not move (it is out and
  is sent again, once by default). Anything else is refused.

psycopg 3 is imported here only (extra ``dsh-session[postgres]``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json as std_json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Final, NoReturn
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import orjson

from dsh._errors import (
    ConfigError,
    DshError,
    LeaseLostError,
    LogCorruptError,
    PersistenceError,
    SessionBusyError,
    SessionExistsError,
    SessionFormatUnsupportedError,
    SessionNotFoundError,
    printable,
)
from dsh._failpoints import failpoint
from dsh._install import install_hint
from dsh.json import FrozenDict, dumps, is_safe_int
from dsh.persistence import _restore_point as rp
from dsh.persistence._chain import (
    ChainRecord,
    carry,
    chain_domain,
    incarnation_bytes,
    linked_parts,
    stored_record,
    this_writer,
)
from dsh.persistence._contract import (
    Capabilities,
    ColdRead,
    HandleBase,
    KeptChain,
    OpenMode,
    TornTail,
    check_session_id,
    format_version_refusal,
    metadata_problem,
    normalize_header,
    session_id_problem,
    validate_batch,
)
from dsh.persistence._listing import (
    HIDING_TYPES,
    MAY_REMOVE_SQL,
    EntryFold,
    ListingEntry,
    ReadFn,
    entry_from_stored,
    read_entries,
    stored_entry,
)
from dsh.persistence._seal import restore_point_mark, rows_crc
from dsh.persistence._search import SearchIndex, fold
from dsh.persistence._tail import follow
from dsh.persistence.postgres._pool import PoolTimeoutError, acquire_pool, release_pool
from dsh.persistence.postgres._schema import (
    ASIDES_TABLE,
    MIGRATION_LOCK_KEY,
    MIGRATIONS,
    SCHEMA_VERSION,
    quote_schema,
    valid_schema_name,
)
from dsh.persistence.sqlite import (
    MAX_PACKED_ROW_MEMBERS,
    RowError,
    decode_row,
    decode_session_row,
    encode_batch,
    scan_rows,
)
from dsh.persistence.sqlite import SCHEMA_VERSION as ROW_FORMAT
from dsh.session import SESSION_FORMAT_VERSION, Event

__all__ = [
    "DEFAULT_LEASE_MS",
    "DEFAULT_SCHEMA",
    "PostgresBackend",
    "PostgresHandle",
    "parse_postgres_url",
]

logger = logging.getLogger(__name__)

DEFAULT_SCHEMA: Final = "dsh"
DEFAULT_LEASE_MS: Final = 15_000
"""Lease length (ms); renewed every third of it while the write handle is open."""
MIN_LEASE_MS: Final = 100
TAKEOVER_LOCK_TRIES: Final = 3
"""Leases a takeover waits for the session row's lock (a paused holder loses it after one)."""
APPEND_LOCK_WAIT_S: Final = 10.0
"""Least time an append waits for its session row's lock while its lease holds (a busy server
can hold a row past one short lease)."""
ONE_STATEMENT_MAX_ROWS: Final = 256
"""Most rows an append sends as one statement; a bigger batch locks the row, then ``COPY``."""
DEFAULT_POOL_SIZE: Final = 4
RESUME_READ_MAX_EVENTS: Final = 1024
"""Most committed events a log may hold for ``open(id, "write")`` to read its rows in the
lease's own message (when it has no restore point): what a resume reads next, without a round
trip of its own (docs/stores.md#connections-and-the-schema-check)."""
CONNECT_TIMEOUT_S: Final = 10
DEFAULT_TAIL_POLL_MS: Final = 1000
"""How long :meth:`PostgresBackend.tail` waits for a NOTIFY before looking anyway (ms)."""

_NO_DATABASE: Final = re.compile(r'FATAL:\s+database "(.*?)" does not exist')
_SERVER_FATAL: Final = re.compile(r"FATAL:\s+(.*)", re.S)


def _connect_error(exc: BaseException, url: str, action: str,
                   session_id: str | None) -> PersistenceError:
    """The typed error for a connect that failed (docs/errors.md#command-line-codes).

    A server that answered and refused (libpq's ``FATAL:`` line) is named with its reason:
    ``DATABASE_NOT_FOUND`` for a database it does not have (with the way to create it),
    ``DATABASE_REFUSED`` for another refusal (role, password, too many clients). Anything else
    (refused port, unknown host, timeout) is ``DATABASE_UNREACHABLE``.

    Args:
        exc: The driver's connect error (its text is libpq's message).
        url: The store URL, password redacted.
        action: What was being done (``open``, ``list``...), for the message.
        session_id: The session concerned, or None.
    """
    text = " ".join(str(exc).split())
    missing = _NO_DATABASE.search(text)
    if missing:
        name = missing.group(1)
        return PersistenceError(
            f"PostgreSQL answered for store {url} ({action}): database {name!r} does not exist; "
            f"create it (createdb {name}, or CREATE DATABASE \"{name}\") or put an existing "
            "database in the URL", code="DATABASE_NOT_FOUND", path=url, session_id=session_id)
    refused = _SERVER_FATAL.search(text)
    if refused:
        return PersistenceError(
            f"PostgreSQL refused the connection for store {url} ({action}): "
            f"{refused.group(1).strip()}; check the user, password and database in the URL",
            code="DATABASE_REFUSED", path=url, session_id=session_id)
    return PersistenceError(f"cannot reach PostgreSQL for store {url} ({action}): {text}",
                            code="DATABASE_UNREACHABLE", path=url, session_id=session_id)


_TUPLES_OK: Final = 2  # libpq's PGRES_TUPLES_OK (``psycopg.pq.ExecStatus.TUPLES_OK``)
_DSH_OPTIONS: Final = ("schema", "lease_ms", "pool_size", "migrate", "reconnect_retries")
_NOW_MS: Final = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
_CHUNK_TAGS_SQL: Final = "('text-chunks', 'reasoning-chunks', 'tool-call-chunks')"
_SESSION_COLUMNS: Final = ("id, version, created_at, cwd, parent_session, seed_length, origin, "
                           "delegation_depth, agent_preset, incarnation::text, revision, head_seq, "
                           "metadata")
_ROW_COLUMNS: Final = "seq, type, time, data, data_zstd, source_event_seqs, surface_op, ignorable"
_ASIDE_HEAD: Final = "substring(data FROM 1 FOR position('\\x0a'::bytea IN data))"
"""An aside's head, cut by the server: its bytes up to and including the first newline."""
_SCHEMA_ERRORS: Final = ("UndefinedTable", "UndefinedColumn", "InvalidSchemaName")
"""What a statement meets in a schema that is missing or behind (then checked in full)."""


def _with_metadata(header: FrozenDict, text: str | None, url: str) -> FrozenDict:
    """``header`` plus the ``metadata`` column's object (docs/formats.md#header-metadata)."""
    if text is None:
        return header
    try:
        metadata = std_json.loads(text)
    except ValueError as exc:
        raise LogCorruptError(f"header metadata of session {header['id']!r} in {url} is not "
                              f"JSON", session_id=str(header["id"]), path=url) from exc
    problem = metadata_problem(metadata)
    if problem is not None:
        raise LogCorruptError(f"header metadata of session {header['id']!r} in {url} must be "
                              f"{problem}", session_id=str(header["id"]), path=url)
    return FrozenDict({**header, "metadata": FrozenDict(sorted(metadata.items()))})


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ConfigError("postgresql:// stores need psycopg 3: "
                          f"{install_hint('postgres')}", code="MISSING_EXTRA") from exc
    return psycopg


def parse_postgres_url(url: str) -> tuple[str, dict[str, str]]:
    """Split a store URL into the libpq connection URL and dsh's own options.

    Args:
        url: ``postgresql://user@host:port/db?schema=name&lease_ms=N&pool_size=N&migrate=B
            &reconnect_retries=N`` (``postgres://`` also accepted). Other query options go to
            libpq unchanged.

    Returns:
        ``(conninfo, options)``.

    Raises:
        ConfigError: not a ``postgresql://`` URL.
    """
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("postgresql", "postgres"):
        raise ConfigError(f"store URL {redact(url)!r} is not a postgresql:// URL", path=redact(url))
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in _DSH_OPTIONS}
    # libpq's options as libpq reads them: a "+" is a plus (only %XX escapes), so it is kept
    # through the parse, and a space is sent as %20 ("options=-c x=1" must not become "-c+x")
    rest = [(k, v) for k, v in parse_qsl(parts.query.replace("+", "%2B"), keep_blank_values=True)
            if k not in _DSH_OPTIONS]
    conninfo = urlunsplit(("postgresql", parts.netloc, parts.path,
                           urlencode(rest, quote_via=quote), ""))
    return conninfo, ours


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages and ``Backend.url``)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit((parts.scheme, f"{user}:***@{netloc[1]}", parts.path, parts.query,
                       parts.fragment))


def _int_option(options: Mapping[str, str], key: str, default: int, low: int, url: str) -> int:
    raw = options.get(key)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) < low:
        raise ConfigError(f"store URL {url!r}: {key}={raw!r} must be an integer >= {low}",
                          path=url)
    return int(raw)


_LIVE_LEASES: dict[str, int] = {}
"""The lease tokens the write handles of this process hold, each with the pid that took it (a
forked child holds none of its parent's): a busy lease whose owner is one of them is held in
this process, which no wait frees (docs/errors.md#sessionbusyerror)."""


class _Lease:
    """This handle's claim on a session row: token, epoch, and the renewal thread."""

    def __init__(self, backend: PostgresBackend, session_id: str, token: str, epoch: int) -> None:
        self.backend = backend
        self.session_id = session_id
        self.token = token
        self.epoch = epoch
        self.lost: LeaseLostError | None = None
        _LIVE_LEASES[token] = os.getpid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                        name=f"dsh-lease-{session_id[:32]}")
        self._thread.start()

    def _renew_loop(self) -> None:
        interval = self.backend.lease_ms / 3000
        while not self._stop.wait(interval):
            if self.backend._closed:
                # the pool is gone; the lease expires on its own, so a writer may wait for it
                _LIVE_LEASES.pop(self.token, None)
                return
            try:
                renewed = self.backend._renew(self.session_id, self.token, self.epoch)
            except PersistenceError as exc:
                # The database is unreachable: keep trying; an expired lease is refused at the
                # next append (fencing), so nothing can be merged meanwhile.
                logger.warning("lease renewal of session %s failed: %s", self.session_id, exc)
                continue
            if not renewed:
                self.lost = self.backend._lease_lost(self.session_id, self.epoch)
                logger.warning("%s", self.lost.message)
                return

    def stop(self) -> None:
        # before the release: a writer that finds the lease still held then tries again
        _LIVE_LEASES.pop(self.token, None)
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


class PostgresHandle(HandleBase):
    """An open session of a :class:`PostgresBackend` (contract: :class:`~.api.Handle`).

    Used from one thread at a time; connections come from the backend's pool per operation. A
    ``"write"`` handle holds the session's lease (see :attr:`epoch`) until :meth:`close`.
    """

    def __init__(self, backend: PostgresBackend, session_id: str, mode: OpenMode,
                 lease: _Lease | None, listing: tuple[int, EntryFold] | None = None) -> None:
        self._backend = backend
        # the listing entry of the committed log at a head (write handles): what each append
        # folds its batch into and stores beside the head; None when it is not known
        self._listing = listing
        self._id = session_id
        self._mode: OpenMode = mode
        self._lease = lease
        self._torn_seen: int | None = None
        self._closed = False
        # The restore point read with the lease and the digest the session row records for it
        # (``(None, ...)``: none), for the first read through it; dropped by any write through
        # this handle.
        self._restore_point_row: tuple[bytes | None, str | None] | None = None
        # The session row and rows read with the lease (a short log without a restore point),
        # for the first whole read; dropped by any write through this handle.
        self._read_with_lease: tuple[tuple[Any, ...], list[tuple[Any, ...]]] | None = None
        self.one_statement = True
        """Append in one statement when nothing needs removing first (False: always lock the
        row first, then insert and advance in a transaction of several statements)."""
        self.recovered_connection_losses = 0
        """Appends whose connection was lost mid-batch and were settled (in, or sent again)."""
        self.aside_heads: dict[str, bytes | None] = {}
        """Aside heads read with the lookup (:meth:`PostgresBackend.open_at_restore_point`)."""

    @property
    def epoch(self) -> int | None:
        """The fencing epoch of this write handle's lease, or ``None`` for a read handle."""
        return None if self._lease is None else self._lease.epoch

    def _ensure_open(self) -> None:
        if self._closed:
            raise PersistenceError(f"handle for session {self._id!r} is closed",
                                   code="HANDLE_CLOSED", session_id=self._id,
                                   path=self._backend.url)

    def read(self, offset: int = 0) -> ColdRead:
        """Read the header and the committed events with ``seq >= offset`` (one snapshot).

        Committed means ``seq < head_seq``; rows at or after the head are reported as the torn
        tail (a write handle that saw it removes it before its next append). Suffix reads start
        at the packed row covering ``offset``.

        Args:
            offset: First event seq wanted, a non-negative integer.

        Returns:
            ColdRead: header, events (packed rows expanded), torn tail
            (``TornTail(byte_offset=None, line=<first row seq>, reason)``) or ``None``, and
            revision ``postgresql:<store uuid>:incarnation:<uuid>:revision:<n>``.

        Raises:
            ConfigError: ``offset`` is not a non-negative integer.
            LogCorruptError: a committed row does not decode or the rows do not reach the head.
            SessionFormatUnsupportedError: the header version is not 0.
            SessionNotFoundError: the session row is gone.
            PersistenceError: the database failed (code POSTGRES).
        """
        self._ensure_open()
        if not is_safe_int(offset) or offset < 0:
            raise ConfigError(f"read offset must be a non-negative safe integer event seq, got "
                              f"{offset!r}", session_id=self._id)
        b = self._backend
        if offset == 0 and self._read_with_lease is not None:  # read with the lease
            srow, held = self._read_with_lease
            self._read_with_lease = None
            return self._decoded(srow, held, 0, 0)
        if offset == 0:  # the session row and the rows: one round trip, one snapshot
            sessions, rows = b._read_batch("read", self._id, b._whole_read(self._id))
            return self._decoded(sessions[0] if sessions else None, rows, 0, 0)
        # a suffix read first finds the packed row covering its offset
        with b._conn("read", self._id) as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            srow = conn.execute(b._sql_session_row, (self._id,)).fetchone()
            base, rows = offset, []
            if srow is not None:
                base = self._suffix_base(conn, offset, int(srow[11]))
                rows = conn.execute(b._sql_rows_from, (self._id, base)).fetchall()
        return self._decoded(srow, rows, base, offset)

    def _decoded(self, srow: tuple[Any, ...] | None, rows: Sequence[Sequence[Any]], base: int,
                 offset: int) -> ColdRead:
        """The :class:`ColdRead` of a session row and its rows from ``base`` (see :meth:`read`).

        Raises:
            As :meth:`read`.
        """
        b = self._backend
        if srow is None:
            raise SessionNotFoundError(f"session {self._id!r} is not stored in {b.url}",
                                       session_id=self._id, path=b.url)
        head = int(srow[11])
        header, incarnation, revision = decode_session_row(srow[:11], path=b.url)
        header = _with_metadata(header, srow[12], b.url)
        self._check_header_version(header)
        # rows come in seq order: those at or after the head (a torn tail) are the last ones
        cut = len(rows)
        while cut and rows[cut - 1][0] >= head:
            cut -= 1
        torn_rows = rows[cut:]
        scan = scan_rows(_rows(rows[:cut]), base, ROW_FORMAT, path=b.url, session_id=self._id)
        reached = scan.events[-1]["seq"] + 1 if scan.events else base
        if scan.torn_seq is not None or (reached < head and offset < head):
            seq = scan.torn_seq if scan.torn_seq is not None else reached
            raise LogCorruptError(
                f"corrupt session log {self._id!r} in {b.url}: committed rows end at seq "
                f"{reached} but the head is {head}"
                + (f" ({scan.torn_reason})" if scan.torn_reason else "")
                + "; rows below the head were changed outside dsh", path=b.url, seq=seq,
                session_id=self._id)
        # the scan starts at ``base``: only a suffix read lowered to a packed row has events
        # before ``offset`` to drop
        events = scan.events if base == offset else [e for e in scan.events
                                                      if e["seq"] >= offset]
        if self._lease is not None and self._listing is None and offset == 0:
            fold = EntryFold.start(header)  # a log whose writer did not know its entry
            fold.extend(events)
            self._listing = (head, fold)
        torn = None
        self._torn_seen = None
        if torn_rows:
            first = int(torn_rows[0][0])
            torn = TornTail(byte_offset=None, line=first,
                            reason=f"{len(torn_rows)} row(s) from seq {first} lie at or after "
                                   f"the committed head {head} (not written by a dsh append)")
            self._torn_seen = head
            logger.warning("session %s in %s has a torn tail at seq %s", self._id, b.url, first)
        # scan_rows took every row at the next seq from 0 (a packed row's members at seq0 + k):
        # a whole read hands the pipeline that proof and the C pass's prescan, as SQLite's does
        whole = base == 0 and offset == 0
        return ColdRead(header=header, events=tuple(events), torn=torn,
                        revision=f"postgresql:{b.store_id}:incarnation:{incarnation}:"
                                 f"revision:{revision}",
                        prescan=scan.prescan if whole else None, contiguous=whole)

    def last_stored_seq(self) -> int:
        """The committed head minus one (-1: no events): the session row's ``head_seq``.

        Contract: :class:`~dsh.persistence._contract.ReadsRanges` (one indexed lookup).

        Raises:
            SessionNotFoundError: the session row is gone.
            PersistenceError: the database failed (code POSTGRES).
        """
        self._ensure_open()
        b = self._backend
        with b._conn("read", self._id) as conn:
            srow = conn.execute(b._sql_session_row, (self._id,)).fetchone()
        if srow is None:
            raise SessionNotFoundError(f"session {self._id!r} is not stored in {b.url}",
                                       session_id=self._id, path=b.url)
        return int(srow[11]) - 1

    def range_source(self, cut: int) -> PostgresRangeSource:
        """The committed events ``0 .. cut - 1`` paged from the database.

        Contract: :class:`~dsh.persistence._contract.ReadsRanges`.
        """
        return PostgresRangeSource(self._backend, self._id, cut)

    def _suffix_base(self, conn: Any, offset: int, head: int) -> int:
        """Lower ``offset`` to a packed row that covers it (as SQLite schema 17 does)."""
        if offset == 0 or offset >= head:
            return offset
        rows = conn.execute(self._backend._sql_packed_before,
                            self._packed_args(offset)).fetchall()
        return self._covering_base(rows, offset, head)

    def _packed_args(self, offset: int) -> tuple[str, int, int]:
        """Parameters of ``_sql_packed_before``: the packed rows that could cover ``offset``."""
        return (self._id, max(0, offset - (MAX_PACKED_ROW_MEMBERS - 1)), offset)

    def _covering_base(self, packed: Sequence[Any], offset: int, head: int) -> int:
        """The first seq of a packed row in ``packed`` that covers ``offset``, else ``offset``."""
        if offset == 0 or offset >= head:
            return offset
        base = offset
        for row in packed:
            try:
                covers = decode_row(_row(row), ROW_FORMAT)[-1]["seq"] >= offset
            except RowError:
                covers = True  # fail closed: the scan names the damaged row
            if covers:
                base = min(base, int(row[0]))
        return base

    def _check_header_version(self, header: FrozenDict) -> None:
        if header["version"] != SESSION_FORMAT_VERSION:
            raise format_version_refusal(self._id, header["version"], path=self._backend.url)

    def append(self, events: Sequence[Event]) -> None:
        """Append one batch as one fenced, durable transaction.

        The session row is locked; the batch commits only when this handle still owns the
        lease (same owner token and epoch) and the first seq equals the stored head. The commit
        extends the lease and sends ``NOTIFY``. A connection lost mid-batch is settled (see
        the module notes) and reported in the log; :attr:`recovered_connection_losses` counts
        them.

        Args:
            events: Events in seq order, contiguous; empty commits only a torn-tail removal.

        Raises:
            LeaseLostError: the lease was taken over (``where``: new holder pid, host, since,
                epoch); nothing was written.
            SessionBusyError: another transaction kept the session row locked for
                ``max(APPEND_LOCK_WAIT_S, TAKEOVER_LOCK_TRIES leases)``; nothing was written.
            PersistenceError: read-only or closed handle (READ_ONLY / HANDLE_CLOSED), a batch
                that does not continue the stored head (SEQ_MISMATCH), or the database failed
                and the outcome could not be settled (CONNECTION_LOST / POSTGRES).
            LogCorruptError: rows after the head that :meth:`read` did not report.
            EventRejectedError: an envelope a row cannot hold (code ENVELOPE).
            InvalidJsonError: a payload is not lossless JSON.
            SessionNotFoundError: the session row is gone.
        """
        self._ensure_open()
        if self._mode != "write" or self._lease is None:
            raise PersistenceError(f"cannot append to session {self._id!r} through a read "
                                   f"handle; open it with mode 'write'", code="READ_ONLY",
                                   session_id=self._id, path=self._backend.url)
        if self._lease.lost is not None:
            raise self._lease.lost
        self._restore_point_row = None  # the log moves: read the restore point afresh
        self._read_with_lease = None
        if not events and self._torn_seen is None:
            return
        first = events[0].get("seq") if events else None
        if events:
            if type(first) is not int or first < 0:
                raise PersistenceError(
                    f"append seq mismatch for session {self._id!r}: expected a non-negative "
                    f"integer seq at batch index 0, got {first!r}", code="SEQ_MISMATCH",
                    session_id=self._id)
            events = validate_batch(events, first, self._id)
        rows = encode_batch(events, ROW_FORMAT)
        after = self._fold(first, events, self._listing)
        # the batch's chain record, linked by the commit's statement
        # (docs/formats.md#the-seal-chain)
        linked = linked_parts(events, this_writer(self._lease.epoch)) if events else None
        psycopg = _psycopg()
        attempts = self._backend.reconnect_retries + 1
        attempt = 0
        waited_s = 0.0
        while True:
            started = time.monotonic()
            try:
                if first is not None and linked is not None and self._torn_seen is None \
                        and self.one_statement and len(rows) <= ONE_STATEMENT_MAX_ROWS and \
                        self._commit_one(first, len(events), rows, after, linked):
                    self._listing = after
                    return
                self._listing = self._commit(first, events, rows, after, linked)
                return
            except psycopg.errors.LockNotAvailable as exc:
                # Another transaction held the row for a whole lease (lock_timeout). Not a lost
                # connection: while our lease holds (the settle raises LeaseLostError if it
                # went) keep waiting, as long as a takeover would, and at least APPEND_LOCK_WAIT_S.
                waited_s += time.monotonic() - started
                if self._settle(first, len(events)) == "in":
                    self._listing = after
                    return
                bound = max(APPEND_LOCK_WAIT_S,
                            TAKEOVER_LOCK_TRIES * self._backend.lease_ms / 1000)
                if waited_s < bound:
                    continue
                raise SessionBusyError(
                    f"append to session {self._id!r} in {self._backend.url}: its row stayed "
                    f"locked by another transaction for {waited_s:.1f} s; nothing was written. "
                    f"A transaction outside dsh holds it: end it and append the batch again",
                    session_id=self._id) from exc
            except (psycopg.OperationalError,
                    psycopg.errors.IdleInTransactionSessionTimeout) as exc:
                # the server ended the transaction (and the connection) under us: a lost
                # connection, whose outcome the settle finds out
                attempt += 1
                outcome = self._settle(first, len(events))
                self.recovered_connection_losses += 1
                if outcome == "in":
                    logger.warning("append to session %s: connection lost after the commit "
                                   "(%s); the batch is in", self._id, exc)
                    self._listing = after if events else self._listing
                    return
                if attempt < attempts:
                    logger.warning("append to session %s: connection lost mid-batch (%s); "
                                   "nothing was written, sending the batch again", self._id, exc)
                    continue
                raise PersistenceError(
                    f"append to session {self._id!r} in {self._backend.url}: the connection was "
                    f"lost mid-batch ({exc}); nothing was written, append the batch again",
                    code="CONNECTION_LOST", session_id=self._id, seq=first) from exc

    def _fold(self, first: int | None, events: Sequence[Event],
              base: tuple[int, EntryFold] | None) -> tuple[int, EntryFold] | None:
        """The listing entry after this batch, if ``base`` is the entry at its first seq."""
        if first is None or base is None or base[0] != first:
            return None
        fold = EntryFold(base[1].entry, base[1].source_seen)
        return (first + len(events), fold) if fold.extend(events) else None

    def _commit_one(self, first: int, count: int, rows: list[Any],
                    after: tuple[int, EntryFold] | None, linked: tuple[bytes, bytes, bytes]
                    ) -> bool:
        """Commit the batch in one statement (one round trip, one WAL flush); False: refused.

        The statement locks the session row only if owner, epoch and head still match and no
        row lies past the head; the rows (one JSON array) are inserted and the head advanced
        only then. Refused means nothing was written: :meth:`_commit` then says why (or
        removes a torn tail and commits). A seq taken by another transaction (a unique
        violation) is refused the same way.
        """
        b = self._backend
        lease = self._lease
        assert lease is not None
        psycopg = _psycopg()
        try:
            packed = orjson.dumps([_json_row(r) for r in rows]).decode()
        except orjson.JSONEncodeError:  # pragma: no cover - rows hold JSON text and hex only
            return False
        try:
            with b._conn("append", self._id,
                         passthrough=("OperationalError", "UniqueViolation")) as conn:
                done = conn.execute(b._sql_append_one, (
                    self._id, lease.token, lease.epoch, first, packed, first, first + count,
                    linked[2], linked[0], linked[1], first + count,
                    b.lease_ms, _data_bytes(rows), None if after is None else
                    stored_entry(after[1]), _channel_payload(self._id))).fetchone()
        except psycopg.errors.UniqueViolation:
            return False
        return done is not None

    def _commit(self, first: int | None, events: Sequence[Event], rows: list[Any],
                after: tuple[int, EntryFold] | None,
                linked: tuple[bytes, bytes, bytes] | None) -> tuple[int, EntryFold] | None:
        """Commit the batch in a transaction that locks the row first; return the entry after.

        ``after`` is the listing entry after the batch when known; if not, the entry stored
        beside the head is folded instead.
        """
        b = self._backend
        count = len(events)
        lease = self._lease
        assert lease is not None
        with b._conn("append", self._id, passthrough=(
                "OperationalError", "IdleInTransactionSessionTimeout")) as conn, \
                conn.transaction():
            found = conn.execute(b._sql_lock_row, (self._id,)).fetchone()
            if found is None:
                raise SessionNotFoundError(f"session {self._id!r} is not stored in {b.url}",
                                           session_id=self._id, path=b.url)
            head, owner, epoch, beyond = int(found[0]), found[1], int(found[2]), found[3]
            if owner != lease.token or epoch != lease.epoch:
                lease.lost = b._lease_lost(self._id, lease.epoch, conn)
                raise lease.lost
            stored = None if found[4] is None else entry_from_stored(found[4])
            if after is None and stored is not None and not stored.legacy:
                after = self._fold(first, events, (head, stored))
            if beyond:
                if self._torn_seen != head:
                    raise LogCorruptError(
                        f"session {self._id!r} in {b.url} has rows after its head {head}; "
                        f"read() it through this write handle before appending so the torn "
                        f"tail can be removed", path=b.url, seq=head, session_id=self._id)
                conn.execute(b._sql_delete_beyond, (self._id, head))
                logger.warning("removed torn tail of session %s in %s from seq %s", self._id,
                               b.url, head)
            if first is not None and first != head:
                raise PersistenceError(
                    f"append seq mismatch for session {self._id!r} in {b.url}: append starts "
                    f"at seq {first}, stored head is {head}; another writer moved the log "
                    f"(stale writer), nothing was written", code="SEQ_MISMATCH",
                    session_id=self._id, seq=first, path=b.url)
            b._copy_rows(conn, self._id, rows)
            listing = None if after is None else stored_entry(after[1])
            advance = (head + count, b.lease_ms, _data_bytes(rows), count > 0, listing,
                       self._id, _channel_payload(self._id))
            if linked is None:
                conn.execute(b._sql_advance, advance)
            else:
                conn.execute(b._sql_advance_linked, (head, head + count, linked[2], self._id,
                                                     linked[0], linked[1], *advance))
        self._torn_seen = None
        if count == 0:
            return None if stored is None else (head, stored)
        return after

    def _settle(self, first: int | None, count: int) -> str:
        """Settle a batch whose connection was lost: ``"in"`` or ``"out"``, else raise.

        In: the head moved by exactly the batch and our lease (owner, epoch) still holds, so
        only we can have written it. Out: the head did not move.
        """
        assert self._lease is not None
        b = self._backend
        with b._conn("settle", self._id) as conn:
            found = conn.execute(b._sql_lease_row, (self._id,)).fetchone()
        if found is None:
            raise SessionNotFoundError(f"session {self._id!r} is not stored in {b.url}",
                                       session_id=self._id, path=b.url)
        head, owner, epoch = int(found[0]), found[1], int(found[2])
        if owner != self._lease.token or epoch != self._lease.epoch:
            self._lease.lost = b._lease_lost(self._id, self._lease.epoch)
            raise self._lease.lost
        if first is None:
            return "out"
        if head == first + count:
            return "in"
        if head == first:
            return "out"
        raise PersistenceError(
            f"append to session {self._id!r} in {b.url}: after a lost connection the head is "
            f"{head}, neither {first} (batch out) nor {first + count} (batch in)",
            code="CONNECTION_LOST", session_id=self._id, seq=first)

    def flush(self) -> None:
        """Durability barrier; a no-op, as every :meth:`append` returns after a durable commit.

        Raises:
            PersistenceError: the handle is closed (code HANDLE_CLOSED).
        """
        self._ensure_open()

    def scrub(self) -> list[dict[str, object]]:
        """``VACUUM`` the events table (dead tuples' space reusable; their bytes stay).

        A failure is reported in the returned list, never raised.
        Rule: docs/forgetting.md#what-forgetting-cannot-reach.
        """
        b = self._backend
        try:
            with b._conn("vacuum", self._id) as conn:  # pooled connections autocommit
                conn.execute(f"VACUUM {b._s}.events")
            return [{"path": b.url, "table": f"{b.schema}.events", "action": "VACUUM",
                     "done": True}]
        except PersistenceError as exc:
            return [{"path": b.url, "table": f"{b.schema}.events", "action": "VACUUM",
                     "done": False, "error": exc.message}]

    def rewrite(self, events: Sequence[Event], *, scrub: bool = True
                ) -> list[dict[str, object]]:
        """Replace the session's rows by ``events``: redaction and erasure only.

        One fenced transaction (the lease must still be ours) deletes the session's rows,
        inserts the new ones, replaces the chain records by the carried chain (the old records'
        hashed parts kept, tombstoned events opened, one new record after them;
        docs/formats.md#the-seal-chain) and moves the head; a crash leaves the old rows and
        chain or the new ones.
        Then ``VACUUM`` of the events table makes the dead tuples' space reusable; it does not
        overwrite their bytes, which stay in the table's pages, the WAL and any base backup
        until reused (docs/forgetting.md#what-forgetting-cannot-reach). A ``VACUUM`` that fails
        is reported in the returned list, never raised.

        Returns:
            What was touched: ``{"path", "table", "action", ...}`` per table or step.

        Raises:
            LeaseLostError: the lease was taken over; nothing was written.
            PersistenceError: ``READ_ONLY``, or the database failed (nothing was written).
        """
        self._ensure_open()
        if self._mode != "write" or self._lease is None:
            raise PersistenceError(f"cannot rewrite session {self._id!r} through a read "
                                   f"handle; open it with mode 'write'", code="READ_ONLY",
                                   session_id=self._id, path=self._backend.url)
        if self._lease.lost is not None:
            raise self._lease.lost
        batch = validate_batch(events, 0, self._id)
        rows = encode_batch(batch, ROW_FORMAT)
        b, lease = self._backend, self._lease
        old = {int(e["seq"]): e for e in self.read().events}  # under our lease: stays so
        self._restore_point_row = None
        self._read_with_lease = None
        with b._conn("rewrite", self._id) as conn, conn.transaction():
            found = conn.execute(b._sql_lock_row, (self._id,)).fetchone()
            if found is None:
                raise SessionNotFoundError(f"session {self._id!r} is not stored in {b.url}",
                                           session_id=self._id, path=b.url)
            if found[1] != lease.token or int(found[2]) != lease.epoch:
                lease.lost = b._lease_lost(self._id, lease.epoch, conn)
                raise lease.lost
            srow = conn.execute(b._sql_session_row, (self._id,)).fetchone()
            header, incarnation, _ = decode_session_row(srow[:11], path=b.url)
            fold = EntryFold.start(_with_metadata(header, srow[12], b.url))
            fold.extend(batch)
            deleted = conn.execute(f"DELETE FROM {b._s}.events WHERE session_id = %s",
                                   (self._id,)).rowcount
            # it describes the old rows: the next due append writes a new one
            conn.execute(f"DELETE FROM {b._s}.restore_points WHERE session_id = %s",
                         (self._id,))
            b._copy_rows(conn, self._id, rows)
            # the chain is kept: tombstoned events keep their leaves, the events past it get
            # one new record (docs/formats.md#the-seal-chain)
            chain = carry(b._chain_rows(conn, self._id), old, batch,
                          incarnation_bytes(incarnation), this_writer(lease.epoch))
            conn.execute(f"DELETE FROM {b._s}.chain WHERE session_id = %s", (self._id,))
            with conn.cursor() as cur:
                cur.executemany(f"INSERT INTO {b._s}.chain (session_id, batch, first_seq, "
                                "end_seq, hashed, keys, hash) VALUES (%s, %s, %s, %s, %s, %s, "
                                "%s)", [(self._id, i, r.first, r.end, r.hashed(), r.keys,
                                         r.hash) for i, r in enumerate(chain)])
            conn.execute(f"UPDATE {b._s}.sessions SET chain_batches = %s, chain_head = %s "
                         "WHERE id = %s", (len(chain), chain[-1].hash if chain else bytes(32),
                                           self._id))
            conn.execute(b._sql_replace_head, (len(batch), b.lease_ms, _data_bytes(rows),
                                               stored_entry(fold), self._id,
                                               _channel_payload(self._id)))
            failpoint("postgres.rewrite.commit")
        failpoint("postgres.rewrite.committed")
        self._torn_seen = None
        self._listing = (len(batch), fold)
        touched: list[dict[str, object]] = [
            {"path": b.url, "table": f"{b.schema}.events", "action": "rows replaced",
             "deleted": deleted, "inserted": len(rows)}]
        if scrub:  # an erasure of many sessions vacuums once, after the last one
            touched.extend(self.scrub())
        return touched

    # --- restore points (see dsh.persistence._restore_point) ------------------------

    def restore_point_where(self) -> str:
        """The restore point's row, for messages."""
        return (f"the row of session {self._id!r} in table {self._backend.schema}."
                f"restore_points of {self._backend.url}")

    @property
    def durable_bytes(self) -> int:
        """0: PostgreSQL restore points are due by events only (rows are not counted in bytes)."""
        return 0

    def restore_point_anchor(self) -> rp.Anchor | None:
        """The anchor of the committed prefix (up to the head), or None when it is empty.

        One snapshot and one round trip (a writer's flush that writes a restore point pays it
        and the write): the session row (header, incarnation, head) and the last row before
        the head, whose checksum is the anchor's tail digest.

        Raises:
            PersistenceError: the database failed.
        """
        self._ensure_open()
        b = self._backend
        with b._conn("restore point", self._id) as conn:
            srows, lasts = b._batch(conn, [(b._sql_session_row, (self._id,)),
                                           (b._sql_last_row_at_head, (self._id, self._id))],
                                    begin=True, commit=True)
        srow = srows[0] if srows else None
        last = lasts[0] if lasts else None
        if srow is None or last is None:
            return None
        head = int(srow[11])
        header, incarnation, _ = decode_session_row(srow[:11], path=b.url)
        header = _with_metadata(header, srow[12], b.url)
        return rp.Anchor(backend="postgresql", session_id=self._id, incarnation=incarnation,
                         event_count=head, byte_offset=head,
                         header_digest=_header_digest(header, incarnation),
                         tail_digest=_row_digest(last), seal_digest="")

    def write_restore_point(self, data: bytes) -> None:
        """Replace the session's restore point row with ``data`` (fenced by the lease).

        A handle that lost its lease writes nothing (its restore point could be stale).

        Raises:
            PersistenceError: a read handle (READ_ONLY), or the database failed.
        """
        self._ensure_open()
        lease = self._lease
        if self._mode != "write" or lease is None:
            raise PersistenceError(f"cannot write the restore point of session {self._id!r} "
                                   "through a read handle", code="READ_ONLY",
                                   session_id=self._id, path=self._backend.url)
        b = self._backend
        self._restore_point_row = None
        self._read_with_lease = None
        with b._conn("restore point", self._id) as conn:
            conn.execute(b._sql_put_restore_point, (rp.body_digest(data), self._id,
                                                    lease.token, lease.epoch, data))
        rp.stats["written"] += 1

    def read_from_restore_point(self) -> tuple[rp.RestorePoint, ColdRead, PostgresRangeSource]:
        """Read through the restore point: its state, the events after its cut, a page-in source.

        One snapshot reads the restore point row, the session row, the last row before the cut
        and the rows after it (a restore point read by the lookup of
        :meth:`PostgresBackend.open_at_restore_point` is compared there with the stored one,
        and read again when it was replaced meanwhile). Trusted only when the session's
        incarnation and header digest as recorded, the last row before the cut checksums as
        recorded, no packed row straddles the cut, the head is at or past the cut, and the
        rows after it decode cleanly up to the head with no row beyond it.
        Nothing before the cut is read.

        Raises:
            RestorePointRefused: no usable restore point (the caller reads in full).
        """
        self._ensure_open()
        b = self._backend
        # read with the lease, or with a read handle's lookup (open_at_restore_point)
        known, self._restore_point_row = self._restore_point_row, None
        try:
            with b._conn("read", self._id) as conn:
                if known is None:  # a round trip for the restore point, in the snapshot
                    points = b._batch(conn, [(b._sql_get_restore_point, (self._id,))],
                                      begin=True, commit=False)[0]
                    known = ((bytes(points[0][0]), points[0][1]) if points
                             else (None, None))
                    begin = False
                else:  # read with the lease or the lookup: only the rows are left to read
                    begin = True
                if known[0] is None:
                    raise rp.RestorePointRefused("absent")
                restore_point = rp.decode_restore_point(known[0], session_id=self._id,
                                                        backend="postgresql",
                                                        where=self.restore_point_where())
                # bound: the digest its fenced writer stored beside it, in the session row
                # (docs/rules.md#restore-points-are-never-the-truth)
                rp.check_bound(restore_point, _recorded_marks(known[1]),
                               where=self.restore_point_where(),
                               seal_path=f"(column restore_point_digest of session "
                                         f"{self._id!r} in table {b.schema}.sessions)",
                               required=True)
                cut = restore_point.anchor.event_count
                # one round trip: the session row and the rows around the cut; a restore point
                # read with a read handle's lookup is compared with the one of this snapshot
                statements = [(b._sql_session_row, (self._id,)),
                              (b._sql_last_row_before, (self._id, cut)),
                              (b._sql_packed_before, self._packed_args(cut)),
                              (b._sql_rows_from, (self._id, cut))]
                recheck = begin and self._lease is None
                if recheck:
                    statements.append((b._sql_restore_point_check, (self._id,)))
                sessions, lasts, packed, rows, *again = b._batch(conn, statements, begin=begin,
                                                                 commit=True)
                replaced = recheck and again[0] != [(hashlib.md5(known[0]).hexdigest(),
                                                     known[1])]
                srow = sessions[0] if sessions else None
                if srow is None:
                    raise rp.RestorePointRefused("unreadable")
                head = int(srow[11])
                if head < cut:
                    raise rp.RestorePointRefused("size")
                last = lasts[0] if lasts else None
                base = self._covering_base(packed, cut, head)
        except PersistenceError:
            raise rp.RestorePointRefused("unreadable") from None
        if replaced:  # since the lookup read it: read the one of now, in the rows' snapshot
            return self.read_from_restore_point()
        anchor = restore_point.anchor
        try:
            header, incarnation, revision = decode_session_row(srow[:11], path=b.url)
            header = _with_metadata(header, srow[12], b.url)
        except DshError:
            raise rp.RestorePointRefused("unreadable") from None
        if incarnation != anchor.incarnation:
            raise rp.RestorePointRefused("incarnation")
        if _header_digest(header, incarnation) != anchor.header_digest:
            raise rp.RestorePointRefused("header")
        if last is None or _row_digest(last) != anchor.tail_digest:
            raise rp.RestorePointRefused("tail-digest")
        if base != cut:
            raise rp.RestorePointRefused("straddle")
        if any(r[0] >= head for r in rows):
            raise rp.RestorePointRefused("torn-tail")
        try:
            self._check_header_version(header)
            scan = scan_rows(_rows(rows), cut, ROW_FORMAT, path=b.url,
                             session_id=self._id)
        except DshError:
            raise rp.RestorePointRefused("corrupt-tail") from None
        reached = scan.events[-1]["seq"] + 1 if scan.events else cut
        if scan.torn_seq is not None or reached != head:
            raise rp.RestorePointRefused("corrupt-tail")
        self._torn_seen = None
        cold = ColdRead(header=header, events=tuple(scan.events), torn=None,
                        revision=f"postgresql:{b.store_id}:incarnation:{incarnation}:"
                                 f"revision:{revision}")
        return restore_point, cold, PostgresRangeSource(b, self._id, cut)

    def close(self) -> None:
        """Stop renewing and release the lease (kept epoch, no owner); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._lease is not None:
            self._lease.stop()
            if self._lease.lost is None:
                try:
                    self._backend._release(self._id, self._lease.token, self._lease.epoch)
                except PersistenceError as exc:
                    # The lease then expires on its own; the next writer waits for that.
                    logger.warning("could not release the lease of session %s: %s", self._id,
                                   exc)


class PostgresRangeSource:
    """Pages in a session's events ``0 .. cut - 1`` from the database, by seq (a viewer's page).

    Each read takes a pooled connection; rows are read from the packed row covering ``start``.

    Args:
        backend: The store.
        session_id: The session.
        cut: Events served (below the committed head when made).
    """

    def __init__(self, backend: PostgresBackend, session_id: str, cut: int) -> None:
        self._backend = backend
        self._id = session_id
        self._cut = cut

    def __len__(self) -> int:
        return self._cut

    def read(self, start: int, stop: int) -> Sequence[Event]:
        """Return the events ``start <= seq < stop`` (see ``dsh.session.EventSource``).

        Raises:
            LogCorruptError: the rows no longer decode to those events.
            PersistenceError: the database failed.
        """
        if start >= stop:
            return []
        b = self._backend
        with b._conn("read", self._id) as conn:
            rows = conn.execute(b._sql_rows_between, (self._id, self._id, start, stop)).fetchall()
        events: list[Event] = []
        if rows:
            scan = scan_rows(_rows(rows), int(rows[0][0]), ROW_FORMAT, path=b.url,
                             session_id=self._id)
            if scan.torn_seq is not None:
                raise LogCorruptError(f"events {start}..{stop - 1} of session {self._id!r} in "
                                      f"{b.url} do not decode ({scan.torn_reason}); the rows "
                                      "were changed outside dsh", path=b.url,
                                      session_id=self._id, seq=scan.torn_seq)
            events = [e for e in scan.events if start <= e["seq"] < stop]
        return events

    def read_events(self, seqs: Sequence[int]) -> dict[int, Event]:
        """The events at ``seqs`` (ascending, below the cut), by seq: one statement.

        Only the rows holding them are read, decoded and checked as a page's rows are, one
        scan per run of adjacent rows: a row joins the run before it when the seq just below
        its first was asked for too (the row holding that seq was fetched, and it is the run's
        last), so a contiguous pick is one scan, not one per row.
        Contract: :class:`~dsh.session._paging.PicksEvents`.

        Raises:
            LogCorruptError: a row no longer decodes, or a seq asked for is in no row.
            PersistenceError: the database failed.
        """
        wanted = set(seqs)
        if not wanted:
            return {}
        b = self._backend
        with b._conn("read", self._id) as conn:
            # the seqs as an array literal (psycopg's list dumper compiles a regex at first
            # use); bytea as bytes, not hex text
            literal = "{" + ",".join(map(str, sorted(wanted))) + "}"
            rows = conn.execute(b._sql_rows_holding, (self._id, self._id, literal),
                                binary=True).fetchall()
        runs: list[list[Any]] = []
        for row in rows:
            if runs and int(row[0]) - 1 in wanted:
                runs[-1].append(row)
            else:
                runs.append([row])
        found: dict[int, Event] = {}
        for run in runs:
            first = int(run[0][0])
            scan = scan_rows(_rows(run), first, ROW_FORMAT, path=b.url, session_id=self._id)
            if scan.torn_seq is not None or not scan.events:
                torn = first if scan.torn_seq is None else scan.torn_seq
                raise LogCorruptError(f"the row at seq {torn} of session {self._id!r} in "
                                      f"{b.url} does not decode ({scan.torn_reason}); the rows "
                                      "were changed outside dsh", path=b.url,
                                      session_id=self._id, seq=torn)
            found.update((e["seq"], e) for e in scan.events if e["seq"] in wanted)
        missing = sorted(wanted - found.keys())
        if missing:
            raise LogCorruptError(f"no row of session {self._id!r} in {b.url} holds seq "
                                  f"{missing[0]}; the rows were changed outside dsh",
                                  path=b.url, session_id=self._id, seq=missing[0])
        return found


@functools.cache
def _this_node() -> str | None:
    """Where a pid means this process table: boot id and pid namespace, or None if unknown.

    Rule: docs/stores.md#takeover (a dead holder is judged by its pid only on its own node).
    """
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None  # not Linux, or no /proc: holders here expire as they do elsewhere


def _pid_is_dead(pid: int) -> bool:
    """Whether no process ``pid`` lives on this node (a zombie, killed and unreaped, is dead)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # it exists, under another user
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            # "pid (comm) state ...": comm may hold spaces and parentheses
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False


def _row_digest(r: Sequence[Any]) -> str:
    """The anchor digest of one fetched row: its row checksum (as SQLite's anchors use)."""
    return f"rows2:{rows_crc([_row(r)[1:]])}"


def _recorded_marks(digest: object) -> list[bytes]:
    """The restore point mark a session row's ``restore_point_digest`` records (none: NULL).

    A value that is not a hex SHA-256 records a mark no restore point has (it was edited).
    """
    if digest is None:
        return []
    try:
        return [restore_point_mark(str(digest))]
    except ValueError:
        return [b"\xff" * 12]


def _header_digest(header: FrozenDict, incarnation: str) -> str:
    """The anchor digest of a session row: its header and its incarnation."""
    return rp.digest(dumps(header) + b"\n" + incarnation.encode())


def _rows(rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Fetched rows as the SQLite row tuples the shared codec reads (:func:`_row`, inlined)."""
    return [(r[0], r[0], r[1], r[2], r[3] if r[3] is not None else r[4], r[5], r[6], r[7])
            for r in rows]


def _row(r: Sequence[Any]) -> tuple[Any, ...]:
    """A fetched row as the SQLite row tuple the shared codec reads."""
    seq, type_, time_, text, blob, ses, sop, ign = r
    return (seq, seq, type_, time_, text if text is not None else bytes(blob),
            None if ses is None else bytes(ses), sop, ign)


def _bind(r: Sequence[Any]) -> tuple[Any, ...]:
    seq, type_, time_, data, ses, sop, ign = r
    text, blob = (None, data) if isinstance(data, bytes) else (data, None)
    return (seq, type_, time_, text, blob, ses, sop, ign)


def _data_bytes(rows: Sequence[Any]) -> int:
    """Bytes of the rows' data as stored (UTF-8 text, or the zstd frame): ``size_bytes``."""
    return sum(len(d) if isinstance(d, bytes) else len(d.encode("utf-8", "surrogatepass"))
               for d in (r[3] for r in rows))


def _json_row(r: Sequence[Any]) -> list[Any]:
    """An encoded row as the JSON array the one-statement append unpacks (bytea as hex)."""
    seq, type_, time_, text, blob, ses, sop, ign = _bind(r)
    return [seq, type_, time_, text, None if blob is None else blob.hex(),
            None if ses is None else ses.hex(), sop, ign]


def _one_message(conn: Any, statements: Sequence[tuple[str, Sequence[Any]]],
                 before: str | None, after: str | None) -> list[list[tuple[Any, ...]]]:
    """Send ``before``, ``statements`` and ``after`` as one query message; each one's rows.

    One round trip: parameters are bound by psycopg's client-side quoting (the simple query
    protocol takes several statements in one message; the extended one takes one).
    """
    parts = [before] if before else []
    params: list[Any] = []
    for sql, args in statements:
        parts.append(sql)
        params.extend(args)
    if after:
        parts.append(after)
    cursor = _psycopg().ClientCursor(conn)
    cursor.execute("; ".join(parts), params)
    results: list[list[tuple[Any, ...]]] = []
    while True:
        result = cursor.pgresult  # (not ``description``: it builds a Column per field)
        if result is not None and (result.nfields or result.status == _TUPLES_OK):
            results.append(cursor.fetchall())
        if not cursor.nextset():
            return results


def _channel_payload(session_id: str) -> str:
    # NOTIFY payloads are limited to 8000 bytes; an id of any length hashes to 32 characters.
    return hashlib.md5(session_id.encode("utf-8", "surrogatepass"),
                       usedforsecurity=False).hexdigest()


class PostgresBackend:
    """dsh sessions in a PostgreSQL schema, shared by any number of hosts.

    Usage::

        backend = PostgresBackend("postgresql://postgres@127.0.0.1:5432/test", schema="dsh")
        backend.create({"version": 0, "id": "s1", "createdAt": 1796030745501})
        with backend.open("s1", "write") as handle:   # takes the lease, epoch + 1
            handle.append(events)                     # one fenced, durable transaction

    Args:
        conninfo: libpq connection URL or string (no dsh options).
        schema: Schema holding the tables (``[a-z_][a-z0-9_]*``); created by migration 1.
        lease_ms: Lease length in ms (>= 100); a holder that stops renewing for that long can
            be taken over.
        pool_size: Most pooled connections (>= 1).
        migrate: Apply pending migrations on open (default); with ``False`` a store behind the
            current version is refused until ``dsh migrate`` runs.
        reconnect_retries: How often an append whose connection was lost with the batch out
            is sent again (default 1).
        url: The store URL to report (password redacted).
        create_schema: Create the schema on first use when it holds no dsh store (default);
            with ``False`` (read-only commands; ``dsh.open(url, create_schema=False)``) that
            first use raises ConfigError STORE_NOT_FOUND, naming the schema, and creates
            nothing.

    Raises:
        ConfigError: a bad option, or psycopg is not installed.
        PersistenceError: the server cannot be reached (code DATABASE_UNREACHABLE), it has
            no such database (DATABASE_NOT_FOUND) or refused the user (DATABASE_REFUSED), or the
            schema is behind and ``migrate`` is false (code MIGRATION_REQUIRED).
        SessionFormatUnsupportedError: the schema was migrated by a newer dsh.
    """

    capabilities = Capabilities(restore_points=True, fenced=True, native_tail=True, ranges=True,
                                search_index=True, schema_version=True, migrations=True,
                                torn_tail_hook=True, listing=True, rewrites=True,
                                scrubs=True, asides=True, whole_reads=True,
                                chain_records=True, change_stamp=True)
    """Restore points (a table of the schema), fenced write handles (the lease epoch), a tail
    woken by ``NOTIFY``, a search index in its own tables, versioned migrations, and ``dsh ls``
    entries kept beside each head."""

    def __init__(self, conninfo: str, *, schema: str = DEFAULT_SCHEMA,
                 lease_ms: int = DEFAULT_LEASE_MS, pool_size: int = DEFAULT_POOL_SIZE,
                 migrate: bool = True, reconnect_retries: int = 1, url: str | None = None,
                 create_schema: bool = True) -> None:
        if not valid_schema_name(schema):
            raise ConfigError(f"PostgreSQL schema name {schema!r} must match "
                              f"[a-z_][a-z0-9_]* (at most 63 characters)")
        if type(lease_ms) is not int or lease_ms < MIN_LEASE_MS:
            raise ConfigError(f"lease_ms must be an integer >= {MIN_LEASE_MS}, got {lease_ms!r}")
        if type(pool_size) is not int or pool_size < 1:
            raise ConfigError(f"pool_size must be an integer >= 1, got {pool_size!r}")
        if type(reconnect_retries) is not int or reconnect_retries < 0:
            raise ConfigError(f"reconnect_retries must be an integer >= 0, got "
                              f"{reconnect_retries!r}")
        self.conninfo = conninfo
        self.schema = schema
        self.lease_ms = lease_ms
        self.reconnect_retries = reconnect_retries
        self._url = redact(url or f"{conninfo}{'&' if '?' in conninfo else '?'}schema={schema}")
        self._closed = False
        self._prepare_sql()
        psycopg = _psycopg()
        # Shared with every backend of this process on the same URL; its connections bound
        # every wait by the lease (see _pool and docs/stores.md#takeover).
        self._migrate_on_use = migrate
        self._create_schema = create_schema
        self._pool = acquire_pool(psycopg, conninfo, lease_ms=lease_ms, max_size=pool_size,
                                  timeout_s=CONNECT_TIMEOUT_S)
        try:
            # The first connection, opened here (an unreachable server is refused by the open);
            # no statement is sent: the schema is checked by the first statement that needs it.
            with self._conn("open", None, check=False):
                pass
        except BaseException:
            release_pool(self._pool)
            raise

    @property
    def schema_version(self) -> int:
        """The schema's migration version (checked, or migrated, on first use through the pool).

        Raises:
            PersistenceError: behind with ``migrate`` false (MIGRATION_REQUIRED), or the
                database failed.
            SessionFormatUnsupportedError: migrated by a newer dsh.
        """
        return self._schema_state()[0]

    @property
    def store_id(self) -> str:
        """The store's id (``store_state.store_id``), as the schema check read it.

        Raises:
            As :attr:`schema_version`.
        """
        return self._schema_state()[1]

    def _schema_state(self) -> tuple[int, str]:
        known = self._pool.schemas.get(self.schema)
        return known if known is not None else self._check_schema()

    def _check_schema(self, conn: Any = None) -> tuple[int, str]:
        """Check the schema in full (one statement when current), migrating it when behind.

        Run when this pool has not checked the schema, or when a statement that read the
        schema state on the way (:meth:`_read_batch`) found it missing, behind or ahead.
        Migrations run only when it is behind (docs/stores.md#connections-and-the-schema-check).

        Raises:
            PersistenceError: behind with ``migrate`` false (MIGRATION_REQUIRED), or the
                database failed.
            SessionFormatUnsupportedError: migrated by a newer dsh.
        """
        if conn is None:
            with self._conn("schema check", None, check=False) as own:
                return self._check_schema(own)
        psycopg = _psycopg()
        try:
            row = conn.execute(self._sql_schema_state).fetchone()
            version: int | None = None if row[0] is None else int(row[0])
        except psycopg.errors.UndefinedTable:
            version = None  # a new schema, or one before migration 1
        if version is None or version < SCHEMA_VERSION:
            version = self._migrate(conn, apply=self._migrate_on_use)
            row = conn.execute(self._sql_schema_state).fetchone()
        self._refuse_newer(version)
        known = self._pool.schemas[self.schema] = (version, str(row[1]))
        return known

    def _read_batch(self, action: str, session_id: str | None,
                    statements: list[tuple[str, Sequence[Any]]]) -> list[list[tuple[Any, ...]]]:
        """Run read-only ``statements`` in one snapshot and one round trip; each one's rows.

        When this pool has not checked the schema yet, the check rides in the same message
        (the schema state read first, in the same snapshot): a schema at this build's version
        is recorded and costs no round trip of its own. One that is missing, behind or ahead
        (a statement fails on a missing table or column, or the version differs) is checked
        in full, migrated or refused, and the statements run again.
        Rule: docs/stores.md#connections-and-the-schema-check.

        Raises:
            PersistenceError: the database failed, or (MIGRATION_REQUIRED) the schema is
                behind and ``migrate`` is false.
            SessionFormatUnsupportedError: migrated by a newer dsh.
        """
        psycopg = _psycopg()
        if self.schema in self._pool.schemas:
            with self._conn(action, session_id) as conn:
                return self._batch(conn, statements, begin=True, commit=True)
        try:
            with self._conn(action, session_id, check=False, passthrough=_SCHEMA_ERRORS) as conn:
                state, *results = self._batch(conn, [(self._sql_schema_state, ()), *statements],
                                              begin=True, commit=True)
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn,
                psycopg.errors.InvalidSchemaName):
            state = []  # no schema, or one too old for these statements
        if state and state[0][0] == SCHEMA_VERSION:
            self._pool.schemas[self.schema] = (SCHEMA_VERSION, str(state[0][1]))
            return results
        self._check_schema()  # migrates, or refuses
        with self._conn(action, session_id) as conn:
            return self._batch(conn, statements, begin=True, commit=True)

    def _prepare_sql(self) -> None:
        s = self._s = quote_schema(self.schema)
        self.channel = f"dsh_{self.schema}"[:63]
        self._sql_schema_state = (f"SELECT (SELECT max(version) FROM {s}.dsh_migrations), "
                                  f"(SELECT store_id::text FROM {s}.store_state)")
        self._sql_session_row = f"SELECT {_SESSION_COLUMNS} FROM {s}.sessions WHERE id = %s"
        self._sql_rows_from = (f"SELECT {_ROW_COLUMNS} FROM {s}.events WHERE session_id = %s "
                               "AND seq >= %s ORDER BY seq")
        # the rows holding the seqs of an array (a packed row is keyed by its first member)
        self._sql_rows_holding = (
            f"SELECT {_ROW_COLUMNS} FROM {s}.events WHERE session_id = %s AND seq IN (SELECT "
            f"(SELECT max(e.seq) FROM {s}.events e WHERE e.session_id = %s AND e.seq <= w.seq) "
            "FROM unnest(%s::text::bigint[]) AS w(seq)) ORDER BY seq")
        # a page: from the row holding ``start`` (a packed row is keyed by its first member)
        self._sql_rows_between = (
            f"SELECT {_ROW_COLUMNS} FROM {s}.events WHERE session_id = %s AND seq >= coalesce("
            f"(SELECT max(seq) FROM {s}.events WHERE session_id = %s AND seq <= %s), 0) AND "
            "seq < %s ORDER BY seq")
        self._sql_packed_before = (
            f"SELECT {_ROW_COLUMNS} FROM {s}.events WHERE session_id = %s AND ignorable = 0 "
            f"AND type IN {_CHUNK_TAGS_SQL} AND seq >= %s AND seq < %s ORDER BY seq")
        # One round trip: lock the row, read the fence, and see whether rows lie past the head.
        self._sql_lock_row = (
            f"SELECT head_seq, lease_owner::text, lease_epoch, EXISTS (SELECT 1 FROM {s}.events "
            f"e WHERE e.session_id = t.id AND e.seq >= t.head_seq), listing FROM {s}.sessions t "
            "WHERE id = %s FOR NO KEY UPDATE OF t")
        lease_set = ("lease_owner = %s, lease_epoch = lease_epoch + 1, lease_expires_at = "
                     "clock_timestamp() + %s * interval '1 millisecond', lease_pid = %s, "
                     f"lease_host = %s, lease_node = %s, lease_since = {_NOW_MS}")
        # the lease, the head, the listing entry and the restore point in one statement: what
        # the new holder reads next cannot change under its lease but through it
        returned = (f"lease_epoch, head_seq, listing, (SELECT r.data FROM {s}.restore_points r "
                    "WHERE r.session_id = id), restore_point_digest")
        # moves nothing in a schema at another version than this build's: the check a pool's
        # first open rides in the same message (see _take_lease)
        self._sql_take_lease = (
            f"UPDATE {s}.sessions SET {lease_set} WHERE id = %s AND (lease_owner IS NULL OR "
            "lease_expires_at <= clock_timestamp()) AND (SELECT max(version) FROM "
            f"{s}.dsh_migrations) = {SCHEMA_VERSION} RETURNING {returned}")
        self._sql_take_dead_lease = (
            f"UPDATE {s}.sessions SET {lease_set} WHERE id = %s AND lease_owner = %s AND "
            f"lease_epoch = %s RETURNING {returned}")
        self._sql_holder_of = (f"SELECT lease_owner, lease_epoch, lease_pid, lease_host, "
                               f"lease_node FROM {s}.sessions WHERE id = %s")
        self._sql_last_row_before = (f"SELECT {_ROW_COLUMNS} FROM {s}.events WHERE session_id "
                                     "= %s AND seq < %s ORDER BY seq DESC LIMIT 1")
        self._sql_last_row_at_head = (
            f"SELECT {_ROW_COLUMNS} FROM {s}.events WHERE session_id = %s AND seq < (SELECT "
            f"head_seq FROM {s}.sessions WHERE id = %s) ORDER BY seq DESC LIMIT 1")
        self._sql_get_restore_point = (
            f"SELECT r.data, t.restore_point_digest FROM {s}.restore_points r JOIN {s}.sessions "
            "t ON t.id = r.session_id WHERE r.session_id = %s")
        # a restore point read with the lookup (another snapshot than the rows): unchanged?
        self._sql_restore_point_check = (
            f"SELECT md5(r.data), t.restore_point_digest FROM {s}.restore_points r JOIN "
            f"{s}.sessions t ON t.id = r.session_id WHERE r.session_id = %s")
        # fenced: only the lease holder replaces it (a former holder's would be stale); the
        # digest the resume compares goes into the session row in the same statement
        self._sql_put_restore_point = (
            f"WITH bound AS (UPDATE {s}.sessions SET restore_point_digest = %s WHERE id = %s "
            "AND lease_owner = %s::uuid AND lease_epoch = %s RETURNING id) "
            f"INSERT INTO {s}.restore_points (session_id, data) SELECT id, %s FROM bound "
            "ON CONFLICT (session_id) DO UPDATE SET data = excluded.data")
        self._sql_lease_row = (f"SELECT head_seq, lease_owner::text, lease_epoch FROM "
                               f"{s}.sessions WHERE id = %s")
        self._sql_delete_beyond = f"DELETE FROM {s}.events WHERE session_id = %s AND seq >= %s"
        self._sql_copy = (f"COPY {s}.events (session_id, seq, type, time, data, data_zstd, "
                          "source_event_seqs, surface_op, ignorable) FROM STDIN")
        # What a resume reads next, sent in the lease's message (see _take_lease): the session
        # row and the rows of a short log without a restore point, each only under the lease
        # that message just took (its owner is the new token), so nothing can move them but
        # the new holder (docs/stores.md#connections-and-the-schema-check). The session row's
        # last column says whether the rows statement reads them: only the holder writes a
        # restore point, so one absent here is absent there too.
        held_rows = (f"t.head_seq <= {RESUME_READ_MAX_EVENTS} AND NOT EXISTS (SELECT 1 FROM "
                     f"{s}.restore_points r WHERE r.session_id = t.id)")
        self._sql_session_row_held = (f"SELECT {_SESSION_COLUMNS}, {held_rows} FROM "
                                      f"{s}.sessions t WHERE id = %s AND lease_owner = %s::uuid")
        self._sql_rows_held = (
            f"SELECT {_ROW_COLUMNS} FROM {s}.events WHERE session_id = %s AND EXISTS (SELECT 1 "
            f"FROM {s}.sessions t WHERE t.id = %s AND t.lease_owner = %s::uuid AND {held_rows}) "
            "ORDER BY seq")
        # Advancing the head, extending the lease and the NOTIFY (sent at commit) in one statement.
        # The listing entry and the size change only with the head (docs/formats.md#postgresql).
        self._sql_advance = (
            f"UPDATE {s}.sessions SET head_seq = %s, revision = revision + 1, lease_expires_at = "
            "clock_timestamp() + %s * interval '1 millisecond', size_bytes = size_bytes + %s, "
            "listing = CASE WHEN %s THEN %s ELSE listing END WHERE id = %s "
            f"RETURNING pg_notify('{self.channel}', %s)")
        self._sql_replace_head = (
            f"UPDATE {s}.sessions SET head_seq = %s, revision = revision + 1, lease_expires_at = "
            "clock_timestamp() + %s * interval '1 millisecond', size_bytes = %s, listing = %s "
            f"WHERE id = %s RETURNING pg_notify('{self.channel}', %s)")

        # The batch's chain record (docs/formats.md#the-seal-chain), linked here to the
        # session's head on its row: ``batch`` its ``chain_batches``, ``prev`` its
        # ``chain_head`` (never a stored ``chain.hash``), the incarnation from the row; the
        # hash is taken in SQL and the UPDATE that moves ``head_seq`` moves the chain head to
        # it. Parameters: first, end, keys, then those of {src} (a row source of id,
        # incarnation, chain_batches and chain_head), then the middle and the host.
        def link(src: str) -> str:
            return (
                f"link AS (INSERT INTO {s}.chain (session_id, batch, first_seq, end_seq, "
                "hashed, keys, hash) SELECT f.id, f.chain_batches, %s, %s, h.hashed, %s, "
                f"sha256('\\x{chain_domain().hex()}'::bytea || h.hashed) FROM {src} f CROSS "
                "JOIN LATERAL (SELECT f.chain_head || %s::bytea || uuid_send(f.incarnation) "
                "|| %s::bytea AS hashed) h RETURNING hash)")

        moved = "chain_batches = t.chain_batches + 1, chain_head = (SELECT hash FROM link), "
        self._sql_advance_linked = (
            "WITH " + link(f"(SELECT t.id, t.incarnation, t.chain_batches, t.chain_head FROM "
                           f"{s}.sessions t WHERE t.id = %s)") + " "
            + self._sql_advance.replace(f"UPDATE {s}.sessions SET ",
                                        f"UPDATE {s}.sessions t SET {moved}", 1))

        # The whole append in one statement: the fenced lock, the rows (one JSON array of
        # row arrays, bytea as hex), the chain record, the head, the lease and the NOTIFY; a
        # refused fence writes nothing and returns no row.
        self._sql_append_one = (
            "WITH fence AS (SELECT t.id, t.incarnation, t.chain_batches, t.chain_head FROM "
            f"{s}.sessions t WHERE t.id = %s AND "
            "t.lease_owner = %s::uuid AND t.lease_epoch = %s AND t.head_seq = %s AND NOT EXISTS "
            f"(SELECT 1 FROM {s}.events e WHERE e.session_id = t.id AND e.seq >= t.head_seq) "
            f"FOR NO KEY UPDATE OF t), rows AS (INSERT INTO {s}.events (session_id, seq, type, "
            "time, data, data_zstd, source_event_seqs, surface_op, ignorable) SELECT fence.id, "
            "(r->>0)::bigint, r->>1, (r->>2)::bigint, r->>3, decode(r->>4, 'hex'), "
            "decode(r->>5, 'hex'), r->>6, (r->>7)::smallint FROM fence, "
            "json_array_elements(%s::json) AS r), " + link("fence") + " "
            f"UPDATE {s}.sessions t SET {moved}head_seq = %s, revision = t.revision + 1, "
            "lease_expires_at = clock_timestamp() + %s * interval '1 millisecond', size_bytes = "
            "t.size_bytes + %s, listing = %s FROM fence "
            f"WHERE t.id = fence.id RETURNING pg_notify('{self.channel}', %s)")

    def _copy_rows(self, conn: Any, session_id: str, rows: Sequence[Any]) -> None:
        """Insert encoded rows with ``COPY`` (bulk: no per-row statement or round trip)."""
        if not rows:
            return
        with conn.cursor() as cur, cur.copy(self._sql_copy) as copy:
            for r in rows:
                copy.write_row((session_id, *_bind(r)))

    def _chain_rows(self, conn: Any, session_id: str, stored: list[bytes] | None = None
                    ) -> list[ChainRecord]:
        """The session's chain records in batch order, hashes recomputed.

        ``stored`` (if given) receives the hash stored beside each record.
        """
        found = conn.execute(f"SELECT hashed, keys, hash FROM {self._s}.chain WHERE "
                             "session_id = %s ORDER BY batch", (session_id,)).fetchall()
        if stored is not None:
            stored.extend(bytes(h) for _, _, h in found)
        try:
            return [stored_record(bytes(h), bytes(k)) for h, k, _ in found]
        except ValueError as exc:
            raise LogCorruptError(f"the chain of session {session_id!r} in {self._url} "
                                  f"(table {self.schema}.chain) is damaged: {exc}",
                                  path=self._url, session_id=session_id) from exc

    def chain_records(self, session_id: str) -> KeptChain:
        """The session's chain (``where`` = ``<url> table <schema>.chain``) and its row's head.

        One read-only snapshot of the session row (incarnation, ``chain_batches``,
        ``chain_head``) and its records (see ``KeepsChain.chain_records``;
        docs/formats.md#the-seal-chain).

        Raises:
            SessionNotFoundError: no such session.
            LogCorruptError: a stored record is too short to be one.
        """
        stored: list[bytes] = []
        with self._conn("chain", session_id) as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            found = conn.execute(f"SELECT incarnation::text, chain_batches, chain_head FROM "
                                 f"{self._s}.sessions WHERE id = %s", (session_id,)).fetchone()
            if found is None:
                raise SessionNotFoundError(f"session {session_id!r} is not stored in "
                                           f"{self._url}", session_id=session_id,
                                           path=self._url)
            records = self._chain_rows(conn, session_id, stored)
        return KeptChain(f"{self._url} table {self.schema}.chain", str(found[0]), records,
                         tuple(stored), int(found[1]), bytes(found[2]))

    # migrations ------------------------------------------------------------------------

    def _applied_version(self, conn: Any) -> int | None:
        found = conn.execute("SELECT to_regclass(%s)", (f"{self._s}.dsh_migrations",)).fetchone()
        if found[0] is None:
            return None
        row = conn.execute(f"SELECT coalesce(max(version), 0) FROM {self._s}.dsh_migrations"
                           ).fetchone()
        return int(row[0])

    def _migrate(self, conn: Any, *, apply: bool, target: int = SCHEMA_VERSION) -> int:
        """Bring the schema to ``target`` (forward only); return the version now applied."""
        version = self._applied_version(conn)
        if version is None and not self._create_schema and conn.execute(
                "SELECT to_regclass(%s)", (f"{self._s}.sessions",)).fetchone()[0] is None:
            # read-only: create nothing
            # (docs/stores.md#postgresql-one-session-one-writer-on-any-number-of-hosts)
            raise ConfigError(f"no store at {self._url!r} (PostgreSQL schema {self.schema!r} "
                              "holds no dsh store); check the URL, or create an empty store "
                              f"with 'dsh init --store {self._url}' (or dsh.open(url, "
                              "create_schema=True))", code="STORE_NOT_FOUND",
                              path=self._url)
        if version is not None and version >= target:
            self._refuse_newer(version)
            return version
        if not apply:
            raise PersistenceError(
                f"PostgreSQL store {self._url} is at schema version {version or 0}, this build "
                f"needs {target}; run `dsh migrate --store URL` first", code="MIGRATION_REQUIRED",
                path=self._url)
        with conn.transaction():
            # Serialises hosts starting at once; released at commit, never held by a session.
            conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                         (MIGRATION_LOCK_KEY, self.schema))
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self._s}")
            conn.execute(f"""CREATE TABLE IF NOT EXISTS {self._s}.dsh_migrations (
  version    integer PRIMARY KEY,
  name       text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)""")
            version = self._applied_version(conn) or 0
            self._refuse_newer(version)
            for number, name, statements in MIGRATIONS:
                if version < number <= target:
                    for statement in statements:
                        conn.execute(statement.replace("{s}", self._s))
                    conn.execute(f"INSERT INTO {self._s}.dsh_migrations (version, name) "
                                 "VALUES (%s, %s)", (number, name))
                    logger.info("applied PostgreSQL migration %s (%s) to %s", number, name,
                                self._url)
                    version = number
        return version

    def _refuse_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise SessionFormatUnsupportedError(
                f"PostgreSQL store {self._url} is at schema version {version}, newer than this "
                f"build's {SCHEMA_VERSION}; upgrade dsh to open it", path=self._url,
                version=version)

    def migrate(self) -> int:
        """Apply pending migrations now (``dsh migrate``); return the schema version.

        Safe to run from many hosts at once: each migration is applied exactly once.

        Raises:
            SessionFormatUnsupportedError: the store is newer than this build.
            PersistenceError: the database failed.
        """
        with self._conn("migrate", None, check=False) as conn:
            self._migrate(conn, apply=True)
            self._pool.schemas.pop(self.schema, None)
            return self._check_schema(conn)[0]

    # plumbing --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The store URL (password redacted)."""
        return self._url

    def _batch(self, conn: Any, statements: Sequence[tuple[str, Sequence[Any]]], *,
               begin: bool, commit: bool) -> list[list[tuple[Any, ...]]]:
        """Run ``statements`` as one query message (one round trip); return each one's rows.

        ``begin`` opens a read-only ``REPEATABLE READ`` transaction first, so every statement
        (and those of a later batch until ``commit``) reads one snapshot; ``commit`` ends it.
        Parameters are bound by psycopg's client-side quoting (the simple query protocol
        takes several statements in one message; the extended one takes one).
        """
        return _one_message(conn, statements,
                            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if begin else None,
                            "COMMIT" if commit else None)

    @contextlib.contextmanager
    def _conn(self, action: str, session_id: str | None, *, passthrough: tuple[str, ...] = (),
              check: bool = True) -> Iterator[Any]:
        """A pooled connection; driver errors become :class:`PersistenceError`.

        ``passthrough`` names psycopg error classes (``"OperationalError"``) raised as they are,
        for callers that handle them. With ``check``, a schema this pool has not checked yet is
        checked on the connection first (:meth:`_check_schema`); statements that read the
        schema state themselves (:meth:`_read_batch`) pass False.
        """
        if self._closed:
            raise PersistenceError(f"PostgreSQL backend for {self._url} is closed", code="CLOSED",
                                   path=self._url)
        psycopg = _psycopg()
        try:
            with self._pool.connection() as conn:
                if check and self.schema not in self._pool.schemas:
                    self._check_schema(conn)
                yield conn
        except PoolTimeoutError as exc:
            cause = exc.__cause__
            if cause is not None:  # a connect that failed: say why, not that time ran out
                raise _connect_error(cause, self._url, action, session_id) from exc
            raise PersistenceError(f"cannot reach PostgreSQL for store {self._url} ({action}): "
                                   f"no connection within {CONNECT_TIMEOUT_S} s: {exc}",
                                   code="DATABASE_UNREACHABLE", path=self._url,
                                   session_id=session_id) from exc
        except psycopg.Error as exc:
            if any(isinstance(exc, getattr(psycopg.errors, name)) for name in passthrough):
                raise
            self._fail(exc, action, session_id)

    def _fail(self, exc: Exception, action: str, session_id: str | None) -> NoReturn:
        raise PersistenceError(f"PostgreSQL {action} failed for {self._url}: {exc}",
                               code="POSTGRES", path=self._url, session_id=session_id) from exc

    # sessions --------------------------------------------------------------------------

    def create(self, header: Mapping[str, object]) -> None:
        """Store a new session with ``header``, no events and a free lease.

        Raises:
            SessionExistsError: a session with ``header["id"]`` is already stored.
            EventRejectedError: the header is not a valid ``SessionHeader`` (code HEADER).
            PersistenceError: the database failed.
        """
        h = normalize_header(header)
        psycopg = _psycopg()
        try:
            with self._conn("create", h["id"], passthrough=("UniqueViolation",)) as conn:
                conn.execute(
                    f"INSERT INTO {self._s}.sessions (id, version, created_at, cwd, "
                    "parent_session, seed_length, origin, delegation_depth, agent_preset, "
                    "incarnation, metadata, listing) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, "
                    "%s, %s, %s)",
                    (h["id"], h["version"], h["createdAt"], h.get("cwd"), h.get("parentSession"),
                     h.get("seedLength"), h.get("origin"), h.get("delegationDepth"),
                     h.get("agentPreset"), uuid.uuid4(),
                     std_json.dumps(dict(h["metadata"]), ensure_ascii=False, sort_keys=True)
                     if h.get("metadata") else None, stored_entry(EntryFold.start(h))))
        except psycopg.errors.UniqueViolation as exc:
            raise SessionExistsError(f"session {h['id']!r} already exists in {self._url}",
                                     session_id=h["id"], path=self._url) from exc

    def exists(self, session_id: str) -> bool:
        """Return whether a session row with this id is stored (one round trip).

        An id no backend can store (see ``session_id_problem``) is never stored.
        """
        if session_id_problem(session_id) is not None:
            return False
        found = self._read_batch("lookup", session_id, [
            (f"SELECT 1 FROM {self._s}.sessions WHERE id = %s", (session_id,))])
        return bool(found[0])

    def read_whole(self, session_id: str) -> ColdRead:
        """Open ``session_id`` for reading and read its committed log: one round trip.

        The lookup is the read itself (no session row: not found), in one read-only
        snapshot with the rows; a pool's first statement also carries the schema check
        (docs/stores.md#connections-and-the-schema-check). Contract:
        :class:`~dsh.persistence._contract.ReadsWhole`.

        Raises:
            ConfigError: (code INVALID_ID) an id no backend can store.
            SessionNotFoundError: no such session.
            LogCorruptError, SessionFormatUnsupportedError, PersistenceError: as
                :meth:`PostgresHandle.read` raises them.
        """
        check_session_id(session_id)
        sessions, rows = self._read_batch("read", session_id, self._whole_read(session_id))
        return PostgresHandle(self, session_id, "read", None)._decoded(
            sessions[0] if sessions else None, rows, 0, 0)

    def _whole_read(self, session_id: str) -> list[tuple[str, Sequence[Any]]]:
        """The statements of a whole read: the session row, then every row of the session."""
        return [(self._sql_session_row, (session_id,)), (self._sql_rows_from, (session_id, 0))]

    # asides (docs/stores.md#asides): table ``asides``, made by migration 12 (and, in a schema
    # an earlier build migrated, by the first write)

    def read_aside(self, session_id: str, name: str, *, head: bool = False) -> bytes | None:
        """The aside's bytes from table ``asides``; None when it (or the table) is not there.

        ``head``: only its bytes up to and including the first newline (``b""`` without one),
        cut by the server, as :meth:`open_at_restore_point` reads heads.

        Raises:
            PersistenceError: the database failed.
        """
        psycopg = _psycopg()
        try:
            with self._conn("aside read", session_id, passthrough=("UndefinedTable",)) as conn:
                # binary: the bytes as stored, not hex text to decode (an index is 100s of KB)
                row = conn.execute(f"SELECT {_ASIDE_HEAD if head else 'data'} FROM {self._s}"
                                   ".asides WHERE session_id = %s AND name = %s",
                                   (session_id, name), binary=True).fetchone()
        except psycopg.errors.UndefinedTable:
            return None
        return bytes(row[0]) if row is not None else None

    def write_aside(self, session_id: str, name: str, data: bytes) -> None:
        """Replace the aside's row in table ``asides`` (the table made when missing).

        Raises:
            PersistenceError: the database failed.
        """
        with self._conn("aside write", session_id) as conn, conn.transaction():
            # two first writers would race to make the table: one makes it, under the lock
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"{self._s}.asides",))
            conn.execute(ASIDES_TABLE.format(s=self._s))
            conn.execute(f"INSERT INTO {self._s}.asides (session_id, name, data) VALUES "
                         "(%s, %s, %s) ON CONFLICT (session_id, name) DO UPDATE SET data = "
                         "excluded.data", (session_id, name, data))

    def drop_asides(self, session_id: str) -> None:
        """Delete the session's rows of table ``asides`` (none, or no table, is fine).

        Raises:
            PersistenceError: the database failed.
        """
        psycopg = _psycopg()
        try:
            with self._conn("aside drop", session_id, passthrough=("UndefinedTable",)) as conn:
                conn.execute(f"DELETE FROM {self._s}.asides WHERE session_id = %s",
                             (session_id,))
        except psycopg.errors.UndefinedTable:
            return

    def search_index(self) -> SearchIndex:
        """The store's search index (docs/stores.md#search), over a connection of its own.

        Raises:
            PersistenceError: the database failed.
        """
        from dsh.persistence.postgres._search import PostgresSearchIndex

        psycopg = _psycopg()
        self._schema_state()  # the index's tables live in the schema: check (or create) it first
        try:
            return PostgresSearchIndex(self.conninfo, self.schema, fold, label=self._url)
        except psycopg.Error as exc:
            self._fail(exc, "search", None)

    def list_headers(self) -> Iterator[FrozenDict]:
        """Yield every stored header in creation order, without reading events.

        Raises:
            LogCorruptError: a session row is invalid.
        """
        with self._conn("list", None) as conn:
            rows = conn.execute(f"SELECT {_SESSION_COLUMNS} FROM {self._s}.sessions ORDER BY ord"
                                ).fetchall()
        for row in rows:
            yield _with_metadata(decode_session_row(row[:11], path=self._url)[0], row[12],
                                 self._url)

    def list_activity(self, read: ReadFn) -> tuple[list[tuple[FrozenDict, int]], list[DshError]]:
        """``(header, last_activity_ms)`` of every session, from :meth:`list_entries`."""
        entries, errors = self.list_entries(read)
        return [(e.header, e.last_activity_ms) for e in entries], errors

    def change_stamp(self) -> int:
        """The sum of ``store_changes`` (migration 11), read in one small query.

        Every commit that inserts or deletes a session row or moves its revision (each append,
        redaction, erasure) adds to it. Rule: docs/view.md#what-the-viewer-keeps.

        Raises:
            PersistenceError: the database failed (a schema before migration 11 too).
        """
        with self._conn("stamp", None) as conn:
            row = conn.execute(f"SELECT sum(n) FROM {self._s}.store_changes").fetchone()
        return int(row[0] or 0)

    def _hiding(self, session_ids: Sequence[str]) -> set[str]:
        """The sessions among ``session_ids`` whose log holds a removal or quarantine record.

        An entry stored before :data:`~dsh.persistence._listing.STORED_VERSION` 2 is right
        only for a log without one (docs/formats.md, PostgreSQL ``listing``).
        """
        with self._conn("list", None) as conn:
            rows = conn.execute(
                f"SELECT DISTINCT session_id FROM {self._s}.events WHERE session_id = ANY(%s) "
                "AND (type = ANY(%s) OR (type = 'assistant/message' AND surface_op IS NOT NULL "
                "AND surface_op <> '\"append\"'))",
                (list(session_ids), list(HIDING_TYPES))).fetchall()
        return {str(r[0]) for r in rows}

    def removal_events(self, session_ids: Sequence[str]
                       ) -> dict[str, Sequence[Mapping[str, Any]] | None]:
        """The sessions among ``session_ids`` whose log may have taken a message off the view.

        One query for all of them over their events rows picks those holding a quarantine
        record or an ``assistant/message`` / ``tool/result`` replace
        (:data:`~dsh.persistence._listing.MAY_REMOVE_SQL`); each is named with None, so the
        caller reads its log whole (its rows decode only as a scan of the log checks them).
        Contract: :class:`~dsh.persistence._search.KnowsRemovals`.

        Raises:
            PersistenceError: the database failed.
        """
        with self._conn("list", None) as conn:
            rows = conn.execute(
                f"SELECT DISTINCT session_id FROM {self._s}.events WHERE session_id = ANY(%s) "
                f"AND {MAY_REMOVE_SQL}", (list(session_ids),)).fetchall()
        return dict.fromkeys(str(r[0]) for r in rows)

    def list_entries(self, read: ReadFn) -> tuple[list[ListingEntry], list[DshError]]:
        """Entries of every session from one query over the sessions rows; no log is read.

        Every append stores the entry of the committed log and its data bytes beside the
        head, in the same transaction. A session whose entry is not stored (written before
        migration 6, or by a writer that could not know it) is read in full through
        ``read``, which names any damage exactly as a read does.

        Returns:
            The entries of sessions with at least one event (``size_bytes``: the bytes of the
            committed rows' data), and one error per log that could not be read
            (``where["session_id"]`` names it).

        Raises:
            LogCorruptError: a sessions row is invalid.
            PersistenceError: the database failed.

        Rule: docs/stores.md#capabilities (``listing``).
        """
        with self._conn("list", None) as conn:
            rows = conn.execute(f"SELECT {_SESSION_COLUMNS}, listing, size_bytes FROM "
                                f"{self._s}.sessions ORDER BY ord").fetchall()
        out: list[ListingEntry] = []
        unknown: list[str] = []
        legacy: list[str] = []
        sizes: dict[str, int] = {}
        for row in rows:
            header = _with_metadata(decode_session_row(row[:11], path=self._url)[0], row[12],
                                    self._url)
            sid, head = str(header["id"]), int(row[11])
            sizes[sid] = int(row[14])
            if head == 0:
                continue
            fold = None if row[13] is None else entry_from_stored(row[13])
            if fold is None or fold.entry.events != head or fold.entry.id != sid:
                unknown.append(sid)
                continue
            out.append(dataclasses.replace(fold.entry, header=header, size_bytes=sizes[sid]))
            if fold.legacy:
                legacy.append(sid)
        if legacy:  # an entry stored before titles followed the model view: read those
            hiding = self._hiding(legacy)  # whose log took a message off (docs/formats.md)
            unknown += [e.id for e in out if e.id in hiding]
            out = [e for e in out if e.id not in hiding]
        more, errors = read_entries(unknown, read)
        return out + [dataclasses.replace(e, size_bytes=sizes.get(e.id)) for e in more], errors

    def open(self, session_id: str, mode: OpenMode = "read") -> PostgresHandle:
        """Open a stored session; ``"write"`` takes the lease (epoch + 1) before anything else.

        Raises:
            ConfigError: ``mode`` is not ``"read"`` or ``"write"``, or (code INVALID_ID) an id
                no backend can store (the id rule shared by every backend).
            SessionBusyError: ``"write"`` while another handle (any host) holds an unexpired
                lease; ``where`` names it (pid, host, since ms, epoch, expires_in_ms, and
                ``holder``: ``this process`` for another handle of this process).
            SessionNotFoundError: no such session.
            PersistenceError: the database failed.
        """
        if mode not in ("read", "write"):
            raise ConfigError(f"open mode must be 'read' or 'write', got {mode!r}")
        check_session_id(session_id)
        if mode == "read":
            if not self.exists(session_id):
                raise SessionNotFoundError(f"session {session_id!r} is not stored in "
                                           f"{self._url}", session_id=session_id, path=self._url)
            return PostgresHandle(self, session_id, mode, None)
        token = str(uuid.uuid4())
        psycopg = _psycopg()
        # A former holder paused inside its append transaction holds the row lock until the
        # server ends that transaction (idle_in_transaction_session_timeout = lease_ms): wait
        # for the lock a lease at a time (lock_timeout), TAKEOVER_LOCK_TRIES times at most.
        for attempt in range(TAKEOVER_LOCK_TRIES):
            try:
                row, held = self._take_lease(session_id, token)
                break
            except psycopg.errors.LockNotAvailable as exc:
                if attempt + 1 == TAKEOVER_LOCK_TRIES:
                    raise SessionBusyError(
                        f"session {session_id!r} in {self._url}: its row stayed locked by "
                        f"another transaction for {TAKEOVER_LOCK_TRIES} leases "
                        f"({self.lease_ms} ms each); a transaction outside dsh holds it, end "
                        f"it and retry", session_id=session_id) from exc
        logger.debug("took the lease of session %s at epoch %s", session_id, row[0])
        stored = None if row[2] is None else entry_from_stored(row[2])
        if stored is not None and stored.legacy:
            # stored before titles followed the model view: kept only where no message left it
            stored = None if self._hiding([session_id]) else stored
            if stored is not None:
                stored.legacy = False
        handle = PostgresHandle(self, session_id, mode,
                                _Lease(self, session_id, token, int(row[0])),
                                None if stored is None else (int(row[1]), stored))
        handle._restore_point_row = (None if row[3] is None else bytes(row[3]), row[4])
        handle._read_with_lease = held
        return handle

    def open_at_restore_point(self, session_id: str, *, aside_heads: Sequence[str] = ()
                              ) -> PostgresHandle:
        """Open for reading through the restore point: the lookup reads the restore point too.

        One round trip (the schema check of a pool's first statement riding in it) instead of
        the lookup's and the restore point's; the handle's first
        :meth:`PostgresHandle.read_from_restore_point` then reads only the rows, and checks in
        their snapshot that the restore point is still the one read (else reads it again).
        The same message reads the head of each aside named in ``aside_heads`` (its bytes up
        to and including the first newline; ``b""`` when it has none), kept in the handle's
        ``aside_heads`` (a name -> None when the session keeps no such aside).
        Contract: :class:`~dsh.persistence._restore_point.OpensAtRestorePoint`.

        Raises:
            ConfigError: (code INVALID_ID) an id no backend can store.
            SessionNotFoundError: no such session.
            PersistenceError: the database failed.
        """
        check_session_id(session_id)
        found, points, *heads = self._read_batch("lookup", session_id, [
            (f"SELECT 1 FROM {self._s}.sessions WHERE id = %s", (session_id,)),
            (self._sql_get_restore_point, (session_id,)),
            *((f"SELECT {_ASIDE_HEAD} FROM {self._s}.asides WHERE session_id = %s AND "
               "name = %s", (session_id, name))
              for name in aside_heads)])
        if not found:
            raise SessionNotFoundError(f"session {session_id!r} is not stored in {self._url}",
                                       session_id=session_id, path=self._url)
        handle = PostgresHandle(self, session_id, "read", None)
        handle._restore_point_row = ((bytes(points[0][0]), points[0][1]) if points
                                     else (None, None))
        handle.aside_heads = {name: bytes(rows[0][0]) if rows else None
                              for name, rows in zip(aside_heads, heads, strict=True)}
        return handle

    def _take_lease(self, session_id: str, token: str
                    ) -> tuple[tuple[Any, ...], tuple[tuple[Any, ...], list[Any]] | None]:
        """Take the lease (free, expired, or held by a holder dead on this node).

        One round trip when the lease is free, the schema check of a pool's first statement
        included: the schema state rides in the same message and the statement moves the
        lease only in a schema at this build's version. A schema missing, behind or ahead is
        checked in full (migrated, or refused) before the lease is tried again. The same
        message reads, under the lease it takes, the session row and, for a log of at most
        :data:`RESUME_READ_MAX_EVENTS` events without a restore point, its rows: what a
        resume reads next (docs/stores.md#connections-and-the-schema-check).

        Returns:
            The lease row (epoch, head, listing, restore point, its digest), and the session
            row and rows read with it (None when the message did not take the lease, or the
            log is longer or has a restore point).

        Raises:
            SessionBusyError: a live holder's lease has not expired.
            SessionNotFoundError: no such session.
            psycopg.errors.LockNotAvailable: the row stayed locked for a lease.
        """
        psycopg = _psycopg()
        folded = self.schema not in self._pool.schemas
        take = (self._sql_take_lease, (*self._lease_values(token), session_id))
        held = [(self._sql_session_row_held, (session_id, token)),
                (self._sql_rows_held, (session_id, session_id, token))]
        try:
            with self._conn("open", session_id, check=False, passthrough=(
                    "LockNotAvailable", *(_SCHEMA_ERRORS if folded else ()))) as conn:
                srows: list[Any] = []
                if folded:
                    state, taken, srows, rows = self._lease_batch(
                        conn, [(self._sql_schema_state, ()), take, *held])
                    if state and state[0][0] == SCHEMA_VERSION:
                        self._pool.schemas[self.schema] = (SCHEMA_VERSION, str(state[0][1]))
                    else:  # the statements moved and read nothing
                        self._check_schema(conn)  # migrates, or refuses
                        taken, srows, rows = self._lease_batch(conn, [take, *held])
                else:
                    taken, srows, rows = self._lease_batch(conn, [take, *held])
                if not taken:
                    return self._take_from_dead_holder(conn, session_id, token), None
                return taken[0], ((srows[0][:-1], rows) if srows and srows[0][-1] else None)
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn,
                psycopg.errors.InvalidSchemaName):
            self._check_schema()  # a schema missing or behind: migrated, or refused
            return self._take_lease(session_id, token)

    def _lease_batch(self, conn: Any, statements: Sequence[tuple[str, Sequence[Any]]]
                     ) -> list[list[tuple[Any, ...]]]:
        """Run lease statements in one transaction and one round trip, committed asynchronously.

        The commit does not wait for its WAL flush (``synchronous_commit = off`` for this
        transaction only). A lease move or release lost to a server crash only makes its
        holder's next append refused (the epoch in the row is not its own) or the next writer
        wait for the expiry; and an append's durable commit flushes the WAL up to itself,
        the lease statement before it included (docs/stores.md#takeover).
        """
        return _one_message(conn, statements, "BEGIN; SET LOCAL synchronous_commit = off",
                            "COMMIT")

    def _lease_values(self, token: str) -> tuple[Any, ...]:
        return (token, self.lease_ms, os.getpid(), socket.gethostname(), _this_node())

    def _take_from_dead_holder(self, conn: Any, session_id: str, token: str) -> Any:
        """Take over an unexpired lease whose holder is dead on this node, else raise busy.

        The holder is judged dead only when it ran on this node (same host name, boot and pid
        namespace, so its pid names a process here) and no such process lives (or it is a
        zombie). The lease moves only if it is still exactly the one judged (owner and epoch),
        with the epoch bumped, so a holder judged wrongly is fenced, never merged.
        Rule: docs/stores.md#takeover.
        """
        found = conn.execute(self._sql_holder_of, (session_id,)).fetchone()
        if found is None:
            raise SessionNotFoundError(f"session {session_id!r} is not stored in {self._url}",
                                       session_id=session_id, path=self._url)
        owner, epoch, pid, host, node = found
        if (owner is None or node is None or node != _this_node()
                or host != socket.gethostname() or pid is None or not _pid_is_dead(int(pid))):
            raise self._busy(conn, session_id)
        [taken] = self._lease_batch(conn, [(self._sql_take_dead_lease, (
            *self._lease_values(token), session_id, owner, epoch))])
        if not taken:  # the lease moved meanwhile (another writer took it, or it was freed)
            [taken] = self._lease_batch(conn, [(self._sql_take_lease,
                                                (*self._lease_values(token), session_id))])
            if not taken:
                raise self._busy(conn, session_id)
            return taken[0]
        row = taken[0]
        logger.warning("session %s in %s: took over the lease of pid %s on host %s, which is "
                       "dead, without waiting for its expiry (epoch %s -> %s)", session_id,
                       self._url, pid, host, epoch, row[0])
        return row

    def _holder(self, conn: Any, session_id: str) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = conn.execute(
            f"SELECT lease_pid, lease_host, lease_since, lease_epoch, "
            "greatest(0, (extract(epoch FROM lease_expires_at - clock_timestamp()) * 1000)"
            f"::bigint), lease_owner IS NULL, lease_owner FROM {self._s}.sessions "
            "WHERE id = %s",
            (session_id,)).fetchone()
        return row

    def _busy(self, conn: Any, session_id: str) -> SessionBusyError | SessionNotFoundError:
        found = self._holder(conn, session_id)
        if found is None:
            return SessionNotFoundError(f"session {session_id!r} is not stored in {self._url}",
                                        session_id=session_id, path=self._url)
        pid, host, since, epoch, expires_in, _free, owner = found
        host = printable(host) if isinstance(host, str) else host  # another host's text
        if _LIVE_LEASES.get(str(owner)) == os.getpid():  # renewed until that handle closes
            return SessionBusyError(
                f"session {session_id!r} in {self._url} is held for writing by this process "
                f"(pid {pid} on host {host}, since {since} ms, lease epoch {epoch}) through "
                f"another handle; only one writer at a time, close the other handle first",
                session_id=session_id, pid=pid, host=host, since=since, epoch=epoch,
                expires_in_ms=expires_in, holder="this process")
        return SessionBusyError(
            f"session {session_id!r} in {self._url} is held for writing by pid {pid} on host "
            f"{host} (since {since} ms, lease epoch {epoch}, expires in {expires_in} ms unless "
            f"renewed); only one writer at a time, retry after that holder closes or its lease "
            f"expires", session_id=session_id, pid=pid, host=host, since=since, epoch=epoch,
            expires_in_ms=expires_in, holder="another process")

    def _lease_lost(self, session_id: str, epoch: int, conn: Any = None) -> LeaseLostError:
        if conn is None:
            with self._conn("lease check", session_id) as fresh:
                found = self._holder(fresh, session_id)
        else:
            found = self._holder(conn, session_id)
        pid, host, since, now_epoch, _expires, free, _owner = found or (
            None, None, None, None, 0, True, None)
        host = printable(host) if isinstance(host, str) else host  # another host's text
        holder = ("nobody holds it now" if free else
                  f"pid {pid} on host {host} holds it since {since} ms")
        return LeaseLostError(
            f"lease of session {session_id!r} in {self._url} was lost: this writer had epoch "
            f"{epoch}, the session is at epoch {now_epoch} ({holder}); nothing of the refused "
            f"batch was written, open the session for writing again", session_id=session_id,
            pid=None if free else pid, host=None if free else host,
            since=None if free else since, epoch=now_epoch)

    def _renew(self, session_id: str, token: str, epoch: int) -> bool:
        with self._conn("lease renewal", session_id) as conn:
            [renewed] = self._lease_batch(conn, [(
                f"UPDATE {self._s}.sessions SET lease_expires_at = clock_timestamp() + "
                "%s * interval '1 millisecond' WHERE id = %s AND lease_owner = %s AND "
                "lease_epoch = %s RETURNING 1", (self.lease_ms, session_id, token, epoch))])
            return len(renewed) == 1

    def _release(self, session_id: str, token: str, epoch: int) -> None:
        with self._conn("lease release", session_id) as conn:
            self._lease_batch(conn, [(
                f"UPDATE {self._s}.sessions SET lease_owner = NULL, lease_expires_at = NULL "
                "WHERE id = %s AND lease_owner = %s AND lease_epoch = %s", (session_id, token,
                                                                           epoch))])

    # live readers ----------------------------------------------------------------------

    async def tail(self, session_id: str, from_seq: int = 0, *,
                   poll_ms: int = DEFAULT_TAIL_POLL_MS) -> AsyncIterator[Event]:
        """Yield the session's committed events from ``from_seq`` on, then each new one.

        ``LISTEN`` starts before the first read, so no commit falls between; each wake-up
        (a ``NOTIFY`` or ``poll_ms`` without one) reads from the next expected seq. Runs until
        the consumer stops iterating.

        Raises:
            SessionNotFoundError: no such session.
            LogCorruptError: the stored log skipped a seq.
            PersistenceError: the database failed.
        """
        psycopg = _psycopg()
        if not self.exists(session_id):
            raise SessionNotFoundError(f"session {session_id!r} is not stored in {self._url}",
                                       session_id=session_id, path=self._url)
        try:
            aconn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
        except psycopg.OperationalError as exc:
            raise _connect_error(exc, self._url, "follow", session_id) from exc

        async def wait() -> None:
            # Any commit in the schema wakes us (at most one read too many); poll_ms bounds a
            # missed or late notification.
            async for _ in aconn.notifies(timeout=poll_ms / 1000, stop_after=1):
                pass

        try:
            await aconn.execute(f'LISTEN "{self.channel}"')
            handle = PostgresHandle(self, session_id, "read", None)
            async for event in follow(handle, from_seq, wait):
                yield event
        except psycopg.Error as exc:
            self._fail(exc, "tail", session_id)
        finally:
            await aconn.close()

    def inject_torn_tail(self, session_id: str) -> None:
        """Test hook: a row with invalid JSON at the head, as external damage would leave.

        No dsh append can leave such a row (each batch is one transaction); it plays the part
        of a foreign or buggy writer. Raises SessionNotFoundError for an unknown id.
        """
        with self._conn("torn-tail injection", session_id) as conn:
            row = conn.execute(f"SELECT head_seq FROM {self._s}.sessions WHERE id = %s",
                               (session_id,)).fetchone()
            if row is None:
                raise SessionNotFoundError(f"session {session_id!r} is not stored in "
                                           f"{self._url}", session_id=session_id)
            conn.execute(f"INSERT INTO {self._s}.events (session_id, seq, type, time, data) "
                         "VALUES (%s, %s, 'request/header', 0, '{\"header\":')",
                         (session_id, row[0]))

    def drop(self) -> None:
        """Drop the whole schema (every session in it) and close; for tests and tear-down."""
        with self._conn("drop", None) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {self._s} CASCADE")
        self._pool.schemas.pop(self.schema, None)  # a later open creates it again
        self.close()

    def close(self) -> None:
        """Close the pool (open handles stop working); idempotent."""
        if self._closed:
            return
        self._closed = True
        release_pool(self._pool)

    def __enter__(self) -> PostgresBackend:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def open_postgres(url: str, *, create_schema: bool = True) -> PostgresBackend:
    """Open a ``postgresql://`` store URL (see :func:`parse_postgres_url` for the options).

    ``create_schema``: see :class:`PostgresBackend` (False: a schema holding no dsh store is
    refused at first use, nothing created).

    Raises:
        ConfigError: a bad option value.
        PersistenceError: the server cannot be reached.
    """
    conninfo, options = parse_postgres_url(url)
    migrate = options.get("migrate", "true").lower()
    if migrate not in ("true", "false", "1", "0"):
        raise ConfigError(f"store URL {redact(url)!r}: migrate={migrate!r} is not a boolean",
                          path=redact(url))
    return PostgresBackend(
        conninfo, schema=options.get("schema", DEFAULT_SCHEMA),
        lease_ms=_int_option(options, "lease_ms", DEFAULT_LEASE_MS, MIN_LEASE_MS, redact(url)),
        pool_size=_int_option(options, "pool_size", DEFAULT_POOL_SIZE, 1, redact(url)),
        migrate=migrate in ("true", "1"),
        reconnect_retries=_int_option(options, "reconnect_retries", 1, 0, redact(url)), url=url,
        create_schema=create_schema)


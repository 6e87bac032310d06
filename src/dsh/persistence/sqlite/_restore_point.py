"""SQLite restore points: the anchor of a committed prefix, the tail read, page-in by seq.

The sidecar is ``<db>.dsh-checkpoints/<encoded id>.ckpt`` (dsh refuses extra tables, so it
stays outside the database, like the seals). The cut is an event seq at a batch boundary (a
packed row never spans batches). Before a restore point is trusted: the session row's incarnation
and header digest as recorded, the last row before the cut checksums as recorded (the seal's
row checksum), the seal records over the prefix digest as recorded, no packed row straddles the
cut, the rows after the cut decode cleanly with every seal record over them intact, and the
restore point's digest is one the seal recorded (``check_bound``).
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import sqlite3
import threading
import weakref
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import orjson

from dsh._errors import DshError, LogCorruptError
from dsh.json import (
    CFallback,
    FrozenDict,
    c_pick_rows,
    c_read_rows,
    c_sqlite_bind,
    c_sqlite_open,
    dumps,
)
from dsh.persistence import _restore_point as rp
from dsh.persistence._pages import PicksRecords, RecordCut
from dsh.persistence._seal import covers, rows_crc, span_crc
from dsh.persistence.sqlite._schema import (
    ROW_COLUMNS,
    RowError,
    decode_picked,
    decode_row,
    scan_rows,
)
from dsh.session import Event

__all__ = ["C_READ_EVENTS", "LEGACY_ROW_COLUMNS", "PageConnections", "SqlitePrefixSource",
           "c_reader", "header_digest", "last_row_digest", "seal_digest"]

LEGACY_ROW_COLUMNS: Final = "rowid, seq, type, time, data, source_event_seqs, surface_op, NULL"
"""The columns a schema-14 row is read with, in the schema-17 row order (``ignorable`` NULL)."""


def last_row_digest(row: Sequence[Any]) -> str:
    """Digest of one stored row ``(seq, type, time, data, sources, op, ignorable)``."""
    return f"rows2:{rows_crc([row])}"


def seal_digest(records: Sequence[tuple[int, int, int]], end: int) -> str:
    """Digest of the seal records ``(first seq, end seq, crc)`` that end at or before ``end``."""
    return rp.digest(b"".join([b"%d:%d:%d;" % r for r in records if r[1] <= end]))


def header_digest(header: FrozenDict, incarnation: str) -> str:
    """Digest of a session row: its header and its incarnation."""
    return rp.digest(dumps(header) + b"\n" + incarnation.encode())


IDLE_PAGE_CONNECTIONS: Final = 2
"""Read-only connections a :class:`PageConnections` keeps between page-ins."""

C_READ_EVENTS: Final = 128
"""Events in a :meth:`SqlitePrefixSource.read_selected` range from which the accelerator reads
the rows through SQLite's C API (:func:`c_reader`). Below it the Python read costs no more
than the C read's connection of its own (one more open of the file and its schema parse,
~0.3M instructions): ``sqlite3``'s fetch lets the GIL go around each cell (~10k instructions
a row against ~5k in C), so a 100-item whole history (275 events) read in C costs 5.93M
instructions against 7.88M (callgrind, bench/RESULTS.md)."""

_RANGE_SQL: Final = (
    "SELECT {columns} FROM events WHERE session_id = ? AND seq >= coalesce((SELECT max(seq) "
    "FROM events WHERE session_id = ? AND seq <= ?), 0) AND seq < ? ORDER BY seq")
"""The rows from the one holding ``lo`` (the last at or below it) up to ``hi``: parameters
``(session_id, session_id, lo, hi)``; ``columns`` is the row's column list."""

@functools.cache  # sqlite_bind's answer, once
def c_reader() -> bool:
    """Whether the accelerator's ``read_rows`` can read rows through SQLite's C API here.

    It resolves SQLite's C functions from the library the ``_sqlite3`` module Python's
    :mod:`sqlite3` already loaded (so the same SQLite), loading nothing new; False without
    the accelerator, and when they are not to be found or not surely that SQLite (a
    statically linked SQLite that exports none, an ``_sqlite3`` without a file, another SQLite
    copy in the global symbols: two copies in one process break SQLite's POSIX locks, a
    platform without ``dlopen``): the reads then run through :mod:`sqlite3`, the reference.
    """
    if c_sqlite_bind is None:
        return False
    import _sqlite3  # (loaded by sqlite3)
    return bool(c_sqlite_bind(getattr(_sqlite3, "__file__", None)))


def _close_all(conns: list[sqlite3.Connection]) -> None:
    for conn in conns:
        conn.close()
    conns.clear()


Lender = Callable[[], "tuple[sqlite3.Connection, Callable[[bool], None]] | None"]
"""Lends an idle connection of the store for one page-in: ``(connection, give_back)``, or None
when it has none; ``give_back(ok)`` returns it (``ok`` False: it failed, close it)."""


class PageConnections:
    """The read-only connections the page-in sources of one database file share.

    A source borrows one for a page-in and gives it back (a source per read and per resume,
    one store: a process that reads a session cold and then writes it opens one connection
    for both, not one per source). A connection that failed is closed, not kept. The
    connections are closed when no source or backend holds this any more (a session may
    outlive its store).

    Args:
        path: The database file.
        lend: Lends one of the store's validated connections instead, when it has one
            free (:data:`Lender`: an idle one, or a write handle's while the handle is not
            using it): a cold read's page-in then runs on the connection its read opened
            and validated a moment before, and a writer's resume on the one its handle
            took over from that read, not on a new one (a second connection is a second
            open of the file and parse of its schema: a quarter of a cold
            ``get_items(limit)``). A page-in only reads, in autocommit, as on its own
            read-only ones.
    """

    def __init__(self, path: Path, lend: Lender | None = None) -> None:
        self._path = path  # (its URI made at the first connection of its own)
        self._idle: list[sqlite3.Connection] = []
        self._mutex = threading.Lock()
        self._lend = lend
        self._c_idle: list[object] = []  # the accelerator's own (closed when freed)
        weakref.finalize(self, _close_all, self._idle)

    @contextlib.contextmanager
    def borrow_c(self) -> Iterator[object]:
        """A read-only connection of the accelerator's (``sqlite_open``) for one page-in.

        Kept for the next one when the page-in did not fail (at most one idle); one that
        failed is dropped, which closes it. Only when :func:`c_reader` is True.

        Raises:
            CFallback: the file could not be opened (the caller reads through sqlite3).
        """
        with self._mutex:
            conn = self._c_idle.pop() if self._c_idle else None
        if conn is None:
            assert c_sqlite_open is not None  # (c_reader() was True)
            conn = c_sqlite_open(f"{self._path.as_uri()}?mode=ro")
        yield conn  # (an exception drops it: the capsule closes it when freed)
        with self._mutex:
            if not self._c_idle:
                self._c_idle.append(conn)

    @contextlib.contextmanager
    def borrow(self) -> Iterator[sqlite3.Connection]:
        """A connection for one page-in (autocommit), given back after it.

        The store's idle validated connection when it lends one, else a read-only one of
        this pool's (kept for the next page-in).

        Raises:
            sqlite3.Error: the file could not be opened.
        """
        lent = self._lend() if self._lend is not None else None
        if lent is not None:
            borrowed, give_back = lent
            try:
                yield borrowed
            except BaseException:
                give_back(False)
                raise
            give_back(True)
            return
        with self._mutex:
            idle = self._idle.pop() if self._idle else None
        conn = idle if idle is not None else sqlite3.connect(
            f"{self._path.as_uri()}?mode=ro", uri=True, check_same_thread=False,
            isolation_level=None)
        try:
            yield conn
        except BaseException:
            conn.close()
            raise
        with self._mutex:
            if len(self._idle) < IDLE_PAGE_CONNECTIONS and not conn.in_transaction:
                self._idle.append(conn)
                return
        conn.close()


class SqlitePrefixSource:
    """Pages in the events before a restore point's cut from the database, by seq.

    It reads through a connection borrowed from ``connections`` for each page-in (an idle
    validated one of the store, a write handle's while the handle is not using it, else a
    read-only one), under a lock of its own.

    Args:
        path: The database file.
        session_id: The session.
        cut: Events served (seqs ``0 .. cut - 1``).
        seals: The seal records ``(first seq, end seq, crc)`` read at the resume, and those
            its :class:`~dsh.persistence._seal.SealCut` carries (contiguous).
        elided: Reads the records before the cut that the resume left unread (past a
            :class:`~dsh.persistence._seal.SealCut`), called on the first page-in that
            reaches before ``seals``.
        legacy: A schema-14 file (scalar rows, no ``ignorable`` column).
        connections: The read-only connections to ``path`` this source borrows (its store's,
            shared by its other sources); default: its own.
    """

    def __init__(self, path: Path, session_id: str, cut: int,
                 seals: Sequence[tuple[int, int, int]] | None = None, *,
                 legacy: bool = False,
                 elided: Callable[[], Sequence[tuple[int, int, int]]] | None = None,
                 connections: PageConnections | None = None) -> None:
        self._path = path
        # schema 14 (the published dsh's files): scalar rows without the ignorable column
        self._columns = LEGACY_ROW_COLUMNS if legacy else ROW_COLUMNS
        # the range query of both reads (sqlite3 and the accelerator's): the same text, so
        # the C read serves exactly the rows the Python read would
        self._range_sql = _RANGE_SQL.format(columns=self._columns)
        self._version = 14 if legacy else 17
        self._id = session_id
        self._cut = cut
        # the seal records over the prefix, read at the resume: a page is checked against every
        # record it touches, each record once (docs/rules.md#verified-page-in)
        self._seals = [r for r in seals or () if r[0] < cut]
        self._seal_starts = [r[0] for r in self._seals]
        # the records a resume left unread (before a SealCut), read on the first page-in
        # that reaches before the records it carries
        self._elided = elided
        self._verified: set[int] = set()  # the first seqs of the records checked
        self._connections = connections if connections is not None else PageConnections(path)
        self._mutex = threading.Lock()

    def __len__(self) -> int:
        return self._cut

    def _load_elided(self, start: int) -> None:
        """Put the seal records the resume left unread in front of the others (once).

        Only when a page-in from ``start`` reaches before the records known.

        Raises:
            SealDamagedError: the seal's bytes before the cut changed since the resume.
        """
        if self._elided is not None and (not self._seals or start < self._seals[0][0]):
            low = self._seals[0][0] if self._seals else self._cut
            older = [r for r in self._elided() if r[0] < low]
            self._seals[:0] = older
            self._seal_starts[:0] = [r[0] for r in older]
            self._elided = None

    def _todo(self, start: int, stop: int) -> tuple[list[int], int, int]:
        """The seal records a read of ``start .. stop`` checks, and the seqs it reads.

        ``(indexes into the records not yet checked that the range touches, lo, hi)``: the
        rows read are those from the one holding ``lo`` to ``hi``. Under the mutex.
        """
        # from the row holding start: the last row at or before it (a packed row
        # is keyed by its first member), not a packed row's worth of rows earlier
        seals = self._seals
        first = max(0, bisect.bisect_right(self._seal_starts, start) - 1)
        todo = []
        for i in range(first, len(seals)):
            if seals[i][0] >= stop:
                break
            if seals[i][1] > start and seals[i][0] not in self._verified:
                todo.append(i)
        lo = min(start, seals[todo[0]][0]) if todo else start
        hi = max(stop, seals[todo[-1]][1]) if todo else stop
        return todo, lo, hi

    def _seal_mismatch(self, s: int, e: int, start: int) -> LogCorruptError:
        return LogCorruptError(
            f"corrupt session log {self._id!r} in {self._path}: the rows of seq "
            f"{s}..{e - 1} differ from what was committed (crc32 mismatch with the "
            f"integrity seal), found paging in events from seq {start} after a "
            f"resume from a restore point; run dsh verify, restore the database "
            f"from a copy", path=str(self._path), session_id=self._id, seq=s)

    def _c_selected(self, start: int, stop: int, seqs: Container[int], types: Container[str],
                    cut: RecordCut) -> tuple[list[Any], dict[int, Any]] | None:
        """:meth:`_verified_rows` then ``pick_rows``, in the accelerator's ``read_rows``.

        The same query, the same seal records checked (each row of each against its record
        before anything is served), the same rows left to the Python pass, the records cut
        returned as a dict; no Python tuple for the rows neither kept nor cut. None when
        ``read_rows`` declines (a value outside the classes a committed row holds, a text
        that is no strict UTF-8, a SQLite error): the caller reads through :mod:`sqlite3`,
        which names what is wrong.

        Raises:
            LogCorruptError: a sealed batch's rows differ from what was committed.
        """
        assert c_read_rows is not None  # (c_reader() was True)
        with self._mutex:
            self._load_elided(start)
            todo, lo, hi = self._todo(start, stop)
            seals = self._seals
            try:
                with self._connections.borrow_c() as conn:
                    checked, rows, picked = c_read_rows(
                        conn, self._range_sql, self._id, lo, hi,
                        [seals[i] for i in todo], start, stop, seqs, types, cut.paths,
                        cut.fmt)
            except CFallback:
                return None
            for i in todo[:checked]:
                self._verified.add(seals[i][0])
        if rows is None or picked is None:
            s, e, _crc = seals[todo[checked]]
            raise self._seal_mismatch(s, e, start)
        return rows, picked

    def _verified_rows(self, start: int, stop: int) -> list[Any]:
        """The rows from the one holding ``start`` to ``stop``, their seal records checked.

        Each seal record a range touches is checked once per source
        (docs/rules.md#verified-page-in).

        Rows are ``(rowid, seq, type, time, data, source_event_seqs, surface_op, ignorable)``.

        Raises:
            LogCorruptError: a sealed batch's rows differ from what was committed.
            sqlite3.Error: the database failed.
        """
        with self._mutex:
            self._load_elided(start)
            todo, lo, hi = self._todo(start, stop)
            seals = self._seals
            with self._connections.borrow() as conn:
                rows: list[Any] = conn.execute(
                    self._range_sql, (self._id, self._id, lo, hi)).fetchall()
        if not todo:
            return rows
        row_seqs = [row[1] for row in rows]
        for i in todo:  # rows are in seq order: each record's rows are one slice
            s, e, crc = seals[i]
            # the record's rows, without a read's rowid, where they lie (no copy of them)
            if span_crc(rows, bisect.bisect_left(row_seqs, s),
                        bisect.bisect_left(row_seqs, e)) != crc:
                raise self._seal_mismatch(s, e, start)
            self._verified.add(s)
        # from the row holding start again, as the query without the seals
        keep = max(0, bisect.bisect_right(row_seqs, start) - 1)
        return rows[keep:bisect.bisect_left(row_seqs, stop)]

    def _unreadable(self, start: int, stop: int, exc: Exception) -> LogCorruptError:
        return LogCorruptError(f"events {start}..{stop - 1} of session {self._id!r} in "
                               f"{self._path} could not be paged in ({exc}); the database "
                               "changed after the session was resumed, resume it again",
                               path=str(self._path), session_id=self._id, seq=start)

    def _decoded(self, rows: list[Any], start: int, stop: int) -> list[Event]:
        """The events ``start <= seq < stop`` of checked rows, decoded as a full read does."""
        if not rows:
            return []
        scan = scan_rows(rows, rows[0][1], self._version, path=str(self._path),
                         session_id=self._id)
        if scan.torn_seq is not None:
            raise LogCorruptError("a row before the cut does not decode", path=str(self._path))
        return [e for e in scan.events if start <= e["seq"] < stop]

    def read(self, start: int, stop: int) -> Sequence[Event]:
        """Return the events ``start <= seq < stop`` (see ``EventSource``).

        Raises:
            LogCorruptError: the rows before the cut no longer decode to those events.
        """
        if start >= stop:
            return []
        try:
            events = self._decoded(self._verified_rows(start, stop), start, stop)
        except (sqlite3.Error, DshError) as exc:
            if isinstance(exc, LogCorruptError) and "integrity seal" in exc.message:
                raise  # a sealed batch that changed: named as such above
            raise self._unreadable(start, stop, exc) from exc
        return events

    def read_picked(self, start: int, stop: int, seqs: Sequence[int]) -> Sequence[Event] | None:
        """The events at ``seqs`` of ``start <= seq < stop``, decoding only their rows.

        Every row of the range is read and checked against the seal records it touches, as
        :meth:`read` does (docs/rules.md#verified-page-in); where those records cover every
        row of it, only the rows of ``seqs`` are decoded, each into a frozen :class:`Event`
        as :meth:`read` decodes it (:func:`~dsh.persistence.sqlite._schema.decode_picked`).
        Otherwise (rows no record covers, a schema-14 file) the range is decoded as
        :meth:`read` decodes it and the events of ``seqs`` taken from it.

        Raises:
            LogCorruptError: a sealed batch changed, or a row no longer decodes.
        """
        if start >= stop or not seqs:
            return []
        try:
            rows = self._verified_rows(start, stop)
            if rows and self._version == 17 \
                    and covers(self._seals, self._seal_starts, rows[0][1], stop):
                return decode_picked(rows, seqs, self._version)
            wanted = set(seqs)
            return [e for e in self._decoded(rows, start, stop) if e["seq"] in wanted]
        except (sqlite3.Error, DshError, RowError) as exc:
            if isinstance(exc, LogCorruptError) and "integrity seal" in exc.message:
                raise  # a sealed batch that changed: named as such by _verified_rows
            raise self._unreadable(start, stop, exc) from exc

    def read_selected(self, start: int, stop: int, seqs: Container[int],
                      types: Container[str], pick: PicksRecords | None = None, *,
                      into: dict[int, Any] | None = None
                      ) -> list[Mapping[str, Any]] | None:
        """The events ``start <= seq < stop`` whose seq is in ``seqs`` or type in ``types``.

        For a reader that needs a few events of a long range (an adapter's whole-history
        read wants the surface nodes and its own marks, not the turn and step brackets):
        every row of the range is read and checked against the seal records it touches, as
        :meth:`read` does (docs/rules.md#verified-page-in), but only the selected rows are
        decoded. A plain row (one event, JSON text data, appended to the surface or not on
        it) whose seal checked out is parsed into plain containers at once (the seal vouches
        that these are the committed bytes, which the writer validated as lossless JSON),
        without its provenance (``sourceEventSeqs``, checked by the seal but not decoded: a
        selecting reader wants the data); any other row is decoded as :meth:`read` decodes
        it, into a frozen :class:`Event`. With ``pick`` (and ``into``, which it needs), such a
        plain row of ``seqs`` is first offered to ``pick(type, data text)``: what it returns
        (not None) goes to ``into[seq]`` in place of the event (a reader that wants a part of
        the data cuts it from the checked text without parsing the rest). A ``pick.cut`` (not
        None) says that ``pick`` is the C accelerator's ``record_texts`` at ``cut.paths[type]``
        for format ``cut.fmt``: the accelerator's ``pick_rows`` then makes the pass over the
        checked rows itself, cutting those rows without a Python call each (the rows it leaves
        go through the pass below, as without it).

        Returns:
            The selected events in seq order (plain dicts or ``Event``), or None when part of
            the range is not sealed (no seal, a schema-14 file, rows after the last record):
            the caller reads by :meth:`read` instead, whose decode checks contiguity itself.

        Raises:
            LogCorruptError: a sealed batch changed, or a row no longer decodes.
            ValueError: ``pick`` without ``into``.
        """
        if pick is not None and into is None:
            raise ValueError("read_selected: a pick needs its into")
        if start >= stop:
            return []
        if self._elided is not None:
            try:
                with self._mutex:
                    self._load_elided(start)
            except LogCorruptError as exc:
                raise self._unreadable(start, stop, exc) from exc
        if self._version != 17 or not self._seals or self._seals[-1][1] < stop:
            return None
        out: list[Mapping[str, Any]] = []
        try:
            loads = orjson.loads
            # a long range with the accelerator: read, checked and cut in C (the rows it
            # leaves go through the pass below); else the rows asked for (a packed row for its
            # members), in one pass of C-level work, the accelerator's pass cutting the
            # records of the plain rows it can
            cut = None if pick is None else pick.cut
            found = None
            if into is not None and cut is not None and stop - start >= C_READ_EVENTS \
                    and c_reader():
                found = self._c_selected(start, stop, seqs, types, cut)
            if into is not None and found is not None:
                selected, cut_here = found
                into.update(cut_here)
            elif into is not None and cut is not None and c_pick_rows is not None:
                rows = self._verified_rows(start, stop)
                selected = c_pick_rows(rows, start, stop, seqs, types, cut.paths, cut.fmt,
                                       into)
            else:
                rows = self._verified_rows(start, stop)
                selected = [row for row in rows if row[1] in seqs or row[2] in types
                            or row[7] == 0]
            for row in selected:
                _rowid, seq, type_, time, data, _ses, sop, ign = row
                if ign == 0:  # a packed row: its members, as read() decodes them
                    out.extend(e for e in decode_row(row, self._version)
                               if start <= e["seq"] < stop
                               and (e["seq"] in seqs or e["type"] in types))
                    continue
                if not start <= seq < stop:
                    continue
                if type(data) is str and (sop is None or sop == '"append"') \
                        and type_ not in types:
                    if pick is not None and into is not None:
                        picked = pick(type_, data)
                        if picked is not None:
                            into[seq] = picked
                            continue
                    try:
                        event = {"type": type_, "seq": seq, "time": time, "data": loads(data)}
                    except orjson.JSONDecodeError:
                        out.extend(decode_row(row, self._version))  # names what is wrong
                        continue
                    if sop is not None:
                        event["surfaceOp"] = "append"
                    if ign == 1:
                        event["ignorable"] = True
                    out.append(event)
                else:
                    out.extend(decode_row(row, self._version))
        except (sqlite3.Error, DshError, RowError) as exc:
            if isinstance(exc, LogCorruptError) and "integrity seal" in exc.message:
                raise
            raise self._unreadable(start, stop, exc) from exc
        return out

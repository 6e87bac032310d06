"""SQLite restore points: the anchor of a committed prefix, the tail read, page-in by seq.

The sidecar is ``<db>.dsh-checkpoints/<encoded id>.ckpt`` (dsh refuses extra tables, so it
stays outside the database, like the seals). The cut is an event seq at a batch boundary (a
packed row never spans batches). Before a restore point is trusted: the session row's incarnation
and header digest as recorded, the last row before the cut checksums as recorded (the seal's
row checksum), the seal records over the prefix digest as recorded, no packed row straddles the
cut, and the rows after the cut decode cleanly with every seal record over them intact.
"""

from __future__ import annotations

import bisect
import sqlite3
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsh._errors import DshError, LogCorruptError
from dsh.json import FrozenDict, dumps
from dsh.persistence import _restore_point as rp
from dsh.persistence._contract import ColdRead
from dsh.persistence._seal import check_row_seals, read_seal, rows_crc
from dsh.persistence.sqlite._schema import scan_rows
from dsh.session import Event

if TYPE_CHECKING:
    from dsh.persistence.sqlite._backend import SqliteHandle

__all__ = ["SqlitePrefixSource", "anchor_of", "last_row_digest", "load_tail"]


def last_row_digest(row: Sequence[Any]) -> str:
    """Digest of one stored row ``(seq, type, time, data, sources, op, ignorable)``."""
    return f"rows2:{rows_crc([row])}"


def _seal_digest(records: Sequence[tuple[int, int, int]], end: int) -> str:
    return rp.digest(b"".join(f"{s}:{e}:{c};".encode() for s, e, c in records if e <= end))


def _header_digest(header: FrozenDict, incarnation: str) -> str:
    return rp.digest(dumps(header) + b"\n" + incarnation.encode())


def anchor_of(handle: SqliteHandle) -> rp.Anchor | None:
    """The anchor of the committed prefix this handle last wrote or read, or None."""
    durable = handle._durable
    if durable is None or durable[0] < 1 or handle._seals is None \
            or handle._c.schema_version != 17:
        return None  # schema 14 files (dsh 0.1.x) keep the full read
    count, incarnation, tail_digest = durable
    header, found, _ = handle._session_row()
    if found != incarnation:
        return None
    return rp.Anchor(backend="sqlite", session_id=handle._id, incarnation=incarnation,
                     event_count=count, byte_offset=count,
                     header_digest=_header_digest(header, incarnation), tail_digest=tail_digest,
                     seal_digest=_seal_digest(handle._seals, count))


def load_tail(handle: SqliteHandle, restore_point: rp.RestorePoint
              ) -> tuple[ColdRead, SqlitePrefixSource]:
    """Check ``restore point`` against the database and read the events after its cut.

    Raises:
        RestorePointRefused: the stored prefix is not the one the restore point covers
            (``incarnation``, ``header``, ``tail-digest``, ``seal``, ``straddle``), or the tail
            does not read cleanly (``torn-tail``, ``corrupt-tail``).
    """
    from dsh.persistence.sqlite._backend import _ROW_COLUMNS, _seal_identity

    anchor = restore_point.anchor
    cut = anchor.event_count
    if handle._c.schema_version != 17:
        raise rp.RestorePointRefused("schema")  # schema 14 keeps the full read
    conn = handle._c.conn
    try:
        seal = read_seal(handle._seal_file)
        conn.execute("BEGIN")
        try:
            header, incarnation, revision = handle._session_row()
            last = conn.execute(f"SELECT {_ROW_COLUMNS} FROM events WHERE session_id = ? AND "
                                "seq < ? ORDER BY seq DESC LIMIT 1", (handle._id, cut)).fetchone()
            base = handle._suffix_base(cut)
            rows = handle._rows_from(base)
        finally:
            conn.execute("COMMIT")
    except (sqlite3.Error, DshError):
        raise rp.RestorePointRefused("unreadable") from None
    if incarnation != anchor.incarnation:
        raise rp.RestorePointRefused("incarnation")
    if _header_digest(header, incarnation) != anchor.header_digest:
        raise rp.RestorePointRefused("header")
    if last is None or last_row_digest(last[1:]) != anchor.tail_digest:
        raise rp.RestorePointRefused("tail-digest")
    if base != cut:
        raise rp.RestorePointRefused("straddle")
    if seal is not None and seal.identity != _seal_identity(incarnation):
        seal = None
    records = seal.records if seal is not None else []
    if _seal_digest(records, cut) != anchor.seal_digest:
        raise rp.RestorePointRefused("seal")
    try:
        handle._check_header_version(header)
        scan = scan_rows(rows, cut, 17, path=handle._path, session_id=handle._id)
        if seal is not None:
            check_row_seals(rows, seal, base=cut, describe=lambda: "not run",
                            where=handle._path, session_id=handle._id)
    except DshError:
        raise rp.RestorePointRefused("corrupt-tail") from None
    if scan.torn_seq is not None:
        raise rp.RestorePointRefused("torn-tail")
    events = scan.events
    if handle._mode == "write":
        handle._seals = list(records)
        handle._torn_seq = None
    count = cut + len(events)
    handle._durable = (count, incarnation,
                       last_row_digest(rows[-1][1:]) if rows else anchor.tail_digest)
    source = SqlitePrefixSource(handle._backend.path, handle._id, cut, seals=records)
    return ColdRead(header=header, events=tuple(events), torn=None,
                    revision=handle._revision(incarnation, revision)), source


class SqlitePrefixSource:
    """Pages in the events before a restore point's cut from the database, by seq.

    It keeps one read-only connection of its own (the write handle's belongs to the writer
    thread), opened on the first read and used under a lock.

    Args:
        path: The database file.
        session_id: The session.
        cut: Events served (seqs ``0 .. cut - 1``).
    """

    def __init__(self, path: Path, session_id: str, cut: int,
                 seals: Sequence[tuple[int, int, int]] | None = None) -> None:
        self._path = path
        self._id = session_id
        self._cut = cut
        # the seal records over the prefix, read at the resume: a page is checked against every
        # record it touches, each record once (docs/rules.md#verified-page-in)
        self._seals = [r for r in seals or () if r[0] < cut]
        self._seal_starts = [r[0] for r in self._seals]
        self._verified: set[int] = set()
        self._conn: sqlite3.Connection | None = None
        self._mutex = threading.Lock()

    def __len__(self) -> int:
        return self._cut

    def read(self, start: int, stop: int) -> Sequence[Event]:
        """Return the events ``start <= seq < stop`` (see ``EventSource``).

        Raises:
            LogCorruptError: the rows before the cut no longer decode to those events.
        """
        from dsh.persistence.sqlite._backend import _ROW_COLUMNS

        if start >= stop:
            return []
        try:
            with self._mutex:
                if self._conn is None:
                    self._conn = sqlite3.connect(f"{self._path.as_uri()}?mode=ro", uri=True,
                                                 check_same_thread=False,
                                                 isolation_level=None)
                    # the session may outlive its store: the connection lives as long as this
                    # source and is closed with it (not left to the collector, which warns)
                    weakref.finalize(self, self._conn.close)
                # from the row holding start: the last row at or before it (a packed row
                # is keyed by its first member), not a packed row's worth of rows earlier
                seals = self._seals
                first = max(0, bisect.bisect_right(self._seal_starts, start) - 1)
                todo = [i for i in range(first, len(seals)) if seals[i][0] < stop
                        and seals[i][1] > start and i not in self._verified]
                lo = min([start, *(seals[i][0] for i in todo)])
                hi = max([stop, *(seals[i][1] for i in todo)])
                rows = self._conn.execute(
                    f"SELECT {_ROW_COLUMNS} FROM events WHERE session_id = ? AND seq >= "
                    "coalesce((SELECT max(seq) FROM events WHERE session_id = ? AND seq <= ?), "
                    "0) AND seq < ? ORDER BY seq", (self._id, self._id, lo, hi)).fetchall()
            for i in todo:
                s, e, crc = seals[i]
                if rows_crc([row[1:] for row in rows if s <= row[1] < e]) != crc:
                    raise LogCorruptError(
                        f"corrupt session log {self._id!r} in {self._path}: the rows of seq "
                        f"{s}..{e - 1} differ from what was committed (crc32 mismatch with the "
                        f"integrity seal), found paging in events from seq {start} after a "
                        f"resume from a restore point; run dsh verify, restore the database "
                        f"from a copy", path=str(self._path), session_id=self._id, seq=s)
                self._verified.add(i)
            if todo:  # from the row holding start again, as the query without the seals
                keep = max((n for n, row in enumerate(rows) if row[1] <= start), default=0)
                rows = [row for row in rows[keep:] if row[1] < stop]
            events: list[Event] = []
            if rows:
                scan = scan_rows(rows, rows[0][1], 17, path=str(self._path),
                                 session_id=self._id)
                if scan.torn_seq is not None:
                    raise LogCorruptError("a row before the cut does not decode",
                                          path=str(self._path))
                events = [e for e in scan.events if start <= e["seq"] < stop]
        except (sqlite3.Error, DshError) as exc:
            if isinstance(exc, LogCorruptError) and "integrity seal" in exc.message:
                raise  # a sealed batch that changed: named as such above
            raise LogCorruptError(f"events {start}..{stop - 1} of session {self._id!r} in "
                                  f"{self._path} could not be paged in ({exc}); the database "
                                  "changed after the session was resumed, resume it again",
                                  path=str(self._path), session_id=self._id,
                                  seq=start) from exc
        return events

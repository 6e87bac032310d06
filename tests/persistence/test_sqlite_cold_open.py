"""A cold SQLite read: the store opened in a read snapshot, the seal past a cut read streamed.

docs/formats.md#files-and-connections (a store's file is checked in one read snapshot: an open
takes no write lock), docs/rules.md#restore-points-are-never-the-truth (the seal's bytes before
a restore point's cut hashed as they are read, by a writer only; damage after it named as a
whole read names it).
"""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from dsh._errors import SealDamagedError
from dsh.persistence import _restore_point as rp
from dsh.persistence._seal import SealCut, _read_seal_after_whole, read_seal_after
from dsh.persistence.sqlite import SqliteBackend


def _turns(first: int, count: int) -> list[dict[str, Any]]:
    return [item for n in range(first, first + count) for item in (
        {"role": "user", "content": f"q{n}"},
        {"type": "function_call", "call_id": f"c{n}", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": f"c{n}", "output": f"r{n}" * 40},
        {"role": "assistant", "content": f"a{n}"})]


def _store_with_records_after_the_cut(root: Path) -> tuple[Path, SealCut]:
    """A DshSession store whose restore point names a seal cut with records after it."""
    pytest.importorskip("agents")
    from dsh.adapters.openai_agents import DshSession

    url = f"sqlite:///{root / 'sessions.db'}"

    async def fill() -> None:
        session = DshSession("s", url)
        for first in range(0, 400, 40):
            await session.add_items(_turns(first, 40))
        session.close()  # the restore point, at the end

    async def more() -> None:
        later = DshSession("s", url)
        for first in range(400, 412, 3):  # four batches after the cut
            await later.add_items(_turns(first, 3))
        later.close()

    asyncio.run(fill())
    (ckpt,) = root.rglob("*.ckpt")
    kept = ckpt.read_bytes()
    asyncio.run(more())
    ckpt.write_bytes(kept)  # the restore point before them (its close wrote one at its end)
    point = rp.decode_restore_point(ckpt.read_bytes(), session_id="s", backend="sqlite")
    cut = SealCut.decode(point.anchor.seal_digest)
    assert cut is not None and cut.offset % 4096 != 0  # a cut inside a page of the file
    (seal,) = root.rglob("*.seal")
    return seal, cut


def test_a_seal_read_past_its_cut_equals_the_whole_read(tmp_path: Path) -> None:
    seal_path, cut = _store_with_records_after_the_cut(tmp_path)
    streamed, whole = read_seal_after(seal_path, cut), _read_seal_after_whole(seal_path, cut)
    assert streamed is not None and whole is not None
    assert len(streamed.records) >= 4 and streamed.records == whole.records
    assert streamed.restore_points == whole.restore_points
    assert streamed.chain == whole.chain and streamed.clean and whole.clean
    assert streamed.elided == whole.elided == cut


def test_a_seal_changed_before_its_cut_makes_the_restore_point_stale(tmp_path: Path) -> None:
    seal_path, cut = _store_with_records_after_the_cut(tmp_path)
    data = bytearray(seal_path.read_bytes())
    data[cut.offset - 100] ^= 0x01  # a byte of a record the cut's digest covers
    seal_path.write_bytes(bytes(data))
    assert read_seal_after(seal_path, cut) is None
    assert _read_seal_after_whole(seal_path, cut) is None
    seal_path.write_bytes(bytes(data[:cut.offset - 1]))  # a seal cut short before the cut
    assert read_seal_after(seal_path, cut) is None


def test_a_seal_changed_after_its_cut_is_named_by_its_offset_in_the_file(
        tmp_path: Path) -> None:
    seal_path, cut = _store_with_records_after_the_cut(tmp_path)
    data = bytearray(seal_path.read_bytes())
    streamed = read_seal_after(seal_path, cut)
    assert streamed is not None and streamed.records
    # the first range record after the cut now claims to start one seq later: not contiguous
    at = data.index(streamed.records[0][0].to_bytes(8, "little") +
                    streamed.records[0][1].to_bytes(8, "little"), cut.offset)
    data[at] += 1
    seal_path.write_bytes(bytes(data))
    with pytest.raises(SealDamagedError) as streamed_error:
        read_seal_after(seal_path, cut)
    with pytest.raises(SealDamagedError) as whole_error:
        _read_seal_after_whole(seal_path, cut)
    assert streamed_error.value.where == whole_error.value.where
    assert streamed_error.value.where["byte_offset"] == at  # the file's offset, not the read's
    assert streamed_error.value.code == "SEAL_CORRUPT"


def test_a_store_opens_and_reads_while_another_connection_writes(tmp_path: Path) -> None:
    # docs/formats.md#files-and-connections: the open checks the file in a read snapshot, so
    # a writer's open transaction does not make it wait (busy timeout 0: it would fail)
    path = tmp_path / "sessions.db"
    SqliteBackend(path).create({"version": 0, "id": "s", "createdAt": 1})
    with closing(sqlite3.connect(path, isolation_level=None)) as writer:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("UPDATE persistence_state SET store_id = store_id")
        backend = SqliteBackend(path, busy_timeout_ms=0)
        with backend.open("s", "read") as handle:
            assert handle.read(0).header["id"] == "s"
        writer.execute("ROLLBACK")


def test_a_pristine_file_gets_its_schema_in_a_write_transaction(tmp_path: Path) -> None:
    # a file with no schema version is checked again, and created, under BEGIN IMMEDIATE:
    # while another connection holds the write lock, creating it waits, and fails at 0 ms
    path = tmp_path / "new.db"
    path.touch(mode=0o600)  # (dsh refuses a file others may read)
    with closing(sqlite3.connect(path, isolation_level=None)) as other:
        other.execute("PRAGMA journal_mode = wal")
        other.execute("BEGIN IMMEDIATE")
        backend = SqliteBackend(path, busy_timeout_ms=0)
        with pytest.raises(Exception) as caught:
            backend.create({"version": 0, "id": "s", "createdAt": 1})
        assert getattr(caught.value, "code", None) == "DATABASE_BUSY"
        other.execute("ROLLBACK")
    backend = SqliteBackend(path, busy_timeout_ms=0)
    backend.create({"version": 0, "id": "s", "createdAt": 1})
    with backend.open("s", "read") as handle:
        assert handle.schema_version == 17


def test_a_restore_point_cut_right_after_a_packed_row_reads_through_it(tmp_path: Path) -> None:
    # docs/rules.md#restore-points-are-never-the-truth: the one row that can straddle the cut
    # is the last row before it; a packed one is decoded for its last member, which ends at
    # the cut, so the read goes through the restore point (a refusal would read in full)
    import dsh
    from dsh.persistence import Persistence, open_backend, read_pages
    from dsh.testing._logs import assistant, user

    with dsh.open("memory:") as memory:
        s = memory.session("big", header={"createdAt": 1_767_225_600_000})
        chunks = [{"type": "block-start", "index": 0, "blockType": "text"},
                  *[{"type": "text-delta", "index": 0, "text": "an"}] * 5]
        for turn in range(1, 41):
            step = {"turn": turn, "step": 1}
            for etype, data in (("turn/start", {"turn": turn}), ("step/start", step)):
                s.append(etype, data)
            s.append("user/message", user(f"q {turn}", f"u{turn}"), surface_op="append")
            for chunk in chunks:  # one packed row when appended in one batch
                s.append("assistant/chunk", {**step, "chunk": chunk})
            s.append("assistant/message", assistant(turn, 1, f"a {turn}", f"a{turn}"),
                     surface_op="append")
            s.append("step/end", step)
            s.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
        header, events = s.header, list(s.events)
    cut = 12 * 30 + 9  # turn 31 up to its last chunk: the cut right after a packed chunk row
    del events[cut:]
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    with Persistence(open_backend(url)) as persistence:
        persistence.create(header)
        with persistence.open("big", "write") as handle:
            handle.append(events[:cut])
            handle.flush()
        assert persistence.write_restore_point("big")  # (its turn 31 left open)
    with closing(sqlite3.connect(tmp_path / "sessions.db")) as db:
        seq, ignorable = db.execute("SELECT seq, ignorable FROM events WHERE seq < ? "
                                    "ORDER BY seq DESC LIMIT 1", (cut,)).fetchone()
    assert ignorable == 0 and cut - 7 < seq < cut - 1  # the last row before it is packed
    with Persistence(open_backend(url)) as persistence:
        full = persistence.read("big").stored_events
        pages = read_pages(persistence, "big")
        assert pages.paged and pages.restore is not None
        assert pages.restore.event_count == cut
        assert list(pages.events) == list(full)


def _turn_stored(db: Path, first: int) -> bool:
    """Whether the turn ``_turns(first, 1)`` appended is in the SQLite file ``db`` (its rows)."""
    with closing(sqlite3.connect(db)) as conn:
        return bool(conn.execute("SELECT count(*) FROM events WHERE data LIKE ?",
                                 (f'%q{first}"%',)).fetchone()[0])


def _first_record_crc_changed(seal_path: Path, cut: SealCut) -> int:
    """Flip a bit of the crc of the seal's first range record (seqs from 0), before the cut."""
    from dsh.persistence._seal import read_seal
    whole = read_seal(seal_path)
    assert whole is not None
    start, end, _ = whole.records[0]
    data = bytearray(seal_path.read_bytes())
    at = data.index(start.to_bytes(8, "little") + end.to_bytes(8, "little")) + 16
    assert at < cut.offset and cut.tail and end < cut.tail[0][0]  # before the carried records
    data[at] ^= 0x01
    seal_path.write_bytes(bytes(data))
    return end


def test_a_read_only_seal_read_past_its_cut_leaves_the_bytes_before_it_unread(
        tmp_path: Path) -> None:
    # docs/rules.md#restore-points-are-never-the-truth: a reader does not hash the bytes
    # before the cut; those after it are parsed as before (the same records, marks, chain)
    seal_path, cut = _store_with_records_after_the_cut(tmp_path)
    hashed = read_seal_after(seal_path, cut)
    _first_record_crc_changed(seal_path, cut)
    assert read_seal_after(seal_path, cut) is None  # hashed: stale
    unhashed = read_seal_after(seal_path, cut, check_prefix=False)
    assert hashed is not None and unhashed is not None
    assert unhashed.records == hashed.records and unhashed.chain == hashed.chain
    assert unhashed.restore_points == hashed.restore_points and unhashed.elided == cut
    seal_path.write_bytes(seal_path.read_bytes()[:cut.offset - 1])  # ends before the cut
    assert read_seal_after(seal_path, cut, check_prefix=False) is None


def test_a_seal_changed_before_the_cut_is_found_by_whoever_reads_before_it(
        tmp_path: Path) -> None:
    # A cold get_items(limit) reads the rows after the cut and the carried records' rows,
    # each checked against its seal record, not the seal's bytes before the cut: it serves
    # them. A read that pages in before the carried records, and the first write's resume
    # (which hashes them), find the change: LogCorruptError, nothing written.
    from dsh._errors import LogCorruptError
    from dsh.adapters.openai_agents import DshSession

    seal_path, cut = _store_with_records_after_the_cut(tmp_path)
    _first_record_crc_changed(seal_path, cut)
    url = f"sqlite:///{tmp_path / 'sessions.db'}"

    async def read(limit: int | None) -> list[Any]:
        session = DshSession("s", url)
        try:
            return await session.get_items(limit)  # type: ignore[no-any-return]
        finally:
            session.close()

    assert asyncio.run(read(8)) == _turns(410, 2)
    with pytest.raises(LogCorruptError) as whole:
        asyncio.run(read(None))
    assert whole.value.code.startswith("SEAL") or "integrity seal" in whole.value.message

    async def write() -> None:
        session = DshSession("s", url)
        try:
            await session.add_items(_turns(412, 1))
        finally:
            session.close()

    with pytest.raises(LogCorruptError):
        asyncio.run(write())
    assert not _turn_stored(tmp_path / "sessions.db", 412)


def test_a_read_only_open_whose_mark_is_not_after_the_cut_reads_in_full(
        tmp_path: Path) -> None:
    # the restore point's own digest must be recorded after its cut; a reader that finds
    # none there hashes the bytes before the cut to tell a rewritten seal (stale: read in
    # full, quietly) from a forged restore point
    from dsh.persistence import Persistence, open_backend, read_pages
    from dsh.persistence._seal import RESTORE_POINT_MARK
    seal_path, cut = _store_with_records_after_the_cut(tmp_path)
    data = bytearray(seal_path.read_bytes())
    mark = RESTORE_POINT_MARK.to_bytes(8, "little")
    at = data.index(mark, cut.offset)
    data[at + 8] ^= 0x01  # the digest recorded after the cut: now another restore point's
    seal_path.write_bytes(bytes(data))
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    with Persistence(open_backend(url)) as persistence:
        with pytest.raises(rp.RestorePointRefused, match="unbound"), \
                persistence.backend.open("s", "read") as handle:
            handle.read_from_restore_point()
        pages = read_pages(persistence, "s")
        assert pages.restore is None  # not through the restore point
    data[cut.offset - 100] ^= 0x01  # and the bytes before the cut: a rewritten seal
    seal_path.write_bytes(bytes(data))
    with Persistence(open_backend(url)) as persistence, \
            pytest.raises(rp.RestorePointRefused, match="seal"), \
            persistence.backend.open("s", "read") as handle:
        handle.read_from_restore_point()


@pytest.mark.no_speedups
@pytest.mark.parametrize("value", [2.5, 10**18])
def test_a_row_whose_data_is_a_number_is_a_named_seal_mismatch_through_the_restore_point(
        tmp_path: Path, value: float) -> None:
    # docs/rules.md#verified-page-in: a row before the cut whose data column holds a number
    # (no committed row does: the column takes any value) differs from what was committed,
    # named by seq, on the page-in through the restore point as on the full read (the seal
    # text of the number once raised TypeError, or asked for 10**18 bytes: MemoryError)
    from dsh._errors import LogCorruptError
    from dsh.adapters.openai_agents import DshSession
    from dsh.persistence._seal import rows_crc, rows_text

    row = (7, "user/message", 1, value, None, '"append"', None)
    assert rows_text([row]) != rows_text([(*row[:3], str(value), *row[4:])])
    assert rows_crc([row]) == rows_crc([row])
    _store_with_records_after_the_cut(tmp_path)
    with closing(sqlite3.connect(tmp_path / "sessions.db")) as db:
        db.execute("UPDATE events SET data = ? WHERE seq = 1000", (value,))
        db.commit()

    async def read() -> list[Any]:
        session = DshSession("s", f"sqlite:///{tmp_path / 'sessions.db'}")
        try:
            return await session.get_items()  # type: ignore[no-any-return]
        finally:
            session.close()

    with pytest.raises(LogCorruptError) as found:
        asyncio.run(read())
    assert found.value.where["seq"] <= 1000 and "sessions.db" in found.value.message


@pytest.mark.parametrize("session_id", ["s1", "a/b", ".hidden", "é ü", "x" * 240])
def test_a_handle_names_the_sidecars_the_backend_names(tmp_path: Path, session_id: str) -> None:
    # the handle builds its sidecar paths from text (one parse each, no pathlib joins): they
    # are the backend's own, for ids with a slash, a leading dot, non-ASCII, a hashed name
    backend = SqliteBackend(tmp_path / "d" / "s.db")
    try:
        backend.create({"id": session_id, "version": 0, "createdAt": 1})
        with backend.open(session_id, "read") as handle:
            assert handle._seal_file == backend._seal_path(session_id)
            assert handle._metadata_file == backend._metadata_path(session_id)
            assert handle._restore_point_file == backend.restore_point_dir / (
                backend._seal_path(session_id).stem + ".ckpt")
            assert handle.restore_point_path() == handle._restore_point_file
            assert str(handle._seal_file).startswith(str(tmp_path / "d" / "s.db.dsh-seals/"))
    finally:
        backend.close()


def _traced_connections(monkeypatch: pytest.MonkeyPatch) -> list[tuple[sqlite3.Connection,
                                                                       list[str]]]:
    """Every connection the SQLite backend opens from now on, with the statements it runs."""
    from dsh.persistence.sqlite import _backend

    opened: list[tuple[sqlite3.Connection, list[str]]] = []
    connect = sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)
        ran: list[str] = []
        conn.set_trace_callback(ran.append)
        opened.append((conn, ran))
        return conn

    monkeypatch.setattr(_backend.sqlite3, "connect", traced)
    return opened


_WRITER_ONLY = ("PRAGMA synchronous = FULL", "PRAGMA synchronous")


def test_a_read_open_sets_nothing_only_a_writer_needs(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/formats.md#files-and-connections: synchronous before a first write, never on a
    # connection that only reads (foreign_keys at the open: set later, it would expire the
    # connection's prepared statements)
    _store_with_records_after_the_cut(tmp_path)
    opened = _traced_connections(monkeypatch)
    backend = SqliteBackend(tmp_path / "sessions.db")
    with backend.open("s", "read") as reader:
        _, cold, _ = reader.read_from_restore_point()
    assert cold.events
    ((_, ran),) = opened
    assert "PRAGMA trusted_schema = OFF" in ran and "PRAGMA foreign_keys = ON" in ran
    assert not set(_WRITER_ONLY) & set(ran)
    backend.close()


def test_a_writer_taking_a_readers_connection_sets_what_writes_need(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the read's validated connection is left idle and the write handle takes it: the writer
    # settings are set on it then, once, and hold when the append commits
    _store_with_records_after_the_cut(tmp_path)
    opened = _traced_connections(monkeypatch)
    backend = SqliteBackend(tmp_path / "sessions.db")
    with backend.open("s", "read") as reader:
        reader.read_from_restore_point()
    writer = backend.open("s", "write")
    ((conn, ran),) = opened  # (one connection for both)
    assert [s for s in ran if s in _WRITER_ONLY] == list(_WRITER_ONLY)
    conn.set_trace_callback(None)
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    conn.set_trace_callback(ran.append)
    writer.close()
    with backend.open("s", "write") as again:  # (taken idle again: not set twice)
        again.read_from_restore_point()
    assert [s for s in ran if s in _WRITER_ONLY] == list(_WRITER_ONLY)
    backend.close()


def test_the_shared_connection_that_creates_sessions_sets_what_writes_need(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened = _traced_connections(monkeypatch)
    backend = SqliteBackend(tmp_path / "sessions.db")
    backend.create({"id": "fresh", "version": 0, "createdAt": 1})
    assert opened and all(
        conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        and conn.execute("PRAGMA synchronous").fetchone()[0] == 2 for conn, _ in opened)
    backend.close()


def test_a_read_open_probes_the_header_metadata_sidecar_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the open's probe serves the restore-point read that follows it (the sidecar belongs to
    # the row's incarnation); a later read of the same handle probes it again
    from dsh._errors import LogCorruptError
    from dsh.persistence.sqlite import _backend

    seal_path, _ = _store_with_records_after_the_cut(tmp_path)
    spy = mock.Mock(wraps=_backend.open_sidecar)
    monkeypatch.setattr(_backend, "open_sidecar", spy)

    def probes() -> int:
        return [call.args[1] for call in spy.call_args_list].count("header metadata")

    backend = SqliteBackend(tmp_path / "sessions.db")
    with backend.open("s", "read") as reader:
        reader.read_from_restore_point()
        assert probes() == 1
        seal_path.with_suffix(".meta").write_bytes(b"{not json")
        with pytest.raises(LogCorruptError, match="header metadata"):
            reader.read()
    assert probes() == 2
    backend.close()

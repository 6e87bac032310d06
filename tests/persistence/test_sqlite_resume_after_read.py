"""A writer's resume right after a cold read through a restore point, in the same process.

The resume reads the session row and its rows again and checks them as any first read does
(docs/rules.md#restore-points-are-never-the-truth): a tail another process moved in between
is seen, a seal damaged in between is refused, and a write handle's open checks the header
metadata sidecar. Real files, real sqlite3, a real second process.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dsh._errors import LogCorruptError
from dsh.persistence import _restore_point as rp
from dsh.persistence._seal import SealCut, read_seal_after
from dsh.persistence.sqlite import SqliteBackend
from tests.persistence.test_sqlite_cold_open import (
    _first_record_crc_changed,
    _store_with_records_after_the_cut,
    _turn_stored,
    _turns,
)


def _read_then_write(path: Path) -> tuple[SqliteBackend, list[int], Any]:
    """A cold read through the restore point, then a write handle of the same backend."""
    backend = SqliteBackend(path)
    with backend.open("s", "read") as reader:
        _, cold, _ = reader.read_from_restore_point()
    writer = backend.open("s", "write")
    return backend, [e["seq"] for e in cold.events], writer


def test_a_tail_another_process_wrote_between_the_read_and_the_resume_is_read_again(
        tmp_path: Path) -> None:
    # the other process appends a turn and its close writes a restore point at its end; the
    # old restore point is put back, so only the database says the tail moved
    _store_with_records_after_the_cut(tmp_path)
    (ckpt,) = tmp_path.rglob("*.ckpt")
    kept = ckpt.read_bytes()
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    backend = SqliteBackend(tmp_path / "sessions.db")
    with backend.open("s", "read") as reader:
        _, cold, _ = reader.read_from_restore_point()
    before = [e["seq"] for e in cold.events]
    script = ("import asyncio, sys\n"
              "from dsh.adapters.openai_agents import DshSession\n"
              "async def main():\n"
              "    s = DshSession('s', sys.argv[1])\n"
              "    await s.add_items([{'role': 'user', 'content': 'from elsewhere'}])\n"
              "    s.close()\n"
              "asyncio.run(main())\n")
    subprocess.run([sys.executable, "-c", script, url], check=True, timeout=120)
    ckpt.write_bytes(kept)
    writer = backend.open("s", "write")
    _, tail, _ = writer.read_from_restore_point()
    after = [e["seq"] for e in tail.events]
    assert after[:len(before)] == before and len(after) > len(before)
    assert any(e["type"] == "user/message" and "from elsewhere" in str(e["data"])
               for e in tail.events)
    writer.close()
    backend.close()


def _resume_refused(tmp_path: Path, damage: Callable[[Path, SealCut], object],
                    match: str) -> None:
    """Read cold, open the writer, ``damage(seal path, cut)``: the writer's resume refuses."""
    seal_path, cut = _store_with_records_after_the_cut(tmp_path)
    backend, _, writer = _read_then_write(tmp_path / "sessions.db")
    damage(seal_path, cut)
    with pytest.raises(rp.RestorePointRefused, match=match):
        writer.read_from_restore_point()
    writer.close()
    backend.close()


def test_a_seal_damaged_before_the_cut_between_the_read_and_the_resume_is_found(
        tmp_path: Path) -> None:
    # the reader never hashed the bytes before the cut
    _resume_refused(tmp_path, _first_record_crc_changed, "seal")


def test_a_seal_record_after_the_cut_changed_between_the_read_and_the_resume_is_found(
        tmp_path: Path) -> None:
    # a crc of a range record over the tail the reader checked: the rows taken over are
    # checked against the seal as read now
    def first_record_after_the_cut_changed(seal_path: Path, cut: SealCut) -> None:
        seal = read_seal_after(seal_path, cut)
        assert seal is not None and seal.records
        start, end, _ = seal.records[0]
        data = bytearray(seal_path.read_bytes())
        at = data.index(start.to_bytes(8, "little") + end.to_bytes(8, "little"),
                        cut.offset) + 16
        data[at] ^= 0x01
        seal_path.write_bytes(bytes(data))

    _resume_refused(tmp_path, first_record_after_the_cut_changed, "corrupt-tail")


def test_a_first_write_after_a_cold_read_refuses_a_seal_damaged_in_between(
        tmp_path: Path) -> None:
    # the adapter's own path: get_items(limit) then add_items in one DshSession, the seal
    # changed before the cut in between: the resume refuses, nothing is written
    pytest.importorskip("agents")
    from dsh.adapters.openai_agents import DshSession

    seal_path, cut = _store_with_records_after_the_cut(tmp_path)
    url = f"sqlite:///{tmp_path / 'sessions.db'}"

    async def read_then_write() -> list[Any]:
        session = DshSession("s", url)
        try:
            recent = await session.get_items(limit=8)
            _first_record_crc_changed(seal_path, cut)
            await session.add_items(_turns(412, 1))
            return recent  # type: ignore[no-any-return]
        finally:
            session.close()

    with pytest.raises(LogCorruptError):
        asyncio.run(read_then_write())
    assert not _turn_stored(tmp_path / "sessions.db", 412)


def test_a_write_handle_open_checks_the_header_metadata_sidecar(tmp_path: Path) -> None:
    # a writer that never reads the header still finds a damaged sidecar at its open
    seal_path, _ = _store_with_records_after_the_cut(tmp_path)
    seal_path.with_suffix(".meta").write_bytes(b"{not json")
    backend = SqliteBackend(tmp_path / "sessions.db")
    with pytest.raises(LogCorruptError, match="header metadata"):
        backend.open("s", "write")
    backend.close()


def test_the_cut_is_a_seal_cut(tmp_path: Path) -> None:
    # (what the tests above rely on: the seal's bytes before the cut are hashed by a writer)
    seal_path, cut = _store_with_records_after_the_cut(tmp_path)
    assert isinstance(cut, SealCut) and read_seal_after(seal_path, cut) is not None


def _file_is_free(path: Path) -> bool:
    """Whether another connection takes the database's write lock at once (then lets it go)."""
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(path, timeout=0, isolation_level=None)) as other:
        try:
            other.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            assert str(exc) == "database is locked"
            return False
        other.execute("ROLLBACK")
        return True


@pytest.mark.parametrize("end", ["release_hold", "another method", "close"])
def test_a_held_resume_keeps_the_write_lock_until_it_is_ended(tmp_path: Path, end: str) -> None:
    # docs/rules.md#resume: hold_for_append makes the restore-point read open BEGIN IMMEDIATE
    # and leave it open for the append; without an append, release_hold, any other method
    # of the handle and close end it (a rollback: it only read), and the connection then
    # serves the next handle
    _store_with_records_after_the_cut(tmp_path)
    db = tmp_path / "sessions.db"
    backend = SqliteBackend(db)
    writer = backend.open("s", "write")
    writer.hold_for_append()
    _, held, _ = writer.read_from_restore_point()
    assert not _file_is_free(db)
    if end == "release_hold":
        writer.release_hold()
        writer.release_hold()  # idempotent
    elif end == "another method":
        assert writer.last_stored_seq() >= held.events[-1]["seq"]
    else:
        writer.close()
    assert _file_is_free(db)
    if end != "close":
        _, again, _ = writer.read_from_restore_point()  # not held: the hold was for one read
        assert [e["seq"] for e in again.events] == [e["seq"] for e in held.events]
        assert _file_is_free(db)
        writer.close()
    with backend.open("s", "read") as reader:
        assert [e["seq"] for e in reader.read_from_restore_point()[1].events] == \
            [e["seq"] for e in held.events]
    backend.close()


def test_a_held_resume_on_a_busy_file_reads_without_holding(tmp_path: Path) -> None:
    # another connection's write transaction past the busy timeout: the resume reads in a
    # plain read transaction, as without hold_for_append, and holds nothing
    import sqlite3
    from contextlib import closing

    _store_with_records_after_the_cut(tmp_path)
    db = tmp_path / "sessions.db"
    backend = SqliteBackend(db, busy_timeout_ms=0)
    writer = backend.open("s", "write")
    writer.hold_for_append()
    with closing(sqlite3.connect(db, timeout=0, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")
        _, tail, _ = writer.read_from_restore_point()
        other.execute("ROLLBACK")
    assert tail.events and _file_is_free(db)
    writer.close()
    backend.close()

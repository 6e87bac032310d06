"""A bulk append checkpoints the WAL at 8,192 pages; a turn's append at SQLite's 1,000.

Rule: docs/formats.md#files-and-connections. Real files, real sqlite3: where the committed
pages are (the WAL or the database file) after each commit.
"""

from __future__ import annotations

import os
from pathlib import Path

from dsh.persistence.sqlite._backend import BULK_APPEND_ROWS, DEFAULT_WAL_AUTOCHECKPOINT
from tests.persistence.test_sqlite import backend_with, db_path, prefix, user

TEXT = "x" * 3_000  # ~3.2 kB a row: 1,500 rows are ~1,200 WAL pages, past SQLite's 1,000


def _turns(first: int, count: int) -> list:
    return [user(seq, f"{seq} {TEXT}") for seq in range(first, first + count)]


def test_a_bulk_append_past_1000_wal_pages_leaves_them_in_the_wal(tmp_path: Path) -> None:
    backend = backend_with(tmp_path, events=prefix())
    path = db_path(tmp_path)
    before = path.stat().st_size
    with backend.open("s1", "write") as handle:
        handle.append(_turns(3, 1_500))
        # not copied into the database file at this commit (it was, at 1,000 pages)
        assert path.stat().st_size == before < 200_000
        assert os.path.getsize(f"{path}-wal") > 1_000 * 4096
        setting = handle._c.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        assert setting == DEFAULT_WAL_AUTOCHECKPOINT  # the next commits' default is back
        events = handle.read().events
    assert [e["seq"] for e in events] == list(range(1_503))
    assert events[-1]["data"]["content"][0]["text"] == f"1502 {TEXT}"
    backend.close()  # the last connection checkpoints and removes the WAL
    assert path.stat().st_size > 1_500 * 3_000
    assert not os.path.exists(f"{path}-wal")


def test_a_turn_sized_append_after_it_checkpoints_at_the_default(tmp_path: Path) -> None:
    backend = backend_with(tmp_path, events=prefix())
    path = db_path(tmp_path)
    with backend.open("s1", "write") as handle:
        handle.append(_turns(3, 1_500))
        before = path.stat().st_size
        handle.append(_turns(1_503, BULK_APPEND_ROWS - 1))  # below the bulk size: 1,000 pages
        assert path.stat().st_size > before + 1_500 * 3_000  # the WAL was copied back
        assert len(handle.read().events) == 1_503 + BULK_APPEND_ROWS - 1
    backend.close()

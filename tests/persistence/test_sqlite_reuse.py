"""A closed handle's validated connection serves the next handle only while it still may.

Rule: docs/formats.md#files-and-connections. Real files, real sqlite3.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from dsh._errors import PersistenceError
from tests.persistence.test_sqlite import backend_with, db_path, prefix, raw


def test_the_next_handle_takes_the_connection_a_closed_handle_left(tmp_path: Path) -> None:
    backend = backend_with(tmp_path, events=prefix())
    with backend.open("s1") as handle:
        first = handle._c
        assert [e["seq"] for e in handle.read().events] == [0, 1, 2]
    with backend.open("s1", "write") as handle:
        assert handle._c is first  # not opened and validated again
        assert [e["seq"] for e in handle.read().events] == [0, 1, 2]
    backend.close()
    assert backend._idle == []


def test_a_schema_changed_since_is_checked_again_and_refused(tmp_path: Path) -> None:
    backend = backend_with(tmp_path, events=prefix())
    with backend.open("s1") as handle:
        handle.read()
    conn = raw(db_path(tmp_path))
    conn.execute("CREATE INDEX sneaky ON events(time)")  # moves the schema cookie
    conn.close()
    with pytest.raises(PersistenceError) as info:
        backend.open("s1")
    assert info.value.code == "SCHEMA_MISMATCH"
    backend.close()


def test_a_file_replaced_at_the_path_is_opened_afresh(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    backend_with(other, events=prefix()[:1]).close()  # a store whose s1 holds one event
    backend = backend_with(tmp_path, events=prefix())
    with backend.open("s1") as handle:
        first = handle._c
        assert len(handle.read().events) == 3
    path = db_path(tmp_path)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    shutil.copy(db_path(other), f"{path}.new")
    os.replace(f"{path}.new", path)  # a new inode at the path
    seals = Path(f"{path}.dsh-seals")
    shutil.copy(Path(f"{db_path(other)}.dsh-seals") / "s1.seal", seals / "s1.seal")
    with backend.open("s1") as handle:
        assert handle._c is not first
        assert len(handle.read().events) == 1
    backend.close()


def test_a_connection_left_inside_a_transaction_is_not_kept(tmp_path: Path) -> None:
    backend = backend_with(tmp_path, events=prefix())
    handle = backend.open("s1")
    handle._c.conn.execute("BEGIN")
    first = handle._c
    handle.close()
    assert first not in backend._idle
    with backend.open("s1") as again:
        assert again._c is not first
    backend.close()

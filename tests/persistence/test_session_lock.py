"""The write lock of a JSONL session (``dsh.persistence._lock.SessionLock``) and its errors."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from dsh._errors import PersistenceError
from dsh.persistence import _lock
from dsh.persistence._lock import SessionLock


def test_a_lock_file_that_cannot_be_written_is_a_clear_error_not_a_crash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a store folder the user may read but not write (root ignores modes, so it is simulated)
    def refuse(self: object, *args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(_lock._Flock, "acquire", refuse)
    path = tmp_path / "s" / "session.lock"
    with pytest.raises(PersistenceError) as caught:
        SessionLock(path, "s")
    err = caught.value
    assert err.code == "LOCK_UNAVAILABLE"
    assert err.message == (
        f"cannot take the write lock {path} of session 's': Permission denied; writing to a "
        f"session needs write access to its folder {path.parent} (commands that only read it, "
        "such as dsh show, do not)")
    assert err.where == {"session_id": "s", "path": str(path)}
    monkeypatch.undo()
    lock = SessionLock(path, "s")  # the failed attempt left nothing held in this process
    lock.release()

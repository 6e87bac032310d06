"""The write lock of a JSONL session (``dsh.persistence._lock.SessionLock``) and its errors."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

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


def test_the_owner_file_is_written_in_place_and_emptied_at_release(tmp_path: Path) -> None:
    # docs/formats.md#lock-and-owner-files: the holder writes its owner record through a
    # descriptor it keeps, over whatever a killed holder left, and empties the file when it
    # releases the lock; an empty owner file names nobody, as a missing one
    import json
    import os

    from dsh._errors import SessionBusyError

    path = tmp_path / "s" / "session.lock"
    owner = path.with_name("session.lock.owner")
    path.parent.mkdir()
    owner.write_text(json.dumps({"pid": 1, "host": "gone", "since": 5, "session": "s"})
                     + " " * 100)  # a killed holder's, longer than ours
    lock = SessionLock(path, "s")
    inode = owner.stat().st_ino
    assert json.loads(owner.read_text()) == {"pid": os.getpid(), "host": lock.host,
                                             "since": lock.since, "session": "s"}
    lock.release()
    assert owner.stat().st_ino == inode and owner.read_bytes() == b""
    assert _lock._read_owner(owner) == {}
    again = SessionLock(path, "s")  # the same file, no new one made
    assert owner.stat().st_ino == inode
    assert json.loads(owner.read_text())["since"] == again.since
    with pytest.raises(SessionBusyError, match="this process"):
        SessionLock(path, "s")
    again.release()
    again.release()  # idempotent
    assert owner.read_bytes() == b""


def _assert_refused_as_symlink(lock_path: Path, link: Path, target: Path) -> None:
    """Locking ``lock_path`` fails as SYMLINK naming ``link`` and its ``target``, never made."""
    with pytest.raises(PersistenceError) as info:
        SessionLock(lock_path, "s")
    assert info.value.code == "SYMLINK"
    assert info.value.where["path"] == str(link)
    assert f"refusing the symlink {link} (to {target})" in str(info.value)
    assert not target.exists()


def test_an_owner_file_symlinked_after_the_check_is_refused_as_symlink(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a link planted between the check and the O_NOFOLLOW open: before, a bare OSError (ELOOP)
    lock_path = tmp_path / "s" / "session.lock"
    owner = lock_path.with_name("session.lock.owner")
    target = tmp_path / "elsewhere"
    real = _lock.os_lock

    def planting(path: str) -> _lock._OsLock:
        owner.symlink_to(target)
        return real(path)

    monkeypatch.setattr(_lock, "os_lock", planting)
    _assert_refused_as_symlink(lock_path, owner, target)
    monkeypatch.setattr(_lock, "os_lock", real)
    owner.unlink()
    SessionLock(lock_path, "s").release()  # the lock was let go


def test_a_symlinked_lock_file_is_refused_as_symlink_and_never_followed(
        tmp_path: Path) -> None:
    # docs/formats.md#lock-and-owner-files: no lstat before the lock; the O_NOFOLLOW open
    # meets the link and names it (a dangling link too: nothing is created at its target)
    lock_path = tmp_path / "s" / "session.lock"
    lock_path.parent.mkdir()
    target = tmp_path / "elsewhere"
    lock_path.symlink_to(target)
    _assert_refused_as_symlink(lock_path, lock_path, target)
    lock_path.unlink()
    SessionLock(lock_path, "s").release()  # nothing was left held


def test_a_refused_writer_does_not_read_a_symlinked_owner_file(tmp_path: Path) -> None:
    # the holder is another open of the lock file (flock excludes it as another process's
    # lock); its owner file replaced by a link to a file that names someone
    import json

    lock_path = tmp_path / "s" / "session.lock"
    holder = SessionLock(lock_path, "s")
    owner = lock_path.with_name("session.lock.owner")
    target = tmp_path / "planted"
    target.write_text(json.dumps({"pid": 4242, "host": "h", "since": 1, "session": "s"}))
    try:
        owner.unlink()
        owner.symlink_to(target)
        with _lock._held_mutex:  # as if the holder were another process: flock refuses
            key = _lock._held.pop(holder._key)
        with pytest.raises(PersistenceError) as info:
            SessionLock(lock_path, "s")
        assert info.value.code == "SYMLINK" and info.value.where["path"] == str(owner)
    finally:
        with _lock._held_mutex:
            _lock._held[holder._key] = key
        owner.unlink()
        holder.release()


def test_an_owner_file_open_that_fails_is_a_typed_error_naming_it(tmp_path: Path) -> None:
    # something there that is no file (a folder): before, the bare OSError (EISDIR)
    lock_path = tmp_path / "s" / "session.lock"
    owner = lock_path.with_name("session.lock.owner")
    owner.mkdir(parents=True)
    with pytest.raises(PersistenceError) as info:
        SessionLock(lock_path, "s")
    assert info.value.code == "LOCK_UNAVAILABLE"
    assert info.value.where["path"] == str(owner)
    assert f"cannot write the lock owner file {owner} of session 's'" in str(info.value)
    owner.rmdir()
    SessionLock(lock_path, "s").release()  # the lock was let go


def test_an_owner_file_link_refused_with_emlink_is_named_as_symlink(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # FreeBSD's O_NOFOLLOW open of a symlink fails with EMLINK, not ELOOP
    lock_path = tmp_path / "s" / "session.lock"
    owner = lock_path.with_name("session.lock.owner")
    owner.parent.mkdir()
    owner.symlink_to(tmp_path / "elsewhere")
    real_open = os.open

    def freebsd_open(path: str, flags: int, mode: int = 0o777) -> int:
        try:
            return real_open(path, flags, mode)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise OSError(errno.EMLINK, os.strerror(errno.EMLINK), path) from None
            raise

    monkeypatch.setattr(os, "open", freebsd_open)
    with pytest.raises(PersistenceError) as info:
        SessionLock(lock_path, "s")
    monkeypatch.undo()
    assert info.value.code == "SYMLINK" and info.value.where["path"] == str(owner)
    owner.unlink()
    SessionLock(lock_path, "s").release()


def _refused_in_another_process(lock_path: Path) -> str:
    """What ``SessionLock(lock_path, "s")`` in a fresh process says: the pid its
    SessionBusyError names (``None`` for nobody), or its traceback when it raised another."""
    import subprocess
    import sys

    child = subprocess.run(
        [sys.executable, "-c",
         "import sys; from pathlib import Path; from dsh._errors import SessionBusyError\n"
         "from dsh.persistence._lock import SessionLock\n"
         "try:\n    SessionLock(Path(sys.argv[1]), 's')\n"
         "except SessionBusyError as e:\n    print(e.where.get('pid'))\n",
         str(lock_path)], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    return child.stdout


def test_a_refused_writer_never_blocks_on_a_fifo_at_the_owner_path(tmp_path: Path) -> None:
    # docs/formats.md#lock-and-owner-files: anything at the owner path that is no regular
    # file names nobody: a refused writer (another process) opens it without blocking. Before,
    # a FIFO there (its holder's own record unlinked) blocked the refused writer's read for
    # good
    lock_path = tmp_path / "s" / "session.lock"
    holder = SessionLock(lock_path, "s")
    owner = lock_path.with_name("session.lock.owner")
    try:
        owner.unlink()
        os.mkfifo(owner, 0o600)
        assert _refused_in_another_process(lock_path) == "None\n"  # refused, naming nobody
    finally:
        holder.release()


def test_an_owner_file_nested_too_deep_names_nobody(tmp_path: Path) -> None:
    # docs/formats.md#lock-and-owner-files: an owner file no holder wrote names nobody; JSON
    # nested deeper than Python's recursion limit (4 KiB of brackets) was a RecursionError
    # out of the refused writer, not its SessionBusyError
    lock_path = tmp_path / "s" / "session.lock"
    holder = SessionLock(lock_path, "s")
    try:
        lock_path.with_name("session.lock.owner").write_text("[" * _lock.OWNER_BYTES)
        assert _refused_in_another_process(lock_path) == "None\n"
    finally:
        holder.release()


def _held_by_owner(tmp_path: Path, owner: dict[str, object], script: str) -> Any:
    """What ``script`` prints as JSON, run in a child while this process holds session "s"
    with ``owner`` as the lock's owner file (the child has ``sys``, ``json``, ``Path``,
    ``SessionBusyError`` and ``SessionLock``; ``sys.argv[1]`` is the lock path)."""
    import json
    import subprocess
    import sys

    lock_path = tmp_path / "s" / "session.lock"
    holder = SessionLock(lock_path, "s")
    try:
        lock_path.with_name("session.lock.owner").write_text(json.dumps(owner))
        child = subprocess.run(
            [sys.executable, "-c",
             "import sys, json; from pathlib import Path\n"
             "from dsh._errors import SessionBusyError\n"
             "from dsh.persistence._lock import SessionLock\n" + script,
             str(lock_path)], capture_output=True, text=True, timeout=60)
    finally:
        holder.release()
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout)


def test_a_busy_error_escapes_the_control_characters_of_the_owner_files_host(
        tmp_path: Path) -> None:
    # docs/errors.md#sessionbusyerror: the owner file is anyone's text; before, its host went
    # into str(e) raw, so a library caller printing the error let "\x1b]0;pwned\x07" retitle
    # the terminal and "\x1b[2J" clear it
    message, pid, host, since = _held_by_owner(
        tmp_path, {"pid": "\x1b[2J", "host": "box\x1b]0;pwned\x07\x9b2J\u202e", "since": True},
        "try:\n    SessionLock(Path(sys.argv[1]), 's')\n"
        "except SessionBusyError as e:\n"
        "    print(json.dumps([str(e), *map(e.where.get, ('pid', 'host', 'since'))]))\n")
    assert (pid, since) == (None, None)  # only an int names a pid or a time
    assert host == "box\\x1b]0;pwned\\x07\\x9b2J\\u202e"
    assert message == ("session 's' is open for writing by another process (pid None, host "
                       "box\\x1b]0;pwned\\x07\\x9b2J\\u202e, since None ms); only one writer at "
                       "a time, close the other handle first")


def test_a_holder_whose_host_says_this_process_is_waited_for(tmp_path: Path) -> None:
    # docs/errors.md#sessionbusyerror: whether the holder is this process (never waited for)
    # is where's holder, not words of the message, which quotes the owner file's host: before,
    # a host "box by this process" made a waiting writer give up at its first try
    tries = _held_by_owner(
        tmp_path, {"pid": 1, "host": "box by this process", "since": 0},
        "from dsh.adapters._log import wait_for_writer\n"
        "tries = []\n"
        "def attempt():\n"
        "    tries.append(1)\n"
        "    try:\n        return SessionLock(Path(sys.argv[1]), 's')\n"
        "    except SessionBusyError as e:\n"
        "        tries.append(e.where.get('holder'))\n        raise\n"
        "try:\n    wait_for_writer(attempt, 1.0)\n"
        "except SessionBusyError:\n    print(json.dumps(tries))\n")
    assert tries[:2] == [1, "another process"] and tries.count(1) > 1  # waited, tried again


def _refused_while_held(lock_path: Path, second: Path, *, link: bool = False) -> Any:
    """The ``SessionBusyError`` of ``SessionLock(second)`` while ``lock_path`` is held here.

    ``link``: ``second`` is made a hard link of the held lock file first.
    """
    from dsh._errors import SessionBusyError

    holder = SessionLock(lock_path, "s")
    try:
        if link:
            second.parent.mkdir()
            os.link(lock_path, second)
        with pytest.raises(SessionBusyError) as info:
            SessionLock(second, "s")
    finally:
        holder.release()
    return info.value


def test_held_here_tells_a_holder_in_this_process_by_where_not_by_the_message(
        tmp_path: Path) -> None:
    # docs/errors.md#sessionbusyerror: a second lock of this process is held here; one held by
    # another process (its host saying "this process") is not; the error is what the lock raises
    from dsh._errors import SessionBusyError

    lock_path = tmp_path / "s" / "session.lock"
    refused = _refused_while_held(lock_path, lock_path)
    assert refused.held_here is True
    assert refused.holder_phrase() == f"this process (pid {os.getpid()} on {os.uname()[1]})"
    held_there = _held_by_owner(
        tmp_path / "there", {"pid": 7, "host": "this process", "since": 0},
        "try:\n    SessionLock(Path(sys.argv[1]), 's')\n"
        "except SessionBusyError as e:\n"
        "    print(json.dumps([e.held_here, e.holder_phrase()]))\n")
    assert held_there == [False, "another process (pid 7 on this process)"]
    assert SessionBusyError("busy").held_here is False  # no holder named: not this process


def test_a_second_path_to_a_held_lock_file_is_refused_as_held_by_this_process(
        tmp_path: Path) -> None:
    # the in-process registry is keyed by the lock file itself (its device and inode), not by
    # its path: a store reached through another path (a bind mount; here a hard link of the
    # lock file) is refused at once as held here, naming this process, where before flock
    # refused it as another process's lock that its owner file (at the other path) could not
    # name, and a waiting writer waited for it (docs/formats.md#lock-and-owner-files)

    lock_path = tmp_path / "a" / "session.lock"
    other = tmp_path / "b" / "session.lock"
    refused = _refused_while_held(lock_path, other, link=True)
    assert refused.held_here is True
    assert refused.where["pid"] == os.getpid()
    assert refused.where["path"] == str(other)
    again = SessionLock(other, "s")  # released: the refused attempt kept nothing held
    again.release()

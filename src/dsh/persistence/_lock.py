"""Exclusive write ownership of one session: a lock file plus an ``.owner`` sidecar.

Rule: docs/stores.md#the-backend-contract.

dsh excludes only writers inside its own process (docs/formats.md#jsonl,
docs/rules.md#one-writer-per-session); the port excludes writers everywhere. The lock is an OS file
lock on a file beside the data, acquired without blocking: ``fcntl.flock`` called directly on
POSIX (the lock ``filelock.FileLock`` takes there, without its ~1 ms of bookkeeping per lock: an
adapter's first write takes it), ``filelock`` elsewhere. After acquiring, the holder writes
``{"pid", "host", "since", "session"}`` (since = epoch ms) to ``<lock>.owner`` so a refused
writer can name the holder: in place, through a descriptor it keeps until it releases the lock
and empties the file (no file created, renamed or removed per lock once the file exists: an
adapter's first write takes the lock). An empty or half-written owner file names nobody, as a
missing one does (the refused writer asks again, :data:`OWNER_WAIT_MS` in the backends). The OS
releases the lock when the holder process dies, so a crash never leaves a stale lock; a stale
``.owner`` file is simply overwritten by the next holder. A symlink at the lock or owner file is
refused (``SYMLINK``): with ``flock`` when the ``O_NOFOLLOW`` open meets it (and before a
refused writer reads the owner file), with ``filelock`` by an ``lstat`` first.

``flock`` excludes other open files of the lock file in this process too, but ``filelock`` locks
are re-entrant inside one process (same path → same lock object), so the in-process exclusion
is a separate registry of held locks guarded by a mutex, naming the holder. With ``flock`` it is
keyed by the opened lock file's device and inode (one ``fstat`` of the descriptor the lock is
taken on: no walk of the folder's path, which cost a fresh process's first write ~0.1 ms, and
every path to the same file meets the same key); with ``filelock`` by the resolved path.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import NoReturn, Protocol

import orjson

from dsh._errors import PersistenceError, SessionBusyError, printable
from dsh.persistence._paths import mkdir_private, refuse_symlink

__all__ = ["SessionLock"]

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: filelock's msvcrt lock
    fcntl = None  # type: ignore[assignment]

_held: dict[object, dict[str, object]] = {}  # lock key -> holder info, for in-process refusals
_held_mutex = threading.Lock()


OWNER_BYTES = 4096
"""The most of an owner file a refused writer reads (a holder writes about 100 bytes)."""


def _read_owner(owner_path: Path) -> dict[str, object]:
    """The holder an owner file names, or ``{}`` when it names nobody.

    Opened without blocking and without following a link, and read only when it is a regular
    file, at most :data:`OWNER_BYTES` of it: anything else there (a FIFO, a device, a file a
    holder never wrote, JSON nested past the recursion limit) names nobody, so a refused writer
    never blocks on it nor fails on it (docs/formats.md#lock-and-owner-files).
    """
    try:
        fd = os.open(owner_path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # the holder may not have written its sidecar yet (after acquire)
        return {}
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}
        value = json.loads(os.read(fd, OWNER_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # half written, no JSON, nested too deep
        return {}
    finally:
        os.close(fd)
    return value if isinstance(value, dict) else {}


def _owner_record(info: dict[str, object]) -> bytes:
    """The owner file's JSON object (``{"pid", "host", "since", "session"}``) as bytes.

    orjson's (a fresh process's first ``json.dumps`` costs ~25 us of its first write); a host or
    session name orjson refuses (a lone surrogate from an undecodable host name) goes through
    ``json.dumps``, which escapes it. Readers parse either (docs/formats.md#lock-and-owner-files).
    """
    try:
        return orjson.dumps(info)
    except orjson.JSONEncodeError:
        return json.dumps(info).encode()


_LINK_ERRNOS: frozenset[int] = frozenset({errno.ELOOP, errno.EMLINK})
"""What an ``O_NOFOLLOW`` open of a symlink fails with: ELOOP (Linux, macOS), EMLINK (FreeBSD)."""

_resolved: dict[str, str] = {}
"""Lock folders (absolute) already resolved by this process, and what they resolved to."""


def _key(lock_path: Path) -> str:
    """The in-process registry key of a lock file without ``fcntl``: its folder resolved + name.

    An absolute folder is resolved once per process (a walk of its components, one ``lstat``
    each); the key only names an in-process holder, since the OS lock excludes every other
    open of the file anyway (``msvcrt`` locks a file region per handle, as ``flock`` locks per
    open file). That is why a resolution kept after the folder was moved or relinked is
    safe: a second handle whose key differs is still refused by the OS lock, and one whose key
    matches another file is refused as busy; the cache can refuse too much, never let two
    writers in. (With ``fcntl`` the key is the file's device and inode: :meth:`_Flock.key`.)
    """
    folder = str(lock_path.parent)
    if not lock_path.is_absolute():
        return str(lock_path.parent.resolve() / lock_path.name)
    resolved = _resolved.get(folder)
    if resolved is None:
        resolved = _resolved[folder] = str(lock_path.parent.resolve())
    return os.path.join(resolved, lock_path.name)


class _OsLock(Protocol):
    def key(self) -> object: ...

    def acquire(self) -> bool: ...

    def release(self) -> None: ...


class _Flock:
    """An exclusive ``flock`` on a file (created 0600, never followed through a symlink)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None
        self._locked = False

    def key(self) -> object:
        """Open the lock file (created 0600 when missing) and return its ``(device, inode)``.

        The in-process registry key: the file itself, whatever path reached it.

        Raises:
            OSError: the file cannot be opened (a folder we may not write in; ``ELOOP`` or
                ``EMLINK``: a symlink there).
        """
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                     | os.O_NONBLOCK, 0o600)  # (O_NONBLOCK: a FIFO put there never blocks)
        self._fd = fd
        info = os.fstat(fd)
        return (info.st_dev, info.st_ino)

    def acquire(self) -> bool:
        """Take the lock on the file :meth:`key` opened, without blocking.

        Returns False when another open file holds it (the file is closed then).

        Raises:
            OSError: the file cannot be locked.
        """
        fd = self._fd
        if fd is None:  # (key() was not asked: open it now)
            self.key()
            fd = self._fd
            assert fd is not None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.release()
            return False
        self._locked = True
        return True

    def release(self) -> None:
        """Unlock (when locked) and close the lock file; idempotent."""
        fd, self._fd = self._fd, None
        locked, self._locked = self._locked, False
        if fd is not None:
            try:
                if locked:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)


class _PortableLock:
    """``filelock.FileLock`` where there is no ``fcntl`` (Windows)."""

    def __init__(self, path: str) -> None:
        # Imported here: reading a store (`dsh ls`) takes no lock and skips its ~10 ms import.
        from filelock import FileLock

        self._path = path
        self._lock = FileLock(path, timeout=0, mode=0o600, thread_local=False,
                              is_singleton=False, preserve_lock_file=True)

    def key(self) -> object:
        return _key(Path(self._path))

    def acquire(self) -> bool:
        from filelock import Timeout

        try:
            self._lock.acquire(timeout=0, blocking=False)
        except Timeout:
            return False
        return True

    def release(self) -> None:
        self._lock.release(force=True)


def os_lock(path: str) -> _OsLock:
    """The OS file lock on ``path`` (not taken yet): ``flock``, or ``filelock`` without fcntl."""
    return _Flock(path) if fcntl is not None else _PortableLock(path)


class SessionLock:
    """A held, exclusive, non-blocking write lock on one session.

    Args:
        lock_path: The lock file (``<session dir>/session.lock`` for JSONL,
            ``<db>.dsh-locks/<encoded id>.lock`` for SQLite). Parent directories are created.
        session_id: Named in the busy error.

    Raises:
        SessionBusyError: another handle in this process, or another process, holds the lock;
            ``where`` carries ``pid``, ``host``, ``since`` (epoch ms) when the holder wrote them.
        PersistenceError: ``SYMLINK`` a symlink at the lock or owner file;
            ``LOCK_UNAVAILABLE`` the lock file or the owner file cannot be opened or written
            (``path`` names which).
    """

    def __init__(self, lock_path: Path, session_id: str) -> None:
        self.path = lock_path
        self.owner_path = lock_path.with_name(lock_path.name + ".owner")
        self.session_id = session_id
        mkdir_private(lock_path.parent, "a lock folder")
        if fcntl is None:  # (with fcntl the O_NOFOLLOW opens refuse a link: named then)
            refuse_symlink(lock_path, "a lock file")
            refuse_symlink(self.owner_path, "a lock owner file")
        self.since = int(time.time() * 1000)
        self.pid = os.getpid()
        self.host = socket.gethostname()
        info: dict[str, object] = {"pid": self.pid, "host": self.host, "since": self.since,
                                   "session": session_id}
        self._lock = os_lock(str(lock_path))
        try:
            # the registry key; with flock this opens the lock file, not locked yet
            key = self._lock.key()
        except OSError as exc:  # a folder we may not write in
            self._lock.release()
            self._unavailable(exc)
        self._key = key
        with _held_mutex:
            holder = _held.get(key)
            if holder is not None:
                self._lock.release()
                self._busy(holder, in_process=True)
            _held[key] = info
        try:
            acquired = self._lock.acquire()
        except OSError as exc:
            with _held_mutex:
                _held.pop(key, None)
            self._lock.release()
            self._unavailable(exc)
        except BaseException:
            with _held_mutex:
                _held.pop(key, None)
            self._lock.release()
            raise
        if not acquired:
            with _held_mutex:
                _held.pop(key, None)
            refuse_symlink(self.owner_path, "a lock owner file")  # never read through a link
            self._busy(_read_owner(self.owner_path), in_process=False)
        self._released = False
        self._owner_fd: int | None = None
        try:
            # written in place (a reader that finds it empty or half written asks again), and
            # emptied at release through the same descriptor
            try:
                try:
                    self._owner_fd = os.open(
                        self.owner_path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW
                        | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
                except OSError as exc:
                    # the O_NOFOLLOW open is the symlink check: one there is refused, named
                    if exc.errno in _LINK_ERRNOS:
                        refuse_symlink(self.owner_path, "a lock owner file")  # SYMLINK
                    raise
                os.ftruncate(self._owner_fd, 0)
                data = _owner_record(info)
                if os.write(self._owner_fd, data) != len(data):
                    raise OSError(f"short write to the lock owner file {self.owner_path}")
            except OSError as exc:
                raise PersistenceError(
                    f"cannot write the lock owner file {self.owner_path} of session "
                    f"{session_id!r}: {exc.strerror or exc}; the lock is not kept. It must be "
                    f"a regular file dsh may write in the folder {lock_path.parent}: fix "
                    "what is there or the folder's permissions", code="LOCK_UNAVAILABLE",
                    session_id=session_id, path=str(self.owner_path)) from exc
        except BaseException:
            self.release()  # never keep a lock whose holder cannot be named
            raise

    def _unavailable(self, exc: OSError) -> NoReturn:
        """Raise for a lock file that cannot be opened or locked (``SYMLINK`` or ``LOCK_...``)."""
        if exc.errno in _LINK_ERRNOS:  # the O_NOFOLLOW open met a link there
            refuse_symlink(self.path, "a lock file")  # SYMLINK, named
        raise PersistenceError(
            f"cannot take the write lock {self.path} of session {self.session_id!r}: "
            f"{exc.strerror or exc}; writing to a session needs write access to its "
            f"folder {self.path.parent} (commands that only read it, such as dsh show, "
            "do not)", code="LOCK_UNAVAILABLE", session_id=self.session_id,
            path=str(self.path)) from exc

    def _busy(self, owner: dict[str, object], *, in_process: bool) -> NoReturn:
        # The owner file is anyone's text: only an int is a pid or a time, and the host is
        # shown with its control characters escaped, so neither the message a library caller
        # prints nor ``where`` can drive a terminal (docs/errors.md#sessionbusyerror).
        pid = _int_or_none(owner.get("pid"))
        since = _int_or_none(owner.get("since"))
        raw_host = owner.get("host")
        host = printable(raw_host) if isinstance(raw_host, str) else None
        where = "this process" if in_process else "another process"
        raise SessionBusyError(
            f"session {self.session_id!r} is open for writing by {where} "
            f"(pid {pid}, host {host}, since {since} ms); only one writer at a time, "
            f"close the other handle first",
            session_id=self.session_id,
            path=str(self.path),
            pid=pid,
            host=host,
            since=since,
            holder=where,  # what a waiter tells by, never the message's words
        )

    @property
    def released(self) -> bool:
        """Whether :meth:`release` ran."""
        return self._released

    def release(self) -> None:
        """Release the lock (idempotent); the ``.owner`` sidecar is emptied first."""
        if self._released:
            return
        self._released = True
        fd, self._owner_fd = self._owner_fd, None
        try:
            if fd is not None:
                try:
                    os.ftruncate(fd, 0)  # names nobody now, as a missing file
                finally:
                    os.close(fd)
        finally:
            try:
                self._lock.release()
            finally:
                with _held_mutex:
                    _held.pop(self._key, None)

    def __enter__(self) -> SessionLock:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _int_or_none(value: object) -> int | None:
    """``value`` when it is an int (never a bool), else None."""
    return value if type(value) is int else None

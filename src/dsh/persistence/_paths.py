"""Store-owned paths: private folders, and no symlink where a store file or folder belongs.

A symlink placed where a session folder, log, lock or sidecar should be would send writes
outside the store (or into another session), so every store-owned path is checked with
``lstat`` (files are also opened with ``O_NOFOLLOW``). Only the store root itself may be a
symlink: it is named by the user. Folders the store creates are mode 0700
    (docs/formats.md#layout-and-path-encoding), parents included.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Final

from dsh._errors import LogCorruptError, PersistenceError

__all__ = ["SAFE_CHARACTERS", "code_units", "encode_segment", "file_revision", "fsync_folder",
           "mkdir_private", "refuse_special", "refuse_symlink", "replace_file", "write_all"]

SAFE_CHARACTERS: Final = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
"""Characters a path segment keeps as they are; every other UTF-16 unit becomes ``~XXXX``."""


def code_units(text: str) -> list[int]:
    """The UTF-16 code units of ``text`` (lone surrogates kept)."""
    raw = text.encode("utf-16-le", "surrogatepass")
    return [raw[i] | (raw[i + 1] << 8) for i in range(0, len(raw), 2)]


def encode_segment(text: str) -> str:
    """Encode a session id as one path segment, injectively over UTF-16.

    Rule: docs/formats.md#layout-and-path-encoding.

    Every UTF-16 code unit outside ``[A-Za-z0-9._-]`` (``~`` included) becomes ``~XXXX``
    (uppercase hex); the whole ids ``.`` and ``..`` become ``~002E`` and ``~002E~002E``.

    Raises:
        LogCorruptError: ``text`` is empty (an empty id cannot name a storage path).
    """
    if not text:
        raise LogCorruptError("cannot encode an empty path segment: a session id must be "
                              "non-empty to name a storage path", code="INVALID_ID")
    if text == ".":
        return "~002E"
    if text == "..":
        return "~002E~002E"
    if text.isascii() and all(ch in SAFE_CHARACTERS for ch in text):
        return text
    out: list[str] = []
    for unit in code_units(text):
        ch = chr(unit)
        out.append(ch if unit < 128 and ch in SAFE_CHARACTERS else f"~{unit:04X}")
    return "".join(out)



def file_revision(st: os.stat_result) -> str:
    """A file's revision: opaque, equal while its bytes did not change (within one process).

    Built from device, inode, size and the modification and change times (ns); see
    docs/formats.md#layout-and-path-encoding.
    """
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def fsync_folder(path: Path) -> None:
    """Sync the folder ``path`` to disk, so an entry created or renamed in it survives a power cut.

    Rule: docs/formats.md#writing. Raises ``OSError`` as ``os.fsync`` does.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(path: Path, data: bytes) -> None:
    """Replace the file ``path`` by ``data`` (mode 0600) so a power cut leaves one or the other.

    A temporary file beside it is written whole and fsynced, renamed over ``path`` and the
    folder fsynced; on failure the temporary file is removed. Rule: docs/formats.md#writing.

    Raises:
        OSError: the file could not be written or renamed (``path`` is unchanged).
    """
    replace_file(path, data, durable=True)
    fsync_folder(path.parent)


def write_all(fd: int, data: bytes) -> None:
    """Write ``data`` whole to the descriptor ``fd`` (``os.write`` may write less at once).

    Raises:
        OSError: a write failed (part of ``data`` may have been written).
    """
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def replace_file(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Write ``data`` whole to a temporary file beside ``path`` and rename it over ``path``.

    The temporary file (``.<name>.<12 hex>.tmp``, mode 0600, created exclusively, no symlink
    followed) is fsynced before the rename when ``durable``; the folder is not (see
    :func:`replace_durably`). On failure the temporary file is removed.

    Raises:
        OSError: the file could not be written or renamed (``path`` is unchanged).
    """
    tmp = path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def refuse_symlink(path: Path, what: str) -> None:
    """Raise if ``path`` is a symlink (a missing path is fine).

    Raises:
        PersistenceError: code ``SYMLINK``, naming the link, its target and what belongs
            there.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise PersistenceError(
            f"refusing the symlink {path} (to {os.readlink(path)}) where the store keeps {what}: "
            f"a link there would send writes outside the store; put {what} there in its place",
            code="SYMLINK", path=str(path))


_KINDS: Final = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                 (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                 (stat.S_ISBLK, "a block device"))


def refuse_special(path: Path, what: str) -> None:
    """Raise if ``path`` is a symlink or anything but a regular file (a missing path is fine).

    Rule: docs/formats.md#file-modes-and-symlinks. A FIFO where a log belongs would block its
    reader forever (opening it waits for a writer), a folder would fail as ``IsADirectoryError``.

    Raises:
        PersistenceError: code ``SYMLINK`` (as :func:`refuse_symlink`), or code ``NOT_A_FILE``
            naming what sits there.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        refuse_symlink(path, what)
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
        raise PersistenceError(
            f"{path} is {kind}, where the store keeps {what} (a regular file); dsh does not "
            f"read or write it: move it away", code="NOT_A_FILE", path=str(path))


def open_sidecar(path: Path, what: str) -> int:
    """Open a sidecar file for reading, following no symlink: neither the file nor its folder.

    The folder is opened with ``O_NOFOLLOW | O_DIRECTORY`` and the file relative to it with
    ``O_NOFOLLOW``, so a symlinked ``.dsh-seals`` or ``.dsh-checkpoints`` folder is refused by
    a read as by a write (docs/formats.md#file-modes-and-symlinks). The file is opened without
    blocking and must be a regular file: a FIFO or a device there is refused, never waited on.

    Raises:
        FileNotFoundError: the file (or its folder) does not exist.
        PersistenceError: code ``SYMLINK``: the folder is a symlink.
        OSError: the file is a symlink (``ELOOP``), no regular file (``EINVAL``), or cannot be
            opened.
    """
    try:
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            refuse_symlink(path.parent, what)
        raise
    try:
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    finally:
        os.close(folder)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def mkdir_private(path: Path, what: str) -> bool:
    """Create ``path`` (and missing parents) with mode 0700; return whether it was created.

    Raises:
        PersistenceError: code ``SYMLINK``: ``path`` is a symlink; code ``NOT_A_DIRECTORY``:
            it exists and is not a directory.
        OSError: the folder could not be created.
    """
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            return False  # there already, and no symlink (one lstat: the common case)
    except FileNotFoundError:
        pass
    refuse_symlink(path, what)
    try:
        path.mkdir(mode=0o700)
    except FileNotFoundError:
        mkdir_private(path.parent, "a store folder")
        return mkdir_private(path, what)
    except FileExistsError:
        refuse_symlink(path, what)  # lost a race with a link
        if not path.is_dir():
            raise PersistenceError(f"{path} is not a directory, but the store keeps {what} "
                                   f"there", code="NOT_A_DIRECTORY", path=str(path)) from None
        return False
    return True


def read_aside_file(folder: Path, name: str, *, head: bool = False) -> bytes | None:
    """The bytes of the aside ``folder/name``, or None when it is not there.

    ``head``: only its head, the bytes up to and including the first newline (``b""`` when
    it has none), read :data:`_HEAD_READ_BYTES` at a time: a LangGraph index's head is a few
    hundred bytes of a file of hundreds of KB. Rule: docs/stores.md#asides.

    Raises:
        PersistenceError: code ``SYMLINK``: the folder is a symlink.
        OSError: it could not be read.
    """
    try:
        fd = open_sidecar(folder / name, "asides")
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not head:
            return f.read()
        parts: list[bytes] = []
        while True:
            part = f.read(_HEAD_READ_BYTES)
            end = part.find(b"\n")
            if end >= 0:
                parts.append(part[:end + 1])
                return b"".join(parts)
            if not part:
                return b""  # no newline: no head
            parts.append(part)


_HEAD_READ_BYTES: Final = 16 * 1024
"""How much of an aside a head read reads at a time."""


def write_aside_file(folder: Path, name: str, data: bytes) -> None:
    """Replace the aside ``folder/name`` by ``data``: a temporary file renamed, not fsynced.

    Derived data: a power cut may leave the old bytes or none, which its reader detects.
    Rule: docs/stores.md#asides.

    Raises:
        PersistenceError: code ``SYMLINK``: the folder is a symlink.
        OSError: it could not be written (the old one stays).
    """
    mkdir_private(folder, "asides")
    replace_file(folder / name, data)


def drop_aside_files(folder: Path) -> None:
    """Delete the folder of one session's asides and what it holds (none there is fine).

    Raises:
        PersistenceError: code ``SYMLINK``: the folder is a symlink.
        OSError: a file could not be deleted.
    """
    refuse_symlink(folder, "asides")
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return
    for entry in entries:
        os.unlink(entry.path)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(folder)

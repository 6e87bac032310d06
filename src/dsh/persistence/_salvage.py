"""Bytes a repair removes are saved beside the log first (docs/rules.md#crash-safety).

A torn JSONL line, a torn Zstandard frame or SQLite rows past a bad one are judged "never
committed" and cut. The judgement can be wrong (damage that looks like a crash), so the cut
bytes are first written, fsynced, to a file next to the log: ``<log name>.torn-<UTC time>-<pid>``.
The file is complete or absent (temp file + fsync + rename + directory fsync), and it is
created before the cut, so no crash between the two loses the bytes.

``dsh verify`` lists these files (:func:`list_cuts`); nothing reads them back automatically.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Final

from dsh.persistence._paths import fsync_folder

__all__ = ["CUT_MARKER", "list_cuts", "save_cut"]

CUT_MARKER: Final = ".torn-"
"""What a saved-cut file name holds between the log name and the time stamp."""


def save_cut(directory: Path, stem: str, data: bytes) -> Path:
    """Durably save ``data`` as ``<directory>/<stem>.torn-<UTC time>-<pid>`` (mode 0600).

    Args:
        directory: An existing directory (the session folder, or the SQLite cut folder).
        stem: The log's file name (``session.jsonl``) or a session's encoded id.
        data: The exact bytes about to be removed.

    Returns:
        Path: the saved file.

    Raises:
        OSError: the file could not be written; the caller must then not cut anything.
    """
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"
    final = directory / f"{stem}{CUT_MARKER}{stamp}-{os.getpid()}"
    if final.exists():
        final = final.with_name(f"{final.name}-{secrets.token_hex(3)}")
    tmp = directory / f".{final.name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        written = 0
        while written < len(data):
            written += os.write(fd, view[written:])
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.rename(tmp, final)
    fsync_folder(directory)
    return final


def list_cuts(directory: Path, stem: str) -> list[Path]:
    """Saved-cut files of ``stem`` in ``directory``, oldest first (none: empty list)."""
    prefix = f"{stem}{CUT_MARKER}"
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [directory / name for name in sorted(names) if name.startswith(prefix)]

"""How a JSONL store's search index stays fresh without a ``stat`` of every log per search.

``<root>/.dsh-search.journal`` names the sessions a writer may be changing. A write handle
appends ``{"w": id, "pid": n, "host": name}`` (fsynced, and the root folder too when the file
is new) before it changes the session's log for the first time, and ``{"c": id}`` when it
closes having left the index exactly equal to the log (its last flush's batch was added to the
index, nothing is left unflushed). A session whose last line is ``w`` is *watched*.

A search (:class:`JournalFreshness`) then stats only: the watched sessions' logs; each project
folder (a session folder created or removed, by dsh or any program, changes its project
folder's signature; a project folder added or removed changes the root's list of them: the
session folders are then listed again, new ones stat'ed, missing ones dropped); and every log
when the index is new, when the journal has a line it cannot read, or when the last full sweep
is older than :data:`FULL_SWEEP_S` (so bytes another program appended in place are found
within that time). A folder signature taken
less than :data:`RACY_S` after the folder changed is not trusted (time stamps are coarse).

After the index caught up, the journal is rewritten (renamed into place under an exclusive
``flock``, which writers take shared) with only the ``w`` lines still watched: a session closed
cleanly, or whose writer is a process of this host found dead *before* its log was stat'ed, is
dropped.

Invariants: a committed event of a dsh writer is never missing from a search, because its
``w`` line was durable before the event's bytes were written and stays until the index holds
them; the journal and the folder signatures are only derived (losing them costs one full
sweep). Rule: docs/stores.md#search; the files: docs/formats.md#search-index.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from dsh.persistence._contract import STORE_LOG_ID
from dsh.persistence._paths import fsync_folder
from dsh.persistence._search import (
    IndexChanges,
    compare,
    decode_segment,
    jsonl_signature,
    jsonl_signatures,
)

__all__ = ["FULL_SWEEP_S", "JOURNAL_NAME", "RACY_S", "JournalFreshness", "mark_closed",
           "mark_writing"]

log = logging.getLogger("dsh.persistence.search")

JOURNAL_NAME: Final = ".dsh-search.journal"
"""The journal's file name in a JSONL store's root."""

FULL_SWEEP_S: Final = 60.0
"""Seconds after which a search stats every log again (catches in-place foreign appends)."""

RACY_S: Final = 2.0
"""A folder signature taken this soon after the folder's change is not trusted."""

_LOG_NAMES: Final = ("session.jsonl", "session.jsonl.zstd")
_SCHEMA: Final = ("CREATE TABLE IF NOT EXISTS jsonl_folders (name TEXT PRIMARY KEY, "
                  "signature TEXT NOT NULL)",
                  "CREATE TABLE IF NOT EXISTS jsonl_sweep (singleton INTEGER PRIMARY KEY "
                  "CHECK (singleton = 1), at_ns INTEGER NOT NULL)")
_HOST: Final = socket.gethostname()


def _append(root: Path, record: dict[str, object], *, durable: bool) -> None:
    """Append one line to the journal under a shared ``flock`` (the rewrite takes it exclusive).

    Raises:
        OSError: the line could not be written (or synced, when ``durable``).
    """
    path = root / JOURNAL_NAME
    data = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    while True:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                if os.stat(path).st_ino != os.fstat(fd).st_ino:
                    continue  # renamed over while we waited: write to the new file
            except FileNotFoundError:
                continue
            new = os.fstat(fd).st_size == 0
            os.write(fd, data)
            if durable:
                os.fsync(fd)
                if new:
                    fsync_folder(root)
            return
        finally:
            os.close(fd)


def mark_writing(root: Path, session_id: str) -> None:
    """Name ``session_id`` as being written, durably, before its log's first change.

    Raises:
        OSError: the journal could not be written: the caller must not change the log.
    """
    _append(root, {"w": session_id, "pid": os.getpid(), "host": _HOST}, durable=True)


def mark_closed(root: Path, session_id: str) -> None:
    """Note that the index holds ``session_id``'s log exactly as its writer leaves it.

    Not synced: a lost line only keeps the session watched. Raises ``OSError``.
    """
    _append(root, {"c": session_id}, durable=False)


def _alive(pid: object, host: object) -> bool:
    """Whether the writer may still write: any process of another host counts as alive."""
    if host != _HOST or not isinstance(pid, int) or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _folder_signature(st: os.stat_result, now_ns: int) -> str:
    sig = f"{st.st_ino}:{st.st_dev}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    if now_ns - max(st.st_mtime_ns, st.st_ctime_ns) < RACY_S * 1e9:
        return "racy:" + sig  # never equal to what the next search finds
    return sig


def _log_signature(folder: str) -> str | None:
    for name in _LOG_NAMES:
        try:
            return jsonl_signature(os.stat(os.path.join(folder, name)))
        except FileNotFoundError:
            continue
    return None


class JournalFreshness:
    """The changes of a JSONL store since its sidecar index was last brought up to date.

    Args:
        root: The store's root folder.
    """

    def __init__(self, root: Path) -> None:
        self._root = root
        self._folders: dict[str, str] = {}
        self._stored: dict[str, str] = {}
        # the journal as read: inode, size, bytes, last line per session, those to keep
        self._journal: tuple[int, int, bytes, dict[str, bytes], set[str]] | None = None
        self._swept_ns: int | None = None

    def changes(self, conn: sqlite3.Connection) -> IndexChanges:
        """What the index lacks: watched sessions and changed folders stat'ed, or every log.

        Raises:
            sqlite3.Error: the index database failed.
        """
        if conn.execute("SELECT count(*) FROM sqlite_master WHERE name IN ('jsonl_folders', "
                        "'jsonl_sweep')").fetchone()[0] != len(_SCHEMA):
            for statement in _SCHEMA:
                conn.execute(statement)
        now = time.time_ns()
        watched, readable = self._read_journal()
        stored = dict(conn.execute("SELECT name, signature FROM jsonl_folders").fetchall())
        self._stored = stored
        swept = conn.execute("SELECT at_ns FROM jsonl_sweep").fetchone()
        folders = self._folder_signatures(now)
        self._folders = folders
        if not readable or swept is None or now - int(swept[0]) > FULL_SWEEP_S * 1e9:
            self._swept_ns = now
            known = _known(conn)
            return compare(jsonl_signatures(self._root), known)
        self._swept_ns = None
        listed: dict[str, str] | None = None  # session id -> folder, when any folder changed
        if folders != stored:
            listed = self._session_folders()
        found: dict[str, str] = {}
        for sid in watched:
            folder = (listed or {}).get(sid) or self._folder_of(sid)
            sig = None if folder is None else _log_signature(folder)
            if sig is not None:
                found[sid] = sig
        if listed is None:
            rows = {sid: _known_one(conn, sid) for sid in found}
            known = {sid: row for sid, row in rows.items() if row is not None}
            gone = tuple(sid for sid in watched if sid not in found and _known_one(conn, sid))
            changes = compare(found, known)
            return IndexChanges(sessions=_indexed_count(conn) + sum(
                1 for sid in found if sid not in known and sid != STORE_LOG_ID),
                changed=changes.changed, gone=gone,
                store_log=self._folder_of(STORE_LOG_ID) is not None)
        known = _known(conn)
        for sid, folder in listed.items():
            if sid not in known and sid not in found:
                sig = _log_signature(folder)
                if sig is not None:
                    found[sid] = sig
        present = {sid for sid in listed if (sid in found or sid in known)
                   and sid != STORE_LOG_ID}
        changed = compare(found, known).changed
        gone = tuple(sid for sid in known if sid not in listed or
                     (sid in watched and sid not in found))
        return IndexChanges(sessions=len(present - set(gone)), changed=changed, gone=gone,
                            store_log=STORE_LOG_ID in listed)

    def settle(self, conn: sqlite3.Connection, unreadable: Sequence[str]) -> None:
        """Record what the index was brought up to date with; drop journal lines done with.

        Called after every change :meth:`changes` returned was applied, but for the sessions
        ``unreadable`` (left out): their journal lines are kept, and the folder signatures are
        not recorded (so the next search looks for them again). Raises ``sqlite3.Error``; a
        journal that cannot be rewritten now is left for the next search.
        """
        if unreadable:
            self._folders = self._stored
            self._swept_ns = None
        if self._folders != self._stored or self._swept_ns is not None:
            self._record(conn)
        if self._journal is not None:
            inode, size, data, last, keep = self._journal
            kept = b"".join(line for sid, line in last.items() if sid in keep or sid in unreadable)
            try:
                if kept != data:
                    self._rewrite_journal(inode, size, kept)
            except OSError as exc:
                log.info("search journal %s not rewritten: %r", self._root / JOURNAL_NAME, exc)

    def _record(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM jsonl_folders")
            conn.executemany("INSERT INTO jsonl_folders (name, signature) VALUES (?, ?)",
                             self._folders.items())
            if self._swept_ns is not None:
                conn.execute("INSERT OR REPLACE INTO jsonl_sweep (singleton, at_ns) "
                             "VALUES (1, ?)", (self._swept_ns,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    # -- the journal ------------------------------------------------------------------------

    def _read_journal(self) -> tuple[set[str], bool]:
        """The watched sessions, and False when a line could not be read (then: a full sweep).

        A watched session whose writer is a dead process of this host is returned (its log is
        stat'ed now, after the death) but not kept for the journal's rewrite.
        """
        path = self._root / JOURNAL_NAME
        self._journal = None
        try:
            with open(path, "rb") as file:
                inode = os.fstat(file.fileno()).st_ino
                data = file.read()
        except FileNotFoundError:
            return set(), True
        last: dict[str, bytes] = {}
        keep: set[str] = set()
        watched: set[str] = set()
        readable = True
        lines = data.split(b"\n")
        if lines[-1]:
            readable = False  # a line cut short: its writer died before changing a log
        for line in lines[:-1]:
            try:
                record = json.loads(line)
            except ValueError:
                readable = False
                continue
            sid = record.get("w", record.get("c")) if isinstance(record, dict) else None
            if not isinstance(sid, str):
                readable = False
                continue
            last.pop(sid, None)
            last[sid] = line + b"\n"
            if "w" in record:
                watched.add(sid)
            else:
                watched.discard(sid)
            if "w" in record and _alive(record.get("pid"), record.get("host")):
                keep.add(sid)
            else:
                keep.discard(sid)
        self._journal = (inode, len(data), data, last, keep)
        return watched, readable

    def _rewrite_journal(self, inode: int, size: int, kept: bytes) -> None:
        """Replace the journal by ``kept`` unless a writer appended since it was read."""
        path = self._root / JOURNAL_NAME
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # a writer is appending: the next search rewrites it
            st = os.fstat(fd)
            if st.st_ino != inode or st.st_size != size:
                return
            tmp = path.with_name(f"{JOURNAL_NAME}.{os.getpid()}.tmp")
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(out, kept)
                os.fsync(out)
            finally:
                os.close(out)
            os.replace(tmp, path)
            fsync_folder(self._root)
        finally:
            os.close(fd)

    # -- the folders ------------------------------------------------------------------------

    def _folder_signatures(self, now_ns: int) -> dict[str, str]:
        """``project folder name -> its signature``.

        The root's own signature changes with every search (its files live there): its
        project folders are compared by name instead.
        """
        out: dict[str, str] = {}
        try:
            with os.scandir(self._root) as it:
                projects = [e for e in it if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return out
        for entry in projects:
            with contextlib.suppress(FileNotFoundError):
                out[entry.name] = _folder_signature(os.stat(entry.path), now_ns)
        return out

    def _session_folders(self) -> dict[str, str]:
        """``session id -> its folder`` for every session folder (no log is stat'ed)."""
        out: dict[str, str] = {}
        for name in self._folders:
            with contextlib.suppress(FileNotFoundError), \
                    os.scandir(self._root / name) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        out[decode_segment(entry.name)] = entry.path
        return out

    def _folder_of(self, session_id: str) -> str | None:
        from dsh.persistence.jsonl._format import encode_segment

        segment = encode_segment(session_id)
        for name in self._folders:
            if os.path.isdir(self._root / name / segment):
                return str(self._root / name / segment)
        return None


def _known(conn: sqlite3.Connection) -> dict[str, tuple[str, int]]:
    return {str(sid): (str(sig), int(count)) for sid, sig, count in
            conn.execute("SELECT session_id, signature, events FROM indexed")}


def _known_one(conn: sqlite3.Connection, session_id: str) -> tuple[str, int] | None:
    row = conn.execute("SELECT signature, events FROM indexed WHERE session_id = ?",
                       (session_id,)).fetchone()
    return None if row is None else (str(row[0]), int(row[1]))


def _indexed_count(conn: sqlite3.Connection) -> int:
    """Sessions indexed, the store log left out (a writer's flush may have added it)."""
    return int(conn.execute("SELECT count(*) FROM indexed WHERE session_id <> ?",
                            (STORE_LOG_ID,)).fetchone()[0])

"""SQLite backend: dsh's schema-17 file, exclusive writers, stale-tail checks, packing, torn tails.

Tests are named after the lines of docs/formats.md#sqlite (SQLite) and
docs/stores.md#the-backend-contract (shared contract) that apply to a handle-based backend, plus
docs/stores.md#the-backend-contract (a write handle is exclusive across threads and processes). Real
files, real sqlite3, real subprocesses.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh._errors import (
    ConfigError,
    EventRejectedError,
    InvalidJsonError,
    LogCorruptError,
    PersistenceError,
    SessionBusyError,
    SessionExistsError,
    SessionFormatUnsupportedError,
    SessionNotFoundError,
)
from dsh.json import FrozenDict, snapshot_json
from dsh.persistence import Persistence, open_backend
from dsh.persistence._contract import Backend, ColdRead, Handle
from dsh.persistence.sqlite import _schema as schema
from dsh.persistence.sqlite._backend import SqliteBackend, lock_file_name
from dsh.persistence.sqlite._schema import (
    APPLICATION_ID,
    MAX_PACKED_DATA_BYTES,
    SCHEMA_17_DDL,
    RowError,
    canonical_schema_objects,
    decode_source_event_seqs,
    encode_source_event_seqs,
    normalize_sql,
    schema_objects,
)
from dsh.session._events import Event, make_event

EXAMPLES = int(os.environ.get("DSH_HYPOTHESIS_EXAMPLES", "25"))
T0 = 1_796_030_745_501
SRC = str(Path(__file__).resolve().parents[2] / "src")


# --- helpers --------------------------------------------------------------------------------

def ev(type_: str, seq: int, data: Any, *, time: int = T0, surface_op: Any = None,
       sources: list[int] | None = None, ignorable: bool = False) -> Event:
    event = make_event(type_, seq, time, snapshot_json(data),
                       surface_op=None if surface_op is None else snapshot_json(surface_op),
                       source_event_seqs=None if sources is None else snapshot_json(sources))
    if ignorable:
        event = Event({**event, "ignorable": True})
    return event


def user(seq: int, text: str = "hello") -> Event:
    return ev("user/message", seq, {"content": [{"type": "text", "text": text}],
                                    "source": {"kind": "user"}, "role": "user",
                                    "id": f"u-{seq}"}, surface_op="append")


def prefix() -> list[Event]:
    """turn/start, step/start, user/message: three scalar rows."""
    return [ev("turn/start", 0, {"turn": 1}), ev("step/start", 1, {"turn": 1, "step": 1}),
            user(2)]


def chunk(seq: int, chunk_data: dict[str, Any], *, time: int = T0) -> Event:
    return ev("assistant/chunk", seq, {"turn": 1, "step": 1, "chunk": chunk_data}, time=time)


def delta(seq: int, text: str = "tok ", *, kind: str = "text-delta", index: int = 0,
          time: int = T0) -> Event:
    return chunk(seq, {"type": kind, "index": index, "text": text}, time=time)


def tool_delta(seq: int, args: str, *, call_id: str = "call_1", name: str | None = None) -> Event:
    data: dict[str, Any] = {"type": "tool-call-delta", "index": 1, "id": call_id}
    if name is not None:
        data["name"] = name
    data["argumentsDelta"] = args
    return chunk(seq, data)


def closing(seq: int) -> list[Event]:
    return [ev("step/end", seq, {"turn": 1, "step": 1}),
            ev("turn/end", seq + 1, {"turn": 1, "reason": {"kind": "completed"}})]


def db_path(tmp_path: Path) -> Path:
    folder = tmp_path / "db"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder / "sessions.db"


def backend_with(tmp_path: Path, sid: str = "s1", events: list[Event] | None = None,
                 **options: Any) -> SqliteBackend:
    backend = SqliteBackend(db_path(tmp_path), **options)
    backend.create({"version": 0, "id": sid, "createdAt": T0, "cwd": "/workspace/demo-app"})
    if events:
        with backend.open(sid, "write") as handle:
            handle.append(events)
    return backend


def raw(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def rows_of(path: Path, sid: str = "s1") -> list[tuple[Any, ...]]:
    conn = raw(path)
    try:
        return conn.execute(
            "SELECT rowid, seq, type, ignorable FROM events WHERE session_id = ? ORDER BY seq",
            (sid,)).fetchall()
    finally:
        conn.close()


def read_all(backend: SqliteBackend, sid: str = "s1", offset: int = 0) -> ColdRead:
    with backend.open(sid) as handle:
        return handle.read(offset)


def insert_row(path: Path, seq: int, type_: str, data: Any, *, sources: Any = None,
               surface_op: Any = None, ignorable: Any = None, time: Any = T0,
               sid: str = "s1") -> None:
    conn = raw(path)
    try:
        conn.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                     (sid, seq, type_, time, data, sources, surface_op, ignorable))
    finally:
        conn.close()


# --- protocol and schema ------------------------------------------------------------------

def test_sqlite_backend_and_handle_implement_the_persistence_protocols(tmp_path: Path) -> None:
    """SqliteBackend is a Backend and its handles are Handles.

    Rule: docs/stores.md#the-backend-contract.
    """
    backend = backend_with(tmp_path)
    try:
        assert isinstance(backend, Backend)
        with backend.open("s1") as handle:
            assert isinstance(handle, Handle)
            assert (handle.session_id, handle.mode) == ("s1", "read")
        assert backend.url == f"sqlite://{db_path(tmp_path)}"
    finally:
        backend.close()


def test_sqlite_uses_the_shared_persistence_application_identity(tmp_path: Path) -> None:
    """The file carries the shared persistence application identity (docs/formats.md#schema-17).

    A file we create has application_id 0x44534850, user_version 17, synchronous FULL-ready
    WAL, a UUID store id, passes integrity_check, and holds exactly dsh's schema objects.
    """
    backend = backend_with(tmp_path, events=prefix())
    backend.close()
    conn = raw(db_path(tmp_path))
    try:
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID == 1146308688
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 17
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert schema.is_uuid(conn.execute("SELECT store_id FROM persistence_state").fetchone()[0])
        objects = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").fetchall()
    finally:
        conn.close()
    ours = [(t, n, tb, normalize_sql(s)) for t, n, tb, s in objects
            if not n.startswith("sqlite_")]
    assert ours == [("table", "events", "events", normalize_sql(SCHEMA_17_DDL[2])),
                    ("table", "persistence_state", "persistence_state",
                     normalize_sql(SCHEMA_17_DDL[0])),
                    ("table", "sessions", "sessions", normalize_sql(SCHEMA_17_DDL[1]))]
    assert sorted(n for _, n, _, _ in objects if n.startswith("sqlite_")) == [
        "sqlite_autoindex_events_1", "sqlite_autoindex_sessions_1"]
    assert oct(os.stat(db_path(tmp_path)).st_mode & 0o777) == "0o600"


def test_sqlite_keeps_a_fresh_database_unopened_until_the_first_persistence_operation(
        tmp_path: Path) -> None:
    """Construction validates the path and creates an empty 0600 file only.

    Rule: docs/formats.md#sqlite (lazy open).
    """
    path = db_path(tmp_path)
    backend = SqliteBackend(path)
    assert path.stat().st_size == 0
    assert not Path(f"{path}-wal").exists()
    assert list(backend.list_headers()) == []
    assert path.stat().st_size > 0
    backend.close()


def test_sqlite_accepts_every_configured_journal_mode(tmp_path: Path) -> None:
    """Wal, delete, truncate, persist.

    Rule: docs/formats.md#sqlite (accepts every configured journal mode).
    """
    for mode in ("wal", "delete", "truncate", "persist"):
        sub = tmp_path / mode
        sub.mkdir(mode=0o700)
        backend = SqliteBackend(db_path(sub), journal_mode=mode)  # type: ignore[arg-type]
        backend.create({"version": 0, "id": "s1", "createdAt": T0})
        with backend.open("s1", "write") as handle:
            handle.append(prefix())
            # truncate/persist/delete are per-connection modes, so ask the handle's connection.
            found = handle._c.conn.execute("PRAGMA journal_mode").fetchone()[0]
            assert found == mode
            assert Path(f"{db_path(sub)}-wal").exists() == (mode == "wal")
        backend.close()
        assert len(read_all(SqliteBackend(db_path(sub), journal_mode=mode)).events) == 3  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="journal_mode"):
        SqliteBackend(db_path(tmp_path), journal_mode="memory")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=":memory:"):
        SqliteBackend(":memory:")


def _hold_shared_lock(path: Path, seconds: float, ready: threading.Event) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    conn.execute("SELECT count(*) FROM sessions").fetchone()
    ready.set()
    time.sleep(seconds)
    conn.execute("COMMIT")
    conn.close()


def test_sqlite_retries_a_busy_journal_mode_transition_within_its_retry_budget(
        tmp_path: Path) -> None:
    """A busy journal-mode switch is retried until SQLITE_BUSY clears (docs/formats.md#sqlite)."""
    SqliteBackend(db_path(tmp_path), journal_mode="delete").schema_version  # noqa: B018
    ready = threading.Event()
    holder = threading.Thread(target=_hold_shared_lock, args=(db_path(tmp_path), 0.15, ready))
    holder.start()
    ready.wait()
    backend = SqliteBackend(db_path(tmp_path), journal_mode="wal", busy_timeout_ms=3000)
    try:
        assert backend.schema_version == 17
    finally:
        holder.join()
        backend.close()


def test_sqlite_does_not_retry_journal_failures_outside_the_available_busy_budget(
        tmp_path: Path) -> None:
    """With no budget left the busy journal switch fails as DATABASE_BUSY.

    Rule: docs/formats.md#sqlite.
    """
    SqliteBackend(db_path(tmp_path), journal_mode="delete").schema_version  # noqa: B018
    ready = threading.Event()
    holder = threading.Thread(target=_hold_shared_lock, args=(db_path(tmp_path), 0.5, ready))
    holder.start()
    ready.wait()
    backend = SqliteBackend(db_path(tmp_path), journal_mode="wal", busy_timeout_ms=0)
    try:
        with pytest.raises(PersistenceError) as info:
            backend.schema_version  # noqa: B018
        assert info.value.code == "DATABASE_BUSY"
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    finally:
        holder.join()
        backend.close()


def test_sqlite_rejects_an_older_sqlite_physical_schema(tmp_path: Path) -> None:
    """An older physical schema is refused: user_version 16 is incompatible.

    Rule: docs/formats.md#sqlite.
    """
    backend_with(tmp_path).close()
    conn = raw(db_path(tmp_path))
    conn.execute("PRAGMA user_version = 16")
    conn.close()
    with pytest.raises(SessionFormatUnsupportedError,
                       match=r"schema version 16, incompatible.*no upgrade path"):
        SqliteBackend(db_path(tmp_path)).exists("s1")


def test_sqlite_refuses_a_newer_schema_and_says_to_upgrade(tmp_path: Path) -> None:
    """A newer schema is not damage; the message says upgrade dsh.

    Rule: docs/formats.md#files-and-connections, docs/formats.md#the-session-header.
    """
    backend_with(tmp_path).close()
    conn = raw(db_path(tmp_path))
    conn.execute("PRAGMA user_version = 18")
    conn.close()
    with pytest.raises(SessionFormatUnsupportedError, match="upgrade dsh") as info:
        SqliteBackend(db_path(tmp_path)).exists("s1")
    assert info.value.where["version"] == 18


def test_sqlite_rejects_unversioned_incompatible_and_foreign_application_databases(
        tmp_path: Path) -> None:
    """The three open-time identity checks of docs/formats.md#files-and-connections.

    Rule: docs/formats.md#sqlite, docs/formats.md#files-and-connections.
    """
    unversioned = tmp_path / "a"
    unversioned.mkdir(mode=0o700)
    conn = raw(db_path(unversioned))
    conn.execute("CREATE TABLE notes (x TEXT)")
    conn.close()
    os.chmod(db_path(unversioned), 0o600)
    with pytest.raises(PersistenceError, match="unversioned schema or application identity"):
        SqliteBackend(db_path(unversioned)).exists("s1")

    foreign = tmp_path / "b"
    foreign.mkdir(mode=0o700)
    backend_with(foreign).close()
    conn = raw(db_path(foreign))
    conn.execute("PRAGMA application_id = 7")
    conn.close()
    with pytest.raises(PersistenceError, match="has application id 7, expected 1146308688"):
        SqliteBackend(db_path(foreign)).exists("s1")

    incompatible = tmp_path / "c"
    incompatible.mkdir(mode=0o700)
    backend_with(incompatible).close()
    conn = raw(db_path(incompatible))
    conn.execute("PRAGMA user_version = 3")
    conn.close()
    with pytest.raises(SessionFormatUnsupportedError, match="schema version 3"):
        SqliteBackend(db_path(incompatible)).exists("s1")


@pytest.mark.parametrize("change", [
    "CREATE INDEX events_type ON events(type)",
    "CREATE TABLE dsh_locks (id TEXT) STRICT",
    "CREATE VIEW v AS SELECT id FROM sessions",
    "ALTER TABLE sessions ADD COLUMN extra TEXT",
])
def test_sqlite_rejects_changed_columns_and_non_strict_owned_tables(
        tmp_path: Path, change: str) -> None:
    """Any extra object or changed column is not dsh's schema.

    Rule: docs/formats.md#sqlite, docs/formats.md#schema-17.
    """
    backend_with(tmp_path).close()
    conn = raw(db_path(tmp_path))
    conn.execute(change)
    conn.close()
    with pytest.raises(PersistenceError, match="does not contain the required schema objects"):
        SqliteBackend(db_path(tmp_path)).exists("s1")


def test_sqlite_rejects_a_non_strict_events_table(tmp_path: Path) -> None:
    """docs/formats.md#schema-17: the same columns without STRICT are refused."""
    path = db_path(tmp_path)
    conn = raw(path)
    for statement in SCHEMA_17_DDL:
        conn.execute(statement.replace(") STRICT", ")") if "events" in statement.split("(")[0]
                     else statement)
    conn.execute("INSERT INTO persistence_state VALUES (1, '6f1c1b5e-1d2a-4c3b-9a8b-0c1d2e3f4a5b')")
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 17")
    conn.close()
    os.chmod(path, 0o600)
    with pytest.raises(PersistenceError, match="required schema objects"):
        SqliteBackend(path).exists("s1")


@pytest.mark.parametrize(("change", "message"), [
    ("PRAGMA application_id = 9", "application id changed before mutation"),
    ("PRAGMA user_version = 14", "schema changed before mutation"),
    ("CREATE INDEX sneaky ON events(time)", "required schema objects"),
])
def test_sqlite_rejects_schema_ownership_changes_observed_at_mutation_time(
        tmp_path: Path, change: str, message: str) -> None:
    """App id, version and schema are re-checked inside BEGIN IMMEDIATE.

    Rule: docs/formats.md#sqlite, docs/formats.md#schema-17.
    """
    backend = backend_with(tmp_path)
    with backend.open("s1", "write") as handle:
        handle.append(prefix()[:1])
        conn = raw(db_path(tmp_path))
        conn.execute(change)
        conn.close()
        with pytest.raises(PersistenceError, match=message) as info:
            handle.append(prefix()[1:])
        assert info.value.code == "SCHEMA_MISMATCH"
    assert [r[1] for r in rows_of(db_path(tmp_path))] == [0]
    backend.close()


def test_sqlite_rejects_missing_and_empty_store_identities(tmp_path: Path) -> None:
    """Persistence_state must hold a UUID store id.

    Rule: docs/formats.md#sqlite, docs/formats.md#files-and-connections.
    """
    backend_with(tmp_path).close()
    conn = raw(db_path(tmp_path))
    conn.execute("UPDATE persistence_state SET store_id = ''")
    conn.close()
    with pytest.raises(PersistenceError, match="no valid store identity"):
        SqliteBackend(db_path(tmp_path)).exists("s1")
    conn = raw(db_path(tmp_path))
    conn.execute("DELETE FROM persistence_state")
    conn.close()
    with pytest.raises(PersistenceError, match="no valid store identity"):
        SqliteBackend(db_path(tmp_path)).exists("s1")


def test_sqlite_rejects_invalid_paths_during_service_initialization(tmp_path: Path) -> None:
    """Parent must be ours and not group/world writable; file must be private.

    Rule: docs/formats.md#sqlite, docs/formats.md#file-modes-and-symlinks.
    """
    open_dir = tmp_path / "shared"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(ConfigError, match="must not be group or world writable"):
        SqliteBackend(open_dir / "s.db")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "s.db").touch()
    os.chmod(private / "s.db", 0o644)
    with pytest.raises(ConfigError, match=r"no group or other permissions.*fix it with 'chmod 6"):
        SqliteBackend(private / "s.db")
    with pytest.raises(ConfigError, match="busy_timeout_ms"):
        SqliteBackend(private / "t.db", busy_timeout_ms=-1)


def test_sqlite_rejects_non_files_and_symbolic_links(tmp_path: Path) -> None:
    """A directory or a symlink at the database path is refused.

    Rule: docs/formats.md#sqlite, docs/formats.md#file-modes-and-symlinks.
    """
    folder = tmp_path / "db"
    folder.mkdir(mode=0o700)
    (folder / "dir.db").mkdir()
    with pytest.raises(ConfigError, match="regular file"):
        SqliteBackend(folder / "dir.db")
    (folder / "real.db").touch(mode=0o600)
    (folder / "link.db").symlink_to(folder / "real.db")
    with pytest.raises(ConfigError, match="regular file"):
        SqliteBackend(folder / "link.db")


# --- header and metadata --------------------------------------------------------------------

def test_sqlite_validates_creation_time_and_restores_every_optional_header_field(
        tmp_path: Path) -> None:
    """docs/formats.md#sqlite: every header column round-trips; an invalid createdAt is refused.

    Rule: docs/formats.md#the-session-header, docs/formats.md#schema-17.
    """
    backend = SqliteBackend(db_path(tmp_path))
    full = {"version": 0, "id": "child", "createdAt": T0, "cwd": "/w", "parentSession": "p",
            "seedLength": 135, "origin": "subagent", "delegationDepth": 2, "agentPreset": "coder"}
    backend.create(full)
    backend.create({"version": 0, "id": "bare", "createdAt": 0, "extra": "not stored"})
    assert read_all(backend, "child").header == full
    assert dict(read_all(backend, "bare").header) == {"version": 0, "id": "bare",
                                                      "createdAt": 0}
    for bad in (-1, 1.5, 2**53, "1", None):
        with pytest.raises(EventRejectedError, match="createdAt") as info:
            backend.create({"version": 0, "id": "x", "createdAt": bad})
        assert info.value.code == "HEADER"
    for field, value in (("cwd", "relative/dir"), ("origin", "parent"), ("seedLength", -1),
                         ("version", 1.5), ("id", "")):
        with pytest.raises(EventRejectedError, match=field):
            backend.create({"version": 0, "id": "y", "createdAt": T0, field: value})
    assert not backend.exists("x") and not backend.exists("y")
    backend.close()


def test_sqlite_create_refuses_an_existing_id_and_open_refuses_a_missing_one(
        tmp_path: Path) -> None:
    """Create rejects a duplicate id; open of an unknown id is SessionNotFoundError.

    Rule: docs/stores.md#the-backend-contract.
    """
    backend = backend_with(tmp_path)
    with pytest.raises(SessionExistsError, match="'s1' already exists"):
        backend.create({"version": 0, "id": "s1", "createdAt": T0})
    with pytest.raises(SessionNotFoundError, match="'nope' is not stored"):
        backend.open("nope")
    with pytest.raises(SessionNotFoundError):
        backend.open("nope", "write")
    # A refused write open releases the lock it took first.
    with backend.open("s1", "write"):
        pass
    backend.close()


def _no_read(session_id: str) -> tuple[FrozenDict, tuple[Event, ...]]:
    raise AssertionError(f"{session_id} was read in full")


@pytest.mark.parametrize("with_events", [False, True])
@pytest.mark.parametrize(("column", "value"), [
    ("cwd", "relative"), ("cwd", ""), ("origin", "parent"), ("incarnation", "not-a-uuid"),
    ("incarnation", "0f0e0d0c-0b0a-4908-8706-05040302010g"), ("seed_length", -1),
    ("delegation_depth", -2), ("revision", -1), ("revision", 2**53), ("created_at", -5),
    ("version", -(2**53)), ("id", ""),
])
def test_sqlite_rejects_invalid_durable_metadata_before_exposing_a_session_header(
        tmp_path: Path, column: str, value: Any, with_events: bool) -> None:
    """An invalid sessions row is corruption on open, read and every listing (retention's
    ``list_activity`` too, whose check runs in SQL), with or without events.

    Rule: docs/formats.md#sqlite, docs/formats.md#schema-17.
    """
    backend_with(tmp_path, events=prefix() if with_events else None).close()
    conn = raw(db_path(tmp_path))
    conn.execute("PRAGMA foreign_keys = OFF")
    if column == "id":
        conn.execute("UPDATE events SET session_id = ''")
    conn.execute(f"UPDATE sessions SET {column} = ?", (value,))
    conn.close()
    backend = SqliteBackend(db_path(tmp_path))
    if column != "id":
        with pytest.raises(LogCorruptError, match=f"column {column}"):
            backend.open("s1")
    with pytest.raises(LogCorruptError, match="invalid durable metadata"):
        list(backend.list_headers())
    with pytest.raises(LogCorruptError, match=f"column {column}"):
        backend.list_activity(_no_read)
    with pytest.raises(LogCorruptError, match=f"column {column}"):
        backend.list_entries(_no_read)
    backend.close()


def test_a_handle_decodes_again_a_session_row_changed_between_its_reads(tmp_path: Path) -> None:
    """A handle reuses its last decode of the sessions row only for equal values of equal
    types (2d13047): a row changed between two reads of one handle is checked again, so an
    invalid column is corruption at the second read, and a valid change is read as stored.

    Rule: docs/formats.md#schema-17.
    """
    backend_with(tmp_path, events=prefix()).close()
    backend = SqliteBackend(db_path(tmp_path))
    with backend.open("s1") as handle:
        assert handle.read().header["cwd"] == "/workspace/demo-app"
        conn = raw(db_path(tmp_path))
        conn.execute("UPDATE sessions SET cwd = '/elsewhere'")
        assert handle.read().header["cwd"] == "/elsewhere"
        conn.execute("UPDATE sessions SET cwd = 'relative'")
        conn.close()
        with pytest.raises(LogCorruptError, match="column cwd"):
            handle.read()
    backend.close()


def _refused_in_a_fresh_process(db: Path) -> list[str]:
    """How a read of session ``s1`` in another process is refused: ``code path``, message."""
    child = subprocess.run(
        [sys.executable, "-c",
         "import sys\nfrom dsh._errors import DshError\n"
         "from dsh.persistence.sqlite._backend import SqliteBackend\n"
         "try:\n    SqliteBackend(sys.argv[1]).open('s1').read()\n"
         "except DshError as e:\n    print(e.code, e.where.get('path'))\n"
         "    print(e.message)\n",
         str(db)], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    return child.stdout.splitlines()


@pytest.mark.parametrize("suffix", [".meta", ".seal"])
def test_a_fifo_at_a_sidecar_is_refused_not_waited_on(tmp_path: Path, suffix: str) -> None:
    """A FIFO where the header metadata or the seal belongs is refused by a read (a typed
    error naming the file), never opened for a blocking read: before, a FIFO at ``.meta``
    hung every open of the session for good (the read waits for a writer). A fresh process
    reads, so that a hang is a failure of this test, not of the suite.

    Rule: docs/formats.md#file-modes-and-symlinks.
    """
    backend_with(tmp_path, events=prefix()).close()
    (sidecar,) = db_path(tmp_path).with_name("sessions.db.dsh-seals").glob("*.seal")
    sidecar = sidecar.with_suffix(suffix)
    sidecar.unlink(missing_ok=True)
    os.mkfifo(sidecar, 0o600)
    code, path = _refused_in_a_fresh_process(db_path(tmp_path))[0].split()
    assert code == ("NOT_A_FILE" if suffix == ".meta" else "SEAL_UNREADABLE")
    assert path == str(sidecar)


def test_a_folder_or_fifo_at_the_header_metadata_is_not_a_file(tmp_path: Path) -> None:
    """A folder or a FIFO where a session's ``.meta`` belongs is ``NOT_A_FILE`` naming the
    path and what sits there, as a JSONL log is; before, ``SQLITE`` (``[Errno 22] not a
    regular file``), as if the database had failed. A fresh process reads (a hang fails this
    test, not the suite).

    Rule: docs/formats.md#file-modes-and-symlinks.
    """
    backend = SqliteBackend(db_path(tmp_path))
    backend.create({"version": 0, "id": "s1", "createdAt": T0, "metadata": {"team": "infra"}})
    backend.close()
    (meta,) = db_path(tmp_path).with_name("sessions.db.dsh-seals").glob("*.meta")
    for kind in ("FIFO", "folder"):
        meta.unlink()  # the file a create wrote, then the FIFO
        os.mkfifo(meta, 0o600) if kind == "FIFO" else meta.mkdir()
        named, message = _refused_in_a_fresh_process(db_path(tmp_path))
        assert named == f"NOT_A_FILE {meta}"
        assert message.startswith(f"{meta} is a {kind}") and "header metadata" in message


def test_header_metadata_nested_too_deep_is_corruption(tmp_path: Path) -> None:
    """A ``.meta`` sidecar of JSON nested past the recursion limit is ``LogCorruptError``
    naming the file, as any other that is not JSON (it was a bare RecursionError).

    Rule: docs/formats.md#file-modes-and-symlinks.
    """
    backend_with(tmp_path, events=prefix()).close()
    (seal,) = db_path(tmp_path).with_name("sessions.db.dsh-seals").glob("*.seal")
    seal.with_suffix(".meta").write_text("[" * 100_000)
    backend = SqliteBackend(db_path(tmp_path))
    with pytest.raises(LogCorruptError, match="is not JSON") as caught:
        backend.open("s1")
    assert caught.value.where["path"] == str(seal.with_suffix(".meta"))
    backend.close()


def test_sqlite_list_activity_gives_the_headers_and_times_of_the_full_listing(
        tmp_path: Path) -> None:
    """``list_activity``'s headers (built unchecked for rows its SQL check vouches for) and last
    times equal ``list_entries``'; a row only the reference accepts (an upper-case UUID before
    a final newline) goes through ``decode_session_row``; a packed last row gives its last
    member's time; a session without events is left out.

    Rule: docs/formats.md#schema-17, docs/forgetting.md#retention.
    """
    backend = backend_with(tmp_path, events=prefix())
    backend.create({"version": 0, "id": "s2", "createdAt": T0 + 1, "cwd": "/w/app",
                    "parentSession": "s1", "seedLength": 3, "origin": "subagent",
                    "delegationDepth": 1, "agentPreset": "review"})
    backend.create({"version": 0, "id": "s3", "createdAt": T0 + 2})
    backend.create({"version": 0, "id": "empty", "createdAt": T0 + 3})
    with backend.open("s2", "write") as handle:
        handle.append(prefix())
    with backend.open("s3", "write") as handle:
        handle.append(prefix() + [delta(3 + i, time=T0 + 10 + i) for i in range(5)])
    backend.close()
    conn = raw(db_path(tmp_path))
    assert conn.execute("SELECT max(ignorable = 0) FROM events WHERE session_id = 's3'"
                        ).fetchone() == (1,)  # the last row is packed
    conn.execute("UPDATE sessions SET incarnation = upper(incarnation) || char(10) "
                 "WHERE id = 's2'")
    conn.close()
    backend = SqliteBackend(db_path(tmp_path))
    pairs, errors = backend.list_activity(_no_read)
    entries, _ = backend.list_entries(_no_read)
    assert errors == []
    assert [(dict(h), t) for h, t in pairs] == [
        (dict(e.header), e.last_activity_ms) for e in entries]
    assert [(h["id"], t) for h, t in pairs] == [("s1", T0), ("s2", T0), ("s3", T0 + 14)]
    assert dict(pairs[1][0]) == {"version": 0, "id": "s2", "createdAt": T0 + 1,
                                 "cwd": "/w/app", "parentSession": "s1", "seedLength": 3,
                                 "origin": "subagent", "delegationDepth": 1,
                                 "agentPreset": "review"}
    backend.close()


def test_sqlite_refuses_a_session_header_from_a_newer_format_version(tmp_path: Path) -> None:
    """Header version 1 is SessionFormatUnsupportedError saying to upgrade.

    Rule: docs/formats.md#the-session-header.
    """
    backend_with(tmp_path, events=prefix()).close()
    conn = raw(db_path(tmp_path))
    conn.execute("UPDATE sessions SET version = 1")
    conn.close()
    backend = SqliteBackend(db_path(tmp_path))
    with backend.open("s1") as handle, pytest.raises(SessionFormatUnsupportedError,
                                                     match=r"newer harness \(v1.*upgrade dsh"):
        handle.read()
    backend.close()


# --- append, read, revisions ---------------------------------------------------------------

def test_sqlite_appends_durably_and_reads_back_equal_events(tmp_path: Path) -> None:
    """Append then read returns the same events; revision moves per append.

    Rule: docs/stores.md#the-backend-contract (contract).
    """
    message = {"role": "assistant", "content": [], "id": "a",
               "source": {"kind": "model", "provider": "p", "model": "m"}}
    events = [*prefix(),
              ev("assistant/message", 3, {"turn": 1, "step": 1, "message": message},
                 surface_op="append", sources=[]),
              *closing(4)]
    backend = backend_with(tmp_path)
    with backend.open("s1", "write") as handle:
        before = handle.read()
        handle.append(events[:3])
        handle.flush()
        middle = handle.read()
        handle.append(events[3:])
        after = handle.read()
    assert before.events == () and before.torn is None
    assert list(after.events) == events
    assert after.events[3]["sourceEventSeqs"] == []
    assert len({before.revision, middle.revision, after.revision}) == 3
    assert read_all(backend).revision == after.revision
    backend.close()


def test_sqlite_keeps_empty_mutations_inert(tmp_path: Path) -> None:
    """An empty append writes nothing, revision unchanged.

    Rule: docs/formats.md#sqlite (keeps empty mutations inert).
    """
    backend = backend_with(tmp_path, events=prefix())
    before = read_all(backend).revision
    with backend.open("s1", "write") as handle:
        handle.append([])
        handle.flush()
    assert read_all(backend).revision == before
    backend.close()


def test_sqlite_append_refuses_read_only_closed_and_gapped_batches(tmp_path: Path) -> None:
    """Append is contiguous and needs a write handle; a closed handle refuses all calls.

    Rule: docs/stores.md#the-backend-contract.
    """
    backend = backend_with(tmp_path, events=prefix())
    with backend.open("s1") as reader:
        with pytest.raises(PersistenceError, match="through a read handle") as info:
            reader.append(closing(3))
        assert info.value.code == "READ_ONLY"
    handle = backend.open("s1", "write")
    with pytest.raises(PersistenceError, match="expected seq 4 at batch index 1, got 5") as gap:
        handle.append([ev("step/end", 3, {"turn": 1, "step": 1}),
                       ev("turn/end", 5, {"turn": 1, "reason": {"kind": "completed"}})])
    assert gap.value.code == "SEQ_MISMATCH"
    with pytest.raises(InvalidJsonError, match="losslessly JSON-serializable") as bad:
        handle.append([{**closing(3)[0], "data": {"v": float("nan")}}])  # type: ignore[list-item]
    assert bad.value.where["json_path"] == "$[0].data.v"
    with pytest.raises(EventRejectedError, match="not part of the envelope"):
        handle.append([Event({**closing(3)[0], "extra": 1})])
    handle.close()
    handle.close()
    for call in (handle.read, handle.flush, lambda: handle.append(closing(3))):
        with pytest.raises(PersistenceError, match="closed"):
            call()
    assert len(read_all(backend).events) == 3
    backend.close()


def test_sqlite_rejects_a_stale_physical_append_without_replacing_the_winning_tail(
        tmp_path: Path) -> None:
    """The tail is re-derived in BEGIN IMMEDIATE.

    Rule: docs/formats.md#sqlite (rejects a stale physical append).

    The other writer is dsh itself (raw SQL, as another process that knows no lock files).
    """
    backend = backend_with(tmp_path, events=prefix()[:2])
    with backend.open("s1", "write") as handle:
        handle.read()
        conn = raw(db_path(tmp_path))
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO events VALUES ('s1', 2, 'user/message', ?, ?, NULL, "
                     "'\"append\"', NULL)", (T0, json.dumps(dict(user(2)["data"]))))
        conn.execute("UPDATE sessions SET revision = revision + 1")
        conn.execute("COMMIT")
        conn.close()
        with pytest.raises(PersistenceError,
                           match="append starts at seq 2, stored next seq is 3") as info:
            handle.append([user(2, "mine")])
        assert info.value.code == "SEQ_MISMATCH"
        assert info.value.where["seq"] == 2
    winning = read_all(backend)
    assert [e["seq"] for e in winning.events] == [0, 1, 2]
    assert winning.events[2]["data"]["content"][0]["text"] == "hello"
    backend.close()


@pytest.mark.parametrize("change", ["append", "delete-silently"])
def test_sqlite_append_after_our_own_append_still_sees_another_connections_commit(
        tmp_path: Path, change: str) -> None:
    """docs/formats.md#appends-and-reads: our last commit's tail is reused only while ``PRAGMA
    data_version`` says no other connection committed; any other commit (even one that leaves the
    revision alone) sends the next append through the full re-derivation."""
    backend = backend_with(tmp_path, events=prefix()[:2])
    with backend.open("s1", "write") as handle:
        handle.append([user(2, "mine")])  # our commit: the handle knows the tail now
        conn = raw(db_path(tmp_path))
        if change == "append":
            conn.execute("INSERT INTO events VALUES ('s1', 3, 'user/message', ?, ?, NULL, "
                         "'\"append\"', NULL)", (T0, json.dumps(dict(user(3)["data"]))))
            conn.execute("UPDATE sessions SET revision = revision + 1")
        else:
            conn.execute("DELETE FROM events WHERE seq = 2")
        conn.commit()
        conn.close()
        if change == "append":
            with pytest.raises(PersistenceError, match="append starts at seq 3, stored next "
                               "seq is 4") as info:
                handle.append([user(3, "mine")])
            assert info.value.code == "SEQ_MISMATCH"
        else:
            with pytest.raises(LogCorruptError, match="committed rows are missing"):
                handle.append([user(3, "mine")])
    backend.close()


def test_sqlite_revision_is_stable_until_a_change_and_differs_across_stores(
        tmp_path: Path) -> None:
    """Equal while unchanged; new after append; per store.

    Rule: docs/stores.md#opening-a-store (listSnapshots revision).
    """
    one = backend_with(tmp_path, events=prefix())
    first, second = read_all(one).revision, read_all(one).revision
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    two = backend_with(other_dir, events=prefix())
    assert first == second
    assert read_all(two).revision != first
    with one.open("s1", "write") as handle:
        handle.append(closing(3))
    assert read_all(one).revision != first
    one.close()
    two.close()


@pytest.mark.parametrize("schema_version", [14, 17])
def test_sqlite_append_of_a_long_batch_stores_each_row_as_encoded(
        tmp_path: Path, schema_version: int) -> None:
    """A batch of 301 events (multi-row INSERTs of 256, 32, 8, 4 and 1 rows) stores each
    event's row exactly as ``encode_batch`` encodes it, in seq order, and reads back equal.

    Rule: docs/formats.md#appends-and-reads.
    """
    events = [ev("turn/start", 0, {"turn": 1}), ev("step/start", 1, {"turn": 1, "step": 1})]
    events += [user(seq, f"m{seq} \u00e9\"\n") for seq in range(2, 301)]
    url = f"sqlite:{db_path(tmp_path)}?schema={schema_version}"
    backend = open_backend(url)
    backend.create({"version": 0, "id": "s1", "createdAt": T0})
    with backend.open("s1", "write") as handle:
        handle.append(events)
    conn = raw(db_path(tmp_path))
    try:
        stored = conn.execute(
            "SELECT seq, type, time, data, source_event_seqs, surface_op"
            + (", ignorable" if schema_version == 17 else "")
            + " FROM events WHERE session_id = 's1' ORDER BY seq").fetchall()
    finally:
        conn.close()
    expected = [tuple(row[:len(stored[0])])
                for row in schema.encode_batch(events, schema_version)]
    assert stored == expected
    assert list(read_all(backend).events) == events
    backend.close()


@pytest.mark.parametrize(("count", "limit", "statements"), [
    (5, 20, [2, 2, 1]),  # 20 parameters a statement: rows go two by two (2 x 7 + the id)
    (11, None, [11]), (16, None, [16]), (1, None, [1]), (17, None, [16, 1]),
    (40, None, [32, 8]), (300, None, [256, 32, 12])])
def test_sqlite_insert_rows_statements(tmp_path: Path, count: int, limit: int | None,
                                       statements: list[int]) -> None:
    """Rows go in chunks of 256, a rest of up to 16 in one INSERT (a per-turn flush's few
    rows: one execute), a longer rest in powers of two; fewer when the build binds fewer
    parameters.

    Rule: docs/formats.md#appends-and-reads.
    """
    from dsh.persistence.sqlite._backend import _insert_rows

    conn = raw(db_path(tmp_path))
    try:
        for statement in SCHEMA_17_DDL:
            conn.execute(statement)
        conn.execute("INSERT INTO sessions VALUES ('s1', 0, 0, NULL, NULL, NULL, NULL, NULL, "
                     "NULL, 'i', 0)")
        if limit is not None:
            conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, limit)
        rows = schema.encode_batch([user(seq) for seq in range(count)], 17)
        traced: list[str] = []
        conn.set_trace_callback(traced.append)
        _insert_rows(conn, "s1", rows, legacy=False)
        conn.set_trace_callback(None)
        assert [t.count("('s1',") for t in traced] == statements  # expanded SQL
        assert conn.execute("SELECT seq, type, time, data, source_event_seqs, surface_op, "
                            "ignorable FROM events ORDER BY seq").fetchall() == rows
    finally:
        conn.close()


@pytest.mark.parametrize("version", [17, 14])
def test_sqlite_insert_rows_store_each_null_and_value_as_a_plain_bind_does(
        tmp_path: Path, version: int) -> None:
    """NULL stand-ins (NULLIF) store what binding None and the values directly stores.

    Every mix of a NULL or set provenance, surface op and ignorable flag, a compressed data
    column, and a provenance the schema packs as bytes: each row's columns, their SQLite
    types included, equal those of ``executemany`` with the rows as they are.

    Rule: docs/formats.md#appends-and-reads.
    """
    from dsh.persistence.sqlite._backend import _insert_rows

    ddl = SCHEMA_17_DDL if version == 17 else schema.SCHEMA_14_DDL
    events = []
    for seq, (op, sources, ignorable) in enumerate(itertools.product(
            ("append", None), ([0], None), (True, False))):
        data = {"text": "x" * 5000} if seq == 3 else {"n": seq}  # seq 3: zstd data
        events.append(ev("note/custom", seq, data, surface_op=op,
                         sources=None if sources is None else list(range(seq + 1)),
                         ignorable=ignorable and version == 17))
    rows = schema.encode_batch(events, version)
    assert {row[4] is None for row in rows} == {row[5] is None for row in rows} == {True, False}
    stored = []
    for how in ("statements", "executemany"):
        (tmp_path / how).mkdir()
        conn = raw(db_path(tmp_path / how))
        try:
            for statement in ddl:
                conn.execute(statement)
            conn.execute("INSERT INTO sessions VALUES ('s1', 0, 0, NULL, NULL, NULL, NULL, "
                         "NULL, NULL, 'i', 0)")
            if how == "statements":
                _insert_rows(conn, "s1", rows, legacy=version == 14)
            else:
                marks = ", ".join(["?"] * (7 if version == 14 else 8))
                conn.executemany(f"INSERT INTO events VALUES ({marks})",
                                 [("s1", *row) for row in rows] if version == 17
                                 else [("s1", *row[:6]) for row in rows])
            columns = "seq, type, time, data, source_event_seqs, surface_op" + (
                ", ignorable" if version == 17 else "")
            typed = ", ".join(f"typeof({c}), {c}" for c in columns.split(", "))
            stored.append(conn.execute(f"SELECT {typed} FROM events ORDER BY seq").fetchall())
        finally:
            conn.close()
    assert stored[0] == stored[1]
    assert len(stored[0]) == 8
    assert {row[8] for row in stored[0]} == {"null", "blob" if version == 17 else "text"}
    assert {row[10] for row in stored[0]} == {"null", "text"}  # surface_op
    # data: schema 17 stores seq 3 compressed
    assert {row[6] for row in stored[0]} == ({"text", "blob"} if version == 17 else {"text"})
    if version == 17:
        assert {row[12] for row in stored[0]} == {"null", "integer"}  # ignorable


def test_sqlite_round_trips_lone_surrogates_and_hostile_text(tmp_path: Path) -> None:
    """Lone surrogates survive a round trip; the stored text stays valid UTF-8.

    Rule: docs/formats.md#lossless-json.
    """
    text = "a\ud800b\udfffc \u2028 \x00 \"q\" \\ 😀 \U0010ffff"
    big = text * 400  # ≥ 4096 bytes: stored compressed
    events = [user(0, text), user(1, big),
              ev("goal/change", 2, {"k\udc00ey": [text, 1, None, True]})]
    backend = backend_with(tmp_path, events=events)
    back = read_all(backend)
    assert list(back.events) == events
    assert back.events[1]["data"]["content"][0]["text"] == big
    conn = raw(db_path(tmp_path))
    try:
        stored = conn.execute("SELECT typeof(data), CAST(data AS BLOB) FROM events "
                              "WHERE seq = 0").fetchone()
        kinds = [r[0] for r in conn.execute("SELECT typeof(data) FROM events ORDER BY seq")]
    finally:
        conn.close()
    assert stored[0] == "text"
    stored[1].decode("utf-8")  # strict: valid UTF-8
    assert b"\\ud800" in stored[1] and b"\\udfff" in stored[1]
    assert kinds == ["text", "blob", "text"]
    backend.close()


# --- exclusive writers ----------------------------------------------------------------------

def test_sqlite_second_write_handle_in_another_thread_gets_session_busy(tmp_path: Path) -> None:
    """Two threads race for the write handle; one wins, one gets SessionBusyError.

    Rule: docs/stores.md#the-backend-contract.
    """
    backend = backend_with(tmp_path, events=prefix())
    barrier = threading.Barrier(2)
    outcomes: list[Any] = []
    lock = threading.Lock()

    def contender() -> None:
        barrier.wait()
        try:
            handle = backend.open("s1", "write")
        except SessionBusyError as exc:
            with lock:
                outcomes.append(exc)
            return
        with lock:
            outcomes.append(handle)

    threads = [threading.Thread(target=contender) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [o for o in outcomes if not isinstance(o, SessionBusyError)]
    losers = [o for o in outcomes if isinstance(o, SessionBusyError)]
    assert len(winners) == 1 and len(losers) == 1
    busy = losers[0]
    assert busy.code == "SESSION_BUSY"
    assert busy.where["pid"] == os.getpid()
    assert busy.where["host"] == socket.gethostname()
    assert isinstance(busy.where["since"], int)
    assert busy.where["path"].endswith("sessions.db.dsh-locks/s1.lock")
    winner = winners[0]
    # A failed attempt must not weaken the winner's lock (flock is per open file description).
    with pytest.raises(SessionBusyError):
        backend.open("s1", "write")
    winner.append(closing(3))
    winner.close()
    with backend.open("s1", "write") as again:
        assert [e["seq"] for e in again.read().events] == [0, 1, 2, 3, 4]
    # Readers are never excluded.
    with backend.open("s1", "write"), backend.open("s1") as reader:
        assert len(reader.read().events) == 5
    backend.close()


CHILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[3])
from dsh._errors import SessionBusyError
from dsh.json import snapshot_json
from dsh.persistence.sqlite._backend import SqliteBackend
from dsh.session._events import make_event

backend = SqliteBackend(sys.argv[1])
role = sys.argv[2]
if role == "try":
    try:
        backend.open("s1", "write")
    except SessionBusyError as exc:
        print(json.dumps({"error": exc.code, "where": exc.where}), flush=True)
    else:
        print(json.dumps({"error": None}), flush=True)
    sys.exit(0)
handle = backend.open("s1", "write")
print(json.dumps({"ready": os.getpid()}), flush=True)
sys.stdin.readline()
n = len(handle.read().events)
handle.append([make_event("step/end", n, 1, snapshot_json({"turn": 1, "step": 1})),
               make_event("turn/end", n + 1, 1,
                          snapshot_json({"turn": 1, "reason": {"kind": "completed"}}))])
handle.flush()
handle.close()
print(json.dumps({"done": n + 2}), flush=True)
"""


def _spawn(path: Path, role: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(path), role, SRC],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_sqlite_second_writer_process_gets_session_busy_naming_the_holder(
        tmp_path: Path) -> None:
    """A writer in another process excludes ours; nothing is duplicated.

    Rule: docs/stores.md#the-backend-contract.
    """
    backend = backend_with(tmp_path, events=prefix())
    child = _spawn(db_path(tmp_path), "hold")
    try:
        assert child.stdout is not None and child.stdin is not None
        ready = json.loads(child.stdout.readline())
        with pytest.raises(SessionBusyError, match="another process") as info:
            backend.open("s1", "write")
        assert info.value.where["pid"] == ready["ready"] == child.pid
        assert info.value.where["host"] == socket.gethostname()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert json.loads(child.stdout.readline()) == {"done": 5}
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()
    with backend.open("s1", "write") as handle:
        assert [e["seq"] for e in handle.read().events] == [0, 1, 2, 3, 4]
    assert [r[1] for r in rows_of(db_path(tmp_path))] == [0, 1, 2, 3, 4]
    backend.close()


def test_sqlite_writer_in_this_process_excludes_a_writer_process(tmp_path: Path) -> None:
    """The child process is refused and is told our pid and host.

    Rule: docs/stores.md#the-backend-contract.
    """
    backend = backend_with(tmp_path, events=prefix())
    with backend.open("s1", "write"):
        child = _spawn(db_path(tmp_path), "try")
        out, _ = child.communicate(timeout=30)
    report = json.loads(out)
    assert report["error"] == "SESSION_BUSY"
    assert report["where"]["pid"] == os.getpid()
    assert report["where"]["host"] == socket.gethostname()
    backend.close()


def test_sqlite_lock_of_a_killed_writer_process_is_released(tmp_path: Path) -> None:
    """SIGKILL of the holder frees the session (OS lock); no stale lock remains.

    Rule: docs/rules.md#one-writer-per-session.
    """
    backend = backend_with(tmp_path, events=prefix())
    child = _spawn(db_path(tmp_path), "hold")
    assert child.stdout is not None
    json.loads(child.stdout.readline())
    with pytest.raises(SessionBusyError):
        backend.open("s1", "write")
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    child.stdout.close()
    assert child.stdin is not None
    child.stdin.close()
    with backend.open("s1", "write") as handle:
        handle.append(closing(3))
    assert len(read_all(backend).events) == 5
    backend.close()


def test_sqlite_lock_file_names_are_percent_encoded_ids() -> None:
    """Lock files live beside the database, one per percent-encoded id (never in the file)."""
    assert lock_file_name("s1") == "s1.lock"
    assert lock_file_name("a/b c") == "a%2Fb%20c.lock"
    assert lock_file_name("..") == "%2E..lock"
    long_name = lock_file_name("x" * 500)
    assert len(long_name) < 255 and long_name.endswith(".lock")
    assert lock_file_name("x" * 500) != lock_file_name("x" * 499 + "y")


def _hold_write_lock(path: Path, seconds: float) -> subprocess.Popen[str]:
    script = ("import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None);"
              " c.execute('BEGIN IMMEDIATE'); print('held', flush=True);"
              " time.sleep(float(sys.argv[2])); c.execute('COMMIT')")
    return subprocess.Popen([sys.executable, "-c", script, str(path), str(seconds)],
                            stdout=subprocess.PIPE, text=True)


def test_sqlite_waits_for_a_competing_process_within_the_configured_busy_timeout(
        tmp_path: Path) -> None:
    """Another process holds BEGIN IMMEDIATE for 100 ms; our append still succeeds.

    Rule: docs/formats.md#sqlite.
    """
    backend = backend_with(tmp_path, events=prefix(), busy_timeout_ms=1000)
    with backend.open("s1", "write") as handle:
        holder = _hold_write_lock(db_path(tmp_path), 0.1)
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        handle.append(closing(3))
        assert holder.wait(timeout=30) == 0
        holder.stdout.close()
    assert len(read_all(backend).events) == 5
    backend.close()


def test_sqlite_reports_database_busy_past_the_busy_timeout(tmp_path: Path) -> None:
    """A lock held longer fails as DATABASE_BUSY and writes nothing.

    Rule: docs/formats.md#files-and-connections (busy timeout).
    """
    backend = backend_with(tmp_path, events=prefix(), busy_timeout_ms=50)
    with backend.open("s1", "write") as handle:
        holder = _hold_write_lock(db_path(tmp_path), 0.4)
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(PersistenceError, match="busy timeout") as info:
            handle.append(closing(3))
        assert info.value.code == "DATABASE_BUSY"
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        assert holder.wait(timeout=30) == 0
        holder.stdout.close()
        handle.append(closing(3))
    assert len(read_all(backend).events) == 5
    backend.close()


# --- packing (docs/formats.md#schema-17) ----------------------------------------------------------

def test_sqlite_packs_each_append_once_without_rewriting_earlier_rows_and_seeks_inside_packed_rows(
        tmp_path: Path) -> None:
    """Appends of 3, 1, then 100 events → 7 physical rows (1 packed); seek reads exact.

    Rule: docs/formats.md#sqlite.
    """
    events = [*prefix(), chunk(3, {"type": "block-start", "index": 0, "blockType": "text"})]
    events += [delta(seq, f"w{seq} ", time=T0 + seq) for seq in range(4, 102)]
    events += [chunk(102, {"type": "block-end", "index": 0,
                           "block": {"type": "text", "text": "…"}}),
               chunk(103, {"type": "usage", "usage": {"inputTokens": 1, "outputTokens": 2}})]
    backend = backend_with(tmp_path)
    with backend.open("s1", "write") as handle:
        handle.append(events[:3])
        first_rows = rows_of(db_path(tmp_path))
        handle.append(events[3:4])
        handle.append(events[4:])
    rows = rows_of(db_path(tmp_path))
    assert len(rows) == 7
    assert rows[:3] == first_rows
    assert [r[3] for r in rows].count(0) == 1
    assert rows[4][1:] == (4, "text-chunks", 0)
    for offset in (0, 2, 25, 101, 104, 105):
        assert list(read_all(backend, offset=offset).events) == events[offset:]
    conn = raw(db_path(tmp_path))
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 17
    conn.close()
    backend.close()


def test_sqlite_bounds_paced_stream_rows_without_rewriting_committed_rows(tmp_path: Path) -> None:
    """docs/formats.md#sqlite `bounds paced-stream WAL extent`: 1,000 deltas in 40-event appends.

    Every row is inserted once (rowids of earlier rows never change), each batch packs only its
    own run, and no packed data exceeds 1 MiB.
    """
    events = prefix()
    events.append(chunk(3, {"type": "block-start", "index": 0, "blockType": "text"}))
    events += [delta(seq, "tok ", time=T0 + seq) for seq in range(4, 1004)]
    events.append(chunk(1004, {"type": "block-end", "index": 0,
                               "block": {"type": "text", "text": "tok " * 1000}}))
    events += closing(1005)
    backend = backend_with(tmp_path)
    seen: dict[int, tuple[Any, ...]] = {}
    with backend.open("s1", "write") as handle:
        for start in range(0, len(events), 40):
            handle.append(events[start:start + 40])
            for row in rows_of(db_path(tmp_path)):
                assert seen.setdefault(row[0], row) == row
    rows = rows_of(db_path(tmp_path))
    # batch 1: 4 scalars + 36 deltas packed; 24 full delta batches; last: 4 deltas + 3 scalars.
    assert len(rows) == 5 + 24 + 4
    assert sum(1 for r in rows if r[3] == 0) == 26
    conn = raw(db_path(tmp_path))
    largest = conn.execute("SELECT max(length(CAST(data AS BLOB))) FROM events").fetchone()[0]
    conn.close()
    assert largest <= MAX_PACKED_DATA_BYTES
    assert list(read_all(backend).events) == events
    backend.close()


def test_sqlite_stores_a_100_member_run_in_one_row_and_restores_every_logical_event(
        tmp_path: Path) -> None:
    """docs/formats.md#sqlite compression.spec: a 100-member run is one packed row."""
    events = [delta(seq, f"{seq} ", time=T0 + seq * 3) for seq in range(100)]
    backend = backend_with(tmp_path, events=events)
    assert rows_of(db_path(tmp_path)) == [(1, 0, "text-chunks", 0)]
    assert list(read_all(backend).events) == events
    backend.close()


def test_sqlite_partitions_long_and_large_runs_within_schema_owned_row_limits(
        tmp_path: Path) -> None:
    """>1024 members or >1 MiB split; remainders under 3 members stay scalar.

    Rule: docs/formats.md#sqlite, docs/formats.md#schema-17.
    """
    long_run = [delta(seq, "x") for seq in range(2050)]
    backend = backend_with(tmp_path, events=long_run)
    rows = rows_of(db_path(tmp_path))
    assert [(r[1], r[3]) for r in rows] == [(0, 0), (1024, 0), (2048, None), (2049, None)]
    assert list(read_all(backend).events) == long_run
    backend.close()

    other = tmp_path / "large"
    other.mkdir()
    big = 200_000  # five members fit in 1 MiB of data, six do not
    large_run = [delta(seq, chr(ord("a") + seq) * big) for seq in range(12)]
    backend = backend_with(other, events=large_run)
    rows = rows_of(db_path(other))
    assert [(r[1], r[3]) for r in rows] == [(0, 0), (5, 0), (10, None), (11, None)]
    assert list(read_all(backend).events) == large_run
    backend.close()

    huge = tmp_path / "huge"
    huge.mkdir()
    # The first three members exceed 1 MiB: the first is stored scalar, the rest pack.
    too_big = [delta(seq, "y" * (600_000 if seq == 0 else 300_000)) for seq in range(4)]
    backend = backend_with(huge, events=too_big)
    rows = rows_of(db_path(huge))
    assert [(r[1], r[2], r[3]) for r in rows] == [
        (0, "assistant/chunk", None), (1, "text-chunks", 0)]
    assert list(read_all(backend).events) == too_big
    backend.close()


def test_sqlite_packs_every_owned_kind_and_preserves_optional_tool_call_names(
        tmp_path: Path) -> None:
    """Text, reasoning and tool-call runs pack; name kept or absent exactly.

    Rule: docs/formats.md#sqlite.
    """
    events = [delta(s, "r", kind="reasoning-delta") for s in range(3)]
    events += [delta(s, "t", index=1) for s in range(3, 6)]
    events += [tool_delta(s, '{"a"', name="read_file") for s in range(6, 9)]
    events += [tool_delta(s, "1}", call_id="call_2") for s in range(9, 12)]
    backend = backend_with(tmp_path, events=events)
    rows = rows_of(db_path(tmp_path))
    assert [r[2] for r in rows] == ["reasoning-chunks", "text-chunks", "tool-call-chunks",
                                    "tool-call-chunks"]
    back = read_all(backend).events
    assert list(back) == events
    assert back[6]["data"]["chunk"]["name"] == "read_file"
    assert "name" not in back[9]["data"]["chunk"]
    backend.close()


def test_sqlite_keeps_every_off_format_delta_scalar_and_splits_incompatible_runs(
        tmp_path: Path) -> None:
    """Only whitelisted shapes pack; index/kind changes split runs.

    Rule: docs/formats.md#sqlite, docs/formats.md#record-lines.
    """
    odd = chunk(2, {"type": "text-delta", "index": 0, "text": "x", "extra": 1})
    events = [delta(0), delta(1), odd, delta(3), delta(4, index=1), delta(5, index=1),
              delta(6, index=1), delta(7, kind="reasoning-delta", index=1)]
    backend = backend_with(tmp_path, events=events)
    rows = rows_of(db_path(tmp_path))
    assert [(r[1], r[2]) for r in rows] == [
        (0, "assistant/chunk"), (1, "assistant/chunk"), (2, "assistant/chunk"),
        (3, "assistant/chunk"), (4, "text-chunks"), (7, "assistant/chunk")]
    assert list(read_all(backend).events) == events
    backend.close()


@pytest.mark.parametrize("tag", ["text-chunks", "reasoning-chunks", "tool-call-chunks"])
def test_sqlite_preserves_an_ignorable_logical_event_named_as_a_storage_tag_as_a_scalar_row(
        tmp_path: Path, tag: str) -> None:
    """docs/formats.md#sqlite: the discriminator is the ignorable column, not the type name."""
    event = ev(tag, 0, {"seq0": 1, "texts": ["a"]}, ignorable=True)
    backend = backend_with(tmp_path, events=[event])
    assert rows_of(db_path(tmp_path)) == [(1, 0, tag, 1)]
    assert list(read_all(backend).events) == [event]
    assert read_all(backend).events[0]["ignorable"] is True
    backend.close()


def test_sqlite_compresses_large_data_and_delta_encodes_complete_provenance_arrays(
        tmp_path: Path) -> None:
    """≥4 KiB data becomes a zstd BLOB; provenance is a varint BLOB.

    Rule: docs/formats.md#sqlite, docs/formats.md#schema-17.
    """
    sources = [*list(range(5, 40)), 2, 2 ** 40]
    message = ev("assistant/message", 40, {"turn": 1, "text": "z" * 5000},
                 surface_op="append", sources=sources)
    events = [ev("goal/change", seq, {"n": seq}) for seq in range(40)] + [message]
    backend = backend_with(tmp_path, events=events)
    conn = raw(db_path(tmp_path))
    data, blob, op = conn.execute(
        "SELECT data, source_event_seqs, surface_op FROM events WHERE seq = 40").fetchone()
    conn.close()
    assert isinstance(data, bytes) and len(data) < 5000
    assert isinstance(blob, bytes) and blob == encode_source_event_seqs(sources)
    assert op == '"append"'
    assert list(read_all(backend).events) == events
    backend.close()


def test_sqlite_keeps_large_data_as_text_when_its_zstandard_frame_is_not_smaller(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame that is not smaller is not stored.

    Rule: docs/formats.md#sqlite (compression-unprofitable).
    """

    class NoGain:
        def compress(self, data: bytes) -> bytes:
            return data + b"\x00"

    monkeypatch.setattr(schema, "_zstd", lambda: (NoGain(), None))
    event = ev("goal/change", 0, {"text": "q" * 5000})
    backend = backend_with(tmp_path, events=[event])
    conn = raw(db_path(tmp_path))
    kind = conn.execute("SELECT typeof(data) FROM events").fetchone()[0]
    conn.close()
    assert kind == "text"
    assert list(read_all(backend).events) == [event]
    backend.close()


def test_sqlite_reader_of_small_rows_loads_no_zstandard(tmp_path: Path) -> None:
    """zstandard and the search index module are imported when a row or a search needs them.

    Rule: docs/formats.md#schema-17 (only data of 4096 bytes or more is a zstd frame).
    """
    small = backend_with(tmp_path, events=[ev("goal/change", 0, {"text": "q"})])
    small.close()
    store = db_path(tmp_path)
    code = ("import sys; from dsh.persistence import Persistence, open_backend\n"
            f"p = Persistence(open_backend('sqlite:///{store}'))\n"
            "assert len(p.read('s1').events) == 1\n"
            "print(sorted(m for m in ('zstandard', 'dsh.persistence._search') "
            "if m in sys.modules))\n"
            "p.backend.search_index().close()\n"
            "print('dsh.persistence._search' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout.split("\n")
    assert out[:2] == ["[]", "True"]


# --- provenance varints ---------------------------------------------------------------------

def test_sqlite_round_trips_empty_descending_and_maximum_safe_provenance_deltas() -> None:
    """[] is an empty BLOB; descending lists and 2^53-1 round-trip.

    Rule: docs/formats.md#sqlite, docs/formats.md#schema-17.
    """
    cases = [[], [0], [7, 3, 1, 0], [2**53 - 1, 0, 2**53 - 1], [300, 301, 302]]
    for seqs in cases:
        assert list(decode_source_event_seqs(encode_source_event_seqs(seqs))) == seqs
    assert encode_source_event_seqs([]) == b""
    assert encode_source_event_seqs([300]) == bytes([0xAC, 0x02])
    assert encode_source_event_seqs([5, 3]) == bytes([5, 3])  # zigzag of -2 is 3


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**53 - 1), max_size=50))
def test_sqlite_provenance_varint_round_trips_any_safe_sequence(seqs: list[int]) -> None:
    assert list(decode_source_event_seqs(encode_source_event_seqs(seqs))) == seqs


@pytest.mark.parametrize("bad", [-1, 0.5, 2**53, True])
def test_sqlite_rejects_invalid_provenance_sequence_before_encoding(bad: Any) -> None:
    """docs/formats.md#sqlite `rejects invalid provenance sequence %s before encoding` (-1, 0.5)."""
    with pytest.raises(EventRejectedError, match="non-negative safe integers"):
        encode_source_event_seqs([1, bad])


@pytest.mark.parametrize(("blob", "message"), [
    (b"\x80", "truncated"),
    (b"\x81\x00", "non-canonical"),
    (b"\xff" * 9 + b"\x01", "longer than 57 bits"),
    (bytes([0x80] * 7 + [0x10]), "exceeds 2\\^53"),
    (bytes([3, 9]), "outside"),
])
def test_sqlite_rejects_malformed_delta_encoded_values(blob: bytes, message: str) -> None:
    """docs/formats.md#sqlite `rejects malformed ... delta-encoded values`."""
    with pytest.raises(RowError, match=message):
        decode_source_event_seqs(blob)


# --- torn tails and corruption (docs/formats.md#appends-and-reads) --------------------------------

def test_sqlite_distinguishes_removable_and_committed_physical_corruption(
        tmp_path: Path) -> None:
    """A bad row after the last turn/end is torn; before it, the log is corrupt.

    Rule: docs/formats.md#sqlite.
    """
    backend = backend_with(tmp_path, events=prefix() + closing(3))
    insert_row(db_path(tmp_path), 5, "turn/start", "{not json")
    cold = read_all(backend)
    assert len(cold.events) == 5
    assert cold.torn is not None and cold.torn.byte_offset is None
    assert cold.torn.line == 6  # rowid of the torn row
    assert "seq 5" in cold.torn.reason
    insert_row(db_path(tmp_path), 6, "turn/end", '{"turn":1,"reason":{"kind":"completed"}}')
    with pytest.raises(LogCorruptError, match="invalid committed physical row at seq 5") as info:
        read_all(backend)
    assert info.value.where["seq"] == 5
    backend.close()


def test_sqlite_rejects_malformed_physical_tail_rows_before_appending(tmp_path: Path) -> None:
    """An unseen torn tail refuses the append; after read() it is re-checked, removed.

    Rule: docs/formats.md#sqlite.
    """
    backend = backend_with(tmp_path, events=prefix())
    insert_row(db_path(tmp_path), 3, "step/end", "[broken")
    with backend.open("s1", "write") as handle:
        with pytest.raises(LogCorruptError, match="invalid physical tail at seq 3"):
            handle.append(closing(3))
        assert len(rows_of(db_path(tmp_path))) == 4
        cold = handle.read()
        assert cold.torn is not None and len(cold.events) == 3
        handle.append(closing(3))
    back = read_all(backend)
    assert back.torn is None and list(back.events) == prefix() + closing(3)
    backend.close()


def test_sqlite_rejects_a_stale_repair_without_deleting_a_newer_winning_tail(
        tmp_path: Path) -> None:
    """The torn tail seen by read() changed under the lock.

    Rule: docs/formats.md#sqlite (rejects a stale repair).
    """
    backend = backend_with(tmp_path, events=prefix())
    insert_row(db_path(tmp_path), 3, "step/end", "[broken")
    with backend.open("s1", "write") as handle:
        assert handle.read().torn is not None
        # dsh (another process) repairs it and extends the log, then tears a later row.
        conn = raw(db_path(tmp_path))
        conn.execute("DELETE FROM events WHERE seq = 3")
        conn.execute("INSERT INTO events VALUES ('s1', 3, 'step/end', ?, "
                     "'{\"turn\":1,\"step\":1}', NULL, NULL, NULL)", (T0,))
        conn.execute("INSERT INTO events VALUES ('s1', 4, 'turn/end', ?, '{', NULL, NULL, NULL)",
                     (T0,))
        conn.close()
        with pytest.raises(LogCorruptError, match="invalid physical tail at seq 4"):
            handle.append(closing(3))
    assert [r[1] for r in rows_of(db_path(tmp_path))] == [0, 1, 2, 3, 4]
    backend.close()


def test_sqlite_treats_a_malformed_packed_tail_as_one_removable_physical_row(
        tmp_path: Path) -> None:
    """docs/formats.md#sqlite: a bad packed row is torn as a whole; the torn marker is that row."""
    backend = backend_with(tmp_path, events=prefix())
    insert_row(db_path(tmp_path), 3, "text-chunks",
               '{"turn":1,"step":1,"index":0,"dt":[0],"texts":["a","b","c"]}', ignorable=0)
    cold = read_all(backend)
    assert cold.torn is not None and "dt must hold 2 gaps" in cold.torn.reason
    assert len(cold.events) == 3
    backend.close()


@pytest.mark.parametrize(("column_values", "message"), [
    ({"data": "{}", "sources": "[1]"}, "source_event_seqs must be a BLOB"),
    ({"data": 5}, "data must be TEXT or BLOB"),
    ({"data": "{}", "time": 2**60}, "time must be a safe integer"),
    ({"data": "{}", "surface_op": "append"}, "surface_op is not lossless JSON"),
    ({"data": "{}", "ignorable": 0}, "packed discriminator requires a chunk tag"),
    ({"data": b"\x28\xb5\x2f\xfd garbage"}, "not a valid Zstandard frame"),
    ({"data": '{"a":NaN}'}, "not lossless JSON"),
])
def test_sqlite_rejects_malformed_sqlite_row_primitives_generically(
        tmp_path: Path, column_values: dict[str, Any], message: str) -> None:
    """Wrong column types or values do not decode (here: a torn final row).

    Rule: docs/formats.md#sqlite, docs/formats.md#schema-17.
    """
    backend = backend_with(tmp_path, events=prefix())
    values = dict(column_values)
    insert_row(db_path(tmp_path), 3, "step/end", values.pop("data"), **values)
    cold = read_all(backend)
    assert cold.torn is not None and message in cold.torn.reason
    backend.close()


def test_sqlite_rejects_surface_columns_on_packed_rows(tmp_path: Path) -> None:
    """docs/formats.md#sqlite `rejects surface columns on packed rows`."""
    backend = backend_with(tmp_path, events=prefix())
    insert_row(db_path(tmp_path), 3, "text-chunks",
               '{"turn":1,"step":1,"index":0,"dt":[0,0],"texts":["a","b","c"]}',
               surface_op='"append"', ignorable=0)
    cold = read_all(backend)
    assert cold.torn is not None and "packed surface fields must be null" in cold.torn.reason
    backend.close()


def test_sqlite_rejects_an_oversized_packed_data_column_before_json_decoding(
        tmp_path: Path) -> None:
    """docs/formats.md#sqlite: packed TEXT over 1 MiB is refused without parsing it."""
    backend = backend_with(tmp_path, events=prefix())
    insert_row(db_path(tmp_path), 3, "text-chunks", "x" * (MAX_PACKED_DATA_BYTES + 1),
               ignorable=0)
    cold = read_all(backend)
    assert cold.torn is not None and "before JSON decoding" in cold.torn.reason
    backend.close()


def test_sqlite_bounds_packed_data_while_decompressing(tmp_path: Path) -> None:
    """A packed BLOB that inflates past 1 MiB is refused (with or without a size field).

    Rule: docs/formats.md#sqlite.
    """
    import zstandard

    body = json.dumps({"turn": 1, "step": 1, "index": 0, "dt": [0, 0],
                       "texts": ["a" * 600_000, "b" * 600_000, "c"]}).encode()
    backend = backend_with(tmp_path, events=prefix())
    for seq, sized in ((3, True), (4, False)):
        frame = zstandard.ZstdCompressor(write_content_size=sized).compress(body)
        insert_row(db_path(tmp_path), seq, "text-chunks", frame, ignorable=0)
        cold = read_all(backend)
        assert cold.torn is not None and "limit" in cold.torn.reason
        conn = raw(db_path(tmp_path))
        conn.execute("DELETE FROM events WHERE seq = ?", (seq,))
        conn.close()
    backend.close()


def test_sqlite_includes_a_packed_predecessor_when_an_overlapping_scalar_tail_hides_it(
        tmp_path: Path) -> None:
    """docs/formats.md#appends-and-reads: a scalar row overlapping a packed row is exposed to
    contiguity checks, and a malformed packed predecessor fails closed (empty suffix)."""
    events = prefix() + [delta(seq, "t") for seq in range(3, 13)]
    backend = backend_with(tmp_path, events=events)
    insert_row(db_path(tmp_path), 8, "assistant/chunk",
               '{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"dup"}}')
    suffix = read_all(backend, offset=8)
    assert suffix.events == tuple(events[8:])
    assert suffix.torn is not None and "row starts at seq 8, expected 13" in suffix.torn.reason
    conn = raw(db_path(tmp_path))
    conn.execute("DELETE FROM events WHERE seq = 8")
    conn.execute("UPDATE events SET data = '{\"broken' WHERE seq = 3")
    conn.close()
    damaged = read_all(backend, offset=8)
    assert damaged.events == () and damaged.torn is not None
    backend.close()


def test_sqlite_read_offset_must_be_a_non_negative_integer(tmp_path: Path) -> None:
    """FromSeq must be a non-negative safe integer; past the end is empty.

    Rule: docs/stores.md#opening-a-store (readFrom).
    """
    backend = backend_with(tmp_path, events=prefix())
    with backend.open("s1") as handle:
        for bad in (-1, 1.0, "2"):
            with pytest.raises(ConfigError, match="offset"):
                handle.read(bad)  # type: ignore[arg-type]
        assert handle.read(3).events == ()
        assert handle.read(99).events == ()
        assert list(handle.read(1).events) == prefix()[1:]
    backend.close()


# --- random logs (docs/formats.md#sqlite differential, reduced to a round trip) -------------------

@st.composite
def batched_logs(draw: st.DrawFn) -> tuple[list[Event], list[int]]:
    events: list[Event] = []
    for _ in range(draw(st.integers(min_value=1, max_value=12))):
        seq = len(events)
        kind = draw(st.sampled_from(["text", "reasoning", "tool", "other", "user", "ignorable"]))
        run = draw(st.integers(min_value=1, max_value=6))
        for k in range(run):
            seq = len(events)
            step_time = T0 + draw(st.integers(min_value=-3, max_value=3))
            if kind in ("text", "reasoning"):
                events.append(delta(seq, draw(st.text(max_size=5)), kind=f"{kind}-delta",
                                    time=step_time))
            elif kind == "tool":
                events.append(tool_delta(seq, draw(st.text(max_size=5)),
                                         name="f" if k % 2 == 0 else None))
            elif kind == "user":
                events.append(user(seq, draw(st.text(max_size=20))))
            elif kind == "ignorable":
                events.append(ev("text-chunks", seq, {"x": k}, ignorable=True))
            else:
                events.append(ev("goal/change", seq, {"v": draw(st.integers(-2**53 + 1,
                                                                            2**53 - 1))
                                                      if k else None}, time=step_time,
                                 surface_op=None))
    cuts = sorted(draw(st.sets(st.integers(min_value=1, max_value=max(1, len(events) - 1)),
                               max_size=4)))
    return events, cuts


@settings(max_examples=EXAMPLES, deadline=None)
@given(batched_logs())
def test_sqlite_round_trips_randomized_logical_logs_and_append_partitions(
        tmp_path_factory: pytest.TempPathFactory, case: tuple[list[Event], list[int]]) -> None:
    """Any log, any batch partition, any suffix reads back exactly.

    Rule: docs/formats.md#sqlite (differential (reduced)).
    """
    events, cuts = case
    backend = backend_with(tmp_path_factory.mktemp("rand"))
    bounds = [0, *[c for c in cuts if c < len(events)], len(events)]
    with backend.open("s1", "write") as handle:
        for start, stop in itertools.pairwise(bounds):
            handle.append(events[start:stop])
    assert list(read_all(backend).events) == events
    middle = len(events) // 2
    assert list(read_all(backend, offset=middle).events) == events[middle:]
    backend.close()


def test_sqlite_canonical_schema_objects_match_a_file_we_create(tmp_path: Path) -> None:
    """Our DDL produces exactly the canonical object set dsh validates against.

    Rule: docs/formats.md#schema-17.
    """
    backend_with(tmp_path).close()
    conn = raw(db_path(tmp_path))
    try:
        assert schema_objects(conn) == canonical_schema_objects(17)
    finally:
        conn.close()
    assert canonical_schema_objects(14) != canonical_schema_objects(17)


def test_sqlite_pinned_schema_digests_are_those_of_the_canonical_objects(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The pin that lets an open skip building the canonical objects is theirs, for both schemas.

    Rule: docs/formats.md#files-and-connections.
    """
    for version in (14, 17):
        found = canonical_schema_objects(version)
        assert hashlib.sha256(repr(found).encode()).hexdigest() == \
            schema.CANONICAL_SCHEMA_DIGESTS[version]
        assert schema.is_canonical_schema(found, version)
    assert not schema.is_canonical_schema(canonical_schema_objects(14), 17)
    # one statement changed: neither the pin nor the canonical objects
    altered = (*canonical_schema_objects(17)[:-1],
               (*canonical_schema_objects(17)[-1][:3], "CREATE TABLE x (y)"))
    assert not schema.is_canonical_schema(altered, 17)
    # a SQLite that stores the DDL otherwise than the pin: its own objects still pass
    monkeypatch.setitem(schema.CANONICAL_SCHEMA_DIGESTS, 17, "0" * 64)
    assert schema.is_canonical_schema(canonical_schema_objects(17), 17)
    assert not schema.is_canonical_schema(altered, 17)


def test_sqlite_stored_schema_digests_are_those_of_files_created_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An open takes a file's stored schema rows by their digest, else compares them normalised.

    Rule: docs/formats.md#schema-17, docs/formats.md#files-and-connections.
    """
    for version in (14, 17):
        path = tmp_path / f"s{version}.db"
        backend = SqliteBackend(path, schema=version)
        assert not backend.exists("nobody")
        backend.close()
        conn = raw(path)
        try:
            rows = conn.execute(schema._SCHEMA_ROWS).fetchall()
            assert hashlib.sha256(repr(rows).encode()).hexdigest() == \
                schema.STORED_SCHEMA_DIGESTS[version]
            assert schema.has_canonical_schema(conn, version)
            assert not schema.has_canonical_schema(conn, 31 - version)
            # another writer's whitespace: not the stored digest, still dsh's schema
            monkeypatch.setitem(schema.STORED_SCHEMA_DIGESTS, version, "0" * 64)
            assert schema.has_canonical_schema(conn, version)
            assert not schema.has_canonical_schema(conn, 31 - version)
        finally:
            conn.close()
    # schema text edited in place: whitespace is still dsh's schema (the normalised
    # comparison), anything else keeps the typed refusal
    monkeypatch.undo()
    path = tmp_path / "s17.db"
    for edit, refused in (("sql || '  '", False),
                          ("replace(sql, 'TABLE sessions', 'TABLE sessions /* x */')", True)):
        conn = raw(path)
        try:
            conn.execute("PRAGMA writable_schema = ON")
            conn.execute(f"UPDATE sqlite_schema SET sql = {edit} WHERE name = 'sessions'")
        finally:
            conn.close()
        backend = SqliteBackend(path)
        try:
            if refused:
                with pytest.raises(LogCorruptError) as caught:
                    backend.exists("nobody")
                assert caught.value.code == "SCHEMA_MISMATCH"
            else:
                assert not backend.exists("nobody")
        finally:
            backend.close()


def test_sqlite_frozen_events_come_back_frozen(tmp_path: Path) -> None:
    """docs/rules.md#immutability: events read from SQLite are immutable Event objects."""
    backend = backend_with(tmp_path, events=prefix())
    event = read_all(backend).events[2]
    assert isinstance(event, Event) and isinstance(event["data"], FrozenDict)
    with pytest.raises(TypeError):
        event["data"]["role"] = "assistant"  # type: ignore[index]
    backend.close()


def test_sqlite_append_exposes_a_scalar_row_overlapping_a_packed_tail(tmp_path: Path) -> None:
    """The tail check sees an overlapping row and refuses to append.

    Rule: docs/formats.md#appends-and-reads.
    """
    events = prefix() + [delta(seq, "t") for seq in range(3, 13)]
    backend = backend_with(tmp_path)
    with backend.open("s1", "write") as handle:
        handle.append(events)
        conn = raw(db_path(tmp_path))
        conn.execute("INSERT INTO events VALUES ('s1', 8, 'assistant/chunk', ?, "
                     "'{\"turn\":1,\"step\":1,\"chunk\":{\"type\":\"text-delta\",\"index\":0,"
                     "\"text\":\"dup\"}}', NULL, NULL, NULL)", (T0,))
        conn.execute("UPDATE sessions SET revision = revision + 1")
        conn.close()
        with pytest.raises(LogCorruptError, match="invalid physical tail at seq 8"):
            handle.append(closing(13))
    assert len(rows_of(db_path(tmp_path))) == 5
    backend.close()


def test_sqlite_bad_row_followed_by_intact_rows_is_corruption_not_a_torn_tail(
        tmp_path: Path) -> None:
    # A SQLite row cannot tear; a damaged row with intact rows after it (and no turn/end after)
    # must refuse the load naming the seq, not hide the later committed rows (adversarial report).
    events = [ev("turn/start", 0, {"turn": 1})] + [ev("todo/write", i, {"todos": []})
                                                   for i in range(1, 5)]
    backend = backend_with(tmp_path, events=events)
    conn = raw(db_path(tmp_path))
    conn.execute("UPDATE events SET data = '{broken' WHERE session_id = 's1' AND seq = 2")
    conn.close()
    with backend.open("s1", "read") as handle, pytest.raises(LogCorruptError) as info:
        handle.read()
    assert info.value.where["seq"] == 2 and "2 later row(s) follow it" in info.value.message
    backend.close()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="needs root to give a folder to another uid")
def test_a_database_folder_owned_by_someone_else_says_what_to_do(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, 12345, -1)
    with pytest.raises(ConfigError) as caught:
        Persistence(open_backend(f"sqlite:{shared}/sessions.db")).list_headers()
    assert caught.value.message == (
        f"SQLite directory {shared} must be owned by you (uid 0), found uid 12345: another "
        "user could replace or read it; keep the database in a folder of your own (mkdir "
        "one, e.g. under your home; the default store is ~/.dsh/sessions.db)")


def test_sqlite_append_chains_each_batch_with_the_digest_of_its_one_pass_encoding(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each batch's chain record holds the digest of the events' leaves as the pure-Python
    reference computes them, whether the accelerator's one-pass encoding computed it or not.

    Rule: docs/formats.md#the-seal-chain.
    """
    from dsh.persistence import _chain, _seal
    from dsh.persistence.sqlite import _backend

    events = [*prefix(), ev("x/unknown", 3, {"z": {"b": [1, {"d": 2, "c": 1.5}], "a": "é"}},
                            ignorable=True), *closing(4)]
    backend = backend_with(tmp_path)
    with backend.open("s1", "write") as handle:
        handle.append(events[:4])
    monkeypatch.setattr(_backend, "encode_sealed_batch",
                        lambda batch, version, key: (schema.encode_batch(batch, version), None))
    with backend.open("s1", "write") as handle:
        handle.append(events[4:])
    backend.close()
    found = _seal.read_seal(db_path(tmp_path).parent / "sessions.db.dsh-seals" / "s1.seal")
    assert found is not None
    monkeypatch.setattr(_chain, "c_chain_leaves", None)  # the reference leaves
    assert [(r.first, r.end) for r in found.chain] == [(0, 4), (4, 6)]
    for record in found.chain:
        batch = events[record.first:record.end]
        assert record.digest == _chain.batch_digest(_chain.event_leaves(record, batch))


def test_sqlite_flush_inside_a_batch_stores_what_the_block_committed(tmp_path: Path) -> None:
    """``store.flush(session)`` inside ``Session.batch()`` leaves the block's committed events
    in the file (the durability barrier), read by another connection before the block ends.

    Rule: docs/rules.md#write-behind-and-the-flush-barrier.
    """
    import dsh

    path = tmp_path / "s.db"
    with dsh.open(f"sqlite:///{path}") as store:
        session = store.recorder("demo").session
        with session.batch():
            session.append("session/title", {"title": "kept"})
            store.flush(session)
            reader = sqlite3.connect(path)
            try:
                stored = reader.execute("SELECT seq, type FROM events WHERE session_id = "
                                        "'demo' ORDER BY seq").fetchall()
            finally:
                reader.close()
            assert stored[-1] == (session.seq - 1, "session/title")


def test_sqlite_dispose_inside_a_batch_stores_what_the_block_committed(tmp_path: Path) -> None:
    """A session disposed (or its store closed) inside ``Session.batch()`` has the block's
    committed events in the file; before, the block published them after the detach, to no
    observer, so an acknowledged event was lost.

    Rule: docs/rules.md#live-sessions.
    """
    import dsh

    path = tmp_path / "s.db"
    for how in ("dispose", "close"):
        store = dsh.open(f"sqlite:///{path}")
        session = store.recorder(how).session
        with session.batch():
            session.append("session/title", {"title": how})
            if how == "dispose":
                store.dispose(session)
                store.close()
            else:
                store.close()
        with dsh.open(f"sqlite:///{path}") as again:
            events = again.read(how).events
        assert (events[-1]["type"], events[-1]["data"]) == ("session/title", {"title": how})

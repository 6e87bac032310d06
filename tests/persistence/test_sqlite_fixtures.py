"""Interop: SQLite stores written by the real dsh load here exactly as dsh reads them.

Reference data: ``tests/fixtures/dsh-logs/sqlite/`` (schema 14, written by the published
``dsh-session-persistence-sqlite`` 0.0.1-rc.1) and dsh's own decoded views in
``tests/fixtures/dsh-logs/expected/sqlite/<store>/<id>.json`` (keys: ``meta``, ``events``,
``eventCount``, ``surfaceNodes``, ``replaceGeneration``, ``messages``).
docs/testing.md#what-the-tests-cover (interop), docs/formats.md#appends-and-reads,
docs/formats.md#sqlite. The originals are read-only: every test works on a copy, and the crash store
is copied with its ``-wal`` and ``-shm`` files together.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from dsh.persistence.sqlite._backend import SqliteBackend
from dsh.persistence.sqlite._schema import (
    LEGACY_SCHEMA_VERSION,
    canonical_schema_objects,
    schema_objects,
)
from tests.conftest import DSH_LOGS

pytestmark = pytest.mark.no_speedups

SQLITE_DIR = DSH_LOGS / "sqlite"
EXPECTED_DIR = DSH_LOGS / "expected" / "sqlite"

STORES = ("main", "crash-before-resume", "crash-after-resume")


def _copy_store(store: str, tmp_path: Path) -> Path:
    """Copy ``<store>.sqlite`` and its ``-wal``/``-shm`` companions into a private 0700 dir."""
    target = tmp_path / "db"
    target.mkdir(mode=0o700, exist_ok=True)
    for source in SQLITE_DIR.glob(f"{store}.sqlite*"):
        dest = target / source.name
        shutil.copyfile(source, dest)
        os.chmod(dest, 0o600)
    return target / f"{store}.sqlite"


def _expected(store: str) -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted((EXPECTED_DIR / store).glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        out[data["meta"]["id"]] = data
    return out


def _cases() -> list[tuple[str, str]]:
    if not EXPECTED_DIR.is_dir():
        return []
    return [(store, sid) for store in STORES for sid in _expected(store)]


def _restore(session_id: str, events: Any, header: Any) -> Any:
    session_mod = pytest.importorskip("dsh.session._session")
    return session_mod.Session.restore(session_id, list(events), header,
                                       inherited_event_count=header.get("seedLength", 0))


@pytest.mark.parametrize(("store", "session_id"), _cases())
def test_sqlite_fixture_session_loads_with_dsh_events_and_header(
        tmp_path: Path, store: str, session_id: str) -> None:
    """Every stored session reads back as dsh's inspect() view, minus in-memory closers.

    Rule: docs/formats.md#appends-and-reads.
    """
    expected = _expected(store)[session_id]
    backend = SqliteBackend(_copy_store(store, tmp_path))
    try:
        assert backend.schema_version == LEGACY_SCHEMA_VERSION
        with backend.open(session_id) as handle:
            cold = handle.read()
    finally:
        backend.close()
    assert cold.torn is None
    assert dict(cold.header) == expected["meta"]
    stored = list(cold.events)
    assert stored == expected["events"][:len(stored)]
    if store == "crash-before-resume":
        # dsh's inspect() adds the recovery closers in memory; the store holds the crash prefix.
        assert len(stored) < expected["eventCount"]
    else:
        assert len(stored) == expected["eventCount"]
    assert [e["seq"] for e in stored] == list(range(len(stored)))


@pytest.mark.parametrize(("store", "session_id"), _cases())
def test_sqlite_fixture_session_restores_dsh_surface_and_messages(
        tmp_path: Path, store: str, session_id: str) -> None:
    """Session.restore of what we read yields dsh's surface nodes and derived messages."""
    expected = _expected(store)[session_id]
    backend = SqliteBackend(_copy_store(store, tmp_path))
    try:
        with backend.open(session_id) as handle:
            cold = handle.read()
    finally:
        backend.close()
    events = list(cold.events)
    if store == "crash-before-resume":
        # dsh's view adds its recovery closers in memory; take them from dsh's answer so this
        # test checks what the backend read, not the repair module.
        events += _events_from_json(expected["events"][len(events):])
    session = _restore(session_id, events, cold.header)
    assert list(session.surface.nodes) == expected["surfaceNodes"]
    assert session.surface.replace_generation == expected["replaceGeneration"]
    assert session.derive_messages() == expected["messages"]


def test_sqlite_fixture_crash_store_needs_its_wal_to_show_committed_rows(tmp_path: Path) -> None:
    """The killed process left its commits only in ``-wal``: read them, never lose them."""
    lone = tmp_path / "lone"
    lone.mkdir(mode=0o700)
    shutil.copyfile(SQLITE_DIR / "crash-before-resume.sqlite", lone / "c.sqlite")
    os.chmod(lone / "c.sqlite", 0o600)
    conn = sqlite3.connect(lone / "c.sqlite")
    try:
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 0
    finally:
        conn.close()
    backend = SqliteBackend(_copy_store("crash-before-resume", tmp_path))
    try:
        counts = {}
        for header in backend.list_headers():
            with backend.open(header["id"]) as handle:
                counts[header["id"]] = len(handle.read().events)
    finally:
        backend.close()
    assert counts == {"s2a-crash-after-tool-call": 89, "s2b-crash-before-tool-call": 91,
                      "s2c-crash-mid-stream": 82}


def test_sqlite_fixture_lists_every_stored_header_without_reading_events(tmp_path: Path) -> None:
    """list_headers returns the three session rows, NULL columns omitted.

    Rule: docs/formats.md#schema-17, docs/formats.md#appends-and-reads.
    """
    backend = SqliteBackend(_copy_store("main", tmp_path))
    try:
        headers = list(backend.list_headers())
    finally:
        backend.close()
    assert [h["id"] for h in headers] == ["s1-normal", "s4-fork-of-s1", "s5-compaction"]
    assert dict(headers[1]) == {"version": 0, "id": "s4-fork-of-s1", "createdAt": 1796030745521,
                                "cwd": "/workspace/demo-app", "parentSession": "s1-normal",
                                "seedLength": 135}
    assert "delegationDepth" not in headers[0]


def test_sqlite_fixture_schema_14_resume_appends_closers_in_the_published_layout(
        tmp_path: Path) -> None:
    """Resume of a dsh schema-14 crash store: take write ownership, read, append the closers.

    The file stays schema 14 (published dsh must still open it), rows stay one scalar JSON-text
    row per event, and a re-read equals dsh's repaired view (docs/rules.md#resume,
    docs/formats.md#appends-and-reads).
    """
    path = _copy_store("crash-before-resume", tmp_path)
    expected = _expected("crash-before-resume")["s2a-crash-after-tool-call"]
    backend = SqliteBackend(path)
    try:
        with backend.open("s2a-crash-after-tool-call", "write") as handle:
            cold = handle.read()
            closers = _events_from_json(expected["events"][len(cold.events):])
            handle.append(closers)
            handle.flush()
            again = handle.read()
    finally:
        backend.close()
    assert list(again.events) == expected["events"]
    assert again.revision != cold.revision
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 14
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert schema_objects(conn) == canonical_schema_objects(14)
        row = conn.execute(
            "SELECT typeof(data), source_event_seqs, surface_op FROM events "
            "WHERE session_id = 's2a-crash-after-tool-call' AND seq = 89").fetchone()
        revision = conn.execute("SELECT revision FROM sessions "
                                "WHERE id = 's2a-crash-after-tool-call'").fetchone()[0]
    finally:
        conn.close()
    assert row == ("text", "[88]", '"append"')
    assert revision == 2


def _events_from_json(items: list[dict[str, Any]]) -> list[Any]:
    from dsh.json import snapshot_json
    from dsh.session._events import Event

    return [Event(snapshot_json(item)) for item in items]

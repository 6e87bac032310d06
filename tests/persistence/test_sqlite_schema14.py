"""Creating SQLite stores in schema 14, the layout the published dsh SQLite backend reads.

``sqlite:///path.db?schema=14`` (and ``SqliteBackend(path, schema=14)``) creates a pristine file
with dsh 0.0.1-rc.1's schema: scalar rows, JSON text columns, no ``ignorable`` column, no
packing. Schema 17 stays the default; an existing file keeps its own schema.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from dsh._errors import ConfigError, EventRejectedError
from dsh.json import FrozenDict
from dsh.persistence import Persistence, open_backend
from dsh.persistence.sqlite._backend import SqliteBackend
from dsh.persistence.sqlite._schema import canonical_schema_objects, schema_objects
from dsh.session._events import as_event
from dsh.session._store import SessionStore
from tests.strategies import StepClock


def write_stream_session(url: str, session_id: str = "s14") -> list[dict[str, object]]:
    with Persistence(open_backend(url)) as persistence:
        store = SessionStore(persistence=persistence, clock=StepClock())
        session = store.create(session_id)
        session.append("turn/start", {"turn": 1})
        session.append("user/message", {"id": "u1", "role": "user", "source": {"kind": "user"},
                                        "content": [{"type": "text", "text": "hi"}]},
                       surface_op="append")
        session.append("step/start", {"turn": 1, "step": 1})
        seqs = [session.append("assistant/chunk", {"turn": 1, "step": 1, "chunk": {
            "type": "text-delta", "index": 0, "text": f"w{k} "}}).seq for k in range(6)]
        session.append("assistant/message", {"turn": 1, "step": 1, "message": {
            "id": "a1", "role": "assistant", "content": [{"type": "text", "text": "done"}],
            "source": {"kind": "model", "provider": "p", "model": "m"}}},
            surface_op="append", source_event_seqs=seqs)
        session.append("step/end", {"turn": 1, "step": 1})
        session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        store.flush(session)
        events = [dict(e) for e in session.events]
        store.dispose(session)
    return events


def test_schema_14_url_creates_the_published_layout(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    events = write_stream_session(f"sqlite://{db}?schema=14")
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 14
        assert conn.execute("PRAGMA application_id").fetchone()[0] == 0x44534850
        assert schema_objects(conn) == canonical_schema_objects(14)
        rows = conn.execute("SELECT seq, type, typeof(data), typeof(source_event_seqs) FROM "
                            "events ORDER BY seq").fetchall()
    finally:
        conn.close()
    # one scalar row per event (no chunk rows), provenance as JSON text
    assert [r[1] for r in rows] == [e["type"] for e in events]
    assert {r[2] for r in rows} == {"text"}
    assert [r[3] for r in rows if r[1] == "assistant/message"] == ["text"]
    with Persistence(open_backend(f"sqlite://{db}")) as persistence:
        assert [dict(e) for e in persistence.read("s14").stored_events] == events


def test_schema_option_only_applies_to_a_new_file(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    write_stream_session(f"sqlite://{db}", "first")  # schema 17
    write_stream_session(f"sqlite://{db}?schema=14", "second")  # existing file: stays 17
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 17
    finally:
        conn.close()


@pytest.mark.parametrize("option", ["schema=15", "schema=abc", "schema="])
def test_bad_schema_option_is_a_config_error(tmp_path: Path, option: str) -> None:
    with pytest.raises(ConfigError, match="is not 17 \\(default\\) or 14"):
        Persistence(open_backend(f"sqlite://{tmp_path}/store.db?{option}"))
    with pytest.raises(ConfigError, match="schema must be 17"):
        SqliteBackend(tmp_path / "x.db", schema=15)
    assert not (tmp_path / "store.db").exists()


def test_schema_14_refuses_what_its_layout_cannot_hold(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "store.db", schema=14)
    try:
        backend.create({"version": 0, "id": "s", "createdAt": 1})
        note = as_event({"type": "x/plugin-note", "seq": 0, "time": 1, "data": FrozenDict(),
                         "ignorable": True})
        with backend.open("s", "write") as handle, pytest.raises(
                EventRejectedError, match="is ignorable, and a schema-14 SQLite file"):
            handle.append([note])
        with backend.open("s", "read") as handle:
            assert handle.read(0).events == ()  # nothing was written
    finally:
        backend.close()


def _peer() -> Path | None:
    root = Path(os.environ.get("DSH_NODE_DIR") or "/tmp/dsh-node")
    node = root / "nodebin" / "node_modules" / "node" / "bin" / "node"
    return root if node.is_file() and (root / "app" / "export.mjs").is_file() else None


def test_published_dsh_reads_a_schema_14_file_we_created(tmp_path: Path) -> None:
    peer = _peer()
    if peer is None:
        pytest.skip("SKIPPED LOUDLY: the published dsh is not set up (run "
                    "../shared/peers/dsh-node/setup.sh /tmp/dsh-node or set DSH_NODE_DIR)")
    db = tmp_path / "ours" / "store.db"
    db.parent.mkdir()
    events = write_stream_session(f"sqlite://{db}?schema=14")
    scratch = tmp_path / "scratch"
    shutil.copytree(db.parent, scratch)
    out = tmp_path / "export"
    node = peer / "nodebin" / "node_modules" / "node" / "bin" / "node"
    proc = subprocess.run([str(node), str(peer / "app" / "export.mjs"), "sqlite",
                           str(scratch / "store.db"), str(out)], capture_output=True, text=True,
                          cwd=peer / "app", timeout=120)
    assert proc.returncode == 0, proc.stderr
    view = json.loads((out / "s14.json").read_text())
    assert view["events"] == events
    assert [m["id"] for m in view["messages"]] == ["u1", "a1"]


def test_dsh_convert_writes_schema_14(tmp_path: Path) -> None:
    import sys

    events = write_stream_session(f"jsonl://{tmp_path}/src")
    target = tmp_path / "out.db"
    env = {**os.environ, "DSH_HOME": str(tmp_path / "home"), "HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "dsh.cli", "convert", "--from",
                           f"jsonl://{tmp_path}/src", "--to", f"sqlite://{target}?schema=14"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    conn = sqlite3.connect(target)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 14
    finally:
        conn.close()
    with Persistence(open_backend(f"sqlite://{target}")) as persistence:
        assert [dict(e) for e in persistence.read("s14").stored_events] == events

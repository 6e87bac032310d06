"""A lost SQLite seal cannot switch integrity off (docs/formats.md#integrity-seals).

A session row this library creates carries a marked incarnation UUID (version 8, third group
``8d5e``), and its seal ``<db>.dsh-seals/<id>.seal`` is written and fsynced before the row is
committed. A reader that then finds no seal (deleted, emptied, or another incarnation's) refuses
the session (``SEAL_MISSING``, naming the seal) instead of reading its rows unverified, and a
writer refuses to seal them again; only ``dsh verify --reseal`` rebuilds it. Real files: the
campaign's reproducer deletes the seal and changes rows, which used to load changed events in
about one try in eight. ``DSH_CRASH_RUNS`` raises the flip count.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh import LogCorruptError
from dsh.persistence.sqlite._schema import (
    SEALED_INCARNATION_TAG,
    is_sealed_incarnation,
    is_uuid,
    sealed_incarnation,
)

FLIPS = int(os.environ.get("DSH_CRASH_RUNS", "12"))


def user(text: str) -> dict[str, Any]:
    return {"id": f"u-{text}", "role": "user", "source": {"kind": "user"},
            "content": [{"type": "text", "text": text}]}


def _write(root: Path, count: int = 8) -> tuple[str, Path, Path]:
    db = root / "store.db"
    url = f"sqlite://{db}"
    with dsh.open(url) as store:
        session = store.session("s1")
        for n in range(count):
            session.append("user/message", user(f"message {n:03d}"), surface_op="append")
            store.flush(session)
    return url, db, root / "store.db.dsh-seals" / "s1.seal"


def _texts(url: str) -> list[str]:
    with dsh.open(url) as store:
        return [e["data"]["content"][0]["text"] for e in store.read("s1").events
                if e["type"] == "user/message"]


def _incarnation(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        return str(conn.execute("SELECT incarnation FROM sessions WHERE id = 's1'").fetchone()[0])


def test_the_mark_is_a_uuid_dsh_admits_and_never_a_version_4_one() -> None:
    import uuid

    marked = sealed_incarnation()
    assert is_uuid(marked) and is_sealed_incarnation(marked)
    assert marked[14:18] == SEALED_INCARNATION_TAG and marked[19] in "89ab"
    assert uuid.UUID(marked).version == 8
    assert not any(is_sealed_incarnation(str(uuid.uuid4())) for _ in range(200))


def test_a_new_session_is_marked_and_its_seal_exists_before_the_first_append(
        tmp_path: Path) -> None:
    from dsh.persistence.sqlite import SqliteBackend

    db = tmp_path / "store.db"
    with SqliteBackend(db) as backend:
        backend.create({"version": 0, "id": "s1", "createdAt": 1})
    assert is_sealed_incarnation(_incarnation(db))
    assert (tmp_path / "store.db.dsh-seals" / "s1.seal").is_file()


@pytest.mark.parametrize("damage", ["deleted", "emptied", "another incarnation's"])
def test_a_missing_seal_refuses_reads_and_writes_and_is_never_resealed(
        tmp_path: Path, damage: str) -> None:
    url, _db, seal = _write(tmp_path)
    if damage == "deleted":
        seal.unlink()
    elif damage == "emptied":
        seal.write_bytes(b"")
    else:  # the identity names another incarnation: not this session's seal
        data = bytearray(seal.read_bytes())
        at = data.index(b"rows2:") + 6
        data[at] = ord("0") if data[at] != ord("0") else ord("1")
        seal.write_bytes(bytes(data))
    before = seal.read_bytes() if seal.exists() else None
    for attempt in range(2):
        with pytest.raises(LogCorruptError) as refused, dsh.open(url) as store:
            if attempt == 0:
                store.read("s1")
            else:  # a writer: resume, append, flush
                session = store.session("s1")
                session.append("user/message", user("more"), surface_op="append")
                store.flush(session)
        assert refused.value.code == "SEAL_MISSING"
        assert refused.value.where["path"] == str(seal)
        assert "dsh verify --reseal s1" in refused.value.message
    assert (seal.read_bytes() if seal.exists() else None) == before  # nobody sealed it again


def test_changed_rows_in_a_session_whose_seal_is_lost_never_load(tmp_path: Path) -> None:
    """The campaign's reproducer: the seal deleted, one row's text changed (same length)."""
    url, db, seal = _write(tmp_path, 12)
    seal.unlink()
    with sqlite3.connect(db) as conn:
        seqs = [r[0] for r in conn.execute(
            "SELECT seq FROM events WHERE session_id = 's1' AND type = 'user/message' "
            "ORDER BY seq")]
    step = max(1, len(seqs) // FLIPS)
    for seq in seqs[::step]:
        with sqlite3.connect(db) as conn:
            (data,) = conn.execute("SELECT data FROM events WHERE session_id = 's1' AND "
                                   "seq = ?", (seq,)).fetchone()
            text = data if isinstance(data, str) else data.decode()
            changed = text.replace("message", "massage")
            conn.execute("UPDATE events SET data = ? WHERE session_id = 's1' AND seq = ?",
                         (changed if isinstance(data, str) else changed.encode(), seq))
        with pytest.raises(LogCorruptError) as refused:  # main: the changed text loaded
            _texts(url)
        assert refused.value.code == "SEAL_MISSING", refused.value.code
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE events SET data = ? WHERE session_id = 's1' AND seq = ?",
                         (data, seq))


def test_changed_rows_are_still_refused_while_the_seal_exists(tmp_path: Path) -> None:
    url, db, _seal = _write(tmp_path)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE events SET data = replace(data, 'message 003', 'massage 003') "
                     "WHERE session_id = 's1'")
    with pytest.raises(LogCorruptError) as refused:
        _texts(url)
    assert refused.value.code != "SEAL_MISSING"


def test_an_unmarked_session_without_a_seal_still_reads(tmp_path: Path) -> None:
    """A session dsh (or an older writer) created has a version-4 incarnation: no seal expected."""
    import uuid

    url, db, seal = _write(tmp_path)
    seal.unlink()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE sessions SET incarnation = ? WHERE id = 's1'", (str(uuid.uuid4()),))
    assert _texts(url) == [f"message {n:03d}" for n in range(8)]
    with dsh.open(url) as store:  # and the next writer seals it, as before
        session = store.session("s1")
        session.append("user/message", user("more"), surface_op="append")
        store.flush(session)
    assert seal.is_file()
    assert _texts(url)[-1] == "more"


def test_a_resume_through_a_restore_point_refuses_a_missing_seal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dsh.persistence import _restore_point as rp

    monkeypatch.setattr(rp, "RESTORE_POINT_EVERY_EVENTS", 1)
    url, _db, seal = _write(tmp_path)
    assert list((tmp_path / "store.db.dsh-checkpoints").glob("*.ckpt"))
    seal.unlink()
    with pytest.raises(LogCorruptError) as refused, dsh.open(url) as store:
        store.session("s1")
    assert refused.value.code == "SEAL_MISSING"


def test_paging_a_session_refuses_a_missing_seal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dsh.persistence import Persistence, _pages, open_backend, read_pages

    monkeypatch.setattr(_pages, "RANGED_MIN_EVENTS", 8)
    monkeypatch.setattr(_pages, "TAIL_EVENTS", 4)
    url, _db, seal = _write(tmp_path, 40)
    for ckpt in (tmp_path / "store.db.dsh-checkpoints").glob("*.ckpt"):
        ckpt.unlink()
    seal.unlink()
    with Persistence(open_backend(url)) as persistence, pytest.raises(LogCorruptError) as refused:
        read_pages(persistence, "s1")
    assert refused.value.code == "SEAL_MISSING"


def test_a_redaction_keeps_the_session_sealed(tmp_path: Path) -> None:
    from dsh.persistence.sqlite import SqliteBackend

    url, db, seal = _write(tmp_path)
    with SqliteBackend(db) as backend, backend.open("s1", "write") as handle:
        events = list(handle.read().events)
        touched = handle.rewrite(events[:4])
    assert {"path": str(seal), "action": "written"} in touched
    assert seal.is_file() and len(_texts(url)) == 4 - sum(
        1 for e in events[:4] if e["type"] != "user/message")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE events SET data = replace(data, 'message', 'massage') "
                     "WHERE session_id = 's1'")
    with pytest.raises(LogCorruptError):
        _texts(url)


def test_dsh_verify_names_a_missing_seal_and_reseal_rebuilds_it(tmp_path: Path) -> None:
    url, _db, seal = _write(tmp_path)
    seal.unlink()
    env = {**os.environ, "DSH_HOME": str(tmp_path / "home"), "NO_COLOR": "1"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dsh.cli", *args, "--store", url],
                              capture_output=True, text=True, env=env, timeout=120, check=False)

    refused = run("verify", "s1")
    assert refused.returncode == 1, refused.stderr
    assert "SEAL_MISSING" in refused.stdout
    rebuilt = run("verify", "s1", "--reseal")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert "rebuilt" in rebuilt.stderr
    assert seal.is_file()
    assert _texts(url) == [f"message {n:03d}" for n in range(8)]
    with dsh.open(url) as store:  # the rebuilt seal is extended by the next writer
        session = store.session("s1")
        session.append("user/message", user("more"), surface_op="append")
        store.flush(session)
    assert _texts(url)[-1] == "more"

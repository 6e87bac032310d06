"""A third new-user walk: ``dsh search`` on what is not a dsh store, as real ``dsh`` processes."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

DSH = [sys.executable, "-m", "dsh.cli"]


def dsh(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``dsh args`` with HOME ``tmp_path``, its ``~/.dsh`` the default store (no DSH_ variable)."""
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_API_KEY") and not k.startswith("DSH_")}
    env["HOME"] = str(tmp_path)
    return subprocess.run([*DSH, *args], env=env, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


def foreign_db(tmp_path: Path, ddl: str) -> Path:
    """``~/.dsh/sessions.db`` made by another program (mode 0600, as dsh requires)."""
    path = tmp_path / ".dsh" / "sessions.db"
    path.parent.mkdir()
    with sqlite3.connect(path) as conn:
        conn.execute(ddl)
    conn.close()
    path.chmod(0o600)
    return path


def test_search_in_a_foreign_sqlite_database_is_refused_as_ls_refuses_it(
        tmp_path: Path) -> None:
    # before: "no message holds 'port' in 0 sessions", exit 0, and a search index
    # sessions.db.dsh-search.db written beside another program's database
    path = foreign_db(tmp_path, "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    listed = dsh(tmp_path, "ls")
    assert listed.returncode == 1 and "error[FOREIGN_DATABASE]" in listed.stderr
    searched = dsh(tmp_path, "search", "port")
    assert searched.returncode == 1
    assert searched.stderr == listed.stderr  # the same one line, naming the file
    assert str(path) in searched.stderr and searched.stdout == ""
    # what to do, not only what is wrong (before: "... it is not a dsh session store")
    assert searched.stderr.endswith(
        "it is not a dsh session store; dsh leaves it as it is: give the path of a dsh store or "
        "a new file name (--store, or DSH_HOME for the default $DSH_HOME/sessions.db)\n")
    assert sorted(p.name for p in path.parent.iterdir()) == ["sessions.db"]


def test_search_in_a_foreign_database_with_a_sessions_table_is_no_bug(tmp_path: Path) -> None:
    # before: error[BUG]: unexpected OperationalError: no such column: s.incarnation
    path = foreign_db(tmp_path, "CREATE TABLE sessions (id TEXT PRIMARY KEY, name TEXT)")
    searched = dsh(tmp_path, "search", "port")
    assert searched.returncode == 1
    assert searched.stderr.startswith("error[FOREIGN_DATABASE]: SQLite database ")
    assert "BUG" not in searched.stderr
    assert sorted(p.name for p in path.parent.iterdir()) == ["sessions.db"]


def test_search_in_a_foreign_database_forging_dsh_application_id_is_refused(
        tmp_path: Path) -> None:
    # the header's application id is a hint only: another program's database that carries
    # dsh's (PRAGMA application_id = 0x44534850) took the connection-free path, so search
    # wrote sessions.db.dsh-search.db beside it and answered "0 sessions" (exit 0), or
    # error[BUG] (no such column: s.incarnation) with a sessions table, where ls says
    # FOREIGN_DATABASE
    for ddl in ("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)",
                "CREATE TABLE sessions (id TEXT PRIMARY KEY, name TEXT)"):
        home = tmp_path / ddl.split()[2]
        home.mkdir()
        path = foreign_db(home, ddl)
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA application_id = 1146308688")
        conn.close()
        assert path.read_bytes()[68:72] == b"DSHP"
        listed = dsh(home, "ls")
        assert listed.returncode == 1 and "error[FOREIGN_DATABASE]" in listed.stderr
        searched = dsh(home, "search", "port")
        assert (searched.returncode, searched.stderr, searched.stdout) == (1, listed.stderr, "")
        assert sorted(p.name for p in path.parent.iterdir()) == ["sessions.db"]


def test_search_in_a_folder_that_is_no_store_is_refused_and_writes_no_index(
        tmp_path: Path) -> None:
    # before: "no message holds 'port' in 0 sessions", exit 0, and .dsh-search.db written
    # into the folder (dsh ls says NOT_A_STORE there)
    docs = tmp_path / "docs"
    (docs / "img").mkdir(parents=True)
    (docs / "notes.txt").write_text("the port is 8080\n")
    searched = dsh(tmp_path, "search", "port", "--store", str(docs))
    assert searched.returncode == 1
    assert searched.stderr == dsh(tmp_path, "ls", "--store", str(docs)).stderr
    assert searched.stderr.startswith(f"error[NOT_A_STORE]: jsonl://{docs} is not a dsh store")
    assert sorted(p.name for p in docs.iterdir()) == ["img", "notes.txt"]
    # an empty folder is an empty store: searched, as before
    empty = tmp_path / "empty"
    empty.mkdir()
    found = dsh(tmp_path, "search", "port", "--store", str(empty))
    assert found.returncode == 0
    assert found.stderr == "no message holds 'port' in 0 sessions\n"


def test_search_in_a_store_of_the_examples_still_finds_hits(tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    assert dsh(tmp_path, "import", "--examples", "--store", str(store)).returncode == 0
    found = dsh(tmp_path, "search", "port", "--store", str(store))
    assert found.returncode == 0, found.stderr
    assert "33333333-2222-4333-8444-555555555555" in found.stdout
    # a second search, on a current index, the same
    assert dsh(tmp_path, "search", "port", "--store", str(store)).stdout == found.stdout

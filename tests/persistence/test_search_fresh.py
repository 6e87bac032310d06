"""The search index is never stale, without a stat of every log (docs/stores.md#search).

A JSONL store's writers name their session in ``.dsh-search.journal`` before changing its log
and again when they close with the index holding it exactly; a search stats only the sessions
still named, and lists session folders only when a project folder changed. A SQLite store's
sessions rows are compared with the index in one query.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import dsh
from tests.persistence.test_search import _write

ROOT = Path(__file__).resolve().parents[2]


def _found(url: str, query: str) -> list[tuple[str, int]]:
    with dsh.open(url) as store:
        return [(h.session_id, h.seq) for h in store.search(query).hits]


def _journal(root: Path) -> list[dict[str, object]]:
    path = root / ".dsh-search.journal"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_jsonl_writer_names_its_session_and_a_clean_close_unnames_it(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    url = f"jsonl:{root}"
    _write(url, "a", ["alpha words"])
    assert [line["w"] for line in _journal(root)] == ["a"]  # before its first byte
    with dsh.open(url) as store:
        assert store.search("words").reindexed == 1  # the first search: every log stat'ed
    # the writer left no index behind it (there was none): its line stays while its process
    # (this one) lives
    assert [line.get("w") for line in _journal(root)] == ["a"]
    _write(url, "a", ["alpha words", "more words"])  # kept at flush, then closed cleanly
    _write(url, "b", ["bravo words"])
    assert [next(iter(line)) for line in _journal(root)] == ["w", "w", "c", "w", "c"]
    with dsh.open(url) as store:
        found = store.search("words")
        assert found.reindexed == 0 and found.sessions == 2
        assert [(h.session_id, h.seq) for h in found.hits] == [("b", 2), ("a", 8), ("a", 2)]
    assert _journal(root) == []  # every session closed cleanly: nothing is watched


def test_a_jsonl_session_whose_flush_missed_the_index_is_found(tmp_path: Path) -> None:
    """The index was busy at the writer's flush: the session stays named until a search."""
    root = tmp_path / "logs"
    url = f"jsonl:{root}"
    _write(url, "a", ["alpha words"])
    assert _found(url, "alpha") == [("a", 2)]
    busy = sqlite3.connect(root / ".dsh-search.db", isolation_level=None)
    busy.execute("BEGIN IMMEDIATE")  # the writer's note waits 50 ms, then gives up
    try:
        _write(url, "a", ["alpha words", "zulu appended"])
    finally:
        busy.execute("ROLLBACK")
        busy.close()
    assert _journal(root)[-1]["w"] == "a"  # no clean close
    with dsh.open(url) as store:
        found = store.search("zulu")
        assert found.reindexed == 1 and [(h.session_id, h.seq) for h in found.hits] == [("a", 8)]


def test_a_jsonl_session_written_by_a_process_now_dead_is_found_then_unnamed(
        tmp_path: Path) -> None:
    root = tmp_path / "logs"
    url = f"jsonl:{root}"
    _write(url, "a", ["alpha words"])
    assert _found(url, "alpha") == [("a", 2)]
    # a writer whose notes never reach the index (as if it were always busy), then exits
    child = ("import sys, dsh.persistence.jsonl._backend as b\n"
             "b.note_search = lambda *args: False\n"
             "from tests.persistence.test_search_fresh import _write\n"
             "_write(sys.argv[1], 'ghost', ['yankee from a child'])\n")
    subprocess.run([sys.executable, "-c", child, url], cwd=ROOT, check=True)
    assert [line.get("w") for line in _journal(root)][-1] == "ghost"
    assert _found(url, "yankee") == [("ghost", 2)]
    assert "ghost" not in [line.get("w") for line in _journal(root)]  # its writer is dead


def test_a_removed_jsonl_session_is_not_found_and_one_moved_back_is(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    url = f"jsonl:{root}"
    _write(url, "a", ["alpha words"])
    _write(url, "b", ["bravo words"])
    assert {sid for sid, _ in _found(url, "words")} == {"a", "b"}
    folder = next(root.glob("*/b"))
    aside = tmp_path / "aside"
    folder.rename(aside)  # another program moves the session away
    with dsh.open(url) as store:
        found = store.search("words")
        assert found.sessions == 1 and [h.session_id for h in found.hits] == ["a"]
    aside.rename(folder)
    assert {sid for sid, _ in _found(url, "words")} == {"a", "b"}
    shutil.rmtree(folder)
    assert [sid for sid, _ in _found(url, "words")] == ["a"]


def test_a_jsonl_log_changed_by_another_program_is_found_by_the_next_full_sweep(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that keeps no journal (another program) is caught within FULL_SWEEP_S."""
    from dsh.persistence.jsonl import _backend

    root = tmp_path / "logs"
    url = f"jsonl:{root}"
    root.mkdir()
    assert _found(url, "alpha") == []  # the index exists before the first session
    _write(url, "a", ["alpha words"])  # kept at flush, closed cleanly: not watched
    assert _found(url, "alpha") == [("a", 2)] and _journal(root) == []
    monkeypatch.setattr(_backend, "mark_writing", lambda root, sid: None)
    monkeypatch.setattr(_backend, "note_search", lambda *args: False)
    _write(url, "a", ["alpha words", "xray in place"])
    monkeypatch.undo()
    assert _found(url, "xray") == []  # the documented limit: not named, so not stat'ed yet
    index = sqlite3.connect(root / ".dsh-search.db")
    with index:
        index.execute("UPDATE jsonl_sweep SET at_ns = 0")  # the last full sweep is old
    index.close()
    assert _found(url, "xray") == [("a", 8)]


def test_a_sqlite_search_compares_the_sessions_rows_with_the_index(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    url = f"sqlite:{db}"
    _write(url, "a", ["alpha words"])
    _write(url, "b", ["bravo words"])
    with dsh.open(url) as store:
        assert store.search("words").reindexed == 2
        assert store.search("words").reindexed == 0
    _write(url, "c", ["charlie words"])  # a session written after the index was built
    _write(url, "a", ["alpha words", "more words"])
    with dsh.open(url) as store:
        found = store.search("words")
        assert found.reindexed == 2 and found.sessions == 3
        assert {(h.session_id, h.seq) for h in found.hits} == {
            ("a", 2), ("a", 8), ("b", 2), ("c", 2)}
    conn = sqlite3.connect(db)
    with conn:  # removed by another program
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("DELETE FROM sessions WHERE id = 'b'")
    conn.close()
    with dsh.open(url) as store:
        found = store.search("words")
        assert found.sessions == 2 and "b" not in {h.session_id for h in found.hits}

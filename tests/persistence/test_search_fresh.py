"""The search index is never stale, without a stat of every log (docs/stores.md#search).

A JSONL store's writers name their session in ``.dsh-search.journal`` before changing its log
and again when they close with the index holding it exactly; a search stats only the sessions
still named, and lists session folders only when a project folder changed. A SQLite store's
sessions rows are compared with the index in one query; a PostgreSQL store's too, unless its
change count is the one the index caught up with.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import dsh
from dsh.testing import LogBuilder
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


def _pg(url: str, query: str, *params: object) -> list[tuple[object, ...]]:
    import psycopg

    from dsh.testing._stores import postgres_base_url

    schema = url.split("schema=")[1].split("&")[0]
    with psycopg.connect(postgres_base_url(), autocommit=True) as conn:
        cur = conn.execute(query.replace("{s}", f'"{schema}"'), params)
        return cur.fetchall() if cur.description else []


@pytest.fixture
def pg_url() -> Iterator[str]:
    from dsh.testing._stores import postgres_unreachable, temporary_postgres_url

    reason = postgres_unreachable()
    if reason is not None:
        pytest.skip(f"SKIPPED LOUDLY: {reason}")
    with temporary_postgres_url() as url:
        yield url


def test_every_committed_change_of_a_postgres_sessions_row_bumps_the_store_count(
        pg_url: str) -> None:
    """Migration 11: a create, an append, a deleted row each add to ``store_changes`` at commit;
    a lease taken or renewed (no new revision) does not (docs/formats.md#tables-and-migrations).
    """
    def count() -> int:
        return int(str(_pg(pg_url, "SELECT sum(n) FROM {s}.store_changes")[0][0]))

    from dsh.persistence import open_backend
    from dsh.testing._logs import header

    backend = open_backend(pg_url)
    try:
        assert not backend.exists("a")  # the schema is laid out at first use
        assert count() == 0
        backend.create(header("a"))
        assert count() == 1
        with backend.open("a", "write") as handle:
            assert count() == 1  # the lease moved no revision
            log = LogBuilder("a")
            log.completed_turn("hello")
            handle.append(log.events)
            handle.flush()
            assert count() == 2
        _pg(pg_url, "DELETE FROM {s}.sessions WHERE id = 'a'")  # by any program
        assert count() == 3
    finally:
        backend.close()


def test_a_postgres_search_of_an_unchanged_store_reads_no_sessions_row(pg_url: str) -> None:
    """The index records the store's change count it caught up with; while the count is the
    same the sessions rows are not compared (an index row changed behind its back goes
    unnoticed), and the next committed change brings the comparison back.
    Rule: docs/stores.md#search.
    """
    _write(pg_url, "a", ["alpha words"])
    _write(pg_url, "b", ["bravo words"])
    with dsh.open(pg_url) as store:
        first = store.search("words")
        assert (first.reindexed, first.sessions) == (2, 2)
        _pg(pg_url, "UPDATE {s}.search_indexed SET signature = 'x:0' WHERE session_id = 'a'")
        again = store.search("words")
        assert (again.reindexed, again.sessions, again.hits) == (0, 2, first.hits)
    _write(pg_url, "c", ["charlie words"])  # a new session: the count moved
    with dsh.open(pg_url) as store:
        found = store.search("words")
        assert (found.reindexed, found.sessions) == (2, 3)  # a (signature off) and c
        assert sorted(h.session_id for h in found.hits) == ["a", "b", "c"]
        assert store.search("words").reindexed == 0


def test_a_postgres_search_that_lost_a_race_records_nothing(pg_url: str) -> None:
    """Two searches bring the index up to date at once: the one whose session row another
    changed first writes nothing for it and records no change count, so the next search
    compares the rows again (docs/stores.md#search)."""
    from dsh.persistence import Persistence, open_backend
    from dsh.persistence._search import IndexesSearch

    _write(pg_url, "a", ["alpha words"])
    persistence = Persistence(open_backend(pg_url))
    try:
        backend = persistence.backend
        assert isinstance(backend, IndexesSearch)
        slow, fast = backend.search_index(), backend.search_index()
        try:
            [(sid, sig, old)] = slow.changes().changed
            assert old is None and len(fast.changes().changed) == 1
            fast.put(sid, sig, 1, [(2, "user", "written by the other search")], fresh=False)
            slow.put(sid, sig, 1, [(2, "user", "stale")], fresh=False)
            slow.settle([])
            assert _pg(pg_url, "SELECT text FROM {s}.search_messages") == [
                ("written by the other search",)]
            assert _pg(pg_url, "SELECT count(*) FROM {s}.search_state") == [(0,)]
            fast.settle([])
        finally:
            slow.close()
            fast.close()
        assert _pg(pg_url, "SELECT count(*) FROM {s}.search_state") == [(1,)]
    finally:
        persistence.close()


def test_the_full_sweep_signs_every_log_as_a_stat_of_it_does(tmp_path: Path) -> None:
    """The sweep (stat'ed relative to each project folder) gives each log's own signature."""
    import os

    from dsh.persistence._search import decode_segment, jsonl_signature, jsonl_signatures

    plain, zstd = tmp_path / "logs", tmp_path / "zlogs"
    _write(f"jsonl:{plain}", "a", ["alpha words"])
    _write(f"jsonl:{plain}", "b/c é", ["charlie words"])  # a folder name with escapes
    _write(f"jsonl+zstd://{zstd}", "z", ["zulu words"])
    (plain / "_no-cwd" / "no-log-here").mkdir()  # a folder without a log: not a session
    for root, ids, name in ((plain, ["a", "b/c é"], "session.jsonl"),
                            (zstd, ["z"], "session.jsonl.zstd")):
        logs = list(root.rglob(name))
        signed = jsonl_signatures(root)
        assert sorted(signed) == ids and len(logs) == len(ids)
        assert {decode_segment(p.parent.name): jsonl_signature(os.stat(p)) for p in logs} \
            == signed

"""Store search (dsh.persistence.search): the FTS5 index beside SQLite and JSONL stores."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import dsh
from dsh.json import dumps
from dsh.persistence import search
from dsh.testing import LogBuilder
from dsh.testing._stores import postgres_unreachable, temporary_postgres_url


def _write(url: str, session_id: str, texts: list[str]) -> None:
    log = LogBuilder(session_id)
    for text in texts:
        log.completed_turn(text)
    with dsh.open(url) as store:
        session = store.session(session_id)
        for event in log.events[len(session.events):]:
            session.append(event["type"], event["data"], surface_op=event.get("surfaceOp"))


@contextlib.contextmanager
def _store_url(tmp_path: Path, kind: str) -> Iterator[str]:
    """A fresh store of ``kind`` (sqlite, jsonl, postgresql: a schema dropped afterwards)."""
    if kind != "postgresql":
        yield f"sqlite:{tmp_path / 's.db'}" if kind == "sqlite" else f"jsonl:{tmp_path / 'l'}"
        return
    reason = postgres_unreachable()
    if reason is not None:
        pytest.skip(f"SKIPPED LOUDLY: {reason}")
    with temporary_postgres_url() as url:
        yield url


@contextlib.contextmanager
def _store_holding(tmp_path: Path, kind: str, texts: dict[str, str]) -> Iterator[dsh.Store]:
    """A fresh store of ``kind`` (or ``memory``) holding one completed turn per session id,
    its prompt the text given."""
    if kind == "memory":
        url_context: contextlib.AbstractContextManager[str] = contextlib.nullcontext("memory:")
    else:
        url_context = _store_url(tmp_path, kind)
    with url_context as url, dsh.open(url) as store:
        for sid, text in texts.items():
            log = LogBuilder(sid)
            log.completed_turn(text)
            session = store.session(sid)
            for event in log.events:
                session.append(event["type"], event["data"], surface_op=event.get("surfaceOp"))
            store.flush(session)
        yield store


@pytest.mark.parametrize("kind", ["sqlite", "jsonl", "memory"])
def test_search_finds_words_across_sessions_and_follows_the_logs(tmp_path: Path,
                                                                 kind: str) -> None:
    url = {"sqlite": f"sqlite:{tmp_path / 's.db'}", "jsonl": f"jsonl:{tmp_path / 'logs'}",
           "memory": "memory:"}[kind]
    if kind == "memory":
        store = dsh.open(url)
        persistence = store.persistence
        for sid, texts in (("a", ["deploy the Café service", "then nothing"]),
                           ("b", ["café au lait please"])):
            log = LogBuilder(sid)
            for text in texts:
                log.completed_turn(text)
            session = store.session(sid)
            for event in log.events:
                session.append(event["type"], event["data"], surface_op=event.get("surfaceOp"))
            store.flush(session)
        found = search(persistence, "cafe")
        assert not found.indexed and {(h.session_id, h.seq) for h in found.hits} == {
            ("a", 2), ("b", 2)}
        store.close()
        return
    _write(url, "a", ["deploy the Café service", "then nothing"])
    _write(url, "b", ["café au lait please"])
    with dsh.open(url) as store:
        first = search(store.persistence, "CAFE")
        assert first.indexed and first.reindexed == 2 and first.sessions == 2
        assert [(h.session_id, h.seq, h.role, h.match) for h in first.hits] == [
            ("b", 2, "user", "café"), ("a", 2, "user", "Café")]
        assert first.hits[1].snippet == "deploy the Café service"
        assert [h.seq for h in search(store.persistence, "answer 2").hits] == [9]  # all words
        assert [h.match for h in search(store.persistence, "depl").hits] == ["deploy"]  # prefix
        assert search(store.persistence, "  ...  ").hits == ()
        again = search(store.persistence, "cafe")
        assert again.reindexed == 0 and again.hits == first.hits  # nothing changed, nothing read
    _write(url, "a", ["deploy the Café service", "then nothing", "more café"])
    with dsh.open(url) as store:
        grown = search(store.persistence, "cafe")
        assert grown.reindexed == (0 if kind == "jsonl" else 1)  # JSONL: kept at flush
        assert [(h.session_id, h.seq) for h in grown.hits] == [("a", 14), ("b", 2), ("a", 2)]
        path = store.persistence.backend.search_index().path
        assert path is not None and path.exists() and path.stat().st_mode & 0o777 == 0o600
        path.unlink()  # the index is only derived: the next search builds it again
        rebuilt = search(store.persistence, "cafe")
        assert rebuilt.reindexed == 2 and set(rebuilt.hits) == set(grown.hits)
        assert set(search(store.persistence, "cafe", rebuild=True).hits) == set(grown.hits)


def test_dsh_search_prints_hits_escaped_and_as_json(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 's.db'}"
    # a terminal escape sequence is indexed and shown as a space (docs/stores.md#search); a
    # lone control character stays, printed as its escape
    _write(url, "evil", ["look \x1b[2J\x07 here: needle in the haystack"])
    _write(url, "other", ["no match"])
    env = {"NO_COLOR": "1", "COLUMNS": "200", "HOME": str(tmp_path),
           "DSH_HOME": str(tmp_path / "home")}
    run = [sys.executable, "-m", "dsh.cli", "search", "needle", "--store", url]
    text = subprocess.run(run, capture_output=True, text=True, env=env, check=True).stdout
    assert text == "evil  #2  user  look \\x07 here: needle in the haystack\n"
    as_json = json.loads(subprocess.run([*run, "--json"], capture_output=True, text=True,
                                        env=env, check=True).stdout)
    assert as_json["hits"] == [{"session": "evil", "seq": 2, "role": "user", "match": "needle",
                                "snippet": "look \\x07 here: needle in the haystack",
                                "removed": None}]
    assert (as_json["sessions"], as_json["indexed"], as_json["unreadable"]) == (2, True, [])
    # Several words need no quotes: `dsh search needle haystack` is the quoted query.
    two = subprocess.run([*run[:5], "haystack", *run[5:]], capture_output=True, text=True,
                         env=env, check=True).stdout
    assert two == text
    none = subprocess.run([*run[:4], "haystacks", *run[5:]], capture_output=True, text=True,
                          env=env, check=True)
    assert none.stdout == "" and none.stderr == "no message holds 'haystacks' in 2 sessions\n"


def test_postgres_search_keeps_its_index_in_its_schema() -> None:
    reason = postgres_unreachable()
    if reason is not None:
        pytest.skip(f"SKIPPED LOUDLY: {reason}")
    with temporary_postgres_url() as url:
        _postgres_search(url)


def _postgres_search(url: str) -> None:
    _write(url, "a", ["deploy the Café service", "then nothing"])
    _write(url, "b", ["café au lait please"])
    with dsh.open(url) as store:
        first = store.search("CAFE")
        assert first.indexed and first.reindexed == 2
        assert {(h.session_id, h.seq, h.match) for h in first.hits} == {
            ("a", 2, "Café"), ("b", 2, "café")}
        assert [h.seq for h in store.search("answer 2").hits] == [9]
        assert store.search("cafe").reindexed == 0
    _write(url, "a", ["deploy the Café service", "then nothing", "more café"])
    with dsh.open(url) as store:
        grown = store.search("depl")
        assert grown.reindexed == 1 and [h.match for h in grown.hits] == ["deploy"]
        assert len(store.search("cafe", rebuild=True).hits) == 3


def test_a_jsonl_writer_keeps_the_index_at_flush_and_a_broken_index_never_fails_it(
        tmp_path: Path) -> None:
    url = f"jsonl:{tmp_path / 'logs'}"
    _write(url, "a", ["first words"])
    with dsh.open(url) as store:
        assert store.search("first").reindexed == 1  # the index exists from here on
    _write(url, "a", ["first words", "second café"])
    with dsh.open(url) as store:
        kept = store.search("cafe")
        assert kept.reindexed == 0 and [(h.session_id, h.seq) for h in kept.hits] == [("a", 8)]
    index = tmp_path / "logs" / ".dsh-search.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{index}{suffix}").unlink(missing_ok=True)
    index.write_bytes(b"not a database at all, " * 100)
    _write(url, "a", ["first words", "second café", "third try"])  # the flush does not fail
    with dsh.open(url) as store:
        assert [h.seq for h in store.search("third").hits] == [14]  # an index in memory
        assert store.read("a").stored_events[-1]["type"] == "turn/end"


def test_a_jsonl_writer_adds_a_new_session_to_the_index_at_its_first_flush(
        tmp_path: Path) -> None:
    """A session the index does not hold yet is added by its first flush (its whole log).

    Rule: docs/stores.md#search. The next search then reads no log; a session whose first
    flush came before the index existed is still caught up by the search.
    """
    url = f"jsonl:{tmp_path / 'logs'}"
    _write(url, "early", ["before the index"])
    with dsh.open(url) as store:
        assert store.search("index").reindexed == 1  # the index exists from here on
    _write(url, "new", ["a brand new session"])
    with dsh.open(url) as store:
        found = store.search("brand")
        assert found.reindexed == 0 and [h.session_id for h in found.hits] == ["new"]
        assert [h.session_id for h in store.search("session").hits] == ["new"]
        assert {h.session_id for h in store.search("index").hits} == {"early"}


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_a_redacted_word_is_no_longer_found(tmp_path: Path, kind: str) -> None:
    from dsh.rights import redact

    url = f"sqlite:{tmp_path / 's.db'}" if kind == "sqlite" else f"jsonl:{tmp_path / 'logs'}"
    _write(url, "a", ["the password is hunter2 today", "nothing here"])
    with dsh.open(url) as store:
        assert [h.seq for h in store.search("hunter2").hits] == [2]
        index = store.persistence.backend.search_index().path
        assert index is not None and index.exists()
        result = redact(store, "a", match=r"hunter2")
        assert {"path": str(index), "action": "search index deleted"} in [
            dict(t) for t in result.touched]
        assert not index.exists()  # deleted whole: FTS5 keeps deleted text in free pages
        assert store.search("hunter2").hits == ()
        assert [h.seq for h in store.search("password").hits] == [2]


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_search_leaves_out_the_trash_unless_asked_and_still_fills_its_limit(
        tmp_path: Path, kind: str) -> None:
    from dsh.rights import restore, trash

    url = f"sqlite:{tmp_path / 's.db'}" if kind == "sqlite" else f"jsonl:{tmp_path / 'logs'}"
    _write(url, "kept", ["needle one"])
    with dsh.open(url) as store:
        assert len(store.search("needle").hits) == 1
    _write(url, "binned", [f"needle {n}" for n in range(5)])  # indexed later: its hits first
    with dsh.open(url) as store:
        assert [h.session_id for h in store.search("needle", limit=2).hits] == ["binned"] * 2
        trash(store, ["binned"])
        left = store.search("needle", limit=2)
        assert [(h.session_id, h.seq) for h in left.hits] == [("kept", 2)]
        assert left.sessions == 1
        every = store.search("needle", limit=10, trash=True)
        assert sorted({h.session_id for h in every.hits}) == ["binned", "kept"]
        assert len(every.hits) == 6 and every.sessions == 2
        restore(store, ["binned"])
        back = store.search("needle", limit=10)
        assert len(back.hits) == 6
        # docs/stores.md#search: the store log (it holds trashed, restored) is never counted
        assert back.sessions == 2
        assert store.persistence.read(".dsh-store-log").stored_events


def test_dsh_search_trash_flag_and_a_query_without_a_word(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 's.db'}"
    _write(url, "binned", ["needle in the bin"])
    env = {"NO_COLOR": "1", "COLUMNS": "200", "HOME": str(tmp_path),
           "DSH_HOME": str(tmp_path / "home")}
    cli = [sys.executable, "-m", "dsh.cli"]
    subprocess.run([*cli, "rm", "binned", "--store", url], env=env, check=True,
                   capture_output=True)
    hidden = subprocess.run([*cli, "search", "needle", "--store", url], capture_output=True,
                            text=True, env=env)
    assert (hidden.returncode, hidden.stdout) == (0, "")
    assert hidden.stderr == "no message holds 'needle' in 0 sessions\n"
    shown = subprocess.run([*cli, "search", "needle", "--trash", "--store", url],
                           capture_output=True, text=True, env=env, check=True)
    assert shown.stdout == "binned  #2  user  needle in the bin\n"
    missing = subprocess.run([*cli, "search", "needle"], capture_output=True, text=True,
                             env=env)  # no default store yet: a read creates none
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr.startswith("error[STORE_NOT_FOUND]: no store yet"), missing.stderr
    assert not (tmp_path / "home").exists()
    subprocess.run([*cli, "init"], env=env, check=True, capture_output=True)
    empty = subprocess.run([*cli, "search", "needle"], capture_output=True, text=True,
                           env=env)  # the default store, created empty
    assert (empty.returncode, empty.stdout) == (0, "")
    assert empty.stderr == "no message holds 'needle' in 0 sessions\n"
    for query in (['"'], ["-"]):
        bad = subprocess.run([*cli, "search", "--store", url, "--", *query], capture_output=True,
                             text=True, env=env)
        assert bad.returncode == 2 and bad.stdout == ""
        assert "holds no word to search for" in bad.stderr, bad.stderr


@pytest.mark.parametrize("kind", ["sqlite", "jsonl", "postgresql"])
def test_no_backend_counts_or_reads_the_store_log(tmp_path: Path, kind: str) -> None:
    """The store log holds no message: every backend's comparison leaves it out of the count
    and never reads it, whether the index is new or catching up (docs/stores.md#search)."""
    from dsh.rights import restore, trash

    with _store_url(tmp_path, kind) as url:
        _write(url, "a", ["needle one"])
        _write(url, "b", ["needle two"])
        with dsh.open(url) as store:
            trash(store, ["b"])
            restore(store, ["b"])  # a store log now, and nothing in the trash
            found = search(store.persistence, "needle")
            assert (found.sessions, found.reindexed, found.store_log) == (2, 2, True)
            assert store.search("needle").sessions == 2
            trash(store, ["b"])  # the store log grew: still not read
            again = search(store.persistence, "needle")
            assert (again.sessions, again.reindexed) == (2, 0)
            assert store.search("needle").sessions == 1


def test_a_sidecar_query_answers_as_the_prefix_query_itself(tmp_path: Path) -> None:
    """The sidecar finds a common last word's hits without FTS5's whole prefix doclist (the
    exact words bound where they can be), with the same hits in the same order as the plain
    ``MATCH '"w1" "w2"*' ORDER BY rowid DESC`` on random texts (docs/formats.md#search-index).
    """
    import random

    from dsh.persistence._search import SidecarIndex, SqliteFreshness, _fts_query

    vocabulary = ["route", "routes", "router", "handler", "handlers", "handle", "hand", "Café",
                  "cafe", "cafés", "ticket", "t04242", "flows", "request", "r", "Handler_x",
                  "zeta", "déjà", "vu"]
    rng = random.Random(24)
    index = SidecarIndex(tmp_path / "i.db", SqliteFreshness(tmp_path / "none.db"))
    try:
        for n in range(60):
            rows = [(seq, "user", " ".join(rng.choices(vocabulary, k=rng.randint(1, 12))))
                    for seq in range(rng.randint(1, 40))]
            index.put(f"s{n}", "x:1", len(rows), rows, fresh=False)
        conn = index.conn
        queries = [["route", "handler"], ["handler"], ["hand"], ["cafe"], ["r"], ["déjà", "v"],
                   ["route", "ha"], ["t04242"], ["zeta", "route", "handlers"], ["absent"],
                   *([rng.choice(vocabulary) for _ in range(rng.randint(1, 3))]
                     for _ in range(40))]
        for words in queries:
            for limit in (1, 3, 20, 500):
                expected = [(str(a), int(b), str(c), str(d)) for a, b, c, d in conn.execute(
                    "SELECT session_id, seq, role, text FROM messages WHERE messages MATCH ? "
                    "ORDER BY rowid DESC LIMIT ?", (_fts_query(words), limit))]
                assert index.query(words, limit) == expected, (words, limit)
        # the newest row holds only a longer word: the exact word's hits do not hide it
        index.put("late", "x:1", 1, [(0, "user", "handlers everywhere")], fresh=False)
        assert [hit[0] for hit in index.query(["handler"], 3)][:1] == ["late"]
    finally:
        index.close()


@pytest.mark.parametrize("kind", ["sqlite", "jsonl", "postgresql"])
def test_a_lone_surrogate_in_a_message_is_indexed_and_the_rest_is_found(
        tmp_path: Path, kind: str) -> None:
    """A lone surrogate is valid in a dsh log (docs/formats.md#lossless-json) but no UTF-8 for
    the index: it is indexed as U+FFFD, so the store stays searchable (before:
    UnicodeEncodeError for every search of the store, error[BUG] in dsh search and a 500 in the
    viewer)."""
    with _store_url(tmp_path, kind) as url:
        _write(url, "a", ["broken \ud800 needle here"])
        _write(url, "b", ["plain needle"])
        with dsh.open(url) as store:
            found = store.search("needle")
            assert sorted({hit.session_id for hit in found.hits}) == ["a", "b"]
            texts = [hit.snippet for hit in found.hits if hit.session_id == "a"]
            assert any("broken \ufffd needle" in text for text in texts), texts
            # the log keeps its text: only the index holds the replacement
            assert any(b"broken \\ud800 needle" in dumps(event["data"])
                       for event in store.session("a").events)


def test_a_damaged_session_in_the_trash_is_not_named_unless_the_trash_is_searched(
        tmp_path: Path) -> None:
    """A trashed session is out of a search, its damage too: `unreadable` names it only with
    trash=True (docs/stores.md#search; before: dsh search said a session the user had removed
    was left out)."""
    from dsh.rights import trash

    url = f"jsonl:{tmp_path / 'logs'}"
    _write(url, "kept", ["needle one"])
    _write(url, "binned", ["needle two"])
    with dsh.open(url) as store:
        trash(store, ["binned"])
    log = next((tmp_path / "logs").rglob("binned/session.jsonl"))
    log.write_bytes(log.read_bytes().replace(b"needle two", b"needle 2wo"))
    with dsh.open(url) as store:
        hidden = store.search("needle")
        assert ([h.session_id for h in hidden.hits], hidden.unreadable) == (["kept"], ())
        shown = store.search("needle", trash=True)
        assert shown.unreadable == ("binned",)


@pytest.mark.parametrize("kind", ["sqlite", "jsonl", "postgresql", "memory"])
def test_a_word_glued_to_a_terminal_escape_sequence_is_found(tmp_path: Path, kind: str) -> None:
    """Escape sequences are no text (docs/stores.md#search): before, "\\x1b[31mError" was the
    token "31mError" and a search for Error missed it (the memory store's word scan too)."""
    with _store_holding(tmp_path, kind, {
            "a": "\x1b[31mError\x1b[0m: disk full",
            "b": "see \x1b]8;;https://x.test\x1b\\Docs\x1b]8;;\x1b\\ and \x9b1mBold",
            "c": "no match here"}) as store:
        found = store.search("Error")
        assert [(hit.session_id, hit.snippet) for hit in found.hits] == [
            ("a", " Error : disk full")]  # each sequence indexed as one space
        assert [hit.session_id for hit in store.search("docs bold").hits] == ["b"]
        assert [hit.session_id for hit in store.search("31mError").hits] == []


@pytest.mark.parametrize("kind", ["sqlite", "jsonl", "postgresql", "memory"])
def test_diacritics_fold_both_ways_and_a_decomposed_word_is_one_word(tmp_path: Path,
                                                                    kind: str) -> None:
    """Case and diacritics fold both ways, on every backend alike (docs/stores.md#search):
    ``ü`` is ``u``, so as the last word (a prefix) it finds every word starting with either.
    A word typed or stored decomposed (``u`` + U+0308) is one word: before, the query split it
    into ``u`` and ``ber`` (nothing found) and a snippet's match stopped at the mark (``u``)."""
    with _store_holding(tmp_path, kind, {
            "a": "über alles", "b": "uber rides", "c": "Übung macht", "d": "user guide",
            "e": "u\u0308berall decomposed", "f": "nothing here"}) as store:
        def found(query: str) -> list[tuple[str, str]]:
            return sorted((hit.session_id, hit.match) for hit in store.search(query).hits)

        assert found("ü") == [("a", "über"), ("b", "uber"), ("c", "Übung"), ("d", "user"),
                              ("e", "u\u0308berall")]
        for query in ("über", "uber", "ÜBER", "u\u0308ber"):
            assert found(query) == [("a", "über"), ("b", "uber"), ("e", "u\u0308berall")], query
        assert found("u\u0308bera") == [("e", "u\u0308berall")]


TITLED = "build ok\x1b]0;exfil secret-token\x07\x1b[2Jdone \x1b]2;second\x1b\\ end"


@pytest.mark.parametrize("kind", ["sqlite", "jsonl", "postgresql", "memory"])
def test_a_word_inside_a_terminal_title_is_found(tmp_path: Path, kind: str) -> None:
    """An OSC's payload is words (docs/stores.md#search): before, the whole title sequence was
    indexed as one space, so text hidden in a terminal title could not be found."""
    with _store_holding(tmp_path, kind, {"titled": TITLED, "plain": "no title here"}) as store:
        for query, match in (("exfil", "exfil"), ("secret token", "secret"),
                             ("second", "second"), ("done", "done")):
            hits = store.search(query).hits
            assert [(h.session_id, h.match) for h in hits] == [("titled", match)], query
            # introducer and terminator are spaces: the snippet holds no control character
            assert hits[0].snippet == "build ok exfil secret-token done second end"
            assert not any(ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 for c in hits[0].snippet)
        assert store.search("0 exfil").hits == ()  # the numeric parameter is no word
        assert store.search("2J").hits == ()  # a CSI is still one space


@pytest.mark.parametrize("kind", ["sqlite", "jsonl", "postgresql"])
def test_an_index_that_dropped_title_words_is_built_again(tmp_path: Path, kind: str) -> None:
    # docs/formats.md#search-index: version 2 (mark "dsh search index 2") indexed an OSC title,
    # its words too, as one space; such an index is emptied and built again, so the title's
    # words are found without a --rebuild
    import sqlite3

    with _store_url(tmp_path, kind) as url:
        _write(url, "a", [TITLED])
        with dsh.open(url) as store:
            assert [hit.session_id for hit in store.search("exfil").hits] == ["a"]
        older = " build ok  done   end"  # what version 2 held
        if kind == "postgresql":
            import psycopg

            schema = url.split("schema=")[1].split("&")[0]
            with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
                conn.execute(f'UPDATE "{schema}".search_messages SET text = %s, folded = %s',
                             (older, older))
                conn.execute(f'COMMENT ON TABLE "{schema}".search_messages IS '
                             "'dsh search index 2'")
        else:
            sidecar = (tmp_path / "s.db.dsh-search.db" if kind == "sqlite"
                       else tmp_path / "l" / ".dsh-search.db")
            with contextlib.closing(sqlite3.connect(sidecar)) as conn:
                conn.execute("UPDATE messages SET text = ?", (older,))
                conn.execute("PRAGMA user_version = 2")
                conn.commit()
        with dsh.open(url) as store:
            again = store.search("exfil")
            assert [hit.session_id for hit in again.hits] == ["a"] and again.reindexed == 1


def test_a_sidecar_of_the_older_index_version_is_built_again(tmp_path: Path) -> None:
    # docs/formats.md#search-index: version 1 indexed "\x1b[31mError" as "31mError"; such a
    # sidecar is dropped and built again, so the word is found without a --rebuild
    import sqlite3

    url = f"sqlite:{tmp_path / 's.db'}"
    _write(url, "a", ["\x1b[31mError\x1b[0m here"])
    with dsh.open(url) as store:
        assert [hit.session_id for hit in store.search("Error").hits] == ["a"]
    sidecar = tmp_path / "s.db.dsh-search.db"
    with contextlib.closing(sqlite3.connect(sidecar)) as conn:
        conn.execute("UPDATE messages SET text = '31mError here'")
        conn.execute("PRAGMA user_version = 1")
        conn.commit()
    with dsh.open(url) as store:
        assert [hit.session_id for hit in store.search("Error").hits] == ["a"]


def test_a_postgres_index_an_older_dsh_filled_is_emptied_and_built_again() -> None:
    # docs/formats.md#search-index: rows without the index mark held "31mError"; they are
    # dropped and every session is indexed again, so the word is found without --rebuild
    reason = postgres_unreachable()
    if reason is not None:
        pytest.skip(f"SKIPPED LOUDLY: {reason}")
    import psycopg

    from dsh.persistence.postgres._search import INDEX_MARK

    with temporary_postgres_url() as url:
        _write(url, "a", ["\x1b[31mError\x1b[0m here"])
        with dsh.open(url) as store:
            assert [hit.session_id for hit in store.search("Error").hits] == ["a"]
        schema = url.split("schema=")[1].split("&")[0]
        server = url.split("?")[0]
        with psycopg.connect(server, autocommit=True) as conn:
            mark = conn.execute(f"SELECT obj_description('\"{schema}\".search_messages'"
                                "::regclass, 'pg_class')").fetchone()
            assert mark == (INDEX_MARK,)
            conn.execute(f'UPDATE "{schema}".search_messages SET text = \'31mError here\', '
                         "folded = '31merror here'")
            conn.execute(f'COMMENT ON TABLE "{schema}".search_messages IS NULL')
        with dsh.open(url) as store:
            again = store.search("Error")
            assert [hit.session_id for hit in again.hits] == ["a"] and again.reindexed == 1


def test_a_snippet_of_a_huge_message_folds_a_window_at_a_time() -> None:
    """A hit in a message of millions of non-ASCII characters costs a window's memory.

    Before, snippet_of folded the whole message into a list of characters and one int per
    character: 2.4 GB and 32 s for a hit in a 21 MB message (dsh search on an imported log).
    """
    import tracemalloc

    from dsh.persistence._search import snippet_of

    text = "Größe héllo " + "ü" * 2_000_000 + " tail"
    tracemalloc.start()
    try:
        hit = snippet_of("s", 1, "user", text, ["hello"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (hit.before, hit.match) == ("Größe ", "héllo")
    assert hit.after.startswith(" üüü") and hit.after.endswith("…")
    assert peak < 8_000_000  # one window's fold (was ~150 MB for 2 M characters)


@pytest.mark.parametrize("at", [65_536 - 700, 65_536 - 3, 65_536 * 3 + 5, 400_000])
def test_a_snippet_finds_the_first_word_wherever_the_windows_fall(at: int) -> None:
    """Across window ends a word is found where a fold of the whole message finds it."""
    from dsh.persistence._search import snippet_of

    text = "é" * at + " Zèbras " + "x" * 10 + " zebra" + "é" * 200_000
    hit = snippet_of("s", 1, "user", text, ["zebra"])
    assert hit.match == "Zèbras"  # the whole word (a prefix match), not the later one
    assert hit.before == "…" + "é" * 59 + " "
    assert snippet_of("s", 1, "user", "é" * at + "xzebra", ["zebra"]).match == ""


@pytest.mark.parametrize("marks", [8, 40, 3000])
def test_a_word_after_combining_marks_across_a_window_start_is_no_word(marks: int) -> None:
    """A window starting inside a run of combining marks (which fold to nothing) still sees
    the letter they sit on before the word: "á́́…word" is one word, as in a whole fold."""
    from dsh.persistence._search import snippet_of

    start = 65_536 - 1_024  # where the second window starts
    text = "z " * ((start - 30) // 2) + "a" + "\u0301" * marks + "word " + "y" * 2000 + " word!"
    hit = snippet_of("s", 1, "user", text, ["word"])
    assert (hit.match, hit.after) == ("word", "!")  # the last word, not the one after "á́…"


def test_an_older_sidecar_another_search_just_built_again_is_not_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/formats.md#search-index: two searches that both open a version 1 sidecar race to
    # build it again; the one that read the old version before the other finished must not
    # drop the tables the other just built and filled (its search would find nothing)
    import sqlite3

    from dsh.persistence import _search

    sidecar = tmp_path / "s.db.dsh-search.db"
    with contextlib.closing(sqlite3.connect(sidecar)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        for statement in _search._SCHEMA:
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")
        conn.commit()
    real_connect = sqlite3.connect

    def other_search_builds_it() -> None:
        other = _search._connect(sidecar)
        other.execute("INSERT INTO indexed VALUES ('a', 'sig', 2)")
        other.execute("INSERT INTO messages VALUES ('Error here', 'a', 1, 'user')")
        other.close()

    class Stale:
        """A connection whose first version read is overtaken by another search's build."""

        def __init__(self, conn: sqlite3.Connection) -> None:
            self._conn, self._raced = conn, False

        def execute(self, sql: str, *args: object) -> object:
            cursor = self._conn.execute(sql, *args)
            if sql == "PRAGMA user_version" and not self._raced:
                self._raced = True
                version = cursor.fetchall()[0]  # done reading, as the caller's fetchone is
                other_search_builds_it()
                return type("Row", (), {"fetchone": lambda _self: version})()
            return cursor

        def __getattr__(self, name: str) -> object:
            return getattr(self._conn, name)

    class Module:
        Error = sqlite3.Error

        @staticmethod
        def connect(*args: object, **kwargs: object) -> object:
            conn = real_connect(*args, **kwargs)  # type: ignore[call-overload]
            first = not opened
            opened.append(conn)
            return Stale(conn) if first else conn

    opened: list[sqlite3.Connection] = []
    monkeypatch.setattr(_search, "sqlite3", Module)
    mine = _search._connect(sidecar)
    assert mine.execute("PRAGMA user_version").fetchone() == (_search.INDEX_VERSION,)
    assert mine.execute("SELECT session_id, events FROM indexed").fetchall() == [("a", 2)]
    assert mine.execute("SELECT text FROM messages").fetchall() == [("Error here",)]
    mine.close()


def test_a_session_cut_mid_line_is_unreadable_and_gives_no_stale_hits(tmp_path: Path) -> None:
    """A session named unreadable contributes no hit, not even one the index held from before
    the damage (docs/stores.md#search; before: a JSONL log cut mid-line after a search was in
    both `hits`, from the old index, and `unreadable`)."""
    url = f"jsonl:{tmp_path / 'logs'}"
    _write(url, "kept", ["needle one"])
    _write(url, "cut", ["needle two", "needle three"])
    with dsh.open(url) as store:
        before = store.search("needle")
        assert sorted({h.session_id for h in before.hits}) == ["cut", "kept"]
        assert before.unreadable == ()
    log = next((tmp_path / "logs").rglob("cut/session.jsonl"))
    data = log.read_bytes()
    log.write_bytes(data[:data.rindex(b"needle three") + 4])  # the log ends mid-line
    with dsh.open(url) as store:
        after = store.search("needle")
        assert ([(h.session_id, h.seq) for h in after.hits], after.unreadable) == (
            [("kept", 2)], ("cut",))
        assert search(store.persistence, "needle", limit=1).hits[0].session_id == "kept"
    env = {"NO_COLOR": "1", "HOME": str(tmp_path), "DSH_HOME": str(tmp_path / "home")}
    as_json = json.loads(subprocess.run(
        [sys.executable, "-m", "dsh.cli", "search", "needle", "--store", url, "--json"],
        capture_output=True, text=True, env=env, check=True).stdout)
    assert ([h["session"] for h in as_json["hits"]], as_json["unreadable"]) == (["kept"], ["cut"])

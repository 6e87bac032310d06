"""``Persistence.list_entries``: listing from the store's own index, equal to a full read.

SQLite answers from its tables; JSONL from the ``.dsh-listing.json`` sidecar, whose entry for a
log is used only while the log's stat signature is unchanged and is rebuilt otherwise.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh._errors import DshError
from dsh.persistence import Persistence, Reseals, open_backend
from dsh.persistence._listing import INDEX_NAME, JOURNAL_NAME, ListingEntry, summarize
from dsh.session._session import Session
from dsh.session._store import SessionStore
from dsh.testing._stores import postgres_unreachable, temporary_postgres_url
from tests.strategies import StepClock, apply_script, examples, log_scripts

URLS = {
    "jsonl": "jsonl://{root}/store",
    "jsonl-zstd": "jsonl+zstd://{root}/store",
    "sqlite": "sqlite://{root}/store.db",
    "sqlite-14": "sqlite://{root}/store.db?schema=14",
    "memory": "memory:",
    "postgresql": "",  # a fresh schema each time (see opened)
}
POSTGRES_SKIP = postgres_unreachable()


@contextlib.contextmanager
def opened(kind: str, root: Path) -> Iterator[Persistence]:
    """A store of ``kind`` under ``root`` (PostgreSQL: a throw-away schema)."""
    if kind != "postgresql":
        with Persistence(open_backend(URLS[kind].format(root=root))) as persistence:
            yield persistence
        return
    if POSTGRES_SKIP is not None:
        pytest.skip(f"SKIPPED LOUDLY: {POSTGRES_SKIP}")
    with temporary_postgres_url() as url, Persistence(open_backend(url)) as persistence:
        yield persistence


def user(text: str, kind: str = "user", n: int = 0) -> dict[str, Any]:
    return {"id": f"u{n}-{text[:3]}", "role": "user", "source": {"kind": kind},
            "content": [{"type": "text", "text": text}]}


def write(persistence: Persistence, sid: str, build: Any, step: int = 1) -> None:
    store = SessionStore(persistence=persistence, clock=StepClock(step=step))
    session = store.create(sid)
    build(session)
    store.flush(session)
    store.dispose(session)


def titled(session: Session) -> None:
    session.append("turn/start", {"turn": 1})
    session.append("user/message", user("   "), surface_op="append")  # blank: not a prompt
    session.append("user/message", user("ctx", kind="plugin", n=1) | {"source": {
        "kind": "plugin", "plugin": "notes", "form": "notice", "summary": "n"}},
        surface_op="append")
    session.append("user/message", user("First line\nsecond line", n=2), surface_op="append")
    session.append("session/title", {"title": "A title"})
    session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    session.append("turn/start", {"turn": 2})
    session.append("session/title", {"title": "Later title"})
    session.append("turn/end", {"turn": 2, "reason": {"kind": "completed"}})


def prompt_only(session: Session) -> None:
    session.append("turn/start", {"turn": 1})
    session.append("user/message", user("x" * 5000), surface_op="append")
    session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})


def full_entries(persistence: Persistence) -> dict[str, ListingEntry]:
    out = {}
    for header in persistence.list_headers():
        read = persistence.read(str(header["id"]))
        if read.stored_events:
            out[str(header["id"])] = summarize(read.header, read.stored_events)
    return out


def listed(persistence: Persistence) -> dict[str, ListingEntry]:
    entries, errors = persistence.list_entries()
    assert errors == []
    return {e.id: e for e in entries}


@pytest.mark.parametrize("kind", sorted(URLS))
def test_entries_equal_a_full_read(tmp_path: Path, kind: str) -> None:
    with opened(kind, tmp_path) as persistence:
        write(persistence, "titled", titled)
        write(persistence, "prompt", prompt_only)
        persistence.create({"version": 0, "id": "empty", "createdAt": 5})  # never written
        got = listed(persistence)
        assert got == full_entries(persistence)
        assert sorted(got) == ["prompt", "titled"]
        t = got["titled"]
        assert (t.title, t.first_prompt, t.turns, t.events) == (
            "Later title", "First line", 2, 9)
        assert len(got["prompt"].first_prompt or "") == 5000
        assert got["prompt"].title is None


def control_prompt(session: Session) -> None:
    session.append("turn/start", {"turn": 1})
    session.append("user/message", user("\r\n \t\n"), surface_op="append")  # blank lines only
    session.append("user/message", user("\x0b\x1cRun\x1f it \x85 \r\nsecond", n=1),
                   surface_op="append")
    session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})


@pytest.mark.parametrize("kind", sorted(URLS))
def test_first_prompt_keeps_its_control_characters_for_ls_to_escape(tmp_path: Path,
                                                                    kind: str) -> None:
    # docs/rules.md#listing: the first line holding more than spaces, spaces at its ends and
    # the CR of a CRLF dropped, every control character kept (dsh ls shows it escaped)
    from dsh.cli._render import entry_row
    from dsh.transcript import printable
    with opened(kind, tmp_path) as persistence:
        write(persistence, "ctl", control_prompt)
        got = listed(persistence)
        assert got == full_entries(persistence)
        assert got["ctl"].first_prompt == "\x0b\x1cRun\x1f it \x85"
        assert printable(entry_row(got["ctl"]).title or "") == "\\x0b\\x1cRun\\x1f it \\x85"


@settings(max_examples=examples(25), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(scripts=st.lists(log_scripts(open_tail=None), min_size=1, max_size=3),
       kind=st.sampled_from(["jsonl", "sqlite", "sqlite-14", "postgresql"]))
def test_entries_equal_a_full_read_on_random_logs(tmp_path_factory: Any, scripts: list[Any],
                                                  kind: str) -> None:
    root = tmp_path_factory.mktemp("listing")
    with opened(kind, root) as persistence:
        for i, script in enumerate(scripts):
            write(persistence, f"s{i}", lambda s, script=script: apply_script(s, script))
        assert listed(persistence) == full_entries(persistence)


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of every full session read from now on."""
    reads: list[str] = []
    original = Persistence.read

    def counting(self: Persistence, session_id: str) -> Any:
        reads.append(session_id)
        return original(self, session_id)

    monkeypatch.setattr(Persistence, "read", counting)
    return reads


def test_jsonl_unchanged_logs_are_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    url = URLS["jsonl"].format(root=tmp_path)
    with Persistence(open_backend(url)) as persistence:
        for i in range(3):
            write(persistence, f"s{i}", titled)
        first = listed(persistence)
    assert (tmp_path / "store" / INDEX_NAME).is_file()
    reads = count_reads(monkeypatch)
    with Persistence(open_backend(url)) as persistence:
        assert listed(persistence) == first
        assert reads == []
        # one session grows: its writer keeps its entry at flush, so no log is read
        store = SessionStore(persistence=persistence, clock=StepClock(10**12))
        session = store.resume("s1")
        session.append("turn/start", {"turn": 3})
        session.append("turn/end", {"turn": 3, "reason": {"kind": "completed"}})
        store.flush(session)
        store.dispose(session)
        reads.clear()
        again = listed(persistence)
        assert reads == []
        assert again["s1"].turns == 3 and again["s1"].events == first["s1"].events + 3
        assert again == full_entries(persistence)
        # without its journal line (lost, deleted) a grown log is read again
        session = store.resume("s2")
        session.append("turn/start", {"turn": 3})
        store.flush(session)
        store.dispose(session)
        (tmp_path / "store" / JOURNAL_NAME).unlink()
        reads.clear()
        grown = listed(persistence)["s2"]
        assert reads == ["s2"]
        assert grown == full_entries(persistence)["s2"]


def test_jsonl_writers_keep_the_listing_at_flush_so_a_first_listing_reads_no_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = URLS["jsonl"].format(root=tmp_path)
    with Persistence(open_backend(url)) as persistence:
        for i in range(4):
            write(persistence, f"s{i}", titled if i % 2 else prompt_only)
    assert (tmp_path / "store" / JOURNAL_NAME).is_file()
    assert not (tmp_path / "store" / INDEX_NAME).exists()
    reads = count_reads(monkeypatch)
    with Persistence(open_backend(url)) as persistence:
        got = listed(persistence)
        assert reads == []
        assert got == full_entries(persistence)
    # merged into the index, the journal emptied
    assert (tmp_path / "store" / INDEX_NAME).is_file()
    assert (tmp_path / "store" / JOURNAL_NAME).read_bytes() == b""


def test_jsonl_listing_journal_torn_or_stale_lines_fall_back_to_a_read(tmp_path: Path) -> None:
    url = URLS["jsonl"].format(root=tmp_path)
    with Persistence(open_backend(url)) as persistence:
        write(persistence, "a", titled)
        write(persistence, "b", prompt_only)
    journal = tmp_path / "store" / JOURNAL_NAME
    lines = journal.read_bytes().split(b"\n")
    # a torn last line and an entry whose signature no longer matches its log
    stale = lines[0].replace(b'"sig":[', b'"sig":[1')
    journal.write_bytes(b"\n".join([stale, *lines[1:-1]]) + b"\n" + lines[-2][:30])
    with Persistence(open_backend(url)) as persistence:
        assert listed(persistence) == full_entries(persistence)


@pytest.mark.parametrize("damage", ["delete", "garbage", "wrong-shape", "truncate"])
def test_jsonl_index_damage_is_rebuilt(tmp_path: Path, damage: str) -> None:
    url = URLS["jsonl"].format(root=tmp_path)
    index = tmp_path / "store" / INDEX_NAME
    with Persistence(open_backend(url)) as persistence:
        write(persistence, "a", titled)
        expected = listed(persistence)
    if damage == "delete":
        index.unlink()
    elif damage == "garbage":
        index.write_bytes(b"\x00not json")
    elif damage == "wrong-shape":
        index.write_text('{"version": 1, "logs": {"x/a": {"sig": [1], "entry": {"id": 3}}}}')
    else:
        index.write_bytes(index.read_bytes()[:20])
    with Persistence(open_backend(url)) as persistence:
        assert listed(persistence) == expected
    assert index.read_bytes().startswith(b'{"version":6')


def test_jsonl_index_entry_of_a_replaced_log_is_not_trusted(tmp_path: Path) -> None:
    # same size and a restored mtime still differ in ctime/inode: the entry is rebuilt
    url = URLS["jsonl"].format(root=tmp_path)
    with Persistence(open_backend(url)) as persistence:
        write(persistence, "a", titled)
        listed(persistence)
    log = next((tmp_path / "store").rglob("session.jsonl"))
    st = os.stat(log)
    data = log.read_bytes().replace(b"Later title", b"Other title")
    log.unlink()
    log.write_bytes(data)
    os.utime(log, ns=(st.st_atime_ns, st.st_mtime_ns))
    with Persistence(open_backend(url)) as persistence:
        entries, errors = persistence.list_entries()
    # re-read, not served from the index: the integrity seal names the changed bytes
    assert entries == [] and len(errors) == 1 and "integrity seal" in errors[0].message
    # accepted only when asked to: the seal moved aside (a present seal the log fails refuses
    # the reseal), then resealed
    log.with_name(log.name + ".seal").rename(tmp_path / "seal.aside")
    with Persistence(open_backend(url)) as persistence:
        cast(Reseals, persistence.backend).reseal("a")
        assert listed(persistence)["a"].title == "Other title"


def test_a_damaged_log_is_reported_and_the_others_listed(tmp_path: Path) -> None:
    for kind in ("jsonl", "sqlite"):
        root = tmp_path / kind
        root.mkdir()
        with Persistence(open_backend(URLS[kind].format(root=root))) as persistence:
            write(persistence, "good", titled)
            write(persistence, "bad", titled)
        if kind == "jsonl":
            log = next(p for p in (root / "store").rglob("session.jsonl") if "bad" in str(p))
            lines = log.read_bytes().split(b"\n")
            lines[3] = b"{broken"
            log.write_bytes(b"\n".join(lines))
        else:
            import sqlite3

            conn = sqlite3.connect(root / "store.db")
            conn.execute("UPDATE events SET data = '{broken' WHERE session_id = 'bad' AND "
                         "seq = (SELECT max(seq) FROM events WHERE session_id = 'bad')")
            conn.commit()
            conn.close()
        with Persistence(open_backend(URLS[kind].format(root=root))) as persistence:
            entries, errors = persistence.list_entries()
        assert [e.id for e in entries] == ["good"] or (
            kind == "sqlite" and sorted(e.id for e in entries) == ["bad", "good"])
        if kind == "jsonl":
            assert len(errors) == 1 and isinstance(errors[0], DshError)
            assert errors[0].where["session_id"] == "bad"


@pytest.mark.parametrize("kind", ["jsonl", "sqlite", "memory", "postgresql"])
def test_imported_sessions_carry_format_and_timedness(tmp_path: Path, kind: str) -> None:
    def imported(timestamps: bool, appended: bool) -> Any:
        def build(session: Session) -> None:
            session.append("import/source", {"format": "claude-code", "path": "/x.jsonl",
                                              "timestamps": timestamps}, ignorable=True)
            session.append("import/source", {"format": "codex"}, ignorable=True)
            if appended:
                session.append("turn/start", {"turn": 1})
        return build

    with opened(kind, tmp_path) as persistence:
        # an importer stamps every event of a timestamp-less source with one time
        write(persistence, "stamped", imported(False, False), step=0)
        write(persistence, "stamped-then-live", imported(False, True))
        write(persistence, "real", imported(True, False))
        got = listed(persistence)
        assert got == full_entries(persistence)
    assert {sid: (e.source_format, e.timed) for sid, e in got.items()} == {
        "stamped": ("claude-code", False), "stamped-then-live": ("claude-code", True),
        "real": ("claude-code", True)}


def test_jsonl_writer_stops_keeping_the_entry_once_bytes_it_did_not_write_appear(
        tmp_path: Path) -> None:
    # another program (the published dsh knows no lock files) grew the log: the writer's fold
    # no longer describes it, so it notes nothing more and the listing reads the log
    url = URLS["jsonl"].format(root=tmp_path)
    journal = tmp_path / "store" / JOURNAL_NAME
    with Persistence(open_backend(url)) as persistence:
        store = SessionStore(persistence=persistence, clock=StepClock())
        session = store.create("a")
        titled(session)
        store.flush(session)
        noted = journal.read_bytes().count(b"\n")
        log = next((tmp_path / "store").rglob("session.jsonl"))
        with log.open("ab") as f:
            f.write(b"\n")  # a blank line: still a readable log, but not our bytes
        session.append("turn/start", {"turn": 2})
        store.flush(session)
        assert journal.read_bytes().count(b"\n") == noted
        store.dispose(session)


def test_jsonl_listing_journal_stops_growing_at_its_cap_until_a_listing_merges_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dsh.persistence._listing as listing

    monkeypatch.setattr(listing, "JOURNAL_MAX_BYTES", 1)
    url = URLS["jsonl"].format(root=tmp_path)
    journal = tmp_path / "store" / JOURNAL_NAME
    with Persistence(open_backend(url)) as persistence:
        write(persistence, "a", titled)
        write(persistence, "b", titled)
        assert journal.read_bytes().count(b"\n") == 1  # the first line reached the cap
        assert listed(persistence) == full_entries(persistence)  # "b" is read in full
        assert journal.read_bytes() == b""


def test_jsonl_listing_journal_is_merged_by_the_writer_that_takes_it_past_the_fold_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every writer's first flush reads the journal back: it must not grow without a listing
    import dsh.persistence._listing as listing

    monkeypatch.setattr(listing, "JOURNAL_FOLD_BYTES", 1500)
    url = URLS["jsonl"].format(root=tmp_path)
    journal = tmp_path / "store" / JOURNAL_NAME
    index = tmp_path / "store" / INDEX_NAME
    with Persistence(open_backend(url)) as persistence:
        store = SessionStore(persistence=persistence, clock=StepClock())
        session = store.create("a")
        sizes = []
        for turn in range(1, 12):
            session.append("turn/start", {"turn": turn})
            session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
            store.flush(session)
            sizes.append(journal.stat().st_size)
        store.dispose(session)
        assert max(sizes) < 1500 + 1000  # merged whenever it passed the fold size
        assert any(b < a for a, b in itertools.pairwise(sizes))  # ...which happened
        assert index.is_file()
        assert listed(persistence) == full_entries(persistence)


def assistant(text: str, model: str, n: int) -> dict[str, Any]:
    return {"turn": 1, "step": 1, "message": {
        "id": f"a{n}", "role": "assistant", "content": [{"type": "text", "text": text}],
        "source": {"kind": "model", "provider": "p", "model": model}}}


def models(session: Session) -> None:
    session.append("turn/start", {"turn": 1})
    session.append("step/start", {"turn": 1, "step": 1})
    session.append("assistant/message", assistant("hi", "reply-model", 0), surface_op="append")
    session.append("request/header", {"reason": "initial", "header": {
        "config": {"provider": "p", "model": "header-model"}}})
    session.append("assistant/message", assistant("hi", "later-reply", 1), surface_op="append")
    session.append("request/context", {"provider": "p", "model": "context-model"})
    session.append("request/context", {"provider": "p", "model": "last-context"})
    session.append("step/end", {"turn": 1, "step": 1})
    session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})


def replies(session: Session) -> None:
    session.append("turn/start", {"turn": 1})
    session.append("step/start", {"turn": 1, "step": 1})
    session.append("assistant/message", assistant("hi", "first-reply", 0), surface_op="append")
    session.append("assistant/message", assistant("hi", "second-reply", 1), surface_op="append")
    session.append("step/end", {"turn": 1, "step": 1})
    session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})


@pytest.mark.parametrize("kind", sorted(URLS))
def test_entries_name_the_model_the_first_activity_and_the_size(tmp_path: Path,
                                                               kind: str) -> None:
    with opened(kind, tmp_path) as persistence:
        write(persistence, "models", models, step=10)
        write(persistence, "replies", replies, step=10)
        write(persistence, "none", prompt_only, step=10)
        got = listed(persistence)
        assert got == full_entries(persistence)
        assert {sid: e.model for sid, e in got.items()} == {
            "models": "last-context", "replies": "first-reply", "none": None}
        for entry in got.values():
            assert entry.first_activity_ms is not None
            assert entry.first_activity_ms < entry.last_activity_ms
        sizes = {sid: e.size_bytes for sid, e in got.items()}
        if kind == "memory":
            assert set(sizes.values()) == {None}
        else:  # the log's bytes: the file, or the rows' data
            assert all(size is not None and size > 100 for size in sizes.values())
            if kind in ("jsonl", "sqlite-14"):  # its prompt is 5,000 characters (uncompressed)
                assert sizes["none"] > 5000 > sizes["replies"]


def test_postgres_lists_from_the_sessions_rows_and_keeps_the_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every append stores the entry and the data bytes beside the head: no log is read, and
    # the size is the committed rows' data (docs/stores.md#capabilities).
    import psycopg

    with opened("postgresql", tmp_path) as persistence:
        write(persistence, "titled", titled)
        write(persistence, "prompt", prompt_only)
        expected = full_entries(persistence)
        reads = count_reads(monkeypatch)
        got = listed(persistence)
        assert reads == []
        assert got == expected
        backend: Any = persistence.backend
        with psycopg.connect(backend.conninfo) as conn:
            sums = dict(conn.execute(
                f'SELECT session_id, sum(coalesce(octet_length(data), octet_length(data_zstd))) '
                f'FROM "{backend.schema}".events GROUP BY session_id').fetchall())
        assert {sid: e.size_bytes for sid, e in got.items()} == sums
        assert all(size > 100 for size in sums.values())  # zstd frames count as stored


def test_postgres_entry_unknown_is_read_in_full_until_a_writer_reads_the_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A session whose entry is not stored (written before migration 6) is listed by a full
    # read; a writer that reads the whole log learns the entry and stores it with its append.
    import psycopg

    from dsh.testing import make

    with opened("postgresql", tmp_path) as persistence:
        write(persistence, "old", titled)
        backend: Any = persistence.backend
        with psycopg.connect(backend.conninfo, autocommit=True) as conn:
            conn.execute(f'UPDATE "{backend.schema}".sessions SET listing = NULL')
        reads = count_reads(monkeypatch)
        assert listed(persistence) == full_entries(persistence)
        assert "old" in reads
        with backend.open("old", "write") as handle:
            head = len(handle.read().events)
            handle.append([make("session/title", head, {"title": "Kept"})])
        reads.clear()
        got = listed(persistence)
        assert reads == [] and got == full_entries(persistence)
        assert got["old"].title == "Kept"


def test_postgres_rewrite_stores_the_entry_of_the_rewritten_log(tmp_path: Path) -> None:
    with opened("postgresql", tmp_path) as persistence:
        write(persistence, "titled", titled)
        backend: Any = persistence.backend
        with backend.open("titled", "write") as handle:
            events = list(handle.read().events)
            handle.rewrite(events[:4], scrub=False)
        got = listed(persistence)
        assert got == full_entries(persistence)
        assert got["titled"].events == 4 and got["titled"].title is None


# --- cleared means cleared: titles are of what the model view holds (docs/forgetting.md) ------

SECRET = "hunter2-4f9a"


def removal(session: Session, seqs: list[int], turn: int) -> None:
    """An adapter's clear, as ``dsh.adapters._log.remove_from_surface`` appends it."""
    from dsh._messages import create_assistant_message

    made = create_assistant_message(content=[], provider="dsh", model="surface-removal")
    session.append("turn/start", {"turn": turn})
    session.append("step/start", {"turn": turn, "step": 1})
    session.append("assistant/message", {"turn": turn, "step": 1, "message": {
        **made, "source": {**made["source"], "removal": {"form": "clear", "removed": seqs}}}},
        surface_op={"op": "replace", "start": seqs[0], "end": seqs[-1]},
        source_event_seqs=seqs)
    session.append("step/end", {"turn": turn, "step": 1})
    session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})


def told_secret(session: Session) -> None:
    session.append("turn/start", {"turn": 1})  # 0
    session.append("user/message", user(f"my password is {SECRET}"), surface_op="append")  # 1
    session.append("session/title", {"title": f"password {SECRET}"})  # 2
    session.append("user/message", user("and deploy", n=1), surface_op="append")  # 3
    session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})  # 4


def cleared_all(session: Session) -> None:
    told_secret(session)
    removal(session, [1, 3], 2)


def cleared_then_more(session: Session) -> None:
    cleared_all(session)
    session.append("turn/start", {"turn": 3})
    session.append("user/message", user("a fresh start", n=2), surface_op="append")
    session.append("turn/end", {"turn": 3, "reason": {"kind": "completed"}})


def first_popped(session: Session) -> None:
    told_secret(session)
    removal(session, [1], 2)


def compacted(session: Session) -> None:
    # a summary shadows the prompt: compaction is no forgetting, the prompt still titles
    told_secret(session)
    session.append("turn/start", {"turn": 2})
    session.append("user/message", user("summary", kind="plugin", n=9) | {"source": {
        "kind": "plugin", "plugin": "compaction", "form": "checkpoint", "summary": "s"}},
        surface_op={"op": "replace", "start": 1, "end": 3}, source_event_seqs=[1, 3])
    session.append("turn/end", {"turn": 2, "reason": {"kind": "completed"}})


CLEARED = {"cleared-all": (cleared_all, None, None),
           "cleared-then-more": (cleared_then_more, None, "a fresh start"),
           "first-popped": (first_popped, None, "and deploy"),
           "compacted": (compacted, f"password {SECRET}", f"my password is {SECRET}")}


@pytest.mark.parametrize("kind", sorted(URLS))
def test_titles_are_of_what_the_model_view_holds(tmp_path: Path, kind: str) -> None:
    # a cleared or popped prompt never titles the session, nor a title set before the clear;
    # every backend's listing equals the full read (docs/forgetting.md#what-titles-show)
    with opened(kind, tmp_path) as persistence:
        for sid, (build, _, _) in CLEARED.items():
            write(persistence, sid, build)
        got = listed(persistence)
        assert got == full_entries(persistence)
        for sid, (_, title, prompt) in CLEARED.items():
            assert (got[sid].title, got[sid].first_prompt) == (title, prompt), sid
        summaries = {s.id: s.title for s in persistence.list()}
        assert summaries["first-popped"] == "and deploy"
        assert summaries["cleared-all"] is None


@pytest.mark.parametrize("kind", sorted(set(URLS) - {"sqlite-14"}))  # (no ignorable records)
def test_a_quarantined_prompt_leaves_the_title_and_comes_back_with_its_release(
        tmp_path: Path, kind: str) -> None:
    from dsh.rights import quarantine, unquarantine

    with opened(kind, tmp_path) as persistence:
        write(persistence, "q", told_secret)
        quarantine(persistence, "q", [1])
        got = listed(persistence)
        assert got == full_entries(persistence)
        assert (got["q"].title, got["q"].first_prompt) == (None, "and deploy")
        unquarantine(persistence, "q", [1])
        got = listed(persistence)
        assert got == full_entries(persistence)
        assert got["q"].first_prompt == f"my password is {SECRET}"


@pytest.mark.parametrize("kind", ["jsonl", "jsonl-zstd", "postgresql"])
def test_a_writer_that_clears_after_a_flush_does_not_keep_the_cleared_title(
        tmp_path: Path, kind: str) -> None:
    # the writer's fold cannot know the titles after a removal: the listing reads the log,
    # then a later writer keeps the entry again
    with opened(kind, tmp_path) as persistence:
        store = SessionStore(persistence=persistence, clock=StepClock(step=1))
        session = store.create("w")
        told_secret(session)
        store.flush(session)
        assert listed(persistence)["w"].first_prompt == f"my password is {SECRET}"
        removal(session, [1, 3], 2)
        store.flush(session)
        got = listed(persistence)
        assert (got["w"].title, got["w"].first_prompt) == (None, None)
        session.append("turn/start", {"turn": 3})
        session.append("user/message", user("later", n=5), surface_op="append")
        session.append("turn/end", {"turn": 3, "reason": {"kind": "completed"}})
        store.flush(session)
        store.dispose(session)
        got = listed(persistence)
        assert got == full_entries(persistence)
        assert got["w"].first_prompt == "later"


def test_jsonl_index_and_journal_of_an_older_version_never_keep_a_cleared_title(
        tmp_path: Path) -> None:
    # version 4 entries (and journal lines without "v") were folded by the old rule, which
    # kept a cleared prompt: they are not trusted (docs/formats.md#listing-index)
    url = URLS["jsonl"].format(root=tmp_path)
    root = tmp_path / "store"
    with Persistence(open_backend(url)) as persistence:
        write(persistence, "c", cleared_all)
        listed(persistence)
    index = root / INDEX_NAME
    text = index.read_text()
    leaked = text.replace('"version":6', '"version":5').replace(
        '"first_prompt":null', f'"first_prompt":"my password is {SECRET}"')
    assert leaked != text
    index.write_text(leaked)
    with Persistence(open_backend(url)) as persistence:
        assert listed(persistence)["c"].first_prompt is None
    import json as _json
    item = _json.loads(index.read_text())["logs"]
    [(key, value)] = item.items()
    value["entry"]["first_prompt"] = f"my password is {SECRET}"
    (root / JOURNAL_NAME).write_text(_json.dumps({"key": key, **value}) + "\n")
    with Persistence(open_backend(url)) as persistence:
        assert listed(persistence)["c"].first_prompt is None


@pytest.mark.parametrize("version", [None, 2])
def test_postgres_entry_stored_before_version_3_is_not_trusted_after_a_clear(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: int | None) -> None:
    # an entry stored with no "v" may hold a cleared prompt, one of version 2 a prompt an old
    # adapter mark cleared: a log holding a removal is read (and its next writer does not fold
    # on from it); any other keeps its entry unread
    import json as _json

    import psycopg

    with opened("postgresql", tmp_path) as persistence:
        write(persistence, "c", cleared_all)
        write(persistence, "plain", titled)
        backend: Any = persistence.backend
        s = f'"{backend.schema}"'
        with psycopg.connect(backend.conninfo, autocommit=True) as conn:
            for sid, prompt in (("c", f"my password is {SECRET}"), ("plain", "First line")):
                (text,) = conn.execute(f"SELECT listing FROM {s}.sessions WHERE id = %s",
                                       (sid,)).fetchone()
                old = _json.loads(text)
                del old["v"]
                if version is not None:
                    old["v"] = version
                old["entry"]["first_prompt"] = prompt
                conn.execute(f"UPDATE {s}.sessions SET listing = %s WHERE id = %s",
                             (_json.dumps(old), sid))
        reads = count_reads(monkeypatch)
        got = listed(persistence)
        assert reads == ["c"]
        assert got["c"].first_prompt is None and got["plain"].first_prompt == "First line"
        assert got == full_entries(persistence)
        store = SessionStore(persistence=persistence, clock=StepClock(step=1))
        session = store.resume("c")
        session.append("turn/start", {"turn": 9})
        session.append("turn/end", {"turn": 9, "reason": {"kind": "completed"}})
        store.flush(session)
        store.dispose(session)
        got = listed(persistence)
        assert got["c"].first_prompt is None and got == full_entries(persistence)

"""Reading a stored session by page (read_pages): the same events as a full read, O(tail)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh import transcript
from dsh.persistence import Persistence, open_backend, read_pages
from dsh.testing import postgres_unreachable, temporary_postgres_url
from dsh.testing._logs import assistant, tool_result, user

pytestmark = pytest.mark.no_speedups


def _write(url: str, turns: int) -> None:
    with dsh.open(url) as store:
        s = store.session("big")
        for turn in range(1, turns + 1):
            s.append("turn/start", {"turn": turn})
            s.append("step/start", {"turn": turn, "step": 1})
            s.append("user/message", user(f"question {turn}", f"u{turn}"), surface_op="append")
            s.append("assistant/message", assistant(turn, 1, f"calling {turn}", f"a{turn}",
                                                    [(f"c{turn}", "bash")]),
                     surface_op="append")
            s.append("tool/call", {"turn": turn, "step": 1, "callId": f"c{turn}",
                                   "name": "bash", "arguments": "{}"})
            s.append("tool/result", tool_result(turn, 1, f"c{turn}", f"out {turn}"),
                     surface_op="append", source_event_seqs=[s.seq - 1])
            s.append("step/end", {"turn": turn, "step": 1})
            s.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
            if turn % 50 == 0:
                store.flush(s)


@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
def test_read_pages_pages_a_log_with_a_restore_point_and_serves_the_full_read(
        tmp_path: Path, backend: str) -> None:
    url = f"jsonl:{tmp_path / 'j'}" if backend == "jsonl" else f"sqlite:{tmp_path / 's.db'}"
    _write(url, 700)  # 5,600 events: the writer keeps a restore point every 2,048
    with Persistence(open_backend(url)) as persistence:
        full = persistence.read("big")
        pages = read_pages(persistence, "big")
        assert pages.paged and pages.restore is not None
        assert 0 < pages.restore.event_count < len(full.stored_events)
        assert pages.header == full.header
        assert len(pages.events) == len(full.stored_events)
        assert list(pages.events[2000:2100]) == list(full.stored_events[2000:2100])
        assert list(pages.events) == list(full.stored_events)
        # the model view from the restore point equals the fold from seq 0
        last = len(full.stored_events) - 1
        for seq in (last, pages.restore.event_count - 1, 1234):
            from_zero = transcript.model_request(full.stored_events, seq)
            resumed = transcript.model_request(pages.events, seq, restore=pages.restore)
            assert resumed == from_zero
        tail = transcript.model_request(pages.events, last, last=3, restore=pages.restore)
        assert [seq for seq, _ in tail.messages] == list(tail.nodes[-3:])
        # pages of the paged log are the pages of the full read
        page = transcript.build(pages.events, start=3000, stop=3500)
        assert page == transcript.build(full.stored_events, start=3000, stop=3500)


def test_read_pages_reads_in_full_without_a_restore_point(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 's.db'}"
    _write(url, 3)
    with Persistence(open_backend(url)) as persistence:
        pages = read_pages(persistence, "big")
        assert not pages.paged and pages.restore is None
        assert tuple(pages.events) == persistence.read("big").stored_events


def write_without_restore_point(url: str, turns: int, *, unknown_at_turn: int | None = None,
                                 chunks: int = 0) -> None:
    """A log appended through a raw write handle: no writer keeps a restore point for it.

    ``chunks``: stream deltas per answer (JSONL packs each run into one line).
    """
    with dsh.open("memory:") as memory:
        s = memory.session("big", header={"createdAt": 1_767_225_600_000})
        for turn in range(1, turns + 1):
            s.append("turn/start", {"turn": turn})
            s.append("step/start", {"turn": turn, "step": 1})
            s.append("user/message", user(f"question {turn}", f"u{turn}"), surface_op="append")
            if chunks:
                s.append("assistant/chunk", {"turn": turn, "step": 1, "chunk": {
                    "type": "block-start", "index": 0, "blockType": "text"}})
            for _ in range(chunks):
                s.append("assistant/chunk", {"turn": turn, "step": 1, "chunk": {
                    "type": "text-delta", "index": 0, "text": "an"}})
            s.append("assistant/message", assistant(turn, 1, f"answer {turn}", f"a{turn}"),
                     surface_op="append")
            s.append("step/end", {"turn": turn, "step": 1})
            s.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
        header, events = s.header, list(s.events)
    if unknown_at_turn is not None:  # a type no dsh knows, not marked ignorable
        at = (unknown_at_turn - 1) * 6 + 4
        events[at] = dsh.Event({**events[at], "type": "future/thing", "data": {}})
    with Persistence(open_backend(url)) as persistence:
        persistence.create(header)
        with persistence.open("big", "write") as handle:
            for start in range(0, len(events), 500):
                handle.append(events[start:start + 500])
            handle.flush()


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "jsonl"])
def test_read_pages_pages_a_log_without_a_restore_point_by_range(tmp_path: Path,
                                                                 backend: str) -> None:
    with ranged_url(backend, tmp_path) as url:
        write_without_restore_point(url, 1000)  # 6,000 events
        with Persistence(open_backend(url)) as persistence:
            full = persistence.read("big")
            pages = read_pages(persistence, "big")
            assert pages.paged and pages.restore is None and pages.closers == ()
            assert pages.header == full.header and len(pages.events) == 6000
            assert pages.events[5999] == full.stored_events[5999]
            assert list(pages.events[100:700]) == list(full.stored_events[100:700])
            assert list(pages.events) == list(full.stored_events)
            page = transcript.build(pages.events, start=3000, stop=3500)
            assert page == transcript.build(full.stored_events, start=3000, stop=3500)


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "jsonl"])
def test_a_ranged_page_holding_an_unknown_type_raises_what_the_full_read_raises(
        tmp_path: Path, backend: str) -> None:
    with ranged_url(backend, tmp_path) as url:
        write_without_restore_point(url, 1000, unknown_at_turn=10)  # seq 58
        with Persistence(open_backend(url)) as persistence:
            with pytest.raises(dsh.UnknownEventTypeError) as full:
                persistence.read("big")
            pages = read_pages(persistence, "big")  # the tail is fine: opened by page
            assert pages.paged and pages.events[5000]["seq"] == 5000
            with pytest.raises(dsh.UnknownEventTypeError) as paged:
                pages.events[60]
            assert paged.value.where.get("seq") == full.value.where.get("seq") == 58


@contextlib.contextmanager
def ranged_url(backend: str, tmp_path: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:{tmp_path / 's.db'}"
        return
    if backend == "jsonl":
        yield f"jsonl:{tmp_path / 'j'}"
        return
    reason = postgres_unreachable()
    if reason is not None:
        pytest.skip(reason)
    with temporary_postgres_url() as url:
        yield url


def _jsonl_log(root: Path) -> Path:
    return next(root.rglob("session.jsonl"))


def test_a_raw_jsonl_log_without_a_restore_point_is_paged_by_bisection(tmp_path: Path) -> None:
    """Packed chunk rows, any range, the suffix read: what the full read gives (stores.md)."""
    url = f"jsonl:{tmp_path / 'j'}"
    write_without_restore_point(url, 400, chunks=5)  # 4,800 events, one chunk row per answer
    with Persistence(open_backend(url)) as persistence:
        full = persistence.read("big").stored_events
        pages = read_pages(persistence, "big")
        assert pages.paged and pages.restore is None and len(pages.events) == len(full)
        for start, stop in ((0, 1), (5, 17), (1000, 1300), (3700, 3800), (0, len(full))):
            fresh = read_pages(persistence, "big")  # a fresh source each time: no span kept
            assert list(fresh.events[start:stop]) == list(full[start:stop])
        with persistence.open("big", "read") as handle:
            for offset in (1, 6, 7, 2345, len(full) - 1, len(full), len(full) + 5):
                assert handle.read(offset).events == full[offset:]


def test_a_jsonl_page_whose_sealed_bytes_changed_raises_what_the_full_read_raises(
        tmp_path: Path) -> None:
    """A same-length edit in the prefix: the tail still opens, the page names the damage."""
    url = f"jsonl:{tmp_path / 'j'}"
    write_without_restore_point(url, 1000)
    log = _jsonl_log(tmp_path / "j")
    data = log.read_bytes()
    at = data.index(b"question 17")
    log.write_bytes(data[:at] + b"QUESTION 17" + data[at + 11:])
    with Persistence(open_backend(url)) as persistence:
        with pytest.raises(dsh.LogCorruptError) as full:
            persistence.read("big")
        pages = read_pages(persistence, "big")
        assert pages.paged and pages.events[5990]["seq"] == 5990
        with pytest.raises(dsh.LogCorruptError) as paged:
            pages.events[100]
        assert paged.value.where == full.value.where and "crc32" in paged.value.message


@pytest.mark.parametrize("damage", ["torn", "zstd"])
def test_a_jsonl_log_with_a_torn_tail_or_zstd_frames_is_read_in_full(
        tmp_path: Path, damage: str) -> None:
    url = (f"jsonl+zstd://{tmp_path}/j" if damage == "zstd" else f"jsonl:{tmp_path / 'j'}")
    write_without_restore_point(url, 1000)
    if damage == "torn":
        with _jsonl_log(tmp_path / "j").open("ab") as file:
            file.write(b'{"seq": 6000, "ty')
    with Persistence(open_backend(url)) as persistence:
        full = persistence.read("big")
        pages = read_pages(persistence, "big")
        assert not pages.paged and (pages.torn is not None) == (damage == "torn")
        assert tuple(pages.events) == full.stored_events


def test_bisection_finds_the_line_of_every_seq_and_serves_every_range(tmp_path: Path) -> None:
    """The JSONL range source itself, no full-read fallback: exact lines, pages and picks."""
    import os
    import random

    from dsh.json import loads
    from dsh.persistence.jsonl._ranges import locate, range_source
    from dsh.session import decode_storage_record

    url = f"jsonl:{tmp_path / 'j'}"
    write_without_restore_point(url, 300, chunks=3)  # short and long lines, packed rows
    log = _jsonl_log(tmp_path / "j")
    with Persistence(open_backend(url)) as persistence:
        full = persistence.read("big").stored_events
    data = log.read_bytes()
    header_end = data.index(b"\n") + 1
    starts = [header_end] + [i + 1 for i in range(header_end, len(data) - 1)
                             if data[i] == 10]
    fd = os.open(log, os.O_RDONLY)
    try:
        offsets, seqs = [header_end], [0]
        for seq in range(len(full)):
            start, first, end = locate(fd, offsets, seqs, seq, len(data), str(log))
            assert start in starts and data[end - 1] == 10
            held = [e["seq"] for e in decode_storage_record(loads(data[start:end - 1]))]
            assert first == held[0] and seq in held
    finally:
        os.close(fd)
    rng = random.Random(7)
    for cut in (1, 2, 7, 1000, len(full) - 1, len(full)):
        source = range_source(log, cut, log.with_name("session.jsonl.seal"))
        assert source is not None and len(source) == cut
        for _ in range(30):
            a = rng.randrange(cut)
            b = min(cut, a + rng.choice((1, 5, 256, 2000)))
            assert list(source.read(a, b)) == list(full[a:b])
            picked = sorted(rng.sample(range(a, b), min(b - a, 3)))
            assert list(source.read_picked(a, b, picked) or ()) == [full[s] for s in picked]


def test_sqlite_seal_records_end_at_page_bounds_so_a_page_in_checks_its_own_rows(
        tmp_path: Path) -> None:
    # docs/formats.md#integrity-seals: a batch's rows get one seal record per 256-seq page,
    # so a verified page-in (docs/rules.md#verified-page-in) reads and checks its page only
    import sqlite3

    from dsh import LogCorruptError
    from dsh.persistence import _seal
    from dsh.persistence.sqlite._restore_point import SqlitePrefixSource

    db = tmp_path / "store.db"
    with dsh.open(f"sqlite:{db}") as store:
        s = store.session("s1")
        for count in (600, 100, 3):
            for n in range(count):
                s.append("x/tick", {"n": n}, ignorable=True)
            store.flush(s)
        total = len(s.events)
    seal = _seal.read_seal(tmp_path / "store.db.dsh-seals" / "s1.seal")
    assert seal is not None
    ranges = [(start, end) for start, end, _ in seal.records]
    assert ranges == [(0, 256), (256, 512), (512, 600), (600, 700), (700, total)]
    assert [(r.first, r.end) for r in seal.chain] == [(0, 600), (600, 700), (700, total)]
    with sqlite3.connect(db) as conn:  # same length, another value, in the second page
        changed = conn.execute("UPDATE events SET data = replace(data, '\"n\":300', "
                               "'\"n\":301') WHERE session_id = 's1' AND seq = 300").rowcount
    assert changed == 1
    source = SqlitePrefixSource(db, "s1", total, seal.records)
    assert [e["data"]["n"] for e in source.read(0, 256)] == list(range(256))
    assert [e["data"]["n"] for e in source.read(512, 700)] == [*range(512, 600), *range(100)]
    with pytest.raises(LogCorruptError, match=r"rows of seq 256\.\.511 differ"):
        source.read(256, 512)
    with dsh.open(f"sqlite:{db}") as store, pytest.raises(LogCorruptError,
                                                           match=r"seq 256\.\.511"):
        store.read("s1")


def test_a_sqlite_restore_point_carries_the_seal_records_of_its_last_pages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/rules.md#verified-page-in, docs/formats.md#restore-points: the seal cut (`s3:`)
    # carries the range records over the last CUT_TAIL_SEQS seqs before the cut, so a page-in
    # there is checked against them without reading the seal's records before the cut; a
    # page-in before them reads those once, and an edited row is refused either way
    import sqlite3

    from dsh import LogCorruptError
    from dsh.persistence import WriteBehind, _seal
    from dsh.persistence import _restore_point as rp

    db = tmp_path / "store.db"
    with dsh.open(f"sqlite:{db}", write_behind=WriteBehind(restore_point_tail=64)) as store:
        s = store.session("s1")
        for _batch in range(30):
            for n in range(100):
                s.append("x/tick", {"n": n}, ignorable=True)
            store.flush(s)
        total = len(s.events)
        expected = s.events[total - 300]
    point = rp.decode_restore_point(
        (tmp_path / "store.db.dsh-checkpoints" / "s1.ckpt").read_bytes(), session_id="s1",
        backend="sqlite")
    assert point.anchor.seal_digest.startswith("s3:")
    cut = _seal.SealCut.decode(point.anchor.seal_digest)
    seal = _seal.read_seal(tmp_path / "store.db.dsh-seals" / "s1.seal")
    assert cut is not None and seal is not None and point.anchor.event_count == total
    assert cut.tail == tuple(seal.records[-len(cut.tail):])  # the last records, as sealed
    assert cut.tail[-1][1] == cut.end == total
    assert total - cut.tail[0][0] >= _seal.CUT_TAIL_SEQS > total - cut.tail[1][0]
    scanned: list[int] = []
    real = _seal._scan_ranges

    def counting(data: bytes, pos: int, stop: int, records: list[tuple[int, int, int]]) -> None:
        real(data, pos, stop, records)
        scanned.append(len(records))

    monkeypatch.setattr(_seal, "_scan_ranges", counting)
    with sqlite3.connect(db) as conn:  # same length, another value: one row in the tail,
        for seq in (total - 5, 7):     # one before it
            conn.execute("UPDATE events SET data = replace(data, '\"n\":', '\"m\":') "
                         "WHERE session_id = 's1' AND seq = ?", (seq,))
    with Persistence(open_backend(f"sqlite:{db}")) as persistence:
        pages = read_pages(persistence, "s1")
        assert pages.paged
        assert pages.events[total - 300] == expected
        assert scanned == []  # within the carried records: none read before the cut
        with pytest.raises(LogCorruptError, match=rf"rows of seq \d+\.\.{total - 1} differ"):
            pages.events[total - 3]
        assert scanned == []
        with pytest.raises(LogCorruptError, match=r"rows of seq 0\.\.\d+ differ"):
            pages.events[3]
        assert scanned == [cut.records]  # read once, when a page-in reached before the tail


def test_the_page_ins_of_one_sqlite_store_share_its_read_only_connections(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold read's source and a resume's source of one store page in through one connection.

    docs/formats.md#files-and-connections: read-only, borrowed and given back, two kept at
    most, one that failed closed; each page still checked against the seal.
    """
    import sqlite3

    from dsh.persistence.sqlite import _restore_point as srp

    db, seal = _ticked_store(tmp_path)
    opened = _count_connects(monkeypatch, srp.sqlite3)
    shared = srp.PageConnections(db)
    cold = srp.SqlitePrefixSource(db, "s1", 300, seal.records, connections=shared)
    resumed = srp.SqlitePrefixSource(db, "s1", 300, seal.records, connections=shared)
    assert [e["data"]["n"] for e in cold.read(280, 300)] == list(range(280, 300))
    assert [e["data"]["n"] for e in resumed.read(0, 256)] == list(range(256))
    assert opened == [f"{db.as_uri()}?mode=ro"]
    with shared.borrow() as one, shared.borrow() as two, shared.borrow() as three:
        assert len({id(one), id(two), id(three)}) == 3
    assert len(opened) == 3 and len(shared._idle) == srp.IDLE_PAGE_CONNECTIONS
    with pytest.raises(sqlite3.OperationalError, match="readonly"), shared.borrow() as conn:
        conn.execute("DELETE FROM events")
    assert conn not in shared._idle and len(shared._idle) == 1
    with pytest.raises(sqlite3.ProgrammingError):
        conn.execute("SELECT 1")  # closed, not kept
    assert [e["data"]["n"] for e in cold.read(0, 300)] == list(range(300))


def test_a_page_in_borrows_a_write_handle_connection_only_while_the_handle_is_idle(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resume's page-in runs on its write handle's connection when the handle is not using it.

    docs/formats.md#files-and-connections: never while a method of the handle runs in another
    thread (the page-in opens a read-only connection instead, without waiting) nor inside a
    transaction; every page still checked against the seal.
    """
    import threading

    from dsh.persistence.sqlite import _restore_point as srp

    db, seal = _ticked_store(tmp_path)
    backend = open_backend(f"sqlite:{db}")
    handle = backend.open("s1", "write")  # the one validated connection of the backend
    opened = _count_connects(monkeypatch, srp.sqlite3)
    source = srp.SqlitePrefixSource(db, "s1", 300, seal.records,
                                    connections=backend.page_connections)
    assert [e["data"]["n"] for e in source.read(280, 300)] == list(range(280, 300))
    assert opened == []  # on the handle's own connection

    held, done = threading.Event(), threading.Event()

    def busy_handle() -> None:
        with handle._use:  # a method of the handle running in another thread
            held.set()
            done.wait(10)

    worker = threading.Thread(target=busy_handle)
    worker.start()
    try:
        assert held.wait(10)
        assert [e["data"]["n"] for e in source.read(0, 10)] == list(range(10))
        assert opened == [f"{db.as_uri()}?mode=ro"]  # not the busy handle's: a read-only one
    finally:
        done.set()
        worker.join()
    # a method of the handle running on this very thread (the lock is reentrant): no loan
    from dsh.persistence.sqlite._backend import _holding
    inside = _holding(lambda h: (h._lend(), h._lend()))(handle)
    assert inside == (None, None)
    lent = handle._lend()  # (and lent again once the method has returned)
    assert lent is not None
    lent[1](True)
    handle._c.conn.execute("BEGIN")
    try:
        assert handle._lend() is None  # never inside a transaction
    finally:
        handle._c.conn.execute("ROLLBACK")
    handle.append([])  # the handle works on after lending its connection
    assert handle.last_stored_seq() == 299
    handle.close()
    assert handle._lend() is None and len(backend._writers) == 0
    backend.close()


def _ticked_store(tmp_path: Path) -> tuple[Path, Any]:
    """A SQLite store holding session s1 of 300 ignorable ticks, and its seal as read."""
    from dsh.persistence import _seal

    db = tmp_path / "store.db"
    with dsh.open(f"sqlite:{db}") as store:
        s = store.session("s1")
        for n in range(300):
            s.append("x/tick", {"n": n}, ignorable=True)
        store.flush(s)
    return db, _seal.read_seal(tmp_path / "store.db.dsh-seals" / "s1.seal")


def _count_connects(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[str]:
    """Patch ``module.connect`` (a sqlite3) to note each database it opens; the list grows."""
    opened: list[str] = []
    connect = module.connect

    def counting(database: str, **kwargs: bool | None) -> Any:
        opened.append(database)
        return connect(database, **kwargs)

    monkeypatch.setattr(module, "connect", counting)
    return opened

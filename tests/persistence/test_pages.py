"""Reading a stored session by page (read_pages): the same events as a full read, O(tail)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

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


def write_without_restore_point(url: str, turns: int, *, unknown_at_turn: int | None = None
                                 ) -> None:
    """A log appended through a raw write handle: no writer keeps a restore point for it."""
    with dsh.open("memory:") as memory:
        s = memory.session("big", header={"createdAt": 1_767_225_600_000})
        for turn in range(1, turns + 1):
            s.append("turn/start", {"turn": turn})
            s.append("step/start", {"turn": turn, "step": 1})
            s.append("user/message", user(f"question {turn}", f"u{turn}"), surface_op="append")
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


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
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


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
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
    reason = postgres_unreachable()
    if reason is not None:
        pytest.skip(reason)
    with temporary_postgres_url() as url:
        yield url

"""The write-behind writer (dsh.persistence._write_behind): batching in a fixed window, the
flush barrier, a failed write kept and retried without duplicates, and close.

Rule: docs/rules.md#write-behind-and-the-flush-barrier. Waits in these tests only bound a hung
test; no assertion is about time.
"""

from __future__ import annotations

import asyncio
import errno
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dsh._errors import ConfigError, SessionBusyError, WriteFailedError
from dsh.persistence import Persistence, open_backend
from dsh.persistence import _write_behind as write_behind
from dsh.persistence._write_behind import MAX_BATCH_WINDOW_MS, SessionWriter, WriteBehind
from dsh.session import Session, SessionStore
from dsh.testing import CWD, header, plain

from .conftest import store_url, stored_events, turn, wait_until, writer_of


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, MAX_BATCH_WINDOW_MS + 1, "200"])
def test_write_behind_rejects_invalid_window(bad: Any) -> None:
    # docs/rules.md#persistence "rejects invalid write batch delay %s" (0, 1.5, max+1)
    with pytest.raises(ConfigError, match="batch_window_ms"):
        WriteBehind(batch_window_ms=bad)


def test_write_behind_is_frozen_with_default_window() -> None:
    config = WriteBehind()
    assert config.batch_window_ms == 200
    with pytest.raises(AttributeError):
        config.batch_window_ms = 5  # type: ignore[misc]


def test_fixed_window_holds_events_until_flush(tmp_path: Path) -> None:
    # docs/rules.md#write-behind-and-the-flush-barrier "uses one fixed window from the first queued
    # event"; flush is the barrier
    persistence = Persistence(open_backend(f"jsonl://{tmp_path}/r"),
                              write_behind=WriteBehind(batch_window_ms=600_000))
    store = SessionStore(persistence)
    session = store.create("a", header={"cwd": CWD})
    writer = writer_of(persistence, store, session)
    batches: list[int] = []
    real_append = writer.handle.append

    def counting(events: Any) -> None:
        batches.append(len(events))
        real_append(events)

    writer.handle.append = counting
    for n in range(1, 5):
        turn(session, n)
    time.sleep(0.05)
    assert batches == []  # the 10-minute window has not expired
    store.flush(session)
    assert batches == [24]  # one batch, the whole pending prefix
    assert len(stored_events(persistence, "a")) == 24
    store.dispose(session)
    persistence.close()


def test_short_window_writes_in_background_without_flush(tmp_path: Path) -> None:
    # docs/rules.md#write-behind-and-the-flush-barrier background writes happen when the window
    # expires
    persistence = Persistence(open_backend(f"jsonl://{tmp_path}/r"),
                              write_behind=WriteBehind(batch_window_ms=1))
    store = SessionStore(persistence)
    session = store.create("a", header={"cwd": CWD})
    turn(session, 1)
    wait_until(lambda: len(stored_events(persistence, "a")) == 6)
    store.dispose(session)
    persistence.close()


def test_per_turn_flushes_do_not_wake_the_writer_thread(tmp_path: Path) -> None:
    # docs/rules.md#write-behind-and-the-flush-barrier: a flush that finds the writer idle writes on
    # its own thread, and the next turn's first event arms a window that ends after the writer's
    # current sleep, so the writer thread is not woken (a wake-up costs a thread switch inside the
    # producer's turn)
    persistence = Persistence(open_backend(f"sqlite://{tmp_path}/s.db"),
                              write_behind=WriteBehind(batch_window_ms=600_000))
    store = SessionStore(persistence)
    session = store.create("a", header={"cwd": CWD})
    turn(session, 1)
    store.flush(session)
    writer = writer_of(persistence, store, session)
    wakes: list[float | None] = []
    real_wait = writer._cond.wait

    def counting(timeout: float | None = None) -> bool:
        wakes.append(timeout)
        return bool(real_wait(timeout))

    writer._cond.wait = counting
    for n in range(2, 12):
        turn(session, n)
        store.flush(session)
    assert wakes == []
    assert len(stored_events(persistence, "a")) == 66
    store.dispose(session)
    persistence.close()


def test_idle_writer_writes_at_its_window_whether_polling_or_asleep(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/rules.md#write-behind-and-the-flush-barrier the window still ends the batch when the
    # writer was not woken by the event that armed it (it polls one window at a time), and after the
    # idle polling stops (asleep until an event wakes it)
    monkeypatch.setattr(write_behind, "IDLE_POLL_S", 0.5)
    persistence = Persistence(open_backend(f"jsonl://{tmp_path}/r"),
                              write_behind=WriteBehind(batch_window_ms=60))
    store = SessionStore(persistence)
    session = store.create("a", header={"cwd": CWD})
    writer = writer_of(persistence, store, session)
    turn(session, 1)
    store.flush(session)
    wait_until(lambda: writer._wake_at is not None and not writer._pending)  # polling
    turn(session, 2)
    wait_until(lambda: len(stored_events(persistence, "a")) == 12)
    wait_until(lambda: writer._wake_at is None, timeout=5.0)  # polling ended: asleep
    turn(session, 3)
    wait_until(lambda: len(stored_events(persistence, "a")) == 18)
    store.dispose(session)
    persistence.close()


def test_events_queued_during_a_flush_written_on_its_thread_wait_for_that_write(
        tmp_path: Path) -> None:
    # docs/rules.md#persistence: one write of a handle at a time. Events appended (say on the
    # asyncio loop, while aflush runs in a worker) during a flush that writes on its own thread used
    # to be taken by the writer thread at once: a second append overlapping the first (a seq
    # mismatch, a spurious WriteFailedError) and a later barrier returning before they were durable
    persistence = Persistence(open_backend(f"jsonl://{tmp_path}/r"),
                              write_behind=WriteBehind(batch_window_ms=600_000))
    store = SessionStore(persistence)
    session = store.create("a", header={"cwd": CWD})
    turn(session, 1)
    store.flush(session)
    writer = writer_of(persistence, store, session)
    real_append = writer.handle.append
    writing: list[str] = []
    overlaps: list[list[str]] = []
    inline_started, release = threading.Event(), threading.Event()

    def slow_append(events: Any) -> None:
        name = threading.current_thread().name
        if writing:
            overlaps.append([*writing, name])
        writing.append(name)
        try:
            if name == "flusher":
                inline_started.set()
                release.wait(10)
            real_append(events)
        finally:
            writing.remove(name)

    writer.handle.append = slow_append
    turn(session, 2)
    errors: list[BaseException] = []

    def flusher() -> None:
        try:
            store.flush(session)
        except Exception as exc:  # reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=flusher, name="flusher")
    thread.start()
    assert inline_started.wait(10)
    turn(session, 3)  # queued while the flush writes turn 2 on its own thread
    time.sleep(0.2)  # room for a writer thread that (wrongly) takes them at once
    release.set()
    thread.join()
    store.flush(session)  # a barrier after turn 3 was queued: it is durable on return
    assert (errors, overlaps, writing) == ([], [], [])
    assert len(stored_events(persistence, "a")) == 18
    store.dispose(session)
    persistence.close()


def _fail_once(writer: Any) -> threading.Event:
    called = threading.Event()
    real_append = writer.handle.append
    state = {"failed": False}

    def flaky(events: Any) -> None:
        if not state["failed"]:
            state["failed"] = True
            called.set()
            raise OSError(errno.ENOSPC, "No space left on device")
        real_append(events)

    writer.handle.append = flaky
    return called


@pytest.mark.parametrize("window", [1, 600_000])
def test_injected_enospc_raised_by_next_flush_then_log_completes(
        backend_kind: str, tmp_path: Path, window: int, caplog: pytest.LogCaptureFixture) -> None:
    # an I/O error during a (background or barrier) write: next flush raises
    # WriteFailedError, events are kept, later appends still reach disk, no duplicate seq
    persistence = Persistence(open_backend(store_url(backend_kind, tmp_path)),
                              write_behind=WriteBehind(batch_window_ms=window))
    store = SessionStore(persistence)
    session = store.create("a", header={"cwd": CWD})
    writer = writer_of(persistence, store, session)
    called = _fail_once(writer)
    turn(session, 1)
    if window == 1:
        assert called.wait(10)
        wait_until(lambda: writer._failure is not None)
        assert "background write" in caplog.text
    with pytest.raises(WriteFailedError) as info:
        store.flush(session)
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == errno.ENOSPC
    turn(session, 2)
    store.flush(session)
    events = stored_events(persistence, "a")
    assert [e["seq"] for e in events] == list(range(12))
    assert events == plain(session.events)
    store.dispose(session)
    persistence.close()


def test_aflush_does_not_block_the_event_loop(tmp_path: Path) -> None:
    # docs/rules.md#write-behind-and-the-flush-barrier: async wrappers never block the loop
    persistence = Persistence(open_backend(f"jsonl://{tmp_path}/r"),
                              write_behind=WriteBehind(batch_window_ms=600_000))
    store = SessionStore(persistence)
    session = store.create("a", header={"cwd": CWD})
    writer = writer_of(persistence, store, session)
    loop_ran = threading.Event()
    real_append = writer.handle.append

    def slow(events: Any) -> None:
        loop_ran.wait(10)  # only the event loop can release this write
        real_append(events)

    writer.handle.append = slow
    turn(session, 1)

    async def main() -> None:
        async def ticker() -> None:
            await asyncio.sleep(0)
            loop_ran.set()

        await asyncio.gather(store.aflush(session), ticker())

    asyncio.run(main())
    assert loop_ran.is_set()
    assert len(stored_events(persistence, "a")) == 6
    store.dispose(session)
    persistence.close()


def test_dispose_drains_buffered_events_and_releases_the_writer(tmp_path: Path) -> None:
    # docs/rules.md#persistence "session disposal drains buffered events before retiring ownership"
    persistence = Persistence(open_backend(f"jsonl://{tmp_path}/r"),
                              write_behind=WriteBehind(batch_window_ms=600_000))
    store = SessionStore(persistence)
    session = store.create("a", header={"cwd": CWD})
    turn(session, 1)
    with pytest.raises(SessionBusyError):
        persistence.open("a", "write")
    store.dispose(session)
    assert len(stored_events(persistence, "a")) == 6
    persistence.open("a", "write").close()
    persistence.close()


def test_close_drains_live_sessions(tmp_path: Path) -> None:
    # docs/rules.md#persistence "HMR: dispose drains remaining buffers" (backend teardown)
    persistence = Persistence(open_backend(f"jsonl://{tmp_path}/r"),
                              write_behind=WriteBehind(batch_window_ms=600_000))
    store = SessionStore(persistence)
    session = store.create("a", header={"cwd": CWD})
    turn(session, 1)
    persistence.close()
    fresh = Persistence(open_backend(f"jsonl://{tmp_path}/r"))
    assert len(stored_events(fresh, "a")) == 6


# --- the writer on its own, over a real handle ------------------------------------------------


class _Recording:
    """A real JSONL write handle that records each batch and can fail the next appends."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches: list[list[int]] = []
        self.fail_next = 0
        self.closed = False

    def append(self, events: Any) -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise OSError(errno.EIO, "I/O error")
        self.batches.append([e["seq"] for e in events])
        self.inner.append(events)

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.closed = True
        self.inner.close()


def _writer(tmp_path: Path, *, window: int = 600_000) -> tuple[Persistence, Session,
                                                               _Recording, SessionWriter]:
    persistence = Persistence(open_backend(f"jsonl://{tmp_path}/r"))
    session = Session.create("w", header=header("w"))
    persistence.create(session.header)
    handle = _Recording(persistence.open("w", "write"))
    writer = SessionWriter(session, handle, 0, WriteBehind(batch_window_ms=window),  # type: ignore[arg-type]
                           persistence.url)
    return persistence, session, handle, writer


def test_writer_writes_the_pending_prefix_as_one_batch_at_the_barrier(tmp_path: Path) -> None:
    persistence, session, handle, writer = _writer(tmp_path)
    turn(session, 1)
    writer.enqueue(session.events[:3])
    writer.enqueue(session.events[3:])
    assert handle.batches == []  # the ten-minute window holds them
    writer.flush()
    assert handle.batches == [[0, 1, 2, 3, 4, 5]]
    assert stored_events(persistence, "w") == plain(session.events)
    writer.close()
    persistence.close()


def test_writer_drops_events_below_its_cursor_so_a_retry_never_duplicates(
        tmp_path: Path) -> None:
    persistence, session, handle, writer = _writer(tmp_path)
    turn(session, 1)
    turn(session, 2)
    writer.enqueue(session.events[:6])
    writer.flush()
    writer.enqueue(session.events[3:])  # 3..5 are stored already
    writer.flush()
    assert handle.batches == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    assert writer.cursor == 12
    assert [e["seq"] for e in stored_events(persistence, "w")] == list(range(12))
    writer.close()
    persistence.close()


def test_failed_barrier_write_keeps_the_batch_in_order_for_the_next_flush(
        tmp_path: Path) -> None:
    persistence, session, handle, writer = _writer(tmp_path)
    turn(session, 1)
    writer.enqueue(session.events)
    handle.fail_next = 2
    for _ in range(2):
        with pytest.raises(WriteFailedError, match="kept for the next flush") as info:
            writer.flush()
        assert isinstance(info.value.__cause__, OSError)
    assert writer.has_work() and handle.batches == []
    turn(session, 2)
    writer.enqueue(session.events[6:])
    writer.flush()
    assert handle.batches == [list(range(12))]  # the kept batch first, then the new events
    assert stored_events(persistence, "w") == plain(session.events)
    writer.close()
    persistence.close()


def test_close_drains_then_closes_the_handle_and_ends_the_thread(tmp_path: Path) -> None:
    persistence, session, handle, writer = _writer(tmp_path)
    turn(session, 1)
    writer.enqueue(session.events)
    writer.close()
    assert handle.closed and handle.batches == [[0, 1, 2, 3, 4, 5]]
    assert "dsh-write-behind:w" not in {t.name for t in threading.enumerate()}
    persistence.open("w", "write").close()  # the write lock was released
    assert stored_events(persistence, "w") == plain(session.events)
    persistence.close()


def test_failed_final_drain_keeps_the_writer_usable_for_a_retry(tmp_path: Path) -> None:
    persistence, session, handle, writer = _writer(tmp_path)
    turn(session, 1)
    writer.enqueue(session.events)
    handle.fail_next = 1
    with pytest.raises(WriteFailedError):
        writer.close()
    assert not handle.closed and writer.has_work()
    writer.close()
    assert handle.closed and stored_events(persistence, "w") == plain(session.events)
    persistence.close()


def test_abandon_closes_without_draining(tmp_path: Path) -> None:
    persistence, session, handle, writer = _writer(tmp_path)
    turn(session, 1)
    writer.enqueue(session.events)
    writer.abandon()
    assert handle.closed and handle.batches == []
    assert stored_events(persistence, "w") == []
    persistence.close()


def _write_behind_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("dsh-write-behind:")]


def test_flush_only_writes_at_the_barrier_on_the_callers_thread_and_starts_no_thread(
        backend_kind: str, tmp_path: Path) -> None:
    # WriteBehind(flush_only=True): no writer thread, no window; a flush writes everything
    # queued (durable on return), a failed write is raised by that flush and retried without
    # duplicates, events queued during a flush's write are written by that barrier
    persistence = Persistence(open_backend(store_url(backend_kind, tmp_path)),
                              write_behind=WriteBehind(batch_window_ms=1, flush_only=True))
    store = SessionStore(persistence)
    before = _write_behind_threads()
    session = store.create("a", header={"cwd": CWD})
    writer = writer_of(persistence, store, session)
    assert writer._thread is None and _write_behind_threads() == before
    turn(session, 1)
    time.sleep(0.05)  # a 1 ms window: a writer thread would have written by now
    assert len(stored_events(persistence, "a")) == 0
    writers: list[str] = []
    real_append = writer.handle.append

    def appending(events: Any) -> None:
        writers.append(threading.current_thread().name)
        if len(writers) == 1:
            turn(session, 2)  # another producer appends while the barrier writes turn 1
        real_append(events)

    writer.handle.append = appending
    store.flush(session)
    assert writers == [threading.current_thread().name] * 2
    assert len(stored_events(persistence, "a")) == 12
    writer.handle.append = real_append
    _fail_once(writer)
    turn(session, 3)
    with pytest.raises(WriteFailedError):
        store.flush(session)
    assert len(stored_events(persistence, "a")) == 12  # kept in memory for the retry
    turn(session, 4)
    store.flush(session)
    events = stored_events(persistence, "a")
    assert [e["seq"] for e in events] == list(range(24))
    assert events == plain(session.events)
    turn(session, 5)
    store.dispose(session)  # the final drain writes what is left
    assert len(stored_events(persistence, "a")) == 30
    persistence.close()


@pytest.mark.parametrize("bad", [1, None, "yes"])
def test_write_behind_rejects_a_flush_only_that_is_not_a_bool(bad: Any) -> None:
    with pytest.raises(ConfigError, match="flush_only"):
        WriteBehind(flush_only=bad)

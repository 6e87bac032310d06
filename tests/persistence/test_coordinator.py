"""Write-behind, flush barrier, live binding, load/inspect of live ids and resume (persistence
docs/rules.md#persistence, docs/rules.md#resume,
docs/rules.md#write-behind-and-the-flush-barrier)."""

from __future__ import annotations

import asyncio
import errno
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dsh._errors import (
    ConfigError,
    PersistenceError,
    SessionBusyError,
    SessionExistsError,
    WriteFailedError,
)
from dsh.json import dumps, loads
from dsh.persistence import Persistence, open_backend
from dsh.persistence import _write_behind as write_behind
from dsh.persistence._observer import PersistenceObserver
from dsh.persistence._write_behind import MAX_BATCH_WINDOW_MS, WriteBehind
from dsh.session._store import SessionStore
from dsh.testing import CWD, LogBuilder, assistant, header, plain, user

from .conftest import inject_torn_tail, store_url


def stored_events(persistence: Persistence, sid: str) -> list[dict[str, Any]]:
    with persistence.open(sid) as handle:
        return plain(handle.read().events)


def observer_of(persistence: Persistence, store: SessionStore) -> PersistenceObserver:
    return persistence.bind(store)


def writer_of(persistence: Persistence, store: SessionStore, session: Any) -> Any:
    return observer_of(persistence, store)._writers[id(session)]


def turn(session: Any, n: int) -> None:
    session.append("turn/start", {"turn": n})
    session.append("step/start", {"turn": n, "step": 1})
    session.append("user/message", user(f"q{n}", f"u{n}"), surface_op="append")
    session.append("assistant/message", assistant(n, 1, f"a{n}", f"a{n}"), surface_op="append")
    session.append("step/end", {"turn": n, "step": 1})
    session.append("turn/end", {"turn": n, "reason": {"kind": "completed"}})


def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.005)


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


def test_live_session_persists_through_store_and_survives_reload(
        backend_kind: str, tmp_path: Path) -> None:
    # docs/rules.md#persistence "persists a live session driven through the store, surviving reload"
    persistence = Persistence(open_backend(store_url(backend_kind, tmp_path)))
    store = SessionStore(persistence)
    session = store.create("a", header={"cwd": CWD})
    turn(session, 1)
    turn(session, 2)
    store.flush(session)
    if backend_kind != "memory":
        fresh = Persistence(open_backend(store_url(backend_kind, tmp_path)))
        assert stored_events(fresh, "a") == plain(session.events)
        fresh.close()
    assert stored_events(persistence, "a") == plain(session.events)
    store.dispose(session)
    persistence.close()


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


def test_fork_child_persists_seed_once(tmp_path: Path) -> None:
    # docs/rules.md#persistence "fork: a seeded new session persists its seed once"
    persistence = Persistence(open_backend(f"jsonl://{tmp_path}/r"))
    store = SessionStore(persistence)
    parent = store.create("p", header={"cwd": CWD})
    turn(parent, 1)
    child = store.fork(parent, 5, "c")
    store.flush(child)
    store.flush(child)
    events = stored_events(persistence, "c")
    assert events == plain(child.events)
    assert [e["seq"] for e in events] == list(range(7))
    assert events[6]["type"] == "session/end-seed"
    with persistence.open("c") as handle:
        head = handle.read().header
    assert head["parentSession"] == "p" and head["seedLength"] == 6
    persistence.close()


def test_new_session_colliding_with_stored_log_is_vetoed(tmp_path: Path) -> None:
    # docs/rules.md#persistence "a NEW live session colliding on a persisted id is rejected, not
    # silently adopted"
    persistence = Persistence(open_backend(f"jsonl://{tmp_path}/r"))
    store = SessionStore(persistence)
    session = store.create("a", header={"cwd": CWD})
    turn(session, 1)
    store.dispose(session)
    other = SessionStore(persistence)
    fresh = other.prepare("a", seed=[], header={"cwd": CWD})
    other.enter(fresh)
    with pytest.raises(SessionExistsError, match="id collision"):
        other.announce(fresh)
    assert len(stored_events(persistence, "a")) == 6
    persistence.close()


def test_resume_closes_interrupted_turn_then_publishes_with_end_seed(
        backend_kind: str, tmp_path: Path) -> None:
    # docs/rules.md#resume: write ownership first, cold read, closers durably, restore, publish
    persistence = Persistence(open_backend(store_url(backend_kind, tmp_path)))
    builder = LogBuilder("s")
    builder.completed_turn()
    builder.tool_call_turn("call_7", recorded=True)
    persistence.create(header("s"))
    with persistence.open("s", "write") as handle:
        handle.append(builder.events)
        handle.flush()
    store = SessionStore(persistence)
    session = store.resume("s")
    n = len(builder.events)
    assert [e.type for e in session.events[n:]] == [
        "tool/result", "step/end", "turn/end", "session/end-seed"]
    assert session.first_live_seq == n + 3
    assert store.get("s") is session
    # the closers are durable before publication; the end-seed follows through write-behind
    with pytest.raises(SessionBusyError):
        persistence.open("s", "write")
    with pytest.raises(SessionBusyError):
        persistence.resume(SessionStore(persistence), "s")
    store.flush(session)
    assert stored_events(persistence, "s") == plain(session.events)
    turn(session, 3)
    store.dispose(session)
    events = stored_events(persistence, "s")
    assert [e["seq"] for e in events] == list(range(n + 4 + 6))
    persistence.close()


def test_resume_of_torn_jsonl_truncates_then_appends_closers(tmp_path: Path) -> None:
    # resume truncates the torn tail, then appends closers; every line parses
    persistence = Persistence(open_backend(f"jsonl://{tmp_path}/r"))
    builder = LogBuilder("s")
    builder.completed_turn()
    builder.tool_call_turn("call_1", recorded=True)
    persistence.create(header("s"))
    with persistence.open("s", "write") as handle:
        handle.append(builder.events)
        handle.flush()
        path = handle.path  # type: ignore[attr-defined]
    committed = path.read_bytes()
    assert inject_torn_tail(persistence, "s")
    store = SessionStore(persistence)
    session = store.resume("s")
    store.flush(session)
    data = path.read_bytes()
    assert data.startswith(committed)
    records = [loads(line) for line in data[:-1].split(b"\n")]
    assert [r["type"] for r in records[-4:]] == [
        "tool/result", "step/end", "turn/end", "session/end-seed"]
    store.dispose(session)
    persistence.close()


def test_live_session_is_never_read_as_stored(tmp_path: Path) -> None:
    # docs/rules.md#persistence "rejects crash-repair load while a live session owns the persisted
    # prefix"; docs/rules.md#persistence "inspects an open live turn without balancing it"
    persistence = Persistence(open_backend(f"jsonl://{tmp_path}/r"))
    store = SessionStore(persistence)
    session = store.create("a", header={"cwd": CWD})
    turn(session, 1)
    session.append("turn/start", {"turn": 2})
    inspected = persistence.inspect("a")
    assert inspected.live and inspected.closers == ()
    assert inspected.events[-1].type == "turn/start"
    with pytest.raises(PersistenceError, match="while its live turn is open"):
        persistence.load("a")
    with pytest.raises(SessionBusyError, match="while it is live"):
        persistence.resume(SessionStore(persistence), "a")
    assert [e["type"] for e in stored_events(persistence, "a")][-1] == "turn/start"
    store.dispose(session)
    persistence.close()


def test_resume_refuses_to_publish_over_live_id_and_releases_handle(tmp_path: Path) -> None:
    # docs/rules.md#resume "resume setup rejection publishes nothing, unwinds, and releases the
    # identity"
    persistence = Persistence(open_backend(f"jsonl://{tmp_path}/r"))
    builder = LogBuilder("s")
    builder.completed_turn()
    persistence.create(header("s"))
    with persistence.open("s", "write") as handle:
        handle.append(builder.events)
        handle.flush()

    class Veto:
        def on_created(self, session: Any) -> None:
            raise RuntimeError("veto")

    store = SessionStore(persistence)
    store.observe(Veto())
    with pytest.raises(RuntimeError, match="veto"):
        store.resume("s")
    assert store.get("s") is None
    persistence.open("s", "write").close()  # ownership released
    assert len(stored_events(persistence, "s")) == 6
    persistence.close()


def test_pipeline_runs_legacy_normalisation(tmp_path: Path) -> None:
    # docs/rules.md#persistence "loads pre-react-loop session logs into resumable current sessions"
    persistence = Persistence(open_backend("memory:"))
    persistence.create(header("s"))
    from dsh.testing import make
    legacy = [
        make("turn/start", 0, {"turn": 1, "trigger": {"kind": "user"}}),
        make("user/message", 1, {"content": [{"type": "text", "text": "hi"}],
                                 "source": {"kind": "user"}}, surfaceOp="append"),
        make("turn/end", 2, {"turn": 1, "reason": {"kind": "disposed"}}),
    ]
    with persistence.open("s", "write") as handle:
        handle.append(legacy)
    got = persistence.inspect("s").events
    assert got[0].data == {"turn": 1}
    assert got[1].data["id"] == "legacy-message:s:1" and got[1].data["role"] == "user"
    assert got[2].data["reason"] == {"kind": "aborted", "reason": {"kind": "disposed"}}
    with persistence.open("s", "write") as handle:
        handle.append([make("mode/set", 3, {})])
    with pytest.raises(PersistenceError, match="unsupported legacy mode/set event"):
        persistence.inspect("s")


def test_dumps_roundtrip_helper_is_compact() -> None:
    assert dumps({"a": 1}) == b'{"a":1}'


def test_recreated_session_with_stored_prefix_appends_only_the_suffix(tmp_path: Path) -> None:
    # docs/rules.md#persistence "resume: a re-created session seeded with the loaded log does not
    # re-append its seed and continues the seq"; "HMR adoption does NOT crash-repair an active open
    # turn"
    persistence = Persistence(open_backend(f"jsonl://{tmp_path}/r"))
    builder = LogBuilder("s")
    builder.completed_turn()
    builder.open_turn()
    persistence.create(header("s"))
    with persistence.open("s", "write") as handle:
        handle.append(builder.events)
        handle.flush()
        path = handle.path  # type: ignore[attr-defined]
    committed = path.read_bytes()
    assert inject_torn_tail(persistence, "s")
    store = SessionStore(persistence)
    session = store.prepare("s", seed=builder.events, header=header("s"))
    store.enter(session)
    store.announce(session)
    store.flush(session)
    data = path.read_bytes()
    assert data.startswith(committed)
    tail = [loads(line) for line in data[len(committed):-1].split(b"\n")]
    assert [r["type"] for r in tail] == ["session/end-seed"]  # no closers for a live turn
    assert stored_events(persistence, "s") == plain(session.events)
    store.dispose(session)
    persistence.close()


def test_live_session_claims_created_but_empty_stored_session(backend_kind: str,
                                                             tmp_path: Path) -> None:
    # docs/rules.md#persistence "a live session claims cursor-0 ownerless state created via the
    # public API"
    persistence = Persistence(open_backend(store_url(backend_kind, tmp_path)))
    persistence.create(header("s"))
    store = SessionStore(persistence)
    session = store.create("s", header=header("s"))
    turn(session, 1)
    store.flush(session)
    assert stored_events(persistence, "s") == plain(session.events)
    store.dispose(session)
    persistence.close()


def test_concurrent_flushes_share_one_barrier(tmp_path: Path) -> None:
    # docs/rules.md#write-behind-and-the-flush-barrier "makes concurrent flushes one immediate
    # barrier that drains admitted tails"
    persistence = Persistence(open_backend(f"jsonl://{tmp_path}/r"),
                              write_behind=WriteBehind(batch_window_ms=600_000))
    store = SessionStore(persistence)
    session = store.create("a", header={"cwd": CWD})
    turn(session, 1)
    errors: list[BaseException] = []

    def flush() -> None:
        try:
            store.flush(session)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=flush) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(stored_events(persistence, "a")) == 6
    store.dispose(session)
    persistence.close()


def test_failed_fsync_in_background_is_retried_without_gap(tmp_path: Path) -> None:
    # docs/formats.md#writing + docs/rules.md#write-behind-and-the-flush-barrier: an fsync failure
    # removes the batch from the file; the writer keeps it and the next flush raises, then the log
    # completes with no duplicate or missing seq
    persistence = Persistence(open_backend(f"jsonl://{tmp_path}/r"),
                              write_behind=WriteBehind(batch_window_ms=600_000))
    store = SessionStore(persistence)
    session = store.create("a", header={"cwd": CWD})
    turn(session, 1)
    store.flush(session)
    backend: Any = persistence.backend
    real_fsync = backend._os_fsync
    state = {"failed": False}

    def flaky_fsync(fd: int) -> None:
        if not state["failed"]:
            state["failed"] = True
            raise OSError(errno.EIO, "I/O error")
        real_fsync(fd)

    backend._os_fsync = flaky_fsync
    turn(session, 2)
    with pytest.raises(WriteFailedError):
        store.flush(session)
    assert len(stored_events(persistence, "a")) == 6
    store.flush(session)
    assert stored_events(persistence, "a") == plain(session.events)
    store.dispose(session)
    persistence.close()

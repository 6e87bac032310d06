"""Live binding, load/inspect of live ids and resume (docs/rules.md#persistence,
docs/rules.md#resume). The write-behind writer has its own module, test_write_behind.py."""

from __future__ import annotations

import errno
import threading
from pathlib import Path
from typing import Any

import pytest

from dsh._errors import (
    LogCorruptError,
    PersistenceError,
    SessionBusyError,
    SessionExistsError,
    WriteFailedError,
)
from dsh.json import dumps, loads
from dsh.persistence import Persistence, open_backend
from dsh.persistence._write_behind import WriteBehind
from dsh.session._store import SessionStore
from dsh.testing import CWD, LogBuilder, header, plain

from .conftest import inject_torn_tail, store_url, stored_events, turn


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


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_crash_repair_checks_seqs_unless_the_read_required_them(tmp_path: Path,
                                                                 kind: str) -> None:
    # docs/rules.md#the-read-pipeline step 5: a JSONL read already required the next seq on
    # every record (docs/formats.md#reading-the-committed-region), other reads are checked
    from dsh.persistence._contract import ColdRead
    from dsh.persistence._read import read_pipeline
    from dsh.testing import make

    persistence = Persistence(open_backend(store_url(kind, tmp_path)))
    persistence.create(header("s"))
    events = [make("turn/start", 0, {"turn": 1, "trigger": {"kind": "user"}}),
              make("step/start", 1, {"turn": 1, "step": 1})]
    with persistence.open("s", "write") as handle:
        handle.append(events)
    with persistence.open("s", "read") as handle:
        cold = handle.read(0)
    assert cold.contiguous is True
    _, closers = read_pipeline("s", cold)
    assert [c["type"] for c in closers] == ["step/end", "turn/end"]
    assert [c["seq"] for c in closers] == [2, 3]
    gap = ColdRead(cold.header, (events[0], make("step/start", 2, {"turn": 1, "step": 1})),
                   None, "r")
    with pytest.raises(LogCorruptError, match="found seq 2 at index 1") as info:
        read_pipeline("s", gap)
    assert info.value.where["seq"] == 1

"""SessionStore lifecycle: prepare/enter/announce/create, observers, flush, dispose.

Rule: docs/rules.md#live-sessions.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from dsh._errors import (
    ConfigError,
    EventRejectedError,
    SessionExistsError,
    SessionNotFoundError,
)
from dsh.session._events import Event
from dsh.session._session import Session
from dsh.session._store import SessionStore
from tests.strategies import StepClock, completed_turn, user_message


class Recorder:
    """A store observer that records every callback as (name, session id, extra)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_created(self, session: Session) -> None:
        self.calls.append(("created", session.id))

    def on_event(self, session: Session, event: Event) -> None:
        self.calls.append(("event", session.id, event.seq))

    def on_flush(self, session: Session) -> None:
        self.calls.append(("flush", session.id))

    def on_disposed(self, session: Session) -> None:
        self.calls.append(("disposed", session.id))


def make_store(*observers: Any) -> SessionStore:
    store = SessionStore(clock=StepClock(1_000))
    for observer in observers:
        store.observe(observer)
    return store


def test_store_creates_sessions_and_emits_created_and_event() -> None:
    rec = Recorder()
    store = make_store(rec)
    s = store.create("a")
    s.append("session/title", {})
    assert rec.calls == [("created", "a"), ("event", "a", 0)]
    assert store.get("a") is s and store.list() == [s]
    with pytest.raises(AttributeError):
        s.stray = 1  # type: ignore[attr-defined]  # slots: a stray attribute cannot hide the feed
    s.append("session/title", {})
    assert rec.calls[-1] == ("event", "a", 1)


def test_store_tells_a_batch_to_on_events_once_and_to_on_event_one_by_one() -> None:
    # docs/rules.md#live-sessions: the appends of a Session.batch block
    rec = Recorder()
    batches: list[tuple[str, list[int]]] = []

    class Batched:
        def on_events(self, session: Session, events: list[Event]) -> None:
            batches.append((session.id, [e.seq for e in events]))

        def on_event(self, session: Session, event: Event) -> None:
            batches.append((session.id, [event.seq]))

    store = make_store(rec, Batched())
    s = store.create("a")
    with s.batch():
        s.append("session/title", {})
        s.append("session/title", {})
        assert rec.calls == [("created", "a")] and batches == []
    assert rec.calls == [("created", "a"), ("event", "a", 0), ("event", "a", 1)]
    assert batches == [("a", [0, 1])]
    with s.batch():  # a batch of one event goes to on_event
        s.append("session/title", {})
    assert batches[-1] == ("a", [2])


def test_a_flush_inside_a_batch_publishes_what_the_block_committed_first() -> None:
    # docs/rules.md#write-behind-and-the-flush-barrier: flush(session) is the durability
    # barrier for every committed append; inside a Session.batch block the events committed so
    # far are published before on_flush (before, on_flush ran first: nothing was queued)
    import asyncio

    rec = Recorder()
    store = make_store(rec)
    s = store.create("a")
    with s.batch():
        s.append("session/title", {})
        s.append("session/title", {})
        store.flush(s)
        assert rec.calls[1:] == [("event", "a", 0), ("event", "a", 1), ("flush", "a")]
        s.append("session/title", {})
    assert rec.calls[4:] == [("event", "a", 2)]  # the rest when the block ends, once each

    async def flush_async() -> None:
        with s.batch():
            s.append("session/title", {})
            await store.aflush(s)
            assert rec.calls[5:] == [("event", "a", 3), ("flush", "a")]

    asyncio.run(flush_async())
    assert rec.calls[7:] == []


def test_store_rejects_duplicate_ids_and_supports_seeding() -> None:
    store = make_store()
    source = store.create("a")
    completed_turn(source, 1)
    with pytest.raises(SessionExistsError, match='session "a" already exists'):
        store.create("a")
    seeded = store.create("b", seed=source.events)
    assert seeded.derive_messages() == source.derive_messages()


def test_store_enter_rejects_a_stale_prepared_session_whose_id_is_live() -> None:
    store = make_store()
    stale = store.prepare("a")
    live = store.create("a")
    with pytest.raises(SessionExistsError, match="already exists"):
        store.enter(stale)
    assert store.get("a") is live


def test_store_prepare_enter_announce_register_and_emit() -> None:
    rec = Recorder()
    store = make_store(rec)
    s = store.prepare("a")
    assert store.get("a") is None and rec.calls == []
    detach = store.enter(s)
    assert store.get("a") is s and rec.calls == []
    store.announce(s)
    assert rec.calls == [("created", "a")]
    detach()
    detach()
    assert store.get("a") is None
    assert rec.calls == [("created", "a"), ("disposed", "a")]


def test_store_prevents_simultaneous_attachment_of_one_session_to_two_stores() -> None:
    first, second = make_store(), make_store()
    s = first.prepare("a")
    detach = first.enter(s)
    with pytest.raises(ConfigError, match="already attached to a store"):
        second.enter(s)
    detach()
    second.enter(s)
    assert second.get("a") is s and first.get("a") is None


def test_store_rejects_direct_and_reentrant_repeat_announcements() -> None:
    rec = Recorder()
    store = make_store(rec)
    errors: list[str] = []

    class Reentrant:
        def on_created(self, session: Session) -> None:
            try:
                store.announce(session)
            except ConfigError as exc:
                errors.append(str(exc))

    store.observe(Reentrant())
    s = store.create("a")
    with pytest.raises(ConfigError, match='session "a" was already announced'):
        store.announce(s)
    store.dispose(s)
    assert errors == ['session "a" was already announced']
    assert rec.calls == [("created", "a"), ("disposed", "a")]


def test_store_defers_a_reentrant_detach_until_the_creation_dispatch_unwinds() -> None:
    store = make_store()
    seen: list[Any] = []

    class Detacher:
        def on_created(self, session: Session) -> None:
            store.dispose(session)

    class Peer:
        def on_created(self, session: Session) -> None:
            seen.append(("peer sees live", store.get(session.id) is session))

        def on_disposed(self, session: Session) -> None:
            seen.append(("disposed, gone", store.get(session.id) is None))

    store.observe(Detacher())
    store.observe(Peer())
    store.create("a")
    assert seen == [("peer sees live", True), ("disposed, gone", True)]
    assert store.get("a") is None


def test_store_synthesizes_a_minimal_current_version_header() -> None:
    s = make_store().create("a")
    assert s.header == {"version": 0, "id": "a", "createdAt": 1_000}
    assert s.header.cwd is None and s.header.parent_session is None


def test_store_attaches_cwd_parent_origin_and_delegation_depth_from_meta() -> None:
    # docs/formats.md#header-metadata: an unknown scalar key is kept as metadata, others drop
    store = make_store()
    s = store.create("a", header={"cwd": "/w", "parentSession": "p", "createdAt": 5,
                                  "origin": "subagent", "delegationDepth": 2,
                                  "agentPreset": "coder", "tenant": "acme",
                                  "unknown": ["dropped"]})
    assert s.header == {"version": 0, "id": "a", "createdAt": 5, "cwd": "/w",
                        "parentSession": "p", "origin": "subagent", "delegationDepth": 2,
                        "agentPreset": "coder", "metadata": {"tenant": "acme"}}


@pytest.mark.parametrize(("meta", "fragment"), [
    ({"parentSession": 2**60}, "not losslessly JSON-serializable"),
    ({"cwd": 1}, "cwd must be a string"),
    ({"cwd": "rel"}, "cwd must be an absolute path"),
    ({"parentSession": 1}, "parentSession must be a string"),
    ({"createdAt": "1"}, "createdAt must be"),
    ({"createdAt": 1.5}, "createdAt must be"),
    ({"createdAt": -1}, "createdAt must be"),
    ({"createdAt": 2**53}, "not losslessly JSON-serializable"),
    ({"seedLength": -1}, "seedLength must be"),
    ({"origin": "fork"}, 'origin must be "subagent"'),
    ({"delegationDepth": 1.5}, "delegationDepth must be"),
    ({"agentPreset": 3}, "agentPreset must be a string"),
])
def test_store_rejects_non_json_and_invalid_scalar_session_metadata(
        meta: dict[str, Any], fragment: str) -> None:
    store = make_store()
    with pytest.raises(EventRejectedError, match=fragment):
        store.create("a", header=meta)
    assert store.get("a") is None


def test_store_detaches_a_disposed_session_and_stops_publishing() -> None:
    rec = Recorder()
    store = make_store(rec)
    s = store.create("a")
    store.dispose(s)
    assert store.get("a") is None
    s.append("session/title", {})
    assert s.seq == 1
    assert rec.calls == [("created", "a"), ("disposed", "a")]
    with pytest.raises(SessionNotFoundError, match="not live"):
        store.dispose(s)


def test_store_pairs_a_partial_announcement_with_disposal_during_rollback() -> None:
    rec = Recorder()
    store = make_store(rec)

    class Veto:
        def on_created(self, session: Session) -> None:
            raise RuntimeError("veto")

    remove = store.observe(Veto())
    with pytest.raises(RuntimeError, match="veto"):
        store.create("a")
    assert store.get("a") is None
    assert rec.calls == [("created", "a"), ("disposed", "a")]
    remove()
    s = store.create("a")
    s.append("session/title", {})
    assert rec.calls[-2:] == [("created", "a"), ("event", "a", 0)]


def test_store_a_veto_stops_later_created_observers() -> None:
    late = Recorder()
    store = make_store()

    class Veto:
        def on_created(self, session: Session) -> None:
            raise RuntimeError("veto")

    store.observe(Veto())
    store.observe(late)
    with pytest.raises(RuntimeError):
        store.create("a")
    assert late.calls == [("disposed", "a")]


def test_store_contains_event_observer_failures_after_the_commit_point(
        caplog: pytest.LogCaptureFixture) -> None:
    seen: list[Any] = []

    class Broken:
        def on_event(self, session: Session, event: Event) -> None:
            seen.append(("broken sees it logged", session.events[-1] is event))
            raise RuntimeError("listener broke")

    peer = Recorder()
    store = make_store(Broken(), peer)
    s = store.create("a")
    with caplog.at_level(logging.ERROR, logger="dsh.session._store"):
        event = s.append("session/title", {})
    assert event.seq == 0 and s.seq == 1
    assert seen == [("broken sees it logged", True)]
    assert peer.calls[-1] == ("event", "a", 0)
    assert "on_event observer" in caplog.text and "listener broke" in caplog.text


def test_store_contains_a_reentrant_observer_append_without_reordering(
        caplog: pytest.LogCaptureFixture) -> None:
    class Reenter:
        def on_event(self, session: Session, event: Event) -> None:
            session.append("plan/mode", {})

    peer = Recorder()
    store = make_store(Reenter(), peer)
    s = store.create("a")
    with caplog.at_level(logging.ERROR):
        s.append("goal/change", {})
    assert [e.type for e in s.events] == ["goal/change"]
    assert peer.calls[-1] == ("event", "a", 0)
    assert "cannot reenter" in caplog.text


def test_store_defers_detach_through_observer_publication() -> None:
    order: list[str] = []
    store = make_store()

    class Detacher:
        def on_event(self, session: Session, event: Event) -> None:
            store.dispose(session)
            order.append(f"detach requested, live={store.get(session.id) is session}")

    class Peer:
        def on_event(self, session: Session, event: Event) -> None:
            order.append(f"observe, live={store.get(session.id) is session}")

        def on_disposed(self, session: Session) -> None:
            order.append(f"dispose, live={store.get(session.id) is not None}")

    store.observe(Detacher())
    store.observe(Peer())
    s = store.create("a")
    s.append("session/title", {})
    assert order == ["detach requested, live=True", "observe, live=True", "dispose, live=False"]


def test_store_contains_disposed_listener_failures_per_observer(
        caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def on_disposed(self, session: Session) -> None:
            raise RuntimeError("dispose broke")

    peer = Recorder()
    store = make_store(Broken(), peer)
    never = store.prepare("quiet")
    detach = store.enter(never)
    detach()
    assert peer.calls == []
    s = store.create("a")
    with caplog.at_level(logging.ERROR, logger="dsh.session._store"):
        store.dispose(s)
    assert peer.calls == [("created", "a"), ("disposed", "a")]
    assert "on_disposed observer" in caplog.text


def test_store_a_stale_detach_cannot_remove_a_later_entry_with_the_same_id() -> None:
    store = make_store()
    first = store.prepare("a")
    detach = store.enter(first)
    detach()
    second = store.create("a")
    detach()
    assert store.get("a") is second


def test_store_mints_session_ids_skipping_live_ones() -> None:
    store = make_store()
    store.create("session-2")
    assert store.create().id == "session-1"
    assert store.create().id == "session-3"
    assert store.prepare().id == "session-4"


def test_store_flush_reports_participation_and_propagates_failures() -> None:
    store = make_store()
    s = store.create("a")
    assert store.flush(s) is False
    rec = Recorder()
    store.observe(rec)
    assert store.flush(s) is True and rec.calls == [("flush", "a")]

    class Failing:
        def on_flush(self, session: Session) -> None:
            raise OSError("disk full")

    late = Recorder()
    store.observe(Failing())
    store.observe(late)
    with pytest.raises(OSError, match="disk full"):
        store.flush(s)
    assert late.calls == [("flush", "a")]  # a failure does not starve later observers


def test_store_flush_rejects_a_session_that_is_not_live() -> None:
    store = make_store()
    detached = Session.create("x")
    with pytest.raises(SessionNotFoundError, match='session "x" is not live') as info:
        store.flush(detached)
    assert info.value.code == "SESSION_NOT_LIVE"
    s = store.create("a")
    store.dispose(s)
    with pytest.raises(SessionNotFoundError):
        store.flush(s)


def test_store_aflush_runs_flush_off_the_event_loop() -> None:
    rec = Recorder()
    store = make_store(rec)
    s = store.create("a")
    assert asyncio.run(store.aflush(s)) is True
    assert rec.calls[-1] == ("flush", "a")


def test_store_resume_requires_a_persistence_attachment() -> None:
    with pytest.raises(ConfigError, match="cannot resume: no persistence backend is attached"):
        make_store().resume("a")


def test_store_resume_delegates_to_the_persistence_attachment() -> None:
    calls: list[Any] = []

    class Backend:
        def bind(self, store: SessionStore) -> Any:
            calls.append("bind")
            return Recorder()

        def resume(self, store: SessionStore, session_id: str) -> Session:
            calls.append(("resume", session_id))
            return store.create(session_id, seed=[])

        def exists(self, session_id: str) -> bool:
            return False

        def close(self) -> None:
            calls.append("close")

    store = SessionStore(Backend())
    s = store.resume("a")
    assert calls == ["bind", ("resume", "a")]
    assert store.get("a") is s and [e.type for e in s.events] == ["session/end-seed"]
    store.close()
    assert calls[-1] == "close"


def test_store_prepare_from_persistence_restores_without_copying() -> None:
    source = Session.create("a")
    completed_turn(source, 1)
    store = make_store()
    s = store.prepare("a", seed=source.events, header=source.header, seed_source="persistence")
    assert all(x is y for x, y in zip(s.events, source.events, strict=False))
    assert s.events[-1].type == "session/end-seed"
    store.enter(s)
    store.announce(s)
    assert store.get("a") is s


def test_store_events_of_seeds_and_the_end_seed_are_not_published() -> None:
    rec = Recorder()
    store = make_store(rec)
    store.create("a", seed=[{"type": "x/y", "seq": 0, "time": 1, "data": {}}])
    assert rec.calls == [("created", "a")]


def test_store_unobserved_store_still_works_with_user_messages() -> None:
    store = make_store()
    s = store.create("a")
    s.append("user/message", user_message(), surface_op="append")
    assert store.get("a") is s and s.surface.nodes == [0]

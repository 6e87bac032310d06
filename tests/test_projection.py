"""Projection registry (core spec §14.2; checklist §16.15 ``registry.spec.ts``)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh._errors import ConfigError
from dsh.json import JsonValue
from dsh.projection import ProjectionDefinition, ProjectionRegistry
from dsh.session._events import Event
from dsh.session._session import Session


def count_users(state: JsonValue, event: Event) -> JsonValue:
    if event.type != "user/message":
        return state  # same object for ignored events
    return {"count": state["count"] + 1}


def parse_count(value: JsonValue) -> JsonValue:
    if not (isinstance(value, dict) and type(value.get("count")) is int):
        raise ValueError(f"not a count state: {value!r}")
    return value


def users_unit(*, version: int = 1, view: bool = True, key: str = "users"
               ) -> ProjectionDefinition:
    return ProjectionDefinition(
        key=key, init=lambda: {"count": 0}, apply=count_users, state_version=version,
        parse_state=parse_count,
        view=(lambda s: s["count"]) if view else None)


def todo_unit() -> ProjectionDefinition:
    def apply(state: JsonValue, event: Event) -> JsonValue:
        return event.data["todos"] if event.type == "todo/write" else state

    return ProjectionDefinition(key="todos", init=lambda: [], apply=apply, state_version=0,
                                view=lambda s: s)


def user(session: Session, words: str = "hi") -> Event:
    event: Event = session.append(
        "user/message", {"content": [{"type": "text", "text": words}],
                         "source": {"kind": "user"}, "role": "user", "id": words},
        surface_op="append")
    return event


def test_registry_drives_a_registered_unit_over_committed_events_and_snapshots_the_value(
) -> None:
    registry = ProjectionRegistry()
    registry.register(users_unit())
    session = Session.create("s")
    registry.attach(session)
    user(session)
    session.append("todo/write", {"todos": []})
    user(session)
    assert registry.state_of(session, "users") == {"count": 2}
    assert registry.snapshot(session) == {"asOfSeq": 2, "values": {"users": 2}}


def test_registry_builds_the_cell_lazily_from_the_full_log_for_a_late_unit() -> None:
    session = Session.create("s")
    user(session)
    user(session)
    registry = ProjectionRegistry()
    registry.register(users_unit())
    registry.attach(session)
    user(session)
    assert registry.state_of(session, "users") == {"count": 3}


def test_registry_serves_init_derived_state_and_as_of_seq_minus_one_for_an_empty_log() -> None:
    registry = ProjectionRegistry()
    registry.register(users_unit())
    session = Session.create("s")
    assert registry.snapshot(session) == {"asOfSeq": -1, "values": {"users": 0}}
    assert registry.state_of(session, "unknown") is None


def test_registry_notifies_on_changed_with_the_validated_view_and_skips_same_reference_applies(
) -> None:
    registry = ProjectionRegistry()
    registry.register(users_unit())
    changes: list[tuple[str, Any, int]] = []
    registry.on_changed(lambda s, key, view, seq: changes.append((key, view, seq)))
    session = Session.create("s")
    registry.attach(session)
    user(session)
    session.append("todo/write", {"todos": []})
    user(session)
    assert changes == [("users", 1, 0), ("users", 2, 2)]


def test_registry_drives_independently_per_session() -> None:
    registry = ProjectionRegistry()
    registry.register(users_unit())
    a, b = Session.create("a"), Session.create("b")
    registry.attach(a)
    registry.attach(b)
    user(a)
    user(a)
    user(b)
    assert registry.state_of(a, "users") == {"count": 2}
    assert registry.state_of(b, "users") == {"count": 1}


def test_registry_updates_host_only_units_without_publishing_them_to_wire_listeners() -> None:
    registry = ProjectionRegistry()
    registry.register(users_unit(view=False))
    changes: list[Any] = []
    registry.on_changed(lambda *args: changes.append(args))
    session = Session.create("s")
    registry.attach(session)
    user(session)
    assert changes == []
    assert registry.state_of(session, "users") == {"count": 1}
    assert registry.snapshot(session) == {"asOfSeq": 0, "values": {}}


def test_registry_shares_one_unit_and_keeps_it_until_the_last_registrant_releases_it() -> None:
    registry = ProjectionRegistry()
    first = registry.register(users_unit())
    second = registry.register(users_unit())
    session = Session.create("s")
    user(session)
    first()
    first()  # idempotent
    assert registry.state_of(session, "users") == {"count": 1}
    second()
    assert registry.keys() == ()
    assert registry.state_of(session, "users") is None


def test_registry_refuses_to_share_a_key_across_a_state_version_change() -> None:
    registry = ProjectionRegistry()
    registry.register(users_unit(version=1))
    with pytest.raises(ConfigError) as info:
        registry.register(users_unit(version=2))
    assert info.value.code == "PROJECTION_VERSION_CONFLICT"


@pytest.mark.parametrize("version", [-1, 1.5, 2**53, True])
def test_registry_rejects_a_non_integer_or_negative_state_version_at_register_time(
        version: Any) -> None:
    with pytest.raises(ConfigError, match="stateVersion"):
        ProjectionRegistry().register(users_unit(version=version))


def test_registry_disposer_removes_the_key_with_its_cells_and_frees_it() -> None:
    registry = ProjectionRegistry()
    dispose = registry.register(users_unit(version=1))
    session = Session.create("s")
    user(session)
    assert registry.state_of(session, "users") == {"count": 1}
    dispose()
    registry.register(users_unit(version=2))
    assert registry.checkpoint(session) == {"users": {"ver": 2, "seq": 0, "val": {"count": 1}}}


def test_registry_checkpoints_every_persisted_unit_with_its_state_version_and_watermark() -> None:
    registry = ProjectionRegistry()
    registry.register(users_unit())
    registry.register(users_unit(view=False, key="hidden", version=3))
    session = Session.create("s")
    user(session)
    session.append("todo/write", {"todos": []})
    assert registry.checkpoint(session) == {
        "users": {"ver": 1, "seq": 1, "val": {"count": 1}},
        "hidden": {"ver": 3, "seq": 1, "val": {"count": 1}}}


def test_registry_checkpoint_states_are_detached_clones() -> None:
    registry = ProjectionRegistry()
    registry.register(users_unit())
    session = Session.create("s")
    user(session)
    rows = registry.checkpoint(session)
    rows["users"]["val"]["count"] = 99
    assert registry.state_of(session, "users") == {"count": 1}


def test_registry_restore_floor_anchors_one_below_the_lowest_usable_watermark() -> None:
    registry = ProjectionRegistry()
    assert registry.restore_floor({}) is None
    registry.register(users_unit())
    registry.register(todo_unit())
    assert registry.restore_floor({"users": {"ver": 1, "seq": 9, "val": {"count": 1}},
                                   "todos": {"ver": 0, "seq": 4, "val": []}}) == 4
    # missing or mismatched rows need the whole log
    assert registry.restore_floor({"users": {"ver": 1, "seq": 9, "val": {"count": 1}}}) == 0
    assert registry.restore_floor({"users": {"ver": 7, "seq": 9, "val": {}},
                                   "todos": {"ver": 0, "seq": 4, "val": []}}) == 0


def _log(n_users: int) -> list[Event]:
    session = Session.create("log")
    for i in range(n_users):
        user(session, f"m{i}")
        session.append("todo/write", {"todos": [{"content": f"t{i}", "status": "pending"}]})
    return list(session.events)


def test_registry_restore_folds_the_tail_past_each_usable_row_and_refolds_on_mismatch() -> None:
    registry = ProjectionRegistry()
    registry.register(users_unit())
    registry.register(todo_unit())
    events = _log(3)  # seqs 0..5
    restored = registry.restore({"users": {"ver": 1, "seq": 1, "val": {"count": 40}},
                                 "todos": {"ver": 9, "seq": 1, "val": ["stale"]}}, events)
    assert restored.snapshot == {"asOfSeq": 5, "values": {
        "users": 42, "todos": [{"content": "t2", "status": "pending"}]}}
    assert restored.rows["users"] == {"ver": 1, "seq": 5, "val": {"count": 42}}
    assert restored.rows["todos"]["ver"] == 0


def test_registry_restore_over_a_suffix_folds_only_past_each_row_and_serves_an_empty_tail(
) -> None:
    registry = ProjectionRegistry()
    registry.register(users_unit())
    events = _log(3)
    restored = registry.restore({"users": {"ver": 1, "seq": 3, "val": {"count": 10}}},
                                events[4:], base_seq=4)
    assert restored.snapshot == {"asOfSeq": 5, "values": {"users": 11}}
    empty = registry.restore({"users": {"ver": 1, "seq": 5, "val": {"count": 7}}}, [],
                             base_seq=6)
    assert empty.snapshot == {"asOfSeq": 5, "values": {"users": 7}}


def test_registry_restore_rejects_a_row_claiming_events_past_the_supplied_log_end() -> None:
    registry = ProjectionRegistry()
    registry.register(users_unit())
    events = _log(1)  # seqs 0..1
    with pytest.raises(ConfigError) as info:
        registry.restore({"users": {"ver": 1, "seq": 9, "val": {"count": 5}}}, events[1:],
                         base_seq=1)
    assert info.value.code == "PROJECTION_REREAD"
    # from seq 0 an unusable row refolds from init instead
    assert registry.restore({"users": {"ver": 1, "seq": 9, "val": {"count": 5}}},
                            events).snapshot["values"] == {"users": 1}


def test_registry_view_checkpoint_serves_version_matching_rows_without_any_log() -> None:
    registry = ProjectionRegistry()
    registry.register(users_unit())
    registry.register(todo_unit())
    registry.register(users_unit(view=False, key="hidden"))
    assert registry.view_checkpoint({
        "users": {"ver": 1, "seq": 3, "val": {"count": 4}},
        "todos": {"ver": 5, "seq": 3, "val": []},
        "hidden": {"ver": 1, "seq": 3, "val": {"count": 4}}}) == {"users": 4}


def test_registry_rejects_version_matching_rows_whose_state_no_longer_matches_the_schema(
) -> None:
    registry = ProjectionRegistry()
    registry.register(users_unit())
    bad = {"users": {"ver": 1, "seq": 0, "val": {"count": "many"}}}
    assert registry.view_checkpoint(bad) == {}
    with pytest.raises(ConfigError) as info:
        registry.restore(bad, _log(1))
    assert info.value.code == "PROJECTION_SCHEMA"


def test_registry_fails_loud_when_a_unit_view_violates_its_own_schema() -> None:
    def parse_int(value: JsonValue) -> JsonValue:
        if type(value) is not int:
            raise ValueError("view must be an int")
        return value

    registry = ProjectionRegistry()
    registry.register(ProjectionDefinition(
        key="bad", init=lambda: {"count": 0}, apply=count_users, state_version=0,
        view=lambda s: str(s["count"]), parse_view=parse_int))
    with pytest.raises(ConfigError, match="view does not match its schema"):
        registry.snapshot(Session.create("s"))


def test_registry_cache_is_never_authoritative_for_a_different_log() -> None:
    # A cell whose watermark event is not in this log (e.g. a session object reused after a
    # restore with fewer events) is refolded, never trusted.
    registry = ProjectionRegistry()
    registry.register(users_unit())
    session = Session.create("s")
    user(session)
    user(session)
    assert registry.state_of(session, "users") == {"count": 2}
    cells = registry._cells[session]  # simulate a stale cell from another log
    cells["users"].observed_seq = 7
    assert registry.state_of(session, "users") == {"count": 2}


def test_registry_attach_unsubscribe_stops_driving_but_reads_still_catch_up() -> None:
    registry = ProjectionRegistry()
    registry.register(users_unit())
    changes: list[Any] = []
    registry.on_changed(lambda *args: changes.append(args[3]))
    session = Session.create("s")
    stop = registry.attach(session)
    user(session)
    stop()
    user(session)
    assert changes == [0]
    assert registry.state_of(session, "users") == {"count": 2}


def test_registry_removes_registrations_and_change_listeners_when_their_scope_closes() -> None:
    # §16.15 "removes registrations and change listeners when their owning fiber unloads";
    # a scope is our owner.
    registry = ProjectionRegistry()
    changes: list[Any] = []
    session = Session.create("s")
    registry.attach(session)
    with registry.scope() as scope:
        scope.register(users_unit())
        scope.on_changed(lambda *args: changes.append(args[3]))
        user(session)
        assert registry.keys() == ("users",)
    user(session)
    assert registry.keys() == ()
    assert changes == [0]
    scope.close()


EXAMPLES = int(os.environ.get("DSH_HYPOTHESIS_EXAMPLES", "25"))


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(st.sampled_from(["user", "todo", "read", "late"]), max_size=30))
def test_registry_driven_state_equals_a_fresh_fold_of_the_log(ops: list[str]) -> None:
    registry = ProjectionRegistry()
    registry.register(users_unit())
    session = Session.create("s")
    registry.attach(session)
    for index, op in enumerate(ops):
        if op == "user":
            user(session, f"m{index}")
        elif op == "todo":
            session.append("todo/write", {"todos": []})
        elif op == "read":
            registry.state_of(session, "users")
        elif op == "late" and registry.state_of(session, "todos") is None:
            registry.register(todo_unit())
    fresh = ProjectionRegistry()
    fresh.register(users_unit())
    assert registry.state_of(session, "users") == fresh.state_of(session, "users") == {
        "count": ops.count("user")}
    restored = fresh.restore({}, list(session.events))
    assert restored.snapshot["values"]["users"] == ops.count("user")

"""SessionStore.fork: prefix seeds, inherited marker, forked closers, refusals (docs/rules.md#fork).

The closers themselves come from ``dsh.session._repair`` (tested there); here we check that fork
puts them after the inherited marker with contiguous seqs and the boundary's time.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh._errors import SessionForkError
from dsh.json import thaw
from dsh.session._session import Session
from dsh.session._store import SessionStore
from tests.strategies import (
    StepClock,
    apply_script,
    assistant_data,
    completed_turn,
    examples,
    log_scripts,
    tool_call_block,
    user_message,
)

pytestmark = pytest.mark.no_speedups


def make_store() -> SessionStore:
    return SessionStore(clock=StepClock(5_000))


def parent_with_turns(store: SessionStore, turns: int = 1, session_id: str = "p",
                      cwd: str | None = "/work") -> Session:
    header = {"cwd": cwd} if cwd else None
    s = store.create(session_id, header=header)
    for turn in range(1, turns + 1):
        completed_turn(s, turn, call_ids=[f"c{turn}"])
    return s


def test_fork_an_empty_live_session_gives_an_empty_child_with_lineage() -> None:
    store = make_store()
    parent = store.create("p", header={"cwd": "/w", "origin": "subagent", "agentPreset": "x",
                                       "delegationDepth": 1})
    child = store.fork(parent, child_id="c")
    assert [(e.type, e.data) for e in child.events] == [("session/end-seed", {})]
    assert child.header == {"version": 0, "id": "c", "createdAt": child.header.created_at,
                            "cwd": "/w", "parentSession": "p", "seedLength": 0}
    assert child.inherited_event_count == 0 and child.first_live_seq == 0


def test_fork_the_latest_boundary_by_default_into_frozen_seed_events() -> None:
    # docs/rules.md#fork copies the seed so the child cannot reach the parent's objects; ours are
    # immutable, so the child may share them (a copy of an immutable value is the value).
    store = make_store()
    parent = parent_with_turns(store, 2)
    child = store.fork("p", child_id="c")
    n = parent.seq
    assert list(child.events[:n]) == list(parent.events)
    with pytest.raises(TypeError):
        child.events[0]["data"]["turn"] = 5
    with pytest.raises(TypeError):
        parent.events[0]["data"]["turn"] = 5
    assert parent.events[0]["data"] == {"turn": 1}
    marker = child.events[n]
    assert (marker.type, marker.seq, marker.data) == ("session/end-seed", n, {"inherited": True})
    assert marker.time == parent.events[-1].time
    assert child.seq == n + 1
    assert child.header.seed_length == n and child.header.parent_session == "p"
    assert child.inherited_event_count == n and child.first_live_seq == n + 1
    assert child.derive_messages() == parent.derive_messages()


def test_fork_includes_stable_log_only_events_after_a_closed_turn() -> None:
    store = make_store()
    parent = parent_with_turns(store, 1)
    parent.append("todo/write", {"todos": []})
    parent.append("plan/mode", {"active": True})
    child = store.fork(parent, child_id="c")
    assert [e.type for e in child.events[-3:]] == ["todo/write", "plan/mode", "session/end-seed"]


def test_fork_from_an_earlier_turn_boundary_while_the_source_has_an_open_tail() -> None:
    store = make_store()
    parent = parent_with_turns(store, 1)
    end_of_turn_1 = parent.seq - 1
    parent.append("turn/start", {"turn": 2})
    parent.append("user/message", user_message("open"), surface_op="append")
    child = store.fork(parent, end_of_turn_1, "c", open_turn="reject")
    assert child.header.seed_length == end_of_turn_1 + 1
    assert len(child.derive_messages()) == len(parent.derive_messages()) - 1


@pytest.mark.parametrize("reason", [
    {"kind": "completed"}, {"kind": "aborted", "reason": {"kind": "user"}},
    {"kind": "error", "error": {"message": "x", "code": "UNKNOWN"}},
    {"kind": "aborted", "reason": {"kind": "disposed"}}, {"kind": "max-tokens"},
    {"kind": "interrupted"},
])
def test_fork_accepts_every_turn_end_reason_as_an_explicit_boundary(
        reason: dict[str, Any]) -> None:
    store = make_store()
    parent = store.create("p")
    parent.append("turn/start", {"turn": 1})
    parent.append("turn/end", {"turn": 1, "reason": reason})
    child = store.fork(parent, 1, "c", open_turn="reject")
    assert child.events[1].data == {"turn": 1, "reason": reason}


def test_fork_marks_a_bracket_the_child_inherited_from_a_still_running_parent() -> None:
    store = make_store()
    parent = parent_with_turns(store, 1)
    bracket = parent.append("compaction/start", {"compactionId": "k", "turn": None})
    assert not any(e.type == "session/end-seed" for e in parent.events)
    child = store.fork(parent, child_id="c")
    assert child.events[bracket.seq + 1].type == "session/end-seed"
    assert child.first_live_seq == bracket.seq + 2


@pytest.mark.parametrize(("boundary", "message"), [
    (-1, "fork boundary -1 must be a non-negative safe integer"),
    (0.5, "fork boundary 0.5 must be a non-negative safe integer"),
    (2**53, f"fork boundary {2**53} must be a non-negative safe integer"),
    (True, "fork boundary True must be a non-negative safe integer"),
])
def test_fork_rejects_invalid_boundaries_before_creating_a_child(boundary: Any,
                                                                 message: str) -> None:
    store = make_store()
    parent_with_turns(store, 1)
    with pytest.raises(SessionForkError, match=message) as info:
        store.fork("p", boundary, "c")
    assert info.value.code == "INVALID_BOUNDARY"
    assert store.get("c") is None


def test_fork_rejects_boundaries_past_the_end_with_exact_messages() -> None:
    store = make_store()
    store.create("empty")
    with pytest.raises(SessionForkError) as info:
        store.fork("empty", 0, "c")
    assert str(info.value) == 'fork boundary 0 does not exist in session "empty" (last seq: none)'
    parent = parent_with_turns(store, 1)
    with pytest.raises(SessionForkError) as info:
        store.fork(parent, parent.seq, "c")
    assert str(info.value) == (f'fork boundary {parent.seq} does not exist in session "p" '
                               f"(last seq: {parent.seq - 1})")
    assert info.value.code == "INVALID_BOUNDARY" and store.get("c") is None


def test_fork_rejects_a_corrupted_live_source_whose_index_no_longer_matches_seq() -> None:
    store = make_store()
    parent = parent_with_turns(store, 1)
    events = list(parent.events)
    events[1], events[2] = events[2], events[1]
    parent._events_cache = tuple(events)  # simulate a corrupted live source
    with pytest.raises(SessionForkError, match="does not match a contiguous event seq") as info:
        store.fork(parent, 1, "c")
    assert info.value.code == "INVALID_BOUNDARY"


def test_fork_rejects_an_unknown_live_session_id() -> None:
    with pytest.raises(SessionForkError, match='session "nope" not found') as info:
        make_store().fork("nope")
    assert info.value.code == "SESSION_NOT_FOUND"


def test_fork_rejects_a_detached_session_object_that_is_not_live() -> None:
    store = make_store()
    with pytest.raises(SessionForkError, match='session "d" not found') as info:
        store.fork(Session.create("d"))
    assert info.value.code == "SESSION_NOT_FOUND"


def test_fork_rejects_a_stale_session_object_whose_id_is_live_on_another_instance() -> None:
    store = make_store()
    stale = store.create("p")
    store.dispose(stale)
    store.create("p")
    with pytest.raises(SessionForkError, match='session "p" is not the live store instance') \
            as info:
        store.fork(stale)
    assert info.value.code == "SESSION_NOT_LIVE"


def _open_turn_parent(store: SessionStore) -> tuple[Session, dict[str, int]]:
    parent = parent_with_turns(store, 1)
    marks = {"turn/start": parent.append("turn/start", {"turn": 2}).seq}
    marks["step/start"] = parent.append("step/start", {"turn": 2, "step": 1}).seq
    marks["user/message"] = parent.append("user/message", user_message(),
                                          surface_op="append").seq
    marks["assistant/message"] = parent.append("assistant/message", assistant_data(
        2, 1, [tool_call_block("k1")]), surface_op="append").seq
    marks["tool/call"] = parent.append("tool/call", {"turn": 2, "step": 1, "callId": "k1",
                                                     "name": "read_file",
                                                     "arguments": "{}"}).seq
    return parent, marks


@pytest.mark.parametrize("at", ["turn/start", "step/start", "user/message", "assistant/message",
                                "tool/call"])
def test_fork_rejects_open_turn_slices_when_asked_to(at: str) -> None:
    store = make_store()
    parent, marks = _open_turn_parent(store)
    with pytest.raises(SessionForkError) as info:
        store.fork(parent, marks[at], "c", open_turn="reject")
    assert str(info.value) == f'fork boundary {marks[at]} in session "p" ends inside open turn 2'
    assert info.value.code == "OPEN_TURN" and store.get("c") is None


def test_fork_closes_an_open_turn_with_forked_closers_after_the_inherited_marker() -> None:
    # docs/rules.md#fork: prefix + end-seed {inherited: true} + openTurnClosers(prefix, forked), and
    # exactly one end-seed after the cut: no plain one after the closers
    store = make_store()
    parent, marks = _open_turn_parent(store)
    cut = marks["tool/call"]
    child = store.fork(parent, cut, "c")
    types = [e.type for e in child.events[cut + 1:]]
    assert types == ["session/end-seed", "tool/result", "step/end", "turn/end"]
    marker, result, step_end, turn_end = child.events[cut + 1:]
    assert marker.data == {"inherited": True}
    assert all(e.time == parent.events[cut].time for e in (marker, result, step_end, turn_end))
    assert [e.seq for e in child.events] == list(range(child.seq))
    assert result.data["message"]["source"] == {"kind": "tool", "callId": "k1"}
    assert result.source_event_seqs == [cut]
    assert result.data["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
    assert turn_end.data == {"turn": 2, "reason": {"kind": "forked"}}
    assert child.header.seed_length == cut + 1 == child.inherited_event_count
    assert child.first_live_seq == cut + 5
    # the parent is untouched and can still complete the call
    assert parent.seq == cut + 1


def test_fork_at_an_unstarted_call_marks_it_not_started() -> None:
    store = make_store()
    parent, marks = _open_turn_parent(store)
    cut = marks["assistant/message"]
    child = store.fork(parent, cut, "c")
    result = next(e for e in child.events[cut:] if e.type == "tool/result")
    assert result.data["error"]["code"] == "TOOL_NOT_STARTED"
    assert "sourceEventSeqs" not in result


def test_fork_rejects_a_live_child_id_with_a_typed_error() -> None:
    store = make_store()
    parent_with_turns(store, 1)
    store.create("c")
    with pytest.raises(SessionForkError, match='session "c" already exists') as info:
        store.fork("p", None, "c")
    assert info.value.code == "SESSION_ALREADY_EXISTS"


def test_fork_rejects_a_duplicate_child_id_before_validating_source_or_boundary() -> None:
    store = make_store()
    parent, marks = _open_turn_parent(store)
    store.create("c")
    for source, boundary in [("missing", None), (parent, -1), (parent, marks["tool/call"])]:
        with pytest.raises(SessionForkError) as info:
            store.fork(source, boundary, "c", open_turn="reject")
        assert info.value.code == "SESSION_ALREADY_EXISTS"


def test_fork_mints_a_child_id_when_omitted() -> None:
    store = make_store()
    parent_with_turns(store, 1)
    assert store.fork("p").id == "session-1"


def test_fork_rejects_an_unknown_open_turn_policy() -> None:
    from dsh._errors import ConfigError

    store = make_store()
    parent_with_turns(store, 1)
    with pytest.raises(ConfigError, match="open_turn must be"):
        store.fork("p", open_turn="clip")  # type: ignore[arg-type]


def test_fork_of_a_fork_keeps_one_inherited_marker_after_each_cut() -> None:
    store = make_store()
    parent_with_turns(store, 1)
    child = store.fork("p", child_id="c")
    completed_turn(child, 2)
    grandchild = store.fork(child, child_id="g")
    inherited = [e.seq for e in grandchild.events
                 if e.type == "session/end-seed" and e.data.get("inherited") is True]
    assert inherited == [child.inherited_event_count, child.seq]
    assert grandchild.header.seed_length == child.seq


def test_fork_child_restores_from_its_own_log_and_header() -> None:
    store = make_store()
    parent, marks = _open_turn_parent(store)
    child = store.fork(parent, marks["tool/call"], "c")
    restored = Session.restore("c", child.events, child.header,
                               inherited_event_count=child.header.seed_length or 0)
    # the fork seed ends with its closers; restoring it marks the new lifecycle, as for any
    # resumed session, with a plain end-seed
    assert restored.seq == child.seq + 1
    assert restored.events[-1] == {"type": "session/end-seed", "seq": child.seq,
                                   "time": restored.events[-1].time, "data": {}}
    assert restored.derive_messages() == child.derive_messages()


@settings(max_examples=examples(25), deadline=None)
@given(log_scripts(open_tail=None), st.integers(0, 10_000))
def test_fork_child_prefix_equals_the_parent_prefix(script: Any, pick: int) -> None:
    # docs/testing.md#what-the-tests-cover: fork child prefix == parent prefix, for any cut.
    store = make_store()
    parent = apply_script(store.create("p"), script)
    if parent.seq == 0:
        assert [e.type for e in store.fork(parent, child_id="c").events] == ["session/end-seed"]
        return
    cut = pick % parent.seq
    child = store.fork(parent, cut, "c")
    assert [thaw(e) for e in child.events[:cut + 1]] == [thaw(e) for e in parent.events[:cut + 1]]
    assert child.events[cut + 1].data == {"inherited": True}
    assert child.inherited_event_count == cut + 1
    assert [e.seq for e in child.events] == list(range(child.seq))
    # the child's log is itself a valid, restorable log whose surface folds identically
    restored = Session.restore("c", child.events, child.header,
                               inherited_event_count=cut + 1)
    assert restored.surface.nodes == child.surface.nodes

"""The incremental derive_messages cache (docs/rules.md#deriving-messages)."""

from __future__ import annotations

import itertools
import operator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsh.session._session as session_module
from dsh.session._session import MessageLog, Session
from dsh.session._surface import derive_event_message
from tests.strategies import (
    StepClock,
    apply_script,
    assistant_data,
    completed_turn,
    examples,
    log_scripts,
    user_message,
)


def scratch(session: Session) -> MessageLog:
    """A from-scratch derivation: replay the log into a new session and derive once."""
    return Session.create("scratch", seed=session.events).derive_messages()


def fresh() -> Session:
    return Session.create("s", clock=StepClock())


def test_derived_cache_stays_equal_to_a_scratch_replay_as_the_log_grows() -> None:
    s = fresh()
    for turn in range(1, 4):
        completed_turn(s, turn, call_ids=[f"c{turn}"])
        s.append("assistant/message", assistant_data(turn, 2, [], usage={
            "inputTokens": 1, "outputTokens": 0}), surface_op="append")
        assert s.derive_messages() == scratch(s)


def test_derived_cache_rebuilds_on_a_surface_replace_and_matches_scratch() -> None:
    s = fresh()
    for text in "abc":
        s.append("user/message", user_message(text), surface_op="append")
    held = s.derive_messages()
    s.append("user/message", user_message("sum"), surface_op={"op": "replace", "start": 0,
                                                               "end": 1},
             source_event_seqs=[0, 1])
    assert [m["content"][0]["text"] for m in s.derive_messages()] == ["sum", "c"]
    assert s.derive_messages() == scratch(s)
    assert len(held) == 3


def test_derived_cache_returns_a_snapshot_per_call_sharing_frozen_messages() -> None:
    s = fresh()
    s.append("user/message", user_message("a"), surface_op="append")
    first = s.derive_messages()
    s.append("user/message", user_message("b"), surface_op="append")
    second = s.derive_messages()
    assert isinstance(first, MessageLog) and isinstance(second, MessageLog)
    assert len(first) == 1 and len(second) == 2  # a held snapshot never grows
    assert first[0] is second[0] and list(first) == [second[0]] and first == (second[0],)
    assert first[-1] is second[0] and first[:5] == (second[0],) and second[1:] == (second[1],)
    with pytest.raises(IndexError, match="message index 1 out of range"):
        _ = first[1]  # the snapshot's end, not the shared list's
    # the operators themselves are under test
    assert first + [second[1]] == second  # noqa: RUF005
    assert [second[0]] + first == (second[0], second[0])  # noqa: RUF005
    assert repr(second) == "MessageLog(2 messages)"
    with pytest.raises(TypeError):
        hash(first)


def test_derived_cache_gathers_uncached_and_null_nodes_as_the_python_loop_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    s = fresh()
    completed_turn(s, 1, call_ids=["c1"])
    s.append("assistant/message", assistant_data(1, 2, []), surface_op="append")  # -> None
    s.append("user/message", user_message("x"), surface_op="append")
    expected = scratch(s)
    assert len(expected) == len(s.surface.nodes) - 1
    cached = s.derive_messages()
    s._message_cache.clear()  # nothing cached: the C pass stops at every node
    s._derived_count = 0
    s._derived.clear()
    uncached = s.derive_messages()
    monkeypatch.setattr(session_module, "c_gather_messages", None)
    python = Session.create("p", seed=s.events).derive_messages()
    assert cached == uncached == python == expected
    assert all(a is b for a, b in zip(cached, uncached, strict=True))


def test_derived_cache_projects_one_appended_event_as_the_full_derivation_does() -> None:
    s = fresh()
    completed_turn(s, 1, call_ids=["c1"])
    event = s.append("user/message", user_message("next"), surface_op="append")
    assert s.derive_event_message(event) is s.derive_messages()[-1]
    assert derive_event_message(event) == scratch(s)[-1]


def test_derived_cache_reuses_the_logged_events_frozen_content() -> None:
    s = fresh()
    event = s.append("user/message", user_message("a"), surface_op="append")
    assert s.derive_messages()[0]["content"] is event.data["content"]


def test_derived_cache_projects_null_for_boundaries_and_empty_assistants() -> None:
    s = fresh()
    boundary = s.append("turn/start", {"turn": 1})
    empty = s.append("assistant/message", assistant_data(1, 1, []), surface_op="append")
    assert s.derive_event_message(boundary) is None
    assert s.derive_event_message(empty) is None
    assert s.derive_messages() == []


@settings(max_examples=examples(25), deadline=None)
@given(log_scripts(open_tail=None))
def test_derived_cache_equals_scratch_for_generated_logs_read_at_every_step(script: Any) -> None:
    s = fresh()
    derived_at: list[int] = []
    s.observe(lambda session, event: derived_at.append(len(session.derive_messages())))
    apply_script(s, script)
    assert s.derive_messages() == scratch(s)
    assert len(derived_at) == s.seq


def _same(a: Any, b: Any) -> bool:
    return len(a) == len(b) and all(map(operator.is_, a, b))


@settings(max_examples=examples(25), deadline=None)
@given(log_scripts(open_tail=None), st.lists(st.booleans(), min_size=1, max_size=12))
def test_held_snapshots_keep_their_messages_whatever_the_log_did(
        script: Any, holds: list[bool]) -> None:
    # A snapshot shares the session's list of derived messages: appends past its end and a
    # replace (which starts a new list) must leave every held one reading what it read.
    s = fresh()
    held: list[tuple[Any, tuple[Any, ...], list[Any]]] = []
    cycle = itertools.cycle(holds)

    def use(session: Session, event: Any) -> None:
        derived = session.derive_messages()
        if next(cycle):
            held.append((derived, tuple(derived), scratch(session)))

    s.observe(use)
    apply_script(s, script)
    last = s.derive_messages()
    assert last == scratch(s) and _same(last, s._derived)
    assert len(held) == sum(itertools.islice(itertools.cycle(holds), s.seq))  # none failed
    assert all(_same(h, snapshot) and h == then for h, snapshot, then in held)

"""The incremental derive_messages cache (docs/rules.md#deriving-messages)."""

from __future__ import annotations

import itertools
import operator
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsh.session._session as session_module
from dsh.json import FrozenDict
from dsh.session._session import Session
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


def scratch(session: Session) -> list[Any]:
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


def test_derived_cache_returns_a_fresh_list_per_call_sharing_frozen_messages() -> None:
    s = fresh()
    s.append("user/message", user_message("a"), surface_op="append")
    first = s.derive_messages()
    s.append("user/message", user_message("b"), surface_op="append")
    second = s.derive_messages()
    assert len(first) == 1 and len(second) == 2
    assert first is not second and first[0] is second[0]
    assert s.derive_messages() is not s.derive_messages()


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


# what a caller does with a list derive_messages returned before dropping it (or keeping it)
_USES = ("drop", "hold", "reverse", "pop", "append", "clear", "swap")


def _same(a: Any, b: Any) -> bool:
    return len(a) == len(b) and all(map(operator.is_, a, b))


@settings(max_examples=examples(25), deadline=None)
@given(log_scripts(open_tail=None), st.lists(st.sampled_from(_USES), min_size=1, max_size=12))
def test_derived_lists_are_fresh_whatever_callers_did_with_the_last_one(
        script: Any, uses: list[str]) -> None:
    # The C hand-out extends the list handed out last once its caller dropped it: a held list
    # must never change or come back, and a reordered, shortened, grown or element-swapped one
    # must never come back with its changes. Each result is checked against the pure-Python
    # path (a plain copy) read at the same moment.
    s = fresh()
    held: list[tuple[list[Any], tuple[Any, ...]]] = []
    cycle = itertools.cycle(uses)

    def use(session: Session, event: Any) -> None:
        derived = session.derive_messages()
        with mock.patch.object(session_module, "c_hand_out_messages", None):
            reference = session.derive_messages()
        assert _same(derived, reference) and derived is not reference
        assert all(derived is not h for h, _ in held)
        what = next(cycle)
        if what == "hold":
            held.append((derived, tuple(derived)))
        elif what == "reverse":
            derived.reverse()
        elif what == "pop" and derived:
            derived.pop()
        elif what == "append":
            derived.append(FrozenDict(role="user", content=[]))
        elif what == "clear":
            derived.clear()
        elif what == "swap" and derived:
            derived[0] = FrozenDict(derived[0])  # equal, but not the log's message

    s.observe(use)
    apply_script(s, script)
    s.derive_messages()  # the last list handed out is dropped here, then extended below
    last = s.derive_messages()
    assert last == scratch(s) and _same(last, s._derived)
    assert all(_same(h, snapshot) for h, snapshot in held)

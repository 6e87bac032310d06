"""Span selection (node-0 protection).

Rule: docs/rules.md#span-selection, docs/rules.md#tool-pairing, docs/rules.md#compaction.
"""

from __future__ import annotations

import pytest

from dsh import Session
from dsh._errors import CompactionError
from dsh.compaction._selection import head_position, select_compactable_range, validate_span
from dsh.compaction._tokens import measure_surface
from tests.compaction.builders import (
    assistant,
    long_session,
    new_session,
    system,
    text,
    tool_result,
    turn,
    user,
)

pytestmark = pytest.mark.no_speedups


def _open_call_session():  # type: ignore[no-untyped-def]
    """user, assistant(call), user(injected), result, assistant — an open pair in the middle.

    ``Session.append`` refuses such a log now (docs/rules.md#what-append-refuses); one written
    before it did is still restored as stored, and compaction must keep its pairs whole.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Session, "_check_pairing", lambda *_args: None)
        session = new_session()
        session.append("turn/start", {"turn": 1})
        session.append("step/start", {"turn": 1, "step": 1})
        user(session, "please run the build " * 20)
        assistant(session, 1, 1, "running", (("c1", "bash", '{"command":"make"}'),))
        user(session, "note: CI is slow today", kind="plugin")
        tool_result(session, 1, 1, "c1", "ok " * 50)
        assistant(session, 1, 1, "the build passed " * 10)
    restored = Session.restore(session.id, session.events, session.header)
    u, a, injected, r, final = (restored.events[seq] for seq in range(2, 7))
    return restored, u, a, injected, r, final


def test_select_rounds_a_retention_cut_head_ward_to_preserve_tool_call_result_pairing() -> None:
    # docs/rules.md#compaction "rounds a retention cut head-ward to preserve tool-call/result
    # pairing": with a budget that keeps only the result and the final answer, the cut would fall
    # between the call and its result; it moves to before the assistant message that made the call.
    session, u, _a, _injected, r, final = _open_call_session()
    measurement = measure_surface(session)
    prices = dict((n.seq, n.tokens) for n in measurement.nodes)
    retain = prices[final.seq] + prices[r.seq]
    assert select_compactable_range(session, retain_tokens=retain) == (u.seq, u.seq)


def test_select_declines_when_rounding_a_cut_would_consume_the_only_tool_pair() -> None:
    session = new_session()
    assistant(session, 1, 1, "x", (("c1", "bash", "{}"),))
    tool_result(session, 1, 1, "c1", "out")
    # retain 0 keeps the result; the cut before it is unbalanced and moves to the head.
    assert select_compactable_range(session, retain_tokens=0) is None


def test_select_is_head_anchored_and_keeps_the_last_node_even_with_budget_zero() -> None:
    session = long_session(2)
    nodes = list(session.surface.nodes)
    assert select_compactable_range(session, retain_tokens=0) == (nodes[0], nodes[-2])


def test_select_returns_none_for_an_empty_surface_or_a_budget_covering_everything() -> None:
    assert select_compactable_range(new_session(), retain_tokens=0) is None
    session = long_session(1)
    assert select_compactable_range(session, retain_tokens=10**9) is None
    with pytest.raises(ValueError):
        select_compactable_range(session, retain_tokens=-1)


def test_select_rejects_a_priced_surface_that_is_not_the_current_positional_surface() -> None:
    # docs/rules.md#compaction "rejects a priced surface that is not the current positional
    # surface".
    session = long_session(1)
    stale = measure_surface(session)
    user(session, "one more")
    with pytest.raises(CompactionError) as info:
        select_compactable_range(session, retain_tokens=0, measurement=stale)
    assert info.value.code == "CHANGED"


def test_select_never_covers_a_system_message_head() -> None:
    # docs/rules.md#the-system-head: a system/message at node 0 is never shadowed by a compaction.
    session = new_session()
    head = system(session, "You are a careful agent.")
    turn(session, 1, "first request " * 20, answer="first answer " * 20)
    turn(session, 2, "second request", answer="second answer")
    assert head_position(session) == 1
    start, _end = select_compactable_range(session, retain_tokens=0)  # type: ignore[misc]
    assert start == session.surface.nodes[1] != head.seq


def test_validate_span_rejects_a_span_over_the_system_head() -> None:
    session = new_session()
    head = system(session, "system prompt")
    u = user(session, "hello")
    with pytest.raises(CompactionError) as info:
        validate_span(session, head.seq, u.seq)
    assert info.value.code == "RANGE"
    assert validate_span(session, u.seq, u.seq).seqs == (u.seq,)


@pytest.mark.parametrize("which", ["start", "end"])
def test_validate_span_rejects_missing_seqs(which: str) -> None:
    # docs/rules.md#compaction "rejects %s" (start missing 9001, end missing 9002).
    session = long_session(1)
    first = session.surface.nodes[0]
    start, end = (9001, first) if which == "start" else (first, 9002)
    with pytest.raises(CompactionError, match=f"{which} seq {start if which == 'start' else end}"
                       " is not a current surface node") as info:
        validate_span(session, start, end)
    assert info.value.code == "RANGE"
    nodes = session.surface.nodes
    assert f"which are #{nodes[0]}, #{nodes[1]}," in info.value.message
    assert f"#{nodes[-1]} ('dsh show' prints their #seq)" in info.value.message


def test_validate_span_lists_the_current_nodes_in_numeric_order() -> None:
    # a replacing node stands in its original's place: the surface order is #a, #new, #c, and
    # the refusal listed them so; it lists them sorted and says a range follows the view
    session = new_session()
    a, b, c = user(session, "one"), user(session, "two"), user(session, "three")
    new = session.append("user/message", {"content": [text("TWO")], "source": {"kind": "user"},
                                          "role": "user", "id": "u-new"},
                         surface_op={"op": "replace", "start": b.seq, "end": b.seq},
                         source_event_seqs=[b.seq])
    assert list(session.surface.nodes) == [a.seq, new.seq, c.seq]
    with pytest.raises(CompactionError) as info:
        validate_span(session, 9001, c.seq)
    assert (f"which are #{a.seq}, #{c.seq}, #{new.seq} ('dsh show' prints their #seq; a range "
            "runs in the model view's order, where a replacing node stands in the place of the "
            "one it replaces)") in info.value.message


def test_validate_span_rejects_reversed_and_tool_unbalanced_positional_boundaries() -> None:
    # docs/rules.md#compaction "rejects reversed and tool-unbalanced positional boundaries".
    session, u, a, injected, r, final = _open_call_session()
    with pytest.raises(CompactionError, match="is after end seq") as info:
        validate_span(session, a.seq, u.seq)
    assert info.value.code == "RANGE"
    with pytest.raises(CompactionError, match="is not a balanced boundary") as info:
        validate_span(session, u.seq, a.seq)  # end falls between the call and its result
    assert info.value.code == "UNBALANCED"
    with pytest.raises(CompactionError, match="is not a balanced boundary") as info:
        validate_span(session, injected.seq, final.seq)  # start inside the open pair
    assert info.value.code == "UNBALANCED"
    span = validate_span(session, u.seq, r.seq)
    assert span.seqs == (u.seq, a.seq, injected.seq, r.seq)
    assert (span.start_index, span.end_index) == (0, 3)

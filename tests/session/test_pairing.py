"""Tool-pairing balance: docs/rules.md#tool-pairing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from dsh._errors import EventRejectedError
from dsh.session._events import Event
from dsh.session._pairing import (
    balanced_cuts,
    tool_pairing_balanced_after,
    tool_pairing_balanced_before,
)
from dsh.testing import LogBuilder, make


class FakeSurface:
    def __init__(self) -> None:
        self.nodes: list[int] = []
        self.replace_generation = 0


class FakeSession:
    """A log plus a hand-driven surface; counts every read of ``events``."""

    def __init__(self, events: list[Event] | None = None) -> None:
        self.log = LogBuilder(checked=False, events=events)
        self.surface = FakeSurface()
        self.event_reads = 0

    @property
    def events(self) -> Sequence[Event]:
        self.event_reads += 1
        return self.log.events

    def node(self, event: Event) -> int:
        self.surface.nodes.append(event.seq)
        return event.seq

    def user(self) -> int:
        return self.node(self.log.user())

    def assistant(self, *call_ids: str) -> int:
        return self.node(self.log.assistant(1, 1, [(c, "bash") for c in call_ids]))

    def result(self, call_id: str) -> int:
        call = self.log.tool_call(1, 1, call_id)
        return self.node(self.log.tool_result(1, 1, call_id, call_seq=call.seq))

    def replace(self, start_index: int, end_index: int) -> int:
        nodes = self.surface.nodes
        shadowed = nodes[start_index:end_index + 1]
        event = self.log.user(surface_op={"op": "replace", "start": shadowed[0],
                                          "end": shadowed[-1]}, source_event_seqs=shadowed)
        nodes[start_index:end_index + 1] = [event.seq]
        self.surface.replace_generation += 1
        return event.seq


def before(session: Any, seq: int) -> bool:
    return tool_pairing_balanced_before(session, seq)


def after(session: Any, seq: int) -> bool:
    return tool_pairing_balanced_after(session, seq)


def test_pairing_classifies_closed_and_open_single_call_steps() -> None:
    # docs/rules.md#tool-pairing "classifies closed and open single-call steps"
    s = FakeSession()
    user = s.user()
    call = s.assistant("c1")
    result = s.result("c1")
    open_call = s.assistant("c2")
    assert (before(s, user), after(s, user)) == (True, True)
    assert (before(s, call), after(s, call)) == (True, False)
    assert (before(s, result), after(s, result)) == (False, True)
    assert after(s, open_call) is False
    assert balanced_cuts(s) == (True, True, False, True, False)


def test_pairing_requires_every_result_from_a_multiple_call_assistant_message() -> None:
    # docs/rules.md#tool-pairing "requires every result from a multiple-call assistant message"
    s = FakeSession()
    call = s.assistant("c1", "c2")
    first = s.result("c1")
    second = s.result("c2")
    assert after(s, call) is False
    assert (before(s, first), after(s, first)) == (False, False)
    assert (before(s, second), after(s, second)) == (False, True)


def test_pairing_keeps_neutral_nodes_inside_an_open_pair_unbalanced_and_free_nodes_balanced(
) -> None:
    # docs/rules.md#tool-pairing "keeps neutral nodes inside an open pair unbalanced and free nodes
    # balanced"
    s = FakeSession()
    s.assistant("c1")
    inside = s.user()
    s.result("c1")
    free = s.user()
    assert (before(s, inside), after(s, inside)) == (False, False)
    assert (before(s, free), after(s, free)) == (True, True)


def test_pairing_rebuilds_after_replace_and_rejects_seqs_removed_from_the_surface() -> None:
    # docs/rules.md#tool-pairing "rebuilds after replace and rejects sequences removed from current
    # membership"
    s = FakeSession()
    s.user()
    call = s.assistant("c1")
    inside = s.user()
    result = s.result("c1")
    assert after(s, inside) is False
    summary = s.replace(1, 3)
    assert (before(s, summary), after(s, summary)) == (True, True)
    assert balanced_cuts(s) == (True, True, True)
    for gone in (call, inside, result):
        with pytest.raises(EventRejectedError, match=f"surface seq {gone} not found") as info:
            before(s, gone)
        assert info.value.code == "SURFACE_SEQ_NOT_FOUND"
        with pytest.raises(EventRejectedError, match=f"surface seq {gone} not found"):
            after(s, gone)


def test_pairing_answers_repeated_queries_from_cached_balances() -> None:
    # docs/rules.md#tool-pairing "answers repeated queries from cached balances"
    s = FakeSession()
    call = s.assistant("c1")
    s.result("c1")
    assert after(s, call) is False
    reads = s.event_reads
    for _ in range(5):
        assert after(s, call) is False
        assert before(s, call) is True
    assert s.event_reads == reads


def test_pairing_rejects_missing_seqs_before_and_after_including_an_empty_surface() -> None:
    # docs/rules.md#tool-pairing "rejects missing seqs before and after, including an empty surface"
    s = FakeSession()
    for query in (before, after):
        with pytest.raises(EventRejectedError, match="surface seq 999 not found"):
            query(s, 999)
    assert balanced_cuts(s) == (True,)
    s.user()
    s.log.add("plan/mode", {"active": True})  # a log-only event is never a surface node
    for query in (before, after):
        with pytest.raises(EventRejectedError, match="surface seq 1 not found"):
            query(s, 1)
        with pytest.raises(EventRejectedError, match="surface seq 999 not found"):
            query(s, 999)


def test_pairing_does_no_event_reads_for_unchanged_or_log_only_growth() -> None:
    # docs/rules.md#tool-pairing "does no event reads for unchanged or log-only growth, folds only
    # appended nodes, and rebuilds on replace" [read counting]
    class CountingList(list[Event]):
        gets: ClassVar[list[int]] = []

        def __getitem__(self, index: Any) -> Any:
            CountingList.gets.append(index)
            return list.__getitem__(self, index)

    s = FakeSession(CountingList())
    first = s.user()
    assert before(s, first) is True
    assert s.event_reads == 1
    assert after(s, first) is True
    s.log.add("plan/mode", {"active": True})
    s.log.add("todo/write", {"todos": []})
    assert after(s, first) is True
    assert s.event_reads == 1  # unchanged surface, log-only growth: no reads
    CountingList.gets.clear()  # from here on, count which events are read
    call = s.assistant("c1")
    assert after(s, call) is False
    assert s.event_reads == 2
    assert CountingList.gets == [call]  # only the appended node was folded

    s.replace(0, 1)
    CountingList.gets.clear()
    assert balanced_cuts(s) == (True, True)
    assert s.event_reads == 3
    assert CountingList.gets == [s.surface.nodes[0]]  # rebuilt over the (new) whole surface


def test_pairing_rebuilds_defensively_when_a_same_generation_surface_count_regresses() -> None:
    # docs/rules.md#tool-pairing "rebuilds defensively when a same-generation surface entry count
    # regresses"
    s = FakeSession()
    s.user()
    call = s.assistant("c1")
    assert balanced_cuts(s) == (True, True, False)
    s.surface.nodes.pop()  # same generation, fewer nodes
    reads = s.event_reads
    assert balanced_cuts(s) == (True, True)
    assert s.event_reads == reads + 1
    with pytest.raises(EventRejectedError, match=f"surface seq {call} not found"):
        after(s, call)


def test_pairing_throws_for_an_orphan_result_during_a_rebuild() -> None:
    # docs/rules.md#tool-pairing "throws for an orphan result during a rebuild"
    s = FakeSession()
    s.user()
    orphan = s.node(s.log.tool_result(1, 1, "nobody"))
    with pytest.raises(EventRejectedError) as info:
        balanced_cuts(s)
    assert info.value.code == "CORRUPT_SURFACE"
    assert info.value.message == (f"tool-pairing balance: tool/result at surface seq {orphan} "
                                  "has no matching tool-call (corrupt surface)")


def test_pairing_retries_an_orphan_result_in_an_appended_tail_without_partial_commit() -> None:
    # docs/rules.md#tool-pairing "retries an orphan result in an appended tail without committing
    # partial cache state"
    s = FakeSession()
    first = s.user()
    assert balanced_cuts(s) == (True, True)
    neutral = s.user()
    orphan = s.node(s.log.tool_result(1, 1, "nobody"))
    for _ in range(2):  # the failed fold is retried, not skipped
        with pytest.raises(EventRejectedError, match="has no matching tool-call"):
            after(s, neutral)
    # nothing of the failed tail was committed: once the slot holds a neutral event, the fold
    # starts again right after the first node and gets every balance right
    s.log.events[orphan] = make("user/message", orphan, {"id": "x", "role": "user",
                                                       "source": {"kind": "user"},
                                                       "content": []}, surfaceOp="append")
    assert balanced_cuts(s) == (True, True, True, True)
    assert (before(s, first), after(s, neutral), after(s, orphan)) == (True, True, True)


def test_pairing_throws_when_a_surface_seq_has_no_matching_event_or_indexes_the_wrong_one(
) -> None:
    # docs/rules.md#tool-pairing "throws when a current surface seq has no matching event or indexes
    # the wrong event"
    s = FakeSession()
    s.user()
    s.surface.nodes.append(999)
    with pytest.raises(EventRejectedError) as info:
        balanced_cuts(s)
    assert info.value.message == ("tool-pairing balance: surface seq 999 has no matching "
                                  "session event (corrupt surface)")
    assert info.value.where["seq"] == 999

    t = FakeSession()
    t.user()
    t.log.add("plan/mode", {})
    t.log.events[1] = make("plan/mode", 7, {})  # slot 1 holds an event claiming seq 7
    t.surface.nodes.append(1)
    with pytest.raises(EventRejectedError, match="surface seq 1 has no matching session event"):
        before(t, 0)


def test_pairing_caches_are_per_session() -> None:
    a, b = FakeSession(), FakeSession()
    a_call = a.assistant("c1")
    b_user = b.user()
    assert after(a, a_call) is False
    assert after(b, b_user) is True
    with pytest.raises(EventRejectedError):
        after(b, 999)


def test_pairing_against_the_real_session() -> None:
    session_module = pytest.importorskip(
        "dsh.session._session", reason="SKIPPED LOUDLY: dsh.session._session not written yet")
    session = session_module.Session.create("pairing-test")
    session.append("user/message", {"id": "u", "role": "user", "source": {"kind": "user"},
                                    "content": [{"type": "text", "text": "go"}]},
                   surface_op="append")
    call = session.append("assistant/message", {
        "turn": 1, "step": 1, "message": {
            "id": "a", "role": "assistant",
            "source": {"kind": "model", "provider": "p", "model": "m"},
            "content": [{"type": "tool-call", "id": "c1", "name": "bash", "arguments": "{}"}]}},
        surface_op="append")
    tool_call = session.append("tool/call", {"turn": 1, "step": 1, "callId": "c1",
                                             "name": "bash", "arguments": "{}"})
    result = session.append("tool/result", {
        "turn": 1, "step": 1, "message": {
            "id": "r", "role": "user", "source": {"kind": "tool", "callId": "c1"},
            "content": [{"type": "tool-result", "toolCallId": "c1", "content": []}]}},
        surface_op="append", source_event_seqs=[tool_call.seq])
    assert after(session, call.seq) is False
    assert before(session, result.seq) is False
    assert after(session, result.seq) is True
    assert balanced_cuts(session) == (True, True, False, True)
    # a compaction-style replace over the call and its result starts a new generation
    summary = session.append("user/message", {
        "id": "s", "role": "user", "source": {"kind": "plugin", "plugin": "compact"},
        "content": [{"type": "text", "text": "summary"}]},
        surface_op={"op": "replace", "start": call.seq, "end": result.seq},
        source_event_seqs=[call.seq, result.seq])
    assert session.surface.replace_generation == 1
    assert balanced_cuts(session) == (True, True, True)
    assert (before(session, summary.seq), after(session, summary.seq)) == (True, True)
    with pytest.raises(EventRejectedError, match=f"surface seq {call.seq} not found"):
        after(session, call.seq)

"""A paged restore (restore state + tail + a page-in source) equals a full restore.

Rule: docs/rules.md#restore-points-are-never-the-truth (restore points are derived, never the
    truth); the core stays free of I/O.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dsh._errors import EventRejectedError, LogCorruptError
from dsh.session import (
    PAGE_EVENTS,
    LazyNodes,
    NodeSeqs,
    PagedLog,
    RestoreFold,
    RestoreState,
    Session,
)
from dsh.session._events import Event
from dsh.session._paging import PICK_EVENTS
from dsh.session._repair import interrupted_turn_closers, open_turn_closers
from tests.strategies import (
    StepClock,
    apply_script,
    assistant_data,
    examples,
    log_scripts,
    probe_appends,
    tool_call_block,
    tool_result_data,
)

pytestmark = pytest.mark.no_speedups


class ListSource:
    """An EventSource over a list, counting reads (a stand-in for storage)."""

    def __init__(self, events: Sequence[Event]) -> None:
        self.events = list(events)
        self.reads: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return len(self.events)

    def read(self, start: int, stop: int) -> Sequence[Event]:
        self.reads.append((start, stop))
        return self.events[start:stop]


class RangePickingSource(ListSource):
    """A ListSource that also picks from ranges (``read_picked``), counting picks; ``vouch``
    False: it answers None."""

    def __init__(self, events: Sequence[Event], *, vouch: bool = True,
                 serve: Sequence[Event] | None = None) -> None:
        super().__init__(events)
        self.vouch = vouch
        self.serve = list(serve) if serve is not None else self.events
        self.picks: list[tuple[int, int, list[int]]] = []

    def read_picked(self, start: int, stop: int, seqs: Sequence[int]) -> Sequence[Event] | None:
        assert all(start <= seq < stop for seq in seqs) and list(seqs) == sorted(seqs)
        self.picks.append((start, stop, list(seqs)))
        return [self.serve[seq] for seq in seqs] if self.vouch else None


def _log(script: Any) -> list[Event]:
    session = apply_script(Session.create("s", clock=StepClock()), script)
    return list(session.events)


def _full(events: Sequence[Event]) -> Session:
    closers = interrupted_turn_closers(events)
    return Session.restore("s", [*events, *closers], {"version": 0, "id": "s",
                                                      "createdAt": 1}, clock=StepClock(5))


def _paged(events: Sequence[Event], cut: int) -> tuple[Session, ListSource]:
    session, source, _ = _paged_from(events, cut)
    return session, source


def _tailed(state: RestoreState, tail_nodes: int) -> RestoreState:
    """``state`` with its nodes as a restore point reads them back from ``"zt:"``: the head
    packed and not inflated, the last ``tail_nodes`` seqs at hand."""
    nodes = NodeSeqs.unpack_tailed(NodeSeqs(state.nodes).pack_tailed(tail_nodes),
                                   state.event_count)
    return dataclasses.replace(state, nodes=nodes)


def _paged_from(events: Sequence[Event], cut: int, tail_nodes: int | None = None
                ) -> tuple[Session, ListSource, RestoreState]:
    state = RestoreFold(0)
    state.feed(events[:cut])
    source = ListSource(events[:cut])
    tail = list(events[cut:])
    st_ = state.state() if tail_nodes is None else _tailed(state.state(), tail_nodes)
    window_start = cut
    if not any(e["type"] in ("turn/start", "turn/end") for e in tail) and st_.turn_open:
        window_start = st_.turn_boundary
    window = [*events[window_start:cut], *tail]
    closers = open_turn_closers(window, "interrupted", base_seq=window_start)
    session = Session.restore_paged("s", {"version": 0, "id": "s", "createdAt": 1}, st_,
                                    source, [*tail, *closers], clock=StepClock(5))
    return session, source, st_


def _same(a: Session, b: Session) -> None:
    assert len(a.events) == len(b.events)
    assert a.events == b.events
    assert list(a.events) == list(b.events)
    assert a.events[3:-2] == b.events[3:-2]
    assert a.events[::-3] == b.events[::-3]
    assert list(a.surface.nodes) == list(b.surface.nodes)
    assert a.surface.nodes == b.surface.nodes and b.surface.nodes == a.surface.nodes
    assert a.surface.nodes == tuple(b.surface.nodes) and a.surface.nodes == list(b.surface.nodes)
    assert a.surface.nodes[1:-1] == b.surface.nodes[1:-1]
    assert a.surface.replace_generation == b.surface.replace_generation
    assert a.derive_messages() == b.derive_messages()
    assert a.request_header() == b.request_header()
    assert a.request_context() == b.request_context()
    assert a.first_live_seq == b.first_live_seq
    assert a.transcript_events() == b.transcript_events()


@settings(max_examples=examples(40), deadline=None)
@given(script=log_scripts(open_tail=None, max_actions=6), data=st.data())
def test_paged_restore_equals_full_restore(script: Any, data: st.DataObject) -> None:
    events = _log(script)
    assume(events)
    cut = data.draw(st.integers(1, len(events)))
    full = _full(events)
    paged, _ = _paged(events, cut)
    _same(paged, full)
    assert probe_appends(paged) == probe_appends(full)
    _same(paged, full)


@settings(max_examples=examples(40), deadline=None)
@given(script=log_scripts(open_tail=None, max_actions=6), data=st.data())
def test_a_lazy_surface_restore_equals_full_restore(script: Any, data: st.DataObject) -> None:
    # docs/formats.md#restore-points ("zt:"): the head of the surface stays packed until a
    # seq before the tail is asked for; last messages, appends (a replace, a pairing walk
    # back), the writer's fold and the full derive all equal the full read's, in either order
    events = _log(script)
    assume(events)
    cut = data.draw(st.integers(1, len(events)))
    full = _full(events)
    state = RestoreFold(0)
    state.feed(events[:cut])
    tail_nodes = data.draw(st.integers(0, len(state.state().nodes) + 2))
    lazy, _, lazy_state = _paged_from(events, cut, tail_nodes)
    assert type(lazy._nodes) is LazyNodes
    assert len(lazy.surface.nodes) == len(full.surface.nodes)
    for count in (1, 2, 5):
        assert lazy.derive_messages(last=count) == full.derive_messages(last=count)
    assert lazy.surface.nodes[-1:] == full.surface.nodes[-1:]
    assert RestoreFold.of_session(lazy, lazy_state).state() == \
        RestoreFold.of_session(full).state()
    if data.draw(st.booleans()):
        _same(lazy, full)
    assert probe_appends(lazy) == probe_appends(full)
    _same(lazy, full)
    assert RestoreFold.of_session(lazy, lazy_state).state() == \
        RestoreFold.of_session(full).state()


def test_a_lazy_surface_resume_inflates_nothing_until_every_message_is_asked_for() -> None:
    # the surface's head stays packed through the resume, the last messages, a new turn with
    # a tool call and its result, and the writer's fold; the full derive inflates it once
    events = _long_log(2000)
    lazy, source, state = _paged_from(events, len(events) - 1, 256)
    full = _full(events)
    nodes = lazy._nodes
    assert type(nodes) is LazyNodes and not nodes.inflated
    assert len(lazy.surface.nodes) == len(full.surface.nodes) == 6000
    assert lazy.derive_messages(last=20) == full.derive_messages(last=20)
    assert {start for start, _ in source.reads} == {(len(events) - 2) // PAGE_EVENTS
                                                    * PAGE_EVENTS}
    call, result = assistant_data(2001, 1, [tool_call_block("x")]), tool_result_data(2001, 1, "x")
    for session in (lazy, full):
        session.append("turn/start", {"turn": 2001})
        session.append("step/start", {"turn": 2001, "step": 1})
        session.append("assistant/message", call, surface_op="append")
        session.append("tool/result", result, surface_op="append")
    assert lazy.events[-6:] == full.events[-6:]
    assert RestoreFold.of_session(lazy, state).state().nodes[-3:] == full.surface.nodes[-3:]
    assert not nodes.inflated and lazy._nodes is nodes
    assert lazy.derive_messages() == full.derive_messages()
    assert nodes.inflated and type(lazy._nodes) is array  # the one array from now on
    assert lazy.surface.nodes == full.surface.nodes and lazy.surface.nodes._nodes is lazy._nodes
    _same(lazy, full)


def test_lazy_nodes_behave_as_the_list_of_their_seqs() -> None:
    seqs = [*range(3, 3000, 3), 1, 2, 7]
    for tail_nodes in (0, 1, 4, 2000):
        def fresh(tail: int = tail_nodes) -> LazyNodes:
            return LazyNodes(NodeSeqs.unpack_tailed(NodeSeqs(seqs).pack_tailed(tail), 3000))

        lazy = fresh()
        known = min(tail_nodes, len(seqs))
        assert len(lazy) == len(seqs) and not lazy.inflated
        lazy.append(3001)
        assert list(lazy[len(seqs) - known:]) == [*seqs[len(seqs) - known:], 3001]
        assert lazy[-1] == 3001 and (known == 0 or lazy[-2] == 7)
        walk = reversed(lazy)
        assert [next(walk) for _ in range(known + 1)] == [3001, *seqs[::-1][:known]]
        assert not lazy.inflated
        assert list(walk) == seqs[::-1][known:] and lazy.inflated == (known < len(seqs))
        expected = [*seqs, 3001]
        for nodes in (lazy, fresh()):
            if len(nodes) == len(seqs):
                nodes.append(3001)
            assert nodes[5] == expected[5] and nodes[2:9:3] == array("q", expected[2:9:3])
            assert nodes[::-1] == array("q", expected[::-1]) and nodes == expected
            assert nodes.index(1) == expected.index(1) and 7 in nodes and 4 not in nodes
            assert repr(nodes) == f"LazyNodes({expected!r})"
        lazy = fresh()
        lazy.append(3001)
        del lazy[1:4]
        lazy[0] = 9
        lazy.insert(2, 11)
        copy = [*seqs, 3001]
        del copy[1:4]
        copy[0] = 9
        copy.insert(2, 11)
        assert lazy == copy and list(lazy) == copy and len(lazy) == len(copy)
        with pytest.raises(IndexError):
            fresh()[len(seqs)]


def test_tailed_node_seqs_read_their_end_without_inflating_the_head(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A cold read of the latest items (an adapter's get_items(limit)) walks the restore
    # point's nodes back from the end, or slices their last ones: the tail answers it, the
    # head inflated once if a walk goes on into it, never once per seq read.
    from dsh.adapters._log import _NodesThen

    inflated: list[int] = []
    head = NodeSeqs._head

    def counting(self: NodeSeqs) -> array[int]:
        inflated.append(1)
        return head(self)

    monkeypatch.setattr(NodeSeqs, "_head", counting)
    seqs = [*range(3, 3000, 3), 1, 2, 7]
    nodes = NodeSeqs.unpack_tailed(NodeSeqs(seqs).pack_tailed(4), 3000)
    walk = reversed(nodes)
    assert [next(walk) for _ in range(4)] == seqs[:-5:-1]
    assert nodes[-1] == 7 and nodes[len(seqs) - 4] == seqs[-4] and nodes[-4:] == seqs[-4:]
    assert nodes[-2:-1] == [2] and nodes[len(seqs):] == [] and nodes[9:3] == []
    then = _NodesThen(nodes, [3001, 3002])
    assert then[-6:] == [*seqs[-4:], 3001, 3002] and then[-1] == 3002
    assert inflated == []
    assert list(walk) == seqs[-5::-1] and inflated == [1]  # on into the head: once
    assert then[-10:] == [*seqs[-8:], 3001, 3002] and nodes[5:9] == seqs[5:9]
    assert nodes[-5] == seqs[-5] and list(reversed(nodes)) == seqs[::-1]


def test_a_lazy_head_that_does_not_hold_what_it_claims_is_found_when_inflated() -> None:
    # the restore point's body digest vouched for its bytes; a writer's claim that is not so
    # (head count or largest seq) is a LogCorruptError of the read that inflates the head
    seqs = list(range(0, 3000, 3))
    pack = NodeSeqs(seqs).pack_tailed(4)
    for claim in (pack._replace(head_count=pack.head_count - 1),
                  pack._replace(head_max=pack.head_max - 1),
                  pack._replace(packed=pack.packed[:-5])):
        lazy = LazyNodes(NodeSeqs.unpack_tailed(claim, 3000))
        assert lazy[-4:] == array("q", seqs[-4:])  # the tail is read as it is
        with pytest.raises(LogCorruptError) as caught:
            list(reversed(lazy))
        assert caught.value.code == "RESTORE_POINT_MISMATCH"
    for bound, claim in ((2997, pack), (3000, pack._replace(head_count=3000)),
                         (3000, pack._replace(tail=(3000,))),
                         (3000, pack._replace(head_count=0))):
        with pytest.raises(ValueError, match="must lie in"):
            NodeSeqs.unpack_tailed(claim, bound)


def test_a_paged_restore_keeps_its_surface_packed() -> None:
    # no int object per node: the surface is the state's int64 buffer, copied once
    events = _long_log(50)
    paged, _, state = _paged_from(events, 200)
    assert isinstance(state.nodes, NodeSeqs)
    assert type(paged._nodes) is array and paged._nodes.typecode == "q"
    full = _full(events)
    _same(paged, full)


@settings(max_examples=examples(40), deadline=None)
@given(script=log_scripts(open_tail=None, max_actions=6), data=st.data())
def test_a_writer_fold_from_a_paged_restore_equals_the_full_fold(script: Any,
                                                                 data: st.DataObject) -> None:
    # the writer's fold shares the restore state's packed nodes and folds on from them,
    # through appends and a replace reaching into them
    events = _log(script)
    assume(events)
    cut = data.draw(st.integers(1, len(events)))
    full = _full(events)
    paged, _, state = _paged_from(events, cut)
    paged_fold = RestoreFold.of_session(paged, state)
    full_fold = RestoreFold.of_session(full)
    assert paged_fold.state() == full_fold.state()
    start = len(paged.events)
    assert start == len(full.events)
    assert probe_appends(paged) == probe_appends(full)
    paged_fold.feed(paged.events[start:])
    full_fold.feed(full.events[start:])
    assert paged_fold.state() == full_fold.state()
    assert paged_fold.state().nodes == paged.surface.nodes == full.surface.nodes
    assert RestoreState.from_wire(paged_fold.state().to_wire()) == full_fold.state()


@settings(max_examples=examples(40), deadline=None)
@given(script=log_scripts(open_tail=None, max_actions=6), data=st.data())
def test_restore_fold_equals_the_session_state(script: Any, data: st.DataObject) -> None:
    events = _log(script)
    assume(events)
    cut = data.draw(st.integers(1, len(events)))
    fold = RestoreFold(0)
    fold.feed(events[:cut])
    fold.feed(events[:cut])  # a retried batch is skipped
    state = fold.state()
    prefix = Session.restore("s", events[:cut], {"version": 0, "id": "s", "createdAt": 1})
    # of_session sees the end-seed the restore appended, so compare it before that marker
    assert RestoreFold.of_session(prefix).state().nodes == state.nodes
    assert state.event_count == cut
    assert list(prefix.surface.nodes) == list(state.nodes)
    assert prefix.request_header() == state.request_header
    assert RestoreState.from_wire(state.to_wire()) == state


def _long_log(turns: int) -> list[Event]:
    session = Session.create("s", clock=StepClock())
    for turn in range(1, turns + 1):
        session.append("turn/start", {"turn": turn})
        session.append("step/start", {"turn": turn, "step": 1})
        session.append("user/message", {"id": f"u{turn}", "role": "user", "source": {
            "kind": "user"}, "content": [{"type": "text", "text": "hi"}]}, surface_op="append")
        session.append("assistant/message", assistant_data(turn, 1, [
            tool_call_block(f"c{turn}")]), surface_op="append")
        session.append("tool/result", tool_result_data(turn, 1, f"c{turn}"),
                       surface_op="append")
        session.append("step/end", {"turn": turn, "step": 1})
        session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
    return list(session.events)


def test_paged_log_keeps_few_pages_resident() -> None:
    events = _long_log(2000)
    cut = len(events) - 3
    session, _source = _paged(events, cut)
    assert isinstance(session._log, PagedLog)
    assert session.events == _full(events).events
    assert session._log.resident_events <= 32 * PAGE_EVENTS + 10
    assert session.event_at(5) == events[5]


def test_paged_restore_reads_nothing_before_the_cut_until_messages_are_derived() -> None:
    events = _long_log(2000)
    session, source = _paged(events, len(events) - 1)
    assert source.reads == []  # the surface is kept as node seqs
    assert session.derive_messages() == _full(events).derive_messages()
    # then each page holding a surface node is read once, in seq order
    starts = [start for start, _ in source.reads]
    assert starts == [n * PAGE_EVENTS for n in range((len(events) - 1) // PAGE_EVENTS + 1)]
    assert session._log.resident_events <= 32 * PAGE_EVENTS + 10


def _picked_restore(events: Sequence[Event], source: ListSource) -> Session:
    state = RestoreFold(0)
    state.feed(events)
    return Session.restore_paged("s", {"version": 0, "id": "s", "createdAt": 1},
                                 state.state(), source, [], clock=StepClock(5))


def test_a_picking_source_serves_the_derive_without_a_page_read() -> None:
    # docs/rules.md#verified-page-in: a source that picks decodes only the surface's events,
    # one window of PICK_EVENTS seqs at a time; nothing enters the page cache
    events = _long_log(4000)
    source = RangePickingSource(events)
    session = _picked_restore(events, source)
    assert session.derive_messages() == _full(events).derive_messages()
    assert source.reads == []
    assert [start for start, _, _ in source.picks] == list(range(0, len(events), PICK_EVENTS))
    nodes = [seq for seq in session.surface.nodes if seq < len(events)]
    assert [seq for _, _, seqs in source.picks for seq in seqs] == nodes
    assert len(nodes) < len(events) / 2  # the brackets and calls were never asked for
    assert session._log.resident_events <= 2  # the tail (end-seed), no page


def test_a_window_the_source_cannot_vouch_for_is_paged_in() -> None:
    events = _long_log(2000)
    source = RangePickingSource(events, vouch=False)
    session = _picked_restore(events, source)
    assert session.derive_messages() == _full(events).derive_messages()
    assert source.picks and source.reads  # asked to pick, then read by page


def test_picked_events_of_other_seqs_are_refused() -> None:
    events = _long_log(300)
    swapped = [*events]
    surface = [seq for seq in _full(events).surface.nodes if seq < len(events)]
    swapped[surface[3]] = events[surface[4]]  # a source serving another node's event
    session = _picked_restore(events, RangePickingSource(events, serve=swapped))
    with pytest.raises(LogCorruptError) as caught:
        session.derive_messages()
    assert "picked events" in caught.value.message


def test_paged_old_call_is_found_by_a_prefix_scan() -> None:
    events = _long_log(300)
    session, _ = _paged(events, len(events))
    # a second result for a call answered long ago: the prefix scan finds the call, so the
    # refusal says it is no longer open (as after a full read), not that it was never made
    with pytest.raises(EventRejectedError) as info:
        session.append("tool/result", tool_result_data(1, 1, "c1"), surface_op="append")
    assert info.value.code == "ORPHAN_TOOL_RESULT"
    assert "not open" in info.value.message
    with pytest.raises(EventRejectedError) as info:
        session.append("tool/result", tool_result_data(1, 1, "nope"), surface_op="append")
    assert info.value.code == "ORPHAN_TOOL_RESULT"
    assert "no earlier assistant message" in info.value.message


def test_paged_source_serving_other_events_is_refused() -> None:
    events = _long_log(10)
    state = RestoreFold(0)
    state.feed(events)
    source = ListSource([*events[1:], events[0]])
    session = Session.restore_paged("s", {"version": 0, "id": "s", "createdAt": 1},
                                    state.state(), source, [])  # reads nothing before the cut
    with pytest.raises(LogCorruptError):
        session.derive_messages()
    with pytest.raises(LogCorruptError):
        session.event_at(3)


def test_paged_restore_refuses_a_state_of_another_length() -> None:
    events = _long_log(3)
    state = RestoreFold(0)
    state.feed(events[:5])
    with pytest.raises(EventRejectedError) as info:
        Session.restore_paged("s", {"version": 0, "id": "s", "createdAt": 1}, state.state(),
                              ListSource(events[:6]), events[6:])
    assert info.value.code == "SEED"


def test_paged_log_read_from_many_threads_answers_every_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by a tester: one thread evicted a page between another's lookup and its LRU move.
    import random
    import sys
    import threading

    from dsh.session import _paging as paging
    monkeypatch.setattr(paging, "PAGE_EVENTS", 4)
    events = _long_log(200)  # 1,400 events in 4-event pages: far more than the 32 cached
    session, _source = _paged(events, len(events) - 3)
    errors: list[str] = []
    wrong: list[int] = []

    def reader(seed: int) -> None:
        pick = random.Random(seed)
        try:
            for _ in range(3000):
                seq = pick.randrange(len(events))
                if session.events[seq] is not events[seq] and session.events[seq] != events[seq]:
                    wrong.append(seq)
        except Exception as exc:  # collected: the assertion below names it
            errors.append(repr(exc))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == [] and wrong == []


def test_the_last_messages_after_a_paged_restore_read_only_their_pages() -> None:
    # docs/rules.md#deriving-messages: derive_messages(last=N) costs O(N)
    events = _long_log(2000)
    session, source = _paged(events, len(events) - 1)
    full = _full(events).derive_messages()
    assert session.derive_messages(last=5) == full[-5:]
    assert {start for start, _ in source.reads} == {(len(events) - 2) // PAGE_EVENTS
                                                    * PAGE_EVENTS}
    assert session.derive_messages(last=0) == []
    assert session.derive_messages() == full
    assert session.derive_messages(last=10**6) == full  # the full derive's tail once current
    with pytest.raises(ValueError):
        session.derive_messages(last=-1)


def test_the_last_messages_equal_the_tail_of_the_full_derive() -> None:
    events = _long_log(30)
    session = _full(events)
    for n in (1, 2, 7, 90, 91, 200):
        assert session.derive_messages(last=n) == session.derive_messages()[-n:]


def test_node_seqs_are_an_immutable_sequence_equal_to_the_tuple() -> None:
    seqs = NodeSeqs([5, 1, 9, 2**40])
    assert seqs == (5, 1, 9, 2**40) and seqs == [5, 1, 9, 2**40] and seqs != (5, 1, 9)
    assert hash(seqs) == hash((5, 1, 9, 2**40))
    assert seqs[1] == 1 and seqs[-1] == 2**40 and seqs[1:3] == NodeSeqs([1, 9])
    assert 9 in seqs and 3 not in seqs and "x" not in seqs
    assert list(seqs) == [5, 1, 9, 2**40] and seqs.index(9) == 2
    assert NodeSeqs.from_little_endian(seqs.little_endian()) == seqs
    copy = seqs.to_array()
    copy.append(1)
    assert len(seqs) == 4  # a copy, never the buffer itself
    with pytest.raises(ValueError, match="8 bytes each"):
        NodeSeqs.from_little_endian(b"1234567")


def test_node_seqs_read_back_stay_packed_and_hand_their_array_out_once() -> None:
    seqs = NodeSeqs([*range(3, 30_000, 3), 1, 2, 29_999])
    packed = seqs.pack()
    assert len(packed) < 1_000  # 80 KB of int64s: differences that repeat pack to little
    back = NodeSeqs.unpack(packed, 30_000)
    assert back == seqs and len(back) == len(seqs) and back.pack() is packed
    first = back.to_array()
    first[0] = 7  # the caller's: the packed seqs are unchanged
    assert back == seqs and back[0] == 3 and back[-2:] == [2, 29_999]
    again = back.to_array()
    assert again == seqs.to_array() and again is not first
    assert NodeSeqs(back) == seqs and hash(back) == hash(tuple(seqs))
    for bound in (29_999, 0):  # a seq at or past the bound
        with pytest.raises(ValueError, match=r"must lie in|more seqs than"):
            NodeSeqs.unpack(packed, bound)
    for damaged in (packed[:-3], packed + b"x", b"not zlib"):
        with pytest.raises(ValueError, match="inflate"):
            NodeSeqs.unpack(damaged, 30_000)


def test_the_packed_range_check_refuses_every_seq_out_of_range() -> None:
    # C (seqs_below) and Python (the reference, no_speedups) agree
    assert NodeSeqs().all_below(0)
    assert NodeSeqs([0, 4, 2]).all_below(5)
    assert not NodeSeqs([0, 5, 2]).all_below(5)
    assert not NodeSeqs([0, -1]).all_below(5)
    assert not NodeSeqs([2**62]).all_below(2**53)
    assert not NodeSeqs([0]).all_below(0)


class PickingSource(ListSource):
    """A ListSource that also reads single events by seq (PicksEvents), counting the calls."""

    def __init__(self, events: Sequence[Event], *, shift: int = 0) -> None:
        super().__init__(events)
        self.picks: list[list[int]] = []
        self.shift = shift  # serve the event this many seqs further on (a log changed under us)

    def read_events(self, seqs: Sequence[int]) -> dict[int, Event]:
        self.picks.append(list(seqs))
        return {seq: self.events[seq + self.shift] for seq in seqs}


def test_picked_events_are_read_in_one_call_and_served_before_pages() -> None:
    events = _long_log(1200)
    source = PickingSource(events[:1000])
    log = PagedLog(source)
    log.pick([900, 5, 300, 5, 1100, -1])  # above the cut and negative seqs are not asked for
    assert source.picks == [[5, 300, 900]] and source.reads == []
    assert (log[5], log[300], log[900]) == (events[5], events[300], events[900])
    assert source.reads == []  # served without their pages
    log.pick([5, 6])  # 5 is held: only 6 is read
    assert source.picks[-1] == [6]
    assert log[7] == events[7] and source.reads == [(0, PAGE_EVENTS)]
    log.pick([8])  # its page is cached: nothing to read
    assert len(source.picks) == 2
    assert log.resident_events == PAGE_EVENTS + 4


def test_a_picked_event_with_another_seq_is_refused() -> None:
    events = _long_log(600)
    log = PagedLog(PickingSource(events[:500], shift=1))
    with pytest.raises(LogCorruptError, match=r"picked at seq 10 .*got seq 11"):
        log.pick([10])
    plain = PagedLog(ListSource(events[:500]))
    plain.pick([10])  # a source that cannot pick: nothing read, pages as ever
    assert plain.resident_events == 0 and plain[10] == events[10]


def test_a_source_that_picks_ranges_is_read_by_run_of_picked_seqs() -> None:
    # pick() from a source that picks ranges (SQLite, JSONL): one read_picked per run of seqs
    # less than a page apart, only those events held; no page read
    events = _long_log(1200)
    source = RangePickingSource(events[:1000])
    log = PagedLog(source)
    log.pick([990, 5, 7, 5, 3 + PAGE_EVENTS, 999, 1100, -1])
    assert source.picks == [(5, 4 + PAGE_EVENTS, [5, 7, 3 + PAGE_EVENTS]),
                            (990, 1000, [990, 999])]
    assert [log[s] for s in (5, 7, 3 + PAGE_EVENTS, 990, 999)] == [
        events[s] for s in (5, 7, 3 + PAGE_EVENTS, 990, 999)]
    assert source.reads == [] and log.resident_events == 5
    log.pick([5, 6])  # 5 is held: only 6 is read
    assert source.picks[-1] == (6, 7, [6])
    # a run the source cannot vouch for is left to be paged in, as ever
    unsure = RangePickingSource(events[:1000], vouch=False)
    unsure_log = PagedLog(unsure)
    unsure_log.pick([10, 20])
    assert unsure.picks == [(10, 21, [10, 20])] and unsure_log.resident_events == 0
    assert unsure_log[20] == events[20] and unsure.reads == [(0, PAGE_EVENTS)]
    # a run spans less than PICK_EVENTS seqs, however close its seqs
    spread = RangePickingSource([Event({"seq": seq}) for seq in range(PICK_EVENTS + 400)])
    PagedLog(spread).pick(range(0, PICK_EVENTS + 200, 100))
    last = (PICK_EVENTS - 1) // 100 * 100  # the last seq less than PICK_EVENTS from 0
    assert [(a, b) for a, b, _ in spread.picks] == [(0, last + 1), (last + 100, last + 201)]


def test_a_range_pick_serving_another_event_is_refused() -> None:
    events = _long_log(600)
    log = PagedLog(RangePickingSource(events[:500], serve=events[1:]))
    with pytest.raises(LogCorruptError, match=r"picked events 10..12 do not match"):
        log.pick([10, 12])
    assert log.damage is not None  # noted: the writer appends nothing more


class SelectingSource(RangePickingSource):
    """A RangePickingSource that also selects by type (``read_selected``), counting them;
    ``vouch`` False: it answers None; ``serve`` other events: a log changed under us."""

    def __init__(self, events: Sequence[Event], **kwargs: Any) -> None:
        super().__init__(events, **kwargs)
        self.selects: list[tuple[int, int]] = []

    def read_selected(self, start: int, stop: int, seqs: Any, types: Any
                      ) -> list[Event] | None:
        self.selects.append((start, stop))
        if not self.vouch:
            return None
        return [e for e in self.serve[start:stop] if e["seq"] in seqs or e["type"] in types]


_BRACKETS = ("turn/start", "turn/end")


def test_select_back_reads_back_by_type_in_growing_windows_and_pages_nothing_in() -> None:
    events = _long_log(400)
    cut = len(events) - 3
    source = SelectingSource(events[:cut])
    log = PagedLog(source)
    log.extend(events[cut:])
    expected = [e for e in reversed(events) if e["type"] in _BRACKETS]
    walk = log.select_back(_BRACKETS)
    assert [next(walk) for _ in range(3)] == expected[:3]
    assert source.selects == [(cut - 32, cut)] and source.reads == []
    assert list(walk) == expected[3:]  # the rest of the log, in windows 8 times larger
    assert source.selects[:3] == [(cut - 32, cut), (cut - 32 - 256, cut - 32),
                                  (cut - 32 - 256 - 2048, cut - 32 - 256)]
    assert source.selects[-1][0] == 0 and source.reads == []
    assert log.resident_events == 3  # nothing selected is cached
    # a snapshot (EventLog) walks its own length; a resident log in memory
    session, _, _ = _paged_from(events, cut)
    assert list(session.events.select_back(_BRACKETS)) == expected
    resident = Session.restore("s", events, {"version": 0, "id": "s", "createdAt": 1},
                               clock=StepClock(5))
    assert list(resident.events.select_back(_BRACKETS)) == expected
    assert list(log.select_back(_BRACKETS, stop=cut - 1)) == [
        e for e in reversed(events[:cut - 1]) if e["type"] in _BRACKETS]


def test_select_back_reads_the_noted_last_event_alone_then_windows_below_it() -> None:
    events = _long_log(400)
    cut = len(events) - 3
    below = [e for e in reversed(events[:cut]) if e["type"] in _BRACKETS]
    expected = [e for e in reversed(events) if e["type"] in _BRACKETS]
    source = SelectingSource(events[:cut])
    log = PagedLog(source)
    log.extend(events[cut:])
    log.note_last(_BRACKETS, below[0]["seq"], alone=True)
    walk = log.select_back(_BRACKETS)
    assert [next(walk) for _ in range(len(expected) - len(below) + 1)] == \
        expected[:len(expected) - len(below) + 1]
    assert source.picks == [(below[0]["seq"], below[0]["seq"] + 1, [below[0]["seq"]])]
    assert source.selects == [] and source.reads == []
    assert list(walk) == expected[len(expected) - len(below) + 1:]  # then windows below it
    assert source.selects[0] == (below[0]["seq"] - 32, below[0]["seq"])
    # not alone (a turn/end there): the windows start at it, not at the cut
    ended = SelectingSource(events[:cut])
    windowed = PagedLog(ended)
    windowed.note_last(_BRACKETS, below[0]["seq"], alone=False)
    assert list(windowed.select_back(_BRACKETS)) == below
    assert ended.picks == [] and ended.selects[0] == (below[0]["seq"] + 1 - 32,
                                                      below[0]["seq"] + 1)
    # other types, or a stop below the cut, read as before
    assert list(log.select_back(("turn/start",))) == [
        e for e in reversed(events) if e["type"] == "turn/start"]
    assert list(log.select_back(_BRACKETS, stop=cut - 1)) == [
        e for e in reversed(events[:cut - 1]) if e["type"] in _BRACKETS]
    # none below the cut: nothing read; a noted seq of another type is refused
    plain = SelectingSource([e for e in events[:cut] if e["type"] not in _BRACKETS])
    none = PagedLog(plain)
    none.note_last(_BRACKETS, -1, alone=False)
    assert list(none.select_back(_BRACKETS)) == [] and plain.selects == plain.picks == []
    wrong = PagedLog(SelectingSource(events[:cut]))
    wrong.note_last(_BRACKETS, next(e["seq"] for e in reversed(events[:cut])
                                    if e["type"] not in _BRACKETS), alone=True)
    with pytest.raises(LogCorruptError, match="restore point's state"):
        list(wrong.select_back(_BRACKETS))
    with pytest.raises(ValueError, match="below the cut"):
        wrong.note_last(_BRACKETS, cut, alone=False)


def test_select_back_pages_in_where_the_source_cannot_select_or_pages_are_cached() -> None:
    events = _long_log(100)
    cut = len(events)
    expected = [e for e in reversed(events) if e["type"] in _BRACKETS]
    unsure = SelectingSource(events, vouch=False)
    assert list(PagedLog(unsure).select_back(_BRACKETS)) == expected
    assert unsure.reads and unsure.selects
    plain = ListSource(events)
    assert list(PagedLog(plain).select_back(_BRACKETS)) == expected
    cached = SelectingSource(events)
    log = PagedLog(cached)
    assert log[cut - 1] == events[cut - 1]  # its page is cached now
    assert next(log.select_back(_BRACKETS)) == expected[0]
    assert cached.selects == []


@pytest.mark.parametrize("served", ["beyond the range", "out of order", "another type"])
def test_select_back_refuses_what_was_not_asked_for(served: str) -> None:
    events = _long_log(20)
    cut = len(events) - 1  # the last turn/end stays resident

    class Changed(SelectingSource):
        def read_selected(self, start: int, stop: int, seqs: Any, types: Any
                          ) -> list[Event] | None:
            found = super().read_selected(start, stop, seqs, types)
            assert found
            if served == "beyond the range":
                return [*found, events[stop]]  # the tail's turn/end, from storage again
            if served == "out of order":
                return found[::-1]
            return [*found, events[stop - 2]]  # a step/end: not asked for

    log = PagedLog(Changed(events[:cut]))
    log.extend(events[cut:])
    with pytest.raises(LogCorruptError, match="selected by type"):
        list(log.select_back(_BRACKETS))


def test_lone_reads_one_event_without_its_page_and_holds_it() -> None:
    events = _long_log(100)
    source = RangePickingSource(events)
    log = PagedLog(source)
    assert log.lone(500) == events[500]
    assert source.picks == [(500, 501, [500])] and source.reads == []
    assert log[500] == events[500] and log.lone(500) == events[500]
    assert len(source.picks) == 1 and source.reads == []  # held
    assert log.resident_events == 1
    assert log[3] == events[3] and log.lone(4) == events[4]  # a cached page serves it
    assert len(source.picks) == 1
    unsure = RangePickingSource(events, vouch=False)
    assert PagedLog(unsure).lone(500) == events[500] and unsure.reads == [(256, 512)]
    assert PagedLog(ListSource(events)).lone(7) == events[7]
    with pytest.raises(LogCorruptError, match="read alone at seq 500"):
        PagedLog(RangePickingSource(events, serve=events[1:])).lone(500)


def test_events_picked_and_read_alone_share_one_bound() -> None:
    # what pick() and lone() hold is one store of at most PICKED_EVENTS events: at the bound
    # either one starts it anew (the events dropped page in as ever)
    from dsh.session._paging import PICKED_EVENTS

    class Both(PickingSource, RangePickingSource):
        def __init__(self, events: Sequence[Event]) -> None:
            RangePickingSource.__init__(self, events)
            self.shift = 0

    events = _long_log(PICKED_EVENTS // 3)  # 7 events a turn: more than the bound
    log = PagedLog(Both(events))
    log.pick(range(PICKED_EVENTS))
    assert log.resident_events == PICKED_EVENTS
    assert log.lone(PICKED_EVENTS + 1) == events[PICKED_EVENTS + 1]
    assert log.resident_events == 1  # full: started anew, then held
    log.pick([0, 1])
    assert log.resident_events == 3
    assert (log[0], log[1]) == (events[0], events[1])

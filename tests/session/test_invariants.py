"""Invariant companion: docs/rules.md#turns-and-steps."""

from __future__ import annotations

from typing import Any

import pytest

from dsh._errors import InvariantError
from dsh.session._events import Event
from dsh.session._invariants import (
    INVARIANT_PREFIX,
    InvariantObserver,
    InvariantTrace,
    TraceState,
    Violation,
    check_log,
)
from dsh.session._repair import interrupted_turn_closers
from dsh.testing import LogBuilder, make


def rejects(trace: InvariantTrace, event: Event, fragment: str) -> InvariantError:
    state = trace.state
    with pytest.raises(InvariantError) as info:
        trace.validate(event)
    assert info.value.message.startswith(INVARIANT_PREFIX)
    assert fragment in info.value.message
    assert info.value.code == "INVARIANT"
    assert trace.state is state  # a rejected event changes nothing
    return info.value


def applied(*events: Event) -> InvariantTrace:
    trace = InvariantTrace()
    trace.replay(events)
    return trace


def well_formed() -> LogBuilder:
    log = LogBuilder(checked=False)
    log.user("outside any turn")
    log.turn_start(1)
    log.step_start(1, 1)
    log.user()
    log.add("request/header", {"header": {"config": {"provider": "p", "model": "m"}},
                               "reason": "initial"})
    log.add("request/context", {"provider": "p", "model": "m"})
    log.chunk(1, 1, {"type": "text-delta", "index": 0, "text": "x"})
    log.assistant(1, 1, [("c1", "bash")])
    call = log.tool_call(1, 1, "c1")
    log.tool_result(1, 1, "c1", call_seq=call.seq)
    log.add("todo/write", {"todos": []})
    log.step_end(1, 1)
    log.step_start(1, 2)
    log.assistant(1, 2)
    log.step_end(1, 2)
    log.turn_end(1)
    log.add("plan/mode", {"active": True})
    log.turn_start(2)
    log.turn_end(2)
    return log


def test_invariants_accepts_a_well_formed_turn_step_and_tool_sequence() -> None:
    # docs/rules.md#turns-and-steps "accepts a well-formed turn, step, and tool sequence"
    log = well_formed()
    trace = applied(*log.events)
    assert trace.state == TraceState(last_seq=log.seq - 1, open_turn=None, open_step=None,
                                     next_turn=3, next_step=1, pending_calls=frozenset())
    assert check_log(log.events) == []


def test_invariants_validate_does_not_advance_the_trace_until_applied() -> None:
    # docs/rules.md#turns-and-steps "does not advance committed trace state when a later dispatch
    # listener vetoes"
    trace = applied(make("turn/start", 0, {"turn": 1}))
    before = trace.state
    transition = trace.validate(make("step/start", 1, {"turn": 1, "step": 1}))
    assert trace.state is before  # vetoed later: never committed, nothing changed
    assert transition.state.open_step == 1
    trace.commit(transition)
    assert trace.state.open_step == 1


def test_invariants_rejects_non_monotonic_event_sequence_numbers() -> None:
    # docs/rules.md#turns-and-steps "rejects non-monotonic event sequence numbers"
    trace = applied(make("plan/mode", 0, {}), make("plan/mode", 1, {}))
    error = rejects(trace, make("plan/mode", 1, {}), "seq must strictly increase: saw 1 after 1")
    assert error.where == {"seq": 1, "event_type": "plan/mode", "rule": "SEQ_ORDER"}
    rejects(trace, make("plan/mode", 0, {}), "saw 0 after 1")
    trace.apply(make("plan/mode", 5, {}))  # gaps are the Session's business, not the trace's
    assert trace.state.last_seq == 5


def test_invariants_enforces_turn_numbering_and_core_execution_enclosure() -> None:
    # docs/rules.md#turns-and-steps "enforces turn numbering and core execution enclosure"
    trace = applied(make("turn/start", 0, {"turn": 1}))
    rejects(trace, make("turn/start", 1, {"turn": 2}), "turn/start 2 while turn 1 is still open")
    rejects(trace, make("turn/end", 1, {"turn": 2, "reason": {"kind": "completed"}}),
            "turn/end 2 does not match open turn 1")
    for kind, data in (("todo/write", {"todos": []}),
                       ("request/header", {"header": {}, "reason": "initial"}),
                       ("request/context", {"provider": "p", "model": "m"})):
        trace.validate(make(kind, 1, data))  # inside a turn: fine
    trace.apply(make("turn/end", 1, {"turn": 1, "reason": {"kind": "completed"}}))
    rejects(trace, make("turn/start", 2, {"turn": 3}), "turn/start expected turn 2, got 3")
    trace.validate(make("user/message", 2, {"id": "u"}, surfaceOp="append"))
    rejects(trace, make("request/context", 2, {"provider": "p", "model": "m"}),
            "request/context appended outside any open turn (core execution events must be "
            "turn-enclosed)")
    rejects(trace, make("todo/write", 2, {"todos": []}), "todo/write appended outside")
    trace.validate(make("plugin/unknown", 2, None))  # plugin types are unconstrained here
    rejects(trace, make("turn/end", 2, {"turn": 1, "reason": {}}),
            "turn/end 1 does not match open turn null")


def test_invariants_enforces_open_step_identity_and_numbering() -> None:
    # docs/rules.md#turns-and-steps "enforces open-step identity and numbering"
    trace = applied(make("turn/start", 0, {"turn": 1}))
    rejects(trace, make("step/start", 1, {"turn": 2, "step": 1}),
            "step/start in turn 2 but open turn is 1")
    rejects(trace, make("step/start", 1, {"turn": 1, "step": 2}),
            "step/start expected step 1 in turn 1, got 2")
    trace.apply(make("step/start", 1, {"turn": 1, "step": 1}))
    rejects(trace, make("step/start", 2, {"turn": 1, "step": 2}),
            "step/start 2 while step 1 is still open")
    rejects(trace, make("turn/end", 2, {"turn": 1, "reason": {"kind": "completed"}}),
            "turn/end 1 while step 1 is still open")
    rejects(trace, make("step/end", 2, {"turn": 1, "step": 2}),
            "step/end names turn 1/step 2 but open is turn 1/step 1")
    rejects(trace, LogBuilder(checked=False, start=2).assistant(1, 2),
            "assistant/message names turn 1/step 2 but open is turn 1/step 1")
    trace.apply(make("step/end", 2, {"turn": 1, "step": 1}))
    rejects(trace, make("step/start", 3, {"turn": 1, "step": 3}),
            "step/start expected step 2 in turn 1, got 3")
    trace.apply(make("step/start", 3, {"turn": 1, "step": 2}))


def test_invariants_requires_step_scoped_stream_and_tool_events_to_name_the_open_step() -> None:
    # docs/rules.md#turns-and-steps "requires step-scoped stream and tool events to name the open
    # step"
    trace = applied(make("turn/start", 0, {"turn": 1}))
    rejects(trace, make("assistant/chunk", 1, {"turn": 1, "step": 1, "chunk": {}}),
            "assistant/chunk names turn 1/step 1 but open is turn 1/step null")
    rejects(trace, make("tool/call", 1, {"turn": 1, "step": 1, "callId": "c"}),
            "open is turn 1/step null")
    trace.apply(make("step/start", 1, {"turn": 1, "step": 1}))
    result = LogBuilder(checked=False, start=2).tool_result(1, 1, "c1")
    error = rejects(trace, result, "tool/result for 'c1' with no prior tool/call in this step")
    assert error.where["rule"] == "UNPAIRED_RESULT"
    # a damaged log can carry any JSON value as the call id: still a typed refusal
    trace.apply(make("tool/call", 2, {"turn": 1, "step": 1, "callId": "c"}))
    listed = make("tool/result", 3, {"turn": 1, "step": 1, "message": {
        "id": "r", "role": "user", "source": {"kind": "tool", "callId": ["c"]},
        "content": [{"type": "tool-result", "toolCallId": "c", "content": []}]}},
                  surfaceOp="append")
    error = rejects(trace, listed, "tool/result for null with no prior tool/call in this step")
    assert error.where["rule"] == "UNPAIRED_RESULT"


def test_invariants_keeps_fresh_tool_result_appends_open_step_checked() -> None:
    # docs/rules.md#turns-and-steps "keeps fresh tool-result appends open-step checked"
    log = LogBuilder(checked=False)
    log.turn_start(1)
    log.step_start(1, 1)
    log.assistant(1, 1, [("c1", "bash")])
    log.tool_call(1, 1, "c1")
    log.step_end(1, 1)
    trace = applied(*log.events)
    rejects(trace, LogBuilder(checked=False, start=5).tool_result(1, 1, "c1"),
            "tool/result names turn 1/step 1 but open is turn 1/step null")


def test_invariants_treats_a_validated_tool_result_replacement_as_a_turn_enclosed_rewrite(
) -> None:
    # docs/rules.md#turns-and-steps "treats a validated tool-result replacement as a turn-enclosed
    # rewrite"
    log = LogBuilder(checked=False)
    log.turn_start(1)
    log.step_start(1, 1)
    log.assistant(1, 1, [("c1", "bash")])
    call = log.tool_call(1, 1, "c1")
    original = log.tool_result(1, 1, "c1", call_seq=call.seq)
    log.step_end(1, 1)
    log.turn_end(1)
    log.turn_start(2)
    # the rewrite keeps turn 1/step 1 and is appended in turn 2 with no step open
    log.add("tool/result", original.data,
            surface_op={"op": "replace", "start": original.seq, "end": original.seq},
            source_event_seqs=[original.seq])
    assert check_log(log.events) == []
    trace = applied(*log.events)
    assert trace.state.pending_calls == frozenset()


def test_invariants_rejects_a_tool_result_replacement_outside_a_turn() -> None:
    # docs/rules.md#turns-and-steps "rejects a tool-result replacement outside a turn"
    trace = applied(make("plan/mode", 0, {}))
    replacement = LogBuilder(checked=False, start=1).tool_result(1, 1, "c1",
                                            surface_op={"op": "replace", "start": 0, "end": 0})
    rejects(trace, replacement, "tool/result surface replacement appended outside any open turn")


def test_invariants_allows_not_started_repair_results_and_unresolved_calls_at_step_end() -> None:
    # docs/rules.md#turns-and-steps "allows not-started repair results and unresolved calls at step
    # end"
    log = LogBuilder(checked=False)
    log.turn_start(1)
    log.step_start(1, 1)
    log.assistant(1, 1, [("c1", "bash"), ("c2", "bash")])
    log.tool_call(1, 1, "c2")  # recorded, never answered
    log.events.extend(interrupted_turn_closers(log.events)[:1])  # not-started result for c1
    assert log.events[-1].data["error"]["code"] == "TOOL_NOT_STARTED"
    log.step_end(1, 1)  # c2 still unresolved: allowed
    log.turn_end(1)
    assert check_log(log.events) == []
    # a not-started code without isError is not exempt
    trace = applied(*log.events[:4])
    not_exempt = LogBuilder(checked=False, start=4).tool_result(1, 1, "c1",
                                           error={"name": "X", "code": "TOOL_NOT_STARTED"})
    rejects(trace, not_exempt,
            "tool/result for 'c1' with no prior tool/call")


def test_invariants_does_not_let_a_result_in_a_later_step_satisfy_an_earlier_call() -> None:
    # docs/rules.md#turns-and-steps "does not let a result in a later step satisfy an earlier call"
    log = LogBuilder(checked=False)
    log.turn_start(1)
    log.step_start(1, 1)
    log.assistant(1, 1, [("c1", "bash")])
    call = log.tool_call(1, 1, "c1")
    log.step_end(1, 1)
    log.step_start(1, 2)
    log.tool_result(1, 2, "c1", call_seq=call.seq)
    assert check_log(log.events) == [Violation(
        6, "UNPAIRED_RESULT", "tool/result for 'c1' with no prior tool/call in this step")]


def test_invariants_accepts_end_seed_whether_or_not_a_turn_is_open() -> None:
    # docs/rules.md#turns-and-steps "accepts end-seed whether or not a turn is open"
    trace = applied(make("session/end-seed", 0, {}), make("turn/start", 1, {"turn": 1}),
                    make("session/end-seed", 2, {"inherited": True}))
    assert trace.state.open_turn == 1  # the marker leaves the turn open
    trace.apply(make("turn/end", 3, {"turn": 1, "reason": {"kind": "forked"}}))


def test_invariants_never_treats_a_bool_as_a_turn_number() -> None:
    trace = InvariantTrace()
    rejects(trace, make("turn/start", 0, {"turn": True}), "turn/start expected turn 1, got True")


def test_invariants_check_log_reports_each_defect_once_and_resynchronises() -> None:
    log = LogBuilder(checked=False)
    log.turn_start(1)
    log.turn_end(1)
    log.turn_start(3)  # skipped a number
    log.step_start(3, 1)
    log.step_end(3, 1)
    log.turn_end(3)
    log.turn_start(4)
    log.turn_end(4)
    log.add("request/header", {"header": {}, "reason": "change"})
    assert check_log(log.events) == [
        Violation(2, "TURN_NUMBER", "turn/start expected turn 2, got 3"),
        Violation(8, "OUTSIDE_TURN", "request/header appended outside any open turn (core "
                                     "execution events must be turn-enclosed)"),
    ]


# --- the observer (store integration, docs/rules.md#turns-and-steps) ------------------------------


class FakeSession:
    def __init__(self, events: list[Event]) -> None:
        self._events = list(events)

    @property
    def events(self) -> tuple[Event, ...]:
        return tuple(self._events)

    def commit(self, observer: InvariantObserver, event: Event) -> None:
        observer.validate(self, event)  # the store's pre-commit hook
        self._events.append(event)
        observer.on_event(self, event)


def test_invariants_observer_replays_seeded_sessions_and_tracks_each_session_independently(
) -> None:
    # docs/rules.md#turns-and-steps "replays seeded sessions and tracks each session independently"
    observer = InvariantObserver()
    bad = FakeSession([make("turn/start", 0, {"turn": 2})])
    with pytest.raises(InvariantError, match="turn/start expected turn 1, got 2"):
        observer.on_created(bad)  # the store rolls the creation back
    a = FakeSession([make("turn/start", 0, {"turn": 1})])
    b = FakeSession([])
    observer.on_created(a)
    observer.on_created(b)
    a.commit(observer, make("step/start", 1, {"turn": 1, "step": 1}))
    b.commit(observer, make("turn/start", 0, {"turn": 1}))
    with pytest.raises(InvariantError, match="step/start expected step 1 in turn 1, got 2"):
        b.commit(observer, make("step/start", 1, {"turn": 1, "step": 2}))
    assert len(b.events) == 1  # vetoed before the commit
    assert observer.trace(a).state.open_step == 1
    assert observer.trace(b).state.open_step is None


def test_invariants_observer_rebuilds_trace_state_for_sessions_that_already_exist() -> None:
    # docs/rules.md#turns-and-steps "rebuilds trace state for sessions that exist when the companion
    # reloads"
    session = FakeSession([make("turn/start", 0, {"turn": 1}),
                           make("step/start", 1, {"turn": 1, "step": 1})])
    observer = InvariantObserver()  # installed after the session was created
    with pytest.raises(InvariantError, match="step/start 2 while step 1 is still open"):
        observer.validate(session, make("step/start", 2, {"turn": 1, "step": 2}))
    session.commit(observer, make("step/end", 2, {"turn": 1, "step": 1}))
    assert observer.trace(session).state.next_step == 2


def test_invariants_observer_applies_committed_events_seen_first_post_commit() -> None:
    # docs/rules.md#turns-and-steps "applies the committed transition after another postcommit
    # observer throws": the transition is applied by on_event whatever other observers did
    session = FakeSession([make("turn/start", 0, {"turn": 1})])
    observer = InvariantObserver()
    event = make("step/start", 1, {"turn": 1, "step": 1})
    session._events.append(event)
    observer.on_event(session, event)  # first sight: replays the log up to the event
    assert observer.trace(session).state.open_step == 1
    other = make("step/end", 2, {"turn": 1, "step": 1})
    session._events.append(other)
    observer.on_event(session, other)
    assert observer.trace(session).state.open_step is None


def test_invariants_observer_forgets_disposed_sessions() -> None:
    # docs/rules.md#turns-and-steps "removes all listeners when the companion is disposed"
    # (per-session form)
    observer = InvariantObserver()
    session = FakeSession([make("turn/start", 0, {"turn": 1})])
    observer.on_created(session)
    observer.on_flush(session)
    observer.on_disposed(session)
    assert len(observer._traces) == 0
    observer.on_disposed(session)  # twice is harmless


def _real_session(session_id: str) -> Any:
    session_module = pytest.importorskip(
        "dsh.session._session", reason="SKIPPED LOUDLY: dsh.session._session not written yet")
    return session_module.Session.create(session_id)


def test_invariants_attached_to_a_real_session_vetoes_bad_appends() -> None:
    # docs/rules.md#turns-and-steps: validate before commit (a throw rejects the append), apply
    # after commit
    session = _real_session("invariant-real")
    observer = InvariantObserver()
    detach = observer.attach(session)
    session.append("turn/start", {"turn": 1})
    session.append("step/start", {"turn": 1, "step": 1})
    with pytest.raises(InvariantError, match="step/start 2 while step 1 is still open"):
        session.append("step/start", {"turn": 1, "step": 2})
    assert len(session.events) == 2  # vetoed: nothing committed
    assert observer.trace(session).state.open_step == 1
    session.append("step/end", {"turn": 1, "step": 1})
    assert observer.trace(session).state.next_step == 2
    assert check_log(session.events) == []
    detach()
    session.append("turn/start", {"turn": 9})  # detached: no checks any more
    assert len(observer._traces) == 0


def test_invariants_a_later_validator_veto_leaves_the_trace_unchanged() -> None:
    # docs/rules.md#turns-and-steps "does not advance committed trace state when a later dispatch
    # listener vetoes"
    session = _real_session("invariant-veto")
    observer = InvariantObserver()
    observer.attach(session)

    def veto(_session: Any, candidate: Event) -> None:
        if candidate.type == "turn/start":
            raise InvariantError("vetoed by a peer")

    session.add_validator(veto)
    with pytest.raises(InvariantError, match="vetoed by a peer"):
        session.append("turn/start", {"turn": 1})
    assert observer.trace(session).state == TraceState()
    session.append("plan/mode", {"active": True})
    assert observer.trace(session).state.last_seq == 0


def test_invariants_applies_the_transition_after_another_post_commit_observer_throws(
        caplog: pytest.LogCaptureFixture) -> None:
    # docs/rules.md#turns-and-steps "applies the committed transition after another postcommit
    # observer throws"
    session = _real_session("invariant-peer-throws")

    def broken(_session: Any, _event: Event) -> None:
        raise RuntimeError("peer observer failed")

    session.observe(broken)
    observer = InvariantObserver()
    observer.attach(session)
    session.append("turn/start", {"turn": 1})
    session.append("step/start", {"turn": 1, "step": 1})
    assert observer.trace(session).state.open_step == 1
    assert sum("peer observer failed" in r.exc_text for r in caplog.records
               if r.exc_text) == 2


def _event(kind: str, seq: Any, turn: Any, step: Any, call: str) -> Event:
    from dsh.json import snapshot_json

    data: dict[str, Any] = {"turn": turn, "step": step, "callId": call,
                            "message": {"source": {"callId": call}}}
    return Event(snapshot_json({"seq": seq, "type": kind, "time": 0, "data": data,
                                "surfaceOp": "append"}))


def test_invariants_check_log_equals_the_event_by_event_trace() -> None:
    # check_log skips the state for events of no rule (their seq only): same findings as
    # _check and _effect run on every event (docs/rules.md#turns-and-steps)
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from dsh.session import _invariants

    kinds = st.sampled_from(["turn/start", "turn/end", "step/start", "step/end", "tool/call",
                             "tool/result", "assistant/message", "request/header",
                             "user/message", "x/tick", "plan/mode"])
    small = st.one_of(st.integers(min_value=0, max_value=3), st.none(), st.booleans())
    events = st.lists(st.tuples(kinds, st.integers(min_value=-1, max_value=40), small, small,
                                st.sampled_from(["c1", "c2"])), max_size=40)

    @settings(max_examples=300, deadline=None)
    @given(raw=events)
    def check(raw: list[tuple[str, int, Any, Any, str]]) -> None:
        log = [_event(*fields) for fields in raw]
        state = TraceState()
        expected: list[Violation] = []
        for event in log:
            try:
                _invariants._check(state, event)
            except _invariants._Broken as broken:
                seq = event.get("seq")
                expected.append(Violation(seq if type(seq) is int else None, broken.rule,
                                          broken.message))
            state = _invariants._effect(state, event)
        assert check_log(log) == expected

    check()

"""Open-turn closers: docs/rules.md#repair, docs/rules.md#closers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh._errors import ConfigError, EventRejectedError
from dsh.json import dumps, loads
from dsh.session._events import Event
from dsh.session._invariants import check_log
from dsh.session._repair import (
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    closer_text,
    interrupted_turn_closers,
    open_turn_closers,
)
from dsh.session._surface import fold_surface
from dsh.testing import LogBuilder, make
from tests.session._log_strategies import MAX_EXAMPLES, well_formed_logs

pytestmark = pytest.mark.no_speedups


def _text(event: Event) -> str:
    return event.data["message"]["content"][0]["content"][0]["text"]  # type: ignore[no-any-return]


def _open_step_with_call(record_call: bool) -> LogBuilder:
    log = LogBuilder(checked=False)
    log.turn_start(1)
    log.step_start(1, 1)
    log.assistant(1, 1, [("call-a", "bash")])
    if record_call:
        log.tool_call(1, 1, "call-a", "bash")
    return log


# --- docs/rules.md#repair -----------------------------------------------------------------------


def test_repair_returns_nothing_for_a_balanced_log_ending_on_turn_end() -> None:
    # docs/rules.md#repair "returns nothing for a balanced log (ends on turn/end)"
    log = LogBuilder(checked=False)
    log.turn_start(1)
    log.step_start(1, 1)
    log.user()
    log.step_end(1, 1)
    log.turn_end(1)
    assert interrupted_turn_closers(log.events) == ()
    log.add("plan/mode", {"active": False})  # log-only events after the turn change nothing
    assert interrupted_turn_closers(log.events) == ()


def test_repair_returns_nothing_for_an_empty_log() -> None:
    # docs/rules.md#repair "returns nothing for an empty log"
    assert interrupted_turn_closers([]) == ()
    assert open_turn_closers([], "forked") == ()


def test_repair_closes_an_open_turn_with_no_open_step() -> None:
    # docs/rules.md#repair "closes an open turn with no open step (turn/end {interrupted} only)"
    log = LogBuilder(checked=False)
    log.turn_start(1)
    last = log.user()
    closers = interrupted_turn_closers(log.events)
    assert closers == (Event({"type": "turn/end", "seq": 2, "time": last.time,
                              "data": {"turn": 1, "reason": {"kind": "interrupted"}}}),)


def test_repair_closes_an_open_step_before_the_turn() -> None:
    # docs/rules.md#repair "closes an open step before the turn (step/end then turn/end)" - seqs 2,
    # 3
    log = LogBuilder(checked=False)
    log.turn_start(1)
    log.step_start(1, 1)
    closers = interrupted_turn_closers(log.events)
    assert [(c.type, c.seq, c.data) for c in closers] == [
        ("step/end", 2, {"turn": 1, "step": 1}),
        ("turn/end", 3, {"turn": 1, "reason": {"kind": "interrupted"}}),
    ]


def test_repair_marks_an_assistant_tool_request_with_no_recorded_call_as_not_started() -> None:
    # docs/rules.md#repair "marks an assistant tool request with no recorded call as not started"
    log = _open_step_with_call(record_call=False)
    closers = interrupted_turn_closers(log.events)
    assert [c.type for c in closers] == ["tool/result", "step/end", "turn/end"]
    assert [c.seq for c in closers] == [3, 4, 5]
    result = closers[0]
    assert result.data["turn"] == 1
    assert result.data["step"] == 1
    assert result.data["message"]["source"] == {"kind": "tool", "callId": "call-a"}
    block = result.data["message"]["content"][0]
    assert block["toolCallId"] == "call-a"
    assert block["isError"] is True
    assert result.data["error"] == {"name": "ToolNotStartedError", "code": TOOL_NOT_STARTED}
    assert "sourceEventSeqs" not in result
    assert result.surface_op == "append"
    assert _text(result) == (
        'The session was interrupted before the "bash" tool call call-a was recorded as '
        "started, so it most likely never ran, but its outcome is not known for certain. "
        "Retry only if the operation is read-only or idempotent; if it could have side effects, "
        "first check the external state (or ask the user) to learn whether it already took "
        "effect. Never retry blindly.")


def test_repair_does_not_synthesize_a_result_for_a_tool_call_that_already_has_one() -> None:
    # docs/rules.md#repair "does NOT synthesize a result for a tool-call that already has one"
    log = _open_step_with_call(record_call=True)
    log.tool_result(1, 1, "call-a", call_seq=3)
    closers = interrupted_turn_closers(log.events)
    assert [(c.type, c.seq) for c in closers] == [("step/end", 5), ("turn/end", 6)]


def test_repair_does_not_synthesize_a_result_after_the_owning_step_already_closed() -> None:
    # docs/rules.md#repair "does NOT synthesize a result after the owning step already closed" -
    # turn/end at 4
    log = _open_step_with_call(record_call=False)
    log.step_end(1, 1)
    closers = interrupted_turn_closers(log.events)
    assert [(c.type, c.seq) for c in closers] == [("turn/end", 4)]


def test_repair_synthesizes_results_only_for_the_still_open_turn() -> None:
    # docs/rules.md#repair "synthesizes results only for the still-open turn, not a committed
    # earlier turn"
    log = LogBuilder(checked=False)
    log.turn_start(1)
    log.step_start(1, 1)
    log.assistant(1, 1, [("call-old", "bash")])
    log.turn_end(1, "aborted")  # closed without step/end: turn/end clears everything too
    log.turn_start(2)
    log.step_start(2, 1)
    log.assistant(2, 1, [("call-new", "grep")])
    closers = interrupted_turn_closers(log.events)
    assert [c.type for c in closers] == ["tool/result", "step/end", "turn/end"]
    assert closers[0].data["message"]["source"]["callId"] == "call-new"
    assert closers[0].data["turn"] == 2
    assert closers[-1].data == {"turn": 2, "reason": {"kind": "interrupted"}}


def test_repair_synthesizes_a_result_for_each_of_multiple_unanswered_calls_in_log_order() -> None:
    # docs/rules.md#repair "synthesizes a result for each of multiple unanswered calls, in log
    # order" (call-a is answered, so only call-b and call-c remain, in registration order)
    log = LogBuilder(checked=False)
    log.turn_start(1)
    log.step_start(1, 1)
    log.assistant(1, 1, [("call-a", "bash"), ("call-b", "grep"), ("call-c", "bash")])
    call_c = log.tool_call(1, 1, "call-c")
    log.tool_call(1, 1, "call-a")
    log.tool_result(1, 1, "call-a", call_seq=4)
    closers = interrupted_turn_closers(log.events)
    results = [c for c in closers if c.type == "tool/result"]
    assert [r.data["message"]["source"]["callId"] for r in results] == ["call-b", "call-c"]
    assert [r.data["message"]["id"] for r in results] == [
        "interrupted-tool-result-call-b-6", "interrupted-tool-result-call-c-7"]
    assert [r.data["error"]["code"] for r in results] == [TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN]
    assert results[1].source_event_seqs == [call_c.seq]


def test_repair_synthesized_tool_result_carries_surface_op_and_source_event_seqs() -> None:
    # docs/rules.md#repair "synthesized tool/result carries surfaceOp and sourceEventSeqs when
    # tool/call was logged" - sources [3], outcome-unknown error, the retry clauses
    log = _open_step_with_call(record_call=True)
    result = interrupted_turn_closers(log.events)[0]
    assert result.surface_op == "append"
    assert result.source_event_seqs == [3]
    assert result.data["error"] == {"name": "ToolOutcomeUnknownError",
                                    "code": TOOL_OUTCOME_UNKNOWN}
    text = _text(result)
    assert '"bash" tool call call-a' in text
    assert "outcome is unknown" in text
    assert "Retry only if the operation is read-only or idempotent" in text
    assert "first check the external state (or ask the user)" in text
    assert "Never retry blindly." in text


def test_repair_handles_tool_call_without_a_matching_assistant_message_entry() -> None:
    # docs/rules.md#repair "handles tool/call without a matching assistant/message entry gracefully"
    log = LogBuilder(checked=False)
    log.turn_start(1)
    log.step_start(1, 1)
    log.tool_call(1, 1, "call-orphan")
    closers = interrupted_turn_closers(log.events)
    assert [c.type for c in closers] == ["step/end", "turn/end"]


# --- exact shape (docs/rules.md#closers key orders) and determinism -------------------------------


def test_repair_closers_use_the_exact_key_orders_of_the_spec() -> None:
    log = _open_step_with_call(record_call=True)
    result, step_end, turn_end = interrupted_turn_closers(log.events)
    assert list(result) == ["type", "seq", "time", "data", "surfaceOp", "sourceEventSeqs"]
    assert list(result.data) == ["turn", "step", "message", "error"]
    assert list(result.data["message"]) == ["id", "role", "source", "content"]
    assert list(result.data["message"]["content"][0]) == [
        "type", "toolCallId", "isError", "content"]
    assert list(result.data["message"]["content"][0]["content"][0]) == ["type", "text"]
    assert list(step_end) == ["type", "seq", "time", "data"]
    assert list(turn_end.data) == ["turn", "reason"]
    not_started = interrupted_turn_closers(_open_step_with_call(record_call=False).events)[0]
    assert list(not_started) == ["type", "seq", "time", "data", "surfaceOp"]
    wire = dumps(result)
    assert wire.startswith(b'{"type":"tool/result","seq":4,"time":')
    assert loads(wire) == result


def test_repair_closers_reuse_the_last_event_time_and_are_deterministic() -> None:
    log = _open_step_with_call(record_call=True)
    log.add("plan/mode", {"active": True}, time=5)  # the clock stepped back: reuse it anyway
    first = interrupted_turn_closers(log.events)
    assert {c.time for c in first} == {5}
    assert interrupted_turn_closers(log.events) == first
    assert dumps(list(first)) == dumps(list(interrupted_turn_closers(log.events)))


def test_repair_closers_are_frozen_events() -> None:
    result = interrupted_turn_closers(_open_step_with_call(record_call=True).events)[0]
    assert isinstance(result, Event)
    with pytest.raises(TypeError):
        result["seq"] = 0  # type: ignore[index]
    with pytest.raises(TypeError):
        result.data["message"]["content"].append({})
    with pytest.raises(TypeError):
        result.data["message"]["content"][0]["content"][0]["text"] = "x"


def test_repair_re_registered_call_keeps_its_position_and_forgets_its_tool_call() -> None:
    # docs/rules.md#closers: re-registering an id overwrites its entry, keeps the map position,
    # drops callSeq
    log = LogBuilder(checked=False)
    log.turn_start(1)
    log.step_start(1, 1)
    log.assistant(1, 1, [("call-a", "bash"), ("call-b", "bash")])
    log.tool_call(1, 1, "call-a")
    log.assistant(1, 1, [("call-a", "bash")])
    results = interrupted_turn_closers(log.events)[:2]
    assert [r.data["message"]["source"]["callId"] for r in results] == ["call-a", "call-b"]
    assert [r.data["error"]["code"] for r in results] == [TOOL_NOT_STARTED, TOOL_NOT_STARTED]


def test_repair_a_replacement_tool_result_also_answers_its_call() -> None:
    # docs/rules.md#closers: tool/result deletes its callId whatever the surfaceOp
    log = _open_step_with_call(record_call=True)
    first = log.tool_result(1, 1, "call-a", call_seq=3)
    log.add("tool/result", first.data, surface_op={"op": "replace", "start": 4, "end": 4},
            source_event_seqs=[4])
    assert [c.type for c in interrupted_turn_closers(log.events)] == ["step/end", "turn/end"]


def test_repair_rejects_a_log_that_is_not_contiguous_from_seq_zero() -> None:
    events = [make("turn/start", 0, {"turn": 1}), make("step/start", 2, {"turn": 1, "step": 1})]
    with pytest.raises(EventRejectedError) as info:
        interrupted_turn_closers(events)
    assert info.value.code == "SEQ_GAP"
    assert info.value.where["seq"] == 1
    assert "found seq 2 at index 1" in info.value.message
    with pytest.raises(EventRejectedError, match="found seq 1 at index 0"):
        interrupted_turn_closers([make("turn/start", 1, {"turn": 1})])
    # equal to the index but not an int: still a gap (True == 1, 1.0 == 1)
    for odd in (True, 1.0):
        bad = [make("turn/start", 0, {"turn": 1}), {**make("step/start", 1, {"turn": 1, "step": 1}),
                                                  "seq": odd}]
        with pytest.raises(EventRejectedError, match=f"found seq {odd!r} at index 1"):
            interrupted_turn_closers(bad)


def test_repair_rejects_an_unknown_cause() -> None:
    with pytest.raises(ConfigError, match="'interrupted' or 'forked'"):
        open_turn_closers([], "crashed")  # type: ignore[arg-type]


def test_repair_rejects_an_assistant_message_without_content() -> None:
    events = [make("turn/start", 0, {"turn": 1}),
              make("assistant/message", 1, {"turn": 1, "step": 1, "message": {}},
                 surfaceOp="append")]
    with pytest.raises(EventRejectedError) as info:
        interrupted_turn_closers(events)
    assert info.value.code == "MALFORMED_EVENT"
    assert info.value.where == {"seq": 1, "event_type": "assistant/message"}


# --- forked cause (docs/rules.md#fork) ------------------------------------------------------------


def test_forked_closers_differ_from_interrupted_only_in_wording_ids_and_reason() -> None:
    log = LogBuilder(checked=False)
    log.turn_start(1)
    log.step_start(1, 1)
    log.assistant(1, 1, [("call-a", "bash"), ("call-b", "grep")])
    log.tool_call(1, 1, "call-a")
    interrupted = interrupted_turn_closers(log.events)
    forked = open_turn_closers(log.events, "forked")
    assert [(c.type, c.seq, c.time) for c in forked] == [
        (c.type, c.seq, c.time) for c in interrupted]
    assert forked[-1].data == {"turn": 1, "reason": {"kind": "forked"}}
    assert [c.data["message"]["id"] for c in forked[:2]] == [
        "forked-tool-result-call-a-4", "forked-tool-result-call-b-5"]
    assert [c.data["error"] for c in forked[:2]] == [c.data["error"] for c in interrupted[:2]]
    assert forked[0].source_event_seqs == [3]
    started, not_started = _text(forked[0]), _text(forked[1])
    assert started == (
        'The history this branch inherited records the "bash" tool call call-a starting but '
        "holds no result for it; the parent session may have completed it after the fork point, "
        "so its outcome is unknown here. Retry only if the operation is read-only or idempotent; "
        "if it could have side effects, first check the external state (or ask the user) to "
        "learn whether it already took effect. Never retry blindly.")
    assert not_started.startswith(
        'The history this branch inherited has no record of the "grep" tool call call-b '
        "starting; the parent session may have executed it after the fork point, so its "
        "outcome is unknown here.")
    assert "Never retry blindly." in not_started


def test_closer_text_without_a_tool_name_still_names_the_call() -> None:
    text = closer_text("interrupted", started=True, call_id="c9", tool_name=None)
    assert "tool call c9 (tool name not recorded)" in text
    assert "outcome is unknown" in text


def test_repair_tool_call_name_is_used_when_the_request_had_none() -> None:
    log = LogBuilder(checked=False)
    log.turn_start(1)
    log.step_start(1, 1)
    log.add("assistant/message", {"turn": 1, "step": 1, "message": {
        "id": "a", "role": "assistant", "source": {"kind": "model", "provider": "p", "model": "m"},
        "content": [{"type": "tool-call", "id": "c1", "arguments": "{}"}]}}, surface_op="append")
    log.tool_call(1, 1, "c1", "web_fetch")
    assert '"web_fetch" tool call c1' in _text(interrupted_turn_closers(log.events)[0])


# --- properties (docs/testing.md#what-the-tests-cover: repair output always passes the
# invariants)


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(log=well_formed_logs(), data=st.data(),
       cause=st.sampled_from(["interrupted", "forked"]))
def test_repair_closers_always_leave_a_log_that_passes_the_invariants(
        log: list[Event], data: st.DataObject, cause: str) -> None:
    cut = data.draw(st.integers(0, len(log)), label="cut")
    prefix = log[:cut]
    assert check_log(prefix) == []
    closers = open_turn_closers(prefix, cause)  # type: ignore[arg-type]
    repaired = [*prefix, *closers]
    assert check_log(repaired) == []
    # the closers are valid surface appends too, and the derived history ends balanced
    fold = fold_surface(repaired)
    assert [e.seq for e in closers if e.type == "tool/result"] == \
        [seq for seq in fold.nodes if seq >= len(prefix)]
    assert [e.seq for e in repaired] == list(range(len(repaired)))
    # a repaired log has no open turn left, so repairing again adds nothing
    assert open_turn_closers(repaired, cause) == ()  # type: ignore[arg-type]
    if closers:
        assert {c.time for c in closers} == {prefix[-1].time}
        assert closers[-1].data["reason"] == {"kind": cause}


def test_forked_closers_follow_the_inherited_end_seed_of_a_fork_cut_point() -> None:
    # docs/rules.md#inherited-events: child seed = prefix + session/end-seed {inherited: true}
    # stamped with the boundary event's time + openTurnClosers(..., forked)
    log = _open_step_with_call(record_call=True)
    boundary = log.events[-1]
    log.add("session/end-seed", {"inherited": True}, time=boundary.time)
    closers = open_turn_closers(log.events, "forked")
    assert [(c.type, c.seq, c.time) for c in closers] == [
        ("tool/result", 5, boundary.time), ("step/end", 6, boundary.time),
        ("turn/end", 7, boundary.time)]
    assert closers[0].source_event_seqs == [3]
    assert check_log([*log.events, *closers]) == []

"""Session: construction, seeds, headers, append.

Rule: docs/rules.md#seeds-and-the-end-seed-marker, docs/rules.md#what-append-refuses,
    docs/rules.md#resume.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import given, settings

from dsh._errors import EventRejectedError, InvariantError
from dsh.json import FrozenDict, FrozenList, thaw
from dsh.session._events import Event
from dsh.session._header import SessionHeader
from dsh.session._session import EventLog, Session
from tests.strategies import (
    StepClock,
    apply_script,
    assistant_data,
    completed_turn,
    examples,
    hostile_json,
    log_scripts,
    non_json,
    request_header_data,
    tool_call_block,
    tool_result_data,
    user_message,
)

pytestmark = pytest.mark.no_speedups


def fresh(clock: StepClock | None = None) -> Session:
    return Session.create("s", clock=clock or StepClock())


def seeded_log() -> list[Any]:
    s = fresh()
    completed_turn(s, 1, call_ids=["c1"])
    return [thaw(e) for e in s.events]


# --- describe Session -----------------------------------------------------------------------


def test_session_exposes_one_stable_readonly_surface_view() -> None:
    # docs/rules.md#what-append-refuses "exposes one stable readonly surface view"
    s = fresh()
    assert s.surface is s.surface
    nodes = s.surface.nodes
    s.append("user/message", user_message(), surface_op="append")
    assert s.surface.nodes is nodes
    assert nodes == [0]
    with pytest.raises(TypeError):
        nodes[0] = 5  # type: ignore[index]


def test_session_derives_message_history_from_the_event_log() -> None:
    # docs/rules.md#what-append-refuses "derives message history from the event log"
    s = fresh()
    s.append("turn/start", {"turn": 1})
    s.append("user/message", user_message("q"), surface_op="append")
    s.append("assistant/chunk", {"turn": 1, "step": 1, "chunk": {
        "type": "text-delta", "index": 0, "text": "x"}})
    s.append("assistant/message", assistant_data(1, 1, [{"type": "text", "text": "x"},
                                                        tool_call_block("c1")]),
             surface_op="append", source_event_seqs=[2])
    s.append("tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "read_file",
                           "arguments": "{}"})
    s.append("tool/result", tool_result_data(1, 1, "c1"), surface_op="append",
             source_event_seqs=[4])
    s.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    messages = s.derive_messages()
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert len(messages[1]["content"]) == 2
    assert messages[2]["content"][0]["type"] == "tool-result"
    assert messages[2]["content"][0]["toolCallId"] == "c1"


def test_session_accepts_and_round_trips_a_max_tokens_turn_end_reason() -> None:
    s = fresh()
    event = s.append("turn/end", {"turn": 1, "reason": {"kind": "max-tokens"}})
    assert thaw(event)["data"]["reason"] == {"kind": "max-tokens"}
    replay = Session.create("s", seed=[thaw(e) for e in s.events])
    assert replay.events[0]["data"]["reason"] == {"kind": "max-tokens"}


def test_session_round_trips_an_aborted_turn_with_its_cancellation_cause() -> None:
    s = fresh()
    s.append("turn/start", {"turn": 1})
    s.append("turn/end", {"turn": 1, "reason": {"kind": "aborted", "reason": {"kind": "user"}}})
    replay = Session.create("s", seed=s.events)
    assert list(replay.events[:2]) == list(s.events)
    assert [e.type for e in replay.events] == ["turn/start", "turn/end", "session/end-seed"]


def test_session_renders_injected_context_and_user_messages_as_plain_user_content() -> None:
    s = fresh()
    injected = user_message("<system-reminder>x</system-reminder>", source={
        "kind": "plugin", "plugin": "notes", "form": "notice", "summary": "x"})
    s.append("user/message", injected, surface_op="append")
    s.append("user/message", user_message("plain"), surface_op="append")
    out = s.derive_messages()
    assert [m["role"] for m in out] == ["user", "user"]
    assert out[0]["content"] == injected["content"]
    assert out[1]["content"] == [{"type": "text", "text": "plain"}]


def test_session_keeps_the_exact_identified_context_message_in_history_and_projection() -> None:
    s = fresh()
    message = user_message("ctx", source={"kind": "plugin", "plugin": "p"})
    event = s.append("user/message", message, surface_op="append")
    assert s.derive_messages() == [message]
    assert event.data["source"] == {"kind": "plugin", "plugin": "p"}


def test_session_replays_identically_from_a_seeded_event_log() -> None:
    original = fresh()
    completed_turn(original, 1, call_ids=["c1", "c2"])
    replay = Session.create("s", seed=original.events)
    assert replay.derive_messages() == original.derive_messages()
    assert list(replay.events[:original.seq]) == list(original.events)
    assert replay.seq == original.seq + 1
    assert replay.first_live_seq == original.seq


def test_session_marks_an_explicitly_empty_seed_without_marking_a_fresh_session() -> None:
    assert fresh().events == ()
    empty = Session.create("s", seed=[])
    assert [(e.type, e.seq, e.data) for e in empty.events] == [("session/end-seed", 0, {})]
    assert empty.first_live_seq == 0
    again = Session.create("s", seed=empty.events)
    assert len(again.events) == 1
    assert again.first_live_seq == 1


def test_session_rejects_pre_provider_request_headers_and_assistant_messages_on_seed() -> None:
    bad_header = {"type": "request/header", "seq": 0, "time": 1,
                  "data": {"header": {"config": {"model": "m"}}, "reason": "initial"}}
    with pytest.raises(EventRejectedError, match="lacks provider/model") as info:
        Session.create("s", seed=[bad_header])
    assert info.value.code == "SHAPE" and info.value.where["seed_index"] == 0
    string_header = {**bad_header, "data": {"header": "x", "reason": "initial"}}
    with pytest.raises(EventRejectedError, match="lacks provider/model"):
        Session.create("s", seed=[string_header])
    bare_assistant = {"type": "assistant/message", "seq": 0, "time": 1,
                      "data": {"turn": 1, "step": 1}, "surfaceOp": "append"}
    with pytest.raises(EventRejectedError, match="lacks an identified message"):
        Session.create("s", seed=[bare_assistant])
    plugin = {"type": "acme/thing", "seq": 0, "time": 1, "data": None}
    assert Session.create("s", seed=[plugin]).events[0] == plugin


def _message_event(kind: str, data: Any) -> dict[str, Any]:
    return {"type": kind, "seq": 0, "time": 1, "data": data, "surfaceOp": "append"}


@pytest.mark.parametrize(("kind", "mutate", "fragment"), [
    ("user/message", lambda d: None, "lacks an identified message"),
    ("user/message", lambda d: {**d, "role": "assistant"}, 'must have role "user"'),
    ("user/message", lambda d: {**d, "source": None}, "message has invalid source"),
    ("user/message", lambda d: {**d, "content": "text"}, "message has invalid content"),
    ("assistant/message", lambda d: {**d, "message": {**d["message"], "source": {"kind": "user"}}},
     "message must have model source"),
    ("tool/result", lambda d: {**d, "message": {**d["message"], "source": {"kind": "user"}}},
     "message must have tool source"),
    ("tool/result", lambda d: {**d, "message": {**d["message"], "content": [
        {"type": "text", "text": "x"}]}}, "must contain one tool-result block"),
    ("tool/result", lambda d: {**d, "message": {**d["message"], "source": {
        "kind": "tool", "callId": "other"}}}, "mismatched tool call ids"),
])
def test_session_rejects_event_specific_malformed_message_shapes_on_seed(
        kind: str, mutate: Any, fragment: str) -> None:
    # docs/rules.md#what-append-refuses "rejects event-specific malformed message shapes on
    # seed/load" (the eight errors)
    base = {"user/message": user_message(), "assistant/message": assistant_data(1, 1, []),
            "tool/result": tool_result_data(1, 1, "c1")}[kind]
    with pytest.raises(EventRejectedError, match=fragment) as info:
        Session.create("s", seed=[_message_event(kind, mutate(base))])
    assert info.value.code == "SHAPE"
    assert info.value.where == {"seed_index": 0, "event_type": kind}


def test_session_snapshots_message_events_without_validating_plugin_owned_details() -> None:
    message = user_message()
    message["content"] = [{"type": "hologram", "payload": [1, 2]}]
    message["source"] = {"kind": "mystery-plugin", "x": 1}
    s = Session.create("s", seed=[_message_event("user/message", message)])
    assert s.derive_messages() == [message]


def test_session_round_trips_a_non_empty_reasoning_effort_and_rejects_invalid_values() -> None:
    def header_event(config: dict[str, Any]) -> dict[str, Any]:
        return {"type": "request/header", "seq": 0, "time": 1,
                "data": {"header": {"config": config}, "reason": "initial"}}

    base = {"provider": "p", "model": "m"}
    s = Session.create("s", seed=[header_event({**base, "reasoningEffort": "high"})])
    assert s.request_header()["config"]["reasoningEffort"] == "high"  # type: ignore[index]
    for bad in ["", 1]:
        with pytest.raises(EventRejectedError, match="invalid reasoningEffort"):
            Session.create("s", seed=[header_event({**base, "reasoningEffort": bad})])


def test_session_round_trips_adapter_default_markers_and_rejects_invalid_values() -> None:
    def header_event(defaults: Any, **config: Any) -> dict[str, Any]:
        return {"type": "request/header", "seq": 0, "time": 1, "data": {"header": {
            "config": {"provider": "p", "model": "m", **config},
            "adapterDefaults": defaults}, "reason": "initial"}}

    ok = Session.create("s", seed=[header_event({"maxTokens": True}, maxTokens=10)])
    assert ok.request_header()["adapterDefaults"] == {"maxTokens": True}  # type: ignore[index]
    Session.create("s", seed=[header_event({})])
    for bad in [None, [], {"unknown": True}, {"maxTokens": False}, {"reasoningEffort": True}]:
        with pytest.raises(EventRejectedError, match="invalid adapterDefaults"):
            Session.create("s", seed=[header_event(bad)])


def test_session_isolates_the_log_from_mutation_through_a_derived_message() -> None:
    # docs/rules.md#what-append-refuses append-only contract: derived messages are frozen; the
    # returned snapshot is immutable, and a list made from it is the caller's.
    s = fresh()
    s.append("user/message", user_message("a"), surface_op="append")
    s.append("user/message", user_message("b"), surface_op="append")
    out = s.derive_messages()
    with pytest.raises(TypeError):
        out[0]["content"][0]["text"] = "changed"
    with pytest.raises(TypeError):
        out[0]["content"].append({"type": "text", "text": "x"})
    with pytest.raises(TypeError):
        out[0] = out[1]  # type: ignore[index]
    assert not hasattr(out, "reverse") and not hasattr(out, "append")
    mine = list(out)
    mine.reverse()
    assert [m["content"][0]["text"] for m in s.derive_messages()] == ["a", "b"]


@settings(max_examples=examples(30), deadline=None)
@given(non_json())
def test_session_rejects_non_json_event_data_at_the_source(value: Any) -> None:
    # docs/rules.md#what-append-refuses "rejects non-JSON-serializable event data at the source
    # (incl. sparse arrays)"
    s = fresh()
    with pytest.raises(EventRejectedError, match="non-JSON-serializable") as info:
        s.append("feedback/record", {"value": value})
    assert info.value.code == "NON_JSON"
    assert s.events == ()


def test_session_rejects_a_cycle_in_event_data() -> None:
    s = fresh()
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(EventRejectedError, match="non-JSON-serializable"):
        s.append("feedback/record", loop)
    assert s.seq == 0


def test_session_rejects_a_surface_eligible_append_with_no_surface_op_marker() -> None:
    s = fresh()
    with pytest.raises(EventRejectedError, match="requires a surfaceOp marker") as info:
        s.append("user/message", user_message())
    assert info.value.code == "SURFACE"
    assert s.events == ()


@settings(max_examples=examples(30), deadline=None)
@given(hostile_json())
def test_session_accepts_dense_arrays_and_nested_plain_objects(value: Any) -> None:
    s = fresh()
    event = s.append("feedback/record", {"value": value, "nested": [[None, True], {"a": [False]}]})
    assert event.data == {"value": value, "nested": [[None, True], {"a": [False]}]}


def test_session_validates_seed_events_rejects_a_non_json_seed() -> None:
    with pytest.raises(EventRejectedError, match="losslessly JSON-serializable") as info:
        Session.create("s", seed=[{"type": "x", "seq": 0, "time": 1, "data": 2**60}])
    assert info.value.code == "NON_JSON" and info.value.where["seed_index"] == 0


def test_session_validates_seed_events_rejects_a_non_contiguous_seq() -> None:
    seed = [{"type": "x", "seq": 0, "time": 1, "data": {}},
            {"type": "x", "seq": 2, "time": 1, "data": {}}]
    with pytest.raises(EventRejectedError, match="contiguous") as info:
        Session.create("s", seed=seed)
    assert info.value.code == "SEQ_NOT_CONTIGUOUS"
    assert "seq 2" in str(info.value) and "expected seq 1" in str(info.value)


def test_session_validates_seed_events_rejects_a_missing_surface_op_marker() -> None:
    seed = [{"type": "user/message", "seq": 0, "time": 1, "data": user_message()}]
    with pytest.raises(EventRejectedError, match=r"invalid seed event at index 0: .*requires a "
                                                 r"surfaceOp marker") as info:
        Session.create("s", seed=seed)
    assert info.value.code == "SURFACE"


def test_session_accepts_a_well_formed_contiguous_serializable_seed() -> None:
    seed = seeded_log()[:3]
    s = Session.create("s", seed=seed)
    assert [thaw(e) for e in s.events[:3]] == seed
    assert s.first_live_seq == 3


def test_session_reads_each_seed_entry_once() -> None:
    # docs/rules.md#what-append-refuses [JS-mechanics] "reads each seed array entry once": a
    # one-shot iterator works, and a generator's values are consumed exactly once.
    reads = []

    def gen() -> Any:
        for event in seeded_log()[:2]:
            reads.append(event["seq"])
            yield event

    s = Session.create("s", seed=gen())
    assert reads == [0, 1] and s.first_live_seq == 2


def test_session_rejects_non_json_or_exotic_surface_metadata_in_a_seed() -> None:
    seed = seeded_log()[:3]
    seed[2] = {**seed[2], "surfaceOp": {"op": "replace", "start": 2**60, "end": 0}}
    with pytest.raises(EventRejectedError, match="losslessly JSON-serializable"):
        Session.create("s", seed=seed)
    seed[2] = {**seed[2], "surfaceOp": object()}
    with pytest.raises(EventRejectedError, match="losslessly JSON-serializable"):
        Session.create("s", seed=seed)


def test_session_rejects_an_exotic_seed_event_shell() -> None:
    class Shell(dict[str, Any]):
        pass

    with pytest.raises(EventRejectedError, match="not losslessly JSON-serializable"):
        Session.create("s", seed=[Shell(type="x", seq=0, time=1, data={})])
    with pytest.raises(EventRejectedError, match="invalid event envelope"):
        Session.create("s", seed=[["not", "an", "object"]])


def test_session_adds_seed_context_when_surface_validation_fails() -> None:
    seed = seeded_log()[:3]
    seed.append({"type": "user/message", "seq": 3, "time": 1, "data": user_message(),
                 "surfaceOp": {"op": "replace", "start": 42, "end": 42},
                 "sourceEventSeqs": [2]})
    with pytest.raises(EventRejectedError) as info:
        Session.create("s", seed=seed)
    assert str(info.value) == ("invalid seed event at index 3: surface replace: start seq 42 not "
                               "found in surface (event at seq 3)")
    assert info.value.where == {"seed_index": 3, "event_type": "user/message"}


def test_session_snapshots_the_seed_so_later_caller_mutation_is_invisible() -> None:
    seed = seeded_log()
    s = Session.create("s", seed=seed)
    seed[0]["data"]["turn"] = 99
    seed[0]["data"]["bad"] = 2**60
    assert s.events[0]["data"] == {"turn": 1}


def test_session_snapshots_append_data_so_later_caller_mutation_is_invisible() -> None:
    s = fresh()
    data: dict[str, Any] = {"todos": [{"content": "a", "status": "pending"}]}
    event = s.append("todo/write", data)
    data["todos"].append({"content": "b"})
    data["todos"][0]["status"] = "completed"
    assert event.data == {"todos": [{"content": "a", "status": "pending"}]}
    assert s.events[0] is event


def test_session_rejects_non_json_surface_metadata_before_appending() -> None:
    s = fresh()
    s.append("user/message", user_message(), surface_op="append")
    for op in [{"op": "replace", "start": 2**60, "end": 0}, object(), ("append",)]:
        with pytest.raises(EventRejectedError, match="non-JSON-serializable surface metadata"):
            s.append("user/message", user_message(), surface_op=op, source_event_seqs=[0])
    with pytest.raises(EventRejectedError, match="non-JSON-serializable surface metadata"):
        s.append("user/message", user_message(), surface_op="append",
                 source_event_seqs=(0,))
    assert s.seq == 1


@pytest.mark.parametrize(("op", "sources", "fragment"), [
    ("invalid", None, "carries an invalid surfaceOp"),
    ({"op": "replace", "start": -1, "end": 0}, [0], "invalid replace surfaceOp"),
    ({"op": "replace", "start": 0, "end": 0, "x": 1}, [0], "invalid replace surfaceOp"),
    ({"op": "splice", "start": 0, "end": 0}, [0], "invalid replace surfaceOp"),
    ("append", [0, -1], "non-negative safe integers"),
])
def test_session_rejects_invalid_plain_surface_metadata_shapes_at_append(
        op: Any, sources: Any, fragment: str) -> None:
    s = fresh()
    s.append("user/message", user_message(), surface_op="append")
    with pytest.raises(EventRejectedError, match=fragment):
        s.append("user/message", user_message(), surface_op=op, source_event_seqs=sources)
    assert s.seq == 1


def test_session_rejects_surface_metadata_on_non_surface_append_and_seed_events() -> None:
    s = fresh()
    with pytest.raises(EventRejectedError, match="cannot carry surfaceOp"):
        s.append("turn/start", {"turn": 1}, surface_op="append")
    with pytest.raises(EventRejectedError, match=r"invalid seed event at index 0: .*cannot carry "
                                                 r"surfaceOp"):
        Session.create("s", seed=[{"type": "turn/start", "seq": 0, "time": 1,
                                   "data": {"turn": 1}, "surfaceOp": "append"}])


def test_session_deep_freezes_seeded_and_appended_event_snapshots() -> None:
    s = Session.create("s", seed=seeded_log())
    event = s.append("todo/write", {"todos": [{"content": "a", "status": "pending"}]})
    for e in (s.events[2], event):
        assert isinstance(e, Event)
        with pytest.raises(TypeError):
            e["seq"] = 5  # type: ignore[index]
        with pytest.raises(TypeError):
            e["data"]["x"] = 1
    with pytest.raises(TypeError):
        event["data"]["todos"].append(1)
    with pytest.raises(TypeError):
        event["data"]["todos"][0]["status"] = "x"


def test_session_restores_deeply_nested_frozen_event_data_without_copying() -> None:
    # docs/rules.md#what-append-refuses "iteratively freezes deeply nested restored event data":
    # 20,000 levels.
    from dsh.json import dumps, loads

    deep: Any = "leaf"
    for _ in range(20_000):
        deep = [deep]
    event = Event(loads(dumps({"type": "acme/deep", "seq": 0, "time": 1, "data": deep})))
    header = {"version": 0, "id": "s", "createdAt": 1}
    s = Session.restore("s", [event], header)
    assert s.events[0] is event
    inner = s.events[0]["data"]
    for _ in range(20_000):
        assert isinstance(inner, FrozenList)
        inner = inner[0]
    assert inner == "leaf"


def test_session_returns_cached_event_snapshots_that_do_not_grow_after_append() -> None:
    # docs/rules.md#the-log: a held `events` snapshot never grows; ours is an O(1) view, not a copy.
    s = fresh()
    s.append("turn/start", {"turn": 1})
    first = s.events
    assert s.events is first and isinstance(first, EventLog)
    s.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    assert len(first) == 1 and len(s.events) == 2 and s.events is not first
    assert list(first) == [s.events[0]] and first[-1] is s.events[0]
    assert first == (s.events[0],) and first[0:5] == (s.events[0],)
    with pytest.raises(IndexError):
        first[1]


def test_session_detaches_and_freezes_an_explicitly_supplied_header() -> None:
    header: dict[str, Any] = {"version": 0, "id": "s", "createdAt": 5, "cwd": "/w"}
    s = Session.create("s", header=header)
    header["cwd"] = "/elsewhere"
    assert isinstance(s.header, SessionHeader)
    assert s.header == {"version": 0, "id": "s", "createdAt": 5, "cwd": "/w"}
    assert s.header.cwd == "/w" and s.header.created_at == 5 and s.id == s.header.id == "s"
    with pytest.raises(TypeError):
        s.header["cwd"] = "/x"  # type: ignore[index]


def test_session_rejects_an_exotic_non_json_or_mismatched_supplied_header() -> None:
    class Header(dict[str, Any]):
        pass

    exotic = Header(version=0, id="s", createdAt=1)
    with pytest.raises(EventRejectedError, match="not losslessly JSON-serializable"):
        Session.create("s", header=exotic)
    with pytest.raises(EventRejectedError, match="not a plain JSON record"):
        Session.restore("s", [], exotic)
    for bad in [None, 1, []]:
        with pytest.raises(EventRejectedError, match="not a plain JSON record"):
            Session.restore("s", [], bad)  # type: ignore[arg-type]
    with pytest.raises(EventRejectedError, match="not losslessly JSON-serializable"):
        Session.create("s", header={"version": 0, "id": "s", "createdAt": 1,
                                    "parentSession": 2**60})
    with pytest.raises(EventRejectedError, match="does not match session id") as info:
        Session.create("s", header={"version": 0, "id": "t", "createdAt": 1})
    assert info.value.code == "HEADER"


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("version", 1, "header version"),
    ("version", False, "header version"),
    ("createdAt", "1", "createdAt must be a non-negative safe integer"),
    ("createdAt", 1.5, "createdAt must be a non-negative safe integer"),
    ("createdAt", -1, "createdAt must be a non-negative safe integer"),
    ("cwd", 3, "cwd must be a string"),
    ("cwd", "relative/path", "cwd must be an absolute path"),
    ("parentSession", 3, "parentSession must be a string"),
    ("seedLength", -1, "seedLength must be a non-negative safe integer"),
    ("seedLength", 1.5, "seedLength must be a non-negative safe integer"),
    ("seedLength", True, "seedLength must be a non-negative safe integer"),
    ("origin", "fork", 'origin must be "subagent"'),
    ("delegationDepth", -2, "delegationDepth must be a non-negative safe integer"),
    ("agentPreset", 7, "agentPreset must be a string"),
])
def test_session_rejects_invalid_scalar_fields_in_a_supplied_header(
        field: str, value: Any, fragment: str) -> None:
    header = {"version": 0, "id": "s", "createdAt": 1, field: value}
    with pytest.raises(EventRejectedError, match=fragment) as info:
        Session.create("s", header=header)
    assert info.value.code == "HEADER"


def test_session_validates_the_header_before_the_seed_in_restore_mode_only() -> None:
    # docs/formats.md#the-session-header timing: restore validates the header first; snapshot
    # validates it after the seed.
    bad_seed = [{"type": "x", "seq": 5, "time": 1, "data": {}}]
    bad_header = {"version": 1, "id": "s", "createdAt": 1}
    with pytest.raises(EventRejectedError) as snap:
        Session.create("s", seed=bad_seed, header=bad_header)
    assert snap.value.code == "SEQ_NOT_CONTIGUOUS"
    with pytest.raises(EventRejectedError) as restored:
        Session.restore("s", [Event(bad_seed[0])], bad_header)
    assert restored.value.code == "HEADER"


@pytest.mark.parametrize(("patch", "fragment"), [
    ({"extra": 1}, "unknown key"),
    ({"type": 5}, "type must be a string"),
    ({"seq": "0"}, "seq must be a non-negative safe integer"),
    ({"seq": 0.5}, "seq must be a non-negative safe integer"),
    ({"seq": -1}, "seq must be a non-negative safe integer"),
    ({"time": "1"}, "time must be a safe integer"),
    ({"time": 1.5}, "time must be a safe integer"),
    ({"ignorable": False}, "ignorable must be true"),
    ({"ignorable": "yes"}, "ignorable must be true"),
])
def test_session_rejects_seed_records_with_invalid_fixed_envelope_fields(
        patch: dict[str, Any], fragment: str) -> None:
    record = {"type": "acme/x", "seq": 0, "time": 1, "data": {}, **patch}
    with pytest.raises(EventRejectedError, match=f"invalid event envelope: {fragment}") as info:
        Session.create("s", seed=[record])
    assert info.value.code == "ENVELOPE"
    missing = {"type": "acme/x", "seq": 0, "time": 1}
    with pytest.raises(EventRejectedError, match="data is missing"):
        Session.create("s", seed=[missing])
    ok = Session.create("s", seed=[{"type": "acme/x", "seq": 0, "time": 1, "data": {},
                                    "ignorable": True}])
    assert ok.events[0].ignorable is True


def test_session_restore_refuses_items_that_are_not_events() -> None:
    header = {"version": 0, "id": "s", "createdAt": 1}
    with pytest.raises(EventRejectedError, match="restore takes frozen Event objects"):
        Session.restore("s", [{"type": "x", "seq": 0, "time": 1, "data": {}}], header)


def test_session_restore_keeps_events_by_identity_and_appends_a_plain_end_seed() -> None:
    # docs/rules.md#resume: fromRestore validates without copying; a seed not ending with end-seed
    # gets {}.
    source = fresh()
    completed_turn(source, 1)
    events = source.events
    header = {"version": 0, "id": "s", "createdAt": 1}
    restored = Session.restore("s", events, header, clock=StepClock(10**13))
    assert all(a is b for a, b in zip(restored.events, events, strict=False))
    assert restored.events[-1].type == "session/end-seed"
    assert restored.events[-1].data == {}
    assert restored.first_live_seq == len(events)
    again = Session.restore("s", restored.events, header)
    assert again.seq == restored.seq


def test_session_bare_create_synthesizes_a_current_version_header() -> None:
    s = Session.create("bare", clock=StepClock(123))
    assert s.header == {"version": 0, "id": "bare", "createdAt": 123}
    assert s.header.cwd is None and s.header.parent_session is None


def test_session_time_is_integer_ms_and_never_decreases() -> None:
    times = iter([50, 40, 60.9, 10])
    header = {"version": 0, "id": "s", "createdAt": 1}
    s = Session.create("s", header=header, clock=lambda: next(times))  # type: ignore[arg-type]
    stamped = [s.append("session/title", {}).time for _ in range(4)]
    assert stamped == [50, 50, 60, 60]
    restored = Session.create("s", seed=s.events, clock=lambda: 1)
    assert restored.events[-1].time == 60


def test_session_append_returns_events_in_wire_key_order() -> None:
    s = fresh(StepClock(7))
    s.append("user/message", user_message(), surface_op="append")
    event = s.append("user/message", user_message(), surface_op="append",
                     source_event_seqs=[0])
    assert list(event) == ["type", "seq", "time", "data", "sourceEventSeqs", "surfaceOp"]
    assert list(s.append("session/title", None)) == ["type", "seq", "time", "data"]


def test_session_request_header_delta_and_fallback_are_refused_as_legacy() -> None:
    s = fresh()
    with pytest.raises(EventRejectedError, match="request/header-delta") as info:
        s.append("request/header-delta", {})
    assert info.value.code == "LEGACY"
    with pytest.raises(EventRejectedError, match='reason "fallback"'):
        s.append("request/header", {**request_header_data(), "reason": "fallback"})
    assert s.seq == 0


# --- observers and reentrancy (docs/rules.md#what-append-refuses) ---------------------------------


def test_session_observers_see_committed_events_and_failures_are_contained(
        caplog: pytest.LogCaptureFixture) -> None:
    s = fresh()
    seen: list[tuple[int, int]] = []

    def failing(session: Session, event: Event) -> None:
        raise RuntimeError("observer broke")

    s.observe(lambda session, event: seen.append((event.seq, session.seq)))
    s.observe(failing)
    s.observe(lambda session, event: seen.append((event.seq, -1)))
    with caplog.at_level(logging.ERROR, logger="dsh.session._session"):
        event = s.append("session/title", {})
    assert event.seq == 0
    assert seen == [(0, 1), (0, -1)]
    assert "observer" in caplog.text and "observer broke" in caplog.text


def test_session_contains_a_reentrant_observer_append_without_reordering(
        caplog: pytest.LogCaptureFixture) -> None:
    s = fresh()
    later: list[int] = []
    s.observe(lambda session, event: session.append("plan/mode", {}))
    s.observe(lambda session, event: later.append(event.seq))
    with caplog.at_level(logging.ERROR, logger="dsh.session._session"):
        s.append("goal/change", {})
    assert [e.type for e in s.events] == ["goal/change"]
    assert later == [0]
    assert "session append cannot reenter while another append is being published" in caplog.text


def test_session_unsubscribed_observers_are_not_called() -> None:
    s = fresh()
    seen: list[int] = []
    stop = s.observe(lambda session, event: seen.append(event.seq))
    s.append("session/title", {})
    stop()
    s.append("session/title", {})
    assert seen == [0]


def test_session_batch_publishes_its_appends_together_when_the_block_ends() -> None:
    # docs/rules.md#live-sessions: a batch observer is told once, a plain one per event
    s = fresh()
    plain: list[tuple[int, int]] = []
    batches: list[list[int]] = []
    s.observe(lambda session, event: plain.append((event.seq, session.seq)))
    s.observe(lambda session, event: plain.append((event.seq, -1)),
              batch=lambda session, events: batches.append([e.seq for e in events]))
    with s.batch():
        first = s.append("session/title", {})
        with s.batch():  # nested: published with the outer block
            s.append("plan/mode", {})
        assert first.seq == 0 and s.seq == 2 and plain == [] and batches == []
        s.append("goal/change", {})
    assert plain == [(0, 3), (1, 3), (2, 3)]
    assert batches == [[0, 1, 2]]
    s.append("session/title", {})  # outside a block: one event at a time again
    assert plain[-2:] == [(3, 4), (3, -1)] and batches == [[0, 1, 2]]


def test_session_batch_refuses_as_one_by_one_and_publishes_what_was_committed() -> None:
    # docs/rules.md#what-append-refuses: the same typed error mid-batch, nothing of the refused
    # event committed; the events before it are committed (as without a batch) and published
    s = fresh()
    seen: list[int] = []
    s.observe(lambda session, event: None,
              batch=lambda session, events: seen.extend(e.seq for e in events))
    with pytest.raises(EventRejectedError) as info, s.batch():
        s.append("session/title", {})
        s.append("user/message", {"role": "user", "content": [], "source": {"kind": "user"}},
                 surface_op="append")  # no message id: SHAPE
    assert info.value.code == "SHAPE" and info.value.where["seq"] == 1
    assert [e.type for e in s.events] == ["session/title"] and seen == [0]


def test_session_batch_publication_refuses_a_reentrant_append(
        caplog: pytest.LogCaptureFixture) -> None:
    s = fresh()
    s.observe(lambda session, event: None,
              batch=lambda session, events: session.append("plan/mode", {}))
    with caplog.at_level(logging.ERROR, logger="dsh.session._session"), s.batch():
        s.append("goal/change", {})
        s.append("goal/change", {})
    assert [e.type for e in s.events] == ["goal/change", "goal/change"]
    assert "session append cannot reenter while another append is being published" in caplog.text


def test_session_runs_validation_on_one_frozen_candidate_before_commit_and_resets() -> None:
    # docs/rules.md#what-append-refuses "runs internal dispatch validation on one frozen candidate
    # before commit"
    s = fresh()
    seen: list[tuple[int, int]] = []
    veto = [True]

    def validator(session: Session, candidate: Event) -> None:
        seen.append((candidate.seq, session.seq))
        with pytest.raises(TypeError):
            candidate["seq"] = 9  # type: ignore[index]
        if veto[0]:
            raise ValueError("vetoed")

    observed: list[int] = []
    s.add_validator(validator)
    s.observe(lambda session, event: observed.append(event.seq))
    with pytest.raises(ValueError, match="vetoed"):
        s.append("session/title", {})
    assert s.events == () and observed == []
    veto[0] = False
    assert s.append("session/title", {}).seq == 0
    assert seen == [(0, 0), (0, 0)] and observed == [0]


def test_session_does_not_apply_a_surface_transition_rejected_by_validation() -> None:
    s = fresh()
    s.append("feedback/record", {})
    s.append("hook/invoked", {})
    s.append("user/message", user_message(), surface_op="append")
    remove = s.add_validator(lambda session, event: (_ for _ in ()).throw(ValueError("no")))
    with pytest.raises(ValueError):
        s.append("user/message", user_message(), surface_op={"op": "replace", "start": 2,
                                                              "end": 2}, source_event_seqs=[2])
    assert s.surface.nodes == [2] and s.surface.replace_generation == 0
    remove()
    s.append("user/message", user_message(), surface_op="append")
    assert s.surface.nodes == [2, 3]


# --- seeded-session contract (docs/rules.md#resume) -----------------------------------------------


def _fork_like_seed(prefix_len: int = 3) -> list[Any]:
    prefix = seeded_log()[:prefix_len]
    marker = {"type": "session/end-seed", "seq": prefix_len, "time": 1,
              "data": {"inherited": True}}
    return [*prefix, marker]


def test_session_seeded_header_requires_an_explicit_seed() -> None:
    header = {"version": 0, "id": "s", "createdAt": 1, "parentSession": "p", "seedLength": 3}
    with pytest.raises(EventRejectedError, match="requires an explicit constructor seed") as info:
        Session.create("s", header=header, inherited_event_count=3)
    assert info.value.code == "SEED"


def test_session_seeded_header_requires_inherited_count_equal_to_seed_length() -> None:
    header = {"version": 0, "id": "s", "createdAt": 1, "parentSession": "p", "seedLength": 3}
    with pytest.raises(EventRejectedError, match=r"inherited event count equal to header "
                                                 r"seedLength 3 .found 0"):
        Session.create("s", seed=_fork_like_seed(), header=header)
    child = Session.create("s", seed=_fork_like_seed(), header=header, inherited_event_count=3)
    assert child.inherited_event_count == 3 and child.first_live_seq == 4


def test_session_unseeded_header_requires_inherited_count_zero() -> None:
    with pytest.raises(EventRejectedError, match=r"inherited event count must be 0 .found 2"):
        Session.create("s", seed=seeded_log(), inherited_event_count=2)
    with pytest.raises(EventRejectedError, match="non-negative safe integer"):
        Session.create("s", seed=[], inherited_event_count=-1)


def test_session_allows_at_most_one_inherited_end_seed_after_the_cut() -> None:
    header = {"version": 0, "id": "s", "createdAt": 1, "parentSession": "p", "seedLength": 3}
    seed = _fork_like_seed()
    seed.append({"type": "session/end-seed", "seq": 4, "time": 1, "data": {"inherited": True}})
    with pytest.raises(EventRejectedError, match=r"2 session/end-seed .inherited: true. markers "
                                                 r"after the cut at 3") as info:
        Session.create("s", seed=seed, header=header, inherited_event_count=3)
    assert info.value.code == "SEED"
    # an inherited marker before the cut (a fork of a fork) does not count
    grand = {**header, "seedLength": 5}
    Session.create("s", seed=[*seed[:4], {**seed[4], "data": {}},
                              {"type": "session/end-seed", "seq": 5, "time": 1,
                               "data": {"inherited": True}}],
                   header=grand, inherited_event_count=5)


def test_session_inherited_count_cannot_exceed_the_seed() -> None:
    header = {"version": 0, "id": "s", "createdAt": 1, "parentSession": "p", "seedLength": 9}
    with pytest.raises(EventRejectedError, match="exceeds the seed length"):
        Session.create("s", seed=_fork_like_seed(), header=header, inherited_event_count=9)


# --- todo/write -----------------------------------------------------------------------------


def test_todo_write_appends_the_whole_list_snapshot_and_isolates_the_log() -> None:
    s = fresh()
    todos = [{"content": "a", "status": "pending"}]
    event = s.append("todo/write", {"todos": todos})
    todos[0]["status"] = "completed"
    assert event.data == {"todos": [{"content": "a", "status": "pending"}]}


def test_todo_write_is_last_write_wins() -> None:
    s = fresh()
    s.append("todo/write", {"todos": [{"content": "a", "status": "pending"}]})
    s.append("todo/write", {"todos": [{"content": "b", "status": "in_progress"}]})
    last = [e for e in s.events if e.type == "todo/write"][-1]
    assert last.data["todos"] == [{"content": "b", "status": "in_progress"}]


def test_todo_write_is_not_a_surface_event() -> None:
    s = fresh()
    s.append("todo/write", {"todos": []})
    assert s.surface.nodes == [] and s.derive_messages() == []
    assert s.derive_event_message(s.events[0]) is None


def test_todo_write_round_trips_through_a_seeded_replay() -> None:
    s = fresh()
    s.append("todo/write", {"todos": [{"content": "a", "status": "completed"}]})
    replay = Session.create("s", seed=s.events)
    assert list(replay.events[:1]) == list(s.events)
    assert replay.events[1].type == "session/end-seed"
    assert replay.first_live_seq == 1


# --- properties (docs/rules.md#the-log, shared with the store tests) ------------------------------


@settings(max_examples=examples(25), deadline=None)
@given(log_scripts(open_tail=None))
def test_session_seq_is_zero_based_contiguous_and_replay_reproduces_derivation(
        script: Any) -> None:
    s = apply_script(fresh(), script)
    assert [e.seq for e in s.events] == list(range(s.seq))
    replay = Session.create("s", seed=s.events)
    assert replay.derive_messages() == s.derive_messages()
    assert replay.seq == s.seq + 1
    for message in s.derive_messages():
        assert message["role"] in ("user", "assistant", "system")
        assert isinstance(message, FrozenDict)
    twice = Session.create("s", seed=replay.events)
    assert twice.seq == replay.seq


@pytest.mark.parametrize(("path", "platform", "expected"), [
    ("/work", "linux", True), ("work", "linux", False), ("C:\\work", "linux", False),
    ("C:\\work", "win32", True), ("C:/work", "win32", True), ("\\\\server\\share", "win32", True),
    ("/work", "win32", True), ("C:work", "win32", False), ("work", "win32", False),
])
def test_header_cwd_uses_nodes_is_absolute_rule(path: str, platform: str,
                                                expected: bool) -> None:
    # docs/formats.md#the-session-header: Node's path.isAbsolute, not os.path.isabs (they differ on
    # Windows).
    from dsh.session._header import is_absolute_path

    assert is_absolute_path(path, platform=platform) is expected


def test_session_constructor_is_snapshot_mode_create() -> None:
    seed = seeded_log()
    direct = Session("s", seed=seed, clock=StepClock())
    assert [thaw(e) for e in direct.events[:len(seed)]] == seed
    assert direct.events[0] is not seed[0]


def test_session_append_refuses_core_events_a_reader_would_refuse() -> None:
    # Deviation from dsh (README design notes): append shape-checks the core types, because a
    # log holding them would be refused on load (adversarial report: resume wrote turn/end
    # {turn: 0} that no reader accepts). Nothing is committed on refusal.
    s = fresh()
    bad = [("turn/start", {"turn": 0}, {}), ("turn/start", {"turn": "1"}, {}),
           ("step/start", {"turn": 1}, {}),
           ("turn/end", {"turn": 1, "kind": "completed"}, {}),
           ("turn/end", {"turn": 1, "reason": {"kind": "completed", "x": 1}}, {}),
           ("user/message", {"role": "user", "content": [], "source": {"kind": "user"}},
            {"surface_op": "append"}),
           ("assistant/message", {}, {"surface_op": "append"}),
           ("steering/message", {"turn": 1}, {})]
    for etype, data, options in bad:
        with pytest.raises(EventRejectedError) as info:
            s.append(etype, data, **options)
        assert info.value.code == "SHAPE" and info.value.where["seq"] == 0, etype
    assert s.seq == 0


def test_session_append_marks_custom_events_ignorable() -> None:
    s = fresh()
    event = s.append("acme/note", {"text": "hi"}, ignorable=True)
    assert event.ignorable and event == {"type": "acme/note", "seq": 0, "time": event.time,
                                         "data": {"text": "hi"}, "ignorable": True}


def test_session_snapshot_seed_refuses_turn_events_no_reader_accepts() -> None:
    # Imports seed in snapshot mode; the same turn/step shape rules as append apply there.
    seed = [{"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 0}}]
    with pytest.raises(EventRejectedError) as info:
        Session.create("s", seed=seed)
    assert info.value.code == "SHAPE" and info.value.where["seed_index"] == 0


def test_session_batch_validators_see_the_blocks_earlier_appends() -> None:
    # docs/rules.md#live-sessions: "an event sees the ones appended before it" also for a
    # validator fed by an observer (InvariantObserver, the compaction brackets): the block's
    # pending events are published before such a validator runs. Before, the turn/end was
    # refused ("does not match open turn null") and an invalid one could pass.
    from dsh.session import InvariantObserver

    s = fresh()
    InvariantObserver().attach(s)
    with s.batch():
        s.append("turn/start", {"turn": 1})
        s.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        with pytest.raises(InvariantError):
            s.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    assert [e.type for e in s.events] == ["turn/start", "turn/end"]

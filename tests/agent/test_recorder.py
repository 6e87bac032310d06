"""The recorder: the one writing path of turns, steps, messages and tool calls.

Rule: docs/agent.md#the-recorder.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh._verify import verify_events
from dsh.agent import ABORTED_BEFORE_DISPATCH, AgentError, Recorder
from dsh.session import Session, SessionStore

pytestmark = pytest.mark.no_speedups

CONFIG = {"provider": "scripted", "model": "m1"}
CALL = {"type": "tool-call", "id": "c1", "name": "ls", "arguments": '{"path":"src"}'}


def _types(session: Session, start: int = 0) -> list[str]:
    return [e["type"] for e in session.events[start:]]


def _one_tool_turn(recorder: Recorder) -> None:
    with recorder.turn() as t, t.step() as s:
        s.user_message("What is in src/?")
        s.request(CONFIG, system="Be brief.")
        s.chunk({"type": "text-delta", "index": 0, "text": "Looking"})
        s.assistant([{"type": "text", "text": "Looking"}, CALL])
        s.tool_call("c1")
        s.tool_result("c1", "main.py")


def test_recorded_turn_has_dsh_event_order_and_verifies() -> None:
    session = SessionStore().create("s1")
    recorder = Recorder(session)
    _one_tool_turn(recorder)
    assert _types(session) == ["turn/start", "step/start", "user/message", "request/header",
                               "request/context", "assistant/chunk", "assistant/message",
                               "tool/call", "tool/result", "step/end", "turn/end"]
    events = session.events
    assert events[3]["data"]["reason"] == "initial"
    assert events[4]["data"] == {"provider": "scripted", "model": "m1"}
    assert events[6]["sourceEventSeqs"] == [5]
    assert events[6]["data"]["message"]["source"] == {"kind": "model", "provider": "scripted",
                                                      "model": "m1"}
    assert events[7]["data"] == {"turn": 1, "step": 1, "callId": "c1", "name": "ls",
                                 "arguments": '{"path":"src"}'}
    assert events[8]["sourceEventSeqs"] == [7]
    assert events[10]["data"] == {"turn": 1, "reason": {"kind": "completed"}}
    assert verify_events(session.events) == []
    assert [m["role"] for m in session.derive_messages()] == ["user", "assistant", "user"]


def test_turn_numbering_continues_across_a_resume(tmp_path: Path) -> None:
    url = f"jsonl://{tmp_path}"
    with dsh.open(url) as store:
        _one_tool_turn(store.recorder("s1"))
    with dsh.open(url) as store:
        recorder = store.recorder("s1")
        session = recorder.session
        assert recorder.next_turn == 2
        start = session.seq
        with recorder.turn() as t, t.step() as s:
            s.user_message("again")
            s.request(CONFIG, system="Be brief.")
            s.assistant("done")
        assert session.events[start]["data"] == {"turn": 2}
        header = next(e for e in session.events[start:] if e["type"] == "request/header")
        assert header["data"]["reason"] == "resume"
        # the context did not change, so it is not logged again
        assert "request/context" not in _types(session, start)
    with dsh.open(url) as store:
        inspection = store.inspect("s1")
        assert verify_events(inspection.stored_events, header=inspection.header) == []


def test_header_is_logged_again_only_on_change() -> None:
    session = SessionStore().create("s1")
    recorder = Recorder(session)
    with recorder.turn() as t:
        for system in ("A", "A", "B"):
            with t.step() as s:
                s.request(CONFIG, system=system, context_window=100)
                s.assistant("ok")
    headers = [e["data"] for e in session.events if e["type"] == "request/header"]
    assert [(h["reason"], h["header"]["system"]) for h in headers] == [("initial", "A"),
                                                                        ("change", "B")]
    assert _types(session).count("request/context") == 1


def test_retry_discards_failed_attempt_chunks() -> None:
    session = SessionStore().create("s1")
    with Recorder(session).turn() as t, t.step() as s:
        s.request(CONFIG)
        s.chunk({"type": "text-delta", "index": 0, "text": "x"})
        s.discard_attempt()
        second = s.chunk({"type": "text-delta", "index": 0, "text": "y"})
        message = s.assistant("y")
    assert message["sourceEventSeqs"] == [second["seq"]]


@pytest.mark.parametrize("misuse, match", [
    (lambda s: s.tool_result("c1", "x"), "not recorded"),
    (lambda s: s.tool_call("nope"), "made no tool call 'nope'"),
    (lambda s: (s.tool_call("c1"), s.tool_call("c1")), "already recorded"),
    (lambda s: (s.tool_call("c1"), s.tool_result("c1", "a"), s.tool_result("c1", "b")),
     "already answered"),
    (lambda s: s.assistant("again"), "already has its assistant message"),
    (lambda s: s.user_message("steer"), "between tool calls and their results"),
    (lambda s: s.chunk({"type": "text-delta", "index": 0, "text": "late"}), "chunks after"),
])
def test_misuse_is_refused_and_the_log_stays_well_formed(misuse: Any, match: str) -> None:
    session = SessionStore().create("s1")
    recorder = Recorder(session)
    with pytest.raises(AgentError, match=match) as info, recorder.turn() as t, t.step() as s:
        s.request(CONFIG)
        s.assistant([CALL])
        misuse(s)
    assert info.value.code == "RECORDER"
    assert _types(session)[-2:] == ["step/end", "turn/end"]
    assert session.events[-1]["data"]["reason"]["kind"] == "error"
    assert verify_events(session.events) == []


def test_unanswered_calls_are_balanced_then_reported() -> None:
    session = SessionStore().create("s1")
    second = {**CALL, "id": "c2"}
    with pytest.raises(AgentError, match=r"unanswered tool calls \['c1', 'c2'\]"), \
            Recorder(session).turn() as t, t.step() as s:
        s.request(CONFIG)
        s.assistant([CALL, second])
        s.tool_call("c1")
    results = [e for e in session.events if e["type"] == "tool/result"]
    assert [r["data"]["error"]["code"] for r in results] == ["TOOL_OUTCOME_UNKNOWN",
                                                             ABORTED_BEFORE_DISPATCH]
    assert "Never retry blindly." in results[0]["data"]["message"]["content"][0]["content"][0][
        "text"]
    assert verify_events(session.events) == []


def test_turn_end_reason_follows_the_exception() -> None:
    session = SessionStore().create("s1")
    recorder = Recorder(session)
    with pytest.raises(ValueError), recorder.turn():
        raise ValueError("boom")
    reason = session.events[-1]["data"]["reason"]
    assert reason["kind"] == "error" and reason["error"]["code"] == "UNKNOWN"
    assert "ValueError: boom" in reason["error"]["message"]
    with pytest.raises(asyncio.CancelledError), recorder.turn():
        raise asyncio.CancelledError
    assert session.events[-1]["data"] == {"turn": 2, "reason": {"kind": "aborted",
                                                                "reason": {"kind": "user"}}}
    with recorder.turn() as t:
        t.reason = {"kind": "max-tokens"}
    assert session.events[-1]["data"] == {"turn": 3, "reason": {"kind": "max-tokens"}}


def test_structural_refusals() -> None:
    session = SessionStore().create("s1")
    recorder = Recorder(session)
    turn = recorder.turn()
    with pytest.raises(AgentError, match="still open"):
        recorder.turn()
    with pytest.raises(AgentError, match="belongs to a step"):
        recorder.user_message("hi")
    turn.step()
    with pytest.raises(AgentError, match="step 1 is still open"):
        turn.step()
    turn.end()
    with pytest.raises(AgentError, match="has ended"):
        turn.step()
    assert _types(session) == ["turn/start", "step/start", "step/end", "turn/end"]
    open_session = SessionStore().create("s2")
    open_session.append("turn/start", {"turn": 1})
    with pytest.raises(AgentError, match="open turn 1"):
        Recorder(open_session)


def test_custom_events_are_ignorable_and_core_types_refused() -> None:
    session = SessionStore().create("s1")
    recorder = Recorder(session)
    event = recorder.custom("myapp/note", {"text": "x"})
    assert event["ignorable"] is True
    for reserved in ("turn/start", "tool/result", "llm/retry", ""):
        with pytest.raises(AgentError, match="dsh's own"):
            recorder.custom(reserved, {})
    assert session.seq == 1


def test_turn_end_flushes_to_the_store(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    with dsh.open(url) as store:
        _one_tool_turn(store.recorder("s1"))
        # read through a second handle while the writer is still open: the turn is on disk
        stored = store.read("s1").stored_events
        assert [e["type"] for e in stored][-1] == "turn/end"

"""DshSaver: a call answered by a checkpoint's pending writes gets one answer, resumed or not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.base")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph.message import add_messages

from dsh.adapters.langgraph import DshSaver


def test_a_call_the_pending_writes_answer_is_answered_once_either_way(tmp_path: Path) -> None:
    """A process dies after a tools task's writes are stored and before LangGraph puts the
    next checkpoint. A resume (``invoke(None)``) applies those writes; a run given new input
    discards them. So the latest checkpoint's messages carry the result and the pending
    write carries the same id, which ``add_messages`` replaces in place: one answer either way
    (docs/adapters.md). Before: the messages lacked it and a new input sent the model a call
    with no answer (tests/adapters/test_kill_runs.py 'between calls', under load); before
    that, a resume sent it twice."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    call = {"id": "c1", "name": "read_file", "args": {"path": "app.toml"}}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"messages": [
        HumanMessage("Read app.toml", id="h1"), AIMessage("", tool_calls=[call], id="a1")]}
    checkpoint["channel_versions"] = {"messages": 1}
    with DshSaver.from_url(url) as saver:
        stored = saver.put(config, checkpoint, {"source": "loop", "step": 1}, {"messages": 1})
        saver.put_writes(stored, [("messages", [ToolMessage(
            "contents of app.toml", tool_call_id="c1")])], task_id="tools-task")
    with DshSaver.from_url(url) as saver:
        found = saver.get_tuple(config)
        assert found is not None
        messages = found.checkpoint["channel_values"]["messages"]
        assert [(m.id, m.content) for m in messages] == [
            ("h1", "Read app.toml"), ("a1", ""), ("dsh-w-c1", "contents of app.toml")]
        assert [(task, channel, [(m.id, m.content) for m in value]) for task, channel, value
                in found.pending_writes or []] == [
            ("tools-task", "messages", [("dsh-w-c1", "contents of app.toml")])]
        resumed = add_messages(messages, found.pending_writes[0][2])  # what a resume applies
        assert [m.id for m in resumed] == ["h1", "a1", "dsh-w-c1"]


class _Request:
    """The part of LangChain's ``ModelRequest`` the middleware reads (state, messages)."""

    def __init__(self, messages: list[object]) -> None:
        self.messages = messages
        self.state = {"messages": messages}

    def override(self, *, messages: list[object]) -> _Request:
        return _Request(messages)


def _sent_to_model(tmp_path: Path, state: list[Any]) -> list[Any]:
    """The messages the middleware's ``wrap_model_call`` hands the model for ``state``."""
    sent: list[list[Any]] = []

    def handler(request: _Request) -> str:
        sent.append(request.messages)
        return "answer"

    with DshSaver.from_url(f"sqlite:///{tmp_path / 's.db'}") as saver:
        assert saver.middleware().wrap_model_call(_Request(state), handler) == "answer"
    [messages] = sent
    return messages


def test_the_middleware_never_sends_the_model_an_unanswered_call(tmp_path: Path) -> None:
    """A state holding a call with no answer (however it came to be) reaches the model with
    dsh's outcome-unknown closer right after the call (docs/rules.md#repair); before, the
    model (OpenAI rejects such a request) was sent the dangling call."""
    call = {"id": "c1", "name": "deploy", "args": {"target": "prod"}}
    state = [HumanMessage("Deploy", id="h1"), AIMessage("", tool_calls=[call], id="a1"),
             HumanMessage("Did it deploy?", id="h2")]
    messages = _sent_to_model(tmp_path, state)
    assert [(type(m).__name__, m.id) for m in messages] == [
        ("HumanMessage", "h1"), ("AIMessage", "a1"), ("ToolMessage", "dsh-c1"),
        ("HumanMessage", "h2")]
    closer = messages[2]
    assert isinstance(closer, ToolMessage) and closer.tool_call_id == "c1"
    assert closer.name == "deploy" and closer.status == "error"
    assert 'the "deploy" tool call c1' in closer.content
    assert "outcome is unknown" in closer.content
    assert [m.id for m in state] == ["h1", "a1", "h2"]  # the state itself is not changed


def test_the_middleware_sends_the_model_one_answer_a_call(tmp_path: Path) -> None:
    """A state holding two answers to one call (a resume that ran again the tools task whose
    answer the restored state held: the kill landed before the task's writes did) reaches the
    model with the first only; two results for one call are a request the model refuses."""
    call = {"id": "c1", "name": "read_file", "args": {"path": "app.toml"}}
    state = [HumanMessage("Read it", id="h1"), AIMessage("", tool_calls=[call], id="a1"),
             ToolMessage("contents", tool_call_id="c1", id="dsh-c1"),
             ToolMessage("contents", tool_call_id="c1", id="t2")]
    messages = _sent_to_model(tmp_path, state)
    assert [(type(m).__name__, m.id) for m in messages] == [
        ("HumanMessage", "h1"), ("AIMessage", "a1"), ("ToolMessage", "dsh-c1")]
    assert len(state) == 4  # the state itself is not changed


def test_a_call_reusing_an_earlier_calls_id_is_answered_on_its_own(tmp_path: Path) -> None:
    """A later turn's call that reuses an earlier one's id (local servers number calls per
    request) and holds no answer in the state is sent dsh's closer after it: the earlier call's
    answer answers the earlier call only. Before, the earlier answer counted for both and the
    model was sent the later call unanswered."""
    def call(city: str) -> dict[str, Any]:
        return {"id": "call_w", "name": "get_weather", "args": {"city": city}}

    state = [HumanMessage("Paris?", id="h1"), AIMessage("", tool_calls=[call("Paris")], id="a1"),
             ToolMessage("sunny", tool_call_id="call_w", id="t1"), AIMessage("Sunny.", id="a2"),
             HumanMessage("Rome?", id="h2"), AIMessage("", tool_calls=[call("Rome")], id="a3"),
             HumanMessage("Well?", id="h3")]
    messages = _sent_to_model(tmp_path, state)
    assert [m.id for m in messages] == ["h1", "a1", "t1", "a2", "h2", "a3", "dsh-call_w", "h3"]
    assert "outcome is unknown" in messages[6].content


def test_two_calls_with_one_id_in_one_answer_keep_both_results(tmp_path: Path) -> None:
    """A server that gives every call of one response the same id: each result answers one
    of them, and neither is dropped as a second answer (nor a closer sent for the other)."""
    calls = [{"id": "call_0", "name": "get_weather", "args": {"city": c}} for c in ("A", "B")]
    state = [HumanMessage("A and B?", id="h1"), AIMessage("", tool_calls=calls, id="a1"),
             ToolMessage("sunny in A", tool_call_id="call_0", id="t1"),
             ToolMessage("rain in B", tool_call_id="call_0", id="t2")]
    assert [m.id for m in _sent_to_model(tmp_path, state)] == ["h1", "a1", "t1", "t2"]

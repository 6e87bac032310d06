"""DshMessageHistory: Pydantic AI message histories over a dsh log, end to end."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelRequest,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.test import TestModel

from dsh._errors import AdapterError
from dsh.adapters.pydantic_ai import DshMessageHistory
from tests.adapters._pydantic import scripted, url, weather_agent
from tests.adapters.conftest import dsh, dsh_events, dsh_messages, sigkill_when_ready


def run(agent: Agent[None, str], prompt: str, **kwargs: Any) -> Any:
    # asyncio.run closes its loop; Agent.run_sync leaves one open for the rest of the session,
    # whose collection later warns inside some other test
    return asyncio.run(agent.run(prompt, **kwargs))






def test_test_model_multi_turn_round_trip(tmp_path: Path) -> None:
    store = url(tmp_path)
    agent = weather_agent(TestModel())
    with DshMessageHistory("tm", store) as history:
        assert history.load() == []
        first = run(agent, "Weather?", message_history=history.load())
        history.record(first.new_messages())
        second = run(agent, "And tomorrow?", message_history=history.load())
        history.record(second.new_messages())
        # what the second run worked from, plus what it added, is what load gives back
        assert history.load() == second.all_messages()
    with DshMessageHistory("tm", store) as again:
        assert again.load() == second.all_messages()
    chat = dsh_messages("tm", store, "openai")
    assert [m["role"] for m in chat] == ["user", "user", "assistant", "tool", "assistant",
                                         "user", "assistant"]
    assert chat[0]["content"] == "Answer in one line."
    assert chat[2]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert chat[3]["content"] == "a: 18 C"
    shown = dsh("show", "tm", "--store", store)
    assert "test/test" in shown and "── turn 2" in shown and "interrupted" not in shown
    dsh("verify", "tm", "--store", store)




def test_function_model_tools_then_dsh_show_and_messages(tmp_path: Path) -> None:
    store = url(tmp_path)
    agent = weather_agent(scripted([
        [ToolCallPart("get_weather", {"city": "Paris"}, tool_call_id="w1"),
         ToolCallPart("get_weather", {"city": "Oslo"}, tool_call_id="w2")],
        [TextPart("Paris and Oslo: 18 C.")],
        [TextPart("Yes, both.")]]))
    with DshMessageHistory("fm", store) as history:
        history.record(run(agent, "Paris and Oslo?",
                                      message_history=history.load()).new_messages())
        last = run(agent, "Both the same?", message_history=history.load())
        history.record(last.new_messages())
        assert history.load() == last.all_messages()
    events = dsh_events("fm", store)
    assert [e["data"]["callId"] for e in events if e["type"] == "tool/call"] == ["w1", "w2"]
    results = [e for e in events if e["type"] == "tool/result"]
    assert [e["sourceEventSeqs"] for e in results] == [
        [e["seq"]] for e in events if e["type"] == "tool/call"]
    chat = dsh_messages("fm", store, "openai")
    assert [m["role"] for m in chat] == ["user", "user", "assistant", "tool", "tool",
                                         "assistant", "user", "assistant"]
    assert [json.loads(c["function"]["arguments"]) for c in chat[2]["tool_calls"]] == [
        {"city": "Paris"}, {"city": "Oslo"}]
    assert [m["content"] for m in chat[3:5]] == ["Paris: 18 C", "Oslo: 18 C"]
    shown = dsh("show", "fm", "--store", store)
    for text in ("Paris and Oslo?", "get_weather", "Oslo: 18 C", "Paris and Oslo: 18 C.",
                 "Both the same?", "Yes, both.", "pydantic-ai/function:respond"):
        assert text in shown


def test_a_crash_after_the_call_is_repaired_for_the_next_run(tmp_path: Path) -> None:
    store = url(tmp_path)
    ready = tmp_path / "ready"
    # a child process records the model's tool call, then dies before the tool's result
    child = f"""
import pathlib, time
from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, UserPromptPart
from dsh.adapters.pydantic_ai import DshMessageHistory
history = DshMessageHistory("crash", {store!r})
history.record([ModelRequest(parts=[UserPromptPart("Restart the service")]),
                ModelResponse(parts=[ToolCallPart("restart", {{}}, tool_call_id="r1")],
                              model_name="scripted")])
pathlib.Path({str(ready)!r}).write_text("recorded")
time.sleep(600)
"""
    sigkill_when_ready(["-c", child], ready)
    agent = Agent(scripted([[TextPart("I will check whether it restarted.")]]))
    with DshMessageHistory("crash", store) as again:
        loaded = again.load()
        repaired = loaded[-1]
        assert isinstance(repaired, ModelRequest)
        part = repaired.parts[0]
        assert isinstance(part, ToolReturnPart) and part.tool_call_id == "r1"
        assert "outcome is unknown" in str(part.content)
        result = run(agent, "Did it?", message_history=loaded)
        assert result.output == "I will check whether it restarted."
        again.record(result.new_messages())
    shown = dsh("show", "crash", "--store", store)
    assert "REPAIRED (TOOL_OUTCOME_UNKNOWN)" in shown
    dsh("verify", "crash", "--store", store)


def test_bad_messages_write_nothing(tmp_path: Path) -> None:
    with DshMessageHistory("bad", url(tmp_path)) as history:
        history.record([ModelRequest(parts=[UserPromptPart("ok")])])
        seq = history._log.session.seq
        with pytest.raises(AdapterError) as info:
            history.record([ModelRequest(parts=[UserPromptPart("x")]), "nope"])  # type: ignore[list-item]
        assert info.value.code == "ADAPTER_ITEM"
        assert history._log.session.seq == seq
        history.clear()
        assert history.load() == []
    assert "ok" in dsh("show", "bad", "--store", url(tmp_path))

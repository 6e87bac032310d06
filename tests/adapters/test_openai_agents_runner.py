"""DshSession under the SDK's Runner, with a scripted model: memory across runs, limits, tools.

The runner-level cases follow the SDK's own session tests (tests/memory/test_session.py and
tests/memory/test_session_limit.py in openai/openai-agents-python), rewritten here with
DshSession in place of SQLiteSession and our scripted model in place of the SDK's FakeModel.
Each runs through ``Runner.run``, ``Runner.run_sync`` and ``Runner.run_streamed``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, function_tool
from agents.memory import SessionSettings

from dsh.adapters.openai_agents import DshSession
from tests.adapters.conftest import dsh, dsh_messages
from tests.adapters.sdk_model import ScriptedModel, function_call, text_message

METHODS = ["run", "run_sync", "run_streamed"]


def _run_sync(agent: Agent[Any], data: Any, **kwargs: Any) -> Any:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return Runner.run_sync(agent, data, **kwargs)
    finally:
        loop.close()
        asyncio.set_event_loop(None)


async def run_agent(method: str, agent: Agent[Any], data: Any, **kwargs: Any) -> Any:
    if method == "run":
        return await Runner.run(agent, data, **kwargs)
    if method == "run_sync":
        return await asyncio.to_thread(_run_sync, agent, data, **kwargs)
    result = Runner.run_streamed(agent, data, **kwargs)
    async for _ in result.stream_events():
        pass
    return result


def store_of(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'sessions.db'}"


@pytest.mark.parametrize("method", METHODS)
def test_memory_across_runs(method: str, tmp_path: Path) -> None:
    async def body() -> None:
        session = DshSession("memory", store_of(tmp_path))
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        model.script([text_message("San Francisco")], [text_message("California")])
        first = await run_agent(method, agent, "What city is the Golden Gate Bridge in?",
                                session=session)
        assert first.final_output == "San Francisco"
        second = await run_agent(method, agent, "What state is it in?", session=session)
        assert second.final_output == "California"
        sent = model.last_turn_args["input"]
        assert sent[0]["content"] == "What city is the Golden Gate Bridge in?"
        assert sent[1]["content"][0]["text"] == "San Francisco"
        assert sent[2]["content"] == "What state is it in?"
        session.close()
    asyncio.run(body())


@pytest.mark.parametrize("method", METHODS)
def test_sessions_stay_apart(method: str, tmp_path: Path) -> None:
    async def body() -> None:
        store = store_of(tmp_path)
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        cats, dogs = DshSession("cats", store), DshSession("dogs", store)
        model.script([text_message("I like cats")], [text_message("I like dogs")],
                     [text_message("Yes, you mentioned cats")])
        await run_agent(method, agent, "I like cats", session=cats)
        await run_agent(method, agent, "I like dogs", session=dogs)
        await run_agent(method, agent, "What did I say I like?", session=cats)
        contents = [str(i.get("content")) for i in model.last_turn_args["input"]]
        assert any("I like cats" in c for c in contents)
        assert not any("dogs" in c for c in contents)
        cats.close()
        dogs.close()
    asyncio.run(body())


@pytest.mark.parametrize("method", METHODS)
def test_list_input_is_appended_to_history(method: str, tmp_path: Path) -> None:
    async def body() -> None:
        session = DshSession("list", store_of(tmp_path))
        history = [{"role": "user", "content": "Earlier message"},
                   {"role": "assistant", "content": "Saved reply"}]
        await session.add_items(history)
        model = ScriptedModel()
        model.script([text_message("This should run")])
        new_input = [{"role": "user", "content": "Test message"}]
        await run_agent(method, Agent(name="test", model=model), new_input, session=session)
        assert model.last_turn_args["input"] == history + new_input
        session.close()
    asyncio.run(body())


@pytest.mark.parametrize("method", METHODS)
def test_session_input_callback(method: str, tmp_path: Path) -> None:
    async def body() -> None:
        session = DshSession("callback", store_of(tmp_path))
        history = [{"role": "user", "content": "Hello there."},
                   {"role": "assistant", "content": "Hi, I'm here to assist you."}]
        await session.add_items(history)

        def only_user(old: list[Any], new: list[Any]) -> list[Any]:
            return [i for i in old if i["role"] == "user"] + new

        model = ScriptedModel()
        model.script([text_message("I'm a model")])
        new_input = [{"role": "user", "content": "What your name?"}]
        await run_agent(method, Agent(name="test", model=model), new_input, session=session,
                        run_config=RunConfig(session_input_callback=only_user))
        assert model.last_turn_args["input"] == [history[0], new_input[0]]
        session.close()
    asyncio.run(body())


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("limit", "expected"), [(2, ["Message 3", "Reply 3", "Message 4"]),
                                                 (0, ["Message 4"]),
                                                 (None, None), (100, None)])
def test_run_config_session_limit(method: str, limit: int | None,
                                  expected: list[str] | None, tmp_path: Path) -> None:
    async def body() -> None:
        session = DshSession("limit", store_of(tmp_path))
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        for i in (1, 2, 3):
            model.script([text_message(f"Reply {i}")])
            await run_agent(method, agent, f"Message {i}", session=session)
        assert len(await session.get_items()) == 6
        model.script([text_message("Reply 4")])
        await run_agent(method, agent, "Message 4", session=session,
                        run_config=RunConfig(session_settings=SessionSettings(limit=limit)))
        sent = model.last_turn_args["input"]
        texts = [i["content"] if isinstance(i["content"], str) else i["content"][0]["text"]
                 for i in sent]
        assert texts == (expected or ["Message 1", "Reply 1", "Message 2", "Reply 2",
                                      "Message 3", "Reply 3", "Message 4"])
        session.close()
    asyncio.run(body())


def test_run_config_limit_beats_the_session_setting(tmp_path: Path) -> None:
    async def body() -> None:
        session = DshSession("override", store_of(tmp_path),
                             session_settings=SessionSettings(limit=100))
        await session.add_items([{"role": "user", "content": f"Turn {i}"} for i in range(10)])
        model = ScriptedModel()
        model.script([text_message("Got it")])
        await Runner.run(Agent(name="test", model=model), "New question", session=session,
                         run_config=RunConfig(session_settings=SessionSettings(limit=2)))
        history = [i for i in model.last_turn_args["input"] if i.get("content") != "New question"]
        assert [i["content"] for i in history] == ["Turn 8", "Turn 9"]
        session.close()
    asyncio.run(body())


@function_tool
def lookup_weather(city: str) -> str:
    """Return the weather of a city."""
    return f"{city}: 18 C, clear"


@function_tool
def convert(celsius: int) -> str:
    """Convert Celsius to Fahrenheit."""
    return f"{celsius * 9 // 5 + 32} F"


@pytest.mark.parametrize("method", METHODS)
def test_multi_turn_with_tools_agrees_with_dsh_show_and_messages(method: str,
                                                                 tmp_path: Path) -> None:
    store = store_of(tmp_path)

    async def body() -> list[Any]:
        session = DshSession("tools", store, model="scripted")
        model = ScriptedModel()
        agent = Agent(name="weather", model=model, tools=[lookup_weather, convert])
        model.script(
            [function_call("lookup_weather", {"city": "Paris"}, "call_w1")],
            [text_message("Paris is 18 C and clear.", "msg_a")],
            [function_call("convert", {"celsius": 18}, "call_c1"),
             function_call("lookup_weather", {"city": "Oslo"}, "call_w2")],
            [text_message("18 C is 64 F; Oslo is 18 C too.", "msg_b")])
        r1 = await run_agent(method, agent, "Weather in Paris?", session=session)
        assert r1.final_output == "Paris is 18 C and clear."
        r2 = await run_agent(method, agent, "In F, and Oslo?", session=session)
        assert r2.final_output == "18 C is 64 F; Oslo is 18 C too."
        seen = model.inputs[-1]
        items = await session.get_items()
        session.close()
        # what the model saw last is the stored history up to that point, item for item
        assert items[:len(seen)] == seen
        return items

    items = asyncio.run(body())
    kinds = [i.get("type", "message") for i in items]
    assert kinds == ["message", "function_call", "function_call_output", "message",
                     "message", "function_call", "function_call", "function_call_output",
                     "function_call_output", "message"]
    # dsh's model view (OpenAI chat shape) says the same conversation
    chat = dsh_messages("tools", store, "openai")
    assert [m["role"] for m in chat] == ["user", "assistant", "tool", "assistant", "user",
                                         "assistant", "tool", "tool", "assistant"]
    assert chat[0]["content"] == "Weather in Paris?"
    assert chat[1]["tool_calls"][0]["function"] == {"name": "lookup_weather",
                                                    "arguments": json.dumps({"city": "Paris"})}
    assert chat[2] == {"role": "tool", "tool_call_id": "call_w1", "content": "Paris: 18 C, clear"}
    assert [c["id"] for c in chat[5]["tool_calls"]] == ["call_c1", "call_w2"]
    assert {chat[6]["content"], chat[7]["content"]} == {"64 F", "Oslo: 18 C, clear"}
    assert chat[8]["content"] == "18 C is 64 F; Oslo is 18 C too."
    shown = dsh("show", "tools", "--store", store)
    for text in ("Weather in Paris?", "lookup_weather", "Paris: 18 C, clear", "In F, and Oslo?",
                 "convert", "64 F", "18 C is 64 F; Oslo is 18 C too.", "openai/scripted"):
        assert text in shown
    assert "── turn 2" in shown and "interrupted" not in shown
    dsh("verify", "tools", "--store", store)  # exit 0: envelope, surface, pairing all valid


def test_a_custom_model_object_is_recorded_by_its_class_name(tmp_path: Path) -> None:
    # docs/adapters.md: a Model without a `model` name was recorded as "openai/unknown"
    store = store_of(tmp_path)

    async def body() -> None:
        session = DshSession("custom", store)
        model = ScriptedModel()
        model.script([text_message("Hello")])
        await Runner.run(Agent(name="test", model=model), "Hi", session=session,
                         hooks=session.run_hooks())
        session.close()

    asyncio.run(body())
    answer = dsh_messages("custom", store, "dsh")[-1]
    assert answer["role"] == "assistant"
    assert (answer["source"]["provider"], answer["source"]["model"]) == ("custom",
                                                                         "ScriptedModel")

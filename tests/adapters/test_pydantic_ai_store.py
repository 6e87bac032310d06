"""DshConversationStore: Pydantic AI's ConversationStore over dsh session logs, end to end."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai.conversation_store")

from pydantic_ai import Agent
from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import ConversationConflict, InMemoryConversationStore
from pydantic_ai.messages import ModelMessage, TextPart, ToolCallPart
from pydantic_ai.models.test import TestModel

from dsh._errors import AdapterLookupError
from dsh.adapters.pydantic_ai_store import DshConversationStore
from tests.adapters._pydantic import scripted, url, weather_agent
from tests.adapters.conftest import dsh, dsh_events, dsh_messages


async def turn(store: Any, agent: Agent[None, str], conversation_id: str, prompt: str) -> Any:
    """What the ConversationStore docs say to do around each run: load, run, save."""
    conversation = (await store.load(conversation_id)
                    or Conversation(conversation_id=conversation_id))
    result = await agent.run(prompt, conversation=conversation)
    await store.save(result)
    return result


def test_function_model_tools_over_runs_then_dsh_show_and_messages(tmp_path: Path) -> None:
    store_url = url(tmp_path)
    agent = weather_agent(scripted([
        [ToolCallPart("get_weather", {"city": "Paris"}, tool_call_id="w1"),
         ToolCallPart("get_weather", {"city": "Oslo"}, tool_call_id="w2")],
        [TextPart("Paris and Oslo: 18 C.")],
        [TextPart("Yes, both.")]]))

    async def body() -> list[ModelMessage]:
        async with DshConversationStore(store_url) as store:
            await turn(store, agent, "chat", "Paris and Oslo?")
            last = await turn(store, agent, "chat", "Both the same?")
            loaded = await store.load("chat")
            assert loaded is not None and loaded.messages == last.all_messages()
            assert loaded.usage == last.usage
        async with DshConversationStore(store_url) as again:  # a fresh process's view
            reloaded = await again.load("chat")
            assert reloaded is not None and reloaded.messages == last.all_messages()
            entries = await again.load_entries("chat")
            assert entries is not None and [e.message for e in entries] == last.all_messages()
            return list(last.all_messages())

    messages = asyncio.run(body())
    chat = dsh_messages("chat", store_url, "openai")
    assert [m["role"] for m in chat] == ["user", "user", "assistant", "tool", "tool",
                                         "assistant", "user", "assistant"]
    assert [json.loads(c["function"]["arguments"]) for c in chat[2]["tool_calls"]] == [
        {"city": "Paris"}, {"city": "Oslo"}]
    assert [m["content"] for m in chat[3:5]] == ["Paris: 18 C", "Oslo: 18 C"]
    assert chat[-1]["content"] == "Yes, both."
    assert len(messages) == 6  # request, response(2 calls), request(2 returns), response, ...
    records = [e for e in dsh_events("chat", store_url) if e["type"] == "pydantic-ai/record"]
    assert len(records) == 2 and all(e["ignorable"] for e in records)
    shown = dsh("show", "chat", "--store", store_url)
    for text in ("Paris and Oslo?", "get_weather", "Oslo: 18 C", "Yes, both."):
        assert text in shown
    dsh("verify", "chat", "--store", store_url)


def test_branch_fork_and_delete_keep_every_line(tmp_path: Path) -> None:
    store_url = url(tmp_path)
    agent = weather_agent(TestModel())

    async def body() -> None:
        async with DshConversationStore(store_url) as store:
            first = await turn(store, agent, "c", "Weather?")
            kept = len(first.all_messages())
            await turn(store, agent, "c", "And tomorrow?")
            loaded = await store.load("c")
            assert loaded is not None
            # regenerate the second turn: the history continues after the first turn
            branched = await store.branch("c", at=kept, expected_revision=loaded.revision)
            assert branched.messages == first.all_messages()
            again = await agent.run("And the day after?", conversation=branched)
            await store.save(again)
            now = await store.load("c")
            assert now is not None and now.messages == again.all_messages()
            record = await store.read_record("c")
            assert record is not None and len(record.branches) == 1
            # the line it left reads back whole
            left = await store.read_history(record.branches[0])
            assert [e.message for e in left][:kept] == first.all_messages()
            assert len(left) == kept + 2
            # a fork of the first turn is a conversation of its own
            forked = await store.fork("c", at=kept, new_conversation_id="f")
            assert forked.messages == first.all_messages()
            more = await agent.run("Other city?", conversation=forked)
            await store.save(more)
            assert (await store.load("f")).messages == more.all_messages()  # type: ignore
            listed = [r.conversation_id for r in await store.list_conversations()]
            assert sorted(listed) == ["c", "f"]
            await store.delete("f")
            assert await store.load("f") is None
            assert [r.conversation_id for r in await store.list_conversations()] == ["c"]
            with pytest.raises(ConversationConflict):
                await store.save(loaded)  # loaded before the branch: stale revision
            with pytest.raises(AdapterLookupError):
                await store.read_entry("no-such-entry")

    asyncio.run(body())
    # dsh sees each line as a session: the branch is a dsh fork of "c", the fork another
    listing = dsh("ls", "--store", store_url, "--json")
    ids = sorted(row["id"] for row in json.loads(listing))
    assert ids == ["c", "c~2", "f"]
    regenerated = dsh_messages("c~2", store_url, "openai")
    assert [m["content"] for m in regenerated if m["role"] == "user"][-1] == "And the day after?"
    assert "And tomorrow?" not in json.dumps(regenerated)
    assert "And tomorrow?" in json.dumps(dsh_messages("c", store_url, "openai"))
    # the deleted conversation's log is still there
    assert "Other city?" in dsh("show", "f", "--store", store_url)


def test_behaves_like_the_in_memory_store(tmp_path: Path) -> None:
    """The same calls on Pydantic AI's own InMemoryConversationStore and on dsh's agree."""
    agent = weather_agent(TestModel())

    async def script(store: Any) -> list[Any]:
        seen: list[Any] = []
        first = await turn(store, agent, "x", "Weather?")
        seen.append(len(first.all_messages()))
        second = await turn(store, agent, "x", "More?")
        loaded = await store.load("x", limit=3)
        seen.append([type(m).__name__ for m in loaded.messages])
        seen.append((await store.read_record("x")).usage == second.usage)
        stale = Conversation(conversation_id="x", messages=list(first.all_messages()))
        try:
            await store.save(stale)
        except ConversationConflict:
            seen.append("conflict")
        branched = await store.branch("x", at=2, expected_revision=loaded.revision)
        seen.append(len(branched.messages))
        seen.append(len((await store.read_record("x")).branches))
        return seen

    async def body() -> None:
        mine = DshConversationStore(url(tmp_path))
        try:
            ours = await script(mine)
        finally:
            mine.close()
        theirs = await script(InMemoryConversationStore())
        assert ours == theirs

    asyncio.run(body())

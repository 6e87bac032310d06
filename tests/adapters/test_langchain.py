"""DshChatMessageHistory: LangChain's history interface over a dsh log, end to end."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain_core")

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from langchain_core.tools import tool

from dsh._errors import AdapterError
from dsh.adapters._log import is_removal
from dsh.adapters.langchain import DshChatMessageHistory
from tests.adapters.conftest import dsh, dsh_events, dsh_messages

CONVERSATION: list[BaseMessage] = [
    SystemMessage(content="You are terse."),
    HumanMessage(content="What is in /tmp?", id="h1", additional_kwargs={"k": [1, 2]}),
    AIMessage(content="", id="a1", tool_calls=[
        {"id": "call_ls", "name": "ls", "args": {"path": "/tmp"}, "type": "tool_call"}],
        response_metadata={"model_name": "fake"}),
    ToolMessage(content="a.txt\nb.txt", tool_call_id="call_ls", name="ls"),
    AIMessage(content=[{"type": "text", "text": "Two files."}], id="a2"),
    HumanMessage(content=[{"type": "text", "text": "Delete them"},
                          {"type": "image_url", "image_url": {"url": "data:,x"}}]),
    AIMessage(content="Deleting.", tool_calls=[
        {"id": "call_rm", "name": "rm", "args": {"path": "/tmp/a.txt"}, "type": "tool_call"}]),
    ToolMessage(content="permission denied", tool_call_id="call_rm", status="error"),
    AIMessage(content="I could not delete them."),
]


def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'sessions.db'}"


@pytest.mark.no_speedups
def test_messages_come_back_exactly(tmp_path: Path) -> None:
    history = DshChatMessageHistory("lc", url(tmp_path))
    assert isinstance(history, BaseChatMessageHistory)
    assert history.messages == []
    history.add_messages(CONVERSATION[:4])
    history.add_messages(CONVERSATION[4:])
    assert history.messages == CONVERSATION
    history.close()
    again = DshChatMessageHistory("lc", url(tmp_path))
    assert again.messages == CONVERSATION
    assert [type(m) for m in again.messages] == [type(m) for m in CONVERSATION]
    again.close()
    types = [e["type"] for e in dsh_events("lc", url(tmp_path))]
    assert types.count("tool/call") == 2 and types.count("tool/result") == 2
    assert types.count("turn/start") == 2 and types.count("turn/end") == 2
    chat = dsh_messages("lc", url(tmp_path), "openai")
    assert [m["role"] for m in chat] == ["user", "user", "assistant", "tool", "assistant",
                                         "user", "assistant", "tool", "assistant"]
    assert chat[2]["tool_calls"][0]["function"] == {"name": "ls",
                                                    "arguments": json.dumps({"path": "/tmp"})}
    shown = dsh("show", "lc", "--store", url(tmp_path))
    assert "permission denied" in shown and "error" in shown
    dsh("verify", "lc", "--store", url(tmp_path))


def test_async_methods_and_clear(tmp_path: Path) -> None:
    async def body() -> None:
        history = DshChatMessageHistory("alc", url(tmp_path))
        await history.aadd_messages([HumanMessage(content="hi"), AIMessage(content="hello")])
        assert [m.content for m in await history.aget_messages()] == ["hi", "hello"]
        before = len(history._log.session.events)
        await history.aclear()
        assert await history.aget_messages() == []
        removal = [e for e in history._log.session.events[before:] if is_removal(e)]
        assert len(removal) == 1 and history._log.session.derive_messages() == []
        history.add_user_message("again")
        history.add_ai_message("yes")
        assert [m.content for m in history.messages] == ["again", "yes"]
        history.clear()
        assert history.messages == []
        history.close()
    asyncio.run(body())
    shown = dsh("show", "alc", "--store", url(tmp_path))
    assert "hi" in shown and "again" in shown  # the log kept every cleared message


@pytest.mark.no_speedups
def test_bad_batch_writes_nothing(tmp_path: Path) -> None:
    history = DshChatMessageHistory("bad", url(tmp_path))
    history.add_messages([HumanMessage(content="ok")])
    seq = history._log.session.seq
    with pytest.raises(AdapterError) as info:
        history.add_messages([HumanMessage(content="fine"), "not a message"])  # type: ignore[list-item]
    assert info.value.code == "ADAPTER_ITEM"
    with pytest.raises(AdapterError):
        history.add_messages([HumanMessage(content="x", additional_kwargs={"f": float("inf")})])
    with pytest.raises(AdapterError):
        history.add_messages([HumanMessage(content="y"), AIMessage(content="", tool_calls=[
            {"id": "same", "name": "a", "args": {}}, {"id": "same", "name": "b", "args": {}}])])
    assert history._log.session.seq == seq
    assert [m.content for m in history.messages] == ["ok"]
    history.close()


@tool
def word_count(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())


@pytest.mark.no_speedups
def test_tool_loop_end_to_end_with_a_fake_chat_model(tmp_path: Path) -> None:
    store = url(tmp_path)
    model = FakeMessagesListChatModel(responses=[
        AIMessage(content="", tool_calls=[{"id": "c1", "name": "word_count",
                                           "args": {"text": "one two three"}}]),
        AIMessage(content="It has 3 words."),
        AIMessage(content="Yes, 3.")])
    seen: list[list[BaseMessage]] = []

    def turn(prompt: str) -> None:
        # a minimal tool loop, as agents built on langchain-core run one, saving each turn
        history = DshChatMessageHistory("loop", store, model="fake")
        new: list[BaseMessage] = [HumanMessage(content=prompt)]
        while True:
            sent = history.messages + new
            seen.append(sent)
            reply = model.invoke(sent)
            assert isinstance(reply, AIMessage)
            new.append(reply)
            if not reply.tool_calls:
                break
            new.extend(word_count.invoke(call) for call in reply.tool_calls)
        history.add_messages(new)
        history.close()

    turn("How many words in 'one two three'?")
    turn("Sure?")
    history = DshChatMessageHistory("loop", store)
    final = history.messages
    history.close()
    assert final[:len(seen[-1])] == seen[-1]
    assert [m.type for m in final] == ["human", "ai", "tool", "ai", "human", "ai"]
    assert final[2].content == "3"
    chat = dsh_messages("loop", store, "openai")
    assert [m["role"] for m in chat] == ["user", "assistant", "tool", "assistant", "user",
                                         "assistant"]
    assert chat[2] == {"role": "tool", "tool_call_id": "c1", "content": "3"}
    shown = dsh("show", "loop", "--store", store)
    for text in ("How many words", "word_count", "It has 3 words.", "Sure?", "Yes, 3.",
                 "langchain/fake"):
        assert text in shown


# still the most used way to give a chain a history, though langchain-core deprecates it
@pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")
def test_runnable_with_message_history(tmp_path: Path) -> None:
    store = url(tmp_path)
    prompt = ChatPromptTemplate.from_messages([("system", "Be brief."),
                                               MessagesPlaceholder("history"),
                                               ("human", "{question}")])
    model = FakeMessagesListChatModel(responses=[AIMessage(content="Paris."),
                                                 AIMessage(content="About 2 million.")])
    histories: dict[str, DshChatMessageHistory] = {}

    def get_history(session_id: str) -> DshChatMessageHistory:
        if session_id not in histories:
            histories[session_id] = DshChatMessageHistory(session_id, store)
        return histories[session_id]

    chain: Any = RunnableWithMessageHistory(prompt | model, get_history,
                                            input_messages_key="question",
                                            history_messages_key="history")
    config: Any = {"configurable": {"session_id": "capital"}}
    assert chain.invoke({"question": "Capital of France?"}, config=config).content == "Paris."
    assert chain.invoke({"question": "Population?"}, config=config).content == \
        "About 2 million."
    assert [m.content for m in histories["capital"].messages] == [
        "Capital of France?", "Paris.", "Population?", "About 2 million."]
    histories["capital"].close()
    assert [m["content"] for m in dsh_messages("capital", store, "openai")] == [
        "Capital of France?", "Paris.", "Population?", "About 2 million."]

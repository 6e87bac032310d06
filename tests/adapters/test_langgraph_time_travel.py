"""LangGraph time travel on DshSaver: a thread forked from an earlier checkpoint.

``get_state_history`` lists every checkpoint of the thread as stored; ``update_state`` or a run
from an earlier checkpoint continues the thread from there. That new branch is a dsh fork of
the thread's session, ``<thread>~<n>``, whose ``dsh messages`` and ``dsh show`` are the branch's
conversation, while the thread's own session keeps the line it left
(docs/adapters.md#time-travel-and-forks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, MessagesState, StateGraph

from dsh.adapters.langgraph import DshSaver
from tests.adapters.conftest import dsh, dsh_events, dsh_messages


def _graph(saver: DshSaver) -> Any:
    def model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(f"answer to {state['messages'][-1].content}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_edge(START, "model")
    return builder.compile(checkpointer=saver)


def _texts(messages: list[Any]) -> list[str]:
    return [str(m.content) for m in messages]


def test_update_state_from_an_earlier_checkpoint_shows_the_forked_conversation(
        tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    config: Any = {"configurable": {"thread_id": "travel"}}
    with DshSaver.from_url(store) as saver:
        graph = _graph(saver)
        graph.invoke({"messages": [HumanMessage("first")]}, config)
        graph.invoke({"messages": [HumanMessage("second")]}, config)
        history = list(graph.get_state_history(config))
        earlier = next(state for state in history if _texts(state.values.get("messages", []))
                       == ["first", "answer to first"])
        graph.update_state(earlier.config, {"messages": [HumanMessage("other")]})
        graph.invoke({"messages": [HumanMessage("third")]}, config)
        now = ["first", "answer to first", "other", "third", "answer to third"]
        assert _texts(graph.get_state(config).values["messages"]) == now
        later = list(graph.get_state_history(config))
        assert {s.config["configurable"]["checkpoint_id"] for s in history} <= {
            s.config["configurable"]["checkpoint_id"] for s in later}  # the old line stays
    with DshSaver.from_url(store) as saver:  # a fresh process reads the same
        assert _texts(_graph(saver).get_state(config).values["messages"]) == now
    # the thread's session keeps its line; the branch is a dsh fork holding the forked one
    assert [m["content"] for m in dsh_messages("travel", store)] == [
        "first", "answer to first", "second", "answer to second"]
    assert [m["content"] for m in dsh_messages("travel~1", store)] == now
    shown = dsh("show", "travel~1", "--store", store)
    assert "answer to third" in shown and "answer to second" not in shown
    events = dsh_events("travel~1", store)
    assert any(e["type"] == "session/end-seed" and e["data"].get("inherited") for e in events)
    dsh("verify", "travel", "--store", store)
    dsh("verify", "travel~1", "--store", store)


def test_each_fork_of_a_model_graph_is_a_dsh_fork_with_its_own_conversation(
        tmp_path: Path) -> None:
    # a real graph whose model is LangChain's OpenAI client on a local Chat Completions server
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI

    from tests.adapters.test_docs_snippets import completion
    from tests.agent.providers.servers import ScriptedServer

    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    config: Any = {"configurable": {"thread_id": "trip"}}

    def ask(graph: Any, server: ScriptedServer, text: str, at: Any = config) -> None:
        server.add(completion(f"re: {text}"))
        graph.invoke({"messages": [HumanMessage(text)]}, at, durability="sync")

    with ScriptedServer() as server, DshSaver.from_url(store) as saver:
        model = ChatOpenAI(model="gpt-test", base_url=server.base_url, api_key="test",
                           max_retries=0)
        builder = StateGraph(MessagesState)
        builder.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
        builder.add_edge(START, "model")
        graph = builder.compile(checkpointer=saver)
        ask(graph, server, "a")
        ask(graph, server, "b")

        def at(texts: list[str]) -> Any:
            return next(s.config for s in graph.get_state_history(config)
                        if _texts(s.values.get("messages", [])) == texts)

        ask(graph, server, "c", at(["a", "re: a"]))  # a run from an earlier checkpoint: trip~1
        ask(graph, server, "d")  # continues the latest (trip~1)
        ask(graph, server, "e", at(["a", "re: a", "c", "re: c"]))  # inside trip~1: trip~2
        ask(graph, server, "f", at(["a", "re: a", "b", "re: b"]))  # the thread's own tip
        latest = _texts(graph.get_state(config).values["messages"])
        assert latest == ["a", "re: a", "b", "re: b", "f", "re: f"]
        history = [s.config["configurable"]["checkpoint_id"]
                   for s in graph.get_state_history(config)]
    with DshSaver.from_url(store) as saver:  # a new process: the same thread, every branch
        graph = StateGraph(MessagesState)
        graph.add_node("model", lambda state: {})
        graph.add_edge(START, "model")
        cold = graph.compile(checkpointer=saver)
        assert _texts(cold.get_state(config).values["messages"]) == latest
        assert [s.config["configurable"]["checkpoint_id"]
                for s in cold.get_state_history(config)] == history
        assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {"trip"}
    conversations = {sid: [m["content"] for m in dsh_messages(sid, store)]
                     for sid in ("trip", "trip~1", "trip~2")}
    assert conversations == {
        "trip": ["a", "re: a", "b", "re: b", "f", "re: f"],
        "trip~1": ["a", "re: a", "c", "re: c", "d", "re: d"],
        "trip~2": ["a", "re: a", "c", "re: c", "e", "re: e"]}
    from dsh.persistence import Persistence, open_backend
    persistence = Persistence(open_backend(store))
    parents = {h["id"]: h.get("parentSession") for h in persistence.list_headers()}
    persistence.close()
    assert parents == {"trip": None, "trip~1": "trip", "trip~2": "trip~1"}
    for sid in conversations:
        dsh("verify", sid, "--store", store)

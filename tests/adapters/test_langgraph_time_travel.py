"""LangGraph time travel on DshSaver: a thread forked from an earlier checkpoint.

``get_state_history`` lists every checkpoint of the thread as stored; ``update_state`` from an
earlier checkpoint continues the thread from there. The thread's dsh session then shows the
forked conversation (``dsh messages``: the model view), and ``dsh show`` still shows the line it
left, marked as taken off the model view (docs/adapters.md#langgraph-and-langchain-agents).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, MessagesState, StateGraph

from dsh.adapters.langgraph import DshSaver
from tests.adapters.conftest import dsh, dsh_messages


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
    assert [m["content"] for m in dsh_messages("travel", store)] == now
    shown = dsh("show", "travel", "--store", store)
    assert "answer to second" in shown  # the log keeps the line the fork left
    assert "REMOVED from the model view" in shown
    dsh("verify", "travel", "--store", store)

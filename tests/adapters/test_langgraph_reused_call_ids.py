"""A provider that gives a later turn's tool call the id of an earlier one (some local servers
number their calls per request: ``call_0``, or a fixed id) still has the call run.

The middleware answers a call from dsh's log only when the log holds a result for *that* call
(a crash repair's outcome-unknown one, docs/adapters.md#langgraph-and-langchain-agents); a
result of an earlier call that had the same id is not one.
"""

from __future__ import annotations

from pathlib import Path

from langchain.agents import create_agent
from langchain_openai import ChatOpenAI

from dsh.adapters.langgraph import DshSaver
from tests.adapters.conftest import dsh
from tests.adapters.test_docs_snippets import completion
from tests.agent.providers.servers import ScriptedServer


def test_a_call_reusing_an_earlier_turns_call_id_runs_and_its_result_is_logged(
        tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    ran: list[str] = []

    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"sunny in {city} (call {len(ran)})"

    with ScriptedServer() as server, DshSaver.from_url(store) as saver:
        for city in ("Paris", "Rome"):
            server.add(completion(call=("get_weather", f'{{"city": "{city}"}}')))  # id call_w
            server.add(completion("Done."))
        model = ChatOpenAI(model="gpt-test", base_url=server.base_url + "/v1", api_key="test",
                           max_retries=0)
        agent = create_agent(model, tools=[get_weather], checkpointer=saver,
                             middleware=[saver.middleware()])
        answers = []
        for city in ("Paris", "Rome"):
            state = agent.invoke({"messages": [{"role": "user", "content": f"Weather in {city}?"}]},
                                 {"configurable": {"thread_id": "t"}})
            answers.append(state["messages"][-2].content)
    assert ran == ["Paris", "Rome"]
    assert answers == ["sunny in Paris (call 1)", "sunny in Rome (call 2)"]
    # the model is sent each call with its own answer: the Rome call's result is not taken
    # for a second answer to the Paris call (and dropped), leaving the Rome call unanswered
    last = [(m["role"], m.get("tool_call_id"), m.get("content"))
            for m in server.requests[-1]["messages"]
            if m["role"] == "tool" or m.get("tool_calls")]
    assert last == [("assistant", None, None), ("tool", "call_w", "sunny in Paris (call 1)"),
                    ("assistant", None, None), ("tool", "call_w", "sunny in Rome (call 2)")]
    shown = dsh("show", "t", "--store", store)
    assert "sunny in Rome (call 2)" in shown
    assert "REPAIRED" not in shown
    dsh("verify", "t", "--store", store)

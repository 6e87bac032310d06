"""Child process of the kill tests: one framework's agent on a dsh adapter, killed by the parent.

``python kill_child.py FRAMEWORK STORE SESSION BASE_URL READY_FILE [DURABILITY]``. The model is
the parent's local OpenAI-protocol server at BASE_URL (Chat Completions, streamed), which the
parent scripts.
The ``deploy`` tool's body writes READY_FILE and never returns; ``read_file`` returns at once.
The same module gives the parent the agent for the next run (:func:`run`). DURABILITY is
LangGraph's ``durability=`` for the killed run (``exit``: no checkpoint is saved before the end),
or ``late``: LangGraph's default (``async``) with the save of every checkpoint holding a tool
result stalled on its background thread, so the run goes on to the next model call while the
latest stored checkpoint is still the one before the tools step, its tool result only in that
checkpoint's pending writes (the race LangGraph's background checkpointing loses under load).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PROMPT = "Read app.toml, then deploy to prod"
READY: Path | None = None
DURABILITY: str | None = None


def read_file(path: str) -> str:
    """Read a file."""
    return f"contents of {path}"


def deploy(target: str) -> str:
    """Deploy to a target; the parent kills the process inside this body."""
    if READY is None:
        return f"deployed to {target}"
    READY.write_text("in tool body")
    while True:
        time.sleep(1)


def run_langgraph(store: str, session: str, base_url: str, prompt: str | None) -> Any:
    """LangChain's ``create_agent`` with the LangGraph saver and its middleware.

    A ``prompt`` of None resumes the thread (``invoke(None)``) instead of adding a message.
    """
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI

    from dsh.adapters.langgraph import DshSaver

    model = ChatOpenAI(model="gpt-test", base_url=base_url, api_key="test", streaming=True,
                       max_retries=0)
    with DshSaver.from_url(store) as saver:
        if DURABILITY == "late":
            _stall_puts_after_tools(saver)
        agent = create_agent(model, tools=[read_file, deploy], checkpointer=saver,
                             middleware=[saver.middleware()])
        options = {"durability": DURABILITY} if DURABILITY not in (None, "late") else {}
        given = None if prompt is None else {"messages": [{"role": "user", "content": prompt}]}
        return agent.invoke(given, {"configurable": {"thread_id": session}}, **options)


def _stall_puts_after_tools(saver: Any) -> None:
    """Make ``saver.put`` of a checkpoint holding a ToolMessage block forever (the killed run)."""
    from langchain_core.messages import ToolMessage

    put = saver.put

    def stalled_put(config: Any, checkpoint: Any, *args: Any, **kwargs: Any) -> Any:
        messages = checkpoint["channel_values"].get("messages") or ()
        if any(isinstance(m, ToolMessage) for m in messages):
            while True:  # LangGraph saves on a background thread: the run goes on
                time.sleep(1)
        return put(config, checkpoint, *args, **kwargs)

    saver.put = stalled_put


def run_openai_agents(store: str, session_id: str, base_url: str, prompt: str) -> Any:
    import asyncio

    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    from dsh.adapters.openai_agents import DshSession

    set_tracing_disabled(True)

    async def main() -> Any:
        client = AsyncOpenAI(base_url=base_url, api_key="test", max_retries=0)
        model = OpenAIChatCompletionsModel(model="gpt-test", openai_client=client)
        agent = Agent(name="ops", model=model,
                      tools=[function_tool(read_file), function_tool(deploy)])
        session = DshSession(session_id, store)
        try:
            result = Runner.run_streamed(agent, prompt, session=session,
                                         hooks=session.run_hooks())
            async for _ in result.stream_events():
                pass
            return result.final_output
        finally:
            session.close()
    return asyncio.run(main())


def run_pydantic_ai(store: str, session_id: str, base_url: str, prompt: str) -> Any:
    """A Pydantic AI agent on a DshMessageHistory with its capability (streamed requests)."""
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from dsh.adapters.pydantic_ai import DshMessageHistory

    model = OpenAIChatModel("gpt-test", provider=OpenAIProvider(base_url=base_url,
                                                                api_key="test"))
    agent = Agent(model, tools=[read_file, deploy], retries=0)

    async def drain(_ctx: Any, events: Any) -> None:
        async for _ in events:
            pass

    import asyncio

    with DshMessageHistory(session_id, store) as history:
        # asyncio.run, not run_sync: run_sync leaves its event loop open for the collector
        result = asyncio.run(agent.run(prompt, message_history=history.load(),
                                       capabilities=[history.capability()],
                                       event_stream_handler=drain))
        history.record(result.new_messages())
        return result.output


RUNNERS = {"langgraph": run_langgraph, "openai-agents": run_openai_agents,
           "pydantic-ai": run_pydantic_ai}


def run(framework: str, store: str, session: str, base_url: str, prompt: str) -> Any:
    """Run one agent turn of ``framework`` on ``session`` and return its result."""
    return RUNNERS[framework](store, session, base_url, prompt)


if __name__ == "__main__":
    framework, store, session, base_url, ready = sys.argv[1:6]
    READY = Path(ready)
    DURABILITY = sys.argv[6] if len(sys.argv) > 6 else None
    run(framework, store, session, base_url, PROMPT)
    raise SystemExit("the run ended: the parent should have killed it")

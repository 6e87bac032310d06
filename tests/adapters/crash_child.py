"""Child process of the crash tests: runs an SDK agent on a DshSession until it is killed.

``python crash_child.py STORE SESSION MODE READY_FILE``; MODE ``tool`` runs an agent whose
second tool body never returns, ``items`` adds a user message and an unanswered
``function_call`` directly. Either way it writes READY_FILE and waits for SIGKILL.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agents import Agent, Runner, function_tool, set_tracing_disabled

from dsh.adapters.openai_agents import DshSession
from tests.adapters.sdk_model import ScriptedModel, function_call

STORE, SESSION, MODE, READY = sys.argv[1:5]


@function_tool
def read_file(path: str) -> str:
    """Read a file."""
    return f"contents of {path}"


@function_tool
def deploy(target: str) -> str:
    """Deploy; this body never returns: the parent kills the process inside it."""
    Path(READY).write_text("in tool body")
    while True:
        time.sleep(1)


async def main() -> None:
    set_tracing_disabled(True)
    session = DshSession(SESSION, STORE)
    if MODE == "items":
        await session.add_items([
            {"role": "user", "content": "Delete the cache"},
            {"type": "function_call", "call_id": "call_rm", "name": "rm",
             "arguments": "{\"path\": \"cache\"}"}])
        Path(READY).write_text("items added")
        while True:
            await asyncio.sleep(1)
    model = ScriptedModel()
    model.script([function_call("read_file", {"path": "app.toml"}, "call_read")],
                 [function_call("deploy", {"target": "prod"}, "call_deploy")])
    agent = Agent(name="ops", model=model, tools=[read_file, deploy])
    await Runner.run(agent, "Read app.toml, then deploy to prod", session=session)


asyncio.run(main())

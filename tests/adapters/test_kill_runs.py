"""SIGKILL inside a framework's run (real child processes, a local OpenAI-protocol server).

For each adapter and each kill point — inside a tool body, during a streamed model answer,
between two tool calls — the next run's model request (captured by the server) must hold the
user's prompt, the calls made, and dsh's outcome-unknown result for a call whose body may have
run; ``dsh verify`` passes on the session afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.adapters.conftest import dsh, sigkill_when_ready
from tests.adapters.kill_child import PROMPT, run
from tests.agent.providers.servers import ScriptedServer, Stall, Stream, openai_reply

CHILD = Path(__file__).with_name("kill_child.py")

# "langgraph/exit": LangGraph saves no checkpoint before the run ends, so everything the next
# run is sent comes from what the middleware made durable (the race LangGraph's default
# background checkpointing loses now and then, made certain); "langgraph/late": the checkpoint
# after the tools step never lands, the tool result is only in the pending writes of the one
# before (the other side of that race, made certain)
FRAMEWORKS = ["langgraph", "langgraph/exit", "langgraph/late", "openai-agents", "pydantic-ai"]


def _texts(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(role, text)`` of a Chat Completions request's messages (calls as ``call:name``)."""
    out = []
    for message in messages:
        if message.get("tool_calls"):
            out.extend(("call", call["function"]["name"]) for call in message["tool_calls"])
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content)
        if content:
            out.append((message["role"], text))
    return out


READ = ("call_read", "read_file", '{"path": "app.toml"}')
DEPLOY = ("call_deploy", "deploy", '{"target": "prod"}')


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("point", ["tool body", "streamed answer", "between calls"])
def test_kill_then_the_next_run_sees_prompt_calls_and_outcome(
        framework: str, point: str, tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    ready = tmp_path / "ready"
    framework, _, durability = framework.partition("/")
    with ScriptedServer() as server:
        child = [str(CHILD), framework, store, "s", server.base_url + "/v1", str(ready),
                 *([durability] if durability else [])]
        if point == "tool body":
            server.add(Stream(openai_reply(tool_calls=[READ])),
                       Stream(openai_reply(tool_calls=[DEPLOY])))
            sigkill_when_ready(child, ready.exists)
        elif point == "streamed answer":
            server.add(Stall(openai_reply("I will read the")[:2]))
            sigkill_when_ready(child, lambda: len(server.requests) >= 1)
        else:
            server.add(Stream(openai_reply(tool_calls=[READ])), Stall([]))
            sigkill_when_ready(child, lambda: len(server.requests) >= 2)
        killed_requests = len(server.requests)
        server.add(Stream(openai_reply("Not deployed; I will check first.")))
        run(framework, store, "s", server.base_url + "/v1", "Did it deploy?")
        sent = server.requests[killed_requests]["messages"]
    texts = _texts(sent)
    assert texts[0] == ("user", PROMPT)
    assert texts[-1] == ("user", "Did it deploy?")
    if point == "streamed answer":
        assert texts == [("user", PROMPT), ("user", "Did it deploy?")]
    elif point == "between calls":
        assert texts == [("user", PROMPT), ("call", "read_file"),
                         ("tool", "contents of app.toml"), ("user", "Did it deploy?")]
    else:
        assert texts[:4] == [("user", PROMPT), ("call", "read_file"),
                             ("tool", "contents of app.toml"), ("call", "deploy")]
        assert texts[4][0] == "tool" and "outcome is unknown" in texts[4][1]
        assert len(texts) == 6
    dsh("verify", "s", "--store", store)


def test_a_resume_after_a_kill_between_calls_sends_the_tool_result_once(tmp_path: Path) -> None:
    """The checkpoint after the tools step never landed, the tool result is in the pending
    writes of the one before and on dsh's surface: ``invoke(None)`` (LangGraph applies the
    pending writes) sends it once, as ``invoke(new input)`` (LangGraph discards them) does."""
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    with ScriptedServer() as server:
        server.add(Stream(openai_reply(tool_calls=[READ])), Stall([]))
        sigkill_when_ready([str(CHILD), "langgraph", store, "s", server.base_url + "/v1",
                            str(tmp_path / "ready"), "late"],
                           lambda: len(server.requests) >= 2)
        killed_requests = len(server.requests)
        server.add(Stream(openai_reply("It read app.toml.")))
        run("langgraph", store, "s", server.base_url + "/v1", None)
        sent = server.requests[killed_requests]["messages"]
    assert _texts(sent) == [("user", PROMPT), ("call", "read_file"),
                            ("tool", "contents of app.toml")]
    dsh("verify", "s", "--store", store)

"""SIGKILL inside an SDK tool body (a real child process), then the next run on the session.

The next run must succeed on a valid input history (every call answered exactly once), and
the repair dsh appended must be visible in ``dsh show``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, Runner

from dsh.adapters.openai_agents import DshSession
from tests.adapters.conftest import dsh, dsh_messages, sigkill_when_ready
from tests.adapters.sdk_model import ScriptedModel, text_message

CHILD = Path(__file__).with_name("crash_child.py")


def kill_child_when_ready(tmp_path: Path, store: str, session_id: str, mode: str) -> None:
    ready = tmp_path / f"{session_id}.ready"
    sigkill_when_ready([str(CHILD), store, session_id, mode, str(ready)], ready)


def answered_once(items: list[dict[str, Any]]) -> None:
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    outputs = Counter(i["call_id"] for i in items if i.get("type") == "function_call_output")
    assert calls, "the history has tool calls"
    assert all(outputs[c] == 1 for c in calls), (calls, outputs)
    assert set(outputs) == set(calls)


def next_run(store: str, session_id: str) -> tuple[list[Any], list[dict[str, Any]]]:
    async def body() -> tuple[list[Any], list[dict[str, Any]]]:
        session = DshSession(session_id, store)
        model = ScriptedModel()
        model.script([text_message("Not deployed: I will check the state first.")])
        result = await Runner.run(Agent(name="ops", model=model), "Did it deploy?",
                                  session=session)
        assert result.final_output == "Not deployed: I will check the state first."
        items = await session.get_items()
        session.close()
        return model.inputs[-1], items
    return asyncio.run(body())


@pytest.mark.parametrize("backend", ["sqlite", "jsonl"])
def test_kill_inside_a_tool_body_then_the_next_run(backend: str, tmp_path: Path) -> None:
    store = (f"sqlite:///{tmp_path / 'sessions.db'}" if backend == "sqlite"
             else f"jsonl:///{tmp_path / 'logs'}")
    kill_child_when_ready(tmp_path, store, "ops", "tool")
    sent, items = next_run(store, "ops")
    # what survived: the prompt, the first step (read_file and its output); the killed
    # step's call was never handed to the session by the SDK; then the new prompt and reply
    assert sent[0]["content"] == "Read app.toml, then deploy to prod"
    assert sent[-1]["content"] == "Did it deploy?"
    answered_once(sent)
    assert [i.get("type", "message") for i in items] == [
        "message", "function_call", "function_call_output", "message", "message"]
    shown = dsh("show", "ops", "--store", store)
    assert "turn 1 interrupted; closed by crash repair" in shown
    assert "contents of app.toml" in shown
    dsh("verify", "ops", "--store", store)


def test_kill_with_a_call_recorded_and_unanswered(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    kill_child_when_ready(tmp_path, store, "rm", "items")
    sent, items = next_run(store, "rm")
    answered_once(sent)
    repaired = [i for i in sent if i.get("type") == "function_call_output"]
    assert len(repaired) == 1 and repaired[0]["call_id"] == "call_rm"
    assert "outcome is unknown" in repaired[0]["output"]
    assert items[:2] == [{"role": "user", "content": "Delete the cache"},
                         {"type": "function_call", "call_id": "call_rm", "name": "rm",
                          "arguments": "{\"path\": \"cache\"}"}]
    shown = dsh("show", "rm", "--store", store)
    assert "REPAIRED (TOOL_OUTCOME_UNKNOWN)" in shown
    assert "turn 1 interrupted; closed by crash repair" in shown
    roles = [m["role"] for m in dsh_messages("rm", store)]
    assert roles == ["user", "assistant", "tool", "user", "assistant"]


def test_a_clean_close_with_a_call_unanswered_reads_as_outcome_unknown(tmp_path: Path) -> None:
    """Not only a kill: ``close()`` with a call still pending leaves it answered on reopen.

    The model API needs an output for every call, so the next open closes the call with an
    "outcome unknown" result, as after a crash (docs/adapters.md).
    """
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    call = {"type": "function_call", "call_id": "call_rm", "name": "rm",
            "arguments": "{\"path\": \"cache\"}"}

    async def first() -> None:
        session = DshSession("rm", store)
        await session.add_items([{"role": "user", "content": "Delete the cache"}, call])
        session.close()  # a clean close, the call never answered

    asyncio.run(first())
    sent, items = next_run(store, "rm")
    answered_once(sent)
    repaired = [i for i in sent if i.get("type") == "function_call_output"]
    assert [i["call_id"] for i in repaired] == ["call_rm"]
    assert "outcome is unknown" in repaired[0]["output"]
    assert items[:2] == [{"role": "user", "content": "Delete the cache"}, call]
    dsh("verify", "rm", "--store", store)

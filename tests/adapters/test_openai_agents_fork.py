"""``dsh fork`` of an SDK session, then both branches continue under the SDK."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, Runner, function_tool

from dsh.adapters.openai_agents import DshSession
from tests.adapters.conftest import dsh, dsh_events
from tests.adapters.sdk_model import ScriptedModel, function_call, text_message


@function_tool
def count_lines(path: str) -> str:
    """Count the lines of a file."""
    return f"{path}: 42 lines"


async def turn(store: str, session_id: str, prompt: str, *outputs: list[Any]
               ) -> tuple[list[Any], list[Any]]:
    session = DshSession(session_id, store)
    model = ScriptedModel()
    model.script(*outputs)
    await Runner.run(Agent(name="t", model=model, tools=[count_lines]), prompt, session=session)
    items = await session.get_items()
    session.close()
    return model.inputs[-1], items


def test_fork_then_continue_both_branches(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    asyncio.run(turn(store, "trunk", "How long is a.py?",
                     [function_call("count_lines", {"path": "a.py"}, "c1")],
                     [text_message("42 lines.")]))
    asyncio.run(turn(store, "trunk", "And b.py?", [text_message("I did not look.")]))
    first_end = next(e["seq"] for e in dsh_events("trunk", store) if e["type"] == "turn/end")
    out = dsh("fork", "trunk", "--at", str(first_end), "--as", "branch", "--store", store)
    assert "branch" in out

    sent, branch_items = asyncio.run(turn(store, "branch", "Summarise.",
                                          [text_message("a.py has 42 lines.")]))
    # the branch saw turn 1 only, then its own prompt
    assert [i.get("content") for i in sent if i.get("role") == "user"] == [
        "How long is a.py?", "Summarise."]
    assert [i.get("type", "message") for i in branch_items] == [
        "message", "function_call", "function_call_output", "message", "message", "message"]

    sent, trunk_items = asyncio.run(turn(store, "trunk", "Thanks.", [text_message("Welcome.")]))
    assert [i.get("content") for i in sent if i.get("role") == "user"] == [
        "How long is a.py?", "And b.py?", "Thanks."]
    assert len(trunk_items) == 8
    assert trunk_items[:4] == branch_items[:4]  # the shared prefix, item for item
    shown = dsh("show", "branch", "--store", store)
    assert "Summarise." in shown and "And b.py?" not in shown
    for sid in ("trunk", "branch"):
        dsh("verify", sid, "--store", store)


def test_fork_inside_a_tool_call_closes_it_for_the_branch(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    asyncio.run(turn(store, "trunk", "How long is a.py?",
                     [function_call("count_lines", {"path": "a.py"}, "c1")],
                     [text_message("42 lines.")]))
    call_seq = next(e["seq"] for e in dsh_events("trunk", store) if e["type"] == "tool/call")
    dsh("fork", "trunk", "--at", str(call_seq), "--as", "mid", "--store", store)
    sent, items = asyncio.run(turn(store, "mid", "Try again.", [text_message("Retrying.")]))
    outputs = [i for i in sent if i.get("type") == "function_call_output"]
    assert len(outputs) == 1 and outputs[0]["call_id"] == "c1"
    assert outputs[0]["output"] != "a.py: 42 lines"  # the branch never saw the parent's result
    assert items[-1]["content"][0]["text"] == "Retrying."
    dsh("verify", "mid", "--store", store)

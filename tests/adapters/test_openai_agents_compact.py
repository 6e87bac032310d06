"""``dsh compact`` of an SDK session: the SDK then reads the checkpoint, the log keeps all."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("agents")

from agents import Agent, Runner

from dsh.adapters.openai_agents import DshSession
from tests.adapters.conftest import dsh, dsh_events
from tests.adapters.sdk_model import ScriptedModel, text_message


def test_compacted_session_reads_back_the_checkpoint(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"

    async def fill() -> None:
        session = DshSession("long", store)
        for n in range(12):
            await session.add_items([
                {"role": "user", "content": f"question {n}: " + "context " * 60},
                {"type": "function_call", "call_id": f"c{n}", "name": "grep",
                 "arguments": "{}"},
                {"type": "function_call_output", "call_id": f"c{n}", "output": "hit " * 200},
                {"role": "assistant", "content": f"answer {n}"}])
        session.close()
    asyncio.run(fill())
    events_before = dsh_events("long", store)
    assert "compacted" in dsh("compact", "long", "--store", store)

    async def next_turn() -> list[dict[str, object]]:
        session = DshSession("long", store)
        model = ScriptedModel()
        model.script([text_message("Continuing.")])
        result = await Runner.run(Agent(name="t", model=model), "Go on.", session=session)
        assert result.final_output == "Continuing."
        session.close()
        return model.inputs[-1]

    sent = asyncio.run(next_turn())
    # the model gets the checkpoint (a user message) instead of the shadowed turns
    assert len(sent) < 12 * 4
    assert sent[0]["role"] == "user" and "checkpoint" in str(sent[0]["content"])
    assert sent[-1] == {"role": "user", "content": "Go on."}
    assert not any(i.get("type") == "function_call_output" and
                   not any(c.get("call_id") == i["call_id"] for c in sent
                           if c.get("type") == "function_call") for i in sent)
    # nothing committed was lost or changed: the old events are a prefix of the log
    assert dsh_events("long", store)[:len(events_before)] == events_before
    assert "question 0" in dsh("show", "long", "--store", store)
    dsh("verify", "long", "--store", store)

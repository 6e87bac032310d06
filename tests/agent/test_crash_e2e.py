"""SIGKILL end to end: a child process runs the real loop and is killed at a failpoint; a fresh
process resumes and continues (docs/agent.md#durability-checkpoints crash scenarios;
docs/rules.md#resume).

Failpoints: ``request`` (the provider writes the marker at dispatch and hangs), ``stream`` (after
three streamed chunks), ``tool`` (inside a tool body), ``between`` (right after a tool result is
committed, before the next request). The parent polls the marker's content, SIGKILLs the child,
checks the signal, then resumes on JSONL and SQLite.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh._verify import verify_events
from dsh.agent import Agent, ScriptedProvider, ScriptedReply

CHILD = textwrap.dedent('''
    import asyncio, sys, time
    from pathlib import Path
    import dsh
    from dsh.agent import ScriptedCall, ScriptedProvider, ScriptedReply, ScriptedStall, tool

    url, point, marker = sys.argv[1:4]

    def mark(text):
        Path(marker).write_text(text)

    @tool
    def hang() -> str:
        """Writes the marker, then never returns."""
        mark("tool")
        time.sleep(3600)
        return "never"

    @tool
    def quick() -> str:
        """Answers at once."""
        return "quick result"

    class MidStream:
        async def stream(self, request):
            yield {"type": "block-start", "index": 0, "blockType": "text"}
            yield {"type": "text-delta", "index": 0, "text": "Half "}
            yield {"type": "text-delta", "index": 0, "text": "an answer"}
            mark("stream")
            await asyncio.Event().wait()

    call = lambda name: ScriptedReply(text="working", tool_calls=(ScriptedCall(name=name),))
    providers = {
        "request": lambda: ScriptedProvider([ScriptedStall()],
                                            on_request=lambda r: mark("request")),
        "stream": MidStream,
        "tool": lambda: ScriptedProvider([call("hang")]),
        "between": lambda: ScriptedProvider([call("quick"), ScriptedStall()]),
    }

    async def main():
        store = dsh.open(url)
        agent = await store.agent("crash", provider=providers[point](), tools=[hang, quick],
                                  config={"provider": "scripted", "model": "m1"})
        if point == "between":
            def stop(session, event):
                if event["type"] == "tool/result":
                    mark("between")
                    time.sleep(3600)  # the loop is frozen right after the result committed
            agent.session.observe(stop)
        await agent.run("please work")

    asyncio.run(main())
''')

POINTS = ["request", "stream", "tool", "between"]


def _kill_at(url: str, point: str, tmp_path: Path) -> None:
    marker = tmp_path / f"marker-{point}"
    child = subprocess.Popen([sys.executable, "-c", CHILD, url, point, str(marker)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while not (marker.exists() and marker.read_text() == point):
            if child.poll() is not None:
                raise AssertionError(f"child exited {child.returncode} before the failpoint: "
                                     f"{child.stderr.read().decode() if child.stderr else ''}")
            if time.monotonic() > deadline:
                raise AssertionError(f"failpoint {point} not reached")
            time.sleep(0.01)  # polling the marker, not waiting for a guess
        child.send_signal(signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        for pipe in (child.stdout, child.stderr):
            if pipe is not None:
                pipe.close()
    assert child.returncode == -signal.SIGKILL


def _url(scheme: str, tmp_path: Path) -> str:
    return f"jsonl://{tmp_path}/store" if scheme == "jsonl" else f"sqlite://{tmp_path}/s.db"


def _types(events: Any) -> list[str]:
    return [e["type"] for e in events]


@pytest.mark.parametrize("scheme", ["jsonl", "sqlite"])
@pytest.mark.parametrize("point", POINTS)
def test_sigkill_then_resume_matches_the_crash_scenarios(tmp_path: Path, scheme: str,
                                                         point: str) -> None:
    url = _url(scheme, tmp_path)
    _kill_at(url, point, tmp_path)
    with dsh.open(url) as store:
        stored = store.read("crash")
        events = [*stored.stored_events, *stored.closers]
        kinds = _types(events)
        prefix = ["agent/inbox/spliced", "turn/start", "agent/inbox/spliced", "step/start",
                  "user/message", "request/header", "request/context"]
        if point == "request":  # scenario 1: exactly these events
            assert kinds == [*prefix, "step/end", "turn/end"]
        elif point == "stream":
            assert kinds[:len(prefix)] == prefix and kinds[-2:] == ["step/end", "turn/end"]
            assert set(kinds[len(prefix):-2]) <= {"assistant/chunk"}
        else:
            assert kinds[:len(prefix)] == prefix
            assert "assistant/message" in kinds and "tool/call" in kinds
            result = next(e for e in events if e["type"] == "tool/result")
            call = next(e for e in events if e["type"] == "tool/call")
            assert result["sourceEventSeqs"] == [call["seq"]]
            if point == "tool":  # scenario 2: the repair's TOOL_OUTCOME_UNKNOWN result
                assert result in stored.closers
                assert result["data"]["error"] == {"name": "ToolOutcomeUnknownError",
                                                   "code": "TOOL_OUTCOME_UNKNOWN"}
                text = result["data"]["message"]["content"][0]["content"][0]["text"]
                assert "retry blindly" in text and "read-only or idempotent" in text
        assert events[-1]["data"]["reason"] == {"kind": "interrupted"}
        assert verify_events(events, header=stored.header) == []

        provider = ScriptedProvider([ScriptedReply(text="continuing")])

        async def resume_and_continue() -> Agent:
            agent = await store.agent("crash", provider=provider,
                                      config={"provider": "scripted", "model": "m1"})
            assert agent.session.events[len(events)]["type"] == "session/end-seed"
            await agent.run("go on")
            return agent

        agent = asyncio.run(resume_and_continue())
        assert agent.invariant_stats.checks == 1
        request = provider.requests[0]
        assert request.messages[0]["content"] == [{"type": "text", "text": "please work"}]
        assert request.messages[-1]["content"] == [{"type": "text", "text": "go on"}]
        if point == "tool":
            assert request.messages[2]["source"] == {"kind": "tool", "callId": "call_0_0"}
        turns = [e["data"]["turn"] for e in agent.session.events if e["type"] == "turn/start"]
        assert turns == [1, 2]
        store.flush(agent.session)
        final = store.read(agent.session.id)
        assert verify_events(final.stored_events, header=final.header) == []

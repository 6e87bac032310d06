"""The agent loop's own cost: ms per step at zero model latency, and the invariant's cost.

Run: ``python -m bench.bench_agent [--turns 200] [--runs 5] [--nodes 1000,100000]
[--backend all|memory,jsonl,sqlite] [--no-peer] [--dir DIR]``.

* **loop**: ``dsh.agent.Agent`` with the ``ScriptedProvider`` (no latency) runs ``--turns``
  turns of two steps each (step 1: the model calls one tool; step 2: it answers). Every step
  does the durable checkpoints of persistence spec §6: a flush before every dispatch and before
  every tool body (3 per turn, plus the flush after ``turn/end``). ``memory`` has no
  persistence (the loop's pure overhead). Reported: ms per step, durable flushes per step.
* **peer**: the OpenAI Agents SDK ``Runner.run`` with a ``SQLiteSession`` (a file, like ours)
  and an equivalent zero-latency fake model (one function call, then a text answer) on the same
  turns, tracing off. The SDK writes the session once per turn (no per-step barrier).
* **invariant**: the request == projection check (spec §8.3) on a session with N surface
  nodes: the exact fast path (same derived tuple, same surface generation and node count), the
  full path (element-wise comparison), and building the request's message tuple.

Each figure is the median over ``--runs`` fresh processes, ours and the peer interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_write import header_lines, medians, run_child, select
from bench.workloads import peak_rss_mb

BACKENDS = ("memory", "jsonl", "sqlite")
MODULE = "bench.bench_agent"


def _url(backend: str, root: Path) -> str | None:
    if backend == "memory":
        return None
    return f"jsonl://{root}/store" if backend == "jsonl" else f"sqlite://{root}/store.db"


# --- children --------------------------------------------------------------------------------


def child_loop(backend: str, turns: int, parent_dir: str | None) -> dict[str, Any]:
    from dsh.agent import Agent, ScriptedCall, ScriptedProvider, ScriptedReply, tool
    from dsh.persistence import Persistence, open_backend
    from dsh.session import SessionStore

    @tool(parallel_safe=True)
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: First addend.
            b: Second addend.
        """
        return a + b

    root = Path(tempfile.mkdtemp(prefix="dsh-bench-agent-", dir=parent_dir))
    url = _url(backend, root)
    persistence = Persistence(open_backend(url)) if url else None
    store = SessionStore(persistence=persistence)
    flushes = 0
    if persistence is not None:
        def count(session: Any) -> None:
            nonlocal flushes
            flushes += 1

        store.observe(type("Counter", (), {"on_flush": staticmethod(count)})())
    script = []
    for turn in range(turns):
        script.append(ScriptedReply(text="adding", tool_calls=(
            ScriptedCall(name="add", arguments={"a": turn, "b": 1}, id=f"c{turn}"),)))
        script.append(ScriptedReply(text=f"it is {turn + 1}"))
    provider = ScriptedProvider(script)
    agent = Agent.create(store, provider, session_id="bench",
                         config={"provider": "scripted", "model": "m"}, tools=[add])

    async def drive() -> float:
        t0 = time.perf_counter()
        for turn in range(turns):
            await agent.run(f"what is {turn} + 1?")
        return time.perf_counter() - t0

    try:
        elapsed = asyncio.run(drive())
        steps = 2 * turns
        return {"ms_per_step": elapsed * 1000 / steps, "flushes_per_step": flushes / steps,
                "events": agent.session.seq, "rss": peak_rss_mb()}
    finally:
        if persistence is not None:
            persistence.close()
        shutil.rmtree(root, ignore_errors=True)


def child_peer(turns: int, parent_dir: str | None) -> dict[str, Any]:
    from agents import Agent, Runner, SQLiteSession, function_tool, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    set_tracing_disabled(True)

    class FakeModel(Model):
        """Zero latency: a function call on odd requests, a text answer on even ones."""

        def __init__(self) -> None:
            self.calls = 0

        async def get_response(self, system_instructions: Any, input: Any, model_settings: Any,
                               tools: Any, output_schema: Any, handoffs: Any, tracing: Any, *,
                               previous_response_id: Any = None, conversation_id: Any = None,
                               prompt: Any = None) -> ModelResponse:
            self.calls += 1
            turn = (self.calls - 1) // 2
            if self.calls % 2:
                item: Any = ResponseFunctionToolCall(
                    type="function_call", name="add", call_id=f"c{turn}", id=f"fc{turn}",
                    arguments=json.dumps({"a": turn, "b": 1}))
            else:
                item = ResponseOutputMessage(
                    id=f"m{turn}", type="message", role="assistant", status="completed",
                    content=[ResponseOutputText(type="output_text", text=f"it is {turn + 1}",
                                                annotations=[])])
            return ModelResponse(output=[item], usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    root = Path(tempfile.mkdtemp(prefix="dsh-bench-agent-peer-", dir=parent_dir))
    session = SQLiteSession("bench", str(root / "sdk.db"))
    agent = Agent(name="bench", model=FakeModel(), tools=[add])

    async def drive() -> float:
        t0 = time.perf_counter()
        for turn in range(turns):
            await Runner.run(agent, f"what is {turn} + 1?", session=session)
        return time.perf_counter() - t0

    try:
        elapsed = asyncio.run(drive())
        return {"ms_per_step": elapsed * 1000 / (2 * turns), "rss": peak_rss_mb()}
    finally:
        session.close()
        shutil.rmtree(root, ignore_errors=True)


def child_invariant(nodes: int) -> dict[str, Any]:
    from dsh._messages import create_assistant_message, create_user_message
    from dsh.agent import Agent, LlmRequest, ScriptedProvider
    from dsh.agent._loop import _Built
    from dsh.session import SessionStore

    session = SessionStore().create("bench")
    for index in range(nodes // 2):
        session.append("user/message", create_user_message(
            {"content": [{"type": "text", "text": f"q{index}"}], "source": {"kind": "user"}}),
            surface_op="append")
        session.append("assistant/message", {"turn": 1, "step": 1, "message":
                       create_assistant_message(content=[{"type": "text", "text": f"a{index}"}],
                                                provider="p", model="m")}, surface_op="append")
    agent = Agent(session, ScriptedProvider(), config={"provider": "p", "model": "m"})
    with agent.recorder.turn() as turn, turn.step() as step:
        header = step.request({"provider": "p", "model": "m"})
        repeats = max(5, min(2000, 2_000_000 // max(nodes, 1)))

        def timed(fn: Any) -> float:
            t0 = time.perf_counter_ns()
            for _ in range(repeats):
                fn()
            return (time.perf_counter_ns() - t0) / repeats / 1000

        build_us = timed(lambda: tuple(session.derive_messages()))
        messages = tuple(session.derive_messages())
        surface = session.surface
        built = _Built(messages, surface.replace_generation, len(surface.nodes))
        request = LlmRequest(session_id="bench", messages=messages, header=header)
        copy = LlmRequest(session_id="bench", messages=tuple(list(messages)), header=header)
        fast_us = timed(lambda: agent.check_request(request, built))
        full_us = timed(lambda: agent.check_request(copy))
    return {"nodes": len(session.surface.nodes), "build_us": build_us, "fast_us": fast_us,
            "full_us": full_us}


# --- parent ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nodes", default="1000,100000")
    parser.add_argument("--backend", default="all")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--child", nargs="*", default=None)
    args = parser.parse_args(argv)
    if args.child is not None:
        kind, *rest = args.child
        if kind == "loop":
            out = child_loop(rest[0], args.turns, args.dir)
        elif kind == "peer":
            out = child_peer(args.turns, args.dir)
        else:
            out = child_invariant(int(rest[0]))
        print(json.dumps(out))
        return
    backends = select(args.backend, BACKENDS)
    peer = not args.no_peer
    if peer:
        try:
            import agents  # noqa: F401
        except ImportError:
            print("(openai-agents not installed: pip install -e '.[bench]'; peer column "
                  "skipped)", file=sys.stderr)
            peer = False
    common = ["--turns", str(args.turns)] + (["--dir", args.dir] if args.dir else [])
    loops: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
    peers: list[dict[str, Any]] = []
    for _ in range(args.runs):  # interleaved: ours and the peer see the same machine state
        for backend in backends:
            loops[backend].append(run_child(MODULE, ["loop", backend, *common]))
        if peer:
            peers.append(run_child(MODULE, ["peer", *common]))
    sizes = [int(n) for n in args.nodes.split(",") if n]
    checks = {n: medians([run_child(MODULE, ["invariant", str(n)]) for _ in range(args.runs)])
              for n in sizes}

    header_lines("bench_agent: agent loop overhead per step (zero-latency model)")
    peer_ms = statistics.median(p["ms_per_step"] for p in peers) if peers else None
    print(f"{args.turns} turns × 2 steps (tool call, then answer); median of {args.runs} fresh "
          f"processes each.")
    print()
    print("| loop | store | durable flushes / step | ms / step | OpenAI Agents SDK Runner + "
          "SQLiteSession ms / step | ratio |")
    print("|---|---|---|---|---|---|")
    for backend in backends:
        row = medians(loops[backend])
        theirs = f"{peer_ms:.3f}" if peer_ms is not None else "n/a"
        ratio = "n/a"
        if peer_ms is not None:
            ours = row["ms_per_step"]
            ratio = f"{peer_ms / ours:.2f}× {'less' if peer_ms > ours else 'more'} than the SDK"
        print(f"| dsh.agent | {backend} | {row['flushes_per_step']:.2f} | "
              f"{row['ms_per_step']:.3f} | {theirs} | {ratio} |")
    print()
    print("| surface nodes | build request messages µs | invariant fast path µs | invariant full "
          "path µs |")
    print("|---|---|---|---|")
    for n in sizes:
        row = checks[n]
        print(f"| {int(row['nodes'])} | {row['build_us']:.1f} | {row['fast_us']:.2f} | "
              f"{row['full_us']:.1f} |")


if __name__ == "__main__":
    main()

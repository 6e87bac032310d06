"""An agent run long enough to compact twice, against a server that imitates prompt caching.

Shared by ``tests/agent/providers/test_cache_keeping.py`` and ``bench/bench_cache.py``. The
model is a :class:`~tests.agent.providers.servers.ScriptedServer` whose replies are built per
request (:class:`~tests.agent.providers.servers.Dynamic`): a user prompt gets a tool call, a
tool result gets a short answer, the compaction instruction gets a checkpoint text; every
reply's usage comes from a :class:`~tests.agent.providers.servers.PrefixCache`. The tool
returns ~2 KB of text, so the context grows until automatic compaction (the model summarizer)
runs, twice.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dsh
from dsh.agent import Agent, ToolContext, tool
from dsh.agent.providers import AnthropicProvider, OpenAIChatProvider
from dsh.compaction import COMPACTION_INSTRUCTION, CompactionPolicy
from dsh.transcript import cached_share
from tests.agent.providers.servers import (
    Dynamic,
    PrefixCache,
    ScriptedServer,
    Stream,
    anthropic_reply,
    openai_reply,
)

SYSTEM = "You are a careful assistant. " * 20
SUMMARY = "\n\n".join(f"## {name}\n- the notes read so far, item {i}" for i, name in enumerate(
    ("Primary Request and Intent", "Key Technical Concepts", "Files and Code",
     "Errors and Fixes", "Pending Jobs", "Current Work", "Next Step", "Critical Context")))


@tool(name="read_notes", effect="read_only", parallel_safe=True)
def read_notes(page: int, ctx: ToolContext) -> str:
    """Read one page of the notes.

    Args:
        page: Page number.
    """
    return "\n".join(f"page {page} line {n}: " + "lorem ipsum dolor sit amet " * 2
                     for n in range(30))


def _last_text(body: Any) -> str:
    messages = body.get("messages") or []
    if not messages:
        return ""
    return json.dumps(messages[-1]["content"], ensure_ascii=False)


def _reply(wire: str, cache: PrefixCache, body: Any) -> Stream:
    last = _last_text(body)
    is_openai = wire == "openai"
    usage = cache.openai_usage(body) if is_openai else cache.anthropic_usage(body)
    make = openai_reply if is_openai else anthropic_reply
    calls: dict[str, Any] = {}
    if "Write a checkpoint" in last or "Write that checkpoint" in last or \
            COMPACTION_INSTRUCTION[:40] in last:
        text = SUMMARY
    elif ("tool_call_id" in json.dumps(body["messages"][-1])
          or "tool_result" in last):
        text = "Noted."
    else:
        page = len(body["messages"])
        text = ""
        call = (f"call_{page}", "read_notes", json.dumps({"page": page}))
        calls = {"tool_calls" if is_openai else "tool_uses": [call]}
    return Stream(make(text, usage=usage, **calls))


@dataclass
class CacheRun:
    """What one run sent and what the cache served."""

    compactions: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total_share(self) -> float:
        read = sum(r["usage"].get("cacheReadTokens", 0) for r in self.requests)
        total = sum(sum(r["usage"].get(k, 0) for k in ("inputTokens", "cacheReadTokens",
                                                         "cacheWriteTokens"))
                    for r in self.requests)
        return read / total if total else 0.0


def run_cache(wire: str, tmp_path: Path, *, keep_cache: bool, turns: int = 48,
              window: int = 20_000) -> CacheRun:
    """Run ``turns`` turns (a tool call and an answer each) and report the cache shares.

    Returns the cached share of every compaction's summary request and of the first request
    after it, and of every step request.
    """
    cache = PrefixCache()
    replies = [Dynamic(lambda body: _reply(wire, cache, body)) for _ in range(4 * turns + 8)]
    url = f"sqlite:///{tmp_path}/{wire}-{keep_cache}.db"
    with ScriptedServer(replies) as server, dsh.open(url) as store:
        provider: Any
        if wire == "openai":
            provider = OpenAIChatProvider(model="local-model", api_key="k",
                                          base_url=server.base_url, name="openai-compatible")
            model = "local-model"
        else:
            provider = AnthropicProvider(model="claude-test", api_key="k",
                                         base_url=server.base_url)
            model = "claude-test"
        agent = Agent.create(
            store.sessions, provider, session_id="cache", system=SYSTEM, tools=[read_notes],
            config={"provider": provider.name, "model": model}, context_window=window,
            summarizer="model", max_steps=8,
            compaction=CompactionPolicy(threshold_ratio=0.8, retain_ratio=0.5,
                                        keep_cache=keep_cache))

        async def go() -> None:
            try:
                for turn in range(turns):
                    await agent.run(f"Read the next page of the notes ({turn}).")
            finally:
                await agent.aclose()
                await provider.aclose()

        asyncio.run(go())
        events = list(agent.session.events)
    out = CacheRun()
    after: dict[str, Any] | None = None
    for event in events:
        kind = event["type"]
        data = event["data"]
        if kind == "compaction/summary":
            after = {"summaryShare": cached_share(data.get("usage")),
                     "summaryRequest": data.get("request"), "nextShare": None}
            out.compactions.append(after)
        elif kind == "assistant/message" and data.get("usage") is not None:
            out.requests.append({"seq": event["seq"], "usage": dict(data["usage"]),
                                 "request": data.get("request")})
            if after is not None and after["nextShare"] is None:
                after["nextShare"] = cached_share(data["usage"])
                after["nextRequest"] = data.get("request")
                after = None
    return out

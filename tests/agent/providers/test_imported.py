"""Imported sessions continued on another provider: the receiver gets a valid request.

A Claude Code session continues on an OpenAI-compatible server, a Codex session on an Anthropic
one. The request each server receives must pass the receiver's rules (tool pairing, role
alternation) and carry no thinking signed by another model; its messages are the session's
model view at dispatch in the receiver's format.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh.agent import LlmRequest
from dsh.agent.providers import AnthropicProvider, OpenAIChatProvider
from dsh.interop._export import to_anthropic, to_openai, validate_conversation
from tests.agent.providers.helpers import plain, without_cache_mark
from tests.agent.providers.servers import ScriptedServer, Stream, anthropic_reply, openai_reply

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "src" / "dsh" / "examples" / "transcripts"
CORPUS = REPO / "tests" / "corpus"


def import_into(tmp_path: Path, transcript: Path) -> tuple[str, str]:
    url = f"sqlite:///{tmp_path}/sessions.db"
    env = {**os.environ, "DSH_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)}
    subprocess.run([sys.executable, "-m", "dsh.cli", "import", str(transcript), "--store", url],
                   env=env, check=True, capture_output=True, timeout=120)
    out = subprocess.run([sys.executable, "-m", "dsh.cli", "ls", "--store", url, "--json"],
                         env=env, check=True, capture_output=True, text=True, timeout=120)
    rows = json.loads(out.stdout)
    rows = rows if isinstance(rows, list) else rows.get("sessions", rows)
    return url, str(rows[0]["id"])


def continue_on(url: str, session_id: str, provider: Any, model: str) -> list[Any]:
    """Resume the imported session on ``provider``, run one turn, return the dispatched views."""
    views: list[Any] = []

    def hook(request: LlmRequest) -> LlmRequest:
        views.append([plain(m) for m in request.messages])
        return request

    async def go() -> None:
        with dsh.open(url) as store:
            agent = await store.agent(session_id, provider=provider, request_hook=hook,
                                      config={"provider": provider.name, "model": model})
            try:
                await agent.run("Please continue where we left off.")
            finally:
                await provider.aclose()

    asyncio.run(go())
    return views


@pytest.mark.parametrize("name", ["interrupted.jsonl", "long-debugging.jsonl",
                                  "compacted.jsonl"])
def test_claude_code_session_continues_on_an_openai_compatible_server(
        name: str, tmp_path: Path) -> None:
    url, session_id = import_into(tmp_path, EXAMPLES / "claude-code" / name)
    with ScriptedServer([Stream(openai_reply("Continuing."))]) as server:
        provider = OpenAIChatProvider(model="qwen-local", api_key="none", name="openai-compatible",
                                      base_url=server.base_url)
        views = continue_on(url, session_id, provider, "qwen-local")
    (body,) = server.requests
    assert validate_conversation(body["messages"], "openai") == []
    assert body["messages"] == to_openai(views[0])
    assert body["messages"][-1] == {"role": "user",
                                    "content": "Please continue where we left off."}
    assert not any("reasoning_content" in m for m in body["messages"])


@pytest.mark.parametrize("name", ["rollout-compacted-aborted.jsonl", "legacy-interrupted.jsonl"])
def test_codex_session_continues_on_an_anthropic_server(name: str, tmp_path: Path) -> None:
    url, session_id = import_into(tmp_path, EXAMPLES / "codex" / name)
    with ScriptedServer([Stream(anthropic_reply("Continuing."))]) as server:
        provider = AnthropicProvider(model="claude-test", api_key="k", base_url=server.base_url)
        views = continue_on(url, session_id, provider, "claude-test")
    (body,) = server.requests
    assert validate_conversation(body, "anthropic") == []
    assert without_cache_mark(body["messages"]) == to_anthropic(views[0])["messages"]
    blocks = [b for m in body["messages"] for b in m["content"] if isinstance(b, dict)]
    assert not [b for b in blocks if b["type"] in ("thinking", "redacted_thinking")]
    assert [b["type"] for b in body["messages"][-1]["content"]][-1] == "text"


def test_claude_thinking_is_replayed_only_to_the_model_that_signed_it(tmp_path: Path) -> None:
    transcript = CORPUS / "claude-code" / "spotter-tool-heavy-queued-interrupts.jsonl"
    url, session_id = import_into(tmp_path, transcript)
    sent: dict[str, Any] = {}
    for model in ("claude-opus-4-6", "claude-other"):
        with ScriptedServer([Stream(anthropic_reply("ok", model=model))]) as server:
            provider = AnthropicProvider(model=model, api_key="k", base_url=server.base_url)
            views = continue_on(url, session_id, provider, model)
        (body,) = server.requests
        assert validate_conversation(body, "anthropic") == []
        assert without_cache_mark(body["messages"]) == to_anthropic(
            views[0], target_model=model)["messages"]
        sent[model] = [b for m in body["messages"] for b in m["content"]
                       if isinstance(b, dict) and b["type"] in ("thinking", "redacted_thinking")]
    assert sent["claude-opus-4-6"]  # the signing model gets its thinking back
    assert sent["claude-other"] == []  # any other model gets none

"""The agent loop on real providers: the official SDKs over HTTP against scripted servers.

Every test checks the promise that ties the log to the wire: each request the server received
has ``messages`` equal to the session's model view at dispatch, exported in that provider's
format (the loop's request hook records the view it dispatched; the loop itself checks that
view against the log before each call).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh._errors import LlmFailureError
from dsh._verify import verify_events
from dsh.agent import Agent, LlmRequest, RetryPolicy
from dsh.agent._builtin import workspace_tools
from dsh.agent.providers import (
    AnthropicProvider,
    OpenAIChatProvider,
    OpenAIResponsesProvider,
    provider_summarizer,
    responses_input,
)
from dsh.compaction import CompactionPolicy, acompact_now
from dsh.compaction._summarizers import COMPACTION_INSTRUCTION
from dsh.interop._export import to_anthropic, to_openai, validate_conversation
from tests.agent.providers.helpers import plain, without_cache_mark
from tests.agent.providers.servers import (
    ANTHROPIC_OVERFLOW,
    ANTHROPIC_RATE_LIMIT,
    ANTHROPIC_SERVER_ERROR,
    OPENAI_OVERFLOW,
    OPENAI_RATE_LIMIT,
    OPENAI_SERVER_ERROR,
    Behaviour,
    Cut,
    Fail,
    ScriptedServer,
    Stall,
    Stream,
    anthropic_error,
    anthropic_reply,
    openai_error,
    openai_reply,
    responses_reply,
)

SYSTEM = "You are terse."


@dataclass(frozen=True)
class Wire:
    """One provider protocol: its provider, replies, failures, and its export of a view."""

    name: str
    make: Callable[[str], Any]
    reply: Callable[..., list[Any]]
    rate_limit: Behaviour
    server_error: Behaviour
    overflow: Behaviour
    auth_error: Behaviour
    export: Callable[[list[Any], str], Any]
    model: str

    def sent(self, body: dict[str, Any]) -> Any:
        """What of a request body the export must equal."""
        if self.name == "openai":
            return body["messages"]
        if self.name == "responses":
            return {k: body[k] for k in ("instructions", "input") if k in body}
        sent = {k: body[k] for k in ("system", "messages") if k in body}
        sent["messages"] = without_cache_mark(sent["messages"])
        return sent

    def items(self, body: dict[str, Any]) -> list[Any]:
        """The conversation a request body carries: its messages, or its input items."""
        return list(body["input"] if self.name == "responses" else body["messages"])

    def text_of(self, item: Any) -> str:
        """The text of one conversation entry of a request body."""
        content = item["content"]
        return content if isinstance(content, str) else content[-1]["text"]


def _openai_export(view: list[Any], model: str) -> Any:
    return [{"role": "system", "content": SYSTEM}, *to_openai(view)]


def _anthropic_export(view: list[Any], model: str) -> Any:
    body = to_anthropic(view, target_model=model)
    system = SYSTEM + ("\n\n" + body["system"] if "system" in body else "")
    return {"system": system, "messages": body["messages"]}


OPENAI = Wire(
    "openai", lambda url: OpenAIChatProvider(model="local-model", api_key="k", base_url=url,
                                             name="openai-compatible", read_timeout_s=1.0),
    lambda text="", calls=(), **kw: openai_reply(text, tool_calls=calls, **kw),
    Fail(429, OPENAI_RATE_LIMIT, {"retry-after": "1"}), Fail(500, OPENAI_SERVER_ERROR),
    Fail(400, OPENAI_OVERFLOW),
    Fail(401, openai_error(401, "Incorrect API key provided", type_="invalid_request_error",
                           code="invalid_api_key")),
    _openai_export, "local-model")
ANTHROPIC = Wire(
    "anthropic", lambda url: AnthropicProvider(model="claude-test", api_key="k", base_url=url,
                                               read_timeout_s=1.0),
    lambda text="", calls=(), **kw: anthropic_reply(text, tool_uses=calls, **kw),
    Fail(429, ANTHROPIC_RATE_LIMIT, {"retry-after": "1"}), Fail(500, ANTHROPIC_SERVER_ERROR),
    Fail(400, ANTHROPIC_OVERFLOW),
    Fail(401, anthropic_error("authentication_error", "invalid x-api-key")),
    _anthropic_export, "claude-test")
def _responses_export(view: list[Any], model: str) -> Any:
    return {"instructions": SYSTEM, "input": responses_input(view, target_model=model)}


RESPONSES = Wire(
    "responses", lambda url: OpenAIResponsesProvider(model="gpt-test", api_key="k", base_url=url,
                                                     read_timeout_s=1.0),
    lambda text="", calls=(), **kw: responses_reply(text, tool_calls=calls, **kw),
    Fail(429, OPENAI_RATE_LIMIT, {"retry-after": "1"}), Fail(500, OPENAI_SERVER_ERROR),
    Fail(400, OPENAI_OVERFLOW),
    Fail(401, openai_error(401, "Incorrect API key provided", type_="invalid_request_error",
                           code="invalid_api_key")),
    _responses_export, "gpt-test")
WIRES = [pytest.param(OPENAI, id="openai"), pytest.param(ANTHROPIC, id="anthropic"),
         pytest.param(RESPONSES, id="responses")]


class Run:
    """An agent on a real provider, in a SQLite store, recording each dispatched view."""

    def __init__(self, wire: Wire, server: ScriptedServer, tmp_path: Path, **options: Any):
        self.wire = wire
        self.server = server
        self.store = dsh.open(f"sqlite:///{tmp_path}/sessions.db")
        self.provider = wire.make(server.base_url)
        self.views: list[list[Any]] = []
        self.delays: list[float] = []
        options.setdefault("tools", workspace_tools(tmp_path))

        def hook(request: LlmRequest) -> LlmRequest:
            self.views.append([plain(m) for m in request.messages])
            return request

        async def sleep(seconds: float) -> None:
            self.delays.append(seconds)

        self.agent = Agent.create(
            self.store.sessions, self.provider, session_id="s1", system=SYSTEM, request_hook=hook,
            sleep=sleep, config={"provider": self.provider.name, "model": wire.model},
            **options)

    def turn(self, *prompts: str) -> Any:
        """Run one turn per prompt on one event loop; return the last turn's result."""
        return asyncio.run(self._turns(prompts))

    async def _turns(self, prompts: tuple[str, ...]) -> Any:
        try:
            for prompt in prompts:
                result = await self.agent.run(prompt)
            return result
        finally:
            await self.provider.aclose()

    def assert_wire_equals_log(self) -> None:
        assert len(self.server.requests) == len(self.views)
        for body, view in zip(self.server.requests, self.views, strict=True):
            assert self.wire.sent(body) == self.wire.export(view, self.wire.model)
            if self.wire.name != "responses":
                assert validate_conversation(body["messages"], self.wire.name) == []

    def events(self, kind: str) -> list[Any]:
        return [e for e in self.agent.session.events if e["type"] == kind]

    def close(self) -> None:
        """Close the store; the log it wrote must verify."""
        session = self.agent.session
        self.store.close()
        assert verify_events(list(session.events), header=session.header) == []


@pytest.mark.parametrize("wire", WIRES)
def test_parallel_tool_calls_then_answer(wire: Wire, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha\n")
    (tmp_path / "b.txt").write_text("beta\n")
    calls = [("call_1", "read_file", '{"path": "a.txt"}'),
             ("call_2", "read_file", '{"path": "b.txt"}')]
    server = ScriptedServer([Stream(wire.reply("Reading both.", calls)),
                             Stream(wire.reply("a says alpha, b says beta"))])
    with server:
        run = Run(wire, server, tmp_path)
        result = run.turn("what do a.txt and b.txt say?")
    assert result.text == "a says alpha, b says beta"
    assert dict(result.reason) == {"kind": "completed"}
    assert [e["data"]["callId"] for e in run.events("tool/call")] == ["call_1", "call_2"]
    results = [e["data"]["message"]["content"][0] for e in run.events("tool/result")]
    assert [r["toolCallId"] for r in results] == ["call_1", "call_2"]
    assert "alpha" in results[0]["content"][0]["text"]
    usage = run.events("assistant/message")[0]["data"]["usage"]
    assert usage["inputTokens"] > 0 and usage["outputTokens"] > 0
    # The second request carries the calls and their results, in the receiver's format.
    second = wire.items(server.requests[1])
    if wire.name == "openai":
        assert [m["role"] for m in second[-3:]] == ["assistant", "tool", "tool"]
    elif wire.name == "responses":
        assert [(i.get("type"), i.get("call_id")) for i in second[-4:]] == [
            ("function_call", "call_1"), ("function_call", "call_2"),
            ("function_call_output", "call_1"), ("function_call_output", "call_2")]
    else:
        assert [b["type"] for b in second[-1]["content"]] == ["tool_result", "tool_result"]
    run.assert_wire_equals_log()
    run.close()


@pytest.mark.parametrize("wire", WIRES)
def test_failures_are_retried_and_recorded_then_the_reply_lands(wire: Wire,
                                                                tmp_path: Path) -> None:
    partial = wire.reply("this attempt is lost")
    server = ScriptedServer([wire.rate_limit, wire.server_error, Cut(partial[:4]),
                             Stall(partial[:3]), Stream(wire.reply("finally"))])
    with server:
        run = Run(wire, server, tmp_path, retry=RetryPolicy(max_retries=4))
        result = run.turn("hello")
    assert result.text == "finally"
    retries = run.events("llm/retry")
    assert [e["data"]["failure"]["code"] for e in retries] == [
        "RATE_LIMITED", "SERVER_ERROR", "NETWORK", "TIMEOUT"]
    assert retries[0]["data"]["delayMs"] == 1000  # Retry-After: 1 honoured
    assert run.delays[0] == 1.0
    (message,) = run.events("assistant/message")
    cited = message["sourceEventSeqs"]
    assert cited and min(cited) > retries[-1]["seq"]  # only the successful attempt's chunks
    assert len(server.requests) == 5
    run.assert_wire_equals_log()
    run.close()


@pytest.mark.parametrize("wire", WIRES)
def test_a_fatal_failure_ends_the_turn_with_it(wire: Wire, tmp_path: Path) -> None:
    with ScriptedServer([wire.auth_error]) as server:
        run = Run(wire, server, tmp_path)
        with pytest.raises(LlmFailureError) as info:
            run.turn("hello")
    assert info.value.code == "AUTHENTICATION"
    (end,) = run.events("turn/end")
    assert end["data"]["reason"]["kind"] == "error"
    assert end["data"]["reason"]["error"]["code"] == "AUTHENTICATION"
    assert run.events("llm/retry") == []
    run.close()


@pytest.mark.parametrize("wire", WIRES)
def test_context_overflow_compacts_then_the_retry_succeeds(wire: Wire, tmp_path: Path) -> None:
    long = "The build failed in module parser because of a missing token. " * 30
    script: list[Behaviour] = [Stream(wire.reply(f"{long} (turn {n})")) for n in range(3)]
    script += [wire.overflow, Stream(wire.reply("fits now"))]
    with ScriptedServer(script) as server:
        run = Run(wire, server, tmp_path, context_window=100_000,
                  compaction=CompactionPolicy(threshold_ratio=1.0, retain_tokens=50))
        result = run.turn(*(f"question {n}: {long}" for n in range(3)), "and now?")
    assert result.text == "fits now"
    (retry,) = run.events("llm/retry")
    assert retry["data"]["cause"] == "context-overflow"
    assert retry["data"]["failure"]["code"] == "CONTEXT_OVERFLOW"
    assert len(run.events("compaction/start")) == len(run.events("compaction/end")) == 1
    overflowed, retried = server.requests[-2:]
    assert len(wire.items(retried)) < len(wire.items(overflowed))
    run.assert_wire_equals_log()
    run.close()


@pytest.mark.parametrize("wire", WIRES)
def test_the_model_summarizer_writes_the_checkpoint(wire: Wire, tmp_path: Path) -> None:
    long = "We traced the crash to the cache eviction path in store.py. " * 30
    summary = "Summary: the crash is in cache eviction (store.py); fix pending."
    script: list[Behaviour] = [Stream(wire.reply(f"{long} ({n})")) for n in range(2)]
    script.append(Stream(wire.reply(summary)))
    with ScriptedServer(script) as server:
        run = Run(wire, server, tmp_path)
        summarizer = provider_summarizer(run.provider, provider_name=run.provider.name,
                                         model=wire.model)

        async def go() -> Any:
            try:
                for n in range(2):
                    await run.agent.run(f"question {n}: {long}")
                return await acompact_now(run.agent.session, summarizer=summarizer)
            finally:
                await run.provider.aclose()

        result = asyncio.run(go())
    assert result is not None
    asked = wire.items(server.requests[2])[-1]
    assert wire.text_of(asked) == COMPACTION_INSTRUCTION
    (recorded,) = run.events("compaction/summary")
    assert (recorded["data"]["provider"], recorded["data"]["model"]) == (run.provider.name,
                                                                         wire.model)
    view = run.agent.session.derive_messages()
    assert summary in json.dumps([plain(m) for m in view])
    run.close()


@pytest.mark.parametrize("wire", WIRES)
def test_cancelling_a_stream_records_what_was_visible_and_closes_the_connection(
        wire: Wire, tmp_path: Path) -> None:
    partial = wire.reply("Half of an answer that never ends")
    visible = 3 if wire.name == "openai" else 4  # created/role event, then two text deltas
    with ScriptedServer([Stall(partial[:visible])]) as server:
        run = Run(wire, server, tmp_path)

        async def go() -> None:
            task = asyncio.create_task(run.agent.run("start"))
            while not run.events("assistant/chunk") or not any(
                    e["data"]["chunk"]["type"] == "text-delta"
                    for e in run.events("assistant/chunk")):
                await asyncio.sleep(0.01)  # until the first streamed text is in the log
            run.agent.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await run.provider.aclose()

        asyncio.run(go())
    (message,) = run.events("assistant/message")
    assert message["data"]["interrupted"] is True
    assert message["data"]["message"]["content"][0]["type"] == "text"
    assert message["data"]["message"]["content"][0]["text"].startswith("Half")
    (end,) = run.events("turn/end")
    assert end["data"]["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}
    run.close()

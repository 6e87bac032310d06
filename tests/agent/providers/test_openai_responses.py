"""OpenAIResponsesProvider over real HTTP: the official SDK against a scripted Responses server.

The agent-loop behaviours (tool calls, retries, overflow, cancellation, request == the log's
view at dispatch) run for this provider in ``test_agent_loop.py`` beside the other two.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh._errors import LlmFailureError
from dsh.agent import Agent
from dsh.agent.providers import OpenAIResponsesProvider, responses_input
from tests.agent.providers.helpers import (
    READ_TOOL,
    assemble,
    assistant,
    drain,
    request,
    result,
    user,
)
from tests.agent.providers.servers import (
    OPENAI_OVERFLOW,
    OPENAI_RATE_LIMIT,
    OPENAI_SERVER_ERROR,
    Cut,
    Dynamic,
    Fail,
    ScriptedServer,
    Stall,
    Stream,
    responses_failed,
    responses_reply,
    responses_usage,
)


def provider(server: ScriptedServer, **kw: object) -> OpenAIResponsesProvider:
    return OpenAIResponsesProvider(model="gpt-test", api_key="sk-test",
                                   base_url=server.base_url, **kw)  # type: ignore[arg-type]


def test_text_reply_streams_as_dsh_chunks_with_usage() -> None:
    with ScriptedServer([Stream(responses_reply("Hello there", usage=responses_usage(
            30, 9, cached=10, reasoning=4)))]) as server:
        chunks = drain(provider(server), request([user("hi")]))
    assert [c["type"] for c in chunks] == [
        "block-start", "text-delta", "text-delta", "block-end", "usage", "finish"]
    assert chunks[3]["block"] == {"type": "text", "text": "Hello there"}
    assert chunks[4]["usage"] == {"inputTokens": 20, "outputTokens": 5, "cacheReadTokens": 10,
                                  "reasoningTokens": 4}
    assert chunks[5]["reason"] == {"kind": "stop"}
    body = server.requests[0]
    assert server.paths == ["/responses"]
    assert (body["stream"], body["store"], body["instructions"]) == (True, False, "Be brief.")
    assert body["input"] == [{"role": "user", "content": [{"type": "input_text",
                                                          "text": "hi"}]}]
    assert body["include"] == ["reasoning.encrypted_content"]
    assert server.headers[0]["x-stainless-retry-count"] == "0"


def test_reasoning_item_and_function_calls_assemble_in_output_order() -> None:
    calls = [("call_a", "read_file", '{"path": "a.txt"}'),
             ("call_b", "read_file", '{"path": "b.txt"}')]
    reply = responses_reply("Reading both.", reasoning="plan: read a then b",
                            encrypted="gAAAA-opaque", tool_calls=calls, pieces=3)
    with ScriptedServer([Stream(reply)]) as server:
        chunks = drain(provider(server), request([user("read a and b")], tools=[READ_TOOL],
                                                 reasoningEffort="low", maxTokens=500))
    response = assemble(chunks)
    assert response.finish == "tool-calls"
    assert [dict(b) for b in response.content] == [
        {"type": "reasoning", "text": "plan: read a then b", "itemId": "rs_1",
         "encryptedContent": "gAAAA-opaque"},
        {"type": "text", "text": "Reading both."},
        {"type": "tool-call", "id": "call_a", "name": "read_file",
         "arguments": '{"path": "a.txt"}'},
        {"type": "tool-call", "id": "call_b", "name": "read_file",
         "arguments": '{"path": "b.txt"}'}]
    body = server.requests[0]
    assert body["tools"] == [{"type": "function", **READ_TOOL}]
    assert body["reasoning"] == {"effort": "low", "summary": "auto"}
    assert body["max_output_tokens"] == 500


def test_the_view_becomes_input_items_and_own_reasoning_is_replayed() -> None:
    own = assistant({"type": "reasoning", "text": "think", "itemId": "rs_9",
                     "encryptedContent": "enc-own"},
                    {"type": "tool-call", "id": "c1", "name": "read_file",
                     "arguments": '{"path": "x"}'}, provider="openai", model="gpt-test")
    other = assistant({"type": "reasoning", "text": "theirs", "itemId": "rs_8",
                       "encryptedContent": "enc-other"},
                      {"type": "text", "text": "done"}, provider="openai", model="gpt-other")
    plain_reasoning = assistant({"type": "reasoning", "text": "no id, no replay"},
                                {"type": "text", "text": "ok"}, provider="openai",
                                model="gpt-test")
    view = [user("q1"), own, result("c1", "file body"), other, plain_reasoning, user("q2")]
    with ScriptedServer([Stream(responses_reply("fine"))]) as server:
        drain(provider(server), request(view))
    sent = server.requests[0]["input"]
    assert sent == responses_input([json.loads(json.dumps(m)) for m in view],
                                   target_model="gpt-test")
    assert [i.get("type") or i["role"] for i in sent] == [
        "user", "reasoning", "function_call", "function_call_output", "assistant",
        "assistant", "user"]
    assert sent[1] == {"type": "reasoning", "id": "rs_9", "encrypted_content": "enc-own",
                       "summary": [{"type": "summary_text", "text": "think"}]}
    assert sent[3] == {"type": "function_call_output", "call_id": "c1", "output": "file body"}
    assert "enc-other" not in json.dumps(sent)  # another model's reasoning stays home


@pytest.mark.parametrize(("behaviour", "code", "retryable", "overflow"), [
    (Fail(429, OPENAI_RATE_LIMIT, {"retry-after": "2"}), "RATE_LIMITED", True, False),
    (Fail(500, OPENAI_SERVER_ERROR), "SERVER_ERROR", True, False),
    (Fail(400, OPENAI_OVERFLOW), "CONTEXT_OVERFLOW", False, True),
    (Stream(responses_failed("rate_limit_exceeded", "slow down")), "RATE_LIMITED", True, False),
    (Stream(responses_failed("server_error", "boom")), "SERVER_ERROR", True, False),
    (Cut(responses_reply("partial answer")[:4]), "NETWORK", True, False),
    (Stall(responses_reply("slow")[:3]), "TIMEOUT", True, False),
])
def test_failures_are_typed(behaviour: object, code: str, retryable: bool,
                            overflow: bool) -> None:
    server = ScriptedServer([behaviour])  # type: ignore[list-item]
    with server, pytest.raises(LlmFailureError) as info:
        drain(provider(server, read_timeout_s=0.5), request([user("hi")]))
    err = info.value
    assert (err.code, err.retryable, err.context_overflow) == (code, retryable, overflow)
    assert "openai model gpt-test" in err.message
    assert len(server.requests) == 1


def test_an_incomplete_response_finishes_at_the_token_limit() -> None:
    with ScriptedServer([Stream(responses_reply("cut at the lim",
                                                incomplete="max_output_tokens"))]) as server:
        response = assemble(drain(provider(server), request([user("long please")])))
    assert response.finish == "max-tokens"
    assert response.content[0]["text"] == "cut at the lim"


def test_compact_uses_the_endpoint_where_offered_and_says_none_where_not() -> None:
    compacted = {"id": "cmp_1", "object": "response.compaction", "created_at": 1764547200,
                 "output": [{"type": "message", "id": "m1", "role": "user", "status":
                             "completed", "content": [{"type": "input_text", "text": "q1"}]},
                            {"type": "compaction", "id": "cmp_item", "encrypted_content":
                             "enc-summary"}],
                 "usage": responses_usage(400, 60, cached=350)}
    missing = {"error": {"message": "Not found", "type": "invalid_request_error",
                         "param": None, "code": None}}
    with ScriptedServer([Fail(200, compacted), Fail(404, missing)]) as server:
        async def go() -> tuple[object, object]:
            p = provider(server)
            try:
                req = request([user("q1"), assistant({"type": "text", "text": "a1"})])
                return await p.compact(req), await p.compact(req)
            finally:
                await p.aclose()

        offered, not_offered = asyncio.run(go())
    assert server.paths == ["/responses/compact", "/responses/compact"]
    assert server.requests[0]["input"][0] == {"role": "user", "content": [
        {"type": "input_text", "text": "q1"}]}
    assert [item.type for item in offered.output] == ["message", "compaction"]  # type: ignore[attr-defined]
    assert offered.output[1].encrypted_content == "enc-summary"  # type: ignore[attr-defined]
    assert not_offered is None


COMPACTED = {"id": "cmp_1", "object": "response.compaction", "created_at": 1764547200,
             "output": [{"type": "message", "id": "m1", "role": "user", "status": "completed",
                         "content": [{"type": "input_text", "text": "question 2"}]},
                        {"type": "compaction", "id": "cmp_item",
                         "encrypted_content": "enc-summary"}],
             "usage": responses_usage(400, 60, cached=350)}
NOT_FOUND = {"error": {"message": "Not found", "type": "invalid_request_error", "param": None,
                       "code": None}}


def _compacting_run(tmp_path: Path, compact: Any) -> tuple[ScriptedServer, list[Any]]:
    """Four long turns with the model summarizer: compaction runs before the last one."""
    long = "The parser fails on nested generics in module types.py, line 88. " * 20

    def answer(body: Any) -> Any:
        if "stream" not in body:
            return compact  # POST /responses/compact
        last = json.dumps(body["input"][-1])
        return Stream(responses_reply("SUMMARY: parser bug in types.py" if "checkpoint" in last
                                      else f"noted: {long}"))

    server = ScriptedServer([Dynamic(answer) for _ in range(12)])
    with server, dsh.open(f"sqlite:///{tmp_path}/s.db") as store:
        p = provider(server)
        agent = Agent.create(store.sessions, p, session_id="s1",
                             config={"provider": "openai", "model": "gpt-test"},
                             system="Be brief.", context_window=2_000, summarizer="model")

        async def go() -> None:
            try:
                for n in range(4):
                    await agent.run(f"question {n}: {long}")
            finally:
                await agent.aclose()
                await p.aclose()

        asyncio.run(go())
        return server, list(agent.session.events)


def test_compaction_uses_the_servers_compact_endpoint_and_sends_its_item_back(
        tmp_path: Path) -> None:
    server, events = _compacting_run(tmp_path, Fail(200, COMPACTED))
    assert server.paths.count("/responses/compact") == 1
    (summary,) = [e for e in events if e["type"] == "compaction/summary"]
    assert summary["data"]["usage"]["cacheReadTokens"] == 350
    checkpoint = next(e for e in events if e["type"] == "user/message"
                      and e.get("surfaceOp") != "append")
    raw = checkpoint["data"]["content"][-1]
    assert dict(raw) == {"type": "provider-raw", "provider": "openai-responses",
                         "block": {"type": "compaction", "encrypted_content": "enc-summary",
                                   "id": "cmp_item"}}
    assert "- question 2" in json.dumps(checkpoint["data"]["content"][1])
    after = server.requests[server.paths.index("/responses/compact") + 1]
    assert {"type": "compaction", "encrypted_content": "enc-summary",
            "id": "cmp_item"} in after["input"]


def test_where_the_server_has_no_compact_endpoint_the_model_writes_the_checkpoint(
        tmp_path: Path) -> None:
    server, events = _compacting_run(tmp_path, Fail(404, NOT_FOUND))
    asked = server.paths.index("/responses/compact")
    assert server.paths[asked + 1] == "/responses"  # the continuation summary request
    (summary,) = [e for e in events if e["type"] == "compaction/summary"]
    assert summary["data"]["summary"][0]["text"] == "SUMMARY: parser bug in types.py"
    assert summary["data"]["request"]["tools"] is None  # this agent has no tools

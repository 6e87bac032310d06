"""OpenAIChatProvider over real HTTP: the official SDK against a scripted Chat Completions
server."""

from __future__ import annotations

import pytest

from dsh._errors import LlmFailureError
from dsh.agent.providers import OpenAIChatProvider, create_provider
from dsh.interop._export import to_openai, validate_conversation
from tests.agent.providers.helpers import (
    READ_TOOL,
    assemble,
    assistant,
    drain,
    plain,
    request,
    result,
    user,
)
from tests.agent.providers.servers import (
    DEEPSEEK_OVERFLOW,
    OPENAI_OVERFLOW,
    OPENAI_RATE_LIMIT,
    OPENAI_SERVER_ERROR,
    Cut,
    Fail,
    ScriptedServer,
    Stall,
    Stream,
    openai_error,
    openai_reply,
    openai_usage,
)


def provider(server: ScriptedServer, **kw: object) -> OpenAIChatProvider:
    return OpenAIChatProvider(model="gpt-test", api_key="sk-test", base_url=server.base_url,
                              **kw)  # type: ignore[arg-type]


def test_text_reply_streams_as_dsh_chunks_with_usage() -> None:
    with ScriptedServer([Stream(openai_reply("Hello there", usage=openai_usage(
            30, 9, cached=10, reasoning=4)))]) as server:
        chunks = drain(provider(server), request([user("hi")]))
    assert [c["type"] for c in chunks] == [
        "block-start", "text-delta", "text-delta", "block-end", "usage", "finish"]
    assert "".join(c["text"] for c in chunks if c["type"] == "text-delta") == "Hello there"
    assert chunks[3]["block"] == {"type": "text", "text": "Hello there"}
    # Disjoint buckets: cached prompt tokens and reasoning tokens move out of input/output.
    assert chunks[4]["usage"] == {"inputTokens": 20, "outputTokens": 5, "cacheReadTokens": 10,
                                  "reasoningTokens": 4}
    assert chunks[5]["reason"] == {"kind": "stop"}
    body = server.requests[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert server.headers[0]["authorization"] == "Bearer sk-test"
    assert server.headers[0]["x-stainless-retry-count"] == "0"
    assert server.paths == ["/chat/completions"]


def test_parallel_tool_calls_assemble_in_model_order() -> None:
    calls = [("call_a", "read_file", '{"path": "a.txt"}'),
             ("call_b", "read_file", '{"path": "b.txt"}')]
    with ScriptedServer([Stream(openai_reply("Reading both.", tool_calls=calls,
                                             pieces=3))]) as server:
        req = request([user("read a and b")], tools=[READ_TOOL])
        chunks = drain(provider(server), req)
    response = assemble(chunks)
    assert response.finish == "tool-calls"
    assert [(c["id"], c["name"], c["arguments"]) for c in response.tool_calls] == calls
    assert response.content[0] == {"type": "text", "text": "Reading both."}
    deltas = [c for c in chunks if c["type"] == "tool-call-delta"]
    assert {c["id"] for c in deltas} == {"call_a", "call_b"}
    assert server.requests[0]["tools"] == [{"type": "function", "function": READ_TOOL}]


def test_deepseek_reasoning_is_a_reasoning_block_and_replayed_only_on_tool_call_turns() -> None:
    view = [user("q1"),
            assistant({"type": "reasoning", "text": "plan a call"},
                      {"type": "tool-call", "id": "c1", "name": "read_file",
                       "arguments": '{"path": "x"}'}, provider="deepseek", model="deepseek-flash"),
            result("c1", "file body"),
            assistant({"type": "reasoning", "text": "just answer"},
                      {"type": "text", "text": "done"}, provider="deepseek",
                      model="deepseek-flash"),
            user("q2"),
            assistant({"type": "reasoning", "text": "another model's thoughts"},
                      {"type": "tool-call", "id": "c2", "name": "read_file",
                       "arguments": '{"path": "y"}'}, provider="openai", model="gpt-test"),
            result("c2", "other body"),
            user("q3")]
    with ScriptedServer([Stream(openai_reply("ok", reasoning="think hard"))]) as server:
        p = create_provider("deepseek", base_url=server.base_url,
                            env={"DEEPSEEK_API_KEY": "sk-ds"})
        chunks = drain(p, request(view, provider="deepseek", model="deepseek-flash"))
    response = assemble(chunks)
    assert [dict(b) for b in response.content] == [
        {"type": "reasoning", "text": "think hard"}, {"type": "text", "text": "ok"}]
    sent = server.requests[0]["messages"]
    assistants = [m for m in sent if m["role"] == "assistant"]
    assert assistants[0]["reasoning_content"] == "plan a call"  # called tools: required
    assert "reasoning_content" not in assistants[1]  # no tools: DeepSeek ignores it
    assert "reasoning_content" not in assistants[2]  # another model's reasoning stays home
    assert sent[0] == {"role": "system", "content": "Be brief."}
    assert validate_conversation(sent, "openai") == []


def test_reasoning_field_of_vllm_and_openrouter_is_a_reasoning_block() -> None:
    reply = openai_reply("42", reasoning="six times seven", reasoning_field="reasoning")
    with ScriptedServer([Stream(reply)]) as server:
        response = assemble(drain(provider(server), request([user("6*7?")])))
    assert [dict(b) for b in response.content] == [
        {"type": "reasoning", "text": "six times seven"}, {"type": "text", "text": "42"}]


def test_request_messages_equal_the_exported_model_view() -> None:
    view = [user("hello \ud800 there"), assistant({"type": "text", "text": "hi"}),
            user("and now")]
    with ScriptedServer([Stream(openai_reply("fine"))]) as server:
        drain(provider(server), request(view, system=None))
    expected = to_openai([plain(m) for m in view])
    assert server.requests[0]["messages"] == expected
    assert server.requests[0]["messages"][0]["content"] == "hello \ufffd there"


def test_header_config_maps_to_request_fields() -> None:
    with ScriptedServer([Stream(openai_reply("x"))]) as server:
        drain(provider(server), request([user("hi")], temperature=0.25, maxTokens=99,
                                        stop=["END"], reasoningEffort="low"))
    body = server.requests[0]
    assert (body["temperature"], body["max_tokens"], body["stop"], body["reasoning_effort"]) \
        == (0.25, 99, ["END"], "low")


@pytest.mark.parametrize(("behaviour", "code", "retryable", "overflow"), [
    (Fail(429, OPENAI_RATE_LIMIT, {"retry-after": "2"}), "RATE_LIMITED", True, False),
    (Fail(429, openai_error(429, "You exceeded your current quota", type_="insufficient_quota",
                            code="insufficient_quota")), "QUOTA_EXHAUSTED", False, False),
    (Fail(500, OPENAI_SERVER_ERROR), "SERVER_ERROR", True, False),
    (Fail(503, OPENAI_SERVER_ERROR), "UNAVAILABLE", True, False),
    (Fail(400, OPENAI_OVERFLOW), "CONTEXT_OVERFLOW", False, True),
    (Fail(400, DEEPSEEK_OVERFLOW), "CONTEXT_OVERFLOW", False, True),
    (Fail(401, openai_error(401, "Incorrect API key provided", type_="invalid_request_error",
                            code="invalid_api_key")), "AUTHENTICATION", False, False),
    (Fail(400, openai_error(400, "Invalid value for 'model'", type_="invalid_request_error",
                            code=None)), "BAD_REQUEST", False, False),
    (Cut(openai_reply("partial answer")[:3]), "NETWORK", True, False),
    (Stall(openai_reply("slow")[:2]), "TIMEOUT", True, False),
])
def test_failures_are_typed(behaviour: object, code: str, retryable: bool,
                            overflow: bool) -> None:
    server = ScriptedServer([behaviour])  # type: ignore[list-item]
    with server, pytest.raises(LlmFailureError) as info:
        drain(provider(server, read_timeout_s=0.5), request([user("hi")]))
    err = info.value
    assert (err.code, err.retryable, err.context_overflow) == (code, retryable, overflow)
    assert "openai model gpt-test" in err.message
    if code == "RATE_LIMITED":
        assert err.retry_after_ms == 2000 and err.status == 429
        assert err.failure["providerRetryAfterMs"] == 2000
    assert len(server.requests) == 1  # the SDK did not retry behind the loop's back


def test_retry_after_ms_header_wins() -> None:
    server = ScriptedServer([Fail(429, OPENAI_RATE_LIMIT, {"retry-after-ms": "150",
                                                           "retry-after": "9"})])
    with server, pytest.raises(LlmFailureError) as info:
        drain(provider(server), request([user("hi")]))
    assert info.value.retry_after_ms == 150


def test_stream_without_finish_reason_is_retryable() -> None:
    events = [*openai_reply("cut short")[:3], (None, "[DONE]")]
    with ScriptedServer([Stream(events)]) as server, pytest.raises(LlmFailureError) as info:
        drain(provider(server), request([user("hi")]))
    assert (info.value.code, info.value.retryable) == ("NETWORK", True)


def test_missing_key_names_the_variable() -> None:
    from dsh._errors import ConfigError
    with pytest.raises(ConfigError, match="set DEEPSEEK_API_KEY") as info:
        create_provider("deepseek", env={})
    assert info.value.code == "MISSING_KEY"
    with pytest.raises(ConfigError, match="needs --base-url"):
        create_provider("openai-compatible", model="m", env={})
    with pytest.raises(ConfigError, match="unknown provider 'gemini'"):
        create_provider("gemini", env={})
    local = create_provider("openai-compatible", model="llama3", base_url="http://127.0.0.1:1/v1",
                            env={})
    assert isinstance(local, OpenAIChatProvider) and local.name == "openai-compatible"

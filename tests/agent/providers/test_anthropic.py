"""AnthropicProvider over real HTTP: the official SDK against a scripted Messages server."""

from __future__ import annotations

import json

import pytest

from dsh._errors import LlmFailureError
from dsh.agent.providers import AnthropicProvider, create_provider
from dsh.interop._export import to_anthropic, validate_conversation
from tests.agent.providers.helpers import (
    READ_TOOL,
    assemble,
    assistant,
    drain,
    plain,
    request,
    result,
    user,
    without_cache_mark,
)
from tests.agent.providers.servers import (
    ANTHROPIC_OVERFLOW,
    ANTHROPIC_OVERLOADED,
    ANTHROPIC_RATE_LIMIT,
    ANTHROPIC_SERVER_ERROR,
    Cut,
    Fail,
    ScriptedServer,
    Stall,
    Stream,
    anthropic_error,
    anthropic_reply,
    anthropic_usage,
)

MODEL = "claude-test"


def provider(server: ScriptedServer, **kw: object) -> AnthropicProvider:
    return AnthropicProvider(model=MODEL, api_key="sk-ant-test", base_url=server.base_url,
                             **kw)  # type: ignore[arg-type]


def areq(messages: list[object], **kw: object) -> object:
    return request(messages, provider="anthropic", model=MODEL, **kw)  # type: ignore[arg-type]


def test_thinking_text_and_tool_use_keep_signatures_losslessly() -> None:
    reply = anthropic_reply("Let me read it.", thinking="I should read the file",
                            signature="EqQBCkYIBRgCKkA=", redacted="cmVkYWN0ZWQ=",
                            tool_uses=[("toolu_1", "read_file", '{"path": "a.txt"}')],
                            usage=anthropic_usage(40, 12, cache_read=100, cache_write=5))
    with ScriptedServer([Stream(reply)]) as server:
        chunks = drain(provider(server), areq([user("read a")], tools=[READ_TOOL]))
    response = assemble(chunks)
    assert response.finish == "tool-calls"
    assert [plain(b) for b in response.content] == [
        {"type": "reasoning", "text": "I should read the file", "signature": "EqQBCkYIBRgCKkA="},
        {"type": "provider-raw", "provider": "anthropic",
         "block": {"type": "redacted_thinking", "data": "cmVkYWN0ZWQ="}},
        {"type": "text", "text": "Let me read it."},
        {"type": "tool-call", "id": "toolu_1", "name": "read_file",
         "arguments": '{"path": "a.txt"}'}]
    assert response.usage == {"inputTokens": 40, "outputTokens": 12, "cacheReadTokens": 100,
                              "cacheWriteTokens": 5}
    body = server.requests[0]
    assert body["tools"] == [{"name": "read_file", "description": "Read a file.",
                              "input_schema": READ_TOOL["parameters"]}]
    assert body["system"] == "Be brief." and body["max_tokens"] == 8192
    assert server.paths == ["/v1/messages"]


def test_replayed_turn_sends_back_own_thinking_and_merges_user_content() -> None:
    own = assistant({"type": "reasoning", "text": "t", "signature": "sig-own"},
                    {"type": "tool-call", "id": "toolu_1", "name": "read_file",
                     "arguments": '{"path": "a"}'}, provider="anthropic", model=MODEL)
    view = [user("read a"), own, result("toolu_1", "AAA"), user("and summarise")]
    with ScriptedServer([Stream(anthropic_reply("Summary."))]) as server:
        drain(provider(server), areq(view))
    sent = server.requests[0]
    assert without_cache_mark(sent["messages"]) == to_anthropic([plain(m) for m in view])[
        "messages"]
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    assert sent["messages"][1]["content"][0] == {"type": "thinking", "thinking": "t",
                                                 "signature": "sig-own"}
    last = sent["messages"][2]["content"]
    assert [b["type"] for b in last] == ["tool_result", "text"]  # merged, result first
    assert validate_conversation(sent, "anthropic") == []


def test_thinking_signed_by_another_model_is_not_sent() -> None:
    other = assistant({"type": "reasoning", "text": "old", "signature": "sig-other"},
                      {"type": "provider-raw", "provider": "anthropic",
                       "block": {"type": "redacted_thinking", "data": "x"}},
                      {"type": "text", "text": "answer"}, provider="anthropic",
                      model="claude-older")
    view = [user("q"), other, user("q2")]
    with ScriptedServer([Stream(anthropic_reply("ok"))]) as server:
        drain(provider(server), areq(view))
    sent = server.requests[0]["messages"]
    assert sent[1]["content"] == [{"type": "text", "text": "answer"}]
    assert without_cache_mark(sent) == to_anthropic([plain(m) for m in view],
                                                    target_model=MODEL)["messages"]


def test_reasoning_effort_turns_thinking_on_and_drops_temperature() -> None:
    with ScriptedServer([Stream(anthropic_reply("x"))]) as server:
        drain(provider(server), areq([user("hi")], reasoningEffort="medium", temperature=0.3,
                                     stop=["END"], maxTokens=1000))
    body = server.requests[0]
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 8192}
    assert body["max_tokens"] == 8192 + 1024 and "temperature" not in body
    assert body["stop_sequences"] == ["END"]


def test_the_last_content_block_carries_the_prompt_cache_mark_unless_turned_off() -> None:
    view = [user("q"), assistant({"type": "text", "text": "a"}, provider="anthropic",
                                 model=MODEL), user("q2")]
    with ScriptedServer([Stream(anthropic_reply("ok")), Stream(anthropic_reply("ok"))]) as server:
        drain(provider(server), areq(view))
        drain(AnthropicProvider(model=MODEL, api_key="k", base_url=server.base_url,
                                prompt_cache=False), areq(view))
    marked, plain_body = server.requests
    assert marked["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert without_cache_mark(marked["messages"]) == plain_body["messages"]
    assert "cache_control" not in json.dumps(plain_body)


def test_lone_surrogates_become_replacement_characters_on_the_wire() -> None:
    with ScriptedServer([Stream(anthropic_reply("x"))]) as server:
        drain(provider(server), areq([user("bad \udc80 text")], system="sys \ud801"))
    body = server.requests[0]
    assert body["messages"][0]["content"][0]["text"] == "bad \ufffd text"
    assert body["system"] == "sys \ufffd"


@pytest.mark.parametrize(("behaviour", "code", "retryable", "overflow"), [
    (Fail(429, ANTHROPIC_RATE_LIMIT, {"retry-after": "3"}), "RATE_LIMITED", True, False),
    (Fail(529, ANTHROPIC_OVERLOADED), "OVERLOADED", True, False),
    (Fail(500, ANTHROPIC_SERVER_ERROR), "SERVER_ERROR", True, False),
    (Fail(400, ANTHROPIC_OVERFLOW), "CONTEXT_OVERFLOW", False, True),
    (Fail(413, anthropic_error("request_too_large", "Request exceeds the maximum size")),
     "CONTEXT_OVERFLOW", False, True),
    (Fail(401, anthropic_error("authentication_error", "invalid x-api-key")),
     "AUTHENTICATION", False, False),
    (Stream([*anthropic_reply("partial")[:4],
             ("error", ANTHROPIC_OVERLOADED)]), "OVERLOADED", True, False),
    (Cut(anthropic_reply("partial answer")[:4]), "NETWORK", True, False),
    (Stall(anthropic_reply("slow")[:3]), "TIMEOUT", True, False),
])
def test_failures_are_typed(behaviour: object, code: str, retryable: bool,
                            overflow: bool) -> None:
    server = ScriptedServer([behaviour])  # type: ignore[list-item]
    with server, pytest.raises(LlmFailureError) as info:
        drain(provider(server, read_timeout_s=0.5), areq([user("hi")]))
    err = info.value
    assert (err.code, err.retryable, err.context_overflow) == (code, retryable, overflow)
    assert f"anthropic model {MODEL}" in err.message
    if code == "RATE_LIMITED":
        assert err.retry_after_ms == 3000 and err.request_id == "req_test"
    assert len(server.requests) == 1


def test_missing_key_names_the_variable() -> None:
    from dsh._errors import ConfigError
    with pytest.raises(ConfigError, match="set ANTHROPIC_API_KEY"):
        create_provider("anthropic", env={"OPENAI_API_KEY": "x"})
    made = create_provider("anthropic", env={"ANTHROPIC_API_KEY": "k"})
    assert isinstance(made, AnthropicProvider) and made.model == "claude-sonnet-4-5"

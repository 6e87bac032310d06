"""The provider protocol and the scripted provider.

Rule: docs/events.md#the-message-model, docs/agent.md#providers.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from dsh._errors import ConfigError, DshError
from dsh._messages import create_user_message
from dsh.agent import (
    LlmFailureError,
    LlmRequest,
    Provider,
    ScriptedCall,
    ScriptedFailure,
    ScriptedProvider,
    ScriptedReply,
    ScriptedStall,
    StreamAssembler,
    failure_error,
)
from dsh.json import snapshot_json


def _request(messages: tuple[Any, ...] = ()) -> LlmRequest:
    header = snapshot_json({"config": {"provider": "scripted", "model": "m1"},
                            "system": "Be brief.",
                            "tools": [{"name": "echo", "description": "d", "parameters": {}}]})
    return LlmRequest(session_id="s1", messages=messages, header=header, context_window=1000)


async def _collect(provider: ScriptedProvider, request: LlmRequest) -> list[Any]:
    return [chunk async for chunk in provider.stream(request)]


def test_request_exposes_header_fields_and_is_frozen() -> None:
    request = _request()
    assert (request.provider, request.model, request.system) == ("scripted", "m1", "Be brief.")
    assert [t["name"] for t in request.tools] == ["echo"]
    assert request.config == {"provider": "scripted", "model": "m1"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.session_id = "other"  # type: ignore[misc]


def test_scripted_provider_satisfies_the_protocol() -> None:
    assert isinstance(ScriptedProvider(), Provider)


def test_reply_streams_dsh_chunks_and_assembles_the_final_message() -> None:
    provider = ScriptedProvider([ScriptedReply(reasoning="think", text="Hello world",
                                               tool_calls=(ScriptedCall(name="echo",
                                                                        arguments={"x": 1}),))],
                                chunk_chars=4)
    user = create_user_message({"content": [{"type": "text", "text": "hi"}],
                                "source": {"kind": "user"}})
    chunks = asyncio.run(_collect(provider, _request((user,))))
    assert [c["type"] for c in chunks] == [
        "block-start", "reasoning-delta", "reasoning-delta", "block-end",
        "block-start", "text-delta", "text-delta", "text-delta", "block-end",
        "block-start", "tool-call-delta", "tool-call-delta", "block-end",
        "usage", "finish"]
    assert chunks[10] == {"type": "tool-call-delta", "index": 2, "id": "call_0_0",
                          "name": "echo", "argumentsDelta": '{"x"'}
    assert chunks[-1] == {"type": "finish", "reason": {"kind": "tool-calls"}}
    assembler = StreamAssembler()
    for chunk in chunks:
        assembler.feed(chunk)
    response = assembler.response()
    assert response.finish == "tool-calls"
    assert list(response.content) == [
        {"type": "reasoning", "text": "think"}, {"type": "text", "text": "Hello world"},
        {"type": "tool-call", "id": "call_0_0", "name": "echo", "arguments": '{"x":1}'}]
    assert [c["id"] for c in response.tool_calls] == ["call_0_0"]
    assert response.usage == {"inputTokens": 8, "outputTokens": 6}
    assert provider.requests[0].messages == (user,)


def test_parallel_calls_get_distinct_ids_and_raw_string_arguments_pass_through() -> None:
    provider = ScriptedProvider([ScriptedReply(tool_calls=(
        ScriptedCall(name="a", arguments='{"raw": true}'), ScriptedCall(name="b"),
        ScriptedCall(name="c", id="mine")))])
    assembler = StreamAssembler()
    for chunk in asyncio.run(_collect(provider, _request())):
        assembler.feed(chunk)
    calls = assembler.response().tool_calls
    assert [(c["id"], c["name"], c["arguments"]) for c in calls] == [
        ("call_0_0", "a", '{"raw": true}'), ("call_0_1", "b", "{}"), ("mine", "c", "{}")]


def test_raised_failure_carries_retry_and_overflow_flags_after_partial_text() -> None:
    provider = ScriptedProvider([ScriptedFailure(code="RATE_LIMITED", retryable=True,
                                                 retry_after_ms=250, after_text="par")])
    seen: list[Any] = []

    async def run() -> None:
        async for chunk in provider.stream(_request()):
            seen.append(chunk)

    with pytest.raises(LlmFailureError) as info:
        asyncio.run(run())
    assert [c["type"] for c in seen] == ["block-start", "text-delta", "block-end"]
    error = info.value
    assert isinstance(error, DshError)
    assert (error.code, error.retryable, error.context_overflow, error.retry_after_ms) == (
        "RATE_LIMITED", True, False, 250)
    assert error.failure == {"message": "scripted failure", "code": "RATE_LIMITED",
                             "providerRetryAfterMs": 250}


def test_finish_delivered_failure_is_raised_by_the_assembler() -> None:
    provider = ScriptedProvider([ScriptedFailure(code="CONTEXT_OVERFLOW", message="too long",
                                                 as_finish=True)])
    assembler = StreamAssembler()
    for chunk in asyncio.run(_collect(provider, _request())):
        assembler.feed(chunk)
    with pytest.raises(LlmFailureError) as info:
        assembler.response()
    assert (info.value.code, info.value.context_overflow, info.value.message) == (
        "CONTEXT_OVERFLOW", True, "too long")


def test_failure_error_classifies_http_status_and_codes() -> None:
    assert failure_error({"message": "m", "code": "X", "status": 429}).retryable
    assert failure_error({"message": "m", "code": "X", "status": 503}).retryable
    assert not failure_error({"message": "m", "code": "X", "status": 400}).retryable
    assert failure_error({"message": "m", "code": "OVERLOADED"}).retryable
    assert failure_error({}).code == "UNKNOWN"


def test_stall_waits_until_cancelled() -> None:
    provider = ScriptedProvider([ScriptedStall(after_text="hel")])
    got: list[Any] = []

    async def run() -> None:
        async def consume() -> None:
            async for chunk in provider.stream(_request()):
                got.append(chunk)

        task = asyncio.create_task(consume())
        await provider.stalled.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert [c["type"] for c in got] == ["block-start", "text-delta", "block-end"]


def test_callable_step_sees_the_request_and_exhaustion_is_a_typed_error() -> None:
    provider = ScriptedProvider([lambda request: ScriptedReply(text=request.model)])
    assembler = StreamAssembler()
    for chunk in asyncio.run(_collect(provider, _request())):
        assembler.feed(chunk)
    assert list(assembler.response().content) == [{"type": "text", "text": "m1"}]
    with pytest.raises(LlmFailureError) as info:
        asyncio.run(_collect(provider, _request()))
    assert info.value.code == "SCRIPT_EXHAUSTED" and not info.value.retryable


def test_assembler_refuses_chunks_after_finish_and_a_stream_without_finish() -> None:
    assembler = StreamAssembler()
    assembler.feed({"type": "text-delta", "index": 0, "text": "a"})
    with pytest.raises(LlmFailureError) as info:
        assembler.response()
    assert info.value.code == "BAD_STREAM"
    assembler.feed({"type": "finish", "reason": {"kind": "stop"}})
    with pytest.raises(LlmFailureError, match="after finish"):
        assembler.feed({"type": "text-delta", "index": 0, "text": "b"})
    with pytest.raises(LlmFailureError, match="malformed or unknown chunk"):
        StreamAssembler().feed({"type": "bogus"})


def test_visible_content_keeps_text_and_reasoning_and_drops_half_tool_calls() -> None:
    assembler = StreamAssembler()
    for chunk in [{"type": "reasoning-delta", "index": 0, "text": "why"},
                  {"type": "text-delta", "index": 1, "text": "  "},
                  {"type": "text-delta", "index": 2, "text": "partial"},
                  {"type": "tool-call-delta", "index": 3, "id": "c1", "name": "x",
                   "argumentsDelta": "{"}]:
        assembler.feed(chunk)
    assert list(assembler.visible_content()) == [{"type": "reasoning", "text": "why"},
                                                 {"type": "text", "text": "partial"}]


def test_chunk_chars_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        ScriptedProvider(chunk_chars=0)

"""Shared helpers of the provider tests: requests from messages, draining a provider stream."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from dsh._messages import (
    create_assistant_message,
    create_tool_result_message,
    create_user_message,
)
from dsh.agent._provider import LlmRequest, StreamAssembler
from dsh.json import snapshot_json

READ_TOOL = {"name": "read_file", "description": "Read a file.",
             "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                            "required": ["path"]}}


def request(messages: Sequence[Any], *, provider: str = "openai", model: str = "gpt-test",
            system: str | None = "Be brief.", tools: Sequence[Any] = (),
            **config: Any) -> LlmRequest:
    header: dict[str, Any] = {"config": {"provider": provider, "model": model, **config}}
    if system:
        header["system"] = system
    if tools:
        header["tools"] = list(tools)
    return LlmRequest(session_id="s1", messages=tuple(snapshot_json(m) for m in messages),
                      header=snapshot_json(header))


def user(text: str) -> Any:
    return create_user_message({"content": [{"type": "text", "text": text}],
                                "source": {"kind": "user"}})


def assistant(*blocks: Any, provider: str = "openai", model: str = "gpt-test") -> Any:
    return create_assistant_message(content=list(blocks), provider=provider, model=model)


def result(call_id: str, text: str) -> Any:
    return create_tool_result_message(call_id=call_id,
                                      content=[{"type": "text", "text": text}])


def drain(provider: Any, req: LlmRequest) -> list[dict[str, Any]]:
    async def go() -> list[dict[str, Any]]:
        try:
            return [dict(c) async for c in provider.stream(req)]
        finally:
            await provider.aclose()
    return asyncio.run(go())


def assemble(chunks: Sequence[dict[str, Any]]) -> Any:
    assembler = StreamAssembler()
    for chunk in chunks:
        assembler.feed(chunk)
    return assembler.response()


def plain(value: Any) -> Any:
    """Frozen containers as plain dict/list, for equality with parsed JSON."""
    if isinstance(value, dict | type(snapshot_json({}))):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def without_cache_mark(messages: Any) -> Any:
    """Anthropic messages as the export gives them: the provider's one ``cache_control`` mark
    (on the last content block) taken off, after checking it is there and nowhere else."""
    marked = [(i, j) for i, m in enumerate(messages) if isinstance(m.get("content"), list)
              for j, b in enumerate(m["content"]) if "cache_control" in b]
    assert marked == [(len(messages) - 1, len(messages[-1]["content"]) - 1)], marked
    assert messages[-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    out = [dict(m) for m in messages]
    last = out[-1]
    block = {k: v for k, v in last["content"][-1].items() if k != "cache_control"}
    last["content"] = [*last["content"][:-1], block]
    return out

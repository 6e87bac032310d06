"""AnthropicProvider: the agent loop's provider on Anthropic Messages (official SDK).

The ``anthropic`` package is imported when a provider is created, never by ``import dsh``
(install it with ``pip install 'dsh-session[anthropic]'``).

The request's ``messages`` (and ``system``) are the session's model view exported by
:func:`dsh.interop._export.to_anthropic`: consecutive same-role content merged so roles
alternate, tool results leading the user message that answers their ``tool_use``. Extended
thinking streams into ``reasoning`` blocks that keep their ``signature``; ``redacted_thinking``
and other Anthropic-only blocks are kept verbatim as ``provider-raw`` blocks. Both are replayed
only to the model that signed them: thinking from another model is not sent.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import AsyncIterator
from typing import Any, Final, Literal

from dsh._errors import ConfigError, LlmFailureError
from dsh._install import install_hint
from dsh._messages import StreamChunk, TokenUsage
from dsh.agent._provider import LlmRequest
from dsh.agent.providers._common import replace_lone_surrogates, stream_sdk
from dsh.interop import anthropic_usage, to_anthropic

DEFAULT_MAX_TOKENS: Final = 8192
"""``max_tokens`` sent when the header's config has no ``maxTokens`` (Anthropic requires it)."""

THINKING_BUDGET_TOKENS: Final = {"low": 2048, "medium": 8192, "high": 16384}
"""Extended-thinking budget per header ``reasoningEffort`` (tokens)."""

_STOP: Final[dict[str, Literal["stop", "tool-calls", "max-tokens"]]] = {
    "end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool-calls",
    "max_tokens": "max-tokens", "model_context_window_exceeded": "max-tokens",
    "pause_turn": "stop", "refusal": "stop"}


def _sdk() -> Any:
    try:
        return importlib.import_module("anthropic")
    except ImportError as exc:
        raise ConfigError("the Anthropic provider needs the anthropic package: "
                          f"{install_hint('anthropic')}", code="MISSING_EXTRA") from exc


class AnthropicProvider:
    """A :class:`~dsh.agent._provider.Provider` on ``anthropic.AsyncAnthropic`` Messages.

    Args:
        model: Default model id (the loop's header ``config.model`` wins per request).
        api_key: The API key.
        base_url: API root; None for Anthropic's.
        name: Provider id written into the log (``config.provider``).
        read_timeout_s: Seconds without a byte from the server before the call fails
            (``TIMEOUT``, retryable).
        connect_timeout_s: Seconds to connect.
        thinking_budget_tokens: Turn extended thinking on with this budget (tokens) for every
            request; otherwise it is on only when the header sets ``reasoningEffort``
            (:data:`THINKING_BUDGET_TOKENS`).
        prompt_cache: Mark the last content block of every request with ``cache_control``
            (ephemeral), so the provider caches the whole prompt and the next request reads
            it back (Anthropic looks for a cached prefix at the mark and up to 20 blocks
            before it); False sends no mark (docs/effects.md#cache-keeping-compaction).
        client: An existing ``AsyncAnthropic`` to use instead of building one.

    The SDK's own retries are off: the loop retries retryable failures itself and records each
    retry in the log.

    Raises:
        ConfigError: the ``anthropic`` package is not installed (code ``MISSING_EXTRA``).
    """

    def __init__(self, *, model: str, api_key: str, base_url: str | None = None,
                 name: str = "anthropic", read_timeout_s: float = 120.0,
                 connect_timeout_s: float = 10.0, thinking_budget_tokens: int | None = None,
                 prompt_cache: bool = True, client: Any = None) -> None:
        self._sdk = _sdk()
        self.name = name
        self.model = model
        self.thinking_budget_tokens = thinking_budget_tokens
        self.prompt_cache = prompt_cache
        self.client = client or self._sdk.AsyncAnthropic(
            api_key=api_key, base_url=base_url, max_retries=0,
            timeout=self._sdk.Timeout(read_timeout_s, connect=connect_timeout_s))

    def request_messages(self, request: LlmRequest) -> dict[str, Any]:
        """``{"system"?, "messages"}`` for ``request``: its model view in Messages form.

        ``to_anthropic(view, target_model=model)``: thinking signed by another model is left
        out; the header's system prompt goes first in ``system``, before any system messages
        of the view.
        """
        body = to_anthropic(request.messages, target_model=request.model)
        if request.system:
            system = replace_lone_surrogates(request.system)
            body = {"system": system + ("\n\n" + body["system"] if "system" in body else ""),
                    "messages": body["messages"]}
        return body

    def request_body(self, request: LlmRequest) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` for ``request`` (streaming).

        Header fields map as ``maxTokens`` → ``max_tokens`` (default
        :data:`DEFAULT_MAX_TOKENS`), ``temperature`` (not sent with thinking on, which
        requires the default), ``stop`` → ``stop_sequences``, ``reasoningEffort`` →
        ``thinking`` budget; tools become ``{name, description, input_schema}``. With
        :attr:`prompt_cache`, the last content block carries ``cache_control: {type:
        ephemeral}``.
        """
        config = request.config
        body: dict[str, Any] = {"model": request.model, **self.request_messages(request),
                                "stream": True}
        if self.prompt_cache:
            _mark_last_block(body["messages"])
        budget = self.thinking_budget_tokens or THINKING_BUDGET_TOKENS.get(
            str(config.get("reasoningEffort")))
        max_tokens = config.get("maxTokens") or DEFAULT_MAX_TOKENS
        if budget:
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
            max_tokens = max(max_tokens, budget + 1024)  # the budget must fit in max_tokens
        body["max_tokens"] = max_tokens
        if config.get("temperature") is not None and not budget:
            body["temperature"] = config["temperature"]
        if config.get("stop"):
            body["stop_sequences"] = replace_lone_surrogates(config["stop"])
        if request.tools:
            body["tools"] = [replace_lone_surrogates(
                {"name": t["name"], "description": t.get("description") or "",
                 "input_schema": t.get("parameters") or {"type": "object", "properties": {}}})
                for t in request.tools]
        return body

    async def aclose(self) -> None:
        """Close the SDK client and its HTTP connections (call once, when done)."""
        await self.client.close()

    async def stream(self, request: LlmRequest) -> AsyncIterator[StreamChunk]:
        """Stream the reply to ``request`` as dsh chunks, ending with ``finish``.

        Block indices are Anthropic's; each ``content_block_stop`` gives the block's
        ``block-end`` (thinking as ``{type: reasoning, text, signature}``, tool use as
        ``{type: tool-call, id, name, arguments}``, other blocks as ``provider-raw``).

        Raises:
            LlmFailureError: the call failed or the stream carried an error event (see
                :func:`~dsh.agent.providers._common.failure_from_sdk`), or the stream ended
                before ``message_stop`` (``NETWORK``, retryable).
        """
        state = _StreamState()
        async for chunk in stream_sdk(
                self._sdk, self.client.messages.create(**self.request_body(request)),
                state.take, provider=self.name, model=request.model):
            yield chunk
        if not state.stopped:
            raise LlmFailureError(f"{self.name} model {request.model}: the stream ended before "
                                  f"message_stop (connection dropped?); it will be retried",
                                  code="NETWORK", retryable=True)
        if state.usage is not None:
            yield {"type": "usage", "usage": state.usage}
        yield {"type": "finish", "reason": {"kind": _STOP.get(state.stop_reason or "", "stop")}}


def _mark_last_block(messages: list[dict[str, Any]]) -> None:
    """Put the cache mark on the last content block of the last message (in place)."""
    if not messages:
        return
    last = messages[-1]
    content = last.get("content")
    if isinstance(content, str):
        last["content"] = [{"type": "text", "text": content,
                            "cache_control": {"type": "ephemeral"}}]
    elif isinstance(content, list) and content and isinstance(content[-1], dict):
        content[-1] = {**content[-1], "cache_control": {"type": "ephemeral"}}


class _Block:
    __slots__ = ("kind", "parts", "signature", "start")

    def __init__(self, kind: str, start: dict[str, Any]) -> None:
        self.kind = kind
        self.start = start
        self.parts: list[str] = []
        self.signature = ""


class _StreamState:
    """Translation of one Messages event stream into dsh chunks."""

    def __init__(self) -> None:
        self.blocks: dict[int, _Block] = {}
        self.usage: TokenUsage | None = None
        self.stop_reason: str | None = None
        self.stopped = False

    def take(self, event: Any) -> list[StreamChunk]:
        kind = event.type
        if kind == "message_start":
            self.usage = anthropic_usage(event.message.usage.model_dump())  # type: ignore[assignment]
        elif kind == "content_block_start":
            return self._start(event.index, event.content_block.model_dump(
                mode="json", exclude_none=True))
        elif kind == "content_block_delta":
            return self._delta(event.index, event.delta)
        elif kind == "content_block_stop":
            return self._stop(event.index)
        elif kind == "message_delta":
            self.stop_reason = event.delta.stop_reason or self.stop_reason
            if self.usage is not None and event.usage is not None:
                # message_delta counts are cumulative; input counts may be restated.
                update = anthropic_usage({k: v for k, v in event.usage.model_dump().items()
                                          if v is not None}) or {}
                merged = dict(self.usage)
                merged["outputTokens"] = update.get("outputTokens", merged["outputTokens"])
                for key in ("cacheReadTokens", "cacheWriteTokens"):
                    if update.get(key):
                        merged[key] = update[key]
                if update.get("inputTokens"):
                    merged["inputTokens"] = update["inputTokens"]
                self.usage = merged  # type: ignore[assignment]
        elif kind == "message_stop":
            self.stopped = True
        return []

    def _start(self, index: int, start: dict[str, Any]) -> list[StreamChunk]:
        kind = {"text": "text", "thinking": "reasoning", "tool_use": "tool-call"}.get(
            start.get("type", ""), "provider-raw")
        block = self.blocks[index] = _Block(kind, start)
        out: list[StreamChunk] = [{"type": "block-start", "index": index, "blockType": kind}]
        if kind == "text" and start.get("text"):
            block.parts.append(start["text"])
            out.append({"type": "text-delta", "index": index, "text": start["text"]})
        elif kind == "reasoning" and start.get("thinking"):
            block.parts.append(start["thinking"])
            out.append({"type": "reasoning-delta", "index": index, "text": start["thinking"]})
        elif kind == "tool-call":
            out.append({"type": "tool-call-delta", "index": index, "id": str(start.get("id")),
                        "name": str(start.get("name")), "argumentsDelta": ""})
        return out

    def _delta(self, index: int, delta: Any) -> list[StreamChunk]:
        block = self.blocks.get(index)
        if block is None:
            return []
        kind = delta.type
        if kind == "text_delta":
            block.parts.append(delta.text)
            return [{"type": "text-delta", "index": index, "text": delta.text}]
        if kind == "thinking_delta":
            block.parts.append(delta.thinking)
            return [{"type": "reasoning-delta", "index": index, "text": delta.thinking}]
        if kind == "signature_delta":
            block.signature += delta.signature
        elif kind == "input_json_delta" and delta.partial_json:
            block.parts.append(delta.partial_json)
            return [{"type": "tool-call-delta", "index": index, "id": str(block.start.get("id")),
                     "argumentsDelta": delta.partial_json}]
        return []

    def _stop(self, index: int) -> list[StreamChunk]:
        block = self.blocks.get(index)
        if block is None:
            return []
        text = "".join(block.parts)
        final: dict[str, Any]
        if block.kind == "text":
            final = {"type": "text", "text": text}
        elif block.kind == "reasoning":
            final = {"type": "reasoning", "text": text,
                     "signature": block.signature or str(block.start.get("signature") or "")}
        elif block.kind == "tool-call":
            start_input = block.start.get("input")
            final = {"type": "tool-call", "id": str(block.start.get("id")),
                     "name": str(block.start.get("name")),
                     "arguments": text or (json.dumps(start_input) if start_input else "{}")}
        else:
            final = {"type": "provider-raw", "provider": "anthropic", "block": block.start}
        return [{"type": "block-end", "index": index, "block": final}]

"""OpenAIChatProvider: the agent loop's provider on OpenAI Chat Completions (official SDK).

Any server that speaks Chat Completions works through ``base_url``: OpenAI, DeepSeek, vLLM,
Ollama, OpenRouter. The ``openai`` package is imported when a provider is created, never by
``import dsh`` (install it with ``pip install 'dsh-session[openai]'``).

The request's ``messages`` are the session's model view exported by
:func:`dsh.interop._export.to_openai` (system prompt first), so what the server receives is the
log's projection in Chat Completions form. Reasoning (DeepSeek's ``reasoning_content``, and the
``reasoning`` field of vLLM and OpenRouter) is kept as ``reasoning`` blocks and sent back as
``reasoning_content`` only where the server wants it (``reasoning_replay``).
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

from dsh._errors import ConfigError, LlmFailureError
from dsh._install import install_hint
from dsh._messages import StreamChunk, TokenUsage, ToolCallDeltaChunk
from dsh.agent._provider import LlmRequest
from dsh.agent.providers._common import replace_lone_surrogates, stream_sdk
from dsh.interop import to_openai

ReasoningReplay = Literal["never", "tool-calls", "always"]
"""Which earlier assistant messages carry their reasoning back as ``reasoning_content``:
``never`` (OpenAI, most servers), ``tool-calls`` (DeepSeek thinking mode: required on assistant
messages that called tools, ignored elsewhere), ``always``."""

_FINISH: dict[str, Literal["stop", "tool-calls", "max-tokens"]] = {
    "stop": "stop", "tool_calls": "tool-calls", "function_call": "tool-calls",
    "length": "max-tokens"}


def _sdk() -> Any:
    try:
        return importlib.import_module("openai")
    except ImportError as exc:
        raise ConfigError("the OpenAI provider needs the openai package: "
                          f"{install_hint('openai')}", code="MISSING_EXTRA") from exc


def openai_usage(usage: Any) -> TokenUsage:
    """Chat Completions ``usage`` (SDK object or dict) as disjoint dsh :class:`TokenUsage`.

    Cached prompt tokens (``prompt_tokens_details.cached_tokens``, or DeepSeek's
    ``prompt_cache_hit_tokens``) move from ``inputTokens`` to ``cacheReadTokens``; reasoning
    tokens (``completion_tokens_details.reasoning_tokens``) from ``outputTokens`` to
    ``reasoningTokens``.
    """
    raw = usage if isinstance(usage, Mapping) else usage.model_dump()
    prompt = int(raw.get("prompt_tokens") or 0)
    completion = int(raw.get("completion_tokens") or 0)
    cached = int((raw.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                 or raw.get("prompt_cache_hit_tokens") or 0)
    reasoning = int((raw.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)
    out: TokenUsage = {"inputTokens": max(0, prompt - cached),
                       "outputTokens": max(0, completion - reasoning)}
    if cached:
        out["cacheReadTokens"] = cached
    if reasoning:
        out["reasoningTokens"] = reasoning
    return out


class OpenAIChatProvider:
    """A :class:`~dsh.agent._provider.Provider` on ``openai.AsyncOpenAI`` Chat Completions.

    Args:
        model: Default model id (the loop's header ``config.model`` wins per request).
        api_key: The API key (servers that need none, e.g. Ollama, accept any text).
        base_url: The server's API root, e.g. ``https://api.deepseek.com`` or
            ``http://127.0.0.1:11434/v1``; None for OpenAI's.
        name: Provider id written into the log (``config.provider``), e.g. ``"deepseek"``.
        reasoning_replay: See :data:`ReasoningReplay`.
        read_timeout_s: Seconds without a byte from the server before the call fails
            (``TIMEOUT``, retryable).
        connect_timeout_s: Seconds to connect.
        max_tokens_field: ``max_tokens`` (compatible servers) or ``max_completion_tokens``
            (OpenAI's current name) for the header's ``maxTokens``.
        extra_body: Extra JSON fields sent with every request (e.g. DeepSeek's
            ``{"thinking": {"type": "enabled"}}``).
        client: An existing ``AsyncOpenAI`` to use instead of building one.

    The SDK's own retries are off: the loop retries retryable failures itself and records each
    retry in the log. Streams ask for usage (``stream_options.include_usage``).

    Raises:
        ConfigError: the ``openai`` package is not installed (code ``MISSING_EXTRA``).
    """

    def __init__(self, *, model: str, api_key: str, base_url: str | None = None,
                 name: str = "openai", reasoning_replay: ReasoningReplay = "never",
                 read_timeout_s: float = 120.0, connect_timeout_s: float = 10.0,
                 max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens",
                 extra_body: Mapping[str, Any] | None = None, client: Any = None) -> None:
        self._sdk = _sdk()
        self.name = name
        self.model = model
        self.reasoning_replay: ReasoningReplay = reasoning_replay
        self.max_tokens_field = max_tokens_field
        self.extra_body = dict(extra_body or {})
        self.client = client or self._sdk.AsyncOpenAI(
            api_key=api_key, base_url=base_url, max_retries=0,
            timeout=self._sdk.Timeout(read_timeout_s, connect=connect_timeout_s))

    def request_messages(self, request: LlmRequest) -> list[dict[str, Any]]:
        """The ``messages`` sent for ``request``: its system prompt, then its model view.

        Returns:
            ``[{"role": "system", "content": system}?] + to_openai(request.messages, ...)``,
            with ``reasoning_content`` kept per :attr:`reasoning_replay` (only the request's
            model's own) and lone surrogates replaced by U+FFFD.
        """
        replay = self.reasoning_replay != "never"
        # Reasoning goes back only to the model that produced it.
        messages = to_openai(request.messages, include_reasoning=replay,
                             target_model=request.model if replay else None)
        if self.reasoning_replay == "tool-calls":
            for m in messages:
                if m["role"] == "assistant" and "tool_calls" not in m:
                    m.pop("reasoning_content", None)
        if request.system:
            messages.insert(0, {"role": "system",
                                "content": replace_lone_surrogates(request.system)})
        return messages

    def request_body(self, request: LlmRequest) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create`` for ``request`` (streaming).

        Header fields map as ``temperature``, ``maxTokens`` → :attr:`max_tokens_field`,
        ``stop``, ``reasoningEffort`` → ``reasoning_effort``; tools become
        ``{"type": "function", "function": {name, description, parameters}}``.
        """
        config = request.config
        body: dict[str, Any] = {
            "model": request.model, "messages": self.request_messages(request),
            "stream": True, "stream_options": {"include_usage": True}}
        if request.tools:
            body["tools"] = [{"type": "function", "function": replace_lone_surrogates(
                {"name": t["name"], "description": t.get("description") or "",
                 "parameters": t.get("parameters") or {"type": "object", "properties": {}}})}
                for t in request.tools]
        for key, field in (("temperature", "temperature"), ("maxTokens", self.max_tokens_field),
                           ("stop", "stop"), ("reasoningEffort", "reasoning_effort")):
            if config.get(key) is not None:
                body[field] = replace_lone_surrogates(config[key])
        if self.extra_body:
            body["extra_body"] = self.extra_body
        return body

    async def aclose(self) -> None:
        """Close the SDK client and its HTTP connections (call once, when done)."""
        await self.client.close()

    async def stream(self, request: LlmRequest) -> AsyncIterator[StreamChunk]:
        """Stream the reply to ``request`` as dsh chunks, ending with ``finish``.

        Block indices follow first appearance: reasoning, text, then each tool call (parallel
        calls keep the server's ``index`` order). ``block-end`` chunks carry the assembled
        blocks before ``usage`` and ``finish``.

        Raises:
            LlmFailureError: the call failed (see :func:`~dsh.agent.providers._common.
                failure_from_sdk`), the stream ended without a finish reason (``NETWORK``,
                retryable) or the server's content filter stopped it (``CONTENT_FILTERED``).
        """
        state = _StreamState()
        async for chunk in stream_sdk(
                self._sdk, self.client.chat.completions.create(**self.request_body(request)),
                state.take, provider=self.name, model=request.model):
            yield chunk
        for out in state.finish(self.name, request.model):
            yield out


class _StreamState:
    """Translation of one Chat Completions chunk stream into dsh chunks."""

    def __init__(self) -> None:
        self.next_index = 0
        self.reasoning: tuple[int, list[str]] | None = None
        self.text: tuple[int, list[str]] | None = None
        self.calls: dict[int, tuple[int, list[str], list[str]]] = {}  # idx → (index, id, args)
        self.usage: TokenUsage | None = None
        self.finish_reason: str | None = None

    def _open(self, block_type: str) -> tuple[int, StreamChunk]:
        index = self.next_index
        self.next_index += 1
        return index, {"type": "block-start", "index": index, "blockType": block_type}

    def take(self, chunk: Any) -> list[StreamChunk]:
        out: list[StreamChunk] = []
        if chunk.usage is not None:
            self.usage = openai_usage(chunk.usage)
        for choice in chunk.choices[:1]:
            delta = choice.delta
            extra = delta.model_extra or {}
            reasoning = extra.get("reasoning_content") or extra.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                if self.reasoning is None:
                    index, start = self._open("reasoning")
                    self.reasoning = (index, [])
                    out.append(start)
                self.reasoning[1].append(reasoning)
                out.append({"type": "reasoning-delta", "index": self.reasoning[0],
                            "text": reasoning})
            if isinstance(delta.content, str) and delta.content:
                if self.text is None:
                    index, start = self._open("text")
                    self.text = (index, [])
                    out.append(start)
                self.text[1].append(delta.content)
                out.append({"type": "text-delta", "index": self.text[0], "text": delta.content})
            for call in delta.tool_calls or ():
                out.extend(self._call(call))
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
        return out

    def _call(self, call: Any) -> list[StreamChunk]:
        out: list[StreamChunk] = []
        key = call.index if call.index is not None else len(self.calls)
        name = call.function.name if call.function is not None else None
        args = (call.function.arguments if call.function is not None else None) or ""
        if key not in self.calls:
            index, start = self._open("tool-call")
            # Some servers omit ids; a stable stand-in keeps call and result paired.
            self.calls[key] = (index, [call.id or f"call_{index}", name or ""], [])
            out.append(start)
        index, ident, parts = self.calls[key]
        if name and not ident[1]:
            ident[1] = name
        if args or name:
            delta: ToolCallDeltaChunk = {"type": "tool-call-delta", "index": index, "id": ident[0],
                                  "argumentsDelta": args}
            if name:
                delta["name"] = name
            out.append(delta)
            parts.append(args)
        return out

    def finish(self, provider: str, model: str) -> list[StreamChunk]:
        if self.finish_reason is None:
            raise LlmFailureError(f"{provider} model {model}: the stream ended without a "
                                  f"finish reason (connection dropped?); it will be retried",
                                  code="NETWORK", retryable=True)
        if self.finish_reason == "content_filter":
            raise LlmFailureError(f"{provider} model {model}: the provider's content filter "
                                  f"stopped the reply", code="CONTENT_FILTERED")
        ends: list[tuple[int, dict[str, Any]]] = []
        for kind, block in (("reasoning", self.reasoning), ("text", self.text)):
            if block is not None:
                ends.append((block[0], {"type": kind, "text": "".join(block[1])}))
        for index, (call_id, name), parts in self.calls.values():
            ends.append((index, {"type": "tool-call", "id": call_id, "name": name,
                                 "arguments": "".join(parts) or "{}"}))
        out: list[StreamChunk] = [{"type": "block-end", "index": i, "block": b}
                                  for i, b in sorted(ends, key=lambda e: e[0])]
        if self.usage is not None:
            out.append({"type": "usage", "usage": self.usage})
        # Some servers (Ollama) say "stop" when the reply is tool calls.
        kind = "tool-calls" if self.calls else _FINISH.get(self.finish_reason, "stop")
        out.append({"type": "finish", "reason": {"kind": kind}})
        return out

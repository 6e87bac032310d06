"""OpenAIResponsesProvider: the agent loop's provider on the OpenAI Responses API (official SDK).

The Responses shape (``POST /responses``, also served by Open Responses servers): the request
is ``instructions`` (the system prompt), ``input`` (a list of items) and ``tools``; the stream
is typed events, one output item after another. The ``openai`` package is imported when a
provider is created, never by ``import dsh`` (``pip install 'dsh-session[openai]'``).

Mapping (Rule: docs/agent.md#providers):

* the model view becomes input items: user and system messages (``input_text``), assistant
  text (``output_text``), each tool call a ``function_call`` item and each result a
  ``function_call_output`` item; an assistant's ``reasoning`` block goes back as a
  ``reasoning`` item only to the model that produced it and only when it carries the item id
  and encrypted content the API needs to replay it (``store: false`` requests ask for them);
  a checkpoint written by ``/responses/compact`` goes back as its ``compaction`` item;
* output items become dsh blocks in output order: a ``message`` is one ``text`` block, a
  ``reasoning`` item a ``reasoning`` block (summary or full text; ``itemId`` and
  ``encryptedContent`` kept), a ``function_call`` a ``tool-call`` block (``call_id`` is its id);
* ``response.completed`` gives usage (cached input tokens as ``cacheReadTokens``, reasoning
  tokens as ``reasoningTokens``) and the finish (``tool-calls`` when it called a function);
  ``response.incomplete`` with ``max_output_tokens`` finishes ``max-tokens``;
  ``response.failed`` and ``error`` events become typed failures (rate limits and server errors
  retryable, an oversized prompt a context overflow).

:meth:`OpenAIResponsesProvider.compact` calls ``POST /responses/compact`` where the server
offers it (None where it answers 404 or 405).
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final, Literal

from dsh._errors import ConfigError, LlmFailureError
from dsh._install import install_hint
from dsh._messages import StreamChunk, TokenUsage
from dsh.agent._provider import LlmRequest
from dsh.agent.providers._common import failure_from_sdk, replace_lone_surrogates, stream_sdk

COMPACTION_PROVIDER: Final = "openai-responses"
"""``provider`` of the ``provider-raw`` block that carries a ``/responses/compact`` item."""

_MISSING_RESULT: Final = ("No result was recorded for this tool call; treat its outcome as "
                          "unknown.")

_FAILURES: Final[dict[str, tuple[str, bool]]] = {
    "rate_limit_exceeded": ("RATE_LIMITED", True),
    "server_error": ("SERVER_ERROR", True),
    "context_length_exceeded": ("CONTEXT_OVERFLOW", False),
    "insufficient_quota": ("QUOTA_EXHAUSTED", False),
}


def _sdk() -> Any:
    try:
        return importlib.import_module("openai")
    except ImportError as exc:
        raise ConfigError("the OpenAI Responses provider needs the openai package: "
                          f"{install_hint('openai')}", code="MISSING_EXTRA") from exc


def _get(value: Any, key: str, default: Any = None) -> Any:
    """A field of an SDK object or of a mapping."""
    if isinstance(value, Mapping):
        return value.get(key, default)
    return getattr(value, key, default)


def responses_usage(usage: Any) -> TokenUsage:
    """Responses ``usage`` (SDK object or dict) as disjoint dsh :class:`TokenUsage`.

    ``input_tokens_details.cached_tokens`` move from ``inputTokens`` to ``cacheReadTokens``;
    ``output_tokens_details.reasoning_tokens`` from ``outputTokens`` to ``reasoningTokens``.
    """
    given = int(_get(usage, "input_tokens") or 0)
    made = int(_get(usage, "output_tokens") or 0)
    cached = int(_get(_get(usage, "input_tokens_details") or {}, "cached_tokens") or 0)
    reasoning = int(_get(_get(usage, "output_tokens_details") or {}, "reasoning_tokens") or 0)
    out: TokenUsage = {"inputTokens": max(0, given - cached),
                       "outputTokens": max(0, made - reasoning)}
    if cached:
        out["cacheReadTokens"] = cached
    if reasoning:
        out["reasoningTokens"] = reasoning
    return out


def _text(blocks: Sequence[Any]) -> str:
    return "".join(b["text"] for b in blocks if isinstance(b, Mapping)
                   and b.get("type") == "text" and isinstance(b.get("text"), str))


def _result_text(block: Mapping[str, Any]) -> str:
    content = block.get("content")
    return _text(content) if isinstance(content, list | tuple) else str(content or "")


def _reasoning_item(block: Mapping[str, Any]) -> dict[str, Any] | None:
    item_id, encrypted = block.get("itemId"), block.get("encryptedContent")
    if not isinstance(item_id, str) or not isinstance(encrypted, str):
        return None  # the API replays reasoning by id and encrypted content only
    summary = block.get("summary")
    texts = summary if isinstance(summary, list) else [block.get("text") or ""]
    return {"type": "reasoning", "id": item_id, "encrypted_content": encrypted,
            "summary": [{"type": "summary_text", "text": str(t)} for t in texts if t]}


def responses_input(messages: Sequence[Mapping[str, Any]], *,
                    target_model: str | None = None) -> list[dict[str, Any]]:
    """Convert derived messages to Responses ``input`` items (see the module's mapping).

    Args:
        messages: The model view (derived messages).
        target_model: The model the request is for: reasoning of another model is not sent.

    Returns:
        Input items in order. A result whose call is not in the view becomes user text; a call
        without a result gets a synthetic ``function_call_output`` saying none was recorded.
    """
    out: list[dict[str, Any]] = []
    open_calls: list[str] = []

    def settle() -> None:
        for call_id in open_calls:
            out.append({"type": "function_call_output", "call_id": call_id,
                        "output": _MISSING_RESULT})
        open_calls.clear()

    for message in messages:
        role = message.get("role")
        content = [b for b in message.get("content") or () if isinstance(b, Mapping)]
        if role == "assistant":
            settle()
            source = message.get("source")
            own = not isinstance(source, Mapping) or target_model is None \
                or source.get("model") == target_model
            for block in content:
                kind = block.get("type")
                if kind == "reasoning" and own:
                    item = _reasoning_item(block)
                    if item is not None:
                        out.append(item)
                elif kind == "text" and block.get("text"):
                    out.append({"role": "assistant", "content": [
                        {"type": "output_text", "text": block["text"]}]})
                elif kind == "tool-call":
                    out.append({"type": "function_call", "call_id": str(block.get("id")),
                                "name": str(block.get("name", "")),
                                "arguments": str(block.get("arguments") or "{}")})
                    open_calls.append(str(block.get("id")))
            continue
        texts: list[dict[str, Any]] = []
        extra: list[dict[str, Any]] = []
        for block in content:
            kind = block.get("type")
            if kind == "tool-result":
                call_id = str(block.get("toolCallId"))
                if call_id in open_calls:
                    open_calls.remove(call_id)
                    out.append({"type": "function_call_output", "call_id": call_id,
                                "output": _result_text(block)})
                else:
                    texts.append({"type": "input_text", "text": f"[result of tool call "
                                  f"{call_id}]: {_result_text(block)}"})
            elif kind == "text" and isinstance(block.get("text"), str):
                texts.append({"type": "input_text", "text": block["text"]})
            elif kind == "provider-raw" and block.get("provider") == COMPACTION_PROVIDER \
                    and isinstance(block.get("block"), Mapping):
                extra.append(dict(block["block"]))
            elif kind == "image":
                texts.append({"type": "input_text", "text": "[image]"})
        if texts or extra:
            settle()
        if texts:
            out.append({"role": "system" if role == "system" else "user", "content": texts})
        out.extend(extra)
    settle()
    return replace_lone_surrogates(out)  # type: ignore[no-any-return]


class OpenAIResponsesProvider:
    """A :class:`~dsh.agent._provider.Provider` on ``openai.AsyncOpenAI().responses``.

    Args:
        model: Default model id (the loop's header ``config.model`` wins per request).
        api_key: The API key (servers that need none accept any text).
        base_url: The API root, e.g. an Open Responses server's; None for OpenAI's.
        name: Provider id written into the log (``config.provider``).
        store: Ask the server to keep responses (``store``). False (default) keeps nothing
            server-side, and reasoning comes back encrypted so it can be replayed.
        reasoning_summary: ``reasoning.summary`` sent with ``reasoningEffort``: ``auto``,
            ``concise``, ``detailed``, or None to ask for none.
        read_timeout_s: Seconds without a byte from the server before the call fails
            (``TIMEOUT``, retryable).
        connect_timeout_s: Seconds to connect.
        extra_body: Extra JSON fields sent with every request.
        client: An existing ``AsyncOpenAI`` to use instead of building one.

    The SDK's own retries are off: the loop retries retryable failures and logs each retry.

    Raises:
        ConfigError: the ``openai`` package is not installed (code ``MISSING_EXTRA``).
    """

    compaction_provider: Final = COMPACTION_PROVIDER
    """``provider`` of the ``provider-raw`` checkpoint blocks :meth:`compact`'s items ride in."""

    def __init__(self, *, model: str, api_key: str, base_url: str | None = None,
                 name: str = "openai", store: bool = False,
                 reasoning_summary: Literal["auto", "concise", "detailed"] | None = "auto",
                 read_timeout_s: float = 120.0, connect_timeout_s: float = 10.0,
                 extra_body: Mapping[str, Any] | None = None, client: Any = None) -> None:
        self._sdk = _sdk()
        self.name = name
        self.model = model
        self.store = store
        self.reasoning_summary = reasoning_summary
        self.extra_body = dict(extra_body or {})
        self.client = client or self._sdk.AsyncOpenAI(
            api_key=api_key, base_url=base_url, max_retries=0,
            timeout=self._sdk.Timeout(read_timeout_s, connect=connect_timeout_s))

    def request_body(self, request: LlmRequest) -> dict[str, Any]:
        """The keyword arguments of ``responses.create`` for ``request`` (streaming).

        ``instructions`` is the system prompt; ``input`` :func:`responses_input` of the view
        (the request's model's own reasoning only); tools become ``{type: "function", name,
        description, parameters}``; header ``maxTokens`` → ``max_output_tokens``,
        ``temperature``, ``reasoningEffort`` → ``reasoning: {effort, summary}``; ``store``,
        and with ``store`` off ``include: ["reasoning.encrypted_content"]``.
        """
        config = request.config
        body: dict[str, Any] = {"model": request.model, "stream": True, "store": self.store,
                                "input": responses_input(request.messages,
                                                         target_model=request.model)}
        if request.system:
            body["instructions"] = replace_lone_surrogates(request.system)
        if request.tools:
            body["tools"] = [replace_lone_surrogates(
                {"type": "function", "name": t["name"], "description": t.get("description") or "",
                 "parameters": t.get("parameters") or {"type": "object", "properties": {}}})
                for t in request.tools]
        if config.get("maxTokens") is not None:
            body["max_output_tokens"] = config["maxTokens"]
        if config.get("temperature") is not None:
            body["temperature"] = config["temperature"]
        if config.get("reasoningEffort") is not None:
            reasoning: dict[str, Any] = {"effort": config["reasoningEffort"]}
            if self.reasoning_summary is not None:
                reasoning["summary"] = self.reasoning_summary
            body["reasoning"] = reasoning
        if not self.store:
            body["include"] = ["reasoning.encrypted_content"]
        if self.extra_body:
            body["extra_body"] = self.extra_body
        return body

    async def aclose(self) -> None:
        """Close the SDK client and its HTTP connections (call once, when done)."""
        await self.client.close()

    async def stream(self, request: LlmRequest) -> AsyncIterator[StreamChunk]:
        """Stream the reply to ``request`` as dsh chunks, ending with ``finish``.

        Raises:
            LlmFailureError: the call failed (:func:`~dsh.agent.providers._common.
                failure_from_sdk`), the response failed or reported an error event (codes as
                the module says), or the stream ended before ``response.completed``
                (``NETWORK``, retryable).
        """
        state = _StreamState(self.name, request.model)
        async for chunk in stream_sdk(
                self._sdk, self.client.responses.create(**self.request_body(request)),
                state.take, provider=self.name, model=request.model):
            yield chunk
        for out in state.finish():
            yield out

    def compaction_usage(self, usage: Any) -> TokenUsage:
        """The usage of a :meth:`compact` call as dsh ``TokenUsage`` (:func:`responses_usage`)."""
        return responses_usage(usage)

    async def compact(self, request: LlmRequest) -> Any | None:
        """Compact ``request``'s view with ``POST /responses/compact``, where offered.

        Returns:
            The SDK's ``CompactedResponse`` (``output``: the user messages, then one
            ``compaction`` item; ``usage``), or None when the server does not offer the
            endpoint (it answers 404 or 405).

        Raises:
            LlmFailureError: any other failure (as :meth:`stream`).
        """
        body: dict[str, Any] = {"model": request.model,
                                "input": responses_input(request.messages,
                                                         target_model=request.model)}
        if request.system:
            body["instructions"] = replace_lone_surrogates(request.system)
        try:
            return await self.client.responses.compact(**body)
        except Exception as exc:  # SDK errors are mapped; a missing endpoint means "not here"
            status = getattr(exc, "status_code", None)
            if isinstance(exc, self._sdk.APIStatusError) and status in (404, 405):
                return None
            raise failure_from_sdk(exc, self._sdk, provider=self.name,
                                   model=request.model) from exc


class _StreamState:
    """Translation of one Responses event stream into dsh chunks."""

    def __init__(self, provider: str, model: str) -> None:
        self.where = f"{provider} model {model}"
        self.blocks: dict[int, tuple[int, str]] = {}  # output_index -> (block index, kind)
        self.parts: dict[int, list[str]] = {}
        self.usage: TokenUsage | None = None
        self.finish_kind: str | None = None
        self.calls = False

    def _open(self, output_index: int, kind: str) -> tuple[int, list[StreamChunk]]:
        known = self.blocks.get(output_index)
        if known is not None:
            return known[0], []
        index = len(self.blocks)
        self.blocks[output_index] = (index, kind)
        self.parts[output_index] = []
        return index, [{"type": "block-start", "index": index, "blockType": kind}]

    def take(self, event: Any) -> list[StreamChunk]:
        kind = event.type
        if kind == "response.output_item.added":
            item = event.item
            item_type = _get(item, "type")
            if item_type == "function_call":
                index, out = self._open(event.output_index, "tool-call")
                out.append({"type": "tool-call-delta", "index": index,
                            "id": str(_get(item, "call_id")), "name": str(_get(item, "name")),
                            "argumentsDelta": ""})
                return out
            if item_type in ("message", "reasoning"):
                return self._open(event.output_index,
                                  "text" if item_type == "message" else "reasoning")[1]
            return []
        if kind == "response.output_text.delta":
            index, out = self._open(event.output_index, "text")
            self.parts[event.output_index].append(event.delta)
            return [*out, {"type": "text-delta", "index": index, "text": event.delta}]
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            index, out = self._open(event.output_index, "reasoning")
            return [*out, {"type": "reasoning-delta", "index": index, "text": event.delta}]
        if kind == "response.function_call_arguments.delta":
            known = self.blocks.get(event.output_index)
            if known is None:
                return []
            return [{"type": "tool-call-delta", "index": known[0], "id": "",
                     "argumentsDelta": event.delta}]
        if kind == "response.output_item.done":
            return self._done(event.output_index, event.item)
        if kind in ("response.completed", "response.incomplete"):
            response = event.response
            if _get(response, "usage") is not None:
                self.usage = responses_usage(response.usage)
            if kind == "response.completed":
                self.finish_kind = "tool-calls" if self.calls else "stop"
            else:
                reason = _get(_get(response, "incomplete_details"), "reason")
                if reason == "content_filter":
                    raise LlmFailureError(f"{self.where}: the provider's content filter "
                                          f"stopped the reply", code="CONTENT_FILTERED")
                self.finish_kind = "max-tokens"
            return []
        if kind == "response.failed":
            error = _get(event.response, "error")
            raise self._failure(_get(error, "code"), _get(error, "message"))
        if kind == "error":
            raise self._failure(_get(event, "code"), _get(event, "message"))
        return []

    def _failure(self, code: object, message: object) -> LlmFailureError:
        text = str(message or "the response failed")
        dsh_code, retryable = _FAILURES.get(str(code), ("BAD_REQUEST", False))
        if "context" in text.lower() and ("window" in text.lower() or "length" in text.lower()):
            dsh_code, retryable = "CONTEXT_OVERFLOW", False
        return LlmFailureError(f"{self.where}: {code}: {text}", code=dsh_code,
                               retryable=retryable, context_overflow=dsh_code ==
                               "CONTEXT_OVERFLOW")

    def _done(self, output_index: int, item: Any) -> list[StreamChunk]:
        item_type = _get(item, "type")
        if item_type == "message":
            index, out = self._open(output_index, "text")
            parts = [_get(p, "text") or _get(p, "refusal") or "" for p in _get(item, "content")
                     or ()]
            return [*out, {"type": "block-end", "index": index,
                           "block": {"type": "text", "text": "".join(parts)}}]
        if item_type == "reasoning":
            index, out = self._open(output_index, "reasoning")
            summary = [str(_get(p, "text") or "") for p in _get(item, "summary") or ()]
            content = [str(_get(p, "text") or "") for p in _get(item, "content") or ()]
            block: dict[str, Any] = {"type": "reasoning",
                                     "text": "\n\n".join(content or summary)}
            if content and summary:
                block["summary"] = summary
            item_id = _get(item, "id")
            if isinstance(item_id, str):
                block["itemId"] = item_id
            encrypted = _get(item, "encrypted_content")
            if isinstance(encrypted, str):
                block["encryptedContent"] = encrypted
            return [*out, {"type": "block-end", "index": index, "block": block}]
        if item_type == "function_call":
            index, out = self._open(output_index, "tool-call")
            self.calls = True
            return [*out, {"type": "block-end", "index": index, "block": {
                "type": "tool-call", "id": str(_get(item, "call_id")),
                "name": str(_get(item, "name")),
                "arguments": str(_get(item, "arguments") or "{}")}}]
        return []

    def finish(self) -> list[StreamChunk]:
        if self.finish_kind is None:
            raise LlmFailureError(f"{self.where}: the stream ended before response.completed "
                                  f"(connection dropped?); it will be retried", code="NETWORK",
                                  retryable=True)
        out: list[StreamChunk] = []
        if self.usage is not None:
            out.append({"type": "usage", "usage": self.usage})
        out.append({"type": "finish", "reason": {"kind": self.finish_kind}})  # type: ignore[typeddict-item]
        return out


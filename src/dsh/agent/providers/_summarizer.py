"""A compaction summarizer that asks a real model, through the same provider as the agent loop.

:func:`provider_summarizer` wraps a provider into :class:`~dsh.compaction.LlmSummarizer`: the
span to compact plus the compaction instruction go out as one streamed request (no tools, no
system prompt) and the reply's text becomes the checkpoint. It is awaitable only (use it with
``acompact_now`` / ``acompact_surface_region``): a provider streams on the running event loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dsh._errors import ConfigError
from dsh.agent._provider import LlmRequest, Provider, StreamAssembler
from dsh.compaction import LlmSummarizer
from dsh.json import snapshot_json


def provider_summarizer(provider: Provider, *, provider_name: str, model: str,
                        max_tokens: int = 8192) -> LlmSummarizer:
    """Return an :class:`LlmSummarizer` whose ``acomplete`` streams one request to ``provider``.

    Args:
        provider: A provider (``OpenAIChatProvider``, ``AnthropicProvider``, or any other).
        provider_name: Provider id for the request header and ``compaction/summary``.
        model: Model id.
        max_tokens: Generation cap of the summary (tokens).

    Returns:
        The summarizer. Its synchronous ``complete`` raises :class:`ConfigError` (code
        ``ASYNC_ONLY``): run it through the async compaction functions.

    Raises (from the compaction call):
        LlmFailureError: the model call failed; the compaction records its failure.
        CompactionError: code ``summary`` when the reply has no text.
    """
    header = snapshot_json({"config": {"provider": provider_name, "model": model,
                                       "maxTokens": max_tokens}})

    async def acomplete(messages: list[Mapping[str, Any]]) -> str:
        request = LlmRequest(session_id="compaction", header=header,
                             messages=tuple(snapshot_json(m) for m in messages))
        assembler = StreamAssembler()
        async for chunk in provider.stream(request):
            assembler.feed(chunk)
        content: Sequence[Any] = assembler.response().content
        return "".join(b["text"] for b in content if b["type"] == "text")

    def complete(messages: list[Mapping[str, Any]]) -> str:
        raise ConfigError("the model summarizer streams on the event loop: compact with "
                          "acompact_now or acompact_surface_region", code="ASYNC_ONLY")

    return LlmSummarizer(complete=complete, acomplete=acomplete, provider=provider_name,
                         model=model, max_tokens=max_tokens)

"""Prompt-cache keeping: request fingerprints, and the model summarizer as a continuation.

Providers cache the longest prefix of a request they have already processed (tools, system,
then the messages in order), and charge cached input tokens at a fraction of the price. A
compaction usually throws that away twice: the summarizer request is a new prompt (the span
alone, under another system prompt), and the first request after it starts with the new
checkpoint. This module keeps the prefix (Rule: docs/effects.md#cache-keeping-compaction):

* every request's fingerprint (:class:`Fingerprints`): hashes of its tools, its system part
  and its message prefix, and how many leading messages it shares with the request before it,
  recorded with the answer (``assistant/message.request``) beside the provider's cache-read and
  cache-write token counts (``usage``);
* :class:`ModelSummarizer` with ``continuation=True`` sends the summary request as the next
  request of the conversation: the same header (tools, system, config) as the last logged
  request, every current message, then the summary instruction, so all but the instruction
  and the newest messages are read from the cache; its fingerprint and usage go into
  ``compaction/summary``;
* the compaction keeps the longest head it can (``CompactionPolicy(keep_cache=True)``,
  :func:`dsh.compaction.select_cache_keeping_range`), so the first request after it shares
  that head with everything sent before.

Fingerprint hashes are the first 16 hex digits of SHA-256 over the compact JSON of each part;
the message prefix hash chains one message at a time, so equal prefixes have equal hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Final

from dsh._errors import CompactionError, ConfigError
from dsh.agent._provider import LlmRequest, Provider, StreamAssembler
from dsh.compaction import COMPACTION_INSTRUCTION, SummaryResult
from dsh.json import FrozenDict, JsonValue, dumps, snapshot_json
from dsh.session import Session

__all__ = ["Fingerprints", "ModelSummarizer", "continuation_instruction"]

_HEX: Final = 16
_INSTRUCTION_SOURCE: Final = FrozenDict({"kind": "plugin", "plugin": "dsh-compaction"})


def _digest(value: object) -> str:
    return hashlib.sha256(dumps(value)).hexdigest()[:_HEX]


class Fingerprints:
    """Fingerprints of the requests one agent sends, and what each shares with the last one.

    Message hashes are kept per message object (the log's frozen messages are shared between
    requests), so a request costs one hash per new message.
    """

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[object, str]] = {}
        self._last_chain: list[str] = []
        self._last_head: tuple[str, str] | None = None

    def _message_hash(self, message: object) -> str:
        known = self._by_id.get(id(message))
        if known is not None and known[0] is message:
            return known[1]
        value = _digest(message)
        if len(self._by_id) > 100_000:  # a very long session: forget the oldest half
            for key in list(self._by_id)[:50_000]:
                del self._by_id[key]
        self._by_id[id(message)] = (message, value)
        return value

    def chain(self, messages: Sequence[object]) -> list[str]:
        """The prefix hash after each message (``chain[i]`` covers messages 0..i)."""
        out: list[str] = []
        running = ""
        for message in messages:
            running = hashlib.sha256(
                (running + self._message_hash(message)).encode()).hexdigest()[:_HEX]
            out.append(running)
        return out

    def of(self, request: LlmRequest, *, remember: bool = True) -> dict[str, JsonValue]:
        """The fingerprint of ``request``: ``{tools, system, messages, prefix, sharedMessages}``.

        ``tools`` and ``system`` hash those parts of the header (None when absent),
        ``messages`` counts the messages, ``prefix`` hashes all of them (chained), and
        ``sharedMessages`` is how many leading messages it shares with the previous request
        this agent fingerprinted with ``remember`` (None for the first one, or when tools or
        system differ: then nothing is shared).
        """
        tools = _digest(list(request.tools)) if request.tools else None
        system = _digest(request.system) if request.system else None
        chain = self.chain(request.messages)
        shared: int | None = None
        if self._last_head is not None:
            shared = 0
            if self._last_head == (tools or "", system or ""):
                for ours, theirs in zip(chain, self._last_chain, strict=False):
                    if ours != theirs:
                        break
                    shared += 1
        if remember:
            self._last_chain = chain
            self._last_head = (tools or "", system or "")
        return {"tools": tools, "system": system, "messages": len(chain),
                "prefix": chain[-1] if chain else None, "sharedMessages": shared}


def continuation_instruction(kept: int, replaced: int) -> str:
    """The summary instruction of a continuation request.

    Args:
        kept: Leading messages that stay as they are (they are not summarized).
        replaced: Messages after them the checkpoint replaces (through the newest).
    """
    if kept == 0:
        return COMPACTION_INSTRUCTION
    return (f"The first {kept} messages of this conversation stay in the context as they are; "
            f"the {replaced} messages after them will be replaced by a checkpoint. "
            + COMPACTION_INSTRUCTION.replace(
                "Write a checkpoint of the conversation so far so that work can continue "
                "from it alone.",
                "Write that checkpoint now, so that work can continue from the kept messages "
                "and the checkpoint alone; cover what the replaced messages established, "
                "briefly restating from the kept ones only what the work still needs."))


class ModelSummarizer:
    """A compaction summarizer that asks the agent's own model (asynchronously).

    Args:
        provider: The agent's provider.
        session: The live session being compacted.
        header: The request header to send with: the latest logged ``request/header`` (same
            tools, system and config as the last request, so its prefix is cached).
        continuation: True: send the whole current model view, then the instruction (a
            continuation of the last request); False: the span alone under a header without
            tools or system (when the whole view does not fit: a context overflow).
        fingerprints: The agent's fingerprints (the summary request is fingerprinted against
            the last request, and does not replace it as the last one).

    The result's ``usage`` carries the provider's cache counts and ``request`` the
    fingerprint; both land in ``compaction/summary``.
    """

    def __init__(self, provider: Provider, session: Session, header: Mapping[str, Any], *,
                 continuation: bool, fingerprints: Fingerprints | None = None) -> None:
        self._provider = provider
        self._session = session
        self._header = snapshot_json(dict(header))
        self._continuation = continuation
        self._fingerprints = fingerprints or Fingerprints()
        config = self._header["config"]
        self.provider = str(config["provider"])
        self.model = str(config["model"])

    def summarize(self, messages: Sequence[Mapping[str, Any]], *,
                  previous: str | None = None) -> SummaryResult:
        """Refused: the model is asked on the event loop (use the async compaction paths).

        Raises:
            ConfigError: always (code ``ASYNC_ONLY``).
        """
        raise ConfigError("the model summarizer streams on the event loop: compact with "
                          "acompact_now, acompact_surface_region or acompact_if_needed",
                          code="ASYNC_ONLY")

    def _request(self, span: Sequence[Mapping[str, Any]]) -> LlmRequest:
        if self._continuation:
            view = tuple(self._session.derive_messages())
            first = span[0] if span else None
            kept = next((i for i, m in enumerate(view) if m is first), len(view))
            text = continuation_instruction(kept, len(view) - kept)
            header = self._header
        else:
            view = tuple(snapshot_json(m) for m in span)
            text = COMPACTION_INSTRUCTION
            header = snapshot_json({"config": dict(self._header["config"])})
        instruction = snapshot_json({
            "id": f"compaction-instruction-{self._session.seq}", "role": "user",
            "content": [{"type": "text", "text": text}], "source": _INSTRUCTION_SOURCE})
        return LlmRequest(session_id=self._session.id, messages=(*view, instruction),
                          header=header)

    async def asummarize(self, messages: Sequence[Mapping[str, Any]], *,
                         previous: str | None = None) -> SummaryResult:
        """Ask the model for the checkpoint of ``messages`` (the span); cancellation propagates.

        Raises:
            LlmFailureError: the model call failed (the compaction records its failure).
            CompactionError: code ``SUMMARY`` when the reply holds no text.
        """
        request = self._request(messages)
        fingerprint = self._fingerprints.of(request, remember=False)
        assembler = StreamAssembler()
        stream = self._provider.stream(request)
        try:
            async for chunk in stream:
                assembler.feed(chunk)
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()
        response = assembler.response()
        text = "".join(b["text"] for b in response.content if b["type"] == "text")
        if not text.strip():
            raise CompactionError("the summarization model returned no text summary",
                                  code="SUMMARY")
        usage: JsonValue = snapshot_json(dict(response.usage)) if response.usage else None
        config = self._header["config"]
        max_tokens = config.get("maxTokens")
        return SummaryResult(
            summary=(text,), provider=self.provider, model=self.model,
            raw_output=snapshot_json([dict(b) for b in response.content
                                      if b["type"] == "text"]),
            llm_stream_call=True, max_tokens=max_tokens if type(max_tokens) is int else None,
            usage=usage, request=snapshot_json(fingerprint))

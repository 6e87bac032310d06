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
* a provider that compacts on its side (:class:`RemoteCompactor`: the Responses API's
  ``/responses/compact``, where the server offers it) is asked first, with the span; its opaque
  compaction item rides in the checkpoint message as a ``provider-raw`` block that provider
  sends back, and the kept user messages are the checkpoint's readable text;
* the compaction keeps the longest head it can (``CompactionPolicy(keep_cache=True)``,
  :func:`dsh.compaction.select_cache_keeping_range`), so the first request after it shares
  that head with everything sent before.

Fingerprint hashes are the first 16 hex digits of SHA-256 over the compact JSON of each part;
the message prefix hash chains one message at a time, so equal prefixes have equal hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol, runtime_checkable

from dsh._errors import CompactionError, ConfigError
from dsh.agent._provider import LlmRequest, Provider, StreamAssembler
from dsh.compaction import COMPACTION_INSTRUCTION, SummaryResult
from dsh.json import FrozenDict, JsonValue, dumps, snapshot_json
from dsh.session import Session

_HEX: Final = 16
_INSTRUCTION_SOURCE: Final = FrozenDict({"kind": "plugin", "plugin": "dsh-compaction"})


@runtime_checkable
class RemoteCompactor(Protocol):
    """A provider that compacts a conversation on its side (a declared capability).

    ``compact(request)`` returns the server's compacted output (an object with ``output``
    items, the last a ``compaction`` item with ``encrypted_content``, and ``usage``), or None
    when the server does not offer it; ``compaction_provider`` names the ``provider-raw``
    blocks it reads back; ``compaction_usage(usage)`` maps its usage to dsh ``TokenUsage``.
    """

    compaction_provider: str

    async def compact(self, request: LlmRequest) -> Any | None: ...

    def compaction_usage(self, usage: Any) -> Mapping[str, int]: ...


def _field(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, Mapping) else getattr(value, key, None)


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

    async def _remote(self, span: Sequence[Mapping[str, Any]]) -> SummaryResult | None:
        """The provider's own compaction of the span, or None (none offered)."""
        provider = self._provider
        if not isinstance(provider, RemoteCompactor) or not span:
            return None
        header: dict[str, Any] = {"config": dict(self._header["config"])}
        if self._header.get("system"):
            header["system"] = self._header["system"]
        request = LlmRequest(session_id=self._session.id,
                             messages=tuple(snapshot_json(m) for m in span),
                             header=snapshot_json(header))
        compacted = await provider.compact(request)
        if compacted is None:
            return None
        items: list[dict[str, Any]] = []
        for item in _field(compacted, "output") or ():
            kind = _field(item, "type")
            if kind == "message":
                texts = [_field(p, "text") for p in _field(item, "content") or ()]
                items.append({"type": "message", "role": _field(item, "role"),
                              "texts": [t for t in texts if isinstance(t, str) and t]})
            elif kind == "compaction":
                items.append({"type": "compaction", "id": _field(item, "id"),
                              "encrypted_content": _field(item, "encrypted_content")})
        kept = [t for i in items if i["type"] == "message" for t in i["texts"]]
        found = next((i for i in items if i["type"] == "compaction"), None)
        if found is None or not isinstance(found["encrypted_content"], str):
            raise CompactionError("the provider's compaction returned no compaction item",
                                  code="SUMMARY")
        text = (f"The earlier conversation was compacted by the provider ({self.provider} "
                f"/responses/compact); the provider keeps its content in the attached item. "
                f"Its user messages were:\n" + "\n".join(f"- {t}" for t in kept))
        usage = _field(compacted, "usage")
        block = {"type": "compaction", "encrypted_content": found["encrypted_content"]}
        if isinstance(found["id"], str):
            block["id"] = found["id"]
        return SummaryResult(
            summary=(text,), provider=self.provider, model=self.model,
            raw_output=snapshot_json(items),
            usage=snapshot_json(dict(provider.compaction_usage(usage))) if usage else None,
            request=snapshot_json(self._fingerprints.of(request, remember=False)),
            blocks=snapshot_json([{"type": "provider-raw",
                                   "provider": provider.compaction_provider,
                                   "block": block}]))

    async def asummarize(self, messages: Sequence[Mapping[str, Any]], *,
                         previous: str | None = None) -> SummaryResult:
        """Ask the model for the checkpoint of ``messages`` (the span); cancellation propagates.

        Raises:
            LlmFailureError: the model call failed (the compaction records its failure).
            CompactionError: code ``SUMMARY`` when the reply holds no text.
        """
        remote = await self._remote(messages)
        if remote is not None:
            return remote
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

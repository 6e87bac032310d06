"""The provider protocol: how the agent loop asks a model for one streamed reply.

A provider turns an :class:`LlmRequest` (the model-visible messages derived from the log, the
canonical request header and the session id) into an async stream of dsh
:data:`~dsh._messages.StreamChunk` values, ending with one ``finish`` chunk. The loop logs every
chunk as ``assistant/chunk`` and assembles the final assistant message from the stream with
:class:`StreamAssembler`, so a provider only translates its SDK's stream into dsh chunks.

Rules a provider follows (docs/events.md#the-message-model, docs/agent.md#providers):

* chunks use dsh's vocabulary: ``block-start``, ``text-delta``, ``reasoning-delta``,
  ``tool-call-delta``, ``block-end`` (the authoritative assembled block), ``usage``, and last
  ``finish {reason}``; nothing follows ``finish``;
* a failure is raised as :class:`~dsh._errors.LlmFailureError` (``retryable`` for rate limits,
  overload, timeouts and dropped connections; ``context_overflow`` when the request did not
  fit), or delivered as ``finish {reason: {kind: "error" | "aborted", failure}}``;
* the request is read-only: it is frozen, and the loop checks before every call that its
  messages equal the log's projection and its header the latest logged ``request/header``;
* cancellation is asyncio's: the loop cancels the task iterating the stream and closes the
  iterator (``aclose``); a provider releases its connection in ``finally``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, runtime_checkable

from dsh._errors import LlmFailureError
from dsh._messages import StreamChunk, TokenUsage
from dsh.json import FrozenDict, JsonValue, snapshot_json

FinishKind = Literal["stop", "tool-calls", "max-tokens", "aborted", "error"]
"""The ``kind`` of a ``finish`` chunk's reason (docs/events.md#stream-chunks)."""

RETRYABLE_FAILURE_CODES: Final = frozenset({
    "RATE_LIMITED", "OVERLOADED", "TIMEOUT", "NETWORK", "SERVER_ERROR", "UNAVAILABLE"})
"""Failure codes a ``finish {kind: "error"}`` chunk may carry that mean "try again later"."""

CONTEXT_OVERFLOW_CODE: Final = "CONTEXT_OVERFLOW"


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmRequest:
    """One model request, built by the loop from the log at dispatch time (frozen).

    Attributes:
        session_id: The live session the request belongs to.
        messages: The model-visible messages, ``session.derive_messages()`` at dispatch time
            (frozen ``Message`` mappings, shared with the log, never copied).
        header: The canonical request header ``{config, adapterDefaults?, system?, tools?}``:
            ``config`` is ``{provider, model, reasoningEffort?, temperature?, maxTokens?,
            stop?}``; ``tools`` a list of ``{name, description, parameters}`` (JSON Schema).
        context_window: The model's context window in tokens, when known.

    Rule: docs/agent.md#providers, docs/rules.md#request--projection.
    """

    session_id: str
    messages: tuple[FrozenDict, ...]
    header: FrozenDict
    context_window: int | None = None

    @property
    def config(self) -> FrozenDict:
        """``header["config"]``: provider, model and sampling options."""
        config: FrozenDict = self.header["config"]
        return config

    @property
    def provider(self) -> str:
        """The provider id (``config["provider"]``)."""
        return str(self.header["config"]["provider"])

    @property
    def model(self) -> str:
        """The model id (``config["model"]``)."""
        return str(self.header["config"]["model"])

    @property
    def system(self) -> str | None:
        """The system prompt, or None when the header has none."""
        system = self.header.get("system")
        return system if isinstance(system, str) else None

    @property
    def tools(self) -> tuple[FrozenDict, ...]:
        """The tool declarations ``{name, description, parameters}``, in header order."""
        tools = self.header.get("tools")
        return tuple(tools) if tools else ()


@runtime_checkable
class Provider(Protocol):
    """A model backend: one streamed reply per request.

    Implement :meth:`stream` as an async generator. The loop iterates it to the end (or cancels
    it), logging each chunk as it arrives.
    """

    def stream(self, request: LlmRequest) -> AsyncIterator[StreamChunk]:
        """Stream the reply to ``request`` as dsh chunks ending with ``finish``.

        Args:
            request: The frozen request; do not keep references to its messages past the call.

        Yields:
            StreamChunk: ``block-start``/deltas/``block-end`` per content block, ``usage`` when
            the provider reports it, then exactly one ``finish``.

        Raises:
            LlmFailureError: the call failed (set ``retryable`` / ``context_overflow``).
        """
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmResponse:
    """What one successful stream produced, assembled from its chunks.

    Attributes:
        finish: ``"stop"``, ``"tool-calls"`` or ``"max-tokens"``.
        content: The content blocks in index order (``text``, ``reasoning``, ``tool-call``).
        usage: The last ``usage`` chunk's token usage, or None.
        replay_state: The ``finish`` chunk's adapter replay state, or None.
    """

    finish: FinishKind
    content: tuple[FrozenDict, ...]
    usage: TokenUsage | None = None
    replay_state: JsonValue = None

    @property
    def tool_calls(self) -> tuple[FrozenDict, ...]:
        """The ``tool-call`` blocks ``{type, id, name, arguments}``, in model order."""
        return tuple(block for block in self.content if block["type"] == "tool-call")


def failure_error(failure: Mapping[str, Any], *, kind: str = "error") -> LlmFailureError:
    """Build the :class:`LlmFailureError` a ``finish {kind: "error" | "aborted"}`` chunk means.

    Args:
        failure: The chunk's ``LlmFailure`` ``{message, code, status?, providerRetryAfterMs?,
            requestId?}`` (missing fields get defaults).
        kind: The finish kind, used in the default message.

    Returns:
        The error; ``retryable`` when the code is in :data:`RETRYABLE_FAILURE_CODES` or the
        status is 408, 429 or 5xx; ``context_overflow`` when the code is ``CONTEXT_OVERFLOW``.
    """
    code = str(failure.get("code") or "UNKNOWN")
    status = failure.get("status")
    status = status if type(status) is int else None
    retry_after = failure.get("providerRetryAfterMs")
    request_id = failure.get("requestId")
    retryable = code in RETRYABLE_FAILURE_CODES or (
        status is not None and (status in (408, 429) or status >= 500))
    return LlmFailureError(
        str(failure.get("message") or f"the model stream finished with {kind!r}"), code=code,
        retryable=retryable, context_overflow=code == CONTEXT_OVERFLOW_CODE,
        retry_after_ms=retry_after if type(retry_after) is int else None, status=status,
        request_id=request_id if isinstance(request_id, str) else None)


@dataclass(slots=True)
class _Block:
    block_type: str
    text: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""
    final: FrozenDict | None = None


class StreamAssembler:
    """Assemble the assistant content of one stream, chunk by chunk.

    ``block-end`` chunks are authoritative; blocks that never got one are built from their
    deltas. Feed every chunk with :meth:`feed`; then :meth:`response` gives the final result,
    and :meth:`visible_content` what a cancelled stream had visibly produced.

    Rule: docs/agent.md#providers (interrupted prefix).
    """

    __slots__ = ("_blocks", "_finish", "_replay_state", "_usage")

    def __init__(self) -> None:
        self._blocks: dict[int, _Block] = {}
        self._usage: TokenUsage | None = None
        self._finish: Mapping[str, Any] | None = None
        self._replay_state: JsonValue = None

    @property
    def finished(self) -> bool:
        """True once a ``finish`` chunk was fed."""
        return self._finish is not None

    @property
    def usage(self) -> TokenUsage | None:
        """The latest reported usage, or None."""
        return self._usage

    def _block(self, index: int, block_type: str) -> _Block:
        block = self._blocks.get(index)
        if block is None:
            block = self._blocks[index] = _Block(block_type)
        return block

    def feed(self, chunk: Mapping[str, Any]) -> None:
        """Take one chunk into the assembly.

        Raises:
            LlmFailureError: code ``BAD_STREAM`` for a chunk that is not a dsh stream chunk or
                that follows ``finish``.
        """
        if self._finish is not None:
            raise LlmFailureError(f"the model stream sent a {chunk.get('type')!r} chunk after "
                                  f"finish; a provider must end its stream with finish",
                                  code="BAD_STREAM")
        kind = chunk.get("type")
        try:
            if kind == "text-delta":
                self._block(chunk["index"], "text").text.append(chunk["text"])
            elif kind == "reasoning-delta":
                self._block(chunk["index"], "reasoning").text.append(chunk["text"])
            elif kind == "tool-call-delta":
                block = self._block(chunk["index"], "tool-call")
                block.call_id = chunk["id"] or block.call_id
                block.name = chunk.get("name") or block.name
                block.text.append(chunk["argumentsDelta"])
            elif kind == "block-start":
                self._block(chunk["index"], chunk["blockType"])
            elif kind == "block-end":
                final = snapshot_json(chunk["block"])
                self._block(chunk["index"], final["type"]).final = final
            elif kind == "usage":
                self._usage = chunk["usage"]
            elif kind == "finish":
                self._finish = chunk["reason"]
                self._replay_state = chunk.get("replayState")
            else:
                raise KeyError(kind)
        except (KeyError, TypeError) as exc:
            raise LlmFailureError(f"the model stream sent a malformed or unknown chunk "
                                  f"{dict(chunk)!r}; expected a dsh stream chunk",
                                  code="BAD_STREAM") from exc

    def _assembled(self, *, visible_only: bool) -> tuple[FrozenDict, ...]:
        out: list[FrozenDict] = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if visible_only:
                if block.block_type not in ("text", "reasoning"):
                    continue  # half-streamed tool calls are dropped (docs/agent.md#the-turn)
                text = block.final["text"] if block.final is not None else "".join(block.text)
                if text.strip():
                    out.append(snapshot_json({"type": block.block_type, "text": text}))
                continue
            if block.final is not None:
                out.append(block.final)
            elif block.block_type in ("text", "reasoning"):
                out.append(snapshot_json({"type": block.block_type, "text": "".join(block.text)}))
            elif block.block_type == "tool-call":
                out.append(snapshot_json({"type": "tool-call", "id": block.call_id,
                                          "name": block.name, "arguments": "".join(block.text)}))
        return tuple(out)

    def visible_content(self) -> tuple[FrozenDict, ...]:
        """The non-blank text and reasoning blocks streamed so far (no tool calls)."""
        return self._assembled(visible_only=True)

    def response(self) -> LlmResponse:
        """Return the assembled :class:`LlmResponse` of a stream that finished successfully.

        Raises:
            LlmFailureError: the stream ended without ``finish`` (code ``BAD_STREAM``), or its
                finish reason is ``error``/``aborted`` (the failure it carries; see
                :func:`failure_error`).
        """
        reason = self._finish
        if reason is None:
            raise LlmFailureError("the model stream ended without a finish chunk",
                                  code="BAD_STREAM", retryable=True)
        kind = reason.get("kind")
        if kind in ("error", "aborted"):
            raise failure_error(reason.get("failure") or {}, kind=str(kind))
        if kind not in ("stop", "tool-calls", "max-tokens"):
            raise LlmFailureError(f"the model stream finished with unknown reason {kind!r}",
                                  code="BAD_STREAM")
        content = self._assembled(visible_only=False)
        finish: FinishKind = kind
        return LlmResponse(finish=finish, content=content, usage=self._usage,
                           replay_state=self._replay_state)


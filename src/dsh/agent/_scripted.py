"""ScriptedProvider: a deterministic provider for tests, docs and examples (no network).

Each model request takes the next step of a script: a :class:`ScriptedReply` (text, reasoning,
tool calls, parallel calls, a finish reason), a :class:`ScriptedFailure` (a raised or
finish-delivered failure, retryable or not, a context overflow, after some streamed text), a
:class:`ScriptedStall` (streams some text, then waits until cancelled), or a callable that picks
one of those from the request. Replies stream as dsh chunks exactly like a real provider's, so
the loop logs the same event shapes.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from dsh._errors import ConfigError, LlmFailureError
from dsh._messages import StreamChunk, TokenUsage
from dsh.agent._provider import LlmRequest
from dsh.json import JsonValue


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptedCall:
    """One tool call the scripted model makes.

    Attributes:
        name: Tool name.
        arguments: JSON arguments (encoded compactly), or the raw argument string as sent.
        id: Call id; default ``call_<n>_<i>`` with n the number of assistant messages in the
            request (unique within a session that is not compacted) and i the call's index.
    """

    name: str
    arguments: JsonValue = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptedReply:
    """A successful reply: reasoning, text and tool calls (several calls = parallel calls).

    Attributes:
        text: Visible text ('' for none).
        reasoning: Reasoning text ('' for none), streamed before the text.
        tool_calls: Tool calls, in model order, streamed after the text.
        finish: Finish kind; default ``"tool-calls"`` when there are calls, else ``"stop"``.
        usage: Reported usage; default a rough estimate (8 input tokens per message, 4
            output characters per token).
    """

    text: str = ""
    reasoning: str = ""
    tool_calls: tuple[ScriptedCall, ...] = ()
    finish: Literal["stop", "tool-calls", "max-tokens"] | None = None
    usage: TokenUsage | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptedFailure:
    """A failed model call, after optionally streaming ``after_text``.

    Attributes:
        code: Failure code (``RATE_LIMITED``, ``CONTEXT_OVERFLOW``, ``SERVER_ERROR``, ...).
        message: Failure message.
        retryable: Marks the failure retryable (the loop retries with backoff).
        context_overflow: Marks a context overflow (the loop compacts and retries once).
        retry_after_ms: The retry hint in ms, or None.
        after_text: Text streamed before the failure ('' for none).
        as_finish: Deliver the failure as a ``finish {kind: "error"}`` chunk instead of raising.
    """

    code: str = "SERVER_ERROR"
    message: str = "scripted failure"
    retryable: bool = False
    context_overflow: bool = False
    retry_after_ms: int | None = None
    after_text: str = ""
    as_finish: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptedStall:
    """A call that streams ``after_text`` and then never finishes until it is cancelled."""

    after_text: str = ""


ScriptOutcome: TypeAlias = "ScriptedReply | ScriptedFailure | ScriptedStall"
ScriptStep: TypeAlias = (ScriptedReply | ScriptedFailure | ScriptedStall
                         | Callable[[LlmRequest], ScriptOutcome])
"""One step of a script: a reply, failure, stall, or a callable choosing one per request."""


def _pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


class ScriptedProvider:
    """A provider that plays a script, one step per request (see module docstring).

    Args:
        script: The steps, consumed in order; more can be added with :meth:`extend`.
        provider: Provider id written in assistant messages' source (``config.provider`` is
            what the loop uses; this is only for :attr:`requests` bookkeeping).
        chunk_chars: Characters per text/reasoning/argument delta (>= 1).
        on_request: Called with each request before it streams (e.g. to write a failpoint
            marker); an exception it raises fails the call.

    Attributes:
        requests: Every request received, in order.
        stalled: Set when a :class:`ScriptedStall` has streamed its text and is waiting.

    Raises:
        ConfigError: ``chunk_chars`` < 1.
    """

    def __init__(self, script: Iterable[ScriptStep] = (), *, chunk_chars: int = 8,
                 on_request: Callable[[LlmRequest], object] | None = None) -> None:
        if type(chunk_chars) is not int or chunk_chars < 1:
            raise ConfigError(f"chunk_chars must be an integer >= 1, got {chunk_chars!r}")
        self._script: deque[ScriptStep] = deque(script)
        self._chunk_chars = chunk_chars
        self._on_request = on_request
        self.requests: list[LlmRequest] = []
        self.stalled = asyncio.Event()

    def extend(self, steps: Iterable[ScriptStep]) -> None:
        """Append steps to the script."""
        self._script.extend(steps)

    @property
    def remaining(self) -> int:
        """Steps not yet played."""
        return len(self._script)

    def stream(self, request: LlmRequest) -> AsyncIterator[StreamChunk]:
        """Play the next step for ``request`` (see :class:`~dsh.agent._provider.Provider`).

        Raises:
            LlmFailureError: the step is a raised :class:`ScriptedFailure`, or the script is
                exhausted (code ``SCRIPT_EXHAUSTED``, not retryable).
        """
        self.requests.append(request)
        return self._play(request)

    async def _play(self, request: LlmRequest) -> AsyncIterator[StreamChunk]:
        if self._on_request is not None:
            self._on_request(request)
        if not self._script:
            raise LlmFailureError(f"the scripted provider has no step left for request "
                                  f"{len(self.requests)}; add replies to the script",
                                  code="SCRIPT_EXHAUSTED")
        step = self._script.popleft()
        if not isinstance(step, ScriptedReply | ScriptedFailure | ScriptedStall):
            step = step(request)
        if isinstance(step, ScriptedReply):
            for chunk in self._reply_chunks(step, request):
                yield chunk
            return
        for chunk in self._text_chunks(0, "text", step.after_text):
            yield chunk
        if isinstance(step, ScriptedStall):
            self.stalled.set()
            await asyncio.Event().wait()  # until cancelled
            return  # pragma: no cover - the wait above only ends by cancellation
        error = LlmFailureError(step.message, code=step.code, retryable=step.retryable,
                                context_overflow=step.context_overflow,
                                retry_after_ms=step.retry_after_ms)
        if step.as_finish:
            yield {"type": "finish", "reason": {"kind": "error",
                                                "failure": error.failure}}  # type: ignore[typeddict-item]
            return
        raise error

    def _text_chunks(self, index: int, kind: Literal["text", "reasoning"],
                     text: str) -> list[StreamChunk]:
        if not text:
            return []
        delta: Literal["text-delta", "reasoning-delta"] = (
            "text-delta" if kind == "text" else "reasoning-delta")
        chunks: list[StreamChunk] = [{"type": "block-start", "index": index, "blockType": kind}]
        chunks.extend({"type": delta, "index": index, "text": piece}  # type: ignore[misc]
                      for piece in _pieces(text, self._chunk_chars))
        chunks.append({"type": "block-end", "index": index,
                       "block": {"type": kind, "text": text}})
        return chunks

    def _reply_chunks(self, reply: ScriptedReply, request: LlmRequest) -> list[StreamChunk]:
        chunks: list[StreamChunk] = []
        index = 0
        for kind, text in (("reasoning", reply.reasoning), ("text", reply.text)):
            if text:
                chunks.extend(self._text_chunks(index, kind,  # type: ignore[arg-type]
                                                text))
                index += 1
        turn_no = sum(1 for m in request.messages if m.get("role") == "assistant")
        for i, call in enumerate(reply.tool_calls):
            call_id = call.id or f"call_{turn_no}_{i}"
            arguments = call.arguments if isinstance(call.arguments, str) else json.dumps(
                call.arguments, separators=(",", ":"), ensure_ascii=False)
            chunks.append({"type": "block-start", "index": index, "blockType": "tool-call"})
            for n, piece in enumerate(_pieces(arguments, self._chunk_chars) or [""]):
                delta: dict[str, Any] = {"type": "tool-call-delta", "index": index, "id": call_id}
                if n == 0:
                    delta["name"] = call.name
                delta["argumentsDelta"] = piece
                chunks.append(delta)  # type: ignore[arg-type]
            chunks.append({"type": "block-end", "index": index,
                           "block": {"type": "tool-call", "id": call_id, "name": call.name,
                                     "arguments": arguments}})
            index += 1
        usage = reply.usage or _estimate_usage(request, reply)
        chunks.append({"type": "usage", "usage": usage})
        finish = reply.finish or ("tool-calls" if reply.tool_calls else "stop")
        chunks.append({"type": "finish", "reason": {"kind": finish}})
        return chunks


def _estimate_usage(request: LlmRequest, reply: ScriptedReply) -> TokenUsage:
    # Cheap on purpose (O(1) per request): benchmarks run the loop at 100k surface nodes.
    output_chars = len(reply.text) + len(reply.reasoning) + sum(
        len(str(c.arguments)) for c in reply.tool_calls)
    return {"inputTokens": 8 * len(request.messages), "outputTokens": output_chars // 4}

"""The transcript: a session as a person reads it, built from its log (``dsh show``, ``dsh view``).

The log is the truth; the model's view of it is the surface; the transcript is the third view,
the one a person reads: turns and steps, the messages that were appended (user, assistant,
system), reasoning, tool calls paired with their results, compaction checkpoints with the span
they shadow, crash repairs, retries, inbox steering, fork cut points, and the log-only events a
reader would otherwise never see (ignorable ones, unknown types). Every renderer uses this one
model: the terminal transcript of ``dsh show``, the browser viewer and the exporters.

Shapes. :func:`build` turns a log (any random-access sequence of events whose index is the
seq: a tuple, a session's log, a paged log) into a :class:`Transcript` of one seq range, so a
big session is shown a page at a time: only the events of the page, a bounded look back (to the
start of the turn the page opens in, for turn, step and tool-name context) and a bounded look
ahead (to pair the page's tool calls with results that follow it) are read. :class:`TranscriptFold`
is the same fold fed event by event, for a log that grows (a live view) or is streamed from
storage. :func:`model_request` gives what the model was sent at any seq: the messages derived
from the surface as it stood then, and the request header and context folded so far.

Invariants this module owns:

* entries come in seq order and each names the seq of the event it shows (``seq``), so any
  entry links back to its event;
* only append-origin surface events are messages; a replace is a :class:`Checkpoint` (a
  compaction checkpoint message) or a :class:`Replacement` (a pruned tool result, any other
  rewrite), never a second copy of the message it shadows;
* building never raises on a well-formed log and never reads past ``stop + lookahead`` or
  before ``start - lookback``; malformed payloads (a block that is not an object, a missing
  field) are shown as what they are, not refused: the read pipeline decides what a log is.

Session text is untrusted: models, tools and imported transcripts wrote it. :func:`printable`
shows terminal control characters and bidirectional overrides as escapes; an HTML renderer
escapes markup as well.

Rule: docs/rules.md#the-surface (append-origin events are the transcript; replaces shadow a
surface range); docs/rules.md#repair (closers); docs/rules.md#fork (the cut point).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, Final, TypeAlias

from dsh._errors import has_unprintable, printable
from dsh.json import FrozenDict, JsonValue
from dsh.session import (
    KNOWN_EVENT_TYPES,
    OLD_MARK_TYPES,
    SURFACE_EVENT_TYPES,
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    Event,
    RestoreState,
    Surface,
    derive_event_message,
    fold_request_header,
    old_mark,
    stored_event_problem,
)

__all__ = [
    "COMPACT_PLUGIN",
    "ApprovalAnswer",
    "ApprovalAsked",
    "DEFAULT_LOOKAHEAD",
    "DEFAULT_LOOKBACK",
    "REPAIR_CODES",
    "Block",
    "Checkpoint",
    "CompactionFailed",
    "Entry",
    "ForkCut",
    "HeaderChange",
    "ImageBlock",
    "InboxChange",
    "InvalidEvent",
    "LogEvent",
    "Message",
    "ModelRequest",
    "ModelTail",
    "OpenTurn",
    "OtherBlock",
    "ReasoningBlock",
    "Recovery",
    "Replacement",
    "Retry",
    "Step",
    "StepStart",
    "TextBlock",
    "ToolCallBlock",
    "ToolResult",
    "ToolResultBlock",
    "Transcript",
    "TranscriptFold",
    "Turn",
    "TurnEnd",
    "TurnStart",
    "SHOW_KINDS",
    "blocks_of",
    "build",
    "cached_share",
    "entries_at",
    "group_turns",
    "has_unprintable",
    "turn_span",
    "iter_entries",
    "iter_pages",
    "last_entries",
    "model_request",
    "model_tail",
    "printable",
]

COMPACT_PLUGIN: Final = "compact"
"""``source.plugin`` of a compaction checkpoint message (docs/events.md#compactionsummary)."""

REPAIR_CODES: Final = frozenset({TOOL_OUTCOME_UNKNOWN, TOOL_NOT_STARTED})
"""``tool/result.data.error.code`` of a result written by crash repair or a fork's closers."""

DEFAULT_LOOKBACK: Final = 4096
"""Events :func:`build` reads before a page at most, looking for the ``turn/start`` it opens in."""

DEFAULT_LOOKAHEAD: Final = 512
"""Events :func:`build` reads after a page at most, looking for the results of its tool calls."""

_MAX_CALLS: Final = 8192
"""Tool calls a fold remembers (name and seq, for their results); older ones are forgotten."""

_MESSAGE_TYPES: Final = ("user/message", "assistant/message", "tool/result", "system/message")


# -- text safety -------------------------------------------------------------------------------

# printable/has_unprintable live in dsh._errors, whose error messages quote untrusted text
# too (a lock owner's host); they are this module's public face for session text.


# -- content blocks ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class TextBlock:
    """Visible text of a message."""

    kind: ClassVar[str] = "text"
    text: str

    def to_json(self) -> dict[str, Any]:
        """``{"type": "text", "text"}`` (the ``dsh show --json`` block)."""
        return {"type": "text", "text": self.text}


@dataclass(frozen=True, slots=True, kw_only=True)
class ReasoningBlock:
    """The model's reasoning (a renderer shows it collapsed)."""

    kind: ClassVar[str] = "reasoning"
    text: str

    def to_json(self) -> dict[str, Any]:
        """``{"type": "reasoning", "text"}``."""
        return {"type": "reasoning", "text": self.text}


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallBlock:
    """A tool call the assistant made.

    Attributes:
        id: The call id (``toolCallId`` of its result), None when the block has none.
        name: The tool's name, None when the block has none.
        arguments: The model's raw argument text (normally a JSON string; kept as found).
        result_seq: Seq of the ``tool/result`` that answers it, when :func:`build` saw it (in
            the page or its look ahead); None otherwise (a fold never knows it yet).
    """

    kind: ClassVar[str] = "tool-call"
    id: str | None
    name: str | None
    arguments: JsonValue
    result_seq: int | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"type": "tool-call", "id", "name", "arguments"}``."""
        return {"type": "tool-call", "id": self.id, "name": self.name,
                "arguments": self.arguments}


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageBlock:
    """An image attachment; the log holds its description, a renderer may show its data.

    Attributes:
        media_type: ``image/png`` and the like, or None.
        width: Pixels, or None.
        height: Pixels, or None.
        name: File name, or None.
        data: The attachment's base64 data when the block carries it (``attachment.data``),
            else None.
    """

    kind: ClassVar[str] = "image"
    media_type: str | None
    width: int | None = None
    height: int | None = None
    name: str | None = None
    data: str | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"type": "image", "mediaType"}``."""
        return {"type": "image", "mediaType": self.media_type}


@dataclass(frozen=True, slots=True, kw_only=True)
class OtherBlock:
    """A block of another type (``provider-raw``, a type this dsh does not know), kept whole."""

    kind: ClassVar[str] = "other"
    type: str
    raw: JsonValue = None

    def to_json(self) -> dict[str, Any]:
        """``{"type": <its type>}``."""
        return {"type": self.type}


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResultBlock:
    """The ``tool-result`` block of a tool's answer.

    Attributes:
        tool_call_id: The call it answers.
        is_error: True when the result is an error.
        text: Its text blocks joined with newlines.
        blocks: Its nested blocks.
    """

    kind: ClassVar[str] = "tool-result"
    tool_call_id: str | None
    is_error: bool
    text: str
    blocks: tuple[Block, ...]

    def to_json(self) -> dict[str, Any]:
        """``{"type": "tool-result", "toolCallId", "isError", "text", "blocks"}``."""
        return {"type": "tool-result", "toolCallId": self.tool_call_id,
                "isError": self.is_error, "text": self.text,
                "blocks": [b.to_json() for b in self.blocks]}


Block: TypeAlias = (TextBlock | ReasoningBlock | ToolCallBlock | ToolResultBlock | ImageBlock
                    | OtherBlock)
"""One content block as shown."""


def _text_of(content: Any) -> str:
    """Concatenate the ``text`` blocks of a content list (or return a plain string)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(block["text"] for block in content
                     if isinstance(block, Mapping) and block.get("type") == "text"
                     and isinstance(block.get("text"), str))


def _int_or_none(value: object) -> int | None:
    return value if type(value) is int else None


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def blocks_of(content: Any, result_seqs: Mapping[str, int] | None = None) -> tuple[Block, ...]:
    """Return a message's content as shown blocks (a plain string is one text block).

    Args:
        content: A message's ``content`` (a list of block objects, or a string).
        result_seqs: ``call id -> tool/result seq``, to link tool calls to their results.

    Returns:
        One block per content block that is an object, in order; anything else is skipped.
    """
    if isinstance(content, str):
        return (TextBlock(text=content),)
    out: list[Block] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind in ("text", "reasoning"):
            text = block.get("text", "")
            text = text if isinstance(text, str) else str(text)
            out.append(TextBlock(text=text) if kind == "text" else ReasoningBlock(text=text))
        elif kind == "tool-call":
            call_id = block.get("id")
            out.append(ToolCallBlock(
                id=call_id if isinstance(call_id, str) else None,
                name=_str_or_none(block.get("name")), arguments=block.get("arguments"),
                result_seq=result_seqs.get(call_id) if result_seqs and isinstance(
                    call_id, str) else None))
        elif kind == "tool-result":
            nested = block.get("content")
            out.append(ToolResultBlock(
                tool_call_id=_str_or_none(block.get("toolCallId")),
                is_error=block.get("isError") is True, text=_text_of(nested),
                blocks=blocks_of(nested)))
        elif kind == "image":
            attachment = block.get("attachment")
            attachment = attachment if isinstance(attachment, Mapping) else {}
            out.append(ImageBlock(
                media_type=_str_or_none(attachment.get("mediaType")),
                width=_int_or_none(attachment.get("width")),
                height=_int_or_none(attachment.get("height")),
                name=_str_or_none(attachment.get("name")),
                data=_str_or_none(attachment.get("data"))))
        else:
            out.append(OtherBlock(type=str(kind), raw=block))
    return tuple(out)


# -- entries -----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class TurnStart:
    """A ``turn/start``: turn ``turn`` opens (its first event)."""

    kind: ClassVar[str] = "turn"
    seq: int
    time: int
    turn: int | None

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "turn", "seq", "turn", "time"}``."""
        return {"kind": "turn", "seq": self.seq, "turn": self.turn, "time": self.time}


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnEnd:
    """A ``turn/end``: how the turn closed.

    Attributes:
        reason: The reason's ``kind``: ``completed``, ``aborted``, ``blocked``, ``error``,
            ``max-tokens``, ``interrupted`` (crash repair) or ``forked`` (a fork cut inside the
            turn); None when the event has no reason object.
        error: For ``error``: the error's message.
        cause: For ``aborted``: the cause's kind (``user``, ``parent``, ``hook``, ...).
        repaired: True for ``interrupted`` and ``forked``: the closer was written by repair or
            fork, not by the run.
        usage: Token usage summed over the turn's assistant messages the fold saw
            (``inputTokens``, ``outputTokens``, ...), or None when none carried usage.
        cost: The cost the log records for the turn (the sum of the numeric ``cost`` or
            ``costUSD`` fields of events since the previous turn's end, as importers keep them
            from their source; in the source's currency, normally US dollars), or None.
    """

    kind: ClassVar[str] = "turn-end"
    seq: int
    time: int
    turn: int | None
    reason: str | None
    error: str | None = None
    cause: str | None = None
    repaired: bool = False
    usage: Mapping[str, int] | None = None
    cost: float | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "turn-end", "seq", "turn", "reason", ["error"], ["cause"], "repaired"}``."""
        out: dict[str, Any] = {"kind": "turn-end", "seq": self.seq, "turn": self.turn,
                               "reason": self.reason}
        if self.error is not None:
            out["error"] = self.error
        if self.cause is not None:
            out["cause"] = self.cause
        out["repaired"] = self.repaired
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class StepStart:
    """A ``step/start``: step ``step`` of turn ``turn`` opens (one model call and its tools)."""

    kind: ClassVar[str] = "step"
    seq: int
    time: int
    turn: int | None
    step: int | None

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "step", "seq", "turn", "step"}``."""
        return {"kind": "step", "seq": self.seq, "turn": self.turn, "step": self.step}


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """An appended ``user/message``, ``assistant/message`` or ``system/message``.

    Attributes:
        role: ``user``, ``assistant`` or ``system``.
        blocks: Its content as shown.
        origin: Who injected it when it is not a person's or a model's message: the source
            kind and plugin (``plugin compact``, ``import``), else None.
        model: ``provider/model`` of an assistant message, or None.
        interrupted: True for the visible prefix of a cancelled stream.
        cut_off: True for text that was streamed (``assistant/chunk`` events) when the process
            stopped before the reply was recorded as a message: the log keeps the chunks, the
            repair closed the step, and the model never saw this text
            (docs/view.md#the-transcript-model).
        usage: The provider's token counts of an assistant message, or None.
        turn: The turn it belongs to (the fold's open turn), or None outside turns.
        step: The step it belongs to, or None.
        request_seq: For an assistant message: the seq at which the messages its model call
            was sent are derived (the event before its first stream chunk, or before it when it
            cites none); see :func:`model_request`. None for other roles.
        message_id: The message's ``id``.
        request: The fingerprint of the request an assistant message answers (``{tools,
            system, messages, prefix, sharedMessages}``), or None.
    """

    kind: ClassVar[str] = "message"
    seq: int
    time: int
    role: str
    blocks: tuple[Block, ...]
    origin: str | None = None
    model: str | None = None
    interrupted: bool = False
    cut_off: bool = False
    usage: Mapping[str, int] | None = None
    turn: int | None = None
    step: int | None = None
    request_seq: int | None = None
    message_id: str | None = None
    request: Mapping[str, Any] | None = None

    @property
    def cached_share(self) -> float | None:
        """Share of the request's input tokens the provider's prompt cache served, or None.

        ``cacheReadTokens / (inputTokens + cacheReadTokens + cacheWriteTokens)`` of
        :attr:`usage` (docs/effects.md#cache-keeping-compaction).
        """
        return cached_share(self.usage)

    def to_json(self) -> dict[str, Any]:
        """The ``dsh show --json`` item (``source``, ``model``, ``interrupted`` when set).

        An assistant message with usage adds ``usage`` and ``cachedShare``; one with a request
        fingerprint adds ``request``.
        """
        out: dict[str, Any] = {"kind": "message", "seq": self.seq, "role": self.role,
                               "blocks": [b.to_json() for b in self.blocks]}
        if self.origin is not None:
            out["source"] = self.origin
        if self.model is not None:
            out["model"] = self.model
        if self.interrupted:
            out["interrupted"] = True
        if self.cut_off:
            out["cutOff"] = True
        if self.usage is not None:
            out["usage"] = dict(self.usage)
            out["cachedShare"] = self.cached_share
        if self.request is not None:
            out["request"] = dict(self.request)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResult:
    """An appended ``tool/result``: a tool's answer, paired with its call.

    Attributes:
        call_id: The call it answers (``source.callId``).
        tool_name: The tool's name from the call (its ``tool/call`` or the assistant's block),
            None when the call is not in what was read.
        call_seq: Seq of its ``tool/call`` (or of the assistant message that asked for it),
            None when not in what was read.
        is_error: True when its result block is an error.
        blocks: Its content as shown (one ``tool-result`` block, normally).
        error_code: ``data.error.code`` (``TOOL_OUTCOME_UNKNOWN``, ``ABORTED_BEFORE_DISPATCH``,
            ``TOOL_TIMEOUT``, ...), or None.
        repair: The code when crash repair or a fork's closers wrote it (``TOOL_OUTCOME_UNKNOWN``:
            the call may have run; ``TOOL_NOT_STARTED``), else None.
        synthetic: For a result an importer supplied because the transcript recorded none: its
            error code, or ``IMPORTED``; else None.
        turn: The turn, or None.
        step: The step, or None.
    """

    kind: ClassVar[str] = "tool-result"
    seq: int
    time: int
    call_id: str | None
    tool_name: str | None
    call_seq: int | None
    is_error: bool
    blocks: tuple[Block, ...]
    error_code: str | None = None
    repair: str | None = None
    synthetic: str | None = None
    turn: int | None = None
    step: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``dsh show --json`` item: a ``message`` of role ``tool``.

        Keys: ``kind``, ``seq``, ``role``, ``blocks``, ``callId``, ``toolName``, ``isError``,
        then ``synthetic`` or ``repair`` when set.
        """
        out: dict[str, Any] = {"kind": "message", "seq": self.seq, "role": "tool",
                               "blocks": [b.to_json() for b in self.blocks],
                               "callId": self.call_id, "toolName": self.tool_name,
                               "isError": self.is_error}
        if self.synthetic is not None:
            out["synthetic"] = self.synthetic
        elif self.repair is not None:
            out["repair"] = self.repair
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """A compaction checkpoint: a summary that shadows a surface span from the model.

    Attributes:
        replaces: ``(start, end)``: the seqs of the first and last surface node it shadows.
        shadowed_seqs: The seqs of every message it shadows (the span a reader may expand).
        summary: The summary text (inside ``<compacted-summary>`` when the message has it).
        compaction_start_seq: Seq of its ``compaction/start``, or None when not cited.
        summary_seq: Seq of its ``compaction/summary``, or None when not cited.
        summary_usage: The token usage of the summary request (a model summarizer's), or
            None.
        summary_request: The summary request's fingerprint, or None.
    """

    kind: ClassVar[str] = "checkpoint"
    seq: int
    time: int
    replaces: tuple[int, int]
    shadowed_seqs: tuple[int, ...]
    summary: str
    compaction_start_seq: int | None = None
    summary_seq: int | None = None
    summary_usage: Mapping[str, Any] | None = None
    summary_request: Mapping[str, Any] | None = None

    @property
    def summary_cached_share(self) -> float | None:
        """Share of the summary request's input tokens served by the prompt cache, or None."""
        return cached_share(self.summary_usage)

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "checkpoint", "seq", "replaces", "shadowedSeqs", "summary"}``.

        Adds ``summaryUsage``, ``summaryCachedShare`` and ``summaryRequest`` when the summary
        request reported them.
        """
        out: dict[str, Any] = {"kind": "checkpoint", "seq": self.seq,
                               "replaces": list(self.replaces),
                               "shadowedSeqs": list(self.shadowed_seqs), "summary": self.summary}
        if self.summary_usage is not None:
            out["summaryUsage"] = dict(self.summary_usage)
            out["summaryCachedShare"] = self.summary_cached_share
        if self.summary_request is not None:
            out["summaryRequest"] = dict(self.summary_request)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Replacement:
    """Any other surface replace (a pruned tool result, a rewritten message).

    Attributes:
        replaces: ``(start, end)`` seqs of the surface nodes it shadows.
        what: ``pruned tool result``, ``replacement <type>``, or ``REMOVED from the model
            view (<why>)`` for an adapter's surface removal (a clear, a pop).
        blocks: The replacing content.
    """

    kind: ClassVar[str] = "replacement"
    seq: int
    time: int
    replaces: tuple[int, int]
    what: str
    blocks: tuple[Block, ...]

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "replacement", "seq", "replaces", "what", "blocks"}``."""
        return {"kind": "replacement", "seq": self.seq, "replaces": list(self.replaces),
                "what": self.what, "blocks": [b.to_json() for b in self.blocks]}


@dataclass(frozen=True, slots=True, kw_only=True)
class ForkCut:
    """The fork cut point: events ``0 .. seq - 1`` were inherited from the parent session.

    Attributes:
        inherited_events: Events copied from the parent (equal to ``seq``).
    """

    kind: ClassVar[str] = "fork"
    seq: int
    time: int
    inherited_events: int

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "fork", "seq", "inheritedEvents"}``."""
        return {"kind": "fork", "seq": self.seq, "inheritedEvents": self.inherited_events}


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionFailed:
    """A ``compaction/end`` with an error: the attempt failed, nothing was shadowed."""

    kind: ClassVar[str] = "compaction-failed"
    seq: int
    time: int
    error: str

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "compaction-failed", "seq", "error"}``."""
        return {"kind": "compaction-failed", "seq": self.seq, "error": self.error}


@dataclass(frozen=True, slots=True, kw_only=True)
class InvalidEvent:
    """An event the model view refuses (docs/cli.md#dsh-show): marked, never skipped.

    Attributes:
        type: Its ``type`` as stored (``str()`` of it when not a string).
        code: The rule it breaks: ``ENVELOPE``, ``SHAPE`` or ``SURFACE``.
        problem: The reducer's message naming the seq and what is wrong (session text: escape
            it before printing).
    """

    kind: ClassVar[str] = "invalid"
    seq: int
    time: int
    type: str
    code: str
    problem: str

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "invalid", "seq", "type", "code", "problem"}``."""
        return {"kind": "invalid", "seq": self.seq, "type": self.type, "code": self.code,
                "problem": self.problem}


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenTurn:
    """The log ends inside turn ``turn`` (its last event is ``seq``): a resume closes it."""

    kind: ClassVar[str] = "open-turn"
    seq: int
    time: int
    turn: int | None

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "open-turn", "seq", "turn"}``."""
        return {"kind": "open-turn", "seq": self.seq, "turn": self.turn}


@dataclass(frozen=True, slots=True, kw_only=True)
class Retry:
    """An ``llm/retry``: a model call failed and is tried again.

    Attributes:
        attempt: The attempt number that failed, or None.
        delay_ms: The pause before the next attempt (ms), or None.
        cause: ``retryable`` or ``context-overflow``, or None.
        message: The failure's message, or None.
        code: The failure's code, or None.
    """

    kind: ClassVar[str] = "retry"
    seq: int
    time: int
    turn: int | None
    step: int | None
    attempt: int | None
    delay_ms: int | None
    cause: str | None
    message: str | None
    code: str | None

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "retry", "seq", "turn", "step", "attempt", "delayMs", "cause", ...}``."""
        return {"kind": "retry", "seq": self.seq, "turn": self.turn, "step": self.step,
                "attempt": self.attempt, "delayMs": self.delay_ms, "cause": self.cause,
                "message": self.message, "code": self.code}


@dataclass(frozen=True, slots=True, kw_only=True)
class InboxChange:
    """An ``agent/inbox/spliced``: a prompt queued or claimed, or steering for the next step.

    Attributes:
        target: ``next-turn`` (prompts) or ``next-step`` (steering), or what the event says.
        inserted: The text of each inserted message.
        removed: Messages removed (claimed or cancelled).
        outcome: ``canceled`` for a cancellation, else None.
    """

    kind: ClassVar[str] = "inbox"
    seq: int
    time: int
    target: str | None
    inserted: tuple[str, ...]
    removed: int
    outcome: str | None

    @property
    def steering(self) -> bool:
        """True when the change steers the running turn (``next-step``)."""
        return self.target == "next-step"

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "inbox", "seq", "target", "inserted", "removed", "outcome"}``."""
        return {"kind": "inbox", "seq": self.seq, "target": self.target,
                "inserted": list(self.inserted), "removed": self.removed,
                "outcome": self.outcome}


@dataclass(frozen=True, slots=True, kw_only=True)
class HeaderChange:
    """A ``request/header``: the request header every following model call is sent with.

    Attributes:
        reason: ``initial``, ``resume`` or ``change``, or None.
        provider: ``config.provider``, or None.
        model: ``config.model``, or None.
        tools: Names of the declared tools.
    """

    kind: ClassVar[str] = "request-header"
    seq: int
    time: int
    reason: str | None
    provider: str | None
    model: str | None
    tools: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "request-header", "seq", "reason", "provider", "model", "tools"}``."""
        return {"kind": "request-header", "seq": self.seq, "reason": self.reason,
                "provider": self.provider, "model": self.model, "tools": list(self.tools)}


@dataclass(frozen=True, slots=True, kw_only=True)
class LogEvent:
    """A log-only event a reader would not otherwise see: ignorable, or of an unknown type.

    An importer's raw record, an adapter's note, a plugin's event this dsh does not know.

    Attributes:
        type: The event type.
        ignorable: True when the event is marked ``ignorable``.
        known: True when the type is in dsh's vocabulary.
        data: The event's payload (frozen), for a renderer that shows it.
    """

    kind: ClassVar[str] = "event"
    seq: int
    time: int
    type: str
    ignorable: bool
    known: bool
    data: JsonValue = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "event", "seq", "type", "ignorable", "known"}``."""
        return {"kind": "event", "seq": self.seq, "type": self.type,
                "ignorable": self.ignorable, "known": self.known}


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalAsked:
    """An ``approval/requested``: a call waits for a person's yes (docs/effects.md).

    Attributes:
        call_id: The waiting call.
        tool_name: Its tool.
        reason: ``tool`` (the tool needs a yes for every call) or ``in-doubt`` (an
            irreversible call a crash interrupted: yes runs it again).
        deadline: Epoch ms after which it counts as denied, or None.
    """

    kind: ClassVar[str] = "approval"
    seq: int
    time: int
    call_id: str | None
    tool_name: str | None
    reason: str | None
    deadline: int | None

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "approval", "seq", "callId", "toolName", "reason", "deadline"}``."""
        return {"kind": "approval", "seq": self.seq, "callId": self.call_id,
                "toolName": self.tool_name, "reason": self.reason, "deadline": self.deadline}


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalAnswer:
    """An ``approval/answered``: a person's (or the deadline's) answer.

    Attributes:
        call_id: The call answered.
        decision: ``approved`` or ``denied``.
        by: Who answered (``deadline`` when it passed unanswered).
        note: The remark kept with the answer, or None.
    """

    kind: ClassVar[str] = "approval-answer"
    seq: int
    time: int
    call_id: str | None
    decision: str | None
    by: str | None
    note: str | None

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "approval-answer", "seq", "callId", "decision", "by", "note"}``."""
        return {"kind": "approval-answer", "seq": self.seq, "callId": self.call_id,
                "decision": self.decision, "by": self.by, "note": self.note}


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    """A ``tool/recovery``: what a resumed agent decided for an interrupted or answered call.

    Attributes:
        call_id: The call.
        tool_name: Its tool.
        effect: The effect class the decision used.
        decision: ``run``, ``reconcile``, ``in-doubt``, ``not-started`` or ``deny``.
        cause: ``interrupted`` or ``approval``.
        attempt: The run number a ``run`` starts, or None.
        reason: Why a follow-up decision was taken, or None.
    """

    kind: ClassVar[str] = "recovery"
    seq: int
    time: int
    call_id: str | None
    tool_name: str | None
    effect: str | None
    decision: str | None
    cause: str | None
    attempt: int | None
    reason: str | None

    def to_json(self) -> dict[str, Any]:
        """``{"kind": "recovery", "seq", "callId", "toolName", "effect", "decision", ...}``."""
        return {"kind": "recovery", "seq": self.seq, "callId": self.call_id,
                "toolName": self.tool_name, "effect": self.effect, "decision": self.decision,
                "cause": self.cause, "attempt": self.attempt, "reason": self.reason}


Entry: TypeAlias = (TurnStart | TurnEnd | StepStart | Message | ToolResult | Checkpoint
                    | Replacement | ForkCut | CompactionFailed | OpenTurn | Retry | InboxChange
                    | HeaderChange | ApprovalAsked | ApprovalAnswer | Recovery | LogEvent
                    | InvalidEvent)
"""One entry of a transcript; ``entry.kind`` names its class, ``entry.seq`` its event."""

SHOW_KINDS: Final = frozenset({"turn", "message", "tool-result", "checkpoint", "replacement",
                               "turn-end", "fork", "compaction-failed", "open-turn",
                               "approval", "approval-answer", "recovery", "invalid"})
"""The entry kinds ``dsh show`` prints (a turn end only when not ``completed``)."""


# -- the fold ----------------------------------------------------------------------------------

def _replace_range(op: Any) -> tuple[int, int] | None:
    if isinstance(op, Mapping) and op.get("op") == "replace":
        start, end = op.get("start"), op.get("end")
        if type(start) is int and type(end) is int:
            return start, end
    return None


def _message_of(event: Mapping[str, Any], data: Mapping[str, Any]) -> Mapping[str, Any]:
    kind = event["type"]
    message = data if kind in ("user/message", "system/message") else data.get("message")
    return message if isinstance(message, Mapping) else {}


def cached_share(usage: Mapping[str, Any] | None) -> float | None:
    """The share of a request's input tokens read from the provider's prompt cache, or None.

    Args:
        usage: A dsh ``TokenUsage`` (disjoint buckets: ``inputTokens`` uncached,
            ``cacheReadTokens``, ``cacheWriteTokens``).

    Returns:
        ``cacheReadTokens / (inputTokens + cacheReadTokens + cacheWriteTokens)`` in [0, 1];
        None without usage or input tokens. Rule: docs/effects.md#cache-keeping-compaction.
    """
    if not isinstance(usage, Mapping):
        return None
    counts = [usage.get(key) for key in ("inputTokens", "cacheReadTokens", "cacheWriteTokens")]
    fresh, read, write = (c if type(c) is int and c > 0 else 0 for c in counts)
    total = fresh + read + write
    return read / total if total else None


def _add_usage(total: dict[str, int], usage: Mapping[str, Any]) -> None:
    for key, value in usage.items():
        if type(value) is int:
            total[key] = total.get(key, 0) + value


def _utc(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _result_call_id(event: Mapping[str, Any]) -> str | None:
    data = event.get("data")
    message = data.get("message") if isinstance(data, Mapping) else None
    source = message.get("source") if isinstance(message, Mapping) else None
    call_id = source.get("callId") if isinstance(source, Mapping) else None
    return call_id if isinstance(call_id, str) else None


class TranscriptFold:
    """The transcript fold, fed a log's events in seq order; each feed returns new entries.

    The state it keeps is bounded by one turn: the open turn and step, the tool calls of the
    turn not answered yet (call id to name and seq), and the turn's usage. Feed it a whole log,
    a page after a look back, or each event a live session commits.

    Args:
        result_seqs: ``call id -> seq of its tool/result``, known ahead (:func:`build` scans
            the page for them) to link each :class:`ToolCallBlock` to its answer.
        emit_from: Entries of events with a smaller seq are folded but not returned (the look
            back of a page).
        seed_length: The header's ``seedLength`` (events a fork inherited): the
            ``session/end-seed`` at that seq is the cut point even when it is not marked
            ``inherited`` (dsh 0.1 writes a plain one).
    """

    __slots__ = ("_calls", "_cost", "_emit_from", "_last", "_quarantine", "_results",
                 "_seed_length", "_step", "_streamed", "_summary", "_turn", "_turn_open",
                 "_usage")

    def __init__(self, *, result_seqs: Mapping[str, int] | None = None,
                 emit_from: int = 0, seed_length: int | None = None) -> None:
        self._results = result_seqs
        self._emit_from = emit_from
        self._seed_length = seed_length
        self._turn: int | None = None
        self._turn_open = False
        self._step: int | None = None
        self._calls: dict[str, tuple[str, int]] = {}
        self._usage: dict[str, int] = {}
        self._cost: float | None = None
        self._last: tuple[int, int] | None = None
        self._summary: tuple[int, Mapping[str, Any]] | None = None  # the last compaction/summary
        self._quarantine: dict[int, str] = {}  # placeholder/restoring seq -> what it is
        self._streamed: list[str] = []  # text deltas of the step not yet recorded as a message

    @property
    def open_turn(self) -> int | None:
        """The number of the turn open after the last event fed, or None."""
        return self._turn if self._turn_open else None

    def open_turn_entry(self) -> OpenTurn | None:
        """An :class:`OpenTurn` at the last event fed when the log so far ends inside a turn."""
        if not self._turn_open or self._last is None:
            return None
        seq, time = self._last
        return OpenTurn(seq=seq, time=time, turn=self._turn)

    def feed(self, events: Iterable[Mapping[str, Any]]) -> list[Entry]:
        """Fold ``events`` (the next ones, in seq order) and return the entries they make."""
        out: list[Entry] = []
        for event in events:
            entry = self._one(event)
            if entry is not None and entry.seq >= self._emit_from:
                out.append(entry)
        return out

    def _one(self, event: Mapping[str, Any]) -> Entry | None:
        kind = event.get("type")
        seq = event.get("seq")
        seq = seq if type(seq) is int else -1
        time = event.get("time")
        time = time if type(time) is int else 0
        self._last = (seq, time)
        if kind in SURFACE_EVENT_TYPES or "surfaceOp" in event:
            problem = stored_event_problem(event)
            if problem is not None:  # what the model view refuses is marked, not skipped
                return InvalidEvent(seq=seq, time=time, type=str(kind), code=problem.code,
                                    problem=problem.message)
        data = event.get("data")
        data = data if isinstance(data, Mapping) else {}
        for key in ("cost", "costUSD"):
            value = data.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                self._cost = (self._cost or 0.0) + value
        if kind == "turn/start":
            turn = data.get("turn")
            self._turn = turn if type(turn) is int else None
            self._turn_open = True
            self._step = None
            self._usage = {}
            return TurnStart(seq=seq, time=time, turn=self._turn)
        if kind == "turn/end":
            self._turn_open = False
            reason = data.get("reason")
            reason = reason if isinstance(reason, Mapping) else {}
            reason_kind = _str_or_none(reason.get("kind"))
            error = cause = None
            if reason_kind == "error":
                detail = reason.get("error")
                error = _str_or_none(detail.get("message")) if isinstance(
                    detail, Mapping) else None
            elif reason_kind == "aborted":
                detail = reason.get("reason")
                cause = _str_or_none(detail.get("kind")) if isinstance(detail, Mapping) else None
            turn = data.get("turn")
            usage = FrozenDict(self._usage) if self._usage else None
            cost, self._usage, self._cost = self._cost, {}, None
            return TurnEnd(seq=seq, time=time, turn=turn if type(turn) is int else None,
                           reason=reason_kind, error=error, cause=cause,
                           repaired=reason_kind in ("interrupted", "forked"), usage=usage,
                           cost=cost)
        if kind == "assistant/chunk":
            chunk = data.get("chunk")
            if isinstance(chunk, Mapping) and chunk.get("type") == "text-delta" and isinstance(
                    chunk.get("text"), str):
                self._streamed.append(chunk["text"])
            return None
        if kind == "step/end" and self._streamed:
            # The step ended with streamed text no assistant/message recorded: the process
            # stopped mid-reply and the repair closed the step.
            text, self._streamed = "".join(self._streamed), []
            if text.strip():
                return Message(seq=seq, time=time, role="assistant",
                               blocks=(TextBlock(text=text),), cut_off=True, turn=self._turn,
                               step=self._step)
            return None
        if kind == "step/start":
            self._streamed = []
            step = data.get("step")
            self._step = step if type(step) is int else None
            return StepStart(seq=seq, time=time, turn=self._turn, step=self._step)
        if kind == "tool/call":
            call_id = data.get("callId")
            if isinstance(call_id, str):
                self._remember(call_id, str(data.get("name")), seq, replace=True)
            return None
        if kind in _MESSAGE_TYPES:
            if kind == "assistant/message":
                self._streamed = []
            replaced = _replace_range(event.get("surfaceOp"))
            if replaced is not None:
                made = self._replacement(event, data, replaced, seq, time, self._summary)
                what = self._quarantine.pop(seq, None)
                return made if what is None else Replacement(
                    seq=seq, time=time, replaces=replaced, what=what,
                    blocks=() if what.startswith("QUARANTINED") else made.blocks
                    if isinstance(made, Replacement) else ())
            if event.get("surfaceOp") == "append":
                return self._message(event, data, seq, time)
            return None
        if kind == "session/end-seed":
            if data.get("inherited") is True or (seq == self._seed_length and seq > 0):
                return ForkCut(seq=seq, time=time, inherited_events=seq)
            return None
        if kind == "compaction/summary":
            self._summary = (seq, data)
            return None
        if kind == "compaction/end":
            if data.get("error") is not None:
                return CompactionFailed(seq=seq, time=time, error=str(data.get("error")))
            return None
        if kind == "llm/retry":
            failure = data.get("failure")
            failure = failure if isinstance(failure, Mapping) else {}
            return Retry(seq=seq, time=time, turn=self._turn, step=self._step,
                         attempt=_int_or_none(data.get("attempt")),
                         delay_ms=_int_or_none(data.get("delayMs")),
                         cause=_str_or_none(data.get("cause")),
                         message=_str_or_none(failure.get("message")),
                         code=_str_or_none(failure.get("code")))
        if kind == "agent/inbox/spliced":
            inserted = data.get("inserted")
            texts = tuple(_text_of(m.get("content")) for m in inserted
                          if isinstance(m, Mapping)) if isinstance(inserted, list) else ()
            removed = data.get("removedCount")
            return InboxChange(seq=seq, time=time, target=_str_or_none(data.get("target")),
                               inserted=texts, removed=removed if type(removed) is int else 0,
                               outcome=_str_or_none(data.get("outcome")))
        if kind == "approval/requested":
            return ApprovalAsked(seq=seq, time=time, call_id=_str_or_none(data.get("callId")),
                                 tool_name=_str_or_none(data.get("name")),
                                 reason=_str_or_none(data.get("reason")),
                                 deadline=_int_or_none(data.get("deadline")))
        if kind == "approval/answered":
            return ApprovalAnswer(seq=seq, time=time, call_id=_str_or_none(data.get("callId")),
                                  decision=_str_or_none(data.get("decision")),
                                  by=_str_or_none(data.get("by")),
                                  note=_str_or_none(data.get("note")))
        if kind == "tool/recovery":
            return Recovery(seq=seq, time=time, call_id=_str_or_none(data.get("callId")),
                            tool_name=_str_or_none(data.get("name")),
                            effect=_str_or_none(data.get("effect")),
                            decision=_str_or_none(data.get("decision")),
                            cause=_str_or_none(data.get("cause")),
                            attempt=_int_or_none(data.get("attempt")),
                            reason=_str_or_none(data.get("reason")))
        if kind == "request/header":
            header = data.get("header")
            header = header if isinstance(header, Mapping) else {}
            config = header.get("config")
            config = config if isinstance(config, Mapping) else {}
            tools = header.get("tools")
            names = tuple(str(t.get("name")) for t in tools if isinstance(t, Mapping)) \
                if isinstance(tools, list) else ()
            return HeaderChange(seq=seq, time=time, reason=_str_or_none(data.get("reason")),
                                provider=_str_or_none(config.get("provider")),
                                model=_str_or_none(config.get("model")), tools=names)
        if kind in ("quarantine/apply", "quarantine/release"):
            self._note_quarantine(kind, data, time)
        if kind in OLD_MARK_TYPES:
            removed = old_mark(event)
            if removed is not None:
                # an earlier dsh's clear/pop, honoured as the removal it stands for
                # (docs/forgetting.md#logs-from-before-surface-removals)
                form = "clear" if kind.endswith("/clear") else "pop"
                return Replacement(seq=seq, time=time,
                                   replaces=(0, removed) if form == "clear" else (removed,
                                                                                  removed),
                                   what=f"REMOVED from the model view ({form}, an earlier "
                                        "dsh's mark)", blocks=())
        known = kind in KNOWN_EVENT_TYPES
        ignorable = event.get("ignorable") is True
        if ignorable or not known:
            return LogEvent(seq=seq, time=time, type=str(kind), ignorable=ignorable,
                            known=known, data=event.get("data"))
        return None

    def _note_quarantine(self, kind: str, data: Mapping[str, Any], time: int) -> None:
        """Remember what the replaces a quarantine record announces are.

        When, why and by whom, for the transcript (docs/forgetting.md#quarantine).
        """
        items = data.get("items")
        reason, by = _str_or_none(data.get("reason")), _str_or_none(data.get("by"))
        # session text: never let it drive a terminal (docs/view.md#the-transcript-model)
        reason, by = (printable(reason) if reason else None), (printable(by) if by else None)
        for item in items if isinstance(items, list) else ():
            if not isinstance(item, Mapping) or type(item.get("seq")) is not int:
                continue
            if kind == "quarantine/apply" and type(item.get("placeholder")) is int:
                why = f"; reason: {reason}" if reason else ""
                who = f" by {by}" if by else ""
                self._quarantine[item["placeholder"]] = (
                    f"QUARANTINED #{item['seq']} (withheld from the model view at "
                    f"{_utc(time)} UTC{who}{why})")
            elif kind == "quarantine/release" and type(item.get("restored")) is int:
                self._quarantine[item["restored"]] = (
                    f"unquarantined #{item['seq']} (back on the model view"
                    + (f", by {by}" if by else "") + ")")

    def _remember(self, call_id: str, name: str, seq: int, *, replace: bool) -> None:
        calls = self._calls
        if not replace and call_id in calls:
            return
        calls[call_id] = (name, seq)
        if len(calls) > _MAX_CALLS:  # a live fold runs for as long as its page is shown
            for old in list(calls)[:_MAX_CALLS // 2]:
                del calls[old]

    def _message(self, event: Mapping[str, Any], data: Mapping[str, Any], seq: int,
                 time: int) -> Message | ToolResult:
        kind = event["type"]
        message = _message_of(event, data)
        blocks = blocks_of(message.get("content"), self._results)
        source = message.get("source")
        source = source if isinstance(source, Mapping) else {}
        origin = None
        if source.get("kind") not in (None, "user", "tool", "model"):
            # Injected context (a plugin, an importer, a subagent report): say who put it there.
            plugin = source.get("plugin")
            origin = f"{source.get('kind')} {plugin}" if plugin else str(source.get("kind"))
        if kind == "tool/result":
            call_id = source.get("callId")
            call_id = call_id if isinstance(call_id, str) else None
            call = self._calls.get(call_id) if call_id is not None else None
            result = next((b for b in blocks if isinstance(b, ToolResultBlock)), None)
            error = data.get("error")
            code = _str_or_none(error.get("code")) if isinstance(error, Mapping) else None
            meta = data.get("meta")
            imported = meta.get("import") if isinstance(meta, Mapping) else None
            synthetic = repair = None
            if isinstance(imported, Mapping) and imported.get("synthetic") is True:
                # The importer supplied this result: the transcript recorded none (or an abort).
                synthetic = code if code is not None else "IMPORTED"
            elif code in REPAIR_CODES:
                repair = code
            return ToolResult(seq=seq, time=time, call_id=call_id,
                              tool_name=call[0] if call else None,
                              call_seq=call[1] if call else None,
                              is_error=bool(result and result.is_error), blocks=blocks,
                              error_code=code, repair=repair, synthetic=synthetic,
                              turn=self._turn if self._turn_open else None, step=self._step)
        role = {"assistant/message": "assistant", "system/message": "system"}.get(kind, "user")
        model = usage = request_seq = None
        interrupted = False
        if kind == "assistant/message":
            for block in blocks:
                if isinstance(block, ToolCallBlock) and block.id is not None:
                    self._remember(block.id, str(block.name), seq, replace=False)
            if source.get("model"):
                model = f"{source.get('provider')}/{source.get('model')}"
            interrupted = data.get("interrupted") is True
            raw_usage = data.get("usage")
            if isinstance(raw_usage, Mapping):
                usage = raw_usage
                _add_usage(self._usage, raw_usage)
            cited = event.get("sourceEventSeqs")
            firsts = [s for s in cited if type(s) is int] if isinstance(cited, list) else []
            request_seq = max(0, (min(firsts) if firsts else seq) - 1)
        message_id = message.get("id")
        fingerprint = data.get("request") if kind == "assistant/message" else None
        return Message(seq=seq, time=time, role=role, blocks=blocks, origin=origin, model=model,
                       interrupted=interrupted, usage=usage,
                       request=fingerprint if isinstance(fingerprint, Mapping) else None,
                       turn=self._turn if self._turn_open else None,
                       step=self._step if self._turn_open else None, request_seq=request_seq,
                       message_id=message_id if isinstance(message_id, str) else None)

    @staticmethod
    def _replacement(event: Mapping[str, Any], data: Mapping[str, Any],
                     replaced: tuple[int, int], seq: int, time: int,
                     summary: tuple[int, Mapping[str, Any]] | None = None,
                     ) -> Checkpoint | Replacement:
        kind = event["type"]
        message = _message_of(event, data)
        source = message.get("source")
        cited = event.get("sourceEventSeqs")
        cited = [s for s in cited if type(s) is int] if isinstance(cited, list) else []
        if (isinstance(source, Mapping) and source.get("kind") == "plugin"
                and source.get("plugin") == COMPACT_PLUGIN):
            text = _text_of(message.get("content"))
            start, _, rest = text.partition("<compacted-summary>")
            text_summary = rest.partition("</compacted-summary>")[0] if rest else start
            # sourceEventSeqs = [compaction/start, compaction/summary, *shadowed]
            # (docs/events.md#compactionsummary)
            summary_seq = cited[1] if len(cited) > 1 else None
            told = summary[1] if summary is not None and summary[0] == summary_seq else {}
            usage, request = told.get("usage"), told.get("request")
            return Checkpoint(seq=seq, time=time, replaces=replaced,
                              shadowed_seqs=tuple(cited[2:]), summary=text_summary.strip("\n"),
                              compaction_start_seq=cited[0] if cited else None,
                              summary_seq=summary_seq,
                              summary_usage=usage if isinstance(usage, Mapping) else None,
                              summary_request=request if isinstance(request, Mapping) else None)
        what = "pruned tool result" if kind == "tool/result" else f"replacement {kind}"
        if kind == "tool/result" and "tool result middle pruned" not in _text_of(
                message.get("content")):
            # a resumed agent's recovered outcome or an approval's answer (docs/effects.md)
            what = "rewritten tool result"
        removal = source.get("removal") if isinstance(source, Mapping) else None
        if isinstance(removal, Mapping) and not message.get("content"):
            # an adapter's clear / pop / dropped state (docs/adapters.md#cleared-means-cleared)
            what = f"REMOVED from the model view ({removal.get('form')})"
        if kind == "tool/result" and any(
                _text_of(block.get("content")).startswith("[removed from the model view: ")
                for block in message.get("content") or () if isinstance(block, Mapping)):
            # an adapter's popped tool output: a placeholder keeps its call answered
            # (dsh.adapters._log.withhold_result, docs/adapters.md#cleared-means-cleared)
            what = "REMOVED from the model view (pop; a placeholder answers the call)"
        return Replacement(seq=seq, time=time, replaces=replaced, what=what,
                           blocks=blocks_of(message.get("content")))


# -- turns and steps ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """The entries of one step of a turn (``step`` None: before the turn's first step)."""

    step: int | None
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Turn:
    """The entries of one turn, grouped by step (``turn`` None: entries outside any turn).

    Attributes:
        turn: The turn number, or None for entries between turns (a seed, a fork cut, a title).
        start: Its :class:`TurnStart`, or None when the page opens inside the turn.
        end: Its :class:`TurnEnd`, or None when it is open or the page ends inside it.
        steps: The entries between start and end, by step.
    """

    turn: int | None
    start: TurnStart | None
    end: TurnEnd | None
    steps: tuple[Step, ...]

    @property
    def entries(self) -> tuple[Entry, ...]:
        """Every entry of the turn in seq order, its start and end included."""
        inner = tuple(e for s in self.steps for e in s.entries)
        return (*((self.start,) if self.start else ()), *inner,
                *((self.end,) if self.end else ()))


def group_turns(entries: Sequence[Entry]) -> tuple[Turn, ...]:
    """Group entries (in seq order) into turns and steps."""
    turns: list[Turn] = []
    start: TurnStart | None = None
    number: int | None = None
    steps: list[Step] = []
    step_no: int | None = None
    step_entries: list[Entry] = []
    inside = False

    def close_step() -> None:
        nonlocal step_entries
        if step_entries:
            steps.append(Step(step=step_no, entries=tuple(step_entries)))
        step_entries = []

    def close_turn(end: TurnEnd | None) -> None:
        nonlocal steps, start, number, step_no
        close_step()
        if steps or start is not None or end is not None:
            turns.append(Turn(turn=number, start=start, end=end, steps=tuple(steps)))
        steps, start, number, step_no = [], None, None, None

    for entry in entries:
        if isinstance(entry, TurnStart):
            close_turn(None)
            start, number, inside = entry, entry.turn, True
        elif isinstance(entry, TurnEnd):
            if not inside and number is None:
                number = entry.turn
            close_turn(entry)
            inside = False
        elif isinstance(entry, StepStart):
            close_step()
            step_no = entry.step
            if not inside and number is None:
                number = entry.turn
            step_entries.append(entry)
        else:
            turn_of = getattr(entry, "turn", None)
            if not inside and number is None and turn_of is not None:
                number = turn_of  # the page opens inside this turn
                inside = True
            step_entries.append(entry)
    close_turn(None)
    return tuple(turns)


# -- pages -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class Transcript:
    """The transcript of the seqs ``start .. stop - 1`` of one log.

    Attributes:
        start: First seq covered.
        stop: One past the last seq covered (``<= event_count``).
        event_count: Events in the log read.
        entries: The entries, in seq order.
        complete: True when the page reaches the end of the log (``stop == event_count``); then
            an open last turn is shown as an :class:`OpenTurn` entry.
    """

    start: int
    stop: int
    event_count: int
    entries: tuple[Entry, ...]

    @property
    def complete(self) -> bool:
        """True when the page ends at the log's last event."""
        return self.stop >= self.event_count

    @property
    def turns(self) -> tuple[Turn, ...]:
        """The entries grouped by turn and step (:func:`group_turns`)."""
        return group_turns(self.entries)

    def to_json(self) -> list[dict[str, Any]]:
        """The entries as JSON objects (``entry.to_json()`` each), in seq order."""
        return [entry.to_json() for entry in self.entries]


def _turn_start_before(events: Sequence[Mapping[str, Any]], start: int, lookback: int) -> int:
    """Where the fold of a page starting at ``start`` begins: its turn's start, if near."""
    low = max(0, start - lookback)
    for index in range(start - 1, low - 1, -1):
        kind = events[index].get("type")
        if kind == "turn/start":
            return index
        if kind == "turn/end":
            return index + 1
    return low


def build(events: Sequence[Mapping[str, Any]], *, start: int = 0, stop: int | None = None,
          lookback: int = DEFAULT_LOOKBACK, lookahead: int = DEFAULT_LOOKAHEAD,
          header: Mapping[str, Any] | None = None) -> Transcript:
    """Return the transcript of the events with ``start <= seq < stop``.

    Args:
        events: A log whose element at index ``i`` is the event with seq ``i`` (a tuple, a
            list, a session's log, a paged log: only the slices named below are read).
        start: First seq (clamped to ``0 .. len(events)``).
        stop: One past the last seq (default: the end of the log; clamped).
        lookback: Events before ``start`` read at most to find the ``turn/start`` the page opens
            in (turn and step numbers, tool names of calls made before the page).
        lookahead: Events after ``stop`` read at most to find the results of the page's calls.
        header: The session's header; a fork's ``seedLength`` marks its cut point.

    Returns:
        The page. When it reaches the end of the log and the last turn is open, the last entry
        is an :class:`OpenTurn`.
    """
    count = len(events)
    start = max(0, min(start, count))
    stop = count if stop is None else max(start, min(stop, count))
    begin = _turn_start_before(events, start, max(0, lookback)) if start else 0
    ahead_stop = min(count, stop + max(0, lookahead))
    window = events[begin:ahead_stop]
    results: dict[str, int] = {}
    for event in window[start - begin:]:
        if event.get("type") == "tool/result" and event.get("surfaceOp") == "append":
            call_id = _result_call_id(event)
            if call_id is not None:
                results.setdefault(call_id, event["seq"])
    seed_length = header.get("seedLength") if header is not None else None
    fold = TranscriptFold(result_seqs=results, emit_from=start,
                          seed_length=seed_length if type(seed_length) is int else None)
    entries = fold.feed(window[:stop - begin])
    if stop == count:
        tail = fold.open_turn_entry()
        if tail is not None:
            entries.append(tail)
    return Transcript(start=start, stop=stop, event_count=count, entries=tuple(entries))


def entries_at(events: Sequence[Mapping[str, Any]], seqs: Iterable[int]) -> tuple[Entry, ...]:
    """Return the entries of the events at ``seqs`` (the span a checkpoint shadows, say).

    Each event is folded alone: tool results carry no tool name, messages no turn.
    """
    fold = TranscriptFold()
    out: list[Entry] = []
    for seq in seqs:
        if 0 <= seq < len(events):
            out.extend(fold.feed((events[seq],)))
    return tuple(out)


def iter_pages(events: Sequence[Mapping[str, Any]], *, page_events: int = 1000,
               header: Mapping[str, Any] | None = None) -> Iterator[Transcript]:
    """Yield the transcript of ``events`` a page of ``page_events`` events at a time."""
    for start in range(0, max(len(events), 1), page_events):
        yield build(events, start=start, stop=start + page_events, header=header)


def iter_entries(events: Sequence[Mapping[str, Any]], *, start: int = 0, stop: int | None = None,
                 page_events: int = 1000, first_page: int = 100,
                 lookback: int = DEFAULT_LOOKBACK, lookahead: int = DEFAULT_LOOKAHEAD,
                 header: Mapping[str, Any] | None = None) -> Iterator[Entry]:
    """Yield the entries of the events with ``start <= seq < stop`` as they are folded.

    The streaming form of :func:`build`: one fold runs over the range a page at a time (the
    first page ``first_page`` events, then doubling up to ``page_events``), so the first
    entries come after a small page is read and memory holds one page, not the log. Each
    page's tool calls are linked to results up to ``lookahead`` events after it, as a page of
    :func:`build` is. Stopping the iteration stops the reading (``dsh show | head``).

    Args:
        events: A log whose element at index ``i`` is the event with seq ``i``.
        start: First seq (clamped to ``0 .. len(events)``); the fold begins at the start of the
            turn it opens in when that is at most ``lookback`` events before it.
        stop: One past the last seq (default: the end of the log; clamped).
        page_events: Events read at once at most (at least 1).
        first_page: Events of the first page (at least 1).
        lookback: As for :func:`build`.
        lookahead: As for :func:`build`.
        header: The session's header; a fork's ``seedLength`` marks its cut point.

    Yields:
        The entries in seq order; when the range reaches the end of the log and the last turn
        is open, an :class:`OpenTurn` last. The entries equal ``build(events, start=start,
        stop=stop, ...).entries`` whenever every result follows its call within ``lookahead``.
    """
    count = len(events)
    start = max(0, min(start, count))
    stop = count if stop is None else max(start, min(stop, count))
    begin = _turn_start_before(events, start, max(0, lookback)) if start else 0
    results: dict[str, int] = {}
    seed_length = header.get("seedLength") if header is not None else None
    fold = TranscriptFold(result_seqs=results, emit_from=start,
                          seed_length=seed_length if type(seed_length) is int else None)
    if begin < start:
        fold.feed(events[begin:start])
    scanned = start
    size = max(1, first_page)
    at = start
    while at < stop:
        end = min(stop, at + size)
        ahead = min(count, end + max(0, lookahead))
        if ahead > scanned:
            for event in events[scanned:ahead]:
                if event.get("type") == "tool/result" and event.get("surfaceOp") == "append":
                    call_id = _result_call_id(event)
                    if call_id is not None:
                        results.setdefault(call_id, event["seq"])
            scanned = ahead
        yield from fold.feed(events[at:end])
        at = end
        size = min(max(1, page_events), size * 2)
    if stop == count:
        tail = fold.open_turn_entry()
        if tail is not None:
            yield tail


def last_entries(events: Sequence[Mapping[str, Any]], count: int, *,
                 keep: Callable[[Entry], bool] | None = None,
                 header: Mapping[str, Any] | None = None) -> tuple[Entry, ...]:
    """Return the last ``count`` entries of the log (those ``keep`` accepts), in seq order.

    Pages are built backwards from the end of the log, each twice as long as the one before,
    until ``count`` entries are found or the log's start is reached, so the cost follows how far
    back the entries are, not the log's length (``dsh show --last N``).

    Args:
        events: A log whose element at index ``i`` is the event with seq ``i``.
        count: Entries wanted (0 or less: none).
        keep: Which entries count (default: all).
        header: The session's header (a fork's cut point).
    """
    if count <= 0:
        return ()
    total = len(events)
    size = max(64, count * 4)
    while True:
        start = max(0, total - size)
        page = build(events, start=start, header=header).entries
        chosen = [entry for entry in page if keep is None or keep(entry)]
        if len(chosen) >= count or start == 0:
            return tuple(chosen[-count:])
        size *= 2


def _turn_at(events: Sequence[Mapping[str, Any]], seq: int) -> tuple[int, int | None]:
    """The last ``turn/start`` at or before ``seq``: its seq and turn number, or (-1, None)."""
    for index in range(seq, -1, -1):
        event = events[index]
        if event.get("type") == "turn/start":
            data = event.get("data")
            turn = data.get("turn") if isinstance(data, Mapping) else None
            return index, turn if type(turn) is int else None
    return -1, None


def _next_turn_start(events: Sequence[Mapping[str, Any]], after: int) -> int:
    for index in range(after + 1, len(events)):
        if events[index].get("type") == "turn/start":
            return index
    return len(events)


def turn_span(events: Sequence[Mapping[str, Any]], turn: int) -> tuple[int, int] | None:
    """Return ``(start, stop)``: the seqs of turn ``turn``, from its ``turn/start`` to the next.

    Turn numbers grow with seq in a log dsh writes, so the turn is found by bisection over the
    log (each probe reads back to the nearest ``turn/start``); a log whose numbers do not grow
    is searched from its start. ``stop`` is the next ``turn/start`` or the end of the log.

    Args:
        events: A log whose element at index ``i`` is the event with seq ``i``.
        turn: The turn number (``turn/start.data.turn``).

    Returns:
        The span, or None when no ``turn/start`` carries that number.
    """
    low, high = 0, len(events)
    while low < high:  # the first seq whose turn is >= `turn`
        mid = (low + high) // 2
        _, number = _turn_at(events, mid)
        if number is not None and number >= turn:
            high = mid
        else:
            low = mid + 1
    if low < len(events):
        at, number = _turn_at(events, low)
        if number == turn and at >= 0:
            return at, _next_turn_start(events, at)
    for index in range(len(events)):  # numbers that do not grow with seq: scan
        event = events[index]
        if event.get("type") == "turn/start":
            data = event.get("data")
            if isinstance(data, Mapping) and data.get("turn") == turn \
                    and type(data.get("turn")) is int:
                return index, _next_turn_start(events, index)
    return None


# -- what the model was sent -------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRequest:
    """What the model was sent with the log as it stood at seq ``seq``.

    Attributes:
        seq: The last event folded (the messages are derived from events ``0 .. seq``).
        nodes: The surface then: the seq of each event that projects a message, in model order.
        messages: ``(seq, message)`` for each node's message, in model order: all of them, or
            the last ``last`` nodes' when :func:`model_request` was asked for fewer (a node
            whose event projects no message, an empty assistant reply, is left out).
        header: The canonical request header folded so far (model, tools, parameters), or None.
        context: The latest ``request/context`` data (provider, model, window), or None.
    """

    seq: int
    nodes: tuple[int, ...]
    messages: tuple[tuple[int, FrozenDict], ...]
    header: FrozenDict | None
    context: FrozenDict | None


_FOLD_SLICE: Final = 4096
"""Events a model view folds per slice of the log (one slice read, not one event at a time)."""


def model_request(events: Sequence[Event], seq: int, *, last: int | None = None,
                  restore: RestoreState | None = None,
                  since: ModelRequest | None = None) -> ModelRequest:
    """Return the messages and request header the model was sent as of seq ``seq``.

    The surface is folded through ``seq`` (as a session that had appended exactly those events
    holds it), each node projected to its message, and the request header and context folded
    over the same events. Events are read a slice at a time, so a paged log stays bounded
    and its pages are read in order.

    Args:
        events: A log whose element at index ``i`` has seq ``i``.
        seq: The last event that counts, ``0 <= seq < len(events)``.
        last: Project only the last ``last`` nodes (the rest are counted in ``nodes``).
        restore: The restore state of a prefix of ``events`` (a restore point's): when it ends
            at or before ``seq`` the fold starts from it instead of from seq 0.
        since: An earlier answer of this function for the same log (any ``last``): when its
            ``seq`` is at or before ``seq`` (and after ``restore``'s end) the fold continues
            from it, so a reader asking for later requests of one log folds each event once.

    Raises:
        IndexError: ``seq`` is not a seq of the log.
        EventRejectedError: the prefix does not fold (a malformed surface op), as the online
            surface would have refused it.

    Rule: docs/rules.md#deriving-messages; docs/rules.md#header-folds;
    docs/view.md#the-model-view.
    """
    if not 0 <= seq < len(events):
        raise IndexError(f"seq {seq} is not in the log (it holds {len(events)} events)")
    surface = Surface()
    header: FrozenDict | None = None
    context: FrozenDict | None = None
    begin = 0
    if restore is not None and 0 < restore.event_count <= seq + 1:
        surface = Surface.resume(restore.nodes, restore.replace_generation)
        header, context, begin = restore.request_header, restore.request_context, \
            restore.event_count
    if since is not None and begin <= since.seq <= seq:
        # the replace generation only keys caches: the nodes are what the fold continues from
        surface = Surface.resume(since.nodes, 0)
        header, context, begin = since.header, since.context, since.seq + 1
    index = begin
    while index <= seq:
        stop = min(seq + 1, index + _FOLD_SLICE)
        for event in events[index:stop]:
            surface.apply(surface.plan(event, index, events))
            kind = event["type"]
            if kind == "request/header":
                header = fold_request_header((event,), header)
            elif kind == "request/context":
                data = event["data"]
                context = data if isinstance(data, FrozenDict) else None
            index += 1
    nodes = tuple(surface.nodes)
    chosen = nodes if last is None else nodes[max(0, len(nodes) - last):]
    messages: list[tuple[int, FrozenDict]] = []
    for node in chosen:
        message = derive_event_message(events[node])
        if message is not None:
            messages.append((node, message))
    return ModelRequest(seq=seq, nodes=nodes, messages=tuple(messages), header=header,
                        context=context)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelTail:
    """The end of what the model was sent as of seq ``seq``, read back from it (no fold from 0).

    Attributes:
        seq: The last event that counts.
        first_seq: The first event read: only events ``first_seq .. seq`` were read.
        nodes: The last surface nodes then, in model order (at least the ``last`` asked for,
            or the whole surface when ``first_seq`` is 0); the ones before are not known.
        messages: ``(seq, message)`` of the last ``last`` nodes, exactly as
            :func:`model_request` gives them.
        complete: True when ``first_seq`` is 0: ``nodes`` is the whole surface and the header
            and context are known.
        header: The request header as of ``seq`` when ``header_known``, else None.
        header_known: True when a ``request/header`` was read (or ``complete``); otherwise
            the header is that of an event before ``first_seq``, if any.
        context: The latest ``request/context`` data when ``context_known``, else None.
        context_known: As ``header_known``, for ``request/context``.
    """

    seq: int
    first_seq: int
    nodes: tuple[int, ...]
    messages: tuple[tuple[int, FrozenDict], ...]
    complete: bool
    header: FrozenDict | None
    header_known: bool
    context: FrozenDict | None
    context_known: bool


class _Gap:
    """Surface nodes of the unread prefix, in one run (how many, and which, is not known)."""

    __slots__ = ()


_TAIL_FIRST_WINDOW: Final = 1024
"""Events a model tail reads first; the window doubles while the messages are not known."""


def model_tail(events: Sequence[Event], seq: int, *, last: int,
               limit: int = 16_384) -> ModelTail | None:
    """Return the last ``last`` messages the model was sent as of ``seq``, reading back only.

    The events before ``seq`` are read backwards in a window that doubles (1,024 events, then
    2,048, ...) and folded over a surface whose start is not known: appends and replaces of
    nodes inside the window are exact; a replace that reaches into the unread prefix cuts
    that prefix where its run starts and ends. The window is large enough once at least
    ``last`` nodes follow every unread run. The request header and context are the last ones
    in the window (or unknown: ``header_known``). The surface ops read are not validated (the
    full fold, :func:`model_request`, refuses a malformed one).

    Args:
        events: A log whose element at index ``i`` has seq ``i``.
        seq: The last event that counts, ``0 <= seq < len(events)``.
        last: The messages wanted (at least 1).
        limit: Events read at most; a log whose last messages need more gives None.

    Returns:
        The tail, equal in its ``messages`` to ``model_request(events, seq,
        last=last).messages``; None when more than ``limit`` events would have to be read, or
        a surface op cannot be placed (the full fold then says why).

    Raises:
        IndexError: ``seq`` is not a seq of the log.

    Rule: docs/rules.md#surface-ops; docs/view.md#the-model-view.
    """
    if not 0 <= seq < len(events):
        raise IndexError(f"seq {seq} is not in the log (it holds {len(events)} events)")
    size = _TAIL_FIRST_WINDOW
    while True:
        first = max(0, seq + 1 - size)
        tail = _fold_window(events, first, seq, last)
        if tail is not None or first == 0:
            return tail
        if size >= limit:
            return None
        size = min(size * 2, limit)


def _fold_window(events: Sequence[Event], first: int, seq: int, last: int) -> ModelTail | None:
    """The fold of ``first .. seq`` over an unknown prefix, or None when it does not suffice."""
    tokens: list[int | _Gap] = [_Gap()] if first else []
    header: FrozenDict | None = None
    context: FrozenDict | None = None
    header_known = context_known = first == 0

    def place(target: Any) -> tuple[int, bool] | None:
        """Where seq ``target`` stands: (its token, whether inside an unread run)."""
        if type(target) is not int:
            return None
        if target >= first:
            try:
                return tokens.index(target), False
            except ValueError:
                return None
        gaps = [i for i, token in enumerate(tokens) if isinstance(token, _Gap)]
        return (gaps[0], True) if len(gaps) == 1 else None

    index = first
    while index <= seq:
        stop = min(seq + 1, index + _FOLD_SLICE)
        for event in events[index:stop]:
            kind = event["type"]
            if kind in SURFACE_EVENT_TYPES:
                op = event.get("surfaceOp")
                if op == "append":
                    tokens.append(index)
                elif isinstance(op, Mapping) and op.get("op") == "replace":
                    start, end = place(op.get("start")), place(op.get("end"))
                    if start is None or end is None or start[0] > end[0]:
                        return None
                    run: list[int | _Gap] = [_Gap()] if start[1] else []
                    run.append(index)
                    if end[1]:
                        run.append(_Gap())
                    tokens[start[0]:end[0] + 1] = run
                else:
                    return None
            elif kind == "request/header":
                header, header_known = fold_request_header((event,)), True
            elif kind == "request/context":
                data = event["data"]
                context, context_known = (data if isinstance(data, FrozenDict) else None), True
            index += 1
    gaps = [i for i, token in enumerate(tokens) if isinstance(token, _Gap)]
    known = [t for t in tokens[gaps[-1] + 1 if gaps else 0:] if isinstance(t, int)]
    if gaps and len(known) < last:
        return None
    nodes = tuple(known)
    messages: list[tuple[int, FrozenDict]] = []
    for node in nodes[max(0, len(nodes) - last):]:
        message = derive_event_message(events[node])
        if message is not None:
            messages.append((node, message))
    return ModelTail(seq=seq, first_seq=first, nodes=nodes, messages=tuple(messages),
                     complete=not gaps and first == 0, header=header, header_known=header_known,
                     context=context, context_known=context_known)

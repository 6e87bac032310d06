"""The message model's shapes: messages, content blocks, sources, stream chunks, token usage.

``TypedDict`` classes with the camelCase keys of the wire format (docs/events.md#the-message-model),
re-exported by :mod:`dsh._messages`, which loads this module when one of them is first named: each
``TypedDict`` field is a ``ForwardRef`` holding its own compiled code object, about 100 kB for
them all that a process appending messages never reads (docs/adapters.md#memory).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypeAlias, TypedDict

from dsh.json import JsonValue

# --- content blocks (docs/events.md#content-blocks) -----------------------------------------------


class TextBlock(TypedDict):
    """``{"type": "text", "text": str}``."""

    type: Literal["text"]
    text: str


class ReasoningBlock(TypedDict):
    """``{"type": "reasoning", "text": str}``: model reasoning kept for replay."""

    type: Literal["reasoning"]
    text: str


class _Dimensions(TypedDict):
    width: int
    height: int


class ImageAttachmentRef(TypedDict):
    """A stored image: id (``sha256:<64 hex>`` locally), media type, size in bytes, pixels."""

    attachmentId: str
    mediaType: Literal["image/png", "image/jpeg", "image/webp", "image/gif"]
    bytes: int
    width: int
    height: int
    name: NotRequired[str]
    originalDimensions: NotRequired[_Dimensions]


class ImageBlock(TypedDict):
    """``{"type": "image", "attachment": ImageAttachmentRef}``."""

    type: Literal["image"]
    attachment: ImageAttachmentRef


class ToolCallBlock(TypedDict):
    """A tool request: provider call id, tool name, raw JSON ``arguments`` text."""

    type: Literal["tool-call"]
    id: str
    name: str
    arguments: str


class ToolResultBlock(TypedDict):
    """A tool answer: the call id it answers, nested content blocks, optional error flag."""

    type: Literal["tool-result"]
    toolCallId: str
    content: list[ContentBlock]
    isError: NotRequired[bool]


ContentBlock: TypeAlias = (
    TextBlock | ReasoningBlock | ImageBlock | ToolCallBlock | ToolResultBlock | Mapping[str, Any])
"""One block of message content; unknown block types are kept verbatim.

Rule: docs/events.md#content-blocks.
"""


# --- sources (docs/events.md#messages) ------------------------------------------------------------


class UserMessageSource(TypedDict):
    """``{"kind": "user"}`` (host extensions may add fields)."""

    kind: Literal["user"]


class PluginMessageSource(TypedDict):
    """``{"kind": "plugin", "plugin": name, ...}``; ``form`` names an injected-context form."""

    kind: Literal["plugin"]
    plugin: str
    form: NotRequired[str]


class ModelMessageSource(TypedDict):
    """``{"kind": "model", "provider", "model", "replayState"?}``: the producing model."""

    kind: Literal["model"]
    provider: str
    model: str
    replayState: NotRequired[JsonValue]


class ToolMessageSource(TypedDict):
    """``{"kind": "tool", "callId"}``: the tool call a result answers."""

    kind: Literal["tool"]
    callId: str


MessageSource: TypeAlias = (
    UserMessageSource | PluginMessageSource | ModelMessageSource | ToolMessageSource
    | Mapping[str, Any])
"""Producer attribution, discriminated by ``kind``; plugin kinds are opaque.

Rule: docs/events.md#messages.
"""


# --- messages (docs/events.md#messages) -----------------------------------------------------------


class Message(TypedDict):
    """``{"id", "role", "content", "source"}``: one model-facing message."""

    id: str
    role: Literal["system", "user", "assistant"]
    content: list[ContentBlock]
    source: MessageSource


class UserMessage(TypedDict):
    """A message with role ``user``; the ``data`` of a ``user/message`` event."""

    id: str
    role: Literal["user"]
    content: list[ContentBlock]
    source: MessageSource


class AssistantMessage(TypedDict):
    """A message with role ``assistant`` and a model source."""

    id: str
    role: Literal["assistant"]
    content: list[ContentBlock]
    source: ModelMessageSource


class ToolResultMessage(TypedDict):
    """A user message holding exactly one ``tool-result`` block, with a tool source."""

    id: str
    role: Literal["user"]
    content: list[ToolResultBlock]
    source: ToolMessageSource


class SystemMessage(TypedDict):
    """A message with role ``system``; the ``data`` of a ``system/message`` event.

    Rule: docs/rules.md#the-system-head.
    """

    id: str
    role: Literal["system"]
    content: list[ContentBlock]
    source: MessageSource


# --- usage and stream chunks (docs/events.md#messages, docs/events.md#stream-chunks) --------------


class TokenUsage(TypedDict):
    """Token counts of one model call; disjoint (billed input = input + cache read + write)."""

    inputTokens: int
    outputTokens: int
    cacheReadTokens: NotRequired[int]
    cacheWriteTokens: NotRequired[int]
    reasoningTokens: NotRequired[int]


class LlmFailure(TypedDict):
    """A structured model failure: message, code, HTTP status, retry hint in ms, request id."""

    message: str
    code: str
    status: NotRequired[int]
    providerRetryAfterMs: NotRequired[int]
    requestId: NotRequired[str]


class FinishReason(TypedDict):
    """``{"kind": "stop" | "tool-calls" | "max-tokens" | "aborted" | "error", "failure"?}``."""

    kind: Literal["stop", "tool-calls", "max-tokens", "aborted", "error"]
    failure: NotRequired[LlmFailure]


class BlockStartChunk(TypedDict):
    """A new content block at ``index`` of type ``blockType``."""

    type: Literal["block-start"]
    index: int
    blockType: str


class TextDeltaChunk(TypedDict):
    """Text appended to block ``index``."""

    type: Literal["text-delta"]
    index: int
    text: str


class ReasoningDeltaChunk(TypedDict):
    """Reasoning text appended to block ``index``."""

    type: Literal["reasoning-delta"]
    index: int
    text: str


class ToolCallDeltaChunk(TypedDict):
    """Raw argument text appended to the tool call at block ``index``."""

    type: Literal["tool-call-delta"]
    index: int
    id: str
    name: NotRequired[str]
    argumentsDelta: str


class BlockEndChunk(TypedDict):
    """The authoritative assembled block at ``index``."""

    type: Literal["block-end"]
    index: int
    block: ContentBlock


class UsageChunk(TypedDict):
    """Token usage reported by the provider."""

    type: Literal["usage"]
    usage: TokenUsage


class FinishChunk(TypedDict):
    """End of the stream with its reason and optional adapter replay state."""

    type: Literal["finish"]
    reason: FinishReason
    replayState: NotRequired[JsonValue]


StreamChunk: TypeAlias = (
    BlockStartChunk | TextDeltaChunk | ReasoningDeltaChunk | ToolCallDeltaChunk | BlockEndChunk
    | UsageChunk | FinishChunk)
"""One raw provider stream chunk, carried by ``assistant/chunk`` (docs/events.md#stream-chunks)."""

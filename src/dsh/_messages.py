"""The message model: messages, content blocks, stream chunks, token usage, and constructors.

Shapes are dsh's wire shapes (docs/events.md#the-message-model), written as ``TypedDict`` classes
with the camelCase keys of the wire format. The constructors return frozen values
(:class:`~dsh.json.FrozenDict`) whose key order matches what dsh's own constructors produce, so
logs written here look like dsh's. Fresh message ids are ``str(uuid4())`` (docs/events.md#messages).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypeAlias, TypedDict
from uuid import uuid4

from dsh.json import FrozenDict, JsonValue, snapshot_json

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


# --- constructors (docs/events.md#messages) -------------------------------------------------------


def new_message_id() -> str:
    """Return a fresh message id: UUID v4 text, like ``crypto.randomUUID()``.

    Rule: docs/events.md#messages.
    """
    return str(uuid4())


def create_message(message: Mapping[str, Any]) -> FrozenDict:
    """Return a frozen copy of ``message`` with a fresh ``id`` appended last.

    Args:
        message: A message without (or with a stale) ``id``: ``role``, ``content``, ``source``.

    Returns:
        A :class:`FrozenDict` with the input's keys in order, then ``id`` (a new UUID v4).

    Raises:
        InvalidJsonError: the input is not lossless JSON (docs/formats.md#lossless-json).
    Rule: docs/events.md#messages.
    """
    fields = {k: v for k, v in message.items() if k != "id"}
    fields["id"] = new_message_id()
    return snapshot_json(fields)  # type: ignore[no-any-return]


def create_user_message(message: Mapping[str, Any]) -> FrozenDict:
    """Return a frozen user message: the input (``content``, ``source``), ``role: "user"``, ``id``.

    Raises:
        InvalidJsonError: the input is not lossless JSON.
    Rule: docs/events.md#messages (key order content, source, role, id).
    """
    fields = {k: v for k, v in message.items() if k not in ("role", "id")}
    fields["role"] = "user"
    return create_message(fields)


def create_system_message(message: Mapping[str, Any]) -> FrozenDict:
    """Return a frozen system message: the input, ``role: "system"``, then a fresh ``id``.

    The ``data`` of a ``system/message`` event, the protected surface head
    (docs/rules.md#the-system-head).

    Raises:
        InvalidJsonError: the input is not lossless JSON.
    """
    fields = {k: v for k, v in message.items() if k not in ("role", "id")}
    fields["role"] = "system"
    return create_message(fields)


def create_assistant_message(*, content: list[Any], provider: str, model: str,
                             replay_state: JsonValue = None) -> FrozenDict:
    """Return a frozen assistant message with a model source.

    Args:
        content: The assembled content blocks.
        provider: Provider id, e.g. ``"deepseek"``.
        model: Model id.
        replay_state: Adapter-private replay envelope; omitted when ``None``.

    Returns:
        ``{"role": "assistant", "content", "source": {"kind": "model", "provider", "model",
        "replayState"?}, "id"}``.

    Raises:
        InvalidJsonError: content or replay state is not lossless JSON.
    Rule: docs/events.md#messages.
    """
    source: dict[str, Any] = {"kind": "model", "provider": provider, "model": model}
    if replay_state is not None:
        source["replayState"] = replay_state
    return create_message({"role": "assistant", "content": content, "source": source})


def create_tool_result_message(*, call_id: str, content: list[Any],
                               is_error: bool = False) -> FrozenDict:
    """Return a frozen tool-result message answering ``call_id``.

    Returns:
        ``{"source": {"kind": "tool", "callId"}, "content": [{"type": "tool-result",
        "toolCallId", "content", "isError"}], "role": "user", "id"}``.

    Raises:
        InvalidJsonError: content is not lossless JSON.
    Rule: docs/events.md#messages.
    """
    return create_user_message({
        "source": {"kind": "tool", "callId": call_id},
        "content": [{"type": "tool-result", "toolCallId": call_id, "content": content,
                     "isError": is_error}],
    })

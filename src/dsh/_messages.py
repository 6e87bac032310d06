"""The message model: messages, content blocks, stream chunks, token usage, and constructors.

Shapes are dsh's wire shapes (docs/events.md#the-message-model), written as ``TypedDict`` classes
with the camelCase keys of the wire format in :mod:`dsh._message_types` and loaded from there
when first named. The constructors return frozen values
(:class:`~dsh.json.FrozenDict`) whose key order matches what dsh's own constructors produce, so
logs written here look like dsh's. Fresh message ids are UUID v4 text, what ``str(uuid4())``
gives (docs/events.md#messages).
"""

from __future__ import annotations

from collections.abc import Mapping
from os import urandom
from typing import TYPE_CHECKING, Any, Final

from dsh._lazy import lazy_exports
from dsh.json import FrozenDict, JsonValue, snapshot_json

if TYPE_CHECKING:  # defined in dsh._message_types, loaded on first use (see __getattr__)
    from dsh._message_types import AssistantMessage as AssistantMessage
    from dsh._message_types import BlockEndChunk as BlockEndChunk
    from dsh._message_types import BlockStartChunk as BlockStartChunk
    from dsh._message_types import ContentBlock as ContentBlock
    from dsh._message_types import FinishChunk as FinishChunk
    from dsh._message_types import FinishReason as FinishReason
    from dsh._message_types import ImageAttachmentRef as ImageAttachmentRef
    from dsh._message_types import ImageBlock as ImageBlock
    from dsh._message_types import LlmFailure as LlmFailure
    from dsh._message_types import Message as Message
    from dsh._message_types import MessageSource as MessageSource
    from dsh._message_types import ModelMessageSource as ModelMessageSource
    from dsh._message_types import PluginMessageSource as PluginMessageSource
    from dsh._message_types import ReasoningBlock as ReasoningBlock
    from dsh._message_types import ReasoningDeltaChunk as ReasoningDeltaChunk
    from dsh._message_types import StreamChunk as StreamChunk
    from dsh._message_types import SystemMessage as SystemMessage
    from dsh._message_types import TextBlock as TextBlock
    from dsh._message_types import TextDeltaChunk as TextDeltaChunk
    from dsh._message_types import TokenUsage as TokenUsage
    from dsh._message_types import ToolCallBlock as ToolCallBlock
    from dsh._message_types import ToolCallDeltaChunk as ToolCallDeltaChunk
    from dsh._message_types import ToolMessageSource as ToolMessageSource
    from dsh._message_types import ToolResultBlock as ToolResultBlock
    from dsh._message_types import ToolResultMessage as ToolResultMessage
    from dsh._message_types import UsageChunk as UsageChunk
    from dsh._message_types import UserMessage as UserMessage
    from dsh._message_types import UserMessageSource as UserMessageSource

_SHAPES: Final = (
    "TextBlock",
    "ReasoningBlock",
    "ImageAttachmentRef",
    "ImageBlock",
    "ToolCallBlock",
    "ToolResultBlock",
    "UserMessageSource",
    "PluginMessageSource",
    "ModelMessageSource",
    "ToolMessageSource",
    "Message",
    "UserMessage",
    "AssistantMessage",
    "ToolResultMessage",
    "SystemMessage",
    "TokenUsage",
    "LlmFailure",
    "FinishReason",
    "BlockStartChunk",
    "TextDeltaChunk",
    "ReasoningDeltaChunk",
    "ToolCallDeltaChunk",
    "BlockEndChunk",
    "UsageChunk",
    "FinishChunk",
    "ContentBlock",
    "MessageSource",
    "StreamChunk",
)
"""The shapes this module re-exports from :mod:`dsh._message_types`."""


# --- constructors (docs/events.md#messages) -------------------------------------------------------


def new_message_id() -> str:
    """Return a fresh message id: UUID v4 text, like ``crypto.randomUUID()``.

    Rule: docs/events.md#messages.
    """
    # the text of uuid4() built from the same 16 random bytes, version and variant bits set
    # as uuid.UUID(version=4) sets them: a third of str(uuid4())'s cost (its Python __init__
    # and __str__), paid for every message a turn appends
    digits = ((int.from_bytes(urandom(16)) & _UUID4_KEEP) | _UUID4_SET).to_bytes(16).hex()
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


_UUID4_KEEP: Final = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 128) - 1)
"""The bits of 16 random bytes a UUID v4 keeps (all but the version nibble and variant bits)."""
_UUID4_SET: Final = (0x4000 << 64) | (0x8000 << 48)
"""Version 4, variant RFC 4122 (``10``)."""


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
    fields["id"] = new_message_id()  # create_message(fields), one copy fewer: no id in fields
    return snapshot_json(fields)  # type: ignore[no-any-return]


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
    # create_message(...) of a fresh dict without an id: its id set here, one copy fewer
    return snapshot_json({"role": "assistant", "content": content,  # type: ignore[no-any-return]
                          "source": source, "id": new_message_id()})


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
    # create_user_message(...) of these fields, built in its key order at once
    return snapshot_json({  # type: ignore[no-any-return]
        "source": {"kind": "tool", "callId": call_id},
        "content": [{"type": "tool-result", "toolCallId": call_id, "content": content,
                     "isError": is_error}],
        "role": "user", "id": new_message_id()})


# The shapes load at first use: the constructors above never read them, and their
# ForwardRefs' code objects would sit in every process that appends (docs/adapters.md#memory).
__getattr__, __dir__ = lazy_exports(__name__, globals(), dict.fromkeys(_SHAPES,
                                                                       "dsh._message_types"),
                                    _SHAPES)

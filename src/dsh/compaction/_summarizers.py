"""Summarizers: what turns a span of model messages into a checkpoint text.

Invariants this module owns (docs/rules.md#the-checkpoint-message):

* a summarizer reads messages and returns text; it never touches the session (the region
  transaction owns every append);
* a checkpoint is Markdown with the reference's eight sections, in order: primary request and
  intent, key technical concepts, files and code, errors and fixes, pending jobs, current work,
  next step, critical context; an empty section says ``(none)``;
* the framed checkpoint message is ``[preamble + two newlines + "<compacted-summary>", *summary
  text blocks, "</compacted-summary>"]`` (the wording of the preamble is ours);
* :class:`DigestSummarizer` is offline and deterministic: the same messages give the same text.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, runtime_checkable

from dsh._errors import CompactionError
from dsh.json import FrozenDict, FrozenList, JsonValue, loads

Message = Mapping[str, Any]
"""A provider message as derived from the surface: ``{"role", "content": [blocks], ...}``."""

CHECKPOINT_OPEN_TAG: Final = "<compacted-summary>"
CHECKPOINT_CLOSE_TAG: Final = "</compacted-summary>"

CHECKPOINT_PREAMBLE: Final = (
    "Earlier parts of this conversation were condensed into the checkpoint below so that the "
    "context window has room to continue. Take what it records as settled background, rely on "
    "it without repeating it, and carry on with the task from the messages after it; do not "
    "mention or reply to the checkpoint itself."
)
"""Our wording of the checkpoint preamble (docs/rules.md#the-checkpoint-message).

What it says: an automatically generated checkpoint of an earlier span, established background,
continue without acknowledging it.
"""

CHECKPOINT_SECTIONS: Final = (
    "Primary Request and Intent",
    "Key Technical Concepts",
    "Files and Code",
    "Errors and Fixes",
    "Pending Jobs",
    "Current Work",
    "Next Step",
    "Critical Context",
)
"""The eight checkpoint sections, in the reference's order.

Rule: docs/rules.md#the-checkpoint-message.
"""

COMPACTION_INSTRUCTION: Final = (
    "Write a checkpoint of the conversation so far so that work can continue from it alone. "
    "Answer with Markdown only, using exactly these eight second-level headings in this order: "
    + ", ".join(f"## {name}" for name in CHECKPOINT_SECTIONS) + ". "
    "Under each heading write short bullet points; write (none) under a heading that has "
    "nothing. Keep file paths, commands, identifiers, error messages and the user's own "
    "instructions exactly as written. If the conversation contains an earlier "
    f"{CHECKPOINT_OPEN_TAG} block, fold its content into your sections instead of copying it. "
    "Do not call tools and do not refer to this request or to summarizing."
)
"""Our wording of the compaction request appended as the final user message.

Rule: docs/rules.md#the-checkpoint-message.
"""

_INSTRUCTION_SOURCE: Final = FrozenDict({"kind": "plugin", "plugin": "dsh-compaction"})


def checkpoint_source(compaction_id: str, source_command_id: str | None = None) -> FrozenDict:
    """Return ``{kind: "plugin", plugin: "compact", compactionId, sourceCommandId?}``.

    Rule: docs/rules.md#compaction.
    """
    source: dict[str, JsonValue] = {"kind": "plugin", "plugin": "compact",
                                    "compactionId": compaction_id}
    if source_command_id is not None:
        source["sourceCommandId"] = source_command_id
    return FrozenDict(source)


def is_checkpoint_source(source: object) -> bool:
    """True when ``source`` is a compaction checkpoint's (``kind plugin``, ``plugin compact``)."""
    return (isinstance(source, Mapping) and source.get("kind") == "plugin"
            and source.get("plugin") == "compact")


def frame_checkpoint_content(summary: Sequence[str]) -> FrozenList:
    """Frame summary texts as checkpoint content blocks (docs/rules.md#the-checkpoint-message).

    Args:
        summary: One or more summary texts (each becomes one text block).

    Returns:
        ``[{text: preamble + two newlines + "<compacted-summary>"}, *summary blocks,
        {text: "</compacted-summary>"}]`` as frozen JSON.
    """
    head = f"{CHECKPOINT_PREAMBLE}\n\n{CHECKPOINT_OPEN_TAG}"
    blocks = [FrozenDict({"type": "text", "text": head})]
    blocks.extend(FrozenDict({"type": "text", "text": text}) for text in summary)
    blocks.append(FrozenDict({"type": "text", "text": CHECKPOINT_CLOSE_TAG}))
    return FrozenList(blocks)


def extract_checkpoint_summary(message: Message) -> str | None:
    """Return the summary text inside a checkpoint message's tags, or None if it is not one.

    Works for checkpoints written by dsh (whose preamble differs from ours): the text blocks
    after the block ending in ``<compacted-summary>`` and before ``</compacted-summary>``.
    """
    if not is_checkpoint_source(message.get("source")):
        return None
    texts = [b.get("text") for b in message.get("content") or ()
             if isinstance(b, Mapping) and b.get("type") == "text"]
    inside: list[str] = []
    opened = False
    for text in texts:
        if not isinstance(text, str):
            continue
        if not opened:
            if text.endswith(CHECKPOINT_OPEN_TAG):
                opened = True
            continue
        if text == CHECKPOINT_CLOSE_TAG:
            return "\n\n".join(inside)
        inside.append(text)
    return "\n\n".join(inside) if opened else None


@dataclass(frozen=True, slots=True, kw_only=True)
class SummaryResult:
    """What a summarizer returns when it has more to say than the text.

    Attributes:
        summary: Non-blank summary texts, one text block each.
        provider: Provider name recorded in ``compaction/summary`` (e.g. ``"deepseek"``).
        model: Model name recorded in ``compaction/summary``.
        raw_output: The complete provider output (content blocks), if any.
        llm_stream_call: True when exactly one provider call produced it; then ``raw_output``
            is required (docs/rules.md#the-checkpoint-message).
        max_tokens: Generation cap used, if any.
        usage: Provider ``TokenUsage``, if any (its cache-read and cache-write counts tell how
            much of the summary request the provider's prompt cache served).
        request: The summary request's fingerprint (``{tools, system, messages, prefix,
            sharedMessages}``, docs/effects.md#cache-keeping-compaction), if any.
        blocks: Content blocks the checkpoint message carries after its framed summary (a
            provider's opaque compaction item as a ``provider-raw`` block), if any.
    """

    summary: tuple[str, ...]
    provider: str
    model: str
    raw_output: JsonValue = None
    llm_stream_call: bool = False
    max_tokens: int | None = None
    usage: JsonValue = None
    request: JsonValue = None
    blocks: JsonValue = None

    def __post_init__(self) -> None:
        if not self.summary or not any(t.strip() for t in self.summary):
            raise CompactionError("a summary must hold non-blank text; the summarizer returned "
                                  "none", code="SUMMARY")
        if self.llm_stream_call and self.raw_output is None:
            raise CompactionError("a summary marked llm_stream_call needs its raw_output",
            code="SUMMARY")


@runtime_checkable
class Summarizer(Protocol):
    """Turns the shadowed messages into checkpoint text (synchronous form).

    ``summarize(messages, *, previous=None)`` receives the derived messages of the span in
    surface order (a leading earlier checkpoint included) and, when the span starts with an
    earlier checkpoint, its summary text as ``previous``. It returns the summary text or a
    :class:`SummaryResult`; raising aborts the compaction (recorded as a failed attempt).
    """

    def summarize(self, messages: Sequence[Message], *,
                  previous: str | None = None) -> str | SummaryResult:
        """Return the checkpoint text for ``messages`` (see the class docstring)."""
        ...


@runtime_checkable
class AsyncSummarizer(Protocol):
    """The awaitable form of :class:`Summarizer`; cancellation propagates into it."""

    async def asummarize(self, messages: Sequence[Message], *,
                         previous: str | None = None) -> str | SummaryResult:
        """Return the checkpoint text for ``messages``; may be cancelled."""
        ...


# --- the offline digest ---------------------------------------------------------------------

_WS = re.compile(r"\s+")
_PATH_KEYS: Final = ("path", "file", "file_path", "filePath", "filename", "target")
_COMMAND_KEYS: Final = ("command", "cmd", "script")


def _clip(text: str, limit: int) -> str:
    flat = _WS.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _texts(content: object, kinds: tuple[str, ...] = ("text",)) -> list[str]:
    if not isinstance(content, list):
        return []
    return [b["text"] for b in content if isinstance(b, Mapping) and b.get("type") in kinds
            and isinstance(b.get("text"), str)]


def _parse_sections(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith("## "):
            current = sections.setdefault(stripped[3:].strip(), [])
        elif current is not None and stripped.startswith("- "):
            item = stripped[2:].strip()
            if item and item != "(none)":
                current.append(item)
    return sections


_TOOLS_PREFIX: Final = "tools used: "
_TOOL_COUNT = re.compile(r"^(.+) x(\d+)$")


def _tools_line(counts: Mapping[str, int]) -> str:
    return _TOOLS_PREFIX + ", ".join(f"{name} x{n}" for name, n in sorted(counts.items()))


def _merge_tool_counts(old: dict[str, list[str]], new: dict[str, list[str]]) -> None:
    """Add the previous checkpoint's tool counts into the new ``tools used`` line."""
    counts: dict[str, int] = {}
    for source in (old, new):
        items = source.get("Key Technical Concepts", [])
        for item in [i for i in items if i.startswith(_TOOLS_PREFIX)]:
            items.remove(item)
            for part in item[len(_TOOLS_PREFIX):].split(", "):
                match = _TOOL_COUNT.match(part)
                if match:
                    counts[match[1]] = counts.get(match[1], 0) + int(match[2])
    if counts:
        new["Key Technical Concepts"] = [_tools_line(counts)]


@dataclass(frozen=True, slots=True, kw_only=True)
class DigestSummarizer:
    """An offline, deterministic checkpoint built from the messages' structure.

    Rule: docs/rules.md#the-checkpoint-message.

    Sections: user requests in order (primary request), tools used (key concepts), files and
    commands named in tool-call arguments (files and code), failed tool results (errors),
    unanswered tool calls (pending jobs), the latest assistant text (current work), an
    unanswered last request (next step), and earlier assistant statements (critical context).
    An earlier checkpoint (``previous``) is merged section by section, older items first.

    Attributes:
        item_chars: Each bullet is clipped to this many code points (whitespace collapsed).
        section_items: Each section keeps at most this many bullets (the newest), noting how
            many older ones were dropped.
        provider: Recorded as ``compaction/summary.provider``.
        model: Recorded as ``compaction/summary.model``.
    """

    item_chars: int = 160
    section_items: int = 12
    provider: str = "dsh"
    model: str = "digest-v1"

    def summarize(self, messages: Sequence[Message], *,
                  previous: str | None = None) -> SummaryResult:
        """Return the digest of ``messages`` merged over ``previous`` (never raises on shape)."""
        new = self._collect(messages)
        merged: dict[str, list[str]] = {}
        old = _parse_sections(previous) if previous else {}
        _merge_tool_counts(old, new)
        if new["Current Work"] and old.get("Current Work"):
            # the older current work becomes earlier context rather than disappearing
            old.setdefault("Critical Context", []).extend(old.pop("Current Work"))
        spoke = bool(new["Primary Request and Intent"] or new["Current Work"])
        for name in CHECKPOINT_SECTIONS:
            if (name == "Current Work" and new[name]) or (name == "Next Step" and spoke):
                items = list(new[name])  # the newest state replaces the older one
            else:
                items = list(old.get(name, ())) + new[name]
            merged[name] = items
        parts = []
        for name in CHECKPOINT_SECTIONS:
            items, dropped = self._newest(merged[name])
            lines = [f"## {name}"]
            if dropped > 0:
                lines.append(f"- ({dropped} earlier items omitted)")
            lines.extend(f"- {item}" for item in items)
            if not items:
                lines.append("- (none)")
            parts.append("\n".join(lines))
        return SummaryResult(summary=("\n\n".join(parts),), provider=self.provider,
                             model=self.model)

    async def asummarize(self, messages: Sequence[Message], *,
                         previous: str | None = None) -> SummaryResult:
        """Awaitable twin of :meth:`summarize` (CPU only, runs inline)."""
        return self.summarize(messages, previous=previous)

    def _newest(self, items: list[str]) -> tuple[list[str], int]:
        """Clip and de-duplicate from the newest end; return (kept in order, older count)."""
        kept: list[str] = []
        seen: set[str] = set()
        index = len(items) - 1
        # Only the kept window is clipped, so huge spans cost O(kept), not O(items).
        while index >= 0 and len(kept) < self.section_items:
            item = _clip(items[index], self.item_chars)
            if item not in seen:
                seen.add(item)
                kept.append(item)
            index -= 1
        kept.reverse()
        return kept, len(set(items[:index + 1]) - seen)

    def _collect(self, messages: Sequence[Message]) -> dict[str, list[str]]:
        requests: list[str] = []
        statements: list[str] = []
        files: list[str] = []
        tool_counts: dict[str, int] = {}
        errors: list[str] = []
        pending: dict[str, str] = {}
        names: dict[str, str] = {}
        last_request_answered = True
        for message in messages:
            content = message.get("content")
            if is_checkpoint_source(message.get("source")):
                continue  # merged through ``previous``; its text is not a request
            if message.get("role") == "assistant":
                texts = [t for t in _texts(content) if t.strip()]
                if texts:
                    statements.append(" ".join(texts))
                    last_request_answered = True
                for block in content if isinstance(content, list) else ():
                    if isinstance(block, Mapping) and block.get("type") == "tool-call":
                        self._note_call(block, files, tool_counts, pending, names)
                continue
            results = [b for b in content if isinstance(b, Mapping)
                       and b.get("type") == "tool-result"] if isinstance(content, list) else []
            for block in results:
                call_id = block.get("toolCallId")
                pending.pop(call_id if isinstance(call_id, str) else "", None)
                if block.get("isError") is True:
                    detail = " ".join(_texts(block.get("content"))).strip().split("\n")[0]
                    tool = names.get(call_id if isinstance(call_id, str) else "", "tool")
                    errors.append(f"{tool} failed: {detail or '(no output)'}")
            texts = [t for t in _texts(content) if t.strip()]
            if texts and not results:
                requests.append(" ".join(texts))
                last_request_answered = False
        return {
            "Primary Request and Intent": requests,
            "Key Technical Concepts": [_tools_line(tool_counts)] if tool_counts else [],
            "Files and Code": files,
            "Errors and Fixes": errors,
            "Pending Jobs": [f"tool call {cid} ({name}) has no result yet"
                             for cid, name in pending.items()],
            "Current Work": statements[-1:],
            "Next Step": [] if last_request_answered else [f"answer: {requests[-1]}"],
            "Critical Context": statements[:-1],
        }

    def _note_call(self, block: Mapping[str, Any], files: list[str],
                   tool_counts: dict[str, int], pending: dict[str, str],
                   names: dict[str, str]) -> None:
        name = block.get("name") if isinstance(block.get("name"), str) else "tool"
        assert isinstance(name, str)
        tool_counts[name] = tool_counts.get(name, 0) + 1
        call_id = block.get("id")
        if isinstance(call_id, str):
            pending[call_id] = name
            names[call_id] = name
        arguments = block.get("arguments")
        try:
            parsed = loads(arguments) if isinstance(arguments, str) else None
        except ValueError:  # InvalidJsonError: arguments are free text; nothing to extract
            parsed = None
        if not isinstance(parsed, Mapping):
            return
        for key in _PATH_KEYS:
            value = parsed.get(key)
            if isinstance(value, str) and value:
                files.append(f"file: {value}")
        for key in _COMMAND_KEYS:
            value = parsed.get(key)
            if isinstance(value, str) and value:
                files.append(f"command: `{value}`")


# --- the model-backed summarizer ------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmSummarizer:
    """A checkpoint written by a model (default ``summarizeWithLlm``).

    Rule: docs/rules.md#the-checkpoint-message.

    The request is the span's messages followed by one user message carrying
    :data:`COMPACTION_INSTRUCTION` (source ``{kind: "plugin", plugin: "dsh-compaction"}``).

    Attributes:
        complete: ``complete(messages) -> text``: one model call; raise on failure.
        acomplete: Optional awaitable twin; without it the async path runs ``complete`` in a
            worker thread.
        provider: Recorded as ``compaction/summary.provider``.
        model: Recorded as ``compaction/summary.model``.
        max_tokens: Generation cap recorded as ``maxTokens`` (default 8192,
            docs/rules.md#automatic-compaction).
        new_id: Returns the id of the instruction message (default: a random UUID4).

    Raises (from summarize):
        CompactionError: code ``summary`` when the model returned no non-blank text.
    """

    complete: Callable[[list[Message]], str]
    acomplete: Callable[[list[Message]], Awaitable[str]] | None = None
    provider: str = "llm"
    model: str = "unknown"
    max_tokens: int = 8192
    new_id: Callable[[], str] = field(default=lambda: str(uuid.uuid4()), repr=False)

    def request(self, messages: Sequence[Message]) -> list[Message]:
        """Return the request messages: the span, then the instruction as a user message."""
        instruction = FrozenDict({
            "id": self.new_id(), "role": "user",
            "content": FrozenList([FrozenDict({"type": "text", "text": COMPACTION_INSTRUCTION})]),
            "source": _INSTRUCTION_SOURCE})
        return [*messages, instruction]

    def _result(self, text: object) -> SummaryResult:
        if not isinstance(text, str) or not text.strip():
            raise CompactionError(
                f"the summarization model returned no text summary (got {type(text).__name__})",
                code="SUMMARY")
        return SummaryResult(summary=(text,), provider=self.provider, model=self.model,
                             raw_output=FrozenList([FrozenDict({"type": "text", "text": text})]),
                             max_tokens=self.max_tokens)

    def summarize(self, messages: Sequence[Message], *,
                  previous: str | None = None) -> SummaryResult:
        """Ask the model once; ``previous`` is ignored (the checkpoint is in ``messages``)."""
        return self._result(self.complete(self.request(messages)))

    async def asummarize(self, messages: Sequence[Message], *,
                         previous: str | None = None) -> SummaryResult:
        """Awaitable twin of :meth:`summarize`; cancellation propagates into ``acomplete``."""
        request = self.request(messages)
        if self.acomplete is not None:
            return self._result(await self.acomplete(request))
        import asyncio  # not at the top: `import dsh` stays free of asyncio (~25 ms)

        return self._result(await asyncio.to_thread(self.complete, request))

"""Which transcript format a file holds, decided from its content (and extension for YAML).

Rules, first match wins:

* ``.yaml`` / ``.yml`` with a top-level ``interactions`` key → ``anthropic`` (VCR cassette of
  Messages API traffic); any other YAML is not a transcript.
* JSONL (more than one JSON line, or a ``.jsonl`` file): first record a dsh header → ``dsh``;
  any Codex record (envelope, legacy metadata/state) → ``codex``; any Claude Code record →
  ``claude-code``; ``{cassette|request, response}`` exchanges → ``anthropic``; resolver
  records (``history`` beside ``git_patch``/``issue``/…) → ``openhands-resolver``; objects with
  an OpenHands ``history`` → ``openhands``.
* One JSON document: ``schema_version`` ``ATIF-…`` with ``steps`` → ``atif``; a V0 event
  list or ``{history: events}`` → ``openhands``; a resolver
  record → ``openhands-resolver``; ``{sessionId|projectHash, messages}`` whose messages are
  typed ``user``/``gemini``/… → ``gemini-cli``; an object with
  ``history`` + ``trajectory``/``info``/``environment`` (or only ``history`` of chat messages)
  → ``swe-agent``; mini-swe-agent markers (``mswea_bash_command``, ``<returncode>``) or a
  ``trajectory_format`` wrapper → ``mini-swe-agent``; ``interactions`` → ``anthropic``; a
  request body or message list using Anthropic block types (``tool_use``, ``tool_result``,
  ``thinking``) or a top-level ``system`` → ``anthropic``; any other list / body of messages
  with a ``role`` → ``openai-chat``.
* Nothing matching: ``ImportFormatError`` "not a supported transcript format (supported: …)".
"""

from __future__ import annotations

import re
from itertools import islice
from pathlib import Path
from typing import Any, Final

import orjson

from dsh._errors import ImportFormatError
from dsh.interop._atif import looks_like_atif
from dsh.interop._claude_code import looks_like_claude_code
from dsh.interop._codex import looks_like_codex
from dsh.interop._common import (
    JsonlSource,
    mapping_errors,
    read_json_document,
    read_jsonl_records,
    read_source_bytes,
)
from dsh.interop._dsh_log import looks_like_dsh_header
from dsh.interop._gemini_cli import looks_like_gemini_cli
from dsh.interop._openhands import looks_like_openhands_events
from dsh.interop._openhands_resolver import looks_like_resolver_output
from dsh.interop._swe_agent import looks_like_mini_swe_agent

FORMATS: Final = ("claude-code", "codex", "openai-chat", "anthropic", "openhands",
                  "openhands-resolver", "gemini-cli", "swe-agent", "mini-swe-agent", "dsh", "atif")
"""Every format name :func:`dsh.interop.import_file` accepts (besides ``"auto"``)."""

_ANTHROPIC_BLOCKS: Final = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking"})


def _is_jsonl(path: Path, source: JsonlSource) -> bool:
    if path.suffix.lower() == ".jsonl":
        return True
    if path.suffix.lower() in (".json", ".traj"):
        return False
    lines = [chunk for _, _, chunk, _ in islice(source.lines(), 2)]
    return len(lines) > 1 and lines[0].lstrip().startswith(b"{") and lines[0].rstrip().endswith(
        b"}")


def _uses_anthropic_blocks(messages: Any) -> bool:
    if not isinstance(messages, list):
        return False
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and any(
                isinstance(b, dict) and isinstance(b.get("type"), str)
                and b["type"] in _ANTHROPIC_BLOCKS for b in content):
            return True
    return False


_CASSETTE_KEY: Final = re.compile(rb"""^(?:\{\s*)?["']?interactions["']?\s*:""", re.M)
"""A VCR cassette's top-level ``interactions`` key, block or flow style."""


def detect_format(path: Path) -> str:
    """Return the format name of ``path`` (one of :data:`FORMATS`).

    Raises:
        ImportFormatError: unreadable/empty/binary/non-JSON file, or JSON of no known format
            (``format`` in ``where`` is ``"auto"``).
    """
    path = Path(path)
    with mapping_errors(path, "auto"):
        return _detect(path)


def _detect(path: Path) -> str:
    if path.suffix.lower() in (".yaml", ".yml"):
        if _CASSETTE_KEY.search(read_source_bytes(path, "auto")) is None:
            # Any YAML file is no transcript: a folder walk passes over it (docs/cli.md).
            raise ImportFormatError(
                "not a supported transcript format (YAML without a top-level interactions "
                f"key, so not a VCR cassette; supported: {', '.join(FORMATS)}); pass --format "
                "if it is one of them", path=str(path), format="auto", kind="unsupported")
        return "anthropic"
    # Read a megabyte at a time (checked as read_source_bytes checks it), never whole: a
    # transcript's format shows in its first lines (docs/interop.md#streaming-imports).
    source = JsonlSource(path, "auto")
    if _is_jsonl(path, source):
        head = _head_records(source)
        if head is not None:
            found = _jsonl_format(head)
            if found is not None:
                return found
        records = read_jsonl_records(path, "auto", live=True)
        first = records[0][1]
        found = _jsonl_format([r for _, r in records])
        if found is not None:
            return found
        raise ImportFormatError(
            f"not a supported transcript format (JSONL whose first record is a JSON "
            f"{_shape(first)}; supported: {', '.join(FORMATS)}); pass --format if it is one "
            "of them", path=str(path), line=records[0][0], format="auto",
            kind="unsupported")
    return _document_format(path)


_HEAD_RECORDS: Final = 256


def _head_records(source: JsonlSource) -> list[Any] | None:
    """The first records of a JSONL file, or None when any of them does not parse.

    Deciding on the head keeps detection O(1) in the file size; a head that is not clean JSON
    takes the full read, which reports the bad line exactly. The head is counted in records,
    not lines, so blank lines before the first records do not push it into the full read.
    """
    out: list[Any] = []
    for _, _, chunk, _ in source.lines():
        if len(out) >= _HEAD_RECORDS:
            break
        try:
            out.append(orjson.loads(chunk))
        except orjson.JSONDecodeError:
            return None
    return out or None


def _jsonl_format(values: list[Any]) -> str | None:
    """The format of a list of JSONL records, or None when no rule matches (module rules)."""
    if looks_like_dsh_header(values[0]):
        return "dsh"
    if any(looks_like_codex(r) for r in values):
        return "codex"
    if any(looks_like_claude_code(r) for r in values):
        return "claude-code"
    if all(isinstance(r, dict) and "request" in r and "response" in r for r in values):
        return "anthropic"
    if all(looks_like_resolver_output(r) for r in values):
        return "openhands-resolver"
    if all(isinstance(r, dict) and looks_like_openhands_events(r.get("history"))
           for r in values):
        return "openhands"
    return None


def _document_format(path: Path) -> str:
    """The format of a single JSON document (module rules).

    Raises:
        ImportFormatError: the document is not valid JSON; one that does not even start as
            JSON (README.md, a CSV) is told it is no transcript, with the formats dsh imports.
    """
    try:
        doc = read_json_document(path, "auto")
    except ImportFormatError as exc:
        try:
            with path.open("rb") as f:
                start = f.read(4096).lstrip()[:1]
        except OSError:
            raise exc from None  # the read's own error already says what is wrong
        if not start or start in (b"{", b"["):
            raise
        # nothing in it was ever a transcript: "fix the document" would be no advice
        raise ImportFormatError(
            f"{path}: not a transcript dsh recognizes: it does not start as JSON; dsh imports "
            f"{', '.join(sorted(FORMATS))}, each a JSON or JSONL file: if the file is one of "
            "them, pass --format NAME to be told what is wrong in it", path=str(path), line=1,
            format="auto") from exc
    if looks_like_atif(doc):
        return "atif"
    if looks_like_openhands_events(doc):
        return "openhands"
    if looks_like_resolver_output(doc):
        return "openhands-resolver"
    if looks_like_gemini_cli(doc):
        return "gemini-cli"
    if isinstance(doc, dict):
        if looks_like_openhands_events(doc.get("history")):
            return "openhands"
        if isinstance(doc.get("history"), list) and (
                {"trajectory", "info", "environment"} & set(doc) or all(
                    isinstance(m, dict) and "role" in m for m in doc["history"])):
            return "swe-agent"
        if looks_like_mini_swe_agent(doc):
            return "mini-swe-agent"
        if "interactions" in doc:
            return "anthropic"
        if _chat_messages(doc.get("messages")):
            if "system" in doc or _uses_anthropic_blocks(doc["messages"]):
                return "anthropic"
            return "openai-chat"
    if isinstance(doc, list) and doc and all(isinstance(m, dict) and "role" in m for m in doc):
        if looks_like_mini_swe_agent(doc):
            return "mini-swe-agent"
        if _uses_anthropic_blocks(doc):
            return "anthropic"
        return "openai-chat"
    raise ImportFormatError(
        f"not a supported transcript format (a JSON {_shape(doc)}; supported: "
        f"{', '.join(FORMATS)}); pass --format if it is one of them", path=str(path), line=1,
        format="auto", kind="unsupported")


def _chat_messages(value: object) -> bool:
    """A non-empty list of objects that all have a string ``role`` (a chat message list)."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in value)


def _shape(doc: object) -> str:
    """A few words on what a JSON value is, for the "not supported" message."""
    if isinstance(doc, dict):
        return f"object with keys {[key[:40] for key in sorted(doc)[:8]]}"
    return "array" if isinstance(doc, list) else type(doc).__name__

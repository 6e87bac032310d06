"""Handing a session back: a Claude Code session file and a Codex rollout of a dsh log.

Both walk the session's history (:mod:`dsh.interop._history`: what a clear, pop or delete
removed is not in it, a quarantined message is its placeholder) and write the layout our
importers read from those agents (Rule: docs/standards.md#handing-a-session-back,
docs/standards.md#what-the-exports-hold):

* **Claude Code** (:func:`to_claude_code`): one JSONL line per message, chained by
  ``parentUuid``; an assistant message is one ``assistant`` line (``message.id``, ``model``,
  ``usage``, ``content`` blocks: ``thinking``, ``text``, ``tool_use``), a tool result a ``user``
  line holding one ``tool_result`` block (``is_error``), a compaction a ``compact_boundary``
  ``system`` line followed by the ``isCompactSummary`` user line. Subagent sessions are the
  ``<sessionId>/subagents/agent-<id>.jsonl`` files beside it (:func:`claude_code_files`).
* **Codex** (:func:`to_codex`): ``session_meta``, a ``turn_context`` whenever the model
  changes, then ``response_item`` lines (``message`` input/output text, ``reasoning``,
  ``function_call``, ``function_call_output``) and ``compacted`` for a compaction.

Reasoning keeps its text everywhere; a signature (Claude thinking) or encrypted reasoning
(OpenAI) is written only for the agent whose models can use it: a Claude thinking signature
only when the answer came from an Anthropic model, encrypted reasoning only into a Codex file
when it came from OpenAI. Images become a text placeholder naming the attachment (the log keeps
a reference, not the bytes). A Codex tool output is text; whether it was an error is not
carried (the rollout has no field the resumed agent reads for it).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from dsh.interop._history import Entry, LogLike, block_text, history, iso_time, usage_of

_NAMESPACE: Final = uuid.UUID("0b7d0e8e-8c1e-5d53-9a0c-2f0f6c1d4e21")
"""uuid5 namespace of the ids dsh writes into another agent's files (ours; any fixed UUID)."""

_UUID: Final = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
                          re.IGNORECASE)
_VERSION: Final = "dsh-export"


def handoff_session_id(log: LogLike) -> str:
    """The UUID another agent knows the session by (both name session files by UUID).

    The session's own id when it is a UUID, else a uuid5 of it.
    """
    sid = str(log.header.get("id", ""))
    return sid.lower() if _UUID.match(sid) else str(uuid.uuid5(_NAMESPACE, sid))


def _uid(*parts: object) -> str:
    return str(uuid.uuid5(_NAMESPACE, "\x00".join(str(p) for p in parts)))


_text = block_text


def _joined(blocks: Sequence[Any]) -> str:
    return "\n".join(t for b in blocks if isinstance(b, Mapping) and (t := _text(b)))


def _source(message: Mapping[str, Any]) -> Mapping[str, Any]:
    source = message.get("source")
    return source if isinstance(source, Mapping) else {}


def _is_anthropic(message: Mapping[str, Any]) -> bool:
    source = _source(message)
    return source.get("provider") == "anthropic" or str(source.get("model", "")).startswith(
        "claude")


def _tool_result(message: Mapping[str, Any]) -> Mapping[str, Any] | None:
    blocks = [b for b in message.get("content") or [] if isinstance(b, Mapping)]
    if len(blocks) == 1 and blocks[0].get("type") == "tool-result":
        return blocks[0]
    return None


def _is_placeholder(message: Mapping[str, Any]) -> bool:
    """Whether ``message`` is a quarantine placeholder (source plugin ``quarantine``).

    Written as the plain text the model is sent, not as injected context
    (docs/standards.md#what-the-exports-hold, docs/forgetting.md#quarantine).
    """
    source = _source(message)
    return source.get("kind") == "plugin" and source.get("plugin") == "quarantine"


def _compaction_text(entry: Entry) -> str:
    return _joined(entry.message.get("content") or [])


# --- Claude Code ------------------------------------------------------------------------------


def claude_project_slug(cwd: str) -> str:
    """Claude Code's project folder name for ``cwd``.

    Every character that is not an ASCII letter or digit becomes ``-``; a name over 200
    characters is cut and gets a hash suffix (base 36 of a 32-bit string hash).
    """
    slug = re.sub(r"[^a-zA-Z0-9]", "-", cwd)
    if len(slug) <= 200:
        return slug
    h = 0
    for ch in cwd:
        h = ((h << 5) - h + ord(ch)) & 0xFFFFFFFF
    h = abs(h - 0x100000000 if h >= 0x80000000 else h)
    digits, out = "0123456789abcdefghijklmnopqrstuvwxyz", ""
    while h:
        h, rest = divmod(h, 36)
        out = digits[rest] + out
    return f"{slug[:200]}-{out or '0'}"


def _claude_blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    signed = _is_anthropic(message)
    out: list[dict[str, Any]] = []
    for b in message.get("content") or []:
        if not isinstance(b, Mapping):
            continue
        kind = b.get("type")
        if kind == "reasoning":
            block: dict[str, Any] = {"type": "thinking", "thinking": str(b.get("text", ""))}
            if signed and isinstance(b.get("signature"), str):
                block["signature"] = b["signature"]
            out.append(block)
        elif kind == "tool-call":
            try:
                arguments = json.loads(b.get("arguments") or "{}")
            except (ValueError, RecursionError, TypeError):
                arguments = {"_raw_arguments": b.get("arguments")}
            out.append({"type": "tool_use", "id": str(b.get("id")),
                        "name": str(b.get("name", "")),
                        "input": arguments if isinstance(arguments, dict)
                        else {"_value": arguments}})
        elif kind == "provider-raw" and isinstance(b.get("block"), Mapping) and (
                b.get("provider") == "anthropic") and signed:
            out.append(dict(b["block"]))
        elif _text(b):
            out.append({"type": "text", "text": _text(b)})
    return out


def _claude_usage(usage: Mapping[str, int]) -> dict[str, int]:
    out = {"input_tokens": usage.get("inputTokens", 0),
           "output_tokens": usage.get("outputTokens", 0)}
    if "cacheReadTokens" in usage:
        out["cache_read_input_tokens"] = usage["cacheReadTokens"]
    if "cacheWriteTokens" in usage:
        out["cache_creation_input_tokens"] = usage["cacheWriteTokens"]
    return out


_ABORT_TEXT: Final = "[Request interrupted by user]"
"""The user line Claude Code writes when the person stops a turn (its importer closes the turn
aborted on it)."""


class _Abort:
    """A turn the person stopped (``turn/end`` aborted): where an export writes the marker."""

    __slots__ = ("time",)

    def __init__(self, time: int) -> None:
        self.time = time


def _entries_and_aborts(events: Sequence[Mapping[str, Any]]) -> Iterator[Entry | _Abort]:
    """The history entries in log order, with an :class:`_Abort` after a turn ended aborted.

    Rule (docs/standards.md#handing-a-session-back): the message lines alone leave such a turn
    open when the file is imported again (its last line a tool result, say); the marker each
    agent writes for it closes it there as aborted. A turn that put no entry in the history
    (a continuation stopped before the model's first output) gets none: the marker follows an
    entry of the stopped turn itself, never the previous turn's last one.
    """
    aborts: list[tuple[int, int, int]] = []  # (turn/start seq, turn/end seq, time)
    start = -1
    for e in events:
        seq, data = e.get("seq"), e.get("data")
        if not isinstance(seq, int):
            continue
        if e.get("type") == "turn/start":
            start = seq
        elif e.get("type") == "turn/end":
            if isinstance(data, Mapping) and isinstance(data.get("reason"), Mapping) \
                    and data["reason"].get("kind") == "aborted":
                aborts.append((start, seq, int(e.get("time") or 0)))
            # the turn is over: a later turn/end with no turn/start of its own (a damaged log,
            # verify's TURN_MISMATCH) covers only the entries after this one, never this turn's
            start = seq + 1
    at = 0
    inside = False  # an entry of the turn aborts[at] ends was yielded
    for entry in history(events):
        while at < len(aborts) and aborts[at][1] < entry.seq:
            if inside:
                yield _Abort(aborts[at][2])
                inside = False
            at += 1
        yield entry
        if at < len(aborts) and aborts[at][0] <= entry.seq:
            inside = True
    if inside:
        yield _Abort(aborts[at][2])


def to_claude_code(log: LogLike, *, cwd: str | None = None,
                   agent_id: str | None = None) -> list[dict[str, Any]]:
    """The session as the lines of a Claude Code session file (module docstring).

    Args:
        log: ``header``, ``events``, ``children``.
        cwd: The project folder (default the header's ``cwd``, else ``/``).
        agent_id: Set for a subagent file: every line gets ``isSidechain: true`` and this
            ``agentId``; ``sessionId`` is then the parent's.

    Returns:
        JSON objects, one per line, in order. Their uuids are derived from the session id and
        the log, so exporting twice gives the same file.
    """
    sid = handoff_session_id(log)
    here = cwd or str(log.header.get("cwd") or "/")
    parent_sid = sid
    if agent_id is not None and isinstance(log.header.get("parentSession"), str):
        parent_sid = handoff_session_id(_Header(str(log.header["parentSession"])))
    lines: list[dict[str, Any]] = []
    previous: str | None = None

    def envelope(kind: str, key: object, entry: Entry | _Abort) -> dict[str, Any]:
        line: dict[str, Any] = {"parentUuid": previous, "isSidechain": agent_id is not None,
                                "userType": "external", "cwd": here, "sessionId": parent_sid,
                                "version": _VERSION, "type": kind,
                                "uuid": _uid(sid, key), "timestamp": iso_time(entry.time)}
        if agent_id is not None:
            line["agentId"] = agent_id
        return line

    interrupted = False  # the last line written is Claude Code's own interrupt line
    for entry in _entries_and_aborts(log.events):
        if isinstance(entry, _Abort):
            if not interrupted:
                line = envelope("user", f"{len(lines)}:aborted", entry)
                line["message"] = {"role": "user",
                                   "content": [{"type": "text", "text": _ABORT_TEXT}]}
                lines.append(line)
                previous = line["uuid"]
            interrupted = False
            continue
        message = entry.message
        role = message.get("role")
        interrupted = role == "user" and _joined(message.get("content") or []).startswith(
            _ABORT_TEXT[:-1])
        if entry.shadows is not None:
            boundary = envelope("system", f"{entry.seq}:boundary", entry)
            boundary.update({"parentUuid": None, "logicalParentUuid": previous,
                             "subtype": "compact_boundary", "content": "Conversation compacted",
                             "level": "info", "compactMetadata": {"trigger": "auto",
                                                                  "preTokens": 0}})
            lines.append(boundary)
            previous = boundary["uuid"]
            line = envelope("user", entry.seq, entry)
            line.update({"isCompactSummary": True, "isVisibleInTranscriptOnly": True,
                         "message": {"role": "user", "content": _compaction_text(entry)}})
        elif role == "assistant":
            line = envelope("assistant", entry.seq, entry)
            body: dict[str, Any] = {
                "id": str(message.get("id")), "type": "message", "role": "assistant",
                "model": str(_source(message).get("model") or "unknown"),
                "content": _claude_blocks(message),
                "stop_reason": "tool_use" if any(b["type"] == "tool_use" for b in
                                                 _claude_blocks(message)) else "end_turn",
                "stop_sequence": None, "usage": _claude_usage(usage_of(entry.event))}
            line.update({"message": body, "requestId": _uid(sid, entry.seq, "request")})
        elif (result := _tool_result(message)) is not None:
            line = envelope("user", entry.seq, entry)
            content = [{"type": "text", "text": _text(b)} for b in result.get("content") or []
                       if isinstance(b, Mapping) and (_text(b) or b.get("type") == "text")]
            block: dict[str, Any] = {"type": "tool_result",
                                     "tool_use_id": str(result.get("toolCallId")),
                                     "content": content, "is_error": bool(
                                         result.get("isError"))}
            line.update({"message": {"role": "user", "content": [block]},
                         "toolUseResult": _joined(result.get("content") or [])})
        else:
            line = envelope("user", entry.seq, entry)
            text = _joined(message.get("content") or [])
            if role == "system" or _source(message).get("kind") not in ("user", None):
                line["isMeta"] = True  # not typed by the person (instructions, injected text)
            line["message"] = {"role": "user", "content": text}
        lines.append(line)
        previous = line["uuid"]
    return lines


class _Header:
    """A log with only an id (to derive a parent's handoff id)."""

    def __init__(self, session_id: str) -> None:
        self.header = {"id": session_id}
        self.events: list[Mapping[str, Any]] = []
        self.children: list[LogLike] = []


def claude_code_files(log: LogLike, main: Path, *, cwd: str | None = None
                      ) -> dict[Path, list[dict[str, Any]]]:
    """The session file at ``main`` and its subagent files beside it, by path.

    Subagents (every descendant) go to ``<main without .jsonl>/subagents/agent-<id>.jsonl``,
    where Claude Code 2.1 keeps them and our importer finds them.
    """
    files = {main: to_claude_code(log, cwd=cwd)}
    folder = main.with_suffix("") / "subagents"
    stack = list(log.children)
    while stack:
        child = stack.pop(0)
        agent = handoff_session_id(child).replace("-", "")[:16]
        files[folder / f"agent-{agent}.jsonl"] = to_claude_code(child, cwd=cwd, agent_id=agent)
        stack.extend(child.children)
    return files


def claude_code_install_path(log: LogLike, home: Path, *, cwd: str | None = None) -> Path:
    """``<home>/.claude/projects/<slug of cwd>/<session uuid>.jsonl``."""
    here = cwd or str(log.header.get("cwd") or "/")
    return home / ".claude" / "projects" / claude_project_slug(here) / (
        f"{handoff_session_id(log)}.jsonl")


# --- Codex ------------------------------------------------------------------------------------


def _codex_items(entry: Entry) -> list[dict[str, Any]]:
    message = entry.message
    role = message.get("role")
    if role == "assistant":
        openai = _source(message).get("provider") == "openai"
        items: list[dict[str, Any]] = []
        text_parts: list[dict[str, Any]] = []

        def flush() -> None:
            if text_parts:
                items.append({"type": "message", "role": "assistant",
                              "content": list(text_parts)})
                text_parts.clear()

        for b in message.get("content") or []:
            if not isinstance(b, Mapping):
                continue
            if b.get("type") == "reasoning":
                flush()
                item: dict[str, Any] = {"type": "reasoning", "summary": [], "content": [
                    {"type": "reasoning_text", "text": str(b.get("text", ""))}]}
                if isinstance(b.get("summary"), list):
                    item["summary"] = [{"type": "summary_text", "text": str(t)}
                                       for t in b["summary"]]
                if openai and isinstance(b.get("encryptedContent"), str):
                    item["encrypted_content"] = b["encryptedContent"]
                items.append(item)
            elif b.get("type") == "tool-call":
                flush()
                items.append({"type": "function_call", "name": str(b.get("name", "")),
                              "arguments": str(b.get("arguments") or ""),
                              "call_id": str(b.get("id"))})
            elif _text(b):
                text_parts.append({"type": "output_text", "text": _text(b)})
        flush()
        return items
    result = _tool_result(message)
    if result is not None:
        return [{"type": "function_call_output", "call_id": str(result.get("toolCallId")),
                 "output": json.dumps({"output": _joined(result.get("content") or [])},
                                      ensure_ascii=False)}]
    text = _joined(message.get("content") or [])
    kind = _source(message).get("kind")
    role_out = "developer" if role == "system" else "user"
    if role_out == "user" and kind not in ("user", None) and not _is_placeholder(message):
        # injected context: Codex marks it by a tag at the start
        text = f"<environment_context>\n{text}\n</environment_context>"
    return [{"type": "message", "role": role_out,
             "content": [{"type": "input_text", "text": text}]}]


def to_codex(log: LogLike, *, cwd: str | None = None) -> list[dict[str, Any]]:
    """The session as the lines of a Codex rollout file (module docstring)."""
    sid = handoff_session_id(log)
    created = iso_time(int(log.header.get("createdAt") or 0))
    lines: list[dict[str, Any]] = [{"timestamp": created, "type": "session_meta", "payload": {
        "id": sid, "timestamp": created, "cwd": cwd or str(log.header.get("cwd") or "/"),
        "originator": "dsh", "cli_version": _VERSION, "instructions": None,
        "model_provider": "openai"}}]
    model: str | None = None
    for entry in _entries_and_aborts(log.events):
        stamp = iso_time(entry.time)
        if isinstance(entry, _Abort):
            lines.append({"timestamp": stamp, "type": "event_msg",
                          "payload": {"type": "turn_aborted", "reason": "interrupted"}})
            continue
        if entry.shadows is not None:
            lines.append({"timestamp": stamp, "type": "compacted",
                          "payload": {"message": _compaction_text(entry)}})
            continue
        source_model = _source(entry.message).get("model")
        if entry.message.get("role") == "assistant" and source_model and source_model != model:
            model = str(source_model)
            lines.append({"timestamp": stamp, "type": "turn_context", "payload": {
                "cwd": cwd or str(log.header.get("cwd") or "/"), "model": model,
                "approval_policy": "on-request", "sandbox_policy": {"mode": "read-only"},
                "summary": "auto"}})
        lines.extend({"timestamp": stamp, "type": "response_item", "payload": item}
                     for item in _codex_items(entry))
    return lines


def codex_install_path(log: LogLike, home: Path) -> Path:
    """``<home>/.codex/sessions/YYYY/MM/DD/rollout-YYYY-MM-DDThh-mm-ss-<uuid>.jsonl`` (UTC)."""
    when = _dt.datetime.fromtimestamp(int(log.header.get("createdAt") or 0) / 1000, tz=_dt.UTC)
    return (home / ".codex" / "sessions" / f"{when:%Y}" / f"{when:%m}" / f"{when:%d}"
            / f"rollout-{when:%Y-%m-%dT%H-%M-%S}-{handoff_session_id(log)}.jsonl")

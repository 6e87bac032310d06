"""OpenAI Codex CLI rollouts (``~/.codex/sessions/…/rollout-*.jsonl``) into dsh events.

``response_item`` lines are the model view (corpus README "OpenAI Codex CLI rollouts"):
consecutive model outputs (``reasoning``, assistant ``message``, ``function_call`` /
``custom_tool_call``) form one ``assistant/message``; ``function_call_output`` answers a call;
user/developer messages are inputs (``<environment_context>``-style injected context and
developer messages are kept with a ``{kind:"plugin", plugin:"codex"}`` source). ``event_msg``
copies are not replayed (they would double-count) but kept as ignorable events;
``event_msg`` ``turn_aborted`` closes the turn as aborted by the user. A top-level
``compacted`` line becomes a compaction whose replacing message holds the
``replacement_history`` message texts (or the summary ``message``). The legacy layout (bare
metadata line, bare items, ``{"record_type": "state"}``) is read the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from dsh.errors import ImportFormatError
from dsh.interop._common import (
    EventBuilder,
    ImportedSession,
    JsonObj,
    note_line,
    read_jsonl_records,
    stable_session_id,
    text_blocks,
)

__all__ = ["FORMAT", "import_codex", "looks_like_codex"]

FORMAT: Final = "codex"
_ENVELOPE_TYPES: Final = frozenset({"session_meta", "turn_context", "response_item", "event_msg",
                                    "compacted"})
_ITEM_TYPES: Final = frozenset({"message", "reasoning", "function_call", "function_call_output",
                                "custom_tool_call", "custom_tool_call_output", "ghost_snapshot",
                                "local_shell_call", "web_search_call"})
_INJECTED_PREFIXES: Final = ("<environment_context>", "<user_instructions>", "# AGENTS.md",
                             "<permissions instructions>", "<turn_aborted>")


def looks_like_codex(record: object) -> bool:
    """True for a Codex rollout line (envelope, legacy metadata, legacy item or state marker)."""
    if not isinstance(record, dict):
        return False
    if _kind_of(record) in _ENVELOPE_TYPES and "payload" in record:
        return True
    if record.get("record_type") == "state":
        return True
    return "id" in record and "timestamp" in record and "instructions" in record


def _kind_of(record: JsonObj) -> str | None:
    """A record's ``type`` when it is a string (damaged records may hold anything)."""
    kind = record.get("type")
    return kind if isinstance(kind, str) else None


def import_codex(path: Path) -> list[ImportedSession]:
    """Import one Codex rollout (envelope or legacy layout) as one dsh session.

    Raises:
        ImportFormatError: unreadable/empty/binary file, a torn or non-JSON line, a line that is
            not a Codex record, or a malformed response item.
    """
    records = read_jsonl_records(path, FORMAT)
    if not any(looks_like_codex(r) for _, r in records):
        raise ImportFormatError(
            f"codex rollout has no session_meta/response_item record (first line "
            f"{records[0][0]})", path=str(path), line=records[0][0], format=FORMAT)
    own_id: object = None
    cwd: object = None
    provider = "openai"
    for _, r in records:
        payload = r.get("payload") if isinstance(r, dict) else None
        if isinstance(r, dict) and r.get("type") == "session_meta" and isinstance(payload, dict):
            own_id, cwd = payload.get("id"), payload.get("cwd")
            provider = str(payload.get("model_provider") or provider)
            break
        if isinstance(r, dict) and "instructions" in r and "id" in r and "type" not in r:
            own_id = r.get("id")
            break
    session_id = stable_session_id(path, FORMAT, own_id)
    b = EventBuilder(FORMAT, session_id, path)
    b.model = (provider, "unknown")
    state = _State(b)
    for line, r in records:
        note_line(line)
        if not isinstance(r, dict):
            raise b.fail(f"codex line {line} must be a JSON object, found {type(r).__name__}",
                         line=line)
        if "timestamp" in r:
            b.at(r["timestamp"])
        kind = _kind_of(r)
        payload = r.get("payload")
        if kind in _ENVELOPE_TYPES and "payload" in r:
            if not isinstance(payload, dict):
                raise b.fail(f"codex {kind} payload at line {line} must be an object", line=line)
            if kind == "response_item":
                state.item(payload, line, r)
            elif kind == "compacted":
                state.compacted(payload, r)
            else:
                if kind == "turn_context" and isinstance(payload.get("model"), str):
                    b.model = (b.model[0], payload["model"])
                if kind == "event_msg" and payload.get("type") == "turn_aborted":
                    state.flush()
                    b.ignorable("event_msg", r)
                    b.abort_turn()
                    continue
                b.ignorable(str(kind), r)
        elif r.get("record_type") == "state":
            b.ignorable("state", r)
        elif kind in _ITEM_TYPES:
            state.item(r, line, r)
        elif "type" not in r and "id" in r and "timestamp" in r:
            b.ignorable("session_meta", r)
        else:
            b.ignorable("unknown", r)
    state.flush()
    b.finish()
    return [b.imported(b.header(cwd=cwd))]


class _State:
    """Buffers consecutive model outputs into one assistant message."""

    def __init__(self, builder: EventBuilder) -> None:
        self.b = builder
        self.blocks: list[JsonObj] = []

    def flush(self) -> None:
        if self.blocks:
            self.b.assistant(self.blocks)
            self.blocks = []

    def item(self, item: JsonObj, line: int, raw: JsonObj) -> None:
        b = self.b
        kind = item.get("type")
        if kind == "message":
            role = item.get("role")
            blocks = _content_blocks(item.get("content"))
            if role == "assistant":
                self.blocks.extend(blocks)
                return
            self.flush()
            text = "".join(x["text"] for x in blocks if x.get("type") == "text").lstrip()
            if role == "user" and not text.startswith(_INJECTED_PREFIXES):
                b.user(blocks, message_id=item.get("id"))
            else:
                source: JsonObj = {"kind": "plugin", "plugin": "codex"}
                if role != "user":
                    source["form"] = "instructions"
                b.user(blocks, message_id=item.get("id"), prompt=False, source=source)
        elif kind == "reasoning":
            raw_summary = item.get("summary")
            summary: list[Any] = raw_summary if isinstance(raw_summary, list) else []
            text = "\n\n".join(s.get("text", "") for s in summary
                               if isinstance(s, dict) and isinstance(s.get("text"), str))
            block: JsonObj = {"type": "reasoning", "text": text}
            if isinstance(item.get("encrypted_content"), str):
                block["encryptedContent"] = item["encrypted_content"]
            self.blocks.append(block)
        elif kind in ("function_call", "custom_tool_call"):
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise b.fail(f"codex {kind} at line {line} lacks a call_id", line=line)
            args = item.get("arguments", item.get("input", ""))
            self.blocks.append({"type": "tool-call", "id": call_id,
                                "name": str(item.get("name", "")),
                                "arguments": args if isinstance(args, str)
                                else json.dumps(args, ensure_ascii=False)})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            self.flush()
            call_id = str(item.get("call_id", ""))
            output = item.get("output")
            is_error = False
            if isinstance(output, dict):
                is_error = output.get("success") is False
                output = output.get("content", output)
            b.tool_result(call_id, text_blocks(output if output is not None else ""),
                          is_error=is_error)
        else:
            b.ignorable("response_item", raw)

    def compacted(self, payload: JsonObj, raw: JsonObj) -> None:
        self.flush()
        b = self.b
        b.ignorable("compacted", raw)
        message = payload.get("message")
        history = payload.get("replacement_history")
        replacement: list[JsonObj] = []
        if isinstance(history, list):
            for item in history:
                if isinstance(item, dict) and item.get("type") == "message":
                    replacement.extend(_content_blocks(item.get("content")))
        summary = [{"type": "text", "text": message}] if isinstance(message, str) and message \
            else None
        if not replacement:
            replacement = summary or [{"type": "text", "text": ""}]
        b.compaction(replacement, summary=summary,
                     extra={"rawOutput": history} if isinstance(history, list) else None)


def _content_blocks(content: Any) -> list[JsonObj]:
    """Responses API content parts (input_text/output_text/…) as dsh text blocks."""
    if isinstance(content, list):
        out: list[JsonObj] = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append({"type": "text", "text": part["text"]})
            else:
                out.append({"type": "provider-raw", "provider": "openai", "block": part})
        return out
    return text_blocks(content)

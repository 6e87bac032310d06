"""OpenAI Codex CLI rollouts (``~/.codex/sessions/…/rollout-*.jsonl``) into dsh events.

``response_item`` lines are the model view (corpus README "OpenAI Codex CLI rollouts"):
consecutive model outputs (``reasoning``, assistant ``message``, ``function_call`` /
``custom_tool_call``) form one ``assistant/message`` (reasoning kept whole:
:func:`reasoning_block`); ``function_call_output`` answers a call with the output's text
(:func:`tool_output`);
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from dsh._errors import ImportFormatError
from dsh.interop._common import (
    EventBuilder,
    ImportBatch,
    ImportedSession,
    JsonlSource,
    JsonObj,
    StreamedSession,
    collect,
    note_line,
    stable_session_id,
    text_blocks,
)

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
    return collect(stream_codex(path))


STREAM_BATCH_EVENTS: Final = 5_000
"""Events a streamed Codex session hands out at a time."""


def stream_codex(path: Path) -> Iterator[StreamedSession]:
    """Stream one Codex rollout: its one session, events a batch at a time.

    Two reads of the file (docs/interop.md#streaming-imports), neither holding its records: the
    first finds the session's identity and maps every line, keeping no event (so a line that
    cannot be mapped fails the file before anything is handed out, and the header, whose
    ``createdAt`` is the time of the first event, is known); the second maps the lines again,
    handing out :data:`STREAM_BATCH_EVENTS` events at a time.

    Raises:
        ImportFormatError: as :func:`import_codex`, when the session is asked for.
    """
    src = JsonlSource(path, FORMAT, live=True)
    first_line = 0
    codex = False
    own_id: object = None
    cwd: object = None
    provider = "openai"
    identified = False
    for _, line, _, r in src.records():
        first_line = first_line or line
        codex = codex or looks_like_codex(r)
        payload = r.get("payload") if isinstance(r, dict) else None
        if identified:
            continue
        if isinstance(r, dict) and r.get("type") == "session_meta" and isinstance(payload, dict):
            own_id, cwd = payload.get("id"), payload.get("cwd")
            provider = str(payload.get("model_provider") or provider)
            identified = True
        elif isinstance(r, dict) and "instructions" in r and "id" in r and "type" not in r:
            own_id = r.get("id")
            identified = True
    if not first_line:
        raise ImportFormatError("codex rollout has no record", path=str(path), format=FORMAT)
    if not codex:
        raise ImportFormatError(
            "codex rollout has no session_meta or response_item record (this is its first "
            "record); pass the --format the file is in", path=str(path), line=first_line,
            format=FORMAT)
    session_id = stable_session_id(path, FORMAT, own_id)

    def builder() -> EventBuilder:
        b = EventBuilder(FORMAT, session_id, path)
        b.model = (provider, "unknown")
        return b

    probe = builder()
    for _ in _map(probe, src):
        if len(probe.events) >= STREAM_BATCH_EVENTS:
            probe.drain()  # nothing is kept: the first read only checks and dates
    timed = probe.time_seen
    header = probe.header(cwd=cwd, stamp=False) if timed else {}
    del probe
    b = builder()
    if not timed:  # no time anywhere: stamped with the file's time up front, as a whole read
        header = b.header(cwd=cwd)

    def batches() -> Iterator[ImportBatch]:
        for offset in _map(b, src):
            if len(b.events) >= STREAM_BATCH_EVENTS:
                yield ImportBatch(*b.drain(), end=offset)
        if b.events:
            yield ImportBatch(*b.drain(), end=src.size)

    yield StreamedSession(session_id, header, batches(), FORMAT, str(path.resolve()), None,
                          src.torn_line)


def _map(b: EventBuilder, src: JsonlSource) -> Iterator[int]:
    """Map every record onto ``b``, yielding each one's byte offset after it (callers drain)."""
    state = _State(b)
    for _, line, offset, r in src.records():
        note_line(line)
        if not isinstance(r, dict):
            raise b.fail(f"codex record must be a JSON object, found {type(r).__name__}; fix or "
                         "delete that line", line=line)
        if "timestamp" in r:
            b.at(r["timestamp"])
        kind = _kind_of(r)
        payload = r.get("payload")
        if kind in _ENVELOPE_TYPES and "payload" in r:
            if not isinstance(payload, dict):
                raise b.fail(f"codex {kind} payload must be an object; fix or delete that line",
                             line=line)
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
                    yield offset
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
        yield offset
    state.flush()
    b.finish()


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
            self.blocks.append(reasoning_block(item))
        elif kind in ("function_call", "custom_tool_call"):
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise b.fail(f"codex {kind} lacks a call_id; fix or delete that line", line=line)
            args = item.get("arguments", item.get("input", ""))
            self.blocks.append({"type": "tool-call", "id": call_id,
                                "name": str(item.get("name", "")),
                                "arguments": args if isinstance(args, str)
                                else json.dumps(args, ensure_ascii=False)})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            self.flush()
            call_id = str(item.get("call_id", ""))
            content, is_error, meta = tool_output(item.get("output"))
            b.tool_result(call_id, content, is_error=is_error, meta=meta)
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


def _texts(parts: object) -> list[str]:
    return [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)] \
        if isinstance(parts, list) else []


def reasoning_block(item: JsonObj) -> JsonObj:
    """A Responses API ``reasoning`` item as one dsh ``reasoning`` block, nothing dropped.

    ``text`` is the full reasoning (``content`` texts joined by blank lines) when the item has
    it, else the ``summary`` texts; ``summary`` (the summary texts) is kept beside a full
    ``text``; ``encrypted_content`` → ``encryptedContent``; the item ``id`` → ``itemId`` (a
    replay of encrypted reasoning names it). Parts that are not text are kept raw under
    ``rawContent`` / ``rawSummary``.
    """
    summary, content = item.get("summary"), item.get("content")
    summary_texts, content_texts = _texts(summary), _texts(content)
    block: JsonObj = {"type": "reasoning",
                      "text": "\n\n".join(content_texts or summary_texts)}
    if content_texts and summary_texts:
        block["summary"] = summary_texts
    if isinstance(item.get("encrypted_content"), str):
        block["encryptedContent"] = item["encrypted_content"]
    if isinstance(item.get("id"), str):
        block["itemId"] = item["id"]
    for key, raw, texts in (("rawContent", content, content_texts),
                            ("rawSummary", summary, summary_texts)):
        if raw not in (None, []) and (not isinstance(raw, list) or len(texts) != len(raw)):
            block[key] = raw
    return block


def tool_output(output: object) -> tuple[list[JsonObj], bool, JsonObj | None]:
    """A ``function_call_output`` ``output`` as (result blocks, is_error, meta).

    Codex writes the output as JSON text: ``{"output": text, "metadata": {exit_code, …}}`` for
    shell calls, or a list of ``{"text": …}`` parts for MCP tools. The text becomes the result
    (what ``dsh show`` and the model see); the rest goes to ``meta.codex``. Other output is
    kept as it is; an object with ``success: false`` is an error.
    """
    if isinstance(output, dict):
        return (text_blocks(output.get("content", output)), output.get("success") is False,
                None)
    if isinstance(output, str) and output[:1] in ("{", "["):
        try:
            parsed = json.loads(output)
        except (ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("output"), str):
            rest = {k: v for k, v in parsed.items() if k != "output"}
            return text_blocks(parsed["output"]), False, {"codex": rest} if rest else None
        if isinstance(parsed, list) and parsed and all(
                isinstance(p, dict) and isinstance(p.get("text"), str) for p in parsed):
            extra = [{k: v for k, v in p.items() if k != "text"} for p in parsed]
            meta = {"codex": {"parts": extra}} if any(extra) else None
            return [{"type": "text", "text": p["text"]} for p in parsed], False, meta
    return text_blocks(output if output is not None else ""), False, None


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

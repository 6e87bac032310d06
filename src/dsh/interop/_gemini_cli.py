"""Gemini CLI chat recordings (``~/.gemini/tmp/<project hash>/chats/session-*.json``).

One JSON document ``{sessionId, projectHash, startTime, lastUpdated, messages, summary?}``;
each message is ``{id, timestamp, type, content, …}`` where ``content`` is text or a list of
Gemini parts (``{text}``, ``{functionCall}``, ``{inlineData}``, …).

Mapping: ``user`` → user prompt; ``gemini`` → one ``assistant/message`` (provider
``google``, the message's ``model``): each ``thoughts`` entry ``{subject, description}`` → a
``reasoning`` block (``text`` = description, ``subject`` kept), the content text, then each
``toolCalls`` entry → a ``tool-call`` (arguments = ``args`` as JSON text) answered right after
by a ``tool/result``: the text of its ``result`` parts (``functionResponse.response.output`` /
``error``, or ``resultDisplay``), ``isError`` for status ``error``; a ``cancelled`` call gets an
aborted result and ends the turn aborted by the user; a call without a result is left for the
step close (outcome unknown). ``tokens`` → usage
(``input``, ``output``, ``cached`` → cache reads, ``thoughts`` → reasoning tokens).
``info``/``error``/``warning`` messages (CLI notices, not sent to the model) are kept as
ignorable ``import/gemini-cli/<type>`` events, and the document's other keys as
``import/gemini-cli/session``; ``summary`` becomes ``session/title``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

from dsh._errors import ImportFormatError
from dsh.interop._common import (
    ABORTED_TEXT,
    EventBuilder,
    ImportedSession,
    JsonObj,
    json_text,
    read_json_document,
    stable_session_id,
    str_or_none,
    text_blocks,
    token_usage,
)

FORMAT: Final = "gemini-cli"
_NOTICE_TYPES: Final = ("info", "error", "warning")
_USAGE: Final = {"inputTokens": "input", "outputTokens": "output", "cacheReadTokens": "cached",
                 "reasoningTokens": "thoughts"}


def looks_like_gemini_cli(doc: object) -> bool:
    """True for a Gemini CLI recording: ``sessionId`` + ``messages`` typed user/gemini/…."""
    if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
        return False
    messages = doc["messages"]
    typed = all(isinstance(m, dict) and isinstance(m.get("type"), str) for m in messages)
    return typed and ("projectHash" in doc or "sessionId" in doc) and (
        not messages or any(m.get("type") in ("user", "gemini") for m in messages))


def _parts_text(parts: object) -> str:
    """The text of Gemini parts; non-text parts as compact JSON so nothing is hidden."""
    if isinstance(parts, str):
        return parts
    if isinstance(parts, dict):
        parts = [parts]
    if not isinstance(parts, list):
        return "" if parts is None else json_text(parts)
    out: list[str] = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part, dict) and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif isinstance(part, dict) and isinstance(part.get("functionResponse"), dict):
            response = part["functionResponse"].get("response")
            if isinstance(response, dict) and isinstance(response.get("output"), str):
                out.append(response["output"])
            elif isinstance(response, dict) and isinstance(response.get("error"), str):
                out.append(response["error"])
            else:
                out.append(json_text(response))
        else:
            out.append(json_text(part))
    return "\n".join(out)


def _content_blocks(content: object) -> list[JsonObj]:
    text = _parts_text(content)
    return text_blocks(text) if text else []


def import_gemini_cli(path: Path) -> list[ImportedSession]:
    """Import one Gemini CLI chat recording as one dsh session.

    Raises:
        ImportFormatError: unreadable/empty/binary/non-JSON file, a document that is not a
            recording (no ``messages`` list), or a message that is not an object with a string
            ``type``.
    """
    doc = read_json_document(path, FORMAT)
    if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
        raise ImportFormatError(
            "gemini-cli recording must be an object with a messages list, found "
            f"{type(doc).__name__}; pass the --format the file is in", path=str(path), line=1,
            format=FORMAT)
    b = EventBuilder(FORMAT, stable_session_id(path, FORMAT, doc.get("sessionId")), path)
    b.model = ("google", "unknown")
    b.at(doc.get("startTime"))
    b.ignorable("session", {k: v for k, v in doc.items() if k != "messages"})
    for index, m in enumerate(doc["messages"]):
        if not isinstance(m, dict) or not isinstance(m.get("type"), str):
            raise ImportFormatError(
                f"gemini-cli message {index} must be an object with a string type; fix that "
                "message",
                path=str(path), line=1, format=FORMAT, json_path=f"$.messages[{index}]")
        b.at(m.get("timestamp"))
        kind = m["type"]
        if kind == "user":
            b.user(_content_blocks(m.get("content")), message_id=str_or_none(m.get("id")))
        elif kind == "gemini":
            _gemini(b, m)
        else:
            b.ignorable(kind if kind in _NOTICE_TYPES else "unknown", m)
    if isinstance(doc.get("summary"), str) and doc["summary"].strip():
        b.emit("session/title", {"title": doc["summary"]})
    b.finish()
    return [b.imported(b.header())]


def _gemini(b: EventBuilder, m: JsonObj) -> None:
    """One model response: reasoning, text and tool calls, then the calls' results."""
    blocks: list[JsonObj] = []
    thoughts = m.get("thoughts")
    for thought in thoughts if isinstance(thoughts, list) else []:
        if isinstance(thought, dict):
            block: JsonObj = {"type": "reasoning",
                              "text": str(thought.get("description") or "")}
            if isinstance(thought.get("subject"), str):
                block["subject"] = thought["subject"]
            blocks.append(block)
    blocks.extend(_content_blocks(m.get("content")))
    calls = [c for c in m.get("toolCalls") or [] if isinstance(c, dict)] \
        if isinstance(m.get("toolCalls"), list) else []
    first = len(blocks)
    for c in calls:
        args = c.get("args")
        blocks.append({"type": "tool-call", "id": str_or_none(c.get("id")) or "",
                       "name": str(c.get("name") or ""),
                       "arguments": args if isinstance(args, str)
                       else json.dumps(args if args is not None else {}, ensure_ascii=False)})
    model = m.get("model") if isinstance(m.get("model"), str) else None
    b.assistant(blocks, provider="google", model=model, message_id=str_or_none(m.get("id")),
                usage=token_usage(m.get("tokens"), _USAGE))
    cancelled = False
    for offset, c in enumerate(calls):
        call_id = str(blocks[first + offset]["id"])  # the builder fills a missing id in
        result, status = c.get("result"), c.get("status")
        if status == "cancelled" and result is None:
            cancelled = True
            b.tool_result(call_id, [{"type": "text", "text": ABORTED_TEXT}], is_error=True,
                          error={"name": "AbortError", "code": "ABORTED"})
            continue
        if result is None and not isinstance(c.get("resultDisplay"), str):
            continue  # no result recorded: the step close answers it (outcome unknown)
        text = _parts_text(result) if result is not None else str(c["resultDisplay"])
        meta = {k: v for k, v in c.items() if k not in ("id", "name", "args", "result")}
        b.tool_result(call_id, text_blocks(text), is_error=status in ("error", "cancelled"),
                      meta={"geminiCli": meta} if meta else None)
    if cancelled:
        b.abort_turn()  # the user cancelled the running tools, so the turn ended there

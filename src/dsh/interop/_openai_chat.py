"""OpenAI Chat Completions conversations into dsh events.

Accepted documents (corpus README "OpenAI Chat Completions with tools"):

* a bare list of messages (``role`` system/developer/user/assistant/tool);
* a request body ``{"messages": [...], "model"?, "tools"?, ...}``;
* a completion log ``{"messages": [...], "response": {"choices": [{"message": …}]}, ...}`` —
  the response message is appended after the request messages.

Mapping: leading system/developer messages → ``system/message``; later ones → ``user/message``
with source ``{kind:"plugin", plugin:"openai-chat", form:"instructions"}``; user → user
message; assistant → one ``assistant/message`` (``reasoning_content`` → reasoning block, text,
then ``tool_calls`` → tool-call blocks); tool → ``tool/result`` answering ``tool_call_id``
(OpenAI has no error flag, so ``isError`` is false). Tool calls emulated in text (the
non-function-calling ``<function=…>`` form) are left as text. Everything besides the messages
(tools, kwargs, usage, cost) is kept as an ignorable ``import/openai-chat/request`` event.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from dsh._errors import ImportFormatError
from dsh.interop._common import (
    EventBuilder,
    ImportedSession,
    JsonObj,
    read_json_document,
    stable_session_id,
)

FORMAT: Final = "openai-chat"
_ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def openai_content_blocks(content: Any) -> list[JsonObj]:
    """Chat content (string or parts) as dsh blocks: text parts → text, others kept raw."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, list):
        out: list[JsonObj] = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in (None, "text") and isinstance(
                    part.get("text"), str):
                out.append({"type": "text", "text": part["text"]})
            elif isinstance(part, str):
                out.append({"type": "text", "text": part})
            else:
                out.append({"type": "provider-raw", "provider": "openai", "block": part})
        return out
    return [{"type": "text", "text": json.dumps(content, ensure_ascii=False)}]


def map_openai_messages(b: EventBuilder, messages: list[Any], *, fmt: str = FORMAT,
                        what: str = "message", line: int | None = None,
                        single_turn: bool = False) -> None:
    """Drive ``b`` with a Chat Completions message list (see module docstring).

    Also accepts SWE-agent's variant (``tool_call_ids`` list on tool messages, ``thought`` on
    assistant messages is ignored because it duplicates ``content``). With ``single_turn``
    (agent trajectories) the first non-demo user message is the one prompt and every later
    user message (observations of text-mode agents) continues the same turn.

    Raises:
        ImportFormatError: a message that is not an object or has an unknown role.
    """
    head = True
    prompted = False
    for index, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or (
                m["role"] not in _ROLES):
            found = m.get("role") if isinstance(m, dict) else type(m).__name__
            raise ImportFormatError(
                f"{fmt} {what} {index} must be an object with role system/user/assistant/tool, "
                f"found {found!r}; fix that message", path=str(b.path), line=line, format=fmt,
                json_path=f"$[{index}]")
        role = m["role"]
        content = openai_content_blocks(m.get("content"))
        if role in ("system", "developer"):
            if head:
                b.system(content)
            else:
                b.user(content, prompt=False, source={"kind": "plugin", "plugin": fmt,
                                                      "form": "instructions"})
            continue
        head = False
        if role == "user":
            demo = bool(m.get("is_demo", False))
            if single_turn:
                first = not demo and not prompted
                prompted = prompted or first
                b.user(content, prompt=first, continues=not first,
                       source=None if first else {"kind": "plugin", "plugin": fmt})
            else:
                b.user(content, prompt=not demo)
        elif role == "assistant":
            blocks: list[JsonObj] = []
            reasoning = m.get("reasoning_content")
            if isinstance(reasoning, str) and reasoning:
                blocks.append({"type": "reasoning", "text": reasoning})
            blocks.extend(content)
            calls = m.get("tool_calls")
            if calls is not None and not isinstance(calls, list):
                raise ImportFormatError(
                    f"{fmt} {what} {index} has tool_calls that is not a list (found "
                    f"{type(calls).__name__}); fix that message", path=str(b.path), line=line,
                    format=fmt, json_path=f"$[{index}].tool_calls")
            for call in calls or []:
                if not isinstance(call, dict):
                    continue
                raw_fn = call.get("function")
                fn: JsonObj = raw_fn if isinstance(raw_fn, dict) else {}
                args = fn.get("arguments", "")
                blocks.append({"type": "tool-call", "id": str(call.get("id") or ""),
                               "name": str(fn.get("name", "")),
                               "arguments": args if isinstance(args, str)
                               else json.dumps(args, ensure_ascii=False)})
            b.assistant(blocks)
        else:
            ids = m.get("tool_call_ids")
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) and isinstance(ids, list) and ids:
                call_id = ids[0]
            b.tool_result(str(call_id or m.get("name") or ""), content)


def import_openai_chat(path: Path) -> list[ImportedSession]:
    """Import a Chat Completions message list, request body or completion log.

    Raises:
        ImportFormatError: unreadable/empty/binary/non-JSON file, a document that is neither a
            message list nor an object with ``messages``, or a malformed message.
    """
    doc = read_json_document(path, FORMAT)
    b = EventBuilder(FORMAT, stable_session_id(path, FORMAT), path)
    b.model = ("openai", "unknown")
    if isinstance(doc, list):
        messages = doc
    elif isinstance(doc, dict) and isinstance(doc.get("messages"), list):
        messages = list(doc["messages"])
        if isinstance(doc.get("model"), str):
            b.model = ("openai", doc["model"])
        b.at(doc.get("timestamp"))
        response = doc.get("response")
        if isinstance(response, dict):
            if isinstance(response.get("model"), str):
                b.model = ("openai", response["model"])
            choices = response.get("choices")
            if isinstance(choices, list) and choices and isinstance(choices[0], dict) and \
                    isinstance(choices[0].get("message"), dict):
                messages.append(choices[0]["message"])
        b.ignorable("request", {k: v for k, v in doc.items() if k != "messages"})
    else:
        raise ImportFormatError(
            "openai-chat document must be a message list or an object with a messages list, "
            f"found {type(doc).__name__}; pass the --format the file is in", path=str(path), line=1,
            format=FORMAT)
    map_openai_messages(b, messages, line=1)
    b.finish()
    return [b.imported(b.header())]

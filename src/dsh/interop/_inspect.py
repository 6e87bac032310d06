"""A session as an Inspect AI eval log: one sample, its messages, model and tool events.

:func:`to_inspect_log` writes the JSON eval log layout that ``inspect_ai.log.read_eval_log``
reads (``version`` 2), without importing Inspect (Rule: docs/standards.md#inspect-ai):

* ``eval``: task ``dsh/session``, ``task_id`` = the session id, the model of the last answer,
  the dataset ``{name: "dsh", samples: <1 + subagents>}``;
* one sample per session (the session first, then its subagent sessions), ``id`` = the
  session id: ``messages`` are the session's model view (one Inspect message per dsh message;
  tool results are ``tool`` messages with ``tool_call_id`` and ``function``), ``input`` the
  messages before the first answer, ``output`` the last answer, ``model_usage`` the summed usage;
* ``events``: a ``model`` event per answer in the history (input = the view the model was
  given, output with usage and stop reason) and a ``tool`` event per tool call with its result.

Reasoning becomes ``reasoning`` content (signature kept); images a text placeholder naming the
attachment (the log holds a reference, not the bytes). A call's arguments holding a number no
JSON reader keeps exactly (beyond ±(2^53-1), ``NaN``, ``Infinity``) carry it as its decimal
text; the exact arguments ride in the assistant message's ``metadata.dsh.arguments_text``
(by call id).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from dsh.interop._history import Entry, LogLike, history, iso_time, safe_numbers, usage_of

_STOP: Final = {"tool-calls": "tool_calls", "max-tokens": "max_tokens", "stop": "stop"}
_TOOL_ERRORS: Final = {"TOOL_TIMEOUT": "timeout", "NOT_APPROVED": "approval",
                       "NOT_FOUND": "file_not_found", "OUTSIDE_ROOT": "permission",
                       "ABORTED": "cancelled", "ABORTED_BEFORE_DISPATCH": "cancelled",
                       "INVALID_ARGUMENTS": "parsing"}


def _text(blocks: Sequence[Any]) -> str:
    parts = []
    for b in blocks:
        if not isinstance(b, Mapping):
            continue
        if b.get("type") == "text":
            parts.append(str(b.get("text", "")))
        elif b.get("type") == "image":
            att = b.get("attachment")
            name = (att.get("name") or att.get("attachmentId")) if isinstance(att, Mapping) \
                else None
            parts.append(f"[image {name}]" if name else "[image]")
        elif b.get("type") == "tool-result":
            parts.append(_text(b.get("content") or []))
    return "\n".join(p for p in parts if p)


def _arguments(text: object) -> tuple[dict[str, Any], str | None]:
    """A call's JSON-text arguments as Inspect's ``arguments`` object, and its exact text.

    The text is None when the object gives it back.

    Inspect's ``ToolCall.arguments`` is a JSON object: text that is no JSON object rides in it
    (``_raw_arguments``, ``_value``); a number no JSON reader keeps exactly (an integer beyond
    ±(2^53-1), ``NaN``, ``Infinity``) is written as its decimal text, and the exact text is
    returned beside it (Rule: docs/standards.md#inspect-ai).
    """
    try:
        value = json.loads(text) if isinstance(text, str) and text else {}
        found = value if isinstance(value, dict) else {"_value": value}
        safe = safe_numbers(found)
    except (ValueError, RecursionError):  # (nested deeper than the parse or the number walk)
        return {"_raw_arguments": text}, None
    return safe, None if safe is found else str(text)


class _Names:
    """Tool names by call id (a ``tool`` message names its function)."""

    def __init__(self) -> None:
        self.by_call: dict[str, str] = {}


def _message(message: Mapping[str, Any], names: _Names) -> dict[str, Any]:
    role = message.get("role")
    blocks = [b for b in message.get("content") or [] if isinstance(b, Mapping)]
    out: dict[str, Any] = {"id": str(message.get("id"))}
    if role == "assistant":
        content: list[dict[str, Any]] = []
        calls = []
        texts: dict[str, str] = {}  # call id -> exact arguments text
        for b in blocks:
            if b.get("type") == "reasoning":
                part: dict[str, Any] = {"type": "reasoning", "reasoning": str(b.get("text", ""))}
                if isinstance(b.get("signature"), str):
                    part["signature"] = b["signature"]
                content.append(part)
            elif b.get("type") == "tool-call":
                names.by_call[str(b.get("id"))] = str(b.get("name", ""))
                arguments, exact = _arguments(b.get("arguments"))
                calls.append({"id": str(b.get("id")), "function": str(b.get("name", "")),
                              "arguments": arguments, "type": "function"})
                if exact is not None:
                    texts[str(b.get("id"))] = exact
            elif b.get("type") in ("text", "image"):
                content.append({"type": "text", "text": _text([b])})
        source = message.get("source") if isinstance(message.get("source"), Mapping) else {}
        out.update({"role": "assistant", "content": content, "source": "generate"})
        if calls:
            out["tool_calls"] = calls
        if isinstance(source, Mapping) and source.get("model"):
            out["model"] = str(source["model"])
        if texts:
            out["metadata"] = {"dsh": {"arguments_text": texts}}
        return out
    result = next((b for b in blocks if b.get("type") == "tool-result"), None)
    if result is not None:
        call_id = str(result.get("toolCallId"))
        out.update({"role": "tool", "content": _text(result.get("content") or []),
                    "tool_call_id": call_id, "function": names.by_call.get(call_id, "")})
        if result.get("isError"):
            out["error"] = {"type": "unknown", "message": out["content"]}
        return out
    out.update({"role": "system" if role == "system" else "user", "content": _text(blocks),
                "source": "input"})
    return out


def _usage(usage: Mapping[str, int]) -> dict[str, int]:
    read, write = usage.get("cacheReadTokens", 0), usage.get("cacheWriteTokens", 0)
    inp, outp = usage.get("inputTokens", 0), usage.get("outputTokens", 0)
    out = {"input_tokens": inp, "output_tokens": outp, "total_tokens": inp + outp + read + write}
    if "cacheReadTokens" in usage:
        out["input_tokens_cache_read"] = read
    if "cacheWriteTokens" in usage:
        out["input_tokens_cache_write"] = write
    if "reasoningTokens" in usage:
        out["reasoning_tokens"] = usage["reasoningTokens"]
    return out


def _add(total: dict[str, int], usage: Mapping[str, int]) -> None:
    for key, value in usage.items():
        total[key] = total.get(key, 0) + value


def _stop_reason(entry: Entry) -> str:
    data = entry.event.get("data")
    if isinstance(data, Mapping) and data.get("interrupted"):
        return "unknown"
    calls = any(isinstance(b, Mapping) and b.get("type") == "tool-call"
                for b in entry.message.get("content") or [])
    return "tool_calls" if calls else "stop"


def _sample(log: LogLike) -> tuple[dict[str, Any], str | None, dict[str, dict[str, int]]]:
    names = _Names()
    view: list[tuple[str, dict[str, Any]]] = []  # (dsh id, inspect message)
    events: list[dict[str, Any]] = []
    pending: dict[str, dict[str, Any]] = {}
    model: str | None = None
    output: dict[str, Any] | None = None
    usage_by_model: dict[str, dict[str, int]] = {}
    first_answer: int | None = None
    for entry in history(log.events):
        converted = _message(entry.message, names)
        stamp = iso_time(entry.time)
        if converted["role"] == "assistant":
            model = str(converted.get("model") or model or "unknown")
            usage = usage_of(entry.event)
            choice = {"message": converted, "stop_reason": _stop_reason(entry)}
            out: dict[str, Any] = {"model": model, "choices": [choice]}
            if usage:
                out["usage"] = _usage(usage)
                _add(usage_by_model.setdefault(model, {}), out["usage"])
            events.append({"event": "model", "timestamp": stamp, "model": model,
                           "input": [m for _, m in view], "tools": [], "tool_choice": "auto",
                           "config": {}, "output": out})
            output = out
            if first_answer is None:
                first_answer = len(view)
            for call in converted.get("tool_calls") or []:
                tool = {"event": "tool", "timestamp": stamp, "id": call["id"],
                        "function": call["function"], "arguments": call["arguments"],
                        "type": "function"}
                pending[call["id"]] = tool
                events.append(tool)
        elif converted["role"] == "tool" and converted["tool_call_id"] in pending:
            tool = pending.pop(converted["tool_call_id"])
            tool["result"] = converted["content"]
            if "error" in converted:
                code = _error_code(entry.event)
                converted["error"]["type"] = _TOOL_ERRORS.get(code or "", "unknown")
                tool["error"] = converted["error"]
        if entry.shadows is not None:
            ids = [i for i, _ in view]
            first, last = ids.index(entry.shadows[0]), ids.index(entry.shadows[1])
            view[first:last + 1] = [(str(entry.message.get("id")), converted)]
        else:
            view.append((str(entry.message.get("id")), converted))
    messages = [m for _, m in view]
    session_id = str(log.header.get("id", ""))
    sample: dict[str, Any] = {
        "id": session_id, "epoch": 1,
        "input": messages[:first_answer] if first_answer else messages[:1] or "",
        "target": "", "messages": messages, "events": events,
        "output": output or {"model": model or "unknown", "choices": []},
        "model_usage": usage_by_model,
        "metadata": {"dsh": {"sessionId": session_id,
                             "parentSession": log.header.get("parentSession")}}}
    return sample, model, usage_by_model


def _error_code(event: Mapping[str, Any]) -> str | None:
    data = event.get("data")
    error = data.get("error") if isinstance(data, Mapping) else None
    return str(error.get("code")) if isinstance(error, Mapping) and error.get("code") else None


def _walk(log: LogLike) -> list[LogLike]:
    return [log, *(x for child in log.children for x in _walk(child))]


def to_inspect_log(log: LogLike) -> dict[str, Any]:
    """Export a session (and its subagent sessions) as one Inspect AI eval log.

    Args:
        log: ``header``, ``events``, ``children`` (an ImportedSession or a SessionLog).

    Returns:
        The eval log as plain JSON (module docstring); write it to a ``.json`` file for
        ``inspect_ai.log.read_eval_log`` / ``inspect view``.
    """
    samples = []
    model: str | None = None
    usage: dict[str, dict[str, int]] = {}
    for session in _walk(log):
        sample, last, used = _sample(session)
        samples.append(sample)
        model = model or last
        for name, counts in used.items():
            _add(usage.setdefault(name, {}), counts)
    events = [e for s in _walk(log) for e in s.events]
    times = [int(e.get("time") or 0) for e in events] or [int(log.header.get("createdAt") or 0)]
    session_id = str(log.header.get("id", ""))
    return {
        "version": 2, "status": "success",
        "eval": {"task": "dsh/session", "task_id": session_id, "task_version": 0,
                 "run_id": session_id, "created": iso_time(min(times)),
                 "dataset": {"name": "dsh", "samples": len(samples),
                             "sample_ids": [s["id"] for s in samples]},
                 "model": model or "unknown", "config": {},
                 "metadata": {"dsh": {"sessionId": session_id}}},
        "plan": {"name": "dsh", "steps": []},
        "stats": {"started_at": iso_time(min(times)), "completed_at": iso_time(max(times)),
                  "model_usage": usage},
        "samples": samples,
    }

"""OpenHands V0 event trajectories into dsh events.

Accepted documents (corpus README "OpenHands"): a JSON list of V0 events, a JSON object or
JSONL line holding such a list under ``history`` (evaluation output, one session per line).

Mapping: a ``system`` action → ``system/message``; a user ``message`` action → user prompt;
agent actions carrying ``tool_call_metadata`` are grouped by their LiteLLM ``model_response.id``
into one ``assistant/message`` (response text, then every ``tool_calls`` entry of that response
as a ``tool-call`` block); an observation with ``tool_call_metadata`` → ``tool/result`` for its
``tool_call_id`` (``error`` observations and run exit codes ≠ 0 are ``isError``; exit code -1
means the command was still running). An agent ``message`` action → assistant text. ``finish``
has no observation in V0, so its call is answered with a synthetic result holding the final
message (``meta.import.synthetic``) and the turn ends completed. An ``error`` observation
without a tool call is relayed to the model as a user message. ``agent_state_changed`` to
``awaiting_user_input``/``finished`` ends the turn completed, ``paused``/``stopped`` aborted by
the user, ``error`` as an error. Everything else (recall, state changes, null observations)
is kept as ignorable ``import/openhands/<action|observation>`` events.
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
    note_line,
    read_json_document,
    read_jsonl_records,
    stable_session_id,
    text_blocks,
)

FORMAT: Final = "openhands"


def looks_like_openhands_events(value: object) -> bool:
    """True for a non-empty list of V0 events (``id`` plus ``action`` or ``observation``)."""
    return (isinstance(value, list) and bool(value) and all(isinstance(e, dict) for e in value)
            and all("id" in e and ("action" in e or "observation" in e) for e in value))


def import_openhands(path: Path) -> list[ImportedSession]:
    """Import an OpenHands V0 trajectory or evaluation output.

    Raises:
        ImportFormatError: unreadable/empty/binary/non-JSON input or no V0 event list.
    """
    if path.suffix.lower() == ".jsonl":
        out = []
        for line, rec in read_jsonl_records(path, FORMAT):
            note_line(line)
            if not isinstance(rec, dict) or not looks_like_openhands_events(rec.get("history")):
                raise ImportFormatError(
                    "openhands output record must be an object with a history event list; fix "
                    "or delete that line",
                    path=str(path), line=line, format=FORMAT)
            key = rec.get("instance_id")
            sid = stable_session_id(path, f"{FORMAT}:{line}:{key}")
            out.append(build_v0_session(path, sid, rec["history"], rec, line))
        return out
    doc = read_json_document(path, FORMAT)
    if isinstance(doc, dict) and looks_like_openhands_events(doc.get("history")):
        return [build_v0_session(path, stable_session_id(path, FORMAT), doc["history"], doc, 1)]
    if looks_like_openhands_events(doc):
        return [build_v0_session(path, stable_session_id(path, FORMAT), doc, None, 1)]
    raise ImportFormatError(
        "openhands document must be a list of V0 events (id + action/observation) or an "
        "object with such a history; pass the --format the file is in", path=str(path),
        line=1, format=FORMAT)


def _response_of(event: JsonObj) -> JsonObj | None:
    meta = event.get("tool_call_metadata")
    if not isinstance(meta, dict):
        return None
    response = meta.get("model_response")
    return response if isinstance(response, dict) else None


def build_v0_session(path: Path, session_id: str, events: list[Any], wrapper: JsonObj | None,
                     line: int, *, fmt: str = FORMAT) -> ImportedSession:
    """Map one V0 event list (module docstring) to a session.

    Args:
        path: The source file (for ``import/source`` and errors).
        session_id: The session id.
        events: V0 event objects in order (``id``, ``source``, ``action``/``observation``).
        wrapper: The record holding the list (kept minus ``history`` as ``…/output``), or None.
        line: Source line of the record (1 for a JSON document).
        fmt: Format name written into ``import/source`` and the ignorable event types.
    """
    note_line(line)
    b = EventBuilder(fmt, session_id, path)
    b.model = ("openhands", "unknown")
    if wrapper is not None:
        b.at(next((e.get("timestamp") for e in events if e.get("timestamp")), None))
        b.ignorable("output", {k: v for k, v in wrapper.items() if k != "history"})
    done_responses: set[str] = set()
    for event in events:
        b.at(event.get("timestamp"))
        action = event.get("action")
        observation = event.get("observation")
        source = event.get("source")
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        meta = event.get("tool_call_metadata")
        if action == "system" and isinstance(args.get("content"), str):
            b.ignorable("action", event)
            b.system([{"type": "text", "text": args["content"]}])
        elif action == "message" and source == "user":
            b.ignorable("action", event)
            b.user(text_blocks(args.get("content", event.get("message", ""))))
        elif action is not None and isinstance(meta, dict):
            b.ignorable("action", event)
            response = _response_of(event)
            rid = str(response.get("id")) if response and response.get("id") else None
            if rid is None or rid not in done_responses:
                if rid is not None:
                    done_responses.add(rid)
                model = response.get("model") if response else None
                b.assistant(_assistant_blocks(event, response),
                            provider="openhands", model=model if isinstance(model, str) else None,
                            message_id=rid)
            if action == "finish":
                call_id = str(meta.get("tool_call_id", ""))
                final = args.get("final_thought") or args.get("message") or event.get("message")
                b.tool_result(call_id, text_blocks(final or ""),
                              meta={"import": {"synthetic": True}})
                b.end_turn({"kind": "completed"})
        elif action == "message" and source == "agent":
            b.ignorable("action", event)
            b.assistant(text_blocks(args.get("content", event.get("message", ""))))
        elif observation is not None and isinstance(meta, dict):
            b.ignorable("observation", {k: v for k, v in event.items() if k != "content"})
            call_id = str(meta.get("tool_call_id", ""))
            extras = event.get("extras") if isinstance(event.get("extras"), dict) else {}
            exit_code = (extras.get("metadata") or {}).get("exit_code") if isinstance(
                extras.get("metadata"), dict) else None
            is_error = observation == "error" or (isinstance(exit_code, int) and exit_code > 0)
            b.tool_result(call_id, text_blocks(event.get("content", "")), is_error=is_error)
        elif observation == "error":
            b.ignorable("observation", event)
            b.user(text_blocks(event.get("content", "")), prompt=False,
                   source={"kind": "plugin", "plugin": "openhands", "form": "relay"})
        elif observation == "agent_state_changed":
            b.ignorable("observation", event)
            state = (event.get("extras") or {}).get("agent_state") if isinstance(
                event.get("extras"), dict) else None
            if state in ("awaiting_user_input", "finished") and b.turn_finished():
                b.end_turn({"kind": "completed"})
            elif state in ("paused", "stopped"):
                b.abort_turn()
            elif state == "error":
                b.end_turn({"kind": "error", "error": {
                    "message": str(event.get("message") or "agent error"), "code": "UNKNOWN"}})
        else:
            b.ignorable("action" if action is not None else "observation", event)
    b.finish()
    return b.imported(b.header())


def _assistant_blocks(event: JsonObj, response: JsonObj | None) -> list[JsonObj]:
    """The model response behind an action: its text, then all its tool calls."""
    message: JsonObj = {}
    if response is not None:
        choices = response.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict) and \
                isinstance(choices[0].get("message"), dict):
            message = choices[0]["message"]
    blocks: list[JsonObj] = []
    content = message.get("content")
    if isinstance(content, str) and content:
        blocks.append({"type": "text", "text": content})
    elif isinstance(content, list):
        blocks.extend({"type": "text", "text": p["text"]} for p in content
                      if isinstance(p, dict) and isinstance(p.get("text"), str))
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict):
                continue
            args = fn.get("arguments", "")
            blocks.append({"type": "tool-call", "id": str(call.get("id", "")),
                           "name": str(fn.get("name", "")),
                           "arguments": args if isinstance(args, str)
                           else json.dumps(args, ensure_ascii=False)})
        return blocks
    # No raw response: rebuild the one call from the action itself.
    raw_meta = event.get("tool_call_metadata")
    meta: JsonObj = raw_meta if isinstance(raw_meta, dict) else {}
    raw_args = event.get("args")
    thought = raw_args.get("thought") if isinstance(raw_args, dict) else None
    if not blocks and isinstance(thought, str) and thought:
        blocks.append({"type": "text", "text": thought})
    blocks.append({"type": "tool-call", "id": str(meta.get("tool_call_id", "")),
                   "name": str(meta.get("function_name", "")),
                   "arguments": json.dumps(event.get("args") or {}, ensure_ascii=False)})
    return blocks

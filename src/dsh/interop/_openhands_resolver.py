"""OpenHands resolver output (``output/output.jsonl`` of the GitHub issue resolver).

Each JSONL line (or a single JSON document) is one ``ResolverOutput``: ``{issue, issue_type,
instruction, base_commit, git_patch, history, metrics, success, comment_success,
result_explanation | success_explanation, error}`` — one session per record.

``history`` comes in three layouts, all read:

* V0 events with ``id`` and ``source`` (mapped exactly like :mod:`dsh.interop._openhands`);
* the older layout of the same events without ``id``/``source``: the first ``message`` action
  is the user's instruction, later ones are the agent's; an action other than ``message``
  (``run``, ``edit``, ``browse``, ``finish``, …) without ``tool_call_metadata`` is the agent's
  call of a tool named after the action (``call-<index>``), answered by the next observation;
* ``[action, observation]`` pairs (older evaluation output), flattened in order.

The record minus ``history`` (issue, patch, metrics, outcome) is kept as an ignorable
``import/openhands-resolver/output`` event (``success`` and ``error`` are kept there, not
judged); turns end as in :mod:`dsh.interop._openhands`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from dsh._errors import ImportFormatError
from dsh.interop._common import (
    ImportedSession,
    JsonObj,
    note_line,
    read_json_document,
    read_jsonl_records,
    stable_session_id,
)
from dsh.interop._openhands import build_v0_session

FORMAT: Final = "openhands-resolver"
_RESOLVER_KEYS: Final = frozenset({"git_patch", "base_commit", "issue", "instruction",
                                   "issue_type", "comment_success"})
_NOT_CALLS: Final = frozenset({"message", "system", "null", "recall", "change_agent_state"})
"""Actions that are not the agent calling a tool."""


def looks_like_resolver_output(record: object) -> bool:
    """True for a resolver record: a ``history`` list beside at least two resolver keys."""
    return (isinstance(record, dict) and isinstance(record.get("history"), list)
            and len(_RESOLVER_KEYS & set(record)) >= 2)


def import_openhands_resolver(path: Path) -> list[ImportedSession]:
    """Import resolver output: one session per record (JSONL line or JSON document).

    Raises:
        ImportFormatError: unreadable/empty/binary/non-JSON input, a record without a
            ``history`` list, or a history entry that is not an event object or pair.
    """
    if path.suffix.lower() == ".jsonl":
        records = read_jsonl_records(path, FORMAT)
    else:
        records = [(1, read_json_document(path, FORMAT))]
    out: list[ImportedSession] = []
    for line, record in records:
        note_line(line)
        if not isinstance(record, dict) or not isinstance(record.get("history"), list):
            raise ImportFormatError(
                "openhands-resolver output record must be an object with a history list; fix or "
                "delete that line", path=str(path), line=line, format=FORMAT)
        issue = record.get("issue")
        number = issue.get("number") if isinstance(issue, dict) else None
        name = f"{FORMAT}:{line}:{number}" if len(records) > 1 else FORMAT
        events = _v0_events(record["history"], path, line)
        session = build_v0_session(path, stable_session_id(path, name), events, record, line,
                                   fmt=FORMAT)
        out.append(session)
    return out


def _v0_events(history: list[Any], path: Path, line: int) -> list[JsonObj]:
    """The history as V0 events with ``id``, ``source`` and tool-call metadata (docstring)."""
    flat: list[Any] = []
    for index, entry in enumerate(history):
        items = entry if isinstance(entry, list) else [entry]
        if not all(isinstance(item, dict) for item in items):
            raise ImportFormatError(
                f"openhands-resolver history entry {index} must be an event object or an "
                "[action, observation] pair of objects; fix that entry", path=str(path), line=line,
                format=FORMAT, json_path=f"$.history[{index}]")
        flat.extend(items)
    if all("id" in e and "source" in e for e in flat if "action" in e or "observation" in e):
        return flat
    out: list[JsonObj] = []
    prompted = False
    open_call: JsonObj | None = None
    for index, event in enumerate(flat):
        e = dict(event)
        e.setdefault("id", index)
        action, observation = e.get("action"), e.get("observation")
        if action == "message" and "source" not in e:
            e["source"] = "agent" if prompted else "user"
            prompted = True
        elif isinstance(action, str) and action not in _NOT_CALLS:
            e.setdefault("source", "agent")
            if not isinstance(e.get("tool_call_metadata"), dict):
                open_call = {"tool_call_id": f"call-{index}", "function_name": action}
                e["tool_call_metadata"] = open_call
        elif isinstance(observation, str) and observation not in ("null",
                                                                  "agent_state_changed"):
            e.setdefault("source", "environment")
            if open_call is not None and not isinstance(e.get("tool_call_metadata"), dict):
                e["tool_call_metadata"] = open_call
            open_call = None
        out.append(e)
    return out

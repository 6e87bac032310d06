"""SWE-agent ``.traj`` files and mini-swe-agent trajectories into dsh events.

* SWE-agent: one JSON object; ``history`` is the chat as sent to the model and is the model
  view. Function-calling agents carry OpenAI ``tool_calls`` and ``role: "tool"`` messages with
  ``tool_call_ids`` (mapped like Chat Completions); text-mode agents keep the command inside the
  assistant text and the observation as a user message — both stay text (there is no native
  call to pair). ``trajectory`` steps, ``environment``, ``info`` and ``replay_config`` are kept
  as ignorable ``import/swe-agent/<key>`` events. ``info.exit_status`` closes the turn:
  ``submitted`` (or any ``submitted (…)``) → completed; ``exit_cost``/``exit_context``/
  ``exit_format``/``exit_error``/others → ``{kind: "error", error: {message, code}}`` with
  ``code`` the exit status upper-cased; no status → completed when the last response asked for
  nothing, else left open (interrupted).
* mini-swe-agent: a bare message list (early form) or ``{info, messages, trajectory_format}``;
  actions are fenced bash blocks in assistant text, observations are user messages — kept as
  text. ``info.exit_status`` is read like SWE-agent's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from dsh._errors import ImportFormatError
from dsh.interop._common import (
    EventBuilder,
    ImportedSession,
    read_json_document,
    stable_session_id,
)
from dsh.interop._openai_chat import map_openai_messages

FORMAT: Final = "swe-agent"
MINI_FORMAT: Final = "mini-swe-agent"
_MINI_MARKERS: Final = ("mswea_bash_command", "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
                        "<returncode>")


def looks_like_mini_swe_agent(doc: object) -> bool:
    """True for a mini-swe-agent trajectory (bare list or v2 wrapper)."""
    if isinstance(doc, dict) and "trajectory_format" in doc and isinstance(doc.get("messages"),
                                                                            list):
        return True
    if not isinstance(doc, list) or not doc:
        return False
    texts = [m.get("content") for m in doc if isinstance(m, dict)]
    return any(isinstance(t, str) and any(k in t for k in _MINI_MARKERS) for t in texts)


def _close(b: EventBuilder, info: Any) -> None:
    status = info.get("exit_status") if isinstance(info, dict) else None
    if isinstance(status, str) and status:
        if status.lower().startswith("submitted"):
            b.end_turn({"kind": "completed"})
        else:
            b.end_turn({"kind": "error", "error": {"message": f"agent exited: {status}",
                                                   "code": status.upper()}})
    else:
        b.finish()


def import_swe_agent(path: Path) -> list[ImportedSession]:
    """Import a SWE-agent ``.traj`` (text-mode or function-calling) as one session.

    Raises:
        ImportFormatError: unreadable/empty/binary/non-JSON file or no ``history`` list.
    """
    doc = read_json_document(path, FORMAT)
    if not isinstance(doc, dict) or not isinstance(doc.get("history"), list):
        raise ImportFormatError(
            "swe-agent trajectory must be an object with a history list, found "
            f"{type(doc).__name__}; pass the --format the file is in", path=str(path), line=1,
            format=FORMAT)
    b = EventBuilder(FORMAT, stable_session_id(path, FORMAT), path)
    b.model = ("swe-agent", "unknown")
    model = _model_name(doc)
    if model:
        b.model = ("swe-agent", model)
    for key in ("environment", "info", "replay_config"):
        if key in doc:
            b.ignorable(key, {key: doc[key]})
    trajectory = doc.get("trajectory")
    for step in trajectory if isinstance(trajectory, list) else []:
        b.ignorable("trajectory-step", step)
    if trajectory is not None and not isinstance(trajectory, list):
        b.ignorable("unknown", {"trajectory": trajectory})
    for key in doc:
        if key not in ("environment", "info", "replay_config", "trajectory", "history"):
            b.ignorable("unknown", {key: doc[key]})
    map_openai_messages(b, doc["history"], fmt=FORMAT, what="history message", line=1,
                        single_turn=True)
    _close(b, doc.get("info"))
    return [b.imported(b.header())]


def _model_name(doc: dict[str, Any]) -> str | None:
    for cfg_key in ("replay_config", "config"):
        cfg = doc.get(cfg_key)
        if isinstance(cfg, str):
            continue
        agent = cfg.get("agent") if isinstance(cfg, dict) else None
        model = agent.get("model") if isinstance(agent, dict) else None
        name = model.get("name") if isinstance(model, dict) else None
        if isinstance(name, str) and name:
            return name
    return None


def import_mini_swe_agent(path: Path) -> list[ImportedSession]:
    """Import a mini-swe-agent trajectory (bare list or ``{info, messages, …}``).

    Raises:
        ImportFormatError: unreadable/empty/binary/non-JSON file or no message list.
    """
    doc = read_json_document(path, MINI_FORMAT)
    b = EventBuilder(MINI_FORMAT, stable_session_id(path, MINI_FORMAT), path)
    b.model = ("mini-swe-agent", "unknown")
    info: Any = None
    if isinstance(doc, dict) and isinstance(doc.get("messages"), list) and (
            "trajectory_format" in doc or "info" in doc):
        messages = doc["messages"]
        info = doc.get("info")
        b.ignorable("info", {k: v for k, v in doc.items() if k != "messages"})
        config = info.get("config") if isinstance(info, dict) else None
        model = config.get("model") if isinstance(config, dict) else None
        name = model.get("model_name") if isinstance(model, dict) else None
        if isinstance(name, str) and name:
            b.model = ("mini-swe-agent", name)
    elif isinstance(doc, list) and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                       for m in doc):
        messages = doc
    else:
        raise ImportFormatError(
            "mini-swe-agent trajectory must be a list of messages with string content or an "
            f"object with info/trajectory_format and messages, found {type(doc).__name__}; "
            "pass the --format the file is in",
            path=str(path), line=1, format=MINI_FORMAT)
    # mini-swe-agent's observations are user turns; they are tool output, not prompts.
    map_openai_messages(b, messages, fmt=MINI_FORMAT, what="message", line=1, single_turn=True)
    if isinstance(info, dict) and "exit_status" in info:
        _close(b, info)
    else:
        # The early form ends with the submission observation after the sentinel command.
        b.end_turn({"kind": "completed"})
    return [b.imported(b.header())]

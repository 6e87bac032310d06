"""Builders for compaction tests: well-formed turns appended through the real Session."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from dsh.json import loads
from dsh.session._events import Event

_ids = itertools.count()


def new_session(session_id: str = "s") -> Any:
    from dsh.session._session import Session

    return Session.create(session_id)


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def user(session: Any, words: str, *, kind: str = "user") -> Event:
    result: Event = session.append(
        "user/message",
        {"content": [text(words)], "source": {"kind": kind}, "role": "user",
         "id": f"u{next(_ids)}"},
        surface_op="append")
    return result


def system(session: Any, words: str) -> Event:
    result: Event = session.append(
        "system/message",
        {"content": [text(words)], "source": {"kind": "system"}, "role": "system",
         "id": f"sys{next(_ids)}"},
        surface_op="append")
    return result


def assistant(session: Any, turn: int, step: int, words: str = "",
              calls: tuple[tuple[str, str, str], ...] = ()) -> Event:
    content: list[dict[str, Any]] = [text(words)] if words else []
    content += [{"type": "tool-call", "id": cid, "name": name, "arguments": args}
                for cid, name, args in calls]
    result: Event = session.append(
        "assistant/message",
        {"turn": turn, "step": step,
         "message": {"role": "assistant", "content": content,
                     "source": {"kind": "model", "provider": "p", "model": "m"},
                     "id": f"a{next(_ids)}"}},
        surface_op="append")
    return result


def tool_result(session: Any, turn: int, step: int, call_id: str, output: str, *,
                is_error: bool = False) -> Event:
    result: Event = session.append(
        "tool/result",
        {"turn": turn, "step": step,
         "message": {"source": {"kind": "tool", "callId": call_id},
                     "content": [{"type": "tool-result", "toolCallId": call_id,
                                  "content": [text(output)], "isError": is_error}],
                     "role": "user", "id": f"r{next(_ids)}"}},
        surface_op="append")
    return result


def turn(session: Any, number: int, prompt: str, *, answer: str = "done",
         calls: tuple[tuple[str, str, str, str], ...] = (), close: bool = True) -> None:
    """One completed turn: prompt, optional tool step (call id, name, args, output), answer."""
    session.append("turn/start", {"turn": number})
    session.append("step/start", {"turn": number, "step": 1})
    user(session, prompt)
    step = 1
    if calls:
        assistant(session, number, 1, "working on it",
                  tuple((c[0], c[1], c[2]) for c in calls))
        for cid, name, _args, output in calls:
            session.append("tool/call", {"turn": number, "step": 1, "callId": cid,
                                         "name": name, "arguments": _args})
            tool_result(session, number, 1, cid, output)
        session.append("step/end", {"turn": number, "step": 1})
        step = 2
        session.append("step/start", {"turn": number, "step": 2})
    assistant(session, number, step, answer)
    session.append("step/end", {"turn": number, "step": step})
    if close:
        session.append("turn/end", {"turn": number, "reason": {"kind": "completed"}})


def long_session(turns: int = 4) -> Any:
    session = new_session()
    for n in range(1, turns + 1):
        turn(session, n, f"request number {n}: please inspect src/module{n}.py and report " * 3,
             answer=f"module{n} looks fine; the config value is {n * 10} " * 4,
             calls=((f"call_{n}", "read_file", f'{{"path":"src/module{n}.py"}}',
                     f"line {n}\n" * 60),))
    return session


def s5_events(dsh_logs: Path) -> list[Event]:
    root = dsh_logs / "jsonl-unpacked" / "main"
    path = next(root.glob("*/s5-compaction/session.jsonl"))
    records = path.read_bytes().split(b"\n")
    return [Event(loads(line)) for line in records[1:] if line]

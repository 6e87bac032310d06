"""Builders for well-formed session logs, for backend tests (yours and dsh's).

Events are produced by a real ``Session`` (so every log is one dsh's core accepts) with a fixed
clock starting at :data:`CREATED_AT` (epoch ms, +1 per event), then handed to backends as frozen
``Event`` objects::

    builder = LogBuilder("s")
    builder.completed_turn(chunks=10)   # 17 events: turn, step, user, 11 chunks, answer, ends
    store.create(header("s"))
    with store.open("s", "write") as handle:
        handle.append(builder.events)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from dsh.json import FrozenDict
from dsh.session import Event, EventLog, Session

CWD = "/workspace/demo-app"
CREATED_AT = 1_767_225_600_000


def header(session_id: str, **extra: Any) -> dict[str, Any]:
    """A ``SessionHeader`` (version 0, :data:`CREATED_AT`, :data:`CWD`) plus ``extra`` keys."""
    out: dict[str, Any] = {"version": 0, "id": session_id, "createdAt": CREATED_AT, "cwd": CWD}
    out.update(extra)
    return out


def fixed_clock(start: int = CREATED_AT) -> Any:
    """A clock returning ``start``, ``start + 1``, … (epoch ms), one tick per call."""
    counter = itertools.count(start)
    return lambda: next(counter)


def user(text: str, mid: str) -> dict[str, Any]:
    """``user/message`` data: one text block, message id ``mid``."""
    return {"content": [{"type": "text", "text": text}], "source": {"kind": "user"},
            "role": "user", "id": mid}


def assistant(turn: int, step: int, text: str, mid: str,
              calls: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """``assistant/message`` data: one text block, then a tool call per ``(id, name)``."""
    content: list[Any] = [{"type": "text", "text": text}]
    for call_id, name in calls:
        content.append({"type": "tool-call", "id": call_id, "name": name, "arguments": "{}"})
    return {"turn": turn, "step": step, "message": {
        "id": mid, "role": "assistant", "content": content,
        "source": {"kind": "model", "provider": "deepseek", "model": "deepseek-chat"}}}


def tool_result(turn: int, step: int, call_id: str, text: str) -> dict[str, Any]:
    """``tool/result`` data answering ``call_id`` with one text block."""
    return {"turn": turn, "step": step, "message": {
        "id": f"tr-{call_id}", "role": "user",
        "content": [{"type": "tool-result", "toolCallId": call_id,
                     "content": [{"type": "text", "text": text}]}],
        "source": {"kind": "tool", "callId": call_id}}}


class LogBuilder:
    """Appends well-formed turns to a detached ``Session``; :attr:`events` is the log so far.

    Args:
        session_id: Id of the session (and of its header).
    """

    def __init__(self, session_id: str = "s") -> None:
        self.session = Session.create(session_id, header=header(session_id),
                                      clock=fixed_clock())
        self.turn = 0

    @property
    def events(self) -> EventLog:
        """Every event appended so far, seq 0 first (a live read-only view)."""
        return self.session.events

    def add(self, type_: str, data: Any, **kw: Any) -> Event:
        """Append one event (``Session.append`` arguments) and return it."""
        return self.session.append(type_, data, **kw)

    def open_turn(self, text: str = "hello") -> int:
        """Start a turn and its first step with a user message; return the turn number."""
        self.turn += 1
        t = self.turn
        self.add("turn/start", {"turn": t})
        self.add("step/start", {"turn": t, "step": 1})
        self.add("user/message", user(text, f"u{t}"), surface_op="append")
        return t

    def chunks(self, n: int, text: str = "x") -> None:
        """A text block start and ``n`` text deltas as ``assistant/chunk`` events."""
        t = self.turn
        self.add("assistant/chunk", {"turn": t, "step": 1, "chunk": {
            "type": "block-start", "index": 0, "blockType": "text"}})
        for _ in range(n):
            self.add("assistant/chunk", {"turn": t, "step": 1, "chunk": {
                "type": "text-delta", "index": 0, "text": text}})

    def completed_turn(self, text: str = "hello", chunks: int = 0) -> None:
        """A whole turn: 6 events, plus ``chunks + 1`` chunk events when ``chunks`` > 0."""
        t = self.open_turn(text)
        if chunks:
            self.chunks(chunks)
        self.add("assistant/message", assistant(t, 1, f"answer {t}", f"a{t}"),
                 surface_op="append")
        self.add("step/end", {"turn": t, "step": 1})
        self.add("turn/end", {"turn": t, "reason": {"kind": "completed"}})

    def tool_call_turn(self, call_id: str = "call_1", *, recorded: bool = True) -> None:
        """An open turn whose assistant asked for a tool; ``recorded`` adds tool/call."""
        t = self.open_turn("run it")
        self.add("assistant/message", assistant(t, 1, "running", f"a{t}", [(call_id, "bash")]),
                 surface_op="append")
        if recorded:
            self.add("tool/call", {"turn": t, "step": 1, "callId": call_id, "name": "bash",
                                   "arguments": "{}"})

    def close_tool(self, call_id: str = "call_1") -> None:
        """Answer ``call_id`` and end the step and the turn."""
        t = self.turn
        self.add("tool/result", tool_result(t, 1, call_id, "ok"), surface_op="append")
        self.add("step/end", {"turn": t, "step": 1})
        self.add("turn/end", {"turn": t, "reason": {"kind": "completed"}})


def plain(events: Any) -> list[dict[str, Any]]:
    """Events as plain dicts, for equality checks."""
    from dsh.json import thaw
    return [thaw(e) for e in events]


def make(type_: str, seq: int, data: Any, time: int = CREATED_AT, **extra: Any) -> Event:
    """One raw envelope (no session rules applied), e.g. for seq or vocabulary tests."""
    fields: dict[str, Any] = {"type": type_, "seq": seq, "time": time, "data": data}
    fields.update(extra)
    return Event(fields)


def frozen(value: Any) -> Any:
    """``value`` as a frozen lossless JSON snapshot."""
    from dsh.json import snapshot_json
    return snapshot_json(value)


__all__ = ["CREATED_AT", "CWD", "FrozenDict", "LogBuilder", "assistant", "fixed_clock", "frozen",
           "header", "make", "plain", "tool_result", "user"]

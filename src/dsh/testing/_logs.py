"""The log builder for tests (yours and dsh's): well-formed logs, or raw ones on purpose.

By default events are produced by a real ``Session`` (so every log is one dsh's core accepts)
with a fixed clock starting at :data:`CREATED_AT` (epoch ms, +1 per event), then handed to
backends as frozen ``Event`` objects; ``LogBuilder(checked=False)`` builds the same helpers'
events as raw envelopes, for logs a reader must refuse or repair::

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

from dsh.json import snapshot_json
from dsh.session import Event, Session

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
    """Builds a session log for tests, one event at a time; :attr:`events` is the log so far.

    Two modes, one vocabulary of helpers:

    * checked (the default): every event goes through a real ``Session.append`` with a fixed
      clock from :data:`CREATED_AT`, so the log is one dsh's core accepts (and a builder call
      that breaks a rule raises as ``Session.append`` does);
    * unchecked (``checked=False``): events are frozen envelopes with contiguous seqs from
      ``start`` and times ``CREATED_AT + seq``, nothing validated, for logs a reader must
      refuse, repair or resynchronise on.

    Args:
        session_id: Id of the session (and of its header).
        checked: Append through a real ``Session`` (True) or build raw envelopes (False).
        start: First seq of an unchecked log (a suffix of a longer one); 0 when checked.
        events: The list an unchecked log appends to (a ``list`` subclass may watch how it is
            read); default a new list.

    Raises:
        ValueError: ``start`` other than 0, or ``events``, for a checked log.
    """

    def __init__(self, session_id: str = "s", *, checked: bool = True, start: int = 0,
                 events: list[Event] | None = None) -> None:
        if checked and (start or events is not None):
            raise ValueError("a checked log starts at seq 0 in a Session of its own; pass "
                             "checked=False for a suffix or a list of your own")
        self.checked = checked
        self.start = start
        self.turn = 0
        self._session = (Session.create(session_id, header=header(session_id),
                                        clock=fixed_clock()) if checked else None)
        self._raw: list[Event] = [] if events is None else events

    @property
    def session(self) -> Session:
        """The session a checked log is appended to.

        Raises:
            AttributeError: the log is unchecked (it has no session).
        """
        if self._session is None:
            raise AttributeError("an unchecked LogBuilder has no session; use .events")
        return self._session

    @property
    def events(self) -> Sequence[Event]:
        """Every event appended so far, oldest first (checked: a live read-only view)."""
        return self._session.events if self._session is not None else self._raw

    @property
    def seq(self) -> int:
        """The seq the next event gets."""
        return self._session.seq if self._session is not None else self.start + len(self._raw)

    def add(self, type_: str, data: Any, *, surface_op: Any = None,
            source_event_seqs: Any = None, ignorable: bool = False, time: int | None = None,
            **envelope: Any) -> Event:
        """Append one event and return it.

        Args:
            type_: Event type.
            data: Its payload (frozen on the way in).
            surface_op: ``"append"`` or a replace op; None for a log-only event.
            source_event_seqs: Cited earlier seqs.
            ignorable: Mark the event ignorable.
            time: Unchecked only: its time (default ``CREATED_AT + seq``).
            **envelope: Unchecked only: more envelope keys, written as given (wire spelling,
                e.g. ``surfaceOp={...}`` to write a malformed op).

        Raises:
            EventRejectedError, InvariantError: checked, and the event breaks a core rule.
            TypeError: ``time`` or ``envelope`` keys for a checked log.
        """
        if self._session is not None:
            if time is not None or envelope:
                raise TypeError("a checked log takes Session.append arguments only; pass "
                                "checked=False for raw envelope keys")
            return self._session.append(type_, data, surface_op=surface_op,
                                        source_event_seqs=source_event_seqs,
                                        ignorable=ignorable)
        seq = self.seq
        fields: dict[str, Any] = {"type": type_, "seq": seq,
                                  "time": CREATED_AT + seq if time is None else time,
                                  "data": data}
        if surface_op is not None:
            fields["surfaceOp"] = surface_op
        if source_event_seqs is not None:
            fields["sourceEventSeqs"] = source_event_seqs
        if ignorable:
            fields["ignorable"] = True
        fields.update(envelope)
        event = Event(snapshot_json(fields))
        self._raw.append(event)
        return event

    # one event each --------------------------------------------------------------------

    def turn_start(self, turn: int) -> Event:
        """``turn/start {turn}``."""
        return self.add("turn/start", {"turn": turn})

    def turn_end(self, turn: int, kind: str = "completed") -> Event:
        """``turn/end {turn, reason: {kind}}``."""
        return self.add("turn/end", {"turn": turn, "reason": {"kind": kind}})

    def step_start(self, turn: int, step: int) -> Event:
        """``step/start {turn, step}``."""
        return self.add("step/start", {"turn": turn, "step": step})

    def step_end(self, turn: int, step: int) -> Event:
        """``step/end {turn, step}``."""
        return self.add("step/end", {"turn": turn, "step": step})

    def user(self, text: str = "hi", *, surface_op: Any = "append", **kw: Any) -> Event:
        """A ``user/message`` with one text block (id ``u<seq>``), appended to the surface."""
        return self.add("user/message", {"id": f"u{self.seq}", "role": "user",
                                         "source": {"kind": "user"},
                                         "content": [{"type": "text", "text": text}]},
                        surface_op=surface_op, **kw)

    def assistant(self, turn: int, step: int, calls: Sequence[tuple[str, str]] | None = None,
                  text: str = "ok", *, surface_op: Any = "append", **kw: Any) -> Event:
        """An ``assistant/message`` (id ``a<seq>``): ``text``, then a call per ``(id, name)``."""
        content: list[Any] = [{"type": "text", "text": text}] if text else []
        content += [{"type": "tool-call", "id": cid, "name": name, "arguments": "{}"}
                    for cid, name in calls or []]
        return self.add("assistant/message",
                        {"turn": turn, "step": step,
                         "message": {"id": f"a{self.seq}", "role": "assistant",
                                     "source": {"kind": "model", "provider": "p", "model": "m"},
                                     "content": content}},
                        surface_op=surface_op, **kw)

    def tool_call(self, turn: int, step: int, call_id: str, name: str = "bash") -> Event:
        """``tool/call`` of ``call_id`` (arguments ``{}``)."""
        return self.add("tool/call", {"turn": turn, "step": step, "callId": call_id,
                                      "name": name, "arguments": "{}"})

    def tool_result(self, turn: int, step: int, call_id: str, text: str = "done",
                    call_seq: int | None = None, surface_op: Any = "append",
                    error: Any = None, is_error: bool = False) -> Event:
        """``tool/result`` answering ``call_id`` (citing ``call_seq`` when given)."""
        data: dict[str, Any] = {
            "turn": turn, "step": step,
            "message": {"id": f"r{self.seq}", "role": "user",
                        "source": {"kind": "tool", "callId": call_id},
                        "content": [{"type": "tool-result", "toolCallId": call_id,
                                     "isError": is_error,
                                     "content": [{"type": "text", "text": text}]}]}}
        if error is not None:
            data["error"] = error
        return self.add("tool/result", data, surface_op=surface_op,
                        source_event_seqs=[call_seq] if call_seq is not None else None)

    def chunk(self, turn: int, step: int, chunk: Any) -> Event:
        """One ``assistant/chunk``."""
        return self.add("assistant/chunk", {"turn": turn, "step": step, "chunk": chunk})

    # whole turns (numbered by the builder) ---------------------------------------------

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
    """One raw envelope, nothing checked or frozen (values a reader must refuse stay as given).

    ``extra`` keys are written as given (wire spelling: ``surfaceOp``, ``sourceEventSeqs``).
    """
    fields: dict[str, Any] = {"type": type_, "seq": seq, "time": time, "data": data}
    fields.update(extra)
    return Event(fields)


def frozen(value: Any) -> Any:
    """``value`` as a frozen lossless JSON snapshot."""
    return snapshot_json(value)

"""Event builders and hypothesis strategies for the repair, invariant and chunk-row tests."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import strategies as st

from dsh.json import MAX_SAFE_INTEGER, snapshot_json
from dsh.session._events import Event

MAX_EXAMPLES = int(os.environ.get("DSH_HYPOTHESIS_EXAMPLES", "60"))
BASE_TIME = 1_700_000_000_000


def ev(type_: str, seq: int, data: Any, *, time: int | None = None, **extra: Any) -> Event:
    """One frozen event in append key order (``type, seq, time, data``, then extras)."""
    fields: dict[str, Any] = {"type": type_, "seq": seq,
                              "time": BASE_TIME + seq if time is None else time, "data": data}
    fields.update(extra)
    return Event(snapshot_json(fields))


class LogBuilder:
    """Appends events with contiguous seqs; every helper returns the new event."""

    def __init__(self, start: int = 0) -> None:
        self.events: list[Event] = []
        self.start = start

    @property
    def seq(self) -> int:
        return self.start + len(self.events)

    def add(self, type_: str, data: Any, **extra: Any) -> Event:
        event = ev(type_, self.seq, data, **extra)
        self.events.append(event)
        return event

    def turn_start(self, turn: int) -> Event:
        return self.add("turn/start", {"turn": turn})

    def turn_end(self, turn: int, kind: str = "completed") -> Event:
        return self.add("turn/end", {"turn": turn, "reason": {"kind": kind}})

    def step_start(self, turn: int, step: int) -> Event:
        return self.add("step/start", {"turn": turn, "step": step})

    def step_end(self, turn: int, step: int) -> Event:
        return self.add("step/end", {"turn": turn, "step": step})

    def user(self, text: str = "hi", **extra: Any) -> Event:
        return self.add("user/message", {"id": f"u{self.seq}", "role": "user",
                                         "source": {"kind": "user"},
                                         "content": [{"type": "text", "text": text}]},
                        surfaceOp=extra.pop("surfaceOp", "append"), **extra)

    def assistant(self, turn: int, step: int, calls: list[tuple[str, str]] | None = None,
                  text: str = "ok", **extra: Any) -> Event:
        content: list[Any] = [{"type": "text", "text": text}] if text else []
        content += [{"type": "tool-call", "id": cid, "name": name, "arguments": "{}"}
                    for cid, name in calls or []]
        return self.add("assistant/message",
                        {"turn": turn, "step": step,
                         "message": {"id": f"a{self.seq}", "role": "assistant",
                                     "source": {"kind": "model", "provider": "p", "model": "m"},
                                     "content": content}},
                        surfaceOp=extra.pop("surfaceOp", "append"), **extra)

    def tool_call(self, turn: int, step: int, call_id: str, name: str = "bash") -> Event:
        return self.add("tool/call", {"turn": turn, "step": step, "callId": call_id,
                                      "name": name, "arguments": "{}"})

    def tool_result(self, turn: int, step: int, call_id: str, text: str = "done",
                    call_seq: int | None = None, surface_op: Any = "append",
                    error: Any = None, is_error: bool = False) -> Event:
        data: dict[str, Any] = {
            "turn": turn, "step": step,
            "message": {"id": f"r{self.seq}", "role": "user",
                        "source": {"kind": "tool", "callId": call_id},
                        "content": [{"type": "tool-result", "toolCallId": call_id,
                                     "isError": is_error,
                                     "content": [{"type": "text", "text": text}]}]}}
        if error is not None:
            data["error"] = error
        extra: dict[str, Any] = {"surfaceOp": surface_op}
        if call_seq is not None:
            extra["sourceEventSeqs"] = [call_seq]
        return self.add("tool/result", data, **extra)

    def chunk(self, turn: int, step: int, chunk: Any) -> Event:
        return self.add("assistant/chunk", {"turn": turn, "step": step, "chunk": chunk})


# --- well-formed logs, as the agent loop writes them (core spec §1.8) ---------------------


@st.composite
def well_formed_logs(draw: st.DrawFn) -> list[Event]:
    """A complete, invariant-valid log: turns of steps with chunks, calls and results."""
    log = LogBuilder()
    turns = draw(st.integers(0, 3))
    call_no = 0
    for turn in range(1, turns + 1):
        if draw(st.booleans()):
            log.user("between turns")
        if draw(st.booleans()):
            log.add("plan/mode", {"active": True})
        log.turn_start(turn)
        for step in range(1, draw(st.integers(0, 3)) + 1):
            log.step_start(turn, step)
            if step == 1:
                log.user("prompt")
            if draw(st.booleans()):
                log.add("request/header", {"header": {"config": {"provider": "p", "model": "m"}},
                                           "reason": "initial"})
            for i in range(draw(st.integers(0, 4))):
                log.chunk(turn, step, {"type": "text-delta", "index": 0, "text": f"t{i}"})
            calls = []
            for _ in range(draw(st.integers(0, 3))):
                call_no += 1
                calls.append((f"call-{call_no}", draw(st.sampled_from(["bash", "read_file"]))))
            log.assistant(turn, step, calls)
            for call_id, name in calls:
                outcome = draw(st.sampled_from(["answered", "answered", "no-call", "no-result"]))
                if outcome == "no-call":
                    continue
                call = log.tool_call(turn, step, call_id, name)
                if outcome == "answered":
                    log.tool_result(turn, step, call_id, call_seq=call.seq)
            if draw(st.booleans()):
                log.add("todo/write", {"todos": []})
            log.step_end(turn, step)
        log.turn_end(turn)
    return log.events


# --- chunk batches (core spec §12) --------------------------------------------------------

_SAFE = st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER)


@st.composite
def chunk_batches(draw: st.DrawFn) -> list[Event]:
    """A batch of delta runs (often packable), broken runs, off-whitelist deltas and others."""
    events: list[Event] = []
    seq = draw(st.integers(0, MAX_SAFE_INTEGER - 500))
    time = draw(_SAFE)
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["text", "reasoning", "tool", "tool", "other", "block",
                                     "odd"]))
        turn = draw(st.sampled_from([1, 2]))
        step = draw(st.sampled_from([1, 2, 1.5]))
        index = draw(st.sampled_from([0, 1]))
        call_id = draw(st.sampled_from(["c1", "c2"]))
        name = draw(st.sampled_from([None, "bash", "grep"]))
        for _ in range(draw(st.integers(1, 6))):
            if draw(st.integers(0, 11)) == 0:
                seq += draw(st.integers(1, 3))  # a seq gap breaks a run
            if draw(st.integers(0, 11)) == 0:
                name = draw(st.sampled_from([None, "bash", "grep"]))  # breaks a tool run
            # now and then a jump that may leave the safe range of a subtraction
            big = draw(st.integers(0, 15)) == 0
            step_time = draw(_SAFE) if big else draw(st.integers(-5, 50))
            time = time + step_time if abs(time + step_time) <= MAX_SAFE_INTEGER else draw(_SAFE)
            text = draw(st.text(max_size=4))
            if kind in ("text", "reasoning"):
                chunk: Any = {"type": f"{kind}-delta", "index": index, "text": text}
            elif kind == "tool":
                chunk = {"type": "tool-call-delta", "index": index, "id": call_id}
                if name is not None:
                    chunk["name"] = name
                chunk["argumentsDelta"] = text
            elif kind == "block":
                chunk = {"type": "block-start", "index": index, "blockType": "text"}
            elif kind == "odd":
                chunk = {"type": "text-delta", "index": index, "text": text, "extra": True}
            else:
                events.append(ev("turn/start", seq, {"turn": 1}, time=time))
                seq += 1
                continue
            events.append(ev("assistant/chunk", seq,
                             {"turn": turn, "step": step, "chunk": chunk}, time=time))
            seq += 1
    return events

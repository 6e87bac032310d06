"""Hypothesis strategies for the repair, invariant and chunk-row tests (logs: dsh.testing)."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import strategies as st

from dsh.json import MAX_SAFE_INTEGER
from dsh.session import Event
from dsh.testing import LogBuilder, make

MAX_EXAMPLES = int(os.environ.get("DSH_HYPOTHESIS_EXAMPLES", "60"))


# --- well-formed logs, as the agent loop writes them (docs/events.md#a-turn-event-by-event) -------


@st.composite
def well_formed_logs(draw: st.DrawFn) -> list[Event]:
    """A complete, invariant-valid log: turns of steps with chunks, calls and results."""
    log = LogBuilder(checked=False)
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


# --- chunk batches (docs/formats.md#chunk-rows) ---------------------------------------------------

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
                events.append(make("turn/start", seq, {"turn": 1}, time=time))
                seq += 1
                continue
            events.append(make("assistant/chunk", seq,
                             {"turn": turn, "step": step, "chunk": chunk}, time=time))
            seq += 1
    return events

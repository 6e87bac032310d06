"""The writer whose file syscalls the power-loss test records (run under strace).

``python -m tests.persistence._powerloss_writer URL ACKS DUMP``: creates session ``crash``,
appends turns (chunk runs, a tool call whose result spans several 4 KiB pages) and flushes
after each; then closes the store, opens it again, resumes and appends more turns. Restore
points are written at every flush. After each flush *returns* it writes one line, the event
count then acknowledged, to the file ACKS with a single ``os.write``: in the trace that write
marks the moment from which those events must survive any power cut. At the end it writes the
final log's events (thawed JSON) to DUMP.
"""

from __future__ import annotations

import json
import os
import sys

from dsh.json import thaw
from dsh.persistence import Persistence, WriteBehind, open_backend
from dsh.persistence import _restore_point as rp
from dsh.session import Session, SessionStore
from dsh.testing import CWD

MODEL = {"kind": "model", "provider": "deepseek", "model": "deepseek-chat"}
FIRST_TURNS = 5  # turns written by the creating writer
RESUMED_TURNS = 3  # turns written after the resume


def append_turn(session: Session, t: int) -> None:
    """One completed turn: user message, six chunks, a tool call and a long tool result."""
    append = session.append
    append("turn/start", {"turn": t})
    append("step/start", {"turn": t, "step": 1})
    append("user/message", {"content": [{"type": "text", "text": f"q{t}"}],
                            "source": {"kind": "user"}, "role": "user", "id": f"u{t}"},
           surface_op="append")
    for i in range(6):
        append("assistant/chunk", {"turn": t, "step": 1, "chunk": {
            "type": "text-delta", "index": 0, "text": f"w{i} "}})
    call = f"call_{t}"
    append("assistant/message", {"turn": t, "step": 1, "message": {
        "id": f"a{t}", "role": "assistant", "source": MODEL, "content": [
            {"type": "text", "text": "run"},
            {"type": "tool-call", "id": call, "name": "bash", "arguments": "{}"}]}},
        surface_op="append")
    started = append("tool/call", {"turn": t, "step": 1, "callId": call, "name": "bash",
                                   "arguments": "{}"})
    # ~9 KiB of output: a batch covers several pages, so a page-subset crash can tear inside it
    output = "".join(f"line {t}.{n}: {'x' * 40}\n" for n in range(180))
    append("tool/result", {"turn": t, "step": 1, "message": {
        "id": f"r{t}", "role": "user", "source": {"kind": "tool", "callId": call},
        "content": [{"type": "tool-result", "toolCallId": call,
                     "content": [{"type": "text", "text": output}]}]}},
        surface_op="append", source_event_seqs=[started.seq])
    append("step/end", {"turn": t, "step": 1})
    append("turn/end", {"turn": t, "reason": {"kind": "completed"}})


def main() -> None:
    url, acks_path, dump_path = sys.argv[1:4]
    rp.RESTORE_POINT_EVERY_EVENTS = 1  # a restore point (and its seal record) at every flush
    acks = os.open(acks_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)

    def acknowledge(count: int) -> None:
        os.write(acks, f"{count}\n".encode())

    # a write-behind window of ten minutes: nothing is written but what a flush asks for
    persistence = Persistence(open_backend(url), write_behind=WriteBehind(600_000))
    store = SessionStore(persistence)
    session = store.create("crash", header={"cwd": CWD})
    for t in range(1, FIRST_TURNS + 1):
        append_turn(session, t)
        store.flush(session)
        acknowledge(len(session.events))
    store.dispose(session)
    persistence.close()

    persistence = Persistence(open_backend(url), write_behind=WriteBehind(600_000))
    store = SessionStore(persistence)
    session = store.resume("crash")
    for t in range(FIRST_TURNS + 1, FIRST_TURNS + RESUMED_TURNS + 1):
        append_turn(session, t)
        store.flush(session)
        acknowledge(len(session.events))
    store.dispose(session)
    events = [thaw(e) for e in persistence.read("crash").events]
    persistence.close()
    os.close(acks)
    with open(dump_path, "w", encoding="utf-8") as f:
        json.dump(events, f)


if __name__ == "__main__":
    main()

"""The turn shapes of ../shared/bench/WORKLOADS.md, appended through the public Session API."""

from __future__ import annotations

import os
import platform
import resource
import sys
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dsh.session._session import Session

USER_TEXT = "Please look at src/server.ts and explain how a request flows through it."  # 74 chars
TOOL_OUT = (
    "export function handle(req, res) {\n"
    "  const route = match(req.url);\n"
    "  if (!route) return notFound(res);\n"
    "  const body = await route.run(req);\n"
    "  res.end(JSON.stringify(body));\n"
    "}"
)
ANSWER = (
    "The handler matches the URL to a route, returns 404 when none fits, "
    "runs the route and writes its JSON result."
)
MODEL = {"kind": "model", "provider": "deepseek", "model": "deepseek-chat"}
HEADER = {"config": {"provider": "deepseek", "model": "deepseek-chat"}, "system": "You help."}

Append = Callable[..., Any]


def _id() -> str:
    return str(uuid.uuid4())


def start(session: Session) -> None:
    """Every workload opens with one ``request/header`` (reason ``initial``)."""
    session.append("request/header", {"header": HEADER, "reason": "initial"})


def msg_turn(session: Session, turn: int, user_text: str = USER_TEXT) -> None:
    """11 events, 4 on the surface (WORKLOADS.md "msg"); ``user_text`` is the prompt's text."""
    a = session.append
    a("turn/start", {"turn": turn})
    a("step/start", {"turn": turn, "step": 1})
    a("user/message", {"id": _id(), "role": "user", "source": {"kind": "user"},
                       "content": [{"type": "text", "text": user_text}]}, surface_op="append")
    call_id = f"call_{turn}"
    a("assistant/message", {"turn": turn, "step": 1, "message": {
        "id": _id(), "role": "assistant", "source": MODEL, "content": [
            {"type": "text", "text": "Reading it."},
            {"type": "tool-call", "id": call_id, "name": "read_file",
             "arguments": '{"path":"src/server.ts"}'}]},
        "usage": {"inputTokens": 1000, "outputTokens": 20}}, surface_op="append")
    call = a("tool/call", {"turn": turn, "step": 1, "callId": call_id, "name": "read_file",
                           "arguments": '{"path":"src/server.ts"}'})
    a("tool/result", {"turn": turn, "step": 1, "message": {
        "id": _id(), "role": "user", "source": {"kind": "tool", "callId": call_id},
        "content": [{"type": "tool-result", "toolCallId": call_id,
                     "content": [{"type": "text", "text": TOOL_OUT}]}]}},
      surface_op="append", source_event_seqs=[call.seq])
    a("step/end", {"turn": turn, "step": 1})
    a("step/start", {"turn": turn, "step": 2})
    a("assistant/message", {"turn": turn, "step": 2, "message": {
        "id": _id(), "role": "assistant", "source": MODEL,
        "content": [{"type": "text", "text": ANSWER}]},
        "usage": {"inputTokens": 1200, "outputTokens": 40}}, surface_op="append")
    a("step/end", {"turn": turn, "step": 2})
    a("turn/end", {"turn": turn, "reason": {"kind": "completed"}})


def stream_turn(session: Session, turn: int) -> None:
    """51 events, 2 on the surface, 45 chunks (WORKLOADS.md "stream")."""
    a = session.append
    a("turn/start", {"turn": turn})
    a("step/start", {"turn": turn, "step": 1})
    a("user/message", {"id": _id(), "role": "user", "source": {"kind": "user"},
                       "content": [{"type": "text", "text": USER_TEXT}]}, surface_op="append")
    seqs = []

    def chunk(c: dict[str, Any]) -> None:
        seqs.append(a("assistant/chunk", {"turn": turn, "step": 1, "chunk": c}).seq)

    chunk({"type": "block-start", "index": 0, "blockType": "text"})
    words = ANSWER.split(" ")
    for i in range(40):
        word = words[i % len(words)]
        chunk({"type": "text-delta", "index": 0, "text": word + " "})
    chunk({"type": "block-end", "index": 0, "block": {"type": "text", "text": ANSWER}})
    chunk({"type": "usage", "usage": {"inputTokens": 1000, "outputTokens": 40}})
    chunk({"type": "finish", "reason": {"kind": "stop"}})
    a("assistant/message", {"turn": turn, "step": 1, "message": {
        "id": _id(), "role": "assistant", "source": MODEL,
        "content": [{"type": "text", "text": ANSWER}]},
        "usage": {"inputTokens": 1000, "outputTokens": 40}},
      surface_op="append", source_event_seqs=seqs)
    a("step/end", {"turn": turn, "step": 1})
    a("turn/end", {"turn": turn, "reason": {"kind": "completed"}})


def build(session: Session, workload: str, events: int) -> Session:
    """Append ``workload`` turns until at least ``events`` events are in the log."""
    start(session)
    if workload == "chunks":
        session.append("turn/start", {"turn": 1})
        session.append("step/start", {"turn": 1, "step": 1})
        session.append("assistant/chunk", {"turn": 1, "step": 1, "chunk": {
            "type": "block-start", "index": 0, "blockType": "text"}})
        i = 0
        while session.seq < events:
            session.append("assistant/chunk", {"turn": 1, "step": 1, "chunk": {
                "type": "text-delta", "index": 0, "text": f"tok{i % 100} "}})
            i += 1
        return session
    turn_fn = msg_turn if workload == "msg" else stream_turn
    turn = 0
    while session.seq < events:
        turn += 1
        turn_fn(session, turn)
    return session


def peak_rss_mb() -> float:
    """Peak resident set size of this process, in MB.

    Reads ``VmHWM`` from ``/proc/self/status``: Linux carries ``ru_maxrss`` across ``execve``, so
    a child started by a large parent would report the parent's peak.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine() -> str:
    """One line naming the machine and the Python that ran the bench."""
    return (f"{platform.machine()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
            f"{platform.system()} {platform.release()}")


def now_ms() -> float:
    """A monotonic clock in milliseconds."""
    return time.perf_counter() * 1000


def ratio(ours: float, theirs: float, *, higher_is_better: bool) -> str:
    """'1.4× better' / '0.7× (worse)' comparing our figure with dsh's."""
    if ours <= 0 or theirs <= 0:
        return "n/a"
    r = ours / theirs if higher_is_better else theirs / ours
    return f"{r:.2f}× {'better' if r >= 1 else 'worse'}"


def existing_dir(value: str) -> str:
    """``--dir``: a folder that exists and is writable (argparse's usage error otherwise)."""
    import argparse

    if not os.path.isdir(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not an existing folder; create it or "
                                         "pass another (the temporary stores go there)")
    if not os.access(value, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{value!r} is not writable; pass a folder you can "
                                         "write to")
    return value

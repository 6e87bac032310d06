"""SIGKILL crash test: a writer killed at random moments loses nothing it flushed.

Rule: docs/rules.md#write-behind-and-the-flush-barrier, docs/formats.md#writing,
    docs/rules.md#resume.

A child process appends turns (with tool calls and chunk runs) through a ``SessionStore`` bound
to a JSONL store and prints the last seq after every ``flush``. The parent kills it with SIGKILL
at a random moment, then resumes the session: every flushed event is present, the log loads,
and the repaired log passes ``dsh.session._invariants.check_log``. Repeated ``DSH_CRASH_RUNS``
times (default 17) on each backend (JSONL raw, JSONL zstd, SQLite), resuming the same store each
time; ``DSH_CRASH_RUNS=50`` gives 50 random moments per backend.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dsh.json import thaw
from dsh.persistence import Persistence, open_backend
from dsh.session._invariants import check_log
from dsh.session._store import SessionStore

RUNS = int(os.environ.get("DSH_CRASH_RUNS", "17"))  # 3 backends × 17 ≈ 50 kills in CI

CHILD = textwrap.dedent("""
    import sys
    from dsh.persistence import Persistence, open_backend
    from dsh.persistence import Persistence, WriteBehind
    from dsh.session._store import SessionStore

    url = sys.argv[1]
    persistence = Persistence(open_backend(url), write_behind=WriteBehind(5))
    store = SessionStore(persistence)
    if persistence.exists("crash"):
        session = store.resume("crash")
    else:
        session = store.create("crash", header={"cwd": "/workspace/demo-app"})
    store.flush(session)
    print(session.seq - 1, flush=True)
    turn = max([e.data["turn"] for e in session.events if e.type == "turn/start"] or [0])
    model = {"kind": "model", "provider": "deepseek", "model": "deepseek-chat"}
    while True:
        turn += 1
        t = turn
        session.append("turn/start", {"turn": t})
        session.append("step/start", {"turn": t, "step": 1})
        session.append("user/message", {"content": [{"type": "text", "text": f"q{t}"}],
                       "source": {"kind": "user"}, "role": "user", "id": f"u{t}"},
                       surface_op="append")
        for i in range(6):
            session.append("assistant/chunk", {"turn": t, "step": 1, "chunk": {
                "type": "text-delta", "index": 0, "text": f"w{i} "}})
        call = f"call_{t}"
        first = session.append("assistant/message", {"turn": t, "step": 1, "message": {
            "id": f"a{t}", "role": "assistant", "source": model, "content": [
                {"type": "text", "text": "run"},
                {"type": "tool-call", "id": call, "name": "bash", "arguments": "{}"}]}},
            surface_op="append")
        started = session.append("tool/call", {"turn": t, "step": 1, "callId": call,
                                 "name": "bash", "arguments": "{}"})
        store.flush(session)
        print(started.seq, flush=True)
        session.append("tool/result", {"turn": t, "step": 1, "message": {
            "id": f"r{t}", "role": "user", "source": {"kind": "tool", "callId": call},
            "content": [{"type": "tool-result", "toolCallId": call,
                         "content": [{"type": "text", "text": "ok"}]}]}},
            surface_op="append", source_event_seqs=[started.seq])
        session.append("step/end", {"turn": t, "step": 1})
        session.append("turn/end", {"turn": t, "reason": {"kind": "completed"}})
        store.flush(session)
        print(session.seq - 1, flush=True)
""")


def _run_and_kill(url: str, rng: random.Random) -> int:
    """Run the child, SIGKILL it after a random number of flushes; return the last flushed seq."""
    with subprocess.Popen([sys.executable, "-c", CHILD, url], stdout=subprocess.PIPE,
                          text=True) as child:
        assert child.stdout is not None
        last = -1
        target = rng.randint(1, 12)
        seen = 0
        while seen < target:
            line = child.stdout.readline()
            if not line:
                break
            last = int(line)
            seen += 1
        time.sleep(rng.random() * 0.02)  # land somewhere inside the next batch
        child.send_signal(signal.SIGKILL)
        for line in child.stdout:  # flushes reported before death still count
            last = int(line)
        child.wait(timeout=30)
        assert child.returncode == -signal.SIGKILL, child.returncode
    return last


@pytest.mark.parametrize("scheme", ["jsonl", "jsonl+zstd", "sqlite"])
def test_sigkill_never_loses_flushed_events(tmp_path: Path, scheme: str) -> None:
    rng = random.Random(int(os.environ.get("DSH_CRASH_SEED", "20261130")))
    target = tmp_path / ("store.db" if scheme == "sqlite" else "store")
    url = f"{scheme}://{target}"
    for _ in range(RUNS):
        flushed = _run_and_kill(url, rng)
        assert flushed >= 0
        persistence = Persistence(open_backend(url))
        inspected = persistence.inspect("crash")
        assert len(inspected.events) - len(inspected.closers) >= flushed + 1
        store = SessionStore(persistence)
        session = store.resume("crash")
        store.flush(session)
        store.dispose(session)
        with persistence.open("crash") as handle:
            cold = handle.read()
        assert cold.torn is None
        events = cold.events
        assert [e.seq for e in events] == list(range(len(events)))
        assert len(events) >= flushed + 1
        assert check_log(events) == []
        assert [thaw(e) for e in events] == [thaw(e) for e in session.events]
        persistence.close()


BATCH_CHILD = textwrap.dedent("""
    import os, signal, sys
    from dsh.persistence import Persistence, WriteBehind, open_backend
    from dsh.session._store import SessionStore

    store = SessionStore(Persistence(open_backend(sys.argv[1]), write_behind=WriteBehind(50)))
    session = store.create("batch")
    with session.batch():
        session.append("session/title", {"title": "one"})
        session.append("session/title", {"title": "two"})
        store.flush(session)  # the barrier: both are stored when it returns
        session.append("session/title", {"title": "never flushed"})
        os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("scheme", ["sqlite", "jsonl"])
def test_a_flush_inside_a_batch_block_stores_what_the_block_committed(tmp_path: Path,
                                                                      scheme: str) -> None:
    # docs/rules.md#live-sessions: a Session.batch block defers the observers' notification,
    # never the durability barrier: a flush inside it returns once the block's appends so far
    # are stored (before, it returned with them still unqueued and SIGKILL lost them)
    url = f"sqlite:///{tmp_path}/s.db" if scheme == "sqlite" else f"jsonl://{tmp_path}/logs"
    child = subprocess.run([sys.executable, "-c", BATCH_CHILD, url], capture_output=True,
                           text=True, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr
    store = SessionStore(Persistence(open_backend(url)))
    try:
        titles = [e.data["title"] for e in store.resume("batch").events
                  if e.type == "session/title"]
    finally:
        store.close()
    assert titles[:2] == ["one", "two"] and len(titles) <= 3

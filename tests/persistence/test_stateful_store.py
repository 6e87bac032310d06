"""A stateful property test of what must be on disk: append, flush, crash, reopen, fork, compact.

Hypothesis drives one store (JSONL, SQLite) through random sequences of: new sessions, turns
appended to live sessions, flushes, compaction, dispose, closing and reopening the store,
resuming and forking stored sessions, and a crash: a child process that appends and flushes
turns to a stored (or new) session and is killed with SIGKILL in the middle of a turn. A model
keeps what each session's log must hold; after every step the stored logs are read back:

* a stored session that is not live holds exactly the model's events (by type);
* a live session's log is a prefix of its events, at least as long as its last flush;
* a killed writer's log holds exactly what it flushed (its unflushed turn is absent), and the
  next resume adds only ``session/end-seed`` (none after a fork's inherited one).

Rules: docs/rules.md#write-behind-and-the-flush-barrier. Few examples by default; set
DSH_HYPOTHESIS_EXAMPLES for more.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dsh._errors import CompactionError, SessionNotFoundError
from dsh.compaction import DigestSummarizer, compact_now
from dsh.persistence import Persistence, open_backend
from dsh.session import Session, SessionStore
from dsh.testing import CWD, plain

from .conftest import turn

EXAMPLES = int(os.environ.get("DSH_HYPOTHESIS_EXAMPLES", "2"))
ROOT = Path(__file__).resolve().parents[2]
TURN = ["turn/start", "step/start", "user/message", "assistant/message", "step/end", "turn/end"]
MAX_SESSIONS = 5


class StoreMachine(RuleBasedStateMachine):
    """One store of ``kind`` and the model of every session's log."""

    kind = "jsonl"

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="dsh-stateful-"))
        self.url = (f"jsonl://{self.dir}/store" if self.kind == "jsonl"
                    else f"sqlite://{self.dir}/store.db")
        self.persistence = Persistence(open_backend(self.url))
        self.store = SessionStore(self.persistence)
        self.live: dict[str, Session] = {}
        self.flushed: dict[str, int] = {}  # live id -> events durable at its last flush
        self.stored: dict[str, list[str]] = {}  # stored, not live id -> its types on disk
        self.turns = 0
        self.ids = 0

    def teardown(self) -> None:
        self.persistence.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # helpers --------------------------------------------------------------------------------

    def _new_id(self) -> str:
        self.ids += 1
        return f"s{self.ids}"

    def _next_turn(self) -> int:
        self.turns += 1
        return self.turns

    def _on_disk(self, sid: str) -> list[dict[str, Any]]:
        with self.persistence.open(sid) as handle:
            return plain(handle.read().events)

    def _count(self) -> int:
        return len(self.live) + len(self.stored)

    @staticmethod
    def _resumed(types: list[str]) -> list[str]:
        # a resume ends the seed with session/end-seed unless it already ends with one (a fork)
        return types if types[-1:] == ["session/end-seed"] else [*types, "session/end-seed"]

    # rules ----------------------------------------------------------------------------------

    @precondition(lambda self: self._count() < MAX_SESSIONS)
    @rule()
    def new_session(self) -> None:
        sid = self._new_id()
        self.live[sid] = self.store.create(sid, header={"cwd": CWD})
        self.flushed[sid] = 0

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def append_turn(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.live)))
        turn(self.live[sid], self._next_turn())

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def flush(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.live)))
        session = self.live[sid]
        self.store.flush(session)
        self.flushed[sid] = len(session.events)
        assert self._on_disk(sid) == plain(session.events)

    @precondition(lambda self: any(
        sum(e.type == "turn/end" for e in s.events) >= 2 for s in self.live.values()))
    @rule(data=st.data())
    def compact(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(
            k for k, s in self.live.items() if sum(e.type == "turn/end" for e in s.events) >= 2)))
        session = self.live[sid]
        try:
            result = compact_now(session, summarizer=DigestSummarizer(),
                                 flush=lambda: self.store.flush(session))
        except CompactionError:
            return  # refused (a span too small to be worth it): nothing was appended
        if result is not None:
            assert session.events[-1].type == "compaction/end"

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def dispose(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.live)))
        session = self.live.pop(sid)
        del self.flushed[sid]
        self.store.dispose(session)  # drains: everything appended is stored
        self.stored[sid] = [e.type for e in session.events]

    @rule()
    def reopen(self) -> None:
        for sid, session in self.live.items():
            self.stored[sid] = [e.type for e in session.events]
        self.persistence.close()  # drains every live session
        self.live.clear()
        self.flushed.clear()
        self.persistence = Persistence(open_backend(self.url))
        self.store = SessionStore(self.persistence)

    @precondition(lambda self: any(types for types in self.stored.values()))
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(k for k, v in self.stored.items() if v)))
        session = self.store.resume(sid)
        stored = self.stored.pop(sid)
        assert [e.type for e in session.events] == self._resumed(stored)
        self.live[sid] = session
        self.flushed[sid] = len(stored)

    @precondition(lambda self: self._count() < MAX_SESSIONS
                  and any(types for types in self.stored.values()))
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(k for k, v in self.stored.items() if v)))
        child = self.persistence.fork(sid, child_id=self._new_id())
        self.stored[child] = [*self.stored[sid], "session/end-seed"]

    @precondition(lambda self: self._count() < MAX_SESSIONS or any(self.stored.values()))
    @rule(data=st.data(), turns=st.integers(min_value=0, max_value=2))
    def crash(self, data: st.DataObject, turns: int) -> None:
        resumable = sorted(k for k, v in self.stored.items() if v)
        if resumable and (self._count() >= MAX_SESSIONS or data.draw(st.booleans())):
            sid, mode = data.draw(st.sampled_from(resumable)), "resume"
            expected = self._resumed(self.stored[sid]) if turns else self.stored[sid]
        else:
            sid, mode, expected = self._new_id(), "create", []
        first = self.turns + 1
        self.turns += turns + 1
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.persistence._append_child", self.url, sid, mode,
             str(turns), str(first)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None
            counts = []
            for line in child.stdout:
                if line.strip() == "ready":
                    break
                counts.append(int(line))
            else:
                pytest.fail(f"the child writer exited early ({child.wait()})")
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
            if child.stdout is not None:
                child.stdout.close()
        expected = [*expected, *TURN * turns]
        if counts:
            assert counts[-1] == len(expected)
        self.stored[sid] = expected

    # what must be on disk -------------------------------------------------------------------

    @invariant()
    def stored_logs_hold_the_model(self) -> None:
        for sid, types in self.stored.items():
            try:
                on_disk = [e["type"] for e in self._on_disk(sid)]
            except SessionNotFoundError:
                on_disk = []  # created, never written (a JSONL file appears with an event)
            assert on_disk == types, sid
        for sid, session in self.live.items():
            try:
                on_disk_events = self._on_disk(sid)
            except SessionNotFoundError:
                on_disk_events = []
            assert len(on_disk_events) >= self.flushed[sid], sid
            assert on_disk_events == plain(session.events[:len(on_disk_events)]), sid


class SqliteMachine(StoreMachine):
    kind = "sqlite"


_SETTINGS = settings(max_examples=EXAMPLES, stateful_step_count=12, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])

TestJsonlStore = StoreMachine.TestCase
TestJsonlStore.settings = _SETTINGS
TestSqliteStore = SqliteMachine.TestCase
TestSqliteStore.settings = _SETTINGS

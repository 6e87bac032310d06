"""Checkpoint barriers, compaction in the loop, resume.

Rules: docs/agent.md#durability-checkpoints, docs/rules.md#automatic-compaction,
docs/rules.md#resume.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh._errors import SessionBusyError
from dsh.agent import (
    ABORTED_BEFORE_DISPATCH,
    Agent,
    AgentError,
    ScriptedCall,
    ScriptedFailure,
    ScriptedProvider,
    ScriptedReply,
    tool,
)
from dsh.compaction import CompactionPolicy
from dsh.persistence import Persistence, open_backend
from dsh.session import SessionStore
from tests.agent.helpers import CONFIG, assert_verifies, make_agent, types

ran: list[str] = []


@tool
def touch(name: str) -> str:
    """Records that the body ran.

    Args:
        name: Label.
    """
    ran.append(name)
    return name


class _FlushFailures:
    """A store observer whose flush fails (or blocks) on chosen calls."""

    def __init__(self, fail_on: set[int], block_on: frozenset[int] = frozenset()) -> None:
        self.calls = 0
        self.fail_on = fail_on
        self.block_on = block_on
        self.release = threading.Event()
        self.blocked = threading.Event()

    def on_flush(self, session: Any) -> None:
        self.calls += 1
        if self.calls in self.block_on:
            self.blocked.set()
            self.release.wait(10)
        if self.calls in self.fail_on:
            raise OSError("disk gone")


def _store_with(observer: Any) -> SessionStore:
    store = SessionStore()
    store.observe(observer)
    return store


def test_failed_dispatch_checkpoint_fails_the_turn_before_dispatch() -> None:
    provider = ScriptedProvider([ScriptedReply(text="never")])
    agent = make_agent(provider, store=_store_with(_FlushFailures({1})))
    with pytest.raises(OSError, match="disk gone"):
        asyncio.run(agent.run("go"))
    assert provider.requests == []
    assert types(agent.session)[-3:] == ["request/context", "step/end", "turn/end"]
    reason = agent.session.events[-1]["data"]["reason"]
    assert reason["kind"] == "error" and "disk gone" in reason["error"]["message"]


def test_failed_tool_checkpoint_gives_an_error_result_and_skips_the_body() -> None:
    ran.clear()
    provider = ScriptedProvider([
        ScriptedReply(tool_calls=(ScriptedCall(name="touch", arguments={"name": "a"}),)),
        ScriptedReply(text="ok")])
    agent = make_agent(provider, store=_store_with(_FlushFailures({2})), tools=[touch])
    asyncio.run(agent.run("go"))
    assert ran == []
    result = next(e for e in agent.session.events if e["type"] == "tool/result")
    assert result["data"]["error"] == {"name": "OSError", "code": "CHECKPOINT_FAILED"}
    assert_verifies(agent.session)


def test_cancel_during_the_tool_checkpoint_aborts_before_dispatch() -> None:
    ran.clear()
    observer = _FlushFailures(set(), block_on={2})
    provider = ScriptedProvider([
        ScriptedReply(tool_calls=(ScriptedCall(name="touch", arguments={"name": "a"}),))])
    agent = make_agent(provider, store=_store_with(observer), tools=[touch])

    async def scenario() -> None:
        task = asyncio.create_task(agent.run("go"))
        await asyncio.to_thread(observer.blocked.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        observer.release.set()  # the abandoned flush thread may finish now

    try:
        asyncio.run(scenario())
    finally:
        observer.release.set()
    assert ran == []
    result = next(e for e in agent.session.events if e["type"] == "tool/result")
    assert result["data"]["error"] == {"name": "AbortError", "code": ABORTED_BEFORE_DISPATCH}
    assert result["data"]["message"]["content"][0]["content"] == [
        {"type": "text", "text": "Error: tool call aborted before dispatch"}]
    assert agent.session.events[-1]["data"]["reason"]["kind"] == "aborted"
    assert_verifies(agent.session)


def _history(agent: Agent, turns: int) -> None:
    for i in range(turns):
        asyncio.run(agent.run(f"question {i} " + "words " * 40))


def test_context_overflow_compacts_and_retries_once() -> None:
    replies: list[Any] = [ScriptedReply(text="answer " * 30) for _ in range(4)]
    replies += [ScriptedFailure(code="CONTEXT_OVERFLOW", context_overflow=True),
                ScriptedReply(text="fits now")]
    provider = ScriptedProvider(replies)
    agent = make_agent(provider, context_window=100_000,
                       compaction=CompactionPolicy(retain_tokens=50))
    _history(agent, 4)
    start = agent.session.seq
    result = asyncio.run(agent.run("last"))
    assert result.text == "fits now"
    kinds = types(agent.session, start)
    assert kinds.index("compaction/start") < kinds.index("compaction/end") < kinds.index(
        "assistant/message")
    retry = next(e for e in agent.session.events[start:] if e["type"] == "llm/retry")
    assert retry["data"]["cause"] == "context-overflow"
    summary_start = next(e for e in agent.session.events[start:]
                         if e["type"] == "compaction/start")
    assert summary_start["data"]["turn"] == result.turn
    assert len(provider.requests[-1].messages) < len(provider.requests[-2].messages)
    assert_verifies(agent.session)


def test_second_overflow_is_not_retried_again() -> None:
    replies: list[Any] = [ScriptedReply(text="answer " * 30) for _ in range(3)]
    replies += [ScriptedFailure(code="CONTEXT_OVERFLOW", context_overflow=True)] * 2
    agent = make_agent(ScriptedProvider(replies), context_window=100_000,
                       compaction=CompactionPolicy(retain_tokens=50))
    _history(agent, 3)
    with pytest.raises(Exception, match="scripted failure"):
        asyncio.run(agent.run("last"))
    assert agent.session.events[-1]["data"]["reason"]["error"]["code"] == "CONTEXT_OVERFLOW"
    assert_verifies(agent.session)


def test_pressure_compacts_before_a_step_with_the_turn_as_owner() -> None:
    provider = ScriptedProvider([ScriptedReply(text="answer " * 60) for _ in range(6)])
    agent = make_agent(provider, context_window=2_000,
                       compaction=CompactionPolicy(threshold_ratio=0.5, retain_tokens=100))
    _history(agent, 6)
    starts = [e for e in agent.session.events if e["type"] == "compaction/start"]
    assert starts and all(type(e["data"]["turn"]) is int for e in starts)
    assert_verifies(agent.session)


# --- resume -------------------------------------------------------------------------------


def _stored_turn(url: str) -> None:
    with dsh.open(url) as opened:
        store = opened.sessions
        agent = make_agent(ScriptedProvider([ScriptedReply(text="one")]), store=store)
        asyncio.run(agent.run("first"))


@pytest.mark.parametrize("scheme", ["jsonl", "sqlite"])
def test_resume_continues_numbering_and_logs_a_resume_header(tmp_path: Path,
                                                             scheme: str) -> None:
    url = f"jsonl://{tmp_path}" if scheme == "jsonl" else f"sqlite://{tmp_path}/s.db"
    _stored_turn(url)
    with dsh.open(url) as opened:
        stored = opened.read("s1").stored_events
        store = opened.sessions
        provider = ScriptedProvider([ScriptedReply(text="two")])

        async def scenario() -> Agent:
            agent = await Agent.resume(store, "s1", provider, config=CONFIG)
            await agent.run("second")
            return agent

        agent = asyncio.run(scenario())
        events = agent.session.events
        assert list(events[:len(stored)]) == list(stored)
        assert events[len(stored)]["type"] == "session/end-seed"
        assert agent.session.first_live_seq == len(stored)
        turn_starts = [e["data"]["turn"] for e in events if e["type"] == "turn/start"]
        assert turn_starts == [1, 2]
        headers = [e["data"]["reason"] for e in events if e["type"] == "request/header"]
        assert headers == ["initial", "resume"]
        assert [m["role"] for m in provider.requests[0].messages] == ["user", "assistant",
                                                                       "user"]


def test_resume_of_a_live_session_is_refused(tmp_path: Path) -> None:
    with dsh.open(f"jsonl://{tmp_path}") as opened:
        store = opened.sessions
        agent = make_agent(ScriptedProvider([ScriptedReply(text="one")]), store=store)
        asyncio.run(agent.run("first"))
        with pytest.raises(SessionBusyError, match="while it is live"):
            asyncio.run(Agent.resume(store, "s1", ScriptedProvider(), config=CONFIG))


def test_resume_without_persistence_is_refused() -> None:
    with pytest.raises(Exception, match="no persistence") as info:
        asyncio.run(Agent.resume(SessionStore(), "s1", ScriptedProvider(), config=CONFIG))
    assert getattr(info.value, "code", None) == "NO_PERSISTENCE"


def test_pending_prompt_survives_persist_and_resume(tmp_path: Path) -> None:
    url = f"jsonl://{tmp_path}"
    with dsh.open(url) as opened:
        store = opened.sessions
        agent = make_agent(ScriptedProvider(), store=store)
        agent.send("do it later")
        store.flush(agent.session)
    with dsh.open(url) as opened:
        store = opened.sessions
        provider = ScriptedProvider([ScriptedReply(text="done")])

        async def scenario() -> Any:
            resumed = await Agent.resume(store, "s1", provider, config=CONFIG)
            assert [m["content"][0]["text"] for m in resumed.inbox.next_turn] == ["do it later"]
            return await resumed.run()

        result = asyncio.run(scenario())
        assert (result.turn, result.text) == (1, "done")


class _BlockingHandle:
    """A write handle whose first read never returns until the handle is closed."""

    def __init__(self, inner: Any, reads: list[Any]) -> None:
        self._inner = inner
        self._reads = reads
        self.closed = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def read(self, offset: int = 0) -> Any:
        self._reads.append(self)
        self.closed.wait()  # a backend read that hangs (a stuck disk, a dead NFS server)
        raise OSError("read abandoned: handle closed")

    def close(self) -> None:
        self.closed.set()
        self._inner.close()


class _BlockingBackend:
    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.reads: list[_BlockingHandle] = []
        self.block = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def open(self, session_id: str, mode: Any = "read") -> Any:
        handle = self._inner.open(session_id, mode)
        return _BlockingHandle(handle, self.reads) if self.block and mode == "write" else handle

    def list_headers(self) -> Iterator[Mapping[str, Any]]:
        return self._inner.list_headers()  # type: ignore[no-any-return]


@pytest.mark.parametrize("how", ["timeout", "cancel"])
def test_resume_is_cancellable_and_a_later_resume_succeeds(tmp_path: Path, how: str) -> None:
    url = f"jsonl://{tmp_path}"
    _stored_turn(url)
    backend = _BlockingBackend(open_backend(url))
    persistence = Persistence(backend)  # type: ignore[arg-type]
    store = SessionStore(persistence=persistence)

    async def first() -> None:
        if how == "timeout":
            with pytest.raises(AgentError) as info:
                await Agent.resume(store, "s1", ScriptedProvider(), config=CONFIG,
                                   timeout_ms=200)
            assert info.value.code == "RESUME_TIMEOUT"
        else:
            task = asyncio.create_task(Agent.resume(store, "s1", ScriptedProvider(),
                                                    config=CONFIG))
            while not backend.reads:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(first())
    assert len(backend.reads) == 1 and backend.reads[0].closed.is_set()
    assert store.get("s1") is None
    backend.block = False

    async def second() -> Agent:
        agent = await Agent.resume(store, "s1", ScriptedProvider([ScriptedReply(text="2")]),
                                   config=CONFIG)
        await agent.run("again")
        return agent

    agent = asyncio.run(second())
    assert [e["data"]["turn"] for e in agent.session.events if e["type"] == "turn/start"] == [
        1, 2]
    persistence.close()

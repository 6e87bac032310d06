"""The agent loop, step by step.

Rule: docs/agent.md#the-turn, docs/rules.md#request--projection,
    docs/agent.md#durability-checkpoints, docs/rules.md#resume.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dsh._errors import InvariantError
from dsh.agent import (
    ABORTED_BEFORE_DISPATCH,
    AgentError,
    LlmFailureError,
    LlmRequest,
    RetryPolicy,
    ScriptedCall,
    ScriptedFailure,
    ScriptedProvider,
    ScriptedReply,
    ScriptedStall,
    tool,
)
from dsh.session import SessionStore
from tests.agent.helpers import assert_verifies, compact_types, make_agent, types

pytestmark = pytest.mark.no_speedups


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _calls(*names_args: tuple[str, dict[str, Any]]) -> tuple[ScriptedCall, ...]:
    return tuple(ScriptedCall(name=n, arguments=a) for n, a in names_args)


def _results(session: Any) -> list[Any]:
    return [e for e in session.events if e["type"] == "tool/result"]


def _result_text(event: Any) -> str:
    return str(event["data"]["message"]["content"][0]["content"][0]["text"])


def test_one_tool_turn_writes_the_spec_event_order() -> None:
    provider = ScriptedProvider([
        ScriptedReply(text="adding", tool_calls=_calls(("add", {"a": 1, "b": 2}))),
        ScriptedReply(text="It is 3.")])
    agent = make_agent(provider, system="Be brief.")
    result = _run(agent.run("What is 1+2?"))
    assert (result.turn, dict(result.reason), result.steps, result.text) == (
        1, {"kind": "completed"}, 2, "It is 3.")
    assert compact_types(agent.session) == [
        "agent/inbox/spliced", "turn/start", "agent/inbox/spliced", "step/start",
        "user/message", "request/header", "request/context", "chunks", "assistant/message",
        "tool/call", "tool/result", "step/end", "step/start", "chunks", "assistant/message",
        "step/end", "turn/end"]
    events = agent.session.events
    splices = [e for e in events if e["type"] == "agent/inbox/spliced"]
    assert all(e["ignorable"] is True for e in splices)
    assert splices[1]["data"] == {"target": "next-turn", "start": 0, "removedCount": 1,
                                  "inserted": []}
    message = next(e for e in events if e["type"] == "assistant/message")
    chunk_seqs = [e["seq"] for e in events if e["type"] == "assistant/chunk"
                  and e["data"]["step"] == 1]
    assert message["sourceEventSeqs"] == chunk_seqs
    assert _result_text(_results(agent.session)[0]) == "3"
    # the second request carried exactly the log's projection at that time
    second = provider.requests[1]
    assert [m["role"] for m in second.messages] == ["user", "assistant", "user"]
    assert second.system == "Be brief." and [t["name"] for t in second.tools] == ["add", "fail"]
    assert agent.invariant_stats.checks == 2
    assert_verifies(agent.session)


def test_turn_numbering_continues_and_header_changes_only_when_needed() -> None:
    provider = ScriptedProvider([ScriptedReply(text="one"), ScriptedReply(text="two")])
    agent = make_agent(provider)
    _run(agent.run("first"))
    start = agent.session.seq
    result = _run(agent.run("second"))
    assert result.turn == 2
    assert "request/header" not in types(agent.session, start)
    assert_verifies(agent.session)


def test_parallel_calls_run_together_and_commit_in_model_order() -> None:
    started: list[str] = []
    gate = asyncio.Event()

    @tool(parallel_safe=True)
    async def slow(name: str, wait: bool) -> str:
        """Record the start, optionally wait for the gate.

        Args:
            name: Label.
            wait: Whether to wait.
        """
        started.append(name)
        if wait:
            await gate.wait()
        else:
            gate.set()
        return name

    provider = ScriptedProvider([
        ScriptedReply(tool_calls=_calls(("slow", {"name": "a", "wait": True}),
                                        ("slow", {"name": "b", "wait": False}))),
        ScriptedReply(text="done")])
    agent = make_agent(provider, tools=[slow])
    _run(agent.run("go"))
    # b ran while a waited (a needed b to open the gate), yet a's result comes first
    assert started == ["a", "b"]
    assert [_result_text(e) for e in _results(agent.session)] == ["a", "b"]
    assert_verifies(agent.session)


def test_exclusive_calls_are_barriers_and_the_pool_is_bounded() -> None:
    active = 0
    peak = 0
    order: list[str] = []

    @tool(parallel_safe=True)
    async def reader(n: int) -> int:
        """Parallel-safe.

        Args:
            n: Label.
        """
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0)
        order.append(f"r{n}")
        active -= 1
        return n

    @tool
    async def writer(n: int) -> int:
        """Exclusive.

        Args:
            n: Label.
        """
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        assert active == 1
        order.append(f"w{n}")
        active -= 1
        return n

    calls = [("reader", {"n": i}) for i in range(5)] + [("writer", {"n": 9})] + [
        ("reader", {"n": 10})]
    provider = ScriptedProvider([ScriptedReply(tool_calls=_calls(*calls)),
                                 ScriptedReply(text="ok")])
    agent = make_agent(provider, tools=[reader, writer], max_parallel_tool_calls=2)
    _run(agent.run("go"))
    assert peak == 2
    assert order.index("w9") > max(order.index(f"r{i}") for i in range(5))
    assert order.index("r10") > order.index("w9")
    assert [_result_text(e) for e in _results(agent.session)] == [
        "0", "1", "2", "3", "4", "9", "10"]
    assert_verifies(agent.session)


def test_tool_failures_become_error_results_with_identity() -> None:
    provider = ScriptedProvider([
        ScriptedReply(tool_calls=_calls(("fail", {"reason": "disk full"}), ("nope", {}),
                                        ("add", {"a": "x", "b": 1}))),
        ScriptedReply(text="sorry")])
    agent = make_agent(provider)
    _run(agent.run("go"))
    results = _results(agent.session)
    assert [r["data"]["error"] for r in results] == [
        {"name": "RuntimeError", "code": "TOOL_ERROR"},
        {"name": "UnknownToolError", "code": "UNKNOWN_TOOL"},
        {"name": "ToolArgumentsError", "code": "INVALID_ARGUMENTS"}]
    assert all(r["data"]["message"]["content"][0]["isError"] is True for r in results)
    assert "disk full" in _result_text(results[0])
    assert_verifies(agent.session)


def test_retryable_failures_are_retried_with_recorded_backoff() -> None:
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    provider = ScriptedProvider([
        ScriptedFailure(code="RATE_LIMITED", retryable=True, after_text="partial"),
        ScriptedFailure(code="OVERLOADED", retryable=True, retry_after_ms=1234, as_finish=True),
        ScriptedReply(text="finally")])
    agent = make_agent(provider, sleep=fake_sleep,
                       retry=RetryPolicy(max_retries=3, base_delay_ms=100))
    result = _run(agent.run("go"))
    assert result.text == "finally"
    assert slept == [0.1, 1.234]
    events = agent.session.events
    retries = [e for e in events if e["type"] == "llm/retry"]
    assert [(r["data"]["attempt"], r["data"]["delayMs"], r["data"]["failure"]["code"])
            for r in retries] == [(1, 100, "RATE_LIMITED"), (2, 1234, "OVERLOADED")]
    assert all(r["ignorable"] is True for r in retries)
    message = next(e for e in events if e["type"] == "assistant/message")
    last_retry = retries[-1]["seq"]
    assert message["sourceEventSeqs"] and min(message["sourceEventSeqs"]) > last_retry
    assert message["data"]["message"]["content"] == [{"type": "text", "text": "finally"}]
    assert_verifies(agent.session)


def test_exhausted_or_fatal_failure_ends_the_turn_with_the_failure() -> None:
    provider = ScriptedProvider([ScriptedFailure(code="BAD_REQUEST", message="no")])
    agent = make_agent(provider)
    with pytest.raises(LlmFailureError):
        _run(agent.run("go"))
    end = agent.session.events[-1]
    assert end["data"] == {"turn": 1, "reason": {"kind": "error", "error": {
        "message": "no", "code": "BAD_REQUEST"}}}
    assert "assistant/message" not in types(agent.session)
    assert_verifies(agent.session)


def test_max_tokens_is_sticky_and_runs_no_tool() -> None:
    provider = ScriptedProvider([ScriptedReply(text="cut", finish="max-tokens",
                                               tool_calls=_calls(("add", {"a": 1, "b": 1})))])
    agent = make_agent(provider)
    result = _run(agent.run("go"))
    assert dict(result.reason) == {"kind": "max-tokens"}
    results = _results(agent.session)
    assert [r["data"]["error"]["code"] for r in results] == [ABORTED_BEFORE_DISPATCH]
    assert_verifies(agent.session)


def test_max_steps_guard_ends_the_turn() -> None:
    loop_forever = [ScriptedReply(tool_calls=_calls(("add", {"a": 1, "b": 1})))] * 3
    agent = make_agent(ScriptedProvider(loop_forever), max_steps=2)
    with pytest.raises(AgentError) as info:
        _run(agent.run("go"))
    assert info.value.code == "MAX_STEPS"
    reason = agent.session.events[-1]["data"]["reason"]
    assert reason["kind"] == "error" and "max_steps=2" in reason["error"]["message"]
    assert types(agent.session).count("step/start") == 2
    assert_verifies(agent.session)


def test_steering_during_tools_enters_at_the_next_step() -> None:
    agent_box: list[Any] = []

    @tool
    async def slow() -> str:
        """Steers the agent while running."""
        agent_box[0].steer("also check b")
        return "a done"

    provider = ScriptedProvider([ScriptedReply(tool_calls=_calls(("slow", {}))),
                                 ScriptedReply(text="both done")])
    agent = make_agent(provider, tools=[slow])
    agent_box.append(agent)
    _run(agent.run("check a"))
    kinds = compact_types(agent.session)
    result_at = kinds.index("tool/result")
    steering_at = kinds.index("user/message", result_at)
    assert kinds[result_at:steering_at + 1] == ["tool/result", "step/end", "agent/inbox/spliced",
                                                "step/start", "user/message"]
    second = provider.requests[1]
    assert [m["role"] for m in second.messages] == ["user", "assistant", "user", "user"]
    assert second.messages[-1]["content"] == [{"type": "text", "text": "also check b"}]
    assert_verifies(agent.session)


def test_steering_after_the_final_answer_runs_another_step() -> None:
    provider = ScriptedProvider([ScriptedReply(text="first"), ScriptedReply(text="second")])
    agent = make_agent(provider)
    agent.steer("one more thing")
    agent.send("hello")
    result = _run(agent.run())
    assert result.steps == 1 and result.text == "first"
    # the steering was claimed by the first step together with the prompt
    assert [m["content"][0]["text"] for m in provider.requests[0].messages] == [
        "hello", "one more thing"]


def test_request_hook_divergence_raises_invariant_error_and_ends_the_turn() -> None:
    def hook(request: LlmRequest) -> LlmRequest:
        return LlmRequest(session_id=request.session_id, messages=request.messages[:-1],
                          header=request.header)

    provider = ScriptedProvider([ScriptedReply(text="never")])
    agent = make_agent(provider, request_hook=hook)
    with pytest.raises(InvariantError, match="request == projection"):
        _run(agent.run("go"))
    assert provider.requests == []
    assert agent.session.events[-1]["data"]["reason"]["kind"] == "error"
    assert_verifies(agent.session)


def test_hook_with_equal_copies_passes_the_slow_path() -> None:
    def hook(request: LlmRequest) -> LlmRequest:
        return LlmRequest(session_id=request.session_id, messages=tuple(list(request.messages)),
                          header=request.header)

    agent = make_agent(ScriptedProvider([ScriptedReply(text="ok")]), request_hook=hook)
    _run(agent.run("go"))
    assert (agent.invariant_stats.checks, agent.invariant_stats.fast) == (1, 0)


def test_cancel_mid_stream_records_the_visible_prefix() -> None:
    provider = ScriptedProvider([ScriptedStall(after_text="Partial answer")])
    agent = make_agent(provider)

    async def scenario() -> None:
        task = asyncio.create_task(agent.run("go"))
        await provider.stalled.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    _run(scenario())
    events = agent.session.events
    message = next(e for e in events if e["type"] == "assistant/message")
    assert message["data"]["interrupted"] is True
    assert message["data"]["message"]["content"] == [{"type": "text", "text": "Partial answer"}]
    assert message["sourceEventSeqs"] == [e["seq"] for e in events
                                          if e["type"] == "assistant/chunk"]
    assert types(agent.session)[-2:] == ["step/end", "turn/end"]
    assert events[-1]["data"]["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}
    assert not agent.running
    assert_verifies(agent.session)


def test_cancel_before_visible_content_finalizes_nothing() -> None:
    provider = ScriptedProvider([ScriptedStall()])
    agent = make_agent(provider)

    async def scenario() -> None:
        task = asyncio.create_task(agent.run("go"))
        await provider.stalled.wait()
        assert agent.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    _run(scenario())
    assert "assistant/message" not in types(agent.session)
    assert_verifies(agent.session)


def test_cancel_while_tools_run_drains_started_and_aborts_unstarted() -> None:
    entered = asyncio.Event()

    @tool
    async def hang() -> str:
        """Waits forever."""
        entered.set()
        await asyncio.Event().wait()
        return "never"

    provider = ScriptedProvider([ScriptedReply(tool_calls=_calls(("hang", {}),
                                                                 ("add", {"a": 1, "b": 2})))])
    agent = make_agent(provider, tools=[hang, *make_agent_tools()])

    async def scenario() -> None:
        task = asyncio.create_task(agent.run("go"))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    _run(scenario())
    results = _results(agent.session)
    assert [r["data"]["error"]["code"] for r in results] == ["ABORTED", ABORTED_BEFORE_DISPATCH]
    kinds = types(agent.session)
    assert kinds.count("tool/call") == 2  # the unstarted call got a synthetic tool/call
    assert kinds[-2:] == ["step/end", "turn/end"]
    assert_verifies(agent.session)


def make_agent_tools() -> list[Any]:
    from tests.agent.helpers import add
    return [add]


def test_run_refuses_when_busy_or_idle() -> None:
    provider = ScriptedProvider([ScriptedStall()])
    agent = make_agent(provider)
    with pytest.raises(AgentError) as idle:
        _run(agent.run())
    assert idle.value.code == "NOTHING_TO_RUN"

    async def scenario() -> None:
        task = asyncio.create_task(agent.run("go"))
        await provider.stalled.wait()
        with pytest.raises(AgentError) as busy:
            await agent.run("again")
        assert busy.value.code == "NOT_IDLE"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    _run(scenario())


def test_inbox_is_rebuilt_from_the_log() -> None:
    store = SessionStore()
    provider = ScriptedProvider([ScriptedReply(text="ok")])
    agent = make_agent(provider, store=store)
    agent.send("later")
    agent.steer("steer")
    agent.inbox.cancel("next-step")
    from dsh.agent import Agent
    rebuilt = Agent(agent.session, provider, config={"provider": "p", "model": "m"})
    assert [m["content"][0]["text"] for m in rebuilt.inbox.next_turn] == ["later"]
    assert rebuilt.inbox.next_step == ()
    with pytest.raises(AgentError, match="already in the inbox"):
        rebuilt.inbox.push("next-turn", rebuilt.inbox.next_turn[0])


def test_before_step_refusal_ends_the_turn_blocked_without_step_events() -> None:
    provider = ScriptedProvider([ScriptedReply(text="never")])
    agent = make_agent(provider, before_step=lambda turn, step: False)
    result = _run(agent.run("go"))
    assert dict(result.reason) == {"kind": "blocked"} and result.steps == 0
    assert types(agent.session) == ["agent/inbox/spliced", "turn/start", "agent/inbox/spliced",
                                    "turn/end"]
    assert provider.requests == []


def test_aclose_aborts_a_running_turn_as_disposed_and_releases_the_session() -> None:
    provider = ScriptedProvider([ScriptedStall(after_text="hi")])
    store = SessionStore()
    agent = make_agent(provider, store=store)

    async def scenario() -> None:
        task = asyncio.create_task(agent.run("go"))
        await provider.stalled.wait()
        await agent.aclose()
        assert task.done()
        with pytest.raises(asyncio.CancelledError):
            await task
        await agent.aclose()  # idempotent

    _run(scenario())
    assert agent.session.events[-1]["data"]["reason"] == {"kind": "aborted",
                                                          "reason": {"kind": "disposed"}}
    assert store.get("s1") is None
    assert_verifies(agent.session)

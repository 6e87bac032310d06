"""Property: random scripted conversations always leave a log that verifies, and every request
equalled the log's projection at dispatch (docs/rules.md#request--projection,
docs/agent.md#the-recorder).

Conversations mix text, tool calls, parallel calls, tool errors, retryable and fatal provider
errors, steering while tools run, and cancellation at a random event. Example count:
``DSH_AGENT_EXAMPLES`` (else ``DSH_HYPOTHESIS_EXAMPLES``, default 25).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh.agent import (
    Agent,
    AgentError,
    LlmFailureError,
    LlmRequest,
    RetryPolicy,
    ScriptedCall,
    ScriptedFailure,
    ScriptedProvider,
    ScriptedReply,
    tool,
)
from dsh.json import dumps
from dsh.session import Session, SessionStore
from tests.agent.helpers import assert_verifies
from tests.strategies import examples

EXAMPLES = int(os.environ.get("DSH_AGENT_EXAMPLES") or examples(25))

_agent: list[Agent] = []


@tool(parallel_safe=True)
async def ok(n: int) -> str:
    """Parallel-safe and fine.

    Args:
        n: Label.
    """
    await asyncio.sleep(0)
    return f"ok {n}"


@tool
def boom(n: int) -> str:
    """Exclusive and failing.

    Args:
        n: Label.
    """
    raise ValueError(f"boom {n}")


@tool(parallel_safe=True)
async def steer(n: int) -> str:
    """Steers the running agent.

    Args:
        n: Label.
    """
    _agent[0].steer(f"steering {n}")
    return "steered"


calls = st.lists(st.tuples(st.sampled_from(["ok", "boom", "steer", "missing"]),
                           st.integers(0, 9)), min_size=1, max_size=4)
reply = st.one_of(
    st.builds(lambda text, reasoning: ScriptedReply(text=text, reasoning=reasoning),
              st.text(max_size=12), st.sampled_from(["", "hmm"])),
    st.builds(lambda cs, text: ScriptedReply(text=text, tool_calls=tuple(
        ScriptedCall(name=name, arguments={"n": n}) for name, n in cs)), calls,
              st.sampled_from(["", "calling"])),
    st.just(ScriptedFailure(code="RATE_LIMITED", retryable=True, after_text="par")),
    st.just(ScriptedFailure(code="OVERLOADED", retryable=True, as_finish=True)),
    st.just(ScriptedFailure(code="BAD_REQUEST")),
    st.just(ScriptedReply(text="long", finish="max-tokens")),
)
conversation = st.lists(st.tuples(st.lists(reply, min_size=1, max_size=6),
                                  st.one_of(st.none(), st.integers(1, 60))),
                        min_size=1, max_size=3)


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(conversation)
def test_random_conversations_verify_and_requests_equal_the_projection(
        turns: list[tuple[list[Any], int | None]]) -> None:
    dispatched: list[tuple[int, LlmRequest]] = []
    provider = ScriptedProvider(on_request=lambda r: dispatched.append((session.seq, r)))

    async def no_sleep(seconds: float) -> None:
        del seconds

    store = SessionStore()
    agent = Agent.create(store, provider, session_id="p", config={"provider": "s", "model": "m"},
                         tools=[ok, boom, steer], max_steps=4, sleep=no_sleep,
                         retry=RetryPolicy(max_retries=1, base_delay_ms=1))
    session = agent.session
    _agent[:] = [agent]

    async def drive() -> None:
        for index, (script, cancel_after) in enumerate(turns):
            provider.extend(script)
            stop_at = session.seq + cancel_after if cancel_after is not None else None

            def maybe_cancel(live: Any, event: Any, stop_at: int | None = stop_at) -> None:
                if stop_at is not None and event["seq"] >= stop_at:
                    agent.cancel()

            unsubscribe = session.observe(maybe_cancel)
            try:
                await asyncio.create_task(agent.run(f"turn {index}"))
            except (asyncio.CancelledError, LlmFailureError, AgentError):
                pass  # the turn ended aborted / error; the log must still be well formed
            finally:
                unsubscribe()
            agent.inbox.cancel()  # leftovers from a cancelled turn do not leak into the next
            provider.extend([])

    asyncio.run(drive())
    assert_verifies(session)
    events = list(session.events)
    for seq, request in dispatched:
        offline = Session.create("offline", seed=events[:seq]).derive_messages()
        assert [dumps(m) for m in request.messages] == [dumps(m) for m in offline]
    assert agent.invariant_stats.checks == len(dispatched)


ops = st.lists(st.sampled_from([
    "turn", "end_turn", "step", "end_step", "user", "request", "chunk", "discard",
    "assistant_text", "assistant_calls", "call_c1", "call_c2", "result_c1", "result_c2",
    "result_x", "custom", "custom_core"]), max_size=40)


@settings(max_examples=EXAMPLES * 4, deadline=None)
@given(ops)
def test_any_sequence_of_recorder_calls_leaves_a_well_formed_log(sequence: list[str]) -> None:
    from dsh.agent import Recorder

    session = SessionStore().create("r")
    recorder = Recorder(session)
    turn: Any = None
    step: Any = None
    calls = [{"type": "tool-call", "id": "c1", "name": "a", "arguments": "{}"},
             {"type": "tool-call", "id": "c2", "name": "b", "arguments": "{}"}]
    for op in sequence:
        try:
            if op == "turn":
                turn = recorder.turn()
            elif op == "end_turn" and turn is not None:
                turn.end()
            elif op == "step" and turn is not None:
                step = turn.step()
            elif op == "end_step" and step is not None:
                step.end()
            elif op == "user":
                (step.user_message("u") if step is not None else recorder.user_message("u"))
            elif step is None:
                continue
            elif op == "request":
                step.request({"provider": "p", "model": "m"})
            elif op == "chunk":
                step.chunk({"type": "text-delta", "index": 0, "text": "t"})
            elif op == "discard":
                step.discard_attempt()
            elif op == "assistant_text":
                step.assistant("hi", provider="p", model="m")
            elif op == "assistant_calls":
                step.assistant(calls, provider="p", model="m")
            elif op.startswith("call_"):
                step.tool_call(op[5:])
            elif op.startswith("result_"):
                step.tool_result(op[7:], "r")
            elif op == "custom":
                recorder.custom("test/note", {"n": 1})
            elif op == "custom_core":
                recorder.custom("tool/result", {})
        except AgentError as error:
            assert error.code == "RECORDER"
    if turn is not None:
        turn.end()
    assert_verifies(session)

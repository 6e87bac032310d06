"""Type-checked by mypy --strict (scripts/test): dsh.agent's public types as a user sees them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import assert_type

from dsh import Event, Store
from dsh._messages import StreamChunk
from dsh.agent import (
    Agent,
    LlmRequest,
    Provider,
    Recorder,
    ScriptedProvider,
    ScriptedReply,
    StepRecorder,
    Tool,
    TurnRecorder,
    TurnResult,
    tool,
)
from dsh.agent.providers import (
    AnthropicProvider,
    OpenAIChatProvider,
    create_provider,
    provider_summarizer,
)
from dsh.compaction import LlmSummarizer
from dsh.json import FrozenDict
from dsh.session import SessionStore


class EchoProvider:
    """A provider written against the protocol, without subclassing anything."""

    async def stream(self, request: LlmRequest) -> AsyncIterator[StreamChunk]:
        yield {"type": "text-delta", "index": 0, "text": request.model}
        yield {"type": "finish", "reason": {"kind": "stop"}}


@tool(parallel_safe=True)
def add(a: int, b: int) -> int:
    """Add.

    Args:
        a: First.
        b: Second.
    """
    return a + b


async def use_the_agent(store: Store) -> None:
    provider: Provider = EchoProvider()
    assert_type(add, Tool)
    agent = await store.agent(provider=provider, config={"provider": "p", "model": "m"},
                              tools=[add])
    result = await agent.run("hi")
    assert_type(result, TurnResult)
    assert_type(result.reason, FrozenDict)
    resumed = await store.agent("s1", provider=ScriptedProvider([ScriptedReply(text="x")]),
                                config={"provider": "p", "model": "m"}, timeout_ms=1000)
    assert_type(resumed, Agent)


def use_the_core_store(store: SessionStore) -> None:
    agent = Agent.create(store, EchoProvider(), config={"provider": "p", "model": "m"})
    assert_type(agent, Agent)


def use_the_recorder(store: Store) -> None:
    recorder = store.recorder("typed-recorder")
    assert_type(recorder, Recorder)
    with recorder.turn() as turn, turn.step() as step:
        assert_type(turn, TurnRecorder)
        assert_type(step, StepRecorder)
        assert_type(step.assistant("ok", provider="p", model="m"), Event)


def use_the_providers() -> None:
    # dsh.agent and dsh.agent.providers load these lazily (PEP 562); their types stay exact.
    provider = create_provider("openai", env={"OPENAI_API_KEY": "k"})
    assert_type(provider, OpenAIChatProvider | AnthropicProvider)
    assert_type(provider_summarizer(provider, provider_name="openai", model="m"), LlmSummarizer)

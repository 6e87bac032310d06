"""Shared builders for the agent-loop tests."""

from __future__ import annotations

from typing import Any

from dsh._verify import verify_events
from dsh.agent import Agent, Provider, tool
from dsh.session import Session, SessionStore

CONFIG = {"provider": "scripted", "model": "m1"}


@tool(parallel_safe=True)
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


@tool
def fail(reason: str) -> str:
    """Always fails.

    Args:
        reason: What to fail with.
    """
    raise RuntimeError(reason)


def make_agent(provider: Provider, *, store: SessionStore | None = None, **options: Any) -> Agent:
    store = store or SessionStore()
    options.setdefault("config", CONFIG)
    options.setdefault("tools", [add, fail])
    return Agent.create(store, provider, session_id="s1", **options)


def types(session: Session, start: int = 0) -> list[str]:
    return [e["type"] for e in session.events[start:]]


def compact_types(session: Session, start: int = 0) -> list[str]:
    """Event types with runs of assistant/chunk folded into one 'chunks'."""
    out: list[str] = []
    for kind in types(session, start):
        if kind == "assistant/chunk":
            if out and out[-1] == "chunks":
                continue
            kind = "chunks"
        out.append(kind)
    return out


def assert_verifies(session: Session) -> None:
    events = [e for e in session.events]
    if events and events[-1]["type"] == "session/end-seed":
        events.pop()
    assert verify_events(events, header=session.header) == []

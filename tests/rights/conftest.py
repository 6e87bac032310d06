"""Fixtures for the rights tests: a session with secrets in every place, on every real backend.

``kind`` runs a test on raw JSONL, JSONL with Zstandard, SQLite and PostgreSQL (a throw-away
schema; skipped loudly only when no server answers). Rule: docs/forgetting.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh.testing._stores import postgres_unreachable, store_url, temporary_postgres_url

KINDS = ("jsonl", "jsonl-zstd", "sqlite", "postgresql")
REPO = Path(__file__).resolve().parents[2]

SECRETS = {
    "user": "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7cDe0fGh3iJk6l",
    "tool": "AKIAIOSFODNN7EXAMPLE",
    "reasoning": "ghp_1234567890abcdefghijklmnopqrstuvwxyzAB",
    "arguments": "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
}
"""One secret per place a transcript leaks one: a prompt, a tool output, a reasoning block and
a tool call's arguments (each a format the detectors know)."""


@pytest.fixture(params=KINDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    kind: str = request.param
    if kind != "postgresql":
        yield store_url(kind, tmp_path)
        return
    reason = postgres_unreachable()
    if reason is not None:
        pytest.skip(f"SKIPPED LOUDLY: {reason}")
    with temporary_postgres_url() as pg:
        yield pg


def build(url: str, session_id: str = "s1", *, padding: int = 0) -> None:
    """Write a two-turn session: a prompt holding a key, a reasoning block and a tool call
    whose output holds another, then a plain answer and a second plain turn. ``padding``
    lines of filler follow the tool output (a session worth compacting)."""
    with dsh.open(url) as store:
        recorder = store.recorder(session_id)
        with recorder.turn() as turn:
            with turn.step() as step:
                step.user_message(f"deploy with my key {SECRETS['user']} please")
                step.request({"provider": "deepseek", "model": "deepseek-chat"})
                step.assistant([
                    {"type": "reasoning", "text": f"the token {SECRETS['reasoning']} is old"},
                    {"type": "text", "text": "Reading the env file."},
                    {"type": "tool-call", "id": "c1", "name": "read",
                     "arguments": f'{{"path": ".env", "auth": "{SECRETS["arguments"]}"}}'}])
                step.tool_call("c1")
                step.tool_result("c1", f"AWS_ACCESS_KEY_ID={SECRETS['tool']}\nREGION=eu"
                                 + "".join(f"\nline {i} of the file" for i in range(padding)))
            with turn.step() as step:
                step.assistant("Deployed.")
        with recorder.turn() as turn, turn.step() as step:
            step.user_message("thanks, anything else?")
            step.assistant("No, all done.")


def run_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``python -m dsh.cli ARGS`` in a real process; the result with text output."""
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "dsh.cli", *args], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=120)
    if check:
        assert done.returncode == 0, done.stderr + done.stdout
    return done


def assert_valid_openai(body: dict[str, Any]) -> None:
    """Chat Completions rules: every ``tool`` message answers a call of the assistant message
    before it, every call is answered before the next non-tool message."""
    pending: list[str] = []
    for message in body["messages"]:
        role = message["role"]
        if role == "tool":
            assert message["tool_call_id"] in pending, f"orphan tool message {message}"
            pending.remove(message["tool_call_id"])
            continue
        assert not pending, f"calls {pending} unanswered before a {role} message"
        if role == "assistant":
            pending = [c["id"] for c in message.get("tool_calls") or []]
    assert not pending, f"calls {pending} never answered"


def assert_valid_anthropic(body: dict[str, Any]) -> None:
    """Messages API rules: roles alternate starting with user, each ``tool_result`` block
    answers a ``tool_use`` of the assistant message right before it."""
    messages = body["messages"]
    assert messages and messages[0]["role"] == "user"
    previous_uses: set[str] = set()
    for index, message in enumerate(messages):
        if index:
            assert message["role"] != messages[index - 1]["role"], "roles must alternate"
        blocks = message["content"] if isinstance(message["content"], list) else []
        if message["role"] == "user":
            results = {b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"}
            assert results == previous_uses, f"tool_use {previous_uses} vs results {results}"
            previous_uses = set()
        else:
            previous_uses = {b["id"] for b in blocks if b.get("type") == "tool_use"}
    assert not previous_uses

"""Adapter test helpers: the `dsh` command as a subprocess, SDK tracing off (no network)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _no_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    # The Agents SDK exports traces to the network by default; tests stay on this machine.
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    try:
        from agents import set_tracing_disabled
    except ImportError:
        return
    set_tracing_disabled(True)


def dsh(*args: str) -> str:
    """Run ``python -m dsh.cli ARGS`` and return its stdout (exit 0 required)."""
    proc = subprocess.run([sys.executable, "-m", "dsh.cli", *args], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"dsh {' '.join(args)} failed:\n{proc.stderr}"
    return proc.stdout


def dsh_messages(session_id: str, store: str, fmt: str = "openai") -> list[dict[str, Any]]:
    """The messages of ``dsh messages ID --format FMT`` (provider formats print a body)."""
    out = json.loads(dsh("messages", session_id, "--store", store, "--format", fmt))
    messages = out["messages"] if fmt != "dsh" else out
    assert isinstance(messages, list)
    return messages


def dsh_events(session_id: str, store: str) -> list[dict[str, Any]]:
    """``dsh events ID`` parsed (one JSON object a line)."""
    return [json.loads(line) for line in dsh("events", session_id, "--store", store).splitlines()
            if line.strip()]


def sigkill_when_ready(argv: list[str], ready: Path | Callable[[], bool]) -> None:
    """Start ``python ARGV``; once it creates ``ready`` (or ``ready()`` is true), SIGKILL it."""
    is_ready = ready.exists if isinstance(ready, Path) else ready
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120  # a hang guard, not a timing assertion
        while not is_ready():
            if proc.poll() is not None:
                assert proc.stderr is not None
                raise AssertionError(f"child exited early: {proc.stderr.read().decode()}")
            if time.monotonic() > deadline:
                raise AssertionError("child never reached the kill point")
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

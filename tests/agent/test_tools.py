"""@tool schemas and outcomes, built-in workspace tools, the approved shell.

Rule: docs/agent.md#tool-execution.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any, Literal

import pytest

from dsh.agent import AgentError, ShellRequest, ToolContext, ToolOutput, shell_tool, tool
from dsh.agent import workspace_tools as make_workspace_tools
from dsh.agent._tools import tool_table

CTX = ToolContext(session_id="s1", call_id="c1", turn=1, step=1)


def _invoke(t: Any, arguments: str) -> ToolOutput:
    return asyncio.run(t.invoke(arguments, CTX))


def test_schema_comes_from_hints_and_docstring() -> None:
    @tool(parallel_safe=True, timeout_ms=500)
    def search(query: str, limit: int = 10, mode: Literal["fast", "full"] = "fast",
               ctx: ToolContext | None = None) -> list[str]:
        """Search the index.

        More words that are not the description.

        Args:
            query: What to look for,
                over two lines.
            limit: Most results.
            mode: Speed.
            ctx: Call context.
        """
        return [query]

    assert search.name == "search" and search.parallel_safe and search.timeout_ms == 500
    assert search.declaration() == {
        "name": "search", "description": "Search the index.",
        "parameters": {
            "additionalProperties": False, "type": "object", "required": ["query"],
            "properties": {
                "query": {"type": "string", "description": "What to look for, over two lines."},
                "limit": {"type": "integer", "default": 10, "description": "Most results."},
                "mode": {"type": "string", "enum": ["fast", "full"], "default": "fast",
                         "description": "Speed."}}}}


def test_outcomes_of_sync_async_errors_and_timeouts() -> None:
    @tool
    def echo(text: str, ctx: ToolContext) -> dict[str, str]:
        """Echo.

        Args:
            text: Text.
            ctx: Context.
        """
        return {"text": text, "call": ctx.call_id}

    class QuotaError(Exception):
        code = "QUOTA"

    @tool
    async def boom() -> str:
        """Fails with a coded error."""
        raise QuotaError("over quota")

    @tool(timeout_ms=20)
    async def slow() -> str:
        """Never finishes in time."""
        await asyncio.sleep(10)
        return "late"

    assert _invoke(echo, '{"text": "hi"}').content == '{"text":"hi","call":"c1"}'
    failed = _invoke(boom, "{}")
    assert failed.error == {"name": "QuotaError", "code": "QUOTA"}
    assert failed.content == "Error: QuotaError: over quota"
    timed = _invoke(slow, "")
    assert timed.error == {"name": "TimeoutError", "code": "TOOL_TIMEOUT"}
    bad = _invoke(echo, "not json")
    assert bad.error == {"name": "ToolArgumentsError", "code": "INVALID_ARGUMENTS"}


def test_bad_tool_definitions_are_refused() -> None:
    with pytest.raises(AgentError, match="name"):
        tool(name="bad name")(lambda: None)

    def splat(*args: int) -> None:
        """Splat."""

    with pytest.raises(AgentError, match=r"\*args"):
        tool(splat)

    @tool
    def twin() -> None:
        """Twin."""

    with pytest.raises(AgentError, match="two tools are named 'twin'"):
        tool_table([twin, twin])


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.py").write_text("print('hi')\nTODO: fix\n")
    (root / "README").write_text("readme TODO\n")
    (tmp_path / "secret.txt").write_text("secret TODO\n")
    os.symlink(tmp_path / "secret.txt", root / "link.txt")
    return root


def test_workspace_tools_read_list_glob_grep(workspace: Path) -> None:
    read_file, list_dir, glob, grep = make_workspace_tools(workspace)
    assert all(t.parallel_safe for t in (read_file, list_dir, glob, grep))
    sliced = _invoke(read_file, '{"path": "src/main.py", "offset": 6}')
    assert sliced.content == "'hi')\nTODO: fix\n"
    assert _invoke(list_dir, "{}").content == "README\nlink.txt\nsrc/"
    assert _invoke(glob, '{"pattern": "**/*.py"}').content == "src/main.py"
    assert _invoke(grep, '{"pattern": "TODO"}').content == (
        "README:1:readme TODO\nsrc/main.py:2:TODO: fix")


@pytest.mark.parametrize("name, arguments", [
    ("read_file", '{"path": "../secret.txt"}'),
    ("read_file", '{"path": "link.txt"}'),
    ("read_file", '{"path": "/etc/passwd"}'),
    ("list_dir", '{"path": ".."}'),
    ("glob", '{"pattern": "../*"}'),
    ("grep", '{"pattern": "x", "path": "../"}'),
])
def test_workspace_tools_stay_inside_the_root(workspace: Path, name: str, arguments: str) -> None:
    tools = {t.name: t for t in make_workspace_tools(workspace)}
    outcome = _invoke(tools[name], arguments)
    assert outcome.error == {"name": "OutsideRootError", "code": "OUTSIDE_ROOT"}
    assert "secret" not in str(outcome.content).replace("secret.txt", "")


def test_missing_file_is_a_not_found_result(workspace: Path) -> None:
    read_file = make_workspace_tools(workspace)[0]
    assert _invoke(read_file, '{"path": "nope.txt"}').error == {"name": "PathNotFoundError",
                                                                 "code": "NOT_FOUND"}


def test_shell_refuses_by_default_and_runs_when_approved(workspace: Path) -> None:
    refused = _invoke(shell_tool(workspace), '{"command": "touch made"}')
    assert refused.error == {"name": "ApprovalError", "code": "NOT_APPROVED"}
    assert not (workspace / "made").exists()
    asked: list[ShellRequest] = []

    async def approve(request: ShellRequest) -> bool:
        asked.append(request)
        return True

    ran = _invoke(shell_tool(workspace, approve=approve), '{"command": "echo out; exit 3"}')
    assert ran.is_error and str(ran.content).startswith("exit status 3\n--- stdout\nout\n")
    assert asked == [ShellRequest(command="echo out; exit 3", cwd=str(workspace.resolve()),
                                  call_id="c1")]
    timed = _invoke(shell_tool(workspace, approve=lambda r: True, timeout_ms=50),
                    '{"command": "sleep 5"}')
    assert timed.error == {"name": "TimeoutError", "code": "TOOL_TIMEOUT"}


def test_grep_stops_a_catastrophic_pattern_without_freezing_the_process(
        workspace: Path) -> None:
    """The search runs in a child process: this process keeps running while it backtracks."""
    (workspace / "slow.txt").write_text("a" * 40 + "!\n")
    *_, grep = make_workspace_tools(workspace, grep_timeout_s=2)
    ticks: list[float] = []
    stop = threading.Event()

    def ticker() -> None:  # would starve for the whole search under a GIL-holding regex
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.05)

    thread = threading.Thread(target=ticker)
    thread.start()
    try:
        outcome = _invoke(grep, '{"pattern": "(a+)+$", "path": "slow.txt"}')
    finally:
        stop.set()
        thread.join()
    assert outcome.error == {"name": "PatternTimeoutError", "code": "PATTERN_TIMEOUT"}
    assert "(a+)+$" in str(outcome.content)
    assert len(ticks) >= 10  # main: the first tick, then nothing until the regex gave up


def test_grep_streams_lines_and_reports_numbers(workspace: Path) -> None:
    *_, grep = make_workspace_tools(workspace)
    big = workspace / "big.log"
    with big.open("w") as f:
        for n in range(1, 50_001):
            f.write(f"line {n}{' NEEDLE' if n % 10_000 == 0 else ''}\n")
    outcome = _invoke(grep, '{"pattern": "NEEDLE", "path": "big.log"}')
    assert outcome.content == "\n".join(f"big.log:{n}:line {n} NEEDLE"
                                       for n in range(10_000, 50_001, 10_000))
    assert _invoke(grep, '{"pattern": "(", "path": "big.log"}').error == {
        "name": "ConfigError", "code": "INVALID_ARGUMENTS"}


def test_hard_link_to_a_file_outside_the_root_is_refused(workspace: Path,
                                                          tmp_path: Path) -> None:
    os.link(tmp_path / "secret.txt", workspace / "linked.txt")
    tools = {t.name: t for t in make_workspace_tools(workspace)}
    outcome = _invoke(tools["read_file"], '{"path": "linked.txt"}')
    assert outcome.error == {"name": "HardLinkError", "code": "OUTSIDE_ROOT"}
    assert "secret" not in str(outcome.content).replace("secret.txt", "")
    assert "hard links" in str(outcome.content)
    found = _invoke(tools["grep"], '{"pattern": "secret"}')  # main: read the outside file
    assert found.error is None and "secret" not in str(found.content)
    named = _invoke(tools["grep"], '{"pattern": "secret", "path": "linked.txt"}')
    assert named.error == {"name": "HardLinkError", "code": "OUTSIDE_ROOT"}


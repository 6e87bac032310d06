"""Built-in tools: read-only file tools confined to a root, and an opt-in approved shell.

:func:`workspace_tools` returns ``read_file``, ``list_dir``, ``glob`` and ``grep``. Every path
they take is resolved (symlinks followed) and must stay inside the root; anything else is an
error result with code ``OUTSIDE_ROOT``. They never write, are parallel-safe and declare the
effect class ``read_only`` (a crash-interrupted call simply runs again).

:func:`shell_tool` runs a command with ``/bin/sh`` in the root, but only after a yes: from the
approval callback (the default callback refuses, code ``NOT_APPROVED``, so a non-interactive
agent never runs a command nobody approved), or, with ``approve="durable"``, from a person
answering a durable ``approval/requested`` (``dsh approve``) in any process, later. A command
can do anything, so the tool is ``irreversible`` unless told otherwise (Rule:
docs/effects.md#effect-classes).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import inspect
import json
import os
import re
import signal
import stat
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal

from dsh._errors import ConfigError, DshError
from dsh.agent._tools import Tool, ToolContext, ToolEffect, ToolOutput, tool

MAX_READ_BYTES: Final = 256 * 1024
"""Largest slice ``read_file`` returns in one call (bytes); ask again with ``offset``."""

_MAX_ENTRIES: Final = 1000
_MAX_OUTPUT_BYTES: Final = 64 * 1024


class OutsideRootError(DshError):
    """A built-in tool was asked about a path outside its root (a tool result, not raised)."""

    default_code = "OUTSIDE_ROOT"


class PathNotFoundError(DshError):
    """A built-in tool was asked about a file or directory that does not exist."""

    default_code = "NOT_FOUND"


class PatternTimeoutError(DshError):
    """``grep``'s search ran past its time bound (a catastrophic pattern; a tool result)."""

    default_code = "PATTERN_TIMEOUT"


class HardLinkError(DshError):
    """A built-in tool was asked about a file with several hard links (a tool result)."""

    default_code = "OUTSIDE_ROOT"


GREP_TIMEOUT_S: Final = 10.0
"""How long ``grep``'s search process may run before it is killed (seconds)."""

_MAX_LINE_BYTES: Final = 1024 * 1024

# The search runs in a child process: a pattern that backtracks catastrophically then costs
# that process its time bound, never this process its GIL (the event loop, the write-behind
# writer and the tool timeouts keep running). Files are streamed a bounded line at a time.
_GREP_CHILD = r"""
import json, re, sys
job = json.loads(sys.stdin.buffer.read())
regex = re.compile(job["pattern"])
limit, cap = job["limit"], job["line"]
hits = 0
out = sys.stdout
for name, shown in job["files"]:
    try:
        f = open(name, "rb")
    except OSError:
        continue
    with f:
        number = 1  # a line longer than the cap is searched a cap at a time
        while True:
            raw = f.readline(cap)
            if not raw:
                break
            ended = raw.endswith(b"\n")
            try:
                line = (raw[:-1] if ended else raw).decode("utf-8")
            except UnicodeDecodeError:
                break  # binary: no lines to match
            if regex.search(line):
                out.write(json.dumps([shown, number, line[:500]]) + "\n")
                hits += 1
                if hits == limit:
                    sys.exit(0)
            number += ended
"""


def _refuse_hard_link(target: Path, relative: str) -> None:
    """Refuse a regular file with more than one hard link (its other names may be outside).

    A hard link is the same inode under another name; nothing tells where the other names
    are, so a file linked into the root from outside would be read through it. Rule:
    docs/agent.md#built-in-tools.
    """
    try:
        info = os.stat(target)
    except OSError:
        return
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        raise HardLinkError(f"path {relative!r} is a file with {info.st_nlink} hard links; its "
                            f"other names may lie outside the workspace root, so it is not "
                            f"read (copy it into the workspace)")


def _root(root: str | os.PathLike[str]) -> Path:
    path = Path(root).resolve()
    if not path.is_dir():
        raise ConfigError(f"tool root {str(root)!r} is not a directory", path=str(root))
    return path


def _inside(root: Path, relative: str) -> Path:
    candidate = (root / relative).resolve()
    if candidate != root and root not in candidate.parents:
        raise OutsideRootError(f"path {relative!r} is outside the workspace root; use a path "
                                f"relative to the root")
    return candidate


def _rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix() or "."


def workspace_tools(root: str | os.PathLike[str], *,
                    grep_timeout_s: float = GREP_TIMEOUT_S) -> list[Tool]:
    """Return ``read_file``, ``list_dir``, ``glob`` and ``grep`` confined to ``root``.

    ``grep`` searches in a child process killed after ``grep_timeout_s`` seconds, a bounded
    line at a time; ``read_file`` and ``grep`` refuse files with several hard links
    (docs/agent.md#built-in-tools).

    Raises:
        ConfigError: ``root`` is not a directory.
    """
    base = _root(root)

    @tool(name="read_file", parallel_safe=True, effect="read_only")
    def read_file(path: str, offset: int = 0, limit: int = MAX_READ_BYTES) -> str:
        """Read a UTF-8 text file of the workspace (at most 256 KiB per call).

        Args:
            path: File path relative to the workspace root.
            offset: Byte offset to start at.
            limit: Bytes to read (at most 262144).
        """
        target = _inside(base, path)
        if not target.is_file():
            raise PathNotFoundError(f"{path!r} is not a file in the workspace")
        _refuse_hard_link(target, path)
        with target.open("rb") as handle:
            handle.seek(max(0, offset))
            data = handle.read(max(0, min(limit, MAX_READ_BYTES)))
        return data.decode("utf-8", errors="replace")

    @tool(name="list_dir", parallel_safe=True, effect="read_only")
    def list_dir(path: str = ".") -> str:
        """List a directory of the workspace: one entry a line, directories end with '/'.

        Args:
            path: Directory relative to the workspace root.
        """
        target = _inside(base, path)
        if not target.is_dir():
            raise PathNotFoundError(f"{path!r} is not a directory in the workspace")
        names = sorted(e.name + ("/" if e.is_dir() else "") for e in target.iterdir())
        more = len(names) - _MAX_ENTRIES
        return "\n".join(names[:_MAX_ENTRIES]) + (f"\n... {more} more" if more > 0 else "")

    @tool(name="glob", parallel_safe=True, effect="read_only")
    def glob(pattern: str) -> str:
        """Find workspace files matching a glob pattern such as 'src/**/*.py'.

        Args:
            pattern: Glob pattern relative to the workspace root.
        """
        if Path(pattern).is_absolute() or ".." in Path(pattern).parts:
            raise OutsideRootError(f"pattern {pattern!r} leaves the workspace root")
        found: list[str] = []
        for match in sorted(base.glob(pattern)):
            resolved = match.resolve()
            if resolved == base or base in resolved.parents:
                found.append(_rel(base, match))
            if len(found) == _MAX_ENTRIES:
                break
        return "\n".join(found)

    @tool(name="grep", parallel_safe=True, effect="read_only")
    def grep(pattern: str, path: str = ".", include: str = "*") -> str:
        """Search workspace files for a regular expression; lines as 'file:line:text'.

        Args:
            pattern: Python regular expression.
            path: File or directory to search, relative to the workspace root.
            include: Only files whose name matches this glob, e.g. '*.py'.
        """
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"pattern {pattern!r} is not a regular expression: {exc}",
                              code="INVALID_ARGUMENTS") from None
        target = _inside(base, path)
        if target.is_file():
            _refuse_hard_link(target, path)
            files = [target]
        else:
            files = sorted(p for p in target.rglob("*")
                           if p.is_file() and fnmatch.fnmatch(p.name, include))
        searched: list[tuple[str, str]] = []
        for file in files:
            if base not in file.resolve().parents:
                continue  # a symlink pointing out of the root is not searched
            try:
                info = os.stat(file)
            except OSError:
                continue
            if info.st_nlink > 1:
                continue  # a hard link may be a name of a file outside the root
            searched.append((str(file), _rel(base, file)))
        if not searched:
            return ""
        job = json.dumps({"pattern": pattern, "files": searched, "limit": _MAX_ENTRIES,
                          "line": _MAX_LINE_BYTES})
        try:
            done = subprocess.run([sys.executable, "-I", "-c", _GREP_CHILD], input=job.encode(),
                                  capture_output=True, timeout=grep_timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise PatternTimeoutError(
                f"the search for {pattern!r} ran past {grep_timeout_s:g} s and was stopped (a "
                f"pattern with nested repetition can take exponential time); use a simpler "
                f"pattern or a narrower path") from None
        if done.returncode != 0:
            raise ConfigError(f"the search for {pattern!r} failed: "
                              f"{done.stderr.decode('utf-8', 'replace').strip()[-300:]}")
        hits = [json.loads(line) for line in done.stdout.decode("utf-8").splitlines()]
        return "\n".join(f"{shown}:{number}:{line}" for shown, number, line in hits)

    return [read_file, list_dir, glob, grep]


@dataclass(frozen=True, slots=True, kw_only=True)
class ShellRequest:
    """What the approval callback is asked about.

    Attributes:
        command: The command line, as the model sent it.
        cwd: The directory it would run in (the root).
        call_id: The provider call id.
    """

    command: str
    cwd: str
    call_id: str


ShellApproval = Callable[[ShellRequest], bool | Awaitable[bool]]
"""``approve(request) -> bool`` (sync or async); True runs the command."""


def refuse_all(request: ShellRequest) -> bool:
    """The default approval: refuse every command (non-interactive agents run nothing)."""
    del request
    return False


def shell_tool(root: str | os.PathLike[str], *,
               approve: ShellApproval | Literal["durable"] = refuse_all,
               timeout_ms: int = 60_000, effect: ToolEffect = "irreversible") -> Tool:
    """Return an opt-in ``shell`` tool whose every call needs a yes before it runs.

    Args:
        root: Working directory of the commands.
        approve: Approval callback (default :func:`refuse_all`), asked in the running process;
            or ``"durable"``: each call records ``approval/requested`` and the turn ends until
            a person answers with ``dsh approve`` / ``dsh deny`` (any process, any time before
            the agent's deadline); the next resumed run carries on from the answer.
        timeout_ms: Kill the command after this many ms.
        effect: The effect class (default ``irreversible``: a command the crash interrupted is
            never run again on its own); say ``read_only`` or ``idempotent`` only for a
            workspace whose commands are so.

    Raises:
        ConfigError: ``root`` is not a directory, or ``approve`` is neither callable nor
            ``"durable"``.
    """
    base = _root(root)
    durable = approve == "durable"
    if not durable and not callable(approve):
        raise ConfigError(f"shell_tool approve must be a callback or 'durable', got {approve!r}")

    @tool(name="shell", timeout_ms=None, effect=effect, needs_approval=durable)
    async def shell(command: str, ctx: ToolContext) -> ToolOutput:
        """Run a shell command in the workspace; returns exit status, stdout and stderr.

        Args:
            command: The command line for /bin/sh.
            ctx: The call's context (given by the loop, not by the model).
        """
        if durable or ctx.approved:
            decision: object = True  # the loop ran this body only after a yes
        else:  # called outside the loop: ask here
            assert callable(approve)
            decision = approve(ShellRequest(command=command, cwd=str(base),
                                            call_id=ctx.call_id))
        if inspect.isawaitable(decision):
            decision = await decision
        if decision is not True:
            return ToolOutput(content=f"Error: the command was not approved: {command}",
                              error={"name": "ApprovalError", "code": "NOT_APPROVED"})
        # Its own process group, so a timeout or cancel also stops what the command started.
        process = await asyncio.create_subprocess_shell(
            command, cwd=base, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                out, err = await process.communicate()
        except TimeoutError:
            await _kill_group(process)
            return ToolOutput(content=f"Error: the command timed out after {timeout_ms} ms",
                              error={"name": "TimeoutError", "code": "TOOL_TIMEOUT"})
        except asyncio.CancelledError:
            await _kill_group(process)
            raise
        text = (f"exit status {process.returncode}\n--- stdout\n"
                f"{out[:_MAX_OUTPUT_BYTES].decode('utf-8', 'replace')}\n--- stderr\n"
                f"{err[:_MAX_OUTPUT_BYTES].decode('utf-8', 'replace')}")
        return ToolOutput(content=text, is_error=process.returncode != 0)

    if durable:
        return shell

    def ask(arguments: Mapping[str, Any], call_id: str) -> bool | Awaitable[bool]:
        assert callable(approve)
        return approve(ShellRequest(command=str(arguments["command"]), cwd=str(base),
                                    call_id=call_id))

    # the loop asks before it records the call: a crash while a person decides leaves a
    # call that never started (docs/agent.md#tool-execution)
    return replace(shell, approve=ask)


async def _kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()

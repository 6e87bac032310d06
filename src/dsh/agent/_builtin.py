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
import os
import re
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

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


def workspace_tools(root: str | os.PathLike[str]) -> list[Tool]:
    """Return ``read_file``, ``list_dir``, ``glob`` and ``grep`` confined to ``root``.

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
        regex = re.compile(pattern)
        target = _inside(base, path)
        files = [target] if target.is_file() else sorted(
            p for p in target.rglob("*") if p.is_file() and fnmatch.fnmatch(p.name, include))
        hits: list[str] = []
        for file in files:
            if base not in file.resolve().parents:
                continue  # a symlink pointing out of the root is not searched
            try:
                text = file.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue  # binary or unreadable files have no lines to match
            for number, line in enumerate(text.split("\n"), 1):
                if regex.search(line):
                    hits.append(f"{_rel(base, file)}:{number}:{line[:500]}")
                    if len(hits) == _MAX_ENTRIES:
                        return "\n".join(hits)
        return "\n".join(hits)

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
        if durable:
            decision: object = True  # the loop ran this body only after a recorded yes
        else:
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

    return shell


async def _kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()

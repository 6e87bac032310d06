"""Progress bars for the commands that can take more than a second (docs/cli.md#progress).

A bar is drawn on stderr, and only when stderr is a terminal: piped or redirected, a command
prints exactly what it printed before and rich is not even imported. The bar is transient (it
is erased when the work ends), refreshed by rich's own thread, so a single long read still
shows its spinner and elapsed time. Session text never reaches it except through the
escaping console (:class:`dsh.cli._console.SafeConsole`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


class Bar:
    """One task of a progress display; every method is a no-op when nothing is drawn."""

    __slots__ = ("_progress", "_task")

    def __init__(self, progress: Progress | None = None, task: TaskID | None = None) -> None:
        self._progress = progress
        self._task = task

    @property
    def drawn(self) -> bool:
        """True when the bar is on a terminal."""
        return self._progress is not None

    def advance(self, amount: float = 1) -> None:
        """Count ``amount`` more units of work done."""
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, amount)

    def describe(self, text: str) -> None:
        """Say what is being done now (a file name, a session id, a phase)."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=text)

    def total(self, total: float | None) -> None:
        """Set how many units the work has (None: unknown, a spinner)."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, total=total)


def _on_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except ValueError:  # a closed stream
        return False


@contextmanager
def progress(label: str, *, total: float | None = None, bytes_: bool = False) -> Iterator[Bar]:
    """A transient progress bar on stderr for the work done inside the block.

    Args:
        label: What the command does (``importing``, ``verifying``, ...), shown first.
        total: Units of work (files, sessions, bytes); None draws a spinner with the time
            spent until :meth:`Bar.total` says more.
        bytes_: The units are bytes (shown as MB done of MB, and a rate).

    Yields:
        The :class:`Bar` to advance; a no-op bar when stderr is not a terminal.
    """
    if not _on_terminal():
        yield Bar()
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )
    from rich.progress import (
        Progress as RichProgress,
    )

    from dsh.cli._common import stderr_console

    counts = (DownloadColumn(), TransferSpeedColumn()) if bytes_ else (MofNCompleteColumn(),)
    # stdout is left alone: a command's results go there, redirected or not.
    with RichProgress(SpinnerColumn(), TextColumn(label), BarColumn(), *counts,
                      TimeElapsedColumn(), TextColumn("{task.description}"),
                      console=stderr_console(), transient=True, redirect_stdout=False,
                      redirect_stderr=False) as shown:
        yield Bar(shown, shown.add_task("", total=total))

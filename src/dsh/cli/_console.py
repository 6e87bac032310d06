"""The CLI's rich console: control characters in printed text are shown as escapes.

A module of its own so that rich is imported only when a console is made
(:func:`dsh.cli._render.make_console`), not whenever the CLI starts.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console
from rich.segment import Segment

from dsh.transcript import printable


class SafeConsole(Console):
    """A rich console that escapes control characters in the text it prints.

    Rich's own control segments (colours come from styles, cursor moves are ``control``
    segments) pass through; only text is escaped, whichever renderable it came from.
    """

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(printable(segment.text), segment.style)
            for segment in buffer)

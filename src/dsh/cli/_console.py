"""The CLI's rich console and text: control characters in printed text are shown as escapes.

A module of its own so that rich is imported only when a console is made
(:func:`dsh.cli._render.make_console`), not whenever the CLI starts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from dsh._errors import printable


def shown(text: str) -> str:
    """``text`` as the CLI prints it: a CRLF line end as LF, then :func:`printable`.

    Rule (docs/cli.md#output): control characters are shown as escapes, a lone CR among
    them; CRLF is a line end (Windows tool output), printed as one.
    """
    return printable(text.replace("\r\n", "\n")) if "\r\n" in text else printable(text)


class SafeText(Text):
    """A rich ``Text`` that escapes control characters in the text it is made of.

    Rule (docs/cli.md#output): session text shows every control character as an escape.
    rich's ``Text`` drops BEL, BS, VT, FF and CR when it is built or appended to, before
    :class:`SafeConsole` sees the text, so the escaping (:func:`shown`) happens here first.
    Same arguments as ``Text``; ``Text.assemble`` builds and appends through these methods.
    """

    def __init__(self, text: str = "", style: str | Style = "", **options: Any) -> None:
        super().__init__(shown(text), style, **options)

    def append(self, text: Text | str, style: str | Style | None = None) -> Text:
        """Append ``text`` (a ``str`` escaped as :func:`printable` does) with ``style``."""
        return super().append(shown(text) if isinstance(text, str) else text, style)


class SafeConsole(Console):
    """A rich console that escapes control characters in the text it prints.

    Rich's own control segments (colours come from styles, cursor moves are ``control``
    segments) pass through; only text is escaped, whichever renderable it came from. A
    ``str`` it prints (``print("...")``, a table cell) is escaped before rich makes it a
    ``Text``, which would drop BEL, BS, VT, FF and CR (docs/cli.md#output).
    """

    def render_str(self, text: str, **options: Any) -> Text:
        """``Console.render_str`` of ``text`` with its control characters escaped first."""
        return super().render_str(shown(text), **options)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(printable(segment.text), segment.style)
            for segment in buffer)

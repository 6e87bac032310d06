"""Help text as a person reads it: whole sentences, no type placeholders, clean usage lines.

Typer (0.2x with click 8.2+) prints ``<bool>`` beside every flag, ``<str>`` beside arguments,
``{ID}`` and ``[[PATH...]]...`` in usage lines, and keeps the docstring's line breaks, so
sentences break mid-line when rich re-wraps them. :func:`tidy_help` fixes what the commands
show: it rewrites each command's help text once (paragraphs joined, docs/ citations and
backtick markup removed) and adjusts how typer names parameters. Everything here degrades to
typer's own rendering if its internals move.
"""

from __future__ import annotations

import re
from typing import Any, Final

_DOC_REF: Final = r"docs/[\w.-]+\.md(?:#[\w-]+)?"
_CITATION: Final = re.compile(
    rf"\s*\([^()]*?{_DOC_REF}[^()]*\)|\s*Rules?: {_DOC_REF}(?:,\s*{_DOC_REF})*\.?|{_DOC_REF}")
_BACKTICKS: Final = re.compile(r"``?([^`]+?)``?")


def tidy_text(text: str) -> str:
    """One help text for a person: paragraphs joined into lines, no citations, no backticks.

    Rule: a blank line separates paragraphs (kept); single line breaks inside a paragraph
    become spaces; citations of ``docs/`` pages (``(… docs/rules.md#fork …)``, ``Rule: docs/…``)
    are removed; ````x```` and ```x``` become ``'x'`` (a command such as ``'dsh ls'``) or plain
    ``x``.
    """
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip())]
    cleaned = []
    for paragraph in paragraphs:
        paragraph = _CITATION.sub("", paragraph)
        paragraph = _BACKTICKS.sub(
            lambda m: f"'{m.group(1)}'" if m.group(1).startswith("dsh ") else m.group(1),
            paragraph)
        cleaned.append(paragraph)
    return "\n\n".join(p for p in cleaned if p)


def _typeless(original: Any) -> Any:
    def display_type_rich(self: Any, ctx: Any) -> str | None:
        # Flags and arguments need no type column; other options show their metavar, or
        # their type without angle brackets (choices spaced, so a narrow screen wraps between
        # them, not inside a word).
        if getattr(self, "is_flag", False) or getattr(self, "param_type_name", "") == "argument":
            return None
        shown = original(self, ctx)
        if not isinstance(shown, str) or not (shown.startswith("<") and shown.endswith(">")):
            return shown  # type: ignore[no-any-return]
        inner = shown[1:-1]
        return " | ".join(inner.split("|")) if "|" in inner else inner.upper()

    display_type_rich.__wrapped__ = original  # type: ignore[attr-defined]
    return display_type_rich


def _usage_name(self: Any) -> str:
    name = str(self.metavar or self.name or "").upper() if self.metavar is None else \
        str(self.metavar)
    name = name if self.required else f"[{name}]"
    return name + ("..." if self.nargs != 1 else "")


def _patch_typer() -> None:
    try:
        from typer import core
    except ImportError:  # pragma: no cover - typer is a dependency
        return
    for cls_name in ("TyperOption", "TyperArgument"):
        cls = getattr(core, cls_name, None)
        current = getattr(cls, "display_type_rich", None)
        if cls is not None and current is not None and not hasattr(current, "__wrapped__"):
            cls.display_type_rich = _typeless(current)
    argument = getattr(core, "TyperArgument", None)
    if argument is not None and hasattr(argument, "_usage_display_name"):
        argument._usage_display_name = _usage_name


def tidy_help(group: Any) -> Any:
    """Rewrite the help texts of ``group`` and its commands and patch typer's parameter names.

    Returns:
        The same group, for chaining.
    """
    _patch_typer()
    for command in [group, *getattr(group, "commands", {}).values()]:
        if command.help:
            command.help = tidy_text(command.help)
        for param in command.params:
            current = getattr(param, "help", None)  # typer's arguments carry help too
            if isinstance(current, str) and current:
                param.__dict__["help"] = tidy_text(current)
    return group

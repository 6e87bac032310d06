"""Help text as a person reads it: whole sentences, no type placeholders, clean usage lines.

Typer (0.2x with click 8.2+) prints ``<bool>`` beside every flag, ``<str>`` beside arguments,
``{ID}`` and ``[[PATH...]]...`` in usage lines, and keeps the docstring's line breaks, so
sentences break mid-line when rich re-wraps them. :func:`tidy_help` fixes what the commands
show: it rewrites each command's help text once (paragraphs joined, docs/ citations and
backtick markup removed) and adjusts how typer names parameters. It also defers typer's
pydantic-based coercion of a parameter to the first value that needs it, so a command starts
without pydantic. Everything here degrades to typer's own behaviour if its internals move.
"""

from __future__ import annotations

import re
from typing import Any, Final

_DOC_REF: Final = r"docs/[\w.-]+\.md(?:#[\w-]+)?"
_CITATION: Final = re.compile(
    rf"\s*\([^()]*?{_DOC_REF}[^()]*\)|\s*Rules?: {_DOC_REF}(?:,\s*{_DOC_REF})*\.?|{_DOC_REF}")
_BACKTICKS: Final = re.compile(r"``?([^`]+?)``?")
_DIGITS: Final = re.compile(r"[0-9]{1,18}")  # ASCII only: "١" or "1_000" go to pydantic


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


def _deferred_coercion() -> None:
    # Typer (0.29) builds a pydantic TypeAdapter for every parameter it processes, even one left
    # at its default None, and so imports pydantic (~100 ms) in every command. Here the
    # adapter is built only when a value needs it: a parameter left unset never builds one,
    # a plain `str` parameter given on the command line keeps its text as is (what the
    # adapter returns for a str: the same object), and plain digits for an `int` within its
    # bounds become that int. Every other value goes through typer's own
    # coercion, so its result and its errors are typer's.
    try:
        from dataclasses import dataclass, field

        from typer import _coercion, core
    except ImportError:  # pragma: no cover - typer is a dependency
        return
    found = getattr(core, "build_runtime_param", None)
    base = getattr(_coercion, "RuntimeParam", None)
    if found is None or base is None or hasattr(found, "__wrapped__"):
        return
    build: Any = found

    @dataclass(frozen=True)
    class Deferred(base):  # type: ignore[misc, valid-type]
        descriptor: Any = None
        built: list[Any] = field(default_factory=list)

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            desc = self.descriptor
            info = desc.parameter_info
            plain = (isinstance(value, str) and info.parser is None
                     and desc.file_annotation is None and not desc.is_path
                     and not desc.is_choice)
            if plain and desc.annotation is str:
                return value
            if plain and desc.annotation is int and not info.clamp and _DIGITS.fullmatch(value):
                number = int(value)  # what pydantic makes of plain digits, bounds checked
                if (info.min is None or number >= info.min) and \
                        (info.max is None or number <= info.max):
                    return number
            if not self.built:
                self.built.append(build(desc))
            return self.built[0]._coerce_value(value, param=param, ctx=ctx)

    def deferred(descriptor: Any) -> Any:
        return Deferred(parameter_info=descriptor.parameter_info,
                        annotation=descriptor.annotation, descriptor=descriptor)

    deferred.__wrapped__ = build  # type: ignore[attr-defined]
    setattr(core, "build_runtime_param", deferred)  # noqa: B010 - not exported by typer


def _patch_typer() -> None:
    try:
        from typer import core
    except ImportError:  # pragma: no cover - typer is a dependency
        return
    _deferred_coercion()
    for cls_name in ("TyperOption", "TyperArgument"):
        cls = getattr(core, cls_name, None)
        current = getattr(cls, "display_type_rich", None)
        if cls is not None and current is not None and not hasattr(current, "__wrapped__"):
            cls.display_type_rich = _typeless(current)
    argument = getattr(core, "TyperArgument", None)
    if argument is not None and hasattr(argument, "_usage_display_name"):
        argument._usage_display_name = _usage_name


def tidy_command(command: Any) -> Any:
    """Rewrite the help texts of one click ``command`` and of its parameters, once.

    Returns:
        The same command, for chaining.
    """
    if command.help:
        command.help = tidy_text(command.help)
    for param in command.params:
        current = getattr(param, "help", None)  # typer's arguments carry help too
        if isinstance(current, str) and current:
            param.__dict__["help"] = tidy_text(current)
    return command


def tidy_help(group: Any) -> Any:
    """Rewrite the help texts of ``group`` and patch typer's parameter names.

    The group's commands are tidied as they are built (:func:`tidy_command`), so that none is
    built here.

    Returns:
        The same group, for chaining.
    """
    _patch_typer()
    return tidy_command(group)

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
_SECTION: Final = re.compile(r"(?:Args|Arguments|Raises|Returns|Yields|Attributes):\s")
_DIGITS: Final = re.compile(r"[0-9]{1,18}")  # :func:`_deferred_coercion`


def tidy_text(text: str) -> str:
    """One help text for a person: paragraphs joined into lines, no citations, no backticks.

    Rule: a blank line separates paragraphs (kept); single line breaks inside a paragraph
    become spaces; citations of ``docs/`` pages (``(… docs/rules.md#fork …)``, ``Rule: docs/…``)
    are removed; ````x```` and ```x``` become ``'x'`` (a command such as ``'dsh ls'``) or plain
    ``x``; a docstring section for programmers (``Raises:``, ``Args:``, ``Returns:`` ...) is
    left out whole: its exception classes mean nothing at a shell.
    """
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip())
                  if not _SECTION.match(p.strip())]
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
    # A metavar written with its own brackets or dots ("[ID]...", "QUERY...") is shown as
    # written: adding ours again gave "QUERY......" and "[[ID]...]...".
    name = str(self.name or "").upper() if self.metavar is None else str(self.metavar)
    if not self.required and not name.startswith("["):
        name = f"[{name}]"
    return name + ("..." if self.nargs != 1 and not name.endswith("...") else "")


def _deferred_coercion() -> None:
    """Build typer's pydantic coercion of a parameter only for a value that needs it.

    Typer (0.29) builds a pydantic ``TypeAdapter`` for every parameter it processes, even one
    left at its default, and so imports pydantic (~100 ms) in every command. The hook patched
    here answers without one where pydantic's lax mode has a known answer (its conversion
    table, https://docs.pydantic.dev/latest/concepts/conversion_table/): for a plain ``str``
    parameter the command line's text itself, and for a plain ``int`` one without ``clamp``
    1-18 ASCII digits as their int within ``min``/``max`` ("plain": no ``parser``, file, path
    or choice), and for a plain ``list[str]`` one (``dsh import``'s paths) the texts as they
    are. A default that typer hands back as it is needs no adapter either: an ``Enum``
    member of an ``Enum`` parameter (typer's choice coercion returns a member as it is), a
    finite ``float`` of a ``float`` parameter without ``clamp`` within ``min``/``max``. Any
    other value goes to typer's own coercion, built at first need, so its result and its
    errors are typer's.

    Falls back to typer as it is when its internals move: no patch unless
    ``core.build_runtime_param`` exists and ``_coercion.RuntimeParam`` is a dataclass with
    exactly the fields ``parameter_info`` and ``annotation`` and an abstract ``_coerce_value``;
    a descriptor without an attribute read here gets typer's own runtime param.
    """
    try:
        from dataclasses import dataclass, field, fields, is_dataclass
        from enum import Enum
        from math import isfinite

        from typer import _coercion, core
    except ImportError:  # pragma: no cover - typer is a dependency
        return
    found = getattr(core, "build_runtime_param", None)
    base = getattr(_coercion, "RuntimeParam", None)
    if found is None or hasattr(found, "__wrapped__") or not is_dataclass(base) \
            or {f.name for f in fields(base)} != {"parameter_info", "annotation"} \
            or "_coerce_value" not in getattr(base, "__abstractmethods__", ()):
        return
    build: Any = found

    @dataclass(frozen=True)
    class Deferred(base):  # type: ignore[misc, valid-type]
        descriptor: Any = None
        kind: type | None = None  # str or int: a plain parameter of that type
        bounds: tuple[Any, Any] = (None, None)  # an int's or a float's (min, max)
        same: type | None = None  # a value of exactly this type is typer's answer as it is
        texts: bool = False  # list[str]: the command line's texts as they are
        built: list[Any] = field(default_factory=list)

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            if isinstance(value, str) and self.kind is str:
                return value
            if isinstance(value, str) and self.kind is int and _DIGITS.fullmatch(value):
                number, (low, high) = int(value), self.bounds
                if (low is None or number >= low) and (high is None or number <= high):
                    return number
            if self.same is float and type(value) is float:
                low, high = self.bounds
                if isfinite(value) and (low is None or value >= low) \
                        and (high is None or value <= high):
                    return value
            elif self.same is not None and type(value) is self.same:
                return value
            if self.texts and isinstance(value, list | tuple) \
                    and all(type(item) is str for item in value):
                return list(value)
            if not self.built:
                self.built.append(build(self.descriptor))
            return self.built[0]._coerce_value(value, param=param, ctx=ctx)

    def deferred(descriptor: Any) -> Any:
        try:
            info, annotation = descriptor.parameter_info, descriptor.annotation
            own = info.parser is None and descriptor.file_annotation is None
            plain = own and not descriptor.is_path and not descriptor.is_choice
            kind = annotation if plain and annotation in (str, int) else None
            if kind is int and info.clamp:
                kind = None
            bounds = (info.min, info.max)
            same: type | None = None
            if own and isinstance(annotation, type) and issubclass(annotation, Enum):
                same = annotation
            elif plain and annotation is float and not info.clamp:
                same = float
            texts = plain and annotation == list[str]
        except AttributeError:  # typer's descriptor moved on: its own runtime param
            return build(descriptor)
        return Deferred(parameter_info=info, annotation=annotation, descriptor=descriptor,
                        kind=kind, bounds=bounds, same=same, texts=texts)

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

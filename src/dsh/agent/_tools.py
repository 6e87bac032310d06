"""Tools the agent loop can call: ``@tool``, argument schemas, execution outcomes.

``@tool`` turns a typed function (sync or async) into a :class:`Tool`: the JSON Schema of its
parameters comes from the type hints through pydantic's ``TypeAdapter``, parameter
descriptions from the Google-style ``Args:`` section of its docstring, the tool description
from the docstring's first paragraph. Arguments are validated against the same adapter before
the body runs.

Outcome rules (docs/agent.md#tool-execution):

* the body's return value becomes the result content (a string as one text block; a list of
  content blocks as is; any other JSON value as compact JSON text; a :class:`ToolOutput` for
  full control);
* an exception becomes an ``isError`` result whose ``error`` is ``{name: <exception class>,
  code: <its .code, else "TOOL_ERROR">}``; invalid arguments give ``INVALID_ARGUMENTS``, an
  unknown tool ``UNKNOWN_TOOL``, a body over its ``timeout_ms`` ``TOOL_TIMEOUT``;
* ``parallel_safe`` tools may run together in the loop's rolling pool; the others are
  exclusive (a barrier: nothing else runs while they do).

Effect classes (what a crash may repeat; Rule: docs/effects.md#effect-classes): every tool
declares one of :data:`TOOL_EFFECTS`. ``read_only`` changes nothing; ``idempotent`` may run
twice with the same :attr:`ToolContext.idempotency_key` and change things once;
``reconcilable`` can look up by that key whether a run took effect (``reconcile(key)``);
``irreversible`` (the default) must never run twice on its own. A tool marked
``needs_approval`` runs only after a person said yes (a durable ``approval/requested``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias, TypeVar, get_args, overload

from dsh._errors import AgentError
from dsh.json import FrozenDict, JsonValue, snapshot_json

DEFAULT_TOOL_TIMEOUT_MS: Final = 120_000
"""Per-call timeout of a tool body unless its ``timeout_ms`` says otherwise (2 minutes)."""

ToolEffect: TypeAlias = Literal["read_only", "idempotent", "reconcilable", "irreversible"]
"""What running a tool twice does (Rule: docs/effects.md#effect-classes)."""

TOOL_EFFECTS: Final[tuple[ToolEffect, ...]] = get_args(ToolEffect)
"""The four effect classes, safest first."""

_NAME: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext:
    """What a tool body may learn about its call; declare a parameter of this type to get it.

    Attributes:
        session_id: The session the call belongs to.
        call_id: The provider's call id.
        turn: Turn number of the step that made the call.
        step: Step number of the step that made the call.
        idempotency_key: The call's stable key (``dsh-`` and 40 hex digits), derived from the
            session id, the ``tool/call`` seq and the writer's epoch when the call was
            recorded; the same on every run of this call, also after a crash and resume.
            Pass it to the API the tool changes (an ``Idempotency-Key`` header, a unique
            column). Empty only for a context built by hand.
        effect: The tool's effect class.
        attempt: 1 for the first run; 2, 3, ... when resume runs the call again.
        approved: True when the loop asked the tool's :attr:`Tool.approve` before it recorded
            the call and got a yes (the body need not ask again).
    """

    session_id: str
    call_id: str
    turn: int
    step: int
    idempotency_key: str = ""
    effect: ToolEffect = "irreversible"
    attempt: int = 1
    approved: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolOutput:
    """A tool result with full control over what is recorded.

    Attributes:
        content: Text or content blocks the model sees.
        is_error: Marks the result an error.
        error: Failure identity ``{name, code}`` (implies ``is_error``).
        meta: JSON kept in the log's ``tool/result`` but not shown to the model.
    """

    content: str | Sequence[Mapping[str, Any]]
    is_error: bool = False
    error: Mapping[str, str] | None = None
    meta: JsonValue = None


ToolApproval: TypeAlias = Callable[[Mapping[str, Any], str], bool | Awaitable[bool]]
"""``approve(arguments, call_id) -> bool`` (sync or async): a yes asked in the running process
(a person at a terminal) before the call is recorded; True lets it run."""

Reconcile: TypeAlias = Callable[[str], ToolOutput | Awaitable[ToolOutput | None] | None]
"""``reconcile(idempotency_key) -> ToolOutput | None`` (sync or async): the outcome of the run
made with that key when it took effect, else None (it did not happen; the call may run)."""


def _arg_docs(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {parameter: description})."""
    doc = inspect.cleandoc(doc or "")
    description = doc.split("\n\n", 1)[0].strip()
    params: dict[str, str] = {}
    match = re.search(r"^Args:\s*\n((?:[ \t]+.*\n?|\s*\n)+)", doc, re.MULTILINE)
    if match:
        current: str | None = None
        for line in match.group(1).splitlines():
            item = re.match(r"^\s{2,}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
            if item and (current is None or len(line) - len(line.lstrip()) <= 4):
                current = item.group(1)
                params[current] = item.group(2).strip()
            elif current is not None and line.strip():
                params[current] = f"{params[current]} {line.strip()}".strip()
    return description, params


@dataclass(frozen=True, slots=True, kw_only=True)
class Tool:
    """A tool the model can call; build one with :func:`tool`.

    Attributes:
        name: The name the model calls it by (letters, digits, ``_``, ``-``; 1-64 chars).
        description: What it does, for the model.
        parameters: JSON Schema of the arguments object.
        fn: The body (sync functions run in a worker thread).
        parallel_safe: May run concurrently with other parallel-safe calls.
        timeout_ms: Per-call timeout in ms (None: no limit).
        effect: The effect class (:data:`ToolEffect`; default ``irreversible``).
        reconcile: The look-up of a ``reconcilable`` tool (None for the other classes).
        needs_approval: Every call waits for a person's durable yes before it runs.
        approve: A yes asked in the running process (:data:`ToolApproval`), which the loop
            asks before it records the call's ``tool/call``: a crash while a person decides
            leaves a call that never started, and a no records the call with a
            ``NOT_APPROVED`` result (docs/agent.md#tool-execution).
    """

    name: str
    description: str
    parameters: FrozenDict
    fn: Callable[..., Any]
    parallel_safe: bool = False
    timeout_ms: int | None = DEFAULT_TOOL_TIMEOUT_MS
    effect: ToolEffect = "irreversible"
    reconcile: Reconcile | None = field(default=None, repr=False, compare=False)
    needs_approval: bool = False
    approve: ToolApproval | None = field(default=None, repr=False, compare=False)
    _validate: Callable[[str], dict[str, Any]] = field(repr=False, compare=False)
    _context_param: str | None = field(default=None, repr=False, compare=False)

    def declaration(self) -> dict[str, Any]:
        """The ``{name, description, parameters}`` entry of the request header's ``tools``."""
        return {"name": self.name, "description": self.description,
                "parameters": self.parameters}

    async def invoke(self, arguments: str, context: ToolContext) -> ToolOutput:
        """Validate ``arguments`` (raw JSON text), run the body, and return its outcome.

        Never raises for a tool failure (see the module rules); cancellation propagates.
        """
        try:
            kwargs = self._validate(arguments or "{}")
        except Exception as exc:  # pydantic's ValidationError or a JSON error: both are input
            return ToolOutput(content=f"Error: invalid arguments for tool {self.name!r}: "
                                      f"{_one_line(exc)}",
                              error={"name": "ToolArgumentsError", "code": "INVALID_ARGUMENTS"})
        if self._context_param is not None:
            kwargs[self._context_param] = context
        try:
            if inspect.iscoroutinefunction(self.fn):
                body: Awaitable[Any] = self.fn(**kwargs)
            else:
                body = asyncio.to_thread(self.fn, **kwargs)
            if self.timeout_ms is None:
                value = await body
            else:
                async with asyncio.timeout(self.timeout_ms / 1000):
                    value = await body
        except TimeoutError:
            return ToolOutput(content=f"Error: tool {self.name!r} timed out after "
                                      f"{self.timeout_ms} ms",
                              error={"name": "TimeoutError", "code": "TOOL_TIMEOUT"})
        except Exception as exc:  # a tool failure is a result the model sees, never a crash
            code = getattr(exc, "code", None)
            return ToolOutput(content=f"Error: {type(exc).__name__}: {exc}",
                              error={"name": type(exc).__name__,
                                     "code": code if isinstance(code, str) and code
                                     else "TOOL_ERROR"})
        return as_output(value)


    async def aapprove(self, arguments: str, call_id: str) -> bool:
        """Ask :attr:`approve` about one call; True when it may run (or no approval is asked).

        Arguments that do not validate are let through: the body never runs with them, and
        :meth:`invoke` reports ``INVALID_ARGUMENTS``. Cancellation propagates.
        """
        if self.approve is None:
            return True
        try:
            kwargs = self._validate(arguments or "{}")
        except Exception:  # invoke() reports the invalid arguments; nothing would run
            return True
        decision = self.approve(kwargs, call_id)
        if inspect.isawaitable(decision):
            decision = await decision
        return decision is True

    async def areconcile(self, key: str) -> ToolOutput | None:
        """Ask a ``reconcilable`` tool whether the run made with ``key`` took effect.

        Returns:
            The outcome that run had (recorded as the call's result), or None when it did not
            take effect. Any other returned value is made a :class:`ToolOutput` as a body's.

        Raises:
            AgentError: code ``TOOL`` when the tool has no ``reconcile``.
            Exception: whatever ``reconcile`` raises (the caller records the failure).
        """
        if self.reconcile is None:
            raise AgentError(f"tool {self.name!r} ({self.effect}) has no reconcile function",
                             code="TOOL")
        found = self.reconcile(key)
        if inspect.isawaitable(found):
            found = await found
        return None if found is None else as_output(found)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:2000]


def as_output(value: object) -> ToolOutput:
    """Turn a tool body's return value into a :class:`ToolOutput` (see the module rules)."""
    if isinstance(value, ToolOutput):
        return value
    if isinstance(value, str):
        return ToolOutput(content=value)
    if isinstance(value, list) and all(isinstance(v, Mapping) and "type" in v for v in value):
        return ToolOutput(content=value)
    if value is None:
        return ToolOutput(content="")
    try:
        return ToolOutput(content=json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    except (TypeError, ValueError):
        return ToolOutput(content=str(value))


def _check_effect(tool_name: str, effect: object, reconcile: object) -> None:
    if effect not in TOOL_EFFECTS:
        raise AgentError(f"tool {tool_name!r}: effect must be one of {', '.join(TOOL_EFFECTS)}, "
                         f"got {effect!r}", code="TOOL")
    if (effect == "reconcilable") != (reconcile is not None):
        raise AgentError(f"tool {tool_name!r}: a reconcilable tool needs reconcile=, and only a "
                         f"reconcilable one takes it (effect {effect!r}, reconcile "
                         f"{'given' if reconcile is not None else 'missing'})", code="TOOL")
    if reconcile is not None and not callable(reconcile):
        raise AgentError(f"tool {tool_name!r}: reconcile must be callable, got "
                         f"{type(reconcile).__name__}", code="TOOL")


def _build(fn: Callable[..., Any], name: str | None, description: str | None,
           parallel_safe: bool, timeout_ms: int | None, effect: ToolEffect,
           reconcile: Reconcile | None, needs_approval: bool) -> Tool:
    import pydantic  # imported here: `import dsh` stays free of it

    tool_name = name or fn.__name__
    if not _NAME.match(tool_name):
        raise AgentError(f"tool name {tool_name!r} must be 1-64 letters, digits, '_' or '-'",
                         code="TOOL")
    _check_effect(tool_name, effect, reconcile)
    if timeout_ms is not None and (type(timeout_ms) is not int or timeout_ms < 1):
        raise AgentError(f"tool {tool_name!r}: timeout_ms must be a positive integer or None, "
                         f"got {timeout_ms!r}", code="TOOL")
    summary, arg_docs = _arg_docs(fn.__doc__ or "")
    hints = _hints(fn, tool_name)
    fields: dict[str, Any] = {}
    context_param: str | None = None
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise AgentError(f"tool {tool_name!r}: *args/**kwargs cannot be described to a "
                             f"model; name every parameter", code="TOOL")
        annotation = hints.get(param.name, Any)
        if annotation is ToolContext or ToolContext in typing.get_args(annotation):
            context_param = param.name
            continue
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, pydantic.Field(default,
                                                         description=arg_docs.get(param.name)))
    model = pydantic.create_model(f"{tool_name}_arguments",
                                  __config__=pydantic.ConfigDict(extra="forbid"), **fields)
    adapter = pydantic.TypeAdapter(model)
    schema = adapter.json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)

    def validate(arguments: str) -> dict[str, Any]:
        instance = adapter.validate_json(arguments)
        return {key: getattr(instance, key) for key in fields}

    return Tool(name=tool_name, description=description or summary or tool_name,
                parameters=snapshot_json(schema),
                fn=fn, parallel_safe=parallel_safe, timeout_ms=timeout_ms, effect=effect,
                reconcile=reconcile, needs_approval=bool(needs_approval),
                _validate=validate, _context_param=context_param)


def _hints(fn: Callable[..., Any], tool_name: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except (NameError, TypeError) as exc:
        raise AgentError(f"tool {tool_name!r}: its type hints cannot be resolved ({exc}); "
                         f"define the types it names at module level", code="TOOL") from exc


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(*, name: str | None = None, description: str | None = None,
         parallel_safe: bool = False, timeout_ms: int | None = DEFAULT_TOOL_TIMEOUT_MS,
         effect: ToolEffect = "irreversible", reconcile: Reconcile | None = None,
         needs_approval: bool = False) -> Callable[[Callable[..., Any]], Tool]:
    ...


def tool(fn: Callable[..., Any] | None = None, /, *, name: str | None = None,
         description: str | None = None, parallel_safe: bool = False,
         timeout_ms: int | None = DEFAULT_TOOL_TIMEOUT_MS,
         effect: ToolEffect = "irreversible", reconcile: Reconcile | None = None,
         needs_approval: bool = False,
         ) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a :class:`Tool` from a typed function; use as ``@tool`` or ``@tool(...)``.

    Args:
        fn: The body: sync (runs in a worker thread) or async; every parameter typed (a
            parameter typed :class:`ToolContext` receives the call's context and is not
            part of the schema).
        name: Tool name (default: the function's name).
        description: Description (default: the docstring's first paragraph).
        parallel_safe: May run concurrently with other parallel-safe calls (read-only tools).
        timeout_ms: Per-call timeout in ms (default 120000; None: no limit).
        effect: What running it twice does: ``read_only``, ``idempotent`` (use
            ``ctx.idempotency_key``), ``reconcilable`` (give ``reconcile``) or
            ``irreversible`` (the default). Resume decides from it whether a call a crash
            interrupted runs again (Rule: docs/effects.md#resume-decisions).
        reconcile: ``reconcile(idempotency_key) -> ToolOutput | None`` (sync or async), for a
            ``reconcilable`` tool only: the outcome of the run made with that key, or None.
        needs_approval: Each call waits for a person's durable yes (``dsh approve``) before
            its body runs (Rule: docs/effects.md#durable-approvals).

    Returns:
        The tool, or a decorator making one.

    Raises:
        AgentError: code ``TOOL`` for a bad name, timeout, effect or reconcile,
            ``*args``/``**kwargs``, or type hints that cannot be resolved or described as
            JSON Schema.
    """
    def make(body: Callable[..., Any]) -> Tool:
        try:
            return _build(body, name, description, parallel_safe, timeout_ms, effect,
                          reconcile, needs_approval)
        except AgentError:
            raise
        except Exception as exc:  # pydantic refuses a type it cannot describe
            raise AgentError(f"tool {name or body.__name__!r}: its parameters cannot be "
                             f"described as JSON Schema ({_one_line(exc)})",
                             code="TOOL") from exc

    return make(fn) if fn is not None else make


def tool_table(tools: Sequence[Tool]) -> dict[str, Tool]:
    """Index tools by name.

    Raises:
        AgentError: code ``TOOL`` when two tools share a name.
    """
    table: dict[str, Tool] = {}
    for item in tools:
        if not isinstance(item, Tool):
            raise AgentError(f"{item!r} is not a Tool; decorate the function with @tool",
                             code="TOOL")
        if item.name in table:
            raise AgentError(f"two tools are named {item.name!r}; tool names must be unique",
                             code="TOOL")
        table[item.name] = item
    return table

"""Tools the agent loop can call: ``@tool``, argument schemas, execution outcomes.

``@tool`` turns a typed function (sync or async) into a :class:`Tool`: the JSON Schema of its
parameters comes from the type hints through pydantic's ``TypeAdapter``, parameter
descriptions from the Google-style ``Args:`` section of its docstring, the tool description
from the docstring's first paragraph. Arguments are validated against the same adapter before
the body runs.

Outcome rules (persistence spec §8.2h):

* the body's return value becomes the result content (a string as one text block; a list of
  content blocks as is; any other JSON value as compact JSON text; a :class:`ToolOutput` for
  full control);
* an exception becomes an ``isError`` result whose ``error`` is ``{name: <exception class>,
  code: <its .code, else "TOOL_ERROR">}``; invalid arguments give ``INVALID_ARGUMENTS``, an
  unknown tool ``UNKNOWN_TOOL``, a body over its ``timeout_ms`` ``TOOL_TIMEOUT``;
* ``parallel_safe`` tools may run together in the loop's rolling pool; the others are
  exclusive (a barrier: nothing else runs while they do).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, overload

from dsh._errors import AgentError
from dsh.json import FrozenDict, JsonValue, snapshot_json

__all__ = [
    "DEFAULT_TOOL_TIMEOUT_MS",
    "Tool",
    "ToolContext",
    "ToolOutput",
    "tool",
]

DEFAULT_TOOL_TIMEOUT_MS: Final = 120_000
"""Per-call timeout of a tool body unless its ``timeout_ms`` says otherwise (2 minutes)."""

_NAME: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext:
    """What a tool body may learn about its call; declare a parameter of this type to get it.

    Attributes:
        session_id: The session the call belongs to.
        call_id: The provider's call id.
        turn: Turn number.
        step: Step number.
    """

    session_id: str
    call_id: str
    turn: int
    step: int


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
    """

    name: str
    description: str
    parameters: FrozenDict
    fn: Callable[..., Any]
    parallel_safe: bool = False
    timeout_ms: int | None = DEFAULT_TOOL_TIMEOUT_MS
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


def _build(fn: Callable[..., Any], name: str | None, description: str | None,
           parallel_safe: bool, timeout_ms: int | None) -> Tool:
    import pydantic  # imported here: `import dsh` stays free of it

    tool_name = name or fn.__name__
    if not _NAME.match(tool_name):
        raise AgentError(f"tool name {tool_name!r} must be 1-64 letters, digits, '_' or '-'",
                         code="TOOL")
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
                fn=fn, parallel_safe=parallel_safe, timeout_ms=timeout_ms,
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
         parallel_safe: bool = False,
         timeout_ms: int | None = DEFAULT_TOOL_TIMEOUT_MS) -> Callable[[Callable[..., Any]], Tool]:
    ...


def tool(fn: Callable[..., Any] | None = None, /, *, name: str | None = None,
         description: str | None = None, parallel_safe: bool = False,
         timeout_ms: int | None = DEFAULT_TOOL_TIMEOUT_MS,
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

    Returns:
        The tool, or a decorator making one.

    Raises:
        AgentError: code ``TOOL`` for a bad name, timeout, ``*args``/``**kwargs``, or type
            hints that cannot be resolved or described as JSON Schema.
    """
    def make(body: Callable[..., Any]) -> Tool:
        try:
            return _build(body, name, description, parallel_safe, timeout_ms)
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

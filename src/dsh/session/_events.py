"""The event envelope and the core vocabulary: what one log entry is (docs/events.md).

An :class:`Event` *is* its wire JSON object: a frozen mapping with the envelope keys ``type``,
``seq``, ``time``, ``data`` and, when present, ``sourceEventSeqs``, ``surfaceOp``, ``ignorable``.
Attribute access gives the Python names. Events are immutable; nothing in them can change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, NewType, TypeAlias

from dsh._errors import ConfigError
from dsh.json import FrozenDict, FrozenList, JsonValue, _untrack

SESSION_FORMAT_VERSION: Final = 0
"""The one format version this dsh reads and writes (docs/formats.md#the-session-header)."""

SessionId = NewType("SessionId", str)

REDACTION_APPLIED: Final = "redaction/applied"
"""Event type of a redaction's or erasure's record (ignorable, log-only): its ``items`` name
the seqs it rewrote in place (docs/events.md#redactionapplied, docs/forgetting.md)."""

QUARANTINE_APPLY: Final = "quarantine/apply"
"""Event type of a quarantine record (ignorable, log-only; docs/events.md#quarantineapply): its
``items`` name each withheld message's ``seq`` and the ``placeholder`` standing for it."""

QUARANTINE_RELEASE: Final = "quarantine/release"
"""Event type of an unquarantine record (ignorable, log-only): ``items`` ``{seq, placeholder,
restored}``."""


ENVELOPE_KEYS: Final = frozenset(
    {"type", "seq", "time", "data", "surfaceOp", "sourceEventSeqs", "ignorable"})

SURFACE_EVENT_TYPES: Final = frozenset(
    {"user/message", "assistant/message", "tool/result", "system/message"})
"""The types that may carry ``surfaceOp`` and produce model messages.

The core message types plus ``system/message``, whose data is a complete message with role
``system``. Rules: docs/events.md#surface-types, docs/rules.md#the-system-head.
"""

CORE_EVENT_TYPES: Final = frozenset({
    "turn/start", "turn/end", "step/start", "step/end", "user/message", "assistant/chunk",
    "assistant/message", "tool/call", "tool/result", "todo/write", "request/header",
    "request/context", "session/end-seed",
})
"""The 13 core types of ``SessionEventMap`` (docs/events.md#core-events)."""

KNOWN_EVENT_TYPES: Final = frozenset({
    "agent-preset/selected", "agent/inbox/spliced", "approval/asked", "approval/decided",
    "approval/policy", "assistant/chunk", "assistant/message", "command/done", "command/run",
    "compaction/end", "compaction/prune", "compaction/start", "compaction/summary",
    "feedback/record", "goal/change", "hook/invoked", "hook/result", "llm/retry",
    "llm/retry-started", "permission/preset", "plan/mode", "request/context", "request/header",
    "sandbox/mode", "schedule/change", "session/end-seed", "session/title",
    "session/title-llm-request", "step/end", "step/start", "subagent/descriptor", "team/member",
    "team/message/delivered", "team/message/queued", "team/task", "todo/write",
    "tool-workflow/agent-end", "tool-workflow/agent-start", "tool-workflow/run-end",
    "tool-workflow/run-start", "tool/call", "tool/code-dispatch", "tool/code-dispatch-start",
    "tool/result", "turn/end", "turn/start", "user/message", "web/deepseek-search-llm-request",
    "system/message",
})
"""dsh's generated ``KNOWN_SESSION_EVENT_TYPES`` (48) plus ``system/message``.

``system/message`` is a surface head that only a system replace may shadow
(docs/rules.md#the-system-head). A reader refuses other types unless the event is ``ignorable``
(docs/events.md#known-types-and-ignorable-events).
"""


class Event(FrozenDict):
    """One committed log entry; a frozen JSON object with attribute access.

    Attributes:
        type: Event type tag, e.g. ``"tool/result"``.
        seq: Position in the log (contiguous from 0).
        time: Epoch milliseconds at append; never decreases within a log.
        data: The frozen type-specific payload.
        surface_op: ``"append"``, a frozen replace op, or ``None`` for log-only events.
        source_event_seqs: Cited earlier seqs, or ``None`` when provenance is not recorded.
        ignorable: True when a reader that does not know ``type`` may skip it.

    Equality is JSON equality of the envelope, so an event equals its wire dict.
    Rule: docs/events.md#the-envelope.
    """

    __slots__ = ()

    @property
    def type(self) -> str:
        """The event type tag."""
        return self["type"]  # type: ignore[no-any-return]

    @property
    def seq(self) -> int:
        """The event's position in the log."""
        return self["seq"]  # type: ignore[no-any-return]

    @property
    def time(self) -> int:
        """Epoch milliseconds at append."""
        return self["time"]  # type: ignore[no-any-return]

    @property
    def data(self) -> JsonValue:
        """The frozen payload."""
        return self["data"]

    @property
    def surface_op(self) -> Any:
        """``"append"``, a replace op mapping, or None."""
        return self.get("surfaceOp")

    @property
    def source_event_seqs(self) -> FrozenList | None:
        """The cited earlier seqs, or None."""
        return self.get("sourceEventSeqs")

    @property
    def ignorable(self) -> bool:
        """True when unknown-type readers may skip this event."""
        return self.get("ignorable") is True

    def __repr__(self) -> str:
        return f"Event({dict.__repr__(self)})"

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:
        return (as_event, (dict(self),))


_dict_new = dict.__new__
_dict_update = dict.update


def as_event(fields: Mapping[str, Any]) -> Event:
    """Wrap an already-frozen envelope mapping as an :class:`Event`, without validation.

    The fast constructor for decoded records and the append path (it skips the re-init guard of
    ``FrozenDict.__init__``). Values must already be frozen JSON.
    """
    event = _dict_new(Event)
    _dict_update(event, fields)
    _untrack(event)  # immutable and acyclic: keep it out of the cyclic GC (a no-op without C)
    return event


def make_event(type: str, seq: int, time: int, data: JsonValue, *,
               surface_op: Any = None, source_event_seqs: Any = None) -> Event:
    """Build an :class:`Event` from already-snapshotted parts, in ``Session.append`` key order.

    No validation happens here: callers pass frozen JSON (see :func:`dsh.json.snapshot_json`).
    Key order is ``type, seq, time, data, sourceEventSeqs, surfaceOp``
    (docs/events.md#the-envelope).
    """
    fields: dict[str, Any] = {"type": type, "seq": seq, "time": time, "data": data}
    if source_event_seqs is not None:
        fields["sourceEventSeqs"] = source_event_seqs
    if surface_op is not None:
        fields["surfaceOp"] = surface_op
    return as_event(fields)


def is_surface_eligible_type(type: str) -> bool:
    """True for ``user/message``, ``assistant/message``, ``tool/result``.

    Rule: docs/rules.md#the-surface.
    """
    return type in SURFACE_EVENT_TYPES


def is_surface_event(event: Event) -> bool:
    """True for a surface-eligible event that carries ``surfaceOp`` (docs/rules.md#the-surface)."""
    return event["type"] in SURFACE_EVENT_TYPES and "surfaceOp" in event


def is_append_surface_event(event: Event) -> bool:
    """True for an append-origin surface event: the durable transcript material.

    Rule: docs/rules.md#the-surface.
    """
    return event["type"] in SURFACE_EVENT_TYPES and event.get("surfaceOp") == "append"


def is_replacement_surface_event(event: Event) -> bool:
    """True for a surface event whose ``surfaceOp`` is a replace (model-only copy).

    Rule: docs/rules.md#the-surface.
    """
    op = event.get("surfaceOp")
    return event["type"] in SURFACE_EVENT_TYPES and op is not None and op != "append"


# -- event types of your own ------------------------------------------------------------------

EventDataValidator: TypeAlias = "Callable[[Any], object]"
"""Called with the frozen ``data`` of an event about to be appended; raising refuses it."""

_CUSTOM_TYPES: dict[str, EventDataValidator | None] = {}


def register_event_type(type: str, validator: EventDataValidator | None = None
                        ) -> Callable[[], None]:
    """Declare an event type of your own so that :meth:`Session.append` accepts it.

    dsh's readers refuse a log holding an event type they do not know, unless that event is
    marked ``ignorable``. An appended event of a registered type is therefore always written
    with ``ignorable: true``: every reader keeps and skips it (this process, the ``dsh``
    command, a process that never registered the type, dsh in TypeScript). The registration is
    process-wide; registering a type again replaces its validator.

    Args:
        type: ``"namespace/name"``, not one of dsh's own types (``KNOWN_EVENT_TYPES``).
        validator: Called with the frozen ``data`` of each event of this type before it is
            committed; raise (``ValueError``, ``TypeError``, an ``EventRejectedError``) to
            refuse the append.

    Returns:
        A function that removes the registration (appends of the type are refused again).

    Raises:
        ConfigError: ``EVENT_TYPE_RESERVED`` for a dsh type, ``INVALID_EVENT_TYPE`` for a
            name without a ``/`` separating two non-empty parts.
    """
    if type in KNOWN_EVENT_TYPES:
        raise ConfigError(f"event type {type!r} is one of dsh's own types; it needs no "
                          "registration and its data is checked by dsh",
                          code="EVENT_TYPE_RESERVED", event_type=type)
    namespace, sep, name = type.partition("/") if isinstance(type, str) else ("", "", "")
    if not (sep and namespace.strip() and name.strip()):
        raise ConfigError(f"event type {type!r} must look like 'namespace/name' (for example "
                          "'myapp/checkpoint')", code="INVALID_EVENT_TYPE")
    _CUSTOM_TYPES[type] = validator

    def unregister() -> None:
        if _CUSTOM_TYPES.get(type, _UNSET) is validator:
            del _CUSTOM_TYPES[type]

    return unregister


_UNSET: Final[Any] = object()


def registered_event_type(type: str) -> tuple[bool, EventDataValidator | None]:
    """Return ``(registered, validator)`` for ``type`` (see :func:`register_event_type`)."""
    validator = _CUSTOM_TYPES.get(type, _UNSET)
    if validator is _UNSET:
        return False, None
    return True, validator


def unknown_type_hint(type: str) -> str | None:
    """The known or registered type that ``type`` looks like a typo of, or None.

    Rule: the closest name by :func:`difflib.get_close_matches` with a similarity of at least
    0.8 (``"step/strat"`` → ``"step/start"``; ``"myapp/note"`` → None).
    """
    import difflib  # here: only a rejected type needs it (docs/architecture.md, imported late)

    close = difflib.get_close_matches(type, [*KNOWN_EVENT_TYPES, *_CUSTOM_TYPES], n=1,
                                      cutoff=0.8)
    return close[0] if close else None

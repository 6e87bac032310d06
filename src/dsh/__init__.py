"""dsh: the durable memory of AI agents — one append-only event log per session.

The log is the only truth. What the model is sent is a projection of it (the *surface*); what a
person reads is another view of it (the transcript). Crashes are repaired by appending closers,
a fork copies a prefix and marks the cut, and compaction shadows a surface range with a summary
while the log keeps every byte. Persistence (JSONL, SQLite) sits behind one handle contract.

Start with ``with dsh.open("sqlite:///path/sessions.db") as store:``: a :class:`Store`, the
one object to hold. ``store.session(id)`` resumes or creates a :class:`Session`,
``store.recorder(id)`` logs your own loop, ``await store.agent(id, provider=..., config=...)``
runs dsh's; ``store.read``, ``store.list`` and ``store.tail`` look at stored logs; leaving the
block drains every write to disk. :class:`Session` alone is an in-memory log.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

from dsh._errors import (
    CompactionError,
    ConfigError,
    DshError,
    EventRejectedError,
    ImportFormatError,
    InvalidJsonError,
    InvariantError,
    LogCorruptError,
    PersistenceError,
    RightsError,
    SealDamagedError,
    SessionBusyError,
    SessionExistsError,
    SessionForkError,
    SessionFormatUnsupportedError,
    SessionNotFoundError,
    UnknownEventTypeError,
    WriteFailedError,
)
from dsh._version import __version__ as __version__

if TYPE_CHECKING:  # loaded on first use (see __getattr__); typed here as if imported
    from dsh._messages import (
        create_assistant_message,
        create_message,
        create_system_message,
        create_tool_result_message,
        create_user_message,
    )
    from dsh._store import Store, open
    from dsh.compaction import (
        DigestSummarizer,
        LlmSummarizer,
        PrunerConfig,
        Summarizer,
        compact_now,
        compact_surface_region,
        prune_session,
        select_compactable_range,
    )
    from dsh.persistence import WriteBehind
    from dsh.persistence import open_store as open_store  # deprecated (see __getattr__)
    from dsh.session import (
        SESSION_FORMAT_VERSION,
        TOOL_NOT_STARTED,
        TOOL_OUTCOME_UNKNOWN,
        Event,
        Session,
        SessionHeader,
        Violation,
        check_log,
        derive_event_message,
        fold_surface,
        interrupted_turn_closers,
        open_turn_closers,
        register_event_type,
        tool_pairing_balanced_after,
        tool_pairing_balanced_before,
    )
    from dsh.session import SessionStore as SessionStore  # deprecated (see __getattr__)


__all__ = [
    "SESSION_FORMAT_VERSION",
    "TOOL_NOT_STARTED",
    "TOOL_OUTCOME_UNKNOWN",
    "CompactionError",
    "ConfigError",
    "DigestSummarizer",
    "DshError",
    "Event",
    "EventRejectedError",
    "ImportFormatError",
    "InvalidJsonError",
    "InvariantError",
    "LlmSummarizer",
    "LogCorruptError",
    "PersistenceError",
    "RightsError",
    "SealDamagedError",
    "PrunerConfig",
    "Session",
    "SessionBusyError",
    "SessionExistsError",
    "SessionForkError",
    "SessionFormatUnsupportedError",
    "SessionHeader",
    "SessionNotFoundError",
    "Store",
    "Summarizer",
    "UnknownEventTypeError",
    "Violation",
    "WriteBehind",
    "WriteFailedError",
    "check_log",
    "compact_now",
    "compact_surface_region",
    "create_assistant_message",
    "create_message",
    "create_system_message",
    "create_tool_result_message",
    "create_user_message",
    "derive_event_message",
    "fold_surface",
    "interrupted_turn_closers",
    "open",
    "open_turn_closers",
    "prune_session",
    "register_event_type",
    "select_compactable_range",
    "tool_pairing_balanced_after",
    "tool_pairing_balanced_before",
]

_LAZY: dict[str, str] = {name: module for module, names in {
    "dsh._messages": ("create_assistant_message", "create_message", "create_system_message",
                      "create_tool_result_message", "create_user_message"),
    "dsh._store": ("Store", "open"),
    "dsh.compaction": ("DigestSummarizer", "LlmSummarizer", "PrunerConfig", "Summarizer",
                       "compact_now", "compact_surface_region", "prune_session",
                       "select_compactable_range"),
    "dsh.persistence": ("WriteBehind",),
    "dsh.session": ("SESSION_FORMAT_VERSION", "TOOL_NOT_STARTED", "TOOL_OUTCOME_UNKNOWN",
                    "Event", "Session", "SessionHeader", "Violation", "check_log",
                    "derive_event_message", "fold_surface", "interrupted_turn_closers",
                    "open_turn_closers", "register_event_type", "tool_pairing_balanced_after",
                    "tool_pairing_balanced_before"),
}.items() for name in names}
"""The public names loaded on first use (PEP 562), each with the module that defines it.

``import dsh`` loads only the errors and the version: a program that imports one submodule
(an adapter, the store of one backend) does not pay for the store front door, compaction and
the session core it does not use (docs/architecture.md#public-modules).
"""


def _as_dsh(value: object) -> object:
    """``value``, a class of dsh's printing as ``dsh.X`` from now on (tracebacks, ``repr``)."""
    if isinstance(value, type) and value.__module__.startswith("dsh."):
        value.__module__ = "dsh"
    return value


# Errors print as dsh.X in tracebacks (docs/architecture.md#public-modules); the main classes
# once loaded through dsh (__getattr__).
for _name in __all__:
    if _name not in _LAZY:
        _as_dsh(globals()[_name])
del _name


_DEPRECATED = {
    "open_store": "dsh.open(url) (a dsh.Store; store.persistence is the facade open_store gave)",
    "SessionStore": "dsh.open(url) (a dsh.Store; dsh.open('memory:') for an in-memory one)",
}
"""Names kept for one release, each with its replacement (a DeprecationWarning names it)."""


def _module_getattr(name: str) -> object:
    """A public name, loaded on first use; a submodule (``dsh.persistence``), imported.

    dsh's PEP 562 ``__getattr__``, hidden from type checkers: every public name is typed by its
    TYPE_CHECKING import, so a misspelt one is a type error, not an ``object``.

    Raises:
        AttributeError: ``name`` is neither a public name nor a submodule of dsh (a name
            that is no identifier, ``"x.y"``, included: ``hasattr`` answers False).
    """
    module = _LAZY.get(name)
    if module is not None:
        value = globals()[name] = _as_dsh(getattr(importlib.import_module(module), name))
        return value
    replacement = _DEPRECATED.get(name)
    if replacement is None:
        if name.isidentifier() and not name.startswith("__") \
                and importlib.util.find_spec(f"dsh.{name}") is not None:
            return importlib.import_module(f"dsh.{name}")  # (binds it here as an attribute)
        raise AttributeError(f"module 'dsh' has no attribute {name!r}")
    if name == "open_store":  # warns when called
        from dsh.persistence import open_store

        return open_store
    import warnings

    warnings.warn(f"dsh.{name} is deprecated; use {replacement}", DeprecationWarning,
                  stacklevel=2)
    from dsh.session import SessionStore

    return SessionStore


if not TYPE_CHECKING:
    __getattr__ = _module_getattr


def __dir__() -> list[str]:
    # dir(dsh) is the public API: not the submodules bound as attributes by their import.
    return sorted([*__all__, "__version__"])

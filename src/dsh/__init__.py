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
from dsh._messages import (
    create_assistant_message,
    create_message,
    create_system_message,
    create_tool_result_message,
    create_user_message,
)
from dsh._store import Store, open
from dsh._version import __version__ as __version__
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

if TYPE_CHECKING:  # the deprecated names, typed as before (see __getattr__)
    from dsh.persistence import open_store as open_store
    from dsh.session import SessionStore as SessionStore


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

# Errors and the main classes print as dsh.X in tracebacks (docs/architecture.md#public-modules).
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) and _obj.__module__.startswith("dsh."):
        _obj.__module__ = "dsh"
del _name, _obj


_DEPRECATED = {
    "open_store": "dsh.open(url) (a dsh.Store; store.persistence is the facade open_store gave)",
    "SessionStore": "dsh.open(url) (a dsh.Store; dsh.open('memory:') for an in-memory one)",
}
"""Names kept for one release, each with its replacement (a DeprecationWarning names it)."""


def __getattr__(name: str) -> object:
    replacement = _DEPRECATED.get(name)
    if replacement is None:
        raise AttributeError(f"module 'dsh' has no attribute {name!r}")
    if name == "open_store":  # warns when called
        from dsh.persistence import open_store

        return open_store
    import warnings

    warnings.warn(f"dsh.{name} is deprecated; use {replacement}", DeprecationWarning,
                  stacklevel=2)
    from dsh.session import SessionStore

    return SessionStore


def __dir__() -> list[str]:
    # dir(dsh) is the public API: not the submodules bound as attributes by their import.
    return sorted([*__all__, "__version__"])

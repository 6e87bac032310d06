"""dsh: the durable memory of AI agents — one append-only event log per session.

The log is the only truth. What the model is sent is a projection of it (the *surface*); what a
person reads is another view of it (the transcript). Crashes are repaired by appending closers,
a fork copies a prefix and marks the cut, and compaction shadows a surface range with a summary
while the log keeps every byte. Persistence (JSONL, SQLite) sits behind one handle contract.

Start with ``with dsh.open("sqlite:///path/sessions.db") as store:`` (a :class:`SessionStore`
bound to a store URL; ``store.session(id)`` resumes or creates a :class:`Session`; leaving the
block drains every write to disk). :class:`Session` alone is an in-memory log;
:func:`open_store` gives the persistence facade for whole-store operations.
"""

from __future__ import annotations

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
from dsh.persistence import open_store
from dsh.persistence._sessions import open
from dsh.session import (
    SESSION_FORMAT_VERSION,
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    Event,
    Session,
    SessionHeader,
    SessionStore,
    check_log,
    derive_event_message,
    fold_surface,
    interrupted_turn_closers,
    open_turn_closers,
    register_event_type,
    tool_pairing_balanced_after,
    tool_pairing_balanced_before,
)

__version__ = "0.1.0"

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
    "PrunerConfig",
    "Session",
    "SessionBusyError",
    "SessionExistsError",
    "SessionForkError",
    "SessionFormatUnsupportedError",
    "SessionHeader",
    "SessionNotFoundError",
    "SessionStore",
    "Summarizer",
    "UnknownEventTypeError",
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
    "open_store",
    "open_turn_closers",
    "prune_session",
    "register_event_type",
    "select_compactable_range",
    "tool_pairing_balanced_after",
    "tool_pairing_balanced_before",
]

# Errors and the main classes print as dsh.X in tracebacks (STYLE §1).
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) and _obj.__module__.startswith("dsh."):
        _obj.__module__ = "dsh"
del _name, _obj


def __dir__() -> list[str]:
    # dir(dsh) is the public API: not the submodules bound as attributes by their import.
    return sorted([*__all__, "__version__"])

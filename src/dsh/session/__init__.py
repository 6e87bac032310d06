"""The session core: the event log, its surface, seeds, the store and fork (no I/O)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh._lazy import lazy_exports
from dsh.session._events import (
    CORE_EVENT_TYPES,
    ENVELOPE_KEYS,
    KNOWN_EVENT_TYPES,
    QUARANTINE_APPLY,
    QUARANTINE_RELEASE,
    REDACTION_APPLIED,
    SESSION_FORMAT_VERSION,
    SURFACE_EVENT_TYPES,
    Event,
    SessionId,
    as_event,
    is_append_surface_event,
    is_replacement_surface_event,
    is_surface_eligible_type,
    is_surface_event,
    make_event,
    register_event_type,
    unknown_type_hint,
)
from dsh.session._header import (
    HEADER_KEYS,
    SessionHeader,
    is_absolute_path,
    make_header,
    validate_header,
)
from dsh.session._paging import PAGE_EVENTS, EventSource, PagedLog
from dsh.session._repair import (
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    CloseCause,
    closer_text,
    closers_of_contiguous,
    interrupted_turn_closers,
    open_turn_closers,
)
from dsh.session._restore_state import RestoreFold, RestoreState
from dsh.session._session import (
    Clock,
    EventLog,
    MessageLog,
    SeedStream,
    Session,
    call_config_equals,
    canonical_header,
    fold_request_header,
    header_equals,
    stored_event_problem,
    wall_clock_ms,
)
from dsh.session._store import OpenTurnPolicy, PersistencePort, SessionStore, StoreObserver
from dsh.session._surface import (
    LazyNodes,
    NodeSeqs,
    Surface,
    SurfaceFold,
    SurfaceNodes,
    SurfacePlan,
    SurfaceReplacement,
    TailedPack,
    derive_event_message,
    fold_surface,
)

if TYPE_CHECKING:  # loaded on first use (see __getattr__): a session never needs them to run
    from dsh.session._chunks import CHUNK_ROW_TAGS, MIN_RUN, decode_storage_record, pack_chunk_runs
    from dsh.session._invariants import InvariantObserver, InvariantTrace, Violation, check_log
    from dsh.session._pairing import (
        PairingSession,
        balanced_cuts,
        tool_pairing_balanced_after,
        tool_pairing_balanced_before,
    )

__all__ = [
    "CHUNK_ROW_TAGS",
    "CORE_EVENT_TYPES",
    "MIN_RUN",
    "PAGE_EVENTS",
    "TOOL_NOT_STARTED",
    "TOOL_OUTCOME_UNKNOWN",
    "CloseCause",
    "InvariantObserver",
    "InvariantTrace",
    "PairingSession",
    "Violation",
    "balanced_cuts",
    "check_log",
    "closer_text",
    "closers_of_contiguous",
    "decode_storage_record",
    "interrupted_turn_closers",
    "open_turn_closers",
    "pack_chunk_runs",
    "tool_pairing_balanced_after",
    "tool_pairing_balanced_before",
    "ENVELOPE_KEYS",
    "HEADER_KEYS",
    "KNOWN_EVENT_TYPES",
    "QUARANTINE_APPLY",
    "QUARANTINE_RELEASE",
    "REDACTION_APPLIED",
    "SESSION_FORMAT_VERSION",
    "SURFACE_EVENT_TYPES",
    "Clock",
    "Event",
    "EventLog",
    "EventSource",
    "MessageLog",
    "OpenTurnPolicy",
    "PagedLog",
    "PersistencePort",
    "LazyNodes",
    "NodeSeqs",
    "RestoreFold",
    "RestoreState",
    "SeedStream",
    "Session",
    "SessionHeader",
    "SessionId",
    "SessionStore",
    "StoreObserver",
    "Surface",
    "SurfaceFold",
    "SurfaceNodes",
    "SurfacePlan",
    "SurfaceReplacement",
    "TailedPack",
    "call_config_equals",
    "canonical_header",
    "derive_event_message",
    "fold_request_header",
    "fold_surface",
    "header_equals",
    "is_absolute_path",
    "is_append_surface_event",
    "is_replacement_surface_event",
    "is_surface_eligible_type",
    "is_surface_event",
    "make_event",
    "make_header",
    "register_event_type",
    "unknown_type_hint",
    "as_event",
    "validate_header",
    "stored_event_problem",
    "wall_clock_ms",
]

# The log checker and the pairing helpers are read by verify, import, compaction and tests,
# never by a session's open, read or append: importing them lazily keeps them out of an
# adapter's process (docs/adapters.md#memory). The chunk-run packing loads with a JSONL log
# or the pure-Python row codec (the accelerator packs and unpacks SQLite rows itself).
__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    **dict.fromkeys(("CHUNK_ROW_TAGS", "MIN_RUN", "decode_storage_record", "pack_chunk_runs"),
                    "dsh.session._chunks"),
    **dict.fromkeys(("InvariantObserver", "InvariantTrace", "Violation", "check_log"),
                    "dsh.session._invariants"),
    **dict.fromkeys(("PairingSession", "balanced_cuts", "tool_pairing_balanced_after",
                     "tool_pairing_balanced_before"), "dsh.session._pairing"),
}, __all__)

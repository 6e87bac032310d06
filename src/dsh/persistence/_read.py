"""The cold-read pipeline: a stored log as a backend returns it → an :class:`Inspection`.

Every whole-log read of the facade (``read``, ``inspect``, ``load``, ``fork``, ``resume``'s full
path, the listing's fallback) runs one pipeline, in this order (docs/rules.md#the-read-pipeline):
identity, format version, legacy v0 normalisation, vocabulary, crash-repair closers; ``inspect``,
``load`` and ``resume`` then validate the whole log with ``Session.restore`` in memory. Nothing here
keeps state: each function takes the backend (or a handle) it reads.

What writes: only :func:`load_stored`, which commits the repair (truncates a torn tail, appends
the closers) through the write handle it read with. A live session is never read here: the
facade answers a live id from the live session (:func:`live_inspection`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from dsh._errors import (
    EventRejectedError,
    LogCorruptError,
    PersistenceError,
    UnknownEventTypeError,
)
from dsh.json import FrozenDict
from dsh.persistence._contract import (
    Backend,
    Capabilities,
    ColdRead,
    Handle,
    NamesFiles,
    ReadsWhole,
    TornTail,
    format_version_refusal,
)
from dsh.persistence._legacy import normalize_legacy_events, stored_prescan
from dsh.session import (
    KNOWN_EVENT_TYPES,
    SESSION_FORMAT_VERSION,
    Event,
    Session,
    closers_of_contiguous,
    interrupted_turn_closers,
    unknown_type_hint,
)

__all__ = [
    "Inspection",
    "has_open_turn",
    "inspect_stored",
    "live_inspection",
    "load_stored",
    "plain_records",
    "raw_path",
    "read_pipeline",
    "read_stored",
    "restore_validated",
    "summary_title",
]

_TITLE_CHARS = 80


@dataclass(frozen=True, slots=True)
class Inspection:
    """A logical view of one session (``Persistence.inspect`` / ``load``).

    Attributes:
        header: The stored (or live) header.
        events: The normalised committed events followed by the closers, seq contiguous.
        closers: The crash-repair closers (``inspect``: in memory only; ``load``: committed).
            Empty for a balanced log and for a live snapshot.
        torn: The torn tail found by the cold read (``load``: truncated on disk), or None.
        revision: The backend revision of the read (``"live"`` for a live snapshot).
        live: True when the view is a live session's snapshot (it may end in an open turn).
    """

    header: FrozenDict
    events: tuple[Event, ...]
    closers: tuple[Event, ...]
    torn: TornTail | None
    revision: str
    live: bool = False

    @property
    def stored_events(self) -> tuple[Event, ...]:
        """The events as read, without the repair closers (``load``: the log before its repair).

        ``events[:len(events) - len(closers)]``; seq contiguous from 0.
        """
        return self.events[:len(self.events) - len(self.closers)]


def read_pipeline(session_id: str, cold: ColdRead, *, path: str | None = None
                  ) -> tuple[tuple[Event, ...], tuple[Event, ...]]:
    """Run the cold-read pipeline over a backend read, in the documented order.

    Rule: docs/rules.md#the-read-pipeline.

    1. identity: the header id must be ``session_id``;
    2. format version: not 0 → refusal saying which direction (upgrade dsh for newer logs);
    3. legacy v0 normalisation (:mod:`dsh.persistence._legacy`);
    4. vocabulary: every type known or the event marked ``ignorable: true``;
    5. crash repair: ``interrupted_turn_closers`` over the normalised events (its seq check
       skipped for a read marked ``contiguous`` whose events were not normalised).

    Args:
        session_id: The requested id.
        cold: The backend read (offset 0).
        path: The raw log path for messages, when the backend has one.

    Returns:
        tuple: ``(events, closers)``. Without a legacy record ``events`` holds the very event
        objects of ``cold.events``.

    Raises:
        LogCorruptError: identity mismatch, legacy refusal, malformed events for repair.
        SessionFormatUnsupportedError: foreign format version.
        UnknownEventTypeError: an unknown, non-ignorable event type (type and seq named).
    """
    header = cold.header
    if header.get("id") != session_id:
        raise LogCorruptError(f"stored session identity mismatch: requested id {session_id!r} "
                              f"does not match header id {header.get('id')!r}",
                              session_id=session_id, path=path)
    version = header.get("version")
    if version != SESSION_FORMAT_VERSION or type(version) is not int:
        raise format_version_refusal(session_id, version, path=path)
    if cold.prescan is not None:
        legacy_at, unknown_at = cold.prescan  # found while the backend decoded them
    else:
        legacy_at, unknown_at = stored_prescan(cold.events, KNOWN_EVENT_TYPES)
    # Without a legacy shape (found in one pass) the events stay the very same objects.
    events = (normalize_legacy_events(cold.events, session_id) if legacy_at >= 0
              else tuple(cold.events))
    for event in events if legacy_at >= 0 else events[unknown_at:unknown_at + 1]:
        etype = event.get("type")
        if etype not in KNOWN_EVENT_TYPES and event.get("ignorable") is not True:
            raw = f" (raw log: {path})" if path else ""
            guess = unknown_type_hint(etype) if isinstance(etype, str) else None
            cause = (f"which looks like a typo of {guess!r}: the program that wrote this log "
                     "appended a misspelt type that no dsh reads, and it is not marked "
                     "ignorable" if guess else
                     "which is unknown to this dsh and not marked ignorable; if a newer dsh "
                     "wrote it, upgrade dsh to read it")
            raise UnknownEventTypeError(
                f"stored session {session_id!r} holds event type {etype!r} at seq "
                f"{event.get('seq')}, {cause}{raw}", session_id=session_id, event_type=str(etype),
                seq=event.get("seq") if type(event.get("seq")) is int else None, path=path)
    try:
        # the very objects a backend read at contiguous seqs need no second check of them
        closers = (closers_of_contiguous(events, "interrupted")
                   if cold.contiguous and legacy_at < 0 else interrupted_turn_closers(events))
    except EventRejectedError as exc:
        raise LogCorruptError(f"stored session {session_id!r} failed validation: {exc.message}",
                              session_id=session_id, path=path, seq=exc.where.get("seq")
                              if isinstance(exc.where.get("seq"), int) else None) from exc
    return events, closers


def plain_records(events: Sequence[Event]) -> bool:
    """True when no stored record needs legacy normalisation (one pass over ``events``)."""
    return stored_prescan(events, KNOWN_EVENT_TYPES)[0] < 0


def corrupt_on_rejection(session_id: str, exc: EventRejectedError) -> LogCorruptError:
    """A restore validation failure of a stored log, as the corruption it is.

    Rule: docs/rules.md#the-read-pipeline.
    """
    seq = exc.where.get("seed_index")
    return LogCorruptError(f"stored session {session_id!r} failed validation: {exc.message}",
                           session_id=session_id, seq=seq if isinstance(seq, int) else None)


def restore_validated(session_id: str, seed: Sequence[Event], header: FrozenDict) -> Session:
    """``Session.restore`` of a stored log, detached from any store.

    Rule: docs/rules.md#the-read-pipeline.

    Raises:
        LogCorruptError: the log does not validate (the seed index named as ``seq``).
    """
    inherited = header.get("seedLength") or 0
    try:
        return Session.restore(session_id, seed, header, inherited_event_count=inherited)
    except EventRejectedError as exc:
        raise corrupt_on_rejection(session_id, exc) from exc


def raw_path(handle: Handle, capabilities: Capabilities) -> str | None:
    """The file a handle reads, for messages, when its backend names one (JSONL)."""
    return str(cast(NamesFiles, handle).path) if capabilities.file_paths else None


def has_open_turn(events: Sequence[Event]) -> bool:
    """Whether the last turn boundary in ``events`` is a ``turn/start``."""
    open_turn = False
    for event in events:
        etype = event.get("type")
        if etype == "turn/start":
            open_turn = True
        elif etype == "turn/end":
            open_turn = False
    return open_turn


def summary_title(events: Sequence[Event]) -> str | None:
    """``SessionSummary.title``: the last ``session/title``, else the first typed prompt.

    Of what the model view still holds (:func:`dsh.persistence._listing.shown_titles`, as
    ``dsh ls``): a cleared, popped or quarantined prompt never titles the session. The prompt
    is its first line, cut at 80 characters.
    """
    from dsh.persistence._listing import shown_titles
    title, prompt = shown_titles(events)
    return title if title is not None else (prompt[:_TITLE_CHARS] if prompt else None)


def live_inspection(header: Mapping[str, Any], events: Sequence[Event]) -> Inspection:
    """The view of a live session: its snapshot, no closers, revision ``"live"``."""
    return Inspection(FrozenDict(header), tuple(events), (), None, "live", live=True)


def read_stored(backend: Backend, session_id: str) -> Inspection:
    """The pipeline over a read handle, without restore validation (``Persistence.read``).

    Raises:
        SessionNotFoundError, LogCorruptError, SessionFormatUnsupportedError,
        UnknownEventTypeError.
    """
    if backend.capabilities.whole_reads:  # one step (one round trip on PostgreSQL)
        cold = cast(ReadsWhole, backend).read_whole(session_id)
        path = None
    else:
        with backend.open(session_id, "read") as handle:
            cold = handle.read(0)
            path = raw_path(handle, backend.capabilities)
    events, closers = read_pipeline(session_id, cold, path=path)
    return Inspection(cold.header, events + closers, closers, cold.torn, cold.revision)


def inspect_stored(backend: Backend, session_id: str) -> Inspection:
    """The pipeline plus full restore validation; closers stay in memory (``inspect``).

    Raises:
        SessionNotFoundError, LogCorruptError, SessionFormatUnsupportedError,
        UnknownEventTypeError.
    """
    read = read_stored(backend, session_id)
    restore_validated(session_id, read.events, read.header)
    return read


def commit_repair(handle: Handle, session_id: str, closers: Sequence[Event],
                  where: str) -> None:
    """Commit a crash repair through ``handle``: cut a torn tail, append the closers, flush.

    Args:
        handle: The write handle the log was read through.
        session_id: The session (for the message).
        closers: The repair closers (may be empty: only a torn tail is cut).
        where: What the log is (a path or URL), for the message.

    Raises:
        PersistenceError: code ``REPAIR_FAILED``: the disk refused the repair (full, I/O
            error); no committed event changed (a torn tail is cut only after its bytes are
            saved) and nothing is resumed (``docs/errors.md#persistenceerror``).
        LogCorruptError, SessionBusyError: as the handle raises them.
    """
    try:
        handle.append(closers)
        handle.flush()
    except OSError as exc:
        raise PersistenceError(
            f"session {session_id!r} in {where}: the crash repair (cutting the torn tail, "
            f"appending {len(closers)} closer(s)) could not be written: "
            f"{exc.strerror or exc}; no committed event was changed (a torn tail is cut "
            f"only after its bytes are saved beside the log); free space on the store's disk "
            f"(or fix the device) and resume again",
            code="REPAIR_FAILED", session_id=session_id, path=where) from exc


def load_stored(backend: Backend, session_id: str) -> Inspection:
    """The pipeline and validation through a write handle, then the repair committed (``load``).

    A torn tail is truncated and the closers appended as one batch, flushed; a balanced, untorn
    log is not written to.

    Raises:
        SessionBusyError: another writer holds the id.
        SessionNotFoundError, LogCorruptError, SessionFormatUnsupportedError,
        UnknownEventTypeError.
    """
    with backend.open(session_id, "write") as handle:
        cold = handle.read(0)
        events, closers = read_pipeline(session_id, cold,
                                        path=raw_path(handle, backend.capabilities))
        restore_validated(session_id, events + closers, cold.header)
        revision = cold.revision  # nothing written: the read's own revision stands
        if closers or cold.torn is not None:
            commit_repair(handle, session_id, closers,
                          raw_path(handle, backend.capabilities) or backend.url)
            revision = handle.read(len(events) + len(closers)).revision
    return Inspection(cold.header, events + closers, closers, cold.torn, revision)

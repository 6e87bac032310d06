"""Resume: a stored session back into a live store, through its restore point when it can.

The order (docs/rules.md#resume): take write ownership first (open the session for
writing: a concurrent resume anywhere gets ``SessionBusyError``), read cold through that
handle, rebuild and validate in memory, commit the crash repair through the same handle, then
publish the session into the store, whose observer takes the handle over
(:meth:`~dsh.persistence._write_behind.PersistenceObserver.adopt`).

Two ways to read, one result:

* through the log's restore point (:mod:`dsh.persistence._restore_point`): only the events after
  its cut are read; the session pages earlier events in on demand. Any doubt (no restore point,
  a stale or damaged one, a legacy or unknown event in the tail, a tail that does not
  validate) gives up, counted and logged at DEBUG, and
* the whole log through the read pipeline (:mod:`dsh.persistence._read`), which gives the same
  session or the precise error.

Also here: writing a restore point for a stored log on request (:func:`write_restore_point`) and
checking one against a full read for ``dsh verify`` (:func:`check_restore_point`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, cast

from dsh._errors import DshError, EventRejectedError
from dsh.json import FrozenDict
from dsh.persistence import _restore_point as rp
from dsh.persistence._contract import Backend, Capabilities, Handle
from dsh.persistence._legacy import stored_prescan
from dsh.persistence._observer import Adoption, PersistenceObserver
from dsh.session import (
    KNOWN_EVENT_TYPES,
    NO_OLD_MARKS,
    SESSION_FORMAT_VERSION,
    Event,
    RestoreFold,
    Session,
    SessionStore,
    apply_old_marks,
    open_turn_closers,
)

if TYPE_CHECKING:  # (the read pipeline loads when a log is read whole or repaired: a resume
    # from a restore point, an adapter's open, runs none of it)
    from dsh.persistence._read import Inspection

__all__ = ["check_restore_point", "resume", "write_restore_point"]


def resume(backend: Backend, store: SessionStore, session_id: str,
           observer_of: Callable[[SessionStore], PersistenceObserver], *,
           on_handle: Callable[[Handle], object] | None = None) -> Session:
    """Resume ``session_id`` into ``store`` (see the module).

    ``observer_of(store)`` gives the store's write-behind observer (binding it when needed) once
    the session is ready to publish.

    1. open the session for writing (exclusive); ``on_handle(handle)`` then sees the handle;
    2. read through the restore point, else read the whole log through the pipeline;
       closers = the interrupted turn's;
    3. rebuild (``store.prepare_paged`` / ``store.prepare``: validation, the plain
       ``session/end-seed`` appended in memory) - before any write, so an invalid log is
       refused untouched;
    4. commit the repair through the same handle (truncate a torn tail, append the closers,
       flush);
    5. hand the handle to the store's observer and publish (``enter`` + ``announce``); its
       writer then writes the suffix (the end-seed marker);
    6. append the surface removals that an earlier dsh's old adapter marks stand for and
       the log does not show yet (:func:`dsh.session.apply_old_marks`), once: the log then
       says them, so every reader honours them. The marks come from the restore point's
       state and the tail (nothing before the cut is read), or from the whole log read.
       Rule: docs/forgetting.md#logs-from-before-surface-removals.

    Returns:
        The published session.

    Raises:
        SessionBusyError: another writer holds the id.
        SessionNotFoundError, LogCorruptError, SessionFormatUnsupportedError,
        UnknownEventTypeError: the log cannot be read or does not validate.
        Exception: an ``on_created`` veto of the publication (the handle is closed).
    """
    handle = backend.open(session_id, "write")
    observer: PersistenceObserver | None = None
    try:
        if on_handle is not None:
            on_handle(handle)
        paged = _from_restore_point(store, session_id, handle, backend.capabilities)
        if isinstance(paged, tuple):
            session, adoption, closers = paged
            repair = bool(closers)
        else:
            from dsh.persistence._read import plain_records, raw_path, read_pipeline
            cold = handle.read(0)
            events, closers = read_pipeline(session_id, cold,
                                            path=raw_path(handle, backend.capabilities))
            seed = events + closers
            session = _prepare(store, session_id, seed, cold.header)
            repair = bool(closers) or cold.torn is not None
            # The pipeline hands back the stored tuple itself when nothing was normalised.
            adoption = Adoption(handle, len(seed), foldable=events is cold.events
                                or plain_records(cold.events),
                                restore_point_outdated=paged == _OUTDATED,
                                old_marks=NO_OLD_MARKS.taking(events))
        if repair:
            from dsh.persistence._read import commit_repair, raw_path
            commit_repair(handle, session_id, closers,
                          raw_path(handle, backend.capabilities) or backend.url)
        observer = observer_of(store)
        observer.adopt(session_id, adoption)
        with observer.publishing(session):
            _publish(store, session)
        if adoption.old_marks:  # written behind like any append; twice adds nothing
            apply_old_marks(session, adoption.old_marks)
    except BaseException:
        if observer is not None:
            observer.drop_adoption(session_id)
        handle.close()
        raise
    return session


_OUTDATED: Final = "outdated"
"""What :func:`_from_restore_point` returns for a restore point of format 1 or 2."""


def _from_restore_point(store: SessionStore, session_id: str, handle: Handle,
                        capabilities: Capabilities
                        ) -> tuple[Session, Adoption, tuple[Event, ...]] | str | None:
    """Restore through the log's restore point, reading only its tail; or None.

    The tail goes through the same checks as a full read (identity, version, vocabulary,
    closers over the open turn, restore validation). Nothing is written here.

    Returns:
        ``(session, adoption, closers)``: the prepared session, the hand-off for its writer
        (cursor past the closers, the restore point's state and extent), and the closers the
        caller commits; else :data:`_OUTDATED` for a restore point of format 1 or 2 (the
        caller's writer replaces it), or None.
    """
    if not capabilities.restore_points:
        return None
    keeper = cast(rp.KeepsRestorePoints, handle)  # what the capability promises
    try:
        point, cold, source = keeper.read_from_restore_point()
        state = point.state
        if state.old_marks is None:
            # a format 1 or 2 restore point: it does not say whether its prefix holds old
            # marks; the whole read finds them, and the first flush writes a format 3 one
            raise rp.RestorePointRefused("old-marks-unknown")
        tail = cold.events
        header = cold.header
        if header.get("id") != session_id or header.get("version") != SESSION_FORMAT_VERSION:
            raise rp.RestorePointRefused("header")
        legacy_at, unknown_at = stored_prescan(tail, KNOWN_EVENT_TYPES)
        if legacy_at >= 0:
            raise rp.RestorePointRefused("legacy")
        for event in tail[unknown_at:unknown_at + 1]:
            if event.get("type") not in KNOWN_EVENT_TYPES \
                    and event.get("ignorable") is not True:
                raise rp.RestorePointRefused("unknown-type")
        cut = len(source)
        if state.turn_open and not any(
                e["type"] in ("turn/start", "turn/end") for e in tail):
            window: Sequence[Event] = [*source.read(state.turn_boundary, cut), *tail]
            base = state.turn_boundary
        else:
            window, base = tail, cut
        closers = open_turn_closers(window, "interrupted", base_seq=base)
        session = store.prepare_paged(session_id, header=header, state=state, source=source,
                                      tail=tail + closers,
                                      inherited_event_count=header.get("seedLength") or 0)
    except rp.RestorePointRefused as exc:
        rp.note_refusal(session_id, exc.reason, exc.error)
        return _OUTDATED if exc.reason == "old-marks-unknown" else None
    except DshError as exc:
        rp.note_refusal(session_id, f"invalid:{exc.code}")
        return None
    rp.stats["used"] += 1
    anchor = point.anchor
    adoption = Adoption(handle, cut + len(tail) + len(closers), resumed=state,
                        restore_point_count=anchor.event_count,
                        restore_point_bytes=anchor.byte_offset,
                        # the prefix's marks (the state) and the tail's (closers hold none)
                        old_marks=state.old_marks.taking(tail))
    return session, adoption, closers


def _prepare(store: SessionStore, session_id: str, seed: tuple[Event, ...],
             header: FrozenDict) -> Session:
    """Restore through ``store.prepare`` (its clock, its live-id check).

    Raises:
        LogCorruptError: the log does not validate.
        SessionExistsError: the id is live in ``store``.
    """
    try:
        return store.prepare(session_id, seed=seed, header=header,
                             inherited_event_count=header.get("seedLength") or 0,
                             seed_source="persistence")
    except EventRejectedError as exc:
        from dsh.persistence._read import corrupt_on_rejection
        raise corrupt_on_rejection(session_id, exc) from exc


def _publish(store: SessionStore, session: Session) -> None:
    """Enter and announce ``session``; a veto detaches it again and is raised."""
    detach = store.enter(session)
    try:
        store.announce(session)
    except BaseException:
        detach()
        raise


def write_restore_point(backend: Backend, session_id: str) -> bool:
    """Write a restore point of a stored, non-live session from a full, validated read.

    Returns:
        True when one was written; False when the backend keeps none, or the log is empty,
        has a torn tail, or holds legacy records (those always read in full).

    Raises:
        SessionBusyError: another writer holds the id.
        SessionNotFoundError, LogCorruptError, SessionFormatUnsupportedError,
        UnknownEventTypeError: the log cannot be read or does not validate.
    """
    with backend.open(session_id, "write") as handle:
        if not backend.capabilities.restore_points:
            return False
        keeper = cast(rp.KeepsRestorePoints, handle)  # what the capability promises
        from dsh.persistence._read import plain_records, raw_path, read_pipeline, restore_validated
        cold = handle.read(0)
        events, closers = read_pipeline(session_id, cold,
                                        path=raw_path(handle, backend.capabilities))
        restore_validated(session_id, events + closers, cold.header)
        if not cold.events or cold.torn is not None or not plain_records(cold.events):
            return False
        fold = RestoreFold(cold.header.get("seedLength") or 0)
        fold.feed(cold.events)
        anchor = keeper.restore_point_anchor()
        if anchor is None or anchor.event_count != len(cold.events):
            return False
        keeper.write_restore_point(
            rp.encode_restore_point(rp.RestorePoint(anchor=anchor, state=fold.state())))
    return True


def check_restore_point(backend: Backend, session_id: str, full: Inspection
                        ) -> rp.RestorePointCheck:
    """Check the session's restore point against ``full``, a full read of the session.

    Returns:
        The verdict (absent, consistent, ignored with why, or misleading); a bad restore point
        is never an error, since a resume ignores it.

    Raises:
        SessionNotFoundError: the session vanished.
    """
    with backend.open(session_id, "read") as handle:
        keeper = (cast(rp.KeepsRestorePoints, handle) if backend.capabilities.restore_points
                  else None)
        return rp.check_restore_point(keeper, full.stored_events,
                                      full.header.get("seedLength") or 0)

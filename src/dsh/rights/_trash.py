"""The trash: ``dsh rm`` (reversible), ``dsh restore`` and ``dsh rm --purge`` (erasure).

Rule: docs/forgetting.md#deletion-with-a-way-back. Trashing and restoring write nothing to the
sessions: each appends one record to the store log (:mod:`dsh.rights._storelog`), which
``dsh ls`` reads to hide what is in the trash. A purge is :func:`dsh.rights.erase` plus its
``store/erased {purge: true}`` record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dsh._errors import RightsError, SessionNotFoundError
from dsh.persistence import STORE_LOG_ID
from dsh.rights._held import HasPersistence, facade
from dsh.rights._storelog import ERASED, RESTORED, TRASHED, append_records, store_log

if TYPE_CHECKING:
    from dsh.persistence import Persistence
    from dsh.rights._erase import ErasureReceipt
    from dsh.session import Clock


def _stored(persistence: Persistence, session_ids: Iterable[str]) -> list[str]:
    ids: list[str] = []
    for sid in session_ids:
        if sid == STORE_LOG_ID or not persistence.exists(sid):
            raise SessionNotFoundError(f"session {sid!r} is not stored in {persistence.url}",
                                       session_id=sid)
        if sid not in ids:
            ids.append(sid)
    return ids


@dataclass(frozen=True, slots=True)
class TrashResult:
    """What :func:`trash` or :func:`restore` did.

    Attributes:
        changed: Sessions moved (into the trash, or back out of it or the archive).
        unchanged: Sessions already where they were asked to go.
        record_seq: Seq of the store-log record, or None when nothing changed.
    """

    changed: tuple[str, ...]
    unchanged: tuple[str, ...]
    record_seq: int | None

    def to_json(self) -> dict[str, Any]:
        """``{"changed", "unchanged", "recordSeq"}``."""
        return {"changed": list(self.changed), "unchanged": list(self.unchanged),
                "recordSeq": self.record_seq}


def trash(store: Persistence | HasPersistence, session_ids: Iterable[str], *,
          reason: str | None = None, by: str | None = None,
          clock: Clock | None = None) -> TrashResult:
    """Move stored sessions to the trash: hidden from ``dsh ls``, kept byte for byte.

    Nothing of the sessions is written or locked: one ``store/trashed`` record is appended
    to the store log. A trashed session is still read, shown and verified by id; ``dsh ls
    --trash`` lists it; :func:`restore` gives it back; :func:`purge` erases it.

    Args:
        store: A ``dsh.Store`` (or its ``persistence`` facade).
        session_ids: Stored sessions.
        reason: Why, kept in the record.
        by: Who, kept in the record.
        clock: Epoch-ms clock.

    Returns:
        TrashResult: ``changed`` (now in the trash), ``unchanged`` (already there).

    Raises:
        SessionNotFoundError: a session is not stored (nothing was recorded).
        SessionBusyError: another process is writing the store log.

    Rule: docs/forgetting.md#deletion-with-a-way-back.
    """
    persistence = facade(store)
    ids = _stored(persistence, session_ids)
    current = store_log(persistence).trash
    todo = [sid for sid in ids if sid not in current]
    if not todo:
        return TrashResult((), tuple(ids), None)
    data: dict[str, Any] = {"sessions": todo}
    if reason is not None:
        data["reason"] = reason
    if by is not None:
        data["by"] = by
    done = append_records(persistence, [(TRASHED, data)], clock=clock)
    return TrashResult(tuple(todo), tuple(s for s in ids if s not in todo),
                       done.records[-1]["seq"])


def restore(store: Persistence | HasPersistence, session_ids: Iterable[str], *,
            by: str | None = None, clock: Clock | None = None) -> TrashResult:
    """Give sessions back from the trash (or the archive): listed again, exactly as they were.

    Args:
        store: A ``dsh.Store`` (or its ``persistence`` facade).
        session_ids: Sessions in the trash or the archive.
        by: Who, kept in the ``store/restored`` record.
        clock: Epoch-ms clock.

    Returns:
        TrashResult: ``changed`` (given back), ``unchanged`` (already listed).

    Raises:
        SessionNotFoundError: a session is not stored.
        RightsError: ``PURGED``: a session's content was erased by a purge; nothing to give
            back (nothing was recorded).

    Rule: docs/forgetting.md#deletion-with-a-way-back.
    """
    persistence = facade(store)
    ids = _stored(persistence, session_ids)
    state = store_log(persistence)
    for sid in ids:
        entry = state.trash.get(sid)
        if entry is not None and entry.purged_ms is not None:
            raise RightsError(f"session {sid!r} was purged (its content erased); there is "
                              f"nothing to restore", code="PURGED", session_id=sid)
    todo = [sid for sid in ids if sid in state.trash or sid in state.archived]
    if not todo:
        return TrashResult((), tuple(ids), None)
    data: dict[str, Any] = {"sessions": todo}
    if by is not None:
        data["by"] = by
    done = append_records(persistence, [(RESTORED, data)], clock=clock)
    return TrashResult(tuple(todo), tuple(s for s in ids if s not in todo),
                       done.records[-1]["seq"])


def purge(store: Persistence | HasPersistence, session_ids: Iterable[str], *,
          reason: str | None = None, by: str | None = None,
          clock: Clock | None = None,
          stop: Callable[[], bool] | None = None) -> ErasureReceipt:
    """Erase sessions for good and leave them in the trash, marked purged (``dsh rm --purge``).

    Runs :func:`dsh.rights.erase` on the sessions (their forks lose their copies, as always)
    and records it in the store log as ``store/erased {purge: true}``. A purged session stays
    stored as tombstones, hidden from ``dsh ls``; :func:`restore` refuses it (``PURGED``).

    ``stop`` is :func:`dsh.rights.erase`'s: the sessions done by then are purged and recorded,
    the others left as they were.

    Returns:
        ErasureReceipt: as :func:`dsh.rights.erase` returns it.

    Raises:
        SessionNotFoundError, SessionBusyError, RightsError: as :func:`dsh.rights.erase`. A
            crash between the erasure and its store-log record leaves the sessions erased
            (each keeps its own ``redaction/applied`` record); running it again records it.

    Rule: docs/forgetting.md#deletion-with-a-way-back.
    """
    persistence = facade(store)
    ids = _stored(persistence, session_ids)
    # lazy: trash and restore (a staged import's) load no erasure machinery
    from dsh.rights._erase import erase_sessions, erasure_record

    receipt = erase_sessions(persistence, ids, reason=reason, by=by, clock=clock, stop=stop)
    append_records(persistence, [(ERASED, erasure_record(receipt, purge=True))], clock=clock)
    return receipt

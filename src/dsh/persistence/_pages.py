"""Reading a stored session a page at a time: the O(tail) read for viewers, nothing written.

A viewer (``dsh view``) shows one page of a session of any size. Where the log has a restore
point, :func:`read_pages` reads only the header and the tail after the restore point's cut and
pages the events before it in from storage on demand (the same page-in source an O(tail) resume
uses), so opening a 1M-event session costs what opening a small one does and memory is bounded
by the page cache (:class:`dsh.session.PagedLog`). Without one, or at any doubt, it is the full
cold read (:meth:`Persistence.read`).

Invariants this module owns: the events served are exactly the committed events a full read
gives (the tail goes through the same vocabulary and legacy checks as a resume's, and any doubt
falls back to the full read); nothing is written, no lock is taken.

Rule: docs/rules.md#restore-points-are-never-the-truth; docs/rules.md#the-read-pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dsh._errors import DshError
from dsh.json import FrozenDict, c_stored_prescan
from dsh.persistence import _restore_point as ck
from dsh.persistence._contract import TornTail
from dsh.session import (
    KNOWN_EVENT_TYPES,
    SESSION_FORMAT_VERSION,
    Event,
    PagedLog,
    RestoreState,
)

if TYPE_CHECKING:
    from dsh.persistence._facade import Persistence

__all__ = ["StoredPages", "read_pages"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredPages:
    """A stored session opened for reading by page.

    Attributes:
        header: The stored header.
        events: The committed events; element ``i`` has seq ``i``. A :class:`PagedLog` when
            ``paged`` (its events before the cut are read from storage when indexed), else a
            tuple.
        closers: The crash-repair closers the next resume would append (in memory only), seq
            contiguous after ``events``; empty for a balanced log. Only a full read computes
            them; a paged read leaves them empty (a viewer shows the open turn instead).
        torn: The torn tail after the committed prefix (left on disk), or None.
        revision: The backend's revision of the read.
        paged: True when the events before the restore point's cut are paged in.
        restore: The restore point's state of the events before its cut (surface nodes, request
            header and context), when ``paged``; else None.
    """

    header: FrozenDict
    events: Sequence[Event]
    closers: tuple[Event, ...]
    torn: TornTail | None
    revision: str
    paged: bool
    restore: RestoreState | None = None


def read_pages(persistence: Persistence, session_id: str) -> StoredPages:
    """Open ``session_id`` for reading by page: O(tail) through its restore point, else in full.

    Args:
        persistence: The store's facade.
        session_id: A stored session.

    Returns:
        The session's events as a random-access sequence (see :class:`StoredPages`).

    Raises:
        SessionNotFoundError: no such session.
        LogCorruptError, SessionFormatUnsupportedError, UnknownEventTypeError: the full read
            refused the log (a paged read that doubts anything falls back to it).
    """
    with persistence.open(session_id, "read") as handle:
        if isinstance(handle, ck.KeepsRestorePoints) and c_stored_prescan is not None:
            try:
                restore_point, cold, source = handle.read_from_restore_point(dense=True)
                header = cold.header
                if (header.get("id") != session_id
                        or header.get("version") != SESSION_FORMAT_VERSION):
                    raise ck.RestorePointRefused("header")
                legacy_at, unknown_at = c_stored_prescan(cold.events, KNOWN_EVENT_TYPES)
                if legacy_at >= 0:
                    raise ck.RestorePointRefused("legacy")
                for event in cold.events[unknown_at:unknown_at + 1]:
                    if event.get("type") not in KNOWN_EVENT_TYPES \
                            and event.get("ignorable") is not True:
                        raise ck.RestorePointRefused("unknown-type")
                if len(source) != restore_point.state.event_count:
                    raise ck.RestorePointRefused("cut")
                events = PagedLog(source)
                events.extend(cold.events)
                return StoredPages(header=header, events=events, closers=(), torn=None,
                                   revision=cold.revision, paged=True,
                                   restore=restore_point.state)
            except ck.RestorePointRefused as exc:
                ck.note_refusal(session_id, exc.reason)
            except DshError as exc:
                ck.note_refusal(session_id, f"invalid:{exc.code}")
    read = persistence.read(session_id)
    return StoredPages(header=read.header, events=read.stored_events, closers=read.closers,
                       torn=read.torn, revision=read.revision, paged=False)

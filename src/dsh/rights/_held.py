"""A stored session held for one rights operation: ownership, a validated restore, one batch.

Every operation of ``dsh.rights`` that appends runs the same way
(docs/forgetting.md#how-an-operation-runs):

1. ``Persistence.load`` commits the crash repair of an interrupted turn (its own write handle);
2. a write handle is opened: the session's write ownership, held to the end (a second writer
   anywhere gets ``SessionBusyError``);
3. the stored log is read through the read pipeline and restored into a detached
   :class:`~dsh.session.Session`, which validates it and every event the operation appends;
4. the appended events go to the backend as one batch (one write, frame or transaction), then
   the handle is flushed and closed. A crash before the batch is durable leaves the log as it
   was; after, the operation is done.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from dsh._errors import RightsError
from dsh.persistence import Capabilities, Persistence, Scrubs
from dsh.session import Session

if TYPE_CHECKING:
    from dsh.persistence import Handle, Inspection
    from dsh.session import Clock, Event


class HasPersistence(Protocol):
    """Anything holding a persistence facade: a ``dsh.Store``."""

    @property
    def persistence(self) -> Persistence:
        """The store's persistence facade."""
        ...


def facade(store: Persistence | HasPersistence) -> Persistence:
    """The persistence facade of ``store`` (a ``dsh.Store`` or the facade itself)."""
    return store if isinstance(store, Persistence) else store.persistence


@dataclass(slots=True)
class Held:
    """One stored session held for writing.

    Attributes:
        handle: The write handle (the session's write ownership).
        session: A detached session restored from the stored log; append to it to validate.
        stored: How many events the stored log holds (what the batch continues).
        read: The read pipeline's inspection of the stored log.
        session_clock: The clock the session was restored with (None: the wall clock).
        capabilities: The store's declared capabilities (what the handle can do besides
            appending: ``rewrites``, ``scrubs``).
    """

    handle: Handle
    session: Session
    stored: int
    read: Inspection
    session_clock: Clock | None = None
    capabilities: Capabilities = field(default_factory=Capabilities)

    def appended(self) -> tuple[Event, ...]:
        """The events appended to :attr:`session` after the stored log.

        The end-seed marker a restore adds is among them.
        """
        return tuple(self.session.events[self.stored:])

    def scrub(self) -> list[dict[str, Any]]:
        """Scrub what a rewrite freed, where the store :class:`Scrubs` (else nothing to do).

        A failure is reported in the returned list, never raised.
        """
        if not self.capabilities.scrubs:
            return []
        return list(cast(Scrubs, self.handle).scrub())

    def commit(self) -> tuple[Event, ...]:
        """Write :meth:`appended` as one atomic batch and flush it; returns what was written."""
        events = self.appended()
        if events:
            self.handle.append(events)
            self.handle.flush()
        return events


@contextmanager
def held(store: Persistence | HasPersistence, session_id: str, *,
         clock: Clock | None = None) -> Iterator[Held]:
    """Hold ``session_id`` for writing (see the module docstring); the handle closes on exit.

    Raises:
        SessionNotFoundError: no such stored session.
        SessionBusyError: another writer holds it (in this process: it is live here).
        RightsError: ``OPEN_TURN``: another writer left a turn open between the repair and
            the write handle (run the command again).
        LogCorruptError, EventRejectedError: the stored log cannot be read or restored.
    """
    persistence = facade(store)
    persistence.load(session_id)
    handle = persistence.open(session_id, "write")
    try:
        read = persistence.read(session_id)
        if read.closers:
            raise RightsError(f"session {session_id!r} has a turn left open by another writer "
                              f"after its repair; run the command again",
                              code="OPEN_TURN", session_id=session_id)
        events = read.stored_events
        header: Any = read.header
        session = Session.restore(session_id, events, header,
                                  inherited_event_count=header.get("seedLength") or 0,
                                  clock=clock)
        yield Held(handle, session, len(events), read, clock,
                   capabilities=persistence.backend.capabilities)
    finally:
        handle.close()

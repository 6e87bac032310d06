"""The store's observer: binds live sessions to writers, and takes handles over from resume.

A ``SessionStore`` bound to the facade (``Persistence.bind``) gets one
:class:`PersistenceObserver`. The store calls its hooks: ``on_created`` gives a newly published
session a :class:`~dsh.persistence._write_behind.SessionWriter` (creating the stored session, or
claiming a stored prefix the session already holds), ``on_event`` queues an append,
``on_flush`` is the durability barrier, ``on_disposed`` drains and releases the handle.

``Persistence.resume`` opens the session's write handle itself; it hands the handle over with
:meth:`PersistenceObserver.adopt` before it publishes the session, and the writer created by the
publication continues from it. :class:`LiveSessions` is the facade's registry of the sessions
these writers serve, so a live id is never read as a stored one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

from dsh._errors import SessionBusyError, SessionExistsError, WriteFailedError
from dsh.json import json_equal
from dsh.persistence import _restore_point as rp
from dsh.persistence._after_commit import AfterCommitFailure
from dsh.persistence._contract import Backend, Handle
from dsh.persistence._write_behind import SessionWriter, WriteBehind
from dsh.session import Event, OldMarks, RestoreFold, RestoreState, Session, SessionStore

__all__ = ["Adoption", "LiveSessions", "PersistenceObserver"]

log = logging.getLogger("dsh.persistence")


@dataclass(frozen=True, slots=True)
class Adoption:
    """A stored session's write handle, handed from a resume to the session's writer.

    Attributes:
        handle: The open write handle (the resume took ownership and committed the repair).
        cursor: The seq the writer continues from (events below it are stored).
        resumed: The restore state the resume started from, when it went through a restore
            point; the writer folds on from it.
        restore_point_count: Events the restore point it resumed from covers (0: none).
        restore_point_bytes: Log bytes that restore point covers (0: none or not counted).
        foldable: Whether the stored records are the events themselves (no legacy record), so
            the writer may keep restore points of this log.
        old_marks: The old adapter marks of the whole log as the resume found them (the
            restore point's state and the tail, or the whole read), for the writer's fold and
            the removals the resume appends (docs/formats.md#old-adapter-marks); None: the
            fold finds them itself.
        restore_point_outdated: The log's restore point is of a format a writer's resume does
            not use (docs/formats.md#restore-points): the writer replaces it at its first
            flush, whatever the log's size.
    """

    handle: Handle
    cursor: int
    resumed: RestoreState | None = None
    restore_point_count: int = 0
    restore_point_bytes: int = 0
    foldable: bool = True
    restore_point_outdated: bool = False
    old_marks: OldMarks | None = None


class LiveSessions:
    """The sessions live in this process through a facade, by id (shared with its observers).

    The facade consults it so a live id is never read, loaded, forked or resumed as a stored
    one; observers add a session when they bind it and remove it when it is disposed.
    """

    def __init__(self) -> None:
        self._by_id: dict[str, Session] = {}

    def get(self, session_id: str) -> Session | None:
        """The live session with this id, or None."""
        return self._by_id.get(session_id)

    def add(self, session: Session) -> None:
        """Record ``session`` as live under its id."""
        self._by_id[session.id] = session

    def discard(self, session: Session) -> None:
        """Forget ``session`` (only that object: a later session with its id stays)."""
        if self._by_id.get(session.id) is session:
            del self._by_id[session.id]



class PersistenceObserver:
    """The ``SessionStore`` observer returned by :meth:`Persistence.bind`.

    Hooks (called by the store): ``on_created(session)`` (a raise vetoes publication),
    ``on_event(session, event)``, ``on_flush(session)`` (blocking durability barrier),
    ``aflush(session)`` (the same without blocking an asyncio loop), ``on_disposed(session)``
    (final drain, then the handle is closed).

    Args:
        backend: The facade's backend (the writers' handles come from it).
        config: The facade's write-behind configuration.
        live: The facade's live-session registry, kept by this observer.
        store: The bound ``SessionStore`` (kept for the facade's bookkeeping).
    """

    def __init__(self, backend: Backend, config: WriteBehind, live: LiveSessions,
                 store: SessionStore) -> None:
        self._backend = backend
        self._config = config
        self._live = live
        self.store = store
        self._writers: dict[int, SessionWriter] = {}
        self._adopting: dict[str, Adoption] = {}
        self._publishing: set[int] = set()  # resumed sessions whose announcement is running
        self._mutex = threading.RLock()

    # resume hand-off ---------------------------------------------------------------------

    def adopt(self, session_id: str, adoption: Adoption) -> None:
        """Hand a resumed session's write handle to the writer its publication creates."""
        with self._mutex:
            self._adopting[session_id] = adoption

    def drop_adoption(self, session_id: str) -> Handle | None:
        """Take back a handle :meth:`adopt` left unclaimed (a failed publication)."""
        with self._mutex:
            entry = self._adopting.pop(session_id, None)
        return entry.handle if entry else None

    @contextmanager
    def publishing(self, session: Session) -> Iterator[None]:
        """Mark ``session``'s announcement as running: a veto disposes it without a drain."""
        self._publishing.add(id(session))
        try:
            yield
        finally:
            self._publishing.discard(id(session))

    def handle_of(self, session_id: str) -> Handle | None:
        """The write handle of the live session ``session_id`` this observer writes, or None."""
        with self._mutex:
            for writer in self._writers.values():
                if writer.session.id == session_id:
                    return writer.handle
        return None

    @property
    def idle(self) -> bool:
        """True when no session writer is bound (a failed final drain keeps its writer)."""
        return not self._writers

    # hooks -------------------------------------------------------------------------------

    def _writer_for(self, session: Session) -> SessionWriter:
        writer = self._writers.get(id(session))  # fast path: a dict read is atomic
        if writer is not None:
            return writer
        with self._mutex:
            writer = self._writers.get(id(session))
            if writer is None:
                self.on_created(session)
                writer = self._writers[id(session)]
            return writer

    def on_created(self, session: Session) -> None:
        """Bind a newly published session: take its write handle and queue its seed.

        A session published by :meth:`Persistence.resume` uses the handle resume opened and
        queues only the suffix after the stored log (the ``session/end-seed`` marker). Any
        other session either creates its stored session or, when one exists, adopts it if the
        stored events are a JSON-identical prefix of the session's (a torn tail is truncated,
        no closers: the live turn is not interrupted; docs/rules.md#publishing-a-session).

        Raises:
            SessionBusyError: another writer holds the id.
            SessionExistsError: the stored log does not match this session (id collision).
        """
        sid = session.id
        with self._mutex:
            if id(session) in self._writers:
                return
            adopted = self._adopting.pop(sid, None)
            if adopted is None:
                handle, cursor = self._claim(session)
                # an adopted stored prefix may hold legacy records
                adopted = Adoption(handle, cursor, foldable=cursor == 0)
            fold = None
            # Restore points only for logs whose stored records are the events themselves: a
            # legacy record would page in differently from its normalised event.
            capabilities = self._backend.capabilities
            if adopted.foldable and capabilities.restore_points:
                fold = RestoreFold.of_session(session, adopted.resumed,
                                              old_marks=adopted.old_marks)
            writer = SessionWriter(session, adopted.handle, adopted.cursor, self._config,
                                   self._backend.url, capabilities=capabilities, fold=fold,
                                   last_restore_point=(
                                       # an outdated one: as if written an interval ago (due)
                                       adopted.cursor - rp.RESTORE_POINT_EVERY_EVENTS
                                       if adopted.restore_point_outdated
                                       else adopted.restore_point_count,
                                       adopted.restore_point_bytes),
                                   report=partial(self._report_after_commit, session))
            self._writers[id(session)] = writer
            self._live.add(session)
        writer.enqueue(session.events[adopted.cursor:])

    def _claim(self, session: Session) -> tuple[Handle, int]:
        backend = self._backend
        sid = session.id
        if not backend.exists(sid):
            backend.create(session.header)
            return backend.open(sid, "write"), 0
        handle = backend.open(sid, "write")
        try:
            cold = handle.read(0)
            live = session.events
            stored = cold.events
            if len(stored) > len(live) or not all(
                    json_equal(a, b) for a, b in zip(stored, live, strict=False)):
                raise SessionExistsError(
                    f"session {sid!r} already has a persisted log that does not match this live "
                    f"session (id collision)", session_id=sid)
            if cold.header.get("cwd") != session.header.get("cwd"):
                raise SessionExistsError(
                    f"session {sid!r} is already persisted at a different cwd "
                    f"({cold.header.get('cwd')!r}) (id collision)", session_id=sid)
            if cold.torn is not None:
                handle.append([])  # truncate only: the live turn is not interrupted
                handle.flush()
        except BaseException:
            handle.close()
            raise
        return handle, len(stored)

    def _report_after_commit(self, session: Session, failure: AfterCommitFailure) -> None:
        """Tell the store's observers that a step after a durable commit failed.

        Each observer's optional ``on_after_commit_failure(session, failure)`` is called (see
        ``docs/rules.md#commit-means-committed``); the batch stays committed whatever they do.
        """
        self.store.notify(session, "on_after_commit_failure", failure)

    def on_event(self, session: Session, event: Event) -> None:
        """Queue one committed event for the write-behind batch."""
        self._writer_for(session).enqueue((event,))

    def on_events(self, session: Session, events: Sequence[Event]) -> None:
        """Queue the committed events of one ``Session.batch`` block (seq order) at once."""
        self._writer_for(session).enqueue(events)

    def on_flush(self, session: Session) -> None:
        """Block until every event queued for ``session`` is appended and flushed.

        Raises:
            WriteFailedError: a write failed (cause chained); events are kept.
        """
        with self._mutex:
            writer = self._writers.get(id(session))
        if writer is not None:
            writer.flush()

    async def aflush(self, session: Session) -> None:
        """:meth:`on_flush` run in a worker thread, so the asyncio loop keeps running."""
        import asyncio  # not at the top: `import dsh` stays free of asyncio (~25 ms)

        await asyncio.to_thread(self.on_flush, session)

    def on_disposed(self, session: Session) -> None:
        """Final drain of ``session``, then close its handle (releases write ownership).

        A drain refused because another writer holds the session (``SessionBusyError``, a
        PostgreSQL ``LeaseLostError`` after a takeover) is no fault of this process: it is one
        WARNING naming the session and the new holder, and nothing is raised; the writer is
        kept, so ``Persistence.close`` still raises ``WriteFailedError`` for the events not
        written (docs/errors.md#leaselosterror).

        Raises:
            WriteFailedError: the drain failed otherwise; the writer is kept so
                ``Persistence.close`` retries it.
        """
        with self._mutex:
            writer = self._writers.get(id(session))
            vetoed = id(session) in self._publishing
        if writer is None:
            return
        if vetoed:
            # a resume whose publication was vetoed writes nothing more (docs/rules.md#resume)
            writer.abandon()
            with self._mutex:
                self._writers.pop(id(session), None)
                self._live.discard(session)
            return
        try:
            writer.close()
        except WriteFailedError as exc:
            if isinstance(exc.__cause__, SessionBusyError):
                # taken over: no traceback, as nothing here went wrong; close still says
                # which events were not written
                log.warning("session %r: its final write at dispose was refused (%s), %s; the "
                            "events not written are kept and the store's close raises "
                            "WriteFailedError for them", session.id, exc.__cause__.code,
                            _holder_now(exc.__cause__))
                return
            log.error("retirement of session %r failed; its writer is kept for a retry at "
                      "close", session.id)
            raise
        with self._mutex:
            self._writers.pop(id(session), None)
            self._live.discard(session)

    def close(self) -> list[BaseException]:
        """Drain and close every writer; return the failures (their handles are closed)."""
        errors: list[BaseException] = []
        with self._mutex:
            writers = list(self._writers.values())
            self._writers.clear()
            adopting = list(self._adopting.values())
            self._adopting.clear()
        for writer in writers:
            try:
                writer.close()
            except Exception as exc:  # collected; Persistence.close raises the first
                errors.append(exc)
                writer.abandon()
            self._live.discard(writer.session)
        for adoption in adopting:
            adoption.handle.close()
        return errors


def _holder_now(busy: SessionBusyError) -> str:
    """Who holds the session now, from ``busy.where`` (docs/errors.md#sessionbusyerror)."""
    where = busy.where
    if where.get("pid") is None and not busy.held_here:
        return "no writer holds it now" if "epoch" in where else "another writer holds it"
    epoch = f" at lease epoch {where['epoch']}" if where.get("epoch") is not None else ""
    return f"{busy.holder_phrase()} holds it now{epoch}"

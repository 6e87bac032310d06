"""The persistence facade: one backend plus the read pipeline, write-behind and resume.

:class:`Persistence` is what a ``dsh.Store`` holds (``store.persistence``) and what a
``SessionStore`` is attached to (it implements the core's ``PersistencePort``). It owns no
algorithm of its own; each concern lives in its room and the facade routes to it:

* whole-session reads (``read``, ``inspect``, ``load``, ``list``): :mod:`._read`;
* live binding (``bind``: one observer per store, :mod:`._observer`; one writer thread per
  live session, :mod:`._write_behind`);
* ``resume`` and the restore points (``write_restore_point``, ``check_restore_point``):
  :mod:`._resume`;
* listing for ``dsh ls`` (``list_entries``): :mod:`._listing`; following a log (``tail``):
  :mod:`._tail`.

A live session is never read as a stored one: ``resume`` and ``fork`` of a live id are refused,
``load`` of a live id with an open turn is refused, ``inspect`` of a live id returns the live
snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Literal, cast

from dsh._errors import (
    DshError,
    PersistenceError,
    SessionBusyError,
    SessionForkError,
    WriteFailedError,
)
from dsh.json import FrozenDict
from dsh.persistence import _restore_point as rp
from dsh.persistence import _resume
from dsh.persistence._contract import (
    STORE_LOG_ID,
    Backend,
    Fenced,
    Handle,
    KeepsAsides,
    KeepsCuts,
    ListsEntries,
    OpenMode,
    SessionSummary,
    check_session_id,
    normalize_header,
    session_id_problem,
)
from dsh.persistence._observer import LiveSessions, PersistenceObserver
from dsh.persistence._write_behind import WriteBehind
from dsh.session import Event, Session, SessionStore

if TYPE_CHECKING:  # (the listing loads when a store lists, the read pipeline when a session is
    # read whole: a session's open from its restore point runs neither)
    from dsh.persistence._listing import ListingEntry
    from dsh.persistence._read import Inspection

__all__ = ["Persistence"]

log = logging.getLogger("dsh.persistence")

_Entries = list["ListingEntry"]
_Errors = list[DshError]
_Activity = list[tuple[FrozenDict, int]]


class Persistence:
    """One store: a backend plus the pipeline, write-behind and resume.

    Rule: docs/stores.md#the-backend-contract, docs/rules.md#write-behind-and-the-flush-barrier.

    Args:
        backend: Any :class:`~dsh.persistence._contract.Backend`.
        write_behind: Batching configuration for bound stores.
    """

    def __init__(self, backend: Backend, *, write_behind: WriteBehind | None = None) -> None:
        self.backend = backend
        self.write_behind = write_behind or WriteBehind()
        self._observers: dict[int, PersistenceObserver] = {}
        self._live = LiveSessions()
        self._closed = False

    @property
    def url(self) -> str:
        """The store URL."""
        return self.backend.url

    # plain storage -----------------------------------------------------------------------

    def create(self, header: Mapping[str, object]) -> None:
        """Register a new stored session (see ``Backend.create``)."""
        self.backend.create(normalize_header(header))

    def open(self, session_id: str, mode: OpenMode = "read") -> Handle:
        """Open a handle (see ``Backend.open``).

        Raises:
            ConfigError: code ``INVALID_ID``: no backend can store this id (one rule for all,
                see :func:`dsh.persistence._contract.session_id_problem`).
        """
        check_session_id(session_id)
        return self.backend.open(session_id, mode)

    def exists(self, session_id: str) -> bool:
        """Return whether the session is stored (or created); an unstorable id never is."""
        return session_id_problem(session_id) is None and self.backend.exists(session_id)

    def list_headers(self) -> list[FrozenDict]:
        """Headers of every stored session, without reading any log.

        The backend keeps headers apart (the first JSONL line, the SQLite ``sessions`` row). A
        created session without events is listed where the backend keeps it (SQLite and
        memory do; JSONL writes its file with the first event). Order is the backend's; sort
        by ``id`` for a stable listing.

        Returns:
            list[FrozenDict]: wire ``SessionHeader`` objects (``version``, ``id``,
            ``createdAt``, optional ``cwd``, ``parentSession``, ``seedLength``, ...).

        Raises:
            LogCorruptError: a stored header cannot be decoded (backend specific).

        The store log (``STORE_LOG_ID``, docs/forgetting.md#the-store-log) is left out.

        Rule: docs/stores.md#opening-a-store (``list`` reads headers; docs/formats.md#header-line,
            docs/formats.md#sqlite header storage).
        """
        return [h for h in self.backend.list_headers() if h["id"] != STORE_LOG_ID]

    def list(self) -> list[SessionSummary]:
        """Summaries of every stored session with at least one event.

        Rule: docs/stores.md#opening-a-store.

        Each log is read (committed prefix only; nothing is repaired or written).

        Raises:
            LogCorruptError, SessionFormatUnsupportedError: a stored log cannot be read.
        """
        from dsh.persistence import _read
        out: list[SessionSummary] = []
        for header in self.list_headers():
            sid = header["id"]
            with self.backend.open(sid, "read") as handle:
                cold = handle.read(0)
            events = cold.events
            if not events:
                continue
            out.append(SessionSummary(sid, cold.header, len(events), events[-1]["time"],
                                      _read.summary_title(events)))
        return out

    def list_entries(self) -> tuple[_Entries, _Errors]:
        """What ``dsh ls`` shows of every stored session with at least one event, fast.

        SQLite answers from its tables, PostgreSQL from the entries its appends keep in the
        sessions rows, and JSONL from its listing index (a sidecar kept beside the logs, an
        entry rebuilt from a full read when its log changed), so an unchanged store is listed
        without reading any log; other backends read every log.

        Returns:
            The entries (order is the backend's), and one error per session whose log could
            not be read (``where["session_id"]`` names it); one damaged log never hides the
            others.

        Raises:
            PersistenceError: the store itself cannot be listed (its directory or database).

        The store log (docs/forgetting.md#the-store-log) is left out.

        Rule: docs/stores.md#opening-a-store (``list``); an entry equals :func:`summarize` of a full
        read of an intact log.
        """
        def full(session_id: str) -> tuple[FrozenDict, tuple[Event, ...]]:
            read = self.read(session_id)
            return read.header, read.stored_events

        from dsh.persistence._listing import read_entries

        if self.backend.capabilities.listing:
            entries, errors = cast(ListsEntries, self.backend).list_entries(full)
            return [e for e in entries if e.id != STORE_LOG_ID], errors
        return read_entries([str(h["id"]) for h in self.list_headers()], full)

    def saved_cuts(self, session_id: str) -> tuple[str, ...]:
        """Paths of the files holding what torn-tail repairs cut from this session, oldest first.

        Empty when the backend keeps no cuts (``Capabilities.saved_cuts`` off). Rule:
        docs/rules.md#crash-safety.
        """
        if not self.backend.capabilities.saved_cuts:
            return ()
        return tuple(cast(KeepsCuts, self.backend).saved_cuts(session_id))

    def list_activity(self) -> tuple[_Activity, _Errors]:
        """``(header, last_activity_ms)`` of every stored session with at least one event.

        What retention reads (docs/forgetting.md#retention): SQLite answers with two queries,
        JSONL from its listing index, other backends read every log. The store log is left out.

        Returns:
            The pairs (the backend's order) and one error per log that could not be read.
        """
        def full(session_id: str) -> tuple[FrozenDict, tuple[Event, ...]]:
            read = self.read(session_id)
            return read.header, read.stored_events

        from dsh.persistence._listing import read_entries

        if self.backend.capabilities.listing:
            pairs, errors = cast(ListsEntries, self.backend).list_activity(full)
            return [p for p in pairs if p[0]["id"] != STORE_LOG_ID], errors
        entries, errors = read_entries([str(h["id"]) for h in self.list_headers()], full)
        return [(e.header, e.last_activity_ms) for e in entries], errors

    # reading -----------------------------------------------------------------------------

    def _live_session(self, session_id: str) -> Session | None:
        return self._live.get(session_id)

    def inspect(self, session_id: str) -> Inspection:
        """Read a session without writing anything (docs/rules.md#the-read-pipeline).

        A live session yields its current snapshot (possibly an open turn). A stored one runs
        the read pipeline and full restore validation; closers stay in memory.

        Raises:
            SessionNotFoundError, LogCorruptError, SessionFormatUnsupportedError,
            UnknownEventTypeError.
        """
        from dsh.persistence import _read
        live = self._live_session(session_id)
        if live is not None:
            return _read.live_inspection(live.header, live.events)
        return _read.inspect_stored(self.backend, session_id)

    def read(self, session_id: str) -> Inspection:
        """Read a stored session through the cold-read pipeline; nothing is written.

        Unlike :meth:`inspect`, this always reads storage (a live id is read as stored, its
        unflushed events are not seen) and skips the full restore validation, so a log that
        ``Session.restore`` refuses can still be shown and verified. The pipeline's own
        refusals (identity, format version, legacy, vocabulary, closers) still raise.

        Args:
            session_id: The stored session's id.

        Returns:
            Inspection: ``stored_events`` are the committed events after legacy
            normalisation; ``closers`` the crash-repair closers an interrupted last turn would
            get (in memory only); ``events`` both, seq contiguous; ``torn`` the torn tail after
            the committed prefix (left on disk), or None; ``revision`` the backend's.

        Raises:
            SessionNotFoundError: no such stored session.
            LogCorruptError, SessionFormatUnsupportedError, UnknownEventTypeError: the
                pipeline refused the log (docs/rules.md#the-read-pipeline).

        Rule: docs/rules.md#the-read-pipeline (the cold-read pipeline; ``inspect`` writes
            nothing).
        """
        from dsh.persistence import _read
        return _read.read_stored(self.backend, session_id)

    def fork(self, source_id: str, boundary: int | None = None, child_id: str | None = None,
             *, open_turn: Literal["close", "reject"] = "close") -> str:
        """Fork a stored, non-live session into a new stored child; the parent is not written.

        The parent is restored detached from its stored log (no repair closers: a turn open at
        the cut is closed in the child with ``forked`` closers), entered into a private
        ``SessionStore`` bound to this persistence without being announced (so no writer ever
        touches its log), forked there, and the child is flushed and disposed (its handle
        closed, write ownership released).

        Args:
            source_id: The stored parent's id.
            boundary: Inclusive parent seq of the cut; omitted: the parent's last stored event.
            child_id: The child's id; omitted: ``<source_id>-fork-<n>`` with the smallest
                ``n >= 1`` not stored yet.
            open_turn: ``"close"`` (default) or ``"reject"`` a cut inside an open turn.

        Returns:
            str: the child's id. Its stored log is the parent's events ``0..boundary``, then
            ``session/end-seed {inherited: true}`` and any ``forked`` closers (exactly one
            end-seed after the cut); its header has ``parentSession`` and ``seedLength =
            boundary + 1``.

        Raises:
            SessionBusyError: code ``SESSION_LIVE``, the parent is live in this process.
            SessionForkError: ``SESSION_ALREADY_EXISTS`` (``child_id`` is stored),
                ``INVALID_BOUNDARY`` (not a stored seq of the parent), ``OPEN_TURN``.
            SessionNotFoundError, LogCorruptError, SessionFormatUnsupportedError,
                UnknownEventTypeError: the parent cannot be read (as :meth:`inspect`).
            ConfigError: ``open_turn`` is not ``"close"`` or ``"reject"``.
            WriteFailedError: the child could not be written.

        Rule: docs/rules.md#fork; docs/rules.md#the-read-pipeline (reads write
        nothing to the parent).
        """
        if self._live_session(source_id) is not None:
            raise SessionBusyError(f"cannot fork stored session {source_id!r} while it is live "
                                   f"in this process; fork the live Session through its store",
                                   code="SESSION_LIVE", session_id=source_id)
        stored = self.read(source_id)
        events = stored.stored_events
        from dsh.persistence import _read
        parent = _read.restore_validated(source_id, events, stored.header)
        if child_id is None:
            number = 1
            while self.exists(f"{source_id}-fork-{number}"):
                number += 1
            child_id = f"{source_id}-fork-{number}"
        elif self.exists(child_id):
            raise SessionForkError(f'session "{child_id}" already exists in {self.url}',
                                   code="SESSION_ALREADY_EXISTS", session_id=child_id)
        if boundary is None and events:
            boundary = events[-1]["seq"]
        if boundary is not None and (type(boundary) is not int or not
                                     0 <= boundary < len(events)):
            last = events[-1]["seq"] if events else "none"
            raise SessionForkError(f'fork boundary {boundary!r} does not exist in session '
                                   f'"{source_id}" (last seq: {last})',
                                   code="INVALID_BOUNDARY", session_id=source_id,
                                   seq=boundary if type(boundary) is int else None)
        store = SessionStore(persistence=self)
        detach_parent = store.enter(parent)
        try:
            child = store.fork(parent, boundary, child_id, open_turn=open_turn)
            try:
                store.flush(child)
            finally:
                store.dispose(child)
        finally:
            detach_parent()
            # Forget the private store's observer once it holds no writer (a failed final
            # drain keeps it, so close() retries it).
            observer = self._observers.get(id(store))
            if observer is not None and observer.idle:
                del self._observers[id(store)]
        return child.id

    def load(self, session_id: str) -> Inspection:
        """Read a session and commit its crash repair (docs/rules.md#the-read-pipeline).

        Through a write handle: read, pipeline, validation, then (when needed) truncate the
        torn tail and append the closers as one batch, flushed. A balanced, untorn log is not
        written to.

        Raises:
            SessionBusyError: another writer holds the id.
            PersistenceError: code ``SESSION_LIVE``: the id is live here with an open turn.
            SessionNotFoundError, LogCorruptError, SessionFormatUnsupportedError,
            UnknownEventTypeError.
        """
        from dsh.persistence import _read
        live = self._live_session(session_id)
        if live is not None:
            self._flush_live(live)
            if _read.has_open_turn(live.events):
                raise PersistenceError(
                    f"cannot load session {session_id!r} while its live turn is open; use the "
                    f"live Session or wait for the turn to close", code="SESSION_LIVE",
                    session_id=session_id)
            return _read.live_inspection(live.header, live.events)
        return _read.load_stored(self.backend, session_id)

    def _flush_live(self, session: Session) -> None:
        for observer in list(self._observers.values()):
            observer.on_flush(session)

    def write_restore_point(self, session_id: str) -> bool:
        """Write a restore point of a stored session now, from a full, validated read.

        Writers keep restore points by themselves (see :mod:`dsh.persistence._restore_point`); this
        gives one to a log written without them (by dsh, an import, an older version), so its
        next resume reads only the tail. Nothing in the log is written.

        Returns:
            True when one was written; False when the backend keeps none, or the log is empty,
            has a torn tail, or holds legacy records (those always read in full).

        Raises:
            SessionBusyError: the session is live in this process (``SESSION_LIVE``) or held by
                another writer.
            SessionNotFoundError, LogCorruptError, SessionFormatUnsupportedError,
            UnknownEventTypeError: the log cannot be read or does not validate.
        """
        if self._live_session(session_id) is not None:
            raise SessionBusyError(f"cannot write a restore point of session {session_id!r} "
                                   "while it is live in this process; its writer keeps its "
                                   "restore points",
                                   code="SESSION_LIVE", session_id=session_id)
        return _resume.write_restore_point(self.backend, session_id)

    def read_aside(self, session_id: str, name: str, *, head: bool = False) -> bytes | None:
        """The aside ``name`` kept beside the session's log, or None (none kept, or none here).

        Derived data a reader checks against the log (docs/stores.md#asides). ``head``: only
        its head (the bytes up to and including the first newline, ``b""`` when it has none),
        the rest not read.

        Raises:
            PersistenceError: the backend failed to read it (SYMLINK for a linked folder).
        """
        backend = self.backend
        if not backend.capabilities.asides:
            return None
        return cast(KeepsAsides, backend).read_aside(session_id, name, head=head)

    def write_aside(self, session_id: str, name: str, data: bytes) -> bool:
        """Replace the aside ``name`` beside the session's log; False when none are kept.

        Raises:
            OSError, PersistenceError: it could not be written (the log is untouched).
        """
        backend = self.backend
        if not backend.capabilities.asides:
            return False
        cast(KeepsAsides, backend).write_aside(session_id, name, data)
        return True

    def drop_asides(self, session_id: str) -> None:
        """Delete every aside of the session (erasure); nothing there, or none kept, is fine.

        Raises:
            OSError, PersistenceError: one could not be deleted.
        """
        backend = self.backend
        if backend.capabilities.asides:
            cast(KeepsAsides, backend).drop_asides(session_id)

    def check_restore_point(self, session_id: str, read: Inspection | None = None
                         ) -> rp.RestorePointCheck:
        """Check the session's restore point against a full read (``dsh verify``).

        Args:
            session_id: A stored session.
            read: Its :meth:`read`, when the caller already has one.

        Returns:
            The verdict: absent, consistent, or ignored (with why); a bad restore point is never
            an error, since a resume ignores it.

        Raises:
            SessionNotFoundError, LogCorruptError, ...: the log itself cannot be read.
        """
        full = read if read is not None else self.read(session_id)
        return _resume.check_restore_point(self.backend, session_id, full)

    def tail(self, session_id: str, from_seq: int = 0, *,
             poll_ms: int | None = None) -> AsyncIterator[Event]:
        """Follow a stored session: its events from ``from_seq`` on, then each new commit.

        An async iterator; no seq is skipped or repeated (see :mod:`dsh.persistence._tail`).
        PostgreSQL wakes on ``NOTIFY``; other backends are read every ``poll_ms`` (ms).

        Raises:
            ConfigError, SessionNotFoundError, LogCorruptError.
        """
        from dsh.persistence._tail import tail
        return tail(self.backend, session_id, from_seq, poll_ms=poll_ms)

    # live binding --------------------------------------------------------------------------

    def bind(self, store: SessionStore) -> PersistenceObserver:
        """Return the write-behind observer for ``store`` (one per store, created once)."""
        observer = self._observers.get(id(store))
        if observer is None:
            observer = PersistenceObserver(self.backend, self.write_behind, self._live, store)
            self._observers[id(store)] = observer
        return observer

    def writer_epoch(self, session_id: str) -> int:
        """The fencing epoch of this process's write handle on ``session_id``.

        Returns:
            The PostgreSQL lease epoch of the live writer; 0 for a backend whose handles
            declare no epoch (:class:`~dsh.persistence._contract.Fenced`), or when no session
            of that id is written through this facade.
        """
        for observer in list(self._observers.values()):
            handle = observer.handle_of(session_id)
            if handle is not None:
                fenced = self.backend.capabilities.fenced
                epoch = cast(Fenced, handle).epoch if fenced else None
                return epoch if epoch is not None else 0
        return 0

    def resume(self, store: SessionStore, session_id: str, *,
               on_handle: Callable[[Handle], object] | None = None) -> Session:
        """Resume a stored session into ``store`` (docs/rules.md#resume).

        ``on_handle(handle)`` is called with the write handle as soon as it is open, so a
        caller running this in a worker thread can close it to abandon a backend call that
        never returns (the agent loop's cancellable resume does).

        1. refuse a live id; open the session for writing first (exclusive: a concurrent
           resume, in this process or another, gets ``SessionBusyError``);
        2. read cold through that handle and run the pipeline; closers =
           ``interrupted_turn_closers``;
        3. rebuild with ``Session.restore(id, events + closers, header,
           inherited_event_count=header.seedLength or 0)`` (validation; appends the plain
           ``session/end-seed`` in memory) - done before any write, so an invalid log is
           refused without being touched;
        4. commit the repair through the same handle (truncate the torn tail, append the
           closers, flush);
        5. publish into ``store`` (``enter`` + ``announce``); the store's observer takes over
           the handle and writes the suffix (the end-seed marker).

        Returns:
            Session: the published session.

        Raises:
            SessionBusyError: the id is live in this process or held by another writer.
            SessionNotFoundError, LogCorruptError, SessionFormatUnsupportedError,
            UnknownEventTypeError: as :meth:`inspect`.
        """
        live = self._live_session(session_id)
        if live is not None:
            raise SessionBusyError(f"cannot resume session {session_id!r} while it is live in "
                                   f"this process; its live turn is never crash-repaired",
                                   code="SESSION_LIVE", session_id=session_id)
        return _resume.resume(self.backend, store, session_id, self._observer_for,
                              on_handle=on_handle)

    def _observer_for(self, store: SessionStore) -> PersistenceObserver:
        observer = self._observers.get(id(store))
        if observer is None:
            observer = self.bind(store)
            store.observe(observer)
        return observer

    # teardown ------------------------------------------------------------------------------

    def close(self) -> None:
        """Drain every bound store's writers, close their handles, close the backend.

        Raises:
            WriteFailedError: a final drain failed (first failure; the others are logged).
        """
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []
        for observer in list(self._observers.values()):
            errors.extend(observer.close())
        self._observers.clear()
        self.backend.close()
        for extra in errors[1:]:
            log.error("final drain failed: %r", extra)
        if errors:
            first = errors[0]
            if isinstance(first, DshError):
                raise first
            raise WriteFailedError(f"final drain of {self.url} failed: {first!r}") from first

    def __enter__(self) -> Persistence:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

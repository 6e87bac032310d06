"""SessionStore: the live sessions of one process, their lifecycle notifications, and fork.

Invariants this module owns (docs/rules.md#fork, docs/rules.md#live-sessions, docs/rules.md#resume):

* at most one live session per id, and a Session object is attached to at most one store;
* every announced session is paired with exactly one ``on_disposed`` (also on rollback), and a
  never-announced one gets none;
* observer failures after a commit are logged and contained; an ``on_created`` failure vetoes
  the creation and rolls it back; ``on_flush`` failures reach the caller of :meth:`flush`;
* a detach requested while the session's announcement or append is being published takes effect
  when that publication ends;
* a fork child's seed is the parent's prefix, a ``session/end-seed {inherited: true}`` marker and
  the ``forked`` closers of a turn left open at the cut.
"""

from __future__ import annotations

import atexit
import logging
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Final, Literal, Protocol

from dsh._errors import ConfigError, SessionExistsError, SessionForkError, SessionNotFoundError
from dsh.json import MAX_SAFE_INTEGER, FrozenDict
from dsh.session._events import Event
from dsh.session._paging import EventSource
from dsh.session._restore_state import RestoreState
from dsh.session._session import Clock, Session, wall_clock_ms

logger = logging.getLogger(__name__)

OpenTurnPolicy = Literal["close", "reject"]
"""What :meth:`SessionStore.fork` does with a cut inside an open turn (docs/rules.md#fork)."""

_META_KEYS: Final = ("cwd", "parentSession", "seedLength", "origin", "delegationDepth",
                     "agentPreset")
_KNOWN_KEYS: Final = frozenset({"version", "id", "createdAt", "metadata", "type", *_META_KEYS})


class StoreObserver(Protocol):
    """What a store observer may implement; every method is optional.

    * ``on_created(session)``: a session was announced; raising vetoes and rolls it back.
    * ``on_event(session, event)``: an append committed; failures are logged and contained.
    * ``on_events(session, events)``: the appends of a ``Session.batch`` block committed (seq
      order), told in one call when the block ends; without it, ``on_event`` per event.
    * ``on_flush(session)``: durability barrier; block until durable, raise on failure.
    * ``on_disposed(session)``: an announced session left the store; failures are logged.
    * ``on_after_commit_failure(session, failure)``: a step after a durable commit (seal,
      listing journal, restore point) failed; the batch stays committed; failures are logged.
    """


class PersistencePort(Protocol):
    """What a store needs from its persistence attachment (the core's side of the contract).

    ``dsh.persistence.Persistence`` (the facade over one backend) implements it; the core never
    imports it. ``bind(store)`` returns the observer that writes the store's sessions behind,
    ``resume`` rebuilds a stored session into the store, ``exists`` answers
    :meth:`SessionStore.session`, and ``close`` is called by :meth:`SessionStore.close`.
    """

    def bind(self, store: SessionStore) -> Any:
        """Return the observer that persists this store's sessions."""

    def resume(self, store: SessionStore, session_id: str) -> Session:
        """Load, repair and publish the stored session ``session_id`` into ``store``."""

    def exists(self, session_id: str) -> bool:
        """Return whether ``session_id`` is stored (a stored session is resumed, not created)."""

    def close(self) -> None:
        """Drain the bound stores' writers and release the storage; idempotent."""


_ATTACHED: weakref.WeakKeyDictionary[Session, SessionStore] = weakref.WeakKeyDictionary()
"""The store each session object is live in (at most one; a session leaves when detached)."""

_OPEN_STORES: weakref.WeakSet[SessionStore] = weakref.WeakSet()
"""Stores with a persistence attachment that were not closed yet (drained at exit)."""


@atexit.register
def _close_open_stores() -> None:
    # A script that ends without close() or flush() must not lose what it appended: the
    # write-behind window may still hold events. Runs before module teardown.
    for store in list(_OPEN_STORES):
        try:
            store.close()
        except Exception:
            logger.exception("closing a SessionStore left open at interpreter exit failed")


class _Entry:
    __slots__ = ("announced", "announcing", "detach_requested", "publishing", "session",
                 "unsubscribe")

    def __init__(self, session: Session) -> None:
        self.session = session
        self.announced = False
        self.announcing = False
        self.publishing = False
        self.detach_requested = False
        self.unsubscribe: Callable[[], None] | None = None


def _call(observer: Any, name: str, *args: Any) -> bool:
    """Call ``observer.<name>(*args)`` if it exists; return whether it did."""
    method = getattr(observer, name, None)
    if method is None:
        return False
    method(*args)
    return True


def _prefix_open_turn(prefix: Iterable[Event]) -> Any:
    """Return the turn number when the last turn boundary of ``prefix`` is a ``turn/start``."""
    open_turn = None
    for event in prefix:
        kind = event["type"]
        if kind == "turn/start":
            data = event["data"]
            open_turn = data.get("turn", "?") if isinstance(data, dict) else "?"
        elif kind == "turn/end":
            open_turn = None
    return open_turn


class SessionStore:
    """The live sessions of one process, keyed by id, with lifecycle observers and fork.

    Args:
        persistence: Optional attachment with ``bind(store) -> observer`` and
            ``resume(store, session_id) -> Session``; its observer is registered at once.
        clock: Epoch-ms clock for minted headers and for the sessions this store creates
            (default: wall clock).

    Rule: docs/rules.md#live-sessions, docs/rules.md#fork for fork and resume.
    """

    def __init__(self, persistence: PersistencePort | None = None, *,
                 clock: Clock | None = None) -> None:
        self._entries: dict[str, _Entry] = {}
        self._counter = 0
        self._observers: tuple[Any, ...] = ()
        self._clock: Clock = clock or wall_clock_ms
        self._persistence = persistence
        self._closed = False
        if persistence is not None:
            self.observe(persistence.bind(self))
            _OPEN_STORES.add(self)

    @property
    def persistence(self) -> PersistencePort | None:
        """The persistence attachment given at construction, or None."""
        return self._persistence

    # observers ------------------------------------------------------------------------------

    def observe(self, observer: Any) -> Callable[[], None]:
        """Register ``observer`` (see :class:`StoreObserver`); return a function removing it."""
        self._observers = (*self._observers, observer)

        def remove() -> None:
            self._observers = tuple(o for o in self._observers if o is not observer)

        return remove

    # lifecycle ------------------------------------------------------------------------------

    def _mint_id(self) -> str:
        while True:
            self._counter += 1
            candidate = f"session-{self._counter}"
            if candidate not in self._entries:
                return candidate

    def prepare(self, session_id: str | None = None, *, seed: Iterable[Any] | None = None,
                header: Mapping[str, Any] | None = None, inherited_event_count: int = 0,
                seed_source: Literal["snapshot", "persistence"] = "snapshot") -> Session:
        """Build a session without registering or announcing it.

        Args:
            session_id: The id; omitted: a minted ``session-<n>`` not currently live.
            seed: Constructor seed (see :meth:`Session.create` / :meth:`Session.restore`).
            header: ``seed_source="snapshot"``: header fields (``createdAt`` defaults to now;
                ``cwd``, ``parentSession``, ``seedLength``, ``origin``, ``delegationDepth``,
                ``agentPreset`` and ``metadata`` are taken when present; any other key whose
                value is a string, integer or boolean goes into ``metadata``
                (docs/formats.md#header-metadata); other keys are ignored).
                ``seed_source="persistence"``: the full stored header.
            inherited_event_count: Events inherited from a fork parent (docs/rules.md#fork).
            seed_source: ``"snapshot"`` copies the seed (:meth:`Session.create`);
                ``"persistence"`` takes ownership of frozen events (:meth:`Session.restore`).

        Returns:
            The unpublished session.

        Raises:
            SessionExistsError: the id is live (``session "<id>" already exists``).
            EventRejectedError: the seed or header is invalid.

        Rule: docs/rules.md#live-sessions.
        """
        self._check_open()
        sid = self._mint_id() if session_id is None else session_id
        if sid in self._entries:
            raise SessionExistsError(f'session "{sid}" already exists', session_id=sid)
        if seed_source == "persistence":
            if header is None:
                raise ConfigError("prepare(seed_source='persistence') needs the stored header")
            return Session.restore(sid, seed if seed is not None else (), header,
                                   inherited_event_count=inherited_event_count,
                                   clock=self._clock)
        meta = header or {}
        full: dict[str, Any] = {"version": 0, "id": sid,
                                "createdAt": meta.get("createdAt", None)}
        if full["createdAt"] is None:
            full["createdAt"] = self._clock()
        for key in _META_KEYS:
            if key in meta:
                full[key] = meta[key]
        # an unknown key with a scalar value is metadata (docs/formats.md#header-metadata)
        extra = {k: v for k, v in meta.items() if k not in _KNOWN_KEYS
                 and type(k) is str and type(v) in (str, int, bool)}
        if extra:
            full["metadata"] = {**extra, **(meta.get("metadata") or {})}
        elif "metadata" in meta:
            full["metadata"] = meta["metadata"]
        return Session.create(sid, seed=seed, header=full,
                              inherited_event_count=inherited_event_count, clock=self._clock)

    def prepare_paged(self, session_id: str, *, header: Mapping[str, Any], state: RestoreState,
                      source: EventSource, tail: Sequence[Event],
                      inherited_event_count: int = 0) -> Session:
        """Build a stored session from a restore point's prefix and its tail, without publishing it.

        The O(tail) twin of ``prepare(seed_source="persistence")``: see
        :meth:`Session.restore_paged` for the arguments and what is equal to a full restore.

        Raises:
            SessionExistsError: the id is live.
            EventRejectedError: the header or tail is invalid, or ``state`` does not cover
                ``len(source)`` events.
        """
        self._check_open()
        if session_id in self._entries:
            raise SessionExistsError(f'session "{session_id}" already exists',
                                     session_id=session_id)
        return Session.restore_paged(session_id, header, state, source, tail,
                                     inherited_event_count=inherited_event_count,
                                     clock=self._clock)

    def enter(self, session: Session) -> Callable[[], None]:
        """Register ``session`` as live; return an idempotent ``detach`` function.

        Raises:
            SessionExistsError: a session with that id is live (a stale prepared object cannot
                replace it).
            ConfigError: the object is already attached to a store.

        Rule: docs/rules.md#live-sessions.
        """
        sid = session.id
        if sid in self._entries:
            raise SessionExistsError(f'session "{sid}" already exists', session_id=sid)
        if session in _ATTACHED:
            raise ConfigError(f'session "{sid}" is already attached to a store; detach it first',
                              code="SESSION_ATTACHED", session_id=sid)
        entry = _Entry(session)
        self._entries[sid] = entry
        _ATTACHED[session] = self

        def publish(live: Session, event: Event) -> None:
            self._publish_event(entry, event)

        def publish_batch(live: Session, events: Sequence[Event]) -> None:
            self._publish_events(entry, events)

        entry.unsubscribe = session.observe(publish, batch=publish_batch)

        def detach() -> None:
            self._request_detach(entry)

        return detach

    def announce(self, session: Session) -> None:
        """Call every observer's ``on_created(session)``; the first exception vetoes.

        Raises:
            SessionNotFoundError: the session is not the live entry of this store (code
                ``SESSION_NOT_LIVE``).
            ConfigError: it was already announced (code ``ALREADY_ANNOUNCED``), including a
                reentrant call from an ``on_created`` observer.
            Exception: whatever an ``on_created`` observer raised (later observers are skipped).

        Rule: docs/rules.md#live-sessions (``announced`` is set before dispatch, so a partial
        announcement is still paired with a disposal).
        """
        entry = self._live_entry(session)
        if entry.announced or entry.announcing:
            raise ConfigError(f'session "{session.id}" was already announced',
                              code="ALREADY_ANNOUNCED", session_id=session.id)
        entry.announced = True
        entry.announcing = True
        try:
            for observer in self._observers:
                _call(observer, "on_created", session)
        finally:
            entry.announcing = False
            if entry.detach_requested and not entry.publishing:
                self._detach_now(entry)

    def create(self, session_id: str | None = None, *, seed: Iterable[Any] | None = None,
               header: Mapping[str, Any] | None = None, inherited_event_count: int = 0,
               seed_source: Literal["snapshot", "persistence"] = "snapshot") -> Session:
        """Prepare, enter and announce a session; roll back if an observer vetoes.

        Arguments are those of :meth:`prepare`.

        Returns:
            The live, announced session.

        Raises:
            SessionExistsError, EventRejectedError: as :meth:`prepare`.
            Exception: an ``on_created`` veto, after the entry was removed and ``on_disposed``
                was sent (the partial announcement is paired).

        Rule: docs/rules.md#live-sessions.
        """
        session = self.prepare(session_id, seed=seed, header=header,
                               inherited_event_count=inherited_event_count,
                               seed_source=seed_source)
        detach = self.enter(session)
        try:
            self.announce(session)
        except BaseException:
            detach()
            raise
        return session

    def get(self, session_id: str) -> Session | None:
        """Return the live session with that id, or None."""
        entry = self._entries.get(session_id)
        return entry.session if entry is not None else None

    def list(self) -> list[Session]:
        """Return the live sessions in creation order (a fresh list)."""
        return [entry.session for entry in self._entries.values()]

    def notify(self, session: Session, hook: str, *args: Any) -> None:
        """Call every observer's optional ``hook(session, *args)``; failures are logged.

        For news an observer may want but the store does not act on, such as a post-commit
        step that failed (``on_after_commit_failure(session, failure)``, see
        ``docs/rules.md#commit-means-committed``). Nothing an observer does here is raised.
        """
        for observer in list(self._observers):
            try:
                _call(observer, hook, session, *args)
            except Exception:
                logger.exception("session %r: %s observer %r failed", session.id, hook,
                                 observer)

    def _live_entry(self, session: Session) -> _Entry:
        entry = self._entries.get(session.id)
        if entry is None or entry.session is not session:
            raise SessionNotFoundError(f'session "{session.id}" is not live in this store',
                                       code="SESSION_NOT_LIVE", session_id=session.id)
        return entry

    def _publish_event(self, entry: _Entry, event: Event) -> None:
        self._publish_events(entry, (event,))

    def _publish_events(self, entry: _Entry, events: Sequence[Event]) -> None:
        """Tell every observer about ``events`` (one append, or a ``Session.batch``'s).

        An observer with ``on_events(session, events)`` gets them in one call; any other
        gets ``on_event(session, event)`` for each, in seq order. Failures are logged and
        contained (docs/rules.md#live-sessions).
        """
        if self._entries.get(entry.session.id) is not entry:
            return  # detached: no more notifications
        entry.publishing = True
        session = entry.session
        try:
            for observer in self._observers:
                on_events = getattr(observer, "on_events", None) if len(events) > 1 else None
                if on_events is not None:
                    try:
                        on_events(session, events)
                    except Exception:
                        logger.exception("session %r: on_events observer %r failed on seqs "
                                         "%d..%d; the events stay committed", session.id,
                                         observer, events[0]["seq"], events[-1]["seq"])
                    continue
                for event in events:
                    try:
                        _call(observer, "on_event", session, event)
                    except Exception:
                        logger.exception("session %r: on_event observer %r failed on seq %d "
                                         "(%s); the event stays committed", session.id,
                                         observer, event["seq"], event["type"])
        finally:
            entry.publishing = False
            if entry.detach_requested and not entry.announcing:
                self._detach_now(entry)

    def _request_detach(self, entry: _Entry) -> None:
        if entry.announcing or entry.publishing:
            entry.detach_requested = True
            return
        self._detach_now(entry)

    def _detach_now(self, entry: _Entry) -> None:
        entry.detach_requested = False
        session = entry.session
        if self._entries.get(session.id) is not entry:
            return  # a stale detach never removes a later entry with the same id
        # what an open Session.batch block committed is acknowledged: told before the
        # observers let go of the session (on_disposed drains the writer)
        session.publish_pending()
        del self._entries[session.id]
        _ATTACHED.pop(session, None)
        if entry.unsubscribe is not None:
            entry.unsubscribe()
            entry.unsubscribe = None
        if self._persistence is not None:
            # Nothing would save a later append: refuse it rather than keep it only in memory.
            session.add_validator(self._refuse_detached)
        if entry.announced:
            for observer in self._observers:
                try:
                    _call(observer, "on_disposed", session)
                except Exception:
                    logger.exception("session %r: on_disposed observer %r failed", session.id,
                                     observer)

    def _refuse_detached(self, session: Session, event: Event) -> None:
        why = "its store was closed" if self._closed else "it was disposed from its store"
        raise ConfigError(
            f'session "{session.id}" can no longer be appended to: {why}, so the {event["type"]} '
            f"at seq {event['seq']} would not be saved; open the store again and resume the "
            "session (store.session(id))", code="STORE_CLOSED" if self._closed else
            "SESSION_DISPOSED", session_id=session.id, seq=event["seq"])

    def dispose(self, session: Session) -> None:
        """Remove a live session from the store and send ``on_disposed`` if it was announced.

        Deferred until the end of the publication when called while the session's announcement
        or append is being published. The Session object stays readable, detached; in a store
        with persistence attached (:func:`dsh.open`) a later append is refused with
        ``SESSION_DISPOSED`` (``STORE_CLOSED`` after :meth:`close`), because nothing would save
        it. Without persistence it keeps working in memory.

        Raises:
            SessionNotFoundError: the session is not live in this store (``SESSION_NOT_LIVE``).
        """
        self._request_detach(self._live_entry(session))

    # durability -----------------------------------------------------------------------------

    def flush(self, session: Session) -> bool:
        """Call every observer's ``on_flush(session)`` and wait for all of them.

        Inside a ``Session.batch`` block, the block's appends so far are published first, so
        the barrier covers them too (docs/rules.md#live-sessions).

        Returns:
            True when at least one observer took part, False when none has ``on_flush``.

        Raises:
            SessionNotFoundError: the session is not live here (``SESSION_NOT_LIVE``).
            Exception: the first failure in observer order, after every observer ran.

        Rule: docs/rules.md#live-sessions, docs/rules.md#write-behind-and-the-flush-barrier (the
            durability barrier).
        """
        self._live_entry(session)
        session.publish_pending()  # a Session.batch block's committed events are queued too
        return self._flush_observers(session)

    def _flush_observers(self, session: Session) -> bool:
        """:meth:`flush` once the session's committed events are published."""
        self._live_entry(session)
        participated = False
        failures: list[BaseException] = []
        for observer in self._observers:
            try:
                participated = _call(observer, "on_flush", session) or participated
            except Exception as exc:
                failures.append(exc)
        if failures:
            raise failures[0]
        return participated

    async def aflush(self, session: Session) -> bool:
        """Async twin of :meth:`flush`: runs it in a worker thread, never blocking the loop.

        No thread is used when no observer takes part (a store without persistence), so the
        agent loop's per-step barriers cost nothing there.
        """
        self._live_entry(session)
        # published here, in the caller's thread: the worker only waits for the observers
        session.publish_pending()
        if not any(getattr(o, "on_flush", None) is not None for o in self._observers):
            return False
        import asyncio  # not at the top: `import dsh` stays free of asyncio (~25 ms)

        return await asyncio.to_thread(self._flush_observers, session)

    def resume(self, session_id: str) -> Session:
        """Load the stored session ``session_id`` through the persistence attachment.

        Raises:
            ConfigError: no persistence backend is attached.
            DshError: whatever the backend raises (busy, not found, corrupt, ...).

        Rule: docs/rules.md#resume (resume: write ownership, cold read, closers, restore).
        """
        self._check_open()
        if self._persistence is None:
            raise ConfigError("cannot resume: no persistence backend is attached (pass "
                              "persistence= to SessionStore, or use dsh.open(url))",
                              code="NO_PERSISTENCE", session_id=session_id)
        return self._persistence.resume(self, session_id)

    def session(self, session_id: str, *, header: Mapping[str, Any] | None = None) -> Session:
        """Return session ``session_id`` ready to append to: live, resumed, or new.

        The live session when it is in this store; else the stored log resumed (an interrupted
        turn is closed first, see :meth:`resume`); else a new, empty session created with
        ``header`` (see :meth:`prepare`).

        Raises:
            SessionBusyError: the stored session is open for writing by another process.
            ConfigError: the store is closed (``STORE_CLOSED``).
            DshError: whatever :meth:`resume` or :meth:`create` raises (corrupt log, ...).
        """
        self._check_open()
        live = self.get(session_id)
        if live is not None:
            return live
        if self._persistence is not None and self._persistence.exists(session_id):
            return self.resume(session_id)
        return self.create(session_id, header=header)

    # teardown -------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("this SessionStore is closed; open a new one (dsh.open(url))",
                              code="STORE_CLOSED")

    def close(self) -> None:
        """Drain every live session to disk, dispose it, then close the persistence.

        Each live session is flushed (the durability barrier) and disposed, which releases its
        write ownership (one whose stored log a read found damaged, ``Session.log_damage``, is
        disposed without a flush: nothing more is written to that log); then the attachment's
        ``close()`` runs (for a store from :func:`dsh.open`, the backend is closed). Every step
        is attempted even when one fails. Idempotent. A store with a persistence attachment
        that is never closed is closed at interpreter exit.

        Raises:
            WriteFailedError: a drain failed (the first failure, after every step ran; the
                events stay in memory).
        """
        if self._closed:
            return
        self._closed = True
        _OPEN_STORES.discard(self)
        failures: list[Exception] = []
        for live in self.list():
            # a session whose stored log was found damaged is written no more: its disposal
            # drops its queue (docs/rules.md#verified-page-in)
            if live.log_damage is None:
                try:
                    self.flush(live)
                except Exception as exc:  # collected: the other sessions are still drained
                    failures.append(exc)
            self.dispose(live)
        if self._persistence is not None:
            try:
                self._persistence.close()
            except Exception as exc:  # collected like the flushes; the first is raised
                failures.append(exc)
        if failures:
            raise failures[0]

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # fork -----------------------------------------------------------------------------------

    def fork(self, source: Session | str, boundary: int | None = None,
             child_id: str | None = None, *, open_turn: OpenTurnPolicy = "close") -> Session:
        """Create a live child session from a prefix of a live session.

        Args:
            source: The parent, as a live Session or its id.
            boundary: Inclusive parent seq of the cut; omitted: the parent's last event.
            child_id: The child's id; omitted: a minted ``session-<n>``.
            open_turn: ``"close"`` (default) appends ``forked`` closers for a turn left open at
                the cut; ``"reject"`` refuses such a cut with ``OPEN_TURN``.

        Returns:
            The announced child. Its log is the parent's events ``0..boundary`` (copies), then
            ``session/end-seed {inherited: true}`` stamped with the boundary event's time, then
            any closers (the marker is the only end-seed after the cut). Its header
            has ``parentSession``, ``seedLength = boundary + 1``, the parent's ``cwd`` and a new
            ``createdAt``. An empty parent gives a child whose log is ``[session/end-seed {}]``
            with ``seedLength`` 0.

        Raises:
            SessionForkError: in this order: ``SESSION_ALREADY_EXISTS`` (child id live),
                ``SESSION_NOT_FOUND`` (id not live, or a Session whose id is not live),
                ``SESSION_NOT_LIVE`` (a stale object whose id is live on another instance),
                ``INVALID_BOUNDARY`` (not a non-negative safe integer, past the end, or not a
                contiguous seq), ``OPEN_TURN`` (cut inside a turn with ``open_turn="reject"``).
            ConfigError: ``open_turn`` is not ``"close"`` or ``"reject"``.

        Rule: docs/rules.md#fork (order of checks, inherited marker, forked closers).
        """
        if open_turn not in ("close", "reject"):
            raise ConfigError(f"open_turn must be 'close' or 'reject', got {open_turn!r}")
        if child_id is not None and child_id in self._entries:
            raise SessionForkError(f'session "{child_id}" already exists',
                                   code="SESSION_ALREADY_EXISTS", session_id=child_id)
        parent = self._fork_source(source)
        events = parent.events
        if boundary is None and not events:
            seed: list[Any] = []
            seed_length = 0
        else:
            cut = self._fork_boundary(parent, events, boundary)
            prefix = events[:cut + 1]
            turn = _prefix_open_turn(prefix)
            if turn is not None and open_turn == "reject":
                raise SessionForkError(
                    f'fork boundary {cut} in session "{parent.id}" ends inside open turn {turn}',
                    code="OPEN_TURN", session_id=parent.id, seq=cut)
            marker = Event({"type": "session/end-seed", "seq": cut + 1,
                            "time": events[cut]["time"], "data": FrozenDict({"inherited": True})})
            seed = [*prefix, marker]
            if turn is not None:
                from dsh.session._repair import open_turn_closers  # sibling module, loaded late

                seed.extend(open_turn_closers(seed, "forked"))
            seed_length = cut + 1
        meta: dict[str, Any] = {}
        if parent.header.cwd is not None:
            meta["cwd"] = parent.header.cwd
        if parent.header.get("metadata"):  # a fork is the same tenant's, user's, ... session
            meta["metadata"] = parent.header["metadata"]
        meta["parentSession"] = parent.id
        meta["seedLength"] = seed_length
        return self.create(child_id, seed=seed, header=meta, inherited_event_count=seed_length)

    def _fork_source(self, source: Session | str) -> Session:
        if isinstance(source, str):
            entry = self._entries.get(source)
            if entry is None:
                raise SessionForkError(f'session "{source}" not found', code="SESSION_NOT_FOUND",
                                       session_id=source)
            return entry.session
        entry = self._entries.get(source.id)
        if entry is None:
            raise SessionForkError(f'session "{source.id}" not found', code="SESSION_NOT_FOUND",
                                   session_id=source.id)
        if entry.session is not source:
            raise SessionForkError(f'session "{source.id}" is not the live store instance',
                                   code="SESSION_NOT_LIVE", session_id=source.id)
        return source

    @staticmethod
    def _fork_boundary(parent: Session, events: Sequence[Event], boundary: object) -> int:
        if boundary is None:
            return len(events) - 1
        if type(boundary) is not int or not 0 <= boundary <= MAX_SAFE_INTEGER:
            raise SessionForkError(f"fork boundary {boundary!r} must be a non-negative safe "
                                   f"integer (session \"{parent.id}\")", code="INVALID_BOUNDARY",
                                   session_id=parent.id)
        if boundary >= len(events):
            last = events[-1]["seq"] if events else "none"
            raise SessionForkError(f'fork boundary {boundary} does not exist in session '
                                   f'"{parent.id}" (last seq: {last})', code="INVALID_BOUNDARY",
                                   session_id=parent.id)
        if events[boundary]["seq"] != boundary:
            raise SessionForkError(f"fork boundary {boundary} does not match a contiguous event "
                                   f'seq in session "{parent.id}" (event at index {boundary} has '
                                   f"seq {events[boundary]['seq']})", code="INVALID_BOUNDARY",
                                   session_id=parent.id)
        return boundary

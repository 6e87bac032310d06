"""The persistence facade: cold-read pipeline, write-behind observer, load/inspect and resume.

:class:`Persistence` wraps one backend (:mod:`dsh.persistence._contract`). It

* reads cold logs through one pipeline, in order (persistence spec §3.8, core spec §15.2):
  identity, format version, legacy v0 normalisation, vocabulary, crash-repair closers, then
  full restore validation (``Session.restore``) in memory;
* binds to a ``SessionStore`` as an observer (:meth:`Persistence.bind`): appends are written
  behind with a fixed batching window (DESIGN §3.4, spec §3.5) by one writer thread per live
  session, and ``on_flush`` is the durability barrier;
* resumes a stored session in seed ch. 28 order: take write ownership first, read cold, close
  the interrupted turn durably through the same handle, rebuild with ``Session.restore`` and
  publish the session with that handle owned by the write-behind observer.

A live session is never read as a stored one: ``resume`` of a live id is refused, ``load`` of a
live id with an open turn is refused, ``inspect`` of a live id returns the live snapshot.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Protocol, cast

from dsh._errors import (
    ConfigError,
    DshError,
    EventRejectedError,
    LogCorruptError,
    PersistenceError,
    SessionBusyError,
    SessionExistsError,
    SessionForkError,
    UnknownEventTypeError,
    WriteFailedError,
)
from dsh.json import FrozenDict, c_stored_prescan, json_equal
from dsh.persistence import _restore_point as ck
from dsh.persistence._contract import (
    Backend,
    ColdRead,
    Handle,
    OpenMode,
    SessionSummary,
    TornTail,
    check_session_id,
    normalize_header,
    session_id_problem,
)
from dsh.persistence._legacy import normalize_legacy_events
from dsh.persistence._listing import ListingEntry, jsonl_entries, sqlite_entries, summarize
from dsh.persistence.jsonl._format import format_version_refusal
from dsh.session import (
    KNOWN_EVENT_TYPES,
    SESSION_FORMAT_VERSION,
    Event,
    RestoreFold,
    RestoreState,
    Session,
    interrupted_turn_closers,
    open_turn_closers,
    unknown_type_hint,
)

__all__ = [
    "MAX_BATCH_WINDOW_MS",
    "Inspection",
    "Persistence",
    "PersistenceObserver",
    "WriteBehind",
    "read_pipeline",
]

log = logging.getLogger("dsh.persistence")

MAX_BATCH_WINDOW_MS = 2_147_483_647
"""Largest batching window accepted (persistence spec §2.1 ``MAX_WRITE_BATCH_DELAY_MS``)."""

_TITLE_CHARS = 80
_IDLE_POLL_S = 2.0
"""How long after its last armed window an idle writer keeps sleeping one window at a time."""
_MIN_POLL_S = 0.05
"""Shortest window worth an idle poll (shorter ones wake the writer per armed window)."""

_Entries = list[ListingEntry]
_Errors = list[DshError]


class _SessionLike(Protocol):
    """What the coordinator needs from a live ``dsh.session._session.Session``."""

    @property
    def id(self) -> str: ...

    @property
    def header(self) -> Mapping[str, Any]: ...

    @property
    def events(self) -> tuple[Event, ...]: ...


@dataclass(frozen=True, slots=True)
class WriteBehind:
    """Write-behind configuration (persistence spec §3.5, §11; DESIGN §3.4).

    Attributes:
        batch_window_ms: Fixed batching window in ms, counted from the first event queued after
            the previous write (not a debounce: later events never push it back). Integer in
            ``[1, 2_147_483_647]``; default 200.

    Raises:
        ConfigError: ``batch_window_ms`` is not an integer in range (``bool`` is refused).
    """

    batch_window_ms: int = 200

    def __post_init__(self) -> None:
        value = self.batch_window_ms
        if type(value) is not int or not 1 <= value <= MAX_BATCH_WINDOW_MS:
            raise ConfigError(f"WriteBehind.batch_window_ms must be an integer between 1 and "
                              f"{MAX_BATCH_WINDOW_MS} ms, got {value!r}",
                              json_path="$.batch_window_ms")


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
    """Run the cold-read pipeline over a backend read, in spec order (spec §3.8, core §15.2).

    1. identity: the header id must be ``session_id``;
    2. format version: not 0 → refusal saying which direction (upgrade dsh for newer logs);
    3. legacy v0 normalisation (:mod:`dsh.persistence._legacy`);
    4. vocabulary: every type known or the event marked ``ignorable: true``;
    5. crash repair: ``interrupted_turn_closers`` over the normalised events.

    Args:
        session_id: The requested id.
        cold: The backend read (offset 0).
        path: The raw log path for messages, when the backend has one.

    Returns:
        tuple: ``(events, closers)``.

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
        legacy_at, unknown_at = (c_stored_prescan(cold.events, KNOWN_EVENT_TYPES)
                                 if c_stored_prescan is not None else (0, 0))
    # Without a legacy shape (found in one C pass) the events stay the very same objects.
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
        closers = interrupted_turn_closers(events)
    except EventRejectedError as exc:
        raise LogCorruptError(f"stored session {session_id!r} failed validation: {exc.message}",
                              session_id=session_id, path=path, seq=exc.where.get("seq")
                              if isinstance(exc.where.get("seq"), int) else None) from exc
    return events, closers


@dataclass(frozen=True, slots=True)
class _Resumed:
    """What a checkpointed resume hands the writer: the state and the checkpoint's extent."""

    state: RestoreState
    checkpoint_count: int
    checkpoint_bytes: int


def _plain_records(events: Sequence[Event]) -> bool:
    """True when no stored record needs legacy normalisation (a C pass; False without C)."""
    return c_stored_prescan is not None and c_stored_prescan(events, KNOWN_EVENT_TYPES)[0] < 0


def _restore(session_id: str, seed: Sequence[Event], header: FrozenDict) -> Any:
    """``Session.restore`` with validation failures reported as corruption (spec §3.8 step 3)."""
    inherited = header.get("seedLength") or 0
    try:
        return Session.restore(session_id, seed, header, inherited_event_count=inherited)
    except EventRejectedError as exc:
        raise LogCorruptError(f"stored session {session_id!r} failed validation: {exc.message}",
                              session_id=session_id,
                              seq=exc.where.get("seed_index")
                              if isinstance(exc.where.get("seed_index"), int) else None) from exc


def _raw_path(handle: Handle) -> str | None:
    path = getattr(handle, "path", None)
    return str(path) if path is not None else None


def _open_turn(events: Sequence[Event]) -> bool:
    open_turn = False
    for event in events:
        etype = event.get("type")
        if etype == "turn/start":
            open_turn = True
        elif etype == "turn/end":
            open_turn = False
    return open_turn


def _title(events: Sequence[Event]) -> str | None:
    title: str | None = None
    first_prompt: str | None = None
    for event in events:
        etype = event.get("type")
        data = event.get("data")
        if etype == "session/title" and isinstance(data, dict) \
                and isinstance(data.get("title"), str):
            title = data["title"]
        elif first_prompt is None and etype == "user/message" and isinstance(data, dict):
            source = data.get("source")
            if isinstance(source, dict) and source.get("kind") != "user":
                continue
            for block in data.get("content") or ():
                if isinstance(block, dict) and block.get("type") == "text" \
                        and isinstance(block.get("text"), str):
                    first_prompt = block["text"][:_TITLE_CHARS]
                    break
    return title if title is not None else first_prompt


class _SessionWriter:
    """Write-behind for one live session: a queue, a fixed window, one writer thread.

    Semantics (persistence spec §3.5, DESIGN §3.4): the first event queued after a write arms a
    deadline ``window`` ms later; at the deadline the whole pending prefix is written as one
    batch (``append`` + ``flush``). A failed write puts its batch back at the front (order kept),
    pauses automatic writes until the next event or flush, is logged, and is raised by the next
    :meth:`flush`. Events with ``seq`` below the cursor (already stored) are dropped, so a
    retried batch never duplicates.

    With a ``fold`` (backends that keep projection checkpoints), every durable batch is folded
    into the restore state, and a checkpoint is written at the first flush after
    ``CHECKPOINT_EVERY_EVENTS`` events or ``CHECKPOINT_EVERY_BYTES`` bytes since the last one.

    Waking the writer thread costs a thread switch (and, on a busy machine, a wait for a CPU)
    that lands in the producer's next append or flush. So for up to ``_IDLE_POLL_S`` after the
    last armed window an idle writer sleeps one window at a time instead of indefinitely, and
    the event that arms a window wakes it only when that sleep would end after the new
    deadline: a session flushed every turn, faster than its window, then costs no wake-up per
    turn. A flush that finds the writer idle writes on its own thread and wakes nobody (barriers
    wait on their own condition, so the end of a write wakes only them).
    """

    def __init__(self, session: _SessionLike, handle: Handle, cursor: int,
                 config: WriteBehind, backend_url: str, fold: RestoreFold | None = None,
                 last_checkpoint: tuple[int, int] = (0, 0)) -> None:
        self.session = session
        self.handle = handle
        self.cursor = cursor
        self._fold = fold
        # checked once: a runtime Protocol isinstance walks the protocol's members each call
        self._keeps_checkpoints = isinstance(handle, ck.KeepsCheckpoints)
        self._last_checkpoint = last_checkpoint  # (event count, durable bytes) of the last one
        self._window = config.batch_window_ms / 1000.0
        self._url = backend_url
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # the writer thread waits here for work
        self._settled = threading.Condition(lock)  # flush barriers wait here for a write's end
        self._pending: list[Event] = []
        self._deadline: float | None = None
        self._armed = float("-inf")  # the last deadline armed (kept after it is written)
        self._wake_at: float | None = None  # when the writer's current wait ends (None: never)
        # idle polling pays only when a window outlasts a poll's own wake-up cost
        self._poll = self._window if self._window >= _MIN_POLL_S else None
        self._paused = False
        self._active = False
        self._barriers = 0
        self._failure: BaseException | None = None  # background failure for the next flush
        self._fail_count = 0
        self._last_error: BaseException | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"dsh-write-behind:{session.id}")
        self._thread.start()

    # producer side -----------------------------------------------------------------------

    def enqueue(self, events: Sequence[Event]) -> None:
        if not events:
            return
        with self._cond:
            self._pending.extend(events)
            if self._barriers:
                self._cond.notify_all()
                return
            # Wake the writer only when it would otherwise sleep past the new deadline: a
            # waiting writer already sleeps until the armed deadline (or one idle poll), and
            # waking it costs a context switch each (see the class docstring).
            if self._paused:
                self._paused = False  # a fresh window after a failure (spec §3.5)
                self._deadline = self._armed = time.monotonic() + self._window
                self._cond.notify_all()
            elif self._deadline is None:
                self._deadline = self._armed = deadline = time.monotonic() + self._window
                wake = self._wake_at
                if wake is None or wake > deadline:
                    self._cond.notify_all()

    def has_work(self) -> bool:
        with self._cond:
            return bool(self._pending) or self._active

    def flush(self) -> None:
        """Durability barrier: return once everything queued is appended and flushed.

        Raises:
            WriteFailedError: a background write failed since the last flush (its events are
                kept and automatic writes resume), or a write failed during this barrier.
        """
        with self._cond:
            stored = self._failure
            if stored is not None:
                cause = stored
                self._failure = None
                self._paused = False
                if self._pending and self._deadline is None:
                    self._deadline = time.monotonic() + self._window
                self._cond.notify_all()
                raise WriteFailedError(
                    f"a background write of session {self.session.id!r} to {self._url} failed "
                    f"({cause!r}); its events were kept for a retry, flush again to confirm "
                    f"they are durable", session_id=self.session.id) from cause
            failures_before = self._fail_count
            self._barriers += 1
            self._paused = False
            if not self._active and self._pending:
                # The writer is idle: write the batch on this thread. A durable per-turn flush
                # then costs one fsync, not two thread hand-offs around it.
                batch, self._pending = self._pending, []
                self._deadline = None
                self._active = True
                self._cond.release()
                try:
                    self._write_batch(batch, background=False)
                finally:
                    self._cond.acquire()
            # No wake-up for the writer here: the end of the write above woke it if events were
            # queued meanwhile, and with nothing to take it has nothing to do.
            try:
                while self._pending or self._active:
                    if self._fail_count != failures_before:
                        last = self._last_error
                        self._failure = None
                        raise WriteFailedError(
                            f"writing session {self.session.id!r} to {self._url} failed "
                            f"({last!r}); its events are kept for the next flush",
                            session_id=self.session.id) from last
                    self._settled.wait()
            finally:
                self._barriers -= 1

    def close(self) -> None:
        """Final drain, then stop the thread and close the handle.

        Raises:
            WriteFailedError: the final drain failed; the writer stays usable for a retry.
        """
        self.flush()
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()
        self.handle.close()

    def abandon(self) -> None:
        """Stop the thread and close the handle without draining (teardown after failure)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()
        self.handle.close()

    # writer thread -----------------------------------------------------------------------

    def _take(self) -> tuple[list[Event], bool] | None:
        """Wait for a due batch; None when stopping."""
        with self._cond:
            try:
                while True:
                    if self._stop and not self._barriers:
                        return None
                    timeout: float | None = None
                    if self._pending and not self._paused:
                        # A flush writing on its own thread is _active: a second write of the
                        # same handle would overlap it (and end its barrier early); the end of
                        # that write wakes this thread (see _write_batch).
                        if not self._active:
                            now = time.monotonic()
                            if self._barriers or (self._deadline is not None
                                                  and now >= self._deadline):
                                batch, self._pending = self._pending, []
                                self._deadline = None
                                self._active = True
                                return batch, self._barriers == 0
                            if self._deadline is not None:
                                timeout = self._deadline - now
                    elif self._poll is not None and not self._paused:
                        now = time.monotonic()
                        if now - self._armed < _IDLE_POLL_S:
                            timeout = self._poll  # idle, but recently busy: one window
                    self._wake_at = None if timeout is None else now + timeout
                    self._cond.wait(timeout)
            finally:
                self._wake_at = None

    def _run(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            batch, background = taken
            self._write_batch(batch, background=background)

    def _write_batch(self, batch: list[Event], *, background: bool) -> None:
        """Write one taken batch (``_active`` is set); on failure put it back and record why."""
        error: BaseException | None = None
        try:
            self._write(batch)
        except Exception as exc:  # kept, logged, and raised by the next flush()
            error = exc
        with self._cond:
            self._active = False
            if error is not None:
                self._pending[:0] = batch
                self._paused = True
                self._deadline = None
                self._fail_count += 1
                self._last_error = error
                if background and not self._barriers:
                    log.warning("background write of session %r to %s failed: %r; "
                                "%d buffered event(s) are kept and raised by the next "
                                "flush", self.session.id, self._url, error,
                                len(self._pending))
                    self._failure = error
            self._settled.notify_all()  # the barriers
            if self._pending and not self._paused:
                # events queued during this write: a writer thread that waited for its end
                # takes them (none waits after a write of its own, nor in the per-turn case)
                self._cond.notify_all()

    def _write(self, batch: list[Event]) -> None:
        fresh = [event for event in batch if event["seq"] >= self.cursor]
        if not fresh:
            return
        self.handle.append(fresh)
        self.handle.flush()
        self.cursor = fresh[-1]["seq"] + 1
        if self._fold is not None:
            self._fold.feed(fresh)
            self._maybe_checkpoint(self._fold)

    def _maybe_checkpoint(self, fold: RestoreFold) -> None:
        """Write a projection checkpoint of the durable prefix when one is due.

        Never fails the flush: the batch is durable and the checkpoint is only derived, so a
        failure to write one is logged (WARNING) and the next due flush tries again.
        """
        if fold.event_count != self.cursor or not self._keeps_checkpoints:
            return  # events before the fold's start are not all durable yet
        handle = cast(ck.KeepsCheckpoints, self.handle)  # the check cached at __init__
        count, size = self._last_checkpoint
        if self.cursor - count < ck.CHECKPOINT_EVERY_EVENTS \
                and handle.durable_bytes - size < ck.CHECKPOINT_EVERY_BYTES:
            return
        try:
            anchor = handle.checkpoint_anchor()
            if anchor is None or anchor.event_count != self.cursor:
                return
            data = ck.encode_checkpoint(ck.Checkpoint(anchor=anchor, state=fold.state()))
            handle.write_checkpoint(data)
        except (OSError, DshError, ValueError) as exc:
            log.warning("session %r: could not write its projection checkpoint (%r); resumes "
                        "read the whole log until the next one", self.session.id, exc)
            return
        self._last_checkpoint = (anchor.event_count, anchor.byte_offset)


class PersistenceObserver:
    """The ``SessionStore`` observer returned by :meth:`Persistence.bind`.

    Hooks (called by the store): ``on_created(session)`` (a raise vetoes publication),
    ``on_event(session, event)``, ``on_flush(session)`` (blocking durability barrier),
    ``aflush(session)`` (the same without blocking an asyncio loop), ``on_disposed(session)``
    (final drain, then the handle is closed).
    """

    def __init__(self, persistence: Persistence, store: object) -> None:
        self._persistence = persistence
        self.store = store
        self._writers: dict[int, _SessionWriter] = {}
        self._adopting: dict[str, tuple[Handle, int, _Resumed | None, bool]] = {}
        self._publishing: set[int] = set()  # resumed sessions whose announcement is running
        self._mutex = threading.RLock()

    # resume hand-off ---------------------------------------------------------------------

    def _adopt(self, session_id: str, handle: Handle, cursor: int,
               resumed: _Resumed | None = None, foldable: bool = True) -> None:
        with self._mutex:
            self._adopting[session_id] = (handle, cursor, resumed, foldable)

    def _drop_adoption(self, session_id: str) -> Handle | None:
        with self._mutex:
            entry = self._adopting.pop(session_id, None)
        return entry[0] if entry else None

    # hooks -------------------------------------------------------------------------------

    def _writer_for(self, session: _SessionLike) -> _SessionWriter:
        writer = self._writers.get(id(session))  # fast path: a dict read is atomic
        if writer is not None:
            return writer
        with self._mutex:
            writer = self._writers.get(id(session))
            if writer is None:
                self.on_created(session)
                writer = self._writers[id(session)]
            return writer

    def on_created(self, session: _SessionLike) -> None:
        """Bind a newly published session: take its write handle and queue its seed.

        A session published by :meth:`Persistence.resume` uses the handle resume opened and
        queues only the suffix after the stored log (the ``session/end-seed`` marker). Any
        other session either creates its stored session or, when one exists, adopts it if the
        stored events are a JSON-identical prefix of the session's (a torn tail is truncated,
        no closers: the live turn is not interrupted; spec §3.12).

        Raises:
            SessionBusyError: another writer holds the id.
            SessionExistsError: the stored log does not match this session (id collision).
        """
        backend = self._persistence.backend
        sid = session.id
        with self._mutex:
            if id(session) in self._writers:
                return
            adopted = self._adopting.pop(sid, None)
            resumed: _Resumed | None = None
            if adopted is not None:
                handle, cursor, resumed, foldable = adopted
            else:
                handle, cursor = self._claim(session)
                foldable = cursor == 0  # an adopted stored prefix may hold legacy records
            fold = None
            last = (0, 0)
            # Checkpoints only for logs whose stored records are the events themselves: a
            # legacy record would page in differently from its normalised event.
            if foldable and isinstance(handle, ck.KeepsCheckpoints) \
                    and isinstance(session, Session):
                base = resumed.state if resumed is not None else None
                fold = RestoreFold.of_session(session, base)
                if resumed is not None:
                    last = (resumed.checkpoint_count, resumed.checkpoint_bytes)
            writer = _SessionWriter(session, handle, cursor, self._persistence.write_behind,
                                    backend.url, fold, last)
            self._writers[id(session)] = writer
            self._persistence._live[sid] = session
        writer.enqueue(session.events[cursor:])

    def _claim(self, session: _SessionLike) -> tuple[Handle, int]:
        backend = self._persistence.backend
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

    def on_event(self, session: _SessionLike, event: Event) -> None:
        """Queue one committed event for the write-behind batch."""
        self._writer_for(session).enqueue((event,))

    def on_flush(self, session: _SessionLike) -> None:
        """Block until every event queued for ``session`` is appended and flushed.

        Raises:
            WriteFailedError: a write failed (cause chained); events are kept.
        """
        with self._mutex:
            writer = self._writers.get(id(session))
        if writer is not None:
            writer.flush()

    async def aflush(self, session: _SessionLike) -> None:
        """:meth:`on_flush` run in a worker thread, so the asyncio loop keeps running."""
        import asyncio  # not at the top: `import dsh` stays free of asyncio (~25 ms)

        await asyncio.to_thread(self.on_flush, session)

    def on_disposed(self, session: _SessionLike) -> None:
        """Final drain of ``session``, then close its handle (releases write ownership).

        Raises:
            WriteFailedError: the drain failed; the writer is kept so ``Persistence.close``
                retries it.
        """
        with self._mutex:
            writer = self._writers.get(id(session))
            vetoed = id(session) in self._publishing
        if writer is None:
            return
        if vetoed:
            # a resume whose publication was vetoed writes nothing more (spec §10.13)
            writer.abandon()
            with self._mutex:
                self._writers.pop(id(session), None)
                if self._persistence._live.get(session.id) is session:
                    del self._persistence._live[session.id]
            return
        try:
            writer.close()
        except WriteFailedError:
            log.error("retirement of session %r failed; its writer is kept for a retry at "
                      "close", session.id)
            raise
        with self._mutex:
            self._writers.pop(id(session), None)
            if self._persistence._live.get(session.id) is session:
                del self._persistence._live[session.id]

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
            if self._persistence._live.get(writer.session.id) is writer.session:
                del self._persistence._live[writer.session.id]
        for handle, *_ in adopting:
            handle.close()
        return errors


class Persistence:
    """One store: a backend plus the pipeline, write-behind and resume (DESIGN §3.3-§3.4).

    Args:
        backend: Any :class:`~dsh.persistence._contract.Backend`.
        write_behind: Batching configuration for bound stores.
    """

    def __init__(self, backend: Backend, *, write_behind: WriteBehind | None = None) -> None:
        self.backend = backend
        self.write_behind = write_behind or WriteBehind()
        self._observers: dict[int, PersistenceObserver] = {}
        self._live: dict[str, Any] = {}
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

        Rule: persistence spec §2.1 (``list`` reads headers; §4.3 and §5 header storage).
        """
        return list(self.backend.list_headers())

    def list(self) -> list[SessionSummary]:
        """Summaries of every stored session with at least one event (spec §2.1 ``list``).

        Each log is read (committed prefix only; nothing is repaired or written).

        Raises:
            LogCorruptError, SessionFormatUnsupportedError: a stored log cannot be read.
        """
        out: list[SessionSummary] = []
        for header in self.backend.list_headers():
            sid = header["id"]
            with self.backend.open(sid, "read") as handle:
                cold = handle.read(0)
            events = cold.events
            if not events:
                continue
            out.append(SessionSummary(sid, cold.header, len(events), events[-1]["time"],
                                      _title(events)))
        return out

    def list_entries(self) -> tuple[_Entries, _Errors]:
        """What ``dsh ls`` shows of every stored session with at least one event, fast.

        SQLite answers from its tables and JSONL from its listing index (a sidecar kept beside
        the logs, an entry rebuilt from a full read when its log changed), so an unchanged
        store is listed without reading any log; other backends read every log.

        Returns:
            The entries (order is the backend's), and one error per session whose log could
            not be read (``where["session_id"]`` names it); one damaged log never hides the
            others.

        Raises:
            PersistenceError: the store itself cannot be listed (its directory or database).

        Rule: persistence spec §2.1 (``list``); an entry equals :func:`summarize` of a full
        read of an intact log.
        """
        def full(session_id: str) -> tuple[FrozenDict, tuple[Event, ...]]:
            read = self.read(session_id)
            return read.header, read.stored_events

        kind = type(self.backend).__name__
        if kind == "JsonlBackend":
            return jsonl_entries(self.backend, full)
        entries: _Entries = []
        errors: _Errors = []
        todo: Sequence[str]
        if kind == "SqliteBackend":
            entries, todo = sqlite_entries(self.backend)
        else:
            todo = [str(h["id"]) for h in self.backend.list_headers()]
        for sid in todo:
            try:
                header, events = full(sid)
            except DshError as error:
                error.where.setdefault("session_id", sid)
                errors.append(error)
                continue
            if events:
                entries.append(summarize(header, events))
        return entries, errors

    # reading -----------------------------------------------------------------------------

    def _live_session(self, session_id: str) -> Any:
        return self._live.get(session_id)

    def inspect(self, session_id: str) -> Inspection:
        """Read a session without writing anything (spec §3.10 ``inspect``).

        A live session yields its current snapshot (possibly an open turn). A stored one runs
        the read pipeline and full restore validation; closers stay in memory.

        Raises:
            SessionNotFoundError, LogCorruptError, SessionFormatUnsupportedError,
            UnknownEventTypeError.
        """
        live = self._live_session(session_id)
        if live is not None:
            return Inspection(FrozenDict(live.header), tuple(live.events), (), None, "live",
                              live=True)
        with self.backend.open(session_id, "read") as handle:
            cold = handle.read(0)
            path = _raw_path(handle)
        events, closers = read_pipeline(session_id, cold, path=path)
        _restore(session_id, events + closers, cold.header)
        return Inspection(cold.header, events + closers, closers, cold.torn, cold.revision)

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
                pipeline refused the log (persistence spec §3.8).

        Rule: persistence spec §3.8 (cold-read pipeline), §3.10 (``inspect`` writes nothing).
        """
        with self.backend.open(session_id, "read") as handle:
            cold = handle.read(0)
            path = _raw_path(handle)
        events, closers = read_pipeline(session_id, cold, path=path)
        return Inspection(cold.header, events + closers, closers, cold.torn, cold.revision)

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

        Rule: core spec §10 and seed ch. 28 (fork); persistence spec §3.10 (reads write
        nothing to the parent).
        """
        from dsh.session import SessionStore

        if self._live_session(source_id) is not None:
            raise SessionBusyError(f"cannot fork stored session {source_id!r} while it is live "
                                   f"in this process; fork the live Session through its store",
                                   code="SESSION_LIVE", session_id=source_id)
        stored = self.read(source_id)
        events = stored.stored_events
        parent = _restore(source_id, events, stored.header)
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
            if observer is not None and not observer._writers:
                del self._observers[id(store)]
        return child.id

    def load(self, session_id: str) -> Inspection:
        """Read a session and commit its crash repair (spec §3.10 ``load``).

        Through a write handle: read, pipeline, validation, then (when needed) truncate the
        torn tail and append the closers as one batch, flushed. A balanced, untorn log is not
        written to.

        Raises:
            SessionBusyError: another writer holds the id.
            PersistenceError: code ``SESSION_LIVE``: the id is live here with an open turn.
            SessionNotFoundError, LogCorruptError, SessionFormatUnsupportedError,
            UnknownEventTypeError.
        """
        live = self._live_session(session_id)
        if live is not None:
            self._flush_live(live)
            if _open_turn(live.events):
                raise PersistenceError(
                    f"cannot load session {session_id!r} while its live turn is open; use the "
                    f"live Session or wait for the turn to close", code="SESSION_LIVE",
                    session_id=session_id)
            return Inspection(FrozenDict(live.header), tuple(live.events), (), None, "live",
                              live=True)
        with self.backend.open(session_id, "write") as handle:
            cold = handle.read(0)
            events, closers = read_pipeline(session_id, cold, path=_raw_path(handle))
            _restore(session_id, events + closers, cold.header)
            revision = cold.revision  # nothing written: the read's own revision stands
            if closers or cold.torn is not None:
                handle.append(closers)
                handle.flush()
                revision = handle.read(len(events) + len(closers)).revision
        return Inspection(cold.header, events + closers, closers, cold.torn, revision)

    def _flush_live(self, session: Any) -> None:
        for observer in list(self._observers.values()):
            observer.on_flush(session)

    def checkpoint(self, session_id: str) -> bool:
        """Write a projection checkpoint of a stored session now, from a full, validated read.

        Writers keep checkpoints by themselves (see :mod:`dsh.persistence._restore_point`); this
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
            raise SessionBusyError(f"cannot checkpoint session {session_id!r} while it is live "
                                   "in this process; its writer keeps its checkpoints",
                                   code="SESSION_LIVE", session_id=session_id)
        with self.backend.open(session_id, "write") as handle:
            if not isinstance(handle, ck.KeepsCheckpoints):
                return False
            cold = handle.read(0)
            events, closers = read_pipeline(session_id, cold, path=_raw_path(handle))
            _restore(session_id, events + closers, cold.header)
            if not cold.events or cold.torn is not None or not _plain_records(cold.events):
                return False
            fold = RestoreFold(cold.header.get("seedLength") or 0)
            fold.feed(cold.events)
            anchor = handle.checkpoint_anchor()
            if anchor is None or anchor.event_count != len(cold.events):
                return False
            handle.write_checkpoint(
                ck.encode_checkpoint(ck.Checkpoint(anchor=anchor, state=fold.state())))
        return True

    def check_checkpoint(self, session_id: str, read: Inspection | None = None
                         ) -> ck.CheckpointCheck:
        """Check the session's projection checkpoint against a full read (``dsh verify``).

        Args:
            session_id: A stored session.
            read: Its :meth:`read`, when the caller already has one.

        Returns:
            The verdict: absent, consistent, or ignored (with why); a bad checkpoint is never
            an error, since a resume ignores it.

        Raises:
            SessionNotFoundError, LogCorruptError, ...: the log itself cannot be read.
        """
        full = read if read is not None else self.read(session_id)
        with self.backend.open(session_id, "read") as handle:
            return ck.check_checkpoint(handle, full.stored_events,
                                       full.header.get("seedLength") or 0)

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

    def bind(self, store: object) -> PersistenceObserver:
        """Return the write-behind observer for ``store`` (one per store, created once)."""
        observer = self._observers.get(id(store))
        if observer is None:
            observer = PersistenceObserver(self, store)
            self._observers[id(store)] = observer
        return observer

    def resume(self, store: Any, session_id: str, *,
               on_handle: Callable[[Handle], object] | None = None) -> Any:
        """Resume a stored session into ``store`` (seed ch. 28 order; spec §7).

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
        handle = self.backend.open(session_id, "write")
        observer: PersistenceObserver | None = None
        try:
            if on_handle is not None:
                on_handle(handle)
            paged = self._resume_from_checkpoint(store, session_id, handle)
            if paged is not None:
                session, cursor, closers, resumed = paged
                repair, foldable = bool(closers), True
            else:
                cold = handle.read(0)
                events, closers = read_pipeline(session_id, cold, path=_raw_path(handle))
                seed = events + closers
                session = self._prepare(store, session_id, seed, cold.header)
                cursor, resumed = len(seed), None
                repair = bool(closers) or cold.torn is not None
                # The pipeline hands back the stored tuple itself when nothing was normalised.
                foldable = events is cold.events or _plain_records(cold.events)
            if repair:
                handle.append(closers)
                handle.flush()
            observer = self._observer_for(store)
            observer._adopt(session_id, handle, cursor, resumed, foldable)
            observer._publishing.add(id(session))
            try:
                self._publish(store, session)
            finally:
                observer._publishing.discard(id(session))
        except BaseException:
            if observer is not None:
                observer._drop_adoption(session_id)
            handle.close()
            raise
        return session

    @staticmethod
    def _resume_from_checkpoint(store: Any, session_id: str, handle: Handle
                                ) -> tuple[Any, int, tuple[Event, ...], _Resumed] | None:
        """Restore through the log's projection checkpoint, reading only its tail; or None.

        The tail goes through the same pipeline as a full read (identity, version, vocabulary,
        closers over the open turn, restore validation). Any doubt (no checkpoint, a stale or
        damaged one, a legacy or unknown event in the tail, a tail that does not validate)
        returns None and the caller reads the whole log, which gives the same session or the
        precise error. Nothing is written here.

        Returns:
            ``(session, cursor, closers, resumed)``: the prepared session, the seq the writer
            continues from once the closers are written, and the checkpoint's state.
        """
        prepare = getattr(store, "prepare_paged", None)
        if not isinstance(handle, ck.KeepsCheckpoints) or prepare is None:
            return None
        try:
            checkpoint, cold, source = handle.read_checkpointed()
            state = checkpoint.state
            tail = cold.events
            header = cold.header
            if header.get("id") != session_id or header.get("version") != SESSION_FORMAT_VERSION:
                raise ck.CheckpointRefused("header")
            if c_stored_prescan is None:
                raise ck.CheckpointRefused("no-prescan")  # the pure-Python build reads in full
            legacy_at, unknown_at = c_stored_prescan(tail, KNOWN_EVENT_TYPES)
            if legacy_at >= 0:
                raise ck.CheckpointRefused("legacy")
            for event in tail[unknown_at:unknown_at + 1]:
                if event.get("type") not in KNOWN_EVENT_TYPES \
                        and event.get("ignorable") is not True:
                    raise ck.CheckpointRefused("unknown-type")
            cut = len(source)
            if state.turn_open and not any(
                    e["type"] in ("turn/start", "turn/end") for e in tail):
                window: Sequence[Event] = [*source.read(state.turn_boundary, cut), *tail]
                base = state.turn_boundary
            else:
                window, base = tail, cut
            closers = open_turn_closers(window, "interrupted", base_seq=base)
            session = prepare(session_id, header=header, state=state, source=source,
                              tail=tail + closers,
                              inherited_event_count=header.get("seedLength") or 0)
        except ck.CheckpointRefused as exc:
            ck.note_refusal(session_id, exc.reason)
            return None
        except DshError as exc:
            ck.note_refusal(session_id, f"invalid:{exc.code}")
            return None
        ck.stats["used"] += 1
        anchor = checkpoint.anchor
        return (session, cut + len(tail) + len(closers), closers,
                _Resumed(state, anchor.event_count, anchor.byte_offset))

    @staticmethod
    def _prepare(store: Any, session_id: str, seed: tuple[Event, ...],
                 header: FrozenDict) -> Any:
        """Restore through ``store.prepare`` (its clock, its live-id check) when it has one."""
        prepare = getattr(store, "prepare", None)
        if prepare is None:
            return _restore(session_id, seed, header)
        try:
            return prepare(session_id, seed=seed, header=header,
                           inherited_event_count=header.get("seedLength") or 0,
                           seed_source="persistence")
        except EventRejectedError as exc:
            raise LogCorruptError(
                f"stored session {session_id!r} failed validation: {exc.message}",
                session_id=session_id, seq=exc.where.get("seed_index")
                if isinstance(exc.where.get("seed_index"), int) else None) from exc

    def _observer_for(self, store: Any) -> PersistenceObserver:
        observer = self._observers.get(id(store))
        if observer is None:
            observer = self.bind(store)
            store.observe(observer)
        return observer

    @staticmethod
    def _publish(store: Any, session: Any) -> None:
        enter = getattr(store, "enter", None)
        announce = getattr(store, "announce", None)
        if enter is None or announce is None:
            raise PersistenceError("the session store has no enter/announce; cannot publish a "
                                   "resumed session", code="STORE_API")
        detach = enter(session)
        try:
            announce(session)
        except BaseException:
            detach()
            raise

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

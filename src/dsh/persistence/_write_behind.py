"""Write-behind: the per-session writer thread, its fixed window and its flush barrier.

One :class:`SessionWriter` per live session owns the session's write handle until the session
is disposed (docs/rules.md#write-behind-and-the-flush-barrier):

* appends are queued and written behind: the first event queued after a write arms a fixed
  window (:class:`WriteBehind`), and the whole pending prefix is then one batch (``append`` +
  ``flush`` on the handle);
* :meth:`SessionWriter.flush` is the durability barrier: it returns once everything queued is
  durable, and raises the failure of a background write that happened since the last barrier;
* a failed write keeps its events (put back in order) and is retried, never duplicated: the
  writer drops events below its cursor;
* with a backend that keeps restore points, every durable batch is folded into the restore
  state and a restore point is written at a due flush (never failing that flush).

The writers are made and driven by the store's observer (:mod:`dsh.persistence._observer`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from dsh._errors import ConfigError, WriteFailedError
from dsh.persistence import _restore_point as rp
from dsh.persistence._after_commit import (
    AfterCommit,
    AfterCommitFailure,
    RecordsAfterCommit,
    take_failures,
)
from dsh.persistence._contract import Capabilities, Handle
from dsh.session import Event, RestoreFold, Session

__all__ = ["IDLE_POLL_S", "MAX_BATCH_WINDOW_MS", "MIN_POLL_S", "SessionWriter", "WriteBehind"]

log = logging.getLogger("dsh.persistence")

_PLAIN = Capabilities()
"""A backend declaring nothing beyond the contract (no restore points, no post-commit log)."""

MAX_BATCH_WINDOW_MS = 2_147_483_647
"""Largest batching window accepted (docs/stores.md#opening-a-store)."""

IDLE_POLL_S = 2.0
"""How long after its last armed window an idle writer keeps sleeping one window at a time."""
MIN_POLL_S = 0.05
"""Shortest window worth an idle poll (shorter ones wake the writer per armed window)."""


@dataclass(frozen=True, slots=True)
class WriteBehind:
    """Write-behind configuration (docs/rules.md#write-behind-and-the-flush-barrier).

    Attributes:
        batch_window_ms: Fixed batching window in ms, counted from the first event queued after
            the previous write (not a debounce: later events never push it back). Integer in
            ``[1, 2_147_483_647]``; default 200.
        restore_point_tail: None (default): a restore point is written every 2,048 events or
            2 MiB. An integer ``n >= 1``: also at the first flush ``n`` events after the last
            one, and when the session's writer closes (disposed, store closed) with any event
            after it; so a resume of a session closed cleanly reads no tail, and of a live one
            at most about ``n`` events plus a batch
            (docs/rules.md#restore-points-are-never-the-truth). For a store whose sessions are
            read cold often (the framework adapters use 256).
        flush_only: False (default): a writer thread writes each window's batch. True: no
            writer thread and no window; events are written only by a flush (the durability
            barrier) and at close, on the caller's thread. For a writer that flushes after
            every call anyway (the OpenAI Agents SDK session): its first write then starts no
            thread.

    Raises:
        ConfigError: ``batch_window_ms`` is not an integer in range, ``restore_point_tail``
            is neither None nor a positive integer (``bool`` is refused), or ``flush_only``
            is not a bool.
    """

    batch_window_ms: int = 200
    restore_point_tail: int | None = None
    flush_only: bool = False

    def __post_init__(self) -> None:
        value = self.batch_window_ms
        if type(value) is not int or not 1 <= value <= MAX_BATCH_WINDOW_MS:
            raise ConfigError(f"WriteBehind.batch_window_ms must be an integer between 1 and "
                              f"{MAX_BATCH_WINDOW_MS} ms, got {value!r}",
                              json_path="$.batch_window_ms")
        tail = self.restore_point_tail
        if tail is not None and (type(tail) is not int or not 1 <= tail <= MAX_BATCH_WINDOW_MS):
            raise ConfigError(f"WriteBehind.restore_point_tail must be None or an integer "
                              f"between 1 and {MAX_BATCH_WINDOW_MS} events, got {tail!r}",
                              json_path="$.restore_point_tail")
        if type(self.flush_only) is not bool:
            raise ConfigError(f"WriteBehind.flush_only must be a bool, got {self.flush_only!r}",
                              json_path="$.flush_only")




class SessionWriter:
    """Write-behind for one live session: a queue, a fixed window, one writer thread.

    Semantics (docs/rules.md#write-behind-and-the-flush-barrier): the first event queued after a
        write arms a
    deadline ``window`` ms later; at the deadline the whole pending prefix is written as one
    batch (``append`` + ``flush``). A failed write puts its batch back at the front (order kept),
    pauses automatic writes until the next event or flush, is logged, and is raised by the next
    :meth:`flush`. Events with ``seq`` below the cursor (already stored) are dropped, so a
    retried batch never duplicates.

    With a ``fold`` (backends that keep restore points), every durable batch is folded
    into the restore state, and a restore point is written at the first flush after
    ``RESTORE_POINT_EVERY_EVENTS`` events or ``RESTORE_POINT_EVERY_BYTES`` bytes since the last one
    (with ``config.restore_point_tail``: also after that many events, and at :meth:`close`).

    Once ``handle.flush()`` returns, the batch is committed: the cursor moves past it first, and
    what follows (the restore fold, the restore point) can no longer fail the write. Their
    failures, and those the handle recorded (seal, listing journal), are handed to ``report``
    (an :class:`AfterCommitFailure` each) after the write (docs/rules.md#commit-means-committed).

    Waking the writer thread costs a thread switch (and, on a busy machine, a wait for a CPU)
    that lands in the producer's next append or flush. So for up to ``IDLE_POLL_S`` after the
    last armed window an idle writer sleeps one window at a time instead of indefinitely, and
    the event that arms a window wakes it only when that sleep would end after the new
    deadline: a session flushed every turn, faster than its window, then costs no wake-up per
    turn. A flush that finds the writer idle writes on its own thread and wakes nobody (barriers
    wait on their own condition, so the end of a write wakes only them).
    """

    def __init__(self, session: Session, handle: Handle, cursor: int,
                 config: WriteBehind, backend_url: str, *,
                 capabilities: Capabilities = _PLAIN,
                 fold: RestoreFold | None = None,
                 last_restore_point: tuple[int, int] = (0, 0),
                 report: Callable[[AfterCommitFailure], None] | None = None) -> None:
        self.session = session
        self._report = report
        self._after_commit = AfterCommit(session.id)
        self.handle = handle
        self.cursor = cursor
        self._fold = fold
        self._capabilities = capabilities  # the backend's, declared (docs/stores.md#capabilities)
        # (event count, durable bytes) of the last restore point
        self._last_restore_point = last_restore_point
        self._tail_bound = config.restore_point_tail
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
        self._poll = self._window if self._window >= MIN_POLL_S else None
        self._paused = False
        self._active = False
        self._barriers = 0
        self._failure: BaseException | None = None  # background failure for the next flush
        self._fail_count = 0
        self._last_error: BaseException | None = None
        self._stop = False
        self._thread: threading.Thread | None = None  # none with flush_only: flushes write
        if not config.flush_only:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"dsh-write-behind:{session.id}")
            self._thread.start()

    # producer side -----------------------------------------------------------------------

    def enqueue(self, events: Sequence[Event]) -> None:
        if not events:
            return
        with self._cond:
            self._pending.extend(events)
            if self._thread is None:
                return  # flush_only: the next flush writes them
            if self._barriers:
                self._cond.notify_all()
                return
            # Wake the writer only when it would otherwise sleep past the new deadline: a
            # waiting writer already sleeps until the armed deadline (or one idle poll), and
            # waking it costs a context switch each (see the class docstring).
            if self._paused:
                # a fresh window after a failure (docs/rules.md#write-behind-and-the-flush-barrier)
                self._paused = False
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
                self._write_pending_here()
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
                    if self._thread is None and not self._active:
                        # flush_only: no writer thread takes what was queued during the
                        # write above (another thread appended): this barrier writes it
                        self._write_pending_here()
                        continue
                    self._settled.wait()
            finally:
                self._barriers -= 1

    def _write_pending_here(self) -> None:
        """Write the whole queue on this thread (``_cond`` held on entry and on return)."""
        batch, self._pending = self._pending, []
        self._deadline = None
        self._active = True
        self._cond.release()
        try:
            self._write_batch(batch, background=False)
        finally:
            self._cond.acquire()

    def close(self) -> None:
        """Final drain, then stop the thread and close the handle.

        With ``config.restore_point_tail`` set, a restore point of the whole log is written
        before the handle closes when any event follows the last one (never failing the close:
        a failure is reported as after a flush).

        A session whose read of its stored log found damage (:attr:`Session.log_damage`)
        writes nothing more: its queue is dropped, logged as an error with the count (the
        read that found the damage raised it to the caller), and the handle is closed.

        Raises:
            WriteFailedError: the final drain failed; the writer stays usable for a retry.
        """
        damage = self.session.log_damage
        if damage is not None:
            with self._cond:
                dropped, self._pending = len(self._pending), []
            self.abandon()
            if dropped:
                log.error("session %r: %d queued event(s) were not written: its stored log is "
                          "damaged (%s); nothing more is appended to it", self.session.id,
                          dropped, damage.code)
            return
        self.flush()
        self._stop_thread()
        fold = self._fold
        if fold is not None and self._tail_bound is not None:
            # after the join: no write can move the log under the anchor
            self._maybe_write_restore_point(fold, closing=True)
            self._report_after_commit()
        self.handle.close()

    def abandon(self) -> None:
        """Stop the thread and close the handle without draining (teardown after failure)."""
        self._stop_thread()
        self.handle.close()

    def _stop_thread(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

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
                        if now - self._armed < IDLE_POLL_S:
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
        damage = self.session.log_damage
        if damage is not None:
            # the stored log is not the one the session continues: nothing more is appended
            # to it, the resume's end-seed marker included (docs/rules.md#verified-page-in)
            raise damage
        self.handle.append(fresh)
        self.handle.flush()
        # Durable from here on: nothing below may fail this write, or the batch would be sent
        # again and refused as SEQ_MISMATCH (docs/rules.md#commit-means-committed).
        self.cursor = fresh[-1]["seq"] + 1
        fold = self._fold
        if fold is not None:
            try:
                fold.feed(fresh)
            except Exception as exc:
                # the fold no longer matches the log: no more restore points from this writer
                self._fold = None
                self._after_commit.failed("restore-fold", exc, "no restore point is written "
                                          "until the session is resumed again")
            else:
                self._maybe_write_restore_point(fold)
        self._report_after_commit()

    def _report_after_commit(self) -> None:
        """Hand the post-commit failures of the handle and of this writer to ``report``."""
        own = (take_failures(cast(RecordsAfterCommit, self.handle))
               if self._capabilities.after_commit else [])  # what the capability promises
        failures = [*own, *self._after_commit.take()]
        if not failures or self._report is None:
            return
        for failure in failures:
            try:
                self._report(failure)
            except Exception:  # a reporting observer never fails the durable batch either
                log.exception("session %r: reporting a post-commit failure (%s) failed",
                              self.session.id, failure.step)

    def _maybe_write_restore_point(self, fold: RestoreFold, *, closing: bool = False) -> None:
        """Write a restore point of the durable prefix when one is due.

        Due after ``RESTORE_POINT_EVERY_EVENTS`` events or ``RESTORE_POINT_EVERY_BYTES`` bytes,
        after ``restore_point_tail`` events when set, and when ``closing`` after any event.
        Never fails the flush: the batch is durable and the restore point is only derived, so a
        failure to write one is logged (WARNING) and the next due flush tries again.
        """
        if fold.event_count != self.cursor or not self._capabilities.restore_points:
            return  # events before the fold's start are not all durable yet
        handle = cast(rp.KeepsRestorePoints, self.handle)  # what the capability promises
        count, size = self._last_restore_point
        every = rp.RESTORE_POINT_EVERY_EVENTS
        if self._tail_bound is not None:
            every = 1 if closing else min(every, self._tail_bound)
        if self.cursor - count < every \
                and handle.durable_bytes - size < rp.RESTORE_POINT_EVERY_BYTES:
            return
        try:
            anchor = handle.restore_point_anchor()
            if anchor is None or anchor.event_count != self.cursor:
                return
            data = rp.encode_restore_point(rp.RestorePoint(anchor=anchor, state=fold.state()))
            handle.write_restore_point(data)
        except Exception as exc:  # derived data: a failure never fails the durable batch
            self._after_commit.failed("restore-point", exc, "resumes read the whole log until "
                                      "the next due flush writes one")
            return
        self._last_restore_point = (anchor.event_count, anchor.byte_offset)

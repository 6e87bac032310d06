"""Work after a durable commit: contained, logged, reported, repaired later.

Once a batch is durable (a JSONL fsync, a SQLite or PostgreSQL ``COMMIT``) nothing that follows
may fail it: not the integrity seal, not the listing journal, not the restore point, not the
restore fold. A failing step would make ``flush`` raise for events that are stored, the
write-behind would send the batch again, and every later write would then be refused as
``SEQ_MISMATCH`` (the writer wedges). So every such step runs through :class:`AfterCommit`:

* a failure of any kind (``Exception``, not only ``OSError``) is caught and logged (WARNING);
* it is kept as an :class:`AfterCommitFailure` until the session's writer takes it and reports
  it to the store's observers (``on_after_commit_failure(session, failure)``);
* the step's owner leaves itself in a state the next flush repairs (the seal is rewritten
  whole, the listing reads the log in full, the next due flush writes a restore point).

Rule: ``docs/rules.md#commit-means-committed``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, Protocol, runtime_checkable

log = logging.getLogger("dsh.persistence")

Step = Literal["seal", "listing", "restore-point", "restore-fold", "anchor", "search"]
"""The post-commit steps (see ``docs/rules.md#commit-means-committed``)."""

MAX_KEPT: Final = 64
"""Failures kept per handle until its writer takes them; older ones are only logged."""


@dataclass(frozen=True, slots=True)
class AfterCommitFailure:
    """One post-commit step that failed after a batch was durable.

    Attributes:
        session_id: The session whose batch was committed.
        step: Which step failed (``seal``, ``listing``, ``restore-point``, ``restore-fold``,
            ``anchor``).
        error: The exception the step raised (the batch stays committed).
        repair: What repairs it, in words (e.g. "the next flush rewrites the seal").
    """

    session_id: str
    step: Step
    error: BaseException
    repair: str


class AfterCommit:
    """Runs a handle's post-commit steps; a failure is logged and kept, never raised.

    Thread-safe: the writer thread records, the flush barrier's thread may take.
    """

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._failures: list[AfterCommitFailure] = []
        self._lock = threading.Lock()

    def failed(self, step: Step, error: BaseException, repair: str) -> None:
        """Record that ``step`` failed with ``error`` after a durable commit (logged)."""
        log.warning("session %r: the batch is durable, but its %s step failed afterwards (%r); "
                    "%s", self.session_id, step, error, repair)
        with self._lock:
            if len(self._failures) < MAX_KEPT:
                self._failures.append(AfterCommitFailure(self.session_id, step, error, repair))

    def run(self, step: Step, fn: Callable[[], object], repair: str | Callable[[], str],
            on_failure: Callable[[], None] | None = None) -> bool:
        """Run ``fn``; on any ``Exception`` call ``on_failure``, record it and return False.

        ``repair`` is the repair in words, or a function giving it once ``fn`` failed and
        ``on_failure`` ran (for a step whose repair depends on how it failed).
        """
        try:
            fn()
        except Exception as exc:  # the batch is durable: nothing here may fail it
            if on_failure is not None:
                try:
                    on_failure()
                except Exception as inner:  # the repair plan failed too: log it, go on
                    log.warning("session %r: setting up the repair of its %s step failed (%r)",
                                self.session_id, step, inner)
            self.failed(step, exc, repair if isinstance(repair, str) else repair())
            return False
        return True

    def take(self) -> list[AfterCommitFailure]:
        """Return and forget the failures recorded since the last call."""
        with self._lock:
            taken, self._failures = self._failures, []
        return taken


@runtime_checkable
class RecordsAfterCommit(Protocol):
    """A write handle that records its own post-commit failures (``Capabilities.after_commit``).

    Its steps after a durable batch (seal, listing journal, SQLite anchor) never fail the
    batch; each failure is kept in ``after_commit`` for the writer to report.
    """

    @property
    def after_commit(self) -> AfterCommit:
        """The handle's record of post-commit failures."""
        ...


def take_failures(handle: RecordsAfterCommit) -> list[AfterCommitFailure]:
    """The post-commit failures ``handle`` recorded since the last call."""
    return handle.after_commit.take()

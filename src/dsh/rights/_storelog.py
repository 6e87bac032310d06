"""The store log and the trash: what a store deleted, hid or gave back, and when.

Rule: docs/forgetting.md#the-store-log, docs/forgetting.md#deletion-with-a-way-back.

The store log is one reserved session of the store (``STORE_LOG_ID``), so it has what every
log has: one writer at a time, one atomic batch per operation, seals. Its events are ignorable
records, each naming sessions by id and never holding their content:

* ``store/trashed {sessions, reason?, by?, policy?}``: moved to the trash (hidden from ``ls``);
* ``store/restored {sessions, by?}``: back from the trash or the archive;
* ``store/archived {sessions, policy}``: hidden from ``ls`` until new activity, kept;
* ``store/erased {sessions, subjects, purge, receipt, events, whereKeys?, reason?, by?,
  policies?}``: erased (``purge``: by ``dsh rm --purge`` or a retention policy, whose scopes
  ``policies`` maps to the ids), ``receipt`` the SHA-256 of the receipt, ``events`` how many
  events were tombstoned;
* ``store/retention {policy}``: a retention policy set (or cleared) for a scope.

:func:`store_log` folds them into a :class:`StoreLog`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time as _time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from dsh._errors import SessionExistsError
from dsh.persistence import STORE_LOG_ID
from dsh.rights._held import HasPersistence, facade, held
from dsh.session import Session

if TYPE_CHECKING:
    from dsh.persistence import Persistence
    from dsh.session import Clock

TRASHED: Final = "store/trashed"
"""Store-log record: sessions moved to the trash (docs/events.md#store-log-records)."""
RESTORED: Final = "store/restored"
"""Store-log record: sessions given back from the trash or the archive."""
ARCHIVED: Final = "store/archived"
"""Store-log record: sessions archived by a retention policy."""
ERASED: Final = "store/erased"
"""Store-log record: sessions erased (by ``dsh erase``, ``dsh rm --purge`` or a policy)."""
RETENTION: Final = "store/retention"
"""Store-log record: a retention policy set or cleared."""

RECORD_TYPES: Final = frozenset({TRASHED, RESTORED, ARCHIVED, ERASED, RETENTION})


def _now(clock: Clock | None) -> int:
    return clock() if clock is not None else int(_time.time() * 1000)


@dataclass(frozen=True, slots=True)
class TrashEntry:
    """One session in the trash.

    Attributes:
        session_id: The session.
        trashed_ms: Epoch ms of the ``store/trashed`` record that put it there (the latest).
        reason: Why, or None.
        by: Who, or None.
        policy: The retention policy's scope (``{}``: the store's) when a policy trashed it,
            else None.
        purged_ms: Epoch ms of its purge (its content is erased), else None.
    """

    session_id: str
    trashed_ms: int
    reason: str | None = None
    by: str | None = None
    policy: Mapping[str, str] | None = None
    purged_ms: int | None = None


@dataclass(frozen=True, slots=True)
class StoreLog:
    """The store log folded: the trash, the archive, the policies and every deletion record.

    Attributes:
        trash: Sessions in the trash, by id (purged ones included, marked).
        archived: Archived sessions, by id: epoch ms of the archiving.
        policies: The retention policies in force, as stored (``store/retention`` data), in the
            order they were set; a cleared scope is absent.
        restored: Sessions given back by ``store/restored``, by id: epoch ms of the latest
            (retention counts it as activity, docs/forgetting.md#retention).
        records: Every store-log record as ``{seq, time, type, ...data}``, oldest first.
    """

    trash: Mapping[str, TrashEntry] = field(default_factory=dict)
    archived: Mapping[str, int] = field(default_factory=dict)
    policies: tuple[Mapping[str, Any], ...] = ()
    records: tuple[Mapping[str, Any], ...] = ()
    restored: Mapping[str, int] = field(default_factory=dict)

    def deletions(self) -> list[Mapping[str, Any]]:
        """The records of what was erased or purged (``store/erased``), oldest first."""
        return [r for r in self.records if r["type"] == ERASED]


def policy_scope(where: Mapping[str, str] | None) -> str:
    """A scope's name: ``store`` for ``{}``, else ``KEY=VALUE`` pairs sorted, comma-joined."""
    return ",".join(f"{k}={v}" for k, v in sorted((where or {}).items())) or "store"


def fold(events: Iterable[Mapping[str, Any]]) -> StoreLog:
    """Fold store-log events into a :class:`StoreLog` (other event types are skipped)."""
    trash: dict[str, TrashEntry] = {}
    archived: dict[str, int] = {}
    policies: dict[str, Mapping[str, Any]] = {}
    restored: dict[str, int] = {}
    records: list[Mapping[str, Any]] = []
    for event in events:
        kind = event["type"]
        if kind not in RECORD_TYPES:
            continue
        data: Mapping[str, Any] = event["data"]
        records.append({"seq": event["seq"], "time": event["time"], "type": kind, **data})
        ids = [str(s) for s in data.get("sessions") or ()]
        if kind == TRASHED:
            for sid in ids:
                if sid in trash and trash[sid].purged_ms is not None:
                    continue
                archived.pop(sid, None)
                trash[sid] = TrashEntry(sid, event["time"], data.get("reason"),
                                        data.get("by"), data.get("policy"))
        elif kind == RESTORED:
            for sid in ids:
                if sid not in trash or trash[sid].purged_ms is None:
                    trash.pop(sid, None)
                    restored[sid] = event["time"]
                archived.pop(sid, None)
        elif kind == ARCHIVED:
            for sid in ids:
                if sid not in trash:
                    archived[sid] = event["time"]
        elif kind == ERASED and data.get("purge"):
            for sid in ids:
                old = trash.get(sid)
                archived.pop(sid, None)
                trash[sid] = TrashEntry(
                    sid, old.trashed_ms if old is not None else event["time"],
                    old.reason if old is not None else data.get("reason"),
                    old.by if old is not None else data.get("by"),
                    old.policy if old is not None else None, event["time"])
        elif kind == RETENTION:
            policy: Mapping[str, Any] = data.get("policy") or {}
            scope = policy_scope(policy.get("where"))
            policies.pop(scope, None)
            if not policy.get("cleared"):
                policies[scope] = policy
    return StoreLog(trash, archived, tuple(policies.values()), tuple(records), restored)


def store_log(store: Persistence | HasPersistence) -> StoreLog:
    """Read and fold the store log (an empty :class:`StoreLog` when nothing was recorded).

    Raises:
        LogCorruptError: the store log cannot be read (its seal names the damage).

    Rule: docs/forgetting.md#the-store-log.
    """
    persistence = facade(store)
    if not persistence.exists(STORE_LOG_ID):
        return StoreLog()
    return fold(persistence.read(STORE_LOG_ID).stored_events)


def append_records(store: Persistence | HasPersistence,
                   records: Sequence[tuple[str, Mapping[str, Any]]], *,
                   clock: Clock | None = None) -> StoreLog:
    """Append ``(type, data)`` records to the store log as one batch; return the new fold.

    The store log is created on first use. Its write ownership is taken like any session's
    (another process recording at the same time waits its turn or gets
    ``SessionBusyError``).

    Rule: docs/forgetting.md#the-store-log.
    """
    persistence = facade(store)
    if not persistence.exists(STORE_LOG_ID):
        _create(persistence, records, clock)
    else:
        with held(persistence, STORE_LOG_ID, clock=clock) as hold:
            for kind, data in records:
                hold.session.append(kind, data, ignorable=True)
            hold.commit()
    return store_log(persistence)


def _create(persistence: Persistence, records: Sequence[tuple[str, Mapping[str, Any]]],
            clock: Clock | None) -> None:
    header = {"version": 0, "id": STORE_LOG_ID, "createdAt": _now(clock)}
    with contextlib.suppress(SessionExistsError):  # created by another process: continue it
        persistence.create(header)
    with persistence.open(STORE_LOG_ID, "write") as handle:
        stored = handle.read(0)
        if stored.events:  # created by another process meanwhile: continue its log
            session = Session.restore(STORE_LOG_ID, stored.events, stored.header, clock=clock)
            first = len(stored.events)
        else:
            session = Session(STORE_LOG_ID, header=header, clock=clock)
            first = 0
        for kind, data in records:
            session.append(kind, data, ignorable=True)
        handle.append(tuple(session.events[first:]))
        handle.flush()


def receipt_digest(receipt: Mapping[str, Any]) -> str:
    """Hex SHA-256 of a receipt's JSON (keys sorted, no spaces): how the store log names it."""
    text = json.dumps(receipt, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()

"""Retention as data: policies kept in the store log, and ``gc`` that explains or applies them.

Rule: docs/forgetting.md#retention. A policy has a scope (``where``: header values every
session it covers has; ``{}`` is the whole store) and says keep, or archive / trash after N
days without activity, and purge after N days in the trash. ``gc`` reads each session's
header and last activity (``Persistence.list_activity``) and the store log, picks each
session's policy (the matching scope with the most keys; among equals the one set last) and
lists what it would do and why; ``apply=True`` does it: archive and trash as one store-log
record per policy, purges as :func:`dsh.rights.erase` plus a ``store/erased {purge: true,
policies}`` record.

Nothing is deleted without a stored policy: a store with no policy keeps everything.
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

from dsh._errors import ConfigError
from dsh.json import is_safe_int
from dsh.rights._erase import (
    ErasureReceipt,
    erase_sessions,
    erasure_record,
    header_matches,
    header_value,
    select,
)
from dsh.rights._held import HasPersistence, facade
from dsh.rights._storelog import (
    ARCHIVED,
    ERASED,
    RETENTION,
    TRASHED,
    append_records,
    policy_scope,
    store_log,
)

if TYPE_CHECKING:
    from dsh.persistence import Persistence
    from dsh.session import Clock

DAY_MS: Final = 86_400_000
"""Milliseconds in a retention day (24 h; no calendar, no time zone)."""

GcAction = Literal["archive", "trash", "purge"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionPolicy:
    """What a store keeps, for the sessions of one scope.

    Attributes:
        where: Header values every covered session has (``{"cwd": "/srv/app"}``,
            ``{"tenant": "acme"}``); ``{}`` covers the whole store.
        keep: Keep every covered session forever (the other fields must be None).
        archive_after_days: Archive (hide from ``dsh ls``, keep) a session this many days
            after its last activity.
        trash_after_days: Move it to the trash this many days after its last activity.
        purge_after_days: Purge (erase) a covered session this many days after it went to the
            trash, whoever put it there.

    Raises:
        ConfigError: a day count that is not a non-negative integer, ``keep`` with a day
            count, or a policy that says nothing (code ``BAD_POLICY``).
    """

    where: Mapping[str, str] = field(default_factory=dict)
    keep: bool = False
    archive_after_days: int | None = None
    trash_after_days: int | None = None
    purge_after_days: int | None = None

    def __post_init__(self) -> None:
        days = (self.archive_after_days, self.trash_after_days, self.purge_after_days)
        for value in days:
            if value is not None and (not is_safe_int(value) or value < 0):
                raise ConfigError(f"a retention day count must be an integer >= 0, got "
                                  f"{value!r}", code="BAD_POLICY")
        if self.keep and any(d is not None for d in days):
            raise ConfigError("a retention policy that keeps cannot also archive, trash or "
                              "purge", code="BAD_POLICY")
        if not self.keep and all(d is None for d in days):
            raise ConfigError("a retention policy must keep, or archive, trash or purge after "
                              "some days", code="BAD_POLICY")
        for key, wanted in self.where.items():
            if type(key) is not str or type(wanted) is not str:
                raise ConfigError(f"a retention scope maps strings to strings, got "
                                  f"{key!r}={wanted!r}", code="BAD_POLICY")

    @property
    def scope(self) -> str:
        """``store``, or the scope's ``KEY=VALUE`` pairs sorted and comma-joined."""
        return policy_scope(self.where)

    def to_json(self) -> dict[str, Any]:
        """``{"where", "keep"?, "archiveAfterDays"?, "trashAfterDays"?, "purgeAfterDays"?}``."""
        out: dict[str, Any] = {"where": dict(self.where)}
        if self.keep:
            out["keep"] = True
        for key, value in (("archiveAfterDays", self.archive_after_days),
                           ("trashAfterDays", self.trash_after_days),
                           ("purgeAfterDays", self.purge_after_days)):
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RetentionPolicy:
        """The policy a ``store/retention`` record holds (see :meth:`to_json`)."""
        return cls(where=dict(data.get("where") or {}), keep=bool(data.get("keep")),
                   archive_after_days=data.get("archiveAfterDays"),
                   trash_after_days=data.get("trashAfterDays"),
                   purge_after_days=data.get("purgeAfterDays"))


def retention_policies(store: Persistence | HasPersistence) -> tuple[RetentionPolicy, ...]:
    """The policies in force, in the order they were set (docs/forgetting.md#retention)."""
    return tuple(RetentionPolicy.from_json(p) for p in store_log(store).policies)


def set_retention(store: Persistence | HasPersistence, policy: RetentionPolicy, *,
                  by: str | None = None, clock: Clock | None = None) -> int:
    """Store ``policy`` for its scope (replacing the scope's previous one) in the store log.

    Returns:
        How many stored sessions the scope covers now (a scope is kept even when none does:
        a key no header has is most likely a typo, which the CLI says).

    Rule: docs/forgetting.md#retention.
    """
    data: dict[str, Any] = {"policy": policy.to_json()}
    if by is not None:
        data["by"] = by
    append_records(store, [(RETENTION, data)], clock=clock)
    return len(select(store, (), where=policy.where)) if policy.where else \
        len(facade(store).list_headers())


def clear_retention(store: Persistence | HasPersistence, where: Mapping[str, str], *,
                    by: str | None = None, clock: Clock | None = None) -> bool:
    """Remove the policy of the scope ``where``; False (nothing recorded) when it had none."""
    scope = policy_scope(where)
    if all(policy_scope(p.get("where")) != scope for p in store_log(store).policies):
        return False
    data: dict[str, Any] = {"policy": {"where": dict(where), "cleared": True}}
    if by is not None:
        data["by"] = by
    append_records(store, [(RETENTION, data)], clock=clock)
    return True


@dataclass(frozen=True, slots=True)
class GcItem:
    """One thing ``gc`` would do (or did).

    Attributes:
        session_id: The session.
        action: ``archive``, ``trash`` or ``purge``.
        scope: The policy's scope name (``store`` or ``KEY=VALUE,...``).
        why: One sentence: the age, and the policy's rule it passed.
    """

    session_id: str
    action: GcAction
    scope: str
    why: str

    def to_json(self) -> dict[str, str]:
        """``{"id", "action", "policy", "why"}``."""
        return {"id": self.session_id, "action": self.action, "policy": self.scope,
                "why": self.why}


@dataclass(frozen=True, slots=True)
class GcReport:
    """What ``gc`` found, and did when applied.

    Attributes:
        now_ms: The epoch ms ages were measured at.
        items: One per action, by session id.
        examined: Sessions looked at (every listed, archived and trashed one).
        kept: Sessions left as they are.
        unreadable: Ids whose log could not be read: never acted on.
        applied: Whether the actions were done.
        receipt: The purges' erasure receipt (None when nothing was purged or not applied).
    """

    now_ms: int
    items: tuple[GcItem, ...]
    examined: int
    kept: int
    unreadable: tuple[str, ...] = ()
    applied: bool = False
    receipt: ErasureReceipt | None = None

    def count(self, action: GcAction) -> int:
        """How many items have ``action``."""
        return sum(1 for i in self.items if i.action == action)

    def to_json(self) -> dict[str, Any]:
        """``{"now", "applied", "examined", "kept", "unreadable", "items", "receipt"}``."""
        return {"now": self.now_ms, "applied": self.applied, "examined": self.examined,
                "kept": self.kept, "unreadable": list(self.unreadable),
                "items": [i.to_json() for i in self.items],
                "receipt": self.receipt.to_json() if self.receipt is not None else None}


def _days(ms: int) -> str:
    days = ms / DAY_MS
    return f"{days:.1f} days" if days < 10 else f"{int(days)} days"


def _policy_days(days: int) -> str:
    """A policy's day count as a person writes it: ``1 day``, ``30 days``."""
    return "1 day" if days == 1 else f"{days} days"


def pick_policy(policies: tuple[RetentionPolicy, ...], header: Mapping[str, Any]
                ) -> RetentionPolicy | None:
    """The policy covering ``header``: the matching scope with the most keys, then the latest."""
    best: RetentionPolicy | None = None
    for policy in policies:
        where = policy.where
        if where and not all(header_matches(header_value(header, k), v)
                             for k, v in where.items()):
            continue
        if best is None or len(where) >= len(best.where):
            best = policy
    return best


def _by_id(pair: tuple[Mapping[str, Any], int]) -> str:
    return str(pair[0]["id"])


ProgressFn = Callable[[str, int, int], None]
"""``progress(phase, done, total)``: ``phase`` is ``reading``, ``recording`` or ``purging``."""


def gc(store: Persistence | HasPersistence, *, apply: bool = False,
       now_ms: int | None = None, by: str | None = None, clock: Clock | None = None,
       progress: ProgressFn | None = None) -> GcReport:
    """Explain what the retention policies ask for now, or (``apply=True``) do it.

    For each stored session, with its policy (:func:`pick_policy`; none: kept): ``keep``
    keeps it; its last activity is its last event's time or its latest ``dsh restore``,
    whichever is later (a restore is activity: the next run does not take it back); a listed
    or archived session whose last activity is ``trash_after_days`` old goes to the trash,
    else one ``archive_after_days`` old and not archived yet is archived; a trashed session
    (not purged) ``purge_after_days`` after its trashing is purged.

    Args:
        store: A ``dsh.Store`` (or its ``persistence`` facade).
        apply: Do it; otherwise nothing is written or locked.
        now_ms: The time ages are measured at (default: ``clock`` or the wall clock).
        by: Who, kept in the records.
        clock: Epoch-ms clock for the records.
        progress: Called as work advances (see :data:`ProgressFn`).

    Returns:
        GcReport: the items, one sentence of why each, and the purges' receipt.

    Raises:
        SessionBusyError: a session to purge, or the store log, is being written; what was
            done before stays done, and running it again completes the rest.
        PersistenceError: the store cannot be listed.

    Rule: docs/forgetting.md#retention.
    """
    persistence = facade(store)
    now = now_ms if now_ms is not None else (
        clock() if clock is not None else int(_time.time() * 1000))
    state = store_log(persistence)
    policies = tuple(RetentionPolicy.from_json(p) for p in state.policies)
    entries, errors = persistence.list_activity()
    unreadable = tuple(sorted(str(e.where.get("session_id")) for e in errors))
    if progress is not None:
        progress("reading", 0, len(entries))
    items: list[GcItem] = []
    scope_of = {id(p): p.scope for p in policies}  # computed once, not per session
    for done, (header, last_activity_ms) in enumerate(sorted(entries, key=_by_id), 1):
        sid = str(header["id"])
        policy = pick_policy(policies, header) if policies else None
        if progress is not None and done % 1000 == 0:
            progress("reading", done, len(entries))
        if policy is None or policy.keep:
            continue
        scope = scope_of[id(policy)]
        trashed = state.trash.get(sid)
        if trashed is not None:
            after = policy.purge_after_days
            if trashed.purged_ms is None and after is not None and \
                    now - trashed.trashed_ms >= after * DAY_MS:
                items.append(GcItem(sid, "purge", scope,
                                    f"in the trash for {_days(now - trashed.trashed_ms)}; "
                                    f"policy {scope} purges after {_policy_days(after)}"))
            continue
        # A restore is activity: without it the next run would trash (or archive) again
        # what the user just gave back; so is a fork's creation, as dsh ls shows it (its
        # events are inherited, their times the parent's) (docs/forgetting.md#retention).
        created = header.get("createdAt")
        last_activity_ms = max(last_activity_ms, state.restored.get(sid, last_activity_ms),
                               created if type(created) is int else last_activity_ms)
        idle = now - last_activity_ms
        if policy.trash_after_days is not None and idle >= policy.trash_after_days * DAY_MS:
            items.append(GcItem(sid, "trash", scope,
                                f"no activity for {_days(idle)}; policy {scope} "
                                f"trashes after {_policy_days(policy.trash_after_days)}"))
            continue
        since = state.archived.get(sid)
        archived = since is not None and last_activity_ms <= since
        if not archived and policy.archive_after_days is not None and \
                idle >= policy.archive_after_days * DAY_MS:
            items.append(GcItem(sid, "archive", scope,
                                f"no activity for {_days(idle)}; policy {scope} "
                                f"archives after {_policy_days(policy.archive_after_days)}"))
    if progress is not None:
        progress("reading", len(entries), len(entries))
    report = GcReport(now, tuple(items), len(entries), len(entries) - len(items), unreadable)
    if not apply or not items:
        return GcReport(report.now_ms, report.items, report.examined, report.kept,
                        report.unreadable, apply)
    return _apply(persistence, report, by, clock, progress)


def _apply(persistence: Persistence, report: GcReport, by: str | None, clock: Clock | None,
           progress: ProgressFn | None) -> GcReport:
    records: list[tuple[str, Mapping[str, Any]]] = []
    scopes = {i.scope: i for i in report.items}
    wheres = {p.scope: dict(p.where) for p in retention_policies(persistence)}
    for action, kind in (("archive", ARCHIVED), ("trash", TRASHED)):
        for scope in sorted(scopes):
            ids = [i.session_id for i in report.items if i.action == action and i.scope == scope]
            if ids:
                data: dict[str, Any] = {"sessions": ids, "policy": wheres.get(scope, {})}
                if kind == TRASHED:
                    data["reason"] = f"retention policy {scope}"
                if by is not None:
                    data["by"] = by
                records.append((kind, data))
    if records:
        if progress is not None:
            progress("recording", 0, 1)
        append_records(persistence, records, clock=clock)
    purges = [i for i in report.items if i.action == "purge"]
    receipt: ErasureReceipt | None = None
    if purges:
        done_count = 0

        def step(_sid: str) -> None:
            nonlocal done_count
            done_count += 1
            if progress is not None:
                progress("purging", done_count, len(purges))

        if progress is not None:
            progress("purging", 0, len(purges))
        still = store_log(persistence).trash  # a session restored meanwhile is left alone
        todo = [i for i in purges if i.session_id in still
                and still[i.session_id].purged_ms is None]
        if todo:
            scopes_of: dict[str, list[str]] = {}
            for item in todo:
                scopes_of.setdefault(item.scope, []).append(item.session_id)
            receipt = erase_sessions(persistence, [i.session_id for i in todo],
                                     reason="retention policy", by=by, clock=clock,
                                     on_session=step)
            append_records(persistence, [(ERASED, erasure_record(
                receipt, purge=True, policies=scopes_of))], clock=clock)
    return GcReport(report.now_ms, report.items, report.examined, report.kept,
                    report.unreadable, True, receipt)


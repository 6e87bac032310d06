"""Erasure: remove sessions' content from every place it lives in the store, with a receipt.

Rule: docs/forgetting.md#erasure. ``erase`` takes sessions by id or by header metadata
(``where``), then, one session at a time under its write ownership:

* every event of an erased session is tombstoned whole (as ``redact --seq``), in one
  ``redaction/applied {mode: "erasure", erased}`` rewrite;
* every fork descendant (``parentSession``, transitively) gets the copies it holds tombstoned:
  the inherited prefix events that are erased in its parent, and every event derived from
  them through the log's lineage: an event citing one in ``sourceEventSeqs`` (a compaction
  checkpoint, a restoring copy, a closer), a ``compaction/summary`` whose ``shadowedSeqs`` holds
  one, and the summary a tombstoned checkpoint cites;
* beside the logs: an erased session's saved cuts are deleted, the listing index rebuilt; each
  backend's rewrite scrubs what it keeps (seals, restore points, SQLite WAL and free pages).

The receipt lists every session, event, commitment (with its salt), file, table and step
touched; :func:`verify_receipt` checks it against the store later.
"""

from __future__ import annotations

import os
import time as _time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

from dsh._errors import DshError, RightsError, SessionNotFoundError
from dsh._verify import event_digest
from dsh.persistence import Scrubs
from dsh.rights._forks import fork_children
from dsh.rights._held import HasPersistence, facade, held
from dsh.rights._redact import (
    RedactedEvent,
    after_rewrite,
    commit_tombstones,
    tombstone_whole,
)
from dsh.rights._storelog import ERASED, append_records, receipt_digest, store_log
from dsh.session import REDACTION_APPLIED

if TYPE_CHECKING:
    from dsh.persistence import Persistence
    from dsh.session import Clock, Event

RECEIPT_KIND: Final = "dsh-erasure"
"""``kind`` of an erasure receipt."""


@dataclass(frozen=True, slots=True)
class ErasedSession:
    """What an erasure did to one session.

    Attributes:
        session_id: The session.
        role: ``erased`` (named, or matched by ``where``) or ``descendant`` (a fork below one).
        items: Its tombstoned events, with commitments and salts.
        record_seq: Seq of its ``redaction/applied`` record, or None when nothing changed.
        touched: The files, tables and steps touched for it.
    """

    session_id: str
    role: str
    items: tuple[RedactedEvent, ...]
    record_seq: int | None
    touched: tuple[Mapping[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        """``{"id", "role", "recordSeq", "items", "touched"}``."""
        return {"id": self.session_id, "role": self.role, "recordSeq": self.record_seq,
                "items": [i.to_json() for i in self.items],
                "touched": [dict(t) for t in self.touched]}


@dataclass(frozen=True, slots=True)
class ErasureReceipt:
    """The receipt of one :func:`erase`.

    Attributes:
        url: The store.
        time: Epoch ms when the erasure started.
        subjects: The sessions erased (named or matched).
        where: The metadata filter, or None.
        sessions: Every session touched, subjects first, then descendants.
        reason: Why, or None.
        by: Who, or None.
    """

    url: str
    time: int
    subjects: tuple[str, ...]
    where: Mapping[str, str] | None
    sessions: tuple[ErasedSession, ...]
    reason: str | None = None
    by: str | None = None

    def to_json(self) -> dict[str, Any]:
        """What ``dsh erase --receipt`` writes and ``verify --receipt`` reads.

        ``{"kind": "dsh-erasure", "store", "time", "subjects", "where", "reason", "by",
        "sessions"}``.
        """
        return {"kind": RECEIPT_KIND, "store": self.url, "time": self.time,
                "subjects": list(self.subjects),
                "where": dict(self.where) if self.where is not None else None,
                "reason": self.reason, "by": self.by,
                "sessions": [s.to_json() for s in self.sessions]}


def select(store: Persistence | HasPersistence, session_ids: Iterable[str] = (),
           where: Mapping[str, str] | None = None) -> list[str]:
    """The stored session ids named, plus those whose header has every ``where`` value.

    A header value matches when it equals the string, or its JSON spelling (numbers,
    booleans). Raises ``SessionNotFoundError`` for a named id that is not stored.
    """
    persistence = facade(store)
    headers = {str(h["id"]): h for h in persistence.list_headers()}
    chosen: list[str] = []
    for sid in session_ids:
        if sid not in headers:
            raise SessionNotFoundError(f"session {sid!r} is not stored in {persistence.url}",
                                       session_id=sid)
        if sid not in chosen:
            chosen.append(sid)
    if where:
        for sid, header in sorted(headers.items()):
            if sid not in chosen and all(header_matches(header_value(header, k), v)
                                         for k, v in where.items()):
                chosen.append(sid)
    return chosen


def header_value(header: Mapping[str, Any], key: str) -> object:
    """The value ``--where KEY=`` looks at: a header field, else the header's ``metadata[KEY]``.

    ``metadata.KEY`` names a metadata key that shadows a field (docs/formats.md#header-metadata).
    """
    if key in header and key != "metadata":
        return header[key]
    metadata = header.get("metadata")
    return metadata.get(key.removeprefix("metadata.")) if isinstance(metadata, Mapping) else None


def header_matches(value: object, wanted: str) -> bool:
    """Whether a header value matches a ``--where`` string (equal, or its JSON spelling)."""
    if value is None:
        return False
    if isinstance(value, str):
        return value == wanted
    if isinstance(value, bool):
        return wanted == ("true" if value else "false")
    return isinstance(value, int | float) and str(value) == wanted


def _derived(events: Sequence[Event], erased: set[int]) -> set[int]:
    """``erased`` plus every event derived from one through the log's lineage."""
    out = set(erased)
    for event in events:
        seq = event["seq"]
        if seq in out:
            continue
        cited: Sequence[Any] = event.get("sourceEventSeqs") or ()
        data = event.get("data")
        shadowed = data.get("shadowedSeqs") if isinstance(data, Mapping) else None
        if any(s in out for s in cited) or (isinstance(shadowed, Sequence) and not isinstance(
                shadowed, str) and any(s in out for s in shadowed)):
            out.add(seq)
            if len(cited) > 1 and event["type"] == "user/message" and type(cited[1]) is int:
                # a checkpoint's compaction/summary (docs/rules.md#the-checkpoint-message)
                out.add(cited[1])
    return out


def erase(store: Persistence | HasPersistence, session_ids: Iterable[str] = (), *,
          where: Mapping[str, str] | None = None, reason: str | None = None,
          by: str | None = None, clock: Clock | None = None,
          stop: Callable[[], bool] | None = None) -> ErasureReceipt:
    """Erase sessions' content everywhere in the store; return the receipt.

    The erasure is recorded in the store log (``store/erased``: the ids, the event count and
    the receipt's SHA-256, never content; docs/forgetting.md#the-store-log).

    Args:
        store: A ``dsh.Store`` (or its ``persistence`` facade).
        session_ids: Sessions to erase.
        where: Header metadata every erased session must have (``{"tenant": "acme"}``),
            adding the sessions it matches.
        reason: Why, kept in each record and the receipt.
        by: Who.
        clock: Epoch-ms clock.
        stop: Asked before each session (``dsh erase`` on Ctrl-C): once it returns True the
            sessions not begun are left as they were, and the receipt and the store-log
            record list those done; the same call again erases the rest.

    Returns:
        ErasureReceipt: every session, event (commitment and salt), file, table and step
        touched. Sessions already erased are tombstoned again only where content remains.

    Raises:
        RightsError: ``NOTHING_SELECTED`` (no id and no match), ``UNSUPPORTED`` (``memory:``),
            ``TOMBSTONE_INVALID``; sessions done before the failure stay erased (run again).
        SessionNotFoundError, SessionBusyError: a named session is not stored; a session is
            being written (nothing of it was changed).

    Rule: docs/forgetting.md#erasure.
    """
    receipt = erase_sessions(store, session_ids, where=where, reason=reason, by=by,
                             clock=clock, stop=stop)
    append_records(store, [(ERASED, erasure_record(receipt, purge=False))], clock=clock)
    return receipt


def erasure_record(receipt: ErasureReceipt, *, purge: bool,
                   policies: Mapping[str, list[str]] | None = None) -> dict[str, Any]:
    """The ``store/erased`` data for an erasure's receipt: ids, counts, digest; no content."""
    data: dict[str, Any] = {
        "sessions": [s.session_id for s in receipt.sessions],
        "subjects": list(receipt.subjects), "purge": purge,
        "receipt": receipt_digest(receipt.to_json()),
        "events": sum(len(s.items) for s in receipt.sessions)}
    if receipt.where is not None:
        data["whereKeys"] = sorted(receipt.where)
    if receipt.reason is not None:
        data["reason"] = receipt.reason
    if receipt.by is not None:
        data["by"] = receipt.by
    if policies is not None:
        data["policies"] = {scope: list(ids) for scope, ids in policies.items()}
    return data




def erase_sessions(store: Persistence | HasPersistence, session_ids: Iterable[str] = (), *,
                   where: Mapping[str, str] | None = None, reason: str | None = None,
                   by: str | None = None, clock: Clock | None = None,
                   on_session: Callable[[str], None] | None = None,
                   stop: Callable[[], bool] | None = None) -> ErasureReceipt:
    """:func:`erase` without its store-log record; ``on_session(id)`` after each session."""
    persistence = facade(store)
    started = clock() if clock is not None else int(_time.time() * 1000)
    subjects = select(persistence, session_ids, where)
    if not subjects:
        scope = " ".join(f"{k}={v}" for k, v in sorted((where or {}).items()))
        raise RightsError("nothing to erase: " + (
            f"no session named, and none matches --where {scope}" if scope
            else "name sessions (ID...) or select them with --where KEY=VALUE"),
            code="NOTHING_SELECTED")
    children = fork_children(persistence)
    queue: list[tuple[str, set[int] | None]] = [(sid, None) for sid in subjects]
    done: list[ErasedSession] = []
    seen: set[str] = set()
    extra: dict[str, Any] = {"mode": "erasure", "erased": list(subjects)}
    if reason is not None:
        extra["reason"] = reason
    if by is not None:
        extra["by"] = by
    while queue:
        if stop is not None and stop():
            break  # the rest as it was; the receipt lists what is done (run again for the rest)
        sid, inherited = queue.pop(0)
        if sid in seen:
            continue
        seen.add(sid)
        subject = inherited is None
        with held(persistence, sid, clock=clock) as hold:
            events = list(hold.session.events)[:hold.stored]
            erased = set(range(len(events))) if inherited is None else _derived(events,
                                                                                inherited)
            plan = {}
            for seq in sorted(erased):
                if 0 <= seq < len(events):
                    tomb, count = tombstone_whole(events[seq])
                    if count:
                        plan[seq] = (tomb, count)
            items: list[RedactedEvent] = []
            record_seq: int | None = None
            touched: list[dict[str, Any]] = []
            if plan:
                items, record, touched = commit_tombstones(hold, plan, extra, persistence.url,
                                                           scrub=False)
                record_seq = record["seq"]
            else:  # nothing left: finish a scrub a crash may have cut short (SQLite)
                touched = hold.scrub()
        if subject:
            touched.extend(_delete_cuts(persistence, sid))
        touched.extend(after_rewrite(persistence, sid, None, listing=False))
        done.append(ErasedSession(sid, "erased" if subject else "descendant", tuple(items),
                                  record_seq, tuple(touched)))
        if on_session is not None:
            on_session(sid)
        for child, seed in children.get(sid, ()):
            queue.append((child, None if child in subjects else
                          {s for s in erased if s < seed}))
    if done:  # the store scrubbed and the listing index rebuilt once, for them all
        last = done[-1]
        refreshed = _scrub_store(persistence, last.session_id)
        refreshed.extend(after_rewrite(persistence, last.session_id, None))
        done[-1] = ErasedSession(last.session_id, last.role, last.items, last.record_seq,
                                 (*last.touched, *refreshed))
    return ErasureReceipt(persistence.url, started, tuple(subjects),
                          dict(where) if where is not None else None, tuple(done), reason, by)


def _scrub_store(persistence: Persistence, session_id: str) -> list[dict[str, Any]]:
    """The backend's scrub (SQLite checkpoint and VACUUM, PostgreSQL VACUUM), run once."""
    if not persistence.backend.capabilities.scrubs:
        return []
    try:
        with persistence.open(session_id, "write") as handle:
            return list(cast(Scrubs, handle).scrub())
    except DshError as exc:
        return [{"path": persistence.url, "action": "scrub", "done": False,
                 "error": exc.message}]


def _delete_cuts(persistence: Persistence, session_id: str) -> list[dict[str, Any]]:
    """Delete an erased session's saved cuts (raw bytes a repair cut off its log)."""
    touched: list[dict[str, Any]] = []
    for path in persistence.saved_cuts(session_id):
        try:
            os.unlink(path)
            touched.append({"path": path, "action": "saved cut deleted"})
        except OSError as exc:
            touched.append({"path": path, "action": "saved cut deleted", "done": False,
                            "error": str(exc)})
    return touched


@dataclass(frozen=True, slots=True)
class _ReceiptEntry:
    """One session of a receipt, its shape checked: tombstoned seq -> (commitment, tombstone)."""

    id: str
    record_seq: int | None
    items: dict[int, tuple[str, str]]
    deleted: tuple[str, ...]


def _item_digests(items: Sequence[Any], at: str = "") -> dict[int, tuple[str, str]] | str:
    """``{seq: (commitment, tombstone)}`` of a receipt's or a record's ``items``.

    One reading for both sides a receipt check compares (a receipt's entry, the
    ``redaction/applied`` record it names); the first place of the wrong shape (under ``at``)
    instead when there is one, a seq listed twice included.
    """
    found: dict[int, tuple[str, str]] = {}
    for k, item in enumerate(items):
        seq = item.get("seq") if isinstance(item, Mapping) else None
        if type(seq) is not int:
            return f"{at}items[{k}].seq is not a whole number"
        if seq in found:  # (a second item would be folded away, and never compared)
            return f"{at}items[{k}].seq {seq} is listed twice"
        digests = (item.get("commitment"), item.get("tombstone"))
        if not all(isinstance(d, str) for d in digests):
            return f"{at}items[{k}] has no commitment and tombstone digests"
        found[seq] = cast("tuple[str, str]", digests)
    return found


def _receipt_entries(receipt: Mapping[str, Any]) -> list[_ReceiptEntry] | str:
    """The sessions a receipt lists, or the first place its JSON has the wrong shape.

    A receipt is a file a person keeps and may hand around: a wrong value is named by its
    place (``sessions[0].items[3].seq``), never raised as a crash.
    """
    if receipt.get("kind") == "dsh-redaction":
        where = ""
        raw: Any = [{"id": receipt.get("session"), "recordSeq": receipt.get("recordSeq"),
                     "items": receipt.get("items", []), "touched": receipt.get("touched", [])}]
    else:
        where, raw = "sessions", receipt.get("sessions")
        if not isinstance(raw, list):
            return "sessions is not a list"
    entries = []
    for n, entry in enumerate(raw):
        at = f"{where}[{n}]." if where else ""
        if not isinstance(entry, Mapping):
            return f"{where}[{n}] is not an object"
        sid, record_seq = entry.get("id"), entry.get("recordSeq")
        items, touched = entry.get("items"), entry.get("touched", [])
        if not isinstance(sid, str):
            return f"{at}{'id' if where else 'session'} is not a session id"
        if record_seq is not None and type(record_seq) is not int:
            return f"{at}recordSeq is not a whole number"
        if not isinstance(items, list):
            return f"{at}items is not a list"
        if not isinstance(touched, list):
            return f"{at}touched is not a list"
        wanted = _item_digests(items, at)
        if isinstance(wanted, str):
            return wanted
        last: dict[str, str] = {}
        for step in touched:
            if isinstance(step, Mapping) and isinstance(step.get("path"), str) \
                    and step.get("done", True) is not False:
                last[step["path"]] = str(step.get("action"))
        entries.append(_ReceiptEntry(sid, record_seq, wanted, tuple(sorted(
            path for path, action in last.items()
            if action in ("deleted", "saved cut deleted")))))
    return entries


def verify_receipt(store: Persistence | HasPersistence, receipt: Mapping[str, Any]
                   ) -> list[str]:
    """Check an erasure (or redaction) receipt against the store; one line per problem.

    The receipt as a whole: an erasure's receipt is the one a ``store/erased`` record of the
    store log names by its digest (so a receipt changed since it was written, a salt, a
    commitment or a session left out, is named), and a receipt whose JSON has the wrong shape
    is one problem naming the place. For each session: it is still stored; its record is a
    ``redaction/applied`` listing the same commitments and tombstone digests; every
    tombstoned event still hashes to its digest (nothing put back); every file the receipt
    deleted is still absent.

    Rule: docs/forgetting.md#receipts.
    """
    persistence = facade(store)
    kind = receipt.get("kind")
    if kind not in ("dsh-redaction", RECEIPT_KIND):
        return [f"not a dsh receipt (kind {kind!r})"]
    entries = _receipt_entries(receipt)
    if isinstance(entries, str):
        return [f"not a dsh receipt: {entries}"]
    problems: list[str] = []
    if kind == RECEIPT_KIND:
        digest = receipt_digest(receipt)
        try:
            recorded = {r.get("receipt") for r in store_log(persistence).deletions()}
        except DshError as exc:
            problems.append(f"the store log cannot be read: {exc.message}")
        else:
            if digest not in recorded:
                problems.append(
                    f"no store/erased record of the store log names this receipt (SHA-256 "
                    f"{digest}): it was changed after it was written, or is another store's")
    for entry in entries:
        sid = entry.id
        try:
            events = persistence.read(sid).stored_events
        except DshError as exc:
            problems.append(f"{sid}: cannot be read: {exc.message}")
            continue
        record_seq = entry.record_seq
        if record_seq is not None:
            record = events[record_seq] if 0 <= record_seq < len(events) else None
            found = _item_digests(record["data"].get("items") or ()) \
                if record is not None and record["type"] == REDACTION_APPLIED else None
            if found != entry.items:
                problems.append(f"{sid}: seq {record_seq} is not the redaction record this "
                                f"receipt names")
        for seq, (_, digest) in sorted(entry.items.items()):
            if not 0 <= seq < len(events) or event_digest(events[seq]) != digest:
                problems.append(f"{sid}: event {seq} is not the tombstone the receipt lists")
        for path in entry.deleted:
            if os.path.lexists(path):
                problems.append(f"{sid}: {path} was deleted by the erasure and exists again")
    return problems

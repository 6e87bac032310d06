"""Redaction: remove chosen content from storage, leaving tombstones and commitments.

Rule: docs/forgetting.md#redaction. One redaction, under the session's write ownership:

1. selects the content: whole events (``seqs``), or the spans of every string in every event
   that match a pattern (``match``) or look like credentials (``secrets``,
   :mod:`dsh.rights._secrets`);
2. builds each changed event's tombstone: the same envelope (type, seq, time, surface op,
   sources, ignorable), its data with the chosen strings replaced by ``[REDACTED]``;
   structural strings (ids, types, roles, names, providers, models) are kept so the log reads
   and the model view keeps its shape; a tool call's ``arguments`` that stop being JSON
   become ``{}``. An assistant message that changes takes its stream chunks with it (a secret
   may be split across deltas); a whole tool result takes every rewrite of the same call;
3. commits to each removed original: ``sha256(salt || original event bytes)`` with a random
   16-byte salt per event that goes to the caller's receipt only, never into the store (so the
   commitment cannot be used to confirm a guess of a short secret);
4. validates the tombstoned log by a full restore, appends ``redaction/applied {items: [{seq,
   commitment, tombstone}], mode, spans, detectors, reason?, by?}`` and rewrites the stored
   log in place through the backend (``handle.rewrite``: atomic on every backend).

``dsh verify`` checks each recorded tombstone digest against the stored event.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time as _time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

from dsh._errors import DshError, RightsError
from dsh._verify import event_digest, verify_events
from dsh.json import FrozenDict, dumps, snapshot_json
from dsh.persistence import Rewrites, forget_search, replace_durably
from dsh.rights._held import HasPersistence, Held, facade, held
from dsh.rights._secrets import detector_names, pattern_spans, secret_spans
from dsh.session import REDACTION_APPLIED, Event, Session

if TYPE_CHECKING:
    from dsh.persistence import Persistence
    from dsh.session import Clock

REDACTED_TEXT: Final = "[REDACTED]"
"""What stands where removed text was."""

STRUCTURAL_KEYS: Final = frozenset({
    "type", "role", "id", "callId", "toolCallId", "name", "kind", "provider", "model",
    "plugin", "compactionId", "sourceCommandId", "form", "mediaType", "target", "outcome",
    "effect", "decision", "cause", "code", "status", "format"})
"""Keys whose string values are structure, never content: redaction keeps them."""

Spans = Callable[[str], list[tuple[int, int]]]


@dataclass(frozen=True, slots=True)
class RedactedEvent:
    """One event a redaction changed (or, in a dry run, would change).

    Attributes:
        seq: Its seq.
        type: Its type.
        spans: How many strings or spans were replaced.
        commitment: Hex ``sha256(salt || original event bytes)`` (empty in a dry run).
        salt: Hex salt of the commitment: keep it with the receipt, it is not stored.
        tombstone: Hex SHA-256 of the tombstone event's bytes, as recorded in the log.
    """

    seq: int
    type: str
    spans: int
    commitment: str = ""
    salt: str = ""
    tombstone: str = ""

    def to_json(self) -> dict[str, Any]:
        """``{"seq", "type", "spans", "commitment", "salt", "tombstone"}``."""
        return {"seq": self.seq, "type": self.type, "spans": self.spans,
                "commitment": self.commitment, "salt": self.salt, "tombstone": self.tombstone}


@dataclass(frozen=True, slots=True)
class RedactionResult:
    """What one :func:`redact` did (or would do, ``dry_run``).

    Attributes:
        session_id: The session.
        mode: ``seq``, ``match`` or ``secrets``.
        items: The changed events, in seq order.
        record_seq: Seq of the ``redaction/applied`` record, or None (dry run, nothing found).
        touched: Every file, table and step the rewrite touched (``{"path", "action", ...}``).
        detectors: The detectors that ran (``secrets`` mode).
        dry_run: True when nothing was written.
        time: Epoch ms of the redaction.
    """

    session_id: str
    mode: str
    items: tuple[RedactedEvent, ...]
    record_seq: int | None
    touched: tuple[Mapping[str, Any], ...]
    detectors: tuple[str, ...]
    dry_run: bool
    time: int

    def to_json(self) -> dict[str, Any]:
        """The receipt as JSON.

        ``{"kind": "dsh-redaction", "session", "mode", "time", "dryRun", "recordSeq", "items",
        "touched", "detectors"}``.
        """
        return {"kind": "dsh-redaction", "session": self.session_id, "mode": self.mode,
                "time": self.time, "dryRun": self.dry_run, "recordSeq": self.record_seq,
                "items": [i.to_json() for i in self.items],
                "touched": [dict(t) for t in self.touched], "detectors": list(self.detectors)}


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def scrub(value: Any, spans: Spans, key: str | None = None) -> tuple[Any, int]:
    """``value`` with the ``spans`` of every non-structural string replaced; and how many.

    Strings under :data:`STRUCTURAL_KEYS` are kept. An ``arguments`` string that was JSON and
    is not after the replacement becomes ``{}``; an ``arguments`` already ``{}`` is left as
    it is and not counted, so erasing an erased session again finds nothing left.
    """
    if isinstance(value, str):
        if key in STRUCTURAL_KEYS:
            return value, 0
        found = spans(value)
        if not found:
            return value, 0
        parts, at = [], 0
        for start, end in found:
            parts.append(value[at:start])
            parts.append(REDACTED_TEXT)
            at = end
        parts.append(value[at:])
        out = "".join(parts)
        if key == "arguments" and _is_json(value) and not _is_json(out):
            out = "{}"
            if out == value:  # already a tombstone: a second erasure changes nothing
                return value, 0
        return out, len(found)
    if isinstance(value, Mapping):
        total, out_map = 0, {}
        for k, v in value.items():
            out_map[k], n = scrub(v, spans, k)
            total += n
        return out_map, total
    if isinstance(value, list | tuple):
        total, out_list = 0, []
        for v in value:
            new, n = scrub(v, spans, key)
            out_list.append(new)
            total += n
        return out_list, total
    return value, 0


def _whole(text: str) -> list[tuple[int, int]]:
    return [(0, len(text))] if text and text != REDACTED_TEXT else []


def _tombstone(event: Event, spans: Spans) -> tuple[Event, int]:
    if event["type"] == REDACTION_APPLIED:
        return event, 0  # commitments and digests, no content: dsh verify reads them
    data, count = scrub(event["data"], spans)
    if event["type"] == "assistant/message" and count and isinstance(data, dict):
        message = data.get("message")
        if isinstance(message, dict) and isinstance(message.get("source"), dict):
            # replay state is opaque provider state about the removed content: it goes too
            message["source"] = {k: v for k, v in message["source"].items()
                                 if k != "replayState"}
    if not count:
        return event, 0
    frozen = snapshot_json({**event, "data": data})
    assert isinstance(frozen, FrozenDict)
    return Event(frozen), count


def tombstone_whole(event: Event) -> tuple[Event, int]:
    """``event`` with every non-structural string of its data replaced; and how many."""
    return _tombstone(event, _whole)


def _call_id(event: Event) -> str | None:
    message = event["data"].get("message") if isinstance(event["data"], Mapping) else None
    source = message.get("source") if isinstance(message, Mapping) else None
    call_id = source.get("callId") if isinstance(source, Mapping) else None
    return call_id if isinstance(call_id, str) else None


def _plan(events: Sequence[Event], seqs: Iterable[int] | None, spans: Spans | None,
          session_id: str) -> dict[int, tuple[Event, int]]:
    """Map each seq that changes to its (tombstone, replaced count)."""
    changed: dict[int, tuple[Event, int]] = {}
    if seqs is not None:
        chosen: set[int] = set()
        for seq in seqs:
            if type(seq) is not int or not 0 <= seq < len(events):
                raise RightsError(f"session {session_id!r} has no event {seq!r} (its last seq "
                                  f"is {len(events) - 1})", code="NO_SUCH_SEQ",
                                  session_id=session_id, seq=seq if type(seq) is int else None)
            chosen.add(seq)
        calls = {_call_id(events[s]) for s in chosen if events[s]["type"] == "tool/result"}
        calls.discard(None)
        for event in events:  # every rewrite of a chosen tool result holds the same content
            if event["type"] == "tool/result" and _call_id(event) in calls:
                chosen.add(event["seq"])
            cited = event.get("sourceEventSeqs") or ()
            if event.get("surfaceOp") not in (None, "append") and event["type"] in (
                    "user/message", "system/message") and any(s in chosen for s in cited) \
                    and isinstance(event["data"], Mapping) and isinstance(
                        event["data"].get("source"), Mapping) and event["data"]["source"].get(
                        "plugin") != "compact":
                chosen.add(event["seq"])  # a restoring copy (unquarantine) of a chosen message
        for seq in sorted(chosen):
            changed[seq] = _tombstone(events[seq], _whole)
    else:
        assert spans is not None
        for event in events:
            tomb, count = _tombstone(event, spans)
            if count:
                changed[event["seq"]] = (tomb, count)
    for seq in list(changed):  # a changed assistant message takes its stream chunks along
        event = events[seq]
        if event["type"] != "assistant/message":
            continue
        for cited in event.get("sourceEventSeqs") or ():
            if type(cited) is int and 0 <= cited < len(events) and cited not in changed \
                    and events[cited]["type"] == "assistant/chunk":
                tomb, count = _tombstone(events[cited], _whole)
                if count:
                    changed[cited] = (tomb, count)
    return changed


def redact(store: Persistence | HasPersistence, session_id: str, *,
           seqs: Iterable[int] | None = None, match: str | re.Pattern[str] | None = None,
           secrets: bool = False, dry_run: bool = False, reason: str | None = None,
           by: str | None = None, clock: Clock | None = None) -> RedactionResult:
    """Remove content from a stored session on every backend, leaving tombstones.

    Exactly one of ``seqs``, ``match`` and ``secrets`` says what goes.

    Args:
        store: A ``dsh.Store`` (or its ``persistence`` facade).
        session_id: The stored session (not live in this process).
        seqs: Whole events: every string of their data but structure (ids, types, roles,
            names) is replaced.
        match: A regular expression: its matches in every string of every event.
        secrets: What :func:`dsh.rights.find_secrets` finds in every string of every event.
        dry_run: Only say what would change: nothing is locked, repaired or written.
        reason: Why, kept in the record.
        by: Who, kept in the record.
        clock: Epoch-ms clock for the record.

    Returns:
        RedactionResult: the receipt, with each event's commitment and salt.

    Raises:
        RightsError: ``NOTHING_SELECTED`` (not exactly one of the three), ``NO_SUCH_SEQ``,
            ``BAD_PATTERN``, ``UNSUPPORTED`` (a backend that cannot rewrite: ``memory:``),
            ``TOMBSTONE_INVALID`` (the tombstoned log would not read back; nothing written).
        SessionNotFoundError, SessionBusyError, LogCorruptError: as every writer.

    Rule: docs/forgetting.md#redaction.
    """
    chosen = [seqs is not None, match is not None, secrets]
    if sum(chosen) != 1:
        raise RightsError("say what to redact: exactly one of --seq, --match and --secrets",
                          code="NOTHING_SELECTED", session_id=session_id)
    mode = "seq" if seqs is not None else "match" if match is not None else "secrets"
    spans: Spans | None = None
    if match is not None:
        try:
            pattern = re.compile(match) if isinstance(match, str) else match
        except re.error as exc:
            raise RightsError(f"--match {match!r} is not a regular expression: {exc}",
                              code="BAD_PATTERN", session_id=session_id) from exc

        def spans(text: str) -> list[tuple[int, int]]:
            return pattern_spans(pattern, text)
    elif secrets:
        spans = secret_spans
    seq_list = list(seqs) if seqs is not None else None
    detectors = detector_names() if secrets else ()
    now = clock() if clock is not None else int(_time.time() * 1000)
    if dry_run:
        read = facade(store).read(session_id)
        plan = _plan(read.stored_events, seq_list, spans, session_id)
        found = tuple(RedactedEvent(seq, read.stored_events[seq]["type"], count)
                      for seq, (_, count) in sorted(plan.items()))
        return RedactionResult(session_id, mode, found, None, (), detectors, True, now)
    with held(store, session_id, clock=clock) as hold:
        plan = _plan(list(hold.session.events)[:hold.stored], seq_list, spans, session_id)
        if not plan:  # nothing left: finish a scrub a crash may have cut short (SQLite)
            touched = hold.scrub()
            return RedactionResult(session_id, mode, (), None, tuple(touched), detectors,
                                   False, now)
        extra: dict[str, Any] = {"mode": mode}
        if detectors:
            extra["detectors"] = list(detectors)
        if reason is not None:
            extra["reason"] = reason
        if by is not None:
            extra["by"] = by
        items, appended, touched = commit_tombstones(hold, plan, extra, facade(store).url)
    # committed: the steps below are reported in the receipt, never raised
    touched.extend(after_rewrite(facade(store), session_id, spans))
    return RedactionResult(session_id, mode, tuple(items), appended["seq"], tuple(touched),
                           detectors, False, appended["time"])


def commit_tombstones(hold: Held, plan: Mapping[int, tuple[Event, int]],
                      extra: Mapping[str, Any], url: str, *, scrub: bool = True,
                      ) -> tuple[list[RedactedEvent], Event, list[dict[str, Any]]]:
    """Put the tombstones of ``plan`` in place and rewrite the held log with the record.

    Each tombstone gets a salted commitment to its original; the tombstoned log is restored
    and verified in full before anything is written; ``redaction/applied {items, spans,
    **extra}`` is appended; the backend rewrites the log (``handle.rewrite``), then scrubs its
    files unless ``scrub`` is False (the caller scrubs once for many sessions).

    Returns:
        The changed events (with salts), the record event, what the rewrite touched.

    Raises:
        RightsError: ``UNSUPPORTED`` (no ``rewrite`` on this backend), ``TOMBSTONE_INVALID``.
    """
    session_id = hold.session.id
    if not hold.capabilities.rewrites:
        raise RightsError(f"the store {url} cannot rewrite a stored log (redaction and "
                          f"erasure need JSONL, SQLite or PostgreSQL)", code="UNSUPPORTED",
                          session_id=session_id)
    events = list(hold.session.events)
    items: list[RedactedEvent] = []
    for seq, (tomb, count) in sorted(plan.items()):
        salt = os.urandom(16)
        items.append(RedactedEvent(
            seq, tomb["type"], count,
            hashlib.sha256(salt + dumps(events[seq])).hexdigest(), salt.hex(),
            event_digest(tomb)))
        events[seq] = tomb
    header: Any = hold.read.header
    try:
        session = Session.restore(session_id, events, header,
                                  inherited_event_count=header.get("seedLength") or 0,
                                  clock=hold.session_clock)
    except DshError as exc:
        raise RightsError(f"the redacted log of session {session_id!r} would not read "
                          f"back ({exc}); nothing was written", code="TOMBSTONE_INVALID",
                          session_id=session_id) from exc
    record: dict[str, Any] = {
        "items": [{"seq": i.seq, "commitment": i.commitment, "tombstone": i.tombstone}
                  for i in items],
        "spans": sum(i.spans for i in items), **extra}
    appended = session.append(REDACTION_APPLIED, record, ignorable=True)
    final = list(session.events)
    problems = [v for v in verify_events(final, header=header)
                if v.rule in ("ENVELOPE", "SHAPE", "SURFACE", "SEED")]
    if problems:
        raise RightsError(f"the redacted log of session {session_id!r} would not verify "
                          f"({problems[0].rule} at seq {problems[0].seq}: "
                          f"{problems[0].message}); nothing was written",
                          code="TOMBSTONE_INVALID", session_id=session_id)
    return items, appended, list(cast(Rewrites, hold.handle).rewrite(final, scrub=scrub))


def after_rewrite(persistence: Persistence, session_id: str, spans: Spans | None, *,
                  listing: bool = True) -> list[dict[str, Any]]:
    """The copies beside a rewritten log: cuts scrubbed, asides and search index dropped.

    The listing is refreshed too.

    A saved cut (bytes a repair cut off, docs/formats.md#saved-cuts) holds raw log text: with
    ``spans`` its text gets the same replacement, else it is left alone. The listing index
    (titles are first prompts) is rebuilt by a listing, which rereads the changed log and
    empties the journal (``listing=False``: the caller refreshes it once for many sessions).
    Failures are reported as ``{"done": false, "error"}``.
    """
    touched: list[dict[str, Any]] = []
    if spans is not None:
        for path in persistence.saved_cuts(session_id):  # file stores keep cuts
            try:
                with open(path, "rb") as handle:
                    raw = handle.read()
                text = raw.decode("utf-8", "surrogateescape")
                new, count = scrub(text, spans)
                if count:
                    replace_durably(Path(path), new.encode("utf-8", "surrogateescape"))
                    touched.append({"path": path, "action": "saved cut scrubbed",
                                    "spans": count})
            except OSError as exc:
                touched.append({"path": path, "action": "saved cut scrubbed", "done": False,
                                "error": str(exc)})
    try:
        # asides describe the old log (an adapter's index): they go, and readers rebuild them
        persistence.drop_asides(session_id)
    except (OSError, DshError) as exc:
        touched.append({"path": persistence.url, "action": "asides deleted", "done": False,
                        "error": str(exc)})
    try:
        # the search index holds message text: it goes, and the next search rebuilds it
        touched.extend({"path": path, "action": "search index deleted"}
                       for path in forget_search(persistence, session_id))
    except (OSError, DshError) as exc:
        touched.append({"path": persistence.url, "action": "search index deleted",
                        "done": False, "error": str(exc)})
    if not listing:
        return touched
    try:
        persistence.list_entries()
        touched.append({"path": persistence.url, "action": "listing refreshed"})
    except DshError as exc:
        touched.append({"path": persistence.url, "action": "listing refreshed", "done": False,
                        "error": exc.message})
    return touched


def find_secrets(text: str) -> list[tuple[int, int]]:
    """Character spans of ``text`` that look like credentials (what ``--secrets`` removes).

    Rule: docs/forgetting.md#finding-secrets.
    """
    return secret_spans(text)

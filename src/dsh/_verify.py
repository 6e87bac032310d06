"""Verify a session log: every rule a log must keep, as one list of violations.

:func:`verify_events` runs, over one log, in this order:

1. vocabulary: every type is known or the event is ``ignorable: true``
   (docs/events.md#known-types-and-ignorable-events);
2. envelope, header and seed validation by ``Session.restore`` (docs/formats.md#the-session-header,
   docs/rules.md#seed-validation, docs/rules.md#the-end-seed-marker): it stops at the first refusal,
   so this part gives at most one violation, naming the seq;
3. the surface fold (docs/rules.md#the-surface): the first refused surface op (skipped when step 2
   already refused the same seq);
4. tool pairing by call id over the model surface after in-memory crash repair
   (docs/rules.md#closers, docs/rules.md#tool-pairing): every ``tool-call`` block of an assistant
   message is answered by exactly one ``tool/result``, no result answers an unknown or already
   answered call. Repair closers answer the calls of an interrupted last turn, so a call still
   unanswered is one left
   dangling at rest: a provider would refuse the next request;
5. the log invariants (:func:`dsh.session._invariants.check_log`, docs/rules.md#turns-and-steps);
6. the compaction bracket rules (:func:`dsh.compaction.check_compaction_log`,
   docs/rules.md#compaction-brackets), reported with a ``COMPACTION_`` prefix;
7. redaction tombstones (docs/forgetting.md#tombstones-and-commitments): every event a
   ``redaction/applied`` record names still hashes to the tombstone digest it recorded.

Rule codes are stable upper-snake names: those of :data:`RULES` plus the codes of the
invariant companion (``TURN_NUMBER``, ``UNPAIRED_RESULT``, …) and the ``EventRejectedError``
codes of ``Session.restore`` (``ENVELOPE``, ``HEADER``, ``SEED``, ``SURFACE``, …).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from itertools import islice
from operator import itemgetter
from typing import Any, Final

from dsh._errors import DshError, EventRejectedError
from dsh.compaction import check_compaction_log
from dsh.json import FrozenDict, c_stored_prescan, dumps, snapshot_json
from dsh.session import (
    KNOWN_EVENT_TYPES,
    REDACTION_APPLIED,
    SESSION_FORMAT_VERSION,
    Event,
    PagedLog,
    SeedStream,
    Session,
    Surface,
    Violation,
    check_log,
    closers_of_contiguous,
    fold_surface,
    interrupted_turn_closers,
)

UNKNOWN_EVENT_TYPE: Final = "UNKNOWN_EVENT_TYPE"
"""An event type this dsh does not know, not marked ``ignorable``.

Rule: docs/events.md#known-types-and-ignorable-events.
"""

INVALID_LOG: Final = "INVALID_LOG"
"""An event is not a JSON object dsh can hold (restore could not even start)."""

REPAIR: Final = "REPAIR"
"""The crash repair of the last turn failed: the open turn's events are malformed.

Rule: docs/rules.md#repair.
"""

UNANSWERED_TOOL_CALL: Final = "UNANSWERED_TOOL_CALL"
"""A tool call on the surface has no result, and no repair closer would give it one.

Rule: docs/rules.md#tool-pairing.
"""

ORPHAN_TOOL_RESULT: Final = "ORPHAN_TOOL_RESULT"
"""A ``tool/result`` on the surface answers a call id no earlier assistant message made."""

DUPLICATE_TOOL_RESULT: Final = "DUPLICATE_TOOL_RESULT"
"""A second ``tool/result`` on the surface for a call that was already answered."""

REDACTION_TOMBSTONE: Final = "REDACTION_TOMBSTONE"
"""An event a ``redaction/applied`` record names is not the tombstone it recorded."""
RULES: Final = frozenset({UNKNOWN_EVENT_TYPE, INVALID_LOG, REPAIR, UNANSWERED_TOOL_CALL,
                          ORPHAN_TOOL_RESULT, DUPLICATE_TOOL_RESULT, REDACTION_TOMBSTONE})
"""The rule codes this module defines itself (the other codes come from the checks it runs)."""


_TYPE: Final = itemgetter("type")


def _where_seq(error: DshError) -> int | None:
    for key in ("seq", "seed_index"):
        value = error.where.get(key)
        if type(value) is int:
            return value
    return None


def frozen_event(index: int, event: Mapping[str, Any]) -> Event | Violation:
    """``event`` (at ``index`` of a log) as a frozen :class:`Event`, or its ``INVALID_LOG``.

    The envelope pass of :func:`verify_events`: a value that is not JSON, not an object, whose
    type is not a string or that has no ``data`` is refused before any other check runs.
    """
    if type(event) is Event:
        return event
    try:
        frozen = snapshot_json(event)
    except DshError as error:
        return Violation(index, INVALID_LOG,
                         f"event at index {index} is not valid JSON: {error.message}")
    if not isinstance(frozen, FrozenDict):
        return Violation(index, INVALID_LOG, f"event at index {index} is not a JSON object "
                                             f"({type(event).__name__})")
    if type(frozen.get("type")) is not str:
        return Violation(index, INVALID_LOG, f"event at index {index} has a type that is not a "
                                             f"string ({frozen.get('type')!r})")
    if "data" not in frozen:  # every later check reads it (docs/events.md: always present)
        return Violation(index, INVALID_LOG, f"event at index {index} has no data (every event "
                                             "carries one; null is a value)")
    return Event(frozen)


def _as_events(events: Iterable[Mapping[str, Any]]) -> tuple[list[Event], list[Violation]]:
    if type(events) is tuple or type(events) is list:  # a read's log: Events already
        held = list(events)
        if set(map(type, held)) == {Event}:  # one pass at C speed, no per-event call
            return held, []
    out: list[Event] = []
    for index, event in enumerate(events):
        frozen = frozen_event(index, event)
        if type(frozen) is not Event:
            assert isinstance(frozen, Violation)
            return out, [frozen]
        out.append(frozen)
    return out, []


def _types_of(log: Sequence[Event]) -> set[str] | None:
    """Every event type of a held log (one pass at C speed); ``None``: not told that way.

    ``None`` for a log that is not a list (a paged view decodes what each pass reads: no extra
    pass over it) or one with an event without a hashable ``type``; the checks that ask then
    walk the log as before.
    """
    if type(log) is not list:
        return None
    try:
        return set(map(_TYPE, log))
    except (KeyError, TypeError):
        return None


def _unknown_types(log: Sequence[Event], types: AbstractSet[str] | None) -> list[Violation]:
    """An ``UNKNOWN_EVENT_TYPE`` violation per event of an unknown, non-ignorable type.

    ``types`` (:func:`_types_of`) all known: none. Else the C prescan finds the first one (or
    says there is none) without a Python pass.
    """
    if types is not None and types <= KNOWN_EVENT_TYPES:
        return []
    start = 0
    if c_stored_prescan is not None and type(log) is list:
        start = c_stored_prescan(log, KNOWN_EVENT_TYPES)[1]
        if start < 0:
            return []
    found: list[Violation] = []
    for event in islice(log, start, None):
        etype = event.get("type")
        if etype not in KNOWN_EVENT_TYPES and event.get("ignorable") is not True:
            seq = event.get("seq")
            found.append(Violation(seq if type(seq) is int else None, UNKNOWN_EVENT_TYPE,
                                   f"event type {etype!r} at seq {seq} is unknown to this dsh "
                                   "and not marked ignorable"))
    return found


def _default_header(events: Sequence[Event]) -> FrozenDict:
    first = events[0].get("time") if events else 0
    created = first if type(first) is int and first >= 0 else 0
    return FrozenDict({"version": SESSION_FORMAT_VERSION, "id": "verify", "createdAt": created})


def _call_ids(event: Event) -> list[str]:
    data = event.get("data")
    message = data.get("message") if isinstance(data, Mapping) else None
    content = message.get("content") if isinstance(message, Mapping) else None
    return [str(block.get("id")) for block in content or ()
            if isinstance(block, Mapping) and block.get("type") == "tool-call"]


def _answered_id(event: Event) -> str | None:
    data = event.get("data")
    message = data.get("message") if isinstance(data, Mapping) else None
    if not isinstance(message, Mapping):
        return None
    for block in message.get("content") or ():
        if isinstance(block, Mapping) and block.get("type") == "tool-result":
            return str(block.get("toolCallId"))
    source = message.get("source")
    call_id = source.get("callId") if isinstance(source, Mapping) else None
    return str(call_id) if call_id is not None else None


def _pairing(events: Sequence[Event], surface: Surface | None,
             closers: Sequence[Event] | None, *, contiguous: bool = False) -> list[Violation]:
    """Pair tool calls and results by id over the surface of ``events`` + repair closers.

    ``surface`` is the surface of ``events`` alone (``None``: it was refused); the closers'
    surface ops are folded on from it (one pass over the log in all). ``closers`` are the
    repair closers of ``events`` when the caller has them, else they are computed here (without
    the contiguity walk when the caller proved it: ``contiguous``).
    """
    if closers is None:
        try:
            closers = (closers_of_contiguous(events, "interrupted") if contiguous
                       else interrupted_turn_closers(events))
        except EventRejectedError as error:
            return [Violation(_where_seq(error), REPAIR,
                              f"the crash repair of the last turn failed: {error.message}")]
    if surface is None:
        return []  # reported by the surface check
    log: Sequence[Event] = events
    if closers:  # the log and its closers, without copying the log
        log = PagedLog(_Served(events))
        log.extend(closers)
        surface = Surface.resume(surface.nodes, surface.replace_generation)
        try:
            for seq in range(len(events), len(log)):
                surface.apply(surface.plan(log[seq], seq, log))
        except EventRejectedError:
            return []  # a closer the repair builds is never refused; nothing to pair then
    nodes = surface.nodes
    repaired = len(events)
    pending: dict[str, int] = {}
    answered: set[str] = set()
    found: list[Violation] = []
    for seq in nodes:
        event = log[seq]
        kind = event.get("type")
        if kind == "assistant/message":
            for made in _call_ids(event):
                pending[made] = seq
                answered.discard(made)
        elif kind == "tool/result" and seq < repaired:
            call_id = _answered_id(event)
            if call_id is not None and call_id in pending:
                del pending[call_id]
                answered.add(call_id)
            elif call_id is not None and call_id in answered:
                found.append(Violation(seq, DUPLICATE_TOOL_RESULT,
                                       f"tool/result at seq {seq} answers call {call_id!r} a "
                                       "second time; each tool call gets exactly one result"))
            else:
                found.append(Violation(seq, ORPHAN_TOOL_RESULT,
                                       f"tool/result at seq {seq} answers call {call_id!r}, "
                                       "which no earlier assistant message on the surface made"))
        elif kind == "tool/result":
            pending.pop(str(_answered_id(event)), None)
    for call_id, seq in sorted(pending.items(), key=lambda item: item[1]):
        found.append(Violation(seq, UNANSWERED_TOOL_CALL,
                               f"tool call {call_id!r} of the assistant message at seq {seq} "
                               "has no result and no open turn to repair it; a provider would "
                               "refuse the next request"))
    return found


def verify_events(events: Iterable[Mapping[str, Any]], *,
                  header: Mapping[str, Any] | None = None,
                  closers: Sequence[Event] | None = None) -> list[Violation]:
    """Check one session log and return every violation found (empty when valid).

    Args:
        events: The stored log in seq order: :class:`~dsh.session._events.Event` objects (or
            plain wire objects, which are validated and frozen first), without repair closers
            and without a trailing in-memory ``session/end-seed``.
        header: The stored ``SessionHeader`` wire object; omitted: a minimal version-0 header
            (id ``verify``, ``createdAt`` the first event's time). Its ``seedLength`` is the
            inherited event count of a fork.
        closers: The log's crash-repair closers (``interrupted_turn_closers(events)``) when
            the caller already has them, e.g. from the read pipeline
            (docs/rules.md#the-read-pipeline); omitted: computed here.

    Returns:
        list[Violation]: in check order (vocabulary, restore, surface, tool pairing,
        invariants, compaction brackets); each check's violations in log order. Restore and
        surface give at most one each (their validation stops at the first refusal).

    Raises:
        Nothing for a bad log: every problem is a violation.

    Rules: docs/events.md#known-types-and-ignorable-events, docs/formats.md#the-session-header,
        docs/rules.md#seed-validation, docs/rules.md#the-end-seed-marker, docs/rules.md#the-surface,
        docs/rules.md#closers, docs/rules.md#tool-pairing, docs/rules.md#turns-and-steps,
        docs/rules.md#compaction-brackets.
    """
    log, found = _as_events(events)
    if found:
        return found
    return _verify(log, header, closers, _restore_whole)


def verify_paged(log: Sequence[Event], *, header: Mapping[str, Any] | None = None,
                 batch_events: int = 5_000,
                 types: AbstractSet[str] | None = None,
                 unignored_types: AbstractSet[str] | None = None,
                 contiguous: bool = False) -> list[Violation]:
    """Check a log served by seq without holding it: the result of :func:`verify_events`.

    Args:
        log: The stored log as frozen :class:`~dsh.session._events.Event` objects, read by seq
            (``log[seq]``, ``log[start:stop]`` a list) and iterated in seq order, several
            times: a file-backed view decodes them as asked, so memory holds what each check
            keeps (the surface's node seqs, a type per event, pending call ids), not the log.
        header: As for :func:`verify_events`.
        batch_events: Events restore's checks take at once (memory holds one batch).
        types: Every event type of ``log`` (each event's ``type``, all strings), when the
            caller collected them while it read the log: the redaction tombstone check then
            skips its walk when no ``redaction/applied`` is there, as it does for a held log.
            None: it walks the log.
        unignored_types: The types of the events of ``log`` not marked ``ignorable: true``,
            when the caller collected them: the unknown type check skips its walk when all
            are known. None: it walks the log (unless ``types`` are all known).
        contiguous: The caller proved that every event's seq is its index (a first read that
            refused a seq out of order): the crash repair's closers are computed without its
            own walk checking that (docs/rules.md#closers).

    Returns:
        list[Violation]: equal to ``verify_events(list(log), header=header)``, violation for
        violation: the same checks in the same order, restore's run batch by batch through a
        restore-mode ``SeedStream`` (the same per-event pipeline, docs/rules.md#seed-validation).

    Raises:
        Nothing for a bad log; whatever ``log`` raises while it is read.

    Rule: as :func:`verify_events`.
    """
    def restore(session_id: str, events: Sequence[Event], stored: FrozenDict,
                inherited: int) -> Surface:
        stream = SeedStream(session_id, header=stored, inherited_event_count=inherited,
                            reader=lambda start, stop: events[start:stop], restore=True)
        for start in range(0, len(events), batch_events):
            stream.admit(events[start:start + batch_events])
            stream.settle()
        stream.finish()
        return stream.surface

    return _verify(log, header, None, restore, types, unignored_types, contiguous=contiguous)


def _restore_whole(session_id: str, log: Sequence[Event], stored: FrozenDict,
                   inherited: int) -> Surface:
    return Session.restore(session_id, log, stored, inherited_event_count=inherited).surface


def _verify(log: Sequence[Event], header: Mapping[str, Any] | None,
            closers: Sequence[Event] | None,
            restore: Callable[[str, Sequence[Event], FrozenDict, int], Surface],
            known: AbstractSet[str] | None = None,
            unignored: AbstractSet[str] | None = None, *,
            contiguous: bool = False) -> list[Violation]:
    """Run the checks of :func:`verify_events` (after its envelope pass) over ``log``.

    ``known``: the log's event types as the caller collected them (else found here, for a held
    log only); ``unignored``: those of its events not marked ignorable; ``contiguous``: the
    caller proved each seq is its index.
    """
    types = _types_of(log) if known is None else known
    found = [] if unignored is not None and unignored <= KNOWN_EVENT_TYPES else (
        _unknown_types(log, types))
    if header is None:
        stored = _default_header(log)
    else:
        try:
            frozen = snapshot_json(header)
        except DshError as error:
            return [*found, Violation(None, "HEADER", f"the session header is not valid JSON: "
                                                      f"{error.message}")]
        stored = frozen if isinstance(frozen, FrozenDict) else FrozenDict(frozen)
    seed_length = stored.get("seedLength")
    restore_seq: int | None = -1
    surface: Surface | None = None
    try:
        # restore folds the surface by the same rules: its surface is the log's, no second fold
        surface = restore(str(stored.get("id") or "verify"), log, stored,
                          seed_length if type(seed_length) is int else 0)
    except DshError as error:
        restore_seq = _where_seq(error)
        found.append(Violation(restore_seq, error.code, " ".join(error.message.split())))
        try:  # the first surface refusal may lie elsewhere than the restore's
            fold = fold_surface(log)
            surface = Surface.resume(fold.nodes, len(fold.replacements))
        except DshError as fold_error:
            seq = _where_seq(fold_error)
            if seq != restore_seq:
                found.append(Violation(seq, fold_error.code,
                                       " ".join(fold_error.message.split())))
    found.extend(_pairing(log, surface, closers, contiguous=contiguous))
    found.extend(Violation(v.seq, v.rule, v.message) for v in check_log(log))
    found.extend(Violation(v.seq, f"COMPACTION_{v.rule}", v.message)
                 for v in check_compaction_log(log))
    if types is None or REDACTION_APPLIED in types:
        found.extend(_tombstones(log))
    return found


class _Served:
    """A held log served by seq (``read``), so a ``PagedLog`` can put closers after it."""

    def __init__(self, log: Sequence[Event]) -> None:
        self._log = log

    def __len__(self) -> int:
        return len(self._log)

    def read(self, start: int, stop: int) -> Sequence[Event]:
        """The events ``start <= seq < stop``."""
        return self._log[start:stop]


def event_digest(event: Mapping[str, Any]) -> str:
    """Hex SHA-256 of an event's wire bytes (``dsh.json.dumps``): a tombstone's digest."""
    return hashlib.sha256(dumps(event)).hexdigest()


def _tombstones(log: Sequence[Event]) -> list[Violation]:
    """Each item of each ``redaction/applied`` record against the event it names."""
    found: list[Violation] = []
    for record in log:
        if record.get("type") != REDACTION_APPLIED or not isinstance(record.get("data"), Mapping):
            continue
        items = record["data"].get("items")
        for item in items if isinstance(items, Sequence) else ():
            seq = item.get("seq") if isinstance(item, Mapping) else None
            digest = item.get("tombstone") if isinstance(item, Mapping) else None
            if type(seq) is not int or not isinstance(digest, str):
                continue
            if not 0 <= seq < len(log) or event_digest(log[seq]) != digest:
                found.append(Violation(seq, REDACTION_TOMBSTONE,
                                       f"event {seq} is not the tombstone the redaction record "
                                       f"at seq {record.get('seq')} committed to: it changed "
                                       f"after the redaction"))
    return found

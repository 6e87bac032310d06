"""Reading a stored session a page at a time: the O(tail) read for viewers, nothing written.

A viewer (``dsh view``) shows one page of a session of any size. Where the log has a restore
point, :func:`read_pages` reads only the header and the tail after the restore point's cut and
pages the events before it in from storage on demand (the same page-in source an O(tail) resume
uses), so opening a 1M-event session costs what opening a small one does and memory is bounded
by the page cache (:class:`dsh.session.PagedLog`). Without one, a backend that serves seq ranges
(SQLite schema 17, PostgreSQL, raw JSONL: :class:`~dsh.persistence._contract.ReadsRanges`) is
read the same way: its latest :data:`TAIL_EVENTS` events at once, every range before them from
storage when asked. Otherwise (a Zstandard JSONL log without a restore point, a short log), or
at any doubt, it is the full cold read (:meth:`Persistence.read`).

Invariants this module owns: the events served are exactly the committed events a full read
gives (the tail goes through the same vocabulary and legacy checks as a resume's, and any doubt
falls back to the full read); nothing is written, no lock is taken.

Rule: docs/rules.md#restore-points-are-never-the-truth; docs/rules.md#the-read-pipeline.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final, Protocol, cast, runtime_checkable

from dsh._errors import DshError, LogCorruptError
from dsh.json import FrozenDict, loads
from dsh.persistence import _restore_point as ck
from dsh.persistence._contract import ReadsRanges, TornTail, conforms
from dsh.persistence._legacy import stored_prescan
from dsh.session import (
    KNOWN_EVENT_TYPES,
    SESSION_FORMAT_VERSION,
    Event,
    EventSource,
    PagedLog,
    RestoreState,
)

if TYPE_CHECKING:
    from dsh.persistence._facade import Persistence

__all__ = ["RANGED_MIN_EVENTS", "TAIL_EVENTS", "PicksRecords", "RecordCut", "SelectsEvents",
           "StoredPages", "read_pages", "readable_prefix"]

TAIL_EVENTS: Final = 1024
"""Events a paged read without a restore point holds from the start (the latest ones)."""

RANGED_MIN_EVENTS: Final = 4096
"""Logs shorter than this are read in full (it costs what paging them would)."""


@dataclass(frozen=True, slots=True)
class RecordCut:
    """What a reader's ``pick`` cuts, so that a source may make the cut in its own pass.

    ``pick(type, text)`` is the C accelerator's ``record_texts(text, *paths[type], fmt)``
    (None for a type ``paths`` does not hold), so a source with the accelerator may call it
    on its rows itself (:attr:`PicksRecords.cut`).

    Attributes:
        paths: Event type -> ``(path, need)``: the members leading to the records' holder, and
            a top member that must be an object too (None: none).
        fmt: The record format wanted.
    """

    paths: dict[str, tuple[tuple[str, ...], str | None]]
    fmt: str


class PicksRecords(Protocol):
    """A reader's ``pick(type, data text)`` for :meth:`SelectsEvents.read_selected`.

    Called with a plain row's event type and checked data text; returns what the reader keeps
    of the row (not None), or None to have the row decoded whole.

    Attributes:
        cut: What the call cuts when it is the C accelerator's ``record_texts``
            (:class:`RecordCut`), so that a source with the accelerator may make the cut in its
            own pass over the rows; None for any other pick.
    """

    cut: RecordCut | None

    def __call__(self, etype: str, text: str, /) -> Any:
        """What the reader keeps of the row, or None (decode it whole)."""
        ...


@runtime_checkable
class SelectsEvents(Protocol):
    """A page-in source that can serve a few events of a long range for the cost of a check.

    ``read_selected(start, stop, seqs, types)`` returns the events of ``start <= seq < stop``
    whose seq is in ``seqs`` or type in ``types``, in seq order, after checking every stored
    row of the range as ``read`` does (docs/rules.md#verified-page-in); events whose rows are
    plain may come as plain dicts instead of frozen :class:`~dsh.session.Event`, without their
    ``sourceEventSeqs``; with ``pick`` (:class:`PicksRecords`) and ``into``, a plain row's
    data text is offered to ``pick(type, text)`` and, when it answers, the answer goes to
    ``into[seq]`` instead of the event to the list. None when it cannot vouch for part of the
    range that way (the caller pages it in with ``read``).
    """

    def read_selected(self, start: int, stop: int, seqs: Container[int],
                      types: Container[str], pick: PicksRecords | None = None, *,
                      into: dict[int, Any] | None = None
                      ) -> list[Mapping[str, Any]] | None:
        """The selected events of ``start <= seq < stop`` (see the class), or None."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredPages:
    """A stored session opened for reading by page.

    Attributes:
        header: The stored header.
        events: The committed events; element ``i`` has seq ``i``. A :class:`PagedLog` when
            ``paged`` (its events before the cut are read from storage when indexed), else a
            tuple.
        closers: The crash-repair closers the next resume would append (in memory only), seq
            contiguous after ``events``; empty for a balanced log. Only a full read computes
            them; a paged read leaves them empty (a viewer shows the open turn instead).
        torn: The torn tail after the committed prefix (left on disk), or None.
        revision: The backend's revision of the read.
        paged: True when the events before the restore point's cut are paged in.
        restore: The restore point's state of the events before its cut (surface nodes, request
            header and context), when ``paged``; else None.
        aside_heads: The heads of the asides :func:`read_pages` was asked for, read with the
            session's lookup (name -> the aside's bytes up to and including its first newline,
            ``b""`` when it has none, None when the session keeps no such aside); a name is
            missing when the backend does not read them that way (read the aside itself).
    """

    header: FrozenDict
    events: Sequence[Event]
    closers: tuple[Event, ...]
    torn: TornTail | None
    revision: str
    paged: bool
    restore: RestoreState | None = None
    aside_heads: Mapping[str, bytes | None] = field(default_factory=dict)


def read_pages(persistence: Persistence, session_id: str, *,
               aside_heads: Sequence[str] = ()) -> StoredPages:
    """Open ``session_id`` for reading by page: O(tail) through its restore point or by range.

    Where the log has a restore point, the events before its cut are paged in and
    :attr:`StoredPages.restore` holds its state. Without one, on a backend that serves ranges
    (SQLite schema 17, PostgreSQL, raw JSONL) and a log of at least :data:`RANGED_MIN_EVENTS`
    events, the latest :data:`TAIL_EVENTS` are read and the rest paged in by range; a page
    holding a legacy shape or an unknown type not marked ignorable, or one storage cannot
    serve as written, is served by one full read instead (its normalised events, or the error
    a full read raises). Else the full cold read.
    Rule: docs/stores.md#reading-by-page.

    Args:
        persistence: The store's facade.
        session_id: A stored session.
        aside_heads: Asides whose heads a backend that opens at the restore point
            (PostgreSQL) reads in the same message as the lookup
            (:attr:`StoredPages.aside_heads`; docs/stores.md#asides).

    Returns:
        The session's events as a random-access sequence (see :class:`StoredPages`).

    Raises:
        SessionNotFoundError: no such session.
        LogCorruptError, SessionFormatUnsupportedError, UnknownEventTypeError: the full read
            refused the log (a paged read that doubts anything falls back to it).
    """
    backend = persistence.backend
    if backend.capabilities.restore_points and conforms(backend, ck.OpensAtRestorePoint):  # type: ignore[type-abstract]  # (a protocol is the class asked about)
        # the lookup reads it too, and the asides' heads
        opened = backend.open_at_restore_point(session_id, aside_heads=aside_heads)
        heads: Mapping[str, bytes | None] = opened.aside_heads
    else:
        opened, heads = persistence.open(session_id, "read"), {}
    with opened as handle:
        if backend.capabilities.restore_points:
            keeper = cast(ck.KeepsRestorePoints, handle)  # what the capability promises
            try:
                restore_point, cold, source = keeper.read_from_restore_point()
                header = cold.header
                if (header.get("id") != session_id
                        or header.get("version") != SESSION_FORMAT_VERSION):
                    raise ck.RestorePointRefused("header")
                legacy_at, unknown_at = stored_prescan(cold.events, KNOWN_EVENT_TYPES)
                if legacy_at >= 0:
                    raise ck.RestorePointRefused("legacy")
                for event in cold.events[unknown_at:unknown_at + 1]:
                    if event.get("type") not in KNOWN_EVENT_TYPES \
                            and event.get("ignorable") is not True:
                        raise ck.RestorePointRefused("unknown-type")
                if len(source) != restore_point.state.event_count:
                    raise ck.RestorePointRefused("cut")
                events = PagedLog(source)
                events.extend(cold.events)
                return StoredPages(header=header, events=events, closers=(), torn=None,
                                   revision=cold.revision, paged=True,
                                   restore=restore_point.state, aside_heads=heads)
            except ck.RestorePointRefused as exc:
                ck.note_refusal(session_id, exc.reason, exc.error)
            except DshError as exc:
                ck.note_refusal(session_id, f"invalid:{exc.code}")
        if persistence.backend.capabilities.ranges:
            ranged = _read_ranged(persistence, session_id,
                                  cast(ReadsRanges, handle))  # what the capability promises
            if ranged is not None:
                return replace(ranged, aside_heads=heads)
    return replace(_read_full(persistence, session_id), aside_heads=heads)


def _read_full(persistence: Persistence, session_id: str) -> StoredPages:
    read = persistence.read(session_id)
    return StoredPages(header=read.header, events=read.stored_events, closers=read.closers,
                       torn=read.torn, revision=read.revision, paged=False)


def _plain(events: Sequence[Event]) -> bool:
    """No legacy shape and no unknown type not marked ignorable (what the full read checks)."""
    legacy_at, unknown_at = stored_prescan(events, KNOWN_EVENT_TYPES)
    if legacy_at >= 0:
        return False
    return all(event.get("type") in KNOWN_EVENT_TYPES or event.get("ignorable") is True
               for event in events[unknown_at:unknown_at + 1])


def _read_ranged(persistence: Persistence, session_id: str, handle: ReadsRanges
                 ) -> StoredPages | None:
    """The paged read of a log without a restore point: its tail, and ranges paged in.

    None when the log is short (a full read costs what this does) or anything is in doubt.
    """
    last = handle.last_stored_seq()
    if last < RANGED_MIN_EVENTS:
        return None
    offset = last + 1 - TAIL_EVENTS
    cold = handle.read(offset)  # type: ignore[attr-defined]
    header = cold.header
    if (cold.torn is not None or not cold.events or cold.events[0].get("seq") != offset
            or header.get("id") != session_id or header.get("version") != SESSION_FORMAT_VERSION
            or not _plain(cold.events)):
        return None
    source = handle.range_source(offset)
    if source is None:
        return None
    events = PagedLog(_CheckedSource(source, persistence, session_id))
    events.extend(cold.events)
    return StoredPages(header=header, events=events, closers=(), torn=None,
                       revision=cold.revision, paged=True)


class _CheckedSource:
    """A range source whose pages pass the full read's checks, else are served by a full read.

    A page holding a legacy shape or an unknown type not marked ignorable, or one the source
    cannot read (``LogCorruptError``: a sealed range that differs, a line that does not
    decode), makes the whole log read through the cold-read pipeline once (what a full read
    gives: normalised events, or the error naming the damage with its line and seq); every
    later page is served from that read.
    """

    def __init__(self, source: EventSource, persistence: Persistence, session_id: str) -> None:
        self._source = source
        self._persistence = persistence
        self._id = session_id
        self._full: Sequence[Event] | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._source)

    def read(self, start: int, stop: int) -> Sequence[Event]:
        if self._full is None:
            try:
                page: Sequence[Event] | None = self._source.read(start, stop)
            except LogCorruptError:  # the full read names the damage (or reads a new log)
                page = None
            if page is not None and _plain(page):
                return page
            with self._lock:
                if self._full is None:
                    self._full = self._persistence.read(self._id).stored_events
        return self._full[start:stop]


def readable_prefix(persistence: Persistence, session_id: str, *,
                    limit_bytes: int = 256 * 1024 * 1024) -> tuple[Event, ...]:
    """The committed events of ``session_id`` readable before its first damage (never raises).

    A log that reads is its committed events. A raw JSONL log the full read refuses at a line
    gives the events of the lines before it, each decoded on its own (a packed line gives its
    members) and stopping at the first line that does not decode or whose seq is not the next
    one. Any other refusal gives ``()``, as does a file larger than ``limit_bytes``.
    Rule: docs/view.md#damaged-sessions.
    """
    try:
        return persistence.read(session_id).stored_events
    except DshError as error:
        path, line = error.where.get("path"), error.where.get("line")
    if not (isinstance(path, str) and path.endswith(".jsonl") and type(line) is int and line > 1):
        return ()
    try:
        if os.stat(path).st_size > limit_bytes:
            return ()
        with open(path, "rb") as file:
            data = file.read()
    except OSError:
        return ()
    from dsh.session import decode_storage_record  # (a JSONL log's salvage only)
    events: list[Event] = []
    for raw in data.split(b"\n")[1:line - 1]:
        try:
            decoded = decode_storage_record(loads(raw))
        except (DshError, ValueError):
            break
        for item in decoded:
            if not isinstance(item, Event) or item.get("seq") != len(events):
                return tuple(events)
            events.append(item)
    return tuple(events)

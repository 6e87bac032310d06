"""What the viewer reads of a store: the one seam between ``dsh view`` and the library.

Every read of the viewer goes through :class:`ViewStore`, and it through the library's public
API only: a :class:`dsh.Store` (``dsh.open``) and its read-only methods: ``list`` (the store's
listing index, never the logs), ``pages`` (one session opened by page: O(tail) through its
restore point, or by seq range), ``readable_prefix`` (what a damaged log still shows),
``header``, ``exists`` and ``tail`` (live pages, every backend); plus fork families and the
common prefix of two branches. Nothing here writes to the store or takes a writer's lock.

Invariants this module owns: a page of a session costs the events of the page (plus the
transcript's bounded look back and ahead), not the log; a damaged session never raises out of
:meth:`ViewStore.open_session` without the error that names the damage (file, line, seq).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import dsh
from dsh import DshError, Event, SessionNotFoundError
from dsh.json import FrozenDict
from dsh.persistence import (
    NamesFiles,
    ReadsRanges,
    SearchResults,
    StampsChanges,
    StoredPages,
    message_texts,
    signature,
)
from dsh.rights import REDACTION_APPLIED
from dsh.transcript import ModelRequest

_FULL_READ_TTL_S: Final = 5.0
"""How long a session read in full (no restore point) is kept for the next page (seconds),
while its log's stamp (:meth:`ViewStore._stamp`) is unchanged."""

_FULL_READ_CACHE: Final = 2
"""Sessions read in full kept at once (the page being read and the one before)."""

_LISTING_TTL_S: Final = 5.0
"""How long a listing is reused (seconds; one page view asks for it several times), and only
while the store's change stamp (:meth:`ViewStore._store_stamp`) is unchanged."""

_FOLDS_KEPT: Final = 4
"""Model views kept (the latest answered, any session) for the next one to continue from."""

_REWRITE_LOOKAHEAD: Final = 4096
"""Events appended since a kept model view was folded that are searched for a rewrite's record;
a log grown by more is folded anew rather than read that far (docs/view.md#the-model-view)."""


def _rewrites_since(events: Sequence[Event], lengths: Iterable[int]) -> Callable[[int], bool]:
    """Tell, for each of ``lengths``, whether the log may have been rewritten since then.

    The answer ``rewritten(length)``: whether ``events`` may have been rewritten since the log
    held ``length`` events; one look at the events past the shortest of ``lengths`` serves all.

    A rewrite (redaction, erasure) appends its ``redaction/applied`` record after the events
    it replaced, so one among the events past ``length`` says so; a log shorter than it was is
    not the same log. A log grown by more than :data:`_REWRITE_LOOKAHEAD` events counts as
    rewritten (its view is folded anew) instead of being paged in that far.
    """
    count = len(events)
    low = min((n for n in lengths if 0 <= count - n <= _REWRITE_LOOKAHEAD), default=count)
    tail = events[low:]
    last = next((low + i for i in range(len(tail) - 1, -1, -1)
                 if tail[i]["type"] == REDACTION_APPLIED), -1)  # the latest rewrite's seq
    return lambda length: not 0 <= count - length <= _REWRITE_LOOKAHEAD or last >= length


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionInfo:
    """One session as the listing shows it (no log is read to make it).

    Attributes:
        id: Session id.
        title: Last ``session/title``, else the first prompt's first line, else None.
        source: ``dsh`` for a native log, else the importer's format name.
        cwd: Header ``cwd``, or None.
        created_ms: Header ``createdAt`` (epoch ms).
        last_activity_ms: Time of the last event (epoch ms; the later of it and ``created_ms``).
        events: Committed events.
        turns: ``turn/start`` events.
        parent: Header ``parentSession`` (the session it was forked from), or None.
        seed_length: Header ``seedLength`` (events inherited from the parent), or None.
        timed: False when the source had no timestamps.
        first_activity_ms: Time of the first event (epoch ms); ``created_ms`` when the listing
            does not know it.
        model: The model of the session's last request, else of its first answer, or None.
        size_bytes: Bytes the log takes in storage, or None when the store cannot tell
            without reading it.
    """

    id: str
    title: str | None
    source: str
    cwd: str | None
    created_ms: int
    last_activity_ms: int
    events: int
    turns: int
    parent: str | None
    seed_length: int | None
    timed: bool
    first_activity_ms: int = 0
    model: str | None = None
    size_bytes: int | None = None

    @property
    def cut_seq(self) -> int | None:
        """The last parent seq a fork inherited (``seed_length - 1``), or None."""
        return self.seed_length - 1 if self.parent and self.seed_length else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Damage:
    """Why a session (or a page of it) cannot be read: the error and where it is.

    Attributes:
        code: The error's stable code (``LOG_CORRUPT``, ``UNKNOWN_EVENT_TYPE``, ...).
        message: Its one-sentence message.
        path: The file (or database) holding the damage, when known.
        line: The line of the file, when known.
        seq: The seq of the damaged event, when known.
    """

    code: str
    message: str
    path: str | None
    line: int | None
    seq: int | None

    @classmethod
    def of(cls, error: DshError) -> Damage:
        """The damage an error names."""
        where = error.where
        path, line, seq = where.get("path"), where.get("line"), where.get("seq")
        return cls(code=error.code, message=error.message,
                   path=path if isinstance(path, str) else None,
                   line=line if type(line) is int else None,
                   seq=seq if type(seq) is int else None)


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenSession:
    """One session opened for viewing.

    Attributes:
        id: Session id.
        header: The stored header (from the header store when the log cannot be read).
        events: The committed events, element ``i`` at seq ``i`` (paged in where the log has a
            restore point); for a damaged log, the events readable before the damage.
        closers: The crash-repair closers a resume would append (full reads only).
        torn: True when the log ends in a torn tail (left on disk; a resume cuts it).
        paged: True when the events are paged in from storage.
        damage: Why the log cannot be read in full, or None.
        restore: The restore point's state of the paged prefix (for model views: what
            ``dsh.transcript.model_request`` takes as ``restore``), or None.
    """

    id: str
    header: Mapping[str, Any]
    events: Sequence[Event]
    closers: tuple[Event, ...]
    torn: bool
    paged: bool
    damage: Damage | None = None
    restore: Any = None


class ViewStore:
    """The store a viewer shows, opened read-only by URL.

    Args:
        url: A store URL (``sqlite:///path.db``, ``jsonl:///dir``, ``postgresql://...``).

    Raises:
        ConfigError: the URL is malformed.
    """

    def __init__(self, url: str) -> None:
        self._store = dsh.open(url)
        self.url = self._store.url  # a PostgreSQL password is not shown
        self._lock = threading.Lock()
        self._listing_lock = threading.Lock()  # one listing at a time; the others wait for it
        # session -> (when read, the log's stamp then, the read)
        self._full: OrderedDict[str, tuple[float, object, StoredPages]] = OrderedDict()
        # (when listed, the store's change stamp then, the rows, the errors)
        self._listing: tuple[float, object, list[SessionInfo], list[DshError]] | None = None
        # (session, seq) -> (the view, the event at its seq, the log's length when kept)
        self._folds: OrderedDict[tuple[str, int], tuple[ModelRequest, Event, int]] = \
            OrderedDict()

    def close(self) -> None:
        """Close the store (nothing is live in it: nothing to drain)."""
        self._store.close()

    # -- listing ---------------------------------------------------------------------------

    def listing(self) -> tuple[list[SessionInfo], list[DshError]]:
        """Every session with at least one event, and the errors of those that cannot be read.

        From the store's listing index (SQLite tables, the JSONL index beside the logs); an
        unchanged log is not read. Order: most recent activity first.
        """
        with self._listing_lock:
            stamp = self._store_stamp()  # taken before the listing: a later change is seen
            with self._lock:
                cached = self._listing
                if cached is not None and time.monotonic() - cached[0] < _LISTING_TTL_S \
                        and stamp is not None and stamp == cached[1]:
                    return cached[2], cached[3]
            return self._list(stamp)

    def _store_stamp(self) -> object:
        """The store's change stamp, or None: none kept or unreadable (no listing is reused).

        :meth:`dsh.persistence.StampsChanges.change_stamp` of a backend declaring
        ``change_stamp``. Why: a redaction or erasure in another process must not leave the
        erased title on a running viewer's pages (docs/forgetting.md#what-a-running-viewer-shows).
        """
        backend = self._store.persistence.backend
        if not backend.capabilities.change_stamp:
            return None
        try:
            return cast(StampsChanges, backend).change_stamp()
        except DshError:  # the listing that follows names what is wrong
            return None

    def _list(self, stamp: object) -> tuple[list[SessionInfo], list[DshError]]:
        errors: list[DshError] = []
        entries = self._store.list(errors=errors)
        infos = []
        for entry in entries:
            header = entry.header
            created = header.get("createdAt")
            created = created if type(created) is int else 0
            title = entry.title or entry.first_prompt
            parent = header.get("parentSession")
            seed = header.get("seedLength")
            cwd = header.get("cwd")
            infos.append(SessionInfo(
                id=entry.id, title=" ".join(title.split()) if title else None,
                source=entry.source_format, cwd=cwd if isinstance(cwd, str) else None,
                created_ms=created, last_activity_ms=max(entry.last_activity_ms, created),
                events=entry.events, turns=entry.turns,
                parent=parent if isinstance(parent, str) else None,
                seed_length=seed if type(seed) is int else None, timed=entry.timed,
                first_activity_ms=entry.first_activity_ms if entry.first_activity_ms
                is not None else created, model=entry.model, size_bytes=entry.size_bytes))
        infos.sort(key=lambda i: (-i.last_activity_ms, i.id))
        with self._lock:
            self._listing = (time.monotonic(), stamp, infos, errors)
        return infos, errors

    def info(self, session_id: str, *, read: bool = True) -> SessionInfo | None:
        """The listing row of ``session_id``, or None when it is not listed.

        Args:
            session_id: The session.
            read: List the store when no listing is at hand; False answers only from the
                last listing made (a session page must not wait for the whole store's listing:
                SQLite computes it from its tables, 2.8 s beside a 1M-event session), and only
                while the store's change stamp is the one it was made under (a row listed
                before a redaction may hold the erased title).
        """
        if read:
            infos, _ = self.listing()
        else:
            stamp = self._store_stamp()
            with self._lock:
                kept = self._listing
            infos = kept[2] if kept is not None and stamp is not None and stamp == kept[1] \
                else []
        return next((i for i in infos if i.id == session_id), None)

    def exists(self, session_id: str) -> bool:
        """Whether the store holds ``session_id`` (an id no backend can store never is).

        Something the store refuses where the log belongs (a symlink, a FIFO, a folder) counts
        as held: opening it shows a page naming the damage (docs/view.md#damaged-sessions).
        """
        try:
            return self._store.exists(session_id)
        except SessionNotFoundError:
            return False
        except DshError:
            return True

    def search(self, query: str, *, limit: int = 100) -> SearchResults:
        """The messages of every session holding the words of ``query`` (the store's index).

        Raises:
            PersistenceError: the store cannot be listed.
        """
        return self._store.search(query, limit=limit)

    def header(self, session_id: str) -> FrozenDict | None:
        """The stored header of ``session_id`` (no log read), or None."""
        return self._store.header(session_id)

    # -- one session -----------------------------------------------------------------------

    def open_session(self, session_id: str) -> OpenSession:
        """Open ``session_id`` for viewing, by page where it can.

        A log that cannot be read is still opened: its header, the events readable before
        the damage (raw JSONL logs), and :attr:`OpenSession.damage` naming it.

        Raises:
            SessionNotFoundError: no such session.
        """
        if not self.exists(session_id):
            raise SessionNotFoundError(f"no session {session_id!r} in store {self.url}",
                                       session_id=session_id)
        now = time.monotonic()
        stamp = self._stamp(session_id)  # taken before any read: a later change is seen
        with self._lock:
            hit = self._full.get(session_id)
        if (hit is not None and now - hit[0] < _FULL_READ_TTL_S and stamp is not None
                and stamp == hit[1]):
            return _opened(session_id, hit[2])
        try:
            pages = self._store.pages(session_id)
        except SessionNotFoundError:
            raise
        except DshError as error:
            return self._damaged(session_id, error)
        if not pages.paged and stamp is not None:
            with self._lock:
                self._full[session_id] = (time.monotonic(), stamp, pages)
                self._full.move_to_end(session_id)
                while len(self._full) > _FULL_READ_CACHE:
                    self._full.popitem(last=False)
        return _opened(session_id, pages)

    def _stamp(self, session_id: str) -> object:
        """What changes whenever ``session_id``'s stored log does, read cheaply; None: unknown.

        A log file's size, mtime, ctime and inode (one ``stat``: an append grows it, a
        redaction's or erasure's rewrite renames a new file over it); else the last stored
        seq (one indexed look-up: every rewrite appends its ``redaction/applied`` record, and
        every append moves it). A read kept under a stamp is reused only while the stamp is
        the same (docs/view.md#the-model-view).
        """
        try:
            with self._store.persistence.open(session_id, "read") as handle:
                if isinstance(handle, NamesFiles):
                    return tuple(signature(os.stat(handle.path)))
                if isinstance(handle, ReadsRanges):
                    return handle.last_stored_seq()
        except (DshError, OSError):  # the full read that follows names what is wrong
            return None
        return None

    def folded(self, session_id: str, events: Sequence[Event], seq: int) -> ModelRequest | None:
        """The kept model view of ``session_id`` nearest before ``seq`` that still holds, or None.

        What :func:`dsh.transcript.model_request` takes as ``since``: the fold continues from
        it instead of from seq 0 (docs/view.md#the-model-view). A kept view holds only while
        the log still holds the event it was folded to and was not rewritten since: a
        redaction or erasure keeps every seq (tombstones) but appends its
        ``redaction/applied`` record, so a view kept from before it (which may hold the erased
        system prompt, tools or messages) is folded anew, never shown again.
        """
        with self._lock:
            kept = [(key[1], value) for key, value in self._folds.items()
                    if key[0] == session_id and key[1] <= seq]
        try:
            rewritten: Callable[[int], bool] | None = _rewrites_since(
                events, (length for _, (_, _, length) in kept)) if kept else None
        except DshError:
            rewritten = None
        for at, (request, event, length) in sorted(kept, key=lambda item: -item[0]):
            try:
                holds = rewritten is not None and at < len(events) and events[at] == event \
                    and not rewritten(length)
            except DshError:
                holds = False
            if holds:
                return request
            with self._lock:
                self._folds.pop((session_id, at), None)
        return None

    def keep_fold(self, session_id: str, request: ModelRequest, events: Sequence[Event]) -> None:
        """Keep ``request``, folded from ``events`` (the log as read), for :meth:`folded`."""
        with self._lock:
            key = (session_id, request.seq)
            self._folds[key] = (request, events[request.seq], len(events))
            self._folds.move_to_end(key)
            while len(self._folds) > _FOLDS_KEPT:
                self._folds.popitem(last=False)

    def _damaged(self, session_id: str, error: DshError) -> OpenSession:
        damage = Damage.of(error)
        try:
            header = self.header(session_id) or FrozenDict({"id": session_id})
            events = self._store.readable_prefix(session_id)
        except DshError:  # nothing readable where the log belongs: the damage says why
            header, events = FrozenDict({"id": session_id}), ()
        return OpenSession(id=session_id, header=header, events=events, closers=(),
                           torn=False, paged=False, damage=damage)

    def tail(self, session_id: str, from_seq: int) -> AsyncIterator[Event]:
        """The store's tail of ``session_id`` from ``from_seq`` on (every backend).

        Raises:
            ConfigError, SessionNotFoundError, LogCorruptError: see :meth:`dsh.Store.tail`.
        """
        return self._store.tail(session_id, from_seq)

    # -- trees -----------------------------------------------------------------------------

    def family(self, session_id: str) -> tuple[SessionInfo | None, dict[str, list[SessionInfo]]]:
        """The fork tree ``session_id`` belongs to: its root and each id's children.

        Returns:
            ``(root, children)``: the oldest listed ancestor (None when the session is not
            listed) and ``parent id -> children`` (oldest first) for the whole store.
        """
        infos, _ = self.listing()
        by_id = {i.id: i for i in infos}
        children: dict[str, list[SessionInfo]] = {}
        for info in infos:
            if info.parent is not None:
                children.setdefault(info.parent, []).append(info)
        for kids in children.values():
            kids.sort(key=lambda i: (i.created_ms, i.id))
        node = by_id.get(session_id)
        seen = set()
        while node is not None and node.parent is not None and node.parent in by_id \
                and node.id not in seen:
            seen.add(node.id)
            node = by_id[node.parent]
        return node, children


def _opened(session_id: str, pages: StoredPages) -> OpenSession:
    return OpenSession(id=session_id, header=pages.header, events=pages.events,
                       closers=pages.closers, torn=pages.torn is not None, paged=pages.paged,
                       restore=pages.restore)


def common_prefix(a: Sequence[Event], b: Sequence[Event], *, hint: int | None = None,
                  limit: int = 200_000) -> int:
    """The number of leading events two logs share (equal type, time, data, envelope).

    Args:
        a: One log (element ``i`` at seq ``i``).
        b: The other.
        hint: Where they are expected to part (a fork's ``seedLength``): checked first, so a
            fork's prefix costs one comparison, not the prefix's length.
        limit: Events compared at most when there is no usable hint.
    """
    count = min(len(a), len(b))
    if hint is not None and 0 < hint <= count and a[hint - 1] == b[hint - 1] and (
            hint == count or a[hint] != b[hint]):
        return hint
    index = 0
    while index < min(count, limit) and a[index] == b[index]:
        index += 1
    return index


def iter_text(events: Sequence[Event], start: int = 0) -> Iterator[tuple[int, str, str]]:
    """Yield ``(seq, role, text)`` of each appended message from ``start`` on (for search).

    The same text the store's search index holds (:func:`dsh.persistence.message_texts`).
    """
    return message_texts(events[seq] for seq in range(start, len(events)))

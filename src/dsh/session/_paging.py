"""Paged-in logs: a session log whose events before a cut live in storage, not in memory.

After an O(tail) resume (docs/rules.md#restore-points-are-never-the-truth) the core holds only the
tail; the events before the cut are read on demand from an :class:`EventSource` that persistence
hands to it, so ``session/``
itself stays free of I/O. Invariants this module owns:

* the events before the cut never change (only the single writer appends, and only after it),
  so a page read once is the answer forever; pages are kept in a small LRU, never all of them;
* every paged-in event is checked to carry the seq of its position, so a source that serves
  the wrong bytes is refused (``LogCorruptError``) rather than answered with a wrong event;
* readers on several threads share the page cache without a lock (the core never blocks):
  a page another reader evicts meanwhile is still the right page, only its LRU place is lost;
  sources guard their own state;
* a reader that knows which few events it will index (an adapter's index names them) may have
  just those read in one source call (:meth:`PagedLog.pick`, a source that
  :class:`PicksEvents`): each comes back checked to carry the seq asked for, and is served
  before any page (at most :data:`PICKED_EVENTS` held);
* a reader that wants the last events of a few types (the recorder's last ``turn/start``)
  walks back by type (:meth:`PagedLog.select_back`): from a source that
  :class:`SelectsTypes`, each window is checked as a page-in and only those events decoded.
"""

from __future__ import annotations

import bisect
import contextlib
from collections import OrderedDict
from collections.abc import Callable, Collection, Container, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, Protocol, overload, runtime_checkable

from dsh._errors import LogCorruptError
from dsh.json import c_seqs_contiguous
from dsh.session._events import Event

PAGE_EVENTS: Final = 256
"""Events per page read from a source (one read serves a whole page)."""

_CACHED_PAGES: Final = 32  # resident pages at most: O(pages) memory, not O(log)

PICKED_EVENTS: Final = 4096
"""Events read one by one (:meth:`PagedLog.pick`) held at most; beyond, the older ones go."""

PICK_EVENTS: Final = 8192
"""Seqs per window of :meth:`PagedLog.items_at` from a source that :class:`PicksRanges`: a
window's picked events are held at once, then dropped, so memory stays bounded whatever the
log's length."""


class EventSource(Protocol):
    """Where the events before an O(tail) resume's cut are read from (storage, by seq).

    ``len(source)`` is the cut: the source serves seqs ``0 .. len - 1`` and never changes.
    ``read(start, stop)`` returns the events with ``start <= seq < stop`` in seq order
    (``0 <= start <= stop <= len``). It may raise a ``DshError`` (the log became unreadable).
    It is called from whichever thread reads the session, possibly while the writer appends
    after the cut.
    """

    def __len__(self) -> int:
        """The number of events the source serves (the cut)."""

    def read(self, start: int, stop: int) -> Sequence[Event]:
        """Return the events with ``start <= seq < stop``, in order."""


@runtime_checkable
class PicksEvents(Protocol):
    """A source that reads a few events by seq in one call, without their pages.

    ``read_events(seqs)`` gets ascending seqs below the cut and returns ``{seq: event}`` for
    each, checked as a page read checks its events; it may raise a ``DshError``.
    """

    def read_events(self, seqs: Sequence[int]) -> Mapping[int, Event]:
        """The events at ``seqs`` (ascending, below the cut), by seq."""
        ...


@runtime_checkable
class PicksRanges(Protocol):
    """An :class:`EventSource` that can decode only some events of a range (a surface's nodes).

    ``read_picked(start, stop, seqs)`` returns the frozen events whose seqs are ``seqs``
    (ascending, each in ``start <= seq < stop <= len(source)``), in that order, after checking
    every stored byte or row of the range against the log's integrity as ``read`` does
    (docs/rules.md#verified-page-in); the events not picked are checked, not decoded. None
    when the source cannot vouch for the whole range that way (the caller pages it in with
    ``read``). It may raise a ``DshError`` as ``read`` does.
    """

    def __len__(self) -> int:
        """The number of events the source serves (the cut)."""

    def read(self, start: int, stop: int) -> Sequence[Event]:
        """Return the events with ``start <= seq < stop``, in order."""

    def read_picked(self, start: int, stop: int, seqs: Sequence[int]) -> Sequence[Event] | None:
        """The events at ``seqs`` of ``start <= seq < stop`` (see the class), or None."""


SELECT_BACK_FIRST: Final = 32
"""Events the first storage read of :meth:`PagedLog.select_back` covers, back from the cut;
each next read covers eight times more (at most :data:`PICK_EVENTS`). A turn's brackets are
usually within a few dozen events of the end: the first read finds them."""


@runtime_checkable
class SelectsTypes(Protocol):
    """A source that serves the events of some types of a range for the cost of a check.

    ``read_selected(start, stop, seqs, types)`` returns the events of ``start <= seq < stop``
    whose seq is in ``seqs`` or type in ``types``, in seq order, after checking every stored
    row of the range as ``read`` does (docs/rules.md#verified-page-in); None when it cannot
    vouch for part of the range that way. It may raise a ``DshError`` as ``read`` does.
    """

    def read_selected(self, start: int, stop: int, seqs: Container[int],
                      types: Container[str]) -> Sequence[Mapping[str, Any]] | None:
        """The selected events of ``start <= seq < stop`` (see the class), or None."""
        ...


class PagedLog(Sequence[Event]):
    """A log list whose first ``cut`` events are paged in from a source; the rest are held.

    It offers what ``Session`` uses of its ``list`` (``len``, indexing with negatives, slices
    returning lists, iteration, ``append``, ``extend``), so the session code is the same for a
    resident and a paged log. Appends go to the resident tail.

    Args:
        source: Serves seqs ``0 .. len(source) - 1``.
    """

    __slots__ = ("_cut", "_damage", "_last", "_pages", "_picked", "_source", "_tail")

    def __init__(self, source: EventSource) -> None:
        self._source = source
        self._damage: LogCorruptError | None = None
        self._cut = len(source)
        self._tail: list[Event] = []
        self._pages: OrderedDict[int, Sequence[Event]] = OrderedDict()
        self._picked: dict[int, Event] = {}  # events read by pick(), served before pages
        # (types, seq): the last event below the cut of one of those types is at seq (-1: none)
        self._last: tuple[frozenset[str], int, bool] | None = None

    @property
    def source(self) -> EventSource:
        """Where the events before the cut are read from."""
        return self._source

    @property
    def damage(self) -> LogCorruptError | None:
        """The first :class:`LogCorruptError` a read of the source raised, or None.

        Set when a page-in, a pick or a selection found the stored log changed under the
        session (a row its seal no longer vouches for, events that do not match): whoever
        writes the session writes nothing more (docs/rules.md#verified-page-in). Not set by
        ``RESTORE_POINT_MISMATCH`` (a wrong restore point, not a damaged log: docs/errors.md).
        """
        return self._damage

    def noting_damage(self) -> contextlib.AbstractContextManager[None]:
        """A context that notes a :class:`LogCorruptError` raised inside it as :attr:`damage`.

        For a reader that reads this log's source itself (an adapter's selective read of the
        whole history, ``read_selected`` over long ranges): what its checks find is noted as a
        page-in's is, so whoever writes after it knows (docs/rules.md#verified-page-in). The
        error is raised on; ``RESTORE_POINT_MISMATCH`` is not noted (see :attr:`damage`).
        """
        return self._noting_damage()

    @contextlib.contextmanager
    def _noting_damage(self) -> Iterator[None]:
        try:
            yield
        except LogCorruptError as exc:
            # a wrong restore point (its page-in index) is not damage of the log: restore
            # points are never the truth (docs/rules.md), so the writer keeps writing
            if self._damage is None and exc.code != "RESTORE_POINT_MISMATCH":
                self._damage = exc
            raise

    @property
    def cut(self) -> int:
        """Events served by the source (seqs below it are paged in)."""
        return self._cut

    @property
    def resident_events(self) -> int:
        """Events held in memory now: the tail plus the cached pages (for tests and benches)."""
        # list() of the values is one C call: no other thread runs inside it
        return (len(self._tail) + sum(map(len, list(self._pages.values())))
                + len(self._picked))

    def __len__(self) -> int:
        return self._cut + len(self._tail)

    def append(self, event: Event) -> None:
        """Append one event after the last (to the resident tail)."""
        self._tail.append(event)

    def appender(self) -> Callable[[Event], None]:
        """The tail's own ``append`` (a bulk admission skips one call per event)."""
        return self._tail.append

    def extend(self, events: Iterable[Event]) -> None:
        """Append events after the last, in order."""
        self._tail.extend(events)

    def drop_pages(self) -> None:
        """Forget the cached pages (a source that serves other envelopes from now on)."""
        self._pages.clear()
        self._picked.clear()

    def pick(self, seqs: Iterable[int]) -> None:
        """Read the events at ``seqs`` below the cut in few source calls, to index them next.

        Seqs whose page is cached, or that were picked before, are not read again. A source
        that :class:`PicksEvents` reads them in one call; one that :class:`PicksRanges` (SQLite,
        JSONL) reads each run of them (seqs less than :data:`PAGE_EVENTS` apart, see
        :meth:`_pick_runs`) as one range
        whose every row is checked as a page-in checks it (docs/rules.md#verified-page-in)
        and only the picked events decoded, a run it cannot vouch for that way being paged in
        as ever; any other source reads nothing here (indexing pages them in as ever). What is
        held stays at most :data:`PICKED_EVENTS` events.

        Raises:
            LogCorruptError: the source served an event with another seq, or none, for a seq
                asked for (see the module invariants); any error the source raises.
        """
        source = self._source
        # (getattr first: the runtime protocol tests cost tens of µs each)
        read_picked: Callable[[int, int, Sequence[int]], Sequence[Event] | None] | None = \
            getattr(source, "read_picked", None)  # PicksRanges.read_picked
        picks_events = getattr(source, "read_events", None) is not None \
            and isinstance(source, PicksEvents)
        if not picks_events and read_picked is None:
            return
        pages, picked, cut = self._pages, self._picked, self._cut
        wanted = sorted({seq for seq in seqs if 0 <= seq < cut and seq not in picked
                         and seq // PAGE_EVENTS not in pages})
        if not wanted:
            return
        if not picks_events:
            assert read_picked is not None
            self._pick_runs(read_picked, wanted)
            return
        assert isinstance(source, PicksEvents)
        with self._noting_damage():
            found = source.read_events(wanted)
            for seq in wanted:
                event = found.get(seq)
                if event is None or event.get("seq") != seq:
                    got = "none" if event is None else f"seq {event.get('seq')}"
                    raise LogCorruptError(f"the event picked at seq {seq} does not match the log "
                                          f"it was cut from (got {got}); the log changed under "
                                          "the session, resume it again", seq=seq)
        self._hold({seq: found[seq] for seq in wanted})

    def _pick_runs(self, read_picked: Callable[[int, int, Sequence[int]],
                                               Sequence[Event] | None],
                   wanted: list[int]) -> None:
        """:meth:`pick` from a source that picks ranges: one ``read_picked`` per run of seqs.

        A run's seqs are less than :data:`PAGE_EVENTS` apart, so it reads (and checks) no
        more rows than the pages holding them would, and span less than :data:`PICK_EVENTS`
        (the rows one read holds at once stay bounded); a run the source does not vouch for
        (None) is left to be paged in.
        """
        runs: list[list[int]] = []
        for seq in wanted:
            if runs and seq - runs[-1][-1] < PAGE_EVENTS and seq - runs[-1][0] < PICK_EVENTS:
                runs[-1].append(seq)
            else:
                runs.append([seq])
        for run in runs:
            found = self._read_picked(read_picked, run[0], run[-1] + 1, run)
            if found is not None:
                self._hold(dict(zip(run, found, strict=True)))

    def _read_picked(self, read_picked: Callable[[int, int, Sequence[int]],
                                                 Sequence[Event] | None],
                     start: int, stop: int, wanted: list[int]) -> Sequence[Event] | None:
        """``read_picked(start, stop, wanted)``, its damage noted, its events checked by seq.

        Returns None when the source does not vouch for the range (the caller pages it in).

        Raises:
            LogCorruptError: the source served other events than ``wanted`` (the log changed
                under the session), or found a row its seal no longer vouches for.
        """
        with self._noting_damage():
            found = read_picked(start, stop, wanted)
            if found is not None and (len(found) != len(wanted)
                                      or [e.get("seq") for e in found] != wanted):
                raise LogCorruptError(f"picked events {start}..{stop - 1} do not match the "
                                      f"log they were cut from (got {len(found)} of "
                                      f"{len(wanted)}); the log changed under the session, "
                                      "resume it again", seq=start)
        return found

    def _hold(self, found: Mapping[int, Event]) -> None:
        """Hold ``found`` (checked events by seq) as picked, at most :data:`PICKED_EVENTS`."""
        picked = self._picked
        if len(picked) + len(found) > PICKED_EVENTS:
            picked.clear()  # another reader may still index them: it pages them in then
        picked.update(found)

    def settle(self, count: int) -> None:
        """Hand the first ``count`` tail events over to the source, which now serves them.

        For a source that grows as its events are stored (a streamed seed, whose admitted
        batches are written before the next one comes): memory stays O(page cache).
        """
        if count <= 0:
            return
        self._pages.pop(self._cut // PAGE_EVENTS, None)  # a short last page grows now
        self._cut += count
        del self._tail[:count]

    def _page(self, number: int) -> Sequence[Event]:
        pages = self._pages
        page = pages.get(number)
        if page is not None:
            with contextlib.suppress(KeyError):  # evicted by another reader meanwhile
                pages.move_to_end(number)
            return page
        start = number * PAGE_EVENTS
        stop = min(self._cut, start + PAGE_EVENTS)
        with self._noting_damage():
            page = self._source.read(start, stop)
            if len(page) != stop - start or not (
                    c_seqs_contiguous(page, start) if c_seqs_contiguous is not None
                    and type(page) in (list, tuple) else
                    all(event.get("seq") == start + offset for offset, event in enumerate(page))):
                raise LogCorruptError(f"paged-in events {start}..{stop - 1} do not match the "
                                      f"log they were cut from (got {len(page)} events); the "
                                      "log changed under the session, resume it again",
                                      seq=start)
        pages[number] = page
        while len(pages) > _CACHED_PAGES:
            try:
                pages.popitem(last=False)
            except KeyError:  # another reader emptied it meanwhile
                break
        return page

    def items_at(self, seqs: Iterable[int]) -> Iterator[tuple[int, Event]]:
        """Yield ``(seq, event)`` for ascending ``seqs`` below the cut, each page read once.

        Where the source picks ranges (:class:`PicksRanges`), each :data:`PICK_EVENTS`
        window is read once and only its asked-for events are decoded (a surface spanning the
        log skips the brackets and calls between its nodes); a window the source cannot vouch
        for that way is paged in. Nothing picked enters the page cache. (A source that only
        :class:`PicksEvents`, PostgreSQL's, is paged: its one-statement picks measured no
        faster for a whole surface.)

        Raises:
            LogCorruptError: a page or a picked window does not match the log (see the
                module invariants).
        """
        source = self._source
        if isinstance(source, PicksRanges):
            yield from self._windows(source, seqs if isinstance(seqs, list) else list(seqs))
            return
        yield from self._paged(seqs)

    def _windows(self, source: PicksRanges, seqs: list[int]) -> Iterator[tuple[int, Event]]:
        index, count = 0, len(seqs)
        while index < count:
            start = seqs[index] - seqs[index] % PICK_EVENTS
            stop = min(self._cut, start + PICK_EVENTS)
            end = bisect.bisect_left(seqs, stop, index)
            wanted = seqs[index:end]
            if not wanted or wanted[-1] >= self._cut:
                raise IndexError(f"seq {seqs[index]} is not below the cut {self._cut}")
            picked = self._read_picked(source.read_picked, start, stop, wanted)
            if picked is None:
                yield from self._paged(wanted)
            else:
                yield from zip(wanted, picked, strict=True)
            index = end

    def lone(self, index: int) -> Event:
        """The event at ``index`` (``0 <= index < len``) for a reader that wants it alone.

        Below the cut, outside the cached pages and the picked events, a source that
        :class:`PicksRanges` reads the rows of that event alone, checked against every seal
        record they touch as a page-in checks them (docs/rules.md#verified-page-in), and
        decodes only it; it is then held as a picked event (see :meth:`pick`). Otherwise
        this is ``self[index]``. (A page costs 256 rows decoded for one event: a writer's
        first append looks at the last surface node only.)

        Raises:
            IndexError: ``index`` is outside the log.
            LogCorruptError: the source served another event, or its check failed.
        """
        tail, at = self._tail, index - self._cut
        if 0 <= at < len(tail):  # the resident tail, what an append's pairing check reads
            return tail[at]
        picked = self._picked
        # (getattr, not isinstance of the runtime protocol: that test costs tens of µs)
        read_picked: Callable[[int, int, Sequence[int]], Sequence[Event] | None] | None = \
            getattr(self._source, "read_picked", None)  # PicksRanges.read_picked
        if 0 <= index < self._cut and index // PAGE_EVENTS not in self._pages \
                and index not in picked and read_picked is not None:
            with self._noting_damage():
                found = read_picked(index, index + 1, [index])
                if found is not None and (len(found) != 1 or found[0].get("seq") != index):
                    raise LogCorruptError(f"the event read alone at seq {index} does not "
                                          "match the log it was cut from; the log changed "
                                          "under the session, resume it again", seq=index)
            if found is not None:
                self._hold({index: found[0]})
                return found[0]
        return self[index]

    def note_last(self, types: Collection[str], seq: int, *, alone: bool) -> None:
        """Note that the last event below the cut whose type is in ``types`` is at ``seq``.

        ``seq`` is -1 when no event of ``types`` is below the cut. What the restore point's
        state says of the prefix (``turnBoundary``, ``turnOpen``: docs/formats.md#restore-points),
        for :meth:`select_back` of exactly these ``types``: it reads nothing below the cut for
        -1; with ``alone`` (the caller's walk stops at that event: a ``turn/start``) it reads
        that one event alone (:meth:`lone`), else its windows start at ``seq``, not the cut.

        Raises:
            ValueError: ``seq`` is not -1 or a seq below the cut.
        """
        if type(seq) is not int or not -1 <= seq < self._cut:
            raise ValueError(f"seq {seq!r} is not -1 or below the cut {self._cut}")
        self._last = (frozenset(types), seq, alone)

    def select_back(self, types: Collection[str], stop: int | None = None
                    ) -> Iterator[Mapping[str, Any]]:
        """Yield the events below ``stop`` (default: all) whose type is in ``types``, newest first.

        The resident tail is walked in memory. Below the cut, storage is read back from the
        cut in windows (:data:`SELECT_BACK_FIRST` events first, then eight times more each,
        at most :data:`PICK_EVENTS`), as far as the caller iterates: from a source that
        :class:`SelectsTypes`, each window is read once, every row of it checked as a
        page-in checks it (docs/rules.md#verified-page-in), and only the events of ``types``
        decoded; a window whose pages are cached, or that the source cannot vouch for that
        way, is paged in. Nothing selected enters the page cache.

        Raises:
            LogCorruptError: a window's events do not match the log (a seq outside it or out
                of order, another type), or its page-in check failed.
        """
        stop = len(self) if stop is None else min(stop, len(self))
        cut = self._cut
        for index in range(stop - cut - 1, -1, -1):
            event = self._tail[index]
            if event["type"] in types:
                yield event
        high, size = min(stop, cut), SELECT_BACK_FIRST
        last = self._last
        if last is not None and high == cut and last[0] == frozenset(types):
            # the noted last event of these types: nothing of them lies above it below the cut
            if last[1] < 0:
                return
            high = last[1] + 1
            if last[2]:
                event = self.lone(last[1])
                if event["type"] not in types:
                    raise LogCorruptError(
                        f"the event at seq {last[1]} is a {event['type']!r}, not the last of "
                        "the types the restore point's state names; the log changed under the "
                        "session, resume it again", seq=last[1])
                yield event
                high = last[1]
        while high > 0:
            low = max(0, high - size)
            yield from reversed(self._selected(low, high, types))
            high, size = low, min(size * 8, PICK_EVENTS)

    def _selected(self, low: int, high: int, types: Collection[str]
                  ) -> Sequence[Mapping[str, Any]]:
        """The events of ``types`` in ``low <= seq < high`` (below the cut), in seq order."""
        pages = self._pages
        cached = all(number in pages
                     for number in range(low // PAGE_EVENTS, (high - 1) // PAGE_EVENTS + 1))
        # (getattr, not isinstance of the runtime protocol: that test costs tens of µs)
        read_selected: Callable[[int, int, Container[int], Container[str]],
                                Sequence[Mapping[str, Any]] | None] | None = \
            getattr(self._source, "read_selected", None)  # SelectsTypes.read_selected
        if not cached and read_selected is not None:
            with self._noting_damage():
                found = read_selected(low, high, (), types)
                previous = low - 1
                for event in found or ():
                    seq = event.get("seq")
                    if type(seq) is not int or not previous < seq < high \
                            or event.get("type") not in types:
                        raise LogCorruptError(
                            f"events selected by type from {low}..{high - 1} do not match "
                            f"the log they were cut from (got seq {seq!r}, type "
                            f"{event.get('type')!r}); the log changed under the session, "
                            "resume it again", seq=low)
                    previous = seq
            if found is not None:
                return found
        return [event for event in self._range(low, high) if event["type"] in types]

    def _paged(self, seqs: Iterable[int]) -> Iterator[tuple[int, Event]]:
        size = PAGE_EVENTS
        number, page = -1, None
        for seq in seqs:
            if seq // size != number:
                number = seq // size
                page = self._page(number)
            assert page is not None
            yield seq, page[seq - number * size]

    def _range(self, start: int, stop: int) -> list[Event]:
        out: list[Event] = []
        cut = self._cut
        index = start
        while index < min(stop, cut):
            number = index // PAGE_EVENTS
            base = number * PAGE_EVENTS
            page = self._page(number)
            end = min(stop, base + len(page))
            out.extend(page[index - base:end - base])
            index = end
        if stop > cut:
            out.extend(self._tail[max(0, start - cut):stop - cut])
        return out

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1:
                return self._range(start, stop) if start < stop else []
            low, high = (start, stop) if step > 0 else (stop + 1, start + 1)
            if low >= high:
                return []
            return self._range(low, high)[start - low::step]
        length = self._cut + len(self._tail)
        if index < 0:
            index += length
        if not 0 <= index < length:
            raise IndexError(f"event index {index} out of range (log holds {length})")
        if index >= self._cut:
            return self._tail[index - self._cut]
        picked = self._picked
        if picked:
            event = picked.get(index)
            if event is not None:
                return event
        number = index // PAGE_EVENTS
        return self._page(number)[index - number * PAGE_EVENTS]

    def __iter__(self) -> Iterator[Event]:
        for number in range((self._cut + PAGE_EVENTS - 1) // PAGE_EVENTS):
            yield from self._page(number)
        # A tail that grows while it is iterated is seen to its end, as a list iterator would.
        yield from self._tail

    def __repr__(self) -> str:
        return f"PagedLog(cut={self._cut}, tail={len(self._tail)})"

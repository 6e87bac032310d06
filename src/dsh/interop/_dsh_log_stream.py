"""A dsh JSONL log imported as a stream, in memory that does not grow with the log.

The events and refusals are those of :func:`dsh.interop._dsh_log.import_dsh_log`
(docs/interop.md#streaming-imports). The first read checks every line as the whole-file import
does and keeps, per line, its byte offset, first seq and inherited time (three integers), and
the frozen events of its first lines (:data:`HELD_LOG_BYTES`, :data:`HELD_EVENTS`); the log is
then verified by :func:`dsh._verify.verify_paged` over a view that serves those held events and
decodes the later lines again as the checks ask for them (a page's lines in one read), and
handed out :data:`STREAM_BATCH_EVENTS` events at a time (the held ones as they are).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Final

from dsh._errors import ImportFormatError
from dsh.interop._common import (
    ImportBatch,
    JsonlSource,
    JsonObj,
    StreamedSession,
    decode_line,
)
from dsh.interop._dsh_log import (
    FORMAT,
    dsh_log_events,
    dsh_log_header,
    import_dsh_log,
    next_time,
    refusal_of,
    source_event,
)
from dsh.session import Event, PagedLog, Violation

STREAM_BATCH_EVENTS: Final = 5_000
"""Events a streamed dsh log's batch holds (and verification's restore checks at once)."""


class _Lines:
    """Per line after the header: 1-based number, byte offset, first seq, inherited time."""

    def __init__(self) -> None:
        self.numbers = array("q")
        self.offsets = array("q")
        self.seqs = array("q")
        self.times = array("q")


HELD_LOG_BYTES: Final = 12_000_000
"""Bytes of log whose events the first read keeps (frozen) for the checks and the batches.

The checks walk the log about five times; a log within this size (and :data:`HELD_EVENTS`) is
decoded once. Its events take about four times their bytes in memory (48 MB), so a longer log
keeps only its first lines' events and decodes the rest again per walk."""

HELD_EVENTS: Final = 50_000
"""Events the first read keeps at most (a line of packed chunks is a few bytes an event, and
an event takes about a kilobyte in memory however short: 50 MB at most)."""


_READ_BYTES: Final = 4 << 20
"""Bytes :func:`_decoded` reads at once at most, unless one line alone is longer: blank lines
between the records are bytes too, and a run of them must not be read in one piece."""


def _decoded(src: JsonlSource, lines: _Lines, k0: int, k1: int, f: BinaryIO
             ) -> Iterator[tuple[int, list[JsonObj]]]:
    """``(k, plain events)`` of lines ``k0 <= k < k1`` (0 = the first after the header).

    The lines' bytes are read in as few reads as :data:`_READ_BYTES` allows (from a line's
    offset to a later line's, or the end of the checked size); a line whose span to the next
    one is longer (a long line, or blank lines after it) is read alone, to its newline. Each
    line is then decoded as :meth:`JsonlSource.record_at` decodes it.
    """
    offsets, count = lines.offsets, len(lines.offsets)
    path, fmt, numbers, seqs, times = src.path, src.fmt, lines.numbers, lines.seqs, lines.times
    k = k0
    while k < k1:
        base = offsets[k]
        # the last line m in (k, k1] whose offset (or the end, for k1) is within the cap
        m = bisect_right(offsets, base + _READ_BYTES, k + 1, k1) - 1
        if m == k1 - 1 and (offsets[k1] if k1 < count else src.size) <= base + _READ_BYTES:
            m = k1
        f.seek(base)
        if m > k:
            raw = f.read((offsets[m] if m < count else src.size) - base)
        else:
            raw, m = f.readline(max(0, src.size - base)), k + 1
        for j in range(k, m):
            start = offsets[j] - base
            end = raw.find(b"\n", start)
            chunk = raw[start:end] if end >= 0 else raw[start:]
            if chunk.endswith(b"\r"):
                chunk = chunk[:-1]
            rec = decode_line(chunk, path, fmt, numbers[j])
            yield j, dsh_log_events(rec, path, numbers[j], seqs[j], times[j])
        k = m


class _FileEvents:
    """The log's events by seq (an ``EventSource``): held ones, the rest decoded when read."""

    def __init__(self, src: JsonlSource, lines: _Lines, total: int, f: BinaryIO,
                 held: list[Event]) -> None:
        self._src, self._lines, self._total, self._f = src, lines, total, f
        self._held = held

    def __len__(self) -> int:
        return self._total

    def read(self, start: int, stop: int) -> Sequence[Event]:
        """The events ``start <= seq < stop``, frozen as ``dsh verify`` freezes them."""
        from dsh._verify import frozen_event

        held = self._held
        out: list[Event] = held[start:stop] if start < len(held) else []
        start = max(start, len(held))
        if start >= stop:
            return out
        seqs = self._lines.seqs
        k0 = bisect_right(seqs, start) - 1
        k1 = bisect_left(seqs, stop, k0)
        for k, members in _decoded(self._src, self._lines, k0, k1, self._f):
            base = seqs[k]
            for i, event in enumerate(members):
                if start <= base + i < stop:
                    frozen = frozen_event(base + i, event)
                    assert type(frozen) is Event  # the first read found every event valid
                    out.append(frozen)
        return out


def stream_dsh_log(path: Path) -> Iterator[StreamedSession]:
    """Stream one dsh JSONL log: its one session, events a batch at a time.

    Reads the file three ways, none holding it: a first read checks each line (as
    :func:`import_dsh_log`), indexes it, keeps the first lines' frozen events (a bounded
    prefix) and every event type; the verification is served that prefix and reads the later
    lines back as its checks need them; the batches hand out the prefix and decode the later
    lines once more. A log whose times do not fit the index (beyond 64-bit integers), or with a
    seq that is not an integer (``true`` passes the line checks' ``==`` as 1), is read whole
    by :func:`import_dsh_log` instead.

    Raises:
        ImportFormatError: as :func:`import_dsh_log`, when the session is asked for.
    """
    from dsh._verify import frozen_event, verify_paged  # lazy: the verifier pulls in compaction

    src = JsonlSource(path, FORMAT)
    records = src.records()
    _, first_line, _, header_rec = next(records)
    with _after_decoding(records):
        session_id, header, time = dsh_log_header(path, first_line, header_rec)
    lines = _Lines()
    total = 0
    invalid: Violation | None = None
    held: list[Event] = []  # the first lines' frozen events (HELD_LOG_BYTES, HELD_EVENTS)
    types: set[str] = set()  # every event's type: the checks looking for a type skip a walk
    unignored: set[str] = set()  # those of the events not marked ignorable
    ordered = True  # every seq an int (the line checks compare with ==, so True passed as 1)
    try:
        for _, line, offset, rec in records:
            with _after_decoding(records):
                members = dsh_log_events(rec, path, line, total, time)
            lines.numbers.append(line)
            lines.offsets.append(offset)
            lines.seqs.append(total)
            lines.times.append(time)
            keep = (offset < HELD_LOG_BYTES and len(held) == total
                    and total + len(members) <= HELD_EVENTS)
            for i, event in enumerate(members):
                frozen = frozen_event(total + i, event)
                if type(frozen) is Event:
                    types.add(frozen["type"])
                    if frozen.get("ignorable") is not True:
                        unignored.add(frozen["type"])
                    ordered = ordered and type(frozen["seq"]) is int
                    if keep:
                        held.append(frozen)
                elif invalid is None:
                    assert isinstance(frozen, Violation)
                    invalid = frozen
            total += len(members)
            time = next_time(rec, members, time)
    except (OverflowError, TypeError):  # a time beyond the index's integers
        ordered = False
    if not ordered:  # a seq that is no int (a damaged log): pages could not be checked by seq
        yield StreamedSession.of(import_dsh_log(path)[0])
        return
    last = source_event(path, total, time)
    frozen_last = frozen_event(total, last)

    def line_of(seq: int) -> int | None:
        return lines.numbers[bisect_right(lines.seqs, seq) - 1] if 0 <= seq < total else None

    with path.open("rb") as f:
        if invalid is not None:
            violations = [invalid]
        elif type(frozen_last) is not Event:
            assert isinstance(frozen_last, Violation)
            violations = [frozen_last]
        else:
            view = PagedLog(_FileEvents(src, lines, total, f, held))
            view.append(frozen_last)
            violations = verify_paged(view, header=header, batch_events=STREAM_BATCH_EVENTS,
                                      types={*types, frozen_last["type"]},
                                      unignored_types=unignored, contiguous=True)
    refusal = refusal_of(path, violations, line_of)
    if refusal is not None:
        raise refusal
    yield StreamedSession(session_id, header, _batches(src, lines, held, last),
                          FORMAT, str(path.resolve()))


@contextmanager
def _after_decoding(records: Iterator[object]) -> Iterator[None]:
    """Raise a line's refusal only after every later line decodes, as the whole read does.

    The whole-file import decodes every line before it checks any, so a later line that is
    not JSON is the error it reports.
    """
    try:
        yield
    except ImportFormatError:
        for _ in records:
            pass
        raise


def _batches(src: JsonlSource, lines: _Lines, held: list[Event], last: JsonObj
             ) -> Iterator[ImportBatch]:
    """The events line by line, :data:`STREAM_BATCH_EVENTS` at a time, ``last`` at the end.

    The held events (the first read's frozen copies of the first lines' events: the values
    decoding those lines again gives) are handed out as they are, then dropped; the later
    lines are read :data:`_READ_LINES` at a time.
    """
    events: list[JsonObj] = []
    numbers: list[int | None] = []
    for k, members in _line_members(src, lines, held):
        events.extend(members)
        numbers.extend([lines.numbers[k]] * len(members))
        if len(events) >= STREAM_BATCH_EVENTS:
            yield ImportBatch(events, numbers, lines.offsets[k])
            events, numbers = [], []
    yield ImportBatch([*events, last], [*numbers, None], src.size)


def _line_members(src: JsonlSource, lines: _Lines, held: list[Event]
                  ) -> Iterator[tuple[int, Sequence[JsonObj]]]:
    """``(k, events)`` of every line in order: held ones sliced, the others decoded."""
    seqs, count = lines.seqs, len(lines.seqs)
    k = 0
    while k < count and seqs[k] < len(held):  # held lines are whole: held ends at a line's end
        yield k, held[seqs[k]:seqs[k + 1] if k + 1 < count else len(held)]
        k += 1
    held.clear()
    with src.path.open("rb") as f:
        while k < count:
            k1 = min(count, k + _READ_LINES)
            yield from _decoded(src, lines, k, k1, f)
            k = k1


_READ_LINES: Final = 256
"""Lines the batches read from the file at once."""

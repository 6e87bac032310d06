"""A dsh JSONL log imported as a stream, in memory that does not grow with the log.

The events and refusals are those of :func:`dsh.interop._dsh_log.import_dsh_log`
(docs/interop.md#streaming-imports). The first read checks every line as the whole-file import
does and keeps, per line, its byte offset, first seq and inherited time (three integers); the
log is then verified by :func:`dsh._verify.verify_paged` over a view that decodes lines again as
the checks ask for events, and handed out :data:`STREAM_BATCH_EVENTS` events at a time.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Final

from dsh._errors import ImportFormatError
from dsh.interop._common import ImportBatch, JsonlSource, JsonObj, StreamedSession
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


def _line_events(src: JsonlSource, lines: _Lines, k: int, f: BinaryIO) -> list[JsonObj]:
    """The plain events of line ``k`` (0 = the first after the header), decoded again."""
    rec = src.record_at(lines.numbers[k], lines.offsets[k], f)
    return dsh_log_events(rec, src.path, lines.numbers[k], lines.seqs[k], lines.times[k])


class _FileEvents:
    """The log's events by seq (an ``EventSource``), decoded from the file when read."""

    def __init__(self, src: JsonlSource, lines: _Lines, total: int, f: BinaryIO) -> None:
        self._src, self._lines, self._total, self._f = src, lines, total, f

    def __len__(self) -> int:
        return self._total

    def read(self, start: int, stop: int) -> Sequence[Event]:
        """The events ``start <= seq < stop``, frozen as ``dsh verify`` freezes them."""
        from dsh._verify import frozen_event

        seqs = self._lines.seqs
        out: list[Event] = []
        k = bisect_right(seqs, start) - 1
        while k < len(seqs) and seqs[k] < stop:
            base = seqs[k]
            for i, event in enumerate(_line_events(self._src, self._lines, k, self._f)):
                if start <= base + i < stop:
                    frozen = frozen_event(base + i, event)
                    assert type(frozen) is Event  # the first read found every event valid
                    out.append(frozen)
            k += 1
        return out


def stream_dsh_log(path: Path) -> Iterator[StreamedSession]:
    """Stream one dsh JSONL log: its one session, events a batch at a time.

    Reads the file three ways, none holding it: a first read checks each line (as
    :func:`import_dsh_log`) and indexes it, the verification reads lines back as its checks
    need them, and the batches decode the lines once more. A log whose times do not fit the
    index (beyond 64-bit integers) is read whole by :func:`import_dsh_log` instead.

    Raises:
        ImportFormatError: as :func:`import_dsh_log`, when the session is asked for.
    """
    from dsh._verify import frozen_event, verify_paged  # lazy: the verifier pulls in compaction

    src = JsonlSource(path, FORMAT)
    records = src.records()
    first_line, _, header_rec = next(records)
    with _after_decoding(records):
        session_id, header, time = dsh_log_header(path, first_line, header_rec)
    lines = _Lines()
    total = 0
    invalid: Violation | None = None
    try:
        for line, offset, rec in records:
            with _after_decoding(records):
                members = dsh_log_events(rec, path, line, total, time)
            lines.numbers.append(line)
            lines.offsets.append(offset)
            lines.seqs.append(total)
            lines.times.append(time)
            for i, event in enumerate(members):
                frozen = frozen_event(total + i, event)
                if invalid is None and type(frozen) is not Event:
                    assert isinstance(frozen, Violation)
                    invalid = frozen
            total += len(members)
            time = next_time(rec, members, time)
    except (OverflowError, TypeError):  # a time beyond the index's integers
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
            view = PagedLog(_FileEvents(src, lines, total, f))
            view.append(frozen_last)
            violations = verify_paged(view, header=header, batch_events=STREAM_BATCH_EVENTS)
    refusal = refusal_of(path, violations, line_of)
    if refusal is not None:
        raise refusal
    yield StreamedSession(session_id, header, _batches(src, lines, total, last),
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


def _batches(src: JsonlSource, lines: _Lines, total: int, last: JsonObj
             ) -> Iterator[ImportBatch]:
    """The events line by line, :data:`STREAM_BATCH_EVENTS` at a time, ``last`` at the end."""
    events: list[JsonObj] = []
    numbers: list[int | None] = []
    with src.path.open("rb") as f:
        for k in range(len(lines.seqs)):
            members = _line_events(src, lines, k, f)
            events.extend(members)
            numbers.extend([lines.numbers[k]] * len(members))
            if len(events) >= STREAM_BATCH_EVENTS:
                yield ImportBatch(events, numbers, lines.offsets[k])
                events, numbers = [], []
    yield ImportBatch([*events, last], [*numbers, None], src.size)

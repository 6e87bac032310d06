r"""Raw JSONL logs read by seq range without a restore point: lines found by bisecting bytes.

A raw JSONL log holds one record per ``\n``-terminated line, and the seqs of its records grow
with their byte offsets, so the line holding any seq is found by bisecting the file: each probe
reads from a byte offset to the end of the next line and decodes that one line's first seq.
The line starts found are kept (an index refined on demand), so later pages cost a few probes.
This lets a reader (``dsh view``, a live tail, the search index) read the latest events of a
log of any length without reading the rest (docs/stores.md#reading-by-page).

Invariants this module owns: a line is only ever taken from a ``\n`` boundary (never
``splitlines``); the bytes of a suffix read and of every page are checked against each seal
record they touch before they are decoded (raw JSONL's integrity: docs/rules.md#integrity,
docs/rules.md#verified-page-in); anything that does not read exactly as the format says
(a probed line that does not decode, seqs that do not grow with offsets, a torn or damaged
tail, a sealed range that differs) gives up: the suffix read returns None and a page raises
:class:`LogCorruptError`, and the caller reads the log in full, which names the damage.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from dsh._errors import DshError, LogCorruptError
from dsh.json import FrozenDict, is_safe_int, loads
from dsh.persistence._paths import file_revision
from dsh.persistence._seal import Seal, crc_of, read_seal
from dsh.persistence.jsonl._format import Scanner, has_seal_mark, parse_header_strict
from dsh.persistence.jsonl._restore_point import JsonlPrefixSource, pread
from dsh.session import Event, decode_storage_record

__all__ = ["JsonlRangeSource", "last_line_seq", "locate", "range_source", "read_suffix"]

_PROBE_BYTES: Final = 16 * 1024
"""Bytes read at a time while looking for a line's start and end."""


def _corrupt(path: str, offset: int, why: str) -> LogCorruptError:
    return LogCorruptError(f"corrupt session log: {why} at byte {offset} of {path}", path=path,
                           byte_offset=offset)


def _newline(fd: int, at: int, limit: int) -> int:
    r"""The offset of the first ``\n`` at or after ``at`` and before ``limit``, or -1."""
    while at < limit:
        chunk = pread(fd, min(_PROBE_BYTES, limit - at), at)
        if not chunk:
            return -1
        found = chunk.find(b"\n")
        if found >= 0:
            return at + found
        at += len(chunk)
    return -1


def _line_from(fd: int, pos: int, limit: int, starts_before: int | None = None
               ) -> tuple[int, int, bytes] | None:
    r"""The first complete line starting at or after ``pos`` (``pos >= 1``).

    Args:
        fd: The log.
        pos: Where to look from.
        limit: Where the bytes end: the line's ``\n`` must come before it.
        starts_before: The line must start before this offset (default ``limit``).

    Returns:
        ``(start, end, line)``: its offset, the offset after its ``\n``, its bytes without the
        ``\n``; None when no line starts in ``[pos, starts_before)`` or the one found does not
        end by ``limit``.
    """
    bound = limit if starts_before is None else starts_before
    before = _newline(fd, pos - 1, bound)  # pos is a line start when the byte before is "\n"
    if before < 0 or before + 1 >= bound:
        return None
    start = before + 1
    end = _newline(fd, start, limit)
    if end < 0:
        return None
    return start, end + 1, pread(fd, end - start, start)


def _first_seq(line: bytes, path: str, offset: int) -> int:
    """The seq of the first event a record line holds (a packed chunk row holds several)."""
    try:
        records = decode_storage_record(loads(line))
    except (DshError, ValueError):
        raise _corrupt(path, offset, "a line that does not decode to events") from None
    first = records[0] if records else None
    seq = first.get("seq") if isinstance(first, Event) else None
    if not isinstance(seq, int) or not is_safe_int(seq) or seq < 0:
        raise _corrupt(path, offset, "a line without a seq")
    return seq


def _note(offsets: list[int], seqs: list[int], start: int, seq: int, path: str) -> None:
    """Insert the line start ``start`` (first seq ``seq``), keeping seqs growing with offsets."""
    at = bisect.bisect_left(offsets, start)
    if at < len(offsets) and offsets[at] == start:
        if seqs[at] != seq:
            raise _corrupt(path, start, "a line read twice with two seqs")
        return
    if (at > 0 and seqs[at - 1] >= seq) or (at < len(seqs) and seqs[at] <= seq):
        raise _corrupt(path, start, f"seq {seq} out of order")
    offsets.insert(at, start)
    seqs.insert(at, seq)


def locate(fd: int, offsets: list[int], seqs: list[int], target: int, limit: int,
           path: str) -> tuple[int, int, int]:
    """Find the line holding seq ``target`` by bisection, noting each line start it reads.

    Args:
        fd: The log, open for reading.
        offsets: Known line starts, ascending; the first is the header's end (seq 0). Refined
            in place.
        seqs: The first seq of each line in ``offsets`` (growing with them). Refined in place.
        target: The seq looked for.
        limit: The offset where the lines end (after a ``\\n``: the file size, or a line end).
        path: Named in errors.

    Returns:
        ``(start, first seq, end)`` of the last line whose first seq is ``<= target``: the line
        holding it (past the last event: the last line). ``end`` is the offset after its
        ``\\n``.

    Raises:
        LogCorruptError: a line does not decode, its seqs do not grow with offsets, or the
            line at a known start does not end by ``limit``.
    """
    index = bisect.bisect_right(seqs, target) - 1
    lo, lo_seq = offsets[index], seqs[index]
    hi = offsets[index + 1] if index + 1 < len(offsets) else limit
    found = _line_from(fd, lo, limit, lo + 1)
    if found is None or found[0] != lo:
        raise _corrupt(path, lo, "no complete line")
    end = found[1]
    while end < hi:  # a line starts in [end, hi): probe the middle
        probe = _line_from(fd, max((lo + hi) // 2, end), limit, hi)
        if probe is None:
            hi = max((lo + hi) // 2, end)
            continue
        start, probe_end, line = probe
        seq = _first_seq(line, path, start)
        _note(offsets, seqs, start, seq, path)
        if seq <= target:
            lo, lo_seq, end = start, seq, probe_end
        else:
            hi = start
    return lo, lo_seq, end


def _header(fd: int, size: int, path: str) -> tuple[FrozenDict, int]:
    """The header line's value and the offset after it."""
    data = b""
    while b"\n" not in data and len(data) < size:
        chunk = pread(fd, min(_PROBE_BYTES, size - len(data)), len(data))
        if not chunk:
            break
        data += chunk
    newline = data.find(b"\n")
    if newline < 0:
        raise _corrupt(path, 0, "no complete header line")
    return parse_header_strict(data[:newline + 1], path=path), newline + 1


def last_line_seq(path: Path) -> int:
    """The first seq of the log's last complete line: a cheap lower bound of its last seq.

    Returns:
        -1 when the log holds no complete event line.

    Raises:
        OSError: the file cannot be read. LogCorruptError: the last line does not decode.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        window = _PROBE_BYTES
        while True:
            window = min(window, size)
            data = pread(fd, window, size - window)
            last = data.rfind(b"\n")
            before = data.rfind(b"\n", 0, last) if last > 0 else -1
            if before >= 0:
                return _first_seq(data[before + 1:last], str(path), size - window + before + 1)
            if window == size:
                return -1  # the header line only
            window *= 4
    finally:
        os.close(fd)


def _require_seal(fd: int, header_end: int, seal: Seal | None, path: str) -> None:
    """Refuse to page a log whose header says it is sealed when its seal is gone.

    Raises:
        LogCorruptError: the seal mark is there and the seal is not; the full read that
            follows names it (``SEAL_MISSING``, docs/formats.md#integrity-seals).
    """
    if (seal is None or not seal.records) and has_seal_mark(pread(fd, header_end, 0)):
        raise _corrupt(path, 0, "the header line says the log is sealed, but its seal is gone")


def read_suffix(path: Path, offset: int, seal_path: Path,
                check_identity: Callable[[FrozenDict], None]
                ) -> tuple[FrozenDict, list[Event], str] | None:
    """Read the header and the events with ``seq >= offset`` without reading the lines before.

    The line holding ``offset`` is found by bisection; the bytes from it to the end of the
    file are checked against every seal record they touch and scanned as a full read scans
    them (from that line's seq on). Rule: docs/stores.md#reading-by-page.

    Args:
        path: The raw log.
        offset: The first seq wanted.
        seal_path: Its integrity seal (read before the log).
        check_identity: Raises ``DshError`` when the header does not identify this log.

    Returns:
        ``(header, events, revision)``, or None when anything is in doubt (a torn or damaged
        tail, a sealed range that differs or was cut off, a log replaced while read, a header
        that does not parse): the caller reads the log in full, which names the damage.
    """
    text = str(path)
    try:
        seal = read_seal(seal_path)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            opened = os.fstat(fd)
            size = opened.st_size
            header, header_end = _header(fd, size, text)
            check_identity(header)
            _require_seal(fd, header_end, seal, text)
            if size == header_end:
                return header, [], file_revision(opened)
            offsets, seqs = [header_end], [0]
            start, first, _ = locate(fd, offsets, seqs, offset, size, text)
            data = pread(fd, size - start, start)
            for s, e, crc in seal.records if seal is not None else ():
                if e > size:
                    return None  # committed bytes cut off
                if e <= start:
                    continue
                covered = data[s - start:e - start] if s >= start else (
                    pread(fd, start - s, s) + data[:e - start])
                if crc_of(covered) != crc:
                    return None
            after = os.fstat(fd)
        finally:
            os.close(fd)
        if (after.st_ino, after.st_dev) != (opened.st_ino, opened.st_dev) \
                or after.st_size < size or len(data) != size - start:
            return None
        revision = file_revision(after) if after.st_size == size else \
            f"{file_revision(opened)}:prefix:{size}"
        scanner = Scanner(path=text, start_offset=start, start_seq=first)
        scanner.feed(data)
        result = scanner.finish()
    except (OSError, DshError):
        return None
    if result.reason is not None:
        return None
    return header, result.events[max(0, offset - first):], revision


class JsonlRangeSource(JsonlPrefixSource):
    """Pages in seqs ``0 .. cut - 1`` of a raw log that has no restore point, by bisection.

    A :class:`~dsh.persistence.jsonl._restore_point.JsonlPrefixSource` whose index of line
    starts is not given but found: before a page is read, the lines holding its first seq
    and the seq after its read-ahead are located (:func:`locate`), noting every line start
    probed on the way. Pages are checked against the seal records they touch, as after a
    resume (docs/rules.md#verified-page-in). A log replaced since the source was made (another
    inode) is ``LogCorruptError``.

    Args:
        path: The raw log.
        cut: Seqs served.
        cut_offset: The offset after the line holding seq ``cut - 1``.
        offsets: Known line starts (the first: the header's end).
        seqs: Their first seqs.
        seals: The seal records read with the log.
        identity: ``(st_dev, st_ino)`` of the log when the source was made.
    """

    def __init__(self, path: Path, cut: int, cut_offset: int, offsets: Sequence[int],
                 seqs: Sequence[int], seals: Sequence[tuple[int, int, int]],
                 identity: tuple[int, int]) -> None:
        super().__init__(path, "none", cut, cut_offset, list(zip(seqs, offsets, strict=True)),
                         seals=seals)
        self._identity = identity
        self._lock = threading.Lock()

    def read(self, start: int, stop: int) -> Sequence[Event]:
        """Return the events ``start <= seq < stop`` (see ``EventSource``).

        Raises:
            LogCorruptError: the log no longer reads as the format says, or was replaced.
        """
        if start >= stop:
            return []
        with self._lock:
            span_seq, span = self._span
            if span_seq <= start and stop <= span_seq + len(span):
                return span[start - span_seq:stop - span_seq]
            self._refine(start, stop + self.read_ahead_events)
            return super().read(start, stop)

    def read_picked(self, start: int, stop: int, seqs: Sequence[int]) -> Sequence[Event] | None:
        """The events at ``seqs`` of ``start <= seq < stop`` (see ``JsonlPrefixSource``).

        The lines holding ``start`` and ``stop`` are located first, so the range read is
        the range asked for, not the span between the coarse index entries around it.

        Raises:
            LogCorruptError: as :meth:`read`.
        """
        if start >= stop or not seqs:
            return []
        with self._lock:
            self._refine(start, stop)
            return super().read_picked(start, stop, seqs)

    def _refine(self, start: int, ahead: int) -> None:
        """Make the index hold the line of ``start`` and a line start at or after ``ahead``."""
        path = str(self._path)
        fd = os.open(self._path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != self._identity:
                raise LogCorruptError(f"the log {path} was replaced after it was opened; open "
                                      "it again", path=path)
            offsets, seqs, cut_offset = self._offsets, self._seqs, self._cut_offset
            locate(fd, offsets, seqs, start, cut_offset, path)
            if ahead < self._cut:
                _, first, end = locate(fd, offsets, seqs, ahead, cut_offset, path)
                if first < ahead and end < cut_offset:
                    following = _line_from(fd, end, cut_offset)
                    if following is None:
                        raise _corrupt(path, end, "no complete line")
                    _note(offsets, seqs, following[0],
                          _first_seq(following[2], path, following[0]), path)
        except OSError as exc:
            raise LogCorruptError(f"the log {path} could not be read ({exc})",
                                  path=path) from exc
        finally:
            os.close(fd)


def range_source(path: Path, cut: int, seal_path: Path) -> JsonlRangeSource | None:
    """A page-in source over seqs ``0 .. cut - 1`` of a raw log (None: ``cut`` is 0).

    Raises:
        OSError: the log or its seal cannot be read. LogCorruptError: the header or the lines
            bisected on the way to seq ``cut - 1`` do not read as the format says.
    """
    if cut < 1:
        return None
    seal = read_seal(seal_path)  # before the log: every record is then inside what is read
    text = str(path)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        _, header_end = _header(fd, st.st_size, text)
        _require_seal(fd, header_end, seal, text)
        offsets, seqs = [header_end], [0]
        _, _, cut_offset = locate(fd, offsets, seqs, cut - 1, st.st_size, text)
    finally:
        os.close(fd)
    return JsonlRangeSource(path, cut, cut_offset, offsets, seqs,
                            seal.records if seal is not None else (), (st.st_dev, st.st_ino))

"""JSONL restore points: the anchor of a durable prefix, the tail read, the page-in source.

The sidecar is ``session.jsonl.ckpt`` (``session.jsonl.zstd.ckpt``) in the session folder,
beside the seal; dsh ignores it. Anchors sit at batch boundaries (raw: a record start; zstd: a
frame start). A read from a restore point checks, before trusting it: the file still holds the
covered bytes, the header bytes and the last :data:`DIGEST_TAIL_BYTES` before the cut
digest as recorded, and the seal records over the prefix digest as recorded; the tail after the
cut must then read cleanly (no torn tail, every seal record over it intact), and on a raw log
the restore point's digest must be one the seal recorded (:func:`~dsh.persistence._restore_point
.check_bound`), on a Zstandard log one its restore point seal recorded (:func:`read_bindings`).
Anything else is a :class:`RestorePointRefused` and the caller reads the whole log.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dsh._errors import DshError, LogCorruptError
from dsh.json import FrozenDict
from dsh.persistence import _restore_point as rp
from dsh.persistence._chain import ChainState
from dsh.persistence._paths import file_revision
from dsh.persistence._seal import (
    SealCut,
    covers,
    crc_of,
    read_seal,
    read_seal_after,
    restore_point_mark,
)
from dsh.persistence.jsonl._format import (
    Scanner,
    parse_header_strict,
    scan_picked,
    scan_zstd_frames,
)
from dsh.persistence.jsonl._zstd import decompress_frame
from dsh.session import Event

MARK_BYTES: Final = len(restore_point_mark("00" * 32))
"""Bytes of one restore point mark (a prefix of the body's SHA-256)."""

BINDING_MAGIC: Final = b"DSHRPB1\n"
"""First bytes of a Zstandard log's restore point seal (``session.jsonl.zstd.ckpt.seal``)."""

BINDINGS_KEPT: Final = 2
"""Restore point digests a restore point seal keeps: the newest and the one before it."""


def read_bindings(path: Path) -> list[bytes]:
    """The restore point marks the seal file at ``path`` records (empty: none, or not a seal).

    Layout (docs/formats.md#restore-points): :data:`BINDING_MAGIC`, then one 12-byte mark
    (:func:`~dsh.persistence._seal.restore_point_mark`) per restore point, newest first. A file
    of another shape records nothing: the restore point is then not trusted (a full read).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return []
    try:
        data = pread(fd, len(BINDING_MAGIC) + MARK_BYTES * BINDINGS_KEPT + 1, 0)
    except OSError:
        return []
    finally:
        os.close(fd)
    body = data[len(BINDING_MAGIC):]
    if not data.startswith(BINDING_MAGIC) or not body or len(body) % MARK_BYTES \
            or len(body) > MARK_BYTES * BINDINGS_KEPT:
        return []
    return [body[k:k + MARK_BYTES] for k in range(0, len(body), MARK_BYTES)]


def write_bindings(path: Path, mark: bytes) -> None:
    """Record ``mark`` first in the restore point seal at ``path``, keeping the one before.

    Written (temp file and rename, no fsync, like the restore point itself) before the
    restore point it binds is renamed into place, so a resume never finds a restore point its
    writer wrote without its mark, and one that read the previous restore point finds that
    mark too. A crash or power cut that loses it costs a full read, never a wrong answer.

    Raises:
        OSError: it could not be written (the restore point must then not be written).
    """
    kept = [m for m in read_bindings(path) if m != mark][:BINDINGS_KEPT - 1]
    rp.replace_sidecar(path, BINDING_MAGIC + mark + b"".join(kept))


def backend_kind(compression: str) -> str:
    """The anchor's backend name for a JSONL compression."""
    return "jsonl-zstd" if compression == "zstd" else "jsonl"


def note_index(index: list[tuple[int, int]] | rp.PageIndex, seq: int, offset: int) -> None:
    """Add ``(seq, offset)`` (a batch start) when far enough from the last entry."""
    if not index:
        index.append((seq, offset))
        return
    last_seq, last_offset = index[-1]
    if seq > last_seq and offset > last_offset and (seq - last_seq >= rp.INDEX_EVERY_EVENTS
                                                    or offset - last_offset
                                                    >= rp.INDEX_EVERY_BYTES):
        index.append((seq, offset))


_READ_AHEAD_EVENTS: Final = 1024
"""Events read past a page-in's end (about four pages), kept as the span for the next ones."""


def pread(fd: int, size: int, offset: int) -> bytes:
    """``size`` bytes of ``fd`` from ``offset`` (fewer at the end of the file)."""
    out = bytearray()
    while len(out) < size:
        chunk = os.pread(fd, size - len(out), offset + len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def seal_digest(records: Sequence[tuple[int, int, int]], end: int) -> str:
    """Digest of the seal records ``(start, end, crc)`` that end at or before ``end``."""
    return rp.digest(b"".join(f"{s}:{e}:{c};".encode() for s, e, c in records if e <= end))


def _decode_frames(data: bytes, base: int, path: str) -> bytes:
    """Plaintext of the complete frames in ``data`` (file offset ``base``); refuse a torn one."""
    frames, torn = scan_zstd_frames(data, path=path)
    if torn is not None:
        raise rp.RestorePointRefused("torn-tail")
    return b"".join(decompress_frame(data[s:e], base + s, path) for s, e in frames)


def _scan(text: bytes, *, path: str, offset: int, seq: int) -> list[Event]:
    scanner = Scanner(path=path, start_offset=offset, start_seq=seq)
    scanner.feed(text)
    result = scanner.finish()
    if result.reason is not None:
        raise rp.RestorePointRefused("torn-tail")
    return result.events


@dataclass(frozen=True, slots=True)
class TailRead:
    """What :func:`load_tail` found past a restore point's cut.

    The log's header, the events after the cut, the file's revision, and the write state a
    full read would have left: file size, seal records, page-in index, header extent. When
    the restore point names its :class:`~dsh.persistence._seal.SealCut`, ``records``,
    ``restore_marks`` and ``chain`` are the seal's after it and ``seal_cut`` is set (the
    records before it were checked by digest, not read); ``seal_clean``: the seal file ends
    after its last valid record (a writer may append to it).
    """

    header: FrozenDict
    events: list[Event]
    revision: str
    size: int
    records: list[tuple[int, int, int]]
    index: list[tuple[int, int]] | rp.PageIndex  # a restore point's: inflated at first need
    header_end: int
    restore_marks: list[bytes]
    chain: ChainState | None = None
    seal_cut: SealCut | None = None
    seal_clean: bool = False


def load_tail(path: Path, restore_point: rp.RestorePoint, *, zstd: bool, seal_path: Path,
              check_identity: Callable[[FrozenDict], None]) -> TailRead:
    """Check ``restore_point`` against the log at ``path`` and read the events after its cut.

    Args:
        path: The log file.
        restore_point: The decoded sidecar.
        zstd: Whether the log is Zstandard-framed (raw logs are checked against their seal).
        seal_path: The raw log's seal file.
        check_identity: Raises ``DshError`` when the header does not identify this file.

    Raises:
        RestorePointRefused: the file does not hold the prefix the restore point covers
            (``size``, ``header``, ``tail-digest``, ``seal``), or its tail does not read
            cleanly (``torn-tail``, ``corrupt-tail``).
    """
    anchor = restore_point.anchor
    if not anchor.index or anchor.index[0][0] != 0:
        raise rp.RestorePointRefused("bad-field:index")
    header_end = anchor.index[0][1]
    cut = anchor.byte_offset
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        raise rp.RestorePointRefused("unreadable") from None
    try:
        before = os.fstat(fd)
        if before.st_size < cut or header_end >= cut:
            raise rp.RestorePointRefused("size")
        head = pread(fd, header_end, 0)
        if rp.digest(head) != anchor.header_digest:
            raise rp.RestorePointRefused("header")
        start = max(header_end, cut - rp.DIGEST_TAIL_BYTES)
        if rp.digest(pread(fd, cut - start, start)) != anchor.tail_digest:
            raise rp.RestorePointRefused("tail-digest")
        seal_cut = SealCut.decode(anchor.seal_digest) if not zstd else None
        if zstd:
            seal = None
        elif seal_cut is not None:
            # the records before the cut are checked by one digest, not read: O(tail)
            seal = read_seal_after(seal_path, seal_cut)
            if seal is None or seal_cut.end != cut:
                raise rp.RestorePointRefused("seal")
        else:
            seal = read_seal(seal_path)
        data = pread(fd, before.st_size - cut, cut)
        after = os.fstat(fd)
    except DshError:
        raise rp.RestorePointRefused("seal") from None
    finally:
        os.close(fd)
    revision = file_revision(after)
    if file_revision(before) != revision or len(data) != after.st_size - cut:
        raise rp.RestorePointRefused("unstable")
    records = seal.records if seal is not None else []
    if not zstd:
        if seal_cut is None and seal_digest(records, cut) != anchor.seal_digest:
            raise rp.RestorePointRefused("seal")
        for s, e, crc in records:
            if e > cut and (s < cut or e > after.st_size or crc_of(data[s - cut:e - cut]) != crc):
                raise rp.RestorePointRefused("seal")
    text_path = str(path)
    try:
        if zstd:
            header = parse_header_strict(_decode_frames(head, 0, text_path), path=text_path)
            events = _scan(_decode_frames(data, cut, text_path), path=text_path, offset=cut,
                           seq=anchor.event_count)
        else:
            header = parse_header_strict(head, path=text_path)
            events = _scan(data, path=text_path, offset=cut, seq=anchor.event_count)
        check_identity(header)
    except DshError:
        raise rp.RestorePointRefused("corrupt-tail") from None
    index = anchor.index.copy() if isinstance(anchor.index, rp.PageIndex) \
        else list(anchor.index)  # (a packed one is not inflated: O(tail))
    note_index(index, anchor.event_count, cut)
    return TailRead(header, events, revision, after.st_size, list(records), index, header_end,
                    list(seal.restore_points) if seal is not None else [],
                    (seal.chain_state() if seal is not None else ChainState([])) if not zstd
                    else None, seal.elided if seal is not None else None,
                    seal is not None and seal.clean and seal.version == 2)


def _seal_mismatch(exc: Exception) -> bool:
    """Whether ``exc`` is a sealed range found changed (named as such where it was found)."""
    return isinstance(exc, LogCorruptError) and exc.where.get("byte_offset") is not None \
        and "integrity seal" in exc.message


class JsonlPrefixSource:
    """Pages in the events before a restore point's cut from the JSONL file, by byte offset.

    Args:
        path: The log file.
        compression: ``"none"`` or ``"zstd"``.
        cut: Events served (seqs ``0 .. cut - 1``).
        cut_offset: The file offset of the cut (a batch boundary).
        index: ``(seq, offset)`` of record (frame) starts before the cut, from ``(0, header
            end)``; a read starts at the entry at or before its first seq.
        seals: Raw JSONL: the seal records read at the resume.
        elided: Reads the seal records before the cut that the resume left unread (past a
            :class:`~dsh.persistence._seal.SealCut`), called on the first page-in.
        session_id: The session, named where a fallback is reported.
        rebuild_index: Reads the log's bytes before the cut and returns their page-in index
            (what a full read samples), or raises ``LogCorruptError`` naming the damage. Called
            when the restore point's packed index turns out not to hold what it claims
            (``RESTORE_POINT_MISMATCH``): a restore point is never the truth
            (docs/rules.md#restore-points-are-never-the-truth), so the page-in falls back to
            reading the log, reported as a refused restore point (``refused:index``, logged
            at WARNING), instead of failing. None: the mismatch is raised.
    """

    def __init__(self, path: Path, compression: str, cut: int, cut_offset: int,
                 index: Sequence[tuple[int, int]],
                 seals: Sequence[tuple[int, int, int]] | None = None, *,
                 elided: Callable[[], Sequence[tuple[int, int, int]]] | None = None,
                 session_id: str = "",
                 rebuild_index: Callable[[], Sequence[tuple[int, int]]] | None = None) -> None:
        self._path = path
        self._session_id = session_id
        self._rebuild_index = rebuild_index
        # raw JSONL: the seal records over the prefix (read before the log at the resume); a
        # page is checked against every record it touches before it is decoded, each record
        # once (docs/rules.md#verified-page-in). ``elided`` reads those a resume left unread
        # (past a SealCut), on the first page-in.
        self._elided = elided
        self._seals = [r for r in seals or () if r[0] < cut_offset]
        self._seal_starts = [r[0] for r in self._seals]
        self._verified: set[int] = set()
        self._zstd = compression == "zstd"
        self._cut = cut
        self._cut_offset = cut_offset
        self._index = index
        # a restore point's PageIndex: its columns taken at the first page-in that needs them
        lazy = isinstance(index, rp.PageIndex)
        self._seqs: list[int] = [] if lazy else [seq for seq, _ in index]
        self._offsets: list[int] = [] if lazy else [offset for _, offset in index]
        # the events of the last span scanned (first seq, events): pages are read in order
        # (a restore pages the surface in sorted), and one span or zstd frame (a whole batch)
        # holds many pages, so each span is decoded once, not once per page
        self._span: tuple[int, list[Event]] = (0, [])

    read_ahead_events: Final = _READ_AHEAD_EVENTS
    """Events read past a page's end; the span up to there is kept for the next pages."""

    def __len__(self) -> int:
        return self._cut

    def read(self, start: int, stop: int) -> Sequence[Event]:
        """Return the events ``start <= seq < stop`` (see ``EventSource``).

        Raises:
            LogCorruptError: the bytes before the cut no longer decode to those events (the
                file was changed under the session).
        """
        if start >= stop:
            return []
        span_seq, span = self._span
        if span_seq <= start and stop <= span_seq + len(span):
            return span[start - span_seq:stop - span_seq]
        # read ahead: the next pages are usually asked for next (a span boundary inside a
        # page would otherwise make two reads scan it)
        seq, end_seq, offset, end = self._extent(start, stop + self.read_ahead_events)
        path = str(self._path)
        try:
            text, _ = self._text(offset, end, start)
            events = _scan(text, path=path, offset=offset, seq=seq)
            if self._unchecked and len(events) != end_seq - seq:
                raise LogCorruptError(f"{len(events)} events where the index says "
                                      f"{end_seq - seq}", path=path, byte_offset=offset)
            self._span = (seq, events)
        except (OSError, rp.RestorePointRefused, DshError) as exc:
            if _seal_mismatch(exc):
                raise  # a sealed range that changed: named as such by _verified_read
            if self._unchecked:  # read through the index's last entry alone, unchecked
                self._load_pairs()
                return self.read(start, stop)
            raise self._unreadable(start, stop, offset, exc) from exc
        return events[start - seq:stop - seq]

    def read_picked(self, start: int, stop: int, seqs: Sequence[int]) -> Sequence[Event] | None:
        """The events at ``seqs`` of ``start <= seq < stop``, decoding only their lines.

        The range is read from the index entries around it and checked as :meth:`read`
        checks a page (every seal record it touches, or the Zstandard frames' checksums:
        docs/rules.md#verified-page-in); then, where every byte of it is covered by seal
        records or frame checksums and it holds one event a line, only the lines of ``seqs``
        are parsed (:func:`~dsh.persistence.jsonl._format.scan_picked`). Otherwise (bytes no
        seal record covers, packed chunk rows) the whole range is scanned as :meth:`read`
        scans it and the events of ``seqs`` taken from it. Nothing is cached.

        Raises:
            LogCorruptError: as :meth:`read`.
        """
        if start >= stop or not seqs:
            return []
        seq, end_seq, offset, end = self._extent(start, stop)
        path = str(self._path)
        try:
            text, checked = self._text(offset, end, start)
            events = scan_picked(text, seq, end_seq - seq, seqs) if checked else None
            if events is None:
                every = _scan(text, path=path, offset=offset, seq=seq)
                if len(every) != end_seq - seq:
                    raise LogCorruptError(f"{len(every)} events where the index says "
                                          f"{end_seq - seq}", path=path, byte_offset=offset)
                events = [every[s - seq] for s in seqs]
        except (OSError, rp.RestorePointRefused, DshError) as exc:
            if _seal_mismatch(exc):
                raise  # a sealed range that changed: named as such by _verified_read
            if self._unchecked:  # read through the index's last entry alone, unchecked
                self._load_pairs()
                return self.read_picked(start, stop, seqs)
            raise self._unreadable(start, stop, offset, exc) from exc
        return events

    @property
    def _unchecked(self) -> bool:
        """Whether the index is still the restore point's, not unpacked (nor checked) whole."""
        return not self._seqs and bool(self._index)

    def _extent(self, start: int, stop: int) -> tuple[int, int, int, int]:
        """``(first seq, end seq, offset, end offset)`` of the index entries around a range.

        A range at or after the restore point's last entry (an open turn's window) is taken
        from that entry alone, unchecked: a read through it that fails calls
        :meth:`_load_pairs` (which checks the whole index, refusing it for the log's own)
        and is retried once (docs/rules.md#restore-points-are-never-the-truth).
        """
        if self._unchecked:
            last_seq, last_offset = self._index[-1]
            if start >= last_seq:  # (an open turn's window): the other entries are not needed
                return last_seq, self._cut, last_offset, self._cut_offset
            self._load_pairs()
        first = bisect.bisect_right(self._seqs, start) - 1
        last = bisect.bisect_left(self._seqs, stop)
        if last < len(self._offsets):
            return self._seqs[first], self._seqs[last], self._offsets[first], self._offsets[last]
        return self._seqs[first], self._cut, self._offsets[first], self._cut_offset

    def _load_pairs(self) -> None:
        """Take every index entry (:meth:`_pairs`) as the columns the page-ins bisect.

        Raises:
            LogCorruptError: as :meth:`_pairs`.
        """
        pairs = self._pairs()
        self._seqs = [seq for seq, _ in pairs]
        self._offsets = [offset for _, offset in pairs]

    def _pairs(self) -> Sequence[tuple[int, int]]:
        """Every index entry: the restore point's, else (it does not match) the log's own.

        Raises:
            LogCorruptError: ``RESTORE_POINT_MISMATCH`` without ``rebuild_index``; the
                damage a read of the log before the cut found.
        """
        try:
            return list(self._index)
        except LogCorruptError as exc:
            if exc.code != "RESTORE_POINT_MISMATCH" or self._rebuild_index is None:
                raise
            rp.note_refusal(self._session_id, "index", exc,
                            instead="paging in through the log's own index")
        self._index = pairs = list(self._rebuild_index())
        return pairs

    def _text(self, offset: int, end: int, start: int) -> tuple[bytes, bool]:
        """The logical text of bytes ``[offset, end)``, checked; and whether all of it is.

        Checked: every byte lies under a seal record (raw) or in a frame whose checksum
        held (Zstandard).
        """
        fd = os.open(self._path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            data = self._verified_read(fd, offset, end, start)
        finally:
            os.close(fd)
        if self._zstd:
            return _decode_frames(data, offset, str(self._path)), True
        return data, covers(self._seals, self._seal_starts, offset, end)

    def _unreadable(self, start: int, stop: int, offset: int, exc: Exception) -> LogCorruptError:
        """The error of a page-in that failed: the log changed after the resume."""
        path = str(self._path)
        return LogCorruptError(f"events {start}..{stop - 1} of {path} could not be paged in "
                               f"({exc}); the log changed after the session was resumed, "
                               "resume it again", path=path, byte_offset=offset, seq=start)

    def _verified_read(self, fd: int, offset: int, end: int, start: int) -> bytes:
        """Bytes ``[offset, end)`` after checking every seal record they touch (raw JSONL).

        A record not yet checked is read whole and its crc32 compared with the seal; a
        mismatch is :class:`LogCorruptError` naming the file, the byte range and the first seq
        asked for. Bytes no record covers (unsealed) are read as a full read reads them.
        """
        if self._elided is not None:
            older = [r for r in self._elided() if r[0] < self._cut_offset]
            self._seals[:0] = older
            self._seal_starts[:0] = [r[0] for r in older]
            self._elided = None
        seals = self._seals
        if not seals:
            return pread(fd, end - offset, offset)
        first = max(0, bisect.bisect_right(self._seal_starts, offset) - 1)
        # only the records that start before ``end``: a walk to the last record made each
        # page-in cost O(records), quadratic over a long log's pages
        last = bisect.bisect_left(self._seal_starts, end)
        todo = [i for i in range(first, last)
                if seals[i][1] > offset and i not in self._verified]
        if not todo:
            return pread(fd, end - offset, offset)
        lo = min(offset, seals[todo[0]][0])
        hi = max(end, seals[todo[-1]][1])
        data = pread(fd, hi - lo, lo)
        view = memoryview(data)  # crc32 of each record without copying it
        path = str(self._path)
        for i in todo:
            s, e, crc = seals[i]
            if len(data) < e - lo or crc_of(view[s - lo:e - lo]) != crc:
                raise LogCorruptError(
                    f"corrupt session log: bytes {s}..{e} of {path} differ from what was "
                    f"committed (crc32 mismatch with the integrity seal), found paging in "
                    f"events from seq {start} after a resume from a restore point; run dsh "
                    f"verify, restore the file from a backup", path=path, byte_offset=s,
                    seq=start)
            self._verified.add(i)
        return data[offset - lo:end - lo]

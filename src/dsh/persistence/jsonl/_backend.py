"""dsh's JSONL backend on disk: layout, atomic first write, appends with rollback, torn tails.

On-disk format (docs/formats.md#jsonl): ``<root>/<project dir>/<encoded id>/session.jsonl`` (raw)
or ``session.jsonl.zstd`` (one checksummed Zstandard frame per batch). The pure encoding and
scanning rules live in :mod:`dsh.persistence.jsonl._format`; this module does the file work:

* first materialization is atomic and never overwrites (temp file + fsync + ``link`` +
  directory fsync, docs/formats.md#writing); creation is lazy (nothing on disk before the first
  event);
* an append is one ``write`` (raw) or one frame (zstd); a failed write is truncated back, and a
  failed ``flush`` (fsync) truncates back to the last durable size and forgets the batch, so a
  retry of the same batch leaves no seq gap and no duplicate;
* a torn tail is truncated (and fsynced) before the first write through a write handle, after
  its bytes are saved beside the log (:mod:`dsh.persistence._salvage`);
* raw logs get an integrity seal beside them (``session.jsonl.seal``, one crc32 record per
  durable batch, :mod:`dsh.persistence._seal`); zstd frames carry their own checksums;
* a read handle reads a raw log's suffix (``read(offset)``, ``offset > 0``) and any seq range
  without the lines before them (:mod:`dsh.persistence.jsonl._ranges`), falling back to the
  whole file at any doubt;
* write handles hold ``<session dir>/session.lock`` (see :mod:`dsh.persistence._lock`), which
  dsh tolerates as an extra file in the session-owned directory (docs/formats.md#jsonl).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import mmap
import os
import re
import secrets
import stat
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

import zstandard

from dsh._errors import (
    ConfigError,
    DshError,
    LogCorruptError,
    PersistenceError,
    SealDamagedError,
    SessionExistsError,
    SessionNotFoundError,
)
from dsh.json import FrozenDict, loads
from dsh.persistence import _restore_point as rp
from dsh.persistence._after_commit import AfterCommit
from dsh.persistence._chain import HEAD_EVERY, ChainState, carry, incarnation_bytes, this_writer
from dsh.persistence._contract import (
    Capabilities,
    ColdRead,
    HandleBase,
    OpenMode,
    Resealed,
    TornTail,
    check_session_id,
    normalize_header,
    session_id_problem,
    validate_batch,
)
from dsh.persistence._listing import (
    EntryFold,
    JsonlIndex,
    ListingEntry,
    ReadFn,
    note_flushed,
    recorded_flush,
    signature,
    summarize,
)
from dsh.persistence._lock import SessionLock
from dsh.persistence._paths import (
    file_revision,
    fsync_folder,
    mkdir_private,
    refuse_special,
    refuse_symlink,
)
from dsh.persistence._salvage import list_cuts, save_cut
from dsh.persistence._seal import (
    Seal,
    SealCut,
    append_batch_to,
    append_chain_to,
    append_restore_point_mark,
    aside_name,
    check_byte_seals,
    crc_of,
    install_seal,
    open_seal_appender,
    publish_head,
    read_elided,
    read_seal,
    read_seal_after,
    refuse_reseal_over_damage,
    reset_seal,
    restore_point_mark,
    seal_binding,
    seal_cut,
    stage_seal,
    staged_seals,
)
from dsh.persistence._search import SIDECAR_NAME, SearchIndex, SidecarIndex
from dsh.persistence._search import note_flushed as note_search
from dsh.persistence.jsonl import _ranges as jranges
from dsh.persistence.jsonl import _restore_point as jrp
from dsh.persistence.jsonl._format import (
    SEAL_MARK,
    ZSTD_MAGIC,
    Scanner,
    encode_header_line,
    encode_records,
    encode_segment,
    has_seal_mark,
    is_project_dir_name,
    parse_header_lenient,
    parse_header_strict,
    project_dir_name,
    scan_zstd_frames,
)
from dsh.persistence.jsonl._search_journal import JOURNAL_NAME as SEARCH_JOURNAL_NAME
from dsh.persistence.jsonl._search_journal import JournalFreshness, mark_closed, mark_writing
from dsh.persistence.jsonl._zstd import compressor, decompress_frame, decompressor
from dsh.session import SESSION_FORMAT_VERSION, Event, decode_storage_record

__all__ = ["JsonlBackend", "JsonlHandle", "parse_log"]

logger = logging.getLogger(__name__)

Compression = Literal["none", "zstd"]

_RAW_NAME = "session.jsonl"
_ZSTD_NAME = "session.jsonl.zstd"
_LOCK_NAME = "session.lock"
_SEAL_SUFFIX = ".seal"
_CKPT_SUFFIX = ".ckpt"
_HEADER_READ_CHUNK = 8192
_TORN_FEED_CHUNK = 4096


def _is_file(path: Path) -> bool:
    """``Path.is_file`` that answers False for a name too long to exist (a 255-byte id)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            return False
        raise


def _mkdir_durable(path: Path, what: str) -> None:
    """``mkdir`` (mode 0700) and fsync the parent so the new entry survives a crash.

    Rule: docs/formats.md#writing.

    Raises:
        PersistenceError: code ``SYMLINK`` / ``NOT_A_DIRECTORY`` (see ``mkdir_private``).
    """
    if mkdir_private(path, what):
        fsync_folder(path.parent)


_STABLE_TRIES = 3
"""Whole-file reads tried before a reader settles for the committed prefix (see below)."""


def _stable_read(path: Path, session_id: str, *, compression: Compression = "none",
                 settle: bool = True) -> tuple[bytes, str]:
    """Read the log as one consistent state.

    Rule: docs/formats.md#reading-the-committed-region,
    docs/rules.md#readers-of-a-log-being-written.

    First stat → read → stat until both stats agree. A log being written every turn may never
    hold still that long; then the reader takes the bytes the file held when it opened it, cut
    at the last complete record of a raw log (a Zstandard log's partial frame is reported as
    a torn tail, never cut by a reader): the log only grows under its writer, so that prefix
    is a state the log was in. The revision then names the prefix read. A write handle
    (``settle=False``) holds the lock, so only another program can be writing: it keeps trying
    for the whole file.

    Raises:
        SessionNotFoundError: the log vanished.
        PersistenceError: ``UNSTABLE_READ``: the log was replaced or shrank under every try
            (not dsh's writer: it only appends).
    """
    try:
        for attempt in range(50):
            if attempt < _STABLE_TRIES or not settle:
                before = os.stat(path)
                with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
                    data = f.read()
                after = os.stat(path)
                rev = file_revision(after)
                if file_revision(before) == rev and len(data) == after.st_size:
                    return data, rev
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                opened = os.fstat(fd)
                chunks: list[bytes] = []
                got = 0
                while got < opened.st_size:
                    chunk = os.pread(fd, opened.st_size - got, got)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    got += len(chunk)
            finally:
                os.close(fd)
            data = b"".join(chunks)
            after = os.stat(path)
            if after.st_ino != opened.st_ino or after.st_dev != opened.st_dev \
                    or after.st_size < opened.st_size or got != opened.st_size:
                continue  # replaced or cut under us: not an append-only writer's doing
            if compression == "none":
                data = data[:data.rfind(b"\n") + 1]
                if not data:
                    continue
            return data, f"{file_revision(opened)}:prefix:{len(data)}"
    except FileNotFoundError:
        raise SessionNotFoundError(f'session "{session_id}" not found (its log {path} '
                                   f"vanished)", session_id=session_id,
                                   path=str(path)) from None
    raise PersistenceError(f"log {path} kept changing while it was read (50 attempts): it was "
                           f"replaced or cut, or another program writes it", code="UNSTABLE_READ",
                           path=str(path))


_MAGIC_BYTES = ZSTD_MAGIC.to_bytes(4, "little")


def _refuse_damaged_frame(data: bytes, torn_start: int, path: str) -> None:
    """Refuse a "torn" frame that complete frames follow: it is damage, not a crash.

    One write puts one whole frame at the end of the file, so a crash leaves at most one
    incomplete frame, and nothing after it but zeros. A damaged header or block-size field of
    a middle frame makes the walker run past later frames; if any later position starts a
    complete frame whose content checksum verifies, the incomplete-looking frame is damage
    in committed data (truncating there would delete every later frame).

    Raises:
        LogCorruptError: naming the damaged frame's byte offset and where the next frame is.
    """
    pos = data.find(_MAGIC_BYTES, torn_start + 1)
    while pos >= 0:
        try:
            frames, _ = scan_zstd_frames(data[pos:], path=path, max_frames=1)
        except LogCorruptError:
            frames = []
        if frames:
            start, end = frames[0]
            try:
                decompress_frame(data[pos + start:pos + end], pos, path)
            except LogCorruptError:
                pass
            else:
                raise LogCorruptError(
                    f"corrupt session log: frame at byte {torn_start} is damaged (it reads as "
                    f"incomplete, but a complete frame follows at byte {pos}) in {path}",
                    path=path, byte_offset=torn_start)
        pos = data.find(_MAGIC_BYTES, pos + 1)


def _decompress_torn(partial: bytes) -> bytes:
    """Plaintext a torn final frame yields before its end or first error.

    Rule: docs/formats.md#zstandard-files.
    """
    dobj = decompressor().decompressobj()
    out: list[bytes] = []
    for pos in range(0, len(partial), _TORN_FEED_CHUNK):
        try:
            out.append(dobj.decompress(partial[pos:pos + _TORN_FEED_CHUNK]))
        except zstandard.ZstdError:
            break
        if dobj.eof:
            break
    return b"".join(out)


@dataclass(slots=True)
class ParsedLog:
    """A parsed log file: header, committed events, torn tail, committed byte length.

    ``header_end`` is the file offset after the header (line or frame); ``index`` holds
    ``(seq, file offset)`` of record (frame) starts inside the committed prefix, sparse
    (see :func:`dsh.persistence.jsonl._restore_point.note_index`), first ``(0, header_end)``.
    """

    header: FrozenDict
    events: list[Event]
    torn: TornTail | None
    committed: int
    header_end: int = 0
    index: list[tuple[int, int]] = field(default_factory=list)
    prescan: tuple[int, int] | None = None


def _sample_raw_index(data: bytes, header_end: int, committed: int) -> list[tuple[int, int]]:
    """Record starts every ``INDEX_EVERY_BYTES`` of a raw log (one record decoded per entry)."""
    return [(0, header_end),
            *_sample_lines(data, header_end, committed, rp.INDEX_EVERY_BYTES, after_seq=0)]


_APPEND_SAMPLE_BYTES: Final = 32 * 1024
"""Sampling step inside one large appended batch: ``note_index`` keeps the entries that are
``INDEX_EVERY_EVENTS`` apart, so a page-in after a resume from a restore point scans about
a page."""


def _sample_lines(data: bytes, pos: int, committed: int, step: int, *,
                  after_seq: int) -> list[tuple[int, int]]:
    """``(first seq, offset)`` of the line starting after each ``step`` bytes of ``data[pos:]``.

    Only seqs above ``after_seq`` (the seq at ``pos``) and rising are kept.

    The lines were accepted (a read) or just encoded (an append); a line that does not decode
    ends the sampling rather than guess.
    """
    index: list[tuple[int, int]] = []
    last = after_seq
    while True:
        nl = data.find(b"\n", pos + step, committed)
        if nl < 0 or nl + 1 >= committed:
            return index
        start = nl + 1
        end = data.find(b"\n", start, committed)
        try:
            first = decode_storage_record(loads(data[start:end]))[0]
        except DshError:
            return index
        seq = first.get("seq") if isinstance(first, dict) else None
        if type(seq) is int and seq > last:
            index.append((seq, start))
            last = seq
        pos = start


_STREAM_CHUNK_BYTES: Final = 1024 * 1024
"""Bytes a streamed raw read takes at a time: the read's peak holds one chunk, not the file."""
_STREAM_HEADER_MAX_BYTES: Final = 1024 * 1024
"""A longer header line is left to the whole read."""


class _SealCheck:
    """The seal records of a raw log checked against its bytes fed in file order."""

    def __init__(self, records: list[tuple[int, int, int]]) -> None:
        self._records = records
        self._next = 0  # the record being summed
        self._crc = 0
        self._ok = True

    def feed(self, chunk: bytes, offset: int) -> None:
        """Sum ``chunk`` (the file's bytes from ``offset``) into the records it touches."""
        records, k, crc, end = self._records, self._next, self._crc, offset + len(chunk)
        with memoryview(chunk) as view:
            while self._ok and k < len(records):
                start, stop, want = records[k]
                if start >= end:
                    break
                a, b = max(start, offset) - offset, min(stop, end) - offset
                if a < b:
                    crc = crc_of(view[a:b], crc)
                if stop > end:
                    break
                self._ok = crc == want
                crc, k = 0, k + 1
        self._next, self._crc = k, crc

    def finish(self) -> bool:
        """True when every record was fed whole and matched."""
        return self._ok and self._next == len(self._records)


class _IndexSampler:
    """:func:`_sample_raw_index` over a raw log fed in chunks (the same entries, same rules).

    ``feed`` takes consecutive pieces of the file from the header's end; ``index`` then
    holds ``(seq, offset, line end)`` of each sampled record, cut at the committed length by
    :meth:`finish`.
    """

    def __init__(self, header_end: int) -> None:
        self.entries: list[tuple[int, int, int]] = []
        self._from = header_end + rp.INDEX_EVERY_BYTES  # the next "\n" at or after this
        self._start = -1  # offset of the record to decode once its line is complete
        self._part = b""
        self._last = 0
        self._done = False

    def feed(self, chunk: bytes, offset: int) -> None:
        end = offset + len(chunk)
        while not self._done:
            if self._start < 0:
                if self._from >= end:
                    return
                nl = chunk.find(b"\n", max(self._from - offset, 0))
                if nl < 0:
                    return
                self._start = offset + nl + 1
            rel = self._start - offset
            if rel >= len(chunk):
                return  # the record starts in a later chunk
            nl = chunk.find(b"\n", max(rel, 0))
            if nl < 0:
                self._part += chunk[max(rel, 0):]
                return
            line, self._part = self._part + chunk[max(rel, 0):nl], b""
            try:
                first = decode_storage_record(loads(line))[0]
            except DshError:
                self._done = True
                return
            seq = first.get("seq") if isinstance(first, dict) else None
            if type(seq) is int and seq > self._last:
                self.entries.append((seq, self._start, offset + nl + 1))
                self._last = seq
            self._from = self._start + rp.INDEX_EVERY_BYTES
            self._start = -1

    def finish(self, header_end: int, committed: int) -> list[tuple[int, int]]:
        """The page-in index: ``(0, header_end)``, then the samples inside ``committed``."""
        index = [(0, header_end)]
        for seq, start, line_end in self.entries:
            if line_end > committed:
                break
            index.append((seq, start))
        return index


def _stream_raw(path: Path, seal: Seal | None) -> tuple[ParsedLog, int, bytes, str] | None:
    """Read and parse a raw log in bounded chunks; None at any doubt (then read it whole).

    Rule: docs/formats.md#reading-the-committed-region (streamed reads).

    The happy path of ``parse_log(_stable_read(...))``: stat, read chunk by chunk (each one
    scanned, its seal ranges checksummed and sampled for the index, then released), stat.
    Anything but a log read whole, unchanged, with its seal matching and no error is left to
    the whole read, which names the damage as it always did: the two stats differ or the
    bytes read are not the size, any scan error, a sealed range that differs or is cut off,
    a seal whose records are not in order, a header with the seal mark but no seal records.

    Returns:
        ``(parsed, file size, header bytes, revision)``, or None.
    """
    records = seal.records if seal is not None else []
    if any(a[1] > b[0] for a, b in itertools.pairwise(records)):
        return None
    try:
        before = os.stat(path)
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
            head = f.readline(_STREAM_HEADER_MAX_BYTES)
            nl = head.find(b"\n")
            if nl < 0 or nl + 1 != len(head):
                return None  # a header longer than a chunk, or none: the whole read
            header = parse_header_strict(head, path=str(path))
            if (seal is None or not records) and has_seal_mark(head):
                return None
            header_end = len(head)
            scanner = Scanner(path=str(path), start_offset=header_end)
            sampler = _IndexSampler(header_end)
            crcs = _SealCheck(records)
            crcs.feed(head, 0)
            offset = header_end
            while True:
                chunk = f.read(_STREAM_CHUNK_BYTES)
                if not chunk:
                    break
                crcs.feed(chunk, offset)
                scanner.feed(chunk)
                sampler.feed(chunk, offset)
                offset += len(chunk)
        after = os.stat(path)
    except (OSError, DshError):
        return None  # the whole read raises what applies (vanished, corrupt, unstable)
    revision = file_revision(after)
    if file_revision(before) != revision or offset != after.st_size \
            or not crcs.finish():
        return None
    result = scanner.finish()
    torn = None
    if result.committed < offset:
        torn = TornTail(result.committed, result.issue_line,
                        result.reason or "uncommitted tail")
    return (ParsedLog(header, result.events, torn, result.committed, header_end,
                      sampler.finish(header_end, result.committed), result.prescan),
            offset, head, revision)


def parse_log(data: bytes, *, compression: Compression, path: str,
              seal: Seal | None = None) -> ParsedLog:
    """Parse a whole log file (raw or zstd) into its committed prefix.

    Rule: docs/formats.md#header-line, docs/formats.md#record-lines, docs/formats.md#raw-files,
        docs/formats.md#zstandard-files, docs/formats.md#reading-the-committed-region.

    Args:
        data: The file bytes.
        compression: ``"none"`` or ``"zstd"``.
        path: Named in errors.
        seal: Raw JSONL: the integrity seal read before ``data``; every sealed byte range is
            checked first (see :mod:`dsh.persistence._seal`).

    Returns:
        ParsedLog: ``committed`` is the file length that stays (raw: after the last good line;
        zstd: the start of a torn final frame, else the file length).

    Raises:
        LogCorruptError: header-less, bad header, damage inside the committed region, a bad
            zstd frame, a complete frame ending inside a record, a sealed byte range cut off
            or changed.
        SessionFormatUnsupportedError: a foreign format version.
    """
    if compression == "none":
        nl = data.find(b"\n")
        header_line = data if nl < 0 else data[:nl + 1]
        header = parse_header_strict(header_line, path=path)
        scanner = Scanner(path=path, start_offset=len(header_line))
        scanner.feed(data, len(header_line))
        result = scanner.finish()
        if seal is not None:  # after the scan, whose errors name the record more precisely
            check_byte_seals(data, seal, log_path=path)
        torn = None
        if result.committed < len(data):
            torn = TornTail(result.committed, result.issue_line,
                            result.reason or "uncommitted tail")
        return ParsedLog(header, result.events, torn, result.committed, len(header_line),
                         _sample_raw_index(data, len(header_line), result.committed),
                         result.prescan)
    frames, torn_start = scan_zstd_frames(data, path=path)
    if torn_start is not None:
        _refuse_damaged_frame(data, torn_start, path)
    if not frames:
        raise LogCorruptError(f"corrupt session log: empty or header-less Zstandard session log "
                              f"{path}", path=path, byte_offset=0)
    start, end = frames[0]
    plain = decompress_frame(data[start:end], start, path)
    if not plain.endswith(b"\n") or plain.count(b"\n") != 1:
        raise LogCorruptError(f"corrupt session log: first frame is not exactly one header line "
                              f"in {path}", path=path, byte_offset=0, line=1)
    header = parse_header_strict(plain, path=path)
    scanner = Scanner(path=path, start_offset=len(plain))
    logical = len(plain)
    frame_starts: list[tuple[int, int]] = []  # (logical offset, file offset) per frame
    index = [(0, end)]
    for start, end in frames[1:]:
        text = decompress_frame(data[start:end], start, path)
        frame_starts.append((logical, start))
        jrp.note_index(index, scanner.accepted, start)
        scanner.feed(text)
        logical += len(text)
    partial = scanner.finish()
    if partial.committed != logical or partial.reason is not None:
        where = partial.issue_offset if partial.issue_offset is not None else partial.committed
        file_offset = next((f for lg, f in reversed(frame_starts) if lg <= where), 0)
        raise LogCorruptError(
            f"corrupt session log: complete frame contains a torn JSONL record (frame at byte "
            f"{file_offset}, {partial.reason}) in {path}", path=path, byte_offset=file_offset,
            line=partial.issue_line)
    header_end = index[0][1]
    if torn_start is None:
        return ParsedLog(header, partial.events, None, len(data), header_end, index,
                         partial.prescan)
    committed_count = len(partial.events)
    # The same scanner continues (it stopped clean at a record boundary), so duplicate seqs
    # in the torn frame are still named with both lines.
    scanner.feed(_decompress_torn(data[torn_start:]))
    tail = scanner.finish()
    recovered = tuple(tail.events[committed_count:])
    reason = (f"torn final Zstandard frame at byte {torn_start} ({len(data) - torn_start} "
              f"bytes); {len(recovered)} complete event(s) recovered from it")
    torn = TornTail(torn_start, tail.issue_line, reason, recovered)
    return ParsedLog(header, list(tail.events), torn, torn_start, header_end, index)


_LETTER_ESCAPE: Final = re.compile(rb"\\u00[4-7]")
"""A JSON ``\\u`` escape of a character in U+0040..U+007F (every ASCII letter among them)."""


def _may_remove(path: Path) -> bool:
    """Whether the raw log at ``path`` may hold a removal record (by bytes).

    A quarantine record, an old adapter mark
    (docs/forgetting.md#logs-from-before-surface-removals) or a replace.
    """
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return False
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return (data.find(b"replace") >= 0 or data.find(b"quarantine") >= 0
                        or data.find(b'/clear"') >= 0 or data.find(b'/pop"') >= 0  # old marks
                        or (data.find(b"\\u00") >= 0
                            and _LETTER_ESCAPE.search(data) is not None))
    except OSError:  # the caller's whole read names what is wrong with it
        return True


def _file_of(revision: str) -> tuple[int, int] | None:
    """The ``(inode, device)`` a :func:`file_revision` string (``dev:ino:…``) was built from."""
    dev, _, rest = revision.partition(":")
    ino = rest.partition(":")[0]
    return (int(ino), int(dev)) if dev.isdigit() and ino.isdigit() else None


@dataclass(slots=True)
class _Tail:
    """What a write handle knows about the stored log (valid while it holds the lock)."""

    materialized: bool
    count: int  # events the next append continues (recovered torn-frame events included)
    size: int  # file bytes written, durable or not
    torn: TornTail | None
    durable_count: int
    durable_size: int
    # A failed write or fsync could not truncate its bytes away: the file's real end is past
    # ``size`` and nothing may be written (O_APPEND would land after them) until it is fixed.
    end_unknown: bool = False
    # raw JSONL only: the valid seal records, and whether the seal file must be rewritten
    # (first seal of this handle: a crash may have left a partial record after them)
    seals: list[tuple[int, int, int]] | None = None
    seal_rewrite: bool = True
    # raw JSONL only: the restore point digests the seal records (kept when it is rewritten)
    restore_marks: list[bytes] = field(default_factory=list)
    # the seal's hash chain and the events not chained yet (docs/formats.md#the-seal-chain);
    # Zstandard: the chain sidecar's, loaded at the first flush (``chain_loaded``)
    chain: ChainState | None = None
    chain_loaded: bool = True
    # raw JSONL only: set after a resume through a restore point whose seal records before
    # its cut were checked by digest and not read; ``seals`` and ``chain`` then hold the ones
    # after it, and a writer that needs them all reads them first (``_unelide``)
    seal_cut: SealCut | None = None
    # the page-in index of the stored prefix, and the header's extent and digest (restore
    # points); after a resume through one, its PageIndex (inflated at first need)
    index: list[tuple[int, int]] | rp.PageIndex = field(default_factory=list)
    header_end: int = 0
    header_digest: str = ""


SEAL_RECORD_BYTES: Final = 64 * 1024
"""A seal record covers at most about this many bytes of a batch (whole lines; a longer line
gets a record of its own), so a verified page-in reads about a page, not a whole import."""


def _seal_records(content: bytes, start: int) -> list[tuple[int, int, int]]:
    """Seal records over ``content`` (the log's bytes from ``start``), split at line ends.

    Rule: docs/formats.md#integrity-seals (records are contiguous; one batch may have several).
    """
    records: list[tuple[int, int, int]] = []
    pos, size = 0, len(content)
    while pos < size:
        cut = size
        if size - pos > SEAL_RECORD_BYTES:
            cut = content.rfind(b"\n", pos, pos + SEAL_RECORD_BYTES) + 1
            if cut <= pos:  # one line longer than a record: the whole line
                cut = content.find(b"\n", pos + SEAL_RECORD_BYTES) + 1 or size
        records.append((start + pos, start + cut, crc_of(content[pos:cut])))
        pos = cut
    return records


class JsonlHandle(HandleBase):
    """A handle on one JSONL session (contract: :class:`~dsh.persistence._contract.Handle`)."""

    def __init__(self, backend: JsonlBackend, session_id: str, mode: OpenMode, path: Path,
                 pending_header: FrozenDict | None, lock: SessionLock | None) -> None:
        self._backend = backend
        self._id = session_id
        self._mode: OpenMode = mode
        self.path = path
        self._pending_header = pending_header
        self._lock = lock
        self._fd: int | None = None
        self._fd_file: tuple[int, int] | None = None  # (inode, device) of ``_fd``
        # (inode, device) of the log file the tail was read from: the first append's file
        # must be that one (a file replaced between the read and that open is refused)
        self._read_file: tuple[int, int] | None = None
        self._tail: _Tail | None = None
        self._closed = False
        # the listing entry kept at flush (listing.EntryFold): the log's signature when it was
        # read, the fold once known, the events appended since the last flush; off for good
        # once the entry cannot be known (a torn tail, no index entry, a failed fsync)
        self._listing_base: list[int] | None = None
        self._listing: EntryFold | None = None
        self._listing_pending: list[Event] = []
        self._listing_off = False
        self._listing_where: tuple[Path, str] | None = None
        # the events to add to the store's search index at the next flush, whether this
        # handle named its session in the search journal, and whether the index held the log
        # exactly after its last flush (docs/stores.md#search)
        self._search_pending: list[Event] = []
        self._search_marked = False
        self._search_exact = False
        # post-commit steps (seal, listing journal): contained and reported, never raised
        self.after_commit = AfterCommit(session_id)

    def _check_open(self) -> None:
        if self._closed:
            raise PersistenceError(f"handle for session {self._id!r} is closed",
                                   code="HANDLE_CLOSED", session_id=self._id)

    def read(self, offset: int = 0) -> ColdRead:
        """Read header and committed events with ``seq >= offset`` (see ``Handle.read``).

        A read handle of a raw log asked for ``offset > 0`` reads only the lines from the one
        holding ``offset`` (found by bisection, checked against the seal records they touch),
        and the whole file at any doubt (docs/formats.md#reading-the-committed-region).

        Raises:
            LogCorruptError: see :func:`parse_log`; also a header whose id or cwd does not
                identify this file ("stored session identity mismatch").
            SessionFormatUnsupportedError: a foreign format version (with the raw log path).
            SessionNotFoundError: the log vanished.
        """
        self._check_open()
        if type(offset) is not int or offset < 0:
            raise ConfigError(f"read offset must be a non-negative integer event seq, got "
                              f"{offset!r}", session_id=self._id)
        if self._pending_header is not None and not self.path.exists():
            if self._mode == "write" and self._tail is None:
                self._tail = _Tail(False, 0, 0, None, 0, 0)
                self._read_file = None  # created by the first append
            return ColdRead(self._pending_header, (), None, f"unmaterialized:{self._id}")
        raw = self._backend.compression == "none"
        if offset > 0 and raw and self._mode == "read":  # docs/stores.md#reading-by-page
            suffix = jranges.read_suffix(
                self.path, offset, self._seal_path(),
                lambda header: self._backend._check_identity(self._id, header, self.path))
            if suffix is not None:
                return ColdRead(suffix[0], tuple(suffix[1]), None, suffix[2])
        # The seal is read before the log: the log only grows under a writer, so every range
        # the seal names is then inside the bytes read.
        seal = read_seal(self._seal_path()) if raw else None
        # a Zstandard log's chain sidecar is read before it too: what it chains was durable
        chained = None if raw else self._zstd_chained()
        # a raw log is streamed in chunks (its peak is one chunk, not the file); at any
        # doubt it is read whole, which names the damage (docs/formats.md)
        streamed = _stream_raw(self.path, seal) if raw else None
        data = b""  # streamed: never needed (a log missing its seal is not streamed)
        if streamed is not None:
            parsed, size, head, revision = streamed
        else:
            data, revision = _stable_read(self.path, self._id,
                                          compression=self._backend.compression,
                                          settle=self._mode == "read")
            parsed = parse_log(data, compression=self._backend.compression,
                               path=str(self.path), seal=seal)
            size, head = len(data), data[:parsed.header_end]
        self._backend._check_identity(self._id, parsed.header, self.path)
        if raw and (seal is None or not seal.records) and has_seal_mark(head):
            adopted = self._adopt_staged_seal(data)
            if adopted is None:
                raise self._seal_missing()
            seal, parsed = adopted
        elif self._mode == "write" and os.path.lexists(aside_name(self._seal_path())):
            # a rewrite was interrupted after moving the old seal aside: its staged seals
            # go (one stat here on every write-open instead of listing the folder); a
            # Zstandard log first takes back the chain sidecar that matches it
            if not raw and not os.path.lexists(self._seal_path()):
                found = self._zstd_chain_candidate(len(parsed.events))
                if found is not None:
                    install_seal(found, self._seal_path())
                    logger.warning("session %s: adopted the chain sidecar %s that an "
                                   "interrupted rewrite left for %s", self._id, found,
                                   self.path)
            self._drop_staged_seals()
        if parsed.torn is not None and parsed.torn.byte_offset is not None:
            self._check_not_cut(parsed.torn.byte_offset,  # events of complete records
                                len(parsed.events) - len(parsed.torn.recovered), parsed.header,
                                size)
        elif not raw:  # a raw log cut at a line boundary is caught by its seal
            self._check_not_cut(parsed.committed, len(parsed.events), parsed.header, size)
        if chained is not None:
            complete = len(parsed.events) - (
                len(parsed.torn.recovered) if parsed.torn is not None else 0)
            self._check_chained(chained, parsed.committed, complete, head, size)
        if self._mode == "write":
            self._pending_header = None
            self._read_file = _file_of(revision)
            self._listing_reset(parsed.torn is None)
            self._tail = _Tail(True, len(parsed.events), size, parsed.torn,
                               len(parsed.events), size,
                               seals=(seal.records if seal is not None else []) if raw else None,
                               index=parsed.index, header_end=parsed.header_end,
                               header_digest=rp.digest(head),
                               restore_marks=list(seal.restore_points) if seal else [],
                               chain=(seal.chain_state() if seal is not None
                                      else ChainState([])) if raw else ChainState([]),
                               chain_loaded=raw)
        if offset == 0:  # a Scanner from seq 0 took every event at the next seq
            return ColdRead(parsed.header, tuple(parsed.events), parsed.torn, revision,
                            parsed.prescan, contiguous=True)
        return ColdRead(parsed.header, tuple(parsed.events[offset:]), parsed.torn, revision)

    def append(self, events: Sequence[Event]) -> None:
        """Append one atomic batch (see ``Handle.append``).

        Raises:
            PersistenceError: read handle, closed handle, seq mismatch (``SEQ_MISMATCH``).
            InvalidJsonError: an event is not lossless JSON (``json_path`` names the field).
            SessionExistsError: first materialization found a log already on disk.
            OSError: the write failed; partial bytes were truncated away.
        """
        self._check_open()
        if self._mode != "write":
            raise PersistenceError(f"cannot append to session {self._id!r} through a read "
                                   f"handle; open it with mode 'write'", code="READ_ONLY",
                                   session_id=self._id)
        if self._tail is None:
            self.read(0)
        tail = self._tail
        assert tail is not None
        batch = validate_batch(events, tail.count, self._id)
        torn = tail.torn
        if not batch and torn is None:
            return
        self._mark_search()
        if tail.end_unknown:
            self._restore_end()
        if not tail.materialized:
            if batch:
                self._materialize(batch)
            return
        if torn is not None:
            self._truncate_torn(torn)
            self._listing_off = True
        records = list(torn.recovered) + batch if torn is not None else batch
        if records:
            self._check_same_file()
            payload = encode_records(records, pack_chunks=self._backend.pack_chunks)
            if self._backend.compression == "zstd":
                payload = self._backend._compress(payload)
            start = tail.size
            self._write(payload)
            jrp.note_index(tail.index, records[0]["seq"], start)
            if not self._listing_off:
                self._listing_pending.extend(batch)
            self._search_pending.extend(batch)
            if tail.chain is not None:
                tail.chain.pending.extend(records)
            if self._backend.compression == "none":
                for seq, offset in _sample_lines(payload, 0, len(payload), _APPEND_SAMPLE_BYTES,
                                                 after_seq=records[0]["seq"]):
                    jrp.note_index(tail.index, seq, start + offset)
            tail.count += len(batch)
        if torn is not None:
            # The repair is made durable at once: until then the recovered events of a torn
            # frame exist nowhere on disk, and a later fsync failure must not lose them.
            if records:
                self._backend._os_fsync(self._append_fd())
            tail.torn = None
            tail.durable_size = tail.size
            tail.durable_count = tail.count
            self._seal()

    def _truncate_torn(self, torn: TornTail) -> None:
        # Idempotent: a failed write leaves ``tail.torn`` set, so a retry truncates again and
        # re-writes the recovered events (docs/formats.md#writing repair).
        tail = self._tail
        assert tail is not None and torn.byte_offset is not None
        fd = self._append_fd()
        with open(self.path, "rb") as f:
            f.seek(torn.byte_offset)
            cut = f.read()
        if cut:
            # Saved first: if the torn judgement is wrong, the bytes still exist
            # (docs/rules.md#crash-safety).
            saved = save_cut(self.path.parent, self.path.name, cut)
            logger.warning("torn tail of session %s (%d bytes at byte %d of %s) saved to %s "
                           "before truncating", self._id, len(cut), torn.byte_offset,
                           self.path, saved)
        os.ftruncate(fd, torn.byte_offset)
        os.fsync(fd)
        tail.size = tail.durable_size = torn.byte_offset
        tail.index = [entry for entry in tail.index if entry[1] < torn.byte_offset]

    def _restore_end(self) -> None:
        """Cut the bytes a failed rollback left after ``tail.size``, or refuse to write.

        Those bytes are this handle's own unacknowledged batch (it holds the session lock), so
        removing them loses nothing that was acknowledged; writing after them would store the
        batch twice (a duplicate seq that no reader accepts).

        Raises:
            PersistenceError: code ``LOG_END_UNKNOWN``: the truncation failed again; nothing is
                written through this handle until a retry succeeds.
        """
        tail = self._tail
        assert tail is not None
        fd = self._append_fd()
        try:
            if os.fstat(fd).st_size != tail.size:
                self._backend._os_ftruncate(fd, tail.size)
                self._backend._os_fsync(fd)
        except OSError as exc:
            raise PersistenceError(
                f"session {self._id!r}: an earlier failed write left unacknowledged bytes after "
                f"byte {tail.size} of {self.path}, and removing them failed again ({exc}); "
                f"nothing more is written through this handle until that succeeds (free disk "
                f"space, then retry the flush)", code="LOG_END_UNKNOWN", session_id=self._id,
                path=str(self.path), byte_offset=tail.size) from exc
        tail.end_unknown = False

    def _append_fd(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW)
            st = os.fstat(self._fd)
            # the file the tail was read from, when known: one replaced since is refused by
            # _check_same_file even when this open already found the replacement
            self._fd_file = self._read_file or (st.st_ino, st.st_dev)
        return self._fd

    def _check_same_file(self) -> None:
        """Refuse to append unless the log at ``self.path`` is the file this handle wrote.

        One ``stat`` per appended batch (one per flush of a session). ``O_APPEND`` writes at
        the file's end: a log cut under the writer (another program, a restore) would take the
        batch at its new, shorter end (a seq gap after lost committed events), and a log
        replaced or removed would take it in a file no reader sees. Damage is named, never
        written over (docs/formats.md#writing). Bytes another program appended after the
        writer's are not refused here (a reader judges them; the listing stops trusting the
        writer's fold, see ``_note_listing``).

        Raises:
            LogCorruptError: naming the file, the size this handle wrote and the size found
                (or that the file was replaced or removed); nothing is written, and every
                later append through this handle refuses the same way.
        """
        tail = self._tail
        assert tail is not None
        self._append_fd()
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            found = "no longer exists"
        else:
            if (st.st_ino, st.st_dev) == self._fd_file and st.st_size >= tail.size:
                return  # bytes another program added after ours: the listing stops trusting
            found = (f"was replaced by another file ({st.st_size} bytes)"
                     if (st.st_ino, st.st_dev) != self._fd_file
                     else f"holds {st.st_size} bytes")
        raise LogCorruptError(
            f"corrupt session log {self._id!r} in {self.path}: the file changed under its "
            f"writer: this handle wrote {tail.size} bytes ({tail.count} events), and the file "
            f"{found}; nothing was written (committed events would be lost or written "
            f"over); restore the file from a backup, then resume the session",
            path=str(self.path),
            byte_offset=tail.size, seq=tail.count, session_id=self._id)

    def _write(self, payload: bytes) -> None:
        tail = self._tail
        assert tail is not None
        fd = self._append_fd()
        before = tail.size
        view = memoryview(payload)
        try:
            written = 0
            while written < len(payload):
                written += self._backend._os_write(fd, view[written:])
        except BaseException:
            # docs/formats.md#writing: roll back partial bytes so a retry leaves no seq gap
            try:
                self._backend._os_ftruncate(fd, before)
            except OSError:
                tail.end_unknown = True
            raise
        tail.size = before + len(payload)

    def _materialize(self, batch: list[Event]) -> None:
        tail = self._tail
        assert tail is not None and self._pending_header is not None
        raw = self._backend.compression == "none"
        content = self._backend._initial_content(self._pending_header, batch, seal_mark=raw)
        tail.header_end = content.index(b"\n") + 1 if raw else 0
        tail.header_digest = rp.digest(content[:tail.header_end]) if raw else ""
        if raw:
            tail.chain = ChainState([], pending=list(batch))
            try:
                tail.chain.take(len(batch), self._incarnation(), this_writer())
            except Exception as exc:  # sealed without a chain record: the next flush chains
                tail.chain = ChainState([], pending=list(batch))
                self.after_commit.failed("seal", exc, "the next flush chains these events")
        else:  # chained at the first flush after the log is durable (_chain_zstd)
            tail.chain, tail.chain_loaded = ChainState([], pending=list(batch)), False
        staged, records = self._stage_first_seal(content) if raw else (None, [])
        if staged is None and raw:  # no seal could be written: no mark that promises one
            content = self._backend._initial_content(self._pending_header, batch)
            tail.chain = ChainState([], pending=list(batch))  # bound to the unmarked header
        try:
            self._backend._publish(self.path, content, self._id,
                                   before_link=None if staged is None else
                                   lambda: install_seal(staged, self._seal_path()))
        except BaseException:
            if staged is not None:  # the seal of a log that was not published
                for leftover in (staged, self._seal_path()):
                    with contextlib.suppress(OSError):
                        os.unlink(leftover)
            raise
        tail.materialized = True
        tail.count = tail.durable_count = len(batch)
        tail.size = tail.durable_size = len(content)
        if self._backend.compression == "zstd":
            tail.header_end = scan_zstd_frames(content, path=str(self.path), max_frames=1)[0][0][1]
        else:
            tail.header_end = content.index(b"\n") + 1
        tail.header_digest = rp.digest(content[:tail.header_end])
        tail.index = [(0, tail.header_end)]
        try:  # the header as a read gives it back (known keys, delegationDepth always present)
            header = parse_header_strict(encode_header_line(self._pending_header),
                                         path=str(self.path))
        except DshError:  # a foreign format version: a read refuses it, the listing reports it
            self._listing_off = True
        else:
            self._listing = EntryFold.start(header)
            self._listing_pending = list(batch)
            self._listing_off = False
        if self._backend.compression == "none":
            for seq, offset in _sample_lines(content, tail.header_end, len(content),
                                             _APPEND_SAMPLE_BYTES, after_seq=0):
                jrp.note_index(tail.index, seq, offset)
        self._pending_header = None
        self._backend._forget_pending(self._id)
        if staged is not None:
            tail.seals = records
            tail.seal_rewrite = False
        elif raw:
            tail.seals = []
            self._seal(content)
        else:
            self._chain_zstd()
        self._note_listing_safely()  # the published file is durable (see _publish)
        # a new session's first batch goes to the search index, when there is one
        self._search_pending = list(batch)
        self.after_commit.run("search", self._note_search,
                              "the next search reads this log itself")

    def reseal_committed(self, *, keep: bool = False, read: ColdRead | None = None
                         ) -> Resealed:
        """Seal this raw log's committed bytes as they are now (:meth:`JsonlBackend.reseal`).

        With ``keep`` (this handle's last read passed the present seal), a chained seal is
        kept with its records and chain: as it is when it covers every committed byte and
        chains every event; else extended by range records over the committed bytes past its
        last record and one chain record for the events past its chain's end, so a proof kept
        before still holds. Otherwise (a lost, damaged or chainless seal) the seal is rebuilt
        with a new chain (docs/formats.md#integrity-seals). ``read`` is that last read (all
        events from seq 0): an extension then reads only the bytes past the seal, when the
        file is still the one it read (same revision); else the log is read again.

        Returns:
            The seal file's path, whether the present seal was kept, and whether it was
            extended.

        Raises:
            PersistenceError: ``READ_ONLY`` for a read handle.
            LogCorruptError: the log breaks the format's rules.
            OSError: the seal could not be written.
        """
        self._check_open()
        if self._mode != "write":
            raise PersistenceError(f"cannot reseal session {self._id!r} through a read handle",
                                   code="READ_ONLY", session_id=self._id)
        tail = self._tail
        keep = keep and tail is not None and tail.seals is not None and tail.chain is not None
        if keep and tail is not None and tail.chain is not None:
            self._unelide()  # a resume's unread records: the kept seal is written whole
            if (tail.seals[-1][1] if tail.seals else 0) == (
                    tail.torn.byte_offset if tail.torn is not None else tail.size) \
                    and tail.chain.end == tail.count:
                logger.info("session %s: integrity seal %s kept: the log passes it and it "
                            "covers the whole log", self._id, self._seal_path())
                return Resealed(str(self._seal_path()), kept=True)
        since = self._read_past_seal(tail, read) if keep else None
        if since is not None and tail is not None and read is not None:
            # a clean change: the read's events, and only the bytes past the seal read again
            end, tail_bytes = since
            events: Sequence[Event] = read.events
            incarnation = incarnation_bytes(tail.header_digest)
            committed = end + len(tail_bytes)
        else:
            data, _ = _stable_read(self.path, self._id, compression="none", settle=False)
            parsed = parse_log(data, compression="none", path=str(self.path))
            events, committed = parsed.events, parsed.committed
            incarnation = incarnation_bytes(rp.digest(data[:parsed.header_end]))
            end = tail.seals[-1][1] if tail is not None and tail.seals else 0
            tail_bytes = data[end:committed]
        count = len(events)
        if keep and tail is not None and tail.seals is not None and tail.chain is not None \
                and end <= committed and tail.chain.end <= count:
            chain = tail.chain
            chain.pending = list(events[chain.end:])
            chain.take(count, incarnation, this_writer())
            reset_seal(self._seal_path(), b"", [*tail.seals, *_seal_records(tail_bytes, end)],
                       tail.restore_marks[-1:], chain=chain)
            self._tail = None  # the next use reads the log through its extended seal
            logger.warning("session %s: integrity seal %s kept and extended over bytes "
                           "%d..%d of %s as they are now, its chain going on", self._id,
                           self._seal_path(), end, committed, self.path)
            return Resealed(str(self._seal_path()), kept=True, extended=True)
        if since is not None:  # not extendable after all: the whole log, read as it is now
            return self.reseal_committed(keep=False)
        chain = ChainState([], pending=list(events))
        chain.take(count, incarnation, this_writer())
        reset_seal(self._seal_path(), b"", _seal_records(data[:committed], 0), chain=chain)
        self._tail = None  # the next use reads the log through its new seal
        logger.warning("session %s: integrity seal %s rebuilt over the %d committed bytes of %s "
                       "as they are now", self._id, self._seal_path(), committed, self.path)
        return Resealed(str(self._seal_path()), kept=False)

    def _read_past_seal(self, tail: _Tail | None, read: ColdRead | None
                        ) -> tuple[int, bytes] | None:
        """The committed bytes past the seal's last record, as ``read`` saw the file, or None.

        None (read the log whole again) unless ``read`` holds every event from seq 0 and the
        file still has the revision it read after these bytes are read: another program's
        write in between would make them other bytes than the events ``read`` parsed.
        """
        if read is None or tail is None or tail.seals is None or not read.contiguous \
                or len(read.events) != tail.count or read.revision is None:
            return None
        end = tail.seals[-1][1] if tail.seals else 0
        committed = tail.torn.byte_offset if tail.torn is not None else tail.size
        if committed is None or committed < end:
            return None
        try:
            with os.fdopen(os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
                data = os.pread(f.fileno(), committed - end, end)
                revision = file_revision(os.fstat(f.fileno()))
        except OSError:
            return None  # the whole read names what is wrong
        if len(data) != committed - end or revision != read.revision:
            return None
        return end, data

    def _check_not_cut(self, end: int, events: int, header: FrozenDict, size: int) -> None:
        """Refuse a log whose complete records end below bytes a flush already made durable.

        A crash can tear only bytes no flush acknowledged; the listing journal records a log's
        size and event count after each durable flush (:func:`recorded_flush`). A log whose
        complete records or frames end at ``end`` below that size (same file, same session,
        fewer events) was cut inside committed data. Zstandard frames carry no record of how
        many there were, so this is how a cut, torn or exactly on a frame boundary, is told
        from a crash. Nothing recorded (no journal or index, a writer that could not journal),
        another file (inode), another session of the id (``createdAt``), as many events as
        recorded (a rewrite) or a file that grew since it was read (a writer) is not refused.
        Rule: docs/rules.md#crash-safety.

        Args:
            end: Where the committed records end (a torn tail's start, else the file size).
            events: The events read up to ``end``.
            header: The header read.
            size: The file size the read saw.

        Raises:
            LogCorruptError: naming the file, the byte and seq where its committed records now
                end, and the size and event count a flush made durable.
        """
        root, key = self._listing_key()
        try:
            found = recorded_flush(root, key)  # the journal first, then the file: a writer
            st = os.stat(self.path)  # that journaled meanwhile has grown it past ``size``
        except OSError:
            return
        if found is None or len(found[0]) != 5:
            return
        (committed, _, _, inode, device), entry = found
        if (inode, device) != (st.st_ino, st.st_dev) or st.st_size != size \
                or committed <= end or entry.events <= events \
                or entry.header.get("createdAt") != header.get("createdAt"):
            return  # another file or session, a crash's torn tail, a rewrite, a write
        raise LogCorruptError(
            f"corrupt session log: {self.path} was cut inside committed data: its complete "
            f"records end at byte {end} after seq {events - 1} (the file holds {size} bytes), "
            f"but a flush made {committed} bytes and {entry.events} events durable (recorded "
            f"in the listing journal); restore the file from a backup", path=str(self.path),
            byte_offset=end, seq=events, session_id=self._id)

    def _zstd_chained(self) -> tuple[int, bytes] | None:
        """``(end seq, incarnation)`` of the last record of a Zstandard log's chain sidecar.

        ``None`` when there is no sidecar, no record in it, or the sidecar is damaged: a
        damaged sidecar says nothing about the log, and the writer and ``dsh verify`` name it
        (docs/formats.md#zstandard-chain). Read before the log, so every batch it chains is
        inside the bytes read after it (docs/rules.md#crash-safety).
        """
        try:
            found = read_seal(self._seal_path())
        except LogCorruptError:
            return None  # named by the writer's seal step and by dsh verify
        last = found.last_chained() if found is not None else None
        return (last.end, last.incarnation) if last is not None else None

    def _check_chained(self, chained: tuple[int, bytes], end: int, events: int, head: bytes,
                       size: int) -> None:
        """Refuse a Zstandard log whose complete frames end before a batch its chain sealed.

        A chain record is appended only after its batch's frames are durable
        (docs/formats.md#zstandard-chain), so a crash never leaves a record whose events are
        not all in complete frames: fewer is a cut inside acknowledged data, never a torn
        tail, and its events are not read as one (docs/rules.md#crash-safety). A record that
        binds another header frame (the id created again, a rewrite between its renames) is
        not this log's and is not compared.

        Args:
            chained: ``(end seq, incarnation)`` of the sidecar's last record
                (:meth:`_zstd_chained`).
            end: Where the log's complete frames end (byte offset).
            events: The events of those complete frames.
            head: The header frame's bytes.
            size: The file size read.

        Raises:
            LogCorruptError: naming the file, the byte and seq where its complete frames end
                and the seq the chain sealed.
        """
        chain_end, incarnation = chained
        if chain_end <= events or incarnation != incarnation_bytes(rp.digest(head)):
            return
        raise LogCorruptError(
            f"corrupt session log: {self.path} was cut inside committed data: its complete "
            f"Zstandard frames end at byte {end} after seq {events - 1} (the file holds {size} "
            f"bytes), but its chain sidecar {self._seal_path()} sealed events up to seq "
            f"{chain_end - 1} as durable; restore the file from a backup",
            path=str(self.path), byte_offset=end, seq=events, session_id=self._id)

    def _adopt_staged_seal(self, data: bytes) -> tuple[Seal, ParsedLog] | None:
        """The staged seal a rewrite left beside the log that verifies ``data``, or ``None``.

        A rewrite killed between renaming the log and renaming its seal into place leaves
        the log marked and its seal staged; one killed after moving the old seal aside leaves
        the old log and the old seal staged (docs/formats.md#integrity-seals). A staged seal
        whose every record matches the bytes is adopted: a writer renames it into place (and
        drops the other staged seals), a reader uses it as it is.
        """
        for staged in staged_seals(self._seal_path()):
            try:
                seal = read_seal(staged)
                if seal is None or not seal.records:
                    continue
                parsed = parse_log(data, compression="none", path=str(self.path), seal=seal)
            except (LogCorruptError, OSError):
                continue  # not this log's seal: the next candidate, or SEAL_MISSING
            if self._mode == "write":
                install_seal(staged, self._seal_path())
                logger.warning("session %s: adopted the integrity seal %s that an interrupted "
                               "rewrite staged for %s", self._id, staged, self.path)
                self._drop_staged_seals()
            return seal, parsed
        return None

    def _drop_staged_seals(self) -> None:
        """Delete staged seals a killed writer left (under the write lock: none is ours).

        An old seal moved aside by a rewrite holds the batch keys that erasure drops
        (docs/forgetting.md#tombstones-and-commitments), so it must not outlive the rewrite.
        """
        for staged in staged_seals(self._seal_path()):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staged)

    def _seal_missing(self) -> SealDamagedError:
        """The error for a marked raw log whose seal is gone (docs/formats.md#integrity-seals)."""
        seal = self._seal_path()
        return SealDamagedError(
            f"integrity seal {seal} of session {self._id!r} is missing, but the log's header "
            f"says its writer sealed it ({self.path}): its bytes cannot be verified, so they "
            f"are neither read nor sealed again; restore the seal from a backup, or accept the "
            f"bytes as they are now with 'dsh verify --reseal {self._id}'", code="SEAL_MISSING",
            path=str(seal), session_id=self._id)

    def _stage_first_seal(self, content: bytes) -> tuple[Path | None, list[tuple[int, int, int]]]:
        """Stage the seal of a new raw log before it is published (``None``: it failed).

        The seal is renamed into place just before the log is linked, so a log whose header
        carries the seal mark never exists without its seal, crash or not
        (docs/formats.md#integrity-seals).
        """
        self._backend._prepare_publish(self.path, self._id)
        try:
            records = _seal_records(content, 0)
            return stage_seal(self._seal_path(), b"", records,
                              chain=self._tail.chain if self._tail else None), records
        except Exception as exc:  # the log is then written unmarked and sealed later
            self.after_commit.failed("seal", exc, "the log is written without the seal mark; "
                                     "the next flush seals it")
            return None, []

    def flush(self) -> None:
        """Make appended bytes durable (fsync); on failure truncate back to the last durable state.

        Raises:
            OSError: fsync failed; the un-synced batches were removed from the file and from
                this handle's count, so re-appending them continues the seq exactly.
        """
        self._check_open()
        tail = self._tail
        if tail is None or self._fd is None or tail.size == tail.durable_size:
            if tail is not None:
                tail.durable_count = tail.count
            return
        try:
            self._backend._os_fsync(self._fd)
        except BaseException:
            try:
                self._backend._os_ftruncate(self._fd, tail.durable_size)
                os.fsync(self._fd)
            except OSError:
                tail.end_unknown = True
            tail.size = tail.durable_size
            tail.count = tail.durable_count
            tail.index = [entry for entry in tail.index if entry[1] <= tail.durable_size]
            self._listing_off = True
            self._listing_pending = []
            self._search_pending = []
            raise
        tail.durable_size = tail.size
        tail.durable_count = tail.count
        # durable from here on: nothing below may fail this flush
        # (docs/rules.md#commit-means-committed)
        self._seal()
        self._note_listing_safely()
        self.after_commit.run("search", self._note_search,
                              "the next search reads this log's new events itself")

    def _note_search(self) -> None:
        """Add the flushed events to the store's search index when it holds the rest."""
        pending, self._search_pending = self._search_pending, []
        if pending:  # seqs count from 0: the first one is how many events were durable before
            self._search_exact = note_search(self._backend.root, self._id, pending[0]["seq"],
                                             pending, os.stat(self.path))

    def _mark_search(self) -> None:
        """Name this session in the store's search journal before its log first changes.

        Raises:
            OSError: the journal could not be written (the log is not changed).
        """
        self._search_exact = False
        if self._search_marked:
            return
        root = self._backend.root
        if not root.is_dir():
            mkdir_private(root.parent, "the store's parent folder")
            _mkdir_durable(root, "its root folder")
        mark_writing(root, self._id)
        self._search_marked = True

    # --- the listing entry kept at flush (see dsh.persistence._listing) ------------------

    def _listing_reset(self, known: bool) -> None:
        """A (re)read: the entry is looked up for the log as read, at the next flush."""
        self._listing = None
        self._listing_pending = []
        self._listing_off = not known
        try:
            self._listing_base = signature(os.stat(self.path)) if known else None
        except OSError:
            self._listing_base, self._listing_off = None, True

    def _listing_key(self) -> tuple[Path, str]:
        where = self._listing_where
        if where is None:  # once per handle: pathlib costs more than the rest of a note
            where = self._listing_where = (
                Path(self._backend.root), f"{self.path.parent.parent.name}/{self.path.parent.name}")
        return where

    def _note_listing_safely(self) -> None:
        """:meth:`_note_listing` after a durable write: a failure turns the journal off."""

        def off() -> None:
            self._listing_off = True
            self._listing_pending = []

        self.after_commit.run("listing", self._note_listing,
                              "the listing reads this log in full until it is rebuilt", off)

    def _note_listing(self) -> None:
        """Fold the flushed events into the listing entry and journal it (cheap: one line)."""
        pending, self._listing_pending = self._listing_pending, []
        if self._listing_off:
            return
        root, key = self._listing_key()
        fold = self._listing
        if fold is None:
            found = (JsonlIndex(root).lookup(key, self._listing_base)
                     if self._listing_base is not None else None)
            if found is None:
                self._listing_off = True
                return
            fold = self._listing = EntryFold.resume(found)
        if not fold.extend(pending):
            self._listing_off = True
            return
        try:
            st = os.stat(self.path)
        except OSError:
            self._listing_off = True
            return
        tail = self._tail
        if tail is None or st.st_size != tail.durable_size:
            self._listing_off = True  # bytes we did not write (dsh, another program)
            return
        note_flushed(root, key, signature(st), fold.entry)

    def _chain_zstd(self) -> None:
        """Chain the durable frames of a Zstandard log in its chain sidecar (never raises).

        Frames carry checksums that anyone can recompute, so a Zstandard log keeps the seal
        chain in ``<log>.seal``: a ``DSHSEAL2`` seal with no range record, written like a raw
        log's seal (rewritten whole, fsynced, on a handle's first flush; then one chain record
        appended per flush after the frames are durable; the head published every
        ``HEAD_EVERY`` records and at close). The sidecar is read at the first flush, not at
        open. A damaged sidecar is left as it is and reported (``dsh verify`` names it); the
        writer then chains nothing (docs/formats.md#zstandard-chain).
        """
        tail = self._tail
        if tail is None or tail.chain is None:
            return
        path = self._seal_path()

        def retry() -> None:  # kept in memory: the next flush rewrites the sidecar whole
            tail.seal_rewrite = True

        def repair() -> str:  # after the failure: a damaged sidecar has dropped the chain
            return (f"the next flush rewrites the chain sidecar {path} whole" if tail.chain
                    else f"the chain sidecar {path} is damaged: move it aside (a new chain "
                         f"starts) or restore it")

        self.after_commit.run("seal", lambda: self._chain_zstd_step(tail, path), repair, retry)

    def _chain_zstd_step(self, tail: _Tail, path: Path) -> None:
        """The work of :meth:`_chain_zstd`; a damaged sidecar drops the chain, then raises.

        Raises:
            LogCorruptError: the sidecar is damaged (``tail.chain`` is then None: it is not
                written over).
            OSError: the sidecar could not be written.
        """
        chain = tail.chain
        assert chain is not None
        try:
            if not tail.chain_loaded:
                found = read_seal(path)
                loaded = found.chain_state() if found is not None else ChainState([])
                if loaded.records and loaded.records[-1].incarnation != self._incarnation():
                    loaded = ChainState([])  # another log's (an id created again): restarted
                loaded.pending = chain.pending
                tail.chain, tail.chain_loaded, chain = loaded, True, loaded
            link = chain.take(tail.durable_count, self._incarnation(), this_writer())
            if link is None:
                return
            if tail.seal_rewrite:
                self._unelide()  # the records a resume left unread go into the whole file
                reset_seal(path, b"", [], chain=chain)
                tail.seal_rewrite = False
                return
            fd = open_seal_appender(path)
            try:
                append_chain_to(fd, link)
            finally:
                os.close(fd)
            if len(chain.records) - chain.published >= HEAD_EVERY:
                publish_head(path, b"", chain)
        except LogCorruptError:
            tail.chain = None  # a damaged sidecar is not written over
            raise

    def _zstd_chain_candidate(self, count: int) -> Path | None:
        """The chain sidecar an interrupted rewrite left that fits a Zstandard log of ``count``.

        The rewrite moved the old sidecar aside and staged the new one; the old log's events
        are all chained in the old one, the new log's in the new one, which chains more. So
        the valid candidate chaining the most events, none past ``count``, is the log's
        (docs/formats.md#zstandard-chain).
        """
        best: tuple[int, Path] | None = None
        for staged in staged_seals(self._seal_path()):
            try:
                found = read_seal(staged)
            except (LogCorruptError, OSError):
                continue
            end = found.chain_state().end if found is not None else 0
            if found is not None and found.chain and end <= count and (
                    best is None or end > best[0]):
                best = (end, staged)
        return best[1] if best is not None else None

    def _stage_zstd_chain(self, old: Sequence[Event], batch: Sequence[Event], content: bytes
                          ) -> Path | None:
        """Stage a rewritten Zstandard log's chain sidecar (``None``: it had none, or failed).

        The old chain is carried (:func:`carry`; tombstoned events keep their leaves), bound to
        the new file's header frame (docs/formats.md#zstandard-chain).
        """
        try:
            found = read_seal(self._seal_path())
            if found is None:
                return None
            header_end = scan_zstd_frames(content, path=str(self.path), max_frames=1)[0][0][1]
            chain = ChainState(carry(found.chain, {int(e["seq"]): e for e in old}, batch,
                                     incarnation_bytes(rp.digest(content[:header_end])),
                                     this_writer()))
            return stage_seal(self._seal_path(), b"", [], chain=chain)
        except (OSError, LogCorruptError) as exc:  # the next writer starts a new chain
            self.after_commit.failed("seal", exc, "the rewritten log's chain starts again")
            return None

    def _incarnation(self) -> bytes:
        """What the chain binds a raw log's records to: its header line's digest."""
        return incarnation_bytes(self._tail.header_digest if self._tail else "")

    def _publish_head(self) -> None:
        """Publish the chain head if records are not counted by it yet (at close)."""
        tail = self._tail
        chain = tail.chain if tail is not None else None
        if tail is None or chain is None or tail.seal_rewrite or chain.published == chain.count:
            return
        try:
            publish_head(self._seal_path(), b"", chain)
        except Exception as exc:  # the records stay; only the head lags
            self.after_commit.failed("seal", exc, "the chain head is published by the next "
                                     "writer")

    def _seal_path(self) -> Path:
        return self.path.with_name(self.path.name + _SEAL_SUFFIX)

    # --- restore points (see dsh.persistence._restore_point) ------------------------

    def restore_point_where(self) -> str:
        """The restore point sidecar's path, for messages."""
        return str(self.restore_point_path())

    def restore_point_path(self) -> Path:
        """The restore point sidecar beside the log (``session.jsonl.ckpt``)."""
        return self.path.with_name(self.path.name + _CKPT_SUFFIX)

    def _binding_path(self) -> Path:
        """A Zstandard log's restore point seal (``session.jsonl.zstd.ckpt.seal``)."""
        return self.path.with_name(self.path.name + _CKPT_SUFFIX + _SEAL_SUFFIX)

    @property
    def durable_bytes(self) -> int:
        """File bytes made durable through this handle's view of the log (0 before a read)."""
        return self._tail.durable_size if self._tail is not None else 0

    def restore_point_anchor(self) -> rp.Anchor | None:
        """The anchor of the durable prefix, or None when none can be given now."""
        self._check_open()
        tail = self._tail
        if tail is None or not tail.materialized or tail.torn is not None or tail.end_unknown \
                or tail.durable_count < 1 or not tail.header_digest:
            return None  # nothing durable, a torn tail or unknown end, or no header read
        end = tail.durable_size
        start = max(tail.header_end, end - rp.DIGEST_TAIL_BYTES)
        last = jrp.pread(self._append_fd(), end - start, start)
        seal_digest = self._seal_binding(end)
        if seal_digest is None:
            return None
        try:
            entries: Sequence[tuple[int, int]] = list(tail.index)
        except LogCorruptError as exc:
            if exc.code != "RESTORE_POINT_MISMATCH":
                raise
            # the index a resume took from its restore point does not match: this writer's
            # next restore point carries the log's own (restore points are never the truth)
            rp.note_refusal(self._id, "index", exc,
                            instead="the next restore point takes the log's own index")
            entries = tail.index = self._log_index(tail.size)
        index = tuple(entry for entry in entries if entry[0] < tail.durable_count
                      and entry[1] < end)
        return rp.Anchor(
            backend=jrp.backend_kind(self._backend.compression), session_id=self._id,
            incarnation=tail.header_digest, event_count=tail.durable_count, byte_offset=end,
            header_digest=tail.header_digest, tail_digest=rp.digest(last),
            seal_digest=seal_digest, index=index)

    def _log_index(self, end: int) -> list[tuple[int, int]]:
        """The page-in index of the log's bytes ``[0, end)``, sampled as a full read samples it.

        ``end`` is a record boundary. For a restore point's index that does not hold what it
        claims (docs/rules.md#restore-points-are-never-the-truth).

        Raises:
            LogCorruptError: those bytes do not read as a log (the damage named as a full read
                names it), or the file is shorter than ``end``.
        """
        path = str(self.path)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise LogCorruptError(f"session log {path} cannot be read again ({exc}); resume "
                                  "the session again", path=path) from exc
        try:
            data = jrp.pread(fd, end, 0)
        finally:
            os.close(fd)
        if len(data) != end:
            raise LogCorruptError(f"session log {path} holds {len(data)} bytes, fewer than the "
                                  f"{end} the session read; it changed under the session, "
                                  "resume it again", path=path, byte_offset=len(data))
        parsed = parse_log(data, compression=self._backend.compression, path=path)
        return [entry for entry in parsed.index if entry[1] < end]

    def _seal_binding(self, end: int) -> str | None:
        """The anchor's ``sealDigest`` for a cut at byte ``end`` ("" without a seal).

        Where the seal file holds exactly this handle's records up to ``end``, the
        :class:`SealCut` of the file as it is (one digest of its bytes, which a resume checks
        without parsing them); else the digest of the records themselves. None: the records
        could not be read (no anchor now). A Zstandard log has no range seal: the cut of its
        chain sidecar when this handle has it loaded and nothing pending, else ""
        (docs/formats.md#restore-points).
        """
        tail = self._tail
        assert tail is not None
        seals = tail.seals
        if seals is None:
            if not tail.chain_loaded or tail.chain is None or tail.seal_rewrite:
                return ""
            # the sidecar holds exactly this chain: a resumed writer appends to it
            cut = seal_cut(self._seal_path(), 0, 0, tail.chain)
            return cut.encode() if cut is not None else ""

        def rewrite() -> None:
            self._unelide()
            reset_seal(self._seal_path(), b"", seals, tail.restore_marks[-1:], chain=tail.chain)
            tail.seal_rewrite = False

        return seal_binding(self._seal_path(), seals, tail.seal_cut, end, tail.chain,
                            pending=tail.seal_rewrite, rewrite=rewrite,
                            unelide=self._unelide,
                            digest=lambda: jrp.seal_digest(tail.seals or [], end))

    def _unelide(self) -> None:
        """Read the seal records a resume left unread (before its cut) back into the state.

        Raises:
            SealDamagedError: the seal's bytes before the cut changed since the resume.
        """
        tail = self._tail
        if tail is None or tail.seal_cut is None:
            return
        records, chain = read_elided(self._seal_path(), tail.seal_cut)
        if tail.seals is not None:
            tail.seals[:0] = records
        if tail.chain is not None:
            try:
                tail.chain.restore_elided(chain)
            except ValueError as exc:
                raise SealDamagedError(f"integrity seal {self._seal_path()}: {exc}",
                                       path=str(self._seal_path()),
                                       code="SEAL_CORRUPT") from None
        tail.seal_cut = None

    def write_restore_point(self, data: bytes) -> None:
        """Replace the restore point sidecar with ``data`` (atomic, ``write_restore_point_file``).

        Raises:
            OSError: it could not be written.
        """
        if self._backend.compression == "zstd":
            # no seal to bind it to: its own seal file records its digest, before it is
            # renamed into place (docs/rules.md#restore-points-are-never-the-truth)
            jrp.write_bindings(self._binding_path(), restore_point_mark(rp.body_digest(data)))
        rp.write_restore_point_file(self.restore_point_path(), data)
        tail = self._tail
        if tail is None or tail.seals is None:
            return
        # bound to the log: the seal records the body's digest, and a resume refuses a restore
        # point whose digest it did not record (docs/rules.md#restore-points-are-never-the-truth)
        mark = restore_point_mark(rp.body_digest(data))
        try:
            if tail.seal_rewrite:
                try:
                    self._unelide()
                except LogCorruptError as exc:
                    raise OSError(str(exc)) from exc
                reset_seal(self._seal_path(), b"", tail.seals, [mark], chain=tail.chain)
                tail.seal_rewrite = False
            else:
                append_restore_point_mark(self._seal_path(), mark)
        except OSError:
            tail.seal_rewrite = True  # a partial record may be left: the next seal rewrites
            raise
        tail.restore_marks = [mark]

    def read_from_restore_point(self) -> tuple[rp.RestorePoint, ColdRead,
                                               jrp.JsonlPrefixSource]:
        """Read through the restore point: its state, the events after its cut, a page-in source.

        Nothing before the cut is read, however the surface is spread (a resume keeps it as
        node seqs and pages messages in when they are derived).

        On success a write handle is ready to append, as after ``read(0)``.
        The returned ``ColdRead.events`` are the tail (first seq ``restore_point.state
        .event_count``); it never has a torn tail (that case is a refusal).

        Raises:
            RestorePointRefused: no usable restore point (the caller reads in full).
        """
        self._check_open()
        if self._pending_header is not None and not self.path.exists():
            raise rp.RestorePointRefused("absent")
        kind = jrp.backend_kind(self._backend.compression)
        restore_point = rp.decode_restore_point(
            rp.read_restore_point_file(self.restore_point_path()), session_id=self._id,
            backend=kind, where=self.restore_point_where())
        zstd = self._backend.compression == "zstd"
        found = jrp.load_tail(
            self.path, restore_point, zstd=zstd, seal_path=self._seal_path(),
            check_identity=lambda header: self._backend._check_identity(self._id, header,
                                                                        self.path))
        header, events = found.header, found.events
        if not zstd:
            # a writer that names a cut records the restore point's digest after it: none
            # there is a cut named past the recorded digests (anyone who reads the seal can
            # digest it)
            rp.check_bound(restore_point, found.restore_marks, where=self.restore_point_where(),
                           seal_path=str(self._seal_path()),
                           required=SealCut.decode(restore_point.anchor.seal_digest) is not None)
        else:
            rp.check_bound(restore_point, jrp.read_bindings(self._binding_path()),
                           where=self.restore_point_where(),
                           seal_path=str(self._binding_path()), required=True)
            try:  # a frame-boundary cut after the restore point's: the full read names it
                self._check_not_cut(found.size, restore_point.anchor.event_count + len(events),
                                    header, found.size)
            except LogCorruptError:
                raise rp.RestorePointRefused("cut") from None
        count = restore_point.anchor.event_count + len(events)
        chain, cut, clean = found.chain, found.seal_cut, found.seal_clean
        if zstd:
            chain, cut, clean = self._zstd_chain_after(restore_point.anchor)
            # the log ends before a batch its chain sealed (read after the log: a writer that
            # flushed meanwhile is refused too): the full read names the cut
            if chain is not None and chain.end > count:
                raise rp.RestorePointRefused("cut")
        self._pending_header = None
        self._read_file = _file_of(found.revision)
        self._tail = _Tail(True, count, found.size, None, count, found.size,
                           seals=found.records if not zstd else None, index=found.index,
                           header_end=found.header_end,
                           header_digest=restore_point.anchor.header_digest,
                           restore_marks=list(found.restore_marks),
                           chain=chain if chain is not None else ChainState([]),
                           # Zstandard without a sidecar cut: loaded at the first flush
                           chain_loaded=chain is not None, seal_cut=cut,
                           # a chained seal that ends cleanly is appended to, not rewritten
                           seal_rewrite=not clean)
        if self._mode == "write":
            self._listing_reset(True)  # load_tail refuses a torn tail
        anchor = restore_point.anchor
        seal_path = self._seal_path()
        source = jrp.JsonlPrefixSource(
            self.path, self._backend.compression, anchor.event_count, anchor.byte_offset,
            anchor.index, seals=self._tail.seals,
            elided=None if cut is None or zstd
            else lambda: read_elided(seal_path, cut, chain=False)[0],
            session_id=self._id, rebuild_index=lambda: self._log_index(anchor.byte_offset))
        return restore_point, ColdRead(header, tuple(events), None, found.revision), source

    def _zstd_chain_after(self, anchor: rp.Anchor
                          ) -> tuple[ChainState | None, SealCut | None, bool]:
        """A resumed Zstandard writer's chain: ``(chain, cut, clean)`` from its sidecar's cut.

        The anchor's ``sealDigest`` names the chain sidecar as its writer left it
        (docs/formats.md#restore-points): the bytes before the cut are checked by one SHA-256
        and the records after it read, so the writer appends to the sidecar instead of
        reading and rewriting it whole at its first flush. ``(None, None, False)`` (the chain
        loaded at the first flush, as before the cut existed) for an anchor without a cut
        (written before it), and for a sidecar that is gone, rewritten since, damaged, holds
        range records, or whose last record binds another header frame: that load names the
        damage or starts the chain again, as it always did.
        """
        cut = SealCut.decode(anchor.seal_digest)
        if cut is None or cut.records or cut.tail:
            return None, None, False
        try:
            found = read_seal_after(self._seal_path(), cut)
        except (DshError, OSError):
            return None, None, False
        if found is None or found.records or found.identity or found.version != 2 or (
                found.chain and found.chain[-1].incarnation
                != incarnation_bytes(anchor.header_digest)):
            return None, None, False
        return found.chain_state(), found.elided, found.clean

    # --- ranges (ReadsRanges: a log without a restore point read by page) -------------

    def last_stored_seq(self) -> int:
        """The first seq of the last complete line (-1: none, or a Zstandard log).

        Contract: :class:`~dsh.persistence._contract.ReadsRanges` (the last line is read from
        the end of the file). A Zstandard log serves no ranges (its frames cannot be found
        from the end) and answers -1, so it is read in full.
        """
        self._check_open()
        if self._backend.compression != "none" or not self.path.exists():
            return -1
        try:
            return jranges.last_line_seq(self.path)
        except (OSError, DshError):
            return -1  # the full read names what is wrong

    def range_source(self, cut: int) -> jranges.JsonlRangeSource | None:
        """A source over seqs ``0 .. cut - 1`` found by bisecting the raw log (None: zstd).

        Contract: :class:`~dsh.persistence._contract.ReadsRanges`; the source checks every
        page against the seal records it touches (docs/rules.md#verified-page-in).
        """
        self._check_open()
        if self._backend.compression != "none":
            return None
        try:
            return jranges.range_source(self.path, cut, self._seal_path())
        except (OSError, DshError):
            return None  # the full read names what is wrong

    def _seal(self, content: bytes | None = None) -> None:
        """Seal the durable bytes not sealed yet with one record (raw JSONL; see ``_seal``).

        The bytes are read back from the file (after its fsync), so the seal covers exactly
        what is stored, bytes another writer (dsh) added since the last record included. A
        failure to write the seal does not fail the flush (the batch is durable): it is
        logged, and the next flush rewrites the seal file with every record.
        """
        tail = self._tail
        assert tail is not None
        if tail.seals is None:
            self._chain_zstd()
            return
        start = tail.seals[-1][1] if tail.seals else (
            tail.seal_cut.end if tail.seal_cut is not None else 0)
        end = tail.durable_size
        if end <= start:
            return
        try:
            if content is None:
                content = os.pread(self._append_fd(), end - start, start)
            records = _seal_records(content, start)
        except Exception as exc:  # not sealed now: the next flush seals these bytes too
            self.after_commit.failed("seal", exc, "the next flush seals these bytes")
            return
        chain = tail.chain
        try:
            link = chain.take(tail.durable_count, self._incarnation(), this_writer()) \
                if chain is not None else None
            if tail.seal_rewrite:
                self._unelide()
                reset_seal(self._seal_path(), b"", [*tail.seals, *records],
                           tail.restore_marks[-1:], chain=chain)
                tail.seal_rewrite = False
            else:
                fd = open_seal_appender(self._seal_path())
                try:
                    append_batch_to(fd, records, link)
                finally:
                    os.close(fd)
                if chain is not None and chain.count - chain.published >= HEAD_EVERY:
                    publish_head(self._seal_path(), b"", chain)
        except Exception as exc:  # the batch is durable: a seal failure never fails it
            # kept in memory: the next seal write rewrites the whole file, this record included
            tail.seal_rewrite = True
            self.after_commit.failed("seal", exc, f"the next flush rewrites the integrity "
                                                  f"seal {self._seal_path()} whole")
        tail.seals.extend(records)

    def _close_search(self) -> None:
        """Tell searches this session's log is indexed exactly, when this handle left it so."""
        tail = self._tail
        if not (self._search_marked and self._search_exact and tail is not None
                and tail.size == tail.durable_size and not self._search_pending):
            return
        try:
            mark_closed(self._backend.root, self._id)
        except OSError as exc:  # the session stays watched: each search stats its log
            logger.info("search journal not updated for %r: %r", self._id, exc)

    def rewrite(self, events: Sequence[Event], *, scrub: bool = True
                ) -> list[dict[str, object]]:
        """Replace the stored log by its header and ``events``: redaction and erasure only.

        ``scrub`` has nothing to do here: the old file is gone once the new one is renamed.

        The new file and its seal are staged beside the log and fsynced; the restore point
        is deleted and the old seal moved aside; the new file is renamed over the log and the
        folder fsynced; the staged seal is renamed into place and the old one deleted. A crash
        leaves the old log or the new one, each with a seal that verifies it in place or
        staged (adopted by the next reader, docs/formats.md#integrity-seals). The old log
        is first read through its seal, so damage is refused, not rewritten. Rule:
        docs/forgetting.md#how-storage-is-rewritten.

        Returns:
            What was touched: ``{"path", "action", ...}`` per file.

        Raises:
            PersistenceError: ``READ_ONLY`` for a read handle.
            LogCorruptError: the stored log is damaged.
            OSError: the new file could not be written (the log is unchanged).
        """
        self._check_open()
        if self._mode != "write":
            raise PersistenceError(f"cannot rewrite session {self._id!r} through a read "
                                   f"handle; open it with mode 'write'", code="READ_ONLY",
                                   session_id=self._id, path=str(self.path))
        old = self.read()
        self._mark_search()
        header = old.header
        old_chain = self._tail.chain if self._tail is not None else None
        batch = validate_batch(events, 0, self._id)
        raw = self._backend.compression == "none"
        content = self._backend._initial_content(header, batch, seal_mark=raw)
        staged: Path | None = None
        if raw:  # staged first: the marked log is without its seal only between two renames
            self._drop_staged_seals()  # a killed writer's leftovers (we hold the write lock)
            try:
                # the chain is kept: tombstoned events keep their leaves
                # (docs/formats.md#the-seal-chain); the events past it get one new record
                chain = ChainState(carry(
                    old_chain.records if old_chain is not None else [],
                    {int(e["seq"]): e for e in old.events}, batch,
                    incarnation_bytes(rp.digest(content[:content.index(b"\n") + 1])),
                    this_writer()))
                staged = stage_seal(self._seal_path(), b"", [(0, len(content),
                                                              crc_of(content))], chain=chain)
            except OSError as exc:  # written unmarked: unsealed until the next writer
                self.after_commit.failed("seal", exc, "the next writer seals the log")
                content = self._backend._initial_content(header, batch)
        else:  # Zstandard: the chain sidecar is carried the same way
            staged = self._stage_zstd_chain(old.events, batch, content)
        tmp = self.path.with_name(f"{self.path.name}.{secrets.token_hex(6)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            try:
                view, written = memoryview(content), 0
                while written < len(content):
                    written += os.write(fd, view[written:])
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            for leftover in (tmp, staged):
                if leftover is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(leftover)
            raise
        touched: list[dict[str, object]] = []
        for sidecar in (self.restore_point_path(), self._binding_path()):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(sidecar)
                touched.append({"path": str(sidecar), "action": "deleted"})
        # moved aside, not deleted: until the new log is in place the old seal is the one
        # a reader adopts if this process dies (_adopt_staged_seal)
        old_seal: Path | None = aside_name(self._seal_path())
        try:
            os.replace(self._seal_path(), aside_name(self._seal_path()))
            touched.append({"path": str(self._seal_path()), "action": "deleted"})
        except FileNotFoundError:
            old_seal = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        os.replace(tmp, self.path)
        fsync_folder(self.path.parent)
        touched.append({"path": str(self.path), "action": "rewritten", "events": len(batch),
                        "bytes": len(content)})
        if staged is not None:
            try:
                install_seal(staged, self._seal_path())
                touched.append({"path": str(self._seal_path()), "action": "written"})
            except OSError as exc:  # the log is rewritten and marked: reads say SEAL_MISSING
                self.after_commit.failed("seal", exc, f"run 'dsh verify --reseal {self._id}'")
        if old_seal is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(old_seal)
        self.read()  # this handle's view of the new file
        return touched

    def close(self) -> None:
        """Close the file and release the write lock; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._mode == "write":
                self._publish_head()
                self._close_search()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        finally:
            if self._lock is not None:
                self._lock.release()



class JsonlBackend:
    """dsh's JSONL store under one root directory (contract: ``api.Backend``).

    Rule: docs/formats.md#jsonl.

    Args:
        root: Store directory; relative paths resolve against the current directory now.
        compression: ``"none"`` (``session.jsonl``) or ``"zstd"`` (``session.jsonl.zstd``).
        pack_chunks: Pack ``assistant/chunk`` delta runs into chunk rows
            (docs/formats.md#record-lines).
        url: The store URL, for diagnostics.

    Raises:
        ConfigError: bad compression, or ``root`` exists and is not a directory.
    """

    capabilities = Capabilities(restore_points=True, saved_cuts=True, listing=True, file_paths=True,
                                ranges=True, after_commit=True, search_index=True,
                                torn_tail_hook=True, reseal=True, rewrites=True,
                                change_stamp=True)
    """Restore points, saved cuts, the listing index, the log file each handle reads, seq
    ranges of a raw log (a Zstandard log serves none: its handles answer -1 and None), a
    search index in the root, and rebuilding a lost seal on request (a Zstandard store's
    reseal says ``NO_SEAL``)."""

    def __init__(self, root: str | os.PathLike[str], *, compression: Compression = "none",
                 pack_chunks: bool = True, url: str | None = None) -> None:
        if compression not in ("none", "zstd"):
            raise ConfigError(f"jsonl compression must be 'none' or 'zstd', got "
                              f"{compression!r}")
        self.root = Path(os.path.abspath(os.fspath(root)))
        if self.root.exists() and not self.root.is_dir():
            raise ConfigError(f"jsonl store root {self.root} exists and is not a directory",
                              path=str(self.root))
        self.compression: Compression = compression
        self.pack_chunks = pack_chunks
        self._url = url or (f"jsonl+zstd://{self.root}" if compression == "zstd"
                            else f"jsonl://{self.root}")
        self._name = _ZSTD_NAME if compression == "zstd" else _RAW_NAME
        self._opposite = _RAW_NAME if compression == "zstd" else _ZSTD_NAME
        self._pending: dict[str, FrozenDict] = {}
        self._mutex = threading.Lock()
        self._encoding_checked = False
        # indirections so tests can inject I/O faults
        self._os_write = os.write
        self._os_fsync = os.fsync
        self._os_ftruncate = os.ftruncate

    @property
    def url(self) -> str:
        """The store URL."""
        return self._url

    def search_index(self) -> SearchIndex:
        """The store's search index: the sidecar ``<root>/.dsh-search.db`` (docs/stores.md#search).

        Opened on first use; the caller closes it.
        """
        root = self.root
        return SidecarIndex(root / SIDECAR_NAME, JournalFreshness(root))

    def inject_torn_tail(self, session_id: str) -> None:
        """Test hook: half a record after the log, as a writer killed mid-write leaves it.

        Raw JSONL: half a line; zstd: a frame cut short
        (docs/formats.md#reading-the-committed-region).

        Raises:
            SessionNotFoundError: no such session.
        """
        with self.open(session_id, "read") as handle:
            target = handle.path
        if self.compression == "zstd":
            frame = zstandard.ZstdCompressor(write_checksum=True).compress(
                b'{"type":"turn/start","seq":999,"time":1,"data":{"turn":9}}\n')
            torn = frame[:-7]
        else:
            torn = b'{"type":"request/header","seq":'
        with open(target, "ab") as f:
            f.write(torn)

    # --- layout -------------------------------------------------------------------------

    def locate(self, header: Mapping[str, object]) -> Path:
        """Absolute log path of a header's ``(cwd, id)``, without I/O.

        Rule: docs/formats.md#layout-and-path-encoding.
        """
        cwd = header.get("cwd")
        sid = header.get("id")
        if not isinstance(sid, str):
            raise LogCorruptError("header id cannot name a storage path", code="INVALID_ID")
        project = project_dir_name(cwd if isinstance(cwd, str) else None)
        return self.root / project / encode_segment(sid) / self._name

    def _project_dirs(self) -> list[Path]:
        try:
            with os.scandir(self.root) as it:
                entries = list(it)
        except FileNotFoundError:
            return []
        for entry in entries:
            # A link under a name no project folder has (a folder that is no store: /etc's
            # os-release) holds nothing of the store; one under such a name would send writes
            # out of it (docs/formats.md#file-modes-and-symlinks).
            if entry.is_symlink() and is_project_dir_name(entry.name):
                refuse_symlink(Path(entry.path), "a project folder")
        return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]

    def _check_encoding(self) -> None:
        """Refuse a root holding artifacts of the other compression.

        Rule: docs/formats.md#layout-and-path-encoding.
        """
        if self._encoding_checked:
            return
        for project in self._project_dirs():
            with os.scandir(project) as it:
                entries = list(it)
            for entry in entries:
                if entry.is_dir() and os.path.exists(os.path.join(entry.path, self._opposite)):
                    self._mismatch(Path(entry.path) / self._opposite)
        self._encoding_checked = True

    def _mismatch(self, found: Path) -> None:
        raise PersistenceError(
            f"jsonl store {self.root} holds {found.name} ({found}), but this backend is "
            f"configured for compression {self.compression!r}; use a separate root or select "
            f"the matching compression mode", code="ENCODING_MISMATCH", path=str(found))

    def _find(self, session_id: str, *, whole_root: bool = True) -> Path | None:
        """The log of ``session_id`` in any project directory, or None.

        Args:
            session_id: The session.
            whole_root: Check first, once per backend, that no session folder of the root
                holds the other compression's log (:meth:`_check_encoding`: a stat per
                session folder). False only for a caller that reads nothing through the path
                but falls back to a read that does (a search's removed marks).

        Rule: docs/formats.md#layout-and-path-encoding.
        """
        if whole_root:
            self._check_encoding()
        segment = encode_segment(session_id)
        hits: list[Path] = []
        for project in self._project_dirs():
            for flat in (project / f"{segment}.jsonl", project / f"{segment}.jsonl.zstd"):
                if _is_file(flat):
                    raise PersistenceError(f"unsupported flat-file layout: {flat} (sessions "
                                           f"live in <project>/<id>/{self._name})",
                                           code="FLAT_LAYOUT", path=str(flat))
            candidate = project / segment / self._name
            refuse_symlink(candidate.parent, "a session folder")
            refuse_special(candidate, "a session log")
            try:
                os.lstat(candidate)
            except FileNotFoundError:
                if (project / segment / self._opposite).exists():
                    self._mismatch(project / segment / self._opposite)
                continue
            hits.append(candidate)
        if len(hits) > 1:
            raise LogCorruptError(f"duplicate JSONL session id {session_id!r} appears in "
                                  f"multiple project directories: {', '.join(map(str, hits))}",
                                  code="DUPLICATE_ID", session_id=session_id)
        return hits[0] if hits else None

    def _check_identity(self, session_id: str, header: FrozenDict, path: Path) -> None:
        """Header id and ``(cwd, id)`` must identify this very file.

        Rule: docs/formats.md#layout-and-path-encoding.
        """
        if header["id"] != session_id:
            raise LogCorruptError(f"stored session identity mismatch: requested id "
                                  f"{session_id!r} does not match header id {header['id']!r} "
                                  f"in {path}", path=str(path), session_id=session_id, line=1)
        expected = self.locate(header)
        try:
            same = os.path.samefile(expected, path)
        except FileNotFoundError:
            same = False
        if not same:
            raise LogCorruptError(f"stored session identity mismatch: header id {header['id']!r} "
                                  f"and cwd {header.get('cwd')!r} identify {expected}, not "
                                  f"{path}", path=str(path), session_id=session_id, line=1)

    def _forget_pending(self, session_id: str) -> None:
        with self._mutex:
            self._pending.pop(session_id, None)

    # --- writing ------------------------------------------------------------------------

    def _compress(self, payload: bytes) -> bytes:
        return compressor().compress(payload)

    def _initial_content(self, header: FrozenDict, batch: Sequence[Event], *,
                         seal_mark: bool = False) -> bytes:
        head = encode_header_line(header)
        if seal_mark and self.compression == "none":
            head = head[:-2] + SEAL_MARK  # docs/formats.md#integrity-seals
        body = encode_records(batch, pack_chunks=self.pack_chunks)
        if self.compression == "zstd":
            # frame 1 = header line only; frame 2 = the first batch (never merged,
            # docs/formats.md#zstandard-files)
            return self._compress(head) + self._compress(body)
        return head + body

    def _prepare_publish(self, final: Path, session_id: str) -> Path:
        """Create the folders of a first write (durably) and refuse an existing log.

        Returns:
            The session folder.

        Raises:
            SessionExistsError: a log already exists at ``final``.
        """
        session_dir = final.parent
        if (session_dir / self._opposite).exists():
            self._mismatch(session_dir / self._opposite)
        if not self.root.is_dir():
            mkdir_private(self.root.parent, "the store's parent folder")
        _mkdir_durable(self.root, "its root folder")
        _mkdir_durable(session_dir.parent, "a project folder")
        _mkdir_durable(session_dir, "a session folder")
        if final.exists():
            raise SessionExistsError(f"refusing to materialize session {session_id!r}: a log "
                                     f"already exists on disk at {final}", path=str(final),
                                     session_id=session_id)
        return session_dir

    def _publish(self, final: Path, content: bytes, session_id: str, *,
                 before_link: Callable[[], None] | None = None) -> None:
        """Atomic, no-overwrite first materialization (docs/formats.md#writing).

        ``before_link`` runs after the new file is durable and just before it is linked into
        place (the seal's rename); if it raises, nothing is published.
        """
        session_dir = self._prepare_publish(final, session_id)
        tmp = final.with_name(f"{final.name}.{secrets.token_hex(6)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                view = memoryview(content)
                written = 0
                while written < len(content):
                    written += self._os_write(fd, view[written:])
                self._os_fsync(fd)
            finally:
                os.close(fd)
            if before_link is not None:
                before_link()
            try:
                os.link(tmp, final)
            except FileExistsError:
                raise SessionExistsError(
                    f"refusing to materialize session {session_id!r}: a log already exists on "
                    f"disk at {final}", path=str(final), session_id=session_id) from None
            fsync_folder(session_dir)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    # --- contract -----------------------------------------------------------------------

    def create(self, header: Mapping[str, object]) -> None:
        """Register a session; the file appears with its first event (lazy).

        Rule: docs/rules.md#persistence, docs/formats.md#writing.

        Raises:
            EventRejectedError: the header is not a valid ``SessionHeader``.
            SessionExistsError: the id is pending in this backend or has a log in any project
                directory.
        """
        frozen = normalize_header(header)
        sid = frozen["id"]
        with self._mutex:
            if sid in self._pending:
                raise SessionExistsError(f"session {sid!r} already exists in this backend",
                                         session_id=sid)
        if self._find(sid) is not None:
            raise SessionExistsError(f"session {sid!r} already has a persisted log on disk; "
                                     f"load or resume it instead of creating", session_id=sid)
        with self._mutex:
            if sid in self._pending:
                raise SessionExistsError(f"session {sid!r} already exists in this backend",
                                         session_id=sid)
            self._pending[sid] = frozen

    def open(self, session_id: str, mode: OpenMode = "read") -> JsonlHandle:
        """Open a session (see ``Backend.open``); write handles take the session lock.

        Raises:
            ConfigError: code ``INVALID_ID``: no backend can store this id.
            SessionNotFoundError: neither on disk nor created in this backend.
            SessionBusyError: another writer holds the session (pid, host, since).
        """
        if mode not in ("read", "write"):
            raise PersistenceError(f"open mode must be 'read' or 'write', got {mode!r}",
                                   code="BAD_MODE", session_id=session_id)
        check_session_id(session_id)
        path = self._find(session_id)
        with self._mutex:
            pending = self._pending.get(session_id) if path is None else None
        if path is None and pending is None:
            raise SessionNotFoundError(f'session "{session_id}" not found in {self.root}',
                                       session_id=session_id)
        target = path if path is not None else self.locate(pending or {})
        lock = SessionLock(target.parent / _LOCK_NAME, session_id) if mode == "write" else None
        return JsonlHandle(self, session_id, mode, target, pending, lock)

    def exists(self, session_id: str) -> bool:
        """Return whether the session is pending here or has a log on disk.

        An id no backend can store (see ``session_id_problem``) is never stored.
        """
        with self._mutex:
            if session_id in self._pending:
                return True
        return session_id_problem(session_id) is None and self._find(session_id) is not None

    def _read_header(self, path: Path) -> FrozenDict | None:
        """Read only the header of a log for listing (docs/formats.md#layout-and-path-encoding).

        Raises:
            PersistenceError: ``SYMLINK`` or ``NOT_A_FILE``: no regular file sits at ``path``.
            LogCorruptError: the header cannot be read.
        """
        refuse_special(path, "a session log")
        data = b""
        with open(path, "rb") as f:
            while True:
                chunk = f.read(_HEADER_READ_CHUNK)
                data += chunk
                if self.compression == "none":
                    nl = data.find(b"\n")
                    if nl >= 0:
                        return parse_header_lenient(data[:nl + 1], path=str(path))
                else:
                    frames, _ = scan_zstd_frames(data, path=str(path), max_frames=1)
                    if frames:
                        start, end = frames[0]
                        try:
                            plain = decompressor().decompressobj().decompress(data[start:end])
                        except zstandard.ZstdError as exc:
                            raise LogCorruptError(f"corrupt session log: header frame failed "
                                                  f"validation in {path}", path=str(path),
                                                  byte_offset=0) from exc
                        if not plain.endswith(b"\n") or plain.count(b"\n") != 1:
                            raise LogCorruptError(f"corrupt session log: first frame is not "
                                                  f"exactly one header line in {path}",
                                                  path=str(path), byte_offset=0)
                        return parse_header_lenient(plain, path=str(path))
                if not chunk:
                    return None

    def list_headers(self) -> Iterator[FrozenDict]:
        """Yield the header of every materialized session, reading headers only.

        Rule: docs/formats.md#layout-and-path-encoding.

        Raises:
            PersistenceError: flat-file layout, encoding mismatch.
            LogCorruptError: a header whose ``(cwd, id)`` does not identify its file, or one id
                in several project directories.
        """
        self._check_encoding()
        seen: dict[str, Path] = {}
        for project in self._project_dirs():
            with os.scandir(project) as it:
                entries = list(it)
            for entry in entries:
                if entry.is_file() and (entry.name.endswith(".jsonl")
                                        or entry.name.endswith(".jsonl.zstd")):
                    raise PersistenceError(f"unsupported flat-file layout: {entry.path}",
                                           code="FLAT_LAYOUT", path=entry.path)
                if entry.is_symlink():
                    refuse_symlink(Path(entry.path), "a session folder")
                if not entry.is_dir(follow_symlinks=False):
                    continue
                path = Path(entry.path) / self._name
                try:
                    header = self._read_header(path)
                except FileNotFoundError:
                    continue
                except PersistenceError as error:
                    if error.code not in ("SYMLINK", "NOT_A_FILE"):
                        raise
                    header = None  # a link, FIFO or folder where the log belongs: named below
                if header is None:
                    # Not silently skipped: list the folder's id, so reading it reports the
                    # damage (`dsh ls` / `dsh verify --all` name it) instead of hiding it.
                    logger.warning("session log %s has no readable header", path)
                    yield FrozenDict({"version": SESSION_FORMAT_VERSION, "id": entry.name,
                                      "createdAt": 0})
                    continue
                self._check_identity(header["id"], header, path)
                if header["id"] in seen:
                    raise LogCorruptError(f"duplicate JSONL session id {header['id']!r} appears "
                                          f"in multiple project directories: {seen[header['id']]}"
                                          f", {path}", code="DUPLICATE_ID",
                                          session_id=header["id"])
                seen[header["id"]] = path
                yield header

    def read_raw(self, session_id: str) -> str | None:
        """The decoded artifact text (zstd: complete frames only), or None.

        Rule: docs/formats.md#layout-and-path-encoding.
        """
        path = self._find(session_id)
        if path is None:
            return None
        data, _ = _stable_read(path, session_id, compression=self.compression)
        if self.compression == "zstd":
            frames, _ = scan_zstd_frames(data, path=str(path))
            data = b"".join(decompress_frame(data[s:e], s, str(path)) for s, e in frames)
        nl = data.find(b"\n")
        header = parse_header_lenient(data[:nl + 1] if nl >= 0 else data, path=str(path))
        if header is None or header["id"] != session_id:
            raise LogCorruptError(f"corrupt session log: invalid header line in {path}",
                                  path=str(path), line=1)
        return data.decode("utf-8")

    def change_stamp(self) -> tuple[object, ...]:
        """The stat signatures of the search journal and of each project folder, by name.

        A dsh write handle appends a line to the search journal before it first changes a log
        (a redaction's or erasure's rewrite too, and the store log's record of a ``dsh rm``);
        a session folder created, removed or moved to the trash changes its project folder.
        Not seen: further flushes of a writer already marked (the viewer's listing then waits
        its few seconds) and a program editing a log in place. The listing index and its
        journal are left out: a listing rewrites them. Rule: docs/view.md#what-the-viewer-keeps.
        """
        def stat(path: Path) -> object:
            try:
                return tuple(signature(os.stat(path)))
            except FileNotFoundError:
                return None

        return (stat(self.root / SEARCH_JOURNAL_NAME),
                *sorted((p.name, stat(p)) for p in self._project_dirs()))

    def list_activity(self, read: ReadFn) -> tuple[list[tuple[FrozenDict, int]], list[DshError]]:
        """``(header, last_activity_ms)`` of every session, from :meth:`list_entries`."""
        entries, errors = self.list_entries(read)
        return [(e.header, e.last_activity_ms) for e in entries], errors

    def removal_events(self, session_ids: Sequence[str]
                       ) -> dict[str, Sequence[Mapping[str, Any]] | None]:
        """The sessions among ``session_ids`` whose log may have taken a message off the view.

        A raw log's bytes are searched, not decoded: one that holds neither ``quarantine``
        (a quarantine record's type) nor ``replace`` (every replace's surface op) nor a
        ``\\u`` escape of an ASCII letter (which could spell either) holds no record
        :func:`~dsh.persistence.removed_messages` acts on and is left out; the others, a
        compressed log and a log not found are named with None (the caller reads the log
        whole, which names a missing or damaged one). Contract:
        :class:`~dsh.persistence._search.KnowsRemovals`.

        Raises:
            PersistenceError: the store's layout is refused (as a read refuses it).
        """
        found: dict[str, Sequence[Mapping[str, Any]] | None] = {}
        for sid in session_ids:
            # Not the root's encoding check (a stat of every session folder, 10,000 in a
            # fresh process: ~45 ms of CPU a search): a folder holding the other compression's
            # log too is named, and the whole read it falls back to refuses the store.
            path = self._find(sid, whole_root=False) if self.compression != "zstd" else None
            if path is None or (path.parent / self._opposite).exists() or _may_remove(path):
                found[sid] = None
        return found

    def list_entries(self, read: ReadFn) -> tuple[list[ListingEntry], list[DshError]]:
        """Entries of every session: from the listing index where a log is unchanged, else a read.

        Args:
            read: The full read of one session (the coordinator's cold-read pipeline).

        Returns:
            The entries of sessions with at least one event, and the errors of logs that could
            not be read (each with ``where["session_id"]``), in directory order.
        """
        root = Path(self.root)
        index = JsonlIndex(root)
        entries: list[ListingEntry] = []
        errors: list[DshError] = []
        seen: list[str] = []
        self._check_encoding()
        for project in self._project_dirs():
            with os.scandir(project) as it:
                dirs = [e for e in it if e.is_dir()]
            # Strings, not Paths, per log: pathlib would be a third of a 5,000-session listing.
            prefix = f"{project.name}/"
            for entry in dirs:
                path = os.path.join(entry.path, self._name)
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    continue
                key = prefix + entry.name
                sig = signature(st)
                seen.append(key)
                cached = index.lookup(key, sig)
                if cached is None:
                    try:
                        header = self._read_header(Path(path))
                        sid = str(header["id"]) if header is not None else entry.name
                        stored_header, events = read(sid)
                    except DshError as error:
                        # One damaged log must not hide the others; the caller reports it.
                        error.where.setdefault("session_id", entry.name)
                        errors.append(error)
                        continue
                    cached = summarize(stored_header, events)
                    # Record it only if the log did not move while it was read.
                    with contextlib.suppress(OSError):
                        if signature(os.stat(path)) == sig:
                            index.put(key, sig, cached)
                if cached.events:
                    entries.append(replace(cached, size_bytes=sig[0]))
        index.retain(seen)
        index.save()
        return entries, errors

    def reseal(self, session_id: str) -> Resealed:
        """Seal the session's committed log as it is now, under its write lock (explicit).

        What ``dsh verify --reseal`` runs after a seal went missing (``SEAL_MISSING``): the log
        is read under the format's own rules only, and a fresh seal covering its committed
        bytes replaces whatever seal there was. Whatever changed while the seal was gone is
        sealed too; that is why no reader or writer does this by itself
        (docs/formats.md#integrity-seals).

        Returns:
            The seal file's path.

        Raises:
            ConfigError: code ``NO_SEAL``: a Zstandard store (its frames carry checksums).
            SessionNotFoundError: no such session. SessionBusyError: a writer holds it.
            LogCorruptError: the log breaks the format's rules, or its seal is present and
                readable and the log fails it (``LOG_CORRUPT``, nothing is sealed:
                :func:`refuse_reseal_over_damage`).
        """
        if self.compression != "none":
            raise ConfigError(f"session {session_id!r} is stored Zstandard-framed, whose frames "
                              "carry their own checksums: it has no seal to rebuild",
                              code="NO_SEAL", session_id=session_id)
        with self.open(session_id, "write") as handle:  # one read: the check's
            read = refuse_reseal_over_damage(handle.read, session_id, handle._seal_path())
            return handle.reseal_committed(keep=read is not None, read=read)

    def seal_chain(self, session_id: str) -> tuple[str, str]:
        """The log's seal and the digest its chain binds (see ``Reseals.seal_chain``).

        Raw: the seal and the header line's digest. Zstandard: the chain sidecar and the
        header frame's digest (docs/formats.md#zstandard-chain).

        Raises:
            SessionNotFoundError: no such session.
            LogCorruptError: a Zstandard log whose header frame is damaged.
        """
        with self.open(session_id, "read") as handle:
            with open(handle.path, "rb") as f:
                if self.compression == "none":
                    return str(handle._seal_path()), rp.digest(f.readline())
                data = f.read()
            end = scan_zstd_frames(data, path=str(handle.path), max_frames=1)[0][0][1]
            seal = handle._seal_path()
            if not os.path.lexists(seal) and os.path.lexists(aside_name(seal)):
                # an interrupted rewrite: the sidecar it left that fits the log
                seal = handle._zstd_chain_candidate(len(handle.read().events)) or seal
            return str(seal), rp.digest(data[:end])

    def saved_cuts(self, session_id: str) -> list[str]:
        """Paths of the files holding bytes a torn-tail repair cut from this session's log.

        Each is ``<log>.torn-<UTC time>-<pid>`` beside the log, oldest first; empty when the
        session is unknown or nothing was ever cut.
        """
        path = self._find(session_id)
        return [] if path is None else [str(p) for p in list_cuts(path.parent, path.name)]

    def close(self) -> None:
        """Nothing held at backend level (handles own their files); idempotent."""

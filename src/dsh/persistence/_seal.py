"""Integrity seals: a sidecar of checksummed ranges covering every committed unit of a log.

Raw JSONL and SQLite have no checksum of their own, and dsh's formats leave no room for one
(an extra event per batch would change the log; an extra table makes dsh refuse the database).
So the writer keeps a sidecar file beside the log (``session.jsonl.seal``; SQLite:
``<db>.dsh-seals/<encoded id>.seal``), which dsh never opens:

* layout: the 8-byte magic ``DSHSEAL1``, a 4-byte little-endian identity length, the identity
  (SQLite: the session's ``incarnation``; JSONL: empty), then fixed 20-byte records
  ``(start: u64, end: u64, crc32: u32)``, little-endian;
* JSONL records are byte ranges of the log file, SQLite records are ``[first seq, end seq)``
  ranges of physical rows; records are contiguous from 0, one per durable batch;
* a record is appended only after the batch it seals is durable, without an fsync of its own.
  A crash can therefore lose the last records or leave a partial or zero-filled one: those
  are ignored, and the log's unsealed tail (bytes or rows after the last record) is read
  under the format's own rules, then sealed by the next writer before it appends;
* a sealed range whose bytes (rows) are missing or differ is :class:`LogCorruptError`;
* a restore point record ``(RESTORE_POINT_MARK, digest[0:8], digest[8:12])`` records the first
  12 bytes of the SHA-256 of a restore point body the writer wrote; it sits among the range
  records, which skip it (:attr:`Seal.restore_points`;
  docs/rules.md#restore-points-are-never-the-truth).

How a fast reader verifies (persistence perf path): read the seal *before* the log, then one
``zlib.crc32(data[start:end])`` per record over the bytes it already holds; nothing is parsed.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import logging
import os
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn, TypeVar

from dsh._errors import LogCorruptError, SealDamagedError
from dsh.json import CFallback, c_crc32, c_rows_text, c_seal_batch
from dsh.persistence._chain import (
    CHAIN_MARK,
    HEAD_SLOT,
    ChainRecord,
    ChainState,
    Head,
    RawRecord,
    decode_head,
    encode_head,
    frame_extent,
    frame_record,
    raw_span,
    record_of,
)
from dsh.persistence._paths import fsync_folder, open_sidecar, write_all
from dsh.session import PAGE_EVENTS

__all__ = ["CUT_TAIL_SEQS", "RESTORE_POINT_MARK", "Seal", "SealCut",
           "append_restore_point_mark", "append_chain_to", "append_restore_point_mark_to",
           "append_batch_to", "append_seal", "append_seal_to", "batch_seal", "check_byte_seals",
           "publish_head",
           "refuse_reseal_over_damage", "check_row_seals", "covers", "crc_of", "cut_tail",
           "install_seal", "span_crc",
           "open_seal_appender", "read_elided",
           "read_seal", "read_seal_after", "reset_seal", "restore_point_mark", "row_records",
           "rows_crc", "rows_text", "seal_binding", "seal_cut", "stage_seal",
           "staged_name"]

logger = logging.getLogger(__name__)

MAGIC: Final = b"DSHSEAL1"
MAGIC2: Final = b"DSHSEAL2"
"""A chained seal: two head slots after the identity, chain records among the range records
(:mod:`dsh.persistence._chain`, docs/formats.md#the-seal-chain)."""
_RECORD: Final = struct.Struct("<QQI")
_LEN: Final = struct.Struct("<I")
_MAX_IDENTITY: Final = 1024

RESTORE_POINT_MARK: Final = 0xFFFF_FFFF_FFFF_FFFF
"""The ``start`` of a seal record that records a restore point's digest, not a range."""

_MARK_BYTES: Final = 12

crc_of = c_crc32 or zlib.crc32
"""The checksum of a sealed range: ``zlib.crc32`` of its exact bytes (the accelerator's
carry-less twin where the CPU has it: the same value, several times faster)."""


class Seal:
    """The valid records of a seal file.

    Attributes:
        path: The seal file.
        identity: What the file was written for (empty for JSONL).
        records: ``(start, end, crc)`` ranges, contiguous from 0.
        restore_points: The restore point digests the writer recorded (first 12 bytes of
            each body's SHA-256, :func:`restore_point_mark`), oldest first.
        version: 1 (``DSHSEAL1``: no chain) or 2 (``DSHSEAL2``).
        chain: The chain records (version 2), oldest first, links checked.
        head: The head published in the seal's head slots (version 2).
        elided: None for a whole read; for :func:`read_seal_after`, the :class:`SealCut`
            whose records were not read (``records``, ``restore_points`` and ``chain`` are
            then the ones after it).
        clean: The file ends exactly after its last valid record (no torn or zeroed bytes),
            so a writer may append to it without rewriting it.
    """

    __slots__ = ("_chain", "_raw_chain", "_source", "clean", "elided", "head", "identity",
                 "path", "records", "restore_points", "version")

    def __init__(self, path: Path, identity: bytes, records: list[tuple[int, int, int]],
                 restore_points: list[bytes] | None = None, *, version: int = 1,
                 chain: list[ChainRecord] | None = None, head: Head | None = None,
                 raw_chain: list[RawRecord] | None = None, elided: SealCut | None = None,
                 clean: bool = False) -> None:
        self.path = path
        self.identity = identity
        self.records = records
        self.restore_points = restore_points if restore_points is not None else []
        self.version = version
        # the records as read are built into ChainRecords only when asked for (chain)
        self._chain: list[ChainRecord] | None = (
            chain if chain is not None else None if raw_chain is not None else [])
        self._raw_chain = raw_chain
        self._source: Seal | None = None
        self.head = head
        self.elided = elided
        self.clean = clean

    @property
    def chain(self) -> list[ChainRecord]:
        """The chain records, oldest first, their links checked.

        Built on first use: :func:`read_seal` checks the links on the records as stored, and
        a reader that only checks rows against the range records needs no more.
        """
        if self._chain is None:
            if self._source is not None:  # a copy: the parse it came from builds them once
                self._chain = self._source.chain
            else:
                self._chain = [record_of(raw) for raw in self._raw_chain or ()]
        return self._chain

    def last_chained(self) -> ChainRecord | None:
        """The last chain record, or None; the others are not built when not built yet."""
        if self._chain is None:  # the raw records are shared with the parse a copy came from
            return record_of(self._raw_chain[-1]) if self._raw_chain else None
        return self._chain[-1] if self._chain else None

    def copy(self) -> Seal:
        """A seal with the same records in new lists; the chain records are shared."""
        seal = Seal(self.path, self.identity, list(self.records), list(self.restore_points),
                    version=self.version, head=self.head, raw_chain=self._raw_chain,
                    elided=self.elided, clean=self.clean)
        seal._chain = self._chain if self._chain is not None else None
        seal._source = self
        return seal

    def chain_state(self) -> ChainState:
        """A writer's :class:`ChainState` continuing this seal's chain."""
        head = self.head
        cut = self.elided
        if cut is None:
            return ChainState(list(self.chain), head.counter if head else 0,
                              head.batches if head else 0)
        return ChainState(list(self.chain), head.counter if head else 0,
                          head.batches if head else 0, elided=cut.batches,
                          elided_hash=cut.chain_hash, elided_end=cut.chain_end)

    @property
    def end(self) -> int:
        """End of the sealed prefix (0 when nothing is sealed)."""
        if self.records:
            return self.records[-1][1]
        return self.elided.end if self.elided is not None else 0


@dataclass(frozen=True, slots=True)
class SealCut:
    """Where a restore point's cut falls in the seal file (docs/formats.md#restore-points).

    The seal is appended to, so the bytes a writer had written when it took a restore point's
    anchor stay as they were until a rewrite; a resume checks them by one SHA-256 and reads
    only the records after them, so its cost does not grow with the number of batches.

    Attributes:
        offset: Bytes of the seal file (from its start) when the anchor was taken.
        records: Range records in the file before ``offset``.
        end: End of the last of them (the cut: a byte offset, SQLite a seq).
        batches: Chain records before ``offset``.
        chain_end: One past the last seq they chain (0: none).
        chain_hash: The hash of the last of them (zeros: none).
        digest: SHA-256 of the file's bytes from its first record to ``offset``.
        tail: The last range records before ``offset`` (SQLite: ``(first seq, end seq,
            crc)``), contiguous and ending at ``end``, covering at least the last
            :data:`CUT_TAIL_SEQS` seqs when the file holds that many (empty: not carried). A
            page-in within them is checked against them without reading the records before
            the cut (docs/rules.md#verified-page-in).
    """

    offset: int
    records: int
    end: int
    batches: int
    chain_end: int
    chain_hash: bytes
    digest: bytes
    tail: tuple[tuple[int, int, int], ...] = ()

    def encode(self) -> str:
        """The anchor's ``sealDigest`` text: ``s2:`` (``s3:`` with a tail) and the fields.

        The fields are ``:``-separated; an ``s3:`` cut ends with the tail records packed as
        little-endian ``(u64, u64, u32)``, in hex.
        """
        fields = (f"{self.offset}:{self.records}:{self.end}:{self.batches}:"
                  f"{self.chain_end}:{self.chain_hash.hex()}:{self.digest.hex()}")
        if not self.tail:
            return _CUT_PREFIX + fields
        packed = b"".join(_RECORD.pack(*record) for record in self.tail)
        return f"{_TAIL_CUT_PREFIX}{fields}:{packed.hex()}"

    @classmethod
    def decode(cls, text: str) -> SealCut | None:
        """The cut an anchor's ``sealDigest`` names, or None (another form, or malformed).

        A tail that is not whole records, not contiguous, not ending at the cut's ``end``
        or longer than its ``records`` is malformed.
        """
        if text.startswith(_TAIL_CUT_PREFIX):
            parts, count = text[len(_TAIL_CUT_PREFIX):].split(":"), 8
        elif text.startswith(_CUT_PREFIX):
            parts, count = text[len(_CUT_PREFIX):].split(":"), 7
        else:
            return None
        if len(parts) != count or not all(p.isdigit() and p.isascii() for p in parts[:5]):
            return None
        try:
            chain_hash, digest = bytes.fromhex(parts[5]), bytes.fromhex(parts[6])
            packed = bytes.fromhex(parts[7]) if count == 8 else b""
        except ValueError:
            return None
        if len(chain_hash) != 32 or len(digest) != 32 or len(packed) % _RECORD.size \
                or (count == 8 and not packed):
            return None
        offset, records, end, batches, chain_end = map(int, parts[:5])
        tail = tuple(_RECORD.iter_unpack(packed))
        expected = tail[0][0] if tail else end
        for start, stop, _ in tail:
            if start != expected or stop <= start:
                return None
            expected = stop
        if expected != end or len(tail) > records:
            return None
        return cls(offset, records, end, batches, chain_end, chain_hash, digest, tail)


_CUT_PREFIX: Final = "s2:"
_TAIL_CUT_PREFIX: Final = "s3:"

CUT_TAIL_SEQS: Final = 4 * PAGE_EVENTS
"""Seqs before a SQLite restore point's cut whose seal records its :class:`SealCut` carries
(``tail``): the pages a read of the latest items of a session pages in."""


def cut_tail(records: Sequence[tuple[int, int, int]], end: int
             ) -> tuple[tuple[int, int, int], ...]:
    """The last range records covering at least :data:`CUT_TAIL_SEQS` seqs before ``end``.

    ``records`` are contiguous, the last ending at ``end``; all of them when they cover fewer.
    Returns :attr:`SealCut.tail` (docs/formats.md#restore-points).
    """
    first = len(records)
    while first and end - records[first - 1][0] <= CUT_TAIL_SEQS:
        first -= 1
    first = max(0, first - 1)  # the record reaching back past the mark too
    return tuple(records[first:])


def _records_start(path: Path, data: bytes) -> tuple[int, int, bytes, Head | None] | None:
    """``(first record's byte, version, identity, published head)`` of seal bytes, or None.

    None for bytes that hold no whole header (a crash while the file was created).

    Raises:
        SealDamagedError: ``SEAL_CORRUPT`` (see :func:`read_seal`).
    """
    head = len(MAGIC) + _LEN.size
    version = 2 if data.startswith(MAGIC2) else 1
    if len(data) < head or not data.startswith((MAGIC, MAGIC2)):
        if not data.strip(b"\0") or MAGIC.startswith(data) or MAGIC2.startswith(data):
            return None  # a crash while the file was created
        raise _damaged(path, "it has no DSHSEAL1 or DSHSEAL2 magic", 0)
    (length,) = _LEN.unpack_from(data, len(MAGIC))
    slots = 2 * HEAD_SLOT if version == 2 else 0
    if length > _MAX_IDENTITY or head + length > len(data):
        raise _damaged(path, f"identity length {length}", len(MAGIC))
    identity = data[head:head + length]
    if head + length + slots > len(data):  # cut inside its head: a seal with no record
        return len(data), version, identity, None
    published = decode_head(data[head + length:head + length + slots]) if slots else None
    if slots and published is None:
        raise _damaged(path, "both chain head slots are invalid", head + length)
    return head + length + slots, version, identity, published


def seal_binding(path: Path, seals: list[tuple[int, int, int]], cut: SealCut | None, end: int,
                 chain: ChainState | None, *, pending: bool, rewrite: Callable[[], None] | None,
                 unelide: Callable[[], None], digest: Callable[[], str],
                 ride_along: bool = False) -> str | None:
    """A restore point anchor's ``sealDigest`` for a cut at ``end`` (JSONL bytes, SQLite seqs).

    Rule: docs/formats.md#restore-points. Where the seal file holds exactly the writer's
    records up to ``end``, the :class:`SealCut` of the file as it is (one digest of its bytes,
    which a resume checks without parsing them); else the digest of the records themselves.

    Args:
        path: The seal file.
        seals: The writer's range records after ``cut`` (the list the handle keeps: ``unelide``
            puts the records before the cut back in front of it, in place).
        cut: Where a resume through a restore point left the seal unread, or None.
        end: Where the anchor's cut falls.
        chain: The writer's chain state.
        pending: A rewrite of the seal file is pending (a seal write failed, or the handle
            has not written it yet): no cut of the file as it is can be taken.
        rewrite: That rewrite (reads the elided records back, writes the file whole, clears
            the handle's pending flag; raises ``OSError`` or ``LogCorruptError``), made first
            when the records reach ``end`` so the cut is taken of the file the mark is
            appended to; None when it cannot be made now.
        unelide: Reads the records before ``cut`` back (raises ``LogCorruptError``).
        digest: The digest of the records themselves (after ``unelide``).
        ride_along: Carry the last range records in the cut (SQLite: a read of the latest
            events pages them in checked against these).

    Returns:
        The encoded cut or digest; None when the records could not be read (no anchor now).
    """
    sealed = seals[-1][1] if seals else (cut.end if cut is not None else 0)
    if pending and rewrite is not None and sealed == end:
        try:
            rewrite()
            cut, pending = None, False
        except (OSError, LogCorruptError) as exc:
            logger.debug("seal %s not rewritten before a restore point: %s", path, exc)
    if not pending and sealed == end:
        tail = cut_tail([*cut.tail, *seals] if cut is not None else seals, end) \
            if ride_along else ()
        found = seal_cut(path, (cut.records if cut is not None else 0) + len(seals), end, chain,
                         tail)
        if found is not None:
            return found.encode()
    try:
        unelide()
    except LogCorruptError:
        return None
    return digest()


def seal_cut(path: Path, records: int, end: int, chain: ChainState | None,
             tail: Sequence[tuple[int, int, int]] = ()) -> SealCut | None:
    """The :class:`SealCut` of the seal file as it is now, for a restore point's anchor.

    The caller's records and chain must be exactly those in the file (no rewrite pending);
    ``tail``: the last of those range records, carried in the cut (:attr:`SealCut.tail`).
    None when the file cannot be read or holds no header (the anchor then digests the
    records themselves, as before).
    """
    try:
        fd = open_sidecar(path, "integrity seals")
        try:
            with os.fdopen(fd, "rb") as f:
                data = f.read()
        except OSError:
            return None
        found = _records_start(path, data)
    except (OSError, LogCorruptError):
        return None
    if found is None:
        return None
    last = chain.records[-1] if chain is not None and chain.records else None
    return SealCut(len(data), records, end, chain.count if chain is not None else 0,
                   chain.end if chain is not None else 0,
                   last.hash if last is not None else (
                       chain.elided_hash if chain is not None else bytes(32)),
                   hashlib.sha256(memoryview(data)[found[0]:]).digest(), tuple(tail))


def read_seal(path: Path) -> Seal | None:
    """Read a seal file; ``None`` when it does not exist (or is empty).

    The file is read whole every time; when its bytes are those this process parsed last at
    the same path, that parse is reused (a copy of it), so a process that reads a session and
    then opens it to write checks its seal once.

    Raises:
        PersistenceError: code ``SYMLINK``: the seal's folder is a symlink.
        LogCorruptError: damage to the seal file, ``path`` naming it: ``SEAL_CORRUPT`` (not
            a seal, records not contiguous from 0, no valid head slot), ``SEAL_TRUNCATED``
            (fewer chain records than its head counts), ``SEAL_CHAIN_BROKEN`` (a chain record
            that does not link to the one before it, or differs from the head); ``seq``,
            ``batch`` and ``writer`` name the record.
    """
    data = _read_file(path)
    if not data:
        return None
    key = str(path)
    known = _READ.get(key)
    if known is not None and known[0] == data:
        return known[1].copy()  # the same bytes parse the same: a copy the caller may change
    seal = _parse(path, data)
    if seal is None:
        return None
    _READ.pop(key, None)
    _READ[key] = (data, seal)
    while sum(len(kept) for kept, _ in _READ.values()) > _READ_BYTES:
        del _READ[next(iter(_READ))]  # the oldest first
    return seal.copy()


def _open_seal(path: Path) -> int | None:
    """A read-only descriptor of the seal file at ``path``, or None when there is none.

    Raises:
        SealDamagedError: ``SEAL_UNREADABLE``: a symlink or a non-file where the seal belongs.
    """
    try:
        return open_sidecar(path, "integrity seals")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SealDamagedError(f"integrity seal {path} cannot be opened ({exc.strerror}); a "
                              f"symlink or a non-file is where the seal belongs", path=str(path),
                              code="SEAL_UNREADABLE") from exc


def _read_file(path: Path) -> bytes | None:
    """The bytes of the seal file at ``path``, or None when there is none.

    Raises:
        SealDamagedError: ``SEAL_UNREADABLE``: a symlink or a non-file where the seal belongs,
            or a read error.
    """
    fd = _open_seal(path)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            return f.read()
    except OSError as exc:
        raise SealDamagedError(f"integrity seal {path} cannot be read ({exc.strerror})",
                              path=str(path), code="SEAL_UNREADABLE") from exc


_READ: dict[str, tuple[bytes, Seal]] = {}
"""The last seals parsed, by path, with the bytes they were parsed from (see read_seal)."""
_READ_BYTES: Final = 8 << 20
"""At most this many bytes of seal files are kept parsed (a 100k-item SDK session's: 0.5 MB)."""


def _parse(path: Path, data: bytes) -> Seal | None:
    """The seal in ``data`` (the whole file at ``path``); raises as :func:`read_seal`."""
    found = _records_start(path, data)
    if found is None:
        return None
    first, version, identity, published = found
    records: list[tuple[int, int, int]] = []
    marks: list[bytes] = []
    chain: list[RawRecord] = []
    pos = _scan(path, data, first, len(data), version, records, marks, chain,
                counted=published.batches if published is not None else 0)
    if published is not None:
        _check_head(path, published, chain, pos)
    return Seal(path, identity, records, marks, version=version, head=published,
                raw_chain=chain, clean=pos == len(data))


def read_seal_after(path: Path, cut: SealCut, *, check_prefix: bool = True) -> Seal | None:
    """Read a seal past ``cut``: its bytes before it checked by one SHA-256, not parsed.

    For a resume through a restore point (docs/formats.md#restore-points): the records before
    the cut are not read, so the cost is the records after it, whatever the log's length.
    The returned seal's ``records``, ``restore_points`` and ``chain`` are those after the
    cut, and ``elided`` is ``cut``. When the published head counts fewer records than the cut
    (a writer that died between two head publications), the head cannot be checked without
    them: the seal is read whole (``elided`` None).

    The bytes before the cut are hashed as they are read, a chunk at a time through one small
    buffer, and not kept: only the header and the bytes from the 4 KiB page holding the cut
    on are held (at 100k SDK items the seal before the cut is 0.5 MB; reading it whole into
    fresh memory and slicing it cost twice its hash). Damage found after the cut is named by
    the same read of the whole file (:func:`_read_seal_after_whole`), byte offsets and all.

    Without ``check_prefix`` (a read-only open: docs/rules.md#restore-points-are-never-the-truth)
    the bytes before the cut are not read at all, only those from it on, parsed exactly as
    above: the file must reach the cut, the first range record after it start at the cut's
    ``end`` and the first chain record link to its ``chain_hash``; the caller requires the
    restore point's own digest among the records after it. Whoever then needs the records
    before the cut (:func:`read_elided`) checks those bytes against the digest first.

    Returns:
        The seal, or None when the file is absent, holds no header, or its bytes before the
        cut are not those the cut digested (rewritten or changed: the restore point is stale).

    Raises:
        PersistenceError, LogCorruptError: as :func:`read_seal`, for the records it reads.
    """
    fd = _open_seal(path)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb", buffering=0) as f:
            # in file order: the header, then the rest (a head published meanwhile counts no
            # record that is not read after it)
            head = _read_upto(f, _HEADER_BYTES)
            found = _records_start(path, head) if head else None
            if found is None:
                return None
            first, version, identity, published = found
            if cut.offset < first or (cut.batches and version != 2) \
                    or (check_prefix and not _hashes_to(f, head, first, cut)):
                return None
            base = cut.offset - cut.offset % _PAGE
            f.seek(base)
            rest = f.read() or b""
            if base + len(rest) < cut.offset:
                return None  # the file ends before the cut: rewritten (checked: _hashes_to)
    except OSError as exc:
        raise SealDamagedError(f"integrity seal {path} cannot be read ({exc.strerror})",
                              path=str(path), code="SEAL_UNREADABLE") from exc
    try:
        # rest starts on a 4 KiB page boundary of the file, as the hole test assumes
        return _seal_past(path, cut, rest, base, version, identity, published)
    except SealDamagedError:
        return _read_seal_after_whole(path, cut)  # names the damage by its offset in the file


_HEADER_BYTES: Final = len(MAGIC) + _LEN.size + _MAX_IDENTITY + 2 * HEAD_SLOT
"""The most a seal's header takes (magic, identity length, identity, two head slots)."""
_HASH_CHUNK: Final = 64 << 10
"""Bytes hashed at a time by :func:`read_seal_after` (below glibc's mmap threshold, so the
buffer is reused heap memory, not fresh pages)."""
_PAGE: Final = 4096


def _read_upto(f: io.FileIO, size: int) -> bytes:
    """Up to ``size`` bytes from ``f``'s position (fewer only at its end)."""
    parts = []
    while size > 0:
        chunk = f.read(size)
        if not chunk:
            break
        parts.append(chunk)
        size -= len(chunk)
    return b"".join(parts)


def _hashes_to(f: io.FileIO, head: bytes, first: int, cut: SealCut) -> bool:
    """Whether the seal's bytes ``[first, cut.offset)`` hash to ``cut.digest``.

    ``head`` holds the file's first bytes and ``f`` is positioned after them; the bytes after
    ``head`` up to the cut are read and hashed a chunk at a time. False when the file ends
    before the cut.
    """
    digest = hashlib.sha256(memoryview(head)[first:cut.offset])
    pos = len(head)
    if pos < cut.offset:
        buffer = memoryview(bytearray(min(_HASH_CHUNK, cut.offset - pos)))
        while pos < cut.offset:
            got = f.readinto(buffer[:cut.offset - pos])
            if not got:
                return False
            digest.update(buffer[:got])
            pos += got
    return digest.digest() == cut.digest


def _read_seal_after_whole(path: Path, cut: SealCut) -> Seal | None:
    """:func:`read_seal_after` over the whole file read at once: how its damage is named.

    Raises:
        PersistenceError, LogCorruptError: as :func:`read_seal_after`.
    """
    data = _read_file(path)
    if not data:
        return None
    found = _records_start(path, data)
    if found is None:
        return None
    first, version, identity, published = found
    if not first <= cut.offset <= len(data) or (cut.batches and version != 2) \
            or hashlib.sha256(memoryview(data)[first:cut.offset]).digest() != cut.digest:
        return None
    return _seal_past(path, cut, data, 0, version, identity, published)


def _seal_past(path: Path, cut: SealCut, data: bytes, base: int, version: int,
               identity: bytes, published: Head | None) -> Seal | None:
    """The seal past ``cut`` from ``data``, the file's bytes from byte ``base`` to its end.

    Raises:
        PersistenceError, LogCorruptError: as :func:`read_seal_after`.
    """
    if published is not None and published.batches < cut.batches:
        seal = read_seal(path)
        return seal if seal is not None and len(seal.records) >= cut.records else None
    records: list[tuple[int, int, int]] = []
    marks: list[bytes] = []
    chain: list[RawRecord] = []
    pos = _scan(path, data, cut.offset - base, len(data), version, records, marks, chain,
                expected=cut.end, prev=(cut.chain_hash, cut.chain_end, cut.batches),
                counted=published.batches if published is not None else 0)
    if published is not None:
        _check_head(path, published, chain, base + pos, elided=cut)
    return Seal(path, identity, records, marks, version=version, head=published,
                raw_chain=chain, elided=cut, clean=pos == len(data))


def read_elided(path: Path, cut: SealCut, *, chain: bool = True
                ) -> tuple[list[tuple[int, int, int]], list[ChainRecord]]:
    """The range and chain records before ``cut`` (what :func:`read_seal_after` left unread).

    For a writer about to rewrite the seal whole, or a page-in that checks the bytes before
    the cut: the bytes are checked against the cut's digest again, then parsed as
    :func:`read_seal` parses them. Without ``chain`` (a page-in needs the range records only)
    the chain records are stepped over by their length, not decoded (the digest vouches for
    them), and the returned chain is empty.

    Raises:
        SealDamagedError: the file is gone, or its bytes before the cut changed since the
            restore point was written (``SEAL_CORRUPT``; a read-only resume did not hash
            them), or are not the records the cut counts.
    """
    try:
        fd = open_sidecar(path, "integrity seals")
        with os.fdopen(fd, "rb") as f:
            data = f.read(cut.offset)
    except OSError as exc:
        raise SealDamagedError(f"integrity seal {path} cannot be read ({exc.strerror})",
                              path=str(path), code="SEAL_UNREADABLE") from exc
    found = _records_start(path, data) if data else None
    if found is None or len(data) != cut.offset \
            or hashlib.sha256(memoryview(data)[found[0]:]).digest() != cut.digest:
        raise _damaged(path, f"its first {cut.offset} bytes are not those its restore "
                       "point's seal cut digested: they changed after the restore point was "
                       "written", 0)
    records: list[tuple[int, int, int]] = []
    chained: list[RawRecord] = []
    if chain:
        _scan(path, data, found[0], len(data), found[1], records, [], chained)
    else:
        _scan_ranges(data, found[0], len(data), records)
    if len(records) != cut.records or (chain and len(chained) != cut.batches) \
            or (records and records[-1][1] != cut.end) \
            or (chained and chained[-1][2] != cut.chain_hash):
        raise _damaged(path, f"its first {cut.offset} bytes are not the {cut.records} records "
                       "the restore point counted", 0)
    return records, [record_of(raw) for raw in chained]


_CHAIN_FRAME: Final = struct.Struct("<QI")


def _scan_ranges(data: bytes, pos: int, stop: int, records: list[tuple[int, int, int]]) -> None:
    """The range records of ``data[pos:stop]``, bytes a digest vouched for (see read_elided).

    Marks and chain records are stepped over; the caller checks the count and the last end.
    """
    unpack, frame, size = _RECORD.unpack_from, _CHAIN_FRAME.unpack_from, _RECORD.size
    while pos + size <= stop:
        start, end, crc = unpack(data, pos)
        if start == CHAIN_MARK:
            pos += size + frame(data, pos)[1]  # frame (20 bytes) + payload length
        elif start == RESTORE_POINT_MARK:
            pos += size
        else:
            records.append((start, end, crc))
            pos += size


def _scan(path: Path, data: bytes, pos: int, stop: int, version: int,
          records: list[tuple[int, int, int]], marks: list[bytes], chain: list[RawRecord],
          *, expected: int = 0, prev: tuple[bytes, int, int] | None = None,
          counted: int = 0) -> int:
    """Parse the records of ``data[pos:stop]`` into the lists; return where they end.

    ``expected`` is where the next range record must start, ``prev`` the ``(hash, end seq,
    count)`` of the chain record before the first one (a read past a :class:`SealCut`),
    ``counted`` the chain records the published head counts (:func:`_torn_chain`).

    Raises:
        SealDamagedError: ``SEAL_CORRUPT``, ``SEAL_CHAIN_BROKEN`` (see :func:`read_seal`).
    """
    # what the next chain record must link to and follow
    link, linked_end = (prev[0], prev[1]) if prev is not None and prev[2] else (bytes(32), 0)
    base = prev[2] if prev is not None else 0
    while pos + _RECORD.size <= stop:
        start, end, crc = _RECORD.unpack_from(data, pos)
        if start == RESTORE_POINT_MARK:
            marks.append(data[pos + 8:pos + _RECORD.size])
            pos += _RECORD.size
            continue
        if start == CHAIN_MARK and version == 2:
            found = frame_record(data, pos)
            if found is None:
                # torn (cut short, or its crc differs) unless it is a changed record
                _torn_chain(path, data, pos, stop, expected, linked_end,
                            base + len(chain), counted)
                break  # the head check judges a seal cut short
            raw = found[0]
            first, last = raw_span(raw)
            if raw[0][:32] != link or last <= first or first < linked_end:
                _broken(path, chain, raw, pos, link, base)
            chain.append(raw)
            link, linked_end = raw[2], last
            pos = found[1]
            continue
        if start != expected or end <= start:
            if not data[pos:pos + _RECORD.size].strip(b"\0"):
                # A zero-filled record: records are appended without an fsync of their own,
                # so after a power cut the unsynced pages of the file may be zeros while later
                # ones reached the disk (a hole). What follows was never synced: it is
                # ignored like a torn tail, and the log's bytes after the last valid record
                # are read by the format's rules and sealed again by the next writer.
                break
            raise _damaged(path, f"record at byte {pos} covers [{start}, {end}) but the "
                           f"previous one ended at {expected}", pos)
        records.append((start, end, crc))
        expected = end
        pos += _RECORD.size
    return pos


def _torn_chain(path: Path, data: bytes, pos: int, stop: int, expected: int, after_seq: int,
                batch: int, counted: int) -> None:
    """Tell a torn chain record at ``pos`` (the records end there) from a changed one.

    A record the file's end cuts short, with no valid chain record after it, is torn (the head
    check then says whether the seal lost records: ``SEAL_TRUNCATED``). One whose crc32 or
    lengths are wrong while its bytes are all there (or valid records follow) was changed,
    and is ``SEAL_CHAIN_BROKEN`` when the published head counts it (a head only counts
    records that were fsynced) or when valid records follow it; except that a power cut can
    leave unsynced pages of the file zero-filled (a hole), so a record not counted whose bytes
    from a 4 KiB page boundary on are zeros is torn (docs/formats.md#the-seal-chain).

    Raises:
        SealDamagedError: ``SEAL_CHAIN_BROKEN``, naming the record's byte offset and batch.
    """
    end = frame_extent(memoryview(data)[:stop], pos)
    short = pos + _RECORD.size > stop or (end is not None and end > stop)
    if end is not None and not short:
        follows = _valid_at(data, end, stop, expected)
    else:  # its lengths cannot be trusted: is a valid chain record anywhere after it?
        follows = _chain_after(data, pos, stop)
        end = stop
    if short and not follows:
        return  # cut short by the end of the file
    if batch >= counted and not (follows and not _hole(data, pos, end)):
        return
    raise _damaged(path, f"the chain record at byte {pos}, batch {batch} (after seq "
                   f"{after_seq - 1}), has a wrong crc32 or length" + (
                       ", and valid records follow it" if batch >= counted else
                       ", and the head counts it") + ": a record was changed",
                   pos, "SEAL_CHAIN_BROKEN", seq=after_seq, batch=batch)


def _valid_at(data: bytes, pos: int, stop: int, expected: int) -> bool:
    """Whether a valid record (range, restore point or chain record) starts at ``pos``."""
    if pos + _RECORD.size > stop:
        return False
    start: int
    end: int
    start, end, _ = _RECORD.unpack_from(data, pos)
    if start == CHAIN_MARK:
        return frame_record(memoryview(data)[:stop], pos) is not None
    return start == RESTORE_POINT_MARK or (start == expected and end > start)


def _chain_after(data: bytes, pos: int, stop: int) -> bool:
    """Whether a valid chain record (its crc32 checked) starts after ``pos``, before ``stop``."""
    mark = CHAIN_MARK.to_bytes(8, "little")
    view = memoryview(data)[:stop]
    at = data.find(mark, pos + 1, stop)
    while at != -1:
        if frame_record(view, at) is not None:
            return True
        at = data.find(mark, at + 1, stop)
    return False


def _hole(data: bytes, pos: int, end: int) -> bool:
    """Whether ``data[pos:end]`` holds a page the disk never wrote back (a power cut).

    That is: zeros from a 4 KiB boundary inside it to its end, or for a whole page.
    """
    page = 4096
    boundary = (pos // page + 1) * page
    while boundary < end:
        if not any(data[boundary:min(end, boundary + page)]):
            return True
        boundary += page
    return False


def _damaged(path: Path, why: str, offset: int, code: str = "SEAL_CORRUPT",
             **where: int | str | None) -> SealDamagedError:
    """Damage to the seal file itself, not to the log (docs/formats.md#integrity-seals)."""
    return SealDamagedError(
        f"integrity seal {path} is damaged ({why}); the log itself is not judged by this: "
        f"restore the seal from a backup, or move it aside to read the log unverified and "
        f"run 'dsh verify --reseal ID' to seal the log as it is now", path=str(path),
        byte_offset=offset, code=code,
        **where)


def _broken(path: Path, chain: list[RawRecord], raw: RawRecord, pos: int, link: bytes,
            base: int = 0) -> NoReturn:
    """Raise for ``raw``, which does not follow the record hashing to ``link`` (hash, seqs).

    ``base``: chain records before ``chain``'s first that were not read (a seal cut).
    """
    record = record_of(raw)
    if link != record.prev:
        raise _damaged(path, f"the chain record at byte {pos}, {record.where()}, does not link "
                       f"to the record before it: a record was changed, removed or reordered",
                       pos, "SEAL_CHAIN_BROKEN", seq=record.first, batch=base + len(chain),
                       writer=str(record.writer))
    raise _damaged(path, f"the chain record at byte {pos} covers seq {record.first}.."
                   f"{record.end - 1}, out of order", pos, "SEAL_CHAIN_BROKEN",
                   seq=record.first, batch=base + len(chain), writer=str(record.writer))


def _check_head(path: Path, head: Head, chain: list[RawRecord], end: int, *,
                elided: SealCut | None = None) -> None:
    """The head slot against the chain: records it counts must all be there, unchanged.

    With ``elided``, ``chain`` follows the cut's records (the caller made sure the head
    counts at least those).
    """
    base = elided.batches if elided is not None else 0
    total = base + len(chain)
    if head.batches > total:
        last = record_of(chain[-1]) if chain else None
        raise _damaged(
            path, f"its head records {head.batches} sealed batches up to seq {head.end - 1}, "
            f"but only {total} chain record{'' if total == 1 else 's'} "
            f"remain{'s' if total == 1 else ''}" + (
                f", the last one {last.where()}" if last is not None else "")
            + f" (the records stop at byte {end}): the seal file lost records", end,
            "SEAL_TRUNCATED", seq=last.end if last is not None else (
                elided.chain_end if elided is not None else 0), batch=total)
    if not head.batches:
        return
    if elided is not None and head.batches == base:
        if head.hash != elided.chain_hash:
            raise _damaged(path, f"its head does not match chain record {base - 1}: the chain "
                           "was rewritten", end, "SEAL_CHAIN_BROKEN", seq=elided.chain_end,
                           batch=base - 1)
        return
    if chain[head.batches - 1 - base][2] != head.hash:
        record = record_of(chain[head.batches - 1 - base])
        raise _damaged(path, f"its head does not match chain record {head.batches - 1}, "
                       f"{record.where()}: the chain was rewritten", end, "SEAL_CHAIN_BROKEN",
                       seq=record.first, batch=head.batches - 1, writer=str(record.writer))


def check_byte_seals(data: bytes, seal: Seal, *, log_path: str) -> None:
    """Check every sealed byte range of a JSONL log against ``data`` (the whole file).

    Raises:
        LogCorruptError: a sealed range ends past the file's end (committed bytes were cut) or
            its crc32 differs (committed bytes changed); ``byte_offset`` and ``line`` (the
            physical line where the range starts) name the place.
    """
    size = len(data)
    for start, end, crc in seal.records:
        if end > size:
            raise LogCorruptError(
                f"corrupt session log: {log_path} ends at byte {size}, but its integrity seal "
                f"{seal.path} covers committed bytes up to {end}: committed data was cut off",
                path=log_path, byte_offset=size, line=data.count(b"\n", 0, size) + 1)
        if crc_of(data[start:end]) != crc:
            line = data.count(b"\n", 0, start) + 1
            raise LogCorruptError(
                f"corrupt session log: bytes {start}..{end} of {log_path} (from line {line}) "
                f"differ from what was committed (crc32 mismatch with the integrity seal "
                f"{seal.path})", path=log_path, byte_offset=start, line=line)


_R = TypeVar("_R")


def refuse_reseal_over_damage(read: Callable[[], _R], session_id: str, seal: Path) -> _R | None:
    """Let a reseal go on only when the log is not what a read refuses; give the read.

    ``dsh verify --reseal`` rebuilds a seal that is lost (``SEAL_MISSING``) or damaged
    (another ``SEAL_*``); a read that passes has nothing to hide either. A read refused for
    the log itself (``LOG_CORRUPT``: sealed bytes or rows changed or went missing) with its
    seal present and readable is not resealed: that would accept the damage the seal just
    found. Moving the seal aside first is the explicit way to accept the log as it is
    (docs/formats.md#integrity-seals).

    Args:
        read: A full read of the session through the write handle that reseals it (one read
            serves the check and the reseal).
        session_id: The session, for the message.
        seal: Its seal file, for the message.

    Returns:
        The read's result when the log passes its present seal (the reseal may keep that
        seal and its chain); None when the seal is missing or damaged.

    Raises:
        LogCorruptError: ``LOG_CORRUPT``, with the refused read's location fields and the
            refusal chained.
    """
    try:
        return read()
    except SealDamagedError:
        return None
    except LogCorruptError as error:
        raise LogCorruptError(
            f"not resealed: the integrity seal {seal} of session {session_id!r} is present "
            f"and readable, and the log is what is damaged ({error.message}); restore the "
            f"log from a backup, or, to accept it as it is now, move the seal aside and run "
            f"'dsh verify --reseal {session_id}' again", code=error.code,
            **{**error.where, "session_id": session_id}) from error


def restore_point_mark(body_digest: str) -> bytes:
    """The 12 bytes a seal records for a restore point whose body's hex SHA-256 is given."""
    return bytes.fromhex(body_digest)[:_MARK_BYTES]


def _mark_record(mark: bytes) -> bytes:
    return struct.pack("<Q", RESTORE_POINT_MARK) + mark


def stage_seal(path: Path, identity: bytes, records: Sequence[tuple[int, int, int]],
               restore_points: Sequence[bytes] = (), *, chain: ChainState | None = None,
               tmp: Path | None = None) -> Path:
    """Write a whole seal file beside ``path`` under a temp name, fsynced; return that name.

    :func:`install_seal` renames it over the seal. A writer stages the seal of bytes it is
    about to publish, so the log never exists marked as sealed without its seal for longer
    than a rename (docs/formats.md#integrity-seals). With ``chain`` the file is a chained
    seal (``DSHSEAL2``) whose head slot names the whole chain (``chain``'s head counter is
    advanced); without, a ``DSHSEAL1`` seal. ``tmp`` names the staged file (default
    ``.<seal name>.<pid>.tmp``; a SQLite rewrite uses :func:`staged_name`).

    Raises:
        OSError: the file could not be written (nothing is renamed).
    """
    if tmp is None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        if chain is None:
            start = MAGIC + _LEN.pack(len(identity)) + identity
            chained = b""
        else:
            head = chain.head()
            slot = encode_head(head)
            slots = slot + bytes(HEAD_SLOT) if head.counter % 2 == 0 else bytes(HEAD_SLOT) + slot
            start = MAGIC2 + _LEN.pack(len(identity)) + identity + slots
            chained = b"".join(r.encode() for r in chain.records)
        write_all(fd, start + b"".join(_RECORD.pack(*r) for r in records) + chained
                   + b"".join(_mark_record(m) for m in restore_points))
        os.fsync(fd)
    finally:
        os.close(fd)
    if chain is not None:
        chain.head_counter, chain.published = head.counter, head.batches
    return tmp


def append_chain_to(fd: int, record: ChainRecord) -> None:
    """Append one chain record through a descriptor from :func:`open_seal_appender`.

    Raises:
        OSError: the record could not be written (a partial record is torn: readers stop
            there, and the head check says whether it was published).
    """
    write_all(fd, record.encode())


def publish_head(path: Path, identity: bytes, chain: ChainState) -> None:
    """Make the seal durable, then write the chain's head into its next head slot.

    The fsync comes first, so a published head never counts a record a power cut can take
    away; the slot itself is not synced (a lost slot write leaves the older head, which is
    still true). Slots alternate, so a torn slot write leaves the other one valid
    (docs/formats.md#the-seal-chain).

    Raises:
        OSError: the seal could not be synced or written (the older head stays).
    """
    head = chain.head()
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
        offset = len(MAGIC2) + _LEN.size + len(identity) + (head.counter % 2) * HEAD_SLOT
        if os.pwrite(fd, encode_head(head), offset) != HEAD_SLOT:
            raise OSError(f"short write of the chain head to {path}")
    finally:
        os.close(fd)
    chain.head_counter, chain.published = head.counter, head.batches


def aside_name(path: Path) -> Path:
    """Where a rewrite moves the seal ``path`` while it replaces the log (a staged name)."""
    return path.with_name(f".{path.name}.old.tmp")


def staged_name(path: Path) -> Path:
    """Where a SQLite rewrite stages the new seal of ``path`` (a fixed name, found by a stat).

    Its seals share one folder, so a reader looks for the rewrite's two seals by name
    (this and :func:`aside_name`) instead of listing the folder
    (docs/formats.md#integrity-seals).
    """
    return path.with_name(f".{path.name}.new.tmp")


def staged_seals(path: Path) -> list[Path]:
    """The staged seals beside the seal ``path`` (:func:`stage_seal`, :func:`aside_name`)."""
    try:
        names = os.listdir(path.parent)
    except FileNotFoundError:
        return []
    prefix = f".{path.name}."
    return [path.with_name(n) for n in sorted(names)
            if n.startswith(prefix) and n.endswith(".tmp")]


def install_seal(tmp: Path, path: Path) -> None:
    """Rename a staged seal (:func:`stage_seal`) over ``path`` and fsync the folder.

    Raises:
        OSError: the rename or the folder's fsync failed.
    """
    os.replace(tmp, path)
    fsync_folder(path.parent)


def reset_seal(path: Path, identity: bytes, records: Sequence[tuple[int, int, int]],
               restore_points: Sequence[bytes] = (), *, chain: ChainState | None = None
               ) -> None:
    """Replace the seal file atomically with ``records``, durably.

    The temp file is fsynced before it is renamed over the seal and the folder after, so a
    power cut leaves the old seal or the whole new one, never none (a seal is rewritten on a
    handle's first seal write, after a failed one, and when it is created). Records appended
    later (:func:`append_seal_to`) are not synced one by one: a power cut may lose the last
    ones or leave zeros where they were, which a reader ignores (docs/formats.md#integrity-seals).

    Raises:
        OSError: the file could not be written (the old seal stays).
    """
    install_seal(stage_seal(path, identity, records, restore_points, chain=chain), path)


def append_seal(path: Path, start: int, end: int, crc: int) -> None:
    """Append one record ``[start, end)`` to an existing seal file (one ``write``).

    Raises:
        OSError: the record could not be written.
    """
    fd = open_seal_appender(path)
    try:
        append_seal_to(fd, start, end, crc)
    finally:
        os.close(fd)


def append_restore_point_mark(path: Path, mark: bytes) -> None:
    """Append a restore point record (:func:`restore_point_mark`) to an existing seal file.

    Raises:
        OSError: the record could not be written.
    """
    fd = open_seal_appender(path)
    try:
        append_restore_point_mark_to(fd, mark)
    finally:
        os.close(fd)


def append_restore_point_mark_to(fd: int, mark: bytes) -> None:
    """Append a restore point record through a descriptor from :func:`open_seal_appender`.

    Raises:
        OSError: the record could not be written.
    """
    write_all(fd, _mark_record(mark))


def open_seal_appender(path: Path) -> int:
    """An append-only descriptor of an existing seal file, for :func:`append_seal_to`.

    A writer that seals every batch keeps it open (the caller closes it), saving an open and
    a close per batch.

    Raises:
        OSError: the file is missing, a symlink, or cannot be opened for writing.
    """
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)


def append_seal_to(fd: int, start: int, end: int, crc: int) -> None:
    """Append one record ``[start, end)`` through a descriptor from :func:`open_seal_appender`.

    Raises:
        OSError: the record could not be written (the seal may end in a partial record,
            which readers ignore).
    """
    write_all(fd, _RECORD.pack(start, end, crc))


def append_batch_to(fd: int, records: Sequence[tuple[int, int, int]],
                    link: ChainRecord | None) -> None:
    """Append a batch's records ``[start, end)`` and its chain record in one ``write``.

    Through a descriptor from :func:`open_seal_appender`; the same bytes as
    :func:`append_seal_to` for each record then :func:`append_chain_to`, one system call
    instead of one per record (a writer seals every flush: docs/formats.md#integrity-seals).

    Raises:
        OSError: the records could not be written (the seal may end in a partial record,
            which readers ignore, as after a torn write of one record).
    """
    write_all(fd, _batch_bytes(records, link))


def _batch_bytes(records: Sequence[tuple[int, int, int]], link: ChainRecord | None) -> bytes:
    """The seal bytes of a batch: its packed records, then its chain record's frame."""
    data = b"".join(_RECORD.pack(*record) for record in records)
    return data + link.encode() if link is not None else data


def batch_seal(rows: Sequence[Sequence[Any]], start: int, end: int, link: ChainRecord | None
               ) -> tuple[list[tuple[int, int, int]], bytes]:
    """A durable SQLite batch's seal records and the bytes that append them, in one pass.

    ``records`` are :func:`row_records` of ``rows`` (seqs ``[start, end)``), the bytes those
    :func:`append_batch_to` writes for them and ``link`` (docs/formats.md#integrity-seals,
    docs/formats.md#the-seal-chain). The accelerator builds both in one call (the records'
    texts, crcs, packing and the chain record's frame); the Python path is the reference.
    """
    if c_seal_batch is not None and type(rows) is list:
        try:
            return c_seal_batch(rows, start, end, PAGE_EVENTS,
                                link.hashed() if link is not None else None,
                                link.keys if link is not None else None)
        except CFallback:
            pass  # a row or seq the C pass leaves to the reference below
    records = row_records(rows, start, end)
    return records, _batch_bytes(records, link)


def covers(records: Sequence[tuple[int, int, int]], starts: Sequence[int], low: int,
           high: int) -> bool:
    """Whether seal records cover ``[low, high)`` without a gap (bytes or seqs).

    ``records`` are ``(start, end, crc)`` in order, ``starts`` their starts. Where no record
    covers part of a range, that part is read unverified, so a reader that skips decoding
    some of it must not (docs/rules.md#verified-page-in).
    """
    index = bisect.bisect_right(starts, low) - 1
    at = low
    while at < high:
        if index < 0 or index >= len(records) or not records[index][0] <= at < records[index][1]:
            return False
        at = records[index][1]
        index += 1
    return True


def rows_crc(rows: Sequence[Sequence[Any]]) -> int:
    """The checksum of SQLite event rows (one sealed batch).

    Rows are ``(seq, type, time, data, source_event_seqs, surface_op, ignorable)`` in seq
    order (schema 14 rows read ``ignorable`` as ``None``). The columns are joined into one
    text (metadata first, then the payloads; a BLOB as ``\\x00`` + hex) and the text's UTF-8
    bytes are checksummed with crc32. The C accelerator builds the text when it is built
    (:func:`rows_text` is the reference, tested equal).
    """
    if c_rows_text is not None and type(rows) is list:
        try:
            return crc_of(c_rows_text(rows))
        except CFallback:
            pass  # a value outside the column types a read returns: the exact join below
    return crc_of(rows_text(rows))


def span_crc(rows: Sequence[Sequence[Any]], start: int, stop: int) -> int:
    """:func:`rows_crc` of ``rows[start:stop]`` without each row's first column (a read's rowid).

    The accelerator reads the rows where they are: no copy of a row or of the range.
    """
    if c_rows_text is not None and type(rows) is list:
        try:
            return crc_of(c_rows_text(rows, start, stop, 1))
        except CFallback:
            pass  # a value outside the column types a read returns: the exact join below
    return rows_crc([row[1:] for row in rows[start:stop]])


def _payload_text(data: object) -> str:
    """The seal text of a ``data`` value that is no text: a BLOB as ``\\x00`` + hex.

    Any other value (an INTEGER or a REAL put in the column, which takes any value; no
    committed row holds one) is ``\\x01`` + its type and ``repr``: a text no committed row's
    gives, so the row is a seal mismatch named by seq (``bytes(n)`` of an integer was ``n``
    zero bytes: MemoryError for a large one; of a float, TypeError).
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        return "\x00" + bytes(data).hex()
    return f"\x01{type(data).__name__}:{data!r}"


def rows_text(rows: Sequence[Sequence[Any]]) -> bytes:
    """The text :func:`rows_crc` checksums (pure Python; the accelerator's reference)."""
    meta: list[str] = []
    payloads: list[str] = []
    for seq, etype, etime, data, sources, op, ignorable in rows:
        flag = None if ignorable is None else int(ignorable)
        src = sources.hex() if isinstance(sources, bytes) else sources
        meta.append(f"{seq}\x1f{etype}\x1f{etime}\x1f{op}\x1f{flag}\x1f{src}")
        payloads.append(data if isinstance(data, str) else _payload_text(data))
    text = "\x1e".join(meta) + "\x1d" + "\x1e".join(payloads)
    return text.encode("utf-8", "surrogatepass")


def row_records(rows: Sequence[Sequence[Any]], start: int, end: int
                ) -> list[tuple[int, int, int]]:
    """The seal records of SQLite rows of seqs ``[start, end)``: one per page they fall in.

    ``rows`` are as :func:`rows_crc` takes them, in seq order, keyed by their first seq. A
    record's range ends at a multiple of the page size (``PAGE_EVENTS`` seqs) or at ``end``,
    so a verified page-in (aligned pages) reads and checksums the rows of its own page only
    (docs/formats.md#integrity-seals, docs/rules.md#verified-page-in).
    """
    records: list[tuple[int, int, int]] = []
    lo, i, count = start, 0, len(rows)
    while i < count:
        bound = (int(rows[i][0]) // PAGE_EVENTS + 1) * PAGE_EVENTS
        j = i + 1
        while j < count and rows[j][0] < bound:
            j += 1
        hi = end if j == count else bound
        records.append((lo, hi, rows_crc(list(rows[i:j]))))
        lo, i = hi, j
    return records or [(start, end, rows_crc([]))]


def check_row_seals(rows: Sequence[Sequence[object]], seal: Seal, *, base: int,
                    describe: Callable[[], str], where: str, session_id: str) -> None:
    """Check the sealed row ranges of one session against the rows a read returned.

    Args:
        rows: Rows ``(rowid, seq, type, time, data, source_event_seqs, surface_op,
            ignorable)`` ordered by seq, starting at seq ``base``.
        seal: The session's seal (records are ``[first seq, end seq)`` of whole rows: a
            batch, or one page of a batch, :func:`row_records`).
        base: The first seq read; records starting before it are not checked.
        describe: Returns ``PRAGMA quick_check``'s answer, run only when a check fails.
        where: The database path, named in errors.
        session_id: Named in errors.

    Raises:
        LogCorruptError: a sealed batch's rows are missing (a damaged index hides them, or
            rows were deleted) or differ from what was committed; names session and seq.
    """
    index = 0
    count = len(rows)
    for start, end, crc in seal.records:
        if start < base:
            continue
        while index < count and rows[index][1] < start:  # type: ignore[operator]
            index += 1
        first = index
        while index < count and rows[index][1] < end:  # type: ignore[operator]
            index += 1
        found = span_crc(rows, first, index)
        if found == crc:
            continue
        missing = index == count and (not rows or rows[-1][1] < end - 1)  # type: ignore[operator]
        what = ("are missing: the read returned fewer rows than were committed" if missing
                else "differ from what was committed (crc32 mismatch)")
        raise LogCorruptError(
            f"corrupt session log {session_id!r} in {where}: the rows of seq {start}..{end - 1} "
            f"{what} according to the integrity seal {seal.path}; PRAGMA quick_check says: "
            f"{describe()}", path=where, session_id=session_id, seq=start)

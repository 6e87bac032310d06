"""The restore point: derived restore state tied to the exact bytes it covers.

A restore point lets a resume read only the log's tail
(docs/rules.md#restore-points-are-never-the-truth). It holds a
:class:`~dsh.session._restore_state.RestoreState` (what a restore derives from the prefix) and an
:class:`Anchor` naming the prefix it was derived from: backend, session id and incarnation, the
covered event count and byte offset (SQLite: physical rows), digests of the stored header and of the
last bytes (rows) before the cut, a digest of the integrity-seal records over the prefix, and a
sparse ``seq -> byte offset`` index for paging events in.

Invariants this module owns:

* a restore point is never the truth: a missing, unparsable, foreign-version, other-session or
  stale one is refused here or by the backend's check (:class:`RestorePointRefused`), and the
  caller does the full read, which gives the same answer; a refusal is a DEBUG log line and a
  :data:`stats` count, never an error to the user;
* it lives in a sidecar beside the log, never inside dsh's files (dsh refuses extra SQLite
  tables and extra events would change its logs); it is replaced atomically (temp file +
  rename) and, like the seals, not fsynced: a lost restore point only costs a full read;
* its body is covered by its own SHA-256, so flipped or truncated bytes are refused; and that
  digest is bound to the log: the writer records it in the integrity seal (raw JSONL, SQLite),
  and a restore point whose digest the seal never recorded is refused
  (:func:`check_bound`), so a body edited and re-digested changes no resume;
* the anchor checks are cheap on purpose (they read a few KiB, not the prefix): bytes changed
  inside the covered prefix, or a zstd log replaced by one with the same header, size and
  final bytes, pass them; :func:`check_restore_point` (``dsh verify``, a full read) reports such
  a restore point as ``misleading``.

PostgreSQL keeps its restore points in a table of the store's schema (``restore_points``, one
row a session), so every host resumes through them; its anchor is checked the way SQLite's is
(incarnation, header, the last row before the cut, no packed row across the cut).
"""

from __future__ import annotations

import binascii
import hashlib
import logging
import os
import re
import sys
import zlib
from array import array
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import accumulate, chain
from operator import lt
from pathlib import Path
from typing import Any, Final, Protocol, overload, runtime_checkable

import orjson

from dsh._caches import keep_recent
from dsh._errors import LogCorruptError, PersistenceError, restore_point_mismatch
from dsh.json import MAX_SAFE_INTEGER, dumps
from dsh.persistence._paths import open_sidecar, replace_file
from dsh.persistence._seal import restore_point_mark
from dsh.session import Event, NodeSeqs, RestoreFold, RestoreState, TailedPack

__all__ = [
    "RESTORE_POINT_EVERY_BYTES",
    "RESTORE_POINT_EVERY_EVENTS",
    "RESTORE_POINT_FORMAT",
    "INDEX_EVERY_BYTES",
    "INDEX_EVERY_EVENTS",
    "INDEX_PACKED_MIN",
    "Anchor",
    "RestorePoint",
    "RestorePointCheck",
    "RestorePointRefused",
    "KeepsRestorePoints",
    "OpensAtRestorePoint",
    "PageIndex",
    "check_bound",
    "check_restore_point",
    "decode_restore_point",
    "digest",
    "encode_restore_point",
    "note_refusal",
    "body_digest",
    "read_restore_point_file",
    "replace_sidecar",
    "stats",
    "write_restore_point_file",
]

logger = logging.getLogger(__name__)

RESTORE_POINT_FORMAT: Final = 3
"""Version of the restore point file layout and of the restore state it carries: 2 adds the
state's ``lastTurn``, 3 its ``oldMarks``; a state that does not know them is written as format
1 or 2, which are still read (docs/formats.md#restore-points); a writer's resume does not use
one of format 1 or 2 (:func:`dsh.persistence._resume.resume`)."""

_FORMATS: Final = (1, 2, RESTORE_POINT_FORMAT)
"""The formats :func:`decode_restore_point` reads."""

LIBRARY_TAG: Final = "dsh-python/0.1"
"""The writer; a restore point written by another tag is refused (its derivation may differ)."""

RESTORE_POINT_EVERY_EVENTS = 2048
"""A restore point is written at the first flush at least this many events after the last one."""

RESTORE_POINT_EVERY_BYTES = 2 * 1024 * 1024
"""... or at least this many log bytes after it (whichever comes first)."""

INDEX_EVERY_EVENTS = 256
"""The page-in index gets an entry at a batch start at least this many events after the last."""

INDEX_EVERY_BYTES = 256 * 1024
"""... or at least this many bytes after it."""

INDEX_PACKED_MIN = 64
"""An index of at least this many entries is stored packed (``"zi:"``, :class:`PageIndex`)."""

DIGEST_TAIL_BYTES: Final = 4096
"""How many bytes before the cut the tail digest covers (JSONL)."""

_MAGIC: Final = b"DSHCKPT1 "

stats: Counter[str] = Counter()
"""Process-wide counts: ``written``, ``used``, ``refused`` and ``refused:<reason>`` (tests)."""


class RestorePointRefused(Exception):
    """The restore point cannot be used; ``reason`` says why (the caller reads in full).

    ``error`` is set when the refusal is damage worth a warning, not staleness: a restore point
    whose digest the integrity seal never recorded (``unbound``: edited and re-digested) is a
    :class:`LogCorruptError` naming the file and the seq it claims to cover.
    """

    def __init__(self, reason: str, error: LogCorruptError | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error


def note_refusal(session_id: str, reason: str, error: LogCorruptError | None = None, *,
                 instead: str = "reading the whole log") -> None:
    """Count and log a refused restore point of ``session_id`` (DEBUG; WARNING with ``error``).

    ``instead`` says what is read in its place, after ``error``'s message (which is prefixed
    with the session unless it names it already).
    """
    stats["refused"] += 1
    stats[f"refused:{reason.split(':')[0]}"] += 1
    if error is not None:
        if error.where.get("session_id") == session_id:
            logger.warning("%s; %s", error.message, instead)
        else:
            logger.warning("session %s: %s; %s", session_id, error.message, instead)
        return
    logger.debug("session %s: restore point not used (%s); reading the whole log", session_id,
                 reason)


def check_bound(restore_point: RestorePoint, recorded: Sequence[bytes], *, where: str,
                seal_path: str, required: bool = False) -> None:
    """Refuse a restore point whose digest the integrity seal did not record.

    Rule: docs/rules.md#restore-points-are-never-the-truth. ``recorded`` are the seal's
    restore point records (:attr:`~dsh.persistence._seal.Seal.restore_points`), or what the
    backend keeps in its place (Zstandard JSONL: the restore point's seal file; PostgreSQL:
    the session row's ``restore_point_digest``). A seal that records none was written before
    restore points were bound (or rebuilt by ``dsh verify --reseal``): the restore point is then
    checked by its own digest and anchor only, unless the backend ``required`` a record (it
    always writes one): then it is refused (``unrecorded``, no error: a crash or an older
    writer, not proof of an edit) and the log read in full.

    Raises:
        RestorePointRefused: ``unbound``, with a :class:`LogCorruptError` (code
            ``RESTORE_POINT_FORGED``) naming ``where`` and the first seq after the covered
            prefix; ``unrecorded`` when ``required`` and nothing is recorded.
    """
    if not recorded and required:
        raise RestorePointRefused("unrecorded")
    if not recorded or restore_point_mark(restore_point.digest) in recorded:
        return
    count = restore_point.anchor.event_count
    raise RestorePointRefused("unbound", LogCorruptError(
        f"restore point {where} (covering seqs 0..{count - 1}) has a digest its integrity seal "
        f"{seal_path} never recorded: it was edited after it was written, so a resume ignores it",
        code="RESTORE_POINT_FORGED", path=where, seq=count))


def digest(data: bytes) -> str:
    """The hex SHA-256 of ``data`` (the digest every anchor field uses)."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class Anchor:
    """What ties a restore point to the stored prefix it was derived from.

    Attributes:
        backend: ``"jsonl"``, ``"jsonl-zstd"``, ``"sqlite"`` or ``"postgresql"``.
        session_id: The session.
        incarnation: The stored log's identity (JSONL: the header digest; SQLite: the
            session's incarnation column).
        event_count: Events covered (seqs ``0 .. event_count - 1``).
        byte_offset: JSONL: file bytes covered (a batch boundary); SQLite: physical rows.
        header_digest: Digest of the stored header (JSONL: the header line or frame).
        tail_digest: Digest of the last bytes (rows) before the cut.
        seal_digest: Digest of the integrity-seal records over the prefix ("" when none).
        index: ``(seq, byte offset)`` of record starts, ascending, first ``(0, header end)``
            (read back from a restore point: a :class:`PageIndex`, inflated at first need).
    """

    backend: str
    session_id: str
    incarnation: str
    event_count: int
    byte_offset: int
    header_digest: str
    tail_digest: str
    seal_digest: str
    index: Sequence[tuple[int, int]] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class RestorePoint:
    """An anchor and the restore state of the prefix it names.

    ``digest`` is the hex SHA-256 of the stored body ("" before it is encoded); the seal
    records its first 12 bytes (:func:`check_bound`).
    """

    anchor: Anchor
    state: RestoreState
    digest: str = ""


@runtime_checkable
class KeepsRestorePoints(Protocol):
    """A handle whose backend keeps restore points (JSONL, SQLite, PostgreSQL)."""

    @property
    def durable_bytes(self) -> int:
        """Log bytes made durable through the handle (0 when the backend counts none)."""
        ...

    def restore_point_anchor(self) -> Anchor | None:
        """The anchor of the durable prefix, or None when none can be given now."""
        ...

    def restore_point_where(self) -> str:
        """Where the restore point is kept, for messages (a sidecar path, a table row)."""
        ...

    def write_restore_point(self, data: bytes) -> None:
        """Replace the sidecar with ``data`` atomically (``OSError`` on failure)."""
        ...

    def read_from_restore_point(self) -> tuple[RestorePoint, Any, Any]:
        """``(restore point, tail ColdRead, EventSource)``, or raise :class:`RestorePointRefused`.

        Only the tail after the cut is read, whatever the surface's spread: a resume pages no
        event in (docs/rules.md#restore-points-are-never-the-truth).
        """
        ...


@runtime_checkable
class OpensAtRestorePoint(Protocol):
    """A backend that reads a session's restore point with the lookup of a read open (PostgreSQL).

    ``open_at_restore_point(session_id)`` is ``open(session_id, "read")`` whose handle's first
    ``read_from_restore_point`` needs one round trip less: the restore point came with the
    lookup, and is checked unchanged in the snapshot of the rows read through it. The lookup
    also reads the head of each aside ``aside_heads`` names (its bytes up to and including
    the first newline, ``b""`` when it has none; docs/stores.md#asides), which the handle
    keeps in its ``aside_heads`` mapping (name -> bytes, or None when no such aside is kept).
    """

    def open_at_restore_point(self, session_id: str, *, aside_heads: Sequence[str] = ()
                              ) -> Any:
        """A read handle (raises as ``open`` does)."""
        ...

_INDEX_PREFIX: Final = "zi:"


class PageIndex(Sequence[tuple[int, int]]):
    """A page-in index read from a restore point, kept packed until an inner entry is asked for.

    ``(seq, byte offset)`` pairs, both strictly ascending (docs/formats.md#restore-points,
    ``"zi:"``). Its length, its first and last entries and the entries appended since are read
    without inflating anything, so a resume costs the same at 100k and 1M events; the first
    read of another entry inflates the rest once. Built from pairs, it holds them as they are.
    A writer resumed through it appends to a :meth:`copy`. Rule:
    docs/rules.md#restore-points-are-never-the-truth.

    Raises:
        LogCorruptError: ``RESTORE_POINT_MISMATCH`` from the read that inflates entries that are
            not what the restore point claimed (count, order, first or last entry).
    """

    __slots__ = ("_count", "_first", "_last", "_more", "_origin", "_packed", "_pairs")

    def __init__(self, pairs: Sequence[tuple[int, int]] = ()) -> None:
        self._pairs: list[tuple[int, int]] | None = list(pairs)
        self._packed = b""
        self._count = len(self._pairs)
        self._first = self._last = (0, 0)
        self._more: list[tuple[int, int]] = []
        self._origin = ("", "")

    @classmethod
    def unpack(cls, text: str, *, session_id: str = "", where: str = "") -> PageIndex:
        """The index :meth:`pack` wrote, checked by its counts and ends, not inflated.

        ``session_id`` and ``where`` (where its restore point is kept) are named by the
        ``RESTORE_POINT_MISMATCH`` of an inflation that fails.

        Raises:
            ValueError: not ``zi:<count>:<first seq>:<first offset>:<last seq>:<last
                offset>:<base64>``, ends out of order, or a number beyond 2**53 - 1.
        """
        parts = text.split(":", 6)
        if len(parts) != 7 or parts[0] != _INDEX_PREFIX[:-1] \
                or not all(part.isascii() and part.isdigit() for part in parts[1:6]):
            raise ValueError("not a packed page-in index")
        count, first_seq, first_offset, last_seq, last_offset = map(int, parts[1:6])
        if max(count, last_seq, last_offset) > MAX_SAFE_INTEGER:  # (any int field's bound)
            raise ValueError("packed page-in index claims numbers beyond 2**53 - 1")
        if count < 1 or (count == 1) != ((first_seq, first_offset) == (last_seq, last_offset)) \
                or first_seq > last_seq - count + 1 or first_offset > last_offset - count + 1:
            raise ValueError("packed page-in index ends out of order")
        try:
            packed = binascii.a2b_base64(parts[6], strict_mode=True)
        except binascii.Error as exc:
            raise ValueError(f"packed page-in index does not decode ({exc})") from None
        index = cls.__new__(cls)
        index._pairs, index._packed, index._count = None, packed, count
        index._first, index._last = (first_seq, first_offset), (last_seq, last_offset)
        index._more = []
        index._origin = (session_id, where)
        return index

    def pack(self) -> str:
        """``"zi:"`` + counts, ends and base64 of the zlib'd int64 differences of the pairs.

        An index read by :meth:`unpack` with nothing appended gives back the very text.
        """
        if self._pairs is None and not self._more:
            return (f"{_INDEX_PREFIX}{self._count}:{self._first[0]}:{self._first[1]}:"
                    f"{self._last[0]}:{self._last[1]}:"
                    + binascii.b2a_base64(self._packed, newline=False).decode("ascii"))
        pairs = self._all()
        flat = array("q", chain.from_iterable(pairs))
        differences = array("q", flat[:2])
        differences.extend(a - b for a, b in zip(flat[2:], flat, strict=False))
        if sys.byteorder == "big":
            differences.byteswap()
        packed = zlib.compress(differences.tobytes(), 1)
        return (f"{_INDEX_PREFIX}{len(pairs)}:{pairs[0][0]}:{pairs[0][1]}:{pairs[-1][0]}:"
                f"{pairs[-1][1]}:" + binascii.b2a_base64(packed, newline=False).decode("ascii"))

    def copy(self) -> PageIndex:
        """An index with the same entries to append to (the packed bytes shared)."""
        index = PageIndex.__new__(PageIndex)
        index._pairs = None if self._pairs is None else list(self._pairs)
        index._packed, index._count = self._packed, self._count
        index._first, index._last = self._first, self._last
        index._more = list(self._more)
        index._origin = self._origin
        return index

    @property
    def inflated(self) -> bool:
        """Whether every entry is held as pairs now."""
        return self._pairs is not None

    def append(self, pair: tuple[int, int]) -> None:
        """Add an entry after the last (the caller keeps both columns ascending)."""
        if self._pairs is not None:
            self._pairs.append(pair)
        else:
            self._more.append(pair)

    def _all(self) -> list[tuple[int, int]]:
        """Every entry as pairs (inflated the first time)."""
        if self._pairs is None:
            self._pairs = self._inflate() + self._more
            self._more = []
        return self._pairs

    def _inflate(self) -> list[tuple[int, int]]:
        count = self._count
        try:
            decompressor = zlib.decompressobj()
            raw = decompressor.decompress(self._packed, 16 * count + 1)
            if len(raw) != 16 * count or not decompressor.eof or decompressor.unconsumed_tail:
                raise ValueError(f"it does not hold {count} entries")
        except (ValueError, zlib.error) as exc:
            raise self._mismatch(str(exc)) from None
        differences = array("q", raw)
        if sys.byteorder == "big":
            differences.byteswap()
        if min(differences[:2]) < 0 or (count > 1 and min(differences[2:]) <= 0):
            raise self._mismatch("its entries do not rise")
        pairs = list(zip(accumulate(differences[0::2]), accumulate(differences[1::2]),
                         strict=True))
        if pairs[0] != self._first or pairs[-1] != self._last:
            raise self._mismatch("its ends are not the ones it names")
        return pairs

    def _mismatch(self, why: str) -> LogCorruptError:
        session_id, where = self._origin
        return restore_point_mismatch("page-in index", why, session_id=session_id, where=where)

    def __len__(self) -> int:
        return self._count + len(self._more) if self._pairs is None else len(self._pairs)

    @overload
    def __getitem__(self, index: int) -> tuple[int, int]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[int, int]]: ...

    def __getitem__(self, index: int | slice) -> tuple[int, int] | list[tuple[int, int]]:
        if self._pairs is None and not isinstance(index, slice):
            position = index + len(self) if index < 0 else index
            if position == 0:
                return self._first
            if position == self._count - 1:
                return self._last
            if self._count <= position < len(self):
                return self._more[position - self._count]
        return self._all()[index]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PageIndex | list | tuple):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # appended to

    def __repr__(self) -> str:
        return f"PageIndex({self._all()!r})"


PACKED_NODES_MIN: Final = 4096
"""A state with at least this many surface nodes stores them packed (see :func:`_packed_state`)."""

TAILED_NODES: Final = 256
"""How many of the last surface nodes a packed state stores as plain seqs (``"zt:"``)."""

_PACKED_PREFIX: Final = "zd:"
_NARROW_PREFIX: Final = "zb:"  # one-byte differences: written before "zt:", still read
_PACKED_SEQS_PREFIX: Final = "zn:"  # the seqs themselves, as written before: still read
_TAILED_PREFIX: Final = "zt:"  # the head packed ("zb:"/"zd:" bytes), the tail as seqs
_TAILED_HEAD: Final = re.compile(r"[0-9]+:(?:-1|[0-9]+)")
"""A ``"zt:"`` text's head count and head max (``-1``: no head), ASCII digits."""


def _packed_state(state: RestoreState) -> dict[str, Any]:
    """The state's wire form, its node seqs packed when there are many.

    Packed, ``nodes`` is ``"zt:<b|d>:<head count>:<head max>:<tail>:<head>"``
    (:meth:`~dsh.session.NodeSeqs.pack_tailed`, docs/formats.md#restore-points): the last
    :data:`TAILED_NODES` seqs as decimal ints, and base64 of the seqs before them as
    :meth:`~dsh.session.NodeSeqs.pack_best` packs them, zlib'd differences (the first from 0)
    a byte each (``b``) when every one lies in 0 .. 255, else int64s (``d``). A surface's seqs
    mostly rise by a few, so an uncompacted 1M-event msg session's 364k nodes (2.9 MB as
    int64s) pack to a few KB; a resume reads the tail and inflates the head only when a seq
    before the tail is first read (:class:`~dsh.session.LazyNodes`), and a state read back
    packs to the same parts without work.
    """
    wire = state.to_wire(nodes=False)
    nodes = state.nodes
    if len(nodes) >= PACKED_NODES_MIN:
        head_count, head_max, narrow, tail, packed = nodes.pack_tailed(TAILED_NODES)
        wire["nodes"] = (f"{_TAILED_PREFIX}{'b' if narrow else 'd'}:{head_count}:{head_max}:"
                         f"{','.join(map(str, tail))}:"
                         + binascii.b2a_base64(packed, newline=False).decode("ascii"))
    else:
        wire["nodes"] = list(nodes)
    return wire


def _tailed_nodes(text: str, count: int, origin: tuple[str, str]) -> NodeSeqs:
    """``"zt:"`` nodes (see :func:`_packed_state`), the head kept packed and not inflated.

    Raises:
        ValueError: not ``zt:<b|d>:<head count>:<head max>:<tail seqs>:<base64>``, or a count
            or seq out of range (:meth:`~dsh.session.NodeSeqs.unpack_tailed`).
    """
    parts = text.split(":", 5)
    if len(parts) != 6 or parts[1] not in ("b", "d"):
        raise ValueError("restore state field nodes is not a tailed node list")
    tail_text = parts[4]
    try:
        # one parse of the 256 tail seqs, then their text must be exactly theirs: ints
        # written as str() writes them, joined by commas (a check and an int() per seq cost
        # 0.1 ms a read). That text check lets a minus sign through ("-1"): a negative seq
        # is refused by unpack_tailed's range check, not here
        tail = orjson.loads(f"[{tail_text}]")
    except orjson.JSONDecodeError:
        raise ValueError("restore state field nodes is not a tailed node list") from None
    if _TAILED_HEAD.fullmatch(f"{parts[2]}:{parts[3]}") is None \
            or (tail and set(map(type, tail)) != {int}) or ",".join(map(str, tail)) != tail_text:
        raise ValueError("restore state field nodes is not a tailed node list")
    try:
        data = binascii.a2b_base64(parts[5], strict_mode=True)
    except binascii.Error as exc:
        raise ValueError(f"restore state field nodes does not decode ({exc})") from None
    return NodeSeqs.unpack_tailed(TailedPack(int(parts[2]), int(parts[3]), parts[1] == "b",
                                             tuple(tail), data), count, session_id=origin[0],
                                  where=origin[1])


def _unpacked_nodes(value: object, origin: tuple[str, str]) -> NodeSeqs | None:
    """The packed ``nodes`` of a wire state (see :func:`_packed_state`), still packed.

    None when ``value`` holds no packed nodes (the plain list is checked by ``from_wire``).
    ``"zt:"`` is read without inflating its head; the forms written before it, ``"zb:"``
    (one-byte differences of every seq), ``"zd:"`` (int64 differences) and ``"zn:"`` (the
    zlib'd seqs themselves), are inflated and checked here.

    Raises:
        ValueError: packed nodes that do not decode to at most ``eventCount`` seqs below it.
    """
    if not isinstance(value, dict) or not isinstance(value.get("nodes"), str):
        return None
    text = value["nodes"]
    count = value.get("eventCount")
    prefix = text[:len(_PACKED_PREFIX)]
    if prefix not in (_TAILED_PREFIX, _NARROW_PREFIX, _PACKED_PREFIX, _PACKED_SEQS_PREFIX) \
            or type(count) is not int:
        raise ValueError("restore state field nodes is not a packed node list")
    if prefix == _TAILED_PREFIX:
        return _tailed_nodes(text, count, origin)
    try:
        # strict: the alphabet checked in C (b64decode's validate runs a regular expression)
        data = binascii.a2b_base64(text[len(_PACKED_PREFIX):], strict_mode=True)
        if prefix == _NARROW_PREFIX:
            return NodeSeqs.unpack_narrow(data, count)
        if prefix == _PACKED_PREFIX:
            return NodeSeqs.unpack(data, count)
        decompressor = zlib.decompressobj()
        raw = decompressor.decompress(data, 8 * count + 8)
        if len(raw) > 8 * count or decompressor.unconsumed_tail or not decompressor.eof:
            raise ValueError("restore state field nodes holds more seqs than events")
        return NodeSeqs.from_little_endian(raw)  # its range: checked by from_wire
    except (binascii.Error, zlib.error) as exc:
        raise ValueError(f"restore state field nodes does not decode ({exc})") from None


def encode_restore_point(restore_point: RestorePoint) -> bytes:
    """Return the sidecar bytes: magic, the body's SHA-256, newline, the JSON body.

    The body is format 3 when the state knows its ``lastTurn`` and its ``oldMarks``, format 2
    when it knows only the first, else format 1 (a writer continuing from a format 1 restore
    point before its next ``turn/start``).
    """
    anchor = restore_point.anchor
    state = restore_point.state
    body = dumps({
        "format": (1 if state.last_turn is None else 2 if state.old_marks is None
                   else RESTORE_POINT_FORMAT),
        "library": LIBRARY_TAG, "backend": anchor.backend,
        "sessionId": anchor.session_id, "incarnation": anchor.incarnation,
        "eventCount": anchor.event_count, "byteOffset": anchor.byte_offset,
        "headerDigest": anchor.header_digest, "tailDigest": anchor.tail_digest,
        "sealDigest": anchor.seal_digest, "index": _stored_index(anchor.index),
        "state": _packed_state(restore_point.state),
    })
    return _MAGIC + digest(body).encode() + b"\n" + body


def _stored_index(index: Sequence[tuple[int, int]]) -> str | list[list[int]]:
    """The body's ``index``: packed (:meth:`PageIndex.pack`) from :data:`INDEX_PACKED_MIN` on."""
    if len(index) >= INDEX_PACKED_MIN:
        return (index if isinstance(index, PageIndex) else PageIndex(index)).pack()
    return [list(pair) for pair in index]


def _field(body: dict[str, Any], key: str, kind: type) -> Any:
    value: Any = body.get(key)
    if type(value) is not kind or (type(value) is int and not 0 <= value <= MAX_SAFE_INTEGER):
        raise RestorePointRefused(f"bad-field:{key}")
    return value


_DECODED_KEPT: Final = 4
"""Restore points whose decode is kept, by (backend, session, where)
(see :func:`decode_restore_point`)."""

_decoded: dict[tuple[str, str, str], tuple[bytes, RestorePoint]] = {}


def decode_restore_point(data: bytes, *, session_id: str, backend: str,
                         where: str = "") -> RestorePoint:
    """Parse and check sidecar bytes written by :func:`encode_restore_point`.

    ``where`` says where the bytes are kept (a sidecar path, a table row: the backend's
    ``restore_point_where()``); a ``RESTORE_POINT_MISMATCH`` found later, when its packed
    surface or page-in index is inflated, names it and ``session_id``.

    The same bytes decode to the same (immutable) restore point, so the last decode of each
    of a few sessions is kept: an adapter's first write resumes through the restore point its
    read decoded a moment before (its node list grows with the surface: 40,000 seqs at 100k
    items), and the write's checks against the log (``_load_tail``) still all run.

    Raises:
        RestorePointRefused: damaged (digest), unparsable, another format or library version,
            another session or backend, or a field of the wrong shape.
    """
    key = (backend, session_id, where)
    kept = _decoded.get(key)
    if kept is not None and kept[0] == data:
        return kept[1]
    restore_point = _decode(data, session_id=session_id, backend=backend, where=where)
    keep_recent(_decoded, key, (data, restore_point), _DECODED_KEPT)
    return restore_point


def _decode(data: bytes, *, session_id: str, backend: str, where: str) -> RestorePoint:
    head, nl, body_bytes = data.partition(b"\n")
    if not nl or not head.startswith(_MAGIC):
        raise RestorePointRefused("not-a-restore-point")
    body_digest = digest(body_bytes)
    if head[len(_MAGIC):] != body_digest.encode():
        raise RestorePointRefused("digest")
    try:
        # plain containers at once (the digest already vouched for the bytes); the state's
        # header maps are snapshotted by RestoreState.from_wire
        body = orjson.loads(body_bytes)
    except orjson.JSONDecodeError:
        raise RestorePointRefused("unparsable") from None
    if not isinstance(body, dict):
        raise RestorePointRefused("unparsable")
    version = body.get("format")
    if type(version) is not int or version not in _FORMATS or body.get("library") != LIBRARY_TAG:
        raise RestorePointRefused("version")
    if body.get("sessionId") != session_id:
        raise RestorePointRefused("other-session")
    if body.get("backend") != backend:
        raise RestorePointRefused("other-backend")
    index = _index(body.get("index"), (session_id, where))
    try:
        wire_state = body.get("state")
        nodes = _unpacked_nodes(wire_state, (session_id, where))
        state = RestoreState.from_wire(wire_state, decoded_nodes=nodes, last_turn=version >= 2,
                                       old_marks=version >= 3)
    except ValueError:
        raise RestorePointRefused("bad-field:state") from None
    anchor = Anchor(backend=backend, session_id=session_id,
                    incarnation=_field(body, "incarnation", str),
                    event_count=_field(body, "eventCount", int),
                    byte_offset=_field(body, "byteOffset", int),
                    header_digest=_field(body, "headerDigest", str),
                    tail_digest=_field(body, "tailDigest", str),
                    seal_digest=_field(body, "sealDigest", str), index=index)
    if anchor.event_count != state.event_count:
        raise RestorePointRefused("bad-field:eventCount")
    return RestorePoint(anchor=anchor, state=state, digest=body_digest)


def _index(raw: object, origin: tuple[str, str] = ("", "")) -> Sequence[tuple[int, int]]:
    """The page-in index of a body: ``[seq, offset]`` pairs, both strictly ascending.

    Packed (``"zi:"``): a :class:`PageIndex` checked by its count and ends, inflated at first
    need. Listed (written before ``"zi:"``, and below :data:`INDEX_PACKED_MIN` entries):
    checked with C-speed builtins, in no per-pair Python code.

    Raises:
        RestorePointRefused: ``bad-field:index``.
    """
    if isinstance(raw, str):
        try:
            return PageIndex.unpack(raw, session_id=origin[0], where=origin[1])
        except ValueError:
            raise RestorePointRefused("bad-field:index") from None
    if not isinstance(raw, list) or (raw and (
            set(map(type, raw)) != {list} or set(map(len, raw)) != {2})):
        raise RestorePointRefused("bad-field:index")
    flat = list(chain.from_iterable(raw))
    if flat and (set(map(type, flat)) != {int} or min(flat) < 0
                 or max(flat) > MAX_SAFE_INTEGER):  # (any int field's bound, as "zi:")
        raise RestorePointRefused("bad-field:index")
    seqs, offsets = flat[0::2], flat[1::2]
    if not all(map(lt, seqs, seqs[1:])) or not all(map(lt, offsets, offsets[1:])):
        raise RestorePointRefused("bad-field:index")
    return tuple(zip(seqs, offsets, strict=True))


def body_digest(data: bytes) -> str:
    """The hex SHA-256 of the body of sidecar bytes from :func:`encode_restore_point`."""
    return data.partition(b"\n")[0][len(_MAGIC):].decode("ascii")


def read_restore_point_file(path: Path) -> bytes:
    """Return the sidecar's bytes.

    Raises:
        RestorePointRefused: ``absent`` (no file) or ``unreadable`` (not a regular file, I/O).
    """
    try:
        fd = open_sidecar(path, "restore points")
    except FileNotFoundError:
        raise RestorePointRefused("absent") from None
    except (OSError, PersistenceError):  # a symlinked file or folder too: never followed
        raise RestorePointRefused("unreadable") from None
    try:
        with os.fdopen(fd, "rb") as f:
            return f.read()
    except OSError:
        raise RestorePointRefused("unreadable") from None


def write_restore_point_file(path: Path, data: bytes) -> None:
    """Replace the sidecar atomically (temp file + rename, no fsync).

    A restore point lost or torn by a power cut fails its digest, and the resume reads the log
    in full.
    Only the session's single writer calls this, so any other temp file of this sidecar was
    left by a writer killed between write and rename: it is removed. A failed write removes
    its own temp file.

    Raises:
        OSError: it could not be written (the old restore point stays; it is only derived).
    """
    replace_sidecar(path, data)
    stats["written"] += 1


def replace_sidecar(path: Path, data: bytes) -> None:
    """Replace the derived sidecar ``path`` with ``data`` (temp file + rename, no fsync).

    Stale temp files of the same sidecar (a writer killed between write and rename) are
    removed; a failed write removes its own.

    Raises:
        OSError: it could not be written (the old file stays).
    """
    from glob import escape as glob_escape  # (glob loads when a sidecar is replaced)

    for stale in path.parent.glob(f".{glob_escape(path.name)}.*.tmp"):
        stale.unlink(missing_ok=True)
    replace_file(path, data)


@dataclass(frozen=True, slots=True, kw_only=True)
class RestorePointCheck:
    """What ``dsh verify`` found of one session's restore point.

    Attributes:
        status: ``"absent"`` (none, or the backend keeps none), ``"consistent"`` (it matches
            the full read exactly), ``"ignored"`` (a resume would not use it), or
            ``"misleading"`` (a resume's cheap checks accept it, yet it does not match the
            full read: the log was changed inside the prefix it covers, or replaced by one
            whose header, size and final bytes are the same; ``dsh verify`` reports it as a
            violation, and deleting the file makes resumes read the whole log), or
            ``"forged"`` (its digest is not one the integrity seal recorded: it was edited and
            re-digested; a resume ignores it, ``dsh verify`` reports a violation).
        event_count: Events it covers (0 when absent or unreadable).
        message: One sentence for the user (what was found, what a resume does).
    """

    status: str
    event_count: int
    message: str


def check_restore_point(handle: KeepsRestorePoints | None, events: Sequence[Event],
                        inherited: int) -> RestorePointCheck:
    """Check a session's restore point against its full read: anchor, state, tail and every page.

    Args:
        handle: An open handle of the session when its backend keeps restore points
            (``Capabilities.restore_points``), else None (the verdict is "absent").
        events: The stored events of a full read (before any repair closers).
        inherited: The header's ``seedLength`` or 0.

    Returns:
        The verdict; never raises for a bad restore point (it is derived data, not the log).
    """
    if handle is None:
        return RestorePointCheck(status="absent", event_count=0,
                               message="this backend keeps no restore points")
    try:
        restore_point, cold, source = handle.read_from_restore_point()
    except RestorePointRefused as exc:
        if exc.error is not None:
            return RestorePointCheck(status="forged", event_count=0,
                                     message=f"{exc.error.message} and reads the whole log; "
                                             f"delete {handle.restore_point_where()} (the next "
                                             "due flush writes a new one)")
        if exc.reason == "absent":
            return RestorePointCheck(status="absent", event_count=0,
                                   message="no restore point; a resume reads the whole "
                                           "log (it is written at the next flush that is due)")
        return RestorePointCheck(status="ignored", event_count=0, message=_ignored(exc.reason))
    count = restore_point.state.event_count
    fold = RestoreFold(inherited)
    fold.feed(events[:count])
    derived = fold.state()
    if restore_point.state.last_turn is None:  # a format 1 state does not carry it
        derived = replace(derived, last_turn=None)
    if restore_point.state.old_marks is None:  # nor does a format 1 or 2 state carry these
        derived = replace(derived, old_marks=None)
    problem = None
    if tuple(cold.events) != tuple(events[count:]):
        problem = "its tail differs from the log's"
    elif derived != restore_point.state:
        problem = "its restore state differs from the one the log derives"
    else:
        for start in range(0, count, 4096):
            if tuple(source.read(start, min(count, start + 4096))) != tuple(
                    events[start:min(count, start + 4096)]):
                problem = f"events paged in from seq {start} differ from the log's"
                break
    if problem is not None:
        # read_from_restore_point accepted it: a resume would use it, and see another session.
        return RestorePointCheck(
            status="misleading", event_count=count,
            message=f"the restore point passes a resume's checks but does not match "
                    f"the log ({problem}): the log changed inside the {count} events it "
                    f"covers, so a resume would not see the stored log; delete "
                    f"{handle.restore_point_where()} and the next resume reads the whole log")
    return RestorePointCheck(status="consistent", event_count=count,
                           message=f"restore point covers {count} events and matches "
                                   "the full read; a resume reads only the events after it")


def _ignored(reason: str) -> str:
    return (f"warning: the restore point does not match the log ({reason}); a resume "
            "ignores it and reads the whole log, so nothing is lost (the next due flush "
            "replaces it)")

"""The surface: the ordered seqs of message events the model currently sees.

Invariants this module owns (docs/rules.md#the-surface, docs/rules.md#resume):

* only surface-eligible events (``user/message``, ``assistant/message``, ``tool/result``,
  ``system/message``) carry ``surfaceOp``/``sourceEventSeqs``, and they must carry ``surfaceOp``;
* an ``"append"`` pushes the event's seq; a replace splices out an inclusive range of *current*
  surface positions and puts the event's seq at the range's start position;
* a replace cites every node it shadows in ``sourceEventSeqs``; a ``tool/result`` replace rewrites
  exactly one ``tool/result`` and changes only its result content; a replace covering node 0 while
  node 0 is a ``system/message`` must itself be a ``system/message`` covering exactly that node;
* planning never changes state, so a refused event leaves no trace; ``replace_generation`` counts
  committed replacements.
"""

from __future__ import annotations

import sys
import zlib
from array import array
from collections.abc import Iterable, Iterator, MutableSequence, Sequence
from itertools import accumulate, chain, islice, starmap
from operator import eq, sub
from typing import Any, Final, NamedTuple, overload

from dsh._errors import EventRejectedError, restore_point_mismatch
from dsh.json import (
    MAX_SAFE_INTEGER,
    FrozenDict,
    c_running_sums_below,
    c_seqs_below,
    c_widen_sums_below,
    json_equal,
)
from dsh.session._events import SURFACE_EVENT_TYPES, Event

_MISSING: Final = object()


class SurfacePlan(NamedTuple):
    """How one validated event changes the surface.

    Attributes:
        seq: The event's seq (the node it adds).
        start_index: Surface position where a replace starts, or -1 for an append.
        end_index: Surface position where a replace ends (inclusive), or -1 for an append.
    """

    seq: int
    start_index: int
    end_index: int


class SurfaceReplacement(NamedTuple):
    """One committed replace, as :func:`fold_surface` reports it.

    Attributes:
        seq: The replacing event's seq.
        start: The declared ``surfaceOp.start`` seq.
        end: The declared ``surfaceOp.end`` seq.
        shadowed_seqs: The nodes actually removed, in surface order.
    """

    seq: int
    start: int
    end: int
    shadowed_seqs: tuple[int, ...]


class TailedPack(NamedTuple):
    """Node seqs as :meth:`NodeSeqs.pack_tailed` splits them (docs/formats.md#restore-points).

    Attributes:
        head_count: How many seqs the head holds (those before the tail).
        head_max: The head's largest seq (-1 without a head).
        narrow: ``packed`` holds one-byte differences (else int64 ones, as :meth:`NodeSeqs.pack`).
        tail: The last seqs, in surface order.
        packed: The head, zlib'd differences (the first from 0).
    """

    head_count: int
    head_max: int
    narrow: bool
    tail: tuple[int, ...]
    packed: bytes


class SurfaceFold(NamedTuple):
    """The result of a full replay: final nodes and every replacement in event order."""

    nodes: list[int]
    replacements: list[SurfaceReplacement]


def _same_seqs(a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether two runs of seqs are equal element for element (a list and an array too)."""
    if type(a) is type(b):
        return a == b
    return len(a) == len(b) and all(starmap(eq, zip(a, b, strict=True)))


def seqs_below(seqs: array[int], bound: int) -> bool:
    """Whether every seq of an int64 array lies in ``0 .. bound - 1`` (in C when it is built)."""
    if c_seqs_below is not None:
        return bool(c_seqs_below(seqs, bound))
    # the pure-Python reference: one pass, as unsigned (a negative seq reads as >= 2**63)
    return not seqs or max(memoryview(seqs).cast("B").cast("Q")) < bound


def running_sums_below(seqs: array[int], bound: int) -> bool:
    """Turn an int64 array of differences into their running sums, in place (in C when built).

    Returns:
        Whether every sum lies in ``0 .. bound - 1``; on False the array is left part summed
        (the caller drops it).
    """
    if c_running_sums_below is not None:
        return bool(c_running_sums_below(seqs, bound))
    sums = list(accumulate(seqs))  # the pure-Python reference
    if sums and (min(sums) < 0 or max(sums) >= bound):
        return False
    seqs[:] = array("q", sums)
    return True


def widen_sums_below(seqs: array[int], differences: bytes, bound: int) -> bool:
    """Fill the int64 array ``seqs`` with the running sums of one-byte ``differences``.

    ``seqs`` holds one int64 for each difference (its contents are overwritten); in C when it
    is built.

    Returns:
        Whether every sum lies in ``0 .. bound - 1``; on False ``seqs`` is left part filled
        (the caller drops it).
    """
    if c_widen_sums_below is not None:
        return bool(c_widen_sums_below(seqs, differences, bound))
    # the pure-Python reference: each byte into the low byte of a zeroed int64, then summed
    if len(seqs) != len(differences):
        raise ValueError("one seq for each difference")
    seqs[:] = array("q", bytes(8)) * len(differences)
    memoryview(seqs).cast("B")[0 if sys.byteorder == "little" else 7::8] = differences
    return running_sums_below(seqs, bound)


_INFLATE_CHUNK: Final = 1 << 16
"""Bytes of packed seqs inflated at a time: the inflated bytes never exist whole twice. Below
glibc's mmap threshold (128 KiB), so each chunk's buffer is reused heap memory, not fresh pages
faulted in (at 1M events, 1,325 page faults for the inflate of 364k nodes at 256 KiB chunks,
1,095 at 64 KiB: about 1 ms of a fresh process)."""

_ZLIB_TRAILER: Final = 4  # the Adler-32 of a zlib stream, after its deflate data


def _inflated(packed: bytes, limit: int, chunk_bytes: int) -> Iterator[bytes]:
    """The bytes zlib-compressed in ``packed``, inflated at most ``chunk_bytes`` at a time.

    The one rule both packed forms (:meth:`NodeSeqs.unpack`, :meth:`NodeSeqs.unpack_narrow`)
    are read by: the 2-byte zlib header is checked (RFC 1950: deflate, a window of at most
    32 KiB, no preset dictionary, the check bits), the deflate data is inflated raw, and the
    stream must end in exactly its 4-byte Adler-32 trailer, which is not computed again: every
    caller's bytes were checked whole before (a restore point's body by its SHA-256,
    docs/formats.md#restore-points; or kept in memory since). At 1M events it would be an
    Adler-32 over 2.9 MB of inflated seqs (``"zd:"``), a quarter of the inflate.

    Raises:
        ValueError: not a zlib header, not a whole zlib stream (cut short, or bytes after its
            trailer), or more than ``limit`` bytes inflated.
    """
    if len(packed) < 2 + _ZLIB_TRAILER or packed[0] & 0x0F != 8 or packed[0] >> 4 > 7 \
            or packed[1] & 0x20 or (packed[0] << 8 | packed[1]) % 31:
        raise ValueError("packed node seqs do not inflate (not a zlib stream)")
    decompressor = zlib.decompressobj(-15)
    data: bytes | memoryview = memoryview(packed)[2:]
    decompress = decompressor.decompress
    left_bytes = limit  # of inflated output allowed
    try:
        while not decompressor.eof:
            out = decompress(data, chunk_bytes)
            data = decompressor.unconsumed_tail
            if not out and not data:
                break  # a truncated stream: refused below
            left_bytes -= len(out)
            if left_bytes < 0:
                raise ValueError("packed node seqs hold more seqs than allowed")
            yield out
    except zlib.error as exc:  # (only decompress raises it: a yield hands out bytes only)
        raise ValueError(f"packed node seqs do not inflate ({exc})") from None
    if not decompressor.eof or len(decompressor.unused_data) != _ZLIB_TRAILER:
        raise ValueError("packed node seqs do not inflate to whole seqs")


def _inflate(packed: bytes, limit: int) -> array[int]:
    """The int64 array zlib-compressed in ``packed``, inflated a chunk at a time.

    Raises:
        ValueError: as :func:`_inflated`, or not whole int64s.
    """
    seqs = array("q")
    carry = b""  # an inflated chunk may end inside a seq
    for out in _inflated(packed, limit, _INFLATE_CHUNK):
        piece = carry + out if carry else out
        whole = len(piece) - len(piece) % 8
        seqs.frombytes(piece[:whole] if whole != len(piece) else piece)
        carry = piece[whole:]
    if carry:
        raise ValueError("packed node seqs do not inflate to whole seqs")
    if sys.byteorder == "big":
        seqs.byteswap()
    return seqs


def _inflate_narrow(packed: bytes, limit: int) -> bytes:
    """The one-byte differences zlib-compressed in ``packed`` (at most ``limit`` of them).

    Inflated at once (an eighth of the bytes :func:`_inflate` gives).

    Raises:
        ValueError: as :func:`_inflated`.
    """
    return b"".join(_inflated(packed, limit, limit + 1))


def _widened(differences: bytes, bound: int) -> array[int]:
    """The running sums of one-byte ``differences`` as an int64 array.

    Raises:
        ValueError: a sum outside ``0 .. bound - 1``.
    """
    seqs = array("q", bytes(8)) * len(differences)
    if not widen_sums_below(seqs, differences, bound):
        raise ValueError(f"packed node seqs must lie in 0 .. {bound - 1}")
    return seqs


def _narrow_differences(seqs: Sequence[int], count: int) -> bytes | None:
    """The first ``count`` of ``seqs``, each minus the one before (the first minus 0), a byte each.

    None when one won't fit (below 0 or above 255). Built straight into bytes (each
    difference a cached small int): no int64 array of the differences and no copies of it and
    of the seqs, which for a restore point of 100k nodes were ~2.4 MB of temporaries at the
    peak of a session's close (docs/formats.md#restore-points stores these bytes zlib'd).
    """
    try:
        return bytes(map(sub, islice(seqs, count), chain((0,), seqs)))
    except ValueError:
        return None


class NodeSeqs(Sequence[int]):
    """An immutable run of surface node seqs kept packed: no int object per node.

    What a :class:`~dsh.session.RestoreState` carries. Built from seqs, it holds one int64
    array (8 bytes a node). Read back from a restore point (:meth:`unpack`,
    :meth:`unpack_narrow`), it stays as the restore point stores it, zlib'd differences (an
    uncompacted 1M-event session's 364k nodes: a few KB), and hands the array it was checked
    through to the first :meth:`to_array` (the resumed session's surface) without a copy;
    later reads inflate it again. So a resume costs the same at 100k and 1M events. Read back
    tailed (:meth:`unpack_tailed`), an index, a run or a walk back within its tail is answered
    from the tail (a cold read of the latest items inflates nothing), a walk back that goes on
    into the head inflates it once. It compares equal to a list, tuple or
    :class:`SurfaceNodes` with the same seqs, hashes like the equal tuple, and slices to a
    :class:`NodeSeqs`. Rule: docs/rules.md#the-surface.

    Args:
        seqs: The seqs, in surface order (each a non-negative int below 2**63).
    """

    __slots__ = ("_below", "_count", "_fresh", "_head_max", "_head_seqs", "_narrow", "_origin",
                 "_packed", "_seqs", "_tail")

    _seqs: array[int] | None  # the seqs, unless kept packed
    _packed: bytes | None  # what pack() (or pack_narrow(), _narrow) gives, when read back;
    # with _tail: the head's (unpack_tailed), the seqs before the tail
    _narrow: bool  # _packed holds one-byte differences (unpack_narrow)
    _count: int
    _fresh: array[int] | None  # the inflated array no one else holds yet
    _below: int  # every seq was checked below this when read back (0: not checked)
    _tail: array[int] | None  # unpack_tailed: the last seqs, read without inflating
    _head_max: int  # unpack_tailed: the head's seqs claim to lie in 0 .. _head_max
    _origin: tuple[str, str]  # unpack_tailed: (session id, where its restore point is kept)
    _head_seqs: array[int] | None  # unpack_tailed: the head once inflated (never changed)

    def __init__(self, seqs: Iterable[int] = ()) -> None:
        self._fresh = None
        self._head_seqs = None
        self._below = 0
        self._tail = None
        self._head_max = -1
        self._origin = ("", "")
        if isinstance(seqs, NodeSeqs):
            self._seqs, self._packed, self._count = seqs._seqs, seqs._packed, seqs._count
            self._narrow = seqs._narrow
            self._tail, self._head_max = seqs._tail, seqs._head_max
            self._origin, self._head_seqs = seqs._origin, seqs._head_seqs
        else:
            self._seqs = array("q", seqs)
            self._packed = None
            self._narrow = False
            self._count = len(self._seqs)

    @classmethod
    def adopt(cls, seqs: array[int]) -> NodeSeqs:
        """Wrap an int64 array without copying it; the caller never changes it again."""
        if seqs.typecode != "q":
            raise TypeError(f"node seqs are an array of typecode 'q' (found {seqs.typecode!r})")
        node_seqs = cls.__new__(cls)
        node_seqs._seqs, node_seqs._packed, node_seqs._count = seqs, None, len(seqs)
        node_seqs._narrow = False
        node_seqs._fresh = None
        node_seqs._below = 0
        node_seqs._tail = None
        node_seqs._head_max = -1
        node_seqs._origin = ("", "")
        node_seqs._head_seqs = None
        return node_seqs

    @classmethod
    def from_little_endian(cls, raw: bytes) -> NodeSeqs:
        """The seqs packed in ``raw`` as little-endian int64 (``ValueError``: not whole ones)."""
        if len(raw) % 8:
            raise ValueError(f"packed node seqs take 8 bytes each ({len(raw)} bytes)")
        seqs = array("q")
        seqs.frombytes(raw)
        if sys.byteorder == "big":
            seqs.byteswap()
        return cls.adopt(seqs)

    def little_endian(self) -> bytes:
        """The seqs as little-endian int64 bytes (:meth:`from_little_endian` reads them)."""
        seqs = self._view()
        if sys.byteorder == "big":
            swapped = array("q", seqs)
            swapped.byteswap()
            return swapped.tobytes()
        return seqs.tobytes()

    def pack(self) -> bytes:
        """The seqs as a restore point stores them: zlib'd little-endian int64 differences.

        The first difference is from 0. A surface's seqs mostly rise by a few, so their
        differences repeat and compress to almost nothing. Seqs read by :meth:`unpack` give
        back the very bytes they were read from.
        """
        if self._packed is not None and not self._narrow and self._tail is None:
            return self._packed
        return zlib.compress(self._differences().tobytes(), 1)

    def pack_narrow(self) -> bytes | None:
        """The seqs as zlib'd one-byte differences (the first from 0), or None.

        None when a difference lies outside ``0 .. 255`` (seqs that fall, or rise by more): then
        only :meth:`pack` can hold them. A surface's seqs mostly rise by a few, so this is the
        form a restore point stores when it can: it inflates to an eighth of the bytes
        :meth:`pack` does (:meth:`unpack_narrow`). Seqs read by :meth:`unpack_narrow` give
        back the very bytes they were read from.
        """
        if self._packed is not None and self._narrow and self._tail is None:
            return self._packed
        seqs = self._view()
        narrow = _narrow_differences(seqs, len(seqs))
        return None if narrow is None else zlib.compress(narrow, 1)

    def pack_best(self) -> tuple[bool, bytes]:
        """``(True, pack_narrow())`` when every difference fits a byte, else ``(False, pack())``.

        What a restore point's write stores (docs/formats.md#restore-points): the differences
        are taken once for both tries.
        """
        if self._packed is not None and self._narrow and self._tail is None:
            return True, self._packed
        seqs = self._view()
        narrow = _narrow_differences(seqs, len(seqs))
        if narrow is not None:
            return True, zlib.compress(narrow, 1)
        if self._packed is not None and self._tail is None:
            return False, self._packed
        return False, zlib.compress(self._differences().tobytes(), 1)

    def pack_tailed(self, tail_count: int) -> TailedPack:
        """The seqs as a head packed like :meth:`pack_best` and the last ``tail_count`` as ints.

        What a restore point stores from :data:`TAILED_FORMAT` on
        (docs/formats.md#restore-points): a resume reads the tail and the head's count and
        largest seq, and inflates the head only when a seq before the tail is asked for
        (:meth:`unpack_tailed`). Seqs read by :meth:`unpack_tailed` give back the very parts
        they were read from.
        """
        if self._tail is not None and self._packed is not None \
                and len(self._tail) == min(tail_count, self._count):
            return TailedPack(self._count - len(self._tail), self._head_max, self._narrow,
                              tuple(self._tail), self._packed)
        seqs = self._view()
        split = max(len(seqs) - max(tail_count, 0), 0)
        narrow = _narrow_differences(seqs, split)  # (the common head: no copy of it)
        if narrow is not None:
            return TailedPack(split, max(islice(seqs, split), default=-1), True,
                              tuple(seqs[split:]), zlib.compress(narrow, 1))
        head = NodeSeqs.adopt(seqs[:split])
        narrowed, packed = head.pack_best()
        return TailedPack(split, max(head._view(), default=-1), narrowed, tuple(seqs[split:]),
                          packed)

    def _differences(self) -> array[int]:
        """Each seq minus the one before (the first minus 0), as little-endian int64s."""
        seqs = self._view()
        differences = array("q", map(sub, seqs, chain((0,), seqs)))
        if sys.byteorder == "big":
            differences.byteswap()
        return differences

    @classmethod
    def unpack(cls, packed: bytes, bound: int) -> NodeSeqs:
        """The seqs :meth:`pack` gave ``packed``, checked and kept packed.

        Inflated a chunk at a time into one int64 array and summed in place, every seq checked
        against ``bound`` in the same pass (in C when it is built); that array is the one the
        first :meth:`to_array` hands out.

        Raises:
            ValueError: not whole packed seqs, more than ``bound`` of them, or a seq outside
                ``0 .. bound - 1``.
        """
        seqs = _inflate(packed, 8 * max(bound, 0))
        if not running_sums_below(seqs, bound):
            raise ValueError(f"packed node seqs must lie in 0 .. {bound - 1}")
        return cls._kept(seqs, packed, bound, narrow=False)

    @classmethod
    def unpack_narrow(cls, packed: bytes, bound: int) -> NodeSeqs:
        """The seqs :meth:`pack_narrow` gave ``packed``, checked and kept packed.

        Inflated at once (a byte a seq, an eighth of what :meth:`unpack` inflates), then
        summed into one int64 array in one pass (:func:`widen_sums_below`), every seq checked
        against ``bound`` in it.

        Raises:
            ValueError: not a whole zlib stream, more than ``bound`` seqs, or a seq outside
                ``0 .. bound - 1``.
        """
        return cls._kept(_widened(_inflate_narrow(packed, max(bound, 0)), bound), packed,
                         bound, narrow=True)

    @classmethod
    def unpack_tailed(cls, pack: TailedPack, bound: int, *, session_id: str = "",
                      where: str = "") -> NodeSeqs:
        """The seqs :meth:`pack_tailed` gave ``pack``, checked by their counts, head kept packed.

        Nothing is inflated: the tail's seqs and the head's largest seq are checked against
        ``bound`` (so every seq is, once the head is found to hold what it claims). The head is
        inflated when a seq before the tail is first read, and checked then to hold exactly
        ``pack.head_count`` seqs in ``0 .. pack.head_max``
        (:class:`~dsh.LogCorruptError` ``RESTORE_POINT_MISMATCH`` otherwise, naming
        ``session_id`` and ``where``: the session and where its restore point is kept).

        Raises:
            ValueError: a count, the head's largest seq or a tail seq outside its range.
        """
        head_count, head_max, narrow, tail, packed = pack
        try:
            seqs = array("q", tail)
        except OverflowError:  # a seq beyond int64 (decimal text in "zt:"): out of range too
            raise ValueError(f"tailed node seqs must lie in 0 .. {bound - 1}") from None
        if type(head_count) is not int or type(head_max) is not int \
                or not 0 <= head_count <= max(bound, 0) \
                or not (head_max == -1 if head_count == 0 else 0 <= head_max < bound) \
                or head_count + len(seqs) > max(bound, 0) \
                or (seqs and (min(seqs) < 0 or max(seqs) >= bound)):
            raise ValueError(f"tailed node seqs must lie in 0 .. {bound - 1}")
        node_seqs = cls.__new__(cls)
        node_seqs._seqs, node_seqs._packed = None, packed
        node_seqs._count = head_count + len(seqs)
        node_seqs._narrow = narrow
        node_seqs._fresh = None
        node_seqs._below = bound
        node_seqs._tail = seqs
        node_seqs._head_max = head_max
        node_seqs._origin = (session_id, where)
        node_seqs._head_seqs = None
        return node_seqs

    @property
    def head_packed(self) -> bool:
        """Whether seqs before :meth:`known_tail` are still packed (read by unpack_tailed)."""
        return self._tail is not None and self._seqs is None

    def known_tail(self) -> array[int]:
        """The last seqs, read without inflating anything (all of them unless head_packed).

        The caller does not change the array.
        """
        if self._tail is not None:
            return self._tail
        return self._view()

    def _head(self, *, keep: bool = True) -> array[int]:
        """The head of tailed seqs, inflated and checked against what unpack_tailed read.

        Inflated once when ``keep``: every later full view or walk back into the head reads
        the array kept (the seqs never change; appends make a new run, :meth:`extended`). Not
        handed out: views concatenate it with the tail into a fresh array. Not kept for a
        one-off hand-off (:meth:`to_array`: a resumed session takes its own array, and a
        restore point kept decoded stays packed).
        """
        head = self._head_seqs
        if head is not None:
            return head
        assert self._packed is not None and self._tail is not None
        count = self._count - len(self._tail)
        try:
            if self._narrow:
                seqs = _widened(_inflate_narrow(self._packed, count), self._head_max + 1)
            else:
                seqs = _inflate(self._packed, 8 * count)
                if not running_sums_below(seqs, self._head_max + 1):
                    raise ValueError(f"packed node seqs must lie in 0 .. {self._head_max}")
            if len(seqs) != count:
                raise ValueError(f"the head holds {len(seqs)} seqs, not {count}")
        except ValueError as exc:
            session_id, where = self._origin
            raise restore_point_mismatch("surface", str(exc), session_id=session_id,
                                         where=where) from None
        if keep:
            self._head_seqs = seqs
        return seqs

    @classmethod
    def _kept(cls, seqs: array[int], packed: bytes, bound: int, *, narrow: bool) -> NodeSeqs:
        """Seqs checked below ``bound``, kept as ``packed`` (``seqs``: the first to_array())."""
        node_seqs = cls.__new__(cls)
        node_seqs._seqs, node_seqs._packed, node_seqs._count = None, packed, len(seqs)
        node_seqs._narrow = narrow
        node_seqs._fresh = seqs
        node_seqs._below = bound  # the pass above checked every seq
        node_seqs._tail = None
        node_seqs._head_max = -1
        node_seqs._origin = ("", "")
        node_seqs._head_seqs = None
        return node_seqs

    def _view(self) -> array[int]:
        """The seqs as an int64 array not to be changed (inflated when they are kept packed)."""
        if self._seqs is not None:
            return self._seqs
        if self._fresh is not None:
            return self._fresh
        assert self._packed is not None  # either form is always there
        if self._tail is not None:
            return self._head() + self._tail
        if self._narrow:  # checked by unpack_narrow: every sum is below its bound
            return _widened(_inflate_narrow(self._packed, self._count), 1 << 62)
        seqs = _inflate(self._packed, 8 * self._count)
        running_sums_below(seqs, (1 << 63) - 1)  # checked by unpack: every sum fits
        return seqs

    def extended(self, more: array[int]) -> NodeSeqs:
        """A new run: these seqs, then those of the int64 array ``more`` (one ``memcpy``)."""
        return NodeSeqs.adopt(self._view() + more)

    def to_array(self) -> array[int]:
        """A fresh int64 array holding the seqs, the caller's: what a session appends to.

        One ``memcpy``; seqs read back by :meth:`unpack` hand out the array they were checked
        through the first time (no copy), and inflate again after. Seqs read back tailed
        inflate a head not inflated yet for this array only (it is not kept).
        """
        if self._seqs is not None:
            return array("q", self._seqs)
        fresh, self._fresh = self._fresh, None
        if fresh is not None:
            return fresh
        if self._tail is not None and self._head_seqs is None:
            return self._head(keep=False) + self._tail
        return self._view()

    def all_below(self, bound: int) -> bool:
        """Whether every seq lies in ``0 .. bound - 1`` (one pass in C when it is built).

        Seqs read back by :meth:`unpack` were checked against its bound in the pass that summed
        them: a bound at least that one is answered without another pass.
        """
        if 0 < self._below <= bound:
            return True
        return seqs_below(self._view(), bound)

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> NodeSeqs: ...

    def __getitem__(self, index: int | slice) -> int | NodeSeqs:
        tail = self._tail if self._seqs is None and self._fresh is None else None
        if isinstance(index, slice):
            if tail is not None:  # a run within the tail of tailed seqs: the head stays packed
                start, stop, step = index.indices(self._count)
                head = self._count - len(tail)
                if step == 1 and (start >= head or start >= stop):
                    return NodeSeqs.adopt(tail[start - head:max(stop - head, 0)])
            return NodeSeqs.adopt(self._view()[index])
        if tail is not None:
            position = index + self._count if index < 0 else index
            head = self._count - len(tail)
            if head <= position < self._count:
                return tail[position - head]
        return self._view()[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self._view())

    def __reversed__(self) -> Iterator[int]:
        if self._tail is not None and self._seqs is None and self._fresh is None:
            return self._walk_back(self._tail)
        return reversed(self._view())

    def _walk_back(self, tail: array[int]) -> Iterator[int]:
        """Tailed seqs from the last back: the head inflated once, if the walk reaches it.

        A walk back from the end (a cold read of the latest items) reads the tail only.
        """
        yield from reversed(tail)
        if len(tail) < self._count:
            yield from reversed(self._head())

    def __contains__(self, value: object) -> bool:
        return value in self._view()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NodeSeqs):
            return self._count == other._count and self._view() == other._view()
        if isinstance(other, list | tuple | SurfaceNodes):
            return _same_seqs(self._view(), other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._view()))  # as the equal tuple's (rarely asked: O(n))

    def __repr__(self) -> str:
        return f"NodeSeqs({self._view().tolist()!r})"


class SurfaceNodes(Sequence[int]):
    """A read-only live view of the surface's node seqs; its identity never changes.

    It compares equal to a list, tuple or :class:`NodeSeqs` with the same seqs. The seqs live
    in a list, or, for a session resumed through a restore point, in an int64 array (no int
    object per node). Rule: docs/rules.md#the-surface.
    """

    __slots__ = ("_nodes",)

    def __init__(self, nodes: MutableSequence[int]) -> None:
        self._nodes = nodes

    def __len__(self) -> int:
        return len(self._nodes)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...

    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        if isinstance(index, slice):
            return tuple(self._nodes[index])
        return self._nodes[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self._nodes)

    def __reversed__(self) -> Iterator[int]:
        # the list's or array's own: a walk back from the end (a model view's, the pairing
        # check's) otherwise indexes through __getitem__ node by node
        return reversed(self._nodes)

    def __contains__(self, value: object) -> bool:
        return value in self._nodes

    def index(self, value: Any, start: int = 0, stop: int = MAX_SAFE_INTEGER) -> int:
        """Return the surface position of seq ``value`` (``ValueError`` when absent)."""
        return self._nodes.index(value, start, stop)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SurfaceNodes):
            return _same_seqs(self._nodes, other._nodes)
        if isinstance(other, list | tuple):
            return _same_seqs(self._nodes, other)
        if isinstance(other, NodeSeqs):
            return other == self
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a live view is not hashable

    def __repr__(self) -> str:
        return f"SurfaceNodes({list(self._nodes)!r})"


class LazyNodes(MutableSequence[int]):
    """The node seqs of a session resumed through a restore point, inflated at first need.

    Holds :class:`NodeSeqs` read by :meth:`NodeSeqs.unpack_tailed` and the seqs appended
    since. Its length, appends, and reads of the seqs from the packed state's tail on (the
    last messages, the open tool calls: a walk back from the end) inflate nothing, so a resume
    costs the same at 100k and 1M events; anything else (a full iteration, ``index``, a
    replace, a read before the tail) inflates the head once into one int64 array, which then
    serves every operation. Equal to a list of the same seqs element for element
    (:class:`SurfaceNodes` compares through it). Rule: docs/rules.md#the-surface,
    docs/architecture.md#the-restore-point-path.

    Args:
        seqs: The restored seqs (any :class:`NodeSeqs`; only a head-packed one defers work).

    Raises:
        LogCorruptError: ``RESTORE_POINT_MISMATCH`` from the operation that inflates a head
            that does not hold what its restore point claimed.
    """

    __slots__ = ("_base", "_known", "_start", "_whole")

    def __init__(self, seqs: NodeSeqs) -> None:
        self._base: NodeSeqs | None = seqs
        known = seqs.known_tail()
        self._known = array("q", known)  # the seqs from _start on (the tail, then appends)
        self._start = len(seqs) - len(known)
        self._whole: array[int] | None = None

    @property
    def inflated(self) -> bool:
        """Whether every seq is held in one int64 array now (:meth:`whole`)."""
        return self._whole is not None

    def whole(self) -> array[int]:
        """All the seqs as one int64 array, the one this object serves from then on."""
        whole = self._whole
        if whole is None:
            assert self._base is not None
            whole = self._base.to_array()
            del whole[self._start:]
            whole.extend(self._known)
            self._whole, self._base = whole, None
            self._known = array("q")
        return whole

    def __len__(self) -> int:
        whole = self._whole
        return len(whole) if whole is not None else self._start + len(self._known)

    def append(self, value: int) -> None:
        """Append seq ``value`` (no inflate)."""
        whole = self._whole
        if whole is not None:
            whole.append(value)
        else:
            self._known.append(value)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> array[int]: ...

    def __getitem__(self, index: int | slice) -> int | array[int]:
        whole = self._whole
        if whole is None:
            start = self._start
            if isinstance(index, slice):
                first, stop, step = index.indices(start + len(self._known))
                if step > 0 and (first >= start or first >= stop):
                    return self._known[max(first - start, 0):max(stop - start, 0):step]
            else:
                position = index + start + len(self._known) if index < 0 else index
                if position >= start:
                    return self._known[position - start]  # IndexError past the end
            whole = self.whole()
        return whole[index]

    def __setitem__(self, index: Any, value: Any) -> None:
        self.whole()[index] = value

    def __delitem__(self, index: int | slice) -> None:
        del self.whole()[index]

    def insert(self, index: int, value: int) -> None:
        """Insert seq ``value`` before position ``index``."""
        self.whole().insert(index, value)

    def __iter__(self) -> Iterator[int]:
        return iter(self.whole())

    def __reversed__(self) -> Iterator[int]:
        if self._whole is not None:
            return reversed(self._whole)
        return self._reversed()

    def _reversed(self) -> Iterator[int]:
        """From the end back, the head inflated only when the walk reaches it."""
        known = self._known
        start = self._start
        position = len(known)
        while position > 0:
            if self._whole is not None:  # inflated meanwhile: go on through the whole array
                yield from reversed(self._whole[:start + position])
                return
            position -= 1
            yield known[position]
        if start:
            yield from reversed(self.whole()[:start])

    def __contains__(self, value: object) -> bool:
        return value in self.whole()

    def index(self, value: Any, start: int = 0, stop: int = MAX_SAFE_INTEGER) -> int:
        """The position of seq ``value`` (``ValueError`` when absent)."""
        return self.whole().index(value, start, stop)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyNodes):
            return self.whole() == other.whole()
        if isinstance(other, list | tuple | array):
            return _same_seqs(self.whole(), other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"LazyNodes({self.whole().tolist()!r})"


_INT_ONLY: Final = {int}


def _is_seq(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_SAFE_INTEGER


def _reject(message: str, event: Any, code: str = "SURFACE") -> EventRejectedError:
    return EventRejectedError(message, code=code, seq=event.get("seq"),
                              event_type=event.get("type"))


def _check_sources(event: Any, sources: Any, shadowed: Sequence[int]) -> None:
    """Provenance rules for ``sourceEventSeqs`` (docs/rules.md#provenance), in order."""
    seq = event["seq"]
    if sources is not _MISSING:
        if not isinstance(sources, list):
            raise _reject(f"sourceEventSeqs on event at seq {seq} must be an array when present "
                          f"(found {type(sources).__name__})", event)
        if not sources and event["type"] != "assistant/message":
            raise _reject(f"sourceEventSeqs on event at seq {seq} must not be empty except on "
                          "assistant/message", event)
        # The common case in C-speed builtins (a streamed message cites dozens of chunks):
        # only ints, all in [0, seq). Anything else takes the loops below, in rule order.
        plain = not sources or (set(map(type, sources)) == _INT_ONLY and min(sources) >= 0
                                and max(sources) < seq)
        if not plain:
            for item in sources:
                if not _is_seq(item):
                    raise _reject(f"sourceEventSeqs on event at seq {seq} must densely contain "
                                  f"non-negative safe integers (found {item!r})", event)
        cited = set(sources)
        if len(cited) != len(sources):
            raise _reject(f"sourceEventSeqs on event at seq {seq} must not contain duplicates",
                          event)
        if not plain:
            for item in sources:
                if item >= seq:
                    raise _reject(f"sourceEventSeqs must reference earlier events: {item} >= "
                                  f"current seq {seq}", event)
    else:
        cited = set()
    if shadowed:
        missing = [s for s in shadowed if s not in cited]
        if missing:
            raise _reject("surface replace: sourceEventSeqs must include every shadowed surface "
                          f"node; missing {', '.join(map(str, missing))} (event at seq {seq})",
                          event)


def _blank_result_payload(data: Any) -> Any:
    """Copy ``data`` with ``message.content[0].content`` set to None, when that path exists."""
    if not isinstance(data, dict):
        return data
    message = data.get("message")
    if not isinstance(message, dict):
        return data
    content = message.get("content")
    if not isinstance(content, list) or not content or not isinstance(content[0], dict):
        return data
    block = {**content[0], "content": None}
    return {**data, "message": {**message, "content": [block, *content[1:]]}}


def _check_tool_result_rewrite(event: Any, shadowed: Sequence[int], events: Sequence[Any],
                               base_seq: int) -> None:
    """Tool-result rewrite rule (docs/rules.md#tool-result-rewrites)."""
    if len(shadowed) != 1:
        raise _reject("tool/result surface replacement must rewrite exactly one current node "
                      f"(covers {len(shadowed)}: {', '.join(map(str, shadowed))})", event)
    index = shadowed[0] - base_seq
    target = events[index] if 0 <= index < len(events) else None
    if target is None or target["type"] != "tool/result":
        found = "outside the loaded window" if target is None else target["type"]
        raise _reject("tool/result surface replacement must target a current tool/result "
                      f"(seq {shadowed[0]} is {found})", event)
    if not json_equal(_blank_result_payload(target["data"]),
                      _blank_result_payload(event["data"])):
        raise _reject("tool/result surface replacement may change only content (the replaced "
                      f"result is seq {shadowed[0]})", event)


class Surface:
    """Incremental surface state: ``nodes`` and ``replace_generation``.

    :meth:`plan` validates one candidate and returns a :class:`SurfacePlan` without changing
    anything; :meth:`apply` commits it. ``nodes`` is a :class:`SurfaceNodes` view whose identity
    is stable across appends. Rule: docs/rules.md#surface-ops, docs/rules.md#the-surface.

    Args:
        node_list: The list (or int64 array) the node seqs live in. A session passes one of
            its own and appends a plain surface append to it directly on its hot path (the same
            object, so :meth:`apply` and the view see it); default a new, empty list.
        replace_generation: The generation to start from (a restore's).
    """

    __slots__ = ("_nodes", "_replace_generation", "_view")

    def __init__(self, node_list: MutableSequence[int] | None = None,
                 replace_generation: int = 0) -> None:
        self._nodes: MutableSequence[int] = [] if node_list is None else node_list
        self._view = SurfaceNodes(self._nodes)
        self._replace_generation = replace_generation

    @classmethod
    def resume(cls, nodes: Sequence[int], replace_generation: int) -> Surface:
        """A surface holding ``nodes`` after ``replace_generation`` replaces (a restore state's).

        The state of a log prefix, as :class:`~dsh.session.RestoreState` carries it; the events
        after that prefix are then planned and applied as usual. :class:`NodeSeqs` are copied
        into an int64 array (one ``memcpy``), anything else into a list.
        """
        node_list = nodes.to_array() if isinstance(nodes, NodeSeqs) else list(nodes)
        return cls(node_list, replace_generation)

    @property
    def nodes(self) -> SurfaceNodes:
        """The current node seqs in model order (read-only, live, stable identity)."""
        return self._view

    def inflated_nodes(self) -> MutableSequence[int]:
        """The node list, a :class:`LazyNodes` swapped for its whole int64 array first.

        The one place that swaps it: the surface and its :attr:`nodes` view then hold that
        array (the same object, so appends through either are seen by both). A session that
        keeps the node list for its hot path takes the returned object. Any other list is
        returned as it is.

        Raises:
            LogCorruptError: ``RESTORE_POINT_MISMATCH`` from inflating a head that does not
                hold what its restore point claimed (see :class:`LazyNodes`).
        """
        nodes = self._nodes
        if isinstance(nodes, LazyNodes):
            nodes = self._nodes = self._view._nodes = nodes.whole()
        return nodes

    @property
    def replace_generation(self) -> int:
        """How many replacements have been committed; changes whenever positions are rewritten."""
        return self._replace_generation

    def plan(self, event: Any, expected_seq: int, events: Sequence[Any],
             base_seq: int = 0) -> SurfacePlan | None:
        """Validate ``event`` as the next event and say how it would change the surface.

        Args:
            event: The candidate (an :class:`Event` or any envelope mapping).
            expected_seq: The seq the next event must have.
            events: The loaded event window, indexed by ``seq - base_seq``; used to look up the
                target of a ``tool/result`` rewrite and the event at surface node 0.
            base_seq: The seq of ``events[0]``.

        Returns:
            None for a log-only event; otherwise the plan to :meth:`apply`.

        Raises:
            EventRejectedError: code ``SEQ_NOT_CONTIGUOUS`` for a seq other than
                ``expected_seq``; code ``SURFACE`` for a marker, range, provenance, tool-result
                rewrite or system-head violation (checks in docs/rules.md#surface-ops, then the
                node-0 rule of docs/rules.md#resume). Nothing changes.
        """
        seq = event["seq"]
        if seq != expected_seq or type(seq) is not int:
            raise _reject(f"session event seq {seq!r} is not contiguous; expected {expected_seq}",
                          event, "SEQ_NOT_CONTIGUOUS")
        etype = event["type"]
        op = event.get("surfaceOp", _MISSING)
        if etype not in SURFACE_EVENT_TYPES:
            if op is not _MISSING:
                raise _reject(f"session event {etype!r} at seq {seq} is not surface-eligible and "
                              "cannot carry surfaceOp", event)
            if "sourceEventSeqs" in event:
                raise _reject(f"session event {etype!r} at seq {seq} is not surface-eligible and "
                              "cannot carry sourceEventSeqs", event)
            return None
        if op is _MISSING:
            raise _reject(f"session event {etype!r} at seq {seq} is surface-eligible and requires "
                          "a surfaceOp marker", event)
        sources = event.get("sourceEventSeqs", _MISSING)
        if op == "append":
            if sources is not _MISSING:
                _check_sources(event, sources, ())
            return SurfacePlan(seq, -1, -1)
        if not isinstance(op, dict):
            raise _reject(f"session event {etype!r} at seq {seq} carries an invalid surfaceOp "
                          f"({op!r}); expected \"append\" or a replace object", event)
        if (op.keys() != {"op", "start", "end"} or op["op"] != "replace"
                or not _is_seq(op["start"]) or not _is_seq(op["end"])):
            raise _reject(f"session event {etype!r} at seq {seq} carries an invalid replace "
                          f"surfaceOp ({dict(op)!r}); expected exactly op=\"replace\" and "
                          "non-negative safe integer start and end", event)
        start, end = op["start"], op["end"]
        nodes = self._nodes
        start_index = self._position(start)
        if start_index < 0:
            raise _reject(f"surface replace: start seq {start} not found in surface (event at "
                          f"seq {seq})", event)
        end_index = self._position(end)
        if end_index < 0:
            raise _reject(f"surface replace: end seq {end} not found in surface (event at seq "
                          f"{seq})", event)
        if start_index > end_index:
            raise _reject(f"surface replace: start seq {start} (index {start_index}) is after end "
                          f"seq {end} (index {end_index}) (event at seq {seq})", event)
        shadowed = nodes[start_index:end_index + 1]
        _check_sources(event, sources, shadowed)
        if etype == "tool/result":
            _check_tool_result_rewrite(event, shadowed, events, base_seq)
        if start_index == 0:
            index = nodes[0] - base_seq
            head = events[index] if 0 <= index < len(events) else None
            if head is not None and head["type"] == "system/message" and (
                    etype != "system/message" or end_index != 0):
                raise _reject(f"surface replace covering node 0 (seq {nodes[0]}, a "
                              "system/message) must be a system/message replacing exactly that "
                              f"node; found {etype} covering {end_index + 1} node(s) (event at "
                              f"seq {seq})", event)
        return SurfacePlan(seq, start_index, end_index)

    def _position(self, seq: int) -> int:
        """Where node ``seq`` stands on the surface, or -1 when it is not on it.

        A search of the node list: a session appends to that list directly on its hot path,
        so no map of positions could follow it (:class:`_IndexedSurface` keeps one).
        """
        try:
            return self._nodes.index(seq)
        except ValueError:
            return -1

    def apply(self, plan: SurfacePlan | None) -> None:
        """Commit a plan returned by :meth:`plan` for the event just committed."""
        if plan is None:
            return
        seq, start_index, end_index = plan
        if start_index < 0:
            self._nodes.append(seq)
        else:
            replace_nodes(self._nodes, start_index, end_index, seq)
            self._replace_generation += 1

    def __repr__(self) -> str:
        return (f"Surface(nodes={list(self._nodes)!r}, "
                f"replace_generation={self._replace_generation})")


class _IndexedSurface(Surface):
    """A :class:`Surface` that keeps each node's position in a map: a whole-log fold's.

    Every change goes through :meth:`apply` (nothing appends to its list behind it), so a
    replace finds its run in O(1), not by a search of the list: O(nodes x replaces) over a log
    with thousands of pruned results (bench/bench_export_removed.py). A run of several nodes
    moves the nodes after it up, and their positions with them.
    """

    __slots__ = ("_where",)

    def __init__(self) -> None:
        super().__init__()
        self._where: dict[int, int] = {}  # node seq -> its position in _nodes

    def _position(self, seq: int) -> int:
        return self._where.get(seq, -1)

    def apply(self, plan: SurfacePlan | None) -> None:
        """Commit ``plan`` as :meth:`Surface.apply` does, and move the positions with it."""
        if plan is None:
            return
        seq, start_index, end_index = plan
        nodes, where = self._nodes, self._where
        if start_index < 0:
            where[seq] = len(nodes)
            nodes.append(seq)
            return
        for node in nodes[start_index:end_index + 1]:
            del where[node]
        where[seq] = start_index
        super().apply(plan)
        if end_index > start_index:  # the nodes after the run moved up
            for index in range(start_index + 1, len(nodes)):
                where[nodes[index]] = index


def replace_nodes(nodes: MutableSequence[int], start_index: int, end_index: int,
                  seq: int) -> None:
    """Put ``seq`` in place of the inclusive run ``start_index .. end_index`` of ``nodes``.

    The same on a list and an int64 array (a slice assignment would need the container's type).
    """
    del nodes[start_index + 1:end_index + 1]
    nodes[start_index] = seq


def fold_surface(events: Sequence[Any]) -> SurfaceFold:
    """Replay a whole log from seq 0 and return its surface and every replacement.

    Args:
        events: A log whose event at index ``i`` must have seq ``i``.

    Returns:
        :class:`SurfaceFold` with detached copies: the final node list and one
        :class:`SurfaceReplacement` per replace, in event order. Equal to the online state of a
        session that appended the same events.

    Raises:
        EventRejectedError: the first violation, exactly as the incremental :class:`Surface`
            reports it.

    Rule: docs/rules.md#the-surface.
    """
    surface = _IndexedSurface()
    nodes, where = surface._nodes, surface._where
    replacements: list[SurfaceReplacement] = []
    for index, event in enumerate(events):
        seq = event["seq"]
        if type(seq) is int and seq == index and "sourceEventSeqs" not in event:
            # what plan() accepts without a look at the surface, taken here without a call:
            # a plain append of a surface type, and a log-only event without either marker
            op = event.get("surfaceOp", _MISSING)
            if event["type"] in SURFACE_EVENT_TYPES:
                if op == "append":
                    where[seq] = len(nodes)
                    nodes.append(seq)
                    continue
            elif op is _MISSING:
                continue
        plan = surface.plan(event, index, events)
        if plan is not None and plan.start_index >= 0:
            op = event["surfaceOp"]
            shadowed = tuple(surface._nodes[plan.start_index:plan.end_index + 1])
            replacements.append(SurfaceReplacement(plan.seq, op["start"], op["end"], shadowed))
        surface.apply(plan)
    return SurfaceFold(list(surface._nodes), replacements)


def derive_event_message(event: Event | FrozenDict) -> FrozenDict | None:
    """Return the model message one event projects, or None.

    Returns:
        ``user/message`` and ``system/message``: the event's ``data`` (the whole message);
        ``assistant/message``: ``data["message"]`` unless its content is empty (then None);
        ``tool/result``: ``data["message"]``; any other type: None. The returned value is the
        frozen object stored in the log (no copy). ``surfaceOp`` is not consulted.

    Rule: docs/rules.md#deriving-messages, docs/rules.md#the-system-head for ``system/message``.
    """
    etype = event["type"]
    if etype == "user/message" or etype == "system/message":
        return event["data"]  # type: ignore[no-any-return]
    if etype == "assistant/message":
        message = event["data"]["message"]
        return message if message["content"] else None
    if etype == "tool/result":
        return event["data"]["message"]  # type: ignore[no-any-return]
    return None

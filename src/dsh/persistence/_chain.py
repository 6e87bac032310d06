"""The seal's hash chain: one record per sealed batch (docs/formats.md#the-seal-chain).

Each record commits to its batch's events and to the record before it.

A chain record is framed like a seal record (20 bytes: ``CHAIN_MARK: u64``, payload length
``u32``, hashed length ``u32``, ``crc32`` of the payload ``u32``), then its payload:

* the hashed part: ``prev`` (32 bytes, the previous record's hash; zeros for the first),
  ``digest`` (32 bytes, SHA-256 of the batch's event leaves in seq order), ``first`` and
  ``end`` (``u64``: the batch is seqs ``[first, end)``), ``epoch`` (``u64``: the PostgreSQL
  lease epoch, 0 elsewhere), ``pid`` (``u32``), ``incarnation`` (16 bytes: SQLite's session
  incarnation, JSONL's header digest), then the writer's host name (UTF-8, the rest);
* the key part, not hashed: ``0`` and a 16-byte batch key, or (after a rewrite lawfully
  removed content, :func:`open_record`) ``1``, a ``u32`` count and per event either ``0`` and
  its 16-byte event key or ``1`` and its 32-byte leaf.

An event's leaf is ``SHA-256(key || dumps_canonical(event))`` (keys sorted: a store may give an
event's fields back in another order) with the event key ``SHA-256(batch key ||
seq: u64)[:16]``. A tombstoned event keeps its original leaf and loses its key, so the chain
still verifies and the leaf (a salted hash) cannot be used to test a guess of the removed
content (docs/forgetting.md#tombstones-and-commitments). A record's hash is
``SHA-256("dsh-seal-chain\\0" || hashed part)``.
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import orjson

from dsh.json import (
    CFallback,
    c_chain_digest,
    c_chain_hash,
    c_chain_leaves,
    c_seqs_contiguous,
    dumps_canonical,
)
from dsh.session import Event

__all__ = ["CHAIN_MARK", "HEAD_EVERY", "HEAD_SLOT", "ChainRecord", "ChainState", "Head",
           "RawRecord", "Writer", "batch_digest", "carry", "chain_domain", "decode_head",
           "decode_record", "encode_head", "event_leaves", "events_digest", "frame_extent",
           "frame_record", "incarnation_bytes",
           "linked_parts", "new_record", "open_record", "raw_span", "record_hash", "record_of",
           "stored_record", "this_writer"]

CHAIN_MARK: Final = 0xFFFF_FFFF_FFFF_FFFE
"""The ``start`` of a seal record that frames a chain record, not a range."""

HEAD_EVERY: Final = 64
"""A writer publishes the chain head in the seal's head slot at least every this many batches
(and when it closes), each time after an fsync of the seal."""

_FRAME: Final = struct.Struct("<QIII")
_HASHED: Final = struct.Struct("<32s32sQQQI16s")
_HEAD: Final = struct.Struct("<QQQ32sI")
HEAD_SLOT: Final = 64
"""Bytes of one head slot; a v2 seal holds two after its identity."""
_DOMAIN: Final = b"dsh-seal-chain\0"
_ZERO: Final = bytes(32)
_SEQ: Final = struct.Struct("<16sQ")
_MAX_PAYLOAD: Final = 1 << 30
_SPAN: Final = struct.Struct("<QQ")  # first, end: after prev and digest in the payload
_sha256: Final = hashlib.sha256


def record_hash(hashed: bytes) -> bytes:
    """A chain record's hash: ``SHA-256(_DOMAIN || hashed part)`` (see the module docstring).

    The accelerator hashes by the CPU's SHA extensions where it has them (a writer hashes one
    record a flush, and hashlib's constructor costs more than the hash here); the same bytes.
    """
    if c_chain_hash is not None:
        return c_chain_hash(hashed, _sha256)
    return _sha256(_DOMAIN + hashed).digest()


@dataclass(frozen=True, slots=True)
class Writer:
    """Who wrote a batch: host name, process id, PostgreSQL lease epoch (0 elsewhere)."""

    host: str
    pid: int
    epoch: int = 0

    def __str__(self) -> str:
        return f"{self.host} pid {self.pid}" + (f" epoch {self.epoch}" if self.epoch else "")


_this_process: Writer | None = None  # host and pid, asked once per process (not per batch)


def _forget_this_process() -> None:
    global _this_process
    _this_process = None


os.register_at_fork(after_in_child=_forget_this_process)


def this_writer(epoch: int = 0) -> Writer:
    """The writer this process is (host name from ``socket.gethostname``).

    The host name and pid are asked once per process (a forked child asks again), not at
    every batch: two system calls less per flush.
    """
    global _this_process
    if _this_process is None:
        _this_process = Writer(socket.gethostname()[:255], os.getpid())
    return _this_process if not epoch else Writer(_this_process.host, _this_process.pid, epoch)


def incarnation_bytes(text: str) -> bytes:
    """The 16 bytes a record binds: a UUID's bytes, else the first 16 of a hex digest."""
    hexed = text.replace("-", "")
    try:
        return bytes.fromhex(hexed)[:16].ljust(16, b"\0")
    except ValueError:
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:16]


@dataclass(frozen=True, slots=True)
class ChainRecord:
    """One sealed batch in the chain (see the module docstring for the layout).

    Attributes:
        prev: The previous record's hash (zeros for the first record of a chain).
        digest: SHA-256 of the batch's event leaves.
        first: First seq of the batch.
        end: One past its last seq.
        writer: Who wrote it.
        incarnation: The 16 bytes of the session incarnation it was written for.
        keys: The key part (not hashed): ``b"\\0" + batch key`` or an opened list.
        hash: SHA-256 of the domain and the hashed part.
    """

    prev: bytes
    digest: bytes
    first: int
    end: int
    writer: Writer
    incarnation: bytes
    keys: bytes
    hash: bytes = field(default=b"", compare=False)

    def hashed(self) -> bytes:
        """The hashed part of the payload."""
        return _hashed_part(self.prev, self.digest, self.first, self.end, self.writer,
                            self.incarnation)

    def encode(self) -> bytes:
        """The record as stored in the seal: frame and payload."""
        hashed = self.hashed()
        payload = hashed + self.keys
        return _FRAME.pack(CHAIN_MARK, len(payload), len(hashed), zlib.crc32(payload)) + payload

    def where(self) -> str:
        """``batch of seq a..b written by host pid n`` for messages."""
        return f"the batch of seq {self.first}..{self.end - 1} written by {self.writer}"


def _hashed_part(prev: bytes, digest: bytes, first: int, end: int, writer: Writer,
                 incarnation: bytes) -> bytes:
    """A record's hashed part (see :meth:`ChainRecord.hashed`), from its fields."""
    return _HASHED.pack(prev, digest, first, end, writer.epoch, writer.pid,
                        incarnation) + writer.host.encode("utf-8", "surrogateescape")


RawRecord = tuple[bytes, int, bytes]
"""A chain record as framed in the seal: its payload, the length of its hashed part, its hash
(what a reader checks links with; :func:`record_of` builds the :class:`ChainRecord`)."""


def frame_record(data: bytes | memoryview, pos: int) -> tuple[RawRecord, int] | None:
    """The chain record framed at ``pos`` as stored, hashed; ``None`` when cut short or damaged.

    A record cut short or whose crc32 differs is a torn write: the caller decides whether that
    is allowed there (the head check). The hashed part is hashed as stored: it is what
    :meth:`ChainRecord.hashed` packs (the host name round-trips through ``surrogateescape``).

    Returns:
        ``(payload, hashed length, hash)`` and the position after the record.
    """
    if pos + _FRAME.size > len(data):
        return None
    _, length, hashed_len, crc = _FRAME.unpack_from(data, pos)
    start = pos + _FRAME.size
    if length > _MAX_PAYLOAD or hashed_len < _HASHED.size or hashed_len > length \
            or start + length > len(data):
        return None
    payload = bytes(data[start:start + length])
    if zlib.crc32(payload) != crc:
        return None
    return (payload, hashed_len, record_hash(payload[:hashed_len])), start + length


def frame_extent(data: bytes | memoryview, pos: int) -> int | None:
    """Where the chain record framed at ``pos`` says it ends; ``None`` when it cannot say.

    ``None``: its frame is cut short or its lengths cannot be a record's. For telling a torn
    record from a changed one (docs/formats.md#the-seal-chain): the returned end may lie past
    ``len(data)`` (the record is cut short).
    """
    if pos + _FRAME.size > len(data):
        return None
    length: int
    hashed_len: int
    _, length, hashed_len, _ = _FRAME.unpack_from(data, pos)
    if length > _MAX_PAYLOAD or hashed_len < _HASHED.size or hashed_len > length:
        return None
    return pos + _FRAME.size + length


def raw_span(raw: RawRecord) -> tuple[int, int]:
    """``(first, end)``: the seqs a framed record covers."""
    return _SPAN.unpack_from(raw[0], 64)


def record_of(raw: RawRecord) -> ChainRecord:
    """The :class:`ChainRecord` of a framed record (see :func:`frame_record`)."""
    payload, hashed_len, digest = raw
    prev, batch, first, end, epoch, pid, inc = _HASHED.unpack_from(payload, 0)
    host = payload[_HASHED.size:hashed_len].decode("utf-8", "surrogateescape")
    return ChainRecord(prev, batch, first, end, Writer(host, pid, epoch), inc,
                       payload[hashed_len:], digest)


def decode_record(data: bytes | memoryview, pos: int) -> tuple[ChainRecord, int] | None:
    """Decode the chain record framed at ``pos``; ``None`` when it is cut short or damaged.

    A record cut short or whose crc32 differs is a torn write: the caller decides whether that
    is allowed there (the head check).

    Returns:
        The record (its hash computed) and the position after it.
    """
    found = frame_record(data, pos)
    return (record_of(found[0]), found[1]) if found is not None else None


def _event_key(batch_key: bytes, seq: int) -> bytes:
    return hashlib.sha256(_SEQ.pack(batch_key, seq)).digest()[:16]


def event_leaves(record: ChainRecord, events: Sequence[Event]) -> list[bytes]:
    """The leaves of ``events`` (the batch's events, seq order) under ``record``'s keys.

    Raises:
        ValueError: the key part is malformed or does not have one entry per event.
    """
    sha = hashlib.sha256
    keys = record.keys
    if keys[:1] == b"\0" and len(keys) == 17:
        batch_key = keys[1:]
        if c_chain_leaves is not None and isinstance(events, list | tuple):
            try:  # the same leaves in one C pass (canonical bytes, both hashes)
                return c_chain_leaves(events, batch_key, sha, orjson.dumps)
            except CFallback:
                pass  # an event the C pass leaves to the reference below
        pack = _SEQ.pack
        return [sha(sha(pack(batch_key, e["seq"])).digest()[:16] + dumps_canonical(e)).digest()
                for e in events]
    if keys[:1] != b"\1" or len(keys) < 5:
        raise ValueError("malformed key part")
    (count,) = struct.unpack_from("<I", keys, 1)
    if count != len(events):
        raise ValueError(f"key part lists {count} events, the batch has {len(events)}")
    leaves: list[bytes] = []
    pos = 5
    for event in events:
        tag = keys[pos:pos + 1]
        if tag == b"\0":
            leaves.append(sha(keys[pos + 1:pos + 17] + dumps_canonical(event)).digest())
            pos += 17
        elif tag == b"\1":
            leaves.append(keys[pos + 1:pos + 33])
            pos += 33
        else:
            raise ValueError("malformed key part")
    if pos != len(keys):
        raise ValueError("malformed key part")
    return leaves


def batch_digest(leaves: Sequence[bytes]) -> bytes:
    """SHA-256 of the leaves, concatenated."""
    return hashlib.sha256(b"".join(leaves)).digest()


def events_digest(record: ChainRecord, events: Sequence[Event], start: int, stop: int) -> bytes:
    """``batch_digest(event_leaves(record, events[start:stop]))``: what ``record.digest`` must be.

    The accelerator reads the batch where it lies in ``events`` (no slice, no leaf objects):
    ``dsh verify`` checks every batch of a log this way (docs/formats.md#the-seal-chain).

    Raises:
        ValueError: as :func:`event_leaves`.
    """
    keys = record.keys
    if (c_chain_digest is not None and keys[:1] == b"\0" and len(keys) == 17
            and isinstance(events, list | tuple) and 0 <= start <= stop <= len(events)):
        try:
            return c_chain_digest(events, start, stop, keys[1:], _sha256, orjson.dumps)
        except CFallback:
            pass  # an event the C pass leaves to the reference below
    return batch_digest(event_leaves(record, events[start:stop]))


def new_record(prev: ChainRecord | None, events: Sequence[Event], incarnation: bytes,
               writer: Writer, *, prev_hash: bytes | None = None,
               digested: tuple[bytes, bytes] | None = None) -> ChainRecord:
    """The record of a batch of ``events`` (contiguous seqs), chained after ``prev``.

    ``prev_hash`` stands for ``prev`` when only its hash is held (a chain whose older records
    a resume left unread, :attr:`ChainState.elided`). ``digested`` is ``(batch key, digest)``
    when the digest of exactly these events under that key was computed as they were encoded
    (:attr:`ChainState.digested`): the record then takes them instead of a fresh key.
    """
    keys = b"\0" + (os.urandom(16) if digested is None else digested[0])
    if prev_hash is None:
        prev_hash = prev.hash if prev is not None else _ZERO
    first, end = int(events[0]["seq"]), int(events[-1]["seq"]) + 1
    if digested is None:
        draft = ChainRecord(prev_hash, _ZERO, first, end, writer, incarnation, keys)
        digest = batch_digest(event_leaves(draft, events))
    else:
        digest = digested[1]
    # one record built, hashed as it is made (not a draft, a copy and a hashed copy): each
    # flush chains its batch, and a frozen dataclass costs ~10-20 us to build between
    # fsyncs (cold caches)
    hashed = _hashed_part(prev_hash, digest, first, end, writer, incarnation)
    return ChainRecord(prev_hash, digest, first, end, writer, incarnation, keys,
                       record_hash(hashed))


def open_record(record: ChainRecord, old: Sequence[Event], changed: set[int]) -> ChainRecord:
    """``record`` opened for a rewrite that replaced some of its events by tombstones.

    Each changed event keeps only its leaf, the others their event key; the batch key is
    dropped. The hashed part, and so the chain, is unchanged.

    Args:
        record: The batch's record.
        old: The batch's events as they were (seq order).
        changed: The seqs replaced by tombstones.
    """
    leaves = event_leaves(record, old)
    parts = [b"\1", struct.pack("<I", len(old))]
    batch_key = record.keys[1:] if record.keys[:1] == b"\0" else None
    pos = 5
    for event, leaf in zip(old, leaves, strict=True):
        seq = int(event["seq"])
        if batch_key is not None:
            key = _event_key(batch_key, seq)
        else:
            tag = record.keys[pos:pos + 1]
            key = record.keys[pos + 1:pos + 17] if tag == b"\0" else b""
            pos += 17 if tag == b"\0" else 33
        parts.append(b"\1" + leaf if seq in changed or not key else b"\0" + key)
    return ChainRecord(record.prev, record.digest, record.first, record.end, record.writer,
                       record.incarnation, b"".join(parts), record.hash)


def carry(records: Sequence[ChainRecord], old: Mapping[int, Event],
          new: Sequence[Event], incarnation: bytes, writer: Writer) -> list[ChainRecord]:
    """The chain of a rewritten log (redaction, erasure; docs/forgetting.md).

    ``records`` are kept (batches with a changed event opened, :func:`open_record`), then one
    record covers the events past the chain's end.

    Args:
        records: The old log's chain.
        old: The old log's events by seq.
        new: The new log's events (same seqs, tombstones in place, new ones appended).
        incarnation: What the new record binds.
        writer: Who writes the new record.
    """
    out: list[ChainRecord] = []
    by_seq = {int(e["seq"]): e for e in new}
    for record in records:
        batch = [old[s] for s in range(record.first, record.end) if s in old]
        if len(batch) != record.end - record.first:
            break  # the old log no longer holds the batch: the chain stops before it
        changed = {s for s in range(record.first, record.end)
                   if s not in by_seq or dumps_canonical(by_seq[s]) != dumps_canonical(old[s])}
        out.append(open_record(record, batch, changed) if changed else record)
    end = out[-1].end if out else 0
    rest = [e for e in new if int(e["seq"]) >= end]
    if rest:
        out.append(new_record(out[-1] if out else None, rest, incarnation, writer))
    return out


@dataclass(frozen=True, slots=True)
class Head:
    """A published chain head.

    The ``counter``-th publication of ``batches`` records whose last one ends at seq ``end``
    and hashes to ``hash``.
    """

    counter: int
    batches: int
    end: int
    hash: bytes


def encode_head(head: Head) -> bytes:
    """One 64-byte head slot (its own crc32 at the end of the fields, zero padded)."""
    body = _HEAD.pack(head.counter, head.batches, head.end, head.hash, 0)[:-4]
    return (body + struct.pack("<I", zlib.crc32(body))).ljust(HEAD_SLOT, b"\0")


def decode_head(slots: bytes) -> Head | None:
    """The newest valid head of the two slots; ``None`` when neither is valid."""
    best: Head | None = None
    for i in range(2):
        slot = slots[i * HEAD_SLOT:(i + 1) * HEAD_SLOT]
        if len(slot) < _HEAD.size:
            continue
        counter, batches, end, digest, crc = _HEAD.unpack_from(slot, 0)
        if zlib.crc32(slot[:_HEAD.size - 4]) != crc or counter == 0:
            continue
        if best is None or counter > best.counter:
            best = Head(counter, batches, end, digest)
    return best


@dataclass(slots=True)
class ChainState:
    """A write handle's view of its seal chain.

    Attributes:
        records: The chain's records, oldest first (after the ``elided`` ones).
        head_counter: The counter of the last head published (0: none).
        published: How many records the last published head covers.
        pending: Events appended and not yet in a record (seq order; a failed write's batch
            may appear again: the last copy of a seq wins).
        elided: Records before ``records`` that were not read (a resume through a restore
            point reads only the seal past its cut, docs/formats.md#restore-points); the last
            of them hashes to ``elided_hash`` and ends at seq ``elided_end``. A writer that
            rewrites the seal reads them first (:meth:`restore_elided`).
        digested: ``(first, end, batch key, digest)`` of the batch just added to an empty
            ``pending`` when its digest was computed as it was encoded (SQLite's one-pass
            encoding): :meth:`take` uses them when it chains exactly seqs ``[first, end)``.
    """

    records: list[ChainRecord]
    head_counter: int = 0
    published: int = 0
    pending: list[Event] = field(default_factory=list)
    elided: int = 0
    elided_hash: bytes = _ZERO
    elided_end: int = 0
    digested: tuple[int, int, bytes, bytes] | None = None

    @property
    def end(self) -> int:
        """One past the last seq chained (0 for an empty chain)."""
        return self.records[-1].end if self.records else self.elided_end

    @property
    def count(self) -> int:
        """Records in the chain, the elided ones included."""
        return self.elided + len(self.records)

    def restore_elided(self, older: Sequence[ChainRecord]) -> None:
        """Put the ``elided`` records back in front of ``records`` (read from the seal).

        Raises:
            ValueError: ``older`` is not the elided records (count or last hash).
        """
        if len(older) != self.elided or (older and older[-1].hash != self.elided_hash):
            raise ValueError("the seal's records before the restore point's cut are not the "
                             "ones the resume checked")
        self.records[:0] = older
        self.elided, self.elided_hash, self.elided_end = 0, _ZERO, 0

    def take(self, durable_end: int, incarnation: bytes, writer: Writer) -> ChainRecord | None:
        """The record of the pending events below ``durable_end``, appended to ``records``.

        Events the handle did not append (another writer's, or before the chain existed) are
        not chained: the record then starts after a gap, which the chain commits to and
        ``dsh verify`` reports.
        """
        pending, start = self.pending, self.end
        digested, self.digested = self.digested, None
        if (c_seqs_contiguous is not None and type(pending) is list and pending
                and len(pending) == durable_end - start and c_seqs_contiguous(pending, start)):
            # the common case, what the general path below gives without its dict and sorts:
            # exactly the events start .. durable_end - 1, each once, in order
            self.pending, chained, first = [], pending, start
        else:
            by_seq = {int(e["seq"]): e for e in pending}
            self.pending = [by_seq[s] for s in sorted(by_seq) if s >= durable_end]
            seqs = [s for s in sorted(by_seq) if start <= s < durable_end]
            while seqs and seqs[-1] - seqs[0] + 1 != len(seqs):
                seqs = seqs[1:]  # keep the contiguous run that ends at the durable end
            if not seqs or seqs[-1] + 1 != durable_end:
                return None
            chained, first = [by_seq[s] for s in seqs], seqs[0]
        # the digest the encoding computed, when it was for exactly these seqs; else the
        # leaves are hashed from the events
        record = new_record(self.records[-1] if self.records else None, chained, incarnation,
                            writer, prev_hash=None if self.records else self.elided_hash,
                            digested=digested[2:] if digested is not None
                            and digested[:2] == (first, durable_end) else None)
        self.records.append(record)
        return record

    def head(self) -> Head:
        """The head to publish next (counter one past the last)."""
        last = self.records[-1] if self.records else None
        return Head(self.head_counter + 1, self.count, self.end,
                    last.hash if last else self.elided_hash)


_LINKED: Final = struct.Struct("<32sQQQI")  # digest, first, end, epoch, pid: after prev


def chain_domain() -> bytes:
    """The bytes a record's hash is taken over before its hashed part (``dsh-seal-chain\\0``).

    A store that links records itself (PostgreSQL: ``sha256(domain || hashed)`` in SQL) needs
    them (docs/formats.md#the-seal-chain).
    """
    return _DOMAIN


def linked_parts(events: Sequence[Event], writer: Writer) -> tuple[bytes, bytes, bytes]:
    """A batch's record without ``prev`` and ``incarnation``, for a store that links in SQL.

    Returns:
        ``(middle, host, keys)``: the hashed part is ``prev || middle || incarnation ||
        host`` (``middle`` = digest, first, end, epoch and pid, packed as in the record), and
        ``keys`` the key part (a fresh batch key).
    """
    draft = new_record(None, events, bytes(16), writer)
    return (_LINKED.pack(draft.digest, draft.first, draft.end, writer.epoch, writer.pid),
            writer.host.encode("utf-8", "surrogateescape"), draft.keys)


def stored_record(hashed: bytes, keys: bytes) -> ChainRecord:
    """The record whose hashed and key parts a store kept apart (its hash recomputed).

    Raises:
        ValueError: ``hashed`` is shorter than a record's fixed fields.
    """
    if len(hashed) < _HASHED.size:
        raise ValueError(f"a chain record's hashed part has {len(hashed)} bytes, fewer than "
                         f"its {_HASHED.size} fixed ones")
    return record_of((hashed + keys, len(hashed), record_hash(hashed)))

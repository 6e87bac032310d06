"""The projection checkpoint: derived restore state tied to the exact bytes it covers.

A checkpoint lets a resume read only the log's tail (DESIGN §3.12). It holds a
:class:`~dsh.session._restore_state.RestoreState` (what a restore derives from the prefix) and an
:class:`Anchor` naming the prefix it was derived from: backend, session id and incarnation, the
covered event count and byte offset (SQLite: physical rows), digests of the stored header and of
the last bytes (rows) before the cut, a digest of the integrity-seal records over the prefix,
and a sparse ``seq -> byte offset`` index for paging events in.

Invariants this module owns:

* a checkpoint is never the truth: a missing, unparsable, foreign-version, other-session or
  stale one is refused here or by the backend's check (:class:`CheckpointRefused`), and the
  caller does the full read, which gives the same answer; a refusal is a DEBUG log line and a
  :data:`stats` count, never an error to the user;
* it lives in a sidecar beside the log, never inside dsh's files (dsh refuses extra SQLite
  tables and extra events would change its logs); it is replaced atomically (temp file +
  rename) and, like the seals, not fsynced: a lost checkpoint only costs a full read;
* its body is covered by its own SHA-256, so flipped or truncated bytes are refused;
* the anchor checks are cheap on purpose (they read a few KiB, not the prefix): bytes changed
  inside the covered prefix, or a zstd log replaced by one with the same header, size and
  final bytes, pass them; :func:`check_checkpoint` (``dsh verify``, a full read) reports such
  a checkpoint as ``misleading``.

PostgreSQL keeps the full read: its rows are read by seq range already, and a sidecar on one
host would not serve the others.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from glob import escape as glob_escape
from itertools import pairwise
from pathlib import Path
from typing import Any, Final, Protocol, runtime_checkable

import orjson

from dsh.json import MAX_SAFE_INTEGER, dumps
from dsh.persistence._seal import _write_all as write_all
from dsh.session import Event, RestoreFold, RestoreState

__all__ = [
    "CHECKPOINT_EVERY_BYTES",
    "CHECKPOINT_EVERY_EVENTS",
    "CHECKPOINT_FORMAT",
    "DENSE_SURFACE_PAGES",
    "INDEX_EVERY_BYTES",
    "INDEX_EVERY_EVENTS",
    "Anchor",
    "Checkpoint",
    "CheckpointCheck",
    "CheckpointRefused",
    "KeepsCheckpoints",
    "check_checkpoint",
    "decode_checkpoint",
    "digest",
    "encode_checkpoint",
    "note_refusal",
    "read_checkpoint_file",
    "stats",
    "surface_is_dense",
    "write_checkpoint_file",
]

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT: Final = 1
"""Version of the checkpoint file layout and of the restore state it carries."""

LIBRARY_TAG: Final = "dsh-python/0.1"
"""The writer; a checkpoint written by another tag is refused (its derivation may differ)."""

CHECKPOINT_EVERY_EVENTS = 2048
"""A checkpoint is written at the first flush at least this many events after the last one."""

CHECKPOINT_EVERY_BYTES = 2 * 1024 * 1024
"""... or at least this many log bytes after it (whichever comes first)."""

INDEX_EVERY_EVENTS = 256
"""The page-in index gets an entry at a batch start at least this many events after the last."""

INDEX_EVERY_BYTES = 256 * 1024
"""... or at least this many bytes after it."""

DENSE_SURFACE_PAGES = 0.5
"""A JSONL resume reads in full when the surface has a node in more than this fraction of the
pages before the cut (an uncompacted session): deriving its messages would page nearly the
whole log in, and each page-in scans its span of the file (zstd: decompresses whole batch
frames) and frees the events again when the page is evicted, so one sequential read is cheaper
(100k msg events, raw: about 350-400 ms against 500-570 ms; zstd: 580-620 ms against 680-720
ms). SQLite fetches a page's rows by seq for less than a full read costs, so it keeps the
checkpoint (430-440 ms against 730-745 ms). The JSONL handle refuses such a checkpoint in
``read_checkpointed``, before it reads the tail."""


def surface_is_dense(state: RestoreState, page_events: int) -> bool:
    """Whether the surface is spread over most of the log before the cut.

    True when ``state``'s nodes lie in more than :data:`DENSE_SURFACE_PAGES` of the
    ``page_events``-event pages before its cut.
    """
    pages = -(-state.event_count // page_events)
    touched = len({seq // page_events for seq in state.nodes})
    return pages > 0 and touched > DENSE_SURFACE_PAGES * pages


DIGEST_TAIL_BYTES: Final = 4096
"""How many bytes before the cut the tail digest covers (JSONL)."""

_MAGIC: Final = b"DSHCKPT1 "

stats: Counter[str] = Counter()
"""Process-wide counts: ``written``, ``used``, ``refused`` and ``refused:<reason>`` (tests)."""


class CheckpointRefused(Exception):
    """The checkpoint cannot be used; ``reason`` says why (the caller reads in full)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def note_refusal(session_id: str, reason: str) -> None:
    """Count and log (DEBUG) a refused checkpoint of ``session_id``."""
    stats["refused"] += 1
    stats[f"refused:{reason.split(':')[0]}"] += 1
    logger.debug("session %s: checkpoint not used (%s); reading the whole log", session_id,
                 reason)


def digest(data: bytes) -> str:
    """The hex SHA-256 of ``data`` (the digest every anchor field uses)."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class Anchor:
    """What ties a checkpoint to the stored prefix it was derived from.

    Attributes:
        backend: ``"jsonl"``, ``"jsonl-zstd"`` or ``"sqlite"``.
        session_id: The session.
        incarnation: The stored log's identity (JSONL: the header digest; SQLite: the
            session's incarnation column).
        event_count: Events covered (seqs ``0 .. event_count - 1``).
        byte_offset: JSONL: file bytes covered (a batch boundary); SQLite: physical rows.
        header_digest: Digest of the stored header (JSONL: the header line or frame).
        tail_digest: Digest of the last bytes (rows) before the cut.
        seal_digest: Digest of the integrity-seal records over the prefix ("" when none).
        index: ``(seq, byte offset)`` of record starts, ascending, first ``(0, header end)``.
    """

    backend: str
    session_id: str
    incarnation: str
    event_count: int
    byte_offset: int
    header_digest: str
    tail_digest: str
    seal_digest: str
    index: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """An anchor and the restore state of the prefix it names."""

    anchor: Anchor
    state: RestoreState


@runtime_checkable
class KeepsCheckpoints(Protocol):
    """A handle whose backend keeps projection checkpoints (JSONL, SQLite schema 17)."""

    @property
    def durable_bytes(self) -> int:
        """Log bytes made durable through the handle (0 when the backend counts none)."""
        ...

    def checkpoint_anchor(self) -> Anchor | None:
        """The anchor of the durable prefix, or None when none can be given now."""
        ...

    def checkpoint_path(self) -> Path:
        """The checkpoint sidecar file."""
        ...

    def write_checkpoint(self, data: bytes) -> None:
        """Replace the sidecar with ``data`` atomically (``OSError`` on failure)."""
        ...

    def read_checkpointed(self, *, dense: bool = False) -> tuple[Checkpoint, Any, Any]:
        """``(checkpoint, tail ColdRead, EventSource)``, or raise :class:`CheckpointRefused`.

        A backend whose page-ins cost more than its full read refuses a checkpoint whose
        surface is dense (``dense-surface``) unless ``dense`` (``dsh verify`` checks it).
        """
        ...


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    """Return the sidecar bytes: magic, the body's SHA-256, newline, the JSON body."""
    anchor = checkpoint.anchor
    body = dumps({
        "format": CHECKPOINT_FORMAT, "library": LIBRARY_TAG, "backend": anchor.backend,
        "sessionId": anchor.session_id, "incarnation": anchor.incarnation,
        "eventCount": anchor.event_count, "byteOffset": anchor.byte_offset,
        "headerDigest": anchor.header_digest, "tailDigest": anchor.tail_digest,
        "sealDigest": anchor.seal_digest, "index": [list(pair) for pair in anchor.index],
        "state": checkpoint.state.to_wire(),
    })
    return _MAGIC + digest(body).encode() + b"\n" + body


def _field(body: dict[str, Any], key: str, kind: type) -> Any:
    value: Any = body.get(key)
    if type(value) is not kind or (type(value) is int and not 0 <= value <= MAX_SAFE_INTEGER):
        raise CheckpointRefused(f"bad-field:{key}")
    return value


def decode_checkpoint(data: bytes, *, session_id: str, backend: str) -> Checkpoint:
    """Parse and check sidecar bytes written by :func:`encode_checkpoint`.

    Raises:
        CheckpointRefused: damaged (digest), unparsable, another format or library version,
            another session or backend, or a field of the wrong shape.
    """
    head, nl, body_bytes = data.partition(b"\n")
    if not nl or not head.startswith(_MAGIC):
        raise CheckpointRefused("not-a-checkpoint")
    if head[len(_MAGIC):] != digest(body_bytes).encode():
        raise CheckpointRefused("digest")
    try:
        # plain containers at once (the digest already vouched for the bytes); the state's
        # header maps are snapshotted by RestoreState.from_wire
        body = orjson.loads(body_bytes)
    except orjson.JSONDecodeError:
        raise CheckpointRefused("unparsable") from None
    if not isinstance(body, dict):
        raise CheckpointRefused("unparsable")
    if body.get("format") != CHECKPOINT_FORMAT or body.get("library") != LIBRARY_TAG:
        raise CheckpointRefused("version")
    if body.get("sessionId") != session_id:
        raise CheckpointRefused("other-session")
    if body.get("backend") != backend:
        raise CheckpointRefused("other-backend")
    raw_index = body.get("index")
    if not isinstance(raw_index, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(type(x) is int and x >= 0 for x in p)
            for p in raw_index):
        raise CheckpointRefused("bad-field:index")
    index = tuple((p[0], p[1]) for p in raw_index)
    if any(b[0] <= a[0] or b[1] <= a[1] for a, b in pairwise(index)):
        raise CheckpointRefused("bad-field:index")
    try:
        state = RestoreState.from_wire(body.get("state"))
    except ValueError:
        raise CheckpointRefused("bad-field:state") from None
    anchor = Anchor(backend=backend, session_id=session_id,
                    incarnation=_field(body, "incarnation", str),
                    event_count=_field(body, "eventCount", int),
                    byte_offset=_field(body, "byteOffset", int),
                    header_digest=_field(body, "headerDigest", str),
                    tail_digest=_field(body, "tailDigest", str),
                    seal_digest=_field(body, "sealDigest", str), index=index)
    if anchor.event_count != state.event_count:
        raise CheckpointRefused("bad-field:eventCount")
    return Checkpoint(anchor=anchor, state=state)


def read_checkpoint_file(path: Path) -> bytes:
    """Return the sidecar's bytes.

    Raises:
        CheckpointRefused: ``absent`` (no file) or ``unreadable`` (not a regular file, I/O).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise CheckpointRefused("absent") from None
    except OSError:
        raise CheckpointRefused("unreadable") from None
    try:
        with os.fdopen(fd, "rb") as f:
            return f.read()
    except OSError:
        raise CheckpointRefused("unreadable") from None


def write_checkpoint_file(path: Path, data: bytes) -> None:
    """Replace the sidecar atomically (temp file + rename; no fsync, as the seals).

    Only the session's single writer calls this, so any other temp file of this sidecar was
    left by a writer killed between write and rename: it is removed. A failed write removes
    its own temp file.

    Raises:
        OSError: it could not be written (the old checkpoint stays; it is only derived).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    for stale in path.parent.glob(f".{glob_escape(path.name)}.*.tmp"):
        if stale != tmp:
            stale.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    stats["written"] += 1


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointCheck:
    """What ``dsh verify`` found of one session's projection checkpoint.

    Attributes:
        status: ``"absent"`` (none, or the backend keeps none), ``"consistent"`` (it matches
            the full read exactly), ``"ignored"`` (a resume would not use it), or
            ``"misleading"`` (a resume's cheap checks accept it, yet it does not match the
            full read: the log was changed inside the prefix it covers, or replaced by one
            whose header, size and final bytes are the same; ``dsh verify`` reports it as a
            violation, and deleting the file makes resumes read the whole log).
        event_count: Events it covers (0 when absent or unreadable).
        message: One sentence for the user (what was found, what a resume does).
    """

    status: str
    event_count: int
    message: str


def check_checkpoint(handle: Any, events: Sequence[Event], inherited: int) -> CheckpointCheck:
    """Check a session's checkpoint against its full read: anchor, state, tail and every page.

    Args:
        handle: An open handle of the session (``read_checkpointed`` when the backend keeps
            checkpoints).
        events: The stored events of a full read (before any repair closers).
        inherited: The header's ``seedLength`` or 0.

    Returns:
        The verdict; never raises for a bad checkpoint (it is derived data, not the log).
    """
    if not isinstance(handle, KeepsCheckpoints):
        return CheckpointCheck(status="absent", event_count=0,
                               message="this backend keeps no projection checkpoints")
    try:
        checkpoint, cold, source = handle.read_checkpointed(dense=True)
    except CheckpointRefused as exc:
        if exc.reason == "absent":
            return CheckpointCheck(status="absent", event_count=0,
                                   message="no projection checkpoint; a resume reads the whole "
                                           "log (it is written at the next flush that is due)")
        return CheckpointCheck(status="ignored", event_count=0, message=_ignored(exc.reason))
    count = checkpoint.state.event_count
    fold = RestoreFold(inherited)
    fold.feed(events[:count])
    problem = None
    if tuple(cold.events) != tuple(events[count:]):
        problem = "its tail differs from the log's"
    elif fold.state() != checkpoint.state:
        problem = "its restore state differs from the one the log derives"
    else:
        for start in range(0, count, 4096):
            if tuple(source.read(start, min(count, start + 4096))) != tuple(
                    events[start:min(count, start + 4096)]):
                problem = f"events paged in from seq {start} differ from the log's"
                break
    if problem is not None:
        # read_checkpointed accepted it: a resume would use it, and see another session.
        return CheckpointCheck(
            status="misleading", event_count=count,
            message=f"the projection checkpoint passes a resume's checks but does not match "
                    f"the log ({problem}): the log changed inside the {count} events it "
                    f"covers, so a resume would not see the stored log; delete "
                    f"{handle.checkpoint_path()} and the next resume reads the whole log")
    return CheckpointCheck(status="consistent", event_count=count,
                           message=f"projection checkpoint covers {count} events and matches "
                                   "the full read; a resume reads only the events after it")


def _ignored(reason: str) -> str:
    return (f"warning: the projection checkpoint does not match the log ({reason}); a resume "
            "ignores it and reads the whole log, so nothing is lost (the next due flush "
            "replaces it)")

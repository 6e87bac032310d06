"""The storage contract every persistence backend implements.

Rule: docs/stores.md#the-backend-contract, docs/rules.md#resume.

A backend stores sessions: one header (the ``SessionHeader`` wire object,
    docs/formats.md#the-session-header)
and one append-only event log per session id. Access goes through a :class:`Handle` opened in
``"read"`` or ``"write"`` mode. A write handle is exclusive inside the process and across
processes (an OS-locked lock file beside the data, never a table inside a SQLite file); a
second writer gets :class:`~dsh._errors.SessionBusyError` naming the holder.

Shapes:

* header: a ``FrozenDict`` with dsh's camelCase keys (``version``, ``id``, ``createdAt``,
  ``cwd``?, ``parentSession``?, ``seedLength``?, ``origin``?, ``delegationDepth``?,
  ``agentPreset``?). Backends store and return only the known keys.
* events: :class:`~dsh.session._events.Event` objects (frozen wire objects), chunk storage rows
  already expanded, seq contiguous from 0.
"""

from __future__ import annotations

import json as std_json
import weakref
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Literal,
    NamedTuple,
    Protocol,
    Self,
    TypeGuard,
    TypeVar,
    runtime_checkable,
)

from dsh._errors import DshError, SessionFormatUnsupportedError
from dsh.json import FrozenDict, snapshot_json

if TYPE_CHECKING:
    from dsh.persistence._chain import ChainRecord
    from dsh.persistence._listing import ListingEntry, ReadFn
    from dsh.session import Event

__all__ = [
    "HEADER_KEYS",
    "MAX_ID_SEGMENT_BYTES",
    "STORE_LOG_ID",
    "Backend",
    "Capabilities",
    "ChecksStorable",
    "ColdRead",
    "Fenced",
    "Handle",
    "HoldsResume",
    "InjectsTornTail",
    "KeepsAsides",
    "KeepsChain",
    "KeptChain",
    "KeepsCuts",
    "ListsEntries",
    "Migrates",
    "NamesFiles",
    "OpenMode",
    "ReadsRanges",
    "StampsChanges",
    "ReadsWhole",
    "Reseals",
    "Rewrites",
    "SchemaVersioned",
    "Scrubs",
    "SessionSummary",
    "Tails",
    "TornTail",
    "check_session_id",
    "conforms",
    "format_version_refusal",
    "metadata_problem",
    "normalize_header",
    "session_id_problem",
    "validate_batch",
]

_P = TypeVar("_P")

OpenMode = Literal["read", "write"]
"""``"read"``: shared, never writes. ``"write"``: exclusive across threads and processes."""

HEADER_KEYS: tuple[str, ...] = (
    "version", "id", "createdAt", "cwd", "parentSession", "seedLength", "origin",
    "delegationDepth", "agentPreset",
)
"""The ``SessionHeader`` keys a backend stores, in dsh's order.

Rule: docs/formats.md#the-session-header.
"""


@dataclass(frozen=True, slots=True)
class TornTail:
    """An uncommitted tail found after the valid committed prefix.

    Rule: docs/formats.md#reading-the-committed-region, docs/formats.md#appends-and-reads.

    Attributes:
        byte_offset: JSONL: bytes of the file that stay (the tail starts here; for zstd the
            start of the torn frame). SQLite: ``None``.
        line: JSONL: 1-based event line (header excluded) of the first bad record, or ``None``
            when the tail is a bare fragment after the last full line. SQLite: the rowid of the
            first bad row.
        reason: One sentence: what was found (unterminated record, unparsable line, seq gap…).
        recovered: Events recovered from a torn zstd frame
            (docs/formats.md#reading-the-committed-region). They are also the last events of
            ``ColdRead.events``, and the next write re-writes them (after truncating) in the same
            batch. Empty for raw JSONL and SQLite.
    """

    byte_offset: int | None
    line: int | None
    reason: str
    recovered: tuple[Event, ...] = ()


@dataclass(frozen=True, slots=True)
class ColdRead:
    """What a cold read of one stored session returns.

    Rule: docs/rules.md#the-read-pipeline, docs/rules.md#resume.

    Attributes:
        header: The stored header (``FrozenDict`` wire object, known keys only).
        events: The valid committed prefix with ``seq >= offset`` of the read, chunk rows
            expanded, in seq order. Not yet normalised, vocabulary-checked or repaired — that is
            the read pipeline's job (:mod:`dsh.persistence._read`).
        torn: ``None`` or the uncommitted tail after the prefix (truncated before the next
            write through a write handle).
        revision: Opaque string; equal revisions mean the stored bytes did not change.
        prescan: Optional, for backends that decode in C: ``(legacy_at, unknown_at)``, the
            index in ``events`` of the first event legacy normalisation could touch and of
            the first unknown type not marked ignorable (-1: none), exactly as
            ``dsh._speedups.stored_prescan(events, KNOWN_EVENT_TYPES)`` answers. Found while
            decoding, it spares the read pipeline a pass over the events; None: the
            pipeline looks itself.
        contiguous: True when the backend's decoding already required every event's seq to be
            an exact int equal to ``offset`` + its index (the JSONL scanner's and the SQLite
            row scan's rules, docs/formats.md#reading-the-committed-region and
            #appends-and-reads): the read pipeline's crash repair then does not check it
            again (docs/rules.md#the-read-pipeline). False: it checks.
    """

    header: FrozenDict
    events: tuple[Event, ...]
    torn: TornTail | None
    revision: str
    prescan: tuple[int, int] | None = None
    contiguous: bool = False


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """One row of ``Persistence.list()`` (docs/stores.md#opening-a-store).

    Attributes:
        id: Session id.
        header: Stored header.
        event_count: Committed events (torn tail excluded).
        last_activity_ms: ``time`` of the last committed event, else header ``createdAt``
            (epoch ms).
        title: Last ``session/title`` title, else the first line of the first typed
            ``user/message`` (first 80 characters), else ``None``; only of what the model
            view still holds (docs/forgetting.md#what-titles-show).
    """

    id: str
    header: FrozenDict
    event_count: int
    last_activity_ms: int
    title: str | None


@runtime_checkable
class Handle(Protocol):
    """An open session in one backend (docs/rules.md#resume, docs/stores.md#the-backend-contract).

    A handle is used from one thread at a time. ``"write"`` handles hold the session's
    exclusive lock until :meth:`close`.
    """

    @property
    def session_id(self) -> str:
        """The session id this handle was opened for."""
        ...

    @property
    def mode(self) -> OpenMode:
        """``"read"`` or ``"write"``."""
        ...

    def read(self, offset: int = 0) -> ColdRead:
        """Read the stored header and the committed events with ``seq >= offset``.

        Args:
            offset: First event seq wanted (an event seq, not a byte offset), ``>= 0``.

        Returns:
            ColdRead: header, events (chunk rows expanded), torn tail or ``None``, revision.

        Raises:
            ConfigError: ``offset`` is not a non-negative integer.
            LogCorruptError: the committed region is damaged (path, line, byte offset).
            SessionFormatUnsupportedError: the stored format version is not 0.
            SessionNotFoundError: the session vanished.
        """
        ...

    def append(self, events: Sequence[Event]) -> None:
        """Append one atomic batch (one JSONL write or zstd frame, one SQLite transaction).

        The first event's seq must equal the stored event count; seqs must be contiguous.
        Events are validated as lossless JSON first (nothing is written on failure). A torn
        tail is truncated before the first write; events recovered from a torn zstd frame
        (``TornTail.recovered``) are re-written in the same batch, ahead of ``events``. An empty
        batch writes no events but still truncates a torn tail (that is how a repair without
        closers is committed).

        Raises:
            PersistenceError: the handle is read-only or closed, or seq does not continue the
                stored tail (``LogCorruptError`` when the stored log itself is damaged).
            InvalidJsonError: an event holds a value that is not lossless JSON.
            OSError: the write failed; partial bytes were rolled back.
        """
        ...

    def flush(self) -> None:
        """Durability barrier: everything appended so far is on stable storage on return.

        Raises:
            OSError: the sync failed; the batches appended since the last successful flush
                were removed again (file and seq count), so re-appending them continues the
                seq exactly (JSONL; a backend whose ``append`` is already durable never fails
                here).
        """
        ...

    def close(self) -> None:
        """Flush-free release of the handle and its lock; idempotent."""
        ...

    def __enter__(self) -> Handle:
        """Return ``self``."""
        ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Close the handle."""
        ...


class HandleBase:
    """Shared plumbing of the bundled handles: identity properties and ``with`` support.

    Subclasses set ``_id`` and ``_mode`` and implement ``close()``.
    """

    _id: str
    _mode: OpenMode

    @property
    def session_id(self) -> str:
        """The session id."""
        return self._id

    @property
    def mode(self) -> OpenMode:
        """``"read"`` or ``"write"``."""
        return self._mode

    def close(self) -> None:  # pragma: no cover - every subclass overrides it
        """Release the handle."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """What a backend offers beyond the :class:`Backend` and :class:`Handle` contract.

    A backend declares these (its ``capabilities`` attribute); the coordinator branches on
    them and never probes a backend's class or attributes. Each flag set promises the
    protocol it names; ``Capabilities()`` (every flag False) is a plain backend, which the
    coordinator serves by full reads. Rule: docs/stores.md#capabilities.

    Attributes:
        restore_points: Its handles keep restore points
            (:class:`~dsh.persistence._restore_point.KeepsRestorePoints`): a resume reads only
            the tail after the last one, and the writer writes them.
        fenced: Its write handles carry a fencing epoch (:class:`Fenced`).
        saved_cuts: It saves what a torn-tail repair cuts (:class:`KeepsCuts`).
        listing: It lists ``dsh ls`` entries itself, without reading every log
            (:class:`ListsEntries`).
        native_tail: It follows a log itself (:class:`Tails`), e.g. woken by ``NOTIFY``;
            otherwise a tail polls read handles.
        file_paths: Its handles name the file they read (:class:`NamesFiles`), for messages.
        ranges: Its read handles serve any seq range from storage (:class:`ReadsRanges`):
            a log without a restore point is still read by page.
        after_commit: Its write handles record the failures of their own steps after a
            durable batch (seal, listing journal, anchor) for the writer to report
            (:class:`~dsh.persistence._after_commit.RecordsAfterCommit`).
        search_index: It keeps a full-text search index
            (:class:`~dsh.persistence._search.IndexesSearch`); otherwise a search reads every log.
        schema_version: Its storage has a schema version (:class:`SchemaVersioned`).
        migrations: It applies versioned schema migrations on request (:class:`Migrates`,
            ``dsh migrate``); otherwise there is nothing to migrate.
        storable_check: It refuses, before anything is written, events its layout cannot hold
            (:class:`ChecksStorable`), which ``dsh convert`` asks first.
        torn_tail_hook: Test hook: it can leave a never-committed partial record after a log
            (:class:`InjectsTornTail`), for ``dsh.testing``'s damage tests; otherwise those
            tests are skipped.
        reseal: It keeps integrity seals and rebuilds a lost one on request (:class:`Reseals`),
            for ``dsh verify --reseal``.
        rewrites: Its write handles replace a stored log in place (:class:`Rewrites`), which
            redaction and erasure need; otherwise they refuse the store (``UNSUPPORTED``).
        scrubs: Its write handles scrub the storage a rewrite freed (:class:`Scrubs`: SQLite's
            WAL and free pages, PostgreSQL's dead tuples); otherwise a rewrite leaves nothing
            behind to scrub.
        asides: It keeps small derived blobs beside a session's log (:class:`KeepsAsides`),
            for readers that verify them against the log (an adapter's index); otherwise a
            reader derives them from the log each time.
        whole_reads: It opens and reads a session's committed log in one step
            (:class:`ReadsWhole`: one round trip on PostgreSQL, the lookup answered by the
            read itself), which a plain read (``Persistence.read``) uses; otherwise a read
            opens a read handle and reads through it.
        chain_records: It keeps each session's seal chain in its own storage, not in a seal
            file (:class:`KeepsChain`), for ``dsh verify`` and ``--proof``.
        change_stamp: It tells cheaply whether the store changed (:class:`StampsChanges`),
            which ``dsh view`` asks before reusing a listing; otherwise it lists anew.
    """

    restore_points: bool = False
    fenced: bool = False
    saved_cuts: bool = False
    listing: bool = False
    native_tail: bool = False
    file_paths: bool = False
    ranges: bool = False
    after_commit: bool = False
    search_index: bool = False
    schema_version: bool = False
    migrations: bool = False
    storable_check: bool = False
    torn_tail_hook: bool = False
    reseal: bool = False
    rewrites: bool = False
    scrubs: bool = False
    asides: bool = False
    whole_reads: bool = False
    chain_records: bool = False
    change_stamp: bool = False


@runtime_checkable
class Backend(Protocol):
    """One storage location holding many sessions.

    Rule: docs/stores.md#the-backend-contract, docs/rules.md#resume.
    """

    @property
    def url(self) -> str:
        """The store URL this backend was opened from (``jsonl:///dir``, ``sqlite:///x.db``…)."""
        ...

    @property
    def capabilities(self) -> Capabilities:
        """What it offers beyond this contract (:class:`Capabilities`), declared up front."""
        ...

    def create(self, header: Mapping[str, object]) -> None:
        """Store a new session with ``header`` and no events.

        Raises:
            SessionExistsError: a session with ``header["id"]`` is already stored.
            EventRejectedError: the header is not a valid ``SessionHeader``.
        """
        ...

    def open(self, session_id: str, mode: OpenMode = "read") -> Handle:
        """Open a stored session.

        Raises:
            SessionNotFoundError: no such session.
            SessionBusyError: ``mode == "write"`` and another writer holds it (pid, host, since).
        """
        ...

    def exists(self, session_id: str) -> bool:
        """Return whether a session with this id is stored."""
        ...

    def list_headers(self) -> Iterator[FrozenDict]:
        """Yield the header of every stored session (order: backend's own)."""
        ...

    def close(self) -> None:
        """Release backend resources (connections, caches); idempotent."""
        ...


@runtime_checkable
class Fenced(Protocol):
    """A write handle with a fencing epoch (PostgreSQL's lease): a declared capability.

    The epoch grows each time a writer takes the session; a batch from an older epoch is
    refused. Backends without one (a file lock cannot be taken over) count as epoch 0.
    """

    @property
    def epoch(self) -> int | None:
        """The fencing epoch of this write handle, or None for a read handle."""
        ...


@runtime_checkable
class KeepsCuts(Protocol):
    """A backend that saves what a torn-tail repair cuts beside the log.

    Rule: docs/rules.md#crash-safety.
    """

    def saved_cuts(self, session_id: str) -> list[str]:
        """Paths of the files holding bytes or rows cut from this session, oldest first."""
        ...


@dataclass(frozen=True, slots=True)
class KeptChain:
    """A session's seal chain as a store keeps it itself, read in one snapshot.

    Attributes:
        where: Where it is kept, for messages (``<url> table <schema>.chain``).
        incarnation: The session incarnation the records must bind.
        records: The records in batch order, each hash recomputed from its stored hashed part.
        stored: The hash stored beside each record (never trusted: compared with the
            recomputed one, a difference is a changed record).
        batches: The chain head the session row holds: how many records were appended.
        head: The hash of the last record appended, as the session row holds it (zeros for
            none); moved by the statement that inserted that record.
    """

    where: str
    incarnation: str
    records: list[ChainRecord]
    stored: tuple[bytes, ...]
    batches: int
    head: bytes


@runtime_checkable
class KeepsChain(Protocol):
    """A backend that keeps each session's seal chain itself (PostgreSQL: table ``chain``).

    Rule: docs/formats.md#the-seal-chain.
    """

    def chain_records(self, session_id: str) -> KeptChain:
        """Where the chain is kept (for messages), the incarnation it binds, its records and head.

        The records are in batch order, each hash recomputed from its stored hashed part
        (a stored hash is never trusted); links, stored hashes and the head are not checked
        here (``prove_chain`` does).

        Raises:
            SessionNotFoundError: no such session.
            LogCorruptError: a stored record is too short to be one.
        """
        ...


class Resealed(NamedTuple):
    """What ``Reseals.reseal`` did: the seal file, and whether the present seal was kept.

    ``extended``: the kept seal covered part of the log only; records for the committed
    bytes or rows past its end, and one chain record for the events past its chain's end,
    were added to it (docs/formats.md#integrity-seals).
    """

    path: str
    kept: bool
    extended: bool = False


@runtime_checkable
class Reseals(Protocol):
    """A backend that keeps integrity seals and rebuilds a lost one only when asked.

    Rule: docs/formats.md#integrity-seals.
    """

    def reseal(self, session_id: str) -> Resealed:
        """Seal the session's committed log as it is now; return the seal file and what was done.

        A log that passes its present seal keeps that seal and its chain (``kept``); when the
        seal covers part of the log only (another program appended, or the seal lost records
        its head did not count), records for the rest are added to it (``extended``), its
        chain going on. Otherwise a new seal with a new chain replaces it.

        Raises:
            SessionBusyError: a writer holds the session.
            LogCorruptError: the log breaks the format's own rules, or its seal is present and
                readable and the log fails it (nothing is sealed).
        """
        ...

    def seal_chain(self, session_id: str) -> tuple[str, str]:
        """The session's seal file and the incarnation its chain binds.

        JSONL: the header line's digest (Zstandard: its chain sidecar and the header frame's
        digest); SQLite: the row's incarnation. For ``dsh verify --proof``
        (docs/formats.md#the-seal-chain).

        Raises:
            SessionNotFoundError: no such session.
        """
        ...


@runtime_checkable
class Rewrites(Protocol):
    """A write handle that replaces its stored log: redaction and erasure only.

    Rule: docs/forgetting.md#erasure.
    """

    def rewrite(self, events: Sequence[Event], *, scrub: bool = True
                ) -> list[dict[str, object]]:
        """Replace the stored log by ``events`` atomically; return what was touched.

        ``scrub`` False leaves the scrub of freed storage to the caller (one for many).

        Raises:
            PersistenceError, LeaseLostError: the rewrite failed; the old log is intact.
        """
        ...


@runtime_checkable
class Scrubs(Protocol):
    """A write handle that scrubs the storage a rewrite freed.

    Rule: docs/forgetting.md#what-forgetting-cannot-reach.
    """

    def scrub(self) -> list[dict[str, object]]:
        """Scrub now; a failure is reported in the returned list, never raised."""
        ...


@runtime_checkable
class KeepsAsides(Protocol):
    """A backend that keeps small derived blobs ("asides") beside a session's log.

    An aside is never the truth: its reader checks it against the log and derives it again
    when it is missing or stale. Writing one never touches the log, and a failure to write one
    loses nothing. Rule: docs/stores.md#asides.
    """

    def read_aside(self, session_id: str, name: str, *, head: bool = False) -> bytes | None:
        """The bytes last written as ``name`` for the session, or None when there are none.

        ``head``: only its head, the bytes up to and including the first newline (``b""``
        when it has none), read without the rest (docs/stores.md#asides).
        """
        ...

    def write_aside(self, session_id: str, name: str, data: bytes) -> None:
        """Replace the aside ``name`` of the session by ``data`` (atomically, not fsynced).

        Raises:
            OSError, PersistenceError: it could not be written (the old one, if any, stays).
        """
        ...

    def drop_asides(self, session_id: str) -> None:
        """Delete every aside of the session (an erasure; nothing there is fine)."""
        ...


@runtime_checkable
class ReadsRanges(Protocol):
    """A read handle that serves any seq range from storage (a viewer's page, O(page)).

    What lets :func:`dsh.persistence.read_pages` page a log that has no restore point
    (docs/stores.md#reading-by-page): ``read(offset)`` gives the tail, :meth:`range_source`
    the events before it.
    """

    def last_stored_seq(self) -> int:
        """A cheap lower bound of the last stored seq (-1: no rows): where a tail read starts.

        It may count a torn row (``read`` then reports the torn tail) and may be below the last
        member of a packed row (``read(offset)`` returns every event from ``offset`` on).
        """
        ...

    def range_source(self, cut: int) -> Any:
        """An event source (``len`` = ``cut``, ``read(start, stop)``) over seqs ``0 .. cut - 1``.

        None when this store cannot serve ranges (a SQLite file of schema 14). The source
        reads storage on its own (no use of this handle after it is closed) and raises
        ``LogCorruptError`` when the rows no longer decode to contiguous events.
        """
        ...


@runtime_checkable
class StampsChanges(Protocol):
    """A backend that tells cheaply whether anything in the store changed (a viewer's cache).

    Rule: docs/view.md#what-the-viewer-keeps: a cached listing is reused only while the stamp
    is the same.
    """

    def change_stamp(self) -> object:
        """A value that differs once dsh changed the store; equal values mean no such change.

        A change: a session rewritten (redaction, erasure), created, removed or moved to the
        trash, and (except on JSONL, see its backend) appended to. One cheap read (a few
        ``stat`` calls, one pragma or one small query), never a log.

        Raises:
            PersistenceError: the store cannot be read.
        """
        ...


@runtime_checkable
class ReadsWhole(Protocol):
    """A backend that opens and reads a whole session in one step (``Capabilities.whole_reads``)."""

    def read_whole(self, session_id: str) -> ColdRead:
        """What ``open(session_id, "read")`` then ``read(0)`` would return, in one step.

        Raises:
            SessionNotFoundError: no such session.
            LogCorruptError, SessionFormatUnsupportedError: as :meth:`Handle.read` raises them.
        """
        ...


@runtime_checkable
class ListsEntries(Protocol):
    """A backend that lists ``dsh ls`` entries itself (``Capabilities.listing``)."""

    def list_entries(self, read: ReadFn) -> tuple[list[ListingEntry], list[DshError]]:
        """Every stored session with at least one event, as ``dsh ls`` shows it.

        Args:
            read: The coordinator's full read of one session (the cold-read pipeline), for
                the logs the backend cannot answer for from its own index or tables.

        Returns:
            The entries (the backend's order), and one error per log that could not be read
            (``where["session_id"]`` names it).
        """
        ...

    def list_activity(self, read: ReadFn) -> tuple[list[tuple[FrozenDict, int]], list[DshError]]:
        """``(header, last_activity_ms)`` of every session with at least one event, fast.

        What retention needs of a listing (docs/forgetting.md#retention): the same headers
        and ``last_activity_ms`` as :meth:`list_entries`, with nothing else computed.
        """
        ...


@runtime_checkable
class Tails(Protocol):
    """A backend that follows a log itself (``Capabilities.native_tail``)."""

    def tail(self, session_id: str, from_seq: int = 0, *,
             poll_ms: int = ...) -> AsyncIterator[Event]:
        """The events from ``from_seq`` on, then each new commit, forever, none twice."""
        ...


@runtime_checkable
class HoldsResume(Protocol):
    """A write handle whose resume can open the transaction its next append commits.

    For a caller that appends at once after resuming (an adapter's first write): the
    resume's reads and checks and the append are then one write transaction, so nothing
    another connection commits can fall between them (docs/rules.md#resume).
    """

    def hold_for_append(self) -> None:
        """Make the next restore-point read open the write transaction the next append commits.

        The transaction, once open, ends at that append (committed with its rows), at any
        other method of the handle, at :meth:`release_hold`, or at close (nothing written).
        """
        ...

    def release_hold(self) -> None:
        """End a transaction :meth:`hold_for_append` opened that no append took; idempotent."""
        ...


@runtime_checkable
class NamesFiles(Protocol):
    """A handle that reads one file (``Capabilities.file_paths``)."""

    @property
    def path(self) -> Path:
        """The file the handle reads."""
        ...


@runtime_checkable
class SchemaVersioned(Protocol):
    """A backend whose storage has a schema version (``Capabilities.schema_version``)."""

    @property
    def schema_version(self) -> int | None:
        """The storage's schema version (None: not created yet)."""
        ...


@runtime_checkable
class Migrates(Protocol):
    """A backend with versioned schema migrations (``Capabilities.migrations``)."""

    def migrate(self) -> int:
        """Apply pending migrations now (forward only); return the schema version reached.

        Raises:
            SessionFormatUnsupportedError: the store is newer than this build.
            PersistenceError: the database failed.
        """
        ...


@runtime_checkable
class ChecksStorable(Protocol):
    """A backend whose layout cannot hold every valid log (``Capabilities.storable_check``)."""

    def check_storable(self, events: Sequence[Event]) -> None:
        """Refuse, writing nothing, events this store cannot hold (what ``append`` would).

        Raises:
            EventRejectedError: an event this layout cannot hold (its seq named).
        """
        ...


@runtime_checkable
class InjectsTornTail(Protocol):
    """A backend that can damage a log as a crashed writer would (``torn_tail_hook``)."""

    def inject_torn_tail(self, session_id: str) -> None:
        """Test hook: leave a never-committed partial record after the session's log.

        Raises:
            SessionNotFoundError: no such session.
        """
        ...

STORE_LOG_ID: Final = ".dsh-store-log"
"""Id of the store log: the session that records what the store trashed, restored, archived,
erased and purged, and its retention policies (docs/forgetting.md#the-store-log). Reserved:
the facade's listings (``list_headers``, ``list``, ``list_entries``) leave it out."""

MAX_ID_SEGMENT_BYTES = 255
"""Longest storage form of a session id (its JSONL folder name; most file systems' limit)."""


def conforms(obj: object, protocol: type[_P]) -> TypeGuard[_P]:
    """``isinstance(obj, protocol)`` for a runtime-checkable protocol of methods, per class.

    A protocol check walks the protocol's members on every call (0.02-0.07 ms the first
    time in a process, 0.005-0.01 after): a cold read asks twice per open. The answer of
    a protocol of methods depends on the class alone, so it is decided once per class;
    objects that take methods as instance attributes are not served here. Nor is a wrapper
    that forwards them through ``__getattr__``: it gets False where ``isinstance`` would say
    True (its class has none of the methods). The answers are kept by class, weakly: a class
    no longer used is not kept alive by them.

    The class is checked by typing's rule for a protocol of methods, applied here: each member
    the protocol declares (:func:`_members`) is in the ``__dict__`` of a class of its MRO, and
    not None in the first one that has it. ``issubclass`` gives the same answer through the
    ABC machinery (each subclass of the protocol asked too) and typing's member scan: 0.1 ms
    of a fresh process's cold open, which asks twice; this check costs about half.
    """
    cls: Any = type(obj)  # (classes are hashable; typeshed's type[object] says otherwise)
    asked: Any = protocol
    return _class_conforms(cls, asked)


_CONFORMS: weakref.WeakKeyDictionary[type, dict[type, bool]] = weakref.WeakKeyDictionary()
"""``conforms``' answers: class -> protocol -> whether the class has its methods."""


def _class_conforms(cls: type, protocol: type) -> bool:
    answers = _CONFORMS.get(cls)
    if answers is None:
        answers = _CONFORMS.setdefault(cls, {})
    answer = answers.get(protocol)
    if answer is None:
        spaces = [vars(base) for base in cls.__mro__]
        # (the first class of the MRO that names a member decides: None there blocks it)
        answers[protocol] = answer = all(
            next((space[name] for space in spaces if name in space), None) is not None
            for name in _members(protocol))
    return answer


_MEMBERS: weakref.WeakKeyDictionary[type, frozenset[str]] = weakref.WeakKeyDictionary()
"""The members of each protocol ``conforms`` was asked about (see :func:`_members`)."""

_NOT_MEMBERS: Final = frozenset({
    "_MutableMapping__marker", "__abstractmethods__", "__annotations__", "__class_getitem__",
    "__dict__", "__doc__", "__final__", "__init__", "__module__", "__new__", "__orig_bases__",
    "__orig_class__", "__parameters__", "__slots__", "__subclasshook__", "__weakref__",
    "_is_protocol", "_is_runtime_protocol", "__protocol_attrs__", "__type_params__",
    "__non_callable_proto_members__", "__callable_proto_members_only__", "__qualname__",
    "__firstlineno__", "__static_attributes__", "__annotate__", "__annotate_func__",
    "__annotations_cache__"})
"""Names a protocol class holds that are not its members (typing's own list, 3.11-3.14)."""


def _members(protocol: type) -> frozenset[str]:
    """The names ``protocol`` declares (methods and annotations), as typing collects them.

    Every class of its MRO but ``object``, ``Protocol`` and ``Generic``: the names in its
    ``__dict__`` and its annotations, minus ``_abc_*`` and :data:`_NOT_MEMBERS`.
    """
    members = _MEMBERS.get(protocol)
    if members is None:
        names: set[str] = set()
        for base in protocol.__mro__[:-1]:
            if base.__name__ in ("Protocol", "Generic"):
                continue
            names.update(vars(base))
            names.update(vars(base).get("__annotations__", {}))
        members = _MEMBERS[protocol] = frozenset(
            name for name in names if not name.startswith("_abc_") and name not in _NOT_MEMBERS)
    return members


def session_id_problem(session_id: str) -> str | None:
    """Why ``session_id`` cannot name a session on every backend, or ``None`` when it can.

    One rule for all backends, so a session can move between them (``dsh convert``): the id
    is a non-empty string, valid Unicode (no lone surrogate: SQLite and PostgreSQL store
    UTF-8), and its path-segment encoding (the JSONL folder name,
    docs/formats.md#layout-and-path-encoding: a non-``[A-Za-z0-9._-]`` UTF-16 unit takes 5 bytes) is
    at most 255 bytes.
    """
    from dsh.persistence._paths import encode_segment

    if not session_id:
        return "it is empty"
    try:
        session_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"it holds a lone surrogate at index {exc.start}"
    size = len(encode_segment(session_id))
    if size > MAX_ID_SEGMENT_BYTES:
        return (f"its folder name would be {size} bytes, over {MAX_ID_SEGMENT_BYTES}; characters "
                f"outside A-Z a-z 0-9 . _ - take 5 bytes each")
    return None


def check_session_id(session_id: str) -> None:
    """Refuse an id no backend can store (see :func:`session_id_problem`).

    Raises:
        ConfigError: code ``INVALID_ID``, saying why.
    """
    problem = session_id_problem(session_id) if type(session_id) is str else "not a string"
    if problem is not None:
        from dsh._errors import ConfigError

        raise ConfigError(f"session id {session_id!r} cannot name a stored session: {problem}",
                          code="INVALID_ID")


def normalize_header(header: Mapping[str, object]) -> FrozenDict:
    """Validate a ``SessionHeader`` for storage and return its known keys, frozen, in order.

    Rules (docs/formats.md#the-session-header, docs/rules.md#persistence): a mapping; ``version`` an
        integer (a foreign version is
    stored as given and refused on load, like dsh); ``id`` a non-empty string; ``createdAt`` a
    non-negative safe integer (epoch ms); ``cwd`` an absolute path string; ``parentSession`` and
    ``agentPreset`` strings; ``seedLength`` and ``delegationDepth`` non-negative safe integers;
    ``origin`` exactly ``"subagent"``; ``metadata`` a mapping of at most 32 keys (names of 1 to
    64 characters ``A-Z a-z 0-9 _ . -``) to strings (at most 1,024 characters), safe integers
    or booleans (docs/formats.md#header-metadata). Absent and ``None`` optional fields are
    dropped; other unknown keys are dropped (backends reconstruct only the known keys).

    Raises:
        EventRejectedError: code ``HEADER``, naming the field and the value found.
    """
    from pathlib import PurePosixPath, PureWindowsPath

    from dsh._errors import EventRejectedError
    from dsh.json import is_safe_int

    def bad(field: str, expected: str, found: object) -> EventRejectedError:
        return EventRejectedError(
            f"session header {field} must be {expected}, got {found!r}", code="HEADER",
            json_path=f"$.{field}")

    if not isinstance(header, Mapping):
        raise bad("(header)", "a mapping", type(header).__name__)
    out: dict[str, object] = {}
    version = header.get("version")
    if not is_safe_int(version):
        raise bad("version", "an integer", version)
    out["version"] = version
    sid = header.get("id")
    if type(sid) is not str or not sid:
        raise bad("id", "a non-empty string", sid)
    problem = session_id_problem(sid)
    if problem is not None:
        raise bad("id", f"storable on every backend ({problem})", sid)
    out["id"] = sid
    created = header.get("createdAt")
    if not is_safe_int(created) or created < 0:  # type: ignore[operator]
        raise bad("createdAt", "a non-negative safe integer (epoch ms)", created)
    out["createdAt"] = created
    for key in HEADER_KEYS[3:]:
        value = header.get(key)
        if value is None:
            continue
        if key == "cwd":
            if type(value) is not str or not (PurePosixPath(value).is_absolute()
                                              or PureWindowsPath(value).is_absolute()):
                raise bad(key, "an absolute path", value)
        elif key in ("parentSession", "agentPreset"):
            if type(value) is not str:
                raise bad(key, "a string", value)
        elif key in ("seedLength", "delegationDepth"):
            if not is_safe_int(value) or value < 0:  # type: ignore[operator]
                raise bad(key, "a non-negative safe integer", value)
        elif key == "origin" and value != "subagent":
            raise bad(key, '"subagent"', value)
        out[key] = value
    metadata = header.get("metadata")
    if metadata is not None:
        problem = metadata_problem(metadata)
        if problem is not None:
            raise bad("metadata", problem, metadata)
        checked: Mapping[str, Any] = metadata  # type: ignore[assignment]  # a Mapping, checked
        if checked:
            out["metadata"] = FrozenDict(sorted(checked.items()))
    return FrozenDict(out)


MAX_METADATA_KEYS: Final = 32
"""Most keys a header's ``metadata`` holds (docs/formats.md#header-metadata)."""

MAX_METADATA_VALUE_CHARS: Final = 1024
"""Longest string value in a header's ``metadata`` (characters)."""


def metadata_problem(metadata: object) -> str | None:
    """Why ``metadata`` is not a header's ``metadata`` object, or None when it is.

    Rule: docs/formats.md#header-metadata: a mapping of at most :data:`MAX_METADATA_KEYS`
    keys, each 1 to 64 characters of ``A-Z a-z 0-9 _ . -``, to a string of at most
    :data:`MAX_METADATA_VALUE_CHARS` characters, a safe integer or a boolean.
    """
    import re

    from dsh.json import is_safe_int

    if not isinstance(metadata, Mapping):
        return "a mapping of names to strings, integers or booleans"
    if len(metadata) > MAX_METADATA_KEYS:
        return f"at most {MAX_METADATA_KEYS} keys"
    for key, value in metadata.items():
        if type(key) is not str or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", key):
            return "keys of 1 to 64 characters A-Z a-z 0-9 _ . -"
        if type(value) is str:
            if len(value) > MAX_METADATA_VALUE_CHARS:
                return f"strings of at most {MAX_METADATA_VALUE_CHARS} characters"
        elif not (type(value) is bool or is_safe_int(value)):
            return "values that are strings, safe integers or booleans"
    return None


def format_version_refusal(session_id: object, version: object, *,
                           path: str | None = None) -> SessionFormatUnsupportedError:
    """Build the refusal for a foreign format version, naming the direction.

    Rule: docs/formats.md#the-session-header.

    Newer (``version > 0``): the log is intact and this dsh must be upgraded. Older or not an
    integer: no upgrade path ships. Neither says the log is corrupt.
    """
    from dsh.session import SESSION_FORMAT_VERSION

    sid = session_id if isinstance(session_id, str) else std_json.dumps(session_id)
    raw = f" (raw log: {path})" if path else ""
    if isinstance(version, int | float) and not isinstance(version, bool) \
            and version > SESSION_FORMAT_VERSION:
        message = (f'session "{sid}" uses log format v{version}, newer than the '
                   f"v{SESSION_FORMAT_VERSION} this dsh reads; the log is not damaged, upgrade "
                   f"dsh to open it{raw}")
        code = "FORMAT_NEWER"
    else:
        message = (f'session "{sid}" uses log format v{version}, older than the '
                   f"v{SESSION_FORMAT_VERSION} this dsh reads, and no upgrade path for it ships "
                   f"with this dsh{raw}")
        code = "FORMAT_OLDER"
    return SessionFormatUnsupportedError(
        message, code=code, session_id=sid, path=path,
        version=version if isinstance(version, int) and not isinstance(version, bool) else None)


def validate_batch(events: Sequence[Event], expected_seq: int, session_id: str) -> list[Event]:
    """Snapshot a batch as lossless JSON and check it continues the stored tail.

    The one check of ``Handle.append`` every bundled backend runs before any I/O (a batch
    the session built is checked once more here, cheaply: its values are already frozen).

    Args:
        events: The batch.
        expected_seq: The seq the first event must carry (stored event count).
        session_id: Named in errors.

    Returns:
        list[Event]: frozen, validated copies (frozen input is reused where possible).

    Raises:
        InvalidJsonError: a value is not lossless JSON; ``json_path`` names the field, prefixed
            with the batch index (``$[3].data.n``).
        PersistenceError: code ``SEQ_MISMATCH``: event ``i`` does not carry
            ``expected_seq + i``.
    Rule: docs/stores.md#the-backend-contract (snapshot at call time; contiguity).
    """
    from dsh._errors import InvalidJsonError, PersistenceError
    from dsh.session import Event

    out: list[Event] = []
    for i, event in enumerate(events):
        try:
            frozen = snapshot_json(event)
        except InvalidJsonError as exc:
            path = str(exc.where.get("json_path", "$"))
            raise InvalidJsonError(
                f"event {i} of the batch is not losslessly JSON-serializable: {exc.message}",
                code=exc.code, json_path=f"$[{i}]{path[1:]}", session_id=session_id) from exc
        if not isinstance(frozen, dict):
            raise PersistenceError(f"append batch item {i} is not an event object",
                                   code="NOT_AN_EVENT", session_id=session_id)
        seq = frozen.get("seq")
        if seq != expected_seq + i or type(seq) is not int:
            raise PersistenceError(
                f"append seq mismatch for session {session_id!r}: expected seq "
                f"{expected_seq + i} at batch index {i}, got {seq!r}", code="SEQ_MISMATCH",
                session_id=session_id, seq=seq if type(seq) is int else None)
        out.append(frozen if isinstance(frozen, Event) else Event(frozen))
    return out

"""An in-process backend for tests (runs the contract on ``memory``).

Rule: docs/stores.md#the-backend-contract.

Same contract as the disk backends: exclusive write handles (in this process only: nothing
outlives the process), contiguous appends validated as lossless JSON, a torn tail that the next
write through a write handle drops. :meth:`MemoryBackend.inject_torn_tail` plays the part of a
crashed writer.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from dsh._errors import (
    ConfigError,
    PersistenceError,
    SessionBusyError,
    SessionExistsError,
    SessionNotFoundError,
)
from dsh.json import FrozenDict
from dsh.persistence._contract import (
    Capabilities,
    ColdRead,
    HandleBase,
    OpenMode,
    TornTail,
    normalize_header,
    validate_batch,
)
from dsh.session import Event

__all__ = ["MemoryBackend", "MemoryHandle"]


@dataclass
class _Stored:
    header: FrozenDict
    events: list[Event] = field(default_factory=list)
    torn: TornTail | None = None
    generation: int = 0
    writer: tuple[int, str, int] | None = None  # pid, host, since (ms)


class MemoryHandle(HandleBase):
    """A handle on one :class:`MemoryBackend` session (contract: :class:`~.api.Handle`)."""

    def __init__(self, backend: MemoryBackend, session_id: str, mode: OpenMode) -> None:
        self._backend = backend
        self._id = session_id
        self._mode: OpenMode = mode
        self._closed = False



    def _stored(self) -> _Stored:
        if self._closed:
            raise PersistenceError(f"handle for session {self._id!r} is closed",
                                   code="HANDLE_CLOSED", session_id=self._id)
        stored = self._backend._sessions.get(self._id)
        if stored is None:
            raise SessionNotFoundError(f'session "{self._id}" not found', session_id=self._id)
        return stored

    def read(self, offset: int = 0) -> ColdRead:
        """Return header, committed events with ``seq >= offset``, torn tail, revision."""
        if type(offset) is not int or offset < 0:
            raise ConfigError(f"read offset must be a non-negative integer event seq, got "
                              f"{offset!r}", session_id=self._id)
        with self._backend._mutex:
            stored = self._stored()
            events = stored.events + list(stored.torn.recovered) if stored.torn else \
                stored.events
            return ColdRead(stored.header, tuple(events[offset:]), stored.torn,
                            self._backend._revision(stored))

    def append(self, events: Sequence[Event]) -> None:
        """Append one atomic batch (see :meth:`~.api.Handle.append`)."""
        if self._mode != "write":
            raise PersistenceError(f"cannot append to session {self._id!r} through a read "
                                   f"handle; open it with mode 'write'", code="READ_ONLY",
                                   session_id=self._id)
        with self._backend._mutex:
            stored = self._stored()
            recovered = list(stored.torn.recovered) if stored.torn else []
            batch = validate_batch(events, len(stored.events) + len(recovered), self._id)
            if stored.torn is not None:
                stored.torn = None
                stored.events.extend(recovered)
                stored.generation += 1
            if batch:
                stored.events.extend(batch)
                stored.generation += 1

    def flush(self) -> None:
        """Nothing to make durable in memory; checks the handle is open."""
        if self._closed:
            raise PersistenceError(f"handle for session {self._id!r} is closed",
                                   code="HANDLE_CLOSED", session_id=self._id)

    def close(self) -> None:
        """Release the handle (and write ownership); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._mode == "write":
            with self._backend._mutex:
                stored = self._backend._sessions.get(self._id)
                if stored is not None:
                    stored.writer = None



class MemoryBackend:
    """Sessions held in a dict; lost when the process ends (contract: :class:`~.api.Backend`).

    Args:
        url: The store URL (``memory:``).
    """

    capabilities = Capabilities(torn_tail_hook=True)
    """Only the torn-tail test hook: the coordinator serves it by full reads."""

    def __init__(self, url: str = "memory:") -> None:
        self._url = url
        self._sessions: dict[str, _Stored] = {}
        self._mutex = threading.RLock()
        self._incarnation = uuid.uuid4().hex[:12]
        self._counter = itertools.count()

    @property
    def url(self) -> str:
        """The store URL."""
        return self._url

    def _revision(self, stored: _Stored) -> str:
        return f"{self._incarnation}:{id(stored)}:{stored.generation}"

    def create(self, header: Mapping[str, object]) -> None:
        """Store a new session with no events (see :meth:`~.api.Backend.create`)."""
        frozen = normalize_header(header)
        with self._mutex:
            if frozen["id"] in self._sessions:
                raise SessionExistsError(f"session {frozen['id']!r} already exists in this "
                                         f"store", session_id=frozen["id"])
            self._sessions[frozen["id"]] = _Stored(frozen)

    def open(self, session_id: str, mode: OpenMode = "read") -> MemoryHandle:
        """Open a session; ``"write"`` is exclusive (see :meth:`~.api.Backend.open`)."""
        if mode not in ("read", "write"):
            raise PersistenceError(f"open mode must be 'read' or 'write', got {mode!r}",
                                   code="BAD_MODE", session_id=session_id)
        with self._mutex:
            stored = self._sessions.get(session_id)
            if stored is None:
                raise SessionNotFoundError(f'session "{session_id}" not found',
                                           session_id=session_id)
            if mode == "write":
                if stored.writer is not None:
                    pid, host, since = stored.writer
                    raise SessionBusyError(
                        f"session {session_id!r} is open for writing by this process (pid "
                        f"{pid}, host {host}, since {since} ms); only one writer at a time, "
                        f"close the other handle first", session_id=session_id, pid=pid,
                        host=host, since=since, holder="this process")
                stored.writer = (os.getpid(), socket.gethostname(), int(time.time() * 1000))
            return MemoryHandle(self, session_id, mode)

    def exists(self, session_id: str) -> bool:
        """Return whether the session is stored."""
        with self._mutex:
            return session_id in self._sessions

    def list_headers(self) -> Iterator[FrozenDict]:
        """Yield every stored header (creation order)."""
        with self._mutex:
            headers = [stored.header for stored in self._sessions.values()]
        yield from headers

    def inject_torn_tail(self, session_id: str, reason: str = "injected torn record",
                         recovered: Sequence[Event] = ()) -> None:
        """Test hook: pretend a writer crashed mid-record after the committed events."""
        with self._mutex:
            stored = self._sessions[session_id]
            stored.torn = TornTail(None, len(stored.events) + 1, reason, tuple(recovered))
            stored.generation += 1

    def close(self) -> None:
        """Nothing to release; idempotent."""

"""The front door: :func:`open` a store by URL and hold one :class:`Store`.

A :class:`Store` joins the two halves a user would otherwise hold apart: the live sessions of
this process (the core's session store, no I/O) and the persistence facade over the backend the
URL names (write-behind, cold reads, resume, listing, fork of stored logs). Closing it drains
every live session to disk and closes the backend.

The agent layer (``dsh.agent``) and asyncio load only when a method that needs them runs, so
``import dsh`` stays light.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from dsh._errors import DshError, SessionForkError, SessionNotFoundError
from dsh.json import FrozenDict
from dsh.persistence import Inspection, ListingEntry, Persistence, WriteBehind, open_backend
from dsh.session import Clock, Event, Session, SessionStore

if TYPE_CHECKING:
    from dsh.agent import Agent, Provider, Recorder, Tool
    from dsh.persistence import SearchResults, StoredPages


class Store:
    """One store of sessions, named by a URL: the object a dsh user holds.

    Made by :func:`dsh.open`. ``store.session(id)`` gives a session to append to (resumed
    from disk, or new); appends are written behind and :meth:`flush` is the durability
    barrier; :meth:`read`, :meth:`inspect`, :meth:`pages`, :meth:`tail` and :meth:`list` look
    at stored logs without writing; :meth:`fork` branches a session; :meth:`recorder` and
    :meth:`agent` put a recorder or an agent loop over a session. Use it as a context manager
    (``with`` or ``async with``): leaving the block drains every live session and closes the
    backend.
    A store never closed is drained at interpreter exit.

    Rule: docs/stores.md#opening-a-store.
    """

    __slots__ = ("_persistence", "_sessions")

    def __init__(self, url: str, *, write_behind: WriteBehind | None = None,
                 clock: Clock | None = None, create_schema: bool = True) -> None:
        self._persistence = Persistence(open_backend(url, create_schema=create_schema),
                                        write_behind=write_behind)
        self._sessions = SessionStore(persistence=self._persistence, clock=clock)

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<dsh.Store {self.url!r}{state}>"

    # what it is -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The store URL it was opened with."""
        return self._persistence.url

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` (or :meth:`aclose`) ran."""
        return self._sessions.closed

    @property
    def persistence(self) -> Persistence:
        """The persistence facade: handles, stored-session creation, repair, restore points.

        The level of ``dsh.persistence``'s backend contract, for tools that copy or import
        whole logs; a session's appends never need it.
        """
        return self._persistence

    @property
    def sessions(self) -> SessionStore:
        """The live sessions of this store (the core's session store, bound to persistence).

        What :class:`dsh.agent.Agent` and :class:`dsh.agent.Recorder` take as ``store``;
        :meth:`agent` and :meth:`recorder` pass it for you.
        """
        return self._sessions

    # sessions ---------------------------------------------------------------------------

    def session(self, session_id: str, *, header: Mapping[str, Any] | None = None) -> Session:
        """Return session ``session_id`` ready to append to: live, resumed, or new.

        The live session when this store holds it; else the stored log resumed (its write
        lock taken, an interrupted last turn closed by appending); else a new session created
        with ``header`` (``cwd``, ``origin``, ... ; ``createdAt`` defaults to now; a tenant or
        user id such as ``{"tenant": "acme"}`` is kept in the header's ``metadata``, which
        ``dsh erase --where`` and retention scopes match: docs/formats.md#header-metadata).

        Raises:
            SessionBusyError: another writer (thread or process) holds the session.
            ConfigError: the store is closed (``STORE_CLOSED``) or the id cannot be stored
                (``INVALID_ID``).
            LogCorruptError, SessionFormatUnsupportedError: the stored log cannot be resumed.

        Rule: docs/rules.md#resume.
        """
        return self._sessions.session(session_id, header=header)

    def flush(self, session: Session | str | None = None) -> None:
        """Wait until everything appended (to ``session``, or to every live one) is stored.

        Args:
            session: A live session or its id; None: every live session of this store.

        Raises:
            SessionNotFoundError: ``session`` is not live here (``SESSION_NOT_LIVE``).
            WriteFailedError: the backend failed to write (the events stay in memory; the
                first failure is raised after every session was tried).
        """
        failures: list[Exception] = []
        for live in self._targets(session):
            try:
                self._sessions.flush(live)
            except Exception as exc:  # collected: the other sessions are still flushed
                failures.append(exc)
        if failures:
            raise failures[0]

    async def aflush(self, session: Session | str | None = None) -> None:
        """Async twin of :meth:`flush`: the writes wait in a worker thread, not the loop.

        Raises:
            As :meth:`flush`.
        """
        failures: list[Exception] = []
        for live in self._targets(session):
            try:
                await self._sessions.aflush(live)
            except Exception as exc:  # collected: the other sessions are still flushed
                failures.append(exc)
        if failures:
            raise failures[0]

    def dispose(self, session: Session | str) -> None:
        """Let a live session go: its writes are drained to disk and its write lock released.

        For a process that serves many sessions one after another. The Session object stays
        readable; an append to it is refused (``SESSION_DISPOSED``), since nothing would save
        it; ``store.session(id)`` resumes it again.

        Raises:
            SessionNotFoundError: ``session`` is not live here (``SESSION_NOT_LIVE``).
            WriteFailedError: the final drain failed (the store retries it at close).
        """
        for live in self._targets(session):
            self._sessions.dispose(live)

    def _targets(self, session: Session | str | None) -> list[Session]:
        if session is None:
            return self._sessions.list()
        if isinstance(session, str):
            live = self._sessions.get(session)
            if live is None:
                raise SessionNotFoundError(f"session {session!r} is not live in this store "
                                           f"({self.url}); open it with store.session(id)",
                                           code="SESSION_NOT_LIVE", session_id=session)
            return [live]
        return [session]

    # reading stored logs ----------------------------------------------------------------

    def read(self, session_id: str) -> Inspection:
        """Read a stored session as it is on disk; nothing is written or locked.

        Returns:
            ``Inspection``: ``header``, ``stored_events`` (the committed log), ``closers``
            (what a resume would append to an interrupted last turn, in memory only),
            ``events`` (both), ``torn`` (a torn tail left on disk, or None). A session live
            in this store is read as stored: its unflushed events are not seen.

        Raises:
            SessionNotFoundError: no such stored session.
            LogCorruptError, SessionFormatUnsupportedError, UnknownEventTypeError: the log
                cannot be read (the error names the file or row and the seq).

        Rule: docs/rules.md#repair.
        """
        return self._persistence.read(session_id)

    def inspect(self, session_id: str) -> Inspection:
        """As :meth:`read`, plus the full restore validation; a live id gives its snapshot.

        Raises:
            As :meth:`read`; ``EventRejectedError`` or ``InvariantError`` when the stored
            log would not restore.
        """
        return self._persistence.inspect(session_id)

    def pages(self, session_id: str) -> StoredPages:
        """Open a stored session for reading by page; nothing is written or locked.

        Where the log has a restore point only its tail is read and the events before the cut
        are paged in from storage when indexed; without one, SQLite, PostgreSQL and raw JSONL
        logs are paged by seq range (each page checked against the log's integrity seal as it
        is read); otherwise (a Zstandard JSONL log without a restore point, a short log, any
        doubt) it is the full read. Memory stays bounded by the pages held (32 of 256 events),
        not the log.

        Returns:
            ``StoredPages``: ``header``; ``events`` (element ``i`` is seq ``i``, random access);
            ``closers`` (full reads only); ``torn``; ``revision``; ``paged``; ``restore`` (the
            restore point's state, for a model view folded from it, or None).

        Raises:
            SessionNotFoundError: no such stored session.
            LogCorruptError, SessionFormatUnsupportedError, UnknownEventTypeError: the log
                cannot be read; a page read later may raise them too (the page names the seq).

        Rule: docs/stores.md#reading-by-page.
        """
        from dsh.persistence import read_pages  # loads the restore-point reader on first use

        return read_pages(self._persistence, session_id)

    def header(self, session_id: str) -> FrozenDict | None:
        """The stored header of ``session_id`` without reading its log, or None when not stored.

        Raises:
            PersistenceError: the store itself cannot be listed.
        """
        if not self._persistence.exists(session_id):
            return None
        return next((h for h in self._persistence.list_headers() if h.get("id") == session_id),
                    None)

    def readable_prefix(self, session_id: str) -> tuple[Event, ...]:
        """The committed events readable before the log's first damage; never raises for damage.

        For showing a damaged session: a log that reads gives its committed events; a raw JSONL
        log refused at a line gives the events of the lines before it; any other refusal ``()``.

        Rule: docs/view.md#damaged-sessions.
        """
        from dsh.persistence import readable_prefix

        return readable_prefix(self._persistence, session_id)

    def exists(self, session_id: str) -> bool:
        """Whether ``session_id`` is stored (or live and created); an unstorable id never is."""
        return self._sessions.get(session_id) is not None or self._persistence.exists(
            session_id)

    def list(self, *, errors: list[DshError] | None = None,
             which: Literal["listed", "trash", "archived", "all"] = "listed"
             ) -> list[ListingEntry]:
        """What ``dsh ls`` shows of every stored session with at least one event.

        SQLite answers from its tables, JSONL from its listing index (kept at flush), so an
        unchanged store is listed without reading any log. The store log says which sessions
        are in the trash or archived (docs/forgetting.md#deletion-with-a-way-back).

        Args:
            errors: When given, the error of each session whose log cannot be read is appended
                to it (its ``where["session_id"]`` names the session) and the others are
                listed; when None, the first such error is raised.
            which: ``listed``: neither in the trash nor archived (an archived session with
                activity after its archiving is listed again); ``trash``: only the trash;
                ``archived``: only archived ones; ``all``: every stored session.

        Returns:
            One ``ListingEntry`` per session (``id``, ``header``, ``events``, ``turns``,
            ``last_activity_ms``, ``title``, ``first_prompt``, ``source_format``), newest
            activity first.

        Raises:
            PersistenceError: the store itself cannot be listed.
            DshError: with ``errors`` None, the first unreadable log's error.
        """
        entries, unreadable = self._persistence.list_entries()
        if unreadable:
            if errors is None:
                raise unreadable[0]
            errors.extend(unreadable)
        if which != "all":
            from dsh.rights import store_log

            state = store_log(self._persistence)
            if which == "trash":
                entries = [e for e in entries if e.id in state.trash]
            else:
                def archived(entry: ListingEntry) -> bool:
                    since = state.archived.get(entry.id)
                    return since is not None and entry.last_activity_ms <= since

                entries = [e for e in entries if e.id not in state.trash
                           and archived(e) == (which == "archived")]
        return sorted(entries, key=lambda e: (-e.last_activity_ms, e.id))

    def _mark_removed(self, found: SearchResults) -> SearchResults:
        """Mark each hit in a message that left the model view (docs/stores.md#search).

        The index keeps the messages as appended and knows nothing of a later clear, pop,
        delete or quarantine: only the sessions holding a hit and a removal or quarantine
        record are read, and of them what tells where the backend can pick it
        (:func:`~dsh.persistence.removal_marks`).
        """
        from dataclasses import replace

        from dsh.persistence import removal_marks

        # a session whose log cannot be read: its hits cannot be told live or removed; left
        # out and named, as the index leaves out a log it cannot read
        removed, unreadable = removal_marks(self._persistence,
                                            (hit.session_id for hit in found.hits))
        return replace(found, hits=tuple(
            replace(hit, removed=removed[hit.session_id].get(hit.seq))
            for hit in found.hits if hit.session_id in removed),
            unreadable=(*found.unreadable, *unreadable))

    def search(self, query: str, *, limit: int = 20, rebuild: bool = False,
               trash: bool = False,
               progress: Callable[[int, int, str], None] | None = None) -> SearchResults:
        """The messages of every stored session that hold all the words of ``query``.

        SQLite and JSONL stores answer from a full-text index (SQLite FTS5) kept beside them,
        PostgreSQL stores from full-text tables in their schema, each brought up to date with
        the logs that changed since the last search; a memory store reads every log. Live
        sessions are searched as stored (unflushed events are not seen). Sessions in the trash
        are left out, as ``list`` leaves them out, unless ``trash``;
        archived ones are searched (docs/stores.md#search).

        Args:
            query: Words to find, case- and diacritics-insensitively (the last also as a
                prefix); a query without a word finds nothing.
            limit: Hits returned at most.
            rebuild: Build the index again from every log.
            trash: Search the sessions in the trash too (their hits kept, and counted in
                ``sessions``).
            progress: Called as ``progress(done, total, session_id)`` before each session
                the index reads to catch up (all of them the first time); never when the
                index is current.

        Returns:
            ``SearchResults``: ``hits`` (each ``session_id``, ``seq``, ``role``, ``before``,
            ``match``, ``after``: raw session text, escape it to show it), ``sessions``
            (the number searched: the store log never counted, those in the trash only with
            ``trash``), ``reindexed``, ``unreadable`` (ids left out as unreadable, those in
            the trash only with ``trash``), ``indexed``.

        Raises:
            PersistenceError: the store itself cannot be listed.

        Rule: docs/stores.md#search.
        """
        from dataclasses import replace

        from dsh.persistence import search

        found = search(self._persistence, query, limit=limit, rebuild=rebuild,
                       progress=progress)
        found = self._mark_removed(found)
        if not found.sessions or not found.store_log:  # no store log, so no trash
            return found
        from dsh.rights import store_log

        state = store_log(self._persistence)
        if not state.records:
            return found
        trashed = {} if trash else state.trash
        asked = max(1, limit)
        kept = found.hits
        while trashed:  # the index knows no trash: ask for more until enough hits stay
            kept = tuple(hit for hit in found.hits if hit.session_id not in trashed)
            if len(kept) >= asked or len(found.hits) < max(asked, limit):
                break
            limit *= 4
            found = self._mark_removed(search(self._persistence, query, limit=limit))
        left_out = sum(1 for entry in trashed.values() if entry.purged_ms is None)
        return replace(found, hits=kept[:asked], sessions=max(0, found.sessions - left_out),
                       unreadable=tuple(s for s in found.unreadable if s not in trashed))

    def tail(self, session_id: str, from_seq: int = 0, *,
             poll_ms: int | None = None) -> AsyncIterator[Event]:
        """Follow a stored session: its events from ``from_seq`` on, then each new commit.

        An async iterator (``async for event in store.tail(id)``) that runs until the consumer
        stops; no seq is skipped or repeated. PostgreSQL wakes on a notification, the other
        backends look every ``poll_ms`` (ms, default 200).

        Raises:
            ConfigError: a negative ``from_seq`` or a bad ``poll_ms``.
            SessionNotFoundError, LogCorruptError: while iterating.
        """
        return self._persistence.tail(session_id, from_seq, poll_ms=poll_ms)

    # fork -------------------------------------------------------------------------------

    def fork(self, source_id: str, boundary: int | None = None, *,
             child_id: str | None = None,
             open_turn: Literal["close", "reject"] = "close") -> str:
        """Branch session ``source_id`` at seq ``boundary`` into a new stored session.

        The child's log is the parent's events ``0..boundary``, a ``session/end-seed
        {inherited: true}`` marker and, for a cut inside an open turn, closers with cause
        ``forked``; its header names the parent (``parentSession``, ``seedLength``). The
        parent is not written. A parent live in this store is forked from its live log (the
        child becomes live here too); a stored one is read from disk.

        Args:
            source_id: The parent.
            boundary: Inclusive seq of the cut; None: the parent's last event.
            child_id: The child's id; None: ``<source_id>-fork-<n>``, the smallest ``n >= 1``
                not taken.
            open_turn: ``"close"`` a turn left open at the cut, or ``"reject"`` such a cut.

        Returns:
            The child's id; ``store.session(child_id)`` appends to it.

        Raises:
            SessionForkError: ``SESSION_ALREADY_EXISTS``, ``INVALID_BOUNDARY``, ``OPEN_TURN``.
            SessionNotFoundError, LogCorruptError: the parent cannot be read.
            WriteFailedError: the child could not be written.

        Rule: docs/rules.md#fork.
        """
        if self._sessions.get(source_id) is None:
            return self._persistence.fork(source_id, boundary, child_id, open_turn=open_turn)
        if child_id is None:
            number = 1
            while self.exists(f"{source_id}-fork-{number}"):
                number += 1
            child_id = f"{source_id}-fork-{number}"
        elif self._persistence.exists(child_id):
            raise SessionForkError(f'session "{child_id}" already exists in {self.url}',
                                   code="SESSION_ALREADY_EXISTS", session_id=child_id)
        child = self._sessions.fork(source_id, boundary, child_id, open_turn=open_turn)
        self._sessions.flush(child)
        return child.id

    # recording and agents ---------------------------------------------------------------

    def recorder(self, session_id: str, *, header: Mapping[str, Any] | None = None,
                 flush_on_turn_end: bool = True) -> Recorder:
        """A :class:`dsh.agent.Recorder` over ``store.session(session_id)``, bound to this store.

        The way to log your own agent loop: ``with rec.turn() as turn, turn.step() as step``;
        each recorded turn is flushed when it ends (``flush_on_turn_end``).

        Raises:
            As :meth:`session`; ``AgentError`` (``RECORDER``) when the log ends inside an open
            turn no resume closed.
        """
        from dsh.agent import Recorder

        return Recorder(self.session(session_id, header=header), store=self._sessions,
                        flush_on_turn_end=flush_on_turn_end)

    async def agent(self, session_id: str | None = None, *, provider: Provider,
                    config: Mapping[str, Any], tools: Sequence[Tool] = (),
                    **options: Any) -> Agent:
        """An agent loop over session ``session_id``: the stored one resumed, or a new one.

        A session live in this store is taken as it is; a stored one is resumed off the event
        loop (write lock, cold read, the closers of an interrupted turn appended, the inbox
        rebuilt); an unknown id, or None (a new ``uuid4`` id), creates one.

        Args:
            session_id: The session; None: a new one.
            provider: The model backend (``dsh.agent.Provider``: one ``stream`` method).
            config: The request config ``{provider, model, reasoningEffort?, temperature?,
                maxTokens?, stop?}`` (logged as the ``request/header``).
            tools: Tools the model may call (``dsh.agent.tool``).
            **options: The other options of :class:`dsh.agent.Agent` (``system``,
                ``max_steps``, ``context_window``, ``timeout_ms`` for the resume, ...).

        Raises:
            SessionBusyError: another writer holds the session, or it is live here already.
            ConfigError: a bad option; the store is closed.
            LogCorruptError, SessionFormatUnsupportedError: the stored log cannot be resumed.
        """
        import uuid

        from dsh.agent import Agent

        settings = {"config": config, "tools": tools, **options}
        live = self._sessions.get(session_id) if session_id is not None else None
        if session_id is not None and live is None and self._persistence.exists(session_id):
            return await Agent.resume(self._sessions, session_id, provider, **settings)
        settings.pop("timeout_ms", None)
        if live is not None:
            return Agent(live, provider, store=self._sessions, **settings)
        return Agent.create(self._sessions, provider, session_id=session_id or str(uuid.uuid4()),
                            **settings)

    # teardown ---------------------------------------------------------------------------

    def close(self) -> None:
        """Drain every live session to disk, release its write lock, close the backend.

        Every step is attempted even when one fails; idempotent.

        Raises:
            WriteFailedError: a drain failed (the first failure; the events stay in memory).
        """
        self._sessions.close()

    async def aclose(self) -> None:
        """Async twin of :meth:`close`: the drain runs in a worker thread.

        Raises:
            As :meth:`close`.
        """
        import asyncio  # not at the top: `import dsh` stays free of asyncio

        await asyncio.to_thread(self.close)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()


def open(url: str, *, write_behind: WriteBehind | None = None,
         clock: Clock | None = None, create_schema: bool = True) -> Store:
    """Open the store at ``url``: the one object to hold (see :class:`Store`).

    Use it as a context manager: ``with dsh.open("sqlite:sessions.db") as store:``; leaving
    the block drains every live session to disk and closes the backend. Nothing is written
    until a session is created or appended to.

    Args:
        url: ``sqlite:///abs/path.db`` or ``sqlite:relative.db``; ``jsonl:///dir`` (or
            ``jsonl:relative/dir``), ``jsonl+zstd:///dir``; ``postgresql://user@host/db``
            (the ``postgres`` extra); ``memory:`` (this process only).
        write_behind: Batching of background writes (``WriteBehind(batch_window_ms=200)``).
        clock: Epoch-ms clock for new sessions and their events (default: wall clock).
        create_schema: PostgreSQL only: create the URL's ``?schema=`` (default ``dsh``) on
            first use when it holds no dsh store (default). With False nothing is created:
            the first use of a schema holding no dsh store raises ConfigError
            ``STORE_NOT_FOUND`` naming the schema (what a read-only tool wants). File stores
            ignore it (a SQLite file or JSONL folder is created by the first write).

    Returns:
        The open :class:`Store`.

    Raises:
        ConfigError: the URL is malformed, names an unknown scheme or option, or a path that
            cannot hold a store (the message names the part); ``STORE_NOT_FOUND`` at first use
            with ``create_schema=False``, as above.

    Rule: docs/stores.md#store-urls.
    """
    return Store(url, write_behind=write_behind, clock=clock, create_schema=create_schema)

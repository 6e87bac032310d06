"""dsh as a Pydantic AI conversation store: :class:`DshConversationStore`.

Implements ``pydantic_ai.conversation_store.ConversationStore`` (Pydantic AI 2.x), so a
conversation is loaded and saved around each run and kept as a dsh session log::

    store = DshConversationStore("sqlite:///sessions.db")
    conversation = await store.load("chat-1") or Conversation(conversation_id="chat-1")
    result = await agent.run("Hi!", conversation=conversation)
    await store.save(result)

Layout (one dsh session per line of history, all in one store):

* a conversation's messages are appended to its session as core events, exactly as
  :class:`~dsh.adapters.pydantic_ai.DshMessageHistory` records them (each message kept verbatim
  on its first event), so ``dsh show ID`` and ``dsh messages ID`` show the conversation;
* every write appends an ignorable ``pydantic-ai/record`` event holding the
  ``ConversationRecord`` (head, usage, deferred tool requests, scope, branches, revision) and the
  entries it stored: ``[entry id, parent id, seq of the event keeping the message, seq of the
  message's last event]``;
* the session is named after the conversation. A write whose history does not continue the
  session's last entry (a ``branch``, a rewritten history, a save after ``delete``) continues
  in a new session ``<id>~<n>``: a dsh fork of the session holding the entry it continues from,
  cut after that entry (an empty session when it continues from nothing). The session named
  after the conversation gets a ``pydantic-ai/moved {to}`` event, and the old line stays in
  its session, where the conversation's ``branches`` point. A ``fork`` to a new conversation is
  a dsh fork the same way;
* ``delete`` appends ``pydantic-ai/delete``: the conversation no longer loads or lists, and
  its messages leave the model view (a clear); the log keeps every message (dsh never removes
  committed bytes).

Each session a write touches is held for writing (exclusively, across processes) until
:meth:`DshConversationStore.close`; reads of other sessions are cold reads that write nothing.

Needs ``pip install 'dsh-session[pydantic-ai]'`` (a Pydantic AI with ``conversation_store``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from dsh._errors import AdapterError, AdapterLookupError, SessionNotFoundError
from dsh._install import install_hint
from dsh.adapters._log import LiveLog, default_store_url, open_store, records_of
from dsh.adapters.pydantic_ai import FORMAT, message_events
from dsh.json import snapshot_json, thaw
from dsh.persistence import Persistence
from dsh.session import Event

try:
    from pydantic import TypeAdapter
    from pydantic_ai.conversation_store import (
        ConversationConflict,
        ConversationEntry,
        ConversationRecord,
        ConversationStore,
    )
    from pydantic_ai.messages import ModelMessagesTypeAdapter
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("dsh.adapters.pydantic_ai_store needs a Pydantic AI with "
                      "pydantic_ai.conversation_store: "
                      f"{install_hint('pydantic-ai')} --upgrade") from exc

__all__ = ["DELETE_EVENT", "MOVED_EVENT", "RECORD_EVENT", "DshConversationStore"]

RECORD_EVENT: Final = f"{FORMAT}/record"
"""The ignorable event holding a ``ConversationRecord`` and the entries its write stored."""
DELETE_EVENT: Final = f"{FORMAT}/delete"
"""The ignorable event that deletes a conversation (its log stays)."""
MOVED_EVENT: Final = f"{FORMAT}/moved"
"""In the session named after a conversation: the session its history continues in."""

_RECORDS: Final = TypeAdapter(ConversationRecord)
_T = TypeVar("_T")
Located = tuple[str | None, int, int]  # parent entry id, holder seq, last seq


class _Line:
    """What one stored session holds for the store: its entries, and its last record."""

    def __init__(self) -> None:
        self.entries: dict[str, Located] = {}
        self.record: dict[str, Any] | None = None  # JSON of the last record; None: deleted
        self.conversation_id: str | None = None
        self.moved_to: str | None = None
        self.lines: list[str] = []  # every session a pydantic-ai/moved named, in order
        self.seen = 0  # events folded so far

    def fold(self, events: Sequence[Event]) -> None:
        for event in events[self.seen:]:
            kind = event["type"]
            if kind == RECORD_EVENT:
                data = event["data"]
                for entry_id, parent, holder, last in data["entries"]:
                    self.entries[entry_id] = (parent, holder, last)
                self.record = data["record"]
                self.conversation_id = data["record"]["conversation_id"]
            elif kind == DELETE_EVENT:
                self.record = None
            elif kind == MOVED_EVENT:
                self.moved_to = event["data"]["to"]
                self.lines.append(self.moved_to)
        self.seen = len(events)


class DshConversationStore(ConversationStore):
    """A Pydantic AI ``ConversationStore`` whose conversations are dsh session logs.

    Args:
        store: Store URL (``sqlite:///path.db``, ``jsonl:///dir``, ``memory:``); default
            ``sqlite:///$DSH_HOME/sessions.db``, the store the ``dsh`` command reads.

    Every method of the base class works (``load``, ``save``, ``branch``, ``fork``,
    ``list_conversations``, ``delete``); this class supplies its storage primitives. Also an
    async context manager (closes on exit).

    Raises:
        ConversationConflict: (from the primitives) a revision did not match, or a history
            continues from an entry the store does not have.
        AdapterError: ``ADAPTER_SESSION_ID`` when a conversation id names a session that
            belongs to another conversation's history; ``ADAPTER_ITEM`` when a message does not
            serialize to JSON dsh can store (nothing is written).
        AdapterLookupError: (from :meth:`read_entry`) no stored session holds the entry.
        SessionBusyError: another process holds a session this store must write.
    """

    def __init__(self, store: str | None = None) -> None:
        self.store_url = store if store is not None else default_store_url()
        self._reader: Persistence = open_store(self.store_url)
        self._logs: dict[str, LiveLog] = {}
        self._lines: dict[str, _Line] = {}
        self._cold: dict[str, tuple[Event, ...]] = {}
        self._where: dict[str, str] = {}  # entry id -> a session holding it
        self._lock = threading.RLock()

    # -- sessions ---------------------------------------------------------------------------

    def _events(self, session_id: str, *, fresh: bool = True) -> Sequence[Event] | None:
        """The events of a session (live if this store writes it), or None if it is not stored."""
        if session_id in self._logs:
            return self._logs[session_id].session.events
        if fresh or session_id not in self._cold:
            try:
                self._cold[session_id] = self._reader.read(session_id).stored_events
            except SessionNotFoundError:
                return None
        return self._cold[session_id]

    def _line(self, session_id: str, *, fresh: bool = True) -> _Line | None:
        events = self._events(session_id, fresh=fresh)
        if events is None:
            return None
        line = self._lines.get(session_id)
        if line is None or line.seen > len(events):
            line = self._lines[session_id] = _Line()
        line.fold(events)
        for entry_id in line.entries:
            self._where.setdefault(entry_id, session_id)
        return line

    def _writer(self, session_id: str) -> LiveLog:
        log = self._logs.get(session_id)
        if log is None:
            log = self._logs[session_id] = LiveLog(session_id, self.store_url, FORMAT,
                                                   type(self).__name__, persistence=self._reader)
            log.open()
            self._cold.pop(session_id, None)
        return log

    def _current(self, conversation_id: str) -> tuple[str, _Line] | None:
        """The session holding the conversation's history now, and what it holds."""
        home = self._line(conversation_id)
        if home is None:
            return None
        if home.conversation_id not in (None, conversation_id):
            return None  # the id names a session of another conversation's history
        if home.moved_to is None:
            return conversation_id, home
        line = self._line(home.moved_to)
        return (home.moved_to, line) if line is not None else None

    def _locate(self, entry_id: str) -> tuple[str, Located]:
        """The session holding ``entry_id`` and where; scans the store on a miss."""
        session_id = self._where.get(entry_id)
        if session_id is None:
            for header in self._reader.list_headers():
                self._line(str(header["id"]), fresh=False)
            session_id = self._where.get(entry_id)
        line = self._line(session_id, fresh=False) if session_id is not None else None
        if session_id is None or line is None or entry_id not in line.entries:
            raise AdapterLookupError(f"no conversation in {self.store_url} holds entry "
                                     f"{entry_id!r}", code="ADAPTER_ENTRY")
        return session_id, line.entries[entry_id]

    def _next_session(self, conversation_id: str) -> str:
        number = 2
        while self._reader.exists(f"{conversation_id}~{number}"):
            number += 1
        return f"{conversation_id}~{number}"

    def _start_line(self, session_id: str, parent: str | None) -> list[list[Any]]:
        """Create ``session_id`` continuing from entry ``parent``; return the entries it keeps."""
        if parent is None:
            self._writer(session_id)
            return []
        try:
            source, (_, _, last) = self._locate(parent)
        except AdapterLookupError:
            raise ConversationConflict(session_id) from None
        log = self._logs.pop(source, None)
        if log is not None:
            log.close()  # a stored fork reads the parent's log as stored: release it first
        self._reader.fork(source, last, session_id)
        line = self._line(source, fresh=False)
        assert line is not None
        kept: list[list[Any]] = []
        entry: str | None = parent
        while entry is not None:
            up, holder, end = line.entries[entry]
            kept.append([entry, up, holder, end])
            entry = up
        kept.reverse()
        self._writer(session_id)
        return kept

    # -- the storage primitives ---------------------------------------------------------------

    async def _run(self, work: Callable[[], _T]) -> _T:
        def locked() -> _T:
            with self._lock:
                return work()
        return await asyncio.to_thread(locked)

    def _stored_record(self, conversation_id: str) -> ConversationRecord | None:
        current = self._current(conversation_id)
        if current is None or current[1].record is None:
            return None
        return _RECORDS.validate_python(thaw(current[1].record))

    async def read_record(self, conversation_id: str) -> ConversationRecord | None:
        """The conversation's last record, or None (never stored, or deleted)."""
        return await self._run(lambda: self._stored_record(conversation_id))

    async def read_records(self, *, scope: str | None = None, limit: int | None = None
                           ) -> Sequence[ConversationRecord]:
        """Every conversation's record (or those of ``scope``), newest ``updated_at`` first."""
        def work() -> list[ConversationRecord]:
            records = [record for header in self._reader.list_headers()
                       if (record := self._stored_record(str(header["id"]))) is not None
                       and (scope is None or record.scope == scope)]
            records.sort(key=lambda record: record.updated_at, reverse=True)
            return records[:limit]
        return await self._run(work)

    async def write_record(self, record: ConversationRecord, *,
                           new_entries: Sequence[ConversationEntry] = (),
                           expected_revision: str | None) -> None:
        """Append ``new_entries``' messages and ``record`` to the conversation's session.

        Raises:
            ConversationConflict: the stored revision is not ``expected_revision``, or the
                history continues from an entry no session holds.
            AdapterError: ``ADAPTER_ITEM``, a message does not serialize (nothing written);
                ``ADAPTER_SESSION_ID``, the id names a session of another conversation.
        """
        conversation_id = record.conversation_id
        try:
            messages = ModelMessagesTypeAdapter.dump_python(
                [entry.message for entry in new_entries], mode="json", warnings="error")
            record_json = _RECORDS.dump_python(record, mode="json")
            snapshot_json([messages, record_json])
        except (TypeError, ValueError) as exc:
            raise AdapterError(f"conversation {conversation_id!r} does not serialize to JSON "
                               f"dsh can store ({exc}); nothing was written",
                               code="ADAPTER_ITEM", session_id=conversation_id) from exc

        def work() -> None:
            current = self._current(conversation_id)
            if current is None and self._reader.exists(conversation_id):
                raise AdapterError(f"conversation id {conversation_id!r} names a dsh session "
                                   f"that holds another conversation's history; pick another "
                                   f"id", code="ADAPTER_SESSION_ID", session_id=conversation_id)
            stored = current[1].record if current is not None else None
            if (stored["revision"] if stored is not None else None) != expected_revision:
                raise ConversationConflict(conversation_id)
            parent = new_entries[0].parent_id if new_entries else record.head_id
            kept: list[list[Any]] = []
            if current is not None and stored is not None and parent == stored["head_id"]:
                session_id = current[0]
            elif current is None:
                session_id = conversation_id
                kept = self._start_line(session_id, parent)
            else:
                session_id = self._next_session(conversation_id)
                kept = self._start_line(session_id, parent)
                self._writer(conversation_id).open().mark(MOVED_EVENT, {"to": session_id})
                self._writer(conversation_id).flush()
            log = self._writer(session_id)
            shaper = log.open()
            written = []
            for entry, message in zip(new_entries, messages, strict=True):
                holder, last = message_events(shaper, message)
                written.append([entry.id, entry.parent_id, holder, last])
            if not shaper.pending:
                shaper.end_turn()
            shaper.mark(RECORD_EVENT, {"record": record_json, "entries": kept + written})
            log.flush()
            self._line(session_id)
        await self._run(work)

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        """Append ``pydantic-ai/delete``: the conversation no longer loads; its log stays.

        Its messages leave the model view too, as a clear's do (``dsh messages`` and
        ``dsh run --session`` never send them again; docs/adapters.md#cleared-means-cleared).

        Raises:
            ConversationConflict: no record with ``expected_revision`` is stored.
        """
        def work() -> None:
            current = self._current(conversation_id)
            stored = current[1].record if current is not None else None
            if current is None or stored is None or stored["revision"] != expected_revision:
                raise ConversationConflict(conversation_id)
            log = self._writer(current[0])
            log.open().mark(DELETE_EVENT, {"revision": expected_revision})
            log.flush()
            # every line of the conversation leaves the model view: the session named after
            # it and each one its pydantic-ai/moved events name (a branch or rewrite continued
            # there), not whatever `<id>~<n>` happens to exist
            home = self._line(conversation_id, fresh=False)
            assert home is not None
            for session_id in [conversation_id, *home.lines]:
                line = self._writer(session_id)
                line.clear()
                line.flush()
            self._line(current[0])
        await self._run(work)

    def _entry(self, entry_id: str) -> ConversationEntry:
        session_id, (parent, holder, _) = self._locate(entry_id)
        events = self._events(session_id, fresh=False)
        assert events is not None
        records = records_of(events[holder], FORMAT)
        if not records:
            raise AdapterLookupError(f"entry {entry_id!r} points at seq {holder} of session "
                                     f"{session_id!r}, which holds no Pydantic AI message",
                                     code="ADAPTER_ENTRY", session_id=session_id, seq=holder)
        message = ModelMessagesTypeAdapter.validate_python([thaw(records[0])])[0]
        return ConversationEntry(id=entry_id, parent_id=parent, message=message)

    async def read_entry(self, entry_id: str) -> ConversationEntry:
        """The entry ``entry_id``, its message read back from the session log.

        Raises:
            AdapterLookupError: no session of the store holds it (a ``LookupError``).
        """
        return await self._run(lambda: self._entry(entry_id))

    async def read_history(self, head_id: str | None, *, limit: int | None = None
                           ) -> list[ConversationEntry]:
        """The entries up to ``head_id`` (the last ``limit``), in one pass under the lock."""
        def work() -> list[ConversationEntry]:
            entries: list[ConversationEntry] = []
            entry_id = head_id
            while entry_id is not None and (limit is None or len(entries) < limit):
                entry = self._entry(entry_id)
                entries.append(entry)
                entry_id = entry.parent_id
            entries.reverse()
            return entries
        return await self._run(work)

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Flush and release every session this store writes, then the store itself."""
        with self._lock:
            logs, self._logs = list(self._logs.values()), {}
            try:
                for log in logs:
                    log.close()
            finally:
                self._reader.close()

    async def __aenter__(self) -> DshConversationStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

"""What the framework adapters share: the live session they write, its turn shape, records.

A framework hands the adapter a flat list of messages; dsh wants them inside turns and steps
(core spec §1.8). :class:`TurnShaper` keeps that bracket: a user message after model output
closes the turn and opens the next one; model output after tool results opens the next step;
a ``tool/result`` answers a ``tool/call`` of the open step. The shape is rebuilt from the log on
every open, so a resumed (crash-repaired) or forked session continues where its log ends.

Each framework record is kept verbatim in the message's ``source`` under :data:`RECORD_KEY`
(``{"format", "records": [...]}``; sources are extensible, core spec §2.3), so a reader gets
back exactly what the framework wrote, while ``content`` holds dsh blocks for the model view.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from dsh.errors import AdapterError
from dsh.json import thaw
from dsh.persistence import Persistence, open_store
from dsh.session.events import Event
from dsh.session.session import Session
from dsh.session.store import SessionStore

__all__ = [
    "RECORD_KEY",
    "LiveLog",
    "TurnShaper",
    "default_store_url",
    "message_of",
    "records_of",
    "text_of",
    "with_records",
]

RECORD_KEY: Final = "adapterRecord"
"""Key of a message source holding the framework records the message was made from."""

def default_store_url() -> str:
    """``sqlite:///<$DSH_HOME or ~/.dsh>/sessions.db``, the store the ``dsh`` command reads."""
    home = Path(os.environ.get("DSH_HOME") or Path.home() / ".dsh").expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'sessions.db'}"


def with_records(source: Mapping[str, Any], fmt: str, records: Sequence[Any]) -> dict[str, Any]:
    """Return ``source`` plus ``{RECORD_KEY: {"format": fmt, "records": records}}``."""
    return {**source, RECORD_KEY: {"format": fmt, "records": list(records)}}


def message_of(event: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The message of a surface event (``data`` or ``data.message``), else None."""
    etype = event["type"]
    data = event["data"]
    if etype in ("user/message", "system/message"):
        return data if isinstance(data, Mapping) else None
    if etype in ("assistant/message", "tool/result") and isinstance(data, Mapping):
        message = data.get("message")
        return message if isinstance(message, Mapping) else None
    return None


def records_of(event: Mapping[str, Any], fmt: str) -> list[Any] | None:
    """The framework records (thawed copies) a surface event was made from, or None.

    None when the event carries no record of format ``fmt``: it was written by dsh itself (a
    crash-repair result, a compaction summary) or by another tool.
    """
    message = message_of(event)
    if message is None:
        return None
    source = message.get("source")
    record = source.get(RECORD_KEY) if isinstance(source, Mapping) else None
    if not isinstance(record, Mapping) or record.get("format") != fmt:
        return None
    records = record.get("records")
    return list(thaw(records)) if isinstance(records, Sequence) else None


def text_of(blocks: Any) -> str:
    """The text of ``text`` blocks (and of nested tool-result content), joined by newlines."""
    parts: list[str] = []
    for block in blocks if isinstance(blocks, Sequence) else ():
        if not isinstance(block, Mapping):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif block.get("type") == "tool-result":
            parts.append(text_of(block.get("content")))
    return "\n".join(parts)


@dataclass
class TurnShaper:
    """The turn/step bracket of one live session, rebuilt from its log.

    Attributes:
        session: The live session appended to.
        turn: Number of the last opened turn (0: none yet).
        step: Number of the last opened step of that turn.
        turn_open: A ``turn/start`` has no ``turn/end`` yet.
        step_open: A ``step/start`` has no ``step/end`` yet.
        phase: ``"input"`` (no model output yet in the step), ``"model"`` (model output last)
            or ``"results"`` (tool results since the last model output).
        pending: Call id -> seq of its ``tool/call`` in the open step, not yet answered.
    """

    session: Session
    turn: int = 0
    step: int = 0
    turn_open: bool = False
    step_open: bool = False
    phase: str = "input"
    pending: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_log(cls, session: Session) -> TurnShaper:
        """Rebuild the bracket from ``session.events`` (one pass over the log)."""
        shaper = cls(session)
        for event in session.events:
            shaper._track(event)
        return shaper

    def _track(self, event: Event) -> None:
        etype = event["type"]
        data = event["data"]
        if etype == "turn/start":
            self.turn, self.step, self.turn_open, self.step_open = data["turn"], 0, True, False
        elif etype == "turn/end":
            self.turn_open = self.step_open = False
            self.pending.clear()
        elif etype == "step/start":
            self.step, self.step_open, self.phase = data["step"], True, "input"
            self.pending.clear()
        elif etype == "step/end":
            self.step_open = False
            self.pending.clear()
        elif etype == "tool/call" and isinstance(data, Mapping):
            self.pending[str(data.get("callId"))] = event["seq"]
        elif etype == "assistant/message":
            self.phase = "model"
        elif etype == "tool/result":
            message = message_of(event)
            source = message.get("source") if message is not None else None
            if isinstance(source, Mapping):
                self.pending.pop(str(source.get("callId")), None)
            self.phase = "results"

    def _append(self, etype: str, data: Any, **kwargs: Any) -> Event:
        event = self.session.append(etype, data, **kwargs)
        self._track(event)
        return event

    def _open_step(self) -> None:
        if not self.turn_open:
            self._append("turn/start", {"turn": self.turn + 1})
        if not self.step_open:
            self._append("step/start", {"turn": self.turn, "step": self.step + 1})

    def end_turn(self, kind: str = "completed") -> None:
        """Close the open step and turn (``turn/end {reason: {kind}}``); nothing if none is open."""
        if self.step_open:
            self._append("step/end", {"turn": self.turn, "step": self.step})
        if self.turn_open:
            self._append("turn/end", {"turn": self.turn, "reason": {"kind": kind}})

    def input(self, message: Mapping[str, Any], *, system: bool = False) -> Event:
        """Append a user (or system) message, opening a new turn after model output."""
        if self.turn_open and (self.phase != "input" or not self.step_open):
            self.end_turn()
        self._open_step()
        return self._append("system/message" if system else "user/message", message,
                            surface_op="append")

    def assistant(self, message: Mapping[str, Any]) -> Event:
        """Append model output; after tool results (all answered) it opens the next step."""
        if self.step_open and self.phase != "input" and not self.pending:
            self._append("step/end", {"turn": self.turn, "step": self.step})
        self._open_step()
        return self._append("assistant/message",
                            {"turn": self.turn, "step": self.step, "message": message},
                            surface_op="append")

    def tool_call(self, call_id: str, name: str, arguments: str) -> Event:
        """Append ``tool/call`` for a call the last assistant message requested."""
        return self._append("tool/call", {"turn": self.turn, "step": self.step, "callId": call_id,
                                          "name": name, "arguments": arguments})

    def can_answer(self, call_id: str) -> bool:
        """True when ``call_id`` has a ``tool/call`` in the open step still unanswered."""
        return self.step_open and call_id in self.pending

    def tool_result(self, message: Mapping[str, Any]) -> Event:
        """Append the ``tool/result`` answering a pending call (check :meth:`can_answer`)."""
        call_id = message["source"]["callId"]
        return self._append("tool/result",
                            {"turn": self.turn, "step": self.step, "message": message},
                            surface_op="append", source_event_seqs=[self.pending[call_id]])

    def mark(self, etype: str, data: Mapping[str, Any]) -> Event:
        """Append an adapter operation (pop, clear) as an ``ignorable`` custom event."""
        return self._append(etype, data, ignorable=True)


class LiveLog:
    """One framework session's dsh session, opened for writing on first use.

    Opening creates the stored session, or resumes it: a turn a crash left open is closed by
    dsh's repair (appended ``tool/result`` errors for unanswered calls, ``step/end``,
    ``turn/end {kind: "interrupted"}``) before anything else is written. The write handle is
    exclusive across processes until :meth:`close`. Every method takes :attr:`lock`; callers
    hold it while they read or append.

    Args:
        session_id: The dsh session id.
        store: A store URL (``sqlite:///…``, ``jsonl:///…``, ``memory:``); default
            :func:`default_store_url`.

    Raises:
        AdapterError: (from :meth:`open`) the adapter was closed (``ADAPTER_CLOSED``).
        SessionBusyError: another writer holds the session.
    """

    def __init__(self, session_id: str, store: str | None = None) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise AdapterError(f"session_id must be a non-empty string (got {session_id!r})",
                               code="ADAPTER_SESSION_ID")
        self.session_id = session_id
        self.store_url = store if store is not None else default_store_url()
        self.lock = threading.RLock()
        self._persistence: Persistence | None = None
        self._store: SessionStore | None = None
        self._shaper: TurnShaper | None = None
        self._closed = False

    def open(self) -> TurnShaper:
        """Return the shaper of the live session, opening (creating or resuming) it first."""
        with self.lock:
            if self._closed:
                raise AdapterError(f"session {self.session_id!r} was closed; make a new adapter "
                                   f"object to use it again", code="ADAPTER_CLOSED",
                                   session_id=self.session_id)
            if self._shaper is None:
                persistence = open_store(self.store_url)
                try:
                    store = SessionStore(persistence=persistence)
                    session = (store.resume(self.session_id)
                               if persistence.exists(self.session_id)
                               else store.create(self.session_id))
                except BaseException:
                    persistence.close()
                    raise
                self._persistence, self._store = persistence, store
                self._shaper = TurnShaper.from_log(session)
            return self._shaper

    @property
    def session(self) -> Session:
        """The live dsh session (opened on first use)."""
        return self.open().session

    def flush(self) -> None:
        """The durability barrier: return once everything appended is stored."""
        with self.lock:
            if self._store is not None and self._shaper is not None:
                self._store.flush(self._shaper.session)

    def surface_events(self) -> Iterator[Event]:
        """The events of the current surface nodes, in surface order (the model view)."""
        session = self.session
        for seq in session.surface.nodes:
            yield session.event_at(seq)

    def close(self) -> None:
        """Flush, release the write handle and close the store; later use raises."""
        with self.lock:
            if self._closed:
                return
            self._closed = True
            persistence, store, shaper = self._persistence, self._store, self._shaper
            self._persistence = self._store = self._shaper = None
            if persistence is None:
                return
            try:
                if store is not None and shaper is not None:
                    store.flush(shaper.session)
                    store.dispose(shaper.session)
            finally:
                persistence.close()

"""``SQLiteSession`` for the vendored SDK tests: dsh's DshSession behind its constructor.

The SDK tests build ``SQLiteSession(session_id, db_path=":memory:", ..., session_settings=)``;
this keeps that signature and stores the session in dsh instead: a file path becomes the dsh
SQLite store ``sqlite:///<path>`` (a dsh store file, not the SDK's tables), ``:memory:`` a
``memory:`` store of its own. Nothing else is added: every call goes to DshSession.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsh.adapters.openai_agents import DshSession


class SQLiteSession(DshSession):
    """A DshSession made the way the SDK's tests make a ``SQLiteSession``."""

    def __init__(self, session_id: str, db_path: str | Path = ":memory:",
                 sessions_table: str = "agent_sessions", messages_table: str = "agent_messages",
                 session_settings: Any = None) -> None:
        store = ("memory:" if str(db_path) == ":memory:"
                 else f"sqlite:///{Path(db_path).resolve()}")
        super().__init__(session_id, store, session_settings=session_settings)
        self.db_path = db_path

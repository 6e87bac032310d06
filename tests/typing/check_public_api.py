"""Type-checked by mypy --strict (scripts/test): the public API's types as a user sees them."""

from __future__ import annotations

from typing import assert_type

import dsh
from dsh import Event, Session, SessionStore
from dsh.json import FrozenDict, snapshot_json
from dsh.session import EventLog


def use_the_api(store: SessionStore) -> None:
    session = store.create("typed")
    assert_type(session, Session)
    event = session.append("turn/start", {"turn": 1})
    assert_type(event, Event)
    assert_type(event.seq, int)
    assert_type(event.type, str)
    assert_type(session.events, EventLog)
    assert_type(session.derive_messages(), list[FrozenDict])
    closers = dsh.interrupted_turn_closers(session.events)
    assert_type(closers, tuple[Event, ...])
    child = store.fork(session, 0, "typed-child", open_turn="close")
    assert_type(child, Session)
    snapshot_json({"ok": [1, 2, 3]})

"""Type-checked by mypy --strict (scripts/test): the public API's types as a user sees them."""

from __future__ import annotations

from typing import assert_type

import dsh
from dsh import Event, Session, Store
from dsh.json import FrozenDict, snapshot_json
from dsh.persistence import Inspection, ListingEntry
from dsh.session import EventLog, MessageLog


def use_the_api(store: Store) -> None:
    session = store.session("typed")
    assert_type(session, Session)
    event = session.append("turn/start", {"turn": 1})
    assert_type(event, Event)
    assert_type(event.seq, int)
    assert_type(event.type, str)
    assert_type(session.events, EventLog)
    assert_type(session.derive_messages(), MessageLog)
    assert_type(session.derive_messages()[0], FrozenDict)
    closers = dsh.interrupted_turn_closers(session.events)
    assert_type(closers, tuple[Event, ...])
    child = store.fork(session.id, 0, child_id="typed-child", open_turn="close")
    assert_type(child, str)
    assert_type(store.read(child), Inspection)
    assert_type(store.list(), list[ListingEntry])
    store.flush(session)
    snapshot_json({"ok": [1, 2, 3]})


def use_the_front_door() -> None:
    with dsh.open("memory:") as store:
        assert_type(store, Store)
        assert_type(store.session("s"), Session)


def misspelt_names_are_type_errors() -> None:
    # dsh's PEP 562 __getattr__ is hidden from checkers (every public name is typed by its
    # TYPE_CHECKING import), so a misspelt name is an error; strict mypy flags an unused ignore
    from dsh import Sesion  # type: ignore[attr-defined]

    print(Sesion, dsh.compactnow)  # type: ignore[attr-defined]

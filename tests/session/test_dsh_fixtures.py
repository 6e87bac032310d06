"""Logs written by the real dsh restore here with dsh's own surface and messages.

Rule: docs/testing.md#what-the-tests-cover.

Fixtures live in ``tests/fixtures/dsh-logs``; see its README.
``jsonl-unpacked/main`` holds one event per line, so the core can read it without the chunk-row
decoder: line 1 is the header (with ``"type": "session"``), every other line one event.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dsh._errors import EventRejectedError
from dsh.json import FrozenDict, json_equal, loads, thaw
from dsh.session._events import Event
from dsh.session._session import Session
from dsh.session._surface import fold_surface
from tests.conftest import DSH_LOGS

pytestmark = pytest.mark.no_speedups

LOGS = DSH_LOGS
UNPACKED = sorted((LOGS / "jsonl-unpacked" / "main").glob("*/*/session.jsonl"))
EXPECTED = sorted((LOGS / "expected").glob("*/*/*.json"))


def read_jsonl(path: Path) -> tuple[FrozenDict, list[Event]]:
    """Parse a dsh JSONL session file: records split on b"\\n" only."""
    lines = path.read_bytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    header_line = loads(lines[0])
    header = FrozenDict({k: v for k, v in header_line.items() if k != "type"})
    return header, [Event(loads(line)) for line in lines[1:]]


def restore(header: FrozenDict, events: list[Event]) -> Session:
    return Session.restore(header["id"], events, header,
                           inherited_event_count=header.get("seedLength", 0))


def expected_for(session_id: str) -> dict[str, Any]:
    path = LOGS / "expected" / "jsonl-unpacked" / "main" / f"{session_id}.json"
    return loads(path.read_bytes())  # type: ignore[no-any-return]


@pytest.mark.parametrize("path", UNPACKED or [None], ids=lambda p: p.parent.name if p else "none")
def test_dsh_fixture_unpacked_jsonl_restores_with_dsh_surface_and_messages(
        path: Path | None) -> None:
    assert path is not None, "no session.jsonl under jsonl-unpacked/main"
    header, events = read_jsonl(path)
    expected = expected_for(header["id"])
    assert json_equal(header, expected["meta"])
    assert len(events) == expected["eventCount"]
    assert json_equal([thaw(e) for e in events], expected["events"])
    session = restore(header, events)
    assert list(session.surface.nodes) == expected["surfaceNodes"]
    assert session.surface.replace_generation == expected["replaceGeneration"]
    assert json_equal(session.derive_messages(), expected["messages"])
    # restore validates without copying and marks the lifecycle boundary
    assert all(a is b for a, b in zip(session.events, events, strict=False))
    assert session.events[-1].type == "session/end-seed"
    assert fold_surface(events).nodes == expected["surfaceNodes"]


@pytest.mark.parametrize("path", EXPECTED or [None],
                         ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}/{p.stem}"
                         if p else "none")
def test_dsh_fixture_expected_views_restore_with_dsh_surface_and_messages(
        path: Path | None) -> None:
    # Every store's decoded view (including crash views with dsh's in-memory closers).
    assert path is not None, "no expected/*.json files"
    expected = loads(path.read_bytes())
    header = expected["meta"]
    events = [Event(e) for e in expected["events"]]
    session = restore(header, events)
    assert list(session.surface.nodes) == expected["surfaceNodes"]
    assert session.surface.replace_generation == expected["replaceGeneration"]
    assert json_equal(session.derive_messages(), expected["messages"])
    copied = Session.create(header["id"], seed=expected["events"], header=header,
                            inherited_event_count=header.get("seedLength", 0))
    assert json_equal(copied.derive_messages(), expected["messages"])


def test_dsh_fixture_fork_child_is_seeded_by_its_header() -> None:
    # s4 was forked by dsh at seq 134: header seedLength 135, dsh's plain end-seed at 135.
    path = next((p for p in UNPACKED if p.parent.name == "s4-fork-of-s1"), None)
    if path is None:
        pytest.skip("s4-fork-of-s1 fixture not present")
    header, events = read_jsonl(path)
    session = restore(header, events)
    assert session.inherited_event_count == 135 == session.header.seed_length
    assert events[135].type == "session/end-seed"
    with pytest.raises(EventRejectedError, match="inherited event count equal to header "
                                                 "seedLength"):
        Session.restore(header["id"], events, header)


def test_dsh_fixture_s4_equals_our_fork_of_s1_at_134() -> None:
    # dsh's s4-fork-of-s1 equals a fork we make of s1 at seq 134 in every event up to
    # the end-seed (ids and times of the inherited events identical), header lineage included.
    by_name = {p.parent.name: p for p in UNPACKED}
    if "s1-normal" not in by_name or "s4-fork-of-s1" not in by_name:
        pytest.skip("s1-normal / s4-fork-of-s1 fixtures not present")
    from dsh.session._store import SessionStore

    s1_header, s1_events = read_jsonl(by_name["s1-normal"])
    s4_header, s4_events = read_jsonl(by_name["s4-fork-of-s1"])
    store = SessionStore()
    parent = store.create("s1-normal", seed=s1_events, header=s1_header)
    child = store.fork(parent, 134, "s4-fork-of-s1")
    assert [thaw(e) for e in child.events[:135]] == [thaw(e) for e in s4_events[:135]]
    marker = child.events[135]
    assert (marker.type, s4_events[135].type) == ("session/end-seed", "session/end-seed")
    assert marker.data == {"inherited": True} and marker.time == s1_events[134].time
    assert child.seq == 136  # s1 ends turn 2 at 134: nothing to close
    assert (child.header.parent_session, child.header.seed_length) == (
        s4_header["parentSession"], s4_header["seedLength"]) == ("s1-normal", 135)
    assert child.header.cwd == s4_header["cwd"]

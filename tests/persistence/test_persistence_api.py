"""The public read/list/fork API of ``Persistence``: listing, the cold read pipeline (a read
writes nothing) and fork (docs/stores.md#opening-a-store, docs/rules.md#the-read-pipeline,
docs/rules.md#fork)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from dsh._errors import (
    LogCorruptError,
    SessionBusyError,
    SessionForkError,
    SessionNotFoundError,
)
from dsh.persistence import Inspection, Persistence, open_backend
from dsh.session._store import SessionStore
from dsh.testing import CWD, LogBuilder, header, plain

from .conftest import inject_torn_tail, store_url


def _write(persistence: Persistence, builder: LogBuilder, sid: str = "s") -> None:
    persistence.create(header(sid))
    with persistence.open(sid, "write") as handle:
        handle.append(builder.events)
        handle.flush()


def _stored(persistence: Persistence, sid: str) -> list[dict[str, Any]]:
    with persistence.open(sid) as handle:
        return plain(handle.read().events)


def _interrupted() -> LogBuilder:
    builder = LogBuilder("s")
    builder.completed_turn()
    builder.tool_call_turn("call_1", recorded=True)
    return builder


# -- read --------------------------------------------------------------------------------------

def test_read_returns_stored_events_and_closers_apart_without_writing(
        store: Persistence) -> None:
    """Inspect-style read; the interrupted turn's closers stay in memory.

    Rule: docs/rules.md#the-read-pipeline.
    """
    builder = _interrupted()
    _write(store, builder)
    before = _stored(store, "s")
    read = store.read("s")
    assert isinstance(read, Inspection)
    assert plain(read.stored_events) == before
    assert [c.type for c in read.closers] == ["tool/result", "step/end", "turn/end"]
    assert read.closers[0].seq == len(before)
    assert read.events == read.stored_events + read.closers
    assert read.torn is None
    assert read.live is False
    assert read.header["id"] == "s"
    assert _stored(store, "s") == before


def test_read_reports_a_torn_tail_and_leaves_it(store: Persistence) -> None:
    """docs/rules.md#the-read-pipeline: the torn tail is reported; only load/resume truncate it."""
    builder = LogBuilder("s")
    builder.completed_turn()
    _write(store, builder)
    if not inject_torn_tail(store, "s"):
        pytest.skip("this backend cannot hold a torn tail")
    read = store.read("s")
    assert read.torn is not None
    assert read.closers == ()
    assert len(read.stored_events) == len(builder.events)
    assert store.read("s").torn is not None  # still there: nothing was written


def test_read_of_a_missing_session_is_not_found(store: Persistence) -> None:
    with pytest.raises(SessionNotFoundError):
        store.read("nope")


def test_read_keeps_a_log_that_restore_refuses(tmp_path: Path) -> None:
    """Read runs the pipeline only; inspect's full restore validation refuses this log.

    Rule: docs/rules.md#the-read-pipeline.
    """
    persistence = Persistence(open_backend(store_url("jsonl", tmp_path)))
    builder = LogBuilder("s")
    builder.completed_turn()
    _write(persistence, builder)
    with persistence.open("s") as handle:
        path = handle.path  # type: ignore[attr-defined]
    # An assistant message with an empty provider: a known type, refused only by restore.
    text = path.read_text().replace('"provider":"deepseek"', '"provider":""')
    path.write_text(text)
    path.with_name(path.name + ".seal").unlink()  # a present seal the log fails refuses reseal
    persistence.backend.reseal("s")  # type: ignore[attr-defined]  # as if dsh wrote it
    read = persistence.read("s")
    assert len(read.stored_events) == len(builder.events)
    with pytest.raises(LogCorruptError):
        persistence.inspect("s")
    persistence.close()


# -- list_headers ------------------------------------------------------------------------------

def test_list_headers_names_every_created_session_without_reading_logs(
        store: Persistence) -> None:
    """Headers come from the backend (a created, empty session: SQLite and memory list it, JSONL
    writes its file only with the first event); list() keeps sessions with events
    (docs/rules.md#listing)."""
    _write(store, _interrupted(), "a")
    store.create(header("b"))
    headers = sorted(store.list_headers(), key=lambda h: h["id"])
    expected = ["a"] if store.url.startswith("jsonl") else ["a", "b"]
    assert [h["id"] for h in headers] == expected
    assert headers[0]["cwd"] == CWD
    assert [s.id for s in store.list()] == ["a"]


# -- fork --------------------------------------------------------------------------------------

def _parent_bytes(persistence: Persistence, kind: str, sid: str) -> Any:
    """The parent's stored form, byte for byte: its JSONL file, or its SQLite rows."""
    if kind == "sqlite":
        db = Path(persistence.url.removeprefix("sqlite://"))
        with contextlib.closing(sqlite3.connect(db)) as conn:
            rows = conn.execute("SELECT * FROM events WHERE session_id = ? ORDER BY seq",
                                (sid,)).fetchall()
            meta = conn.execute("SELECT * FROM sessions WHERE id = ?", (sid,)).fetchall()
        conn.close()
        return rows, meta
    with persistence.open(sid) as handle:
        return Path(handle.path).read_bytes()  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_fork_of_a_stored_session_leaves_the_parent_byte_for_byte(
        kind: str, tmp_path: Path) -> None:
    """The cut inside the open turn is closed in the child only (docs/rules.md#fork)."""
    persistence = Persistence(open_backend(store_url(kind, tmp_path)))
    builder = _interrupted()
    _write(persistence, builder)
    before = _parent_bytes(persistence, kind, "s")
    parent_events = _stored(persistence, "s")
    boundary = len(parent_events) - 1
    child_id = persistence.fork("s", boundary, "child")
    assert child_id == "child"
    assert _parent_bytes(persistence, kind, "s") == before
    persistence.close()

    reopened = Persistence(open_backend(store_url(kind, tmp_path)))
    assert _parent_bytes(reopened, kind, "s") == before
    child = reopened.read("child")
    assert child.header["parentSession"] == "s"
    assert child.header["seedLength"] == boundary + 1
    events = plain(child.stored_events)
    assert events[:boundary + 1] == parent_events
    assert [e["type"] for e in events[boundary + 1:]] == [
        "session/end-seed", "tool/result", "step/end", "turn/end"]  # one end-seed after the cut
    assert events[boundary + 1]["data"] == {"inherited": True}
    assert events[boundary + 4]["data"]["reason"]["kind"] == "forked"
    assert child.closers == ()
    # The child is released: it can be resumed at once.
    sessions = SessionStore(reopened)
    resumed = sessions.resume("child")
    assert resumed.id == "child"
    sessions.dispose(resumed)
    reopened.close()


def test_fork_defaults_to_the_last_event_and_numbers_the_child(store: Persistence) -> None:
    builder = LogBuilder("s")
    builder.completed_turn()
    _write(store, builder)
    assert store.fork("s") == "s-fork-1"
    assert store.fork("s") == "s-fork-2"
    child = store.read("s-fork-2")
    assert child.header["seedLength"] == len(builder.events)
    assert [e.type for e in child.stored_events[len(builder.events):]] == ["session/end-seed"]


def test_fork_refusals_write_nothing(store: Persistence) -> None:
    """docs/rules.md#resume: existing child, bad boundary, open turn with reject."""
    builder = _interrupted()
    _write(store, builder)
    store.create(header("taken"))
    before = _stored(store, "s")
    with pytest.raises(SessionForkError) as exists:
        store.fork("s", 0, "taken")
    assert exists.value.code == "SESSION_ALREADY_EXISTS"
    with pytest.raises(SessionForkError) as beyond:
        store.fork("s", len(before), "c1")
    assert beyond.value.code == "INVALID_BOUNDARY"
    with pytest.raises(SessionForkError) as negative:
        store.fork("s", -1, "c1")
    assert negative.value.code == "INVALID_BOUNDARY"
    with pytest.raises(SessionForkError) as open_turn:
        store.fork("s", len(before) - 1, "c1", open_turn="reject")
    assert open_turn.value.code == "OPEN_TURN"
    assert not store.exists("c1")
    with pytest.raises(SessionNotFoundError):
        store.fork("missing")
    assert _stored(store, "s") == before


def test_fork_of_a_live_session_is_refused(store: Persistence) -> None:
    sessions = SessionStore(store)
    live = sessions.create("s", header={"cwd": CWD})
    sessions.flush(live)
    with pytest.raises(SessionBusyError) as busy:
        store.fork("s")
    assert busy.value.code == "SESSION_LIVE"
    sessions.dispose(live)

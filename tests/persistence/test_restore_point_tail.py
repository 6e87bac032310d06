"""WriteBehind(restore_point_tail=n): a restore point n events behind a live session, at its end
once it is closed; the default keeps the every-2,048-events rule.

Rule: docs/rules.md#restore-points-are-never-the-truth.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import dsh
from dsh._errors import ConfigError
from dsh.persistence import Persistence, WriteBehind, open_backend
from dsh.persistence import _restore_point as rp
from tests.strategies import StepClock, completed_turn


def _url(kind: str, root: Path) -> str:
    if kind == "sqlite":
        return f"sqlite://{root}/store.db"
    return f"jsonl://{root}"


def _covered(url: str) -> tuple[int, int, int]:
    """(events the restore point covers, events in its tail, events stored), read cold."""
    with Persistence(open_backend(url)) as persistence, \
            persistence.open("s", "read") as handle:
        stored = len(handle.read(0).events)
        try:
            point, cold, _source = handle.read_from_restore_point()  # type: ignore[attr-defined]
        except rp.RestorePointRefused as exc:
            assert exc.reason == "absent"
            return 0, stored, stored
        return point.state.event_count, len(cold.events), stored


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_tail_bound_keeps_a_restore_point_near_the_end_and_at_it_after_close(
        tmp_path: Path, kind: str) -> None:
    url = _url(kind, tmp_path)
    store = dsh.open(url, clock=StepClock(), write_behind=WriteBehind(restore_point_tail=12))
    session = store.session("s")
    for turn in range(1, 6):  # 6 events a turn, one flush each
        completed_turn(session, turn)
        store.flush(session)
    covered, tail, stored = _covered(url)  # while the writer is live
    assert stored == len(session.events) == 30
    # written at the first flush at least 12 events after the last: 12 and 24
    assert (covered, tail) == (24, 6)
    store.close()
    assert _covered(url) == (30, 0, 30)  # the close wrote one at the end
    written = rp.stats["written"]
    with dsh.open(url, clock=StepClock(2_000_000_000_000),
                  write_behind=WriteBehind(restore_point_tail=12)) as again:
        resumed = again.session("s")  # through the restore point: no tail to read
        assert list(resumed.events[:30]) == list(session.events)
        assert [e["type"] for e in resumed.events[30:]] == ["session/end-seed"]  # the resume's
    # the marker the resume appended is covered at close: one more restore point written
    assert _covered(url) == (31, 0, 31)
    assert rp.stats["written"] == written + 1


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_default_keeps_the_every_2048_events_rule(tmp_path: Path, kind: str) -> None:
    url = _url(kind, tmp_path)
    with dsh.open(url, clock=StepClock()) as store:
        session = store.session("s")
        for turn in range(1, 6):
            completed_turn(session, turn)
            store.flush(session)
    assert _covered(url) == (0, 30, 30)


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "8"])
def test_tail_bound_is_a_positive_integer(bad: object) -> None:
    with pytest.raises(ConfigError, match="restore_point_tail"):
        WriteBehind(restore_point_tail=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("other_commit", [False, True])
def test_the_first_append_after_a_resume_takes_the_checked_tail_while_nothing_committed(
        tmp_path: Path, request: pytest.FixtureRequest, other_commit: bool) -> None:
    # A SQLite resume through a restore point reads the session row and the rows from the cut
    # in one transaction: the first append takes the stored tail from there (no second
    # look-back) only while PRAGMA data_version says no other connection committed since.
    import sqlite3
    from unittest import mock

    from dsh._errors import WriteFailedError
    from dsh.persistence.sqlite._backend import SqliteHandle

    url = _url("sqlite", tmp_path)
    with dsh.open(url, clock=StepClock(),
                  write_behind=WriteBehind(restore_point_tail=12)) as store:
        session = store.session("s")
        for turn in range(1, 4):
            completed_turn(session, turn)
            store.flush(session)
    spy = mock.patch.object(SqliteHandle, "_stored_next_seq", autospec=True,
                            side_effect=SqliteHandle._stored_next_seq)
    looked_back = spy.start().call_args_list  # (handle, unchanged since our commit) each
    request.addfinalizer(spy.stop)
    used = rp.stats["used"]
    store = dsh.open(url, clock=StepClock(2_000_000_000_000),
                     write_behind=WriteBehind(restore_point_tail=12))
    resumed = store.session("s")
    assert rp.stats["used"] == used + 1
    db = sqlite3.connect(tmp_path / "store.db")
    if other_commit:  # another writer's append (the lock ignored), through SQLite
        with db:
            db.execute("INSERT INTO events SELECT session_id, 18, type, time, data, "
                       "source_event_seqs, surface_op, ignorable FROM events WHERE seq = 17")
    completed_turn(resumed, 4)
    if other_commit:
        with pytest.raises(WriteFailedError, match="another writer moved the log"):
            store.flush(resumed)
        assert [unchanged for _, unchanged in (c.args for c in looked_back)] == [False]
        # (the stored tail derived again, which finds the other writer's row)
        with db:
            db.execute("DELETE FROM events WHERE seq = 18")
    store.flush(resumed)
    if not other_commit:
        assert looked_back == []
    store.close()
    db.close()
    assert _covered(url)[2] == 18 + 1 + 6  # three turns, the resume's marker, the fourth

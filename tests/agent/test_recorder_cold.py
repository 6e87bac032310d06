"""The recorder's turn state after a cold open through a restore point equals a full read's.

After an O(tail) resume the recorder finds the last turn bracket below the cut at the seq the
restore point's state names (``turn_boundary``), reading that one event alone
(docs/agent.md#the-recorder, docs/formats.md#restore-points). These tests build real SQLite
logs of varied shapes, open them cold, and compare that state with a walk of every event.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import dsh
from dsh._messages import create_user_message
from dsh.adapters._log import TurnShaper, remove_from_surface
from dsh.agent import Recorder
from dsh.agent._recorder import _Scan
from dsh.persistence import _restore_point as rp
from dsh.session import PagedLog, Session

END = {"kind": "completed"}


def _message(session: Session, text: str) -> None:
    session.append("user/message", create_user_message(
        {"content": [{"type": "text", "text": text}], "source": {"kind": "user"}}),
        surface_op="append")


def _turns(session: Session, first: int, count: int, *, close_last: bool = True,
           padding: int = 0) -> None:
    for turn in range(first, first + count):
        session.append("turn/start", {"turn": turn})
        session.append("step/start", {"turn": turn, "step": 1})
        for index in range(padding + 1):
            _message(session, f"turn {turn} message {index}")
        session.append("step/end", {"turn": turn, "step": 1})
        if close_last or turn < first + count - 1:
            session.append("turn/end", {"turn": turn, "reason": END})


def _cold_state(url: str, session_id: str) -> tuple[tuple[int, int | None],
                                                     tuple[int, int | None], bool]:
    """(recorder's state, a full walk's state, whether the log was paged) of a cold open."""
    with dsh.open(url) as store:
        session = store.session(session_id)
        log = session.events._log
        paged = isinstance(log, PagedLog)
        full = _Scan()
        full.feed(list(session.events))
        recorder = Recorder(session, store=store.sessions)
        fast = (recorder._scan.last_turn, recorder._scan.open_turn)
        assert recorder.next_turn == full.last_turn + 1
    return fast, (full.last_turn, full.open_turn), paged


def _messages(session: Session, count: int) -> None:
    for index in range(count):
        _message(session, f"m{index}")


SHAPES: dict[str, Callable[[Session], None]] = {
    "no brackets": lambda s: _messages(s, 300),
    "one short turn": lambda s: _turns(s, 1, 1),
    "many turns": lambda s: _turns(s, 1, 60, padding=3),
    "a long last turn": lambda s: _turns(s, 1, 3, padding=400),
    "messages after the last turn": lambda s: _then(s, 200),
    "an open last turn (closed by repair)": lambda s: _turns(s, 1, 8, close_last=False,
                                                            padding=50),
    "cleared and popped": lambda s: _cleared(s),  # defined below
}


def _then(session: Session, count: int) -> None:
    """Five turns, then ``count`` user messages outside any turn."""
    _turns(session, 1, 5)
    _messages(session, count)


def _cleared(session: Session) -> None:
    """Turns, then an adapter's pop of the last node and clear of the rest (surface ops)."""
    _turns(session, 1, 4, padding=5)
    shaper = TurnShaper(Recorder(session), "test")
    nodes = list(session.surface_nodes) if hasattr(session, "surface_nodes") else [
        e["seq"] for e in session.events if e["type"] == "user/message"]
    remove_from_surface(shaper, nodes[-1:], form="pop")
    remove_from_surface(shaper, nodes[:-1], form="clear")
    _messages(session, 40)


@pytest.mark.parametrize("every", [3, 50, 700])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_recorder_state_after_a_cold_open_equals_a_full_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str, every: int) -> None:
    # a restore point every few events puts the cut before, inside and after the last turn
    monkeypatch.setattr(rp, "RESTORE_POINT_EVERY_EVENTS", every)
    url = f"sqlite://{tmp_path / 'sessions.db'}"
    with dsh.open(url) as store:
        SHAPES[shape](store.session("s"))
    for round_ in range(3):  # each round reopens, then records a turn more
        fast, full, paged = _cold_state(url, "s")
        assert fast == full
        assert paged or every > 3  # a log shorter than `every` has no restore point
        with dsh.open(url) as store:
            session = store.session("s")
            recorder = Recorder(session, store=store.sessions)
            number = recorder.next_turn
            with recorder.turn(), recorder.current_turn.step() as step:  # type: ignore[union-attr]
                step.user_message(f"round {round_}")
            assert number == full[0] + 1


def test_a_fork_and_its_source_read_the_same_state_cold(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rp, "RESTORE_POINT_EVERY_EVENTS", 5)
    url = f"sqlite://{tmp_path / 'sessions.db'}"
    with dsh.open(url) as store:
        _turns(store.session("s"), 1, 12, padding=2)
        store.fork("s", 30, child_id="f")
        _turns(store.session("f"), 5, 2)
        other = store.session("o")
        _messages(other, 20)
    for session_id in ("s", "f", "o"):
        fast, full, paged = _cold_state(url, session_id)
        assert fast == full
        assert paged

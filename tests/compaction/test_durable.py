"""Compaction through a real store: the lock is durable and a resume makes an orphan stale.

docs/rules.md#compaction: ``compaction/start`` is the durable lock; a failed or interrupted
compaction leaves it visible; resume appends ``session/end-seed``, after which the orphan no longer
blocks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import dsh
from dsh._errors import CompactionError
from dsh.compaction._region import compact_now, session_compaction_state
from tests.compaction.builders import turn
from tests.compaction.test_region import Fixed


@pytest.fixture(params=["jsonl", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "jsonl":
        return f"jsonl://{tmp_path / 'store'}"
    return f"sqlite://{tmp_path / 'store.db'}"


def test_compaction_survives_reload_and_an_orphan_lock_is_stale_after_resume(url: str) -> None:
    store = dsh.open(url)
    session = store.session("c1")
    for number in range(1, 4):
        turn(session, number, f"request {number} " * 30, answer="answer " * 30)
    result = compact_now(session, summarizer=Fixed(), flush=lambda: store.flush(session))
    assert result is not None
    messages, nodes = session.derive_messages(), list(session.surface.nodes)
    # a compaction that never finished: its start is durable, its end never comes
    session.append("compaction/start", {"compactionId": "orphan", "turn": None})
    store.flush(session)
    with pytest.raises(CompactionError, match="compaction already in progress"):
        compact_now(session, summarizer=Fixed())
    store.dispose(session)

    again = dsh.open(url)
    resumed = again.session("c1")
    assert [e.type for e in resumed.events[-2:]] == ["compaction/start", "session/end-seed"]
    assert resumed.derive_messages() == messages
    assert list(resumed.surface.nodes) == nodes
    assert session_compaction_state(resumed).active_start is None
    turn(resumed, 4, "more work " * 30, answer="done " * 30)
    second = compact_now(resumed, summarizer=Fixed(), flush=lambda: again.flush(resumed))
    assert second is not None
    again.dispose(resumed)

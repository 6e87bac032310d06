"""A search marks hits in removed messages reading only the logs that hold a removal.

Rule: docs/stores.md#search (what a search shows), docs/forgetting.md#what-a-search-shows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import dsh
from dsh.persistence import removed_messages
from dsh.rights import quarantine, unquarantine
from tests.adapters.test_cleared import sdk_cleared
from tests.persistence.test_listing import count_reads
from tests.persistence.test_search import _store_url, _write

WORD = "zebra"


@pytest.mark.parametrize("kind", ["sqlite", "jsonl", "postgresql"])
def test_marks_read_only_the_sessions_holding_a_removal(
        tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # an SDK clear, a pop of an answer and of a tool output whose call stays, a quarantine
    # of two messages with one released, and a big session without any removal: the marks
    # are those of the whole log's fold, and the big session is never read
    with _store_url(tmp_path, kind) as url:
        sdk_cleared(url, "cleared", "popped", [
            [{"role": "user", "content": f"{WORD} told"}],
            [{"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": f"{WORD} output"}],
            [{"role": "assistant", "content": f"{WORD} noted"}]])
        _write(url, "quarantined", [f"{WORD} one", f"{WORD} two", f"{WORD} three"])
        _write(url, "big", [f"{WORD} {i}" for i in range(400)])
        with dsh.open(url) as store:
            held = sorted(h.seq for h in store.search(WORD, limit=2000).hits
                          if h.session_id == "quarantined" and h.role == "user")
            quarantine(store, "quarantined", held[:2])
            unquarantine(store, "quarantined", held[:1])
            whole = {sid: removed_messages(store.read(sid).stored_events)
                     for sid in ("cleared", "popped", "quarantined", "big")}
            read = count_reads(monkeypatch)
            hits = store.search(WORD, limit=2000).hits
        marks = {(h.session_id, h.seq): h.removed for h in hits}
    assert marks == {key: whole[key[0]].get(key[1]) for key in marks}
    by_session: dict[str, list[str | None]] = {}
    for (sid, _), mark in sorted(marks.items()):
        by_session.setdefault(sid, []).append(mark)
    assert by_session["cleared"] == ["clear"] * 3
    assert by_session["popped"] == [None, "clear", "clear"]  # the told prompt stays
    assert by_session["quarantined"] == [None, "quarantine", None]
    assert by_session["big"] == [None] * 400
    assert "big" not in read
    # SQLite picks the surface rows; PostgreSQL and JSONL read those holding a removal whole
    assert sorted(read) == ([] if kind == "sqlite" else ["cleared", "popped", "quarantined"])

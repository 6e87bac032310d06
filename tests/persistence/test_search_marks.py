"""A search marks hits in removed messages reading only the logs that hold a removal.

Rule: docs/stores.md#search (what a search shows), docs/forgetting.md#what-a-search-shows.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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


def test_jsonl_marks_look_only_into_the_hit_sessions_folders(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fresh process's first search with a hit stat-ed every session folder of the root for
    # the other compression's log (the store's encoding check, once per backend): 10,000
    # stats, ~45 ms of CPU in a 10,000-session store, where the unmarked search takes ~3 ms
    url = f"jsonl:{tmp_path / 'l'}"
    for n in range(30):
        _write(url, f"s{n}", [f"{WORD} here" if n == 7 else "plain words"])
    with dsh.open(url) as store:
        assert [h.session_id for h in store.search(WORD).hits] == ["s7"]  # indexed
    looked: list[str] = []
    real = os.stat

    def stat(path: Any, *args: Any, **kwargs: Any) -> Any:
        looked.append(os.fspath(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    with dsh.open(url) as store:  # a backend that has not checked the root yet
        found = store.search(WORD)
    monkeypatch.undo()
    assert [(h.session_id, h.removed) for h in found.hits] == [("s7", None)]
    zstd = [path for path in looked if path.endswith("session.jsonl.zstd")]
    assert [Path(path).parent.name for path in zstd] == ["s7"]  # before: all 30 folders
    # the hit's folder holding the other compression's log too: the whole read refuses it
    [log] = (tmp_path / "l").glob("*/s7/session.jsonl")
    (log.parent / "session.jsonl.zstd").write_bytes(b"")
    with dsh.open(url) as store:
        mixed = store.search(WORD)
    assert (mixed.hits, mixed.unreadable) == ((), ("s7",))

"""Logs written by the real dsh load here with dsh's own answers.

Rule: docs/compatibility.md#what-is-shared; the fixtures are described in their dsh-logs/README.

* every session of ``jsonl/main``, ``jsonl-unpacked/main`` and ``jsonl-zstd/main`` loads with the
  surface nodes, replace generation and derived messages of ``expected/<store>/<id>.json``;
* crash stores read through ``inspect`` equal dsh's inspect view (closers in memory);
* resuming a copy of each ``crash-before-resume`` session writes the tail dsh wrote in
  ``crash-after-resume`` (types, seqs, times, ids, codes, reasons; not wording, not the
  end-seed time).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from dsh.json import thaw
from dsh.persistence import Persistence, open_backend
from dsh.session._session import Session
from dsh.session._store import SessionStore

pytestmark = pytest.mark.no_speedups

MAIN_STORES = [("jsonl/main", "jsonl"), ("jsonl-unpacked/main", "jsonl"),
               ("jsonl-zstd/main", "jsonl+zstd")]
CRASH_STORES = [("jsonl", "jsonl"), ("jsonl-zstd", "jsonl+zstd")]


def expected(dsh_logs: Path, store: str, sid: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(
        (dsh_logs / "expected" / store / f"{sid}.json").read_text(encoding="utf-8"))
    return result


def session_ids(dsh_logs: Path, store: str) -> list[str]:
    root = dsh_logs / store
    return sorted(p.name for p in root.glob("*/*") if p.is_dir())


@pytest.mark.parametrize(("store", "scheme"), MAIN_STORES)
def test_dsh_main_store_loads_with_dsh_surface_and_messages(
        dsh_logs: Path, store: str, scheme: str) -> None:
    persistence = Persistence(open_backend(f"{scheme}://{dsh_logs / store}"))
    ids = session_ids(dsh_logs, store)
    assert ids == ["s1-normal", "s4-fork-of-s1", "s5-compaction"]
    for sid in ids:
        want = expected(dsh_logs, store, sid)
        view = persistence.inspect(sid)
        assert view.closers == () and view.torn is None
        assert [thaw(e) for e in view.events] == want["events"], sid
        assert dict(view.header) == want["meta"], sid
        session = Session.restore(sid, view.events, view.header,
                                  inherited_event_count=view.header.get("seedLength") or 0)
        assert list(session.surface.nodes) == want["surfaceNodes"], sid
        assert session.surface.replace_generation == want["replaceGeneration"], sid
        assert [thaw(m) for m in session.derive_messages()] == want["messages"], sid
    summaries = {s.id: s for s in persistence.list()}
    assert summaries["s1-normal"].event_count == 274
    assert summaries["s5-compaction"].event_count == 307


@pytest.mark.parametrize(("store", "scheme"), CRASH_STORES)
def test_dsh_crash_store_inspect_matches_dsh_inspect(
        dsh_logs: Path, store: str, scheme: str, tmp_path: Path) -> None:
    source = dsh_logs / store / "crash-before-resume"
    copy = tmp_path / "crash"
    shutil.copytree(source, copy)
    before = {p: p.read_bytes() for p in copy.rglob("session.jsonl*")}
    persistence = Persistence(open_backend(f"{scheme}://{copy}"))
    for sid in session_ids(dsh_logs, f"{store}/crash-before-resume"):
        want = expected(dsh_logs, f"{store}/crash-before-resume", sid)
        view = persistence.inspect(sid)
        ours = [thaw(e) for e in view.events]
        stored = len(ours) - len(view.closers)
        assert len(view.closers) >= 2
        assert ours[:stored] == want["events"][:stored], sid
        # closers: same facts as dsh's, wording is ours (docs/rules.md#closers texts)
        assert [_tail_facts(e) for e in ours[stored:]] == \
            [_tail_facts(e) for e in want["events"][stored:]], sid
    assert {p: p.read_bytes() for p in copy.rglob("session.jsonl*")} == before


def _tail_facts(event: dict[str, Any]) -> dict[str, Any]:
    """Types, seqs, times, ids, codes and reasons; not the model-facing wording."""
    data = event["data"]
    facts: dict[str, Any] = {"type": event["type"], "seq": event["seq"],
                             "sourceEventSeqs": event.get("sourceEventSeqs"),
                             "surfaceOp": event.get("surfaceOp")}
    if event["type"] != "session/end-seed":
        facts["time"] = event["time"]
    if isinstance(data, dict):
        for key in ("turn", "step", "reason", "error"):
            if key in data:
                facts[key] = data[key]
        message = data.get("message")
        if isinstance(message, dict):
            facts["message_id"] = message.get("id")
            facts["source"] = message.get("source")
            blocks = message.get("content") or []
            facts["blocks"] = [(b.get("type"), b.get("toolCallId"), b.get("isError"))
                               for b in blocks]
    return facts


@pytest.mark.parametrize(("store", "scheme"), CRASH_STORES)
def test_resuming_dsh_crash_copy_writes_dsh_tail(
        dsh_logs: Path, store: str, scheme: str, tmp_path: Path) -> None:
    copy = tmp_path / "crash"
    shutil.copytree(dsh_logs / store / "crash-before-resume", copy)
    persistence = Persistence(open_backend(f"{scheme}://{copy}"))
    reference = Persistence(open_backend(f"{scheme}://{dsh_logs / store / 'crash-after-resume'}"))
    for sid in session_ids(dsh_logs, f"{store}/crash-before-resume"):
        with persistence.open(sid) as handle:
            stored = len(handle.read().events)
        if sid.startswith("s2b"):
            # dsh ran a plain load() on s2b: repair committed, nothing published
            persistence.load(sid)
            ours = [thaw(e) for e in persistence.inspect(sid).events]
        else:
            live = SessionStore(persistence)
            session = live.resume(sid)
            live.dispose(session)
            with persistence.open(sid) as handle:
                ours = [thaw(e) for e in handle.read().events]
        with reference.open(sid) as handle:
            theirs = [thaw(e) for e in handle.read().events][:len(ours)]
        assert len(ours) > stored
        assert ours[:stored] == theirs[:stored], sid
        assert [_tail_facts(e) for e in ours[stored:]] == \
            [_tail_facts(e) for e in theirs[stored:]], sid
        # the file we wrote loads cleanly again and is balanced
        again = persistence.inspect(sid)
        assert again.closers == () and again.torn is None
    persistence.close()

"""Restore points: a resume from a restore point equals a full read, and any doubt falls back.

Each case builds a store through the write-behind writer (which keeps restore points), copies it,
removes the restore point from the copy, resumes both and compares everything a caller can see:
events (paged in), surface, messages, header folds, closers, the next appends (refusals
included) and what is stored afterwards. Rule: docs/rules.md#restore-points-are-never-the-truth,
docs/rules.md#the-read-pipeline (the pipeline), docs/rules.md#resume (resume).
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bench.fixtures import packed_point
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import dsh
import dsh.session._paging as paging
from dsh.persistence import Persistence, open_backend
from dsh.persistence import _restore_point as rp
from dsh.persistence._seal import read_seal, reset_seal
from dsh.persistence.jsonl import _restore_point as jrp
from dsh.session import NO_OLD_MARKS, LazyNodes, PagedLog, Session
from dsh.testing._stores import postgres_unreachable, temporary_postgres_url
from tests.strategies import (
    Script,
    StepClock,
    apply_script,
    assistant_data,
    completed_turn,
    examples,
    log_scripts,
    probe_appends,
    system_message,
    tool_call_block,
)

KINDS = ["jsonl", "jsonl-zstd", "jsonl-unpacked", "sqlite"]


def url_of(kind: str, root: Path) -> str:
    if kind == "jsonl":
        return f"jsonl://{root}"
    if kind == "jsonl-zstd":
        return f"jsonl+zstd://{root}"
    if kind == "jsonl-unpacked":
        return f"jsonl://{root}?pack_chunks=false"
    if kind == "sqlite":
        root.mkdir(parents=True, exist_ok=True)
        return f"sqlite://{root}/store.db"
    if kind == "sqlite14":  # the published dsh's layout (docs/formats.md#restore-points)
        root.mkdir(parents=True, exist_ok=True)
        return f"sqlite://{root}/store.db?schema=14"
    raise ValueError(kind)


@pytest.fixture(autouse=True)
def small_restore_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """Restore point at every flush, index every batch, page 4 events, pick 8: every boundary
    is hit.

    Surface nodes are stored packed from 2 on, the last 2 as seqs ("zt:"), so resumes here
    read the packed form, and inflate its head when they read before its last 2 nodes (the
    other restore point tests read the plain list); the page-in index packed from 2 entries
    on ("zi:").
    """
    monkeypatch.setattr(rp, "RESTORE_POINT_EVERY_EVENTS", 1)
    monkeypatch.setattr(rp, "PACKED_NODES_MIN", 2)
    monkeypatch.setattr(rp, "TAILED_NODES", 2)
    monkeypatch.setattr(rp, "INDEX_PACKED_MIN", 2)
    monkeypatch.setattr(rp, "INDEX_EVERY_EVENTS", 1)
    monkeypatch.setattr(paging, "PAGE_EVENTS", 4)
    monkeypatch.setattr(paging, "PICK_EVENTS", 8)


def build(url: str, script: Script) -> None:
    with dsh.open(url, clock=StepClock()).sessions as store:
        session = store.session("s")
        apply_script(session, script, lambda: store.flush(session))


def copy_without_restore_point(root: Path, to: Path) -> None:
    shutil.copytree(root, to)
    for ckpt in to.rglob("*.ckpt"):
        ckpt.unlink()


def snapshot(session: Session) -> dict[str, Any]:
    events = session.events
    return {"events": list(events), "len": len(events), "slice": events[2:-1],
            "rev": events[::-2], "last": events[-1], "nodes": list(session.surface.nodes),
            "gen": session.surface.replace_generation, "messages": session.derive_messages(),
            "header": session.request_header(), "context": session.request_context(),
            "first_live": session.first_live_seq, "inherited": session.inherited_event_count,
            "transcript": session.transcript_events()}


def resume_and_continue(url: str, sid: str = "s"
                        ) -> tuple[dict[str, Any], list[object], dict[str, Any], bool]:
    with dsh.open(url, clock=StepClock(2_000_000_000_000)).sessions as store:
        session = store.resume(sid)
        paged = isinstance(session._log, PagedLog)
        # the last messages first: a lazy surface ("zt:") answers them from its tail
        before = {"last_messages": list(session.derive_messages(last=3)), **snapshot(session)}
        outcomes = probe_appends(session)
        after = snapshot(session)
    return before, outcomes, after, paged


def stored(url: str, sid: str = "s") -> list[Any]:
    with Persistence(open_backend(url)) as persistence:
        return list(persistence.read(sid).events)


def assert_same_resume(paged_url: str, full_url: str, sid: str = "s", *,
                       expect_paged: bool | None = True) -> bool:
    """Resume ``sid`` from both stores, append the same probes, compare all that is seen.

    ``expect_paged`` None accepts either path; returns whether the restore point was used.
    """
    used = rp.stats["used"]
    paged = resume_and_continue(paged_url, sid)
    full = resume_and_continue(full_url, sid)
    if expect_paged is not None:
        assert paged[3] is expect_paged and rp.stats["used"] == used + expect_paged
    assert full[3] is False
    assert paged[:3] == full[:3]
    assert stored(paged_url, sid) == stored(full_url, sid)
    return paged[3]


def assert_equivalent(root: Path, kind: str, *, expect_paged: bool = True) -> None:
    full_root = root.parent / (root.name + "-full")
    copy_without_restore_point(root, full_root)
    assert_same_resume(url_of(kind, root), url_of(kind, full_root), expect_paged=expect_paged)


@settings(max_examples=examples(25), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=log_scripts(open_tail=None, max_actions=6), kind=st.sampled_from(KINDS),
       tail_nodes=st.sampled_from([0, 2, 256]))
def test_resume_from_a_restore_point_equals_the_full_read(script: Script, kind: str,
                                                          tail_nodes: int) -> None:
    assume(script.actions)
    rp.TAILED_NODES = tail_nodes  # (the fixture's monkeypatch puts the default back)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        build(url_of(kind, root), script)
        assume(list(root.rglob("session.jsonl*")))  # a script that appended nothing
        assert list(root.rglob("*.ckpt")), "the writer keeps a restore point"
        assert_equivalent(root, kind)


def long_store(kind: str, root: Path, turns: int = 30, *, open_turn: bool = False,
               system: bool = True, url: str | None = None) -> None:
    with dsh.open(url or url_of(kind, root), clock=StepClock()).sessions as store:
        session = store.session("s")
        if system:  # the published dsh 0.1.x does not know system/message
            session.append("system/message", system_message(), surface_op="append")
        for turn in range(1, turns + 1):
            completed_turn(session, turn, call_ids=[f"c{turn}"])
            store.flush(session)
        if open_turn:
            session.append("turn/start", {"turn": turns + 1})
            session.append("step/start", {"turn": turns + 1, "step": 1})
            store.flush(session)
            session.append("assistant/message", assistant_data(turns + 1, 1, [
                tool_call_block("open-call")]), surface_op="append")
            store.flush(session)


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "store"


def ckpt_file(root: Path) -> Path:
    (found,) = root.rglob("*.ckpt")
    return found


def log_file(root: Path) -> Path:
    (found,) = [p for p in root.rglob("session.jsonl*") if p.suffix not in (".seal", ".ckpt")]
    return found


@pytest.mark.no_speedups
def test_open_turn_is_closed_as_after_a_full_read(kind: str, root: Path) -> None:
    long_store(kind, root, open_turn=True)
    assert_equivalent(root, kind)


@pytest.mark.no_speedups
def test_open_turn_started_before_the_restore_point(kind: str, root: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    long_store(kind, root, open_turn=True)
    # a restore point cut inside the open turn: repair must read back to the turn/start
    with Persistence(open_backend(url_of(kind, root))) as persistence:
        assert persistence.write_restore_point("s")
    assert_equivalent(root, kind)


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage"])
def test_damaged_restore_point_is_refused(kind: str, root: Path, damage: str) -> None:
    long_store(kind, root)
    path = ckpt_file(root)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x20
    elif damage == "truncate":
        del data[len(data) - 7:]
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(b"DSHCKPT1 nonsense\n{}")
    path.write_bytes(bytes(data))
    reasons = {"flip": "digest", "truncate": "digest", "empty": "not-a-restore-point",
               "garbage": "digest"}
    refused = rp.stats[f"refused:{reasons[damage]}"]
    assert_equivalent(root, kind, expect_paged=False)
    assert rp.stats[f"refused:{reasons[damage]}"] == refused + 1


def test_restore_point_of_another_session_is_refused(kind: str, root: Path) -> None:
    long_store(kind, root)
    other = root.parent / "other"
    long_store(kind, other, turns=31)
    shutil.copy(ckpt_file(other), ckpt_file(root))
    assert_equivalent(root, kind, expect_paged=False)


def test_restore_point_of_a_replaced_log_is_refused(kind: str, root: Path) -> None:
    long_store(kind, root)
    saved = ckpt_file(root).read_bytes()
    shutil.rmtree(root)
    long_store(kind, root, turns=32)  # same id and clock: same header, other content
    ckpt_file(root).write_bytes(saved)
    assert_equivalent(root, kind, expect_paged=False)


@pytest.mark.no_speedups
def test_restore_point_behind_the_log_is_used(kind: str, root: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    long_store(kind, root)
    monkeypatch.setattr(rp, "RESTORE_POINT_EVERY_EVENTS", 10**9)
    monkeypatch.setattr(rp, "RESTORE_POINT_EVERY_BYTES", 10**12)
    saved = ckpt_file(root).read_bytes()
    with dsh.open(url_of(kind, root), clock=StepClock()).sessions as store:
        session = store.resume("s")
        completed_turn(session, 77)  # an older writer: appends without a new restore point
    assert ckpt_file(root).read_bytes() == saved
    assert_equivalent(root, kind)


def test_restore_point_past_a_truncated_log_is_refused(root: Path) -> None:
    long_store("jsonl", root)
    path = log_file(root)
    data = path.read_bytes()
    cut = data.rindex(b"\n", 0, len(data) - 1) + 1  # drop the last record
    path.write_bytes(data[:cut])
    # as if cut before the last seal records were written: the seal keeps those before the cut
    seal_path = path.with_name("session.jsonl.seal")
    seal = read_seal(seal_path)
    assert seal is not None
    reset_seal(seal_path, seal.identity, [r for r in seal.records if r[1] <= cut])
    assert_equivalent(root, "jsonl", expect_paged=False)


def test_torn_tail_after_the_restore_point_reads_in_full(kind: str, root: Path) -> None:
    long_store(kind, root, open_turn=True)
    with Persistence(open_backend(url_of(kind, root))) as persistence:
        from dsh.testing._stores import inject_torn_tail

        assert inject_torn_tail(persistence, "s")
    refused = rp.stats["refused:torn-tail"]
    assert_equivalent(root, kind, expect_paged=False)
    assert rp.stats["refused:torn-tail"] == refused + 1


def test_paged_session_keeps_the_log_out_of_memory(kind: str, root: Path) -> None:
    long_store(kind, root, turns=60)
    with dsh.open(url_of(kind, root)).sessions as store:
        session = store.resume("s")
        log = session._log
        assert isinstance(log, PagedLog)
        assert log.cut > 300
        assert log.resident_events <= 32 * 4 + 1  # the tail + at most 32 cached 4-event pages
        assert session.event_at(7)["seq"] == 7
        child = store.fork(session, 100)
        assert list(child.events)[:101] == list(session.events)[:101]


def test_fork_and_compaction_after_a_paged_resume(kind: str, root: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import itertools
    import uuid

    from dsh.compaction import DigestSummarizer, compact_now

    long_store(kind, root, turns=20)
    full_root = root.parent / "full"
    copy_without_restore_point(root, full_root)
    answers = []
    for url in (url_of(kind, root), url_of(kind, full_root)):
        ids = itertools.count()
        monkeypatch.setattr(uuid, "uuid4", lambda ids=ids: uuid.UUID(int=next(ids), version=4))
        with dsh.open(url, clock=StepClock(3)).sessions as store:
            session = store.resume("s")
            child = store.fork(session, 50, "child")
            assert compact_now(session, summarizer=DigestSummarizer()) is not None
            answers.append((list(child.events), snapshot(session)))
    assert answers[0] == answers[1]


@pytest.mark.no_speedups
def test_write_restore_point_gives_one_to_a_log_without_one(kind: str,
                                                                     root: Path) -> None:
    long_store(kind, root)
    ckpt_file(root).unlink()
    with Persistence(open_backend(url_of(kind, root))) as persistence:
        assert persistence.write_restore_point("s") is True
    assert_equivalent(root, kind)


def test_persistence_without_restore_points_still_resumes(tmp_path: Path) -> None:
    with dsh.open("memory:").sessions as store:
        session = store.session("s")
        completed_turn(session, 1)
        assert not isinstance(session._log, PagedLog)


def _verify_json(url: str, *, exit_code: int = 0) -> dict[str, Any]:
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "DSH_HOME": str(Path(tempfile.mkdtemp()))}
    proc = subprocess.run([sys.executable, "-m", "dsh.cli", "verify", "s", "--store", url,
                           "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == exit_code, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def _verified_in_process(url: str) -> tuple[str, list[Any]]:
    """What ``dsh verify s`` finds of session ``s``, without a process: the status of its
    restore point and its violations, from the function the command runs for each session
    (the command itself runs as a real process in the ``test_verify_*`` tests above)."""
    from dsh.cli._cmd_verify import _verify

    restore_points: dict[str, dict[str, object]] = {}
    with Persistence(open_backend(url)) as persistence:
        found = _verify(persistence, "s", [], restore_points, {}, None, False)
    return str(restore_points["s"]["status"]), found


def test_verify_reports_a_consistent_restore_point(kind: str, root: Path) -> None:
    long_store(kind, root)
    report = _verify_json(url_of(kind, root))
    check = report["restorePoints"]["s"]
    assert check["status"] == "consistent"
    assert check["eventCount"] == 1 + 30 * 8  # every event: the last flush wrote one
    assert report["violations"] == []


def test_verify_counts_matching_restore_points_and_lists_them_with_verbose(root: Path) -> None:
    # docs/cli.md: one note line counts them; --verbose names each session's restore point
    import os
    import subprocess
    import sys

    long_store("sqlite", root)
    env = {**os.environ, "DSH_HOME": str(Path(tempfile.mkdtemp()))}
    url = url_of("sqlite", root)

    def verify(*extra: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "dsh.cli", "verify", "--all", "--store",
                               url, *extra], capture_output=True, text=True, env=env,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stderr

    assert verify().splitlines() == [
        "note: 1 restore point matched the full read (a resume reads only the events after "
        "each; --verbose lists them)"]
    assert verify("--verbose").splitlines() == [
        "note: s: restore point covers 241 events and matches the full read; a resume reads "
        "only the events after it"]


def test_verify_warns_of_a_restore_point_a_resume_would_ignore(kind: str, root: Path) -> None:
    long_store(kind, root)
    path = ckpt_file(root)
    data = bytearray(path.read_bytes())
    data[-3] ^= 1
    path.write_bytes(bytes(data))
    report = _verify_json(url_of(kind, root))
    check = report["restorePoints"]["s"]
    assert check["status"] == "ignored"
    assert "a resume ignores it and reads the whole log" in check["message"]
    assert report["violations"] == []  # derived data: a warning, never a violation
    assert any("does not match the log (digest)" in note for note in report["notes"])


def test_verify_reports_an_absent_restore_point(kind: str, root: Path) -> None:
    long_store(kind, root)
    ckpt_file(root).unlink()
    assert _verify_json(url_of(kind, root))["restorePoints"]["s"]["status"] == "absent"


def test_verify_finds_a_restore_point_whose_state_is_wrong(root: Path) -> None:
    from dataclasses import replace

    long_store("jsonl", root)
    path = ckpt_file(root)
    restore_point = rp.decode_restore_point(path.read_bytes(), session_id="s", backend="jsonl")
    wrong = replace(restore_point.state, nodes=restore_point.state.nodes[:-1])
    # A seal written before restore points were bound records no digest: a resume's cheap
    # checks accept it (the log is unchanged), so this is a violation. (A seal that records
    # digests refuses it: tests/persistence/test_restore_point_forged.py.) Rewriting the seal
    # changes its bytes, so the restore point names its records the way it did before it
    # named a cut of the seal file (the digest of the records themselves).
    (seal_path,) = root.rglob("*.seal")
    seal = read_seal(seal_path)
    assert seal is not None and seal.restore_points
    anchor = replace(restore_point.anchor, seal_digest=jrp.seal_digest(
        seal.records, restore_point.anchor.byte_offset))
    path.write_bytes(rp.encode_restore_point(replace(restore_point, anchor=anchor, state=wrong)))
    reset_seal(seal_path, seal.identity, seal.records)
    out = _verify_json(url_of("jsonl", root), exit_code=1)
    check = out["restorePoints"]["s"]
    assert check["status"] == "misleading"
    assert "restore state differs" in check["message"]
    assert f"delete {path} and the next resume reads the whole log" in check["message"]
    assert [(v["rule"], v["seq"]) for v in out["violations"]] == [("RESTORE_POINT_MISMATCH", None)]


def test_verify_flags_a_prefix_edit_a_resume_would_not_see(kind: str, root: Path) -> None:
    # A resume from a restore point checks the prefix cheaply (size, header, the last bytes before
    # the cut, the seal records): an edit further back is found by the full read verify does.
    if kind == "jsonl-zstd":
        pytest.skip("a zstd frame checksum catches the edit when its page is read")
    long_store(kind, root)
    if kind == "sqlite":
        import sqlite3
        from contextlib import closing

        # sqlite3's own context manager commits but does not close
        with closing(sqlite3.connect(root / "store.db")) as db, db:
            db.execute("UPDATE events SET data = replace(data, 'c1', 'x1') WHERE seq < 20")
    else:
        log = log_file(root)
        text = log.read_bytes()
        log.write_bytes(text.replace(b'"c1"', b'"x1"', 1))
    out = _verify_json(url_of(kind, root), exit_code=1)
    assert out["violations"]  # the full read refuses the edited bytes


def peer_export(root: Path, out: Path) -> None:
    """The published dsh (Node) exports the JSONL store at ``root`` into ``out`` (one
    ``<id>.json`` a session: its events as it reads them); a loud skip when it is not set up."""
    import os
    import subprocess

    peer = Path(os.environ.get("DSH_NODE_DIR") or "/tmp/dsh-node")
    node = peer / "nodebin" / "node_modules" / "node" / "bin" / "node"
    if not node.is_file() or not (peer / "app" / "export.mjs").is_file():
        pytest.skip("SKIPPED LOUDLY: the published dsh is not set up (run "
                    "../shared/peers/dsh-node/setup.sh /tmp/dsh-node or set DSH_NODE_DIR)")
    proc = subprocess.run([str(node), str(peer / "app" / "export.mjs"), "jsonl", str(root),
                           str(out)], capture_output=True, text=True, cwd=peer / "app",
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_published_dsh_reads_a_folder_holding_a_restore_point(tmp_path: Path) -> None:
    import json

    root = tmp_path / "store"
    long_store("jsonl", root, open_turn=True, system=False)
    assert ckpt_file(root).is_file() and list(root.rglob("session.jsonl.seal"))
    with Persistence(open_backend(url_of("jsonl", root))) as persistence:
        ours = [dict(e) for e in persistence.read("s").stored_events]
    out = tmp_path / "export"
    peer_export(root, out)
    view = json.loads((out / "s.json").read_text())
    # dsh closes the open turn in memory with its own wording; the stored log is the same
    assert view["events"][:len(ours)] == ours
    assert view["events"][-1]["type"] == "turn/end"


@pytest.mark.parametrize("kind", ["jsonl", "jsonl-unpacked"])
def test_one_large_batch_is_indexed_inside_so_a_page_in_reads_about_a_page(
        kind: str, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A log written in a few big batches (write-behind, an import) must not leave the page-in
    # source one index entry per batch: each page would re-scan the whole batch.
    from dsh.persistence.jsonl import _backend as jsonl_module
    monkeypatch.setattr(jsonl_module, "_APPEND_SAMPLE_BYTES", 512)
    with dsh.open(url_of(kind, root), clock=StepClock()).sessions as store:
        session = store.session("s")
        for turn in range(1, 41):
            completed_turn(session, turn, call_ids=[f"c{turn}"])
        store.flush(session)  # one batch (the window never elapsed)
        session.append("user/message", {"id": "u-last", "role": "user", "source": {
            "kind": "user"}, "content": [{"type": "text", "text": "x"}]}, surface_op="append")
        store.flush(session)
    anchor = rp.decode_restore_point(rp.read_restore_point_file(ckpt_file(root)), session_id="s",
                                  backend="jsonl").anchor
    seqs = [seq for seq, _ in anchor.index]
    assert len(seqs) > 10 and seqs == sorted(set(seqs))
    data = log_file(root).read_bytes()
    for seq, offset in anchor.index:  # every entry is the start of the line holding seq
        assert offset == 0 or data[offset - 1:offset] == b"\n"
        assert f'"seq":{seq},'.encode() in data[offset:data.index(b"\n", offset)] or \
            f'"seq0":{seq},'.encode() in data[offset:data.index(b"\n", offset)]
    assert_equivalent(root, kind)


def test_sqlite_page_in_starting_inside_a_packed_row_reads_from_that_row(root: Path) -> None:
    # a page boundary (4 events here) falls inside a 30-member packed chunk row: the page-in
    # starts at the row holding it, found by seq, and yields exactly the events asked for
    with dsh.open(url_of("sqlite", root), clock=StepClock()).sessions as store:
        session = store.session("s")
        session.append("turn/start", {"turn": 1})
        session.append("step/start", {"turn": 1, "step": 1})
        session.append("assistant/chunk", {"turn": 1, "step": 1, "chunk": {
            "type": "block-start", "index": 0, "blockType": "text"}})
        for i in range(30):
            session.append("assistant/chunk", {"turn": 1, "step": 1, "chunk": {
                "type": "text-delta", "index": 0, "text": f"t{i} "}})
        session.append("assistant/message", assistant_data(1, 1, [
            {"type": "text", "text": "".join(f"t{i} " for i in range(30))}]),
            surface_op="append")
        session.append("step/end", {"turn": 1, "step": 1})
        session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        store.flush(session)
        completed_turn(session, 2, call_ids=["c2"])
        store.flush(session)
    packed = sqlite3.connect(root / "store.db").execute(
        "SELECT count(*) FROM events WHERE seq > 3 AND seq < 33").fetchone()[0]
    assert packed < 5  # the run is stored packed
    assert_equivalent(root, "sqlite")


@pytest.mark.no_speedups
def test_fork_child_resumes_through_its_restore_point(kind: str, root: Path) -> None:
    long_store(kind, root, turns=20, open_turn=True)
    with dsh.open(url_of(kind, root), clock=StepClock(7)).sessions as store:
        parent = store.resume("s")
        child = store.fork(parent, 150, "child")  # a cut inside turn 19: forked closers
        completed_turn(child, 40)
        store.flush(child)
    full_root = root.parent / "full"
    copy_without_restore_point(root, full_root)
    assert assert_same_resume(url_of(kind, root), url_of(kind, full_root), "child")


@pytest.mark.parametrize("context", ["deepseek/v4", [1, 2], 5])
def test_request_context_that_is_not_an_object_survives_the_restore_point(
        kind: str, root: Path, context: object) -> None:
    # Found by a tester: the fold kept only objects, the session keeps any JSON value.
    with dsh.open(url_of(kind, root), clock=StepClock()).sessions as store:
        session = store.session("s")
        session.append("turn/start", {"turn": 1})
        session.append("request/context", context)
        session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        assert session.request_context() == context
    assert_equivalent(root, kind)
    with dsh.open(url_of(kind, root)).sessions as store:
        assert store.resume("s").request_context() == context


def test_a_restore_point_temp_file_left_by_a_killed_writer_is_removed(kind: str,
                                                                      root: Path) -> None:
    long_store(kind, root, turns=3)
    path = ckpt_file(root)
    left = path.with_name(f".{path.name}.999999.tmp")  # a writer killed before its rename
    left.write_bytes(b"half a restore point")
    with dsh.open(url_of(kind, root), clock=StepClock()).sessions as store:
        session = store.resume("s")
        completed_turn(session, 4, call_ids=["c4"])
        store.flush(session)
    assert not left.exists()
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_an_uncompacted_session_resumes_without_paging_the_prefix_in(kind: str, root: Path) -> None:
    # docs/architecture.md#the-restore-point-path: the surface stays node seqs; the first
    # derive_messages pages the surface's events in, and equals a full read's
    long_store(kind, root)  # no compaction: a node in every 4-event page
    with dsh.open(url_of(kind, root)).sessions as store:
        session = store.resume("s")
        log = session._log
        assert isinstance(log, PagedLog)
        assert log.resident_events == len(log) - log.cut  # no page read
        assert sum(seq < log.cut for seq in session.surface.nodes) > 30
    assert_equivalent(root, kind, expect_paged=True)


def test_a_tampered_prefix_is_refused_when_it_is_paged_in(root: Path) -> None:
    """Same-length text replaced before the cut: a resume through the restore point checks each
    page against the seal when it pages it in (docs/rules.md#verified-page-in)."""
    long_store("jsonl", root)
    log = log_file(root)
    text = log.read_bytes()
    at = text.index(b'"c1"')
    tampered = text.replace(b'"c1"', b'"x1"', 1)
    log.write_bytes(tampered)
    with pytest.raises(dsh.LogCorruptError) as full:
        Persistence(open_backend(url_of("jsonl", root))).read("s")  # the full read refuses it
    assert full.value.where["path"] == str(log)
    with pytest.raises(dsh.LogCorruptError) as paged, \
            dsh.open(url_of("jsonl", root), clock=StepClock()).sessions as store:
        session = store.session("s")  # pages checked as the restore pages the surface in
        session.derive_messages()  # main: the model saw "x1"
    assert session.log_damage is paged.value
    # closing the store wrote nothing more to the damaged log (before: the resume's
    # session/end-seed marker was appended after the damage)
    assert log.read_bytes() == tampered
    error = paged.value
    assert error.where["path"] == str(log)
    assert error.where["byte_offset"] <= at
    assert "integrity seal" in error.message


def test_a_page_in_checks_each_seal_record_it_touches(root: Path) -> None:
    """The page-in source itself: a changed sealed range is named with file, byte and seq."""
    from dsh.persistence.jsonl._restore_point import JsonlPrefixSource

    long_store("jsonl", root)
    log = log_file(root)
    data = log.read_bytes()
    seal = read_seal(log.with_name(log.name + ".seal"))
    assert seal is not None and len(seal.records) > 3
    index = [(0, data.index(b"\n") + 1)]
    start2, end2, _ = seal.records[2]
    seq2 = sum(1 for line in data[:start2].split(b"\n")[1:] if line)  # events before it
    index.append((seq2, start2))
    cut = seal.records[-1][1]
    count = sum(1 for line in data[:cut].split(b"\n")[1:] if line)
    at = data.index(b'"c', start2)
    log.write_bytes(data[:at] + b'"x' + data[at + 2:])
    source = JsonlPrefixSource(log, "none", count, cut, index, seals=seal.records)
    with pytest.raises(dsh.LogCorruptError) as caught:
        source.read(seq2, seq2 + 1)
    assert caught.value.where == {"path": str(log), "byte_offset": start2, "seq": seq2}
    assert f"bytes {start2}..{end2}" in caught.value.message
    unchecked = JsonlPrefixSource(log, "none", count, cut, index)  # main: no seals to check
    assert unchecked.read(seq2, seq2 + 1)[0]["seq"] == seq2


def test_a_tampered_sqlite_prefix_is_refused_when_it_is_paged_in(root: Path) -> None:
    """Same-length text replaced in a row before the cut (docs/rules.md#verified-page-in)."""
    import sqlite3
    from contextlib import closing

    long_store("sqlite", root)
    with closing(sqlite3.connect(root / "store.db")) as db, db:
        changed = db.execute("UPDATE events SET data = replace(data, '\"c1\"', '\"x1\"') "
                             "WHERE seq < 20 AND data LIKE '%\"c1\"%'").rowcount
    assert changed >= 1
    with pytest.raises(dsh.LogCorruptError) as caught, \
            dsh.open(url_of("sqlite", root), clock=StepClock()).sessions as store:
        session = store.session("s")
        session.derive_messages()  # main: the model saw "x1"
    assert caught.value.where["path"] == str(root / "store.db")
    assert "integrity seal" in caught.value.message
    assert caught.value.where["seq"] < 20


@pytest.mark.parametrize("open_turn", [False, True])
def test_postgres_resume_from_a_restore_point_equals_the_full_read(root: Path,
                                                                   open_turn: bool) -> None:
    # docs/stores.md#capabilities: PostgreSQL keeps its restore points in a table; the same
    # log on SQLite, read in full, is the reference
    reason = postgres_unreachable()
    if reason is not None:
        pytest.skip(f"SKIPPED LOUDLY: {reason}")
    with temporary_postgres_url() as pg:
        long_store("postgresql", root, open_turn=open_turn, url=pg)
        full_root = root.parent / "full"
        full_root.mkdir()
        with Persistence(open_backend(pg)) as persistence, \
                persistence.open("s", "read") as handle, \
                Persistence(open_backend(url_of("sqlite", full_root))) as copy:
            read = handle.read(0)
            copy.create(read.header)  # the same log, read in full below
            with copy.open("s", "write") as writer:
                writer.append(read.events)
            point, cold, _source = handle.read_from_restore_point()
            assert point.anchor.backend == "postgresql"
            assert [e["seq"] for e in cold.events] == list(
                range(point.state.event_count, point.state.event_count + len(cold.events)))
        assert_same_resume(pg, url_of("sqlite", full_root))


def test_postgres_restore_point_is_refused_when_a_row_before_the_cut_changes(root: Path) -> None:
    reason = postgres_unreachable()
    if reason is not None:
        pytest.skip(f"SKIPPED LOUDLY: {reason}")
    import psycopg
    with temporary_postgres_url() as pg:
        long_store("postgresql", root, url=pg)
        server, _, schema = pg.partition("?schema=")
        with Persistence(open_backend(pg)) as persistence, \
                persistence.open("s", "read") as handle:
            cut = handle.read_from_restore_point()[0].state.event_count
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'UPDATE "{schema}".events SET time = time + 1 WHERE session_id = '
                         "'s' AND seq = (SELECT max(seq) FROM \"" + schema + "\".events "
                         "WHERE session_id = 's' AND seq < %s)", (cut,))
        refused = rp.stats["refused:tail-digest"]
        with dsh.open(pg).sessions as store:
            assert not isinstance(store.resume("s")._log, PagedLog)  # the full read
        assert rp.stats["refused:tail-digest"] == refused + 1


@pytest.mark.parametrize("open_turn", [False, True])
def test_schema_14_resume_from_a_restore_point_equals_the_full_read(root: Path,
                                                                    open_turn: bool) -> None:
    long_store("sqlite14", root, open_turn=open_turn, system=False)
    assert list(root.rglob("*.ckpt")), "the writer keeps a restore point for schema 14 too"
    assert_equivalent(root, "sqlite14")


def test_many_surface_nodes_are_stored_packed_and_read_back_exactly() -> None:
    # docs/formats.md#restore-points: nodes packed from 4,096 on, the last 256 as seqs ("zt:")
    from dsh.session import RestoreState
    nodes = (*range(0, 3 * rp.PACKED_NODES_MIN, 3), 1, 2, 2**40)  # any order, any size
    state = RestoreState(event_count=2**40 + 1, last_time=5, last_type="turn/end", nodes=nodes,
                         replace_generation=1, request_header=None, request_context=None,
                         inherited_markers=0, turn_boundary=-1, turn_open=False)
    anchor = rp.Anchor(backend="sqlite", session_id="s", incarnation="i",
                       event_count=state.event_count, byte_offset=1, header_digest="h",
                       tail_digest="t", seal_digest="")
    data = rp.encode_restore_point(rp.RestorePoint(anchor=anchor, state=state))
    head = len(nodes) - rp.TAILED_NODES
    tail = ",".join(map(str, nodes[head:]))
    assert f'"nodes":"zt:d:{head}:{max(nodes[:head])}:{tail}:'.encode() in data
    assert rp.decode_restore_point(data, session_id="s", backend="sqlite").state == state
    body = data.partition(b"\n")[2].replace(b'"nodes":"zt:d:', b'"nodes":"zt:d:AAAA')
    forged = b"DSHCKPT1 " + rp.digest(body).encode() + b"\n" + body
    with pytest.raises(rp.RestorePointRefused, match="bad-field:state"):
        rp.decode_restore_point(forged, session_id="s", backend="sqlite")


def test_a_tailed_seq_beyond_int64_is_refused_not_raised() -> None:
    # "zt:" tail seqs are decimal text: one past 2**63 - 1 is a refused restore point (the
    # caller reads in full), not an OverflowError out of the resume
    nodes = list(range(0, 3 * rp.PACKED_NODES_MIN, 3))
    body = packed_point(nodes, 3 * rp.PACKED_NODES_MIN).partition(b"\n")[2]
    text = _nodes_value(body)
    for seq in (2**63, 10**40):
        parts = text.split(b":", 5)
        parts[4] += b"," + str(seq).encode()
        forged = _resealed(body.replace(text, b":".join(parts)))
        with pytest.raises(rp.RestorePointRefused, match="bad-field:state"):
            rp.decode_restore_point(forged, session_id="s", backend="sqlite")


def test_a_tailed_list_with_other_than_ascii_digits_is_refused() -> None:
    # the head count, head max and tail seqs of "zt:" are ASCII digits (head max -1: no
    # head); a sign, a space, an empty seq or another script's digit is a refused restore point
    nodes = list(range(0, 3 * rp.PACKED_NODES_MIN, 3))
    body = packed_point(nodes, 3 * rp.PACKED_NODES_MIN).partition(b"\n")[2]
    text = _nodes_value(body)
    parts = text.split(b":", 5)
    for index, value in ((2, b"-1"), (2, b"+4"), (3, b" 7"), (4, parts[4] + b","),
                         (4, b"1,,2"), (4, parts[4] + ",\u0663".encode()),
                         (3, "\u0663".encode())):
        forged_parts = list(parts)
        forged_parts[index] = value
        forged = _resealed(body.replace(text, b":".join(forged_parts)))
        with pytest.raises(rp.RestorePointRefused, match="bad-field:state"):
            rp.decode_restore_point(forged, session_id="s", backend="sqlite")
    assert rp.decode_restore_point(_resealed(body), session_id="s", backend="sqlite")


def test_a_million_event_surface_is_read_back_packed() -> None:
    # an uncompacted 1M-event msg session holds ~364k nodes: they come back as one int64
    # buffer (NodeSeqs), inflated a chunk at a time, equal to the seqs written
    from dsh.session import NodeSeqs
    nodes = NodeSeqs([*range(0, 1_000_000, 11), *range(2, 1_000_000, 3)][:364_000])
    data = packed_point(nodes, 1_000_003)
    state = rp.decode_restore_point(data, session_id="s", backend="sqlite").state
    assert type(state.nodes) is NodeSeqs
    assert state.nodes == nodes and len(state.nodes) == 364_000
    assert state.nodes[-3:] == list(nodes)[-3:]
    with pytest.raises(rp.RestorePointRefused, match="bad-field:state"):  # a seq past the log
        rp.decode_restore_point(packed_point(nodes, 999_999), session_id="s",
                                backend="sqlite")
    for body in (data.partition(b"\n")[2], _as_before(data, nodes)):  # "zt:d:", "zd:"
        text = _nodes_value(body)
        assert text.startswith((b"zt:d:", b"zd:"))
        for cut in (8, len(text) // 2):  # a stream cut short, whatever the cut
            short = _resealed(body.replace(text, text[:-cut - cut % 4]))
            if text.startswith(b"zd:"):
                with pytest.raises(rp.RestorePointRefused, match="bad-field:state"):
                    rp.decode_restore_point(short, session_id="s", backend="sqlite")
                continue
            # "zt:": the head is inflated when first read, and found short then
            read = rp.decode_restore_point(short, session_id="s", backend="sqlite").state
            assert len(read.nodes) == 364_000 and list(read.nodes.known_tail()) == list(nodes)[-2:]
            with pytest.raises(dsh.LogCorruptError) as caught:
                read.nodes.to_array()
            assert caught.value.code == "RESTORE_POINT_MISMATCH"


def _resealed(body: bytes) -> bytes:
    return b"DSHCKPT1 " + rp.digest(body).encode() + b"\n" + body


def _nodes_value(body: bytes) -> bytes:
    start = body.index(b'"nodes":"') + len(b'"nodes":"')
    return body[start:body.index(b'"', start)]


def _as_before(data: bytes, seqs: Any) -> bytes:
    """``data``'s body with its nodes as a writer before "zt:" stored them ("zb:" or "zd:")."""
    from binascii import b2a_base64

    from dsh.session import NodeSeqs
    body = data.partition(b"\n")[2]
    narrow, packed = NodeSeqs(seqs).pack_best()
    old = (b"zb:" if narrow else b"zd:") + b2a_base64(packed, newline=False)
    return body.replace(b'"nodes":"' + _nodes_value(body), b'"nodes":"' + old)


@pytest.mark.no_speedups
def test_packed_node_differences_summing_out_of_range_are_refused() -> None:
    # the differences are summed in place (C: running_sums_below; Python: the reference) and
    # every sum is range-checked: below 0, past the log, past the int64 range
    import zlib
    from array import array
    from binascii import b2a_base64
    nodes = (*range(1, rp.PACKED_NODES_MIN), 0)  # the last falls: int64 differences ("zd:")
    body = _as_before(packed_point(nodes, rp.PACKED_NODES_MIN), nodes)
    text = _nodes_value(body)
    assert text.startswith(b"zd:")
    assert rp.decode_restore_point(_resealed(body), session_id="s",
                                   backend="sqlite").state.nodes == nodes
    for deltas in ([1] * rp.PACKED_NODES_MIN, [0, -1, *[1] * 4094], [2**62, 2**62, 2**62]):
        packed = b"zd:" + b2a_base64(zlib.compress(array("q", deltas).tobytes()), newline=False)
        with pytest.raises(rp.RestorePointRefused, match="bad-field:state"):
            rp.decode_restore_point(_resealed(body.replace(text, packed)), session_id="s",
                                    backend="sqlite")


@pytest.mark.parametrize("prefix", [b"zb:", b"zd:"])
def test_packed_nodes_follow_one_inflate_rule_in_either_form(prefix: bytes) -> None:
    # docs/formats.md#restore-points: both forms are inflated raw (the body's SHA-256 already
    # vouched for the bytes, so the Adler-32 is not computed again): the zlib header is still
    # checked, and a stream whose 4-byte trailer is missing, or followed by more bytes, is
    # refused; a trailer whose Adler-32 is wrong is not looked at, in either form
    import zlib
    from array import array
    from binascii import b2a_base64
    seqs = list(range(2, 2 * rp.PACKED_NODES_MIN + 2, 2))
    body = _as_before(packed_point(seqs, 2 * rp.PACKED_NODES_MIN + 2), seqs)
    # rising seqs were written "zb:": the form under test is put in its place
    text = _nodes_value(body)
    raw = bytes([2] * len(seqs)) if prefix == b"zb:" else array("q", [2] * len(seqs)).tobytes()

    def decoded(stream: bytes) -> Any:
        return rp.decode_restore_point(_resealed(body.replace(text, prefix + b2a_base64(
            stream, newline=False))), session_id="s", backend="sqlite").state.nodes

    stream = zlib.compress(raw)
    assert decoded(stream) == seqs
    assert decoded(stream[:-4] + bytes(b ^ 0xFF for b in stream[-4:])) == seqs
    headerless = zlib.compressobj(wbits=-15)
    headerless_stream = headerless.compress(raw) + headerless.flush()
    gzipped = zlib.compressobj(wbits=31)
    gzip_stream = gzipped.compress(raw) + gzipped.flush()
    for bad in (stream[:-4], stream[:-1], stream + b"\0", headerless_stream, gzip_stream,
                bytes([stream[0], stream[1] ^ 0x20]) + stream[2:], stream[:len(stream) // 2]):
        with pytest.raises(rp.RestorePointRefused, match="bad-field:state"):
            decoded(bad)


def _nodes_text(body: bytes, prefix: bytes) -> bytes:
    start = body.index(b'"nodes":"' + prefix) + len(b'"nodes":"') + len(prefix)
    return body[start:body.index(b'"', start)]


@pytest.mark.parametrize("speedups", [True, False])
def test_nodes_rising_by_at_most_255_are_stored_a_byte_each_and_checked(
        speedups: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/formats.md#restore-points: "zb:" holds one-byte differences, widened and summed
    # in place on read, every seq checked below eventCount as for "zd:"
    import zlib
    from binascii import b2a_base64

    from dsh.session import NodeSeqs, _surface
    if not speedups:
        monkeypatch.setattr(_surface, "c_running_sums_below", None)
        monkeypatch.setattr(_surface, "c_widen_sums_below", None)
    nodes = [*range(3, 3 * rp.PACKED_NODES_MIN, 3), 3 * rp.PACKED_NODES_MIN + 252]
    count = nodes[-1] + 1
    data = packed_point(nodes, count)
    assert b'"nodes":"zt:b:' in data  # the head's differences a byte each
    state = rp.decode_restore_point(data, session_id="s", backend="sqlite").state
    assert type(state.nodes) is NodeSeqs and state.nodes == nodes
    assert rp.encode_restore_point(rp.RestorePoint(  # read back: the very bytes again
        anchor=rp.decode_restore_point(data, session_id="s", backend="sqlite").anchor,
        state=state)) == data
    # one difference over 255 in the head: the int64 form
    assert b'"nodes":"zt:d:' in packed_point([count + 256, *nodes], count + 257)
    body = _as_before(data, nodes)  # "zb:", as written before "zt:"
    state = rp.decode_restore_point(_resealed(body), session_id="s", backend="sqlite").state
    assert type(state.nodes) is NodeSeqs and state.nodes == nodes
    assert state.nodes[-2:] == nodes[-2:] and state.nodes.to_array().tolist() == nodes
    assert state.nodes.to_array().tolist() == nodes  # inflated again after the first hand-out
    assert NodeSeqs(nodes).pack() == state.nodes.pack()  # the int64 form is still at hand
    text = _nodes_text(body, b"zb:")
    for bad in (bytes([1] * (count - 1)) + b"\x02",  # sums to eventCount: past the log
                bytes([1] * (count + 1))):  # more seqs than events
        forged = _resealed(body.replace(text, b2a_base64(zlib.compress(bad), newline=False)))
        with pytest.raises(rp.RestorePointRefused, match="bad-field:state"):
            rp.decode_restore_point(forged, session_id="s", backend="sqlite")
    for cut in (8, len(text) // 2):  # a stream cut short
        short = _resealed(body.replace(text, text[:-cut - cut % 4]))
        with pytest.raises(rp.RestorePointRefused, match="bad-field:state"):
            rp.decode_restore_point(short, session_id="s", backend="sqlite")


def test_nodes_written_as_int64_differences_before_are_still_read() -> None:
    # a restore point written before "zb:" holds "zd:" for the same rising seqs: still read
    from binascii import b2a_base64

    from dsh.session import NodeSeqs
    nodes = list(range(2, 2 * rp.PACKED_NODES_MIN + 2, 2))
    body = packed_point(nodes, 2 * rp.PACKED_NODES_MIN + 2).partition(b"\n")[2]
    old = b"zd:" + b2a_base64(NodeSeqs(nodes).pack(), newline=False)
    state = rp.decode_restore_point(
        _resealed(body.replace(_nodes_value(body), old)), session_id="s",
        backend="sqlite").state
    assert state.nodes == nodes and state.nodes.pack_narrow() == NodeSeqs(nodes).pack_narrow()


@pytest.mark.no_speedups
def test_nodes_packed_as_seqs_by_an_earlier_writer_are_still_read() -> None:
    import zlib
    from array import array
    from binascii import b2a_base64
    seqs = [*range(5, 3 * rp.PACKED_NODES_MIN, 3), 1, 2]
    data = packed_point(seqs, 3 * rp.PACKED_NODES_MIN)
    body = data.partition(b"\n")[2]
    old = b"zn:" + b2a_base64(zlib.compress(array("q", seqs).tobytes()), newline=False)
    state = rp.decode_restore_point(_resealed(body.replace(_nodes_value(body), old)),
                                    session_id="s", backend="sqlite").state
    assert state.nodes == seqs


@pytest.mark.parametrize("kind", ["jsonl", "jsonl-zstd", "sqlite"])
def test_the_first_derive_decodes_only_the_surfaces_events(kind: str, root: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    # docs/rules.md#verified-page-in: the derive after a resume picks the surface's events
    # out of checked ranges; no whole range is decoded and no page enters the cache
    from dsh.json import c_scan_lines
    from dsh.persistence.sqlite import _restore_point as srp

    long_store(kind, root)
    full_root = root.parent / "full"
    copy_without_restore_point(root, full_root)
    with dsh.open(url_of(kind, full_root)).sessions as store:
        expected = list(store.resume("s").derive_messages())
    with dsh.open(url_of(kind, root)).sessions as store:
        session = store.resume("s")
        log = session._log
        assert isinstance(log, PagedLog)
        with monkeypatch.context() as patched:
            def whole_range(*args: object, **kwargs: object) -> None:
                raise AssertionError("a whole range was decoded")

            if c_scan_lines is not None:  # without the accelerator JSONL scans whole ranges
                patched.setattr(jrp, "_scan", whole_range)
            patched.setattr(srp, "scan_rows", whole_range)
            messages = session.derive_messages()
        assert list(messages) == expected and len(expected) > 90
        assert log.resident_events == len(log) - log.cut  # no page read


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
def test_an_edit_between_the_surfaces_events_is_refused_by_the_derive(kind: str,
                                                                      root: Path) -> None:
    """A same-length edit in an event the derive does not decode (a ``tool/call``, not on the
    surface): its range is checked against the seal all the same
    (docs/rules.md#verified-page-in)."""
    import sqlite3
    from contextlib import closing

    long_store(kind, root)
    if kind == "sqlite":
        with closing(sqlite3.connect(root / "store.db")) as db, db:
            changed = db.execute("UPDATE events SET data = replace(data, 'read_file', "
                                 "'read_fila') WHERE type = 'tool/call' AND seq < 20").rowcount
        assert changed >= 1
    else:
        log = log_file(root)
        text = log.read_bytes()
        line = text.index(b'"type":"tool/call"')
        at = text.index(b"read_file", line)
        log.write_bytes(text[:at] + b"read_fila" + text[at + 9:])
    with pytest.raises(dsh.LogCorruptError) as caught, \
            dsh.open(url_of(kind, root), clock=StepClock()).sessions as store:
        session = store.resume("s")
        assert isinstance(session._log, PagedLog)
        session.derive_messages()
    assert "integrity seal" in caught.value.message


@pytest.mark.parametrize("kind", ["jsonl", "jsonl-zstd"])
def test_a_packed_surface_and_index_are_inflated_only_when_asked_for(kind: str,
                                                                     root: Path) -> None:
    # docs/formats.md#restore-points ("zt:", "zi:"): a JSONL resume reads the surface's tail
    # and the index's ends; the last messages and the next appends inflate nothing; the full
    # derive inflates the surface's head, and its first page-in the index
    long_store(kind, root, turns=60)
    body = next(root.rglob("*.ckpt")).read_bytes()
    assert b'"index":"zi:' in body and b'"nodes":"zt:b:' in body
    with dsh.open(url_of(kind, root), clock=StepClock(2_000_000_000_000)).sessions as store:
        session = store.resume("s")
        assert isinstance(session._log, PagedLog)
        index = session._log._source._index
        assert isinstance(index, rp.PageIndex) and not index.inflated
        nodes = session._nodes
        assert isinstance(nodes, LazyNodes) and not nodes.inflated
        last = session.derive_messages(last=2)
        completed_turn(session, 61, call_ids=["c61"])
        store.flush(session)
        assert not nodes.inflated and not index.inflated
        messages = session.derive_messages()
        assert nodes.inflated and index.inflated
        assert any(list(messages[i:i + 2]) == list(last) for i in range(len(messages) - 1))
    assert_equivalent(root, kind)


def test_a_page_index_reads_its_ends_packed_and_checks_the_rest_when_inflated() -> None:
    pairs = [(0, 40), *((seq, 40 + seq * 100) for seq in range(3, 300, 3))]
    text = rp.PageIndex(pairs).pack()
    index = rp.PageIndex.unpack(text)
    assert len(index) == len(pairs) and index[0] == (0, 40) and index[-1] == pairs[-1]
    copy = index.copy()
    copy.append((400, 90_000))
    assert copy[-1] == (400, 90_000) and len(copy) == len(pairs) + 1 and len(index) == len(pairs)
    assert not index.inflated and not copy.inflated and index.pack() == text
    assert list(index) == pairs and index[5] == pairs[5] and index == pairs
    assert list(copy) == [*pairs, (400, 90_000)] and index.inflated and copy.inflated
    assert rp.PageIndex.unpack(copy.pack()) == copy
    head, _, packed = text.rpartition(":")
    count, first_seq, first_offset, last_seq, last_offset = map(int, head.split(":")[1:])
    for claim in (f"zi:{count - 1}:{first_seq}:{first_offset}:{last_seq}:{last_offset}",
                  f"zi:{count}:{first_seq}:{first_offset + 1}:{last_seq}:{last_offset}",
                  f"zi:{count}:{first_seq}:{first_offset}:{last_seq - 1}:{last_offset}"):
        claimed = rp.PageIndex.unpack(f"{claim}:{packed}")
        with pytest.raises(dsh.LogCorruptError) as caught:
            list(claimed)
        assert caught.value.code == "RESTORE_POINT_MISMATCH"
    falling = rp.PageIndex.unpack(rp.PageIndex([(0, 5), (4, 9), (2, 12), (8, 20)]).pack())
    with pytest.raises(dsh.LogCorruptError, match="do not rise"):
        falling[1]
    for bad in ("zi:0:0:0:0:0:", "zi:2:5:5:5:5:", "zi:3:0:1:1:9:eAE=", "zi:2:0:1:x:9:",
                "zj:2:0:1:5:9:", f"{head}:{packed}!", "zi:2:0:1:5:9"):
        with pytest.raises(ValueError):
            rp.PageIndex.unpack(bad)


def test_a_page_index_claiming_numbers_beyond_safe_integers_is_refused() -> None:
    # a count or an end past 2**53 - 1 (any int field's bound) is a refused restore point
    # (bad-field:index, the resume reads in full): len() and the first inner read raised
    # OverflowError (no ssize_t) instead of the index being refused or found corrupt
    text = rp.PageIndex([(0, 40), *((seq, 40 + seq * 100) for seq in range(3, 300, 3))]).pack()
    packed = text.rpartition(":")[2]
    huge = 2**61
    for claim in (f"zi:{10**25}:0:40:{10**26}:{10**26}", f"zi:{huge}:0:40:{2 * huge}:{2 * huge}"):
        with pytest.raises(ValueError, match="beyond"):
            rp.PageIndex.unpack(f"{claim}:{packed}")


def test_a_listed_page_index_claiming_numbers_beyond_safe_integers_is_refused() -> None:
    # the listed (older) form is bound as the "zi:" form is: before, [2**63, 2**64 - 1] was
    # accepted and a page-in's pread raised OverflowError
    for listed in ([[0, 10], [2**63, 2**64 - 1]], [[0, 10], [5, 2**53]]):
        with pytest.raises(rp.RestorePointRefused, match="bad-field:index"):
            rp._index(listed)
    assert rp._index([[0, 10], [5, 2**53 - 1]]) == ((0, 10), (5, 2**53 - 1))


def test_a_page_index_listed_as_pairs_is_still_read() -> None:
    # written before "zi:" (and below INDEX_PACKED_MIN entries): [seq, offset] pairs
    from dsh.session import RestoreState
    state = RestoreState(event_count=50, last_time=5, last_type="turn/end", nodes=(1, 2),
                         replace_generation=0, request_header=None, request_context=None,
                         inherited_markers=0, turn_boundary=-1, turn_open=False)
    pairs = ((0, 30), (10, 900), (20, 1800))
    anchor = rp.Anchor(backend="jsonl", session_id="s", incarnation="i", event_count=50,
                       byte_offset=4000, header_digest="h", tail_digest="t", seal_digest="",
                       index=pairs)
    data = rp.encode_restore_point(rp.RestorePoint(anchor=anchor, state=state))
    assert b'"index":"zi:3:0:30:20:1800:' in data
    listed = _resealed(data.partition(b"\n")[2].replace(
        b'"index":"' + data.split(b'"index":"')[1].split(b'"')[0] + b'"',
        b'"index":[[0,30],[10,900],[20,1800]]'))
    read = rp.decode_restore_point(listed, session_id="s", backend="jsonl")
    assert read.anchor.index == pairs and read.state == state
    for bad in (b"[[0,30],[10,900],[10,1800]]", b"[[0,30],[10]]", b'"zi:1"'):
        forged = _resealed(listed.partition(b"\n")[2].replace(
            b"[[0,30],[10,900],[20,1800]]", bad))
        with pytest.raises(rp.RestorePointRefused, match="bad-field:index"):
            rp.decode_restore_point(forged, session_id="s", backend="jsonl")


def _older_states(patched: pytest.MonkeyPatch, fmt: int) -> None:
    """Make this process's writers keep restore points of format ``fmt`` (1: no ``lastTurn``,
    2: no ``oldMarks``; 3: as now), as a writer before that format did."""
    from dataclasses import replace

    from dsh.session import RestoreFold

    state = RestoreFold.state
    if fmt == 1:
        patched.setattr(RestoreFold, "state", lambda self: replace(
            state(self), last_turn=None, old_marks=None))
    elif fmt == 2:
        patched.setattr(RestoreFold, "state", lambda self: replace(state(self),
                                                                     old_marks=None))


@pytest.mark.parametrize("fmt", [1, 2, 3])
@pytest.mark.parametrize("open_turn", [False, True])
def test_a_resumed_recorder_numbers_its_next_turn_from_any_restore_point_format(
        kind: str, root: Path, monkeypatch: pytest.MonkeyPatch, fmt: int,
        open_turn: bool) -> None:
    """Format 3 names the last turn (and the old adapter marks): the resume pages the prefix
    and the recorder reads nothing before the cut for the number.

    Points of format 1 (before ``lastTurn``) and 2 (before ``oldMarks``) are still read and
    verified consistent; a writer's resume does not page through them (they cannot say
    whether the prefix holds an old mark, docs/formats.md#restore-points) but reads the
    whole log; either way the next turn is the right one.
    """
    from dsh.agent import Recorder

    with monkeypatch.context() as patched:
        _older_states(patched, fmt)
        long_store(kind, root, turns=5, open_turn=open_turn)
    assert f'"format":{fmt},'.encode() in ckpt_file(root).read_bytes()
    url = url_of(kind, root)
    assert _verified_in_process(url) == ("consistent", [])
    walks: list[object] = []
    select_back = PagedLog.select_back

    def counted(self: PagedLog, *args: Any, **kwargs: Any) -> Any:
        walks.append(args[0])
        return select_back(self, *args, **kwargs)

    monkeypatch.setattr(PagedLog, "select_back", counted)
    with dsh.open(url, clock=StepClock(2_000_000_000_000)).sessions as store:
        session = store.resume("s")
        assert isinstance(session._log, PagedLog) is (fmt == 3)
        assert (session.prefix_turns() is None) is (fmt != 3)
        recorder = Recorder(session, store=store)
        assert not walks
        next_turn = 7 if open_turn else 6  # the interrupted turn 6 was closed by the resume
        assert recorder.next_turn == next_turn
        with recorder.turn():
            pass
        store.flush(session)
    starts = [e["data"]["turn"] for e in stored(url) if e["type"] == "turn/start"]
    assert starts == [*range(1, next_turn + 1)]
    assert _verified_in_process(url)[1] == []


@pytest.mark.parametrize("fmt", [1, 2])
@pytest.mark.parametrize("kind", [*KINDS, "postgresql"])
def test_a_writer_finding_an_older_restore_point_leaves_a_format_3_one(
        kind: str, root: Path, monkeypatch: pytest.MonkeyPatch, fmt: int) -> None:
    """docs/formats.md#restore-points: a writer that finds a format 1 or 2 point reads the
    whole log once, and the restore point it leaves is format 3 (its last turn and old marks
    known); a resume from it numbers the next turn right. On every store kind, PostgreSQL's
    restore point table included."""
    from dsh.agent import Recorder

    pg = contextlib.ExitStack()
    if kind == "postgresql":
        reason = postgres_unreachable()
        if reason is not None:
            pytest.skip(f"SKIPPED LOUDLY: {reason}")
        url = pg.enter_context(temporary_postgres_url())
    else:
        url = url_of(kind, root)

    def state() -> Any:
        with Persistence(open_backend(url)) as persistence, \
                persistence.open("s", "read") as handle:
            point, cold, _ = handle.read_from_restore_point()
            assert not cold.events  # written at the writer's close: no tail after its cut
            return point.state

    def resumed_next_turn() -> int:
        with dsh.open(url, clock=StepClock(3_000_000_000_000)).sessions as store:
            session = store.resume("s")
            assert isinstance(session._log, PagedLog)
            return Recorder(session, store=store).next_turn

    with pg:
        with monkeypatch.context() as patched:  # a writer before format 3
            _older_states(patched, fmt)
            long_store(kind, root, turns=3, url=url)
        assert (state().last_turn is None) is (fmt == 1) and state().old_marks is None
        with dsh.open(url, clock=StepClock(2_000_000_000_000)).sessions as store:
            session = store.resume("s")
            assert not isinstance(session._log, PagedLog)  # the whole log, once
            session.append("system/message", system_message(), surface_op="append")
        assert (state().last_turn, state().old_marks) == (3, NO_OLD_MARKS)
        assert resumed_next_turn() == 4
        assert _verified_in_process(url)[0] == "consistent"


def test_a_format_3_state_carries_the_old_marks_and_refuses_a_bad_one() -> None:
    """docs/formats.md#restore-points: ``oldMarks`` round-trips; a damaged one is refused
    (``bad-field:state``), never half-used."""
    from dsh.session import OldMarks, RestoreState
    state = RestoreState(event_count=50, last_time=5, last_type="turn/end", nodes=(1, 2),
                         replace_generation=0, request_header=None, request_context=None,
                         inherited_markers=0, turn_boundary=-1, turn_open=False, last_turn=0,
                         old_marks=OldMarks(7, ((3, "openai-agents"),)))
    anchor = rp.Anchor(backend="jsonl", session_id="s", incarnation="i", event_count=50,
                       byte_offset=4000, header_digest="h", tail_digest="t", seal_digest="",
                       index=((0, 30),))
    data = rp.encode_restore_point(rp.RestorePoint(anchor=anchor, state=state))
    assert b'"format":3,' in data
    assert b'"oldMarks":{"through":7,"popped":[[3,"openai-agents"]]}' in data
    assert rp.decode_restore_point(data, session_id="s", backend="jsonl").state == state
    body = data.partition(b"\n")[2]
    for bad in (b'{"through":7}', b'{"through":"7","popped":[]}',
                b'{"through":7,"popped":[[3,"other"]]}', b'{"through":7,"popped":[[-1,'
                b'"langchain"]]}'):
        forged = _resealed(body.replace(
            b'{"through":7,"popped":[[3,"openai-agents"]]}', bad))
        with pytest.raises(rp.RestorePointRefused, match="bad-field:state"):
            rp.decode_restore_point(forged, session_id="s", backend="jsonl")
    two = _resealed(body.replace(b'"format":3,', b'"format":2,'))  # format 2: no oldMarks
    with pytest.raises(rp.RestorePointRefused, match="bad-field:state"):
        rp.decode_restore_point(two, session_id="s", backend="jsonl")

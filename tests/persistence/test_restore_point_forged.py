"""A forged restore point (body edited, digest recomputed) never changes a resume's answer.

The writer records each restore point's digest in the integrity seal; a resume refuses one the
seal did not record and reads the whole log. Real files, JSONL and SQLite.
Rule: docs/rules.md#restore-points-are-never-the-truth.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh.persistence import Persistence, open_backend
from dsh.persistence import _restore_point as rp
from dsh.persistence._chain import ChainState
from dsh.persistence._seal import (
    SealCut,
    _records_start,
    read_seal,
    read_seal_after,
    reset_seal,
)
from dsh.persistence.jsonl import _restore_point as jrp
from dsh.persistence.sqlite import _restore_point as srp
from dsh.session import NodeSeqs, PagedLog
from tests.persistence.test_restore_point import (
    _verify_json,
    assert_equivalent,
    ckpt_file,
    long_store,
    url_of,
)
from tests.persistence.test_restore_point import (
    root as root,
)
from tests.persistence.test_restore_point import (
    small_restore_points as small_restore_points,
)
from tests.strategies import StepClock, completed_turn

BOUND = ["jsonl", "sqlite"]


def seal_file(root: Path) -> Path:
    (found,) = root.rglob("*.seal")
    return found


def restore_point(root: Path, kind: str) -> rp.RestorePoint:
    """The restore point of session ``s`` in the store at ``root``, decoded."""
    return rp.decode_restore_point(ckpt_file(root).read_bytes(), session_id="s",
                                   backend="sqlite" if kind == "sqlite" else "jsonl")


def forge(root: Path, kind: str, how: str) -> None:
    """Edit the restore point's body in a way its own checks accept, digest recomputed."""
    path = ckpt_file(root)
    point = restore_point(root, kind)
    state = point.state
    if how == "drop-node":
        state = replace(state, nodes=state.nodes[:-1])
    elif how == "drop-nodes":
        state = replace(state, nodes=state.nodes[: len(state.nodes) // 2])
    else:
        raise ValueError(how)
    path.write_bytes(rp.encode_restore_point(replace(point, state=state)))


def strip_marks(root: Path, kind: str) -> None:
    """Rewrite the seal as one written before restore points were bound (no digests).

    The restore point then names the seal's records by their digest, as one written before
    it named a cut of the seal file did (a rewritten seal has other bytes).
    """
    path = seal_file(root)
    seal = read_seal(path)
    assert seal is not None and seal.restore_points
    ckpt = ckpt_file(root)
    point = restore_point(root, kind)
    assert SealCut.decode(point.anchor.seal_digest) is not None
    anchor = point.anchor
    old = (srp.seal_digest(seal.records, anchor.event_count) if kind == "sqlite"
           else jrp.seal_digest(seal.records, anchor.byte_offset))
    ckpt.write_bytes(rp.encode_restore_point(replace(point, anchor=replace(anchor,
                                                                          seal_digest=old))))
    reset_seal(path, seal.identity, seal.records)


def resume_counting_seal_records(url: str, monkeypatch: pytest.MonkeyPatch
                                 ) -> tuple[int, int, int]:
    """Resume ``s`` from ``url`` and derive its messages.

    Returns the chain records decoded by the resume, then the range records read by it and by
    the derive (the page-in reads those before the cut to check its pages).
    """
    import dsh.persistence._seal as seal_module

    decoded, ranges = [0], [0]
    real, real_ranges = seal_module.frame_record, seal_module._scan_ranges

    def counting(data: bytes | memoryview, pos: int) -> object:
        decoded[0] += 1
        return real(data, pos)

    def counting_ranges(data: bytes, pos: int, stop: int,
                        records: list[tuple[int, int, int]]) -> None:
        real_ranges(data, pos, stop, records)
        ranges[0] += len(records)

    monkeypatch.setattr(seal_module, "frame_record", counting)
    monkeypatch.setattr(seal_module, "_scan_ranges", counting_ranges)
    with dsh.open(url) as store:
        session = store.sessions.resume("s")
        at_resume = decoded[0]
        session.derive_messages()
    return at_resume, ranges[0], decoded[0]


@pytest.mark.parametrize("kind", BOUND)
def test_the_writer_records_the_restore_point_digest_in_the_seal(kind: str, root: Path) -> None:
    long_store(kind, root)
    seal = read_seal(seal_file(root))
    assert seal is not None
    digest = rp.body_digest(ckpt_file(root).read_bytes())
    assert bytes.fromhex(digest)[:12] in seal.restore_points
    assert seal.records and seal.records[0][0] == 0  # the range records are unchanged


@pytest.mark.parametrize("how", ["drop-node", "drop-nodes"])
@pytest.mark.parametrize("kind", BOUND)
def test_a_forged_restore_point_gives_the_full_read(kind: str, root: Path, how: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    long_store(kind, root)
    forge(root, kind, how)
    refused = rp.stats["refused:unbound"]
    with caplog.at_level(logging.WARNING, logger="dsh.persistence._restore_point"):
        assert_equivalent(root, kind, expect_paged=False)  # the same view, through a full read
    assert rp.stats["refused:unbound"] == refused + 1
    assert [r for r in caplog.records if str(ckpt_file(root)) in r.getMessage()
            and "never recorded" in r.getMessage()]


@pytest.mark.parametrize("kind", BOUND)
def test_the_refusal_is_a_log_corrupt_error_naming_file_and_seq(kind: str, root: Path) -> None:
    long_store(kind, root)
    forge(root, kind, "drop-node")
    backend = open_backend(url_of(kind, root))
    with backend.open("s", "read") as handle, pytest.raises(rp.RestorePointRefused) as caught:
        handle.read_from_restore_point()  # type: ignore[attr-defined]
    error = caught.value.error
    assert caught.value.reason == "unbound" and isinstance(error, dsh.LogCorruptError)
    assert error.code == "RESTORE_POINT_FORGED"
    point = restore_point(root, kind)
    assert error.where == {"path": str(ckpt_file(root)), "seq": point.anchor.event_count}


@pytest.mark.parametrize("kind", BOUND)
def test_verify_reports_a_forged_restore_point(kind: str, root: Path) -> None:
    long_store(kind, root)
    forge(root, kind, "drop-node")
    out = _verify_json(url_of(kind, root), exit_code=1)
    check = out["restorePoints"]["s"]
    assert check["status"] == "forged"
    assert "never recorded" in check["message"] and str(ckpt_file(root)) in check["message"]
    assert [v["rule"] for v in out["violations"]] == ["RESTORE_POINT_FORGED"]


@pytest.mark.parametrize("kind", BOUND)
def test_a_restore_point_under_a_seal_without_digests_is_still_used(kind: str,
                                                                    root: Path) -> None:
    """A seal written before restore points were bound: the restore point is used as before."""
    long_store(kind, root)
    strip_marks(root, kind)
    assert_equivalent(root, kind, expect_paged=True)


@pytest.mark.parametrize("kind", BOUND)
def test_the_recorded_digest_survives_the_seal_rewrite_of_the_next_writer(
        kind: str, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    long_store(kind, root)
    before = ckpt_file(root).read_bytes()
    monkeypatch.setattr(rp, "RESTORE_POINT_EVERY_EVENTS", 10**9)  # none written below
    monkeypatch.setattr(rp, "RESTORE_POINT_EVERY_BYTES", 10**12)
    with dsh.open(url_of(kind, root), clock=StepClock(2_000_000_000_000)).sessions as store:
        session = store.resume("s")
        completed_turn(session, 31, call_ids=["c31"])
        store.flush(session)
    assert ckpt_file(root).read_bytes() == before
    used = rp.stats["used"]
    assert_equivalent(root, kind, expect_paged=True)
    assert rp.stats["used"] == used + 1


@pytest.mark.parametrize("kind", BOUND)
def test_a_resume_reads_only_the_seal_records_past_the_cut(
        kind: str, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The restore point names a cut of the seal file: what precedes it is digested, not read.

    Rule: docs/formats.md#restore-points. The records before the cut are read at the first
    page-in that reaches before those the cut carries (verified page-in), and a session
    resumed so is the one a full read gives.
    """
    long_store(kind, root)
    seal = read_seal(seal_file(root))
    assert seal is not None and len(seal.chain) > 2
    point = restore_point(root, kind)
    cut = SealCut.decode(point.anchor.seal_digest)
    assert cut is not None and cut.batches == sum(r.end <= point.anchor.event_count
                                                  for r in seal.chain)
    at_resume, ranges, decoded = resume_counting_seal_records(url_of(kind, root), monkeypatch)
    assert at_resume == len(seal.chain) - cut.batches  # none before the cut
    # the page-in read those before the cut, once; a SQLite cut carries the records of its
    # last pages (here all of them), so it reads none (docs/rules.md#verified-page-in)
    assert bool(cut.tail) == (kind == "sqlite")
    assert ranges == (0 if cut.tail else cut.records)
    assert decoded == at_resume  # stepped over by their length, the digest vouching for them
    assert_equivalent(root, kind, expect_paged=True)


@pytest.mark.parametrize("kind", BOUND)
def test_a_rewritten_seal_makes_the_restore_point_stale(kind: str, root: Path) -> None:
    """The same records in other bytes (a rewrite) are not the cut the restore point names.

    The resume refuses it (``seal``) and reads the whole log, which gives the same session.
    """
    long_store(kind, root)
    path = seal_file(root)
    seal = read_seal(path)
    assert seal is not None
    reset_seal(path, seal.identity, seal.records, seal.restore_points,
               chain=ChainState(list(seal.chain), seal.head.counter if seal.head else 0))
    refused = rp.stats["refused:seal"]
    assert_equivalent(root, kind, expect_paged=False)
    assert rp.stats["refused:seal"] == refused + 1


@pytest.mark.parametrize("kind", BOUND)
def test_a_restore_point_naming_another_seal_cut_is_refused(kind: str, root: Path) -> None:
    """A cut moved in the restore point (body re-digested, its digest recorded) is refused.

    The cut's digest no longer covers the seal's bytes before it, so the resume reads in full.
    """
    long_store(kind, root)
    path = ckpt_file(root)
    point = restore_point(root, kind)
    cut = SealCut.decode(point.anchor.seal_digest)
    assert cut is not None
    moved = replace(cut, offset=cut.offset - 20)
    data = rp.encode_restore_point(replace(point, anchor=replace(
        point.anchor, seal_digest=moved.encode())))
    path.write_bytes(data)
    with open(seal_file(root), "ab") as f:  # as if its writer had recorded it
        f.write((0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "little")
                + bytes.fromhex(rp.body_digest(data))[:12])
    refused = rp.stats["refused:seal"]
    assert_equivalent(root, kind, expect_paged=False)
    assert rp.stats["refused:seal"] == refused + 1


@pytest.mark.parametrize("kind", BOUND)
def test_a_writer_resumed_past_a_seal_cut_rewrites_the_whole_seal_when_it_must(
        kind: str, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A seal write that fails after such a resume makes the next one rewrite the seal whole.

    The rewrite reads the records the resume left unread first, so the new seal still covers
    the log from its first byte (row) with an unbroken chain, and the log reads in full.
    """
    long_store(kind, root)
    before = read_seal(seal_file(root))
    assert before is not None
    # the seal's append: SQLite writes the bytes batch_seal built, JSONL appends its records
    module, seam = ("dsh.persistence.sqlite._backend", "write_all") if kind == "sqlite" \
        else ("dsh.persistence.jsonl._backend", "append_batch_to")
    real = getattr(__import__(module, fromlist=[seam]), seam)
    failures = [1]

    def failing(*args: Any) -> None:
        if failures:
            failures.pop()
            raise OSError("disk full (test)")
        real(*args)

    with dsh.open(url_of(kind, root), clock=StepClock(2_000_000_000_000)).sessions as store:
        session = store.resume("s")
        assert isinstance(session._log, PagedLog)
        monkeypatch.setattr(f"{module}.{seam}", failing)
        for turn in (31, 32):  # the first flush's seal write fails, the second rewrites
            completed_turn(session, turn, call_ids=[f"c{turn}"])
            store.flush(session)
        assert not failures
    after = read_seal(seal_file(root))
    assert after is not None and after.elided is None
    assert after.records[0][0] == 0 and after.records[:len(before.records)] == before.records
    assert [r.hash for r in after.chain[:len(before.chain)]] == [r.hash for r in before.chain]
    assert len(after.chain) == len(before.chain) + 2
    with Persistence(open_backend(url_of(kind, root))) as persistence:
        assert len(persistence.read("s").events) == len(session.events)


@pytest.mark.parametrize("kind", BOUND)
def test_a_head_behind_the_seal_cut_makes_the_resume_read_the_seal_whole(
        kind: str, root: Path) -> None:
    """A published head that counts fewer batches than the cut cannot be checked past it.

    (A writer that died between two head publications.) The resume then reads the seal whole,
    still through the restore point, and gives the full read's session.
    """
    from dsh.persistence._chain import HEAD_SLOT, Head, encode_head

    long_store(kind, root)
    path = seal_file(root)
    seal = read_seal(path)
    assert seal is not None and seal.head is not None
    point = restore_point(root, kind)
    cut = SealCut.decode(point.anchor.seal_digest)
    assert cut is not None and cut.batches > 2
    older = seal.chain[1]  # a head published after the second batch
    slot = encode_head(Head(seal.head.counter + 1, 2, older.end, older.hash))
    data = bytearray(path.read_bytes())
    at = 8 + 4 + len(seal.identity)
    data[at:at + 2 * HEAD_SLOT] = slot + slot
    path.write_bytes(bytes(data))
    after = read_seal_after(path, cut)
    assert after is not None and after.elided is None and len(after.chain) == len(seal.chain)
    assert_equivalent(root, kind, expect_paged=True)


@pytest.mark.parametrize("kind", BOUND)
def test_a_restore_point_naming_a_cut_after_the_seals_digests_is_refused(
        kind: str, root: Path) -> None:
    """A forged restore point whose seal cut lies past every recorded digest is refused.

    Rule: docs/rules.md#restore-points-are-never-the-truth. The cut's digest is of the seal's
    own bytes, so anyone who can read the seal can name a cut at its end, after every restore
    point digest it records: the resume then sees no digest recorded after the cut. A writer
    that names a cut records the restore point's digest after it, so none there is a refusal
    (the full read's answer), not a restore point trusted by its own digest.
    """
    long_store(kind, root)
    path = seal_file(root)
    seal = read_seal(path)
    assert seal is not None and seal.restore_points
    point = restore_point(root, kind)
    cut = SealCut.decode(point.anchor.seal_digest)
    assert cut is not None
    data = path.read_bytes()
    found = _records_start(path, data)
    assert found is not None
    at_end = replace(cut, offset=len(data),
                     digest=hashlib.sha256(data[found[0]:]).digest())
    state = replace(point.state, nodes=point.state.nodes[: len(point.state.nodes) // 2])
    ckpt_file(root).write_bytes(rp.encode_restore_point(replace(
        point, state=state, anchor=replace(point.anchor, seal_digest=at_end.encode()))))
    assert read_seal_after(path, at_end) is not None  # the cut itself checks out
    assert_equivalent(root, kind, expect_paged=False)


def test_a_forged_page_in_index_does_not_stop_the_writer(
        root: Path, small_restore_points: None) -> None:
    # docs/rules.md: restore points are never the truth. A zi: index whose entries are not the
    # ends it names is no damage of the log: before, the session noted it as damage and its
    # writer refused every later write; then the page-in failed (RESTORE_POINT_MISMATCH); now
    # it reads the log's own index and serves the events
    long_store("jsonl", root)
    point = restore_point(root, "jsonl")
    text = rp.PageIndex(list(point.anchor.index)).pack()
    head, _, _ = text.rpartition(":")
    other = rp.PageIndex([(seq, offset + 1) for seq, offset in point.anchor.index]).pack()
    forged = rp.PageIndex.unpack(f"{head}:{other.rpartition(':')[2]}")
    _write_index(root, point, forged)
    strip_marks(root, "jsonl")
    with dsh.open(url_of("jsonl", root)).sessions as store:
        session = store.session("s")
        assert session.events[0]["seq"] == 0  # before: RESTORE_POINT_MISMATCH
        assert session.log_damage is None
        at = _append_a_turn(store, session)  # before: refused, the log named damaged
    _assert_the_turn_is_read(root, at)


def _write_index(root: Path, point: rp.RestorePoint, index: rp.PageIndex) -> None:
    """Write ``point`` with its page-in index replaced by ``index`` (digest recomputed)."""
    ckpt_file(root).write_bytes(rp.encode_restore_point(
        replace(point, anchor=replace(point.anchor, index=index))))


def _append_a_turn(store: Any, session: Any) -> int:
    """Append ``turn/start`` 31 to ``session`` and flush it; return the index it went to."""
    at = len(session.events)
    session.append("turn/start", {"turn": 31})
    store.flush(session)
    return at


def _assert_the_turn_is_read(root: Path, at: int) -> None:
    """A fresh open of the JSONL store under ``root`` reads :func:`_append_a_turn`'s event."""
    with dsh.open(url_of("jsonl", root)).sessions as store:
        events = store.session("s").events
        assert events[at]["type"] == "turn/start" and events[at]["data"]["turn"] == 31


def _flip_index_bytes(root: Path) -> rp.RestorePoint:
    """Flip bytes inside the restore point's packed page-in index (digest recomputed)."""
    point = restore_point(root, "jsonl")
    assert isinstance(point.anchor.index, rp.PageIndex) and not point.anchor.index.inflated
    head, _, packed = point.anchor.index.pack().rpartition(":")
    raw = bytearray(base64.b64decode(packed))
    for at in range(2, len(raw), 3):  # past zlib's two header bytes
        raw[at] ^= 0x5A
    flipped = rp.PageIndex.unpack(f"{head}:{base64.b64encode(bytes(raw)).decode('ascii')}")
    with pytest.raises(dsh.LogCorruptError) as info:
        list(rp.PageIndex.unpack(flipped.pack()))
    assert info.value.code == "RESTORE_POINT_MISMATCH"
    _write_index(root, point, flipped)
    return point


def test_a_page_in_index_with_flipped_bytes_falls_back_to_reading_the_log(
        root: Path, small_restore_points: None, caplog: pytest.LogCaptureFixture) -> None:
    # docs/rules.md#restore-points-are-never-the-truth: a damaged zi: index (its bytes flipped,
    # the body digest recomputed, as a restore point written by a buggy writer would be) makes
    # the page-in read the log's own index, reported as a refused restore point; before, every
    # read of an event before the cut failed with RESTORE_POINT_MISMATCH
    long_store("jsonl", root)
    full_root = root.parent / "full"
    shutil.copytree(root, full_root)
    for ckpt in full_root.rglob("*.ckpt"):
        ckpt.unlink()
    point = _flip_index_bytes(root)
    strip_marks(root, "jsonl")
    with dsh.open(url_of("jsonl", full_root)).sessions as store:
        expected = list(store.session("s").events)
    refused = rp.stats["refused:index"]
    with caplog.at_level(logging.WARNING, logger="dsh"), \
            dsh.open(url_of("jsonl", root)).sessions as store:
        session = store.session("s")
        assert isinstance(session._log, PagedLog)  # resumed through the restore point
        # every event, those before the cut too (the end-seed a resume appends: its own time)
        assert list(session.events)[:-1] == expected[:-1]
        assert session.events[-1]["type"] == expected[-1]["type"] == "session/end-seed"
        assert session.log_damage is None
        assert rp.stats["refused:index"] == refused + 1
        at = _append_a_turn(store, session)
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "page-in index" in r.getMessage()]
    assert warnings[0].startswith("session 's': the page-in index of the restore point (")
    assert warnings[0].endswith("; paging in through the log's own index")
    # the writer's next restore point carries the log's own index: it inflates
    later = restore_point(root, "jsonl")
    pairs = list(later.anchor.index)  # read whole: it holds what it claims
    assert pairs[0] == point.anchor.index[0] and pairs == sorted(set(pairs))
    with dsh.open(url_of("jsonl", root)).sessions as store:
        assert list(store.session("s").events)[:len(expected) - 1] == expected[:-1]
    _assert_the_turn_is_read(root, at)


def test_a_page_in_index_naming_a_wrong_last_entry_falls_back_to_reading_the_log(
        root: Path, small_restore_points: None) -> None:
    # docs/rules.md#restore-points-are-never-the-truth: the page-in reads a window at or
    # after the zi: index's last entry (an open turn's) from that entry alone, without
    # unpacking the rest; a last entry naming the wrong seq (the right offset) made that read
    # fail ("seq gap"), the log noted damaged and the next flush refused. Now the read refuses
    # the index (refused:index), pages in through the log's own and retries once
    long_store("jsonl", root)
    point = restore_point(root, "jsonl")
    fields = point.anchor.index.pack().split(":", 6)
    last_seq = int(fields[4])
    fields[4] = str(last_seq - 1)  # the same offset: the entry of seq last_seq
    forged = rp.PageIndex.unpack(":".join(fields))
    _write_index(root, point, forged)
    strip_marks(root, "jsonl")
    refused = rp.stats["refused:index"]
    with dsh.open(url_of("jsonl", root)).sessions as store:
        session = store.session("s")
        assert isinstance(session._log, PagedLog)  # resumed through the restore point
        assert session.events[last_seq - 1]["seq"] == last_seq - 1  # before: LogCorruptError
        assert session.events[last_seq]["seq"] == last_seq
        assert session.log_damage is None
        assert rp.stats["refused:index"] == refused + 1
        at = _append_a_turn(store, session)  # before: WRITE_FAILED, the log named damaged
    _assert_the_turn_is_read(root, at)


def test_a_restore_point_mismatch_names_the_session_and_where_its_restore_point_is(
        root: Path, small_restore_points: None) -> None:
    # docs/errors.md (RESTORE_POINT_MISMATCH): the message says what was wrong and where:
    # the session and the restore point to delete, not only "a restore point"
    long_store("jsonl", root)
    path = ckpt_file(root)
    point = restore_point(root, "jsonl")
    pack = point.state.nodes.pack_tailed(2)
    short = NodeSeqs.unpack_tailed(pack._replace(packed=pack.packed[:-5]),
                                   point.state.event_count)
    path.write_bytes(rp.encode_restore_point(replace(point, state=replace(point.state,
                                                                          nodes=short))))
    strip_marks(root, "jsonl")
    with dsh.open(url_of("jsonl", root)).sessions as store:
        session = store.resume("s")
        with pytest.raises(dsh.LogCorruptError) as info:
            list(session.surface.nodes)
    error = info.value
    assert error.code == "RESTORE_POINT_MISMATCH"
    assert error.where == {"session_id": "s", "restore_point": str(path)}
    assert "session 's'" in error.message and str(path) in error.message
    assert "delete that restore point" in error.message

"""A Zstandard restore point names the cut of its chain sidecar; a resumed writer appends to it.

Rule: docs/formats.md#restore-points (the Zstandard cut) and docs/formats.md#zstandard-chain.
Real files: a resume through a restore point that names the sidecar's cut checks the bytes
before it by one digest, reads only the chain records after it, and its first flush appends
one record instead of reading and rewriting the sidecar whole; one written before the cut
existed (``sealDigest`` "") still resumes, as before; a sidecar that no longer matches the cut
falls back to the load at the first flush, which names damage as it always did.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import dsh
import dsh.persistence._seal as seal_module
import dsh.persistence.jsonl._backend as jsonl_backend
from dsh.persistence import _restore_point as rp
from dsh.persistence._seal import Seal, SealCut, read_seal
from dsh.persistence.jsonl import _restore_point as jrp
from dsh.session import PagedLog
from tests.persistence.test_restore_point import (
    _verify_json,
    assert_equivalent,
    ckpt_file,
    copy_without_restore_point,
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

KIND = "jsonl-zstd"


def sidecar(root: Path) -> Path:
    """The chain sidecar ``session.jsonl.zstd.seal`` (not the restore point's seal)."""
    (found,) = [p for p in root.rglob("session.jsonl.zstd.seal")]
    return found


def restore_point(root: Path) -> rp.RestorePoint:
    return rp.decode_restore_point(ckpt_file(root).read_bytes(), session_id="s",
                                   backend="jsonl-zstd")


def whole(path: Path) -> Seal:
    seal = read_seal(path)
    assert seal is not None and seal.elided is None
    return seal


def write_restore_point(root: Path, point: rp.RestorePoint) -> None:
    """Replace the restore point, its digest recorded in its seal as a writer records it."""
    data = rp.encode_restore_point(point)
    log = next(p for p in root.rglob("session.jsonl.zstd"))
    jrp.write_bindings(log.with_name(log.name + ".ckpt.seal"),
                       seal_module.restore_point_mark(rp.body_digest(data)))
    ckpt_file(root).write_bytes(data)


class Counted:
    """Counts the chain records the seal reader decodes and the sidecar rewrites."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.decoded = 0
        self.rewrites = 0
        real_frame, real_reset = seal_module.frame_record, jsonl_backend.reset_seal

        def frame(data: bytes | memoryview, pos: int) -> object:
            self.decoded += 1
            return real_frame(data, pos)

        def reset(*args: Any, **kwargs: Any) -> None:
            self.rewrites += 1
            real_reset(*args, **kwargs)

        monkeypatch.setattr(seal_module, "frame_record", frame)
        monkeypatch.setattr(jsonl_backend, "reset_seal", reset)
        monkeypatch.setattr(seal_module, "_READ", {})  # no parse this process kept


def resume_and_write(url: str, turns: tuple[int, ...] = (31,)) -> int:
    """Resume ``s`` through its restore point, write ``turns``; the event count after."""
    with dsh.open(url, clock=StepClock(2_000_000_000_000)).sessions as store:
        session = store.resume("s")
        assert isinstance(session._log, PagedLog)
        for turn in turns:
            completed_turn(session, turn, call_ids=[f"c{turn}"])
            store.flush(session)
        return len(session.events)


def assert_chain_extends(before: Seal, after: Seal, added: int, events: int) -> None:
    """``after`` is ``before``'s chain, links and all, then ``added`` records up to ``events``."""
    assert [r.hash for r in after.chain[:len(before.chain)]] == [r.hash for r in before.chain]
    assert len(after.chain) == len(before.chain) + added
    assert after.chain[-1].end == events
    assert after.head is not None and after.head.batches == len(after.chain)


def test_the_restore_point_names_the_chain_sidecars_cut(root: Path) -> None:
    """``sealDigest`` is an ``s2:`` cut with no range record: the sidecar as its writer left it."""
    long_store(KIND, root)
    seal = whole(sidecar(root))
    point = restore_point(root)
    cut = SealCut.decode(point.anchor.seal_digest)
    assert cut is not None and (cut.records, cut.end, cut.tail) == (0, 0, ())
    assert cut.batches == len(seal.chain) and cut.chain_end == seal.chain[-1].end
    assert cut.chain_hash == seal.chain[-1].hash
    assert cut.offset == sidecar(root).stat().st_size


def test_a_resumed_writer_appends_to_its_chain_sidecar(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No chain record before the cut is decoded and the sidecar is not rewritten.

    Its first flush appends one record linked to the last before the cut; the chain read
    whole afterwards is unbroken, and ``dsh verify`` checks every batch of it against the log.
    """
    long_store(KIND, root)
    before = whole(sidecar(root))
    counted = Counted(monkeypatch)
    events = resume_and_write(url_of(KIND, root), (31, 32))
    assert counted.rewrites == 0
    assert counted.decoded == 0  # none at the resume, and an append reads none
    monkeypatch.undo()
    assert_chain_extends(before, whole(sidecar(root)), 2, events)
    report = _verify_json(url_of(KIND, root))  # exit 0: every chained batch matches
    assert report["violations"] == [], report


def test_the_next_writer_appends_and_the_session_equals_a_full_read(root: Path) -> None:
    """Resumed twice, each time past the cut its predecessor named: still one unbroken chain.

    The sessions and the stored events are those a full read gives (the equivalence the
    other restore point tests check), and both writers' chains cover the same batches.
    """
    long_store(KIND, root)
    before = whole(sidecar(root))
    resume_and_write(url_of(KIND, root))
    events = resume_and_write(url_of(KIND, root), (32,))
    after = whole(sidecar(root))
    assert_chain_extends(before, after, 2, events)
    full_root = root.parent / "full"
    copy_without_restore_point(root, full_root)
    assert_equivalent(root, KIND, expect_paged=True)
    paged, full = whole(sidecar(root)), whole(sidecar(root.parent / "store-full"))
    assert [(r.first, r.end) for r in paged.chain] == [(r.first, r.end) for r in full.chain]


def test_a_restore_point_written_before_the_cut_still_resumes(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sealDigest`` "" (the old form): the sidecar is read and rewritten at the first flush."""
    long_store(KIND, root)
    before = whole(sidecar(root))
    point = restore_point(root)
    write_restore_point(root, replace(point, anchor=replace(point.anchor, seal_digest="")))
    counted = Counted(monkeypatch)
    used = rp.stats["used"]
    events = resume_and_write(url_of(KIND, root))
    assert rp.stats["used"] == used + 1
    assert counted.rewrites == 1 and counted.decoded >= len(before.chain)
    monkeypatch.undo()
    assert_chain_extends(before, whole(sidecar(root)), 1, events)
    assert_equivalent(root, KIND, expect_paged=True)


def test_a_failed_append_after_such_a_resume_rewrites_the_whole_chain(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rewrite reads the records the resume left unread first: no record is dropped."""
    long_store(KIND, root)
    before = whole(sidecar(root))
    real = jsonl_backend.append_chain_to
    failures = [1]

    def failing(fd: int, record: Any) -> None:
        if failures:
            failures.pop()
            raise OSError("disk full (test)")
        real(fd, record)

    monkeypatch.setattr(jsonl_backend, "append_chain_to", failing)
    events = resume_and_write(url_of(KIND, root), (31, 32))
    assert not failures
    assert_chain_extends(before, whole(sidecar(root)), 2, events)


@pytest.mark.parametrize("damage", ["changed", "rewritten", "gone"])
def test_a_sidecar_that_left_the_cut_falls_back_to_the_first_flush_load(
        root: Path, damage: str) -> None:
    """The restore point is still used (the sidecar is no reader's truth); the writer's chain
    then does what it did before the cut existed: damage is not written over, a sidecar
    rewritten with the same records is continued, a missing one starts again."""
    long_store(KIND, root)
    path = sidecar(root)
    before = whole(path)
    data = bytearray(path.read_bytes())
    if damage == "changed":  # a byte of the first chain record's hashed part
        (found,) = [i for i in range(len(data)) if data[i:i + 32] == before.chain[0].digest]
        data[found] ^= 1
        path.write_bytes(bytes(data))
    elif damage == "rewritten":  # the same records, one more head publication: other bytes
        seal_module.publish_head(path, b"", before.chain_state())
        assert path.read_bytes() != bytes(data)
    else:
        path.unlink()
    used = rp.stats["used"]
    events = resume_and_write(url_of(KIND, root))
    assert rp.stats["used"] == used + 1
    if damage == "changed":
        assert path.read_bytes() == bytes(data)  # not written over
        with pytest.raises(dsh.LogCorruptError) as caught:
            read_seal(path)
        assert caught.value.where.get("path") == str(path)
    elif damage == "rewritten":
        assert_chain_extends(before, whole(path), 1, events)
    else:
        after = whole(path)
        assert len(after.chain) == 1 and after.chain[0].end == events

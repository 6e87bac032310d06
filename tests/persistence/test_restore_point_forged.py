"""A forged restore point (body edited, digest recomputed) never changes a resume's answer.

The writer records each restore point's digest in the integrity seal; a resume refuses one the
seal did not record and reads the whole log. Real files, JSONL and SQLite.
Rule: docs/rules.md#restore-points-are-never-the-truth.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

import dsh
from dsh.persistence import _restore_point as rp
from dsh.persistence import open_backend
from dsh.persistence._seal import read_seal, reset_seal
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


def forge(root: Path, kind: str, how: str) -> None:
    """Edit the restore point's body in a way its own checks accept, digest recomputed."""
    path = ckpt_file(root)
    backend = "sqlite" if kind == "sqlite" else "jsonl"
    point = rp.decode_restore_point(path.read_bytes(), session_id="s", backend=backend)
    state = point.state
    if how == "drop-node":
        state = replace(state, nodes=state.nodes[:-1])
    elif how == "drop-nodes":
        state = replace(state, nodes=state.nodes[: len(state.nodes) // 2])
    else:
        raise ValueError(how)
    path.write_bytes(rp.encode_restore_point(replace(point, state=state)))


def strip_marks(root: Path, kind: str) -> None:
    """Rewrite the seal as one written before restore points were bound (no digests)."""
    path = seal_file(root)
    seal = read_seal(path)
    assert seal is not None and seal.restore_points
    reset_seal(path, seal.identity, seal.records)


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
    point = rp.decode_restore_point(ckpt_file(root).read_bytes(), session_id="s",
                                    backend="sqlite" if kind == "sqlite" else "jsonl")
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

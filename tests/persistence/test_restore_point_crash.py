"""SIGKILL with restore points on: a writer killed at random moments, then a resume from one.

The child of ``test_crash_sigkill`` runs with a restore point at every flush; the parent kills it
at a random moment (possibly while a restore point or a batch is half written), then resumes a copy
through the restore point and another copy without it: both give exactly the same session, repair
closers and next appends included. The original store is then resumed by the next child, so
later rounds start from a resume from a restore point. ``DSH_CRASH_RUNS`` scales the rounds.
Rule: docs/rules.md#restore-points-are-never-the-truth (any doubt means a full read, same answer);
    docs/rules.md#resume (resume).
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from tests.persistence.test_crash_sigkill import CHILD, RUNS
from tests.persistence.test_crash_sigkill import _run_and_kill as run_and_kill
from tests.persistence.test_restore_point import assert_same_resume, copy_without_restore_point

RESTORE_POINT_CHILD = ("from dsh.persistence import _restore_point as rp\n"
                       "rp.RESTORE_POINT_EVERY_EVENTS = 1\n" + CHILD)


@pytest.mark.parametrize("scheme", ["jsonl", "jsonl+zstd", "sqlite"])
def test_sigkill_then_resume_from_a_restore_point_equals_the_full_read(
        tmp_path: Path, scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import tests.persistence.test_crash_sigkill as crash
    monkeypatch.setattr(crash, "CHILD", RESTORE_POINT_CHILD)
    rng = random.Random(int(os.environ.get("DSH_CRASH_SEED", "20261201")))
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    target = store / "store.db" if scheme == "sqlite" else store / "logs"
    used = 0
    rounds = max(3, RUNS // 3)
    for index in range(rounds):
        assert run_and_kill(f"{scheme}://{target}", rng) >= 0
        paged, full = tmp_path / f"paged-{index}", tmp_path / f"full-{index}"
        shutil.copytree(store, paged)
        copy_without_restore_point(store, full)
        name = target.name
        used += assert_same_resume(f"{scheme}://{paged / name}", f"{scheme}://{full / name}",
                                   "crash", expect_paged=None)
    assert used >= 1, "a resume from a restore point happened in some round"

"""Checkpointed resumes of real input equal full reads: dsh's own logs and the corpus.

dsh's logs get their restore point from ``Persistence.write_restore_point`` (a full, validated read
folded into a restore state); imported corpus sessions get theirs from the writer at their
first flush. Rule: docs/rules.md#restore-points-are-never-the-truth,
docs/testing.md#what-the-tests-cover (interop, real input).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import dsh
from dsh.interop import detect_format, import_file
from dsh.persistence import Persistence, open_backend
from tests.conftest import DSH_LOGS
from tests.interop.helpers import corpus_dir
from tests.persistence.test_restore_point import assert_same_resume, copy_without_restore_point
from tests.persistence.test_restore_point import small_restore_points as small_restore_points
from tests.strategies import StepClock

DSH_STORES = [("jsonl/main", "jsonl"), ("jsonl-unpacked/main", "jsonl"),
              ("jsonl-zstd/main", "jsonl+zstd"), ("jsonl/crash-before-resume", "jsonl"),
              ("jsonl-zstd/crash-before-resume", "jsonl+zstd"), ("sqlite/main.sqlite", "sqlite")]


@pytest.mark.parametrize(("store", "scheme"), DSH_STORES)
def test_resume_from_a_restore_point_of_dsh_logs_equals_the_full_read(tmp_path: Path, store: str,
                                                              scheme: str) -> None:
    source = DSH_LOGS / store
    paged, full = tmp_path / "paged", tmp_path / "full"
    if source.is_file():
        paged.mkdir(mode=0o700)
        shutil.copy(source, paged / source.name)
        (paged / source.name).chmod(0o600)  # dsh's precondition on a database file
        paged_url, full_url = f"{scheme}://{paged / source.name}", f"{scheme}://{full}/x.db"
    else:
        shutil.copytree(source, paged)
        paged_url, full_url = f"{scheme}://{paged}", f"{scheme}://{full}"
    with Persistence(open_backend(paged_url)) as persistence:
        ids = sorted(str(h["id"]) for h in persistence.list_headers())
        written = [sid for sid in ids if persistence.write_restore_point(sid)]
    if source.is_file():
        full.mkdir(mode=0o700)
        shutil.copy(paged / source.name, full / "x.db")
        (full / "x.db").chmod(0o600)
    else:
        copy_without_restore_point(paged, full)
    # schema-14 SQLite files (what dsh 0.1.x writes) take them too, in the sidecar folder
    assert written, "every store takes restore points"
    for sid in ids:
        assert_same_resume(paged_url, full_url, sid, expect_paged=sid in written)


def _corpus_files() -> list[str]:
    manifest = json.loads((corpus_dir() / "MANIFEST.json").read_text())
    return sorted(f["file"] for f in manifest["files"] if "/subagents/" not in f["file"])


def test_resume_from_a_restore_point_of_corpus_sessions_equals_the_full_read(
        tmp_path: Path) -> None:
    paged, full = tmp_path / "paged", tmp_path / "full"
    count = 0
    with dsh.open(f"jsonl://{paged}", clock=StepClock()).sessions as store:
        for name in _corpus_files():
            path = corpus_dir() / name
            if detect_format(path) is None:
                continue
            for top in import_file(path):
                for imported in top.walk():
                    inherited = imported.header.get("seedLength", 0)
                    session = store.create(imported.session_id, seed=imported.events,
                                           header=imported.header,
                                           inherited_event_count=inherited
                                           if isinstance(inherited, int) else 0)
                    store.flush(session)
                    count += 1
    copy_without_restore_point(paged, full)
    assert count >= 20
    with Persistence(open_backend(f"jsonl://{paged}")) as persistence:
        ids = sorted(str(h["id"]) for h in persistence.list_headers())
    assert len(ids) == count
    for sid in ids:
        assert_same_resume(f"jsonl://{paged}", f"jsonl://{full}", sid)

"""Power loss: crash states rebuilt from a real writer's syscalls lose nothing acknowledged.

A writer process (``tests/persistence/_powerloss_writer.py``: create, five flushed turns, close,
resume, three more) runs under strace on raw JSONL, JSONL with Zstandard and SQLite; every file
syscall under its store is recorded (SQLite's own ``pwrite``/``fsync`` calls from C included),
and the replayed trace must equal the files it left. Crash states are then rebuilt at random
cuts under the strict, prefix, page-subset and ordered write-back models
(``tests/persistence/_powerloss.py``, docs/testing.md#power-loss). In every state:

- the session loads (no state a power cut can leave is refused), unless nothing was
  acknowledged yet and it does not exist;
- every event acknowledged before the cut (its ``flush`` returned) is there, unchanged, and
  every event read is one the writer wrote, at its seq;
- a resume through the restore point equals a resume of a copy without it (model view,
  events, closers, the next appends and what is then stored).

``DSH_CRASH_RUNS`` sets the states per backend and model (default 17: 204 states in all),
``DSH_CRASH_SEED`` their seed. strace is a Debian package (.ci/run installs it when missing);
without it the test skips, saying so.
Rule: docs/formats.md#writing, docs/formats.md#integrity-seals, docs/rules.md#resume,
    docs/rules.md#restore-points-are-never-the-truth.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh.json import thaw
from dsh.persistence import Persistence, open_backend
from dsh.testing import user
from tests.persistence._powerloss import (
    MODELS,
    FileSystem,
    Op,
    acknowledged,
    crash_state,
    parse_trace,
    record,
)
from tests.persistence.test_restore_point import assert_same_resume, copy_without_restore_point

RUNS = int(os.environ.get("DSH_CRASH_RUNS", "17"))
SEED = int(os.environ.get("DSH_CRASH_SEED", "20261202"))
SCHEMES = ("jsonl", "jsonl+zstd", "sqlite")
REPO = Path(__file__).resolve().parents[2]


def url_of(scheme: str, root: Path) -> str:
    return f"sqlite://{root}/store.db" if scheme == "sqlite" else f"{scheme}://{root}"


Recorded = tuple[list[Op], list[Any]]


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Recorded]:
    """Each backend's writer recorded once (on first use): its operations and final events."""
    if shutil.which("strace") is None:
        pytest.skip("SKIPPED LOUDLY: no strace (apt-get install strace) to record the writer")
    probe = subprocess.run(["strace", "-o", os.devnull, "true"], capture_output=True, text=True,
                           check=False)
    if probe.returncode != 0:  # e.g. a sandbox that forbids ptrace
        pytest.skip(f"SKIPPED LOUDLY: strace cannot trace here: {probe.stderr.strip()}")
    cache: dict[str, Recorded] = {}

    def get(scheme: str) -> Recorded:
        if scheme not in cache:
            base = tmp_path_factory.mktemp(f"powerloss-{scheme.replace('+', '-')}").resolve()
            root = base / "store"
            root.mkdir(mode=0o700)
            os.sync()  # the empty root is the durable starting point
            trace, acks, dump = base / "trace", base / "acks", base / "dump.json"
            record([sys.executable, "-m", "tests.persistence._powerloss_writer",
                    url_of(scheme, root), str(acks), str(dump)], trace, REPO)
            ops, replayed = parse_trace(trace, root, acks)
            assert replayed.matches(root) == [], "the replayed trace is the writer's files"
            final = json.loads(dump.read_text(encoding="utf-8"))
            assert [op.size for op in ops if op.kind == "ack"] == [
                int(n) for n in acks.read_text().split()]
            cache[scheme] = (ops, final)
        return cache[scheme]

    return get


def check_state(fs: FileSystem, where: Path, scheme: str, acked: int,
                final: list[Any]) -> str:
    """Check one crash state; returns which resume path was taken (for coverage)."""
    paged, full = where / "paged", where / "full"
    fs.materialise(paged)
    copy_without_restore_point(paged, full)
    url = url_of(scheme, paged)
    with Persistence(open_backend(url)) as persistence:
        if not persistence.exists("crash"):
            assert acked == 0, f"{acked} acknowledged events and no session"
            return "absent"
        events = [thaw(e) for e in persistence.read("crash").stored_events]
    assert len(events) >= acked, f"{acked} acknowledged, {len(events)} stored"
    for seq, (got, wrote) in enumerate(zip(events, final, strict=False)):
        assert got == wrote, f"seq {seq} differs from what the writer wrote"
    assert len(events) <= len(final)
    used = assert_same_resume(url, url_of(scheme, full), "crash", expect_paged=None)
    return "paged" if used else "full"


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_power_loss_keeps_every_acknowledged_event(
        recordings: Callable[[str], Recorded], scheme: str, model: str, tmp_path: Path) -> None:
    ops, final = recordings(scheme)
    rng = random.Random(f"{SEED}-{scheme}-{model}")
    paths: dict[str, int] = {}
    for run in range(RUNS):
        cut = rng.randint(0, len(ops))
        state_seed = rng.randrange(1 << 32)
        fs = crash_state(ops, cut, model, random.Random(state_seed))
        where = tmp_path / f"state-{run}"
        try:
            path = check_state(fs, where, scheme, acknowledged(ops, cut), final)
        except Exception as exc:
            raise AssertionError(
                f"{scheme} {model}: crash state at cut {cut}/{len(ops)} (state seed "
                f"{state_seed}, last op {ops[cut - 1] if cut else None!r:.200}) failed: "
                f"{type(exc).__name__}: {exc}") from exc
        paths[path] = paths.get(path, 0) + 1
        shutil.rmtree(where)
    assert sum(paths.values()) == RUNS
    if model == "strict":  # most strict cuts come after the first restore point
        assert paths.get("paged", 0) >= 1, paths


# --- what the page-subset model found: a hole in the unsynced batch is a torn tail -----------

def _three_flushed_then_a_lost_block(tmp_path: Path) -> tuple[str, Path, bytes, int]:
    """A raw log as a power cut leaves it: three acknowledged batches, then a fourth whose
    second 4 KiB block never reached the disk while later ones did, and the seal and the
    listing journal as they were before it (their lines, appended unsynced, were lost)."""
    url = f"jsonl://{tmp_path}/store"
    with dsh.open(url) as store:
        session = store.session("s")
        for n in range(3):
            session.append("user/message", user(f"m{n}", f"u{n}"), surface_op="append")
            store.flush(session)
        [log] = (tmp_path / "store").glob("*/*/session.jsonl")
        seal = log.with_name("session.jsonl.seal")
        journal = tmp_path / "store" / ".dsh-listing.journal"
        acknowledged, sealed = log.read_bytes(), seal.read_bytes()
        journaled = journal.read_bytes()
        for n in range(3, 9):  # one batch of six ~2 KiB lines
            session.append("user/message", user(f"m{n} " + "y" * 2000, f"u{n}"),
                           surface_op="append")
        store.flush(session)
    data = bytearray(log.read_bytes())
    hole = (len(acknowledged) // 4096 + 1) * 4096
    assert hole + 4096 < data.rindex(b"\n", 0, len(data) - 1), "complete lines follow the hole"
    data[hole:hole + 4096] = bytes(4096)
    log.write_bytes(bytes(data))
    seal.write_bytes(sealed)
    journal.write_bytes(journaled)
    return url, log, acknowledged, hole


def test_a_lost_block_of_the_unsynced_batch_is_a_torn_tail_not_corruption(
        tmp_path: Path) -> None:
    url, log, acknowledged, hole = _three_flushed_then_a_lost_block(tmp_path)
    damaged = log.read_bytes()
    kept_end = damaged.rindex(b"\n", 0, hole) + 1  # the lines wholly before the hole
    kept = [f"m{n}" for n in range(3, 3 + damaged[len(acknowledged):kept_end].count(b"\n"))]
    with dsh.open(url) as store:  # main: LOG_CORRUPT, "the damage is inside committed data"
        texts = [e["data"]["content"][0]["text"][:2] for e in store.read("s").events]
        assert texts == ["m0", "m1", "m2", *kept]
        session = store.session("s")  # the writer cuts the tail, saving it beside the log
        session.append("user/message", user("m9", "u9"), surface_op="append")
        store.flush(session)
    [cut] = log.parent.glob("session.jsonl.torn-*")
    assert cut.read_bytes() == damaged[kept_end:]
    with dsh.open(url) as store:
        texts = [e["data"]["content"][0]["text"][:2] for e in store.read("s").events
                 if e["type"] == "user/message"]
    assert texts == ["m0", "m1", "m2", *kept, "m9"]


def test_zeros_inside_sealed_bytes_are_still_corruption(tmp_path: Path) -> None:
    url, log, acknowledged, _ = _three_flushed_then_a_lost_block(tmp_path)
    data = bytearray(log.read_bytes())
    start = acknowledged.index(b'"m1"')  # inside the second acknowledged batch
    data[start:start + 8] = bytes(8)
    log.write_bytes(bytes(data))
    with dsh.open(url) as store, pytest.raises(dsh.LogCorruptError):
        store.read("s")

"""Smoke test of the bench scripts: each runs end to end with tiny sizes and prints its table.

No timing is asserted (the figures of a 300-event run mean nothing); the point is that the
scripts keep working against the current API. Each script runs as ``python -m bench.<name>`` in
a subprocess from the repository root, as bench/README.md documents.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

CASES = {
    "write": ["bench.bench_write", "--events", "300", "--runs", "1"],
    "write-per-turn": ["bench.bench_write", "--events", "300", "--runs", "1", "--per-turn"],
    "load": ["bench.bench_load", "--sizes", "300", "--runs", "1", "--mode", "both",
             "--backend", "jsonl-zstd,sqlite"],
    "compaction": ["bench.bench_compaction", "--events", "300", "--runs", "1"],
    "compaction-sqlite": ["bench.bench_compaction", "--events", "300", "--runs", "1",
                          "--scenario", "now", "--backend", "sqlite"],
    "import": ["bench.bench_import", "--events", "300", "--top", "1", "--runs", "1"],
    "import-phases": ["bench.bench_import", "--phases", str(
        REPO / "tests" / "corpus" / "claude-code" / "spotter-tool-heavy-queued-interrupts.jsonl"),
        "--runs", "1"],
    "import-cli": ["bench.bench_import_cli", "--src", str(REPO / "src"), "--src",
                   f"{REPO / 'src'}@0.005", "--mb", "0.05", "--runs", "1"],
    "ls": ["bench.bench_ls", "--sessions", "20", "--runs", "1", "--backend", "both"],
    "postgres": ["bench.bench_postgres", "--events", "300", "--turns", "3", "--runs", "1",
                 "--peers", "none"],
    "adapters": ["bench.bench_adapters", "--sizes", "40", "--turns", "2", "--runs", "1",
                 "--saver-turns", "6"],
    # --before the repository itself: the alternating path, not another commit
    "session-cpu": ["bench.bench_session_cpu", "--sizes", "40", "--turns", "2", "--runs", "1",
                    "--before", str(REPO)],
    "saver-cold": ["bench.bench_saver_cold", "--turns", "3", "--runs", "1"],
    "saver-cold-sqlite": ["bench.bench_saver_cold", "--turns", "3", "--runs", "1", "--store",
                          "sqlite"],
    "agent": ["bench.bench_agent", "--turns", "3", "--runs", "1", "--nodes", "100"],
    "resume-checkpoint": ["bench.bench_resume_ckpt", "--sizes", "3000", "--runs", "1",
                          "--backend", "jsonl-packed,sqlite", "--variants", "open"],
    "resume-checkpoint-uncompacted": ["bench.bench_resume_ckpt", "--sizes", "3000", "--runs",
                                      "1", "--backend", "jsonl-zstd", "--variants", "balanced",
                                      "--uncompacted"],
    # --before: this checkout again stands for the other one; its row above this one's
    "resume-checkpoint-before": ["bench.bench_resume_ckpt", "--sizes", "3000", "--runs", "1",
                                 "--backend", "jsonl-zstd", "--variants", "open",
                                 "--uncompacted", "--no-derive", "--before", str(REPO)],
    "effects": ["bench.bench_effects", "--kills", "2", "--classes", "idempotent,irreversible"],
    "cache": ["bench.bench_cache", "--turns", "3", "--wires", "openai"],
    "cli": ["bench.bench_cli", "--sizes", "300", "--import-mb", "0.05", "--sessions", "5",
            "--runs", "1"],
    "cli-search-store": ["bench.bench_cli", "--sizes", "", "--import-mb", "0", "--sessions", "4",
                         "--search-events", "200", "--search-backends", "jsonl,sqlite",
                         "--runs", "1"],
    "unpack": ["bench.bench_unpack", "--nodes", "5000", "--runs", "1"],
    "erase": ["bench.bench_erase", "--sessions", "20", "--subject", "2"],
    "integrity-page-in": ["bench.bench_integrity", "--page-in", "--events", "2000", "--runs",
                          "1"],
    "integrity-chain": ["bench.bench_integrity", "--chain", "--events", "300", "--runs", "1"],
    "view": ["bench.bench_view", "--sizes", "300", "--sessions", "5", "--runs", "1",
             "--backends", "jsonl,sqlite"],
    # 5,000 events: a restore point to move aside, and enough events to page by range
    "view-no-restore-point": ["bench.bench_view", "--sizes", "5000", "--sessions", "0",
                              "--runs", "1", "--backends", "sqlite", "--no-restore-point"],
    # the peer is never looked for here: ours beside dsh-baseline.md
    "side-by-side": ["bench.side_by_side", "--sizes", "300", "--runs", "1", "--flush-events",
                     "300", "--derive-surface", "300", "--derive-runs", "1",
                     "--backend", "jsonl-packed,sqlite", "--node-dir", "/nonexistent/dsh-node"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bench_script_runs_and_prints_a_table(case: str, tmp_path: Path) -> None:
    if case in ("postgres", "saver-cold"):
        from dsh.testing._stores import postgres_unreachable
        reason = postgres_unreachable()
        if reason is not None:
            pytest.skip(f"SKIPPED LOUDLY: {reason}")
    proc = subprocess.run([sys.executable, "-m", *CASES[case], "--dir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# ")
    separator = next(i for i, line in enumerate(lines) if line.startswith("|---"))
    # a header row above the separator and at least one data row below it
    assert lines[separator - 1].startswith("| ")
    assert lines[separator + 1].startswith("| ")
    # every temporary store was removed
    assert list(tmp_path.iterdir()) == []


def test_the_resume_bench_prints_the_before_row_above_this_one(tmp_path: Path) -> None:
    """``--before`` resumes each copy with the other checkout's code too: two rows per size."""
    proc = subprocess.run([sys.executable, "-m", *CASES["resume-checkpoint-before"], "--dir",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split(" | ") for line in proc.stdout.splitlines() if line.startswith("| jsonl")]
    assert [row[2] for row in rows] == ["open before", "open"]
    assert all(row[-3] == "yes" for row in rows)  # both resumed through the restore point

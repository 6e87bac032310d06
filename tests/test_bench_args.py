"""The bench scripts as a new user runs them: without optional packages, with a wrong --dir."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_bench_json_without_msgspec_skips_its_row_saying_so(tmp_path: Path) -> None:
    (tmp_path / "msgspec").mkdir()
    (tmp_path / "msgspec" / "__init__.py").write_text("raise ImportError('no msgspec')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    proc = subprocess.run([sys.executable, "-m", "bench.bench_json", "--number", "5"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| engine")}
    assert "skipped: not installed" in rows["msgspec"]
    assert "'.[bench]'" in rows["msgspec"]
    assert rows["orjson"].count("|") == rows["msgspec"].count("|")


def test_a_dir_that_does_not_exist_is_a_usage_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    for script in ("bench.bench_ls", "bench.bench_effects", "bench.bench_load"):
        proc = subprocess.run([sys.executable, "-m", script, "--dir", str(missing)],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (script, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert f"'{missing}' is not an existing folder" in proc.stderr
    assert not missing.exists()

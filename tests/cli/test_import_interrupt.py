"""Ctrl+C during ``dsh import``: outcomes as they happen, nothing half-written."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.cli.test_cli import EXAMPLES, Dsh

FILES = 400


def _many_transcripts(folder: Path) -> None:
    folder.mkdir()
    lines = (EXAMPLES / "transcripts" / "claude-code" / "long-debugging.jsonl").read_text(
        encoding="utf-8").splitlines()
    for n in range(FILES):
        sid = f"{n:08d}-0000-4000-8000-000000000000"
        records = []
        for line in lines:
            record = json.loads(line)
            if "sessionId" in record:
                record["sessionId"] = sid
            records.append(json.dumps(record))
        (folder / f"{sid}.jsonl").write_text("\n".join(records) + "\n", encoding="utf-8")


def test_ctrl_c_keeps_what_was_imported_and_leaves_no_empty_session(tmp_path: Path) -> None:
    folder = tmp_path / "many"
    _many_transcripts(folder)
    dsh = Dsh(tmp_path)
    command = subprocess.Popen([sys.executable, "-m", "dsh.cli", "import", str(folder)],
                               env=dsh.env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    assert command.stdout is not None
    first = command.stdout.readline()  # printed as soon as the first file is done
    assert first.startswith("imported  00000000-0000-4000-8000-000000000000  (claude-code)")
    command.send_signal(signal.SIGINT)
    # Not communicate(): it reads the pipes' descriptors and would lose the lines readline
    # buffered past the first (two outcomes can arrive in one read on a busy machine).
    with command:  # closes both pipes
        rest = command.stdout.read()
        assert command.stderr is not None
        err = command.stderr.read()  # a few lines: the pipe cannot fill while stdout is read
        command.wait(timeout=120)
    assert command.returncode == 130, err
    printed = [line.split()[1] for line in [first, *rest.splitlines()]
               if line.startswith("imported  ")]
    assert 0 < len(printed) < FILES
    assert "interrupted after " in err and err.rstrip().endswith("error[INTERRUPTED]: interrupted")
    rows = dsh.json("ls", "--json")
    assert sorted(r["id"] for r in rows) == sorted(printed)  # exactly what it said it imported
    assert all(r["events"] > 10 for r in rows)  # no empty or partial session
    assert json.loads(dsh("verify", "--all", "--json").stdout)["violations"] == []

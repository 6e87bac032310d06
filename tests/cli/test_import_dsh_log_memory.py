"""``dsh import`` of a big dsh log stays under 200 MB: the log is verified and written streamed.

A behavioural memory bound (docs/interop.md#streaming-imports), not a timing: a generated dsh
log of completed turns imported in a fresh process, its peak RSS (``ru_maxrss`` of that child)
checked. Read whole, the import grew by about 12 MB per MB of log (145 MB for 11.5 MB).
``DSH_IMPORT_DSH_LOG_MB`` sets the size (default 8; 50 for the issue's case).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dsh.json import dumps
from tests.cli.test_cli import Dsh
from tests.cli.test_import_memory import _MEASURE

LOG_MB = float(os.environ.get("DSH_IMPORT_DSH_LOG_MB", "8"))
PEAK_BOUND_MB = 200
CREATED = 1_767_225_600_000
TEXT = "Read the server and say what port it listens on. " * 30


def _dsh_log(path: Path, megabytes: float) -> int:
    """Write a dsh log of completed turns, about ``megabytes`` MB; return its events."""
    seq = 0
    with path.open("wb") as out:
        out.write(dumps({"type": "session", "version": 0, "id": "big", "createdAt": CREATED})
                  + b"\n")
        turn = 0
        while out.tell() < megabytes * 1e6:
            turn += 1
            model = {"kind": "model", "provider": "deepseek", "model": "deepseek-chat"}
            for kind, data, op in (
                    ("turn/start", {"turn": turn}, None),
                    ("step/start", {"turn": turn, "step": 1}, None),
                    ("user/message", {"content": [{"type": "text", "text": f"{turn} {TEXT}"}],
                                      "source": {"kind": "user"}, "role": "user",
                                      "id": f"u{turn}"}, "append"),
                    ("assistant/message", {"turn": turn, "step": 1, "message": {
                        "id": f"a{turn}", "role": "assistant", "source": model,
                        "content": [{"type": "text", "text": f"answer {turn} {TEXT}"}]}},
                     "append"),
                    ("step/end", {"turn": turn, "step": 1}, None),
                    ("turn/end", {"turn": turn, "reason": {"kind": "completed"}}, None)):
                event = {"type": kind, "seq": seq, "time": CREATED + seq, "data": data}
                if op is not None:
                    event["surfaceOp"] = op
                out.write(dumps(event) + b"\n")
                seq += 1
    return seq


def test_dsh_log_import_peak_memory_stays_under_200_mb(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    log = tmp_path / "session.jsonl"
    events = _dsh_log(log, LOG_MB)
    store = tmp_path / "store.db"
    measured = subprocess.run(
        [sys.executable, "-c", _MEASURE, sys.executable, "-m", "dsh.cli", "import", str(log),
         "--store", f"sqlite:{store}", "--json"], env=dsh.env, capture_output=True, text=True,
        timeout=900, check=True)
    result = json.loads(measured.stdout)
    assert result["rc"] == 0, result["err"]
    report = json.loads(result["out"])
    assert len(report["imported"]) == 1 and report["imported"][0]["format"] == "dsh"
    shown = dsh.json("ls", "--json", "--store", f"sqlite:{store}")
    assert shown[0]["events"] == events + 1  # and the import/source event
    assert float(result["peak_kib"]) / 1024 < PEAK_BOUND_MB, result["peak_kib"]

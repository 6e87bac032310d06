"""``dsh import`` of a Claude Code transcript streams: its peak memory does not grow with the file.

A behavioural memory bound (docs/interop.md#streaming-imports), not a timing: the same import of
a small and of a several times larger generated transcript, each in a fresh process, peak RSS
(``ru_maxrss`` of that child) compared. Reading the file whole grew by about 11 MB per MB of
transcript; streaming holds one batch and a byte of flags a line (the branch index lives in a
temporary SQLite file). Into a SQLite store and into a JSONL one: a JSONL handle seals at
flush, so an import that flushed only at the end held every event of the session until then
(444 MB for a 44 MB transcript).
``DSH_IMPORT_MEMORY_MB`` sets the larger size (default 24; 40 for the issue's case).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.cli.test_cli import Dsh

SMALL_MB = 4
LARGE_MB = float(os.environ.get("DSH_IMPORT_MEMORY_MB", "24"))
GROWTH_BOUND_MB = 50
PEAK_BOUND_MB = 200
TOOL_OUT = "export function serve(port: number) {\\n  return listen(port);\\n}\\n" * 6


def _transcript(path: Path, megabytes: float) -> int:
    """Write a Claude Code transcript of about ``megabytes`` MB; return its turns."""
    session = "5e551011-0000-4000-8000-00000000abcd"
    parent: str | None = None
    turns = 0
    with path.open("w", encoding="utf-8") as out:
        while out.tell() < megabytes * 1e6:
            turns += 1
            stamp = f"2026-02-10T22:{turns // 3600 % 60:02d}:{turns // 60 % 60:02d}." \
                    f"{turns % 1000:03d}Z"
            tool = f"toolu_{turns:024d}"
            lines = [
                ("user", {"role": "user", "content": f"Look at the server, turn {turns}."}, {}),
                ("assistant", {"id": f"msg_a{turns}", "role": "assistant",
                               "model": "claude-opus-4-6", "content": [
                                   {"type": "text", "text": "Reading it."},
                                   {"type": "tool_use", "id": tool, "name": "Read",
                                    "input": {"file_path": "/srv/app/server.ts"}}],
                               "usage": {"input_tokens": 3, "output_tokens": 20}}, {}),
                ("user", {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": tool, "content": TOOL_OUT}]},
                 {"toolUseResult": {"type": "text", "file": {"content": TOOL_OUT}}}),
                ("assistant", {"id": f"msg_b{turns}", "role": "assistant",
                               "model": "claude-opus-4-6",
                               "content": [{"type": "text", "text": "It listens. " * 20}],
                               "usage": {"input_tokens": 3, "output_tokens": 40}}, {}),
            ]
            for kind, message, extra in lines:
                uid = str(uuid.uuid4())
                record = {"parentUuid": parent, "isSidechain": False, "type": kind,
                          "sessionId": session, "cwd": "/srv/app", "message": message,
                          "uuid": uid, "timestamp": stamp, **extra}
                out.write(json.dumps(record) + "\n")
                parent = uid
    return turns


_MEASURE = """
import json, resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB, this one child only
print(json.dumps({"rc": done.returncode, "out": done.stdout.decode(),
                  "err": done.stderr.decode(), "peak_kib": peak}))
"""


def _peak_mb(dsh: Dsh, transcript: Path, url: str) -> float:
    """Peak RSS (MB) of one ``dsh import`` process (``ru_maxrss`` of that child alone)."""
    measured = subprocess.run(
        [sys.executable, "-c", _MEASURE, sys.executable, "-m", "dsh.cli", "import",
         str(transcript), "--store", url, "--json"], env=dsh.env,
        capture_output=True, text=True, timeout=900, check=True)
    result = json.loads(measured.stdout)
    assert result["rc"] == 0, result["err"]
    report = json.loads(result["out"])
    assert [entry["session"] for entry in report["imported"]] == [
        "5e551011-0000-4000-8000-00000000abcd"]
    return float(result["peak_kib"]) / 1024


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_import_peak_memory_does_not_grow_with_the_transcript(tmp_path: Path, kind: str) -> None:
    dsh = Dsh(tmp_path)
    peaks = []
    events = []
    for megabytes in (SMALL_MB, LARGE_MB):
        transcript = tmp_path / f"{megabytes}mb" / "5e551011-0000-4000-8000-00000000abcd.jsonl"
        transcript.parent.mkdir()
        _transcript(transcript, megabytes)
        # (a JSONL store in a folder of its own: the transcript's folder is no store)
        store = tmp_path / (f"{megabytes}mb.db" if kind == "sqlite" else f"{megabytes}mb-store")
        url = f"{kind}:{store}"
        peaks.append(_peak_mb(dsh, transcript, url))
        shown = dsh.json("ls", "--json", "--store", url)
        events.append(shown[0]["events"])
    assert events[1] > events[0] * (LARGE_MB / SMALL_MB) * 0.8  # the large one is really larger
    assert peaks[1] - peaks[0] < GROWTH_BOUND_MB, peaks
    assert peaks[1] < PEAK_BOUND_MB, peaks

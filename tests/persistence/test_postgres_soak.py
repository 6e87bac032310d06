"""Soak: 8 host processes × 100 sessions with random take-overs, crashes and pauses.

Runs for ``$DSH_SOAK_SECONDS`` (default 4; 60 for the full soak) and then checks every session:
its log is contiguous from seq 0, no seq is stored twice, and every acknowledged append is
there with the exact event its writer sent. The figures are printed (``-s`` shows them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from dsh.persistence import open_backend
from dsh.testing import header
from dsh.testing._stores import postgres_unreachable, temporary_postgres_url

_REASON = postgres_unreachable()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"SKIPPED LOUDLY: {_REASON}")

SECONDS = float(os.environ.get("DSH_SOAK_SECONDS", "4"))
PROCESSES = int(os.environ.get("DSH_SOAK_PROCESSES", "8"))
SESSIONS = int(os.environ.get("DSH_SOAK_SESSIONS", "100"))
WORKER = Path(__file__).with_name("_pg_soak_worker.py")


def test_soak_many_hosts_random_takeovers_lose_nothing(tmp_path: Path) -> None:
    with temporary_postgres_url(lease_ms=300) as url:
        backend = open_backend(url)
        for i in range(SESSIONS):
            backend.create(header(f"soak-{i}"))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        reports = [tmp_path / f"host-{n}.json" for n in range(PROCESSES)]
        procs = [subprocess.Popen([sys.executable, str(WORKER), f"{url}&pool_size=2",
                                   str(SECONDS), str(SESSIONS), str(n), str(out)], env=env)
                 for n, out in enumerate(reports)]
        assert [p.wait(timeout=SECONDS + 300) for p in procs] == [0] * PROCESSES
        acked: list[tuple[str, int, str]] = []
        counts: Counter[str] = Counter()
        for out in reports:
            report = json.loads(out.read_text(encoding="utf-8"))
            acked.extend((sid, seq, title) for sid, seq, title in report["acked"])
            counts.update(report["counts"])
        stored: dict[tuple[str, int], str] = {}
        total = 0
        for i in range(SESSIONS):
            sid = f"soak-{i}"
            with backend.open(sid) as handle:
                events = handle.read().events
            assert [e["seq"] for e in events] == list(range(len(events))), sid
            total += len(events)
            stored.update({(sid, e["seq"]): e["data"]["title"] for e in events})
        with backend._conn("figures", None) as conn:
            takeovers = conn.execute(
                f"SELECT coalesce(sum(lease_epoch), 0) FROM {backend._s}.sessions").fetchone()[0]
        backend.close()
    assert len(set(acked)) == len(acked)
    lost = [a for a in acked if stored.get((a[0], a[1])) != a[2]]
    assert lost == [], f"{len(lost)} acknowledged events missing or overwritten: {lost[:5]}"
    assert len(acked) == total  # every stored event was acknowledged to exactly one writer
    assert counts["batches"] > 0 and counts["crashes"] > 0
    print(f"\nsoak: {PROCESSES} hosts x {SESSIONS} sessions for {SECONDS:g} s: "
          f"{counts['batches']} batches / {len(acked)} events acknowledged and all stored, "
          f"{counts['opens']} write opens ({takeovers} lease epochs), {counts['busy']} busy "
          f"refusals, {counts['crashes']} holders crashed with the lease held, "
          f"{counts['pauses']} pauses past the lease, {counts['lease_lost']} stale appends "
          f"refused (LEASE_LOST); every log contiguous, no seq twice")

"""SIGKILL at random points of ``redact``, ``erase`` and ``gc --apply`` (a policy purging a
trashed session), on every real backend: the log is
always loadable and verifies, it is the state before or the state after, and running the
operation again completes it (no secret left in any store byte).

``DSH_CRASH_RUNS`` kills per backend and operation (default 6), ``DSH_CRASH_SEED`` varies
where they land. Rule:
docs/forgetting.md#how-an-operation-runs, docs/forgetting.md#retention.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dsh
from dsh import SessionBusyError
from dsh._verify import verify_events
from dsh.rights import RetentionPolicy, erase, gc, redact, set_retention, store_log, trash
from dsh.testing._stores import store_url
from tests.rights.conftest import REPO, SECRETS, build
from tests.rights.test_redact import store_bytes

RUNS = int(os.environ.get("DSH_CRASH_RUNS", "6"))
WINDOW_S = 0.5  # kills land uniformly in the first half second of the operation


def _rerun(store: dsh.Store, session_id: str, op: str) -> None:
    """Run ``op`` again, waiting out the lease a killed PostgreSQL writer left."""
    deadline = time.monotonic() + 30
    while True:
        try:
            if op == "redact":
                redact(store, session_id, secrets=True)
            elif op == "gc":
                gc(store, apply=True)
                assert store_log(store).trash[session_id].purged_ms is not None
            else:
                erase(store, [session_id])
            return
        except SessionBusyError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _kill_somewhere(url: str, session_id: str, op: str, rng: random.Random) -> bool:
    """Run ``op`` in a child and SIGKILL it at a random moment; True if it finished first."""
    child = subprocess.Popen([sys.executable, "-m", "tests.rights._crash_worker", url,
                              session_id, op], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, cwd=REPO)
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline() == "ready\n"
    child.stdin.write("go\n")
    child.stdin.flush()
    time.sleep(rng.uniform(0, WINDOW_S))
    child.send_signal(signal.SIGKILL)
    out, _ = child.communicate(timeout=60)
    return out.strip() == "done"


@pytest.mark.parametrize("op", ["redact", "erase", "gc"])
def test_a_killed_operation_leaves_before_or_after_and_a_rerun_completes(
        url: str, op: str, tmp_path: Path) -> None:
    postgres = url.startswith("postgresql")
    kind = "jsonl-zstd" if url.startswith("jsonl+zstd") else url.split(":")[0]
    rng = random.Random(f"{os.environ.get('DSH_CRASH_SEED', '')}{op}-{kind}")
    for run in range(RUNS):
        # PostgreSQL: one schema, a session per run; file stores: a fresh store per run
        # (a killed PostgreSQL writer's lease expires after lease_ms: kept short here)
        run_url = f"{url}&lease_ms=1000" if postgres else store_url(kind, tmp_path / str(run))
        sid = f"s{run}"
        build(run_url, sid)
        with dsh.open(run_url) as store:
            before = store.read(sid).stored_events
            if op == "gc":  # the policy purges what is in the trash at once
                set_retention(store, RetentionPolicy(purge_after_days=0))
                trash(store, [sid])
        _kill_somewhere(run_url, sid, op, rng)
        with dsh.open(run_url) as store:
            read = store.read(sid)  # loadable: never a damaged log
            events = read.stored_events
            assert verify_events(events, header=read.header) == []
            if events != before:  # the state after: tombstones and one record, nothing else
                assert events[-1]["type"] == "redaction/applied"
                assert len(events) in (len(before) + 1, len(before) + 2)  # + end-seed marker
                assert [e["type"] for e in events[:len(before)]] == [e["type"] for e in before]
            if op == "gc":
                assert sid in store_log(store).trash  # the store log reads, sid still trashed
            _rerun(store, sid, op)
            read = store.read(sid)
            assert verify_events(read.stored_events, header=read.header) == []
            text = repr([dict(e) for e in read.stored_events])
            assert not any(secret in text for secret in SECRETS.values())
        # every earlier run on the schema was completed too: no store byte holds a secret
        leaks = [name for _, raw in store_bytes(run_url) for name, secret in SECRETS.items()
                 if secret.encode() in raw]
        assert leaks == [], leaks

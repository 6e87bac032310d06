"""Effect fault injection at scale: SIGKILL around tool calls, counted per effect class.

Run: ``python -m bench.bench_effects [--kills 1000] [--classes all] [--store sqlite|jsonl]
[--dir DIR]`` (``DSH_EFFECT_KILLS`` overrides ``--kills``).

Each trial (see ``tests/agent/effect_faults.py``) is one session whose model calls one tool of
one class against the counting payments server (its own process): a child runs the agent and
is SIGKILLed at a failpoint around the call (before the body; in the body before or after the
side effect; after the body before ``tool/result`` is durable); for every second trial a
resumed child is killed again while it decides and acts (at the decision, inside the re-run,
after the re-run before the rewritten result); a last child resumes and finishes. Children are
forked from this process after the imports (it starts no thread), so a kill costs a fork, not
an interpreter start. Trials cycle through every (first point, second point) pair until the
class has taken ``--kills`` kills.

Reported per class: trials, kills delivered, **duplicate effects** (server applications beyond
one per call: idempotent and reconcilable tools), **irreversible re-runs** (body starts beyond
one), **calls without a result or a pending approval**, irreversible calls left waiting for a
person, and wall time. The promise is 0, 0, 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_write import header_lines
from bench.workloads import existing_dir

MODULE = "bench.bench_effects"


def _start_server(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file = root / "port"
    server = subprocess.Popen([sys.executable, "-m", "tests.agent.payments", str(port_file)])
    deadline = time.monotonic() + 30
    while not port_file.exists() or not port_file.read_text():
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the payments server did not start")
        time.sleep(0.02)
    return server, f"http://127.0.0.1:{port_file.read_text()}"


def _checked(url: str, server: str, session_id: str, trial: Any) -> dict[str, Any]:
    """Run the checks in a forked child (this process stays free of threads and handles)."""
    from tests.agent.effect_faults import check_trial

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        checked = check_trial(trial, url, server, session_id)
        os.write(write, json.dumps({
            "applied": checked.applied, "duplicates": checked.duplicates,
            "reruns": checked.reruns, "unanswered": checked.unanswered,
            "pending": checked.pending_approval, "started": checked.started}).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return dict(json.loads(b"".join(chunks)))


def run_class(klass: str, kills: int, url: str, server: str) -> dict[str, Any]:
    from tests.agent.effect_faults import FIRST_POINTS, SECOND_POINTS, run_trial, spawn_fork

    pairs = [(first, second) for first in FIRST_POINTS for second in SECOND_POINTS]
    totals = {"trials": 0, "kills": 0, "duplicates": 0, "reruns": 0, "unanswered": 0,
              "pending": 0, "applied_once": 0}
    started = time.perf_counter()
    index = 0
    while totals["kills"] < kills:
        first, second = pairs[index % len(pairs)]
        session_id = f"{klass}-{index}"
        trial = run_trial(spawn_fork, url, server, session_id, klass, first, second)
        found = _checked(url, server, session_id, trial)
        totals["trials"] += 1
        totals["kills"] += trial.kills
        totals["duplicates"] += found["duplicates"]
        totals["reruns"] += found["reruns"]
        totals["unanswered"] += found["unanswered"]
        totals["pending"] += int(found["pending"])
        totals["applied_once"] += int(found["applied"] == 1)
        index += 1
    totals["seconds"] = time.perf_counter() - started
    return totals


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=MODULE, description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=1000, help="kills per class")
    parser.add_argument("--classes", default="all")
    parser.add_argument("--store", choices=("sqlite", "jsonl"), default="sqlite")
    parser.add_argument("--dir", type=existing_dir, default=None)
    args = parser.parse_args(argv)
    kills = int(os.environ.get("DSH_EFFECT_KILLS", args.kills))
    from tests.agent.effect_faults import KLASSES

    classes = list(KLASSES) if args.classes == "all" else args.classes.split(",")
    # Import and warm up everything the children use before the first fork (they start from
    # this image): pydantic builds its first tool schemas slowly.
    from tests.agent.effect_faults import warm_up

    import dsh.persistence.sqlite._backend  # noqa: F401

    warm_up()

    root = Path(tempfile.mkdtemp(prefix="dsh-bench-effects-", dir=args.dir))
    server, server_url = _start_server(root)
    try:
        url = f"sqlite:///{root}/store.db" if args.store == "sqlite" else f"jsonl://{root}/store"
        header_lines(f"effects: SIGKILL around tool calls, {kills} kills per class "
                     f"({args.store}, forked children)")
        print("| class | trials | kills | duplicate effects | irreversible re-runs | calls "
              "without result or approval | effect applied once | waiting for a person | "
              "s |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for klass in classes:
            totals = run_class(klass, kills, url, server_url)
            once = totals["applied_once"] if klass in ("idempotent", "reconcilable") else "-"
            print(f"| {klass} | {totals['trials']} | {totals['kills']} | "
                  f"{totals['duplicates']} | {totals['reruns']} | {totals['unanswered']} | "
                  f"{once} | {totals['pending']} | {totals['seconds']:.0f} |", flush=True)
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

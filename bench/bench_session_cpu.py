"""CPU time of DshSession's cold open, first write and turns, beside SQLiteSession's.

What :mod:`bench.bench_adapters` times in wall milliseconds, as process CPU time
(``time.process_time``: every thread of the process, so the SDK's ``asyncio.to_thread`` calls
count), which a loaded machine moves far less. Each figure comes from a fresh process on its
own copy of a store prefilled once per size (the items of ``bench_adapters``), with the
modules imported before the clock starts:

* ``cold get_items(20)``: the process's first ``get_items(limit=20)``;
* ``first write``: the ``add_items`` of a turn's four items right after it (DshSession resumes
  the log for writing there);
* ``per turn``: then ``--turns`` turns as the SDK's Runner makes them (``get_items()``,
  ``add_items`` of the prompt, ``add_items`` of the rest), the median turn.

With ``--before DIR`` (a checkout of another commit, its C accelerator built) the same
DshSession figures are taken with ``DIR/src`` first on the import path, in the same run:
processes alternate before / after / SQLiteSession, and medians of ``--runs`` are printed.

Run: ``python -m bench.bench_session_cpu [--sizes 100,10000,100000] [--runs 7] [--turns 10]
[--before DIR] [--dir PARENT]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_adapters import make_session, prefill, runner_turn, turn_items
from bench.workloads import existing_dir, machine


def _cpu_ms() -> float:
    return time.process_time() * 1000


async def measure(kind: str, root: Path, items: int, turns: int) -> dict[str, float]:
    """CPU ms of the cold ``get_items(20)``, the first write and the median turn."""
    session = make_session("sqlite" if kind == "sqlite" else "dsh", root)
    gc.collect()  # the SDK import's young objects: see bench_adapters.measure
    t0 = _cpu_ms()
    await session.get_items(limit=20)
    cold = _cpu_ms() - t0
    t0 = _cpu_ms()
    await session.add_items(turn_items(items // 4))
    first = _cpu_ms() - t0
    per_turn = []
    for n in range(items // 4 + 1, items // 4 + 1 + turns):
        t0 = _cpu_ms()
        await runner_turn(session, n)
        per_turn.append(_cpu_ms() - t0)
    session.close()
    return {"cold_limit": cold, "first_write": first,
            "turn": statistics.median(per_turn) if per_turn else 0.0}


def run_child(kind: str, root: Path, items: int, turns: int,
              before: Path | None) -> dict[str, float]:
    env = dict(os.environ)
    if kind == "before" and before is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(before / "src"), str(Path.cwd())])
    out = subprocess.run([sys.executable, "-m", "bench.bench_session_cpu", "--child", kind,
                          "--root", str(root), "--sizes", str(items), "--turns", str(turns)],
                         check=True, capture_output=True, text=True, env=env).stdout
    result: dict[str, float] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100,10000,100000")
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per side")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--before", type=Path, default=None,
                        help="a checkout of another commit to time beside this one")
    parser.add_argument("--dir", type=existing_dir, default=None,
                        help="parent of the temporary stores")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--root", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.child:
        print(json.dumps(asyncio.run(measure(args.child, Path(args.root), sizes[0],
                                             args.turns))))
        return
    kinds = ["dsh", *(["before"] if args.before else []), "sqlite"]
    labels = {"dsh": "DshSession", "before": f"DshSession at {args.before}",
              "sqlite": "SQLiteSession"}
    print(f"# CPU ms of fresh processes, median of {args.runs}, alternating — {machine()}")
    print("| items | session | cold get_items(20) | first write | per turn |")
    print("|---|---|---|---|---|")
    for items in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-session-cpu-", dir=args.dir) as tmp:
            base = Path(tmp)
            for store in ("dsh", "sqlite"):
                (base / store).mkdir()
                asyncio.run(prefill(store, base / store, items))
            results: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
            for _ in range(args.runs):
                for kind in kinds:
                    copy = base / "run"
                    shutil.copytree(base / ("sqlite" if kind == "sqlite" else "dsh"), copy)
                    try:
                        results[kind].append(run_child(kind, copy, items, args.turns,
                                                       args.before))
                    finally:
                        shutil.rmtree(copy)
        for kind in kinds:
            med = {key: statistics.median(r[key] for r in results[kind])
                   for key in ("cold_limit", "first_write", "turn")}
            print(f"| {items:,} | {labels[kind]} | {med['cold_limit']:.2f} | "
                  f"{med['first_write']:.2f} | {med['turn']:.2f} |")


if __name__ == "__main__":
    main()

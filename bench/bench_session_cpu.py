"""CPU of DshSession in fresh processes beside SQLiteSession: cold reads, first write, turns.

What :mod:`bench.bench_adapters` times in wall milliseconds, as process CPU time
(``time.process_time``: every thread of the process, so the SDK's ``asyncio.to_thread`` calls
count), which a loaded machine moves far less. Each figure comes from a fresh process on its
own copy of a store prefilled once per size (the items of ``bench_adapters``), with the
modules imported and ``gc.collect()`` run before the clock starts. Two kinds of process
(``--figures``):

* ``recent``: ``construct`` (the session's constructor alone: ``SQLiteSession`` connects and
  creates its tables there, ``DshSession`` opens its store lazily on first use; a breakdown of
  the next figure, which includes it), ``cold open + get_items(20)`` (the clock started before
  the constructor, stopped after the process's first ``get_items(limit=20)``, what a Runner
  with ``SessionSettings(limit=20)`` asks first), ``first write`` (the ``add_items`` of a
  turn's four items right after it: DshSession resumes the log for writing there), then
  ``per turn``: ``--turns`` turns as the SDK's Runner makes them (``get_items()``,
  ``add_items`` of the prompt, ``add_items`` of the rest), the median turn (``--turns 0``:
  none);
* ``whole``: ``cold open + get_items()`` (constructor and the process's first whole-history
  read) and the process's peak RSS after it.

With ``--before DIR`` (a checkout of another commit, its C accelerator built) the same
DshSession figures are taken with ``DIR/src`` first on the import path, in the same run:
processes alternate before / after / SQLiteSession, medians of ``--runs`` are printed. The
stores are prefilled by this tree (the before tree must read them: no stored-format change).

Run: ``python -m bench.bench_session_cpu [--figures recent,whole] [--sizes 100,10000,100000]
[--runs 7] [--turns 10] [--before DIR] [--dir PARENT]``.
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

from bench.bench_adapters import (
    import_session,
    make_session,
    open_read_write,
    prefill,
    runner_turn,
)
from bench.workloads import existing_dir, machine, peak_rss_mb

FIGURES = {"recent": ("construct", "cold_limit", "first_write", "turn"),
           "whole": ("cold_whole", "rss")}
"""The figures each kind of child process measures, in column order."""


def _cpu_ms() -> float:
    return time.process_time() * 1000


async def measure(kind: str, root: Path, items: int, turns: int,
                  figure: str) -> dict[str, float]:
    """CPU ms (and peak RSS MB) of one fresh process's ``figure`` (a key of :data:`FIGURES`).

    ``kind`` is ``dsh``, ``before`` (DshSession from the tree on the import path) or
    ``sqlite``; raises AssertionError if a read returns the wrong number of items.
    """
    store = "sqlite" if kind == "sqlite" else "dsh"
    if figure == "whole":
        import_session(store)  # the imports, outside the clock
        gc.collect()  # the SDK import's young objects: see bench_adapters.measure
        t0 = _cpu_ms()
        session = make_session(store, root)
        history = await session.get_items()
        cold_whole = _cpu_ms() - t0
        assert len(history) == items // 4 * 4, (kind, len(history))
        session.close()
        return {"cold_whole": cold_whole, "rss": peak_rss_mb()}
    session, found = await open_read_write(store, root, items, _cpu_ms)
    per_turn = []
    for n in range(items // 4 + 1, items // 4 + 1 + turns):
        t0 = _cpu_ms()
        await runner_turn(session, n)
        per_turn.append(_cpu_ms() - t0)
    session.close()
    return {**found, "turn": statistics.median(per_turn) if per_turn else float("nan")}


def run_child(kind: str, store: Path, items: int, turns: int, figure: str,
              before: Path | None) -> dict[str, float]:
    """One fresh process measuring ``figure`` on its own copy of ``store``."""
    env = dict(os.environ)
    if kind == "before" and before is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(before / "src"),
                                                          env.get("PYTHONPATH")]))
    copy = store.with_name("run")
    shutil.copytree(store, copy)
    try:
        out = subprocess.run([sys.executable, "-m", "bench.bench_session_cpu", "--child", kind,
                              "--root", str(copy), "--sizes", str(items), "--turns", str(turns),
                              "--figures", figure],
                             check=True, capture_output=True, text=True, env=env).stdout
    finally:
        shutil.rmtree(copy)
    result: dict[str, float] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--figures", default="recent,whole",
                        help="child processes to run: recent (construct, cold open + "
                             "get_items(20), first write, per turn), whole (cold open + "
                             "get_items(), peak RSS)")
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
    figures = [f for f in args.figures.split(",") if f]
    unknown = set(figures) - set(FIGURES)
    if unknown or not figures:
        parser.error(f"--figures: choose from {', '.join(FIGURES)}, not {args.figures!r}")
    if args.child:
        print(json.dumps(asyncio.run(measure(args.child, Path(args.root), sizes[0],
                                             args.turns, figures[0]))))
        return
    before = args.before.resolve() if args.before else None
    kinds = [*(["before"] if before else []), "dsh", "sqlite"]
    labels = {"dsh": "DshSession", "before": f"DshSession at {before}",
              "sqlite": "SQLiteSession"}
    print(f"# CPU ms of fresh processes, median of {args.runs}, alternating — {machine()}")
    print("| items | session | construct | cold open + get_items(20) | first write | per turn "
          "| cold open + get_items() | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|")
    for items in sizes:
        results: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
        with tempfile.TemporaryDirectory(prefix="bench-session-cpu-", dir=args.dir) as tmp:
            base = Path(tmp)
            for store in ("dsh", "sqlite"):
                (base / store).mkdir()
                asyncio.run(prefill(store, base / store, items))
            for _ in range(args.runs):
                for figure in figures:
                    for kind in kinds:  # alternating: each side sees the same machine noise
                        store = base / ("sqlite" if kind == "sqlite" else "dsh")
                        found = run_child(kind, store, items, args.turns, figure, before)
                        if figure == figures[0]:
                            results[kind].append(found)
                        else:
                            results[kind][-1].update(found)
        for kind in kinds:
            cells = []
            for key in ("construct", "cold_limit", "first_write", "turn", "cold_whole", "rss"):
                if key not in results[kind][0] or (key == "turn" and not args.turns):
                    cells.append("—")
                    continue
                value = statistics.median(r[key] for r in results[kind])
                cells.append(f"{value:.0f}" if key == "rss" else f"{value:.2f}")
            print(f"| {items:,} | {labels[kind]} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()

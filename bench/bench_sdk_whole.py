"""CPU and peak RSS of DshSession's cold whole-history ``get_items()``, two dsh trees alternating.

Each store is prefilled once as ``bench.bench_adapters`` prefills it (turns of user message,
function_call, function_call_output, assistant message). Then fresh processes, alternating
``--before-python`` (another checkout's interpreter, run from ``--before-dir``), this checkout
and the SDK's ``SQLiteSession``, each time: the imports, ``gc.collect()``, then
``time.process_time`` around the first ``await session.get_items()`` of the process (CPU, so
a loaded machine moves it less than a wall clock), and the process's peak RSS after it.
Medians of ``--runs`` processes each.

Run: ``python -m bench.bench_sdk_whole [--sizes 100,10000,100000] [--runs 5]
[--before-python ../main/.venv/bin/python --before-dir ../main] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_adapters import make_session, prefill
from bench.workloads import existing_dir, machine, peak_rss_mb


async def cold_whole(kind: str, root: Path, items: int) -> dict[str, float]:
    """The first ``get_items()`` of the process: its CPU ms and the peak RSS after it."""
    session = make_session(kind, root)
    gc.collect()  # the SDK's import leaves young objects: not this call's work
    t0 = time.process_time()
    history = await session.get_items()
    cpu_ms = (time.process_time() - t0) * 1000
    assert len(history) == items // 4 * 4, (kind, len(history))
    session.close()
    return {"cpu_ms": cpu_ms, "rss": peak_rss_mb()}


def run(python: str, cwd: Path, kind: str, root: Path, items: int) -> dict[str, float]:
    out = subprocess.run([python, "-m", "bench.bench_sdk_whole", "--child", kind, "--root",
                          str(root), "--sizes", str(items)], cwd=cwd, check=True,
                         capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100,10000,100000")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--before-python", default=None)
    parser.add_argument("--before-dir", default=None)
    parser.add_argument("--dir", type=existing_dir, default=None,
                        help="parent of the temporary stores")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--root", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.child:
        print(json.dumps(asyncio.run(cold_whole(args.child, Path(args.root), sizes[0]))))
        return
    here = Path.cwd()
    sides = [("after", sys.executable, here, "dsh")]
    if args.before_python:
        sides.insert(0, ("before", args.before_python, Path(args.before_dir or here), "dsh"))
    sides.append(("SQLiteSession", sys.executable, here, "sqlite"))
    print(f"# cold whole-history get_items(), CPU ms / peak RSS MB, median of {args.runs} "
          f"fresh processes each, alternating — {machine()}")
    print("| items | " + " | ".join(f"{name} CPU ms | {name} RSS MB" for name, *_ in sides)
          + " |")
    print("|---|" + "---|---|" * len(sides))
    for items in sizes:
        root = Path(tempfile.mkdtemp(prefix="bench-sdk-whole-", dir=args.dir))
        try:
            for kind in ("dsh", "sqlite"):
                asyncio.run(prefill(kind, root, items))
            results: dict[str, list[dict[str, float]]] = {name: [] for name, *_ in sides}
            for _ in range(args.runs):
                for name, python, cwd, kind in sides:
                    results[name].append(run(python, cwd, kind, root, items))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        cells = []
        for name, *_ in sides:
            runs = results[name]
            cells.append(f"{statistics.median(r['cpu_ms'] for r in runs):.1f} | "
                         f"{statistics.median(r['rss'] for r in runs):.0f}")
        print(f"| {items:,} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()

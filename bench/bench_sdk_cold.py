"""CPU of an SDK session's cold read in a fresh process: DshSession beside SQLiteSession.

What ``bench.bench_adapters`` times by the wall clock (its "cold get_items(limit=20)" and
"first write" columns), measured as process CPU time (``time.process_time``), which a loaded
machine does not inflate: each child process imports the modules, builds the session, then
times the SDK's async ``get_items(limit=20)`` (the first call of the process, as a Runner with
``SessionSettings(limit=20)`` makes it), then ``add_items`` of a turn (the first write), on a
copy of a prefilled store. The constructor is timed too, apart: ``SQLiteSession`` opens its
database and creates its tables there, ``DshSession`` opens its store on first use.

``--before SRC`` adds a third column: the same DshSession code from another source tree
(``SRC`` is put first on ``PYTHONPATH``; give it its own built accelerator), run alternately
with this tree's, for before/after figures. The stores are prefilled once per size by this
tree and copied for each child (the before tree must read them: no stored-format change).

Run: ``python -m bench.bench_sdk_cold [--sizes 100,10000,100000] [--runs 7]
[--before /path/to/src]``; medians of ``--runs`` fresh processes per column.
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

from bench.bench_adapters import make_session, prefill, turn_items
from bench.workloads import existing_dir, machine


async def _measure(kind: str, root: Path, items: int) -> dict[str, float]:
    if kind == "dsh":
        make_session(kind, root / "imports-only")  # the imports, outside the clock
    else:
        from agents import SQLiteSession  # noqa: F401
    gc.collect()  # as bench_adapters: the SDK's import leaves a collection due
    t0 = time.process_time()
    session = make_session(kind, root)
    t1 = time.process_time()
    recent = await session.get_items(limit=20)
    t2 = time.process_time()
    assert len(recent) == min(20, items // 4 * 4), (kind, len(recent))
    await session.add_items(turn_items(items // 4))
    t3 = time.process_time()
    session.close()
    return {"construct": (t1 - t0) * 1000, "cold_limit": (t2 - t1) * 1000,
            "first_write": (t3 - t2) * 1000}


def _child(kind: str, root: Path, items: int) -> None:
    print(json.dumps(asyncio.run(_measure(kind, root, items))))


def _run(kind: str, store: Path, items: int, src: str | None) -> dict[str, float]:
    copy = Path(tempfile.mkdtemp(prefix="bench-sdk-cold-", dir=store.parent))
    try:
        shutil.copytree(store, copy, dirs_exist_ok=True)
        env = dict(os.environ)
        if src is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
        out = subprocess.run([sys.executable, "-m", "bench.bench_sdk_cold", "--child", kind,
                              "--root", str(copy), "--sizes", str(items)], env=env,
                             check=True, capture_output=True, text=True).stdout
        result: dict[str, float] = json.loads(out)
        return result
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100,10000,100000")
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per column")
    parser.add_argument("--before", default=None, help="another source tree's src folder")
    parser.add_argument("--dir", type=existing_dir, default=None,
                        help="parent of the temporary stores")
    for internal in ("--child", "--root"):  # a child process's: its session kind and store
        parser.add_argument(internal, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.child:
        _child(args.child, Path(args.root), sizes[0])
        return
    columns = [("after", "dsh", None), ("SQLiteSession", "sqlite", None)]
    if args.before:
        columns.insert(0, ("before", "dsh", str(Path(args.before).resolve())))
    print(f"# sdk cold read: process CPU ms, median of {args.runs} fresh processes, "
          f"alternating — {machine()}")
    print("| items | column | construct | cold get_items(limit=20) | first write |")
    print("|---|---|---|---|---|")
    for items in sizes:
        parent = Path(tempfile.mkdtemp(prefix="bench-sdk-cold-", dir=args.dir))
        try:
            stores = {kind: parent / kind for kind in ("dsh", "sqlite")}
            for kind, store in stores.items():
                store.mkdir()
                asyncio.run(prefill(kind, store, items))
            found: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in columns}
            for _ in range(args.runs):
                for label, kind, src in columns:  # alternating: the same machine noise
                    found[label].append(_run(kind, stores[kind], items, src))
            for label, _, _ in columns:
                runs = found[label]
                cells = [statistics.median(r[key] for r in runs)
                         for key in ("construct", "cold_limit", "first_write")]
                print(f"| {items:,} | {label} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
        finally:
            shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
    main()

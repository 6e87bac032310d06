"""Workload 5 (load): cold load of sessions written by the write path, in a fresh process.

Run: ``python -m bench.bench_load [--sizes 10000,100000] [--runs 5] [--backend all|...]
[--workload all|msg|stream] [--mode resume|load|both] [--dir DIR]``.

The parent writes one session per backend, workload and size with the write path of
``bench.bench_write`` (``SessionStore`` + write-behind + one flush). Each measured run copies that
store into a fresh directory and starts a fresh process with a fresh store object, which times:

* ``resume`` (default): ``dsh.open(url)`` + ``SessionStore(persistence=...)`` +
  ``store.resume(id)``: write ownership, cold read, pipeline, ``Session.restore``, published
  and writable. This is "time to a usable Session".
* ``load``: ``dsh.open(url).persistence.load(id)`` (read, pipeline, validation; an
  ``Inspection``) followed by ``Session.restore`` of its events, a detached session.

Also printed: the time to import dsh in the child (not part of the load figure), the first
``derive_messages`` on the loaded session, and the child's peak RSS (a load-only process).
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from bench.bench_write import (
    BACKENDS,
    WORKLOADS,
    header_lines,
    medians,
    run_child,
    select,
    store_url,
    write_session,
)
from bench.workloads import existing_dir, now_ms, peak_rss_mb, ratio

# dsh-baseline.md §5: ms by (backend, workload, size); RSS of a load-only process at 100k (MB)
DSH_LOAD_MS: dict[tuple[str, str, int], float] = {
    ("jsonl-packed", "msg", 10_000): 76, ("jsonl-packed", "msg", 100_000): 489,
    ("jsonl-packed", "stream", 10_000): 54, ("jsonl-packed", "stream", 100_000): 200,
    ("jsonl-unpacked", "msg", 10_000): 80, ("jsonl-unpacked", "msg", 100_000): 466,
    ("jsonl-unpacked", "stream", 10_000): 66, ("jsonl-unpacked", "stream", 100_000): 311,
    ("jsonl-zstd", "msg", 10_000): 86, ("jsonl-zstd", "msg", 100_000): 497,
    ("jsonl-zstd", "stream", 10_000): 51, ("jsonl-zstd", "stream", 100_000): 207,
    ("sqlite", "msg", 10_000): 87, ("sqlite", "msg", 100_000): 706,
    ("sqlite", "stream", 10_000): 61, ("sqlite", "stream", 100_000): 536,
}
DSH_LOAD_RSS_100K: dict[tuple[str, str], float] = {
    ("jsonl-packed", "msg"): 192, ("jsonl-packed", "stream"): 140,
    ("jsonl-unpacked", "msg"): 193, ("jsonl-unpacked", "stream"): 174,
    ("jsonl-zstd", "msg"): 196, ("jsonl-zstd", "stream"): 162,
    ("sqlite", "msg"): 325, ("sqlite", "stream"): 298,
}
SESSION_ID = "bench"


def child(url: str, mode: str) -> dict[str, Any]:
    t0 = now_ms()
    from dsh.persistence import Persistence, open_backend
    from dsh.session._session import Session
    from dsh.session._store import SessionStore

    # dsh.open imports the facade and the backend lazily: import them here so module loading
    # is counted in import_ms, not in the load time.
    importlib.import_module("dsh.persistence._facade")
    importlib.import_module("dsh.persistence.sqlite._backend" if url.startswith("sqlite")
                            else "dsh.persistence.jsonl._backend")
    importlib.import_module("filelock")  # the write lock imports it when a resume takes one
    t1 = now_ms()
    persistence = Persistence(open_backend(url))
    if mode == "resume":
        store = SessionStore(persistence=persistence)
        session = store.resume(SESSION_ID)
        t_load = now_ms()
    else:
        inspection = persistence.load(SESSION_ID)
        t_load = now_ms()  # what dsh's `load` returns: read, pipeline, validation, repair
        seed_length = inspection.header.get("seedLength") or 0
        session = Session.restore(SESSION_ID, inspection.events, inspection.header,
                                  inherited_event_count=seed_length)
    t2 = now_ms()
    session.derive_messages()
    t3 = now_ms()
    events = len(session.events)
    persistence.close()
    return {"import_ms": t1 - t0, "load_ms": t2 - t1, "load_only_ms": t_load - t1,
            "derive_ms": t3 - t2, "events": events, "rss": peak_rss_mb()}


def load_child(backend: str, mode: str, root: Path) -> dict[str, Any]:
    """One fresh process of ours loading the store of ``backend`` under ``root`` (``mode``:
    ``resume`` or ``load``); returns its JSON result (see :func:`child`)."""
    return run_child("bench.bench_load", ["--url", store_url(backend, root), "--mode", mode])


Cell = tuple[Path, Callable[[Path], dict[str, Any]]]
"""A master store directory and the fresh-process run that loads a copy of it."""


def interleaved_runs(cells: Sequence[Cell], scratch: Path, runs: int) -> list[list[dict[str, Any]]]:
    """``runs`` rounds; each round copies every cell's master to ``scratch`` and runs it there.

    A fresh copy per run (a resume appends its end-seed marker); cells alternate within a
    round (ours, dsh, ours, dsh, ...), so load on the machine falls on both alike.

    Returns:
        One list of results per cell, in run order.
    """
    results: list[list[dict[str, Any]]] = [[] for _ in cells]
    for _ in range(runs):
        for (master, run), out in zip(cells, results, strict=True):
            shutil.rmtree(scratch, ignore_errors=True)
            shutil.copytree(master, scratch)
            try:
                out.append(run(scratch))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000", help="events per session, comma list")
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per cell")
    parser.add_argument("--backend", default="all", help=f"all or {', '.join(BACKENDS)}")
    parser.add_argument("--workload", default="all", help="all, msg or stream")
    parser.add_argument("--mode", default="resume", choices=("resume", "load", "both"))
    parser.add_argument("--dir", type=existing_dir, default=None,
                        help="where the temporary stores go")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.url, args.mode)))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = ["resume", "load"] if args.mode == "both" else [args.mode]
    rows: list[tuple[str, str, int, str, dict[str, float]]] = []
    work = Path(tempfile.mkdtemp(prefix="dsh-bench-load-", dir=args.dir))
    try:
        for backend in select(args.backend, list(BACKENDS)):
            for workload in select(args.workload, WORKLOADS):
                for size in sizes:
                    master = work / f"{backend}-{workload}-{size}"
                    master.mkdir()
                    write_session(store_url(backend, master), workload, size, SESSION_ID)
                    for mode in modes:
                        [runs] = interleaved_runs([(master, partial(load_child, backend, mode))],
                                                  work / "run", args.runs)
                        rows.append((backend, workload, size, mode, medians(runs)))
                    shutil.rmtree(master, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    header_lines(f"load: cold load in a fresh process (median of {args.runs} processes)")
    print("| backend | workload | events | path | load ms | first derive ms | import dsh ms "
          "| peak RSS | dsh ms | dsh RSS | ms vs dsh | RSS vs dsh |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for backend, workload, size, mode, r in rows:
        d_ms = DSH_LOAD_MS.get((backend, workload, size))
        d_rss = DSH_LOAD_RSS_100K.get((backend, workload)) if size == 100_000 else None
        path = "resume" if mode == "resume" else "load + restore"
        print(f"| {BACKENDS[backend][0]} | {workload} | {r['events']:,.0f} | {path} "
              f"| {r['load_ms']:.0f} | {r['derive_ms']:.1f} | {r['import_ms']:.0f} "
              f"| {r['rss']:.0f} MB | {d_ms if d_ms else '—'} "
              f"| {f'{d_rss:.0f} MB' if d_rss else '—'} "
              f"| {ratio(r['load_ms'], d_ms, higher_is_better=False) if d_ms else 'n/a'} "
              f"| {ratio(r['rss'], d_rss, higher_is_better=False) if d_rss else 'n/a'} |")
    print("\nload ms: dsh.open + (resume | load + Session.restore), excluding the interpreter "
          "start and `import dsh` (shown apart). dsh: Node 24, its RSS includes ≈58 MB of "
          "runtime; ours includes the CPython interpreter.")


if __name__ == "__main__":
    main()

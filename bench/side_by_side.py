"""Side by side with the published dsh: fresh processes of ours and dsh's, interleaved, as ratios.

Run: ``python -m bench.side_by_side [--sizes 10000,100000] [--runs 5] [--backend all]
[--workload all] [--sections all|load,resume,flush,derive] [--flush-events 10000]
[--derive-surface 100000] [--derive-runs 2] [--node-dir DIR] [--dir DIR]``.

dsh is driven by ``../shared/peers/dsh-node`` set up in ``--node-dir`` (default ``$DSH_NODE_DIR``
or ``/tmp/dsh-node``; ``setup.sh DIR`` installs it). Without it, ours is printed beside the
figures of ``../shared/bench/dsh-baseline.md`` (another day, another run: ratios are rougher).

Rows (ratio > 1 means ours is better: dsh time ÷ ours, dsh RSS ÷ ours):

* ``load``: cold load in a fresh process, every backend × workload × size. Each side loads the
  session its own writer produced (same workload shapes). Ours:
  ``dsh.open(url).persistence.load(id)`` (read, pipeline, full restore validation, repair
  commit); dsh: ``sessionPersistence.load(id)``. With it, the load-only process's RSS at the
  largest size (ours: peak ``VmHWM``; dsh: ``process.memoryUsage().rss`` at exit,
  both including the runtime).
* ``resume``: restart to a usable session. Ours: ``SessionStore.resume``; dsh: ``prepare``.
* ``flush``: the median cost of one SQLite flush when flushing after every msg turn.
* ``derive``: ``derive_messages`` on a ``--derive-surface`` surface-event msg session: the first
  full derive, after two appends (the previous result dropped; again with it still held,
  released outside the timed window), after a replace.

Every measured figure is the median over ``--runs`` fresh processes per side, run alternately
(ours, dsh, ours, dsh, ...) on copies of one master store per side and cell.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from bench.bench_load import DSH_LOAD_MS, DSH_LOAD_RSS_100K, Cell, interleaved_runs, load_child
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

SESSION_ID = "bench"
SECTIONS = ("load", "resume", "flush", "derive")
# our backend name -> the kind the dsh driver takes
DSH_KIND = {"jsonl-packed": "jsonl", "jsonl-unpacked": "jsonl-unpacked",
            "jsonl-zstd": "jsonl-zstd", "sqlite": "sqlite"}
# dsh-baseline.md §4 and §2, used when the peer is not set up
BASELINE_SQLITE_FLUSH_MS = 0.5
BASELINE_DERIVE_100K = {"first": 17.4, "after_append": 0.42, "after_append_held": 0.42,
                        "after_replace": 14.4}


class Peer:
    """The published dsh, driven through the peer's ``bench.mjs`` / ``bench-x.mjs``."""

    def __init__(self, root: Path) -> None:
        self.node = root / "nodebin" / "node_modules" / "node" / "bin" / "node"
        self.app = root / "app"

    @classmethod
    def find(cls, option: str | None) -> Peer | None:
        """The peer in ``option``, ``$DSH_NODE_DIR`` or ``/tmp/dsh-node``, if it is set up."""
        root = Path(option or os.environ.get("DSH_NODE_DIR") or "/tmp/dsh-node")
        peer = cls(root)
        if peer.node.is_file() and (peer.app / "bench.mjs").is_file() and (
                peer.app / "node_modules").is_dir():
            return peer
        return None

    def run(self, script: str, *args: str) -> dict[str, Any]:
        """Run ``node <script> <args>`` in a fresh process; return its JSON line."""
        proc = subprocess.run([str(self.node), str(self.app / script), *args],
                              capture_output=True, text=True, cwd=self.app)
        if proc.returncode != 0:
            raise SystemExit(f"dsh {script} {' '.join(args)} failed (exit {proc.returncode}):\n"
                             f"{proc.stderr}")
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return result

    def load(self, backend: str, op: str, root: Path) -> dict[str, Any]:
        """A fresh dsh process running ``op`` (load or prepare) on the store under ``root``."""
        return self.run("bench.mjs", "load", DSH_KIND[backend], dsh_location(backend, root),
                        SESSION_ID, op)

    def version(self) -> str:
        """``node --version`` and the pinned dsh-session version."""
        node = subprocess.run([str(self.node), "--version"], capture_output=True,
                              text=True).stdout.strip()
        package = self.app / "node_modules" / "@deepseek-ai" / "dsh-session" / "package.json"
        try:
            dsh = json.loads(package.read_text())["version"]
        except (OSError, ValueError, KeyError):
            dsh = "?"
        return f"Node {node}, @deepseek-ai/dsh-session {dsh}"


def dsh_location(backend: str, root: Path) -> str:
    """Where the dsh driver keeps a store of ``backend`` under ``root``."""
    return str(root / "store.db") if backend == "sqlite" else str(root / "store")


class Table:
    """Rows of (label, dsh figure, our figure, unit, lower_is_better) printed with ratios."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float | None, float, str, bool]] = []

    def add(self, label: str, dsh: float | None, ours: float, unit: str,
            lower_is_better: bool = True) -> None:
        self.rows.append((label, dsh, ours, unit, lower_is_better))

    def print(self, dsh_label: str) -> None:
        print(f"| row | dsh ({dsh_label}) | ours | ratio |")
        print("|---|---|---|---|")
        below = 0
        for label, dsh, ours, unit, lower in self.rows:
            if dsh is None or dsh <= 0 or ours <= 0:
                shown = "n/a"
            else:
                r = dsh / ours if lower else ours / dsh
                below += r < 1.0
                shown = f"**{r:.2f}**" if r < 1.0 else f"{r:.2f}"
            print(f"| {label}, {unit} | {fmt(dsh)} | {fmt(ours)} | {shown} |")
        print(f"\nRatio > 1: ours is better (dsh ÷ ours for times and RSS). "
              f"{below} row(s) below 1.0 in bold.")


def fmt(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.1f}"
    return f"{value:.3f}"


def cold_rows(table: Table, peer: Peer | None, work: Path, args: argparse.Namespace,
              sections: Sequence[str]) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = [m for m in ("load", "resume") if m in sections]
    if not modes:
        return
    rss: list[tuple[str, float | None, float]] = []
    for backend in select(args.backend, list(BACKENDS)):
        for workload in select(args.workload, WORKLOADS):
            for size in sizes:
                ours_master = work / "ours-master"
                dsh_master = work / "dsh-master"
                ours_master.mkdir()
                write_session(store_url(backend, ours_master), workload, size, SESSION_ID)
                if peer is not None:
                    dsh_master.mkdir()
                    peer.run("bench.mjs", "write", DSH_KIND[backend],
                             dsh_location(backend, dsh_master), workload, str(size), "end")
                for mode in modes:
                    op = "load" if mode == "load" else "prepare"
                    cells: list[Cell] = [(ours_master, partial(load_child, backend, mode))]
                    if peer is not None:
                        cells.append((dsh_master, partial(peer.load, backend, op)))
                    ours_runs, *dsh_side = interleaved_runs(cells, work / "run", args.runs)
                    dsh_runs = dsh_side[0] if dsh_side else []
                    ours = medians(ours_runs)
                    if peer is not None:
                        theirs = medians(dsh_runs)
                        dsh_ms: float | None = theirs[f"{op}Ms"]
                        dsh_rss: float | None = theirs["rssMB"]
                    else:
                        dsh_ms = DSH_LOAD_MS.get((backend, workload, size))
                        dsh_rss = (DSH_LOAD_RSS_100K.get((backend, workload))
                                   if size == 100_000 else None)
                    what = "cold load" if mode == "load" else "restart to usable session"
                    # cold load: Persistence.load alone, as dsh's load (the detached restore
                    # after it is not part of dsh's figure); restart: the whole resume
                    ours_ms = ours["load_only_ms"] if mode == "load" else ours["load_ms"]
                    table.add(f"{what} {size // 1000}k {workload}, {BACKENDS[backend][0]}",
                              dsh_ms, ours_ms, "ms")
                    if mode == "load" and size == max(sizes):
                        rss.append((f"load-only RSS {size // 1000}k {workload}, "
                                    f"{BACKENDS[backend][0]}", dsh_rss, ours["rss"]))
                shutil.rmtree(ours_master, ignore_errors=True)
                shutil.rmtree(dsh_master, ignore_errors=True)
    for label, dsh_rss, ours_rss in rss:
        table.add(label, dsh_rss, ours_rss, "MB")


def flush_row(table: Table, peer: Peer | None, work: Path, args: argparse.Namespace) -> None:
    ours_runs, dsh_runs = [], []
    for _ in range(args.runs):
        ours_runs.append(run_child("bench.bench_write", [
            "--backend", "sqlite", "--workload", "msg", "--events", str(args.flush_events),
            "--per-turn", "--dir", str(work)]))
        if peer is not None:
            root = work / "dsh-flush"
            root.mkdir()
            dsh_runs.append(peer.run("bench-x.mjs", "write", "sqlite", str(root / "store.db"),
                                     "msg", str(args.flush_events), "turn"))
            shutil.rmtree(root, ignore_errors=True)
    dsh = (statistics.median(r["flushMedianMs"] for r in dsh_runs) if peer is not None
           else BASELINE_SQLITE_FLUSH_MS)
    table.add(f"one SQLite flush (flush every msg turn, {args.flush_events:,} events)",
              dsh, statistics.median(r["flush_median_ms"] for r in ours_runs), "ms")


def derive_child(surface: int) -> dict[str, Any]:
    from bench.bench_derive import measure

    r = measure(surface)
    return {"first": r[0], "after_append": r[1], "after_append_held": r[8],
            "after_replace": r[3]}


def derive_rows(table: Table, peer: Peer | None, args: argparse.Namespace) -> None:
    ours_runs, dsh_runs = [], []
    for _ in range(args.derive_runs):
        ours_runs.append(run_child("bench.side_by_side", [
            "--derive-surface", str(args.derive_surface)]))
        if peer is not None:
            r = peer.run("bench.mjs", "derive", str(args.derive_surface))
            dsh_runs.append({"first": r["firstDeriveFullMs"],
                             "after_append": r["incrementalDeriveAfter2AppendsMs"],
                             # dsh's bench holds the previous array during each call
                             "after_append_held": r["incrementalDeriveAfter2AppendsMs"],
                             "after_replace": r["deriveAfterReplaceMs"]})
    ours = medians(ours_runs)
    theirs = medians(dsh_runs) if peer is not None else (
        BASELINE_DERIVE_100K if args.derive_surface == 100_000 else {})
    size = f"{args.derive_surface // 1000}k surface"
    for key, label in (("first", "first full"), ("after_append", "after 2 appends"),
                       ("after_append_held", "after 2 appends, last list held"),
                       ("after_replace", "after a replace")):
        table.add(f"derive_messages @{size}, {label}", theirs.get(key), ours[key], "ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000", help="events per session, comma list")
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per side and row")
    parser.add_argument("--backend", default="all", help=f"all or {', '.join(BACKENDS)}")
    parser.add_argument("--workload", default="all", help="all, msg or stream")
    parser.add_argument("--sections", default="all", help=f"all or {', '.join(SECTIONS)}")
    parser.add_argument("--flush-events", type=int, default=10_000,
                        help="events written with a flush after every turn (flush row)")
    parser.add_argument("--derive-surface", type=int, default=100_000,
                        help="surface events of the derive session")
    parser.add_argument("--derive-runs", type=int, default=2, help="fresh processes (derive)")
    parser.add_argument("--node-dir", default=None, help="where setup.sh installed the peer")
    parser.add_argument("--dir", default=None, help="where the temporary stores go")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(derive_child(args.derive_surface)))
        return
    sections = select(args.sections, SECTIONS)
    peer = Peer.find(args.node_dir)
    table = Table()
    work = Path(tempfile.mkdtemp(prefix="dsh-bench-sbs-", dir=args.dir))
    try:
        cold_rows(table, peer, work, args, sections)
        if "flush" in sections:
            flush_row(table, peer, work, args)
        if "derive" in sections:
            derive_rows(table, peer, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    header_lines(f"side by side with dsh (median of {args.runs} fresh processes per side"
                 f"{', interleaved' if peer else ''})")
    if peer is not None:
        print(f"dsh: {peer.version()}, the published packages, run in this same run.\n")
        table.print("same run")
    else:
        print("dsh is not set up here (see ../shared/peers/dsh-node/setup.sh): its column is "
              "dsh-baseline.md (another run); the restart rows use its cold-load figure.\n")
        table.print("dsh-baseline.md")


if __name__ == "__main__":
    sys.exit(main())

"""``dsh ls`` on a store of many small sessions: the real CLI, in a subprocess.

Run: ``python -m bench.bench_ls [--sessions 1000] [--turns 1] [--runs 5] [--backend sqlite|jsonl]
[--dir DIR]``.

The parent creates a SQLite (or JSONL) store holding ``--sessions`` sessions of ``--turns`` msg
turns each
(12 events a turn-1 session: the ``request/header`` and one 11-event turn), written with
``Persistence.create`` + one write handle per session. Then it runs
``[sys.executable, "-m", "dsh.cli", "ls", "--store", URL]`` ``--runs`` times and reports the median
wall time (interpreter start, imports, listing, rendering) and the median peak RSS of the CLI
process (from ``os.wait4``). The same command on an empty store is timed as the fixed cost.
It also times ``Persistence.list_entries()`` (what ``ls`` lists from: the SQLite tables or the
JSONL listing index) in a fresh process without the CLI: **listing ms**. The first ``ls`` of a
JSONL store builds its index (each log read once); the runs after it are the median.
dsh publishes no ``ls`` figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.bench_write import dir_bytes, header_lines
from bench.workloads import build, now_ms


def make_store(url: str, sessions: int, turns: int) -> None:
    """Write ``sessions`` small msg sessions (``turns`` turns each) into the store at ``url``."""
    from dsh.persistence import open_store
    from dsh.session.session import Session

    events = 1 + 11 * turns
    persistence = open_store(url)
    try:
        for i in range(sessions):
            session = Session.create(f"ls-{i:05d}")
            build(session, "msg", events)
            persistence.create(session.header)
            with persistence.open(session.id, "write") as handle:
                handle.append(session.events)
                handle.flush()
    finally:
        persistence.close()


def listing_child(url: str) -> float:
    """In this fresh process: open the store and time ``list_entries()`` (ms)."""
    from dsh.persistence import open_store

    persistence = open_store(url)
    t0 = now_ms()
    _, errors = persistence.list_entries()
    elapsed = now_ms() - t0
    persistence.close()
    if errors:
        raise SystemExit(f"listing {url} failed: {errors[0]}")
    return elapsed


def run_ls(url: str) -> tuple[float, float, int]:
    """Run ``dsh ls --store url`` once; return (wall ms, peak RSS MB, stdout lines).

    Raises:
        SystemExit: the CLI exited non-zero (its stderr is shown).
    """
    with tempfile.TemporaryFile() as err:
        t0 = now_ms()
        proc = subprocess.Popen([sys.executable, "-m", "dsh.cli", "ls", "--store", url],
                                stdout=subprocess.PIPE, stderr=err,
                                env={**os.environ, "COLUMNS": "200"})
        assert proc.stdout is not None
        out = proc.stdout.read()
        # wait4 reaps the child and gives its own rusage (RUSAGE_CHILDREN would be the max
        # over every child so far)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = now_ms() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stdout.close()
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"dsh ls --store {url} failed (exit {proc.returncode}):\n"
                             f"{err.read().decode(errors='replace')}")
    return wall, usage.ru_maxrss / 1024, out.count(b"\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=1, help="msg turns per session")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--backend", default="sqlite", choices=("sqlite", "jsonl"))
    parser.add_argument("--dir", default=None, help="where the temporary store goes")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(listing_child(args.child))
        return
    work = Path(tempfile.mkdtemp(prefix="dsh-bench-ls-", dir=args.dir))
    rows = []
    try:
        for label, count in (("empty store", 0), (f"{args.sessions:,} sessions", args.sessions)):
            folder = work / f"s{count}"
            folder.mkdir()
            url = (f"sqlite://{folder.resolve()}/store.db" if args.backend == "sqlite"
                   else f"jsonl://{folder.resolve()}/store")
            (folder / "store").mkdir()  # JSONL: an empty store is an empty root
            t0 = now_ms()
            make_store(url, count, args.turns)
            setup_ms = now_ms() - t0
            first = run_ls(url)  # JSONL: builds the listing index
            runs = [run_ls(url) for _ in range(args.runs)]
            listing = statistics.median(float(subprocess.run(
                [sys.executable, "-m", "bench.bench_ls", "--child", url], check=True,
                capture_output=True, text=True).stdout) for _ in range(args.runs))
            rows.append((label, setup_ms, dir_bytes(folder),
                         statistics.median(r[0] for r in runs),
                         statistics.median(r[1] for r in runs), runs[0][2], first[0], listing))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    header_lines(f"ls: `python -m dsh.cli ls --store {args.backend}:…` (median of {args.runs} "
                 f"processes), sessions of {1 + 11 * args.turns} events")
    print("| store | store bytes | write the store ms | first ls ms | dsh ls ms "
          "| per session ms | listing ms | peak RSS | output lines | dsh |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = rows[0][3]
    for label, setup_ms, size, wall, rss, lines, first_ms, listing in rows:
        count = args.sessions if label != "empty store" else 0
        per = f"{(wall - base) / count:.3f}" if count else "—"
        print(f"| {label} | {size:,} | {setup_ms:.0f} | {first_ms:.0f} | {wall:.0f} | {per} "
              f"| {listing:.0f} | {rss:.0f} MB | {lines} | n/a |")
    print("\nper session ms: (ls ms - empty-store ls ms) / sessions. Wall time includes the "
          "interpreter start and imports; listing ms is `Persistence.list_entries()` alone. "
          "dsh publishes no ls figure.")


if __name__ == "__main__":
    main()

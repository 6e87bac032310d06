"""``dsh ls`` on a SQLite store of many small sessions: the real CLI, in a subprocess.

Run: ``python -m bench.bench_ls [--sessions 1000] [--turns 1] [--runs 5] [--dir DIR]``.

The parent creates a SQLite store holding ``--sessions`` sessions of ``--turns`` msg turns each
(12 events a turn-1 session: the ``request/header`` and one 11-event turn), written with
``Persistence.create`` + one write handle per session. Then it runs
``[sys.executable, "-m", "dsh.cli", "ls", "--store", URL]`` ``--runs`` times and reports the median
wall time (interpreter start, imports, listing, rendering) and the median peak RSS of the CLI
process (from ``os.wait4``). The same command on an empty store is timed as the fixed cost.
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
    parser.add_argument("--dir", default=None, help="where the temporary store goes")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dsh-bench-ls-", dir=args.dir))
    rows = []
    try:
        for label, count in (("empty store", 0), (f"{args.sessions:,} sessions", args.sessions)):
            folder = work / f"s{count}"
            folder.mkdir()
            url = f"sqlite://{folder.resolve()}/store.db"
            t0 = now_ms()
            make_store(url, count, args.turns)
            setup_ms = now_ms() - t0
            runs = [run_ls(url) for _ in range(args.runs)]
            rows.append((label, setup_ms, dir_bytes(folder),
                         statistics.median(r[0] for r in runs),
                         statistics.median(r[1] for r in runs), runs[0][2]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    header_lines(f"ls: `python -m dsh.cli ls --store sqlite:///…` (median of {args.runs} "
                 f"processes), sessions of {1 + 11 * args.turns} events")
    print("| store | store bytes | write the store ms | dsh ls ms | per session ms | peak RSS "
          "| output lines | dsh |")
    print("|---|---|---|---|---|---|---|---|")
    base = rows[0][3]
    for label, setup_ms, size, wall, rss, lines in rows:
        count = args.sessions if label != "empty store" else 0
        per = f"{(wall - base) / count:.3f}" if count else "—"
        print(f"| {label} | {size:,} | {setup_ms:.0f} | {wall:.0f} | {per} | {rss:.0f} MB "
              f"| {lines} | n/a |")
    print("\nper session ms: (ls ms - empty-store ls ms) / sessions. Wall time includes the "
          "interpreter start and imports. dsh publishes no ls figure.")


if __name__ == "__main__":
    main()

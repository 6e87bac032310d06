"""``dsh ls`` on a store of many small sessions: the real CLI, in fresh subprocesses.

Run: ``python -m bench.bench_ls [--sessions 1000] [--turns 1] [--runs 5]
[--backend sqlite|jsonl|postgresql|both|all] [--server postgresql://…] [--dir DIR]``.

``both`` is SQLite and JSONL, ``all`` adds PostgreSQL (a throw-away schema on ``--server``).
PostgreSQL is also listed once more with every stored entry cleared (``listing`` NULL, as a
store written before migration 6): each log is then read in full, as every PostgreSQL listing
did before the entries were kept.

The parent creates a SQLite and/or JSONL store holding ``--sessions`` sessions of ``--turns``
msg turns each (12 events a turn-1 session: the ``request/header`` and one 11-event turn),
written with ``Persistence.create`` + one write handle per session. Then it runs
``[sys.executable, "-m", "dsh.cli", "ls", "--store", URL]`` ``--runs`` times and reports the median
wall time (interpreter start, imports, listing, rendering, exit), the median CPU time (user +
system: less sensitive than wall to other processes on the cores) and the median peak RSS of the
CLI process (both from ``os.wait4``). The same command on an empty store is timed as the fixed
cost. It also times ``Persistence.list_entries()`` (what ``ls`` lists from: the SQLite tables or
the JSONL listing index) in a fresh process without the CLI: **listing ms**; and, once,
**start + imports**: a fresh process that only imports what ``dsh ls`` imports before it lists
(``dsh.cli._app``, and typer's option parser, which brings pydantic in typer ≥ 0.2x) and exits.
The first ``ls`` of a JSONL store builds its index (each log read once); the runs after it are
the median.

The children keep compiled bytecode as an installed package does: ``PYTHONDONTWRITEBYTECODE``
is dropped from their environment and ``PYTHONPYCACHEPREFIX`` points into the temporary folder
(otherwise every run would compile dsh's sources again, ~0.15 s). dsh publishes no ``ls`` figure.
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
from bench.workloads import build, existing_dir, now_ms


def make_store(url: str, sessions: int, turns: int) -> None:
    """Write ``sessions`` small msg sessions (``turns`` turns each) into the store at ``url``."""
    from dsh.persistence import Persistence, open_backend
    from dsh.session._session import Session

    events = 1 + 11 * turns
    persistence = Persistence(open_backend(url))
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
    from dsh.persistence import Persistence, open_backend

    persistence = Persistence(open_backend(url))
    t0 = now_ms()
    _, errors = persistence.list_entries()
    elapsed = now_ms() - t0
    persistence.close()
    if errors:
        raise SystemExit(f"listing {url} failed: {errors[0]}")
    return elapsed


def child_env(work: Path) -> dict[str, str]:
    """The environment of every timed child: bytecode cached under ``work`` (see the docstring)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(work / "pycache"), "COLUMNS": "200"}


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, float, bytes]:
    """Run ``argv`` once; return (wall ms, CPU ms, peak RSS MB, stdout).

    Raises:
        SystemExit: the child exited non-zero (its stderr is shown).
    """
    with tempfile.TemporaryFile() as err:
        t0 = now_ms()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=env)
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
            raise SystemExit(f"{' '.join(argv)} failed (exit {proc.returncode}):\n"
                             f"{err.read().decode(errors='replace')}")
    return wall, (usage.ru_utime + usage.ru_stime) * 1000, usage.ru_maxrss / 1024, out


def run_ls(url: str, env: dict[str, str]) -> tuple[float, float, float, int]:
    """Run ``dsh ls --store url`` once; return (wall ms, CPU ms, peak RSS MB, stdout lines)."""
    wall, cpu, rss, out = timed([sys.executable, "-m", "dsh.cli", "ls", "--store", url], env)
    return wall, cpu, rss, out.count(b"\n")


# What `dsh ls` imports before it lists: the CLI, and typer's option parser (pydantic, in typer
# >= 0.2x; imported when the first non-flag option is parsed); gc.freeze() in between, as
# dsh.cli._app.main does.
IMPORTS = ("import gc, importlib.util, dsh.cli._app\n"
           "gc.freeze()\n"
           "if importlib.util.find_spec('typer._adapters'):\n"
           "    import typer._adapters")


def _pg_schema(server: str, schemas: list[str]) -> str:
    import uuid

    schemas.append(f"dsh_bench_ls_{uuid.uuid4().hex[:10]}")
    return f"{server}?schema={schemas[-1]}"


def _clear_entries(server: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'UPDATE "{schema}".sessions SET listing = NULL')


def _drop(server: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=1, help="msg turns per session")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--backend", default="sqlite",
                        choices=("sqlite", "jsonl", "postgresql", "both", "all"))
    parser.add_argument("--server", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--dir", type=existing_dir, default=None,
                        help="where the temporary store goes")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(listing_child(args.child))
        return
    backends = {"both": ("sqlite", "jsonl"), "all": ("sqlite", "jsonl", "postgresql")}.get(
        args.backend, (args.backend,))
    work = Path(tempfile.mkdtemp(prefix="dsh-bench-ls-", dir=args.dir))
    schemas: list[str] = []
    env = child_env(work)
    rows = []
    try:
        for backend in backends:
            cases = [("empty store", 0), (f"{args.sessions:,} sessions", args.sessions)]
            if backend == "postgresql":
                cases.append((f"{args.sessions:,} sessions, entries cleared (read in full)",
                              args.sessions))
            for label, count in cases:
                folder = work / f"{backend}-{len(rows)}"
                folder.mkdir()
                url = (f"sqlite://{folder.resolve()}/store.db" if backend == "sqlite"
                       else f"jsonl://{folder.resolve()}/store" if backend == "jsonl"
                       else _pg_schema(args.server, schemas))
                (folder / "store").mkdir()  # JSONL: an empty store is an empty root
                t0 = now_ms()
                make_store(url, count, args.turns)
                setup_ms = now_ms() - t0
                if "cleared" in label:
                    _clear_entries(args.server, schemas[-1])
                first = run_ls(url, env)  # JSONL: builds the listing index; compiles bytecode
                runs = [run_ls(url, env) for _ in range(args.runs)]
                listing = statistics.median(float(subprocess.run(
                    [sys.executable, "-m", "bench.bench_ls", "--child", url], check=True,
                    capture_output=True, text=True, env=env).stdout) for _ in range(args.runs))
                rows.append((backend, count, label, setup_ms, dir_bytes(folder),
                             statistics.median(r[0] for r in runs),
                             statistics.median(r[1] for r in runs),
                             statistics.median(r[2] for r in runs), runs[0][3], first[0],
                             listing))
        imports = [timed([sys.executable, "-c", IMPORTS], env) for _ in range(args.runs)]
        bare = [timed([sys.executable, "-c", "pass"], env) for _ in range(args.runs)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for schema in schemas:
            _drop(args.server, schema)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    header_lines(f"ls: `python -m dsh.cli ls --store {'|'.join(backends)}:…` (median of "
                 f"{args.runs} processes), sessions of {1 + 11 * args.turns} events")
    print(f"load average at the end: {load}\n")
    print("| backend | store | store bytes | write the store ms | first ls ms | dsh ls ms "
          "| CPU ms | per session ms | listing ms | peak RSS | output lines | dsh |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    base: dict[str, float] = {}
    for backend, count, label, setup_ms, size, wall, cpu, rss, lines, first_ms, listing in rows:
        if not count:
            base[backend] = wall
        if backend == "postgresql":
            size = 0  # in the server, not the folder
        per = f"{(wall - base[backend]) / count:.3f}" if count else "—"
        print(f"| {backend} | {label} | {size:,} | {setup_ms:.0f} | {first_ms:.0f} | {wall:.0f} "
              f"| {cpu:.0f} | {per} | {listing:.0f} | {rss:.0f} MB | {lines} | n/a |")
    start_ms = statistics.median(r[0] for r in imports)
    start_cpu = statistics.median(r[1] for r in imports)
    bare_ms = statistics.median(r[0] for r in bare)
    print(f"\nstart + imports (a fresh process importing what `dsh ls` imports, then exiting): "
          f"{start_ms:.0f} ms wall, {start_cpu:.0f} ms CPU (a bare `python -c pass`: "
          f"{bare_ms:.0f} ms).")
    for backend, count, label, _, _, wall, _, _, _, _, _ in rows:
        if count and "cleared" not in label:
            print(f"{backend}: start + imports are {100 * start_ms / wall:.0f}% of the "
                  f"{count:,}-session ls ({wall:.0f} ms).")
    print("\nper session ms: (ls ms - empty-store ls ms) / sessions. Wall time includes the "
          "interpreter start, imports and exit; listing ms is `Persistence.list_entries()` "
          "alone. dsh publishes no ls figure.")


if __name__ == "__main__":
    main()

"""`dsh import` of a big Claude Code transcript, two source trees side by side; rows compared.

Runs ``dsh import`` of a synthetic Claude Code transcript of ``--mb`` MB (``bench.bench_import``'s
lines, as ``bench.bench_cli`` writes it) into a fresh SQLite store, in fresh processes with
``PYTHONPATH`` set to each ``--src`` tree in turn (alternated, so load drifts reach both alike),
and prints per tree the median wall time, MB/s, median CPU (user+sys of the child) and the
highest peak RSS (``VmHWM``). A ``--src`` may end in ``@SECONDS``: the import then runs with
``sys.setswitchinterval(SECONDS)`` (how long a thread keeps the GIL while another waits). With
``--priority`` each import runs in a session of its own whose autogroup has nice -19 (needs
root), so that on a loaded machine its wall time tracks its CPU and I/O wait.

With ``--rows PATH...`` it instead imports those files or folders with each tree into fresh
SQLite and JSONL stores and compares every stored row: each SQLite table (the sessions'
random ``incarnation``, the store's random id and the store log's times masked) and each JSONL
file's bytes (the store log's times masked; seal files, which hold random batch keys, left
out), and the ``--json`` reports. It exits 1 when anything differs.

    python -m bench.bench_import_cli --src OLD/src --src NEW/src [--mb 44] [--runs 5] [--dir D]
    python -m bench.bench_import_cli --src OLD/src --src NEW/src --rows PATH [PATH ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any

_TIMES = re.compile(rb'"(time|at|atMs|since|createdAt)":\d+')


def _env(src: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": src, "NO_COLOR": "1", "COLUMNS": "120"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _own_autogroup() -> None:
    """In the child: a session of its own whose autogroup and process run at nice -19."""
    os.setsid()
    with open("/proc/self/autogroup", "w") as group:
        group.write("-19")
    os.nice(-19)


def import_once(spec: str, path: Path, store: Path, *, priority: bool = False
                ) -> tuple[float, float, float]:
    """One fresh ``dsh import PATH`` into a new SQLite store: (wall s, CPU s, peak RSS MB)."""
    src, _, switch = spec.partition("@")
    from bench.bench_cli import _PEAK  # the child that reports its peak RSS at exit

    code = (f"import sys; sys.setswitchinterval({float(switch)})\n" if switch else "") + _PEAK
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, "import", str(path), "--store",
                             f"sqlite:{store / 'store.db'}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=_env(src), text=True,
                            preexec_fn=_own_autogroup if priority else None)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = 0
    assert status == 0, err[-2000:]
    peak = next(int(line.split()[1]) for line in err.splitlines() if line.startswith("PEAK "))
    return wall, usage.ru_utime + usage.ru_stime, peak / 1024


def throughput(srcs: list[str], mb: float, runs: int, where: str | None = None, *,
               priority: bool = False) -> None:
    """Print the median wall, MB/s, CPU and peak RSS of each tree's imports, alternated."""
    from bench.bench_import import write_claude_code

    with tempfile.TemporaryDirectory(dir=where) as tmp:
        folder = Path(tmp)
        path = folder / "5e551011-0000-4000-8000-00000000beef.jsonl"
        write_claude_code(path, max(1, int(mb * 1e6 / 3735)))  # ~3.7 kB of JSONL a turn
        size = path.stat().st_size / 1e6
        results: dict[str, list[tuple[float, float, float]]] = {s: [] for s in srcs}
        loads = [os.getloadavg()[0]]
        for _ in range(runs):
            for i, src in enumerate(srcs):
                results[src].append(import_once(src, path, folder / f"store{i}",
                                                priority=priority))
            loads.append(os.getloadavg()[0])
    print(f"# dsh import of a {size:.1f} MB Claude Code transcript into SQLite, medians of "
          f"{runs} alternated; load {min(loads):.1f}-{max(loads):.1f} (1 min)"
          + ("; each run in an autogroup of its own at nice -19" if priority else ""))
    print("| tree | wall s | MB/s | CPU s | peak RSS MB |")
    print("|---|---:|---:|---:|---:|")
    for src, got in results.items():
        wall = statistics.median(r[0] for r in got)
        print(f"| {src} | {wall:.2f} | {size / wall:.1f} | "
              f"{statistics.median(r[1] for r in got):.2f} | {max(r[2] for r in got):.0f} |")


def _sqlite_rows(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    out: dict[str, list[tuple[Any, ...]]] = {}
    with closing(sqlite3.connect(db)) as conn:
        tables = [t for (t,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        for table in tables:
            columns = [row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')]
            rows = []
            for found in conn.execute(f'SELECT * FROM "{table}" ORDER BY 1, 2'
                                      if len(columns) > 1 else f'SELECT * FROM "{table}"'):
                row = list(found)
                if table == "persistence_state":
                    row[1] = "*"  # the store's random id
                if table == "sessions":
                    row[columns.index("incarnation")] = "*"
                    if row[0].startswith(".dsh-"):
                        row[columns.index("created_at")] = "*"
                if table == "events" and row[0].startswith(".dsh-"):  # the store log's times
                    row[columns.index("time")] = "*"
                    data = row[columns.index("data")]
                    if isinstance(data, str):
                        row[columns.index("data")] = _TIMES.sub(
                            rb'"\1":*', data.encode()).decode()
                rows.append(tuple(row))
            out[table] = rows
    return out


def _jsonl_files(root: Path) -> dict[str, bytes]:
    out = {}
    for path in sorted(root.rglob("*")):
        relative = str(path.relative_to(root))
        if not path.is_file() or path.name.endswith(".seal") or (
                ".dsh-" in relative and not relative.startswith(".dsh-store-log/")):
            continue
        data = path.read_bytes()
        out[relative] = _TIMES.sub(rb'"\1":*', data) if relative.startswith(".dsh-") else data
    return out


def same_rows(srcs: list[str], paths: list[str], where: str | None = None) -> bool:
    """Import ``paths`` with each tree into SQLite and JSONL; print and return whether equal."""
    equal = True
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        for kind in ("sqlite", "jsonl"):
            got = []
            for i, src in enumerate(srcs):
                folder = Path(tmp) / f"{kind}{i}"
                folder.mkdir()
                url = f"sqlite:{folder / 'store.db'}" if kind == "sqlite" \
                    else f"jsonl:{folder / 'root'}"
                done = subprocess.run([sys.executable, "-m", "dsh.cli", "import", *paths,
                                       "--store", url, "--json"], capture_output=True,
                                      text=True, env=_env(src.partition("@")[0]), check=False)
                report = json.loads(done.stdout) if done.stdout.strip() else done.stderr
                stored: Any = (_sqlite_rows(folder / "store.db") if kind == "sqlite"
                               else _jsonl_files(folder / "root"))
                got.append((done.returncode, report, stored))
            first = got[0]
            rows = (sum(len(v) for v in first[2].values()) if kind == "sqlite"
                    else len(first[2]))
            same = all(other == first for other in got[1:])
            equal &= same
            print(f"{kind}: exit {[g[0] for g in got]}, {rows} "
                  f"{'rows' if kind == 'sqlite' else 'files'}: "
                  f"{'identical' if same else 'DIFFERENT'}")
            if not same:
                for other in got[1:]:
                    for key in sorted(set(first[2]) | set(other[2])):
                        if first[2].get(key) != other[2].get(key):
                            print(f"  differs: {key}")
    return equal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", action="append", required=True)
    parser.add_argument("--mb", type=float, default=44.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rows", nargs="+", metavar="PATH")
    parser.add_argument("--dir", help="where the temporary files go (removed at the end)")
    parser.add_argument("--priority", action="store_true",
                        help="run each import in a session of its own whose autogroup has nice "
                             "-19 (root), so wall time means something on a loaded machine")
    args = parser.parse_args()
    if args.rows:
        sys.exit(0 if same_rows(args.src, args.rows, args.dir) else 1)
    throughput(args.src, args.mb, args.runs, args.dir, priority=args.priority)


if __name__ == "__main__":
    main()

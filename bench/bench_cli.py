"""The `dsh` command on big data: first output of `dsh show`, `--last 50`, import, search.

For uncompacted msg sessions of 10k, 100k and 300k events (written through a SQLite store, so
the writer keeps restore points), this starts the real ``dsh show`` and times the first line on
its stdout (the process is then stopped, as ``| head`` would), the whole of ``dsh show --last
50``, and ``dsh --version`` (the interpreter and import floor every command pays). It imports a
synthetic Claude Code transcript of ``--import-mb`` MB (lines shaped like the corpus's, see
``bench.bench_import``) with ``dsh import`` and reports MB/s and the peak RSS of that process
(VmHWM read in the process at exit), and times ``Store.search`` over ``--sessions`` small
sessions: the first search (which builds the index) and the next ones.

    python -m bench.bench_cli [--sizes 10000,100000,300000] [--import-mb 44] [--sessions 10000]
                              [--runs 3] [--dir DIR]

Built stores are cached under bench/out/cli-cache (delete it to rebuild); with ``--dir DIR``
they are built under DIR and removed at the end. dsh publishes no
figure for any of these rows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_view import build_many, build_session
from bench.workloads import machine

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "bench" / "out" / "cli-cache"
_CACHE_VERSION = 1
_ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "120"}


def _cached(cache: Path, kind: str, size: int) -> str:
    root = cache / f"v{_CACHE_VERSION}-{kind}-{size}"
    url = f"sqlite:{root / 'store.db'}"
    if not (root / "done").exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        t0 = time.monotonic()
        (build_session if kind == "session" else build_many)(url, size)
        print(f"  built {kind} {size:,} in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        (root / "done").write_text("1")
    return url


def first_line_ms(args: list[str]) -> float:
    """Milliseconds from starting ``python -m dsh.cli ARGS`` to its first stdout line."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "dsh.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=_ENV)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    ms = (time.perf_counter() - t0) * 1000
    proc.stdout.close()  # what `| head -1` does: the command stops at its next write
    proc.wait(timeout=600)
    assert line, f"no output from dsh {' '.join(args)}"
    return ms


def whole_ms(args: list[str]) -> float:
    """Milliseconds of the whole ``python -m dsh.cli ARGS`` run (output discarded)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dsh.cli", *args], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env=_ENV, check=True)
    return (time.perf_counter() - t0) * 1000


_PEAK = ("import atexit, sys\n"
         "def peak():\n"
         "    for line in open('/proc/self/status'):\n"
         "        if line.startswith('VmHWM:'):\n"
         "            sys.stderr.write('PEAK ' + line.split()[1] + '\\n')\n"
         "atexit.register(peak)\n"
         "from dsh.cli import main\n"
         "main(sys.argv[1:])\n")


def import_run(path: Path, store: Path) -> dict[str, float]:
    """`dsh import PATH` into a fresh SQLite store: seconds, MB/s and peak RSS (MB)."""
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _PEAK, "import", str(path), "--store",
                           f"sqlite:{store / 'store.db'}"], capture_output=True, text=True,
                          env=_ENV, check=True)
    seconds = time.perf_counter() - t0
    peak = next(int(line.split()[1]) for line in done.stderr.splitlines()
                if line.startswith("PEAK "))
    mb = path.stat().st_size / 1e6
    return {"mb": mb, "s": seconds, "mb_s": mb / seconds, "peak_mb": peak / 1024}


def search_runs(url: str, runs: int) -> dict[str, float]:
    """``Store.search`` over a store: the first (index built), then warm (median)."""
    import dsh

    index = Path(url.removeprefix("sqlite:") + ".dsh-search.db")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{index}{suffix}").unlink(missing_ok=True)
    with dsh.open(url) as store:
        t0 = time.perf_counter()
        first = store.search("request flows")
        cold = (time.perf_counter() - t0) * 1000
        warm = []
        for _ in range(runs):
            t0 = time.perf_counter()
            again = store.search("route handler")
            warm.append((time.perf_counter() - t0) * 1000)
    assert first.hits and again.reindexed == 0
    return {"cold_ms": cold, "warm_ms": statistics.median(warm), "sessions": first.sessions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000,300000")
    parser.add_argument("--import-mb", type=float, default=44.0)
    parser.add_argument("--sessions", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None,
                        help="Build the stores under DIR and remove them at the end.")
    args = parser.parse_args()
    if args.dir is None:
        _run(args, CACHE)
        return
    cache = args.dir / "cli-cache"
    try:
        _run(args, cache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _run(args: argparse.Namespace, cache: Path) -> None:
    sizes = [int(s) for s in args.sizes.split(",") if s]
    print(f"# bench_cli — {machine()}")
    print(f"# load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f} (1/5/15 min)")
    floor = statistics.median(whole_ms(["--version"]) for _ in range(args.runs))
    print(f"dsh --version (interpreter + imports): {floor:.0f} ms")
    print("| events | dsh show: first line | dsh show --last 50 |")
    print("|---:|---:|---:|")
    for size in sizes:
        url = _cached(cache, "session", size)
        first = statistics.median(first_line_ms(["show", "bench", "--store", url])
                                  for _ in range(args.runs))
        last = statistics.median(whole_ms(["show", "bench", "--store", url, "--last", "50"])
                                 for _ in range(args.runs))
        print(f"| {size:,} | {first:.0f} ms | {last:.0f} ms |")
    if args.import_mb > 0:
        from bench.bench_import import write_claude_code

        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            path = folder / "5e551011-0000-4000-8000-00000000beef.jsonl"
            turns = max(1, int(args.import_mb * 1e6 / 3735))  # ~3.7 kB of JSONL a turn
            write_claude_code(path, turns)
            result: dict[str, Any] = import_run(path, folder / "store")
        print(f"dsh import of a {result['mb']:.1f} MB Claude Code transcript: "
              f"{result['s']:.1f} s, {result['mb_s']:.2f} MB/s, "
              f"peak RSS {result['peak_mb']:.0f} MB")
    if args.sessions > 0:
        url = _cached(cache, "many", args.sessions)
        found = search_runs(url, args.runs)
        print(f"search over {found['sessions']:,.0f} sessions: first (builds the index) "
              f"{found['cold_ms']:.0f} ms, then {found['warm_ms']:.1f} ms")


if __name__ == "__main__":
    main()

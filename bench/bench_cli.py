"""The `dsh` command on big data: first output of `dsh show`, `--last 50`, import, search.

For uncompacted msg sessions of 10k, 100k and 300k events (written through a SQLite store, so
the writer keeps restore points), this starts the real ``dsh show`` and times the first line on
its stdout (the process is then stopped, as ``| head`` would), the whole of ``dsh show --last
50``, and ``dsh --version`` (the interpreter and import floor every command pays). It imports a
synthetic Claude Code transcript of ``--import-mb`` MB (lines shaped like the corpus's, see
``bench.bench_import``) with ``dsh import`` and reports MB/s and the peak RSS of that process
(VmHWM read in the process at exit), with the seconds its threads ran and the seconds it was
blocked (wall less running and waiting for a CPU, from schedstat), and times ``Store.search``
over ``--sessions`` small sessions: the first search (which builds the index) and the next ones,
on each store of
``--search-backends`` (SQLite: FTS5 beside the database; JSONL: FTS5 beside the root, kept at
flush; PostgreSQL: full-text tables in the store's schema). With ``--search-events N`` the
stores are instead ``--sessions`` sessions holding N events in all, written through the
backends' write handles by ``bench.search_store`` (cached under /tmp/dsh-search-store), and
four queries (common, rare, unique, none) are timed in fresh processes and warm.

    python -m bench.bench_cli [--sizes 10000,100000,300000] [--import-mb 44] [--sessions 10000]
                              [--search-backends sqlite,jsonl,postgresql]
                              [--search-events 10000000] [--runs 3] [--dir DIR]

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

from bench import bench_view
from bench.bench_view import build_many, build_session, cached
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


def first_line_ms(args: list[str], lines: int = 1) -> float:
    """Milliseconds from starting ``python -m dsh.cli ARGS`` to its first LINES stdout lines.

    ``lines=50`` is a terminal's first screen: what ``| head -50`` waits for.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "dsh.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=_ENV)
    assert proc.stdout is not None
    got = [proc.stdout.readline() for _ in range(lines)]
    ms = (time.perf_counter() - t0) * 1000
    proc.stdout.close()  # what `| head` does: the command stops at its next write
    proc.wait(timeout=600)
    assert all(got), f"fewer than {lines} lines from dsh {' '.join(args)}"
    return ms


def whole_ms(args: list[str]) -> float:
    """Milliseconds of the whole ``python -m dsh.cli ARGS`` run (output discarded)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dsh.cli", *args], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env=_ENV, check=True)
    return (time.perf_counter() - t0) * 1000


_PEAK = ("import atexit, os, sys\n"
         "def peak():\n"
         "    for line in open('/proc/self/status'):\n"
         "        if line.startswith('VmHWM:'):\n"
         "            sys.stderr.write('PEAK ' + line.split()[1] + '\\n')\n"
         # on CPU and waiting for a CPU, ns, summed over the threads (schedstat; absent: none)
         "    try:\n"
         "        ran = [open(f'/proc/self/task/{t}/schedstat').read().split()[:2]\n"
         "               for t in os.listdir('/proc/self/task')]\n"
         "        sys.stderr.write('SCHED %d %d\\n' % (sum(int(r) for r, _ in ran),\n"
         "                                              sum(int(w) for _, w in ran)))\n"
         "    except (OSError, ValueError):\n"
         "        pass\n"
         "atexit.register(peak)\n"
         "from dsh.cli import main\n"
         "main(sys.argv[1:])\n")


def import_run(path: Path, store: Path) -> dict[str, float]:
    """`dsh import PATH` into a fresh SQLite store: seconds, MB/s and peak RSS (MB).

    Where the kernel keeps schedstat, also ``cpu`` (seconds the process's threads ran) and
    ``blocked`` (the wall left after running and waiting for a CPU: disk syncs, reads, other
    sleeps), so a run tells whether the import waits on I/O or computes.
    """
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
    result = {"mb": mb, "s": seconds, "mb_s": mb / seconds, "peak_mb": peak / 1024}
    for line in done.stderr.splitlines():
        if line.startswith("SCHED "):
            ran, waited = (int(n) / 1e9 for n in line.split()[1:3])
            result.update(cpu=ran, blocked=max(0.0, seconds - ran - waited))
    return result


def _index_path(url: str) -> Path | None:
    """The search sidecar of a SQLite or JSONL store (None: PostgreSQL keeps its own tables)."""
    if url.startswith("sqlite:"):
        return Path(url.removeprefix("sqlite:") + ".dsh-search.db")
    if url.startswith("jsonl:"):
        return Path(url.removeprefix("jsonl:")) / ".dsh-search.db"
    return None


def _warm(url: str, runs: int) -> tuple[float, Any]:
    import dsh

    warm = []
    with dsh.open(url) as store:
        for _ in range(runs):
            t0 = time.perf_counter()
            again = store.search("route handler")
            warm.append((time.perf_counter() - t0) * 1000)
    return statistics.median(warm), again


def search_runs(url: str, runs: int, *, keep_index: bool = False) -> dict[str, float]:
    """``Store.search`` over a store: the first (index brought up to date), then warm (median).

    The first search of SQLite and PostgreSQL stores builds the index (it is dropped first
    unless ``keep_index``); a JSONL store's writers kept it at flush, so it is kept.
    """
    import dsh

    index = _index_path(url)
    if index is not None and url.startswith("sqlite:") and not keep_index:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{index}{suffix}").unlink(missing_ok=True)
    with dsh.open(url) as store:
        t0 = time.perf_counter()
        first = store.search("request flows")
        cold = (time.perf_counter() - t0) * 1000
    warm, again = _warm(url, runs)
    assert first.hits and again.reindexed == 0
    return {"cold_ms": cold, "warm_ms": warm, "sessions": first.sessions}


SEARCH_QUERIES = (("common", "route handler"), ("rare", "kestrel"), ("unique", "t04242"),
                  ("none", "zanzibar"))
"""The queries timed over a built store (see ``bench.search_store``): about one message in
four, one session in ten, one session, none."""

_FRESH = ("import sys, time, dsh\n"
          "store = dsh.open(sys.argv[1])\n"
          "t0 = time.perf_counter()\n"
          "found = store.search(sys.argv[2])\n"
          "ms = (time.perf_counter() - t0) * 1000\n"
          "store.close()\n"
          "print(f'{ms:.3f} {len(found.hits)} {found.reindexed}')\n")


def big_search_rows(url: str, runs: int) -> list[dict[str, Any]]:
    """Each query of :data:`SEARCH_QUERIES` over a built store: ``Store.search`` in a fresh
    process (median of ``runs``; the store opened before the clock starts), then warm in one
    process (median of ``runs`` after one search)."""
    import dsh

    rows = []
    for label, query in SEARCH_QUERIES:
        fresh, hits = [], 0
        for _ in range(runs):
            out = subprocess.run([sys.executable, "-c", _FRESH, url, query], capture_output=True,
                                 text=True, env=_ENV, check=True).stdout.split()
            fresh.append(float(out[0]))
            hits = int(out[1])
            assert out[2] == "0", f"the index was not up to date ({out[2]} sessions read)"
        warm = []
        with dsh.open(url) as store:
            store.search(query)
            for _ in range(runs):
                t0 = time.perf_counter()
                store.search(query)
                warm.append((time.perf_counter() - t0) * 1000)
        rows.append({"label": label, "query": query, "hits": hits,
                     "fresh_ms": statistics.median(fresh), "warm_ms": statistics.median(warm)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000,300000")
    parser.add_argument("--import-mb", type=float, default=44.0)
    parser.add_argument("--sessions", type=int, default=10000)
    parser.add_argument("--search-backends", default="sqlite",
                        help="comma-separated: sqlite, jsonl, postgresql")
    parser.add_argument("--schema-prefix", default="dsh_bench_cli_",
                        help="prefix of the PostgreSQL store's schema name")
    parser.add_argument("--search-events", type=int, default=0,
                        help="search a store of --sessions sessions holding this many events "
                             "in all (bench.search_store, cached under /tmp/dsh-search-store)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None,
                        help="Build the stores under DIR and remove them at the end.")
    args = parser.parse_args()
    bench_view.SCHEMA_PREFIX = args.schema_prefix
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
    if sizes:
        print("| events | dsh show: first line | first screen (50 lines) | dsh show --last 50 |")
        print("|---:|---:|---:|---:|")
    for size in sizes:
        url = _cached(cache, "session", size)
        first = statistics.median(first_line_ms(["show", "bench", "--store", url])
                                  for _ in range(args.runs))
        screen = statistics.median(first_line_ms(["show", "bench", "--store", url], 50)
                                   for _ in range(args.runs))
        last = statistics.median(whole_ms(["show", "bench", "--store", url, "--last", "50"])
                                 for _ in range(args.runs))
        print(f"| {size:,} | {first:.0f} ms | {screen:.0f} ms | {last:.0f} ms |")
    if args.import_mb > 0:
        from bench.bench_import import write_claude_code

        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            path = folder / "5e551011-0000-4000-8000-00000000beef.jsonl"
            turns = max(1, int(args.import_mb * 1e6 / 3735))  # ~3.7 kB of JSONL a turn
            write_claude_code(path, turns)
            result: dict[str, Any] = import_run(path, folder / "store")
        split = (f" ({result['cpu']:.2f} s on CPU, {result['blocked']:.2f} s blocked)"
                 if "cpu" in result else "")
        print(f"dsh import of a {result['mb']:.1f} MB Claude Code transcript: "
              f"{result['s']:.1f} s{split}, {result['mb_s']:.2f} MB/s, "
              f"peak RSS {result['peak_mb']:.0f} MB")
    if args.sessions > 0 and args.search_events > 0:
        from bench import search_store

        per = max(1, args.search_events // args.sessions)
        where = search_store.CACHE if cache == CACHE else cache  # --dir: built there
        for backend in args.search_backends.split(","):
            url = search_store.build(backend, args.sessions, per, where)
            print(f"# {backend}: {args.sessions:,} sessions x {per:,} events: "
                  f"{search_store.built_note(backend, args.sessions, per, where)}")
            print(f"| {backend} query | hits | Store.search, fresh process | warm |")
            print("|---|---:|---:|---:|")
            for row in big_search_rows(url, args.runs):
                print(f"| {row['label']} `{row['query']}` | {row['hits']} | "
                      f"{row['fresh_ms']:.1f} ms | {row['warm_ms']:.1f} ms |")
    elif args.sessions > 0:
        for backend in args.search_backends.split(","):
            url = _cached(cache, "many", args.sessions) if backend == "sqlite" else cached(
                cache, "many", backend, args.sessions)
            found = search_runs(url, args.runs)
            print(f"search over {found['sessions']:,.0f} sessions, {backend}: first (brings "
                  f"the index up to date) {found['cold_ms']:.0f} ms, then "
                  f"{found['warm_ms']:.1f} ms")


if __name__ == "__main__":
    main()

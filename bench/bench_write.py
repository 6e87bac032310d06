"""Workloads 3 and 4 (write): append N events with a persistence backend attached.

Run: ``python -m bench.bench_write [--events 100000] [--runs 5] [--backend all|jsonl-packed|
jsonl-unpacked|jsonl-zstd|sqlite] [--workload all|msg|stream] [--per-turn] [--dir DIR]``.

* default (workload 3): a ``SessionStore`` bound to ``dsh.open(url)`` creates the session, the
  workload appends N events (write-behind runs in its thread meanwhile), then one
  ``store.flush``. Reports append ms, append+flush ms, events/s (N / append+flush), bytes on
  disk after ``Persistence.close`` and the process's peak RSS.
* ``--per-turn`` (workload 4): ``store.flush`` after every ``turn/end``. Reports the total, events/s
  and the cost of one flush (median and p95 of the per-turn flush times).

Every measured run is a fresh process writing into a fresh directory; the table shows medians.
The shared helpers here (backends, child runner, versions) are used by the other bench scripts.
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.workloads import (
    build,
    machine,
    msg_turn,
    now_ms,
    peak_rss_mb,
    ratio,
    start,
    stream_turn,
)

# name -> (label in tables, URL template; {root} is an absolute directory)
BACKENDS: dict[str, tuple[str, str]] = {
    "jsonl-packed": ("JSONL packed", "jsonl://{root}/store"),
    "jsonl-unpacked": ("JSONL unpacked", "jsonl://{root}/store?pack_chunks=false"),
    "jsonl-zstd": ("JSONL zstd", "jsonl+zstd://{root}/store"),
    "sqlite": ("SQLite", "sqlite://{root}/store.db"),
}
WORKLOADS = ("msg", "stream")

# dsh-baseline.md §3: (append ms, append+flush ms, events/s, bytes on disk, peak RSS MB)
DSH_WRITE: dict[tuple[str, str], tuple[float, float, float, int, float]] = {
    ("jsonl-packed", "msg"): (1869, 2035, 49_100, 22_046_396, 378),
    ("jsonl-packed", "stream"): (1345, 1465, 68_300, 5_309_774, 284),
    ("jsonl-unpacked", "msg"): (1780, 2125, 47_100, 22_046_396, 377),
    ("jsonl-unpacked", "stream"): (1353, 1521, 65_800, 15_831_939, 316),
    ("jsonl-zstd", "msg"): (1801, 2063, 48_500, 1_829_971, 380),
    ("jsonl-zstd", "stream"): (1363, 1504, 66_500, 315_011, 286),
    ("sqlite", "msg"): (1779, 2111, 47_400, 21_860_352, 312),
    ("sqlite", "stream"): (1348, 1667, 60_000, 15_679_488, 275),
}
# dsh-baseline.md §4 (median of 3; dsh reports one "JSONL" row): (total s, events/s, flush ms)
DSH_PER_TURN: dict[tuple[str, str], tuple[float, float, float | None]] = {
    ("jsonl", "msg"): (7.53, 13_300, 0.8),
    ("jsonl", "stream"): (2.83, 35_300, None),
    ("sqlite", "msg"): (4.91, 20_400, 0.5),
    ("sqlite", "stream"): (2.33, 42_900, None),
}
# peers-baseline.md: OpenAI Agents SDK SQLiteSession, ms per 4-item turn commit
PEERS_TURN_COMMIT_MS = 0.38


# --- helpers shared by the bench scripts ----------------------------------------------------


def store_url(backend: str, root: Path) -> str:
    """The store URL of ``backend`` rooted in the absolute directory ``root``."""
    return BACKENDS[backend][1].format(root=root.resolve())


def dir_bytes(root: Path) -> int:
    """Total size in bytes of every file under ``root`` (logs, databases, WAL, lock files)."""
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            total += os.path.getsize(os.path.join(dirpath, name))
    return total


def select(value: str, choices: Sequence[str]) -> list[str]:
    """``"all"`` -> every choice; otherwise the comma-separated names, checked."""
    if value == "all":
        return list(choices)
    names = value.split(",")
    unknown = [n for n in names if n not in choices]
    if unknown:
        raise SystemExit(f"unknown name(s) {unknown}; expected all or {', '.join(choices)}")
    return names


def run_child(module: str, args: Sequence[str]) -> dict[str, Any]:
    """Run ``python -m <module> --child <args>`` in a fresh process; return its JSON line."""
    proc = subprocess.run([sys.executable, "-m", module, "--child", *args],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"child {module} {' '.join(args)} failed (exit {proc.returncode}):\n"
                         f"{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def medians(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Key-wise median of the numeric fields of several child results."""
    return {key: statistics.median(float(r[key]) for r in runs)
            for key, value in runs[0].items() if isinstance(value, int | float)}


def versions() -> str:
    """One line with the versions of the dependencies the benches exercise."""
    import sqlite3
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for dist in ("dsh-session", "orjson", "zstandard", "filelock"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} (not installed)")
    parts.append(f"SQLite {sqlite3.sqlite_version}")
    return ", ".join(parts)


def header_lines(title: str) -> None:
    """Print the bench title, the machine line and the versions line."""
    print(f"# {title}")
    print(f"{machine()}; {versions()}")
    print()


def fmt_rate(rate: float) -> str:
    """Events/s as ``49.1k``."""
    return f"{rate / 1000:.1f}k"


def write_session(url: str, workload: str, events: int, session_id: str = "bench",
                  *, per_turn: bool = False) -> dict[str, Any]:
    """Write one workload session through ``SessionStore`` + ``dsh.open(url)``.

    Returns timings in ms (``append_ms``, ``total_ms``), ``events`` and, with ``per_turn``,
    the list ``flush_ms`` of every per-turn flush. The store is closed before returning.
    """
    from dsh.persistence import Persistence, open_backend
    from dsh.session._store import SessionStore

    persistence = Persistence(open_backend(url))
    store = SessionStore(persistence=persistence)
    session = store.create(session_id)
    flush_ms: list[float] = []
    t0 = now_ms()
    if per_turn:
        turn_fn: Callable[[Any, int], None] = msg_turn if workload == "msg" else stream_turn
        start(session)
        turn = 0
        while session.seq < events:
            turn += 1
            turn_fn(session, turn)
            f0 = now_ms()
            store.flush(session)
            flush_ms.append(now_ms() - f0)
        append_ms = total_ms = now_ms() - t0
    else:
        build(session, workload, events)
        append_ms = now_ms() - t0
        store.flush(session)
        total_ms = now_ms() - t0
    count = session.seq
    persistence.close()
    return {"events": count, "append_ms": append_ms, "total_ms": total_ms, "flush_ms": flush_ms}


# --- this bench ------------------------------------------------------------------------------


def child(backend: str, workload: str, events: int, per_turn: bool, parent_dir: str | None
          ) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="dsh-bench-write-", dir=parent_dir))
    try:
        out = write_session(store_url(backend, root), workload, events, per_turn=per_turn)
        flushes = sorted(out.pop("flush_ms"))
        if flushes:
            out["flush_median_ms"] = statistics.median(flushes)
            out["flush_p95_ms"] = flushes[min(len(flushes) - 1, int(len(flushes) * 0.95))]
        out["bytes"] = dir_bytes(root)
        out["rate"] = out["events"] / (out["total_ms"] / 1000)
        out["rss"] = peak_rss_mb()
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def print_write(rows: list[tuple[str, str, dict[str, float]]], events: int, runs: int) -> None:
    header_lines(f"write: append {events:,} events + one flush (median of {runs} processes)")
    print("| backend | workload | append ms | append+flush ms | events/s | bytes on disk "
          "| peak RSS | dsh append+flush ms | dsh events/s | dsh bytes | dsh RSS "
          "| events/s vs dsh | RSS vs dsh |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for backend, workload, r in rows:
        d = DSH_WRITE[(backend, workload)]
        print(f"| {BACKENDS[backend][0]} | {workload} | {r['append_ms']:.0f} "
              f"| {r['total_ms']:.0f} | {fmt_rate(r['rate'])} | {r['bytes']:,.0f} "
              f"| {r['rss']:.0f} MB | {d[1]:.0f} | {fmt_rate(d[2])} | {d[3]:,} | {d[4]:.0f} MB "
              f"| {ratio(r['rate'], d[2], higher_is_better=True)} "
              f"| {ratio(r['rss'], d[4], higher_is_better=False)} |")
    if events != 100_000:
        print(f"\nNote: dsh's figures are for 100,000 events; this run wrote {events:,}.")


def print_per_turn(rows: list[tuple[str, str, dict[str, float]]], events: int, runs: int
                   ) -> None:
    header_lines(f"write per turn: {events:,} events, store.flush after every turn/end "
                 f"(median of {runs} processes)")
    print("| backend | workload | total s | events/s | flush median ms | flush p95 ms "
          "| dsh total s | dsh events/s | dsh flush ms | peers' turn commit ms "
          "| events/s vs dsh | flush vs dsh | flush vs peers |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for backend, workload, r in rows:
        family = "sqlite" if backend == "sqlite" else "jsonl"
        d_total, d_rate, d_flush = DSH_PER_TURN[(family, workload)]
        flush = r["flush_median_ms"]
        peers = PEERS_TURN_COMMIT_MS if workload == "msg" else None
        print(f"| {BACKENDS[backend][0]} | {workload} | {r['total_ms'] / 1000:.2f} "
              f"| {fmt_rate(r['rate'])} | {flush:.3f} | {r['flush_p95_ms']:.3f} "
              f"| {d_total} | {fmt_rate(d_rate)} | {d_flush if d_flush else '—'} "
              f"| {peers if peers else '—'} "
              f"| {ratio(r['rate'], d_rate, higher_is_better=True)} "
              f"| {ratio(flush, d_flush, higher_is_better=False) if d_flush else 'n/a'} "
              f"| {ratio(flush, peers, higher_is_better=False) if peers else 'n/a'} |")
    print("\ndsh reports one JSONL row for per-turn flushing; it is set beside each JSONL "
          "variant. Peers: OpenAI Agents SDK SQLiteSession, one 4-item turn commit "
          "(peers-baseline.md), comparable to the msg workload.")
    if events != 100_000:
        print(f"Note: dsh's figures are for 100,000 events; this run wrote {events:,}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per cell")
    parser.add_argument("--backend", default="all", help=f"all or {', '.join(BACKENDS)}")
    parser.add_argument("--workload", default="all", help="all, msg or stream")
    parser.add_argument("--per-turn", action="store_true", help="workload 4: flush every turn")
    parser.add_argument("--dir", default=None, help="where the temporary stores go")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.backend, args.workload, args.events, args.per_turn,
                               args.dir)))
        return
    rows = []
    for backend in select(args.backend, list(BACKENDS)):
        for workload in select(args.workload, WORKLOADS):
            extra = ["--per-turn"] if args.per_turn else []
            if args.dir:
                extra += ["--dir", args.dir]
            runs = [run_child("bench.bench_write", ["--backend", backend, "--workload", workload,
                                                    "--events", str(args.events), *extra])
                    for _ in range(args.runs)]
            rows.append((backend, workload, medians(runs)))
    if args.per_turn:
        print_per_turn(rows, args.events, args.runs)
    else:
        print_write(rows, args.events, args.runs)


if __name__ == "__main__":
    main()

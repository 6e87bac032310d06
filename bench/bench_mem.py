"""Workload 1 (mem): in-memory append of N events, no persistence; events/s and peak RSS.

Run: ``python -m bench.bench_mem [--events 100000] [--workload msg|stream|chunks|all]``.
Each workload runs in a fresh process (peak RSS is per process); figures print beside dsh's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from bench.workloads import build, machine, now_ms, peak_rss_mb, ratio

DSH = {"chunks": (146_700, 158), "stream": (130_000, 160), "msg": (86_800, 246)}


def run_one(workload: str, events: int) -> dict[str, float]:
    from dsh.session._session import Session

    session = Session.create("bench")
    t0 = now_ms()
    build(session, workload, events)
    ms = now_ms() - t0
    return {"events": session.seq, "ms": ms, "rate": session.seq / (ms / 1000),
            "rss": peak_rss_mb()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--workload", default="all")
    parser.add_argument("--runs", type=int, default=5, help="fresh processes; medians shown")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.workload, args.events)))
        return
    workloads = ["chunks", "stream", "msg"] if args.workload == "all" else [args.workload]
    print(f"# mem: in-memory append of {args.events:,} events, median of {args.runs} processes "
          f"— {machine()}")
    print("| workload | events/s | ms | peak RSS | dsh events/s | dsh RSS | rate vs dsh |")
    print("|---|---|---|---|---|---|---|")
    for w in workloads:
        runs = [json.loads(subprocess.run(
            [sys.executable, "-m", "bench.bench_mem", "--child", "--workload", w, "--events",
             str(args.events)], check=True, capture_output=True, text=True).stdout)
            for _ in range(args.runs)]
        r = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        d_rate, d_rss = DSH[w]
        vs = ratio(r["rate"], d_rate, higher_is_better=True)
        print(f"| {w} | {r['rate'] / 1000:.1f}k | {r['ms']:.0f} | {r['rss']:.0f} MB "
              f"| {d_rate / 1000:.1f}k | {d_rss} MB | {vs} |")


if __name__ == "__main__":
    main()

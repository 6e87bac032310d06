"""Erasure of one ``--where`` subject across many sessions (docs/forgetting.md#erasure).

Run: ``python -m bench.bench_erase [--sessions 10000] [--subject 10] [--backend sqlite|jsonl|both]
[--runs 1] [--dir DIR]``.

The parent writes ``--sessions`` small msg sessions (12 events each, through one write handle
per session); ``--subject`` of them carry ``cwd=/home/subject/app`` in their header, the others
``cwd=/home/other-N/app``. Then it times, in this process, ``dsh.rights.erase(store,
where={"cwd": "/home/subject/app"})``: selecting the subject's sessions among all headers, and
for each one the repair check, the write ownership, the full read and restore, the tombstones,
the verification of the result and the backend's rewrite (SQLite: the transaction,
``wal_checkpoint``, ``VACUUM``), then one listing refresh. A fresh store per run; the median is
reported with the per-session share. dsh publishes no erasure figure (it has no erasure).
The issue's goal: under 10 s for one subject across 10,000 sessions.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.bench_write import dir_bytes, header_lines
from bench.workloads import build


def make_store(url: str, sessions: int, subject: int) -> None:
    """Write ``sessions`` msg sessions; every ``sessions // subject``-th is the subject's."""
    from dsh.persistence import Persistence, open_backend
    from dsh.session._session import Session

    every = max(1, sessions // max(1, subject))
    persistence = Persistence(open_backend(url))
    try:
        for i in range(sessions):
            mine = i % every == 0 and i // every < subject
            cwd = "/home/subject/app" if mine else f"/home/other-{i}/app"
            session = Session.create(f"e-{i:05d}", header={
                "version": 0, "id": f"e-{i:05d}", "createdAt": 1_700_000_000_000, "cwd": cwd})
            build(session, "msg", 12)
            persistence.create(session.header)
            with persistence.open(session.id, "write") as handle:
                handle.append(session.events)
                handle.flush()
    finally:
        persistence.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--subject", type=int, default=10, help="sessions of the subject")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--backend", default="both", choices=("sqlite", "jsonl", "both"))
    parser.add_argument("--dir", default=None, help="where the temporary stores go")
    args = parser.parse_args()
    import dsh
    from dsh.rights import erase

    backends = ("sqlite", "jsonl") if args.backend == "both" else (args.backend,)
    work = Path(tempfile.mkdtemp(prefix="dsh-bench-erase-", dir=args.dir))
    rows = []
    try:
        for backend in backends:
            times, erased, size = [], 0, 0
            for run in range(args.runs):
                folder = work / f"{backend}-{run}"
                folder.mkdir()
                url = (f"sqlite://{folder.resolve()}/store.db" if backend == "sqlite"
                       else f"jsonl://{folder.resolve()}/store")
                make_store(url, args.sessions, args.subject)
                size = dir_bytes(folder)
                with dsh.open(url) as store:
                    t0 = time.perf_counter()
                    receipt = erase(store, where={"cwd": "/home/subject/app"})
                    times.append((time.perf_counter() - t0) * 1000)
                erased = len(receipt.subjects)
                shutil.rmtree(folder, ignore_errors=True)
            rows.append((backend, size, erased, statistics.median(times)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    header_lines(f"erase: one --where subject across {args.sessions:,} sessions of 12 events "
                 f"(median of {args.runs})")
    print(f"load average at the end: {load}\n")
    print("| backend | sessions | store bytes | sessions erased | erase ms | per erased session "
          "ms | goal | dsh |")
    print("|---|---|---|---|---|---|---|---|")
    for backend, size, erased, ms in rows:
        print(f"| {backend} | {args.sessions:,} | {size:,} | {erased} | {ms:.0f} | "
              f"{ms / max(1, erased):.0f} | < 10,000 ms at 10,000 sessions | n/a |")


if __name__ == "__main__":
    main()

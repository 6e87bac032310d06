"""Erasure of one ``--where`` subject across many sessions, and ``gc`` explaining over many more
(docs/forgetting.md#erasure, docs/forgetting.md#retention).

Run: ``python -m bench.bench_erase [--sessions 10000] [--subject 10] [--backend sqlite|jsonl|both]
[--runs 1] [--dir DIR] [--clone] [--gc-sessions 100000]``.

``--clone`` (SQLite only) writes a few template sessions through dsh and copies their rows
with SQL under new ids (fresh incarnations, no seals: as a store the published dsh wrote),
because writing 10,000+ sessions one handle at a time is most of a run on a loaded machine;
what is timed is the same. ``--gc-sessions N`` adds a second measure: ``dsh.rights.gc``
explaining (``apply=False``) a store-wide policy (archive after 30 days, trash after 90, purge
after 30) over N cloned SQLite sessions of four ages (10, 40, 100 and 200 days idle) with 1% of
them in the trash: the listing from the tables, the headers, the store log, one policy pick
and one sentence per session (median of ``--runs``, wall and this process's CPU time).

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


_UUID = ("lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' || "
         "substr(hex(randomblob(2)), 2) || '-a' || substr(hex(randomblob(2)), 2) || '-' || "
         "hex(randomblob(6)))")


def clone_store(url: str, sessions: int, subject: int, *, ages_days: tuple[int, ...] = (0,),
                now_ms: int = 1_700_000_000_000) -> None:
    """A SQLite store of ``sessions`` msg sessions cloned by SQL from ``len(ages_days)``
    templates (last activity ``age`` days before ``now_ms``); ``subject`` of them, spread
    evenly, get ``cwd=/home/subject/app``, the others ``cwd=/home/other-N/app``."""
    import sqlite3

    from dsh.persistence import Persistence, open_backend
    from dsh.session._session import Session

    persistence = Persistence(open_backend(url))
    try:
        for t, age in enumerate(ages_days):
            at = [now_ms - age * 86_400_000 - 60_000]

            def clock(at: list[int] = at) -> int:
                at[0] += 1
                return at[0]

            sid = f"template-{t}"
            session = Session.create(sid, header={
                "version": 0, "id": sid, "createdAt": at[0], "cwd": "/home/template/app"},
                clock=clock)
            build(session, "msg", 12)
            persistence.create(session.header)
            with persistence.open(sid, "write") as handle:
                handle.append(session.events)
                handle.flush()
    finally:
        persistence.close()
    every = max(1, sessions // max(1, subject))
    conn = sqlite3.connect(url.split("://", 1)[1])
    with conn:
        conn.execute("CREATE TEMP TABLE n(i INTEGER PRIMARY KEY)")
        conn.executemany("INSERT INTO n VALUES (?)", ((i,) for i in range(sessions)))
        k = len(ages_days)
        name = "'e-' || printf('%06d', n.i)"
        conn.execute(
            f"INSERT INTO sessions SELECT {name}, s.version, s.created_at, CASE WHEN "
            f"n.i % {every} = 0 AND n.i / {every} < {subject} THEN '/home/subject/app' ELSE "
            f"'/home/other-' || n.i || '/app' END, s.parent_session, s.seed_length, s.origin, "
            f"s.delegation_depth, s.agent_preset, {_UUID}, s.revision "
            f"FROM n JOIN sessions AS s ON s.id = 'template-' || (n.i % {k})")
        conn.execute(
            f"INSERT INTO events SELECT {name}, e.seq, e.type, e.time, e.data, "
            f"e.source_event_seqs, e.surface_op, e.ignorable FROM n JOIN events AS e "
            f"ON e.session_id = 'template-' || (n.i % {k})")
        for t in range(k):
            conn.execute("DELETE FROM events WHERE session_id = ?", (f"template-{t}",))
            conn.execute("DELETE FROM sessions WHERE id = ?", (f"template-{t}",))
    conn.close()
    folder = Path(url.split("://", 1)[1]).parent
    for side in folder.rglob("*template-*"):  # the templates' seals and restore points
        if side.is_file():
            side.unlink()


def bench_gc(work: Path, sessions: int, runs: int) -> tuple[int, float, float, dict[str, int]]:
    """Store bytes, median wall and CPU ms of ``gc`` explaining over ``sessions`` cloned
    sessions (the CPU time of this process: steadier than the wall on a shared machine), and
    the counts."""
    import dsh
    from dsh.rights import RetentionPolicy, gc, set_retention, trash

    folder = work / "gc"
    folder.mkdir()
    url = f"sqlite://{folder.resolve()}/store.db"
    now = 1_700_000_000_000
    clone_store(url, sessions, 0, ages_days=(10, 40, 100, 200), now_ms=now)
    size = dir_bytes(folder)
    with dsh.open(url) as store:
        def then() -> int:  # the store log's records are 60 days old: the trash is purged
            return now - 60 * 86_400_000

        set_retention(store, RetentionPolicy(archive_after_days=30, trash_after_days=90,
                                             purge_after_days=30), clock=then)
        trash(store, [f"e-{i:06d}" for i in range(0, sessions, 100)], clock=then)
        times, cpu, counts = [], [], {}
        for _ in range(runs):
            t0, c0 = time.perf_counter(), time.process_time()
            report = gc(store, now_ms=now)
            times.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)
            counts = {a: report.count(a) for a in ("archive", "trash", "purge")}
            counts["kept"] = report.kept
    return size, statistics.median(times), statistics.median(cpu), counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--subject", type=int, default=10, help="sessions of the subject")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--backend", default="both", choices=("sqlite", "jsonl", "both"))
    parser.add_argument("--dir", default=None, help="where the temporary stores go")
    parser.add_argument("--clone", action="store_true",
                        help="SQLite: clone template sessions by SQL instead of writing each")
    parser.add_argument("--gc-sessions", type=int, default=0,
                        help="also time gc explaining over this many cloned SQLite sessions")
    args = parser.parse_args()
    import dsh
    from dsh.rights import erase

    backends = ("sqlite", "jsonl") if args.backend == "both" else (args.backend,)
    work = Path(tempfile.mkdtemp(prefix="dsh-bench-erase-", dir=args.dir))
    rows = []
    gc_row: tuple[int, float, float, dict[str, int]] | None = None
    try:
        if args.gc_sessions:
            gc_row = bench_gc(work, args.gc_sessions, args.runs)
        for backend in backends:
            times, erased, size = [], 0, 0
            for run in range(args.runs):
                folder = work / f"{backend}-{run}"
                folder.mkdir()
                url = (f"sqlite://{folder.resolve()}/store.db" if backend == "sqlite"
                       else f"jsonl://{folder.resolve()}/store")
                if args.clone and backend == "sqlite":
                    clone_store(url, args.sessions, args.subject)
                else:
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
    if gc_row is not None:
        size, ms, cpu_ms, counts = gc_row
        print(f"\ngc explain (apply=False) over {args.gc_sessions:,} cloned SQLite sessions "
              f"(median of {args.runs})\n")
        print("| sessions | store bytes | gc explain ms | CPU ms | archive | trash | purge | kept "
              "| goal | dsh |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        print(f"| {args.gc_sessions:,} | {size:,} | {ms:.0f} | {cpu_ms:.0f} | "
              f"{counts['archive']:,} | "
              f"{counts['trash']:,} | {counts['purge']:,} | {counts['kept']:,} | < 2,000 ms at "
              f"100,000 sessions | n/a |")


if __name__ == "__main__":
    main()

"""Cost of the integrity seals: append+flush, cold load and verified page-in, with and without.

Run: ``python -m bench.bench_integrity [--events 20000] [--batch 50] [--runs 5] [--dir D]``.

``--page-in`` measures instead a resume through a restore point (``store.session(id)`` then
``derive_messages()``) of a log whose surface is sparse (one user message per 1,000 events, the
rest log-only ticks), with every page checked against the seal (``verified``, the shipped code;
docs/rules.md#verified-page-in) and without (``unverified``).

``--chain`` measures the seal's hash chain (docs/formats.md#the-seal-chain) instead: append+flush
of ``--append-events`` events (default ``--events``; 0: none) with the chain (``chained``, the
shipped code) and without (``unchained``: no chain record, the range records as before); what ``dsh
verify`` adds to a full read: the chain check (``prove_chain``: every event's leaf recomputed,
every record compared) over a log of ``--events`` events written in batches of ``--batch``,
timed apart from the read in the same process; and the whole command, ``dsh verify s --store
URL`` in a fresh process (every invariant check, the read, the chain). The read, the check and
the command are given as wall / CPU time (this process's, or the command's).

For raw JSONL and SQLite, each figure is the median of ``--runs`` fresh processes, the two
variants interleaved: ``sealed`` is the shipped code; ``unsealed`` skips the checksums and the
seal file writes (append+flush) and removes the seal files before reading (cold load).
Workload: ``--events`` events of completed turns written as batches of ``--batch`` events,
each batch appended and flushed (one durable batch per agent step); the cold load is
``dsh.open(url).persistence.read(id)`` (the read pipeline, all events). Prints a markdown table
with the ratio sealed / unsealed (1.00 = free).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = "bench.bench_integrity"


def _events(n: int) -> list[object]:
    from dsh.session._session import Session

    session = Session.create("s", header={"version": 0, "id": "s", "createdAt": 1,
                                         "cwd": "/w/p"})
    turn = 0
    while len(session.events) < n:
        turn += 1
        session.append("turn/start", {"turn": turn})
        session.append("step/start", {"turn": turn, "step": 1})
        session.append("user/message", {
            "id": f"u{turn}", "role": "user", "source": {"kind": "user"},
            "content": [{"type": "text", "text": f"question {turn} " * 20}]},
            surface_op="append")
        session.append("step/end", {"turn": turn, "step": 1})
        session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
    return list(session.events[:n])


def _sparse_events(n: int) -> list[object]:
    from dsh.session._session import Session

    session = Session.create("s", header={"version": 0, "id": "s", "createdAt": 1,
                                         "cwd": "/w/p"})
    while len(session.events) < n:
        k = len(session.events)
        if k % 1000 == 0:
            session.append("user/message", {
                "id": f"u{k}", "role": "user", "source": {"kind": "user"},
                "content": [{"type": "text", "text": f"note {k} " * 20}]}, surface_op="append")
        else:
            session.append("x/tick", {"n": k, "text": "log only " * 10}, ignorable=True)
    return list(session.events[:n])


def _page_in(kind: str, variant: str, location: str, n: int, batch: int) -> float:
    import dsh
    from dsh.persistence import Persistence, _resume, open_backend
    from dsh.persistence.jsonl import _restore_point as jrp
    from dsh.persistence.sqlite import _restore_point as srp

    url = f"jsonl://{location}" if kind == "jsonl" else f"sqlite://{location}/store.db"
    if not any(Path(location).rglob("*.ckpt")):
        persistence = Persistence(open_backend(url))
        events = _sparse_events(n)
        persistence.create({"version": 0, "id": "s", "createdAt": 1, "cwd": "/w/p"})
        with persistence.open("s", "write") as handle:
            for k in range(0, n, batch):
                handle.append(events[k:k + batch])  # type: ignore[arg-type]
                handle.flush()
        assert _resume.write_restore_point(persistence.backend, "s")
        persistence.close()
    if variant == "unverified":
        plain_j = jrp.JsonlPrefixSource.__init__
        plain_s = srp.SqlitePrefixSource.__init__

        def no_seals_j(self: object, *args: object, seals: object = None,
                       **options: object) -> None:
            plain_j(self, *args, **options)  # type: ignore[arg-type]

        def no_seals_s(self: object, *args: object, seals: object = None,
                       **options: object) -> None:
            plain_s(self, *args, **options)  # type: ignore[arg-type]

        jrp.JsonlPrefixSource.__init__ = no_seals_j  # type: ignore[method-assign]
        srp.SqlitePrefixSource.__init__ = no_seals_s  # type: ignore[method-assign]
    from dsh.persistence import _restore_point as rp

    started = time.perf_counter()
    store = dsh.open(url)
    session = store.session("s")
    messages = session.derive_messages()
    elapsed = time.perf_counter() - started
    assert rp.stats["used"] == 1 and len(messages) >= n // 1000, (rp.stats, len(messages))
    store.sessions.dispose(session)  # nothing written after the timing
    store.close()
    return elapsed * 1000


def _chain_verify(kind: str, location: str, n: int, batch: int) -> dict[str, float]:
    """Write ``n`` events (once per location), then time a full read and the chain check."""
    from dsh.persistence import Persistence, open_backend, prove_chain

    url = f"jsonl://{location}" if kind == "jsonl" else f"sqlite://{location}/store.db"
    persistence = Persistence(open_backend(url))
    if not persistence.exists("s"):  # written once; the later runs time the read and check
        persistence.close()
        _child("write", kind, "chained", location, n, batch)
        persistence = Persistence(open_backend(url))
    started, cpu_started = time.perf_counter(), time.process_time()
    read = persistence.read("s")
    middle, cpu_middle = time.perf_counter(), time.process_time()
    seal, incarnation = persistence.backend.seal_chain("s")  # type: ignore[attr-defined]
    proof, problems, _ = prove_chain("s", seal, incarnation, read.stored_events)
    ended, cpu_ended = time.perf_counter(), time.process_time()
    assert not problems and proof.last_seq == n - 1, (problems, proof.last_seq)
    persistence.close()
    return {"read": (middle - started) * 1000, "chain": (ended - middle) * 1000,
            "read_cpu": (cpu_middle - cpu_started) * 1000,
            "chain_cpu": (cpu_ended - cpu_middle) * 1000}


def _child(op: str, kind: str, variant: str, location: str, n: int, batch: int) -> float:
    from dsh.persistence import Persistence, open_backend

    if op == "page-in":
        return _page_in(kind, variant, location, n, batch)
    if variant == "unchained":  # range records only, as before the chain
        from dsh.persistence._chain import ChainState

        ChainState.take = lambda self, *args: None  # type: ignore[method-assign,assignment]
    url = f"jsonl://{location}" if kind == "jsonl" else f"sqlite://{location}/store.db"
    if variant == "unsealed":
        import dsh.persistence._seal as seal_module
        from dsh.persistence.jsonl._backend import JsonlHandle
        from dsh.persistence.sqlite._backend import SqliteHandle

        # no checksum, no seal file; the in-memory records keep the append path unchanged
        JsonlHandle._seal = lambda self, content=None: None  # type: ignore[method-assign]
        SqliteHandle._seal = (  # type: ignore[method-assign]
            lambda self, records, incarnation: self._seals.extend(records))
        seal_module.rows_crc = lambda rows: 0
        for seal in Path(location).rglob("*.seal"):
            seal.unlink()
    persistence = Persistence(open_backend(url))
    if op == "write":
        events = _events(n)
        persistence.create({"version": 0, "id": "s", "createdAt": 1, "cwd": "/w/p"})
        started = time.perf_counter()
        with persistence.open("s", "write") as handle:
            for k in range(0, n, batch):
                handle.append(events[k:k + batch])  # type: ignore[arg-type]
                handle.flush()
        elapsed = time.perf_counter() - started
    else:
        started = time.perf_counter()
        read = persistence.read("s")
        elapsed = time.perf_counter() - started
        assert len(read.stored_events) == n
    persistence.close()
    return elapsed * 1000


def _run(op: str, kind: str, variant: str, location: Path, n: int, batch: int) -> float:
    out = subprocess.run([sys.executable, "-m", _CHILD, "--child", op, kind, variant,
                          str(location), str(n), str(batch)], capture_output=True, text=True,
                         check=True)
    return float(json.loads(out.stdout)["ms"])


def main() -> None:
    """Parse arguments, run the interleaved measurements, print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the temporary stores go")
    parser.add_argument("--page-in", action="store_true",
                        help="measure a resume through a restore point, verified or not")
    parser.add_argument("--chain", action="store_true",
                        help="measure the seal chain: append+flush, and dsh verify's check")
    parser.add_argument("--append-events", type=int, default=None,
                        help="--chain: events of the append+flush runs (default --events)")
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        op, kind, variant, location, n, batch = args.child
        if op == "chain-verify":
            print(json.dumps(_chain_verify(kind, location, int(n), int(batch))))
            return
        print(json.dumps({"ms": _child(op, kind, variant, location, int(n), int(batch))}))
        return
    if args.page_in:
        _page_in_table(args.events, args.batch, args.runs, args.dir)
        return
    if args.chain:
        _chain_table(args.events, args.batch, args.runs, args.dir,
                     args.events if args.append_events is None else args.append_events)
        return
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for kind in ("jsonl", "sqlite"):
            times: dict[tuple[str, str], list[float]] = {}
            for run in range(args.runs):
                for variant in ("sealed", "unsealed"):
                    location = Path(tmp) / f"{kind}-{variant}-{run}"
                    location.mkdir(mode=0o700)
                    times.setdefault(("write", variant), []).append(
                        _run("write", kind, variant, location, args.events, args.batch))
                    times.setdefault(("load", variant), []).append(
                        _run("load", kind, variant, location, args.events, args.batch))
                    shutil.rmtree(location)
            for op in ("write", "load"):
                sealed = statistics.median(times[(op, "sealed")])
                unsealed = statistics.median(times[(op, "unsealed")])
                rows.append((kind, op, sealed, unsealed, sealed / unsealed))
    print(f"# integrity seals: {args.events:,} events, batches of {args.batch} appended and "
          f"flushed, median of {args.runs} fresh processes")
    print("| backend | operation | sealed ms | unsealed ms | sealed / unsealed |")
    print("|---|---|---|---|---|")
    names = {"write": f"append+flush ({args.events // args.batch} batches)",
             "load": "cold read (all events)"}
    for kind, op, sealed, unsealed, ratio in rows:
        print(f"| {'raw JSONL' if kind == 'jsonl' else 'SQLite'} | {names[op]} | {sealed:.0f} | "
              f"{unsealed:.0f} | {ratio:.2f} |")


def _dsh_verify(kind: str, location: Path) -> tuple[float, float]:
    """Wall and CPU seconds of ``dsh verify s`` over the store at ``location``, fresh process."""
    url = f"jsonl://{location}" if kind == "jsonl" else f"sqlite://{location}/store.db"
    before = os.times()
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dsh.cli", "verify", "s", "--store", url],
                   capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    after = os.times()
    return wall, (after.children_user - before.children_user
                  + after.children_system - before.children_system)


def _chain_table(n: int, batch: int, runs: int, where: str | None, appended: int) -> None:
    """Print the chain's cost: append+flush chained / unchained, verify's chain check, verify."""
    rows = []
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        for kind in ("jsonl", "sqlite"):
            times: dict[str, list[float]] = {"chained": [], "unchained": []}
            for run in range(runs if appended else 0):
                for variant in ("chained", "unchained"):
                    location = Path(tmp) / f"{kind}-{variant}-{run}"
                    location.mkdir(mode=0o700)
                    times[variant].append(_run("write", kind, variant, location, appended,
                                               batch))
                    shutil.rmtree(location)
            location = Path(tmp) / f"{kind}-verify"
            location.mkdir(mode=0o700)
            checks = []
            for _ in range(runs):
                out = subprocess.run([sys.executable, "-m", _CHILD, "--child", "chain-verify",
                                      kind, "-", str(location), str(n), str(batch)],
                                     capture_output=True, text=True, check=True)
                checks.append(json.loads(out.stdout))
            verifies = [_dsh_verify(kind, location) for _ in range(runs)]
            shutil.rmtree(location)
            chained = statistics.median(times["chained"]) if appended else math.nan
            unchained = statistics.median(times["unchained"]) if appended else math.nan
            figures = [statistics.median(c[key] for c in checks)
                       for key in ("read", "read_cpu", "chain", "chain_cpu")]
            wall = statistics.median(v[0] for v in verifies)
            cpu = statistics.median(v[1] for v in verifies)
            rows.append((kind, chained, unchained, *figures, wall, cpu))
    print(f"# seal chain: append+flush of {appended:,} events, verify of {n:,} events, batches "
          f"of {batch}, median of {runs} fresh processes (wall / CPU)")
    print("| backend | append+flush chained ms | unchained ms | chained / unchained | "
          "full read ms | chain check ms | chain check µs/event | dsh verify s |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, chained, unchained, read, read_cpu, chain, chain_cpu, wall, cpu in rows:
        print(f"| {'raw JSONL' if kind == 'jsonl' else 'SQLite'} | {chained:.0f} | "
              f"{unchained:.0f} | {chained / unchained:.2f} | {read:.0f} / {read_cpu:.0f} | "
              f"{chain:.0f} / {chain_cpu:.0f} | {chain * 1000 / n:.2f} / "
              f"{chain_cpu * 1000 / n:.2f} | {wall:.2f} / {cpu:.2f} |")


def _page_in_table(n: int, batch: int, runs: int, where: str | None) -> None:
    rows = []
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        for kind in ("jsonl", "sqlite"):
            location = Path(tmp) / kind
            location.mkdir(mode=0o700)
            times: dict[str, list[float]] = {"verified": [], "unverified": []}
            for _ in range(runs):
                for variant in ("verified", "unverified"):
                    # a resume writes its end-seed marker: each run resumes a fresh copy
                    run_at = Path(tmp) / f"{kind}-{variant}"
                    if not any(location.iterdir()):
                        _run("page-in", kind, variant, location, n, batch)
                    shutil.copytree(location, run_at)
                    times[variant].append(_run("page-in", kind, variant, run_at, n, batch))
                    shutil.rmtree(run_at)
            verified = statistics.median(times["verified"])
            unverified = statistics.median(times["unverified"])
            rows.append((kind, verified, unverified, verified / unverified))
    print(f"# verified page-in: resume through a restore point of {n:,} events (one surface "
          f"node per 1,000), batches of {batch}, median of {runs} fresh processes")
    print("| backend | verified ms | unverified ms | verified / unverified |")
    print("|---|---|---|---|")
    for kind, verified, unverified, ratio in rows:
        print(f"| {'raw JSONL' if kind == 'jsonl' else 'SQLite'} | {verified:.0f} | "
              f"{unverified:.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()

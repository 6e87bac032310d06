"""Cold ``get_tuple`` client CPU: DshSaver beside LangGraph's own saver, A/B by source.

Each side writes one thread of ``--turns`` turns (:func:`bench.bench_saver._turn`, the chat
workload of the adapters bench) into its own store, with the dsh code of each ``--src`` folder
(``src`` of a worktree: a before and an after) and LangGraph's saver for the same database:
``--store postgres`` (default: a PostgreSQL schema per side, ``PostgresSaver``) or ``--store
sqlite`` (a file per side in a temporary folder, ``SqliteSaver``). Then, ``--runs`` rounds,
each starting one fresh process per side in turn (alternating, so each side sees the same
machine noise): the process imports everything first, then times with ``time.process_time``
(client CPU, not the server's) opening the saver (the connection included) and the
``get_tuple`` of the thread's latest checkpoint, and the call alone. Printed: the median and
range of each, per side, and the wall time of the call.

Run: ``python -m bench.bench_saver_cold --src ../before/src --src src --runs 9 [--store
sqlite]``.
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
import time
from pathlib import Path
from typing import Any

# (store, side) -> the kind bench.bench_saver._saver opens
_KINDS = {("postgres", "dsh"): "dsh-postgres", ("postgres", "peer"): "postgres",
          ("sqlite", "dsh"): "dsh", ("sqlite", "peer"): "sqlite"}


def _child(kind: str, phase: str, store: str, turns: int) -> dict[str, float]:
    """One process's work; ``store``: the PostgreSQL URL, or the SQLite side's folder."""
    # imports apart: what opening the saver imports, each side its own
    import psycopg

    from bench.bench_saver import _close, _saver, _turn
    postgres = "://" in store
    if kind == "dsh":
        import dsh.adapters.langgraph
        import dsh.persistence._facade
        import dsh.persistence.postgres._backend
        import dsh.persistence.sqlite._backend  # noqa: F401
    elif postgres:
        import langgraph.checkpoint.postgres
        import psycopg.rows  # noqa: F401
    else:
        import sqlite3  # noqa: F401

        import langgraph.checkpoint.sqlite  # noqa: F401
    config = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
    kind_name = _KINDS["postgres" if postgres else "sqlite", kind]
    root, pg = (Path("."), store) if postgres else (Path(store), None)
    if phase == "write":
        root.mkdir(parents=True, exist_ok=True)
        saver = _saver(kind_name, root, pg)
        state: dict[str, Any] = {}
        for n in range(turns):
            _turn(saver, "bench", n, state)
        _close(saver)
        return {}
    cpu0, wall0 = time.process_time(), time.perf_counter()
    saver = _saver(kind_name, root, pg)
    cpu1, wall1 = time.process_time(), time.perf_counter()
    latest = saver.get_tuple(config)
    cpu2, wall2 = time.process_time(), time.perf_counter()
    assert latest is not None
    assert len(latest.checkpoint["channel_values"]["messages"]) == 2 * turns
    _close(saver)
    return {"open_call_cpu": (cpu2 - cpu0) * 1e3, "call_cpu": (cpu2 - cpu1) * 1e3,
            "call_wall": (wall2 - wall1) * 1e3, "open_wall": (wall1 - wall0) * 1e3}


def _run(src: str | None, kind: str, phase: str, store: str, turns: int) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = subprocess.run([sys.executable, "-m", "bench.bench_saver_cold", "--child", kind,
                          "--phase", phase, "--pg", store, "--turns", str(turns)],
                         check=True, capture_output=True, text=True, env=env).stdout
    result: dict[str, float] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--src", action="append", default=[],
                        help="a dsh source folder to measure (repeat: before, after)")
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=7, help="alternating rounds")
    parser.add_argument("--no-peer", action="store_true",
                        help="leave LangGraph's saver out")
    parser.add_argument("--store", choices=("postgres", "sqlite"), default="postgres",
                        help="the database both sides write to (default postgres)")
    parser.add_argument("--dir", default=None,
                        help="the folder the SQLite sides write under (default: a temporary "
                             "one, removed after)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--phase", default="read", help=argparse.SUPPRESS)
    parser.add_argument("--pg", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.phase, args.pg, args.turns)))
        return
    from bench.bench_saver import _drop, _pg_url

    sides: list[tuple[str, str | None, str, str]] = []  # (label, src, kind, url or folder)
    sqlite = args.store == "sqlite"
    top = Path(tempfile.mkdtemp(prefix="bench-saver-cold-", dir=args.dir)) if sqlite else None

    def place(kind: str, n: int) -> str:
        if top is not None:
            return str(top / f"{kind}{n}")
        url = _pg_url(_KINDS["postgres", kind])
        assert url is not None, "no PostgreSQL server answers"
        return url

    try:
        for n, src in enumerate(args.src or [""]):
            sides.append((f"DshSaver {src or '(installed)'}", src or None, "dsh",
                          place("dsh", n)))
        if not args.no_peer:
            sides.append(("SqliteSaver" if sqlite else "PostgresSaver", None, "peer",
                          place("peer", 0)))
        for _, src, kind, url in sides:
            _run(src, kind, "write", url, args.turns)
        results: dict[str, list[dict[str, float]]] = {label: [] for label, *_ in sides}
        for _ in range(args.runs):
            for label, src, kind, url in sides:
                results[label].append(_run(src, kind, "read", url, args.turns))
    finally:
        if top is not None:
            shutil.rmtree(top, ignore_errors=True)
        else:
            for _, _, _, url in sides:
                _drop(url)
    print(f"# cold get_tuple of a {args.turns:,}-turn thread on {args.store}, fresh processes, "
          f"{args.runs} alternating rounds, load {os.getloadavg()[0]:.1f}")
    print("| side | open + call CPU ms | call CPU ms | call wall ms |")
    print("|---|---|---|---|")
    for label, runs in results.items():
        cells = []
        for key in ("open_call_cpu", "call_cpu", "call_wall"):
            values = [r[key] for r in runs]
            cells.append(f"{statistics.median(values):.1f} ({min(values):.1f}-"
                         f"{max(values):.1f})")
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

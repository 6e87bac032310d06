"""Cold ``get_tuple`` client CPU: DshSaver on PostgreSQL beside ``PostgresSaver``, A/B by source.

Each side writes one thread of ``--turns`` turns (:func:`bench.bench_saver._turn`, the chat
workload of the adapters bench) into its own PostgreSQL schema, with the dsh code of each
``--src`` folder (``src`` of a worktree: a before and an after) and LangGraph's
``PostgresSaver``. Then, ``--runs`` rounds, each starting one fresh process per side in turn
(alternating, so each side sees the same machine noise): the process imports everything first,
then times with ``time.process_time`` (client CPU, not the server's) opening the saver (the
connection included) and the ``get_tuple`` of the thread's latest checkpoint, and the call
alone. Printed: the median and range of each, per side, and the wall time of the call.

Run: ``python -m bench.bench_saver_cold --src ../before/src --src src --runs 9``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _child(kind: str, phase: str, pg: str, turns: int) -> dict[str, float]:
    # imports apart: what opening the saver imports, each side its own
    import psycopg

    from bench.bench_saver import _close, _saver, _turn
    if kind == "dsh":
        import dsh.adapters.langgraph
        import dsh.persistence._facade
        import dsh.persistence.postgres._backend
        import dsh.persistence.sqlite._backend  # noqa: F401
    else:
        import langgraph.checkpoint.postgres  # noqa: F401
        import psycopg.rows  # noqa: F401
    config = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
    kind_name = "dsh-postgres" if kind == "dsh" else "postgres"
    if phase == "write":
        saver = _saver(kind_name, Path("."), pg)
        state: dict[str, Any] = {}
        for n in range(turns):
            _turn(saver, "bench", n, state)
        _close(saver)
        return {}
    cpu0, wall0 = time.process_time(), time.perf_counter()
    saver = _saver(kind_name, Path("."), pg)
    cpu1, wall1 = time.process_time(), time.perf_counter()
    latest = saver.get_tuple(config)
    cpu2, wall2 = time.process_time(), time.perf_counter()
    assert latest is not None
    assert len(latest.checkpoint["channel_values"]["messages"]) == 2 * turns
    _close(saver)
    return {"open_call_cpu": (cpu2 - cpu0) * 1e3, "call_cpu": (cpu2 - cpu1) * 1e3,
            "call_wall": (wall2 - wall1) * 1e3, "open_wall": (wall1 - wall0) * 1e3}


def _run(src: str | None, kind: str, phase: str, pg: str, turns: int) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = subprocess.run([sys.executable, "-m", "bench.bench_saver_cold", "--child", kind,
                          "--phase", phase, "--pg", pg, "--turns", str(turns)],
                         check=True, capture_output=True, text=True, env=env).stdout
    result: dict[str, float] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--src", action="append", default=[],
                        help="a dsh source folder to measure (repeat: before, after)")
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=7, help="alternating rounds")
    parser.add_argument("--no-peer", action="store_true", help="leave PostgresSaver out")
    parser.add_argument("--dir", default=None,
                        help="accepted as every bench takes it; the stores are schemas")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--phase", default="read", help=argparse.SUPPRESS)
    parser.add_argument("--pg", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.phase, args.pg, args.turns)))
        return
    from bench.bench_saver import _drop, _pg_url

    sides: list[tuple[str, str | None, str, str]] = []  # (label, src, kind, url)
    try:
        for src in args.src or [""]:
            url = _pg_url("dsh-postgres")
            assert url is not None, "no PostgreSQL server answers"
            sides.append((f"DshSaver {src or '(installed)'}", src or None, "dsh", url))
        if not args.no_peer:
            url = _pg_url("postgres")
            assert url is not None
            sides.append(("PostgresSaver", None, "postgres", url))
        for _, src, kind, url in sides:
            _run(src, kind, "write", url, args.turns)
        results: dict[str, list[dict[str, float]]] = {label: [] for label, *_ in sides}
        for _ in range(args.runs):
            for label, src, kind, url in sides:
                results[label].append(_run(src, kind, "read", url, args.turns))
    finally:
        for _, _, _, url in sides:
            _drop(url)
    print(f"# cold get_tuple of a {args.turns:,}-turn thread, fresh processes, "
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

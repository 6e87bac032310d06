"""Each adapter beside the framework's own store, in one run.

1. OpenAI Agents SDK sessions: DshSession beside the SDK's SQLiteSession, per turn.

Each session is prefilled with N Responses items (turns of user message, function_call,
function_call_output, assistant message). Then, each in a fresh process (modules already
imported):

* cold open + ``get_items(limit=20)``: the clock started before the session's constructor
  (``SQLiteSession`` connects and creates its tables there, ``DshSession`` opens its store on
  first use: both counted) and stopped after the process's first ``get_items(limit=20)`` (what
  a Runner with ``SessionSettings(limit=20)`` asks first), then the first write (``add_items``
  of a turn's items: DshSession resumes the log there), on a copy of the store;
* the SDK's Runner per turn: cold open + the first ``get_items()`` of the whole history (the
  constructor counted likewise), then turns of
  ``get_items()``, ``add_items`` of the prompt, ``add_items`` of the turn's items (median),
  ``get_items(limit=20)`` (median of :data:`LIMIT_CALLS`), and the process's peak RSS.

Both sessions run in the same invocation, interleaved, median of ``--runs`` fresh processes;
the ratio row gives SQLiteSession's figure over DshSession's (>= 1.0: DshSession is ahead).

2. LangGraph checkpointers: DshSaver beside SqliteSaver (and PostgresSaver on a dsh PostgreSQL
store, when a server answers): a ``--saver-turns`` thread written as a chat graph writes it;
per turn, ``get_tuple`` (warm and in a fresh process), ``list(limit=10)``, a whole ``list``,
peak RSS and bytes on disk (see :mod:`bench.bench_saver`).

Run: ``python -m bench.bench_adapters [--sizes 100,10000,100000] [--turns 10] [--runs 3]
[--saver-turns 1000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.workloads import existing_dir, machine, now_ms, peak_rss_mb, ratio

PREFILL_BATCH = 40
"""Items per ``add_items`` while prefilling (10 turns): a Runner writes a turn's items per call,
and DshSession's storage follows its batches (a page-in checks the integrity seal record of each
batch it touches, so one 1,000-item batch would make the first page read all of it)."""


LIMIT_CALLS = 21
"""``get_items(limit=20)`` calls on the held session after the turns (median shown): one call
is a fraction of a millisecond, within the machine's scheduling noise."""


def turn_items(n: int) -> list[dict[str, Any]]:
    """The four items of turn ``n``: prompt, call, output, answer."""
    call_id = f"call_{n}"
    return [
        {"role": "user", "content": f"Turn {n}: what is in src/module_{n}.py?"},
        {"type": "function_call", "id": f"fc_{n}", "call_id": call_id, "name": "read_file",
         "arguments": json.dumps({"path": f"src/module_{n}.py"}), "status": "completed"},
        {"type": "function_call_output", "call_id": call_id,
         "output": f"def f_{n}():\n    return {n}\n" * 4},
        {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": f"module_{n} defines f_{n}.",
                      "annotations": []}]},
    ]


def import_session(kind: str) -> None:
    """Import what a ``kind`` session (``dsh`` or ``sqlite``) needs, so no clock counts it."""
    if kind == "dsh":
        # the store imports its backend and its write lock lazily: time the work, not imports
        # (the lock is fcntl.flock on POSIX: filelock loads only where fcntl is missing)
        import dsh.persistence._facade
        import dsh.persistence._lock
        import dsh.persistence.sqlite._backend  # noqa: F401
        from dsh.adapters.openai_agents import DshSession  # noqa: F401
    else:
        from agents import SQLiteSession  # noqa: F401


def make_session(kind: str, root: Path) -> Any:
    """A ``dsh`` (DshSession, SQLite store) or ``sqlite`` (SDK SQLiteSession) session in root."""
    import_session(kind)
    if kind == "dsh":
        from dsh.adapters.openai_agents import DshSession
        return DshSession("bench", f"sqlite:///{root / 'dsh.db'}")
    from agents import SQLiteSession
    return SQLiteSession("bench", root / "sdk.db")


async def prefill(kind: str, root: Path, items: int) -> None:
    session = make_session(kind, root)
    batch: list[dict[str, Any]] = []
    for n in range(items // 4):
        batch.extend(turn_items(n))
        if len(batch) >= PREFILL_BATCH:
            await session.add_items(batch)
            batch = []
    if batch:
        await session.add_items(batch)
    session.close()


async def open_read_write(kind: str, root: Path, items: int,
                          clock: Callable[[], float]) -> tuple[Any, dict[str, float]]:
    """A fresh process's cold open, first ``get_items(limit=20)`` and first write, by ``clock``.

    Returns the open session and ``construct`` (the constructor alone), ``cold_limit`` (the
    clock started before the constructor: ``SQLiteSession`` connects and creates its tables
    there, ``DshSession`` opens its store on first use, both counted) and ``first_write`` (the
    ``add_items`` of a turn's items: DshSession resumes the log there), in the clock's unit.
    Raises AssertionError if the read returns the wrong number of items.
    """
    import_session(kind)
    gc.collect()  # as in measure()
    t0 = clock()
    session = make_session(kind, root)
    construct = clock() - t0
    recent = await session.get_items(limit=20)
    cold_limit = clock() - t0
    assert len(recent) == min(20, items // 4 * 4), (kind, len(recent))
    t0 = clock()
    await session.add_items(turn_items(items // 4))
    first_write = clock() - t0
    return session, {"construct": construct, "cold_limit": cold_limit,
                     "first_write": first_write}


async def measure_open(kind: str, root: Path, items: int) -> dict[str, float]:
    """The cold open: constructor and first ``get_items(limit=20)``, then the first write."""
    session, found = await open_read_write(kind, root, items, now_ms)
    session.close()
    return {"cold_limit": found["cold_limit"], "first_write": found["first_write"]}


async def runner_turn(session: Any, n: int) -> None:
    """Turn ``n`` as the SDK's Runner makes it: the history, the prompt, the turn's items."""
    new = turn_items(n)
    await session.get_items()
    await session.add_items(new[:1])
    await session.add_items(new[1:])


async def measure(kind: str, root: Path, items: int, turns: int) -> dict[str, float]:
    import_session(kind)
    # Importing the SDK leaves ~1M young objects; the first allocation-heavy call after it
    # pays one full collection of them (about a second here), whichever session makes it.
    # Pay it before the clock starts, for both.
    gc.collect()
    t0 = now_ms()  # before the constructor, as in measure_open()
    session = make_session(kind, root)
    history = await session.get_items()
    cold = now_ms() - t0
    assert len(history) == items // 4 * 4, (kind, len(history))
    per_turn: list[float] = []
    for n in range(items // 4, items // 4 + turns):
        t0 = now_ms()
        await runner_turn(session, n)
        per_turn.append(now_ms() - t0)
    held: list[float] = []
    for _ in range(LIMIT_CALLS):
        t0 = now_ms()
        recent = await session.get_items(limit=20)
        held.append(now_ms() - t0)
    assert len(recent) == 20 or items < 20
    limited = statistics.median(held)
    session.close()
    return {"cold": cold, "turn": statistics.median(per_turn), "limit20": limited,
            "rss": peak_rss_mb()}


def child(kind: str, root: Path, items: int, turns: int, phase: str) -> None:
    if phase == "prefill":
        asyncio.run(prefill(kind, root, items))
        print("{}")
    elif phase == "open":
        print(json.dumps(asyncio.run(measure_open(kind, root, items))))
    else:
        print(json.dumps(asyncio.run(measure(kind, root, items, turns))))


def run_child(kind: str, root: Path, items: int, turns: int, phase: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-m", "bench.bench_adapters", "--child", kind,
                          "--root", str(root), "--sizes", str(items), "--turns", str(turns),
                          "--phase", phase], check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100,10000,100000")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3, help="fresh processes; medians shown")
    parser.add_argument("--dir", type=existing_dir, default=None,
                        help="parent of the temporary stores")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--root", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--phase", default="measure", help=argparse.SUPPRESS)
    parser.add_argument("--saver-turns", type=int, default=1000,
                        help="turns of the LangGraph thread (0: skip the savers)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.child:
        child(args.child, Path(args.root), sizes[0], args.turns, args.phase)
        return
    print(f"# adapters: OpenAI Agents SDK session, DshSession (SQLite store) beside "
          f"SQLiteSession, median of {args.runs} processes — {machine()}")
    print("| items | session | cold open + get_items(limit=20) ms | first write ms "
          "| cold open + get_items() ms | per-turn ms | get_items(limit=20) ms | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|")
    keys = ("cold_limit", "first_write", "cold", "turn", "limit20", "rss")
    for items in sizes:
        results: dict[str, list[dict[str, float]]] = {"dsh": [], "sqlite": []}
        for _ in range(args.runs):
            for kind in ("dsh", "sqlite"):  # interleaved: both see the same machine noise
                root = Path(tempfile.mkdtemp(prefix="bench-adapters-", dir=args.dir))
                copy = root.with_name(root.name + "-open")
                try:
                    run_child(kind, root, items, args.turns, "prefill")
                    shutil.copytree(root, copy)
                    opened = run_child(kind, copy, items, args.turns, "open")
                    results[kind].append({**opened, **run_child(kind, root, items, args.turns,
                                                                "measure")})
                finally:
                    shutil.rmtree(root, ignore_errors=True)
                    shutil.rmtree(copy, ignore_errors=True)
        med = {kind: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
               for kind, runs in results.items()}
        for kind, label in (("dsh", "DshSession"), ("sqlite", "SQLiteSession")):
            r = med[kind]
            print(f"| {items:,} | {label} | " + " | ".join(
                f"{r[key]:.1f}" for key in keys) + " |")
        print(f"| {items:,} | SQLiteSession / DshSession | " + " | ".join(
            ratio(med["dsh"][key], med["sqlite"][key], higher_is_better=False)
            for key in keys) + " |")
    if args.saver_turns:
        savers(args.saver_turns, args.runs)


def savers(turns: int, runs: int) -> None:
    """The LangGraph saver table: each figure, then ours against theirs (≥ 1.0: ours ahead)."""
    from bench.bench_saver import compare
    rows = dict(compare(turns, runs))
    print()
    print(f"# adapters: LangGraph checkpointers, a {turns:,}-turn thread (2 checkpoints + 1 "
          f"pending write a turn, add_messages state), median of {runs} processes")
    print("| saver | per turn ms | get_tuple ms | cold get_tuple ms | list(limit=10) ms "
          "| cold list(limit=10) ms | list all ms | peak RSS | bytes on disk |")
    print("|---|---|---|---|---|---|---|---|---|")
    names = {"dsh": "DshSaver (dsh SQLite)", "sqlite": "SqliteSaver",
             "dsh-postgres": "DshSaver (dsh PostgreSQL)", "postgres": "PostgresSaver"}
    for kind, r in rows.items():
        print(f"| {names[kind]} | {r['turn']:.2f} | {r['get_tuple']:.2f} | "
              f"{r['cold_get_tuple']:.1f} | {r['list10']:.1f} | {r['cold_list10']:.1f} | "
              f"{r['list_all']:.0f} | "
              f"{r['rss']:.0f} MB | {r['bytes'] / 1e6:.1f} MB |")
    for ours, theirs in (("dsh", "sqlite"), ("dsh-postgres", "postgres")):
        if ours in rows and theirs in rows:
            a, b = rows[ours], rows[theirs]
            parts = [f"{key} {ratio(a[key], b[key], higher_is_better=False)}"
                     for key in ("turn", "get_tuple", "cold_get_tuple", "list10", "cold_list10",
                                 "list_all", "rss", "bytes")]
            print(f"| {names[ours]} vs {names[theirs]} | " + ", ".join(parts) + " |")


if __name__ == "__main__":
    main()

"""PostgreSQL beside SQLite, and beside LangGraph's PostgresSaver and Google ADK's
DatabaseSessionService on the same server, in one run (issue 13).

Run: ``python -m bench.bench_postgres [--events 100000] [--turns 300] [--runs 3]
[--small-turns 10] [--only all|open] [--peers all|langgraph,adk|none]
[--server postgresql://postgres@127.0.0.1:5432/postgres]
[--dir DIR]``.

The run creates a database ``dsh_bench_<random>`` on the server and drops it at the end.

* **append+flush**: a ``SessionStore`` bound to ``dsh.open(url)`` appends ``--events`` events
  of the ``msg`` workload (write-behind batches), then one flush. SQLite file vs PostgreSQL.
* **per-turn durable commit**: ``--turns`` turns of the ``msg`` workload (11 events, 4 on the
  surface), ``store.flush`` after every ``turn/end``: median and p95 ms per commit. Peers do
  the same conversation: LangGraph, a ``StateGraph(MessagesState)`` with one node answering,
  compiled with ``PostgresSaver``, one ``invoke`` per turn (user message in, assistant out,
  checkpointed); ADK, ``DatabaseSessionService`` on ``postgresql+psycopg``, a user event and a
  model event appended per turn.
* **the commit floor**: in the PostgreSQL per-turn run, after each turn's flush, one one-row
  ``INSERT`` on a connection of its own, its own durable commit (interleaved, so both see the
  same disk): what one WAL flush on this server costs, below which no durable per-turn commit
  can go (dsh's append of a turn is one statement: one round trip, one flush).
* **takeover after SIGKILL**: a holder process opens the session for writing (default lease,
  15 s) and appends; it is killed with SIGKILL and reaped; the figure is the time from the
  kill to the next writer's ``open(id, "write")`` returning in a process that already has the
  store open (same host: the dead holder's lease is taken over at once, docs/stores.md#takeover).
* **open + read** of a small session (``--small-turns``, default 10) and of the ``--turns``
  session: a fresh process imports the libraries, the driver included (timed apart, and
  printed), then opens the store, reads the session and closes (timed): ours
  ``with dsh.open(url) as store: store.read(id)`` (read only: no lease taken), and
  ``store.session(id)`` (the resume for writing: lease, read, then release at close);
  LangGraph ``with PostgresSaver.from_conn_string(url) as saver: saver.get_tuple(config)`` of
  a thread checkpointed by as many invokes. The ratio is LangGraph's time over ours (>= 1.0:
  ours is no slower). The client CPU rows are the same blocks' ``time.process_time`` (the
  process's own work, without the server's or the waits, steadier on a loaded machine).
* **cold load**: a fresh process imports the libraries (timed apart), then opens the store and
  loads the session (timed): ours
  ``dsh.open(url).persistence.load(id)`` + ``Session.restore`` of ``--events`` events and of the
  ``--turns`` session; LangGraph ``graph.get_state(config)``; ADK ``get_session``.

Each figure is the median of ``--runs`` fresh processes, the systems interleaved. Peers missing
from the environment are reported as not installed (extra ``bench-peers``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bench.bench_write import header_lines, medians, run_child, select, write_session
from bench.workloads import ANSWER, USER_TEXT, build, existing_dir, now_ms, peak_rss_mb

MODULE = "bench.bench_postgres"
PEERS = ("langgraph", "adk")
DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"


def _ours_url(kind: str, root: Path, pg: str, schema: str) -> str:
    return f"sqlite://{root}/store.db" if kind == "sqlite" else f"{pg}?schema={schema}"


def _drop_schema(pg: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(pg, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _per_turn_stats(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {"commit_median_ms": statistics.median(ordered),
            "commit_p95_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))],
            "total_ms": sum(ordered)}


# --- children: ours ----------------------------------------------------------------------------


def child_write(kind: str, events: int, pg: str, parent_dir: str | None) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="dsh-bench-pg-", dir=parent_dir))
    schema = f"w_{uuid.uuid4().hex[:10]}"
    try:
        out = write_session(_ours_url(kind, root, pg, schema), "msg", events)
        out.pop("flush_ms")
        out["rate"] = out["events"] / (out["total_ms"] / 1000)
        out["rss"] = peak_rss_mb()
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if kind == "postgresql":
            _drop_schema(pg, schema)


def child_turns(kind: str, turns: int, pg: str, parent_dir: str | None) -> dict[str, Any]:
    from dsh.persistence import Persistence, open_backend
    from dsh.session._store import SessionStore

    root = Path(tempfile.mkdtemp(prefix="dsh-bench-pg-", dir=parent_dir))
    schema = f"t_{uuid.uuid4().hex[:10]}"
    try:
        persistence = Persistence(open_backend(_ours_url(kind, root, pg, schema)))
        store = SessionStore(persistence=persistence)
        session = store.create("bench")
        from bench.workloads import msg_turn, start
        start(session)
        times, floor = [], []
        raw = _floor_table(pg, schema) if kind == "postgresql" else None
        for turn in range(1, turns + 1):
            t0 = now_ms()
            msg_turn(session, turn)
            store.flush(session)
            times.append(now_ms() - t0)
            if raw is not None:
                t0 = now_ms()
                raw.execute(f'INSERT INTO "{schema}".floor VALUES (1)')
                floor.append(now_ms() - t0)
        persistence.close()
        out = _per_turn_stats(times)
        if raw is not None:
            raw.close()
            f = _per_turn_stats(floor)
            out |= {"floor_median_ms": f["commit_median_ms"], "floor_p95_ms": f["commit_p95_ms"]}
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if kind == "postgresql":
            _drop_schema(pg, schema)


_HOLDER = """
import sys, time
from dsh.persistence import open_backend
from dsh.testing import make
backend = open_backend(sys.argv[1])
handle = backend.open("bench", "write")
handle.append([make("session/title", 0, {"title": "holder"})])
print("ready", flush=True)
time.sleep(600)
"""


def child_takeover(kind: str, pg: str, parent_dir: str | None) -> dict[str, Any]:
    import os
    import signal
    import subprocess
    import sys

    from dsh.persistence import open_backend
    from dsh.testing import header

    root = Path(tempfile.mkdtemp(prefix="dsh-bench-pg-", dir=parent_dir))
    schema = f"k_{uuid.uuid4().hex[:10]}"
    url = _ours_url(kind, root, pg, schema)
    backend = open_backend(url)
    try:
        backend.create(header("bench"))
        holder = subprocess.Popen([sys.executable, "-c", _HOLDER, url], stdout=subprocess.PIPE,
                                  text=True)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        t0 = now_ms()
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        with backend.open("bench", "write") as handle:
            took = now_ms() - t0
            epoch = getattr(handle, "epoch", None)
        assert holder.stdout is not None
        holder.stdout.close()
        return {"takeover_ms": took, "epoch": epoch or 0}
    finally:
        backend.close()
        shutil.rmtree(root, ignore_errors=True)
        if kind == "postgresql":
            _drop_schema(pg, schema)


def _floor_table(pg: str, schema: str) -> Any:
    """A connection of its own and a one-column table in ``schema`` for the commit floor."""
    import psycopg

    conn = psycopg.connect(pg, autocommit=True)
    conn.execute(f'CREATE TABLE "{schema}".floor (a integer)')
    return conn


def _imports(*modules: str) -> float:
    """Import ``modules``; return the ms it took (kept apart from the load figure)."""
    import importlib

    t0 = now_ms()
    for module in modules:
        importlib.import_module(module)
    return now_ms() - t0


def child_load(url: str, session_id: str) -> dict[str, Any]:
    # the driver too: the peers' import figures hold it
    import_ms = _imports("dsh.persistence", "dsh.session._session", "dsh.persistence._facade",
                         *(("dsh.persistence.postgres._backend", "psycopg")
                           if url.startswith("postgresql") else
                           ("dsh.persistence.sqlite._backend",)))
    from dsh.persistence import Persistence, open_backend
    from dsh.session._session import Session

    t0 = now_ms()
    persistence = Persistence(open_backend(url))
    loaded = persistence.load(session_id)
    session = Session.restore(session_id, loaded.events, loaded.header)
    load_ms = now_ms() - t0
    count = len(session.events)
    persistence.close()
    return {"load_ms": load_ms, "import_ms": import_ms, "events": count, "rss": peak_rss_mb()}


def child_open(url: str, session_id: str, how: str) -> dict[str, Any]:
    """Open the store, read (``read``) or resume (``resume``) one session, close; in ms."""
    import_ms = _imports("dsh", "dsh._store", "dsh.persistence.postgres._backend", "psycopg")
    import time

    import dsh

    t0, c0 = now_ms(), time.process_time()
    with dsh.open(url) as store:
        if how == "read":
            count = len(store.read(session_id).events)
        else:
            count = len(store.session(session_id).events)
    return {"open_ms": now_ms() - t0, "cpu_ms": (time.process_time() - c0) * 1000,
            "import_ms": import_ms, "events": count}


def child_langgraph_open(pg: str, thread: str) -> dict[str, Any]:
    """``PostgresSaver.get_tuple`` of ``thread`` on a fresh connection, closed; in ms."""
    import time

    import_ms = _imports("langgraph.checkpoint.postgres", "psycopg")
    from langgraph.checkpoint.postgres import PostgresSaver

    t0, c0 = now_ms(), time.process_time()
    with PostgresSaver.from_conn_string(pg) as saver:
        found = saver.get_tuple({"configurable": {"thread_id": thread}})
        assert found is not None
        count = len(found.checkpoint["channel_values"]["messages"])
    return {"open_ms": now_ms() - t0, "cpu_ms": (time.process_time() - c0) * 1000,
            "import_ms": import_ms, "events": count}


def seed_ours(kind: str, pg: str, root: Path, events: int | None, turns: int | None) -> str:
    """Write one session for the load runs; return its store URL."""
    from dsh.persistence import Persistence, open_backend
    from dsh.session._store import SessionStore

    schema = f"l_{uuid.uuid4().hex[:10]}"
    folder = root / schema
    folder.mkdir()
    url = _ours_url(kind, folder, pg, schema)
    persistence = Persistence(open_backend(url))
    store = SessionStore(persistence=persistence)
    session = store.create("bench")
    if events is not None:
        build(session, "msg", events)
    else:
        from bench.workloads import msg_turn, start
        start(session)
        for turn in range(1, (turns or 0) + 1):
            msg_turn(session, turn)
    store.flush(session)
    persistence.close()
    return url


# --- children: peers ---------------------------------------------------------------------------


def _langgraph_graph(pg: str) -> tuple[Any, Any]:
    from langchain_core.messages import AIMessage
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import START, MessagesState, StateGraph

    def answer(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content=ANSWER)]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", answer)
    builder.add_edge(START, "model")
    manager = PostgresSaver.from_conn_string(pg)
    saver = manager.__enter__()
    saver.setup()
    return builder.compile(checkpointer=saver), manager


def child_langgraph_turns(pg: str, turns: int, thread: str) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage

    graph, manager = _langgraph_graph(pg)
    config = {"configurable": {"thread_id": thread}}
    times = []
    for _ in range(turns):
        t0 = now_ms()
        graph.invoke({"messages": [HumanMessage(content=USER_TEXT)]}, config)
        times.append(now_ms() - t0)
    manager.__exit__(None, None, None)
    return _per_turn_stats(times)


def child_langgraph_load(pg: str, thread: str) -> dict[str, Any]:
    import_ms = _imports("langchain_core.messages", "langgraph.checkpoint.postgres",
                         "langgraph.graph")
    t0 = now_ms()
    graph, manager = _langgraph_graph(pg)
    state = graph.get_state({"configurable": {"thread_id": thread}})
    count = len(state.values["messages"])
    load_ms = now_ms() - t0
    manager.__exit__(None, None, None)
    return {"load_ms": load_ms, "import_ms": import_ms, "events": count, "rss": peak_rss_mb()}


def _adk_url(pg: str) -> str:
    return pg.replace("postgresql://", "postgresql+psycopg://", 1)


async def _adk_turns(pg: str, turns: int, sid: str) -> dict[str, Any]:
    from google.adk.events import Event
    from google.adk.sessions import DatabaseSessionService
    from google.genai import types

    service = DatabaseSessionService(db_url=_adk_url(pg))
    session = await service.create_session(app_name="bench", user_id="u", session_id=sid)
    times = []
    for _ in range(turns):
        t0 = now_ms()
        for author, role, text in (("user", "user", USER_TEXT), ("model", "model", ANSWER)):
            event = Event(author=author, invocation_id=str(uuid.uuid4()),
                          content=types.Content(role=role, parts=[types.Part(text=text)]))
            await service.append_event(session, event)
        times.append(now_ms() - t0)
    return _per_turn_stats(times)


async def _adk_load(pg: str, sid: str) -> dict[str, Any]:
    import_ms = _imports("google.adk.sessions", "sqlalchemy", "psycopg")
    from google.adk.sessions import DatabaseSessionService

    t0 = now_ms()
    service = DatabaseSessionService(db_url=_adk_url(pg))
    session = await service.get_session(app_name="bench", user_id="u", session_id=sid)
    load_ms = now_ms() - t0
    assert session is not None
    return {"load_ms": load_ms, "import_ms": import_ms, "events": len(session.events),
            "rss": peak_rss_mb()}


def peer_available(peer: str) -> bool:
    import importlib.util

    module = "langgraph.checkpoint.postgres" if peer == "langgraph" else "google.adk.sessions"
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def child(args: argparse.Namespace) -> dict[str, Any]:
    what, kind = args.what, args.kind
    if what == "write":
        return child_write(kind, args.events, args.pg, args.dir)
    if what == "turns" and kind in ("sqlite", "postgresql"):
        return child_turns(kind, args.turns, args.pg, args.dir)
    if what == "turns" and kind == "langgraph":
        return child_langgraph_turns(args.pg, args.turns, args.target)
    if what == "turns" and kind == "adk":
        return asyncio.run(_adk_turns(args.pg, args.turns, args.target))
    if what == "takeover":
        return child_takeover(kind, args.pg, args.dir)
    if what in ("read", "resume") and kind in ("sqlite", "postgresql"):
        return child_open(args.target, "bench", what)
    if what == "read" and kind == "langgraph":
        return child_langgraph_open(args.pg, args.target)
    if what == "load" and kind in ("sqlite", "postgresql"):
        return child_load(args.target, "bench")
    if what == "load" and kind == "langgraph":
        return child_langgraph_load(args.pg, args.target)
    if what == "load" and kind == "adk":
        return asyncio.run(_adk_load(args.pg, args.target))
    raise SystemExit(f"unknown child {what} {kind}")


# --- parent -------------------------------------------------------------------------------------


def _run(what: str, kind: str, args: argparse.Namespace, target: str = "",
         turns: int | None = None) -> dict[str, Any]:
    extra = ["--dir", args.dir] if args.dir else []
    return run_child(MODULE, ["--what", what, "--kind", kind, "--pg", args.pg, "--events",
                              str(args.events), "--turns", str(turns or args.turns), "--target",
                              target, *extra])


def _create_database(server: str) -> tuple[str, str]:
    import psycopg

    name = f"dsh_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = server.rsplit("/", 1)[0]
    return name, f"{base}/{name}"


def _drop_database(server: str, name: str) -> None:
    import psycopg

    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per cell")
    parser.add_argument("--small-turns", type=int, default=10,
                        help="turns of the small session opened beside PostgresSaver")
    parser.add_argument("--only", choices=("all", "open"), default="all",
                        help="open: only the open + read rows")
    parser.add_argument("--peers", default="all", help="all, none or langgraph,adk")
    parser.add_argument("--server", default=DEFAULT_SERVER)
    parser.add_argument("--dir", type=existing_dir, default=None,
                        help="where the temporary SQLite stores go")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--what", help=argparse.SUPPRESS)
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    parser.add_argument("--pg", help=argparse.SUPPRESS)
    parser.add_argument("--target", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    peers = [] if args.peers == "none" else select(args.peers, PEERS)
    from dsh.testing._stores import postgres_unreachable

    reason = postgres_unreachable(args.server)
    if reason is not None:
        raise SystemExit(f"bench_postgres needs a PostgreSQL server: {reason}")
    name, args.pg = _create_database(args.server)
    root = Path(tempfile.mkdtemp(prefix="dsh-bench-pg-seed-", dir=args.dir))
    try:
        report(args, peers, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        _drop_database(args.server, name)


def report(args: argparse.Namespace, peers: list[str], root: Path) -> None:
    present = [p for p in peers if peer_available(p)]
    if args.only == "open":
        header_lines(f"PostgreSQL open + read beside PostgresSaver (median of {args.runs} "
                     "fresh processes)")
        report_open(args, present, root)
        return
    report_all(args, peers, present, root)
    print()
    report_open(args, present, root)


def report_open(args: argparse.Namespace, present: list[str], root: Path) -> None:
    """The open + read rows: ours (read, resume) beside ``PostgresSaver.get_tuple``."""
    langgraph = "langgraph" in present
    sizes = (args.small_turns, args.turns)
    ours = {n: seed_ours("postgresql", args.pg, root, None, n) for n in sizes}
    if langgraph:
        for n in sizes:
            _run("turns", "langgraph", args, target=f"bench-open-{n}", turns=n)
    cells: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for _ in range(args.runs):
        for n in sizes:  # interleaved, so both see the same load
            for how in ("read", "resume"):
                cells.setdefault((how, n), []).append(_run(how, "postgresql", args,
                                                           target=ours[n]))
            if langgraph:
                cells.setdefault(("langgraph", n), []).append(
                    _run("read", "langgraph", args, target=f"bench-open-{n}"))
    print("| open + read in a fresh process, ms (imports apart) | dsh `store.read` | "
          "dsh `store.session` (resume) | LangGraph `get_tuple` | ratio LangGraph / dsh read |")
    print("|---|---|---|---|---|")
    for n in sizes:
        read = medians(cells[("read", n)])
        resume = medians(cells[("resume", n)])
        peer = medians(cells[("langgraph", n)]) if langgraph else None
        print(f"| {n}-turn session ({read['events']:,.0f} events / "
              f"{peer['events'] if peer else 0:,.0f} messages) | {read['open_ms']:.1f} | "
              f"{resume['open_ms']:.1f} | "
              + (f"{peer['open_ms']:.1f} | {peer['open_ms'] / read['open_ms']:.2f} |" if peer
                 else "— | — |"))
    for n in sizes:  # the client's own CPU: steadier than wall time on a loaded machine
        read = medians(cells[("read", n)])
        resume = medians(cells[("resume", n)])
        peer = medians(cells[("langgraph", n)]) if langgraph else None
        print(f"| {n}-turn session, client CPU ms | {read['cpu_ms']:.1f} | "
              f"{resume['cpu_ms']:.1f} | "
              + (f"{peer['cpu_ms']:.1f} | {peer['cpu_ms'] / read['cpu_ms']:.2f} |" if peer
                 else "— | — |"))
    read = medians(cells[("read", args.small_turns)])
    peer = medians(cells[("langgraph", args.small_turns)]) if langgraph else None
    print(f"| imports before it (dsh's store and PostgreSQL modules + psycopg; "
          f"langgraph.checkpoint.postgres + psycopg), ms | "
          f"{read['import_ms']:.0f} | {read['import_ms']:.0f} | "
          + (f"{peer['import_ms']:.0f} | — |" if peer else "— | — |"))
    if not langgraph:
        print("LangGraph PostgresSaver not installed (pip install 'dsh-session[bench-peers]').")


def report_all(args: argparse.Namespace, peers: list[str], present: list[str], root: Path
               ) -> None:
    ours = ("sqlite", "postgresql")
    write: dict[str, list[dict[str, Any]]] = {k: [] for k in ours}
    turns: dict[str, list[dict[str, Any]]] = {k: [] for k in (*ours, *present)}
    takeover: dict[str, list[dict[str, Any]]] = {k: [] for k in ours}

    for run in range(args.runs):
        for kind in ours:
            write[kind].append(_run("write", kind, args))
            takeover[kind].append(_run("takeover", kind, args))

        for kind in (*ours, *present):
            turns[kind].append(_run("turns", kind, args, target=f"bench-turns-{run}"))
    big = {k: seed_ours(k, args.pg, root, args.events, None) for k in ours}
    small = {k: seed_ours(k, args.pg, root, None, args.turns) for k in ours}
    load_big: dict[str, list[dict[str, Any]]] = {k: [] for k in ours}
    load_small: dict[str, list[dict[str, Any]]] = {k: [] for k in (*ours, *present)}
    for _ in range(args.runs):
        for kind in ours:
            load_big[kind].append(_run("load", kind, args, target=big[kind]))
            load_small[kind].append(_run("load", kind, args, target=small[kind]))
        for kind in present:
            load_small[kind].append(_run("load", kind, args, target="bench-turns-0"))

    header_lines(f"PostgreSQL beside SQLite and peers (median of {args.runs} fresh processes)")
    print(f"| measure | SQLite | PostgreSQL | {' | '.join(_label(p) for p in present)} |"
          if present else "| measure | SQLite | PostgreSQL |")
    print("|---" * (3 + len(present)) + "|")
    w = {k: medians(v) for k, v in write.items()}
    _row(f"append+flush {args.events:,} events, ms", [w[k]["total_ms"] for k in ours], present)
    _row(f"append+flush {args.events:,} events, events/s",
         [w[k]["rate"] for k in ours], present, fmt="{:,.0f}")
    t = {k: medians(v) for k, v in turns.items()}
    _row(f"per-turn durable commit, median ms ({args.turns} turns)",
         [t[k]["commit_median_ms"] for k in (*ours, *present)], [], fmt="{:.2f}")
    _row("per-turn durable commit, p95 ms",
         [t[k]["commit_p95_ms"] for k in (*ours, *present)], [], fmt="{:.2f}")
    floor = t["postgresql"]
    print(f"| the commit floor: a one-row INSERT commit after each turn, median / p95 ms | — | "
          f"{floor['floor_median_ms']:.2f} / {floor['floor_p95_ms']:.2f} |"
          + " — |" * len(present))
    k = {kind: medians(v) for kind, v in takeover.items()}
    _row("next writer in after SIGKILL of the holder (same host), ms",
         [k[kind]["takeover_ms"] for kind in ours], present, fmt="{:.1f}")
    lb = {k: medians(v) for k, v in load_big.items()}
    _row(f"cold load {args.events:,} events, ms", [lb[k]["load_ms"] for k in ours], present)
    _row(f"cold load {args.events:,} events, peak RSS MB", [lb[k]["rss"] for k in ours], present)
    ls = {k: medians(v) for k, v in load_small.items()}
    _row(f"cold load of the {args.turns}-turn session, ms",
         [ls[k]["load_ms"] for k in (*ours, *present)], [], fmt="{:.1f}")
    _row("imports before the load (not in the load figure), ms",
         [ls[k]["import_ms"] for k in (*ours, *present)], [], fmt="{:.0f}")
    _row("items loaded (events / messages)",
         [ls[k]["events"] for k in (*ours, *present)], [], fmt="{:,.0f}")
    missing = [p for p in peers if p not in present]
    print()
    print(f"A turn is 11 dsh events (4 on the surface); LangGraph checkpoints a user and an "
          f"assistant message per invoke, ADK appends a user and a model event. "
          f"Peers run only the per-turn and load rows ({args.turns} turns).")
    if missing:
        print(f"Not installed (pip install 'dsh-session[bench-peers]'): "
              f"{', '.join(_label(p) for p in missing)}.")


def _label(peer: str) -> str:
    return "LangGraph PostgresSaver" if peer == "langgraph" else "ADK DatabaseSessionService"


def _row(label: str, values: list[float], blank: list[str], fmt: str = "{:,.0f}") -> None:
    cells = [fmt.format(v) for v in values] + ["—"] * len(blank)
    print(f"| {label} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()

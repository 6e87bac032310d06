"""LangGraph checkpointers: DshSaver beside SqliteSaver (and PostgresSaver), one process each.

A thread of ``--turns`` turns is written the way a chat graph with an ``add_messages`` state
writes it: per turn an input checkpoint (the user's message added), the model task's pending
write, and a loop checkpoint (the answer added), each checkpoint carrying the whole ``messages``
list as LangGraph hands it over. Reported per saver, in a fresh process each: the median time of
one turn's writes over the last 100 turns, ``get_tuple`` of the latest checkpoint (warm: the
same saver; cold: a new saver in a new process), ``list(limit=10)`` (warm, and cold in
another new process), a full ``list`` of the
thread, peak RSS of the writing process, and bytes on disk after the thread.

Run: ``python -m bench.bench_saver [--turns 1000]`` (the adapters bench runs it too).
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
from pathlib import Path
from typing import Any

from bench.workloads import now_ms, peak_rss_mb

SAVERS = ("dsh", "sqlite", "postgres")


def _saver(kind: str, root: Path, pg: str | None) -> Any:
    if kind.startswith("dsh"):  # the store imports its backend lazily: time the reads only
        import dsh.persistence._facade
        import dsh.persistence.postgres._backend
        import dsh.persistence.sqlite._backend  # noqa: F401
    if kind == "dsh":
        from dsh.adapters.langgraph import DshSaver
        return DshSaver.from_url(f"sqlite:///{root / 'dsh.db'}")
    if kind == "dsh-postgres":
        from dsh.adapters.langgraph import DshSaver
        assert pg is not None
        return DshSaver.from_url(pg)
    if kind == "sqlite":
        import sqlite3

        from langgraph.checkpoint.sqlite import SqliteSaver
        conn = sqlite3.connect(root / "lg.db", check_same_thread=False)
        saver = SqliteSaver(conn)
        saver.setup()
        return saver
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row
    assert pg is not None
    conn = psycopg.connect(pg, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    saver = PostgresSaver(conn)  # type: ignore[arg-type]
    saver.setup()
    return saver


def _close(saver: Any) -> None:
    if hasattr(saver, "close"):
        saver.close()
    elif hasattr(saver, "conn"):
        saver.conn.close()


def _turn(saver: Any, thread: str, n: int, state: dict[str, Any]) -> None:
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint

    def put(messages: list[Any], source: str, step: int) -> None:
        previous = state.get("checkpoint") or empty_checkpoint()
        version = saver.get_next_version(previous["channel_versions"].get("messages"), None)
        checkpoint = create_checkpoint(previous, None, step)
        checkpoint["channel_values"] = {"messages": messages}
        checkpoint["channel_versions"] = {"messages": version}
        checkpoint["versions_seen"] = {"model": {"messages": version}}
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": "",
                                   **({"checkpoint_id": previous["id"]}
                                      if state.get("checkpoint") else {})}}
        state["config"] = saver.put(config, checkpoint, {"source": source, "step": step,
                                                         "parents": {}},
                                    {"messages": version})
        state["checkpoint"] = checkpoint

    text = f"Turn {n}: what does src/module_{n}.py define, and is it tested? " * 3
    human = HumanMessage(text, id=f"h{n}")
    messages = [*state.get("messages", []), human]
    put(messages, "input", 2 * n)
    answer = AIMessage(f"module_{n} defines f_{n}; tests/test_{n}.py covers it. " * 3,
                       id=f"a{n}", response_metadata={"model_name": "gpt-test",
                                                      "model_provider": "openai"})
    saver.put_writes(state["config"], [("messages", [answer])], f"task-{n}", "~model")
    messages = [*messages, answer]
    put(messages, "loop", 2 * n + 1)
    state["messages"] = messages


def _size(root: Path, kind: str, pg: str | None) -> int:
    if kind in ("dsh", "sqlite"):
        return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    import psycopg

    from dsh.testing._stores import postgres_base_url
    assert pg is not None
    with psycopg.connect(pg if kind == "postgres" else postgres_base_url()) as conn:
        if kind == "postgres":
            query = ("select sum(pg_total_relation_size(c.oid)) from pg_class c join pg_namespace"
                     " n on n.oid = c.relnamespace where n.nspname = current_schema() and "
                     "c.relkind = 'r' and c.relname like 'checkpoint%'")
        else:
            query = ("select sum(pg_total_relation_size(c.oid)) from pg_class c join pg_namespace"
                     " n on n.oid = c.relnamespace where c.relkind = 'r' and n.nspname = %s")
        row = conn.execute(query, *(() if kind == "postgres" else ((_schema(pg),),))).fetchone()
    return int(row[0] or 0) if row else 0


def _schema(pg: str) -> str:
    from urllib.parse import parse_qs, urlsplit
    return parse_qs(urlsplit(pg).query).get("schema", ["public"])[0]


def child(kind: str, root: Path, turns: int, phase: str, pg: str | None) -> dict[str, float]:
    import gc
    saver = _saver(kind, root, pg)
    config = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
    out: dict[str, float] = {}
    if phase == "write":
        state: dict[str, Any] = {}
        per_turn = []
        gc.collect()
        for n in range(turns):
            t0 = now_ms()
            _turn(saver, "bench", n, state)
            per_turn.append(now_ms() - t0)
        out["turn"] = statistics.median(per_turn[-100:])
        t0 = now_ms()
        latest = saver.get_tuple(config)
        out["get_tuple"] = now_ms() - t0
        assert latest is not None and len(latest.checkpoint["channel_values"]["messages"]) \
            == 2 * turns
        t0 = now_ms()
        listed = list(saver.list(config, limit=10))
        out["list10"] = now_ms() - t0
        assert len(listed) == 10
        t0 = now_ms()
        every = list(saver.list(config))
        out["list_all"] = now_ms() - t0
        assert len(every) == 2 * turns
        out["rss"] = peak_rss_mb()
        _close(saver)
        out["bytes"] = float(_size(root, kind, pg))
    elif phase == "list":
        t0 = now_ms()
        listed = list(saver.list(config, limit=10))
        out["cold_list10"] = now_ms() - t0
        assert len(listed) == 10
        _close(saver)
    else:
        t0 = now_ms()
        latest = saver.get_tuple(config)
        out["cold_get_tuple"] = now_ms() - t0
        assert latest is not None
        assert len(latest.checkpoint["channel_values"]["messages"]) == 2 * turns
        _close(saver)
    return out


def run_child(kind: str, root: Path, turns: int, phase: str, pg: str | None
              ) -> dict[str, float]:
    argv = [sys.executable, "-m", "bench.bench_saver", "--child", kind, "--root", str(root),
            "--turns", str(turns), "--phase", phase]
    if pg:
        argv += ["--pg", pg]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out)
    return result


def _pg_url(kind: str) -> str | None:
    """A fresh PostgreSQL schema URL for the kind, or None without a server.

    The schema is named ``$DSH_BENCH_POSTGRES_SCHEMA_PREFIX`` (default ``bench_``) and ten hex
    digits, so that benches run side by side on one server can each keep to a prefix.
    """
    from dsh.testing._stores import postgres_base_url, postgres_unreachable
    if postgres_unreachable() is not None:
        return None
    import uuid
    prefix = os.environ.get("DSH_BENCH_POSTGRES_SCHEMA_PREFIX", "bench_")
    schema = f"{prefix}{uuid.uuid4().hex[:10]}"
    import psycopg
    with psycopg.connect(postgres_base_url(), autocommit=True) as conn:
        conn.execute(f"create schema {schema}")
    base = postgres_base_url()
    if kind == "postgres":
        return f"{base}{'&' if '?' in base else '?'}options=-csearch_path%3D{schema}"
    return f"{base}{'&' if '?' in base else '?'}schema={schema}"


def _drop(url: str | None) -> None:
    if not url:
        return
    import psycopg

    from dsh.testing._stores import postgres_base_url
    schema = _schema(url) if "schema=" in url else url.rsplit("%3D", 1)[-1]
    with psycopg.connect(postgres_base_url(), autocommit=True) as conn:
        conn.execute(f"drop schema if exists {schema} cascade")


def compare(turns: int, runs: int) -> list[tuple[str, dict[str, float]]]:
    """Median figures of each saver (those that can run here), in SAVERS order."""
    rows = []
    pairs = [("dsh", "sqlite"), ("dsh-postgres", "postgres")]
    for ours, theirs in pairs:
        results: dict[str, list[dict[str, float]]] = {ours: [], theirs: []}
        for _ in range(runs):
            for kind in (ours, theirs):
                root = Path(tempfile.mkdtemp(prefix="bench-saver-"))
                pg = _pg_url(kind) if "postgres" in kind else None
                if "postgres" in kind and pg is None:
                    shutil.rmtree(root, ignore_errors=True)
                    break
                try:
                    written = run_child(kind, root, turns, "write", pg)
                    written.update(run_child(kind, root, turns, "read", pg))
                    written.update(run_child(kind, root, turns, "list", pg))
                    results[kind].append(written)
                finally:
                    shutil.rmtree(root, ignore_errors=True)
                    _drop(pg)
        for kind in (ours, theirs):
            if results[kind]:
                rows.append((kind, {key: statistics.median(r[key] for r in results[kind])
                                    for key in results[kind][0]}))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--root", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--phase", default="write", help=argparse.SUPPRESS)
    parser.add_argument("--pg", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
        print(json.dumps(child(args.child, Path(args.root), args.turns, args.phase, args.pg)))
        return
    for kind, r in compare(args.turns, args.runs):
        print(kind, json.dumps(r))


if __name__ == "__main__":
    main()

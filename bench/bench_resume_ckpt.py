"""O(tail) resume through the restore point: a 100k and a 1M-event msg session.

Run: ``python -m bench.bench_resume_ckpt [--sizes 100000,1000000] [--runs 5]
[--backend jsonl-packed,sqlite] [--cache /tmp/dsh-bench-ckpt] [--full-read-up-to 100000]
[--uncompacted] [--server postgresql://postgres@127.0.0.1:5432/postgres] [--no-derive]
[--before DIR]``.

Each session is written by the write path (``SessionStore`` + write-behind, a flush every 50
turns) with the msg workload of ``../shared/bench/WORKLOADS.md``; like a real agent it compacts
under context pressure: after a turn, when the surface estimate passes 80% of a 32k-token
window, ``compact_now`` (digest summarizer) keeps the newest 16%; with ``--uncompacted`` it
never compacts (a framework session: the surface spans the whole log). Two variants: ``balanced``
(the last turn closed) and ``open`` (it ends inside a turn with an unanswered tool call, so the
resume writes closers). Stores are built once and cached under ``--cache`` keyed by their
parameters (never in CI); each measured run resumes a fresh copy in a fresh process.

A child reports: ``resume_ms`` (``dsh.open`` + ``SessionStore.resume``: ownership, restore point
check, tail read, closers written, published), ``open_ms`` (the ``dsh.open`` part), ``rss_mb``
(peak RSS minus the RSS of the same interpreter with dsh, the backend module and, for
PostgreSQL, the psycopg driver imported before the clock, before the resume),
``derive_ms`` (the first ``derive_messages``), ``resume_cpu_ms`` and ``derive_cpu_ms``
(``time.process_time`` of the same spans: steadier than wall time on a loaded machine),
``derive_rss_mb`` (peak RSS above idle after it),
``paged`` (whether the restore point was used), ``tail`` (events read after the restore point's
cut, closers and end-seed included). With ``--full-read-up-to N`` sessions up to N events are
also resumed with the restore point removed (the full read), for comparison. The ``postgres``
backend (not in ``all``) builds in a schema of its own on ``--server``; its runs resume the one
stored session in turn (the first run commits an open turn's closers, later runs resume the
repaired log). ``--no-derive`` skips the first derive (the resume's figures only: a 1M
derive takes seconds). ``--before DIR`` also resumes each copy with the code of another
checkout (``DIR/src`` first on ``PYTHONPATH``), alternating with this one run by run, and
prints its row above this one's (``before`` / ``after``): on a loaded machine only figures
taken side by side compare.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_write import header_lines, medians, run_child, select, store_url
from bench.workloads import existing_dir, msg_turn, now_ms, start

BACKENDS = ("jsonl-packed", "jsonl-zstd", "sqlite")
CONTEXT_WINDOW = 32_000
FLUSH_EVERY_TURNS = 50
SESSION_ID = "bench"
_CACHE_VERSION = 1
SCHEMA_PREFIX = "bench_ckpt_"  # --schema-prefix: helpers sharing one server keep apart


def _rss_mb(field: str) -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def build(url: str, events: int, *, open_turn: bool, compact: bool = True) -> dict[str, Any]:
    """Write one msg session of at least ``events`` events; return build facts.

    ``compact``: compact under context pressure (else the surface spans the whole log).
    """
    import dsh
    from dsh.compaction import CompactionPolicy, DigestSummarizer, compact_now, measure_surface

    policy = CompactionPolicy()
    threshold = policy.threshold_tokens(CONTEXT_WINDOW)
    retain = policy.retain_budget(CONTEXT_WINDOW)
    summarizer = DigestSummarizer()
    compactions = 0
    t0 = now_ms()
    with dsh.open(url) as opened:
        store = opened.sessions
        session = store.create(SESSION_ID)
        start(session)
        turn = 0
        while session.seq < events:
            turn += 1
            msg_turn(session, turn)
            if compact and measure_surface(session).total_tokens > threshold:
                compact_now(session, summarizer=summarizer, retain_tokens=retain)
                compactions += 1
            if turn % FLUSH_EVERY_TURNS == 0:
                store.flush(session)
        if open_turn:
            turn += 1
            session.append("turn/start", {"turn": turn})
            session.append("step/start", {"turn": turn, "step": 1})
            session.append("assistant/message", {"turn": turn, "step": 1, "message": {
                "id": f"open-{turn}", "role": "assistant", "source": {
                    "kind": "model", "provider": "deepseek", "model": "deepseek-chat"},
                "content": [{"type": "tool-call", "id": "call_open", "name": "read_file",
                             "arguments": "{}"}]}}, surface_op="append")
        store.flush(session)
        facts = {"events": session.seq, "surface": len(session.surface.nodes),
                 "compactions": compactions, "build_s": (now_ms() - t0) / 1000}
    return facts


def child(url: str, *, derive: bool = True) -> dict[str, Any]:
    import dsh
    from dsh.persistence import _restore_point as rp
    from dsh.session._paging import PagedLog

    importlib.import_module("dsh.persistence._facade")
    for module in _backend_modules(url):
        importlib.import_module(module)
    idle = _rss_mb("VmRSS")
    c0 = time.process_time()
    t0 = now_ms()
    store = dsh.open(url)
    t_open = now_ms()
    session = store.sessions.resume(SESSION_ID)  # as before: no exists() look first
    t1 = now_ms()
    c1 = time.process_time()
    rss = _rss_mb("VmHWM") - idle
    messages = session.derive_messages() if derive else ()
    t2 = now_ms()
    c2 = time.process_time()
    result = {"resume_ms": t1 - t0, "open_ms": t_open - t0, "rss_mb": rss, "derive_ms": t2 - t1,
              "resume_cpu_ms": (c1 - c0) * 1000, "derive_cpu_ms": (c2 - c1) * 1000,
              "derive_rss_mb": _rss_mb("VmHWM") - idle,
              "events": len(session.events), "messages": len(messages),
              "paged": int(isinstance(session._log, PagedLog)),
              "tail": len(session.events) - (session._log.cut
                                             if isinstance(session._log, PagedLog) else 0),
              "refused": sum(v for k, v in rp.stats.items() if k == "refused")}
    store.close()
    return result


def _backend_modules(url: str) -> tuple[str, ...]:
    """What the child imports before its clock: the backend module, and PostgreSQL's driver
    (as bench_postgres times imports apart: the resume, not the import of psycopg)."""
    if url.startswith("sqlite"):
        return ("dsh.persistence.sqlite._backend",)
    if url.startswith("postgresql"):
        return ("dsh.persistence.postgres._backend", "psycopg")
    return ("dsh.persistence.jsonl._backend",)


def _url(backend: str, root: Path, server: str) -> str:
    """The store URL of a build or run folder; PostgreSQL: a schema named after the folder."""
    if backend != "postgres":
        return store_url(backend, root)
    schema = SCHEMA_PREFIX + "".join(c if c.isalnum() else "_" for c in root.name).lower()
    return f"{server}?schema={schema}"


def _cached(cache: Path, backend: str, size: int, variant: str, *, compact: bool,
            server: str) -> tuple[Path, dict[str, Any]]:
    kind = "msg" if compact else "msg-uncompacted"
    root = cache / f"v{_CACHE_VERSION}-{backend}-{kind}-{size}-{variant}-w{CONTEXT_WINDOW}"
    facts_file = root / "facts.json"
    if not facts_file.is_file():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        if backend == "postgres":
            _drop_schema(_url(backend, root, server))
        facts = build(_url(backend, root, server), size, open_turn=variant == "open",
                      compact=compact)
        facts_file.write_text(json.dumps(facts))
    facts: dict[str, Any] = json.loads(facts_file.read_text())
    return root, facts


def _drop_schema(url: str) -> None:
    import psycopg

    server, _, query = url.partition("?schema=")
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{query}" CASCADE')


def _take_restore_points(url: str) -> list[tuple[str, bytes]]:
    """Remove the schema's restore points (a full-read run); return them for later."""
    import psycopg

    server, _, schema = url.partition("?schema=")
    with psycopg.connect(server, autocommit=True) as conn:
        return [(sid, bytes(data)) for sid, data in conn.execute(
            f'DELETE FROM "{schema}".restore_points RETURNING session_id, data').fetchall()]


def _put_restore_points(url: str, rows: list[tuple[str, bytes]]) -> None:
    import psycopg

    server, _, schema = url.partition("?schema=")
    with psycopg.connect(server, autocommit=True) as conn:
        for sid, data in rows:
            conn.execute(f'INSERT INTO "{schema}".restore_points VALUES (%s, %s) '
                         "ON CONFLICT (session_id) DO UPDATE SET data = excluded.data",
                         (sid, data))


def _child_args(url: str, derive: bool) -> list[str]:
    return ["--url", url, *(() if derive else ("--no-derive",))]


def _run_pair(url: str, derive: bool, before: Path | None,
              out: list[dict[str, Any]], out_before: list[dict[str, Any]]) -> None:
    """One child of ``before``'s code (when given) on a copy, then one of this code."""
    if before is not None:
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(before / "src"), *(() if old is None else (old,))])
        try:
            out_before.append(run_child("bench.bench_resume_ckpt", _child_args(url, derive)))
        finally:
            if old is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = old
    out.append(run_child("bench.bench_resume_ckpt", _child_args(url, derive)))


def _runs(master: Path, backend: str, runs: int, *, restore_point: bool,
          server: str, derive: bool = True, before: Path | None = None,
          out_before: list[dict[str, Any]] | None = None) -> dict[str, float]:
    """Median child figures of ``runs`` resumes of copies of ``master``.

    With ``before``, each run first resumes a copy with that checkout's code, its results
    appended to ``out_before``.
    """
    out: list[dict[str, Any]] = []
    kept = out_before if out_before is not None else []
    if backend == "postgres":
        # no cheap copy of a schema: every run resumes the stored session in turn (the first
        # run commits an open turn's closers; later runs resume the repaired log)
        url = _url(backend, master, server)
        saved = [] if restore_point else _take_restore_points(url)
        try:
            for _ in range(runs):
                _run_pair(url, derive, before, out, kept)
        finally:
            _put_restore_points(url, saved)
        return medians(out)
    for i in range(runs):
        copies = [master.parent / f"{master.name}.run{i}{side}"
                  for side in (("b", "") if before is not None else ("",))]
        for run_root in copies:
            shutil.rmtree(run_root, ignore_errors=True)
            shutil.copytree(master, run_root)
            if not restore_point:
                for path in run_root.rglob("*.ckpt"):
                    path.unlink()
        # the copy on disk, as a log is after a restart: else the resume's first fsync (the
        # closers of an open turn) writes back the whole copied file (~80 ms at 1M events)
        os.sync()
        try:
            if before is not None:
                _run_pair(_url(backend, copies[0], server), derive, before, [], kept)
            _run_pair(_url(backend, copies[-1], server), derive, None, out, kept)
        finally:
            for run_root in copies:
                shutil.rmtree(run_root, ignore_errors=True)
    return medians(out)


def _set_schema_prefix(prefix: str) -> None:
    global SCHEMA_PREFIX  # one run, one prefix
    SCHEMA_PREFIX = prefix


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--backend", default="all",
                        help=f"all or {', '.join(BACKENDS)}")
    parser.add_argument("--variants", default="balanced,open")
    parser.add_argument("--cache", default="/tmp/dsh-bench-ckpt")
    parser.add_argument("--dir", type=existing_dir, default=None,
                        help="build into a temporary folder here instead of the cache (removed)")
    parser.add_argument("--full-read-up-to", type=int, default=100_000)
    parser.add_argument("--uncompacted", action="store_true",
                        help="sessions that never compact (the surface spans the whole log)")
    parser.add_argument("--server", default="postgresql://postgres@127.0.0.1:5432/postgres",
                        help="PostgreSQL server of the postgres backend")
    parser.add_argument("--schema-prefix", default=SCHEMA_PREFIX,
                        help="prefix of the postgres backend's schema names")
    parser.add_argument("--no-derive", action="store_true",
                        help="skip the first derive_messages (resume figures only)")
    parser.add_argument("--before", type=existing_dir, default=None,
                        help="a checkout whose code also resumes each copy, alternating")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.url, derive=not args.no_derive)))
        return
    _set_schema_prefix(args.schema_prefix)
    temporary = Path(tempfile.mkdtemp(prefix="dsh-bench-ckpt-", dir=args.dir)) \
        if args.dir else None
    cache = temporary or Path(args.cache)
    try:
        rows = _measure(args, cache)
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    _print(rows, args.runs, uncompacted=args.uncompacted)


Row = tuple[str, int, str, dict[str, Any], dict[str, float], dict[str, float] | None]
"""backend, size, variant, build facts, through the restore point, full read (or None);
the variant ends in `` before`` for a ``--before`` checkout's row."""


def _measure(args: argparse.Namespace, cache: Path) -> list[Row]:
    rows: list[Row] = []
    backends = list(BACKENDS) if args.backend == "all" else select(args.backend,
                                                                   [*BACKENDS, "postgres"])
    for backend in backends:
        for size in (int(s) for s in args.sizes.split(",")):
            for variant in args.variants.split(","):
                master, facts = _cached(cache, backend, size, variant,
                                        compact=not args.uncompacted, server=args.server)
                kept: list[dict[str, Any]] = []
                paged = _runs(master, backend, args.runs, restore_point=True,
                              server=args.server, derive=not args.no_derive,
                              before=Path(args.before) if args.before else None,
                              out_before=kept)
                full = (_runs(master, backend, max(1, args.runs // 2), restore_point=False,
                              server=args.server, derive=not args.no_derive)
                        if size <= args.full_read_up_to else None)
                if kept:
                    rows.append((backend, size, f"{variant} before", facts, medians(kept),
                                 None))
                rows.append((backend, size, variant, facts, paged, full))
    return rows


def _print(rows: list[Row], runs: int, *, uncompacted: bool) -> None:
    kind = "uncompacted sessions" if uncompacted else "compacting sessions"
    header_lines(f"resume through the restore point, {kind} (median of {runs} fresh "
                 "processes)")
    print("| backend | events | variant | surface nodes | compactions | tail read | resume ms "
          "| resume CPU ms | of which dsh.open ms "
          "| RSS above idle MB | first derive ms | first derive CPU ms | RSS after derive MB "
          "| restore point used "
          "| full-read resume ms | full-read RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for backend, _size, variant, facts, paged, full in rows:
        full_ms = f"{full['resume_ms']:.0f}" if full else "-"
        full_rss = f"{full['rss_mb']:.0f}" if full else "-"
        print(f"| {backend} | {facts['events']:,} | {variant} | {facts['surface']} | "
              f"{facts['compactions']} | {paged['tail']:.0f} | {paged['resume_ms']:.1f} | "
              f"{paged['resume_cpu_ms']:.1f} | {paged['open_ms']:.1f} | "
              f"{paged['rss_mb']:.1f} | "
              f"{paged['derive_ms']:.1f} | {paged['derive_cpu_ms']:.0f} | "
              f"{paged['derive_rss_mb']:.0f} | "
              f"{'yes' if paged['paged'] == 1 else 'NO'} | "
              f"{full_ms} | {full_rss} |")


if __name__ == "__main__":
    main()

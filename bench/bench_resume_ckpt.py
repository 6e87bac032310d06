"""O(tail) resume through the restore point: a 100k and a 1M-event msg session.

Run: ``python -m bench.bench_resume_ckpt [--sizes 100000,1000000] [--runs 5]
[--backend jsonl-packed,sqlite] [--cache /tmp/dsh-bench-ckpt] [--full-read-up-to 100000]``.

Each session is written by the write path (``SessionStore`` + write-behind, a flush every 50
turns) with the msg workload of ``../shared/bench/WORKLOADS.md``; like a real agent it compacts
under context pressure: after a turn, when the surface estimate passes 80% of a 32k-token
window, ``compact_now`` (digest summarizer) keeps the newest 16%. Two variants: ``balanced``
(the last turn closed) and ``open`` (it ends inside a turn with an unanswered tool call, so the
resume writes closers). Stores are built once and cached under ``--cache`` keyed by their
parameters (never in CI); each measured run resumes a fresh copy in a fresh process.

A child reports: ``resume_ms`` (``dsh.open`` + ``SessionStore.resume``: ownership, restore point
check, tail read, closers written, published), ``rss_mb`` (peak RSS minus the RSS of the same
interpreter with dsh imported, before the resume), ``derive_ms`` (the first
``derive_messages``), ``paged`` (whether the restore point was used), ``tail`` (events read
after the restore point's cut, closers and end-seed included). With ``--full-read-up-to N``
sessions up to N events are also resumed with the restore point removed (the full read), for
comparison.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench.bench_write import header_lines, medians, run_child, select, store_url
from bench.workloads import existing_dir, msg_turn, now_ms, start

BACKENDS = ("jsonl-packed", "jsonl-zstd", "sqlite")
CONTEXT_WINDOW = 32_000
FLUSH_EVERY_TURNS = 50
SESSION_ID = "bench"
_CACHE_VERSION = 1


def _rss_mb(field: str) -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def build(url: str, events: int, *, open_turn: bool) -> dict[str, Any]:
    """Write one compacting msg session of at least ``events`` events; return build facts."""
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
            if measure_surface(session).total_tokens > threshold:
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


def child(url: str) -> dict[str, Any]:
    import dsh
    from dsh.persistence import _restore_point as rp
    from dsh.session._paging import PagedLog

    importlib.import_module("dsh.persistence._facade")
    importlib.import_module("dsh.persistence.sqlite._backend" if url.startswith("sqlite")
                            else "dsh.persistence.jsonl._backend")
    idle = _rss_mb("VmRSS")
    t0 = now_ms()
    store = dsh.open(url)
    session = store.sessions.resume(SESSION_ID)  # as before: no exists() look first
    t1 = now_ms()
    rss = _rss_mb("VmHWM") - idle
    messages = session.derive_messages()
    t2 = now_ms()
    result = {"resume_ms": t1 - t0, "rss_mb": rss, "derive_ms": t2 - t1,
              "events": len(session.events), "messages": len(messages),
              "paged": int(isinstance(session._log, PagedLog)),
              "tail": len(session.events) - (session._log.cut
                                             if isinstance(session._log, PagedLog) else 0),
              "refused": sum(v for k, v in rp.stats.items() if k == "refused")}
    store.close()
    return result


def _cached(cache: Path, backend: str, size: int, variant: str) -> tuple[Path, dict[str, Any]]:
    root = cache / f"v{_CACHE_VERSION}-{backend}-msg-{size}-{variant}-w{CONTEXT_WINDOW}"
    facts_file = root / "facts.json"
    if not facts_file.is_file():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        facts = build(store_url(backend, root), size, open_turn=variant == "open")
        facts_file.write_text(json.dumps(facts))
    facts: dict[str, Any] = json.loads(facts_file.read_text())
    return root, facts


def _runs(master: Path, backend: str, runs: int, *, restore_point: bool) -> dict[str, float]:
    out = []
    for i in range(runs):
        run_root = master.parent / f"{master.name}.run{i}"
        shutil.rmtree(run_root, ignore_errors=True)
        shutil.copytree(master, run_root)
        if not restore_point:
            for path in run_root.rglob("*.ckpt"):
                path.unlink()
        # the copy on disk, as a log is after a restart: else the resume's first fsync (the
        # closers of an open turn) writes back the whole copied file (~80 ms at 1M events)
        os.sync()
        try:
            out.append(run_child("bench.bench_resume_ckpt", ["--url",
                                                             store_url(backend, run_root)]))
        finally:
            shutil.rmtree(run_root, ignore_errors=True)
    return medians(out)


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
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.url)))
        return
    temporary = Path(tempfile.mkdtemp(prefix="dsh-bench-ckpt-", dir=args.dir)) \
        if args.dir else None
    cache = temporary or Path(args.cache)
    try:
        rows = _measure(args, cache)
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    _print(rows, args.runs)


Row = tuple[str, int, str, dict[str, Any], dict[str, float], dict[str, float] | None]


def _measure(args: argparse.Namespace, cache: Path) -> list[Row]:
    rows: list[Row] = []
    for backend in select(args.backend, list(BACKENDS)):
        for size in (int(s) for s in args.sizes.split(",")):
            for variant in args.variants.split(","):
                master, facts = _cached(cache, backend, size, variant)
                paged = _runs(master, backend, args.runs, restore_point=True)
                full = (_runs(master, backend, max(1, args.runs // 2), restore_point=False)
                        if size <= args.full_read_up_to else None)
                rows.append((backend, size, variant, facts, paged, full))
    return rows


def _print(rows: list[Row], runs: int) -> None:
    header_lines(f"resume through the restore point (median of {runs} fresh "
                 "processes)")
    print("| backend | events | variant | surface nodes | compactions | tail read | resume ms "
          "| RSS above idle MB | first derive ms | restore point used | full-read resume ms "
          "| full-read RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for backend, _size, variant, facts, paged, full in rows:
        full_ms = f"{full['resume_ms']:.0f}" if full else "-"
        full_rss = f"{full['rss_mb']:.0f}" if full else "-"
        print(f"| {backend} | {facts['events']:,} | {variant} | {facts['surface']} | "
              f"{facts['compactions']} | {paged['tail']:.0f} | {paged['resume_ms']:.1f} | "
              f"{paged['rss_mb']:.1f} | "
              f"{paged['derive_ms']:.1f} | {'yes' if paged['paged'] == 1 else 'NO'} | "
              f"{full_ms} | {full_rss} |")


if __name__ == "__main__":
    main()

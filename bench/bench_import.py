"""Import throughput: transcripts of other agents to validated dsh Sessions (and a SQLite store).

Run: ``python -m bench.bench_import [--events 100000] [--top 5] [--runs 5] [--no-store]
[--dir DIR]``.

Inputs: the ``--top`` largest data files of the corpus (``tests/corpus``, or ``$DSH_SHARED/corpus``
when that is set; Claude Code ``subagents/`` files are imported as children of their main file, not
on their own), and a synthetic Claude Code transcript generated into a temporary directory, sized
so that the import yields at least ``--events`` dsh events. Its lines are shaped like the corpus's
Claude Code files: a user prompt, the assistant's reply split into one line per content block
(text, then ``tool_use``) under one message id, a user line carrying the ``tool_result`` (with
``toolUseResult``), and an assistant answer; every line has ``uuid``, ``parentUuid`` (the previous
line), ``sessionId``, ``cwd``, ``timestamp`` and ``version``.

Each run is a fresh process that times, the way ``dsh import`` does it: ``detect_format``, then
``dsh.interop.import_file(path, format)``, then ``ImportedSession.to_session()`` for the session
and every child (seed validation), then (unless ``--no-store``) writing every session into a
fresh SQLite store (``Persistence.create`` + one handle ``append`` + ``flush``). Throughput is
dsh events (and source MB) per second of detect + import + build. dsh publishes no import figure.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.bench_write import dir_bytes, fmt_rate, header_lines, medians, run_child
from bench.workloads import ANSWER, TOOL_OUT, USER_TEXT, existing_dir, now_ms, peak_rss_mb

REPO = Path(__file__).resolve().parents[1]
SKIP_NAMES = {"README.md", "MANIFEST.json", "NOTICE.md"}


def corpus_dir() -> Path:
    """``$DSH_SHARED/corpus`` when ``DSH_SHARED`` is set, else the repository's tests/corpus."""
    shared = os.environ.get("DSH_SHARED")
    return Path(shared) / "corpus" if shared else REPO / "tests" / "corpus"


def largest_corpus_files(top: int) -> list[Path]:
    """The ``top`` largest importable data files of the corpus (subagent files excluded)."""
    root = corpus_dir()
    if not root.is_dir():
        raise SystemExit(f"corpus not found at {root}; unset DSH_SHARED to use tests/corpus")
    files = [p for p in root.rglob("*") if p.is_file() and p.name not in SKIP_NAMES
             and "subagents" not in p.parts]
    files.sort(key=lambda p: (-p.stat().st_size, str(p)))
    return files[:top]


# --- synthetic Claude Code transcript ------------------------------------------------------------


def claude_code_lines(turns: int, session_id: str = "5e551011-0000-4000-8000-000000000000"
                      ) -> list[dict[str, Any]]:
    """``turns`` Claude Code turns (5 lines each) as JSON objects, one parentUuid chain."""
    t = datetime(2026, 2, 10, 22, 0, 0, tzinfo=UTC)
    parent: str | None = None
    lines: list[dict[str, Any]] = []

    def line(kind: str, **fields: Any) -> dict[str, Any]:
        nonlocal parent, t
        t += timedelta(milliseconds=750)
        uid = str(uuid.uuid4())
        record = {"parentUuid": parent, "isSidechain": False, "userType": "external",
                  "cwd": "/home/USER/projects/bench", "sessionId": session_id,
                  "version": "2.1.38", "gitBranch": "main", "type": kind, **fields,
                  "uuid": uid, "timestamp": t.isoformat(timespec="milliseconds")
                  .replace("+00:00", "Z")}
        parent = uid
        lines.append(record)
        return record

    def usage(out: int) -> dict[str, Any]:
        return {"input_tokens": 3, "cache_creation_input_tokens": 120,
                "cache_read_input_tokens": 18000, "output_tokens": out,
                "service_tier": "standard"}

    for turn in range(1, turns + 1):
        line("user", message={"role": "user", "content": f"{USER_TEXT} (turn {turn})"},
             permissionMode="default")
        msg_id = f"msg_{uuid.uuid4().hex[:24]}"
        tool_id = f"toolu_{uuid.uuid4().hex[:24]}"
        reply = {"model": "claude-opus-4-6", "id": msg_id, "type": "message",
                 "role": "assistant", "stop_reason": None, "stop_sequence": None,
                 "usage": usage(20)}
        line("assistant", message={**reply, "content": [
            {"type": "text", "text": "Reading it."}]}, requestId=f"req_{turn}")
        tool_use = line("assistant", message={**reply, "content": [
            {"type": "tool_use", "id": tool_id, "name": "Read",
             "input": {"file_path": "/home/USER/projects/bench/src/server.ts"}}]},
            requestId=f"req_{turn}")
        line("user", message={"role": "user", "content": [
            {"tool_use_id": tool_id, "type": "tool_result", "content": TOOL_OUT,
             "is_error": False}]},
             toolUseResult={"type": "text", "file": {
                 "filePath": "/home/USER/projects/bench/src/server.ts", "content": TOOL_OUT,
                 "numLines": 6, "startLine": 1, "totalLines": 6}},
             sourceToolAssistantUUID=tool_use["uuid"])
        line("assistant", message={**reply, "id": f"msg_{uuid.uuid4().hex[:24]}",
                                   "usage": usage(40),
                                   "content": [{"type": "text", "text": ANSWER}]},
             requestId=f"req_{turn}b")
    return lines


def write_claude_code(path: Path, turns: int) -> None:
    """Write a synthetic Claude Code transcript of ``turns`` turns to ``path``."""
    with path.open("w", encoding="utf-8") as f:
        for record in claude_code_lines(turns):
            f.write(json.dumps(record, separators=(",", ":")) + "\n")


def synthetic_transcript(folder: Path, events: int) -> Path:
    """A synthetic transcript whose import yields at least ``events`` dsh events."""
    from dsh.interop import import_file

    probe = folder / "probe.jsonl"
    write_claude_code(probe, 20)
    per_turn = sum(len(s.events) for top in import_file(probe, "claude-code")
                   for s in top.walk()) / 20
    probe.unlink()
    path = folder / f"{uuid.uuid4()}.jsonl"
    write_claude_code(path, max(1, int(events / per_turn) + 1))
    return path


# --- measurement ---------------------------------------------------------------------------------


def child(path: Path, store: bool, parent_dir: str | None) -> dict[str, Any]:
    from dsh.interop import detect_format, import_file

    t0 = now_ms()
    fmt = detect_format(path)
    t1 = now_ms()
    sessions = [s for top in import_file(path, fmt) for s in top.walk()]
    t2 = now_ms()
    built = [(s, s.to_session()) for s in sessions]
    t3 = now_ms()
    events = sum(len(s.events) for s in sessions)
    sources = {s.source_path for s in sessions if s.source_path} or {str(path.resolve())}
    size = sum(os.path.getsize(p) for p in sources)
    out: dict[str, Any] = {"format": fmt, "sessions": len(sessions), "events": events,
                           "bytes": size, "detect_ms": t1 - t0, "import_ms": t2 - t1,
                           "build_ms": t3 - t2, "total_ms": t3 - t0}
    if store:
        from dsh.persistence import Persistence, open_backend

        # dsh.open imports the facade and the backend lazily; keep that out of the timing
        importlib.import_module("dsh.persistence._facade")
        importlib.import_module("dsh.persistence.sqlite._backend")
        root = Path(tempfile.mkdtemp(prefix="dsh-bench-import-", dir=parent_dir))
        try:
            t4 = now_ms()
            persistence = Persistence(open_backend(f"sqlite://{root.resolve()}/store.db"))
            for imported, session in built:
                persistence.create(session.header)
                # the importer's events exactly, as `dsh import` writes them
                with persistence.open(imported.session_id, "write") as handle:
                    handle.append(session.events[: len(imported.events)])
                    handle.flush()
            persistence.close()
            out["store_ms"] = now_ms() - t4
            out["store_bytes"] = dir_bytes(root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    out["rss"] = peak_rss_mb()
    return out


def phases(path: Path, parent_dir: str | None) -> dict[str, Any]:
    """CPU seconds of each phase of ``dsh import``'s streamed write of one Claude Code file.

    The path ``dsh import`` takes for a streamed format (``_write_stream``, one session, a
    fresh SQLite store, the CLI's collector thresholds), each step timed in process time:
    ``first read`` (the whole-file check and the first read, decoding every line into the
    branch index), ``resolve`` (the branch chosen), ``map`` (the second read: decoding and
    mapping lines to events, a batch at a time), ``admit`` (seed validation), ``append``
    (the SQLite write: rows, seal, commit), ``settle``; ``total`` also holds the module
    imports. Freeing a batch is counted in whichever step drops it. The append is split too
    (``append: ...`` rows, inside ``append``): ``rows`` (each event's row text and seal leaf,
    ``encode_sealed_batch``), ``insert`` (the multi-row INSERTs, SQLite's own work and the
    driver's binding), ``seal records`` (the page records of the committed rows) and ``rest``
    (the transaction, the commit's WAL write and sync, the seal file, the tail checks).
    """
    import gc

    clock = time.process_time
    t0 = clock()
    from dsh.cli._cmd_import import _GC_THRESHOLD
    from dsh.interop import stream_file
    from dsh.interop._claude_code_index import BranchIndex
    from dsh.persistence import Persistence, open_backend
    from dsh.persistence.sqlite import _backend
    from dsh.session import SeedStream

    gc.set_threshold(_GC_THRESHOLD, 20, 100)
    spent: dict[str, float] = {"imports": clock() - t0}
    resolve = BranchIndex.resolve

    def timed_resolve(self: BranchIndex, *args: Any) -> None:
        t = clock()
        resolve(self, *args)
        spent["resolve"] = spent.get("resolve", 0.0) + clock() - t

    def timed(name: str, function: Any) -> Any:
        def run(*args: Any) -> Any:
            t = clock()
            try:
                return function(*args)
            finally:
                spent[name] = spent.get(name, 0.0) + clock() - t
        return run

    BranchIndex.resolve = timed_resolve  # type: ignore[method-assign]
    # the append's own steps, as the backend module calls them (put back below)
    parts = {"encode_sealed_batch": "append: rows", "_insert_rows": "append: insert",
             "row_records": "append: seal records"}
    originals = {name: getattr(_backend, name) for name in parts}
    for name, label in parts.items():
        setattr(_backend, name, timed(label, originals[name]))
    root = Path(tempfile.mkdtemp(prefix="dsh-bench-import-", dir=parent_dir))
    try:
        persistence = Persistence(open_backend(f"sqlite://{root.resolve()}/store.db"))
        t = clock()
        stream = next(iter(stream_file(path, "claude-code")))
        spent["first read"] = clock() - t - spent.get("resolve", 0.0)
        seed = SeedStream(stream.session_id, header=stream.header, owned=True)
        persistence.create(stream.header)
        with persistence.open(stream.session_id, "write") as handle:
            batches = iter(stream.batches)
            while True:
                steps = [clock()]
                batch = next(batches, None)
                steps.append(clock())
                if batch is None:
                    spent["map"] = spent.get("map", 0.0) + steps[1] - steps[0]
                    break
                events = seed.admit(batch.events)
                steps.append(clock())
                handle.append(events)
                handle.flush()
                steps.append(clock())
                seed.settle()
                steps.append(clock())
                for name, start, stop in zip(("map", "admit", "append", "settle"), steps,
                                             steps[1:], strict=False):
                    spent[name] = spent.get(name, 0.0) + stop - start
            seed.finish()
        persistence.close()
    finally:
        BranchIndex.resolve = resolve  # type: ignore[method-assign]
        for name, function in originals.items():
            setattr(_backend, name, function)
        shutil.rmtree(root, ignore_errors=True)
    spent["total"] = clock() - t0
    labels = list(parts.values())
    steps = {name: value for name, value in spent.items() if name not in labels}
    inside = {label: spent.get(label, 0.0) for label in labels}
    inside["append: rest"] = steps.get("append", 0.0) - sum(inside.values())
    # each append step right after the append it is part of
    ordered: dict[str, float] = {}
    for name, value in steps.items():
        ordered[name] = value
        if name == "append":
            ordered.update(inside)
    return ordered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000,
                        help="dsh events the synthetic Claude Code transcript yields")
    parser.add_argument("--top", type=int, default=5, help="largest corpus files to import")
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per file")
    parser.add_argument("--no-store", action="store_true", help="skip the SQLite write")
    parser.add_argument("--dir", type=existing_dir, default=None,
                        help="where the temporary files go")
    parser.add_argument("--phases", type=Path, default=None, metavar="FILE",
                        help="CPU seconds of each phase of importing one Claude Code FILE "
                             "(fresh processes, medians of --runs)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(phases(Path(args.file), args.dir) if args.phases
                         else child(Path(args.file), not args.no_store, args.dir)))
        return
    if args.phases is not None:
        extra = ["--phases", str(args.phases)] + (["--dir", args.dir] if args.dir else [])
        runs = [run_child("bench.bench_import", ["--file", str(args.phases), *extra])
                for _ in range(args.runs)]
        spent = medians(runs)
        mb = args.phases.stat().st_size / 1e6
        print(f"# {args.phases.name}: {mb:.1f} MB, CPU seconds a phase "
              f"(median of {args.runs} processes)")
        print("| phase | CPU s |")
        print("|---|---:|")
        for name, value in spent.items():
            print(f"| {name} | {value:.3f} |")
        print(f"\n{mb / spent['total']:.1f} MB/s of CPU (the total, without the interpreter "
              "start)")
        return
    work = Path(tempfile.mkdtemp(prefix="dsh-bench-import-", dir=args.dir))
    rows: list[tuple[str, dict[str, Any]]] = []
    try:
        synthetic = synthetic_transcript(work, args.events)
        inputs = [(f"synthetic Claude Code ({synthetic.stat().st_size / 1e6:.1f} MB)", synthetic)]
        root = corpus_dir()
        inputs += [(str(p.relative_to(root)), p) for p in largest_corpus_files(args.top)]
        extra = (["--no-store"] if args.no_store else []) + (
            ["--dir", args.dir] if args.dir else [])
        for label, path in inputs:
            runs = [run_child("bench.bench_import", ["--file", str(path), *extra])
                    for _ in range(args.runs)]
            r: dict[str, Any] = medians(runs)
            r["format"] = runs[0]["format"]
            rows.append((label, r))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    header_lines(f"import: detect + import_file + to_session"
                 f"{'' if args.no_store else ' (+ SQLite write)'} "
                 f"(median of {args.runs} processes)")
    print("| input | format | sessions | events | source MB | detect ms | import ms | build ms "
          "| events/s | MB/s | SQLite write ms | end-to-end events/s | peak RSS | dsh |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, r in rows:
        mb = r["bytes"] / 1e6
        secs = r["total_ms"] / 1000
        if "store_ms" in r:
            store_cell = f"{r['store_ms']:.0f}"
            e2e = fmt_rate(r["events"] / ((r["total_ms"] + r["store_ms"]) / 1000))
        else:
            store_cell = e2e = "—"
        print(f"| {label} | {r['format']} | {r['sessions']:.0f} | {r['events']:,.0f} "
              f"| {mb:.2f} | {r['detect_ms']:.0f} | {r['import_ms']:.0f} | {r['build_ms']:.0f} "
              f"| {fmt_rate(r['events'] / secs)} | {mb / secs:.2f} | {store_cell} | {e2e} "
              f"| {r['rss']:.0f} MB | n/a |")
    print("\nevents/s and MB/s: over detect + import + build. dsh publishes no import figure "
          "(its importers are not part of dsh-baseline.md).")


if __name__ == "__main__":
    main()

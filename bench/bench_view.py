"""dsh view: time to the first screen and server memory, for big sessions and a big store.

For sessions of 10k, 100k and 1M events (msg turns, uncompacted, written through a store so the
writer keeps its restore points) on JSONL, SQLite and PostgreSQL, and for a store of 5,000 small
sessions, this starts the real ``dsh view`` command, requests the session page (the first
screen: the latest page of 500 events, rendered on the server) and the model pane (loaded by the
page after the first screen; for a long log without a restore point, its last messages read back
and then, in a part of its own, the request header folded from the whole log), and reads the
server's resident memory (VmRSS after, VmHWM peak) from /proc. PostgreSQL keeps no restore
points; ``--no-restore-point`` adds each JSONL and SQLite session again with its restore point
moved aside while it is measured (what an import or an older log looks like: both are then
paged by seq range, a raw JSONL log by bisecting its lines).

    python -m bench.bench_view [--sizes 10000,100000,1000000] [--backends jsonl,sqlite,postgresql]
                               [--sessions 5000] [--runs 3] [--no-restore-point]
                               [--server postgresql://postgres@127.0.0.1:5432/test]

Built stores are cached under bench/out/view-cache (delete it to rebuild; PostgreSQL stores in
schemas ``dsh_bench_view_*`` of the server's database); with ``--dir DIR`` they are built under
DIR and removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.workloads import machine, msg_turn, start

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "bench" / "out" / "view-cache"
SESSION_ID = "bench"
_CACHE_VERSION = 1


PG_SERVER = "postgresql://postgres@127.0.0.1:5432/test"


SCHEMA_PREFIX = "dsh_bench_view_"
"""PostgreSQL schemas of built stores are this + the cache folder's name (benches sharing a
server set their own)."""


def store_url(backend: str, root: Path, server: str = PG_SERVER) -> str:
    if backend == "postgresql":  # one schema per built store, named after its cache folder
        schema = SCHEMA_PREFIX + root.name.replace("-", "_")
        return f"{server}{'&' if '?' in server else '?'}schema={schema}"
    return f"sqlite:{root / 'store.db'}" if backend == "sqlite" else f"jsonl:{root / 'store'}"


def restore_points(url: str) -> Path | None:
    """Where a built store keeps the bench session's restore point (None: it keeps none)."""
    if url.startswith("sqlite:"):
        return Path(url[len("sqlite:"):] + ".dsh-checkpoints")
    if url.startswith("jsonl:"):
        found = sorted(Path(url[len("jsonl:"):]).rglob("*.ckpt"))
        return found[0] if found else None
    return None


@contextlib.contextmanager
def without_restore_point(url: str) -> Iterator[None]:
    """The store with its restore point renamed aside (put back after)."""
    path = restore_points(url)
    if path is None or not path.exists():
        raise SystemExit(f"no restore point to move aside in {url}")
    aside = path.with_name(path.name + ".aside")
    path.rename(aside)
    try:
        yield
    finally:
        aside.rename(path)


def build_session(url: str, events: int) -> None:
    """One uncompacted msg session of at least ``events`` events, written through a store."""
    import dsh

    with dsh.open(url) as store:
        session = store.session(SESSION_ID)
        start(session)
        turn = 0
        while session.seq < events:
            turn += 1
            msg_turn(session, turn)
            if turn % 200 == 0:
                store.flush(session)
        store.flush(session)


def build_many(url: str, sessions: int) -> None:
    """``sessions`` small msg sessions (3 turns each)."""
    import dsh

    with dsh.open(url) as store:
        for i in range(sessions):
            session = store.session(f"s-{i:05d}")
            start(session)
            for turn in (1, 2, 3):
                msg_turn(session, turn)
            store.flush(session)
            store.dispose(session)


def cached(cache: Path, kind: str, backend: str, size: int, server: str = PG_SERVER) -> str:
    root = cache / f"v{_CACHE_VERSION}-{backend}-{kind}-{size}"
    done = root / "done"
    url = store_url(backend, root, server)
    if not done.exists():
        import shutil
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        t0 = time.monotonic()
        (build_session if kind == "session" else build_many)(url, size)
        print(f"  built {backend} {kind} {size:,} in {time.monotonic() - t0:.1f} s",
              file=sys.stderr)
        done.write_text("1")
    return url


def _status(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _get(url: str) -> tuple[float, int, bytes]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=300) as response:
        body = response.read()
    return (time.perf_counter() - t0) * 1000, response.status, body


def measure(url: str, path: str, runs: int) -> dict[str, Any]:
    """Start `dsh view`, time the first screen of ``path`` (fresh server per run)."""
    first, model, header, rss, hwm, idle = [], [], [], [], [], []
    for _ in range(runs):
        proc = subprocess.Popen([sys.executable, "-m", "dsh.cli", "view", "--store", url,
                                 "--no-browser", "--port", "0"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            base, token = line.split("/?token=")[0], line.rsplit("token=", 1)[1]
            _get(f"{base}/health?token={token}")
            idle.append(_status(proc.pid, "VmRSS"))
            ms, status, body = _get(f"{base}{path}{'&' if '?' in path else '?'}token={token}")
            assert status == 200, status
            first.append(ms)
            text = body.decode("utf-8", "replace")
            marker = 'data-src="'
            if marker in text:
                src = text.split(marker, 1)[1].split('"', 1)[0].replace("&amp;", "&")
                ms_model, _, pane = _get(f"{base}{src}&token={token}")
                model.append(ms_model)
                part = 'class="model-header" data-src="'  # the header, folded apart
                pane_text = pane.decode("utf-8", "replace")
                if part in pane_text:
                    src = pane_text.split(part, 1)[1].split('"', 1)[0].replace("&amp;", "&")
                    header.append(_get(f"{base}{src}&token={token}")[0])
            rss.append(_status(proc.pid, "VmRSS"))
            hwm.append(_status(proc.pid, "VmHWM"))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()
    return {"first_ms": statistics.median(first),
            "model_ms": statistics.median(model) if model else None,
            "header_ms": statistics.median(header) if header else None,
            "idle_mb": statistics.median(idle), "rss_mb": statistics.median(rss),
            "hwm_mb": max(hwm)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--backends", default="jsonl,sqlite,postgresql")
    parser.add_argument("--no-restore-point", action="store_true",
                        help="also measure each JSONL and SQLite session without its restore point")
    parser.add_argument("--server", default=PG_SERVER, help="PostgreSQL server and database")
    parser.add_argument("--sessions", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--dir", type=Path, default=None,
                        help="build the stores here and remove them after (no cache)")
    args = parser.parse_args()
    cache = args.dir / "bench-view" if args.dir is not None else CACHE
    try:
        rows = _run(args, cache)
    finally:
        if args.dir is not None:
            import shutil
            shutil.rmtree(cache, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"# dsh view: first screen and server memory, median of {args.runs} fresh servers "
          f"— {machine()}")
    print()
    print("| case | first screen | model pane | its header part | server RSS idle | RSS after "
          "| peak RSS |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        model = f"{r['model_ms']:,.0f} ms" if r["model_ms"] is not None else "-"
        part = f"{r['header_ms']:,.0f} ms" if r["header_ms"] is not None else "-"
        print(f"| {r['case']} | {r['first_ms']:,.0f} ms | {model} | {part} | "
              f"{r['idle_mb']:.1f} MB | {r['rss_mb']:.1f} MB | {r['hwm_mb']:.1f} MB |")


def _run(args: argparse.Namespace, cache: Path) -> list[dict[str, Any]]:
    rows = []
    for backend in args.backends.split(","):
        for size in [int(s) for s in args.sizes.split(",") if s]:
            url = cached(cache, "session", backend, size, args.server)
            rows.append({"case": f"{backend} session {size:,} events", "page": "/s/bench",
                         **measure(url, f"/s/{SESSION_ID}", args.runs)})
            if args.no_restore_point and backend != "postgresql":
                with without_restore_point(url):
                    rows.append({"case": f"{backend} session {size:,} events, no restore point",
                                 "page": "/s/bench",
                                 **measure(url, f"/s/{SESSION_ID}", args.runs)})
        if args.sessions:
            url = cached(cache, "store", backend, args.sessions, args.server)
            rows.append({"case": f"{backend} store of {args.sessions:,} sessions", "page": "/",
                         **measure(url, "/", args.runs)})
    return rows


if __name__ == "__main__":
    main()

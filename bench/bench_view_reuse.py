"""dsh view: CPU of a page that reuses a session read in full (the kept read's stamp check).

A session read in full (a short log, or a Zstandard JSONL log without a restore point) is kept
by the viewer for the next page; since the kept read is checked against the log's stamp (a
``stat`` of the file, or SQLite's last stored seq), each reuse costs that check. This prints
the median CPU (``time.process_time``) of ``ViewStore.open_session`` when the read is kept,
and of a read in full, per backend, in this process.

    python -m bench.bench_view_reuse [--events 2000] [--calls 200] [--runs 5]

To compare with another checkout's code, run it with that checkout's ``src`` first on
``PYTHONPATH`` (``PYTHONPATH=/other/src:. python -m bench.bench_view_reuse``), alternating.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import dsh
from bench.workloads import msg_turn
from dsh.view import ViewStore


def _build(url: str, events: int) -> None:
    with dsh.open(url) as store:
        s = store.session("s", header={"createdAt": 1_767_225_600_000})
        turn = 0
        while len(s.events) < events:
            turn += 1
            msg_turn(s, turn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        urls = {"jsonl-zstd": f"jsonl:{Path(tmp) / 'z'}?compression=zstd",
                "sqlite": f"sqlite:{Path(tmp) / 's.db'}"}
        for name, url in urls.items():
            _build(url, args.events)
            view = ViewStore(url)
            assert not view.open_session("s").paged, "not a full read: nothing is kept"
            kept, full = [], []
            for _ in range(args.runs):
                view.open_session("s")  # the read this run's kept pages reuse
                started = time.process_time()
                for _ in range(args.calls):
                    view.open_session("s")
                kept.append((time.process_time() - started) / args.calls * 1e6)
                started = time.process_time()
                view._full.clear()
                view.open_session("s")
                full.append((time.process_time() - started) * 1e6)
            view.close()
            print(f"{name:10} {args.events} events: kept read {statistics.median(kept):8.1f} "
                  f"us/page CPU; read in full {statistics.median(full):9.1f} us")


if __name__ == "__main__":
    main()

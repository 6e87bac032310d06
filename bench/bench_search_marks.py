"""``Store.search`` CPU when its hits lie in one big session that never removed a message.

    python -m bench.bench_search_marks build DIR [--turns N]   # an SQLite store, indexed
    python -m bench.bench_search_marks time DIR                # one search, CPU ms printed
    python -m bench.bench_search_marks marks URL QUERY [--runs N]  # a built store's marks

``build`` writes one session of ``N`` completed turns (6 events each; default 50,000 = 300k
events) whose every prompt holds the word searched, in ``DIR/s.db``, and runs a
first search so the index is built. ``time`` opens the store and searches once in this process
(run it in fresh processes, alternating trees). Marking the hits (docs/stores.md#search) read
the whole session before; now a log without a removal record is not read.

``marks`` takes any built store (``bench.search_store``'s 10,000 sessions, say) and prints, for
``QUERY`` in this process after one warm-up search, the median CPU ms of ``N`` (default 5)
``Store.search`` calls (hits marked), of ``dsh.persistence.search`` (the same query, unmarked)
and of ``removal_marks`` over the hits' sessions alone.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable
from pathlib import Path

import dsh
from dsh.testing import LogBuilder


def _url(root: Path) -> str:
    return f"sqlite:{root / 's.db'}"


def build(root: Path, turns: int) -> None:
    """Write the big session and index it."""
    root.mkdir(parents=True, exist_ok=True)
    log = LogBuilder("big")
    for i in range(turns):
        log.completed_turn(f"zebra {i}")
    with dsh.open(_url(root)) as store:
        session = store.session("big")
        for event in log.events[len(session.events):]:
            session.append(event["type"], event["data"], surface_op=event.get("surfaceOp"))
        session.close()
        store.search("zebra")


def cpu_ms() -> float:
    """User + system CPU of this process so far, ms."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1000


def marks(url: str, query: str, runs: int) -> None:
    """Print the CPU of a search with and without its marks, and of the marks alone."""
    import statistics

    from dsh.persistence import removal_marks, search

    def cpu_of(call: Callable[[], object]) -> float:
        spent = []
        for _ in range(runs):
            before = cpu_ms()
            call()
            spent.append(cpu_ms() - before)
        return statistics.median(spent)

    with dsh.open(url) as store:
        found = store.search(query)  # warm: imports, the index current
        ids = [hit.session_id for hit in found.hits]
        marked = cpu_of(lambda: store.search(query))
        unmarked = cpu_of(lambda: search(store.persistence, query))
        alone = cpu_of(lambda: removal_marks(store.persistence, ids))
    print(f"hits={len(ids)} sessions={len(set(ids))} search_cpu_ms={marked:.2f} "
          f"unmarked_cpu_ms={unmarked:.2f} marks_cpu_ms={alone:.2f}")


def main(argv: list[str]) -> None:
    """``build DIR [--turns N]``, ``time DIR`` or ``marks URL QUERY [--runs N]``."""
    if argv[0] == "build":
        build(Path(argv[1]), int(argv[3]) if len(argv) > 3 else 50_000)
        return
    if argv[0] == "marks":
        marks(argv[1], argv[2], int(argv[4]) if len(argv) > 4 else 5)
        return
    with dsh.open(_url(Path(argv[1]))) as store:
        store.search("zebra")  # warm: imports, the index's connection
        before = cpu_ms()
        found = store.search("zebra")
        spent = cpu_ms() - before
    print(f"hits={len(found.hits)} search_cpu_ms={spent:.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])

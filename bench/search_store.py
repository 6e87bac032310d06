"""A big store for ``dsh search``: SESSIONS sessions of EVENTS events, built once and cached.

Each session is a real ``Session`` built in memory (a ``request/header``, then msg turns of
WORKLOADS.md, 11 events and 4 indexed messages a turn) and written to the store in one batch
through the backend's write handle (``Persistence.create``, ``open(id, "write")``, ``append``,
``flush``), so one session at a time is held: memory stays bounded at any size. The prompts
vary so that a search can be common, rare or unique:

* every answer holds ``route`` and ``handler`` (the common query: ~1 message in 4 matches);
* the first prompt of session ``n`` names ``ticket t{n:05d}`` (the unique query) and the project
  :data:`PROJECTS` ``[n % 10]`` (the rare query: one session in ten, one message each).

A JSONL store gets its search index before the first session is written, so its writers keep
the index at flush (docs/stores.md#search); a SQLite or PostgreSQL store's first search
builds it, timed here as the build's last step. Stores are cached under ``/tmp/dsh-search-
store`` (a ``done`` file marks a complete build; delete the folder to rebuild).

    python -m bench.search_store --backend jsonl --sessions 10000 --events 1000
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from bench.bench_view import store_url
from bench.workloads import USER_TEXT, msg_turn, start

CACHE = Path("/tmp/dsh-search-store")
_VERSION = 1
PROJECTS = ("kestrel", "osprey", "heron", "plover", "avocet", "dunlin", "godwit", "curlew",
            "lapwing", "redshank")


def session_id(number: int) -> str:
    """The id of the store's session ``number`` (0-based)."""
    return f"s-{number:06d}"


def write_session(persistence: object, number: int, events: int) -> int:
    """Build session ``number`` of at least ``events`` events and write it; return its events."""
    from dsh.persistence import Persistence
    from dsh.session import Session
    from dsh.testing._logs import fixed_clock, header

    assert isinstance(persistence, Persistence)
    sid = session_id(number)
    session = Session.create(sid, header=header(sid), clock=fixed_clock())
    start(session)
    turn = 0
    while session.seq < events:
        turn += 1
        text = USER_TEXT if turn > 1 else (
            f"Ticket t{number:05d} for project {PROJECTS[number % len(PROJECTS)]}: {USER_TEXT}")
        msg_turn(session, turn, text)
    persistence.create(header(sid))
    with persistence.open(sid, "write") as handle:
        handle.append(session.events)
        handle.flush()
    return len(session.events)


def build(backend: str, sessions: int, events: int, cache: Path = CACHE) -> str:
    """The URL of a store of ``sessions`` × ``events``, built (and indexed) unless cached."""
    import dsh

    root = cache / f"v{_VERSION}-{backend}-{sessions}x{events}"
    url = store_url(backend, root)
    if (root / "done").exists():
        return url
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    t0 = time.monotonic()
    total = 0
    with dsh.open(url) as store:
        if backend == "jsonl":
            (root / "store").mkdir()
            store.search("index")  # the sidecar exists: every writer's flush keeps it
        for number in range(sessions):
            total += write_session(store.persistence, number, events)
            if number % 500 == 499:
                print(f"  {backend}: {number + 1:,} sessions, {total:,} events, "
                      f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        built = time.monotonic() - t0
        first = store.search("request flows")
        indexed = time.monotonic() - t0 - built
    note = (f"{backend}: {sessions:,} sessions, {total:,} events written in {built:.0f} s; "
            f"first search (reindexed {first.reindexed:,} sessions) {indexed:.0f} s")
    print("  " + note, file=sys.stderr)
    (root / "done").write_text(note + "\n")
    return url


def built_note(backend: str, sessions: int, events: int, cache: Path = CACHE) -> str:
    """What the build of a cached store recorded (sizes, build and first-search times)."""
    done = cache / f"v{_VERSION}-{backend}-{sessions}x{events}" / "done"
    return done.read_text().strip() if done.exists() else "not built"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="jsonl", help="jsonl, sqlite or postgresql")
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=1_000, help="events per session")
    args = parser.parse_args()
    print(build(args.backend, args.sessions, args.events))


if __name__ == "__main__":
    main()

"""A writer process standing for one host, driven line by line over stdin.

``python _pg_worker.py URL SESSION`` then commands, one per line; each answers one JSON line:

* ``open`` — open SESSION for writing: ``{"ok": true, "epoch": N, "pid": P}``;
* ``append K`` — append K ``session/title`` events continuing this writer's own view of the
  head (a stale writer keeps its stale view): ``{"ok": true, "seqs": [...]}``;
* ``append-pause K`` — the same, but the process stops itself (SIGSTOP) inside the append
  transaction, right after it locked the session row: a writer frozen mid-commit (the append
  takes its several-statement path for this); after a SIGCONT it answers as ``append`` does;
* ``close`` / ``exit``.

A refused command answers ``{"ok": false, "error": class, "code": ..., "where": {...}}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

from dsh._errors import DshError
from dsh.persistence import open_backend
from dsh.session._events import Event


def _pausing(backend: Any, connections: Any) -> Any:
    """``backend._conn`` that stops the process once, after the append locked the row."""

    @contextlib.contextmanager
    def conn(action: str, session_id: Any, **kwargs: Any) -> Iterator[Any]:
        with connections(action, session_id, **kwargs) as c:
            if action == "append":
                execute = c.execute

                def locked(query: Any, *args: Any, **kw: Any) -> Any:
                    result = execute(query, *args, **kw)
                    if query == backend._sql_lock_row:
                        backend._conn = connections  # once
                        os.kill(os.getpid(), signal.SIGSTOP)
                    return result

                c.execute = locked
            yield c

    return conn


def main() -> None:
    url, session_id = sys.argv[1], sys.argv[2]
    backend: Any = open_backend(url)
    handle: Any = None
    next_seq = 0
    for line in sys.stdin:
        command, *args = line.split()
        try:
            if command == "open":
                handle = backend.open(session_id, "write")
                events = handle.read().events
                next_seq = events[-1]["seq"] + 1 if events else 0
                answer: dict[str, Any] = {"ok": True, "epoch": handle.epoch, "pid": os.getpid()}
            elif command == "append-pause":
                batch = [Event({"type": "session/title", "seq": next_seq + i, "time": 1,
                                "data": {"title": f"{os.getpid()}:{next_seq + i}"}})
                         for i in range(int(args[0]))]
                backend._conn = _pausing(backend, backend._conn)
                # the several-statement path: a one-statement append holds no transaction a
                # client could be frozen inside
                handle.one_statement = False
                handle.append(batch)
                handle.one_statement = True
                next_seq += len(batch)
                answer = {"ok": True, "seqs": [e["seq"] for e in batch],
                          "recovered": handle.recovered_connection_losses}
            elif command == "append":
                batch = [Event({"type": "session/title", "seq": next_seq + i, "time": 1,
                                "data": {"title": f"{os.getpid()}:{next_seq + i}"}})
                         for i in range(int(args[0]))]
                handle.append(batch)
                next_seq += len(batch)
                answer = {"ok": True, "seqs": [e["seq"] for e in batch],
                          "recovered": handle.recovered_connection_losses}
            elif command == "close":
                handle.close()
                answer = {"ok": True}
            elif command == "exit":
                break
            else:
                answer = {"ok": False, "error": "unknown command " + command}
        except DshError as exc:
            answer = {"ok": False, "error": type(exc).__name__, "code": exc.code,
                      "where": exc.where, "message": exc.message}
        print(json.dumps(answer), flush=True)
    backend.close()


if __name__ == "__main__":
    main()

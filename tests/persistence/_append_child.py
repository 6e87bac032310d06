"""A writer process the stateful test SIGKILLs: it appends turns, flushing after each.

``python -m tests.persistence._append_child URL SESSION MODE TURNS FIRST``: MODE ``create``
(a new session) or ``resume`` (a stored one, which appends ``session/end-seed``). It appends
TURNS completed turns numbered from FIRST, flushes after each and prints the event count
then stored, then starts one more turn it never flushes, prints ``ready`` and waits to be
killed. Its write-behind window is ten minutes, so nothing reaches the disk but the flushes.
"""

from __future__ import annotations

import sys
import time

from dsh.persistence import Persistence, WriteBehind, open_backend
from dsh.session import SessionStore
from dsh.testing import CWD
from tests.persistence.conftest import turn


def main() -> None:
    url, session_id, mode, turns, first = sys.argv[1:6]
    persistence = Persistence(open_backend(url), write_behind=WriteBehind(600_000))
    store = SessionStore(persistence)
    session = (store.resume(session_id) if mode == "resume"
               else store.create(session_id, header={"cwd": CWD}))
    for n in range(int(first), int(first) + int(turns)):
        turn(session, n)
        store.flush(session)
        print(len(session.events), flush=True)
    session.append("turn/start", {"turn": int(first) + int(turns)})
    print("ready", flush=True)
    time.sleep(600)  # the parent kills this process long before


if __name__ == "__main__":
    main()

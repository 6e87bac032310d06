"""A child process that writes a session while the viewer shows it (the live test's agent).

Usage: python -m tests.view.live_writer URL SESSION_ID. It writes one turn, flushes and prints
``ready``; then for each line on stdin it appends a turn whose answer is that line, flushes and
prints ``flushed``. It exits at end of input.
"""

from __future__ import annotations

import sys

import dsh
from dsh.testing._logs import assistant, user


def _turn(session: dsh.Session, turn: int, text: str) -> None:
    session.append("turn/start", {"turn": turn})
    session.append("step/start", {"turn": turn, "step": 1})
    session.append("user/message", user(f"prompt {turn}", f"u{turn}"), surface_op="append")
    session.append("assistant/message", assistant(turn, 1, text, f"a{turn}"),
                   surface_op="append")
    session.append("step/end", {"turn": turn, "step": 1})
    session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})


def main() -> None:
    url, session_id = sys.argv[1], sys.argv[2]
    with dsh.open(url) as store:
        session = store.session(session_id)
        _turn(session, 1, "the first answer")
        store.flush(session)
        print("ready", flush=True)
        turn = 1
        for line in sys.stdin:
            turn += 1
            _turn(session, turn, line.strip())
            store.flush(session)
            print("flushed", flush=True)


if __name__ == "__main__":
    main()

"""Child process of the crash tests: imports dsh, says ``ready``, waits for a line, then runs
one rights operation on a store and says ``done`` (the parent SIGKILLs it somewhere between).

usage: python -m tests.rights._crash_worker URL SESSION redact|erase|gc (gc: ``gc --apply``)
"""

from __future__ import annotations

import sys

import dsh
from dsh.rights import erase, gc, redact


def main() -> None:
    url, session_id, op = sys.argv[1], sys.argv[2], sys.argv[3]
    with dsh.open(url) as store:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        sys.stdin.readline()
        if op == "redact":
            redact(store, session_id, secrets=True)
        elif op == "gc":
            gc(store, apply=True)
        else:
            erase(store, [session_id])
    sys.stdout.write("done\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

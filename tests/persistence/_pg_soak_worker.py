"""One soak host: random sessions, random batches, random crashes and pauses.

``python _pg_soak_worker.py URL SECONDS SESSIONS SEED OUT`` writes to random sessions of the
store until SECONDS pass, then writes a JSON report to OUT: every acknowledged event (session,
seq, title) and counters. Faults it plays:

* crash: the handle is dropped with its lease still held and not renewed (as a host that died),
  so the next writer waits for expiry and takes over;
* pause: renewal stops for longer than the lease (as a host stalled by GC or a VM pause), then
  the writer appends again: either nobody took over (its epoch still holds and the append is
  fenced-valid) or the append is refused with LeaseLostError and nothing is merged.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

from dsh._errors import LeaseLostError, SessionBusyError
from dsh.persistence import open_backend
from dsh.session._events import Event


def _batch(next_seq: int, size: int) -> list[Event]:
    return [Event({"type": "session/title", "seq": next_seq + i, "time": 1,
                   "data": {"title": f"{os.getpid()}:{next_seq + i}"}}) for i in range(size)]


def main() -> None:
    url, seconds, sessions, seed, out = sys.argv[1:6]
    rng = random.Random(int(seed))
    backend: Any = open_backend(url)
    lease_s = backend.lease_ms / 1000
    acked: list[tuple[str, int, str]] = []
    counts = {"opens": 0, "batches": 0, "busy": 0, "lease_lost": 0, "crashes": 0, "pauses": 0}
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline:
        sid = f"soak-{rng.randrange(int(sessions))}"
        try:
            handle = backend.open(sid, "write")
        except SessionBusyError:
            counts["busy"] += 1
            continue
        counts["opens"] += 1
        events = handle.read().events
        next_seq = events[-1]["seq"] + 1 if events else 0
        try:
            for _ in range(rng.randint(1, 3)):
                if rng.random() < 0.05:
                    counts["pauses"] += 1
                    handle._lease.stop()  # stall: no renewal for longer than the lease
                    time.sleep(lease_s * 1.5)
                batch = _batch(next_seq, rng.randint(1, 5))
                handle.append(batch)
                counts["batches"] += 1
                acked.extend((sid, e["seq"], e["data"]["title"]) for e in batch)
                next_seq += len(batch)
        except LeaseLostError:
            counts["lease_lost"] += 1
        if rng.random() < 0.15:
            counts["crashes"] += 1
            handle._lease.stop()  # die holding the lease: never released, never renewed
            handle._closed = True
        else:
            handle.close()
    backend.close()
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"acked": acked, "counts": counts}, f)


if __name__ == "__main__":
    main()

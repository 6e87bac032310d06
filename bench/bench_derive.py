"""Workload 2 (derive): cost of ``derive_messages`` on msg sessions of 1k, 10k, 100k surface events.

Run: ``python -m bench.bench_derive [--sizes 1000,10000,100000]``. Times in ms; (b) is the median
of 50, (d) the median of 5, as in ../shared/bench/WORKLOADS.md. Seeding is timed in both modes:
snapshot (``Session.create``, copy + validate) and restore (``Session.restore``, validate only).
"""

from __future__ import annotations

import argparse
import statistics
import uuid

from bench.workloads import MODEL, USER_TEXT, build, machine, now_ms, ratio

# dsh: first full, after 2 appends, repeat, after a replace, seed construct, first derive on it
DSH = {1000: (0.41, 0.002, 0.001, 0.08, 34, 0.33), 10000: (2.15, 0.009, 0.008, 1.18, 272, 1.83),
       100000: (17.4, 0.42, 0.42, 14.4, 2381, 10.3)}


def closed_turn(session, turn: int) -> None:  # type: ignore[no-untyped-def]
    a = session.append
    a("turn/start", {"turn": turn})
    a("step/start", {"turn": turn, "step": 1})
    a("user/message", {"id": str(uuid.uuid4()), "role": "user", "source": {"kind": "user"},
                       "content": [{"type": "text", "text": USER_TEXT}]}, surface_op="append")
    a("assistant/message", {"turn": turn, "step": 1, "message": {
        "id": str(uuid.uuid4()), "role": "assistant", "source": MODEL,
        "content": [{"type": "text", "text": "Done."}]}}, surface_op="append")
    a("step/end", {"turn": turn, "step": 1})
    a("turn/end", {"turn": turn, "reason": {"kind": "completed"}})


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = now_ms()
    fn()
    return now_ms() - t0


def measure(surface_events: int) -> list[float]:
    from dsh.session._session import Session

    session = Session.create("bench")
    build(session, "msg", surface_events * 11 // 4)
    first = timed(session.derive_messages)
    turn = max(e.data["turn"] for e in session.events if e.type == "turn/start")
    after_append = []
    for _ in range(50):
        turn += 1
        closed_turn(session, turn)
        after_append.append(timed(session.derive_messages))
    # the same, but the caller still holds the previous list during the call, as dsh's bench
    # does (msgs = s.deriveMessages()); releasing it is left outside the timed window, as V8's
    # deferred GC leaves it outside dsh's
    after_append_held = []
    held = session.derive_messages()
    for _ in range(50):
        turn += 1
        closed_turn(session, turn)
        t0 = now_ms()
        latest = session.derive_messages()
        after_append_held.append(now_ms() - t0)
        held = latest
    del held, latest
    repeat = statistics.median(timed(session.derive_messages) for _ in range(50))
    after_replace = []
    results = [e for e in session.events if e.type == "tool/result"
               and e.surface_op == "append"]
    for k in range(5):
        original = results[k]
        data = {**original.data, "message": {**original.data["message"], "content": [{
            **original.data["message"]["content"][0],
            "content": [{"type": "text", "text": "[pruned]"}]}]}}
        turn += 1
        session.append("turn/start", {"turn": turn})
        session.append("tool/result", data, surface_op={
            "op": "replace", "start": original.seq, "end": original.seq},
            source_event_seqs=[original.seq])
        session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
        after_replace.append(timed(session.derive_messages))
    events = list(session.events)
    header = session.header
    snap_ms = timed(lambda: Session.create("seeded", seed=events))
    holder: list[Session] = []
    restore_ms = timed(lambda: holder.append(Session.restore("bench", events, header)))
    first_on_seeded = timed(holder[0].derive_messages)
    return [first, statistics.median(after_append), repeat, statistics.median(after_replace),
            snap_ms, restore_ms, first_on_seeded, len(events), statistics.median(after_append_held)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,10000,100000")
    args = parser.parse_args()
    print(f"# derive: msg sessions — {machine()}")
    print("| surface events (log events) | first full | after 2 appends | (last list held) "
          "| repeat | after a replace | seed: snapshot | seed: restore (µs/event) "
          "| first derive on it |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        r = measure(size)
        d = DSH.get(size)
        print(f"| {size:,} ({r[7]:,}) | {r[0]:.2f} | {r[1]:.3f} | {r[8]:.3f} | {r[2]:.3f} "
              f"| {r[3]:.2f} "
              f"| {r[4]:.0f} | {r[5]:.0f} ({r[5] * 1000 / r[7]:.2f}) | {r[6]:.2f} |")
        if d:
            print(f"| dsh | {d[0]} | {d[1]} | {d[1]} | {d[2]} | {d[3]} | {d[4]} | ≈3.5 µs/event "
                  f"| {d[5]} |")
            print(f"| ratio | {ratio(r[0], d[0], higher_is_better=False)} "
                  f"| {ratio(r[1], d[1], higher_is_better=False)} "
                  f"| {ratio(r[8], d[1], higher_is_better=False)} "
                  f"| {ratio(r[2], d[2], higher_is_better=False)} "
                  f"| {ratio(r[3], d[3], higher_is_better=False)} "
                  f"| {ratio(r[4], d[4], higher_is_better=False)} "
                  f"| {ratio(r[5] * 1000 / r[7], 3.5, higher_is_better=False)} "
                  f"| {ratio(r[6], d[5], higher_is_better=False)} |")


if __name__ == "__main__":
    main()

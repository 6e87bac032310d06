"""CPU of the exporters' history walk over a long log with many pruned results and one clear.

``python -m bench.bench_export_removed [EVENTS] [PRUNES]`` (default 300000 10000): a log of
user / tool-call / tool-result triples, ``PRUNES`` one-node tool-result rewrites (as the pruner
writes them), then one clear (an empty ``assistant/message`` replace) of the first half; prints
the CPU seconds of :func:`dsh.interop._history.history` with the clear and without it.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from dsh.interop._history import history


def result(call_seq: int, text: str) -> dict[str, Any]:
    """A ``tool/result``'s data answering the call of the turn at ``call_seq`` with ``text``."""
    return {"message": {"id": f"t{call_seq}", "role": "user", "content": [
        {"type": "tool-result", "toolCallId": f"c{call_seq}", "isError": False,
         "content": [{"type": "text", "text": text}]}]}}


def build(events: int, prunes: int, *, clear: bool) -> list[dict[str, Any]]:
    """The log as wire events (seq = index), valid for ``fold_surface``'s rules."""
    log: list[dict[str, Any]] = []
    now: dict[int, int] = {}  # a pruned result's seq -> its rewrite's

    def add(etype: str, data: dict[str, Any], op: Any = "append") -> dict[str, Any]:
        event = {"type": etype, "seq": len(log), "time": len(log), "data": data, "surfaceOp": op}
        log.append(event)
        return event

    results = []
    while len(log) < events:
        seq = len(log)
        add("user/message", {"id": f"u{seq}", "role": "user",
                             "content": [{"type": "text", "text": "hi"}]})
        add("assistant/message", {"message": {"id": f"a{seq}", "role": "assistant", "content": [
            {"type": "toolCall", "id": f"c{seq}", "name": "x", "arguments": {}}]}})
        results.append(len(log))
        add("tool/result", result(seq, "r"))
    for seq in results[::max(1, len(results) // prunes)][:prunes]:
        rewrite = add("tool/result", result(seq - 2, "pruned"),
                      {"op": "replace", "start": seq, "end": seq})
        rewrite["sourceEventSeqs"] = [seq]
        now[seq] = rewrite["seq"]
    if clear:
        end = events // 2 // 3 * 3
        removal = add("assistant/message", {"message": {"id": "x", "role": "assistant",
                                                        "content": []}},
                      {"op": "replace", "start": 1, "end": end})
        removal["sourceEventSeqs"] = [now.get(s, s) for s in range(1, end + 1)]
    return log


def main() -> None:
    """Print ``events prunes clear-seconds no-clear-seconds`` (process CPU time)."""
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 300_000
    prunes = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    figures = []
    for clear in (True, False):
        log = build(events, prunes, clear=clear)
        started = time.process_time()
        for _ in history(log):
            pass
        figures.append(round(time.process_time() - started, 3))
    print(events, prunes, *figures)


if __name__ == "__main__":
    main()

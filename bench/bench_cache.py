"""Prompt-cache share around compactions: cache-keeping compaction beside the same run without.

Run: ``python -m bench.bench_cache [--turns 48] [--wires openai,anthropic]``.

An agent reads ~2 KB pages of notes (one tool call and one answer per turn) until automatic
compaction runs with the model summarizer, three times in 48 turns, against a local server that
imitates the providers' prompt caching (``tests/agent/providers/servers.py``: OpenAI's automatic
prefix cache in 128-token steps from 1,024 tokens; Anthropic's ``cache_control`` marks with
their 20-block look-back). For each compaction: the share of the summary request's input tokens
served from the cache, and of the first request after it; then the share over every request.
*keep* is ``CompactionPolicy(keep_cache=True)`` (the summary request continues the last
request; the longest head is kept), *off* the same run with ``keep_cache=False`` (the span
alone is summarized; the head is replaced). Token counts are the server's (4 bytes a token).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from tests.agent.providers.cache_run import run_cache

from bench.bench_write import header_lines


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.bench_cache", description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=48)
    parser.add_argument("--wires", default="openai,anthropic")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args(argv)
    header_lines(f"cache: prompt-cache share around compactions ({args.turns} turns, model "
                 f"summarizer, window 20,000 tokens, compaction at 80 %, head/tail budget 50 %)")
    print("| wire | compaction | summary request cached, keep | off | first request after, "
          "keep | off |")
    print("|---|---:|---:|---:|---:|---:|")
    totals: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="dsh-bench-cache-", dir=args.dir))
    try:
        for wire in args.wires.split(","):
            keep = run_cache(wire, root, keep_cache=True, turns=args.turns)
            off = run_cache(wire, root, keep_cache=False, turns=args.turns)
            if not keep.compactions and not off.compactions:
                print(f"| {wire} | none in {args.turns} turns | - | - | - | - |")
            for index in range(max(len(keep.compactions), len(off.compactions))):
                on_c = keep.compactions[index] if index < len(keep.compactions) else {}
                off_c = off.compactions[index] if index < len(off.compactions) else {}
                print(f"| {wire} | {index + 1} | {_pct(on_c.get('summaryShare'))} | "
                      f"{_pct(off_c.get('summaryShare'))} | {_pct(on_c.get('nextShare'))} | "
                      f"{_pct(off_c.get('nextShare'))} |")
            totals.append(f"{wire}: every request {keep.total_share:.1%} cached with keep, "
                          f"{off.total_share:.1%} off ({len(keep.requests)} / "
                          f"{len(off.requests)} step requests)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    for line in totals:
        print(line)


if __name__ == "__main__":
    main()

"""Which JSON engine dsh.json builds on: encode/decode time of typical log records.

Run: ``python -m bench.bench_json``. Compares orjson, msgspec and the standard library on one
msg-workload turn (11 records) and on a 3.6 kB tool result, in µs per record (and dsh.json on
a LangGraph checkpoint), and checks the three things the engine must do for dsh logs: lone
surrogates, 20,000 levels, NaN refusal.
msgspec comes with the ``bench`` extra (``.venv/bin/pip install -e '.[bench]'``); without it its
row says it was skipped and why.
"""

from __future__ import annotations

import json
import timeit
import uuid
from typing import Any

import orjson

try:
    import msgspec
except ImportError:  # the bench extra is not installed: that row is skipped, saying so
    msgspec = None

from bench.workloads import machine

RECORDS: list[Any] = [
    {"type": "turn/start", "seq": 1, "time": 1764500000000, "data": {"turn": 1}},
    {"type": "user/message", "seq": 3, "time": 1764500000001, "data": {
        "id": str(uuid.uuid4()), "role": "user", "source": {"kind": "user"},
        "content": [{"type": "text", "text": "Please look at src/server.ts and explain it."}]},
     "surfaceOp": "append"},
    {"type": "tool/result", "seq": 6, "time": 1764500000002, "data": {
        "turn": 1, "step": 1, "message": {
            "id": str(uuid.uuid4()), "role": "user", "source": {"kind": "tool", "callId": "c1"},
            "content": [{"type": "tool-result", "toolCallId": "c1",
                         "content": [{"type": "text", "text": "x" * 3600}]}]}},
     "surfaceOp": "append", "sourceEventSeqs": [5]},
]


LONE = "a\ud83d"
LONE_JSON = b'["a\\ud83d"]'


# A LangGraph checkpoint's shape: channel versions f"{v:032}.{random float:016}" hold 19+
# digits after the second '.', which dsh.json must not mistake for a long integer literal
CHECKPOINT: Any = {
    "v": 4, "ts": "2026-12-04T19:00:00+00:00", "id": "1efb2c3d-0000-6000-8000-000000000001",
    "channel_versions": {f"ch{i}": f"{i + 2:032}.0.{30191874065201247171 + i}"
                         for i in range(8)},
    "versions_seen": {f"node{i}": {f"ch{j}": f"{j + 1:032}.0.{20191874065201247171 + j}"
                                   for j in range(4)} for i in range(4)},
    "messages": [{"role": "user", "content": "hello " * 20}] * 5}


def per_record_us(fn: Any, items: list[Any], number: int) -> float:
    return timeit.timeit(lambda: [fn(x) for x in items], number=number) / number / len(items) * 1e6


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20_000,
                        help="timed repetitions of each record list (default 20000)")
    args = parser.parse_args()
    number = args.number
    encoded = [orjson.dumps(r) for r in RECORDS]
    engines: dict[str, Any] = {
        "orjson": (orjson.dumps, orjson.loads),
        "stdlib json": (lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")),
                        json.loads),
    }
    print(f"# JSON engines on dsh records — {machine()}")
    print("| engine | encode µs/record | decode µs/record | lone surrogate out | lone surrogate in "
          "| 20k levels in | refuses NaN |")
    print("|---|---|---|---|---|---|---|")
    deep = "[" * 20_000 + "]" * 20_000
    failures: tuple[type[BaseException], ...] = (ValueError, TypeError, RecursionError,
                                                 UnicodeEncodeError)
    if msgspec is not None:
        engines = {"orjson": engines["orjson"],
                   "msgspec": (msgspec.json.encode, msgspec.json.decode),
                   "stdlib json": engines["stdlib json"]}
        failures = (*failures, msgspec.DecodeError)
    else:
        print("| msgspec | skipped: not installed (.venv/bin/pip install -e '.[bench]') "
              "| | | | | |")
    for name, (enc, dec) in engines.items():
        def ok(fn: Any) -> str:
            try:
                fn()
            except failures:
                return "no"
            return "yes"

        def nan_refused(dec: Any = dec) -> str:
            try:
                dec(b"[NaN]")
            except failures:
                return "yes"
            return "no"

        out_ok = ok(lambda enc=enc: enc(LONE))
        in_ok = ok(lambda dec=dec: dec(LONE_JSON))
        deep_ok = ok(lambda dec=dec: dec(deep))
        encode_us = per_record_us(enc, RECORDS, number)
        decode_us = per_record_us(dec, encoded, number)
        print(f"| {name} | {encode_us:.2f} | {decode_us:.2f} "
              f"| {out_ok} | {in_ok} | {deep_ok} | {nan_refused()} |")
    from dsh import json as dj

    frozen = [dj.snapshot_json(r) for r in RECORDS]
    print(f"| dsh.json (orjson + freeze/validate) | {per_record_us(dj.dumps, frozen, number):.2f} "
          f"| {per_record_us(dj.loads, encoded, number):.2f} | yes | yes | yes | yes |")
    checkpoint = [orjson.dumps(CHECKPOINT)]
    print(f"| dsh.json, a {len(checkpoint[0]):,}-byte LangGraph checkpoint (channel versions) "
          f"| {per_record_us(dj.dumps, [dj.snapshot_json(CHECKPOINT)], number):.2f} "
          f"| {per_record_us(dj.loads, checkpoint, number):.2f} | yes | yes | yes | yes |")


if __name__ == "__main__":
    main()

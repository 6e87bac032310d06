"""The load-path accelerators of ``dsh._speedups`` against the pure-Python reference loops.

Three C passes shortcut the cold read (docs/stores.md#the-backend-contract,
docs/formats.md#reading-the-committed-region, docs/rules.md#the-read-pipeline,
docs/rules.md#seed-validation):

* ``scan_lines``: the JSONL scanner's ordinary lines (decode, freeze, chunk-row expansion,
  seq continuity); it stops before any line the Python scanner must judge;
* ``stored_prescan``: finds the first event legacy normalisation could touch and the first
  unknown, non-ignorable type, so a log without either skips both Python passes;
* ``admit_plain``: the common case of ``Session.restore``'s admission; plain log-only events
  and plain surface appends are admitted without the per-event Python loop.

Each test runs the same input through both paths (the accelerator patched out for the Python
one) and requires exactly the same result: events (values, types, key order), scan positions,
line numbers and suspect-tail reasons, or the same error with the same message and ``where``.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib
import itertools
import json
import operator
import os
import subprocess
import sys
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dsh.json as dj
import dsh.persistence._legacy as legacy_module
import dsh.persistence._read as read_module
import dsh.persistence.jsonl._format as fmt
import dsh.persistence.sqlite._schema as sqlite_schema
import dsh.session._session as session_module
import dsh.session._surface as surface_module
from dsh._errors import DshError
from dsh.json import FrozenDict, FrozenList, dumps, thaw
from dsh.persistence._contract import ColdRead
from dsh.persistence._legacy import python_stored_prescan
from dsh.session._events import KNOWN_EVENT_TYPES, SURFACE_EVENT_TYPES, Event, as_event
from dsh.session._session import Session
from tests.conftest import DSH_LOGS, kept_bytes
from tests.persistence.test_legacy import LEGACY_CASES, MSG, make, stored_events
from tests.strategies import StepClock, apply_script, examples, hostile_json, log_scripts

if dj._speedups is None:
    if os.environ.get("CI") and not os.environ.get("DSH_NO_SPEEDUPS"):
        importlib.import_module("dsh._speedups")  # raises: the CI build lost the extension
        pytest.fail("dsh._speedups is built but out of date (see the RuntimeWarning of "
                    "dsh.json): CI must run this build's accelerator", pytrace=False)
    pytest.skip("SKIPPED LOUDLY: dsh._speedups is not built or DSH_NO_SPEEDUPS is set; the "
                "pure-Python load paths are in use", allow_module_level=True)

HEADER = b'{"type":"session","version":0,"id":"s","createdAt":1}\n'


def outcome(fn: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("ok", fn())
    except DshError as exc:
        return ("error", type(exc).__name__, exc.message, exc.code, dict(exc.where))


def deep_types(value: Any) -> Any:
    """The value with every container's type name, to compare container types as well."""
    if isinstance(value, dict):
        return (type(value).__name__, [(k, deep_types(v)) for k, v in value.items()])
    if isinstance(value, list):
        return (type(value).__name__, [deep_types(v) for v in value])
    return (type(value).__name__, value)


# --- the JSONL scanner -----------------------------------------------------------------------


def scan(body: bytes, pieces: int = 1) -> tuple[Any, ...]:
    """Scan ``body`` (the text after the header) fed in ``pieces`` parts; everything observable."""
    def run() -> tuple[Any, ...]:
        scanner = fmt.Scanner(path="/x/session.jsonl", start_offset=len(HEADER))
        step = max(1, len(body) // pieces)
        for start in range(0, len(body), step):
            scanner.feed(body[start:start + step])
        result = scanner.finish()
        return (deep_types(result.events), result.committed, result.end, result.lines,
                result.issue_line, result.issue_offset, result.reason)
    return outcome(run)


def both_scans(body: bytes, pieces: int = 1) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    fast = scan(body, pieces)
    saved = fmt.c_scan_lines
    fmt.c_scan_lines = None
    try:
        slow = scan(body, pieces)
    finally:
        fmt.c_scan_lines = saved
    return fast, slow


def log_body(actions: Any, pack: bool) -> bytes:
    session = Session.create("s", clock=StepClock(1_700_000_000_000, 7))
    apply_script(session, actions)
    return fmt.encode_records(list(session.events), pack_chunks=pack)


ROW = {"type": "text-chunks", "seq0": 0, "time0": 5,
       "data": {"turn": 1, "step": 1, "index": 0, "dt": [1, 2], "texts": ["a", "b", "c"]}}
TOOL_ROW = {"type": "tool-call-chunks", "seq0": 0, "time0": 5,
            "data": {"turn": 1, "step": 1, "index": 0, "dt": [0, -3], "id": "c1",
                     "name": "read", "args": ["{", "\"p\"", "}"]}}


def with_data(row: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**row, "data": {**row["data"], **changes}}


def without(row: dict[str, Any], key: str) -> dict[str, Any]:
    return {**row, "data": {k: v for k, v in row["data"].items() if k != key}}


# rows the Python decoder accepts or refuses in every way it knows
ROWS: list[Any] = [
    ROW, TOOL_ROW, without(TOOL_ROW, "name"), {**ROW, "type": "reasoning-chunks"},
    with_data(ROW, dt=[1]), with_data(ROW, texts=[]), with_data(ROW, texts=["a", 1, "c"]),
    with_data(ROW, dt=[1, True]), with_data(ROW, dt=[1, 2**53]), with_data(ROW, turn="1"),
    with_data(ROW, step=None), with_data(ROW, index=True), with_data(ROW, turn=1.5),
    with_data(ROW, extra=1), without(ROW, "dt"), with_data(TOOL_ROW, id=3),
    with_data(TOOL_ROW, name=None), {**ROW, "seq0": -1}, {**ROW, "seq0": True},
    {**ROW, "time0": 2**53 - 2}, {**ROW, "time0": -(2**53 - 1)},
    {**ROW, "time0": 2**53 - 1, "data": {**ROW["data"], "dt": [0, 1]}},
    {**ROW, "data": [1]}, {**ROW, "extra": 1}, {k: v for k, v in ROW.items() if k != "time0"},
    {**ROW, "seq0": 2**53 - 2},
]

LINES: list[bytes] = [
    b'{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}',
    b'{"type":"x/y","seq":0,"time":1,"data":{"n":12345678901234567890}}',
    b'{"type":"x/y","seq":0,"time":1,"data":{"s":"1234567890123456789"}}',
    b'{"type":"x/y","seq":0,"time":1,"data":{"s":"\\ud800"}}',
    b'{"type":"x/y","seq":0,"time":1,"data":{"f":-0.0,"g":2.0}}',
    b'{"type":"x/y","seq":0,"time":1,"data":{"n":9007199254740992}}',
    b'{"type":"x/y","seq":0,"time":1,"data":NaN}',
    b'{"type":"x/y","seq":0,"time":1,"data":{"a":1e400}}',
    b'{"type":"x/y","seq":0,"time":1,"data":{}',
    b'{"type":"x/y","seq":-1,"time":1,"data":{}}',
    b'{"type":"x/y","seq":1.0,"time":1,"data":{}}',
    b'{"type":"x/y","seq":true,"time":1,"data":{}}',
    b'{"type":"x/y","time":1,"data":{}}',
    b'[1,2]', b'null', b'"text"', b'', b'\xff\xfe', b'{"a":' + b"[" * 300 + b"]" * 300 + b"}",
    b'{"type":"turn/end","seq":5,"time":1,"data":{"turn":1,"reason":{"kind":"completed"}}}',
    *(orjson.dumps(row) for row in ROWS),
]


def test_scan_lines_matches_python_on_every_line_shape() -> None:
    first = b'{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}\n'
    for line in LINES:
        for body in (line + b"\n", first + line + b"\n", first + line + b"\n" + first,
                     line + b"\n" + line + b"\n", first + line):
            fast, slow = both_scans(body)
            assert fast == slow, body


def test_scan_lines_expands_rows_exactly_like_python() -> None:
    body = b"".join(orjson.dumps(row) + b"\n" for row in (ROW,))
    fast, slow = both_scans(body)
    assert fast == slow
    assert fast[0] == "ok"
    events = fast[1][0][1]
    assert len(events) == 3  # the three members, seq 0..2, times 5, 6, 8
    assert [e[1][2][1][1] for e in events] == [5, 6, 8]


def scanned_alike(records: list[dict[str, Any]]) -> list[Event]:
    """The events a scan of ``records`` (one a line) gives, after checking the C and Python
    scans agree on them."""
    body = b"".join(orjson.dumps(r) + b"\n" for r in records)
    fast, slow = both_scans(body)
    assert fast == slow and fast[0] == "ok"
    scanner = fmt.Scanner(path="p", start_offset=0)
    scanner.feed(body)
    return scanner.finish().events


def shared_in_a_pass(scan: Callable[[], list[Event]],
                     shared: Callable[[list[Event]], bool]) -> list[Event]:
    """The events of the first of five scans in which ``shared`` (the identities a test pins)
    holds. Sharing is a cache: a bounded table, hashed on object addresses, keeps the newest
    record of a slot (docs/formats.md#record-lines), so two records of one pass can take one
    slot and one share be missed by chance (about 1 pass in 15 for these few records, new
    addresses each pass); five misses in a row are below 1e-5."""
    for _ in range(5):
        events = scan()
        if shared(events):
            return events
    raise AssertionError("five scans shared none of the records pinned")


def test_expanded_chunks_share_equal_records_and_stay_equal_to_python() -> None:
    # a packed row's repeated tokens come back as one chunk object (and one data object per
    # turn and step); a different index, turn, width or a long text keeps them apart, and the
    # values are exactly the Python expansion's (docs/formats.md#chunk-rows)
    long = "x" * 33
    texts = [" the", " cat", " the", long, long, "\u00e9", "\u00e9", " the"]
    rows = [{"type": "text-chunks", "seq0": 0, "time0": 5,
             "data": {"turn": 1, "step": 1, "index": 0, "dt": [0, 0, 1, 0, 0, 0, 2],
                      "texts": texts}},
            {"type": "text-chunks", "seq0": 8, "time0": 9,
             "data": {"turn": 2, "step": 1, "index": 0, "dt": [0], "texts": [" the", " the"]}},
            {"type": "reasoning-chunks", "seq0": 10, "time0": 9,
             "data": {"turn": 2, "step": 1, "index": 1, "dt": [0], "texts": [" the", " the"]}},
            {"type": "tool-call-chunks", "seq0": 12, "time0": 9,
             "data": {"turn": 2, "step": 1, "index": 2, "dt": [0, 0], "id": "c1",
                      "name": "read", "args": ["{", "{", "}"]}}]
    def shared(events: list[Event]) -> bool:
        chunks = [e["data"]["chunk"] for e in events]
        return (chunks[0] is chunks[2] is chunks[7] and events[0]["data"] is events[7]["data"]
                and chunks[5] is chunks[6]  # a wider str is shared as well
                and chunks[10] is chunks[11] and chunks[12] is chunks[13])

    events = shared_in_a_pass(lambda: scanned_alike(rows), shared)
    chunks = [e["data"]["chunk"] for e in events]
    assert [c.get("text", c.get("argumentsDelta")) for c in chunks] == [
        *texts, " the", " the", " the", " the", "{", "{", "}"]
    assert [e["time"] for e in events] == [5, 5, 5, 6, 6, 6, 6, 8, 9, 9, 9, 9, 9, 9, 9]
    assert chunks[3] is not chunks[4] and chunks[3] == chunks[4]  # a long text is not
    assert chunks[8] == chunks[0] and events[8]["data"] is not events[0]["data"]  # turn 2
    assert chunks[10]["type"] == "reasoning-delta" and chunks[10] != chunks[8]
    assert all(type(c) is FrozenDict for c in chunks) and all(type(e) is Event for e in events)


def test_scan_lines_matches_python_on_every_dsh_log() -> None:
    root = DSH_LOGS
    paths = sorted(p for kind in ("jsonl", "jsonl-unpacked") for p in (root / kind).rglob(
        "session.jsonl"))
    assert paths, f"no dsh logs under {root}"
    for path in paths:
        data = path.read_bytes()
        body = data[data.index(b"\n") + 1:]
        for pieces in (1, 7):
            fast, slow = both_scans(body, pieces)
            assert fast == slow, path


_mutation = st.one_of(
    st.tuples(st.just("cut"), st.floats(0, 1)),
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(0, 255)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.sampled_from(LINES)),
    st.tuples(st.just("duplicate"), st.floats(0, 1)),
    st.tuples(st.just("drop"), st.floats(0, 1)),
)


def mutate(body: bytes, mutation: tuple[Any, ...]) -> bytes:
    lines = body.split(b"\n")
    kind, where = mutation[0], mutation[1]
    if kind == "cut":
        return body[:int(len(body) * where)]
    if kind == "flip":
        i = min(len(body) - 1, int(len(body) * where))
        return body[:i] + bytes([mutation[2]]) + body[i + 1:] if body else body
    i = min(len(lines) - 1, int(len(lines) * where))
    if kind == "insert":
        lines.insert(i, mutation[2])
    elif kind == "duplicate":
        lines.insert(i, lines[i])
    else:
        del lines[i]
    return b"\n".join(lines)


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(script=log_scripts(open_tail=None), pack=st.booleans(),
       mutations=st.lists(_mutation, max_size=3), pieces=st.integers(1, 5))
def test_scan_lines_matches_python_on_random_and_damaged_logs(
        script: Any, pack: bool, mutations: list[tuple[Any, ...]], pieces: int) -> None:
    body = log_body(script, pack)
    for mutation in mutations:
        body = mutate(body, mutation)
    fast, slow = both_scans(body, pieces)
    assert fast == slow


def test_scan_lines_events_are_untracked_events() -> None:
    import gc

    body = orjson.dumps(ROW) + b"\n" + orjson.dumps(
        {"type": "x/y", "seq": 3, "time": 1, "data": {"a": [1, {"b": 2}]}}) + b"\n"
    scanner = fmt.Scanner(path="p", start_offset=0)
    scanner.feed(body)
    events = scanner.finish().events
    assert [type(e) for e in events] == [Event] * 4
    assert not any(gc.is_tracked(e) for e in events)
    with pytest.raises(TypeError):
        events[0]["seq"] = 9


@settings(max_examples=examples(200), deadline=None)
@given(pad=st.integers(0, 40), digits=st.integers(1, 24), where=st.sampled_from(
    ["number", "string", "key", "negative"]), tail=st.integers(0, 25))
def test_scan_lines_leaves_every_long_digit_run_to_python(pad: int, digits: int, where: str,
                                                          tail: int) -> None:
    # A literal of 19+ digits may not fit 64 bits (orjson would round it): the C pass must
    # see every such run wherever it falls, and hand the line to Python.
    run = "9" * digits
    text = "x" * pad
    value = {"number": run, "string": f'"{run}"', "key": "1", "negative": f"-{run}"}[where]
    key = f'"{text}{run}"' if where == "key" else f'"{text}"'
    line = (f'{{"type":"x/y","seq":0,"time":1,"data":{{{key}:{value},'
            f'"t":"{"y" * tail}"}}}}').encode()
    fast, slow = both_scans(line + b"\n")
    assert fast == slow
    # past 2**53 - 1 a number is refused (an exact error in both); text is always fine
    assert fast[0] == ("ok" if where in ("string", "key") or digits < 16 else "error")


# JSON values of every kind the direct parser meets (docs/architecture.md#the-c-accelerator):
# text with escapes, controls, non-ASCII, astral characters and surrogates; numbers at and
# past the safe bounds, floats of every size; duplicate keys; nesting.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**54), 2**54)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40)
    | st.sampled_from(["", "é", "\u2028", "\U0001f600", "a\"b\\c/\b\f\n\r\t\x00\x1f",
                       "\ud800", "x" * 33, "type", "text-chunks"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


def json_texts(value: Any) -> list[bytes]:
    """``value`` as JSON text the ways writers spell it: compact and ASCII-escaped (every
    non-ASCII character a \\u escape, astral ones as surrogate pairs), with spaces between
    tokens and raw UTF-8, and as orjson writes it (when it can)."""
    texts = [json.dumps(value, ensure_ascii=True, separators=(",", ":")).encode(),
             json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")]
    with contextlib.suppress(TypeError):  # a lone surrogate: orjson refuses to write it
        texts.append(orjson.dumps(value))
    return texts


@settings(max_examples=examples(300), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(value=json_values)
def test_scan_lines_parses_any_json_value_as_python_does(value: Any) -> None:
    # The C pass parses a line itself and leaves to orjson (then Python) what it does not
    # take: either way every line gives what the Python scanner gives, event or typed error.
    for text in json_texts(value):
        line = b'{"type":"x/y","seq":0,"time":1,"data":' + text + b"}"
        fast, slow = both_scans(line + b"\n")
        assert fast == slow, line


@pytest.mark.parametrize("literal", [
    b"0", b"-0", b"1", b"-1", b"9007199254740991", b"-9007199254740991", b"9007199254740992",
    b"123456789012345678", b"1.5", b"-1.5", b"1e3", b"1E+3", b"1e-3", b"2.0", b"-0.0", b"0.0",
    b"1e400", b"-1e400", b"1e-400", b"-1e-400", b"0.1", b"2.2250738585072014e-308",
    b"4.9e-324", b"1.7976931348623157e308", b"0.30000000000000004", b"1" + b"0" * 17 + b".5",
    b"3." + b"1" * 70, b"01", b"1.", b".5", b"-", b"+1", b"1e", b"1e+", b"0x10", b"--1",
    b"true", b"false", b"null", b"tru", b"nul", b"True", b"NaN", b"Infinity", b"[]", b"{}",
    b"[1,]", b"[,1]", b'{"a":1,}', b'{"a" :1}', b'{"a":1 }', b' {"a":1}', b'{"a":1,"a":2}',
    b'{"a":{"b":1},"a":{"b":1}}', b'"\\u00e9\\u20ac"', b'"\\uD83D\\uDE00"', b'"\\uDE00"',
    b'"\\u12"', b'"\\x"', b'"a\\tb"', b'"a\tb"', b'"a\\u0000b"', b'"\\"', b'"\\/"',
    b'"\xc3\xa9"', b'"\xc3"',
    b'"\xed\xa0\x80"', b'"\xf0\x9f\x98\x80"', b'"\x7f"', b'"a\x01"', b'"a',
    b"[" * 199 + b"]" * 199, b"[" * 201 + b"]" * 201, b'{"a":[1,2,{"b":[]}]}',
])
def test_scan_lines_takes_each_json_token_as_python_does(literal: bytes) -> None:
    for line in (b'{"type":"x/y","seq":0,"time":1,"data":' + literal + b"}",
                 b'{"type":"x/y","seq":0,"time":1,"data":{"v":' + literal + b'},"t":1}'):
        fast, slow = both_scans(line + b"\n")
        assert fast == slow, line


def test_scan_lines_parses_ordinary_lines_itself_and_hands_the_rest_to_loads() -> None:
    # The direct parser takes what dsh writes; a line it does not take (here: spaces between
    # tokens, a duplicate key) goes through the loads it was given, and the events are equal.
    calls: list[bytes] = []

    def counting_loads(raw: bytes) -> Any:
        calls.append(bytes(raw))
        return orjson.loads(raw)

    def run(buffer: bytes) -> list[Event]:
        out: list[Event] = []
        fmt.c_scan_lines(buffer, 0, 0, 0, counting_loads, Event, out, array("q"), array("q"),
                         KNOWN_EVENT_TYPES, None)
        return out

    plain = (b'{"type":"turn/start","seq":0,"time":1,"data":{"turn":1,"f":0.5,"s":"\\u00e9"}}\n'
             b'{"type":"turn/end","seq":1,"time":2,"data":{"turn":1,"reason":{"kind":"completed"}}}\n')
    spaced = plain.replace(b'"seq":0,', b'"seq": 0, ').replace(
        b'{"kind":"completed"}', b'{"kind":"completed","kind":"completed"}')
    assert run(plain) == run(spaced) == [orjson.loads(line) for line in plain.splitlines()]
    assert calls == spaced.splitlines()


def test_scan_lines_parses_long_digit_runs_in_strings_and_fractions_itself() -> None:
    # the C twin of dsh.json.has_long_number (docs/formats.md#lossless-json): a LangGraph
    # channel version (19+ digits after a '.') or an id's digits after a letter are no integer
    # literal, so the line is parsed in C; a long integer literal still goes to Python
    calls: list[bytes] = []

    def counting_loads(raw: bytes) -> Any:
        calls.append(bytes(raw))
        return orjson.loads(raw)

    def scanned(line: bytes) -> tuple[int, list[Event]]:
        out: list[Event] = []
        pos, _, _ = fmt.c_scan_lines(line + b"\n", 0, 0, 0, counting_loads, Event, out,
                                     array("q"), array("q"), KNOWN_EVENT_TYPES, None)
        return pos, out

    for data in (b'{"v":"00000000000000000000000000000002.0.30191874065201247171"}',
                 b'{"id":"run_12345678901234567890123","f":0.12345678901234567890123}'):
        line = b'{"type":"x/y","seq":0,"time":1,"data":' + data + b"}"
        assert scanned(line) == (len(line) + 1, [orjson.loads(line)])
    assert calls == []
    long_int = b'{"type":"x/y","seq":0,"time":1,"data":{"n":12345678901234567890}}'
    assert scanned(long_int) == (0, [])  # handed to the Python scanner


def test_scan_lines_shares_equal_nested_records_never_events() -> None:
    # equal small records of scalars (a source, a step's data) decoded in one pass are one
    # object; a record holding a long text, a float or a mutable-looking difference is not;
    # the events themselves never are (each is retyped to Event alone); values stay equal
    # to the Python scan's
    user = {"id": "u", "role": "user", "source": {"kind": "user"},
            "content": [{"type": "text", "text": "hi"}]}
    long = "x" * 33
    records = [
        {"type": "step/start", "seq": 0, "time": 5, "data": {"turn": 1, "step": 1}},
        {"type": "user/message", "seq": 1, "time": 5, "data": user, "surfaceOp": "append"},
        {"type": "user/message", "seq": 2, "time": 5, "data": {**user, "id": "v"},
         "surfaceOp": "append"},
        {"type": "step/end", "seq": 3, "time": 5, "data": {"turn": 1, "step": 1}},
        {"type": "x/note", "seq": 4, "time": 5, "data": {"t": long, "n": {"f": 2.5}}},
        {"type": "x/note", "seq": 5, "time": 5, "data": {"t": long, "n": {"f": 2.5}}},
        {"type": "step/end", "seq": 6, "time": 5, "data": {"turn": 1, "step": 2}}]
    events = shared_in_a_pass(lambda: scanned_alike(records), lambda events: (
        events[0]["data"] is events[3]["data"]  # {"turn": 1, "step": 1}
        and events[1]["data"]["source"] is events[2]["data"]["source"]  # {"kind": "user"}
        and events[1]["data"]["content"][0] is events[2]["data"]["content"][0]))
    assert events == records and all(type(e) is Event for e in events)
    assert len({id(e) for e in events}) == len(events)
    assert events[6]["data"] is not events[0]["data"]
    assert events[1]["data"] is not events[2]["data"]  # different ids
    assert events[4]["data"] is not events[5]["data"]  # a long text: never compared
    assert events[4]["data"]["n"] is not events[5]["data"]["n"]  # a float: not shared
    assert type(events[0]["data"]) is FrozenDict and not gc.is_tracked(events[0]["data"])


def test_scan_lines_freezes_parsed_trees_in_place_and_values_stay_right() -> None:
    record = {"type": "x/y", "seq": 0, "time": 5, "data": {
        "f": 2.0, "g": 2.5, "list": [1.0, {"deep": [3.0, "text"]}, []], "empty": {},
        "short": "turn/start", "again": "turn/start"}}
    scanner = fmt.Scanner(path="p", start_offset=0)
    scanner.feed(orjson.dumps(record) + b"\n")
    (event,) = scanner.finish().events
    assert type(event) is Event
    data = event["data"]
    assert deep_types(data) == deep_types(FrozenDict({
        "f": 2, "g": 2.5, "list": dj.FrozenList([1, FrozenDict({"deep": dj.FrozenList(
            [3, "text"])}), dj.FrozenList()]), "empty": FrozenDict(),
        "short": "turn/start", "again": "turn/start"}))
    assert data["short"] is data["again"]  # one object per short string value
    with pytest.raises(TypeError):
        data["list"].append(1)
    with pytest.raises(TypeError):
        data["list"][1]["deep"][0] = 9
    del scanner, event
    import gc
    gc.collect()  # retyped containers free as their frozen type: no crash, no leak of types


def test_the_shared_string_table_grows_in_a_pass_and_keeps_sharing() -> None:
    # docs/adapters.md#memory: the pass's table of shared short strings starts small and
    # doubles when half full; in a fresh process (the table at its first size) one pass of
    # 40,000 distinct short strings shares each one across its growths until it holds 32,768
    # strings, then leaves new ones unshared, and every value stays right; a second pass in
    # the same process (the grown table kept) shares again
    script = (
        "import orjson\n"
        "import dsh.persistence.jsonl._format as fmt\n"
        "def scanned(prefix):\n"
        "    s = fmt.Scanner(path='p', start_offset=0)\n"
        "    s.feed(b''.join(orjson.dumps({'type': 'x/y', 'seq': i, 'time': 1, 'data': {\n"
        "        'v': f'{prefix}{i}', 'w': f'{prefix}{i}'}}) + b'\\n' for i in range(40000)))\n"
        "    events = s.finish().events\n"
        "    assert [e['data']['v'] for e in events] == [f'{prefix}{i}' for i in range(40000)]\n"
        "    assert [e['data']['w'] for e in events] == [f'{prefix}{i}' for i in range(40000)]\n"
        "    return [e['data']['v'] is e['data']['w'] for e in events]\n"
        "for prefix in ('s', 't'):\n"
        "    shared = scanned(prefix)\n"
        "    assert all(shared[:32000]), shared.index(False)\n"
        "    assert not any(shared[32768:])\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=False)
    assert (out.returncode, out.stdout, out.stderr) == (0, "ok\n", "")


# --- legacy / vocabulary prescan -------------------------------------------------------------


def _with_inserts(script: Any, inserts: list[tuple[float, Event]]) -> list[Event]:
    """The script's log with legacy shapes and unknown types inserted anywhere, renumbered."""
    session = Session.create("s", clock=StepClock(1_700_000_000_000, 7))
    apply_script(session, script)
    records: list[Any] = list(session.events)
    for where, case in inserts:
        records.insert(int(len(records) * where), case)
    return [as_event({**e, "seq": i}) for i, e in enumerate(records)]


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(script=log_scripts(open_tail=None), pack=st.booleans(), inserts=st.lists(
    st.tuples(st.floats(0, 1), st.sampled_from(LEGACY_CASES)), max_size=3),
    mutations=st.lists(_mutation, max_size=2), pieces=st.integers(1, 4))
def test_scan_prescan_is_what_stored_prescan_finds(script: Any, pack: bool,
                                                   inserts: list[tuple[float, Event]],
                                                   mutations: list[tuple[Any, ...]],
                                                   pieces: int) -> None:
    # The scanner notes the read pipeline's prescan while each event is decoded; it must be
    # exactly what the Python rule finds in the events it returns (None: Python decoded a line).
    events = _with_inserts(script, inserts)
    body = fmt.encode_records(events, pack_chunks=pack)
    for mutation in mutations:
        body = mutate(body, mutation)
    scanner = fmt.Scanner(path="p", start_offset=0)
    step = max(1, len(body) // pieces)
    try:
        for start in range(0, len(body), step):
            scanner.feed(body[start:start + step])
        result = scanner.finish()
    except DshError:
        return  # damage the Python path refuses: no prescan to compare
    if result.prescan is not None:
        assert result.prescan == python_stored_prescan(result.events, KNOWN_EVENT_TYPES)


def test_scan_prescan_finds_legacy_and_unknown_events_and_yields_to_python_lines() -> None:
    first = make("turn/start", 0, {"turn": 1})
    legacy = make("turn/start", 1, {"turn": 1, "trigger": {}})
    unknown = make("x/unknown", 2, {})
    body = b"".join(orjson.dumps(e) + b"\n" for e in (first, legacy, unknown))
    scanner = fmt.Scanner(path="p", start_offset=0)
    scanner.feed(body)
    assert scanner.finish().prescan == (1, 2)
    clean = b"".join(orjson.dumps(make("turn/start", i, {"turn": 1})) + b"\n" for i in range(3))
    scanner = fmt.Scanner(path="p", start_offset=0)
    scanner.feed(clean)
    assert scanner.finish().prescan == (-1, -1)
    # a line Python decodes (a 19-digit run inside a string; one opening a string stays in
    # C): the scanner no longer vouches
    odd = clean + b'{"type":"x/y","seq":3,"time":1,"data":{"s":"id 1234567890123456789"}}\n'
    scanner = fmt.Scanner(path="p", start_offset=0)
    scanner.feed(odd)
    result = scanner.finish()
    assert len(result.events) == 4 and result.prescan is None


def test_stored_prescan_answers_as_the_python_rule_on_every_legacy_shape() -> None:
    for event in LEGACY_CASES:
        assert dj.c_stored_prescan([event], KNOWN_EVENT_TYPES) == \
            python_stored_prescan([event], KNOWN_EVENT_TYPES), event
    assert dj.c_stored_prescan(LEGACY_CASES, KNOWN_EVENT_TYPES) == \
        python_stored_prescan(LEGACY_CASES, KNOWN_EVENT_TYPES)


@settings(max_examples=examples(300), deadline=None)
@given(events=st.lists(stored_events, max_size=8), as_tuple=st.booleans(),
       junk=st.sampled_from([None, 0, "x", [1]]), where=st.floats(0, 1))
def test_stored_prescan_answers_as_the_python_rule(events: list[Event], as_tuple: bool,
                                                   junk: Any, where: float) -> None:
    # the C pass is a copy of the rule in dsh.persistence._legacy: same indices, also when a
    # stored item is not a record at all
    mixed: list[Any] = list(events)
    mixed.insert(int(len(mixed) * where), junk)
    for seq in (events, mixed):
        items: Any = tuple(seq) if as_tuple else seq
        assert dj.c_stored_prescan(items, KNOWN_EVENT_TYPES) == \
            python_stored_prescan(items, KNOWN_EVENT_TYPES)


@settings(max_examples=examples(60), deadline=None)
@given(picks=st.lists(st.sampled_from(LEGACY_CASES), max_size=6))
def test_read_pipeline_matches_python_with_and_without_prescan(picks: list[Event]) -> None:
    events = [as_event({**e, "seq": i}) for i, e in enumerate(picks)]
    header = FrozenDict({"type": "session", "version": 0, "id": "s", "createdAt": 1})
    cold = ColdRead(header, tuple(events), None, "r")

    def run() -> Any:
        got, closers = read_module.read_pipeline("s", cold)
        return deep_types(list(got)), deep_types(list(closers))

    fast = outcome(run)
    saved = legacy_module.c_stored_prescan
    legacy_module.c_stored_prescan = None
    try:
        slow = outcome(run)
    finally:
        legacy_module.c_stored_prescan = saved
    assert fast == slow


# --- restore admission -----------------------------------------------------------------------


def damage_at(seed: list[Any], damage: tuple[float, tuple[str, Any]]) -> tuple[int, dict[str, Any]]:
    """The event at fraction ``damage[0]`` of ``seed`` as a dict, its key dropped or set."""
    i = min(len(seed) - 1, int(len(seed) * damage[0]))
    key, value = damage[1]
    fields = dict(seed[i])
    if key == "drop":
        fields.pop(value, None)
    elif key != "plain":
        fields[key] = value
    return i, fields


def restore_outcome(seed: Any, header: Any, fast: bool) -> tuple[Any, ...]:
    saved = session_module.c_admit_plain
    if not fast:
        session_module.c_admit_plain = None
    try:
        def run() -> Any:
            restored = Session.restore("s", seed, header, clock=StepClock())
            return (deep_types(list(restored.events)), list(restored.surface.nodes),
                    deep_types(restored.derive_messages()), restored.header)
        return outcome(run)
    finally:
        session_module.c_admit_plain = saved


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(script=log_scripts(open_tail=None), damage=st.one_of(
    st.none(), st.tuples(st.floats(0, 1), st.sampled_from([
        ("seq", 99), ("seq", True), ("time", 2**53), ("time", "1"), ("type", 3),
        ("type", "request/header-delta"), ("type", "session/end-seed"), ("extra", 1),
        ("ignorable", True), ("data", None), ("drop", "data"), ("type", "user/message"),
        ("plain", None), ("surfaceOp", "append"), ("sourceEventSeqs", []),
        ("sourceEventSeqs", [0, 0]), ("sourceEventSeqs", [0, 1]), ("sourceEventSeqs", [99]),
        ("sourceEventSeqs", [True]), ("sourceEventSeqs", [-1]), ("sourceEventSeqs", {}),
        ("sourceEventSeqs", list(range(70))), ("drop", "surfaceOp")]))))
def test_restore_matches_python_with_and_without_specials(script: Any, damage: Any) -> None:
    session = Session.create("s", clock=StepClock())
    apply_script(session, script)
    seed: list[Any] = list(session.events)
    if damage is not None and seed:
        i, fields = damage_at(seed, damage)
        # "plain": a plain dict, not an Event; else values stay frozen, no snapshot (it
        # refuses 2**53)
        seed[i] = fields if damage[1][0] == "plain" else as_event(fields)
    header = session.header
    for container in (seed, tuple(seed)):
        fast = restore_outcome(container, header, True)
        assert fast == restore_outcome(container, header, False)


def create_outcome(seed: Any, header: Any, fast: bool) -> tuple[Any, ...]:
    saved = session_module.c_admit_plain, session_module.c_snapshot_events
    if not fast:
        session_module.c_admit_plain = session_module.c_snapshot_events = None
    try:
        def run() -> Any:
            created = Session.create("s", seed=seed, header=header, clock=StepClock())
            return (deep_types(list(created.events)), list(created.surface.nodes),
                    deep_types(created.derive_messages()), created.header)
        return outcome(run)
    finally:
        session_module.c_admit_plain, session_module.c_snapshot_events = saved


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(script=log_scripts(open_tail=None), damage=st.one_of(
    st.none(), st.tuples(st.floats(0, 1), st.sampled_from([
        ("seq", 99), ("time", 2**53), ("time", float("nan")), ("type", 3),
        ("type", "session/end-seed"), ("extra", 1), ("ignorable", True), ("ignorable", False),
        ("data", None), ("data", {"turn": 0}), ("data", {"turn": 1, "step": True}),
        ("data", ("not", "json")), ("data", {"n": 2**60}), ("drop", "data"),
        ("type", "turn/start"), ("type", "step/end"), ("surfaceOp", "append"),
        ("sourceEventSeqs", [99]), ("drop", "surfaceOp")]))), plain=st.booleans())
def test_create_matches_python_with_and_without_specials(script: Any, damage: Any,
                                                         plain: bool) -> None:
    # Session.create's snapshot seed (imports): frozen in C, plain events admitted in C,
    # turn-shaped ones checked in Python; the same session or the same refusal either way
    session = Session.create("s", clock=StepClock())
    apply_script(session, script)
    seed: list[Any] = [thaw(e) if plain else e for e in session.events]
    if damage is not None and seed:
        i, fields = damage_at(seed, damage)
        seed[i] = fields
    header = dict(session.header)
    for container in (seed, tuple(seed)):
        fast = create_outcome(container, header, True)
        assert fast == create_outcome(container, header, False)


def test_admit_plain_stops_at_each_event_that_needs_a_look() -> None:
    session = Session.create("s", clock=StepClock())
    session.append("request/header", {"header": {"config": {"provider": "p", "model": "m"}},
                                      "reason": "initial"})
    session.append("turn/start", {"turn": 1})
    session.append("user/message", {**MSG, "content": [{"type": "text", "text": "hi"}]},
                   surface_op="append")
    session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    session.append("request/context", {"provider": "p", "model": "m"})
    events = [*session.events, make("session/end-seed", 5, {})]

    def stops(seed: list[Event], base: int = 0) -> tuple[list[int], list[int], dict[int, Any]]:
        nodes: list[int] = []
        cache: dict[int, Any] = {}
        found, pos = [], 0
        while (stop := dj.c_admit_plain(seed, pos, base, Event, SURFACE_EVENT_TYPES, nodes,
                                        cache)) < len(seed):
            found.append(stop)
            pos = stop + 1
        return found, nodes, cache

    # request/header (0), request/context (4) and the end-seed (5) need Python; the plain
    # surface append (2) is admitted with its node and message
    assert stops(events) == ([0, 4, 5], [2], {2: events[2]["data"]})
    shifted = [*events[:1], as_event({**events[1], "seq": 7}), *events[2:]]
    assert stops(shifted)[0] == [0, 1, 4, 5]
    assert stops(events[2:4], base=2) == ([], [2], {2: events[2]["data"]})
    assert stops(events[2:4], base=0)[0] == [0, 1]  # seqs must be base + index
    # an ignorable log-only event is plain too
    marked = [*events[:3], as_event({**events[3], "ignorable": True}), *events[4:]]
    assert stops(marked) == ([0, 4, 5], [2], {2: events[2]["data"]})
    false = [*events[:3], as_event({**events[3], "ignorable": False}), *events[4:]]
    assert stops(false)[0] == [0, 3, 4, 5]
    # a stop type is admitted when its data has the common turn shape, else goes to Python
    def stops_typed(seed: list[Event], types: frozenset[str]) -> list[int]:
        found, pos = [], 0
        while (stop := dj.c_admit_plain(seed, pos, 0, Event, SURFACE_EVENT_TYPES, [], {},
                                        types)) < len(seed):
            found.append(stop)
            pos = stop + 1
        return found

    assert stops_typed(events, frozenset({"turn/start", "turn/end"})) == [0, 4, 5]
    zero = [*events[:1], as_event({**events[1], "data": {"turn": 0}}), *events[2:]]
    assert stops_typed(zero, frozenset({"turn/start", "turn/end"})) == [0, 1, 4, 5]
    # a type the C check does not know goes to Python whatever its data
    assert stops_typed(events, frozenset({"request/context", "user/message"})) == [0, 2, 4, 5]


_TURN_DATA: list[tuple[str, Any]] = [
    ("turn/start", {"turn": 1}), ("turn/start", {"turn": 2**53 - 1}), ("turn/start", {"turn": 0}),
    ("turn/start", {"turn": -1}), ("turn/start", {"turn": True}), ("turn/start", {"turn": 1.0}),
    ("turn/start", {"turn": "1"}), ("turn/start", {"turn": 1, "x": 1}), ("turn/start", {}),
    ("turn/start", None), ("turn/start", [1]), ("turn/start", {"step": 1}),
    ("step/start", {"turn": 1, "step": 1}), ("step/end", {"turn": 3, "step": 9}),
    ("step/start", {"turn": 1, "step": 0}), ("step/end", {"turn": 1}),
    ("step/end", {"turn": 1, "step": 1, "x": 0}), ("step/start", {"turn": 1, "x": 1}),
    ("step/end", {"turn": -1, "step": 1}), ("step/start", {"turn": 1, "step": False}),
    *[("turn/end", {"turn": 1, "reason": {"kind": kind}})
      for kind in ("completed", "blocked", "max-tokens", "interrupted", "aborted", "error",
                   "other", "", 1, None)],
    ("turn/end", {"turn": 1, "reason": {"kind": "completed", "note": 1}}),
    ("turn/end", {"turn": 1, "reason": {"kind": "aborted", "reason": {"kind": "user"}}}),
    ("turn/end", {"turn": 1, "reason": {"kind": "aborted", "reason": "user"}}),
    ("turn/end", {"turn": 1, "reason": {"kind": "aborted", "reason": {}, "x": 1}}),
    ("turn/end", {"turn": 1, "reason": {"kind": "error",
                                        "error": {"message": "m", "code": "C"}}}),
    ("turn/end", {"turn": 1, "reason": {"kind": "error", "error": {"message": "m"}}}),
    ("turn/end", {"turn": 0, "reason": {"kind": "completed"}}),
    ("turn/end", {"turn": 1, "reason": "completed"}), ("turn/end", {"turn": 1}),
    ("turn/end", {"turn": 1, "reason": {"kind": "completed"}, "x": 1}),
]


@pytest.mark.parametrize(("etype", "data"), _TURN_DATA)
def test_admit_plain_admits_a_turn_shaped_event_only_when_python_would(etype: str,
                                                                        data: Any) -> None:
    # A snapshot seed's turn-shaped events: the C pass admits the common shapes the core shape
    # check accepts and leaves every other one (refused or rarer) to that check.
    frozen = dj.snapshot_json(data)  # what a snapshot seed holds (1.0 is 1 there)
    try:
        session_module._check_core_shape(etype, frozen, 0, seed=True)
        accepted = True
    except DshError:
        accepted = False
    event = as_event({"type": etype, "seq": 0, "time": 1, "data": frozen})
    admitted = dj.c_admit_plain([event], 0, 0, Event, SURFACE_EVENT_TYPES, [], {},
                                session_module._TURN_SHAPED) == 1
    common = accepted and (etype != "turn/end" or data["reason"]["kind"] in (
        "completed", "blocked", "max-tokens", "interrupted", "aborted"))
    assert admitted is common, (etype, data, accepted)


def test_the_c_line_scan_answers_as_the_long_number_scan_and_the_bracket_count() -> None:
    # line_scan (the importers' decode_line) is has_long_number and the '[' + '{' count in one
    # pass: the same answers on runs of digits, quotes, brackets and other bytes
    import random

    from dsh.json import has_long_number

    rng = random.Random(24)
    pieces = [b"0", b"7", b'"', b"a", b",", b"-", b".", b"[", b"{", b"}", b"\xff", b" ", b"e",
              b":", b"+", b"E", b"\n"]
    for _ in range(20000):
        raw = b"".join(rng.choice(pieces) if rng.random() < 0.15
                       else bytes([rng.randrange(48, 58)]) for _ in range(rng.randrange(60)))
        assert dj.c_line_scan(raw) == (has_long_number(raw), raw.count(b"[") + raw.count(b"{")), raw
    # a LangGraph channel version: 19+ digits after a '.', inside a string
    assert dj.c_line_scan(b'{"v":"00000000000000000000000000000002.0.30191874065201247171"}') \
        == (False, 1)
    assert dj.c_line_scan(b"1234567890123456789") == (True, 0)
    assert dj.c_line_scan(b'"1234567890123456789"') == (False, 0)
    assert dj.c_line_scan(b'[{"n": 123456789012345678}]') == (False, 2)
    assert dj.c_line_scan(b"") == (False, 0)
    with pytest.raises(TypeError):
        dj.c_line_scan("text")  # type: ignore[arg-type]  # bytes only


def test_snapshot_events_freezes_as_events_up_to_one_python_must_judge() -> None:
    plain = [{"type": "x/y", "seq": 0, "time": 1, "data": {"a": [1, 2.0]}},
             as_event({"type": "x/y", "seq": 1, "time": 1, "data": FrozenDict()}),
             {"type": "x/y", "seq": 2, "time": 1, "data": "s\ud83d\ude00"},  # a pair to join
             {"type": "x/y", "seq": 3, "time": 1, "data": None}]
    out: list[Any] = []
    assert dj.c_snapshot_events(plain, 0, Event, out) == 2
    assert [type(e) for e in out] == [Event, Event] and out[0] == {**plain[0],
                                                                    "data": {"a": [1, 2]}}
    assert out[1] is plain[1] and type(out[0]["data"]["a"][1]) is int
    assert dj.c_snapshot_events(plain, 3, Event, out) == 4 and out[2] == plain[3]
    assert dj.c_snapshot_events([[1]], 0, Event, []) == 0  # not an object: Python refuses it
    assert dj.c_snapshot_events([{"n": float("nan")}], 0, Event, []) == 0
    with pytest.raises(TypeError):
        dj.c_snapshot_events(plain, 0, dict, [])



def test_snapshot_events_owned_freezes_unshared_containers_in_place() -> None:
    # owned=True (an importer's batch, SeedStream(owned=True)): a dict or list only its parent
    # references becomes the frozen one; a shared one is copied and left as it was
    shared = {"k": [1, 2.0]}
    blocks = [{"type": "text", "text": "hi"}]
    first = {"type": "x/y", "seq": 0, "time": 1, "data": {"blocks": blocks, "a": shared,
                                                          "n": 3.0, "s": "é"}}
    second = {"type": "x/y", "seq": 1, "time": 1, "data": {"b": shared}}
    del blocks
    seed: list[Any] = [first, second]
    copied: list[Any] = []
    assert dj.c_snapshot_events(seed, 0, Event, copied) == 2
    out: list[Any] = []
    del first, second
    assert dj.c_snapshot_events(seed, 0, Event, out, True) == 2
    assert out == copied and deep_types(out) == deep_types(copied)
    assert out[0] is seed[0] and out[1] is seed[1] and type(seed[0]) is Event  # retyped
    assert type(out[0]["data"]["blocks"]) is FrozenList and type(out[0]["data"]["n"]) is int
    # the shared record was copied, both times, and stays the caller's plain dict
    assert type(shared) is dict and shared == {"k": [1, 2.0]} and type(shared["k"]) is list
    assert out[0]["data"]["a"] is not shared and type(out[1]["data"]["b"]) is FrozenDict
    held = {"type": "x/y", "seq": 0, "time": 1, "data": {}}  # referenced here too: copied
    out = []
    assert dj.c_snapshot_events([held], 0, Event, out, True) == 1
    assert type(held) is dict and type(out[0]) is Event and out[0] is not held


def test_snapshot_events_owned_leaves_what_python_judges_and_python_agrees() -> None:
    # a lone surrogate, an unsafe int, a tuple: the owned pass stops there, maybe with part of
    # the event frozen in place; the Python walk then gives the copying pass's answer
    def make_seed(bad: Any) -> list[Any]:
        return [{"type": "x/y", "seq": 0, "time": 1,
                 "data": {"ok": [{"v": 1.0}], "bad": [bad], "after": {"w": 2}}}]

    def prefix(seed: list[Any]) -> tuple[Any, ...]:
        return outcome(lambda: session_module._frozen_prefix(seed))

    def created(seed: list[Any]) -> tuple[Any, ...]:
        return outcome(lambda: deep_types(list(Session.create("s", seed=seed,
                                                             clock=StepClock()).events)))

    for bad in ("a\udc80b", 2**60, ("t",), float("nan")):
        copied, owned = make_seed(bad), make_seed(bad)
        assert dj.c_snapshot_events(copied, 0, Event, []) == 0
        assert dj.c_snapshot_events(owned, 0, Event, [], True) == 0
        assert type(owned[0]["data"]["ok"]) is FrozenList  # frozen in place before the stop
        assert prefix(owned) == prefix(copied)
        assert created(owned) == created(copied)


def test_seed_stream_owned_admits_the_same_events_as_the_copying_one(tmp_path: Path) -> None:
    # the Claude Code import's batches, admitted both ways: the same frozen events
    from bench.bench_import import write_claude_code

    from dsh.interop import stream_file
    from dsh.session import SeedStream

    path = tmp_path / "5e551011-0000-4000-8000-00000000beef.jsonl"
    write_claude_code(path, 700)  # about 11,000 events: three batches
    results = []
    for owned in (False, True):
        stream = next(iter(stream_file(path)))
        seed = SeedStream(stream.session_id, header=stream.header, owned=owned)
        admitted: list[Any] = []
        for batch in stream.batches:
            admitted.extend(seed.admit(batch.events))
            seed.settle()
        seed.finish()
        results.append(admitted)
    assert len(results[0]) > 10_000
    assert results[0] == results[1] and deep_types(results[0]) == deep_types(results[1])


def test_load_paths_without_the_accelerator_give_the_same_session(tmp_path: Path) -> None:
    # end to end, in fresh processes: a JSONL store written once, read with and without C
    import subprocess
    import sys

    from dsh.persistence import Persistence, open_backend
    from dsh.session._store import SessionStore

    url = f"jsonl://{tmp_path}/store"
    with Persistence(open_backend(url)) as persistence:
        store = SessionStore(persistence=persistence)
        live = store.create("s")
        for turn in (1, 2):
            live.append("turn/start", {"turn": turn})
            live.append("user/message", {**MSG, "id": f"m{turn}", "content": [
                {"type": "text", "text": "hi"}]}, surface_op="append")
            live.append("step/start", {"turn": turn, "step": 1})
            for k in range(5):
                live.append("assistant/chunk", {"turn": turn, "step": 1, "chunk": {
                    "type": "text-delta", "index": 0, "text": f"t{k}"}})
            live.append("step/end", {"turn": turn, "step": 1})
            live.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})
        store.flush(live)
        store.dispose(live)
    code = ("import sys, orjson; from dsh.persistence import Persistence, open_backend; "
            "p = Persistence(open_backend(sys.argv[1])); i = p.read('s'); "
            "print(orjson.dumps([list(i.events), list(i.closers)]).decode()); p.close()")
    outputs = []
    for env_extra in ({}, {"DSH_NO_SPEEDUPS": "1"}):
        env = {**os.environ, **env_extra}
        proc = subprocess.run([sys.executable, "-c", code, url], capture_output=True,
                              text=True, env=env, check=True)
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1]
    assert len(orjson.loads(outputs[0])[0]) >= 1


# --- SQLite rows -----------------------------------------------------------------------------


def rows_of(script: Any, schema: int) -> list[Any]:
    session = Session.create("s", clock=StepClock(1_700_000_000_000, 7))
    apply_script(session, script)
    encoded = sqlite_schema.encode_batch(list(session.events), schema)
    return [(k + 1, *row[:6], None if schema == 14 else row[6]) for k, row in enumerate(encoded)]


def scan_outcome(rows: list[Any], schema: int, fast: bool) -> tuple[Any, ...]:
    saved = sqlite_schema.c_decode_rows
    if not fast:
        sqlite_schema.c_decode_rows = None
    try:
        def run() -> Any:
            result = sqlite_schema.scan_rows(rows, 0, schema, path="/x/store.db",
                                             session_id="s")
            return (deep_types(result.events), result.torn_seq, result.torn_rowid,
                    result.torn_reason)
        return outcome(run)
    finally:
        sqlite_schema.c_decode_rows = saved


COLUMN_DAMAGE: list[tuple[int, Any]] = [
    (1, -1), (1, True), (1, 2**53), (1, 3.0), (2, ""), (2, 7), (2, "text-chunks"),
    (2, "tool-call-chunks"), (3, "5"), (3, 2**53), (4, b"\x28\xb5\x2f\xfd\x00"), (4, "{"),
    (4, '{"n":12345678901234567890}'), (4, '"\\ud800"'), (4, "-0.0"), (4, 5), (4, None),
    (5, b""), (5, b"\x80"), (5, b"\x02\x00"), (5, b"\x80\x00"), (5, b"\xff" * 9),
    (5, b"\x04\x03"), (5, b"\x04\x06"), (5, "[1]"), (6, '"append"'), (6, '"other"'),
    (6, '{"op":"replace","start":0,"end":0}'), (6, 3), (7, 0), (7, 1), (7, 2), (7, True),
    (7, None),
]


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(script=log_scripts(open_tail=None), schema=st.sampled_from([14, 17]),
       damage=st.lists(st.tuples(st.floats(0, 1), st.sampled_from(COLUMN_DAMAGE)),
                       max_size=2))
def test_decode_rows_matches_python_on_random_and_damaged_rows(
        script: Any, schema: int, damage: list[tuple[float, tuple[int, Any]]]) -> None:
    rows = rows_of(script, schema)
    for where, (column, value) in damage:
        if rows:
            i = min(len(rows) - 1, int(len(rows) * where))
            rows[i] = (*rows[i][:column], value, *rows[i][column + 1:])
    assert scan_outcome(rows, schema, True) == scan_outcome(rows, schema, False)


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(script=log_scripts(open_tail=None), schema=st.sampled_from([14, 17]), inserts=st.lists(
    st.tuples(st.floats(0, 1), st.sampled_from(LEGACY_CASES)), max_size=3),
    damage=st.lists(st.tuples(st.floats(0, 1), st.sampled_from(COLUMN_DAMAGE)), max_size=1))
def test_decode_rows_prescan_is_what_stored_prescan_finds(
        script: Any, schema: int, inserts: list[tuple[float, Event]],
        damage: list[tuple[float, tuple[int, Any]]]) -> None:
    # decode_rows notes the read pipeline's prescan as scan_lines does: exactly what the
    # Python rule finds in the events the scan returns (None: Python decoded a row)
    events = _with_inserts(script, inserts)
    try:
        encoded = sqlite_schema.encode_batch(events, schema)
    except DshError:
        return  # a shape no SQLite row holds
    rows = [(k + 1, *row[:6], None if schema == 14 else row[6]) for k, row in enumerate(encoded)]
    for where, (column, value) in damage if rows else ():
        i = min(len(rows) - 1, int(len(rows) * where))
        rows[i] = (*rows[i][:column], value, *rows[i][column + 1:])
    try:
        result = sqlite_schema.scan_rows(rows, 0, schema, path="/x/store.db", session_id="s")
    except DshError:
        return  # damage the Python path refuses: no prescan to compare
    if result.prescan is not None:
        assert result.prescan == python_stored_prescan(result.events, KNOWN_EVENT_TYPES)


def test_decode_rows_prescan_finds_legacy_and_unknown_events() -> None:
    rows = [(k + 1, *row[:6], row[6]) for k, row in enumerate(sqlite_schema.encode_batch([
        make("turn/start", 0, {"turn": 1}), make("turn/start", 1, {"turn": 1, "trigger": {}}),
        make("x/unknown", 2, {})], 17))]
    result = sqlite_schema.scan_rows(rows, 0, 17, path="/x/store.db", session_id="s")
    assert len(result.events) == 3 and result.prescan == (1, 2)
    clean = sqlite_schema.scan_rows(rows[:1], 0, 17, path="/x/store.db", session_id="s")
    assert clean.prescan == (-1, -1)

def test_decode_rows_matches_python_on_packed_rows() -> None:
    session = Session.create("s", clock=StepClock(1_700_000_000_000, 7))
    session.append("turn/start", {"turn": 1})
    session.append("step/start", {"turn": 1, "step": 1})
    for k in range(40):
        session.append("assistant/chunk", {"turn": 1, "step": 1, "chunk": {
            "type": "text-delta", "index": 0, "text": f"w{k} "}})
    for k in range(5):
        session.append("assistant/chunk", {"turn": 1, "step": 1, "chunk": {
            "type": "tool-call-delta", "index": 1, "id": "c", "name": "f",
            "argumentsDelta": f"{k}"}})
    encoded = sqlite_schema.encode_batch(list(session.events), 17)
    rows = [(k + 1, *row) for k, row in enumerate(encoded)]
    assert [row[7] for row in rows] == [None, None, 0, 0]
    fast = scan_outcome(rows, 17, True)
    assert fast == scan_outcome(rows, 17, False)
    assert fast[0] == "ok" and len(fast[1][0][1]) == 47
    # the accelerator itself took all four rows
    taken: list[Event] = []
    assert dj.c_decode_rows(rows, 0, 0, orjson.loads, Event, taken, True, 1 << 20, 3,
                            1024) == (4, 47)
    assert len(taken) == 47


# --- SQLite append rows (encode_batch) -------------------------------------------------------


def encode_outcome(events: list[Any], schema: int, fast: bool) -> tuple[Any, ...]:
    """encode_batch's rows with their column types, or its error; C path on or patched out."""
    saved = sqlite_schema.c_encode_rows
    if not fast:
        sqlite_schema.c_encode_rows = None
    try:
        def run() -> Any:
            rows = sqlite_schema.encode_batch(events, schema)
            return [tuple((type(v).__name__, v) for v in row) for row in rows]
        return outcome(run)
    finally:
        sqlite_schema.c_encode_rows = saved


def c_rows(events: list[Any], schema: int) -> Any:
    return dj.c_encode_rows(events, schema, orjson.dumps, sqlite_schema._encode_data,
                            sqlite_schema.ZSTD_DATA_THRESHOLD_BYTES)


BIG_TEXT = "a long tool output line\n" * 400  # about 9.6 kB: stored as a zstd frame
ENVELOPE_DAMAGE: list[tuple[str, Any]] = [
    ("seq", -1), ("seq", True), ("seq", 2**53), ("seq", 3.0), ("time", 2**53), ("time", -2**53),
    ("time", "5"), ("type", ""), ("type", 7), ("type", "assistant/chunk"), ("ignorable", True),
    ("ignorable", False), ("ignorable", None), ("extra", 1), ("data", ...), ("data", 5),
    ("data", "text"), ("data", {"plain": "dict"}), ("data", FrozenDict(bad="\ud800")),
    ("data", FrozenDict(text=BIG_TEXT)), ("data", FrozenDict(n=12345678901234567890)),
    ("surfaceOp", "append"), ("surfaceOp", "\ud800"), ("surfaceOp", 3), ("surfaceOp", None),
    ("surfaceOp", FrozenDict(op="replace", start=0, end=1)),
    ("sourceEventSeqs", FrozenList([0, 5, 2, 2**53 - 1])), ("sourceEventSeqs", FrozenList([])),
    ("sourceEventSeqs", FrozenList([-1])), ("sourceEventSeqs", FrozenList([True])),
    ("sourceEventSeqs", FrozenList([1.0])), ("sourceEventSeqs", FrozenList([2**53])),
    ("sourceEventSeqs", [3, 1]), ("sourceEventSeqs", (3, 1)), ("sourceEventSeqs", "12"),
    ("sourceEventSeqs", None), ("plain", None),
]


def damaged(event: Event, key: str, value: Any) -> Any:
    """``event`` with ``key`` set to ``value`` (``...`` deletes it; key ``plain``: a dict)."""
    fields = dict(event)
    if key == "plain":
        return fields
    if value is ...:
        fields.pop(key, None)
    else:
        fields[key] = value
    return Event(fields)


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(script=log_scripts(open_tail=None), schema=st.sampled_from([14, 17]),
       damage=st.lists(st.tuples(st.floats(0, 1), st.sampled_from(ENVELOPE_DAMAGE)),
                       max_size=2))
def test_encode_rows_matches_python_on_random_and_damaged_batches(
        script: Any, schema: int, damage: list[tuple[float, tuple[str, Any]]]) -> None:
    # the append path's row encoding (docs/formats.md#schema-17): C when it can, else Python;
    # encode_sealed_rows, the same rows and the chain digest (docs/formats.md#the-seal-chain)
    session = Session.create("s", clock=StepClock(1_700_000_000_000, 7))
    apply_script(session, script)
    events: list[Any] = list(session.events)
    for where, (key, value) in damage if events else ():
        i = min(len(events) - 1, int(len(events) * where))
        events[i] = damaged(events[i], key, value)
    check_sealed(events, schema)
    fast = encode_outcome(events, schema, True)
    assert fast == encode_outcome(events, schema, False)
    try:
        taken = c_rows(events, schema)
    except dj.CFallback:
        return  # left to Python, which gave the outcome compared above
    assert fast == ("ok", [tuple((type(v).__name__, v) for v in row) for row in taken])


def test_encode_rows_takes_a_turn_of_real_events_in_both_schemas() -> None:
    session = Session.create("s", clock=StepClock(1_700_000_000_000, 7))
    session.append("turn/start", {"turn": 1})
    session.append("user/message", {"id": "u1", "role": "user", "source": {"kind": "user"},
                                    "content": [{"type": "text", "text": "héllo \u2028"}]},
                   surface_op="append")
    call = session.append("assistant/message", {"turn": 1, "message": {
        "id": "a1", "role": "assistant", "source": {"kind": "model", "provider": "p",
                                                    "model": "m"},
        "content": [{"type": "tool-call", "id": "c1", "name": "read", "arguments": "{}"}]}},
        surface_op="append")
    session.append("tool/result", {"turn": 1, "message": {
        "id": "t1", "role": "user", "source": {"kind": "tool", "callId": "c1"},
        "content": [{"type": "tool-result", "toolCallId": "c1",
                     "content": [{"type": "text", "text": BIG_TEXT}]}]}},
        surface_op="append", source_event_seqs=[call.seq, 0])
    session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    events = list(session.events)
    rows17 = c_rows(events, 17)  # no Fallback: the accelerator encoded every event
    assert rows17 == sqlite_schema._encode_batch(events, 17)
    assert rows17[1][3] == '{"id":"u1","role":"user","source":{"kind":"user"},"content":' \
        '[{"type":"text","text":"héllo \u2028"}]}'
    assert rows17[1][5] == '"append"'
    assert rows17[3][4] == b"\x02\x03"  # seq 2, then ZigZag(0 - 2) = 3
    assert isinstance(rows17[3][3], bytes)  # the 9.6 kB payload as a zstd frame
    assert sqlite_schema._decompress(rows17[3][3], None) == dumps(events[3]["data"])
    rows14 = c_rows(events, 14)
    assert rows14 == sqlite_schema._encode_batch(events, 14)
    assert rows14[3][4] == "[2,0]" and isinstance(rows14[3][3], str)
    assert [row[6] for row in rows14] == [None] * 5
    # an ignorable event is schema 17's 1; schema 14 has no column: Python names the refusal
    marked = [*events, Event({**events[0], "seq": 5, "ignorable": True})]
    assert c_rows(marked, 17)[5][6] == 1
    with pytest.raises(dj.CFallback):
        c_rows(marked, 14)
    refused = encode_outcome(marked, 14, True)
    assert refused[0] == "error" and "schema-14" in refused[2]
    assert refused == encode_outcome(marked, 14, False)


def test_encode_rows_gives_back_every_reference_it_takes() -> None:
    # success, the zstd callback and each fallback exit leave the inputs' refcounts as found
    kind = "".join(["tool/", "result"])  # a fresh, non-interned string
    data = FrozenDict(message=FrozenDict(text="x" * 5000))
    good = Event({"type": kind, "seq": 3, "time": 9, "data": data, "surfaceOp": "append",
                  "sourceEventSeqs": FrozenList([1, 2])})
    bad_seqs = Event({**good, "sourceEventSeqs": FrozenList([1, -2])})
    bad_op = Event({**good, "surfaceOp": "\ud800"})
    marked = Event({**good, "ignorable": True})
    def churn(n: int) -> None:
        for _ in range(n):
            c_rows([good, good], 17)
            c_rows([good], 14)
            for batch, schema in (([good, bad_seqs], 17), ([bad_op], 17), ([marked], 14)):
                with pytest.raises(dj.CFallback):
                    c_rows(batch, schema)

    churn(500)  # warm caches and free lists
    before = (sys.getrefcount(kind), sys.getrefcount(data))
    growth = kept_bytes(churn)
    assert (sys.getrefcount(kind), sys.getrefcount(data)) == before
    assert growth < 64 * 1024, growth  # no row, column or varint buffer is kept


# --- SQLite append rows and their chain digest in one pass (encode_sealed_rows) ---------------


SEALED_KEY = bytes(range(16))


def c_sealed(events: list[Any], schema: int) -> Any:
    return dj.c_encode_sealed_rows(events, schema, orjson.dumps, sqlite_schema._encode_data,
                                   sqlite_schema.ZSTD_DATA_THRESHOLD_BYTES, SEALED_KEY,
                                   hashlib.sha256)


def reference_digest(events: list[Any]) -> bytes:
    """The chain digest of ``events`` under SEALED_KEY, leaves from the pure-Python path."""
    from dsh.persistence import _chain

    record = _chain.ChainRecord(bytes(32), bytes(32), 0, len(events), _chain.Writer("h", 1),
                                bytes(16), b"\0" + SEALED_KEY)
    saved = _chain.c_chain_leaves
    _chain.c_chain_leaves = None
    try:
        return _chain.batch_digest(_chain.event_leaves(record, events))
    finally:
        _chain.c_chain_leaves = saved


def check_sealed(events: list[Any], schema: int) -> bool:
    """encode_sealed_rows gives encode_batch's rows (the pure-Python reference, column types
    included) and the reference digest, or falls back; True when it encoded the batch.

    It falls back where encode_rows or chain_leaves does, except on a lone surrogate in the
    data, which orjson (encode_rows' serializer) refuses and it escapes as dsh.json does."""
    try:
        rows, digest = c_sealed(events, schema)
    except dj.CFallback:
        joined = True
        try:
            c_rows(events, schema)
            dj.c_chain_leaves(events, SEALED_KEY, hashlib.sha256, orjson.dumps)
        except dj.CFallback:
            joined = False
        assert not joined, "encode_sealed_rows fell back where both passes it joins do not"
        return False
    assert encode_outcome(events, schema, False) \
        == ("ok", [tuple((type(v).__name__, v) for v in row) for row in rows])
    assert digest == reference_digest(events)
    return True


@settings(max_examples=examples(100), deadline=None)
@given(values=st.lists(hostile_json(), min_size=1, max_size=5),
       keys=st.permutations(["type", "seq", "time", "data", "surfaceOp", "sourceEventSeqs"]))
def test_encode_sealed_rows_match_both_references_on_hostile_payloads(
        values: list[Any], keys: list[str]) -> None:
    # objects in any key order and nesting, lone surrogates, escapes, floats, the envelope's
    # own keys in any order: the row keeps the order, the leaf hashes the sorted bytes
    events = []
    for seq, value in enumerate(values):
        fields = {"type": "x/y", "seq": seq, "time": 5, "data": {"v": value, "a": [value]},
                  "surfaceOp": "append", "sourceEventSeqs": [0]}
        events.append(Event(dj.snapshot_json({key: fields[key] for key in keys})))
    for schema in (14, 17):
        check_sealed(events, schema)


def test_encode_sealed_rows_take_real_events_and_hash_like_hashlib_without_sha_ni() -> None:
    def event(seq: int, type_: str, data: Any, **extra: Any) -> Event:
        return Event(dj.snapshot_json({"type": type_, "seq": seq, "time": 7, "data": data,
                                       **extra}))

    events = [
        event(0, "turn/start", {"turn": 1}),
        event(1, "user/message", {"id": "u1", "role": "user", "source": {"kind": "user"},
                                  "content": [{"type": "text", "text": "héllo \u2028"}]},
              surfaceOp="append"),
        event(2, "tool/result", {"turn": 1, "message": {
            "id": "t1", "role": "user", "source": {"kind": "tool", "callId": "c1"},
            "content": [{"type": "tool-result", "toolCallId": "c1",
                         "content": [{"type": "text", "text": BIG_TEXT}]}]}},
              surfaceOp="append", sourceEventSeqs=[1, 0]),
        event(3, "turn/start", {"turn": 1}, ignorable=True)]
    assert check_sealed(events, 17)
    assert isinstance(c_sealed(events, 17)[0][2][3], bytes)  # the zstd frame, as encode_rows
    assert check_sealed(events[:3], 14)
    with pytest.raises(dj.CFallback):  # a chunk run to pack: encode_batch's own work
        c_sealed([*events[:3], Event({**events[0], "seq": 3, "type": "assistant/chunk"})], 17)
    probe = ("import hashlib, orjson, dsh.json as dj; from dsh.json import snapshot_json; "
             "from dsh.session._events import Event; from dsh.persistence import _chain; "
             "import dsh.persistence.sqlite._schema as s; k = bytes(range(16)); "
             "events = [Event(snapshot_json({'type': 'x/y', 'seq': n, 'time': 1, "
             "'data': {'b': 'x' * n, 'a': n}})) for n in range(70)]; "
             "rows, digest = dj.c_encode_sealed_rows(events, 17, orjson.dumps, s._encode_data, "
             "4096, k, hashlib.sha256); "
             "print(dj._speedups.SHA_NI, rows == s._encode_batch(events, 17), digest == "
             "_chain.batch_digest(dj._speedups.chain_leaves(events, k, hashlib.sha256, "
             "orjson.dumps)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, env={**os.environ, "DSH_SPEEDUPS_NO_SHA_NI": "1"})
    assert out.stdout.split() == ["0", "True", "True"]


def test_encode_sealed_rows_give_back_every_reference_they_take() -> None:
    kind = "".join(["tool/", "result"])  # a fresh, non-interned string
    key = "".join(["fresh-", "key"])
    data = FrozenDict({key: FrozenDict(text="x" * 5000, a=1.5), "b": FrozenList([key])})
    good = Event({"type": kind, "seq": 3, "time": 9, "data": data, "surfaceOp": "append",
                  "sourceEventSeqs": FrozenList([1, 2])})
    bad_op = Event({**good, "surfaceOp": "\ud800"})
    plain = dict(good)

    def churn(n: int) -> None:
        for _ in range(n):
            c_sealed([good, good], 17)
            c_sealed([good], 14)
            for batch in ([good, bad_op], [good, plain]):
                with pytest.raises(dj.CFallback):
                    c_sealed(batch, 17)

    churn(500)  # warm caches and free lists
    before = (sys.getrefcount(kind), sys.getrefcount(data), sys.getrefcount(key))
    growth = kept_bytes(churn)
    assert (sys.getrefcount(kind), sys.getrefcount(data), sys.getrefcount(key)) == before
    assert growth < 64 * 1024, growth  # no tape, row text or leaf buffer is kept


# --- message shape ---------------------------------------------------------------------------


def _set_path(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    """A thawed copy of ``value`` with ``path`` set to ``new`` (``...`` deletes the key)."""
    out = dj.thaw(value)
    node = out
    for key in path[:-1]:
        if (isinstance(node, dict) and key in node) or (
                isinstance(node, list) and isinstance(key, int) and key < len(node)):
            node = node[key]
        else:
            return out
    last = path[-1]
    if isinstance(node, dict) and isinstance(last, str):  # an int key is no JSON: skip it
        if new is ...:
            node.pop(last, None)
        else:
            node[last] = new
    elif isinstance(node, list) and isinstance(last, int) and last < len(node):
        node[last] = new
    return out


SHAPE_DAMAGE: list[tuple[tuple[Any, ...], Any]] = [
    (("id",), ...), (("id",), ""), (("id",), 3), (("role",), "assistant"), (("role",), ...),
    (("source",), ...), (("source",), []), (("source", "kind"), ""), (("source", "kind"), 1),
    (("source", "kind"), "user"), (("source", "provider"), ...), (("source", "model"), ""),
    (("source", "callId"), ...), (("source", "callId"), "other"), (("content",), {}),
    (("content",), []), (("content", 0, "type"), "text"), (("content", 0, "content"), "x"),
    (("content", 0, "toolCallId"), ...), (("content", 0), "block"), (("content", 1), {}),
]


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(script=log_scripts(open_tail=False),
       damage=st.lists(st.sampled_from(SHAPE_DAMAGE), max_size=2))
def test_message_shape_ok_agrees_with_the_python_check(
        script: Any, damage: list[tuple[tuple[Any, ...], Any]]) -> None:
    session = Session.create("s", clock=StepClock())
    apply_script(session, script)
    for event in session.events:
        if event["type"] not in SURFACE_EVENT_TYPES:
            continue
        wrapped = event["type"] in ("assistant/message", "tool/result")
        data: Any = event["data"]
        for path, new in damage:
            data = _set_path(data, ("message", *path) if wrapped else path, new)
        candidate = as_event({**event, "data": dj.snapshot_json(data)})
        try:
            session_module._check_message_shape(candidate, 0)
            accepted = True
        except DshError:
            accepted = False
        assert dj.c_message_shape_ok(candidate) is accepted, candidate


def test_load_passes_store_each_short_string_value_once() -> None:
    line = orjson.dumps({"type": "x/y", "seq": 0, "time": 1, "data": {
        "role": "user", "long": "z" * 40}})
    body = b"".join(line.replace(b'"seq":0', b'"seq":%d' % i) + b"\n" for i in range(3))
    scanner = fmt.Scanner(path="p", start_offset=0)
    scanner.feed(body)
    events = scanner.finish().events
    assert len(events) == 3
    assert events[0]["type"] is events[2]["type"]
    assert events[0]["data"]["role"] is events[1]["data"]["role"]
    # long values are left alone (ids, texts): sharing them would rarely pay
    assert events[0]["data"]["long"] is not events[1]["data"]["long"]
    assert events[0]["data"]["long"] == events[1]["data"]["long"]



def test_load_passes_share_strings_by_value_whatever_their_width() -> None:
    # the pass's table compares kind, length and data: "ab" and "\u6261" have the same two
    # bytes of data in different widths and must stay apart; every width is shared; the
    # types dsh knows come back as the interned constants; 32 code points are shared, 33 not
    values = ["ab", "\u6261", "é", "\U0001f600x", "\u0100" * 32, "y" * 33, "turn/start"]
    values += [f"v{i}" for i in range(40_000)]  # beyond the table's cap: still decoded right
    body = b"".join(orjson.dumps({"type": "x/y", "seq": i, "time": 1, "data": {
        "a": values[i % len(values)], "b": values[i % len(values)]}}) + b"\n"
        for i in range(len(values)))
    for _ in range(2):  # a second pass finds the table emptied, not stale
        scanner = fmt.Scanner(path="p", start_offset=0)
        scanner.feed(body)
        events = scanner.finish().events
        assert [e["data"]["a"] for e in events] == values
        assert [e["data"]["b"] for e in events] == values
        shared = [e["data"]["a"] is e["data"]["b"] for e in events[:7]]
        assert shared == [True, True, True, True, True, False, True]
        assert events[0]["type"] is events[1]["type"]
        assert events[6]["data"]["a"] is sys.intern("turn/start")

_COLUMN = st.one_of(st.none(), st.integers(-1000, 1000), st.text(), st.binary(max_size=8),
                    st.booleans(), st.floats(allow_nan=False))
_INT_COLUMN = st.one_of(_COLUMN, st.integers(-2**63, 2**63 - 1), st.integers(2**63, 2**70))


@settings(max_examples=examples(200), deadline=None)
@given(rows=st.lists(st.one_of(
    st.tuples(st.integers(0, 2**53), st.text(min_size=1), st.integers(-2**53, 2**53),
              st.one_of(st.text(), st.binary()), st.one_of(st.none(), st.binary(), st.text()),
              st.one_of(st.none(), st.text()), st.one_of(st.none(), st.sampled_from([0, 1]))),
    st.tuples(_INT_COLUMN, _COLUMN, _INT_COLUMN, _COLUMN, _COLUMN, _COLUMN, _COLUMN)),
    max_size=6))
def test_rows_text_matches_the_python_join_or_leaves_the_row_to_it(rows: list[Any]) -> None:
    # the SQLite seal checksum text (persistence/_seal.py): C when it can, else the Python join
    from dsh.persistence._seal import rows_crc, rows_text

    try:
        python: Any = rows_text(rows)
    except (TypeError, ValueError, OverflowError) as exc:  # rows no read returns
        python = type(exc)
    try:
        c: Any = dj.c_rows_text(rows)
    except dj.CFallback:
        c = python  # left to Python: rows_crc takes the Python join
    assert c == python
    if not isinstance(python, type):
        import zlib
        assert rows_crc(rows) == zlib.crc32(python)


def test_rows_text_joins_metadata_then_payloads_of_real_rows() -> None:
    from dsh.persistence._seal import rows_text

    rows = [(0, "turn/start", 5, '{"turn":1}', None, None, None),
            (1, "assistant/chunk", 6, b"\x28\xb5", b"\x01\xff", '"append"', 1),
            (2, "user/message", 7, "é\ud800", "[0]", None, True)]
    expected = ("0\x1fturn/start\x1f5\x1fNone\x1fNone\x1fNone\x1e"
                "1\x1fassistant/chunk\x1f6\x1f\"append\"\x1f1\x1f01ff\x1e"
                "2\x1fuser/message\x1f7\x1fNone\x1f1\x1f[0]\x1d"
                '{"turn":1}\x1e\x0028b5\x1eé\ud800').encode("utf-8", "surrogatepass")
    assert rows_text(rows) == expected
    assert dj.c_rows_text(rows[:2]) == rows_text(rows[:2])
    with pytest.raises(dj.CFallback):
        dj.c_rows_text(rows)  # a lone surrogate: Python encodes it (surrogatepass)


def test_rows_text_of_a_span_skips_the_rowid_without_copying_the_rows() -> None:
    # check_row_seals checksums each sealed range of a read's (rowid, ...) rows in place
    from dsh.persistence._seal import rows_crc, rows_text, span_crc

    rows = [(10 + i, i, "turn/start", 5 + i, f'{{"turn":{i}}}', b"\x01" if i % 2 else None,
             '"append"' if i == 2 else None, 1 if i == 3 else None) for i in range(5)]
    assert dj.c_rows_text(rows, 1, 4, 1) == rows_text([r[1:] for r in rows[1:4]])
    assert dj.c_rows_text(rows, 3, 99, 1) == rows_text([r[1:] for r in rows[3:]])
    assert dj.c_rows_text(rows, 4, 4, 1) == rows_text([]) == b"\x1d"
    assert span_crc(rows, 1, 4) == rows_crc([r[1:] for r in rows[1:4]])
    with pytest.raises(dj.CFallback):
        dj.c_rows_text(rows, 0, 5, 0)  # 8 columns without the skip: not a row
    with pytest.raises(ValueError):
        dj.c_rows_text(rows, -1, 5, 1)


# what a committed SQLite row can hold in each seal column: any text (unicode, control
# characters, NUL, empty) but lone surrogates (SQLite TEXT is UTF-8), int64s to both ends,
# blobs, NULL where the column allows it
_SEAL_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
_SEAL_INT = st.integers(-2**63, 2**63 - 1)
_SEAL_ROW = st.tuples(
    st.one_of(st.none(), _SEAL_TEXT),  # type
    _SEAL_INT,  # time
    st.one_of(_SEAL_TEXT, st.binary(max_size=8)),  # data
    st.one_of(st.none(), st.binary(max_size=8), _SEAL_TEXT),  # source_event_seqs
    st.one_of(st.none(), _SEAL_TEXT),  # surface_op
    st.one_of(st.none(), st.sampled_from([0, 1]), _SEAL_INT))  # ignorable


@settings(max_examples=examples(100), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seqs=st.lists(st.integers(0, 2**62), min_size=1, max_size=6, unique=True),
       columns=st.lists(_SEAL_ROW, min_size=6, max_size=6))
def test_seal_row_text_of_sqlite_rows_is_the_python_rows_text(
        seqs: list[int], columns: list[tuple[Any, ...]]) -> None:
    # The SQLite seal text has three emitters: _seal.rows_text (Python, the reference),
    # rows_text (C, from Python rows) and seal_row_text (C, from SQLite's C API, inside
    # read_rows). The C ones are checked on the same rows of a real SQLite file: rows_text's
    # bytes are the reference's, and seal_row_text's checksum of each row, and of all of them
    # as one record, is the crc32 of the reference's bytes (read_rows exposes only that).
    import _sqlite3
    import sqlite3
    import tempfile
    import zlib
    from contextlib import closing

    from dsh.persistence._seal import rows_text

    assert dj.c_sqlite_bind is not None and dj.c_read_rows is not None
    assert dj.c_rows_text is not None
    if not dj.c_sqlite_bind(getattr(_sqlite3, "__file__", None)):
        pytest.skip("this Python's SQLite exports no C API to bind")
    rows = [(seq, *column) for seq, column in zip(sorted(seqs), columns, strict=False)]
    sql = ("SELECT rowid, seq, type, time, data, source_event_seqs, surface_op, ignorable "
           "FROM events WHERE session_id = ? AND session_id = ? AND seq >= ? AND seq < ? "
           "ORDER BY seq")  # read_rows binds (session_id, session_id, lo, hi)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.db"
        with closing(sqlite3.connect(path)) as db, db:
            db.execute("CREATE TABLE events (session_id TEXT, seq INTEGER, type TEXT, time "
                       "INTEGER, data, source_event_seqs, surface_op TEXT, ignorable INTEGER)")
            db.executemany("INSERT INTO events VALUES ('s', ?, ?, ?, ?, ?, ?, ?)", rows)
        with closing(sqlite3.connect(path)) as db:
            read = db.execute(sql, ("s", "s", 0, 2**62 + 1)).fetchall()
        assert [row[1:] for row in read] == rows  # stored as given: every class kept
        reference = [rows_text([row]) for row in rows]
        assert dj.c_rows_text(read, 0, len(read), 1) == rows_text(rows)
        assert [dj.c_rows_text([row]) for row in rows] == reference
        per_row = [(seq, seq + 1, zlib.crc32(text)) for seq, text in zip(sorted(seqs),
                                                                          reference,
                                                                          strict=True)]
        whole = [(0, 2**62 + 1, zlib.crc32(rows_text(rows)))]
        conn = dj.c_sqlite_open(f"{path.as_uri()}?mode=ro")
        for records in (per_row, whole):
            checked, _, _ = dj.c_read_rows(conn, sql, "s", 0, 2**62 + 1, records, 0, 0,
                                           set(), frozenset(), {}, "openai-agents")
            assert checked == len(records)
        # a checksum one bit off is refused at that record: the comparison has teeth
        wrong = [*per_row[:-1], (*per_row[-1][:2], per_row[-1][2] ^ 1)]
        checked, rows_out, _ = dj.c_read_rows(conn, sql, "s", 0, 2**62 + 1, wrong, 0, 0,
                                              set(), frozenset(), {}, "openai-agents")
        assert checked == len(wrong) - 1 and rows_out is None
        del conn


def test_read_rows_waiting_for_a_writers_lock_lets_other_threads_run(tmp_path: Path) -> None:
    # read_rows' first step takes SQLite's read lock and may wait on the busy timeout (5 s)
    # for a writer: it must not hold the GIL while it waits. A database in delete journal
    # mode, another process holding BEGIN EXCLUSIVE; the C read starts on a capsule that
    # already read (its schema known: the prepare does not wait, the first step does).
    # The holder commits only once this process's main thread has ticked 50 times after the
    # read started: with the GIL held through the wait it cannot tick, the read gives up
    # at the busy timeout (CFallback) and the ticks come after.
    import _sqlite3
    import sqlite3
    import threading
    import time
    import zlib
    from contextlib import closing

    from dsh.persistence._seal import rows_text

    assert dj.c_sqlite_bind is not None and dj.c_read_rows is not None
    if not dj.c_sqlite_bind(getattr(_sqlite3, "__file__", None)):
        pytest.skip("this Python's SQLite exports no C API to bind")
    path = tmp_path / "rows.db"
    rows = [(seq, "x/y", 1, f'{{"n":{seq}}}', None, None, 0) for seq in range(200)]
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode=delete").fetchone()[0] == "delete"
        with db:
            db.execute("CREATE TABLE events (session_id TEXT, seq INTEGER, type TEXT, time "
                       "INTEGER, data, source_event_seqs, surface_op TEXT, ignorable INTEGER)")
            db.executemany("INSERT INTO events VALUES ('s', ?, ?, ?, ?, ?, ?, ?)", rows)
    sql = ("SELECT rowid, seq, type, time, data, source_event_seqs, surface_op, ignorable "
           "FROM events WHERE session_id = ? AND session_id = ? AND seq >= ? AND seq < ? "
           "ORDER BY seq")
    records = [(0, 200, zlib.crc32(rows_text(rows)))]
    conn = dj.c_sqlite_open(f"{path.as_uri()}?mode=ro")

    def read() -> Any:
        return dj.c_read_rows(conn, sql, "s", 0, 200, records, 0, 0, set(), frozenset(), {},
                              "openai-agents")

    assert read()[0] == 1  # warmed: the schema is read
    with subprocess.Popen(
            [sys.executable, "-c",
             "import sqlite3, sys\n"
             "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
             "db.execute('BEGIN EXCLUSIVE')\n"
             "print('held', flush=True)\n"
             "sys.stdin.readline()\n"
             "db.execute('COMMIT')\n", str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as holder:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline() == "held\n"
        ticks = 0
        outcome: list[Any] = []
        started = threading.Event()

        def reader() -> None:
            started.set()
            try:
                outcome.append(read())
            except Exception as exc:  # (what the read raised is the outcome)
                outcome.append(exc)
            outcome.append(ticks)

        thread = threading.Thread(target=reader)
        thread.start()
        started.wait()
        while ticks < 50:
            time.sleep(0.001)
            ticks += 1
        holder.stdin.write("commit\n")
        holder.stdin.flush()
        thread.join()
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
    result, ticks_when_read = outcome
    assert not isinstance(result, BaseException), result  # it waited for the commit
    assert result[0] == 1 and ticks_when_read == 50


@settings(max_examples=examples(200), deadline=None)
@given(seqs=st.lists(st.one_of(st.integers(-2, 12), st.booleans(), st.floats(0, 12),
                               st.none(), st.integers(2**63, 2**64)), max_size=12),
       base=st.integers(-2, 3), as_tuple=st.booleans())
def test_seqs_contiguous_is_true_exactly_when_every_seq_is_its_index(
        seqs: list[Any], base: int, as_tuple: bool) -> None:
    # the contiguity pre-check of open_turn_closers (docs/rules.md#closers): False sends the log
    # through the Python loop, which names the first bad seq
    events: Any = [{"type": "x/y", "seq": s} if s is not None else {"type": "x/y"}
                   for s in seqs]
    expected = all(type(s) is int and s == base + i for i, s in enumerate(seqs))
    assert dj.c_seqs_contiguous(tuple(events) if as_tuple else events, base) is expected


def test_seqs_contiguous_with_a_type_also_requires_that_type_and_frozen_data() -> None:
    # the append path's trust check (SqliteHandle._admit): a batch Session built is exactly
    # Event with frozen data; anything else goes through validate_batch
    def event(seq: int, data: Any) -> Any:
        return as_event({"type": "x/y", "seq": seq, "time": 1, "data": data})

    good = [event(3, FrozenDict({"a": 1})), event(4, FrozenList([1]))]
    assert dj.c_seqs_contiguous(good, 3, Event) is True
    assert dj.c_seqs_contiguous(tuple(good), 3, Event) is True
    assert dj.c_seqs_contiguous(good, 4, Event) is False  # not contiguous
    plain = [good[0], {"type": "x/y", "seq": 4, "time": 1, "data": FrozenDict()}]
    assert dj.c_seqs_contiguous(plain, 3) is True and dj.c_seqs_contiguous(plain, 3, Event) is False
    for data in ({"a": 1}, [1], "text", 7, None):
        assert dj.c_seqs_contiguous([good[0], event(4, data)], 3, Event) is False
    assert dj.c_seqs_contiguous([as_event({"type": "x/y", "seq": 3, "time": 1})], 3,
                                Event) is False  # no data
    with pytest.raises(TypeError):
        dj.c_seqs_contiguous(good, 3, "Event")


def test_open_turn_closers_name_the_same_gap_with_and_without_the_accelerator(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import dsh.session._repair as repair
    from dsh._errors import EventRejectedError

    log = [as_event({"type": "turn/start", "seq": 0, "time": 1, "data": {"turn": 1}}),
           as_event({"type": "step/start", "seq": 2, "time": 1, "data": {"turn": 1, "step": 1}})]
    found = []
    for accelerated in (True, False):
        if not accelerated:
            monkeypatch.setattr(repair, "c_seqs_contiguous", None)
        with pytest.raises(EventRejectedError) as info:
            repair.open_turn_closers(log, "interrupted")
        found.append((info.value.message, info.value.code, dict(info.value.where)))
        assert repair.open_turn_closers(log[:1], "interrupted")[-1]["type"] == "turn/end"
    assert found[0] == found[1] and found[0][1] == "SEQ_GAP"


def _same(a: Any, b: Any) -> bool:
    return len(a) == len(b) and all(map(operator.is_, a, b))


def _python_gather(nodes: list[int], start: int, cache: dict[int, Any], out: list[Any]) -> int:
    # the reference: the cached-message loop of Session.derive_messages
    for index in range(start, len(nodes)):
        if nodes[index] not in cache:
            return index
        message = cache[nodes[index]]
        if message is not None:
            out.append(message)
    return len(nodes)


@settings(max_examples=examples(200), deadline=None)
@given(nodes=st.lists(st.integers(0, 12), max_size=12), start=st.integers(0, 13),
       cached=st.dictionaries(st.integers(0, 12), st.sampled_from([None, "m1", "m2"])))
def test_gather_messages_answers_as_the_python_loop(nodes: list[int], start: int,
                                                    cached: dict[int, Any]) -> None:
    cache = {seq: None if m is None else FrozenDict(id=m) for seq, m in cached.items()}
    start = min(start, len(nodes))
    c_out: list[Any] = ["before"]
    py_out: list[Any] = ["before"]
    assert dj.c_gather_messages(nodes, start, cache, c_out) == \
        _python_gather(nodes, start, cache, py_out)
    assert _same(c_out, py_out)
    packed_out: list[Any] = ["before"]  # a paged restore's surface: an int64 array
    assert dj.c_gather_messages(array("q", nodes), start, cache, packed_out) == \
        _python_gather(nodes, start, cache, ["before"])
    assert _same(packed_out, py_out)


def test_gather_messages_refuses_a_buffer_of_another_item_type() -> None:
    with pytest.raises(TypeError, match="array"):
        dj.c_gather_messages(array("i", [1]), 0, {}, [])
    with pytest.raises(TypeError):
        dj.c_gather_messages((1, 2), 0, {}, [])


@settings(max_examples=examples(200), deadline=None)
@given(seqs=st.lists(st.integers(-2**63, 2**63 - 1), max_size=8),
       bound=st.integers(-3, 2**62))
def test_seqs_below_answers_as_the_python_check(seqs: list[int], bound: int) -> None:
    # the reference: dsh.session._surface.seqs_below without the accelerator
    expected = all(0 <= seq < bound for seq in seqs)
    assert dj.c_seqs_below(array("q", seqs), bound) is expected
    saved = surface_module.c_seqs_below
    surface_module.c_seqs_below = None
    try:
        assert surface_module.seqs_below(array("q", seqs), bound) is expected
    finally:
        surface_module.c_seqs_below = saved


@settings(max_examples=examples(200), deadline=None)
@given(deltas=st.lists(st.integers(-2**63, 2**63 - 1) | st.integers(-3, 3), max_size=8),
       bound=st.integers(-3, 2**62))
def test_running_sums_below_answers_as_the_python_reference(deltas: list[int],
                                                            bound: int) -> None:
    sums = list(itertools.accumulate(deltas))
    expected = all(0 <= total < bound for total in sums)
    c_seqs = array("q", deltas)
    assert dj.c_running_sums_below(c_seqs, bound) is expected
    saved = surface_module.c_running_sums_below
    surface_module.c_running_sums_below = None
    try:
        py_seqs = array("q", deltas)
        assert surface_module.running_sums_below(py_seqs, bound) is expected
    finally:
        surface_module.c_running_sums_below = saved
    if expected:
        assert list(c_seqs) == list(py_seqs) == sums


@settings(max_examples=examples(200), deadline=None)
@given(steps=st.binary(max_size=12), bound=st.integers(-3, 2**62))
def test_widen_sums_below_answers_as_the_python_reference(steps: bytes, bound: int) -> None:
    sums = list(itertools.accumulate(steps))
    expected = all(0 <= total < bound for total in sums)
    c_seqs = array("q", bytes(8)) * len(steps)
    assert dj.c_widen_sums_below(c_seqs, steps, bound) is expected
    saved = surface_module.c_widen_sums_below
    surface_module.c_widen_sums_below = None
    try:
        py_seqs = array("q", [7]) * len(steps)  # whatever it held is overwritten
        assert surface_module.widen_sums_below(py_seqs, steps, bound) is expected
    finally:
        surface_module.c_widen_sums_below = saved
    if expected:
        assert list(c_seqs) == list(py_seqs) == sums
    with pytest.raises(ValueError):
        dj.c_widen_sums_below(array("q", bytes(8)) * (len(steps) + 1), steps, bound)


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(script=log_scripts(open_tail=None))
def test_derive_messages_is_the_same_without_the_gathering_pass(script: Any) -> None:
    # after every action, the live session (C gathering over its incremental cache) derives
    # what a fresh session over the same events derives with the Python loop alone
    session = Session.create("s", clock=StepClock(1_700_000_000_000, 7))

    def compare() -> None:
        fast = deep_types(session.derive_messages())
        saved = session_module.c_gather_messages
        session_module.c_gather_messages = None
        try:
            copy = Session.create("s", seed=list(session.events))
            slow = deep_types(copy.derive_messages())
        finally:
            session_module.c_gather_messages = saved
        assert fast == slow

    apply_script(session, script, after=compare)
    compare()

"""The import's C shortcuts give what their Python references give, byte for byte.

docs/interop.md#streaming-imports: the first read of a Claude Code import keeps each line's
branch skeleton through ``dsh._speedups.claude_line`` (reference: ``_Scan._add`` /
``BranchIndex.add``), its envelopes are copied by ``claude_envelope`` (reference:
``_claude_code._envelope``), every importer's clock reads Claude Code's timestamp shape with
``utc_millis`` (reference: ``_common._utc_millis``), every JSONL line is pre-scanned by
``line_scan`` (reference: ``has_long_number`` and two counts), and the second read maps an
assistant line's blocks and usage with ``claude_blocks`` and ``claude_usage`` (references:
``_anthropic.anthropic_blocks`` and ``anthropic_usage``), and a whole common line to its
events with ``claude_map`` (reference: ``_claude_code._map``). Each is checked against its
reference on arbitrary values, and whole imports are compared with and without the accelerator:
the rows a SQLite store holds afterwards, the report, and the errors (file and line named).
"""

from __future__ import annotations

import gc
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh._errors import DshError
from dsh.interop import _anthropic as anthropic
from dsh.interop import _claude_code as cc
from dsh.interop import _common as common
from dsh.interop import collect, stream_file
from dsh.interop._claude_code_index import BranchIndex
from dsh.json import (
    c_claude_blocks,
    c_claude_envelope,
    c_claude_line,
    c_claude_map,
    c_claude_usage,
    c_decode_plain,
    c_line_scan,
    c_utc_millis,
    has_long_number,
)
from tests.conftest import CORPUS, DSH_LOGS, REPO, shared_path

pytestmark = pytest.mark.skipif(c_claude_line is None, reason="C accelerator not built")

EXAMPLES = int(os.environ.get("DSH_HYPOTHESIS_EXAMPLES", "400"))
"""Examples per property (docs/testing.md#bigger-runs)."""

_SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])

# -- values shaped like Claude Code lines, and anything else in their places

_text = st.one_of(st.sampled_from(["", "u1", "u2", "msg_1", "toolu_1", "ü-ñ", "\ud800x",
                                   "compact_boundary", "agent_progress", "tool_use",
                                   "tool_result", "user", "assistant", "system", "progress",
                                   "summary"]), st.text(max_size=6))
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**60), st.floats(), _text)
_value = st.recursive(_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)), max_leaves=8)
_block = st.one_of(_value, st.fixed_dictionaries(
    {"type": st.sampled_from(["tool_use", "tool_result", "text", 3])},
    optional={"id": _value, "tool_use_id": _value, "text": _value}))
_message = st.one_of(_value, st.fixed_dictionaries(
    {}, optional={"id": _value, "content": st.one_of(_value, st.lists(_block, max_size=4)),
                  "model": _value, "usage": _value}))
_record = st.fixed_dictionaries(
    {"type": st.one_of(st.sampled_from(["user", "assistant", "system", "progress",
                                        "summary", "queue-operation"]), _value)},
    optional={"uuid": _value, "parentUuid": _value, "logicalParentUuid": _value,
              "subtype": st.one_of(st.just("compact_boundary"), _value),
              "isSidechain": _value, "message": _message, "sessionId": _value,
              "data": st.one_of(st.fixed_dictionaries({"type": st.just("agent_progress")}),
                                _value),
              "summary": _value, "leafUuid": _value})


@_SETTINGS
@given(st.one_of(_record, _value), st.integers(1, 2**24), st.integers(0, 2**24),
       st.integers(0, 2**50))
def test_claude_line_keeps_what_the_python_first_read_keeps(record: Any, rec: int, blanks: int,
                                                            offset: int) -> None:
    assert c_claude_line is not None
    line = rec + blanks  # the file line: the record number plus the blank lines before it
    got = c_claude_line(record, rec, line, offset)
    if not isinstance(record, dict) or not isinstance(record.get("type"), str) or (
            record["type"] == "summary"):
        assert got is None
        return
    assert got is not None
    bits, row, tools = got
    kind = record["type"]
    candidate = bool(record.get("isSidechain")) and cc._uuid(record) is not None
    data = record.get("data")
    progress = kind == "progress" and isinstance(data, dict) and data.get(
        "type") == "agent_progress"
    mainline = kind in ("user", "assistant") and not record.get("isSidechain")
    assert bits == (1 if mainline else 0) | (2 if candidate else 0) | (4 if progress else 0)
    index = BranchIndex()
    try:
        index.add(rec, line, offset, kind, candidate, progress, record)
        assert [row] == index._lines
        assert tools == index._tools
        for (a, b) in ((row, index._lines[0]), *zip(tools, index._tools, strict=True)):
            assert [type(x) for x in a] == [type(x) for x in b]
    finally:
        index.close()


_stamp = st.builds(
    lambda parts, seps: "".join(p + s for p, s in zip(parts, seps, strict=True)),
    st.tuples(*(st.one_of(st.text("0123456789", min_size=n, max_size=n), st.text(max_size=n))
                for n in (4, 2, 2, 2, 2, 2, 3))),
    st.tuples(*(st.one_of(st.just(s), st.text(max_size=1))
                for s in ("-", "-", "T", ":", ":", ".", "Z"))))


@_SETTINGS
@given(st.one_of(_stamp, st.text(max_size=30), _value,
                 st.datetimes().map(lambda d: d.isoformat(timespec="milliseconds") + "Z")))
def test_utc_millis_reads_the_clock_as_the_python_function(value: Any) -> None:
    assert c_utc_millis is not None
    got = c_utc_millis(value)
    if got is not None:  # None: the Python function answers
        assert isinstance(value, str)
        assert got == common._utc_millis(value)
    elif isinstance(value, str) and len(value) == 24 and value.isascii():
        expected = common._utc_millis(value)
        micros = None if expected is None else expected * 1000
        # the C pass leaves only the times a double cannot carry exactly
        assert expected is None or micros is None or abs(micros) >= 2**53 - 10**6


@_SETTINGS
@given(st.dictionaries(_text, _value, max_size=4), _message)
def test_claude_envelope_copies_as_the_python_function(record: dict[str, Any],
                                                       message: Any) -> None:
    assert c_claude_envelope is not None
    for r in (record, {**record, "message": message}):
        got = c_claude_envelope(r)
        msg = r.get("message")
        expected = r if not isinstance(msg, dict) else {
            **r, "message": {k: v for k, v in msg.items() if k != "content"}}
        assert got == expected
        assert list(got) == list(expected)
        if isinstance(msg, dict):
            assert list(got["message"]) == list(expected["message"])
            assert got is not r and got["message"] is not msg


# odd values where the second read looks: surrogates, control characters, quotes, non-ASCII
# text, ints past 64 bits (and past what int -> str converts), NaN and infinities
_odd_text = st.one_of(_text, st.text(st.characters(codec=None, min_codepoint=0,
                                                   max_codepoint=0x10FFFF), max_size=8),
                      st.sampled_from(["\x00\n\r\t\b\f\x1f\x7f", '"q"\\', "\udfff\ud800",
                                       "\u2028é😀"]))
_odd_scalar = st.one_of(_scalar, _odd_text, st.sampled_from(
    [2**63 - 1, -2**63, 2**63, -2**63 - 1, 2**53, 10**30, float("nan"), float("inf"),
     -float("inf"), -0.0, 1e300, True, False]), st.just(4301).map(lambda n: 10**n))
_odd_value = st.recursive(_odd_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.one_of(_odd_text), inner, max_size=3)),
    max_leaves=10)
_odd_block = st.one_of(_odd_value, st.fixed_dictionaries(
    {"type": st.one_of(st.sampled_from(["text", "thinking", "tool_use", "tool_result",
                                        "image", "redacted_thinking"]), _odd_value)},
    optional={"text": _odd_value, "thinking": _odd_value, "signature": _odd_value,
              "id": _odd_value, "name": _odd_value, "input": _odd_value,
              "content": _odd_value}))
_deep = st.integers(1, 300).map(lambda n: {"type": "tool_use", "id": "t", "name": "n",
                                           "input": json.loads("[" * n + "]" * n)})


def _answer(function: Any, value: Any) -> Any:
    """What ``function(value)`` gives, as text that tells types and key order apart."""
    try:
        return ("value", repr(function(value)))
    except (ValueError, TypeError, RecursionError) as exc:
        return ("error", type(exc))


@_SETTINGS
@given(st.one_of(st.lists(_odd_block, max_size=5), _odd_value, st.lists(_deep, max_size=2)))
def test_claude_blocks_maps_as_anthropic_blocks(content: Any) -> None:
    assert c_claude_blocks is not None
    fast = _answer(anthropic.anthropic_blocks, content)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(anthropic, "c_claude_blocks", None)
        slow = _answer(anthropic.anthropic_blocks, content)
    assert fast == slow
    if isinstance(content, list) and fast[0] == "value":
        got = c_claude_blocks(content, anthropic.ARGUMENTS_ENCODER)
        assert got is not None  # a list of plain values is never left to Python


class _Kind(str):
    """A str subclass: equal to the str of its characters, as a JSON decoder never makes."""


class _Anything:
    """Equal to every value (``kind == "text"`` holds for it as for nothing JSON makes)."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


class _Dict(dict[str, Any]):
    """A dict subclass, in the input of a tool_use."""


@pytest.mark.parametrize("kind", [_Kind("text"), _Kind("thinking"), _Kind("tool_use"),
                                  _Kind("tool_result"), _Anything(), b"text", ("text",)])
@pytest.mark.parametrize("inp", [{1: "a", None: 2, 1.5: 3, False: 4}, ("a", 1), _Dict(a=1),
                                 {"a": _Kind("x")}, [_Kind("y"), -0.0]])
def test_claude_blocks_maps_python_made_values_as_anthropic_blocks(kind: Any, inp: Any) -> None:
    """Values only a Python caller makes (a str subclass or an object equal to any str as the
    ``type``; non-str keys, tuples and subclasses in ``input``) map as the reference maps them."""
    content = [{"type": kind, "text": "t", "thinking": "r", "id": "i", "name": "n",
                "input": inp}, {"type": "tool_use", "id": _Kind("i"), "input": inp}]
    fast = _answer(anthropic.anthropic_blocks, content)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(anthropic, "c_claude_blocks", None)
        slow = _answer(anthropic.anthropic_blocks, content)
    assert fast == slow


class _Clearing:
    """A key hashing as ``target``: comparing it with a key looked up clears its dict."""

    def __init__(self, target: str) -> None:
        self.hash = hash(target)
        self.owner: dict[Any, Any] | None = None

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        owner, self.owner = self.owner, None
        if owner is not None:
            owner.clear()
        return False


@pytest.mark.parametrize("target", ["type", "text", "thinking", "signature", "id", "input"])
def test_claude_blocks_survives_a_key_that_empties_its_block(target: str) -> None:
    """A block whose lookup runs Python code that frees what was looked up (a segfault once: the
    thinking text was borrowed across the signature lookup) maps as the reference maps it."""
    def content() -> list[Any]:
        key = _Clearing(target)
        block = {"type": "thinking", "thinking": "x" * 5000, key: 1}
        key.owner = block
        return [block]

    fast = _answer(anthropic.anthropic_blocks, content())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(anthropic, "c_claude_blocks", None)
        slow = _answer(anthropic.anthropic_blocks, content())
    assert fast == slow


@_SETTINGS
@given(st.one_of(_odd_value, st.fixed_dictionaries({}, optional={
    k: st.one_of(st.integers(-2, 2**54), st.none(), _odd_scalar)
    for k in ("input_tokens", "output_tokens", "cache_read_input_tokens",
              "cache_creation_input_tokens", "service_tier")})))
def test_claude_usage_counts_as_anthropic_usage(raw: Any) -> None:
    assert c_claude_usage is not None
    fast = anthropic.anthropic_usage(raw)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(anthropic, "c_claude_usage", None)
        slow = anthropic.anthropic_usage(raw)
    assert repr(fast) == repr(slow)


@_SETTINGS
@given(st.binary(max_size=120) | st.text("0123456789[{e.-+\" ", max_size=120).map(str.encode))
def test_line_scan_answers_as_the_byte_counts(data: bytes) -> None:
    assert c_line_scan is not None
    assert c_line_scan(data) == (has_long_number(data), data.count(b"[") + data.count(b"{"))


_json_line = st.one_of(
    st.binary(max_size=80),
    _value.map(lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    st.sampled_from([b"null", b"[[[[[[]]]]]]", b'{"a": 12345678901234567890}', b"-0.0",
                     b'{"a": 1.0, "b": [2e3, -0.5]}', b'"\\ud800"', b"{} x"]))


@_SETTINGS
@given(_json_line, st.integers(0, 6))
def test_decode_plain_decodes_as_decode_line(data: bytes, depth: int) -> None:
    assert c_decode_plain is not None
    got = c_decode_plain(data, depth)
    if got is None:  # decode_line decodes it (or names what is wrong)
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(common, "MAX_RECORD_DEPTH", depth)
        expected = common.decode_line(data, Path("x.jsonl"), "claude-code", 1)
    assert got == expected
    assert json.dumps(got) == json.dumps(expected)


@pytest.mark.parametrize("accelerated", [True, False])
def test_record_at_decodes_a_line_again_as_the_read_did(tmp_path: Path, accelerated: bool,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    # a split response's later part is read again by offset (c_decode_plain first, then
    # decode_line): the same value, of the same types, as records() decoded
    lines = [b'{"a": 1.0, "b": [2e3, -0.5], "t": "\\u00e9x"}',
             b'{"s": "1234567890123456789", "n": 9007199254740991}',  # a 19-digit run
             b'{"z": 0.0, "c": "\\ud800"}\r', b"  ", b'{"deep": [[[{"k": null}]]]}']
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    if not accelerated:
        monkeypatch.setattr(common, "c_decode_plain", None)
    src = common.JsonlSource(path, "claude-code")
    read = list(src.records())
    assert [line for _, line, _, _ in read] == [1, 2, 3, 5]
    for _, line, offset, value in read:
        again = src.record_at(line, offset)
        raw = lines[line - 1].removesuffix(b"\r")
        expected = common.decode_line(raw, path, "claude-code", line)
        assert again == value == expected
        assert json.dumps(again) == json.dumps(value) == json.dumps(expected)
    assert json.dumps(read[0][3]["a"]) == "1"  # an integral float is read as an int


# -- whole imports, with and without the accelerator


def _without_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(anthropic, "c_claude_blocks", None)
    monkeypatch.setattr(anthropic, "c_claude_usage", None)
    monkeypatch.setattr(cc, "c_claude_line", None)
    monkeypatch.setattr(cc, "c_claude_envelope", None)
    monkeypatch.setattr(cc, "c_claude_map", None)
    monkeypatch.setattr(common, "c_utc_millis", None)
    monkeypatch.setattr(common, "c_line_scan", None)
    monkeypatch.setattr(common, "c_decode_plain", None)


def _outcome(path: Path) -> Any:
    """Every session's header and events, or the error (message, path, line)."""
    try:
        sessions = collect(stream_file(path, "claude-code"))
    except DshError as exc:
        return ("error", type(exc).__name__, str(exc), exc.where)
    return [(s.session_id, s.header, json.dumps(s.events, sort_keys=False), s.lines)
            for imported in sessions for s in imported.walk()]


_LINES = [
    {"type": "user", "uuid": "a", "parentUuid": None, "sessionId": "s", "cwd": "/w",
     "timestamp": "2026-02-10T22:00:00.500Z", "message": {"role": "user", "content": "hi"}},
    {"type": "assistant", "uuid": "b", "parentUuid": "a", "sessionId": "s",
     "timestamp": "1600-02-29T23:59:59.999Z",
     "message": {"id": "m", "model": "x", "content": [
         {"type": "text", "text": "t"}, {"type": "tool_use", "id": "t1", "name": "R",
                                         "input": {"p": "ü"}}],
         "usage": {"input_tokens": 2, "output_tokens": "3", "cache_read_input_tokens": -1}}},
    {"type": "user", "uuid": "c", "parentUuid": "b", "sessionId": "s",
     "timestamp": "2026-02-30T22:00:01.000Z", "toolUseResult": {"k": 1},
     "message": {"role": "user", "content": [
         {"type": "tool_result", "tool_use_id": "t1", "content": "out"}]}},
    {"type": "assistant", "uuid": "ñ", "parentUuid": "c", "sessionId": "s",
     "timestamp": "2026-02-10T22:00:02.000+01:00",
     "message": {"id": "m2", "content": [{"type": "text", "text": "done"}]}},
    {"type": "summary", "summary": "Title", "leafUuid": "ñ"},
]


@_SETTINGS
@given(st.integers(0, len(_LINES)), st.binary(max_size=60))
def test_any_line_imports_as_without_the_accelerator(tmp_path_factory: pytest.TempPathFactory,
                                                     at: int, junk: bytes) -> None:
    folder = tmp_path_factory.mktemp("cc")
    lines = [json.dumps(r, ensure_ascii=False).encode() for r in _LINES]
    lines.insert(at, junk)
    path = folder / "5e551011-0000-4000-8000-00000000cafe.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    fast = _outcome(path)
    with pytest.MonkeyPatch.context() as patch:
        _without_accelerator(patch)
        slow = _outcome(path)
    assert fast == slow


def _sources() -> list[Path]:
    """Every transcript the repository holds (and the shared corpus, when it is there)."""
    found: set[Path] = set()
    roots = [CORPUS, REPO / "src" / "dsh" / "examples" / "transcripts", DSH_LOGS / "jsonl",
             shared_path() / "corpus", shared_path() / "dsh-logs" / "jsonl"]
    for root in roots:
        if not root.is_dir():
            continue
        for path in root.rglob("*"):
            if (path.is_file() and path.suffix in (".jsonl", ".json", ".yaml")
                    and "subagents" not in path.parts and path.name != "MANIFEST.json"):
                found.add(path)
    return sorted(found)


def _rows(db: Path) -> tuple[list[Any], list[Any]]:
    with sqlite3.connect(db) as conn:
        events = conn.execute("SELECT session_id, seq, type, time, data, source_event_seqs, "
                              "surface_op, ignorable FROM events "
                              "ORDER BY session_id, seq").fetchall()
        sessions = conn.execute("SELECT id, version, created_at, cwd, parent_session, "
                                "seed_length, origin, delegation_depth, agent_preset, "
                                "revision FROM sessions ORDER BY id").fetchall()
    return events, sessions


def test_the_stored_rows_are_those_of_the_python_import(tmp_path: Path) -> None:
    big = tmp_path / "5e551011-0000-4000-8000-00000000beef.jsonl"
    big.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n"
                           for n in range(300) for r in _turn(n)), encoding="utf-8")
    sources = [*_sources(), big]
    assert len(sources) > 20
    results = []
    for name, extra in (("fast", {}), ("slow", {"DSH_NO_SPEEDUPS": "1"})):
        db = tmp_path / f"{name}.db"
        proc = subprocess.run(
            [sys.executable, "-m", "dsh.cli", "import", *map(str, sources), "--store",
             f"sqlite://{db}"], capture_output=True, text=True, cwd=tmp_path,
            env={**os.environ, **extra}, check=False)
        results.append((proc.returncode, proc.stdout, _rows(db)))
    assert results[0][2][0], results[0][1]
    assert results[0] == results[1]


def _turn(n: int) -> list[dict[str, Any]]:
    """One turn shaped like a Claude Code session's (prompt, split response, result, answer)."""
    base = {"sessionId": "s-big", "cwd": "/home/u/p", "version": "2.1.38",
            "isSidechain": False}
    ids = [f"{n}-{k}-ü" if k == 2 else f"{n}-{k}" for k in range(5)]
    stamp = f"2026-02-10T22:{n // 60 % 60:02d}:{n % 60:02d}.{n % 1000:03d}Z"
    return [
        {**base, "type": "user", "uuid": ids[0], "parentUuid": f"{n - 1}-4" if n else None,
         "timestamp": stamp, "message": {"role": "user", "content": f"prompt {n}"}},
        {**base, "type": "assistant", "uuid": ids[1], "parentUuid": ids[0], "timestamp": stamp,
         "message": {"id": f"msg_{n}", "model": "claude", "content": [
             {"type": "text", "text": "Reading"}],
             "usage": {"input_tokens": n, "output_tokens": 2}}},
        {**base, "type": "assistant", "uuid": ids[2], "parentUuid": ids[1], "timestamp": stamp,
         "message": {"id": f"msg_{n}", "model": "claude", "content": [
             {"type": "tool_use", "id": f"toolu_{n}", "name": "Read",
              "input": {"file_path": "/p/ñ.ts"}}],
             "usage": {"input_tokens": n, "output_tokens": 9}}},
        {**base, "type": "user", "uuid": ids[3], "parentUuid": ids[2], "timestamp": stamp,
         "toolUseResult": {"type": "text"}, "message": {"role": "user", "content": [
             {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": "x" * n}]}},
        {**base, "type": "assistant", "uuid": ids[4], "parentUuid": ids[3], "timestamp": stamp,
         "message": {"id": f"msg_{n}b", "model": "claude", "content": [
             {"type": "text", "text": f"answer {n}"}]}},
    ]


# -- claude_map: whole transcripts mapped with it and with its reference alone

_STAMPS = ["2026-02-10T22:00:00.500Z", "2026-02-10T21:59:59.000Z", "1600-02-29T23:59:59.999Z",
           "2026-02-30T22:00:01.000Z", "2026-02-10T22:00:02.000+01:00", "", 1770760800,
           1.5e12, None, True, "1970-01-01T00:00:01.000Z", "9999-12-31T23:59:59.999Z", "x"]
_user_content = st.one_of(
    _odd_text, st.sampled_from(["[Request interrupted by user for tool use]",
                                " \u3000<local-command-stdout>ok", "<local-command-caveat>x",
                                "\u2028<local-command-stderr>", ""]),
    st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image", 3])},
                                   optional={"text": _odd_value}), max_size=3),
    st.lists(st.fixed_dictionaries(
        {"type": st.just("tool_result"),
         "tool_use_id": st.one_of(st.sampled_from(["t0", "t1", "t2", "t9"]), _odd_value)},
        optional={"content": st.one_of(_odd_value, st.lists(_odd_block, max_size=3)),
                  "is_error": _odd_value}), min_size=1, max_size=3),
    st.lists(st.one_of(_odd_block, st.just({"type": "tool_result", "tool_use_id": "t1"})),
             max_size=3),
    _odd_value)
_assistant_content = st.one_of(
    st.lists(st.one_of(
        st.fixed_dictionaries({"type": st.just("tool_use"),
                               "id": st.one_of(st.sampled_from(["t0", "t1", "t2"]), _odd_value),
                               "name": st.one_of(st.just("Read"), _odd_value),
                               "input": _odd_value}),
        st.fixed_dictionaries({"type": st.just("text"), "text": st.just("ok")}),
        _odd_block), max_size=3),
    _odd_text, _odd_value)


@st.composite
def _transcript_record(draw: st.DrawFn, n: int) -> Any:
    """One line of a transcript: every kind, damaged in any field now and then."""
    kind = draw(st.sampled_from(["user", "user", "tool-results", "assistant", "assistant",
                                 "progress", "system", "boundary", "summary",
                                 "file-history-snapshot", "queue-operation", "odd"]))
    record: dict[str, Any] = {"parentUuid": draw(st.sampled_from([f"u{n - 1}", f"u{n - 2}",
                                                                  None, "gone"])),
                              "isSidechain": draw(st.sampled_from([False, False, True])),
                              "sessionId": "s", "cwd": "/w",
                              "uuid": draw(st.sampled_from([f"u{n}", f"u{n}", f"u{n - 1}"])),
                              "timestamp": draw(st.sampled_from(_STAMPS))}
    if kind in ("user", "tool-results"):
        content = draw(_user_content)
        record.update(type="user", message={"role": "user", "content": content})
        if draw(st.booleans()):
            record["toolUseResult"] = draw(_odd_value)
        if draw(st.integers(0, 9)) == 0:
            record["isMeta"] = draw(_odd_value)
        if draw(st.integers(0, 19)) == 0:
            record["isCompactSummary"] = True
    elif kind == "assistant":
        message = {"id": draw(st.sampled_from(["m1", "m1", "m2", f"m{n}", "", None])),
                   "model": draw(st.sampled_from(["claude", "", None, 3])),
                   "content": draw(_assistant_content)}
        if draw(st.booleans()):
            message["usage"] = draw(st.one_of(
                st.fixed_dictionaries({"input_tokens": st.integers(-1, 2**54),
                                       "output_tokens": st.integers(0, 9)}), _odd_value))
        record.update(type="assistant", message=message)
    elif kind == "boundary":
        record.update(type="system", subtype="compact_boundary", logicalParentUuid=f"u{n - 1}",
                      compactMetadata={"trigger": "auto", "preTokens": 9})
    elif kind == "summary":
        record = {"type": "summary", "summary": draw(_odd_text), "leafUuid": f"u{n - 1}"}
    elif kind == "odd":
        record["type"] = draw(st.sampled_from(["unknown-kind", "user", "assistant"]))
        record["message"] = draw(_odd_value)
    else:
        record.update(type=kind, subtype=draw(_odd_value), data=draw(_odd_value))
    for field in draw(st.lists(st.sampled_from(["uuid", "timestamp", "message", "type"]),
                               max_size=1)):
        if draw(st.integers(0, 4)) == 0:
            record[field] = draw(_odd_value)
    return record


@_SETTINGS
@given(st.integers(1, 14).flatmap(lambda size: st.tuples(*[_transcript_record(n)
                                                           for n in range(size)])))
def test_claude_map_maps_as_its_reference(tmp_path_factory: pytest.TempPathFactory,
                                          records: tuple[Any, ...]) -> None:
    folder = tmp_path_factory.mktemp("cm")
    path = folder / "5e551011-0000-4000-8000-00000000cafe.jsonl"
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # 10**4301 written out (its line is then refused alike)
    try:
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    finally:
        sys.set_int_max_str_digits(limit)
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    fast = _outcome(path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cc, "c_claude_map", None)
        slow = _outcome(path)
    assert fast == slow


def _mapped_by_c(path: Path) -> dict[str, int]:
    """How many lines of each type ``claude_map`` took (True) during an import of path."""
    took: dict[str, int] = {}

    def counted(state: Any, record: Any, *rest: Any) -> bool:
        done = bool(c_claude_map(state, record, *rest))  # type: ignore[misc]
        if done:
            took[record["type"]] = took.get(record["type"], 0) + 1
        return done

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cc, "c_claude_map", counted)
        collect(stream_file(path, "claude-code"))
    return took


@pytest.mark.parametrize("hostile", [
    "huge", "bad-utf8", "odd-types", "no-newline"])
def test_claude_map_takes_the_common_lines_and_hostile_files_import_alike(
        tmp_path: Path, hostile: str) -> None:
    lines = [json.dumps(r, ensure_ascii=False) for n in range(6) for r in _turn(n)]
    progress = {"type": "progress", "uuid": "p1", "parentUuid": "5-4", "sessionId": "s-big",
                "timestamp": "2026-02-10T22:10:00.000Z", "data": {"type": "hook_progress"}}
    lines.append(json.dumps(progress))
    if hostile == "huge":  # a 3 MB prompt and a 3 MB result
        lines[0] = lines[0].replace("prompt 0", "p" * 3_000_000)
        lines[3] = lines[3].replace('"content": ""', '"content": "' + "r" * 3_000_000 + '"')
    elif hostile == "odd-types":
        lines[5] = lines[5].replace('"prompt 1"', '[{"type": "text", "text": 7}]')
        lines[8] = lines[8].replace('"toolu_1"', "1")
        lines[11] = lines[11].replace('"Reading"', "null")
    path = tmp_path / "5e551011-0000-4000-8000-00000000beef.jsonl"
    data = ("\n".join(lines) + ("" if hostile == "no-newline" else "\n")).encode()
    if hostile == "bad-utf8":
        data = data.replace(b"prompt 2", b"prompt \xff\xfe")
    path.write_bytes(data)
    fast = _outcome(path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cc, "c_claude_map", None)
        slow = _outcome(path)
    assert fast == slow
    if hostile == "bad-utf8":
        assert fast[0] == "error" and fast[3]["path"] == str(path), fast
        assert fast[3]["line"] == 11, fast  # the line of "prompt 2" names the bad bytes
        return
    took = _mapped_by_c(path)
    assert took["user"] >= 10 and took["assistant"] >= 16 and took["progress"] == 1, took


def test_claude_map_survives_a_collection_at_every_allocation(tmp_path: Path) -> None:
    # claude_map holds borrowed values of the builder's state and of the record while it
    # allocates and calls parts(), encode and PendingCall: a collection at every allocation
    # (gc.set_threshold(1)) must free nothing it still reads, and map as its reference does
    lines = [json.dumps(r, ensure_ascii=False) for n in range(3) for r in _turn(n)]
    lines += [json.dumps(r, ensure_ascii=False) for r in _LINES]
    path = tmp_path / "5e551011-0000-4000-8000-00000000dead.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cc, "c_claude_map", None)
        slow = _outcome(path)
    threshold = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        fast = _outcome(path)
        took = _mapped_by_c(path)
    finally:
        gc.set_threshold(*threshold)
    assert fast == slow
    assert took["user"] >= 5 and took["assistant"] >= 8, took


@pytest.mark.parametrize("message", [[None, {}], "text", 1.5])
@pytest.mark.parametrize("kind", ["user", "assistant"])
def test_claude_map_leaves_the_reference_of_a_message_of_another_type(
        tmp_path: Path, kind: str, message: Any) -> None:
    # an active line whose message is no dict goes to the reference; claude_map once dropped
    # a reference it did not own to that value (freed while its record still held it: a
    # crash of -X dev / PYTHONMALLOC=debug, a use-after-free otherwise)
    lines = [json.dumps(r, ensure_ascii=False) for r in _LINES]
    odd = {"type": kind, "uuid": "z", "parentUuid": "ñ", "sessionId": "s",
           "timestamp": "2026-02-10T22:00:03.000Z", "message": message}
    path = tmp_path / "5e551011-0000-4000-8000-00000000f00d.jsonl"
    path.write_text("\n".join([*lines, json.dumps(odd)]) + "\n", encoding="utf-8")
    counts: list[tuple[int, int]] = []

    def counted(state: Any, record: Any, *rest: Any) -> bool:
        value = record.get("message")
        before = sys.getrefcount(value)
        done = bool(c_claude_map(state, record, *rest))  # type: ignore[misc]
        counts.append((before, sys.getrefcount(value)))
        return done

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cc, "c_claude_map", counted)
        fast = _outcome(path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cc, "c_claude_map", None)
        slow = _outcome(path)
    assert fast == slow
    assert fast[0] == "error" and fast[3]["line"] == len(lines) + 1, fast
    assert len(counts) == len(lines) + 1, counts
    assert all(before == after for before, after in counts), counts

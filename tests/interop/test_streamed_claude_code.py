"""The streamed Claude Code import chooses the branch exactly as the in-memory rules do.

docs/interop.md#streaming-imports: the first read keeps a branch index in a temporary SQLite
database and one byte of flags a record (blank lines, also with CRLF or whitespace, count for
nothing but their line numbers). Its decisions (which lines are on the model-visible
branch, the repairs of broken links, the title, the parts of split responses) must equal those
of ``_active_set`` / ``_title_line`` over the records held in memory, and the streamed session's
events those of ``_build`` (the whole-file mapping) on the same lines. Transcripts here are
generated with tangled links: duplicate uuids, links to nowhere, cycles, compact boundaries,
shared response ids, tool calls answered off the branch, titles, inline sidechains.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh._errors import DshError
from dsh.interop import ImportedSession, collect, import_file, stream_file
from dsh.interop._claude_code import _active_set, _build, _response_key, _title_line, _uuid
from dsh.interop._claude_code_index import ACTIVE, FIRST_PART, LATER_PART, BranchIndex
from dsh.interop._common import JsonlSource
from dsh.json import c_plain_numbers, loads_plain

REPO = Path(__file__).resolve().parents[2]
_FAILURES = (DshError, TypeError, ValueError, KeyError, AttributeError, IndexError)
"""What the in-memory mapping may raise (streaming turns the unexpected ones into
ImportFormatError, as import_file does)."""

_UUIDS = [f"u{i}" for i in range(8)]
_IDS = [f"msg_{i}" for i in range(4)]
_TOOLS = [f"toolu_{i}" for i in range(4)]

_link = st.one_of(st.none(), st.sampled_from(_UUIDS), st.just("gone"), st.just(7),
                  st.just(""))


def _add_message(draw: Any, record: dict[str, Any], kind: str, n: int) -> None:
    """An assistant line's text (and maybe a tool call), a user line's prompt or tool result."""
    if kind == "assistant":
        content: list[dict[str, Any]] = [{"type": "text", "text": f"a{n}"}]
        if draw(st.booleans()):
            content.append({"type": "tool_use", "id": draw(st.sampled_from(_TOOLS)),
                            "name": "Read", "input": {}})
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if draw(st.integers(0, 3)):
            message["id"] = draw(st.sampled_from(_IDS))
        record["message"] = message
    elif kind == "user":
        tool = draw(st.one_of(st.none(), st.sampled_from(_TOOLS)))
        record["message"] = {"role": "user", "content": f"q{n}" if tool is None else [
            {"type": "tool_result", "tool_use_id": tool, "content": "out"}]}


@st.composite
def _line(draw: Any, n: int) -> dict[str, Any]:
    kind = draw(st.sampled_from(["user", "assistant", "assistant", "system", "progress",
                                 "summary"]))
    record: dict[str, Any] = {"type": kind, "sessionId": "s-1",
                              "timestamp": f"2026-02-10T22:00:{n % 60:02d}.000Z"}
    uid = draw(st.one_of(st.sampled_from(_UUIDS), st.just(f"own-{n}"), st.none()))
    if uid is not None:
        record["uuid"] = uid
    record["parentUuid"] = draw(_link)
    if draw(st.integers(0, 9)) == 0:
        record["isSidechain"] = True
    if kind == "system" and draw(st.booleans()):
        record["subtype"] = "compact_boundary"
        record["parentUuid"] = None
        record["logicalParentUuid"] = draw(_link)
    _add_message(draw, record, kind, n)
    if kind == "summary":
        record["summary"] = draw(st.sampled_from(["Title", " ", "Other"]))
        record["leafUuid"] = draw(_link)
    return record


@st.composite
def _transcript(draw: Any) -> list[dict[str, Any]]:
    count = draw(st.integers(1, 24))
    lines = [draw(_line(n)) for n in range(count)]
    # one plain user line somewhere, so the file is a Claude Code transcript
    lines.insert(draw(st.integers(0, count)), {
        "type": "user", "uuid": "root", "parentUuid": None, "sessionId": "s-1",
        "timestamp": "2026-02-10T21:59:00.000Z", "message": {"role": "user", "content": "go"}})
    return lines


_GAPS = st.sampled_from(["", "", "", "\n", "\r\n", "  \n", "\n\n\t \r\n", " \x0c\r\n"])
"""What may stand before a record: nothing, or blank lines (LF, CRLF, whitespace-only); a
record after a CRLF blank line ends with CRLF too."""


def _write(folder: Path, lines: list[dict[str, Any]], gaps: list[str] | None = None) -> Path:
    path = folder / "5e551011-0000-4000-8000-00000000cafe.jsonl"
    gaps = gaps or [""] * len(lines)
    path.write_text("".join(gap + json.dumps(r) + ("\r\n" if gap.endswith("\r\n") else "\n")
                            for gap, r in zip(gaps, lines, strict=True)),
                    encoding="utf-8", newline="")
    return path


def _numbers(gaps: list[str] | None, count: int) -> list[int]:
    """The file line of each record :func:`_write` writes with ``gaps``."""
    out, line = [], 1
    for gap in gaps or [""] * count:
        line += gap.count("\n")
        out.append(line)
        line += 1
    return out


def _reference(lines: list[dict[str, Any]], numbers: list[int] | None = None
               ) -> tuple[list[tuple[int, Any]], set[str], dict[str, Any], int | None]:
    entries = list(zip(numbers or range(1, len(lines) + 1), lines, strict=True))
    mainline = any(r["type"] in ("user", "assistant") and not r.get("isSidechain")
                   for _, r in entries)
    side = {line for line, r in entries if r.get("isSidechain") and _uuid(r) is not None} \
        if mainline else set()
    main = [(line, r) for line, r in entries if line not in side]
    active, repairs = _active_set(main)
    return main, active, repairs, _title_line(main, active)


def _index(path: Path, lines: list[dict[str, Any]], *, full: bool = False) -> BranchIndex:
    """The branch index of the file, resolved; ``full``: never by the linear shortcut."""
    src = JsonlSource(path, "claude-code")
    index = BranchIndex()
    if full:
        index._linear = False
    mainline = False
    for rec, line, offset, r in src.records():
        side = bool(r.get("isSidechain")) and _uuid(r) is not None
        mainline = mainline or (r["type"] in ("user", "assistant") and not r.get("isSidechain"))
        index.add(rec, line, offset, r["type"], side, False, r)
    index.resolve(mainline, lambda at: lines[at - 1])
    return index


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_transcript(), st.data())
def test_the_index_chooses_the_branch_of_the_in_memory_rules(lines: list[dict[str, Any]],
                                                             data: st.DataObject) -> None:
    """Also with blank lines between the records: the index is keyed by record, the repairs
    and the title name file lines."""
    gaps = data.draw(st.lists(_GAPS, min_size=len(lines), max_size=len(lines)))
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), lines, gaps)
        _assert_the_reference_branch(path, lines, _numbers(gaps, len(lines)))


def _assert_the_reference_branch(path: Path, lines: list[dict[str, Any]],
                                 numbers: list[int] | None = None) -> None:
    """The index of ``path`` (holding ``lines`` at file lines ``numbers``) flags what the
    in-memory rules choose."""
    main, active, repairs, title = _reference(lines, numbers)
    rec_of = {line: rec for rec, line in enumerate(numbers or range(1, len(lines) + 1), 1)}
    index = _index(path, lines)
    try:
        flags = index.flags
        for line, r in main:
            assert bool(flags[rec_of[line]] & ACTIVE) == (_uuid(r) in active), (line, r)
        assert index.repairs == repairs
        assert index.title_line == title
        groups: dict[str, list[int]] = {}
        for line, r in main:
            if r["type"] == "assistant" and _uuid(r) in active and isinstance(
                    r.get("message"), dict):
                groups.setdefault(_response_key(r, line), []).append(line)
        for parts in groups.values():
            assert [bool(flags[rec_of[p]] & FIRST_PART) for p in parts] == (
                [len(parts) > 1] + [False] * (len(parts) - 1))
            assert [bool(flags[rec_of[p]] & LATER_PART) for p in parts] == (
                [False] + [len(parts) > 1] * (len(parts) - 1))
            if len(parts) > 1:
                assert [(at, line) for at, line, _ in index.parts(rec_of[parts[0]])] == [
                    (rec_of[p], p) for p in parts]
    finally:
        index.close()


@st.composite
def _linear_transcript(draw: Any) -> list[dict[str, Any]]:
    """A chained transcript (each uuid line links to the one before), sometimes not quite:
    a line without uuid, a repeated uuid, a broken or null link, a sidechain or title line,
    a compact boundary linking through logicalParentUuid, trailing non-message lines."""
    count = draw(st.integers(1, 30))
    lines: list[dict[str, Any]] = [{
        "type": "user", "uuid": "root", "parentUuid": None, "sessionId": "s-1",
        "timestamp": "2026-02-10T21:59:00.000Z", "message": {"role": "user", "content": "go"}}]
    previous = "root"
    for n in range(count):
        kind = draw(st.sampled_from(["user", "assistant", "assistant", "progress", "system",
                                     "file-history-snapshot"]))
        record: dict[str, Any] = {"type": kind, "sessionId": "s-1",
                                  "timestamp": f"2026-02-10T22:00:{n % 60:02d}.000Z"}
        if kind == "file-history-snapshot":
            record["messageId"] = f"m{n}"
            lines.append(record)
            continue
        twist = draw(st.integers(0, 40))
        uid = f"u{n}" if twist != 1 else previous
        record["uuid"] = uid
        record["parentUuid"] = (previous if twist not in (2, 3) else
                                "gone" if twist == 2 else None)
        if kind == "system" and draw(st.booleans()):
            record["subtype"] = "compact_boundary"
            record["logicalParentUuid"], record["parentUuid"] = record["parentUuid"], None
        if twist == 4:
            record["isSidechain"] = True
        _add_message(draw, record, kind, n)
        lines.append(record)
        previous = uid
        if twist == 5:
            lines.append({"type": "summary", "summary": "Title", "leafUuid": uid})
    return lines


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_linear_transcript())
def test_a_linear_file_gets_the_branch_of_the_full_resolve(lines: list[dict[str, Any]]
                                                           ) -> None:
    """The linear shortcut of BranchIndex.resolve flags every line as the full resolve does,
    and both choose what the in-memory rules choose."""
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), lines)
        _assert_the_reference_branch(path, lines)
        fast, full = _index(path, lines), _index(path, lines, full=True)
        try:
            assert fast.flags[:fast.last + 1] == full.flags[:full.last + 1]
            assert (fast.repairs, fast.title_line) == (full.repairs, full.title_line)
        finally:
            fast.close()
            full.close()


def test_a_chained_transcript_takes_the_linear_shortcut(tmp_path: Path) -> None:
    """bench_import's transcript shape (every line linked to the one before) is linear."""
    from bench.bench_import import claude_code_lines

    lines = claude_code_lines(3)
    path = _write(tmp_path, lines)
    index = _index(path, lines)
    try:
        assert index._linear
        assert index.repairs == {} and index.title_line is None
        assert all(index.flags[line] & ACTIVE for line in range(1, len(lines) + 1))
    finally:
        index.close()
    _assert_the_reference_branch(path, lines)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_transcript(), st.data())
def test_a_streamed_session_equals_the_whole_file_mapping(lines: list[dict[str, Any]],
                                                          data: st.DataObject) -> None:
    """Also with blank lines between the records (the whole mapping numbers file lines)."""
    gaps = data.draw(st.lists(_GAPS, min_size=len(lines), max_size=len(lines)))
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), lines, gaps)
        main, _, _, _ = _reference(lines, _numbers(gaps, len(lines)))
        try:
            whole: Any = _build(main, path, "s-1", {}).events  # the file's own session id
        except _FAILURES as exc:  # the two paths must fail alike
            whole = type(exc).__name__
        try:
            stream = next(stream_file(path, "claude-code"))
            assert stream.session_id == "s-1"
            streamed: Any = [e for batch in stream.batches for e in batch.events]
        except DshError as exc:
            streamed = type(exc).__name__
        if isinstance(whole, str) or isinstance(streamed, str):
            assert isinstance(streamed, str) and streamed in (whole, "ImportFormatError")
            return
        assert streamed == whole


def _corpus_files() -> list[Path]:
    roots = [REPO / "tests" / "corpus", REPO.parent / "shared" / "corpus",
             REPO / "src" / "dsh" / "examples" / "transcripts"]
    return sorted(p for root in roots if root.is_dir() for p in root.rglob("*.jsonl")
                  if "subagents" not in p.parts and p.parent.name in (
                      "claude-code", "codex", "dsh"))


@pytest.mark.parametrize("path", _corpus_files(), ids=lambda p: p.name)
def test_corpus_streamed_equals_collected(path: Path) -> None:
    """``stream_file`` batch by batch gives what ``import_file`` gives, session by session."""
    try:
        whole = [s for top in import_file(path) for s in top.walk()]
    except DshError as exc:
        with pytest.raises(type(exc)):
            collect(stream_file(path))
        return
    streamed = [s for top in collect(stream_file(path)) for s in top.walk()]

    def seen(s: ImportedSession) -> tuple[Any, ...]:
        lines = [*s.lines, *[None] * (len(s.events) - len(s.lines))]  # may be shorter
        return s.session_id, s.header, s.events, lines, s.torn_line

    assert [seen(s) for s in streamed] == [seen(s) for s in whole]


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.one_of(st.integers(-2**64, 2**64), st.floats(allow_nan=False,
                                                                    allow_infinity=False),
                              st.text(max_size=3), st.booleans(), st.none()),
                    lambda inner: st.one_of(st.lists(inner, max_size=4),
                                            st.dictionaries(st.text(max_size=3), inner,
                                                            max_size=4)), max_leaves=20))
def test_the_c_number_check_is_the_python_one(value: Any) -> None:
    """``c_plain_numbers`` fixes and refuses what ``_plain_numbers`` does (loads_plain's check)."""
    from dsh.json import _plain_numbers

    if c_plain_numbers is None:
        pytest.skip("the C accelerator is not built")
    try:
        text = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return  # an int orjson cannot write: not what it parses either
    c_tree, py_tree = orjson.loads(text), orjson.loads(text)
    c_ok, py_ok = c_plain_numbers(c_tree), _plain_numbers(py_tree)
    assert c_ok == py_ok
    if c_ok:
        assert orjson.dumps(c_tree) == orjson.dumps(py_tree)
        assert c_tree == loads_plain(text)


@st.composite
def _codex_rollout(draw: Any) -> list[dict[str, Any]]:
    timed = draw(st.booleans())
    lines: list[dict[str, Any]] = [{"type": "session_meta", "payload": {
        "id": "c0de0000-0000-4000-8000-000000000001", "cwd": "/srv/app"}}]
    for n in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["user", "assistant", "call", "output", "reasoning",
                                     "aborted", "compacted"]))
        item: dict[str, Any]
        if kind in ("user", "assistant"):
            item = {"type": "response_item", "payload": {
                "type": "message", "role": kind,
                "content": [{"type": "input_text", "text": f"{kind} {n}"}]}}
        elif kind == "call":
            item = {"type": "response_item", "payload": {
                "type": "function_call", "call_id": f"call_{n % 3}", "name": "shell",
                "arguments": "{}"}}
        elif kind == "output":
            item = {"type": "response_item", "payload": {
                "type": "function_call_output", "call_id": f"call_{n % 3}", "output": "ok"}}
        elif kind == "reasoning":
            item = {"type": "response_item", "payload": {
                "type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]}}
        elif kind == "aborted":
            item = {"type": "event_msg", "payload": {"type": "turn_aborted"}}
        else:
            item = {"type": "compacted", "payload": {"message": "summary"}}
        lines.append(item)
    for n, line in enumerate(lines):
        if timed and draw(st.integers(0, 4)):
            line["timestamp"] = f"2026-02-10T22:{n // 60 % 60:02d}:{n % 60:02d}.000Z"
    return lines


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_codex_rollout(), st.sampled_from([1, 3, 5000]))
def test_a_streamed_codex_rollout_equals_the_whole_file_mapping(
        lines: list[dict[str, Any]], batch: int) -> None:
    """Batch by batch (any batch size) the events and header of one in-memory mapping."""
    from dsh.interop import _codex
    from dsh.interop._common import EventBuilder

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rollout-1.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
        whole = EventBuilder("codex", "c0de0000-0000-4000-8000-000000000001", path)
        whole.model = ("openai", "unknown")
        try:
            for _ in _codex._map(whole, JsonlSource(path, "codex")):
                pass
            expected: Any = (whole.header(cwd="/srv/app"), whole.events)
        except DshError as exc:
            expected = type(exc).__name__
        size = _codex.STREAM_BATCH_EVENTS
        _codex.STREAM_BATCH_EVENTS = batch  # type: ignore[misc]
        try:
            stream = next(stream_file(path, "codex"))
            got: Any = (stream.header, [e for b in stream.batches for e in b.events])
        except DshError as exc:
            got = type(exc).__name__
        finally:
            _codex.STREAM_BATCH_EVENTS = size  # type: ignore[misc]
        assert got == expected


@pytest.mark.parametrize("path", _corpus_files(), ids=lambda p: p.name)
def test_batches_say_how_far_the_file_was_read(path: Path) -> None:
    """``ImportBatch.end`` grows batch by batch and reaches the file's size (the progress bar)."""
    try:
        top = next(stream_file(path))
    except DshError:
        return
    if top.source_format not in ("claude-code", "codex"):
        return
    ends = [batch.end for batch in top.batches]
    assert ends and all(isinstance(end, int) for end in ends)
    assert ends == sorted(ends) and ends[-1] == path.stat().st_size


_LINE_PIECES = [b"{}", b"\n", b"\r\n", b"\r", b" ", b"\t", b'{"a":1}', b"x" * 300]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_LINE_PIECES), max_size=40), st.sampled_from([1, 2, 7, 64, 4096]),
       st.integers(min_value=0, max_value=12))
def test_jsonl_source_lines_are_the_newline_split_whatever_the_read_size(
        pieces: list[bytes], read_bytes: int, short_by: int) -> None:
    """``JsonlSource.lines`` (read a block at a time) gives the lines of a plain ``\\n`` split.

    docs/formats.md#lossless-json: records split on ``\\n`` only, a ``\\r`` before it dropped;
    blank lines counted, not yielded; only the ``size`` bytes checked at open are read.
    """
    from dsh.interop import _common

    data = b"".join(pieces)
    size = max(0, len(data) - short_by)
    expected = []
    offset = 0
    parts = data[:size].split(b"\n")
    for number, part in enumerate(parts, start=1):
        ended = number < len(parts)
        text = part[:-1] if part.endswith(b"\r") else part
        if text.strip():
            expected.append((number, offset, text, ended))
        offset += len(part) + 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        path.write_bytes(data)
        source = object.__new__(JsonlSource)
        source.path, source.size = path, size
        kept = _common._SCAN_CHUNK
        _common._SCAN_CHUNK = read_bytes  # type: ignore[misc]
        try:
            got = list(source.lines())
        finally:
            _common._SCAN_CHUNK = kept  # type: ignore[misc]
    assert got == expected


_UTF8_PIECES = [b'{"a":1}\n', b"x" * 5, "\u00e9".encode(), "\u20ac".encode(),
                "\U0001f600".encode(), b"\xe9", b"\xc3", b"\x80", b"\xf0\x9f", b"\xed\xa0\x80"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_UTF8_PIECES), max_size=30), st.sampled_from([1, 2, 3, 5, 4096]))
def test_jsonl_source_names_the_first_bad_utf8_byte_whatever_the_read_size(
        pieces: list[bytes], read_bytes: int) -> None:
    """The whole-file check at open finds the byte a one-shot UTF-8 decode fails at.

    Its reads skip the decoder for an ASCII block after a whole character, so a character cut
    by a read and followed by ASCII must still be refused at its first byte
    (docs/interop.md: a transcript is UTF-8 JSON text).
    """
    from dsh.interop import _common

    data = b'{"a":1}\n' + b"".join(pieces)
    try:
        data.decode("utf-8")
        expected = None
    except UnicodeDecodeError as exc:
        expected = exc.start
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        path.write_bytes(data)
        kept = _common._SCAN_CHUNK
        _common._SCAN_CHUNK = read_bytes  # type: ignore[misc]
        try:
            JsonlSource(path, "claude-code")
            found = None
        except DshError as exc:
            assert "not valid UTF-8" in exc.message
            found = exc.where["byte_offset"]
        finally:
            _common._SCAN_CHUNK = kept  # type: ignore[misc]
    assert found == expected


@settings(max_examples=500, deadline=None)
@given(st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30)))
def test_claude_code_times_read_quickly_equal_the_datetime_arithmetic(when: Any) -> None:
    """``parse_time`` of ``YYYY-MM-DDTHH:MM:SS.mmmZ`` (the quick path, the minute's prefix
    remembered) equals ``int(datetime.timestamp() * 1000)``, bounds and 1970-1973 included."""
    from dsh.interop._common import parse_time
    from dsh.json import MAX_SAFE_INTEGER

    text = (f"{when.year:04d}-{when.month:02d}-{when.day:02d}T{when.hour:02d}:{when.minute:02d}:"
            f"{when.second:02d}.{when.microsecond // 1000:03d}Z")
    exact = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    ms = int(exact.timestamp() * 1000)
    ms = int(ms * 1000 if abs(ms) < 1e11 else ms)  # parse_time's seconds rule, as documented
    expected = ms if 0 <= ms <= MAX_SAFE_INTEGER else None
    assert parse_time(text) == expected
    assert parse_time(text) == expected  # the second time from the remembered prefix


_GOOD = (b'{"type":"user","uuid":"a","parentUuid":null,"sessionId":"s-1",'
         b'"message":{"role":"user","content":"hi"}}')


@pytest.mark.parametrize(("bad", "message"), [
    (b'{"type":"user", oops}', "claude-code record is not valid JSON at column 17"),
    (b"[1]", "a Claude Code record must be a JSON object"),
    (b'{"type":"assistant","uuid":"b","parentUuid":"a","sessionId":"s-1"}',
     'a Claude Code assistant line needs a "message" object'),
])
def test_an_error_after_blank_lines_names_the_file_line(tmp_path: Path, bad: bytes,
                                                        message: str) -> None:
    """Blank lines (LF, CRLF, whitespace-only) before a bad record: the error names its file
    line (and column), not its record number."""
    path = tmp_path / "s-1.jsonl"
    path.write_bytes(b"\n\r\n" + _GOOD + b"\r\n\n  \t\n\x0c\r\n" + bad + b"\n\n")
    with pytest.raises(DshError) as caught:
        collect(stream_file(path, "claude-code"))
    assert caught.value.where["line"] == 7
    assert str(caught.value).startswith(f"{path}:7: {message}")


@pytest.mark.parametrize("limit", [32766, 25])
def test_the_index_stores_its_rows_as_given_nulls_text_and_bytes(limit: int) -> None:
    """The branch index's multi-row INSERTs store each row as given: NULLs (bound as 0 through
    NULLIF), ASCII text, non-ASCII keys as bytes, with their SQLite types; with a build that
    binds 25 parameters a statement too (two rows of ten).

    Rule: docs/interop.md#streaming-imports.
    """
    index = BranchIndex()
    index._db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, limit)
    rows = []
    for rec in range(1, 300):
        key = None if rec % 3 == 0 else f"u{rec}" if rec % 3 == 1 else f"ü{rec}".encode()
        rows.append((rec, rec + 1, rec * 10, rec % 4, rec % 2, key, None if rec % 5 else key,
                     rec % 3, None if rec % 2 else f"m{rec}", key))
        index.add_row(rows[-1], [(rec, key or "t", rec % 2)], False, False)
    index._flush()
    try:
        stored = index._db.execute("SELECT * FROM lines ORDER BY rec").fetchall()
        tools = index._db.execute("SELECT * FROM tools ORDER BY rec").fetchall()
        nulls = index._db.execute("SELECT count(*) FROM lines WHERE uuid IS NULL").fetchone()
        blobs = index._db.execute("SELECT count(*) FROM lines WHERE typeof(uuid) = 'blob'"
                                  ).fetchone()
    finally:
        index.close()
    assert stored == rows
    assert tools == [(rec, r[5] or "t", rec % 2) for rec, r in enumerate(rows, 1)]
    assert nulls == (99,) and blobs == (100,)

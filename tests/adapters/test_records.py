"""dsh.adapters._records: the records cut from a stored row's text equal the parsed ones.

The C accelerator's ``record_texts`` walks the JSON text without parsing it; the Python
reference parses. On generated data (hostile strings, nesting, the holder missing, another
format, duplicate members), wherever the cut answers it decodes to the reference's records,
and it answers wherever the reference does unless the text holds an escape (a member name
written with one, an escaped surrogate).
"""

from __future__ import annotations

import bisect
import gc
import itertools
import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dsh.adapters._records import RECORD_PATHS, python_record_texts, record_picker
from dsh.json import c_record_texts, dumps
from tests.strategies import examples, hostile_json

pytestmark = pytest.mark.skipif(c_record_texts is None, reason="C accelerator not built")

FMT = "openai-agents"


def _values(texts: tuple[bytes, ...] | None) -> list[Any] | None:
    return None if texts is None else [orjson.loads(t) for t in texts]


def _check(text: str, path: tuple[str, ...], need: str | None) -> tuple[bytes, ...] | None:
    assert c_record_texts is not None
    cut = c_record_texts(text, path, FMT, need)
    reference = python_record_texts(text, path, FMT, need)
    if cut is not None:
        assert _values(cut) == _values(reference)
    elif "\\" not in text:
        # the cut declines only what it cannot vouch for (escapes in names, surrogates)
        assert reference is None
    return cut


@st.composite
def stored_data(draw: st.DrawFn) -> tuple[str, str]:
    etype = draw(st.sampled_from(sorted(RECORD_PATHS)))
    path, need = RECORD_PATHS[etype]
    records = draw(st.lists(hostile_json(6), max_size=3))
    holder: dict[str, Any] = {"format": draw(st.sampled_from([FMT, FMT, "langchain", 3])),
                              "records": records if draw(st.booleans()) or not records
                              else {"0": records[0]}}
    value: Any = holder
    for name in reversed(path):
        extra = draw(st.dictionaries(st.text(max_size=5), hostile_json(4), max_size=2))
        value = {**extra, name: value} if draw(st.booleans()) else {name: value, **extra}
    if need is not None and draw(st.booleans()):
        value = {need: draw(st.one_of(st.just({"role": "user"}), hostile_json(4))), **value}
    return etype, dumps(value).decode("utf-8")


@given(stored_data())
@settings(max_examples=examples(200), suppress_health_check=[HealthCheck.too_slow])
def test_record_texts_cut_equals_the_parsed_records(data: tuple[str, str]) -> None:
    etype, text = data
    path, need = RECORD_PATHS[etype]
    _check(text, path, need)


@pytest.mark.parametrize("text", [
    '{"source":{"adapterRecord":{"format":"openai-agents","records":[{"a":"]}\\"["}, 1, '
    '"s", [], {}, null, -1.5e3]}}}',
    ' {"source": {"adapterRecord": {"records": [1], "format": "openai-agents"}}} ',
    # of two members of one name the last counts
    '{"source":{"adapterRecord":{"format":"openai-agents","records":[1]}},'
    '"source":{"adapterRecord":{"format":"openai-agents","records":[2]}}}',
    '{"source":{"adapterRecord":{"format":"openai-agents","records":[1],"records":[3]}}}',
    '{"source":{"adapterRecord":{"format":"other","records":[1]}}}',
    '{"source":{"adapterRecord":{"format":"openai-agents","records":{"a":1}}}}',
    '{"source":{"adapterRecord":{"format":"openai-agents"}}}',
    '{"source":[]}', '[]', '{}', '{"source":{"adapterRecord":{"format":"openai-agents",'
    '"records":[]}}}',
])
def test_record_texts_cut_on_hand_written_rows(text: str) -> None:
    assert _check(text, ("source", "adapterRecord"), None) is not None \
        or python_record_texts(text, ("source", "adapterRecord"), FMT) is None


@pytest.mark.parametrize("text", [
    # what the cut cannot vouch for: the caller parses the row instead
    '{"source":{"adapterRecord":{"format":"openai-agents","records":["\\udc00"]}}}',
    '{"sour\\u0063e":{"adapterRecord":{"format":"openai-agents","records":[1]}}}',
    '{"source":{"adapterRecord":{"format":"openai-agents","records":[1]}}} trailing',
    '{"source":{"adapterRecord":{"format":"openai-agents","records":[1,]}}}',
    '{"source":{"adapterRecord":{"format":"openai-agents","records":[1',
    # text orjson does not read, inside or outside the records: the caller's parse names it
    '{"a":tru,"source":{"adapterRecord":{"format":"openai-agents","records":[1]}}}',
    '{"a":[1}],"source":{"adapterRecord":{"format":"openai-agents","records":[1]}}}',
    '{"source":{"x":{"a" 1},"adapterRecord":{"format":"openai-agents","records":[1]}}}',
    '{"source":{"adapterRecord":{"format":"openai-agents","records":[1 , tru]}}}',
    '{"source":{"adapterRecord":{"format":"openai-agents","records":[[1}]}}}',
    '{"source":{"adapterRecord":{"format":"openai-agents","records":[{"a":1,}]}}}',
    '{"source":{"adapterRecord":{"format":"openai-agents","records":[{"a"}]}}}',
    '{"source":{"adapterRecord":{"format":"openai-agents","records":[[1 2]]}}}',
    '{"source":{"adapterRecord":{"format":"openai-agents","records":[1e400]}}}',
    '{"source":{"adapterRecord":{"format":"openai-agents","records":[01]}}}',
    '{"source":{"adapterRecord":{"format":"openai-agents","records":["a\x01"]}}}',
    '{"source":{"adapterRecord":{"format":"openai-agents","records":["\\x"]}}}',
    '{"source":{"adapterRecord":{"format":"openai-agents","records":["\\u12"]}}}',
    '{"source":{"adapterRecord":{"format":"openai-agents","records":[' + '[' * 1100
    + ']' * 1100 + ']}}}',
])
def test_record_texts_declines_what_it_cannot_vouch_for(text: str) -> None:
    assert c_record_texts is not None
    assert c_record_texts(text, ("source", "adapterRecord"), FMT, None) is None
    if "\\u" not in text and "trailing" not in text:
        assert python_record_texts(text, ("source", "adapterRecord"), FMT) is None


@pytest.mark.parametrize("special", ['\\"', "\\\\", "\\n", "\\u00e9", "\\ud83d\\ude00", "\x01",
                                     "\x1f", "\"", "\u00e9", "\x7f", "\\/", "\\b", "\\f",
                                     "\\r", "\\t", "\\x", "\\'", "\\0", "\\U0041"])
def test_record_texts_finds_each_string_end_and_escape_at_every_offset(special: str) -> None:
    # the string scan skips 16 bytes (SSE2) or 8 at a time to the first quote, backslash or
    # control byte: one of each, at every offset of strings that span several chunks, is
    # found where a byte-by-byte scan finds it (a raw control byte or a bare quote declined,
    # as orjson refuses the text; the records' values as the reference parses them)
    assert c_record_texts is not None
    for length in range(0, 40):
        for at in range(length + 1):
            value = "a" * at + special + "b" * (length - at)
            text = ('{"source":{"adapterRecord":{"format":"openai-agents","records":["'
                    + value + '",{"k' + "x" * length + '":"' + value + '"}]}}}')
            cut = c_record_texts(text, ("source", "adapterRecord"), FMT, None)
            if "\\ud83d" in special:  # a pair of escaped surrogates: declined, as documented
                assert cut is None, (length, at)
                continue
            try:
                parsed = orjson.loads(text)
            except orjson.JSONDecodeError:
                assert cut is None, (length, at)
                continue
            assert _values(cut) == parsed["source"]["adapterRecord"]["records"], (length, at)


def test_a_cut_is_out_of_the_cyclic_gc() -> None:
    # a tuple of bytes holds no cycle: the cut leaves it untracked, as CPython's collection
    # would (a whole-history read keeps one per record; the next young collection walked them)
    text = dumps({"content": [], "source": {"kind": "user", "adapterRecord": {
        "format": FMT, "records": [{"role": "user", "content": "hi"}, [1, 2]]}}}).decode()
    assert c_record_texts is not None
    cut = c_record_texts(text, ("source", "adapterRecord"), FMT, None)
    assert cut == (b'{"role":"user","content":"hi"}', b"[1,2]")
    assert not gc.is_tracked(cut)
    gc.collect()
    assert _values(cut) == [{"role": "user", "content": "hi"}, [1, 2]]


@example(json.dumps({"message": {"role": "user"}, "meta": {"adapterRecord": {
    "format": FMT, "records": [{"type": "function_call_output"}]}}}))
@given(st.just('{"meta":{"adapterRecord":{"format":"openai-agents","records":[1]}}}'))
def test_a_tool_result_needs_its_message(text: str) -> None:
    # records_of reads a tool/result's records only beside a message object
    for accelerated in (True, False):
        pick = record_picker(FMT, accelerated=accelerated)
        picked = pick("tool/result", text)
        assert (picked is not None) == ('"message"' in text)
        assert pick("tool/call", text) is None


def _reference_pick(rows: list[Any], start: int, stop: int, seqs: set[int],
                    types: frozenset[str]) -> tuple[list[Any], dict[int, Any]]:
    # the pass of SqlitePrefixSource.read_selected without the accelerator, cutting as it does
    pick = record_picker(FMT)
    kept: list[Any] = []
    into: dict[int, Any] = {}
    for row in [row for row in rows if row[1] in seqs or row[2] in types or row[7] == 0]:
        _rowid, seq, etype, _time, data, _sources, op, ignorable = row
        if ignorable == 0:
            kept.append(row)
            continue
        if not start <= seq < stop:
            continue
        if type(data) is str and (op is None or op == '"append"') and etype not in types:
            picked = pick(etype, data)
            if picked is not None:
                into[seq] = picked
                continue
        kept.append(row)
    return kept, into


_ROW_DATA = st.one_of(
    st.sampled_from([
        json.dumps({"source": {"adapterRecord": {"format": FMT, "records": [{"a": 1}]}}}),
        json.dumps({"message": {"source": {"adapterRecord": {"format": FMT,
                                                             "records": [1, "x", []]}}}}),
        json.dumps({"message": {}, "meta": {"adapterRecord": {"format": FMT,
                                                              "records": [{"t": "o"}]}}}),
        json.dumps({"source": {"adapterRecord": {"format": "other", "records": [1]}}}),
        '{"source": {"adapterRecord": {"format": "openai-agents", "records": [1,]}}}',
        "not json", '{"turn":1}']),
    st.binary(max_size=8))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(
    st.integers(0, 10**6), st.one_of(st.integers(-2, 30), st.just(2**70)),
    st.sampled_from(["user/message", "assistant/message", "tool/result", "tool/call",
                     "turn/start", "openai-agents/pop"]),
    st.integers(0, 10), _ROW_DATA, st.sampled_from([None, b"\x01"]),
    st.sampled_from([None, '"append"', '"replace"', b"x"]),
    st.sampled_from([None, 0, 1])), max_size=30),
    st.integers(-1, 20), st.integers(0, 31), st.sets(st.integers(-2, 31)),
    st.sampled_from([frozenset(), frozenset({"openai-agents/pop"}),
                     frozenset({"user/message", "turn/start"})]))
def test_pick_rows_serves_what_the_python_pass_serves(
        rows: list[Any], start: int, stop: int, seqs: set[int], types: frozenset[str]) -> None:
    # the accelerator's pass of a selective read (read_selected with a pick whose cut is set):
    # the records it cuts are the Python pass's, and the rows it leaves are those the pass
    # would still decode
    from dsh.json import c_pick_rows
    assert c_pick_rows is not None
    into: dict[int, Any] = {}
    kept = c_pick_rows(rows, start, stop, seqs, types, dict(RECORD_PATHS), FMT, into)
    ref_kept, ref_into = _reference_pick(rows, start, stop, seqs, types)
    assert into == ref_into
    # (rows outside the range that the Python pass skips may be left in either list)
    in_range = [row for row in kept if row[7] == 0 or start <= row[1] < stop]
    assert in_range == ref_kept
    assert all(row in rows for row in kept)


_SQL = ("SELECT rowid, seq, type, time, data, source_event_seqs, surface_op, ignorable FROM "
        "events WHERE session_id = ? AND seq >= coalesce((SELECT max(seq) FROM events WHERE "
        "session_id = ? AND seq <= ?), 0) AND seq < ? ORDER BY seq")


def _write_events(path: Any, rows: list[tuple[Any, ...]]) -> None:
    """A real SQLite file at path with an events table of session 's': rows are (seq, type,
    time, data, source_event_seqs, surface_op, ignorable)."""
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE events (session_id TEXT, seq INTEGER, type TEXT, "
                   "time INTEGER, data, source_event_seqs, surface_op TEXT, ignorable "
                   "INTEGER)")
        db.executemany("INSERT INTO events VALUES ('s', ?, ?, ?, ?, ?, ?, ?)", rows)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.dictionaries(st.integers(0, 40), st.tuples(
    st.sampled_from(["user/message", "assistant/message", "tool/result", "tool/call",
                     "turn/start", "openai-agents/pop", "ünïcode/type"]),
    st.integers(-5, 10), _ROW_DATA, st.sampled_from([None, b"\x01", "x"]),
    st.sampled_from([None, '"append"', '"replace"']),
    st.sampled_from([None, 0, 1])), max_size=25),
    st.lists(st.integers(1, 41), max_size=6), st.integers(0, 30), st.integers(1, 12),
    st.sets(st.integers(-2, 41)),
    st.sampled_from([frozenset(), frozenset({"openai-agents/pop"}),
                     frozenset({"user/message", "turn/start"})]),
    st.one_of(st.none(), st.integers(0, 6)))
def test_read_rows_serves_what_sqlite3_and_pick_rows_serve(
        rows: dict[int, Any], bounds: list[int], start: int, length: int, seqs: set[int],
        types: frozenset[str], damaged: int | None) -> None:
    # the accelerator's read through SQLite's C API (SqlitePrefixSource._c_selected) on a
    # real SQLite file: the same seal records checked (a wrong crc refused at the same record,
    # nothing served), the same records cut and rows left as sqlite3's rows then pick_rows
    import _sqlite3
    import sqlite3
    import tempfile
    from contextlib import closing
    from pathlib import Path

    from dsh.json import c_pick_rows, c_read_rows, c_sqlite_bind, c_sqlite_open
    from dsh.persistence._seal import rows_crc, span_crc

    assert c_sqlite_bind is not None and c_read_rows is not None and c_pick_rows is not None
    if not c_sqlite_bind(getattr(_sqlite3, "__file__", None)):
        pytest.skip("this Python's SQLite exports no C API to bind")
    stop = start + length
    ordered = [(seq, *rows[seq]) for seq in sorted(rows)]
    edges = sorted({0, *bounds, 41})
    records = [(a, b, rows_crc([r for r in ordered if a <= r[0] < b]))
               for a, b in itertools.pairwise(edges)]
    todo = [r for r in records if r[0] < stop and r[1] > start]
    if damaged is not None and damaged < len(todo):
        todo[damaged] = (todo[damaged][0], todo[damaged][1], todo[damaged][2] ^ 1)
    lo = min([start, *(r[0] for r in todo[:1])])
    hi = max([stop, *(r[1] for r in todo[-1:])])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.db"
        _write_events(path, ordered)
        with closing(sqlite3.connect(path)) as db:
            read = db.execute(_SQL, ("s", "s", lo, hi)).fetchall()
        conn = c_sqlite_open(f"{path.as_uri()}?mode=ro")
        checked, kept, picked = c_read_rows(conn, _SQL, "s", lo, hi, todo, start, stop, seqs,
                                            types, dict(RECORD_PATHS), FMT)
        del conn
    row_seqs = [row[1] for row in read]
    bad = [i for i, (a, b, crc) in enumerate(todo)
           if span_crc(read, bisect.bisect_left(row_seqs, a),
                       bisect.bisect_left(row_seqs, b)) != crc]
    if bad:
        assert (checked, kept, picked) == (bad[0], None, None)
        return
    assert checked == len(todo) and kept is not None
    keep = max(0, bisect.bisect_right(row_seqs, start) - 1)
    window = read[keep:bisect.bisect_left(row_seqs, stop)]
    into: dict[int, Any] = {}
    ref_kept = c_pick_rows(window, start, stop, seqs, types, dict(RECORD_PATHS), FMT, into)
    assert picked == into

    def served(found: list[Any]) -> list[Any]:  # (the Python pass skips the others)
        return [row for row in found if row[7] == 0 or start <= row[1] < stop]

    assert served(kept) == served(ref_kept)


def test_sqlite_bind_finds_sqlite_only_where_it_is_loaded() -> None:
    # the C read binds SQLite's C API from the library Python's _sqlite3 loaded, and loads
    # nothing: a library not loaded, or one without SQLite, leaves the Python read
    import _sqlite3
    import zlib

    from dsh.json import c_sqlite_bind
    assert c_sqlite_bind is not None
    assert c_sqlite_bind("/nonexistent/libsqlite3.so.0") is False
    assert c_sqlite_bind(zlib.__file__) is False
    assert c_sqlite_bind(_sqlite3.__file__) is True


def test_sqlite_bind_refuses_without_a_library_path() -> None:
    # None (an _sqlite3 without __file__) would have searched the global symbols, possibly
    # another SQLite copy than _sqlite3's: refused even where the global symbols have SQLite
    # (here the same libsqlite3 made global, in a fresh process so nothing is bound yet)
    import ctypes.util
    import subprocess
    import sys

    library = ctypes.util.find_library("sqlite3")
    if library is None:
        pytest.skip("no shared libsqlite3 to make global")
    code = ("import ctypes, os, _sqlite3\n"
            f"ctypes.CDLL({library!r}, mode=os.RTLD_GLOBAL)\n"
            "from dsh.json import c_sqlite_bind\n"
            "print(c_sqlite_bind(None))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("column", ["time", "data", "source_event_seqs", "ignorable"])
def test_read_rows_refuses_a_real_value_in_a_row_it_would_serve(column: str) -> None:
    # a row the seal records do not cover (already checked) holding a REAL: the C read has no
    # float to give as Python's sqlite3 does, so it falls back (the Python read serves it)
    # rather than serve None in its place
    import _sqlite3
    import sqlite3
    import tempfile
    from contextlib import closing
    from pathlib import Path

    from dsh.json import CFallback, c_read_rows, c_sqlite_bind, c_sqlite_open

    assert c_sqlite_bind is not None and c_read_rows is not None
    if not c_sqlite_bind(getattr(_sqlite3, "__file__", None)):
        pytest.skip("this Python's SQLite exports no C API to bind")
    row = {"seq": 1, "type": "user/message", "time": 5, "data": '{"x": 1}',
           "source_event_seqs": None, "surface_op": None, "ignorable": 1}
    row[column] = 0.5
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.db"
        _write_events(path, [tuple(row.values())])
        with closing(sqlite3.connect(path)) as db:
            read = db.execute(_SQL, ("s", "s", 0, 5)).fetchall()
        assert read[0][list(row).index(column) + 1] == 0.5  # sqlite3 serves the float
        conn = c_sqlite_open(f"{path.as_uri()}?mode=ro")
        with pytest.raises(CFallback):
            c_read_rows(conn, _SQL, "s", 0, 5, [], 0, 5, {1}, frozenset({"user/message"}),
                        dict(RECORD_PATHS), FMT)
        del conn


# SQL literals of every storage class a hostile file can put in any column of a row: NULL,
# integers to both ends, a REAL, TEXT (empty, a NUL inside, past a page: an overflow chain,
# not strict UTF-8: a bare continuation byte, an overlong form, a surrogate, past U+10FFFF),
# BLOBs (empty: SQLite gives a NULL pointer for it, a NUL and 0xff, past a page)
_CLASS_LITERALS = [
    "NULL", "0", "1", "-1", "9223372036854775807", "-9223372036854775808", "0.5", "''",
    "'user/message'", "'\"append\"'", "'a' || char(0) || 'b'", "char(233)",
    "'{\"source\":{\"adapterRecord\":{\"format\":\"openai-agents\",\"records\":[\"'"
    " || replace(zeroblob(5000), x'00', 'y') || '\"]}}}'",
    "CAST(x'80' AS TEXT)", "CAST(x'c0af' AS TEXT)", "CAST(x'eda080' AS TEXT)",
    "CAST(x'f4908080' AS TEXT)", "CAST(x'61' || x'ff' AS TEXT)",
    "x''", "x'00ff'", "zeroblob(5000)",
]
_COLUMNS = ["seq", "type", "time", "data", "source_event_seqs", "surface_op", "ignorable"]
_BASE = {"seq": "1", "type": "'user/message'", "time": "5",
         "data": "'{\"source\":{\"adapterRecord\":{\"format\":\"openai-agents\","
                 "\"records\":[{\"a\":1}]}}}'",
         "source_event_seqs": "NULL", "surface_op": "NULL", "ignorable": "1"}


@pytest.mark.parametrize("encoding", ["UTF-8", "UTF-16le"])
@pytest.mark.parametrize("column", _COLUMNS)
def test_read_rows_of_every_class_in_every_column_serves_what_sqlite3_serves(
        column: str, encoding: str) -> None:
    # the C read takes each column of a row once (its class, then its value as that class)
    # and uses those pointers for the seal text, the class check, the type cache and the
    # cut: each class (and a TEXT that is no strict UTF-8) in each column, the row sealed or
    # not, selected by seq or by type, between two plain rows; wherever read_rows answers it
    # answers what sqlite3's rows, their seal check and pick_rows give (a seal record of the
    # row as sqlite3 reads it, and of the plain row: a number where text was committed is a
    # seal mismatch at that record), and it answers for the plain rows (the check has teeth)
    import _sqlite3
    import sqlite3
    import tempfile
    from contextlib import closing
    from pathlib import Path

    from dsh.json import CFallback, c_pick_rows, c_read_rows, c_sqlite_bind, c_sqlite_open
    from dsh.persistence._seal import rows_crc, span_crc

    assert c_sqlite_bind is not None and c_read_rows is not None and c_pick_rows is not None
    if not c_sqlite_bind(getattr(_sqlite3, "__file__", None)):
        pytest.skip("this Python's SQLite exports no C API to bind")
    answered = 0
    for literal in _CLASS_LITERALS:
        row = {**_BASE, column: literal}
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "rows.db"
            with closing(sqlite3.connect(path)) as db, db:
                db.execute(f"PRAGMA encoding = '{encoding}'")
                db.execute("CREATE TABLE events (session_id TEXT, seq INTEGER, type TEXT, "
                           "time INTEGER, data, source_event_seqs, surface_op TEXT, "
                           "ignorable INTEGER)")
                for values in ({**_BASE, "seq": "0"}, row, {**_BASE, "seq": "2"}):
                    db.execute("INSERT INTO events VALUES ('s', "
                               + ", ".join(values[name] for name in _COLUMNS) + ")")
            with closing(sqlite3.connect(path)) as db:
                try:
                    read = db.execute(_SQL, ("s", "s", 0, 3)).fetchall()
                except sqlite3.OperationalError:
                    read = None  # not strict UTF-8: sqlite3 refuses the row
                plain = db.execute(f"SELECT 0, {', '.join(_BASE[c] for c in _COLUMNS)}"
                                   ).fetchall()
            conn = c_sqlite_open(f"{path.as_uri()}?mode=ro")
            crcs = [rows_crc([r[1:] for r in plain] * 3)]
            if read is not None and column != "ignorable":  # (int() of a text: ValueError)
                crcs.append(rows_crc([r[1:] for r in read]))
            for records, seqs, types in itertools.product(
                    [[], *([(0, 3, crc)] for crc in crcs)], [{1}, set()],
                    [frozenset(), frozenset({"user/message"})]):
                try:
                    got = c_read_rows(conn, _SQL, "s", 0, 3, records, 0, 3, seqs, types,
                                      dict(RECORD_PATHS), FMT)
                except CFallback:
                    continue  # the Python read serves or names it
                assert read is not None, (literal, "served a row sqlite3 refuses")
                answered += 1
                want_crc = records[0][2] if records else None
                if want_crc is not None and span_crc(read, 0, len(read)) != want_crc:
                    assert got == (0, None, None), literal
                    continue
                into: dict[int, Any] = {}
                kept = c_pick_rows(read, 0, 3, seqs, types, dict(RECORD_PATHS), FMT, into)
                assert got == (len(records), kept, into), literal
            del conn
    assert answered > 0


def _high_chars() -> list[str]:
    """Characters whose UTF-8 holds, between them, each byte 0x80..0xff valid UTF-8 has (lead
    and continuation bytes: a signed byte compare would take them for control bytes), and
    the characters beside the control range."""
    found: dict[int, str] = {}
    for cp in itertools.chain(range(0x80, 0x800), range(0x800, 0x10000, 0x3f),
                              range(0x10000, 0x110000, 0xfff)):
        if not 0xd800 <= cp <= 0xdfff:
            for byte in chr(cp).encode():
                found.setdefault(byte, chr(cp))
    assert set(found) >= {*range(0x80, 0xc0), *range(0xc2, 0xf5)}
    return ["\x1f", "\x20", "\x21", "\x7f", *sorted(set(found.values()))]


_HIGH_CHARS = _high_chars()


@pytest.mark.parametrize("char", _HIGH_CHARS)
def test_record_texts_reads_high_and_boundary_bytes_at_every_offset(char: str) -> None:
    # each character at every offset of strings across the 16- and 8-byte chunks, twice
    # (the second right before the closing quote): the cut's values are orjson's, or it
    # declines exactly where orjson refuses the text (a raw control byte)
    assert c_record_texts is not None
    for length in range(0, 36):
        for at in range(length + 1):
            value = "a" * at + char + "é" * ((length - at) // 2) + char
            text = ('{"source":{"adapterRecord":{"format":"openai-agents","records":["'
                    + value + '"]}}}')
            cut = c_record_texts(text, ("source", "adapterRecord"), FMT, None)
            try:
                want = orjson.loads(text)["source"]["adapterRecord"]["records"]
            except orjson.JSONDecodeError:
                assert cut is None, (char, length, at)
                continue
            assert _values(cut) == want == [value], (char, length, at)


def test_record_texts_declines_every_cut_short_text() -> None:
    # a text cut at every byte (a string ending where the text ends, an escape cut in two):
    # no read past the end (the sanitizer build runs this), and the cut declines, as
    # orjson refuses each
    assert c_record_texts is not None
    whole = ('{"source":{"adapterRecord":{"format":"openai-agents","records":["'
             + "0123456789abcdef" * 2 + '\\"\\u00e9é' + "x" * 17 + '",{"k":"\\n"}]}}}')
    assert _values(c_record_texts(whole, ("source", "adapterRecord"), FMT, None)) == \
        orjson.loads(whole)["source"]["adapterRecord"]["records"]
    for size in range(len(whole)):
        assert c_record_texts(whole[:size], ("source", "adapterRecord"), FMT, None) is None, \
            size

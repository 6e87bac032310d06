"""Chunk rows: packing, decoding and their round trip (docs/formats.md#chunk-rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings

from dsh._errors import EventRejectedError
from dsh.json import MAX_SAFE_INTEGER, FrozenDict, dumps, loads, snapshot_json
from dsh.session._chunks import MIN_RUN, decode_storage_record, pack_chunk_runs
from dsh.session._events import Event
from dsh.testing import make
from tests.conftest import DSH_LOGS
from tests.session._log_strategies import MAX_EXAMPLES, chunk_batches

pytestmark = pytest.mark.no_speedups


def text_delta(seq: int, time: int, text: str, *, turn: int = 1, step: int = 1, index: int = 0,
               kind: str = "text-delta") -> Event:
    return make("assistant/chunk", seq, {"turn": turn, "step": step,
                                       "chunk": {"type": kind, "index": index, "text": text}},
              time=time)


def tool_delta(seq: int, time: int, args: str, *, call_id: str = "call-1",
               name: str | None = "bash", index: int = 1) -> Event:
    chunk: dict[str, Any] = {"type": "tool-call-delta", "index": index, "id": call_id}
    if name is not None:
        chunk["name"] = name
    chunk["argumentsDelta"] = args
    return make("assistant/chunk", seq, {"turn": 1, "step": 1, "chunk": chunk}, time=time)


def roundtrip(records: list[Any]) -> list[Any]:
    """Write the records as JSONL lines, read them back and expand them.

    Rule: docs/formats.md#chunk-rows.
    """
    out: list[Any] = []
    for line in b"".join(dumps(r) + b"\n" for r in records).split(b"\n")[:-1]:
        out.extend(decode_storage_record(loads(line)))
    return out


def test_chunks_min_run_is_three() -> None:
    assert MIN_RUN == 3


def test_chunks_packs_a_text_delta_run_into_one_text_chunks_row_and_round_trips_it() -> None:
    # docs/formats.md#chunk-rows "packs a text-delta run into one text-chunks row and round-trips
    # it"
    batch = [text_delta(i, 1000 + 10 * i, f"t{i}") for i in range(5)]
    rows = pack_chunk_runs(batch)
    assert rows == [{"type": "text-chunks", "seq0": 0, "time0": 1000, "data": {
        "turn": 1, "step": 1, "index": 0, "dt": [10, 10, 10, 10],
        "texts": ["t0", "t1", "t2", "t3", "t4"]}}]
    assert list(rows[0]) == ["type", "seq0", "time0", "data"]
    assert list(rows[0]["data"]) == ["turn", "step", "index", "dt", "texts"]
    assert isinstance(rows[0], FrozenDict)
    assert roundtrip(rows) == batch
    assert [dumps(e) for e in roundtrip(rows)] == [dumps(e) for e in batch]


def test_chunks_packs_reasoning_and_tool_call_runs_under_their_own_tags() -> None:
    # docs/formats.md#chunk-rows "packs reasoning and tool-call runs under their own tags"
    batch = [text_delta(i, 5, f"r{i}", kind="reasoning-delta") for i in range(3)]
    batch += [tool_delta(3 + i, 6, a) for i, a in enumerate(['{"a"', ":", "1}"])]
    rows = pack_chunk_runs(batch)
    assert [r["type"] for r in rows] == ["reasoning-chunks", "tool-call-chunks"]
    assert rows[1]["data"] == {"turn": 1, "step": 1, "index": 1, "dt": [0, 0], "id": "call-1",
                               "name": "bash", "args": ['{"a"', ":", "1}"]}
    assert list(rows[1]["data"]) == ["turn", "step", "index", "dt", "id", "name", "args"]
    assert rows[1]["seq0"] == 3
    assert roundtrip(rows) == batch


def test_chunks_packs_a_name_less_tool_call_run_and_round_trips_field_absence() -> None:
    # docs/formats.md#chunk-rows "packs a name-less tool-call run and round-trips field absence"
    batch = [tool_delta(i, 7, f"a{i}", name=None) for i in range(4)]
    rows = pack_chunk_runs(batch)
    assert len(rows) == 1
    assert "name" not in rows[0]["data"]
    back = roundtrip(rows)
    assert back == batch
    assert all("name" not in e.data["chunk"] for e in back)
    assert list(back[0].data["chunk"]) == ["type", "index", "id", "argumentsDelta"]


def test_chunks_leaves_runs_shorter_than_three_events_verbatim() -> None:
    # docs/formats.md#chunk-rows "leaves runs shorter than three events verbatim"
    batch = [text_delta(0, 1, "a"), text_delta(1, 2, "b")]
    rows = pack_chunk_runs(batch)
    assert rows == batch
    assert all(r is e for r, e in zip(rows, batch, strict=True))


def test_chunks_leaves_non_delta_chunks_and_non_chunk_events_verbatim_between_runs() -> None:
    # docs/formats.md#chunk-rows "leaves non-delta chunks and non-chunk events verbatim between
    # runs" - 4 records
    start = make("assistant/chunk", 0, {"turn": 1, "step": 1,
                                      "chunk": {"type": "block-start", "index": 0,
                                                "blockType": "text"}})
    deltas = [text_delta(1 + i, 9, f"d{i}") for i in range(3)]
    end = make("assistant/chunk", 4, {"turn": 1, "step": 1, "chunk": {
        "type": "block-end", "index": 0, "block": {"type": "text", "text": "d0d1d2"}}})
    step_end = make("step/end", 5, {"turn": 1, "step": 1})
    rows = pack_chunk_runs([start, *deltas, end, step_end])
    assert len(rows) == 4
    assert rows[0] is start and rows[2] is end and rows[3] is step_end
    assert rows[1]["type"] == "text-chunks"
    assert roundtrip(rows) == [start, *deltas, end, step_end]


BREAKS = {
    "seq gap": [text_delta(0, 1, "a"), text_delta(1, 1, "b"),
                text_delta(3, 1, "c"), text_delta(4, 1, "d")],
    "kind switch": [text_delta(0, 1, "a"), text_delta(1, 1, "b"),
                    text_delta(2, 1, "c", kind="reasoning-delta"),
                    text_delta(3, 1, "d", kind="reasoning-delta")],
    "block-index switch": [text_delta(0, 1, "a"), text_delta(1, 1, "b"),
                           text_delta(2, 1, "c", index=1), text_delta(3, 1, "d", index=1)],
    "step switch": [text_delta(0, 1, "a"), text_delta(1, 1, "b"),
                    text_delta(2, 1, "c", step=2), text_delta(3, 1, "d", step=2)],
}


@pytest.mark.parametrize("cause", list(BREAKS))
def test_chunks_breaks_a_run_on_both_halves_too_short_to_pack(cause: str) -> None:
    # docs/formats.md#chunk-rows "breaks a run on %s (both halves too short to pack)" x4
    batch = BREAKS[cause]
    assert pack_chunk_runs(batch) == batch


def test_chunks_breaks_a_tool_call_run_on_call_id_or_name_change() -> None:
    # docs/formats.md#chunk-rows "breaks a tool-call run on call-id or name change"
    id_switch = [tool_delta(0, 1, "a"), tool_delta(1, 1, "b"),
                 tool_delta(2, 1, "c", call_id="call-2"), tool_delta(3, 1, "d", call_id="call-2")]
    assert pack_chunk_runs(id_switch) == id_switch
    presence = [tool_delta(0, 1, "a"), tool_delta(1, 1, "b"),
                tool_delta(2, 1, "c", name=None), tool_delta(3, 1, "d", name=None)]
    assert pack_chunk_runs(presence) == presence
    value = [tool_delta(0, 1, "a"), tool_delta(1, 1, "b"),
             tool_delta(2, 1, "c", name="grep"), tool_delta(3, 1, "d", name="grep")]
    assert pack_chunk_runs(value) == value


def _raw_event(fields: dict[str, Any]) -> Event:
    return Event(snapshot_json(fields))


def test_chunks_stores_an_off_whitelist_delta_verbatim() -> None:
    # docs/formats.md#chunk-rows "stores an off-whitelist delta verbatim (extra field, bad type,
    # fractional time)"
    good = [text_delta(i, 1, "x") for i in range(3)]
    extra_field = _raw_event({**good[1], "ignorable": True})
    bad_text = _raw_event({**good[1], "data": {"turn": 1, "step": 1, "chunk": {
        "type": "text-delta", "index": 0, "text": 5}}})
    fractional = _raw_event({**good[1], "time": 1.5})
    extra_chunk_key = _raw_event({**good[1], "data": {"turn": 1, "step": 1, "chunk": {
        "type": "text-delta", "index": 0, "text": "x", "more": 1}}})
    surface = _raw_event({**good[1], "surfaceOp": "append"})
    for odd in (extra_field, bad_text, fractional, extra_chunk_key, surface):
        batch = [good[0], odd, good[2]]
        assert pack_chunk_runs(batch) == batch
        assert roundtrip(pack_chunk_runs(batch)) == batch


def test_chunks_breaks_a_run_on_a_time_gap_beyond_safe_integer_range() -> None:
    # docs/formats.md#chunk-rows "breaks a run on a time gap beyond safe-integer range (subtraction
    # would round)"
    low, high = -MAX_SAFE_INTEGER, MAX_SAFE_INTEGER
    batch = [text_delta(0, low, "a"), text_delta(1, low, "b"),
             text_delta(2, high, "c"), text_delta(3, high, "d")]
    assert pack_chunk_runs(batch) == batch
    # within range the same kind of jump packs
    ok = [text_delta(0, 0, "a"), text_delta(1, high, "b"), text_delta(2, 0, "c")]
    rows = pack_chunk_runs(ok)
    assert rows[0]["data"]["dt"] == [high, -high]
    assert roundtrip(rows) == ok


def test_chunks_stores_a_delta_with_an_off_whitelist_data_envelope_verbatim() -> None:
    # docs/formats.md#chunk-rows "stores a delta with an off-whitelist data envelope verbatim" -
    # seven shapes
    base = text_delta(1, 1, "x")
    shapes: list[Any] = [
        None,
        "text",
        {"turn": 1, "step": 1},
        {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "x"},
         "extra": 0},
        {"turn": "1", "step": 1, "chunk": {"type": "text-delta", "index": 0, "text": "x"}},
        {"turn": 1, "step": True, "chunk": {"type": "text-delta", "index": 0, "text": "x"}},
        {"turn": 1, "step": 1, "chunk": {"type": "text-delta", "index": "0", "text": "x"}},
    ]
    for data in shapes:
        odd = _raw_event({**base, "data": data})
        batch = [text_delta(0, 1, "a"), odd, text_delta(2, 1, "c")]
        assert pack_chunk_runs(batch) == batch


def test_chunks_passes_non_row_values_through_as_single_events_unvalidated() -> None:
    # docs/formats.md#chunk-rows "passes non-row values through as single events, unvalidated"
    event = text_delta(0, 1, "a")
    assert decode_storage_record(event) == [event]
    assert decode_storage_record(event)[0] is event
    assert decode_storage_record("junk") == ["junk"]
    assert decode_storage_record(None) == [None]
    odd = loads(b'{"type":"no/such","whatever":1}')
    decoded = decode_storage_record(odd)
    assert decoded == [{"type": "no/such", "whatever": 1}]
    assert isinstance(decoded[0], Event)


def test_chunks_reconstructs_timestamps_through_negative_dt_gaps() -> None:
    # docs/formats.md#chunk-rows "reconstructs timestamps through negative dt gaps (clock stepped
    # back)"
    batch = [text_delta(0, 100, "a"), text_delta(1, 90, "b"), text_delta(2, 95, "c")]
    rows = pack_chunk_runs(batch)
    assert rows[0]["data"]["dt"] == [-10, 5]
    assert [e.time for e in roundtrip(rows)] == [100, 90, 95]


def _row(tag: str = "text-chunks", **data_overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"turn": 1, "step": 1, "index": 0, "dt": [1, 1]}
    if tag == "tool-call-chunks":
        data.update({"id": "c1", "name": "bash", "args": ["a", "b", "c"]})
    else:
        data["texts"] = ["a", "b", "c"]
    for key, value in data_overrides.items():
        if value is _DROP:
            del data[key]
        else:
            data[key] = value
    return {"type": tag, "seq0": 5, "time0": 100, "data": data}


_DROP = object()

MALFORMED: dict[str, tuple[Any, str]] = {
    "non-object data": ({**_row(), "data": [1]}, "data must be an object"),
    "extra envelope key": ({**_row(), "extra": 1}, "envelope keys"),
    "negative seq0": ({**_row(), "seq0": -1}, "seq0 must be a non-negative safe integer"),
    "non-finite time0": ({**_row(), "time0": float("inf")}, "time0 must be a safe integer"),
    "fractional time0": ({**_row(), "time0": 1.5}, "time0 must be a safe integer"),
    "unsafe time0": ({**_row(), "time0": 2**53}, "time0 must be a safe integer"),
    "wrong payload key": ({**_row(texts=_DROP), "data": {
        "turn": 1, "step": 1, "index": 0, "dt": [1, 1], "args": ["a", "b", "c"]}},
        "data keys"),
    "non-string member": (_row(texts=["a", 2, "c"]), "texts must be a non-empty array"),
    "empty member list": (_row(texts=[], dt=[]), "texts must be a non-empty array"),
    "dt arity mismatch": (_row(dt=[1]), "dt must hold 2 gaps for 3 members, got 1"),
    "non-finite dt": (_row(dt=[1, float("nan")]), "dt must be an array of safe integers"),
    "fractional dt": (_row(dt=[1, 0.5]), "dt must be an array of safe integers"),
    "unsafe dt": (_row(dt=[1, 2**53]), "dt must be an array of safe integers"),
    "member seq leaving the safe range": (
        {**_row(), "seq0": MAX_SAFE_INTEGER - 1}, "member seqs must stay safe integers"),
    "member time leaving the safe range": (
        {**_row(dt=[1, MAX_SAFE_INTEGER]), "time0": 0}, "member times must stay safe integers"),
    "non-numeric turn": (_row(turn="1"), "turn must be a number"),
    "tool-call row without id": (_row("tool-call-chunks", id=_DROP), "data keys"),
    "tool-call row with non-string id": (_row("tool-call-chunks", id=7),
                                         "id must be a string"),
    "tool-call row with non-string name": (_row("tool-call-chunks", name=None),
                                           "name must be a string"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_chunks_throws_on_malformed_row(case: str) -> None:
    # docs/formats.md#chunk-rows "throws on %s", 17 malformed rows
    row, reason = MALFORMED[case]
    # non-finite numbers cannot pass the JSON door, so those rows go in as built
    value = row if case.startswith(("non-finite", "unsafe")) else loads(dumps(snapshot_json(row)))
    with pytest.raises(EventRejectedError) as info:
        decode_storage_record(value)
    assert info.value.code == "MALFORMED_CHUNK_ROW"
    assert info.value.message.startswith(f"malformed {row['type']} storage row: ")
    assert reason in info.value.message
    assert info.value.where["event_type"] == row["type"]


def test_chunks_throws_on_a_boolean_where_a_number_belongs() -> None:
    for row in (_row(index=True), {**_row(), "seq0": True}, _row(dt=[True, 1])):
        with pytest.raises(EventRejectedError, match=r"^malformed text-chunks storage row: "):
            decode_storage_record(snapshot_json(row))


def test_chunks_decoded_members_are_frozen_events() -> None:
    decoded = decode_storage_record(snapshot_json(_row("tool-call-chunks")))
    assert [e.seq for e in decoded] == [5, 6, 7]
    assert [e.time for e in decoded] == [100, 101, 102]
    assert decoded[0] == {"type": "assistant/chunk", "seq": 5, "time": 100, "data": {
        "turn": 1, "step": 1, "chunk": {"type": "tool-call-delta", "index": 0, "id": "c1",
                                        "name": "bash", "argumentsDelta": "a"}}}
    assert all(isinstance(e, Event) for e in decoded)
    with pytest.raises(TypeError):
        decoded[0].data["chunk"]["id"] = "x"


def test_chunks_decode_reads_dsh_written_rows() -> None:
    # a row exactly as dsh wrote it (dsh-logs/jsonl crash-after-resume s2b, line 46)
    line = (b'{"type":"tool-call-chunks","seq0":82,"time0":1796030744572,"data":{"turn":2,'
            b'"step":1,"index":2,"dt":[0,0],"id":"call_2_1_srv","name":"read_file","args":'
            b'["{\\"path\\":\\"","src/serve","r.ts\\"}"]}}')
    events = decode_storage_record(loads(line))
    assert [e.seq for e in events] == [82, 83, 84]
    assert "".join(e.data["chunk"]["argumentsDelta"] for e in events) == \
        '{"path":"src/server.ts"}'
    assert pack_chunk_runs(events) == [loads(line)]
    assert dumps(pack_chunk_runs(events)[0]) == line


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(batch=chunk_batches())
def test_chunks_json_serialized_pack_decode_reproduces_every_batch_exactly(
        batch: list[Event]) -> None:
    # docs/formats.md#chunk-rows "JSON-serialized pack∘decode reproduces every batch exactly" (full
    # safe-int times)
    rows = pack_chunk_runs(batch)
    back = roundtrip(rows)
    assert back == batch
    assert [dumps(e) for e in back] == [dumps(e) for e in batch]
    assert len(rows) <= len(batch)


def _dsh_logs() -> Path:
    return DSH_LOGS


@pytest.mark.parametrize("store", ["jsonl", "jsonl-unpacked"])
def test_chunks_repacking_dsh_written_logs_reproduces_their_lines_byte_for_byte(
        store: str) -> None:
    # docs/formats.md#record-lines: rows are written per batch; in these fixtures no run crossed a
    # batch boundary, so packing each whole log as one batch gives dsh's exact lines
    files = sorted((_dsh_logs() / store).glob("*/*/*/session.jsonl"))
    assert files
    for path in files:
        raw = path.read_bytes()
        lines = raw.split(b"\n")[1:-1]  # drop the header and the (possibly torn) tail
        events = [e for line in lines for e in decode_storage_record(loads(line))]
        assert [e["seq"] for e in events] == list(range(len(events)))
        repacked = [dumps(r) for r in pack_chunk_runs(events)]
        if store == "jsonl":
            assert repacked == lines, path
        else:
            assert len(repacked) < len(lines)  # packing is on by default for these runs
            assert roundtrip(pack_chunk_runs(events)) == events

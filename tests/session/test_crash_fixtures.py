"""Crash fixtures written by the real dsh: our closers match the tail dsh committed on resume.

docs/rules.md#repair, docs/rules.md#closers, docs/testing.md#what-the-tests-cover ("the repaired
views of the crash fixtures match dsh's repaired views event for event"). Only the model-facing
wording is ours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dsh.json import loads, thaw
from dsh.session._chunks import decode_storage_record
from dsh.session._events import Event
from dsh.session._invariants import check_log
from dsh.session._repair import interrupted_turn_closers
from tests.conftest import DSH_LOGS

SESSIONS = ["s2a-crash-after-tool-call", "s2b-crash-before-tool-call", "s2c-crash-mid-stream"]


@pytest.fixture(scope="module")
def jsonl_root() -> Path:
    return DSH_LOGS / "jsonl"


def _session_file(root: Path, store: str, session_id: str) -> Path:
    found = sorted((root / store).glob(f"*/{session_id}/session.jsonl"))
    assert len(found) == 1, f"expected one session.jsonl for {session_id} in {store}: {found}"
    return found[0]


def _read_log(path: Path) -> tuple[Any, list[Event]]:
    """Header and events of a raw JSONL log (records split on b"\\n" only)."""
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    lines = raw[:-1].split(b"\n")
    header = loads(lines[0])
    events: list[Event] = []
    for line in lines[1:]:
        for event in decode_storage_record(loads(line)):
            assert isinstance(event, Event)
            events.append(event)
    assert [e.seq for e in events] == list(range(len(events)))
    return header, events


def _without_wording(event: Event) -> Any:
    plain = thaw(event)
    if plain["type"] == "tool/result":
        block = plain["data"]["message"]["content"][0]
        assert [c["type"] for c in block["content"]] == ["text"]
        block["content"] = "<wording>"
    return plain


@pytest.mark.parametrize("session_id", SESSIONS)
def test_crash_fixture_closers_match_dsh_repaired_tail(jsonl_root: Path, session_id: str) -> None:
    header, before = _read_log(_session_file(jsonl_root, "crash-before-resume", session_id))
    after_header, after = _read_log(_session_file(jsonl_root, "crash-after-resume", session_id))
    assert header["id"] == after_header["id"] == session_id
    # dsh never rewrites history: the stored prefix survives the resume untouched
    assert after[: len(before)] == before

    closers = interrupted_turn_closers(before)
    assert closers, "every crash fixture ends inside turn 2"
    expected = after[len(before): len(before) + len(closers)]
    assert [_without_wording(c) for c in closers] == [_without_wording(e) for e in expected]
    # key order matters for byte-identical output (docs/rules.md#closers)
    for ours, theirs in zip(closers, expected, strict=True):
        assert list(ours) == list(theirs)
        if ours.type == "tool/result":
            assert list(ours.data) == list(theirs.data)
            assert list(ours.data["message"]) == list(theirs.data["message"])
            assert list(ours.data["message"]["content"][0]) == \
                list(theirs.data["message"]["content"][0])
    # after the closers, the turn is closed: the next dsh event opens nothing half-done
    assert closers[-1].type == "turn/end"
    assert closers[-1].data == {"turn": 2, "reason": {"kind": "interrupted"}}
    # the repaired log passes the invariant companion
    assert check_log([*before, *closers]) == []


def test_crash_fixture_s2a_outcome_unknown_details(jsonl_root: Path) -> None:
    _, before = _read_log(_session_file(jsonl_root, "crash-before-resume", SESSIONS[0]))
    closers = interrupted_turn_closers(before)
    assert [(c.type, c.seq) for c in closers] == [
        ("tool/result", 89), ("step/end", 90), ("turn/end", 91)]
    result = closers[0]
    assert result.time == before[-1].time
    assert result.source_event_seqs == [88]
    assert result.data["error"] == {"name": "ToolOutcomeUnknownError",
                                    "code": "TOOL_OUTCOME_UNKNOWN"}
    assert result.data["message"]["id"] == "interrupted-tool-result-call_2_0_build-89"
    text = result.data["message"]["content"][0]["content"][0]["text"]
    assert '"bash" tool call call_2_0_build' in text


def test_crash_fixture_s2b_not_started_details(jsonl_root: Path) -> None:
    _, before = _read_log(_session_file(jsonl_root, "crash-before-resume", SESSIONS[1]))
    closers = interrupted_turn_closers(before)
    assert [(c.type, c.seq) for c in closers] == [
        ("tool/result", 91), ("tool/result", 92), ("step/end", 93), ("turn/end", 94)]
    assert [c.data["message"]["id"] for c in closers[:2]] == [
        "interrupted-tool-result-call_2_0_idx-91", "interrupted-tool-result-call_2_1_srv-92"]
    assert all("sourceEventSeqs" not in c for c in closers)
    assert {c.data["error"]["code"] for c in closers[:2]} == {"TOOL_NOT_STARTED"}


def test_crash_fixture_s2c_mid_stream_closes_step_and_turn_only(jsonl_root: Path) -> None:
    _, before = _read_log(_session_file(jsonl_root, "crash-before-resume", SESSIONS[2]))
    closers = interrupted_turn_closers(before)
    assert [(c.type, c.seq, c.time) for c in closers] == [
        ("step/end", 82, before[-1].time), ("turn/end", 83, before[-1].time)]


# dsh's inspect() view of each crashed store already holds the in-memory closers (README of
# dsh-logs): the last CLOSER_COUNT events. Same scenario in every backend, own ids and times.
CLOSER_COUNT = {"s2a-crash-after-tool-call": 3, "s2b-crash-before-tool-call": 4,
                "s2c-crash-mid-stream": 2, "s2d-crash-torn-tail": 2}
EXPECTED_VIEWS = [(store, session_id) for store in ("jsonl", "jsonl-zstd", "sqlite")
                  for session_id in SESSIONS] + [("jsonl", "s2d-crash-torn-tail")]


@pytest.mark.parametrize(("store", "session_id"), EXPECTED_VIEWS)
def test_crash_fixture_closers_match_dsh_inspect_view_in_every_backend(
        jsonl_root: Path, store: str, session_id: str) -> None:
    path = jsonl_root.parent / "expected" / store / "crash-before-resume" / f"{session_id}.json"
    view = loads(path.read_bytes())
    events = [Event(e) for e in view["events"]]
    count = CLOSER_COUNT[session_id]
    prefix, tail = events[:-count], events[-count:]
    closers = interrupted_turn_closers(prefix)
    assert [_without_wording(c) for c in closers] == [_without_wording(e) for e in tail]
    assert check_log(events) == []

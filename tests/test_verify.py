"""`dsh._verify.verify_events`: one list of violations over every rule a stored log must keep
(docs/events.md#known-types-and-ignorable-events vocabulary, docs/formats.md#the-session-header,
docs/rules.md#seed-validation, docs/rules.md#the-end-seed-marker restore, docs/rules.md#the-surface
surface, docs/rules.md#closers repair, docs/rules.md#tool-pairing tool pairing,
docs/rules.md#turns-and-steps invariants; docs/rules.md#compaction-brackets compaction brackets)."""

from __future__ import annotations

from typing import Any

import pytest

from dsh import Violation
from dsh._verify import RULES, verify_events
from dsh.json import thaw
from dsh.session._events import Event
from dsh.testing import LogBuilder, header, make, tool_result

pytestmark = pytest.mark.no_speedups


def _answered() -> list[Event]:
    """Seqs: turn 1 at 0-5 (assistant 3); turn 2 at 6-13 (assistant 9, call 10, result 11)."""
    builder = LogBuilder("s")
    builder.completed_turn()
    builder.tool_call_turn("call_1")
    builder.close_tool("call_1")
    return list(builder.events)


def _interrupted() -> list[Event]:
    """Turn 2 is open at the end: assistant at seq 9 asked for call_1 (tool/call at 10)."""
    builder = LogBuilder("s")
    builder.completed_turn()
    builder.tool_call_turn("call_1")
    return list(builder.events)


def test_verify_valid_log_has_no_violation() -> None:
    events = _answered()
    assert verify_events(events, header=header("s")) == []
    assert verify_events(events) == []  # default header
    assert verify_events([thaw(e) for e in events]) == []  # plain wire objects


def test_verify_interrupted_turn_is_not_a_violation() -> None:
    """docs/rules.md#closers: the repair closers would answer the open turn's call."""
    assert verify_events(_interrupted(), header=header("s")) == []


def test_verify_dangling_call_at_rest_is_unanswered_tool_call() -> None:
    """A closed turn whose assistant call never got a result; no repair would answer it.

    Rule: docs/rules.md#tool-pairing.
    """
    events = _interrupted()
    n = len(events)
    events += [make("step/end", n, {"turn": 2, "step": 1}),
               make("turn/end", n + 1, {"turn": 2, "reason": {"kind": "completed"}})]
    assert verify_events(events, header=header("s")) == [Violation(
        9, "UNANSWERED_TOOL_CALL",
        "tool call 'call_1' of the assistant message at seq 9 has no result and no open turn "
        "to repair it; a provider would refuse the next request")]


def test_verify_orphan_result_is_reported_by_pairing_and_invariants() -> None:
    builder = LogBuilder("s")
    builder.completed_turn()
    builder.open_turn("x")
    events = list(builder.events)
    events.append(make("tool/result", 9, tool_result(2, 1, "ghost", "ok"), surfaceOp="append"))
    found = verify_events(events, header=header("s"))
    assert [(v.seq, v.rule) for v in found] == [(9, "ORPHAN_TOOL_RESULT"),
                                                (9, "UNPAIRED_RESULT")]
    assert "'ghost'" in found[0].message


def test_verify_second_result_for_one_call_is_duplicate() -> None:
    events = _answered()[:12]
    events.append(make("tool/result", 12, tool_result(2, 1, "call_1", "again"),
                       surfaceOp="append", sourceEventSeqs=[10]))
    found = verify_events(events, header=header("s"))
    assert [(v.seq, v.rule) for v in found] == [(12, "DUPLICATE_TOOL_RESULT"),
                                                (12, "UNPAIRED_RESULT")]


def test_verify_unknown_type_not_ignorable() -> None:
    """Unknown types must be marked ignorable; an ignorable one is fine.

    Rule: docs/events.md#known-types-and-ignorable-events.
    """
    events = _answered()
    fine = [*events, make("import/source", 14, {"format": "x"}, ignorable=True)]
    assert verify_events(fine, header=header("s")) == []
    events.append(make("weird/thing", 14, {}))
    found = verify_events(events, header=header("s"))
    assert found[0] == Violation(14, "UNKNOWN_EVENT_TYPE",
                                 "event type 'weird/thing' at seq 14 is unknown to this dsh and "
                                 "not marked ignorable")


def test_verify_restore_refusal_names_the_seq() -> None:
    """Restore stops at the first bad envelope; one violation, at that seq.

    Rule: docs/rules.md#seed-validation.
    """
    events = [*_answered()[:3], make("turn/start", 5, {"turn": 1})]
    found = verify_events(events, header=header("s"))
    assert found[0] == Violation(3, "SEQ_NOT_CONTIGUOUS",
                                 "seed must be contiguous from 0: event at index 3 has seq 5; "
                                 "expected seq 3")
    assert [v.rule for v in found].count("SEQ_NOT_CONTIGUOUS") == 2  # restore, then surface
    assert "REPAIR" in {v.rule for v in found}


def test_verify_bad_header_is_one_violation() -> None:
    found = verify_events(_answered(), header=header("s", version=3))
    assert [(v.seq, v.rule) for v in found] == [(None, "HEADER")]


def test_verify_compaction_bracket_rule_is_prefixed() -> None:
    """docs/rules.md#compaction-brackets: a turn may not start inside an open standalone bracket."""
    events = _answered()
    events += [make("compaction/start", 14, {"compactionId": "c1", "turn": None}),
               make("turn/start", 15, {"turn": 3})]
    found = verify_events(events, header=header("s"))
    assert [(v.seq, v.rule) for v in found] == [(15, "COMPACTION_CROSSING")]


def test_verify_non_object_event_is_invalid_log() -> None:
    bad: list[Any] = [*_answered()[:2], ["not", "an", "object"]]
    assert verify_events(bad) == [Violation(2, "INVALID_LOG",
                                            "event at index 2 is not a JSON object (list)")]


def test_verify_event_without_data_is_invalid_log_not_a_key_error() -> None:
    # Before: KeyError from the compaction bracket walk, for a log verify_events must judge.
    for bad in ([{"seq": 0, "time": 1, "type": "compaction/start"}],
                [*_answered()[:2], {"seq": 2, "time": 1, "type": "turn/start"}]):
        index = len(bad) - 1
        assert verify_events(bad) == [Violation(
            index, "INVALID_LOG",
            f"event at index {index} has no data (every event carries one; null is a value)")]
    assert verify_events([{"seq": 0, "time": 1, "type": "session/title", "data": None}]) == []


def test_verify_rule_codes_are_upper_snake() -> None:
    assert all(rule.isupper() and " " not in rule for rule in RULES)

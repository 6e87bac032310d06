"""Compaction bracket invariants (docs/rules.md#compaction-brackets)."""

from __future__ import annotations

from typing import Any

import pytest

from dsh._errors import InvariantError
from dsh.compaction._brackets import CompactionInvariant, check_compaction_log
from dsh.compaction._region import compact_now, compact_surface_region
from dsh.compaction._selection import select_compactable_range
from dsh.session._events import Event
from dsh.session._session import Session
from tests.compaction.builders import long_session, new_session, user
from tests.compaction.test_region import Boom, Fixed


def log(*steps: tuple[str, dict[str, Any]]) -> list[Event]:
    session = new_session()
    for kind, data in steps:
        session.append(kind, data)
    return list(session.events)


def start(cid: str = "c", turn: int | None = None) -> tuple[str, dict[str, Any]]:
    return ("compaction/start", {"compactionId": cid, "turn": turn})


def summary(cid: str = "c") -> tuple[str, dict[str, Any]]:
    return ("compaction/summary", {"compactionId": cid, "summary": [],
                                   "shadowedRange": {"start": 1, "end": 2},
                                   "shadowedSeqs": [1, 2], "shadowedTokenCount": 9,
                                   "provider": "p", "model": "m"})


def end(cid: str = "c", turn: int | None = None, error: str | None = None
        ) -> tuple[str, dict[str, Any]]:
    data: dict[str, Any] = {"compactionId": cid, "turn": turn}
    if error is not None:
        data["error"] = error
    return ("compaction/end", data)


def ts(n: int) -> tuple[str, dict[str, Any]]:
    return ("turn/start", {"turn": n})


def te(n: int) -> tuple[str, dict[str, Any]]:
    return ("turn/end", {"turn": n, "reason": {"kind": "completed"}})


def rules(events: list[Event]) -> list[tuple[int, str]]:
    return [(v.seq, v.rule) for v in check_compaction_log(events)]


def test_invariant_accepts_successful_and_failed_compaction_lifecycles() -> None:
    assert rules(log(ts(1), start("a", 1), summary("a"), end("a", 1),
                     start("b", 1), end("b", 1, "boom"), te(1))) == []
    session = long_session(2)
    session.append("turn/start", {"turn": 3})
    span = select_compactable_range(session, retain_tokens=0)
    assert span is not None
    compact_surface_region(session, *span, summarizer=Fixed(), owner=3)
    assert rules(list(session.events)) == []


def test_invariant_accepts_standalone_successful_and_failed_lifecycles_between_turns() -> None:
    assert rules(log(ts(1), te(1), start("a"), summary("a"), end("a"), start("b"),
                     end("b", None, "x"))) == []
    session = long_session(2)
    compact_now(session, summarizer=Fixed())
    with pytest.raises(Exception):  # noqa: B017 - the failure itself is not the subject
        compact_now(session, summarizer=Boom(RuntimeError("down")))
    assert rules(list(session.events)) == []


def test_invariant_clears_an_inherited_open_compaction_trace_at_end_seed_during_replay() -> None:
    events = log(start("orphan"))
    resumed = Session.restore("s", events, new_session().header)
    resumed.append("compaction/start", {"compactionId": "new", "turn": None})
    assert rules(list(resumed.events)) == []


def test_invariant_allows_repair_turn_boundaries_after_end_seed_clears_a_numbered_orphan(
) -> None:
    events = log(ts(1), start("orphan", 1))
    resumed = Session.restore("s", events, new_session().header)
    resumed.append("turn/end", {"turn": 1, "reason": {"kind": "interrupted"}})
    assert rules(list(resumed.events)) == []


def test_invariant_accepts_inherited_repair_boundaries_before_the_clearing_end_seed() -> None:
    # a standalone orphan, then repair closers inside the seed, then the end-seed
    events = log(ts(1), te(1), start("orphan"), ts(2), ("turn/end", {
        "turn": 2, "reason": {"kind": "interrupted"}}))
    resumed = Session.restore("s", events, new_session().header)
    assert rules(list(resumed.events)) == []


def test_invariant_rejects_a_closed_standalone_bracket_that_contains_a_turn_before_end_seed(
) -> None:
    events = log(start("a"), ts(1), te(1), end("a", None, "x"))
    resumed = Session.restore("s", events, new_session().header)
    assert rules(list(resumed.events)) == [(1, "CROSSING"), (2, "CROSSING")]


def test_invariant_rebuilds_an_open_trace_when_the_companion_loads_after_the_session() -> None:
    session = new_session()
    session.append("turn/start", {"turn": 1})
    session.append("compaction/start", {"compactionId": "c", "turn": 1})
    CompactionInvariant().install(session)
    with pytest.raises(InvariantError, match="NESTED"):
        session.append("compaction/start", {"compactionId": "d", "turn": 1})
    with pytest.raises(InvariantError, match="CROSSING"):
        session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    session.append("compaction/end", {"compactionId": "c", "turn": 1, "error": "x"})
    session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})


def test_invariant_adopts_a_bare_session_and_ignores_unrelated_committed_events() -> None:
    session = long_session(2)
    uninstall = CompactionInvariant().install(session)
    user(session, "more")
    session.append("todo/write", {"todos": []})
    assert compact_now(session, summarizer=Fixed()) is not None
    uninstall()


def test_invariant_rejects_compaction_outside_or_for_a_different_open_turn() -> None:
    assert rules(log(start("a", 1))) == [(0, "OWNER")]
    assert rules(log(ts(1), start("a", 2))) == [(1, "OWNER")]


def test_invariant_rejects_a_standalone_bracket_in_a_turn_and_a_numbered_one_between_turns(
) -> None:
    assert rules(log(ts(1), start("a"))) == [(1, "OWNER")]
    assert rules(log(ts(1), te(1), start("a", 1))) == [(2, "OWNER")]


def test_invariant_attributes_a_nested_standalone_start_to_the_standalone_owner() -> None:
    found = check_compaction_log(log(start("a"), start("b")))
    assert [(v.seq, v.rule) for v in found] == [(1, "NESTED")]
    assert "the standalone owner" in found[0].message


def test_invariant_rejects_an_unenclosed_compaction_event_when_replaying() -> None:
    assert rules(log(summary("a"), end("a"))) == [(0, "UNENCLOSED"), (1, "UNENCLOSED")]
    with pytest.raises(InvariantError, match="UNENCLOSED"):
        CompactionInvariant().install(Session.create("x", seed=log(end("a"))))


def test_invariant_rejects_turn_boundaries_that_cross_live_brackets() -> None:
    assert rules(log(start("a"), ts(1))) == [(1, "CROSSING")]
    assert rules(log(ts(1), start("a", 1), te(1))) == [(2, "CROSSING")]


def test_invariant_rejects_a_replacement_checkpoint_for_another_transaction() -> None:
    session = new_session()
    u = user(session, "x " * 100)
    user(session, "tail")
    session.append("compaction/start", {"compactionId": "mine", "turn": None})
    CompactionInvariant().install(session)
    with pytest.raises(InvariantError, match="CHECKPOINT"):
        session.append("user/message", {
            "content": [], "role": "user", "id": "k",
            "source": {"kind": "plugin", "plugin": "compact", "compactionId": "other"}},
            surface_op={"op": "replace", "start": u.seq, "end": u.seq},
            source_event_seqs=[u.seq])


def test_invariant_requires_checkpoint_provenance_to_name_an_open_transaction() -> None:
    session = Session.create("s")
    u = user(session, "x")
    session.append("user/message", {
        "content": [], "role": "user", "id": "k",
        "source": {"kind": "plugin", "plugin": "compact", "compactionId": "none"}},
        surface_op={"op": "replace", "start": u.seq, "end": u.seq}, source_event_seqs=[u.seq])
    assert rules(list(session.events)) == [(1, "CHECKPOINT")]


def test_invariant_rejects_a_summary_twice_a_bad_range_and_a_summaryless_success() -> None:
    assert rules(log(start("a"), summary("a"), summary("a"))) == [(2, "SUMMARY")]
    bad = ("compaction/summary", {"compactionId": "a", "shadowedRange": {"start": 1, "end": 9},
                                  "shadowedSeqs": [1, 2], "shadowedTokenCount": 3})
    assert rules(log(start("a"), bad)) == [(1, "SUMMARY")]
    assert rules(log(start("a"), end("a"))) == [(1, "SUMMARY")]
    assert rules(log(start(""), )) == [(0, "ID")]
    assert rules(log(start("a"), end("b", None, "x"))) == [(1, "ID")]
    assert rules(log(ts(1), start("a", 1), end("a", None, "x"))) == [(2, "OWNER")]


@pytest.mark.parametrize("kind", ["compaction/start", "compaction/summary", "compaction/end",
                                  "compaction/prune"])
def test_compaction_events_are_log_only(kind: str) -> None:
    # docs/rules.md#compaction-brackets "compaction/* events merge into SessionEventMap and are
    # log-only".
    from dsh._errors import EventRejectedError
    from dsh.session._events import KNOWN_EVENT_TYPES

    assert kind in KNOWN_EVENT_TYPES
    session = new_session()
    with pytest.raises(EventRejectedError):
        session.append(kind, {"compactionId": "c", "turn": None}, surface_op="append")
    with pytest.raises(EventRejectedError):
        session.append(kind, {"compactionId": "c", "turn": None}, source_event_seqs=[0])
    assert session.seq == 0

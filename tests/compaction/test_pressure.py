"""Automatic pressure compaction.

Rule: docs/rules.md#automatic-compaction, docs/rules.md#compaction.
"""

from __future__ import annotations

import pytest

from dsh._errors import CompactionError, ConfigError
from dsh.compaction._pressure import CompactionPolicy, compact_if_needed
from dsh.compaction._pruner import PrunerConfig
from dsh.compaction._tokens import measure_surface
from tests.compaction.builders import long_session, new_session, turn, user
from tests.compaction.test_region import Fixed


def open_turn(session, number: int) -> None:  # type: ignore[no-untyped-def]
    session.append("turn/start", {"turn": number})


def test_policy_uses_low_friction_defaults() -> None:
    # docs/rules.md#compaction "uses low-friction service-wide defaults": 0.8 / 0.16 / retries 1.
    policy = CompactionPolicy()
    assert (policy.threshold_ratio, policy.effective_retain_ratio,
            policy.compaction_retries) == (0.8, 0.16, 1)
    assert policy.threshold_tokens(1000) == 800 and policy.retain_budget(1000) == 160
    assert CompactionPolicy(retain_tokens=5).retain_budget(1000) == 5


@pytest.mark.parametrize("kwargs", [
    {"threshold_ratio": 0}, {"threshold_ratio": 1.5}, {"retain_ratio": 0.9},
    {"retain_ratio": 0.1, "retain_tokens": 10}, {"retain_tokens": -1},
    {"compaction_retries": -1},
])
def test_policy_validates_common_values_and_pressure_invariants(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        CompactionPolicy(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        CompactionPolicy(retain_tokens=800).retain_budget(1000)


def test_pressure_does_nothing_below_threshold_and_compacts_a_priced_head_above_it() -> None:
    session = long_session(4)
    open_turn(session, 5)
    total = measure_surface(session).total_tokens
    before = session.seq
    assert compact_if_needed(session, summarizer=Fixed(), context_window=total * 2,
                             owner=5) is None
    assert session.seq == before
    outcome = compact_if_needed(session, summarizer=Fixed(), context_window=total, owner=5)
    assert outcome is not None and len(outcome.compactions) == 1
    result = outcome.compactions[0]
    assert session.events[result.start_seq].data["turn"] == 5
    assert outcome.tokens_before == total > outcome.tokens_after
    assert outcome.tokens_after <= CompactionPolicy().threshold_tokens(total)
    assert result.shadowed_range[0] == session.events[result.replacement_seq]["surfaceOp"][
        "start"]


def test_pressure_skips_summarization_when_pruning_alone_clears_pressure() -> None:
    session = new_session()
    turn(session, 1, "list", calls=(("c1", "bash", '{"command":"ls"}', "x" * 4000),))
    open_turn(session, 2)
    total = measure_surface(session).total_tokens
    summarizer = Fixed()
    outcome = compact_if_needed(session, summarizer=summarizer, context_window=total, owner=2,
                                pruner=PrunerConfig(threshold_chars=500, head_chars=100,
                                                    tail_chars=100))
    assert outcome is not None and outcome.pruned is not None
    assert len(outcome.pruned.pruned) == 1 and outcome.compactions == ()
    assert summarizer.calls == []


def test_pressure_summarizes_the_pruned_surface_when_pruning_is_insufficient() -> None:
    session = long_session(4)
    open_turn(session, 5)
    total = measure_surface(session).total_tokens
    outcome = compact_if_needed(session, summarizer=Fixed(), context_window=total // 2, owner=5,
                                policy=CompactionPolicy(retain_tokens=50),
                                pruner=PrunerConfig(threshold_chars=100, head_chars=20,
                                                    tail_chars=20))
    assert outcome is not None
    assert outcome.pruned is not None and len(outcome.pruned.pruned) == 4
    assert len(outcome.compactions) >= 1


def test_pressure_bounds_retries_when_a_shrinking_checkpoint_remains_above_threshold() -> None:
    session = long_session(4)
    open_turn(session, 5)
    user(session, "a large fresh message " * 200)
    total = measure_surface(session).total_tokens

    class Shrinking:
        def __init__(self) -> None:
            self.sizes = iter([1200, 10])

        def summarize(self, messages: object, *, previous: str | None = None) -> str:
            return "y" * next(self.sizes)

    with pytest.raises(CompactionError, match="after 2 compaction attempts") as info:
        compact_if_needed(session, summarizer=Shrinking(), context_window=total // 3, owner=5,
                          policy=CompactionPolicy(retain_tokens=0))
    assert info.value.code == "PRESSURE"
    assert [e.type for e in session.events].count("compaction/end") == 2


def test_pressure_declines_when_the_surface_has_no_compactable_range() -> None:
    session = new_session()
    open_turn(session, 1)
    user(session, "one huge message " * 300)
    outcome = compact_if_needed(session, summarizer=Fixed(), context_window=100, owner=1,
                                policy=CompactionPolicy(retain_tokens=0))
    assert outcome is not None and outcome.compactions == ()


def test_pressure_refuses_while_a_live_lock_is_held() -> None:
    session = long_session(2)
    open_turn(session, 3)
    session.append("compaction/start", {"compactionId": "x", "turn": 3})
    with pytest.raises(CompactionError) as info:
        compact_if_needed(session, summarizer=Fixed(), context_window=10, owner=3)
    assert info.value.code == "BUSY"

"""Tool-result pruner (docs/rules.md#the-tool-result-pruner)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsh._errors import ConfigError
from dsh.compaction._pruner import PRUNE_MARKER, PrunerConfig, prune_content, prune_session
from dsh.compaction._tokens import estimate_event_tokens
from dsh.json import json_equal
from dsh.session._session import Session
from dsh.session._surface import fold_surface
from tests.compaction.builders import long_session, new_session, s5_events, turn


def t(value: str) -> dict[str, str]:
    return {"type": "text", "text": value}


def test_pruner_resolves_detached_immutable_defaults_and_partial_overrides() -> None:
    # docs/rules.md#the-tool-result-pruner "resolves detached immutable defaults and partial
    # overrides": 8192/4096/1024.
    config = PrunerConfig()
    assert (config.threshold_chars, config.head_chars, config.tail_chars) == (8192, 4096, 1024)
    assert PrunerConfig(head_chars=10).tail_chars == 1024
    with pytest.raises(AttributeError):
        config.head_chars = 1  # type: ignore[misc]
    assert len(PRUNE_MARKER) == 39


@pytest.mark.parametrize("kwargs", [
    {"threshold_chars": 0}, {"head_chars": -1}, {"tail_chars": 1.5},
    {"threshold_chars": 100, "head_chars": 40, "tail_chars": 22},  # 40 + 39 + 22 = 101 > 100
])
def test_pruner_rejects_invalid_scalars_and_an_output_budget_above_threshold(
        kwargs: dict[str, object]) -> None:
    # docs/rules.md#the-tool-result-pruner "rejects stale keys, invalid scalars, and an output
    # budget above threshold".
    with pytest.raises(ConfigError):
        PrunerConfig(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        PrunerConfig(stale=1)  # type: ignore[call-arg]


def test_pruner_measures_text_code_points_only_and_skips_content_within_threshold() -> None:
    config = PrunerConfig(threshold_chars=50, head_chars=5, tail_chars=5)
    # 50 code points of astral text (100 UTF-16 units) is still within a 50-char budget.
    assert prune_content([t("😀" * 50), {"type": "image", "data": "x" * 500}], config) is None
    assert prune_content([t("a" * 51)], config) is not None


def test_pruner_keeps_configured_head_and_tail_without_splitting_surrogate_pairs() -> None:
    config = PrunerConfig(threshold_chars=50, head_chars=3, tail_chars=2)
    out = prune_content([t("😀" * 60)], config)
    assert out == [t("😀" * 3 + PRUNE_MARKER + "😀" * 2)]


def test_pruner_preserves_non_text_blocks_and_their_relative_ordering_across_removed_text() -> None:
    config = PrunerConfig(threshold_chars=50, head_chars=4, tail_chars=4)
    image = {"type": "image", "data": "img"}
    blocks = [t("abcdef"), image, t("x" * 40), {"type": "image", "data": "2"}, t("uvwxyz")]
    out = prune_content(blocks, config)
    # Removed range [4, 52 - 4) spans three text blocks; the marker goes in the first one, the
    # fully removed middle block is dropped, images stay where they were.
    assert out == [t("abcd" + PRUNE_MARKER), image, {"type": "image", "data": "2"}, t("wxyz")]


def test_pruner_supports_zero_sized_head_and_tail_while_still_shrinking() -> None:
    config = PrunerConfig(threshold_chars=39, head_chars=0, tail_chars=0)
    assert prune_content([t("a" * 40)], config) == [t(PRUNE_MARKER)]


def _session_with_results(*outputs: str) -> Session:
    session = new_session()
    turn(session, 1, "run things", calls=tuple(
        (f"c{i}", "bash", '{"command":"x"}', out) for i, out in enumerate(outputs)))
    session.append("turn/start", {"turn": 2})
    return session


def test_pruner_prunes_a_stable_snapshot_preserves_all_data_and_cites_the_replaced_result() -> None:
    session = _session_with_results("short", "L" * 200)
    config = PrunerConfig(threshold_chars=100, head_chars=20, tail_chars=10)
    original = next(e for e in session.events if e.type == "tool/result"
                    and e["data"]["message"]["source"]["callId"] == "c1")
    before = session.seq
    result = prune_session(session, config)
    prune, replacement = session.events[before], session.events[before + 1]
    assert prune.type == "compaction/prune"
    assert prune.data == {"shadowedRange": {"start": original.seq, "end": original.seq},
                          "shadowedSeqs": [original.seq],
                          "shadowedTokenCount": estimate_event_tokens(original)}
    assert replacement.surface_op == {"op": "replace", "start": original.seq,
                                      "end": original.seq}
    assert replacement.source_event_seqs == [original.seq]
    inner = replacement.data["message"]["content"][0]["content"]
    assert inner == [t("L" * 20 + PRUNE_MARKER + "L" * 10)]
    blank = {**replacement.data, "message": {**replacement.data["message"], "content": None}}
    assert json_equal(blank, {**original.data,
                              "message": {**original.data["message"], "content": None}})
    assert result.pruned[0].original_seq == original.seq
    assert result.pruned[0].replacement_seq == replacement.seq
    assert (result.pruned[0].call_id, result.pruned[0].chars_before,
            result.pruned[0].chars_after) == ("c1", 200, 69)
    assert result.chars_removed == 131
    assert session.surface.replace_generation == 1


def test_pruner_prunes_multiple_results_skips_short_ones_and_converges_in_one_pass() -> None:
    session = _session_with_results("A" * 300, "tiny", "B" * 500)
    config = PrunerConfig(threshold_chars=100, head_chars=20, tail_chars=10)
    first = prune_session(session, config)
    assert [p.call_id for p in first.pruned] == ["c0", "c2"]
    length = session.seq
    second = prune_session(session, config)
    assert second.pruned == () and second.chars_removed == 0
    assert session.seq == length


def test_pruner_replays_to_the_identical_pruned_model_messages() -> None:
    session = long_session(3)
    prune_session(session, PrunerConfig(threshold_chars=100, head_chars=30, tail_chars=30))
    replayed = Session.create("copy", seed=session.events)
    assert replayed.derive_messages() == session.derive_messages()
    assert list(fold_surface(session.events).nodes) == list(session.surface.nodes)


def test_pruner_result_equals_original_when_called_on_an_empty_surface() -> None:
    assert prune_session(new_session()).pruned == ()


def test_pruner_reproduces_dsh_seqs_278_279_of_s5(dsh_logs: Path) -> None:
    # README (s5-compaction): the real ToolResultPruner ran on seqs 0..277 with thresholdChars
    # 1000, head/tail 300 and wrote seqs 278 (compaction/prune) and 279 (tool/result replace).
    events = s5_events(dsh_logs)
    session = new_session("s5-compaction")
    for event in events[:278]:
        session.append(event.type, event.data, surface_op=event.surface_op,
                       source_event_seqs=event.source_event_seqs)
    result = prune_session(session, PrunerConfig(threshold_chars=1000, head_chars=300,
                                                 tail_chars=300))
    assert session.seq == 280
    for seq in (278, 279):
        ours, theirs = session.events[seq], events[seq]
        assert ours.type == theirs.type
        assert ours.data == theirs.data
        assert ours.surface_op == theirs.surface_op
        assert ours.source_event_seqs == theirs.source_event_seqs
    assert [(p.original_seq, p.replacement_seq, p.call_id) for p in result.pruned] == [
        (170, 279, "call_3_0_c")]
    assert result.pruned[0].chars_before == 3604


def test_s5_fixture_loads_with_dsh_surface(dsh_logs: Path) -> None:
    import json

    events = s5_events(dsh_logs)
    expected = json.loads((dsh_logs / "expected" / "jsonl-unpacked" / "main" /
                           "s5-compaction.json").read_text())
    fold = fold_surface(events)
    assert list(fold.nodes) == expected["surfaceNodes"]
    assert [r.shadowed_seqs for r in fold.replacements] == [
        (2, 40, 42, 67, 72, 101, 103, 132), (170,)]

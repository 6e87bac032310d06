"""Token estimates (docs/rules.md#token-estimates; calibrated on the s5-compaction fixture)."""

from __future__ import annotations

from pathlib import Path

from dsh.compaction._tokens import (
    estimate_block_tokens,
    estimate_event_tokens,
    estimate_message_tokens,
    estimate_system_tokens,
    estimate_tools_tokens,
    measure_surface,
    utf16_length,
)
from tests.compaction.builders import long_session, s5_events


def test_utf16_length_counts_code_units_like_javascript() -> None:
    # docs/formats.md#lossless-json: astral code points are two UTF-16 units; a lone surrogate is
    # one.
    assert utf16_length("abc") == 3
    assert utf16_length("é✓") == 2
    assert utf16_length("😀") == 2
    assert utf16_length("\ud800x") == 2


def test_block_prices_follow_the_heuristic() -> None:
    # docs/rules.md#token-estimates: text = ceil(len/4) + 4; tool-call = ceil(name/4) + ceil(args/4)
    # + 4; tool-result = nested + 4; unknown = 4 + ceil(JSON/4).
    assert estimate_block_tokens({"type": "text", "text": "12345"}) == 2 + 4
    assert estimate_block_tokens({"type": "reasoning", "text": "😀😀"}) == 1 + 4
    assert estimate_block_tokens({"type": "tool-call", "id": "c", "name": "bash",
                                  "arguments": '{"a":1}'}) == 1 + 2 + 4
    nested = {"type": "tool-result", "toolCallId": "c",
              "content": [{"type": "text", "text": "abcd"}], "isError": False}
    assert estimate_block_tokens(nested) == (1 + 4) + 4
    image = {"type": "image", "data": "xx"}  # JSON {"type":"image","data":"xx"} = 28 units
    assert estimate_block_tokens(image) == 4 + 7


def test_message_system_and_tools_prices() -> None:
    assert estimate_message_tokens({"role": "user", "content": []}) == 4
    assert estimate_message_tokens(None) == 0
    assert estimate_system_tokens("a" * 9) == 3 + 4
    assert estimate_system_tokens(None) == 0
    assert estimate_tools_tokens([]) == 0
    assert estimate_tools_tokens([{"name": "x"}]) == 4 + 4  # [{"name":"x"}] = 14 units


def test_token_estimate_matches_dsh_shadowed_token_count_of_s5(dsh_logs: Path) -> None:
    # The logged compaction/summary.shadowedTokenCount (seq 274) is the meter's price of the
    # shadowed nodes; ours must be the same number.
    events = s5_events(dsh_logs)
    summary = events[274]["data"]
    prices = [estimate_event_tokens(events[s]) for s in summary["shadowedSeqs"]]
    assert prices == [23, 63, 30, 38, 17, 55, 40, 46]
    assert sum(prices) == summary["shadowedTokenCount"] == 312


def test_token_estimate_matches_dsh_prune_price_of_s5(dsh_logs: Path) -> None:
    # compaction/prune.shadowedTokenCount (seq 278) prices the original tool result (seq 170),
    # whose text holds non-ASCII check marks (UTF-16 counting matters).
    events = s5_events(dsh_logs)
    assert estimate_event_tokens(events[170]) == events[278]["data"]["shadowedTokenCount"] == 913


def test_dsh_checkpoint_is_smaller_than_what_it_shadows(dsh_logs: Path) -> None:
    events = s5_events(dsh_logs)
    assert estimate_event_tokens(events[275]) == 240 < 312


def test_measure_surface_prices_each_node_in_surface_order() -> None:
    session = long_session(2)
    measurement = measure_surface(session)
    assert measurement.seqs == tuple(session.surface.nodes)
    assert measurement.surface_tokens == sum(
        estimate_event_tokens(session.events[s]) for s in session.surface.nodes)
    assert measurement.envelope_tokens == 0
    assert measurement.total_tokens == measurement.surface_tokens
    assert measurement.replace_generation == 0

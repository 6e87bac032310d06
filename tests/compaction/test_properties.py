"""Properties of compaction and pruning over random sessions (hypothesis).

After any mix of appends, compactions (successful, refused or failing) and prunes:
the derived messages form a valid provider conversation (every tool call answered exactly once,
no orphan result), the transcript keeps every appended message, fold_surface equals the online
surface, no compaction lock is left behind, and every bracket obeys the invariants.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh._errors import CompactionError
from dsh.compaction._brackets import check_compaction_log
from dsh.compaction._pruner import PrunerConfig, prune_session
from dsh.compaction._region import (
    compact_now,
    compact_surface_region,
    inspect_compaction_state,
    session_compaction_state,
)
from dsh.compaction._summarizers import DigestSummarizer
from dsh.session._surface import fold_surface
from tests.compaction.builders import new_session, turn, user

EXAMPLES = int(os.environ.get("DSH_HYPOTHESIS_EXAMPLES", "20"))


class Short:
    provider, model = "test", "short"

    def summarize(self, messages: Sequence[Any], *, previous: str | None = None) -> str:
        return "## Current Work\n- compacted"


class Failing:
    def summarize(self, messages: Sequence[Any], *, previous: str | None = None) -> str:
        raise RuntimeError("summarizer down")


turn_op = st.tuples(st.just("turn"), st.lists(st.integers(1, 400), max_size=3),
                    st.integers(1, 80))
ops = st.lists(st.one_of(
    turn_op,
    st.tuples(st.just("inject"), st.integers(1, 200)),
    st.tuples(st.just("compact"), st.sampled_from(["digest", "short", "failing"]),
              st.integers(0, 400)),
    st.tuples(st.just("explicit"), st.integers(0, 50), st.integers(0, 50)),
    st.tuples(st.just("prune"), st.integers(40, 200)),
), max_size=14)


def assert_valid_conversation(messages: list[Any]) -> None:
    open_calls: set[str] = set()
    answered: set[str] = set()
    for message in messages:
        for block in message["content"]:
            if block["type"] == "tool-call":
                assert block["id"] not in open_calls | answered, "duplicate tool call id"
                open_calls.add(block["id"])
            elif block["type"] == "tool-result":
                call_id = block["toolCallId"]
                assert call_id in open_calls, f"orphan or repeated result for {call_id}"
                open_calls.remove(call_id)
                answered.add(call_id)
    assert open_calls == set(), f"unanswered tool calls {open_calls}"


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(turn_op, min_size=1, max_size=4), ops)
def test_compaction_keeps_conversation_valid_transcript_complete_and_fold_equal(
        prefix: list[tuple[Any, ...]], program: list[tuple[Any, ...]]) -> None:
    session = new_session()
    appended_ids: list[str] = []
    number = 0
    summarizers = {"digest": DigestSummarizer(), "short": Short(), "failing": Failing()}
    for op in [*prefix, *program]:
        before = session.seq
        if op[0] == "turn":
            number += 1
            _, outputs, words = op
            calls = tuple((f"t{number}c{i}", "bash", '{"command":"ls"}', "x" * n)
                          for i, n in enumerate(outputs))
            turn(session, number, "ask " * words, answer="reply " * words, calls=calls)
        elif op[0] == "inject":
            user(session, "ctx " * op[1], kind="plugin")
        elif op[0] == "compact":
            try:
                compact_now(session, summarizer=summarizers[op[1]], retain_tokens=op[2])
            except CompactionError as exc:
                assert exc.code == "SUMMARY"
        elif op[0] == "explicit":
            nodes = list(session.surface.nodes)
            if nodes:
                start, end = nodes[op[1] % len(nodes)], nodes[op[2] % len(nodes)]
                try:
                    compact_surface_region(session, start, end, summarizer=Short())
                except CompactionError as exc:
                    assert exc.code in ("RANGE", "UNBALANCED", "SUMMARY")
        else:
            prune_session(session, PrunerConfig(threshold_chars=op[1] + 39, head_chars=op[1] // 2,
                                                tail_chars=op[1] - op[1] // 2))
        appended_ids.extend(e.data["id"] if e.type == "user/message" else e.data["message"]["id"]
                            for e in session.events[before:]
                            if e.get("surfaceOp") == "append")
        assert_valid_conversation(session.derive_messages())
        assert list(fold_surface(session.events).nodes) == list(session.surface.nodes)
        state = inspect_compaction_state(session.events)
        assert state.active_start is None
        assert session_compaction_state(session) == state  # incremental fold == backward scan
        assert check_compaction_log(session.events) == []
    transcript = session.transcript_events()
    assert [e.data["id"] if e.type == "user/message" else e.data["message"]["id"]
            for e in transcript] == appended_ids

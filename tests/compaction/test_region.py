"""The region transaction.

Rule: docs/rules.md#the-checkpoint-message, docs/rules.md#the-transaction, docs/rules.md#the-lock,
    docs/rules.md#compaction.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

import pytest

from dsh._errors import CompactionError, EventRejectedError
from dsh.compaction._pruner import PrunerConfig, prune_session
from dsh.compaction._region import (
    acompact_surface_region,
    compact_now,
    compact_surface_region,
    inspect_compaction_state,
    session_compaction_state,
)
from dsh.compaction._selection import minimal_checkpoint_tokens, select_compactable_range
from dsh.compaction._summarizers import (
    CHECKPOINT_CLOSE_TAG,
    CHECKPOINT_OPEN_TAG,
    CHECKPOINT_PREAMBLE,
    DigestSummarizer,
    SummaryResult,
)
from dsh.compaction._tokens import estimate_event_tokens, estimate_message_tokens
from dsh.session._session import Session
from dsh.session._surface import fold_surface
from tests.compaction.builders import (
    assistant,
    long_session,
    new_session,
    system,
    tool_result,
    turn,
    user,
)

pytestmark = pytest.mark.no_speedups

SHORT = "## Primary Request and Intent\n- inspect modules\n\n## Current Work\n- done"


class Fixed:
    """A model-independent custom summarizer (docs/rules.md#compaction last region line)."""

    provider = "test"
    model = "fixed"

    def __init__(self, text: str = SHORT, hook: Any = None) -> None:
        self.text = text
        self.hook = hook
        self.calls: list[tuple[list[Any], str | None]] = []

    def summarize(self, messages: Sequence[Any], *, previous: str | None = None) -> str:
        self.calls.append((list(messages), previous))
        if self.hook is not None:
            self.hook()
        return self.text


class Boom:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def summarize(self, messages: Sequence[Any], *, previous: str | None = None) -> str:
        raise self.exc


def span_of(session: Session) -> tuple[int, int]:
    span = select_compactable_range(session, retain_tokens=0)
    assert span is not None
    return span


def types_from(session: Session, seq: int) -> list[str]:
    return [e.type for e in session.events[seq:]]


def test_region_lands_a_framed_replayable_checkpoint_with_exact_source_seqs_and_token_price(
) -> None:
    # docs/rules.md#compaction "lands a framed, replayable checkpoint with exact source seqs and
    # token price".
    session = long_session(3)
    start, end = span_of(session)
    nodes = list(session.surface.nodes)
    shadowed = nodes[:-1]
    price = sum(estimate_event_tokens(session.events[s]) for s in shadowed)
    before = session.seq
    result = compact_surface_region(session, start, end, summarizer=Fixed(),
                                    compaction_id="cid-1")
    assert types_from(session, before) == ["compaction/start", "compaction/summary",
                                           "user/message", "compaction/end"]
    start_ev, summary_ev, replacement, end_ev = session.events[before:]
    assert start_ev.data == {"compactionId": "cid-1", "turn": None}
    assert summary_ev.data == {
        "compactionId": "cid-1", "summary": [{"type": "text", "text": SHORT}],
        "shadowedRange": {"start": start, "end": end}, "shadowedSeqs": shadowed,
        "shadowedTokenCount": price, "provider": "test", "model": "fixed"}
    assert replacement.surface_op == {"op": "replace", "start": start, "end": end}
    assert replacement.source_event_seqs == [start_ev.seq, summary_ev.seq, *shadowed]
    data = replacement.data
    assert data["source"] == {"kind": "plugin", "plugin": "compact", "compactionId": "cid-1"}
    assert data["role"] == "user" and isinstance(data["id"], str)
    assert data["content"] == [
        {"type": "text", "text": f"{CHECKPOINT_PREAMBLE}\n\n{CHECKPOINT_OPEN_TAG}"},
        {"type": "text", "text": SHORT}, {"type": "text", "text": CHECKPOINT_CLOSE_TAG}]
    assert end_ev.data == {"compactionId": "cid-1", "turn": None}
    assert list(session.surface.nodes) == [replacement.seq, nodes[-1]]
    assert session.surface.replace_generation == 1
    assert result.shadowed_seqs == tuple(shadowed)
    assert result.shadowed_token_count == price
    assert result.checkpoint_token_count == estimate_message_tokens(data) < price
    assert (result.start_seq, result.summary_seq, result.replacement_seq, result.end_seq) == (
        before, before + 1, before + 2, before + 3)
    # replayable: the log reloads to the same surface and messages
    replayed = Session.create("again", seed=session.events)
    assert replayed.derive_messages() == session.derive_messages()
    assert list(fold_surface(session.events).nodes) == list(session.surface.nodes)


def test_region_summarizer_input_is_the_shadowed_messages_in_surface_order() -> None:
    session = long_session(2)
    start, end = span_of(session)
    summarizer = Fixed()
    compact_surface_region(session, start, end, summarizer=summarizer)
    messages, previous = summarizer.calls[0]
    expected = [session.derive_event_message(session.events[s])
                for s in list(fold_surface(session.events[:start + 1]).nodes)]
    assert messages[0] == expected[0]
    assert len(messages) == len(session.events[-3]["data"]["shadowedSeqs"])
    assert previous is None


def test_region_rejects_a_replace_over_a_system_head_before_writing_anything() -> None:
    # docs/rules.md#the-system-head: a replace covering a system/message at node 0 must be a
    # system/message.
    session = new_session()
    head = system(session, "You are helpful.")
    turn(session, 1, "hello " * 40, answer="hi " * 40)
    before = session.seq
    with pytest.raises(CompactionError) as info:
        compact_surface_region(session, head.seq, session.surface.nodes[-1], summarizer=Fixed())
    assert info.value.code == "RANGE"
    assert session.seq == before
    # The session's own surface rule agrees: a user/message replace over node 0 is refused.
    with pytest.raises(EventRejectedError):
        session.append("user/message", {"content": [], "source": {"kind": "user"},
                                         "role": "user", "id": "x"},
                       surface_op={"op": "replace", "start": head.seq, "end": head.seq},
                       source_event_seqs=[head.seq])


def test_region_explicit_range_splitting_a_tool_pair_is_refused() -> None:
    session = new_session()
    u = user(session, "go " * 50)
    a = assistant(session, 1, 1, "calling", (("c1", "bash", "{}"),))
    tool_result(session, 1, 1, "c1", "out " * 50)
    with pytest.raises(CompactionError) as info:
        compact_surface_region(session, u.seq, a.seq, summarizer=Fixed())
    assert info.value.code == "UNBALANCED"
    assert session.seq == 3


def test_region_requires_an_open_turn_and_an_idle_compaction_bracket() -> None:
    # docs/rules.md#compaction "requires an open turn and an idle compaction bracket".
    session = long_session(2)
    start, end = span_of(session)
    with pytest.raises(CompactionError) as info:
        compact_surface_region(session, start, end, summarizer=Fixed(), owner=3)
    assert info.value.code == "OWNER"
    session.append("turn/start", {"turn": 3})
    with pytest.raises(CompactionError) as info:
        compact_surface_region(session, start, end, summarizer=Fixed(), owner=4)
    assert info.value.code == "OWNER"
    session.append("compaction/start", {"compactionId": "other", "turn": 3})
    with pytest.raises(CompactionError, match="compaction already in progress") as info:
        compact_surface_region(session, start, end, summarizer=Fixed(), owner=3)
    assert info.value.code == "BUSY"
    session.append("compaction/end", {"compactionId": "other", "turn": 3})
    result = compact_surface_region(session, start, end, summarizer=Fixed(), owner=3)
    assert session.events[result.start_seq].data["turn"] == 3
    assert session.events[result.end_seq].data == {"compactionId": result.compaction_id,
                                                    "turn": 3}


def test_region_rejects_a_session_with_no_turn_boundary_at_all_for_automatic_compaction() -> None:
    session = new_session()
    u = user(session, "hello " * 40)
    user(session, "again")
    with pytest.raises(CompactionError) as info:
        compact_surface_region(session, u.seq, u.seq, summarizer=Fixed("x"), owner=1)
    assert info.value.code == "OWNER"
    assert session.seq == 2


def test_region_refuses_an_open_turn_in_the_log_for_manual_compaction() -> None:
    # docs/rules.md#compaction manual "refuses an open turn in the log" -> busy.
    session = long_session(2)
    session.append("turn/start", {"turn": 3})
    start, end = span_of(session)
    before = session.seq
    with pytest.raises(CompactionError) as info:
        compact_surface_region(session, start, end, summarizer=Fixed())
    assert info.value.code == "BUSY"
    with pytest.raises(CompactionError) as info:
        compact_now(session, summarizer=Fixed())
    assert info.value.code == "BUSY"
    assert session.seq == before


def test_region_reports_a_live_unmatched_bracket_as_busy_without_summarizing() -> None:
    session = long_session(2)
    session.append("compaction/start", {"compactionId": "open", "turn": None})
    summarizer = Fixed()
    start, end = span_of(session)
    with pytest.raises(CompactionError) as info:
        compact_surface_region(session, start, end, summarizer=summarizer)
    assert info.value.code == "BUSY"
    assert summarizer.calls == []


def test_region_ignores_an_unmatched_bracket_inherited_before_a_later_end_seed_marker() -> None:
    # docs/rules.md#compaction "ignores an unmatched bracket inherited before a later end-seed
    # marker", and the same after an end-seed written by a resume is allowed.
    session = long_session(2)
    session.append("compaction/start", {"compactionId": "orphan", "turn": None})
    resumed = Session.restore(session.id, session.events, session.header)
    assert resumed.events[-1].type == "session/end-seed"
    state = inspect_compaction_state(resumed.events)
    assert state.unmatched_start is not None and state.active_start is None
    start, end = span_of(resumed)
    result = compact_surface_region(resumed, start, end, summarizer=Fixed())
    assert resumed.events[result.end_seq].type == "compaction/end"


def test_region_scans_a_stale_orphan_independently_of_later_repaired_turn_state() -> None:
    session = long_session(1)
    session.append("turn/start", {"turn": 2})
    session.append("compaction/start", {"compactionId": "orphan", "turn": 2})
    # crash repair closes the turn after the orphan, then the end-seed marks the new lifecycle
    session.append("turn/end", {"turn": 2, "reason": {"kind": "interrupted"}})
    resumed = Session.restore(session.id, session.events, session.header)
    state = inspect_compaction_state(resumed.events)
    assert state.open_turn is None and state.active_start is None
    assert compact_now(resumed, summarizer=Fixed()) is not None


def test_region_second_compaction_while_one_is_open_is_busy() -> None:
    session = long_session(3)
    start, end = span_of(session)
    errors: list[CompactionError] = []

    def nested() -> None:
        with pytest.raises(CompactionError) as info:
            compact_surface_region(session, start, end, summarizer=Fixed())
        errors.append(info.value)

    compact_surface_region(session, start, end, summarizer=Fixed(hook=nested))
    assert [e.code for e in errors] == ["BUSY"]


@pytest.mark.parametrize("exc", [RuntimeError("model down"), ValueError()])
def test_region_records_summarizer_failures_without_mutating_the_surface(
        exc: Exception) -> None:
    # docs/rules.md#compaction "records summarizer failures without mutating the surface" and
    # "stringifies non-Error failures in the durable end bracket" (the error is always a string).
    session = long_session(2)
    nodes, generation = list(session.surface.nodes), session.surface.replace_generation
    messages = session.derive_messages()
    start, end = span_of(session)
    before = session.seq
    with pytest.raises(CompactionError) as info:
        compact_surface_region(session, start, end, summarizer=Boom(exc), compaction_id="c")
    assert info.value.code == "SUMMARY"
    assert info.value.__cause__ is exc
    assert types_from(session, before) == ["compaction/start", "compaction/end"]
    end_data = session.events[-1].data
    assert end_data["compactionId"] == "c" and end_data["turn"] is None
    expected = "ValueError" if str(exc) == "" else "RuntimeError: model down"
    assert end_data["error"] == expected
    assert list(session.surface.nodes) == nodes
    assert session.surface.replace_generation == generation
    assert session.derive_messages() == messages
    # the session stays usable and a later compaction succeeds
    user(session, "still here")
    assert compact_now(session, summarizer=Fixed()) is not None


def test_region_rejects_a_non_shrinking_framed_summary() -> None:
    # docs/rules.md#compaction "rejects a non-shrinking framed summary under the conversation
    # meter". The span (800 chars: 200 + 4 + 4 = 208 tokens) passes the size pre-check; the summary
    # does not shrink it, which is only known after the lock.
    session = new_session()
    u = user(session, "q" * 800)
    user(session, "tail")
    with pytest.raises(CompactionError, match="summary is not smaller") as info:
        compact_surface_region(session, u.seq, u.seq, summarizer=Fixed("s" * 800))
    assert info.value.code == "SUMMARY"
    assert types_from(session, 2) == ["compaction/start", "compaction/end"]
    assert "not smaller" in session.events[-1].data["error"]


def test_region_refuses_a_span_too_small_for_any_checkpoint_before_the_lock() -> None:
    # docs/rules.md#the-transaction checked early: the minimal checkpoint (framing + a one-character
    # summary) costs 104 tokens; a 60-token span can never be undercut, so nothing is written.
    assert minimal_checkpoint_tokens() == 104
    session = new_session()
    u = user(session, "q" * 208)  # 52 + 4 block + 4 message = 60 tokens
    user(session, "tail")
    summarizer = Fixed("x")
    with pytest.raises(CompactionError) as info:
        compact_surface_region(session, u.seq, u.seq, summarizer=summarizer)
    assert info.value.code == "SUMMARY"
    assert info.value.message == (
        f"compaction span [{u.seq}, {u.seq}] is too small to be worth compacting: its 1 surface "
        "node holds ~60 tokens, but a checkpoint (framing plus a minimal summary) costs ~104, so "
        "the span needs more than 104 tokens; nothing was written")
    assert session.seq == 2
    assert summarizer.calls == []
    with pytest.raises(CompactionError) as again:
        compact_now(session, summarizer=summarizer)
    assert again.value.code == "SUMMARY"
    assert session.seq == 2


def test_region_size_precheck_boundary_is_strictly_larger() -> None:
    # A span priced exactly at the minimal checkpoint is refused; one token more passes the
    # pre-check (and the summarizer output then decides).
    needed = minimal_checkpoint_tokens()
    session = new_session()
    exact = user(session, "q" * ((needed - 8) * 4))
    user(session, "tail")
    assert estimate_event_tokens(exact) == needed
    with pytest.raises(CompactionError, match="too small to be worth compacting"):
        compact_surface_region(session, exact.seq, exact.seq, summarizer=Fixed("x"))
    bigger = new_session()
    above = user(bigger, "q" * ((needed - 7) * 4))
    user(bigger, "tail")
    result = compact_surface_region(bigger, above.seq, above.seq, summarizer=Fixed("x"))
    assert result.shadowed_token_count == needed + 1
    assert result.checkpoint_token_count == needed


def test_region_tolerates_concurrent_log_only_appends_while_the_selected_surface_is_stable(
) -> None:
    session = long_session(2)
    session.append("turn/start", {"turn": 3})
    start, end = span_of(session)
    hook = lambda: session.append("todo/write", {"todos": []})  # noqa: E731
    result = compact_surface_region(session, start, end, summarizer=Fixed(hook=hook), owner=3)
    assert session.events[result.start_seq + 1].type == "todo/write"


def test_region_rejects_concurrent_surface_appends_before_committing_the_replacement() -> None:
    # whole-surface stability (automatic): any surface change aborts with "changed".
    session = long_session(2)
    session.append("turn/start", {"turn": 3})
    start, end = span_of(session)
    hook = lambda: user(session, "late message")  # noqa: E731
    before = session.seq
    with pytest.raises(CompactionError) as info:
        compact_surface_region(session, start, end, summarizer=Fixed(hook=hook), owner=3)
    assert info.value.code == "CHANGED"
    assert types_from(session, before) == ["compaction/start", "user/message",
                                           "compaction/end"]


def test_region_manual_tolerates_appends_outside_the_selected_span() -> None:
    # selected-span stability (manual): idle injected context lands and stays visible.
    session = long_session(2)
    start, end = span_of(session)
    injected: list[Any] = []
    hook = lambda: injected.append(user(session, "injected", kind="plugin"))  # noqa: E731
    result = compact_surface_region(session, start, end, summarizer=Fixed(hook=hook))
    assert injected[0].seq in session.surface.nodes
    assert session.surface.nodes[0] == result.replacement_seq


def test_region_rejects_a_selected_span_whose_middle_node_was_replaced_during_summarization(
) -> None:
    # docs/rules.md#compaction manual "rejects a selected span whose middle node was replaced ..."
    # -> changed.
    session = long_session(2)
    start, end = span_of(session)
    hook = lambda: prune_session(session, PrunerConfig(threshold_chars=100, head_chars=10,  # noqa: E731
                                                       tail_chars=10))
    with pytest.raises(CompactionError) as info:
        compact_surface_region(session, start, end, summarizer=Fixed(hook=hook))
    assert info.value.code == "CHANGED"
    assert session.events[-1].type == "compaction/end"
    assert "changed" in session.events[-1].data["error"]


def test_region_classifies_a_failing_compaction_end_as_commit_failure_and_leaves_one_orphan(
) -> None:
    session = long_session(2)
    start, end = span_of(session)

    def veto(_session: Any, event: Any) -> None:
        if event.type == "compaction/end":
            raise RuntimeError("disk gone")

    session.add_validator(veto)
    flushed: list[int] = []
    before = session.seq
    with pytest.raises(CompactionError) as info:
        compact_surface_region(session, start, end, summarizer=Fixed(),
                               flush=lambda: flushed.append(1))
    assert info.value.code == "COMMIT"
    # the success close failed: no second attempt, the start stays unmatched, no flush
    assert types_from(session, before) == ["compaction/start", "compaction/summary",
                                           "user/message"]
    assert inspect_compaction_state(session.events).active_start is not None
    assert flushed == []


def test_region_keeps_a_failed_error_close_as_the_commit_failure_and_does_not_flush() -> None:
    session = long_session(2)
    start, end = span_of(session)
    session.add_validator(lambda _s, e: (_ for _ in ()).throw(RuntimeError("no"))
                          if e.type == "compaction/end" else None)
    flushed: list[int] = []
    with pytest.raises(CompactionError) as info:
        compact_surface_region(session, start, end, summarizer=Boom(RuntimeError("x")),
                               flush=lambda: flushed.append(1))
    assert info.value.code == "COMMIT"
    assert session.events[-1].type == "compaction/start"
    assert flushed == []


def test_region_classifies_a_commit_body_failure_and_records_one_error_close() -> None:
    session = long_session(2)
    start, end = span_of(session)
    session.add_validator(lambda _s, e: (_ for _ in ()).throw(RuntimeError("veto"))
                          if e.type == "compaction/summary" else None)
    before = session.seq
    with pytest.raises(CompactionError) as info:
        compact_surface_region(session, start, end, summarizer=Fixed())
    assert info.value.code == "COMMIT"
    assert types_from(session, before) == ["compaction/start", "compaction/end"]
    assert "veto" in session.events[-1].data["error"]


def test_region_keeps_a_commit_failure_when_the_durability_checkpoint_also_fails() -> None:
    session = long_session(2)
    start, end = span_of(session)
    session.add_validator(lambda _s, e: (_ for _ in ()).throw(RuntimeError("veto"))
                          if e.type == "compaction/summary" else None)

    def bad_flush() -> None:
        raise OSError("fsync failed")

    with pytest.raises(CompactionError) as info:
        compact_surface_region(session, start, end, summarizer=Fixed(), flush=bad_flush)
    assert info.value.code == "COMMIT"
    assert any("fsync failed" in note for note in info.value.__notes__)


def test_region_classifies_a_durability_failure_after_the_standalone_bracket_committed() -> None:
    session = long_session(2)
    start, end = span_of(session)

    def bad_flush() -> None:
        raise OSError("fsync failed")

    with pytest.raises(CompactionError) as info:
        compact_surface_region(session, start, end, summarizer=Fixed(), flush=bad_flush)
    assert info.value.code == "PERSISTENCE"
    assert session.events[-1].type == "compaction/end"
    assert "error" not in session.events[-1].data


def test_region_commits_a_standalone_bracket_without_consuming_a_turn_number_and_flushes(
) -> None:
    session = long_session(2)
    flushed: list[int] = []
    result = compact_now(session, summarizer=Fixed(), flush=lambda: flushed.append(session.seq))
    assert result is not None
    assert flushed == [result.end_seq + 1]
    assert session.events[result.start_seq].data["turn"] is None
    assert not any(e.type == "turn/start" for e in session.events[result.start_seq:])


def test_region_compacts_a_session_with_no_durable_turn_boundary_without_creating_one() -> None:
    session = new_session()
    for i in range(4):
        user(session, f"message {i} " * 30)
    result = compact_now(session, summarizer=Fixed())
    assert result is not None and result.shadowed_seqs == (0, 1, 2)
    assert not any(e.type.startswith("turn/") for e in session.events)


def test_region_returns_none_without_writing_a_bracket_for_history_that_cannot_be_compacted(
) -> None:
    session = new_session()
    user(session, "only one node")
    assert compact_now(session, summarizer=Fixed()) is None
    assert session.seq == 1


def test_region_lets_a_pre_aborted_signal_win_before_reservation() -> None:
    import threading

    session = long_session(2)
    signal = threading.Event()
    signal.set()
    summarizer = Fixed()
    start, end = span_of(session)
    for call in (lambda: compact_now(session, summarizer=summarizer, signal=signal),
                 lambda: compact_surface_region(session, start, end, summarizer=summarizer,
                                                signal=signal)):
        with pytest.raises(CompactionError) as info:
            call()
        assert info.value.code == "CANCELLED"
    assert session.seq == len(long_session(2).events)
    assert summarizer.calls == []


def test_region_aborts_before_committing_when_cancellation_lands_after_summarization() -> None:
    import threading

    session = long_session(2)
    signal = threading.Event()
    before = session.seq
    with pytest.raises(CompactionError) as info:
        compact_now(session, summarizer=Fixed(hook=signal.set), signal=signal)
    assert info.value.code == "CANCELLED"
    assert types_from(session, before) == ["compaction/start", "compaction/end"]
    assert "cancelled" in session.events[-1].data["error"]


def test_region_preserves_raw_output_and_usage_in_the_summary_event() -> None:
    class Rich:
        def summarize(self, messages: Sequence[Any], *, previous: str | None = None
                      ) -> SummaryResult:
            return SummaryResult(summary=(SHORT,), provider="deepseek", model="v4",
                                 raw_output=[{"type": "reasoning", "text": "hm"},
                                             {"type": "text", "text": SHORT}],
                                 llm_stream_call=True, max_tokens=8192,
                                 usage={"inputTokens": 10, "outputTokens": 5})

    session = long_session(2)
    result = compact_now(session, summarizer=Rich(), source_command_id="cmd-7")
    assert result is not None and result.source_command_id == "cmd-7"
    data = session.events[result.summary_seq].data
    assert list(data) == ["compactionId", "sourceCommandId", "summary", "rawOutput",
                          "llmStreamCall", "shadowedRange", "shadowedSeqs",
                          "shadowedTokenCount", "provider", "model", "maxTokens", "usage"]
    assert data["rawOutput"][0] == {"type": "reasoning", "text": "hm"}
    assert data["usage"] == {"inputTokens": 10, "outputTokens": 5}
    assert session.events[result.replacement_seq].data["source"]["sourceCommandId"] == "cmd-7"
    assert session.events[result.end_seq].data["sourceCommandId"] == "cmd-7"


def test_region_makes_duration_derivable_from_the_opening_and_closing_marker_times() -> None:
    ticks = itertools.count(1000, 7)
    session = Session.create("timed", clock=lambda: next(ticks))
    for i in range(3):
        user(session, f"message {i} " * 30)
    result = compact_now(session, summarizer=Fixed())
    assert result is not None
    duration = (session.events[result.end_seq].time - session.events[result.start_seq].time)
    assert duration == 21


def test_region_merges_a_previous_checkpoint_at_the_head() -> None:
    session = long_session(3)
    first = compact_now(session, summarizer=Fixed(), retain_tokens=300)
    assert first is not None
    turn(session, 4, "request number 4 " * 10, answer="answer four " * 10)
    summarizer = Fixed()
    second = compact_now(session, summarizer=summarizer)
    assert second is not None
    messages, previous = summarizer.calls[0]
    assert second.shadowed_seqs[0] == first.replacement_seq
    assert previous == first.summary[0]
    assert messages[0] == session.events[first.replacement_seq].data


# --- async twin ----------------------------------------------------------------------------


def test_async_region_commits_like_the_sync_one() -> None:
    session = long_session(2)
    start, end = span_of(session)

    async def main() -> Any:
        flushed: list[int] = []

        async def flush() -> None:
            flushed.append(1)

        result = await acompact_surface_region(session, start, end,
                                               summarizer=DigestSummarizer(), flush=flush)
        return result, flushed

    result, flushed = asyncio.run(main())
    assert flushed == [1]
    assert session.events[result.end_seq].type == "compaction/end"


def test_async_region_runs_a_sync_summarizer_in_a_thread() -> None:
    session = long_session(2)
    start, end = span_of(session)
    result = asyncio.run(acompact_surface_region(session, start, end, summarizer=Fixed()))
    assert result.summary == (SHORT,)


def test_async_region_cancelled_task_writes_one_error_close_and_reraises() -> None:
    session = long_session(2)
    start, end = span_of(session)
    nodes = list(session.surface.nodes)
    before = session.seq

    class Slow:
        async def asummarize(self, messages: Sequence[Any], *, previous: str | None = None
                             ) -> str:
            await asyncio.sleep(3600)
            return SHORT

    async def main() -> None:
        task = asyncio.create_task(acompact_surface_region(session, start, end,
                                                           summarizer=Slow()))
        while session.seq == before:
            await asyncio.sleep(0)
        assert session.events[-1].type == "compaction/start"  # the lock landed first
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert types_from(session, before) == ["compaction/start", "compaction/end"]
    assert "cancelled" in session.events[-1].data["error"]
    assert list(session.surface.nodes) == nodes
    assert compact_now(session, summarizer=Fixed()) is not None


def test_async_region_summarizer_raising_cancelled_error_is_code_cancelled() -> None:
    session = long_session(2)
    start, end = span_of(session)

    class Gives:
        async def asummarize(self, messages: Sequence[Any], *, previous: str | None = None
                             ) -> str:
            raise asyncio.CancelledError("provider stream cancelled")

    with pytest.raises(CompactionError) as info:
        asyncio.run(acompact_surface_region(session, start, end, summarizer=Gives()))
    assert info.value.code == "CANCELLED"
    assert session.events[-1].type == "compaction/end"
    assert [e.type for e in session.events].count("compaction/end") == 1


def test_async_region_excludes_a_concurrent_compaction_of_one_session() -> None:
    # docs/rules.md#compaction "excludes concurrent automatic and manual compaction of one session".
    session = long_session(3)
    start, end = span_of(session)
    gate = asyncio.Event

    async def main() -> str:
        release = gate()

        class Waits:
            async def asummarize(self, messages: Sequence[Any], *,
                                 previous: str | None = None) -> str:
                await release.wait()
                return SHORT

        first = asyncio.create_task(acompact_surface_region(session, start, end,
                                                            summarizer=Waits()))
        await asyncio.sleep(0)
        with pytest.raises(CompactionError) as info:
            await acompact_surface_region(session, start, end, summarizer=Waits())
        release.set()
        await first
        return info.value.code

    assert asyncio.run(main()) == "BUSY"
    assert [e.type for e in session.events].count("compaction/start") == 1


def test_session_compaction_state_folds_appends_like_the_backward_scan() -> None:
    session = long_session(1)
    session_compaction_state(session)  # cache the prefix
    steps = [("turn/start", {"turn": 2}), ("compaction/start", {"compactionId": "a", "turn": 2}),
             ("compaction/end", {"compactionId": "a", "turn": 2}),
             ("turn/end", {"turn": 2, "reason": {"kind": "completed"}}),
             ("compaction/start", {"compactionId": "b", "turn": None})]
    for kind, data in steps:
        session.append(kind, data)
        assert session_compaction_state(session) == inspect_compaction_state(session.events)
    resumed = Session.restore(session.id, session.events, session.header)
    state = session_compaction_state(resumed)
    assert state.unmatched_start is not None and state.active_start is None
    assert state.latest_end_seed_seq == resumed.seq - 1


def test_region_reproduces_the_s5_compaction_bracket(dsh_logs: Any) -> None:
    # README s5-compaction: dsh compacted surface [2, 132] between turns 4 and 5 (seqs 273-276).
    # Replaying seqs 0..272 and compacting the same span with the same summary must give the
    # same events except the random ids and the wording of the preamble (ours is our own).
    from tests.compaction.builders import s5_events

    events = s5_events(dsh_logs)
    session = new_session("s5-compaction")
    for event in events[:273]:
        session.append(event.type, event.data, surface_op=event.surface_op,
                       source_event_seqs=event.source_event_seqs)
    theirs = events[274].data

    class Replay:
        def summarize(self, messages: Sequence[Any], *, previous: str | None = None
                      ) -> SummaryResult:
            assert [m["id"] for m in messages] == [
                session.derive_event_message(events[s])["id"] for s in theirs["shadowedSeqs"]]
            return SummaryResult(summary=(theirs["summary"][0]["text"],),
                                 provider=theirs["provider"], model=theirs["model"],
                                 raw_output=theirs["rawOutput"],
                                 max_tokens=theirs["maxTokens"], usage=theirs["usage"])

    result = compact_surface_region(session, 2, 132, summarizer=Replay(),
                                    compaction_id=theirs["compactionId"])
    assert (result.start_seq, result.summary_seq, result.replacement_seq, result.end_seq) == (
        273, 274, 275, 276)
    for seq in (273, 274, 276):
        assert session.events[seq].data == events[seq].data
        assert list(session.events[seq].data) == list(events[seq].data)  # key order too
    ours, dsh = session.events[275], events[275]
    assert ours.surface_op == dsh.surface_op == {"op": "replace", "start": 2, "end": 132}
    assert ours.source_event_seqs == dsh.source_event_seqs
    assert ours.data["source"] == dsh.data["source"]
    assert list(ours.data) == list(dsh.data)
    assert ours.data["content"][1:] == dsh.data["content"][1:]
    assert ours.data["content"][0]["text"].endswith("\n\n<compacted-summary>")
    assert list(session.surface.nodes) == [275, 137, 168, 170, 172, 210, 215, 247, 249, 270]


def test_async_compact_now_selects_and_commits_with_an_llm_summarizer() -> None:
    from dsh.compaction._region import acompact_now
    from dsh.compaction._summarizers import COMPACTION_INSTRUCTION, LlmSummarizer

    seen: list[list[Any]] = []

    async def acomplete(messages: list[Any]) -> str:
        seen.append(messages)
        return SHORT

    session = long_session(3)
    summarizer = LlmSummarizer(complete=lambda m: "unused", acomplete=acomplete,
                               provider="deepseek", model="v4")
    result = asyncio.run(acompact_now(session, summarizer=summarizer))
    assert result is not None
    assert seen[0][-1]["content"][0]["text"] == COMPACTION_INSTRUCTION
    assert len(seen[0]) == len(result.shadowed_seqs) + 1
    data = session.events[result.summary_seq].data
    assert (data["provider"], data["model"], data["maxTokens"]) == ("deepseek", "v4", 8192)
    assert data["rawOutput"] == [{"type": "text", "text": SHORT}]
    assert asyncio.run(acompact_now(new_session(), summarizer=summarizer)) is None

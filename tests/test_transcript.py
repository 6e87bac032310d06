"""The transcript model (dsh.transcript): what a person reads, built from real logs, by page."""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import dsh
from dsh import transcript as tr
from dsh.persistence import Persistence, open_backend
from dsh.testing import LogBuilder, assistant, tool_result, user

LOGS = Path(__file__).resolve().parent / "fixtures" / "dsh-logs"

pytestmark = pytest.mark.no_speedups


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("logs")
    shutil.copytree(LOGS / "jsonl", root / "jsonl")
    yield root


def _read(root: Path, store: str, session_id: str) -> dsh.persistence.Inspection:
    with Persistence(open_backend(f"jsonl:{root / 'jsonl' / store}")) as persistence:
        return persistence.read(session_id)


def test_transcript_shows_a_compaction_checkpoint_with_the_span_it_shadows(stores: Path) -> None:
    events = _read(stores, "main", "s5-compaction").stored_events
    page = tr.build(events)
    checkpoints = [e for e in page.entries if isinstance(e, tr.Checkpoint)]
    assert len(checkpoints) >= 1
    checkpoint = checkpoints[0]
    assert checkpoint.summary
    assert checkpoint.shadowed_seqs
    assert events[checkpoint.compaction_start_seq]["type"] == "compaction/start"
    assert events[checkpoint.summary_seq]["type"] == "compaction/summary"
    start, end = checkpoint.replaces
    assert checkpoint.shadowed_seqs[0] == start and checkpoint.shadowed_seqs[-1] == end
    shadowed = tr.entries_at(events, checkpoint.shadowed_seqs)
    assert [e.seq for e in shadowed] == list(checkpoint.shadowed_seqs)
    assert all(isinstance(e, tr.Message | tr.ToolResult) for e in shadowed)


def test_transcript_marks_the_crash_repair_of_a_tool_that_may_have_run(stores: Path) -> None:
    read = _read(stores, "crash-before-resume", "s2a-crash-after-tool-call")
    assert read.closers  # the repair the next resume writes, in memory only
    page = tr.build(read.events)
    repaired = [e for e in page.entries if isinstance(e, tr.ToolResult) and e.repair]
    assert [(e.repair, e.error_code, e.is_error) for e in repaired] == [
        ("TOOL_OUTCOME_UNKNOWN", "TOOL_OUTCOME_UNKNOWN", True)]
    ends = [e for e in page.entries if isinstance(e, tr.TurnEnd)]
    assert (ends[-1].reason, ends[-1].repaired) == ("interrupted", True)
    assert repaired[0].tool_name is not None and repaired[0].call_seq is not None
    # without the closers the log ends inside the turn: the last entry says so
    stored = tr.build(read.stored_events)
    assert isinstance(stored.entries[-1], tr.OpenTurn)
    assert stored.entries[-1].seq == len(read.stored_events) - 1


def test_transcript_marks_a_call_that_never_started(stores: Path) -> None:
    read = _read(stores, "crash-before-resume", "s2b-crash-before-tool-call")
    codes = [e.repair for e in tr.build(read.events).entries if isinstance(e, tr.ToolResult)
             and e.repair]
    assert codes and set(codes) == {"TOOL_NOT_STARTED"}


def test_transcript_of_a_fork_shows_the_cut(stores: Path) -> None:
    read = _read(stores, "main", "s4-fork-of-s1")
    # dsh 0.1 ends a fork's seed with a plain end-seed: the header's seedLength names the cut
    entries = tr.build(read.stored_events, header=read.header).entries
    cuts = [e for e in entries if isinstance(e, tr.ForkCut)]
    assert [(c.seq, c.inherited_events) for c in cuts] == [(read.header["seedLength"],) * 2]
    assert not any(isinstance(e, tr.ForkCut) for e in tr.build(read.stored_events).entries)


def test_tool_calls_are_paired_with_their_results(stores: Path) -> None:
    events = _read(stores, "main", "s1-normal").stored_events
    entries = tr.build(events).entries
    calls = [b for e in entries if isinstance(e, tr.Message) for b in e.blocks
             if isinstance(b, tr.ToolCallBlock)]
    results = {e.seq: e for e in entries if isinstance(e, tr.ToolResult)}
    assert calls and len(calls) == len(results)
    for call in calls:
        assert call.result_seq in results
        answer = results[call.result_seq]
        assert (answer.call_id, answer.tool_name) == (call.id, call.name)
        assert events[answer.call_seq]["type"] == "tool/call"


@pytest.mark.parametrize("session_id", ["s1-normal", "s4-fork-of-s1", "s5-compaction"])
@pytest.mark.parametrize("page_events", [1, 7, 50, 256])
def test_pages_put_together_equal_the_whole_transcript(stores: Path, session_id: str,
                                                       page_events: int) -> None:
    events = _read(stores, "main", session_id).stored_events
    header = _read(stores, "main", session_id).header
    whole = tr.build(events, header=header).entries
    paged = [entry for page in tr.iter_pages(events, page_events=page_events, header=header)
             for entry in page.entries]
    assert paged == list(whole)


def test_a_page_reads_only_its_window(stores: Path) -> None:
    events = _read(stores, "main", "s5-compaction").stored_events

    class Counting(list[object]):
        read: set[int] = set()  # noqa: RUF012

        def __getitem__(self, index):  # type: ignore[no-untyped-def]
            got = super().__getitem__(index)
            if isinstance(index, slice):
                self.read.update(range(*index.indices(len(self))))
            else:
                self.read.add(index)
            return got

    log = Counting(events)
    page = tr.build(log, start=200, stop=220, lookback=30, lookahead=10)  # type: ignore[arg-type]
    assert min(log.read) >= 170 and max(log.read) < 230
    assert [e.seq for e in page.entries] == sorted(e.seq for e in page.entries)
    assert all(200 <= e.seq < 220 for e in page.entries)


def test_the_fold_fed_event_by_event_gives_the_entries_of_a_whole_build(stores: Path) -> None:
    events = _read(stores, "main", "s5-compaction").stored_events
    fold = tr.TranscriptFold()
    fed = [entry for event in events for entry in fold.feed([event])]
    whole = tr.build(events).entries

    def unlinked(entry: tr.Entry) -> tr.Entry:
        # a fold cannot know a call's result before it comes: build links it, the fold does not
        if isinstance(entry, tr.Message):
            import dataclasses
            blocks = tuple(dataclasses.replace(b, result_seq=None)
                           if isinstance(b, tr.ToolCallBlock) else b for b in entry.blocks)
            return dataclasses.replace(entry, blocks=blocks)
        return entry

    assert fed == [unlinked(e) for e in whole]


def test_model_request_is_what_a_session_holding_that_prefix_derives(stores: Path) -> None:
    events = _read(stores, "main", "s5-compaction").stored_events
    answers = [e for e in tr.build(events).entries
               if isinstance(e, tr.Message) and e.role == "assistant"]
    assert answers
    for answer in answers[::3]:
        assert answer.request_seq is not None
        request = tr.model_request(events, answer.request_seq)
        live = dsh.Session.create("s", seed=events[:answer.request_seq + 1],
                                  header={"version": 0, "id": "s", "createdAt": 0})
        assert [m for _, m in request.messages] == live.derive_messages()
        assert request.header == live.request_header()
        assert [seq for seq, _ in request.messages] == [
            s for s in live.surface.nodes if dsh.derive_event_message(events[s]) is not None]
    with pytest.raises(IndexError):
        tr.model_request(events, len(events))


def test_retries_steering_headers_and_ignorable_events_are_entries() -> None:
    log = LogBuilder("s")
    log.add("agent/inbox/spliced", {"target": "next-turn", "start": 0, "inserted": [
        user("first prompt", "q1")]}, ignorable=True)
    log.add("turn/start", {"turn": 1})
    log.add("step/start", {"turn": 1, "step": 1})
    log.add("user/message", user("first prompt", "u1"), surface_op="append")
    log.add("request/header", {"reason": "initial", "header": {
        "config": {"provider": "deepseek", "model": "deepseek-chat"},
        "tools": [{"name": "bash", "description": "run", "parameters": {}}]}})
    log.add("llm/retry", {"turn": 1, "step": 1, "attempt": 1, "delayMs": 500,
                          "cause": "retryable", "failure": {"message": "overloaded",
                                                            "code": "RATE_LIMIT"}},
            ignorable=True)
    log.add("agent/inbox/spliced", {"target": "next-step", "start": 0, "inserted": [
        user("use ls instead", "q2")]}, ignorable=True)
    log.add("myapp/note", {"x": 1}, ignorable=True)
    log.add("assistant/message", {**assistant(1, 1, "ok", "a1", [("c1", "bash")]),
                                  "usage": {"inputTokens": 10, "outputTokens": 3}},
            surface_op="append")
    log.add("tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "bash",
                          "arguments": "{}"})
    log.add("tool/result", {**tool_result(1, 1, "c1", "cancelled"),
                            "error": {"name": "bash", "code": "ABORTED_BEFORE_DISPATCH"}},
            surface_op="append", source_event_seqs=[9])
    log.add("step/end", {"turn": 1, "step": 1})
    log.add("turn/end", {"turn": 1, "reason": {"kind": "aborted", "reason": {"kind": "user"}}})
    entries = tr.build(log.events).entries
    kinds = [e.kind for e in entries]
    assert kinds == ["inbox", "turn", "step", "message", "request-header", "retry", "inbox",
                     "event", "message", "tool-result", "turn-end"]
    inbox, steer = (e for e in entries if isinstance(e, tr.InboxChange))
    assert (inbox.steering, steer.steering, steer.inserted) == (False, True, ("use ls instead",))
    header = next(e for e in entries if isinstance(e, tr.HeaderChange))
    assert (header.model, header.tools) == ("deepseek-chat", ("bash",))
    retry = next(e for e in entries if isinstance(e, tr.Retry))
    assert (retry.attempt, retry.delay_ms, retry.code) == (1, 500, "RATE_LIMIT")
    note = next(e for e in entries if isinstance(e, tr.LogEvent))
    assert (note.type, note.ignorable, note.known) == ("myapp/note", True, False)
    result = next(e for e in entries if isinstance(e, tr.ToolResult))
    assert (result.error_code, result.repair, result.tool_name) == (
        "ABORTED_BEFORE_DISPATCH", None, "bash")
    end = entries[-1]
    assert isinstance(end, tr.TurnEnd)
    assert (end.reason, end.cause, end.repaired, dict(end.usage or {})) == (
        "aborted", "user", False, {"inputTokens": 10, "outputTokens": 3})
    answer = next(e for e in entries if isinstance(e, tr.Message) and e.role == "assistant")
    assert (answer.turn, answer.step, answer.request_seq) == (1, 1, 7)
    (turn_none, turn_one) = tr.group_turns(entries)
    assert turn_none.turn is None and [e.kind for e in turn_none.entries] == ["inbox"]
    assert turn_one.turn == 1 and turn_one.end is end and turn_one.entries == tuple(entries[1:])


def test_printable_shows_controls_and_bidi_overrides_as_escapes() -> None:
    text = "ok\tline\n\x1b[31mred\x07 \u202eevil\u2066 \x9b"
    assert tr.printable(text) == "ok\tline\n\\x1b[31mred\\x07 \\u202eevil\\u2066 \\x9b"
    assert tr.printable("<b>plain</b>") == "<b>plain</b>"


def test_turn_end_carries_the_cost_the_log_records() -> None:
    # importers keep a source's cost in an ignorable record (openai-chat: {..., "cost": 0.02})
    log = LogBuilder("s")
    log.add("import/openai-chat/request", {"cost": 0.023172, "kwargs": {}}, ignorable=True)
    log.completed_turn("one")
    log.add("import/claude-code/assistant", {"costUSD": 0.5}, ignorable=True)
    log.add("import/claude-code/assistant", {"costUSD": 0.25}, ignorable=True)
    log.completed_turn("two")
    log.completed_turn("three")
    ends = [e for e in tr.build(log.events).entries if isinstance(e, tr.TurnEnd)]
    assert [e.cost for e in ends] == [0.023172, 0.75, None]


def test_model_request_can_project_only_the_last_messages(stores: Path) -> None:
    events = _read(stores, "main", "s5-compaction").stored_events
    whole = tr.model_request(events, len(events) - 1)
    tail = tr.model_request(events, len(events) - 1, last=2)
    assert tail.nodes == whole.nodes and tail.header == whole.header
    assert tail.messages == whole.messages[-2:]


def test_model_request_continues_from_an_earlier_answer_as_from_seq_0(stores: Path) -> None:
    """``since``: the fold goes on from an earlier request's nodes and header (view.md)."""
    events = _read(stores, "main", "s5-compaction").stored_events
    checkpoint = next(e for e in tr.build(events).entries if isinstance(e, tr.Checkpoint))
    for before, after in ((0, len(events) - 1), (checkpoint.seq - 1, checkpoint.seq),
                          (checkpoint.seq, len(events) - 1), (5, 5)):
        earlier = tr.model_request(events, before, last=0)
        assert earlier.messages == ()
        assert tr.model_request(events, after, since=earlier) == tr.model_request(events, after)
    later = tr.model_request(events, len(events) - 1)
    assert tr.model_request(events, 3, since=later) == tr.model_request(events, 3)  # not used


def _tool_log(turns: int, *, open_last: bool = False) -> LogBuilder:
    log = LogBuilder("s")
    for number in range(1, turns + 1):
        call_id = f"call_{number}"
        log.tool_call_turn(call_id)
        if number < turns or not open_last:
            log.close_tool(call_id)
    return log


@pytest.mark.parametrize("open_last", [False, True])
def test_iter_entries_streams_the_entries_build_gives(open_last: bool) -> None:
    events = _tool_log(60, open_last=open_last).events
    whole = tr.build(events).entries
    assert tuple(tr.iter_entries(events, first_page=3, page_events=16)) == whole
    assert isinstance(whole[-1], tr.OpenTurn) is open_last
    # a range opening inside a turn: the turn's number and the calls' names come from the look back
    for start, stop in ((0, 7), (100, 230), (301, None), (len(events) - 2, None)):
        assert tuple(tr.iter_entries(events, start=start, stop=stop, first_page=5)) \
            == tr.build(events, start=start, stop=stop).entries
    results = [e for e in tr.iter_entries(events, start=101) if isinstance(e, tr.ToolResult)]
    assert results and all(r.tool_name == "bash" for r in results)


def test_iter_entries_reads_only_as_far_as_it_is_consumed() -> None:
    events = _tool_log(200).events
    read: list[int] = []

    class Counting(tuple):  # type: ignore[type-arg]
        def __getitem__(self, index):  # type: ignore[no-untyped-def, override]
            if isinstance(index, slice):
                read.append(index.stop)
            return super().__getitem__(index)

    counted = Counting(events)
    first = next(iter(tr.iter_entries(counted, first_page=10, lookahead=5)))
    assert isinstance(first, tr.TurnStart) and max(read) <= 15  # one page and its look ahead


def test_last_entries_and_turn_span() -> None:
    events = _tool_log(300).events
    whole = tr.build(events).entries
    assert tr.last_entries(events, 5) == whole[-5:]
    messages = tr.last_entries(events, 7, keep=lambda e: e.kind == "message")
    assert messages == tuple(e for e in whole if e.kind == "message")[-7:]
    assert tr.last_entries(events, 10**6) == whole and tr.last_entries(events, 0) == ()
    start, stop = tr.turn_span(events, 123)  # type: ignore[misc]
    assert events[start]["type"] == "turn/start" and events[start]["data"]["turn"] == 123
    assert events[stop]["data"]["turn"] == 124 and events[stop - 1]["type"] == "turn/end"
    assert tr.turn_span(events, 300)[1] == len(events)  # type: ignore[index]
    assert tr.turn_span(events, 1)[0] == 0  # type: ignore[index]
    assert tr.turn_span(events, 301) is None and tr.turn_span(events, 0) is None


def _replacing_log(seed: int, count: int) -> list[dsh.Event]:
    """A valid log of appends and replaces of random runs (some reaching far back)."""
    rng = random.Random(seed)
    with dsh.open("memory:") as memory:
        s = memory.session("r", header={"createdAt": 1_767_225_600_000})
        while s.seq < count:
            nodes = list(s.surface.nodes)
            draw = rng.random()
            if draw < 0.03 and len(nodes) > 2:
                i = rng.randrange(len(nodes))
                j = min(len(nodes) - 1, i + rng.choice((0, 3, 40, 400)))
                s.append("user/message", user(f"summary {s.seq}", f"m{s.seq}"),
                         surface_op={"op": "replace", "start": nodes[i], "end": nodes[j]},
                         source_event_seqs=nodes[i:j + 1])
            elif draw < 0.04:
                s.append("request/header", {"header": {"config": {
                    "provider": "p", "model": f"m{s.seq}"}}, "reason": "change"})
            elif draw < 0.05:
                s.append("request/context", {"provider": "p", "model": f"m{s.seq}"})
            elif draw < 0.5:
                s.append("user/message", user(f"q {s.seq}", f"u{s.seq}"), surface_op="append")
            else:
                s.append("session/title", {"title": f"t {s.seq}"})
        return list(s.events)


@pytest.mark.parametrize("seed", range(6))
def test_model_tail_reads_back_to_the_same_last_messages_as_the_full_fold(seed: int) -> None:
    """model_tail (docs/view.md#the-model-view): exact messages, header and context if read."""
    events = _replacing_log(seed, 5000)
    read_back = 0
    for seq in (len(events) - 1, 4321, 2047, 900, 10):
        for last in (1, 7, 200):
            whole = tr.model_request(events, seq, last=last)
            tail = tr.model_tail(events, seq, last=last, limit=4096)
            if tail is None:  # only a replace reaching more than 4,096 events back
                continue
            read_back += tail.first_seq > 0
            assert tail.messages == whole.messages
            assert tail.nodes == whole.nodes[len(whole.nodes) - len(tail.nodes):]
            assert tail.complete == (tail.first_seq == 0)
            if tail.complete:
                assert tail.nodes == whole.nodes
            if tail.header_known:
                assert tail.header == whole.header
            if tail.context_known:
                assert tail.context == whole.context
    assert read_back  # some tails were found without reading back to seq 0

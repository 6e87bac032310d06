"""Summarizers (docs/rules.md#the-checkpoint-message offline default)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dsh._errors import CompactionError
from dsh.compaction._summarizers import (
    CHECKPOINT_CLOSE_TAG,
    CHECKPOINT_OPEN_TAG,
    CHECKPOINT_SECTIONS,
    COMPACTION_INSTRUCTION,
    AsyncSummarizer,
    DigestSummarizer,
    LlmSummarizer,
    Summarizer,
    SummaryResult,
    checkpoint_source,
    extract_checkpoint_summary,
    frame_checkpoint_content,
    is_checkpoint_source,
)
from tests.compaction.builders import s5_events


def msg(role: str, *blocks: dict[str, Any], kind: str = "user") -> dict[str, Any]:
    source = {"kind": "model", "provider": "p", "model": "m"} if role == "assistant" else \
        {"kind": kind}
    return {"id": "x", "role": role, "content": list(blocks), "source": source}


def t(value: str) -> dict[str, str]:
    return {"type": "text", "text": value}


def call(cid: str, name: str, args: str) -> dict[str, str]:
    return {"type": "tool-call", "id": cid, "name": name, "arguments": args}


def result(cid: str, output: str, *, error: bool = False) -> dict[str, Any]:
    return msg("user", {"type": "tool-result", "toolCallId": cid, "content": [t(output)],
                        "isError": error}, kind="tool")


CONVERSATION = [
    msg("user", t("Fix the failing test in tests/test_api.py")),
    msg("assistant", t("I'll run the tests first."),
        call("c1", "bash", '{"command":"pytest -q"}')),
    result("c1", "FAILED tests/test_api.py::test_get - KeyError: 'id'\n1 failed", error=True),
    msg("assistant", t("Reading the handler."), call("c2", "read_file", '{"path":"src/api.py"}')),
    result("c2", "def get(): ..."),
    msg("assistant", t("The handler drops the id field; I will add it back.")),
    msg("user", t("Also update the changelog")),
    msg("assistant", call("c3", "bash", '{"command":"git diff"}')),
]


def test_digest_writes_the_eight_reference_sections_in_order() -> None:
    out = DigestSummarizer().summarize(CONVERSATION)
    text = out.summary[0]
    headings = [line[3:] for line in text.split("\n") if line.startswith("## ")]
    assert headings == list(CHECKPOINT_SECTIONS)
    assert text == "\n\n".join([
        "## Primary Request and Intent\n- Fix the failing test in tests/test_api.py\n"
        "- Also update the changelog",
        "## Key Technical Concepts\n- tools used: bash x2, read_file x1",
        "## Files and Code\n- command: `pytest -q`\n- file: src/api.py\n- command: `git diff`",
        "## Errors and Fixes\n- bash failed: FAILED tests/test_api.py::test_get - KeyError: 'id'",
        "## Pending Jobs\n- tool call c3 (bash) has no result yet",
        "## Current Work\n- The handler drops the id field; I will add it back.",
        "## Next Step\n- answer: Also update the changelog",
        "## Critical Context\n- I'll run the tests first.\n- Reading the handler.",
    ])
    assert (out.provider, out.model) == ("dsh", "digest-v1")


def test_digest_is_deterministic() -> None:
    assert DigestSummarizer().summarize(CONVERSATION) == \
        DigestSummarizer().summarize(list(CONVERSATION))


def test_digest_merges_an_earlier_checkpoint_section_by_section() -> None:
    digest = DigestSummarizer()
    previous = digest.summarize(CONVERSATION[:3]).summary[0]
    merged = digest.summarize(CONVERSATION[3:], previous=previous).summary[0]
    whole = digest.summarize(CONVERSATION).summary[0]
    assert "- tools used: bash x2, read_file x1" in merged
    assert merged.split("## Errors and Fixes")[1] == whole.split("## Errors and Fixes")[1]


def test_digest_skips_checkpoint_messages_and_caps_sections() -> None:
    checkpoint = {"id": "k", "role": "user", "source": checkpoint_source("cid"),
                  "content": list(frame_checkpoint_content(["## Primary Request and Intent\n"
                                                            "- old request"]))}
    many = [msg("user", t(f"request {i}")) for i in range(5)]
    out = DigestSummarizer(section_items=3).summarize([checkpoint, *many],
                                                      previous="## Primary Request and Intent\n"
                                                               "- old request")
    first = out.summary[0].split("\n\n")[0]
    assert first == ("## Primary Request and Intent\n- (3 earlier items omitted)\n"
                     "- request 2\n- request 3\n- request 4")


def test_digest_clips_long_items() -> None:
    out = DigestSummarizer(item_chars=20).summarize([msg("user", t("word " * 40))])
    assert "- word word word word…\n" in out.summary[0]


def test_summarizer_protocols_are_runtime_checkable() -> None:
    assert isinstance(DigestSummarizer(), Summarizer)
    assert isinstance(DigestSummarizer(), AsyncSummarizer)
    llm = LlmSummarizer(complete=lambda m: "x")
    assert isinstance(llm, Summarizer) and isinstance(llm, AsyncSummarizer)


def test_llm_summarizer_replays_the_conversation_and_appends_the_instruction_last() -> None:
    # docs/rules.md#compaction "replays the conversation prefix and appends the instruction as the
    # final message".
    seen: list[list[Any]] = []

    def complete(messages: list[Any]) -> str:
        seen.append(messages)
        return "## Primary Request and Intent\n- fix test"

    summarizer = LlmSummarizer(complete=complete, provider="deepseek", model="v4")
    out = summarizer.summarize(CONVERSATION)
    request = seen[0]
    assert request[:-1] == CONVERSATION
    assert request[-1]["role"] == "user"
    assert request[-1]["source"] == {"kind": "plugin", "plugin": "dsh-compaction"}
    assert request[-1]["content"] == [{"type": "text", "text": COMPACTION_INSTRUCTION}]
    assert out == SummaryResult(summary=("## Primary Request and Intent\n- fix test",),
                                provider="deepseek", model="v4", max_tokens=8192,
                                raw_output=[t("## Primary Request and Intent\n- fix test")])
    for name in CHECKPOINT_SECTIONS:
        assert f"## {name}" in COMPACTION_INSTRUCTION


@pytest.mark.parametrize("reply", ["", "   \n", None])
def test_llm_summarizer_rejects_empty_output(reply: Any) -> None:
    # docs/rules.md#compaction "rejects empty or reasoning-only successful output".
    with pytest.raises(CompactionError) as info:
        LlmSummarizer(complete=lambda m: reply).summarize(CONVERSATION)
    assert info.value.code == "SUMMARY"


def test_llm_summarizer_async_uses_acomplete_or_a_thread() -> None:
    async def acomplete(messages: list[Any]) -> str:
        return "async text"

    with_async = LlmSummarizer(complete=lambda m: "sync text", acomplete=acomplete)
    without = LlmSummarizer(complete=lambda m: "sync text")
    assert asyncio.run(with_async.asummarize(CONVERSATION)).summary == ("async text",)
    assert asyncio.run(without.asummarize(CONVERSATION)).summary == ("sync text",)


def test_summary_result_requires_raw_output_for_one_llm_stream_call() -> None:
    # docs/rules.md#compaction "requires complete raw output when a subclass marks one local LLM
    # stream call".
    with pytest.raises(CompactionError):
        SummaryResult(summary=("x",), provider="p", model="m", llm_stream_call=True)
    with pytest.raises(CompactionError):
        SummaryResult(summary=(" ",), provider="p", model="m")


def test_checkpoint_framing_round_trips_and_reads_dsh_checkpoints(dsh_logs: Path) -> None:
    content = frame_checkpoint_content(["part one", "part two"])
    assert content[0]["text"].endswith(f"\n\n{CHECKPOINT_OPEN_TAG}")
    assert content[-1] == {"type": "text", "text": CHECKPOINT_CLOSE_TAG}
    ours = {"role": "user", "content": content, "source": checkpoint_source("c", "cmd")}
    assert extract_checkpoint_summary(ours) == "part one\n\npart two"
    assert ours["source"] == {"kind": "plugin", "plugin": "compact", "compactionId": "c",
                              "sourceCommandId": "cmd"}
    # dsh's own checkpoint (s5 seq 275) has a different preamble but the same frame
    events = s5_events(dsh_logs)
    theirs = events[275]["data"]
    assert is_checkpoint_source(theirs["source"])
    assert extract_checkpoint_summary(theirs) == events[274]["data"]["summary"][0]["text"]
    assert extract_checkpoint_summary(CONVERSATION[0]) is None


def test_digest_next_step_is_cleared_once_a_later_span_answers_it() -> None:
    digest = DigestSummarizer()
    previous = digest.summarize([msg("user", t("Add a test"))]).summary[0]
    assert "## Next Step\n- answer: Add a test" in previous
    merged = digest.summarize([msg("assistant", t("Added tests/test_x.py"))],
                              previous=previous).summary[0]
    assert "## Next Step\n- (none)" in merged
    assert "## Current Work\n- Added tests/test_x.py" in merged
    assert "## Primary Request and Intent\n- Add a test" in merged

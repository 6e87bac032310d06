"""Every corpus transcript imports, seeds a Session, repairs and exports.

Rule: docs/testing.md#what-the-tests-cover.

The facts below were read from the source files by hand (counting lines/blocks in each file, not
by running the importer): typed user prompts, tool calls, recorded tool results, compactions,
subagent children, turns, and how the last turn ended (``None`` + open = cut off mid-turn, left
open for ``interrupted_turn_closers``, docs/rules.md#repair). Mapping:
docs/interop.md#mapping-rules.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dsh.interop import (
    detect_format,
    import_file,
    to_anthropic,
    to_openai,
    validate_conversation,
)
from dsh.session._invariants import check_log
from dsh.session._repair import interrupted_turn_closers
from dsh.session._session import Session
from tests.conftest import DSH_LOGS
from tests.interop.helpers import corpus_dir, facts, live


def F(prompts: int, calls: int, results: int, *, compactions: int = 0, children: int = 0,
      turns: int = 1, open_last_turn: bool = False, last_end: str | None = "completed",
      ) -> dict[str, Any]:
    return {"prompts": prompts, "calls": calls, "results": results, "compactions": compactions,
            "children": children, "turns": turns, "open_last_turn": open_last_turn,
            "last_end": None if open_last_turn else last_end}


OPEN = {"open_last_turn": True}

# file -> (format, [facts of each top-level session], {top index: [facts of its children]})
EXPECTED: dict[str, tuple[str, list[dict[str, Any]], dict[int, list[dict[str, Any]]]]] = {
    # Claude Code. short: 1 typed prompt (line 4), Bash+Glob tool_use (lines 8, 10) answered by
    # lines 11-12, then "[Request interrupted by user for tool use]" (line 13) -> aborted.
    "claude-code/spotter-short-interrupted.jsonl": (
        "claude-code", [F(1, 2, 2, last_end="aborted")], {}),
    # tool-heavy: prompts at lines 4, 21 (/mcp slash command), 26; 6 tool_use / 6 tool_result;
    # interrupts at lines 18 and 39 -> 2 turns, the last aborted.
    "claude-code/spotter-tool-heavy-queued-interrupts.jsonl": (
        "claude-code", [F(3, 6, 6, turns=2, last_end="aborted")], {}),
    # task-subagent: prompts at lines 4 (slash command) and 71; 16 tool_use/16 results; the
    # interrupt at line 69 ends turn 1; the Task subagent is mirrored by 19 agent_progress
    # lines (agentId afb92ff: its prompt, 9 tool_use, 9 results, cut before its final answer).
    "claude-code/spotter-task-subagent.jsonl": (
        "claude-code", [F(2, 16, 16, children=1, turns=2)],
        {0: [F(1, 9, 9, **OPEN)]}),
    # compaction excerpt: starts mid-turn (no prompt), 20 tool_use, 19 results (the Bash call
    # at line 179 has none), one compact_boundary (line 46), two subagent files.
    "claude-code/spotter-compaction/258c7280-ae70-4798-800f-63464d01a85d.jsonl": (
        "claude-code", [F(0, 20, 19, compactions=1, children=2, **OPEN)],
        {0: [F(1, 2, 2), F(1, 0, 0)]}),
    # 1.0.98: slash command prompt (line 2), 6 tool_use (3 Task at lines 13-15) but only 4
    # results (cut at line 107); inline sidechain roots at lines 16 and 38.
    "claude-code/ccviewer-v1.0.98-summary-inline-sidechains.jsonl": (
        "claude-code", [F(1, 6, 4, children=2, **OPEN)],
        {0: [F(1, 8, 8), F(1, 28, 27, **OPEN)]}),
    # 1.0.108: 13 tool_use / 13 results on the main thread; sidechain roots at lines 16, 26.
    "claude-code/ccviewer-v1.0.108-inline-sidechain.jsonl": (
        "claude-code", [F(1, 13, 13, children=2)], {0: [F(1, 2, 2), F(1, 6, 6)]}),
    # Codex: exec run, one redacted prompt (line 6), no calls, task_complete.
    "codex/agent-history-real-exec-session-01.jsonl": ("codex", [F(1, 0, 0)], {}),
    # 0.58 rollout: prompt at line 3; 37 function_call / 37 outputs; cut while the model works.
    "codex/rollout-2025-11-17T15-30-28-019a93b9-f380-7600-98ff-940e6b99603c.jsonl": (
        "codex", [F(1, 37, 37, **OPEN)], {}),
    # OpenAI chat: 6 tool_calls / 6 tool messages ending with the answered finish call.
    "openai-chat/openhands-sdk-fncall-messages.json": ("openai-chat", [F(1, 6, 6)], {}),
    "openai-chat/openhands-sdk-nonfncall-messages.json": ("openai-chat", [F(1, 4, 4)], {}),
    # completion log: 5 answered calls in the request + the response's finish call (no result).
    "openai-chat/openhands-sdk-litellm-completion-log.json": (
        "openai-chat", [F(1, 6, 5, **OPEN)], {}),
    # Anthropic: final request + response of each cassette.
    "anthropic/pydantic-ai-tool-with-thinking.yaml": ("anthropic", [F(1, 1, 1)], {}),
    "anthropic/pydantic-ai-compaction-round-trip.yaml": ("anthropic", [F(2, 0, 0, turns=2)], {}),
    "anthropic/pydantic-ai-mixed-strict-tool-run.yaml": ("anthropic", [F(1, 2, 2)], {}),
    "anthropic/pydantic-ai-cassettes.exchanges.jsonl": (
        "anthropic", [F(1, 1, 1), F(2, 0, 0, turns=2), F(1, 2, 2)], {}),
    # OpenHands: run/edit actions paired by cause; finish has no observation (synthetic result).
    "openhands/openhands-v0-basic-gui-mode.trajectory.json": ("openhands", [F(1, 4, 4)], {}),
    "openhands/openhands-v0-wrong-initial-state.trajectory.json": (
        "openhands", [F(1, 4, 3)], {}),
    "openhands/openhands-v0-multi-swe-bench-output.line2.jsonl": (
        "openhands", [F(1, 33, 32)], {}),
    # SWE-agent: text mode has no native calls; function calling pairs tool_call_ids.
    "swe-agent/swe-agent-gpt4-test-repo-i1.traj": ("swe-agent", [F(1, 0, 0)], {}),
    "swe-agent/swe-agent-function-calling-simple.traj": ("swe-agent", [F(1, 5, 5)], {}),
    "swe-agent/swe-agent-function-calling-marshmallow-1867.traj": (
        "swe-agent", [F(1, 11, 11)], {}),
    "swe-agent/mini-swe-agent-github-issue.traj.json": ("mini-swe-agent", [F(1, 0, 0)], {}),
    # dsh snapshots read as is.
    "dsh/headless-compaction-recovery.session.jsonl": ("dsh", [F(1, 1, 1, compactions=1)], {}),
    "dsh/acp-cancel-tool-calls.session.jsonl": ("dsh", [F(1, 2, 2, last_end="aborted")], {}),
    "dsh/headless-tool-outcome-unknown-resume.session.jsonl": ("dsh", [F(2, 1, 1, turns=2)], {}),
    "dsh/headless-offline-edit-resume.session.jsonl": ("dsh", [F(2, 0, 0, turns=2)], {}),
    "dsh/acp-subagent-fork-in-process/session.jsonl": ("dsh", [F(2, 1, 1, turns=2)], {}),
    "dsh/acp-subagent-fork-in-process/session.1.jsonl": ("dsh", [F(2, 0, 0, turns=2)], {}),
    "dsh/acp-escalation-rejected.session.jsonl": ("dsh", [F(1, 1, 1)], {}),
    "dsh/acp-parallel-tool-calls.session.jsonl": ("dsh", [F(1, 2, 2)], {}),
    "dsh/acp-bash-spill.session.jsonl": ("dsh", [F(1, 1, 1)], {}),
    "dsh/acp-empty-response-retry.session.jsonl": ("dsh", [F(1, 0, 0)], {}),
    "dsh/web-goal-multi-turn-actions.session.jsonl": ("dsh", [F(0, 11, 11, turns=2)], {}),
}

SUBAGENT_FILES = {
    "claude-code/spotter-compaction/258c7280-ae70-4798-800f-63464d01a85d/subagents/"
    "agent-a881341.jsonl",
    "claude-code/spotter-compaction/258c7280-ae70-4798-800f-63464d01a85d/subagents/"
    "agent-acompact-fffbd0.jsonl",
}


def test_corpus_manifest_every_file_has_pinned_facts() -> None:
    manifest = json.loads((corpus_dir() / "MANIFEST.json").read_text())
    listed = {f["file"] for f in manifest["files"]}
    assert listed == set(EXPECTED) | SUBAGENT_FILES


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_import_pins_source_facts(name: str) -> None:
    path = corpus_dir() / name
    fmt, expected, children = EXPECTED[name]
    assert detect_format(path) == fmt
    sessions = import_file(path)
    assert [facts(s) for s in sessions] == expected
    for index, kids in children.items():
        assert [facts(c) for c in sessions[index].children] == kids
        for child in sessions[index].children:
            assert child.header["parentSession"] == sessions[index].session_id
            assert child.header["origin"] == "subagent"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_import_seeds_session_and_exports_validate(name: str) -> None:
    """Seeds validate like live appends; both exports are valid requests.

    Rule: docs/rules.md#seed-validation.
    """
    for top in import_file(corpus_dir() / name):
        for imported in top.walk():
            session = imported.to_session(clock=lambda: 0)
            assert session.first_live_seq == len(imported.events)
            # our own output must satisfy docs/rules.md#turns-and-steps
            if not name.startswith("dsh/"):
                assert check_log(session.events) == []
            messages = session.derive_messages()
            assert validate_conversation(to_openai(messages), "openai") == []
            assert validate_conversation(to_anthropic(messages), "anthropic") == []


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_import_open_turn_repairs_cleanly(name: str) -> None:
    """An import cut mid-turn is left open; repair closers complete it (docs/rules.md#closers)."""
    for top in import_file(corpus_dir() / name):
        for imported in top.walk():
            closers = interrupted_turn_closers(
                Session.create(imported.session_id, seed=imported.events,
                               header=imported.header,
                               inherited_event_count=imported.header.get("seedLength", 0),
                               clock=lambda: 0).events[:len(imported.events)])
            assert bool(closers) == facts(imported)["open_last_turn"]
            if closers:
                assert closers[-1]["data"]["reason"] == {"kind": "interrupted"}
                repaired = Session.create(imported.session_id,
                                          seed=[*imported.events, *closers],
                                          header=imported.header, clock=lambda: 0)
                messages = repaired.derive_messages()
                assert validate_conversation(to_openai(messages), "openai") == []


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_import_times_are_non_decreasing_epoch_ms(name: str) -> None:
    for top in import_file(corpus_dir() / name):
        for imported in top.walk():
            times = [e["time"] for e in imported.events]
            assert all(isinstance(t, int) for t in times)
            if not name.startswith("dsh/"):  # dsh logs are read as is
                assert times == sorted(times)
                assert imported.header["createdAt"] == (times[0] if times else 0)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_import_session_id_is_stable(name: str) -> None:
    first = [s.session_id for top in import_file(corpus_dir() / name) for s in top.walk()]
    second = [s.session_id for top in import_file(corpus_dir() / name) for s in top.walk()]
    assert first == second
    assert len(set(first)) == len(first)


def _lines(name: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (corpus_dir() / name).read_text().splitlines() if x.strip()]


def test_claude_code_import_keeps_every_ui_record_as_ignorable() -> None:
    """Progress, snapshots, queue ops and system lines stay in the log verbatim.

    Rule: docs/events.md#known-types-and-ignorable-events.
    """
    name = "claude-code/spotter-tool-heavy-queued-interrupts.jsonl"
    [session] = import_file(corpus_dir() / name)
    kept = [e["data"] for e in session.events if e.get("ignorable")]
    for raw in _lines(name):
        if raw["type"] in ("progress", "file-history-snapshot", "queue-operation", "system"):
            assert raw in kept
    assert all(e["type"].startswith("import/claude-code/") for e in session.events
               if e.get("ignorable") and e["type"] != "import/source")
    assert [e["seq"] for e in session.events if e["type"] == "import/source"] == [0]


def test_claude_code_import_merges_lines_sharing_message_id() -> None:
    """msg ...1XZ3HE spans lines 128-147 with results interleaved: one assistant/message."""
    name = "claude-code/spotter-compaction/258c7280-ae70-4798-800f-63464d01a85d.jsonl"
    [session] = import_file(corpus_dir() / name)
    ids = [e["data"]["message"]["id"] for e in live(session) if e["type"] == "assistant/message"]
    assert len(ids) == len(set(ids)) == 16
    merged = next(e for e in live(session) if e["type"] == "assistant/message"
                  and e["data"]["message"]["id"].endswith("1XZ3HE"))
    kinds = [b["type"] for b in merged["data"]["message"]["content"]]
    assert kinds == ["text", "tool-call", "tool-call", "tool-call", "tool-call"]


def test_claude_code_import_follows_parallel_results_off_the_parent_chain() -> None:
    """Line 11's result hangs off the Bash tool_use, not the leaf chain; it is still paired."""
    [session] = import_file(corpus_dir() / "claude-code/spotter-short-interrupted.jsonl")
    results = [e for e in live(session) if e["type"] == "tool/result"]
    assert [r["data"]["message"]["source"]["callId"] for r in results] == [
        "toolu_0116Hyi5v8ut7Ffb7d8qV1Sc", "toolu_01FdQ8qTyVyZjE3Kw4dguQGx"]
    assert all(r["data"]["message"]["content"][0]["isError"] for r in results)
    tail = [e["type"] for e in live(session)][-3:]
    assert tail == ["step/end", "user/message", "turn/end"]  # the notice sits between steps
    assert live(session)[-1]["data"]["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}


def test_claude_code_import_compaction_replaces_the_shadowed_surface() -> None:
    """compact_boundary + isCompactSummary -> start, summary, replace user/message, end.

    Rule: docs/rules.md#surface-ops.
    """
    name = "claude-code/spotter-compaction/258c7280-ae70-4798-800f-63464d01a85d.jsonl"
    [imported] = import_file(corpus_dir() / name)
    ev = imported.events
    start = next(e for e in ev if e["type"] == "compaction/start")
    summary, replace, end = ev[start["seq"] + 1], ev[start["seq"] + 2], ev[start["seq"] + 3]
    assert [summary["type"], replace["type"], end["type"]] == [
        "compaction/summary", "user/message", "compaction/end"]
    assert summary["data"]["shadowedTokenCount"] > 0
    assert summary["data"]["trigger"] == "auto"
    shadowed = summary["data"]["shadowedSeqs"]
    before = [e["seq"] for e in ev[:start["seq"]] if e.get("surfaceOp") == "append"]
    assert shadowed == before
    assert replace["surfaceOp"] == {"op": "replace", "start": before[0], "end": before[-1]}
    assert set(shadowed) <= set(replace["sourceEventSeqs"])
    assert replace["data"]["content"][0]["text"].startswith(
        "This session is being continued from a previous conversation")
    session = imported.to_session(clock=lambda: 0)
    assert session.derive_messages()[0]["id"] == replace["data"]["id"]


def test_codex_import_reads_response_items_only() -> None:
    """event_msg agent_message/user_message copies are ignorable, not messages (no doubling)."""
    name = "codex/agent-history-real-exec-session-01.jsonl"
    [session] = import_file(corpus_dir() / name)
    roles = [(e["type"], e["data"]["source"]["kind"] if e["type"] == "user/message" else None)
             for e in live(session) if e["type"] in ("user/message", "assistant/message")]
    assert roles == [("user/message", "plugin"), ("user/message", "plugin"),
                     ("user/message", "user"), ("assistant/message", None)]
    assert sum(1 for e in session.events if e["type"] == "import/codex/event_msg") == 5
    assert session.session_id == _lines(name)[0]["payload"]["id"]


def test_openhands_import_groups_actions_of_one_model_response() -> None:
    """Each action carries the LiteLLM response; one response -> one assistant/message."""
    [session] = import_file(corpus_dir() / "openhands/openhands-v0-basic-gui-mode.trajectory.json")
    assistants = [e for e in live(session) if e["type"] == "assistant/message"]
    assert len(assistants) == 5
    first = assistants[0]["data"]["message"]
    assert first["source"]["model"] == "claude-3-5-sonnet-20241022"
    assert [b["type"] for b in first["content"]] == ["text", "tool-call"]


def test_swe_agent_import_pairs_reused_call_ids_in_order() -> None:
    """marshmallow reuses call ids across steps; each result answers the newest call."""
    [session] = import_file(
        corpus_dir() / "swe-agent/swe-agent-function-calling-marshmallow-1867.traj")
    calls = {e["seq"]: e["data"]["callId"] for e in live(session) if e["type"] == "tool/call"}
    for e in live(session):
        if e["type"] == "tool/result":
            [call_seq] = e["sourceEventSeqs"]
            assert calls[call_seq] == e["data"]["message"]["source"]["callId"]
            assert max(s for s in calls if s < e["seq"]) == call_seq


def test_dsh_log_import_expands_packed_chunk_rows() -> None:
    """Snapshot rows expand by position so sourceEventSeqs line up (docs/formats.md#chunk-rows)."""
    [session] = import_file(corpus_dir() / "dsh/acp-subagent-fork-in-process/session.jsonl")
    first = next(e for e in session.events if e["type"] == "assistant/message")
    assert first["sourceEventSeqs"][0] == 9
    assert {session.events[s]["type"] for s in first["sourceEventSeqs"]} == {"assistant/chunk"}
    assert session.header["id"] == "96cf59c9-b347-48b9-b234-a5200913ad05"
    assert "cwd" not in session.header  # "{{cwd}}" is a template


def test_dsh_log_import_reads_real_logs_from_dsh_logs() -> None:
    logs = sorted((DSH_LOGS / "jsonl" / "main").glob("*/*/session.jsonl"))
    assert len(logs) == 3
    for log in logs:
        [imported] = import_file(log)
        first = Path(log).read_text().split("\n")[1]
        assert json.loads(first)["type"] == imported.events[0]["type"]
        imported.to_session(clock=lambda: 0)

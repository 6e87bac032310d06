"""The hand-written example transcripts in ``src/dsh/examples/transcripts`` (one or more per
format, including interrupted and compacted ones) import with exact events
(docs/interop.md#mapping-rules;
rules)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from dsh.interop import detect_format, import_file, to_anthropic, to_openai, validate_conversation
from dsh.interop._common import IMPORTER_VERSION
from dsh.session._repair import interrupted_turn_closers
from tests.interop.helpers import EXAMPLES, facts, live

pytestmark = pytest.mark.no_speedups

EXPECTED: dict[str, tuple[str, dict[str, Any]]] = {
    "anthropic/request.json": ("anthropic", {"prompts": 1, "calls": 1, "results": 1,
                                             "last_end": "completed"}),
    "claude-code/simple.jsonl": ("claude-code", {"prompts": 1, "calls": 1, "results": 1,
                                                 "last_end": "completed"}),
    "claude-code/interrupted.jsonl": ("claude-code", {"prompts": 2, "calls": 2, "results": 1,
                                                      "turns": 2, "open_last_turn": True}),
    "claude-code/compacted.jsonl": ("claude-code", {"prompts": 2, "calls": 1, "results": 1,
                                                    "compactions": 1, "turns": 2}),
    # long enough for `dsh compact` to be worth it (README tour)
    "claude-code/long-debugging.jsonl": ("claude-code", {"prompts": 4, "calls": 6, "results": 6,
                                                         "turns": 4, "last_end": "completed"}),
    "codex/rollout-compacted-aborted.jsonl": ("codex", {"prompts": 2, "calls": 2, "results": 1,
                                                        "compactions": 1, "turns": 2,
                                                        "last_end": "aborted"}),
    "codex/legacy-interrupted.jsonl": ("codex", {"prompts": 1, "calls": 1, "results": 0,
                                                 "open_last_turn": True}),
    "dsh/session.jsonl": ("dsh", {"prompts": 1, "calls": 0, "last_end": "completed"}),
    "mini-swe-agent/run.traj.json": ("mini-swe-agent", {"prompts": 1, "calls": 0,
                                                        "last_end": "completed"}),
    "openai-chat/conversation.json": ("openai-chat", {"prompts": 1, "calls": 1, "results": 1,
                                                      "last_end": "completed"}),
    "openhands/trajectory.json": ("openhands", {"prompts": 1, "calls": 1, "results": 1,
                                                "last_end": "completed"}),
    "swe-agent/run.traj": ("swe-agent", {"prompts": 1, "calls": 1, "results": 1,
                                         "last_end": "error"}),
}


def test_examples_every_file_is_listed() -> None:
    found = {str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*") if p.is_file()}
    assert found == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_examples_import_detect_seed_and_export(name: str) -> None:
    fmt, expected = EXPECTED[name]
    path = EXAMPLES / name
    assert detect_format(path) == fmt
    [imported] = import_file(path)
    got = facts(imported)
    assert {k: got[k] for k in expected} == expected
    session = imported.to_session(clock=lambda: 0)
    messages = session.derive_messages()
    assert validate_conversation(to_openai(messages), "openai") == []
    assert validate_conversation(to_anthropic(messages), "anthropic") == []


def test_claude_code_example_interrupted_is_repairable_like_a_crash() -> None:
    """Cut while ``ls build`` runs: the open turn gets dsh's closers (docs/rules.md#closers)."""
    [imported] = import_file(EXAMPLES / "claude-code" / "interrupted.jsonl")
    ev = live(imported)
    assert [e["type"] for e in ev[6:9]] == ["step/end", "user/message", "turn/end"]
    assert ev[8]["data"]["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}
    closers = interrupted_turn_closers(imported.to_session(clock=lambda: 0).events)
    assert [c["type"] for c in closers] == ["tool/result", "step/end", "turn/end"]
    assert closers[0]["data"]["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
    assert closers[0]["sourceEventSeqs"] == [ev[-1]["seq"]]


def test_claude_code_example_compacted_events_exactly() -> None:
    [imported] = import_file(EXAMPLES / "claude-code" / "compacted.jsonl")
    envelopes = [e for e in imported.events if e["type"] == "import/claude-code/envelope"]
    assert len(envelopes) == 7  # every message line, content left to the mapped event
    assert "content" not in envelopes[0]["data"]["message"]
    assert envelopes[0]["data"]["uuid"] == "u1"
    ev = live(imported)
    shape = [(e["type"], e.get("surfaceOp") if isinstance(e.get("surfaceOp"), str) else None)
             for e in ev]
    assert shape == [
        ("turn/start", None), ("step/start", None), ("user/message", "append"),
        ("assistant/message", "append"), ("tool/call", None), ("tool/result", "append"),
        ("step/end", None), ("step/start", None), ("assistant/message", "append"),
        ("step/end", None), ("turn/end", None), ("compaction/start", None),
        ("compaction/summary", None), ("user/message", None), ("compaction/end", None),
        ("turn/start", None), ("step/start", None), ("user/message", "append"),
        ("assistant/message", "append"), ("step/end", None), ("turn/end", None)]
    appended = [e["seq"] for e in ev[:11] if e.get("surfaceOp") == "append"]
    start, summary, replace = ev[11], ev[12], ev[13]
    assert replace["surfaceOp"] == {"op": "replace", "start": appended[0], "end": appended[-1]}
    assert replace["sourceEventSeqs"] == [start["seq"], summary["seq"], *appended]
    assert ev[5]["sourceEventSeqs"] == [ev[4]["seq"]]
    assert summary["data"]["shadowedSeqs"] == appended
    assert summary["data"]["shadowedTokenCount"] == 1234
    assert summary["data"]["trigger"] == "manual"
    assert start["data"] == {"compactionId": "cb1", "turn": None}
    messages = imported.to_session(clock=lambda: 0).derive_messages()
    assert [m["role"] for m in messages] == ["user", "user", "assistant"]
    assert imported.header == {"version": 0, "id": "33333333-2222-4333-8444-555555555555",
                               "createdAt": 1767614400000, "cwd": "/home/demo/app"}


def test_codex_example_compacted_uses_replacement_history() -> None:
    [imported] = import_file(EXAMPLES / "codex" / "rollout-compacted-aborted.jsonl")
    replace = next(e for e in imported.events if isinstance(e.get("surfaceOp"), dict))
    assert [b["text"] for b in replace["data"]["content"]] == [
        "Show the git branch", "Summary: the current git branch is main."]
    last = live(imported)[-3:]
    assert [e["type"] for e in last] == ["tool/result", "step/end", "turn/end"]
    assert last[0]["data"]["error"] == {"name": "AbortError", "code": "ABORTED"}
    assert last[-1]["data"]["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}


UNTIMED = {"anthropic", "openai-chat", "swe-agent", "mini-swe-agent"}
"""Formats whose files carry no timestamps: the importer says so in ``import/source``."""


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_examples_import_records_the_source_once(name: str) -> None:
    """One ignorable `import/source` per session: format, path as given, sha256, version."""
    fmt, _ = EXPECTED[name]
    path = EXAMPLES / name
    [imported] = import_file(path)
    sources = [e for e in imported.events if e["type"] == "import/source"]
    assert len(sources) == 1
    [source] = sources
    assert source["ignorable"] is True
    assert "surfaceOp" not in source
    untimed = {"timestamps": False} if fmt in UNTIMED else {}
    assert source["data"] == {"format": fmt, "path": str(path),
                              "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                              "size": path.stat().st_size,
                              "importerVersion": IMPORTER_VERSION, **untimed}
    # Seq 0 for the mapped formats (stamped like the first mapped event); last for dsh logs,
    # whose own seqs are kept.
    expected_seq = len(imported.events) - 1 if fmt == "dsh" else 0
    assert source["seq"] == expected_seq
    if fmt != "dsh":
        assert source["time"] == imported.events[1]["time"] == imported.header["createdAt"]

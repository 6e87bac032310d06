"""Reasoning kept losslessly, Claude Code titles and Codex tool output text
(item 17), and exports for another model (item 22)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dsh.interop import import_file, to_anthropic, to_openai, without_foreign_reasoning
from tests.cli.test_cli import Dsh
from tests.interop.helpers import live

ENCRYPTED = "gAAAAB-opaque-blob"


def _codex(tmp_path: Path, items: list[dict[str, Any]]) -> Path:
    records = [{"timestamp": "2025-06-01T10:00:00Z", "type": "session_meta",
                "payload": {"id": "c-1", "cwd": "/w", "model_provider": "openai"}},
               {"timestamp": "2025-06-01T10:00:00Z", "type": "turn_context",
                "payload": {"model": "gpt-5-codex"}},
               {"timestamp": "2025-06-01T10:00:01Z", "type": "response_item",
                "payload": {"type": "message", "role": "user",
                            "content": [{"type": "input_text", "text": "list files"}]}}]
    records += [{"timestamp": "2025-06-01T10:00:02Z", "type": "response_item", "payload": item}
                for item in items]
    path = tmp_path / "rollout-c-1.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def _assistant_blocks(path: Path, fmt: str) -> list[dict[str, Any]]:
    [session] = import_file(path, fmt)
    return [b for e in live(session) if e["type"] == "assistant/message"
            for b in e["data"]["message"]["content"]]


def test_codex_reasoning_keeps_content_summary_and_encrypted_content(tmp_path: Path) -> None:
    path = _codex(tmp_path, [{
        "type": "reasoning", "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "**Listing**"}],
        "content": [{"type": "reasoning_text", "text": "I should run ls."},
                    {"type": "reasoning_text", "text": "Then report."}],
        "encrypted_content": ENCRYPTED}, {
        "type": "message", "role": "assistant",
        "content": [{"type": "output_text", "text": "Two files."}]}])
    [reasoning, text] = _assistant_blocks(path, "codex")
    assert reasoning == {"type": "reasoning", "text": "I should run ls.\n\nThen report.",
                         "summary": ["**Listing**"], "encryptedContent": ENCRYPTED,
                         "itemId": "rs_1"}
    assert text == {"type": "text", "text": "Two files."}


def test_codex_reasoning_with_only_a_summary_and_odd_parts(tmp_path: Path) -> None:
    path = _codex(tmp_path, [{
        "type": "reasoning", "summary": [{"type": "summary_text", "text": "short"},
                                         {"type": "image", "url": "x"}],
        "content": None}])
    [reasoning] = _assistant_blocks(path, "codex")
    assert reasoning == {"type": "reasoning", "text": "short",
                         "rawSummary": [{"type": "summary_text", "text": "short"},
                                        {"type": "image", "url": "x"}]}


def _thinking_transcript(tmp_path: Path, session: str, *extra: dict[str, Any]) -> Path:
    """A Claude Code prompt answered with signed thinking (and ``extra`` blocks) then text."""
    content = [{"type": "thinking", "thinking": "hmm", "signature": "SIG"}, *extra,
               {"type": "text", "text": "done"}]
    lines = [
        {"type": "user", "uuid": "u1", "parentUuid": None, "sessionId": session,
         "message": {"role": "user", "content": "think"}},
        {"type": "assistant", "uuid": "a1", "parentUuid": "u1", "sessionId": session,
         "message": {"id": "m1", "role": "assistant", "model": "claude-opus-4-1",
                     "content": content}}]
    path = tmp_path / f"{session}.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_claude_code_thinking_keeps_its_signature_and_redacted_thinking(tmp_path: Path) -> None:
    path = _thinking_transcript(tmp_path, "s1", {"type": "redacted_thinking", "data": "REDACTED"})
    assert _assistant_blocks(path, "claude-code") == [
        {"type": "reasoning", "text": "hmm", "signature": "SIG"},
        {"type": "provider-raw", "provider": "anthropic",
         "block": {"type": "redacted_thinking", "data": "REDACTED"}},
        {"type": "text", "text": "done"}]


def test_codex_shell_output_becomes_its_text(tmp_path: Path) -> None:
    output = json.dumps({"output": "a.txt\nb.txt\n",
                         "metadata": {"exit_code": 0, "duration_seconds": 0.1}})
    path = _codex(tmp_path, [
        {"type": "function_call", "name": "shell", "call_id": "call_1",
         "arguments": json.dumps({"command": ["ls"]})},
        {"type": "function_call_output", "call_id": "call_1", "output": output},
        {"type": "function_call", "name": "mcp", "call_id": "call_2", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": json.dumps([{"type": "text", "text": "task 60"}])},
        {"type": "function_call", "name": "shell", "call_id": "call_3", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_3", "output": "{not json"}])
    [session] = import_file(path, "codex")
    results = [e["data"] for e in live(session) if e["type"] == "tool/result"]
    assert [r["message"]["content"][0]["content"] for r in results] == [
        [{"type": "text", "text": "a.txt\nb.txt\n"}], [{"type": "text", "text": "task 60"}],
        [{"type": "text", "text": "{not json"}]]
    assert results[0]["meta"] == {"codex": {"metadata": {"exit_code": 0,
                                                         "duration_seconds": 0.1}}}
    assert results[1]["meta"] == {"codex": {"parts": [{"type": "text"}]}}
    assert "meta" not in results[2]


def _claude_with_summaries(tmp_path: Path) -> Path:
    lines = [
        {"type": "summary", "summary": "An old branch", "leafUuid": "elsewhere"},
        {"type": "summary", "summary": "Fix the login bug", "leafUuid": "a1"},
        {"type": "summary", "summary": "Unrelated later title", "leafUuid": "gone"},
        {"type": "user", "uuid": "u1", "parentUuid": None, "sessionId": "title-1",
         "timestamp": "2025-06-01T10:00:00Z",
         "message": {"role": "user", "content": "the login fails"}},
        {"type": "assistant", "uuid": "a1", "parentUuid": "u1", "sessionId": "title-1",
         "timestamp": "2025-06-01T10:00:01Z",
         "message": {"id": "m1", "role": "assistant", "model": "claude-x",
                     "content": [{"type": "text", "text": "fixed"}]}}]
    path = tmp_path / "title-1.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_claude_code_summary_on_the_branch_becomes_the_title(tmp_path: Path) -> None:
    [session] = import_file(_claude_with_summaries(tmp_path), "claude-code")
    titles = [e["data"] for e in session.events if e["type"] == "session/title"]
    assert titles == [{"title": "Fix the login bug"}]
    assert sum(1 for e in session.events if e["type"] == "import/claude-code/summary") == 3


def test_cli_shows_claude_title_and_codex_output_text(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    source = _claude_with_summaries(tmp_path)
    rollout = _codex(tmp_path, [
        {"type": "function_call", "name": "shell", "call_id": "call_1", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1",
         "output": json.dumps({"output": "hello from ls", "metadata": {"exit_code": 0}})}])
    dsh("import", str(source), str(rollout))
    rows = {r["id"]: r for r in dsh.json("ls", "--json")}
    assert rows["title-1"]["title"] == "Fix the login bug"
    shown = dsh("show", "c-1").stdout
    assert "hello from ls" in shown
    assert "exit_code" not in shown


# --- exports for another model ----------------------------------------------------------------

def _messages() -> list[dict[str, Any]]:
    def assistant(model: str, *blocks: dict[str, Any]) -> dict[str, Any]:
        return {"id": f"m-{model}", "role": "assistant", "content": list(blocks),
                "source": {"kind": "model", "provider": "anthropic", "model": model}}

    return [
        {"id": "u1", "role": "user", "content": [{"type": "text", "text": "go"}],
         "source": {"kind": "user"}},
        assistant("claude-opus-4-1",
                  {"type": "reasoning", "text": "plan A", "signature": "SIG-OPUS"},
                  {"type": "provider-raw", "provider": "anthropic",
                   "block": {"type": "redacted_thinking", "data": "R"}},
                  {"type": "text", "text": "first"}),
        {"id": "u2", "role": "user", "content": [{"type": "text", "text": "more"}],
         "source": {"kind": "user"}},
        assistant("claude-sonnet-4-5",
                  {"type": "reasoning", "text": "plan B", "signature": "SIG-SONNET"},
                  {"type": "reasoning", "text": "encrypted", "encryptedContent": ENCRYPTED},
                  {"type": "text", "text": "second"}),
    ]


def test_anthropic_export_for_another_model_drops_its_signed_thinking() -> None:
    request = to_anthropic(_messages(), target_model="claude-sonnet-4-5")
    assistant = [m["content"] for m in request["messages"] if m["role"] == "assistant"]
    assert assistant == [
        [{"type": "text", "text": "first"}],
        [{"type": "thinking", "thinking": "plan B", "signature": "SIG-SONNET"},
         {"type": "text", "text": "second"}]]
    kept = to_anthropic(_messages())  # no target: everything replayed as before
    assert kept["messages"][1]["content"][0] == {"type": "thinking", "thinking": "plan A",
                                                 "signature": "SIG-OPUS"}
    assert kept["messages"][1]["content"][1] == {"type": "redacted_thinking", "data": "R"}


def test_openai_export_for_another_model_drops_its_reasoning() -> None:
    out = to_openai(_messages(), include_reasoning=True, target_model="claude-opus-4-1")
    assistant = [m for m in out if m["role"] == "assistant"]
    assert assistant[0]["reasoning_content"] == "plan A"
    assert "reasoning_content" not in assistant[1]
    assert assistant[1]["content"] == "second"


def test_without_foreign_reasoning_passes_untouched_messages_through() -> None:
    messages = _messages()
    out = without_foreign_reasoning(messages, "claude-sonnet-4-5")
    assert out[0] is messages[0] and out[3] is messages[3]
    assert out[1] is not messages[1]
    assert messages[1]["content"][0]["signature"] == "SIG-OPUS"  # input not changed


def test_cli_messages_and_export_take_target_model(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    dsh("import", str(_thinking_transcript(tmp_path, "think-1")))
    same = dsh.json("messages", "think-1", "--format", "anthropic", "--target-model",
                    "claude-opus-4-1")
    other = dsh.json("export", "think-1", "--format", "anthropic", "--target-model",
                     "claude-sonnet-4-5")
    assert same["messages"][1]["content"][0]["signature"] == "SIG"
    assert other["messages"][1]["content"] == [{"type": "text", "text": "done"}]

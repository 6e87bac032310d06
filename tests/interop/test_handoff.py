"""Handing a session back: Claude Code files and Codex rollouts that our importers read, the
official Claude Agent SDK lists, and Claude Code -> dsh -> Codex -> dsh -> Claude Code round trips
that keep every tool call, result and reasoning block (docs/standards.md#handing-a-session-back)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dsh._verify import verify_events
from dsh.interop import (
    ImportedSession,
    claude_code_files,
    detect_format,
    handoff_session_id,
    import_file,
    to_codex,
)
from tests.interop.standards import cli, imported, transcript_files


def _write(path: Path, lines: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines),
                    encoding="utf-8")


def _checked(path: Path, fmt: str) -> ImportedSession:
    """Import a written file as our importer would a real one, with the checks it applies."""
    assert detect_format(path) == fmt
    [session] = import_file(path)
    for each in session.walk():
        each.to_session(clock=lambda: 0)  # the seed validates like live appends
        assert verify_events(each.events, header=each.header) == []
    return session


def _to_claude(session: ImportedSession, folder: Path) -> ImportedSession:
    main = folder / f"{handoff_session_id(session)}.jsonl"
    for path, lines in claude_code_files(session, main).items():
        _write(path, lines)
    return _checked(main, "claude-code")


def _to_codex(session: ImportedSession, folder: Path) -> ImportedSession:
    path = folder / f"rollout-{handoff_session_id(session)}.jsonl"
    _write(path, to_codex(session))
    return _checked(path, "codex")


def _arguments(text: str) -> Any:
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return text


def _facts(session: ImportedSession) -> dict[str, list[Any]]:
    """Every tool call, recorded result and reasoning block, in log order."""
    out: dict[str, list[Any]] = {"calls": [], "results": [], "reasoning": []}
    for e in session.events:
        if e.get("ignorable"):
            continue
        data = e["data"]
        if e["type"] == "tool/call":
            out["calls"].append((data["callId"], data["name"], _arguments(data["arguments"])))
        elif e["type"] == "tool/result":  # results an importer supplied are in the view too
            [block] = data["message"]["content"]
            # the result's text (a Codex output is one text: blocks are joined by newlines)
            out["results"].append((block["toolCallId"], "\n".join(
                b["text"] for b in block["content"] if b["type"] == "text" and b["text"])))
        elif e["type"] == "assistant/message":
            out["reasoning"] += [b["text"] for b in data["message"]["content"]
                                 if b["type"] == "reasoning"]
    return out


@pytest.mark.parametrize("name", transcript_files())
def test_round_trip_through_claude_code_and_codex_keeps_calls_results_and_reasoning(
        name: str, tmp_path: Path) -> None:
    for index, original in enumerate(imported(name)):
        want = _facts(original)
        claude = _to_claude(original, tmp_path / f"{index}-claude-1")
        assert _facts(claude) == want
        # subagents come back as subagent files (in file-name order, so compared as a set)
        assert sorted(json.dumps(_facts(s)) for s in claude.walk()) == sorted(
            json.dumps(_facts(s)) for s in original.walk())
        codex = _to_codex(claude, tmp_path / f"{index}-codex")
        assert _facts(codex) == want
        again = _to_claude(codex, tmp_path / f"{index}-claude-2")
        assert _facts(again) == want


def _reasoning_log(provider: str, model: str) -> ImportedSession:
    events = [
        {"type": "turn/start", "seq": 0, "time": 1_700_000_000_000, "data": {"turn": 1}},
        {"type": "step/start", "seq": 1, "time": 1_700_000_000_000,
         "data": {"turn": 1, "step": 1}},
        {"type": "user/message", "seq": 2, "time": 1_700_000_000_000, "surfaceOp": "append",
         "data": {"id": "u", "role": "user", "source": {"kind": "user"},
                  "content": [{"type": "text", "text": "hi"}]}},
        {"type": "assistant/message", "seq": 3, "time": 1_700_000_001_000,
         "surfaceOp": "append",
         "data": {"turn": 1, "step": 1, "message": {
             "id": "a", "role": "assistant",
             "source": {"kind": "model", "provider": provider, "model": model},
             "content": [{"type": "reasoning", "text": "thinking it over", "signature": "SIG",
                          "encryptedContent": "ENC"},
                         {"type": "text", "text": "hello"}]}}},
        {"type": "step/end", "seq": 4, "time": 1_700_000_001_000,
         "data": {"turn": 1, "step": 1}},
        {"type": "turn/end", "seq": 5, "time": 1_700_000_001_000,
         "data": {"turn": 1, "reason": {"kind": "completed"}}},
    ]
    return ImportedSession("s-reasoning", {"version": 0, "id": "s-reasoning",
                                           "createdAt": 1_700_000_000_000}, events)


@pytest.mark.parametrize(("provider", "model", "signed", "encrypted"), [
    ("anthropic", "claude-sonnet-4-5", True, False),
    ("openai", "gpt-5", False, True),
    ("deepseek", "deepseek-reasoner", False, False),
])
def test_reasoning_keeps_its_text_and_only_the_proof_the_target_can_use(
        provider: str, model: str, signed: bool, encrypted: bool, tmp_path: Path) -> None:
    log = _reasoning_log(provider, model)
    [claude_path] = claude_code_files(log, tmp_path / "c.jsonl")
    lines = claude_code_files(log, tmp_path / "c.jsonl")[claude_path]
    [thinking] = [b for line in lines if line["type"] == "assistant"
                  for b in line["message"]["content"] if b["type"] == "thinking"]
    assert thinking["thinking"] == "thinking it over"
    assert ("signature" in thinking) is signed
    [reasoning] = [line["payload"] for line in to_codex(log)
                   if line["type"] == "response_item" and line["payload"]["type"] == "reasoning"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "thinking it over"}]
    assert ("encrypted_content" in reasoning) is encrypted


def test_compaction_summaries_are_kept_as_each_agent_writes_them(tmp_path: Path) -> None:
    from tests.interop.helpers import EXAMPLES

    [original] = import_file(EXAMPLES / "claude-code" / "compacted.jsonl")
    claude = _to_claude(original, tmp_path / "claude")
    codex = _to_codex(original, tmp_path / "codex")
    for session in (claude, codex):
        summaries = [e for e in session.events if e["type"] == "compaction/summary"]
        assert len(summaries) == 1
        messages = session.to_session(clock=lambda: 0).derive_messages()
        assert "server port is 8080" in messages[0]["content"][0]["text"]


def test_install_puts_files_where_each_agent_and_the_claude_sdk_find_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from claude_agent_sdk import get_session_messages, list_sessions

    from tests.interop.helpers import EXAMPLES

    home = Path.home()  # a private HOME for every test (tests/conftest.py)
    dsh = cli(tmp_path / "s.db")
    dsh("import", str(EXAMPLES / "claude-code" / "long-debugging.jsonl"))
    [row] = json.loads(dsh("ls", "--json"))
    dsh("export", "--format", "claude-code", "--install", row["id"])
    dsh("export", "--format", "codex", "--install", row["id"])
    [claude_file] = (home / ".claude" / "projects").rglob("*.jsonl")
    [codex_file] = (home / ".codex" / "sessions").rglob("rollout-*.jsonl")
    _checked(claude_file, "claude-code")
    _checked(codex_file, "codex")
    uid = claude_file.stem
    assert codex_file.name.endswith(f"-{uid}.jsonl")
    assert len(codex_file.relative_to(home / ".codex" / "sessions").parts) == 4  # YYYY/MM/DD/f

    cwd = json.loads(claude_file.read_text().splitlines()[0])["cwd"]
    monkeypatch.delenv("CLAUDE_CONFIG_DIR", raising=False)
    sessions = list_sessions(directory=cwd, include_worktrees=False)
    assert [s.session_id for s in sessions] == [uid]
    messages = get_session_messages(uid, directory=cwd)
    lines = [json.loads(x) for x in claude_file.read_text().splitlines()]
    assert [m.uuid for m in messages] == [x["uuid"] for x in lines
                                          if x["type"] in ("user", "assistant")]
    tool_uses = [b["id"] for m in messages if m.type == "assistant"
                 for b in m.message["content"] if b["type"] == "tool_use"]
    assert len(tool_uses) == 6


def test_install_refuses_formats_without_a_place_and_an_output_file(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.interop.helpers import EXAMPLES

    dsh = cli(tmp_path / "s.db")
    dsh("import", str(EXAMPLES / "claude-code" / "simple.jsonl"))
    [row] = json.loads(dsh("ls", "--json"))
    for args in (["--format", "atif", "--install"],
                 ["--format", "codex", "--install", "-o", str(tmp_path / "x.jsonl")]):
        proc = subprocess.run([sys.executable, "-m", "dsh.cli", "export", *args, row["id"],
                               "--store", str(tmp_path / "s.db")], capture_output=True,
                              text=True, timeout=120, check=False)
        assert proc.returncode != 0
        assert "--install" in proc.stderr


def _turn_ends(session: ImportedSession) -> list[Any]:
    return [(e["data"]["turn"], e["data"]["reason"]) for e in session.events
            if e["type"] == "turn/end"]


@pytest.mark.parametrize("name", ["codex/rollout-compacted-aborted.jsonl",
                                  "claude-code/interrupted.jsonl"])
def test_a_turn_the_person_stopped_comes_back_stopped_through_both_agents(
        name: str, tmp_path: Path) -> None:
    # docs/standards.md#handing-a-session-back: before, the exports wrote only the messages,
    # so a Codex turn ended by turn_aborted came back open (its last line a tool result); each
    # export now writes the agent's own marker after the turn's last message
    from dsh.interop._history import history
    from tests.cli.test_cli import EXAMPLES

    [original] = import_file(EXAMPLES / "transcripts" / name)
    want = _turn_ends(original)
    assert {"kind": "aborted", "reason": {"kind": "user"}} in [r for _, r in want]
    claude = _to_claude(original, tmp_path / "claude")
    codex = _to_codex(original, tmp_path / "codex")
    assert _turn_ends(claude) == want and _turn_ends(codex) == want
    again = _to_claude(_to_codex(claude, tmp_path / "codex-2"), tmp_path / "claude-2")
    assert _turn_ends(again) == want
    # the Claude Code file holds one interrupt line per stopped turn, never two
    texts = [b["text"] for m in history(claude.events) if m.message.get("role") == "user"
             for b in m.message["content"] if b["type"] == "text"
             and b["text"].startswith("[Request interrupted by user")]
    assert len(texts) == [r["kind"] for _, r in want].count("aborted")


def test_a_stopped_turn_with_no_message_marks_no_other_turn(tmp_path: Path) -> None:
    # docs/standards.md#handing-a-session-back: a continuation (run() without a prompt) stopped
    # before the model's first output ends aborted with no message of its own; before, its
    # marker followed the previous turn's last message, so that completed turn came back
    # aborted through Claude Code (a marker for a turn with no message in the export)
    from dsh.interop._history import SessionLog
    from dsh.testing import LogBuilder

    log = LogBuilder("s")
    log.completed_turn("first prompt")
    log.turn_start(2)
    log.step_start(2, 1)
    log.step_end(2, 1)
    log.add("turn/end", {"turn": 2, "reason": {"kind": "aborted", "reason": {"kind": "user"}}})
    log.turn_start(3)
    log.step_start(3, 1)
    log.user("stop me")
    log.assistant(3, 1, [("c1", "bash")], "running")
    log.tool_call(3, 1, "c1")
    log.tool_result(3, 1, "c1")
    log.step_end(3, 1)
    log.add("turn/end", {"turn": 3, "reason": {"kind": "aborted", "reason": {"kind": "user"}}})
    stored = SessionLog({"version": 0, "id": "s", "createdAt": 0},
                        [dict(e) for e in log.events])
    main = tmp_path / "claude" / f"{handoff_session_id(stored)}.jsonl"
    for path, lines in claude_code_files(stored, main).items():
        _write(path, lines)
    rollout = tmp_path / "codex" / f"rollout-{handoff_session_id(stored)}.jsonl"
    codex_lines = to_codex(stored)
    _write(rollout, codex_lines)
    stopped = {"kind": "aborted", "reason": {"kind": "user"}}
    want = [(1, {"kind": "completed"}), (2, stopped)]  # turn 2 left no line: 3 is the second
    assert _turn_ends(_checked(main, "claude-code")) == want
    assert _turn_ends(_checked(rollout, "codex")) == want
    assert [line["payload"]["type"] for line in codex_lines
            if line["type"] == "event_msg"].count("turn_aborted") == 1
    markers = [line for line in map(json.loads, main.read_text().splitlines())
               if line.get("message", {}).get("content") == [
                   {"type": "text", "text": "[Request interrupted by user]"}]]
    assert len(markers) == 1


def test_a_stopped_turn_end_without_its_start_marks_no_other_turn(tmp_path: Path) -> None:
    # docs/standards.md#handing-a-session-back: a marker follows a message of the stopped turn
    # itself. A turn/end with no turn/start of its own after the previous turn/end (a damaged
    # log: the session accepts it, verify names it TURN_MISMATCH) stopped no message of the
    # export; before, its abort was tied to the previous turn's start, so that completed turn
    # came back aborted through both agents
    from dsh.interop._history import SessionLog
    from dsh.testing import LogBuilder

    log = LogBuilder("s")
    log.completed_turn("first prompt")
    log.add("turn/end", {"turn": 2, "reason": {"kind": "aborted", "reason": {"kind": "user"}}})
    stored = SessionLog({"version": 0, "id": "s", "createdAt": 0},
                        [dict(e) for e in log.events])
    main = tmp_path / "claude" / f"{handoff_session_id(stored)}.jsonl"
    files = claude_code_files(stored, main)
    for path, lines in files.items():
        _write(path, lines)
    codex_lines = to_codex(stored)
    assert _turn_ends(_checked(main, "claude-code")) == [(1, {"kind": "completed"})]
    assert not [line for line in codex_lines if line["type"] == "event_msg"
                and line["payload"]["type"] == "turn_aborted"]
    assert "[Request interrupted by user" not in main.read_text()

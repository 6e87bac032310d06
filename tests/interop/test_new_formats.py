"""Gemini CLI recordings and OpenHands resolver output, and unknown formats named
(docs/interop.md#importers). The fixtures in ``fixtures/`` are our own, written after the published
formats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dsh._errors import ImportFormatError
from dsh._verify import verify_events
from dsh.interop import FORMATS, detect_format, import_file, to_anthropic, to_openai
from dsh.interop import validate_conversation as problems
from tests.cli.test_cli import Dsh
from tests.interop.helpers import facts, live

FIXTURES = Path(__file__).parent / "fixtures"
GEMINI = FIXTURES / "gemini-cli" / "session-2025-10-02T09-14-7f3c2a10.json"
RESOLVER = FIXTURES / "openhands-resolver" / "output.jsonl"


def _valid(path: Path, fmt: str) -> list[Any]:
    sessions = import_file(path, fmt)
    for s in sessions:
        assert verify_events(s.events, header=s.header) == []
        messages = s.to_session(clock=lambda: 0).derive_messages()
        assert problems(to_openai(messages), "openai") == []
        assert problems(to_anthropic(messages), "anthropic") == []
    return sessions


def test_gemini_cli_recording_maps_prompts_thoughts_calls_and_results() -> None:
    assert detect_format(GEMINI) == "gemini-cli"
    [session] = _valid(GEMINI, "gemini-cli")
    assert session.session_id == "7f3c2a10-5b1e-4c8d-9a2f-1e6b4d0c9a77"
    assert session.header["createdAt"] == 1759396443120  # startTime
    assert facts(session) == {"prompts": 2, "calls": 3, "results": 3, "compactions": 0,
                              "children": 0, "turns": 2, "open_last_turn": False,
                              "last_end": "aborted"}
    first = next(e["data"] for e in live(session) if e["type"] == "assistant/message")
    assert first["message"]["source"] == {"kind": "model", "provider": "google",
                                          "model": "gemini-2.5-pro"}
    assert first["message"]["content"][0] == {
        "type": "reasoning", "subject": "Reproducing first",
        "text": "Before reading code I should see the actual error output."}
    assert first["usage"] == {"inputTokens": 8123, "outputTokens": 61, "cacheReadTokens": 4096,
                              "reasoningTokens": 220}
    results = [e["data"] for e in live(session) if e["type"] == "tool/result"]
    blocks = [r["message"]["content"][0] for r in results]
    assert blocks[0]["content"][0]["text"].endswith("Cannot find module 'vitest'\nExit Code: 1")
    assert [b["isError"] for b in blocks] == [False, True, True]
    assert blocks[1]["content"] == [{"type": "text",
                                     "text": "File not found: /home/dev/app/package.json"}]
    assert results[2]["error"]["code"] == "ABORTED"
    assert [e["data"] for e in session.events if e["type"] == "session/title"] == [
        {"title": "Fix npm test on a clean checkout"}]
    notices = [e["data"]["content"] for e in session.events
               if e["type"] == "import/gemini-cli/info"]
    assert notices == ["Request cancelled."]


def test_openhands_resolver_output_reads_every_history_layout() -> None:
    assert detect_format(RESOLVER) == "openhands-resolver"
    older, pairs, v0 = _valid(RESOLVER, "openhands-resolver")
    assert [facts(s)["calls"] for s in (older, pairs, v0)] == [3, 2, 2]
    for session in (older, pairs, v0):
        assert facts(session)["last_end"] == "completed"
        [output] = [e["data"] for e in session.events
                    if e["type"] == "import/openhands-resolver/output"]
        assert output["git_patch"].startswith("diff --git")
        assert "history" not in output
    calls = [e["data"] for e in live(older) if e["type"] == "tool/call"]
    assert [(c["callId"], c["name"]) for c in calls] == [("call-1", "run"), ("call-3", "think"),
                                                         ("call-5", "finish")]
    first_result = next(e["data"] for e in live(older) if e["type"] == "tool/result")
    assert first_result["message"]["content"][0]["content"] == [
        {"type": "text", "text": "12:    return data['name']"}]
    prompt = next(e["data"] for e in live(older) if e["type"] == "user/message")
    assert prompt["content"][0]["text"].startswith("Please fix the following issue")
    v0_calls = [e["data"]["callId"] for e in live(v0) if e["type"] == "tool/call"]
    assert v0_calls == ["toolu_01", "toolu_02"]
    assert len({s.session_id for s in (older, pairs, v0)}) == 3


def test_openhands_resolver_single_json_document(tmp_path: Path) -> None:
    record = json.loads(RESOLVER.read_text().splitlines()[0])
    path = tmp_path / "output.json"
    path.write_text(json.dumps(record))
    assert detect_format(path) == "openhands-resolver"
    [session] = _valid(path, "openhands-resolver")
    assert facts(session)["calls"] == 3


def test_openhands_resolver_bad_history_entry_names_it(tmp_path: Path) -> None:
    path = tmp_path / "output.jsonl"
    path.write_text(json.dumps({"issue": {}, "git_patch": "", "history": [{"action": "run"},
                                                                          [1, 2]]}) + "\n")
    with pytest.raises(ImportFormatError, match=r"output.jsonl:1: openhands-resolver history "
                       r"entry 1 must be an event object or an \[action, observation\] pair"
                       ) as info:
        import_file(path, "openhands-resolver")
    assert info.value.where["json_path"] == "$.history[1]"


@pytest.mark.parametrize(("name", "doc"), [
    ("chats.json", {"conversations": [{"turns": 3}]}),
    ("messages.json", {"messages": [{"speaker": "me", "text": "hi"}]}),
    ("notes.jsonl", None),
])
def test_unknown_format_is_named_not_misread(tmp_path: Path, name: str, doc: Any) -> None:
    path = tmp_path / name
    if doc is None:
        path.write_text('{"event": "start"}\n{"event": "stop"}\n')
    else:
        path.write_text(json.dumps(doc))
    with pytest.raises(ImportFormatError, match="not a supported transcript format") as info:
        import_file(path)
    assert f"supported: {', '.join(FORMATS)}" in info.value.message
    assert info.value.where["format"] == "auto"


def test_cli_imports_the_new_formats(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    report = json.loads(dsh("import", "--json", str(GEMINI), str(RESOLVER)).stdout)
    assert sorted(x["format"] for x in report["imported"]) == [
        "gemini-cli", "openhands-resolver", "openhands-resolver", "openhands-resolver"]
    rows = {r["id"]: r for r in dsh.json("ls", "--json")}
    assert rows["7f3c2a10-5b1e-4c8d-9a2f-1e6b4d0c9a77"]["title"] == (
        "Fix npm test on a clean checkout")
    dsh("verify", "--all")

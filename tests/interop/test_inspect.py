"""Inspect AI eval logs: `inspect_ai.log.read_eval_log` reads the export of every transcript, one
sample per session, with the model view's messages and tool calls (docs/standards.md#inspect-ai)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from inspect_ai.log import read_eval_log

from dsh.interop import to_inspect_log
from tests.interop.standards import cli, fixture_logs, imported, transcript_files, view


def _read(doc: dict[str, Any], path: Path) -> Any:
    path.write_text(json.dumps(doc), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Inspect's own, on import paths
        return read_eval_log(str(path))


def _check(log: Any, sessions: list[Any]) -> None:
    assert [s.id for s in log.samples] == [s.header["id"] for s in sessions]
    for sample, session in zip(log.samples, sessions, strict=True):
        messages = [json.loads(m) for m in view(session)]
        assert len(sample.messages) == len(messages)
        assert [m.role for m in sample.messages] == [
            "tool" if m["source"].get("kind") == "tool" else m["role"] for m in messages]
        want_calls = [b["id"] for m in messages for b in m["content"] if b["type"] == "tool-call"]
        got_calls = [c.id for m in sample.messages if m.role == "assistant"
                     for c in m.tool_calls or []]
        assert got_calls == want_calls
        results = [m.tool_call_id for m in sample.messages if m.role == "tool"]
        assert results == [m["source"]["callId"] for m in messages
                           if m["source"].get("kind") == "tool"]
        answers = sum(1 for e in session.events if e["type"] == "assistant/message"
                      and e["data"]["message"]["content"])
        assert sum(1 for e in sample.events if e.event == "model") == answers
        history_calls = sum(1 for e in session.events if e["type"] == "assistant/message"
                            for b in e["data"]["message"]["content"]
                            if b["type"] == "tool-call")
        assert sum(1 for e in sample.events if e.event == "tool") == history_calls


@pytest.mark.parametrize("name", transcript_files())
def test_read_eval_log_reads_the_export_of_every_transcript(name: str, tmp_path: Path) -> None:
    for top in imported(name):
        log = _read(to_inspect_log(top), tmp_path / "log.json")
        assert log.status == "success"
        _check(log, list(top.walk()))


def test_read_eval_log_reads_the_export_of_dsh_written_stores(tmp_path: Path) -> None:
    for name, session in fixture_logs(tmp_path):
        log = _read(to_inspect_log(session), tmp_path / f"{name}.json")
        _check(log, [session])
        usage = log.samples[0].model_usage
        assert usage and all(u.output_tokens > 0 for u in usage.values())


def test_cli_exports_an_eval_log_inspect_reads(tmp_path: Path) -> None:
    from tests.interop.helpers import EXAMPLES

    dsh = cli(tmp_path / "s.db")
    dsh("import", str(EXAMPLES / "claude-code" / "long-debugging.jsonl"))
    [row] = json.loads(dsh("ls", "--json"))
    out = tmp_path / "eval.json"
    dsh("export", "--format", "inspect", row["id"], "-o", str(out))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        log = read_eval_log(str(out))
    [sample] = log.samples
    assert sample.id == row["id"]
    assert len(sample.messages) == len(json.loads(dsh("messages", row["id"])))


def test_inspect_export_of_arguments_no_json_reader_keeps_is_exact(tmp_path: Path) -> None:
    # docs/standards.md#inspect-ai: Inspect's ToolCall.arguments is a JSON object; a number
    # beyond ±(2^53-1) was written raw (Inspect's viewer, a JavaScript reader, rounds it) and
    # NaN/Infinity as tokens that are not JSON. Now: their decimal text in `arguments`, the
    # exact text in the assistant message's metadata.dsh.arguments_text, and read_eval_log
    # reads the file
    from tests.interop.standards import UNSAFE_ARGUMENTS, strict_json, write_unsafe_calls

    db = tmp_path / "s.db"
    write_unsafe_calls(db)
    out = tmp_path / "eval.json"
    cli(db)("export", "--format", "inspect", "ids", "-o", str(out))
    doc = strict_json(out.read_text(encoding="utf-8"))

    def ints(value: Any) -> Iterator[int]:
        if isinstance(value, dict | list):
            for item in value.values() if isinstance(value, dict) else value:
                yield from ints(item)
        elif type(value) is int:
            yield value

    assert all(abs(n) <= 2**53 - 1 for n in ints(doc))
    safe = {"big": {"id": "12345678901234567890123", "n": 1.0},
            "nan": {"x": "nan", "y": ["-inf", 2]}, "plain": {"path": "a.txt"}}
    [sample] = doc["samples"]
    [answer] = [m for m in sample["messages"] if m.get("tool_calls")]
    assert {c["id"]: c["arguments"] for c in answer["tool_calls"]} == safe
    assert answer["metadata"] == {"dsh": {"arguments_text": {
        "big": UNSAFE_ARGUMENTS["big"], "nan": UNSAFE_ARGUMENTS["nan"]}}}
    assert {e["id"]: e["arguments"] for e in sample["events"] if e["event"] == "tool"} == safe
    log = _read(doc, tmp_path / "again.json")
    [read] = [m for m in log.samples[0].messages if m.role == "assistant" and m.tool_calls]
    assert {c.id: c.arguments for c in read.tool_calls} == safe
    assert read.metadata == answer["metadata"]


def test_arguments_nested_deeper_than_the_walk_export_as_their_exact_text(
        tmp_path: Path) -> None:
    # docs/standards.md: arguments JSON parses (600 levels) but the number walk (safe_numbers)
    # ran out of stack: `dsh export --format inspect|atif` exited 1 with an unexpected
    # RecursionError. Now such arguments ride as their exact text, as unparsable ones do.
    from tests.interop.standards import strict_json, write_unsafe_calls

    deep = '{"a":' * 600 + "12345678901234567890123" + "}" * 600
    db = tmp_path / "s.db"
    write_unsafe_calls(db, {"deep": deep, "plain": '{"path": "a.txt"}'})
    out = tmp_path / "eval.json"
    cli(db)("export", "--format", "inspect", "ids", "-o", str(out))
    [sample] = strict_json(out.read_text(encoding="utf-8"))["samples"]
    [answer] = [m for m in sample["messages"] if m.get("tool_calls")]
    assert {c["id"]: c["arguments"] for c in answer["tool_calls"]} == {
        "deep": {"_raw_arguments": deep}, "plain": {"path": "a.txt"}}
    atif = tmp_path / "atif.json"
    cli(db)("export", "--format", "atif", "ids", "-o", str(atif))
    assert deep in [c.get("extra", {}).get("arguments_text")
                    for step in strict_json(atif.read_text())["steps"]
                    for c in step.get("tool_calls") or ()]

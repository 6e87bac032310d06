"""ATIF trajectories: every session exports to a document the published `atif` models validate,
tool calls and observations reference each other, and importing the export gives back the same
model view (docs/standards.md#atif)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from atif import Trajectory

from dsh.interop import ATIF_VERSION, detect_format, import_file, to_atif, validate_atif
from tests.interop.helpers import REPO
from tests.interop.standards import fixture_logs, imported, transcript_files, view

FOREIGN = REPO / "tests" / "interop" / "fixtures" / "atif" / "tool-call-and-subagent.json"
"""A trajectory as another agent writes one (no dsh extras), in our own words."""


def _check_references(doc: dict[str, Any]) -> None:
    model = Trajectory.model_validate(doc)  # the published models, as a consumer reads it
    assert model.schema_version == ATIF_VERSION
    for step in model.steps:
        calls = {c.tool_call_id for c in step.tool_calls or []}
        for result in (step.observation.results if step.observation else []):
            if result.source_call_id is not None:
                assert result.source_call_id in calls
    for sub in doc.get("subagent_trajectories") or []:
        _check_references(sub)


def _round_trip(log: Any, tmp_path: Path) -> Any:
    doc = to_atif(log)
    _check_references(doc)
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    assert detect_format(path) == "atif"
    [back] = import_file(path)
    return doc, back


@pytest.mark.parametrize("name", transcript_files())
def test_atif_round_trip_keeps_the_model_view_of_every_transcript(name: str,
                                                                   tmp_path: Path) -> None:
    for top in imported(name):
        doc, back = _round_trip(top, tmp_path)
        pairs = list(zip(top.walk(), back.walk(), strict=True))  # subagents come back too
        for original, again in pairs:
            assert view(again) == view(original)
            again.to_session(clock=lambda: 0)  # the seed validates like live appends
        calls = sum(1 for s in top.walk() for e in s.events if e["type"] == "tool/call")
        exported = sum(len(st.get("tool_calls") or []) for t in _walk(doc) for st in t["steps"])
        assert exported == calls


def _walk(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [doc, *(t for sub in doc.get("subagent_trajectories") or [] for t in _walk(sub))]


def test_atif_round_trip_of_dsh_written_stores(tmp_path: Path) -> None:
    names = []
    for name, log in fixture_logs(tmp_path):
        _, back = _round_trip(log, tmp_path)
        assert view(back) == view(log), name
        names.append(name)
    assert names == ["s1-normal", "s4-fork-of-s1", "s5-compaction"]


def test_atif_compaction_keeps_the_tail_it_did_not_summarise(tmp_path: Path) -> None:
    [(_, log)] = [(n, lg) for n, lg in fixture_logs(tmp_path) if n == "s5-compaction"]
    doc = to_atif(log)
    checkpoints = [s for s in doc["steps"] if "shadows" in s["extra"]["dsh"]]
    assert len(checkpoints) == 1
    first, last = checkpoints[0]["extra"]["dsh"]["shadows"]
    ids = [s["extra"]["dsh"].get("id") for s in doc["steps"]]
    assert ids.index(first) < ids.index(last) < ids.index(checkpoints[0]["extra"]["dsh"]["id"])


def test_atif_export_maps_usage_reasoning_and_errors() -> None:
    from dsh.interop import SessionLog

    events = [
        {"type": "turn/start", "seq": 0, "time": 1_700_000_000_000, "data": {"turn": 1}},
        {"type": "step/start", "seq": 1, "time": 1_700_000_000_000, "data": {"turn": 1, "step": 1}},
        {"type": "user/message", "seq": 2, "time": 1_700_000_000_001, "surfaceOp": "append",
         "data": {"id": "u1", "role": "user", "content": [{"type": "text", "text": "hi"}],
                  "source": {"kind": "user"}}},
        {"type": "assistant/message", "seq": 3, "time": 1_700_000_000_500, "surfaceOp": "append",
         "data": {"turn": 1, "step": 1, "usage": {"inputTokens": 10, "outputTokens": 4,
                                                   "cacheReadTokens": 90, "cacheWriteTokens": 5},
                  "message": {"id": "a1", "role": "assistant", "source": {
                      "kind": "model", "provider": "anthropic", "model": "claude-x"},
                      "content": [{"type": "reasoning", "text": "think", "signature": "sig"},
                                  {"type": "tool-call", "id": "c1", "name": "read",
                                   "arguments": "{\"path\": \"a\"}"}]}}},
        {"type": "tool/call", "seq": 4, "time": 1_700_000_000_501,
         "data": {"turn": 1, "step": 1, "callId": "c1", "name": "read",
                  "arguments": "{\"path\": \"a\"}"}},
        {"type": "tool/result", "seq": 5, "time": 1_700_000_000_502, "surfaceOp": "append",
         "sourceEventSeqs": [4],
         "data": {"turn": 1, "step": 1, "error": {"name": "E", "code": "NOT_FOUND"},
                  "message": {"id": "r1", "role": "user", "source": {"kind": "tool",
                                                                     "callId": "c1"},
                              "content": [{"type": "tool-result", "toolCallId": "c1",
                                           "isError": True, "content": [
                                               {"type": "text", "text": "no such file"}]}]}}},
    ]
    doc = to_atif(SessionLog({"version": 0, "id": "s", "createdAt": 1_700_000_000_000}, events))
    validate_atif(doc)
    user, agent = doc["steps"]
    assert user == {"step_id": 1, "timestamp": "2023-11-14T22:13:20.001Z", "source": "user",
                    "message": "hi", "extra": {"dsh": {"id": "u1", "source": {"kind": "user"}}}}
    assert agent["reasoning_content"] == "think"
    assert agent["model_name"] == "claude-x"
    assert agent["tool_calls"] == [{"tool_call_id": "c1", "function_name": "read",
                                    "arguments": {"path": "a"}}]
    assert agent["metrics"] == {"prompt_tokens": 105, "completion_tokens": 4,
                                "cached_tokens": 90, "extra": {"cache_creation_tokens": 5}}
    [result] = agent["observation"]["results"]
    assert result["source_call_id"] == "c1"
    assert result["content"] == "no such file"
    assert result["extra"]["is_error"] is True
    assert result["extra"]["error"] == {"name": "E", "code": "NOT_FOUND"}
    # the signature has no ATIF field: the exact blocks ride in extra.dsh
    assert agent["extra"]["dsh"]["content"][0]["signature"] == "sig"
    assert doc["final_metrics"]["total_prompt_tokens"] == 105


def test_atif_import_of_a_foreign_trajectory_with_a_subagent(tmp_path: Path) -> None:
    doc = json.loads(FOREIGN.read_text(encoding="utf-8"))
    Trajectory.model_validate(doc)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    [session] = import_file(path)
    messages = [json.loads(m) for m in view(session)]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "user",
                                             "assistant"]
    assert messages[2]["content"] == [
        {"type": "reasoning", "text": "hm"}, {"type": "text", "text": "running"},
        {"type": "tool-call", "id": "t1", "name": "bash", "arguments": "{\"cmd\": \"ls\"}"}]
    assert messages[3]["content"][0]["toolCallId"] == "t1"
    assert messages[4]["source"]["form"] == "relay"
    usage = [e["data"].get("usage") for e in session.events if e["type"] == "assistant/message"]
    assert usage == [{"inputTokens": 40, "outputTokens": 7, "cacheReadTokens": 60}, None]
    [child] = session.children
    assert child.header["parentSession"] == session.session_id
    assert child.header["origin"] == "subagent"
    assert [json.loads(m)["role"] for m in view(child)] == ["user", "assistant"]


def test_atif_import_refuses_a_document_without_steps(tmp_path: Path) -> None:
    from dsh import ImportFormatError

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schema_version": "ATIF-v1.8", "agent": {}}), encoding="utf-8")
    with pytest.raises(ImportFormatError) as caught:
        import_file(path, format="atif")
    assert caught.value.where["path"] == str(path)


def test_cli_exports_atif_and_imports_it_back_as_a_verified_session(tmp_path: Path) -> None:
    from tests.interop.helpers import EXAMPLES
    from tests.interop.standards import cli

    dsh = cli(tmp_path / "s.db")

    dsh("import", str(EXAMPLES / "claude-code" / "long-debugging.jsonl"))
    [row] = json.loads(dsh("ls", "--json"))
    out = tmp_path / "t.json"
    dsh("export", "--format", "atif", row["id"], "-o", str(out))
    validate_atif(json.loads(out.read_text(encoding="utf-8")))
    assert "(atif)" in dsh("import", str(out))
    rows = json.loads(dsh("ls", "--json"))
    [again] = [r for r in rows if r["sourceFormat"] == "atif"]
    dsh("verify", again["id"])
    assert json.loads(dsh("messages", again["id"])) == json.loads(dsh("messages", row["id"]))


def test_atif_export_of_arguments_no_json_reader_keeps_imports_back_exactly(
        tmp_path: Path) -> None:
    """A call's arguments holding an integer beyond ±(2^53-1) (a snowflake id) or NaN made an
    export dsh's own import refused ('beyond ±(2^53-1)'): such a number is its decimal text in
    the ATIF object, the exact arguments ride in ``extra.arguments_text``."""
    from tests.interop.standards import UNSAFE_ARGUMENTS as arguments
    from tests.interop.standards import cli, strict_json, write_unsafe_calls

    db = tmp_path / "s.db"
    write_unsafe_calls(db)
    dsh = cli(db)
    out = tmp_path / "t.json"
    dsh("export", "--format", "atif", "ids", "-o", str(out))
    doc = strict_json(out.read_text(encoding="utf-8"))
    validate_atif(doc)
    calls = {c["tool_call_id"]: c for st in doc["steps"] for c in st.get("tool_calls") or []}
    assert calls["big"]["arguments"] == {"id": "12345678901234567890123", "n": 1.0}
    assert calls["nan"]["arguments"] == {"x": "nan", "y": ["-inf", 2]}
    assert [calls[n].get("extra", {}).get("arguments_text") for n in arguments] == [
        arguments["big"], arguments["nan"], None]
    assert "(atif)" in dsh("import", str(out))
    [again] = [r["id"] for r in json.loads(dsh("ls", "--json")) if r["sourceFormat"] == "atif"]
    dsh("verify", again)
    assert json.loads(dsh("messages", again)) == json.loads(dsh("messages", "ids"))


def test_cli_export_leaves_a_fork_out_of_the_subagents(tmp_path: Path) -> None:
    # a fork is a session of its own (docs/standards.md): bundling it as a subagent made its
    # import read "subagent of" the parent
    from tests.interop.helpers import EXAMPLES
    from tests.interop.standards import cli

    dsh = cli(tmp_path / "s.db")
    dsh("import", str(EXAMPLES / "claude-code" / "long-debugging.jsonl"))
    [row] = json.loads(dsh("ls", "--json"))
    dsh("fork", row["id"], "--at", "6", "--as", "branch-a")
    out = tmp_path / "t.json"
    dsh("export", "--format", "atif", row["id"], "-o", str(out))
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert "branch-a" not in json.dumps(doc.get("subagent_trajectories") or [])
    assert "branch-a" not in out.read_text(encoding="utf-8")

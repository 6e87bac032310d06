"""Reproducers of the untyped importer failures found by fuzzing, pinned.

Each case once raised a bare Python exception (unhashable list, ``int()`` of text, recursion,
``UnicodeEncodeError``); now it imports, or fails with an ``ImportFormatError`` naming the file,
the line and what was wrong.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from dsh._errors import ImportFormatError
from dsh.interop import import_file
from dsh.interop._common import MAX_RECORD_DEPTH, UNMAPPED_CODE, EventBuilder, ImportedSession
from tests.interop.helpers import EXAMPLES


def _jsonl(tmp_path: Path, name: str, records: list[Any]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8",
                    errors="surrogatepass")
    return path


def _claude(uuid: Any = "u1", session: Any = "s1", **message: Any) -> dict[str, Any]:
    return {"type": "user", "uuid": uuid, "parentUuid": None, "sessionId": session,
            "timestamp": "2025-06-01T10:00:00Z",
            "message": {"role": "user", "content": "hello", **message}}


def _seed(imported: list[ImportedSession]) -> list[ImportedSession]:
    for top in imported:
        for session in top.walk():
            session.to_session(clock=lambda: 0)
    return imported


def test_openai_role_that_is_a_list_names_the_message(tmp_path: Path) -> None:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps([{"role": ["system"], "content": "x"}]))
    with pytest.raises(ImportFormatError, match=r"message 0 must be an object with role") as info:
        import_file(path, "openai-chat")
    assert info.value.where == {"path": str(path), "line": 1, "format": "openai-chat",
                                "json_path": "$[0]"}


def test_openai_tool_calls_that_is_a_number_names_the_message(tmp_path: Path) -> None:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps([{"role": "user", "content": "hi"},
                                {"role": "assistant", "content": "", "tool_calls": 1.5}]))
    with pytest.raises(ImportFormatError, match=r"message 1 has tool_calls that is not a list"
                       r" \(found float\)") as info:
        import_file(path, "openai-chat")
    assert info.value.where["json_path"] == "$[1].tool_calls"


def test_openai_tool_call_without_id_is_answered_by_nothing_but_still_seeds(
        tmp_path: Path) -> None:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "", "type": "function", "function": {"name": "ls",
                                                                     "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "", "content": "a b"}]))
    [session] = _seed(import_file(path, "openai-chat"))
    call = next(e for e in session.events if e["type"] == "tool/call")
    assert call["data"]["callId"].endswith(":call-0")  # derived: the source gave none


def test_codex_type_that_is_an_object_is_kept_as_unknown(tmp_path: Path) -> None:
    source = (EXAMPLES / "codex" / "rollout-compacted-aborted.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in source]
    records.insert(2, {"type": {"x": 1}, "payload": {}})
    path = _jsonl(tmp_path, "rollout.jsonl", records)
    for fmt in ("codex", "auto"):
        [session] = _seed(import_file(path, fmt))
        kept = [e for e in session.events if e["type"] == "import/codex/unknown"]
        assert kept[0]["data"] == {"type": {"x": 1}, "payload": {}}


@pytest.mark.parametrize(("usage", "expected"), [
    ({"input_tokens": "abc", "output_tokens": 5}, {"inputTokens": 0, "outputTokens": 5}),
    ({"input_tokens": "12", "output_tokens": 2.0}, {"inputTokens": 12, "outputTokens": 2}),
    ({"input_tokens": -3, "output_tokens": [1], "cache_read_input_tokens": 1e300},
     {"inputTokens": 0, "outputTokens": 0, "cacheReadTokens": 0}),
])
def test_claude_code_bad_usage_numbers_count_zero(tmp_path: Path, usage: dict[str, Any],
                                                  expected: dict[str, int]) -> None:
    reply = {"type": "assistant", "uuid": "a1", "parentUuid": "u1", "sessionId": "s1",
             "timestamp": "2025-06-01T10:00:01Z",
             "message": {"id": "m1", "role": "assistant", "model": "claude-x",
                         "content": [{"type": "text", "text": "hi"}], "usage": usage}}
    path = _jsonl(tmp_path, "s1.jsonl", [_claude(), reply])
    [session] = _seed(import_file(path, "claude-code"))
    message = next(e for e in session.events if e["type"] == "assistant/message")
    assert message["data"]["usage"] == expected


def test_claude_code_lone_surrogate_session_id_gets_a_derived_id(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, "s.jsonl", [_claude(session="s\ud800"), _claude(
        uuid="u\udfff", session="s\ud800")])
    [session] = _seed(import_file(path, "claude-code"))
    session.session_id.encode("utf-8")  # a usable id for every store
    assert session.session_id != "s\ud800"
    kept = [e for e in session.events if e["type"] == "import/claude-code/envelope"]
    assert kept[0]["data"]["sessionId"] == "s\ud800"  # the raw record keeps the source's id


@pytest.mark.parametrize("field", ["uuid", "parentUuid"])
def test_claude_code_ids_that_are_lists_are_not_ids(tmp_path: Path, field: str) -> None:
    record = _claude()
    record[field] = ["x"]
    path = _jsonl(tmp_path, "s1.jsonl", [_claude(uuid="u0"), record])
    [session] = _seed(import_file(path, "claude-code"))
    assert session.session_id == "s1"


def test_claude_code_message_id_that_is_an_object_does_not_merge(tmp_path: Path) -> None:
    reply = {"type": "assistant", "uuid": "a1", "parentUuid": "u1", "sessionId": "s1",
             "message": {"id": {"x": 1}, "role": "assistant",
                         "content": [{"type": "tool_use", "id": ["t"], "name": "ls",
                                      "input": {}}]}}
    path = _jsonl(tmp_path, "s1.jsonl", [_claude(), reply])
    _seed(import_file(path, "claude-code"))


def test_deep_nesting_is_refused_naming_the_line(tmp_path: Path) -> None:
    depth = MAX_RECORD_DEPTH + 1
    deep = "[" * depth + "]" * depth
    path = tmp_path / "s1.jsonl"
    path.write_text(json.dumps(_claude()) + "\n" + '{"type": "user", "x": ' + deep + "}\n")
    for fmt in ("claude-code", "codex", "auto"):
        at = re.escape(str(path))
        with pytest.raises(ImportFormatError, match=rf"^{at}:2: .*record nests JSON deeper "
                           rf"than {MAX_RECORD_DEPTH} levels") as info:
            import_file(path, fmt)
        assert info.value.where["line"] == 2


def test_deep_nesting_in_a_document_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "chat.json"
    path.write_text('[{"role": "user", "content": ' + "[" * 5000 + "]" * 5000 + "}]")
    with pytest.raises(ImportFormatError, match="nests JSON deeper"):
        import_file(path, "openai-chat")


def test_huge_timestamp_is_ignored_not_written(tmp_path: Path) -> None:
    record = _claude()
    record["timestamp"] = 1e300
    path = _jsonl(tmp_path, "s1.jsonl", [record])
    [session] = _seed(import_file(path, "claude-code"))
    assert all(0 <= e["time"] < 2**53 for e in session.events)


def test_unmapped_shape_is_a_typed_error_naming_the_line(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The backstop: a shape no check covers names the file and line (code IMPORT_UNMAPPED)."""
    path = _jsonl(tmp_path, "s1.jsonl", [_claude()])

    def broken(self: EventBuilder, *args: Any, **kwargs: Any) -> int:
        raise TypeError("unhashable type: 'list'")

    monkeypatch.setattr(EventBuilder, "user", broken)
    at = re.escape(str(path))
    with pytest.raises(ImportFormatError, match=rf"^{at}:1: claude-code transcript has a "
                       r"record this importer cannot map \(TypeError: unhashable type: "
                       r"'list'\)") as info:
        import_file(path, "claude-code")
    assert info.value.code == UNMAPPED_CODE
    assert info.value.where == {"path": str(path), "line": 1, "format": "claude-code"}


def test_dsh_log_event_refused_by_the_session_names_its_line(tmp_path: Path) -> None:
    lines = (EXAMPLES / "dsh" / "session.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines]
    records[3]["data"] = {"turn": "one"}
    path = _jsonl(tmp_path, "log.jsonl", records)
    at = re.escape(str(path))
    with pytest.raises(ImportFormatError, match=rf"^{at}:4: dsh log breaks a log rule: "
                       ) as info:
        import_file(path, "dsh")
    assert info.value.code == "IMPORT_FORMAT"
    assert info.value.where["line"] == 4


def test_refused_seed_names_the_source_line(tmp_path: Path) -> None:
    """to_session names the line a refused event was mapped from."""
    path = _jsonl(tmp_path, "s1.jsonl", [_claude()])
    [session] = import_file(path, "claude-code")
    message = next(e for e in session.events if e["type"] == "user/message")
    message["data"]["source"] = {"kind": ""}
    with pytest.raises(ImportFormatError, match=r"s1.jsonl:1: claude-code transcript cannot "
                       r"become a dsh session: the event mapped from this line is refused "
                       r"\(.*invalid source") as info:
        session.to_session()
    assert info.value.code == UNMAPPED_CODE
    assert info.value.where["line"] == 1


@pytest.mark.parametrize("own", ["x" * 300, "é" * 60, "tab\there"])
def test_claude_code_session_id_no_store_can_name_gets_a_derived_id(tmp_path: Path,
                                                                    own: str) -> None:
    from dsh.persistence._contract import session_id_problem

    path = _jsonl(tmp_path, "s.jsonl", [_claude(session=own)])
    [session] = _seed(import_file(path, "claude-code"))
    assert session.session_id != own
    assert session_id_problem(session.session_id) is None

"""An import never produces a log that fails ``dsh verify``.

Broken Claude Code parent chains are followed as far as they are sound and the rest is
recovered in file order (recorded as ``import/claude-code/chain-repair``); a compaction whose
summarised history is absent is kept as text without a bracket. The property test feeds every
importer damaged and reordered versions of the corpus and the bundled examples (lines dropped,
moved, duplicated, cut; parent links broken) and verifies every log it produces.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh._errors import ImportFormatError
from dsh._verify import verify_events
from dsh.interop import import_file
from dsh.interop._common import UNMAPPED_CODE, ImportedSession
from tests.interop.helpers import CORPUS, EXAMPLES, live

FUZZ_EXAMPLES = int(os.environ.get("DSH_FUZZ_EXAMPLES", "25"))


def _line(uuid: str, parent: str | None, kind: str = "user", **extra: Any) -> dict[str, Any]:
    content: Any = extra.pop("content", f"text of {uuid}")
    role = "assistant" if kind == "assistant" else "user"
    message: dict[str, Any] = {"role": role, "content": content}
    if kind == "assistant":
        message.update(id=f"msg-{uuid}", model="claude-x")
    return {"type": kind, "uuid": uuid, "parentUuid": parent, "sessionId": "s1",
            "timestamp": "2025-06-01T10:00:00Z", "message": message, **extra}


def _write(tmp_path: Path, records: list[dict[str, Any]], name: str = "s1.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def _verified(sessions: list[ImportedSession]) -> list[ImportedSession]:
    for top in sessions:
        for imported in top.walk():
            assert verify_events(imported.events, header=imported.header) == [], (
                imported.source_path)
    return sessions


def _tool_use(call: str) -> list[dict[str, Any]]:
    return [{"type": "tool_use", "id": call, "name": "Bash", "input": {"command": "ls"}}]


def _tool_result(call: str) -> list[dict[str, Any]]:
    return [{"type": "tool_result", "tool_use_id": call, "content": "a.txt"}]


def test_claude_code_compact_boundary_naming_no_line_keeps_everything(tmp_path: Path) -> None:
    records = [
        _line("u1", None, content="first prompt"),
        _line("a1", "u1", "assistant", content=_tool_use("t1")),
        _line("r1", "a1", content=_tool_result("t1")),
        _line("a2", "r1", "assistant", content=[{"type": "text", "text": "done"}]),
        {"type": "system", "subtype": "compact_boundary", "uuid": "b1", "parentUuid": None,
         "logicalParentUuid": "gone", "sessionId": "s1", "timestamp": "2025-06-01T10:01:00Z",
         "compactMetadata": {"trigger": "auto", "preTokens": 1000}},
        _line("c1", "b1", isCompactSummary=True, content="summary of the work"),
        _line("u2", "c1", content="second prompt"),
        _line("a3", "u2", "assistant", content=[{"type": "text", "text": "ok"}]),
    ]
    [session] = _verified(import_file(_write(tmp_path, records), "claude-code"))
    assert not [e for e in session.events if e["type"] == "import/claude-code/off-branch"]
    [repair] = [e["data"] for e in session.events if e["type"] == "import/claude-code/chain-repair"]
    assert repair == {"line": 5, "uuid": "b1", "brokenLink": "logicalParentUuid",
                      "missing": "gone", "linkedTo": "a2"}
    prompts = [e["data"]["content"][0]["text"] for e in live(session)
               if e["type"] == "user/message" and e["data"]["source"]["kind"] == "user"]
    assert prompts == ["first prompt", "second prompt"]
    assert [e["type"] for e in live(session)].count("compaction/start") == 1
    assert sum(1 for e in session.events if e["type"] == "tool/call") == 1


def test_claude_code_parent_cycle_is_cut_and_recovered(tmp_path: Path) -> None:
    records = [_line("u1", "u2", content="one"),
               _line("a1", "u1", "assistant", content=[{"type": "text", "text": "hi"}]),
               _line("u2", "a1", content="two")]
    [session] = _verified(import_file(_write(tmp_path, records), "claude-code"))
    [repair] = [e["data"] for e in session.events if e["type"] == "import/claude-code/chain-repair"]
    assert repair["uuid"] == "u1" and repair["missing"] == "u2" and repair["linkedTo"] is None
    texts = [e["data"]["content"][0]["text"] for e in live(session) if e["type"] == "user/message"]
    assert texts == ["one", "two"]


def test_codex_compaction_before_any_history_is_kept_as_text(tmp_path: Path) -> None:
    records = [
        {"timestamp": "2025-06-01T10:00:00Z", "type": "session_meta",
         "payload": {"id": "c-1", "cwd": "/w", "model_provider": "openai"}},
        {"timestamp": "2025-06-01T10:00:01Z", "type": "compacted",
         "payload": {"message": "earlier work, summarised"}},
        {"timestamp": "2025-06-01T10:00:02Z", "type": "response_item",
         "payload": {"type": "message", "role": "user",
                     "content": [{"type": "input_text", "text": "go on"}]}},
    ]
    [session] = _verified(import_file(_write(tmp_path, records, "r.jsonl"), "codex"))
    types = [e["type"] for e in session.events]
    assert "compaction/start" not in types
    assert "import/codex/compaction-without-history" in types
    summary = next(e for e in live(session) if e["type"] == "user/message")
    assert summary["data"]["content"] == [{"type": "text", "text": "earlier work, summarised"}]
    assert summary["data"]["source"]["form"] == "summary"


# --- the property ---------------------------------------------------------------------------

_FORMATS = ("claude-code", "codex", "anthropic", "openhands", "dsh")
"""JSONL formats: line damage is meaningful for them (documents are fuzzed in test_fuzz)."""


def _sources() -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    for root in (EXAMPLES, CORPUS):
        for fmt in _FORMATS:
            folder = root / fmt
            if folder.is_dir():
                found += [(fmt, p) for p in sorted(folder.rglob("*.jsonl"))
                          if p.stat().st_size < 2_000_000]
    return found


@st.composite
def _reshaped(draw: st.DrawFn, lines: list[bytes]) -> list[bytes]:
    out = list(lines)
    for _ in range(draw(st.integers(1, 4))):
        if not out:
            break
        at = draw(st.integers(0, len(out) - 1))
        how = draw(st.sampled_from(["drop", "move", "duplicate", "break-link", "cut"]))
        if how == "drop":
            del out[at]
        elif how == "move":
            out.insert(draw(st.integers(0, len(out) - 1)), out.pop(at))
        elif how == "duplicate":
            out.insert(draw(st.integers(0, len(out))), out[at])
        elif how == "cut":
            out = out[: at + 1]
        else:
            record = json.loads(out[at])
            if isinstance(record, dict):
                for key in ("parentUuid", "logicalParentUuid", "call_id", "tool_use_id"):
                    if key in record:
                        record[key] = draw(st.sampled_from(["missing-uuid", None]))
                out[at] = json.dumps(record).encode()
    return out


@settings(max_examples=FUZZ_EXAMPLES * 4, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_and_reordered_transcripts_import_into_logs_that_verify(
        tmp_path: Path, data: st.DataObject) -> None:
    sources = _sources()
    fmt, source = data.draw(st.sampled_from(sources))
    lines = [x for x in source.read_bytes().split(b"\n") if x.strip()]
    path = tmp_path / source.name
    path.write_bytes(b"\n".join(data.draw(_reshaped(lines))) + b"\n")
    try:
        sessions = import_file(path, fmt)
    except ImportFormatError as error:
        # Refusing is allowed (an empty file, a dsh log whose seqs no longer follow); an
        # importer that cannot map what it was given is not.
        assert error.code != UNMAPPED_CODE, error
        return
    for top in sessions:
        for imported in top.walk():
            imported.to_session(clock=lambda: 0)
    _verified(sessions)


def test_every_corpus_transcript_verifies() -> None:
    if not (CORPUS / "MANIFEST.json").is_file():
        pytest.fail(f"the test corpus is missing from the repository ({CORPUS})")
    checked = 0
    for path in sorted(CORPUS.rglob("*")):
        if (path.suffix not in (".json", ".jsonl", ".traj", ".yaml") or "subagents" in path.parts
                or path.name == "MANIFEST.json"):
            continue
        _verified(import_file(path))
        checked += 1
    assert checked >= 25

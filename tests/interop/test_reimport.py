"""Importing a source again: a grown transcript appends its new records, an
unchanged one is skipped, one changed where it was imported becomes a new session naming the
old one. Checked on the planner (``dsh.interop._reimport``), on real line cuts of the corpus
and examples (property), and through ``dsh import``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh._errors import ImportFormatError
from dsh._verify import verify_events
from dsh.interop import ImportedSession, import_file
from dsh.interop._reimport import APPEND, CHANGED, SAME, plan_reimport, superseding
from dsh.session._session import Session
from tests.cli.test_cli import Dsh
from tests.interop.helpers import CORPUS, EXAMPLES

FUZZ_EXAMPLES = int(os.environ.get("DSH_FUZZ_EXAMPLES", "25"))


def _line(uuid: str, parent: str | None, kind: str, text: str, **extra: Any) -> str:
    message: dict[str, Any] = {"role": "assistant" if kind == "assistant" else "user",
                               "content": extra.pop("content", text)}
    if kind == "assistant":
        message.update(id=f"msg-{uuid}", model="claude-x")
    return json.dumps({"type": kind, "uuid": uuid, "parentUuid": parent, "sessionId": "grow-1",
                       "timestamp": extra.pop("timestamp", "2025-06-01T10:00:00Z"),
                       "message": message, **extra})


FIRST = [_line("u1", None, "user", "first prompt"),
         _line("a1", "u1", "assistant", "", content=[
             {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}])]
"""A transcript cut while a tool runs: the import leaves the turn open with a pending call."""

MORE = [_line("r1", "a1", "user", "", content=[
            {"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"}],
            timestamp="2025-06-01T10:00:05Z"),
        _line("a2", "r1", "assistant", "", content=[{"type": "text", "text": "one file"}],
              timestamp="2025-06-01T10:00:06Z"),
        _line("u2", "a2", "user", "second prompt", timestamp="2025-06-01T10:01:00Z"),
        _line("a3", "u2", "assistant", "", content=[{"type": "text", "text": "ok"}],
              timestamp="2025-06-01T10:01:01Z")]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _one(path: Path, fmt: str = "claude-code") -> ImportedSession:
    [session] = import_file(path, fmt)
    return session


def _grown_log(stored: list[dict[str, Any]], plan_events: list[dict[str, Any]],
               header: dict[str, Any]) -> list[dict[str, Any]]:
    log = [*stored, *plan_events]
    assert verify_events(log, header=header) == []
    return log


def _view(events: list[dict[str, Any]], header: dict[str, Any]) -> list[Any]:
    return Session.create(str(header["id"]), seed=events, header=header,
                          clock=lambda: 0).derive_messages()


def test_grown_transcript_appends_only_the_new_records(tmp_path: Path) -> None:
    path = _write(tmp_path / "grow-1.jsonl", FIRST)
    stored = _one(path).events
    _write(path, FIRST + MORE)
    fresh = _one(path)
    plan = plan_reimport(stored, fresh)
    assert plan.kind == APPEND
    marker, *tail = plan.events
    assert marker["type"] == "import/source" and marker["ignorable"] is True
    assert marker["seq"] == len(stored) and marker["data"]["appendedFrom"] == len(stored) + 1
    assert marker["data"]["size"] == path.stat().st_size
    assert marker["data"]["sha256"] == fresh.events[0]["data"]["sha256"]
    assert [e["seq"] for e in tail] == list(range(len(stored) + 1, len(stored) + 1 + len(tail)))
    assert tail[0]["type"] == "import/claude-code/envelope"
    result = next(e for e in tail if e["type"] == "tool/result")
    call = next(e for e in stored if e["type"] == "tool/call")
    assert result["sourceEventSeqs"] == [call["seq"]]  # points at the stored call
    log = _grown_log(stored, plan.events, fresh.header)
    assert _view(log, fresh.header) == _view(fresh.events, fresh.header)
    assert plan_reimport(log, fresh).kind == SAME


def test_unchanged_transcript_is_the_same(tmp_path: Path) -> None:
    path = _write(tmp_path / "grow-1.jsonl", FIRST + MORE)
    assert plan_reimport(_one(path).events, _one(path)).kind == SAME


def test_changed_transcript_becomes_a_session_naming_the_old(tmp_path: Path) -> None:
    path = _write(tmp_path / "grow-1.jsonl", FIRST + MORE)
    stored = _one(path).events
    edited = [FIRST[0].replace("first prompt", "first prompt, edited"), *FIRST[1:], *MORE]
    _write(path, edited)
    fresh = _one(path)
    plan = plan_reimport(stored, fresh)
    assert plan.kind == CHANGED
    changed = next(e for e in stored if e["type"] == "user/message")
    assert plan.changed_at == changed["seq"]
    newer = superseding(fresh, fresh.session_id, plan.changed_at)
    assert newer.session_id != fresh.session_id == "grow-1"
    assert newer.header["id"] == newer.session_id
    assert newer.events[0]["data"]["supersedes"] == {"session": "grow-1",
                                                     "changedAtSeq": plan.changed_at}
    assert verify_events(newer.events, header=newer.header) == []
    assert superseding(fresh, "grow-1", plan.changed_at).session_id == newer.session_id


def test_a_stored_session_continued_in_dsh_compares_only_the_imported_region(
        tmp_path: Path) -> None:
    path = _write(tmp_path / "grow-1.jsonl", FIRST)
    stored = _one(path).events
    extra = {**stored[-1], "seq": len(stored), "type": "import/claude-code/note",
             "ignorable": True, "data": {"x": 1}}
    # the source unchanged: what dsh wrote after the import is not compared with anything
    assert plan_reimport([*stored, extra], _one(path)).kind == SAME
    # the source grew too: the session went two ways after the imported region
    _write(path, FIRST + MORE)
    assert plan_reimport([*stored, extra], _one(path)).kind == CHANGED


# --- the property: any line cut of a real transcript, then the whole of it ------------------

_SOURCES = [(fmt, p) for root in (EXAMPLES, CORPUS) for fmt in ("claude-code", "codex")
            if (root / fmt).is_dir() for p in sorted((root / fmt).rglob("*.jsonl"))
            if "subagents" not in p.parts and p.stat().st_size < 2_000_000]


@settings(max_examples=FUZZ_EXAMPLES * 2, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_reimport_of_a_grown_cut_gives_the_whole_transcript(tmp_path: Path,
                                                            data: st.DataObject) -> None:
    fmt, source = data.draw(st.sampled_from(_SOURCES))
    lines = [x for x in source.read_bytes().split(b"\n") if x.strip()]
    cut = data.draw(st.integers(1, len(lines)))
    path = tmp_path / source.name
    path.write_bytes(b"\n".join(lines[:cut]) + b"\n")
    try:
        stored = _one(path, fmt)
    except ImportFormatError:
        return  # a head without any record of the format: nothing was imported
    path.write_bytes(b"\n".join(lines) + b"\n")
    fresh = _one(path, fmt)
    plan = plan_reimport(stored.events, fresh)
    if plan.kind == APPEND:
        log = _grown_log(stored.events, plan.events, fresh.header)
        assert _view(log, fresh.header) == _view(fresh.events, fresh.header)
    elif plan.kind == SAME:
        assert cut == len(lines) or _view(stored.events, stored.header) == _view(
            fresh.events, fresh.header)
    else:
        assert plan.changed_at is not None and cut < len(lines)


def test_reimport_appends_at_turn_boundaries_of_the_examples(tmp_path: Path) -> None:
    """Cutting an example right after a finished turn always appends (never a new session)."""
    source = EXAMPLES / "claude-code" / "long-debugging.jsonl"
    lines = source.read_text().splitlines()
    prompts = [i for i, x in enumerate(lines) if json.loads(x).get("type") == "user"
               and isinstance(json.loads(x)["message"].get("content"), str)]
    assert len(prompts) >= 2
    path = tmp_path / source.name
    for cut in prompts[1:]:
        _write(path, lines[:cut])
        stored = _one(path)
        _write(path, lines)
        plan = plan_reimport(stored.events, _one(path))
        assert plan.kind == APPEND, cut


# --- through the CLI --------------------------------------------------------------------------

def test_cli_import_appends_a_grown_transcript_and_supersedes_a_changed_one(
        tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    path = _write(tmp_path / "grow-1.jsonl", FIRST)
    dsh("import", str(path))
    before = len(dsh.event_lines("grow-1"))
    _write(path, FIRST + MORE)
    report = json.loads(dsh("import", "--json", str(path)).stdout)
    assert report["imported"] == [] and report["superseded"] == []
    [updated] = report["updated"]
    after = dsh.event_lines("grow-1")
    assert updated == {"path": str(path), "session": "grow-1",
                       "appended": len(after) - before - 1}
    assert [e["type"] for e in after].count("import/source") == 2
    dsh("verify", "grow-1")
    again = json.loads(dsh("import", "--json", str(path)).stdout)
    assert again["skipped"] == [{"path": str(path), "session": "grow-1"}]

    _write(path, [FIRST[0].replace("first prompt", "edited"), *FIRST[1:], *MORE])
    text = dsh("import", str(path)).stdout
    assert "its source differs from the stored session" in text
    report = json.loads(dsh("import", "--json", str(path)).stdout)  # a second time: skipped
    [newer] = report["skipped"]
    assert newer["session"] != "grow-1"
    [source] = [e for e in dsh.event_lines(newer["session"]) if e["type"] == "import/source"]
    assert source["data"]["supersedes"]["session"] == "grow-1"
    assert len(dsh.event_lines("grow-1")) == len(after)  # the old one is kept as it was
    dsh("verify", "--all")

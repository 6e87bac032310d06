"""Properties of the importers: any line-boundary cut of a real transcript, and any Chat
Completions conversation, imports into a log that seeds a Session, satisfies the invariants
(docs/rules.md#turns-and-steps), repairs with the crash closers (docs/rules.md#repair) and exports
to valid requests."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh.interop import import_file, to_anthropic, to_openai, validate_conversation
from dsh.session._invariants import check_log
from dsh.session._repair import interrupted_turn_closers
from dsh.session._session import Session
from tests.interop.helpers import CORPUS, EXAMPLES

EXAMPLE_COUNT = int(os.environ.get("DSH_HYPOTHESIS_EXAMPLES", "30"))

CUT_SOURCES = [
    ("claude-code", CORPUS / "claude-code" / "spotter-short-interrupted.jsonl"),
    ("claude-code", CORPUS / "claude-code" / "spotter-tool-heavy-queued-interrupts.jsonl"),
    ("claude-code", CORPUS / "claude-code" / "spotter-task-subagent.jsonl"),
    ("codex", EXAMPLES / "codex" / "legacy-interrupted.jsonl"),
    ("codex", CORPUS / "codex" / "agent-history-real-exec-session-01.jsonl"),
    ("claude-code", EXAMPLES / "claude-code" / "compacted.jsonl"),
    ("codex", EXAMPLES / "codex" / "rollout-compacted-aborted.jsonl"),
]


def _check(path: Path, fmt: str) -> None:
    for top in import_file(path, fmt):
        for imported in top.walk():
            session = Session.create(imported.session_id, seed=imported.events,
                                     header=imported.header, clock=lambda: 0)
            assert check_log(session.events) == []
            closers = interrupted_turn_closers(session.events)
            repaired = Session.create(imported.session_id,
                                      seed=[*session.events, *closers],
                                      header=imported.header, clock=lambda: 0)
            assert check_log(repaired.events) == []
            messages = repaired.derive_messages()
            assert validate_conversation(to_openai(messages), "openai") == []
            assert validate_conversation(to_anthropic(messages), "anthropic") == []


@settings(max_examples=EXAMPLE_COUNT, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_import_any_line_cut_of_a_transcript_is_a_valid_log(tmp_path: Path,
                                                            data: st.DataObject) -> None:
    """Corpus README: "a prefix can end in the middle of a turn: an importer must cope"."""
    fmt, source = data.draw(st.sampled_from(CUT_SOURCES))
    if not source.is_file():
        pytest.skip(f"REFERENCE DATA MISSING: {source}")
    lines = source.read_bytes().split(b"\n")
    keep = data.draw(st.integers(min_value=1, max_value=len([x for x in lines if x.strip()])))
    cut = tmp_path / source.name
    cut.write_bytes(b"\n".join(lines[:keep]) + b"\n")
    try:
        _check(cut, fmt)
    except Exception as exc:
        # Only a prefix with no message line at all may be refused, and only clearly.
        from dsh._errors import ImportFormatError
        assert isinstance(exc, ImportFormatError), exc


_ids = st.sampled_from(["call_1", "call_2", "call_3"])
_chat_message = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, st.text(max_size=4)),
    st.builds(lambda t: {"role": "system", "content": t}, st.text(max_size=4)),
    st.builds(lambda t, ids: {"role": "assistant", "content": t or None, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for i in dict.fromkeys(ids)]}, st.text(max_size=4), st.lists(_ids, max_size=3)),
    st.builds(lambda i, t: {"role": "tool", "tool_call_id": i, "content": t}, _ids,
              st.text(max_size=4)),
)


@settings(max_examples=EXAMPLE_COUNT, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(_chat_message, min_size=1, max_size=10))
def test_import_any_chat_conversation_is_a_valid_log(tmp_path: Path,
                                                     messages: list[dict[str, Any]]) -> None:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(messages))
    _check(path, "openai-chat")

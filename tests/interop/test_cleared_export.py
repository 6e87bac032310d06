"""Cleared means cleared in exports: what a framework cleared, popped or deleted, and what
`dsh quarantine` withholds, is in no file another agent resumes or a trajectory reader replays
(claude-code, codex, atif, inspect), and the rest of the conversation is there and imports
again; the log itself (dsh-jsonl) and the transcripts for people (markdown, html) keep it,
marked. Rule: docs/standards.md#what-the-exports-hold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dsh import EventRejectedError
from dsh.interop import ImportedSession, import_file, to_claude_code, to_codex
from dsh.json import thaw
from tests.adapters.conftest import dsh
from tests.adapters.kill_child import run
from tests.adapters.test_cleared import (
    SECRET,
    langchain_cleared,
    langgraph_removed_and_deleted,
    pydantic_ai_cleared,
    sdk_cleared,
)
from tests.agent.providers.servers import ScriptedServer, Stream, openai_reply
from tests.interop.standards import view

RESUMED = ("claude-code", "codex", "atif", "inspect")
"""Formats that carry the conversation on: none may hold what was removed."""


def _text(message: Any) -> str:
    parts = []
    for block in message.get("content") or []:
        if block.get("type") == "text":
            parts.append(block["text"])
        elif block.get("type") == "tool-result":
            parts.append(_text(block))
        elif block.get("type") == "tool-call":
            parts.append(f"call {block['name']}")
    return "\n".join(parts)


def _texts(messages: Any) -> list[tuple[str, str]]:
    return [(str(m["role"]), _text(m)) for m in messages]


def _view_of(session: ImportedSession) -> list[tuple[str, str]]:
    return _texts(thaw(session.to_session(clock=lambda: 0).derive_messages()))


def _export(store: str, session: str, fmt: str, out: Path, *extra: str,
            home: Path | None = None) -> bytes:
    """``dsh export`` in a real process; every file in ``out``'s folder (or, with ``home``,
    under it), concatenated: the export and the files it put beside it."""
    env = {**os.environ, **({"HOME": str(home)} if home else {})}
    args = ["export", session, "--store", store, "--format", fmt, *extra]
    if not extra:
        args += ["-o", str(out)]
    proc = subprocess.run([sys.executable, "-m", "dsh.cli", *args], capture_output=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    root = home if home else out.parent
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def _assert_exports_leave_out_what_was_removed(
        store: str, session: str, tmp: Path, *, secrets: tuple[str, ...] = (SECRET,),
        mark: str = "REMOVED from the model view", every_format: bool = False) -> None:
    """Each resumed format holds none of ``secrets`` and imports to the model view; the
    transcripts and the log hold them, marked ``mark``.

    ``every_format``: every format and both ``--install`` targets; otherwise (a real process
    per export costs about a second) the two files another agent resumes, Claude Code's
    install and the markdown transcript: the export code is one path for every removal.
    """
    want = _texts(json.loads(dsh("messages", session, "--store", store, "--format", "dsh")))
    assert want, "something is left to hand on"
    for fmt in RESUMED if every_format else RESUMED[:2]:
        folder = tmp / f"{session}-{fmt}"
        folder.mkdir()
        out = folder / f"export.{'jsonl' if fmt in ('claude-code', 'codex') else 'json'}"
        written = _export(store, session, fmt, out)
        assert not [s for s in secrets if s.encode() in written], fmt
        if fmt == "inspect":
            continue  # an eval log: dsh does not import it
        [again] = import_file(out)
        assert _view_of(again) == want, fmt  # the rest of the conversation, in order
        if fmt == "claude-code":
            lines = [json.loads(x) for x in out.read_text().splitlines()]
            assert not any(x.get("subtype") == "compact_boundary" for x in lines)
    for fmt in ("claude-code", "codex") if every_format else ("claude-code",):  # --install
        home = tmp / f"{session}-{fmt}-home"
        home.mkdir()
        installed = _export(store, session, fmt, home, "--install", home=home)
        assert installed and not [s for s in secrets if s.encode() in installed], fmt
    # for people, and the log: kept, marked
    for fmt in ("markdown", "html", "dsh-jsonl") if every_format else ("markdown",):
        (tmp / f"{session}-{fmt}").mkdir()
        out = tmp / f"{session}-{fmt}" / "export"
        written = _export(store, session, fmt, out)
        assert all(s.encode() in written for s in secrets), fmt
        if fmt != "dsh-jsonl":
            assert mark.encode() in written, fmt


def _continue(store: str, session: str, server: ScriptedServer, framework: str) -> None:
    server.add(Stream(openai_reply("hello")))
    run(framework, store, session, server.base_url + "/v1", "hi")


def test_sdk_clear_session_and_pop_item_leave_every_handoff(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"

    sdk_cleared(store, "cleared", "popped",
                [[{"role": "user", "content": "before the secret"},
                  {"role": "assistant", "content": "go on"}],
                 [{"role": "user", "content": f"my password is {SECRET}"},
                  {"role": "assistant", "content": f"noted {SECRET}"}]])
    with ScriptedServer() as server:
        for sid in ("cleared", "popped"):
            _continue(store, sid, server, "openai-agents")
            _assert_exports_leave_out_what_was_removed(store, sid, tmp_path,
                                                       every_format=sid == "cleared")
    popped = json.loads(dsh("messages", "popped", "--store", store, "--format", "dsh"))
    assert _texts(popped)[:2] == [("user", "before the secret"), ("assistant", "go on")]


def test_langchain_clear_leaves_every_handoff(tmp_path: Path) -> None:
    from langchain_core.messages import AIMessage, HumanMessage

    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    history = langchain_cleared(store)
    history.add_messages([HumanMessage("hi"), AIMessage("hello")])
    history.close()
    _assert_exports_leave_out_what_was_removed(store, "lc", tmp_path)


def test_pydantic_ai_clear_leaves_every_handoff(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    pydantic_ai_cleared(store)
    with ScriptedServer() as server:
        _continue(store, "pa", server, "pydantic-ai")
    _assert_exports_leave_out_what_was_removed(store, "pa", tmp_path)


def test_langgraph_remove_message_and_delete_thread_leave_every_handoff(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    with ScriptedServer() as server:
        langgraph_removed_and_deleted(store, server)
        for sid in ("removed", "deleted"):
            _continue(store, sid, server, "langgraph")
            _assert_exports_leave_out_what_was_removed(store, sid, tmp_path)


@pytest.mark.no_speedups
def test_quarantine_leaves_placeholders_not_compactions_and_unquarantine_restores(
        tmp_path: Path) -> None:
    import dsh as dsh_api
    from dsh.rights import PLACEHOLDER_TEXT, quarantine, unquarantine
    from tests.rights.conftest import SECRETS, build

    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    build(store)
    user, assistant, tool = 2, 5, 7  # the prompt, the reasoning + call, the .env output
    with dsh_api.open(store) as opened:
        quarantine(opened, "s1", [user, assistant, tool], reason="keys leaked")
        read = opened.read("s1")
    _assert_exports_leave_out_what_was_removed(store, "s1", tmp_path,
                                               secrets=tuple(SECRETS.values()),
                                               mark="QUARANTINED", every_format=True)
    session = ImportedSession("s1", read.header, read.events)
    claude = to_claude_code(session)
    assert not any(x.get("subtype") == "compact_boundary" or x.get("isCompactSummary")
                   for x in claude)
    # each message is its placeholder, in its place and role, calls still answered
    assert [(x["type"], PLACEHOLDER_TEXT in json.dumps(x)) for x in claude] == [
        ("user", True), ("assistant", True), ("user", True), ("assistant", False),
        ("user", False), ("assistant", False)]
    assert sum(PLACEHOLDER_TEXT in json.dumps(x) for x in to_codex(session)) == 3
    with dsh_api.open(store) as opened:
        unquarantine(opened, "s1", [user, assistant, tool])
        read = opened.read("s1")
    restored = json.dumps(to_claude_code(ImportedSession("s1", read.header, read.events)))
    assert all(s in restored for s in SECRETS.values()) and PLACEHOLDER_TEXT not in restored


def _event(seq: int, etype: str, data: dict[str, Any], op: Any = None,
           cites: list[int] | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": etype, "seq": seq, "time": 1_700_000_000_000 + seq,
                             "data": data}
    if op is not None:
        event["surfaceOp"] = op
    if cites:
        event["sourceEventSeqs"] = cites
    return event


def _user(seq: int, text: str, op: Any = "append", cites: list[int] | None = None,
          source: dict[str, Any] | None = None) -> dict[str, Any]:
    return _event(seq, "user/message", {"id": f"m{seq}", "role": "user",
                                        "source": source or {"kind": "user"},
                                        "content": [{"type": "text", "text": text}]},
                  op, cites)


def test_a_clear_over_a_compaction_takes_what_the_summary_shadowed_too() -> None:
    # u0 u1 compacted into c4; a clear then takes c4 and u5 off; u8 stays. The history
    # rebuilds the model view exactly, and holds nothing the clear took.
    removal = {"id": "r", "role": "assistant", "content": [],
               "source": {"kind": "model", "provider": "dsh", "model": "surface-removal",
                          "removal": {"form": "clear", "removed": [4, 5]}}}
    events = [
        _user(0, f"one {SECRET}"), _user(1, "two"),
        _event(2, "compaction/start", {"compactionId": "k", "turn": None}),
        _event(3, "compaction/summary", {"compactionId": "k", "summary": f"s {SECRET}",
                                         "shadowedRange": {"start": 0, "end": 1},
                                         "shadowedSeqs": [0, 1], "shadowedTokenCount": 1,
                                         "provider": "x", "model": "y"}),
        _user(4, f"summary {SECRET}", {"op": "replace", "start": 0, "end": 1}, [2, 3, 0, 1],
              {"kind": "plugin", "plugin": "compact", "compactionId": "k"}),
        _event(5, "compaction/end", {"compactionId": "k", "turn": None}),
        _user(6, f"again {SECRET}"),
        _event(7, "turn/start", {"turn": 1}),
        _event(8, "step/start", {"turn": 1, "step": 1}),
        _event(9, "assistant/message", {"turn": 1, "step": 1, "message": removal},
               {"op": "replace", "start": 4, "end": 6}, [4, 6]),
        _event(10, "step/end", {"turn": 1, "step": 1}),
        _event(11, "turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
        _user(12, "kept"),
    ]
    session = ImportedSession("s", {"version": 0, "id": "s", "createdAt": 1_700_000_000_000},
                              events)
    assert [json.loads(m)["content"][0]["text"] for m in view(session)] == ["kept"]
    for lines in (to_claude_code(session), to_codex(session)):
        assert SECRET not in json.dumps(lines)
        assert "kept" in json.dumps(lines)


def test_a_replace_naming_no_surface_node_is_a_typed_error_naming_its_seq() -> None:
    # a log no session would accept (built by hand): the export says which event and why,
    # with the session's own surface refusal (docs/rules.md#surface-ops), not a bare ValueError
    removal = {"id": "r", "role": "assistant", "content": []}
    for start, end, why in ((0, 7, "end seq 7 not found in surface"),
                            (1, 0, "start seq 1 (index 1) is after end seq 0 (index 0)")):
        events = [_user(0, "one"), _user(1, "two"),
                  _event(2, "assistant/message", {"message": removal},
                         {"op": "replace", "start": start, "end": end}, [0, 1])]
        session = ImportedSession(
            "s", {"version": 0, "id": "s", "createdAt": 1_700_000_000_000}, events)
        with pytest.raises(EventRejectedError) as caught:
            to_claude_code(session)
        assert caught.value.code == "SURFACE" and caught.value.where["seq"] == 2
        assert caught.value.message == f"surface replace: {why} (event at seq 2)"


def test_a_damaged_log_with_a_clear_is_refused_naming_the_session_the_seq_and_what_to_do(
        tmp_path: Path) -> None:
    # the exporters walk the session's own surface fold for a clear's removals, so a log
    # holding one and breaking a surface rule (here: the clear's provenance cut short, the
    # seal rebuilt over it) is refused; the message says which session, where, and what to do
    store = f"jsonl://{tmp_path / 'store'}"
    pydantic_ai_cleared(store)
    path = next(p for p in (tmp_path / "store").rglob("session.jsonl") if p.parent.name == "pa")
    lines = path.read_text().splitlines()
    for index, line in enumerate(lines):
        event = json.loads(line)
        if isinstance(event.get("surfaceOp"), dict):
            event["sourceEventSeqs"] = event["sourceEventSeqs"][:-1]
            lines[index], seq = json.dumps(event, separators=(",", ":")), event["seq"]
    path.write_text("\n".join(lines) + "\n")
    path.with_name("session.jsonl.seal").unlink()  # and sealed over again

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dsh.cli", *args, "--store", store],
                              capture_output=True, text=True, timeout=120)

    assert f"pa seq {seq} SURFACE" in cli("verify", "--reseal", "pa").stdout
    proc = cli("export", "pa", "--format", "atif")
    assert proc.returncode != 0 and proc.stdout == ""
    assert "error[LOG_CORRUPT]: session 'pa' (or a subagent session bundled with it) cannot " \
           "be exported as atif: its log breaks a surface rule" in proc.stderr
    assert f"(event at seq {seq})" in proc.stderr and "'dsh verify pa'" in proc.stderr
    kept = cli("export", "pa", "--format", "dsh-jsonl")  # the way out the message names
    assert kept.returncode == 0 and f'"seq":{seq},' in kept.stdout

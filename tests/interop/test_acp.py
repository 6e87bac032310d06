"""`dsh acp` driven as an editor drives it: the agent-client-protocol package's client side over
stdio, against the local OpenAI-compatible test server; the sessions it writes are ordinary dsh
sessions that verify (docs/standards.md#agent-client-protocol)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from acp import PROTOCOL_VERSION, spawn_agent_process, text_block

from tests.agent.providers.servers import ScriptedServer, Stall, Stream, openai_reply
from tests.interop.standards import cli


class Editor:
    """The client side: keeps every session/update, answers no permission requests."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, Any]] = []
        self.streaming = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))
        if update.session_update == "agent_message_chunk":
            self.streaming.set()

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("dsh acp asked for a permission it should not need")

    def of(self, session_id: str) -> list[Any]:
        return [u for sid, u in self.updates if sid == session_id]


def _kinds(updates: list[Any]) -> list[str]:
    out: list[str] = []
    for u in updates:
        kind = u.session_update
        if kind.endswith("_chunk") and out and out[-1] == kind:
            continue  # a run of streamed deltas
        out.append(kind)
    return out


def _chunks(updates: list[Any], kind: str) -> str:
    return "".join(u.content.text for u in updates if u.session_update == kind)


def _args(server: ScriptedServer, store: Path) -> list[str]:
    return ["-m", "dsh.cli", "acp", "--provider", "openai-compatible", "--model", "m1",
            "--base-url", server.base_url, "--tools", "read", "--store", str(store)]


def test_an_editor_creates_prompts_cancels_lists_loads_forks_and_resumes(tmp_path: Path) -> None:
    workspace = tmp_path / "project"
    workspace.mkdir()
    (workspace / "a.txt").write_text("hello from a\n", encoding="utf-8")
    store = tmp_path / "sessions.db"
    server = ScriptedServer([
        Stream(openai_reply("reading", tool_calls=[("call_1", "read_file",
                                                    '{"path": "a.txt"}')])),
        Stream(openai_reply("it says hello")),
        Stall(openai_reply("partial answer")[:3]),
    ])

    async def first_editor() -> tuple[str, Editor]:
        editor = Editor()
        async with spawn_agent_process(editor, sys.executable, *_args(server, store),
                                       use_unstable_protocol=True) as (conn, _process):
            hello = await conn.initialize(protocol_version=PROTOCOL_VERSION)
            caps = hello.agent_capabilities
            assert caps.load_session is True
            assert caps.session_capabilities.fork is not None
            assert caps.session_capabilities.resume is not None
            assert caps.session_capabilities.list is not None
            new = await conn.new_session(cwd=str(workspace), mcp_servers=[])
            sid = new.session_id
            done = await conn.prompt(session_id=sid, prompt=[text_block("what is in a.txt?")])
            assert done.stop_reason == "end_turn"
            # cancel a turn whose model stream stalls after its first words
            editor.streaming.clear()
            prompt = asyncio.create_task(conn.prompt(session_id=sid,
                                                     prompt=[text_block("and again?")]))
            await asyncio.wait_for(editor.streaming.wait(), 60)
            await conn.cancel(session_id=sid)
            cancelled = await asyncio.wait_for(prompt, 60)
            assert cancelled.stop_reason == "cancelled"
            listed = await conn.list_sessions()
            assert [(s.session_id, s.cwd) for s in listed.sessions] == [(sid, str(workspace))]
        return sid, editor

    with server:
        sid, editor = asyncio.run(first_editor())
    live = editor.of(sid)
    assert _kinds(live) == ["agent_message_chunk", "tool_call", "tool_call_update",
                            "agent_message_chunk"]
    call = next(u for u in live if u.session_update == "tool_call")
    assert (call.tool_call_id, call.title, call.status) == ("call_1", "read_file", "in_progress")
    result = next(u for u in live if u.session_update == "tool_call_update")
    assert result.status == "completed"
    assert "hello from a" in result.content[0].content.text
    assert _chunks(live, "agent_message_chunk") == "readingit says hellopartial answer"
    # the model saw the file's text: the second request carries the tool result
    assert "hello from a" in json.dumps(server.requests[1]["messages"])

    server2 = ScriptedServer([Stream(openai_reply("forked answer"))])

    async def second_editor() -> tuple[str, Editor]:
        editor = Editor()
        async with spawn_agent_process(editor, sys.executable, *_args(server2, store),
                                       use_unstable_protocol=True) as (conn, _process):
            await conn.initialize(protocol_version=PROTOCOL_VERSION)
            await conn.load_session(cwd=str(workspace), session_id=sid, mcp_servers=[])
            fork = await conn.fork_session(cwd=str(workspace), session_id=sid)
            child = fork.session_id
            assert child != sid
            await conn.resume_session(cwd=str(workspace), session_id=child)
            done = await conn.prompt(session_id=child, prompt=[text_block("one more")])
            assert done.stop_reason == "end_turn"
            listed = {s.session_id for s in (await conn.list_sessions(cwd=str(workspace))
                                             ).sessions}
            assert listed == {sid, child}
        return child, editor

    with server2:
        child, editor2 = asyncio.run(second_editor())
    replay = editor2.of(sid)  # the history, in log order, before load answered
    assert _kinds(replay) == ["user_message_chunk", "agent_message_chunk", "tool_call",
                              "tool_call_update", "agent_message_chunk", "user_message_chunk",
                              "agent_message_chunk"]
    assert _chunks(replay, "user_message_chunk") == "what is in a.txt?and again?"
    assert _chunks(replay, "agent_message_chunk") == "readingit says hellopartial answer"
    assert _chunks(editor2.of(child), "agent_message_chunk") == "forked answer"
    # the forked turn's request carries the whole inherited history
    assert "hello from a" in json.dumps(server2.requests[0]["messages"])

    dsh = cli(store)
    for session in (sid, child):
        dsh("verify", session)
    parent = json.loads(dsh("show", sid, "--json"))
    assert parent["header"]["cwd"] == str(workspace)
    ends = [json.loads(line)["data"]["reason"]["kind"]
            for line in dsh("events", sid, "--type", "turn/end").splitlines()]
    assert ends == ["completed", "aborted"]


INITIALIZE = (b'{"jsonrpc":"2.0","id":0,"method":"initialize",'
              b'"params":{"protocolVersion":1}}\n')


def _plain_env(tmp_path: Path) -> dict[str, str]:
    # a new user's shell: no provider settings, no key, a home of its own
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DSH_", "DEEPSEEK_", "OPENAI_", "ANTHROPIC_"))}
    env["DSH_HOME"] = str(tmp_path / "home")
    return env


def test_one_initialize_line_from_a_file_is_answered_into_a_file(tmp_path: Path) -> None:
    # dsh acp < request.json > answer.json: neither is a pipe, and no API key is set
    request = tmp_path / "request.json"
    request.write_bytes(INITIALIZE)
    answer = tmp_path / "answer.json"
    with request.open("rb") as stdin, answer.open("wb") as stdout:
        proc = subprocess.run([sys.executable, "-m", "dsh.cli", "acp"], stdin=stdin,
                              stdout=stdout, stderr=subprocess.PIPE, env=_plain_env(tmp_path),
                              timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    [line] = answer.read_bytes().splitlines()
    reply = json.loads(line)
    assert reply["id"] == 0 and reply["result"]["protocolVersion"] == 1
    assert reply["result"]["agentInfo"]["name"] == "dsh"
    assert b"error[MISSING_KEY]" in proc.stderr  # said once, up front


def test_a_line_of_json_that_is_not_a_message_object_is_skipped_not_fatal(
        tmp_path: Path) -> None:
    # before: a JSON array or bare value on stdin ended the connection (error[BUG]
    # AttributeError from the acp package's receive loop), unanswered requests and all
    new = (b'{"jsonrpc":"2.0","id":"n","method":"session/new",'
           b'"params":{"cwd":"/tmp","mcpServers":[]}}\n')
    proc = subprocess.run([sys.executable, "-m", "dsh.cli", "acp"],
                          input=INITIALIZE + b'[1, 2]\n"text"\n7\nnull\nnot json\n' + new,
                          capture_output=True, env=_plain_env(tmp_path), timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert b"error[BUG]" not in proc.stderr and b"Traceback" not in proc.stderr
    replies = {r["id"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert set(replies) == {0, "n"}


def test_a_new_session_with_a_relative_cwd_is_invalid_params(tmp_path: Path) -> None:
    # before: -32603 internal error, with the EventRejectedError's traceback on stderr
    new = (b'{"jsonrpc":"2.0","id":"n","method":"session/new",'
           b'"params":{"cwd":"relative/dir","mcpServers":[]}}\n')
    proc = subprocess.run([sys.executable, "-m", "dsh.cli", "acp", "--provider",
                           "openai-compatible", "--model", "m", "--base-url",
                           "http://127.0.0.1:9/v1"], input=INITIALIZE + new,
                          capture_output=True, env=_plain_env(tmp_path), timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    replies = {r["id"]: r for r in map(json.loads, proc.stdout.splitlines())}
    error = replies["n"]["error"]
    assert error["code"] == -32602 and error["data"]["code"] == "HEADER"
    assert "absolute path" in error["data"]["message"] and b"Traceback" not in proc.stderr


def test_requests_piped_before_the_end_of_stdin_are_all_answered(tmp_path: Path) -> None:
    # echo ... | dsh acp: stdin ends at once; each request still gets its answer, and one
    # that needs a model says why there is none
    new = (b'{"jsonrpc":"2.0","id":"n","method":"session/new",'
           b'"params":{"cwd":"/tmp","mcpServers":[]}}\n')
    proc = subprocess.run([sys.executable, "-m", "dsh.cli", "acp"], input=INITIALIZE + new,
                          capture_output=True, env=_plain_env(tmp_path), timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    replies = {r["id"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert replies[0]["result"]["agentCapabilities"]["loadSession"] is True
    assert replies["n"]["error"]["data"]["code"] == "MISSING_KEY"


def _request(rid: str, method: str, **params: Any) -> bytes:
    return (json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
            + "\n").encode()


def test_a_client_that_only_reads_leaves_no_store_and_the_first_new_session_creates_it(
        tmp_path: Path) -> None:
    # before: dsh acp opened (so created) $DSH_HOME/sessions.db as it started, with no model
    # and no request; an editor that connects, lists and quits now leaves nothing behind
    home = tmp_path / "home"
    reads = (INITIALIZE + _request("list", "session/list")
             + _request("load", "session/load", cwd="/tmp", sessionId="abc", mcpServers=[])
             + _request("resume", "session/resume", cwd="/tmp", sessionId="abc")
             + _request("fork", "session/fork", cwd="/tmp", sessionId="abc")
             + _request("new", "session/new", cwd="/tmp", mcpServers=[]))  # no model: refused
    proc = subprocess.run([sys.executable, "-m", "dsh.cli", "acp"], input=reads,
                          capture_output=True, env=_plain_env(tmp_path), timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    replies = {r["id"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert replies["list"]["result"]["sessions"] == []
    assert {replies[rid]["error"]["code"] for rid in ("load", "resume", "fork")} == {-32002}
    assert replies["new"]["error"]["data"]["code"] == "MISSING_KEY"
    assert not home.exists()
    model = ["--provider", "openai-compatible", "--model", "m", "--base-url",
             "http://127.0.0.1:9/v1"]
    proc = subprocess.run([sys.executable, "-m", "dsh.cli", "acp", *model],
                          input=INITIALIZE + _request("new", "session/new", cwd="/tmp",
                                                      mcpServers=[]),
                          capture_output=True, env=_plain_env(tmp_path), timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    [new] = [r for r in map(json.loads, proc.stdout.splitlines()) if r["id"] == "new"]
    assert "sessionId" in new["result"]
    assert (home / "sessions.db").is_file()  # the store of the session (written at its turn)

"""``dsh run`` as a real process against a scripted model server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.agent.providers.servers import (
    Fail,
    ScriptedServer,
    Stall,
    Stream,
    openai_error,
    openai_reply,
)

DSH = [sys.executable, "-m", "dsh.cli"]


def child_env(tmp_path: Path) -> dict[str, str]:
    """This process's environment without provider keys, with home and DSH_HOME in tmp_path."""
    base = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    return {**base, "DSH_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)}


def dsh(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DSH, *args], env={**child_env(tmp_path), **(env or {})},
                          capture_output=True, text=True, timeout=120, cwd=cwd or tmp_path)


def start_run(tmp_path: Path, prompt: str, server: ScriptedServer) -> subprocess.Popen[bytes]:
    """Start ``dsh run PROMPT`` against ``server`` with pipes on stdout and stderr."""
    return subprocess.Popen([*DSH, "run", prompt, *local(server)], env=child_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def read_until(child: subprocess.Popen[bytes], marker: bytes) -> None:
    """Read the child's stdout until ``marker`` shows: the stream is visibly under way."""
    assert child.stdout is not None
    streamed = b""
    while marker not in streamed:
        piece = os.read(child.stdout.fileno(), 100)
        assert piece, "dsh run ended before streaming"
        streamed += piece


def local(server: ScriptedServer) -> list[str]:
    return ["--provider", "openai-compatible", "--model", "local-model", "--base-url",
            server.base_url]


def session_of(result: subprocess.CompletedProcess[str]) -> str:
    first = result.stderr.splitlines()[0]
    assert first.startswith("session ")
    return first.split()[1]


def finish(child: subprocess.Popen[bytes]) -> bytes:
    """Wait for ``child`` to exit and return its stderr; a hang kills it (never left running)."""
    try:
        _, err = child.communicate(timeout=180)  # hang guard only
    except subprocess.TimeoutExpired:
        child.kill()
        _, err = child.communicate()
        raise AssertionError(f"dsh run did not exit; stderr: {err.decode()[-2000:]}") from None
    return err


def events(tmp_path: Path, session: str) -> list[dict[str, Any]]:
    out = dsh(tmp_path, "events", session)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_run_streams_the_answer_and_shows_tool_calls_on_stderr(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("remember the milk\n")
    call = [("call_1", "read_file", '{"path": "notes.txt"}')]
    with ScriptedServer([Stream(openai_reply("Let me look.", tool_calls=call)),
                         Stream(openai_reply("The note says: remember the milk."))]) as server:
        result = dsh(tmp_path, "run", "what is in notes.txt?", "--tools", "read",
                     *local(server))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Let me look.\nThe note says: remember the milk.\n"
    assert 'read_file(path="notes.txt")' in result.stderr
    assert "remember the milk" in result.stderr  # the result line
    kinds = [e["type"] for e in events(tmp_path, session_of(result))]
    assert kinds.count("tool/call") == kinds.count("tool/result") == 1
    assert kinds[-1] == "turn/end"


def test_run_json_and_session_continues(tmp_path: Path) -> None:
    with ScriptedServer([Stream(openai_reply("Paris.")),
                         Stream(openai_reply("About 2.1 million."))]) as server:
        first = dsh(tmp_path, "run", "capital of France?", "--json", *local(server))
        assert first.returncode == 0, first.stderr
        outcome = json.loads(first.stdout)
        assert (outcome["text"], outcome["turn"], outcome["reason"]) == (
            "Paris.", 1, {"kind": "completed"})
        # a write names its session by its whole id (a prefix is refused: test_new_user.py)
        second = dsh(tmp_path, "run", "how many people live there?", "--session",
                     outcome["session"], *local(server))
    assert second.returncode == 0, second.stderr
    assert second.stdout == "About 2.1 million.\n"
    assert second.stderr.splitlines()[0] == f"session {outcome['session']} (resumed)"
    sent = server.requests[1]["messages"]
    assert [m["content"] for m in sent] == [
        "capital of France?", "Paris.", "how many people live there?"]
    turns = [e["data"]["turn"] for e in events(tmp_path, outcome["session"])
             if e["type"] == "turn/start"]
    assert turns == [1, 2]


def test_run_exit_status_follows_the_turn_end(tmp_path: Path) -> None:
    refused = Fail(401, openai_error(401, "Incorrect API key provided",
                                     type_="invalid_request_error", code="invalid_api_key"))
    with ScriptedServer([Stream(openai_reply("cut", finish="length")), refused]) as server:
        cut = dsh(tmp_path, "run", "write a novel", *local(server))
        failed = dsh(tmp_path, "run", "again", *local(server))
    assert cut.returncode == 3 and cut.stdout == "cut\n"
    assert failed.returncode == 1
    assert failed.stderr.splitlines()[-1].startswith("error[AUTHENTICATION]: ")
    assert "HTTP 401" in failed.stderr


def test_missing_key_is_one_line_naming_the_variable(tmp_path: Path) -> None:
    for provider, variable in (("deepseek", "DEEPSEEK_API_KEY"),
                               ("anthropic", "ANTHROPIC_API_KEY"),
                               ("openai", "OPENAI_API_KEY")):
        result = dsh(tmp_path, "run", "hi", "--provider", provider)
        assert result.returncode == 1
        # a new user who ran 'dsh run' as the README says learns the other providers too
        others = ", ".join(p for p in ("deepseek", "openai", "anthropic", "openai-compatible")
                           if p != provider)
        assert result.stderr.splitlines() == [
            f"error[MISSING_KEY]: no API key for --provider {provider}: set {variable}, or "
            f"choose another provider with --provider ({others}; openai-compatible with "
            "--base-url needs no key)"]
    unknown = dsh(tmp_path, "run", "hi", "--provider", "gemini")
    assert unknown.returncode == 2 and "choose one of deepseek, openai" in unknown.stderr


def test_cli_doc_chat_lines_name_the_key_they_need(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")
    section = doc.split("## Chat with your own key", 1)[1].split("\n## ", 1)[0]
    lines = [line.strip() for line in section.splitlines() if line.startswith("    ")]
    pairs = [(lines[i], lines[i + 1]) for i in range(len(lines) - 1)
             if lines[i].startswith("export ") and lines[i + 1].startswith(".venv/bin/dsh chat")]
    assert [p[0].split("=")[0] for p in pairs] == ["export DEEPSEEK_API_KEY",
                                                   "export ANTHROPIC_API_KEY"]
    for export, command in pairs:
        variable = export.split()[1].split("=")[0]
        # Without the key the command stops at once, naming the variable the line above sets.
        result = dsh(tmp_path, *command.split()[1:])
        assert result.returncode == 1
        assert result.stderr.startswith("error[MISSING_KEY]")
        assert f": set {variable}, or choose another provider" in result.stderr


def test_ctrl_c_mid_stream_keeps_the_partial_answer_and_exits_130(tmp_path: Path) -> None:
    with ScriptedServer([Stall(openai_reply("Once upon a time")[:3])]) as server:
        child = start_run(tmp_path, "a story", server)
        read_until(child, b"time")
        child.send_signal(signal.SIGINT)
        err = finish(child)
    assert child.returncode == 130, err.decode()
    assert b"[interrupted" in err
    log = events(tmp_path, err.decode().split()[1])
    (message,) = [e for e in log if e["type"] == "assistant/message"]
    assert message["data"]["interrupted"] is True
    assert message["data"]["message"]["content"] == [{"type": "text", "text": "Once upon a time"}]
    assert log[-1]["data"]["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}


def test_kill_9_mid_stream_then_the_session_continues(tmp_path: Path) -> None:
    with ScriptedServer([Stall(openai_reply("Half an ans")[:3]),
                         Stream(openai_reply("A whole answer."))]) as server:
        child = start_run(tmp_path, "question one", server)
        read_until(child, b"ans")
        child.kill()  # SIGKILL: no handler runs, nothing is flushed on the way out
        err = finish(child)
        session = err.decode().split()[1]
        again = dsh(tmp_path, "run", "question two", "--session", session, *local(server))
    assert again.returncode == 0, again.stderr
    assert again.stdout == "A whole answer.\n"
    log = events(tmp_path, session)
    ends = [e["data"]["reason"]["kind"] for e in log if e["type"] == "turn/end"]
    assert ends == ["interrupted", "completed"]  # crash repair closed turn 1 on resume
    # The second request is valid for the server: the first prompt, then the second.
    sent = [m["content"] for m in server.requests[1]["messages"] if m["role"] == "user"]
    assert sent == ["question one", "question two"]


def test_shell_tools_without_a_terminal_say_every_command_will_be_refused(tmp_path: Path) -> None:
    call = [("call_1", "shell", json.dumps({"command": "echo hi"}))]
    with ScriptedServer([Stream(openai_reply("Running it.", tool_calls=call)),
                         Stream(openai_reply("It was refused."))]) as server:
        result = subprocess.run([*DSH, "run", "say hi", "--tools", "shell", *local(server)],
                                env=child_env(tmp_path), input="y\n", capture_output=True,
                                text=True, timeout=120, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr
    assert ("note: stdin is not a terminal, so no shell command can be approved: each one the "
            "model asks for is refused (NOT_APPROVED)") in result.stderr
    sid = next(line.split()[1] for line in result.stderr.splitlines()
               if line.startswith("session "))
    results = [e for e in events(tmp_path, sid) if e["type"] == "tool/result"]
    assert [r["data"]["error"]["code"] for r in results] == ["NOT_APPROVED"]


def test_kill_9_mid_stream_the_resumed_model_sees_the_cut_off_answer(tmp_path: Path) -> None:
    # The streamed text is durable (its chunks are in the log) when the process is killed; the
    # next run puts it on the model's view as an interrupted assistant message, between the
    # first prompt and the second (docs/agent.md#resume).
    with ScriptedServer([Stall(openai_reply("Half an answer")[:3]),
                         Stream(openai_reply("A whole answer."))]) as server:
        child = start_run(tmp_path, "question one", server)
        assert child.stderr is not None
        first = child.stderr.readline().decode()
        assert first.startswith("session "), first
        session = first.split()[1]
        read_until(child, b"answer")
        chunks: list[str] = []
        while "".join(chunks) != "Half an answer":  # wait until the write-behind wrote them
            chunks = [e["data"]["chunk"].get("text", "") for e in events(tmp_path, session)
                      if e["type"] == "assistant/chunk"]
            assert child.poll() is None, "dsh run ended before its chunks were durable"
        child.send_signal(signal.SIGKILL)
        finish(child)
        assert child.returncode == -signal.SIGKILL
        again = dsh(tmp_path, "run", "question two", "--session", session, *local(server))
    assert again.returncode == 0, again.stderr
    assert again.stdout == "A whole answer.\n"
    sent = [(m["role"], m["content"]) for m in server.requests[1]["messages"]]
    assert sent == [("user", "question one"), ("assistant", "Half an answer"),
                    ("user", "question two")]
    log = events(tmp_path, session)
    [recovered] = [e for e in log if e["type"] == "assistant/message"
                   and e["data"].get("interrupted")]
    assert recovered["data"]["turn"] == 2 and recovered["data"]["step"] == 1
    assert [e["data"]["reason"]["kind"] for e in log if e["type"] == "turn/end"] == [
        "interrupted", "completed"]


def test_a_bad_session_id_is_refused_before_the_key_and_the_network(tmp_path: Path) -> None:
    # No key, no server: the id is what is wrong, and it is said first (docs/cli.md).
    store = f"sqlite:{tmp_path / 'store.db'}"
    assert dsh(tmp_path, "import", "--examples", "--store", store).returncode == 0
    listed = json.loads(dsh(tmp_path, "ls", "--json", "--store", store).stdout)
    start = str(listed[0]["id"])[:3]
    prefix = dsh(tmp_path, "run", "--session", start, "hi", "--store", store,
                 "--provider", "deepseek")
    assert prefix.returncode == 1
    assert prefix.stderr.splitlines()[-1].startswith("error[SESSION_ID_PREFIX]: ")
    unreachable = ("--provider", "openai-compatible", "--base-url", "http://127.0.0.1:9/v1",
                   "--model", "m")
    for command in (("run", "--session", "a" * 300, "hi"), ("chat", "a" * 300),
                    ("chat", start)):
        result = dsh(tmp_path, *command, "--store", store, *unreachable)
        assert result.returncode == 1, command
        assert result.stderr.splitlines()[-1].startswith(
            ("error[INVALID_ID]: ", "error[SESSION_ID_PREFIX]: ")), (command, result.stderr)
        assert "NETWORK" not in result.stderr and "MISSING_KEY" not in result.stderr

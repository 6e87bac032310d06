"""``dsh chat`` in a pseudo-terminal (pexpect): turns, a tool call, Ctrl+C mid-stream, resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.agent.providers.servers import (
    Fail,
    ScriptedServer,
    Stall,
    Stream,
    openai_error,
    openai_reply,
)

pexpect = pytest.importorskip("pexpect")

STORY = "Once upon a time there was a log that never forgot"


def spawn(tmp_path: Path, server: ScriptedServer, *args: str) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update({"DSH_HOME": str(tmp_path / "home"), "HOME": str(tmp_path), "TERM": "dumb",
                "COLUMNS": "100"})
    if "--tools" not in args:
        args = (*args, "--tools", "read")
    return pexpect.spawn(sys.executable, ["-m", "dsh.cli", "chat", *args,
                                          "--timeout", "60", "--provider", "openai-compatible",
                                          "--model", "local-model", "--base-url",
                                          server.base_url],
                         env=env, cwd=str(tmp_path), encoding="utf-8", timeout=90)


def test_chat_three_turns_ctrl_c_mid_stream_then_continue(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("remember the milk\n")
    call = [("call_1", "read_file", '{"path": "notes.txt"}')]
    server = ScriptedServer([
        Stream(openai_reply("Hi! How can I help?")),
        Stream(openai_reply("Let me look.", tool_calls=call)),
        Stream(openai_reply("The note says: remember the milk.")),
        Stall(openai_reply(STORY)[:3]),  # streams the story's start, then hangs
        Stream(openai_reply("...and it lived durably ever after.")),
    ])
    with server:
        chat = spawn(tmp_path, server)
        chat.expect(r"session (\S+) ·")
        session = chat.match.group(1)
        chat.expect_exact("you> ")
        chat.sendline("hello")
        chat.expect_exact("Hi! How can I help?")
        chat.expect_exact("you> ")
        chat.sendline("what is in notes.txt?")
        chat.expect_exact('read_file(path="notes.txt")')
        chat.expect_exact("remember the milk")  # the result line
        chat.expect_exact("The note says: remember the milk.")
        chat.expect_exact("you> ")
        chat.sendline("tell me a story")
        chat.expect_exact(STORY)
        chat.sendintr()  # Ctrl+C while the model is still streaming
        chat.expect_exact("[interrupted")
        chat.expect_exact("you> ")
        chat.sendline("/exit")
        chat.expect_exact(f"continue with: dsh chat {session}")
        chat.expect(pexpect.EOF)
        chat.close()
        assert chat.exitstatus == 0

        again = spawn(tmp_path, server, session)
        again.expect_exact(STORY)  # the interrupted message is in the history shown
        again.expect_exact("you> ")
        again.sendline("go on")
        again.expect_exact("...and it lived durably ever after.")
        again.expect_exact("you> ")
        again.sendline("/exit")
        again.expect(pexpect.EOF)
        again.close()
        assert again.exitstatus == 0

    last = server.requests[-1]["messages"]
    assert {"role": "assistant", "content": STORY} in last
    assert last[-1] == {"role": "user", "content": "go on"}
    out = subprocess.run([sys.executable, "-m", "dsh.cli", "events", session],
                         env={**os.environ, "DSH_HOME": str(tmp_path / "home")},
                         capture_output=True, text=True, check=True, timeout=60).stdout
    log = [json.loads(line) for line in out.splitlines()]
    ends = [e["data"]["reason"]["kind"] for e in log if e["type"] == "turn/end"]
    assert ends == ["completed", "completed", "aborted", "completed"]
    interrupted = [e for e in log if e["type"] == "assistant/message"
                   and e["data"].get("interrupted")]
    assert [m["data"]["message"]["content"] for m in interrupted] == [
        [{"type": "text", "text": STORY}]]


def test_chat_shell_commands_run_only_when_approved(tmp_path: Path) -> None:
    marker = tmp_path / "approved.txt"
    calls = [[("call_1", "shell", json.dumps({"command": f"echo yes > {marker.name}"}))],
             [("call_2", "shell", json.dumps({"command": "rm -rf ./*"}))]]
    server = ScriptedServer([
        Stream(openai_reply("Writing the file.", tool_calls=calls[0])),
        Stream(openai_reply("Done.")),
        Stream(openai_reply("Cleaning up.", tool_calls=calls[1])),
        Stream(openai_reply("Not allowed, leaving it.")),
    ])
    with server:
        chat = spawn(tmp_path, server, "--tools", "shell")
        chat.expect_exact("you> ")
        chat.sendline("write the marker")
        chat.expect_exact(f"$ echo yes > {marker.name}")
        chat.expect_exact("[y/N] ")
        chat.sendline("y")
        chat.expect_exact("exit status 0")
        chat.expect_exact("Done.")
        chat.expect_exact("you> ")
        chat.sendline("clean up")
        chat.expect_exact("$ rm -rf ./*")
        chat.expect_exact("[y/N] ")
        chat.sendline("n")
        chat.expect_exact("NOT_APPROVED")
        chat.expect_exact("Not allowed, leaving it.")
        chat.expect_exact("you> ")
        chat.sendline("/exit")
        chat.expect(pexpect.EOF)
        chat.close()
    assert chat.exitstatus == 0
    assert marker.read_text() == "yes\n"  # approved command ran; the refused one did not
    refused = [m for m in server.requests[3]["messages"] if m["role"] == "tool"]
    assert "not approved" in refused[-1]["content"]


def test_chat_show_compact_and_fork(tmp_path: Path) -> None:
    long = "The parser fails on nested brackets because the tokenizer drops the close. " * 25
    server = ScriptedServer([
        Stream(openai_reply(f"First answer. {long}")),
        Stream(openai_reply(f"Second answer. {long}")),
        Stream(openai_reply("Checkpoint: the tokenizer drops closing brackets.")),
        Stream(openai_reply("Answer in the branch.")),
    ])
    with server:
        chat = spawn(tmp_path, server)
        chat.expect(r"session (\S+) ·")
        session = chat.match.group(1)
        for prompt in ("first question", "second question"):
            chat.expect_exact("you> ")
            chat.sendline(f"{prompt} {long}")
        chat.expect_exact("Second answer.")
        chat.expect_exact("you> ")
        chat.sendline("/show")
        chat.expect_exact("user  #4")
        chat.expect_exact("── turn 2")
        chat.expect_exact("you> ")
        chat.sendline("/compact model")  # the chat's model writes the checkpoint
        chat.expect(r"compacted seqs \d+–\d+ into one checkpoint")
        chat.expect_exact("you> ")
        chat.sendline("/show")
        chat.expect_exact("Checkpoint: the tokenizer drops closing brackets.")
        chat.expect_exact("you> ")
        chat.sendline("/fork 4")  # seq 4 is the first prompt (/show lists "user  #4")
        chat.expect(rf"forked {session} at seq 4 as ([0-9a-f-]{{36}})")
        child = chat.match.group(1)
        chat.expect_exact("you> ")
        chat.sendline("a question in the branch")
        chat.expect_exact("Answer in the branch.")
        chat.expect_exact("you> ")
        chat.sendline("/nope")
        chat.expect_exact("unknown command /nope")
        chat.expect_exact("you> ")
        chat.sendline("/exit")
        chat.expect_exact(f"continue with: dsh chat {child}")
        chat.expect(pexpect.EOF)
        chat.close()
    assert chat.exitstatus == 0
    branch = server.requests[3]["messages"]
    # The branch: the inherited first prompt (its turn closed at the cut), then the new one.
    assert [m["role"] for m in branch] == ["user", "user"]
    assert branch[0]["content"].startswith("first question")
    assert branch[1]["content"] == "a question in the branch"


def test_a_kill_while_the_shell_prompt_waits_leaves_a_call_that_never_started(
        tmp_path: Path) -> None:
    # The approval is asked before the call is recorded: SIGKILLed at the [y/N] prompt, the
    # log holds the model's request but no tool/call, and the repair says the call was not
    # recorded as started (docs/agent.md#tool-execution), not that it may have run.
    import signal

    import dsh

    marker = tmp_path / "ran.txt"
    call = [("call_1", "shell", json.dumps({"command": f"echo ran > {marker.name}"}))]
    server = ScriptedServer([Stream(openai_reply("Running it.", tool_calls=call))])
    with server:
        chat = spawn(tmp_path, server, "--tools", "shell")
        chat.expect(r"session (\S+) ·")
        session = chat.match.group(1)
        chat.expect_exact("you> ")
        chat.sendline("write the marker")
        chat.expect_exact(f"$ echo ran > {marker.name}")
        chat.expect_exact("[y/N] ")
        chat.kill(signal.SIGKILL)
        chat.expect(pexpect.EOF)
        chat.close()
    assert chat.signalstatus == signal.SIGKILL
    assert not marker.exists()
    with dsh.open(f"sqlite:{tmp_path / 'home' / 'sessions.db'}") as store:
        read = store.read(session)
    types = [e["type"] for e in read.stored_events]
    assert types[-1] == "assistant/message" and "tool/call" not in types
    [result] = [e for e in read.closers if e["type"] == "tool/result"]
    [block] = result["data"]["message"]["content"]
    [text] = [b["text"] for b in block["content"]]
    assert text.startswith('The session was interrupted before the "shell" tool call call_1 '
                           "was recorded as started, so it most likely never ran")
    assert result["data"]["error"]["code"] == "TOOL_NOT_STARTED"


def test_a_failed_turn_is_said_once_kept_in_the_log_and_the_chat_exits_1(tmp_path: Path) -> None:
    refused = Fail(401, openai_error(401, "Incorrect API key provided",
                                     type_="invalid_request_error", code="invalid_api_key"))
    with ScriptedServer([refused, Stream(openai_reply("Hi!")), refused]) as server:
        chat = spawn(tmp_path, server, "--tools", "none")
        chat.expect(r"session (\S+) ·")
        session = chat.match.group(1)
        chat.expect_exact("you> ")
        chat.sendline("hello")
        chat.expect_exact("you> ")
        failed = chat.before
        chat.sendline("/exit")
        chat.expect(pexpect.EOF)
        chat.close()
        # before: "[turn failed: AUTHENTICATION: ...]" then "error[AUTHENTICATION]: ..."
        assert failed.count("AUTHENTICATION") == 1, failed
        assert "[turn failed: AUTHENTICATION" in failed
        assert chat.exitstatus == 1  # the last turn failed (docs/cli.md#chat-with-your-own-key)

        again = spawn(tmp_path, server, session, "--tools", "none")
        again.expect_exact("you> ")
        again.sendline("hello again")
        again.expect_exact("Hi!")
        again.expect_exact("you> ")
        again.sendline("/exit")
        again.expect(pexpect.EOF)
        again.close()
        assert again.exitstatus == 0  # a failed turn earlier, the last one completed
    out = subprocess.run([sys.executable, "-m", "dsh.cli", "events", session],
                         env={**os.environ, "DSH_HOME": str(tmp_path / "home")},
                         capture_output=True, text=True, check=True, timeout=60).stdout
    ends = [json.loads(line)["data"]["reason"]["kind"] for line in out.splitlines()
            if json.loads(line)["type"] == "turn/end"]
    assert ends == ["error", "completed"]

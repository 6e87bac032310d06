"""`dsh show` streams: --last, --from, --turn, a big session read by page, `| head` stops it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import dsh
from dsh.testing import LogBuilder
from tests.cli.test_cli import Dsh

TURNS = 400  # 8 events a turn: past the 2,048 events after which a writer keeps a restore point
PER = 8


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[Dsh, str]:
    root = tmp_path_factory.mktemp("show")
    url = f"sqlite:{root / 'big.db'}"
    _write_turns(url, LogBuilder("big"))
    return Dsh(root), url


def _write_turns(url: str, log: LogBuilder) -> LogBuilder:
    """``log`` plus TURNS tool-call turns, written to ``url`` with a flush every 500 events."""
    for number in range(1, TURNS + 1):
        log.tool_call_turn(f"call_{number}")
        log.close_tool(f"call_{number}")
    with dsh.open(url) as store:
        session = store.session(log.session.id)
        for event in log.events:
            session.append(event["type"], event["data"], surface_op=event.get("surfaceOp"),
                           source_event_seqs=event.get("sourceEventSeqs"))
            if event["seq"] % 500 == 0:
                store.flush(session)
    return log


def test_show_last_from_and_turn_print_the_parts_of_the_whole(big: tuple[Dsh, str]) -> None:
    cli, url = big
    whole = cli.json("show", "big", "--store", url, "--json")
    items = whole["items"]
    assert whole["session"] == cli.json("ls", "--store", url, "--json")[0]
    assert whole["session"]["events"] == TURNS * PER and whole["session"]["turns"] == TURNS
    # the last entries begin inside turn 400: its turn/start (read back) comes first, as --from
    last_turn = [item for item in items if item["kind"] == "turn"][-1]
    assert last_turn["turn"] == TURNS and "turn" not in [item["kind"] for item in items[-3:]]
    assert cli.json("show", "big", "--store", url, "--json", "--last", "3")["items"] == [
        last_turn, *items[-3:]]
    assert cli.json("show", "big", "--store", url, "--json", "--last", "4")["items"] == items[-4:]
    tail = cli.json("show", "big", "--store", url, "--json", "--from", "3100")["items"]
    # 3100 is inside turn 388: its turn/start (read back) comes first, then seq 3100 on
    assert tail == [item for item in items if item["seq"] >= 3100 or
                    (item["kind"] == "turn" and item["turn"] == 3100 // PER + 1)]
    assert tail[0]["kind"] == "turn" and tail[0]["seq"] < 3100
    turn = cli.json("show", "big", "--store", url, "--json", "--turn", "123")["items"]
    assert turn[0] == {"kind": "turn", "seq": 122 * PER, "turn": 123, "time": turn[0]["time"]}
    assert turn == [item for item in items if 122 * PER <= item["seq"] < 123 * PER]
    text = cli("show", "big", "--store", url, "--last", "2").stdout.splitlines()
    assert text[0] == "session big  run it" and text[2].startswith(f"── turn {TURNS} ──")
    assert text[3].startswith("assistant  #3195  ")
    assert [line for line in text if line.startswith("tool  ")] == ["tool  #3197  bash [call_400]"]
    missing = cli("show", "big", "--store", url, "--turn", "401", check=1).stderr
    assert missing.startswith("error[TURN_NOT_FOUND]: session 'big' has no turn 401")
    assert "'dsh show big --last 20' shows its end" in missing  # the command to run, not 'ID'
    both = cli("show", "big", "--store", url, "--last", "2", "--turn", "3", check=2).stderr
    assert "pass at most one of --last, --from and --turn" in both


def test_show_into_a_pipe_that_closes_stops_quietly_with_exit_0(big: tuple[Dsh, str]) -> None:
    cli, url = big
    proc = subprocess.Popen([sys.executable, "-m", "dsh.cli", "show", "big", "--store", url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli.env)
    assert proc.stdout is not None and proc.stderr is not None
    first = [proc.stdout.readline() for _ in range(3)]
    proc.stdout.close()  # what `head -3` does once it has its lines
    assert proc.wait(timeout=120) == 0
    with proc.stderr:
        assert proc.stderr.read() == b""
    assert first[0].startswith(b"session big")
    assert first[2].startswith("── turn 1 ".encode())
    shell = subprocess.run(f"{sys.executable} -m dsh.cli show big --store {url} | head -n 2; "
                           "echo ${PIPESTATUS[0]}", shell=True, executable="/bin/bash",
                           capture_output=True, text=True, env=cli.env, timeout=120, check=True)
    assert shell.stdout.splitlines()[-1] == "0" and shell.stderr == ""


def test_show_json_of_a_paged_session_is_valid_json(big: tuple[Dsh, str]) -> None:
    cli, url = big
    text = cli("show", "big", "--store", url, "--json", "--last", "1").stdout
    assert [item["kind"] for item in json.loads(text)["items"]] == [
        "turn", "message"]  # a tool result, after the line of the turn it belongs to
    assert Path(url.removeprefix("sqlite:") + ".dsh-checkpoints").is_dir()  # read by page


def test_a_paged_session_whose_first_prompt_left_the_view_is_not_titled_by_it(
        tmp_path: Path) -> None:
    # a quarantine recorded past a big session's first pages takes the first prompt off the
    # model view: dsh show's header must not show it (docs/forgetting.md#what-titles-show)
    # and says what dsh ls says; before it, the paged read titles the session by its pages
    url = f"sqlite:{tmp_path / 'q.db'}"
    log = LogBuilder("q")
    log.completed_turn("my password is hunter2")
    _write_turns(url, log)
    cli = Dsh(tmp_path)
    before = cli.json("show", "q", "--store", url, "--json", "--last", "1")["session"]
    assert before["title"] == "my password is hunter2"
    prompt = next(e["seq"] for e in log.events if e["type"] == "user/message")
    cli("quarantine", "q", str(prompt), "--store", url)
    after = cli.json("show", "q", "--store", url, "--json", "--last", "1")["session"]
    assert after["title"] == cli.json("ls", "--store", url, "--json")[0]["title"] == "run it"
    assert "hunter2" not in cli("show", "q", "--store", url, "--last", "1").stdout

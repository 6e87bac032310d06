"""Session text never drives the terminal it is printed on (`dsh show`, `dsh ls`, errors).

A log holds text from models, tools and imported transcripts: an escape sequence in it must be
printed as an escape (``\\x1b``), on a pipe and on a real terminal (a pty) alike.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

import dsh
from dsh import create_user_message
from dsh.transcript import printable
from tests.cli.test_cli import Dsh

HOSTILE = "\x1b]0;pwned-title\x07\x1b[2Jhello \u202egnp.exe\u202c\r\x9b31m"
HOSTILE_SHOWN = "\\x1b]0;pwned-title\\x07\\x1b[2Jhello \\u202egnp.exe\\u202c\\x0d\\x9b31m"
# the five controls rich's Text would drop (BEL, CR, BS, VT, FF), each escaped
FIVE = "zebra \x07a\rb \x08c \x0bd \x0ce"
FIVE_SHOWN = "zebra \\x07a\\x0db \\x08c \\x0bd \\x0ce"
SGR = re.compile(r"\x1b\[[0-9;]*m")  # styles rich draws on a terminal (bold, dim)


def prompted(store: dsh.Store, sid: str, text: str) -> dsh.Session:
    """Session ``sid`` of ``store`` with turn 1 open on the user prompt ``text``."""
    session = store.session(sid)
    session.append("turn/start", {"turn": 1})
    session.append("user/message", create_user_message(
        {"content": [{"type": "text", "text": text}], "source": {"kind": "user"}}),
        surface_op="append")
    return session


@pytest.fixture
def hostile_store(tmp_path: Path) -> tuple[Dsh, str]:
    url = f"sqlite:{tmp_path / 'sessions.db'}"
    with dsh.open(url) as store:
        prompted(store, "ansi", HOSTILE)
    return Dsh(tmp_path), url


def test_printable_escapes_controls_and_keeps_text() -> None:
    assert printable("plain\ttext\nnext line é ✓") == "plain\ttext\nnext line é ✓"
    assert printable("\x1b[2J\x00\x7f\x9b\u2066") == "\\x1b[2J\\x00\\x7f\\x9b\\u2066"


@pytest.mark.parametrize("command", ["show", "ls", "search"])
def test_piped_output_holds_no_control_character(hostile_store: tuple[Dsh, str],
                                                 command: str) -> None:
    cli, url = hostile_store
    args = {"show": ["show", "ansi"], "ls": ["ls"], "search": ["search", "hello"]}[command]
    out = cli(*args, "--store", url).stdout
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out and "\x9b" not in out
    if command == "search":
        # docs/stores.md#search: a snippet shows each terminal escape sequence as one space,
        # but for an OSC title's text, which stays as words: a word inside the title is found
        # too; what is left of the message is escaped as everywhere else
        shown = "pwned-title hello \\u202egnp.exe\\u202c\\x0d\n"
        assert out == "ansi  #1  user  " + shown
        assert cli("search", "pwned", "--store", url).stdout == "ansi  #1  user   " + shown
        return
    assert "\\x1b]0;pwned-title" in out
    if command == "show":
        assert HOSTILE_SHOWN in out


@pytest.mark.parametrize("command", ["events", "messages"])
def test_json_output_escapes_c1_controls(hostile_store: tuple[Dsh, str], command: str) -> None:
    """U+009B (CSI), DEL and bidi overrides leave dsh events / dsh messages as JSON escapes."""
    cli, url = hostile_store
    out = cli(command, "ansi", "--store", url).stdout
    assert not any("\x7f" <= ch <= "\x9f" for ch in out)  # main: a raw U+009B
    assert "\\u009b31m" in out and "\x1b" not in out
    assert "\u202e" not in out and "\u202c" not in out  # main: raw, reordering the line
    assert "\\u202egnp.exe\\u202c" in out
    if command == "events":
        messages = [json.loads(line)["data"] for line in out.splitlines()
                    if '"user/message"' in line]
    else:
        messages = json.loads(out)
    assert messages[-1]["content"][0]["text"] == HOSTILE  # the same value


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "atif", "inspect", "claude-code",
                                 "codex"])
def test_a_json_export_escapes_c1_controls_and_bidi(hostile_store: tuple[Dsh, str],
                                                    fmt: str) -> None:
    """``dsh export`` of a JSON format writes U+009B and bidi overrides as JSON escapes."""
    cli, url = hostile_store
    out = cli("export", "ansi", "--format", fmt, "--store", url).stdout
    assert not any("\x7f" <= ch <= "\x9f" for ch in out)  # main: a raw U+009B (CSI)
    assert "\u202e" not in out and "\u202c" not in out  # main: raw, reordering the line
    assert "\\u009b31m" in out and "\\u202egnp.exe\\u202c" in out
    docs = [json.loads(line) for line in out.splitlines()] if fmt in ("claude-code", "codex") \
        else [json.loads(out)]
    assert any(HOSTILE in text for text in _strings(docs))  # the same values


def _strings(value: object) -> list[str]:
    """Every string in a parsed JSON value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [text for item in value for text in _strings(item)] if isinstance(value, list) \
        else []


def _on_a_terminal(args: list[str], env: dict[str, str]) -> bytes:
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "dsh.cli", *args], stdout=follower,
                            stderr=follower, stdin=subprocess.DEVNULL, env=env)
    os.close(follower)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], 60)
            if not ready:
                break
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
        proc.wait(timeout=60)
    assert proc.returncode == 0, b"".join(chunks)[-2000:]
    return b"".join(chunks)


def test_a_terminal_gets_colour_but_no_escape_from_the_session(
        hostile_store: tuple[Dsh, str]) -> None:
    cli, url = hostile_store
    env = {key: value for key, value in cli.env.items() if key != "NO_COLOR"}
    env["TERM"] = "xterm-256color"
    for args in (["show", "ansi", "--store", url], ["ls", "--store", url]):
        out = _on_a_terminal(args, env)
        if args[0] == "show":
            assert b"\x1b[" in out  # rich coloured it: this really was a terminal
        assert b"\x1b]0;" not in out and b"\x1b[2J" not in out and b"\x07" not in out
        assert "\u202e".encode() not in out and b"\xc2\x9b" not in out
        assert b"\\x1b]0;pwned-title\\x07" in out


def test_an_error_naming_hostile_input_is_escaped(tmp_path: Path) -> None:
    cli = Dsh(tmp_path)
    proc = cli("show", "no\x1b[2Jsuch", "--store", f"sqlite:{tmp_path / 'x.db'}", check=None)
    assert proc.returncode != 0
    assert "\x1b" not in proc.stderr and "error[" in proc.stderr


@pytest.fixture
def five_store(tmp_path: Path) -> tuple[Dsh, str]:
    url = f"sqlite:{tmp_path / 'sessions.db'}"
    with dsh.open(url) as store:
        for sid, text in (("ctl", FIVE), ("plain", "zebra plain")):
            prompted(store, sid, text)
    return Dsh(tmp_path), url


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
def test_the_controls_rich_drops_are_shown_escaped(five_store: tuple[Dsh, str],
                                                   terminal: bool) -> None:
    """BEL, CR, BS, VT and FF are escaped in show, ls and search (docs/cli.md#output)."""
    cli, url = five_store
    if terminal:  # rich lays out for a terminal (styles, the screen's width)
        cli.env["FORCE_COLOR"] = "1"
    show, ls, search = (SGR.sub("", cli(*args, "--store", url).stdout).splitlines()
                        for args in (["show", "ctl"], ["ls"], ["search", "zebra"]))
    assert show[0] == f"session ctl  {FIVE_SHOWN}"
    assert f"  {FIVE_SHOWN}" in show
    assert sorted(search) == [f"ctl  #1  user  {FIVE_SHOWN}", "plain  #1  user  zebra plain"]
    # the columns after the title line up: they are measured on the escaped title
    width = len(FIVE_SHOWN)
    dated = [re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d", "YYYY-MM-DD HH:MM", line) for line in ls]
    assert dated[0] == (f"ID     {'TITLE':<{width}}  TURNS  EVENTS  LAST ACTIVITY (UTC)  "
                        "LINEAGE  SOURCE")
    assert sorted(dated[1:]) == [
        f"{sid:<5}  {title:<{width}}      1       2  YYYY-MM-DD HH:MM     -        dsh"
        for sid, title in (("ctl", FIVE_SHOWN), ("plain", "zebra plain"))]


def test_crlf_is_a_line_end_and_a_lone_cr_is_shown(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'sessions.db'}"
    with dsh.open(url) as store:
        session = store.session("crlf")
        session.append("turn/start", {"turn": 1})
        session.append("user/message", create_user_message(
            {"content": [{"type": "text", "text": "first\r\nzebra\rsecond"}],
             "source": {"kind": "user"}}), surface_op="append")
    cli = Dsh(tmp_path)
    show = cli("show", "crlf", "--store", url).stdout.splitlines()
    assert show[0] == "session crlf  first"
    body = [line for line in show if "first" in line or "second" in line][1:]
    assert body == ["  first", "  zebra\\x0dsecond"]
    assert cli("search", "zebra", "--store", url).stdout == (
        "crlf  #1  user  first zebra\\x0dsecond\n")


CODE_PROMPT = ("Fix this:\n\n```python\ndef f(x):\n    return  x  *  2\n```\n\n"
               "two  spaces,\ta tab\n\n\n  indented")


def test_markdown_export_keeps_message_whitespace_and_escapes_controls_in_heads(
        tmp_path: Path) -> None:
    # docs/cli.md (dsh export, Output): message text is fenced as it was written (code
    # blocks, runs of spaces, blank lines); a one-line field (the title) has each run of spaces
    # made one, and its control characters shown as escapes, never dropped as whitespace
    url = f"sqlite:{tmp_path / 'sessions.db'}"
    with dsh.open(url) as store:
        session = prompted(store, "md", CODE_PROMPT)
        session.append("session/title", {"title": "Fix  the\x1fbuild\x0bnow\x85ok"})
    md = Dsh(tmp_path)("export", "md", "--format", "markdown", "--store", url).stdout
    assert f"\n````text\n{CODE_PROMPT}\n````\n" in md
    assert "\n**Fix the\\\\x1fbuild\\\\x0bnow\\\\x85ok**\n" in md


def test_a_lone_surrogate_is_escaped_and_ls_columns_stay_aligned(tmp_path: Path) -> None:
    # before: printable() left U+D800 alone; stdout wrote it as the six characters \ud800
    # while `dsh ls` measured one, so every column after TITLE was shifted five places
    assert printable("a\ud800b\udfff") == "a\\ud800b\\udfff"
    url = f"sqlite:{tmp_path / 'sessions.db'}"
    with dsh.open(url) as store:
        prompted(store, "lone", "half \ud800 a pair")
        prompted(store, "plain", "a plain prompt")
    cli = Dsh(tmp_path)
    lines = cli("ls", "--store", url).stdout.splitlines()
    header = lines[0]
    turns_end = header.index("TURNS") + len("TURNS")
    rows = {line.split()[0]: line for line in lines[1:]}
    assert "half \\ud800 a pair" in rows["lone"]
    for line in rows.values():
        assert line[turns_end - 1] == "1" and line[turns_end] == " ", lines
    shown = cli("show", "lone", "--store", url).stdout
    assert "half \\ud800 a pair" in shown

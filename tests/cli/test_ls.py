"""``dsh ls`` as a person and as a pipe read it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh import create_user_message
from tests.cli.test_cli import Dsh
from tests.cli.test_terminal_safety import prompted


def render_time(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M")

LONG = ("Please find out why the nightly export job writes duplicated rows into the warehouse "
        "table when the upstream feed is retried")
PARENT = "a-parent-session-with-a-rather-long-identifier-0123456789"


def _store_with_long_values(root: Path) -> str:
    url = f"sqlite://{root / 'long.db'}"
    with dsh.open(url) as store:
        prompted(store, PARENT, LONG)
    return url


@pytest.mark.no_speedups
def test_ls_piped_prints_whole_titles_and_lineage(tmp_path: Path) -> None:
    dsh_ = Dsh(tmp_path)
    url = _store_with_long_values(tmp_path)
    dsh_("fork", PARENT, "--at", "1", "--as", "child", "--store", url)
    dsh_.env.pop("COLUMNS")  # a pipe, no terminal width: values must come whole
    out = dsh_("ls", "--store", url).stdout
    assert LONG in out  # 125 characters, not cut at 80 columns
    assert "fork of a-parent @1" in out  # a short unique prefix leaves the title its room
    assert len(out.splitlines()[1]) > 150
    found = subprocess.run(["grep", "-c", "upstream feed is retried"], input=out, text=True,
                           capture_output=True, check=True).stdout
    assert found == "2\n"  # parent and child


@pytest.mark.no_speedups
def test_ls_terminal_layout_cuts_only_titles(tmp_path: Path) -> None:
    from dsh.cli import _render as render
    url = _store_with_long_values(tmp_path)
    with dsh.open(url) as store:
        store.fork(PARENT, 1, child_id="child")
    Dsh(tmp_path)  # the private HOME
    with dsh.open(url) as store:
        rows = [render.session_row(store.read(sid).header, store.read(sid).stored_events,
                                   source_format="dsh")
                for sid in ("child", PARENT)]
    table = render.render_sessions_table(rows, width=80)
    assert LONG not in table and LONG[:11] + "…" in table
    assert "fork of a-parent @1" in table


def test_ls_orders_sources_without_timestamps_by_the_file_time_it_shows(
        tmp_path: Path) -> None:
    # before: those sessions were listed after every dated one, though the file time shown
    # for them (the bundled examples' mtime) was the newest in the listing
    dsh_ = Dsh(tmp_path)
    dsh_("import", "--examples")
    rows = dsh_.json("ls", "--json")
    untimed = [r for r in rows if not r["timed"]]
    assert {r["sourceFormat"] for r in untimed} == {"swe-agent", "mini-swe-agent", "anthropic",
                                                     "openai-chat"}
    shown = [(-r["lastActivityMs"], r["id"]) for r in rows]
    assert shown == sorted(shown)  # newest first by the time shown, ids breaking ties
    newest_dated = max(r["lastActivityMs"] for r in rows if r["timed"])
    assert all(r["lastActivityMs"] > newest_dated for r in untimed)  # the examples' mtime
    assert rows[:len(untimed)] == untimed
    table = dsh_("ls").stdout.splitlines()
    for row in untimed:
        [line] = [x for x in table if x.startswith(row["id"])]
        when = render_time(row["lastActivityMs"])
        assert f"  {when} file  -  " in line  # the file's time, said to be one


def test_ls_fork_was_created_no_later_than_its_last_activity(tmp_path: Path) -> None:
    dsh_ = Dsh(tmp_path)
    dsh_("import", "--examples")
    dsh_("fork", "11111111-2222-4333-8444-555555555555", "--at", "6", "--as", "branch-a")
    [row] = [r for r in dsh_.json("ls", "--json") if r["id"] == "branch-a"]
    assert row["createdAtMs"] <= row["lastActivityMs"]
    assert dsh_.json("ls", "--json")[0]["id"] == "branch-a"  # the newest activity


def test_fork_mid_turn_leaves_exactly_one_end_seed_after_the_cut(tmp_path: Path) -> None:
    dsh_ = Dsh(tmp_path)
    dsh_("import", "--examples")
    parent = dsh_.event_lines("22222222-2222-4333-8444-555555555555")
    [call] = [e for e in parent if e["type"] == "tool/call"][-1:]
    dsh_("fork", "22222222-2222-4333-8444-555555555555", "--at", str(call["seq"]), "--as", "mid")
    after = dsh_.event_lines("mid")[call["seq"] + 1:]
    assert [e["type"] for e in after] == ["session/end-seed", "tool/result", "step/end",
                                          "turn/end"]
    assert after[0]["data"] == {"inherited": True}
    assert json.loads(dsh_("verify", "mid", "--json").stdout)["violations"] == []


LS_PROBE = """
import json, sys
from dsh.cli import main
try:
    main(["ls", "--store", sys.argv[1]])
except SystemExit as exit:
    assert exit.code == 0, exit.code
loaded = sorted(m for m in sys.modules if m.split(".")[0] in
                ("asyncio", "anthropic", "openai", "httpx", "rich", "filelock")
                or m in ("dsh.agent._loop", "dsh.interop"))
sys.stderr.write(json.dumps(loaded))
"""


@pytest.mark.parametrize("scheme", ["sqlite", "jsonl"])
def test_ls_piped_loads_no_asyncio_rich_lock_or_sdk(tmp_path: Path, scheme: str) -> None:
    # `dsh ls` over 5,000 sessions is mostly interpreter start (bench/bench_ls.py): the agent
    # loop, asyncio, rich, filelock and the SDKs are for other commands.
    url = f"{scheme}://{tmp_path / ('s.db' if scheme == 'sqlite' else 'store')}"
    with dsh.open(url) as store:
        session = store.session("probe")
        session.append("turn/start", {"turn": 1})
        session.append("user/message", create_user_message(
            {"content": [{"type": "text", "text": "hello"}], "source": {"kind": "user"}}),
            surface_op="append")
    env = {**Dsh(tmp_path).env}
    for run in ("first", "again"):  # JSONL: the first builds the listing index
        proc = subprocess.run([sys.executable, "-c", LS_PROBE, url], capture_output=True,
                              text=True, env=env, check=True)
        assert json.loads(proc.stderr) == [], run
        assert proc.stdout.splitlines()[1].startswith("probe  hello  ")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _printed(text: str, *, plain: bool) -> str:
    from dsh.cli import _render as render
    out, saved = io.StringIO(), sys.stdout
    sys.stdout = out
    try:
        if plain:
            render.print_text(text)
        else:
            render.make_console().print(text, markup=False, highlight=False)
    finally:
        sys.stdout = saved
    return out.getvalue()


def test_plain_ls_output_is_what_the_rich_console_prints(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dsh.cli import _render as render
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stdout", pipe)
    assert render.plain_stream() is pipe
    monkeypatch.setattr(sys, "stdout", _Tty())
    assert render.plain_stream() is None  # a terminal: rich decides width and colour
    monkeypatch.setattr(sys, "stdout", pipe)
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert render.plain_stream() is None  # rich would treat the pipe as a terminal
    monkeypatch.delenv("FORCE_COLOR")
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    assert render.plain_stream() is None
    monkeypatch.delenv("TTY_COMPATIBLE")
    monkeypatch.undo()

    table = ("ID    TITLE\nid-1  wide 漢字 ✓ … :smile: [bold]not markup[/bold] \\[x]\n"
             "id-2  inner   spaces kept   x")
    assert _printed(table, plain=True) == table + "\n" == _printed(table, plain=False)
    # a tab or a control character: rich prints it (tab expanded, controls escaped or dropped)
    hostile = table + "\ttab\x1b[2J\r\x07 \u202e"
    assert _printed(hostile, plain=True) == _printed(hostile, plain=False)
    assert "\\x1b[2J" in _printed(hostile, plain=True) and "\t" not in _printed(hostile, plain=True)


def test_ls_lineage_short_ids_unique_and_subagents_named_so(tmp_path: Path) -> None:
    from tests.conftest import CORPUS

    dsh_ = Dsh(tmp_path)
    url = _store_with_long_values(tmp_path)
    dsh_("fork", PARENT, "--at", "1", "--as", "a-parent-2", "--store", url)
    dsh_("fork", PARENT, "--at", "1", "--as", "child", "--store", url)
    table = dsh_("ls", "--store", url).stdout
    # "a-parent" starts two ids: the prefix grows until it names one
    assert "fork of a-parent-s @1" in table
    dsh_("import", str(CORPUS / "claude-code" / "ccviewer-v1.0.108-inline-sidechain.jsonl"))
    rows = {r["id"]: r for r in dsh_.json("ls", "--json")}
    subagents = [r for r in rows.values() if r["parentSession"]]
    assert len(subagents) == 2
    table = dsh_("ls").stdout
    for row in subagents:
        [line] = [x for x in table.splitlines() if x.startswith(row["id"])]
        assert f"subagent of {row['parentSession'][:8]}  " in line
        assert row["lineage"] == f"subagent of {row['parentSession']}"


@pytest.mark.parametrize(("title", "shown"), [
    ("abcdefghij\x07\x07xyz", "abcdefghij…"),  # the escape does not fit: left out whole
    ("abcdefg\x07\x07xyz", "abcdefg\\x07…"),  # one fits, the next does not
    ("abcdefghi\u202exyzuvw", "abcdefghi…"),  # a 6-character \u escape
    ("abcdefghijk\x1b", "abcdefghijk…"),  # the last character of room: a whole escape or none
    ("abcdefghijkl", "abcdefghijkl"),  # fits: not cut
    ("ab\x07cdef", "ab\\x07cdef"),  # fits once escaped: not cut
])
def test_ls_cuts_a_title_between_escapes_never_inside_one(title: str, shown: str) -> None:
    # docs/cli.md#output: a title is escaped, then cut to its column on whole escapes
    from dsh.cli import _render as render
    row = render.SessionRow(id="s1", title=title, turns=1, events=2, last_activity_ms=0,
                            parent_session=None, seed_length=None, source_format="dsh",
                            created_at_ms=0)
    table = render.render_sessions_table([row], width=40)  # the title gets its 12 at least
    line = table.splitlines()[1]
    assert line.startswith(f"s1  {shown.ljust(12)}  ")


def test_foreign_entries_lists_the_folder_once(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/cli.md#stores-and-ids: what a folder holds that no dsh store holds, from one
    # listing (the SQLite files among it were listed apart again)
    import sqlite3

    from dsh.cli import _common

    (tmp_path / "--home-me--").mkdir()
    (tmp_path / "s.db.dsh-search.db").write_bytes(b"")
    (tmp_path / "config.toml").write_text("")
    sqlite3.connect(tmp_path / "sessions.db").execute("CREATE TABLE t (x)").connection.close()
    for name in ("notes.txt", "a.db", "z"):
        (tmp_path / name).write_text("x")
    listings: list[Any] = []
    listdir = os.listdir

    def counted(path: Any) -> Any:  # (Path.iterdir lists through it too)
        listings.append(path)
        return listdir(path)

    monkeypatch.setattr(os, "listdir", counted)
    assert _common.foreign_entries(f"jsonl:{tmp_path}") == ["a.db", "notes.txt", "z"]
    assert len(listings) == 1
    assert _common.foreign_entries(f"jsonl:{tmp_path}", limit=1) == ["a.db"]
    assert _common.sqlite_stores_in(f"jsonl:{tmp_path}") == [tmp_path / "sessions.db"]

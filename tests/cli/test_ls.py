"""``dsh ls`` as a person and as a pipe read it (issue 9 items 10 and 17)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import dsh
from dsh import create_user_message
from tests.cli.test_cli import Dsh

LONG = ("Please find out why the nightly export job writes duplicated rows into the warehouse "
        "table when the upstream feed is retried")
PARENT = "a-parent-session-with-a-rather-long-identifier-0123456789"


def _store_with_long_values(root: Path) -> str:
    url = f"sqlite://{root / 'long.db'}"
    with dsh.open(url) as store:
        session = store.session(PARENT)
        session.append("turn/start", {"turn": 1})
        session.append("user/message", create_user_message(
            {"content": [{"type": "text", "text": LONG}], "source": {"kind": "user"}}),
            surface_op="append")
    return url


def test_ls_piped_prints_whole_titles_and_lineage(tmp_path: Path) -> None:
    dsh_ = Dsh(tmp_path)
    url = _store_with_long_values(tmp_path)
    dsh_("fork", PARENT, "--at", "1", "--as", "child", "--store", url)
    dsh_.env.pop("COLUMNS")  # a pipe, no terminal width: values must come whole
    out = dsh_("ls", "--store", url).stdout
    assert LONG in out  # 125 characters, not cut at 80 columns
    assert f"fork of {PARENT} @1" in out
    assert len(out.splitlines()[1]) > 200
    found = subprocess.run(["grep", "-c", "upstream feed is retried"], input=out, text=True,
                           capture_output=True, check=True).stdout
    assert found == "2\n"  # parent and child


def test_ls_terminal_layout_cuts_only_titles(tmp_path: Path) -> None:
    from dsh.cli import render

    url = _store_with_long_values(tmp_path)
    with dsh.open(url) as store:
        store.fork(store.session(PARENT), 1, "child")
    Dsh(tmp_path)  # the private HOME
    with dsh.open_store(url) as persistence:
        rows = [render.session_row(persistence.read(sid).header,
                                   persistence.read(sid).stored_events, source_format="dsh")
                for sid in ("child", PARENT)]
    table = render.render_sessions_table(rows, width=80)
    assert LONG not in table and LONG[:11] + "…" in table
    assert f"fork of {PARENT} @1" in table


def test_ls_orders_sources_without_timestamps_by_content_after_dated_ones(
        tmp_path: Path) -> None:
    dsh_ = Dsh(tmp_path)
    dsh_("import", "--examples")
    rows = dsh_.json("ls", "--json")
    untimed = [r for r in rows if not r["timed"]]
    assert {r["sourceFormat"] for r in untimed} == {"swe-agent", "mini-swe-agent", "anthropic",
                                                     "openai-chat"}
    assert rows[-len(untimed):] == untimed  # after every dated session
    titles = [r["title"] for r in untimed]
    assert titles == sorted(titles, key=str.casefold)
    table = dsh_("ls").stdout.splitlines()
    for row in untimed:
        [line] = [x for x in table if x.startswith(row["id"])]
        assert "  -  " in line and "2026-" not in line


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

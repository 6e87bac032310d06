"""A third new-user walk: what it found, each as a real ``dsh`` process with a fresh HOME."""

from __future__ import annotations

from pathlib import Path

import pytest

# HOME tmp_path, DSH_HOME tmp_path/home, no DSH_ variables
from tests.cli.test_new_user_walk import dsh


@pytest.mark.parametrize("args", [
    ("verify", "--all"), ("gc",), ("retention",), ("events", "x"), ("show", "x"),
    ("rm", "x"), ("erase", "--where", "model=x", "--receipt", "r.json"),
    # the commands that create a store: before, dsh import wrote a store into the folder
    # (--store ~/.claude/projects) and dsh init called it an existing one, exit 0
    ("import", "--examples"), ("init",),
])
def test_every_command_refuses_a_folder_that_is_no_store_and_writes_nothing(
        tmp_path: Path, args: tuple[str, ...]) -> None:
    # before: verify --all said "verified 0 sessions: all valid" and gc "0 sessions examined",
    # exit 0, where dsh ls said NOT_A_STORE; nothing is created there either
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "README.md").write_text("# notes\n")
    ran = dsh(tmp_path, *args, "--store", str(docs))
    assert ran.returncode == 1, ran.stdout
    # (dsh import says first where it imports from)
    said = ran.stderr.partition("\n")[2] if args[0] == "import" else ran.stderr
    assert said == (
        f"error[NOT_A_STORE]: jsonl://{docs} is not a dsh store: it holds no sessions and holds "
        "README.md, which a dsh store never holds; pass the store you meant with --store, or "
        "create one in a new folder with 'dsh init --store NEW_FOLDER'\n")
    assert sorted(p.name for p in docs.iterdir()) == ["README.md"]
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "home").exists()


def test_a_store_with_sessions_and_other_names_is_still_a_store(tmp_path: Path) -> None:
    store = tmp_path / "logs"
    assert dsh(tmp_path, "import", "--examples", "--store", f"{store}/").returncode == 0
    (store / "NOTES.txt").write_text("mine\n")
    verified = dsh(tmp_path, "verify", "--all", "--store", str(store))
    assert verified.returncode == 0, verified.stderr
    assert dsh(tmp_path, "gc", "--store", str(store)).returncode == 0


def test_a_foreign_database_with_a_loose_mode_is_refused_as_foreign_not_told_to_chmod(
        tmp_path: Path) -> None:
    # before: "must have no group or other permissions ...; fix it with 'chmod 600 ...'", and
    # only after the chmod error[FOREIGN_DATABASE]
    import sqlite3

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    with sqlite3.connect(home / "sessions.db") as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    conn.close()
    (home / "sessions.db").chmod(0o644)
    before = (home / "sessions.db").read_bytes()
    listed = dsh(tmp_path, "ls")
    assert listed.returncode == 1
    assert listed.stderr.startswith(
        f"error[FOREIGN_DATABASE]: SQLite database {home / 'sessions.db'} has an unversioned "
        "schema or application identity (user_version 0, application_id 0, 1 schema objects)")
    assert "chmod" not in listed.stderr
    assert (home / "sessions.db").read_bytes() == before
    assert sorted(p.name for p in home.iterdir()) == ["sessions.db"]
    # dsh's own store with the same loose mode is still refused, with the chmod advice
    own = tmp_path / "own.db"
    assert dsh(tmp_path, "init", "--store", str(own)).returncode == 0
    own.chmod(0o644)
    refused = dsh(tmp_path, "ls", "--store", str(own))
    assert refused.returncode == 1
    assert refused.stderr == (
        f"error[CONFIG]: SQLite database {own} must have no group or other permissions (dsh "
        f"refuses it otherwise), found mode 644; fix it with 'chmod 600 {own}'\n")


def test_fork_at_a_seq_past_the_end_says_the_range_once(tmp_path: Path) -> None:
    # before: "fork boundary 999 does not exist in session ... (last seq: 18) (seq=999)"
    sid = "11111111-2222-4333-8444-555555555555"
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    forked = dsh(tmp_path, "fork", "1111", "--at", "999")
    assert forked.returncode == 1
    assert forked.stderr == (
        f"error[INVALID_BOUNDARY]: --at 999: session '{sid}' has no event at seq 999, its seqs "
        f"run from 0 to 18; pass --at a seq in that range ('dsh events {sid}' lists them), or "
        "leave --at out to fork at its last event\n")


def test_import_of_a_file_that_is_no_transcript_says_so_and_names_the_formats(
        tmp_path: Path) -> None:
    # before: "README.md:1: the document is not valid JSON at column 1: ...; fix the document"
    readme = tmp_path / "README.md"
    readme.write_text("# My project\n\nNotes.\n")
    imported = dsh(tmp_path, "import", str(readme))
    assert imported.returncode == 1
    assert "fix the document" not in imported.stdout + imported.stderr
    assert f"{readme}: not a transcript dsh recognizes: it does not start as JSON; " \
        in imported.stdout
    assert ("dsh imports anthropic, atif, claude-code, codex, dsh, gemini-cli, mini-swe-agent, "
            "openai-chat, openhands, openhands-resolver, swe-agent, each a JSON or JSONL file: "
            "if the file is one of them, pass --format NAME to be told what is wrong in it"
            ) in imported.stdout
    # a JSON file that breaks off is still told where to fix it
    (tmp_path / "t.json").write_text('{"messages": [\n')
    broken = dsh(tmp_path, "import", str(tmp_path / "t.json"))
    assert broken.returncode == 1 and "not a transcript dsh recognizes" not in broken.stdout


@pytest.mark.parametrize("args", [("",), ("x.jsonl", "")])
def test_an_empty_import_path_is_refused_not_read_as_this_folder(
        tmp_path: Path, args: tuple[str, ...]) -> None:
    # before: `dsh import "$UNSET"` imported the current folder (Path("") is "."), exit 0
    (tmp_path / "x.jsonl").write_text("")
    refused = dsh(tmp_path, "import", *args)
    assert refused.returncode == 2
    assert f"path {len(args)} is empty; name a transcript file or a folder ('.' for this " \
        "folder)" in refused.stderr
    assert not (tmp_path / "home").exists()  # no store written

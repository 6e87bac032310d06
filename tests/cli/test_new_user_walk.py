"""A second new-user walk: what it found, each as a real ``dsh`` process on a real store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DSH = [sys.executable, "-m", "dsh.cli"]
SIMPLE = "11111111-2222-4333-8444-555555555555"  # a bundled example of 19 events, one turn


def dsh(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_API_KEY") and not k.startswith("DSH_")}
    env.update({"DSH_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)})
    return subprocess.run([*DSH, *args], env=env, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


def in_fresh_home(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``dsh args`` with HOME an empty ``tmp_path/home`` (made here) and no DSH_ variables."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_API_KEY") and not k.startswith("DSH_")}
    env["HOME"] = str(home)
    return subprocess.run([*DSH, *args], env=env, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


@pytest.fixture
def bad_store(tmp_path: Path) -> str:
    """A JSONL store of the examples whose session 1111… ends with a user/message of no shape.

    Appended by hand after the seal, as another program would: the read takes it (no seal
    covers it) and the model view refuses it (SHAPE at seq 19).
    """
    store = f"jsonl://{tmp_path / 'j'}"
    assert dsh(tmp_path, "import", "--examples", "--store", store).returncode == 0
    (log,) = (tmp_path / "j").glob(f"*/{SIMPLE}/session.jsonl")
    with log.open("a") as out:
        out.write('{"type":"user/message","seq":19,"time":1,"data":{"x\\u001b":"A"}}\n')
    return store


def test_show_marks_an_event_the_model_view_refuses_and_exits_1(
        tmp_path: Path, bad_store: str) -> None:
    # before: dsh show printed the transcript without seq 19 and exited 0, while dsh messages
    # and dsh verify refused it
    messages = dsh(tmp_path, "messages", "1111", "--store", bad_store)
    assert messages.returncode == 1 and "error[SHAPE]" in messages.stderr
    for args in ((), ("--last", "1"), ("--from", "19")):
        shown = dsh(tmp_path, "show", "1111", "--store", bad_store, *args)
        assert shown.returncode == 1, args
        mark = [line for line in shown.stdout.splitlines() if line.startswith("✗")]
        assert mark == ["✗ invalid event  #19  user/message  SHAPE: user/message at seq 19 "
                        "lacks an identified message (expected data to be the message itself: "
                        "{id, role: 'user', content, source}, e.g. from create_user_message(); "
                        "found keys x\\x1b)"], args
        assert "\x1b" not in shown.stdout + shown.stderr
        (line,) = shown.stderr.splitlines()
        assert line.startswith(f"error[SHAPE]: session '{SIMPLE}' holds an event the model view "
                               "refuses (marked in the transcript): user/message at seq 19")
        assert f"'dsh verify {SIMPLE}' lists every problem" in line
    assert "notes.txt has 3 lines." in dsh(tmp_path, "show", "1111", "--store",
                                            bad_store).stdout  # the rest is still shown
    as_json = dsh(tmp_path, "show", "1111", "--store", bad_store, "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["items"][-1] == {
        "kind": "invalid", "seq": 19, "type": "user/message", "code": "SHAPE",
        "problem": "user/message at seq 19 lacks an identified message (expected data to be "
                   "the message itself: {id, role: 'user', content, source}, e.g. from "
                   "create_user_message(); found keys x\x1b)"}
    assert json.loads(as_json.stderr)["code"] == "SHAPE"


def test_a_message_without_its_surface_op_is_marked_too(tmp_path: Path) -> None:
    store = f"jsonl://{tmp_path / 'j'}"
    assert dsh(tmp_path, "import", "--examples", "--store", store).returncode == 0
    (log,) = (tmp_path / "j").glob(f"*/{SIMPLE}/session.jsonl")
    with log.open("a") as out:
        out.write(json.dumps({"type": "user/message", "seq": 19, "time": 1, "data": {
            "id": "u9", "role": "user", "content": [{"type": "text", "text": "hidden"}],
            "source": {"kind": "user"}}}) + "\n")
    shown = dsh(tmp_path, "show", "1111", "--store", store)
    assert shown.returncode == 1
    assert ("✗ invalid event  #19  user/message  SURFACE: session event 'user/message' at seq "
            "19 is surface-eligible and requires a surfaceOp marker") in shown.stdout
    assert "error[SURFACE]" in shown.stderr


def test_view_marks_the_invalid_event_as_show_does(tmp_path: Path, bad_store: str) -> None:
    from starlette.testclient import TestClient

    from dsh.view import ViewStore, create_app

    store = ViewStore(bad_store)
    try:
        with TestClient(create_app(store, token="t0k3n-walk")) as client:
            page = client.get(f"/s/{SIMPLE}?token=t0k3n-walk").text
    finally:
        store.close()
    assert 'id="seq-19"' in page
    assert "✗ invalid event user/message SHAPE: user/message at seq 19 lacks an identified " \
           "message" in page
    assert "found keys x\\x1b)" in page


def test_ls_on_a_folder_that_is_no_store_says_so_and_how_to_make_one(tmp_path: Path) -> None:
    # before: a link at the top (/etc/os-release) was error[SYMLINK] "where the store keeps a
    # project folder", and a folder of plain files was "no sessions in the store", exit 0
    etc = tmp_path / "etc"
    (etc / "apt").mkdir(parents=True)
    (etc / "hostname").write_text("box\n")
    (tmp_path / "os-release").write_text("ID=debian\n")
    (etc / "os-release").symlink_to(tmp_path / "os-release")
    listed = dsh(tmp_path, "ls", "--store", str(etc))
    assert listed.returncode == 1
    assert listed.stderr == (
        f"error[NOT_A_STORE]: jsonl://{etc} is not a dsh store: it holds no sessions and holds "
        "apt, hostname, os-release, which a dsh store never holds; pass the store you meant with "
        "--store, or create one in a new folder with 'dsh init --store NEW_FOLDER'\n")
    # a link named like a project folder would take writes out of the store: still refused
    (etc / "--home-me--").symlink_to(etc / "apt")
    refused = dsh(tmp_path, "ls", "--store", str(etc))
    assert refused.returncode == 1 and refused.stderr.startswith("error[SYMLINK]: ")
    # an empty store, and $DSH_HOME's folder (config.toml, sessions.db), are still stores
    empty = tmp_path / "empty"
    assert dsh(tmp_path, "init", "--store", str(empty)).returncode == 0
    assert dsh(tmp_path, "ls", "--store", str(empty)).stderr.startswith("no sessions in the store")
    home = tmp_path / "home"
    assert dsh(tmp_path, "init", "--store", str(home / "sessions.db")).returncode == 0
    (home / "config.toml").write_text('provider = "deepseek"\n')
    hinted = dsh(tmp_path, "ls", "--store", str(home))
    assert hinted.returncode == 0 and "this folder holds a SQLite store" in hinted.stderr


def test_import_of_a_folder_counts_what_is_not_a_transcript_and_lists_it_with_verbose(
        tmp_path: Path) -> None:
    # before: each YAML file was "failed ... anthropic cassette lacks an interactions list"
    # (exit 1), and each other file not a transcript had an "ignored" line of its own
    folder = tmp_path / "usr"
    (folder / "doc").mkdir(parents=True)
    simple = Path(__file__).parents[2] / "src/dsh/examples/transcripts/claude-code/simple.jsonl"
    (folder / "doc" / "session.jsonl").write_bytes(simple.read_bytes())
    (folder / "doc" / "config.yaml").write_text("name: box\nitems:\n  - interactions: 1\n")
    (folder / "schema.json").write_text('{"$schema": "x", "type": "object"}')
    (folder / "broken.yml").write_text("a: [\n")
    quiet = dsh(tmp_path, "import", str(folder))
    assert quiet.returncode == 0, quiet.stdout
    assert quiet.stdout.splitlines() == [
        f"imported  {SIMPLE}  (claude-code)  {folder / 'doc' / 'session.jsonl'}",
        "1 imported, 0 skipped (already imported), 0 failed, 3 ignored (not transcripts; "
        "--verbose lists them)"]
    listed = dsh(tmp_path, "import", str(folder), "--verbose")
    assert [line.split()[:2] for line in listed.stdout.splitlines()[:-1]] == [
        ["ignored", f"{folder / 'broken.yml'}:"],
        ["ignored", f"{folder / 'doc' / 'config.yaml'}:"],
        ["skipped", f"{SIMPLE}"],
        ["ignored", f"{folder / 'schema.json'}:"]]
    assert "YAML without a top-level interactions key" in listed.stdout
    assert listed.stdout.splitlines()[-1].endswith("3 ignored (not transcripts)")
    # named on the command line, it is what was asked for: a failure
    named = dsh(tmp_path, "import", str(folder / "doc" / "config.yaml"))
    assert named.returncode == 1 and named.stdout.startswith("failed ")
    as_json = json.loads(dsh(tmp_path, "import", str(folder), "--json").stdout)
    assert len(as_json["ignored"]) == 3 and as_json["failed"] == []


def test_import_shows_the_folder_it_scans_on_a_terminal_and_nothing_when_piped(
        tmp_path: Path) -> None:
    # before: the whole tree was listed and sorted first with nothing on the screen
    # (`dsh import /`: more than 15 s of silence)
    from tests.cli.test_cli import Dsh
    from tests.cli.test_progress import _run_on_pty

    folder = tmp_path / "tree"
    (folder / "deep" / "er").mkdir(parents=True)
    (folder / "deep" / "er" / "notes.json").write_text("{}")
    (folder / "locked").mkdir()
    (folder / "locked").chmod(0)
    cli = Dsh(tmp_path)
    store = f"sqlite:{tmp_path / 'store.db'}"
    try:
        code, out, drawn = _run_on_pty(cli, "import", str(folder), "--store", store)
        piped = dsh(tmp_path, "import", str(folder), "--store", store)
    finally:
        (folder / "locked").chmod(0o700)
    assert code == 0 and b"looking for transcripts in" in drawn
    assert b"\x1b" not in out and out.endswith(b"1 ignored (not transcripts; --verbose lists "
                                               b"them)\n")
    assert "looking for" not in piped.stderr and "\x1b" not in piped.stderr
    if os.geteuid() != 0:  # root reads a folder of mode 0 all the same
        assert f"note: 1 folder could not be read and was passed over: {folder / 'locked'}" \
            in piped.stderr


def test_erase_refuses_a_bad_where_before_saying_which_session_a_prefix_matched(
        tmp_path: Path) -> None:
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    erased = dsh(tmp_path, "erase", "1111", "--where", "x", "--receipt", str(tmp_path / "r"))
    assert erased.returncode == 2
    assert erased.stderr.startswith("error[USAGE]: Invalid value for '--where': expected "
                                    "KEY=VALUE, got 'x'")  # before: the prefix note came first
    assert "is a prefix" not in erased.stderr and not (tmp_path / "r").exists()


def test_import_of_a_symlink_loop_or_a_dangling_link_says_so(tmp_path: Path) -> None:
    (tmp_path / "loop1").symlink_to(tmp_path / "loop1")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone.jsonl")
    loop = dsh(tmp_path, "import", str(tmp_path / "loop1"))
    assert loop.returncode == 1
    assert loop.stderr == (f"error[PATH_NOT_FOUND]: cannot import {tmp_path / 'loop1'}: it is a "
                           "symlink loop (a link that leads back to itself); name the real file\n")
    dangling = dsh(tmp_path, "import", str(tmp_path / "dangling"))
    assert dangling.stderr == (f"error[PATH_NOT_FOUND]: cannot import {tmp_path / 'dangling'}: it "
                               f"is a symlink to {tmp_path / 'gone.jsonl'}, which does not exist; "
                               "point the link at a file, or name the real file\n")
    missing = dsh(tmp_path, "import", str(tmp_path / "none"))
    assert missing.stderr.endswith("none: no such file or folder; check the path ('dsh import' "
                                   "without one reads your Claude Code and Codex logs)\n")


def test_import_of_a_missing_relative_path_is_path_not_found_named_once(tmp_path: Path) -> None:
    # before: error[CONFIG], and a short relative name was repeated as " (path=dangling)"
    (tmp_path / "dangling").symlink_to("gone.jsonl")
    missing = dsh(tmp_path, "import", "nonexistent")
    assert missing.returncode == 1
    assert missing.stderr == ("error[PATH_NOT_FOUND]: cannot import nonexistent: no such file or "
                              "folder; check the path ('dsh import' without one reads your "
                              "Claude Code and Codex logs)\n")
    dangling = dsh(tmp_path, "import", "dangling")
    assert dangling.returncode == 1
    assert dangling.stderr == ("error[PATH_NOT_FOUND]: cannot import dangling: it is a symlink to "
                               "gone.jsonl, which does not exist; point the link at a file, or "
                               "name the real file\n")
    as_json = json.loads(dsh(tmp_path, "import", "--json", "dangling").stderr)
    assert (as_json["code"], as_json["path"]) == ("PATH_NOT_FOUND", "dangling")


@pytest.mark.parametrize("bad", ["bad\x1b[31m", "x\x9by", "del\x7f", "rtl\u202eevil",
                                 "tab\there", "two\nlines"])  # (tab, newline: let through before)
def test_a_new_session_id_with_control_characters_is_refused_naming_the_option(
        tmp_path: Path, bad: str) -> None:
    # before: dsh fork --as 'bad\x1b[31m' created a child session of that id
    store = f"jsonl://{tmp_path / 'j'}"
    assert dsh(tmp_path, "import", "--examples", "--store", store).returncode == 0
    before = dsh(tmp_path, "ls", "--json", "--store", store).stdout
    forked = dsh(tmp_path, "fork", "1111", "--as", bad, "--store", store)
    assert forked.returncode == 2
    (line,) = forked.stderr.splitlines()
    assert line.startswith("error[USAGE]: Invalid value for '--as': a session id cannot hold "
                           "control characters or bidirectional overrides, got '")
    assert "\x1b" not in forked.stderr and "\u202e" not in forked.stderr
    assert dsh(tmp_path, "ls", "--json", "--store", store).stdout == before
    run = dsh(tmp_path, "run", "hi", "--session", bad, "--store", store)
    assert run.returncode == 2
    assert run.stderr.startswith("error[USAGE]: Invalid value for '--session': a session id "
                                 "cannot hold control characters")


def test_show_last_starts_with_the_turn_line_of_the_turn_it_opens_in(tmp_path: Path) -> None:
    # before: --from 12 printed "── turn 1 ──" first, --last 3 (the same entries) did not
    store = f"jsonl://{tmp_path / 'j'}"
    assert dsh(tmp_path, "import", "--examples", "--store", store).returncode == 0
    last = dsh(tmp_path, "show", "1111", "--last", "3", "--store", store).stdout.splitlines()
    body = last[2:]
    assert body[0].startswith("── turn 1 ──")
    assert [line.split("  ")[:2] for line in body[1:] if not line.startswith(" ")] == [
        ["assistant", "#7"], ["tool", "#12"], ["assistant", "#16"]]
    whole = dsh(tmp_path, "show", "1111", "--last", "100", "--store", store).stdout
    assert whole.count("── turn 1 ──") == 1  # a turn/start in the selection is not doubled
    as_json = json.loads(dsh(tmp_path, "show", "1111", "--last", "3", "--json",
                             "--store", store).stdout)
    assert [item["kind"] for item in as_json["items"]] == ["turn", "message", "message",
                                                           "message"]
    assert as_json["items"][0]["turn"] == 1


def test_restore_names_the_session_a_prefix_matched_as_rm_does(tmp_path: Path) -> None:
    # before: dsh rm 1111 said which session the prefix matched, dsh restore 1111 did not
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    note = f"note: '1111' is a prefix of session {SIMPLE}; writing to {SIMPLE}\n"
    removed = dsh(tmp_path, "rm", "1111")
    assert removed.returncode == 0 and removed.stderr == note
    restored = dsh(tmp_path, "restore", "1111")
    assert restored.returncode == 0 and restored.stderr == note
    assert restored.stdout == f"{SIMPLE}: restored\n"


def test_events_help_says_control_characters_are_escaped(tmp_path: Path) -> None:
    # before: "exactly as committed", while control and bidi characters are written as escapes
    listed = dsh(tmp_path, "--help").stdout
    (line,) = [line for line in listed.splitlines() if line.startswith("│ events ")]
    assert "exactly as committed" not in line and "escaped" in line
    own = " ".join(dsh(tmp_path, "events", "--help").stdout.split())
    assert "dsh export --format dsh-jsonl" in own


def test_quarantine_unquarantine_and_redact_name_the_session_a_prefix_matched(
        tmp_path: Path) -> None:
    # before: dsh rm, restore, approve and edit said which session a prefix matched before
    # writing to it; dsh quarantine, unquarantine and redact wrote without a word
    assert dsh(tmp_path, "import", "--examples").returncode == 0
    note = f"note: '1111' is a prefix of session {SIMPLE}; writing to {SIMPLE}\n"
    for command in (["quarantine", "1111", "12"], ["unquarantine", "1111", "12"],
                    ["redact", "1111", "--seq", "12"]):
        done = dsh(tmp_path, *command)
        assert done.returncode == 0, done.stderr
        assert done.stderr == note, command
    dry = dsh(tmp_path, "redact", "1111", "--seq", "5", "--dry-run")  # writes nothing
    assert dry.returncode == 0 and dry.stderr == ""


READ_ONLY = [["show", "abc"], ["messages", "abc"], ["events", "abc"], ["search", "port"],
             ["verify", "abc"], ["verify", "--all"], ["export", "abc", "--format", "openai"],
             ["gc"], ["gc", "--log"], ["retention"], ["view", "--no-browser"],
             ["redact", "abc", "--seq", "1", "--dry-run"]]  # a dry run is a read


@pytest.mark.parametrize("command", READ_ONLY, ids=" ".join)
def test_a_read_only_command_with_a_fresh_home_creates_no_store(
        tmp_path: Path, command: list[str]) -> None:
    # before: each of these created ~/.dsh/sessions.db (and its search sidecar) as a side
    # effect of a read, then answered from the new empty store
    home = tmp_path / "home"
    done = in_fresh_home(tmp_path, *command)
    assert done.returncode == 1, done.stderr  # docs/cli.md: the command failed
    store = home / ".dsh" / "sessions.db"
    assert done.stderr.startswith(f"error[STORE_NOT_FOUND]: no store yet: the default store "
                                  f"{store} does not exist")
    assert "(path=" not in done.stderr  # the message names the path whole
    assert "dsh import --examples" in done.stderr and done.stdout == ""
    assert list(home.iterdir()) == []


ON_A_SESSION = [["rm", "abc"], ["restore", "abc"], ["resume", "abc"], ["fork", "abc"],
                ["compact", "abc"], ["quarantine", "abc", "1"], ["unquarantine", "abc", "1"],
                ["redact", "abc", "--seq", "1"], ["approve", "abc", "call_1"],
                ["deny", "abc", "call_1"], ["erase", "abc", "--receipt", "r.json"],
                ["erase", "--where", "cwd=/x", "--receipt", "r.json"], ["gc", "--apply"],
                ["retention", "--clear"]]  # before: created a store to clear no policy


def test_a_command_on_an_existing_session_with_a_fresh_home_creates_no_store(
        tmp_path: Path) -> None:
    # before: each created an empty ~/.dsh/sessions.db, then answered SESSION_NOT_FOUND (erase
    # with --where NOTHING_SELECTED, gc --apply "0 sessions examined"); a command that can only
    # act on a session already stored refuses as the reads do
    home = tmp_path / "home"
    store = home / ".dsh" / "sessions.db"
    for command in ON_A_SESSION:
        done = in_fresh_home(tmp_path, *command)
        assert done.returncode == 1, (command, done.stderr)
        assert done.stderr.startswith(f"error[STORE_NOT_FOUND]: no store yet: the default "
                                      f"store {store} does not exist"), command
        assert list(home.iterdir()) == [], command
        assert not (tmp_path / "r.json").exists(), command


def test_ls_with_a_fresh_home_says_there_are_no_sessions_yet_and_creates_no_store(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    listed = in_fresh_home(tmp_path, "ls")
    assert listed.returncode == 0 and listed.stdout == ""  # an empty listing succeeds
    assert listed.stderr == (f"no sessions yet: the default store {home}/.dsh/"
                             "sessions.db does not exist; 'dsh import' adds some (try 'dsh "
                             "import --examples')\n")
    as_json = in_fresh_home(tmp_path, "ls", "--json")
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == []
    assert list(home.iterdir()) == []


@pytest.mark.parametrize("fmt", ["auto", "codex", "dsh", "claude-code-json", "openai-chat"])
def test_import_of_a_line_that_is_not_json_names_the_file_line_and_column(
        tmp_path: Path, fmt: str) -> None:
    (tmp_path / "F.jsonl").write_text('{"a":1}\nnot json\n')
    args = ["import", "F.jsonl"] + ([] if fmt == "auto" else ["--format", fmt])
    if fmt == "claude-code-json":
        args = ["import", "F.jsonl", "--format", "claude-code"]
        (tmp_path / "F.jsonl").write_text('{"type":"user"}\nnot json\n')
    done = dsh(tmp_path, *args)
    assert done.returncode == 1
    assert "F.jsonl:2: " in done.stdout + done.stderr
    assert "not valid JSON at column 1: " in done.stdout + done.stderr
    assert "line 1" not in done.stdout + done.stderr
    assert "F.jsonl: F.jsonl" not in done.stdout + done.stderr  # the path is said once


def test_import_of_a_claude_code_line_without_a_type_says_the_field_is_missing(
        tmp_path: Path) -> None:
    (tmp_path / "F.jsonl").write_text('{"a":1, "b\\u001b[31m":2}\nnot json\n')
    done = dsh(tmp_path, "import", "F.jsonl", "--format", "claude-code")
    out = done.stdout + done.stderr
    assert done.returncode == 1
    assert ('F.jsonl:1: a Claude Code record needs a string "type" field; this object has none '
            "(keys: a, 'b\\x1b[31m')") in out
    assert "\x1b" not in out


@pytest.mark.parametrize("command", [["chat", "my-session"], ["run", "hi", "--session", "s1"],
                                     ["run", "hi", "--session", "s1", "--store", "typo.db"]],
                         ids=" ".join)
def test_a_command_with_a_session_id_and_no_key_in_a_fresh_home_creates_no_store(
        tmp_path: Path, command: list[str]) -> None:
    # before: 'dsh chat ID' and 'dsh run --session ID' opened (so created) the default store
    # and DSH_HOME to check the id against it, then failed with MISSING_KEY
    home = tmp_path / "home"
    done = in_fresh_home(tmp_path, *command)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error[MISSING_KEY]: no API key for --provider deepseek: "
                                  "set DEEPSEEK_API_KEY"), done.stderr
    assert list(home.iterdir()) == [] and not (tmp_path / "typo.db").exists()


def test_a_bad_session_id_in_a_fresh_home_is_still_the_first_error(tmp_path: Path) -> None:
    done = in_fresh_home(tmp_path, "chat", "x" * 300)
    assert done.returncode == 1
    assert done.stderr.startswith(f"error[INVALID_ID]: session id '{'x' * 300}' cannot name a "
                                  "stored session: its folder name would be 300 bytes"), done.stderr
    assert list((tmp_path / "home").iterdir()) == []

"""The `dsh` command, driven as a real subprocess (`python -m dsh.cli`) against stores in tmp_path.

Each test names the CLI behaviour of the issue it checks (docs/cli.md#exit-status-and-errors: exit
0/1/2/130, results on stdout, one `error[CODE]: message` line on stderr, `--json` with stable keys).
Every subprocess costs about a second of interpreter and import time, so tests share one imported
store and read outputs once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dsh.interop._common import IMPORTER_VERSION

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "src" / "dsh" / "examples"
COMMANDS = ["import", "ls", "show", "events", "messages", "verify", "resume", "fork", "compact",
            "export", "convert"]
LS_KEYS = ["id", "title", "turns", "events", "lastActivityMs", "lastActivity", "createdAtMs",
           "parentSession", "seedLength", "lineage", "sourceFormat", "timed"]
FORMATS = {"claude-code", "codex", "openai-chat", "anthropic", "openhands", "swe-agent",
           "mini-swe-agent", "dsh"}
T0 = 1_700_000_000_000


class Dsh:
    """Runs `python -m dsh.cli` with DSH_HOME and HOME inside `root` (no user logs found)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "dsh-home"
        self.env = {**os.environ, "DSH_HOME": str(self.home), "HOME": str(root / "user-home"),
                    "NO_COLOR": "1", "COLUMNS": "200"}
        (root / "user-home").mkdir(parents=True, exist_ok=True)

    def __call__(self, *args: str, check: int | None = 0) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "dsh.cli", *args], capture_output=True,
                              text=True, env=self.env, timeout=120, check=False)
        if check is not None:
            assert proc.returncode == check, (
                f"dsh {' '.join(args)} exited {proc.returncode}, expected {check}\n"
                f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self(*args).stdout)

    def event_lines(self, *args: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self("events", *args).stdout.splitlines()]


@dataclass
class Imported:
    """The bundled examples imported once: the runner, `ls --json` rows, the richest session."""

    dsh: Dsh
    import_stdout: str
    rows: list[dict[str, Any]]
    richest: dict[str, Any]
    richest_events: list[dict[str, Any]]


def _example_files() -> list[Path]:
    return [p for p in EXAMPLES.rglob("*") if p.is_file() and not p.name.startswith(".")
            and p.suffix != ".md"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Imported:
    if not _example_files():
        pytest.fail(f"no bundled examples in {EXAMPLES}: `dsh import` needs them")
    dsh = Dsh(tmp_path_factory.mktemp("imported"))
    out = dsh("import", "--examples").stdout
    rows = dsh.json("ls", "--json")
    # The session with the most turns (ties: most events, then id) is a stable choice.
    richest = max(rows, key=lambda r: (r["turns"], r["events"], r["id"]))
    return Imported(dsh, out, rows, richest, dsh.event_lines(richest["id"]))


@pytest.fixture
def store(imported: Imported, tmp_path: Path) -> Dsh:
    """A private copy of the imported store, free to change."""
    dsh = Dsh(tmp_path)
    shutil.copytree(imported.dsh.home, dsh.home)
    return dsh


# -- hand-written logs (docs/events.md#core-events shapes; JSONL layout of
# docs/formats.md#layout-and-path-encoding, docs/formats.md#header-line,
# docs/formats.md#record-lines)

def _event(seq: int, type: str, data: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": type, "seq": seq, "time": T0 + seq, "data": data, **extra}


def _user(seq: int, text: str) -> dict[str, Any]:
    return _event(seq, "user/message", {"id": f"u{seq}", "role": "user",
                                        "content": [{"type": "text", "text": text}],
                                        "source": {"kind": "user"}}, surfaceOp="append")


def _assistant(seq: int, turn: int, step: int, content: list[Any]) -> dict[str, Any]:
    return _event(seq, "assistant/message", {"turn": turn, "step": step, "message": {
        "id": f"a{seq}", "role": "assistant", "content": content,
        "source": {"kind": "model", "provider": "test", "model": "m1"}}}, surfaceOp="append")


def _turn(first_seq: int, turn: int, prompt: str, answer: str) -> list[dict[str, Any]]:
    s = first_seq
    return [_event(s, "turn/start", {"turn": turn}),
            _event(s + 1, "step/start", {"turn": turn, "step": 1}),
            _user(s + 2, prompt),
            _assistant(s + 3, turn, 1, [{"type": "text", "text": answer}]),
            _event(s + 4, "step/end", {"turn": turn, "step": 1}),
            _event(s + 5, "turn/end", {"turn": turn, "reason": {"kind": "completed"}})]


def interrupted_log() -> list[dict[str, Any]]:
    """Turn 1 asked for `bash`, the tool/call is recorded, no result: a crash mid-tool."""
    call = {"type": "tool-call", "id": "call_1", "name": "bash",
            "arguments": "{\"command\":\"ls\"}"}
    return [_event(0, "turn/start", {"turn": 1}),
            _event(1, "step/start", {"turn": 1, "step": 1}),
            _user(2, "List the files."),
            _assistant(3, 1, 1, [{"type": "text", "text": "Listing."}, call]),
            _event(4, "tool/call", {"turn": 1, "step": 1, "callId": "call_1", "name": "bash",
                                    "arguments": "{\"command\":\"ls\"}"})]


def bad_log() -> list[dict[str, Any]]:
    """Turn numbers jump from 1 to 3: an invariant violation at seq 6.

    Rule: docs/rules.md#turns-and-steps.
    """
    return [*_turn(0, 1, "Hello.", "Hi."),
            _event(6, "turn/start", {"turn": 3}),
            _event(7, "turn/end", {"turn": 3, "reason": {"kind": "completed"}})]


def long_log() -> list[dict[str, Any]]:
    """Three long turns: a digest checkpoint is much smaller than turns 1-2.

    Rule: docs/rules.md#the-transaction.
    """
    events: list[dict[str, Any]] = []
    for turn in (1, 2, 3):
        events += _turn(len(events), turn, f"Request {turn}: " + "explain the layout. " * 60,
                        f"Answer {turn}: " + "the layout is as follows. " * 80)
    return events


def jsonl_text(session_id: str, events: list[dict[str, Any]]) -> str:
    header = {"type": "session", "version": 0, "id": session_id, "createdAt": T0,
              "delegationDepth": 0}
    return "\n".join(json.dumps(x) for x in [header, *events]) + "\n"


def jsonl_store(root: Path, sessions: dict[str, list[dict[str, Any]]]) -> str:
    """Write a raw JSONL store by hand (sessions without cwd live in `_no-cwd/<id>/`)."""
    for session_id, events in sessions.items():
        folder = root / "_no-cwd" / session_id
        folder.mkdir(parents=True)
        (folder / "session.jsonl").write_text(jsonl_text(session_id, events), encoding="utf-8")
    return f"jsonl://{root}"


def stored_events(url: str, session_id: str) -> list[dict[str, Any]]:
    """Read a stored log in-process (cheaper than another subprocess when only checking data)."""
    import dsh
    from dsh.json import thaw

    with dsh.open(url) as store, store.persistence.open(session_id, "read") as handle:
        return [thaw(e) for e in handle.read(0).events]


# -- help and usage --------------------------------------------------------------------------

def test_cli_help_lists_every_command(tmp_path: Path) -> None:
    out = Dsh(tmp_path)("--help").stdout
    listed = {line.strip("│ ").split(" ")[0] for line in out.splitlines()}
    assert set(COMMANDS) <= listed


def test_cli_dsh_alone_prints_the_help_and_exits_0(tmp_path: Path) -> None:
    # a request for help, as `dsh --help` (and `pip`, `docker`, `kubectl` alone), not a usage
    # error: click 8.2's no_args_is_help exits 2 (docs/cli.md#exit-status-and-errors)
    dsh = Dsh(tmp_path)
    alone = dsh(check=0)
    assert alone.stdout == dsh("--help").stdout and "Commands" in alone.stdout
    assert alone.stderr == ""


def test_cli_usage_error_exits_2_with_one_error_line(tmp_path: Path) -> None:
    proc = Dsh(tmp_path)("ls", "--no-such-option", check=2)
    assert proc.stdout == ""
    assert proc.stderr == ("error[USAGE]: No such option: --no-such-option; run 'dsh ls --help' "
                           "for the options\n")
    typo = Dsh(tmp_path)("lss", check=2)
    assert typo.stderr == ("error[USAGE]: No such command 'lss'. Did you mean 'ls'? Run "
                           "'dsh --help' for the options\n")


def test_cli_usage_error_under_json_is_the_json_error_object(tmp_path: Path) -> None:
    # docs/cli.md#exit-status-and-errors: an error is a JSON object under --json, a usage error
    # too (it printed the plain error[USAGE] line before), on stderr with exit 2; --json known
    # only from the command line counts (the parse failed before its callback ran), after "--"
    # it is an argument
    dsh = Dsh(tmp_path)
    missing = dsh("verify", "--json", check=2)
    assert missing.stdout == ""
    assert json.loads(missing.stderr) == {
        "error": "UsageError", "code": "USAGE",
        "message": "Invalid value for 'ID' / '--all': give a session ID or --all (--against "
                   "FILE alone checks the sessions its proof names); run 'dsh verify --help' "
                   "for the options"}
    bad_value = dsh("ls", "--json", "--no-such-option", check=2)
    assert json.loads(bad_value.stderr) == {
        "error": "UsageError", "code": "USAGE",
        "message": "No such option: --no-such-option; run 'dsh ls --help' for the options"}
    after_dashes = dsh("search", "--no-such-option", "--", "--json", check=2)
    assert after_dashes.stderr.startswith("error[USAGE]: No such option: --no-such-option")


def test_cli_a_command_option_put_before_the_command_says_where_it_goes(tmp_path: Path) -> None:
    # 'dsh --store X ls' is how many tools take a global option; dsh's are each command's
    proc = Dsh(tmp_path)("--store", str(tmp_path / "s.db"), "ls", check=2)
    assert proc.stdout == ""
    assert proc.stderr == ("error[USAGE]: No such option: --store; --store is an option of each "
                           "command: put it after the command's name, as in 'dsh ls --store "
                           "STORE'; run 'dsh --help' for the options\n")
    json_first = Dsh(tmp_path)("--json", "verify", "--all", check=2)
    assert "put it after the command's name, as in 'dsh verify --json'" in json_first.stderr


@pytest.mark.parametrize("command", [["ls"], ["view", "--no-browser"]], ids=" ".join)
def test_cli_read_only_command_refuses_a_store_url_naming_nothing(
        tmp_path: Path, command: list[str]) -> None:
    # A typo in --store must not create an empty store (fresh-user report); dsh view said it
    # in its own words ("import sessions first") where every other command names dsh init
    url = f"sqlite://{tmp_path / 'typo' / 'x.db'}"
    proc = Dsh(tmp_path)(*command, "--store", url, check=1)
    assert proc.stderr == (f"error[STORE_NOT_FOUND]: no store at '{url}' ({tmp_path}/typo/x.db "
                           f"does not exist); check the URL, or create an empty store with "
                           f"'dsh init --store {url}'\n")
    assert not (tmp_path / "typo").exists()


def test_cli_read_only_command_refuses_a_postgres_schema_holding_no_store(
        tmp_path: Path) -> None:
    # On PostgreSQL `dsh ls` on a mistyped ?schema= created the schema and said "no sessions
    # in the store" (new-user walkthrough); it is refused as SQLite and JSONL are.
    from dsh.testing._stores import postgres_unreachable, temporary_postgres_url

    if (why := postgres_unreachable()) is not None:
        pytest.skip(why)
    import psycopg

    dsh = Dsh(tmp_path)
    with temporary_postgres_url() as url:
        schema = url.rsplit("schema=", 1)[1]
        for args in (["ls"], ["search", "hello"], ["show", "s1"], ["events", "s1"]):
            proc = dsh(*args, "--store", url, check=1)
            assert proc.stderr.startswith(f"error[STORE_NOT_FOUND]: no store at '{url}' "
                                          f"(PostgreSQL schema {schema!r} holds no dsh store)"
                                          ), proc.stderr
            assert f"'dsh init --store {url}'" in proc.stderr
            with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
                found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                                     (schema,)).fetchone()
            assert found is None, args  # nothing created
        dsh("init", "--store", url)
        assert "no sessions in the store" in dsh("ls", "--store", url).stderr


def test_cli_verify_without_id_or_all_is_a_usage_error(tmp_path: Path) -> None:
    # Neither given and both given are different mistakes: each message names its own
    # (fresh-user report: `dsh verify --proof` alone said "(not both)").
    dsh = Dsh(tmp_path)
    for args in (("verify",), ("verify", "--proof")):
        proc = dsh(*args, check=2)
        assert proc.stderr.splitlines()[-1] == (
            "error[USAGE]: Invalid value for 'ID' / '--all': give a session ID or --all "
            "(--against FILE alone checks the sessions its proof names); "
            "run 'dsh verify --help' for the options")
    proc = dsh("verify", "some-id", "--all", check=2)
    assert proc.stderr.splitlines()[-1] == (
        "error[USAGE]: Invalid value for 'ID' / '--all': give a session ID or --all, not both; "
        "run 'dsh verify --help' for the options")


def test_cli_unknown_session_exits_1_with_session_not_found(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    dsh("init")  # a store without that session (before the store exists: STORE_NOT_FOUND)
    proc = dsh("show", "no-such-session", check=1)
    assert proc.stdout == ""
    url = f"sqlite://{dsh.home.resolve() / 'sessions.db'}"
    assert proc.stderr == (f"error[SESSION_NOT_FOUND]: no session 'no-such-session' in store "
                           f"{url}; 'dsh ls' lists the ids\n")
    as_json = json.loads(dsh("show", "no-such-session", "--json", check=1).stderr)
    assert as_json == {"error": "SessionNotFoundError", "code": "SESSION_NOT_FOUND",
                       "message": "no session 'no-such-session' in store "
                                  f"{url}; 'dsh ls' lists the ids",
                       "session_id": "no-such-session"}


def test_cli_debug_shows_the_traceback_then_the_error_line(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    dsh("init")
    proc = dsh("show", "no-such-session", "--debug", check=1)
    assert proc.stderr.startswith("Traceback (most recent call last):\n")
    assert proc.stderr.splitlines()[-1].startswith("error[SESSION_NOT_FOUND]: ")


def test_cli_bad_store_url_is_one_config_error_line(tmp_path: Path) -> None:
    proc = Dsh(tmp_path)("ls", "--store", "ftp://nowhere", check=1)
    assert proc.stderr.startswith("error[CONFIG]: store URL 'ftp://nowhere': unknown scheme")
    assert len(proc.stderr.splitlines()) == 1


def test_cli_default_store_is_created_in_dsh_home_and_empty(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    assert dsh.json("ls", "--json") == []
    assert not dsh.home.exists()  # a read creates no store (docs/cli.md)
    dsh("init")
    assert (dsh.home / "sessions.db").is_file()
    assert dsh.json("ls", "--json") == []


# -- import, ls, show ------------------------------------------------------------------------

def test_import_bundled_examples_then_ls_and_show(imported: Imported) -> None:
    dsh, rows = imported.dsh, imported.rows
    assert f"{len(rows)} imported, 0 skipped (already imported), 0 failed" in imported.import_stdout
    assert len(rows) >= len({p.parent for p in _example_files()})
    table = dsh("ls").stdout.splitlines()
    assert table[0].split() == ["ID", "TITLE", "TURNS", "EVENTS", "LAST", "ACTIVITY", "(UTC)",
                                "LINEAGE", "SOURCE"]
    assert [line.split()[0] for line in table[1:]] == [row["id"] for row in rows]
    richest = imported.richest
    out = dsh("show", richest["id"]).stdout
    assert out.startswith(f"session {richest['id']}  {richest['title']}\n")
    assert f"{richest['events']} events · {richest['turns']} turns" in out
    assert "── turn 1 " in out
    assert "\nuser  #" in out
    assert "\nassistant  #" in out


def test_import_again_is_idempotent(store: Dsh, imported: Imported) -> None:
    summary = store.json("import", "--examples", "--json")
    assert summary["imported"] == []
    assert summary["failed"] == []
    assert sorted(s["session"] for s in summary["skipped"]) == sorted(r["id"] for r in
                                                                      imported.rows)
    assert store.json("ls", "--json") == imported.rows


def test_import_without_path_finds_the_users_claude_code_logs(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    project = tmp_path / "user-home" / ".claude" / "projects" / "-home-demo-app"
    project.mkdir(parents=True)
    source = EXAMPLES / "transcripts" / "claude-code" / "simple.jsonl"
    shutil.copy(source, project / source.name)
    proc = dsh("import")
    assert proc.stderr.startswith("importing your agent logs from "
                                  f"{tmp_path / 'user-home' / '.claude' / 'projects'}")
    assert proc.stdout.endswith("1 imported, 0 skipped (already imported), 0 failed\n")
    assert "(claude-code)" in proc.stdout


def test_import_examples_imports_only_the_bundled_examples_beside_user_logs(
        tmp_path: Path) -> None:
    # with the user's own Claude Code logs present, --examples still imports
    # exactly the bundled examples, and a path with --examples is a usage error.
    dsh = Dsh(tmp_path)
    project = tmp_path / "user-home" / ".claude" / "projects" / "-home-demo-app"
    project.mkdir(parents=True)
    mine = EXAMPLES / "transcripts" / "claude-code" / "simple.jsonl"
    record = json.loads(mine.read_text(encoding="utf-8").splitlines()[0])
    record["sessionId"] = "99999999-0000-4000-8000-000000000000"
    (project / "mine.jsonl").write_text(json.dumps(record) + "\n", encoding="utf-8")
    proc = dsh("import", "--examples")
    assert proc.stderr.startswith(f"importing the bundled examples from {EXAMPLES}")
    imported = [line.split()[1] for line in proc.stdout.splitlines()
                if line.startswith("imported ")]
    assert len(imported) == len(_example_files())
    assert "99999999-0000-4000-8000-000000000000" not in proc.stdout
    assert str(project) not in proc.stdout
    proc = dsh("import", "--examples", str(mine), check=2)
    assert "give paths or --examples, not both" in proc.stderr


def test_import_without_path_or_user_logs_points_at_examples(tmp_path: Path) -> None:
    proc = Dsh(tmp_path)("import", check=1)
    assert proc.stderr.startswith("error[NOTHING_TO_IMPORT]: nothing to import: no Claude Code "
                                  "or Codex logs in ")
    assert "'dsh import --examples'" in proc.stderr
    assert proc.stdout == ""


def test_import_failed_file_reports_reason_and_leaves_nothing(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    bad = tmp_path / "broken.jsonl"
    bad.write_text(jsonl_text("torn", _turn(0, 1, "Hi.", "Hello."))[:-40], encoding="utf-8")
    proc = dsh("import", str(bad), "--format", "dsh", check=1)
    assert "0 imported, 0 skipped (already imported), 1 failed" in proc.stdout
    line = bad.read_text().count("\n") + 1  # the torn last line
    assert f"failed    {bad}:{line}: dsh transcript ends with a truncated record" in proc.stdout
    assert dsh.json("ls", "--json") == []


def test_import_json_summary_has_stable_keys(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    source = tmp_path / "native.session.jsonl"
    source.write_text(jsonl_text("native-1", _turn(0, 1, "Hi.", "Hello.")), encoding="utf-8")
    summary = dsh.json("import", str(source), "--json")
    assert summary == {"imported": [{"path": str(source), "session": "native-1",
                                     "format": "dsh"}],
                       "updated": [], "superseded": [], "skipped": [], "failed": [],
                       "ignored": [], "cut": [], "completed": [], "erased": []}


def test_ls_json_rows_have_the_stable_keys(imported: Imported) -> None:
    for row in imported.rows:
        assert list(row) == LS_KEYS
        assert isinstance(row["events"], int) and row["events"] > 0
        assert row["sourceFormat"] in FORMATS
    times = [row["lastActivityMs"] for row in imported.rows if row["timed"]]
    assert times == sorted(times, reverse=True)
    assert {row["sourceFormat"] for row in imported.rows} >= {"claude-code", "codex"}


def test_show_json_lists_every_append_surface_event(imported: Imported) -> None:
    sid = imported.richest["id"]
    shown = imported.dsh.json("show", sid, "--json")
    appended = [e["seq"] for e in imported.richest_events if e.get("surfaceOp") == "append"]
    assert [i["seq"] for i in shown["items"] if i["kind"] == "message"] == appended
    assert shown["session"] == imported.richest


# -- events and messages ---------------------------------------------------------------------

def test_events_type_filter_and_from(imported: Imported) -> None:
    dsh, sid, everything = imported.dsh, imported.richest["id"], imported.richest_events
    assert [e["seq"] for e in everything] == list(range(len(everything)))
    users = dsh.event_lines(sid, "--type", "user/message")
    assert users == [e for e in everything if e["type"] == "user/message"]
    assert users
    steps = dsh.event_lines(sid, "--type", "step/*", "--from", "3")
    assert steps == [e for e in everything[3:] if e["type"].startswith("step/")]


@pytest.mark.parametrize("fmt", ["dsh", "openai", "anthropic"])
def test_messages_format(imported: Imported, fmt: str) -> None:
    from dsh.interop import validate_conversation

    view = imported.dsh.json("messages", imported.richest["id"], "--format", fmt)
    if fmt == "dsh":
        assert {m["role"] for m in view} <= {"system", "user", "assistant"}
        assert all(set(m) >= {"id", "role", "content"} for m in view)
    elif fmt == "openai":
        assert {m["role"] for m in view["messages"]} <= {"system", "user", "assistant", "tool"}
        assert validate_conversation(view["messages"], "openai") == []
    else:
        assert view["messages"][0]["role"] == "user"
        assert validate_conversation(view, "anthropic") == []


# -- verify ----------------------------------------------------------------------------------

def test_verify_all_on_the_imported_store_exits_0(imported: Imported) -> None:
    proc = imported.dsh("verify", "--all")
    assert proc.stdout == f"verified {len(imported.rows)} sessions: all valid\n"


def test_verify_all_json_is_one_document_on_stdout_with_the_notes_also_on_stderr(
        imported: Imported) -> None:
    # the document alone on stdout (a pipe into jq reads it whole); its notes are diagnostics,
    # on stderr in both modes as every command's (docs/cli.md#exit-status-and-errors)
    proc = imported.dsh("verify", "--all", "--json")
    report = json.loads(proc.stdout)
    assert (report["sessions"], report["violations"]) == (len(imported.rows), [])
    open_turns = [f"{row['id']}: the last turn is open (interrupted); 'dsh resume' closes it"
                  for row in sorted(imported.rows, key=lambda r: r["id"])
                  if row["id"].startswith(("22222222", "55555555"))]
    assert report["notes"] == open_turns
    assert proc.stderr == "".join(f"note: {note}\n" for note in report["notes"])


def gap_log() -> list[dict[str, Any]]:
    """Seq 1 is missing: the stored log itself is corrupt.

    Rule: docs/formats.md#reading-the-committed-region.
    """
    return [_event(0, "turn/start", {"turn": 1}),
            _event(2, "turn/end", {"turn": 1, "reason": {"kind": "completed"}})]


def test_verify_reports_one_line_per_violation(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    url = jsonl_store(tmp_path / "jsonl-store", {"good": _turn(0, 1, "Hi.", "Hello."),
                                                 "bad": bad_log(), "gap": gap_log()})
    proc = dsh("verify", "--all", "--store", url, check=1)
    lines = proc.stdout.splitlines()
    assert [line.split(":", 1)[0] for line in lines[:-1]] == ["bad seq 6 TURN_NUMBER",
                                                         "gap seq 1 LOG_CORRUPT"]
    assert "expected 1, got 2" in lines[1]
    assert lines[-1] == "verified 3 sessions: 2 violations in 2 sessions"
    report = json.loads(dsh("verify", "bad", "--store", url, "--json", check=1).stdout)
    assert report["sessions"] == 1
    assert [(v["session"], v["seq"], v["rule"]) for v in report["violations"]] == [
        ("bad", 6, "TURN_NUMBER")]


def test_ls_lists_readable_sessions_and_reports_a_damaged_one(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    url = jsonl_store(tmp_path / "jsonl-store", {"good": _turn(0, 1, "Hi.", "Hello."),
                                                 "gap": gap_log()})
    proc = dsh("ls", "--store", url, check=1)
    assert [line.split()[0] for line in proc.stdout.splitlines()] == ["ID", "good"]
    assert proc.stderr.startswith("error[LOG_CORRUPT]: ")
    assert proc.stderr.endswith("session_id=gap)\n")


# -- resume, fork, compact -------------------------------------------------------------------

def test_resume_closes_the_interrupted_turn(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    url = jsonl_store(tmp_path / "jsonl-store", {"crashed": interrupted_log()})
    before = dsh("show", "crashed", "--store", url).stdout
    assert before.endswith("⚠ turn 1 is still open: the log ends mid-turn (last #4); "
                           "`dsh resume` closes it\n")
    proc = dsh("resume", "crashed", "--store", url)
    assert proc.stdout == ("crashed: closed interrupted turn with 3 events at seq 5–7 "
                           "(tool/result, step/end, turn/end)\n")
    closers = stored_events(url, "crashed")[5:]
    assert [e["type"] for e in closers] == ["tool/result", "step/end", "turn/end"]
    assert closers[0]["data"]["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
    assert closers[0]["sourceEventSeqs"] == [4]
    assert closers[2]["data"] == {"turn": 1, "reason": {"kind": "interrupted"}}
    after = dsh("show", "crashed", "--store", url).stdout
    assert "\ntool  #5  bash [call_1]  REPAIRED (TOOL_OUTCOME_UNKNOWN)\n" in after
    assert after.endswith("⚠ turn 1 interrupted; closed by crash repair  #7\n")
    again = dsh("resume", "crashed", "--store", url)
    assert again.stdout == "crashed: nothing to repair (no open turn)\n"


def test_resume_of_an_interrupted_import_closes_it(store: Dsh, imported: Imported) -> None:
    # Importers leave a transcript's unfinished last turn open for `dsh resume`
    # (docs/rules.md#repair).
    import dsh

    def last_turn_event(events: list[Any]) -> str:
        return [e["type"] for e in events if e["type"] in ("turn/start", "turn/end")][-1]

    with dsh.open(f"sqlite://{store.home / 'sessions.db'}") as opened:
        open_ids = [row["id"] for row in imported.rows
                    if last_turn_event(list(opened.read(row["id"]).stored_events))
                    == "turn/start"]
    assert open_ids
    outcome = store.json("resume", open_ids[0], "--json")
    assert outcome["closers"][-1]["type"] == "turn/end"
    assert outcome["closers"][-1]["data"]["reason"] == {"kind": "interrupted"}


def test_fork_at_seq_inherits_the_prefix(store: Dsh, imported: Imported) -> None:
    parent, parent_events = imported.richest, imported.richest_events
    boundary = next(e["seq"] for e in parent_events if e["type"] == "turn/end")
    outcome = store.json("fork", parent["id"], "--at", str(boundary), "--as", "child-1",
                         "--json")
    assert outcome["id"] == "child-1"
    assert outcome["seedLength"] == boundary + 1
    url = f"sqlite://{store.home / 'sessions.db'}"
    child = stored_events(url, "child-1")
    assert child[: boundary + 1] == parent_events[: boundary + 1]
    assert child[boundary + 1]["type"] == "session/end-seed"
    assert child[boundary + 1]["data"] == {"inherited": True}
    row = next(r for r in store.json("ls", "--json") if r["id"] == "child-1")
    assert (row["parentSession"], row["seedLength"]) == (parent["id"], boundary + 1)
    assert row["lineage"] == f"fork of {parent['id']} @{boundary}"
    assert stored_events(url, parent["id"]) == parent_events  # the parent is untouched
    dup = store("fork", parent["id"], "--at", str(boundary), "--as", "child-1", check=1)
    assert dup.stderr.startswith('error[SESSION_ALREADY_EXISTS]: session "child-1" already '
                                 "exists")


def test_fork_boundary_beyond_the_log_is_invalid(imported: Imported) -> None:
    parent = imported.richest
    proc = imported.dsh("fork", parent["id"], "--at", str(parent["events"] + 10), check=1)
    # before: "... (last seq: N) (seq=M)": the seq twice and no hint
    at, sid = parent["events"] + 10, parent["id"]
    assert proc.stderr == (f"error[INVALID_BOUNDARY]: --at {at}: session {sid!r} has no event at "
                           f"seq {at}, its seqs run from 0 to {parent['events'] - 1}; pass --at "
                           f"a seq in that range ('dsh events {sid}' lists them), or leave --at "
                           "out to fork at its last event\n")


def test_compact_writes_a_checkpoint(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    url = jsonl_store(tmp_path / "jsonl-store", {"long": long_log()})
    outcome = dsh.json("compact", "long", "--store", url, "--json")
    # Resume appends the end-seed (18), then the transaction (docs/rules.md#the-checkpoint-message).
    assert (outcome["startSeq"], outcome["summarySeq"], outcome["checkpointSeq"],
            outcome["endSeq"]) == (19, 20, 21, 22)
    # Retain budget 0 keeps only the newest node, turn 3's answer (docs/rules.md#span-selection).
    assert outcome["shadowedSeqs"] == [2, 3, 8, 9, 14]
    assert outcome["checkpointTokenCount"] < outcome["shadowedTokenCount"]
    added = stored_events(url, "long")[18:]
    assert [e["type"] for e in added] == ["session/end-seed", "compaction/start",
                                          "compaction/summary", "user/message",
                                          "compaction/end"]
    assert added[3]["surfaceOp"] == {"op": "replace", "start": 2, "end": 14}
    shown = dsh("show", "long", "--store", url).stdout
    assert "\n⟲ compaction checkpoint  #21  replaces #2–#14 (5 messages)\n" in shown
    dsh("verify", "long", "--store", url)
    messages = dsh.json("messages", "long", "--store", url)
    assert [m["role"] for m in messages] == ["user", "assistant"]  # checkpoint, last answer


def test_compact_small_session_says_nothing_worth_compacting_and_writes_nothing(
        tmp_path: Path) -> None:
    """The size check runs before the lock: no failed attempt is logged, and exit is 0."""
    dsh = Dsh(tmp_path)
    small = [*_turn(0, 1, "Hi.", "Hello."), *_turn(6, 2, "Again?", "Sure.")]
    url = jsonl_store(tmp_path / "jsonl-store", {"small": small})
    before = stored_events(url, "small")
    proc = dsh("compact", "small", "--store", url)
    assert proc.stderr == ""
    assert proc.stdout.startswith("small: nothing worth compacting: compaction span [2, 8] is "
                                  "too small to be worth compacting: its 3 surface nodes hold ~")
    assert "needs more than 104 tokens" in proc.stdout
    # Neither a compaction/start + compaction/end {error} pair nor a resume's end-seed.
    assert stored_events(url, "small") == before
    dsh("compact", "small", "--store", url)
    assert stored_events(url, "small") == before


def test_compact_bad_range_is_a_usage_error(tmp_path: Path) -> None:
    proc = Dsh(tmp_path)("compact", "x", "--range", "seven", check=2)
    assert "error[USAGE]: Invalid value for '--range': expected A:B (two surface seqs), got " \
           "'seven'" in proc.stderr


# -- export and convert ----------------------------------------------------------------------

def test_export_dsh_jsonl_is_header_then_events(imported: Imported, tmp_path: Path) -> None:
    sid = imported.richest["id"]
    out = tmp_path / "x.jsonl"
    imported.dsh("export", sid, "--format", "dsh-jsonl", "-o", str(out))
    lines = out.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    assert (header["type"], header["version"], header["id"]) == ("session", 0, sid)
    assert [json.loads(line) for line in lines[1:]] == imported.richest_events


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_export_provider_formats_validate(imported: Imported, fmt: str) -> None:
    from dsh.interop import validate_conversation

    exported = json.loads(imported.dsh("export", imported.richest["id"], "--format", fmt).stdout)
    # both are request bodies: {"messages": [...]} (Anthropic's may add "system")
    body = exported["messages"] if fmt == "openai" else exported
    assert validate_conversation(body, fmt) == []


def test_convert_jsonl_sqlite_jsonl_keeps_events_equal(imported: Imported,
                                                       tmp_path: Path) -> None:
    from dsh import open as dsh_open

    dsh = Dsh(tmp_path)
    default = f"sqlite://{imported.dsh.home / 'sessions.db'}"
    jsonl_a = f"jsonl://{tmp_path / 'a'}"
    sqlite_b = f"sqlite://{tmp_path / 'b.db'}"
    jsonl_c = f"jsonl+zstd://{tmp_path / 'c'}"
    dsh("convert", "--from", default, "--to", jsonl_a)
    dsh("convert", "--from", jsonl_a, "--to", sqlite_b)
    proc = dsh("convert", "--from", sqlite_b, "--to", jsonl_c)
    count = len(imported.rows)
    assert proc.stdout.startswith(f"copied {count} sessions (")

    def logs(url: str) -> dict[str, list[Any]]:
        with dsh_open(url) as store:
            return {row["id"]: list(store.read(row["id"]).stored_events)
                    for row in imported.rows}

    original = logs(default)
    assert sum(len(v) for v in original.values()) == sum(r["events"] for r in imported.rows)
    for url in (jsonl_a, sqlite_b, jsonl_c):
        assert logs(url) == original, url
    again = dsh.json("convert", "--from", jsonl_a, "--to", sqlite_b, "--json")
    assert (again["copied"], again["skipped"]) == (0, count)


# -- the handler itself (in-process: outcomes that are hard to provoke from outside) ---------

def _run_raising(exc: BaseException) -> tuple[int, str]:
    import contextlib
    import io

    import typer

    from dsh.cli._errors import run

    app = typer.Typer()

    @app.command()
    def boom() -> None:
        raise exc

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = run(typer.main.get_command(app), [])
    return status, err.getvalue()


def test_handler_ctrl_c_exits_130() -> None:
    assert _run_raising(KeyboardInterrupt()) == (130, "error[INTERRUPTED]: interrupted\n")


def test_handler_unexpected_exception_is_one_bug_line() -> None:
    assert _run_raising(ZeroDivisionError("division by zero")) == (
        1, "error[BUG]: unexpected ZeroDivisionError: division by zero; this is a bug in dsh, "
           "rerun with --debug for the traceback and report it\n")


def test_handler_dsh_error_line_names_code_and_where() -> None:
    from dsh._errors import LogCorruptError

    error = LogCorruptError("seq gap, expected 2, got 4", seq=4, path="/x/s.jsonl")
    assert _run_raising(error) == (
        1, "error[LOG_CORRUPT]: seq gap, expected 2, got 4 (seq=4, path=/x/s.jsonl)\n")


# -- import provenance, grammar, newlines, synthetic results ---------------------------------

def test_import_records_its_source_and_ls_shows_it(tmp_path: Path) -> None:
    """Every imported session carries one ignorable `import/source`; native logs show `dsh`."""
    import hashlib

    dsh = Dsh(tmp_path)
    source = EXAMPLES / "transcripts" / "claude-code" / "simple.jsonl"
    summary = dsh.json("import", str(source), "--json")
    [entry] = summary["imported"]
    [event] = dsh.event_lines(entry["session"], "--type", "import/source")
    assert event["seq"] == 0
    assert event["ignorable"] is True
    assert event["data"] == {"format": "claude-code", "path": str(source),
                             "sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
                             "size": source.stat().st_size,
                             "importerVersion": IMPORTER_VERSION}
    [row] = dsh.json("ls", "--json")
    assert row["sourceFormat"] == "claude-code"
    url = jsonl_store(tmp_path / "jsonl-store", {"native": _turn(0, 1, "Hi.", "Hello.")})
    [native] = dsh.json("ls", "--store", url, "--json")
    assert native["sourceFormat"] == "dsh"


def test_show_and_verify_use_singular_for_one(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    url = jsonl_store(tmp_path / "jsonl-store", {"one": _turn(0, 1, "Hi.", "Hello.")})
    shown = dsh("show", "one", "--store", url).stdout
    assert shown.splitlines()[1].startswith("6 events · 1 turn · source dsh · ")
    assert dsh("verify", "one", "--store", url).stdout == "verified 1 session: all valid\n"


def test_show_marks_results_supplied_by_the_importer(tmp_path: Path) -> None:
    """The importer answers an aborted call itself (meta.import.synthetic): not a crash repair."""
    dsh = Dsh(tmp_path)
    source = EXAMPLES / "transcripts" / "codex" / "rollout-compacted-aborted.jsonl"
    [entry] = dsh.json("import", str(source), "--json")["imported"]
    shown = dsh.json("show", entry["session"], "--json")
    tools = [i for i in shown["items"] if i["kind"] == "message" and i["role"] == "tool"]
    assert [i.get("synthetic") for i in tools] == [None, "ABORTED"]
    assert all("repair" not in i for i in tools)
    text = dsh("show", entry["session"]).stdout
    assert "SUPPLIED BY IMPORT (ABORTED: the transcript has no result)" in text
    assert "REPAIRED" not in text


def test_every_stdout_output_ends_with_a_newline(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    url = jsonl_store(tmp_path / "jsonl-store", {"crashed": interrupted_log(), "bad": bad_log(),
                                                 "long": long_log()})
    runs = [("show", "crashed"), ("show", "crashed", "--json"), ("ls",), ("ls", "--json"),
            ("events", "crashed"), ("messages", "crashed"),
            ("export", "crashed", "--format", "openai"),
            ("export", "crashed", "--format", "dsh-jsonl"), ("verify", "--all"),
            ("fork", "crashed", "--at", "3"), ("compact", "long"), ("resume", "crashed")]
    for args in runs:
        proc = dsh(*args, "--store", url, check=None)
        assert proc.stdout, args
        assert proc.stdout.endswith("\n"), args


def test_ls_keeps_every_column_on_a_narrow_screen(imported: Imported, tmp_path: Path) -> None:
    # Fresh-user report: a long lineage made TURNS/EVENTS/SOURCE vanish at 80-120 columns.
    imported.dsh("fork", imported.richest["id"], "--as", "a-branch-with-a-long-lineage")
    for columns in ("80", "120"):
        imported.dsh.env["COLUMNS"] = columns
        out = imported.dsh("ls").stdout
        assert out.splitlines()[0].split() == ["ID", "TITLE", "TURNS", "EVENTS", "LAST",
                                               "ACTIVITY", "(UTC)", "LINEAGE", "SOURCE"]
        branch = next(line for line in out.splitlines() if line.startswith("a-branch"))
        assert "fork of" in branch
        assert branch.split()[-1] == imported.richest["sourceFormat"]
    del imported.dsh.env["COLUMNS"]


def test_cli_shows_a_lone_surrogate_escaped_instead_of_crashing(tmp_path: Path) -> None:
    # dsh logs may hold lone surrogates; `ls` and `show` must not die on them (adversarial report).
    from dsh import create_user_message
    from dsh import open as dsh_open

    folder = tmp_path / "db"
    folder.mkdir(mode=0o700)
    url = f"sqlite://{folder / 's.db'}"
    store = dsh_open(url)
    session = store.session("s1")
    session.append("user/message", create_user_message({
        "content": [{"type": "text", "text": "a\ud800b"}], "source": {"kind": "user"}}),
        surface_op="append")
    store.flush(session)
    store.dispose(session)
    dsh = Dsh(tmp_path)
    assert "a\\ud800b" in dsh("ls", "--store", url).stdout
    assert "a\\ud800b" in dsh("show", "s1", "--store", url).stdout


def test_import_folder_gives_each_bad_file_its_outcome_and_imports_the_rest(
        tmp_path: Path) -> None:
    # Bad input (docs/interop.md#bad-input): an empty file, a truncated last line, a binary file and
    # a 50 MB transcript in one folder: each gets its own outcome, nothing half-imported is left,
    # the good ones import.
    from dsh.cli._cmd_import import examples_dir

    folder = tmp_path / "in"
    folder.mkdir()
    source = Path(str(examples_dir())) / "claude-code" / "simple.jsonl"
    lines = source.read_text(encoding="utf-8").splitlines()
    (folder / "good.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "empty.jsonl").write_text("", encoding="utf-8")
    (folder / "truncated.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:40],
                                            encoding="utf-8")
    (folder / "binary.jsonl").write_bytes(b"\x00\x01\x02garbage")
    big = []
    for line in lines:
        record = json.loads(line)
        if record.get("sessionId"):
            record["sessionId"] = "bbbbbbbb-2222-4333-8444-555555555555"
        message = record.get("message")
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            for block in message["content"]:
                if block.get("type") == "tool_result":
                    block["content"] = "x" * (50 * 1024 * 1024)
        big.append(json.dumps(record))
    (folder / "big.jsonl").write_text("\n".join(big) + "\n", encoding="utf-8")
    dsh = Dsh(tmp_path)
    proc = dsh("import", str(folder), "--verbose")  # --verbose: the ignored files too
    outcome = {line.split()[-1] if line.startswith("imported") else  # path[:LINE]:
               re.sub(r"(:\d+)?:$", "", line.split()[1]):
               line.split()[0] for line in proc.stdout.splitlines()[:-1]}
    assert outcome == {str(folder / "big.jsonl"): "imported",
                       str(folder / "good.jsonl"): "imported",
                       str(folder / "empty.jsonl"): "ignored",  # holds no session
                       # a live log's half-written last line is left out: the lines before
                       # it are good.jsonl's session, already imported
                       "11111111-2222-4333-8444-555555555555": "skipped",
                       str(folder / "binary.jsonl"): "ignored"}  # not a transcript at all
    assert proc.stdout.splitlines()[-1] == ("2 imported, 1 skipped (already imported), 0 failed, "
                                            "2 ignored (not transcripts)")
    assert f"note: {folder / 'truncated.jsonl'}: its last line (" in proc.stderr
    ids = sorted(row["id"] for row in json.loads(dsh("ls", "--json").stdout))
    assert ids == ["11111111-2222-4333-8444-555555555555",
                   "bbbbbbbb-2222-4333-8444-555555555555"]
    dsh("verify", "--all")


def test_ls_and_verify_report_a_jsonl_session_whose_header_is_garbage(tmp_path: Path) -> None:
    # No silent skip (adversarial report): listing found the folder, reading it names the damage.
    from dsh import open as dsh_open

    url = f"jsonl://{tmp_path / 'store'}"
    store = dsh_open(url)
    for sid in ("good", "bad"):
        session = store.session(sid)
        session.append("turn/start", {"turn": 1})
        session.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        store.flush(session)
        store.dispose(session)
    (tmp_path / "store" / "_no-cwd" / "bad" / "session.jsonl").write_text("garbage\n")
    dsh = Dsh(tmp_path)
    listed = dsh("ls", "--store", url, check=1)
    assert [line.split()[0] for line in listed.stdout.splitlines()] == ["ID", "good"]
    assert listed.stderr.startswith("error[LOG_CORRUPT]: ") and "session_id=bad" in listed.stderr
    checked = dsh("verify", "--all", "--store", url, check=1)
    assert checked.stdout.splitlines()[0].startswith("bad seq - LOG_CORRUPT: ")

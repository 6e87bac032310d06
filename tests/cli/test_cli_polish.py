"""The command line's rough edges a new user hit, run as real processes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_cli import COMMANDS, Dsh

INTERRUPTED = "22222222-2222-4333-8444-555555555555"
COMPACTED = "33333333-2222-4333-8444-555555555555"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Dsh:
    dsh = Dsh(tmp_path_factory.mktemp("demo"))
    dsh("import", "--examples")
    return dsh


def test_compact_with_nothing_worth_compacting_says_so_and_exits_0(demo: Dsh) -> None:
    before = demo.event_lines(COMPACTED)
    proc = demo("compact", COMPACTED)
    assert proc.stdout.startswith(f"{COMPACTED}: nothing worth compacting: compaction span ")
    assert "too small to be worth compacting" in proc.stdout and proc.stderr == ""
    assert "§" not in proc.stdout and "spec" not in proc.stdout
    assert demo.json("compact", COMPACTED, "--json")["compacted"] is False
    assert demo.event_lines(COMPACTED) == before  # nothing written


def test_error_codes_are_upper_snake_and_errors_cite_no_spec() -> None:
    from dsh import CompactionError, Session, compact_surface_region
    from dsh.compaction import DigestSummarizer

    session = Session.create("s")
    with pytest.raises(CompactionError) as refused:
        compact_surface_region(session, 0, 3, summarizer=DigestSummarizer())
    assert re.fullmatch(r"[A-Z][A-Z0-9_]*", refused.value.code)
    assert "§" not in refused.value.message and "spec" not in refused.value.message
    source = "\n".join(p.read_text(encoding="utf-8")
                       for p in Path(__file__).parents[2].joinpath("src", "dsh").rglob("*.py"))
    assert re.findall(r'code="([^"]+)"', source)
    assert [c for c in re.findall(r'code="([^"]+)"', source)
            if not re.fullmatch(r"[A-Z][A-Z0-9_]*", c)] == []


def test_help_is_for_people(demo: Dsh) -> None:
    for command in ["", *COMMANDS, "init"]:
        text = demo(*([command] if command else []), "--help").stdout
        assert "<bool>" not in text and "<str>" not in text, command
        assert "[[" not in text and "{ID}" not in text, command
        assert "§" not in text and "docs/" not in text and "`" not in text, command
        # before: dsh resume --help and dsh migrate --help showed their docstrings' Raises:
        # section ("Raises: PersistenceError: code IMPORT_INCOMPLETE ...")
        assert not re.search(r"\b(Raises|Args|Returns|Yields):", text), command
    usage = demo("import", "--help").stdout
    assert "Usage: dsh import [OPTIONS] [PATH]..." in usage
    # a metavar written with its own brackets or dots keeps them once ("QUERY......" before)
    for command, line in [("search", "QUERY..."), ("quarantine", "ID SEQ..."),
                          ("erase", "[ID]..."), ("rm", "ID..."), ("view", "[ID]")]:
        text = " ".join(demo(command, "--help").stdout.split())
        assert f"Usage: dsh {command} [OPTIONS] {line} " in text, text[:120]
        assert "......" not in text and "[[" not in text, command
    assert "Usage: dsh show [OPTIONS] ID" in demo("show", "--help").stdout
    # a paragraph is re-wrapped whole: no line of it ends mid-sentence before a short line
    compact = demo("compact", "--help").stdout
    assert "summary that would not shrink it" in " ".join(compact.split())
    assert "\n summary that\n" not in compact


def test_messages_and_export_print_the_same_request_body(demo: Dsh) -> None:
    for fmt in ("openai", "anthropic"):
        messages = demo("messages", COMPACTED, "--format", fmt).stdout
        assert messages == demo("export", COMPACTED, "--format", fmt).stdout
        assert "messages" in json.loads(messages)


def test_verify_all_prints_its_verdict_on_stdout(demo: Dsh) -> None:
    proc = demo("verify", "--all")
    assert proc.stdout.splitlines()[-1].endswith("sessions: all valid")
    assert "note:" in proc.stderr  # notes stay diagnostics


def test_events_into_head_exits_0_quietly(demo: Dsh) -> None:
    for _ in range(3):  # the pipe closes at a different moment each time
        shell = subprocess.run(
            f"{sys.executable} -m dsh.cli events 77777777 | head -1 >/dev/null; "
            "echo ${PIPESTATUS[0]}", shell=True, executable="/bin/bash", env=demo.env,
            capture_output=True, text=True, check=True, timeout=60)
        assert shell.stdout == "0\n" and shell.stderr == ""


def test_unique_prefix_works_as_an_id_ambiguous_lists_missing_suggests(demo: Dsh) -> None:
    assert demo("show", "2222").stdout.startswith(f"session {INTERRUPTED} ")
    assert demo.json("messages", "3333") == demo.json("messages", COMPACTED)
    ids = [row["id"] for row in demo.json("ls", "--json")]
    prefix = next(p for p in "0123456789abcdef" if sum(i.startswith(p) for i in ids) >= 2)
    ambiguous = demo("show", prefix, check=1).stderr
    assert ambiguous.startswith(f"error[AMBIGUOUS_SESSION_ID]: session id prefix '{prefix}' "
                                "matches ")
    assert all(i in ambiguous for i in ids if i.startswith(prefix))
    assert "type more of the id" in ambiguous
    missing = demo("show", INTERRUPTED[:-1] + "x", check=1).stderr
    assert missing.startswith("error[SESSION_NOT_FOUND]: ")
    assert f"did you mean '{INTERRUPTED}'?" in missing


def test_store_takes_plain_paths_and_init_creates_an_empty_store(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    db, logs = tmp_path / "sessions.db", tmp_path / "logs"
    assert dsh("init", "--store", str(db)).stdout == f"created an empty store at sqlite://{db}\n"
    assert db.is_file()
    assert dsh("init", "--store", f"{logs}/").stdout == f"created an empty store at jsonl://{logs}\n"
    assert logs.is_dir()
    assert "already exists (0 sessions)" in dsh("init", "--store", str(db)).stdout
    assert dsh("ls", "--store", str(db)).stdout == ""
    dsh("import", "--examples", "--store", f"{logs}/")
    assert len(dsh.json("ls", "--json", "--store", str(logs))) == 12
    assert dsh.json("ls", "--json", "--store", str(db)) == []


def test_init_of_the_default_store_tells_new_from_existing(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    default = dsh.home.resolve() / "sessions.db"
    assert dsh("init").stdout == f"created an empty store at sqlite://{default}\n"
    dsh("import", "--examples")
    assert dsh("init").stdout == (f"sqlite://{default} already exists (12 sessions); left as "
                                  "it is\n")


def test_a_file_that_is_not_sqlite_says_so(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("shopping list\n", encoding="utf-8")
    proc = Dsh(tmp_path)("ls", "--store", str(notes), check=1)
    assert proc.stderr.startswith(f"error[NOT_A_SQLITE_DATABASE]: {notes} is not a SQLite "
                                  "database (it starts with b'shopping')")


@pytest.mark.parametrize("command", [["show", "1111"], ["import", "--examples"]])
def test_a_transcript_given_as_the_store_is_pointed_to_dsh_import(
        tmp_path: Path, command: list[str]) -> None:
    # a new user reading a transcript through --store (or naming the source of an import
    # there): before, only "pass the path of a dsh SQLite store, a folder for a JSONL store,
    # or a new file name"
    from dsh.cli._cmd_import import examples_dir

    transcript = tmp_path / "simple.jsonl"
    transcript.write_bytes((Path(str(examples_dir())) / "claude-code" / "simple.jsonl")
                           .read_bytes())
    proc = Dsh(tmp_path)(*command, "--store", str(transcript), check=1)
    assert proc.stderr.splitlines()[-1] == (
        f"error[NOT_A_SQLITE_DATABASE]: {transcript} is not a SQLite database (it starts "
        """with b'{"type":'); pass the path of a dsh SQLite store, a folder for a JSONL """
        "store, or a new file name to create one; a transcript is read after 'dsh import "
        f"{transcript}'")
    assert not (tmp_path / "dsh-home").exists()


def test_an_empty_store_option_is_refused_not_taken_as_the_current_folder(tmp_path: Path) -> None:
    cli = Dsh(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    for command in (["import", "--examples"], ["ls"]):
        proc = subprocess.run([sys.executable, "-m", "dsh.cli", *command, "--store", ""],
                              capture_output=True, text=True, env=cli.env, cwd=work, timeout=120,
                              check=False)
        assert proc.returncode == 1
        assert proc.stderr.splitlines()[-1].startswith("error[STORE_EMPTY]: --store is empty")
    assert list(work.iterdir()) == []  # nothing written where it ran


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("command", [["ls"], ["events", INTERRUPTED]])
def test_a_full_output_device_is_an_output_error_not_a_bug(demo: Dsh, command: list[str]) -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "dsh.cli", *command], stdout=full,
                              stderr=subprocess.PIPE, text=True, env=demo.env, timeout=120,
                              check=False)
    assert proc.returncode == 1
    assert proc.stderr == ("error[OUTPUT_FAILED]: the output could not be written: No space "
                           "left on device; free space on its device or send the output "
                           "elsewhere\n")


def test_convert_to_schema_14_refuses_an_imported_session_before_writing_it(
        demo: Dsh, tmp_path: Path) -> None:
    target = tmp_path / "private"
    target.mkdir(mode=0o700)
    url = f"sqlite:{target / 'old.db'}?schema=14"
    proc = demo("convert", "--from", str(demo.home / "sessions.db"), "--to", url, check=1)
    assert proc.stderr.startswith("error[UNSTORABLE_IN_TARGET]: session '")
    assert "its import/source event at seq 0 is ignorable" in proc.stderr
    assert "put this session in a JSONL folder" in proc.stderr
    assert demo.json("ls", "--json", "--store", str(target / "old.db")) == []  # nothing half-made


def test_import_says_when_a_folder_holds_no_transcript_or_a_file_is_a_store(
        demo: Dsh, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = demo("import", str(empty))
    assert f"note: {empty} holds no transcript file (looked for .json, .jsonl" in proc.stderr
    store = demo.home / "sessions.db"
    failed = demo("import", str(store), "--json", check=None)
    reasons = [f["reason"] for f in json.loads(failed.stdout)["failed"]]
    assert reasons == [f"this is a SQLite database, not a transcript; if it is a dsh store, read "
                       f"it with --store {store}, or copy its sessions with 'dsh convert --from "
                       f"{store} --to STORE'"]
    assert "a unique prefix of its id will do" in demo("verify", "--help").stdout


def test_a_misspelt_store_scheme_is_named_not_taken_as_a_file_name(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    proc = dsh("ls", "--store", "sqlit:foo.db", check=1)
    assert proc.stderr.splitlines()[-1] == (
        "error[STORE_SCHEME]: --store 'sqlit:foo.db': unknown store scheme 'sqlit'; did you "
        "mean 'sqlite:'? (a file whose name holds a colon: write it as ./sqlit:foo.db)")
    assert not (tmp_path / "sqlit:foo.db").exists()
    # not a near miss of any scheme: still a plain path (a SQLite file that does not exist yet)
    from dsh.cli._common import store_url

    assert store_url("notes:2026.db") == f"sqlite://{Path.cwd()}/notes%3A2026.db"

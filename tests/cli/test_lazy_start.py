"""The CLI loads only what the running command needs (docs/cli.md).

Each case runs the real command in a fresh interpreter and lists the modules it loaded: `dsh
show`, `dsh ls` and `dsh --version` load no other command's module, not the agent loop, chat,
the importers, the rights operations or the viewer, and not pydantic (typer builds its pydantic
adapters only for a value that needs one), rich.markdown, rich.traceback or rich.pretty;
and a command that prints no transcript (`ls`, `verify`, `import`, ...) does not load
dsh.transcript.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dsh
from dsh.cli._app import COMMANDS
from dsh.testing import LogBuilder

# Loaded by the commands that need them, never by `dsh show`, `dsh ls` or `dsh --version`.
LAZY = ("pydantic", "pydantic_core", "markdown_it", "rich.markdown", "rich.traceback",
        "rich.pretty", "rich.progress", "asyncio", "detect_secrets", "re2", "dsh.agent",
        "dsh.rights", "dsh.interop", "dsh.compaction", "dsh.view", "dsh._verify",
        "dsh.cli._agent", "dsh.cli._acp", "dsh.cli._live", "dsh.cli._standards",
        "dsh.cli._document", "dsh.cli._proof",
        *sorted({f"dsh.cli.{module}" for _, module, _ in COMMANDS} - {"dsh.cli._cmd_inspect"}))

_LIST_MODULES = """
import atexit, json, sys
atexit.register(lambda: sys.stderr.write("MODULES " + json.dumps(sorted(sys.modules)) + "\\n"))
from dsh.cli import main
main(sys.argv[1:])
"""


def _loaded(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    done = subprocess.run([sys.executable, "-c", _LIST_MODULES, *args], capture_output=True,
                          text=True, timeout=120, check=False)
    line = [ln for ln in done.stderr.splitlines() if ln.startswith("MODULES ")][-1]
    return done, set(json.loads(line.removeprefix("MODULES ")))


# What `dsh ls` reads besides the listing: the store log (trash, archive), without the rest
# of dsh.rights.
STORE_LOG = {"dsh.rights", "dsh.rights._storelog", "dsh.rights._held"}


def _lazy_ones(modules: set[str]) -> list[str]:
    return sorted(m for m in modules - STORE_LOG
                  if any(m == x or m.startswith(x + ".") for x in LAZY))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:{tmp_path_factory.mktemp('lazy') / 'store.db'}"
    log = LogBuilder("s1")
    log.tool_call_turn("call_1")
    log.close_tool("call_1")
    with dsh.open(url) as opened:
        session = opened.session("s1")
        for event in log.events:
            session.append(event["type"], event["data"], surface_op=event.get("surfaceOp"),
                           source_event_seqs=event.get("sourceEventSeqs"))
        opened.flush(session)
    return url


@pytest.mark.parametrize("args", [
    ("show", "s1"), ("show", "s1", "--last", "1"), ("show", "s1", "--from", "0"),
    ("show", "s1", "--json"), ("ls",), ("ls", "--json")])
def test_show_and_ls_load_no_other_command(store: str, args: tuple[str, ...]) -> None:
    done, modules = _loaded(*args, "--store", store)
    assert done.returncode == 0, done.stderr
    assert "s1" in done.stdout
    assert "dsh.cli._cmd_inspect" in modules
    assert _lazy_ones(modules) == []


def test_version_loads_no_command() -> None:
    done, modules = _loaded("--version")
    assert done.returncode == 0 and done.stdout.startswith("dsh ")
    assert _lazy_ones(modules) == [] and "dsh.cli._cmd_inspect" not in modules


# Loaded only by a command that renders a transcript (show, chat's /show, export as a
# document): dsh.transcript's dataclasses compile their methods at import (~50 ms a start).
TRANSCRIPT = {"dsh.transcript", "dsh.cli._render_entries"}


@pytest.mark.parametrize("args", [
    ("ls",), ("ls", "--json"), ("verify", "s1"), ("events", "s1"), ("messages", "s1"),
    ("search", "running")])
def test_a_command_that_renders_no_transcript_does_not_load_it(
        store: str, args: tuple[str, ...]) -> None:
    done, modules = _loaded(*args, "--store", store)
    assert done.returncode == 0, done.stderr
    assert done.stdout
    assert modules & TRANSCRIPT == set()


def test_version_and_import_do_not_load_the_transcript(tmp_path: Path) -> None:
    done, modules = _loaded("--version")
    assert done.returncode == 0 and modules & TRANSCRIPT == set()
    source = tmp_path / "5e551011-0000-4000-8000-00000000cafe.jsonl"  # Claude Code
    source.write_text(json.dumps({
        "type": "user", "uuid": "u1", "parentUuid": None, "sessionId": "s",
        "timestamp": "2026-01-01T00:00:00.000Z", "message": {"role": "user", "content": "hi"},
    }) + "\n", encoding="utf-8")
    done, modules = _loaded("import", str(source), "--store", f"sqlite:{tmp_path / 's.db'}")
    assert done.returncode == 0, done.stderr
    assert "1 imported" in done.stdout
    assert modules & TRANSCRIPT == set()


def test_show_loads_the_transcript_to_render_it(store: str) -> None:
    done, modules = _loaded("show", "s1", "--store", store)
    assert done.returncode == 0, done.stderr
    assert "── turn 1" in done.stdout and "running" in done.stdout
    assert modules >= TRANSCRIPT


def test_a_command_loads_its_own_module(store: str) -> None:
    done, modules = _loaded("verify", "s1", "--store", store)
    assert done.returncode == 0, done.stderr
    assert {"dsh.cli._cmd_verify", "dsh._verify"} <= modules
    assert "dsh.cli._cmd_chat" not in modules and "dsh.cli._cmd_forget" not in modules


def test_import_builds_no_pydantic_adapter(tmp_path: Path) -> None:
    # its paths, --format's default and --wait's default are typer's answers as they are
    source = tmp_path / "5e551011-0000-4000-8000-00000000cafe.jsonl"  # Claude Code
    source.write_text(json.dumps({
        "type": "user", "uuid": "u1", "parentUuid": None, "sessionId": "s",
        "timestamp": "2026-01-01T00:00:00.000Z", "message": {"role": "user", "content": "hi"},
    }) + "\n", encoding="utf-8")
    done, modules = _loaded("import", str(source), "--store", f"sqlite:{tmp_path / 's.db'}",
                            "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["imported"][0]["path"] == str(source)
    assert "dsh.cli._cmd_import" in modules
    assert "pydantic" not in modules and "pydantic_core" not in modules


def test_help_lists_every_command_in_table_order() -> None:
    done = subprocess.run([sys.executable, "-m", "dsh.cli", "--help"], capture_output=True,
                          text=True, timeout=120, check=False, env={
                              **os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
    assert done.returncode == 0, done.stderr
    listed = [line.split()[1] for line in done.stdout.splitlines()
              if line.startswith("│ ") and len(line.split()) > 2 and
              line.split()[1] in {name for name, _, _ in COMMANDS}]
    assert listed == [name for name, _, _ in COMMANDS]


def test_a_typo_is_still_told_the_nearest_command() -> None:
    done = subprocess.run([sys.executable, "-m", "dsh.cli", "shwo"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert "No such command 'shwo'. Did you mean 'show'?" in done.stderr

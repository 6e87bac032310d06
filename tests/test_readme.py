"""The README's promises: its commands run, its example prints what it says, CI runs its tests."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
DSH = [sys.executable, "-m", "dsh.cli"]


def _indented_commands() -> list[str]:
    return [line.strip() for line in README.splitlines()[:12] if line.startswith("    ")]


def test_readme_opens_with_the_main_job_and_the_test_command() -> None:
    main_job, test_command = _indented_commands()[:2]
    assert "dsh import" in main_job and "dsh ls" in main_job and "dsh show" in main_job
    assert test_command.endswith("scripts/test")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert test_command in ci


def test_readme_main_job_imports_lists_and_shows_the_bundled_examples(tmp_path: Path) -> None:
    # The people the README is for have their own agent logs: a HOME with a Claude Code
    # project must not change what the main job imports and shows.
    main_job = _indented_commands()[0]
    steps = [s.strip() for s in main_job.split("&&")]
    dsh_steps = [shlex.split(s)[1:] for s in steps if s.startswith(".venv/bin/dsh ")]
    assert [args[0] for args in dsh_steps] == ["import", "ls", "show"]
    user_home = tmp_path / "user"
    project = user_home / ".claude" / "projects" / "-home-me-app"
    project.mkdir(parents=True)
    (project / "0b9c7e1e-0000-4000-8000-000000000000.jsonl").write_text(
        '{"type":"user","uuid":"u1","sessionId":"0b9c7e1e-0000-4000-8000-000000000000",'
        '"timestamp":"2026-02-01T10:00:00Z","message":{"role":"user","content":"mine"}}\n',
        encoding="utf-8")
    env = {**os.environ, "DSH_HOME": str(tmp_path / "home"), "HOME": str(user_home)}
    outputs = [subprocess.run([*DSH, *args], env=env, capture_output=True, text=True,
                              check=True, timeout=120).stdout for args in dsh_steps]
    assert "0 failed" in outputs[0] and "0b9c7e1e" not in outputs[0]
    assert "claude-code" in outputs[1]
    assert "compaction checkpoint" in outputs[2] and "Read config.toml" in outputs[2]


def test_readme_explains_the_file_times_and_the_open_turns_the_main_job_shows(
        tmp_path: Path) -> None:
    # what the main job's listing shows that a reader would ask about: the sessions stamped
    # with their file's time (`file` after LAST ACTIVITY) and the examples imported with an
    # open turn, which the README names right after the main job
    env = {**os.environ, "DSH_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)}

    def dsh(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*DSH, *args], env=env, capture_output=True, text=True,
                              check=True, timeout=120)

    dsh("import", "--examples")
    stamped = [line for line in dsh("ls").stdout.splitlines()
               if re.search(r"\d\d:\d\d file ", line)]
    assert {line.split()[-1] for line in stamped} == {
        "anthropic", "openai-chat", "swe-agent", "mini-swe-agent"}
    opening = README[:README.index("\n---\n")]
    assert "LAST ACTIVITY followed by `file`" in opening
    for source in ("OpenAI", "Anthropic", "SWE-agent", "mini-swe-agent"):
        assert source in opening
    open_turns = re.findall(r"note: (\S+): the last turn is open",
                            dsh("verify", "--all").stderr)
    assert open_turns == ["22222222-2222-4333-8444-555555555555",
                          "55555555-2222-4333-8444-555555555555"]
    named = re.findall(r"`([0-9a-f-]{36})`", opening[opening.index("open turn"):])
    assert named == open_turns


def test_readme_library_example_prints_what_its_comment_says(tmp_path: Path) -> None:
    block = re.search(r"```python\n(.*?)```", README, re.S)
    assert block is not None
    runs = [subprocess.run([sys.executable, "-c", block.group(1)], cwd=tmp_path,
                           capture_output=True, text=True, check=True, timeout=60).stdout
            for _ in range(2)]
    assert runs == ["['user', 'assistant']\n"] * 2  # the second run resumed the first
    import dsh

    with dsh.open(f"sqlite:{tmp_path / '.dsh-demo' / 'library.db'}") as store:
        types = [e["type"] for e in store.read("demo").stored_events]
    assert types.count("turn/start") == 2 and types.count("assistant/message") == 2


def test_readme_names_every_cli_command() -> None:
    help_text = subprocess.run([*DSH, "--help"], capture_output=True, text=True, check=True,
                               env={**os.environ, "COLUMNS": "200"}).stdout
    commands = re.findall(r"^│ (\w+)\s{2,}", help_text, re.M)
    assert len(commands) >= 11
    for command in commands:
        assert f"`dsh {command}" in README, command

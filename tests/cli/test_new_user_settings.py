"""A new user's settings file where DSH_HOME does not look, as a real ``dsh`` process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DSH = [sys.executable, "-m", "dsh.cli"]
MISSING = ("error[MISSING_KEY]: no API key for --provider deepseek: set DEEPSEEK_API_KEY, or "
           "choose another provider with --provider (openai, anthropic, openai-compatible; "
           "openai-compatible with --base-url needs no key)")


def dsh(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``dsh args`` with HOME ``tmp_path`` and DSH_HOME ``tmp_path/demo``, as the main job sets."""
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_API_KEY") and not k.startswith("DSH_")}
    env.update({"HOME": str(tmp_path), "DSH_HOME": str(tmp_path / "demo")})
    return subprocess.run([*DSH, *args], env=env, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


@pytest.mark.parametrize("command", [["run", "hi"], ["chat"]], ids=" ".join)
def test_missing_key_of_the_default_provider_names_the_settings_file_read(
        tmp_path: Path, command: list[str]) -> None:
    # before: only "no API key for --provider deepseek", though the person had set a local
    # server in ~/.dsh/config.toml: with DSH_HOME exported (the README's main job) that file
    # is not the one read
    (tmp_path / ".dsh").mkdir()
    (tmp_path / ".dsh" / "config.toml").write_text(
        'provider = "openai-compatible"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\n')
    done = dsh(tmp_path, *command)
    assert done.returncode == 1
    demo = tmp_path / "demo"
    assert done.stderr == (f"{MISSING} (no provider was chosen: DSH_PROVIDER is unset and "
                           f"{demo / 'config.toml'} does not exist)\n")
    assert not demo.exists()  # nothing created
    # a settings file that sets no provider is named as such
    demo.mkdir()
    (demo / "config.toml").write_text('model = "deepseek-chat"\n')
    assert dsh(tmp_path, *command).stderr == (
        f"{MISSING} (no provider was chosen: DSH_PROVIDER is unset and "
        f"{demo / 'config.toml'} sets no provider)\n")


def test_missing_key_of_a_provider_given_by_option_is_as_before(tmp_path: Path) -> None:
    done = dsh(tmp_path, "run", "hi", "--provider", "deepseek")
    assert done.returncode == 1 and done.stderr == MISSING + "\n"

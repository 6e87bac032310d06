"""The README's agent example runs as it says: killed in its tool, resumed on the next run."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import dsh
from dsh._verify import verify_events
from tests.conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")


def _agent_block() -> str:
    section = README.split("## The agent loop", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    return block.group(1)


def test_readme_agent_example_crashes_then_resumes(tmp_path: Path) -> None:
    code = _agent_block()
    first = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
    assert first.returncode == -signal.SIGKILL and first.stdout == ""
    second = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, check=True)
    assert second.stdout == ("2 The deploy may have run; I will check before retrying.\n"
                             "['TOOL_OUTCOME_UNKNOWN']\n")
    with dsh.open(f"sqlite:{tmp_path / '.dsh-demo' / 'agent.db'}") as store:
        stored = store.read("deploy")
    assert verify_events(stored.stored_events, header=stored.header) == []
    assert [e["type"] for e in stored.stored_events].count("turn/end") == 2

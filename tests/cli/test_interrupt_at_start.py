"""Ctrl-C while ``dsh`` is still loading its modules: exit 130 and one line, never a traceback.

Loading the command takes about a second on a busy machine, long enough for a person to press
Ctrl-C. A real process runs the console script's own line (``from dsh.cli import main``) and
gets SIGINT the moment the command's modules start to load (an import hook sends it, so the
moment is the same on every run). Rule: docs/cli.md#exit-status-and-errors.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_INTERRUPTED_WHILE_LOADING = """
import os, signal, sys
class SigintOnLoad:
    def find_spec(self, name, path=None, target=None):
        if name == "dsh.cli._app":
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the command loads
        return None
sys.meta_path.insert(0, SigintOnLoad())
from dsh.cli import main
main(sys.argv[1:])
"""


def test_ctrl_c_while_the_command_loads_exits_130_with_one_line(tmp_path: Path) -> None:
    # before: `from dsh.cli import main` loaded the whole command, so a Ctrl-C in its first
    # second printed a KeyboardInterrupt traceback of importlib frames
    store = tmp_path / "sessions.db"
    done = subprocess.run([sys.executable, "-c", _INTERRUPTED_WHILE_LOADING, "ls", "--store",
                           f"sqlite:{store}"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "error[INTERRUPTED]: interrupted\n"
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert not store.exists()  # interrupted before it did anything


# What pip's console-script wrapper runs, with SIGINT sent as the dsh package itself starts to
# load (its first module), before any module of the dsh package has run a line of its own
_INTERRUPTED_WHILE_DSH_LOADS = """
import os, re, signal, sys
class SigintOnLoad:
    def find_spec(self, name, path=None, target=None):
        if name == "dsh":
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the first moment of `import dsh`
        return None
sys.meta_path.insert(0, SigintOnLoad())
from {module} import {function} as main
sys.exit(main())
"""


def test_ctrl_c_while_the_dsh_package_loads_exits_130_with_one_line(tmp_path: Path) -> None:
    # before: the console script was dsh.cli:main, whose import runs dsh/__init__.py first,
    # so a Ctrl-C in the CLI's first ~0.3 s printed a KeyboardInterrupt traceback
    with (REPO / "pyproject.toml").open("rb") as pyproject:
        module, function = tomllib.load(pyproject)["project"]["scripts"]["dsh"].split(":")
    store = tmp_path / "sessions.db"
    done = subprocess.run([sys.executable, "-c", _INTERRUPTED_WHILE_DSH_LOADS.format(
        module=module, function=function), "ls", "--store", f"sqlite:{store}"],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "error[INTERRUPTED]: interrupted\n"
    assert done.stdout == ""
    assert not store.exists()

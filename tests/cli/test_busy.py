"""A session another process is writing: commands wait, then say who holds it.

The holder is a real process with the session open for writing; it lets go when the test
creates a file, so no assertion depends on timing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dsh
from dsh import create_user_message
from tests.cli.test_cli import Dsh

HOLDER = """
import sys, time, pathlib, dsh
store = dsh.open(sys.argv[1])
session = store.session("held")
pathlib.Path(sys.argv[2]).write_text("ready")
while not pathlib.Path(sys.argv[3]).exists():
    time.sleep(0.02)
store.close()
"""


def _store(tmp_path: Path) -> str:
    url = f"sqlite://{tmp_path / 'busy.db'}"
    with dsh.open(url) as store:
        session = store.session("held")
        session.append("turn/start", {"turn": 1})
        session.append("user/message", create_user_message(
            {"content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}),
            surface_op="append")
    return url


def _hold(tmp_path: Path, url: str) -> tuple[subprocess.Popen[bytes], Path]:
    ready, release = tmp_path / "ready", tmp_path / "release"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, url, str(ready), str(release)])
    while not ready.exists():
        assert holder.poll() is None, "the holder process died"
    return holder, release


def test_busy_session_waits_then_names_the_holder_once(tmp_path: Path) -> None:
    url = _store(tmp_path)
    holder, release = _hold(tmp_path, url)
    try:
        proc = Dsh(tmp_path)("resume", "held", "--store", url, "--wait", "0.2", check=1)
    finally:
        release.write_text("go")
        holder.wait(timeout=60)
    [line] = proc.stderr.splitlines()  # printed once
    assert line.startswith("error[SESSION_BUSY]: session 'held' is being written by another "
                           f"process (pid {holder.pid} on ")
    assert " since " in line and " s ago)" in line and "waited 0.2 s for it" in line
    assert line.endswith("or wait longer with --wait SECONDS")
    assert " ms" not in line and "pid=" not in line


def test_busy_session_is_waited_for_until_its_writer_lets_go(tmp_path: Path) -> None:
    url = _store(tmp_path)
    holder, release = _hold(tmp_path, url)
    runner = Dsh(tmp_path)
    command = subprocess.Popen([sys.executable, "-m", "dsh.cli", "resume", "held", "--store",
                                url, "--wait", "120"], env=runner.env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    release.write_text("go")  # the holder closes while the command waits (or before it asks)
    out, err = command.communicate(timeout=180)
    holder.wait(timeout=60)
    assert command.returncode == 0, err
    assert out == "held: nothing to repair (no open turn)\n"  # the holder resumed it first

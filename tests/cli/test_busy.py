"""A session another process is writing: commands wait, then say who holds it.

The holder is a real process with the session open for writing; it lets go when the test
creates a file, so no assertion depends on timing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import dsh
from dsh import SessionBusyError, create_user_message
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


def test_a_holder_in_this_process_is_named_so_with_what_frees_it(tmp_path: Path) -> None:
    # docs/errors.md#sessionbusyerror: where's holder tells a holder in this process, which
    # no wait frees; before, the message called it another process and advised --wait
    from dsh.cli._common import _wait_for_writers

    url = _store(tmp_path)
    with dsh.open(url) as first, dsh.open(url) as second:
        first.session("held").append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        _wait_for_writers(second.persistence, 60.0)  # as cli_store does
        with pytest.raises(SessionBusyError) as caught:
            second.session("held").append("turn/start", {"turn": 2})
    message = caught.value.message
    assert message.startswith("session 'held' is being written by this process (pid ")
    assert message.endswith("; another handle or session object of this process holds it, "
                            "which no wait frees: close it first, then open the session again")
    assert "another process" not in message and "--wait" not in message

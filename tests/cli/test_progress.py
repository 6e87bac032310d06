"""Progress bars: drawn on a terminal's stderr, absent when stderr is piped (a real pty)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
from pathlib import Path

from tests.cli.test_cli import EXAMPLES, Dsh


def _run_on_pty(cli: Dsh, *args: str) -> tuple[int, bytes, bytes]:
    """Run ``dsh ARGS`` with stderr on a pseudo-terminal and stdout piped; both outputs."""
    leader, follower = pty.openpty()
    env = {**cli.env, "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "dsh.cli", *args], stdout=subprocess.PIPE,
                            stderr=follower, stdin=subprocess.DEVNULL, env=env)
    os.close(follower)
    drawn = bytearray()
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            proc.kill()
            raise AssertionError("dsh wrote nothing to its terminal for 120 s")
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the follower side is closed: the process is done with it
            break
        if not chunk:
            break
        drawn += chunk
    assert proc.stdout is not None
    with proc.stdout:
        out = proc.stdout.read()
    os.close(leader)
    return proc.wait(timeout=120), out, bytes(drawn)


def test_import_and_verify_draw_a_bar_on_a_terminal_and_nothing_when_piped(
        tmp_path: Path) -> None:
    cli = Dsh(tmp_path)
    store = f"sqlite:{tmp_path / 'store.db'}"
    transcripts = str(EXAMPLES / "transcripts")
    code, out, drawn = _run_on_pty(cli, "import", transcripts, "--store", store)
    assert code == 0
    assert b"importing" in drawn and b"\x1b[" in drawn  # the bar, drawn and erased
    assert b"\x1b" not in out and b"importing" not in out and b"imported" in out
    code, out, drawn = _run_on_pty(cli, "verify", "--all", "--store", store)
    assert code == 0 and b"verifying" in drawn and out.startswith(b"verified ")
    piped = cli("verify", "--all", "--store", store)
    assert "verifying" not in piped.stderr and "\x1b" not in piped.stderr + piped.stdout
    again = cli("import", transcripts, "--store", store)
    assert "importing" not in again.stderr and "\x1b" not in again.stderr


def test_gc_draws_a_bar_on_a_terminal_and_nothing_when_piped(tmp_path: Path) -> None:
    cli = Dsh(tmp_path)
    store = f"sqlite:{tmp_path / 'store.db'}"
    assert cli("import", str(EXAMPLES / "transcripts"), "--store", store).returncode == 0
    assert cli("retention", "--store", store, "--archive-after", "0").returncode == 0
    code, out, drawn = _run_on_pty(cli, "gc", "--store", store)
    assert code == 0 and b"gc" in drawn and b"\x1b[" in drawn
    assert b"\x1b" not in out and b"would archive" in out
    piped = cli("gc", "--store", store)
    assert "\x1b" not in piped.stderr + piped.stdout and "would archive" in piped.stdout


def test_a_first_search_draws_an_indexing_bar_on_a_terminal_and_nothing_when_current(
        tmp_path: Path) -> None:
    cli = Dsh(tmp_path)
    store = f"sqlite:{tmp_path / 'store.db'}"
    assert cli("import", str(EXAMPLES / "transcripts"), "--store", store).returncode == 0
    code, out, drawn = _run_on_pty(cli, "search", "the", "--store", store)
    assert code == 0 and b"indexing" in drawn and b"\x1b[" in drawn  # the index was built
    assert b"\x1b" not in out and b"indexing" not in out and out
    code, out, drawn = _run_on_pty(cli, "search", "the", "--store", store)
    assert code == 0 and b"indexing" not in drawn and out  # the index is current: no bar
    piped = cli("search", "the", "--rebuild", "--store", store)
    assert piped.returncode == 0 and "indexing" not in piped.stderr
    assert "\x1b" not in piped.stderr + piped.stdout

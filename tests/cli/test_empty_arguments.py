"""Empty arguments (``dsh show "$UNSET"``) are usage errors, before any store is opened."""

from __future__ import annotations

from pathlib import Path

import pytest

# HOME tmp_path, DSH_HOME tmp_path/home, no DSH_ variables
from tests.cli.test_new_user_walk import dsh


@pytest.mark.parametrize(("args", "hint"), [
    (("show", ""), "'ID'"), (("events", ""), "'ID'"), (("messages", ""), "'ID'"),
    (("verify", ""), "'ID'"), (("resume", ""), "'ID'"), (("fork", ""), "'ID'"),
    (("compact", ""), "'ID'"), (("quarantine", "", "3"), "'ID'"),
    (("unquarantine", "", "3"), "'ID'"), (("redact", "", "--seq", "3"), "'ID'"),
    (("export", "", "--format", "openai"), "'ID'"), (("approve", "", "c1"), "'ID'"),
    (("deny", "", "c1"), "'ID'"), (("rm", ""), "'ID...'"), (("rm", "x", ""), "'ID...'"),
    (("restore", ""), "'ID...'"), (("erase", "", "--receipt", "r.json"), "'[ID]...'"),
    (("view", "", "--no-browser"), "'[ID]'"), (("chat", ""), "'ID'"),
    (("run", "hi", "--session", ""), "'--session'"), (("fork", "x", "--as", ""), "'--as'"),
])
def test_an_empty_session_id_is_a_usage_error(
        tmp_path: Path, args: tuple[str, ...], hint: str) -> None:
    # before: SESSION_NOT_FOUND (exit 1, "no session ''") from most commands, INVALID_ID
    # (exit 1) from run and chat, and dsh fork --as "" forked under a random id (exit 0),
    # while dsh import "" was a usage error
    ran = dsh(tmp_path, *args)
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.startswith(f"error[USAGE]: Invalid value for {hint}: the session id is "
                                 "empty"), ran.stderr
    assert ran.stdout == ""
    assert not (tmp_path / "home").exists()  # no store opened, none created

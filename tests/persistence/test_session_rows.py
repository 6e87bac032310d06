"""A sessions row passes SQLite's listing check exactly when ``decode_session_row`` takes it.

Both come from one table of column rules (``SESSION_ROW_RULES``, docs/formats.md#schema-17):
here each column gets valid and invalid values and the two answers are compared row by row.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from dsh._errors import LogCorruptError
from dsh.json import MAX_SAFE_INTEGER
from dsh.persistence.sqlite._schema import (
    SESSION_ROW_CHECK_SQL,
    SESSION_ROW_RULES,
    decode_session_row,
)

# fixed values, never uuid4(): the ids of the cases below must be the same at every
# collection (pytest-xdist's workers collect apart and must agree; -k and --lf name them)
_INCARNATION = "0b6f1c9e-4d2a-4f8b-9c3e-7a5d2e1f0c4b"
GOOD = ("s1", 0, 1_700_000_000_000, "/work", "parent", 3, "subagent", 1, "preset",
        _INCARNATION, 0)
TRIES: dict[str, list[object]] = {
    "id": ["", 5, None, "x"],
    "version": [-1, 1.5, "0", MAX_SAFE_INTEGER + 1, None],
    "created_at": [-1, "1", 2.0, MAX_SAFE_INTEGER, MAX_SAFE_INTEGER + 1, None],
    "cwd": ["relative/dir", "", 7, None, "/"],
    "parent_session": [7, None, ""],
    "seed_length": [-1, "3", None, 0],
    "origin": ["user", "", None, 1],
    "delegation_depth": [-2, 1.0, None],
    "agent_preset": [3, None, ""],
    "incarnation": ["not-a-uuid", None, 7, _INCARNATION.upper(),
                    "00000000-0000-9000-8000-000000000000"],
    "revision": [-1, None, "0", 10],
}


def _cases() -> list[tuple[tuple[object, ...], str]]:
    """Each row with its test id: ``good``, or the one column changed and its value."""
    cases = [(GOOD, "good")]
    for index, (column, *_rest) in enumerate(SESSION_ROW_RULES):
        for value in TRIES[column]:
            cases.append(((*GOOD[:index], value, *GOOD[index + 1:]), f"{column}={value!r}"))
    return cases


def test_the_row_cases_are_collected_with_the_same_ids_every_time() -> None:
    # two fresh collections of this module list the same test ids, in the same order
    def collected() -> list[str]:
        proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                               "-p", "no:cacheprovider", str(Path(__file__))],
                              capture_output=True, text=True, cwd=Path(__file__).parents[2])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return [line for line in proc.stdout.splitlines() if "::" in line]

    first = collected()
    assert len(first) == len(_cases()) + 1
    assert collected() == first
    assert len(set(first)) == len(first)


@pytest.mark.parametrize("row", [pytest.param(row, id=name) for row, name in _cases()])
def test_the_sql_check_and_the_decoder_agree(row: tuple[object, ...]) -> None:
    columns = [column for column, *_rest in SESSION_ROW_RULES]
    with sqlite3.connect(":memory:") as conn:  # no column types: values kept as given
        conn.execute(f"CREATE TABLE sessions ({', '.join(columns)})")
        conn.execute(f"INSERT INTO sessions VALUES ({', '.join('?' * len(columns))})", row)
        [(vouched,)] = conn.execute(f"SELECT {SESSION_ROW_CHECK_SQL} FROM sessions AS s")
    try:
        decode_session_row(row, path="x.db")  # type: ignore[arg-type]
        decoded = True
    except LogCorruptError:
        decoded = False
    assert (vouched == 1) == decoded

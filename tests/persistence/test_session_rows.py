"""A sessions row passes SQLite's listing check exactly when ``decode_session_row`` takes it.

Both come from one table of column rules (``SESSION_ROW_RULES``, docs/formats.md#schema-17):
here each column gets valid and invalid values and the two answers are compared row by row.
"""

from __future__ import annotations

import sqlite3
import uuid

import pytest

from dsh._errors import LogCorruptError
from dsh.json import MAX_SAFE_INTEGER
from dsh.persistence.sqlite._schema import (
    SESSION_ROW_CHECK_SQL,
    SESSION_ROW_RULES,
    decode_session_row,
)

GOOD = ("s1", 0, 1_700_000_000_000, "/work", "parent", 3, "subagent", 1, "preset",
        str(uuid.uuid4()), 0)
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
    "incarnation": ["not-a-uuid", None, 7, str(uuid.uuid4()).upper(),
                    "00000000-0000-9000-8000-000000000000"],
    "revision": [-1, None, "0", 10],
}


def _rows() -> list[tuple[object, ...]]:
    rows = [GOOD]
    for index, (column, *_rest) in enumerate(SESSION_ROW_RULES):
        for value in TRIES[column]:
            rows.append((*GOOD[:index], value, *GOOD[index + 1:]))
    return rows


@pytest.mark.parametrize("row", _rows(), ids=repr)
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

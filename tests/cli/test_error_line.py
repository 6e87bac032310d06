"""``error[CODE]: message (path=…)``: the path hint is dropped only when the message prints it.

Rule: docs/cli.md (error lines name what the message does not already name).
"""

from __future__ import annotations

import pytest

from dsh._errors import PersistenceError
from dsh.cli._errors import format_error_line


@pytest.mark.parametrize(("path", "message", "hinted"), [
    ("notes", "cannot import notes: no such file", False),
    ("/tmp/x/s.db", "cannot open /tmp/x/s.db.", False),
    ("notes", "cannot import notes.jsonl: no such file", True),  # part of a longer name
    ("/tmp/a", "cannot open /tmp/a.db: gone", True),
    ("/tmp/a", "cannot open /tmp/a/b: gone", True),
    ("a", "refused: it is a symlink", True),  # a one-letter path is not the word "a"
])
def test_the_path_hint_is_kept_unless_the_message_prints_the_path(
        path: str, message: str, hinted: bool) -> None:
    line = format_error_line(PersistenceError(message, code="X", path=path))
    assert (f"(path={path})" in line) is hinted, line

"""The branch index of a streamed Claude Code import: the first read, kept off the heap.

Rule: docs/interop.md#streaming-imports. The model-visible branch of a Claude Code transcript
(the module docstring of :mod:`dsh.interop._claude_code`) is chosen from the last message line,
so every line's links must be known before the first event is written. This index keeps them
in a private temporary SQLite database (SQLite's own temporary file, deleted when the index is
closed; its page cache is capped at :data:`_CACHE_KIB`), and in memory only one byte of flags a
record, plus two 4-byte arrays while the branch is chosen. A transcript of any size is therefore
imported in memory that grows by those few bytes a record, not by its records' contents, and
not at all by its blank lines.

Records are numbered in file order from 1, blank lines not counted (the ``record`` that
:meth:`dsh.interop._common.JsonlSource.records` yields): the flags, the arrays and the database
are keyed by that number, so a file of mostly blank lines costs what its records cost. Each
record's file line is kept beside it in the database, for what names a line (a repair, errors).

What is kept of a record (its number is the key): file line, byte offset, type, whether it is
an inline
sidechain candidate, ``uuid``, the link it is followed by (``parentUuid``, or a
``compact_boundary``'s ``logicalParentUuid``) when it is a string, ``message.id`` and the
response key of an assistant line, the ``tool_use`` / ``tool_result`` ids of its content, and a
title's ``leafUuid``. The rules applied are those of :func:`dsh.interop._claude_code._active_set`
(the reference, used on the whole sessions that are read in memory), with "the line of a uuid"
being the last line holding it, as a dict keyed by uuid gives. A linear file (see
:meth:`BranchIndex._resolve_linear`) is recognized while it is read and skips the general
choice: its branch is every line with a uuid up to the last message line.
"""

from __future__ import annotations

import functools
import sqlite3
from array import array
from collections.abc import Callable, Sequence
from typing import Any, Final

from dsh.interop._common import JsonObj, str_or_none

_CACHE_KIB: Final = 8192
"""SQLite page cache of the index (KiB): what it may hold in memory before using its file."""

_ROWS: Final = 4096
"""Records buffered before they are written to the index at once."""

# Flags, one byte a record
MAIN: Final = 1  # not an inline sidechain line (or the file has no main conversation)
MESSAGE: Final = 2  # a user/assistant/system line with a uuid, of the main session
CHAIN: Final = 4  # the line holding its uuid last, on the branch
ACTIVE: Final = 8  # a line whose uuid is on the branch
SIDE: Final = 16  # an inline sidechain line (read as a child session)
PROGRESS: Final = 32  # an agent_progress line (a mirrored subagent's message)
LATER_PART: Final = 64  # a later active line of an API response split over several lines
FIRST_PART: Final = 128  # the first active line of such a response

_KINDS: Final = {"user": 1, "assistant": 2, "system": 3}
_ROOT: Final = -1  # the link is null: the conversation starts here
_BROKEN: Final = -2  # the link names no line (or is not a string)


def _key(text: str | None) -> str | bytes | None:
    """A string as SQLite can hold it: ASCII as is, else its UTF-8 bytes.

    Lone surrogates are kept (``surrogatepass``): equal strings give equal keys, different
    strings different ones.
    """
    if text is None or text.isascii():
        return text
    return text.encode("utf-8", "surrogatepass")


_LINES_ROW: Final = ("INSERT INTO lines VALUES ",
                     "(?, ?, ?, ?, ?, NULLIF(?, 0), NULLIF(?, 0), ?, NULLIF(?, 0), NULLIF(?, 0))",
                     10)
_TOOLS_ROW: Final = ("INSERT INTO tools VALUES ", "(?, ?, ?)", 3)
_STATEMENT_ROWS: Final = 256
"""Rows one INSERT of the index carries at most (fewer when the SQLite build binds fewer)."""


def _line_values(chunk: Sequence[tuple[Any, ...]]) -> list[Any]:
    """The parameters of ``lines`` rows for :data:`_LINES_ROW`.

    A NULL uuid, link, message id or response key is bound as ``0``, which these columns
    (text, bytes or NULL) never hold; the statement's ``NULLIF(?, 0)`` makes it NULL again.
    """
    values: list[Any] = []
    extend = values.extend
    for rec, line, off, kind, side, uid, link, linked, msgid, rkey in chunk:
        extend((rec, line, off, kind, side, 0 if uid is None else uid,
                0 if link is None else link, linked, 0 if msgid is None else msgid,
                0 if rkey is None else rkey))
    return values


def _tool_values(chunk: Sequence[tuple[Any, ...]]) -> list[Any]:
    """The parameters of ``tools`` rows for :data:`_TOOLS_ROW` (no column is NULL)."""
    return [value for row in chunk for value in row]


def _insert(db: sqlite3.Connection, table: tuple[str, str, int],
            values: Callable[[Sequence[tuple[Any, ...]]], list[Any]],
            rows: Sequence[tuple[Any, ...]]) -> None:
    """Insert ``rows`` into one index table in multi-row statements.

    ``table``: the statement's head, one row's ``VALUES`` group and its column count;
    ``values``: a chunk's parameters. Stepping SQLite once a row (``executemany``) and binding
    ``None`` (the driver looks an adapter up for it, raising and clearing an
    ``AttributeError``) were about a third of the index's write.
    """
    head, group, columns = table
    per = _STATEMENT_ROWS
    while per > 1 and per * columns > db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER):
        per //= 2
    done, count = 0, len(rows)
    while done < count:
        left = count - done
        size = per if left >= per else 1 << (left.bit_length() - 1)
        db.execute(_statement(head, group, size), values(rows[done:done + size]))
        done += size


@functools.lru_cache(maxsize=32)
def _statement(head: str, group: str, count: int) -> str:
    """``head`` then ``count`` copies of ``group``, comma-separated."""
    return head + ", ".join([group] * count)


class Flagged:
    """The records whose flags have ``bit`` set, as a ``Container[int]`` of record numbers."""

    __slots__ = ("_bit", "_flags")

    def __init__(self, flags: bytearray, bit: int) -> None:
        self._flags = flags
        self._bit = bit

    def __contains__(self, at: object) -> bool:
        return (isinstance(at, int) and 0 <= at < len(self._flags)
                and bool(self._flags[at] & self._bit))

    def __bool__(self) -> bool:
        bit = self._bit
        return any(f & bit for f in self._flags)


class BranchIndex:
    """Records of a Claude Code file as read the first time; then the branch they choose.

    Call :meth:`add` for each record in file order, then :meth:`resolve` once; then read
    :attr:`flags` (``ACTIVE``, ``SIDE``, ``FIRST_PART``, ..., indexed by record number),
    :attr:`repairs`, :attr:`title_line` (a file line) and :meth:`parts`; :meth:`close` drops
    the database.
    """

    def __init__(self) -> None:
        self._db = sqlite3.connect("", isolation_level=None)  # private, deleted on close
        self._db.execute(f"PRAGMA cache_size = -{_CACHE_KIB}")
        self._db.execute("PRAGMA journal_mode = OFF")
        self._db.execute("PRAGMA synchronous = OFF")
        self._db.executescript(
            "CREATE TABLE lines (rec INTEGER PRIMARY KEY, line INTEGER, off INTEGER, "
            " kind INTEGER, side INTEGER, uuid TEXT, link TEXT, linked INTEGER, msgid TEXT, "
            " rkey TEXT);"
            "CREATE TABLE tools (rec INTEGER, id TEXT, use INTEGER);"
            "CREATE TABLE titles (rec INTEGER, line INTEGER, leaf TEXT, side INTEGER);")
        self._lines: list[tuple[Any, ...]] = []
        self._tools: list[tuple[int, str | bytes | None, int]] = []
        self.last = 0
        self.flags = bytearray()
        self.repairs: dict[str, JsonObj] = {}
        self.title_line: int | None = None
        # A linear file (the common one) while it lasts: no sidechain line or title, each line
        # with a uuid linked to the one before it (the first to nothing); see _resolve_linear.
        self._linear = True
        self._tail: str | bytes | None = None  # the uuid of the last line holding one
        self._last_message = 0  # the last user/assistant/system line with a uuid
        # parts(): the one query read along with the second read, and how far it is
        self._parts_rows: sqlite3.Cursor | None = None
        self._parts_next: tuple[int, int, int, int] | None = None
        self._parts_at = 0

    # -- the first read

    def add(self, rec: int, line: int, offset: int, kind: str, side: bool, progress: bool,
            record: JsonObj) -> None:
        """Keep what choosing the branch reads of one record (``record`` is a dict).

        ``rec``: its record number (1-based, blank lines not counted); ``line``: its file line;
        ``side``: an inline sidechain candidate; ``progress``: an ``agent_progress`` line.
        """
        uid = str_or_none(record.get("uuid"))
        link = record.get("parentUuid")
        if link is None and record.get("subtype") == "compact_boundary":
            link = record.get("logicalParentUuid")
        linked = 0 if link is None else 1 if isinstance(link, str) else 2
        code = _KINDS.get(kind, 0)
        msgid = rkey = None
        tools: list[tuple[int, str | bytes | None, int]] = []
        msg = record.get("message")
        if isinstance(msg, dict):
            content = msg.get("content")
            if code == 2:
                msgid = str_or_none(msg.get("id"))
                rkey = msgid or uid or f"line-{line}"
                if isinstance(content, list):
                    tools.extend((rec, _key(b["id"]), 1) for b in content
                                       if isinstance(b, dict) and b.get("type") == "tool_use"
                                       and str_or_none(b.get("id")))
            elif code == 1 and isinstance(content, list):
                tools.extend(
                    (rec, _key(tid), 0) for b in content
                    if isinstance(b, dict) and b.get("type") == "tool_result"
                    and (tid := str_or_none(b.get("tool_use_id"))) is not None)
        if kind == "summary":
            title = record.get("summary")
            if isinstance(title, str) and title.strip():
                self._linear = False  # its leafUuid is looked up by the full resolve
                self._db.execute("INSERT INTO titles VALUES (?, ?, ?, ?)",
                                 (rec, line, _key(str_or_none(record.get("leafUuid"))),
                                  int(side)))
        self.add_row((rec, line, offset, code, int(side), _key(uid),
                      _key(link) if linked == 1 else None, linked, _key(msgid), _key(rkey)),
                     tools, side, progress)

    def add_row(self, row: tuple[Any, ...], tools: Sequence[tuple[int, str | bytes | None, int]],
                side: bool, progress: bool) -> None:
        """Keep a record as :meth:`add` does, from the ``row`` and ``tools`` it would build.

        What ``dsh.json.c_claude_line`` returns for a line that is not a title (``row``: record
        number, line, offset, kind code, side, uuid, link, linked, message id, response key).
        """
        rec = row[0]
        uid = row[5]
        if uid is not None and self._linear:
            tail = self._tail
            if side or (row[7] != 0 if tail is None else row[7] != 1 or row[6] != tail):
                self._linear = False
            self._tail = uid
            if row[3]:
                self._last_message = rec
        if side or progress:
            self._mark(rec, (SIDE if side else 0) | (PROGRESS if progress else 0))
        self._lines.append(row)
        if tools:
            self._tools.extend(tools)
        self.last = rec
        if len(self._lines) >= _ROWS:
            self._flush()

    def _flush(self) -> None:
        db = self._db
        db.execute("BEGIN")
        _insert(db, _LINES_ROW, _line_values, self._lines)
        _insert(db, _TOOLS_ROW, _tool_values, self._tools)
        db.execute("COMMIT")
        self._lines.clear()
        self._tools.clear()

    def _mark(self, rec: int, bit: int) -> None:
        if rec >= len(self.flags):
            self.flags.extend(bytes(rec + 1 - len(self.flags) + _ROWS))
        self.flags[rec] |= bit

    # -- choosing the branch

    def resolve(self, mainline: bool, record_at: Callable[[int], JsonObj]) -> None:
        """Choose the branch as :func:`dsh.interop._claude_code._active_set` does.

        Args:
            mainline: The file has a main conversation: inline sidechain lines are left out.
            record_at: The exactly decoded record of a record number (the rare broken link is
                read again to describe its repair).
        """
        self._flush()
        db = self._db
        side_max = 0 if mainline else 1
        n = self.last + 1
        if len(self.flags) < n:
            self.flags.extend(bytes(n - len(self.flags)))
        flags = self.flags
        if not mainline:
            for rec in range(n):
                flags[rec] &= ~SIDE & 0xFF
        if self._linear and db.execute(
                "SELECT 1 FROM lines WHERE uuid IS NOT NULL GROUP BY uuid HAVING count(*) > 1 "
                "LIMIT 1").fetchone() is None:
            self._resolve_linear()
            return
        db.executescript(
            "CREATE INDEX lines_uuid ON lines(uuid, side);"
            "CREATE INDEX lines_rkey ON lines(rkey, side);"
            "CREATE INDEX tools_id ON tools(id, use);")
        db.execute("CREATE TABLE owner (uuid TEXT PRIMARY KEY, last INTEGER) WITHOUT ROWID")
        db.execute("INSERT INTO owner SELECT uuid, max(rec) FROM lines WHERE uuid IS NOT NULL "
                   "AND side <= ? GROUP BY uuid", (side_max,))
        canon = array("i", bytes(4 * n))
        parent = array("i", bytes(4 * n))
        last_message = 0
        for rec, kind, owner, linked, target in db.execute(
                "SELECT a.rec, a.kind, o.last, a.linked, t.last FROM lines a "
                "JOIN owner o ON o.uuid = a.uuid LEFT JOIN owner t ON t.uuid = a.link "
                "WHERE a.side <= ?", (side_max,)):
            canon[rec] = owner
            flags[rec] |= MAIN
            if kind:
                flags[rec] |= MESSAGE
                if rec > last_message:
                    last_message = rec
            if owner == rec:
                parent[rec] = _ROOT if linked == 0 else target if target is not None \
                    else _BROKEN
        self._walk(last_message, canon, parent, record_at, side_max)
        self._widen(canon, side_max)
        for rec in range(n):
            if flags[rec] & MAIN and canon[rec] and flags[canon[rec]] & CHAIN:
                flags[rec] |= ACTIVE
        del canon, parent
        self._title(side_max)
        self._responses(side_max)

    def _resolve_linear(self) -> None:
        """Choose the branch of a linear file: what :meth:`resolve` finds for it, directly.

        Linear: no inline sidechain line and no title; every uuid is held by one line; each
        line with a uuid links to the previous line with one, the first to nothing (null). The
        walk from the last message line then meets every line with a uuid up to it, none is
        broken (no repair), widening adds nothing (every assistant and user line is on the
        branch already), and no title is chosen; only the split responses are looked up.
        """
        last_message = self._last_message
        flags = self.flags
        for rec, kind in self._db.execute("SELECT rec, kind FROM lines "
                                           "WHERE uuid IS NOT NULL"):
            flags[rec] |= (MAIN | MESSAGE) if kind else MAIN
            if rec <= last_message:
                flags[rec] |= CHAIN | ACTIVE
        self._db.execute("CREATE INDEX lines_rkey ON lines(rkey, side)")
        self._responses(0)

    def _walk(self, last_message: int, canon: array[int], parent: array[int],
              record_at: Callable[[int], JsonObj], side_max: int) -> None:
        """Follow parent links from the last message line, repairing broken ones."""
        flags = self.flags
        cur = canon[last_message] if last_message else 0
        while cur and not flags[cur] & CHAIN:
            flags[cur] |= CHAIN
            nxt = parent[cur]
            if nxt == _ROOT:
                break
            if nxt > 0 and not flags[nxt] & CHAIN:
                cur = nxt
                continue
            # A broken link: continue from the nearest earlier message line not on the branch
            # (before the last message line holding this uuid, else before the end).
            node = record_at(cur)
            uid = str(node.get("uuid"))
            found, found_line = self._db.execute(
                "SELECT max(rec), line FROM lines WHERE uuid = ? AND kind > 0 AND side <= ?",
                (_key(uid), side_max)).fetchone()
            back = (found if found is not None else len(flags)) - 1
            while back > 0 and not (flags[back] & MESSAGE and not flags[canon[back]] & CHAIN):
                back -= 1
            linked = canon[back] if back > 0 else 0
            field_name, missing = "parentUuid", node.get("parentUuid")
            if missing is None and node.get("subtype") == "compact_boundary":
                field_name, missing = "logicalParentUuid", node.get("logicalParentUuid")
            self.repairs[uid] = {
                "line": found_line, "uuid": uid, "brokenLink": field_name, "missing": missing,
                "linkedTo": str(record_at(linked).get("uuid")) if linked else None}
            cur = linked

    def _widen(self, canon: array[int], side_max: int) -> None:
        """Add the lines sharing a response id with the branch, then the results of its calls."""
        flags = self.flags
        group: list[int] = []
        on_branch = False
        current: str | None = None
        for rec, msgid in self._db.execute(
                "SELECT rec, msgid FROM lines WHERE kind = 2 AND msgid IS NOT NULL "
                "AND side <= ? ORDER BY msgid, rec", (side_max,)):
            if canon[rec] != rec:
                continue
            if msgid != current:
                if on_branch:
                    for member in group:
                        flags[member] |= CHAIN
                group, on_branch, current = [], False, msgid
            group.append(rec)
            on_branch = on_branch or bool(flags[rec] & CHAIN)
        if on_branch:
            for member in group:
                flags[member] |= CHAIN
        answered = [result for result, call in self._db.execute(
            "SELECT r.rec, u.rec FROM tools r JOIN tools u ON u.id = r.id AND u.use = 1 "
            "WHERE r.use = 0")
            if canon[result] == result and canon[call] == call and flags[call] & CHAIN]
        for rec in answered:
            flags[rec] |= CHAIN

    def _title(self, side_max: int) -> None:
        """The file line of the ``summary`` titling the session (on the branch, else the last)."""
        flags = self.flags
        last = on_branch = None
        for line, target in self._db.execute(
                "SELECT t.line, o.last FROM titles t LEFT JOIN owner o ON o.uuid = t.leaf "
                "WHERE t.side <= ? ORDER BY t.rec", (side_max,)):
            last = line
            if target is not None and flags[target] & CHAIN:
                on_branch = line
        self.title_line = on_branch if on_branch is not None else last

    def _responses(self, side_max: int) -> None:
        """Mark the active lines of each API response split over several lines."""
        flags = self.flags
        db = self._db
        group: list[int] = []
        current: str | None = None
        rows: list[tuple[int, int]] = []  # (first record, member record) of split responses

        def close() -> None:
            if len(group) > 1:
                flags[group[0]] |= FIRST_PART
                for member in group[1:]:
                    flags[member] |= LATER_PART
                rows.extend((group[0], member) for member in group)
                if len(rows) >= _ROWS:
                    db.executemany("INSERT INTO parts VALUES (?, ?)", rows)
                    rows.clear()

        db.execute("CREATE TABLE parts (first INTEGER, rec INTEGER)")
        db.execute("BEGIN")
        for rec, rkey in db.execute(
                "SELECT rec, rkey FROM lines WHERE rkey IS NOT NULL AND side <= ? "
                "ORDER BY rkey, rec", (side_max,)):
            if not flags[rec] & ACTIVE:
                continue
            if rkey != current:
                close()
                group, current = [], rkey
            group.append(rec)
        close()
        db.executemany("INSERT INTO parts VALUES (?, ?)", rows)
        db.execute("COMMIT")

    # -- the second read

    def parts(self, rec: int) -> list[tuple[int, int, int]]:
        """``(record, line, offset)`` of the active records of the response ``rec`` opens.

        Empty unless ``rec`` is flagged ``FIRST_PART``. Asked in increasing record order (as
        the second read meets the first parts), the answers come from one query read along
        with the file; a record before the last one asked is looked up on its own.
        """
        if rec <= self._parts_at:
            return [(at, line, offset) for at, line, offset in self._db.execute(
                "SELECT p.rec, l.line, l.off FROM parts p JOIN lines l ON l.rec = p.rec "
                "WHERE p.first = ? ORDER BY p.rec", (rec,))]
        self._parts_at = rec
        if self._parts_rows is None:
            self._parts_rows = self._db.execute(
                "SELECT p.first, p.rec, l.line, l.off FROM parts p JOIN lines l "
                "ON l.rec = p.rec ORDER BY p.first, p.rec")
            self._parts_next = next(self._parts_rows, None)
        found: list[tuple[int, int, int]] = []
        row = self._parts_next
        while row is not None and row[0] <= rec:
            if row[0] == rec:
                found.append((row[1], row[2], row[3]))
            row = next(self._parts_rows, None)
        self._parts_next = row
        return found

    def place(self, rec: int) -> tuple[int, int]:
        """``(file line, byte offset)`` of a record."""
        found = self._db.execute("SELECT line, off FROM lines WHERE rec = ?",
                                 (rec,)).fetchone()
        return int(found[0]), int(found[1])

    def close(self) -> None:
        """Drop the database (its file with it)."""
        self._db.close()

"""Full-text search across every session of a store: an SQLite FTS5 index beside the store.

``dsh search`` and the viewer's store search ask :func:`search`. SQLite and JSONL stores keep
the index in a sidecar SQLite database (``<db>.dsh-search.db``, ``<root>/.dsh-search.db``) with
an FTS5 table of the text of every appended message (user, assistant, system, tool result:
text, reasoning, tool calls and results) and, per session, the signature of the log it has
indexed and how many events. A search first brings the index up to date: a session whose
signature is unchanged is not opened; one that grew is read from the first event not indexed
yet; one that was replaced or shrank (a new incarnation, a torn tail cut) is indexed again from
its start. What changed is found without work per unchanged session (:class:`Freshness`: one
SQL comparison for SQLite, the search journal for JSONL). PostgreSQL keeps the index in its own
tables (``dsh.persistence.postgres._search``); a memory store is searched by reading every log.

Invariants this module owns: the index is only derived (deleting the sidecar loses nothing, the
next search rebuilds it); a search never writes the store; a session whose log cannot be read is
left out and named, never hides the others; matching is by words (Unicode, case and diacritics
folded), the last word also as a prefix.

Rule: docs/stores.md#search; the sidecar: docs/formats.md#search-index.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import re
import sqlite3
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, cast, runtime_checkable

from dsh._errors import DshError
from dsh.persistence._contract import STORE_LOG_ID
from dsh.persistence._listing import removed_messages, signature

if TYPE_CHECKING:
    from dsh.persistence._facade import Persistence

__all__ = ["IndexChanges", "IndexesSearch", "SearchHit", "SearchIndex", "SearchResults", "search"]

log = logging.getLogger("dsh.persistence.search")

INDEX_VERSION: Final = 3
"""``user_version`` of the sidecar database; another version is rebuilt (2: terminal escape
sequences are indexed as spaces; 3: but for an OSC's payload, a title's words, which is indexed
as text; docs/formats.md#search-index)."""

SNIPPET_CHARS: Final = 60
"""Characters of context each side of the first match in a hit's snippet."""

_MESSAGE_TYPES: Final = ("user/message", "assistant/message", "tool/result", "system/message")
_WORD: Final = re.compile(r"\w+")
_QUERY_WORD: Final = re.compile(
    r"\w[\w\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]*")
"""A query's word: letters and digits, and the combining marks typed after them (a decomposed
``u`` + U+0308 is the one word ``ü``, as the index's tokenizer reads it)."""
_SEGMENT_ESCAPE: Final = re.compile(r"~([0-9A-F]{4})")

_TOKENIZE: Final = "tokenize = 'unicode61 remove_diacritics 2'"
_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS indexed (session_id TEXT PRIMARY KEY, signature TEXT NOT NULL, "
    "events INTEGER NOT NULL)",
    "CREATE VIRTUAL TABLE IF NOT EXISTS messages USING fts5(text, session_id UNINDEXED, "
    f"seq UNINDEXED, role UNINDEXED, {_TOKENIZE})",
)

WINDOW_ROWS: Final = 8
"""Rows per hit asked (64 more) that a sidecar query re-checks at most in place of the last
word's whole prefix doclist (about 20 µs of CPU each, against ~28 ms for a doclist of 900,000
rows)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchHit:
    """One message that matches.

    Attributes:
        session_id: The session.
        seq: The seq of the event holding the message.
        role: ``user``, ``assistant``, ``system`` or ``tool``.
        before: Text before the first matching word (at most :data:`SNIPPET_CHARS`, ``…`` first
            when cut), whitespace runs shown as one space. Raw session text: escape it to show.
        match: The first matching word as written.
        after: Text after it, as ``before``.
        removed: ``"clear"`` or ``"quarantine"`` when the message has left the model view
            (the log keeps its bytes: docs/stores.md#search), else None. ``Store.search``
            sets it; :func:`search` alone leaves it None.
    """

    session_id: str
    seq: int
    role: str
    before: str
    match: str
    after: str
    removed: str | None = None

    @property
    def snippet(self) -> str:
        """``before + match + after``."""
        return self.before + self.match + self.after

    def to_json(self) -> dict[str, Any]:
        """``{"session", "seq", "role", "snippet", "match", "removed"}`` (``dsh search --json``)."""
        return {"session": self.session_id, "seq": self.seq, "role": self.role,
                "snippet": self.snippet, "match": self.match, "removed": self.removed}


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResults:
    """A search's hits and what it looked at.

    Attributes:
        hits: The matches, newest indexed first, at most the limit asked.
        sessions: Sessions searched: every stored one but the store log (``Store.search``
            also leaves out, unless asked, the trash: docs/stores.md#search).
        reindexed: Sessions whose log was read to bring the index up to date.
        unreadable: Ids of sessions left out because their log cannot be read (``dsh verify``
            names the damage).
        indexed: False when the store keeps no index (every log was read).
        store_log: Whether the store holds a store log (docs/forgetting.md#the-store-log),
            which ``sessions`` does not count: only then can sessions be in the trash.
    """

    hits: tuple[SearchHit, ...]
    sessions: int
    reindexed: int
    unreadable: tuple[str, ...]
    indexed: bool
    store_log: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class IndexChanges:
    """How a store's logs differ from what its search index holds.

    Attributes:
        sessions: Sessions stored.
        changed: ``(session id, signature of its stored log, (signature, events) indexed or
            None)`` of every stored session whose signature is not the one indexed, in id order.
        gone: Ids of sessions indexed but no longer stored.
        store_log: Whether the store holds its store log (``STORE_LOG_ID``, not counted in
            ``sessions``).
    """

    sessions: int
    changed: tuple[tuple[str, str, tuple[str, int] | None], ...]
    gone: tuple[str, ...]
    store_log: bool = False


def compare(signatures: Mapping[str, str], known: Mapping[str, tuple[str, int]]
            ) -> IndexChanges:
    """How a store's signatures differ from the index's (:class:`IndexChanges`).

    The store log (``STORE_LOG_ID``) is neither counted nor compared: it holds no message.

    Args:
        signatures: ``session id -> signature`` of every stored log.
        known: ``session id -> (signature, events)`` of every session indexed.
    """
    changed = tuple((sid, sig, known.get(sid)) for sid, sig in sorted(signatures.items())
                    if (known.get(sid) or ("", 0))[0] != sig and sid != STORE_LOG_ID)
    return IndexChanges(sessions=len(signatures) - (STORE_LOG_ID in signatures), changed=changed,
                        gone=tuple(sid for sid in known if sid not in signatures),
                        store_log=STORE_LOG_ID in signatures)


def message_texts(events: Iterable[Mapping[str, Any]]) -> Iterator[tuple[int, str, str]]:
    """Yield ``(seq, role, text)`` of each message appended to the surface, in log order.

    Rule (docs/stores.md#search): a message that replaces a range (a compaction checkpoint, a
    quarantine placeholder) is not indexed.
    """
    for event in events:
        kind = event.get("type")
        if kind not in _MESSAGE_TYPES or event.get("surfaceOp") != "append":
            continue
        data = event.get("data")
        message = data if kind in ("user/message", "system/message") else (
            data.get("message") if isinstance(data, Mapping) else None)
        if not isinstance(message, Mapping):
            continue
        text = _indexable(_all_text(message.get("content")))
        if text.strip():
            role = "tool" if kind == "tool/result" else str(message.get("role"))
            yield int(event["seq"]), role, text


_TERMINAL_ESCAPES: Final = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI (colours, cursor moves): ESC [ params final
    r"|\x9b[0-?]*[ -/]*[@-~]"  # the same with the one-byte C1 CSI
    r"|\x1b\](?:[0-9]*;)?([^\x07\x1b\x9c]*)(?:\x07|\x1b\\|\x9c)"  # OSC: title, link; payload
    r"|\x1b[ -/]*[0-~]")  # any other escape: ESC, intermediates, one final
"""Terminal escape sequences in tool output and model text (docs/stores.md#search); group 1 is
a terminated OSC's payload (after ``ESC ]``, its numeric parameter and ``;``)."""


def _unescaped(match: re.Match[str]) -> str:
    payload = match[1]
    if payload is None:  # CSI or another sequence: no text
        return " "
    # An OSC's payload is text a terminal shows (a window title, a link's target): an auditor
    # searching for words hidden in a title must find them, so only its introducer and
    # terminator are spaces. The payload holds no ESC, but may hold a one-byte C1 CSI.
    return f" {_TERMINAL_ESCAPES.sub(_unescaped, payload)} "


def _indexable(text: str) -> str:
    # Terminal escape sequences are no text: "\x1b[31mError" holds the word Error, which the
    # tokenizer would read as part of "31mError"; each sequence becomes one space, but for an
    # OSC's payload (a title's words), which stays between two spaces.
    if "\x1b" in text or "\x9b" in text:
        text = _TERMINAL_ESCAPES.sub(_unescaped, text)
    # A lone surrogate is valid in a dsh log (docs/formats.md#lossless-json) but has no UTF-8
    # for the index's SQL text, and is no word: it is indexed, and shown in snippets, as U+FFFD.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def _all_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind in ("text", "reasoning") and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif kind == "tool-call":
            parts.append(f"{block.get('name')} {block.get('arguments')}")
        elif kind == "tool-result":
            parts.append(_all_text(block.get("content")))
    return "\n".join(parts)


def search_words(query: str) -> list[str]:
    """The words a search looks for in ``query`` (runs of letters and digits), in order.

    An empty list means the query matches nothing (docs/stores.md#search).
    """
    return _QUERY_WORD.findall(query)


def _fts_query(words: list[str]) -> str:
    """Every word must occur (the last one also as a prefix); quotes keep FTS5 syntax out."""
    quoted = [f'"{word}"' for word in words]
    quoted[-1] += "*"
    return " ".join(quoted)


def fold(text: str) -> tuple[str, list[int]]:
    """``text`` case- and diacritics-folded, and for each folded character its index in text."""
    out: list[str] = []
    where: list[int] = []
    if text.isascii():  # the common case, in C: one folded character per character
        return text.lower(), list(range(len(text)))
    for index, char in enumerate(text):
        if char.isascii():
            folded = char.lower()
        else:
            folded = "".join(c for c in unicodedata.normalize("NFKD", char.casefold())
                             if not unicodedata.combining(c))
        out.append(folded)
        where.extend([index] * len(folded))
    return "".join(out), where


_SPACES: Final = re.compile(r"(?:\r\n|[^\S\x00-\x08\x0b-\x1f\x7f-\x9f])+")
"""A run of whitespace and CRLF line ends: a lone CR, VT, FF and the other controls stay in a
snippet, for its printer to show as escapes (docs/stores.md#search)."""


def _one_line(text: str) -> str:
    return _SPACES.sub(" ", text).strip(" ")


def snippet_of(session_id: str, seq: int, role: str, text: str, words: list[str]) -> SearchHit:
    """The hit of a message: its first matching word with some context each side.

    Each run of spaces, tabs and line ends (LF or CRLF) in the context becomes one space; a
    lone CR and the other control characters are kept (docs/stores.md#search).
    """
    at, end = _first_word(text, [re.compile(r"(?<!\w)" + re.escape(fold(word)[0]))
                                 for word in words])
    size = 0
    if at >= 0:
        while end < len(text) and (text[end].isalnum() or text[end] == "_"
                                   or unicodedata.combining(text[end])):
            end += 1  # the whole word, for a prefix match (its combining marks too)
        size = end - at
    if at < 0:  # the tokenizer matched what this search does not see: show the start
        at, size = 0, 0
    start = max(0, at - SNIPPET_CHARS)
    stop = min(len(text), at + size + SNIPPET_CHARS)
    return SearchHit(session_id=session_id, seq=seq, role=role,
                     before=("…" if start else "") + _one_line(text[start:at]) +
                     (" " if at > start and _SPACES.match(text[at - 1]) else ""),
                     match=text[at:at + size],
                     after=(" " if at + size < stop and _SPACES.match(text, at + size) else "") +
                     _one_line(text[at + size:stop]) + ("…" if stop < len(text) else ""))


_WINDOW_CHARS: Final = 65_536
"""How much of a message :func:`_first_word` folds at a time."""
_OVERLAP_CHARS: Final = 1_024
"""How far windows overlap: a match of up to this many characters is never cut by a window end."""


def _first_word(text: str, patterns: list[re.Pattern[str]]) -> tuple[int, int]:
    """Where in ``text`` the earliest match of ``patterns`` (on the folded text) starts and ends.

    ``(-1, -1)`` for none. The text is folded a window at a time, windows overlapping, up to
    the first that holds a match: a hit in a message of megabytes costs one window's memory,
    not a list of its characters and an int per character (2.4 GB for 21 MB). A match is taken
    from a window only when it starts before the part the next window covers (and so ends
    inside it), so the earliest is found wherever the windows fall.
    """
    start = 0
    while True:
        stop = min(len(text), start + _WINDOW_CHARS)
        last = stop == len(text)
        lead = max(0, start - 8)  # context for the patterns' look-behind
        while True:
            folded, where = fold(text[lead:stop])
            pos = bisect.bisect_left(where, start - lead)
            if pos > 0 or lead == 0:
                break
            # the lead folded to nothing (combining marks): the look-behind needs the letter
            # they sit on, as a fold of the whole message has it
            lead = max(0, lead - 2 * (start - lead))
        best = (-1, -1)
        for pattern in patterns:
            found = pattern.search(folded, pos)
            if found is None or found.end() == found.start():
                continue
            at = lead + where[found.start()]
            if (last or at < stop - _OVERLAP_CHARS) and (best[0] < 0 or at < best[0]):
                best = (at, lead + where[found.end() - 1] + 1)
        if best[0] >= 0 or last:
            return best
        start = stop - _OVERLAP_CHARS


# -- where the index lives and what it compares ----------------------------------------------

SIDECAR_NAME: Final = ".dsh-search.db"
"""The sidecar's file name in a JSONL store's root (a SQLite store's is ``<db>`` + this)."""


@runtime_checkable
class SearchIndex(Protocol):
    """A store's full-text search index, as :func:`search` keeps it up to date and asks it.

    Rule: docs/stores.md#search; docs/formats.md#search-index.
    """

    @property
    def path(self) -> Path | None:
        """The sidecar database file, or None when the index lives in the store's own tables."""
        ...

    def changes(self) -> IndexChanges:
        """What the index lacks of the store, found without reading any log."""
        ...

    def settle(self, unreadable: Sequence[str]) -> None:
        """Record what the applied changes were measured against (``unreadable``: left out)."""
        ...

    def drop(self, session_id: str) -> None:
        """Forget a session that is no longer stored."""
        ...

    def put(self, session_id: str, sig: str, events: int,
            rows: list[tuple[int, str, str]], *, fresh: bool) -> None:
        """Add ``(seq, role, text)`` rows (after dropping the session's rows when ``fresh``)."""
        ...

    def query(self, words: list[str], limit: int) -> list[tuple[str, int, str, str]]:
        """``(session id, seq, role, text)`` of the newest indexed messages holding ``words``."""
        ...

    def reset(self) -> None:
        """Drop everything indexed (the next update indexes every session again)."""
        ...

    def forget(self, session_id: str) -> list[str]:
        """Remove what is indexed of ``session_id`` after its log was rewritten in place.

        Returns:
            What was removed, for a receipt: the sidecar files deleted, or the rows' place.
        """
        ...

    def close(self) -> None:
        """Release the index's connection."""
        ...


@runtime_checkable
class IndexesSearch(Protocol):
    """A backend that keeps a search index (``Capabilities.search_index``)."""

    def search_index(self) -> SearchIndex:
        """The store's search index, opened for one search (the caller closes it).

        Raises:
            PersistenceError: the index cannot be opened (its database failed).
        """
        ...


def decode_segment(segment: str) -> str:
    """The session id a JSONL session folder's name encodes.

    Rule: docs/formats.md#layout-and-path-encoding.
    """
    if "~" not in segment:
        return segment
    units = bytearray()
    at = 0
    for found in _SEGMENT_ESCAPE.finditer(segment):
        units += segment[at:found.start()].encode("utf-16-le")
        units += int(found.group(1), 16).to_bytes(2, "little")
        at = found.end()
    units += segment[at:].encode("utf-16-le")
    return units.decode("utf-16-le", "surrogatepass")


def jsonl_signatures(root: Path) -> dict[str, str]:
    """``session id -> inode:device:size:mtime`` of every log file under a JSONL store's root.

    A smaller size or another inode means the log was replaced or cut. No log is read. Each log
    is stat'ed by its path relative to its project folder, opened once (two path components
    for the kernel to walk, not the root's), and its signature formatted in place: this is the
    full sweep a JSONL search makes every :data:`~dsh.persistence.jsonl._search_journal.
    FULL_SWEEP_S` (docs/stores.md#search), one ``stat`` per session.
    """
    out: dict[str, str] = {}
    try:
        projects = [e.path for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return out
    stat = os.stat
    for project in projects:
        try:
            fd = os.open(project, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # removed since it was listed
        try:
            with os.scandir(fd) as it:
                folders = [e.name for e in it if e.is_dir(follow_symlinks=False)]
            for name in folders:
                try:
                    st = stat(name + "/session.jsonl", dir_fd=fd)
                except FileNotFoundError:
                    try:
                        st = stat(name + "/session.jsonl.zstd", dir_fd=fd)
                    except FileNotFoundError:
                        continue
                # a folder holding both is refused by the backend: one stat per log
                out[decode_segment(name) if "~" in name else name] = \
                    f"{st.st_ino}:{st.st_dev}:{st.st_size}:{st.st_mtime_ns}"
        finally:
            os.close(fd)
    return out


def _grew(old: str, new: str) -> bool:
    """Whether ``new`` is the same log as ``old`` with events appended (else: index anew)."""
    old_parts, new_parts = old.split(":"), new.split(":")
    if len(old_parts) == 2 and len(new_parts) == 2:  # SQLite incarnation:revision
        return old_parts[0] == new_parts[0]
    if len(old_parts) == 4 and len(new_parts) == 4:  # JSONL inode:device:size:mtime
        return old_parts[:2] == new_parts[:2] and int(new_parts[2]) >= int(old_parts[2])
    return False


def jsonl_signature(st: os.stat_result) -> str:
    """The signature the index records for a JSONL log file (inode:device:size:mtime ns)."""
    sig = signature(st)
    return f"{sig[3]}:{sig[4]}:{sig[0]}:{sig[1]}"


def note_flushed(root: Path, session_id: str, before: int, events: Sequence[Mapping[str, Any]],
                 st: os.stat_result) -> bool:
    """Add a JSONL batch just made durable to the store's search index, when it is current.

    A writer calls this after its flush (a post-commit step: it may fail, never the flush). It
    does something only when the index exists and holds this session's log exactly up to the
    batch (``before`` events, the same file), or does not hold the session and the batch is its
    log's first (``before`` 0: a new session): then the batch's messages are added and the
    signature moved to (set to) ``st``'s, in one transaction. Otherwise the next search catches
    up. A busy index is not waited for (50 ms).

    Returns:
        True when the batch was added.
    """
    path = root / SIDECAR_NAME
    if not path.exists():
        return False
    conn = sqlite3.connect(path, timeout=0.05, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute("SELECT signature, events FROM indexed WHERE session_id = ?",
                               (session_id,)).fetchone()
            new = jsonl_signature(st)
            fresh = row is None and before == 0  # a new session's first batch: all of its log
            if not fresh and (row is None or int(row[1]) != before
                              or not _grew(str(row[0]), new)):
                conn.execute("ROLLBACK")
                return False
            conn.executemany("INSERT INTO messages (text, session_id, seq, role) "
                             "VALUES (?, ?, ?, ?)",
                             [(text, session_id, seq, role)
                              for seq, role, text in message_texts(events)])
            if fresh:
                conn.execute("INSERT INTO indexed (session_id, signature, events) "
                             "VALUES (?, ?, ?)", (session_id, new, len(events)))
            else:
                conn.execute("UPDATE indexed SET signature = ?, events = ? "
                             "WHERE session_id = ?", (new, before + len(events), session_id))
            conn.execute("COMMIT")
            return True
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()


def forget_search(persistence: Persistence, session_id: str) -> list[str]:
    """Drop what the search index holds of ``session_id`` after its log was rewritten in place.

    Redaction and erasure rewrite committed events without a new incarnation, so the index
    would keep the old text. A sidecar index is deleted whole (an FTS5 table keeps deleted text
    in its free pages until it is rebuilt; the next search builds a new one); a PostgreSQL
    store's rows of the session are deleted (the next search indexes it again). A store
    without an index (``Capabilities.search_index`` off) has nothing to drop.

    Returns:
        What was removed: the sidecar files deleted, or ``"<url> search rows"``.

    Raises:
        OSError: a sidecar file could not be deleted.
        PersistenceError: the PostgreSQL tables could not be changed.
    """
    backend = persistence.backend
    if not backend.capabilities.search_index:
        return []
    index = cast(IndexesSearch, backend).search_index()
    try:
        return index.forget(session_id)
    finally:
        index.close()


def _connect(path: Path | None) -> sqlite3.Connection:
    """The index database (created 0600); an in-memory one when the file cannot be used."""
    if path is not None:
        try:
            if not path.exists():
                fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
                os.close(fd)
            # as a URI, so that ATTACH of the store file with ``?mode=rw`` (never create) is one
            conn = sqlite3.connect(path.absolute().as_uri(), uri=True, timeout=30,
                                   isolation_level=None)
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version == INDEX_VERSION:  # the common case: nothing to write
                return conn
            conn.execute("PRAGMA journal_mode = WAL")
            # Another search may be building the index again right now: the version is read
            # again under the write lock and the tables replaced in one transaction, so an
            # index another process just built (and may be reading) is never dropped under it.
            conn.execute("BEGIN IMMEDIATE")
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version != INDEX_VERSION:
                    if version != 0:
                        conn.execute("DROP TABLE IF EXISTS indexed")
                        conn.execute("DROP TABLE IF EXISTS messages")
                    for statement in _SCHEMA:
                        conn.execute(statement)
                    conn.execute(f"PRAGMA user_version = {INDEX_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                conn.close()
                raise
            return conn
        except (OSError, sqlite3.Error) as exc:
            log.warning("search index %s cannot be used (%r); searching without it", path, exc)
    conn = sqlite3.connect(":memory:", uri=True, isolation_level=None)
    for statement in _SCHEMA:
        conn.execute(statement)
    return conn


class SidecarIndex:
    """The FTS5 index in an SQLite sidecar (docs/formats.md#search-index).

    Args:
        path: The sidecar database file (created 0600 on first use).
        freshness: How the store's changes are found: :class:`SqliteFreshness`, or a JSONL
            store's journal (``dsh.persistence.jsonl._search_journal``).
    """

    def __init__(self, path: Path, freshness: Freshness) -> None:
        self._path = path
        self._freshness = freshness
        self._conn: sqlite3.Connection | None = None

    @property
    def path(self) -> Path:
        """The sidecar database file."""
        return self._path

    @property
    def conn(self) -> sqlite3.Connection:
        """The index database, opened (and created) on first use."""
        if self._conn is None:
            self._conn = _connect(self._path)
        return self._conn

    def changes(self) -> IndexChanges:
        """What the index lacks of the store, found without reading any log."""
        return self._freshness.changes(self.conn)

    def settle(self, unreadable: Sequence[str]) -> None:
        """The changes were applied (but for ``unreadable``): the freshness records them."""
        self._freshness.settle(self.conn, unreadable)

    def drop(self, session_id: str) -> None:
        """Forget a session that is no longer stored."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
        conn.execute("DELETE FROM indexed WHERE session_id = ?", (session_id,))
        conn.execute("COMMIT")

    def put(self, session_id: str, sig: str, events: int,
            rows: list[tuple[int, str, str]], *, fresh: bool) -> None:
        """Add ``(seq, role, text)`` rows (after dropping the session's rows when ``fresh``)."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            if fresh:
                conn.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
            conn.executemany("INSERT INTO messages (text, session_id, seq, role) "
                             "VALUES (?, ?, ?, ?)",
                             [(text, session_id, seq, role) for seq, role, text in rows])
            conn.execute("INSERT OR REPLACE INTO indexed (session_id, signature, events) "
                         "VALUES (?, ?, ?)", (session_id, sig, events))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def query(self, words: list[str], limit: int) -> list[tuple[str, int, str, str]]:
        """``(session id, seq, role, text)`` of the newest indexed messages holding ``words``.

        The answer of ``MATCH '"w1" … "wn"*' ORDER BY rowid DESC LIMIT limit``, found without
        the last word's whole prefix doclist when the exact words are common: FTS5 merges the
        doclists of every term with that prefix before its first row (~21 ms of CPU for a
        word in a quarter of 2.9 M messages), while exact words are walked newest first and
        stop at the limit. When the exact query (the last word too taken whole) fills the
        limit, its hits match the prefix query as well, so the prefix query's hits are all at
        or after its oldest one: the rows there holding the other words (at most
        :data:`WINDOW_ROWS` per hit asked, 64 more) are matched against the prefix query in a
        scratch FTS5 table of the same tokenizer. Otherwise the prefix query is asked as it
        is. Rule: docs/formats.md#search-index.
        """
        conn = self.conn
        full = _fts_query(words)
        exact = " ".join(f'"{word}"' for word in words)
        newest = conn.execute("SELECT rowid FROM messages WHERE messages MATCH ? ORDER BY "
                              "rowid DESC LIMIT ?", (exact, limit)).fetchall()
        rows = _window(conn, words, full, int(newest[-1][0]), limit) \
            if len(newest) == limit else None
        if rows is None:
            rows = conn.execute("SELECT rowid, session_id, seq, role, text FROM messages WHERE "
                                "messages MATCH ? ORDER BY rowid DESC LIMIT ?",
                                (full, limit)).fetchall()
        return [(str(a), int(b), str(c), str(d)) for _, a, b, c, d in rows]

    def reset(self) -> None:
        """Delete the sidecar (the next use builds an empty one)."""
        self._delete()

    def forget(self, session_id: str) -> list[str]:
        """Delete the sidecar whole: FTS5 keeps deleted text in free pages until a rebuild."""
        return self._delete()

    def _delete(self) -> list[str]:
        self.close()
        removed: list[str] = []
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self._path}{suffix}")
                removed.append(f"{self._path}{suffix}")
        return removed

    def close(self) -> None:
        """Close the database (a later use opens it again)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _window(conn: sqlite3.Connection, words: list[str], full: str, oldest: int,
            limit: int) -> list[Any] | None:
    """The newest ``limit`` rows from rowid ``oldest`` on matching ``full``; None: too many.

    The rows there holding the words but the last (every row when there is one word) are
    matched against ``full`` in an in-memory FTS5 table with the index's tokenizer, so a row
    matches exactly when the index would match it.
    """
    most = WINDOW_ROWS * limit + 64
    newest = conn.execute("SELECT rowid FROM messages ORDER BY rowid DESC LIMIT 1").fetchone()
    if newest is None or int(newest[0]) - oldest >= most:  # rowids grow: a span that wide
        return None
    head = " ".join(f'"{word}"' for word in words[:-1])
    columns = "SELECT rowid, session_id, seq, role, text FROM messages WHERE "
    found = conn.execute(
        columns + ("messages MATCH ? AND " if head else "") + "rowid >= ? ORDER BY rowid DESC "
        "LIMIT ?", ((head,) if head else ()) + (oldest, most + 1)).fetchall()
    if len(found) > most:
        return None
    scratch = sqlite3.connect(":memory:")
    try:
        scratch.execute(f"CREATE VIRTUAL TABLE m USING fts5(text, {_TOKENIZE})")
        scratch.executemany("INSERT INTO m (rowid, text) VALUES (?, ?)",
                            [(row[0], row[4]) for row in found])
        keep = {rowid for (rowid,) in scratch.execute(
            "SELECT rowid FROM m WHERE m MATCH ? ORDER BY rowid DESC LIMIT ?", (full, limit))}
    finally:
        scratch.close()
    return [row for row in found if row[0] in keep]


class Freshness(Protocol):
    """How a sidecar index finds what changed in its store (docs/stores.md#search)."""

    def changes(self, conn: sqlite3.Connection) -> IndexChanges:
        """What the index open on ``conn`` lacks of the store. Raises ``sqlite3.Error``."""
        ...

    def settle(self, conn: sqlite3.Connection, unreadable: Sequence[str]) -> None:
        """Record what the applied changes were measured against (``unreadable``: left out)."""
        ...


class SqliteFreshness:
    """A SQLite store's changes: its ``sessions`` rows against the index, in one query.

    Args:
        store_db: The store's database file (attached to the index's connection, only read).
    """

    def __init__(self, store_db: Path) -> None:
        self._store_db = store_db

    def changes(self, conn: sqlite3.Connection) -> IndexChanges:
        """Sessions whose ``incarnation:revision`` is not the one indexed, and those gone."""
        return _sqlite_changes(conn, self._store_db)

    def settle(self, conn: sqlite3.Connection, unreadable: Sequence[str]) -> None:
        """Nothing to record: the store's rows are the state."""


def _sqlite_changes(conn: sqlite3.Connection, store_db: Path) -> IndexChanges:
    """:class:`IndexChanges` of a SQLite store, compared in SQL (the store attached, only read).

    The signature is ``incarnation:revision`` of the ``sessions`` row (as the index records it).
    The store log is neither counted nor compared.
    """
    def none_stored() -> IndexChanges:
        return IndexChanges(sessions=0, changed=(), gone=tuple(
            str(sid) for (sid,) in conn.execute("SELECT session_id FROM indexed")))

    if not store_db.exists():
        return none_stored()
    # mode=rw, not ro: when this is the file's last connection (a search that finds nothing
    # changed opens no other), DETACH checkpoints and removes the -wal and -shm it opened, as
    # every other reader's close does; a read-only one cannot and left them behind. Nothing
    # here writes, rw never creates the file, and a write-protected file still opens read-only.
    conn.execute("ATTACH DATABASE ? AS store", (f"{store_db.absolute().as_uri()}?mode=rw",))
    try:
        conn.execute("BEGIN")  # one snapshot of both files
        try:
            if conn.execute("SELECT 1 FROM store.sqlite_master WHERE type = 'table' AND "
                            "name = 'sessions'").fetchone() is None:
                return none_stored()  # a store file no writer has given its tables yet
            count, store_log = conn.execute(
                "SELECT count(*), EXISTS (SELECT 1 FROM store.sessions WHERE id = ?) FROM "
                "store.sessions WHERE id <> ?", (STORE_LOG_ID, STORE_LOG_ID)).fetchone()
            changed = tuple(
                (str(sid), str(sig), None if old is None else (str(old), int(events)))
                for sid, sig, old, events in conn.execute(
                    "SELECT s.id, s.incarnation || ':' || s.revision, i.signature, i.events "
                    "FROM store.sessions s LEFT JOIN indexed i ON i.session_id = s.id "
                    "WHERE i.signature IS NOT s.incarnation || ':' || s.revision AND s.id <> ? "
                    "ORDER BY s.id", (STORE_LOG_ID,)))
            gone = tuple(str(sid) for (sid,) in conn.execute(
                "SELECT session_id FROM indexed WHERE session_id NOT IN "
                "(SELECT id FROM store.sessions)"))
        finally:
            conn.execute("COMMIT")
    finally:
        conn.execute("DETACH DATABASE store")
    return IndexChanges(sessions=int(count), changed=changed, gone=gone, store_log=bool(store_log))


IndexProgress = Callable[[int, int, str], None]
"""``progress(done, total, session_id)``: before session ``session_id`` is (re)indexed, with
``done`` of the ``total`` sessions to index already done; never called when the index is current."""


@runtime_checkable
class KnowsRemovals(Protocol):
    """A backend that tells which logs may hold a removed message without reading them whole.

    Rule: docs/stores.md#search (what a search shows).
    """

    def removal_events(self, session_ids: Sequence[str]
                       ) -> dict[str, Sequence[Mapping[str, Any]] | None]:
        """The sessions among ``session_ids`` whose log may have taken a message off the view.

        A session left out holds no record :func:`~dsh.persistence.removed_messages` acts on
        (no quarantine record, no ``assistant/message`` or ``tool/result`` replace). For one
        named: the events the fold needs (every event with a surface op and every quarantine
        record, in seq order), or None when only the whole log tells.

        Raises:
            DshError: the store could not be asked (the caller reads every log).
        """
        ...


def removal_marks(persistence: Persistence, session_ids: Iterable[str]
                  ) -> tuple[dict[str, dict[int, str]], list[str]]:
    """Each session's appended messages that left the model view, reading only what tells.

    A backend that :class:`KnowsRemovals` is asked first: a session whose log holds no
    removal or quarantine record is not read (nothing of it left the view); for one that
    does, only the events the fold needs are read where the backend can pick them, else the
    whole log. Other backends read each log whole. The marks are those of
    :func:`~dsh.persistence.removed_messages` over the whole log.

    Returns:
        ``(removed, unreadable)``: session id → seq → ``"clear"`` or ``"quarantine"`` for each
        readable session; the ids whose log could not be read (in ``session_ids`` order).

    Rule: docs/stores.md#search.
    """
    ids = list(dict.fromkeys(session_ids))
    known: dict[str, Sequence[Mapping[str, Any]] | None] = dict.fromkeys(ids)
    backend = persistence.backend
    if ids and isinstance(backend, KnowsRemovals):
        try:
            known = backend.removal_events(ids)
        except DshError as error:  # every log read whole: each read names its own damage
            log.info("search: removal records not found by query (%s); reading the logs",
                     error.message)
    removed: dict[str, dict[int, str]] = {}
    unreadable: list[str] = []
    for sid in ids:
        if sid not in known:
            removed[sid] = {}
            continue
        events = known[sid]
        try:
            removed[sid] = removed_messages(
                events if events is not None else persistence.read(sid).stored_events)
        except DshError:
            unreadable.append(sid)
    return removed, unreadable


def _update(index: SearchIndex, persistence: Persistence, changes: IndexChanges,
            unreadable: list[str], progress: IndexProgress | None = None) -> int:
    """Bring ``index`` up to date with ``changes``; return how many sessions were read."""
    for sid in changes.gone:
        index.drop(sid)
    read = 0
    for done, (sid, sig, previous) in enumerate(changes.changed):
        if progress is not None:
            progress(done, len(changes.changed), sid)
        start = previous[1] if previous is not None and _grew(previous[0], sig) else 0
        try:
            with persistence.open(sid, "read") as handle:
                cold = handle.read(start)
        except DshError as error:
            log.info("search: session %r left out: %s", sid, error.message)
            unreadable.append(sid)
            continue
        read += 1
        index.put(sid, sig, start + len(cold.events), list(message_texts(cold.events)),
                  fresh=start == 0 and previous is not None)
    return read


def _scan(persistence: Persistence, words: list[str], limit: int
          ) -> tuple[list[SearchHit], int, list[str]]:
    """Search a store without an index: every log is read."""
    folded = [fold(word)[0] for word in words]
    hits: list[SearchHit] = []
    unreadable: list[str] = []
    headers = persistence.list_headers()
    for header in headers:
        sid = str(header["id"])
        try:
            with persistence.open(sid, "read") as handle:
                events = handle.read(0).events
        except DshError:
            unreadable.append(sid)
            continue
        for seq, role, text in message_texts(events):
            tokens = _WORD.findall(fold(text)[0])
            if all(any(t == w for t in tokens) for w in folded[:-1]) and any(
                    t.startswith(folded[-1]) for t in tokens):
                hits.append(snippet_of(sid, seq, role, text, words))
    hits.reverse()  # newest first, as the index answers
    return hits[:limit], len(headers), unreadable


def _readable_rows(index: SearchIndex, words: list[str], limit: int, unreadable: set[str]
                   ) -> list[tuple[str, int, str, str]]:
    """``index.query`` without the rows of the sessions named ``unreadable``.

    What the index holds of a session whose log cannot be read now was read before the log
    changed: no hit comes from it, so a session is either among the hits or among the
    unreadable, never both. The index is asked again for more when too few rows are left.
    Rule: docs/stores.md#search.
    """
    asked = limit
    while True:
        rows = index.query(words, asked)
        kept = [row for row in rows if row[0] not in unreadable]
        if not unreadable or len(kept) >= limit or len(rows) < asked:
            return kept[:limit]
        asked *= 4


def search(persistence: Persistence, query: str, *, limit: int = 20,
           rebuild: bool = False, progress: IndexProgress | None = None) -> SearchResults:
    """Find the messages of every session of the store that hold all the words of ``query``.

    Args:
        persistence: The store's facade.
        query: Words to find (Unicode word characters; punctuation separates words), matched
            case- and diacritics-insensitively; the last word also matches as a prefix. A query
            without a word finds nothing.
        limit: Hits returned at most (at least 1).
        rebuild: Drop the index and build it again from every log (after a log was rewritten
            in place, say).
        progress: Called as ``progress(done, total, session_id)`` before each session the
            index reads (a first search builds the whole index); not called when the index is
            current or the store has none.

    Returns:
        The hits, newest indexed first (:class:`SearchResults`).

    Raises:
        PersistenceError: the store itself cannot be listed.

    Rule: docs/stores.md#search.
    """
    words = search_words(query)
    limit = max(1, limit)
    backend = persistence.backend
    indexed = backend.capabilities.search_index
    if not words:
        return SearchResults(hits=(), sessions=0, reindexed=0, unreadable=(), indexed=indexed)
    if not indexed:
        hits, count, unreadable = _scan(persistence, words, limit)
        return SearchResults(hits=tuple(hits), sessions=count, reindexed=count,
                             unreadable=tuple(unreadable), indexed=False,
                             store_log=persistence.exists(STORE_LOG_ID))
    index = cast(IndexesSearch, backend).search_index()
    unreadable_ids: list[str] = []
    try:
        if rebuild:
            index.reset()
        changes = index.changes()
        read = _update(index, persistence, changes, unreadable_ids, progress)
        index.settle(unreadable_ids)
        rows = _readable_rows(index, words, limit, set(unreadable_ids))
    finally:
        index.close()
    found = tuple(snippet_of(sid, seq, role, text, words) for sid, seq, role, text in rows)
    return SearchResults(hits=found, sessions=changes.sessions, reindexed=read,
                         unreadable=tuple(unreadable_ids), indexed=True,
                         store_log=changes.store_log)

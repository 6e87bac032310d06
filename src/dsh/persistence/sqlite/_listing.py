"""The SQLite backend's session listing: ``dsh ls``'s entries and each session's last activity.

:meth:`SqliteBackend.list_entries` and :meth:`SqliteBackend.list_activity` load this module when
a store lists its sessions: a session's open, read and append never list, so an adapter's
process never loads its code (docs/adapters.md#memory).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from dsh._errors import DshError, PersistenceError
from dsh.json import FrozenDict
from dsh.persistence._listing import (
    HIDING_SQL,
    HIDING_TYPES,
    MAY_REMOVE_SQL,
    SOURCE_EVENT_TYPE,
    ListingEntry,
    ReadFn,
    is_untimed,
    prompt_of,
    read_entries,
    reply_model,
    request_model,
    shown_titles,
    source_format,
)
from dsh.persistence.sqlite._schema import (
    SESSION_ROW_CHECK_SQL,
    RowError,
    cwd_unchecked,
    decode_row,
    decode_session_row,
    session_header,
)

__all__ = ["list_activity", "list_entries", "removal_events"]


class _Listed(Protocol):
    """What the listing reads of a ``SqliteBackend``.

    Named here, not imported: the backend imports this module (tests/test_architecture.py).
    """

    path: Path

    def _shared(self) -> AbstractContextManager[Any]: ...

    def _metadata_of(self) -> Callable[[FrozenDict, str], FrozenDict]: ...


def _row_columns(version: int, prefix: str = "") -> str:
    """The events columns :func:`decode_row` takes, each after ``prefix`` (a table alias)."""
    return (f"{prefix}rowid, {prefix}seq, {prefix}type, {prefix}time, {prefix}data, "
            f"{prefix}source_event_seqs, {prefix}surface_op, "
            + ("NULL" if version == 14 else f"{prefix}ignorable"))


def _fold_rows_sql(version: int, *also: str) -> str:
    """One session's rows the fold of what left its model view reads, in seq order.

    Every row with a surface op and every quarantine record (:data:`HIDING_TYPES`): the
    events :func:`~dsh.persistence.removed_messages` acts on, plus the rows of the types
    ``also`` names (the listing's titles). The session id is the one parameter.
    """
    types = ", ".join(f"'{kind}'" for kind in (*also, *HIDING_TYPES))
    return (f"SELECT {_row_columns(version)} FROM events WHERE session_id = ? AND "
            f"(surface_op IS NOT NULL OR type IN ({types})) ORDER BY seq")


def list_entries(backend: _Listed, read: ReadFn
                 ) -> tuple[list[ListingEntry], list[DshError]]:
    """:meth:`SqliteBackend.list_entries` of ``backend`` (the rule and the errors are there)."""
    with backend._shared() as c:
        conn = c.conn
        version = c.schema_version
        conn.execute("BEGIN")
        try:
            sessions = conn.execute(
                "SELECT id, version, created_at, cwd, parent_session, seed_length, origin, "
                "delegation_depth, agent_preset, incarnation, revision FROM sessions "
                "ORDER BY rowid").fetchall()
            last_rows = conn.execute(
                f"SELECT e.session_id, {_row_columns(version, 'e.')} FROM events AS e JOIN "
                "(SELECT session_id, max(seq) AS last FROM events GROUP BY session_id) AS t "
                "ON e.session_id = t.session_id AND e.seq = t.last").fetchall()
            # one pass over the rows: turns, and the bytes of the event data
            turns, sizes = {}, {}
            for sid, count, size in conn.execute(
                    "SELECT session_id, sum(type = 'turn/start'), "
                    "sum(length(CAST(data AS BLOB))) FROM events GROUP BY session_id"):
                turns[sid], sizes[sid] = count, size
            special = conn.execute(
                f"SELECT session_id, {_row_columns(version)} FROM events WHERE type IN "
                f"('session/title', '{SOURCE_EVENT_TYPE}', 'request/header', 'request/context')"
                " OR (type = 'user/message' AND surface_op = '\"append\"') "
                f"OR type IN ({HIDING_SQL}) OR (type = "
                "'assistant/message' AND surface_op IS NOT NULL AND surface_op != '\"append\"') "
                "ORDER BY session_id, seq").fetchall()
            # a session where a message may have left the model view (a removal, a
            # quarantine) is titled from its messages (shown_titles, docs/forgetting.md)
            hidden = {sid for sid, *row in special
                      if row[2] in HIDING_TYPES or row[2] == "assistant/message"}
            shown = _fold_rows_sql(version, "session/title")
            shown_rows = {sid: conn.execute(shown, (sid,)).fetchall() for sid in hidden}
            # the first row (seq 0) and the first assistant message of each session
            # (index probes, not a scan)
            firsts = conn.execute(
                f"SELECT e.session_id, {_row_columns(version, 'e.')} FROM sessions AS s JOIN "
                "events AS e ON e.session_id = s.id AND e.seq = 0").fetchall()
            answers = conn.execute(
                f"SELECT session_id, {_row_columns(version)} FROM events WHERE rowid IN ("
                "SELECT (SELECT rowid FROM events WHERE session_id = s.id AND type = "
                "'assistant/message' ORDER BY seq LIMIT 1) FROM sessions AS s)").fetchall()
            replies, bad_replies = _reply_models(conn, answers, _row_columns(version),
                                                 version)
        finally:
            conn.execute("COMMIT")
    path = str(backend.path)
    last: dict[str, Any] = {}
    titles: dict[str, str] = {}
    prompts: dict[str, str] = {}
    sources: dict[str, str] = {}
    untimed_at: dict[str, int] = {}
    models: dict[str, str] = {}
    first_times: dict[str, int] = {}
    damaged: set[str] = set()
    for sid, *row in firsts:
        if sid not in first_times:
            try:
                first_times[sid] = int(decode_row(tuple(row), version)[0]["time"])
            except RowError:
                damaged.add(sid)
    for sid, *row in last_rows:
        try:
            last[sid] = decode_row(tuple(row), version)[-1]
        except RowError:
            damaged.add(sid)
    for sid, rows in shown_rows.items():
        try:
            events = [e for row in rows for e in decode_row(tuple(row), version)]
        except RowError:
            damaged.add(sid)
            continue
        title, prompt = shown_titles(events)
        if title is not None:
            titles[sid] = title
        if prompt is not None:
            prompts[sid] = prompt
    for sid, *row in special:
        kind = row[2]
        if sid in damaged or (kind == "user/message" and sid in prompts) or (
                kind == SOURCE_EVENT_TYPE and sid in sources) or kind in HIDING_TYPES \
                or kind == "assistant/message" or (sid in hidden and (
                    kind == "user/message" or kind == "session/title")):
            continue
        try:
            event = decode_row(tuple(row), version)[0]
        except RowError:
            damaged.add(sid)
            continue
        if kind == "request/header" or kind == "request/context":
            model = request_model(event)
            if model is not None:
                models[sid] = model
        elif kind == "session/title":
            data = event["data"]
            if isinstance(data, Mapping) and isinstance(data.get("title"), str):
                titles[sid] = data["title"]
        elif kind == SOURCE_EVENT_TYPE:
            sources[sid] = source_format(event)
            if is_untimed(event):
                untimed_at[sid] = int(event["time"])
        else:
            prompt = prompt_of(event)
            if prompt is not None:
                prompts[sid] = prompt
    out: list[ListingEntry] = []
    add = backend._metadata_of()
    for row in sessions:
        header, incarnation, _ = decode_session_row(row, path=path)
        header = add(header, incarnation)
        sid = str(header["id"])
        final = last.get(sid)
        if sid in damaged or final is None:
            continue
        last_time = int(final["time"])
        out.append(ListingEntry(sid, header, int(final["seq"]) + 1, last_time,
                                turns.get(sid, 0), titles.get(sid), prompts.get(sid),
                                sources.get(sid, "dsh"), untimed_at.get(sid) != last_time,
                                first_times.get(sid), models.get(sid) or replies.get(sid),
                                sizes.get(sid)))
    more, errors = read_entries(sorted(damaged | bad_replies), read)
    return out + more, errors


def list_activity(backend: _Listed, read: ReadFn
                  ) -> tuple[list[tuple[FrozenDict, int]], list[DshError]]:
    """:meth:`SqliteBackend.list_activity` of ``backend`` (the rule is there)."""
    path = str(backend.path)
    with backend._shared() as c:
        conn = c.conn
        version = c.schema_version
        columns = _row_columns(version)
        session_columns = ("s.id, s.version, s.created_at, s.cwd, s.parent_session, "
                           "s.seed_length, s.origin, s.delegation_depth, s.agent_preset, "
                           "s.incarnation, s.revision")
        conn.execute("BEGIN")
        try:
            refused = conn.execute(
                f"SELECT {session_columns} FROM sessions AS s "
                f"WHERE ({SESSION_ROW_CHECK_SQL}) IS NOT 1 ORDER BY s.rowid").fetchall()
            rows = conn.execute(
                f"SELECT {session_columns}, e.seq, e.time, "
                + ("NULL" if version == 14 else "e.ignorable") +
                " FROM sessions AS s LEFT JOIN events AS e ON e.session_id = s.id AND "
                "e.seq = (SELECT max(seq) FROM events WHERE session_id = s.id) "
                "ORDER BY s.rowid").fetchall()
            packed = {row[0]: conn.execute(  # a packed row (ignorable 0): decode it
                f"SELECT {columns} FROM events WHERE session_id = ? AND seq = ?",
                (row[0], row[11])).fetchone()
                for row in rows if row[11] is not None
                and (row[13] == 0 or type(row[12]) is not int)}
        finally:
            conn.execute("COMMIT")
    checked = {str(row[0]): decode_session_row(row, path=path)[:2] for row in refused}
    add = backend._metadata_of()
    out: list[tuple[FrozenDict, int]] = []
    damaged: list[str] = []
    for row in rows:
        sid = row[0]
        if sid in checked:
            header, incarnation = checked[sid]
        elif cwd_unchecked(row[3]):
            header, incarnation, _ = decode_session_row(row[:11], path=path)
        else:
            header, incarnation = session_header(row), row[9]
        if row[11] is None:
            continue  # no events: not listed
        full = packed.get(sid)
        if full is None:
            out.append((add(header, incarnation), row[12]))
            continue
        try:
            out.append((add(header, incarnation),
                        int(decode_row(tuple(full), version)[-1]["time"])))
        except RowError:
            damaged.append(str(sid))
    more, errors = read_entries(sorted(damaged), read)
    return out + [(e.header, e.last_activity_ms) for e in more], errors


def _reply_models(conn: Any, firsts: Sequence[Any], columns: str, version: int
                  ) -> tuple[dict[str, str], set[str]]:
    """The model of each session's first assistant message that names one, and damaged ids.

    ``firsts`` holds each session's first assistant row; a session whose first one names no
    model has its later assistant rows read, in seq order, until one does.
    """
    models: dict[str, str] = {}
    damaged: set[str] = set()
    for sid, *row in firsts:
        if row[2] != "assistant/message":
            continue
        try:
            model = reply_model(decode_row(tuple(row), version)[0])
            if model is None:  # rare: the later ones, until one names a model
                for later in conn.execute(f"SELECT {columns} FROM events WHERE session_id = ? "
                                          "AND type = 'assistant/message' AND seq > ? "
                                          "ORDER BY seq", (sid, row[1])):
                    model = reply_model(decode_row(tuple(later), version)[0])
                    if model is not None:
                        break
        except RowError:
            damaged.add(sid)
            continue
        if model is not None:
            models[sid] = model
    return models, damaged


_IDS_PER_QUERY = 500
"""Session ids bound in one ``IN (...)`` (SQLite allows 32766 variables)."""


def removal_events(backend: _Listed, session_ids: Sequence[str]
                   ) -> dict[str, Sequence[Mapping[str, Any]] | None]:
    """:meth:`SqliteBackend.removal_events` of ``backend`` (the rule is there)."""
    with backend._shared() as c:
        conn = c.conn
        version = c.schema_version
        conn.execute("BEGIN")
        try:
            holding: list[str] = []
            for at in range(0, len(session_ids), _IDS_PER_QUERY):
                chunk = session_ids[at:at + _IDS_PER_QUERY]
                holding += [str(row[0]) for row in conn.execute(
                    "SELECT DISTINCT session_id FROM events WHERE session_id IN "
                    f"({', '.join('?' * len(chunk))}) AND {MAY_REMOVE_SQL}", chunk)]
            fold = _fold_rows_sql(version)
            rows = {sid: conn.execute(fold, (sid,)).fetchall() for sid in holding}
        except sqlite3.Error as exc:
            raise PersistenceError(f"finding the removal records of {len(session_ids)} "
                                   f"session(s) in {backend.path} failed: {exc}",
                                   path=str(backend.path)) from exc
        finally:
            conn.execute("COMMIT")
    found: dict[str, Sequence[Mapping[str, Any]] | None] = {}
    for sid, picked in rows.items():
        try:
            found[sid] = [e for row in picked for e in decode_row(tuple(row), version)]
        except RowError:  # a row that does not decode: the whole read names the damage
            found[sid] = None
    return found

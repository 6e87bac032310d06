"""The store search index of a PostgreSQL store: full-text search in two tables of its schema.

``search_indexed (session_id, signature, events)`` says what is indexed of each session, and
``search_messages (session_id, seq, role, text, folded, tsv, n)`` holds one row per appended
message, ``tsv`` the ``simple`` text-search vector of ``folded`` (the text case- and
diacritics-folded by dsh, as the SQLite index folds it) under a GIN index, ``n`` the order rows
were indexed in (newest first is the order of hits). The tables are
created on the first search (``CREATE ... IF NOT EXISTS``), not by a migration: they are only
derived, and dropping them loses nothing. The signature of a session is its row's
``incarnation:revision``. ``search_state (changes, sessions)`` records the store's change count
(the sum of ``store_changes``, migration 11) and session count the index was last brought up to
date with: while the count is unchanged a search reads no ``sessions`` row.

Rule: docs/stores.md#search; the tables: docs/formats.md#search-index.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from dsh.persistence._contract import STORE_LOG_ID
from dsh.persistence._search import IndexChanges
from dsh.persistence.postgres._schema import quote_schema

RECENT_ROWS: Final = 5000
"""Newest index rows a query scans before it asks the GIN index (see ``query``)."""

INDEX_MARK: Final = "dsh search index 3"
"""The comment on ``search_messages`` naming what its rows hold (2: terminal escape sequences
indexed as spaces; 3: but for an OSC's payload, a title's words, indexed as text); tables
without it are emptied and indexed again (docs/formats.md#search-index)."""


class PostgresSearchIndex:
    """The search index of one PostgreSQL store, over one connection of its own.

    Args:
        conninfo: The store's connection string.
        schema: The store's schema.
        fold: The folding the words and texts go through (``dsh.persistence._search``'s).
        label: The store URL (password redacted), named in what :meth:`forget` removed.
    """

    def __init__(self, conninfo: str, schema: str, fold: Any, *, label: str) -> None:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        self._fold = fold
        self._label = label
        self._schema = schema
        self._s = quote_schema(schema)
        # a query's estimated cost (a prefix tsquery's fixed guess) would start the JIT:
        # 4-35 ms of compiling for a query that runs in 1-20 ms
        options = conninfo_to_dict(conninfo).get("options")
        self._conn = psycopg.connect(conninfo, autocommit=True,
                                     options=f"{options} -c jit=off" if options else "-c jit=off")
        self._ready = False
        # what :meth:`changes` compared against: the store's change count (None: the store
        # has no counters, or the index was found current), its sessions, and the signature
        # each changed session had in the index (a put or drop that finds another there lost
        # a race with another search: then nothing is recorded)
        self._seen: tuple[int, int] | None = None
        self._expected: dict[str, str | None] = {}
        self._raced = False

    def _create(self) -> None:
        """Create the index tables when missing (the first search, or one of an older dsh)."""
        s = self._s
        with self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                               (f"dsh-search:{self._schema}",))
            self._conn.execute(f"CREATE TABLE IF NOT EXISTS {s}.search_indexed (session_id text "
                               "PRIMARY KEY, signature text NOT NULL, events bigint NOT NULL)")
            self._conn.execute(
                f"CREATE TABLE IF NOT EXISTS {s}.search_messages (session_id text NOT NULL, "
                "seq bigint NOT NULL, role text NOT NULL, text text NOT NULL, folded text NOT "
                "NULL, tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple', folded)) STORED, "
                "PRIMARY KEY (session_id, seq))")
            self._conn.execute(f"CREATE INDEX IF NOT EXISTS search_messages_tsv ON "
                               f"{s}.search_messages USING gin (tsv)")
            # the order hits come in (newest indexed first): a common word's query walks this
            # index backwards and stops at the limit; a rare one's takes the GIN matches
            self._conn.execute(f"ALTER TABLE {s}.search_messages ADD COLUMN IF NOT EXISTS "
                               "n bigint GENERATED ALWAYS AS IDENTITY")
            self._conn.execute(f"CREATE INDEX IF NOT EXISTS search_messages_n ON "
                               f"{s}.search_messages (n)")
            self._conn.execute(f"COMMENT ON TABLE {s}.search_messages IS '{INDEX_MARK}'")
            # created last: its presence says the tables above are all there
            self._conn.execute(f"CREATE TABLE IF NOT EXISTS {s}.search_state (singleton "
                               "integer PRIMARY KEY CHECK (singleton = 1), changes bigint NOT "
                               "NULL, sessions bigint NOT NULL)")
        self._ready = True

    def _empty_older(self) -> None:
        """Empty the tables an older dsh filled (no :data:`INDEX_MARK`): all is indexed again."""
        s = self._s
        with self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                               (f"dsh-search:{self._schema}",))
            mark = self._one("SELECT obj_description(to_regclass(%s), 'pg_class')",
                             (f"{s}.search_messages",))[0]
            if mark != INDEX_MARK:  # another search may have done it while this one waited
                self._conn.execute(f"TRUNCATE {s}.search_messages, {s}.search_indexed")
                self._conn.execute(f"DELETE FROM {s}.search_state")
                self._conn.execute(f"COMMENT ON TABLE {s}.search_messages IS '{INDEX_MARK}'")

    @property
    def path(self) -> None:
        """None: the index lives in the store's own tables."""
        return None

    def forget(self, session_id: str) -> list[str]:
        """Delete the session's rows (the next search indexes it again)."""
        if not self._ready:
            self._create()
        with self._conn.transaction():
            self._delete_session(session_id)
            self._conn.execute(f"DELETE FROM {self._s}.search_state")
        return [f"{self._label} search rows"]

    def changes(self) -> IndexChanges:
        """Sessions whose ``incarnation:revision`` is not the one indexed, compared on the server.

        One snapshot (a repeatable-read transaction); no row per unchanged session comes back.
        When the store's change count (``store_changes``, migration 11) is the one recorded when
        the index was last brought up to date, nothing changed: the sessions table is not read
        (docs/stores.md#search). The store log is neither counted nor compared.
        """
        s = self._s
        self._seen, self._expected, self._raced = None, {}, False
        found = self._one("SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL, "
                          "obj_description(to_regclass(%s), 'pg_class')",
                          (f"{s}.search_state", f"{s}.store_changes", f"{s}.search_messages"))
        if not found[0]:
            self._create()
        elif found[2] != INDEX_MARK:
            self._empty_older()
        self._ready = True
        counted = bool(found[1])  # False: a store before migration 11, compared every time
        with self._conn.transaction():
            self._conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            total: int | None = None
            if counted:
                state = self._one(
                    f"SELECT (SELECT sum(n) FROM {s}.store_changes), (SELECT changes FROM "
                    f"{s}.search_state), (SELECT sessions FROM {s}.search_state), EXISTS "
                    f"(SELECT 1 FROM {s}.sessions WHERE id = %s)", (STORE_LOG_ID,))
                total = int(state[0])
                if state[1] is not None and int(state[1]) == total:
                    return IndexChanges(sessions=int(state[2]), changed=(), gone=(),
                                        store_log=bool(state[3]))
            return self._compare(total)

    def _one(self, sql: str, params: Sequence[Any]) -> tuple[Any, ...]:
        """The one row of a statement that always returns one (aggregates, scalar selects)."""
        return self._conn.execute(sql, params).fetchall()[0]

    def _compare(self, total: int | None) -> IndexChanges:
        s = self._s
        sig = "s.incarnation::text || ':' || s.revision::text"
        row = self._one(f"SELECT count(*), EXISTS (SELECT 1 FROM {s}.sessions WHERE id = %s) "
                        f"FROM {s}.sessions WHERE id <> %s", (STORE_LOG_ID, STORE_LOG_ID))
        changed = tuple(
            (str(sid), str(new), None if old is None else (str(old), int(events)))
            for sid, new, old, events in self._conn.execute(
                f"SELECT s.id, {sig}, i.signature, i.events FROM {s}.sessions s LEFT JOIN "
                f"{s}.search_indexed i ON i.session_id = s.id WHERE i.signature IS "
                f"DISTINCT FROM {sig} AND s.id <> %s ORDER BY s.id", (STORE_LOG_ID,)))
        gone = {str(sid): str(old) for sid, old in self._conn.execute(
            f"SELECT i.session_id, i.signature FROM {s}.search_indexed i WHERE NOT EXISTS "
            f"(SELECT 1 FROM {s}.sessions s WHERE s.id = i.session_id)")}
        sessions = int(row[0])
        self._seen = None if total is None else (total, sessions)
        self._expected = {sid: None if old is None else old[0] for sid, _, old in changed}
        self._expected.update(gone)
        return IndexChanges(sessions=sessions, changed=changed, gone=tuple(gone),
                            store_log=bool(row[1]))

    def settle(self, unreadable: Sequence[str]) -> None:
        """Record the change count compared against, when every change was applied.

        Not when a session was left out (``unreadable``: the next search tries it again) or a
        concurrent search changed a session's rows first (its changes may be older than ours).
        """
        if self._seen is None or unreadable or self._raced:
            return
        changes, sessions = self._seen
        self._conn.execute(
            f"INSERT INTO {self._s}.search_state (singleton, changes, sessions) VALUES (1, %s, "
            "%s) ON CONFLICT (singleton) DO UPDATE SET changes = excluded.changes, sessions = "
            "excluded.sessions", (changes, sessions))

    def _claim(self, session_id: str) -> bool:
        """Lock the session's index row; False (a race lost) when it is not what was compared."""
        row = self._conn.execute(f"SELECT signature FROM {self._s}.search_indexed WHERE "
                                 "session_id = %s FOR UPDATE", (session_id,)).fetchone()
        if session_id in self._expected and (None if row is None else str(row[0])) != \
                self._expected[session_id]:
            self._raced = True
            return False
        return True

    def _delete_session(self, session_id: str) -> None:
        self._conn.execute(f"DELETE FROM {self._s}.search_messages WHERE session_id = %s",
                           (session_id,))
        self._conn.execute(f"DELETE FROM {self._s}.search_indexed WHERE session_id = %s",
                           (session_id,))

    def drop(self, session_id: str) -> None:
        """Forget a session that is no longer stored."""
        with self._conn.transaction():
            if self._claim(session_id):
                self._delete_session(session_id)

    def put(self, session_id: str, sig: str, events: int,
            rows: list[tuple[int, str, str]], *, fresh: bool) -> None:
        """Add ``(seq, role, text)`` rows (after dropping the session's rows when ``fresh``).

        Nothing is written when the session's index row is no longer the one compared (another
        search indexed it meanwhile).
        """
        s = self._s
        with self._conn.transaction():
            if not self._claim(session_id):
                return
            if fresh:
                self._conn.execute(f"DELETE FROM {s}.search_messages WHERE session_id = %s",
                                   (session_id,))
            with self._conn.cursor() as cursor:
                cursor.executemany(
                    f"INSERT INTO {s}.search_messages (session_id, seq, role, text, folded) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (session_id, seq) DO UPDATE SET "
                    "role = excluded.role, text = excluded.text, folded = excluded.folded",
                    [(session_id, seq, role, text.replace("\x00", "\ufffd"),
                      self._fold(text)[0].replace("\x00", " "))
                     for seq, role, text in rows])
            self._conn.execute(
                f"INSERT INTO {s}.search_indexed (session_id, signature, events) VALUES "
                "(%s, %s, %s) ON CONFLICT (session_id) DO UPDATE SET signature = "
                "excluded.signature, events = excluded.events", (session_id, sig, events))

    def query(self, words: list[str], limit: int) -> list[tuple[str, int, str, str]]:
        """``(session id, seq, role, text)`` of the newest indexed messages holding ``words``.

        Two plans, chosen by what the newest rows hold rather than by the planner's estimate
        (a prefix query's is a fixed guess): the newest :data:`RECENT_ROWS` rows are scanned
        backwards on ``n`` first; only when they hold fewer than ``limit`` matches (a rare word)
        are the matches taken from the GIN index and the newest kept.
        """
        terms = [f"'{self._fold(word)[0]}'" for word in words]
        terms[-1] += ":*"
        tsquery = " & ".join(terms)
        s = self._s
        rows = self._conn.execute(
            f"WITH q AS (SELECT to_tsquery('simple', %(q)s) AS q), recent AS MATERIALIZED ("
            f"SELECT session_id, seq, role, text, n FROM (SELECT * FROM {s}.search_messages "
            f"ORDER BY n DESC LIMIT {RECENT_ROWS}) r, q WHERE tsv @@ q.q ORDER BY n DESC "
            "LIMIT %(limit)s) "
            "SELECT session_id, seq, role, text FROM ("
            "SELECT * FROM recent WHERE (SELECT count(*) FROM recent) >= %(limit)s "
            # n + 0: a sort of the GIN matches, never a backwards walk of every row
            f"UNION ALL (SELECT m.session_id, m.seq, m.role, m.text, m.n FROM "
            f"{s}.search_messages m, q WHERE m.tsv @@ q.q AND "
            "(SELECT count(*) FROM recent) < %(limit)s ORDER BY m.n + 0 DESC LIMIT %(limit)s)"
            ") hits ORDER BY n DESC", {"q": tsquery, "limit": limit}).fetchall()
        return [(str(a), int(b), str(c), str(d)) for a, b, c, d in rows]

    def reset(self) -> None:
        """Drop everything indexed (the next update indexes every session again)."""
        if not self._ready:
            self._create()
        with self._conn.transaction():
            self._conn.execute(f"DELETE FROM {self._s}.search_state")
            self._conn.execute(f"DELETE FROM {self._s}.search_messages")
            self._conn.execute(f"DELETE FROM {self._s}.search_indexed")

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

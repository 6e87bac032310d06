"""The store search index of a PostgreSQL store: full-text search in two tables of its schema.

``search_indexed (session_id, signature, events)`` says what is indexed of each session, and
``search_messages (session_id, seq, role, text, folded, tsv, n)`` holds one row per appended
message, ``tsv`` the ``simple`` text-search vector of ``folded`` (the text case- and
diacritics-folded by dsh, as the SQLite index folds it) under a GIN index, ``n`` the order rows
were indexed in (newest first is the order of hits). The tables are
created on the first search (``CREATE ... IF NOT EXISTS``), not by a migration: they are only
derived, and dropping them loses nothing. The signature of a session is its row's
``incarnation:revision``.

Rule: docs/stores.md#search; the tables: docs/formats.md#search-index.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from dsh.persistence._search import IndexChanges
from dsh.persistence.postgres._schema import quote_schema

RECENT_ROWS: Final = 5000
"""Newest index rows a query scans before it asks the GIN index (see ``query``)."""


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

        self._fold = fold
        self._label = label
        self._s = s = quote_schema(schema)
        self._conn = psycopg.connect(conninfo, autocommit=True)
        with self._conn.transaction():
            # a query's estimated cost (a prefix tsquery's fixed guess) would start the JIT:
            # 4-35 ms of compiling for a query that runs in 1-20 ms
            self._conn.execute("SET jit = off")
            self._conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                               (f"dsh-search:{schema}",))
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

    @property
    def path(self) -> None:
        """None: the index lives in the store's own tables."""
        return None

    def forget(self, session_id: str) -> list[str]:
        """Delete the session's rows (the next search indexes it again)."""
        self.drop(session_id)
        return [f"{self._label} search rows"]

    def changes(self) -> IndexChanges:
        """Sessions whose ``incarnation:revision`` is not the one indexed, compared on the server.

        One snapshot (a repeatable-read transaction); no row per unchanged session comes back.
        """
        s = self._s
        sig = "s.incarnation::text || ':' || s.revision::text"
        with self._conn.transaction():
            self._conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            row = self._conn.execute(f"SELECT count(*) FROM {s}.sessions").fetchone()
            changed = tuple(
                (str(sid), str(new), None if old is None else (str(old), int(events)))
                for sid, new, old, events in self._conn.execute(
                    f"SELECT s.id, {sig}, i.signature, i.events FROM {s}.sessions s LEFT JOIN "
                    f"{s}.search_indexed i ON i.session_id = s.id WHERE i.signature IS "
                    f"DISTINCT FROM {sig} ORDER BY s.id"))
            gone = tuple(str(sid) for (sid,) in self._conn.execute(
                f"SELECT i.session_id FROM {s}.search_indexed i WHERE NOT EXISTS "
                f"(SELECT 1 FROM {s}.sessions s WHERE s.id = i.session_id)"))
        return IndexChanges(sessions=int(row[0]) if row else 0, changed=changed, gone=gone)

    def settle(self, unreadable: Sequence[str]) -> None:
        """Nothing to record: the store's rows are the state."""

    def drop(self, session_id: str) -> None:
        """Forget a session that is no longer stored."""
        with self._conn.transaction():
            self._conn.execute(f"DELETE FROM {self._s}.search_messages WHERE session_id = %s",
                               (session_id,))
            self._conn.execute(f"DELETE FROM {self._s}.search_indexed WHERE session_id = %s",
                               (session_id,))

    def put(self, session_id: str, sig: str, events: int,
            rows: list[tuple[int, str, str]], *, fresh: bool) -> None:
        """Add ``(seq, role, text)`` rows (after dropping the session's rows when ``fresh``)."""
        s = self._s
        with self._conn.transaction():
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
        with self._conn.transaction():
            self._conn.execute(f"DELETE FROM {self._s}.search_messages")
            self._conn.execute(f"DELETE FROM {self._s}.search_indexed")

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

"""dsh's PostgreSQL layout, without I/O: the forward-only migrations and the statement texts.

Invariants this module owns (docs/rules.md#one-writer-per-session):

* every table lives in one schema the store URL names (``?schema=``, default ``dsh``); nothing is
  created outside it;
* ``dsh_migrations`` lists every migration applied, once, in order; a database whose highest
  version is above :data:`SCHEMA_VERSION` was written by a newer dsh and is refused, never
  downgraded;
* ``sessions.head_seq`` is the commit marker: the events of a session are exactly the rows with
  ``seq < head_seq`` (chunk rows packed as in SQLite schema 17); a row at or after it was never
  committed by a dsh append and is the PostgreSQL form of a torn tail;
* the lease columns (owner, epoch, expiry on the database clock) are the only writer exclusion:
  no session-level advisory lock is ever taken (they vanish on reconnect and break behind
  PgBouncer). The one advisory lock, transaction-scoped, serialises migrations;
* ``lease_node`` names where the holder's ``lease_pid`` means something (boot id and pid
  namespace): only a writer on that same node may judge the holder dead by its pid;
* ``listing`` (the ``dsh ls`` entry of the committed events, or NULL when its writer could not
  know it) and ``size_bytes`` (the bytes of the committed rows' data) change only in the
  transaction that moves ``head_seq``, so they always describe exactly the committed log;
* ``restore_point_digest`` (the hex SHA-256 of the body of the session's ``restore_points``
  row) changes only in the statement that writes that row, fenced by the lease: a restore
  point whose body digests otherwise was edited after it was written and is not trusted;
* ``chain`` holds one hash-chain record per committed batch (docs/formats.md#the-seal-chain),
  inserted by the statement that moves ``head_seq``, linked there to the session's last record
  (``batch`` the row's ``chain_batches``, ``prev`` the row's ``chain_head``), so it commits or
  not with the batch; the same statement moves ``chain_batches`` and ``chain_head`` (migration
  9), so a record removed or changed afterwards no longer matches the row's head;
* ``events`` and ``chain`` carry no foreign key (migration 10): every statement that inserts
  into them holds the session row locked (``FOR NO KEY UPDATE``, which a ``DELETE`` of the row
  waits for), so a row can only be inserted for a session row that exists; deleting a session
  row deletes its events and chain records in the same transaction (trigger
  ``dsh_session_deleted``), as the former ``ON DELETE CASCADE`` did;
* every committed transaction that inserts or deletes a ``sessions`` row, or sets its ``id``,
  ``incarnation`` or ``revision``, adds at least one to ``store_changes`` (migration 11: a
  deferred trigger, so at commit, in the same transaction): the sum of its counters is the
  same in two snapshots only when no such change committed between them;
* ``asides`` (migration 12; before it, made by the first aside write) holds derived data
  only: every reader checks a row against the log, and deleting one loses nothing.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "ASIDES_TABLE",
    "MIGRATIONS",
    "MIGRATION_LOCK_KEY",
    "SCHEMA_VERSION",
    "Migration",
    "quote_schema",
    "valid_schema_name",
]

Migration = tuple[int, str, tuple[str, ...]]
"""``(version, name, statements)``; ``{s}`` in a statement is the quoted schema name."""

ASIDES_TABLE: Final = ("CREATE TABLE IF NOT EXISTS {s}.asides (session_id text NOT NULL, "
                       "name text NOT NULL, data bytea NOT NULL, PRIMARY KEY (session_id, name))")
"""Table ``asides``: derived blobs beside a session's log (docs/stores.md#asides); made by
migration 12, and by the first aside write of a schema an earlier build migrated."""

MIGRATIONS: Final[tuple[Migration, ...]] = (
    (1, "store: sessions, events (SQLite schema 17 rows), store identity", (
        """CREATE TABLE {s}.store_state (
  singleton integer PRIMARY KEY CHECK (singleton = 1),
  store_id  uuid NOT NULL
)""",
        "INSERT INTO {s}.store_state (singleton, store_id) VALUES (1, gen_random_uuid())",
        """CREATE TABLE {s}.sessions (
  id               text PRIMARY KEY CHECK (id <> ''),
  ord              bigserial NOT NULL,
  version          bigint NOT NULL,
  created_at       bigint NOT NULL,
  cwd              text,
  parent_session   text,
  seed_length      bigint,
  origin           text,
  delegation_depth bigint,
  agent_preset     text,
  incarnation      uuid NOT NULL,
  revision         bigint NOT NULL DEFAULT 0,
  head_seq         bigint NOT NULL DEFAULT 0 CHECK (head_seq >= 0)
)""",
        """CREATE TABLE {s}.events (
  session_id        text NOT NULL REFERENCES {s}.sessions(id) ON DELETE CASCADE,
  seq               bigint NOT NULL CHECK (seq >= 0),
  type              text NOT NULL,
  time              bigint NOT NULL,
  data              text,
  data_zstd         bytea,
  source_event_seqs bytea,
  surface_op        text,
  ignorable         smallint CHECK (ignorable IS NULL OR ignorable IN (0, 1)),
  CHECK ((data IS NULL) <> (data_zstd IS NULL)),
  PRIMARY KEY (session_id, seq)
)""",
    )),
    (2, "leases: one fenced writer per session across hosts", (
        """ALTER TABLE {s}.sessions
  ADD COLUMN lease_owner      uuid,
  ADD COLUMN lease_epoch      bigint NOT NULL DEFAULT 0,
  ADD COLUMN lease_expires_at timestamptz,
  ADD COLUMN lease_pid        integer,
  ADD COLUMN lease_host       text,
  ADD COLUMN lease_since      bigint""",
    )),
    (3, "lease node: the boot and pid namespace of the holder, for dead-holder takeover", (
        "ALTER TABLE {s}.sessions ADD COLUMN lease_node text",
    )),
    (4, "restore points: one a session, so a resume reads only the tail (any host)", (
        """CREATE TABLE {s}.restore_points (
  session_id text PRIMARY KEY REFERENCES {s}.sessions(id) ON DELETE CASCADE,
  data       bytea NOT NULL
)""",
    )),
    (5, "header metadata: the header's metadata object as JSON text (formats.md)", (
        "ALTER TABLE {s}.sessions ADD COLUMN metadata text",
    )),
    (6, "listing: the dsh ls entry and the log's bytes, kept by every append", (
        """ALTER TABLE {s}.sessions
  ADD COLUMN listing    text,
  ADD COLUMN size_bytes bigint NOT NULL DEFAULT 0""",
        """UPDATE {s}.sessions t SET size_bytes = coalesce((SELECT sum(coalesce(
  octet_length(e.data), octet_length(e.data_zstd))) FROM {s}.events e
  WHERE e.session_id = t.id AND e.seq < t.head_seq), 0)""",
    )),
    (7, "restore point digest: binds the restore point row to its writer (formats.md)", (
        "ALTER TABLE {s}.sessions ADD COLUMN restore_point_digest text",
    )),
    (8, "chain: one hash-chain record per committed batch, linked in the append (formats.md)", (
        """CREATE TABLE {s}.chain (
  session_id text NOT NULL REFERENCES {s}.sessions(id) ON DELETE CASCADE,
  batch      bigint NOT NULL CHECK (batch >= 0),
  first_seq  bigint NOT NULL,
  end_seq    bigint NOT NULL,
  hashed     bytea NOT NULL,
  keys       bytea NOT NULL,
  hash       bytea NOT NULL,
  PRIMARY KEY (session_id, batch)
)""",
    )),
    (9, "chain head: batch count and last hash on the session row, moved by the append "
        "(formats.md)", (
        "ALTER TABLE {s}.sessions ADD COLUMN chain_batches bigint NOT NULL DEFAULT 0, "
        "ADD COLUMN chain_head bytea NOT NULL DEFAULT '\\x" + "00" * 32 + "'::bytea",
        # the head of a chain written under migration 8: its record count and the last
        # record's hash recomputed from its hashed part (the stored one is not trusted)
        "UPDATE {s}.sessions t SET chain_batches = c.batch + 1, chain_head = "
        "sha256('\\x6473682d7365616c2d636861696e00'::bytea || c.hashed) FROM (SELECT "
        "DISTINCT ON (session_id) session_id, batch, hashed FROM {s}.chain ORDER BY "
        "session_id, batch DESC) c WHERE c.session_id = t.id",
    )),
    (10, "no foreign keys on the appended tables: a trigger on sessions deletes their rows "
         "(formats.md)", (
        # every insert into events and chain already holds its session row locked (the
        # fence), so the per-row reference check only cost the server a lookup a row
        "ALTER TABLE {s}.events DROP CONSTRAINT IF EXISTS events_session_id_fkey",
        "ALTER TABLE {s}.chain DROP CONSTRAINT IF EXISTS chain_session_id_fkey",
        """CREATE OR REPLACE FUNCTION {s}.dsh_session_deleted() RETURNS trigger
LANGUAGE plpgsql AS $f$
BEGIN
  DELETE FROM {s}.events WHERE session_id = OLD.id;
  DELETE FROM {s}.chain WHERE session_id = OLD.id;
  RETURN OLD;
END
$f$""",
        "DROP TRIGGER IF EXISTS dsh_session_deleted ON {s}.sessions",
        "CREATE TRIGGER dsh_session_deleted AFTER DELETE ON {s}.sessions FOR EACH ROW "
        "EXECUTE FUNCTION {s}.dsh_session_deleted()",
    )),
    (11, "store changes: counters a session row's insert, delete or new revision bumps at "
         "commit, so a search finds an unchanged store in one read (formats.md)", (
        # each statement can run again (as migration 10's): a schema whose migrations
        # table lost its rows is migrated over what is there
        """CREATE TABLE IF NOT EXISTS {s}.store_changes (
  slot smallint PRIMARY KEY CHECK (slot >= 0 AND slot < 16),
  n    bigint NOT NULL DEFAULT 0
)""",
        "INSERT INTO {s}.store_changes (slot) SELECT generate_series(0, 15) "
        "ON CONFLICT (slot) DO NOTHING",
        # one slot per transaction (its id's), bumped at commit: a transaction takes one
        # counter row lock, last, so writers of different sessions rarely wait on each other
        # and never deadlock on it
        """CREATE OR REPLACE FUNCTION {s}.dsh_store_changed() RETURNS trigger
LANGUAGE plpgsql AS $f$
BEGIN
  UPDATE {s}.store_changes SET n = n + 1 WHERE slot = txid_current() % 16;
  RETURN NULL;
END
$f$""",
        "DROP TRIGGER IF EXISTS dsh_store_changed ON {s}.sessions",
        "CREATE CONSTRAINT TRIGGER dsh_store_changed AFTER INSERT OR DELETE OR UPDATE OF id, "
        "incarnation, revision ON {s}.sessions DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
        "EXECUTE FUNCTION {s}.dsh_store_changed()",
    )),
    (12, "asides: the table is part of the schema, so the lookup of a read can read an "
         "aside's head in its own message (stores.md)", (
        # made by the first aside write before this migration, with this definition: kept
        ASIDES_TABLE,
    )),
)
"""Forward-only migrations, applied in order under :data:`MIGRATION_LOCK_KEY`."""

SCHEMA_VERSION: Final = MIGRATIONS[-1][0]
"""The highest migration this build knows; a store at a higher version is refused."""

MIGRATION_LOCK_KEY: Final = 0x44534850
"""First key of ``pg_advisory_xact_lock(key, hashtext(schema))`` (ASCII ``DSHP``)."""

_SCHEMA_NAME: Final = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def valid_schema_name(name: str) -> bool:
    """Return whether ``name`` is a schema name dsh accepts: ``[a-z_][a-z0-9_]*``, ≤ 63 bytes."""
    return bool(_SCHEMA_NAME.match(name))


def quote_schema(name: str) -> str:
    """Quote a schema name already checked by :func:`valid_schema_name`."""
    return '"' + name + '"'

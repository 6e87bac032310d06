"""PostgreSQL: a read open that reads the restore point with its lookup (``open_at_restore_point``).

The restore point is read in the lookup's snapshot and the rows in a later one; the rows'
snapshot compares the restore point with the one stored then, so one replaced or removed in
between is never used (docs/stores.md#reading-by-page). Runs against the server at
``$DSH_TEST_POSTGRES_URL`` in a throw-away schema; skipped, saying so, without a server.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

import dsh
from dsh._errors import LogCorruptError, SessionNotFoundError
from dsh.persistence import Persistence, WriteBehind, open_backend
from dsh.persistence import _restore_point as rp
from dsh.persistence._pages import read_pages
from dsh.testing._stores import postgres_base_url, postgres_unreachable, temporary_postgres_url
from tests.strategies import StepClock, completed_turn

_REASON = postgres_unreachable()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"SKIPPED LOUDLY: {_REASON}")


def _write(url: str, turns: range, clock: StepClock) -> None:
    """Append 6-event turns to session ``s``; the close keeps a restore point at the end."""
    with dsh.open(url, clock=clock, write_behind=WriteBehind(restore_point_tail=12)) as store:
        session = store.session("s")
        for turn in turns:
            completed_turn(session, turn)
            store.flush(session)


@pytest.fixture
def pg_url() -> Iterator[str]:
    with temporary_postgres_url() as url:
        _write(url, range(1, 6), StepClock())
        yield url


def test_the_lookup_reads_the_restore_point_and_the_read_goes_through_it(pg_url: str) -> None:
    with Persistence(open_backend(pg_url)) as persistence:
        whole = persistence.read("s").events
        with persistence.backend.open_at_restore_point("s") as handle:  # type: ignore[attr-defined]
            point, cold, source = handle.read_from_restore_point()
        assert point.state.event_count == len(source) == 30 == len(whole)
        assert cold.events == ()
        pages = read_pages(persistence, "s")
        assert pages.paged and pages.restore is not None
        assert pages.restore.event_count == 30
        assert list(pages.events) == list(whole)


def test_a_restore_point_replaced_after_the_lookup_is_read_again(pg_url: str) -> None:
    with Persistence(open_backend(pg_url)) as persistence:
        handle = persistence.backend.open_at_restore_point("s")  # type: ignore[attr-defined]
        with handle:
            # another writer resumes, appends two turns and closes: a new restore point at 43
            _write(pg_url, range(6, 8), StepClock(2_000_000_000_000))
            point, cold, source = handle.read_from_restore_point()
        assert point.state.event_count == len(source) == 43  # the one of now, not 30
        assert cold.events == ()


def test_a_restore_point_removed_after_the_lookup_is_not_used(pg_url: str) -> None:
    with Persistence(open_backend(pg_url)) as persistence:
        schema = persistence.backend.schema  # type: ignore[attr-defined]
        handle = persistence.backend.open_at_restore_point("s")  # type: ignore[attr-defined]
        with handle:
            with psycopg.connect(postgres_base_url(), autocommit=True) as conn:
                conn.execute(f'DELETE FROM "{schema}".restore_points WHERE session_id = %s',
                             ("s",))
            with pytest.raises(rp.RestorePointRefused) as refused:
                handle.read_from_restore_point()
        assert refused.value.reason == "absent"
        pages = read_pages(persistence, "s")  # the read falls back and still reads it all
        assert len(pages.events) == 30


def test_the_lookup_of_a_missing_session_raises(pg_url: str) -> None:
    with Persistence(open_backend(pg_url)) as persistence, \
            pytest.raises(SessionNotFoundError, match="'nope'"):
        persistence.backend.open_at_restore_point("nope")  # type: ignore[attr-defined]


def test_the_page_in_source_reads_events_by_seq_and_names_a_missing_one(pg_url: str) -> None:
    with Persistence(open_backend(pg_url)) as persistence:
        whole = persistence.read("s").events
        with persistence.backend.open_at_restore_point("s") as handle:  # type: ignore[attr-defined]
            _point, _cold, source = handle.read_from_restore_point()
        assert source.read_events([0, 7, 29]) == {0: whole[0], 7: whole[7], 29: whole[29]}
        schema = persistence.backend.schema  # type: ignore[attr-defined]
        with psycopg.connect(postgres_base_url(), autocommit=True) as conn:
            conn.execute(f'DELETE FROM "{schema}".events WHERE session_id = %s AND seq = 0',
                         ("s",))
        with pytest.raises(LogCorruptError, match="holds seq 0") as missing:
            source.read_events([0, 7])
        assert missing.value.where["seq"] == 0


def test_the_page_in_source_decodes_adjacent_rows_in_one_pass(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # one scan per run of adjacent rows, not per row (a scan costs ~2.5 us a call beside its
    # ~1.5 us a row); a run is cut where the seq before a row was not asked for
    from dsh.persistence.postgres import _backend as pg

    scans: list[tuple[int, int]] = []
    real = pg.scan_rows

    def counted(rows: object, base: int, *args: object, **kwargs: object) -> object:
        scans.append((base, len(rows)))  # type: ignore[arg-type]
        return real(rows, base, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pg, "scan_rows", counted)
    with Persistence(open_backend(pg_url)) as persistence:
        whole = persistence.read("s").events
        with persistence.backend.open_at_restore_point("s") as handle:  # type: ignore[attr-defined]
            _point, _cold, source = handle.read_from_restore_point()
        scans.clear()
        assert source.read_events(range(30)) == dict(enumerate(whole))
        assert scans == [(0, 30)]
        scans.clear()
        assert source.read_events([0, 1, 2, 7, 29]) == {s: whole[s] for s in (0, 1, 2, 7, 29)}
        assert scans == [(0, 3), (7, 1), (29, 1)]
        schema = persistence.backend.schema  # type: ignore[attr-defined]
        with psycopg.connect(postgres_base_url(), autocommit=True) as conn:
            conn.execute(f"UPDATE \"{schema}\".events SET data = '{{\"cut', data_zstd = NULL "
                         "WHERE session_id = %s AND seq = 5", ("s",))
        for asked in (range(10), [5], [4, 5]):  # inside a run, alone, last of a run
            with pytest.raises(LogCorruptError) as damaged:
                source.read_events(asked)
            assert damaged.value.where["seq"] == 5, asked


def _schema_of(url: str) -> str:
    return url.rsplit("schema=", 1)[1].split("&")[0]


def _run(url: str, sql: str, *args: object) -> list[tuple[object, ...]]:
    with psycopg.connect(postgres_base_url(), autocommit=True) as conn:
        cursor = conn.execute(sql.replace("{s}", f'"{_schema_of(url)}"'), args or None)
        return cursor.fetchall() if cursor.description else []


def test_the_lookup_reads_the_heads_of_the_asides_asked_for(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/stores.md#asides: an aside's head (its bytes to the first newline) comes in the
    message of the lookup, no round trip of its own; b"" for one without, None for none."""
    from tests.persistence.test_postgres import RoundTrips

    with Persistence(open_backend(pg_url)) as persistence:
        persistence.write_aside("s", "two-lines", b'{"head":1}\n{"whole":2}')
        persistence.write_aside("s", "one-line", b'{"whole":3}')
    trips = RoundTrips(monkeypatch)
    with Persistence(open_backend(pg_url)) as persistence:
        names = ["two-lines", "one-line", "missing"]
        pages = read_pages(persistence, "s", aside_heads=names)
        lookup, rows = trips.sent()  # the lookup with the restore point and heads; the tail
        assert "asides" in lookup and "restore_points" in lookup and "asides" not in rows
        trips.close()
        assert pages.paged
        assert dict(pages.aside_heads) == {"two-lines": b'{"head":1}\n', "one-line": b"",
                                           "missing": None}
        assert read_pages(persistence, "s").aside_heads == {}  # none asked for


def test_migration_12_makes_the_asides_table_and_keeps_one_an_earlier_write_made() -> None:
    """A schema an earlier dsh migrated to 11 gets table ``asides`` at its first use; the
    rows of one its first aside write made are kept (docs/formats.md#tables-and-migrations)."""
    from dsh.persistence.postgres._schema import MIGRATIONS, SCHEMA_VERSION

    assert SCHEMA_VERSION == 12 and MIGRATIONS[-1][0] == 12
    for made_before in (True, False):
        with temporary_postgres_url() as url:
            _run(url, "CREATE SCHEMA {s}")
            _run(url, "CREATE TABLE {s}.dsh_migrations (version integer PRIMARY KEY, name text "
                      "NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
            for number, name, statements in MIGRATIONS[:11]:
                for statement in statements:
                    _run(url, statement)
                _run(url, "INSERT INTO {s}.dsh_migrations (version, name) VALUES (%s, %s)",
                     number, name)
            if made_before:  # as the first write_aside of a build at migration 11 made it
                _run(url, "CREATE TABLE IF NOT EXISTS {s}.asides (session_id text NOT NULL, "
                          "name text NOT NULL, data bytea NOT NULL, PRIMARY KEY (session_id, "
                          "name))")
                _run(url, "INSERT INTO {s}.asides VALUES ('s', 'index', %s)", b"old\nwhole")
            _write(url, range(1, 3), StepClock())  # the first use migrates
            assert _run(url, "SELECT max(version) FROM {s}.dsh_migrations") == [(12,)]
            with Persistence(open_backend(url)) as persistence:
                pages = read_pages(persistence, "s", aside_heads=["index"])
                assert dict(pages.aside_heads) == {
                    "index": b"old\n" if made_before else None}
                assert persistence.read_aside("s", "index") == (
                    b"old\nwhole" if made_before else None)

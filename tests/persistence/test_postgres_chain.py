"""The seal chain on PostgreSQL: table ``chain``, linked by the append's own statement.

Real server (127.0.0.1:5432, db ``test``), a throw-away schema ``chainstore_<hex>`` per test.
Sessions are written through the public API; rows are then changed, removed, reordered or cut
with SQL the way a person with write access to the database could, and ``dsh verify``
(``--proof``, ``--against``) names the batch and the writer (lease epoch, pid, host).
Rules: docs/formats.md#the-seal-chain, docs/cli.md#chain-proofs.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import dsh
from dsh.persistence import _chain
from dsh.persistence.postgres._backend import ONE_STATEMENT_MAX_ROWS, PostgresBackend
from dsh.rights import erase, redact
from dsh.testing._stores import drop_schema, postgres_base_url, postgres_unreachable
from tests.persistence.test_seal_chain import _cli, user

pytestmark = pytest.mark.skipif(postgres_unreachable() is not None,
                                reason=str(postgres_unreachable()))
BATCHES = 5


def _throw_away(prefix: str) -> Iterator[str]:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        drop_schema(postgres_base_url(), name)


@pytest.fixture
def schema() -> Iterator[str]:
    yield from _throw_away("chainstore")


@pytest.fixture
def own_schema() -> Iterator[str]:
    """A schema of the head tests (``pgchainfix_<hex>``)."""
    yield from _throw_away("pgchainfix")


def _url(schema: str, **options: object) -> str:
    extra = "".join(f"&{k}={v}" for k, v in options.items())
    return f"{postgres_base_url()}?schema={schema}&lease_ms=2000{extra}"


def _sql(query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(postgres_base_url(), autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description is not None else []


def _write(url: str, batches: int = BATCHES, *, per_batch: int = 1) -> None:
    with dsh.open(url) as store:
        session = store.session("s1")
        for n in range(batches):
            for k in range(per_batch):
                session.append("user/message", user(f"message {n:03d}.{k}"),
                               surface_op="append")
            store.flush(session)


def _records(url: str) -> tuple[str, list[_chain.ChainRecord]]:
    with dsh.open(url) as store:
        backend = store.persistence.backend
        assert isinstance(backend, PostgresBackend)
        kept = backend.chain_records("s1")
    return kept.incarnation, kept.records


def _written_and_proved(tmp_path: Path, schema: str) -> tuple[str, Path]:
    """A session of BATCHES appends and the proof kept of it (``--proof --json``)."""
    url = _url(schema)
    _write(url)
    kept = tmp_path / "proof.json"
    out = _cli(tmp_path, url, "s1", "--proof", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    kept.write_text(out.stdout, encoding="utf-8")
    return url, kept


def _verify(tmp_path: Path, url: str, *args: str) -> tuple[int, str]:
    out = _cli(tmp_path, url, *args)
    return out.returncode, out.stdout + out.stderr


@pytest.mark.parametrize("one_statement", [True, False])
def test_each_append_commits_one_linked_record_bound_to_lease_pid_host_incarnation(
        tmp_path: Path, schema: str, one_statement: bool) -> None:
    url = _url(schema)
    # more rows than one statement takes: the transaction path links the record too
    _write(url, per_batch=1 if one_statement else 600)
    incarnation, records = _records(url)
    per = 1 if one_statement else 600
    # one record per append transaction, contiguous (the write-behind may send a flush's
    # events in more than one append)
    assert records[0].first == 0 and records[-1].end == BATCHES * per
    assert all(a.end == b.first for a, b in itertools.pairwise(records))
    assert one_statement or max(r.end - r.first for r in records) > ONE_STATEMENT_MAX_ROWS
    assert records[0].prev == bytes(32)
    assert all(b.prev == a.hash for a, b in itertools.pairwise(records))
    me = _chain.this_writer()
    assert {(r.writer.host, r.writer.pid) for r in records} == {(me.host, os.getpid())}
    assert {r.writer.epoch for r in records} == {1}  # the lease epoch of the one writer
    assert {r.incarnation for r in records} == {_chain.incarnation_bytes(incarnation)}
    stored = _sql(f'SELECT batch, hash FROM "{schema}".chain ORDER BY batch')
    assert [(b, bytes(h)) for b, h in stored] == [(i, r.hash) for i, r in enumerate(records)]
    code, out = _verify(tmp_path, url, "s1", "--proof")
    assert code == 0, out
    [line] = [x for x in out.splitlines() if x.startswith("proof ")]
    assert f"head {records[-1].hash.hex()}" in line and f"batches {len(records)}" in line
    assert "epoch 1" in line and "no chain" not in out


def test_a_second_writer_continues_the_chain_under_its_own_epoch(tmp_path: Path,
                                                                 schema: str) -> None:
    url = _url(schema)
    _write(url, 2)
    with dsh.open(url) as store:
        session = store.session("s1")
        session.append("user/message", user("later"), surface_op="append")
        store.flush(session)
    _, records = _records(url)
    assert [r.writer.epoch for r in records] == [1, 1, 2]
    assert records[2].prev == records[1].hash
    assert _verify(tmp_path, url, "s1")[0] == 0


def test_changed_reordered_and_cut_rows_are_named_by_batch_and_writer(
        tmp_path: Path, schema: str) -> None:
    url = _url(schema)
    _write(url)
    s = f'"{schema}"'
    # same-length text replaced: the rows still decode, only the chain sees it
    _sql(f"UPDATE {s}.events SET data = replace(data, 'message 002', 'massage 002')")
    code, out = _verify(tmp_path, url, "s1")
    assert code == 1 and "CHAIN_EVENTS" in out and "seq 2..2" in out and "epoch 1" in out
    _sql(f"UPDATE {s}.events SET data = replace(data, 'massage 002', 'message 002')")
    assert _verify(tmp_path, url, "s1")[0] == 0
    # two events' bodies swapped (reordered)
    _sql(f"UPDATE {s}.events a SET data = b.data FROM {s}.events b WHERE "
         "(a.seq, b.seq) IN ((1, 3), (3, 1)) AND a.session_id = b.session_id")
    code, out = _verify(tmp_path, url, "s1")
    assert code == 1 and out.count("CHAIN_EVENTS") >= 2
    _sql(f"UPDATE {s}.events a SET data = b.data FROM {s}.events b WHERE "
         "(a.seq, b.seq) IN ((1, 3), (3, 1)) AND a.session_id = b.session_id")
    # the last two events cut and the head moved back to match: the rows are consistent,
    # the chain still commits to them
    _sql(f"DELETE FROM {s}.events WHERE seq >= 3")
    _sql(f"UPDATE {s}.sessions SET head_seq = 3")
    code, out = _verify(tmp_path, url, "s1")
    assert code == 1 and "CHAIN_CUT" in out and "seq 3..3" in out


def test_a_changed_chain_record_is_broken_and_a_consistent_truncation_fails_the_kept_proof(
        tmp_path: Path, schema: str) -> None:
    url, kept = _written_and_proved(tmp_path, schema)
    s = f'"{schema}"'
    # a record's writer rewritten in place: that record is named, not the next one
    _sql(f"UPDATE {s}.chain SET hashed = overlay(hashed placing '\\x07000000'::bytea "
         "from 105 for 4) WHERE batch = 1")
    code, text = _verify(tmp_path, url, "s1")
    assert code == 1 and "CHAIN_BROKEN" in text and "(batch 1)" in text, text
    assert "(batch 2)" not in text
    # the whole tail removed consistently: events, head and chain records; the session
    # row's chain head still counts them
    _sql(f"DELETE FROM {s}.chain WHERE batch >= 1")
    _sql(f"DELETE FROM {s}.events WHERE seq >= 1")
    _sql(f"UPDATE {s}.sessions SET head_seq = 1")
    code, text = _verify(tmp_path, url, "s1")
    assert code == 1 and "CHAIN_CUT" in text and "batches 1..4" in text, text
    # and the row's chain head moved back too: the store alone cannot tell
    _sql(f"UPDATE {s}.sessions SET chain_batches = 1, chain_head = c.hash FROM {s}.chain c "
         "WHERE c.batch = 0")
    assert _verify(tmp_path, url, "s1")[0] == 0
    code, text = _verify(tmp_path, url, "--against", str(kept))
    assert code == 1 and "PROOF_TRUNCATED" in text and "batches 1..4 were removed" in text
    assert "epoch 1" in text


@pytest.mark.parametrize("how", ["erase", "redact"])
def test_an_erased_or_redacted_session_keeps_its_chain_and_the_kept_proof(
        tmp_path: Path, schema: str, how: str) -> None:
    url, kept = _written_and_proved(tmp_path, schema)
    before = json.loads(kept.read_text())["proof"]["sessions"][0]
    with dsh.open(url) as store:
        if how == "erase":
            erase(store, ["s1"])
        else:
            redact(store, "s1", match="message 002")
    _, records = _records(url)
    assert [r.hash.hex()[:16] for r in records[:BATCHES]] == before["hashes"]
    assert records[2].keys[:1] == b"\1"  # the tombstoned event keeps only its leaf
    code, text = _verify(tmp_path, url, "s1", "--against", str(kept))
    assert code == 0, text
    with dsh.open(url) as store:  # the next writer chains on after the carried records
        session = store.session("s1")
        session.append("user/message", user("after"), surface_op="append")
        store.flush(session)
    _, after = _records(url)
    assert after[-1].prev == records[-1].hash and len(after) == len(records) + 1
    assert _verify(tmp_path, url, "s1", "--against", str(kept))[0] == 0


def test_a_row_that_no_longer_decodes_is_attributed_to_its_batch_and_writer(
        tmp_path: Path, schema: str) -> None:
    url = _url(schema)
    _write(url)
    _sql(f'UPDATE "{schema}".events SET data = \'{{"broken\' WHERE seq = 2')
    code, out = _verify(tmp_path, url, "s1")
    assert code == 1 and "LOG_CORRUPT" in out, out
    assert "it lies in the batch of seq 2..2 written by" in out and "epoch 1" in out


_KILLED = """
import os, signal, sys
import dsh
from dsh._failpoints import set_failpoint_hook
from dsh.rights import redact

url, at = sys.argv[1], sys.argv[2]
set_failpoint_hook(lambda point: os.kill(os.getpid(), signal.SIGKILL) if point == at else None)
with dsh.open(url) as store:
    redact(store, "s1", match="message 002")
"""


@pytest.mark.parametrize("at", ["postgres.rewrite.commit", "postgres.rewrite.committed"])
def test_a_rewrite_killed_in_or_after_its_transaction_keeps_the_chain(
        tmp_path: Path, schema: str, at: str) -> None:
    url, kept = _written_and_proved(tmp_path, schema)
    killed = subprocess.run([sys.executable, "-c", _KILLED, url, at], check=False,
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stdout + killed.stderr
    with dsh.open(url) as store:
        texts = json.dumps([e["data"] for e in store.read("s1").events])
    assert ('"text": "message 002.0"' in texts) is (at == "postgres.rewrite.commit")
    code, text = _verify(tmp_path, url, "s1", "--against", str(kept))
    assert code == 0, text
    with dsh.open(url) as store:  # the dead writer's lease is taken over; the chain goes on
        redact(store, "s1", match="message 002")
        session = store.session("s1")
        session.append("user/message", user("after"), surface_op="append")
        store.flush(session)
    code, text = _verify(tmp_path, url, "s1", "--against", str(kept))
    assert code == 0, text


@pytest.mark.parametrize("per_batch", [1, 600])
def test_the_last_chain_record_removed_is_a_cut_against_the_session_rows_head(
        tmp_path: Path, own_schema: str, per_batch: int) -> None:
    # per_batch 600: the transaction path moves the row's head too, not only the one statement
    url = _url(own_schema)
    _write(url, per_batch=per_batch)
    s = f'"{own_schema}"'
    [(batches, head)] = _sql(f"SELECT chain_batches, chain_head FROM {s}.sessions")
    _, records = _records(url)
    assert (batches, bytes(head)) == (len(records), records[-1].hash)
    last = len(records) - 1
    _sql(f"DELETE FROM {s}.chain WHERE batch = %s", last)
    code, out = _verify(tmp_path, url, "s1")
    assert code == 1 and "CHAIN_CUT" in out, out
    assert f"batches {last}..{last} (seq {records[-1].first}..{records[-1].end - 1}" in out
    # and the removed batch's events forged: still refused, the forgery is not served as valid
    _sql(f"UPDATE {s}.events SET data = replace(data, 'message 004', 'forged! 004') "
         "WHERE seq = %s", records[-1].end - 1)
    code, out = _verify(tmp_path, url, "s1")
    assert code == 1 and "CHAIN_CUT" in out, out


def test_a_changed_stored_hash_names_its_record_and_not_the_next_writer(
        tmp_path: Path, own_schema: str) -> None:
    url = _url(own_schema)
    _write(url)
    s = f'"{own_schema}"'
    _sql(f"UPDATE {s}.chain SET hash = %s WHERE batch = 2", bytes(32))
    code, out = _verify(tmp_path, url, "s1")
    assert code == 1 and "CHAIN_BROKEN" in out and "seq 2..2" in out and "(batch 2)" in out
    with dsh.open(url) as store:  # an honest next append links past the changed column
        session = store.session("s1")
        session.append("user/message", user("after"), surface_op="append")
        store.flush(session)
    _, records = _records(url)
    assert records[-1].prev == records[-2].hash  # the recomputed hash, not the stored one
    code, out = _verify(tmp_path, url, "s1")
    assert code == 1 and "(batch 2)" in out and f"(batch {BATCHES})" not in out, out
    _sql(f"UPDATE {s}.chain SET hash = %s WHERE batch = 2", records[2].hash)
    assert _verify(tmp_path, url, "s1")[0] == 0


@pytest.mark.parametrize("batch", [1, BATCHES - 1])
def test_a_changed_record_is_named_as_changed_not_as_changed_events(
        tmp_path: Path, own_schema: str, batch: int) -> None:
    url = _url(own_schema)
    _write(url)
    s = f'"{own_schema}"'
    domain = _chain.chain_domain()
    # the record's digest (bytes 33..64 of its hashed part) changed, its hash column left
    _sql(f"UPDATE {s}.chain SET hashed = overlay(hashed placing '\\xffffffff'::bytea from 33 "
         "for 4) WHERE batch = %s", batch)
    code, out = _verify(tmp_path, url, "s1")
    assert code == 1 and "CHAIN_BROKEN" in out and f"(batch {batch}) in" in out, out
    assert "CHAIN_EVENTS" not in out and "was changed" in out
    # and its hash column recomputed to match: still that record, not its neighbour
    _sql(f"UPDATE {s}.chain SET hash = sha256(%s::bytea || hashed) WHERE batch = %s",
         domain, batch)
    code, out = _verify(tmp_path, url, "s1")
    assert code == 1 and "CHAIN_BROKEN" in out and f"(batch {batch}) in" in out, out
    assert "CHAIN_EVENTS" not in out and f"(batch {batch + 1})" not in out


def test_a_changed_key_part_is_said_to_be_possibly_the_record(tmp_path: Path,
                                                              own_schema: str) -> None:
    url = _url(own_schema)
    _write(url)
    _sql(f'UPDATE "{own_schema}".chain SET keys = %s WHERE batch = 1', b"\0" + bytes(16))
    code, out = _verify(tmp_path, url, "s1")
    assert code == 1 and "CHAIN_EVENTS" in out and "key part" in out, out


def test_migration_9_sets_the_head_of_a_chain_written_before_it(tmp_path: Path,
                                                                own_schema: str) -> None:
    url = _url(own_schema)
    _write(url)
    _, records = _records(url)
    s = f'"{own_schema}"'
    # the schema as migration 8 left it, its chain written: no head on the row
    _sql(f"ALTER TABLE {s}.sessions DROP COLUMN chain_batches, DROP COLUMN chain_head")
    _sql(f"DELETE FROM {s}.dsh_migrations WHERE version >= 9")  # 10 runs again as well
    _sql(f"UPDATE {s}.chain SET hash = %s WHERE batch = %s", bytes(32), len(records) - 1)
    done = subprocess.run([sys.executable, "-m", "dsh.cli", "migrate", "--store", url],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    # the head is the last record's hash recomputed, not the changed stored one
    [(batches, head)] = _sql(f"SELECT chain_batches, chain_head FROM {s}.sessions")
    assert (batches, bytes(head)) == (len(records), records[-1].hash)
    _sql(f"UPDATE {s}.chain SET hash = %s WHERE batch = %s", records[-1].hash,
         len(records) - 1)
    assert _verify(tmp_path, url, "s1")[0] == 0

"""A forged restore point on Zstandard JSONL and PostgreSQL never changes a resume's answer.

Raw JSONL and SQLite bind restore points to their integrity seal
(``test_restore_point_forged.py``). A Zstandard log has no seal: its writer records each restore
point's digest in ``session.jsonl.zstd.ckpt.seal`` before renaming the restore point into place.
PostgreSQL records it in the session row's ``restore_point_digest``, in the statement that
writes the restore point row (migration 7). A restore point whose body was edited and its
digest recomputed is refused (``RESTORE_POINT_FORGED``) and the log read in full; one with no
record at all is not trusted either (a full read, no warning). Real files, the local
PostgreSQL in a schema of our own. Rule: docs/rules.md#restore-points-are-never-the-truth.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import dsh
from dsh.persistence import Persistence, open_backend
from dsh.persistence import _restore_point as rp
from dsh.persistence.jsonl import _restore_point as jrp
from dsh.persistence.postgres._schema import SCHEMA_VERSION
from dsh.testing._stores import (
    _with_options,
    drop_schema,
    postgres_base_url,
    postgres_unreachable,
)
from tests.persistence.test_restore_point import (
    _verify_json,
    assert_equivalent,
    assert_same_resume,
    ckpt_file,
    long_store,
    url_of,
)
from tests.persistence.test_restore_point import (
    root as root,
)
from tests.persistence.test_restore_point import (
    small_restore_points as small_restore_points,
)
from tests.strategies import StepClock, completed_turn


def forged(data: bytes, backend: str, how: str = "drop-node") -> bytes:
    """The restore point ``data`` with its state edited and its digest recomputed."""
    point = rp.decode_restore_point(data, session_id="s", backend=backend)
    nodes = point.state.nodes
    kept = nodes[:-1] if how == "drop-node" else nodes[: len(nodes) // 2]
    return rp.encode_restore_point(replace(point, state=replace(point.state, nodes=kept)))


def binding_file(root: Path) -> Path:
    (found,) = root.rglob("session.jsonl.zstd.ckpt.seal")
    return found


# --- Zstandard JSONL ------------------------------------------------------------------------


def test_the_zstd_writer_records_the_restore_point_digest(root: Path) -> None:
    long_store("jsonl-zstd", root)
    marks = jrp.read_bindings(binding_file(root))
    digest = rp.body_digest(ckpt_file(root).read_bytes())
    assert marks[0] == bytes.fromhex(digest)[:12]
    assert 1 <= len(marks) <= jrp.BINDINGS_KEPT
    assert_equivalent(root, "jsonl-zstd", expect_paged=True)  # and a resume uses it


@pytest.mark.parametrize("how", ["drop-node", "drop-nodes"])
def test_a_forged_zstd_restore_point_gives_the_full_read(
        root: Path, how: str, caplog: pytest.LogCaptureFixture) -> None:
    long_store("jsonl-zstd", root)
    path = ckpt_file(root)
    path.write_bytes(forged(path.read_bytes(), "jsonl-zstd", how))
    refused = rp.stats["refused:unbound"]
    with caplog.at_level(logging.WARNING, logger="dsh.persistence._restore_point"):
        assert_equivalent(root, "jsonl-zstd", expect_paged=False)
    assert rp.stats["refused:unbound"] == refused + 1
    assert [r for r in caplog.records if str(path) in r.getMessage()
            and "never recorded" in r.getMessage()]


def test_the_zstd_refusal_names_the_file_and_seq(root: Path) -> None:
    long_store("jsonl-zstd", root)
    path = ckpt_file(root)
    path.write_bytes(forged(path.read_bytes(), "jsonl-zstd"))
    backend = open_backend(url_of("jsonl-zstd", root))
    with backend.open("s", "read") as handle, pytest.raises(rp.RestorePointRefused) as caught:
        handle.read_from_restore_point()  # type: ignore[attr-defined]
    error = caught.value.error
    assert isinstance(error, dsh.LogCorruptError) and error.code == "RESTORE_POINT_FORGED"
    point = rp.decode_restore_point(path.read_bytes(), session_id="s", backend="jsonl-zstd")
    assert error.where == {"path": str(path), "seq": point.anchor.event_count}
    assert str(binding_file(root)) in error.message
    out = _verify_json(url_of("jsonl-zstd", root), exit_code=1)
    assert out["restorePoints"]["s"]["status"] == "forged"
    assert [v["rule"] for v in out["violations"]] == ["RESTORE_POINT_FORGED"]


@pytest.mark.parametrize("damage", ["deleted", "emptied", "not a seal"])
def test_a_zstd_restore_point_without_its_record_is_not_trusted(root: Path,
                                                                 damage: str) -> None:
    """Lost by a crash, or written by an older writer: a full read, no warning."""
    long_store("jsonl-zstd", root)
    seal = binding_file(root)
    if damage == "deleted":
        seal.unlink()
    elif damage == "emptied":
        seal.write_bytes(b"")
    else:
        seal.write_bytes(b"DSHRPB1\n" + b"\x00" * 5)
    refused = rp.stats["refused:unrecorded"]
    assert_equivalent(root, "jsonl-zstd", expect_paged=False)
    assert rp.stats["refused:unrecorded"] == refused + 1


def test_the_previous_zstd_restore_point_stays_trusted_while_the_next_is_written(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record is written before the rename: a crash between leaves the old one usable."""
    long_store("jsonl-zstd", root)
    before = ckpt_file(root).read_bytes()

    def crash(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(rp, "write_restore_point_file", crash)
    with dsh.open(url_of("jsonl-zstd", root), clock=StepClock(2_000_000_000_000)).sessions \
            as store:
        session = store.resume("s")
        completed_turn(session, 31, call_ids=["c31"])
        store.flush(session)
    assert ckpt_file(root).read_bytes() == before
    monkeypatch.undo()
    used = rp.stats["used"]
    assert_equivalent(root, "jsonl-zstd", expect_paged=True)
    assert rp.stats["used"] == used + 1


def test_a_rewrite_removes_the_zstd_restore_point_seal(root: Path) -> None:
    long_store("jsonl-zstd", root)
    with Persistence(open_backend(url_of("jsonl-zstd", root))) as persistence, \
            persistence.open("s", "write") as handle:
        events = handle.read(0).events
        handle.rewrite(events)  # type: ignore[attr-defined]
    assert not list(root.rglob("*.ckpt")) and not list(root.rglob("*.ckpt.seal"))


# --- PostgreSQL -----------------------------------------------------------------------------


@contextlib.contextmanager
def own_schema() -> Iterator[tuple[str, str, str]]:
    """``(store url, server url, schema)`` of a fresh schema named ``zstdpg_…``, dropped after."""
    reason = postgres_unreachable()
    if reason is not None:
        pytest.skip(f"SKIPPED LOUDLY: {reason}")
    server = postgres_base_url()
    schema = f"zstdpg_{uuid.uuid4().hex[:12]}"
    try:
        yield _with_options(server, schema=schema), server, schema
    finally:
        drop_schema(server, schema)


def _full_copy(pg: str, root: Path) -> str:
    """The session ``s`` of ``pg`` copied into a SQLite store without restore point."""
    full = root.parent / "full"
    with Persistence(open_backend(pg)) as persistence, \
            persistence.open("s", "read") as handle, \
            Persistence(open_backend(url_of("sqlite", full))) as copy:
        read = handle.read(0)
        copy.create(read.header)
        with copy.open("s", "write") as writer:
            writer.append(read.events)
    for ckpt in full.rglob("*.ckpt"):
        ckpt.unlink()
    return url_of("sqlite", full)


def _pg_row(server: str, schema: str) -> tuple[bytes, str | None]:
    import psycopg

    with psycopg.connect(server, autocommit=True) as conn:
        found = conn.execute(
            f'SELECT r.data, t.restore_point_digest FROM "{schema}".restore_points r JOIN '
            f'"{schema}".sessions t ON t.id = r.session_id WHERE r.session_id = %s',
            ("s",)).fetchone()
    assert found is not None
    return bytes(found[0]), found[1]


def _pg_exec(server: str, sql: str, *args: object) -> None:
    import psycopg

    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql, args)


def test_the_postgres_writer_records_the_digest_with_the_restore_point(root: Path) -> None:
    with own_schema() as (pg, server, schema):
        long_store("postgresql", root, url=pg)
        data, recorded = _pg_row(server, schema)
        assert recorded == rp.body_digest(data)
        assert SCHEMA_VERSION >= 7  # the migration that added restore_point_digest
        used = rp.stats["used"]
        assert_same_resume(pg, _full_copy(pg, root), expect_paged=True)
        assert rp.stats["used"] == used + 1


@pytest.mark.parametrize("how", ["drop-node", "drop-nodes"])
def test_a_forged_postgres_restore_point_gives_the_full_read(
        root: Path, how: str, caplog: pytest.LogCaptureFixture) -> None:
    with own_schema() as (pg, server, schema):
        long_store("postgresql", root, url=pg)
        full = _full_copy(pg, root)
        data, _ = _pg_row(server, schema)
        _pg_exec(server, f'UPDATE "{schema}".restore_points SET data = %s WHERE session_id = '
                         "'s'", forged(data, "postgresql", how))
        refused = rp.stats["refused:unbound"]
        with caplog.at_level(logging.WARNING, logger="dsh.persistence._restore_point"):
            assert_same_resume(pg, full, expect_paged=False)
        assert rp.stats["refused:unbound"] == refused + 1
        assert [r for r in caplog.records if "RESTORE_POINT_FORGED" in r.getMessage()
                or "never recorded" in r.getMessage()]


def test_the_postgres_refusal_names_the_row_and_seq_and_verify_reports_it(root: Path) -> None:
    with own_schema() as (pg, server, schema):
        long_store("postgresql", root, url=pg)
        data, _ = _pg_row(server, schema)
        fake = forged(data, "postgresql")
        _pg_exec(server, f'UPDATE "{schema}".restore_points SET data = %s WHERE session_id = '
                         "'s'", fake)
        with Persistence(open_backend(pg)) as persistence, \
                persistence.open("s", "read") as handle, \
                pytest.raises(rp.RestorePointRefused) as caught:
            handle.read_from_restore_point()  # type: ignore[attr-defined]
        error = caught.value.error
        assert isinstance(error, dsh.LogCorruptError) and error.code == "RESTORE_POINT_FORGED"
        point = rp.decode_restore_point(fake, session_id="s", backend="postgresql")
        assert error.where["seq"] == point.anchor.event_count
        assert f"{schema}.restore_points" in str(error.where["path"])
        assert "restore_point_digest" in error.message
        out = _verify_json(pg, exit_code=1)
        assert out["restorePoints"]["s"]["status"] == "forged"
        assert [v["rule"] for v in out["violations"]] == ["RESTORE_POINT_FORGED"]


@pytest.mark.parametrize("digest", [None, "not hex"])
def test_a_postgres_restore_point_without_a_valid_record_is_not_trusted(
        root: Path, digest: str | None) -> None:
    """NULL: written before migration 7; another value: the column was edited."""
    with own_schema() as (pg, server, schema):
        long_store("postgresql", root, url=pg)
        full = _full_copy(pg, root)
        _pg_exec(server, f'UPDATE "{schema}".sessions SET restore_point_digest = %s', digest)
        reason = "refused:unrecorded" if digest is None else "refused:unbound"
        refused = rp.stats[reason]
        assert_same_resume(pg, full, expect_paged=False)
        assert rp.stats[reason] == refused + 1

"""Damage named for what it is: the log or the seal (docs/formats.md#the-seal-chain).

Real raw JSONL logs and SQLite databases, damaged the way a person with write access could,
then checked through the public API and ``dsh verify`` in a subprocess: ``--reseal`` does not
seal over a log its seal refuses; a changed chain record is ``SEAL_CHAIN_BROKEN`` at its byte,
not truncation; a JSONL log's ``LOG_CORRUPT`` names its seq, batch and writer.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

import dsh
from dsh import LogCorruptError, SealDamagedError
from dsh.persistence import _chain
from tests.persistence import _seal_layout
from tests.persistence.test_seal_chain import _cli, user

URLS = {"jsonl": "jsonl://{root}/store", "sqlite": "sqlite:{root}/store.db"}
BATCHES = 6


def _write(tmp_path: Path, backend: str, sizes: tuple[int, ...] = (1,) * BATCHES
           ) -> tuple[str, Path]:
    """Session ``s1``, one flush per entry of ``sizes`` (events each); its url and seal."""
    url = URLS[backend].format(root=tmp_path)
    n = 0
    with dsh.open(url) as store:
        session = store.session("s1")
        for size in sizes:
            for _ in range(size):
                session.append("user/message", user(f"message {n:03d}"), surface_op="append")
                n += 1
            store.flush(session)
    if backend == "jsonl":
        [seal] = (tmp_path / "store").glob("*/*/session.jsonl.seal")
    else:
        seal = tmp_path / "store.db.dsh-seals" / "s1.seal"
    return url, seal


def _damage_log(tmp_path: Path, backend: str, seq: int) -> None:
    """JSONL: event ``seq``'s text changed in place; SQLite: its row deleted (the last row:
    the rows left keep the format's rules, only the seal can tell)."""
    if backend == "jsonl":
        [log] = (tmp_path / "store").glob("*/*/session.jsonl")
        log.write_bytes(log.read_bytes().replace(f"message {seq:03d}".encode(),
                                                 f"massage {seq:03d}".encode()))
    else:
        conn = sqlite3.connect(tmp_path / "store.db")
        conn.execute("DELETE FROM events WHERE session_id = 's1' AND seq = ?", (seq,))
        conn.commit()
        conn.close()


@pytest.mark.parametrize("backend", sorted(URLS))
def test_reseal_refuses_a_log_its_present_seal_refuses(tmp_path: Path, backend: str) -> None:
    url, seal = _write(tmp_path, backend)
    _damage_log(tmp_path, backend, 3 if backend == "jsonl" else BATCHES - 1)
    out = _cli(tmp_path, url, "s1")
    assert out.returncode == 1 and "LOG_CORRUPT" in out.stdout, out.stdout + out.stderr
    before = seal.read_bytes()
    out = _cli(tmp_path, url, "s1", "--reseal")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "error[LOG_CORRUPT]" in out.stderr and "all valid" not in out.stdout
    assert "the log is what is damaged" in out.stderr
    assert "restore the log from a backup" in out.stderr
    assert "move the seal aside" in out.stderr
    assert seal.read_bytes() == before  # nothing was sealed over the damage
    with dsh.open(url) as store, pytest.raises(LogCorruptError) as caught:
        store.read("s1")
    assert caught.value.code == "LOG_CORRUPT"
    # the explicit way to accept the log as it is: the seal moved aside, then --reseal
    seal.rename(seal.with_name(seal.name + ".aside"))
    out = _cli(tmp_path, url, "s1", "--reseal")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all valid" in out.stdout and "while it was lost or damaged" in out.stderr


def _chain_positions(seal: Path) -> list[tuple[int, int]]:
    return [(pos, size) for kind, pos, size in _seal_layout.positions(seal.read_bytes())
            if kind == "chain"]


@pytest.mark.parametrize("backend", sorted(URLS))
@pytest.mark.parametrize(("published", "where"), [(True, "payload"), (False, "payload"),
                                                  (True, "length"), (False, "length")])
def test_one_byte_changed_in_a_chain_record_is_chain_broken_at_its_byte(
        tmp_path: Path, backend: str, published: bool, where: str) -> None:
    url, seal = _write(tmp_path, backend)
    pos, size = _chain_positions(seal)[2]
    data = bytearray(seal.read_bytes())
    if not published:  # the head counts batches 0..1 only: valid records follow batch 2's
        data = bytearray(_seal_layout.unpublish(bytes(data), 2))
    if where == "payload":
        data[pos + size - 3] ^= 0x01  # inside the record's payload (its writer's host name)
    else:  # the payload length's third byte: the record now claims to run past the file
        data[pos + 10] ^= 0x01
    seal.write_bytes(bytes(data))
    with dsh.open(url) as store, pytest.raises(LogCorruptError) as caught:
        store.read("s1")
    error = caught.value
    assert isinstance(error, SealDamagedError) and error.code == "SEAL_CHAIN_BROKEN"
    assert error.where["path"] == str(seal) and error.where["byte_offset"] == pos
    assert error.where["batch"] == 2 and error.where["seq"] == 2
    assert f"chain record at byte {pos}" in error.message
    out = _cli(tmp_path, url, "s1")
    assert out.returncode == 1
    assert "SEAL_CHAIN_BROKEN" in out.stdout and "SEAL_TRUNCATED" not in out.stdout
    assert f"at byte {pos}" in out.stdout


@pytest.mark.parametrize("backend", sorted(URLS))
def test_a_seal_cut_inside_a_counted_record_stays_truncated(tmp_path: Path,
                                                            backend: str) -> None:
    url, seal = _write(tmp_path, backend)
    pos, size = _chain_positions(seal)[1]
    seal.write_bytes(seal.read_bytes()[:pos + size // 2])  # the tail cut inside batch 1's
    with dsh.open(url) as store, pytest.raises(LogCorruptError) as caught:
        store.read("s1")
    error = caught.value
    assert isinstance(error, SealDamagedError) and error.code == "SEAL_TRUNCATED"
    assert "only 1 chain record remains" in error.message
    assert error.where["batch"] == 1


def test_a_jsonl_log_change_in_its_first_range_names_seq_batch_and_writer(
        tmp_path: Path) -> None:
    url, _ = _write(tmp_path, "jsonl", sizes=(4, 2))  # the first range holds the header
    _damage_log(tmp_path, "jsonl", 2)
    out = _cli(tmp_path, url, "s1")
    assert out.returncode == 1
    [line] = [x for x in out.stdout.splitlines() if "LOG_CORRUPT" in x]
    assert line.startswith("s1 seq 0 LOG_CORRUPT:"), line
    assert f"it lies in the batch of seq 0..3 written by {_chain.this_writer().host} pid " \
        f"{os.getpid()}" in line


@pytest.mark.parametrize("backend", sorted(URLS))
def test_a_power_cut_hole_in_a_record_the_head_does_not_count_is_a_torn_tail(
        tmp_path: Path, backend: str) -> None:
    """A page never written back leaves zeros from a 4 KiB boundary, later pages intact."""
    url, seal = _write(tmp_path, backend, sizes=(1,) * 40)
    data = bytearray(seal.read_bytes())
    chains = _chain_positions(seal)
    index, (pos, size) = next((i, (p, n)) for i, (p, n) in enumerate(chains)
                              if p // 4096 != (p + n - 1) // 4096 and i + 1 < len(chains))
    data = bytearray(_seal_layout.unpublish(bytes(data), index))
    boundary = (pos // 4096 + 1) * 4096
    data[boundary:pos + size] = bytes(pos + size - boundary)
    seal.write_bytes(bytes(data))
    with dsh.open(url) as store:  # the records end there; the rest is read by the format
        assert len(store.read("s1").events) == 40
    data[boundary] = 1  # not a hole any more: a changed record with valid ones after it
    seal.write_bytes(bytes(data))
    with dsh.open(url) as store, pytest.raises(SealDamagedError) as caught:
        store.read("s1")
    assert caught.value.code == "SEAL_CHAIN_BROKEN" and caught.value.where["batch"] == index

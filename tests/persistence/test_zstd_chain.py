"""The seal chain of Zstandard logs: the chain sidecar ``session.jsonl.zstd.seal``.

Frame checksums catch accidents, but anyone can recompute them. A Zstandard log's writer keeps
the chain in a sidecar of chain records only, written after the frames are durable; ``dsh
verify`` checks it (``CHAIN_*``), ``--proof`` prints its head and ``--against`` compares a kept
one. Real files, real processes, SIGKILL. Rules: docs/formats.md#zstandard-chain,
docs/cli.md#chain-proofs.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import dsh
from dsh.persistence import _chain, _seal
from dsh.persistence._listing import INDEX_NAME, JOURNAL_NAME
from dsh.persistence.jsonl._format import scan_zstd_frames
from dsh.persistence.jsonl._zstd import compressor, decompressor
from dsh.rights import erase
from tests.persistence.test_seal_chain import _cli
from tests.persistence.test_seal_missing import _write_store, user

BATCHES = 6


def _chain_of(log: Path) -> list[_chain.ChainRecord]:
    found = _seal.read_seal(log.with_name(log.name + ".seal"))
    assert found is not None and found.records == []  # chain records only
    return found.chain


def _keep_proof(tmp_path: Path, url: str) -> Path:
    out = _cli(tmp_path, url, "s1", "--proof", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    kept = tmp_path / "proof.json"
    kept.write_text(out.stdout, encoding="utf-8")
    return kept


def test_each_flush_is_one_chained_record_and_verify_proves_it(tmp_path: Path) -> None:
    url, log = _write_store(tmp_path, "jsonl+zstd", BATCHES)
    chain = _chain_of(log)
    assert [(r.first, r.end) for r in chain] == [(n, n + 1) for n in range(BATCHES)]
    assert chain[0].prev == bytes(32)
    assert all(b.prev == a.hash for a, b in itertools.pairwise(chain))
    assert {r.writer.pid for r in chain} == {os.getpid()}
    out = _cli(tmp_path, url, "s1", "--proof")
    assert out.returncode == 0, out.stdout + out.stderr
    [line] = [x for x in out.stdout.splitlines() if x.startswith("proof ")]
    assert f"head {chain[-1].hash.hex()}" in line and f"batches {BATCHES}" in line
    assert "no chain" not in out.stdout + out.stderr
    with dsh.open(url) as store:  # a later writer continues the chain
        session = store.session("s1")
        session.append("user/message", user("later"), surface_op="append")
        store.flush(session)
    later = _chain_of(log)
    assert len(later) == BATCHES + 1 and later[-1].prev == chain[-1].hash


def test_a_frame_forged_with_a_valid_checksum_is_named_by_the_chain(tmp_path: Path) -> None:
    url, log = _write_store(tmp_path, "jsonl+zstd", BATCHES)
    data = log.read_bytes()
    frames, _ = scan_zstd_frames(data, path=str(log))
    start, end = frames[3]  # the frame of seq 2 (the header frame first)
    text = decompressor().decompress(data[start:end])
    assert b"message 002" in text
    forged = compressor().compress(text.replace(b"message 002", b"massage 002"))
    log.write_bytes(data[:start] + forged + data[end:])
    out = _cli(tmp_path, url, "s1")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "CHAIN_EVENTS" in out.stdout and "seq 2..2" in out.stdout
    assert f"pid {os.getpid()}" in out.stdout


def test_a_consistent_truncation_of_frames_and_sidecar_fails_the_kept_proof(
        tmp_path: Path) -> None:
    url, log = _write_store(tmp_path, "jsonl+zstd", BATCHES)
    kept = _keep_proof(tmp_path, url)
    data = log.read_bytes()
    frames, _ = scan_zstd_frames(data, path=str(log))
    log.write_bytes(data[:frames[-2][0]])  # the last two batches' frames removed
    sidecar = log.with_name(log.name + ".seal")
    found = _seal.read_seal(sidecar)
    assert found is not None
    _seal.reset_seal(sidecar, b"", [], chain=_chain.ChainState(found.chain[:BATCHES - 2]))
    for name in (JOURNAL_NAME, INDEX_NAME):  # and the listing's record of the log's size
        (tmp_path / "store" / name).unlink(missing_ok=True)
    assert _cli(tmp_path, url, "s1").returncode == 0  # the store alone cannot tell
    out = _cli(tmp_path, url, "--against", str(kept))
    assert out.returncode == 1
    assert "PROOF_TRUNCATED" in out.stdout and "batches 4..5 were removed" in out.stdout


def test_an_erased_session_keeps_its_chain_and_the_kept_proof(tmp_path: Path) -> None:
    url, log = _write_store(tmp_path, "jsonl+zstd", BATCHES)
    kept = _keep_proof(tmp_path, url)
    before = _chain_of(log)
    with dsh.open(url) as store:
        erase(store, ["s1"])
    after = _chain_of(log)
    assert [r.hash for r in after[:BATCHES]] == [r.hash for r in before]
    assert all(r.keys[:1] == b"\1" for r in after[:BATCHES])  # opened: erased events' leaves
    out = _cli(tmp_path, url, "s1", "--against", str(kept))
    assert out.returncode == 0, out.stdout + out.stderr


_WRITER = """
import sys
import dsh

url = sys.argv[1]
with dsh.open(url) as store:
    session = store.session("s1")
    for n in range(100000):
        session.append("user/message", {"id": f"u{n}", "role": "user", "source": {"kind":
                       "user"}, "content": [{"type": "text", "text": f"m {n}"}]},
                       surface_op="append")
        store.flush(session)
        if n == 20:
            print("ready", flush=True)
"""


def test_a_writer_killed_between_flushes_leaves_a_chain_that_verifies(tmp_path: Path) -> None:
    url = f"jsonl+zstd://{tmp_path}/store"
    with subprocess.Popen([sys.executable, "-c", _WRITER, url], stdout=subprocess.PIPE,
                          text=True) as child:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    out = _cli(tmp_path, url, "s1", "--proof", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    proof = json.loads(out.stdout)["proof"]["sessions"][0]
    assert proof["batches"] >= 21 and proof["gaps"] == []
    kept = tmp_path / "proof.json"
    kept.write_text(out.stdout, encoding="utf-8")
    with dsh.open(url) as store:  # the next writer chains on from the last durable record
        session = store.session("s1")
        session.append("user/message", user("after"), surface_op="append")
        store.flush(session)
    assert _cli(tmp_path, url, "s1", "--against", str(kept)).returncode == 0


_REWRITE_KILLED = """
import os, signal, sys
import dsh
from dsh.persistence.jsonl import _backend as jsonl_backend
from dsh.rights import redact

url, at = sys.argv[1], sys.argv[2]
real = os.replace


def replace(src, dst, **kw):
    if os.path.basename(str(dst)) == at:  # SIGKILL just before this rename
        os.kill(os.getpid(), signal.SIGKILL)
    real(src, dst, **kw)


jsonl_backend.os.replace = replace
with dsh.open(url) as store:
    redact(store, "s1", match="message 003")
"""


@pytest.mark.parametrize("at", ["session.jsonl.zstd", "session.jsonl.zstd.seal"])
def test_a_rewrite_killed_between_its_renames_keeps_the_chain(tmp_path: Path, at: str) -> None:
    """Killed with the old sidecar aside: a reader uses, a writer takes back, the fitting one."""
    url, log = _write_store(tmp_path, "jsonl+zstd", BATCHES)
    kept = _keep_proof(tmp_path, url)
    killed = subprocess.run([sys.executable, "-c", _REWRITE_KILLED, url, at], check=False,
                            timeout=120)
    assert killed.returncode == -9
    sidecar = log.with_name(log.name + ".seal")
    assert not sidecar.exists()
    out = _cli(tmp_path, url, "s1", "--against", str(kept), "--proof", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    batches = json.loads(out.stdout)["proof"]["sessions"][0]["batches"]
    assert batches == (BATCHES if at == "session.jsonl.zstd" else BATCHES + 1)
    with dsh.open(url) as store:  # a writer takes the fitting sidecar back and chains on
        session = store.session("s1")
        session.append("user/message", user("more"), surface_op="append")
        store.flush(session)
    assert len(_chain_of(log)) == batches + 1
    assert not list(log.parent.glob(".session.jsonl.zstd.seal.*.tmp"))
    assert _cli(tmp_path, url, "s1", "--against", str(kept)).returncode == 0

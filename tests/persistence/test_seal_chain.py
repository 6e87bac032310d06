"""The seal's hash chain on real files (docs/formats.md#the-seal-chain, docs/cli.md#chain-proofs).

Raw JSONL and SQLite sessions are written through the public API, then their logs or seals
are modified, cut, reordered or truncated the way a person with write access could: seal
damage is named as seal damage (``SEAL_*``, the seal's path, seq, batch and writer), a log
whose checksums were forged along with it is caught by the chain (``CHAIN_EVENTS``), and a
consistent rebuild of both is caught by a kept proof (``PROOF_*``). Erased and redacted
sessions still verify, against the proof kept before.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh import LogCorruptError, SealDamagedError
from dsh.persistence import _chain, _seal
from dsh.persistence._proof import ChainProof
from dsh.persistence._proof import compare_proof as compare
from dsh.persistence._proof import prove_chain as prove
from dsh.rights import erase, redact
from tests.persistence import _seal_layout

URLS = {"jsonl": "jsonl://{root}/store", "sqlite": "sqlite:{root}/store.db"}
BATCHES = 6
DSH = [sys.executable, "-m", "dsh.cli"]


def user(text: str) -> dict[str, Any]:
    return {"id": f"u-{text}", "role": "user", "source": {"kind": "user"},
            "content": [{"type": "text", "text": text}]}


def _write(tmp_path: Path, backend: str, batches: int = BATCHES) -> tuple[str, Path]:
    url = URLS[backend].format(root=tmp_path)
    with dsh.open(url) as store:
        session = store.session("s1")
        for n in range(batches):
            session.append("user/message", user(f"message {n:03d}"), surface_op="append")
            store.flush(session)
    return url, _seal_file(tmp_path, backend)


def _seal_file(tmp_path: Path, backend: str) -> Path:
    if backend == "jsonl":
        [seal] = (tmp_path / "store").glob("*/*/session.jsonl.seal")
    else:
        seal = tmp_path / "store.db.dsh-seals" / "s1.seal"
    return seal


def _proof(url: str) -> tuple[ChainProof, list[str], list[_chain.ChainRecord]]:
    with dsh.open(url) as store:
        events = store.read("s1").events
        backend = store.persistence.backend
        seal, incarnation = backend.seal_chain("s1")  # type: ignore[attr-defined]
    proof, problems, records = prove("s1", seal, incarnation, events)
    return proof, [p.code for p in problems], records


def _chain_of(seal: Path) -> list[_chain.ChainRecord]:
    found = _seal.read_seal(seal)
    assert found is not None
    return found.chain


def _cli(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_")}
    env.update({"DSH_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)})
    return subprocess.run([*DSH, "verify", *args, "--store", url], env=env, text=True,
                          capture_output=True, timeout=120, check=False, cwd=tmp_path)


@pytest.mark.parametrize("backend", sorted(URLS))
def test_each_batch_is_one_chained_record_bound_to_writer_and_incarnation(
        tmp_path: Path, backend: str) -> None:
    url, seal = _write(tmp_path, backend)
    chain = _chain_of(seal)
    assert [(r.first, r.end) for r in chain] == [(n, n + 1) for n in range(BATCHES)]
    assert chain[0].prev == bytes(32)
    assert all(b.prev == a.hash for a, b in itertools.pairwise(chain))
    assert {(r.writer.pid, r.writer.host) for r in chain} == {(os.getpid(),
                                                              _chain.this_writer().host)}
    found = _seal.read_seal(seal)
    assert found is not None and found.head is not None
    assert (found.head.batches, found.head.hash) == (BATCHES, chain[-1].hash)  # at close
    proof, problems, _ = _proof(url)
    assert problems == []
    assert (proof.batches, proof.last_seq, proof.head) == (BATCHES, BATCHES - 1,
                                                           chain[-1].hash.hex())
    assert len({r.incarnation for r in chain}) == 1 and proof.incarnation == \
        chain[0].incarnation.hex()


@pytest.mark.parametrize("backend", sorted(URLS))
def test_a_seal_that_keeps_its_header_but_loses_records_is_seal_damage(
        tmp_path: Path, backend: str) -> None:
    url, seal = _write(tmp_path, backend)
    data = seal.read_bytes()
    last_chain = [pos for kind, pos, _ in _seal_layout.positions(data) if kind == "chain"][-2]
    seal.write_bytes(data[:last_chain])  # the last two batches' chain records are cut off
    with dsh.open(url) as store, pytest.raises(LogCorruptError) as caught:
        store.read("s1")
    error = caught.value
    assert isinstance(error, SealDamagedError) and error.code == "SEAL_TRUNCATED"
    assert error.where["path"] == str(seal)  # the seal is named, not the log
    assert error.where["batch"] == BATCHES - 2 and error.where["seq"] == BATCHES - 2
    assert "dsh verify --reseal" in error.message and "lost records" in error.message
    with dsh.open(url) as store:  # a writer refuses too: nothing is sealed over the damage
        with pytest.raises(LogCorruptError) as again:
            session = store.session("s1")
            session.append("user/message", user("more"), surface_op="append")
            store.flush(session)
        assert again.value.code == "SEAL_TRUNCATED"
    out = _cli(tmp_path, url, "s1", "--reseal")  # the way to recover
    assert out.returncode == 0, out.stdout + out.stderr
    with dsh.open(url) as store:
        assert len(store.read("s1").events) == BATCHES


@pytest.mark.parametrize("backend", sorted(URLS))
@pytest.mark.parametrize("damage", ["modified", "reordered", "deleted"])
def test_chain_records_changed_in_the_seal_are_named_by_batch_and_writer(
        tmp_path: Path, backend: str, damage: str) -> None:
    url, seal = _write(tmp_path, backend)
    data = bytearray(seal.read_bytes())
    chains = [(pos, size) for kind, pos, size in _seal_layout.positions(bytes(data))
              if kind == "chain"]
    (p2, s2), (p3, s3) = chains[2], chains[3]
    if damage == "modified":  # batch 2's record says it covers one more event; crc fixed
        record = _chain.decode_record(bytes(data), p2)
        assert record is not None
        forged = _chain.ChainRecord(record[0].prev, record[0].digest, record[0].first,
                                    record[0].end + 1, record[0].writer,
                                    record[0].incarnation, record[0].keys)
        assert len(forged.encode()) == s2
        data[p2:p2 + s2] = forged.encode()
        bad = 3  # batch 3 no longer links to it
    elif damage == "reordered":
        assert s2 == s3
        data[p2:p2 + s2], data[p3:p3 + s3] = data[p3:p3 + s3], data[p2:p2 + s2]
        bad = 2
    else:
        del data[p2:p2 + s2]
        bad = 2  # batch 3's record now follows batch 1's
    seal.write_bytes(bytes(data))
    with dsh.open(url) as store, pytest.raises(LogCorruptError) as caught:
        store.read("s1")
    error = caught.value
    assert isinstance(error, SealDamagedError) and error.code == "SEAL_CHAIN_BROKEN"
    assert error.where["path"] == str(seal) and error.where["batch"] == bad
    assert str(os.getpid()) in str(error.where["writer"])
    assert "does not link" in error.message


@pytest.mark.parametrize("backend", sorted(URLS))
def test_a_log_changed_with_forged_checksums_is_caught_by_the_chain(
        tmp_path: Path, backend: str) -> None:
    """The attacker edits an event and recomputes every checksum, keeping the chain."""
    url, seal = _write(tmp_path, backend)
    old = _seal.read_seal(seal)
    assert old is not None
    if backend == "jsonl":
        [log] = (tmp_path / "store").glob("*/*/session.jsonl")
        log.write_bytes(log.read_bytes().replace(b"message 003", b"MESSAGE 003"))
        content = log.read_bytes()
        records = [(0, len(content), _seal.crc_of(content))]
        identity = b""
    else:
        import sqlite3

        db = tmp_path / "store.db"
        conn = sqlite3.connect(db)
        conn.execute("UPDATE events SET data = replace(data, 'message 003', 'MESSAGE 003') "
                     "WHERE session_id = 's1'")
        conn.commit()
        rows = conn.execute("SELECT seq, type, time, data, source_event_seqs, surface_op, "
                            "ignorable FROM events WHERE session_id = 's1' ORDER BY seq"
                            ).fetchall()
        conn.close()
        records = [(0, len(rows), _seal.rows_crc(rows))]
        identity = old.identity
    _seal.reset_seal(seal, identity, records, chain=old.chain_state())
    with dsh.open(url) as store:  # the checksums hold: a read accepts the log
        assert "MESSAGE 003" in json.dumps(store.read("s1").events[3]["data"])
    _, problems, _ = _proof(url)
    assert problems == ["CHAIN_EVENTS"]
    out = _cli(tmp_path, url, "s1")
    assert out.returncode == 1
    assert "seq 3 CHAIN_EVENTS" in out.stdout and "seq 3..3" in out.stdout
    assert f"pid {os.getpid()}" in out.stdout


@pytest.mark.parametrize("backend", sorted(URLS))
def test_a_kept_proof_catches_a_consistent_truncation_and_names_batch_and_writer(
        tmp_path: Path, backend: str) -> None:
    url, seal = _write(tmp_path, backend)
    kept, _, _ = _proof(url)
    # the attacker removes the last two batches from the chain and publishes a matching head;
    # the seal is consistent again
    found = _seal.read_seal(seal)
    assert found is not None
    state = _chain.ChainState(found.chain[:BATCHES - 2])
    _seal.reset_seal(seal, found.identity, found.records, chain=state)
    now, problems, records = _proof(url)
    assert problems == []  # the store alone cannot tell
    [finding] = compare(kept.to_json(), now, records)
    assert finding.code == "PROOF_TRUNCATED" and finding.batch == BATCHES - 2
    assert finding.writer is not None and f"pid {os.getpid()}" in finding.writer
    assert "batches 4..5 were removed" in finding.message


@pytest.mark.parametrize("backend", sorted(URLS))
def test_verify_proof_prints_heads_and_against_names_a_rebuilt_chain(
        tmp_path: Path, backend: str) -> None:
    url, seal = _write(tmp_path, backend)
    out = _cli(tmp_path, url, "--all", "--proof")
    assert out.returncode == 0, out.stderr
    [line] = [x for x in out.stdout.splitlines() if x.startswith("proof ")]
    head = _chain_of(seal)[-1].hash.hex()
    assert f"head {head}" in line and f"batches {BATCHES}" in line and "last seq 5" in line
    out = _cli(tmp_path, url, "--all", "--proof", "--json")
    document = json.loads(out.stdout)
    assert document["proof"]["sessions"][0]["head"] == head
    kept = tmp_path / "proof.json"
    kept.write_text(out.stdout, encoding="utf-8")
    with dsh.open(url) as store:  # growth is fine
        session = store.session("s1")
        session.append("user/message", user("later"), surface_op="append")
        store.flush(session)
    out = _cli(tmp_path, url, "--against", str(kept))
    assert out.returncode == 0, out.stdout + out.stderr
    # the seal is moved aside and rebuilt over the log as it is: the chain starts again
    seal.unlink()
    assert _cli(tmp_path, url, "s1", "--reseal").returncode == 0
    out = _cli(tmp_path, url, "--against", str(kept))
    assert out.returncode == 1
    assert "PROOF_CHANGED" in out.stdout and "batch 0" in out.stdout


@pytest.mark.parametrize("backend", sorted(URLS))
@pytest.mark.parametrize("how", ["erase", "redact"])
def test_an_erased_or_redacted_session_still_verifies_against_its_proof(
        tmp_path: Path, backend: str, how: str) -> None:
    url, _ = _write(tmp_path, backend)
    kept, _, _ = _proof(url)
    with dsh.open(url) as store:
        if how == "erase":
            erase(store, ["s1"])
        else:
            redact(store, "s1", seqs=[2])
        events = store.read("s1").events
    assert '"text": "message 002"' not in json.dumps([e["data"] for e in events])
    now, problems, records = _proof(url)
    assert problems == []
    assert now.batches == BATCHES + 1 and now.hashes[:BATCHES] == kept.hashes
    assert compare(kept.to_json(), now, records) == []
    # the tombstoned event keeps its leaf only: no key is left that opens it
    opened = records[2].keys
    assert opened[:1] == b"\1" and b"\0" + b"message 002" not in opened
    out = _cli(tmp_path, url, "s1")
    assert out.returncode == 0, out.stdout + out.stderr


def test_an_older_seal_without_a_chain_keeps_loading_and_the_next_writer_chains(
        tmp_path: Path) -> None:
    url, seal = _write(tmp_path, "jsonl")
    found = _seal.read_seal(seal)
    assert found is not None
    _seal.reset_seal(seal, b"", found.records)  # a DSHSEAL1 seal, as before the chain
    assert seal.read_bytes().startswith(b"DSHSEAL1")
    with dsh.open(url) as store:
        assert len(store.read("s1").events) == BATCHES
        session = store.session("s1")
        session.append("user/message", user("more"), surface_op="append")
        store.flush(session)
    upgraded = _seal.read_seal(seal)
    assert upgraded is not None and upgraded.version == 2
    proof, problems, _ = _proof(url)
    assert [r.first for r in upgraded.chain] == [BATCHES]  # the chain starts with the writer
    assert problems == [] and proof.first_seq == BATCHES and proof.batches == 1


@pytest.mark.parametrize("backend", sorted(URLS))
def test_a_crash_before_the_head_is_published_is_not_damage(tmp_path: Path,
                                                            backend: str) -> None:
    """Records appended after the last published head may be lost by a power cut."""
    url, seal = _write(tmp_path, backend)
    data = _seal_layout.unpublish(seal.read_bytes(), 2)
    last = [pos for kind, pos, _ in _seal_layout.positions(data) if kind == "range"][3]
    seal.write_bytes(data[:last])  # records from batch 3 on never reached the disk
    with dsh.open(url) as store:
        assert len(store.read("s1").events) == BATCHES
        session = store.session("s1")
        session.append("user/message", user("after"), surface_op="append")
        store.flush(session)
    proof, problems, records = _proof(url)
    assert problems == []
    assert proof.gaps == ((3, BATCHES),)  # committed to by the next record, not hidden
    assert records[-1].first == BATCHES


@pytest.mark.parametrize("backend", sorted(URLS))
def test_a_changed_log_is_log_damage_attributed_to_its_batch_and_writer(
        tmp_path: Path, backend: str) -> None:
    url, _ = _write(tmp_path, backend)
    if backend == "jsonl":
        [log] = (tmp_path / "store").glob("*/*/session.jsonl")
        log.write_bytes(log.read_bytes().replace(b"message 004", b"massage 004"))
    else:
        import sqlite3

        conn = sqlite3.connect(tmp_path / "store.db")
        conn.execute("UPDATE events SET data = replace(data, 'message 004', 'massage 004')")
        conn.commit()
        conn.close()
    out = _cli(tmp_path, url, "s1")
    assert out.returncode == 1
    assert "LOG_CORRUPT" in out.stdout and "SEAL_" not in out.stdout
    assert f"it lies in the batch of seq 4..4 written by {_chain.this_writer().host} pid " \
        f"{os.getpid()}" in out.stdout


@pytest.mark.no_speedups
def test_an_event_leaf_hashes_its_canonical_bytes_under_its_event_key() -> None:
    # docs/formats.md#the-seal-chain, with or without the C accelerator: keys in code point
    # order at every depth (the stored order does not count), lone surrogates escaped
    import hashlib

    from dsh.json import snapshot_json
    from dsh.session import Event

    batch_key = bytes(range(16))
    stored = {"type": "x/y", "seq": 7, "data": {"\ue000": 1.5, "b": ["\ud800", None],
                                                "a": {"z": True, "\U0001f600": -3}}}
    canonical = ('{"data":{"a":{"z":true,"\U0001f600":-3},"b":["\\ud800",null],"\ue000":1.5},'
                 '"seq":7,"type":"x/y"}').encode("utf-8", "surrogatepass")
    event_key = hashlib.sha256(batch_key + (7).to_bytes(8, "little")).digest()[:16]
    record = _chain.ChainRecord(bytes(32), bytes(32), 7, 8, _chain.Writer("h", 1), bytes(16),
                                b"\0" + batch_key)
    leaves = _chain.event_leaves(record, [Event(snapshot_json(stored))])
    assert leaves == [hashlib.sha256(event_key + canonical).digest()]


@pytest.mark.parametrize("backend", sorted(URLS))
def test_reseal_of_a_log_that_passes_its_seal_keeps_the_seal_and_its_chain(
        tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    url, seal = _write(tmp_path, backend)
    before = seal.read_bytes()
    kept = tmp_path / "proof.json"
    kept.write_text(_cli(tmp_path, url, "s1", "--proof", "--json").stdout, encoding="utf-8")
    out = _cli(tmp_path, url, "s1", "--reseal")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "kept: the log passes it" in out.stderr and "started again" not in out.stderr
    assert seal.read_bytes() == before  # nothing written: the chain goes on
    out = _cli(tmp_path, url, "--against", str(kept))
    assert out.returncode == 0, out.stdout + out.stderr
    # in process: one handle (the write handle) reads the log for the check and the reseal
    with dsh.open(url) as store:
        backend_ = store.persistence.backend
        modes: list[str] = []
        real_open = type(backend_).open

        def counting_open(self: Any, session_id: str, mode: Any) -> Any:
            modes.append(mode)
            return real_open(self, session_id, mode)

        monkeypatch.setattr(type(backend_), "open", counting_open)
        done = backend_.reseal("s1")  # type: ignore[attr-defined]
    assert (done.path, done.kept, modes) == (str(seal), True, ["write"])
    assert seal.read_bytes() == before


def _append_foreign(tmp_path: Path, backend: str, url: str) -> None:
    """Grow the session the way another program would: one more event, no seal record."""
    if backend == "jsonl":
        [log] = (tmp_path / "store").glob("*/*/session.jsonl")
        last = json.loads(log.read_bytes().splitlines()[-1])
        last["seq"] += 1
        with log.open("ab") as f:
            f.write(json.dumps(last, separators=(",", ":")).encode() + b"\n")
    else:
        import sqlite3

        conn = sqlite3.connect(tmp_path / "store.db")
        with conn:
            conn.execute("INSERT INTO events SELECT session_id, seq + 1, type, time, data, "
                         "source_event_seqs, surface_op, ignorable FROM events "
                         "WHERE seq = (SELECT MAX(seq) FROM events)")
        conn.close()


@pytest.mark.parametrize("backend", sorted(URLS))
def test_reseal_of_a_log_grown_past_its_seal_extends_the_seal_and_its_chain(
        tmp_path: Path, backend: str) -> None:
    # docs/formats.md#integrity-seals: the seal's records and chain are kept, and one more
    # chain record covers the events past its end, so a proof kept before still holds
    url, seal = _write(tmp_path, backend)
    old = _chain_of(seal)
    kept = tmp_path / "proof.json"
    kept.write_text(_cli(tmp_path, url, "s1", "--proof", "--json").stdout, encoding="utf-8")
    _append_foreign(tmp_path, backend, url)
    out = _cli(tmp_path, url, "s1", "--reseal")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "kept and extended" in out.stderr and "started again" not in out.stderr
    chain = _chain_of(seal)
    assert chain[:BATCHES] == old
    assert [(r.first, r.end) for r in chain[BATCHES:]] == [(BATCHES, BATCHES + 1)]
    out = _cli(tmp_path, url, "--against", str(kept))
    assert out.returncode == 0, out.stdout + out.stderr
    assert _proof(url)[1] == []  # every event chained, no gap
    out = _cli(tmp_path, url, "s1", "--reseal")  # now it covers the whole log: kept as is
    assert "kept: the log passes it" in out.stderr, out.stdout + out.stderr


def test_a_jsonl_reseal_extending_its_seal_reads_the_log_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # before: the check's read (through the seal) and then the whole log again to extend it;
    # now only the bytes past the seal are read again, with the same seal and chain as result
    from dsh.persistence.jsonl import _backend as jsonl_backend

    url, seal = _write(tmp_path, "jsonl")
    old = _chain_of(seal)
    _append_foreign(tmp_path, "jsonl", url)
    [log] = (tmp_path / "store").glob("*/*/session.jsonl")
    whole_reads: list[str] = []
    real = jsonl_backend._stable_read

    def counted(path: Path, *args: Any, **kwargs: Any) -> Any:
        whole_reads.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(jsonl_backend, "_stable_read", counted)
    with dsh.open(url) as store:
        done = store.persistence.backend.reseal("s1")  # type: ignore[attr-defined]
    assert done.kept and done.extended
    assert whole_reads == []  # the check's read was streamed; the extension read no whole log
    monkeypatch.undo()
    chain = _chain_of(seal)
    assert chain[:BATCHES] == old
    assert [(r.first, r.end) for r in chain[BATCHES:]] == [(BATCHES, BATCHES + 1)]
    out = _cli(tmp_path, url, "s1")  # the log passes its extended seal
    assert out.returncode == 0, out.stdout + out.stderr
    assert log.stat().st_size == _seal.read_seal(seal).records[-1][1]  # covers every byte


@pytest.mark.parametrize("backend", sorted(URLS))
def test_reseal_of_a_seal_that_lost_uncounted_records_extends_its_intact_records(
        tmp_path: Path, backend: str) -> None:
    # a crash took the last two batches' records before a head counted them: the log passes
    # the seal's intact records, which reseal keeps and extends (docs/formats.md#integrity-seals)
    url, seal = _write(tmp_path, backend, batches=BATCHES - 2)
    kept = tmp_path / "proof.json"
    kept.write_text(_cli(tmp_path, url, "s1", "--proof", "--json").stdout, encoding="utf-8")
    with dsh.open(url) as store:
        session = store.session("s1")
        for n in range(2):
            session.append("user/message", user(f"later {n}"), surface_op="append")
            store.flush(session)
        count = len(store.read("s1").events)  # the writer's own events (a resume's too)
    data = _seal_layout.unpublish(seal.read_bytes(), BATCHES - 2)
    _, pos, size = [p for p in _seal_layout.positions(data) if p[0] == "chain"][BATCHES - 3]
    seal.write_bytes(data[:pos + size])
    intact = _chain_of(seal)
    assert [r.end for r in intact] == list(range(1, BATCHES - 1))
    out = _cli(tmp_path, url, "s1", "--reseal")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "kept and extended" in out.stderr, out.stderr
    chain = _chain_of(seal)
    assert chain[:BATCHES - 2] == intact
    assert [(r.first, r.end) for r in chain[BATCHES - 2:]] == [(BATCHES - 2, count)]
    out = _cli(tmp_path, url, "--against", str(kept))
    assert out.returncode == 0, out.stdout + out.stderr
    assert _proof(url)[1] == []


@pytest.mark.parametrize("backend", sorted(URLS))
def test_reseal_of_a_lost_seal_starts_a_new_chain(tmp_path: Path, backend: str) -> None:
    url, seal = _write(tmp_path, backend)
    old_head = _chain_of(seal)[-1].hash
    seal.unlink()
    out = _cli(tmp_path, url, "s1", "--reseal")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rebuilt over the log as it is now" in out.stderr
    chain = _chain_of(seal)
    assert [(r.first, r.end) for r in chain] == [(0, BATCHES)] and chain[-1].hash != old_head


@pytest.mark.parametrize("seqs", [[0, 1, 2], [2, 3, 4], [0, 1, 2, 3], [0, 2, 3], [0, 1, 1, 2],
                                  [3, 4, 5], [1, 2], [], [0, 1, 2, 3, 4]])
def test_take_chains_the_same_record_with_and_without_the_contiguous_shortcut(
        seqs: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    # ChainState.take's common case (exactly the events start .. durable_end - 1) skips the
    # general path's dict and sorts; both give the same record and the same events left over
    from dsh.session._events import as_event

    monkeypatch.setattr(_chain.os, "urandom", lambda n: b"k" * n)  # the same batch key
    events = [as_event({"type": "x/y", "seq": s, "time": s, "data": {"n": s}}) for s in seqs]
    writer = _chain.this_writer()
    outcomes = []
    for shortcut in (True, False):
        if not shortcut:
            monkeypatch.setattr(_chain, "c_seqs_contiguous", None)
        state = _chain.ChainState([], pending=list(events))
        record = state.take(3, b"incarnation", writer)
        outcomes.append((record, [e["seq"] for e in state.pending], state.records))
    assert outcomes[0] == outcomes[1]
    if seqs == [0, 1, 2]:
        assert outcomes[0][0] is not None and outcomes[0][0].end == 3 and not outcomes[0][1]


@pytest.mark.parametrize("span", [(0, 3), (0, 2), (1, 3)])
def test_take_uses_a_digest_computed_at_encoding_only_for_exactly_its_seqs(
        span: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    # a SQLite append hands the chain the digest its one-pass encoding computed
    # (ChainState.digested): taken when the record covers exactly those seqs, else the
    # leaves are computed as before; either way the record verifies against the events
    from dsh.session._events import as_event

    events = [as_event({"type": "x/y", "seq": s, "time": s, "data": {"n": s, "a": [s]}})
              for s in range(3)]
    key = b"k" * 16
    real = _chain.new_record(None, events, b"incarnation", _chain.this_writer())
    digest = _chain.events_digest(
        _chain.ChainRecord(bytes(32), bytes(32), 0, 3, real.writer, real.incarnation,
                           b"\0" + key), events, 0, 3)
    state = _chain.ChainState([], pending=list(events),
                              digested=(*span, key, b"d" * 32 if span != (0, 3) else digest))
    monkeypatch.setattr(_chain.os, "urandom", lambda n: b"r" * n)
    record = state.take(3, b"incarnation", _chain.this_writer())
    assert record is not None and state.digested is None
    assert record.keys == b"\0" + (key if span == (0, 3) else b"r" * 16)
    assert record.digest == _chain.events_digest(record, events, 0, 3)

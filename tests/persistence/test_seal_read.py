"""Reading a seal: links checked as it is read, records built on use, a parse reused only for
the same bytes (docs/formats.md#the-seal-chain). Real files written through the public API."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsh import SealDamagedError
from dsh.persistence import _chain, _seal
from tests.persistence import _seal_layout
from tests.persistence.test_seal_chain import BATCHES, URLS, _write


@pytest.fixture(params=sorted(URLS))
def path(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The seal of a session written in BATCHES flushes, on each backend that keeps one."""
    return _write(tmp_path, request.param)[1]


def test_the_chain_read_is_the_records_the_file_holds(path: Path) -> None:
    data = path.read_bytes()
    stored = [_chain.decode_record(data, pos) for kind, pos, _ in _seal_layout.positions(data)
              if kind == "chain"]
    found = _seal.read_seal(path)
    assert found is not None and found.head is not None
    assert found.chain == [record for record, _ in filter(None, stored)]
    assert [r.hash for r in found.chain] == [r.hash for r, _ in filter(None, stored)]
    assert len(found.chain) == BATCHES and found.head.hash == found.chain[-1].hash


def test_a_seal_read_again_is_a_copy_and_a_changed_file_is_checked_again(path: Path) -> None:
    first = _seal.read_seal(path)
    assert first is not None
    records = list(first.records)
    first.records.append((99, 100, 0))  # what a writer does with the records it read
    first.restore_points.append(b"x" * 12)
    again = _seal.read_seal(path)
    assert again is not None and again.records == records and b"x" * 12 not in \
        again.restore_points
    assert again.chain == first.chain
    data = bytearray(path.read_bytes())
    chains = [pos for kind, pos, _ in _seal_layout.positions(bytes(data)) if kind == "chain"]
    data[chains[2]:chains[3]], data[chains[3]:chains[4]] = (data[chains[3]:chains[4]],
                                                            data[chains[2]:chains[3]])
    path.write_bytes(bytes(data))  # two records swapped: the same length, other bytes
    with pytest.raises(SealDamagedError) as caught:
        _seal.read_seal(path)
    assert caught.value.code == "SEAL_CHAIN_BROKEN" and caught.value.where["batch"] == 2

"""Seals survive a power cut: created durably, and a hole of unsynced records is not damage.

docs/formats.md#integrity-seals: the seal file is created through an fsynced temp file renamed
over it, then the folder is fsynced; records appended later are not synced one by one, so a
power cut under page-subset write-back can leave zeros where some records were and later
records after them. Such a crash state holds only acknowledged, intact events and must load.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh.persistence import _seal
from tests.persistence import _seal_layout


def user(text: str) -> dict[str, Any]:
    return {"id": f"u-{text}", "role": "user", "source": {"kind": "user"},
            "content": [{"type": "text", "text": text}]}


URLS = {"jsonl": "jsonl://{root}/store", "sqlite": "sqlite://{root}/store.db"}


def _seal_file(root: Path, backend: str) -> Path:
    if backend == "jsonl":
        [found] = (root / "store").glob("*/*/session.jsonl.seal")
    else:
        [found] = (root / "store.db.dsh-seals").iterdir()
    return found


@pytest.mark.parametrize("backend", sorted(URLS))
def test_seal_file_and_its_folder_are_fsynced_when_created(
        tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[tuple[str, bool]] = []  # the syscalls, recorded: (path, is a folder)
    real = os.fsync

    def recording(fd: int) -> None:
        info = os.fstat(fd)
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), stat.S_ISDIR(info.st_mode)))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    with dsh.open(URLS[backend].format(root=tmp_path)) as store:
        session = store.session("s1")
        session.append("user/message", user("a"), surface_op="append")
        store.flush(session)
    seal = _seal_file(tmp_path, backend)
    files = [path for path, folder in synced if not folder]
    assert any(Path(p).name.startswith(f".{seal.name}.") for p in files)  # main: none
    assert (str(seal.parent), True) in synced


@pytest.mark.parametrize("backend", sorted(URLS))
def test_zero_filled_hole_in_the_seal_loads_every_acknowledged_event(
        tmp_path: Path, backend: str) -> None:
    url = URLS[backend].format(root=tmp_path)
    with dsh.open(url) as store:
        session = store.session("s1")
        for n in range(6):
            session.append("user/message", user(f"m{n}"), surface_op="append")
            store.flush(session)
    seal = _seal_file(tmp_path, backend)
    # a crash: the head published last (at the first batch) counts one batch
    data = bytearray(_seal_layout.unpublish(seal.read_bytes(), 1))
    ranges = [pos for kind, pos, _ in _seal_layout.positions(bytes(data)) if kind == "range"]
    assert len(ranges) >= 4
    hole = ranges[2]  # the third record's page never reached the disk; later ones did
    data[hole:hole + 20] = bytes(20)
    seal.write_bytes(bytes(data))
    with dsh.open(url) as store:  # main: SEAL_CORRUPT, the whole session refused
        texts = [e["data"]["content"][0]["text"] for e in store.read("s1").events]
        assert texts == [f"m{n}" for n in range(6)]
        session = store.session("s1")  # the next writer seals the rest again
        session.append("user/message", user("m6"), surface_op="append")
        store.flush(session)
    repaired = _seal.read_seal(seal)
    assert repaired is not None and repaired.records[0][0] == 0
    with dsh.open(url) as store:
        assert len(store.read("s1").events) >= 7


def test_a_damaged_record_that_is_not_zeros_is_still_seal_damage(tmp_path: Path) -> None:
    url = URLS["jsonl"].format(root=tmp_path)
    with dsh.open(url) as store:
        session = store.session("s1")
        for n in range(4):
            session.append("user/message", user(f"m{n}"), surface_op="append")
            store.flush(session)
    seal = _seal_file(tmp_path, "jsonl")
    data = bytearray(seal.read_bytes())
    ranges = [pos for kind, pos, _ in _seal_layout.positions(bytes(data)) if kind == "range"]
    data[ranges[1] + 3] ^= 0x40  # the second record's start
    seal.write_bytes(bytes(data))
    with dsh.open(url) as store, pytest.raises(dsh.LogCorruptError) as caught:
        store.read("s1")
    assert caught.value.code == "SEAL_CORRUPT"
    assert "move it aside" in caught.value.message

"""Each bundled backend declares its capabilities, and each declared flag keeps its promise.

Rule: docs/stores.md#capabilities. The coordinator branches on ``backend.capabilities`` and
never probes a backend's class or attributes, so a flag that claims a protocol the backend
does not implement (or leaves one unclaimed) would send it down the wrong path.
"""

from __future__ import annotations

from pathlib import Path

from dsh.persistence import (
    Capabilities,
    Fenced,
    KeepsCuts,
    ListsEntries,
    NamesFiles,
    Persistence,
    ReadsRanges,
    Tails,
)
from dsh.persistence._after_commit import RecordsAfterCommit
from dsh.persistence._restore_point import KeepsRestorePoints

EXPECTED = {
    "memory": Capabilities(),
    "jsonl": Capabilities(restore_points=True, saved_cuts=True, listing=True, file_paths=True,
                          after_commit=True),
    "jsonl-zstd": Capabilities(restore_points=True, saved_cuts=True, listing=True,
                               file_paths=True, after_commit=True),
    "sqlite": Capabilities(restore_points=True, saved_cuts=True, listing=True, ranges=True,
                           after_commit=True),
    "postgresql": Capabilities(fenced=True, native_tail=True, ranges=True),
}


def test_declared_capabilities_match_the_protocols(store: Persistence, backend_kind: str,
                                                   tmp_path: Path) -> None:
    backend = store.backend
    caps = backend.capabilities
    assert caps == EXPECTED[backend_kind]
    assert caps.listing == isinstance(backend, ListsEntries)
    assert caps.saved_cuts == isinstance(backend, KeepsCuts)
    assert caps.native_tail == isinstance(backend, Tails)
    store.create({"version": 0, "id": "s", "createdAt": 1})
    with store.open("s", "write") as handle:
        assert caps.restore_points == isinstance(handle, KeepsRestorePoints)
        assert caps.fenced == isinstance(handle, Fenced)
        assert caps.file_paths == isinstance(handle, NamesFiles)
        assert caps.ranges == isinstance(handle, ReadsRanges)
        assert caps.after_commit == isinstance(handle, RecordsAfterCommit)
    if caps.fenced:
        store.create({"version": 0, "id": "t", "createdAt": 1})
        with store.open("t", "write") as handle:
            assert store.writer_epoch("t") == 0  # no live writer through the facade
            assert isinstance(handle, Fenced) and handle.epoch is not None and handle.epoch >= 1


def test_a_plain_backend_is_served_by_full_reads(tmp_path: Path) -> None:
    # Capabilities() is the memory backend: listing reads each log, no restore point.
    from dsh.persistence import open_backend

    with Persistence(open_backend("memory:")) as store:
        assert store.backend.capabilities == Capabilities()
        store.create({"version": 0, "id": "s", "createdAt": 1})
        assert store.write_restore_point("s") is False
        entries, errors = store.list_entries()
        assert (entries, errors) == ([], [])  # a session without events is not listed

"""Each bundled backend declares the capabilities it has (docs/stores.md#capabilities).

That each declared flag is kept (and none left undeclared) is a contract test every backend
runs (``BackendContract.test_declared_capabilities_are_kept``); this pins the bundled ones.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from dsh.persistence import Capabilities, Fenced, Persistence, open_backend

EXPECTED = {
    "memory": Capabilities(torn_tail_hook=True),
    "jsonl": Capabilities(restore_points=True, saved_cuts=True, listing=True, file_paths=True,
                          ranges=True, after_commit=True, search_index=True,
                          torn_tail_hook=True, reseal=True, rewrites=True,
                          change_stamp=True),
    # a Zstandard log serves no range (its handles answer -1 and None, as SQLite schema 14's);
    # one class: a zstd store's reseal says NO_SEAL (its frames carry checksums)
    "jsonl-zstd": Capabilities(restore_points=True, saved_cuts=True, listing=True,
                               file_paths=True, ranges=True, after_commit=True,
                               search_index=True, torn_tail_hook=True, reseal=True,
                               rewrites=True, change_stamp=True),
    "sqlite": Capabilities(restore_points=True, saved_cuts=True, listing=True, ranges=True,
                           after_commit=True, search_index=True, schema_version=True,
                           storable_check=True, torn_tail_hook=True, reseal=True,
                           rewrites=True, scrubs=True, asides=True, change_stamp=True),
    "postgresql": Capabilities(restore_points=True, fenced=True, native_tail=True, ranges=True,
                               search_index=True, schema_version=True, migrations=True,
                               torn_tail_hook=True, listing=True, rewrites=True,
                               scrubs=True, asides=True, whole_reads=True,
                               chain_records=True, change_stamp=True),
}


def test_bundled_backends_declare_what_they_have(store: Persistence, backend_kind: str) -> None:
    assert store.backend.capabilities == EXPECTED[backend_kind]
    if store.backend.capabilities.fenced:
        store.create({"version": 0, "id": "t", "createdAt": 1})
        with store.open("t", "write") as handle:
            assert isinstance(handle, Fenced) and handle.epoch is not None and handle.epoch >= 1
            assert store.writer_epoch("t") == 0  # no live writer through the facade


def test_a_plain_backend_is_served_by_full_reads() -> None:
    # The memory backend declares only the test hook: listing reads each log, no restore
    # point, a search reads every log.
    with Persistence(open_backend("memory:")) as store:
        assert store.backend.capabilities == Capabilities(torn_tail_hook=True)
        store.create({"version": 0, "id": "s", "createdAt": 1})
        assert store.write_restore_point("s") is False
        assert store.list_entries() == ([], [])  # a session without events is not listed


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_asides_are_kept_replaced_and_dropped(kind: str, tmp_path: Path) -> None:
    # docs/stores.md#asides: bytes beside one session's log, by name, never the log itself
    from dsh.testing._stores import postgres_unreachable, temporary_postgres_url

    if kind == "postgresql" and postgres_unreachable() is not None:
        pytest.skip(f"SKIPPED LOUDLY: {postgres_unreachable()}")
    with contextlib.ExitStack() as stack:
        url = (f"sqlite:///{tmp_path / 's.db'}" if kind == "sqlite"
               else stack.enter_context(temporary_postgres_url()))
        store = Persistence(open_backend(url))
        stack.callback(store.close)
        assert store.read_aside("a", "idx") is None  # nothing yet (no table, no folder)
        assert store.write_aside("a", "idx", b"one")
        assert store.write_aside("a", "idx", b"two")
        assert store.write_aside("a", "other", b"\x00\xff")
        assert store.write_aside("b", "idx", b"b's")
        assert (store.read_aside("a", "idx"), store.read_aside("a", "other")) == (
            b"two", b"\x00\xff")
        store.drop_asides("a")
        assert store.read_aside("a", "idx") is None and store.read_aside("a", "other") is None
        assert store.read_aside("b", "idx") == b"b's"
        # a head read: the bytes up to and including the first newline, b"" without one
        # (SQLite reads the file in parts: a head past the first part is whole too)
        long_head = b"h" * 40_000 + b"\n"
        assert store.write_aside("c", "idx", long_head + b"rest\nmore")
        assert store.write_aside("c", "flat", b"no newline")
        assert store.write_aside("c", "empty", b"")
        assert store.read_aside("c", "idx", head=True) == long_head
        assert store.read_aside("c", "flat", head=True) == b""
        assert store.read_aside("c", "empty", head=True) == b""
        assert store.read_aside("c", "none", head=True) is None
        assert store.read_aside("c", "idx") == long_head + b"rest\nmore"
        store.drop_asides("never")
    memory = Persistence(open_backend("memory:"))
    assert not memory.write_aside("a", "idx", b"x") and memory.read_aside("a", "idx") is None


def test_conforms_answers_as_isinstance_of_a_protocol_of_methods(tmp_path: Path) -> None:
    # conforms(obj, protocol) is decided once per class: the same answer as isinstance for
    # every backend and page-in source the cold read asks about
    from dsh.persistence import SelectsEvents, conforms
    from dsh.persistence._restore_point import OpensAtRestorePoint

    class Selects:
        def read_selected(self, start: int, stop: int, seqs: object, types: object) -> None:
            return None

    sqlite = open_backend(f"sqlite:///{tmp_path / 's.db'}")
    memory = open_backend("memory:")
    try:
        for obj in (sqlite, memory, Selects(), object()):
            for protocol in (OpensAtRestorePoint, SelectsEvents):
                assert conforms(obj, protocol) is isinstance(obj, protocol), (obj, protocol)
        assert conforms(Selects(), SelectsEvents) and not conforms(object(), SelectsEvents)
        assert not conforms(sqlite, OpensAtRestorePoint)  # (PostgreSQL's backend does)
    finally:
        sqlite.close()
        memory.close()


def test_conforms_answers_as_issubclass_for_dunder_inherited_and_none_members() -> None:
    # conforms checks the members itself (no issubclass): typing's rule, member by member
    from typing import Protocol, runtime_checkable

    from dsh.persistence import conforms

    @runtime_checkable
    class Closes(Protocol):
        def close(self) -> None: ...

    @runtime_checkable
    class Handles(Closes, Protocol):
        def __enter__(self) -> object: ...
        def read(self, offset: int) -> bytes: ...

    class Base:
        def close(self) -> None:
            return None

    class Full(Base):
        def __enter__(self) -> object:
            return self

        def read(self, offset: int) -> bytes:
            return b""

    class NoEnter(Base):
        def read(self, offset: int) -> bytes:
            return b""

    class Blocked(Full):
        read = None  # type: ignore[assignment]  # (None blocks a member, as typing says)

    for cls in (Base, Full, NoEnter, Blocked, object):
        for protocol in (Closes, Handles):
            assert conforms(cls(), protocol) is issubclass(cls, protocol), (cls, protocol)
    assert conforms(Full(), Handles) and not conforms(NoEnter(), Handles)
    assert not conforms(Blocked(), Handles) and conforms(Base(), Closes)


def test_conforms_keeps_no_class_alive() -> None:
    # before: functools.cache held every class conforms was asked about, for the process
    import gc
    import weakref

    from dsh.persistence import SelectsEvents, conforms

    class Passing:
        pass

    assert not conforms(Passing(), SelectsEvents)
    gone = weakref.ref(Passing)
    del Passing
    gc.collect()
    assert gone() is None

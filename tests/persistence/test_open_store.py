"""Store URLs (docs/stores.md#store-urls): ``jsonl:``, ``jsonl+zstd:``, ``sqlite:``, ``memory:``."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsh._errors import ConfigError
from dsh.persistence import Persistence, open_backend
from dsh.persistence._memory import MemoryBackend
from dsh.persistence.jsonl._backend import JsonlBackend

from .conftest import HAS_SQLITE


def test_open_store_jsonl_variants(tmp_path: Path) -> None:
    raw = open_backend(f"jsonl://{tmp_path}/a")
    assert isinstance(raw, JsonlBackend) and raw.compression == "none"
    assert raw.root == tmp_path / "a" and raw.pack_chunks
    for url in (f"jsonl+zstd://{tmp_path}/b", f"jsonl://{tmp_path}/b?compression=zstd"):
        backend = open_backend(url)
        assert isinstance(backend, JsonlBackend) and backend.compression == "zstd"
    unpacked = open_backend(f"jsonl://{tmp_path}/c?pack_chunks=false")
    assert isinstance(unpacked, JsonlBackend) and not unpacked.pack_chunks


def test_open_store_memory_and_facade() -> None:
    store = Persistence(open_backend("memory:"))
    assert isinstance(store.backend, MemoryBackend)
    assert store.url == "memory:"
    store.close()


@pytest.mark.parametrize(("url", "part"), [
    ("ftp://x/y", "'ftp'"),
    ("nothing", "no scheme"),
    ("jsonl://host/dir", "host 'host'"),
    ("jsonl:///d?compression=lz4", "compression='lz4'"),
    ("jsonl:///d?level=3", "'level'"),
    ("jsonl+zstd:///d?compression=none", "conflicts"),
    ("jsonl:///d?pack_chunks=maybe", "pack_chunks='maybe'"),
    ("memory:?x=1", "no options"),
    ("jsonl:", "no path"),
    # urllib refuses these hosts with a bare ValueError: a typed error naming them instead
    ("sqlite://[x/d.db", "host '[x'"),
    ("sqlite://[x/d.db?schema=17", "does not parse as a URL"),
])
def test_open_store_rejects_bad_urls_naming_the_part(url: str, part: str) -> None:
    with pytest.raises(ConfigError) as info:
        open_backend(url)
    assert part in str(info.value)


@pytest.mark.skipif(not HAS_SQLITE, reason="dsh.persistence.sqlite._backend not available")
def test_open_store_sqlite_absolute_and_relative(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    absolute = Persistence(open_backend(f"sqlite://{tmp_path}/a.db"))
    absolute.create({"version": 0, "id": "s", "createdAt": 1})
    absolute.close()
    monkeypatch.chdir(tmp_path)
    relative = Persistence(open_backend("sqlite:rel.db"))
    relative.create({"version": 0, "id": "s", "createdAt": 1})
    relative.close()
    assert (tmp_path / "rel.db").exists()


def test_store_path_names_the_file_or_folder_without_creating_it(tmp_path: Path) -> None:
    from dsh.persistence import store_path

    assert store_path(f"sqlite://{tmp_path / 'x.db'}") == tmp_path / "x.db"
    assert store_path(f"jsonl+zstd://{tmp_path / 'd'}?compression=zstd") == tmp_path / "d"
    assert store_path("sqlite:rel.db") == Path("rel.db")
    assert store_path("memory:") is None
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="unknown scheme"):
        store_path("bogus://x")


@pytest.mark.parametrize("scheme", ["sqlite", "jsonl", "jsonl+zstd", "memory"])
def test_a_store_url_with_a_fragment_is_refused_naming_it(tmp_path: Path, scheme: str) -> None:
    # docs/stores.md#store-urls: a '#' ends a URL's path, and the fragment after it names no
    # part of a store: 'sqlite:///dir/notes#2.db' opened (and created) dir/notes, quietly
    from dsh.persistence._urls import store_path

    url = "memory:#x" if scheme == "memory" else f"{scheme}://{tmp_path}/notes#2.db"
    with pytest.raises(ConfigError, match="fragment") as found:
        open_backend(url)
    assert "'#x'" in found.value.message or "'#2.db'" in found.value.message
    assert "%23" in found.value.message
    with pytest.raises(ConfigError, match="fragment"):  # memory too: as open_backend
        store_path(url)
    assert list(tmp_path.iterdir()) == []  # nothing created
    if scheme == "sqlite":  # written %23, the '#' is part of the file's name
        backend = open_backend(f"sqlite://{tmp_path}/notes%232.db")
        backend.close()
        assert (tmp_path / "notes#2.db").exists()

"""Persistence: backends behind one handle contract, write-behind, cold load and resume.

A store is named by a URL (docs/stores.md#store-urls) and opened with ``dsh.open(url)``; its
``store.persistence`` is the :class:`~dsh.persistence._facade.Persistence` facade over the
backend the URL names (``Persistence(open_backend(url))`` builds one alone):

* ``jsonl:///abs/dir`` — dsh's JSONL layout, raw (docs/formats.md#jsonl);
* ``jsonl+zstd:///abs/dir`` or ``jsonl:///abs/dir?compression=zstd`` — Zstandard frames
  (docs/formats.md#zstandard-files); ``?pack_chunks=false`` writes one event per line
  (docs/formats.md#record-lines);
* ``sqlite:///abs/path.db`` or ``sqlite:relative.db`` — dsh's SQLite schema
  (docs/formats.md#sqlite); a new file is schema 17, or with ``?schema=14`` the layout the published
  dsh SQLite backend reads;
* ``postgresql://user@host/db?schema=name`` — many hosts, fenced writers (``postgres`` extra);
* ``memory:`` — an in-process store for tests.

Besides handles, the facade offers whole-session operations on stored logs:
``Persistence.list_headers()`` (headers only), ``list()`` (summaries), ``read(id)`` (the cold
read pipeline, nothing written: an :class:`Inspection` with the closers kept apart),
``inspect(id)`` (the same plus full restore validation; a live id gives its snapshot),
``read_pages(persistence, id)`` (the same events, paged in through the restore point: O(tail)),
``load(id)`` (commits the crash repair), ``fork(source_id, boundary, child_id)`` (a stored child
of a stored parent; the parent is not written) and ``resume(store, id)``.

The public names are ``__all__`` (the backend contract); a name imported here as
``name as name`` and left out of it (``summarize``, ``session_id_problem``, ...) is for dsh's
own packages, not public API.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Literal
from urllib.parse import parse_qsl, urlsplit

from dsh._errors import ConfigError
from dsh.persistence._contract import STORE_LOG_ID as STORE_LOG_ID
from dsh.persistence._contract import (
    Backend,
    Capabilities,
    ColdRead,
    Handle,
    OpenMode,
    SessionSummary,
    TornTail,
)

# the protocols a declared capability promises, for dsh's own packages
from dsh.persistence._contract import ChecksStorable as ChecksStorable
from dsh.persistence._contract import Fenced as Fenced
from dsh.persistence._contract import HoldsResume as HoldsResume
from dsh.persistence._contract import InjectsTornTail as InjectsTornTail
from dsh.persistence._contract import KeepsAsides as KeepsAsides
from dsh.persistence._contract import KeepsChain as KeepsChain
from dsh.persistence._contract import KeepsCuts as KeepsCuts
from dsh.persistence._contract import KeptChain as KeptChain
from dsh.persistence._contract import ListsEntries as ListsEntries
from dsh.persistence._contract import Migrates as Migrates
from dsh.persistence._contract import NamesFiles as NamesFiles
from dsh.persistence._contract import ReadsRanges as ReadsRanges
from dsh.persistence._contract import ReadsWhole as ReadsWhole
from dsh.persistence._contract import Reseals as Reseals
from dsh.persistence._contract import Rewrites as Rewrites
from dsh.persistence._contract import SchemaVersioned as SchemaVersioned
from dsh.persistence._contract import Scrubs as Scrubs
from dsh.persistence._contract import StampsChanges as StampsChanges
from dsh.persistence._contract import Tails as Tails
from dsh.persistence._contract import conforms as conforms
from dsh.persistence._contract import session_id_problem as session_id_problem
from dsh.persistence._paths import replace_durably as replace_durably
from dsh.persistence._urls import no_scheme, refuse_fragment, store_path, url_path

if TYPE_CHECKING:
    from dsh.persistence._after_commit import RecordsAfterCommit as RecordsAfterCommit
    from dsh.persistence._facade import Persistence
    from dsh.persistence._listing import ListingEntry
    from dsh.persistence._listing import first_line as first_line
    from dsh.persistence._listing import removed_messages as removed_messages
    from dsh.persistence._listing import signature as signature
    from dsh.persistence._listing import summarize as summarize
    from dsh.persistence._pages import PicksRecords as PicksRecords
    from dsh.persistence._pages import RecordCut as RecordCut
    from dsh.persistence._pages import SelectsEvents as SelectsEvents
    from dsh.persistence._pages import StoredPages, read_pages
    from dsh.persistence._pages import readable_prefix as readable_prefix
    from dsh.persistence._proof import ChainProof as ChainProof
    from dsh.persistence._proof import chain_record_at as chain_record_at
    from dsh.persistence._proof import compare_proof as compare_proof
    from dsh.persistence._proof import prove_chain as prove_chain
    from dsh.persistence._read import Inspection
    from dsh.persistence._restore_point import KeepsRestorePoints as KeepsRestorePoints
    from dsh.persistence._restore_point import RestorePointRefused as RestorePointRefused
    from dsh.persistence._search import IndexesSearch as IndexesSearch
    from dsh.persistence._search import KnowsRemovals as KnowsRemovals
    from dsh.persistence._search import SearchHit, SearchResults, search
    from dsh.persistence._search import SearchIndex as SearchIndex
    from dsh.persistence._search import forget_search as forget_search
    from dsh.persistence._search import message_texts as message_texts
    from dsh.persistence._search import removal_marks as removal_marks
    from dsh.persistence._search import search_words as search_words
    from dsh.persistence._write_behind import WriteBehind

__all__ = [
    "Backend",
    "Capabilities",
    "ColdRead",
    "Handle",
    "Inspection",
    "ListingEntry",
    "OpenMode",
    "Persistence",
    "SearchHit",
    "SearchResults",
    "SessionSummary",
    "StoredPages",
    "TornTail",
    "WriteBehind",
    "open_backend",
    "open_store",
    "read_pages",
    "search",
    "store_path",
]

_LAZY = {"Inspection": "_read", "Persistence": "_facade", "WriteBehind": "_write_behind",
         "ListingEntry": "_listing", "summarize": "_listing", "signature": "_listing",
         "first_line": "_listing", "removed_messages": "_listing",
         "RestorePointRefused": "_restore_point", "StoredPages": "_pages",
         "SelectsEvents": "_pages", "RecordCut": "_pages", "PicksRecords": "_pages",
         "KeepsRestorePoints": "_restore_point", "RecordsAfterCommit": "_after_commit",
         "read_pages": "_pages", "readable_prefix": "_pages", "SearchHit": "_search",
         "SearchResults": "_search", "search": "_search", "message_texts": "_search",
         "search_words": "_search", "removal_marks": "_search", "KnowsRemovals": "_search",
         "forget_search": "_search", "IndexesSearch": "_search", "SearchIndex": "_search",
         "ChainProof": "_proof", "prove_chain": "_proof", "compare_proof": "_proof",
         "chain_record_at": "_proof"}
"""Names loaded on first use: ``import dsh.persistence`` stays free of the session layer."""

_BOOL = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def open_backend(url: str, *, create_schema: bool = True) -> Backend:
    """Open the backend a store URL names, without the facade.

    Args:
        url: ``jsonl:///dir``, ``jsonl+zstd:///dir``, ``jsonl:///dir?compression=zstd``,
            ``sqlite:///path.db``, ``sqlite:relative.db`` (``?schema=14`` creates a new file
            in the published dsh's schema 14), ``postgresql://...`` or ``memory:``.
        create_schema: PostgreSQL only: create the URL's ``?schema=`` on first use when it
            holds no dsh store (default); False refuses it then (ConfigError
            ``STORE_NOT_FOUND``) and creates nothing. File and memory stores ignore it.

    Returns:
        Backend: the opened backend.

    Raises:
        ConfigError: unknown scheme, query option, option value, a URL without a path, a
            file or memory store URL with a fragment, or a host urllib cannot parse (an
            unclosed ``[``); the message names the part.
    """
    if not isinstance(url, str) or ":" not in url:
        raise no_scheme(url)
    scheme = url.split(":", 1)[0].lower()
    rest = url.split(":", 1)[1].split("?", 1)[0].split("#", 1)[0]
    # (no "?": no query, and none of urllib's parse, 0.05 ms of a fresh process's first open)
    query: dict[str, str] = {}
    if "?" in url:
        try:
            query = dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))
        except ValueError as exc:  # urllib's own refusal ("Invalid IPv6 URL"), typed
            raise ConfigError(f"store URL {url!r} does not parse as a URL ({exc})",
                              path=url) from None
    if scheme not in ("postgresql", "postgres"):
        refuse_fragment(url)  # (the server's own URL syntax is psycopg's to read)
    if scheme == "memory":
        if query:
            raise ConfigError(f"store URL {url!r}: memory: takes no options, found "
                              f"{sorted(query)}", path=url)
        from dsh.persistence._memory import MemoryBackend
        return MemoryBackend(url=url)
    if scheme in ("postgresql", "postgres"):
        # Imported lazily: psycopg is the optional ``postgres`` extra.
        from dsh.persistence.postgres import open_postgres
        return open_postgres(url, create_schema=create_schema)
    if scheme in ("jsonl", "jsonl+zstd"):
        compression: Literal["none", "zstd"] = "zstd" if scheme == "jsonl+zstd" else "none"
        pack_chunks = True
        for key, value in query.items():
            if key == "compression":
                if value not in ("none", "zstd"):
                    raise ConfigError(f"store URL {url!r}: compression={value!r} is not "
                                      f"one of 'none', 'zstd'", path=url)
                if scheme == "jsonl+zstd" and value != "zstd":
                    raise ConfigError(f"store URL {url!r}: jsonl+zstd: conflicts with "
                                      f"compression={value!r}", path=url)
                compression = "zstd" if value == "zstd" else "none"
            elif key in ("pack_chunks", "packChunks"):
                if value.lower() not in _BOOL:
                    raise ConfigError(f"store URL {url!r}: {key}={value!r} is not a boolean "
                                      f"(true/false)", path=url)
                pack_chunks = _BOOL[value.lower()]
            else:
                raise ConfigError(f"store URL {url!r}: unknown option {key!r}; jsonl stores "
                                  f"take compression and pack_chunks", path=url)
        from dsh.persistence.jsonl import JsonlBackend
        return JsonlBackend(url_path(url, len(scheme), rest), compression=compression,
                            pack_chunks=pack_chunks, url=url)
    if scheme == "sqlite":
        schema = query.pop("schema", "17")
        if query:
            raise ConfigError(f"store URL {url!r}: unknown option(s) {sorted(query)} for "
                              f"sqlite: (it takes schema=17 or schema=14)", path=url)
        if schema not in ("14", "17"):
            raise ConfigError(f"store URL {url!r}: schema={schema!r} is not 17 (default) or 14 "
                              f"(readable by the published dsh SQLite backend)", path=url)
        # Imported lazily: the SQLite backend is optional at import time.
        from dsh.persistence.sqlite import SqliteBackend
        return SqliteBackend(url_path(url, len(scheme), rest), schema=int(schema))
    raise ConfigError(f"store URL {url!r}: unknown scheme {scheme!r}; expected jsonl, "
                      f"jsonl+zstd, sqlite, postgresql or memory", path=url)


def open_store(url: str) -> Persistence:
    """Deprecated: use ``dsh.open(url)``, whose ``store.persistence`` is this facade.

    Kept for one release; returns the :class:`Persistence` facade over the backend the URL
    names, as before (``Persistence(open_backend(url))``).

    Raises:
        ConfigError: the URL is malformed (see :func:`open_backend`).
    """
    import warnings

    warnings.warn("dsh.persistence.open_store(url) is deprecated; use dsh.open(url) (a "
                  "dsh.Store; store.persistence is the facade open_store gave)",
                  DeprecationWarning, stacklevel=2)
    from dsh.persistence._facade import Persistence
    return Persistence(open_backend(url))


def __getattr__(name: str) -> object:
    # Lazy re-exports keep `import dsh.persistence` free of the session-layer imports.
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    if not name.startswith("__"):
        # `dsh.persistence._facade.Persistence` works without importing the submodule
        # first, as help() and tab completion expect.
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

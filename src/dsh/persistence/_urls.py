"""Store URLs: which file or folder a URL names, parsed the same way everywhere.

``dsh.persistence.open_backend`` opens what a URL names; :func:`store_path` only says where it
is (docs/stores.md#store-urls).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

from dsh._errors import ConfigError

__all__ = ["no_scheme", "refuse_fragment", "store_path", "url_path"]


def url_path(url: str, scheme_len: int, rest: str) -> Path:
    """Path of ``scheme:///abs`` or ``scheme:relative`` (``scheme://host/…`` is refused)."""
    if rest.startswith("//"):
        netloc_and_path = rest[2:]
        slash = netloc_and_path.find("/")
        netloc = netloc_and_path if slash < 0 else netloc_and_path[:slash]
        if netloc not in ("", "localhost"):
            raise ConfigError(
                f"store URL {url!r} names host {netloc!r}; file stores take no host, "
                f"write {url[:scheme_len]}:///absolute/path",
                path=url)
        path = netloc_and_path[slash:] if slash >= 0 else ""
    else:
        path = rest
    if not path:
        raise ConfigError(f"store URL {url!r} has no path; expected "
                          f"{url[:scheme_len]}:///absolute/path", path=url)
    return Path(unquote(path)).expanduser()


def refuse_fragment(url: str) -> None:
    """Refuse a file or memory store URL with a fragment (docs/stores.md#store-urls).

    A ``#`` ends a URL's path, and what follows names no part of a store: dropped, it made
    ``sqlite:///dir/notes#2.db`` open (and create) ``dir/notes``. A ``#`` in a path is written
    ``%23``.

    Raises:
        ConfigError: the URL holds a ``#``, named with what follows it.
    """
    if "#" in url:
        fragment = url[url.index("#"):]
        raise ConfigError(f"store URL {url!r} has a fragment ({fragment!r}), which names no "
                          "part of a store; a '#' in a path is written %23", path=url)


def store_path(url: str) -> Path | None:
    """The file (SQLite) or folder (JSONL) a store URL names, or None (memory, PostgreSQL).

    Pure: nothing is opened or created, so a caller can tell whether a store exists yet.

    Raises:
        ConfigError: the URL has no scheme, an unknown scheme, a host, no path, or a
            fragment (a file or memory store URL, as :func:`dsh.persistence.open_backend`).
    """
    if not isinstance(url, str) or ":" not in url:
        raise no_scheme(url)
    scheme = url.split(":", 1)[0].lower()
    rest = url.split(":", 1)[1].split("?", 1)[0].split("#", 1)[0]
    if scheme in ("postgresql", "postgres"):
        return None
    if scheme == "memory":
        refuse_fragment(url)  # (as open_backend does)
        return None
    if scheme in ("jsonl", "jsonl+zstd", "sqlite"):
        refuse_fragment(url)
        return url_path(url, len(scheme), rest)
    raise ConfigError(f"store URL {url!r}: unknown scheme {scheme!r}; expected jsonl, "
                      f"jsonl+zstd, sqlite, postgresql or memory", path=url)


def no_scheme(url: object) -> ConfigError:
    """The error for a store URL without a scheme, with the URL a plain path would be."""
    hint = ""
    if isinstance(url, str) and url.strip():
        # The CLI takes plain paths; the library wants the backend said, so show how.
        kind = "jsonl" if url.endswith("/") else "sqlite"
        hint = (f" (for this path: '{kind}:{url.rstrip('/') if kind == 'jsonl' else url}'; a "
                "SQLite file takes sqlite:PATH, a JSONL folder jsonl:PATH)")
    return ConfigError(f"store URL {url!r} has no scheme; expected jsonl:, jsonl+zstd:, "
                       f"sqlite:, postgresql:// or memory:{hint}", path=str(url))

"""Store URLs for tests: every bundled backend, PostgreSQL in a throw-away schema, damage.

PostgreSQL is found at ``$DSH_TEST_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``); each test store gets its own random schema
(named ``$DSH_TEST_POSTGRES_SCHEMA_PREFIX``, default ``dsh_test_``, then 12 hex digits), dropped
afterwards, so runs never see each other's sessions.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final, cast

from dsh._install import install_hint
from dsh.persistence import InjectsTornTail, Persistence

BUNDLED_BACKENDS: Final = ("memory", "jsonl", "jsonl-zstd", "sqlite", "postgresql")
DEFAULT_POSTGRES_URL: Final = "postgresql://postgres@127.0.0.1:5432/test"


def postgres_base_url() -> str:
    """``$DSH_TEST_POSTGRES_URL`` or :data:`DEFAULT_POSTGRES_URL` (no schema option)."""
    return os.environ.get("DSH_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)


def postgres_unreachable(url: str | None = None) -> str | None:
    """``None`` when a PostgreSQL server answers at ``url``, else why not (one sentence)."""
    try:
        import psycopg
    except ImportError:
        return f"psycopg is not installed ({install_hint('postgres')})"
    target = url or postgres_base_url()
    try:
        with psycopg.connect(target, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"no PostgreSQL server reachable at {target}: {str(exc).strip()}"
    return None


def _with_options(url: str, **options: object) -> str:
    query = "&".join(f"{k}={v}" for k, v in options.items() if v is not None)
    return f"{url}{'&' if '?' in url else '?'}{query}"


def drop_schema(url: str, schema: str) -> None:
    """Drop ``schema`` and everything in it (tear-down of :func:`temporary_postgres_url`)."""
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@contextlib.contextmanager
def temporary_postgres_url(base: str | None = None, *, lease_ms: int | None = None
                           ) -> Iterator[str]:
    """Yield a ``postgresql://`` store URL in a fresh schema; drop the schema afterwards.

    Args:
        base: Server URL without a ``schema`` option (default :func:`postgres_base_url`).
        lease_ms: Lease length (ms) to put in the URL, or the backend default.
    """
    server = base or postgres_base_url()
    prefix = os.environ.get("DSH_TEST_POSTGRES_SCHEMA_PREFIX", "dsh_test_")
    schema = f"{prefix}{uuid.uuid4().hex[:12]}"
    try:
        yield _with_options(server, schema=schema, lease_ms=lease_ms)
    finally:
        drop_schema(server, schema)


def store_url(kind: str, tmp_path: Path, *, postgres: str | None = None) -> str:
    """The URL of a fresh store of ``kind`` (one of :data:`BUNDLED_BACKENDS`) under ``tmp_path``.

    Args:
        kind: ``memory``, ``jsonl``, ``jsonl-zstd``, ``sqlite`` or ``postgresql``.
        tmp_path: A private folder for file stores.
        postgres: For ``postgresql``: the URL from :func:`temporary_postgres_url`.

    Raises:
        ValueError: an unknown kind, or ``postgresql`` without ``postgres``.
    """
    if kind == "memory":
        return "memory:"
    if kind == "jsonl":
        return f"jsonl://{tmp_path}/jsonl"
    if kind == "jsonl-zstd":
        return f"jsonl+zstd://{tmp_path}/jsonl-zstd"
    if kind == "sqlite":
        return f"sqlite://{tmp_path}/store.db"
    if kind == "postgresql" and postgres is not None:
        return postgres
    raise ValueError(f"unknown store kind {kind!r} (or postgresql without a server URL)")


def inject_torn_tail(persistence: Persistence, session_id: str) -> bool:
    """Leave a never-committed partial record after the log, in the backend's own form.

    JSONL: half a line (raw) or a frame cut short (zstd) appended to the file; SQLite and
    PostgreSQL: an undecodable row after the last one; memory: a marked torn tail. Returns
    ``False`` if the backend declares no such hook (``Capabilities.torn_tail_hook``).
    """
    backend = persistence.backend
    if not backend.capabilities.torn_tail_hook:
        return False
    cast(InjectsTornTail, backend).inject_torn_tail(session_id)
    return True

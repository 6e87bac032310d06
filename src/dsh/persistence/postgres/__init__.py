"""The PostgreSQL backend: many hosts, one fenced writer per session (the ``postgres`` extra).

Importing this package does not import psycopg: :func:`open_postgres` (and the backend class)
load ``_backend`` on first use. ``_schema`` holds the migrations and statements, without I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh._lazy import lazy_exports

if TYPE_CHECKING:
    from dsh.persistence.postgres._backend import PostgresBackend, open_postgres

__all__ = ["PostgresBackend", "open_postgres"]

__getattr__, __dir__ = lazy_exports(
    __name__, globals(), dict.fromkeys(__all__, "dsh.persistence.postgres._backend"), __all__)

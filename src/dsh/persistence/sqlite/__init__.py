"""The SQLite backend: one database file per store, schema 14 (the published dsh's) or 17.

Its modules are private to this package: ``_schema`` (DDL, row codec, committed scan, no I/O),
``_backend`` (connections, locks, appends) and ``_restore_point`` (the O(tail) resume sidecar).
"""

from __future__ import annotations

from dsh.persistence.sqlite._backend import SqliteBackend

__all__ = ["SqliteBackend"]

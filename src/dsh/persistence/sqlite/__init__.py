"""The SQLite backend: one database file per store, schema 14 (the published dsh's) or 17.

Its modules are private to this package: ``_schema`` (DDL, row codec, committed scan, no I/O),
``_backend`` (connections, locks, appends) and ``_restore_point`` (the O(tail) resume sidecar).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh._lazy import lazy_exports

# The row codec the PostgreSQL backend shares (its rows are SQLite schema 17's), for dsh's
# own packages only (not in __all__):
from dsh.persistence.sqlite._schema import MAX_PACKED_ROW_MEMBERS as MAX_PACKED_ROW_MEMBERS
from dsh.persistence.sqlite._schema import SCHEMA_VERSION as SCHEMA_VERSION
from dsh.persistence.sqlite._schema import RowError as RowError
from dsh.persistence.sqlite._schema import decode_row as decode_row
from dsh.persistence.sqlite._schema import decode_session_row as decode_session_row
from dsh.persistence.sqlite._schema import encode_batch as encode_batch
from dsh.persistence.sqlite._schema import scan_rows as scan_rows

if TYPE_CHECKING:
    from dsh.persistence.sqlite._backend import SqliteBackend

__all__ = ["SqliteBackend"]

# The backend is loaded on first use: the PostgreSQL backend imports only the row codec.
__getattr__, __dir__ = lazy_exports(
    __name__, globals(), {"SqliteBackend": "dsh.persistence.sqlite._backend"}, __all__)

"""The JSONL backend: one folder per session, raw or Zstandard-framed lines, sidecars beside it.

Its modules are private to this package: ``_format`` (pure functions over bytes), ``_backend``
(files, locks, appends, torn tails) and ``_restore_point`` (the O(tail) resume sidecar).
"""

from __future__ import annotations

from dsh.persistence.jsonl._backend import JsonlBackend
from dsh.persistence.jsonl._format import is_project_dir_name

__all__ = ["JsonlBackend", "is_project_dir_name"]

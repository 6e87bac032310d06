"""The ``dsh`` command: import, list, show, verify, repair, fork, compact, export, convert."""

from __future__ import annotations

from dsh.cli._entry import main

__all__ = ["main"]

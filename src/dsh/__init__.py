"""dsh: the durable memory of AI agents — one append-only event log per session."""

from __future__ import annotations

__all__: list[str] = []

"""Named points where a crash test may stop the process (test support only).

A fault-injection test installs a hook with :func:`set_failpoint_hook` in a child process; the
hook is called with the name of every point reached, and may report it, block, or SIGKILL the
process there. Without a hook every point is a no-op costing one global read. The points are
listed where they are passed: the agent's in ``dsh.agent._failpoints``; a SQLite rewrite's
(``sqlite.rewrite.staged``, ``sqlite.rewrite.commit``, ``sqlite.rewrite.committed``) in
docs/formats.md#integrity-seals; a PostgreSQL rewrite's (``postgres.rewrite.commit``: rows and
chain replaced, not committed; ``postgres.rewrite.committed``) in
docs/formats.md#tables-and-migrations.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["failpoint", "set_failpoint_hook"]

_hook: Callable[[str], None] | None = None


def set_failpoint_hook(hook: Callable[[str], None] | None) -> None:
    """Install ``hook(point)`` (called at every point reached), or remove it with None."""
    global _hook
    _hook = hook


def failpoint(point: str) -> None:
    """Report reaching ``point`` to the installed hook, if any."""
    hook = _hook
    if hook is not None:
        hook(point)

"""``dsh.open(url)``: a ready :class:`~dsh.session.SessionStore` over a store URL, one object.

Without it a user holds two objects (``open_store(url)`` and ``SessionStore(persistence=…)``)
and must close the right one; here the store owns its persistence and closing it closes both.
"""

from __future__ import annotations

from dsh.persistence import open_backend
from dsh.persistence._facade import Persistence
from dsh.persistence._write_behind import WriteBehind
from dsh.session import Clock, SessionStore

__all__ = ["open"]


def open(url: str, *, write_behind: WriteBehind | None = None,
         clock: Clock | None = None) -> SessionStore:
    """Open the store at ``url`` and return a :class:`SessionStore` bound to it.

    Use it as a context manager: ``with dsh.open("sqlite:///path/sessions.db") as store:``;
    ``store.session(id)`` resumes a stored session or creates it, appends are written behind
    (``write_behind``, default a 200 ms window) and leaving the block drains every live
    session to disk and closes the backend (:meth:`SessionStore.close`). A store never closed
    is drained at interpreter exit.

    Args:
        url: ``sqlite:///abs/path.db`` (or ``sqlite:relative.db``), ``jsonl:///dir``,
            ``jsonl+zstd:///dir`` or ``memory:``.
        write_behind: Batching of background writes (window in ms, batch limits).
        clock: Epoch-ms clock for new sessions and their events (default: wall clock).

    Returns:
        The open store; nothing is written until a session is created or appended to.

    Raises:
        ConfigError: the URL is malformed or names a path that cannot hold a store.
    """
    persistence = Persistence(open_backend(url), write_behind=write_behind)
    return SessionStore(persistence=persistence, clock=clock)

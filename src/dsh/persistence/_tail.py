"""Following a stored session as it grows: ``Persistence.tail`` for any backend.

A backend with its own ``tail(session_id, from_seq)`` async iterator (PostgreSQL: ``LISTEN`` /
``NOTIFY``) is used as it is; any other backend is polled through a read handle. Either way the
rule is the same: events come in seq order from ``from_seq`` on, each exactly once, and a gap
in what storage returns is an error, never skipped.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, cast

from dsh._errors import ConfigError, LogCorruptError
from dsh.persistence._contract import Backend, Handle, Tails
from dsh.session import Event

__all__ = ["DEFAULT_POLL_MS", "follow", "tail"]

DEFAULT_POLL_MS: Final = 200
"""Pause between reads of a backend without change notifications (ms)."""


async def tail(backend: Backend, session_id: str, from_seq: int = 0, *,
               poll_ms: int | None = None) -> AsyncIterator[Event]:
    """Yield the committed events of ``session_id`` from ``from_seq`` on, then each new one.

    Runs until the consumer stops iterating (``break``, cancellation). Reads run in a worker
    thread, so the event loop is never blocked.

    Args:
        backend: The store's backend.
        session_id: Session to follow.
        from_seq: First seq wanted (events before it are not yielded), ``>= 0``.
        poll_ms: How often to look without a notification (ms, ``>= 1``); default 200 for
            polled backends, the backend's own default otherwise.

    Raises:
        ConfigError: a negative ``from_seq`` or a bad ``poll_ms``.
        SessionNotFoundError: no such session.
        LogCorruptError: storage returned a seq other than the next one expected.
    """
    if type(from_seq) is not int or from_seq < 0:
        raise ConfigError(f"tail from_seq must be a non-negative integer, got {from_seq!r}",
                          session_id=session_id)
    if poll_ms is not None and (type(poll_ms) is not int or poll_ms < 1):
        raise ConfigError(f"tail poll_ms must be a positive integer (ms), got {poll_ms!r}",
                          session_id=session_id)
    if backend.capabilities.native_tail:
        native = cast(Tails, backend).tail
        kwargs = {} if poll_ms is None else {"poll_ms": poll_ms}
        async for event in native(session_id, from_seq, **kwargs):
            yield event
        return
    pause = (poll_ms or DEFAULT_POLL_MS) / 1000
    handle = backend.open(session_id, "read")
    try:
        async for event in follow(handle, from_seq, lambda: asyncio.sleep(pause)):
            yield event
    finally:
        handle.close()


async def follow(handle: Handle, from_seq: int, wait: Callable[[], Awaitable[object]]
                 ) -> AsyncIterator[Event]:
    """Read ``handle`` from ``from_seq`` on, awaiting ``wait()`` between reads, forever.

    Each read asks for the next expected seq only, so an event is yielded exactly once.

    Raises:
        LogCorruptError: storage returned a seq other than the next one expected.
    """
    cursor = from_seq
    while True:
        cold = await asyncio.to_thread(handle.read, cursor)
        for event in cold.events:
            if event["seq"] != cursor:
                raise LogCorruptError(
                    f"tail of session {handle.session_id!r} expected seq {cursor}, storage "
                    f"returned {event['seq']}", session_id=handle.session_id, seq=event["seq"])
            cursor += 1
            yield event
        await wait()

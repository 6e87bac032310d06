"""Bounded in-process caches: plain dicts kept in recency order, oldest dropped first.

A module-level cache that several threads share (seal bytes already vouched for, decoded
restore points) stays a ``dict``: insertion order is recency order when every put goes
through :func:`keep_recent`, and the bound holds after each put.
"""

from __future__ import annotations

from typing import TypeVar

_K = TypeVar("_K")
_V = TypeVar("_V")


def keep_recent(cache: dict[_K, _V], key: _K, value: _V, kept: int) -> None:
    """Put ``key`` last in ``cache`` with ``value``, then drop the oldest beyond ``kept``.

    Args:
        cache: The dict used as the cache (its insertion order is its recency order).
        key: The entry's key; an entry already there moves last.
        value: The entry's value.
        kept: Most entries left in ``cache`` (>= 1).

    Safe beside other threads doing the same (an entry another one dropped meanwhile is
    skipped); the bound then holds again at the next call.
    """
    cache.pop(key, None)
    cache[key] = value
    while len(cache) > kept:
        try:
            del cache[next(iter(cache))]
        except (KeyError, StopIteration, RuntimeError):  # another thread changed it meanwhile
            break

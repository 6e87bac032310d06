"""keep_recent: the bounded recency-order cache dsh's seal and restore-point readers share."""

from __future__ import annotations

from dsh._caches import keep_recent


def test_keep_recent_moves_a_put_key_last_and_drops_the_oldest_past_the_bound() -> None:
    cache: dict[str, int] = {}
    for key, value in (("a", 1), ("b", 2), ("c", 3)):
        keep_recent(cache, key, value, 3)
    keep_recent(cache, "a", 10, 3)  # a again: now the newest, b the oldest
    keep_recent(cache, "d", 4, 3)
    assert list(cache.items()) == [("c", 3), ("a", 10), ("d", 4)]
    keep_recent(cache, "e", 5, 1)  # a smaller bound drops all but the newest
    assert cache == {"e": 5}

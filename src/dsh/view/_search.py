"""Search for the viewer: one session's messages, and the store's sessions.

One session's search is a scan: case-insensitive substring matching over the text of its
appended messages (text, reasoning, tool calls and results), page by page through the paged
read. The store search matches the listing (id, title, cwd, source), then asks the store's
search index, the one ``dsh search`` uses (docs/stores.md#search).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from dsh import Event
from dsh.persistence import removed_messages
from dsh.view._data import ViewStore, iter_text

_SNIPPET_CHARS: Final = 80
"""Characters of context shown each side of a match."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Hit:
    """One match.

    Attributes:
        session_id: The session.
        seq: The event holding the match, or None for a match in the listing (title, id, cwd).
        role: ``user``, ``assistant``, ``tool``, ``system``, or the listing field matched.
        before: Text before the match (at most :data:`_SNIPPET_CHARS`).
        match: The matched text, as written.
        after: Text after it.
        removed: ``"clear"`` or ``"quarantine"`` for a message that left the model view (the
            page marks it: docs/view.md), else None.
    """

    session_id: str
    seq: int | None
    role: str
    before: str
    match: str
    after: str
    removed: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreResults:
    """A store-wide search's hits and how far it looked.

    Attributes:
        hits: The matches, listing matches first, then messages by session.
        sessions_searched: Sessions whose messages were read.
        sessions_total: Sessions in the store.
        complete: False when the search stopped at its limit or budget before the end.
    """

    hits: tuple[Hit, ...]
    sessions_searched: int
    sessions_total: int
    complete: bool


def _snippet(session_id: str, seq: int | None, role: str, text: str, at: int, size: int) -> Hit:
    start = max(0, at - _SNIPPET_CHARS)
    end = min(len(text), at + size + _SNIPPET_CHARS)
    return Hit(session_id=session_id, seq=seq, role=role,
               before=("…" if start else "") + " ".join(text[start:at].split(" ")),
               match=text[at:at + size],
               after=text[at + size:end] + ("…" if end < len(text) else ""))


def search_session(session_id: str, events: Sequence[Event], query: str, *,
                   limit: int = 200) -> tuple[Hit, ...]:
    """The matches of ``query`` in one session's appended messages, in seq order.

    Each hit in a message that left the model view is marked (``Hit.removed``).

    Args:
        session_id: The session's id (named in each hit).
        events: Its log (element ``i`` at seq ``i``; a paged log is read page by page).
        query: Text to find, case-insensitively; blank finds nothing.
        limit: Hits returned at most (one per message).
    """
    needle = query.strip().casefold()
    if not needle:
        return ()
    hits: list[Hit] = []
    for seq, role, text in iter_text(events):
        at = text.casefold().find(needle)
        if at >= 0:
            hits.append(_snippet(session_id, seq, role, text, at, len(needle)))
            if len(hits) >= limit:
                break
    if not hits:
        return ()
    # a hit in a message that left the model view is marked, as the store search marks it
    removed = removed_messages(events)
    return tuple(replace(hit, removed=removed.get(hit.seq)) if hit.seq in removed else hit
                 for hit in hits)


def search_store(store: ViewStore, query: str, *, limit: int = 100) -> StoreResults:
    """The matches of ``query`` across the store: the listing first, then the messages.

    The messages are found through the store's search index (:func:`dsh.persistence.search`,
    the one ``dsh search`` uses: SQLite FTS5 beside SQLite and JSONL stores, brought up to date
    with the logs that changed); a session that cannot be read is left out (its page names
    the damage).

    Args:
        store: The store.
        query: Words to find (all of them, the last also as a prefix); the listing (id, title,
            cwd, source) is matched case-insensitively as a substring. Blank finds nothing.
        limit: Hits returned at most.
    """
    needle = query.strip().casefold()
    infos, _ = store.listing()
    if not needle:
        return StoreResults(hits=(), sessions_searched=0, sessions_total=len(infos),
                            complete=True)
    hits: list[Hit] = []
    for info in infos:
        for role, value in (("id", info.id), ("title", info.title or ""),
                            ("cwd", info.cwd or ""), ("source", info.source)):
            at = value.casefold().find(needle)
            if at >= 0:
                hits.append(_snippet(info.id, None, role, value, at, len(needle)))
                break
        if len(hits) >= limit:
            return StoreResults(hits=tuple(hits), sessions_searched=0,
                                sessions_total=len(infos), complete=False)
    found = store.search(query, limit=limit - len(hits))
    hits.extend(Hit(session_id=hit.session_id, seq=hit.seq, role=hit.role, before=hit.before,
                    match=hit.match, after=hit.after, removed=hit.removed)
                for hit in found.hits)
    return StoreResults(hits=tuple(hits), sessions_searched=found.sessions - len(found.unreadable),
                        sessions_total=len(infos), complete=len(hits) < limit)

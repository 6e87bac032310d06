"""Fork lineage in a store: which sessions were forked from which, and the copies they hold.

A fork's first ``seedLength`` events are its own copy of its parent's (docs/rules.md#fork), so
a change to the parent's stored events does not reach them: a redaction warns of each fork
holding a copy (docs/forgetting.md#redaction), an erasure tombstones them
(docs/forgetting.md#erasure). Both walk the same parent → children map, built here from the
stored headers (``parentSession``, ``seedLength``) without reading any log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh.rights._held import HasPersistence, facade

if TYPE_CHECKING:
    from dsh.persistence import Persistence


def fork_children(store: Persistence | HasPersistence) -> dict[str, list[tuple[str, int]]]:
    """Each stored session's direct forks, with how many of its events each one copied.

    Args:
        store: A ``dsh.Store`` or its ``persistence`` facade.

    Returns:
        ``{parent id: [(child id, seedLength), ...]}``, children sorted by id; a child whose
        header has no integer ``seedLength`` copied nothing (0). Sessions without forks are
        absent.

    Raises:
        LogCorruptError: a stored header cannot be decoded (as ``list_headers``).

    Rule: docs/rules.md#fork (``parentSession``, ``seedLength``).
    """
    children: dict[str, list[tuple[str, int]]] = {}
    for header in facade(store).list_headers():
        parent, seed = header.get("parentSession"), header.get("seedLength")
        if isinstance(parent, str):
            children.setdefault(parent, []).append(
                (str(header["id"]), seed if type(seed) is int else 0))
    for forks in children.values():
        forks.sort()
    return children


def fork_copies(store: Persistence | HasPersistence, session_id: str,
                seqs: list[int]) -> list[tuple[str, str, list[int]]]:
    """The forks of ``session_id`` (transitively) that hold copies of its events at ``seqs``.

    A fork holds its parent's events below its ``seedLength``, and a fork of a fork only what
    its own parent held of them.

    Args:
        store: A ``dsh.Store`` or its ``persistence`` facade.
        session_id: The session whose events changed.
        seqs: The changed events' seqs.

    Returns:
        ``(fork id, its parent, the seqs it holds)`` in breadth-first order; ``[]`` when
        ``seqs`` is empty or no fork holds one.

    Raises:
        LogCorruptError: a stored header cannot be decoded.

    Rule: docs/forgetting.md#redaction (a redaction changes one session's log only).
    """
    if not seqs:
        return []
    children = fork_children(store)
    out: list[tuple[str, str, list[int]]] = []
    queue = [(session_id, max(seqs) + 1)]
    seen = {session_id}
    while queue:
        sid, reach = queue.pop(0)
        for child, seed in children.get(sid, []):
            held = [s for s in sorted(seqs) if s < min(seed, reach)]
            if held and child not in seen:
                seen.add(child)
                out.append((child, sid, held))
                queue.append((child, min(seed, reach)))
    return out

"""Tool-pairing balance at surface cut points: where compaction may cut the model's history.

A surface of N nodes has N + 1 cuts; cut i lies before node i. Walking the nodes with a counter
that each ``assistant/message`` raises by its number of ``tool-call`` blocks and each
``tool/result`` lowers by one, cut i + 1 is balanced iff the counter is 0 after node i; cut 0 is
always balanced (docs/rules.md#tool-pairing).

Invariants this module owns (docs/rules.md#tool-pairing): one cache per session, weakly held,
    describing one
surface generation; log-only growth costs no event reads; new surface nodes fold incrementally;
a replacement (new generation) or a shrunken surface rebuilds from scratch; a failed fold leaves
the previous cache untouched.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, Protocol

from dsh._errors import EventRejectedError
from dsh.session._events import Event


class PairingSurface(Protocol):
    """The surface state pairing reads: current node seqs and the replacement generation."""

    @property
    def nodes(self) -> Sequence[int]:
        """Seqs of the current surface nodes, in surface order."""
        ...

    @property
    def replace_generation(self) -> int:
        """Count of committed replacements; a change means positions were rewritten."""
        ...


class PairingSession(Protocol):
    """Anything with a contiguous ``events`` log and a ``surface`` (e.g. ``Session``)."""

    @property
    def events(self) -> Sequence[Event]:
        """The committed log; ``events[seq].seq == seq``."""
        ...

    @property
    def surface(self) -> PairingSurface:
        """The session's current surface."""
        ...


class _BalanceCache:
    """Balances of one surface generation: ``cut_balanced`` has covered-nodes + 1 entries."""

    __slots__ = ("cut_balanced", "generation", "in_progress", "index_by_seq")

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.cut_balanced: list[bool] = [True]
        self.index_by_seq: dict[int, int] = {}
        self.in_progress = 0


# Weakly keyed so a cache dies with its session; sessions that cannot be weakly referenced
# are answered from a fresh fold each time (correct, only slower).
_caches: weakref.WeakKeyDictionary[Any, _BalanceCache] = weakref.WeakKeyDictionary()


def _call_delta(event: Event) -> int:
    kind = event.get("type")
    if kind == "assistant/message":
        data = event.get("data")
        message = data.get("message") if isinstance(data, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            return 0
        return sum(1 for block in content
                   if isinstance(block, dict) and block.get("type") == "tool-call")
    if kind == "tool/result":
        return -1
    return 0


def _fold(session: PairingSession, nodes: Sequence[int], base: _BalanceCache | None,
          generation: int) -> _BalanceCache:
    """Fold ``nodes[covered:]`` onto a copy of ``base`` (or from scratch); validate, then build."""
    start = 0 if base is None else len(base.cut_balanced) - 1
    counter = 0 if base is None else base.in_progress
    events = session.events  # read the log once per fold
    new_balanced: list[bool] = []
    for position in range(start, len(nodes)):
        seq = nodes[position]
        event = events[seq] if type(seq) is int and 0 <= seq < len(events) else None
        if event is None or event.get("seq") != seq:
            raise EventRejectedError(
                f"tool-pairing balance: surface seq {seq} has no matching session event "
                "(corrupt surface)", code="CORRUPT_SURFACE", seq=seq)
        counter += _call_delta(event)
        if counter < 0:
            raise EventRejectedError(
                f"tool-pairing balance: tool/result at surface seq {seq} has no matching "
                "tool-call (corrupt surface)", code="CORRUPT_SURFACE", seq=seq)
        new_balanced.append(counter == 0)
    cache = _BalanceCache(generation) if base is None else base
    for offset, balanced in enumerate(new_balanced):
        cache.index_by_seq[nodes[start + offset]] = start + offset
        cache.cut_balanced.append(balanced)
    cache.in_progress = counter
    return cache


def _sync(session: PairingSession) -> _BalanceCache:
    """Bring the session's cache up to date with its surface (docs/rules.md#tool-pairing)."""
    surface = session.surface
    nodes = surface.nodes
    generation = surface.replace_generation
    try:
        cache = _caches.get(session)
        weak = True
    except TypeError:  # not weakly referenceable
        cache, weak = None, False
    if cache is None or cache.generation != generation or \
            len(cache.cut_balanced) - 1 > len(nodes):
        cache = _fold(session, nodes, None, generation)
        if weak:
            _caches[session] = cache
    elif len(nodes) > len(cache.cut_balanced) - 1:
        cache = _fold(session, nodes, cache, generation)
    return cache


def _position(session: PairingSession, seq: int) -> tuple[_BalanceCache, int]:
    cache = _sync(session)
    position = cache.index_by_seq.get(seq) if type(seq) is int else None
    if position is None:
        raise EventRejectedError(f"tool-pairing balance: surface seq {seq} not found in the "
                                 "current surface", code="SURFACE_SEQ_NOT_FOUND",
                                 seq=seq if type(seq) is int else None)
    return cache, position


def tool_pairing_balanced_before(session: PairingSession, seq: int) -> bool:
    """Return True when no tool call is open at the cut just before surface node ``seq``.

    Args:
        session: A session (anything matching :class:`PairingSession`).
        seq: The seq of a node in the session's *current* surface.

    Raises:
        EventRejectedError: ``seq`` is not a current surface node (code
            SURFACE_SEQ_NOT_FOUND); a node has no matching event or a ``tool/result`` has no
            open call before it (code CORRUPT_SURFACE).
    Rule: docs/rules.md#tool-pairing.
    """
    cache, position = _position(session, seq)
    return cache.cut_balanced[position]


def tool_pairing_balanced_after(session: PairingSession, seq: int) -> bool:
    """Return True when no tool call is open at the cut just after surface node ``seq``.

    Raises:
        EventRejectedError: as :func:`tool_pairing_balanced_before`.
    Rule: docs/rules.md#tool-pairing.
    """
    cache, position = _position(session, seq)
    return cache.cut_balanced[position + 1]


def balanced_cuts(session: PairingSession) -> tuple[bool, ...]:
    """Return the balance of every cut: N + 1 booleans for a surface of N nodes.

    Raises:
        EventRejectedError: code CORRUPT_SURFACE, as :func:`tool_pairing_balanced_before`.
    Rule: docs/rules.md#tool-pairing (cut 0 is always balanced).
    """
    return tuple(_sync(session).cut_balanced)

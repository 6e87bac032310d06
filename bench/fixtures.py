"""Inputs that benches and tests both build, with dsh's own code (no pytest needed).

Tests import from here (``from bench.fixtures import packed_point``); bench scripts never import
from ``tests/``.
"""

from __future__ import annotations

from typing import Any


def packed_point(nodes: Any, event_count: int) -> bytes:
    """A SQLite restore point of a log of ``event_count`` events whose surface is ``nodes``.

    Args:
        nodes: The surface node seqs (any sequence of ints; ``NodeSeqs`` is written packed).
        event_count: The log's event count (the anchor's and the state's).

    Returns:
        The encoded restore point (docs/formats.md#restore-points): session ``s``, the state
        after a closed turn, an anchor of fixed digests.
    """
    from dsh.persistence import _restore_point as rp
    from dsh.session import RestoreState
    state = RestoreState(event_count=event_count, last_time=5, last_type="turn/end",
                         nodes=nodes, replace_generation=0, request_header=None,
                         request_context=None, inherited_markers=0, turn_boundary=-1,
                         turn_open=False)
    anchor = rp.Anchor(backend="sqlite", session_id="s", incarnation="i",
                       event_count=event_count, byte_offset=1, header_digest="h",
                       tail_digest="t", seal_digest="")
    return rp.encode_restore_point(rp.RestorePoint(anchor=anchor, state=state))

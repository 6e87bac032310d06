"""Span selection: which surface nodes a compaction may replace.

Invariants this module owns (docs/rules.md#span-selection, docs/rules.md#tool-pairing,
docs/rules.md#compaction):

* a span is a run of current surface nodes, named by its first and last node's seq and matched
  by surface *position* (after earlier replacements the first seq may be larger than the last);
* both cuts of a span are tool-pairing balanced, so a compaction never separates a tool call
  from its result;
* a ``system/message`` at surface node 0 is never inside a span (only a system replace of that
  one node may shadow it, docs/rules.md#compaction);
* automatic selection is head-anchored and keeps a token budget at the tail; the tail cut moves
  toward the head until it is balanced; the cache-keeping selection spends that budget on the
  head instead (the longest balanced prefix that fits stays, everything after it is
  compacted), so the next request shares that prefix with the ones before.

Errors are :class:`dsh._errors.CompactionError` with these codes: ``range`` (a seq is not on the
surface, the span is reversed, or it covers a ``system/message`` head), ``unbalanced`` (a cut of
an explicit span splits a tool call from its result), ``changed`` (a measurement no longer
matches the surface), ``summary`` (the span is too small for any checkpoint to be smaller than
it, :func:`check_span_size`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from dsh._errors import CompactionError, ConfigError
from dsh.compaction._summarizers import frame_checkpoint_content
from dsh.compaction._tokens import (
    SurfaceMeasurement,
    estimate_message_tokens,
    measure_surface,
    node_prices,
)
from dsh.session import Event, balanced_cuts


class _Session(Protocol):
    @property
    def events(self) -> Sequence[Event]: ...

    @property
    def surface(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class Span:
    """A validated span of the current surface.

    Attributes:
        start: Seq of the span's first node.
        end: Seq of the span's last node.
        start_index: Surface position of ``start``.
        end_index: Surface position of ``end`` (inclusive).
        seqs: Every node seq in the span, in surface order (the shadowed nodes).
        replace_generation: The surface generation the span was validated against.
    """

    start: int
    end: int
    start_index: int
    end_index: int
    seqs: tuple[int, ...]
    replace_generation: int


MINIMAL_SUMMARY: Final = "-"
"""The smallest summary a checkpoint can carry: one text block of one character."""


def minimal_checkpoint_tokens() -> int:
    """Return the estimated tokens of the smallest possible checkpoint message.

    That is the checkpoint framing (preamble and tags, docs/rules.md#the-checkpoint-message) around
    :data:`MINIMAL_SUMMARY`, priced like any message (docs/rules.md#token-estimates). Any real
    summary costs at least this much.
    """
    return estimate_message_tokens({"content": frame_checkpoint_content((MINIMAL_SUMMARY,))})


def check_span_size(session: _Session, span: Span) -> int:
    """Refuse a span whose content is too small for any checkpoint to be smaller (read-only).

    The commit requires the checkpoint to cost fewer estimated tokens than what it shadows
    (docs/rules.md#the-transaction). A span priced at or below :func:`minimal_checkpoint_tokens`
    can never pass that check, so it is refused here, before ``compaction/start`` is appended,
    instead of growing the log with a failed attempt.

    Args:
        session: The session holding the span.
        span: A span from :func:`validate_span` on the current surface.

    Returns:
        The span's estimated tokens (sum of its node prices).

    Raises:
        CompactionError: code ``summary`` when the span's tokens are not larger than the
            minimal checkpoint's; the message gives both numbers.
    Rule: docs/rules.md#the-transaction (checked early, before the lock).
    """
    shadowed = sum(node_prices(session, span.seqs))
    needed = minimal_checkpoint_tokens()
    if shadowed <= needed:
        nodes = len(span.seqs)
        raise CompactionError(
            f"compaction span [{span.start}, {span.end}] is too small to be worth compacting: "
            f"its {nodes} surface {'node holds' if nodes == 1 else 'nodes hold'} ~{shadowed} "
            f"tokens, but "
            f"a checkpoint (framing plus a minimal summary) costs ~{needed}, so the span needs "
            f"more than {needed} tokens; nothing was written",
            code="SUMMARY", seq=span.start)
    return shadowed


def head_position(session: _Session) -> int:
    """Return the first surface position a compaction may cover: 1 after a system head, else 0.

    Rule: docs/rules.md#the-system-head (node 0 protection: a ``system/message`` head is shadowed
        only by a system
    replace of that node alone).
    """
    nodes = session.surface.nodes
    if nodes and session.events[nodes[0]].type == "system/message":
        return 1
    return 0


def validate_span(session: _Session, start: int, end: int) -> Span:
    """Check an explicit span ``[start, end]`` (surface seqs) and return it.

    Args:
        session: The session whose current surface holds the span.
        start: Seq of the first node to replace.
        end: Seq of the last node to replace (same as ``start`` for one node).

    Returns:
        The :class:`Span`, with every shadowed seq.

    Raises:
        CompactionError: code ``range`` when ``start`` or ``end`` is not a current surface node
            (the message lists the current nodes in numeric order),
            ``start`` lies after ``end``, or the span covers a ``system/message`` at node 0;
            code ``unbalanced`` when the cut before ``start`` or after ``end`` leaves a tool
            call without its result (the caller must move the cut; nothing was written).
    Rule: docs/rules.md#the-transaction, docs/rules.md#tool-pairing, docs/rules.md#the-system-head
        (node 0 protection).
    """
    surface = session.surface
    nodes = surface.nodes
    positions: list[int] = []
    for name, seq in (("start", start), ("end", end)):
        try:
            positions.append(nodes.index(seq))
        except ValueError:
            ordered = sorted(nodes)
            order = ("" if ordered == list(nodes) else "; a range runs in the model view's "
                     "order, where a replacing node stands in the place of the one it replaces")
            raise CompactionError(
                f"compaction range {name} seq {seq} is not a current surface node; a "
                f"compaction names current surface nodes, which are {_seq_list(ordered)} ('dsh "
                f"show' prints their #seq{order})", code="RANGE", seq=seq) from None
    start_index, end_index = positions
    if start_index > end_index:
        raise CompactionError(
            f"compaction range start seq {start} (index {start_index}) is after end seq {end} "
            f"(index {end_index})", code="RANGE", seq=start)
    if start_index < head_position(session):
        raise CompactionError(
            f"compaction range [{start}, {end}] covers the system/message at surface node 0; only "
            "a system/message replacing that node alone may shadow it",
            code="RANGE", seq=start)
    cuts = balanced_cuts(session)
    if not cuts[start_index]:
        raise CompactionError(
            f"compaction range start seq {start} is not a balanced boundary: the cut before it "
            "separates a tool call from its result",
            code="UNBALANCED", seq=start)
    if not cuts[end_index + 1]:
        raise CompactionError(
            f"compaction range end seq {end} is not a balanced boundary: the cut after it "
            "separates a tool call from its result",
            code="UNBALANCED", seq=end)
    return Span(start, end, start_index, end_index, tuple(nodes[start_index:end_index + 1]),
                surface.replace_generation)


def select_compactable_range(session: _Session, *, retain_tokens: int,
                             measurement: SurfaceMeasurement | None = None
                             ) -> tuple[int, int] | None:
    """Choose the head-anchored span to compact, keeping ``retain_tokens`` at the tail.

    Walking from the tail, node prices are summed until they reach ``retain_tokens`` (the last
    node is always kept, even for a budget of 0); the first kept node's position is the cut.
    The cut then moves toward the head until it is tool-pairing balanced. The span runs from the
    head (node 0, or node 1 after a ``system/message`` head) to the node before the cut. An
    earlier checkpoint at the head is therefore re-summarized and merged.

    Args:
        session: The session to compact.
        retain_tokens: Estimated tokens to keep uncompacted at the tail (>= 0).
        measurement: A priced surface (from :func:`dsh.compaction._tokens.measure_surface`);
            measured now when omitted.

    Returns:
        ``(start_seq, end_seq)``, or ``None`` when nothing can be compacted (empty surface, the
        budget covers everything, or no balanced cut exists after the head).

    Raises:
        CompactionError: code ``changed`` when ``measurement`` does not describe the current
            surface; ``ConfigError`` for a negative budget.
    Rule: docs/rules.md#span-selection, docs/rules.md#compaction (positions, not seq order, after
        replacements).
    """
    if retain_tokens < 0:
        raise ConfigError(f"retain_tokens must be >= 0, got {retain_tokens}")
    nodes = session.surface.nodes
    measurement = _checked_measurement(session, measurement)
    count = len(measurement.seqs)
    if count == 0:
        return None
    keep = count
    kept_tokens = 0
    while keep > 0:
        keep -= 1
        kept_tokens += measurement.prices[keep]
        if kept_tokens >= retain_tokens:
            break
    head = head_position(session)
    if keep <= head:
        return None
    cuts = balanced_cuts(session)
    while keep > head and not cuts[keep]:
        keep -= 1
    if keep <= head:
        return None
    return nodes[head], nodes[keep - 1]


def _checked_measurement(session: _Session,
                         measurement: SurfaceMeasurement | None) -> SurfaceMeasurement:
    surface = session.surface
    nodes = surface.nodes
    if measurement is None:
        return measure_surface(session)
    if (measurement.replace_generation != surface.replace_generation
            or measurement.seqs != tuple(nodes)):
        raise CompactionError(
            "the priced surface is not the session's current surface (measured "
            f"{len(measurement.seqs)} nodes at generation {measurement.replace_generation}, "
            f"surface has {len(nodes)} at generation {surface.replace_generation})", code="CHANGED")
    return measurement


def select_cache_keeping_range(session: _Session, *, retain_tokens: int,
                               measurement: SurfaceMeasurement | None = None
                               ) -> tuple[int, int] | None:
    """Choose the span that keeps the longest head: ``retain_tokens`` spent on the prefix.

    Providers cache request prefixes; a compaction that replaces the head makes the next request
    a cache miss. This selection keeps the longest balanced prefix of the surface whose tokens
    fit ``retain_tokens`` (a ``system/message`` head always stays) and compacts everything after
    it, through the last balanced cut (normally the newest node). The next request then starts
    with that prefix, which every earlier request (and a summary request sent as their
    continuation) already had. A span too small to be worth a checkpoint is not chosen.

    Args:
        session: The session to compact.
        retain_tokens: Estimated tokens of the head to keep (>= 0).
        measurement: A priced surface; measured now when omitted.

    Returns:
        ``(start_seq, end_seq)``, or ``None`` when nothing after the kept head can be compacted.

    Raises:
        CompactionError: code ``changed`` when ``measurement`` does not describe the current
            surface; ``ConfigError`` for a negative budget.
    Rule: docs/effects.md#cache-keeping-compaction; docs/rules.md#span-selection (balanced cuts).
    """
    if retain_tokens < 0:
        raise ConfigError(f"retain_tokens must be >= 0, got {retain_tokens}")
    measurement = _checked_measurement(session, measurement)
    nodes = session.surface.nodes
    prices = measurement.prices
    count = len(prices)
    head = head_position(session)
    if count <= head:
        return None
    cuts = balanced_cuts(session)
    keep = head
    kept_tokens = sum(prices[:head])
    best = head if cuts[head] else None
    for position in range(head, count):
        kept_tokens += prices[position]
        if kept_tokens > retain_tokens:
            break
        keep = position + 1
        if cuts[keep]:
            best = keep
    if best is None:
        return None
    end = count
    while end > best and not cuts[end]:
        end -= 1
    if end <= best:
        return None
    if sum(prices[best:end]) <= minimal_checkpoint_tokens():
        return None
    return nodes[best], nodes[end - 1]


def _seq_list(nodes: Sequence[int], shown: int = 12) -> str:
    """``#4, #6, … #90``: the first and last few of ``nodes``, in the caller's order.

    ``none`` for an empty surface.
    """
    if not nodes:
        return "none"
    if len(nodes) <= shown:
        return ", ".join(f"#{seq}" for seq in nodes)
    half = shown // 2
    return (", ".join(f"#{seq}" for seq in nodes[:half]) + f", … ({len(nodes) - shown} more) "
            + ", ".join(f"#{seq}" for seq in nodes[-half:]))

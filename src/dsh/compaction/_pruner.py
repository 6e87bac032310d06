"""Tool-result pruning: shorten over-long tool output on the surface, keeping head and tail.

Invariants this module owns (docs/rules.md#the-tool-result-pruner,
docs/rules.md#tool-result-rewrites):

* lengths are Unicode code points of ``text`` blocks only (Python ``len``), not UTF-16 units;
* a pruned result keeps ``head_chars`` code points from the start and ``tail_chars`` from the
  end, with :data:`PRUNE_MARKER` once where the middle was cut; non-text blocks stay in place;
  a text block left empty is dropped;
* the output is at most ``threshold_chars`` long and strictly shorter, so a second pass changes
  nothing;
* each pruning appends ``compaction/prune`` (the shadowed node and its token price) and then a
  content-only ``tool/result`` replace of that one node citing it (``sourceEventSeqs [seq]``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from dsh._errors import ConfigError
from dsh.compaction._tokens import estimate_event_tokens
from dsh.json import FrozenDict, FrozenList, JsonValue
from dsh.session import Event

PRUNE_MARKER: Final = "\n\n[... tool result middle pruned ...]\n\n"
"""Inserted where the middle of a tool result was removed (39 code points).

Rule: docs/rules.md#the-tool-result-pruner.
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class PrunerConfig:
    """Pruning budget in Unicode code points (docs/rules.md#the-tool-result-pruner defaults).

    Attributes:
        threshold_chars: Results longer than this are pruned (> 0; default 8192).
        head_chars: Code points kept from the start (>= 0; default 4096).
        tail_chars: Code points kept from the end (>= 0; default 1024).

    Raises:
        ConfigError: a value out of range, or ``head + 39 + tail > threshold``.
    """

    threshold_chars: int = 8192
    head_chars: int = 4096
    tail_chars: int = 1024

    def __post_init__(self) -> None:
        for name, low in (("threshold_chars", 1), ("head_chars", 0), ("tail_chars", 0)):
            value = getattr(self, name)
            if type(value) is not int or value < low:
                raise ConfigError(f"pruner {name} must be an integer >= {low}, got {value!r}")
        budget = self.head_chars + len(PRUNE_MARKER) + self.tail_chars
        if budget > self.threshold_chars:
            raise ConfigError(
                f"pruner head_chars + marker ({len(PRUNE_MARKER)}) + tail_chars = {budget} exceeds "
                f"threshold_chars {self.threshold_chars}")


def _text_length(blocks: Sequence[Any]) -> int:
    return sum(len(b["text"]) for b in blocks if isinstance(b, Mapping)
               and b.get("type") == "text" and isinstance(b.get("text"), str))


def prune_content(blocks: Sequence[JsonValue], config: PrunerConfig | None = None
                  ) -> FrozenList | None:
    """Return ``blocks`` with the middle of their text removed, or None when within budget.

    Args:
        blocks: A tool result's inner content blocks (text, image, ...).
        config: Budget; defaults to :class:`PrunerConfig` ``()``.

    Returns:
        New frozen blocks: code points ``[head_chars, total - tail_chars)`` of the text blocks
        (in order) are removed, :data:`PRUNE_MARKER` goes once into the first text block that
        intersects the removed range, non-text blocks stay where they were, and text blocks
        that become empty are dropped. ``None`` when the text is at most ``threshold_chars``.
    Rule: docs/rules.md#the-tool-result-pruner (``pruneContent``).
    """
    config = config or PrunerConfig()
    total = _text_length(blocks)
    if total <= config.threshold_chars:
        return None
    cut_start, cut_end = config.head_chars, total - config.tail_chars
    out: list[JsonValue] = []
    offset = 0
    marked = False
    for block in blocks:
        if not (isinstance(block, Mapping) and block.get("type") == "text"
                and isinstance(block.get("text"), str)):
            out.append(block)
            continue
        text: str = block["text"]
        lo, hi = offset, offset + len(text)
        offset = hi
        if hi <= cut_start or lo >= cut_end:
            out.append(block)
            continue
        # Keep the parts of this block outside the removed range.
        keep_head = text[: max(cut_start - lo, 0)]
        keep_tail = text[len(text) - max(hi - cut_end, 0):] if hi > cut_end else ""
        if not marked:
            new_text = keep_head + PRUNE_MARKER + keep_tail
            marked = True
        else:
            new_text = keep_head + keep_tail
        if new_text:
            out.append(FrozenDict({**block, "text": new_text}))
    return FrozenList(out)


class SessionLike(Protocol):
    """What compaction needs of a session: its events, its surface and ``append``."""

    @property
    def events(self) -> Sequence[Event]: ...

    @property
    def surface(self) -> Any: ...

    def append(self, type: str, data: Any, *, surface_op: Any = None,
               source_event_seqs: Any = None) -> Event: ...


@dataclass(frozen=True, slots=True)
class PrunedResult:
    """One pruned tool result.

    Attributes:
        original_seq: Seq of the ``tool/result`` that was shadowed.
        replacement_seq: Seq of the replacing ``tool/result``.
        call_id: The tool call id (``toolCallId`` of the result block).
        chars_before: Text code points before pruning.
        chars_after: Text code points after pruning (marker included).
    """

    original_seq: int
    replacement_seq: int
    call_id: str | None
    chars_before: int
    chars_after: int


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What :func:`prune_session` did.

    Attributes:
        pruned: One entry per replaced result, in surface order.
        chars_removed: Sum of ``chars_before - chars_after``.
    """

    pruned: tuple[PrunedResult, ...]
    chars_removed: int


def _pruned_data(data: Mapping[str, Any], config: PrunerConfig
                 ) -> tuple[FrozenDict, str | None, int, int] | None:
    message = data.get("message")
    if not isinstance(message, Mapping):
        return None
    content = message.get("content")
    if not isinstance(content, list) or not content or not isinstance(content[0], Mapping):
        return None
    block = content[0]
    inner = block.get("content")
    if not isinstance(inner, list):
        return None
    pruned = prune_content(inner, config)
    if pruned is None:
        return None
    # Only message.content[0].content may differ (docs/rules.md#tool-result-rewrites); every other
    # field is reused.
    new_block = FrozenDict({**block, "content": pruned})
    new_message = FrozenDict({**message, "content": FrozenList([new_block, *content[1:]])})
    new_data = FrozenDict({**data, "message": new_message})
    call_id = block.get("toolCallId")
    return (new_data, call_id if isinstance(call_id, str) else None,
            _text_length(inner), _text_length(pruned))


def prune_session(session: SessionLike, config: PrunerConfig | None = None) -> PruneResult:
    """Prune every over-budget ``tool/result`` on the session's current surface.

    For each such node, in surface order, two events are appended back to back:
    ``compaction/prune {shadowedRange: {start: seq, end: seq}, shadowedSeqs: [seq],
    shadowedTokenCount: <price of the original message>}`` and a ``tool/result`` whose data is
    the original's with only the result block's content pruned (same message id, turn, step,
    call id, error, meta), with ``surfaceOp {op: "replace", start: seq, end: seq}`` and
    ``sourceEventSeqs [seq]``.

    Args:
        session: The live session (a snapshot of its surface is taken first).
        config: Budget; defaults to :class:`PrunerConfig` ``()``.

    Returns:
        A :class:`PruneResult`; empty when nothing exceeds the budget.

    Raises:
        EventRejectedError: an append was refused (e.g. by an invariant companion that requires
            an open turn); replacements committed before it stay.
    Rule: docs/rules.md#the-tool-result-pruner (``pruneSession``).
    """
    config = config or PrunerConfig()
    events = session.events
    snapshot = tuple(session.surface.nodes)
    pruned: list[PrunedResult] = []
    for seq in snapshot:
        original = events[seq]
        if original.type != "tool/result" or not isinstance(original.data, Mapping):
            continue
        planned = _pruned_data(original.data, config)
        if planned is None:
            continue
        new_data, call_id, before, after = planned
        session.append("compaction/prune", FrozenDict({
            "shadowedRange": FrozenDict({"start": seq, "end": seq}),
            "shadowedSeqs": FrozenList([seq]),
            "shadowedTokenCount": estimate_event_tokens(original)}))
        replacement = session.append(
            "tool/result", new_data,
            surface_op=FrozenDict({"op": "replace", "start": seq, "end": seq}),
            source_event_seqs=FrozenList([seq]))
        pruned.append(PrunedResult(seq, replacement.seq, call_id, before, after))
    return PruneResult(tuple(pruned), sum(p.chars_before - p.chars_after for p in pruned))

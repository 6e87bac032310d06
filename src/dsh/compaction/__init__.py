"""Compaction: shrink the model's surface without rewriting the log.

Region compaction (a durable ``compaction/start`` lock, a summary, one surface replace), the
automatic pressure trigger, the bracket invariant companion, the tool-result pruner, span
selection, summarizers and the reference's token estimates (docs/rules.md#compaction).

Known gap: the reference meter may anchor its total on the provider-reported usage of the
latest ``assistant/message``; :func:`measure_surface` uses the heuristic envelope + surface
price only. Node prices (what dsh logs as ``shadowedTokenCount``) are exact.
"""

from __future__ import annotations

from dsh.compaction._brackets import (
    CompactionInvariant,
    CompactionTraceState,
    check_compaction_log,
)
from dsh.compaction._pressure import (
    CompactionPolicy,
    PressureOutcome,
    acompact_if_needed,
    compact_if_needed,
)
from dsh.compaction._pruner import (
    PRUNE_MARKER,
    PrunedResult,
    PrunerConfig,
    PruneResult,
    prune_content,
    prune_session,
)
from dsh.compaction._region import (
    CancelSignal,
    CompactionLockState,
    CompactionResult,
    Stability,
    acompact_now,
    acompact_surface_region,
    assert_compaction_inactive,
    compact_now,
    compact_surface_region,
    inspect_compaction_state,
    session_compaction_state,
)
from dsh.compaction._selection import (
    Span,
    head_position,
    select_cache_keeping_range,
    select_compactable_range,
    validate_span,
)
from dsh.compaction._summarizers import (
    CHECKPOINT_PREAMBLE,
    CHECKPOINT_SECTIONS,
    COMPACTION_INSTRUCTION,
    AsyncSummarizer,
    DigestSummarizer,
    LlmSummarizer,
    Summarizer,
    SummaryResult,
    checkpoint_source,
    extract_checkpoint_summary,
    frame_checkpoint_content,
    is_checkpoint_source,
)
from dsh.compaction._tokens import (
    PricedNode,
    SurfaceMeasurement,
    estimate_block_tokens,
    estimate_event_tokens,
    estimate_message_tokens,
    estimate_system_tokens,
    estimate_text_tokens,
    estimate_tools_tokens,
    measure_surface,
    node_prices,
    utf16_length,
)

__all__ = [
    "CHECKPOINT_PREAMBLE",
    "CHECKPOINT_SECTIONS",
    "COMPACTION_INSTRUCTION",
    "PRUNE_MARKER",
    "AsyncSummarizer",
    "CancelSignal",
    "CompactionInvariant",
    "CompactionLockState",
    "CompactionPolicy",
    "CompactionResult",
    "CompactionTraceState",
    "DigestSummarizer",
    "LlmSummarizer",
    "PressureOutcome",
    "PricedNode",
    "PruneResult",
    "PrunedResult",
    "PrunerConfig",
    "Span",
    "Stability",
    "Summarizer",
    "SummaryResult",
    "SurfaceMeasurement",
    "acompact_if_needed",
    "acompact_now",
    "acompact_surface_region",
    "assert_compaction_inactive",
    "check_compaction_log",
    "checkpoint_source",
    "compact_if_needed",
    "compact_now",
    "compact_surface_region",
    "estimate_block_tokens",
    "estimate_event_tokens",
    "estimate_message_tokens",
    "estimate_system_tokens",
    "estimate_text_tokens",
    "estimate_tools_tokens",
    "extract_checkpoint_summary",
    "frame_checkpoint_content",
    "head_position",
    "inspect_compaction_state",
    "is_checkpoint_source",
    "measure_surface",
    "node_prices",
    "prune_content",
    "prune_session",
    "select_cache_keeping_range",
    "select_compactable_range",
    "session_compaction_state",
    "utf16_length",
    "validate_span",
]

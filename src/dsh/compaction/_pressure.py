"""Automatic compaction under context pressure (docs/rules.md#automatic-compaction).

A :class:`CompactionPolicy` says when an open turn's surface is too large for its context
window; :func:`compact_if_needed` (or :func:`acompact_if_needed`, whose summarizer may be
awaited) then compacts through the region transaction, retrying as the policy allows, and
reports a :class:`PressureOutcome`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from dsh._errors import CompactionError, ConfigError
from dsh.compaction._pruner import PrunerConfig, PruneResult, SessionLike, prune_session
from dsh.compaction._region import (
    AsyncFlush,
    CancelSignal,
    CompactionResult,
    acompact_surface_region,
    assert_compaction_inactive,
    compact_surface_region,
    session_compaction_state,
)
from dsh.compaction._selection import select_cache_keeping_range, select_compactable_range
from dsh.compaction._summarizers import AsyncSummarizer, Summarizer
from dsh.compaction._tokens import SurfaceMeasurement, measure_surface


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionPolicy:
    """When automatic compaction runs and how much it keeps (defaults).

    Rule: docs/rules.md#automatic-compaction.

    Attributes:
        threshold_ratio: Compact when estimated tokens exceed ``floor(window * ratio)``;
            in (0, 1], default 0.8.
        retain_ratio: Keep ``floor(window * ratio)`` tokens at the tail; in (0, 1] and below
            ``threshold_ratio``; default 0.16 when ``retain_tokens`` is not given.
        retain_tokens: Absolute tail budget (>= 0), exclusive with ``retain_ratio``; must stay
            below the threshold once the window is known.
        compaction_retries: Extra compactions while still above the threshold (>= 0; default 1).
        keep_cache: Spend the retained budget on the head instead of the tail: keep the longest
            prefix that fits and compact everything after it, so the next request shares that
            prefix with the ones before (the provider's prompt cache serves it). Default False:
            the head is compacted and the tail kept (Rule:
            docs/effects.md#cache-keeping-compaction).
    Raises:
        ConfigError: a value out of range or both retention fields given.
    """

    threshold_ratio: float = 0.8
    retain_ratio: float | None = None
    retain_tokens: int | None = None
    compaction_retries: int = 1
    keep_cache: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.threshold_ratio <= 1:
            raise ConfigError(f"threshold_ratio must be in (0, 1], got {self.threshold_ratio}")
        if self.retain_ratio is not None and self.retain_tokens is not None:
            raise ConfigError("retain_ratio and retain_tokens are exclusive; give one")
        ratio = self.effective_retain_ratio
        if ratio is not None and not (0 < ratio <= 1 and ratio < self.threshold_ratio):
            raise ConfigError(f"retain_ratio must be in (0, 1] and below threshold_ratio "
                              f"{self.threshold_ratio}, got {ratio}")
        if self.retain_tokens is not None and (type(self.retain_tokens) is not int
                                               or self.retain_tokens < 0):
            raise ConfigError(f"retain_tokens must be an integer >= 0, got {self.retain_tokens}")
        if type(self.compaction_retries) is not int or self.compaction_retries < 0:
            raise ConfigError(f"compaction_retries must be an integer >= 0, got "
                              f"{self.compaction_retries}")

    @property
    def effective_retain_ratio(self) -> float | None:
        """The retain ratio in force: the given one, 0.16 by default, None with retain_tokens."""
        if self.retain_tokens is not None:
            return None
        return 0.16 if self.retain_ratio is None else self.retain_ratio

    def threshold_tokens(self, context_window: int) -> int:
        """``floor(context_window * threshold_ratio)``."""
        return math.floor(context_window * self.threshold_ratio)

    def retain_budget(self, context_window: int) -> int:
        """Tail tokens to keep for this window.

        Raises:
            ConfigError: ``retain_tokens`` is not below the window's threshold.
        """
        if self.retain_tokens is not None:
            threshold = self.threshold_tokens(context_window)
            if self.retain_tokens >= threshold:
                raise ConfigError(f"retain_tokens {self.retain_tokens} must be below the "
                                  f"threshold {threshold} of a {context_window}-token window")
            return self.retain_tokens
        ratio = self.effective_retain_ratio
        assert ratio is not None
        return math.floor(context_window * ratio)

    def select(self, session: SessionLike, *, retain_tokens: int,
               measurement: SurfaceMeasurement | None = None) -> tuple[int, int] | None:
        """The span an automatic compaction replaces: cache-keeping or head-anchored."""
        chooser: Callable[..., tuple[int, int] | None] = (
            select_cache_keeping_range if self.keep_cache else select_compactable_range)
        return chooser(session, retain_tokens=retain_tokens, measurement=measurement)


@dataclass(frozen=True, slots=True)
class PressureOutcome:
    """What :func:`compact_if_needed` did above the threshold.

    Attributes:
        tokens_before: Estimated total when pressure was detected.
        tokens_after: Estimated total afterwards.
        pruned: The pruning pass, when a pruner configuration was given.
        compactions: The region compactions, in order (may be empty when pruning sufficed
            or nothing could be compacted).
    """

    tokens_before: int
    tokens_after: int
    pruned: PruneResult | None
    compactions: tuple[CompactionResult, ...]


def compact_if_needed(session: SessionLike, *, summarizer: Summarizer, context_window: int,
                      owner: int, policy: CompactionPolicy | None = None,
                      pruner: PrunerConfig | None = None,
                      signal: CancelSignal | None = None) -> PressureOutcome | None:
    """Automatic compaction inside open turn ``owner`` when the estimate crosses the threshold.

    Order (docs/rules.md#automatic-compaction, pressure): lock check; measure; at or below
    ``threshold_tokens`` -> None; prune (if ``pruner``) and re-measure; while still above, up to
    ``compaction_retries + 1`` region compactions of the head-anchored span that keeps
    ``retain_budget`` tokens (owner = the turn, whole-surface stability), re-measuring after
    each. Estimates are the heuristic total (:func:`measure_surface`).

    Returns:
        None below the threshold; otherwise a :class:`PressureOutcome` (its ``compactions`` is
        empty when pruning sufficed or no span could be compacted).
    Raises:
        CompactionError: ``busy`` (a live lock), ``pressure`` (still above the threshold after
            every attempt), or any code of :func:`compact_surface_region`.
        ConfigError: ``retain_tokens`` not below the threshold.
    """
    pressure = _Pressure(session, context_window, policy or CompactionPolicy(), pruner)
    if not pressure.above():
        return None
    while (span := pressure.next_span()) is not None:
        pressure.done(compact_surface_region(session, span[0], span[1], summarizer=summarizer,
                                             owner=owner, stability="whole-surface",
                                             signal=signal))
    return pressure.outcome()


async def acompact_if_needed(session: SessionLike, *, summarizer: Summarizer | AsyncSummarizer,
                             context_window: int, owner: int,
                             policy: CompactionPolicy | None = None,
                             pruner: PrunerConfig | None = None,
                             signal: CancelSignal | None = None,
                             flush: AsyncFlush | None = None) -> PressureOutcome | None:
    """Async twin of :func:`compact_if_needed` (the summarizer never blocks the event loop).

    An ``asummarize`` is awaited (a model asked on the loop), a plain ``summarize`` runs in a
    worker thread. ``flush`` (e.g. ``store.aflush``) runs after each compaction's close.
    Arguments, order, results and errors otherwise as :func:`compact_if_needed`; cancellation
    propagates.
    """
    pressure = _Pressure(session, context_window, policy or CompactionPolicy(), pruner)
    if not pressure.above():
        return None
    while (span := pressure.next_span()) is not None:
        pressure.done(await acompact_surface_region(
            session, span[0], span[1], summarizer=summarizer, owner=owner,
            stability="whole-surface", signal=signal, flush=flush))
    return pressure.outcome()


class _Pressure:
    """The steps both entry points share: measure, prune, choose spans, count attempts."""

    def __init__(self, session: SessionLike, context_window: int, policy: CompactionPolicy,
                 pruner: PrunerConfig | None) -> None:
        assert_compaction_inactive(session_compaction_state(session), "automatic compaction")
        self.session = session
        self.policy = policy
        self.pruner = pruner
        self.threshold = policy.threshold_tokens(context_window)
        self.retain = policy.retain_budget(context_window)
        self.before = measure_surface(session).total_tokens
        self.pruned: PruneResult | None = None
        self.measurement = measure_surface(session)
        self.results: list[CompactionResult] = []

    def above(self) -> bool:
        if self.before <= self.threshold:
            return False
        if self.pruner is not None:
            self.pruned = prune_session(self.session, self.pruner)
        self.measurement = measure_surface(self.session)
        return True

    def next_span(self) -> tuple[int, int] | None:
        if self.measurement.total_tokens <= self.threshold:
            return None
        attempts = self.policy.compaction_retries + 1
        if len(self.results) == attempts:
            raise CompactionError(
                f"still above threshold after {attempts} compaction attempts "
                f"(~{self.measurement.total_tokens} tokens > {self.threshold})", code="PRESSURE")
        return self.policy.select(self.session, retain_tokens=self.retain,
                                  measurement=self.measurement)

    def done(self, result: CompactionResult) -> None:
        self.results.append(result)
        self.measurement = measure_surface(self.session)

    def outcome(self) -> PressureOutcome:
        return PressureOutcome(self.before, self.measurement.total_tokens, self.pruned,
                               tuple(self.results))



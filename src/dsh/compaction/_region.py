"""The compaction transaction: lock, summarize, replace a surface span with one checkpoint.

Invariants this module owns (docs/rules.md#the-checkpoint-message, docs/rules.md#the-transaction,
docs/rules.md#compaction-brackets, docs/rules.md#automatic-compaction, docs/rules.md#compaction):

* selection and entry checks are read-only; ``compaction/start`` is appended right after them
  with nothing in between (it *is* the durable lock) and before the summarizer runs;
* the lock is the latest unmatched ``compaction/start``; one older than the latest
  ``session/end-seed`` belongs to an ended lifecycle and does not block;
* an automatic compaction (``owner`` = a turn number) runs inside that open turn; a manual one
  (``owner=None``) refuses to run while a turn is open;
* success appends ``compaction/summary``, the replacing ``user/message`` and ``compaction/end``
  back to back; the checkpoint is strictly smaller (estimated tokens) than what it shadows;
* any failure after the start makes exactly one ``compaction/end {error}`` attempt; if that
  append fails too, the start stays unmatched and visible (never papered over).

Errors are :class:`dsh._errors.CompactionError`; ``code`` is one of ``busy`` (lock held, or a
turn is open for a manual compaction), ``owner`` (automatic compaction without the matching open
turn), ``range`` / ``unbalanced`` (the span, see :mod:`dsh.compaction._selection`), ``changed``
(the surface changed under the summarizer), ``summary`` (the span is too small for any
checkpoint to undercut it, refused before the lock; or the summarizer failed or did not shrink
the span), ``cancelled``, ``commit`` (an append of the commit or of the error close
failed), ``persistence`` (committed, but the flush afterwards failed) and ``pressure``
(automatic compaction stayed above its threshold after every allowed attempt).
"""

from __future__ import annotations

import inspect
import uuid
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from dsh._errors import CompactionError, ConfigError
from dsh.compaction._pruner import SessionLike
from dsh.compaction._selection import (
    Span,
    check_span_size,
    select_compactable_range,
    validate_span,
)
from dsh.compaction._summarizers import (
    AsyncSummarizer,
    Message,
    Summarizer,
    SummaryResult,
    checkpoint_source,
    extract_checkpoint_summary,
    frame_checkpoint_content,
)
from dsh.compaction._tokens import estimate_message_tokens, node_prices
from dsh.json import FrozenDict, FrozenList, JsonValue
from dsh.session import Event, derive_event_message

Stability = Literal["whole-surface", "selected-span"]
"""What must stay unchanged while the summarizer runs (docs/rules.md#the-transaction):
``whole-surface`` (default for automatic) — every surface node; ``selected-span`` (default for
manual) — the selected nodes only, appends elsewhere are fine."""


class CancelSignal(Protocol):
    """A cancellation flag: ``threading.Event`` and ``asyncio.Event`` both fit."""

    def is_set(self) -> bool:
        """True once cancellation was requested."""
        ...


Flush = Callable[[], object]
AsyncFlush = Callable[[], Awaitable[object] | object]


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionResult:
    """A committed compaction (docs/rules.md#compaction).

    Attributes:
        compaction_id: The transaction id written in every ``compaction/*`` event.
        source_command_id: The command that asked for it, if any.
        start_seq: Seq of ``compaction/start``.
        summary_seq: Seq of ``compaction/summary``.
        replacement_seq: Seq of the replacing checkpoint ``user/message``.
        end_seq: Seq of ``compaction/end``.
        summary: The summary texts (inside the ``<compacted-summary>`` tags).
        shadowed_range: ``(start, end)`` surface seqs of the replaced span.
        shadowed_seqs: Every replaced node, in surface order (authoritative).
        shadowed_token_count: Estimated tokens of the replaced nodes.
        checkpoint_token_count: Estimated tokens of the checkpoint message (< the above).
    """

    compaction_id: str
    source_command_id: str | None
    start_seq: int
    summary_seq: int
    replacement_seq: int
    end_seq: int
    summary: tuple[str, ...]
    shadowed_range: tuple[int, int]
    shadowed_seqs: tuple[int, ...]
    shadowed_token_count: int
    checkpoint_token_count: int


@dataclass(frozen=True, slots=True)
class CompactionLockState:
    """What one backward scan of the log says about turns and compaction brackets.

    Attributes:
        open_turn: Number of the open turn (latest of ``turn/start``/``turn/end`` is a start),
            else None.
        unmatched_start: The latest ``compaction/start`` when it is the latest compaction
            bracket event (no ``compaction/end`` after it), else None.
        latest_end_seed_seq: Seq of the latest ``session/end-seed``, else None.
    """

    open_turn: int | None
    unmatched_start: Event | None
    latest_end_seed_seq: int | None

    @property
    def active_start(self) -> Event | None:
        """The unmatched start if it still locks: none or a later end-seed makes it stale."""
        start = self.unmatched_start
        if start is None:
            return None
        if self.latest_end_seed_seq is not None and start.seq < self.latest_end_seed_seq:
            return None
        return start


def inspect_compaction_state(events: Sequence[Event]) -> CompactionLockState:
    """Scan ``events`` backwards once for the open turn, the unmatched start and the end-seed.

    Stops as soon as all three answers are known (so a recent end-seed keeps it short).
    Rule: docs/rules.md#the-transaction, docs/rules.md#compaction (one backward scan, three facts).
    """
    turn_known = bracket_known = seed_known = False
    open_turn: int | None = None
    unmatched: Event | None = None
    end_seed: int | None = None
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        kind = event["type"]
        if not turn_known and (kind == "turn/start" or kind == "turn/end"):
            turn_known = True
            if kind == "turn/start":
                data = event["data"]
                number = data.get("turn") if isinstance(data, dict) else None
                open_turn = number if type(number) is int else -1
        elif not bracket_known and (kind == "compaction/start" or kind == "compaction/end"):
            bracket_known = True
            if kind == "compaction/start":
                unmatched = event
        elif not seed_known and kind == "session/end-seed":
            seed_known = True
            end_seed = event["seq"]
        if turn_known and bracket_known and seed_known:
            break
    return CompactionLockState(open_turn, unmatched, end_seed)


_lock_states: weakref.WeakKeyDictionary[Any, tuple[int, Event, CompactionLockState]] = \
    weakref.WeakKeyDictionary()


def session_compaction_state(session: SessionLike) -> CompactionLockState:
    """Return :func:`inspect_compaction_state` for a live session, folding only new events.

    The answer for a prefix is cached per session with its last event; events are immutable and
    the log only grows, so later calls fold just the appended tail forward (same result as the
    backward scan). A cache whose last event is not the session's event at that seq is dropped.
    """
    events = session.events
    if not events:
        return CompactionLockState(None, None, None)
    try:
        cached = _lock_states.get(session)
    except TypeError:  # not weakly referenceable: no cache
        return inspect_compaction_state(events)
    if cached is not None and cached[0] < len(events) and events[cached[0]] is cached[1]:
        open_turn, start, end_seed = cached[2].open_turn, cached[2].unmatched_start, \
            cached[2].latest_end_seed_seq
        for index in range(cached[0] + 1, len(events)):
            event = events[index]
            kind = event["type"]
            if kind == "turn/start":
                number = event["data"].get("turn") if isinstance(event["data"], dict) else None
                open_turn = number if type(number) is int else -1
            elif kind == "turn/end":
                open_turn = None
            elif kind == "compaction/start":
                start = event
            elif kind == "compaction/end":
                start = None
            elif kind == "session/end-seed":
                end_seed = event["seq"]
        state = CompactionLockState(open_turn, start, end_seed)
    else:
        state = inspect_compaction_state(events)
    _lock_states[session] = (len(events) - 1, events[-1], state)
    return state


def assert_compaction_inactive(state: CompactionLockState, stage: str = "compaction") -> None:
    """Raise ``busy`` when a live compaction lock exists.

    Raises:
        CompactionError: code ``busy``: "<stage>: compaction already in progress; the session
            compaction lock is already active" (``where["seq"]`` = the holding start).
    Rule: docs/rules.md#the-lock, docs/rules.md#compaction (stale orphans).
    """
    start = state.active_start
    if start is not None:
        raise CompactionError(
            f"{stage}: compaction already in progress; the session compaction lock is already "
            f"active (unmatched compaction/start at seq {start.seq})", code="BUSY", seq=start.seq)


def _error_text(exc: BaseException) -> str:
    """The error chain as one string for ``compaction/end.error``.

    Rule: docs/rules.md#the-checkpoint-message.
    """
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        parts.append(f"{type(current).__name__}: {text}" if text else type(current).__name__)
        current = current.__cause__ or (None if current.__suppress_context__
                                        else current.__context__)
    return "; caused by ".join(parts)


class _Region:
    """One compaction transaction; the sync and async entry points share every step."""

    def __init__(self, session: SessionLike, start: int, end: int, *, owner: int | None,
                 stability: Stability | None, source_command_id: str | None,
                 compaction_id: str | None, signal: CancelSignal | None,
                 provider: str | None, model: str | None) -> None:
        if owner is not None and (type(owner) is not int or owner < 1):
            raise ConfigError(f"owner must be None or a turn number >= 1, got {owner!r}")
        self.session = session
        self.start, self.end = start, end
        self.owner = owner
        self.stability: Stability = stability or (
            "selected-span" if owner is None else "whole-surface")
        self.source_command_id = source_command_id
        self.compaction_id = compaction_id or str(uuid.uuid4())
        self.signal = signal
        self.provider, self.model = provider, model
        self.stage = "summary"
        self.start_event: Event | None = None
        self.close_appended = False
        self.span: Span | None = None
        self.snapshot: tuple[int, ...] = ()
        self.messages: list[Message] = []
        self.previous: str | None = None
        self.shadowed_tokens = 0

    def _cancelled(self, when: str) -> CompactionError:
        return CompactionError(f"compaction {self.compaction_id} was cancelled {when}",
                               code="CANCELLED")

    def _ids(self) -> dict[str, JsonValue]:
        ids: dict[str, JsonValue] = {"compactionId": self.compaction_id}
        if self.source_command_id is not None:
            ids["sourceCommandId"] = self.source_command_id
        return ids

    def open(self) -> None:
        """Steps 1-5: read-only checks, then the durable lock (no yield in between)."""
        if self.signal is not None and self.signal.is_set():
            raise self._cancelled("before it started (no events written)")
        session = self.session
        self.span = validate_span(session, self.start, self.end)
        state = session_compaction_state(session)
        assert_compaction_inactive(state, "compact region")
        if self.owner is None and state.open_turn is not None:
            raise CompactionError(
                f"manual compaction requires an idle session, but turn {state.open_turn} is "
                "open", code="BUSY")
        if self.owner is not None and state.open_turn != self.owner:
            found = "no open turn" if state.open_turn is None else f"open turn {state.open_turn}"
            raise CompactionError(
                f"automatic compaction for turn {self.owner} must run inside that open turn; "
                f"found {found}", code="OWNER")
        # Read-only, last before the lock: a span no checkpoint can undercut is refused here
        # rather than logged as a failed attempt (docs/rules.md#the-transaction).
        check_span_size(session, self.span)
        self.snapshot = tuple(session.surface.nodes)
        self.start_event = session.append(
            "compaction/start", FrozenDict({**self._ids(), "turn": self.owner}))

    def prepare(self) -> None:
        """Step 6: price the span and build the summarizer input."""
        assert self.span is not None
        events = self.session.events
        self.shadowed_tokens = sum(node_prices(self.session, self.span.seqs))
        for seq in self.span.seqs:
            message = derive_event_message(events[seq])
            if message is not None:
                self.messages.append(message)
        if self.messages:
            self.previous = extract_checkpoint_summary(self.messages[0])

    def _result(self, produced: object, summarizer: object) -> SummaryResult:
        if isinstance(produced, SummaryResult):
            return produced
        if isinstance(produced, str):
            provider = self.provider or getattr(summarizer, "provider", None)
            model = self.model or getattr(summarizer, "model", None)
            return SummaryResult(
                summary=(produced,),
                provider=provider if isinstance(provider, str) else "dsh",
                model=model if isinstance(model, str) else type(summarizer).__name__)
        raise CompactionError(
            f"a summarizer must return str or SummaryResult, got {type(produced).__name__}",
            code="SUMMARY")

    def commit(self, produced: object, summarizer: object) -> CompactionResult:
        """Steps 7-10: frame, shrink check, cancellation and stability checks, three appends."""
        assert self.span is not None and self.start_event is not None
        result = self._result(produced, summarizer)
        content = frame_checkpoint_content(result.summary)
        if isinstance(result.blocks, list | tuple) and result.blocks:
            content = FrozenList([*content, *result.blocks])
        replacement = FrozenDict({"content": content,
                                  "source": checkpoint_source(self.compaction_id,
                                                              self.source_command_id),
                                  "role": "user", "id": str(uuid.uuid4())})
        checkpoint_tokens = estimate_message_tokens(replacement)
        if checkpoint_tokens >= self.shadowed_tokens:
            raise CompactionError(
                f"summary is not smaller than the shadowed content: checkpoint ~{checkpoint_tokens}"
                f" tokens vs {self.shadowed_tokens} shadowed",
                code="SUMMARY")
        if self.signal is not None and self.signal.is_set():
            raise self._cancelled("after summarization, before commit")
        self._check_stability()
        span = self.span
        summary_data: dict[str, JsonValue] = {
            **self._ids(),
            "summary": FrozenList(FrozenDict({"type": "text", "text": t}) for t in result.summary),
        }
        if result.raw_output is not None:
            summary_data["rawOutput"] = result.raw_output
        if result.llm_stream_call:
            summary_data["llmStreamCall"] = True
        summary_data.update({
            "shadowedRange": FrozenDict({"start": span.start, "end": span.end}),
            "shadowedSeqs": FrozenList(span.seqs),
            "shadowedTokenCount": self.shadowed_tokens,
            "provider": result.provider, "model": result.model})
        if result.max_tokens is not None:
            summary_data["maxTokens"] = result.max_tokens
        if result.usage is not None:
            summary_data["usage"] = result.usage
        if result.request is not None:
            summary_data["request"] = result.request
        session = self.session
        self.stage = "commit"
        summary_event = session.append("compaction/summary", FrozenDict(summary_data))
        replacement_event = session.append(
            "user/message", replacement,
            surface_op=FrozenDict({"op": "replace", "start": span.start, "end": span.end}),
            source_event_seqs=FrozenList([self.start_event.seq, summary_event.seq, *span.seqs]))
        self.stage = "close"
        end_event = session.append("compaction/end", FrozenDict({**self._ids(),
                                                                  "turn": self.owner}))
        self.close_appended = True
        return CompactionResult(
            compaction_id=self.compaction_id, source_command_id=self.source_command_id,
            start_seq=self.start_event.seq, summary_seq=summary_event.seq,
            replacement_seq=replacement_event.seq, end_seq=end_event.seq,
            summary=result.summary, shadowed_range=(span.start, span.end),
            shadowed_seqs=span.seqs, shadowed_token_count=self.shadowed_tokens,
            checkpoint_token_count=checkpoint_tokens)

    def _check_stability(self) -> None:
        session = self.session
        assert self.span is not None
        if self.stability == "whole-surface":
            if tuple(session.surface.nodes) != self.snapshot:
                raise CompactionError(
                    "the surface changed while the summary was written (whole-surface "
                    "stability); nothing was replaced",
                    code="CHANGED")
            return
        try:
            span = validate_span(session, self.start, self.end)
        except CompactionError as exc:
            raise CompactionError(
                f"the selected span changed while the summary was written ({exc.message}); "
                "nothing was replaced", code="CHANGED") from exc
        if span.seqs != self.span.seqs:
            raise CompactionError(
                "the selected span changed while the summary was written (its nodes differ); "
                "nothing was replaced", code="CHANGED")

    def fail(self, exc: BaseException) -> BaseException:
        """Step 11: classify, make exactly one error-close attempt, return what to raise."""
        import asyncio  # not at the top: `import dsh` stays free of asyncio (~25 ms)

        if isinstance(exc, CompactionError):
            error: BaseException = exc
        elif self.stage in ("commit", "close"):
            error = CompactionError(f"compaction {self.compaction_id} failed while committing: "
                                    f"{_error_text(exc)}", code="COMMIT")
        elif isinstance(exc, asyncio.CancelledError):
            error = self._cancelled("while the summary was written")
        elif isinstance(exc, Exception):
            error = CompactionError(f"the summarizer failed: {_error_text(exc)}", code="SUMMARY")
        else:
            error = exc  # KeyboardInterrupt, SystemExit: close the bracket, then let it go
        if error is not exc:
            error.__cause__ = exc
        if self.stage == "close":
            return error  # the success close itself failed: no second attempt, orphan stays
        text = _error_text(exc)
        if isinstance(exc, asyncio.CancelledError):
            text = f"{text} (compaction cancelled while the summary was written)"
        try:
            self.session.append("compaction/end", FrozenDict({
                **self._ids(), "turn": self.owner, "error": text}))
        except Exception as close_exc:
            failure = CompactionError(
                f"compaction {self.compaction_id} failed ({_error_text(exc)}) and its error "
                f"close could not be appended ({_error_text(close_exc)}); the compaction/start at "
                f"seq {self.start_event.seq if self.start_event else '?'} stays unmatched",
                code="COMMIT")
            failure.__cause__ = close_exc
            return failure
        self.close_appended = True
        return error


def _flush_error(exc: BaseException) -> CompactionError:
    error = CompactionError(f"the compaction committed but the flush afterwards failed: "
                            f"{_error_text(exc)}", code="PERSISTENCE")
    error.__cause__ = exc
    return error


def compact_surface_region(session: SessionLike, start: int, end: int, *, summarizer: Summarizer,
                           owner: int | None = None, stability: Stability | None = None,
                           source_command_id: str | None = None,
                           compaction_id: str | None = None, signal: CancelSignal | None = None,
                           flush: Flush | None = None, provider: str | None = None,
                           model: str | None = None) -> CompactionResult:
    """Replace the surface span ``[start, end]`` by one summary checkpoint.

    Order (docs/rules.md#the-transaction, docs/rules.md#compaction): cancellation check; span checks
        (both cuts
    balanced, no ``system/message`` head); one backward log scan for the open turn, the
    latest unmatched ``compaction/start`` and the latest ``session/end-seed``; owner checks;
    the size check (the span priced above the minimal checkpoint); append
    ``compaction/start {compactionId, sourceCommandId?, turn}`` (the lock); summarize; frame
    and shrink check; cancellation and stability checks; append ``compaction/summary``, the
    replacing ``user/message`` (``sourceEventSeqs`` = [start seq, summary seq, *shadowed]) and
    ``compaction/end``; then ``flush`` if given.

    Args:
        session: The live session.
        start: Seq of the first surface node to replace.
        end: Seq of the last surface node to replace (surface position order).
        summarizer: A :class:`~dsh.compaction._summarizers.Summarizer`.
        owner: ``None`` for a manual (standalone) compaction between turns; the open turn's
            number for an automatic compaction inside it.
        stability: Override of what must not change while summarizing (default
            ``selected-span`` for manual, ``whole-surface`` for automatic).
        source_command_id: Recorded on every ``compaction/*`` event and the checkpoint source.
        compaction_id: Transaction id; a random UUID when omitted.
        signal: Cancellation flag checked before the start and before the commit.
        flush: Durability barrier called after a close was appended (e.g. ``store.flush``).
        provider: Overrides the provider recorded when the summarizer returns plain text.
        model: Overrides the model recorded when the summarizer returns plain text.

    Returns:
        The :class:`CompactionResult`.

    Raises:
        CompactionError: codes as listed in the module docstring. Nothing is written for
            ``range``, ``unbalanced``, ``busy``, ``owner``, a pre-start ``cancelled`` and a
            pre-start ``summary`` (the span is too small for any checkpoint to be smaller,
            :func:`~dsh.compaction._selection.check_span_size`); after
            the start every failure has appended exactly one ``compaction/end {error}`` unless
            the code is ``commit`` (then the start may stay unmatched).
        ConfigError: ``owner`` is neither None nor a turn number.
    """
    tx = _Region(session, start, end, owner=owner, stability=stability,
                 source_command_id=source_command_id, compaction_id=compaction_id,
                 signal=signal, provider=provider, model=model)
    tx.open()
    try:
        tx.prepare()
        produced = summarizer.summarize(tx.messages, previous=tx.previous)
        result = tx.commit(produced, summarizer)
    except BaseException as exc:
        error = tx.fail(exc)
        if tx.close_appended and flush is not None:
            try:
                flush()
            except Exception as flush_exc:  # the compaction failure is the one to report
                error.add_note(f"the flush after the error close also failed: {flush_exc!r}")
        if error is exc:
            raise
        raise error from error.__cause__
    if flush is not None:
        try:
            flush()
        except Exception as exc:
            raise _flush_error(exc) from exc
    return result


async def acompact_surface_region(session: SessionLike, start: int, end: int, *,
                                  summarizer: Summarizer | AsyncSummarizer,
                                  owner: int | None = None, stability: Stability | None = None,
                                  source_command_id: str | None = None,
                                  compaction_id: str | None = None,
                                  signal: CancelSignal | None = None,
                                  flush: AsyncFlush | None = None, provider: str | None = None,
                                  model: str | None = None) -> CompactionResult:
    """Async twin of :func:`compact_surface_region` (same arguments, order and errors).

    The summarizer's ``asummarize`` is awaited when it has one; otherwise ``summarize`` runs in
    a worker thread. The lock is appended before the first ``await``. Cancelling the task while
    it summarizes appends the one ``compaction/end {error}`` and then re-raises
    ``asyncio.CancelledError`` (the caller's cancellation wins); a summarizer that raises
    ``CancelledError`` by itself gives ``CompactionError`` code ``cancelled``. ``flush`` may
    return an awaitable.
    """
    import asyncio  # not at the top: `import dsh` stays free of asyncio (~25 ms)

    tx = _Region(session, start, end, owner=owner, stability=stability,
                 source_command_id=source_command_id, compaction_id=compaction_id,
                 signal=signal, provider=provider, model=model)
    tx.open()
    try:
        tx.prepare()
        if isinstance(summarizer, AsyncSummarizer):
            produced: object = await summarizer.asummarize(tx.messages, previous=tx.previous)
        else:
            produced = await asyncio.to_thread(summarizer.summarize, tx.messages,
                                               previous=tx.previous)
        result = tx.commit(produced, summarizer)
    except BaseException as exc:
        error = tx.fail(exc)
        if tx.close_appended and flush is not None:
            try:
                await _call_flush(flush)
            except Exception as flush_exc:  # the compaction failure is the one to report
                error.add_note(f"the flush after the error close also failed: {flush_exc!r}")
        task = asyncio.current_task()
        if error is exc or (isinstance(exc, asyncio.CancelledError) and task is not None
                            and task.cancelling()):
            raise
        raise error from error.__cause__
    if flush is not None:
        try:
            await _call_flush(flush)
        except Exception as exc:
            raise _flush_error(exc) from exc
    return result


async def _call_flush(flush: AsyncFlush) -> None:
    outcome = flush()
    if inspect.isawaitable(outcome):
        await outcome


def _manual_gate(session: SessionLike) -> None:
    state = session_compaction_state(session)
    assert_compaction_inactive(state, "compact now")
    if state.open_turn is not None:
        raise CompactionError(
            f"manual compaction requires an idle session, but turn {state.open_turn} is open",
            code="BUSY")


def _manual_span(session: SessionLike, retain_tokens: int,
                 signal: CancelSignal | None) -> tuple[int, int] | None:
    """The read-only prologue both manual entry points share: cancelled? idle? which span?"""
    if signal is not None and signal.is_set():
        raise CompactionError("manual compaction was cancelled before it started",
                              code="CANCELLED")
    _manual_gate(session)
    return select_compactable_range(session, retain_tokens=retain_tokens)


def compact_now(session: SessionLike, *, summarizer: Summarizer, retain_tokens: int = 0,
                source_command_id: str | None = None, signal: CancelSignal | None = None,
                flush: Flush | None = None) -> CompactionResult | None:
    """Manually compact everything but the newest ``retain_tokens`` (at least the last node).

    Returns ``None`` and writes nothing when no span can be compacted. Runs
    :func:`compact_surface_region` with ``owner=None`` and ``selected-span`` stability.

    Raises:
        CompactionError: ``busy`` when a turn is open or a lock is held (checked before
            selecting); otherwise as :func:`compact_surface_region`.
    Rule: docs/rules.md#automatic-compaction (manual trigger, retain 0 by default).
    """
    span = _manual_span(session, retain_tokens, signal)
    if span is None:
        return None
    return compact_surface_region(session, span[0], span[1], summarizer=summarizer,
                                  source_command_id=source_command_id, signal=signal,
                                  flush=flush)


async def acompact_now(session: SessionLike, *, summarizer: Summarizer | AsyncSummarizer,
                       retain_tokens: int = 0, source_command_id: str | None = None,
                       signal: CancelSignal | None = None,
                       flush: AsyncFlush | None = None) -> CompactionResult | None:
    """Async twin of :func:`compact_now`."""
    span = _manual_span(session, retain_tokens, signal)
    if span is None:
        return None
    return await acompact_surface_region(session, span[0], span[1], summarizer=summarizer,
                                         source_command_id=source_command_id, signal=signal,
                                         flush=flush)

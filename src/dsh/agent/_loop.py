"""The agent loop: turns and steps of a model with tools, every step durable and checked.

One :meth:`Agent.run` drives turns while the inbox has work (docs/agent.md#the-turn):

1. ``turn/start`` (numbered after the log's last turn, also across resumes);
2. per step: claim the inbox (all steering; one prompt on the first step), compaction under
   pressure (owner = the turn), ``step/start``, one ``user/message`` per claimed message, then
   per attempt ``request/header``/``request/context`` when they changed, the **dispatch
   checkpoint** (a flush barrier: a failure ends the turn before the provider is called), the
   **request == projection** check, the stream (one ``assistant/chunk`` per chunk), and either
   the ``assistant/message`` citing this attempt's chunks, or a retry (retryable failures with
   backoff, recorded as ``llm/retry``; a context overflow compacts and retries once);
3. tool calls in model order: ``tool/call`` (with the tool's effect class and the call's
   idempotency key), the **tool checkpoint**, the body; parallel-safe calls share a rolling
   pool (default 10), the others are barriers; every ``tool/result`` strictly in model order;
   a call of a tool that ``needs_approval`` records ``approval/requested`` and a waiting result
   instead of running, and the turn ends ``blocked`` after the step; a tool's in-process
   ``approve`` is asked before its ``tool/call`` is recorded (a no: the call and a
   ``NOT_APPROVED`` result); ``step/end`` always;
4. ``turn/end`` with completed / max-tokens / blocked / error / aborted, then a flush, so a
   finished turn is durable when :meth:`Agent.run` returns (a flush dsh does not take here).

Cancelling the task awaiting :meth:`Agent.run` records what was visibly streamed as an
``interrupted`` assistant message (text and reasoning only), cancels and drains started tools,
pairs calls that never started with ABORTED_BEFORE_DISPATCH results, then ``step/end`` and
``turn/end {aborted}`` (docs/agent.md#the-turn).

A turn first carries out what the log says is owed (Rule: docs/effects.md#resume-decisions):
calls a crash interrupted run again, are reconciled or stay in doubt by their effect class, and
answered approvals run or tell the model no; each decision is a ``tool/recovery`` event, and
the model learns an outcome as a rewrite of the call's result. ``run()`` without a prompt
continues an interrupted turn or one whose approvals were answered.

:meth:`Agent.resume` follows docs/rules.md#resume: write ownership first, cold read, closers through
the same handle, restore, publish; the backend work runs in a daemon thread so a call that never
returns is abandoned on cancellation or timeout and its handle closed.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, runtime_checkable

from dsh._errors import AgentError, CompactionError, ConfigError, InvariantError, LlmFailureError
from dsh.agent._cache import Fingerprints, ModelSummarizer
from dsh.agent._effects import (
    APPROVAL_ANSWERED,
    APPROVAL_REQUESTED,
    RECOVERY_EVENT,
    Action,
    CallRecord,
    EffectLedger,
    PendingApproval,
    format_ms,
    idempotency_key,
)
from dsh.agent._failpoints import failpoint
from dsh.agent._inbox import INBOX_EVENT, Inbox
from dsh.agent._provider import LlmRequest, LlmResponse, Provider, StreamAssembler
from dsh.agent._recorder import (
    ABORTED_BEFORE_DISPATCH,
    ABORTED_BEFORE_DISPATCH_TEXT,
    Recorder,
    StepRecorder,
    TurnRecorder,
    append_agent_event,
    as_user_message,
    core_store,
    text_blocks,
    turn_end_reason,
)
from dsh.agent._telemetry import Telemetry, default_telemetry
from dsh.agent._tools import Tool, ToolContext, ToolOutput, tool_table
from dsh.compaction import (
    AsyncSummarizer,
    CompactionPolicy,
    DigestSummarizer,
    Summarizer,
    acompact_if_needed,
    acompact_surface_region,
)
from dsh.json import FrozenDict, dumps, snapshot_json
from dsh.session import Event, Session, SessionStore, canonical_header, header_equals

logger = logging.getLogger(__name__)

RETRY_EVENT: Final = "llm/retry"

_DRAIN_TIMEOUT_S: Final = 5.0
"""How long a cancelled turn waits for started tool bodies to settle (seconds)."""

DEFAULT_APPROVAL_TIMEOUT_MS: Final = 24 * 60 * 60 * 1000
"""How long an approval waits for an answer before it counts as denied (24 hours, in ms)."""

_NOT_RUN_AFTER_YES: Final[dict[str, tuple[str, str]]] = {
    "forgotten": ("arguments redacted after the answer",
                  "This call did not run: its arguments were redacted or erased after it was "
                  "approved, so what was approved can no longer be run. Ask for it again if it "
                  "is still needed."),
    "quarantined": ("call quarantined after the answer",
                    "This call did not run: its message was quarantined after it was approved "
                    "(withheld from the model view), and a quarantined call is not run. Ask "
                    "for it again if it is still needed."),
}
"""A yes the run does not carry out: the ``tool/recovery`` reason and what the model is told
(docs/effects.md#approvals-and-forgetting)."""


@runtime_checkable
class _KnowsWriterEpoch(Protocol):
    """A persistence attachment that can name its write handle's fencing epoch."""

    def writer_epoch(self, session_id: str) -> int: ...


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How retryable model failures are retried within a step.

    Attributes:
        max_retries: Retries per step after the first attempt (>= 0; default 3).
        base_delay_ms: First backoff in ms; doubles each retry (default 500).
        max_delay_ms: Backoff ceiling in ms (default 30000); a provider's
            ``retry_after_ms`` hint is used instead when given, capped the same way.

    Raises:
        ConfigError: a negative value or ``base_delay_ms > max_delay_ms``.
    """

    max_retries: int = 3
    base_delay_ms: int = 500
    max_delay_ms: int = 30_000

    def __post_init__(self) -> None:
        if min(self.max_retries, self.base_delay_ms, self.max_delay_ms) < 0 or (
                self.base_delay_ms > self.max_delay_ms):
            raise ConfigError(f"retry policy out of range: {self!r} (values >= 0, base <= max)")

    def delay_ms(self, retry: int, hint_ms: int | None) -> int:
        """Backoff before retry number ``retry`` (0-based), in ms."""
        wanted = hint_ms if hint_ms is not None else self.base_delay_ms * (2 ** retry)
        return min(max(0, wanted), self.max_delay_ms)


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnResult:
    """How a turn ended.

    Attributes:
        turn: Turn number.
        reason: The ``turn/end`` reason, e.g. ``{"kind": "completed"}``.
        steps: Steps the turn ran.
        text: Text of the turn's last assistant message ('' when none).
        pending_approvals: Call ids waiting for a person's answer when the turn ended (a
            ``blocked`` turn waits for them; answer with ``dsh approve`` / ``dsh deny``).
    """

    turn: int
    reason: FrozenDict
    steps: int
    text: str
    pending_approvals: tuple[str, ...] = ()


@dataclass(slots=True)
class InvariantStats:
    """What the request == projection check cost (for ``bench/``).

    Attributes:
        checks: Requests checked.
        fast: Checks decided by identity and surface generation (O(1)).
        total_ns: Time spent checking, in ns.
    """

    checks: int = 0
    fast: int = 0
    total_ns: int = 0


@dataclass(slots=True)
class _Built:
    """What a request was built from: the exact derivation it carries."""

    messages: tuple[FrozenDict, ...]
    generation: int
    node_count: int


def _text_of(content: Sequence[Mapping[str, Any]]) -> str:
    return "".join(b["text"] for b in content if b.get("type") == "text")


class Agent:
    """An agent over one live session: a provider, tools, an inbox, and the loop.

    Args:
        session: The live session (from ``store.create`` or :meth:`resume`).
        provider: The model backend (:class:`~dsh.agent._provider.Provider`).
        store: The store the session is live in; its persistence makes the checkpoints
            durable (without one, checkpoints are no-ops).
        config: ``{provider, model, reasoningEffort?, temperature?, maxTokens?, stop?}``.
        system: System prompt.
        tools: Tools the model may call.
        max_steps: Steps per turn before the turn ends with ``MAX_STEPS`` (>= 1; default 32).
        max_parallel_tool_calls: Size of the rolling pool of parallel-safe calls (default 10).
        context_window: The model's context window in tokens; enables compaction.
        compaction: Pressure policy (default :class:`~dsh.compaction.CompactionPolicy`, with
            ``keep_cache=True`` when the summarizer is ``"model"``); ``None`` with a context
            window uses the default; pass ``False`` to disable.
        summarizer: Summarizer for compaction under pressure and on overflow: the offline
            digest (default, ``"digest"``), ``"model"`` (this agent's provider writes the
            checkpoint: with ``keep_cache`` as a continuation of the last request, so the
            provider's prompt cache serves it; docs/effects.md#cache-keeping-compaction), or
            any :class:`~dsh.compaction.Summarizer` / ``AsyncSummarizer`` (awaited, never
            blocking the event loop).
        retry: Retry policy for retryable failures.
        request_hook: Called with each built request; may return a changed one (the
            request == projection check then catches any change to messages or header).
        before_step: ``before_step(turn, step) -> bool``, asked after the step's inbox claim;
            False ends the turn ``{kind: "blocked"}`` with no step events (the claimed input
            is dropped, as in docs/agent.md#the-turn).
        sleep: Awaitable sleep used for backoff (tests pass a fake).
        telemetry: OpenTelemetry spans of the run (:class:`~dsh.agent.Telemetry`); None
            emits through the global tracer provider when the application set one up, False
            never (docs/standards.md#opentelemetry).
        approval_timeout_ms: How long an ``approval/requested`` waits before it counts as
            denied (ms; default 24 hours).
        clock: Epoch-ms clock for approval deadlines (default: wall clock).

    Raises:
        ConfigError: a bad ``max_steps``/``max_parallel_tool_calls`` or a config without
            provider and model.
        AgentError: code ``TOOL`` for tools with the same name; ``RECORDER`` when the session
            ends inside an open turn.
    """

    def __init__(self, session: Session, provider: Provider, *,
                 store: SessionStore | None = None, config: Mapping[str, Any],
                 system: str | None = None, tools: Sequence[Tool] = (), max_steps: int = 32,
                 max_parallel_tool_calls: int = 10, context_window: int | None = None,
                 compaction: CompactionPolicy | bool | None = None,
                 summarizer: Summarizer | AsyncSummarizer | Literal["digest", "model"] | None
                 = None, retry: RetryPolicy | None = None,
                 request_hook: Callable[[LlmRequest], LlmRequest] | None = None,
                 before_step: Callable[[int, int], bool] | None = None,
                 sleep: Callable[[float], Any] = asyncio.sleep,
                 telemetry: Telemetry | bool | None = None,
                 approval_timeout_ms: int = DEFAULT_APPROVAL_TIMEOUT_MS,
                 clock: Callable[[], int] | None = None) -> None:
        if type(max_steps) is not int or max_steps < 1:
            raise ConfigError(f"max_steps must be an integer >= 1, got {max_steps!r}")
        if type(max_parallel_tool_calls) is not int or max_parallel_tool_calls < 1:
            raise ConfigError(f"max_parallel_tool_calls must be an integer >= 1, got "
                              f"{max_parallel_tool_calls!r}")
        if not config.get("provider") or not config.get("model"):
            raise ConfigError(f"config needs a provider and a model, got {dict(config)!r}")
        if type(approval_timeout_ms) is not int or approval_timeout_ms < 1:
            raise ConfigError(f"approval_timeout_ms must be an integer >= 1, got "
                              f"{approval_timeout_ms!r}")
        self._session = session
        self._provider = provider
        self._store = core_store(store, "await store.agent(session_id, provider=..., config=...)")
        self._config = dict(config)
        self._system = system
        self._tools = tool_table(tools)
        self._declarations = [t.declaration() for t in tools]
        self._max_steps = max_steps
        self._pool = max_parallel_tool_calls
        self._window = context_window
        model_summary = summarizer == "model"
        if compaction is False or context_window is None:
            self._policy: CompactionPolicy | None = None
        else:
            self._policy = compaction if isinstance(compaction, CompactionPolicy) \
                else CompactionPolicy(keep_cache=model_summary)
        self._summarizer: Summarizer | AsyncSummarizer | None = (
            None if model_summary else DigestSummarizer()
            if summarizer is None or summarizer == "digest" else summarizer)  # type: ignore[assignment]
        self._fingerprints = Fingerprints()
        self._retry = retry or RetryPolicy()
        self._hook = request_hook
        self._before_step = before_step
        self._cause: dict[str, Any] | None = None
        self._sleep = sleep
        self._recorder = Recorder(session, store=self._store, flush_on_turn_end=False)
        self._inbox = Inbox(lambda data: append_agent_event(self._recorder, INBOX_EVENT, data))
        seed_length = session.header.seed_length or 0
        self._inbox.replay(session.events[seed_length:])
        self._task: asyncio.Task[Any] | None = None
        self.invariant_stats = InvariantStats()
        spans = default_telemetry(telemetry)
        self.stop_telemetry = spans.attach(session) if spans is not None else None
        self._approval_timeout_ms = approval_timeout_ms
        self._clock = clock or _wall_clock_ms
        self._ledger = EffectLedger()
        self._epoch: int | None = None
        self._blocked = False

    # construction ---------------------------------------------------------------------------

    @classmethod
    def create(cls, store: SessionStore, provider: Provider, *, session_id: str | None = None,
               **options: Any) -> Agent:
        """Create a new session in ``store`` and an agent over it (options as the class).

        Raises:
            SessionExistsError: the id is live; whatever the store's persistence raises for an
                id already stored.
        """
        core = core_store(store, "await store.agent(session_id, provider=..., config=...)")
        if core is None:
            raise ConfigError("Agent.create needs a store to create the session in (dsh.open(url))")
        return cls(core.create(session_id), provider, store=core, **options)

    @classmethod
    async def resume(cls, store: SessionStore, session_id: str, provider: Provider, *,
                     timeout_ms: int | None = None, **options: Any) -> Agent:
        """Resume a stored session and build an agent over it (docs/rules.md#resume).

        Order: take write ownership (open the write handle), read cold through it, append the
        closers of an interrupted turn through the same handle, restore, publish into
        ``store``; then rebuild the inbox from the logged splices. The backend work runs in
        a daemon thread; on cancellation or timeout the call is abandoned, the write handle
        closed (so a later resume of the id succeeds) and a session that still arrives later
        is disposed.

        Args:
            store: A store with persistence.
            session_id: The stored session.
            provider: The model backend.
            timeout_ms: Give up after this many ms (None: wait).
            **options: As the class.

        Raises:
            ConfigError: ``store`` has no persistence (code ``NO_PERSISTENCE``).
            SessionBusyError: the id is live (``SESSION_LIVE``) or another writer holds it.
            SessionNotFoundError, LogCorruptError, SessionFormatUnsupportedError: as the
                persistence layer.
            AgentError: code ``RESUME_TIMEOUT`` after ``timeout_ms``.
            asyncio.CancelledError: the caller cancelled.
        """
        core = core_store(store, "await store.agent(session_id, provider=..., config=...)")
        persistence = core.persistence if core is not None else None
        if core is None or persistence is None:
            raise ConfigError("cannot resume: the store has no persistence (open it with "
                              "dsh.open(url))",
                              code="NO_PERSISTENCE", session_id=session_id)
        session = await _resume_in_thread(core, persistence, session_id, timeout_ms)
        try:
            return cls(session, provider, store=core, **options)
        except BaseException:
            core.dispose(session)
            raise

    # state ----------------------------------------------------------------------------------

    @property
    def session(self) -> Session:
        """The live session."""
        return self._session

    @property
    def recorder(self) -> Recorder:
        """The recorder every event of this agent goes through."""
        return self._recorder

    @property
    def inbox(self) -> Inbox:
        """The pending prompts and steering messages."""
        return self._inbox

    @property
    def running(self) -> bool:
        """True while :meth:`run` is active."""
        return self._task is not None

    def pending_approvals(self) -> list[PendingApproval]:
        """Approvals of this session nobody answered yet, in request order.

        Rule: docs/effects.md#durable-approvals.
        """
        ledger = self._fed_ledger()
        return ledger.pending_approvals()

    def _fed_ledger(self) -> EffectLedger:
        ledger = self._ledger
        events = self._session.events
        if ledger.seen < len(events):
            ledger.feed(events[ledger.seen:])
        return ledger

    def _writer_epoch(self) -> int:
        """The fencing epoch of this session's writer (0 without a fencing backend)."""
        if self._epoch is None:
            persistence = self._store.persistence if self._store is not None else None
            self._epoch = persistence.writer_epoch(self._session.id) \
                if isinstance(persistence, _KnowsWriterEpoch) else 0
        return self._epoch

    def _plan(self) -> tuple[list[Action], list[PendingApproval]]:
        ledger = self._fed_ledger()
        effects = {name: (t.effect, t.reconcile is not None) for name, t in self._tools.items()}
        actions, unserved = ledger.plan(now_ms=self._clock(), effects=effects)
        for record in unserved:
            logger.warning("session %r: call %s of tool %r was interrupted but this agent has "
                           "no such tool; it is left as the repair answered it",
                           self._session.id, record.call_id, record.name)
        waiting = [p for p in ledger.pending_approvals()
                   if not any(a.record.call_id == p.call_id for a in actions)]
        return actions, waiting

    def _continuable(self) -> bool:
        """The log's last turn was interrupted and the model has not answered its results."""
        events = self._session.events
        for index in range(len(events) - 1, -1, -1):
            event = events[index]
            if event["type"] == "turn/end":
                reason = event["data"].get("reason")
                if not (isinstance(reason, Mapping) and reason.get("kind") == "interrupted"):
                    return False
                messages = self._session.derive_messages()
                return bool(messages) and messages[-1].get("role") != "assistant"
            if event["type"] == "turn/start":
                return False
        return False

    def send(self, prompt: str | Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> Event:
        """Queue a prompt for a later turn (``next-turn``); returns the splice event.

        Call it from the event loop's thread (the session is not thread-safe).
        """
        return self._inbox.push("next-turn", as_user_message(prompt))

    def steer(self, message: str | Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> Event:
        """Queue steering for the next step (``next-step``); returns the splice event.

        It enters as a ``user/message`` after the next ``step/start``, so it never lands
        between a tool call and its result.
        """
        return self._inbox.push("next-step", as_user_message(message))

    def cancel(self, *, cause: Mapping[str, Any] | None = None) -> bool:
        """Cancel the active :meth:`run` (as cancelling its task); False when idle.

        Args:
            cause: The abort cause recorded in ``turn/end {kind: "aborted", reason}``
                (default ``{kind: "user"}``); the first cause of a run is kept.
        """
        if self._task is None:
            return False
        if self._cause is None:
            self._cause = dict(cause) if cause is not None else {"kind": "user"}
        return self._task.cancel()

    async def aclose(self) -> None:
        """Stop the agent and release its session.

        Cancels a running turn (cause ``{kind: "disposed"}``) and waits for it to end, then
        flushes and disposes the session from its store (releasing write ownership).
        Idempotent. Raises whatever the final flush raises.
        """
        task = self._task
        if task is not None and task is not asyncio.current_task():
            self.cancel(cause={"kind": "disposed"})
            await asyncio.wait([task])
        store = self._store
        if store is not None and store.get(self._session.id) is self._session:
            try:
                await store.aflush(self._session)
            finally:
                store.dispose(self._session)

    # the loop -------------------------------------------------------------------------------

    async def run(self, prompt: str | Sequence[Mapping[str, Any]] | Mapping[str, Any] |
                  None = None) -> TurnResult:
        """Queue ``prompt`` (if given) and run turns until the inbox is empty.

        Without a prompt it continues what the log leaves open: an interrupted turn (the
        model answers the recovered results), or answered approvals (carried out first).

        Returns:
            The last turn's :class:`TurnResult` (completed, max-tokens, or blocked on
            approvals: see ``pending_approvals``).

        Raises:
            AgentError: ``NOT_IDLE`` when a run is active; ``AWAITING_APPROVAL`` without a
                prompt when only unanswered approvals are left (they are named);
                ``NOTHING_TO_RUN`` without a prompt or anything to continue; ``MAX_STEPS``
                when a turn hit the step limit.
            LlmFailureError: the model failed (after retries); the turn ended with it.
            InvariantError: a request differed from the log's projection.
            asyncio.CancelledError: the run was cancelled; the turn ended ``aborted``.
            Exception: a checkpoint (flush) failure; the turn ended with an error first.
        """
        if self._task is not None:
            raise AgentError("the agent is already running; await the active run or cancel "
                             "it", code="NOT_IDLE", session_id=self._session.id)
        if prompt is not None:
            self.send(prompt)
        actions, waiting = self._plan()
        continuing = bool(actions) or self._continuable()
        if not self._inbox.has_work() and not continuing:
            if waiting:
                names = ", ".join(f"{p.call_id} ({p.name}, until {format_ms(p.deadline_ms)})"
                                  for p in waiting)
                raise AgentError(f"nothing to run until a person answers: {names}; answer with "
                                 f"'dsh approve {self._session.id} CALL_ID' or 'dsh deny ...'",
                                 code="AWAITING_APPROVAL", session_id=self._session.id)
            raise AgentError("nothing to run: pass a prompt or send() one first",
                             code="NOTHING_TO_RUN", session_id=self._session.id)
        self._task = asyncio.current_task()
        self._cause = None
        try:
            result: TurnResult | None = None
            while self._inbox.has_work() or continuing:
                result = await self._turn(actions, continuing)
                actions, continuing = [], False
                if result.reason.get("kind") == "blocked" and result.pending_approvals:
                    break  # nothing more runs until a person answers
            assert result is not None
            return result
        finally:
            self._task = None

    async def _turn(self, actions: Sequence[Action] = (), continuing: bool = False
                    ) -> TurnResult:
        cut_off = _cut_off_text(self._session.events)
        turn = self._recorder.turn()
        steps = 0
        text = ""
        error: BaseException | None = None
        self._blocked = False
        try:
            if actions:
                await self._recover(turn, actions)
            if cut_off:
                # What the crashed step streamed enters the model's view before anything new
                # (docs/agent.md#resume), as a Ctrl+C keeps it: an interrupted message.
                recovered = turn.step()
                try:
                    recovered.assistant(cut_off, interrupted=True)
                finally:
                    recovered.end()
            decided = False
            while True:
                first = steps == 0
                if self._blocked:
                    turn.reason = {"kind": "blocked"}
                    break
                claimed = self._inbox.claim("next-step")
                if first:
                    claimed[:0] = self._inbox.claim("next-turn", 1)
                if not claimed and ((first and not continuing) or decided):
                    break
                if self._before_step is not None and not self._before_step(turn.number,
                                                                            steps + 1):
                    turn.reason = {"kind": "blocked"}
                    break
                if steps == self._max_steps:
                    raise AgentError(f"turn {turn.number} reached max_steps={self._max_steps} "
                                     f"without finishing", code="MAX_STEPS",
                                     session_id=self._session.id)
                await self._compact_under_pressure(turn.number)
                step = turn.step()
                steps += 1
                try:
                    for message in claimed:
                        step.user_message(message)
                    response = await self._request(turn, step)
                    text = _text_of(response.content) or text
                    if response.finish == "max-tokens":
                        turn.reason = {"kind": "max-tokens"}  # sticky; no tool runs
                        decided = True
                    elif response.tool_calls:
                        await self._run_tools(step, response.tool_calls)
                        decided = False
                    else:
                        decided = True
                finally:
                    step.end()
        except BaseException as exc:
            error = exc
            raise
        finally:
            reason = turn_end_reason(error) if error is not None else None
            if isinstance(error, asyncio.CancelledError) and self._cause is not None:
                reason = {"kind": "aborted", "reason": self._cause}
            ended = turn.end(reason)
            try:
                await self._recorder.aflush()
            except Exception:
                if error is None:
                    raise
                logger.exception("session %r: flush after turn %d failed", self._session.id,
                                  turn.number)
        assert ended is not None
        waiting = tuple(p.call_id for p in self.pending_approvals())
        return TurnResult(turn=turn.number, reason=ended["data"]["reason"], steps=steps,
                          text=text, pending_approvals=waiting)

    # requests -------------------------------------------------------------------------------

    def _build(self, step: StepRecorder) -> tuple[LlmRequest, _Built]:
        header = step.request(self._config, system=self._system, tools=self._declarations,
                              context_window=self._window)
        session = self._session
        messages = tuple(session.derive_messages())
        surface = session.surface
        built = _Built(messages, surface.replace_generation, len(surface.nodes))
        request = LlmRequest(session_id=session.id, messages=messages, header=header,
                             context_window=self._window)
        if self._hook is not None:
            request = self._hook(request)
        return request, built

    def check_request(self, request: LlmRequest, built: _Built | None = None) -> None:
        """Check that ``request`` equals the log's projection right now.

        Rule: docs/rules.md#request--projection.

        Exact fast path: the request carries the very tuple derived at a surface generation
        and node count that are still current (the derivation is a pure function of them).
        Otherwise messages are compared one by one (identity, else compact JSON).

        Raises:
            InvariantError: the session id, a message, or the header differs; the message
                names the first difference.
        """
        started = time.perf_counter_ns()
        stats = self.invariant_stats
        stats.checks += 1
        session = self._session
        try:
            if request.session_id != session.id:
                self._diverged(f"request session id {request.session_id!r} is not the live "
                               f"session {session.id!r}")
            latest = session.request_header()
            if latest is None:
                self._diverged("the log has no request/header before the request")
            elif request.header is not latest and not header_equals(request.header, latest):
                self._diverged("the request header differs from the latest logged "
                               "request/header")
            surface = session.surface
            if built is not None and request.messages is built.messages and (
                    surface.replace_generation == built.generation
                    and len(surface.nodes) == built.node_count):
                stats.fast += 1
                return
            derived = session.derive_messages()
            if len(derived) != len(request.messages):
                self._diverged(f"the request has {len(request.messages)} messages, the log's "
                               f"projection {len(derived)}")
            if all(map(operator.is_, request.messages, derived)):
                return  # the very frozen messages of the log (C-speed identity walk)
            for index, (ours, theirs) in enumerate(zip(request.messages, derived,
                                                       strict=True)):
                if ours is not theirs and dumps(ours) != dumps(theirs):
                    self._diverged(f"request message {index} differs from the projection "
                                   f"(message id {theirs.get('id')!r})")
        finally:
            stats.total_ns += time.perf_counter_ns() - started

    def _diverged(self, what: str) -> None:
        raise InvariantError(f"request == projection violated in session {self._session.id!r}: "
                             f"{what}; the request must be exactly what the log derives",
                             code="REQUEST_DIVERGED", session_id=self._session.id)

    async def _checkpoint(self) -> None:
        """The durability barrier: everything appended is stored.

        Rule: docs/agent.md#durability-checkpoints.
        """
        await self._recorder.aflush()

    async def _request(self, turn: TurnRecorder, step: StepRecorder) -> LlmResponse:
        retries = 0
        compacted = False
        while True:
            request, built = self._build(step)
            await self._checkpoint()  # a failure ends the turn before dispatch
            self.check_request(request, built)
            fingerprint = self._fingerprints.of(request)
            try:
                response = await self._stream(step, request)
            except LlmFailureError as failure:
                step.discard_attempt()
                if failure.context_overflow and not compacted and \
                        await self._compact_for_overflow(turn.number):
                    compacted = True
                    self._note_retry(step, retries, 0, failure, "context-overflow")
                    continue
                if not failure.retryable or retries >= self._retry.max_retries:
                    raise
                delay = self._retry.delay_ms(retries, failure.retry_after_ms)
                self._note_retry(step, retries, delay, failure, "retryable")
                retries += 1
                await self._sleep(delay / 1000)
                continue
            step.assistant(list(response.content), provider=request.provider,
                           model=request.model, usage=response.usage,  # type: ignore[arg-type]
                           replay_state=response.replay_state, request=fingerprint)
            return response

    def _note_retry(self, step: StepRecorder, retry: int, delay_ms: int,
                    failure: LlmFailureError, cause: str) -> None:
        logger.warning("session %r turn %d step %d: model call failed (%s, %s); retry %d in %d "
                       "ms", self._session.id, step.turn, step.number, failure.code, cause,
                       retry + 1, delay_ms)
        append_agent_event(self._recorder, RETRY_EVENT, {
            "turn": step.turn, "step": step.number, "attempt": retry + 1, "delayMs": delay_ms,
            "cause": cause, "failure": failure.failure})

    async def _stream(self, step: StepRecorder, request: LlmRequest) -> LlmResponse:
        assembler = StreamAssembler()
        stream = self._provider.stream(request)
        try:
            async for chunk in stream:
                step.chunk(chunk)
                assembler.feed(chunk)
            return assembler.response()
        except asyncio.CancelledError:
            visible = assembler.visible_content()
            if visible:
                step.assistant(list(visible), provider=request.provider, model=request.model,
                               usage=assembler.usage,  # type: ignore[arg-type]
                               interrupted=True)
            raise
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()

    # compaction -----------------------------------------------------------------------------

    def _header_now(self) -> FrozenDict:
        """The latest logged request header, else the one this agent would log."""
        logged = self._session.request_header()
        if logged is not None:
            return logged
        raw: dict[str, Any] = {"config": dict(self._config)}
        if self._system:
            raw["system"] = self._system
        if self._declarations:
            raw["tools"] = self._declarations
        header: FrozenDict = canonical_header(snapshot_json(raw))
        return header

    def _pressure_summarizer(self, *, continuation: bool) -> Summarizer | AsyncSummarizer:
        if self._summarizer is not None:
            return self._summarizer
        return ModelSummarizer(self._provider, self._session, self._header_now(),
                               continuation=continuation, fingerprints=self._fingerprints)

    async def _compact_under_pressure(self, turn: int) -> None:
        if self._policy is None or self._window is None:
            return
        summarizer = self._pressure_summarizer(continuation=self._policy.keep_cache)
        try:
            await acompact_if_needed(self._session, summarizer=summarizer,
                                     context_window=self._window, owner=turn,
                                     policy=self._policy)
        except (CompactionError, LlmFailureError) as exc:
            # The request still goes out; an overflow then gets its own compaction attempt.
            logger.warning("session %r turn %d: automatic compaction did not run (%s: %s)",
                           self._session.id, turn, exc.code, exc.message)

    async def _compact_for_overflow(self, turn: int) -> bool:
        if self._policy is None or self._window is None:
            return False
        retain = self._policy.retain_budget(self._window)
        span = self._policy.select(self._session, retain_tokens=retain)
        if span is None:
            return False
        # The whole view did not fit: a model summary gets the span alone.
        summarizer = self._pressure_summarizer(continuation=False)
        try:
            await acompact_surface_region(self._session, span[0], span[1],
                                          summarizer=summarizer, owner=turn,
                                          stability="whole-surface")
        except (CompactionError, LlmFailureError) as exc:
            logger.warning("session %r turn %d: compaction after a context overflow failed "
                           "(%s: %s)", self._session.id, turn, exc.code, exc.message)
            return False
        return True

    # tools ----------------------------------------------------------------------------------

    async def _dispatch(self, step: StepRecorder, call: Mapping[str, Any],
                        recorded: Event, *, approved: bool = False) -> ToolOutput:
        """Checkpoint, then run one tool body (the call's ``tool/call`` is already logged)."""
        try:
            await self._checkpoint()
        except asyncio.CancelledError:
            return ToolOutput(content=ABORTED_BEFORE_DISPATCH_TEXT,
                              error={"name": "AbortError", "code": ABORTED_BEFORE_DISPATCH})
        except Exception as exc:  # the body never runs without a durable tool/call
            return ToolOutput(content=f"Error: tool call not dispatched: the checkpoint "
                                      f"failed ({type(exc).__name__}: {exc})",
                              error={"name": type(exc).__name__, "code": "CHECKPOINT_FAILED"})
        found = self._tools.get(call["name"])
        if found is None:
            return ToolOutput(content=f"Error: there is no tool named {call['name']!r}; "
                                      f"available: {sorted(self._tools)}",
                              error={"name": "UnknownToolError", "code": "UNKNOWN_TOOL"})
        key = recorded["data"].get("idempotencyKey")
        context = ToolContext(session_id=self._session.id, call_id=call["id"], turn=step.turn,
                              step=step.number, idempotency_key=key if isinstance(key, str)
                              else "", effect=found.effect, approved=approved)
        failpoint("tool.before-body")
        output = await found.invoke(call["arguments"], context)
        failpoint("tool.after-body")
        return output

    async def _run_tools(self, step: StepRecorder,
                         calls: Sequence[Mapping[str, Any]]) -> None:
        """Run calls in a rolling pool; exclusive calls are barriers; commit in model order."""
        outcomes: dict[int, ToolOutput] = {}
        running: dict[asyncio.Task[ToolOutput], int] = {}
        committed = 0

        def commit_ready() -> None:
            nonlocal committed
            while committed in outcomes:
                output = outcomes.pop(committed)
                step.tool_result(calls[committed]["id"], output.content,
                                 is_error=output.is_error, error=output.error, meta=output.meta)
                committed += 1

        async def settle(wait_all: bool) -> None:
            done, _ = await asyncio.wait(
                running, return_when=asyncio.ALL_COMPLETED if wait_all else
                asyncio.FIRST_COMPLETED)
            for task in done:
                outcomes[running.pop(task)] = task.result()
            commit_ready()

        try:
            for index, call in enumerate(calls):
                found = self._tools.get(call["name"])
                if found is not None and found.needs_approval:
                    outcomes[index] = self._ask_approval(step, call, found)
                    commit_ready()
                    continue
                exclusive = found is not None and not found.parallel_safe
                while running and (exclusive or len(running) >= self._pool):
                    await settle(wait_all=exclusive)
                approved = found is not None and found.approve is not None
                if approved:
                    await self._checkpoint()  # the request is durable before a person is asked
                if found is not None and approved and not await found.aapprove(
                        call["arguments"], call["id"]):
                    # the no is recorded with its call: it never started
                    step.tool_call(call["id"], effect=found.effect, epoch=self._writer_epoch())
                    outcomes[index] = _not_approved(call)
                    commit_ready()
                    continue
                recorded = step.tool_call(call["id"], effect=found.effect if found else None,
                                          epoch=self._writer_epoch())
                task = asyncio.create_task(self._dispatch(step, call, recorded,
                                                          approved=approved))
                running[task] = index
                if exclusive:
                    await settle(wait_all=True)
            while running:
                await settle(wait_all=True)
        except asyncio.CancelledError:
            await self._drain(running, outcomes)
            commit_ready()
            raise

    def _ask_approval(self, step: StepRecorder, call: Mapping[str, Any],
                      found: Tool) -> ToolOutput:
        """Record ``approval/requested`` and the call; return the waiting result (not run)."""
        deadline = self._clock() + self._approval_timeout_ms
        request = append_agent_event(self._recorder, APPROVAL_REQUESTED, {
            "callId": call["id"], "turn": step.turn, "step": step.number, "name": found.name,
            "arguments": call["arguments"], "effect": found.effect, "reason": "tool",
            "deadline": deadline})
        step.tool_call(call["id"], effect=found.effect, epoch=self._writer_epoch())
        self._blocked = True
        return ToolOutput(
            content=f"This call waits for a person's approval and has not run. If it is "
                    f"approved it runs and this result is replaced by its output; if it is "
                    f"denied, or not answered by {format_ms(deadline)}, this result says so.",
            meta={"approval": {"requestedSeq": request["seq"], "deadline": deadline}})

    # recovery -------------------------------------------------------------------------------

    async def _recover(self, turn: TurnRecorder, actions: Sequence[Action]) -> None:
        """Carry out what the log says is owed, before the turn's first step.

        Rule: docs/effects.md#resume-decisions.
        """
        on_surface = set(self._session.surface.nodes)
        for action in actions:
            await self._carry_out(turn, action, on_surface)
        await self._checkpoint()

    def _decide(self, turn: TurnRecorder, action: Action, decision: str,
                reason: str | None = None) -> Event:
        record = action.record
        key = record.key
        if key is None and decision == "run":
            # A call approved before its tool/call became durable: this decision is its record.
            key = idempotency_key(self._session.id, self._session.seq, self._writer_epoch(),
                                  created_at=self._session.header.created_at)
        data: dict[str, Any] = {
            "callId": record.call_id, "callSeq": record.call_seq, "name": record.name,
            "effect": action.effect, "idempotencyKey": key, "decision": decision,
            "cause": action.cause, "turn": turn.number}
        if decision == "run":
            data["attempt"] = action.attempt
        if reason is not None:
            data["reason"] = reason
        return append_agent_event(self._recorder, RECOVERY_EVENT, data)

    def _rewrite(self, turn: TurnRecorder, record: CallRecord, content: list[Any],
                 on_surface: set[int], sources: Sequence[int]) -> None:
        result = record.result
        if result is None or result["seq"] not in on_surface:
            logger.warning("session %r: the result of call %s is no longer on the model's "
                           "surface (compacted); its recovered outcome stays in the log only",
                           self._session.id, record.call_id)
            return
        event = turn.rewrite_result(result, content, sources=sources)
        on_surface.discard(result["seq"])
        on_surface.add(event["seq"])
        record.result = event

    async def _run_again(self, record: CallRecord, attempt: int, key: str | None) -> ToolOutput:
        found = self._tools[record.name]
        context = ToolContext(session_id=self._session.id, call_id=record.call_id,
                              turn=record.turn, step=record.step,
                              idempotency_key=key or "", effect=found.effect, attempt=attempt)
        return await found.invoke(record.arguments, context)

    async def _carry_out(self, turn: TurnRecorder, action: Action,
                         on_surface: set[int]) -> None:
        record = action.record
        kind = action.kind
        if kind == "expire":
            assert record.awaiting is not None
            request = record.awaiting
            record.answer = append_agent_event(self._recorder, APPROVAL_ANSWERED, {
                "callId": record.call_id, "requestedSeq": request["seq"],
                "decision": "denied", "by": "deadline", "reason": _answered_reason(record),
                "note": "nobody answered before the deadline "
                        f"{format_ms(request['data']['deadline'])}"})
            record.awaiting = None
            kind = "deny"
        if kind == "not-started":
            self._decide(turn, action, "not-started")
            return
        if kind == "in-doubt":
            self._ask_in_doubt(turn, action)
            return
        if kind in _NOT_RUN_AFTER_YES:  # docs/effects.md#approvals-and-forgetting
            answer = record.answer
            assert answer is not None
            why, text = _NOT_RUN_AFTER_YES[kind]
            decision = self._decide(turn, action, "deny", why)
            self._rewrite(turn, record, [{"type": "text", "text": text}], on_surface,
                          [answer["seq"], decision["seq"]])
            return
        if kind == "deny":
            answer = record.answer
            assert answer is not None
            decision = self._decide(turn, action, "deny")
            by, note = answer["data"].get("by"), answer["data"].get("note")
            said = f"{by}" + (f" ({note})" if note else "")
            if _answered_reason(record) == "in-doubt":
                text = (f"This call was not run again: {said} declined. Its first run was "
                        f"interrupted, so whether it took effect is still unknown; check the "
                        f"external state before relying on it.")
            elif by == "deadline":
                text = f"This call did not run: {note}, which counts as a denial."
            else:
                text = f"This call did not run: approval was denied by {said}."
            self._rewrite(turn, record, [{"type": "text", "text": text}], on_surface,
                          [answer["seq"], decision["seq"]])
            return
        found = self._tools.get(record.name)
        assert found is not None  # plan() leaves calls of missing tools unserved
        sources: list[int] = []
        if kind == "reconcile":
            decision = self._decide(turn, action, "reconcile")
            sources.append(decision["seq"])
            await self._checkpoint()
            failpoint("recovery.decided")
            try:
                seen = await found.areconcile(record.key or "")
            except Exception as exc:  # the look-up failed: nothing is known, ask a person
                logger.warning("session %r: reconcile of call %s failed (%s: %s); it stays in "
                               "doubt", self._session.id, record.call_id, type(exc).__name__,
                               exc)
                self._ask_in_doubt(turn, action, reason=f"reconcile failed: {exc}")
                return
            if seen is not None:
                failpoint("recovery.after-action")
                self._rewrite(turn, record, [
                    {"type": "text", "text": "The session stopped while this call ran; looking "
                                             "its idempotency key up found that it took effect. "
                                             "Its result:"},
                    *text_blocks(seen.content)], on_surface, sources)
                return
            lead = ("The session stopped while this call ran; looking its idempotency key up "
                    "found no effect, so it was run once more after the restart. Its result:")
            reason: str | None = "reconcile found no effect"
        elif action.cause == "approval":
            by = record.answer["data"].get("by") if record.answer is not None else None
            if _answered_reason(record) == "in-doubt":
                lead = (f"The session stopped while this call ran and its outcome was unknown; "
                        f"{by} approved running it again. Its result:")
            else:
                lead = f"Approved by {by}. Its result:"
            reason = None
            if record.answer is not None:
                sources.append(record.answer["seq"])
        else:
            lead = ("The session stopped while this call ran, so its outcome was unknown; it was "
                    "run again after the restart" + (" with the same idempotency key" if
                                                     action.effect == "idempotent" else "")
                    + ". Its result:")
            reason = None
        decision = self._decide(turn, action, "run", reason)
        sources.append(decision["seq"])
        await self._checkpoint()
        failpoint("recovery.decided")
        output = await self._run_again(record, action.attempt,
                                       decision["data"].get("idempotencyKey"))
        failpoint("recovery.after-action")
        self._rewrite(turn, record, [{"type": "text", "text": lead},
                                     *text_blocks(output.content)], on_surface, sources)

    def _ask_in_doubt(self, turn: TurnRecorder, action: Action,
                      reason: str | None = None) -> None:
        record = action.record
        self._decide(turn, action, "in-doubt", reason)
        append_agent_event(self._recorder, APPROVAL_REQUESTED, {
            "callId": record.call_id, "turn": record.turn, "step": record.step,
            "name": record.name, "arguments": record.arguments, "effect": action.effect,
            "reason": "in-doubt", "deadline": self._clock() + self._approval_timeout_ms})

    async def _drain(self, running: dict[asyncio.Task[ToolOutput], int],
                     outcomes: dict[int, ToolOutput]) -> None:
        """Cancel started bodies and wait for them (at most 5 s).

        Calls that never started are left to ``step/end``, which pairs them with
        ABORTED_BEFORE_DISPATCH results.
        """
        for task in running:
            task.cancel()
        done, pending = await asyncio.wait(running, timeout=_DRAIN_TIMEOUT_S) if running \
            else (set(), set())
        for task in done:
            index = running[task]
            if task.cancelled() or task.exception() is not None:
                outcomes[index] = ToolOutput(
                    content="Error: tool call aborted while running; it may have had effects",
                    error={"name": "AbortError", "code": "ABORTED"})
            else:
                outcomes[index] = task.result()
        for task in pending:
            outcomes[running[task]] = ToolOutput(
                content="Error: tool call aborted and did not stop in time; it may still be "
                        "running and may have had effects",
                error={"name": "AbortError", "code": "ABORTED"})


def _cut_off_text(events: Sequence[Event]) -> str:
    """The text a crash cut off, when the log's last turn is a crash-repaired one.

    That is the ``text-delta`` chunks of the repaired turn's last step after its last
    ``assistant/message`` or retry (no reply was recorded for them), joined; ``""`` when
    there are none, when the last turn did not end ``interrupted``, or when a later turn
    started (the text was already recovered).
    """
    end = len(events) - 1
    while end >= 0 and events[end]["type"] != "turn/end":
        if events[end]["type"] in ("turn/start", "step/start"):
            return ""
        end -= 1
    if end < 0:
        return ""
    reason = events[end]["data"].get("reason")
    if not (isinstance(reason, Mapping) and reason.get("kind") == "interrupted"):
        return ""
    parts: list[str] = []
    for index in range(end - 1, -1, -1):
        event = events[index]
        kind = event["type"]
        if kind in ("step/start", "turn/start", "assistant/message", RETRY_EVENT):
            break
        if kind == "assistant/chunk":
            chunk = event["data"].get("chunk")
            if isinstance(chunk, Mapping) and chunk.get("type") == "text-delta" \
                    and isinstance(chunk.get("text"), str):
                parts.append(chunk["text"])
    text = "".join(reversed(parts))
    return text if text.strip() else ""


def _not_approved(call: Mapping[str, Any]) -> ToolOutput:
    """The result of a call its tool's in-process approval refused (it never ran)."""
    return ToolOutput(content=f"Error: the call was not approved, so it did not run: "
                              f"{call['name']} {call['arguments']}",
                      error={"name": "ApprovalError", "code": "NOT_APPROVED"})


def _answered_reason(record: CallRecord) -> str:
    """Why the call's latest approval was asked: ``tool`` or ``in-doubt``."""
    request = record.awaiting or record.last_request
    reason = request["data"].get("reason") if request is not None else None
    return reason if isinstance(reason, str) else "tool"


async def _resume_in_thread(store: SessionStore, persistence: Any, session_id: str,
                            timeout_ms: int | None) -> Session:
    loop = asyncio.get_running_loop()
    arrived: asyncio.Future[Session] = loop.create_future()
    handles: list[Any] = []
    abandoned = threading.Event()

    def deliver(session: Session | None, error: BaseException | None) -> None:
        if abandoned.is_set():
            if session is not None:  # arrived after the caller gave up: release it at once
                store.dispose(session)
            return
        if error is not None:
            arrived.set_exception(error)
        else:
            arrived.set_result(session)  # type: ignore[arg-type]

    def work() -> None:
        try:
            session = persistence.resume(store, session_id, on_handle=handles.append)
        except BaseException as exc:  # delivered to the awaiting caller (or dropped if it left)
            _call_soon(loop, deliver, None, exc)
        else:
            _call_soon(loop, deliver, session, None)

    threading.Thread(target=work, name=f"dsh-resume-{session_id}", daemon=True).start()
    try:
        if timeout_ms is None:
            return await arrived
        async with asyncio.timeout(timeout_ms / 1000):
            return await arrived
    except (asyncio.CancelledError, TimeoutError) as exc:
        abandoned.set()
        for handle in handles:
            try:
                handle.close()  # releases write ownership so a later resume succeeds
            except Exception:
                logger.exception("closing the write handle of abandoned resume %r failed",
                                 session_id)
        if isinstance(exc, TimeoutError):
            raise AgentError(f"resume of session {session_id!r} did not finish within "
                             f"{timeout_ms} ms; it was abandoned and its handle closed",
                             code="RESUME_TIMEOUT", session_id=session_id) from exc
        raise


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed: nobody waits for this resume any more
        logger.debug("resume finished after its event loop closed")

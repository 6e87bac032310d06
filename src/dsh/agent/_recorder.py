"""The recorder: the one path through which turns, steps, messages and tool calls reach a log.

The agent loop records through it, and so can people with their own loop::

    recorder = Recorder(session, store=store)
    with recorder.turn() as t:
        with t.step() as s:
            s.user_message("What is in src/?")
            s.request({"provider": "deepseek", "model": "deepseek-chat"})
            s.assistant([{"type": "tool-call", "id": "c1", "name": "ls",
                          "arguments": '{"path":"src"}'}])
            s.tool_call("c1")
            s.tool_result("c1", "main.py")

Invariants it owns, so that a malformed log cannot be written through it
(docs/agent.md#the-recorder):

* turns are numbered 1, 2, ... across the whole log (continuing after a resume), steps 1, 2, ...
  per turn; one turn and one step open at a time; every step-scoped event names them;
* one ``assistant/message`` per step, citing the current attempt's ``assistant/chunk`` seqs;
* a ``tool/call`` answers a tool-call block of the step's assistant message, once; a
  ``tool/result`` answers a ``tool/call`` of the same step, once; when a step closes every call
  the assistant made has a result (calls never dispatched get ABORTED_BEFORE_DISPATCH, calls
  dispatched without an answer TOOL_OUTCOME_UNKNOWN), so the model view never shows a tool call
  without its result, and no user message lands between a call and its result;
* a ``tool/result`` rewrite (a replace of one current result node, content only) is appended
  only through :meth:`TurnRecorder.rewrite_result`, inside an open turn;
* ``request/header`` is logged on the first request of a recorder (``initial`` / ``resume``)
  and on a change; ``request/context`` when provider, model or window changes;
* event types outside dsh's vocabulary are written ``ignorable``; core types only through
  their own methods.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Final, Protocol

from dsh._errors import AgentError, LlmFailureError
from dsh._messages import create_assistant_message, create_tool_result_message, create_user_message
from dsh.json import FrozenDict, JsonValue, snapshot_json
from dsh.session import (
    CORE_EVENT_TYPES,
    TOOL_OUTCOME_UNKNOWN,
    Event,
    Session,
    SessionStore,
    canonical_header,
    closer_text,
    header_equals,
)

logger = logging.getLogger(__name__)

ABORTED_BEFORE_DISPATCH: Final = "ABORTED_BEFORE_DISPATCH"
"""Error code of a result for a call whose body never ran.

Rule: docs/agent.md#durability-checkpoints, docs/agent.md#tool-execution.
"""

ABORTED_BEFORE_DISPATCH_TEXT: Final = "Error: tool call aborted before dispatch"
"""The model-facing text of that result (docs/agent.md#durability-checkpoints)."""

_RESERVED: Final = CORE_EVENT_TYPES | {
    "agent/inbox/spliced", "llm/retry", "llm/request", "compaction/start", "compaction/summary",
    "compaction/end", "compaction/prune", "system/message", "tool/recovery",
    "approval/requested", "approval/answered"}

_TURN_BRACKETS: Final = frozenset({"turn/start", "turn/end"})
"""What the recorder reads of a log when it starts on it (:meth:`_Scan.feed_back`)."""


def text_blocks(content: str | Sequence[Mapping[str, Any]]) -> list[Any]:
    """Return ``content`` as content blocks: a string becomes one ``text`` block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content)


def _error_chain(error: BaseException) -> str:
    parts: list[str] = []
    current: BaseException | None = error
    while current is not None and len(parts) < 8:
        parts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return " <- ".join(parts)


def turn_end_reason(error: BaseException | None) -> dict[str, Any]:
    """Return the ``turn/end`` reason for a turn that ended with ``error`` (None: completed).

    Cancellation and Ctrl-C give ``{kind: "aborted", reason: {kind: "user"}}``; an
    :class:`~dsh._errors.LlmFailureError` gives ``{kind: "error", error: <its failure>}``; any
    other exception ``{kind: "error", error: {message: <error chain text>, code: "UNKNOWN"}}``.
    Rule: docs/events.md#core-events (``TurnEndReason``), docs/agent.md#the-turn.
    """
    if error is None:
        return {"kind": "completed"}
    if isinstance(error, asyncio.CancelledError | KeyboardInterrupt):
        return {"kind": "aborted", "reason": {"kind": "user"}}
    if isinstance(error, LlmFailureError):
        return {"kind": "error", "error": error.failure}
    return {"kind": "error", "error": {"message": _error_chain(error), "code": "UNKNOWN"}}


class _Scan:
    """Turn state read from a log: the last turn number and the open turn (tolerant)."""

    __slots__ = ("last_turn", "open_turn")

    def __init__(self) -> None:
        self.last_turn = 0
        self.open_turn: int | None = None

    def feed(self, events: Sequence[Event]) -> None:
        for event in events:
            kind = event["type"]
            if kind == "turn/start":
                turn = event["data"].get("turn")
                if type(turn) is int:
                    self.last_turn = max(self.last_turn, turn)
                    self.open_turn = turn
            elif kind == "turn/end":
                self.open_turn = None

    def feed_back(self, events: Iterable[Mapping[str, Any]]) -> tuple[bool, bool]:
        """Take in a whole log's ``turn/start`` and ``turn/end`` events, newest first.

        Iterated back to the last ``turn/start`` only: the same state as :meth:`feed` of the
        log, since turn numbers grow with seq (docs/view.md#the-transcript-model). Given
        :meth:`EventLog.select_back`, a log paged in after an O(tail) resume reads back
        from its end by type, not its prefix nor its pages.

        Returns:
            ``(started, ended)``: whether a ``turn/start`` was reached (the walk stops there),
            and whether a ``turn/end`` came before it. Given the events after a cut only, a
            walk that reached no ``turn/start`` goes on with :meth:`feed_prefix`.
        """
        ended = False
        for event in events:
            kind = event["type"]
            if kind == "turn/end":
                ended = True
            elif kind == "turn/start":
                turn = event["data"].get("turn")
                if type(turn) is int:
                    self.last_turn = max(self.last_turn, turn)
                    if not ended:
                        self.open_turn = turn
                return True, ended
        return False, ended

    def feed_prefix(self, last_turn: int, turn_open: bool, *, ended: bool) -> None:
        """Go on with the events before a paged restore's cut, as their restore state says.

        What :meth:`feed_back` would find reading them (docs/formats.md#restore-points):
        ``last_turn`` is the ``turn`` of their last ``turn/start`` (0: none, or not an
        integer), ``turn_open`` whether it is their last turn boundary, ``ended`` whether a
        ``turn/end`` came after the cut.
        """
        if last_turn > 0:
            self.last_turn = max(self.last_turn, last_turn)
            if turn_open and not ended:
                self.open_turn = last_turn


class HoldsSessions(Protocol):
    """What the agent layer takes from a ``dsh.Store``: its core session store."""

    @property
    def sessions(self) -> SessionStore:
        """The live sessions, bound to the store's persistence."""
        ...


def core_store(store: Any, replacement: str | None) -> SessionStore | None:
    """The core session store behind what a caller passed as ``store``.

    A :class:`~dsh.session.SessionStore` (or None) is taken as it is; a ``dsh.Store`` (from
    ``dsh.open``) gives its ``sessions``. Where the core store is the documented argument
    (``replacement`` names the front-door way), a ``dsh.Store`` still works for one release,
    with a DeprecationWarning: it was a SessionStore before it became the front door.
    """
    if store is None or isinstance(store, SessionStore):
        return store
    sessions = getattr(store, "sessions", None)
    if not isinstance(sessions, SessionStore):
        return store  # type: ignore[no-any-return]  # a duck-typed store, as before
    if replacement is None:
        return sessions
    import warnings

    warnings.warn(f"passing a dsh.Store where the core SessionStore is meant is deprecated; "
                  f"use {replacement}", DeprecationWarning, stacklevel=3)
    return sessions


class Recorder:
    """Record turns of one session; the writer behind :class:`~dsh.agent.Agent`.

    Args:
        session: The live session to append to.
        store: The store the session is live in; needed for :meth:`flush` (the durability
            barrier). Without it :meth:`flush` is a no-op returning False.
        flush_on_turn_end: Flush when a turn recorded with ``with recorder.turn()`` ends
            (needs ``store``); the agent loop turns this off and places its own barriers.

    Raises:
        AgentError: code ``RECORDER`` when the log ends inside an open turn (resume the
            session first: resume closes it).
    """

    def __init__(self, session: Session, *, store: SessionStore | None = None,
                 flush_on_turn_end: bool = True) -> None:
        self._session = session
        self._store = core_store(store, "store.recorder(session_id)")
        self._flush_on_turn_end = flush_on_turn_end
        self._scan = _Scan()
        prefix = session.prefix_turns()
        if prefix is None:
            self._scan.feed_back(session.events.select_back(_TURN_BRACKETS))
        else:
            # paged in through a restore point that names the last turn: its tail walked in
            # memory, nothing read before its cut (docs/formats.md#restore-points)
            cut, last_turn, turn_open = prefix
            tail = session.events[cut:]  # resident: a paged log serves its tail from memory
            started, ended = self._scan.feed_back(
                event for event in reversed(tail) if event["type"] in _TURN_BRACKETS)
            if not started:
                self._scan.feed_prefix(last_turn, turn_open, ended=ended)
        self._seen = session.seq
        self._headers_logged = 0
        if self._scan.open_turn is not None:
            raise AgentError(f"session {session.id!r} ends inside open turn "
                             f"{self._scan.open_turn}; resume it (which closes the turn) before "
                             f"recording", code="RECORDER", session_id=session.id)
        self._turn: TurnRecorder | None = None

    @property
    def session(self) -> Session:
        """The session recorded into."""
        return self._session

    @property
    def store(self) -> SessionStore | None:
        """The store the session is live in, or None."""
        return self._store

    @property
    def next_turn(self) -> int:
        """The number the next turn will get (last ``turn/start`` + 1)."""
        self._sync()
        return self._scan.last_turn + 1

    @property
    def current_turn(self) -> TurnRecorder | None:
        """The open turn, or None between turns."""
        return self._turn

    def _sync(self) -> None:
        """Take in events appended by others (compaction, inbox splices) since the last call."""
        session = self._session
        if session.seq != self._seen:
            self._scan.feed(session.events[self._seen:])
            self._seen = session.seq

    def _append(self, type: str, data: Any, *, surface_op: Any = None,
                source_event_seqs: Any = None, ignorable: bool = False) -> Event:
        # _sync() inlined: this runs once per event of every recorded turn
        session = self._session
        seen = session.seq
        if seen != self._seen:
            self._scan.feed(session.events[self._seen:])
            self._seen = seen
        event = session.append(type, data, surface_op=surface_op,
                               source_event_seqs=source_event_seqs, ignorable=ignorable)
        if type in _TURN_BRACKETS:  # the only types the scan reads
            self._scan.feed((event,))
        # (append refuses a reentrant append: the log ends with this event)
        self._seen = event["seq"] + 1
        return event

    def turn(self) -> TurnRecorder:
        """Open the next turn: appends ``turn/start {turn}``; use as a context manager.

        On leaving the ``with`` block the turn ends with ``turn/end`` (reason: see
        :func:`turn_end_reason`, or what was set with :meth:`TurnRecorder.end`).

        Raises:
            AgentError: code ``RECORDER`` when a turn is already open.
        """
        self._sync()
        if self._turn is not None or self._scan.open_turn is not None:
            raise AgentError(f"session {self._session.id!r}: turn "
                             f"{self._scan.open_turn} is still open; end it before starting "
                             f"another", code="RECORDER", session_id=self._session.id)
        number = self._scan.last_turn + 1
        self._append("turn/start", {"turn": number})
        self._turn = TurnRecorder(self, number)
        return self._turn

    def user_message(self, content: str | Sequence[Mapping[str, Any]] | Mapping[str, Any], *,
                     source: Mapping[str, Any] | None = None) -> Event:
        """Append a ``user/message`` between turns (in a step: :meth:`StepRecorder.user_message`).

        Args:
            content: Text, content blocks, or a whole user message (with ``role: "user"``).
            source: Message source (default ``{kind: "user"}``); ignored for a whole message.

        Raises:
            AgentError: code ``RECORDER`` when a turn is open.
        """
        if self._turn is not None:
            raise AgentError("a user message inside a turn belongs to a step; use "
                             "step.user_message()", code="RECORDER", session_id=self._session.id)
        return self._append("user/message", as_user_message(content, source=source),
                            surface_op="append")

    def custom(self, type: str, data: JsonValue) -> Event:
        """Append an event of your own type, marked ``ignorable`` so every dsh reader keeps it.

        Args:
            type: Your type, e.g. ``"myapp/checkpoint"``; not one of dsh's core types.
            data: JSON payload.

        Raises:
            AgentError: code ``RECORDER`` for a dsh core type (use its method instead).
        """
        if not isinstance(type, str) or not type or type in _RESERVED:
            raise AgentError(f"event type {type!r} is dsh's own; record it through its recorder "
                             f"method, or pick a type of your own such as 'myapp/note'",
                             code="RECORDER", session_id=self._session.id)
        return self._append(type, data, ignorable=True)

    def flush(self) -> bool:
        """The durability barrier: wait until everything appended is stored.

        Returns:
            True when a persistence observer took part; False without a store.

        Raises:
            WriteFailedError: the store failed to write (nothing appended is lost in memory).
        """
        return self._store.flush(self._session) if self._store is not None else False

    async def aflush(self) -> bool:
        """Async twin of :meth:`flush` (runs in a worker thread)."""
        if self._store is None:
            return False
        return await self._store.aflush(self._session)


def append_agent_event(recorder: Recorder, type: str, data: JsonValue) -> Event:
    """Append a log-only event of the agent loop's own (inbox splices, retries), ignorable.

    The loop's way past :meth:`Recorder.custom`, which refuses dsh's own types.
    """
    return recorder._append(type, data, ignorable=True)


def as_user_message(content: str | Sequence[Mapping[str, Any]] | Mapping[str, Any], *,
                    source: Mapping[str, Any] | None = None) -> FrozenDict:
    """Return a frozen ``UserMessage`` from text, blocks or a whole message (kept as is)."""
    if isinstance(content, Mapping):
        if content.get("role") == "user" and content.get("id"):
            frozen: FrozenDict = snapshot_json(content)
            return frozen
        return create_user_message(content)
    return create_user_message({"content": text_blocks(content),
                                "source": dict(source) if source else {"kind": "user"}})


class TurnRecorder:
    """One open turn; created by :meth:`Recorder.turn`.

    Attributes:
        number: The turn number.
        reason: The ``turn/end`` reason the turn will end with (set by :meth:`end`, by a
            step that hit max tokens, or from the exception leaving the ``with`` block).
    """

    def __init__(self, recorder: Recorder, number: int) -> None:
        self._recorder = recorder
        self.number = number
        self.reason: dict[str, Any] | None = None
        self._next_step = 1
        self._step: StepRecorder | None = None
        self._ended = False

    @property
    def recorder(self) -> Recorder:
        """The recorder this turn belongs to."""
        return self._recorder

    @property
    def current_step(self) -> StepRecorder | None:
        """The open step, or None."""
        return self._step

    @property
    def ended(self) -> bool:
        """True once ``turn/end`` was appended."""
        return self._ended

    def step(self) -> StepRecorder:
        """Open the next step: appends ``step/start {turn, step}``.

        Raises:
            AgentError: code ``RECORDER`` when a step is open or the turn has ended.
        """
        self._check_open()
        if self._step is not None:
            raise AgentError(f"turn {self.number}: step {self._step.number} is still open",
                             code="RECORDER")
        number = self._next_step
        self._recorder._append("step/start", {"turn": self.number, "step": number})
        self._next_step += 1
        self._step = StepRecorder(self, number)
        return self._step

    def _check_open(self) -> None:
        if self._ended:
            raise AgentError(f"turn {self.number} has ended", code="RECORDER")

    def rewrite_result(self, result: Event, content: str | Sequence[Mapping[str, Any]], *,
                       sources: Sequence[int] = ()) -> Event:
        """Give the model a new content for a current ``tool/result`` node (a surface replace).

        The replacement keeps everything of ``result`` but the result block's ``content``
        (core rule: a tool-result rewrite may change only content), so its turn, step, call
        id, ``isError``, ``error`` and ``meta`` stay; the log keeps the original.

        Args:
            result: A ``tool/result`` event that is a current surface node.
            content: The new text or content blocks the model sees for the call.
            sources: Further seqs the rewrite rests on (a decision, an answer).

        Returns:
            The appended ``tool/result`` with ``surfaceOp {op: replace, start = end = its
            seq}`` and ``sourceEventSeqs [its seq, *sources]``.

        Raises:
            AgentError: code ``RECORDER`` when the turn has ended or a step is open.
            EventRejectedError: ``result`` is not a current surface node.
        Rule: docs/effects.md#resume-decisions (how the model learns a recovered outcome).
        """
        self._check_open()
        if self._step is not None:
            raise AgentError(f"turn {self.number}: rewrite results between steps, not inside "
                             f"step {self._step.number}", code="RECORDER")
        data = result["data"]
        message = data["message"]
        blocks = list(message["content"])
        blocks[0] = {**blocks[0], "content": text_blocks(content)}
        new_data = {**data, "message": {**message, "content": blocks}}
        seq = result["seq"]
        return self._recorder._append(
            "tool/result", new_data, surface_op={"op": "replace", "start": seq, "end": seq},
            source_event_seqs=[seq, *(s for s in sources if s != seq)])

    def end(self, reason: Mapping[str, Any] | None = None) -> Event | None:
        """Append ``turn/end {turn, reason}`` (default: :attr:`reason`, else completed).

        A step still open is closed first. Idempotent: a second call returns None.
        """
        if self._ended:
            return None
        if self._step is not None:
            self._step.end()
        final = dict(reason) if reason is not None else (self.reason or {"kind": "completed"})
        self._ended = True
        self._recorder._turn = None
        return self._recorder._append("turn/end", {"turn": self.number, "reason": final})

    def __enter__(self) -> TurnRecorder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self._ended:
            self.end(turn_end_reason(exc) if exc is not None and self.reason is None
                     else None)
            recorder = self._recorder
            if recorder._flush_on_turn_end and exc is None:
                recorder.flush()


class StepRecorder:
    """One open step; created by :meth:`TurnRecorder.step`.

    Attributes:
        turn: The turn number.
        number: The step number.
    """

    def __init__(self, turn: TurnRecorder, number: int) -> None:
        self._turn = turn
        self._recorder = turn.recorder
        self.turn = turn.number
        self.number = number
        self._chunk_seqs: list[int] = []
        self._assistant: Event | None = None
        self._offered: dict[str, str] = {}  # call id -> tool name, from the assistant message
        self._called: dict[str, int] = {}  # call id -> tool/call seq, not yet answered
        self._answered: set[str] = set()
        self._ended = False

    @property
    def assistant_event(self) -> Event | None:
        """The step's ``assistant/message`` event, or None before it."""
        return self._assistant

    @property
    def dispatched(self) -> tuple[str, ...]:
        """Call ids with a ``tool/call`` recorded and no result yet, in record order."""
        return tuple(self._called)

    @property
    def unanswered(self) -> tuple[str, ...]:
        """Call ids the assistant made that have no result yet, in model order."""
        return tuple(c for c in self._offered if c not in self._answered)

    def _check(self, what: str) -> None:
        if self._ended:
            raise AgentError(f"turn {self.turn} step {self.number} has ended; cannot record "
                             f"{what}", code="RECORDER")

    def _where(self) -> dict[str, int]:
        return {"turn": self.turn, "step": self.number}

    def user_message(self, content: str | Sequence[Mapping[str, Any]] | Mapping[str, Any], *,
                     source: Mapping[str, Any] | None = None) -> Event:
        """Append a ``user/message`` entering this step (before the model's reply).

        Raises:
            AgentError: code ``RECORDER`` after the step's assistant message: a message there
                would land between a tool call and its result; send it in the next step.
        """
        self._check("a user message")
        if self._assistant is not None:
            raise AgentError(f"turn {self.turn} step {self.number}: a user message after the "
                             f"assistant message would land between tool calls and their "
                             f"results; record it in the next step", code="RECORDER")
        return self._recorder._append("user/message", as_user_message(content, source=source),
                                      surface_op="append")

    def request(self, config: Mapping[str, Any], *, system: str | None = None,
                tools: Sequence[Mapping[str, Any]] | None = None,
                adapter_defaults: Mapping[str, bool] | None = None,
                context_window: int | None = None) -> FrozenDict:
        """Log what the next model request is sent with; return the canonical header.

        Appends ``request/header`` on the recorder's first request (``reason: "initial"``
        when the log has no header yet, else ``"resume"``) and later only when the canonical
        header differs from the latest logged one (``"change"``); appends ``request/context
        {provider, model, contextWindow?}`` when any of the three changed.

        Args:
            config: ``{provider, model, reasoningEffort?, temperature?, maxTokens?, stop?}``.
            system: System prompt ('' or None: none).
            tools: Tool declarations ``{name, description, parameters}``.
            adapter_defaults: ``{reasoningEffort?: True, maxTokens?: True}`` markers.
            context_window: The model's context window in tokens.

        Raises:
            EventRejectedError: the config lacks a provider or model (code ``SHAPE``).
        """
        self._check("a request")
        recorder = self._recorder
        session = recorder._session
        raw: dict[str, Any] = {"config": snapshot_json(dict(config))}
        if adapter_defaults:
            raw["adapterDefaults"] = dict(adapter_defaults)
        if system:
            raw["system"] = system
        if tools:
            raw["tools"] = [dict(t) for t in tools]
        header = canonical_header(snapshot_json(raw))
        latest = session.request_header()
        if recorder._headers_logged == 0 or latest is None or not header_equals(header, latest):
            if recorder._headers_logged == 0:
                reason = "initial" if latest is None else "resume"
            else:
                reason = "change"
            recorder._append("request/header", {"header": header, "reason": reason})
            recorder._headers_logged += 1
        context: dict[str, Any] = {"provider": header["config"]["provider"],
                                   "model": header["config"]["model"]}
        if context_window is not None:
            context["contextWindow"] = context_window
        if session.request_context() != context:
            recorder._append("request/context", context)
        folded = session.request_header()
        assert folded is not None  # just logged or equal to the logged one
        return folded

    def chunk(self, chunk: Mapping[str, Any]) -> Event:
        """Append one streamed chunk as ``assistant/chunk {turn, step, chunk}``; cited later."""
        self._check("a chunk")
        if self._assistant is not None:
            raise AgentError(f"turn {self.turn} step {self.number}: chunks after the assistant "
                             f"message belong to no reply", code="RECORDER")
        event = self._recorder._append("assistant/chunk", {**self._where(), "chunk": chunk})
        self._chunk_seqs.append(event["seq"])
        return event

    def discard_attempt(self) -> None:
        """Forget the chunks of a failed attempt: the final message cites only its own."""
        self._chunk_seqs = []

    @property
    def chunk_seqs(self) -> tuple[int, ...]:
        """Seqs of the current attempt's chunks."""
        return tuple(self._chunk_seqs)

    def assistant(self, content: str | Sequence[Mapping[str, Any]] | None = None, *,
                  message: Mapping[str, Any] | None = None, provider: str | None = None,
                  model: str | None = None, usage: Mapping[str, int] | None = None,
                  replay_state: JsonValue = None, interrupted: bool = False,
                  request: JsonValue = None) -> Event:
        """Append the step's one ``assistant/message``, citing this attempt's chunk seqs.

        Args:
            content: Text or content blocks (``text``, ``reasoning``, ``tool-call``).
            message: A whole assistant message instead of ``content``.
            provider: Provider id (default: the latest ``request/context``'s).
            model: Model id (default: the latest ``request/context``'s).
            usage: Token usage ``{inputTokens, outputTokens, ...}``.
            replay_state: Adapter replay state for the message source.
            interrupted: Marks a cancelled stream's visible prefix (``interrupted: true``).
            request: The fingerprint of the request this message answers (``{tools, system,
                messages, prefix, sharedMessages}``; docs/effects.md#cache-keeping-compaction).

        Raises:
            AgentError: code ``RECORDER`` for a second assistant message in the step, for
                neither or both of content and message, without provider/model and no logged
                request context, or for tool calls without an id or name, or repeated ids.
        """
        self._check("an assistant message")
        if self._assistant is not None:
            raise AgentError(f"turn {self.turn} step {self.number} already has its assistant "
                             f"message (seq {self._assistant['seq']}); start a new step",
                             code="RECORDER")
        if (content is None) == (message is None):
            raise AgentError("pass the assistant's content or a whole message, not both",
                             code="RECORDER")
        if message is None:
            context: Mapping[str, Any] = self._recorder._session.request_context() or {}
            provider = provider or context.get("provider")
            model = model or context.get("model")
            if not provider or not model:
                raise AgentError("an assistant message needs provider and model: pass them or "
                                 "record step.request(config) first", code="RECORDER")
            message = create_assistant_message(content=text_blocks(content or ""),
                                               provider=provider, model=model,
                                               replay_state=replay_state)
        offered: dict[str, str] = {}
        for block in message.get("content") or ():
            if isinstance(block, Mapping) and block.get("type") == "tool-call":
                call_id, name = block.get("id"), block.get("name")
                if not isinstance(call_id, str) or not call_id or not isinstance(name, str) \
                        or not name or call_id in offered:
                    raise AgentError(f"turn {self.turn} step {self.number}: a tool-call block "
                                     f"needs a unique non-empty id and a name (found id "
                                     f"{call_id!r}, name {name!r})", code="RECORDER")
                offered[call_id] = name
        data: dict[str, Any] = {**self._where(), "message": message}
        if usage is not None:
            data["usage"] = dict(usage)
        if interrupted:
            data["interrupted"] = True
        if request is not None:
            data["request"] = request
        event = self._recorder._append("assistant/message", data, surface_op="append",
                                       source_event_seqs=list(self._chunk_seqs))
        self._assistant = event
        self._offered = offered
        return event

    def tool_call(self, call_id: str, name: str | None = None,
                  arguments: str | None = None, *, effect: str | None = None,
                  epoch: int = 0) -> Event:
        """Append ``tool/call {turn, step, callId, name, arguments}`` before a tool body runs.

        Args:
            call_id: A call id of the step's assistant message.
            name: Tool name (default: the assistant's).
            arguments: Raw JSON argument text (default: the assistant's).
            effect: The tool's effect class; when given, the call also records ``effect`` and
                its ``idempotencyKey`` (from the session id, this event's seq and ``epoch``).
            epoch: The writer's fencing epoch (0 for backends without one).

        Raises:
            AgentError: code ``RECORDER`` when the assistant made no such call or it was
                already recorded.
        """
        self._check("a tool call")
        if call_id not in self._offered:
            raise AgentError(f"turn {self.turn} step {self.number}: the assistant message made "
                             f"no tool call {call_id!r} (calls: {list(self._offered)})",
                             code="RECORDER")
        if call_id in self._called or call_id in self._answered:
            raise AgentError(f"turn {self.turn} step {self.number}: tool call {call_id!r} is "
                             f"already recorded", code="RECORDER")
        block = self._block(call_id)
        data: dict[str, Any] = {
            **self._where(), "callId": call_id, "name": name or self._offered[call_id],
            "arguments": arguments if arguments is not None else block.get("arguments", "")}
        if effect is not None:
            # here, not at module level: the effects module (and the tool machinery it
            # imports) stays out of a process that records no effect-classed call, as the
            # framework adapters' (docs/adapters.md#memory)
            from dsh.agent._effects import idempotency_key

            session = self._recorder._session
            self._recorder._sync()
            data["effect"] = effect
            data["idempotencyKey"] = idempotency_key(session.id, session.seq, epoch,
                                                     created_at=session.header.created_at)
        event = self._recorder._append("tool/call", data)
        self._called[call_id] = event["seq"]
        return event

    def _block(self, call_id: str) -> Mapping[str, Any]:
        assert self._assistant is not None
        for block in self._assistant["data"]["message"]["content"]:
            if block.get("type") == "tool-call" and block.get("id") == call_id:
                found: Mapping[str, Any] = block
                return found
        return {}  # pragma: no cover - offered ids come from these blocks

    def tool_result(self, call_id: str, content: str | Sequence[Mapping[str, Any]], *,
                    is_error: bool = False, error: Mapping[str, str] | None = None,
                    meta: JsonValue = None) -> Event:
        """Append the ``tool/result`` answering the recorded ``tool/call`` ``call_id``.

        Args:
            call_id: A call recorded with :meth:`tool_call` in this step.
            content: Text or content blocks the model sees.
            is_error: Marks the result an error (``isError: true``).
            error: The failure identity ``{name, code}`` (implies ``is_error``).
            meta: Tool metadata kept in the log, not shown to the model.

        Raises:
            AgentError: code ``RECORDER`` when no ``tool/call`` for ``call_id`` is pending
                in this step (never recorded, or already answered).
        """
        self._check("a tool result")
        call_seq = self._called.get(call_id)
        if call_seq is None:
            state = "already answered" if call_id in self._answered else "not recorded"
            raise AgentError(f"turn {self.turn} step {self.number}: tool call {call_id!r} is "
                             f"{state}; record step.tool_call({call_id!r}) first and answer it "
                             f"once", code="RECORDER")
        message = create_tool_result_message(call_id=call_id, content=text_blocks(content),
                                             is_error=is_error or error is not None)
        data: dict[str, Any] = {**self._where(), "message": message}
        if error is not None:
            data["error"] = {"name": str(error.get("name")), "code": str(error.get("code"))}
        if meta is not None:
            data["meta"] = meta
        event = self._recorder._append("tool/result", data, surface_op="append",
                                       source_event_seqs=[call_seq])
        del self._called[call_id]
        self._answered.add(call_id)
        return event

    def abort_call(self, call_id: str) -> Event:
        """Pair a call whose body never ran with the ABORTED_BEFORE_DISPATCH result.

        Appends the ``tool/call`` first when it was not recorded yet (docs/agent.md#tool-execution).
        """
        if call_id not in self._called:
            self.tool_call(call_id)
        return self.tool_result(call_id, ABORTED_BEFORE_DISPATCH_TEXT,
                                error={"name": "AbortError", "code": ABORTED_BEFORE_DISPATCH})

    def _close_calls(self) -> list[str]:
        """Answer every call of the step that has no result; return their ids."""
        closed: list[str] = []
        for call_id in self.unanswered:
            if call_id in self._called:
                text = closer_text("interrupted", started=True, call_id=call_id,
                                   tool_name=self._offered[call_id])
                self.tool_result(call_id, text, error={"name": "ToolOutcomeUnknownError",
                                                       "code": TOOL_OUTCOME_UNKNOWN})
            else:
                self.abort_call(call_id)
            closed.append(call_id)
        return closed

    def end(self) -> list[str]:
        """Answer unanswered calls (see the module rules), then append ``step/end``.

        Returns:
            The call ids that got a synthetic result. Idempotent: [] once ended.
        """
        if self._ended:
            return []
        closed = self._close_calls()
        self._ended = True
        self._turn._step = None
        self._recorder._append("step/end", self._where())
        return closed

    def __enter__(self) -> StepRecorder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        closed = self.end()
        if closed and exc is None:
            raise AgentError(f"turn {self.turn} step {self.number} ended with unanswered tool "
                             f"calls {closed}; each got a synthetic error result so the log "
                             f"stays balanced; record a result for every call",
                             code="RECORDER")

"""The session-log invariant companion: turn/step nesting and tool call/result pairing.

Optional: the Session itself enforces none of this (docs/rules.md#turns-and-steps). A trace
    validates an event
against the state left by the committed events before it and returns a staged transition without
changing anything; the transition is applied only once the event is committed. Rules
(docs/rules.md#turns-and-steps):

* seqs strictly increase;
* turns open one at a time, numbered 1, 2, … and close in order, never with a step open;
* steps open one at a time inside the open turn, numbered 1, 2, … per turn;
* chunks, assistant messages, tool calls and fresh tool results name the open turn and step;
* a fresh tool result answers a ``tool/call`` of the same step (a synthetic not-started result
  is exempt); a tool-result replacement only needs some open turn;
* ``todo/write``, ``request/header`` and ``request/context`` happen inside a turn.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from dsh._errors import InvariantError
from dsh.session._events import Event

INVARIANT_PREFIX: Final = "session-log invariant violated: "
"""Prefix of every :class:`~dsh._errors.InvariantError` message raised here.

Rule: docs/rules.md#turns-and-steps.
"""

_TURN_ENCLOSED: Final = frozenset({"todo/write", "request/header", "request/context"})
_STEP_SCOPED: Final = frozenset({"assistant/chunk", "assistant/message", "tool/call"})
_RULED: Final = _TURN_ENCLOSED | _STEP_SCOPED | {"turn/start", "turn/end", "step/start",
                                                "step/end", "tool/result"}
"""The types :func:`_check` and :func:`_advance` look at; any other only moves ``last_seq``."""


@dataclass(frozen=True, slots=True)
class TraceState:
    """The trace of one session after some prefix of its log (docs/rules.md#turns-and-steps).

    Attributes:
        last_seq: Seq of the last applied event (-1 before any).
        open_turn: Number of the open turn, or None.
        open_step: Number of the open step, or None.
        next_turn: Number the next ``turn/start`` must carry.
        next_step: Number the next ``step/start`` of the open turn must carry.
        pending_calls: Call ids with a ``tool/call`` in the open step and no result yet.
    """

    last_seq: int = -1
    open_turn: Any = None
    open_step: Any = None
    next_turn: int = 1
    next_step: int = 1
    pending_calls: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True, slots=True)
class Transition:
    """A validated, not yet applied change of a trace: ``event`` leads to ``state``."""

    event: Event
    state: TraceState


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule of a log (from :func:`check_log`, ``dsh verify``, the compaction check).

    Attributes:
        seq: Seq of the offending event; None when the problem is not tied to one event (the
            header, a restore point, an event without an integer seq).
        rule: Stable upper-snake rule code, e.g. ``TURN_NUMBER`` or ``UNPAIRED_RESULT``.
        message: One sentence: the rule, found vs expected, where.
        session_id: The session, when the check spans several (``dsh verify --all``).
    """

    seq: int | None
    rule: str
    message: str
    session_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"session", "seq", "rule", "message"}`` (``session`` None when not set)."""
        return {"session": self.session_id, "seq": self.seq, "rule": self.rule,
                "message": self.message}

    def line(self) -> str:
        """``[<session> ]seq <N> <RULE>: <message>`` on one line (``seq -`` without a seq)."""
        seq = "-" if self.seq is None else str(self.seq)
        where = f"{self.session_id} " if self.session_id is not None else ""
        return f"{where}seq {seq} {self.rule}: {' '.join(self.message.split())}"


class _Broken(Exception):
    """Internal: one rule failed; carries the rule id and the message."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule
        self.message = message


def _field(event: Event, key: str) -> Any:
    data = event.get("data")
    return data.get(key) if isinstance(data, dict) else None


def _same(a: Any, b: Any) -> bool:
    # bool is never a number (docs/formats.md#lossless-json); None equals only None
    return type(a) is type(b) and a == b


def _fmt(value: Any) -> str:
    return "null" if value is None else repr(value) if type(value) is not int else str(value)


def _require_open_step(event: Event, state: TraceState | _Trace) -> None:
    turn, step = _field(event, "turn"), _field(event, "step")
    if not (_same(turn, state.open_turn) and _same(step, state.open_step)) \
            or state.open_turn is None or state.open_step is None:
        raise _Broken("STEP_MISMATCH",
                      f"{event.get('type')} names turn {_fmt(turn)}/step {_fmt(step)} but open is "
                      f"turn {_fmt(state.open_turn)}/step {_fmt(state.open_step)}")


def _is_not_started_result(event: Event) -> bool:
    message = _field(event, "message")
    error = _field(event, "error")
    content = message.get("content") if isinstance(message, dict) else None
    first = content[0] if isinstance(content, list) and content else None
    return (isinstance(first, dict) and first.get("isError") is True
            and isinstance(error, dict) and error.get("code") == "TOOL_NOT_STARTED")


def _result_call_id(event: Event) -> Any:
    message = _field(event, "message")
    source = message.get("source") if isinstance(message, dict) else None
    call_id = source.get("callId") if isinstance(source, dict) else None
    # any JSON value can arrive here from a damaged log; only a string can name a call
    return call_id if type(call_id) is str else None


def _check(state: TraceState | _Trace, event: Event) -> None:
    """Raise _Broken for the first rule ``event`` breaks after ``state``.

    Rule: docs/rules.md#turns-and-steps.
    """
    seq = event.get("seq")
    if type(seq) is not int or seq <= state.last_seq:
        raise _Broken("SEQ_ORDER",
                      f"seq must strictly increase: saw {_fmt(seq)} after {state.last_seq}")
    kind = event.get("type")
    if kind == "turn/start":
        turn = _field(event, "turn")
        if state.open_turn is not None:
            raise _Broken("TURN_NESTED", f"turn/start {_fmt(turn)} while turn "
                                         f"{_fmt(state.open_turn)} is still open")
        if not _same(turn, state.next_turn):
            raise _Broken("TURN_NUMBER",
                          f"turn/start expected turn {state.next_turn}, got {_fmt(turn)}")
    elif kind == "turn/end":
        turn = _field(event, "turn")
        if state.open_turn is None or not _same(turn, state.open_turn):
            raise _Broken("TURN_MISMATCH", f"turn/end {_fmt(turn)} does not match open turn "
                                           f"{_fmt(state.open_turn)}")
        if state.open_step is not None:
            raise _Broken("TURN_END_OPEN_STEP", f"turn/end {_fmt(turn)} while step "
                                                f"{_fmt(state.open_step)} is still open")
    elif kind == "step/start":
        turn, step = _field(event, "turn"), _field(event, "step")
        if state.open_turn is None or not _same(turn, state.open_turn):
            raise _Broken("STEP_OUTSIDE_TURN", f"step/start in turn {_fmt(turn)} but open turn "
                                               f"is {_fmt(state.open_turn)}")
        if state.open_step is not None:
            raise _Broken("STEP_NESTED", f"step/start {_fmt(step)} while step "
                                         f"{_fmt(state.open_step)} is still open")
        if not _same(step, state.next_step):
            raise _Broken("STEP_NUMBER", f"step/start expected step {state.next_step} in turn "
                                         f"{_fmt(turn)}, got {_fmt(step)}")
    elif kind == "step/end" or kind in _STEP_SCOPED:
        _require_open_step(event, state)
    elif kind == "tool/result":
        if event.get("surfaceOp") != "append":
            # a content rewrite the surface already validated: only turn enclosure matters
            if state.open_turn is None:
                raise _Broken("REPLACEMENT_OUTSIDE_TURN", "tool/result surface replacement "
                                                          "appended outside any open turn")
            return
        _require_open_step(event, state)
        call_id = _result_call_id(event)
        if call_id not in state.pending_calls and not _is_not_started_result(event):
            raise _Broken("UNPAIRED_RESULT", f"tool/result for {_fmt(call_id)} with no prior "
                                             "tool/call in this step")
    elif kind in _TURN_ENCLOSED and state.open_turn is None:
        raise _Broken("OUTSIDE_TURN", f"{kind} appended outside any open turn (core execution "
                                      "events must be turn-enclosed)")


class _Trace:
    """A :class:`TraceState` that :func:`_advance` changes in place (``check_log``'s one state).

    Same fields, same meaning; a log's walk then makes no state object per event.
    """

    __slots__ = ("last_seq", "next_step", "next_turn", "open_step", "open_turn",
                 "pending_calls")

    def __init__(self, state: TraceState) -> None:
        self.last_seq = state.last_seq
        self.open_turn: Any = state.open_turn
        self.open_step: Any = state.open_step
        self.next_turn = state.next_turn
        self.next_step = state.next_step
        self.pending_calls = state.pending_calls

    def frozen(self) -> TraceState:
        """The state as a :class:`TraceState`."""
        return TraceState(self.last_seq, self.open_turn, self.open_step, self.next_turn,
                          self.next_step, self.pending_calls)


def _advance(state: _Trace, event: Event) -> None:
    """Move ``state`` past ``event``, assuming its checks passed.

    Each effect restates the event's own claim (e.g. ``next_turn = turn + 1``); on a valid log
    that equals dsh's counter arithmetic, and after a violation it lets :func:`check_log`
    resynchronise instead of reporting every later event.
    """
    seq = event.get("seq")
    if type(seq) is int and seq > state.last_seq:
        state.last_seq = seq
    kind = event.get("type")
    if kind == "turn/start":
        state.open_turn, state.open_step = _field(event, "turn"), None
        state.next_step, state.pending_calls = 1, frozenset()
    elif kind == "turn/end":
        turn = _field(event, "turn")
        state.next_turn = turn + 1 if type(turn) is int else state.next_turn + 1
        state.open_turn, state.open_step = None, None
        state.next_step, state.pending_calls = 1, frozenset()
    elif kind == "step/start":
        state.open_step = _field(event, "step")
    elif kind == "step/end":
        step = _field(event, "step")
        state.next_step = step + 1 if type(step) is int else state.next_step + 1
        state.open_step, state.pending_calls = None, frozenset()
    elif kind == "tool/call":
        call_id = _field(event, "callId")
        if type(call_id) is str:
            state.pending_calls = state.pending_calls | {call_id}
    elif kind == "tool/result" and event.get("surfaceOp") == "append":
        call_id = _result_call_id(event)
        if call_id in state.pending_calls:
            state.pending_calls = state.pending_calls - {call_id}


def _effect(state: TraceState, event: Event) -> TraceState:
    """Return the state after ``event``, assuming its checks passed (:func:`_advance`)."""
    trace = _Trace(state)
    _advance(trace, event)
    return trace.frozen()


class InvariantTrace:
    """The invariant trace of one session: validate before commit, apply after.

    ``validate`` never changes the trace, so a later veto of the append leaves no trace;
    ``apply`` (or ``commit``) records a committed event.
    Rule: docs/rules.md#turns-and-steps.
    """

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state = TraceState()

    @property
    def state(self) -> TraceState:
        """The state after the applied events."""
        return self._state

    def validate(self, event: Event) -> Transition:
        """Check ``event`` as the next committed event; return the staged transition.

        Raises:
            InvariantError: the first rule of docs/rules.md#turns-and-steps it breaks; the message
                starts with :data:`INVARIANT_PREFIX`; ``where`` has ``seq``, ``event_type`` and
                ``rule``.
        """
        try:
            _check(self._state, event)
        except _Broken as broken:
            seq = event.get("seq")
            raise InvariantError(INVARIANT_PREFIX + broken.message, code="INVARIANT",
                                 seq=seq if type(seq) is int else None,
                                 event_type=event.get("type"), rule=broken.rule) from None
        return Transition(event, _effect(self._state, event))

    def commit(self, transition: Transition) -> None:
        """Apply a transition :meth:`validate` returned for the current state."""
        self._state = transition.state

    def apply(self, event: Event) -> None:
        """Validate ``event`` and apply it (a committed event).

        Raises:
            InvariantError: as :meth:`validate`; the trace is then unchanged.
        """
        self._state = self.validate(event).state

    def replay(self, events: Iterable[Event]) -> None:
        """Apply every event of ``events`` in order.

        Raises:
            InvariantError: at the first violation; the events before it stay applied.
        """
        for event in events:
            self.apply(event)


_BOUNDARIES: Final = frozenset({"turn/start", "turn/end", "step/start", "step/end"})
_NO_CALLS: Final[frozenset[str]] = frozenset()


def _boundary(state: _Trace, kind: str, data: Any, seq: int) -> bool:
    """Apply a turn or step boundary that keeps every rule; False: let the full check judge it.

    The fast path of :func:`check_log`: ``seq`` already follows ``state.last_seq``; each
    branch is the valid case of :func:`_check` and the effect :func:`_advance` gives it.
    """
    if not isinstance(data, dict):
        return False
    turn = data.get("turn")
    open_turn = state.open_turn
    # ``_same`` inlined: bool is never a number, None equals only None
    same_turn = type(turn) is type(open_turn) and turn == open_turn
    if kind == "step/start":
        step, next_step = data.get("step"), state.next_step
        if open_turn is None or state.open_step is not None or not same_turn \
                or type(step) is not type(next_step) or step != next_step:
            return False
        state.open_step = step
    elif kind == "step/end":
        step, open_step = data.get("step"), state.open_step
        if open_turn is None or open_step is None or not same_turn \
                or type(step) is not type(open_step) or step != open_step:
            return False
        state.next_step = step + 1 if type(step) is int else state.next_step + 1
        state.open_step, state.pending_calls = None, _NO_CALLS
    elif kind == "turn/start":
        next_turn = state.next_turn
        if open_turn is not None or type(turn) is not type(next_turn) or turn != next_turn:
            return False
        state.open_turn, state.open_step = turn, None
        state.next_step, state.pending_calls = 1, _NO_CALLS
    else:  # turn/end
        if open_turn is None or state.open_step is not None or not same_turn:
            return False
        state.next_turn = turn + 1 if type(turn) is int else state.next_turn + 1
        state.open_turn = None
        state.next_step, state.pending_calls = 1, _NO_CALLS
    state.last_seq = seq
    return True


def check_log(events: Iterable[Event]) -> list[Violation]:
    """Check a whole log and return every violation, in log order (for ``dsh verify``).

    After a violation the trace resynchronises on the offending event's own claim (its turn,
    step, call) so one defect is reported once rather than at every later event.

    Args:
        events: A log in seq order (any prefix, e.g. a stored log with its seed).

    Returns:
        One :class:`Violation` per offending event (its first broken rule); empty when valid.
    Rule: docs/rules.md#turns-and-steps.
    """
    state = _Trace(TraceState())
    violations: list[Violation] = []
    for event in events:
        kind = event.get("type")
        seq = event.get("seq")
        if type(seq) is int and seq > state.last_seq and type(kind) is str:
            if kind not in _RULED:
                state.last_seq = seq  # its only rule and its only effect
                continue
            if kind in _BOUNDARIES and _boundary(state, kind, event.get("data"), seq):
                continue
        try:
            _check(state, event)
        except _Broken as broken:
            seq = event.get("seq")
            violations.append(Violation(seq if type(seq) is int else None, broken.rule,
                                        broken.message))
        _advance(state, event)
    return violations


class TraceSession(Protocol):
    """What the observer needs of a session: its log (the store's ``Session`` matches)."""

    @property
    def events(self) -> tuple[Event, ...]:
        """The committed log, including seed and end-seed."""
        ...


class ObservableSession(TraceSession, Protocol):
    """A session with pre-commit validators and post-commit observers (``Session`` matches)."""

    def add_validator(self, callback: Callable[[Any, Event], object]) -> Callable[[], None]:
        """Run ``callback(session, candidate)`` before each commit; raising vetoes the append."""
        ...

    def observe(self, callback: Callable[[Any, Event], object]) -> Callable[[], None]:
        """Run ``callback(session, event)`` after each commit."""
        ...


class InvariantObserver:
    """A ``SessionStore`` observer that keeps one :class:`InvariantTrace` per session.

    ``on_created`` replays the new session's whole log and raises :class:`InvariantError` to
    veto the creation; ``validate`` is the pre-commit check the store's append path calls;
    ``on_event`` applies a committed event; ``on_disposed`` forgets the session. A session it
    has not seen created (the observer was added later) is replayed from its log on first use.
    Rule: docs/rules.md#turns-and-steps.
    """

    def __init__(self) -> None:
        self._traces: weakref.WeakKeyDictionary[Any, InvariantTrace] = weakref.WeakKeyDictionary()

    def attach(self, session: ObservableSession) -> Callable[[], None]:
        """Guard one session directly: replay it, then validate and apply its every append.

        Returns:
            A function that detaches the hooks and forgets the session's trace.

        Raises:
            InvariantError: the session's existing log breaks a rule (nothing is attached).
        """
        self.on_created(session)
        remove_validator = session.add_validator(self.validate)
        unobserve = session.observe(self.on_event)

        def detach() -> None:
            remove_validator()
            unobserve()
            self.on_disposed(session)

        return detach

    def trace(self, session: TraceSession) -> InvariantTrace:
        """Return the session's trace, replaying its log when it has none yet.

        Raises:
            InvariantError: the existing log breaks a rule.
        """
        trace = self._traces.get(session)
        if trace is None:
            trace = InvariantTrace()
            trace.replay(session.events)
            self._traces[session] = trace
        return trace

    def validate(self, session: TraceSession, event: Event) -> Transition:
        """Pre-commit hook: check ``event`` as the session's next event; change nothing.

        Raises:
            InvariantError: the event breaks a rule; the store must reject the append.
        """
        return self.trace(session).validate(event)

    def on_created(self, session: TraceSession) -> None:
        """Replay the new session's whole log into a fresh trace.

        Raises:
            InvariantError: the seed breaks a rule (the store rolls the creation back).
        """
        trace = InvariantTrace()
        trace.replay(session.events)
        self._traces[session] = trace

    def on_event(self, session: TraceSession, event: Event) -> None:
        """Apply a committed event to the session's trace.

        Raises:
            InvariantError: the event breaks a rule (it was committed without the pre-commit
                check); the trace stays at the previous event.
        """
        trace = self._traces.get(session)
        if trace is None:
            # first sight of this session: its log already holds ``event``
            trace = InvariantTrace()
            trace.replay(e for e in session.events if e.get("seq", -1) <= event.get("seq", -1))
            self._traces[session] = trace
            return
        trace.apply(event)

    def on_flush(self, session: TraceSession) -> None:
        """Nothing to make durable."""

    def on_disposed(self, session: TraceSession) -> None:
        """Forget the session's trace."""
        self._traces.pop(session, None)

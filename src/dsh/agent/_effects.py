"""The effect ledger: what the log says about each tool call's side effects, and what is owed.

A crash can stop a tool call anywhere: before its body, during it, after its effect but before
its result is durable. The log tells which: ``tool/call`` is durable before a body runs (the
tool checkpoint), crash repair answers a recorded call without a result with
``TOOL_OUTCOME_UNKNOWN``. This module folds the log into one :class:`CallRecord` per call and
plans what a resumed agent owes each one (Rule: docs/effects.md#resume-decisions):

* ``read_only`` and ``idempotent`` calls run again (the same idempotency key);
* ``reconcilable`` calls ask ``reconcile(key)`` and record what it found, or run again;
* ``irreversible`` calls never run again on their own: they stay "in doubt", answered as the
  repair answered them, and a person is asked through a durable approval;
* answered approvals are carried out (run, or told the model it was denied); an approval whose
  deadline passed is a denial; an approved call whose arguments a redaction or erasure changed
  after it was requested is never run (:meth:`CallRecord.forgotten_by`).

Invariants this module owns:

* the idempotency key of a call is a pure function of (session id, ``tool/call`` seq, writer
  epoch) and is recorded in the ``tool/call`` (and in every ``tool/recovery`` decision), so
  every run of the call uses the recorded key, never a recomputed one;
* a body start is counted from the log alone: a ``tool/call`` not gated by an approval, and
  every ``run`` decision; a decision not followed by a rewritten result means that run's
  outcome is unknown again;
* planning reads the log and changes nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal, TypeAlias

from dsh.agent._tools import TOOL_EFFECTS, ToolEffect
from dsh.session import (
    QUARANTINE_APPLY,
    QUARANTINE_RELEASE,
    REDACTION_APPLIED,
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    Event,
)

RECOVERY_EVENT: Final = "tool/recovery"
"""A resumed agent's decision about one interrupted or approved call (ignorable, log-only)."""

APPROVAL_REQUESTED: Final = "approval/requested"
"""A call waits for a person's yes (ignorable, log-only)."""

APPROVAL_ANSWERED: Final = "approval/answered"
"""A person's (or the deadline's) answer to the latest ``approval/requested`` of a call."""

EFFECT_EVENT_TYPES: Final = frozenset({RECOVERY_EVENT, APPROVAL_REQUESTED, APPROVAL_ANSWERED})

KEY_PREFIX: Final = "dsh-"

ActionKind: TypeAlias = Literal["run", "reconcile", "in-doubt", "not-started", "deny", "expire",
                                "forgotten", "quarantined"]
"""What a resumed agent does for one call (see :meth:`EffectLedger.plan`)."""


def format_ms(epoch_ms: int) -> str:
    """``YYYY-MM-DD HH:MM:SS UTC`` for an epoch-ms time (deadlines in messages)."""
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def idempotency_key(session_id: str, call_seq: int, epoch: int, *,
                    created_at: int | None = None) -> str:
    """Return the stable idempotency key of the call recorded at ``call_seq``.

    Args:
        session_id: The session id.
        call_seq: Seq of the call's ``tool/call`` (or of the ``tool/recovery`` decision that
            first ran a call whose ``tool/call`` never became durable).
        epoch: The writer's fencing epoch when the call was recorded (PostgreSQL's lease
            epoch; 0 for backends without one).
        created_at: The session header's ``createdAt`` (epoch ms), when known: two stores
            holding sessions of the same id (``s1``) then never share keys.

    Returns:
        ``"dsh-"`` and 40 lowercase hex digits (SHA-256 of the values): short enough for any
        ``Idempotency-Key`` header, and different for a call a fenced-out writer recorded at
        the same seq.
    Rule: docs/effects.md#idempotency-keys.
    """
    identity = session_id if created_at is None else f"{session_id}\x00{created_at}"
    digest = hashlib.sha256(f"{identity}\x00{call_seq}\x00{epoch}".encode()).hexdigest()
    return KEY_PREFIX + digest[:40]


@dataclass(slots=True)
class CallRecord:
    """What the log says about one tool call (the latest call with its id wins).

    Attributes:
        call_id: The provider's call id.
        name: The tool name the model called.
        arguments: The raw argument JSON text.
        turn: Turn of the step that made the call.
        step: Step that made the call.
        call_seq: Seq of its ``tool/call``, or None when none was recorded.
        effect: The effect class recorded with the call (None in logs written before effect
            classes: treated as ``irreversible``).
        key: The idempotency key recorded with the call or its latest decision, or None.
        result: The call's current result event (the latest appended or rewritten
            ``tool/result``), or None.
        closer: ``TOOL_OUTCOME_UNKNOWN`` or ``TOOL_NOT_STARTED`` while the current result is
            a crash repair's closer of an ``interrupted`` turn; else None.
        runs: Body starts the log records (a ``tool/call`` not gated by an approval, and each
            ``run`` decision).
        decided: A decision about the current closer was logged.
        open_decision: The latest ``run`` or ``reconcile`` decision no rewritten result
            followed (its outcome is unknown), or None.
        awaiting: The ``approval/requested`` with no answer yet, or None.
        answer: The latest ``approval/answered`` not yet carried out, or None.
        last_request: The latest ``approval/requested`` (answered or not), or None.
        message_seq: Seq of the ``assistant/message`` holding the call (its arguments come
            from there), or None.
        rewritten_by: Seq of the ``redaction/applied`` record that rewrote an event, by the
            event's seq, for this call's message and approval requests.
        quarantined_by: Seq of the ``quarantine/apply`` record withholding the call's message
            from the model view, or None (never quarantined, or given back since).
    """

    call_id: str
    name: str
    arguments: str
    turn: int
    step: int
    call_seq: int | None = None
    effect: ToolEffect | None = None
    key: str | None = None
    result: Event | None = None
    closer: str | None = None
    runs: int = 0
    decided: bool = False
    open_decision: Event | None = None
    awaiting: Event | None = None
    answer: Event | None = None
    last_request: Event | None = None
    message_seq: int | None = None
    rewritten_by: dict[int, int] = field(default_factory=dict)
    quarantined_by: int | None = None
    _gated: bool = field(default=False, repr=False)
    _pending_closer: str | None = field(default=None, repr=False)

    def forgotten_by(self) -> int | None:
        """The ``redaction/applied`` seq that may have changed the arguments, or None.

        The arguments a yes runs are the ones in the call's ``assistant/message``. They are
        intact when no redaction rewrote that message, or when the latest request was not
        rewritten and still holds the same text (the rewrite took other content of the
        message). Otherwise what would run is not what a person was asked about.
        Rule: docs/effects.md#approvals-and-forgetting.
        """
        if self.message_seq is None or self.message_seq not in self.rewritten_by:
            return None
        request = self.last_request
        if request is not None and request["seq"] not in self.rewritten_by \
                and request["data"].get("arguments") == self.arguments:
            return None
        return self.rewritten_by[self.message_seq]


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingApproval:
    """An approval nobody answered yet.

    Attributes:
        call_id: The call it is about.
        name: Tool name.
        arguments: Raw argument JSON text.
        reason: ``"tool"`` (the tool needs a yes for every call) or ``"in-doubt"`` (an
            irreversible call a crash interrupted: yes runs it again).
        requested_seq: Seq of the ``approval/requested``.
        requested_ms: When it was requested (epoch ms).
        deadline_ms: After this time (epoch ms) it counts as denied.
    """

    call_id: str
    name: str
    arguments: str
    reason: str
    requested_seq: int
    requested_ms: int
    deadline_ms: int

    def to_json(self) -> dict[str, Any]:
        """``{callId, name, arguments, reason, requestedSeq, requestedAt, deadline}``."""
        return {"callId": self.call_id, "name": self.name, "arguments": self.arguments,
                "reason": self.reason, "requestedSeq": self.requested_seq,
                "requestedAt": self.requested_ms, "deadline": self.deadline_ms}


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """One thing a resumed agent owes a call.

    Attributes:
        kind: ``run`` (run the body again, or for the first time after a yes), ``reconcile``
            (ask the tool what the run with the key did), ``in-doubt`` (log it, ask a person),
            ``not-started`` (log it: the repair's result stands), ``deny`` (tell the model the
            answer was no), ``expire`` (record the deadline's denial, then ``deny``),
            ``forgotten`` (a yes whose arguments a redaction or erasure changed since the
            request: record a denial and tell the model it did not run), ``quarantined`` (a
            yes whose call's message a quarantine withholds now: the same, until it is given
            back before the run).
        record: The call.
        cause: ``interrupted`` (a crash stopped the call) or ``approval`` (an answer).
        effect: The effect class the decision used.
        attempt: The run number a ``run`` starts (1 for a call approved before it ever ran).
    """

    kind: ActionKind
    record: CallRecord
    cause: Literal["interrupted", "approval"]
    effect: ToolEffect
    attempt: int


def _str(value: object, default: str = "") -> str:
    return value if isinstance(value, str) else default


def _int(value: object, default: int = 0) -> int:
    return value if type(value) is int else default


class EffectLedger:
    """The fold of a log into :class:`CallRecord` entries; feed events in seq order.

    Usage: ``ledger = EffectLedger(); ledger.feed(session.events)``; later feed only the new
    events (:attr:`seen` tells how many were fed). Tolerant: events of other shapes are
    skipped, never raised about (the log was validated when it was written).
    """

    def __init__(self) -> None:
        self._records: dict[str, CallRecord] = {}
        self._turn_calls: list[CallRecord] = []
        # message and request seqs, for redactions and quarantines: a message may hold several
        # calls, so each seq names every call it shows
        self._by_seq: dict[int, list[CallRecord]] = {}
        self.seen = 0

    @property
    def records(self) -> Mapping[str, CallRecord]:
        """Every call the log names, by call id (the latest call with an id)."""
        return self._records

    def feed(self, events: Iterable[Event]) -> None:
        """Fold ``events`` (the log from seq :attr:`seen` on) into the records."""
        for event in events:
            self._fold(event)
            self.seen = event["seq"] + 1

    def _track(self, seq: int, record: CallRecord) -> None:
        """Name ``record`` as one of the calls event ``seq`` shows (once)."""
        named = self._by_seq.setdefault(seq, [])
        if all(other is not record for other in named):
            named.append(record)

    def _fold(self, event: Event) -> None:
        kind = event["type"]
        data = event["data"]
        if not isinstance(data, Mapping):
            return
        if kind == "assistant/message":
            message = data.get("message")
            blocks = message.get("content") if isinstance(message, Mapping) else None
            replaces = event.get("surfaceOp") not in (None, "append")
            for block in blocks if isinstance(blocks, list | tuple) else ():
                if isinstance(block, Mapping) and block.get("type") == "tool-call" \
                        and isinstance(block.get("id"), str):
                    shown = self._records.get(block["id"]) if replaces else None
                    if shown is not None:
                        # the same call shown anew (a quarantine placeholder, the message an
                        # unquarantine restores): still the call the log recorded
                        self._track(event["seq"], shown)
                        continue
                    made = CallRecord(call_id=block["id"], name=_str(block.get("name")),
                                      arguments=_str(block.get("arguments")),
                                      turn=_int(data.get("turn")), step=_int(data.get("step")),
                                      message_seq=event["seq"])
                    self._track(event["seq"], made)
                    self._records[made.call_id] = made
                    self._turn_calls.append(made)
            return
        if kind == "turn/start":
            self._turn_calls = []
            return
        if kind in (REDACTION_APPLIED, QUARANTINE_APPLY, QUARANTINE_RELEASE):
            items = data.get("items")
            for item in items if isinstance(items, list | tuple) else ():
                seq = item.get("seq") if isinstance(item, Mapping) else None
                if type(seq) is not int:
                    continue
                for named in self._by_seq.get(seq, ()):
                    if kind == REDACTION_APPLIED:
                        named.rewritten_by[seq] = event["seq"]
                    elif seq == named.message_seq:
                        named.quarantined_by = event["seq"] if kind == QUARANTINE_APPLY else None
            return
        if kind == "turn/end":
            reason = data.get("reason")
            if isinstance(reason, Mapping) and reason.get("kind") == "interrupted":
                for closed in self._turn_calls:
                    if closed._pending_closer is not None:
                        closed.closer = closed._pending_closer
                        closed.decided = False
            for closed in self._turn_calls:
                closed._pending_closer = None
            self._turn_calls = []
            return
        call_id = data.get("callId")
        if kind == "tool/result":
            message = data.get("message")
            source = message.get("source") if isinstance(message, Mapping) else None
            call_id = source.get("callId") if isinstance(source, Mapping) else None
        record = self._records.get(call_id) if isinstance(call_id, str) else None
        if record is None:
            return
        if kind == "tool/call":
            record.call_seq = event["seq"]
            effect = data.get("effect")
            record.effect = effect if effect in TOOL_EFFECTS else None
            key = data.get("idempotencyKey")
            record.key = key if isinstance(key, str) else None
            if record._gated:
                record._gated = False
            else:
                record.runs += 1
        elif kind == "tool/result":
            record.result = event
            if event.get("surfaceOp") == "append":
                error = data.get("error")
                code = error.get("code") if isinstance(error, Mapping) else None
                record._pending_closer = code if code in (TOOL_OUTCOME_UNKNOWN,
                                                          TOOL_NOT_STARTED) else None
                record.closer = None
            else:  # a rewrite carried out a decision or an answer
                record.closer = None
                record.open_decision = None
                record.answer = None
        elif kind == RECOVERY_EVENT:
            decision = data.get("decision")
            key = data.get("idempotencyKey")
            if isinstance(key, str):
                record.key = key
            record.decided = True
            if decision in ("run", "reconcile"):
                record.open_decision = event
                if decision == "run":
                    record.runs += 1
        elif kind == APPROVAL_REQUESTED:
            self._track(event["seq"], record)
            record.awaiting = event
            record.last_request = event
            record.answer = None
            if data.get("reason") == "tool" and record.call_seq is None:
                record._gated = True
        elif kind == APPROVAL_ANSWERED:
            record.awaiting = None
            record.answer = event

    # planning --------------------------------------------------------------------------------

    def pending_approvals(self) -> list[PendingApproval]:
        """Approvals requested and not answered, in request order."""
        out: list[PendingApproval] = []
        for record in self._records.values():
            request = record.awaiting
            if request is None:
                continue
            data = request["data"]
            out.append(PendingApproval(
                call_id=record.call_id, name=record.name, arguments=record.arguments,
                reason=_str(data.get("reason"), "tool"), requested_seq=request["seq"],
                requested_ms=request["time"], deadline_ms=_int(data.get("deadline"))))
        out.sort(key=lambda p: p.requested_seq)
        return out

    def plan(self, *, now_ms: int, effects: Mapping[str, tuple[ToolEffect, bool]]
             ) -> tuple[list[Action], list[CallRecord]]:
        """Return what a resumed agent owes, in log order, and the calls it cannot serve.

        Args:
            now_ms: The current time (epoch ms), for approval deadlines.
            effects: The agent's tools by name: ``(effect, has_reconcile)``.

        Returns:
            ``(actions, unserved)``: ``unserved`` are interrupted calls of tools the agent does
            not have (nothing is decided for them; a later agent with the tool decides).
        Rule: docs/effects.md#resume-decisions.
        """
        actions: list[Action] = []
        unserved: list[CallRecord] = []
        ordered = sorted(self._records.values(), key=lambda r: r.call_seq if r.call_seq
                         is not None else (r.result["seq"] if r.result is not None else -1))
        for record in ordered:
            tool = effects.get(record.name)
            recorded: ToolEffect = record.effect if record.effect is not None and (
                record.key is not None or record.effect == "read_only") else "irreversible"
            if recorded == "reconcilable" and not (tool is not None and tool[1]):
                recorded = "irreversible"  # nothing to ask: it stays in doubt
            attempt = record.runs + 1
            if record.awaiting is not None:
                deadline = _int(record.awaiting["data"].get("deadline"))
                if now_ms >= deadline:
                    actions.append(Action(kind="expire", record=record, cause="approval",
                                          effect=recorded, attempt=attempt))
                continue
            if record.answer is not None:
                yes = record.answer["data"].get("decision") == "approved"
                if yes and record.forgotten_by() is not None:
                    # what would run is not what was approved
                    actions.append(Action(kind="forgotten", record=record, cause="approval",
                                          effect=recorded, attempt=attempt))
                    continue
                if yes and record.quarantined_by is not None:
                    # approve refuses a quarantined call: a yes from before it does not run
                    actions.append(Action(kind="quarantined", record=record, cause="approval",
                                          effect=recorded, attempt=attempt))
                    continue
                if yes and tool is None:
                    unserved.append(record)
                    continue
                actions.append(Action(kind="run" if yes else "deny", record=record,
                                      cause="approval", effect=recorded, attempt=attempt))
                continue
            in_doubt = record.open_decision is not None or (
                record.closer == TOOL_OUTCOME_UNKNOWN and not record.decided and record.runs)
            if in_doubt:
                if recorded in ("read_only", "idempotent", "reconcilable") and tool is None:
                    unserved.append(record)
                    continue
                kind: ActionKind = {"read_only": "run", "idempotent": "run",
                                    "reconcilable": "reconcile"}.get(  # type: ignore[assignment]
                    recorded, "in-doubt")
                actions.append(Action(kind=kind, record=record, cause="interrupted",
                                      effect=recorded, attempt=attempt))
            elif record.closer is not None and not record.decided:
                actions.append(Action(kind="not-started", record=record, cause="interrupted",
                                      effect=recorded, attempt=attempt))
        return actions, unserved

"""Durable approvals: answer a call that waits for a person, from any process or host.

A tool that needs a yes (``needs_approval``, the shell tool with ``approve="durable"``, or an
irreversible call a crash left in doubt) records ``approval/requested {callId, name, arguments,
effect, reason, deadline}`` and the agent's turn ends ``blocked``; the process may exit.
:func:`approve` and :func:`deny` record the answer as ``approval/answered`` through the
session's one writer (write ownership, as every writer: a busy session is refused, never
merged), and the next resumed :meth:`~dsh.agent.Agent.run` carries it out.

Invariants this module owns (Rule: docs/effects.md#durable-approvals):

* an answer names the ``approval/requested`` it answers (``requestedSeq``) and only the
  latest unanswered request of a call can be answered;
* an answer given at or after the request's deadline is recorded as a denial by ``deadline``
  (and an approval is refused with ``APPROVAL_EXPIRED`` after that record is durable);
* a yes to a call whose arguments a redaction or erasure changed after it was requested is
  refused (``APPROVAL_ARGUMENTS_REDACTED``) with nothing written: what would run is not what
  the person was asked about (Rule: docs/effects.md#approvals-and-forgetting);
* the answer is durable (flushed) when the call returns.
"""

from __future__ import annotations

import getpass
import socket
import time
from collections.abc import Callable
from typing import Literal

from dsh._errors import AgentError, ConfigError
from dsh.agent._effects import (
    APPROVAL_ANSWERED,
    CallRecord,
    EffectLedger,
    PendingApproval,
    format_ms,
)
from dsh.agent._recorder import HoldsSessions, core_store
from dsh.session import REDACTION_APPLIED, Event, Session, SessionStore


def _default_by() -> str:
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name in this environment (containers)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def pending_approvals(session: Session) -> list[PendingApproval]:
    """The approvals of ``session`` nobody answered yet, in request order.

    Args:
        session: A live or restored session (a detached one from a stored log works too).
    """
    ledger = EffectLedger()
    ledger.feed(session.events)
    return ledger.pending_approvals()


def _next_run_does(decision: str) -> str:
    """What the next resumed run does with a call answered ``decision`` (a person's words).

    ``"approved"``: it runs the call; ``"denied"``: it tells the model the call did not run.
    Rule: docs/effects.md#durable-approvals.
    """
    return ("the next resumed run runs the call" if decision == "approved" else
            "the next resumed run tells the model the call was denied")


def _answered_already(record: CallRecord | None) -> str:
    """What became of a call's approval request, for the refusal of a second answer."""
    if record is None or record.last_request is None:
        return ""
    if record.answer is not None:
        data = record.answer["data"]
        return (f": it was already {data['decision']} by {data['by']} (seq "
                f"{record.answer['seq']}) and {_next_run_does(data['decision'])}")
    return (f": its request (seq {record.last_request['seq']}) was answered and the answer "
            f"carried out")


def _answer(given: SessionStore | HoldsSessions, session_id: str, call_id: str,
            decision: Literal["approved", "denied"], by: str | None, note: str | None,
            clock: Callable[[], int] | None) -> Event:
    store = core_store(given, None)
    if store is None:
        raise ConfigError("an approval needs a store with persistence (dsh.open(url))",
                          code="NO_PERSISTENCE", session_id=session_id)
    live = store.get(session_id)
    session = live if live is not None else store.resume(session_id)
    try:
        ledger = EffectLedger()
        ledger.feed(session.events)
        record = ledger.records.get(call_id)
        if record is None or record.awaiting is None:
            waiting = ", ".join(p.call_id for p in ledger.pending_approvals()) or "none"
            raise AgentError(f"session {session_id!r} has no approval waiting for call "
                             f"{call_id!r}{_answered_already(record)} (waiting: {waiting})",
                             code="NO_PENDING_APPROVAL", session_id=session_id,
                             call_id=call_id)
        if decision == "approved" and record.quarantined_by is not None:
            raise AgentError(
                f"call {call_id!r} in session {session_id!r} cannot be approved while it is "
                f"quarantined: its message (seq {record.message_seq}) is withheld from the "
                f"model view by the quarantine/apply at seq {record.quarantined_by}; give it "
                f"back first (dsh unquarantine {session_id} {record.message_seq}) and approve "
                f"it then, or deny it (dsh deny {session_id} {call_id})",
                code="APPROVAL_CALL_QUARANTINED", session_id=session_id, call_id=call_id,
                seq=record.quarantined_by)
        request = record.awaiting
        deadline = request["data"].get("deadline")
        now = (clock or (lambda: time.time_ns() // 1_000_000))()
        expired = type(deadline) is int and now >= deadline
        forgotten = record.forgotten_by()
        if decision == "approved" and not expired and forgotten is not None:
            raise AgentError(
                f"call {call_id!r} in session {session_id!r} cannot be approved: its arguments "
                f"were redacted or erased after the approval was requested ({REDACTION_APPLIED} "
                f"at seq {forgotten}), so what would run is not what was asked; deny it "
                f"(dsh deny {session_id} {call_id}) and ask for the call again in a new turn",
                code="APPROVAL_ARGUMENTS_REDACTED", session_id=session_id, call_id=call_id,
                seq=forgotten)
        data: dict[str, object] = {
            "callId": call_id, "requestedSeq": request["seq"],
            "decision": "denied" if expired else decision,
            "by": "deadline" if expired else (by or _default_by()),
            "reason": request["data"].get("reason") or "tool"}
        if expired:
            data["note"] = f"nobody answered before the deadline {format_ms(deadline)}"
        elif note:
            data["note"] = note
        event = session.append(APPROVAL_ANSWERED, data, ignorable=True)
        store.flush(session)
    finally:
        if live is None:
            store.dispose(session)
    if expired and decision == "approved":
        raise AgentError(f"the approval of call {call_id!r} in session {session_id!r} expired at "
                         f"{format_ms(deadline)}; it was recorded as denied (seq {event['seq']})",
                         code="APPROVAL_EXPIRED", session_id=session_id, call_id=call_id,
                         seq=event["seq"])
    return event


def approve(store: SessionStore | HoldsSessions, session_id: str, call_id: str, *,
            by: str | None = None, note: str | None = None,
            clock: Callable[[], int] | None = None) -> Event:
    """Record a person's yes to the call waiting in ``session_id``; the next run carries it out.

    A session live in ``store`` is appended to in place (call it from the thread that runs
    its agent); otherwise the stored session is resumed for writing, the answer appended and
    flushed, and the session released.

    Args:
        store: The ``dsh.Store`` from ``dsh.open(url)`` (or its core ``store.sessions``).
        session_id: The session.
        call_id: The call id named in its ``approval/requested``.
        by: Who answered (default ``user@host``).
        note: A remark kept with the answer and shown to the model on a denial.
        clock: Epoch-ms clock (default: wall clock), for the deadline.

    Returns:
        The durable ``approval/answered`` event.

    Raises:
        AgentError: ``NO_PENDING_APPROVAL`` when the call has no unanswered request (the
            waiting ones are named); ``APPROVAL_EXPIRED`` when the deadline had passed: the
            denial by ``deadline`` was recorded instead; ``APPROVAL_ARGUMENTS_REDACTED`` (its
            ``seq``: the ``redaction/applied`` record) when a redaction or erasure changed the
            call's arguments after the request: nothing is recorded, deny it instead.
        SessionBusyError: another writer holds the session (try again when it is done).
        SessionNotFoundError: no such session.
    Rule: docs/effects.md#durable-approvals.
    """
    return _answer(store, session_id, call_id, "approved", by, note, clock)


def deny(store: SessionStore | HoldsSessions, session_id: str, call_id: str, *,
         by: str | None = None, note: str | None = None,
         clock: Callable[[], int] | None = None) -> Event:
    """Record a person's no to the call waiting in ``session_id``; the next run tells the model.

    Arguments, ownership and errors as :func:`approve` (a denial after the deadline is
    recorded as the deadline's, without an error).
    """
    return _answer(store, session_id, call_id, "denied", by, note, clock)

"""``dsh approve`` and ``dsh deny``: answer a tool call that waits for a person.

An agent whose tool needs a yes records ``approval/requested`` and ends its turn; these
commands record the answer from any process or host (they take the session's write ownership
like every writer, waiting ``--wait`` seconds for a busy one), and the next resumed run carries
it out (Rule: docs/effects.md#durable-approvals).
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import typer

from dsh.cli import _render as render
from dsh.cli._common import (
    DEFAULT_WAIT_S,
    JsonOption,
    SessionArg,
    StoreOption,
    WaitOption,
    cli_store,
    json_mode,
    require_session,
    stdout_console,
)

CallArg = Annotated[str, typer.Argument(metavar="CALL_ID", show_default=False,
                                        help="The waiting call's id (see 'dsh show ID').")]
NoteOption = Annotated[str | None, typer.Option(
    "--note", metavar="TEXT", show_default=False,
    help="A remark kept with the answer (the model reads it on a denial).")]
ByOption = Annotated[str | None, typer.Option(
    "--by", metavar="NAME", show_default=False,
    help="Who answers (default: user@host).")]


_NEXT_RUN: Final = {"approved": "the next resumed run runs the call",
                    "denied": "the next resumed run tells the model the call was denied"}
"""What the next resumed run does with the answer (docs/effects.md#durable-approvals)."""


def _answer(decision: Literal["approved", "denied"], session_id: str, call_id: str,
            note: str | None, by: str | None, store: str | None, wait: float,
            json_: bool) -> None:
    from dsh.agent import approve as approve_call  # the agent package loads only when asked
    from dsh.agent import deny as deny_call

    json_mode(json_)
    with cli_store(store, create=False, wait=wait) as sessions:
        session_id = require_session(sessions, session_id, writes=True)
        answer = approve_call if decision == "approved" else deny_call
        event = answer(sessions.sessions, session_id, call_id, by=by, note=note)
    data = event["data"]
    if json_:
        render.write_json({"id": session_id, "callId": call_id, "seq": event["seq"],
                           "decision": data["decision"], "by": data["by"],
                           "note": data.get("note")})
        return
    stdout_console().print(
        f"{session_id}: call {call_id} {data['decision']} by {data['by']} (seq {event['seq']}); "
        f"{_NEXT_RUN[data['decision']]}", markup=False)


def approve(session_id: SessionArg, call_id: CallArg, note: NoteOption = None,
            by: ByOption = None, store: StoreOption = None,
            wait: WaitOption = DEFAULT_WAIT_S, json_: JsonOption = False) -> None:
    """Approve a tool call waiting for a person; the next resumed run runs it.

    An answer after the deadline is recorded as a denial and the command fails.
    """
    _answer("approved", session_id, call_id, note, by, store, wait, json_)


def deny(session_id: SessionArg, call_id: CallArg, note: NoteOption = None,
         by: ByOption = None, store: StoreOption = None,
         wait: WaitOption = DEFAULT_WAIT_S, json_: JsonOption = False) -> None:
    """Deny a tool call waiting for a person; the next resumed run tells the model."""
    _answer("denied", session_id, call_id, note, by, store, wait, json_)

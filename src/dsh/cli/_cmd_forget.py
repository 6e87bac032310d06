"""``dsh quarantine``, ``unquarantine``: the commands that make a memory forget.

Rule: docs/forgetting.md.
"""

from __future__ import annotations

import getpass
import socket
from typing import Annotated

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
from dsh.rights import QuarantineResult
from dsh.rights import quarantine as quarantine_messages
from dsh.rights import unquarantine as unquarantine_messages

SeqsArg = Annotated[list[int], typer.Argument(
    metavar="SEQ...", show_default=False,
    help="Seqs of messages ('dsh show' prints them as #seq).")]
ByOption = Annotated[str | None, typer.Option(
    "--by", metavar="NAME", show_default=False, help="Who does it (default: user@host).")]


def _who(by: str | None) -> str:
    return by if by else f"{getpass.getuser()}@{socket.gethostname()}"


def _report(verb: str, result: QuarantineResult, json_: bool) -> None:
    if json_:
        render.write_json(result.to_json())
        return
    out = stdout_console()
    for seq, node in result.changed:
        out.print(f"{result.session_id}: #{seq} {verb} (now #{node} on the model view)",
                  markup=False)
    for seq in result.unchanged:
        out.print(f"{result.session_id}: #{seq} unchanged (already {verb}, or never shown to "
                  f"the model)", markup=False)


def quarantine(session_id: SessionArg, seqs: SeqsArg,
               reason: Annotated[str | None, typer.Option(
                   "--reason", metavar="TEXT", show_default=False,
                   help="Why; kept in the log and shown by 'dsh show', never sent to the "
                        "model.")] = None,
               by: ByOption = None, store: StoreOption = None,
               wait: WaitOption = DEFAULT_WAIT_S, json_: JsonOption = False) -> None:
    """Withhold messages from the model view; the log keeps them (undo: dsh unquarantine).

    Each message is replaced on the model view by a placeholder of the same role that keeps
    tool calls paired with their results; a quarantine record says what, when, why and who
    (docs/forgetting.md#quarantine).
    """
    json_mode(json_)
    with cli_store(store, wait=wait) as sessions:
        session_id = require_session(sessions, session_id)
        result = quarantine_messages(sessions, session_id, seqs, reason=reason, by=_who(by))
    _report("quarantined", result, json_)


def unquarantine(session_id: SessionArg, seqs: SeqsArg, by: ByOption = None,
                 store: StoreOption = None, wait: WaitOption = DEFAULT_WAIT_S,
                 json_: JsonOption = False) -> None:
    """Give quarantined messages back to the model view exactly as they were."""
    json_mode(json_)
    with cli_store(store, wait=wait) as sessions:
        session_id = require_session(sessions, session_id)
        result = unquarantine_messages(sessions, session_id, seqs, by=_who(by))
    _report("unquarantined", result, json_)

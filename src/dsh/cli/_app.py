"""The ``dsh`` typer application: the root options, the entry point, and the command table.

Each command lives in its own module (``cmd_*.py``, or a module of its own feature) and is a
plain function with typer annotations; it is registered here with one line,
``app.command("NAME")(module.function)``, so adding a command touches this file once. Commands
read and write a store named by ``--store`` (default: the embedded SQLite store at
``$DSH_HOME/sessions.db``, ``~/.dsh`` when ``DSH_HOME`` is unset). Results go to stdout,
diagnostics to stderr; errors and exit statuses are handled once, in :mod:`dsh.cli._errors`.
The CLI uses only public names (``dsh``, ``dsh.persistence``, ``dsh.interop``,
``dsh.compaction``, ``dsh._verify``); importers, the verifier and progress bars are imported only
by the commands that need them.
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import Sequence
from typing import Annotated

import typer

from dsh.cli import (
    _cmd_acp as cmd_acp,
)
from dsh.cli import (
    _cmd_approve as cmd_approve,
)
from dsh.cli import (
    _cmd_chat as cmd_chat,
)
from dsh.cli import (
    _cmd_edit as cmd_edit,
)
from dsh.cli import (
    _cmd_export as cmd_export,
)
from dsh.cli import (
    _cmd_forget as cmd_forget,
)
from dsh.cli import (
    _cmd_import as cmd_import,
)
from dsh.cli import (
    _cmd_inspect as cmd_inspect,
)
from dsh.cli import (
    _cmd_run as cmd_run,
)
from dsh.cli import (
    _cmd_store as cmd_store,
)
from dsh.cli import (
    _cmd_verify as cmd_verify,
)
from dsh.cli import (
    _cmd_view as cmd_view,
)
from dsh.cli._errors import STATE, enable_debug, run
from dsh.cli._help import tidy_help

app = typer.Typer(
    name="dsh",
    help="dsh: the durable memory of AI agents. Import, inspect, verify, repair, fork, compact "
         "and export append-only session logs.",
    no_args_is_help=True,
    add_completion=True,
    # Locals hold session content (user data): never print them.
    pretty_exceptions_show_locals=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# The command table, in the order `dsh --help` lists them.
app.command("init")(cmd_store.init)
app.command("import")(cmd_import.import_)
app.command("ls")(cmd_inspect.ls)
app.command("show")(cmd_inspect.show)
app.command("search")(cmd_inspect.search)
app.command("events")(cmd_inspect.events)
app.command("messages")(cmd_inspect.messages)
app.command("verify")(cmd_verify.verify)
app.command("resume")(cmd_edit.resume)
app.command("fork")(cmd_edit.fork)
app.command("compact")(cmd_edit.compact)
app.command("quarantine")(cmd_forget.quarantine)
app.command("unquarantine")(cmd_forget.unquarantine)
app.command("redact")(cmd_forget.redact)
app.command("erase")(cmd_forget.erase)
app.command("rm")(cmd_forget.rm)
app.command("restore")(cmd_forget.restore)
app.command("gc")(cmd_forget.gc)
app.command("retention")(cmd_forget.retention)
app.command("export")(cmd_export.export)
app.command("convert")(cmd_export.convert)
app.command("run")(cmd_run.run_)
app.command("chat")(cmd_chat.chat)
app.command("approve")(cmd_approve.approve)
app.command("deny")(cmd_approve.deny)
app.command("view")(cmd_view.view)
app.command("acp")(cmd_acp.acp)
app.command("migrate")(cmd_store.migrate)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("dsh-session")
        except PackageNotFoundError:  # a source tree without installed metadata
            number = "unknown"
        sys.stdout.write(f"dsh {number}\n")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and DEBUG logs.")
                     ] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """dsh: the durable memory of AI agents — one append-only event log per session."""
    if debug and not STATE.debug:
        enable_debug()


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: run ``dsh`` and exit with its status.

    Rule: docs/cli.md#exit-status-and-errors.
    """
    # One short process: what the imports built lives until it exits. Taking those objects out
    # of the cyclic collector's reach spares the full collection that would traverse them all
    # while a command allocates (`dsh ls` over 5,000 sessions: ~30-50 ms) and the one at exit.
    gc.freeze()
    for stream in (sys.stdout, sys.stderr):
        # Logs may hold lone surrogates (dsh writes them); show them escaped, never crash.
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    args = list(sys.argv[1:] if argv is None else argv)
    end = args.index("--") if "--" in args else len(args)
    # The library's log records (a torn tail truncated, an unreadable header listed) are for
    # --debug; without it, what matters reaches the user as the command's own output and errors.
    logging.getLogger("dsh").addHandler(logging.NullHandler())
    if "--debug" in args[:end]:
        # --debug is accepted anywhere (`dsh show X --debug`) and before parsing, so usage
        # errors get it too; the root option exists for --help.
        enable_debug()
        args = [a for a in args[:end] if a != "--debug"] + args[end:]
    raise SystemExit(run(tidy_help(typer.main.get_command(app)), args))


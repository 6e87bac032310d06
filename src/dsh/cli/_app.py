"""The ``dsh`` typer application: the root options, the entry point, and the command table.

Each command lives in its own module (``cmd_*.py``, or a module of its own feature) and is a
plain function with typer annotations; it is registered here with one line of
:data:`COMMANDS` (name, module, function), so adding a command touches this file once. A
command's module is imported only when that command runs (or help lists it): the CLI starts
with typer and the root options alone (docs/cli.md). Commands
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
from collections.abc import Iterator, MutableMapping, Sequence
from importlib import import_module
from typing import Annotated, Any, Final

import typer
from typer.core import TyperGroup

from dsh.cli._errors import STATE, enable_debug, run
from dsh.cli._help import tidy_command, tidy_help

# The command table, in the order `dsh --help` lists them: name, module in dsh.cli, function.
# A command's module loads when that command runs (or when help lists it), so `dsh show` never
# loads the agent loop, chat, the importers, the rights modules or the viewer.
COMMANDS: Final[tuple[tuple[str, str, str], ...]] = (
    ("init", "_cmd_store", "init"),
    ("import", "_cmd_import", "import_"),
    ("ls", "_cmd_inspect", "ls"),
    ("show", "_cmd_inspect", "show"),
    ("search", "_cmd_inspect", "search"),
    ("events", "_cmd_inspect", "events"),
    ("messages", "_cmd_inspect", "messages"),
    ("verify", "_cmd_verify", "verify"),
    ("resume", "_cmd_edit", "resume"),
    ("fork", "_cmd_edit", "fork"),
    ("compact", "_cmd_edit", "compact"),
    ("quarantine", "_cmd_forget", "quarantine"),
    ("unquarantine", "_cmd_forget", "unquarantine"),
    ("redact", "_cmd_forget", "redact"),
    ("erase", "_cmd_forget", "erase"),
    ("rm", "_cmd_forget", "rm"),
    ("restore", "_cmd_forget", "restore"),
    ("gc", "_cmd_forget", "gc"),
    ("retention", "_cmd_forget", "retention"),
    ("export", "_cmd_export", "export"),
    ("convert", "_cmd_export", "convert"),
    ("run", "_cmd_run", "run_"),
    ("chat", "_cmd_chat", "chat"),
    ("approve", "_cmd_approve", "approve"),
    ("deny", "_cmd_approve", "deny"),
    ("view", "_cmd_view", "view"),
    ("acp", "_cmd_acp", "acp"),
    ("migrate", "_cmd_store", "migrate"),
)
_WHERE: Final = {name: (module, function) for name, module, function in COMMANDS}


def load_command(name: str) -> Any:
    """The click command ``name`` of the table, built from its module (imported here).

    Built as ``app.command(name)(function)`` would build it (typer's own defaults), with its
    help tidied (:func:`dsh.cli._help.tidy_command`).

    Raises:
        KeyError: ``name`` is not in :data:`COMMANDS`.
    """
    module, attribute = _WHERE[name]
    function = getattr(import_module(f"dsh.cli.{module}"), attribute)
    one = typer.Typer()  # typer's defaults for a command, as app.command(name) gives them
    one.command(name)(function)
    return tidy_command(typer.main.get_command_from_info(
        one.registered_commands[0], pretty_exceptions_short=app.pretty_exceptions_short,
        rich_markup_mode=app.rich_markup_mode))


class _Commands(MutableMapping[str, Any]):
    """The group's ``commands``: every name of the table, each built on first lookup."""

    def __init__(self) -> None:
        self._built: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        command = self._built.get(name)
        if command is None:
            if name not in _WHERE:
                raise KeyError(name)
            command = self._built[name] = load_command(name)
        return command

    def __setitem__(self, name: str, command: Any) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        raise TypeError("the dsh command table is fixed")

    def __iter__(self) -> Iterator[str]:
        yield from _WHERE
        yield from (name for name in self._built if name not in _WHERE)

    def __len__(self) -> int:
        return len(_WHERE) + sum(name not in _WHERE for name in self._built)

    def __contains__(self, name: object) -> bool:
        return name in _WHERE or name in self._built


class LazyGroup(TyperGroup):
    """The root group: lists every command by name and loads one only when it is asked for.

    Lookups (``get_command``, suggestions for a typo) see every name of :data:`COMMANDS`
    without importing a module; help, which shows each command's summary, loads them all.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = _Commands()

    def list_commands(self, ctx: Any) -> list[str]:
        """Every command's name, in the table's order (nothing loads)."""
        return list(self.commands)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """``dsh`` alone prints the help and exits 0, as ``dsh --help`` does.

        click 8.2's ``no_args_is_help`` raises a usage error (exit 2) after the help; a bare
        command is a request for help (docs/cli.md#exit-status-and-errors).
        """
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            typer.echo(ctx.get_help(), color=ctx.color)
            ctx.exit()
        return list(super().parse_args(ctx, args))


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
    cls=LazyGroup,
)


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


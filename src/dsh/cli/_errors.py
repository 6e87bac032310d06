"""The `dsh` command's one top-level handler: exit statuses and the single error line.

Rule: docs/cli.md#exit-status-and-errors.

Exit statuses: 0 success; 1 a :class:`~dsh._errors.DshError` or problems found (``verify``); 2 a
usage error (click's convention); 130 Ctrl-C. A ``DshError`` prints ``error[CODE]: message`` on
stderr (a JSON object under ``--json``); any other exception prints one line calling it a bug.
Tracebacks and DEBUG logging appear only with ``--debug``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import typer

from dsh import DshError
from dsh._errors import printable

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
"""A ``DshError``, or the command found problems (``verify`` violations, failed imports)."""
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130
EXIT_BUG: Final = 1
"""An unexpected exception: a bug in dsh; the line says so and asks for ``--debug``."""

@dataclass(slots=True)
class CliState:
    """Options that change how the handler reports, set by the command callbacks.

    Attributes:
        debug: ``--debug`` was given: show tracebacks, log at DEBUG to stderr.
        json: the running command was given ``--json``: errors print as a JSON object.
        interrupt_ends: Ctrl-C is how the running command normally ends (``events --follow``):
            exit 130 without the ``error[INTERRUPTED]`` line.
    """

    debug: bool = False
    json: bool = False
    interrupt_ends: bool = False


STATE: Final = CliState()


def enable_debug() -> None:
    """Turn on ``--debug``: DEBUG logging of every ``dsh`` logger to stderr, tracebacks on."""
    STATE.debug = True
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("dsh")
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)


def _named_in(key: str, value: str, message: str) -> bool:
    # A session id or path the message already quotes is not repeated; short bare words are
    # (a session called "gap" is not named by "seq gap"). A path the message prints whole is
    # not repeated either ("cannot import notes: ..." needs no "(path=notes)"), but one that is
    # only part of a longer word or path is ("notes" in "notes.jsonl", "/tmp/a" in
    # "/tmp/a.db"), and so is a path shorter than 3 characters ("a" in "it is a symlink").
    # Ints are always shown.
    if f"'{value}'" in message or f'"{value}"' in message:
        return True
    if key == "path":
        return (len(value) >= 3 or "/" in value) and re.search(
            rf"(?<![\w./-]){re.escape(value)}(?![\w/-]|\.\w)", message) is not None
    return ("/" in value or len(value) >= 16) and value in message


_BACKTICKED: Final = re.compile(r"``?([^`]+?)``?")


def format_error_line(error: DshError) -> str:
    """Return ``error[CODE]: message`` plus the location fields not already in the message.

    Args:
        error: Any ``DshError``; ``error.where`` holds seq, path, line, byte_offset, ….
    Returns:
        One line (newlines in the message are folded into spaces, control characters are
        shown as escapes).
    """
    # Library messages quote commands and names in backticks; a terminal shows them as quotes.
    message = _BACKTICKED.sub(r"'\1'", " ".join(str(error.message).split()))
    extra = [f"{key}={value}" for key, value in error.where.items()
             if not _named_in(key, str(value), message) or isinstance(value, int)]
    suffix = f" ({', '.join(extra)})" if extra else ""
    return printable(f"error[{error.code}]: {message}{suffix}")


def _coloured(line: str) -> str:
    """``line`` with its ``error[CODE]`` in red when stderr is a terminal that takes colour.

    Rule (docs/cli.md#exit-status-and-errors): colour only on a terminal, never with
    ``NO_COLOR`` set or ``TERM=dumb``.
    """
    isatty = getattr(sys.stderr, "isatty", None)
    if (not (isatty is not None and isatty()) or os.environ.get("NO_COLOR")
            or os.environ.get("TERM") == "dumb" or not line.startswith("error[")):
        return line
    code, sep, rest = line.partition("]")
    return f"\x1b[1;31m{code}{sep}\x1b[0m{rest}"


def _print_dsh_error(error: DshError) -> None:
    if STATE.json:
        sys.stderr.write(json.dumps(error.to_json(), ensure_ascii=False) + "\n")
    else:
        sys.stderr.write(_coloured(format_error_line(error)) + "\n")


def _number_refused(error: typer.TyperException) -> str | None:
    # typer checks a number option with a validator whose wording ("Input should be a valid
    # integer, unable to parse string as an integer") names neither the option nor what it
    # takes; say both, with the range and the value given (docs/cli.md#exit-status-and-errors).
    param, cause = getattr(error, "param", None), error.__cause__
    problems = getattr(cause, "errors", None)
    opts = getattr(param, "opts", None)
    if param is None or not callable(problems) or not opts:
        return None
    first = problems()[0] if problems() else {}
    kind = str(first.get("type", ""))
    numeric = ("int_", "float_", "greater_than", "less_than")
    if not kind.startswith(numeric) or "input" not in first:
        return None
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    whole = kind.startswith("int_") or (annotation is int and not kind.startswith("float_"))
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    bounds = (f" from {low} to {high}" if low is not None and high is not None
              else f" of at least {low}" if low is not None
              else f" of at most {high}" if high is not None else "")
    metavar = getattr(param, "metavar", None)
    takes = f"{'a whole number' if whole else 'a number'}{f' {metavar}' if metavar else ''}"
    return f"'{opts[0]}' takes {takes}{bounds}, not {str(first['input'])!r}"


_COMMAND_OPTIONS: Final = {"--store": " STORE", "--json": "", "--wait": " SECONDS"}
"""Options every command of its kind takes and ``dsh`` itself does not, with their metavar."""


def _misplaced_option(error: typer.TyperException, ctx: Any) -> str:
    # 'dsh --store X ls': many tools take such options before the command; ours are each
    # command's, so say where it goes (docs/cli.md#exit-status-and-errors). The command the
    # user named is the first word of the command line that is one.
    option = getattr(error, "option_name", None)
    if ctx is None or ctx.parent is not None or option not in _COMMAND_OPTIONS:
        return ""
    names = set(ctx.command.list_commands(ctx)) if hasattr(ctx.command, "list_commands") else set()
    command = next((word for word in sys.argv[1:] if word in names), "ls")
    return (f"{option} is an option of each command: put it after the command's name, as in "
            f"'{ctx.command_path} {command} {option}{_COMMAND_OPTIONS[option]}'")


def _asked_for_json(args: Sequence[str]) -> bool:
    # A usage error may come before the command's --json callback ran (a missing argument, an
    # option refused while parsing): a literal --json on the command line, before any "--",
    # asks for JSON all the same (docs/cli.md#exit-status-and-errors).
    words = args[:args.index("--")] if "--" in args else args
    return STATE.json or "--json" in words


def _print_usage_error(error: typer.TyperException, args: Sequence[str] = ()) -> None:
    # Keep click's usage line (it names the command), then our one error line.
    format_message = getattr(error, "format_message", None)
    message = " ".join(str(format_message() if format_message else error).split())
    message = _number_refused(error) or message
    if not message:
        return  # bare `dsh`: the help was already printed
    ctx = getattr(error, "ctx", None)
    hint = ""
    message = message.replace("Value error, ", "").rstrip(".")
    misplaced = _misplaced_option(error, ctx)
    if misplaced:
        message = f"{message}; {misplaced}"
    if ctx is not None:
        # after a question (click's "Did you mean 'ls'?") a new sentence, not a "; "
        hint = (f" Run '{ctx.command_path} --help' for the options" if message.endswith("?")
                else f"; run '{ctx.command_path} --help' for the options")
    # one line (docs/cli.md#exit-status-and-errors): under --json the object every other
    # error prints, with the same keys
    if _asked_for_json(args):
        as_json = {"error": "UsageError", "code": "USAGE", "message": f"{message}{hint}"}
        sys.stderr.write(json.dumps(as_json, ensure_ascii=False) + "\n")
    else:
        sys.stderr.write(f"error[USAGE]: {message}{hint}\n")


class Runnable(Protocol):
    """A click command as typer builds it (``typer.main.get_command(app)``)."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, *,
             standalone_mode: bool = True, **extra: Any) -> Any:
        """Parse ``args`` and invoke the command."""
        ...


_OUTPUT_FULL: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})
"""errno values of an OSError that means the output stream's device is full or failing."""


def _say_interrupted() -> None:
    if not STATE.interrupt_ends:
        sys.stderr.write("error[INTERRUPTED]: interrupted\n")


def _discard_stdout() -> None:
    # Point stdout at devnull so the interpreter's final flush does not fail again.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _reader_gone() -> int:
    # The reader went away ('dsh events X | head'): not an error of ours.
    _discard_stdout()
    return EXIT_OK


def _bug(error: BaseException) -> int:
    sys.stderr.write(
        f"error[BUG]: unexpected {type(error).__name__}: {' '.join(str(error).split())}; "
        "this is a bug in dsh, rerun with --debug for the traceback and report it\n")
    if STATE.debug:
        traceback.print_exception(error, file=sys.stderr)
    return EXIT_BUG


def run(command: Runnable, argv: Sequence[str] | None = None, *,
        prog_name: str = "dsh") -> int:
    """Run ``command`` with ``argv`` (default ``sys.argv[1:]``) and return the exit status.

    Never raises: every outcome becomes an exit status and at most one diagnostic line on stderr
    (plus the traceback under ``--debug``). Rule: docs/cli.md#exit-status-and-errors (exit
    0/1/2/130).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = command.main(args=args, prog_name=prog_name, standalone_mode=False)
    except DshError as error:
        if STATE.debug:
            traceback.print_exception(error, file=sys.stderr)
        _print_dsh_error(error)
        return EXIT_FAILED
    except typer.Abort:
        # click turns Ctrl-C / EOF at a prompt into Abort.
        _say_interrupted()
        return EXIT_INTERRUPTED
    except typer.TyperException as error:  # click's ClickException / UsageError (vendored)
        _print_usage_error(error, args)
        code = getattr(error, "exit_code", EXIT_USAGE)
        return code if isinstance(code, int) else EXIT_USAGE
    except KeyboardInterrupt:
        _say_interrupted()
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _reader_gone()
    except SystemExit as exit_:
        # typer turns a broken pipe into exit 1 inside its own handler; the pipe is the cause.
        if isinstance(exit_.__context__, BrokenPipeError):
            return _reader_gone()
        raise
    except OSError as error:
        if error.errno not in _OUTPUT_FULL:
            return _bug(error)
        # Library I/O failures arrive as DshErrors; a full disk or device here is the output.
        sys.stderr.write(f"error[OUTPUT_FAILED]: the output could not be written: "
                         f"{error.strerror or error}; free space on its device or send the "
                         "output elsewhere\n")
        _discard_stdout()
        return EXIT_FAILED
    except Exception as error:  # the last line of defence: report a bug, never a traceback
        return _bug(error)
    if result == EXIT_INTERRUPTED:
        # typer turns Ctrl-C inside a command into Exit(130).
        _say_interrupted()
    if isinstance(result, int):
        return result
    return EXIT_OK

"""The ``dsh`` typer application: every command parses, calls the library, and renders.

Commands read and write a store named by ``--store URL`` (default: the embedded SQLite store at
``$DSH_HOME/sessions.db``, ``~/.dsh`` when ``DSH_HOME`` is unset; DESIGN §3.8). Results go to
stdout, diagnostics to stderr; errors and exit statuses are handled once, in
:mod:`dsh.cli._errors` (STYLE §12). The CLI uses only public names (``dsh``,
``dsh.persistence``, ``dsh.interop``, ``dsh.compaction``, ``dsh.verify``); the importers, the
verifier and progress bars are imported only by the commands that need them.
"""

from __future__ import annotations

import enum
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final
from urllib.parse import quote

import typer

from dsh import (
    ConfigError,
    DigestSummarizer,
    DshError,
    ImportFormatError,
    PersistenceError,
    Session,
    SessionForkError,
    SessionNotFoundError,
    SessionStore,
    compact_now,
    compact_surface_region,
    open_store,
)
from dsh.cli import render
from dsh.cli._errors import EXIT_FAILED, STATE, enable_debug, format_error_line, run
from dsh.json import dumps, json_equal
from dsh.persistence import store_path

if TYPE_CHECKING:
    from rich.console import Console

    from dsh import Event
    from dsh.compaction import CompactionResult
    from dsh.json import FrozenDict
    from dsh.persistence import Inspection, Persistence

__all__ = ["app", "default_store_url", "examples_dir", "main", "user_log_dirs"]

app = typer.Typer(
    name="dsh",
    help="dsh: the durable memory of AI agents. Import, inspect, verify, repair, fork, compact "
         "and export append-only session logs.",
    no_args_is_help=True,
    add_completion=False,
    # Locals hold session content (user data): never print them (STYLE §12).
    pretty_exceptions_show_locals=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

DEFAULT_STORE_FILE: Final = "sessions.db"
"""File name of the embedded SQLite store inside ``$DSH_HOME`` (DESIGN §3.8)."""

TRANSCRIPT_SUFFIXES: Final = frozenset({".jsonl", ".json", ".traj", ".yaml", ".yml"})
"""File suffixes ``dsh import`` picks up when it walks a folder."""


def default_store_url() -> str:
    """Return ``sqlite:///<$DSH_HOME or ~/.dsh>/sessions.db``, creating the home folder.

    The environment is read here, at the edge, and nowhere in the library (STYLE §8).

    Raises:
        ConfigError: the home folder cannot be created (the message names it).
    """
    home = Path(os.environ.get("DSH_HOME") or Path.home() / ".dsh").expanduser().resolve()
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the dsh home folder {home}: {exc.strerror or exc}; "
                          "set DSH_HOME to a writable folder or pass --store URL",
                          path=str(home)) from exc
    return "sqlite://" + quote(str(home / DEFAULT_STORE_FILE))


# -- shared options and helpers --------------------------------------------------------------

StoreOption = Annotated[
    str | None,
    typer.Option("--store", metavar="URL", show_default=False,
                 help="Store URL: sqlite:///path.db, jsonl:///dir, jsonl+zstd:///dir "
                      "(default: sqlite:///$DSH_HOME/sessions.db)."),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print JSON (stable keys) instead of text."),
]
SessionArg = Annotated[str, typer.Argument(metavar="ID", help="Session id (see `dsh ls`).",
                                           show_default=False)]


def _json_mode(value: bool) -> bool:
    STATE.json = value
    return value


@contextmanager
def _store(url: str | None, *, create: bool = True) -> Iterator[Persistence]:
    """Open the store a command works on (``--store`` or the default) and close it after.

    Closing drains any write-behind writer, so a command's writes are durable on return. A
    read-only command (``create=False``) given an explicit URL that names nothing on disk fails
    instead of creating an empty store at a mistyped path.

    Raises:
        ConfigError: code STORE_NOT_FOUND for such a URL.
    """
    if url is not None and not create:
        location = store_path(url)
        if location is not None and not location.exists():
            raise ConfigError(f"no store at {url!r} ({location} does not exist); check the URL, "
                              f"or create one with `dsh import --store {url}`",
                              code="STORE_NOT_FOUND")
    persistence = open_store(url or default_store_url())
    try:
        yield persistence
    finally:
        persistence.close()


def _out() -> Console:
    return render.make_console()


def _err() -> Console:
    return render.make_console(stderr=True)


def _require(persistence: Persistence, session_id: str) -> None:
    if not persistence.exists(session_id):
        raise SessionNotFoundError(
            f"no session {session_id!r} in store {persistence.url}; `dsh ls` lists the ids",
            session_id=session_id)


SOURCE_EVENT_TYPE: Final = "import/source"
"""The ignorable event every imported session carries: ``data.format`` names the source."""


def source_format(events: Iterable[Event]) -> str:
    """The format an imported session came from (its first ``import/source``), else ``dsh``.

    A log re-imported from a dsh JSONL export keeps its original ``import/source`` first, so
    the first one names where the conversation came from.
    """
    for event in events:
        if event["type"] == SOURCE_EVENT_TYPE:
            data = event.get("data")
            fmt = data.get("format") if isinstance(data, dict) else None
            return fmt if isinstance(fmt, str) and fmt else "dsh"
    return "dsh"


def _read(persistence: Persistence, session_id: str) -> Inspection:
    """Read a stored session through the cold-read pipeline, without writing anything.

    Raises:
        SessionNotFoundError: no such session.
        LogCorruptError, SessionFormatUnsupportedError, UnknownEventTypeError: unreadable log.
    """
    _require(persistence, session_id)
    return persistence.read(session_id)


def _restored(read: Inspection, *, with_closers: bool = True) -> Any:
    """A detached Session over the stored log (plus the repair closers when asked)."""
    seed = read.events if with_closers else read.stored_events
    return Session.restore(str(read.header["id"]), seed, read.header,
                           inherited_event_count=read.header.get("seedLength") or 0)


# -- the root --------------------------------------------------------------------------------

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
    """Console-script entry point: run ``dsh`` and exit with its status (STYLE §12)."""
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
    raise SystemExit(run(typer.main.get_command(app), args))


# -- import ----------------------------------------------------------------------------------

class ImportFormat(enum.StrEnum):
    """``--format`` of ``dsh import``: a source format, or ``auto`` to detect it per file."""

    auto = "auto"
    claude_code = "claude-code"
    codex = "codex"
    openai_chat = "openai-chat"
    anthropic = "anthropic"
    openhands = "openhands"
    swe_agent = "swe-agent"
    mini_swe_agent = "mini-swe-agent"
    dsh = "dsh"


def examples_dir() -> Path | None:
    """Return the bundled example transcripts (package data ``dsh/examples/transcripts``).

    Found through :mod:`importlib.resources` only, so an editable and a regular install give
    the same folder. Returns None when this install ships no examples (or they are inside a
    zip archive, which ``dsh import`` cannot walk).
    """
    from importlib.resources import files

    bundled = files("dsh").joinpath("examples", "transcripts")
    if not bundled.is_dir():
        return None
    path = Path(str(bundled))
    return path if path.is_dir() else None


def user_log_dirs() -> list[Path]:
    """Return the user's own agent log folders that hold files: Claude Code's and Codex's."""
    home = Path.home()
    candidates = [home / ".claude" / "projects", home / ".codex" / "sessions"]
    return [path for path in candidates
            if path.is_dir() and any(p.is_file() for p in path.rglob("*.jsonl"))]


def _is_claude_subagent(path: Path) -> bool:
    # <sid>/subagents/agent-*.jsonl is imported as a child of <sid>.jsonl next to that folder.
    if path.parent.name != "subagents":
        return False
    session_dir = path.parent.parent
    return (session_dir.parent / f"{session_dir.name}.jsonl").is_file()


def _walk(paths: Sequence[Path]) -> Iterator[tuple[Path, bool]]:
    """Yield ``(file, explicit)``: given files as is, folders walked in sorted order."""
    for path in paths:
        if path.is_dir():
            for found in sorted(path.rglob("*")):
                if (found.is_file() and found.suffix.lower() in TRANSCRIPT_SUFFIXES
                        and not any(part.startswith(".") for part in found.relative_to(path).parts)
                        and not _is_claude_subagent(found)):
                    yield found, False
        else:
            yield path, True


@dataclass(slots=True)
class ImportReport:
    """What ``dsh import`` did, per file (``--json`` keys: imported, skipped, failed, ignored)."""

    imported: list[tuple[str, str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` summary with stable keys."""
        return {
            "imported": [{"path": p, "session": s, "format": f} for p, s, f in self.imported],
            "skipped": [{"path": p, "session": s} for p, s in self.skipped],
            "failed": [{"path": p, "reason": r} for p, r in self.failed],
            "ignored": [{"path": p, "reason": r} for p, r in self.ignored],
        }


def _reason(error: DshError) -> str:
    return " ".join(error.message.split())


def _stored_count(persistence: Persistence, session_id: str) -> int:
    with persistence.open(session_id, "read") as handle:
        return len(handle.read(0).events)


def _import_one(persistence: Persistence, path: Path, fmt: str, explicit: bool,
                report: ImportReport) -> None:
    """Import one file; all of its sessions are validated before anything is written."""
    from dsh.interop import detect_format, import_file

    shown = str(path)
    try:
        detected = detect_format(path) if fmt == "auto" else fmt
    except ImportFormatError as error:
        # Found by walking a folder: a file that is not a transcript at all is ignored; one
        # that is JSON records with damage (a torn last line, a bad line) failed.
        damaged = "line" in error.where and "cannot tell the transcript format" not in str(error)
        if explicit or damaged:
            report.failed.append((shown, _reason(error)))
        else:
            report.ignored.append((shown, _reason(error)))
        return
    try:
        sessions = [s for top in import_file(path, detected) for s in top.walk()]
        # Validate every session of the file first (seed rules, core spec §5.3), so a bad file
        # writes nothing at all.
        built = [(s, s.to_session()) for s in sessions]
    except DshError as error:
        report.failed.append((shown, _reason(error)))
        return
    for imported, session in built:
        sid = imported.session_id
        stored = _stored_count(persistence, sid) if persistence.exists(sid) else None
        if stored:
            report.skipped.append((shown, sid))
            continue
        try:
            if stored is None:
                persistence.create(session.header)
            # The importer's events exactly (the Session added only its end-seed marker).
            with persistence.open(sid, "write") as handle:
                handle.append(session.events[: len(imported.events)])
                handle.flush()
        except DshError as error:
            report.failed.append((shown, f"{sid}: {_reason(error)}"))
            return
        report.imported.append((shown, sid, imported.source_format or detected))


def _import_paths(persistence: Persistence, paths: Sequence[Path], fmt: str,
                  console: Console) -> ImportReport:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    report = ImportReport()
    files = list(_walk(paths))
    for path, explicit in files:
        if explicit and not path.exists():
            raise ConfigError(f"cannot import {path}: no such file or folder", path=str(path))
    with Progress(TextColumn("importing"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.description}"), console=console, transient=True,
                  disable=len(files) < 2 or not console.is_terminal) as progress:
        task = progress.add_task("", total=len(files))
        for path, explicit in files:
            progress.update(task, description=path.name)
            _import_one(persistence, path, fmt, explicit, report)
            progress.advance(task)
    return report


@app.command("import")
def import_(
    paths: Annotated[list[Path] | None, typer.Argument(
        metavar="[PATH]...", show_default=False,
        help="Files or folders to import. Without a path: your own Claude Code and Codex logs "
             "(~/.claude/projects, ~/.codex/sessions), else the bundled examples.")] = None,
    format: Annotated[ImportFormat, typer.Option(
        "--format", help="Source format; auto detects it per file.")] = ImportFormat.auto,
    store: StoreOption = None,
    json_: JsonOption = False,
) -> None:
    """Import transcripts of other agents (and dsh logs) into the store.

    Re-importing is idempotent: a source file maps to a stable session id, and sessions already
    in the store are skipped. A file that fails leaves nothing behind in the store. Exit 1 when
    a file failed.
    """
    _json_mode(json_)
    err = _err()
    if not paths:
        roots = user_log_dirs()
        if roots:
            err.print(f"importing your agent logs from {', '.join(map(str, roots))}")
        else:
            bundled = examples_dir()
            if bundled is None:
                raise ConfigError("nothing to import: no path given, no Claude Code or Codex "
                                  "logs found, and this install has no bundled examples; "
                                  "pass a file or folder")
            err.print(f"no Claude Code or Codex logs found; importing the bundled examples "
                      f"from {bundled}")
            roots = [bundled]
        paths = roots
    with _store(store) as persistence:
        report = _import_paths(persistence, paths, str(format.value), err)
    if json_:
        render.write_json(report.to_json())
    else:
        _out().print(render.render_import_summary(report.imported, report.skipped,
                                                  report.failed, report.ignored))
    if report.failed:
        raise typer.Exit(EXIT_FAILED)


# -- ls / show / events / messages -----------------------------------------------------------

def _rows(persistence: Persistence) -> tuple[list[render.SessionRow], list[DshError]]:
    """Rows of every readable session (newest activity first) and the errors of the others."""
    rows: list[render.SessionRow] = []
    unreadable: list[DshError] = []
    for header in persistence.list_headers():
        sid = str(header["id"])
        try:
            read = persistence.read(sid)
        except DshError as error:
            # One damaged log must not hide the others; it is reported and sets exit 1.
            error.where.setdefault("session_id", sid)
            unreadable.append(error)
            continue
        events = read.stored_events
        if not events:
            continue  # created but never written: not a session yet (persistence spec §2.1)
        rows.append(render.session_row(read.header, events,
                                       source_format=source_format(events)))
    rows.sort(key=lambda r: (-r.last_activity_ms, r.id))
    return rows, unreadable


@app.command("ls")
def ls(store: StoreOption = None, json_: JsonOption = False) -> None:
    """List the sessions in the store, most recent activity first.

    A session whose log cannot be read is reported on stderr (one ``error[CODE]`` line each,
    `dsh verify` tells more) and makes the exit status 1; the others are still listed.
    """
    _json_mode(json_)
    with _store(store, create=False) as persistence:
        rows, unreadable = _rows(persistence)
    if json_:
        render.write_json([row.to_json() for row in rows])
    elif rows:
        console = _out()
        console.print(render.render_sessions_table(rows, width=console.width), markup=False,
                      highlight=False)
    elif not unreadable:
        _err().print("no sessions in the store; `dsh import` adds some")
    for error in unreadable:
        sys.stderr.write(format_error_line(error) + "\n")
    if unreadable:
        raise typer.Exit(EXIT_FAILED)


@app.command("show")
def show(
    session_id: SessionArg,
    full: Annotated[bool, typer.Option("--full", help="Do not clip long tool results.")] = False,
    store: StoreOption = None,
    json_: JsonOption = False,
) -> None:
    """Show a session as a transcript: messages, tool calls with results, checkpoints, repairs."""
    _json_mode(json_)
    with _store(store, create=False) as persistence:
        read = _read(persistence, session_id)
    events = read.stored_events
    row = render.session_row(read.header, events, source_format=source_format(events))
    items = render.transcript_items(events)
    if json_:
        render.write_json({"session": row.to_json(), "header": read.header, "items": items})
        return
    _out().print(render.render_transcript(read.header, items, row=row, full=full))


@app.command("events")
def events(
    session_id: SessionArg,
    from_seq: Annotated[int, typer.Option("--from", metavar="SEQ", min=0,
                                          help="First seq to print.")] = 0,
    types: Annotated[list[str] | None, typer.Option(
        "--type", metavar="T", show_default=False,
        help="Only events of this type (repeatable; globs such as 'compaction/*').")] = None,
    store: StoreOption = None,
) -> None:
    """Print the stored log as JSON lines, exactly as committed (dsh's wire format)."""
    from fnmatch import fnmatchcase

    with _store(store, create=False) as persistence:
        _require(persistence, session_id)
        with persistence.open(session_id, "read") as handle:
            stored = handle.read(from_seq).events
    selected: Iterable[Event] = stored
    if types:
        patterns = list(types)
        selected = (e for e in stored if any(fnmatchcase(e["type"], p) for p in patterns))
    render.write_json_lines(selected)


class MessageFormat(enum.StrEnum):
    """``--format`` of ``dsh messages``."""

    dsh = "dsh"
    openai = "openai"
    anthropic = "anthropic"


def _model_view(read: Inspection, fmt: str) -> Any:
    """The derived messages (after in-memory repair of an open turn) in ``fmt``."""
    messages = _restored(read).derive_messages()
    if fmt == "openai":
        from dsh.interop import to_openai

        return to_openai(messages)
    if fmt == "anthropic":
        from dsh.interop import to_anthropic

        return to_anthropic(messages)
    return messages


@app.command("messages")
def messages(
    session_id: SessionArg,
    format: Annotated[MessageFormat, typer.Option(
        "--format", help="dsh messages, or a provider's request shape.")] = MessageFormat.dsh,
    store: StoreOption = None,
) -> None:
    """Print what the model sees: the messages derived from the log's surface, as JSON.

    An interrupted turn is shown as the repair would close it (nothing is written).
    """
    with _store(store, create=False) as persistence:
        read = _read(persistence, session_id)
    render.write_json(_model_view(read, str(format.value)))


# -- verify ----------------------------------------------------------------------------------

def _where_seq(error: DshError) -> int | None:
    for key in ("seq", "seed_index"):
        value = error.where.get(key)
        if isinstance(value, int):
            return value
    return None


def _verify(persistence: Persistence, session_id: str, notes: list[str]
            ) -> list[render.Violation]:
    """Check one stored session: the read pipeline, then :func:`dsh.verify.verify_events`.

    Rules: persistence spec §3.8 (read pipeline: a refusal is one violation with its error
    code); then every rule of :func:`dsh.verify.verify_events`.
    """
    from dsh.verify import verify_events

    try:
        read = persistence.read(session_id)
    except DshError as error:
        return [render.Violation(session_id=session_id, seq=_where_seq(error), rule=error.code,
                                 message=error.message)]
    if read.torn is not None:
        notes.append(f"{session_id}: torn tail after the committed log ({read.torn.reason}); "
                     "`dsh resume` truncates it")
    if read.closers:
        notes.append(f"{session_id}: the last turn is open (interrupted); `dsh resume` closes it")
    return [render.Violation(session_id=session_id, seq=v.seq, rule=v.rule, message=v.message)
            for v in verify_events(read.stored_events, header=read.header)]


@app.command("verify")
def verify(
    session_id: Annotated[str | None, typer.Argument(metavar="[ID]", show_default=False,
                                                     help="Session to verify.")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Verify every session.")] = False,
    store: StoreOption = None,
    json_: JsonOption = False,
) -> None:
    """Check envelopes, surface, tool pairing and log invariants; exit 1 on any violation.

    Prints one line per violation: session, seq, rule, message.
    """
    _json_mode(json_)
    if (session_id is None) == (not all_):
        raise typer.BadParameter("give a session ID or --all (not both)",
                                 param_hint="'ID' / '--all'")
    notes: list[str] = []
    found: list[render.Violation] = []
    with _store(store, create=False) as persistence:
        if all_:
            ids = sorted(str(h["id"]) for h in persistence.list_headers())
        else:
            _require(persistence, str(session_id))
            ids = [str(session_id)]
        for sid in ids:
            found.extend(_verify(persistence, sid, notes))
    if json_:
        render.write_json({"sessions": len(ids), "violations": [v.to_json() for v in found],
                           "notes": notes})
    else:
        for violation in found:
            sys.stdout.write(violation.line() + "\n")
        sys.stdout.flush()
    err = _err()
    for note in notes:
        err.print(f"note: {note}", markup=False)
    broken = len({v.session_id for v in found})
    err.print(f"verified {render.plural(len(ids), 'session')}: "
              + (f"{render.plural(len(found), 'violation')} in "
                 f"{render.plural(broken, 'session')}" if found else "all valid"))
    if found:
        raise typer.Exit(EXIT_FAILED)


# -- resume / fork / compact -----------------------------------------------------------------

@app.command("resume")
def resume(session_id: SessionArg, store: StoreOption = None, json_: JsonOption = False) -> None:
    """Commit the repair of an interrupted turn: results for unanswered calls, step, turn end.

    Takes the session's write lock, truncates a torn tail, appends the closers and flushes; a
    balanced log is left untouched (persistence spec §3.10 ``load``).
    """
    _json_mode(json_)
    with _store(store) as persistence:
        _require(persistence, session_id)
        inspection = persistence.load(session_id)
    closers = list(inspection.closers)
    torn = inspection.torn.reason if inspection.torn is not None else None
    if json_:
        render.write_json({"id": session_id, "closers": closers, "tornTail": torn,
                           "events": len(inspection.events)})
        return
    out = _out()
    if torn:
        out.print(f"{session_id}: truncated a torn tail ({torn})", markup=False)
    if closers:
        out.print(f"{session_id}: closed interrupted turn with "
                  f"{render.plural(len(closers), 'event')} at seq "
                  f"{closers[0]['seq']}–{closers[-1]['seq']} "
                  f"({', '.join(c['type'] for c in closers)})", markup=False)
    elif not torn:
        out.print(f"{session_id}: nothing to repair (no open turn)", markup=False)


@app.command("fork")
def fork(
    session_id: SessionArg,
    at: Annotated[int | None, typer.Option(
        "--at", metavar="SEQ", show_default=False,
        help="Last inherited seq, inclusive (default: the last event).")] = None,
    as_: Annotated[str | None, typer.Option(
        "--as", metavar="NEW", show_default=False,
        help="Child session id (default: <ID>-fork-<n>).")] = None,
    store: StoreOption = None,
    json_: JsonOption = False,
) -> None:
    """Fork a session: the child inherits events 0..SEQ and continues on its own.

    A cut inside a turn closes it in the child with ``forked`` closers (seed ch. 28); the
    parent's log is not changed.
    """
    _json_mode(json_)
    with _store(store) as persistence:
        _require(persistence, session_id)
        try:
            child_id = persistence.fork(session_id, at, as_)
        except SessionForkError as error:
            if error.code != "SESSION_ALREADY_EXISTS":
                raise
            raise SessionForkError(f"{error.message}; choose another id with --as",
                                   code=error.code, **error.where) from error
        child = persistence.read(child_id)
        seed_length = child.header.get("seedLength")
        events = len(child.stored_events)
        outcome: dict[str, Any] = {"id": child_id, "parent": session_id,
                                   "boundary": seed_length - 1 if seed_length else None,
                                   "seedLength": seed_length, "events": events}
    if json_:
        render.write_json(outcome)
        return
    _out().print(f"forked {session_id} at seq {outcome['boundary']} as {outcome['id']} "
                 f"({render.plural(events, 'event')})", markup=False)


def _parse_range(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    start, sep, end = value.partition(":")
    if not sep or not start.strip().isdigit() or not end.strip().isdigit():
        raise typer.BadParameter(f"expected A:B (two surface seqs), got {value!r}",
                                 param_hint="'--range'")
    return int(start), int(end)


class SummarizerName(enum.StrEnum):
    """``--summarizer`` of ``dsh compact``."""

    digest = "digest"


@app.command("compact")
def compact(
    session_id: SessionArg,
    range_: Annotated[str | None, typer.Option(
        "--range", metavar="A:B", show_default=False,
        help="Surface seqs to replace, inclusive (default: all but the newest balanced "
             "unit).")] = None,
    summarizer: Annotated[SummarizerName, typer.Option(
        "--summarizer", help="How to write the checkpoint (digest: offline, deterministic).")
    ] = SummarizerName.digest,
    store: StoreOption = None,
    json_: JsonOption = False,
) -> None:
    """Compact a span of the model surface into one checkpoint message.

    Rehearses the compaction on a detached copy first (the digest summarizer is
    deterministic), so a refusal (a span too small to be worth compacting, a summary that
    would not shrink it) or "nothing to compact" writes nothing. Otherwise resumes the session
    (repairing an interrupted turn), runs a manual compaction between turns (persistence spec
    §9.3, §9.9) and flushes.
    """
    _json_mode(json_)
    span = _parse_range(range_)
    digest = DigestSummarizer()

    def run_on(session: Any, flush: Callable[[], None] | None) -> CompactionResult | None:
        if span is None:
            return compact_now(session, summarizer=digest, flush=flush)
        return compact_surface_region(session, span[0], span[1], summarizer=digest,
                                      flush=flush)

    with _store(store) as persistence:
        rehearsal = run_on(_restored(_read(persistence, session_id)), None)
        result = None
        if rehearsal is not None:
            sessions = SessionStore(persistence=persistence)
            session = sessions.resume(session_id)

            def flush() -> None:
                sessions.flush(session)

            result = run_on(session, flush)
            sessions.flush(session)
    outcome: dict[str, Any] | None = None if result is None else {
        "id": session_id, "compactionId": result.compaction_id,
        "startSeq": result.start_seq, "summarySeq": result.summary_seq,
        "checkpointSeq": result.replacement_seq, "endSeq": result.end_seq,
        "shadowedRange": list(result.shadowed_range),
        "shadowedSeqs": list(result.shadowed_seqs),
        "shadowedTokenCount": result.shadowed_token_count,
        "checkpointTokenCount": result.checkpoint_token_count,
    }
    if json_:
        render.write_json(outcome)
        return
    if outcome is None:
        _out().print(f"{session_id}: nothing to compact (the surface is one balanced unit)",
                     markup=False)
        return
    shadowed = outcome["shadowedSeqs"]
    _out().print(f"{session_id}: compacted {render.plural(len(shadowed), 'surface message')} "
                 f"(#{shadowed[0]}"
                 f"–#{shadowed[-1]}, ~{outcome['shadowedTokenCount']} tokens) into checkpoint "
                 f"#{outcome['checkpointSeq']} (~{outcome['checkpointTokenCount']} tokens)",
                 markup=False)


# -- export / convert ------------------------------------------------------------------------

class ExportFormat(enum.StrEnum):
    """``--format`` of ``dsh export``."""

    openai = "openai"
    anthropic = "anthropic"
    dsh_jsonl = "dsh-jsonl"


_JSONL_HEADER_KEYS: Final = ("version", "id", "createdAt", "cwd", "parentSession", "seedLength",
                             "origin", "delegationDepth", "agentPreset")


def _dsh_jsonl(read: Inspection) -> bytes:
    """The stored log as one raw dsh JSONL file: header line, then one event per line.

    Header key order and the always-present ``delegationDepth`` follow persistence spec §4.3.
    """
    header: dict[str, Any] = {"type": "session"}
    for key in _JSONL_HEADER_KEYS:
        if key == "delegationDepth":
            header[key] = read.header.get(key) or 0
        elif read.header.get(key) is not None:
            header[key] = read.header[key]
    return b"".join([dumps(header) + b"\n",
                     *(dumps(e) + b"\n" for e in read.stored_events)])


@app.command("export")
def export(
    session_id: SessionArg,
    format: Annotated[ExportFormat, typer.Option("--format", help="Output format.",
                                                 show_default=False)],
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", metavar="FILE", show_default=False,
        help="Write to FILE instead of stdout.")] = None,
    store: StoreOption = None,
) -> None:
    """Export a session: a provider request (openai, anthropic) or the dsh JSONL log."""
    import json

    with _store(store, create=False) as persistence:
        read = _read(persistence, session_id)
    if format is ExportFormat.dsh_jsonl:
        data = _dsh_jsonl(read)
    else:
        view = _model_view(read, str(format.value))
        if isinstance(view, list):  # a Chat Completions request body, like Anthropic's
            view = {"messages": view}
        text = json.dumps(view, ensure_ascii=False, indent=2) + "\n"
        data = text.encode("utf-8", errors="backslashreplace")
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    try:
        output.write_bytes(data)
    except OSError as exc:
        raise ConfigError(f"cannot write the export to {output}: {exc.strerror or exc}",
                          path=str(output)) from exc
    _err().print(f"wrote {len(data)} bytes to {output}", markup=False)


def _same_header(a: FrozenDict, b: FrozenDict) -> bool:
    # Backends differ only in how they store a top-level delegationDepth (JSONL writes 0,
    # SQLite leaves it NULL; persistence spec §4.3, dsh-logs README).
    def plain(header: FrozenDict) -> dict[str, Any]:
        return {k: v for k, v in header.items() if not (k == "delegationDepth" and not v)}

    return json_equal(plain(a), plain(b))


def _copy_store(source: Persistence, target: Persistence, console: Console) -> dict[str, Any]:
    """Copy every session (header, then all events in one batch) and verify each copy.

    Raises:
        PersistenceError: code ``CONVERT_MISMATCH`` when a copy does not read back equal.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    ids = sorted(str(h["id"]) for h in source.list_headers())
    copied = skipped = event_count = 0
    with Progress(TextColumn("copying"), BarColumn(), MofNCompleteColumn(), console=console,
                  transient=True, disable=len(ids) < 2 or not console.is_terminal) as progress:
        task = progress.add_task("", total=len(ids))
        for sid in ids:
            with source.open(sid, "read") as handle:
                cold = handle.read(0)
            if target.exists(sid):
                with target.open(sid, "read") as handle:
                    present = handle.read(0)
                if not json_equal(list(present.events), list(cold.events)):
                    raise PersistenceError(
                        f"session {sid!r} already exists in {target.url} with a different log "
                        f"({len(present.events)} vs {len(cold.events)} events); convert into "
                        "an empty store", code="CONVERT_CONFLICT", session_id=sid)
                skipped += 1
            else:
                target.create(cold.header)
                with target.open(sid, "write") as handle:
                    handle.append(cold.events)
                    handle.flush()
                with target.open(sid, "read") as handle:
                    back = handle.read(0)
                if not (json_equal(list(back.events), list(cold.events))
                        and _same_header(back.header, cold.header)):
                    raise PersistenceError(
                        f"session {sid!r} did not read back equal from {target.url} after the "
                        "copy", code="CONVERT_MISMATCH", session_id=sid)
                copied += 1
                event_count += len(cold.events)
            progress.advance(task)
    return {"from": source.url, "to": target.url, "sessions": len(ids), "copied": copied,
            "skipped": skipped, "events": event_count}


@app.command("convert")
def convert(
    source: Annotated[str, typer.Option("--from", metavar="URL", show_default=False,
                                        help="Store to read.")],
    target: Annotated[str, typer.Option("--to", metavar="URL", show_default=False,
                                        help="Store to write.")],
    json_: JsonOption = False,
) -> None:
    """Copy every session of one store into another (any backends); each copy is verified."""
    _json_mode(json_)
    with _store(source, create=False) as reader, _store(target) as writer:
        outcome = _copy_store(reader, writer, _err())
    if json_:
        render.write_json(outcome)
        return
    _out().print(f"copied {render.plural(outcome['copied'], 'session')} "
                 f"({render.plural(outcome['events'], 'event')}) from "
                 f"{outcome['from']} to {outcome['to']}; skipped {outcome['skipped']} already "
                 "present; every copy read back equal", markup=False)

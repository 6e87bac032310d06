"""Shared by the commands: the store a command opens, console streams, options, reads."""

from __future__ import annotations

import difflib
import os
import re
import shlex
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final
from urllib.parse import quote

import typer

from dsh import (
    ConfigError,
    Session,
    SessionBusyError,
    SessionNotFoundError,
    Store,
)
from dsh import open as open_url
from dsh._errors import HELD_HERE_ADVICE, printable
from dsh.cli import _render as render
from dsh.cli._errors import STATE
from dsh.persistence import store_path

if TYPE_CHECKING:
    from rich.console import Console

    from dsh import DshError, Event
    from dsh.persistence import Inspection, Persistence

DEFAULT_STORE_FILE: Final = "sessions.db"
"""File name of the embedded SQLite store inside ``$DSH_HOME`` (docs/stores.md#store-urls)."""

TRANSCRIPT_SUFFIXES: Final = frozenset({".jsonl", ".json", ".traj", ".yaml", ".yml"})
"""File suffixes ``dsh import`` picks up when it walks a folder."""


def dsh_home() -> Path:
    """The dsh home folder: ``$DSH_HOME``, else ``~/.dsh`` (not created here)."""
    return Path(os.environ.get("DSH_HOME") or Path.home() / ".dsh").expanduser().resolve()


def missing_default_store() -> Path | None:
    """The default store's file when it does not exist yet, else None (nothing is created).

    A read-only command run before anything was imported or run with this ``DSH_HOME`` finds
    no store: it says so instead of creating ``sessions.db`` (and the home folder) as a side
    effect of a read (docs/cli.md).
    """
    path = dsh_home() / DEFAULT_STORE_FILE
    return None if os.path.lexists(path) else path


def no_default_store(path: Path) -> ConfigError:
    """The ``STORE_NOT_FOUND`` of a read-only command whose default store ``path`` is missing."""
    return ConfigError(f"no store yet: the default store {path} does not exist (nothing was "
                       "imported or run with this DSH_HOME); 'dsh import' adds sessions (try "
                       "'dsh import --examples'), or pass --store", code="STORE_NOT_FOUND",
                       path=str(path))


def default_store_url() -> str:
    """Return ``sqlite:///<$DSH_HOME or ~/.dsh>/sessions.db``, creating the home folder (0700).

    The environment is read here, at the edge, and nowhere in the library
    (docs/architecture.md#configuration).

    Raises:
        ConfigError: the home folder cannot be created (the message names it).
    """
    home = dsh_home()
    try:
        # Private like the files in it (0600): a new home is 0700; an existing one is the
        # user's own choice and is left as it is.
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the dsh home folder {home}: {exc.strerror or exc}; "
                          "set DSH_HOME to a writable folder or pass --store URL",
                          path=str(home)) from exc
    return "sqlite://" + quote(str(home / DEFAULT_STORE_FILE))


# -- shared options and helpers --------------------------------------------------------------

StoreOption = Annotated[
    str | None,
    typer.Option("--store", metavar="STORE", show_default=False,
                 help="Where sessions are kept: a path (a SQLite file such as ./sessions.db, "
                      "or a folder such as ./logs/ for JSONL) or a URL (sqlite:///path.db, "
                      "jsonl:///dir, jsonl+zstd:///dir, postgresql://user@host/db). Default: "
                      "$DSH_HOME/sessions.db."),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print JSON (stable keys) instead of text."),
]
TargetModelOption = Annotated[str | None, typer.Option(
    "--target-model", metavar="MODEL", show_default=False,
    help="The model the request is for: reasoning (signed thinking) made by any other model "
         "is left out, as the provider would refuse it.")]
"""``--target-model`` of ``dsh messages`` and ``dsh export``."""

def refuse_empty_id(fix: str) -> Any:
    """A typer callback refusing an empty session id (``dsh show "$UNSET"``), then ``fix``.

    Rule (docs/cli.md#exit-status-and-errors): an empty id is a usage error (exit 2) naming the
    argument, checked with the other options before any store is opened, as ``dsh import ""``
    is; a prefix match would otherwise take ``''`` for the start of every id.

    Args:
        fix: What to give instead, the message's second half.

    Returns:
        The callback: the value (a text, a list of texts or None) back unchanged.
    """
    def callback(value: str | list[str] | None) -> str | list[str] | None:
        texts = value if isinstance(value, list) else [value]
        if "" in texts:
            raise typer.BadParameter(f"the session id is empty; {fix}")
        return value

    return callback


STORED_ID_FIX: Final = "give the id of a stored session or a unique prefix of it ('dsh ls')"
"""What :func:`refuse_empty_id` asks for where a stored session is named."""

SessionArg = Annotated[str, typer.Argument(metavar="ID",
                                           help="Session id, or a unique prefix of one (see "
                                                "'dsh ls').",
                                           show_default=False,
                                           callback=refuse_empty_id(STORED_ID_FIX))]


def json_mode(value: bool) -> bool:
    STATE.json = value
    return value


DEFAULT_WAIT_S: Final = 5.0
"""How long a command waits for a session another process is writing (seconds)."""

WaitOption = Annotated[
    float, typer.Option("--wait", metavar="SECONDS", min=0, show_default=False,
                        help="How long to wait for a session that another process is "
                             "writing before giving up (default: 5 seconds)."),
]


def _ago(since_ms: int) -> str:
    seconds = max(0, int(time.time() - since_ms / 1000))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


def busy_for_people(error: SessionBusyError, waited_s: float) -> SessionBusyError:
    """The busy error as a person needs it: who holds the session, since when, what to do.

    ``since`` (epoch ms) is shown in local time and as how long ago; the message is one line
    and carries everything, so no location fields are appended to it. A holder in this process
    (``where["holder"]``, docs/errors.md#sessionbusyerror) is named so, with what frees it:
    closing the other handle or session object, which no wait does.
    """
    where = error.where
    sid, since = where.get("session_id"), where.get("since")
    here = error.held_here
    holder = error.holder_phrase()
    when = ""
    if isinstance(since, int):
        local = datetime.fromtimestamp(since / 1000).astimezone()
        stamp = local.strftime("%H:%M:%S %Z" if local.date() == datetime.now().date()
                               else "%Y-%m-%d %H:%M:%S %Z")
        when = f" since {stamp} ({_ago(since)})"
    if here:  # never waited for: it lets go only when closed
        advice = f"; {HELD_HERE_ADVICE}, then open the session again"
    else:
        advice = (f"; waited {waited_s:g} s for it. Let that process finish (or stop it), then "
                  "run the command again, or wait longer with --wait SECONDS")
    return SessionBusyError(f"session {sid!r} is being written by {holder}{when}{advice}",
                            code=error.code, session_id=str(sid) if sid else None)


def _wait_for_writers(persistence: Persistence, wait_s: float) -> None:
    """Make the store's write opens wait up to ``wait_s`` for another process's writer."""
    backend = persistence.backend
    original = backend.open

    def open_waiting(session_id: str, mode: Any = "read") -> Any:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return original(session_id, mode)
            except SessionBusyError as error:
                # A writer in this process never lets go while we wait; another one may.
                if error.held_here or time.monotonic() >= deadline:
                    raise busy_for_people(error, wait_s) from error
                time.sleep(0.05)

    backend.open = open_waiting  # type: ignore[method-assign]


@contextmanager
def cli_store(url: str | None, *, create: bool = True,
              wait: float = DEFAULT_WAIT_S) -> Iterator[Store]:
    """Open the store a command works on (``--store`` or the default) and close it after.

    Closing drains any write-behind writer, so a command's writes are durable on return. A
    read-only command (``create=False``) given an explicit URL that names nothing on disk, or a
    PostgreSQL schema holding no dsh store, fails instead of creating an empty store at a
    mistyped path; without a URL, when the default store does not exist yet, it fails the same
    way and creates neither the store nor the home folder (:func:`missing_default_store`).

    A session another process is writing is waited for, up to ``wait`` seconds, before the
    command fails with :func:`busy_for_people`'s message.

    Raises:
        ConfigError: code STORE_NOT_FOUND for such a URL, or a missing default store; code
            NOT_A_STORE, for any command (one that creates a store too), when the URL names
            a folder of other things (:func:`refuse_a_folder_of_other_things`).
    """
    url = store_url(url) if url is not None else None
    if not create:
        require_store(url)
    if url is not None:
        _refuse_foreign_file(url)
    # a read-only command on a PostgreSQL schema holding no store is refused at its first
    # use, not created (docs/stores.md#postgresql-one-session-one-writer-on-any-number-of-hosts)
    sessions = open_url(url or default_store_url(), create_schema=create or url is None)
    _wait_for_writers(sessions.persistence, wait)
    try:
        # a command that may create the store too: a store written into a folder of other
        # things (--store ~/.claude/projects for dsh import) would be one no read accepts
        refuse_a_folder_of_other_things(sessions)
        yield sessions
    finally:
        sessions.close()


def store_missing(url: str | None) -> bool:
    """True when the store ``url`` names does not exist yet; nothing is created.

    ``url`` comes from :func:`store_url`, or is None for the default store. A PostgreSQL URL
    has no path and is never missing here (its first use says).
    """
    if url is None:
        return missing_default_store() is not None
    location = store_path(url)
    return location is not None and not location.exists()


def require_store(url: str | None) -> None:
    """Refuse the missing store of a command that must not create one; create nothing.

    ``url`` is a store URL (from :func:`store_url`) or None for the default store. Rule
    (docs/cli.md#stores-and-ids): a file or folder store whose path does not exist, or a
    default store not created yet, is ``STORE_NOT_FOUND`` with one wording for every command;
    a PostgreSQL URL is checked at its first use instead (it has no path).

    Raises:
        ConfigError: code STORE_NOT_FOUND, naming the URL and the ``dsh init`` that creates
            it, or (no URL) the default store's path and ``dsh import --examples``.
    """
    if url is None:
        missing = missing_default_store()
        if missing is not None:
            raise no_default_store(missing)
        return
    if store_missing(url):
        raise ConfigError(f"no store at {url!r} ({store_path(url)} does not exist); check the "
                          f"URL, or create an empty store with 'dsh init --store {url}'",
                          code="STORE_NOT_FOUND")


_SCHEMES: Final = ("sqlite:", "jsonl:", "jsonl+zstd:", "memory:", "postgresql:", "postgres:")
_SQLITE_MAGIC: Final = b"SQLite format 3\x00"


def store_url(value: str) -> str:
    """The store URL ``--store`` names: a URL as given, or a plain path made one.

    Rule: a value starting with a known scheme is a URL. Otherwise it is a path: a folder
    (existing, or written with a trailing ``/``) is a JSONL store, anything else a SQLite file;
    ``./sessions.db`` → ``sqlite:///abs/sessions.db``, ``./logs/`` → ``jsonl:///abs/logs``.

    Raises:
        ConfigError: the value is empty or blank (code ``STORE_EMPTY``), or it starts with a
            near miss of a scheme and names no existing file (code ``STORE_SCHEME``).
    """
    if not value.strip():
        # An unset shell variable (--store "$STORE") must not mean the current folder.
        raise ConfigError("--store is empty; pass a path (./sessions.db, ./logs/) or a URL, or "
                          "leave --store out to use $DSH_HOME/sessions.db", code="STORE_EMPTY")
    if value.lower().startswith(_SCHEMES) or re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", value):
        return value  # a URL (an unknown scheme is reported as such by the URL parser)
    path = Path(value).expanduser()
    typo = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", value)
    if typo is not None and not path.exists():
        near = difflib.get_close_matches(typo.group(1).lower(),
                                         [scheme.rstrip(":") for scheme in _SCHEMES], n=1,
                                         cutoff=0.75)
        if near:  # sqlit:foo.db is a misspelt URL far more often than a file named so
            raise ConfigError(f"--store {value!r}: unknown store scheme {typo.group(1)!r}; did "
                              f"you mean '{near[0]}:'? (a file whose name holds a colon: "
                              f"write it as ./{value})", code="STORE_SCHEME")
    scheme = "jsonl" if value.endswith(("/", os.sep)) or path.is_dir() else "sqlite"
    return f"{scheme}://" + quote(str(path.resolve()))


def _refuse_foreign_file(url: str) -> None:
    """Refuse a SQLite URL naming an existing file that is not a SQLite database.

    Raises:
        ConfigError: code ``NOT_A_SQLITE_DATABASE`` naming the file and what it starts with.
    """
    if not url.lower().startswith("sqlite:"):
        return
    location = store_path(url)
    if location is None or not location.is_file():
        return
    try:
        with location.open("rb") as f:
            head = f.read(len(_SQLITE_MAGIC))
    except OSError:
        return  # the backend reports what is wrong with opening it
    if head and head != _SQLITE_MAGIC:
        # JSON text (a transcript: dsh show ID --store session.jsonl, or the source of an
        # import named as its store) is read through an import
        hint = (f"; a transcript is read after 'dsh import {location}'"
                if head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] in (b"{", b"[") else "")
        raise ConfigError(f"{location} is not a SQLite database (it starts with {head[:8]!r}); "
                          "pass the path of a dsh SQLite store, a folder for a JSONL store, or "
                          f"a new file name to create one{hint}", code="NOT_A_SQLITE_DATABASE",
                          path=str(location))


def refuse_a_folder_of_other_things(sessions: Store) -> None:
    """Refuse a JSONL store whose folder holds no session and names no dsh store holds.

    Rule (docs/cli.md#stores-and-ids): ``--store /etc`` is no store; every command that opens
    an existing store (``ls``, ``verify --all``, ``gc``, ``search``, ...) or creates one
    (``import``, ``init``, ...) says so before it reads or writes anything there. The
    sessions are listed only when the folder's names already look foreign and it holds no
    SQLite store (:func:`sqlite_stores_in`), so a real store pays one listing of its top
    folder; a store whose listing reports an unreadable session is left to the command,
    which names that session.

    Raises:
        ConfigError: code ``NOT_A_STORE``, naming a few of the names and ``dsh init``.
    """
    url = sessions.url
    foreign = foreign_entries(url, limit=4)
    if not foreign or sqlite_stores_in(url, limit=1):
        return
    unreadable: list[DshError] = []
    if sessions.list(errors=unreadable, which="all") or unreadable:
        return
    names = ", ".join(foreign[:3]) + (", …" if len(foreign) > 3 else "")
    raise ConfigError(
        f"{url} is not a dsh store: it holds no sessions and holds {names}, which a dsh "
        "store never holds; pass the store you meant with --store, or create one in a "
        "new folder with 'dsh init --store NEW_FOLDER'", code="NOT_A_STORE")


def foreign_entries(url: str, *, limit: int = 3) -> list[str]:
    """Names at the top of a JSONL store's folder that no dsh store holds (at most ``limit``).

    A JSONL root holds project folders (``--<slug>--``, ``_no-cwd``) and ``.dsh-*`` sidecars
    (docs/formats.md#layout-and-path-encoding); ``dsh ls`` on a folder holding other things says
    it is not a dsh store (docs/cli.md#stores-and-ids). SQLite files (named by
    :func:`sqlite_stores_in`) and ``config.toml`` (``$DSH_HOME``'s, docs/cli.md#settings) are
    left out. Pure reading: the folder's names.
    """
    from dsh.persistence.jsonl import is_project_dir_name

    folder = store_path(url) if url.lower().startswith("jsonl") else None
    try:
        entries = sorted(folder.iterdir()) if folder is not None else []
    except OSError:
        return []
    found = [entry.name for entry in entries
             if not is_project_dir_name(entry.name) and ".dsh-" not in entry.name
             and entry.name != "config.toml" and not _is_sqlite_file(entry)]
    return found[:limit]


def _is_sqlite_file(entry: Path) -> bool:
    """Whether ``entry`` is a file that starts as an SQLite database does (False if unreadable)."""
    try:
        if not entry.is_file():
            return False
        with entry.open("rb") as f:
            return f.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
    except OSError:
        return False


def sqlite_stores_in(url: str, *, limit: int = 3) -> list[Path]:
    """The SQLite files at the top of the folder a JSONL store URL names (at most ``limit``).

    ``--store $DSH_HOME`` names the folder that holds ``sessions.db``: a valid, empty JSONL
    store. ``dsh ls`` on an empty store names these files so the person sees the store they
    meant (docs/cli.md#stores-and-ids); sidecars (``*.dsh-*``, such as the SQLite search index
    ``<db>.dsh-search.db``) are not stores and are left out. Pure reading: the first 16 bytes
    of each file.
    """
    if not url.lower().startswith("jsonl:"):
        return []
    folder = store_path(url)
    found: list[Path] = []
    try:
        entries = sorted(folder.iterdir()) if folder is not None else []
    except OSError:
        return []
    for entry in entries:
        # (a sidecar of ours is no store: the search index is SQLite, docs/formats.md)
        if ".dsh-" not in entry.name and _is_sqlite_file(entry):
            found.append(entry)
            if len(found) == limit:
                break
    return found


def stdout_console() -> Console:
    return render.make_console()


def stderr_console() -> Console:
    return render.make_console(stderr=True)


def require_session(sessions: Store, session_id: str, *, writes: bool = False) -> str:
    """Resolve what a person typed to a stored session id and return it.

    Rule: an exact id wins; else a prefix of exactly one stored id is that id (like git). A
    command that writes (``writes=True``) says on stderr which session a prefix matched before
    it writes (docs/cli.md#stores-and-ids).

    Raises:
        SessionNotFoundError: ``AMBIGUOUS_SESSION_ID`` for a prefix of several ids (they are
            listed); ``SESSION_NOT_FOUND`` otherwise, suggesting the closest stored id.
    """
    if sessions.exists(session_id):
        return session_id
    ids = sorted(str(h["id"]) for h in sessions.persistence.list_headers())
    matches = [sid for sid in ids if sid.startswith(session_id)] if session_id else []
    if len(matches) == 1:
        if writes:
            import sys

            sys.stderr.write(printable(f"note: {session_id!r} is a prefix of session "
                                       f"{matches[0]}; writing to {matches[0]}\n"))
        return matches[0]
    if matches:
        shown = ", ".join(matches[:10]) + (f" and {len(matches) - 10} more"
                                           if len(matches) > 10 else "")
        raise SessionNotFoundError(
            f"session id prefix {session_id!r} matches {len(matches)} sessions in store "
            f"{sessions.url}: {shown}; type more of the id", code="AMBIGUOUS_SESSION_ID",
            session_id=session_id)
    import difflib

    close = difflib.get_close_matches(session_id, ids, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise SessionNotFoundError(
        f"no session {session_id!r} in store {sessions.url}; {hint}'dsh ls' lists the ids",
        session_id=session_id)


SHORT_ID: Final = 8
"""Characters of an id ``dsh ls`` users type: a new id the CLI mints is unique in that many."""


def refuse_unprintable_id(value: str | None, option: str) -> str | None:
    """Return ``value``, a new session id taken from the command line, unchanged.

    Rule (docs/cli.md#stores-and-ids): a name the CLI gives a session it creates holds no
    control character (C0, DEL, C1) nor bidirectional override, so it prints as typed; ids
    already stored stay readable and are escaped when printed.

    Raises:
        typer.BadParameter: (exit 2, ``error[USAGE]``) naming ``option``, e.g. ``'--as'``.
    """
    # str.isprintable(): the one printable-id rule (also interop usable_id, dsh inspect);
    # has_unprintable keeps tab and newline, which body text may hold and an id may not
    if value is not None and not value.isprintable():
        raise typer.BadParameter("a session id cannot hold control characters or bidirectional "
                                 f"overrides, got {printable(repr(value))}", param_hint=option)
    return value


def fresh_session_id(sessions: Store) -> str:
    """A new random session id whose first :data:`SHORT_ID` characters start no stored id.

    Rule: ids the CLI chooses (a new ``dsh run``/``dsh chat`` session, a fork without ``--as``)
    keep every stored id's short prefix unique (docs/cli.md#stores-and-ids), unlike
    ``<ID>-fork-<n>``, which every prefix of its parent also matches.
    """
    from uuid import uuid4

    taken = [str(h["id"]) for h in sessions.persistence.list_headers()]
    while True:
        candidate = str(uuid4())
        short = candidate[:SHORT_ID]
        if not any(sid.startswith(short) or short.startswith(sid) for sid in taken):
            return candidate


SOURCE_EVENT_TYPE: Final = "import/source"
"""The ignorable event every imported session carries: ``data.format`` names the source."""

STAGING_REASON: Final = "dsh import: being written, listed once complete"
"""The trash reason of a session ``dsh import`` is writing staged
(docs/interop.md#staged-imports)."""


def staged_imports(persistence: Persistence) -> frozenset[str]:
    """The sessions a ``dsh import`` left half-written: in the trash with :data:`STAGING_REASON`.

    Such a session is only the prefix of its source that was written before the import was
    killed or failed; the next ``dsh import`` of the file completes it
    (docs/interop.md#staged-imports), so nothing else may write to it.
    """
    from dsh.rights import store_log

    return frozenset(sid for sid, entry in store_log(persistence).trash.items()
                     if entry.reason == STAGING_REASON and entry.purged_ms is None)


def import_again_hint(events: Iterable[Event]) -> str:
    """The command that completes a half-written import: ``dsh import <its source path>``.

    The path is the one its ``import/source`` event recorded (as it was given to ``dsh
    import``); ``FILE`` when the log holds none.
    """
    for event in events:
        if event["type"] == SOURCE_EVENT_TYPE:
            data = event.get("data")
            path = data.get("path") if isinstance(data, dict) else None
            if isinstance(path, str) and path:
                return f"dsh import {shlex.quote(printable(path))}"
        break  # the importer writes import/source first
    return "dsh import FILE"


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


def read_session(sessions: Store, session_id: str) -> Inspection:
    """Read a stored session through the cold-read pipeline, without writing anything.

    Raises:
        SessionNotFoundError: no such session (a unique id prefix is accepted).
        LogCorruptError, SessionFormatUnsupportedError, UnknownEventTypeError: unreadable log.
    """
    return sessions.read(require_session(sessions, session_id))


def restored_session(read: Inspection, *, with_closers: bool = True) -> Any:
    """A detached Session over the stored log (plus the repair closers when asked)."""
    seed = read.events if with_closers else read.stored_events
    return Session.restore(str(read.header["id"]), seed, read.header,
                           inherited_event_count=read.header.get("seedLength") or 0)


def model_view(read: Inspection, fmt: str, target_model: str | None = None) -> Any:
    """The derived messages (after in-memory repair of an open turn) in ``fmt``.

    ``dsh``: the list of dsh messages. A provider format gives its request body, the one shape
    ``dsh messages`` and ``dsh export`` both print: ``{"messages": [...]}`` for OpenAI Chat
    Completions, ``{"system"?, "messages"}`` for Anthropic Messages. ``target_model``
    (provider formats only) leaves out reasoning made by other models.
    """
    from dsh.session import apply_old_marks

    session = restored_session(read)
    apply_old_marks(session)  # removals an earlier dsh only marked (docs/forgetting.md)
    messages = session.derive_messages()
    if fmt == "openai":
        from dsh.interop import to_openai

        return {"messages": to_openai(messages, target_model=target_model)}
    if fmt == "anthropic":
        from dsh.interop import to_anthropic

        return to_anthropic(messages, target_model=target_model)
    return list(messages)  # the snapshot as the JSON array the command prints


@contextmanager
def deferred_interrupts() -> Iterator[list[int]]:
    """Hold Ctrl-C (SIGINT) while the block runs: each one is recorded, not raised.

    Yields the list the interrupts are appended to (a signal number each), so a command can
    finish the write it is in, or stop between two of them, and then say so. The previous
    handler is back when the block ends. Outside the main thread Python delivers no signal
    to a handler of ours: the list stays empty and Ctrl-C is handled as it would be anyway.
    An ignored SIGINT (``nohup``, a ``cmd &`` of a non-interactive shell) stays ignored: the
    list stays empty, so a Ctrl-C meant for the foreground never stops a background import.
    """
    caught: list[int] = []
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is signal.SIG_IGN):
        yield caught
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, previous)

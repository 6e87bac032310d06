"""Shared by the commands: the store a command opens, console streams, options, reads."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final
from urllib.parse import quote

import typer

from dsh import (
    ConfigError,
    Session,
    SessionNotFoundError,
    open_store,
)
from dsh.cli import render
from dsh.cli._errors import STATE
from dsh.persistence import store_path

if TYPE_CHECKING:
    from rich.console import Console

    from dsh import Event
    from dsh.persistence import Inspection, Persistence

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
                 help="Store URL: sqlite:///path.db, jsonl:///dir, jsonl+zstd:///dir, "
                      "postgresql://user@host/db?schema=name (default: sqlite:///$DSH_HOME/sessions.db)."),
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print JSON (stable keys) instead of text."),
]
TargetModelOption = Annotated[str | None, typer.Option(
    "--target-model", metavar="MODEL", show_default=False,
    help="The model the request is for: reasoning (signed thinking) made by any other model "
         "is left out, as the provider would refuse it.")]
"""``--target-model`` of ``dsh messages`` and ``dsh export``."""

SessionArg = Annotated[str, typer.Argument(metavar="ID", help="Session id (see `dsh ls`).",
                                           show_default=False)]


def json_mode(value: bool) -> bool:
    STATE.json = value
    return value


@contextmanager
def cli_store(url: str | None, *, create: bool = True) -> Iterator[Persistence]:
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


def stdout_console() -> Console:
    return render.make_console()


def stderr_console() -> Console:
    return render.make_console(stderr=True)


def require_session(persistence: Persistence, session_id: str) -> None:
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


def read_session(persistence: Persistence, session_id: str) -> Inspection:
    """Read a stored session through the cold-read pipeline, without writing anything.

    Raises:
        SessionNotFoundError: no such session.
        LogCorruptError, SessionFormatUnsupportedError, UnknownEventTypeError: unreadable log.
    """
    require_session(persistence, session_id)
    return persistence.read(session_id)


def restored_session(read: Inspection, *, with_closers: bool = True) -> Any:
    """A detached Session over the stored log (plus the repair closers when asked)."""
    seed = read.events if with_closers else read.stored_events
    return Session.restore(str(read.header["id"]), seed, read.header,
                           inherited_event_count=read.header.get("seedLength") or 0)


def model_view(read: Inspection, fmt: str, target_model: str | None = None) -> Any:
    """The derived messages (after in-memory repair of an open turn) in ``fmt``.

    ``target_model`` (provider formats only) leaves out reasoning made by other models.
    """
    messages = restored_session(read).derive_messages()
    if fmt == "openai":
        from dsh.interop import to_openai

        return to_openai(messages, target_model=target_model)
    if fmt == "anthropic":
        from dsh.interop import to_anthropic

        return to_anthropic(messages, target_model=target_model)
    return messages

"""``dsh init``, ``dsh migrate`` and ``dsh events --follow``: store upkeep and live reading."""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Annotated, cast

import typer

from dsh._errors import ConfigError
from dsh.cli import _render as render
from dsh.cli._common import (
    JsonOption,
    StoreOption,
    cli_store,
    default_store_url,
    json_mode,
    require_session,
    require_store,
    stdout_console,
    store_url,
)
from dsh.cli._errors import STATE
from dsh.persistence import Migrates, SchemaVersioned, store_path


def init(store: StoreOption = None, json_: JsonOption = False) -> None:
    """Create an empty store (a SQLite file, a JSONL folder) ready for sessions.

    An existing store is left as it is and reported, with its session count.
    """
    json_mode(json_)
    location = store_path(store_url(store) if store is not None else default_store_url())
    # a database store (PostgreSQL) has no path to look at: a read-only open says whether its
    # schema holds a store (an empty one too: a 'dsh migrate' or an earlier init made it)
    existed = location.exists() if location is not None else _database_store_exists(store)
    with cli_store(store) as opened:
        persistence = opened.persistence
        # SQLite creates its file on open; a JSONL folder is made here so it exists at once.
        if location is not None and not location.exists() \
                and not persistence.url.lower().startswith("sqlite"):
            try:
                location.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"cannot create the store folder {location}: "
                                  f"{exc.strerror or exc}", path=str(location)) from exc
        sessions = len(persistence.list_headers())
        outcome = {"store": persistence.url, "created": not existed, "sessions": sessions}
    if json_:
        render.write_json(outcome)
        return
    stdout_console().print(
        f"created an empty store at {outcome['store']}" if not existed else
        f"{outcome['store']} already exists ({render.plural(sessions, 'session')}); left as "
        "it is", markup=False)


def _database_store_exists(store: str | None) -> bool:
    """Whether the database store ``store`` names (PostgreSQL) holds a dsh store; creates nothing.

    Raises:
        ConfigError: any failure of the read-only open but ``STORE_NOT_FOUND`` (a bad URL, a
            server that does not answer), as the open that follows would raise it.
    """
    try:
        with cli_store(store, create=False) as probe:
            probe.persistence.list_headers()
    except ConfigError as exc:
        if exc.code != "STORE_NOT_FOUND":
            raise
        return False
    return True


def migrate(
    store: Annotated[str, typer.Option("--store", metavar="URL", show_default=False,
                                       help="Store URL to bring to this build's schema.")],
    json_: JsonOption = False,
) -> None:
    """Apply pending schema migrations (forward only; safe from many hosts at once).

    PostgreSQL stores carry versioned migrations; SQLite and JSONL stores have nothing to
    migrate and are reported as they are. A file or folder store that does not exist is
    refused (``STORE_NOT_FOUND``) instead of created: a mistyped path migrates nothing. A
    PostgreSQL schema holding no store yet is set up at this build's schema (its first
    migration run).

    Raises:
        ConfigError: code STORE_NOT_FOUND for a SQLite or JSONL path that does not exist.
    """
    json_mode(json_)
    require_store(store_url(store))  # before cli_store, which would create the file
    with cli_store(store) as opened:
        persistence = opened.persistence
        backend = persistence.backend
        caps = backend.capabilities
        migrates = caps.migrations
        version = (cast(Migrates, backend).migrate() if migrates
                   else cast(SchemaVersioned, backend).schema_version if caps.schema_version
                   else None)
        outcome = {"store": persistence.url, "schemaVersion": version, "migrated": migrates}
    if json_:
        render.write_json(outcome)
        return
    if not migrates:
        stdout_console().print(f"{outcome['store']}: nothing to migrate (schema version "
                               f"{version if version is not None else 'n/a'})", markup=False)
    else:
        stdout_console().print(f"{outcome['store']}: at schema version {version}", markup=False)


def follow_events(store: str | None, session_id: str, from_seq: int,
                  patterns: Sequence[str]) -> None:
    """Print the session's events from ``from_seq`` on as JSON lines, then each new commit.

    Runs until interrupted: Ctrl-C, the normal way to stop, exits 130 without an error line.
    PostgreSQL wakes on ``NOTIFY``; file stores are read every 200 ms.

    Raises:
        SessionNotFoundError: no such session.
    """
    with cli_store(store, create=False) as sessions:
        session_id = require_session(sessions, session_id)

        async def run() -> None:
            async for event in sessions.tail(session_id, from_seq):
                if not patterns or any(fnmatchcase(event["type"], p) for p in patterns):
                    render.write_json_lines([event])

        import asyncio  # here: the CLI starts (`dsh ls`) without asyncio

        STATE.interrupt_ends = True
        asyncio.run(run())

"""``dsh migrate`` and ``dsh events --follow``: store upkeep and live reading."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Annotated

import typer

from dsh.cli import render
from dsh.cli._common import JsonOption, cli_store, json_mode, require_session, stdout_console

__all__ = ["follow_events", "migrate"]


def migrate(
    store: Annotated[str, typer.Option("--store", metavar="URL", show_default=False,
                                       help="Store URL to bring to this build's schema.")],
    json_: JsonOption = False,
) -> None:
    """Apply pending schema migrations (forward only; safe from many hosts at once).

    PostgreSQL stores carry versioned migrations; SQLite and JSONL stores have nothing to
    migrate and are reported as they are.
    """
    json_mode(json_)
    with cli_store(store) as persistence:
        backend = persistence.backend
        run = getattr(backend, "migrate", None)
        version = run() if run is not None else getattr(backend, "schema_version", None)
        outcome = {"store": persistence.url, "schemaVersion": version,
                   "migrated": run is not None}
    if json_:
        render.write_json(outcome)
        return
    if run is None:
        stdout_console().print(f"{outcome['store']}: nothing to migrate (schema version "
                               f"{version if version is not None else 'n/a'})", markup=False)
    else:
        stdout_console().print(f"{outcome['store']}: at schema version {version}", markup=False)


def follow_events(store: str | None, session_id: str, from_seq: int,
                  patterns: Sequence[str]) -> None:
    """Print the session's events from ``from_seq`` on as JSON lines, then each new commit.

    Runs until interrupted (Ctrl-C exits 130, as every command does). PostgreSQL wakes on
    ``NOTIFY``; file stores are read every 200 ms.

    Raises:
        SessionNotFoundError: no such session.
    """
    with cli_store(store, create=False) as persistence:
        require_session(persistence, session_id)

        async def run() -> None:
            async for event in persistence.tail(session_id, from_seq):
                if not patterns or any(fnmatchcase(event["type"], p) for p in patterns):
                    render.write_json_lines([event])

        asyncio.run(run())

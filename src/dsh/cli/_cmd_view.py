"""``dsh view``: serve the read-only web viewer of a store (the ``view`` extra)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from dsh import ConfigError
from dsh._install import install_hint
from dsh.cli._common import (
    StoreOption,
    cli_store,
    default_store_url,
    missing_default_store,
    no_default_store,
    require_session,
    store_url,
)
from dsh.persistence import store_path


def view(
    session_id: Annotated[str | None, typer.Argument(
        metavar="[SESSION]", show_default=False,
        help="Open this session's page first.")] = None,
    store: StoreOption = None,
    port: Annotated[int, typer.Option("--port", min=0, max=65535,
                                      help="TCP port; 0 picks a free one.")] = 0,
    host: Annotated[str, typer.Option(
        "--host", help="Address to bind; another than loopback needs --token.")] = "127.0.0.1",
    token: Annotated[str | None, typer.Option(
        "--token", show_default=False,
        help="The secret in the URL (default: a random one).")] = None,
    no_browser: Annotated[bool, typer.Option(
        "--no-browser", help="Print the URL, do not open a browser.")] = False,
) -> None:
    """See sessions in a browser: transcript, model view, forks, search, live (read-only).

    Prints the URL it serves (with its token) as the first line, then serves until
    interrupted (Ctrl-C). Binds 127.0.0.1 unless --host says otherwise.
    """
    try:
        from dsh.view import check_bind, serve
    except ImportError as exc:
        raise ConfigError(f"dsh view needs the 'view' extra ({exc.name} is missing): "
                          f"{install_hint('view')}", code="VIEW_EXTRA_MISSING") from exc
    check_bind(host, token)
    missing = missing_default_store() if store is None else None
    if missing is not None:  # a read creates no store, nor the home folder
        raise no_default_store(missing)
    url = store_url(store) if store is not None else default_store_url()
    location = store_path(url)
    if location is not None and not location.exists():
        raise ConfigError(f"no store at {url!r} ({location} does not exist); check the URL, or "
                          "import sessions first ('dsh import')", code="STORE_NOT_FOUND")
    if session_id is not None:  # a unique prefix opens that session's page (docs/cli.md)
        with cli_store(url, create=False) as sessions:
            session_id = require_session(sessions, session_id)

    def announce(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    serve(url, host=host, port=port, token=token, session_id=session_id,
          open_browser=not no_browser, announce=announce)

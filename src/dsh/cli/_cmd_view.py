"""``dsh view``: serve the read-only web viewer of a store (the ``view`` extra)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from dsh import ConfigError
from dsh._install import install_hint
from dsh.cli._common import (
    STORED_ID_FIX,
    StoreOption,
    cli_store,
    default_store_url,
    refuse_empty_id,
    require_session,
    require_store,
    store_url,
)


def view(
    session_id: Annotated[str | None, typer.Argument(
        metavar="[ID]", show_default=False, callback=refuse_empty_id(STORED_ID_FIX),
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
    given = store_url(store) if store is not None else None
    require_store(given)  # a read creates no store, nor the home folder (docs/cli.md)
    url = given or default_store_url()
    if session_id is not None:  # a unique prefix opens that session's page (docs/cli.md)
        with cli_store(url, create=False) as sessions:
            session_id = require_session(sessions, session_id)

    def announce(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    serve(url, host=host, port=port, token=token, session_id=session_id,
          open_browser=not no_browser, announce=announce)

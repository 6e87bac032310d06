"""Serving the viewer: the bind rule, the token, uvicorn on a socket bound before the URL prints.

Rule: the viewer binds to loopback (127.0.0.1) by default; any other ``host`` is refused unless
the caller chose a token (``token``), since the page shows every session of the store. The token
is otherwise random (``secrets.token_urlsafe``, 192 bits) and printed in the URL, as Jupyter
does. The socket is bound before the URL is announced, so the URL works the moment it is seen.
"""

from __future__ import annotations

import asyncio
import errno
import secrets
import socket
import webbrowser
from collections.abc import Callable
from types import FrameType
from urllib.parse import quote

from dsh import ConfigError
from dsh.view._hosts import is_loopback as is_loopback


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve a non-loopback ``host`` without a token the caller chose.

    Raises:
        ConfigError: code ``VIEW_TOKEN_REQUIRED``.
    """
    if not is_loopback(host) and not token:
        raise ConfigError(f"dsh view binds {host!r}, which other machines can reach; it shows "
                          "every session of the store, so pass --token with a secret of your "
                          "own (or serve on 127.0.0.1)", code="VIEW_TOKEN_REQUIRED")


def new_token() -> str:
    """A fresh random token (URL-safe text, 192 bits)."""
    return secrets.token_urlsafe(24)


def viewer_url(host: str, port: int, token: str, session_id: str | None = None) -> str:
    """The URL a person opens: ``http://host:port/[s/<id>]?token=...``."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    path = f"/s/{quote(session_id, safe='')}" if session_id else "/"
    return f"http://{shown}:{port}{path}?token={quote(token, safe='')}"


def serve(store_url: str, *, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
          session_id: str | None = None, open_browser: bool = True,
          announce: Callable[[str], None] = print) -> None:
    """Serve the viewer of ``store_url`` until interrupted (SIGINT, SIGTERM).

    Args:
        store_url: The store to show (opened read-only).
        host: Address to bind; loopback unless ``token`` is given.
        port: TCP port; 0 picks a free one.
        token: The secret every request must carry; default a random one.
        session_id: Open this session's page first.
        open_browser: Open the URL in the default browser.
        announce: Called with the URL once the socket listens (default: print it).

    Raises:
        ConfigError: a non-loopback ``host`` without ``token``, a bad port, an address that
            cannot be bound (code ``VIEW_ADDRESS``: the port in use, the host not this
            machine's), or a bad store URL.
    """
    import uvicorn

    from dsh.view._app import create_app
    from dsh.view._data import ViewStore

    check_bind(host, token)
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port {port} is not a TCP port (0-65535; 0 picks a free one)",
                          code="VIEW_PORT")
    token = token or new_token()
    store = ViewStore(store_url)
    try:
        sock = _listen(host, port)
        sock.setblocking(False)
        url = viewer_url(host, sock.getsockname()[1], token, session_id)
        stopping = asyncio.Event()
        bound = (host, sock.getsockname()[1])
        config = uvicorn.Config(create_app(store, token=token, stopping=stopping, bind=bound),
                                log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=1, access_log=False)
        loop_of: list[asyncio.AbstractEventLoop] = []

        class Server(uvicorn.Server):
            """uvicorn's server that also tells the live streams it is stopping."""

            async def serve(self, sockets: list[socket.socket] | None = None) -> None:
                loop_of.append(asyncio.get_running_loop())
                await super().serve(sockets)

            def handle_exit(self, sig: int, frame: FrameType | None) -> None:
                super().handle_exit(sig, frame)
                for loop in loop_of:  # a signal handler: the loop sets the event itself
                    loop.call_soon_threadsafe(stopping.set)

        server = Server(config)
        announce(url)
        if open_browser:
            webbrowser.open(url)
        server.run(sockets=[sock])
    finally:
        store.close()


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port``, or a ``VIEW_ADDRESS`` error naming them.

    Rule (docs/errors.md): an address that cannot be bound is the person's to change, not a
    bug: a port another program holds (a second ``dsh view`` on the same ``--port``) or a host
    that is not this machine's is one line naming the address and the option to change.

    Raises:
        ConfigError: code ``VIEW_ADDRESS``, the OS's reason chained.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
        if exc.errno == errno.EADDRINUSE:
            fix = (f"port {port} is in use by another program (another 'dsh view'?); pass "
                   "another --port, or leave it out to pick a free one")
        elif exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
            fix = f"{host!r} is not an address of this machine; check --host"
        elif exc.errno == errno.EACCES:
            fix = (f"port {port} needs privileges; pass a port above 1023, or leave --port "
                   "out to pick a free one")
        else:
            fix = "check --host and --port"
        raise ConfigError(f"dsh view cannot listen on {shown}:{port}: "
                          f"{exc.strerror or exc}; {fix}", code="VIEW_ADDRESS") from exc
    return sock

"""Which hosts the viewer answers for: loopback names and the ``Host`` header rule.

Rule: docs/view.md#safety.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Final


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


_LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARDS: Final = frozenset({"0.0.0.0", "::"})


def host_allowed(header: str, bind_host: str, port: int) -> bool:
    """Whether a request's ``Host`` header names this viewer (the DNS-rebinding defense).

    Allowed: the port the viewer listens on, with the bound host (case-insensitive, a trailing
    dot ignored), the loopback names (``localhost``, ``127.0.0.1``, ``[::1]``) when it binds
    loopback, and, when it binds every interface (``0.0.0.0``, ``::``), any IP address and this
    machine's own names. A name a page's DNS can point here (``evil.com``) is never allowed:
    its page would otherwise read the viewer with a token it got. Rule: docs/view.md#safety.
    """
    if header.startswith("["):  # [v6]:port
        name, _, rest = header[1:].partition("]")
        given = rest[1:] if rest.startswith(":") else None if not rest else "x"
    else:
        name, sep, rest = header.partition(":")
        given = rest if sep else None
    if (80 if given is None else int(given) if given.isdigit() else -1) != port:
        return False
    name = name.rstrip(".").casefold()
    bound = bind_host.strip("[]").rstrip(".").casefold()
    if name == bound or (is_loopback(bound) and name in _LOOPBACK_NAMES):
        return True
    if bound in _WILDCARDS:
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            return name in _LOOPBACK_NAMES or name in {
                socket.gethostname().casefold(), socket.getfqdn().casefold()}
    return False

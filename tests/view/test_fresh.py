"""A running viewer never shows what a rewrite removed, and answers only for its own host.

Real ``dsh view`` processes over real stores, asked over HTTP (docs/view.md#what-the-viewer-keeps,
docs/view.md#safety, docs/forgetting.md#what-a-running-viewer-shows).
"""

from __future__ import annotations

import http.client
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

import dsh
from dsh.testing._logs import fixed_clock
from tests.view import stores

SECRET = "sk-live-7Qx9ZrT4Lm2Vb8Nc"
SHOWN = SECRET[len("sk-live-"):]  # a search hit marks the words it matched


def _write(url: str) -> None:
    """Two sessions; ``leaky``'s title holds the secret (a paste a person regrets)."""
    for sid, title in (("leaky", f"deploy with {SECRET}"), ("plain", "an ordinary title")):
        with dsh.open(url, clock=fixed_clock()) as store:
            s = store.session(sid, header={"createdAt": 1_767_225_600_000, "cwd": "/w"})
            s.append("turn/start", {"turn": 1})
            s.append("session/title", {"title": title})


def _get(base: str, path: str, *, host: str | None = None) -> tuple[int, str]:
    """GET ``base + path`` (with an explicit ``Host`` header when given)."""
    parts = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        headers = {"Host": host} if host is not None else {}
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def _stop(server: subprocess.Popen[str]) -> None:
    server.terminate()
    server.wait(timeout=30)
    if server.stdout is not None:
        server.stdout.close()


def _cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "dsh.cli", *args], cwd=stores.REPO, check=True,
                   capture_output=True, timeout=120)


@pytest.mark.parametrize("backend", ["sqlite", "jsonl", "postgres"])
@pytest.mark.parametrize("operation", ["redact", "erase", "rm"])
def test_the_next_request_after_a_rewrite_does_not_show_the_secret(
        tmp_path: Path, backend: str, operation: str) -> None:
    with stores.store_url(backend, tmp_path) as url:
        _write(url)
        server, base, token = stores.start_view(url)
        try:
            t = f"token={urllib.parse.quote(token)}"
            # every page read once before: the listing (and its rows) are kept by the viewer
            for path in (f"/?{t}", f"/s/leaky?{t}", f"/search?q=sk-live&{t}"):
                status, body = _get(base, path)
                assert status == 200 and SHOWN in body, path
            if operation == "redact":
                _cli("redact", "leaky", "--match", "sk-live-[A-Za-z0-9]+", "--store", url)
            elif operation == "erase":
                _cli("erase", "leaky", "--receipt", str(tmp_path / "receipt.json"), "--store", url)
            else:
                _cli("rm", "leaky", "--store", url)
            # a session in the trash is kept as it was: only the listing leaves it out
            after = (f"/?{t}", f"/search?q=sk-live&{t}") if operation == "rm" else (
                f"/?{t}", f"/s/leaky?{t}", f"/search?q=sk-live&{t}")
            for path in after:
                status, body = _get(base, path)
                assert SHOWN not in body, (operation, path)
            listing = _get(base, f"/?{t}")[1]
            assert "an ordinary title" in listing  # the other session is still listed
            if operation == "redact":
                assert "leaky" in listing and _get(base, f"/s/leaky?{t}")[0] == 200
        finally:
            _stop(server)


def test_a_foreign_host_header_is_refused_even_with_the_token(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'h.db'}"
    _write(url)
    server, base, token = stores.start_view(url)
    try:
        port = urllib.parse.urlsplit(base).port
        t = f"token={urllib.parse.quote(token)}"
        for host in ("evil.com", f"evil.com:{port}", f"127.0.0.1:{port + 1}",
                     f"localhost.evil.com:{port}"):
            status, body = _get(base, f"/?{t}", host=host)
            assert status == 400 and "does not answer for this host" in body, host
            assert "leaky" not in body
        # the printed URL's host, and the loopback names, with the port, are answered
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
            status, body = _get(base, f"/?{t}", host=host)
            assert status == 200 and "an ordinary title" in body, host
    finally:
        _stop(server)


def test_host_allowed_rules() -> None:
    from dsh.view._hosts import host_allowed

    assert host_allowed("127.0.0.1:8765", "127.0.0.1", 8765)
    assert host_allowed("LocalHost.:8765", "127.0.0.1", 8765)
    assert not host_allowed("127.0.0.1", "127.0.0.1", 8765)  # port 80 is not the viewer's
    assert not host_allowed("", "127.0.0.1", 8765)
    assert not host_allowed("evil.com:8765", "0.0.0.0", 8765)
    assert host_allowed("192.0.2.7:8765", "0.0.0.0", 8765)  # an address: no DNS to rebind
    assert host_allowed("viewer.lan:8765", "viewer.lan", 8765)
    assert not host_allowed("localhost:8765", "192.0.2.7", 8765)
    assert host_allowed("[2001:db8::1]:8765", "2001:db8::1", 8765)

"""Live pages on every backend: the server-sent events a page subscribes to follow the store."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette")
from tests.view.stores import store_url

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("backend", ["jsonl", "sqlite", "postgres"])
def test_live_stream_sends_each_committed_turn_as_rendered_entries(tmp_path: Path,
                                                                   backend: str) -> None:
    with store_url(backend, tmp_path) as url:
        writer = subprocess.Popen([sys.executable, "-m", "tests.view.live_writer", url, "w1"],
                                  cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        assert writer.stdin is not None and writer.stdout is not None
        server = None
        try:
            assert writer.stdout.readline().strip() == "ready"
            server = subprocess.Popen([sys.executable, "-m", "dsh.cli", "view", "--store", url,
                                       "--no-browser", "--port", "0"], stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True)
            assert server.stdout is not None
            line = server.stdout.readline().strip()
            base, token = line.split("/?token=")
            stream = urllib.request.urlopen(f"{base}/s/w1/live?from=6&token={token}",
                                            timeout=30)
            writer.stdin.write("<b>streamed answer</b>\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "flushed"
            seen: list[str] = []
            for raw in stream:
                text = raw.decode()
                seen.append(text)
                if text.startswith("data: 12"):
                    break
            events = "".join(seen)
            assert "event: entries" in events and "id: 11" in events
            assert "&lt;b&gt;streamed answer&lt;/b&gt;" in events
            assert "<b>streamed" not in events
            assert 'id="seq-6"' in events and "Turn 2" in events
            stream.close()
        finally:
            writer.stdin.close()
            writer.wait(timeout=30)
            writer.stdout.close()
            if server is not None:
                server.send_signal(signal.SIGINT)
                server.wait(timeout=30)
                if server.stdout is not None:
                    server.stdout.close()


def test_ctrl_c_with_a_live_page_open_exits_130_without_a_traceback(tmp_path: Path) -> None:
    # docs/cli.md#exit-status-and-errors: before, uvicorn waited a second for the open live
    # stream, then cancelled it and printed "Exception in ASGI application" with a traceback
    # of the CancelledError above the error[INTERRUPTED] line
    import dsh
    from dsh.testing import LogBuilder

    url = f"sqlite:{tmp_path / 's.db'}"
    log = LogBuilder("w1")
    log.completed_turn("hello")
    with dsh.open(url) as store:
        session = store.session("w1")
        for event in log.events:
            session.append(event["type"], event["data"], surface_op=event.get("surfaceOp"))
    from tests.view.stores import start_view

    server, base, token = start_view(url, stderr=subprocess.PIPE)
    try:
        with urllib.request.urlopen(f"{base}/s/w1/live?from=0&token={token}",
                                    timeout=30) as stream:
            assert stream.readline() == b"retry: 2000\n"  # the stream is open
            # the backlog (6 events: its count event says 6) is read before the signal: a
            # Ctrl-C that won the race with it ended the stream before any entry
            while (line := stream.readline()) != b"data: 6\n":
                assert line, "the stream ended before its backlog"
            assert stream.readline() == b"\n"
            server.send_signal(signal.SIGINT)
            _, err = server.communicate(timeout=60)
            # the server ended the stream itself: read to its end without IncompleteRead
            # (before: cut), nothing after the backlog but a keep-alive
            assert stream.read() in (b"", b": keep-alive\n\n")
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 130
    assert err == "error[INTERRUPTED]: interrupted\n"

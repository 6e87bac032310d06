"""A local "payments" HTTP server that counts side effects, for the effect fault-injection suite.

Endpoints (JSON bodies; ``label`` names the logical call, ``session/callId``):

* ``POST /start {label}``: a tool body started (counted per label: re-runs are visible);
* ``POST /pay {label, amount}`` with an ``Idempotency-Key`` header: applied once per key; a
  repeated key gets the stored response and applies nothing (as Stripe's API does);
* ``POST /transfer {label, amount, reference}``: applied on every request (no deduplication);
  ``GET /transfer?reference=R`` finds a transfer by its reference (what ``reconcile`` asks);
* ``POST /charge {label, amount}``: applied on every request (an irreversible effect);
* ``GET /balance``: a read, applies nothing;
* ``GET /counts``: ``{"started", "pay", "transfer", "charge"}``, each ``{label: count}`` of
  applied effects (``pay`` counts applications, not requests), and ``requests``.

Run it in a thread (:class:`PaymentsServer`) or as its own process (``python -m
tests.agent.payments PORT_FILE``: it writes its port to the file and serves until killed).
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit


class Ledger:
    """What the server applied, under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: Counter[str] = Counter()
        self.pay: Counter[str] = Counter()
        self.transfer: Counter[str] = Counter()
        self.charge: Counter[str] = Counter()
        self.by_key: dict[str, dict[str, Any]] = {}
        self.by_reference: dict[str, dict[str, Any]] = {}
        self.requests = 0
        self.next_id = 1

    def counts(self) -> dict[str, Any]:
        with self.lock:
            return {"started": dict(self.started), "pay": dict(self.pay),
                    "transfer": dict(self.transfer), "charge": dict(self.charge),
                    "requests": self.requests}

    def _new_id(self, prefix: str) -> str:
        ident = f"{prefix}_{self.next_id}"
        self.next_id += 1
        return ident

    def handle(self, method: str, path: str, headers: dict[str, str],
               body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        url = urlsplit(path)
        label = str(body.get("label", ""))
        if method == "GET" and url.path == "/counts":
            return 200, self.counts()
        with self.lock:
            self.requests += 1
            if method == "GET" and url.path == "/balance":
                return 200, {"balance": 1000 - sum(self.charge.values())}
            if method == "POST" and url.path == "/start":
                self.started[label] += 1
                return 200, {"ok": True}
            if method == "POST" and url.path == "/pay":
                key = headers.get("idempotency-key")
                if not key:
                    return 400, {"error": "Idempotency-Key header required"}
                stored = self.by_key.get(key)
                if stored is not None:
                    return 200, {**stored, "replayed": True}
                self.pay[label] += 1
                stored = {"id": self._new_id("pay"), "amount": body.get("amount")}
                self.by_key[key] = stored
                return 200, stored
            if method == "POST" and url.path == "/transfer":
                self.transfer[label] += 1
                reference = str(body.get("reference", ""))
                made = {"id": self._new_id("tr"), "amount": body.get("amount"),
                        "reference": reference}
                self.by_reference.setdefault(reference, made)
                return 200, made
            if method == "GET" and url.path == "/transfer":
                reference = parse_qs(url.query).get("reference", [""])[0]
                found = self.by_reference.get(reference)
                return (200, found) if found is not None else (404, {"error": "no transfer"})
            if method == "POST" and url.path == "/charge":
                self.charge[label] += 1
                return 200, {"id": self._new_id("ch"), "amount": body.get("amount")}
        return 404, {"error": f"no route {method} {url.path}"}


def _handler(ledger: Ledger) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _serve(self, method: str) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else {}
            status, answer = ledger.handle(method, self.path,
                                           {k.lower(): v for k, v in self.headers.items()},
                                           body)
            payload = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

    return Handler


class PaymentsServer:
    """The server in a thread of this process; use as a context manager."""

    def __init__(self) -> None:
        self.ledger = Ledger()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.ledger))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> PaymentsServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)


def main() -> None:
    ledger = Ledger()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(ledger))
    httpd.daemon_threads = True
    Path(sys.argv[1]).write_text(str(httpd.server_address[1]))
    httpd.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()

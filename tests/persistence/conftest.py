"""Fixtures for the persistence tests: one contract suite runs on every backend.

``store`` is a :class:`dsh.persistence.Persistence` over memory, raw JSONL, JSONL
with Zstandard, SQLite and PostgreSQL (a throw-away schema; skipped, loudly, only when no server
answers) (docs/stores.md#the-backend-contract).
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsh.persistence import Persistence, open_backend
from dsh.session import SessionStore
from dsh.testing import assistant, plain, user
from dsh.testing._stores import (
    BUNDLED_BACKENDS,
    inject_torn_tail,
    postgres_unreachable,
    temporary_postgres_url,
)
from dsh.testing._stores import store_url as _store_url
from tests.conftest import DSH_LOGS

__all__ = ["BACKENDS", "HAS_SQLITE", "HYPOTHESIS_EXAMPLES", "inject_torn_tail", "store_url",
           "stored_events", "turn", "wait_until", "writer_of"]

HAS_SQLITE = importlib.util.find_spec("dsh.persistence.sqlite._backend") is not None

BACKENDS = list(BUNDLED_BACKENDS)

HYPOTHESIS_EXAMPLES = int(os.environ.get("DSH_HYPOTHESIS_EXAMPLES", "25"))


# The throw-away PostgreSQL schema of the running test, keyed by its tmp_path, so a test can
# reopen "the same store" by URL.
_PG_URLS: dict[Path, str] = {}


def store_url(kind: str, tmp_path: Path) -> str:
    """The URL of this test's store of ``kind`` (PostgreSQL: its throw-away schema)."""
    return _store_url(kind, tmp_path, postgres=_PG_URLS.get(tmp_path))


@pytest.fixture(params=BACKENDS)
def backend_kind(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    kind: str = request.param
    if kind != "postgresql":
        yield kind
        return
    reason = postgres_unreachable()
    if reason is not None:
        pytest.skip(f"SKIPPED LOUDLY: {reason}")
    with temporary_postgres_url() as url:
        _PG_URLS[tmp_path] = url
        try:
            yield kind
        finally:
            del _PG_URLS[tmp_path]


@pytest.fixture
def store(backend_kind: str, tmp_path: Path) -> Iterator[Persistence]:
    persistence = Persistence(open_backend(store_url(backend_kind, tmp_path)))
    try:
        yield persistence
    finally:
        persistence.close()


@pytest.fixture(scope="session")
def dsh_logs() -> Path:
    return DSH_LOGS


def stored_events(persistence: Persistence, sid: str) -> list[dict[str, Any]]:
    """The stored events of ``sid``, read through a fresh read handle, as plain dicts."""
    with persistence.open(sid) as handle:
        return plain(handle.read().events)


def writer_of(persistence: Persistence, store: SessionStore, session: Any) -> Any:
    """The write-behind writer of a live ``session`` of ``store``."""
    return persistence.bind(store)._writers[id(session)]


def turn(session: Any, n: int) -> None:
    """Append one completed turn (six events) to ``session``."""
    session.append("turn/start", {"turn": n})
    session.append("step/start", {"turn": n, "step": 1})
    session.append("user/message", user(f"q{n}", f"u{n}"), surface_op="append")
    session.append("assistant/message", assistant(n, 1, f"a{n}", f"a{n}"), surface_op="append")
    session.append("step/end", {"turn": n, "step": 1})
    session.append("turn/end", {"turn": n, "reason": {"kind": "completed"}})


def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    """Wait (not a timed assertion: the bound only ends a hung test) until ``predicate()``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.005)

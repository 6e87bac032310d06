"""Fixtures for the persistence tests: one contract suite runs on every backend.

``store`` is a :class:`dsh.persistence.coordinator.Persistence` over memory, raw JSONL, JSONL
with Zstandard, and SQLite when ``dsh.persistence.sqlite`` imports (persistence spec §10.1).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsh.persistence import open_store
from dsh.persistence.coordinator import Persistence
from tests.conftest import DSH_LOGS

HAS_SQLITE = importlib.util.find_spec("dsh.persistence.sqlite") is not None

BACKENDS = ["memory", "jsonl", "jsonl-zstd", "sqlite"]

HYPOTHESIS_EXAMPLES = int(os.environ.get("DSH_HYPOTHESIS_EXAMPLES", "25"))


def store_url(kind: str, tmp_path: Path) -> str:
    if kind == "memory":
        return "memory:"
    if kind == "jsonl":
        return f"jsonl://{tmp_path}/jsonl"
    if kind == "jsonl-zstd":
        return f"jsonl+zstd://{tmp_path}/jsonl-zstd"
    return f"sqlite://{tmp_path}/store.db"


@pytest.fixture(params=BACKENDS)
def backend_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    if kind == "sqlite" and not HAS_SQLITE:
        pytest.skip("dsh.persistence.sqlite is not available yet")
    return kind


@pytest.fixture
def store(backend_kind: str, tmp_path: Path) -> Iterator[Persistence]:
    persistence = open_store(store_url(backend_kind, tmp_path))
    try:
        yield persistence
    finally:
        persistence.close()


def inject_torn_tail(persistence: Persistence, session_id: str) -> bool:
    """Leave a never-committed partial record after the log; False if the backend cannot."""
    backend: Any = persistence.backend
    if hasattr(backend, "inject_torn_tail"):
        backend.inject_torn_tail(session_id)
        return True
    path = getattr(backend, "locate", None)
    if path is None:
        return False
    with backend.open(session_id, "read") as handle:
        target = handle.path
    if str(target).endswith(".zstd"):
        import zstandard
        frame = zstandard.ZstdCompressor(write_checksum=True).compress(
            b'{"type":"turn/start","seq":999,"time":1,"data":{"turn":9}}\n')
        torn = frame[:-7]
    else:
        torn = b'{"type":"request/header","seq":'
    with open(target, "ab") as f:
        f.write(torn)
    return True


@pytest.fixture(scope="session")
def dsh_logs() -> Path:
    return DSH_LOGS

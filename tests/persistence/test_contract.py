"""The backend conformance suite (``dsh.testing.BackendContract``) on every bundled backend.

The ``store`` fixture of ``conftest.py`` runs each contract test on memory, JSONL, JSONL+zstd,
SQLite and PostgreSQL (docs/stores.md#the-backend-contract, docs/rules.md#persistence).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dsh.persistence import Persistence
from dsh.testing import BackendContract

pytestmark = pytest.mark.no_speedups


class TestBundledBackends(BackendContract):
    """Every bundled backend, through the parametrised ``store`` fixture of conftest."""

    @pytest.fixture
    def store(self, store: Persistence) -> Iterator[Persistence]:
        yield store

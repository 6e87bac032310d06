"""Fixtures for compaction tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import DSH_LOGS


@pytest.fixture(scope="session")
def dsh_logs() -> Path:
    return DSH_LOGS

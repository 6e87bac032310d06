"""Fixtures for compaction tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.compaction.builders import SHARED


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not (SHARED / "dsh-logs").is_dir():
        pytest.skip(f"REFERENCE DATA MISSING: {SHARED} has no dsh-logs (set DSH_SHARED)")
    return SHARED

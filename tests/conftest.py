"""Shared fixtures: where the reference data lives (``../shared`` beside the repo by default)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_path() -> Path:
    """The read-only reference folder: ``$DSH_SHARED`` or ``<repo>/../shared``."""
    return Path(os.environ.get("DSH_SHARED", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    path = shared_path()
    if not (path / "dsh-logs").is_dir():
        pytest.skip(f"reference data not found at {path} (set DSH_SHARED)")
    return path

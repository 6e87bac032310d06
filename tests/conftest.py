"""Shared fixtures: dsh-written logs and the third-party corpus in the repo, a private HOME."""

from __future__ import annotations

import os
import signal
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# A non-interactive shell starts background jobs with SIGINT ignored, and an ignored signal stays
# ignored across exec: the CLI children of the Ctrl+C tests would never see their SIGINT. A
# handler here is reset to the default in every child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

DSH_LOGS = REPO / "tests" / "fixtures" / "dsh-logs"
"""Logs and stores written by the real dsh, with its own answers in ``expected/`` (our own
generated data, kept in the repository so interop is tested on every clone)."""


CORPUS = REPO / "tests" / "corpus"
"""Third-party transcripts the tests read, kept in the repository under their licences
(``tests/corpus/NOTICE.md``; ``MANIFEST.json`` names each file's origin and licence)."""


def kept_bytes(churn: Callable[[int], None], first: int = 500, more: int = 3_000) -> int:
    """Bytes Python's allocator holds after ``first`` + ``more`` rounds of ``churn`` beyond
    what it held after ``first`` (tracemalloc): what a leak per round adds up to."""
    tracemalloc.start()
    try:
        churn(first)
        before = tracemalloc.take_snapshot()
        churn(more)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    return sum(stat.size_diff for stat in after.compare_to(before, "filename"))


def shared_path() -> Path:
    """The read-only reference folder outside the repository (``$DSH_SHARED`` or
    ``<repo>/../shared``): bench workloads and the peers' sources, never needed by a test
    that a fresh clone runs."""
    return Path(os.environ.get("DSH_SHARED", REPO.parent / "shared"))


@pytest.fixture(autouse=True)
def _private_home(tmp_path_factory: pytest.TempPathFactory,
                  monkeypatch: pytest.MonkeyPatch) -> None:
    # No test may see the machine's ~/.claude, ~/.codex or ~/.dsh: every test (and every
    # process it starts, which inherits os.environ) gets its own empty HOME and DSH_HOME.
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("DSH_HOME", str(home / ".dsh"))

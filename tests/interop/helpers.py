"""Shared helpers of the interop tests: where the corpus is, and facts read from imports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dsh.interop import ImportedSession

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "corpus"
"""Third-party transcripts kept in the repository (licences and notices: its NOTICE.md)."""
EXAMPLES = REPO / "src" / "dsh" / "examples" / "transcripts"


def corpus_dir() -> Path:
    if not (CORPUS / "MANIFEST.json").is_file():
        pytest.fail(f"the test corpus is missing from the repository ({CORPUS})")
    return CORPUS


def live(session: ImportedSession) -> list[dict[str, Any]]:
    return [e for e in session.events if not e.get("ignorable")]


def facts(session: ImportedSession) -> dict[str, Any]:
    """The facts the corpus tests pin, computed from an imported session's events."""
    ev = live(session)
    turn_ends = [e["data"]["reason"]["kind"] for e in ev if e["type"] == "turn/end"]
    turns = sum(1 for e in ev if e["type"] == "turn/start")
    return {
        "prompts": sum(1 for e in ev if e["type"] == "user/message"
                       and e["data"]["source"]["kind"] == "user"),
        "calls": sum(1 for e in ev if e["type"] == "tool/call"),
        "results": sum(1 for e in ev if e["type"] == "tool/result"
                       and not ((e["data"].get("meta") or {}).get("import") or {}).get(
                           "synthetic")),
        "compactions": sum(1 for e in ev if e["type"] == "compaction/start"),
        "children": len(session.children),
        "turns": turns,
        "open_last_turn": turns > len(turn_ends),
        "last_end": turn_ends[-1] if turn_ends and turns == len(turn_ends) else None,
    }

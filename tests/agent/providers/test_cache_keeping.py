"""Compaction that keeps the prompt cache, against a server that imitates prefix caching.

The agent compacts under pressure with its own model as summarizer (awaited on the event loop).
With ``keep_cache`` the summary request continues the last request (same tools and system, the
whole view, the instruction last) and the compaction keeps the longest head, so the provider's
cache serves >= 90 % of the input of every summary request and of the first request after it;
without it both are cache misses. ``dsh show --json`` reports the shares it logged.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.providers.cache_run import run_cache

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_compacting_twice_keeps_90_percent_of_the_input_cached(wire: str,
                                                                tmp_path: Path) -> None:
    run = run_cache(wire, tmp_path, keep_cache=True)
    assert len(run.compactions) >= 2
    for compaction in run.compactions:
        assert compaction["summaryShare"] >= 0.9, compaction
        assert compaction["nextShare"] >= 0.9, compaction
        # The summary request continues the last request: same tools and system, and all of
        # its messages but the newest step's.
        summary, following = compaction["summaryRequest"], compaction["nextRequest"]
        assert summary["tools"] == following["tools"] and summary["tools"] is not None
        assert summary["sharedMessages"] >= summary["messages"] - 4
        # The first request after it starts with the kept head, shared with the last request.
        assert following["sharedMessages"] >= following["messages"] - 2


def test_without_cache_keeping_the_summary_and_the_next_request_miss_the_cache(
        tmp_path: Path) -> None:
    run = run_cache("openai", tmp_path, keep_cache=False)
    assert len(run.compactions) >= 2
    for compaction in run.compactions:
        assert compaction["summaryShare"] == 0.0  # the span alone, without tools or system
        assert compaction["nextShare"] < 0.2  # only what precedes the replaced head


def test_dsh_show_reports_the_cached_share_of_each_request_and_compaction(
        tmp_path: Path) -> None:
    run_cache("anthropic", tmp_path, keep_cache=True, turns=34)
    url = f"sqlite:///{tmp_path}/anthropic-True.db"
    done = subprocess.run([sys.executable, "-m", "dsh.cli", "show", "cache", "--store", url,
                           "--json"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout)["items"]
    checkpoints = [i for i in items if i["kind"] == "checkpoint"]
    answers = [i for i in items if i["kind"] == "message" and i["role"] == "assistant"]
    assert checkpoints and all(c["summaryCachedShare"] >= 0.9 for c in checkpoints)
    assert all(set(c["summaryRequest"]) == {"tools", "system", "messages", "prefix",
                                            "sharedMessages"} for c in checkpoints)
    assert all(isinstance(a["cachedShare"], float) for a in answers)
    text = subprocess.run([sys.executable, "-m", "dsh.cli", "show", "cache", "--store", url],
                          cwd=REPO, capture_output=True, text=True, timeout=120).stdout
    assert "summary request: cache 9" in text and "input tokens" in text

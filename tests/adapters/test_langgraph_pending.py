"""DshSaver: a call answered by a checkpoint's pending writes gets no second answer from dsh."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("langgraph.checkpoint.base")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import empty_checkpoint

from dsh.adapters.langgraph import DshSaver


def test_a_call_the_pending_writes_answer_is_not_answered_again(tmp_path: Path) -> None:
    """A process dies after a tools task's writes are stored and before LangGraph puts the
    next checkpoint: on resume LangGraph applies those writes, so the checkpoint's messages
    must not also get dsh's copy of that result (docs/adapters.md). Before: the next request
    held the tool result twice (seen in tests/adapters/test_kill_runs.py, 'between calls')."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    call = {"id": "c1", "name": "read_file", "args": {"path": "app.toml"}}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"messages": [
        HumanMessage("Read app.toml", id="h1"), AIMessage("", tool_calls=[call], id="a1")]}
    checkpoint["channel_versions"] = {"messages": 1}
    with DshSaver.from_url(url) as saver:
        stored = saver.put(config, checkpoint, {"source": "loop", "step": 1}, {"messages": 1})
        saver.put_writes(stored, [("messages", [ToolMessage(
            "contents of app.toml", tool_call_id="c1", id="t1")])], task_id="tools-task")
    with DshSaver.from_url(url) as saver:
        found = saver.get_tuple(config)
        assert found is not None
        messages = found.checkpoint["channel_values"]["messages"]
        assert [m.id for m in messages] == ["h1", "a1"]
        assert [(task, channel, [m.id for m in value]) for task, channel, value
                in found.pending_writes or []] == [("tools-task", "messages", ["t1"])]

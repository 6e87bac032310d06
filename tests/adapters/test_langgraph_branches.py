"""DshSaver branch edge cases and the messages it holds for checkpoints not yet put.

* ``update_state`` twice from the same earlier checkpoint makes two branches, each a dsh fork
  ``<thread>~<n>`` of the thread's session with its own conversation; a fork of a branch is a
  fork of that branch's session (docs/adapters.md#time-travel-and-forks).
* ``list`` with ``before`` and ``filter`` sees every checkpoint of the thread, whichever branch
  it is on, as a fresh saver does.
* Messages written against a checkpoint LangGraph has not put yet are held until it is put;
  once a later checkpoint of the thread is put (LangGraph puts a run's checkpoints in the
  order it makes them) or the saver closes, they are no longer held, and never projected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint

from dsh.adapters.langgraph import DshSaver
from dsh.persistence import Persistence, open_backend
from tests.adapters.conftest import dsh, dsh_messages
from tests.adapters.test_langgraph_time_travel import _graph, _texts


def _two_turns(store: str, thread: str) -> tuple[Any, Any, Any]:
    """A saver on ``store``, its graph after turns "a" and "b", and the checkpoint after "a"."""
    saver = DshSaver.from_url(store)
    graph = _graph(saver)
    config: Any = {"configurable": {"thread_id": thread}}
    graph.invoke({"messages": [HumanMessage("a")]}, config)
    graph.invoke({"messages": [HumanMessage("b")]}, config)
    earlier = next(s for s in graph.get_state_history(config)
                   if _texts(s.values.get("messages", [])) == ["a", "answer to a"])
    return saver, graph, earlier


def _parents(store: str) -> dict[str, Any]:
    persistence = Persistence(open_backend(store))
    try:
        return {h["id"]: h.get("parentSession") for h in persistence.list_headers()}
    finally:
        persistence.close()


def test_two_updates_from_one_earlier_checkpoint_are_two_branches(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    config: Any = {"configurable": {"thread_id": "twice"}}
    saver, graph, earlier = _two_turns(store, config["configurable"]["thread_id"])
    with saver:
        first = graph.update_state(earlier.config, {"messages": [HumanMessage("x")]})
        graph.invoke({"messages": [HumanMessage("x2")]}, first)  # on the first branch
        second = graph.update_state(earlier.config, {"messages": [HumanMessage("y")]})
        graph.invoke({"messages": [HumanMessage("y2")]}, second)
        latest = _texts(graph.get_state(config).values["messages"])
        assert latest == ["a", "answer to a", "y", "y2", "answer to y2"]
        # a fork of the first branch, from its update
        on_first = next(s for s in graph.get_state_history(config)
                        if _texts(s.values.get("messages", [])) == ["a", "answer to a", "x"])
        graph.invoke({"messages": [HumanMessage("z")]}, on_first.config)
        history = [(s.config["configurable"]["checkpoint_id"], _texts(s.values["messages"]))
                   for s in graph.get_state_history(config) if "messages" in s.values]
    with DshSaver.from_url(store) as saver:  # a fresh saver reads every branch the same
        cold = _graph(saver)
        assert _texts(cold.get_state(config).values["messages"]) == [
            "a", "answer to a", "x", "z", "answer to z"]
        assert [(s.config["configurable"]["checkpoint_id"], _texts(s.values["messages"]))
                for s in cold.get_state_history(config) if "messages" in s.values] == history
    conversations = {sid: [m["content"] for m in dsh_messages(sid, store)]
                     for sid in ("twice", "twice~1", "twice~2", "twice~3")}
    assert conversations == {
        "twice": ["a", "answer to a", "b", "answer to b"],
        "twice~1": ["a", "answer to a", "x", "x2", "answer to x2"],
        "twice~2": ["a", "answer to a", "y", "y2", "answer to y2"],
        "twice~3": ["a", "answer to a", "x", "z", "answer to z"]}
    assert _parents(store) == {"twice": None, "twice~1": "twice", "twice~2": "twice",
                               "twice~3": "twice~1"}
    for sid in conversations:
        dsh("verify", sid, "--store", store)


def test_list_before_and_filter_see_every_branch(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    config: Any = {"configurable": {"thread_id": "listed"}}
    saver, graph, earlier = _two_turns(store, config["configurable"]["thread_id"])
    with saver:
        graph.invoke({"messages": [HumanMessage("c")]}, earlier.config)  # listed~1
        every = list(saver.list(config))
        ids = [t.config["configurable"]["checkpoint_id"] for t in every]
        assert ids == sorted(ids, reverse=True) and len(ids) == len(set(ids))
        texts = {t.config["configurable"]["checkpoint_id"]:
                 _texts(t.checkpoint["channel_values"].get("messages", [])) for t in every}
        # before: the checkpoints older than the branch's first, from both lines
        fork_input = next(cid for cid, t in texts.items() if t == ["a", "answer to a", "c"])
        older = [t.config["configurable"]["checkpoint_id"]
                 for t in saver.list(config, before={"configurable": {
                     "checkpoint_id": fork_input}})]
        assert older == [cid for cid in ids if cid < fork_input]
        assert ["a", "answer to a", "b", "answer to b"] in [texts[cid] for cid in older]
        # filter on metadata: the loop checkpoints of both lines, newest first
        answered = {"source": "loop"}
        loops = [(t.config["configurable"]["checkpoint_id"],
                  _texts(t.checkpoint["channel_values"].get("messages", [])))
                 for t in saver.list(config, filter=answered)]
        assert [cid for cid, _ in loops] == [
            t.config["configurable"]["checkpoint_id"] for t in every
            if t.metadata.get("source") == "loop"]
        assert {"a|answer to a|c|answer to c", "a|answer to a|b|answer to b"} <= {
            "|".join(m) for _, m in loops}
        assert [_texts(t.checkpoint["channel_values"]["messages"])
                for t in saver.list(config, filter=answered, limit=1, before={
                    "configurable": {"checkpoint_id": fork_input}})] == [
            ["a", "answer to a", "b", "answer to b"]]
    with DshSaver.from_url(store) as saver:  # a fresh saver lists the same
        assert [t.config["configurable"]["checkpoint_id"] for t in saver.list(config)] == ids
        assert [(t.config["configurable"]["checkpoint_id"],
                 _texts(t.checkpoint["channel_values"].get("messages", [])))
                for t in saver.list(config, filter=answered)] == loops
        assert [t.config["configurable"]["thread_id"] for t in saver.list(None)] \
            == ["listed"] * len(ids)  # the branch session is not a thread of its own


def _put(saver: DshSaver, thread: str, previous: Any, messages: list[Any],
         step: int) -> tuple[Any, Any]:
    checkpoint = create_checkpoint(previous or empty_checkpoint(), None, step)
    version = saver.get_next_version(None, None)
    checkpoint["channel_values"] = {"messages": messages}
    checkpoint["channel_versions"] = {"messages": version}
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": "", **(
        {"checkpoint_id": previous["id"]} if previous else {})}}
    stored = saver.put(config, checkpoint, {"source": "loop", "step": step, "parents": {}},
                       {"messages": version})
    return checkpoint, stored


def test_messages_held_for_a_checkpoint_never_put_are_dropped(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    hello = HumanMessage("hello", id="m-hello")
    lost = AIMessage("written against a checkpoint whose save failed", id="m-lost")
    with DshSaver.from_url(store) as saver:
        first, _ = _put(saver, "held", None, [hello], 0)
        never = create_checkpoint(first, None, 1)  # made, never put (its save failed)
        saver.put_writes({"configurable": {"thread_id": "held", "checkpoint_ns": "",
                                           "checkpoint_id": never["id"]}},
                         [("messages", [lost])], "task-1", "~model")
        assert ("held", never["id"]) in saver._deferred
        # the next run's first checkpoint: made after it, so the held messages never apply
        answer = AIMessage("a new run", id="m-new")
        _put(saver, "held", first, [hello, answer], 2)
        assert saver._deferred == {}
        # held messages of another checkpoint never put: gone when the saver closes
        later = create_checkpoint(first, None, 3)
        saver.put_writes({"configurable": {"thread_id": "held", "checkpoint_ns": "",
                                           "checkpoint_id": later["id"]}},
                         [("messages", [AIMessage("cut", id="m-cut")])], "task-3", "~model")
        assert list(saver._deferred) == [("held", later["id"])]
    assert saver._deferred == {}
    assert [m["content"] for m in dsh_messages("held", store)] == ["hello", "a new run"]
    with DshSaver.from_url(store) as saver:  # the writes stay in the log, as LangGraph's
        found = saver.get_tuple({"configurable": {"thread_id": "held"}})
        assert found is not None
        assert _texts(found.checkpoint["channel_values"]["messages"]) == ["hello", "a new run"]

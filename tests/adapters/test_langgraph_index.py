"""DshSaver's cold reads: the thread's index kept beside the log, and whole values every K.

A saver that has not written a thread starts from the index its writer kept beside the log
(docs/stores.md#asides) and folds only the events after it; a missing, stale, damaged or
foreign index is folded afresh from the log, and every read gives what a full fold gives
(docs/adapters.md#fast-reads-of-a-thread). The thread is a real LangGraph graph whose model is
LangChain's OpenAI client talking to a local Chat Completions server.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph

from dsh.adapters import langgraph as lg
from dsh.adapters.langgraph import CHECKPOINT_EVENT, WHOLE_EVERY, DshSaver
from dsh.persistence import Persistence, open_backend
from dsh.testing._stores import drop_schema, postgres_base_url, postgres_unreachable
from tests.adapters.conftest import dsh
from tests.adapters.test_docs_snippets import completion
from tests.agent.providers.servers import ScriptedServer

INDEX = "langgraph-index"


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'sessions.db'}"
        return
    yield from _postgresql()


@pytest.fixture
def pg_store() -> Iterator[str]:
    yield from _postgresql()


def _postgresql() -> Iterator[str]:
    """A throw-away schema's URL on the test server (dropped after)."""
    if postgres_unreachable() is not None:
        pytest.skip(f"SKIPPED LOUDLY: {postgres_unreachable()}")
    base = postgres_base_url()
    schema = f"saverfast_{uuid.uuid4().hex[:10]}"
    try:
        yield f"{base}{'&' if '?' in base else '?'}schema={schema}"
    finally:
        drop_schema(base, schema)


def _graph(saver: DshSaver, base_url: str) -> Any:
    model = ChatOpenAI(model="gpt-test", base_url=base_url, api_key="test", max_retries=0)

    def call(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", call)
    builder.add_edge(START, "model")
    return builder.compile(checkpointer=saver)


def _converse(store: str, thread: str, turns: int, first: int = 0) -> None:
    config: Any = {"configurable": {"thread_id": thread}}
    with ScriptedServer() as server, DshSaver.from_url(store) as saver:
        graph = _graph(saver, server.base_url)
        for n in range(first, first + turns):
            server.add(completion(f"answer {n}"))
            graph.invoke({"messages": [HumanMessage(f"question {n}")]}, config,
                         durability="sync")


def _plain(item: Any) -> Any:
    """A checkpoint tuple as comparable values (messages by type, id and content)."""
    if item is None:
        return None
    values = dict(item.checkpoint["channel_values"])
    values["messages"] = [(type(m).__name__, m.id, m.content)
                          for m in values.get("messages", [])]
    return (item.config, item.parent_config, item.metadata,
            {**item.checkpoint, "channel_values": values}, item.pending_writes)


def _reads(store: str, thread: str) -> tuple[Any, list[Any], int]:
    """Cold get_tuple and list(limit=10) of a new saver, and how many events it folded."""
    config: Any = {"configurable": {"thread_id": thread}}
    with DshSaver.from_url(store) as saver:
        latest = _plain(saver.get_tuple(config))
        listed = [_plain(t) for t in saver.list(config, limit=10)]
        state = saver._threads[thread]  # what the read folded
        return latest, listed, state.index.seen - state.start


def _aside(store: str, thread: str, data: bytes | None = None) -> bytes | None:
    persistence = Persistence(open_backend(store))
    try:
        if data is not None:
            persistence.write_aside(thread, INDEX, data)
        return persistence.read_aside(thread, INDEX)
    finally:
        persistence.close()


def _events(store: str, thread: str) -> list[Any]:
    persistence = Persistence(open_backend(store))
    try:
        return list(persistence.read(thread).events)
    finally:
        persistence.close()


def test_a_cold_read_starts_from_the_index_and_reads_what_a_full_fold_reads(
        store: str) -> None:
    turns = WHOLE_EVERY // 2 + 8  # three checkpoints a turn: past one whole-value period
    _converse(store, "long", turns)
    assert _aside(store, "long") is not None  # kept at close
    latest, listed, folded = _reads(store, "long")
    assert folded == 0  # the index covered every event
    assert len(latest[3]["channel_values"]["messages"]) == 2 * turns
    assert latest[3]["channel_values"]["messages"][-1][2] == f"answer {turns - 1}"
    assert len(listed) == 10 and listed[0] == latest
    # the same reads without the index: a full fold of the log
    _aside(store, "long", b"not an index")
    assert _reads(store, "long")[:2] == (latest, listed)
    # a rebuilt chain never reads more than WHOLE_EVERY deltas
    checkpoints = [e for e in _events(store, "long") if e["type"] == CHECKPOINT_EVENT]
    stored = {(e["data"]["versions"]["messages"]): e["data"]["values"]["messages"]
              for e in checkpoints if "messages" in e["data"]["values"]}
    longest = 0
    for value in stored.values():
        links = 0
        while "d" in value:
            links += 1
            value = stored[value["d"]]
        longest = max(longest, links)
    assert 0 < longest <= WHOLE_EVERY
    assert sum("d" not in v for v in stored.values()) >= 2  # whole values, more than the first
    dsh("verify", "long", "--store", store)


def test_a_stale_index_is_folded_on_and_a_foreign_or_damaged_one_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    _converse(store, "t", 4)
    _converse(store, "other", 2)
    old, foreign = _aside(store, "t"), _aside(store, "other")
    assert old is not None and foreign is not None
    _converse(store, "t", 3, first=4)  # a second writer; its close keeps a newer index
    fresh = _reads(store, "t")
    assert fresh[2] == 0
    _aside(store, "t", old)  # stale: covers a prefix of the log
    stale = _reads(store, "t")
    assert stale[:2] == fresh[:2] and stale[2] > 0  # only the events after it were folded
    for bad in (foreign, old.replace(b'"count":', b'"count":1'), b"{}", b"\x00garbage"):
        _aside(store, "t", bad)
        latest, listed, folded = _reads(store, "t")
        assert (latest, listed) == fresh[:2]
        assert folded == len(_events(store, "t"))  # the whole log, from the start
    # a reader that folds a long tail leaves its work beside the log for the next one
    monkeypatch.setattr(lg, "INDEX_EVERY", 8)
    _aside(store, "t", old)
    assert _reads(store, "t")[2] > 0
    assert _reads(store, "t")[2] == 0


def _damaged(aside: bytes, line: int, change: Any) -> bytes:
    """``aside`` with one of its two JSON lines (0 head, 1 whole) changed, anchor kept."""
    lines = aside.split(b"\n")
    body = orjson.loads(lines[line])
    change(body)
    lines[line] = orjson.dumps(body)
    return b"\n".join(lines)


def _latest_at(seq: int) -> Any:
    def change(body: dict[str, Any]) -> None:
        row = body["ns"][""]
        (row if isinstance(row[0], str) else row[-1])[1] = seq
    return change


def _first_blob(field: int, value: Any) -> Any:
    def change(body: dict[str, Any]) -> None:
        body["blobs"][0][field] = value
    return change


def _writes_at(seqs: list[Any]) -> Any:
    def change(body: dict[str, Any]) -> None:
        body["ns"][""][-1][3] = seqs
    return change


@pytest.mark.parametrize(("line", "change"), [
    (0, _latest_at(1)),  # the head's latest checkpoint at the first user message
    (0, _first_blob(3, -3)),  # a value at a negative seq (wraps round a list)
    (0, _first_blob(3, 2)),  # a value at an event that stores no value
    (1, _latest_at(1)),
    (1, _writes_at([1])),  # the latest checkpoint's writes at a message
    (1, _writes_at(["x"])),
    (1, _first_blob(1, "renamed")),  # a value the whole index lacks
], ids=["head-checkpoint", "head-negative", "head-value", "checkpoint", "writes",
        "writes-str", "missing-value"])
def test_an_index_naming_wrong_events_under_a_kept_anchor_is_refused_and_the_log_folded(
        store: str, line: int, change: Any, caplog: pytest.LogCaptureFixture) -> None:
    _converse(store, "t", 3)
    truth = _reads(store, "t")
    good = _aside(store, "t")
    assert good is not None and truth[2] == 0
    _aside(store, "t", _damaged(good, line, change))
    caplog.set_level("WARNING", logger="dsh.adapters.langgraph")
    latest, listed, folded = _reads(store, "t")
    assert (latest, listed) == truth[:2]  # what a full fold gives, not a bare KeyError
    assert folded == len(_events(store, "t"))
    assert "named a wrong event" in caplog.text


def test_a_writer_misled_by_the_index_beside_the_log_folds_it_afresh_and_appends_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The whole index a new writer reads names a wrong checkpoint event: the turn is stored."""
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    _converse(store, "t", 2)
    good = _aside(store, "t")
    assert good is not None
    _aside(store, "t", _damaged(good, 1, _latest_at(1)))  # the head stays right
    caplog.set_level("WARNING", logger="dsh.adapters.langgraph")
    _converse(store, "t", 1, first=2)  # was IndexMisledError out of put
    assert "named a wrong event" in caplog.text
    latest = _reads(store, "t")[0]
    assert [text for _, _, text in latest[3]["channel_values"]["messages"]] == [
        "question 0", "answer 0", "question 1", "answer 1", "question 2", "answer 2"]
    dsh("verify", "t", "--store", store)


def test_a_writer_keeps_the_index_as_it_goes(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    monkeypatch.setattr(lg, "INDEX_EVERY", 16)
    config: Any = {"configurable": {"thread_id": "live"}}
    with ScriptedServer() as server, DshSaver.from_url(store) as saver:
        graph = _graph(saver, server.base_url)
        for n in range(6):
            server.add(completion(f"answer {n}"))
            graph.invoke({"messages": [HumanMessage(f"question {n}")]}, config,
                         durability="sync")
        # before the writer closes: another process reads through the index it kept
        latest, _, folded = _reads(store, "live")
        assert 0 <= folded < 16 + 12  # at most the events of the last due point, one turn
        assert _plain(saver.get_tuple(config)) == latest


def test_erasing_a_thread_drops_its_index(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    _converse(store, "gone", 2)
    assert _aside(store, "gone") is not None
    with DshSaver.from_url(store, erase_on_delete=True) as saver:
        saver.delete_thread("gone")
    assert _aside(store, "gone") is None


def test_a_cold_get_tuple_on_postgresql_reads_its_events_in_one_call(
        pg_store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The index names the checkpoint's events and its delta chain: no page is read."""
    from dsh.persistence.postgres._backend import PostgresRangeSource
    store = pg_store
    turns = WHOLE_EVERY // 2 + 8
    _converse(store, "long", turns)
    calls: dict[str, list[Any]] = {"read": [], "read_events": []}
    for name in calls:
        real = getattr(PostgresRangeSource, name)

        def counted(self: Any, *args: Any, _real: Any = real, _name: str = name) -> Any:
            calls[_name].append(args)
            return _real(self, *args)
        monkeypatch.setattr(PostgresRangeSource, name, counted)
    config: Any = {"configurable": {"thread_id": "long"}}
    with DshSaver.from_url(store) as saver:
        latest = _plain(saver.get_tuple(config))
    assert calls["read"] == [] and len(calls["read_events"]) == 1
    picked = calls["read_events"][0][0]
    # the checkpoint, its writes, its chain down to a whole value (at most WHOLE_EVERY
    # links), the last surface nodes and the index's anchor event: a few dozen, not pages
    assert len(picked) <= WHOLE_EVERY + 12
    monkeypatch.undo()
    # the same tuple as a full fold of the log, and as the index of format 3 (one line, no
    # head) and 2 (without the links) an earlier dsh kept
    data = _aside(store, "long")
    assert data is not None
    _aside(store, "long", b"not an index")
    assert _reads(store, "long")[0] == latest
    body = orjson.loads(data.split(b"\n")[1])
    for version in (3, 2):
        body["v"] = version
        if version == 2:
            body["blobs"] = [row[:4] for row in body["blobs"]]
        _aside(store, "long", orjson.dumps(body))
        again = _reads(store, "long")
        assert again[0] == latest and again[2] == 0  # taken, not folded afresh


def test_a_cold_get_tuple_parses_the_index_head_and_the_whole_index_when_it_is_not_enough(
        store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/adapters.md#fast-reads-of-a-thread: the head (format 4's first line) answers the
    latest checkpoint, read alone (SQLite) or with the lookup (PostgreSQL); a tail it cannot
    take exactly (a drop) makes the read take the whole index, and every answer is what a full
    fold of the log gives."""
    from dsh.persistence._facade import Persistence

    read_aside = Persistence.read_aside
    asked: list[bool] = []  # per read of the aside: head only?

    def spy(self: Persistence, session_id: str, name: str, *, head: bool = False) -> Any:
        asked.append(head)
        return read_aside(self, session_id, name, head=head)

    monkeypatch.setattr(Persistence, "read_aside", spy)
    config: Any = {"configurable": {"thread_id": "h"}}
    _converse(store, "h", 5)
    data = _aside(store, "h")
    assert data is not None
    head, whole = data.split(b"\n")
    assert orjson.loads(head)["count"] == orjson.loads(whole)["count"]
    assert len(head) < len(whole)
    asked.clear()
    with DshSaver.from_url(store) as saver:
        latest = _plain(saver.get_tuple(config))
        assert saver._threads["h"].index.partial  # the head only
        assert asked == ([True] if store.startswith("sqlite") else [])  # never the whole
        listed = [_plain(t) for t in saver.list(config, limit=10)]
        assert not saver._threads["h"].index.partial  # list reads the whole index
    assert listed[0] == latest and len(latest[3]["channel_values"]["messages"]) == 10
    _aside(store, "h", b"not an index")
    assert _reads(store, "h")[0] == latest  # a full fold gives the same tuple
    # a stale index whose tail the head takes: two more turns, deltas on the head's value
    _converse(store, "h", 2, first=5)
    after = _aside(store, "h")
    _aside(store, "h", data)
    with DshSaver.from_url(store) as saver:
        grown = _plain(saver.get_tuple(config))
        thread = saver._threads["h"]
        assert thread.index.partial and thread.index.seen > thread.start  # folded the tail
    assert len(grown[3]["channel_values"]["messages"]) == 14
    _aside(store, "h", b"not an index")
    assert _reads(store, "h")[0] == grown
    # a tail holding a drop of the latest checkpoint (as delete_for_runs appends): the head
    # cannot say which is latest now, the whole index can
    assert after is not None
    newest = grown[0]["configurable"]["checkpoint_id"]
    _aside(store, "h", after)
    with DshSaver.from_url(store) as saver:
        saver._drop("h", lambda _thread, _ns, cid, _entry: cid != newest)
    _aside(store, "h", after)  # the index from before the drop: the drop is in the tail
    with DshSaver.from_url(store) as saver:
        kept = _plain(saver.get_tuple(config))
        assert not saver._threads["h"].index.partial
    assert kept is not None and kept[0]["configurable"]["checkpoint_id"] \
        == grown[1]["configurable"]["checkpoint_id"]  # the parent of the dropped one
    _aside(store, "h", b"not an index")
    assert _reads(store, "h")[0] == kept


@pytest.mark.parametrize(("line", "change"), [(1, _latest_at(1)), (1, _writes_at([1]))],
                         ids=["checkpoint", "writes"])
def test_alist_over_an_index_naming_wrong_events_folds_the_log_as_list_does(
        store: str, line: int, change: Any, caplog: pytest.LogCaptureFixture) -> None:
    # docs/adapters.md#fast-reads-of-a-thread: alist meets a misleading index as list does
    import asyncio

    _converse(store, "t", 3)
    truth = _reads(store, "t")
    good = _aside(store, "t")
    assert good is not None
    _aside(store, "t", _damaged(good, line, change))
    caplog.set_level("WARNING", logger="dsh.adapters.langgraph")
    config: Any = {"configurable": {"thread_id": "t"}}

    async def listed(saver: DshSaver) -> list[Any]:
        return [_plain(t) async for t in saver.alist(config, limit=10)]

    with DshSaver.from_url(store) as saver:
        assert asyncio.run(listed(saver)) == truth[1]
    assert "named a wrong event" in caplog.text


def test_delete_for_runs_and_prune_over_an_index_naming_wrong_events_fold_the_log(
        store: str, caplog: pytest.LogCaptureFixture) -> None:
    # docs/adapters.md#fast-reads-of-a-thread: the checkpoints they hide are chosen again on
    # the log folded afresh when the index misled (before: IndexMisledError, nothing hidden)
    with ScriptedServer() as server, DshSaver.from_url(store) as saver:
        graph = _graph(saver, server.base_url)
        for n in range(3):
            server.add(completion(f"answer {n}"))
            graph.invoke({"messages": [HumanMessage(f"question {n}")]},
                         {"configurable": {"thread_id": "t"}, "metadata": {"run_id": f"r{n}"}},
                         durability="sync")
    listed = _reads(store, "t")[1]
    assert [item[2]["run_id"] for item in listed] == ["r2"] * 3 + ["r1"] * 3 + ["r0"] * 3
    caplog.set_level("WARNING", logger="dsh.adapters.langgraph")
    for hide in ("delete_for_runs", "prune"):
        good = _aside(store, "t")
        assert good is not None
        _aside(store, "t", _damaged(good, 1, _latest_at(1)))  # the whole index's latest
        caplog.clear()
        with DshSaver.from_url(store) as saver:
            saver.delete_for_runs(["r1"]) if hide == "delete_for_runs" else saver.prune(["t"])
        # delete_for_runs reads each checkpoint's metadata through the index; prune chooses
        # by ids alone, so it meets no wrong event here, and hides the right ones
        assert ("named a wrong event" in caplog.text) == (hide == "delete_for_runs")
        good = _aside(store, "t")
        _aside(store, "t", b"not an index")  # what the log holds, read without any index
        kept = _reads(store, "t")[1]
        _aside(store, "t", good)
        if hide == "delete_for_runs":
            assert kept == [item for item in listed if item[2]["run_id"] != "r1"]
        else:
            assert kept == listed[:1]  # the newest checkpoint only
    dsh("verify", "t", "--store", store)

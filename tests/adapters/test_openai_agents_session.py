"""DshSession on its own: SQLiteSession's observable behaviour, lossless items, appended ops.

The behaviour cases mirror the SDK's own SQLiteSession tests (tests/memory/test_session.py and
tests/memory/test_session_limit.py in openai/openai-agents-python), written anew here with
DshSession in place of SQLiteSession, and run beside SQLiteSession where they compare.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import SQLiteSession
from agents.memory import Session, SessionSettings

from dsh._errors import AdapterError, SessionBusyError
from dsh.adapters._log import is_removal
from dsh.adapters.openai_agents import DshSession
from tests.adapters.conftest import dsh, dsh_events, dsh_messages

RICH_ITEMS: list[dict[str, Any]] = [
    {"role": "developer", "content": "Be terse."},
    {"type": "message", "role": "user",
     "content": [{"type": "input_text", "text": "look"},
                 {"type": "input_image", "image_url": "data:image/png;base64,AAAA",
                  "detail": "low"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}],
     "encrypted_content": "opaque=="},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "grep",
     "arguments": "{\"q\": \"x\"}", "status": "completed"},
    {"type": "web_search_call", "id": "ws_1", "status": "completed",
     "action": {"type": "search", "query": "dsh"}},
    {"type": "function_call_output", "call_id": "call_1",
     "output": [{"type": "input_text", "text": "a.py:1: x"}]},
    {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "Found it.", "annotations": [],
                  "logprobs": []}]},
    {"type": "item_reference", "id": "msg_0"},
    {"role": "user", "content": "Unicode: こんにちは 😊 Привет, quotes ' \" and DROP TABLE x;--",
     "extra_field": {"nested": [1, 2.5, True, None]}},
    {"role": "user", "content": "a lone surrogate \ud83d survives"},
]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'sessions.db'}"


@pytest.fixture(params=["sqlite", "jsonl"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    return f"jsonl:///{tmp_path / 'logs'}"


def test_implements_the_sdk_session_protocol(store: str) -> None:
    session = DshSession("proto", store)
    assert isinstance(session, Session)
    assert isinstance(session.session_settings, SessionSettings)
    assert session.session_settings.limit is None
    assert DshSession("s2", store, session_settings=SessionSettings(limit=5)) \
        .session_settings.limit == 5
    assert DshSession("s3", store, session_settings={"limit": 3}).session_settings.limit == 3
    session.close()


def test_items_come_back_field_for_field_beside_sqlite(store: str, tmp_path: Path) -> None:
    async def body() -> None:
        ours = DshSession("rich", store)
        theirs = SQLiteSession("rich", tmp_path / "sdk.db")
        for s in (ours, theirs):
            await s.add_items(RICH_ITEMS[:4])
            await s.add_items(RICH_ITEMS[4:])
        assert await ours.get_items() == await theirs.get_items() == RICH_ITEMS
        ours.close()
        # a fresh object (a new process would do the same) reads the stored log
        again = DshSession("rich", store)
        assert await again.get_items() == RICH_ITEMS
        assert await again.get_items(limit=3) == await theirs.get_items(limit=3)
        again.close()
        theirs.close()
    run(body())


def test_items_map_onto_core_events(tmp_path: Path) -> None:
    store = sqlite_url(tmp_path)

    async def body() -> None:
        session = DshSession("core", store, model="gpt-test")
        await session.add_items(RICH_ITEMS[:8])  # the last two are plain user messages
        session.close()
    run(body())
    types = [e["type"] for e in dsh_events("core", store)]
    assert types[:5] == ["turn/start", "step/start", "user/message", "user/message",
                         "assistant/message"]
    # one model response (reasoning, call, hosted search) is one assistant message, then the
    # dispatched call, then its result; the final answer is the next step
    assert types[5:] == ["tool/call", "tool/result", "step/end", "step/start",
                         "assistant/message", "step/end", "step/start", "user/message"]
    model_view = dsh_messages("core", store, "dsh")
    assert [m["role"] for m in model_view] == ["user", "user", "assistant", "user", "assistant",
                                               "user"]
    blocks = model_view[2]["content"]
    assert [b["type"] for b in blocks] == ["reasoning", "tool-call", "provider-raw"]
    assert blocks[1] == {"type": "tool-call", "id": "call_1", "name": "grep",
                         "arguments": "{\"q\": \"x\"}"}
    assert model_view[2]["source"]["model"] == "gpt-test"
    assert model_view[3]["content"][0]["toolCallId"] == "call_1"
    assert model_view[3]["content"][0]["content"] == [{"type": "text", "text": "a.py:1: x"}]


def test_pop_item_like_sqlite_and_appended(store: str, tmp_path: Path) -> None:
    items = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there!"},
             {"role": "user", "content": "How are you?"}]

    async def body() -> None:
        ours = DshSession("pop", store)
        theirs = SQLiteSession("pop", tmp_path / "sdk.db")
        for s in (ours, theirs):
            assert await s.pop_item() is None
            await s.add_items(items)
        events_before = ours._log.session.events[:]
        for _ in range(4):
            assert await ours.pop_item() == await theirs.pop_item()
            assert await ours.get_items() == await theirs.get_items()
        assert await ours.get_items() == []
        # the log kept every byte: the old events are unchanged; each pop is a surface
        # removal, so nothing popped reaches the model view any more
        after = ours._log.session.events
        assert tuple(after[:len(events_before)]) == tuple(events_before)
        removals = [e for e in after[len(events_before):] if is_removal(e)]
        assert [len(e["sourceEventSeqs"]) for e in removals] == [1, 1, 1]
        assert ours._log.session.derive_messages() == []
        ours.close()
        again = DshSession("pop", store)
        assert await again.get_items() == []
        await again.add_items([{"role": "user", "content": "after"}])
        assert await again.get_items() == [{"role": "user", "content": "after"}]
        again.close()
        theirs.close()
    run(body())


def test_pop_only_touches_its_session(tmp_path: Path) -> None:
    store = sqlite_url(tmp_path)

    async def body() -> None:
        one, two = DshSession("one", store), DshSession("two", store)
        await one.add_items([{"role": "user", "content": "Session 1 message"}])
        await two.add_items([{"role": "user", "content": "Session 2 message 1"},
                             {"role": "user", "content": "Session 2 message 2"}])
        assert (await two.pop_item() or {}).get("content") == "Session 2 message 2"
        assert [i["content"] for i in await one.get_items()] == ["Session 1 message"]
        assert [i["content"] for i in await two.get_items()] == ["Session 2 message 1"]
        one.close()
        two.close()
    run(body())


def test_limits_like_sqlite(store: str, tmp_path: Path) -> None:
    items = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Message {i}"}
             for i in range(6)]

    async def body() -> None:
        ours = DshSession("limit", store)
        theirs = SQLiteSession("limit", tmp_path / "sdk.db")
        for s in (ours, theirs):
            await s.add_items(items)
        for limit in (None, 0, 1, 2, 4, 6, 10):
            assert await ours.get_items(limit) == await theirs.get_items(limit), limit
        # a negative limit gives nothing, like limit=0 (the SDK's newer SQLiteSession and its
        # other backends; older SQLiteSession releases passed it to SQL's LIMIT: everything)
        assert await ours.get_items(0) == [] and await ours.get_items(-1) == []
        assert await ours.get_items(-5) == []
        assert [i["content"] for i in await ours.get_items(2)] == ["Message 4", "Message 5"]
        ours.close()
        theirs.close()
    run(body())


def test_settings_limit_and_explicit_limit_beats_it(store: str) -> None:
    async def body() -> None:
        session = DshSession("settings", store, session_settings=SessionSettings(limit=3))
        await session.add_items([{"role": "user", "content": f"Message {i}"} for i in range(10)])
        assert [i["content"] for i in await session.get_items()] == \
            ["Message 7", "Message 8", "Message 9"]
        assert [i["content"] for i in await session.get_items(limit=2)] == \
            ["Message 8", "Message 9"]
        assert len(await session.get_items(limit=100)) == 10
        assert await session.get_items(limit=0) == []
        session.close()
    run(body())


def test_a_limit_window_is_sqlite_sessions_and_the_model_view_keeps_pairs(
        store: str, tmp_path: Path) -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "a.py"}
    answer = {"role": "assistant", "content": "There is a.py."}
    items = [{"role": "user", "content": "ls"}, call, output, answer]

    async def body() -> None:
        session = DshSession("pairs", store)
        theirs = SQLiteSession("pairs", tmp_path / "sdk.db")
        await session.add_items(items)
        await theirs.add_items(items)
        # The latest 2 start with an output whose call is cut off, exactly as SQLiteSession
        # gives them: the SDK's Runner drops such an output from the model input.
        for limit in (2, 3):
            assert await session.get_items(limit=limit) == await theirs.get_items(limit=limit)
        assert await session.get_items(limit=2) == [output, answer]
        session.close()
        theirs.close()
    run(body())
    # dsh's own model view of the same session keeps the call with its result
    sent = dsh_messages("pairs", store, "dsh")
    calls = [b for m in sent for b in m["content"] if b.get("type") == "tool-call"]
    results = [b for m in sent for b in m["content"] if b.get("type") == "tool-result"]
    assert [c["id"] for c in calls] == [r["toolCallId"] for r in results] == ["c1"]


def test_clear_session_hides_items_and_keeps_the_log(store: str, tmp_path: Path) -> None:
    async def body() -> None:
        session = DshSession("clear", store)
        await session.add_items([{"role": "user", "content": "Hello"},
                                 {"role": "assistant", "content": "Hi there!"}])
        kept = session._log.session.seq
        await session.clear_session()
        assert await session.get_items() == []
        assert await session.pop_item() is None
        await session.add_items([{"role": "user", "content": "fresh"}])
        assert await session.get_items() == [{"role": "user", "content": "fresh"}]
        session.close()
        assert kept < len(dsh_events("clear", store))
    run(body())
    assert "Hello" in dsh("show", "clear", "--store", store)


def test_bad_batch_writes_nothing(store: str) -> None:
    async def body() -> None:
        session = DshSession("bad", store)
        await session.add_items([{"role": "user", "content": "ok"}])
        seq = session._log.session.seq
        for bad in ([{"role": "user", "content": "fine"}, "not an item"],
                    [{"role": "user", "content": float("nan")}],
                    [{"role": "user", "content": 2 ** 60}],
                    [{"type": "function_call", "call_id": "", "name": "x", "arguments": ""}],
                    [{"type": "function_call", "call_id": "d", "name": "x", "arguments": ""},
                     {"type": "function_call", "call_id": "d", "name": "y", "arguments": ""}]):
            with pytest.raises(AdapterError) as info:
                await session.add_items(bad)  # type: ignore[arg-type]
            assert info.value.code == "ADAPTER_ITEM"
            assert "nothing was written" in info.value.message
        assert session._log.session.seq == seq
        assert await session.get_items() == [{"role": "user", "content": "ok"}]
        with pytest.raises(AdapterError):
            await session.add_items({"role": "user"})  # type: ignore[arg-type]
        session.close()
        with pytest.raises(AdapterError) as closed:
            await session.add_items([{"role": "user", "content": "late"}])
        assert closed.value.code == "ADAPTER_CLOSED"
    run(body())
    with pytest.raises(AdapterError):
        DshSession("", store)


def test_concurrent_threads_with_their_own_loops(tmp_path: Path) -> None:
    session = DshSession("concurrent", sqlite_url(tmp_path))
    items = [{"role": "user", "content": f"Message {i}"} for i in range(10)]

    def add(item: dict[str, Any]) -> None:
        asyncio.run(session.add_items([item]))

    with concurrent.futures.ThreadPoolExecutor(max_workers=5) as pool:
        list(pool.map(add, items))
    got = run(session.get_items())
    assert sorted(i["content"] for i in got) == sorted(i["content"] for i in items)
    session.close()


def test_one_writer_across_objects(tmp_path: Path) -> None:
    store = sqlite_url(tmp_path)
    first = DshSession("busy", store)
    run(first.add_items([{"role": "user", "content": "mine"}]))
    second = DshSession("busy", store)
    # reads never take the write lock; a write waits, then names the holder
    assert run(second.get_items()) == [{"role": "user", "content": "mine"}]
    # the holder is this process (another object of it): named so, with what frees it, at
    # once (no wait frees it); before, it was called another process
    with pytest.raises(SessionBusyError, match=r"'busy' is being written by this process "
                       r"\(pid \d+ on .*; another handle or session object of this process "
                       r"holds it, which no wait frees: close it first$"):
        run(second.add_items([{"role": "user", "content": "theirs"}]))
    first.close()
    run(second.add_items([{"role": "user", "content": "theirs"}]))
    assert [i["content"] for i in run(second.get_items())] == ["mine", "theirs"]
    second.close()


def test_each_call_is_durable_on_return_and_no_writer_thread_runs(store: str) -> None:
    # WriteBehind.flush_only: every call that appends ends with its flush, on the caller's
    # side; another reader sees each change as soon as the call returns
    import threading

    def writer_threads() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name == "dsh-write-behind:durable"]

    session = DshSession("durable", store)
    run(session.add_items([{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]))
    assert writer_threads() == []
    reader = DshSession("durable", store)
    assert [i["content"] for i in run(reader.get_items())] == ["one", "two"]
    reader.close()
    assert run(session.pop_item()) == {"role": "user", "content": "two"}
    reader = DshSession("durable", store)
    assert [i["content"] for i in run(reader.get_items())] == ["one"]
    reader.close()
    run(session.clear_session())
    reader = DshSession("durable", store)
    assert run(reader.get_items()) == []
    reader.close()
    assert writer_threads() == []
    session.close()


def test_objects_that_are_no_responses_item_are_kept_opaque(store: str) -> None:
    # what the SDK's EncryptedSession hands the session it wraps, as SQLiteSession keeps it
    envelope = {"__enc__": 1, "v": 1, "kid": "hkdf-v1", "payload": "gAAAAABr"}

    async def body() -> None:
        session = DshSession("opaque", store)
        await session.add_items([{"role": "user", "content": "hi"}, envelope])
        assert await session.get_items() == [{"role": "user", "content": "hi"}, envelope]
        kinds = [(e["type"], e["data"].get("source", {}).get("form"))
                 for e in session._log.session.events if e["type"] == "user/message"]
        assert kinds == [("user/message", None), ("user/message", "opaque")]
        assert await session.pop_item() == envelope
        session.close()
    run(body())


def count_page_ins(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the SQLite page-ins from now on (``SqlitePrefixSource.read`` calls)."""
    from dsh.persistence.sqlite import _restore_point as sqlite_pages

    paged_in: list[int] = []
    page_read = sqlite_pages.SqlitePrefixSource.read

    def counted(self: Any, start: int, stop: int) -> Any:
        paged_in.append(stop - start)
        return page_read(self, start, stop)

    monkeypatch.setattr(sqlite_pages.SqlitePrefixSource, "read", counted)
    return paged_in


def test_a_session_with_a_restore_point_opens_reading_only_its_tail(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/adapters.md#busy-sessions-reads-and-names: get_items(limit) and the first write
    # of a fresh process read the log's end through its restore point, not the whole log
    from dsh.persistence import _restore_point as restore_point

    paged_in = count_page_ins(monkeypatch)
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    items = [item for n in range(1_200) for item in (
        {"role": "user", "content": f"q{n}"},
        {"type": "function_call", "call_id": f"c{n}", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": f"c{n}", "output": f"r{n}"},
        {"role": "assistant", "content": f"a{n}"})]

    async def body() -> None:
        first = DshSession("big", store)
        await first.add_items(items)
        await first.pop_item()  # a removal near the end: the tail walk must see it
        first.close()
        kept = items[:-1]
        used = restore_point.stats["used"]
        again = DshSession("big", store)
        assert await again.get_items(limit=3) == kept[-3:]  # a read: no resume, no lock
        assert sum(paged_in) <= 2 * 256
        await again.add_items([{"role": "user", "content": "more"}])  # the write resumes
        assert restore_point.stats["used"] == used + 1
        assert await again.get_items(limit=2) == [kept[-1], {"role": "user", "content": "more"}]
        assert sum(paged_in) <= 4 * 256  # of about 13,000 events
        assert await again.get_items() == [*kept, {"role": "user", "content": "more"}]
        again.close()
        third = DshSession("big", store)
        assert await third.get_items() == [*kept, {"role": "user", "content": "more"}]
        third.close()
    run(body())
    assert list((tmp_path / "sessions.db.dsh-checkpoints").iterdir())  # one was there to use


def _long_turns(first: int, count: int) -> list[dict[str, Any]]:
    return [item for n in range(first, first + count) for item in (
        {"role": "user", "content": f"q{n}"},
        {"type": "function_call", "call_id": f"c{n}", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": f"c{n}", "output": f"r{n}"},
        {"role": "assistant", "content": f"a{n}"})]


def c_reads(monkeypatch: pytest.MonkeyPatch, reader: str) -> list[int]:
    """Reads by the accelerator's ``read_rows`` (one entry per call); ``reader`` "python"
    turns it off (what a build whose SQLite exports no C API gets), "c" needs it."""
    from dsh.persistence.sqlite import _restore_point as sqlite_pages
    if reader == "python":
        monkeypatch.setattr(sqlite_pages, "c_reader", lambda: False)
    elif not sqlite_pages.c_reader():
        pytest.skip("the accelerator's SQLite reader is not available here")
    calls: list[int] = []
    real = sqlite_pages.c_read_rows

    def spy(*args: Any) -> Any:
        calls.append(1)
        return real(*args)  # type: ignore[misc]

    monkeypatch.setattr(sqlite_pages, "c_read_rows", spy if real is not None else None)
    return calls


@pytest.mark.parametrize("cut", ["accelerated", "accelerated without read_rows", "python",
                                 "none"])
def test_a_whole_history_read_selects_the_surface_and_equals_the_paged_walk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: str) -> None:
    # docs/adapters.md#busy-sessions-reads-and-names: a cold get_items() of a log with a
    # restore point reads its prefix once, decoding the surface nodes and the adapter's marks
    # only; what it returns is what the page-by-page walk returns (pops, a clear, items orjson
    # cannot encode, what dsh wrote itself), whether the records are cut from the rows' text
    # by the accelerator (its rows read through SQLite's C API or through sqlite3), by its
    # Python reference, or parsed with the whole row (none)
    from dsh.adapters import _log
    from dsh.adapters._records import RecordPicker, record_picker
    from dsh.persistence.sqlite import _restore_point as sqlite_pages

    class Declines(RecordPicker):
        """The Python picker that cuts nothing: every selected row is parsed whole."""

        __slots__ = ()

        def __call__(self, etype: str, text: str) -> None:
            return None

    def use_cut() -> list[int]:
        if cut in ("python", "none"):
            monkeypatch.setattr(_log, "record_picker", lambda fmt: (
                record_picker(fmt, accelerated=False) if cut == "python"
                else Declines(fmt, accelerated=False)))
        return c_reads(monkeypatch, "c" if cut == "accelerated" else "python")

    c_calls = use_cut()
    store = sqlite_url(tmp_path)

    async def fill() -> list[dict[str, Any]]:
        session = DshSession("long", store)
        await session.add_items(_long_turns(0, 300))
        await session.clear_session()
        await session.add_items([*RICH_ITEMS, *_long_turns(300, 900)])
        await session.pop_item()
        await session.add_items([{"role": "user", "content": "unanswered"},
                                 {"type": "function_call", "call_id": "open", "name": "f",
                                  "arguments": "{}"}])
        await session.add_items(_long_turns(1200, 100))
        session.close()
        return [*RICH_ITEMS, *_long_turns(300, 900)[:-1]]

    head = run(fill())
    assert list((tmp_path / "sessions.db.dsh-checkpoints").iterdir())

    paged_in = count_page_ins(monkeypatch)

    async def read_all() -> list[Any]:
        session = DshSession("long", store)
        items = await session.get_items()
        session.close()
        return items  # type: ignore[no-any-return]

    fast = run(read_all())
    assert bool(c_calls) == (cut == "accelerated")  # (ranges of 4,096 events)
    assert fast[:len(head)] == head
    assert fast[len(head):len(head) + 2] == [
        {"role": "user", "content": "unanswered"},
        {"type": "function_call", "call_id": "open", "name": "f", "arguments": "{}"}]
    # the call the next batch cut off: dsh answered it, the SDK never saw the answer
    assert fast[len(head) + 2:] == _long_turns(1200, 100)
    # pages of ~5,000 events were read by selection: what the walk still paged in is what
    # holds no record of the SDK's (the lone surrogate item, orjson cannot encode it)
    assert sum(paged_in) <= 2 * 256
    monkeypatch.setattr(sqlite_pages.SqlitePrefixSource, "read_selected",
                        lambda *args, **kwargs: None)  # the page-by-page walk
    assert run(read_all()) == fast
    assert sum(paged_in) > 10 * 256
    monkeypatch.undo()
    use_cut()

    async def read_last(limit: int) -> list[Any]:
        session = DshSession("long", store)
        items = await session.get_items(limit=limit)
        session.close()
        return items  # type: ignore[no-any-return]

    # a cold get_items(limit) selects the last `limit` nodes' range the same way, and pages
    # in what it still needs beyond them (the popped item, the closed-early result, the
    # clear): the latest `limit` items of the whole read
    for limit in (1, 2, 3, 20, 402, 1_000, 5_000):
        paged_in = count_page_ins(monkeypatch)
        assert run(read_last(limit)) == fast[-limit:]
        if limit <= 20:
            assert paged_in == []
        monkeypatch.undo()
        use_cut()


def test_a_whole_history_read_of_one_item_per_node_skips_the_walk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/adapters.md#busy-sessions-reads-and-names: nothing popped, cleared or superseded
    # and one SDK item per model-view event: the items come from one parse of their texts
    # (_whole_view), equal to the page-by-page walk's; a store where something was popped
    # goes the walk's way
    from dsh.adapters import _log
    from dsh.persistence.sqlite import _restore_point as sqlite_pages

    store = sqlite_url(tmp_path)
    turns = _long_turns(0, 1300)

    async def fill(session_id: str, pop: bool) -> None:
        session = DshSession(session_id, store)
        for first in range(0, len(turns), 400):
            await session.add_items(turns[first:first + 400])
        if pop:
            await session.pop_item()
        session.close()

    async def read_all(session_id: str) -> list[Any]:
        session = DshSession(session_id, store)
        items = await session.get_items()
        session.close()
        return items  # type: ignore[no-any-return]

    run(fill("plain", pop=False))
    run(fill("popped", pop=True))
    answers: list[bool] = []
    whole_view = _log._whole_view

    def spy(*args: Any) -> Any:
        found = whole_view(*args)
        answers.append(found is not None)
        return found

    monkeypatch.setattr(_log, "_whole_view", spy)
    assert run(read_all("plain")) == turns
    assert run(read_all("popped")) == turns[:-1]
    assert answers == [True, False]
    monkeypatch.setattr(sqlite_pages.SqlitePrefixSource, "read_selected",
                        lambda *args, **kwargs: None)  # the page-by-page walk
    assert run(read_all("plain")) == turns
    assert answers == [True, False, False]  # (no selection: the marks are not all taken in)


def test_texts_are_parsed_part_by_part_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # a read parses its records LOADS_TEXTS at a time (what one parse holds stays bounded):
    # every part boundary keeps the order and the values, the texts are left as they were
    from dsh.adapters import _log

    monkeypatch.setattr(_log, "LOADS_TEXTS", 3)
    for count in (0, 1, 2, 3, 4, 6, 7):
        texts = [b'{"n":%d}' % n for n in range(count)]
        kept = list(texts)
        assert _log._loads_texts(texts) == [{"n": n} for n in range(count)]
        assert texts == kept


@pytest.mark.parametrize("reader", ["c", "python"])
@pytest.mark.parametrize("change", [
    "UPDATE events SET data = replace(data, 'q3\"', 'x3\"') WHERE seq < 100 "
    "AND data LIKE '%q3\"%'",
    # bytes that are no UTF-8 (sqlite3 refuses the row), in a row read and in one cut
    "UPDATE events SET data = CAST(x'7b22ff227d' AS TEXT) WHERE seq = 40",
    "UPDATE events SET data = CAST(data || x'ff' AS TEXT) WHERE seq < 100 "
    "AND type = 'user/message'",
    "UPDATE events SET surface_op = NULL WHERE seq = (SELECT min(seq) FROM events "
    "WHERE surface_op IS NOT NULL AND seq > 40)",
    "UPDATE events SET time = time + 1 WHERE seq = 42",
    "UPDATE events SET ignorable = 1 WHERE seq = 43",
    "DELETE FROM events WHERE seq = 44",
    "UPDATE events SET source_event_seqs = x'00' WHERE seq = 45"])
def test_a_whole_history_read_refuses_a_changed_row_before_the_cut(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str, change: str) -> None:
    # docs/rules.md#verified-page-in: the selective read checks every row against the seal,
    # whether it reads the rows through SQLite's C API (the accelerator's read_rows) or
    # through sqlite3
    import sqlite3
    from contextlib import closing

    from dsh._errors import LogCorruptError

    store = sqlite_url(tmp_path)
    c_calls = c_reads(monkeypatch, reader)

    async def fill() -> None:
        session = DshSession("long", store)
        for first in range(0, 1200, 100):
            await session.add_items(_long_turns(first, 100))
        session.close()

    run(fill())
    with closing(sqlite3.connect(tmp_path / "sessions.db")) as db, db:
        changed = db.execute(change).rowcount
    assert changed >= 1

    async def read(limit: int | None) -> list[Any]:
        session = DshSession("long", store)
        try:
            return await session.get_items(limit)  # type: ignore[no-any-return]
        finally:
            session.close()

    assert len(run(read(3))) == 3  # the tail: the changed row is never read
    with pytest.raises(LogCorruptError) as caught:
        run(read(None))
    assert caught.value.where["seq"] < 100 or "could not be paged in" in caught.value.message
    assert ("integrity seal" in caught.value.message) == ("CAST" not in change)
    assert bool(c_calls) == (reader == "c")


@pytest.mark.parametrize("reader", ["c", "python"])
def test_a_small_whole_history_reads_its_rows_in_c(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str) -> None:
    # 100 SDK items (275 events, a range below the old 1,024-event threshold): the cold
    # whole-history read steps, checks and cuts the rows in the accelerator's read_rows (a
    # fetch through sqlite3 cost twice its instructions there); the items are the same
    # either way
    store = sqlite_url(tmp_path)
    c_calls = c_reads(monkeypatch, reader)
    turns = _long_turns(0, 25)

    async def fill() -> None:
        session = DshSession("small", store)
        for first in range(0, len(turns), 40):
            await session.add_items(turns[first:first + 40])
        session.close()

    async def read() -> list[Any]:
        session = DshSession("small", store)
        try:
            return await session.get_items()  # type: ignore[no-any-return]
        finally:
            session.close()

    run(fill())
    assert run(read()) == turns
    assert len(c_calls) == (1 if reader == "c" else 0)


def _fill_closed(store: str, session_id: str) -> None:
    """A session written in batches and closed (its restore point then sits at its end)."""
    async def fill() -> None:
        session = DshSession(session_id, store)
        for first in range(0, 300, 100):
            await session.add_items(_long_turns(first, 100))
        session.close()
    run(fill())


def test_the_first_write_after_a_cold_read_pages_nothing_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The recorder finds the last turn by selecting turn brackets back from the end, and the
    # append's pairing check reads the last surface node alone: no 256-event page decoded.
    from dsh.session import PagedLog

    store = sqlite_url(tmp_path)
    _fill_closed(store, "s")

    async def body() -> None:
        session = DshSession("s", store)
        assert await session.get_items(limit=2) == _long_turns(299, 1)[-2:]
        paged_in = count_page_ins(monkeypatch)
        await session.add_items(_long_turns(300, 1))
        assert paged_in == []
        live = session._log.session
        assert isinstance(live._log, PagedLog)  # resumed through the restore point
        starts = [e["data"]["turn"] for e in live.events[live.first_live_seq:]
                  if e["type"] == "turn/start"]
        assert starts == [301]  # a prompt opens a turn: 300 before this one
        assert await session.get_items(limit=4) == _long_turns(300, 1)
        session.close()
    run(body())
    again = DshSession("s", store)
    assert run(again.get_items()) == _long_turns(0, 301)
    again.close()


@pytest.mark.parametrize("changed", ["a299", "q299"])
def test_the_first_write_refuses_a_row_changed_since_the_cold_read(
        tmp_path: Path, changed: str) -> None:
    # A row of the last batch, changed on disk between the read and the write, is caught by
    # the write's own checks (docs/rules.md#verified-page-in): the last surface node read
    # alone (the answer) or the turn brackets selected back from the end (their batch's
    # rows checked: the prompt); none of the new items is written.
    import sqlite3
    from contextlib import closing

    from dsh._errors import LogCorruptError

    store = sqlite_url(tmp_path)
    _fill_closed(store, "s")
    session = DshSession("s", store)
    assert len(run(session.get_items(limit=3))) == 3
    with closing(sqlite3.connect(tmp_path / "sessions.db")) as db, db:
        # the text with both its quotes: a random id may end in 'a299' too
        holding = db.execute(f"SELECT seq, type FROM events WHERE data LIKE '%\"{changed}\"%'"
                             ).fetchall()
        assert len(holding) == 1, holding
        assert db.execute(f"UPDATE events SET data = replace(data, '\"{changed}\"', "
                          f"'\"x{changed[1:]}\"') WHERE seq = ?", (holding[0][0],)
                          ).rowcount == 1
    with closing(sqlite3.connect(tmp_path / "sessions.db")) as db:
        rows = db.execute("SELECT seq, type, data FROM events ORDER BY seq").fetchall()
    with pytest.raises(LogCorruptError) as caught:
        run(session.add_items(_long_turns(300, 1)))
    assert "integrity seal" in caught.value.message
    session.close()
    with closing(sqlite3.connect(tmp_path / "sessions.db")) as db:
        # nothing more at all: not the new items, nor the resume's end-seed marker
        assert db.execute("SELECT seq, type, data FROM events ORDER BY seq").fetchall() == rows


@pytest.mark.parametrize("changed", ["a299", "q299"])
def test_the_first_write_refuses_a_row_changed_after_its_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, changed: str) -> None:
    # A row of the last batch changed by another connection after the write's resume read
    # PRAGMA data_version and before the write looks at the rows: the look checks them
    # against the seal (docs/rules.md#verified-page-in), whatever the cold read checked
    # before. (0a59433 took the cold read's checks over when data_version held at the
    # resume, so a row changed after it was read unchecked and the turn appended on it.)
    # add_items resumes in the transaction it appends in (the next test), so the resume
    # here is one that ends before the write: LiveLog.open() as a run hook opens it.
    import sqlite3
    from contextlib import closing

    from dsh._errors import LogCorruptError
    from dsh.persistence.sqlite._backend import SqliteHandle

    store = sqlite_url(tmp_path)
    _fill_closed(store, "s")
    session = DshSession("s", store)
    assert len(run(session.get_items(limit=3))) == 3
    real = SqliteHandle._load_tail

    def then_changed(self: SqliteHandle, restore_point: Any, **options: Any) -> Any:
        answer = real(self, restore_point, **options)
        if self._mode == "write":
            with closing(sqlite3.connect(tmp_path / "sessions.db")) as db, db:
                assert db.execute(f"UPDATE events SET data = replace(data, '\"{changed}\"', "
                                  f"'\"x{changed[1:]}\"') WHERE data LIKE '%\"{changed}\"%'"
                                  ).rowcount == 1
        return answer

    monkeypatch.setattr(SqliteHandle, "_load_tail", then_changed)
    with closing(sqlite3.connect(tmp_path / "sessions.db")) as db:
        before = db.execute("SELECT count(*) FROM events").fetchone()[0]
    session._log.open()
    with pytest.raises(LogCorruptError) as caught:
        run(session.add_items(_long_turns(300, 1)))
    assert "integrity seal" in caught.value.message
    session.close()
    with closing(sqlite3.connect(tmp_path / "sessions.db")) as db:
        assert db.execute("SELECT count(*) FROM events").fetchone()[0] == before


def test_the_first_write_resumes_in_the_transaction_it_appends_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/rules.md#resume: add_items' resume reads the session row, the tail and the seal
    # in the BEGIN IMMEDIATE its append commits, so no other connection can change a row
    # between the resume's checks (and the page-in's) and the append: a write tried there
    # is refused as locked, and the first write is one transaction.
    import sqlite3
    from contextlib import closing

    from dsh.persistence.sqlite._backend import SqliteHandle

    store = sqlite_url(tmp_path)
    _fill_closed(store, "s")
    statements: list[str] = []
    connect = sqlite3.connect

    def traced(database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(database, *args, **kwargs)
        conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(sqlite3, "connect", traced)
    session = DshSession("s", store)
    assert len(run(session.get_items(limit=3))) == 3
    monkeypatch.undo()
    real = SqliteHandle._load_tail
    refused: list[str] = []

    def then_try(self: SqliteHandle, restore_point: Any, **options: Any) -> Any:
        answer = real(self, restore_point, **options)
        if self._mode == "write":
            with closing(sqlite3.connect(tmp_path / "sessions.db", timeout=0)) as db:
                with pytest.raises(sqlite3.OperationalError) as locked:
                    db.execute("UPDATE events SET data = replace(data, '\"a299\"', "
                               "'\"x299\"') WHERE data LIKE '%\"a299\"%'")
                refused.append(str(locked.value))
        return answer

    monkeypatch.setattr(SqliteHandle, "_load_tail", then_try)
    statements.clear()
    run(session.add_items(_long_turns(300, 1)))
    assert refused == ["database is locked"]
    begun = [s for s in statements if s.startswith(("BEGIN", "COMMIT", "ROLLBACK"))]
    assert begun == ["BEGIN IMMEDIATE", "COMMIT"]
    session.close()
    again = DshSession("s", store)
    assert run(again.get_items()) == _long_turns(0, 301)
    again.close()


def test_a_big_first_write_does_not_hold_the_store_while_its_items_become_events(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/rules.md#resume: only a first write of a few items resumes in its append's
    # BEGIN IMMEDIATE; converting many items there held the store's write lock for every other
    # writer of the store (2,000 items: 3.3 s, 0.7 s of it the append). Before, the write
    # tried below, after the items became events and before the append, was refused as locked.
    import sqlite3
    from contextlib import closing

    from dsh.adapters import openai_agents

    store = sqlite_url(tmp_path)
    _fill_closed(store, "s")
    session = DshSession("s", store)
    assert len(run(session.get_items(limit=3))) == 3
    convert = openai_agents._append_items  # what add_items converts its items with
    tried: list[str] = []

    def then_try(*args: Any, **kwargs: Any) -> Any:
        answer = convert(*args, **kwargs)
        with closing(sqlite3.connect(tmp_path / "sessions.db", timeout=0)) as db:
            try:
                db.execute("BEGIN IMMEDIATE")
                db.execute("ROLLBACK")
                tried.append("written")
            except sqlite3.OperationalError as exc:
                tried.append(str(exc))
        return answer

    monkeypatch.setattr(openai_agents, "_append_items", then_try)
    many = _long_turns(300, openai_agents._HELD_RESUME_ITEMS + 1)
    run(session.add_items(many))
    assert tried == ["written"]
    session.close()
    again = DshSession("s", store)
    assert run(again.get_items()) == _long_turns(0, 300) + many
    again.close()


@pytest.mark.parametrize("read_first", [True, False], ids=["after a cold read", "no read"])
def test_the_first_write_opens_one_connection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_first: bool) -> None:
    # docs/formats.md#files-and-connections: after a cold read, the write's resume pages in the
    # events before its restore point's cut (its turn brackets, the last surface node) on the
    # connection its write handle took over from the read, not on a read-only one opened for
    # them; with no read, the store's lookup of whether the session is stored leaves its
    # validated connection idle and the write handle takes it over (before, the lookup
    # validated a shared connection of its own and the write handle a second one)
    import os

    store = sqlite_url(tmp_path)
    _fill_closed(store, "s")
    opened = _count_connects(monkeypatch)
    session = DshSession("s", store)
    if read_first:
        assert run(session.get_items(limit=3)) == _long_turns(299, 1)[1:]
    run(session.add_items(_long_turns(300, 1)))
    session.close()
    assert len(opened) == 1 and os.path.samefile(opened[0], tmp_path / "sessions.db")
    monkeypatch.undo()
    again = DshSession("s", store)
    assert run(again.get_items(limit=4)) == _long_turns(300, 1)
    again.close()


def test_a_cold_limited_read_pages_in_on_its_one_connection_and_refuses_a_changed_row(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/formats.md#files-and-connections: the page-in of a cold get_items(limit) runs on
    # the validated connection its read opened (one open of the file); docs/rules.md#
    # verified-page-in: the rows it pages in are still checked against the seal there
    import os
    import sqlite3
    from contextlib import closing

    from dsh._errors import LogCorruptError

    store = sqlite_url(tmp_path)

    async def fill() -> None:
        session = DshSession("cold", store)
        for first in range(0, 60, 20):
            await session.add_items(_long_turns(first, 20))
        session.close()  # a restore point at the end: the last items lie before its cut

    async def read(limit: int) -> list[Any]:
        session = DshSession("cold", store)
        try:
            return await session.get_items(limit)  # type: ignore[no-any-return]
        finally:
            session.close()

    run(fill())
    opened = _count_connects(monkeypatch)
    assert run(read(4)) == _long_turns(59, 1)
    # one connection, the validated one: no read-only page-in connection (a "file:" URI)
    assert len(opened) == 1 and os.path.samefile(opened[0], tmp_path / "sessions.db")
    monkeypatch.undo()
    with closing(sqlite3.connect(tmp_path / "sessions.db")) as db, db:
        last = db.execute("SELECT max(seq) FROM events").fetchone()[0]
        changed = db.execute("UPDATE events SET data = replace(data, 'a59', 'b59') "
                             "WHERE data LIKE '%a59%'").rowcount
    assert changed >= 1
    with pytest.raises(LogCorruptError) as caught:
        run(read(4))
    assert "integrity seal" in caught.value.message
    assert last - 256 < caught.value.where["seq"] <= last  # a record of the last batch


def _count_connects(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Patch ``sqlite3.connect`` to note each database it opens; the list grows."""
    import sqlite3

    opened: list[str] = []
    connect = sqlite3.connect

    def counting(database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        opened.append(str(database))
        return connect(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", counting)
    return opened


def _with_a_changed_row(tmp_path: Path, session_id: str, turns: int, changed: int
                        ) -> tuple[int, int]:
    """Store ``turns`` of :func:`_long_turns` (50 a batch) in ``tmp_path``'s SQLite store, then
    change on disk the row that holds ``q<changed>``; its seq and the store's row count."""
    import sqlite3
    from contextlib import closing

    async def fill() -> None:
        session = DshSession(session_id, sqlite_url(tmp_path))
        for first in range(0, turns, 50):
            await session.add_items(_long_turns(first, 50))
        session.close()

    run(fill())
    with closing(sqlite3.connect(tmp_path / "sessions.db")) as db, db:
        (seq,) = db.execute("SELECT seq FROM events WHERE data LIKE ?",
                            (f'%"q{changed}"%',)).fetchone()
        assert db.execute("UPDATE events SET data = replace(data, ?, ?) WHERE seq = ?",
                          (f'"q{changed}"', f'"x{changed}"', seq)).rowcount == 1
        (rows,) = db.execute("SELECT count(*) FROM events").fetchone()
    return seq, rows


@pytest.mark.parametrize(("reader", "limit"), [("c", None), ("python", None), ("c", 9000)])
def test_a_damaged_row_in_a_10k_item_session_is_named_and_refuses_the_next_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str, limit: int | None) -> None:
    # docs/rules.md#verified-page-in: a row in the middle of a 10k-item session, changed on
    # disk, is refused by the whole-history read (C or Python selection) and by a limited
    # read whose walk pages it in, as LogCorruptError naming the seal record's first seq;
    # the read notes the damage, so the next add_items on that session appends nothing
    import sqlite3
    from contextlib import closing

    from dsh._errors import LogCorruptError

    store = sqlite_url(tmp_path)
    c_reads(monkeypatch, reader)
    seq, rows = _with_a_changed_row(tmp_path, "big", 2500, 1250)  # 10,000 items, 200 a batch
    session = DshSession("big", store)
    assert len(run(session.get_items(limit=3))) == 3  # the tail: the changed row is not read
    with pytest.raises(LogCorruptError) as caught:
        run(session.get_items(limit))
    assert "integrity seal" in caught.value.message
    assert caught.value.where["seq"] <= seq < caught.value.where["seq"] + 256
    assert caught.value.where["session_id"] == "big"
    with pytest.raises(LogCorruptError) as refused:
        run(session.add_items(_long_turns(2500, 1)))
    assert refused.value.where["seq"] == caught.value.where["seq"]
    assert "not opened for writing" in refused.value.message
    session.close()
    with closing(sqlite3.connect(tmp_path / "sessions.db")) as db:
        assert db.execute("SELECT count(*) FROM events").fetchone() == (rows,)  # none added


def test_a_held_session_returns_fresh_items_its_caller_may_change(store: str) -> None:
    # docs/adapters.md#openai-agents-sdk: a held session's whole-history read parses its
    # cached texts (no walk); each call gives new containers, so a caller changing what it
    # was given (or what it handed to add_items) changes neither the log nor a later read
    turns = _long_turns(0, 3)

    async def body() -> None:
        session = DshSession("held", store)
        handed = [dict(item) for item in turns]
        await session.add_items(handed)
        handed[0]["content"] = "changed after add_items"
        handed.append({"role": "user", "content": "appended after add_items"})
        first = await session.get_items()
        assert first == turns
        first[0]["content"] = "changed by the caller"
        first[1]["arguments"] = "{\"rm\": true}"
        del first[2]["output"]
        first.append({"role": "user", "content": "injected"})
        second = await session.get_items()
        assert second == turns
        assert all(a is not b for a, b in zip(first, second, strict=False))
        events = [e for e in session._log.session.events if e["type"] == "user/message"]
        assert events[0]["data"]["content"] == [{"type": "text", "text": "q0"}]
        session.close()
        reopened = DshSession("held", store)
        assert await reopened.get_items() == turns
        reopened.close()
    run(body())


def test_a_held_sessions_whole_read_equals_the_walk_after_each_operation(store: str) -> None:
    # the no-walk read of a held session (LiveLog._live_texts) gives what the walk gives
    # (LiveLog._view, asked for through a limit beyond the history), and declines where the
    # walk is needed: a pop, a clear, several records in one event, a repair result
    from dsh.adapters import _log

    answers: list[bool] = []
    live_texts = _log.LiveLog._live_texts

    def spy(self: Any, *args: Any) -> Any:
        found = live_texts(self, *args)
        answers.append(found is not None)
        return found

    async def body() -> None:
        session = DshSession("walk", store)

        async def same() -> list[Any]:
            whole = await session.get_items()
            assert whole == await session.get_items(limit=10 ** 6)
            return whole  # type: ignore[no-any-return]

        await session.add_items(_long_turns(0, 2))
        assert await same() == _long_turns(0, 2)
        grouped = [{"type": "reasoning", "id": "rs_9", "summary": []},
                   {"type": "function_call", "call_id": "g1", "name": "f", "arguments": "{}"},
                   {"type": "function_call", "call_id": "g2", "name": "f", "arguments": "{}"}]
        await session.add_items([{"role": "user", "content": "go"}, *grouped])
        assert await same() == [*_long_turns(0, 2), {"role": "user", "content": "go"},
                                *grouped]  # the open calls are not answered yet
        await session.add_items([{"type": "function_call_output", "call_id": "g1",
                                  "output": "one"}])
        await session.add_items([{"role": "user", "content": "next"}])  # g2: closed early
        after = await same()
        assert {"type": "function_call_output", "call_id": "g2"} not in after
        assert after[-1] == {"role": "user", "content": "next"}
        await session.pop_item()
        assert (await same())[-1] == {"type": "function_call_output", "call_id": "g1",
                                      "output": "one"}
        await session.clear_session()
        assert await same() == []
        await session.add_items(_long_turns(5, 1))
        assert await same() == _long_turns(5, 1)
        session.close()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_log.LiveLog, "_live_texts", spy)
        run(body())
    assert answers[:2] == [True, True]  # the plain session and the grouped records: no walk
    assert False in answers  # closed early, popped, cleared: the walk


def test_a_held_sessions_whole_read_extends_its_kept_texts_until_a_replace(store: str) -> None:
    # LiveLog._live_texts keeps the texts of the last whole read and encodes only the nodes
    # appended since (a Runner turn's get_items() after its add_items); a replace (a pop)
    # rewrites positions, so the next read builds them afresh, still equal to the walk
    from dsh.adapters import _log

    encoded: list[int] = []
    encode = _log._encode

    def spy(record: Any) -> bytes | None:
        encoded.append(1)
        return encode(record)

    async def body() -> None:
        session = DshSession("kept", store)
        await session.add_items(_long_turns(0, 3))
        assert await session.get_items() == _long_turns(0, 3)
        kept = session._log._live
        assert kept is not None and kept[1] == 12 and kept[4]
        texts = kept[2]
        encoded.clear()
        for n in range(3, 6):  # as the SDK's Runner: the prompt, then the turn's items
            turn = _long_turns(n, 1)
            await session.add_items(turn[:1])
            await session.add_items(turn[1:])
            assert await session.get_items() == _long_turns(0, n + 1)
        assert len(encoded) == 12  # each new record once, none of the first 12 again
        kept = session._log._live
        assert kept is not None and kept[2] is texts and len(texts) == 24
        assert await session.pop_item() == _long_turns(5, 1)[-1]
        assert await session.get_items() == _long_turns(0, 6)[:-1] \
            == await session.get_items(limit=10 ** 6)
        kept = session._log._live
        assert kept is not None and kept[2] is not texts and len(kept[2]) == 23
        session.close()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_log, "_encode", spy)
        run(body())


def test_a_held_sessions_whole_read_runs_on_the_callers_thread_when_in_memory(store: str) -> None:
    # LiveLog.records_held: a held session's get_items() whose answer is its kept texts and
    # nodes this writer appended (nothing to read from storage, the lock free) is answered
    # without asyncio.to_thread, with what the worker's read gives (fresh containers each
    # call); anything else goes to the worker thread as before
    from dsh.adapters import openai_agents

    hops: list[str] = []
    to_thread = asyncio.to_thread

    def counting(func: Any, /, *args: Any, **kwargs: Any) -> Any:
        hops.append(func.__name__)
        return to_thread(func, *args, **kwargs)

    async def body() -> None:
        seeded = DshSession("held-read", store)
        await seeded.add_items(_long_turns(0, 2))
        seeded.close()
        hops.clear()
        session = DshSession("held-read", store)
        assert await session.get_items() == _long_turns(0, 2)  # before a write: the worker
        assert hops == ["_get_sync"]
        await session.add_items(_long_turns(2, 1))
        assert await session.get_items() == _long_turns(0, 3)  # the first held read builds
        assert hops == ["_get_sync", "_add_sync", "_get_sync"]  # its texts on the worker
        hops.clear()
        for n in range(3, 6):  # as the SDK's Runner: history, prompt, the turn's items
            turn = _long_turns(n, 1)
            first = await session.get_items()
            assert first == _long_turns(0, n)
            first[0]["content"] = "changed by the caller"
            first.append({"role": "user", "content": "injected"})
            assert await session.get_items() == _long_turns(0, n)
            await session.add_items(turn[:1])
            await session.add_items(turn[1:])
        assert hops == ["_add_sync"] * 6  # no read hopped
        assert await session.get_items(limit=3) == _long_turns(0, 6)[-3:]  # a limit: the worker
        assert hops[-1] == "_get_sync"
        log = session._log
        assert log.records_held(openai_agents._synthesized) == _long_turns(0, 6)
        assert log.records_held(openai_agents._synthesized, most=23) is None  # 24 records
        held = threading.Event()
        release = threading.Event()

        def writer() -> None:
            with log.lock:  # another thread inside a call (an add_items syncing, say)
                held.set()
                release.wait(10)

        thread = threading.Thread(target=writer)
        thread.start()
        held.wait(10)
        assert log.records_held(openai_agents._synthesized) is None  # does not wait for it
        release.set()
        thread.join()
        await session.pop_item()  # a replace: the next read walks, on the worker
        hops.clear()
        assert await session.get_items() == _long_turns(0, 6)[:-1]
        assert hops == ["_get_sync"]
        session.close()
        with pytest.raises(RuntimeError, match="closed"):
            await session.get_items()
        reopened = DshSession("held-read", store)
        assert await reopened.get_items() == _long_turns(0, 6)[:-1]
        reopened.close()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(openai_agents.asyncio, "to_thread", counting)
        run(body())


def test_add_items_stores_non_json_types_as_sqlite_session_does(store: str,
                                                                tmp_path: Path) -> None:
    # plain JSON items are checked and copied in one pass; anything else (a tuple, an enum
    # member, a non-string key) is stored as json.dumps makes it, as SQLiteSession stores it
    import enum

    class Role(enum.StrEnum):
        USER = "user"

    odd = [{"role": Role.USER, "content": "enum"},
           {"role": "user", "content": [{"type": "input_text", "text": "t"}], "pair": (1, 2),
            "keys": {1: "one"}},
           {"role": "user", "content": "float", "n": 1.5, "whole": 2.0}]

    async def body() -> None:
        ours = DshSession("odd", store)
        theirs = SQLiteSession("odd", tmp_path / "sdk.db")
        await ours.add_items(odd)  # type: ignore[arg-type]
        await theirs.add_items(odd)  # type: ignore[arg-type]
        got, expected = await ours.get_items(), await theirs.get_items()
        assert got[:2] == expected[:2] == [
            {"role": "user", "content": "enum"},
            {"role": "user", "content": [{"type": "input_text", "text": "t"}], "pair": [1, 2],
             "keys": {"1": "one"}}]
        assert got[2] == expected[2] == {"role": "user", "content": "float", "n": 1.5,
                                         "whole": 2}
        ours.close()
        theirs.close()
    run(body())


def _popped_store(tmp_path: Path) -> tuple[str, int, int]:
    """A SQLite store of session "s": three turns, the last item popped; ``(store URL, the
    pop's removal seq, the next seq)``."""
    import sqlite3
    from contextlib import closing

    store = sqlite_url(tmp_path)

    async def fill() -> None:
        session = DshSession("s", store)
        await session.add_items(_long_turns(0, 3))
        await session.pop_item()
        session.close()

    run(fill())
    with closing(sqlite3.connect(tmp_path / "sessions.db")) as db:
        removal, end = db.execute(
            "SELECT (SELECT seq FROM events WHERE data LIKE '%surface-removal%'), max(seq) + 1 "
            "FROM events").fetchone()
    return store, removal, end


@pytest.mark.parametrize("backwards", [False, True])
@pytest.mark.parametrize("restore_point", [True, False])
@pytest.mark.parametrize("limit", [None, 2])
def test_a_replace_of_no_surface_node_is_named_not_a_bare_value_error(
        tmp_path: Path, restore_point: bool, limit: int | None, backwards: bool) -> None:
    # docs/rules.md#the-read-pipeline: a row past the seal's end (read under the format's
    # rules) whose surface replace shadows a node no longer on the surface (here a copy of
    # the pop's removal) is refused by a cold read as the resume refuses it, LogCorruptError
    # naming the session and seq, not a ValueError out of the surface fold; nothing appended.
    # So is one whose end lies before its start on the surface (backwards: from the removal,
    # the last node, to the first), which gave a wrong surface
    import sqlite3
    from contextlib import closing

    from dsh._errors import LogCorruptError

    store, removal, end = _popped_store(tmp_path)
    if not restore_point:
        for point in tmp_path.glob("sessions.db.dsh-checkpoints/*"):
            point.unlink()
    with closing(sqlite3.connect(tmp_path / "sessions.db")) as db, db:
        first = db.execute("SELECT min(seq) FROM events WHERE surface_op = '\"append\"'"
                           ).fetchone()[0]
        op = f'{{"op":"replace","start":{removal},"end":{first}}}' if backwards else None
        db.execute("INSERT INTO events SELECT session_id, ?, type, time, data, "
                   "source_event_seqs, coalesce(?, surface_op), ignorable FROM events "
                   "WHERE seq = ?", (end, op, removal))
        rows = db.execute("SELECT count(*) FROM events").fetchone()
    session = DshSession("s", store)
    with pytest.raises(LogCorruptError) as caught:
        run(session.get_items(limit))
    assert caught.value.where["seq"] == end
    assert caught.value.where["session_id"] == "s"
    with pytest.raises(LogCorruptError):
        run(session.add_items(_long_turns(3, 1)))
    session.close()
    with closing(sqlite3.connect(tmp_path / "sessions.db")) as db:
        assert db.execute("SELECT count(*) FROM events").fetchone() == rows  # nothing appended


@pytest.mark.parametrize(("etype", "data", "ignorable", "op"), [
    ("openai-agents/pop", "{}", 1, None),  # no seq, no index: was a bare KeyError
    ("openai-agents/records", '{"seq": 2, "records": "abc"}', 1, None),  # not a list
    ("openai-agents/closed-early", '{"seqs": [true]}', 1, None),
    ("openai-agents/clear", '{"through": "9"}', 1, None),
    ("assistant/message", "7", None, "REMOVAL"),  # a replace whose data is no object
])
@pytest.mark.parametrize("limit", [None, 2])
def test_a_row_of_the_wrong_shape_past_the_seal_is_named_not_a_bare_error(
        tmp_path: Path, etype: str, data: str, ignorable: int | None, op: str | None,
        limit: int | None) -> None:
    # docs/rules.md#the-read-pipeline: a row another program appended after the seal's last
    # record is read under the format's rules; an adapter mark of a shape this adapter never
    # writes is LogCorruptError naming the session and seq (never a bare KeyError, nor records
    # taken from a string), and a replace whose data is no object is not read as a removal
    # (was AttributeError)
    import sqlite3
    from contextlib import closing

    from dsh._errors import LogCorruptError

    store, removal, end = _popped_store(tmp_path)
    with closing(sqlite3.connect(tmp_path / "sessions.db")) as db, db:
        # (the replace shadows the pop's removal, the last surface node)
        surface_op = (None if op is None
                      else f'{{"op":"replace","start":{removal},"end":{removal}}}')
        db.execute("INSERT INTO events VALUES ('s', ?, ?, 1, ?, NULL, ?, ?)",
                   (end, etype, data, surface_op, ignorable))
    session = DshSession("s", store)
    if op is None:
        with pytest.raises(LogCorruptError) as caught:
            run(session.get_items(limit))
        assert caught.value.where["seq"] == end and caught.value.where["session_id"] == "s"
        assert f"{etype} at seq {end} has no valid data." in caught.value.message
        # the damage the read found refuses the next write (docs/rules.md#verified-page-in)
        with pytest.raises(LogCorruptError) as refused:
            run(session.add_items(_long_turns(3, 1)))
        assert refused.value.where["seq"] == end and refused.value.code == caught.value.code
        with closing(sqlite3.connect(tmp_path / "sessions.db")) as db:
            assert db.execute("SELECT max(seq) FROM events").fetchone() == (end,)
    else:  # the replace holds no record: the model view has nothing for it
        assert run(session.get_items(limit)) == _long_turns(0, 3)[:-1][-(limit or 99):]
    session.close()


def test_a_live_session_whose_read_found_damage_closes_keeping_what_was_acknowledged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # docs/adapters.md (a page-in found damage) and docs/rules.md#verified-page-in: a session
    # resumed through its restore point writes a batch (acknowledged: add_items returned), then
    # a whole-history read pages in a row changed on disk and raises LogCorruptError; the next
    # add_items fails and appends nothing, and close() releases the session without raising,
    # logging a WARNING; every acknowledged item stays stored, nothing after the damage is
    import logging
    import sqlite3
    from contextlib import closing

    from dsh._errors import LogCorruptError, WriteFailedError

    store = sqlite_url(tmp_path)
    _, rows = _with_a_changed_row(tmp_path, "big", 400, 100)
    session = DshSession("big", store)
    run(session.add_items(_long_turns(400, 1)))  # acknowledged
    (acknowledged,) = [session._log.session.seq]
    assert acknowledged > rows
    with pytest.raises(LogCorruptError) as caught:
        run(session.get_items())
    assert caught.value.where["session_id"] == "big"
    with pytest.raises(WriteFailedError) as refused:
        run(session.add_items(_long_turns(401, 1)))
    assert isinstance(refused.value.__cause__, LogCorruptError)
    with caplog.at_level(logging.WARNING):
        session.close()  # does not raise the damage again
    warned = [r for r in caplog.records if r.levelno == logging.WARNING
              and r.name == "dsh.adapters._log"]
    assert len(warned) == 1
    assert "'big' closes without a flush" in warned[0].getMessage()
    with closing(sqlite3.connect(tmp_path / "sessions.db")) as db:
        assert db.execute("SELECT count(*), max(seq) FROM events").fetchone() == (
            acknowledged, acknowledged - 1)
    reopened = DshSession("big", store)
    assert run(reopened.get_items(limit=4)) == _long_turns(400, 1)  # the tail reads cleanly
    reopened.close()


def _fresh_modules(main: str, names: str, store: Path, then: str) -> list[str]:
    """Run ``main`` (an ``async def main()``) in a fresh interpreter: its output lines.

    After ``main``, the process prints which of ``names`` (a Python tuple expression) are
    loaded, opens ``p``, a Persistence on the SQLite ``store``, and runs ``then``.
    """
    import subprocess
    import sys

    code = ("import asyncio, os, sys\nfrom dsh.adapters.openai_agents import DshSession\n"
            f"{main}asyncio.run(main())\nnames = {names}\n"
            "print(sorted(m for m in names if m in sys.modules))\n"
            "from dsh.persistence import Persistence, open_backend\n"
            f"p = Persistence(open_backend('sqlite:///{store}'))\n{then}p.close()\n")
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True).stdout.split("\n")


def test_a_session_open_read_and_append_load_no_listing_salvage_or_filelock(
        tmp_path: Path) -> None:
    """The listing, the torn-tail salvage and ``filelock`` load when a store lists or repairs.

    A DshSession's open, reads and appends on a SQLite store never list sessions nor save a
    torn tail, and the write lock is ``fcntl.flock`` on POSIX (docs/adapters.md#memory).
    """
    store = tmp_path / "s.db"
    out = _fresh_modules(
        "async def main():\n"
        f"    s = DshSession('a', 'sqlite:///{store}')\n"
        "    await s.add_items([{'role': 'user', 'content': 'hi'}])\n"
        "    assert len(await s.get_items()) == 1 and len(await s.get_items(limit=1)) == 1\n"
        "    s.close()\n",
        "('dsh.persistence._listing', 'dsh.persistence.sqlite._listing', "
        "'dsh.persistence._salvage') + (('filelock',) if os.name == 'posix' else ())", store,
        "print([e.id for e in p.list_entries()[0]], 'dsh.persistence._listing' in sys.modules,"
        " 'dsh.persistence.sqlite._listing' in sys.modules)\n")
    assert out[:2] == ["[]", "['a'] True True"]


def test_a_resumed_session_loads_no_read_pipeline_or_chunk_codec(tmp_path: Path) -> None:
    """A resume from the restore point never runs the whole-log read pipeline nor the chunk codec.

    A second process opens a stored DshSession, reads it whole and by limit and appends: the
    read pipeline (``dsh.persistence._read``) and the chunk-run codec (``dsh.session._chunks``)
    stay unloaded, and both load, with the right answer, when the store reads the log whole
    (docs/adapters.md#memory).
    """
    store = tmp_path / "s.db"
    turns: list[dict[str, Any]] = []
    for n in range(3):  # whole turns: an unanswered prompt is closed by a repair at resume
        turns += [{"role": "user", "content": f"q{n}"},
                  {"type": "message", "id": f"m{n}", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": f"a{n}", "annotations": []}]}]
    first = DshSession("a", f"sqlite:///{store}")
    run(first.add_items(turns[:4]))
    first.close()
    out = _fresh_modules(
        "async def main():\n"
        f"    s = DshSession('a', 'sqlite:///{store}')\n"
        "    assert len(await s.get_items()) == 4 and len(await s.get_items(limit=2)) == 2\n"
        f"    await s.add_items({turns[4:]!r})\n"
        "    assert [i['id'] for i in await s.get_items(limit=1)] == ['m2']\n"
        "    s.close()\n",
        "('dsh.persistence._read', 'dsh.session._chunks')", store,
        "print(len(p.read('a').stored_events) > 6, sorted(m for m in names if m in sys.modules))\n")
    assert out[:2] == ["[]", "True ['dsh.persistence._read']"]

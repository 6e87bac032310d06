"""How DshSaver stores values its serde encodes, and its version ids (docs/formats.md).

A value that is not plain JSON is stored as the serde's type and its bytes as Latin-1 text
(``{"t", "l"}``), or past ``COMPRESS_FROM_BYTES`` as one Zstandard frame (``{"t", "z"}``,
checked when read); a thread written by an earlier build, whose values are base64 (``{"t",
"b"}``), still reads, and a writer continues it (a list delta on a base64 whole value).
Channel version ids carry a 16-decimal random tail, so no checkpoint event holds a digit run
the JSON readers take for a long integer.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint

from dsh import LogCorruptError
from dsh.adapters import langgraph as lg
from dsh.adapters.langgraph import CHECKPOINT_EVENT, WRITES_EVENT, DshSaver
from dsh.json import has_long_number
from dsh.testing._stores import postgres_unreachable, temporary_postgres_url
from tests.adapters.conftest import dsh
from tests.adapters.test_langgraph_index import _events


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'sessions.db'}"
        return
    if postgres_unreachable() is not None:
        pytest.skip(f"SKIPPED LOUDLY: {postgres_unreachable()}")
    with temporary_postgres_url() as url:
        yield url


def _base64_encode(self: Any, value: Any) -> dict[str, Any]:
    """The value encoding of builds before the Latin-1 text (kept here to write old threads)."""
    if lg._plain(value):
        return {"j": value}
    kind, blob = self.serde.dumps_typed(value)
    return {"t": kind, "b": base64.b64encode(blob).decode("ascii")}


def _turns(saver: DshSaver, thread: str, first: int, count: int,
           state: dict[str, Any]) -> None:
    """``count`` chat turns as LangGraph writes them: input checkpoint, model write, loop one."""

    def put(messages: list[Any], source: str, step: int) -> None:
        previous = state.get("checkpoint") or empty_checkpoint()
        version = saver.get_next_version(previous["channel_versions"].get("messages"), None)
        checkpoint = create_checkpoint(previous, None, step)
        checkpoint["channel_values"] = {"messages": messages, "blob": state["blob"]}
        checkpoint["channel_versions"] = {"messages": version, "blob": version}
        checkpoint["versions_seen"] = {"model": {"messages": version}}
        config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": "", **(
            {"checkpoint_id": previous["id"]} if state.get("checkpoint") else {})}}
        state["config"] = saver.put(config, checkpoint,
                                    {"source": source, "step": step, "parents": {}},
                                    {"messages": version, "blob": version})
        state["checkpoint"] = checkpoint

    for n in range(first, first + count):
        messages = [*state.get("messages", []), HumanMessage(f"question {n} \u00e9\u4e2d",
                                                             id=f"h{n}")]
        put(messages, "input", 2 * n)
        answer = AIMessage(f"answer {n}", id=f"a{n}")
        saver.put_writes(state["config"], [("messages", [answer]), ("blob", {1, n})],
                         f"task-{n}", "~model")
        state["messages"] = [*messages, answer]
        put(state["messages"], "loop", 2 * n + 1)


def _forms(events: list[Any]) -> list[str]:
    """Per serde-encoded value stored (checkpoint values, list items, writes): its form key."""
    forms: list[str] = []

    def note(stored: Any) -> None:
        if "t" in stored:
            [form] = set(stored) & {"l", "z", "b"}
            forms.append(form)

    for event in events:
        if event["type"] == CHECKPOINT_EVENT:
            for stored in event["data"]["values"].values():
                for item in stored.get("a", [stored]):
                    note(item)
        elif event["type"] == WRITES_EVENT:
            for _, _, stored in event["data"]["w"]:
                note(stored)
    return forms


def test_a_base64_thread_reads_and_a_writer_continues_it_in_latin1_text(
        store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    every_byte = bytes(range(256)) * 40  # 10 KiB: compressed by this build
    assert len(every_byte) > lg.COMPRESS_FROM_BYTES
    state: dict[str, Any] = {"blob": every_byte}
    with monkeypatch.context() as old_build:
        old_build.setattr(lg._Codec, "encode", _base64_encode)
        with DshSaver.from_url(store) as saver:
            _turns(saver, "t", 0, 3, state)
    old_forms = _forms(_events(store, "t"))
    assert old_forms and set(old_forms) == {"b"}
    config: Any = {"configurable": {"thread_id": "t"}}
    with DshSaver.from_url(store) as reader:  # a cold read of the old thread
        old = reader.get_tuple(config)
    assert old is not None
    assert [m.content for m in old.checkpoint["channel_values"]["messages"]][-2:] == [
        "question 2 \u00e9\u4e2d", "answer 2"]
    assert old.checkpoint["channel_values"]["blob"] == every_byte
    with DshSaver.from_url(store) as saver:  # this build writes on: deltas on a base64 value
        _turns(saver, "t", 3, 3, state)
    events = _events(store, "t")
    forms = _forms(events)
    assert forms[:len(old_forms)] == old_forms and set(forms[len(old_forms):]) == {"l", "z"}
    last = next(e for e in reversed(events) if e["type"] == CHECKPOINT_EVENT)
    assert "d" in last["data"]["values"]["messages"]  # a delta, the chain reaching old values
    with DshSaver.from_url(store) as reader:
        latest = reader.get_tuple(config)
        listed = list(reader.list(config))
    assert latest is not None
    messages = latest.checkpoint["channel_values"]["messages"]
    assert [(type(m).__name__, m.id) for m in messages] == [
        (kind, f"{kind[0].lower()}{n}") for n in range(6)
        for kind in ("HumanMessage", "AIMessage")]
    assert messages[-2].content == "question 5 \u00e9\u4e2d"
    assert latest.checkpoint["channel_values"]["blob"] == every_byte
    assert len(listed) == 12
    writes = {cp.config["configurable"]["checkpoint_id"]: cp.pending_writes for cp in listed}
    assert sorted(str(w) for ws in writes.values() for w in ws if w[1] == "blob") == sorted(
        str(("task-" + str(n), "blob", {1, n})) for n in range(6))
    dsh("verify", "t", "--store", store)


def test_every_byte_value_round_trips_through_the_latin1_text(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    values = [bytes(range(256)), b"", b"\x00", "\u00ff".encode("latin-1") * 9, b"\\\"\n\r",
              bytes(range(256)) * 64 + b"tail"]
    state: dict[str, Any] = {}
    with DshSaver.from_url(store) as saver:
        for value in values:
            state["blob"] = value
            _turns(saver, f"t{len(value)}-{value[:1]!r}", 0, 1, state)
            state.clear()
    for value in values:
        with DshSaver.from_url(store) as reader:
            found = reader.get_tuple({"configurable": {"thread_id":
                                                       f"t{len(value)}-{value[:1]!r}"}})
        assert found is not None and found.checkpoint["channel_values"]["blob"] == value
    stored = [e["data"]["values"]["blob"] for e in _events(store, "t256-b'\\x00'")
              if e["type"] == CHECKPOINT_EVENT]
    assert stored[0]["t"] == "bytes" and stored[0]["l"] == bytes(range(256)).decode("latin-1")
    [big] = [e["data"]["values"]["blob"] for e in _events(store, "t16388-b'\\x00'")
             if e["type"] == CHECKPOINT_EVENT][:1]
    assert set(big) == {"t", "z"} and len(big["z"]) < 1000  # 16 KiB of bytes, compressed


def test_a_compressed_value_is_checked_when_read() -> None:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    codec = lg._Codec(JsonPlusSerializer())
    value = bytes(range(256)) * 64
    stored = codec.encode(value)
    assert set(stored) == {"t", "z"} and codec.decode(stored) == value
    frame = base64.b64decode(stored["z"])
    # a frame that does not declare its size is inflated streamed, and checked the same way
    unsized = zstandard.ZstdCompressor(write_content_size=False, write_checksum=True)
    assert codec.decode({"t": "bytes", "z": base64.b64encode(
        unsized.compress(value)).decode()}) == value
    flipped = bytearray(frame)
    flipped[len(frame) // 2] ^= 0x40
    for bad in (bytes(flipped), frame[:-4] + b"\0\0\0\0", frame + b"x", frame + frame,
                frame[:-1], unsized.compress(value) + b"x"):
        with pytest.raises(LogCorruptError, match="stored compressed"):
            codec.decode({"t": "bytes", "z": base64.b64encode(bad).decode()})


def test_version_ids_hold_no_digit_run_read_as_a_long_integer(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    saver = DshSaver(f"sqlite:///{tmp_path / 'sessions.db'}")
    try:
        # repr(0.0005592311143512996) has 19 digits after the point
        monkeypatch.setattr(lg.random, "random", lambda: 0.0005592311143512996)
        first = saver.get_next_version(None, None)
        second = saver.get_next_version(first, None)
    finally:
        saver.close()
    assert first == f"{1:032}.0.0005592311143513"
    assert second > first and second.startswith(f"{2:032}.")
    assert not has_long_number(orjson.dumps({"versions": {"messages": first},
                                             "seen": {"model": {"messages": second}}}))
    # LangGraph's own form (repr of the float) has a 19-digit run after a '.': no integer's,
    # so it no longer takes the exact parser either (docs/formats.md#lossless-json)
    assert not has_long_number(orjson.dumps({"v": f"{1:032}.{0.0005592311143512996:016}"}))
    assert has_long_number(orjson.dumps({"v": 1234567890123456789}))


def test_a_whole_copy_ends_a_read_and_a_listing_reads_through_it(
        store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    state: dict[str, Any] = {"blob": b"x"}
    with DshSaver.from_url(store) as saver:
        _turns(saver, "t", 0, 20, state)  # 40 checkpoints: one chain of 39 deltas
    events = _events(store, "t")
    stored = [e["data"]["values"]["messages"] for e in events if e["type"] == CHECKPOINT_EVENT]
    assert "d" not in stored[0] and all("d" in value for value in stored[1:])
    copies = [n for n, value in enumerate(stored) if "d" in value and "t" in value]
    assert copies == [lg.WHOLE_COPY_EVERY, 2 * lg.WHOLE_COPY_EVERY]
    config: Any = {"configurable": {"thread_id": "t"}}
    if store.startswith("postgresql"):
        from dsh.persistence.postgres._backend import PostgresRangeSource
        picked: list[Any] = []
        real = PostgresRangeSource.read_events

        def counted(self: Any, seqs: Any) -> Any:
            picked.append(list(seqs))
            return real(self, seqs)
        monkeypatch.setattr(PostgresRangeSource, "read_events", counted)
    with DshSaver.from_url(store) as reader:
        latest = reader.get_tuple(config)
    if store.startswith("postgresql"):
        # the checkpoint, its writes, the deltas down to the copy at 32, the index's anchor
        # and the last surface nodes: not the chain down to the whole value at 0
        [seqs] = picked
        assert len(seqs) <= 40 - 2 * lg.WHOLE_COPY_EVERY + 6
        monkeypatch.undo()
    assert latest is not None
    assert [m.id for m in latest.checkpoint["channel_values"]["messages"]] == [
        f"{kind}{n}" for n in range(20) for kind in "ha"]
    with DshSaver.from_url(store) as reader:
        listed = list(reader.list(config))  # newest first, through the deltas
    assert len(listed) == 40
    for item in listed:  # each checkpoint alone (through a copy where one is on its chain)
        with DshSaver.from_url(store) as reader:
            alone = reader.get_tuple(item.config)
        assert alone is not None
        assert [(type(m).__name__, m.id, m.content) for m in
                alone.checkpoint["channel_values"]["messages"]] == [
            (type(m).__name__, m.id, m.content) for m in item.checkpoint["channel_values"][
                "messages"]]


def test_a_read_holds_off_older_collections_and_puts_the_thresholds_back(
        tmp_path: Path) -> None:
    # docs/adapters.md#fast-reads-of-a-thread: while a read builds its values the youngest
    # generation is collected as ever, the older ones not; the thresholds come back after
    import gc

    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    seen: list[tuple[int, ...]] = []

    class Watching(JsonPlusSerializer):
        def loads_typed(self, data: tuple[str, bytes]) -> Any:
            seen.append(gc.get_threshold())
            return super().loads_typed(data)

    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    state: dict[str, Any] = {"blob": b"\x00" * 10}
    with DshSaver.from_url(store) as saver:
        _turns(saver, "t", 0, 2, state)
    before = gc.get_threshold()
    gc.set_threshold(500, 7, 9)
    try:
        with DshSaver.from_url(store, serde=Watching()) as reader:
            found = reader.get_tuple({"configurable": {"thread_id": "t"}})
            assert found is not None and len(found.checkpoint["channel_values"]["messages"]) == 4
            assert seen and set(seen) == {(500, lg._HELD_THRESHOLD, lg._HELD_THRESHOLD)}
            assert gc.get_threshold() == (500, 7, 9)
            assert len(list(reader.list({"configurable": {"thread_id": "t"}}))) == 4
            assert gc.get_threshold() == (500, 7, 9)
        # nested holds (two savers' reads at once) put the thresholds back once, at the last
        with lg._no_collection():
            with lg._no_collection():
                pass
            assert gc.get_threshold() == (500, lg._HELD_THRESHOLD, lg._HELD_THRESHOLD)
            generations: list[int] = []

            def note(phase: str, info: dict[str, int]) -> None:
                if phase == "start":
                    generations.append(info["generation"])

            gc.callbacks.append(note)
            try:
                kept = [[n] for n in range(20_000)]  # containers: the youngest is collected
            finally:
                gc.callbacks.remove(note)
            assert kept and generations and set(generations) == {0}
        assert gc.get_threshold() == (500, 7, 9)
        # thresholds someone set meanwhile are theirs: not put back over
        with lg._no_collection():
            gc.set_threshold(900, 11, 12)
        assert gc.get_threshold() == (900, 11, 12)
        # the youngest's alone set meanwhile (gc.set_threshold(n) keeps the others, raised):
        # the older generations are still put back, the youngest's stays the program's
        with lg._no_collection():
            gc.set_threshold(800)
        assert gc.get_threshold() == (800, 11, 12)
        with lg._no_collection():
            gc.set_threshold(600, 5)
        assert gc.get_threshold() == (600, 5, 12)
    finally:
        gc.set_threshold(*before)

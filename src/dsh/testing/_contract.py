"""The backend conformance suite: the storage contract every dsh backend must keep.

dsh runs it on memory, JSONL, JSONL+zstd, SQLite and PostgreSQL; a backend for another
database runs the very same tests. Subclass :class:`BackendContract` in a pytest module and say
how to open a fresh store::

    import pytest
    from dsh.persistence import Persistence
    from dsh.testing import BackendContract

    class TestMyBackend(BackendContract):
        def make_store(self, tmp_path) -> Persistence:
            return Persistence(MyBackend(tmp_path / "db"))

        # optional: how your backend can hold a never-committed partial record
        def inject_torn_tail(self, store, session_id) -> bool:
            ...

Each test opens its own store and names the rule it covers (docs/stores.md#the-backend-contract,
docs/rules.md#persistence): round trip, suffix reads, header rules, duplicate ids, seq and
lossless JSON refusals with nothing written, atomic batches, exclusive writers naming the
holder, listing, crash repair of interrupted turns and tool calls, unknown types, foreign
format versions, torn tails in the backend's own form, and tailing without skip or repeat.
The suite needs pytest (the ``test`` extra); ``import dsh`` never imports it.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsh._errors import (
    ConfigError,
    EventRejectedError,
    InvalidJsonError,
    PersistenceError,
    SessionBusyError,
    SessionExistsError,
    SessionFormatUnsupportedError,
    SessionNotFoundError,
    UnknownEventTypeError,
)
from dsh.json import thaw
from dsh.persistence import Persistence
from dsh.session import Session
from dsh.testing import _stores as stores
from dsh.testing._logs import LogBuilder, header, make, plain


def _store_log(store: Persistence, builder: LogBuilder, sid: str = "s") -> None:
    store.create(header(sid))
    with store.open(sid, "write") as handle:
        handle.append(builder.events)
        handle.flush()


class BackendContract:
    """Base class of a backend's conformance tests; override :meth:`make_store`.

    pytest collects the ``test_*`` methods of every subclass named ``Test*``. The ``store``
    fixture opens one fresh store per test with :meth:`make_store` and closes it afterwards
    (then calls :meth:`cleanup`).
    """

    def make_store(self, tmp_path: Path) -> Persistence:
        """Open a new, empty store (``tmp_path``: a private folder for this test)."""
        raise NotImplementedError("a BackendContract subclass must implement make_store()")

    def cleanup(self, store: Persistence) -> None:
        """Called after the store is closed; drop databases or schemas here."""

    def inject_torn_tail(self, store: Persistence, session_id: str) -> bool:
        """Damage the session the way a crashed writer would; ``False`` skips those tests.

        The default knows the bundled backends (:func:`dsh.testing._stores.inject_torn_tail`).
        """
        return stores.inject_torn_tail(store, session_id)

    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[Persistence]:
        """A fresh store from :meth:`make_store`, closed after the test."""
        persistence = self.make_store(tmp_path)
        try:
            yield persistence
        finally:
            persistence.close()
            self.cleanup(persistence)

    def test_declared_capabilities_are_kept(self, store: Persistence) -> None:
        """Each capability the backend declares is implemented, and none is left undeclared.

        Rule: docs/stores.md#capabilities (the coordinator trusts the flags, never probes).
        """
        from dsh.persistence import (
            Capabilities,
            ChecksStorable,
            Fenced,
            IndexesSearch,
            InjectsTornTail,
            KeepsAsides,
            KeepsChain,
            KeepsCuts,
            KeepsRestorePoints,
            ListsEntries,
            Migrates,
            NamesFiles,
            ReadsRanges,
            ReadsWhole,
            RecordsAfterCommit,
            Reseals,
            Rewrites,
            SchemaVersioned,
            Scrubs,
            StampsChanges,
            Tails,
        )

        backend = store.backend
        caps = backend.capabilities
        assert isinstance(caps, Capabilities)
        assert caps.listing == isinstance(backend, ListsEntries)
        assert caps.saved_cuts == isinstance(backend, KeepsCuts)
        assert caps.native_tail == isinstance(backend, Tails)
        assert caps.search_index == isinstance(backend, IndexesSearch)
        assert caps.schema_version == isinstance(backend, SchemaVersioned)
        assert caps.migrations == isinstance(backend, Migrates)
        assert caps.storable_check == isinstance(backend, ChecksStorable)
        assert caps.torn_tail_hook == isinstance(backend, InjectsTornTail)
        assert caps.reseal == isinstance(backend, Reseals)
        assert caps.asides == isinstance(backend, KeepsAsides)
        assert caps.whole_reads == isinstance(backend, ReadsWhole)
        assert caps.chain_records == isinstance(backend, KeepsChain)
        assert caps.change_stamp == isinstance(backend, StampsChanges)
        store.create(header("caps"))
        with store.open("caps", "write") as handle:
            assert caps.restore_points == isinstance(handle, KeepsRestorePoints)
            assert caps.fenced == isinstance(handle, Fenced)
            assert caps.file_paths == isinstance(handle, NamesFiles)
            assert caps.ranges == isinstance(handle, ReadsRanges)
            assert caps.rewrites == isinstance(handle, Rewrites)
            assert caps.scrubs == isinstance(handle, Scrubs)
            assert caps.after_commit == isinstance(handle, RecordsAfterCommit)

    def test_round_trip_create_append_read(self, store: Persistence) -> None:
        """Round-trips a session: create + append -> load returns identical meta/events.

        Rule: docs/stores.md#the-backend-contract.
        """
        builder = LogBuilder()
        builder.completed_turn()
        _store_log(store, builder)
        with store.open("s") as handle:
            cold = handle.read()
        assert plain(cold.events) == plain(builder.events)
        assert cold.header["version"] == 0
        assert cold.header["id"] == "s"
        assert cold.header["cwd"] == "/workspace/demo-app"
        assert cold.torn is None
        loaded = store.load("s")
        assert plain(loaded.events) == plain(builder.events)
        assert loaded.closers == ()

    def test_read_offset_returns_suffix(self, store: Persistence) -> None:
        """ReadFrom returns exactly the stored suffix from the requested seq.

        Rule: docs/stores.md#the-backend-contract.
        """
        builder = LogBuilder()
        builder.completed_turn()
        _store_log(store, builder)
        with store.open("s") as handle:
            assert [e.seq for e in handle.read(3).events] == [3, 4, 5]
            assert handle.read(6).events == ()
            assert handle.read(100).events == ()
            with pytest.raises(ConfigError):
                handle.read(-1)

    def test_rejects_fractional_created_at_without_reserving_id(self, store: Persistence) -> None:
        """Rejects a fractional creation timestamp without reserving its session id.

        Rule: docs/stores.md#the-backend-contract.
        """
        with pytest.raises(EventRejectedError, match="createdAt"):
            store.create({"version": 0, "id": "s", "createdAt": 1.5})
        store.create({"version": 0, "id": "s", "createdAt": 2})
        assert store.exists("s")

    def test_create_rejects_duplicate_id(self, store: Persistence) -> None:
        """Create rejects a duplicate id (in memory and on a persisted log).

        Rule: docs/rules.md#persistence.
        """
        store.create(header("s"))
        with pytest.raises(SessionExistsError):
            store.create(header("s"))
        builder = LogBuilder()
        builder.completed_turn()
        with store.open("s", "write") as handle:
            handle.append(builder.events)
            handle.flush()
        with pytest.raises(SessionExistsError):
            store.create(header("s"))

    def test_open_missing_session_not_found(self, store: Persistence) -> None:
        """docs/rules.md#persistence 'load and inspect reject a missing session'."""
        with pytest.raises(SessionNotFoundError):
            store.open("nope")
        with pytest.raises(SessionNotFoundError):
            store.inspect("nope")
        with pytest.raises(SessionNotFoundError):
            store.load("nope")

    def test_append_rejects_restored_seq(self, store: Persistence) -> None:
        """Append rejects a batch whose first seq does not match the stored next-seq.

        Rule: docs/stores.md#the-backend-contract.
        """
        builder = LogBuilder()
        builder.completed_turn()
        _store_log(store, builder)
        with store.open("s", "write") as handle:
            with pytest.raises(PersistenceError):
                handle.append(builder.events[:6])
            assert len(handle.read().events) == 6

    def test_append_rejects_mid_batch_gap(self, store: Persistence) -> None:
        """docs/stores.md#the-backend-contract 'append rejects a mid-batch seq gap'."""
        store.create(header("s"))
        with store.open("s", "write") as handle:
            batch = [make("turn/start", 0, {"turn": 1}),
                     make("step/start", 2, {"turn": 1, "step": 1})]
            with pytest.raises(PersistenceError):
                handle.append(batch)
            assert handle.read().events == ()

    @pytest.mark.parametrize(("value", "path"), [
        (math.nan, "$[0].data.v"),
        (math.inf, "$[0].data.v"),
        (-math.inf, "$[0].data.v"),
        (9007199254740993, "$[0].data.v"),
        (-9007199254740993, "$[0].data.v"),
        ((1, 2), "$[0].data.v"),
        ({1, 2}, "$[0].data.v"),
        (b"x", "$[0].data.v"),
    ])
    def test_append_rejects_non_json_naming_field(self, store: Persistence, value: Any,
                                                           path: str) -> None:
        """Append rejects event data that is not lossless JSON, naming the field's path.

        Rule: docs/stores.md#the-backend-contract.
        """
        store.create(header("s"))
        event = make("turn/start", 0, {"turn": 1})
        bad = {**thaw(event), "data": {"turn": 1, "v": value}}
        with store.open("s", "write") as handle:
            with pytest.raises(InvalidJsonError) as info:
                handle.append([bad])  # type: ignore[list-item]
            assert info.value.where["json_path"] == path
            assert handle.read().events == ()

    def test_append_rejects_cycle(self, store: Persistence) -> None:
        """docs/stores.md#the-backend-contract '... cyclic object each reject'."""
        store.create(header("s"))
        data: dict[str, Any] = {"turn": 1}
        data["self"] = data
        with store.open("s", "write") as handle, pytest.raises(InvalidJsonError):
            handle.append([{"type": "turn/start", "seq": 0, "time": 1, "data": data}])  # type: ignore[list-item]

    def test_safe_integer_bounds_round_trip(self, store: Persistence) -> None:
        """docs/formats.md#lossless-json: ±(2^53-1) are lossless."""
        store.create(header("s"))
        event = make("todo/write", 0, {"todos": [], "big": 9007199254740991,
                                       "small": -9007199254740991})
        with store.open("s", "write") as handle:
            handle.append([event])
            handle.flush()
        with store.open("s") as handle:
            data = handle.read().events[0].data
        assert data["big"] == 9007199254740991
        assert data["small"] == -9007199254740991

    def test_read_handle_cannot_append(self, store: Persistence) -> None:
        """Contract: read handle cannot append."""
        store.create(header("s"))
        with store.open("s", "read") as handle, \
                pytest.raises(PersistenceError, match="read handle"):
            handle.append([make("turn/start", 0, {"turn": 1})])

    def test_second_writer_busy_in_threads(self, store: Persistence) -> None:
        """A write handle is exclusive; the second writer names the holder.

        Rule: docs/stores.md#the-backend-contract.
        """
        builder = LogBuilder()
        builder.completed_turn()
        _store_log(store, builder)
        first = store.open("s", "write")
        errors: list[BaseException] = []

        def second() -> None:
            try:
                store.open("s", "write").close()
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=second)
        thread.start()
        thread.join()
        assert len(errors) == 1 and isinstance(errors[0], SessionBusyError)
        assert "pid" in errors[0].where and "host" in errors[0].where and "since" in errors[0].where
        first.close()
        with store.open("s", "write") as again:
            assert len(again.read().events) == 6

    def test_list_excludes_zero_event_sessions(self, store: Persistence) -> None:
        """List() excludes a created-but-never-appended (zero-event) session.

        Rule: docs/stores.md#the-backend-contract.
        """
        store.create(header("empty"))
        builder = LogBuilder("full")
        builder.completed_turn("first prompt here")
        _store_log(store, builder, "full")
        summaries = store.list()
        assert [s.id for s in summaries] == ["full"]
        assert summaries[0].event_count == 6
        assert summaries[0].last_activity_ms == builder.events[-1].time
        assert summaries[0].title == "first prompt here"

    def test_crash_recovery_interrupted_turn(self, store: Persistence) -> None:
        """Crash recovery: load preserves an interrupted (unclosed) turn and closes it.

        Rule: docs/stores.md#the-backend-contract.
        """
        builder = LogBuilder()
        builder.completed_turn()
        builder.add("turn/start", {"turn": 2})
        builder.add("step/start", {"turn": 2, "step": 1})
        _store_log(store, builder)
        with store.open("s") as handle:
            before = handle.read().revision
        inspected = store.inspect("s")
        assert [e.type for e in inspected.closers] == ["step/end", "turn/end"]
        assert [e.seq for e in inspected.closers] == [8, 9]
        with store.open("s") as handle:
            cold = handle.read()
            assert cold.revision == before
            assert len(cold.events) == 8
        loaded = store.load("s")
        assert [e.seq for e in loaded.events] == list(range(10))
        assert loaded.events[-1].data["reason"] == {"kind": "interrupted"}
        assert loaded.events[-1].time == builder.events[-1].time
        with store.open("s") as handle:
            cold = handle.read()
            assert cold.revision != before
            assert len(cold.events) == 10
        again = store.load("s")
        assert again.closers == ()
        with store.open("s", "write") as handle:
            handle.append([make("turn/start", 10, {"turn": 3}, time=builder.events[-1].time)])
            handle.flush()
            assert handle.read(10).events[0].seq == 10

    def test_crash_recovery_unstarted_tool(self, store: Persistence) -> None:
        """An unstarted assistant tool request gets a retryable synthetic result.

        Rule: docs/stores.md#the-backend-contract.
        """
        builder = LogBuilder()
        builder.tool_call_turn("call_9", recorded=False)
        _store_log(store, builder)
        loaded = store.load("s")
        result, step_end, turn_end = loaded.closers
        assert result.type == "tool/result"
        assert result.data["message"]["source"]["callId"] == "call_9"
        assert result.data["message"]["content"][0]["isError"] is True
        assert result.data["error"]["code"] == "TOOL_NOT_STARTED"
        assert "sourceEventSeqs" not in result
        assert (step_end.type, turn_end.type) == ("step/end", "turn/end")

    def test_crash_recovery_recorded_tool(self, store: Persistence) -> None:
        """A recorded tool call with no result tells the model to assess retry risk.

        Rule: docs/stores.md#the-backend-contract.
        """
        builder = LogBuilder()
        builder.tool_call_turn("call_9", recorded=True)
        _store_log(store, builder)
        loaded = store.load("s")
        result = loaded.closers[0]
        assert result.data["error"] == {"name": "ToolOutcomeUnknownError",
                                        "code": "TOOL_OUTCOME_UNKNOWN"}
        assert result.source_event_seqs == [builder.events[-1].seq]
        session = Session.restore("s", loaded.events, loaded.header)
        assert session.derive_messages()[-1]["source"] == {"kind": "tool", "callId": "call_9"}

    def test_unknown_event_type_refused_unless_ignorable(self, store: Persistence) -> None:
        """Rejects an unknown event type on load unless the event is marked ignorable.

        Rule: docs/rules.md#persistence.
        """
        store.create(header("s"))
        with store.open("s", "write") as handle:
            handle.append([make("future/thing", 0, {})])
            handle.flush()
        with pytest.raises(UnknownEventTypeError, match="'future/thing' at seq 0") as info:
            store.inspect("s")
        assert info.value.where["event_type"] == "future/thing"
        assert info.value.where["seq"] == 0
        store.create(header("t"))
        with store.open("t", "write") as handle:
            handle.append([make("future/thing", 0, {}, ignorable=True)])
            handle.flush()
        assert [e.type for e in store.inspect("t").events] == ["future/thing"]

    @pytest.mark.parametrize(("version", "wording"), [(7, "upgrade dsh"), (-1, "no upgrade path")])
    def test_foreign_format_version_refused_with_direction(
                self, store: Persistence, version: int, wording: str) -> None:
        """Rejects a newer/older format version on load, naming the upgrade direction.

        Rule: docs/rules.md#persistence.
        """
        store.create({**header("s"), "version": version})
        with store.open("s", "write") as handle:
            handle.append([make("turn/start", 0, {"turn": 1})])
            handle.flush()
        with pytest.raises(SessionFormatUnsupportedError, match=wording) as info:
            store.inspect("s")
        assert "corrupt" not in str(info.value)

    def test_round_trips_lineage_header_fields(self, store: Persistence) -> None:
        """docs/rules.md#persistence seedLength / delegationDepth / parentSession round-trips."""
        builder = LogBuilder("child")
        builder.completed_turn()
        store.create(header("child", parentSession="parent", seedLength=0, delegationDepth=2,
                            origin="subagent", agentPreset="coder"))
        with store.open("child", "write") as handle:
            handle.append(builder.events)
            handle.flush()
        with store.open("child") as handle:
            got = handle.read().header
        assert got["parentSession"] == "parent"
        assert got["seedLength"] == 0
        assert got["delegationDepth"] == 2
        assert got["origin"] == "subagent"
        assert got["agentPreset"] == "coder"

    def test_torn_tail_truncated_and_closed_on_load(self, store: Persistence) -> None:
        """Torn-tail load: a never-committed tail is truncated and the open turn closed.

        Rule: docs/rules.md#crash-safety.
        """
        builder = LogBuilder()
        builder.completed_turn()
        builder.open_turn()
        _store_log(store, builder)
        if not self.inject_torn_tail(store, "s"):
            pytest.skip("backend has no torn-tail injector")
        with store.open("s") as handle:
            cold = handle.read()
        assert cold.torn is not None
        assert len(cold.events) == 9
        loaded = store.load("s")
        assert [e.type for e in loaded.closers] == ["step/end", "turn/end"]
        with store.open("s") as handle:
            cold = handle.read()
        assert cold.torn is None
        assert [e.seq for e in cold.events] == list(range(11))

    def test_empty_append_stays_lazy(self, store: Persistence) -> None:
        """docs/rules.md#persistence 'append of an empty batch is a no-op (stays lazy)'."""
        store.create(header("s"))
        with store.open("s", "write") as handle:
            handle.append([])
            handle.flush()
        assert store.list() == []


    def test_failed_batch_writes_nothing(self, store: Persistence) -> None:
        """A batch is atomic; a bad last event leaves none of it stored.

        Rule: docs/stores.md#the-backend-contract.
        """
        builder = LogBuilder()
        builder.completed_turn()
        _store_log(store, builder)
        good = make("turn/start", 6, {"turn": 2})
        bad = {**thaw(make("step/start", 7, {"turn": 2, "step": 1})), "data": {"v": math.nan}}
        with store.open("s", "write") as handle:
            with pytest.raises(InvalidJsonError):
                handle.append([good, bad])  # type: ignore[list-item]
            assert len(handle.read().events) == 6
            handle.append([good])
            handle.flush()
        with store.open("s") as handle:
            assert [e.seq for e in handle.read().events] == list(range(7))

    def test_writer_released_on_close_reopens(self, store: Persistence) -> None:
        """Closing a write handle frees the session for the next writer at once.

        Rule: docs/stores.md#the-backend-contract.
        """
        store.create(header("s"))
        for turn in range(3):
            with store.open("s", "write") as handle:
                handle.append([make("turn/start", turn, {"turn": turn + 1})])
                handle.flush()
        with store.open("s") as handle:
            assert [e.seq for e in handle.read().events] == [0, 1, 2]

    def test_tail_yields_every_seq_once_while_appending(self, store: Persistence) -> None:
        """Persistence.tail never skips or repeats a seq, old and new events alike."""
        builder = LogBuilder()
        builder.completed_turn()
        builder.completed_turn(chunks=5)
        builder.completed_turn()
        events = builder.events
        store.create(header("s"))
        with store.open("s", "write") as handle:
            handle.append(events[:4])

            async def follow() -> list[int]:
                seen: list[int] = []
                async for event in store.tail("s", 2, poll_ms=20):
                    seen.append(event.seq)
                    if event.seq == 4:
                        await asyncio.to_thread(handle.append, events[5:11])
                    if event.seq == 3:
                        await asyncio.to_thread(handle.append, events[4:5])
                    if event.seq == 10:
                        await asyncio.to_thread(handle.append, events[11:])
                    if event.seq == len(events) - 1:
                        break
                return seen

            seen = asyncio.run(asyncio.wait_for(follow(), 60))
        assert seen == list(range(2, len(events)))

    def test_tail_refuses_bad_arguments(self, store: Persistence) -> None:
        """Contract: tail refuses bad arguments."""
        store.create(header("s"))

        async def first(from_seq: int) -> None:
            async for _ in store.tail("s", from_seq):
                break

        with pytest.raises(ConfigError):
            asyncio.run(first(-1))

    def test_revision_stable_until_the_log_changes(self, store: Persistence) -> None:
        """Equal across observations of an unchanged log, new after append.

        Rule: docs/stores.md#opening-a-store (listSnapshots).
        """
        builder = LogBuilder()
        builder.completed_turn()
        _store_log(store, builder)
        with store.open("s") as handle:
            first = handle.read().revision
            assert handle.read().revision == first
        with store.open("s", "write") as handle:
            handle.append([make("turn/start", 6, {"turn": 2}, time=builder.events[-1].time)])
            handle.flush()
        with store.open("s") as handle:
            assert handle.read().revision != first

    def test_headers_and_exists_without_reading_logs(self, store: Persistence) -> None:
        """One header per stored session; exists() follows create().

        Rule: docs/stores.md#opening-a-store (list).
        """
        assert not store.exists("a")
        store.create(header("a"))
        store.create(header("b", parentSession="a"))
        assert store.exists("a") and store.exists("b") and not store.exists("c")
        with store.open("a", "write") as handle:
            handle.append([make("turn/start", 0, {"turn": 1})])
            handle.flush()
        with store.open("b", "write") as handle:
            handle.append([make("turn/start", 0, {"turn": 1})])
            handle.flush()
        headers = {h["id"]: h for h in store.list_headers()}
        assert set(headers) == {"a", "b"}
        assert headers["b"]["parentSession"] == "a"

    def test_closed_handle_refuses_reads_and_appends(self, store: Persistence) -> None:
        """A closed handle raises a PersistenceError; closing twice is harmless."""
        store.create(header("s"))
        handle = store.open("s", "write")
        handle.close()
        handle.close()
        with pytest.raises(PersistenceError):
            handle.append([make("turn/start", 0, {"turn": 1})])
        with pytest.raises(PersistenceError):
            handle.read()

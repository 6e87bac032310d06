"""JSONL backend: dsh's on-disk format, torn tails, corruption, locking and bad input.

Rule: docs/formats.md#jsonl, docs/formats.md#zstandard-files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import zstandard

from dsh._errors import (
    InvalidJsonError,
    LogCorruptError,
    PersistenceError,
    SessionBusyError,
    SessionExistsError,
    SessionFormatUnsupportedError,
)
from dsh.json import dumps, loads
from dsh.persistence import Persistence, open_backend
from dsh.persistence.jsonl._backend import JsonlBackend
from dsh.persistence.jsonl._format import encode_segment, project_key
from dsh.session._events import Event
from dsh.testing import CWD, LogBuilder, header, make, plain

PROJECT = "--workspace-demo-app--"


def raw_backend(tmp_path: Path, **kw: Any) -> JsonlBackend:
    return JsonlBackend(tmp_path / "root", **kw)


def log_path(tmp_path: Path, sid: str = "s", name: str = "session.jsonl") -> Path:
    return tmp_path / "root" / PROJECT / encode_segment(sid) / name


def write_log(backend: JsonlBackend, events: Any, sid: str = "s") -> None:
    backend.create(header(sid))
    with backend.open(sid, "write") as handle:
        handle.append(list(events))
        handle.flush()


def lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return data[:-1].split(b"\n")


def two_hundred_ending_in_tool_call() -> LogBuilder:
    builder = LogBuilder()
    for i in range(30):
        builder.completed_turn(f"prompt {i}")
    builder.completed_turn("streamed", chunks=8)
    builder.tool_call_turn("call_build", recorded=True)
    assert len(builder.events) == 200
    assert builder.events[-1].type == "tool/call"
    return builder


# --- path encoding (docs/formats.md#layout-and-path-encoding) -------------------------------------

def test_encode_segment_neutralizes_traversal_and_separators() -> None:
    # docs/formats.md#jsonl "encodeSegment neutralizes traversal, separators, and absolute paths"
    assert encode_segment("..") == "~002E~002E"
    assert encode_segment(".") == "~002E"
    assert encode_segment("a/b") == "a~002Fb"
    assert encode_segment("/etc/passwd") == "~002Fetc~002Fpasswd"
    assert encode_segment("a\x00b") == "a~0000b"
    assert encode_segment("a~b") == "a~007Eb"


def test_encode_segment_injective_over_utf16() -> None:
    # docs/formats.md#jsonl "encodeSegment is injective over UTF-16, incl. lone surrogates"
    assert encode_segment("\ud800") == "~D800"
    assert encode_segment("\udc00") == "~DC00"
    assert encode_segment("~002F") != encode_segment("/")
    assert encode_segment("😀") == "~D83D~DE00"


def test_encode_segment_rejects_empty() -> None:
    with pytest.raises(LogCorruptError, match="empty"):
        encode_segment("")


def test_project_key_examples() -> None:
    # docs/formats.md#jsonl "projectKey normalizes project paths into bounded readable names"
    assert project_key("/home/alice/src/app") == "--home-alice-src-app--"
    assert project_key("C:\\work\\agent") == "--C-work-agent--"
    assert project_key("/") == "--root--"
    assert project_key("/开发/~agent") == "--~5F00~53D1-~007Eagent--"
    assert len(project_key("/" + "a" * 400)) == 255
    with pytest.raises(LogCorruptError):
        project_key("")


# --- header line (docs/formats.md#header-line) ----------------------------------------------------

def test_header_line_key_order_and_delegation_depth(tmp_path: Path) -> None:
    # docs/formats.md#jsonl writer MUST 2: type, version, id, createdAt, cwd?, …, delegationDepth
    # always; then this library's seal mark on a raw log (docs/formats.md#integrity-seals)
    backend = raw_backend(tmp_path)
    builder = LogBuilder()
    builder.completed_turn()
    write_log(backend, builder.events)
    first = lines(log_path(tmp_path))[0]
    assert first == (b'{"type":"session","version":0,"id":"s","createdAt":1767225600000,'
                     b'"cwd":"/workspace/demo-app","delegationDepth":0,"dshSeal":1}')


def test_lazy_materialization_writes_nothing_before_first_event(tmp_path: Path) -> None:
    # docs/formats.md#jsonl "lazy materialization: create() writes no file until the first append"
    backend = raw_backend(tmp_path)
    backend.create(header("s"))
    assert not log_path(tmp_path).exists()
    assert list(backend.list_headers()) == []
    with backend.open("s", "write") as handle:
        handle.append([make("turn/start", 0, {"turn": 1})])
        handle.flush()
    assert log_path(tmp_path).exists()
    assert [h["id"] for h in backend.list_headers()] == ["s"]
    assert oct(log_path(tmp_path).stat().st_mode & 0o777) == "0o600"


def test_future_header_refused_as_unsupported_not_corrupt(tmp_path: Path) -> None:
    # docs/formats.md#jsonl "refuses a structurally foreign future header as unsupported, not
    # corrupt"
    path = log_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"type":"session","version":42,"id":"s"}\n')
    backend = raw_backend(tmp_path)
    with backend.open("s") as handle, pytest.raises(SessionFormatUnsupportedError) as info:
        handle.read()
    message = str(info.value)
    assert "upgrade dsh" in message and "v42" in message and str(path) in message
    assert "corrupt" not in message


def test_non_object_header_is_corruption(tmp_path: Path) -> None:
    # docs/formats.md#jsonl "keeps a non-object header line a corruption, not a format refusal"
    path = log_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"42\n")
    with raw_backend(tmp_path).open("s") as handle, \
            pytest.raises(LogCorruptError, match="first line is not a session header"):
        handle.read()


def test_foreign_version_names_stringified_id(tmp_path: Path) -> None:
    # docs/formats.md#jsonl "names a foreign-version header by its stringified non-string id"
    path = log_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"type":"session","version":42,"id":123}\n')
    with raw_backend(tmp_path).open("s") as handle, \
            pytest.raises(SessionFormatUnsupportedError, match='session "123" uses log format v42'):
        handle.read()


@pytest.mark.parametrize("field", ["sandboxMode", "approvalPolicy"])
def test_retired_header_field_rejected(tmp_path: Path, field: str) -> None:
    # docs/formats.md#jsonl "rejects the retired %s header field"
    path = log_path(tmp_path)
    path.parent.mkdir(parents=True)
    head = {"type": "session", "version": 0, "id": "s", "createdAt": 1, "cwd": CWD,
            "delegationDepth": 0, field: "x"}
    path.write_bytes(json.dumps(head).encode() + b"\n")
    backend = raw_backend(tmp_path)
    with pytest.raises(LogCorruptError, match="retired policy baseline fields"):
        list(backend.list_headers())


# --- records, packing (docs/formats.md#record-lines) ----------------------------------------------

def test_delta_run_packs_into_one_row_by_default(tmp_path: Path) -> None:
    # docs/formats.md#jsonl "writes a delta run as one text-chunks row by default and loads back
    # identical"
    builder = LogBuilder()
    builder.open_turn()
    builder.chunks(5)
    backend = raw_backend(tmp_path)
    write_log(backend, builder.events)
    records = [json.loads(line) for line in lines(log_path(tmp_path))[1:]]
    assert [r["type"] for r in records] == [
        "turn/start", "step/start", "user/message", "assistant/chunk", "text-chunks"]
    assert records[-1]["seq0"] == 4 and len(records[-1]["data"]["texts"]) == 5
    with backend.open("s") as handle:
        assert plain(handle.read().events) == plain(builder.events)


def test_pack_chunks_false_writes_one_event_per_line(tmp_path: Path) -> None:
    # docs/formats.md#jsonl "packChunks: false writes one event per line and still loads identical
    # events"
    builder = LogBuilder()
    builder.open_turn()
    builder.chunks(5)
    backend = open_backend(f"jsonl://{tmp_path}/root?pack_chunks=false")
    assert isinstance(backend, JsonlBackend)
    write_log(backend, builder.events)
    body = lines(log_path(tmp_path))[1:]
    assert body == [dumps(e) for e in builder.events]


# --- torn tails and corruption (docs/formats.md#reading-the-committed-region) ---------------------

def test_torn_37_byte_tail_after_tool_call_is_reported_and_dropped(tmp_path: Path) -> None:
    # cut after 37 bytes without newline after 200 good events ending at tool/call
    builder = two_hundred_ending_in_tool_call()
    backend = raw_backend(tmp_path)
    write_log(backend, builder.events)
    path = log_path(tmp_path)
    good_size = path.stat().st_size
    next_record = dumps(make("tool/result", 200, {"turn": 32, "step": 1}))
    with open(path, "ab") as f:
        f.write(next_record[:37])
    with backend.open("s") as handle:
        cold = handle.read()
    assert len(cold.events) == 200
    assert cold.torn is not None
    assert cold.torn.byte_offset == good_size
    assert "37 bytes" in cold.torn.reason
    store = Persistence(open_backend(f"jsonl://{tmp_path}/root"))
    inspected = store.inspect("s")
    assert [e.type for e in inspected.closers] == ["tool/result", "step/end", "turn/end"]
    assert path.stat().st_size == good_size + 37  # inspect writes nothing
    loaded = store.load("s")
    assert [e.seq for e in loaded.events] == list(range(203))
    data = path.read_bytes()
    assert data.endswith(b"\n")
    parsed = [loads(line) for line in lines(path)]
    assert [p["seq"] for p in parsed[-3:]] == [200, 201, 202]
    assert parsed[-3]["data"]["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
    assert data[:good_size] == path.read_bytes()[:good_size]


def test_write_after_torn_tail_takes_the_uncommitted_seq_on_its_own_line(tmp_path: Path) -> None:
    # resume-for-write after a torn tail, then append, takes seq 200 on its line
    builder = two_hundred_ending_in_tool_call()
    backend = raw_backend(tmp_path)
    write_log(backend, builder.events)
    path = log_path(tmp_path)
    committed = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b'{"type":"tool/result","seq":200,"ti')
    event = make("tool/result", 200, {"x": 1}, time=builder.events[-1].time)
    with backend.open("s", "write") as handle:
        assert handle.read().torn is not None
        handle.append([event])
        handle.flush()
    assert path.read_bytes() == committed + dumps(event) + b"\n"


def test_special_line_characters_round_trip_one_physical_line_per_record(tmp_path: Path) -> None:
    # docs/formats.md#lossless-json: \n framing only, never splitlines
    text = "a\u2028b\u2029c\u0085d\x0be\x0cf\x1cg\x1dh\x1ei\rj\nk"
    backend = raw_backend(tmp_path)
    events = [make("todo/write", i, {"todos": [{"content": text, "status": "pending"}]})
              for i in range(3)]
    write_log(backend, events)
    body = lines(log_path(tmp_path))
    assert len(body) == 4
    with backend.open("s") as handle:
        got = handle.read().events
    assert [e.data["todos"][0]["content"] for e in got] == [text] * 3


def test_raw_u2028_from_another_writer_loads(tmp_path: Path) -> None:
    # a raw U+2028 (not escaped) in a file written elsewhere loads
    path = log_path(tmp_path)
    path.parent.mkdir(parents=True)
    head = b'{"type":"session","version":0,"id":"s","createdAt":1,"cwd":"/workspace/demo-app",' \
           b'"delegationDepth":0}\n'
    record = '{"type":"todo/write","seq":0,"time":1,"data":{"t":"x\u2028y\u0085z"}}\n'
    path.write_bytes(head + record.encode("utf-8"))
    with raw_backend(tmp_path).open("s") as handle:
        cold = handle.read()
    assert cold.torn is None
    assert cold.events[0].data["t"] == "x\u2028y\u0085z"


def test_lone_surrogates_round_trip_and_file_stays_utf8(tmp_path: Path) -> None:
    # docs/formats.md#lossless-json: lone surrogates are escaped so the file is valid UTF-8
    text = "lone \ud800 and \udfff end"
    backend = raw_backend(tmp_path)
    write_log(backend, [make("todo/write", 0, {"t": text})])
    data = log_path(tmp_path).read_bytes()
    data.decode("utf-8", "strict")
    assert b"\\ud800" in data and b"\\udfff" in data
    with backend.open("s") as handle:
        assert handle.read().events[0].data["t"] == text


@pytest.mark.parametrize("bad", [b"NaN", b"Infinity", b"-Infinity", b"1e400",
                                 b"9007199254740993"])
def test_stored_non_lossless_number_refused_naming_line(tmp_path: Path, bad: bytes) -> None:
    # bare NaN / Infinity / 1e400 (and unsafe ints) are refused, naming the line
    backend = raw_backend(tmp_path)
    write_log(backend, [make("todo/write", 0, {"v": 1})])
    path = log_path(tmp_path)
    with open(path, "ab") as f:
        f.write(b'{"type":"todo/write","seq":1,"time":1,"data":{"v":' + bad + b"}}\n")
    with backend.open("s") as handle, pytest.raises(LogCorruptError, match="line 3") as info:
        handle.read()
    assert info.value.where["line"] == 3
    assert info.value.where["path"] == str(path)


def test_unsafe_integer_refused_at_append_with_field_path(tmp_path: Path) -> None:
    # 9007199254740993 refused at append with the field path
    backend = raw_backend(tmp_path)
    backend.create(header("s"))
    with backend.open("s", "write") as handle:
        with pytest.raises(InvalidJsonError) as info:
            handle.append([make("todo/write", 0, {"todos": [{"n": 9007199254740993}]})])
        assert info.value.where["json_path"] == "$[0].data.todos[0].n"
    assert not log_path(tmp_path).exists()


def test_duplicate_seq_on_two_lines_names_both_lines(tmp_path: Path) -> None:
    # the same seq on two lines fails naming both lines
    backend = raw_backend(tmp_path)
    write_log(backend, [make("todo/write", 0, {}), make("todo/write", 1, {})])
    path = log_path(tmp_path)
    with open(path, "ab") as f:
        f.write(dumps(make("todo/write", 1, {})) + b"\n")
    with backend.open("s") as handle, \
            pytest.raises(LogCorruptError, match="seq 1 appears on line 3 and again on line 4"):
        handle.read()


def test_bad_record_followed_by_complete_record_is_corruption(tmp_path: Path) -> None:
    # docs/formats.md#reading-the-committed-region: damage followed by a later parsed record (here a
    # turn/end) is fatal
    builder = LogBuilder()
    builder.completed_turn()
    backend = raw_backend(tmp_path)
    write_log(backend, builder.events[:3])
    path = log_path(tmp_path)
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b'{"type":"assistant/mess\n')
        f.write(b"\n".join(dumps(e) for e in builder.events[4:]) + b"\n")
    with backend.open("s") as handle, pytest.raises(LogCorruptError) as info:
        handle.read()
    assert info.value.where["line"] == 5
    assert info.value.where["byte_offset"] == size
    assert "unparsable committed event at line 5" in str(info.value)


def test_seq_gap_with_turn_end_is_corruption(tmp_path: Path) -> None:
    # docs/formats.md#jsonl "rejects a seq gap BEFORE a later committed turn/end (committed data
    # damaged)"
    backend = raw_backend(tmp_path)
    write_log(backend, [make("turn/start", 0, {"turn": 1})])
    with open(log_path(tmp_path), "ab") as f:
        f.write(dumps(make("turn/end", 5, {"turn": 1, "reason": {"kind": "completed"}})) + b"\n")
    with backend.open("s") as handle, \
            pytest.raises(LogCorruptError, match=r"seq gap in committed region at line 3 "
                                                 r"\(expected 1, got 5\)"):
        handle.read()


def test_final_seq_gap_is_a_tolerated_torn_tail(tmp_path: Path) -> None:
    # docs/formats.md#jsonl "tolerates a seq gap AFTER a turn/end (uncommitted tail)"
    backend = raw_backend(tmp_path)
    first = [make("turn/start", 0, {"turn": 1}),
             make("turn/end", 1, {"turn": 1, "reason": {"kind": "completed"}})]
    write_log(backend, first)
    size = log_path(tmp_path).stat().st_size
    with open(log_path(tmp_path), "ab") as f:
        f.write(dumps(make("turn/start", 7, {"turn": 2})) + b"\n")
    with backend.open("s") as handle:
        cold = handle.read()
    assert [e.seq for e in cold.events] == [0, 1]
    assert cold.torn is not None and cold.torn.byte_offset == size and cold.torn.line == 4


def test_header_only_log_preserves_nothing(tmp_path: Path) -> None:
    # docs/formats.md#jsonl "a header-only log (no event lines at all) preserves nothing"
    path = log_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"type":"session","version":0,"id":"s","createdAt":1,'
                     b'"cwd":"/workspace/demo-app","delegationDepth":0}\n')
    with raw_backend(tmp_path).open("s") as handle:
        cold = handle.read()
    assert cold.events == () and cold.torn is None


# --- write failures (docs/formats.md#writing) -----------------------------------------------------

def test_failed_write_truncates_partial_bytes_so_retry_has_no_gap(tmp_path: Path) -> None:
    # docs/formats.md#jsonl "a failed appendLines truncates partial bytes so a retry has no seq gap"
    backend = raw_backend(tmp_path)
    write_log(backend, [make("todo/write", 0, {})])
    path = log_path(tmp_path)
    size = path.stat().st_size
    real_write = os.write

    def half_then_fail(fd: int, data: Any) -> int:
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(28, "No space left on device")

    batch = [make("todo/write", 1, {}), make("todo/write", 2, {})]
    with backend.open("s", "write") as handle:
        handle.read()
        backend._os_write = half_then_fail
        with pytest.raises(OSError):
            handle.append(batch)
        assert path.stat().st_size == size
        backend._os_write = real_write
        handle.append(batch)
        handle.flush()
    with backend.open("s") as handle:
        assert [e.seq for e in handle.read().events] == [0, 1, 2]


def test_failed_fsync_rolls_back_to_last_durable_state(tmp_path: Path) -> None:
    # docs/formats.md#zstandard-files "rolls back a checksummed append frame when fsync fails" (raw
    # and zstd)
    for compression, name in (("none", "session.jsonl"), ("zstd", "session.jsonl.zstd")):
        root = tmp_path / compression
        backend = JsonlBackend(root, compression=compression)  # type: ignore[arg-type]
        backend.create(header("s"))
        with backend.open("s", "write") as handle:
            handle.append([make("todo/write", 0, {})])
            handle.flush()
            path = root / PROJECT / "s" / name
            before = path.read_bytes()

            def failing_fsync(fd: int) -> None:
                raise OSError(5, "I/O error")

            backend._os_fsync = failing_fsync
            handle.append([make("todo/write", 1, {})])
            with pytest.raises(OSError):
                handle.flush()
            assert path.read_bytes() == before
            backend._os_fsync = os.fsync
            handle.append([make("todo/write", 1, {})])
            handle.flush()
        with backend.open("s") as handle:
            assert [e.seq for e in handle.read().events] == [0, 1]


def test_materialization_refuses_existing_log(tmp_path: Path) -> None:
    # docs/formats.md#writing: first materialization never overwrites
    backend = raw_backend(tmp_path)
    backend.create(header("s"))
    with backend.open("s", "write") as handle:
        assert handle.read().events == ()
        # a writer that takes no lock (dsh itself) materializes the same id meanwhile
        foreign = b'{"type":"session","version":0,"id":"s","createdAt":1,"delegationDepth":0}\n'
        log_path(tmp_path).write_bytes(foreign)
        with pytest.raises(SessionExistsError, match="already exists on disk"):
            handle.append([make("todo/write", 0, {"mine": True})])
    assert log_path(tmp_path).read_bytes() == foreign
    assert [p.name for p in log_path(tmp_path).parent.iterdir() if p.suffix == ".tmp"] == []


# --- zstd (docs/formats.md#zstandard-files) -------------------------------------------------------

def zstd_backend(tmp_path: Path) -> JsonlBackend:
    return JsonlBackend(tmp_path / "root", compression="zstd")


def frames_of(path: Path) -> list[bytes]:
    from dsh.persistence.jsonl._format import scan_zstd_frames
    data = path.read_bytes()
    frames, torn = scan_zstd_frames(data, path=str(path))
    assert torn is None
    dctx = zstandard.ZstdDecompressor()
    return [dctx.decompressobj().decompress(data[s:e]) for s, e in frames]


def test_zstd_header_frame_then_one_frame_per_batch(tmp_path: Path) -> None:
    # docs/formats.md#zstandard-files "writes .jsonl.zstd with one header frame and one first-batch
    # frame"; "appends one frame per durable batch without rewriting prior bytes"
    backend = zstd_backend(tmp_path)
    write_log(backend, [make("todo/write", 0, {}), make("todo/write", 1, {})])
    path = log_path(tmp_path, name="session.jsonl.zstd")
    plains = frames_of(path)
    assert len(plains) == 2 and plains[0].count(b"\n") == 1
    prefix = path.read_bytes()
    with backend.open("s", "write") as handle:
        handle.append([make("todo/write", 2, {})])
        handle.flush()
    assert path.read_bytes().startswith(prefix)
    assert len(frames_of(path)) == 3


def test_zstd_torn_frame_events_recovered_and_reencoded(tmp_path: Path) -> None:
    # docs/formats.md#zstandard-files "preserves complete records from a torn frame and re-encodes
    # them with closers"
    backend = zstd_backend(tmp_path)
    builder = LogBuilder()
    builder.open_turn()
    write_log(backend, builder.events[:2])
    path = log_path(tmp_path, name="session.jsonl.zstd")
    committed = path.read_bytes()
    tail = b"\n".join(dumps(e) for e in builder.events[2:]) + b"\n" + b'{"type":"assist'
    frame = zstandard.ZstdCompressor(write_checksum=True).compress(tail)
    with open(path, "ab") as f:
        f.write(frame[:-4])  # torn inside its checksum
    with backend.open("s") as handle:
        cold = handle.read()
    assert [e.seq for e in cold.events] == [0, 1, 2]
    assert cold.torn is not None and cold.torn.byte_offset == len(committed)
    assert [e.seq for e in cold.torn.recovered] == [2]
    loaded = Persistence(open_backend(f"jsonl+zstd://{tmp_path}/root")).load("s")
    assert [e.type for e in loaded.closers] == ["step/end", "turn/end"]
    data = path.read_bytes()
    assert data.startswith(committed)
    with backend.open("s") as handle:
        again = handle.read()
    assert again.torn is None and [e.seq for e in again.events] == [0, 1, 2, 3, 4]


def test_zstd_frame_torn_in_header_is_dropped(tmp_path: Path) -> None:
    # docs/formats.md#zstandard-files "drops a frame torn in its header before it has produced
    # plaintext"
    backend = zstd_backend(tmp_path)
    write_log(backend, [make("todo/write", 0, {})])
    path = log_path(tmp_path, name="session.jsonl.zstd")
    original = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b"\x28\xb5")
    with backend.open("s", "write") as handle:
        cold = handle.read()
        assert cold.torn is not None and cold.torn.recovered == ()
        handle.append([])
    assert path.read_bytes() == original


def test_zstd_complete_frame_with_torn_record_is_corruption(tmp_path: Path) -> None:
    # docs/formats.md#zstandard-files "rejects a complete frame containing a torn JSONL record"
    backend = zstd_backend(tmp_path)
    write_log(backend, [make("todo/write", 0, {})])
    path = log_path(tmp_path, name="session.jsonl.zstd")
    with open(path, "ab") as f:
        f.write(zstandard.ZstdCompressor(write_checksum=True).compress(b'{"type":"to'))
    with backend.open("s") as handle, \
            pytest.raises(LogCorruptError, match="complete frame contains a torn JSONL record"):
        handle.read()


def test_zstd_checksum_corruption_and_bad_magic(tmp_path: Path) -> None:
    # docs/formats.md#zstandard-files "rejects ... checksum-corrupt ... frames"; "invalid frame
    # magic"
    backend = zstd_backend(tmp_path)
    write_log(backend, [make("todo/write", 0, {})])
    path = log_path(tmp_path, name="session.jsonl.zstd")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with backend.open("s") as handle, pytest.raises(LogCorruptError, match="failed validation"):
        handle.read()
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data) + b"GARBAGE!")
    with backend.open("s") as handle, pytest.raises(LogCorruptError, match="invalid frame magic"):
        handle.read()


def test_opposite_encoding_root_is_refused(tmp_path: Path) -> None:
    # docs/formats.md#zstandard-files "rejects roots owned by the opposite encoding in both
    # directions"
    write_log(raw_backend(tmp_path), [make("todo/write", 0, {})])
    with pytest.raises(PersistenceError, match="matching compression mode"):
        zstd_backend(tmp_path).open("s")


def test_flat_file_layout_rejected(tmp_path: Path) -> None:
    # docs/formats.md#jsonl "rejects the obsolete flat-file layout instead of ignoring stored
    # sessions"
    project = tmp_path / "root" / PROJECT
    project.mkdir(parents=True)
    (project / "s.jsonl").write_bytes(b"{}\n")
    backend = raw_backend(tmp_path)
    with pytest.raises(PersistenceError, match="flat-file layout"):
        backend.open("s")
    with pytest.raises(PersistenceError, match="flat-file layout"):
        list(backend.list_headers())


def test_mismatched_header_identity_refused(tmp_path: Path) -> None:
    # docs/formats.md#jsonl "rejects a mismatched header before repairing either session log"
    backend = raw_backend(tmp_path)
    write_log(backend, [make("turn/start", 0, {"turn": 1})], "a")
    path = log_path(tmp_path, "a")
    path.write_bytes(path.read_bytes().replace(b'"id":"a"', b'"id":"b"', 1))
    path.with_name("session.jsonl.seal").unlink()  # as if dsh wrote it (the seal would refuse)
    before = path.read_bytes()
    with backend.open("a", "write") as handle, \
            pytest.raises(LogCorruptError, match="identity mismatch"):
        handle.read()
    assert path.read_bytes() == before


# --- exclusive writers across processes (docs/stores.md#the-backend-contract) ---------------------

CHILD = textwrap.dedent("""
    import sys, time
    from dsh.persistence.jsonl._backend import JsonlBackend
    from dsh.session._events import Event
    backend = JsonlBackend(sys.argv[1])
    handle = backend.open("s", "write")
    n = len(handle.read().events)
    handle.append([Event({"type": "todo/write", "seq": n, "time": 1, "data": {"by": "child"}})])
    handle.flush()
    print("ready", flush=True)
    sys.stdin.readline()
    handle.close()
""")


def test_second_writer_in_another_process_gets_busy(tmp_path: Path) -> None:
    # docs/stores.md#the-backend-contract: cross-process exclusion; nothing duplicated
    backend = raw_backend(tmp_path)
    write_log(backend, [make("todo/write", 0, {})])
    with subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "root")],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            with pytest.raises(SessionBusyError) as info:
                backend.open("s", "write")
            assert info.value.where["pid"] == child.pid
            assert f"pid {child.pid}" in str(info.value)
        finally:
            assert child.stdin is not None
            child.stdin.write("\n")
            child.stdin.flush()
            child.wait(timeout=30)
    with backend.open("s", "write") as handle:
        events = handle.read().events
    assert [e.seq for e in events] == [0, 1]
    assert events[1].data == {"by": "child"}


def test_event_is_frozen_after_read(tmp_path: Path) -> None:
    backend = raw_backend(tmp_path)
    write_log(backend, [make("todo/write", 0, {"a": [1]})])
    with backend.open("s") as handle:
        event = handle.read().events[0]
    assert isinstance(event, Event)
    with pytest.raises(TypeError):
        event.data["a"].append(2)


@pytest.mark.skipif(shutil.which("zstd") is None, reason="zstd CLI not installed")
def test_zstd_file_decodes_with_standard_zstd_tool(tmp_path: Path) -> None:
    # docs/formats.md#zstandard-files compat "round-trips concatenated checksummed frames through
    # the built-in API"; dsh-logs README: `zstd -dc` on the file yields the JSONL text
    backend = zstd_backend(tmp_path)
    builder = LogBuilder()
    builder.open_turn()
    builder.chunks(4)
    write_log(backend, builder.events[:3])
    with backend.open("s", "write") as handle:
        handle.append(list(builder.events[3:]))
        handle.flush()
    path = log_path(tmp_path, name="session.jsonl.zstd")
    text = subprocess.run(["zstd", "-dc", "--no-progress", str(path)], check=True,
                          capture_output=True).stdout
    assert text == backend.read_raw("s").encode("utf-8")  # type: ignore[union-attr]
    assert text.count(b"\n") == 1 + 3 + 2  # header, 3 events, block-start + one packed row

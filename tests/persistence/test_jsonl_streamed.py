"""A raw JSONL log is read in bounded chunks, with the same result as the whole-file read.

Rule: docs/formats.md#reading-the-committed-region (streamed reads). The streamed read
(``_stream_raw``) either returns exactly what ``parse_log`` of the whole file returns (header,
events, torn tail, committed length, page-in index, prescan, size, header bytes) or gives up
(None) and the whole read runs, which raises what applies; its peak holds one chunk, not the
file.
"""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh._errors import DshError, LogCorruptError
from dsh.persistence import Persistence, open_backend
from dsh.persistence import _restore_point as rp
from dsh.persistence._seal import read_seal
from dsh.persistence.jsonl import _backend as jb
from dsh.persistence.jsonl._backend import JsonlBackend
from dsh.session._events import Event
from dsh.testing import header
from dsh.testing._damage import EDIT_KINDS, Edit, apply_edits, fuzz_events
from dsh.testing._logs import LogBuilder

EXAMPLES = int(os.environ.get("DSH_FUZZ_EXAMPLES", "40"))
SESSION = Path("--workspace-demo-app--") / "s"
EVENTS = fuzz_events()


def _write(root: Path, events: list[Event], batches: int = 4) -> Path:
    backend = JsonlBackend(root)
    backend.create(header("s"))
    step = len(events) // batches + 1
    with backend.open("s", "write") as handle:
        for k in range(0, len(events), step):
            handle.append(events[k:k + step])
            handle.flush()
    backend.close()
    return root / SESSION / "session.jsonl"


def _same_as_whole(path: Path) -> bool:
    """Assert the streamed read equals the whole read; return whether it streamed."""
    seal = read_seal(Path(f"{path}.seal"))
    data = path.read_bytes()
    streamed = jb._stream_raw(path, seal)
    try:
        whole = jb.parse_log(data, compression="none", path=str(path), seal=seal)
    except DshError:
        assert streamed is None  # the whole read names the damage
        return False
    if streamed is None:
        return False
    parsed, size, head, revision = streamed
    assert (parsed.header, parsed.events, parsed.torn, parsed.committed, parsed.header_end,
            parsed.index, parsed.prescan) == (whole.header, whole.events, whole.torn,
                                              whole.committed, whole.header_end, whole.index,
                                              whole.prescan)
    assert (size, head) == (len(data), data[:whole.header_end])
    assert revision
    return True


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks and index steps far below a record's size, so every boundary case occurs."""
    monkeypatch.setattr(jb, "_STREAM_CHUNK_BYTES", 37)
    monkeypatch.setattr(rp, "INDEX_EVERY_BYTES", 101)


@pytest.mark.parametrize("chunk", [1, 37, 4096, 1 << 20])
def test_streamed_read_equals_whole_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         chunk: int) -> None:
    monkeypatch.setattr(jb, "_STREAM_CHUNK_BYTES", chunk)
    monkeypatch.setattr(rp, "INDEX_EVERY_BYTES", 97)
    path = _write(tmp_path / "store", EVENTS)
    assert _same_as_whole(path)
    parsed = jb._stream_raw(path, read_seal(Path(f"{path}.seal")))
    assert parsed is not None and len(parsed[0].index) > 3  # the sampler ran


def test_torn_tail_is_streamed_and_reported(tmp_path: Path, small_chunks: None) -> None:
    path = _write(tmp_path / "store", EVENTS)
    with open(path, "ab") as f:
        f.write(b'{"type":"turn/start","seq":')  # a write cut short: no newline
    assert _same_as_whole(path)
    parsed = jb._stream_raw(path, read_seal(Path(f"{path}.seal")))
    assert parsed is not None and parsed[0].torn is not None
    assert parsed[0].torn.byte_offset == path.stat().st_size - 27
    assert len(parsed[0].events) == len(EVENTS)


def test_changed_sealed_byte_falls_back_to_the_named_error(tmp_path: Path,
                                                            small_chunks: None) -> None:
    path = _write(tmp_path / "store", EVENTS)
    data = bytearray(path.read_bytes())
    at = data.index(b'"text"', len(data) // 2)
    data[at + 1] = ord("T")  # still JSON, still an event: only the seal sees it
    path.write_bytes(bytes(data))
    assert jb._stream_raw(path, read_seal(Path(f"{path}.seal"))) is None
    with pytest.raises(LogCorruptError) as caught:
        Persistence(open_backend(f"jsonl://{tmp_path / 'store'}")).read("s")
    where = caught.value.where
    assert where["line"] == bytes(data).count(b"\n", 0, where["byte_offset"]) + 1
    assert where["path"] == str(path) and "crc32 mismatch" in caught.value.message


def test_cut_sealed_bytes_fall_back_to_the_named_error(tmp_path: Path,
                                                       small_chunks: None) -> None:
    path = _write(tmp_path / "store", EVENTS)
    data = path.read_bytes()
    path.write_bytes(data[:data.rindex(b"\n", 0, len(data) - 1) + 1])  # a whole line gone
    assert jb._stream_raw(path, read_seal(Path(f"{path}.seal"))) is None
    with pytest.raises(LogCorruptError, match="committed data was cut off"):
        Persistence(open_backend(f"jsonl://{tmp_path / 'store'}")).read("s")


_FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture,
                                        HealthCheck.too_slow])
_edits = st.lists(st.tuples(st.floats(0, 1), st.sampled_from(EDIT_KINDS),
                            st.binary(min_size=1, max_size=8)), min_size=1, max_size=4)


@_FUZZ
@given(edits=_edits, sealed=st.booleans())
def test_damaged_logs_stream_as_the_whole_read_or_not_at_all(
        edits: list[Edit], sealed: bool, tmp_path_factory: pytest.TempPathFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jb, "_STREAM_CHUNK_BYTES", 53)
    monkeypatch.setattr(rp, "INDEX_EVERY_BYTES", 211)
    path = _write(tmp_path_factory.mktemp("fuzz") / "store", EVENTS)
    if not sealed:
        os.unlink(f"{path}.seal")
    path.write_bytes(apply_edits(path.read_bytes(), edits))
    _same_as_whole(path)


def test_streamed_read_peak_holds_a_chunk_not_the_file(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jb, "_STREAM_CHUNK_BYTES", 64 * 1024)
    builder = LogBuilder("s")
    for i in range(1000):
        builder.completed_turn(f"prompt {i} " + "x" * 2000)
    events = list(builder.events)
    path = _write(tmp_path / "store", events, batches=1)
    size = path.stat().st_size
    assert size > 2_000_000
    seal = read_seal(Path(f"{path}.seal"))
    tracemalloc.start()
    try:
        streamed = jb._stream_raw(path, seal)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert streamed is not None and streamed[0].events == events
    assert peak - kept < size // 4, (peak, kept, size)

"""A live JSONL or Zstandard writer refuses a log that is no longer the file it wrote.

The writer appends with ``O_APPEND``: a log cut under it (another program, a bad restore) would
take the next batch at its new, shorter end, leaving a seq gap; a log replaced by another file
would take it in a file no reader sees. Each append first compares the file at the log's path
with what the handle wrote (size, inode) and refuses with ``LogCorruptError`` naming the file,
the expected and found size, writing nothing (docs/formats.md#writing, docs/errors.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from dsh._errors import LogCorruptError
from dsh.persistence.jsonl._backend import JsonlBackend
from dsh.persistence.jsonl._format import encode_segment
from dsh.session import Event
from dsh.testing import LogBuilder, header

PROJECT = "--workspace-demo-app--"

BACKENDS = ("none", "zstd")


def _events() -> list[Event]:
    builder = LogBuilder()
    for i in range(4):
        builder.completed_turn(f"prompt {i}")
    return list(builder.events)


def _log(root: Path, compression: str) -> Path:
    name = "session.jsonl" if compression == "none" else "session.jsonl.zstd"
    return root / PROJECT / encode_segment("s") / name


@pytest.mark.parametrize("compression", BACKENDS)
def test_log_cut_between_two_flushes_is_refused_and_nothing_written(
        tmp_path: Path, compression: str) -> None:
    events = _events()
    half = len(events) // 2
    backend = JsonlBackend(tmp_path / "root", compression=compression)
    backend.create(header("s"))
    with backend.open("s", "write") as handle:
        handle.append(events[:2])
        handle.flush()
        path = _log(tmp_path / "root", compression)
        first = path.stat().st_size
        handle.append(events[2:half])
        handle.flush()
        written = path.stat().st_size
        assert written > first
        os.truncate(path, first)  # another program cuts the committed second batch away
        with pytest.raises(LogCorruptError) as info:
            handle.append(events[half:])
        assert path.stat().st_size == first  # nothing written after the cut
        with pytest.raises(LogCorruptError):  # and it keeps refusing
            handle.append(events[half:])
        assert path.stat().st_size == first
    err = info.value
    assert err.code == "LOG_CORRUPT"
    assert err.where["path"] == str(path)
    assert err.where["byte_offset"] == written  # where the writer's committed bytes end
    assert f"holds {first} bytes" in err.message
    assert f"handle wrote {written} bytes" in err.message
    assert err.message.startswith(f"corrupt session log 's' in {path}: the file changed under")
    assert "restore the file from a backup" in err.message


def _refused_after(tmp_path: Path, compression: str,
                   change: Callable[[Path], None]) -> tuple[Path, LogCorruptError]:
    """Write two flushed batches, ``change`` the log, return the error of the third batch."""
    events = _events()
    backend = JsonlBackend(tmp_path / "root", compression=compression)
    backend.create(header("s"))
    with backend.open("s", "write") as handle:
        handle.append(events[:2])
        handle.flush()
        handle.append(events[2:4])
        handle.flush()
        path = _log(tmp_path / "root", compression)
        change(path)
        with pytest.raises(LogCorruptError) as info:
            handle.append(events[4:])
    assert info.value.where["path"] == str(path)
    return path, info.value


def _replace_by_copy(path: Path) -> None:
    copy = path.with_name("copy.tmp")
    copy.write_bytes(path.read_bytes())  # the same bytes, another file
    os.replace(copy, path)


@pytest.mark.parametrize("compression", BACKENDS)
def test_log_replaced_by_another_file_is_refused(tmp_path: Path, compression: str) -> None:
    path, err = _refused_after(tmp_path, compression, _replace_by_copy)
    size = path.stat().st_size
    assert f"the file was replaced by another file ({size} bytes)" in err.message
    with JsonlBackend(tmp_path / "root", compression=compression).open("s") as handle:
        assert len(handle.read().events) == 4  # nothing written into either file


@pytest.mark.parametrize("compression", BACKENDS)
def test_log_removed_under_the_writer_is_refused(tmp_path: Path, compression: str) -> None:
    path, err = _refused_after(tmp_path, compression, Path.unlink)
    assert not path.exists()
    assert "the file no longer exists" in err.message


@pytest.mark.parametrize("compression", BACKENDS)
def test_writer_that_kept_its_file_appends_and_reads_back(tmp_path: Path,
                                                          compression: str) -> None:
    events = _events()
    backend = JsonlBackend(tmp_path / "root", compression=compression)
    backend.create(header("s"))
    with backend.open("s", "write") as handle:
        for i in range(0, len(events), 3):
            handle.append(events[i:i + 3])
            handle.flush()
    with backend.open("s") as handle:
        assert [e.seq for e in handle.read().events] == list(range(len(events)))


@pytest.mark.parametrize("compression", BACKENDS)
def test_log_replaced_between_the_read_and_the_first_append_is_refused(
        tmp_path: Path, compression: str) -> None:
    # the file checked is the one read(), not the one the first append's lazy open finds:
    # before, a copy put in place after the read (same size) took the batch unrefused
    events = _events()
    backend = JsonlBackend(tmp_path / "root", compression=compression)
    backend.create(header("s"))
    with backend.open("s", "write") as handle:
        handle.append(events[:4])
        handle.flush()
    path = _log(tmp_path / "root", compression)
    with backend.open("s", "write") as handle:
        assert len(handle.read().events) == 4
        _replace_by_copy(path)
        size = path.stat().st_size
        with pytest.raises(LogCorruptError) as info:
            handle.append(events[4:])
        assert path.stat().st_size == size  # nothing written
    assert f"the file was replaced by another file ({size} bytes)" in info.value.message

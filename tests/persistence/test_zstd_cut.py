"""A Zstandard log cut inside committed data is refused, even exactly on a frame boundary.

A zstd log holds no record of how many frames it had, so a cut on a frame boundary leaves a
shorter log that parses cleanly. The listing journal (and the index it is merged into) records
the log's size and event count after each durable flush; a log whose complete frames end below
that is refused with a :class:`LogCorruptError` naming the file, the byte and the seq where its
committed data now ends. A missing, older or foreign record never refuses an intact log.
Real files. Rule: docs/rules.md#crash-safety, docs/formats.md#listing-index.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh import LogCorruptError
from dsh.persistence import _restore_point as rp
from dsh.persistence._listing import INDEX_NAME, JOURNAL_NAME
from dsh.persistence.jsonl._format import scan_zstd_frames
from tests.persistence.test_seal_missing import _write_store, user

BATCHES = 10
SIDECAR = "session.jsonl.zstd.seal"


def write(tmp_path: Path) -> tuple[str, Path]:
    """A zstd store ``tmp_path / store`` whose session ``s1`` has one frame per batch."""
    return _write_store(tmp_path, "jsonl+zstd", BATCHES)


def texts(url: str) -> list[str]:
    with dsh.open(url) as store:
        return [e["data"]["content"][0]["text"][:11] for e in store.read("s1").events]


def frame_ends(log: Path) -> list[int]:
    frames, torn = scan_zstd_frames(log.read_bytes(), path=str(log))
    assert torn is None
    return [end for _, end in frames]


def test_every_frame_boundary_cut_inside_committed_data_is_refused(tmp_path: Path) -> None:
    url, log = write(tmp_path)
    original = log.read_bytes()
    ends = frame_ends(log)
    assert len(ends) == BATCHES + 1  # the header frame, then one frame a batch
    for kept, end in enumerate(ends[:-1]):  # kept: batch frames left (events 0 .. kept - 1)
        log.write_bytes(original[:end])
        with pytest.raises(LogCorruptError) as refused:
            texts(url)
        where = refused.value.where
        assert where["path"] == str(log)
        assert where["byte_offset"] == end
        assert where["seq"] == kept
        assert "cut inside committed data" in refused.value.message
        assert f"{len(original)} bytes and {BATCHES} events durable" in refused.value.message
    log.write_bytes(original)
    assert len(texts(url)) == BATCHES


def test_a_writer_does_not_continue_a_cut_log(tmp_path: Path) -> None:
    url, log = write(tmp_path)
    original = log.read_bytes()
    log.write_bytes(original[:frame_ends(log)[6]])
    with pytest.raises(LogCorruptError), dsh.open(url) as store:
        session = store.session("s1")
        session.append("user/message", user("more"), surface_op="append")
        store.flush(session)
    assert log.read_bytes() == original[:frame_ends(log)[-1]]  # nothing written over it


def test_the_cut_is_found_after_a_listing_merged_the_journal_into_the_index(
        tmp_path: Path) -> None:
    root = tmp_path / "store"
    url, log = write(tmp_path)
    with dsh.open(url) as store:
        assert [s.id for s in store.list()] == ["s1"]
    assert (root / INDEX_NAME).is_file()
    assert not (root / JOURNAL_NAME).exists() or not (root / JOURNAL_NAME).read_bytes()
    log.write_bytes(log.read_bytes()[:frame_ends(log)[4]])
    with pytest.raises(LogCorruptError) as refused:
        texts(url)
    assert refused.value.where["seq"] == 4  # the first seq lost


def test_a_resume_through_a_restore_point_refuses_a_cut_after_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rp, "RESTORE_POINT_EVERY_EVENTS", 1)
    monkeypatch.setattr(rp, "RESTORE_POINT_EVERY_BYTES", 1)
    url, log = write(tmp_path)
    point = rp.decode_restore_point(
        log.with_name("session.jsonl.zstd.ckpt").read_bytes(), session_id="s1",
        backend="jsonl-zstd")
    ends = frame_ends(log)
    cut = next(end for end in ends if end > point.anchor.byte_offset) if any(
        end > point.anchor.byte_offset for end in ends[:-1]) else None
    if cut is None:  # the restore point is at the last batch: cut one before it instead
        cut = ends[-2]
    log.write_bytes(log.read_bytes()[:cut])
    with pytest.raises(LogCorruptError) as refused, dsh.open(url) as store:
        store.session("s1")
    assert refused.value.where["path"] == str(log)
    assert refused.value.where["byte_offset"] == cut


def test_no_journal_and_no_index_never_refuse_an_intact_log(tmp_path: Path) -> None:
    root = tmp_path / "store"
    url, log = write(tmp_path)
    for name in (JOURNAL_NAME, INDEX_NAME):
        (root / name).unlink(missing_ok=True)
    assert len(texts(url)) == BATCHES
    # without a record nor a chain sidecar a frame-boundary cut is not detectable: it reads
    # as a shorter log
    log.with_name(SIDECAR).unlink()
    log.write_bytes(log.read_bytes()[:frame_ends(log)[5]])
    assert len(texts(url)) == 5


def _forget_journal(root: Path) -> None:
    """Remove the listing journal and index (a copied store, a lost journal)."""
    for name in (JOURNAL_NAME, INDEX_NAME):
        (root / name).unlink(missing_ok=True)


@pytest.mark.parametrize("inside", [False, True], ids=["on-a-frame-boundary", "mid-frame"])
def test_the_chain_sidecar_refuses_a_cut_without_journal(tmp_path: Path, inside: bool) -> None:
    """A copied store has no journal for its file: the chain sidecar still names the cut.

    Cut mid-frame, the frames before read as a torn tail before this check: half the events
    were served and the writer appended after them (docs/rules.md#crash-safety).
    """
    root = tmp_path / "store"
    url, log = write(tmp_path)
    _forget_journal(root)
    ends = frame_ends(log)
    cut = ends[4] + 7 if inside else ends[4]
    log.write_bytes(log.read_bytes()[:cut])
    for _ in range(2):  # a read, then a writer's open: neither takes the cut as a torn tail
        with pytest.raises(LogCorruptError) as refused, dsh.open(url) as store:
            session = store.session("s1")
            session.append("user/message", user("more"), surface_op="append")
            store.flush(session)
        where = refused.value.where
        assert where["path"] == str(log)
        assert (where["byte_offset"], where["seq"]) == (ends[4], 4)
        assert f"sealed events up to seq {BATCHES - 1}" in refused.value.message
    assert len(log.read_bytes()) == cut  # nothing written over it, nothing truncated


def test_a_torn_tail_past_the_chain_is_still_a_crash(tmp_path: Path) -> None:
    """Bytes of a frame no chain record covers are what a crash tears: truncated, not refused."""
    root = tmp_path / "store"
    url, log = write(tmp_path)
    _forget_journal(root)
    log.write_bytes(log.read_bytes() + b"\x28\xb5\x2f\xfd\x00")  # a frame's first bytes
    assert len(texts(url)) == BATCHES
    with dsh.open(url) as store:
        session = store.session("s1")
        session.append("user/message", user("more"), surface_op="append")
        store.flush(session)
    with dsh.open(url) as store:
        events = store.read("s1").events
    assert [e["type"] for e in events[:BATCHES]] == ["user/message"] * BATCHES
    assert "u-more" in json.dumps([e["data"] for e in events[BATCHES:]], default=dict)


def test_a_sidecar_of_another_incarnation_never_refuses(tmp_path: Path) -> None:
    """A sidecar bound to another header frame (the id created again) is not this log's."""
    _, old_log = _write_store(tmp_path / "old", "jsonl+zstd", BATCHES)
    url, log = _write_store(tmp_path, "jsonl+zstd", 3)
    _forget_journal(tmp_path / "store")
    log.with_name(SIDECAR).write_bytes(old_log.with_name(SIDECAR).read_bytes())
    assert len(texts(url)) == 3


def test_an_older_journal_never_refuses_an_intact_log(tmp_path: Path) -> None:
    root = tmp_path / "store"
    url = f"jsonl+zstd://{root}"
    with dsh.open(url) as store:
        session = store.session("s1")
        old = b""
        for n in range(BATCHES):
            session.append("user/message", user(f"message {n:03d}"), surface_op="append")
            store.flush(session)
            if n == 4:
                old = (root / JOURNAL_NAME).read_bytes()
    (root / JOURNAL_NAME).write_bytes(old)  # as if the later lines were lost
    (root / INDEX_NAME).unlink(missing_ok=True)
    assert len(texts(url)) == BATCHES


def _journal_line(root: Path, log: Path, **change: Any) -> None:
    """Append a journal line for ``s1`` claiming more bytes than the log, with ``change``."""
    lines = [json.loads(line) for line in (root / JOURNAL_NAME).read_bytes().splitlines()]
    item = lines[-1]
    st = os.stat(log)
    item["sig"] = [st.st_size + 1000, 0, 0, st.st_ino, st.st_dev]
    item["entry"]["events"] += 5
    for key, value in change.items():
        if key == "createdAt":
            item["entry"]["header"]["createdAt"] = value
        else:
            item["entry"][key] = value
    with (root / JOURNAL_NAME).open("a") as f:
        f.write(json.dumps(item, separators=(",", ":")) + "\n")


@pytest.mark.parametrize("change", ["another session", "a rewrite", "another file"])
def test_a_record_of_another_file_or_session_never_refuses_an_intact_log(
        tmp_path: Path, change: str) -> None:
    """An inode reused by a new session of the same id, or by a rewrite that kept every event."""
    root = tmp_path / "store"
    url, log = write(tmp_path)
    if change == "another session":
        _journal_line(root, log, createdAt=12345)
    elif change == "a rewrite":
        _journal_line(root, log, events=BATCHES)
    else:
        _journal_line(root, log)
        lines = (root / JOURNAL_NAME).read_bytes().splitlines()
        item = json.loads(lines[-1])
        item["sig"][3] += 1  # another inode
        lines[-1] = json.dumps(item, separators=(",", ":")).encode()
        (root / JOURNAL_NAME).write_bytes(b"\n".join(lines) + b"\n")
    assert len(texts(url)) == BATCHES


def test_a_journal_line_still_being_written_is_not_used(tmp_path: Path) -> None:
    root = tmp_path / "store"
    url, log = write(tmp_path)
    _journal_line(root, log)
    data = (root / JOURNAL_NAME).read_bytes()
    (root / JOURNAL_NAME).write_bytes(data[:-1])  # no newline yet: the earlier line counts
    assert len(texts(url)) == BATCHES

"""Property tests of the pure JSONL format code, no disk.

Rule: docs/formats.md#layout-and-path-encoding, docs/formats.md#record-lines,
    docs/formats.md#zstandard-files, docs/formats.md#reading-the-committed-region.

Example counts: ``DSH_HYPOTHESIS_EXAMPLES`` (default 25).
"""

from __future__ import annotations

from typing import Any

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh._errors import LogCorruptError
from dsh.json import snapshot_json
from dsh.persistence.jsonl._format import (
    Scanner,
    encode_header_line,
    encode_records,
    encode_segment,
    parse_header_strict,
    scan_zstd_frames,
)
from dsh.session._events import Event

from .conftest import HYPOTHESIS_EXAMPLES

pytestmark = pytest.mark.no_speedups

HEADER = {"version": 0, "id": "s", "createdAt": 1, "cwd": "/w"}
TRICKY = st.sampled_from(["\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e",
                          "\r", "\n", "\ud800", "\udfff", '"', "\\", "é", "😀", "a"])
TEXT = st.lists(TRICKY, max_size=6).map("".join)


@st.composite
def logs(draw: Any) -> list[Event]:
    """Logs mixing packable text-delta runs and other events."""
    events: list[Event] = []
    for _ in range(draw(st.integers(0, 12))):
        seq = len(events)
        if draw(st.booleans()):
            events.append(Event({"type": "assistant/chunk", "seq": seq,
                                 "time": draw(st.integers(0, 10**13)),
                                 "data": {"turn": 1, "step": 1, "chunk": {
                                     "type": "text-delta", "index": 0, "text": draw(TEXT)}}}))
        else:
            events.append(Event({"type": "todo/write", "seq": seq, "time": 5,
                                 "data": {"t": draw(TEXT),
                                          "n": draw(st.integers(-(2**53 - 1), 2**53 - 1))}}))
    # the snapshot joins a surrogate pair held as two code points (JS string semantics)
    return [Event(snapshot_json(e)) for e in events]


def scan(text: bytes) -> Any:
    header = encode_header_line(HEADER)
    scanner = Scanner(path="mem", start_offset=len(header))
    scanner.feed(text)
    return scanner.finish()


@settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None)
@given(logs(), st.booleans(), st.lists(st.integers(1, 40), max_size=4))
def test_format_records_round_trip_in_any_chunking(events: list[Event], pack: bool,
                                                   cuts: list[int]) -> None:
    # docs/formats.md#record-lines packing is lossless; docs/formats.md#reading-the-committed-region
    # the scanner is chunking-blind; one physical line per record
    body = encode_records(events, pack_chunks=pack)
    header = encode_header_line(HEADER)
    scanner = Scanner(path="mem", start_offset=len(header))
    pos = 0
    for cut in cuts:
        scanner.feed(body[pos:pos + cut])
        pos += cut
    scanner.feed(body[pos:])
    result = scanner.finish()
    assert result.events == events
    assert result.committed == len(header) + len(body)
    assert result.reason is None
    assert body.count(b"\n") == (len(events) if not pack else body.count(b"\n"))
    body.decode("utf-8")


@settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None)
@given(logs(), st.booleans(), st.data())
def test_format_any_truncation_is_a_torn_tail_never_an_error(events: list[Event], pack: bool,
                                                             data: Any) -> None:
    # docs/formats.md#reading-the-committed-region: a crash can only cut the final record; the
    # prefix up to the last newline survives
    body = encode_records(events, pack_chunks=pack)
    cut = data.draw(st.integers(0, len(body)))
    result = scan(body[:cut])
    kept = body[:cut].rfind(b"\n") + 1
    header_len = len(encode_header_line(HEADER))
    assert result.committed == header_len + kept
    assert result.events == events[:len(result.events)]
    assert (result.reason is None) == (cut == kept)


def test_format_duplicate_seq_names_both_lines() -> None:
    events = [Event({"type": "todo/write", "seq": i, "time": 1, "data": {}}) for i in range(3)]
    body = encode_records([*events, events[1]], pack_chunks=False)
    with pytest.raises(LogCorruptError, match="seq 1 appears on line 3 and again on line 5"):
        scan(body)


def test_format_header_requires_exactly_one_line() -> None:
    # docs/formats.md#jsonl "requires exactly one newline-terminated header record"
    for bad in (b"", b'{"type":"session"}', b"\n"):
        with pytest.raises(LogCorruptError):
            parse_header_strict(bad, path="mem")


@settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=4), st.data())
def test_format_zstd_walker_splits_frames_and_finds_torn_start(payloads: list[bytes],
                                                               data: Any) -> None:
    # docs/formats.md#zstandard-files structural frame scanner: complete frames, then the start of a
    # torn one
    cctx = zstandard.ZstdCompressor(level=3, write_checksum=True)
    frames = [cctx.compress(p) for p in payloads]
    blob = b"".join(frames)
    cut = data.draw(st.integers(0, len(blob)))
    found, torn = scan_zstd_frames(blob[:cut], path="mem")
    ends = []
    pos = 0
    for frame in frames:
        pos += len(frame)
        ends.append(pos)
    complete = [e for e in ends if e <= cut]
    assert [e for _, e in found] == complete
    start = complete[-1] if complete else 0
    assert torn == (None if start == cut else start)


def test_format_zstd_walker_rejects_skippable_frames() -> None:
    skippable = (0x184D2A50).to_bytes(4, "little") + (0).to_bytes(4, "little")
    with pytest.raises(LogCorruptError, match="invalid frame magic at byte 0"):
        scan_zstd_frames(skippable, path="mem")


@settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None)
@given(st.text(min_size=1, max_size=8), st.text(min_size=1, max_size=8))
def test_format_encode_segment_is_injective(a: str, b: str) -> None:
    # docs/formats.md#layout-and-path-encoding "encodeSegment is injective over UTF-16"
    if a != b:
        assert encode_segment(a) != encode_segment(b)
    assert "/" not in encode_segment(a) and encode_segment(a) not in (".", "..")

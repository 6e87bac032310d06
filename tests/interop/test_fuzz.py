"""Fuzzed transcripts: every importer succeeds or raises ImportFormatError, for any bytes.

Each example takes a real transcript of one format (the bundled examples, plus the corpus when
it is present), damages it (values replaced by hostile JSON at random places, or bytes cut,
flipped or inserted) and imports it with that format and with detection. The outcome must be a
session that seeds (``to_session``) or an ``ImportFormatError`` naming the file; never another
exception, and never ``IMPORT_UNMAPPED`` (the backstop for shapes no importer check covers: each
one found is a missing check). ``DSH_FUZZ_EXAMPLES`` sets the examples per format (default 25).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh._errors import ImportFormatError
from dsh._verify import verify_events
from dsh.interop import FORMATS, import_file
from dsh.interop._common import UNMAPPED_CODE
from tests.interop.helpers import CORPUS, EXAMPLES

FUZZ_EXAMPLES = int(os.environ.get("DSH_FUZZ_EXAMPLES", "25"))

_CORPUS_LIMIT = 300_000  # bytes: big corpus files make each example slow, not more thorough


FIXTURES = Path(__file__).parent / "fixtures"


def _seeds(fmt: str) -> list[Path]:
    found = sorted(p for root in (EXAMPLES, FIXTURES) for p in (root / fmt).glob("*")
                   if p.is_file())
    if (CORPUS / fmt).is_dir():
        found += sorted(p for p in (CORPUS / fmt).rglob("*") if p.is_file()
                        and p.suffix in (".json", ".jsonl", ".traj")
                        and p.stat().st_size < _CORPUS_LIMIT)
    if fmt == "mini-swe-agent" and (CORPUS / "swe-agent").is_dir():
        found += sorted((CORPUS / "swe-agent").glob("mini-*"))
    return found


_HOSTILE_SCALARS = st.sampled_from([
    None, True, False, 0, -1, 1.5, -0.5, 1e300, 2**53 - 1, -(2**53 - 1), "", "x", "\ud800",
    "\udfff\ud800", "user", "assistant", "system", "tool", "tool_use", "tool_result", "thinking",
    "message", "function_call", "reasoning", "compact_boundary", "2025-01-01T00:00:00Z",
    "-1", "1e999", "abc", "\u2028", "{{sessionId}}", "x" * 300])
_KEYS = st.sampled_from(["type", "role", "content", "id", "uuid", "parentUuid", "message",
                         "usage", "tool_calls", "payload", "text", "name", "input", "call_id",
                         "tool_use_id", "input_tokens", "timestamp", "history", "x"])
_HOSTILE = st.recursive(
    _HOSTILE_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=3),
    max_leaves=8)


_DEEP = "deep-nesting-goes-here"
"""Placeholder replaced in the text by thousands of nested arrays (json.dumps would recurse)."""


def _places(value: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) pair inside ``value`` (iterative; depth-first order)."""
    out: list[tuple[Any, Any]] = []
    stack = [value]
    while stack:
        current = stack.pop()
        items = (list(current.items()) if isinstance(current, dict)
                 else list(enumerate(current)) if isinstance(current, list) else [])
        for key, child in items:
            out.append((current, key))
            stack.append(child)
    return out


@st.composite
def _damaged(draw: st.DrawFn, source: Path) -> bytes:
    raw = source.read_bytes()
    if draw(st.booleans()):
        # Byte damage: cut, flip or insert at a random offset.
        at = draw(st.integers(0, max(len(raw) - 1, 0)))
        how = draw(st.sampled_from(["cut", "flip", "insert"]))
        if how == "cut":
            return raw[:at]
        if how == "flip":
            return raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1:]
        return raw[:at] + draw(st.sampled_from([b"\n", b"{", b"]", b"\"", b"\\", b"\xff",
                                                b"\\ud800", b"\r"])) + raw[at:]
    jsonl = source.suffix == ".jsonl"
    records: list[Any] = ([json.loads(x) for x in raw.split(b"\n") if x.strip()] if jsonl
                          else [json.loads(raw)])
    for _ in range(draw(st.integers(1, 3))):
        places = _places(records)
        container, key = places[draw(st.integers(0, len(places) - 1))]
        container[key] = _DEEP if draw(st.integers(0, 19)) == 0 else draw(_HOSTILE)
    if draw(st.booleans()) and len(records) > 1:
        # Reorder: a line moved elsewhere (transcripts are appended out of order in the field).
        moved = records.pop(draw(st.integers(0, len(records) - 1)))
        records.insert(draw(st.integers(0, len(records))), moved)
    text = "\n".join(json.dumps(r) for r in records) + ("\n" if jsonl else "")
    depth = draw(st.sampled_from([600, 5000]))
    text = text.replace(f'"{_DEEP}"', "[" * depth + "0" + "]" * depth)
    return text.encode("utf-8", "surrogatepass")


def _assert_typed_or_success(path: Path, fmt: str) -> None:
    try:
        for top in import_file(path, fmt):
            for imported in top.walk():
                imported.to_session(clock=lambda: 0)
                assert verify_events(imported.events, header=imported.header) == []
    except ImportFormatError as error:
        assert error.where.get("path") is not None, error
        assert error.code != UNMAPPED_CODE, f"an importer check is missing: {error}"


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "anthropic"] + ["anthropic"])
@settings(max_examples=FUZZ_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_fuzzed_transcript_imports_or_raises_import_format_error(
        tmp_path: Path, fmt: str, data: st.DataObject) -> None:
    seeds = [p for p in _seeds(fmt) if p.suffix not in (".yaml", ".yml")]
    if not seeds:
        pytest.skip(f"no {fmt} transcript to fuzz")
    source = data.draw(st.sampled_from(seeds))
    path = tmp_path / source.name
    path.write_bytes(data.draw(_damaged(source)))
    _assert_typed_or_success(path, fmt)
    _assert_typed_or_success(path, "auto")

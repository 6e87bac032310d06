"""A SeedStream keeps two bytes of type per settled event (docs/interop.md#streaming-imports).

The settled part serves earlier events' types to later checks; it must give back every type
exactly, past 65,536 kinds too (the codes widen to four bytes).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dsh.session._session import _rewrites_a_result, _SettledTypes


def test_settled_types_are_served_back_exactly() -> None:
    settled = _SettledTypes(None)
    names = [f"import/x/kind-{n % 70_000}" for n in range(140_000)]
    settled.extend(names[:1_000])
    assert settled.codes.typecode == "H"
    settled.extend(names[1_000:])
    assert settled.codes.typecode == "I" and len(settled) == 140_000
    assert [e["type"] for e in settled.read(0, 140_000)] == names
    assert [e["seq"] for e in settled.read(69_998, 70_002)] == [69_998, 69_999, 70_000, 70_001]


def test_settled_types_of_kinds_named_before_are_served_back() -> None:
    """A batch of kinds all named before (the codes' fast path) keeps them in order."""
    settled = _SettledTypes(None)
    settled.extend(["a", "b", "c"])
    settled.extend(["c", "a", "a", "b"])
    assert settled.codes.typecode == "H" and list(settled.codes) == [0, 1, 2, 2, 0, 0, 1]
    assert [e["type"] for e in settled.read(0, 7)] == ["a", "b", "c", "c", "a", "a", "b"]


class _View(Mapping[str, Any]):
    """A read-only mapping that is no dict."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


class _Str(str):
    """A str subclass: no mapping, but not an exact str either."""


_ITEM = st.one_of(
    st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(["tool/result", "user/message", 3, None]),
        "surfaceOp": st.sampled_from([{"op": "replace"}, "append", None, ["x"], {}, "", 0,
                                      _Str("append"), _View({"op": "replace"}), _View({})])}),
    st.just([]), st.just("tool/result"), st.none())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_ITEM, st.booleans()), max_size=6))
def test_a_result_rewrite_is_told_as_the_exact_test_does(items: list[tuple[Any, bool]]) -> None:
    """The C-level shortcut of SeedStream.admit gives the per-event test's answer on batches
    of dicts, other mappings and non-mappings (docs/rules.md#seed-validation)."""
    batch = [_View(item) if view and isinstance(item, dict) else item for item, view in items]
    exact = any(isinstance(event, Mapping) and event.get("type") == "tool/result"
                and isinstance(event.get("surfaceOp"), Mapping) for event in batch)
    assert _rewrites_a_result(batch) is exact


def test_a_batch_of_appends_with_a_result_has_no_rewrite_and_a_mapping_op_does() -> None:
    """An import's batch (results and messages appended: surfaceOp "append" or none) is told
    by the surfaceOp types; one mapping op among them, even an empty one, is a rewrite."""
    batch: list[Any] = [
        {"type": "user/message", "surfaceOp": "append"}, {"type": "tool/call"},
        {"type": "tool/result", "surfaceOp": "append"}, {"type": "turn/end"}]
    assert _rewrites_a_result(batch) is False
    assert _rewrites_a_result([*batch, {"type": "tool/result", "surfaceOp": {}}]) is True
    assert _rewrites_a_result([*batch, {"type": "tool/result",
                                        "surfaceOp": _View({"op": "replace"})}]) is True
    # a mapping op on another type is no rewrite
    assert _rewrites_a_result([*batch, {"type": "user/message", "surfaceOp": {}}]) is False

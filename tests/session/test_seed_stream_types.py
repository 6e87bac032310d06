"""A SeedStream keeps two bytes of type per settled event (docs/interop.md#streaming-imports).

The settled part serves earlier events' types to later checks; it must give back every type
exactly, past 65,536 kinds too (the codes widen to four bytes).
"""

from __future__ import annotations

from dsh.session._session import _SettledTypes


def test_settled_types_are_served_back_exactly() -> None:
    settled = _SettledTypes(None)
    names = [f"import/x/kind-{n % 70_000}" for n in range(140_000)]
    settled.extend(names[:1_000])
    assert settled.codes.typecode == "H"
    settled.extend(names[1_000:])
    assert settled.codes.typecode == "I" and len(settled) == 140_000
    assert [e["type"] for e in settled.read(0, 140_000)] == names
    assert [e["seq"] for e in settled.read(69_998, 70_002)] == [69_998, 69_999, 70_000, 70_001]

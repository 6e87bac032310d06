"""Lossless JSON: docs/formats.md#lossless-json, docs/rules.md#immutability."""

from __future__ import annotations

import copy
import math
from collections import OrderedDict, UserDict, defaultdict
from dataclasses import dataclass
from typing import Any

import pytest

from dsh._errors import InvalidJsonError
from dsh.json import (
    MAX_SAFE_INTEGER,
    FrozenDict,
    FrozenList,
    dumps,
    dumps_canonical,
    is_json,
    is_safe_int,
    json_equal,
    loads,
    snapshot_json,
    thaw,
)
from dsh.session._events import Event

pytestmark = pytest.mark.no_speedups

DEEP = 20_000


def nested_lists(depth: int) -> list[Any]:
    root: list[Any] = []
    cur = root
    for _ in range(depth - 1):
        nxt: list[Any] = []
        cur.append(nxt)
        cur = nxt
    return root


def nested_dicts(depth: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    cur = root
    for _ in range(depth - 1):
        nxt: dict[str, Any] = {}
        cur["k"] = nxt
        cur = nxt
    return root


def rejected(value: Any, path: str = "$") -> InvalidJsonError:
    with pytest.raises(InvalidJsonError) as info:
        snapshot_json(value)
    assert info.value.where["json_path"] == path
    assert info.value.code == "INVALID_JSON"
    assert is_json(value) is False
    return info.value


# --- scalars -------------------------------------------------------------------------------


def test_json_copies_the_complete_scalar_vocabulary_and_rejects_unsupported_scalars() -> None:
    # docs/formats.md#lossless-json "copies the complete JSON scalar vocabulary and rejects
    # unsupported scalars"
    for value in (None, True, False, "", "text", 1.25, 0, -7, 0.0):
        assert snapshot_json(value) == value
        assert type(snapshot_json(value)) is type(value) or type(value) is float
        assert is_json(value) is True
    rejected(-0.0)
    rejected(math.nan)
    rejected(math.inf)
    rejected(-math.inf)
    for exotic in (b"x", bytearray(b"x"), object(), len, lambda: 1, 1j, ..., NotImplemented):
        rejected(exotic)


def test_json_rejects_negative_zero_with_its_json_path() -> None:
    error = rejected({"a": [1, {"b": -0.0}]}, "$.a[1].b")
    assert "-0.0" in error.message


def test_json_rejects_integers_beyond_the_safe_range() -> None:
    # docs/formats.md#lossless-json: a JavaScript reader would round them
    for ok in (MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER, 0):
        assert snapshot_json(ok) == ok
    rejected(MAX_SAFE_INTEGER + 1)
    rejected(-MAX_SAFE_INTEGER - 1)
    rejected({"n": 2**60}, "$.n")
    rejected([1, 2**70], "$[1]")


def test_json_normalises_integral_floats_to_int() -> None:
    # docs/formats.md#lossless-json: dsh writes 5, not 5.0
    assert type(snapshot_json(5.0)) is int
    assert snapshot_json([2.0, 2.5]) == [2, 2.5]
    assert type(snapshot_json([2.0])[0]) is int
    assert dumps(snapshot_json({"t": 1e3})) == b'{"t":1000}'
    # beyond the safe range an integral float stays a float (it is what JS would hold)
    assert type(snapshot_json(1e300)) is float


def test_json_bool_is_never_a_number() -> None:
    # docs/formats.md#lossless-json
    assert json_equal(True, 1) is False
    assert json_equal(False, 0) is False
    assert json_equal([True], [1]) is False
    assert json_equal({"a": 0}, {"a": False}) is False
    assert json_equal(1, 1.0) is True
    assert json_equal({"a": [1, {"b": None}]}, {"a": [1.0, {"b": None}]}) is True
    assert json_equal(None, False) is False
    assert is_safe_int(True) is False
    assert is_safe_int(False) is False
    assert is_safe_int(1) is True
    assert is_safe_int(MAX_SAFE_INTEGER + 1) is False
    assert type(snapshot_json(True)) is bool
    assert type(loads(b"true")) is bool


def test_json_recognizes_supported_scalars_and_rejects_every_lossy_scalar_case() -> None:
    # docs/formats.md#lossless-json "recognizes supported scalars and rejects every lossy scalar
    # case" (isJsonValue)
    assert [is_json(v) for v in (None, True, "s", 1, 1.5)] == [True] * 5
    assert [is_json(v) for v in (-0.0, math.nan, math.inf, -math.inf, 2**53, b"", 1j)] == \
        [False] * 7


# --- containers ----------------------------------------------------------------------------


def test_json_recursively_detaches_dense_arrays_and_plain_objects() -> None:
    # docs/formats.md#lossless-json "recursively detaches dense arrays and plain or null-prototype
    # objects"
    shared = {"x": [1, 2]}
    source = {"a": shared, "b": shared, "c": [shared]}
    snap = snapshot_json(source)
    assert snap == source
    assert isinstance(snap, FrozenDict)
    assert isinstance(snap["c"], FrozenList)
    assert snap is not source
    assert snap["a"] is not shared  # shared references are allowed and copied
    shared["x"].append(3)  # the snapshot is detached from its source
    assert snap["a"]["x"] == [1, 2]
    assert snap["b"]["x"] == [1, 2]


def test_json_accepts_deeply_nested_valid_json_without_using_the_call_stack() -> None:
    # docs/formats.md#lossless-json "accepts deeply nested valid JSON without using the JavaScript
    # call stack" (5,000) and docs/formats.md#lossless-json (20,000 levels must work), for every
    # entry point
    for depth in (5_000, DEEP):
        for value in (nested_lists(depth), nested_dicts(depth)):
            snap = snapshot_json(value)
            assert is_json(value) is True
            wire = dumps(snap)
            assert len(wire) > 2 * depth - 1
            back = loads(wire)
            # (Python's own == recurses, so compare with the iterative json_equal)
            assert json_equal(loads(wire.decode()), back)
            assert json_equal(back, value)
            assert json_equal(thaw(back), value)
            assert dumps(back) == wire
    # the depth really is 20,000
    value = loads(b"[" * DEEP + b"]" * DEEP)
    levels = 0
    while value:
        value = value[0]
        levels += 1
    assert levels == DEEP - 1


def test_json_rejects_exotic_containers_cycles_and_invalid_children() -> None:
    # docs/formats.md#lossless-json "rejects exotic containers, sparse or decorated arrays, cycles,
    # and invalid children" - Python analogues (docs/formats.md#lossless-json): tuples, sets, bytes,
    # subclasses, objects

    class ListSub(list[Any]):
        pass

    class DictSub(dict[str, Any]):
        pass

    @dataclass
    class Point:
        x: int

    exotic: list[Any] = [(1, 2), {1, 2}, frozenset(), b"x", bytearray(), ListSub(), DictSub(),
                         OrderedDict(a=1), defaultdict(list), UserDict(), Point(1), range(3),
                         object()]
    for value in exotic:
        rejected(value)
        rejected({"nested": [value]}, "$.nested[0]")
    cycle: list[Any] = []
    cycle.append(cycle)
    rejected(cycle, "$[0]")
    loop: dict[str, Any] = {}
    loop["x"] = {"y": loop}
    rejected(loop, "$.x.y")
    rejected([1, {"v": math.nan}], "$[1].v")


def test_json_rejects_non_string_keys() -> None:
    # docs/formats.md#lossless-json: JSON would stringify them silently
    for key in (1, 1.5, None, True, (1,)):
        error = rejected({key: 1})
        assert "not a string" in error.message
    rejected({"ok": {2: "x"}}, "$.ok")


def test_json_preserves_a_literal_proto_key() -> None:
    # docs/formats.md#lossless-json "preserves a literal __proto__ JSON key without changing the
    # snapshot prototype"
    snap = loads(b'{"__proto__":{"x":1},"a":2}')
    assert list(snap) == ["__proto__", "a"]
    assert type(snap) is FrozenDict
    assert dumps(snap) == b'{"__proto__":{"x":1},"a":2}'


def test_json_accepts_dense_arrays_and_plain_objects() -> None:
    # docs/formats.md#lossless-json "accepts dense arrays and plain objects, including
    # null-prototype records"
    assert is_json([1, "a", None, [], {}]) is True
    assert is_json({"a": {"b": [True]}}) is True
    assert is_json(snapshot_json({"frozen": [1]})) is True


def test_json_rejects_invalid_children_exotic_objects_and_cycles_in_is_json() -> None:
    # docs/formats.md#lossless-json "rejects sparse or decorated arrays, invalid children, exotic
    # objects, and cycles"
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle
    assert [is_json(v) for v in ([(1,)], {"a": {1}}, cycle, [object()])] == [False] * 4


def test_json_accepts_its_own_frozen_containers_and_keeps_event_types() -> None:
    # docs/formats.md#lossless-json: seeds are often other sessions' frozen events
    frozen = snapshot_json({"a": [1, {"b": 2}]})
    assert snapshot_json(frozen) == frozen
    event = Event(snapshot_json({"type": "turn/start", "seq": 0, "time": 1,
                                 "data": {"turn": 1}}))
    again = snapshot_json(event)
    assert type(again) is Event
    assert again == event


def test_json_snapshot_preserves_key_order() -> None:
    # docs/formats.md#lossless-json: the copy follows the source's insertion order (Python has no
    # integer-key hoisting)
    snap = snapshot_json({"z": 1, "a": 2, "10": 3, "2": 4})
    assert list(snap) == ["z", "a", "10", "2"]
    assert dumps(snap) == b'{"z":1,"a":2,"10":3,"2":4}'


# --- freezing ------------------------------------------------------------------------------


def test_json_mutation_of_frozen_containers_raises_type_error() -> None:
    # docs/rules.md#immutability: tests assert the TypeError
    snap = snapshot_json({"d": {"k": 1}, "l": [1, 2, 3]})
    d, lst = snap["d"], snap["l"]
    dict_mutations = [
        lambda: d.__setitem__("k", 2), lambda: d.__delitem__("k"), d.clear,
        lambda: d.pop("k"), d.popitem, lambda: d.setdefault("n", 1),
        lambda: d.update({"n": 1}),
    ]
    list_mutations = [
        lambda: lst.__setitem__(0, 9), lambda: lst.__delitem__(0), lambda: lst.append(4),
        lambda: lst.extend([4]), lambda: lst.insert(0, 0), lst.pop, lambda: lst.remove(1),
        lst.reverse, lst.sort, lst.clear, lambda: lst.__setitem__(slice(0, 1), [7]),
        lambda: lst.__delitem__(slice(0, 2)),
    ]
    for mutate in dict_mutations + list_mutations:
        with pytest.raises(TypeError):
            mutate()
    with pytest.raises(TypeError):
        d |= {"n": 1}
    with pytest.raises(TypeError):
        lst += [4]
    with pytest.raises(TypeError):
        lst *= 2
    assert snap == {"d": {"k": 1}, "l": [1, 2, 3]}
    assert isinstance(lst[0:2], FrozenList)  # slices stay frozen
    assert copy.copy(d) is d
    assert copy.deepcopy(lst) is lst
    changed = {**d, "k": 2}  # the documented way to make a changed copy
    assert changed == {"k": 2} and type(changed) is dict


def test_json_frozen_containers_cannot_be_reinitialised() -> None:
    d = snapshot_json({"a": 1})
    lst = snapshot_json([1, 2])
    with pytest.raises(TypeError):
        d.__init__(b=2)
    with pytest.raises(TypeError):
        lst.__init__([9])


def test_json_thaw_returns_plain_mutable_copies() -> None:
    snap = snapshot_json({"a": [1, {"b": 2}]})
    plain = thaw(snap)
    assert type(plain) is dict and type(plain["a"]) is list and type(plain["a"][1]) is dict
    plain["a"][1]["b"] = 3
    assert snap["a"][1]["b"] == 2


# --- strings and surrogates ----------------------------------------------------------------


def test_json_lone_surrogates_survive_dumps_and_loads_as_valid_utf8() -> None:
    # docs/formats.md#lossless-json: dsh writes lone surrogates; our bytes must stay valid UTF-8
    value = snapshot_json({"k\udc00": ["a\ud800b", "\udfff", "tail\ud83d"]})
    wire = dumps(value)
    wire.decode("utf-8")  # strict: raises if the bytes were not valid UTF-8
    assert b"\\ud800" in wire and b"\\udc00" in wire and b"\\udfff" in wire
    back = loads(wire)
    assert back == value
    assert back["k\udc00"][0] == "a\ud800b"
    assert loads(b'"\\ud800"') == "\ud800"
    assert loads('"\\udfff"') == "\udfff"


def test_json_a_valid_escaped_surrogate_pair_decodes_to_one_code_point() -> None:
    decoded = loads(b'"\\ud83d\\ude00"')
    assert decoded == "\U0001f600"
    assert len(decoded) == 1
    # a pair held as two code points is joined the way JavaScript sees it
    assert snapshot_json("\ud83d\ude00") == "\U0001f600"
    assert dumps("\U0001f600") == "\"\U0001f600\"".encode()


def test_json_records_split_on_newline_bytes_only() -> None:
    # docs/formats.md#lossless-json: U+2028, U+2029, U+0085, VT, FF, FS.. stay inside one record
    tricky = "a\u2028b\u2029c\u0085d\x0be\x0cf\x1cg\x1dh\x1ei\rj\nk"
    records = [snapshot_json({"t": tricky}), snapshot_json(["\u2028"]), snapshot_json("x")]
    blob = b"".join(dumps(r) + b"\n" for r in records)
    assert b"\xe2\x80\xa8" in blob  # U+2028 is written raw, as JSON.stringify does
    lines = blob.split(b"\n")
    assert lines[-1] == b""
    assert [loads(line) for line in lines[:-1]] == records
    # str.splitlines would have cut the first record apart: this is why readers must not use it
    assert len(blob.decode().splitlines()) > len(records)


def test_json_dumps_is_compact_and_keeps_insertion_order() -> None:
    assert dumps(snapshot_json({"b": [1, 2.5, None, True], "a": "x"})) == \
        b'{"b":[1,2.5,null,true],"a":"x"}'
    assert dumps(snapshot_json("\x00\t\"\\")) == b'"\\u0000\\t\\"\\\\"'


# --- decoding ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [b"NaN", b"Infinity", b"-Infinity", b"[1e400]", b"-1e400",
                                  b'{"a":NaN}', b"9007199254740992", b"-9007199254740992",
                                  b"[1,]", b"", b"{", b'{"a" 1}', b"01", b"tru"])
def test_json_loads_refuses_non_json_and_lossy_numbers(text: bytes) -> None:
    with pytest.raises(InvalidJsonError):
        loads(text)


def test_json_loads_refuses_lossy_numbers_in_the_fallback_path_too() -> None:
    # a lone surrogate forces the iterative fallback parser; it must apply the same rules
    for text in (b'["\\ud800", NaN]', b'["\\ud800", 1e400]', b'["\\ud800", 9007199254740993]',
                 b'["\\ud800"] x', b'["\\ud800", 01]'):
        with pytest.raises(InvalidJsonError):
            loads(text)
    assert loads(b'["\\ud800", 1E+2, 1.5, -0]') == ["\ud800", 100, 1.5, 0]


def test_json_loads_returns_frozen_validated_values() -> None:
    value = loads(b'{"a":[1,2.0,{"b":null}],"c":"\\u00e9"}')
    assert value == {"a": [1, 2, {"b": None}], "c": "\u00e9"}
    assert isinstance(value, FrozenDict) and isinstance(value["a"], FrozenList)
    assert type(value["a"][1]) is int
    assert loads(b"9007199254740991") == MAX_SAFE_INTEGER
    assert loads(b"-0") == 0


def test_json_loads_reports_invalid_utf8_as_invalid_json() -> None:
    for text in (b'"\xff"', b'"\xed\xa0\x80"', b'"\xc3"'):
        with pytest.raises(InvalidJsonError):
            loads(text)


def test_json_dumps_refuses_values_a_snapshot_would_refuse() -> None:
    for value in (math.nan, math.inf, [-math.inf], -0.0, 2**60):
        with pytest.raises(InvalidJsonError):
            dumps(value)


def test_json_loads_refuses_integers_beyond_64_bits_instead_of_rounding_them() -> None:
    # orjson reads such literals as floats; dsh.json must refuse them like 2^53+1 (adversarial
    # report), while a float literal of the same size stays a float.
    for text in (b"99999999999999999999", b"-9223372036854775809",
                 b'{"n": [18446744073709551616]}'):
        with pytest.raises(InvalidJsonError):
            loads(text)
    assert loads(b"1e20") == 1e20
    assert loads(b'"12345678901234567890123"') == "12345678901234567890123"
    # a long digit run opening a string (LangGraph's zero-padded channel versions) is a string,
    # one elsewhere still reaches the exact parser, in the C row decoder too
    version = "00000000000000000000000000000501.0.8355049401036679"
    assert loads(f'{{"v": "{version}", "w": ["{version}"]}}'.encode()) == {
        "v": version, "w": [version]}
    for text in (b'[1, 99999999999999999999]', b'{"n":\n -99999999999999999999}'):
        with pytest.raises(InvalidJsonError):
            loads(text)


def test_json_snapshot_of_a_huge_int_raises_invalid_json_not_value_error() -> None:
    with pytest.raises(InvalidJsonError, match="of 16610 bits"):
        snapshot_json(10**5000)


def test_json_event_pickles_as_an_event() -> None:
    import pickle

    from dsh.session._events import Event, make_event

    event = make_event("turn/start", 0, 1, snapshot_json({"turn": 1}))
    again = pickle.loads(pickle.dumps(event))
    assert type(again) is Event and again == event and again.seq == 0


def test_the_long_number_scan_answers_as_its_regex() -> None:
    # has_long_number is the fast form of _LONG_NUMBER's search (a translate and a substring
    # search); every run of digits, quotes and other bytes must get the regex's answer
    import random

    from dsh.json import _LONG_NUMBER, has_long_number

    rng = random.Random(21)
    pieces = [b"0", b"7", b'"', b"a", b",", b"-", b".", b" ", b"e", b"[", b":", b"+", b"_"]
    for _ in range(20000):
        raw = b"".join(rng.choice(pieces) if rng.random() < 0.15
                       else bytes([rng.randrange(48, 58)]) for _ in range(rng.randrange(60)))
        assert has_long_number(raw) == (_LONG_NUMBER.search(raw) is not None), raw
    assert has_long_number(b'{"n": 1234567890123456789}')
    assert not has_long_number(b'{"v": "00000000000000000000000000000012.0.5"}')
    assert has_long_number(b'["00000000000000000000000000000012", 1234567890123456789]')


# LangGraph channel versions: f"{v:032}.{random float:016}", 19+ digits after the second '.'
_VERSION = b"00000000000000000000000000000002.0.30191874065201247171"


@pytest.mark.parametrize("text", [
    b'{"channel_versions":{"messages":"' + _VERSION + b'"}}',
    b'{"id":"run_12345678901234567890123"}', b'{"path":"/a/12345678901234567890"}',
    b"[0.12345678901234567890123]", b'{"f":-3.99999999999999999999999999}',
])
def test_digit_runs_no_integer_can_hold_skip_the_long_number_path(text: bytes) -> None:
    # docs/formats.md#lossless-json: a run after a byte no integer literal follows ('"', '.',
    # a letter, '/') is in a string or a fraction: orjson parses it, with the exact parser's
    # value (a fraction rounds to the same float)
    from dsh.json import _parse_fallback, has_long_number, loads
    assert not has_long_number(text)
    assert thaw(loads(text)) == _parse_fallback(text.decode())


@pytest.mark.parametrize("text", [
    b"12345678901234567890", b"[12345678901234567890]", b'{"n":-12345678901234567890}',
    b'{"n": 12345678901234567890}', b"[1,\n12345678901234567890]", b"[1e+0000000000000000001]",
    b"[1E0000000000000000001]", b"[12345678901234567890.5]",
])
def test_digit_runs_an_integer_literal_may_hold_take_the_exact_path(text: bytes) -> None:
    from dsh.json import has_long_number
    assert has_long_number(text)


_PLAIN_CASES = [
    b'{"a":1.0,"b":[2e3,1.5,{"c":-1.0}]}', b"[9007199254740991]", b"[9007199254740992]",
    b"[12345678901234567890]", b'{"id":"1234567890123456789012"}', b"[1e400]", b"1e400",
    b'{"a":-0.0}', b"[-0.0]", b"-0.0", b"3.0", b"3", b'"x"', b"null", b'"\\ud800"',
    b'{"a":"\\ud83d\\ude00"}', b"[1,]", b"NaN", b'{"k":1e16}', b"[-9007199254740992.0]",
    b'{"a":1,"a":2}',
]


@pytest.mark.parametrize("text", _PLAIN_CASES)
def test_loads_plain_is_thawed_loads(text: bytes) -> None:
    from dsh.json import loads_plain

    def outcome(decode: Any) -> tuple[str, Any]:
        try:
            value = decode(text)
        except InvalidJsonError as error:
            return "refused", error.message
        return "value", (value, type(value).__name__)

    assert outcome(loads_plain) == outcome(lambda data: thaw(loads(data)))
    if outcome(loads_plain)[0] == "value" and isinstance(loads_plain(text), dict | list):
        assert type(loads_plain(text)) in (dict, list)  # plain and mutable, not frozen


def test_dumps_canonical_gives_the_same_bytes_whatever_the_key_order() -> None:
    # docs/formats.md#the-seal-chain: the hashed form of an event does not depend on the order
    # a store gives its fields back in
    a = {"type": "x", "seq": 1, "surfaceOp": "append", "sourceEventSeqs": [2],
         "data": {"b": 1, "a": {"d": [1, {"z": 0, "y": None}], "c": "t"}}}
    b = {"data": {"a": {"c": "t", "d": [1, {"y": None, "z": 0}]}, "b": 1}, "seq": 1,
         "sourceEventSeqs": [2], "type": "x", "surfaceOp": "append"}
    assert dumps_canonical(a) == dumps_canonical(b) == (
        b'{"data":{"a":{"c":"t","d":[1,{"y":null,"z":0}]},"b":1},"seq":1,'
        b'"sourceEventSeqs":[2],"surfaceOp":"append","type":"x"}')
    assert dumps(a) != dumps(b)
    # a lone surrogate takes the iterative encoder: still sorted, still valid UTF-8
    lone = {"z": "\udc80", "a": [{"y": 1, "b": 2}]}
    assert dumps_canonical(lone) == b'{"a":[{"b":2,"y":1}],"z":"\\udc80"}'

"""The optional C accelerator ``dsh._speedups`` against the pure-Python reference in dsh.json.

Rules: docs/formats.md#lossless-json, docs/rules.md#immutability (the accepted value domain,
    snapshots, freezing) and docs/formats.md#lossless-json
(one-pass snapshots, orjson decoding): the C path must give exactly the values, container
types, key order and error messages of the Python path; it only adds speed and keeps frozen
containers out of the cyclic GC (they are immutable, so they cannot form a cycle).
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsh.json as dj
from dsh._errors import InvalidJsonError
from dsh.json import MAX_SAFE_INTEGER, FrozenDict, FrozenList, dumps, loads, snapshot_json
from dsh.session._events import Event
from tests.conftest import DSH_LOGS, REPO, kept_bytes
from tests.strategies import examples, hostile_json

DEEP = 20_000

if dj._speedups is None:
    # CI must build it (setup.py); a plain checkout without a compiler runs the Python paths.
    if os.environ.get("CI") and not os.environ.get("DSH_NO_SPEEDUPS"):
        importlib.import_module("dsh._speedups")  # raises: the CI build lost the extension
        pytest.fail("dsh._speedups is built but out of date (see the RuntimeWarning of "
                    "dsh.json): CI must run this build's accelerator", pytrace=False)
    pytest.skip("SKIPPED LOUDLY: dsh._speedups is not built (run `pip install -e .` with a C "
                "compiler) or DSH_NO_SPEEDUPS is set; the pure-Python paths are in use",
                allow_module_level=True)

sp = dj._speedups


def test_an_accelerator_built_from_an_older_dsh_is_not_used(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the build is optional: a failed rebuild leaves the last module, which may lack functions
    stale = type(sys)("dsh._speedups")
    for name in dj._SPEEDUPS_API:
        if name != "admit_plain":
            setattr(stale, name, getattr(sp, name))
    stale.__file__ = "/old/_speedups.so"
    stale.API_VERSION = sp.API_VERSION
    monkeypatch.setattr(importlib, "import_module", lambda name: stale)
    with pytest.warns(RuntimeWarning, match=r"/old/_speedups.so\) was built from another "
                      r"dsh and lacks admit_plain; dsh runs without it"):
        assert dj._load_speedups() is None
    monkeypatch.setattr(stale, "admit_plain", sp.admit_plain, raising=False)
    assert dj._load_speedups() is stale
    stale.API_VERSION = 1  # same names, other arguments: not called either
    with pytest.warns(RuntimeWarning, match=rf"has API version 1, not "
                      rf"{dj._SPEEDUPS_API_VERSION}; dsh runs without it"):
        assert dj._load_speedups() is None


def test_an_accelerator_built_before_its_source_changed_is_not_used(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # same names and API version, other code: a checkout whose _speedups.c moved on (a pull, a
    # rebase, an edit) while the build stayed as it was
    built = type(sys)("dsh._speedups")
    for name in (*dj._SPEEDUPS_API, "API_VERSION"):
        setattr(built, name, getattr(sp, name))
    built.__file__ = str(tmp_path / "_speedups.cpython-311-x86_64-linux-gnu.so")
    built.SOURCE_SHA256 = hashlib.sha256(b"int old;\n").hexdigest()
    monkeypatch.setattr(importlib, "import_module", lambda name: built)
    assert dj._load_speedups() is built  # a wheel: no source beside it, used as built
    (tmp_path / "_speedups.c").write_bytes(b"int old;\n")
    assert dj._load_speedups() is built  # the source it was built from
    (tmp_path / "_speedups.c").write_bytes(b"int new;\n")
    with pytest.warns(RuntimeWarning) as caught:
        assert dj._load_speedups() is None
    assert [str(w.message) for w in caught] == [
        f"dsh._speedups ({built.__file__}) was not built from the {tmp_path}/_speedups.c beside "
        "it (the source changed since the build); dsh runs without it (slower). Run pip "
        "install -e . in the checkout to rebuild it."]
    del built.SOURCE_SHA256  # built before builds recorded their source
    with pytest.warns(RuntimeWarning, match="was not built from the"):
        assert dj._load_speedups() is None


def test_the_build_records_the_sha256_of_its_source() -> None:
    source = Path(dj.__file__).with_name("_speedups.c")
    if not source.exists():
        pytest.skip("SKIPPED LOUDLY: an installed dsh without its C source beside it")
    assert hashlib.sha256(source.read_bytes()).hexdigest() == sp.SOURCE_SHA256


# --- the two paths ---------------------------------------------------------------------------


def py_snapshot(value: Any) -> Any:
    """snapshot_json as it runs without the extension."""
    try:
        return dj._fast(value, 0)
    except dj._Slow:
        return dj._snapshot_walk(value)


def py_loads(data: bytes) -> Any:
    """loads (orjson branch) as it runs without the extension."""
    parsed = orjson.loads(data)
    try:
        return dj._freeze_parsed(parsed, 0)
    except dj._Slow:
        return py_snapshot(orjson.loads(data))  # _freeze_parsed edits the tree in place


def outcome(fn: Callable[[Any], Any], value: Any) -> tuple[Any, ...]:
    try:
        return ("ok", fn(value))
    except InvalidJsonError as exc:
        return ("error", exc.message, exc.where, exc.code)


def nodes(value: Any) -> Iterator[Any]:
    """Every value in a tree, iteratively (20,000 levels)."""
    stack = [value]
    while stack:
        item = stack.pop()
        yield item
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def assert_same(a: Any, b: Any) -> None:
    """Same JSON, same type at every node (FrozenDict vs Event, int vs float), same key order."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        assert type(x) is type(y), (x, y)
        if isinstance(x, dict):
            assert list(x) == list(y)
            stack.extend((x[k], y[k]) for k in x)
        elif isinstance(x, list):
            assert len(x) == len(y)
            stack.extend(zip(x, y, strict=True))
        elif type(x) is float:
            assert x == y and math.copysign(1.0, x) == math.copysign(1.0, y)
        else:
            assert x == y


def assert_untracked(value: Any) -> None:
    for node in nodes(value):
        if isinstance(node, dict | list):
            assert isinstance(node, FrozenDict | FrozenList)
            assert not gc.is_tracked(node), node


def nested_lists(depth: int, leaf: Any = None) -> list[Any]:
    root: list[Any] = []
    cur = root
    for _ in range(depth - 1):
        nxt: list[Any] = []
        cur.append(nxt)
        cur = nxt
    if leaf is not None:
        cur.append(leaf)
    return root


# --- build and import ------------------------------------------------------------------------


def test_speedups_extension_is_built_and_configured() -> None:
    # docs/formats.md#lossless-json: the accelerator is wired into both doors (snapshot_json and
    # loads)
    assert sp.__file__.endswith((".so", ".pyd"))
    assert dj._c_snapshot is sp.snapshot
    assert dj._c_freeze_parsed is sp.freeze_parsed
    assert sp.FAST_DEPTH == dj._FAST_DEPTH


def test_speedups_missing_extension_falls_back_to_python() -> None:
    # A failed optional build installs without the module: dsh.json must still work, exactly.
    code = (
        "import sys, gc; sys.modules['dsh._speedups'] = None\n"
        "import dsh.json as j\n"
        "assert j._speedups is None and j._c_snapshot is None\n"
        "v = j.loads(b'{\"a\":[1,2.0,{\"b\":\"x\"}]}')\n"
        "assert v == {'a': [1, 2, {'b': 'x'}]} and type(v['a'][1]) is int\n"
        "assert type(j.snapshot_json({'a': [1]})['a']) is j.FrozenList\n"
        "try:\n"
        "    j.snapshot_json({'a': float('nan')})\n"
        "except j.InvalidJsonError as e:\n"
        "    print(e.message)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True)
    assert out.stdout == "nan at $.a is not a finite number\n"


# --- identical results ----------------------------------------------------------------------

_numbers = st.one_of(
    st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER),
    st.sampled_from([0.0, 5.0, -3.0, 1e300, float(MAX_SAFE_INTEGER), 2.0**53, 0.5, -1.25]),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != 0.0))
_bad = st.sampled_from([MAX_SAFE_INTEGER + 1, -(2**63), 2**64, math.nan, math.inf, -0.0,
                        (1,), b"x", {1: "k"}, "a\ud83d\ude00b", "\ud800"])


def _json_with(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keys = st.one_of(st.text(max_size=5), st.sampled_from(["", "__proto__", "\u00e9", "a\ud800"]))
    return st.recursive(
        leaves,
        lambda children: st.one_of(st.lists(children, max_size=4),
                                   st.dictionaries(keys, children, max_size=4)),
        max_leaves=30)


@settings(max_examples=examples(100), deadline=None)
@given(value=st.one_of(hostile_json(), _json_with(_numbers)))
def test_speedups_snapshot_matches_python_on_generated_json(value: Any) -> None:
    # docs/formats.md#lossless-json: validate + copy + freeze; integral floats -> int; surrogate
    # pairs joined
    c = snapshot_json(value)
    assert_same(c, py_snapshot(value))
    assert_untracked(c)
    if isinstance(c, dict | list):
        # a frozen snapshot is reused as-is (docs/formats.md#lossless-json)
        assert snapshot_json(c) is c
    else:
        assert_same(snapshot_json(c), c)


@settings(max_examples=examples(100), deadline=None)
@given(value=_json_with(st.one_of(_numbers, _bad, st.text(max_size=4), st.none())))
def test_speedups_snapshot_errors_match_python(value: Any) -> None:
    # docs/formats.md#lossless-json: the same InvalidJsonError message and json_path whichever path
    # runs
    c, p = outcome(snapshot_json, value), outcome(py_snapshot, value)
    assert c[0] == p[0]
    if c[0] == "ok":
        assert_same(c[1], p[1])
    else:
        assert c[1:] == p[1:]


@settings(max_examples=examples(100), deadline=None)
@given(value=st.one_of(hostile_json(), _json_with(_numbers)))
def test_speedups_loads_matches_python_on_generated_json(value: Any) -> None:
    # docs/formats.md#lossless-json: decoding freezes orjson's tree; -0.0 and floats like 5.0 as the
    # Python path
    wire = dumps(snapshot_json(value))
    try:
        orjson.loads(wire)
    except orjson.JSONDecodeError:
        wire_ok = False  # lone surrogates: both paths use the same Python fallback parser
    else:
        wire_ok = True
    c = loads(wire)
    assert_untracked(c)
    if wire_ok:
        assert_same(c, py_loads(wire))
        assert_same(sp.freeze_parsed(orjson.loads(wire)), py_loads(wire))
    assert_same(c, py_snapshot(value))


def _shared_records() -> list[tuple[str, bytes]]:
    root = DSH_LOGS / "jsonl-unpacked"
    records = []
    for path in sorted(root.rglob("*.jsonl")):
        for n, line in enumerate(path.read_bytes().splitlines(), 1):
            if line.strip():
                records.append((f"{path.relative_to(root)}:{n}", line))
    return records


def test_speedups_match_python_on_every_dsh_log_record() -> None:
    # docs/formats.md#lossless-json on logs written by the real dsh (tests/fixtures/dsh-logs)
    records = _shared_records()
    assert len(records) > 100
    for _where, line in records:
        c = loads(line)
        assert_same(c, py_loads(line))
        assert_untracked(c)
        plain = orjson.loads(line)
        assert_same(snapshot_json(plain), py_snapshot(plain))
        assert snapshot_json(c) is c
        event = Event(c)  # the public constructor: tracked, so walked once, then reused
        again = snapshot_json(event)
        assert again is event and type(again) is Event
        assert not gc.is_tracked(event)
    assert len(records) > 100


# --- GC and immutability --------------------------------------------------------------------


def test_speedups_frozen_containers_are_not_gc_tracked() -> None:
    # docs/formats.md#lossless-json: frozen values are immutable and acyclic, so the cyclic GC need
    # not walk them
    value = {"a": [1, {"b": [2.0, "x"]}, []], "c": {}, "d": "\u00e9"}
    for frozen in (snapshot_json(value), loads(orjson.dumps(value)),
                   sp.freeze_parsed(orjson.loads(orjson.dumps(value)))):
        assert_same(frozen, py_snapshot(value))
        assert_untracked(frozen)
    # the pure-Python fallback constructors untrack too (20,000 levels take the exact walk)
    deep = snapshot_json(nested_lists(DEEP, "leaf"))
    assert_untracked(deep)
    assert_untracked(loads(b"[" * DEEP + b"]" * DEEP))
    assert_untracked(snapshot_json({"s": "a\ud83d\ude00b", "l": [[1]]}))  # surrogate: walk
    assert_untracked(dj._frozen_dict({"a": dj._frozen_list([1])}))


def test_speedups_untrack_refuses_what_could_hide_a_cycle() -> None:
    # untracking is only safe when every child is atomic or untracked (CPython's tuple rule)
    mutable_child = dj._dict_new(FrozenDict)
    dict.update(mutable_child, {"x": [1]})
    assert sp.untrack(mutable_child) is False
    assert gc.is_tracked(mutable_child)

    class WithAttrs(FrozenDict):  # no __slots__: has a __dict__ that could point anywhere
        pass

    assert sp.untrack(WithAttrs({"a": 1})) is False
    assert sp.untrack({"a": 1}) is False  # plain containers are never untracked
    assert sp.untrack("text") is False
    ok = FrozenDict({"a": 1})
    assert gc.is_tracked(ok)
    assert sp.untrack(ok) is True and not gc.is_tracked(ok)
    assert dj._untrack(FrozenList([1])) is True


def test_speedups_frozen_results_still_refuse_mutation() -> None:
    # docs/rules.md#immutability: accepted values cannot change
    d = loads(b'{"a":[1,{"b":2}]}')
    lst = d["a"]
    mutators: list[Callable[[], Any]] = [
        lambda: d.__setitem__("x", 1), lambda: d.__delitem__("a"), lambda: d.update(x=1),
        lambda: d.pop("a"), d.clear, lambda: d.setdefault("y", 1),
        lambda: lst.append(1), lambda: lst.__setitem__(0, 2), lambda: lst.extend([1]),
        lambda: lst.insert(0, 1), lst.pop, lst.sort, lst.reverse, lst.clear,
        lambda: lst[1].__setitem__("b", 3),
    ]
    for mutate in mutators:
        with pytest.raises(TypeError, match="is immutable"):
            mutate()
    assert d == {"a": [1, {"b": 2}]}
    assert type(lst[:1]) is FrozenList


def test_speedups_reuse_rules_for_frozen_input() -> None:
    # docs/formats.md#lossless-json: frozen input that needs no change is shared; anything else is
    # rebuilt
    frozen = snapshot_json({"a": [1, 2]})
    assert snapshot_json(frozen) is frozen
    tracked = FrozenDict({"a": FrozenList([1, "x"]), "b": None})
    assert gc.is_tracked(tracked)
    assert snapshot_json(tracked) is tracked
    assert not gc.is_tracked(tracked) and not gc.is_tracked(tracked["a"])
    holds_plain = FrozenDict({"a": [1, 2.0]})  # public constructor: not validated
    rebuilt = snapshot_json(holds_plain)
    assert rebuilt is not holds_plain
    assert_same(rebuilt, FrozenDict({"a": FrozenList([1, 2])}))
    assert_untracked(rebuilt)
    event = Event({"type": "turn/start", "seq": 0, "time": 1.0, "data": {"turn": 1}})
    snap = snapshot_json(event)
    assert type(snap) is Event and snap is not event
    assert_same(snap, py_snapshot(event))
    assert_untracked(snap)
    with pytest.raises(InvalidJsonError) as info:
        snapshot_json(FrozenDict({"a": FrozenList([math.nan])}))
    assert info.value.message == "nan at $.a[0] is not a finite number"


# --- errors ---------------------------------------------------------------------------------


def _cycle() -> list[Any]:
    loop: list[Any] = [1]
    loop.append({"k": loop})
    return loop


@pytest.mark.parametrize(("value", "message", "path"), [
    ({"a": [1, 2**53]},
     "integer 9007199254740992 at $.a[1] is beyond ±(2^53-1); a JavaScript reader would round it",
     "$.a[1]"),
    ([-(2**63)], f"integer {-(2**63)} at $[0] is beyond ±(2^53-1); a JavaScript reader would "
                 "round it", "$[0]"),
    ({"x": {"y": math.nan}}, "nan at $.x.y is not a finite number", "$.x.y"),
    ([math.inf], "inf at $[0] is not a finite number", "$[0]"),
    ({"z": -0.0}, "-0.0 at $.z would be written as 0", "$.z"),
    ({"t": (1, 2)}, "tuple at $.t is not JSON (accepted: None, bool, str, int, float, dict, list)",
     "$.t"),
    ({"ok": {2: "x"}}, "key 2 at $.ok is not a string", "$.ok"),
    (_cycle(), "cycle at $[1].k", "$[1].k"),
    (nested_lists(DEEP, math.nan), "nan at $" + "[0]" * DEEP + " is not a finite number",
     "$" + "[0]" * DEEP),
])
def test_speedups_errors_keep_their_messages(value: Any, message: str, path: str) -> None:
    # docs/formats.md#lossless-json: one sentence naming the rule, the found value and the JSON path
    for run in (snapshot_json, py_snapshot):
        with pytest.raises(InvalidJsonError) as info:
            run(value)
        assert info.value.message == message
        assert info.value.where == {"json_path": path}


@pytest.mark.parametrize(("wire", "message"), [
    (b'{"a":[9007199254740992]}', "integer 9007199254740992 at $.a[0] is beyond ±(2^53-1); a "
                                  "JavaScript reader would round it"),
    (b'{"a":-0.0}', "-0.0 at $.a would be written as 0"),
    (b'[1,[-0.0]]', "-0.0 at $[1][0] would be written as 0"),
])
def test_speedups_loads_errors_keep_their_messages(wire: bytes, message: str) -> None:
    # docs/formats.md#lossless-json: refusals on decode name the spot
    with pytest.raises(InvalidJsonError) as info:
        loads(wire)
    assert info.value.message == message
    with pytest.raises(InvalidJsonError) as info2:
        py_loads(wire)
    assert info2.value.message == message


def test_speedups_deep_and_wide_values_match() -> None:
    # docs/formats.md#lossless-json: 20,000 levels work on every door (the C path hands depth > 200
    # to the walk)
    for value in (nested_lists(DEEP, 1.0), nested_lists(201, 2.0), nested_lists(200, 3.0),
                  list(range(10_000)), {str(i): [i, float(i)] for i in range(2_000)}):
        c = snapshot_json(value)
        assert_same(c, py_snapshot(value))
        assert_untracked(c)
        assert_same(loads(dumps(c)), c)


# --- reference counts and leaks -------------------------------------------------------------


def test_speedups_reference_counts_are_stable() -> None:
    # every reference the C code takes is given back, on success and on the fallback path
    leaf = "".join(["shared-", "leaf"])  # a fresh, non-interned string
    good = {"a": [leaf, {"b": leaf, "c": [1, 2.5, None, True]}], leaf: leaf}
    bad = {"a": [leaf, {"b": leaf}], "z": [leaf, math.nan]}
    frozen_input = FrozenDict({"k": leaf, "l": [leaf]})  # tracked, rebuilt every time
    before = sys.getrefcount(leaf)
    for _ in range(100_000):
        sp.snapshot(good)
        sp.freeze_parsed(good)
        sp.snapshot(frozen_input)
    for _ in range(20_000):
        with pytest.raises(sp.Fallback):
            sp.snapshot(bad)
        with pytest.raises(sp.Fallback):
            sp.freeze_parsed(bad)
    assert sys.getrefcount(leaf) == before


def test_speedups_do_not_leak_memory() -> None:
    wire = orjson.dumps({"type": "assistant/message", "seq": 7, "time": 1.7e12,
                         "data": {"content": [{"type": "text", "text": "hi \u00e9"}] * 3,
                                  "usage": {"in": 1.0, "out": 2}}})
    plain = orjson.loads(wire)

    def churn(n: int) -> None:
        for _ in range(n):
            loads(wire)
            snapshot_json(plain)
            sp.freeze_parsed(plain)

    churn(5_000)  # warm caches and free lists
    growth = kept_bytes(churn, 2_000, 10_000)
    assert growth < 64 * 1024, growth



# --- the seal chain's canonical bytes and leaves (docs/formats.md#the-seal-chain) ------------


def py_canonical(value: Any) -> bytes:
    """dumps_canonical as it runs without the extension (it never calls the accelerator)."""
    return dj.dumps_canonical(value)


def c_canonical(value: Any) -> bytes:
    """The accelerator's canonical bytes, the reference taking over where it falls back."""
    try:
        return sp.canonical(value, orjson.dumps)
    except sp.Fallback:
        return dj.dumps_canonical(value)


_big_ints = st.sampled_from([2**63 - 1, -(2**63), 2**63, 2**64 - 1, 2**64, -(2**64), 10**30])


def _unvalidated(value: Any) -> Any:
    """``value`` in frozen containers built by the public constructors (nothing checked)."""
    if isinstance(value, dict):
        return FrozenDict({k: _unvalidated(v) for k, v in value.items()})
    if isinstance(value, list):
        return FrozenList(_unvalidated(v) for v in value)
    return value


@settings(max_examples=300)
@given(value=st.one_of(hostile_json(), _json_with(_numbers)),
       keys=st.lists(st.one_of(st.text(max_size=4), st.sampled_from(
           ["\ud800", "\udbff\udc00", "\uffff", "\U00010000", "\ue000", "Z", "a", "\x7f"])),
           max_size=8))
def test_speedups_canonical_bytes_equal_dumps_canonical(value: Any, keys: list[str]) -> None:
    # keys in code point order at every depth (surrogates, astral and private-use keys
    # mixed), lone surrogates escaped, floats as orjson writes them: byte for byte the same
    frozen = snapshot_json({"v": value, **{k: [value, {k: k}] for k in keys}})
    expected = py_canonical(frozen)
    assert sp.canonical(frozen, orjson.dumps) == expected
    assert c_canonical(FrozenList([frozen, frozen])) == b"[" + expected + b"," + expected + b"]"


@given(value=_json_with(st.one_of(_numbers, _big_ints, st.text(max_size=4), st.none())))
def test_speedups_canonical_of_unvalidated_containers_matches_the_reference(value: Any) -> None:
    # frozen containers made by the public constructors are trusted by dumps_canonical: an int
    # past 64 bits (orjson refuses it) or anything else unusual goes back to the reference
    frozen = _unvalidated({"v": value})
    try:
        expected: object = py_canonical(frozen)
    except (InvalidJsonError, TypeError) as exc:  # orjson's JSONEncodeError is a TypeError
        expected = (type(exc), str(exc))
    try:
        got: object = c_canonical(frozen)
    except (InvalidJsonError, TypeError) as exc:
        got = (type(exc), str(exc))
    assert got == expected


def test_speedups_canonical_escapes_a_byte_at_every_place_of_an_eight_byte_word() -> None:
    # canon_str tests eight ASCII bytes at once: each byte it must escape (or must not),
    # anywhere in or across those words, gives the reference's bytes
    for special in ('"', "\\", "\x00", "\x1f", "\n", " ", "!", "#", "[", "]", "\x7f", "~"):
        for before in range(18):
            for after in (0, 1, 7, 8, 9):
                text = "a" * before + special + "b" * after
                frozen = FrozenList([text, FrozenDict({text: text})])
                assert sp.canonical(frozen, orjson.dumps) == py_canonical(frozen)
                assert sp.canonical(frozen, orjson.dumps) == orjson.dumps(
                    frozen, option=orjson.OPT_SORT_KEYS)


class _Int(int):
    """An int subclass (orjson writes it; the C pass leaves it to the reference)."""


def test_speedups_canonical_hands_back_what_the_reference_judges() -> None:
    deep = snapshot_json(nested_lists(DEEP, "leaf"))
    for value in (deep, {"plain": "dict"}, [1, 2], "text", 5,
                  FrozenDict({"t": (1, 2)}), FrozenDict({"i": _Int(1)}),
                  FrozenDict({"big": 2**64}), FrozenList([FrozenDict({1: "int key"})])):
        with pytest.raises(sp.Fallback):
            sp.canonical(value, orjson.dumps)
    assert c_canonical(deep) == py_canonical(deep)  # 20,000 levels: the reference's walk
    shallow = snapshot_json(nested_lists(200, "leaf"))
    assert sp.canonical(shallow, orjson.dumps) == py_canonical(shallow)


def _leaves(events: list[Any], batch_key: bytes) -> list[bytes]:
    from dsh.persistence import _chain

    record = _chain.ChainRecord(bytes(32), bytes(32), 0, len(events), _chain.Writer("h", 1),
                                bytes(16), b"\0" + batch_key)
    return _chain.event_leaves(record, events)


@settings(max_examples=100)
@given(values=st.lists(hostile_json(), min_size=1, max_size=6), key=st.binary(min_size=16,
                                                                              max_size=16))
def test_speedups_chain_leaves_equal_the_reference(values: list[Any], key: bytes) -> None:
    import hashlib

    from dsh.persistence import _chain

    events = [Event(snapshot_json({"seq": 2**40 + i, "type": "x/y", "data": v}))
              for i, v in enumerate(values)]
    c_leaves = sp.chain_leaves(events, key, hashlib.sha256, orjson.dumps)
    assert _leaves(events, key) == c_leaves
    accelerated = _chain.c_chain_leaves
    _chain.c_chain_leaves = None  # the pure-Python reference
    try:
        assert _leaves(events, key) == c_leaves
        assert _leaves(list(reversed(events)), key) == list(reversed(c_leaves))
    finally:
        _chain.c_chain_leaves = accelerated


def test_speedups_chain_leaves_fall_back_per_batch() -> None:
    import hashlib

    key = bytes(range(16))
    good = Event(snapshot_json({"seq": 3, "type": "x/y", "data": {"k": "\ud800"}}))
    deep = Event(snapshot_json({"seq": 4, "type": "x/y", "data": nested_lists(DEEP, 1)}))
    for batch in ([good, FrozenDict({"seq": -1})], [good, FrozenDict({"seq": "3"})],
                  [good, {"seq": 3}], [good, deep]):
        with pytest.raises(sp.Fallback):
            sp.chain_leaves(batch, key, hashlib.sha256, orjson.dumps)
    # the wrapper's reference takes the batch the C pass handed back
    expected = [hashlib.sha256(hashlib.sha256(key + (s).to_bytes(8, "little")).digest()[:16]
                               + dj.dumps_canonical(e)).digest()
                for s, e in ((3, good), (4, deep))]
    assert _leaves([good, deep], key) == expected
    with pytest.raises(TypeError):
        sp.chain_leaves([good], key[:15], hashlib.sha256, orjson.dumps)


def test_speedups_chain_leaves_reference_counts_are_stable() -> None:
    import hashlib

    leaf = "".join(["shared-", "leaf"])
    event = Event(snapshot_json({"seq": 1, "type": "x/y", "data": {leaf: [leaf, 1.5]}}))
    frozen_leaf = event["data"][leaf][0]
    before = sys.getrefcount(frozen_leaf), sys.getrefcount(event)
    for _ in range(20_000):
        sp.chain_leaves([event], bytes(16), hashlib.sha256, orjson.dumps)
        sp.canonical(event, orjson.dumps)
        with pytest.raises(sp.Fallback):
            sp.chain_leaves([event, FrozenDict({"seq": -1})], bytes(16), hashlib.sha256,
                            orjson.dumps)
    assert (sys.getrefcount(frozen_leaf), sys.getrefcount(event)) == before


def _without_sha_ni(probe: str) -> list[str]:
    """What ``probe`` prints in a fresh process whose accelerator hashes through hashlib."""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, env={**os.environ, "DSH_SPEEDUPS_NO_SHA_NI": "1"})
    return out.stdout.split()


def test_speedups_chain_leaves_hash_every_padding_length_like_hashlib() -> None:
    # the SHA-NI path pads the last block itself: every length mod 64 (55, 56 and 63 bytes
    # left over included) against hashlib, and the hashlib path itself (SHA_NI off)
    import hashlib

    key = bytes(range(16))
    events = [Event(snapshot_json({"seq": n, "type": "x/y", "data": "é" * (n % 3) + "x" * n}))
              for n in range(200)]
    expected = [hashlib.sha256(hashlib.sha256(key + n.to_bytes(8, "little")).digest()[:16]
                               + dj.dumps_canonical(e)).digest() for n, e in enumerate(events)]
    assert sp.chain_leaves(events, key, hashlib.sha256, orjson.dumps) == expected
    probe = ("import hashlib, orjson, dsh.json as dj; from dsh.json import snapshot_json; "
             "from dsh.session._events import Event; "
             "events = [Event(snapshot_json({'seq': n, 'type': 'x/y', 'data': 'x' * n})) "
             "for n in range(70)]; "
             "print(dj._speedups.SHA_NI, dj._speedups.chain_leaves(events, bytes(range(16)), "
             "hashlib.sha256, orjson.dumps) == [hashlib.sha256(hashlib.sha256(bytes(range(16)) "
             "+ n.to_bytes(8, 'little')).digest()[:16] + dj.dumps_canonical(e)).digest() "
             "for n, e in enumerate(events)])")
    assert _without_sha_ni(probe) == ["0", "True"]


def test_speedups_crc32_equals_zlib_at_every_length_alignment_and_start_value() -> None:
    # read_rows' seal check folds 64 then 16 bytes at a time and ends byte by byte: every
    # length around those block sizes, from every offset within 16 bytes, from a running
    # value, against zlib; and the zlib path itself (CLMUL off)
    import random
    import zlib

    rng = random.Random(21)
    data = rng.randbytes(4096 + 16)
    for length in [*range(0, 300), 1023, 1024, 1025, 4095, 4096]:
        for offset in (0, 1, 7, 15):
            chunk = memoryview(data)[offset:offset + length]
            value = rng.getrandbits(32)
            assert sp.crc32(chunk) == zlib.crc32(chunk), (length, offset)
            assert sp.crc32(chunk, value) == zlib.crc32(chunk, value), (length, offset)
    assert sp.crc32(b"\x1d" * 100, 0xFFFF_FFFF) == zlib.crc32(b"\x1d" * 100, 0xFFFF_FFFF)
    if sys.platform == "linux" and os.uname().machine == "x86_64":
        assert dj.c_crc32 is (sp.crc32 if sp.CLMUL else None)
    probe = ("import zlib, dsh.json as dj; sp = dj._speedups; b = bytes(range(256)) * 9; "
             "print(sp.CLMUL, dj.c_crc32, all(sp.crc32(b[:n], n) == zlib.crc32(b[:n], n) "
             "for n in range(0, 2304, 7)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, env={**os.environ, "DSH_SPEEDUPS_NO_CLMUL": "1"})
    assert out.stdout.split() == ["0", "None", "True"]


@settings(max_examples=examples(200), deadline=None)
@given(data=st.binary(max_size=700), value=st.integers(0, 2**32 - 1))
def test_speedups_crc32_equals_zlib(data: bytes, value: int) -> None:
    import zlib

    assert sp.crc32(data, value) == zlib.crc32(data, value)


def test_speedups_chain_digest_equals_the_digest_of_the_sliced_leaves() -> None:
    # dsh verify checks each batch where it lies in the log: chain_digest(events, a, b) is the
    # digest of chain_leaves(events[a:b]), on the SHA-NI path and on hashlib's (SHA_NI off)
    import hashlib

    from dsh.persistence import _chain

    key = bytes(range(16))
    events = [Event(snapshot_json({"seq": n, "type": "x/y", "data": {"é": "x" * n, "f": 1.5}}))
              for n in range(130)]
    record = _chain.ChainRecord(bytes(32), bytes(32), 0, 0, _chain.Writer("h", 1), bytes(16),
                                b"\0" + key)
    for start, stop in ((0, 130), (3, 70), (64, 65), (5, 5), (129, 130)):
        expected = _chain.batch_digest(
            sp.chain_leaves(events[start:stop], key, hashlib.sha256, orjson.dumps))
        assert sp.chain_digest(events, start, stop, key, hashlib.sha256, orjson.dumps) \
            == expected
        assert sp.chain_digest(tuple(events), start, stop, key, hashlib.sha256,
                               orjson.dumps) == expected
        assert _chain.events_digest(record, events, start, stop) == expected
    assert sp.chain_digest([], 0, 0, key, hashlib.sha256, orjson.dumps) \
        == hashlib.sha256(b"").digest()
    for start, stop in ((-1, 3), (4, 3), (0, 131)):
        with pytest.raises(ValueError):
            sp.chain_digest(events, start, stop, key, hashlib.sha256, orjson.dumps)
    deep = Event(snapshot_json({"seq": 3, "type": "x/y", "data": nested_lists(DEEP, 1)}))
    with pytest.raises(sp.Fallback):  # deeper than the C walk goes: left to the reference
        sp.chain_digest([events[0], deep], 0, 2, key, hashlib.sha256, orjson.dumps)
    with pytest.raises(sp.Fallback):
        sp.chain_digest([events[0], FrozenDict({"seq": "3"})], 0, 2, key, hashlib.sha256,
                        orjson.dumps)
    mixed = [events[0], deep]
    assert _chain.events_digest(record, mixed, 0, 2) == _chain.batch_digest(
        _chain.event_leaves(record, mixed))
    probe = ("import hashlib, orjson, dsh.json as dj; from dsh.json import snapshot_json; "
             "from dsh.session._events import Event; from dsh.persistence import _chain; "
             "events = [Event(snapshot_json({'seq': n, 'type': 'x/y', 'data': 'x' * n})) "
             "for n in range(70)]; k = bytes(range(16)); "
             "print(dj._speedups.SHA_NI, dj._speedups.chain_digest(events, 2, 69, k, "
             "hashlib.sha256, orjson.dumps) == _chain.batch_digest(dj._speedups.chain_leaves("
             "events[2:69], k, hashlib.sha256, orjson.dumps)))")
    assert _without_sha_ni(probe) == ["0", "True"]

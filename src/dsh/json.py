"""Lossless JSON: one-pass validate-and-copy snapshots, frozen containers, a dsh-compatible codec.

Invariants this module owns (docs/formats.md#lossless-json, docs/rules.md#immutability):

* a snapshot holds only ``None``, ``bool``, ``str``, ``int`` within ±(2^53 − 1), finite non-
  negative-zero ``float``, :class:`FrozenList` and :class:`FrozenDict` with ``str`` keys;
* integral floats are normalised to ``int`` (JavaScript has one number type, and dsh writes ``5``);
* strings keep lone surrogates; a surrogate *pair* held as two code points is joined into the one
  code point JavaScript would see;
* walks are iterative (20,000 levels work) and read every slot once;
* the encoder writes UTF-8 that is always valid (lone surrogates become ``\\udXXX`` escapes); the
  decoder keeps such escapes as lone surrogates and refuses ``NaN``, ``Infinity`` and numbers a
  JavaScript reader would round.

The engine is orjson (see the README's design notes for the measurement); a small iterative
fallback handles what orjson refuses but dsh writes: lone surrogates and very deep nesting.

Optional C accelerator ``dsh._speedups`` (built by ``setup.py`` when a compiler is present; the
pure-Python code below is the reference and the fallback; ``DSH_NO_SPEEDUPS=1`` forces it):

* it freezes orjson's trees and snapshots caller data without Python-level recursion, and hands
  everything unusual (an unsafe int, NaN, -0.0, a surrogate, a foreign type, nesting deeper than
  200) back to the exact walk here, so every error and its message come from one place;
* frozen containers are taken out of the cyclic GC (``PyObject_GC_UnTrack``): they are immutable
  and built bottom-up from atomic values and other frozen containers, so they cannot be part of a
  cycle, and a long log would otherwise make every full collection walk all of it;
* an untracked frozen container was made by a validating constructor, so ``snapshot_json``
  returns it as-is without walking it (fork and seed copies of frozen events cost O(1) each).
"""

from __future__ import annotations

import gc
import importlib
import math
import os
import re
import warnings
from collections.abc import Callable
from json.decoder import scanstring  # type: ignore[attr-defined]  # C scanner, untyped
from typing import TYPE_CHECKING, Any, Final, NoReturn, SupportsIndex, TypeAlias, TypeVar

import orjson

from dsh._errors import InvalidJsonError

__all__ = [
    "MAX_SAFE_INTEGER",
    "FrozenDict",
    "FrozenList",
    "JsonValue",
    "dumps",
    "dumps_canonical",
    "is_json",
    "is_safe_int",
    "json_equal",
    "loads",
    "loads_plain",
    "snapshot_json",
    "thaw",
]

MAX_SAFE_INTEGER: Final = 2**53 - 1
"""Largest integer a JavaScript reader parses exactly (``Number.MAX_SAFE_INTEGER``)."""

JsonValue: TypeAlias = Any
"""Any lossless JSON value. Kept as ``Any`` so payload access stays ergonomic under mypy."""


def _frozen(self: object, *args: object, **kwargs: object) -> NoReturn:
    """Refused: a frozen JSON value never changes (make a changed copy instead).

    Raises:
        TypeError: always.
    """
    raise TypeError(f"{type(self).__name__} is immutable: accepted session data cannot change")


def _render(value: object, *, key: Callable[[Any], str], leaf: Callable[[Any], str],
            comma: str, colon: str, sort_keys: bool = False) -> str:
    """Write nested dicts and lists as text without recursion (any depth).

    One walk serves ``repr`` and the JSON encoder's fallback: ``key`` and ``leaf`` render an
    object key and a non-container value; ``comma`` and ``colon`` are the separators.
    """
    parts: list[str] = []
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if type(item) is _Text:
            parts.append(item.text)
        elif isinstance(item, dict):
            if not item:
                parts.append("{}")
                continue
            stack.append(_Text("}"))
            entries = sorted(item.items(), key=_first) if sort_keys else list(item.items())
            for i in range(len(entries) - 1, -1, -1):
                name, child = entries[i]
                stack.append(child)
                stack.append(_Text(("{" if i == 0 else comma) + key(name) + colon))
        elif isinstance(item, list):
            if not item:
                parts.append("[]")
                continue
            stack.append(_Text("]"))
            for i in range(len(item) - 1, -1, -1):
                stack.append(item[i])
                stack.append(_Text("[" if i == 0 else comma))
        else:
            parts.append(leaf(item))
    return "".join(parts)


def _first(entry: tuple[str, object]) -> str:
    return entry[0]


class _Text:
    """Literal text on :func:`_render`'s stack (a bracket, a separator, a key)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _deep_repr(value: object) -> str:
    """``repr`` of nested dicts and lists without recursion (inner containers shown plain)."""
    return _render(value, key=repr, leaf=repr, comma=", ", colon=": ")


class FrozenDict(dict[str, Any]):
    """A JSON object that cannot change: every mutator raises ``TypeError``.

    It is a ``dict`` subclass, so it compares equal to plain dicts, serialises with any JSON
    library and passes ``isinstance(x, dict)``. Make a changed copy with ``{**d, "k": v}``.
    """

    __slots__ = ()
    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _frozen
    __ior__ = _frozen

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(self):  # re-running __init__ would add keys to an accepted value
            _frozen(self)
        dict.__init__(self, *args, **kwargs)

    def __reduce__(self) -> tuple[type[FrozenDict], tuple[dict[str, Any]]]:
        return (FrozenDict, (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self

    def __repr__(self) -> str:
        try:
            return f"FrozenDict({dict.__repr__(self)})"
        except RecursionError:  # any depth is valid JSON: the same text, built iteratively
            return f"FrozenDict({_deep_repr(self)})"


class FrozenList(list[Any]):
    """A JSON array that cannot change: every mutator raises ``TypeError``.

    It is a ``list`` subclass, so it compares equal to plain lists and serialises as an array.
    """

    __slots__ = ()
    __setitem__ = __delitem__ = append = extend = insert = pop = remove = _frozen
    reverse = sort = clear = __iadd__ = __imul__ = _frozen

    def __init__(self, iterable: Any = (), /) -> None:
        if len(self):  # list.__init__ would clear and refill an accepted value
            _frozen(self)
        list.__init__(self, iterable)

    def __reduce__(self) -> tuple[type[FrozenList], tuple[list[Any]]]:
        return (FrozenList, (list(self),))

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenList:
        return self

    def __repr__(self) -> str:
        try:
            return f"FrozenList({list.__repr__(self)})"
        except RecursionError:  # any depth is valid JSON: the same text, built iteratively
            return f"FrozenList({_deep_repr(self)})"

    def __getitem__(self, index: SupportsIndex | slice) -> Any:  # slices stay frozen
        if type(index) is slice:
            items = list.__getitem__(self, index)
            if gc.is_tracked(self):  # a hand-built list stays untrusted: snapshot re-walks it
                lst = _list_new(FrozenList)
                _list_extend(lst, items)
                return lst
            return _frozen_list(items)
        return list.__getitem__(self, index)


_SPEEDUPS_API: Final = (
    "configure", "freeze_parsed", "snapshot", "snapshot_events", "untrack", "Fallback",
    "scan_lines",
    "admit_plain", "stored_prescan", "decode_rows", "message_shape_ok", "rows_text",
    "encode_rows", "seqs_contiguous", "gather_messages", "seqs_below",
    "running_sums_below", "canonical", "chain_leaves", "chain_digest", "plain_numbers",
    "record_texts", "line_scan", "pick_rows", "widen_sums_below", "claude_line", "utc_millis",
    "claude_envelope", "decode_plain", "encode_sealed_rows", "sqlite_bind", "sqlite_open",
    "read_rows", "claude_blocks", "claude_usage", "claude_map", "crc32", "CLMUL", "seal_batch",
    "chain_hash", "fold_plain", "append_event")
"""What this dsh calls in ``dsh._speedups``."""

_SPEEDUPS_API_VERSION: Final = 22
"""The ``API_VERSION`` of the ``_speedups.c`` this dsh was written with (its arguments)."""


def _load_speedups() -> Any:
    """Return the configured C accelerator, or None when it is not built or is disabled.

    A module built from an older ``_speedups.c`` (the build is optional, so a failed rebuild
    leaves the last one in place) is not used: a ``RuntimeWarning`` names what it lacks. In a
    source checkout, where ``_speedups.c`` sits beside the module, neither is a module built
    before that file last changed (same API version, other code): the build records the
    source's SHA-256 (``SOURCE_SHA256``, see setup.py) and this compares it with the file's. A
    module without its source beside it is used as built.
    """
    if os.environ.get("DSH_NO_SPEEDUPS"):
        return None
    try:
        module = importlib.import_module("dsh._speedups")
    except ImportError:  # optional build (setup.py): the pure-Python paths below take over
        return None
    missing = [name for name in _SPEEDUPS_API if not hasattr(module, name)]
    version = getattr(module, "API_VERSION", None)
    if missing or version != _SPEEDUPS_API_VERSION:
        lacks = (f"lacks {', '.join(missing)}" if missing else
                 f"has API version {version}, not {_SPEEDUPS_API_VERSION}")
        warnings.warn(f"dsh._speedups ({module.__file__}) was built from another dsh and "
                      f"{lacks}; dsh runs without it (slower). Reinstall dsh (pip install -e "
                      ". in a checkout) to rebuild it.", RuntimeWarning, stacklevel=2)
        return None
    stale = _stale_source(module)
    if stale is not None:
        warnings.warn(f"dsh._speedups ({module.__file__}) was not built from the {stale} beside "
                      "it (the source changed since the build); dsh runs without it (slower). "
                      "Run pip install -e . in the checkout to rebuild it.", RuntimeWarning,
                      stacklevel=2)
        return None
    module.configure(FrozenDict, FrozenList, MAX_SAFE_INTEGER)
    return module


def _stale_source(module: Any) -> str | None:
    """The path of the ``_speedups.c`` beside ``module`` when it was not built from it, else None.

    None too when no source sits beside the module (a wheel) or it cannot be read.
    """
    source = os.path.join(os.path.dirname(module.__file__), "_speedups.c")
    try:
        with open(source, "rb") as file:
            text = file.read()
    except OSError:  # a wheel ships no source: nothing to compare the build with
        return None
    import hashlib  # only a source checkout pays for it (a wheel holds no source: pyproject.toml)

    if getattr(module, "SOURCE_SHA256", None) == hashlib.sha256(text).hexdigest():
        return None
    return source


_speedups: Any = _load_speedups()


class _Absent:
    """Stands for the accelerator when it is not loaded: every function of it is None."""

    def __getattr__(self, name: str) -> None:
        return None


if TYPE_CHECKING:
    import dsh._speedups as _accelerator  # typed by src/dsh/_speedups.pyi
else:
    _accelerator = _speedups if _speedups is not None else _Absent()

_T = TypeVar("_T")


def _optional(function: _T) -> _T | None:
    """An accelerator function as typed by the stub, or None (it is None when not loaded)."""
    return function

# Internal constructors: skip the Python-level __init__ guard (it triples construction cost).
_dict_new = dict.__new__
_dict_update = dict.update
_list_new = list.__new__
_list_extend = list.extend


def _untrack_nothing(obj: object) -> bool:
    return False


# _untrack(container) -> bool: take a frozen container whose contents are already frozen JSON
# out of the cyclic GC (a no-op without the accelerator). For other modules' fast constructors
# (e.g. events.as_event); never call it on unvalidated contents: snapshot_json trusts the result.
_untrack: Any = _speedups.untrack if _speedups is not None else _untrack_nothing

if _speedups is not None:

    def _frozen_dict(items: dict[str, Any]) -> FrozenDict:
        d = _dict_new(FrozenDict)
        _dict_update(d, items)
        _untrack(d)  # immutable, so never part of a cycle: keep it out of the cyclic GC
        return d

    def _frozen_list(items: Any) -> FrozenList:
        lst = _list_new(FrozenList)
        _list_extend(lst, items)
        _untrack(lst)
        return lst
else:

    def _frozen_dict(items: dict[str, Any]) -> FrozenDict:
        d = _dict_new(FrozenDict)
        _dict_update(d, items)
        return d

    def _frozen_list(items: Any) -> FrozenList:
        lst = _list_new(FrozenList)
        _list_extend(lst, items)
        return lst


def is_safe_int(value: object) -> bool:
    """Return True for an ``int`` (never a ``bool``) within ±(2^53 − 1) (``Number.isSafeInteger``).

    Rule: docs/formats.md#lossless-json. Integral floats are normalised to ``int`` at every door
    (snapshot and decode), so this predicate only needs the ``int`` branch.
    """
    return type(value) is int and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER


def _path(frames: list[list[Any]], tail: str | int | None = None) -> str:
    parts = ["$"]
    for frame in frames[1:]:
        key = frame[3]
        parts.append(f"[{key}]" if type(key) is int else f".{key}")
    if tail is not None:
        parts.append(f"[{tail}]" if type(tail) is int else f".{tail}")
    return "".join(parts)


def _fix_str(value: str) -> str:
    """Join surrogate pairs held as two code points; keep lone surrogates (JS string semantics)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    return value


def _scalar(value: Any, where: str) -> object:
    """Validate one non-container value; return its snapshot or raise InvalidJsonError."""
    t = type(value)
    if t is str:
        return value if value.isascii() else _fix_str(value)
    if value is None or t is bool:
        return value
    if t is int:
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return value
        shown = value if value.bit_length() < 4000 else f"of {value.bit_length()} bits"
        raise InvalidJsonError(
            f"integer {shown} at {where} is beyond ±(2^53-1); a JavaScript reader would round it",
            json_path=where)
    if t is float:
        f: float = value
        if math.isnan(f) or math.isinf(f):
            raise InvalidJsonError(f"{f} at {where} is not a finite number", json_path=where)
        if f == 0.0 and math.copysign(1.0, f) < 0:
            raise InvalidJsonError(f"-0.0 at {where} would be written as 0", json_path=where)
        if f.is_integer() and -MAX_SAFE_INTEGER <= f <= MAX_SAFE_INTEGER:
            return int(f)
        return f
    raise InvalidJsonError(
        f"{t.__name__} at {where} is not JSON (accepted: None, bool, str, int, float, dict, list)",
        json_path=where)


_CONTAINERS: Final = (dict, FrozenDict, list, FrozenList)


class _Slow(Exception):
    """Internal: the fast path met something it leaves to the exact iterative walk."""


_FAST_DEPTH: Final = 200

# The C versions of _fast and _freeze_parsed (same results; they raise _CFallback where the
# Python versions raise _Slow). None without the accelerator.
_c_snapshot = _optional(_accelerator.snapshot)
_c_freeze_parsed = _optional(_accelerator.freeze_parsed)
_CFallback: type[Exception] = _speedups.Fallback if _speedups is not None else _Slow

# Load-path accelerators for the layers above (None without the accelerator: their pure-Python
# loops are the reference). See _speedups.pyi for what each one takes and where it stops.
c_scan_lines = _optional(_accelerator.scan_lines)
c_admit_plain = _optional(_accelerator.admit_plain)
c_snapshot_events = _optional(_accelerator.snapshot_events)
c_stored_prescan = _optional(_accelerator.stored_prescan)
c_decode_rows = _optional(_accelerator.decode_rows)
c_message_shape_ok = _optional(_accelerator.message_shape_ok)
# Session.append's shape check (accept path) and envelope in one call (reference: the
# Python build in dsh.session._session.Session.append)
c_append_event = _optional(_accelerator.append_event)
# raised by a c_* pass that leaves the value to its caller's Python reference
CFallback: type[Exception] = _CFallback
c_rows_text = _optional(_accelerator.rows_text)
c_encode_rows = _optional(_accelerator.encode_rows)
# encode_rows and the seal chain digest of the batch in one pass (references: the SQLite
# encode_batch and dsh.persistence._chain.event_leaves)
c_encode_sealed_rows = _optional(_accelerator.encode_sealed_rows)
c_plain_numbers = _optional(_accelerator.plain_numbers)
c_line_scan = _optional(_accelerator.line_scan)
# decode_line's common line in one call (reference: dsh.interop._common.decode_line)
c_decode_plain = _optional(_accelerator.decode_plain)
# the first read of a Claude Code import, its clock and its envelopes (references:
# dsh.interop._claude_code _Scan.add / BranchIndex.add / _envelope, _common._utc_millis)
c_claude_line = _optional(_accelerator.claude_line)
c_utc_millis = _optional(_accelerator.utc_millis)
c_claude_envelope = _optional(_accelerator.claude_envelope)
# an assistant line's blocks and usage in the second read (references:
# dsh.interop._anthropic.anthropic_blocks and anthropic_usage)
c_claude_blocks = _optional(_accelerator.claude_blocks)
c_claude_usage = _optional(_accelerator.claude_usage)
# a common line of the second read mapped to its events (reference:
# dsh.interop._claude_code._map)
c_claude_map = _optional(_accelerator.claude_map)
c_seqs_contiguous = _optional(_accelerator.seqs_contiguous)
c_gather_messages = _optional(_accelerator.gather_messages)
c_seqs_below = _optional(_accelerator.seqs_below)
c_running_sums_below = _optional(_accelerator.running_sums_below)
c_widen_sums_below = _optional(_accelerator.widen_sums_below)
# the seal chain's canonical bytes and leaves (references: dumps_canonical below and
# dsh.persistence._chain.event_leaves)
c_canonical = _optional(_accelerator.canonical)
c_chain_leaves = _optional(_accelerator.chain_leaves)
c_chain_digest = _optional(_accelerator.chain_digest)
# an adapter's records cut out of a stored row's text (reference:
# dsh.adapters._records.python_record_texts)
c_record_texts = _optional(_accelerator.record_texts)
c_pick_rows = _optional(_accelerator.pick_rows)
# a selective read of SQLite rows and its seal check through SQLite's C API (reference: the
# Python read of dsh.persistence.sqlite._restore_point; usable once sqlite_bind succeeds)
c_sqlite_bind = _optional(_accelerator.sqlite_bind)
c_sqlite_open = _optional(_accelerator.sqlite_open)
c_read_rows = _optional(_accelerator.read_rows)
# zlib.crc32 by carry-less multiplication where the CPU has it (the same values; the seal
# checks of a read run it over every byte they check), else None: zlib.crc32 itself
c_crc32 = _optional(_accelerator.crc32) if _accelerator.CLMUL else None
# one durable SQLite batch's seal records and seal bytes, and a chain record's hash (by SHA-NI
# where the CPU has it) (references: dsh.persistence._seal.row_records / append_batch_to and
# dsh.persistence._chain.new_record's hashlib path)
c_seal_batch = _optional(_accelerator.seal_batch)
c_chain_hash = _optional(_accelerator.chain_hash)
# a restore fold's plain events in one pass (reference: the loop of
# dsh.session._restore_state.RestoreFold.feed)
c_fold_plain = _optional(_accelerator.fold_plain)


def _fast(v: Any, depth: int) -> Any:
    """Recursive snapshot for the common case; raises _Slow on anything unusual or deep."""
    t = type(v)
    if t is dict or t is FrozenDict:
        if depth > _FAST_DEPTH:
            raise _Slow
        d = depth + 1
        out = {}
        for k, x in v.items():
            if type(k) is not str:
                raise _Slow
            tx = type(x)
            if (tx is str and x.isascii()) or (
                    tx is int and -MAX_SAFE_INTEGER <= x <= MAX_SAFE_INTEGER):
                out[k] = x
            else:
                out[k] = _fast(x, d)
        return _frozen_dict(out)
    if t is list or t is FrozenList:
        if depth > _FAST_DEPTH:
            raise _Slow
        d = depth + 1
        items = []
        for x in v:
            if type(x) is str and x.isascii():
                items.append(x)
            else:
                items.append(_fast(x, d))
        return _frozen_list(items)
    if t is str:
        return v if v.isascii() else _fix_str(v)
    if t is int:
        if -MAX_SAFE_INTEGER <= v <= MAX_SAFE_INTEGER:
            return v
        raise _Slow
    if v is None or t is bool:
        return v
    if t is float and math.isfinite(v) and not (v == 0.0 and math.copysign(1.0, v) < 0):
        return int(v) if v.is_integer() and -MAX_SAFE_INTEGER <= v <= MAX_SAFE_INTEGER else v
    if isinstance(v, FrozenDict):  # our own subclasses (Event, SessionHeader) keep their type
        if depth > _FAST_DEPTH:
            raise _Slow
        return t({k: _fast(x, depth + 1) for k, x in v.items()})
    raise _Slow


def snapshot_json(value: object) -> JsonValue:
    """Validate ``value`` as lossless JSON and return an immutable copy, in one pass.

    Frozen containers that need no change are reused (they are immutable, so sharing is a copy).
    With the C accelerator, a frozen container made by this module (:func:`loads`, an earlier
    snapshot) is reused without being walked again.

    Args:
        value: ``None``, ``bool``, ``str``, ``int``, ``float``, ``dict`` with ``str`` keys,
            ``list``, or this module's frozen containers, nested to any depth.
    Returns:
        The same value built from :class:`FrozenDict` / :class:`FrozenList`, with integral floats
        as ``int`` and surrogate pairs joined.
    Raises:
        InvalidJsonError: NaN, ±inf, -0.0, an integer beyond ±(2^53 − 1), a non-``str`` key, a
            tuple, set, bytes or other object, or a cycle; ``where["json_path"]`` names the spot.
    Rule: docs/formats.md#lossless-json, docs/rules.md#immutability.
    """
    if _c_snapshot is not None:
        try:
            return _c_snapshot(value)
        except _CFallback:
            return _snapshot_walk(value)
    try:
        return _fast(value, 0)
    except _Slow:
        return _snapshot_walk(value)


def _snapshot_walk(value: Any) -> JsonValue:
    """The exact iterative walk: any depth, cycle detection and a JSON path in every error."""
    t = type(value)
    if t not in _CONTAINERS:
        if isinstance(value, FrozenDict):
            return t(_snapshot_walk(dict(value)))
        return _scalar(value, "$")
    # frame: [source, iterator, out (dict | list), key in parent, changed]
    is_map = t is dict or t is FrozenDict
    frames: list[list[Any]] = [[value, iter(value.items() if is_map else value),
                                {} if is_map else [], None, t is dict or t is list]]
    ancestors = {id(value)}
    result: Any = None
    while frames:
        frame = frames[-1]
        src, it, out = frame[0], frame[1], frame[2]
        pushed = False
        if type(out) is dict:
            for key, child in it:
                if type(key) is not str:
                    raise InvalidJsonError(
                        f"key {key!r} at {_path(frames)} is not a string", json_path=_path(frames))
                ct = type(child)
                if ct is str and child.isascii():
                    out[key] = child
                elif ct in _CONTAINERS:
                    if id(child) in ancestors:
                        raise InvalidJsonError(f"cycle at {_path(frames, key)}",
                                               json_path=_path(frames, key))
                    ancestors.add(id(child))
                    cmap = ct is dict or ct is FrozenDict
                    frames.append([child, iter(child.items() if cmap else child),
                                   {} if cmap else [], key, ct is dict or ct is list])
                    pushed = True
                    break
                else:
                    try:
                        snap = _scalar(child, "") if ct is not str else _fix_str(child)
                    except InvalidJsonError as exc:
                        where = _path(frames, key)
                        raise InvalidJsonError(exc.message.replace(" at  ", f" at {where} "),
                                               json_path=where) from None
                    if snap is not child:
                        frame[4] = True
                    out[key] = snap
        else:
            for child in it:
                ct = type(child)
                if ct is str and child.isascii():
                    out.append(child)
                elif ct in _CONTAINERS:
                    if id(child) in ancestors:
                        where = _path(frames, len(out))
                        raise InvalidJsonError(f"cycle at {where}", json_path=where)
                    ancestors.add(id(child))
                    cmap = ct is dict or ct is FrozenDict
                    frames.append([child, iter(child.items() if cmap else child),
                                   {} if cmap else [], len(out), ct is dict or ct is list])
                    pushed = True
                    break
                else:
                    try:
                        snap = _scalar(child, "") if ct is not str else _fix_str(child)
                    except InvalidJsonError as exc:
                        where = _path(frames, len(out))
                        raise InvalidJsonError(exc.message.replace(" at  ", f" at {where} "),
                                               json_path=where) from None
                    if snap is not child:
                        frame[4] = True
                    out.append(snap)
        if pushed:
            continue
        frames.pop()
        ancestors.discard(id(src))
        if frame[4]:
            built: Any = _frozen_dict(out) if type(out) is dict else _frozen_list(out)
        else:
            built = src
        if not frames:
            result = built
            break
        parent = frames[-1]
        if built is not src:
            parent[4] = True
        if type(parent[2]) is dict:
            parent[2][frame[3]] = built
        else:
            parent[2].append(built)
    return result


def is_json(value: object) -> bool:
    """Return True when :func:`snapshot_json` would accept ``value``.

    Rule: docs/formats.md#lossless-json.
    """
    try:
        snapshot_json(value)
    except InvalidJsonError:
        return False
    return True


def json_equal(a: object, b: object) -> bool:
    """Deep JSON equality where ``True`` is never ``1`` (docs/formats.md#lossless-json).

    ``1 == 1.0`` stays true, as in JavaScript's single number type. Iterative.
    """
    stack: list[tuple[object, object]] = [(a, b)]
    while stack:
        x, y = stack.pop()
        tx, ty = type(x), type(y)
        if isinstance(x, dict):
            if not isinstance(y, dict) or x.keys() != y.keys():
                return False
            stack.extend((x[k], y[k]) for k in x)
        elif isinstance(x, list):
            if not isinstance(y, list) or len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
        elif (tx is bool) != (ty is bool) or x != y:
            return False
    return True


def thaw(value: JsonValue) -> Any:
    """Return a plain, mutable ``dict``/``list`` deep copy of a (frozen) JSON value. Iterative."""
    if not isinstance(value, dict | list):
        return value
    root: Any = {} if isinstance(value, dict) else []
    stack: list[tuple[Any, Any]] = [(value, root)]
    while stack:
        src, dst = stack.pop()
        items = src.items() if isinstance(src, dict) else enumerate(src)
        for key, child in items:
            if isinstance(child, dict | list):
                new: Any = {} if isinstance(child, dict) else []
                stack.append((child, new))
                child = new
            if isinstance(dst, dict):
                dst[key] = child
            else:
                dst.append(child)
    return root


# --- decoding -------------------------------------------------------------------------------


# A literal of 19+ digits may exceed 64 bits. In JSON only a sign, whitespace or '[' ',' ':'
# stand right before an integer's digits, and 'e' 'E' '+' '-' before an exponent's (the text's
# start too): a run after any other byte ('"', '.', a letter, '_') is inside a string or is a
# fraction's digits, which orjson rounds to the same float as the exact parser. So zero-padded
# ids and LangGraph's channel versions ("…0002.0.3019187406520124717") stay fast.
_LONG_NUMBER = re.compile(rb"(?<![^-+eE\[,: \t\n\r])[0-9]{19}")
_NUMBER_LEAD = bytes(b in b"-+eE[,: \t\n\r" for b in range(256))  # 1: may stand before one
# Every digit to "0", every other byte to " ": a 19-digit run is then a substring search,
# about 30x faster than the regex above over a long record (a base64 blob).
_DIGIT_RUNS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_RUN_19 = b"0" * 19


def has_long_number(raw: bytes | bytearray) -> bool:
    """True when ``_LONG_NUMBER`` matches ``raw``: a run of 19+ digits that may be a number's.

    The leftmost 19 zeros of the mapped bytes start a maximal digit run; a run after a byte
    no JSON number's digits follow (a quote, a dot, a letter) is no integer literal (no match
    anywhere in it), so the search goes on after that run. Rule: docs/formats.md#lossless-json.
    """
    mapped = raw.translate(_DIGIT_RUNS)
    pos = mapped.find(_RUN_19)
    while pos >= 0:
        if pos == 0 or _NUMBER_LEAD[raw[pos - 1]]:
            return True
        end = mapped.find(b" ", pos + 19)
        if end < 0:
            return False
        pos = mapped.find(_RUN_19, end)
    return False
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_WS = re.compile(r"[ \t\n\r]*")
_LITERALS: Final = {"true": True, "false": False, "null": None}


def _parse_fallback(text: str) -> Any:
    """Parse JSON text iteratively (any depth, lone-surrogate escapes kept); plain containers."""
    pos = _WS.match(text, 0).end()  # type: ignore[union-attr]  # the pattern always matches
    # stack frames: [container, pending key (for objects)]
    stack: list[list[Any]] = []
    value: Any = None
    n = len(text)

    def fail(msg: str, at: int) -> NoReturn:
        raise InvalidJsonError(f"JSON is malformed: {msg} (char {at})", json_path="$")

    while True:
        # parse one value at pos
        if pos >= n:
            fail("unexpected end of input", pos)
        ch = text[pos]
        if ch == "{" or ch == "[":
            pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
            close = "}" if ch == "{" else "]"
            if pos < n and text[pos] == close:
                value = {} if ch == "{" else []
                pos += 1
            else:
                stack.append([{} if ch == "{" else [], None])
                if ch == "{":
                    if pos >= n or text[pos] != '"':
                        fail("expected a string key", pos)
                    key, pos = scanstring(text, pos + 1, True)
                    pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
                    if pos >= n or text[pos] != ":":
                        fail("expected ':'", pos)
                    pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
                    stack[-1][1] = key
                continue
        elif ch == '"':
            value, pos = scanstring(text, pos + 1, True)
        else:
            m = _NUMBER.match(text, pos)
            if m and m.end() > pos:
                lit = m.group(0)
                value = float(lit) if (m.group(1) or m.group(2)) else int(lit)
                pos = m.end()
            else:
                for word, lit_value in _LITERALS.items():
                    if text.startswith(word, pos):
                        value = lit_value
                        pos += len(word)
                        break
                else:
                    fail(f"unexpected character {ch!r}", pos)
        # attach value to its parent, unwinding closed containers
        while True:
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if not stack:
                if pos != n:
                    fail("trailing data", pos)
                return value
            container, key = stack[-1]
            if type(container) is dict:
                container[key] = value
                if pos < n and text[pos] == ",":
                    pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
                    if pos >= n or text[pos] != '"':
                        fail("expected a string key", pos)
                    key, pos = scanstring(text, pos + 1, True)
                    pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
                    if pos >= n or text[pos] != ":":
                        fail("expected ':'", pos)
                    pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
                    stack[-1][1] = key
                    break
                if pos < n and text[pos] == "}":
                    pos += 1
                    value = stack.pop()[0]
                    continue
                fail("expected ',' or '}'", pos)
            else:
                container.append(value)
                if pos < n and text[pos] == ",":
                    pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
                    break
                if pos < n and text[pos] == "]":
                    pos += 1
                    value = stack.pop()[0]
                    continue
                fail("expected ',' or ']'", pos)


def loads(data: bytes | str) -> JsonValue:
    """Decode one JSON text into frozen, validated containers.

    Args:
        data: UTF-8 bytes or text of one JSON value (a record without its ``\\n``).
    Returns:
        The value as :func:`snapshot_json` would return it.
    Raises:
        InvalidJsonError: malformed JSON; ``NaN``, ``Infinity`` or an overflowing number such as
            ``1e400``; an integer beyond ±(2^53 − 1) (a JavaScript reader would round it).
    Rule: docs/formats.md#lossless-json. Escaped lone surrogates stay lone surrogates;
    an escaped valid pair decodes to one code point.
    """
    try:
        raw = data if isinstance(data, bytes | bytearray) else data.encode("utf-8",
                                                                          "surrogatepass")
        if has_long_number(raw):
            # orjson reads integers past 64 bits as floats; let the exact parser see the literal
            raise orjson.JSONDecodeError("recursion: long number literal", "", 0)
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        try:
            text = data.decode("utf-8", "strict") if isinstance(data, bytes | bytearray) else data
        except UnicodeDecodeError as bad:
            raise InvalidJsonError(
                f"JSON is not valid UTF-8: {bad.reason} at byte {bad.start}", json_path="$",
                byte_offset=bad.start) from None
        if "surrogate" not in str(exc) and "depth" not in str(exc) and "recursion" not in str(exc):
            raise InvalidJsonError(f"JSON is malformed: {exc}", json_path="$") from None
        try:
            parsed = _parse_fallback(text)
        except ValueError as inner:  # scanstring's own errors
            if isinstance(inner, InvalidJsonError):
                raise
            raise InvalidJsonError(f"JSON is malformed: {inner}", json_path="$") from None
        return snapshot_json(parsed)
    if _c_freeze_parsed is not None:
        try:
            return _c_freeze_parsed(parsed)
        except _CFallback:
            return _snapshot_walk(parsed)  # the exact walk names the offending spot
    try:
        return _freeze_parsed(parsed, 0)
    except _Slow:
        return snapshot_json(parsed)  # the exact walk names the offending spot


def loads_plain(data: bytes, *, long_number: bool | None = None) -> Any:
    """Decode one JSON text as :func:`loads` does, into plain mutable dicts and lists.

    The same value as ``thaw(loads(data))`` and the same errors, without building the frozen
    copy: what orjson parsed is checked in place (integers within ±(2^53 − 1), integral floats
    made ints as :func:`loads` makes them); anything unusual (a long literal, ``-0.0``, a
    decode error, a lone surrogate) goes through :func:`loads`. ``long_number``: what
    :func:`has_long_number` answers for ``data``, when the caller has it already.

    Raises:
        InvalidJsonError: as :func:`loads`.
    """
    if long_number is None:
        long_number = has_long_number(data)
    if not long_number:
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            parsed = _SLOW
        if parsed is not _SLOW and (c_plain_numbers or _plain_numbers)(parsed):
            return parsed
    return thaw(loads(data))


_SLOW: Final = object()


def _plain_numbers(value: Any) -> bool:
    """Check (and fix in place) the numbers of a parsed tree; False: take the exact path."""
    if type(value) is not dict and type(value) is not list:
        return type(value) is not int and type(value) is not float  # a bare number: exact path
    stack = [value]
    while stack:
        container = stack.pop()
        items = container.items() if type(container) is dict else enumerate(container)
        for key, child in items:
            kind = type(child)
            if kind is dict or kind is list:
                stack.append(child)
            elif kind is int:
                if not -MAX_SAFE_INTEGER <= child <= MAX_SAFE_INTEGER:
                    return False
            elif kind is float and child.is_integer() and (
                    -MAX_SAFE_INTEGER <= child <= MAX_SAFE_INTEGER):
                if child == 0.0 and math.copysign(1.0, child) < 0:
                    return False
                container[key] = int(child)
    return True


def _freeze_parsed(v: Any, depth: int) -> Any:
    """Freeze what orjson parsed: keys are ``str``, strings hold no surrogates, floats are finite.

    Only numbers need checking (orjson accepts 64-bit integers and ``-0.0``). The parsed tree is
    owned, so children are replaced in place before the container is copied frozen.
    """
    t = type(v)
    if t is dict:
        if depth > _FAST_DEPTH:
            raise _Slow
        for k, x in v.items():
            tx = type(x)
            if tx is dict or tx is list or tx is float or tx is int:
                v[k] = _freeze_parsed(x, depth + 1)
        return _frozen_dict(v)
    if t is list:
        if depth > _FAST_DEPTH:
            raise _Slow
        for i, x in enumerate(v):
            tx = type(x)
            if tx is dict or tx is list or tx is float or tx is int:
                v[i] = _freeze_parsed(x, depth + 1)
        return _frozen_list(v)
    if t is int:
        if -MAX_SAFE_INTEGER <= v <= MAX_SAFE_INTEGER:
            return v
        raise _Slow
    if t is float:
        if v.is_integer() and -MAX_SAFE_INTEGER <= v <= MAX_SAFE_INTEGER:
            if v == 0.0 and math.copysign(1.0, v) < 0:
                raise _Slow
            return int(v)
        return v
    return v


# --- encoding -------------------------------------------------------------------------------

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPE = re.compile(r'[\x00-\x1f\\"\ud800-\udfff]')
_ESCAPES: Final = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
                   "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group(0)
    return _ESCAPES.get(ch) or f"\\u{ord(ch):04x}"


def _encode_str(value: str) -> str:
    return '"' + _ESCAPE.sub(_escape, value) + '"'


def _encode_leaf(value: Any) -> str:
    return _encode_str(value) if type(value) is str else orjson.dumps(value).decode()


def _encode_fallback(value: Any, *, sort_keys: bool = False) -> bytes:
    """Encode iteratively (any depth), escaping lone surrogates so the UTF-8 stays valid."""
    return _render(value, key=_encode_str, leaf=_encode_leaf, comma=",", colon=":",
                   sort_keys=sort_keys).encode("utf-8")


def dumps(value: JsonValue) -> bytes:
    """Encode a snapshot-valid JSON value as compact UTF-8 JSON, keys in insertion order.

    Output matches ``JSON.stringify`` for strings (U+2028/U+2029 and other non-ASCII text stay
    raw; lone surrogates are escaped as ``\\udXXX`` so the bytes are valid UTF-8) and never holds
    a raw ``\\n``, so it is safe as one record of a JSONL file.

    Frozen containers are trusted (they are what :func:`snapshot_json` and :func:`loads`
    return); any other value is validated with :func:`snapshot_json` first.

    Raises:
        InvalidJsonError: a non-frozen value holds something :func:`snapshot_json` refuses.
    Rule: docs/formats.md#lossless-json.
    """
    if not isinstance(value, FrozenDict | FrozenList):
        value = snapshot_json(value)
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        if "surrogates" not in str(exc) and "ecursion" not in str(exc):
            raise InvalidJsonError(f"value is not JSON: {exc}", json_path="$") from None
    return _encode_fallback(value)


def dumps_canonical(value: JsonValue) -> bytes:
    """Encode like :func:`dumps`, with every object's keys in code point order.

    The same value gives the same bytes however its keys were ordered when it was built or
    stored (a store may write an event's envelope fields back in its own order), so this is
    the form that is hashed (docs/formats.md#the-seal-chain).

    Raises:
        InvalidJsonError: a non-frozen value holds something :func:`snapshot_json` refuses.
    """
    if not isinstance(value, FrozenDict | FrozenList):
        value = snapshot_json(value)
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as exc:
        if "surrogates" not in str(exc) and "ecursion" not in str(exc):
            raise InvalidJsonError(f"value is not JSON: {exc}", json_path="$") from None
    return _encode_fallback(value, sort_keys=True)



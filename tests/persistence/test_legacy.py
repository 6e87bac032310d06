"""Legacy v0 shapes: which stored events normalisation may touch, and the one-pass prescan.

:func:`legacy_plain` and :func:`python_stored_prescan` are the rule (docs/events.md#legacy-shapes,
docs/events.md#known-types-and-ignorable-events); the C accelerator's ``stored_prescan`` must
answer as they do (tests/test_speedups_load.py). These tests run with and without it.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsh.json as dj
from dsh._errors import LogCorruptError
from dsh.persistence._legacy import (
    legacy_plain,
    normalize_legacy_events,
    python_stored_prescan,
    stored_prescan,
)
from dsh.session._events import KNOWN_EVENT_TYPES, Event, as_event
from tests.strategies import examples

pytestmark = pytest.mark.no_speedups


def make(etype: Any, seq: int, data: Any, **extra: Any) -> Event:
    return as_event(dj.snapshot_json({"type": etype, "seq": seq, "time": 1, "data": data,
                                      **extra}))


MSG = {"id": "m", "role": "user", "source": {"kind": "user"}, "content": []}
LEGACY_CASES: list[Event] = [
    make("turn/start", 0, {"turn": 1}), make("turn/start", 0, {"turn": 1, "trigger": {}}),
    make("turn/start", 0, [1]), make("turn/end", 0, None),
    *(make("turn/end", 0, {"turn": 1, "reason": r}) for r in (
        {"kind": "completed"}, {"kind": "completed", "x": 1}, {"kind": "blocked"},
        {"kind": "max-tokens"}, {"kind": "interrupted"}, {"kind": "aborted"},
        {"kind": "aborted", "reason": {"kind": "user"}}, {"kind": "disposed"},
        {"kind": "error"}, {"kind": "error", "error": {"message": "m", "code": "C"}},
        {"kind": "error", "message": "m"}, {"kind": "error", "failure": {"message": "m",
                                                                          "code": "C"}},
        {"kind": "other"}, {"kind": 3}, "completed")),
    make("turn/end", 0, {"turn": 0, "reason": {"kind": "completed"}}),
    make("turn/end", 0, {"turn": True, "reason": {"kind": "completed"}}),
    make("turn/end", 0, {"turn": 1, "reason": {"kind": "completed"}, "x": 1}),
    make("request/header", 0, {"header": {}, "reason": "fallback"}),
    make("request/header", 0, {"header": {}, "reason": "initial"}),
    make("request/header-delta", 0, {}), make("mode/set", 0, {}),
    make("steering/message", 0, {"turn": 1, "message": MSG}),
    make("user/message", 0, MSG), make("user/message", 0, {"content": [], "source": {}}),
    make("user/message", 0, {"content": [], "source": {}, "role": "user"}),
    make("assistant/message", 0, {"message": MSG}),
    make("assistant/message", 0, {"content": [], "provenance": {"provider": "p"}}),
    make("assistant/message", 0, {"content": [], "provenance": 3}),
    make("tool/result", 0, {"message": MSG}),
    make("tool/result", 0, {"callId": "c", "content": [], "isError": False}),
    make("tool/result", 0, {"callId": "c", "content": []}),
    make("x/unknown", 0, {}), make("x/unknown", 0, {}, ignorable=True),
    make("x/unknown", 0, {}, ignorable=False), make("todo/write", 0, {}),
]
"""One stored event per shape the legacy rules tell apart (and a few they must pass)."""

_TYPES = ["turn/start", "turn/end", "request/header", "request/header-delta", "mode/set",
          "steering/message", "user/message", "assistant/message", "tool/result", "todo/write",
          "x/unknown", "session/end-seed", 3, None]
_KEYS = ["turn", "reason", "trigger", "id", "role", "message", "content", "source",
         "provenance", "callId", "isError", "header", "x"]
_KINDS = ["completed", "blocked", "max-tokens", "interrupted", "aborted", "disposed", "error",
          "other", 3]
_scalars = st.one_of(st.integers(-2, 3), st.sampled_from([True, False, None, "fallback",
                                                          "initial", "x", 9007199254740991]))
_reasons = st.one_of(_scalars, st.fixed_dictionaries({"kind": st.sampled_from(_KINDS)}, optional={
    "reason": st.just({"kind": "user"}), "error": st.just({"message": "m", "code": "C"}),
    "failure": st.just({"message": "m", "code": "C"}), "message": st.just("m"),
    "x": st.just(1)}))
_data = st.one_of(_scalars, st.lists(_scalars, max_size=2), st.dictionaries(
    st.sampled_from(_KEYS), st.one_of(_scalars, _reasons, st.just({}), st.just([])), max_size=5))
stored_events = st.builds(
    lambda etype, data, ignorable: make(etype, 0, data, **ignorable),
    st.sampled_from(_TYPES), _data,
    st.sampled_from([{}, {"ignorable": True}, {"ignorable": False}, {"ignorable": 1}]))
"""Stored events near every legacy rule's edges: types, payload keys, reason kinds, marks."""


def _untouched(event: Event) -> bool:
    try:
        return normalize_legacy_events([event], "s")[0] is event
    except LogCorruptError:
        return False


def test_an_event_called_plain_is_left_as_it_is_by_normalisation() -> None:
    for event in LEGACY_CASES:
        if legacy_plain(event):
            assert _untouched(event), event


@settings(max_examples=examples(300), deadline=None)
@given(event=stored_events)
def test_any_event_called_plain_is_left_as_it_is_by_normalisation(event: Event) -> None:
    if legacy_plain(event):
        assert _untouched(event)


def test_every_legacy_shape_is_flagged() -> None:
    flagged = [e for e in LEGACY_CASES if not legacy_plain(e)]
    assert len(flagged) >= 15  # the legacy shapes are found, not just passed
    for event in LEGACY_CASES:
        if not _untouched(event):  # rewritten or refused: never called plain
            assert not legacy_plain(event), event
    assert all(legacy_plain(e) for e in LEGACY_CASES[-4:])  # new types are not legacy


def test_the_prescan_names_the_first_legacy_and_the_first_unknown_event() -> None:
    plain, legacy = LEGACY_CASES[0], LEGACY_CASES[1]  # turn/start, then one with a trigger
    unknown, marked = make("x/unknown", 0, {}), make("x/unknown", 0, {}, ignorable=True)
    assert python_stored_prescan([], KNOWN_EVENT_TYPES) == (-1, -1)
    assert python_stored_prescan([plain, marked, plain], KNOWN_EVENT_TYPES) == (-1, -1)
    assert python_stored_prescan([plain, legacy, unknown, legacy], KNOWN_EVENT_TYPES) == (1, 2)
    assert python_stored_prescan([unknown, plain, legacy], KNOWN_EVENT_TYPES) == (2, 0)
    assert python_stored_prescan([plain, "not a record", legacy], KNOWN_EVENT_TYPES) == (1, 1)
    assert python_stored_prescan([legacy, 7], KNOWN_EVENT_TYPES) == (0, 1)


@settings(max_examples=examples(200), deadline=None)
@given(events=st.lists(stored_events, max_size=6), as_tuple=st.booleans())
def test_stored_prescan_answers_as_the_python_rule(events: list[Event], as_tuple: bool) -> None:
    # with the accelerator built this is its C pass; with DSH_NO_SPEEDUPS=1 the reference
    seq: Any = tuple(events) if as_tuple else events
    assert stored_prescan(seq, KNOWN_EVENT_TYPES) == python_stored_prescan(seq, KNOWN_EVENT_TYPES)

"""The restore fold's loop in C (``_speedups.fold_plain``) against the Python loop it serves.

Rule: docs/rules.md#restore-points-are-never-the-truth (a writer's fold of its durable batches
is the state a full restore of the same prefix holds). ``RestoreFold.feed`` folds the events
the accelerator can (plain events, surface appends, turn boundaries) in one call and leaves
the rest (replaces, request folds, end-seed markers, anything of another shape) to its loop:
fed the same batches, a fold must end in the same state, slot by slot, with it and without it.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dsh.json as dj
from dsh.json import snapshot_json
from dsh.session import RestoreFold, Session
from dsh.session import _restore_state as rs
from dsh.session._events import SURFACE_EVENT_TYPES, Event
from tests.strategies import StepClock, apply_script, examples, log_scripts

if dj.c_fold_plain is None:
    pytest.skip("SKIPPED LOUDLY: dsh._speedups is not built or DSH_NO_SPEEDUPS is set; the C "
                "restore fold is not compared", allow_module_level=True)


def _slots(fold: RestoreFold) -> dict[str, Any]:
    out = {name: getattr(fold, name) for name in RestoreFold.__slots__}
    out["_nodes"] = list(out["_nodes"])
    return out


def _fold_both(batches: list[list[Any]], monkeypatch: pytest.MonkeyPatch,
               inherited: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    with_c = RestoreFold(inherited)
    for batch in batches:
        with_c.feed(batch)
    with monkeypatch.context() as patch:
        patch.setattr(rs, "c_fold_plain", None)
        python = RestoreFold(inherited)
        for batch in batches:
            python.feed(batch)
    return _slots(with_c), _slots(python)


@settings(max_examples=examples(60), deadline=None)
@given(script=log_scripts(open_tail=None, max_actions=8), data=st.data())
def test_a_fold_in_c_equals_the_python_fold_over_any_split_of_a_log(
        script: Any, data: st.DataObject) -> None:
    events = list(apply_script(Session.create("s", clock=StepClock()), script).events)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(events)), max_size=5)))
    batches = [events[a:b] for a, b in zip([0, *cuts], [*cuts, len(events)], strict=True)]
    batches.append(events[: len(events) // 2])  # a retried batch: skipped by both
    with pytest.MonkeyPatch.context() as monkeypatch:
        with_c, python = _fold_both(batches, monkeypatch)
    assert with_c == python


def _event(seq: int, etype: Any, data: Any = None, **extra: Any) -> Event:
    return Event(snapshot_json({"seq": seq, "type": etype, "time": 100 + seq,
                                "data": data if data is not None else {}, **extra}))


def test_the_c_fold_leaves_each_event_it_does_not_serve_to_python(
        monkeypatch: pytest.MonkeyPatch) -> None:
    message = {"role": "user", "content": []}
    events = [
        _event(0, "turn/start", {"turn": 7}),
        _event(1, "user/message", message, surfaceOp="append"),
        _event(2, "assistant/message", message, surfaceOp="append"),
        _event(3, "turn/end", {"turn": 7}),
        _event(4, "turn/start", {"turn": True}),  # a bool is no turn: 0
        _event(5, "request/header", {"header": {"model": "m"}}),  # Python's fold
        _event(6, "turn/start", {"turn": "8"}),
        _event(7, "system/message", message, surfaceOp="append"),
        _event(8, "user/message", message,
               surfaceOp={"op": "replace", "start": 7, "end": 7}),  # a replace: Python's
        _event(9, "session/end-seed", {"inherited": True}),  # Python's marker count
        _event(10, "request/context", {"k": 1}),
        _event(11, "turn/start", [1, 2]),  # data that is no object
        _event(12, "tool/result", message),  # a surface type without an op
        _event(13, "x/y", {"turn": 3}),
    ]
    with_c, python = _fold_both([events[:4], events[2:9], events[9:]], monkeypatch,
                                inherited=20)
    assert with_c == python
    assert python["_count"] == 14 and python["_last_turn"] == 0
    # where the C pass stops, and what it folded before
    assert dj.c_fold_plain is not None
    index, count, last_time, last_type, boundary, turn_open, last_turn, appended = \
        dj.c_fold_plain(events, 0, SURFACE_EVENT_TYPES, rs._FOLD_STOPS)
    assert (index, count, last_time, last_type) == (5, 5, 104, "turn/start")
    assert (boundary, turn_open, last_turn, appended) == (4, True, 0, [1, 2])
    stops = rs._FOLD_STOPS
    assert dj.c_fold_plain(events, 14, SURFACE_EVENT_TYPES, stops)[:4] == (14, 14, None, None)
    assert dj.c_fold_plain([], 3, SURFACE_EVENT_TYPES, stops) == (0, 3, None, None, None,
                                                                  False, None, [])


def test_the_c_fold_stops_at_every_type_the_loop_folds_itself() -> None:
    # the loop's own branches: request folds, end-seed markers, old adapter marks
    from dsh.session._old_marks import OLD_MARK_TYPES

    assert dj.c_fold_plain is not None
    assert OLD_MARK_TYPES <= rs._FOLD_STOPS
    for etype in sorted(rs._FOLD_STOPS):
        events = [_event(0, "x/y"), _event(1, etype), _event(2, "x/y")]
        assert dj.c_fold_plain(events, 0, SURFACE_EVENT_TYPES, rs._FOLD_STOPS)[:2] == (1, 1)


@pytest.mark.parametrize("odd", [
    {"seq": 2, "type": "x/y"},  # no time: Python's KeyError
    {"seq": "2", "type": "x/y", "time": 1},  # a seq that is no int
    {"seq": 2, "type": 5, "time": 1},  # a type that is no str
    {"seq": 2, "type": "turn/start", "time": 1},  # a turn/start without data
])
def test_the_c_fold_stops_at_an_event_of_another_shape(odd: dict[str, Any]) -> None:
    assert dj.c_fold_plain is not None
    events = [_event(0, "x/y"), _event(1, "turn/end"), odd]
    index, count, *_ = dj.c_fold_plain(events, 0, SURFACE_EVENT_TYPES, rs._FOLD_STOPS)
    assert (index, count) == (2, 2)


def test_the_c_fold_leaves_an_event_class_with_its_own_lookup_to_python() -> None:
    # [] and get() of another class are its own: the loop calls them, not the C pass
    class Loud(dj.FrozenDict):
        def get(self, key: str, default: Any = None) -> Any:
            return "append" if key == "surfaceOp" else super().get(key, default)

    assert dj.c_fold_plain is not None
    events = [_event(0, "x/y"), Loud({"seq": 1, "type": "user/message", "time": 1})]
    assert dj.c_fold_plain(events, 0, SURFACE_EVENT_TYPES, rs._FOLD_STOPS)[:2] == (1, 1)
    fold = RestoreFold(0)
    fold.feed(events)
    assert list(fold.state().nodes) == [1]  # the loop asked Loud.get

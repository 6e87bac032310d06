"""`dsh._verify.verify_paged` gives what `verify_events` gives, violation for violation.

The paged form runs restore's checks batch by batch through a restore-mode ``SeedStream`` and
reads the log by seq instead of holding it (docs/interop.md#streaming-imports relies on it for
dsh logs). Compared here on the same logs: well-formed random ones, the same damaged (one event's
key dropped or set, as the restore speedup tests damage them), and the hand-made violations of
``tests/test_verify.py``, with batches of 1, 3 and 5,000 events, and as a view that is not a
list, with and without the event types told (``types=``, ``unignored_types=``) and the seqs
proven in order (``contiguous=``), as the streamed import tells them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh import Violation
from dsh._verify import verify_events, verify_paged
from dsh.session import Event
from dsh.session._events import as_event
from dsh.session._session import Session
from dsh.testing import LogBuilder, header, make
from tests.strategies import StepClock, apply_script, examples, log_scripts
from tests.test_verify import _answered

_DAMAGE = [("seq", 99), ("seq", True), ("time", 2**53), ("time", "1"), ("type", 3),
           ("type", "request/header-delta"), ("type", "session/end-seed"), ("extra", 1),
           ("ignorable", True), ("data", None), ("drop", "data"), ("type", "user/message"),
           ("type", "turn/start"), ("type", "step/end"), ("type", "tool/result"),
           ("type", "assistant/message"), ("type", "compaction/start"), ("type", "x/unknown"),
           ("data", {"turn": 0}), ("data", {"turn": 1, "step": True}), ("surfaceOp", "append"),
           ("sourceEventSeqs", [0, 1]), ("sourceEventSeqs", [99]), ("drop", "surfaceOp"),
           ("drop", "type")]


def _outcome(run: Callable[[], list[Violation]]) -> tuple[Any, ...]:
    # a check that raises on some damage (a KeyError of the bracket check on an event without
    # data) must raise the same way in both forms
    try:
        return ("ok", run())
    except (KeyError, TypeError, AttributeError) as error:
        return ("raised", type(error).__name__, str(error))


def _same(events: list[Any], head: Any) -> None:
    whole = _outcome(lambda: verify_events(events, header=head))
    if any(type(event) is not Event for event in events):
        return  # the envelope pass of verify_events; the paged form takes frozen events
    for batch in (1, 3, 5_000):
        assert _outcome(lambda b=batch: verify_paged(events, header=head,  # type: ignore[misc]
                                                     batch_events=b)) == whole
    # A log that is not a list (a file-backed view) walks the type checks unless the caller
    # tells the types it collected: both give the same violations.
    view = tuple(events)
    kinds = {event.get("type") for event in events}
    told = kinds if all(type(kind) is str for kind in kinds) else None
    unignored = {event.get("type") for event in events if event.get("ignorable") is not True}
    plain = unignored if told is not None else None
    assert _outcome(lambda: verify_paged(view, header=head, types=told,
                                         unignored_types=plain)) == whole
    assert _outcome(lambda: verify_paged(view, header=head)) == whole
    if all(type(event.get("seq")) is int and event.get("seq") == index  # proven in order
           for index, event in enumerate(events)):
        assert _outcome(lambda: verify_paged(view, header=head, types=told,
                                             unignored_types=plain, contiguous=True)) == whole


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(script=log_scripts(open_tail=None), damage=st.one_of(
    st.none(), st.tuples(st.floats(0, 1), st.sampled_from(_DAMAGE))),
    plain_header=st.booleans())
def test_paged_verify_matches_whole_on_random_and_damaged_logs(
        script: Any, damage: Any, plain_header: bool) -> None:
    session = Session.create("s", clock=StepClock())
    apply_script(session, script)
    events: list[Any] = list(session.events)
    if damage is not None and events:
        i = min(len(events) - 1, int(len(events) * damage[0]))
        key, value = damage[1]
        fields = dict(events[i])
        if key == "drop":
            fields.pop(value, None)
        else:
            fields[key] = value
        events[i] = as_event(fields)
    _same(events, dict(session.header) if plain_header else None)


@pytest.mark.parametrize("case", ["valid", "open", "orphan", "duplicate", "unknown", "header",
                                  "seed-length"])
def test_paged_verify_matches_whole_on_hand_made_violations(case: str) -> None:
    events = _answered()
    head: dict[str, Any] = dict(header("s"))
    if case == "open":
        builder = LogBuilder("s")
        builder.completed_turn()
        builder.tool_call_turn("call_1")
        events = list(builder.events)
    elif case == "orphan":
        events = events[:11] + events[12:]
        events = [as_event({**dict(e), "seq": n}) for n, e in enumerate(events)]
    elif case == "duplicate":
        events = [*events, as_event({**dict(events[11]), "seq": len(events)})]
    elif case == "unknown":
        events = [*events, make(len(events), "x/unknown", {"a": 1}, time=events[-1]["time"])]
    elif case == "header":
        head["version"] = 7
    elif case == "seed-length":
        head["seedLength"] = 3
    _same(events, head)

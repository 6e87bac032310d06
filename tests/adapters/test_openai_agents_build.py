"""The SDK session's event build gives the same events and errors with and without the C path.

``Session.append`` builds each event and runs the core shape check's accept path in one C call
(``append_event``, docs/architecture.md#the-c-accelerator); the recorder and the turn shaper
take fewer steps an event. Random ``add_items`` batch sequences (tests/strategies.py
``responses_batches``: repeated and unanswered calls, refused items, opaque input) must give
the same seqs, the same event bytes and the same errors on the C path as on the pure-Python
path, in process (the C call switched off) and in fresh processes with ``DSH_NO_SPEEDUPS=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

import dsh.session._session as session_module
from dsh._errors import EventRejectedError
from dsh.json import dumps
from dsh.session import Session
from tests.adapters.build_paths import outcomes
from tests.strategies import examples, responses_batches, user_message

pytestmark = pytest.mark.no_speedups

CHILD = Path(__file__).with_name("build_child.py")


def _child(examples_count: int, *, no_speedups: bool) -> list[Any]:
    env = {k: v for k, v in os.environ.items() if k != "DSH_NO_SPEEDUPS"}
    if no_speedups:
        env["DSH_NO_SPEEDUPS"] = "1"
    done = subprocess.run([sys.executable, str(CHILD), str(examples_count)], env=env,
                          capture_output=True, text=True, check=True, timeout=600)
    found: list[Any] = json.loads(done.stdout)
    return found


def test_build_gives_the_same_events_and_errors_without_the_accelerator() -> None:
    with_c = _child(60, no_speedups=False)
    without = _child(60, no_speedups=True)
    assert [batches for batches, _ in with_c] == [batches for batches, _ in without]
    assert with_c == without
    # the draws reach what the build does: long turns, tool results, and refusals
    found = [outcome for _, outcomes_of in with_c for outcome in outcomes_of]
    assert sum(len(o["events"]) for o in found) > 500
    assert any('"type":"tool/result"' in e for o in found for e in o["events"])
    assert any(o["error"] and o["error"][1] == "ADAPTER_ITEM" for o in found)


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(responses_batches())
def test_build_gives_the_same_events_with_the_c_call_switched_off(
        batches: list[list[dict[str, Any]]]) -> None:
    with_c = outcomes(batches)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(session_module, "c_append_event", None)
        without = outcomes(batches)
    assert with_c == without


def _append_outcome(events: list[tuple[str, Any, dict[str, Any]]]) -> list[Any]:
    """Append ``events`` (type, data, keywords) to a fresh session: bytes or the error."""
    session = Session.create("shapes", clock=lambda: 7)
    out: list[Any] = []
    for etype, data, keywords in events:
        try:
            out.append(dumps(session.append(etype, data, **keywords)).decode())
        except EventRejectedError as exc:
            out.append([exc.code, exc.message, dict(exc.where)])
    return out


_TURN = ("turn/start", {"turn": 1}, {})
_STEP = ("step/start", {"turn": 1, "step": 1}, {})
SHAPES = {
    "turn numbers": [("turn/start", {"turn": 0}, {}), ("turn/start", {"turn": 1, "x": 1}, {}),
                     _TURN, ("step/start", {"turn": 1, "step": True}, {}), _STEP,
                     ("step/end", {"turn": 1}, {}),
                     ("turn/end", {"turn": 1, "reason": {"kind": "completed", "x": 1}}, {}),
                     ("turn/end", {"turn": 1, "reason": {"kind": "error"}}, {}),
                     ("turn/end", {"turn": 1, "reason": {"kind": "aborted", "reason": {}}}, {})],
    "messages": [_TURN, _STEP,
                 ("user/message", {"role": "user", "content": [], "source": {"kind": "user"}},
                  {"surface_op": "append"}),
                 ("user/message", user_message("hi"), {"surface_op": "append"}),
                 ("user/message", user_message("again"), {}),
                 ("assistant/message", {"turn": 1, "step": 1, "message": {
                     "id": "a1", "role": "assistant", "content": [],
                     "source": {"kind": "model", "provider": "p"}}}, {"surface_op": "append"}),
                 ("tool/result", {"turn": 1, "step": 1, "message": {
                     "id": "r1", "role": "user", "source": {"kind": "tool", "callId": "c1"},
                     "content": [{"type": "tool-result", "toolCallId": "c2", "content": []}]}},
                  {"surface_op": "append", "source_event_seqs": [0]})],
    "envelopes": [("myapp/note", {"a": 1}, {"ignorable": True}),
                  ("myapp/note", {"a": 1}, {"ignorable": True, "source_event_seqs": [0]}),
                  ("request/header", {"header": {}, "reason": "initial"}, {}),
                  ("steering/message", {}, {}), ("mode/set", {}, {}),
                  ("turn/start", {"turn": 1}, {"surface_op": "append"})],
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_append_refuses_and_builds_alike_with_the_c_call_switched_off(name: str) -> None:
    with_c = _append_outcome(SHAPES[name])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(session_module, "c_append_event", None)
        without = _append_outcome(SHAPES[name])
    assert with_c == without
    assert any(isinstance(o, str) for o in with_c) and any(isinstance(o, list) for o in with_c)

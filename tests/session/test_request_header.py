"""Request header and request context folds (docs/rules.md#the-request-header)."""

from __future__ import annotations

from typing import Any

import pytest

from dsh._errors import EventRejectedError
from dsh.json import FrozenDict, snapshot_json
from dsh.session._events import Event
from dsh.session._session import (
    Session,
    call_config_equals,
    canonical_header,
    fold_request_header,
    header_equals,
)
from tests.strategies import StepClock

TOOL_A = {"name": "a", "description": "A", "parameters": {"type": "object", "properties": {}}}
TOOL_B = {"name": "b", "description": "B", "parameters": {"type": "object"}}
CONFIG = {"provider": "deepseek", "model": "v4"}


def header(**parts: Any) -> dict[str, Any]:
    return {"config": dict(CONFIG), **parts}


def canon(**parts: Any) -> FrozenDict:
    return canonical_header(snapshot_json(header(**parts)))


def header_event(seq: int, h: dict[str, Any], reason: str = "initial") -> Event:
    return Event(snapshot_json({"type": "request/header", "seq": seq, "time": 1,
                                "data": {"header": h, "reason": reason}}))


def fresh() -> Session:
    return Session.create("s", clock=StepClock())


def test_canonical_header_normalizes_empty_optional_fields_and_keeps_populated_ones() -> None:
    assert canon(adapterDefaults={}, system="", tools=[]) == {"config": CONFIG}
    full = canon(adapterDefaults={"maxTokens": True}, system="sys", tools=[TOOL_A])
    assert full == {"config": CONFIG, "adapterDefaults": {"maxTokens": True}, "system": "sys",
                    "tools": [TOOL_A]}
    source = snapshot_json(header(system="s"))
    assert canonical_header(source)["config"] is source["config"]


BASE_CONFIG = {**CONFIG, "maxTokens": 10}


@pytest.mark.parametrize("other", [
    {"config": {**BASE_CONFIG, "model": "v5"}},
    {"config": {**BASE_CONFIG, "reasoningEffort": "high"}},
    {"adapterDefaults": {"maxTokens": True}},
    {"system": "different"},
    {"system": None},
    {"tools": []},
    {"tools": [TOOL_A]},
    {"tools": [TOOL_B, TOOL_A]},
    {"tools": [{**TOOL_A, "description": "changed"}, TOOL_B]},
])
def test_header_equals_compares_every_canonical_field_and_tool_order(
        other: dict[str, Any]) -> None:
    base = {"config": BASE_CONFIG, "system": "sys", "tools": [TOOL_A, TOOL_B]}
    changed = {k: v for k, v in {**base, **other}.items() if v is not None}
    a = canonical_header(snapshot_json(base))
    b = canonical_header(snapshot_json(changed))
    assert header_equals(a, canonical_header(snapshot_json(base)))
    assert not header_equals(a, b)
    assert not header_equals(b, a)


def test_header_equals_tool_key_order_is_significant() -> None:
    reordered = {"description": "A", "name": "a", "parameters": TOOL_A["parameters"]}
    assert not header_equals(canon(tools=[TOOL_A]), canon(tools=[reordered]))


def test_header_equals_treats_absent_and_empty_tool_arrays_as_equivalent() -> None:
    assert header_equals(canon(), canon(tools=[]))
    assert header_equals({"config": CONFIG}, {"config": CONFIG, "tools": []})


def test_call_config_equals_stop_lists_and_strict_scalars() -> None:
    assert call_config_equals({**CONFIG, "stop": ["x"]}, {**CONFIG, "stop": ["x"]})
    assert not call_config_equals({**CONFIG, "stop": []}, dict(CONFIG))
    assert not call_config_equals({**CONFIG, "stop": ["x"]}, {**CONFIG, "stop": ["y"]})
    assert call_config_equals({**CONFIG, "temperature": 1}, {**CONFIG, "temperature": 1.0})
    assert not call_config_equals({**CONFIG, "temperature": 1}, {**CONFIG, "temperature": True})
    assert not call_config_equals({**CONFIG, "maxTokens": 5}, dict(CONFIG))


def test_fold_request_header_returns_the_supplied_baseline_when_no_snapshot_follows() -> None:
    baseline = canon(system="base")
    other = Event(snapshot_json({"type": "turn/start", "seq": 0, "time": 1,
                                 "data": {"turn": 1}}))
    assert fold_request_header([other], baseline) is baseline
    assert fold_request_header([]) is None


def test_fold_request_header_takes_the_latest_full_snapshot_and_skips_others() -> None:
    events = [header_event(0, header(system="one")),
              Event(snapshot_json({"type": "x/y", "seq": 1, "time": 1, "data": {}})),
              header_event(2, header(system="two", tools=[]), "change")]
    assert fold_request_header(events) == {"config": CONFIG, "system": "two"}


def test_session_rejects_request_header_delta_in_seeds_and_appends() -> None:
    with pytest.raises(EventRejectedError, match="unsupported legacy request/header-delta") as info:
        Session.create("s", seed=[{"type": "request/header-delta", "seq": 0, "time": 1,
                                   "data": {}}])
    assert info.value.code == "LEGACY"
    with pytest.raises(EventRejectedError, match="unsupported legacy request/header-delta"):
        fresh().append("request/header-delta", {"patch": {}})


def test_session_rejects_the_removed_fallback_reason_in_seeds_and_appends() -> None:
    seed = [{"type": "request/header", "seq": 0, "time": 1,
             "data": {"header": header(), "reason": "fallback"}}]
    with pytest.raises(EventRejectedError, match='unsupported legacy request/header reason '
                                                 '"fallback"') as info:
        Session.create("s", seed=seed)
    assert info.value.code == "LEGACY"
    with pytest.raises(EventRejectedError, match='reason "fallback"'):
        fresh().append("request/header", {"header": header(), "reason": "fallback"})


def test_session_request_header_reads_none_before_any_record() -> None:
    s = fresh()
    assert s.request_header() is None and s.request_context() is None
    s.append("turn/start", {"turn": 1})
    assert s.request_header() is None and s.request_context() is None


def test_session_folds_a_seeded_log_on_first_read_taking_the_last_record() -> None:
    seed = [header_event(0, header(system="a")), header_event(1, header(system="b"), "change")]
    s = Session.create("s", seed=seed)
    assert s.request_header() == {"config": CONFIG, "system": "b"}


def test_session_request_folds_advance_incrementally_and_skip_unrelated_events() -> None:
    s = fresh()
    s.append("request/header", {"header": header(system="a"), "reason": "initial"})
    s.append("request/context", {"provider": "deepseek", "model": "v4", "contextWindow": 1000})
    assert s.request_header() == {"config": CONFIG, "system": "a"}
    assert s.request_context() == {"provider": "deepseek", "model": "v4",
                                   "contextWindow": 1000}
    s.append("session/title", {})
    s.append("request/context", {"provider": "deepseek", "model": "v5"})
    assert s.request_context() == {"provider": "deepseek", "model": "v5"}
    assert s.request_header() == {"config": CONFIG, "system": "a"}


def test_session_request_folds_a_batch_appended_between_two_reads() -> None:
    s = fresh()
    assert s.request_header() is None
    for system in ("a", "b", "c"):
        s.append("request/header", {"header": header(system=system), "reason": "change"})
    assert s.request_header() == {"config": CONFIG, "system": "c"}


def test_session_request_header_is_frozen() -> None:
    s = fresh()
    s.append("request/header", {"header": header(tools=[TOOL_A]), "reason": "initial"})
    folded = s.request_header()
    assert isinstance(folded, FrozenDict)
    with pytest.raises(TypeError):
        folded["system"] = "x"  # type: ignore[index]
    with pytest.raises(TypeError):
        folded["tools"].append(TOOL_B)  # type: ignore[index]
    context = s.append("request/context", {"provider": "p", "model": "m"})
    assert s.request_context() == context.data
    with pytest.raises(TypeError):
        s.request_context()["model"] = "x"  # type: ignore[index]


@pytest.mark.parametrize("mode", ["restore", "create"])
def test_a_restored_log_answers_its_request_folds_without_a_scan(mode: str) -> None:
    # Admission notes the last request/header and request/context, so the folds are primed.
    live = Session("s", clock=StepClock())
    for model in ("m1", "m2"):
        live.append("request/header", {"header": {"config": {"provider": "p", "model": model}},
                                       "reason": "initial"})
        live.append("request/context", {"provider": "p", "model": model})
        live.append("turn/start", {"turn": 1 if model == "m1" else 2})
    seed = list(live.events)
    header = {"version": 0, "id": "s", "createdAt": 1}
    session = (Session.restore("s", seed, header) if mode == "restore"
               else Session.create("s", seed=seed, header=header))
    assert session.request_header() == live.request_header()
    assert session.request_header()["config"]["model"] == "m2"
    assert session.request_context() == {"provider": "p", "model": "m2"}
    session.append("request/context", {"provider": "p", "model": "m3"})  # still incremental
    assert session.request_context() == {"provider": "p", "model": "m3"}

"""The surface: markers, provenance, replaces, rewrites, node-0 rule, fold.

Rule: docs/rules.md#the-surface.
"""

from __future__ import annotations

from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh._errors import EventRejectedError
from dsh.json import snapshot_json
from dsh.session._events import (
    Event,
    is_append_surface_event,
    is_replacement_surface_event,
    is_surface_eligible_type,
    is_surface_event,
)
from dsh.session._session import Session
from dsh.session._surface import (
    LazyNodes,
    NodeSeqs,
    Surface,
    SurfaceReplacement,
    derive_event_message,
    fold_surface,
)
from tests.strategies import (
    StepClock,
    apply_script,
    assistant_data,
    examples,
    log_scripts,
    system_message,
    tool_result_data,
    user_message,
)

pytestmark = pytest.mark.no_speedups


def ev(seq: int, kind: str = "user/message", data: Any = None, op: Any = "append",
       sources: Any = None) -> Event:
    """A frozen event; ``op=None`` leaves surfaceOp out."""
    if data is None:
        data = user_message(f"m{seq}") if kind in ("user/message", "system/message") else {}
    fields: dict[str, Any] = {"type": kind, "seq": seq, "time": 1, "data": data}
    if sources is not None:
        fields["sourceEventSeqs"] = sources
    if op is not None:
        fields["surfaceOp"] = op
    return Event(snapshot_json(fields))


def replace(start: int, end: int) -> dict[str, Any]:
    return {"op": "replace", "start": start, "end": end}


def fresh() -> Session:
    return Session.create("s", clock=StepClock())


# --- foldSurface source-event references ----------------------------------------------------


def test_fold_surface_accepts_absent_or_valid_references_and_complete_coverage() -> None:
    events = [ev(0), ev(1, sources=[0]), ev(2, op=replace(0, 1), sources=[0, 1])]
    assert fold_surface(events).nodes == [2]


def test_fold_surface_rejects_source_references_on_a_non_surface_event() -> None:
    with pytest.raises(EventRejectedError, match="cannot carry sourceEventSeqs"):
        fold_surface([ev(0, "turn/start", {"turn": 1}, op=None, sources=[])])


def test_fold_surface_accepts_an_explicit_empty_source_list_on_an_assistant_message() -> None:
    data = assistant_data(1, 1, [{"type": "text", "text": "x"}])
    assert fold_surface([ev(0, "assistant/message", data, sources=[])]).nodes == [0]


@pytest.mark.parametrize(("events", "fragment"), [
    ([ev(0, sources="0")], "must be an array when present"),
    ([ev(0, sources=[])], "must not be empty except on assistant/message"),
    ([ev(0), ev(1), ev(2, sources=[0, 0])], "must not contain duplicates"),
    ([ev(0), ev(1, sources=[None])], "densely contain non-negative safe integers"),
    ([ev(0), ev(1, sources=["0"])], "densely contain non-negative safe integers"),
    ([ev(0), ev(1, sources=[0.5])], "densely contain non-negative safe integers"),
    ([ev(0), ev(1, sources=[-1])], "densely contain non-negative safe integers"),
    ([ev(0), ev(1, sources=[1])], "must reference earlier events: 1 >= current seq 1"),
    ([ev(0), ev(1), ev(2, sources=[0, True])], "densely contain non-negative safe integers"),
    ([ev(0), ev(1), ev(2, sources=[0, 0])], "must not contain duplicates"),
    ([ev(0), ev(1), ev(2, sources=[0, 5])], "must reference earlier events: 5 >= current seq 2"),
    ([ev(0), ev(2)], "seq 2 is not contiguous; expected 1"),
    ([ev(0), ev(1), ev(2, op=replace(0, 1), sources=[0])], "missing 1"),
])
def test_fold_surface_rejects_invalid_source_references(events: list[Event],
                                                        fragment: str) -> None:
    with pytest.raises(EventRejectedError, match=fragment):
        fold_surface(events)


# --- foldSurface tool-result rewrites -------------------------------------------------------


def _result(seq: int, call_id: str = "c1", text: str = "ok", **extra: Any) -> Event:
    data = tool_result_data(1, 1, call_id, text, message_id=f"r-{call_id}")
    data.update(extra)
    return ev(seq, "tool/result", data)


def _rewrite(seq: int, target: Event, mutate: Any) -> Event:
    data = snapshot_json(mutate(_thaw(target.data)))
    return ev(seq, "tool/result", data, op=replace(target.seq, target.seq), sources=[target.seq])


def _thaw(value: Any) -> Any:
    from dsh.json import thaw

    return thaw(value)


def _new_content(data: dict[str, Any]) -> dict[str, Any]:
    data["message"]["content"][0]["content"] = [{"type": "text", "text": "pruned"}]
    return data


def test_fold_surface_accepts_a_content_only_tool_result_rewrite() -> None:
    target = _result(0)
    fold = fold_surface([target, _rewrite(1, target, _new_content)])
    assert fold.nodes == [1]
    assert fold.replacements == [SurfaceReplacement(1, 0, 0, (0,))]


def test_fold_surface_rejects_a_tool_result_replacement_spanning_multiple_nodes() -> None:
    a, b = _result(0, "c1"), _result(1, "c2")
    bad = ev(2, "tool/result", a.data, op=replace(0, 1), sources=[0, 1])
    with pytest.raises(EventRejectedError, match="must rewrite exactly one current node"):
        fold_surface([a, b, bad])


def test_fold_surface_rejects_a_tool_result_replacement_targeting_a_non_result_node() -> None:
    bad = ev(1, "tool/result", _result(9).data, op=replace(0, 0), sources=[0])
    with pytest.raises(EventRejectedError, match="must target a current tool/result"):
        fold_surface([ev(0), bad])


@pytest.mark.parametrize("mutate", [
    lambda d: {**d, "message": {**d["message"], "source": {"kind": "tool", "callId": "c9"}}},
    lambda d: _block(d, toolCallId="c9"),
    lambda d: _block(d, isError=True),
    lambda d: {**d, "turn": 2},
    lambda d: {**d, "message": {**d["message"], "id": "other"}},
    lambda d: {**d, "error": {"name": "E", "code": "X"}},
])
def test_fold_surface_rejects_changes_outside_tool_result_content(mutate: Any) -> None:
    target = _result(0)
    with pytest.raises(EventRejectedError, match="may change only content"):
        fold_surface([target, _rewrite(1, target, mutate)])


def _block(data: dict[str, Any], **changes: Any) -> dict[str, Any]:
    block = {**data["message"]["content"][0], **changes}
    return {**data, "message": {**data["message"], "content": [block]}}


@pytest.mark.parametrize(("new_meta", "ok"), [
    ({"lines": [1, 2]}, True),
    ({"lines": [1, 3]}, False),
    ({"lines": "1,2"}, False),
    ({"rows": [1, 2]}, False),
    ({"lines": [1, 2], "more": True}, False),
])
def test_fold_surface_compares_array_valued_rest_fields_structurally(
        new_meta: dict[str, Any], ok: bool) -> None:
    target = _result(0, meta={"lines": [1, 2]})
    rewrite = _rewrite(1, target, lambda d: _new_content({**d, "meta": new_meta}))
    if ok:
        assert fold_surface([target, rewrite]).nodes == [1]
    else:
        with pytest.raises(EventRejectedError, match="may change only content"):
            fold_surface([target, rewrite])


# --- incremental Surface (SurfaceManager) ---------------------------------------------------


def _feed(surface: Surface, window: list[Event], base: int) -> None:
    for index, event in enumerate(window):
        surface.apply(surface.plan(event, base + index, window, base))


def test_surface_folds_a_contiguous_window_without_earlier_events() -> None:
    base = 400_000
    window = [ev(base), ev(base + 1), ev(base + 2, op=replace(base, base), sources=[base])]
    surface = Surface()
    _feed(surface, window, base)
    assert surface.nodes == [base + 2, base + 1]
    assert surface.replace_generation == 1


def test_surface_validates_tool_result_rewrites_against_a_nonzero_window_offset() -> None:
    base = 1000
    target = _result(base)
    window = [target, _rewrite(base + 1, target, _new_content)]
    surface = Surface()
    _feed(surface, window, base)
    assert surface.nodes == [base + 1]


def test_surface_rejects_a_replacement_that_crosses_a_loaded_window_head() -> None:
    base = 50
    window = [ev(base), ev(base + 1, op=replace(base - 1, base), sources=[base - 1, base])]
    with pytest.raises(EventRejectedError, match=f"start seq {base - 1} not found in surface"):
        _feed(Surface(), window, base)


def test_surface_shares_ordered_entries_and_nested_replacement_ranges_with_fold() -> None:
    events = [ev(0), ev(1), ev(2, op=replace(1, 1), sources=[1]),
              ev(3, op=replace(2, 0), sources=[0, 2])]
    # nodes after seq 2: [0, 2]; "start 2, end 0" is position-ordered: 2 is at index 1, 0 at 0
    with pytest.raises(EventRejectedError, match=r"start seq 2 \(index 1\) is after end seq 0"):
        fold_surface(events)
    events[3] = ev(3, op=replace(0, 2), sources=[0, 2])
    fold = fold_surface(events)
    assert fold.nodes == [3]
    assert fold.replacements == [SurfaceReplacement(2, 1, 1, (1,)),
                                 SurfaceReplacement(3, 0, 2, (0, 2))]
    fold.nodes.append(99)
    assert fold_surface(events).nodes == [3]


def test_surface_position_ordered_range_start_after_end_by_seq_is_valid() -> None:
    # start:2,end:1 is valid when node 2 sits before node 1 on the surface
    events = [ev(0), ev(1), ev(2, op=replace(0, 0), sources=[0]),
              ev(3, op=replace(2, 1), sources=[1, 2])]
    assert fold_surface(events).nodes == [3]


def test_surface_incremental_state_keeps_no_replacement_history() -> None:
    surface = Surface()
    _feed(surface, [ev(0), ev(1, op=replace(0, 0), sources=[0])], 0)
    assert not hasattr(surface, "replacements")
    assert surface.nodes == [1] and surface.replace_generation == 1


def test_fold_surface_reports_the_same_invalid_replacement_failure_as_incremental() -> None:
    events = [ev(0), ev(1, op=replace(42, 42), sources=[0])]
    with pytest.raises(EventRejectedError) as folded:
        fold_surface(events)
    s = fresh()
    s.append("user/message", user_message(), surface_op="append")
    with pytest.raises(EventRejectedError) as online:
        s.append("user/message", user_message(), surface_op=replace(42, 42),
                 source_event_seqs=[0])
    assert str(folded.value) == str(online.value)
    assert "start seq 42 not found" in str(online.value)


def test_surface_leaves_incremental_state_unchanged_when_validation_fails() -> None:
    s = fresh()
    s.append("user/message", user_message(), surface_op="append")
    nodes = s.surface.nodes
    with pytest.raises(EventRejectedError):
        s.append("user/message", user_message(), surface_op=replace(0, 0))
    assert s.surface.nodes == [0] and s.surface.replace_generation == 0
    s.append("user/message", user_message(), surface_op="append")
    assert s.surface.nodes is nodes and nodes == [0, 1]


def test_fold_surface_rejects_a_surface_eligible_event_without_its_marker() -> None:
    with pytest.raises(EventRejectedError, match="requires a surfaceOp marker"):
        fold_surface([ev(0, op=None)])


def test_fold_surface_rejects_surface_op_on_a_non_surface_event() -> None:
    with pytest.raises(EventRejectedError, match="not surface-eligible and cannot carry surfaceOp"):
        fold_surface([ev(0, "turn/start", {"turn": 1})])


def test_fold_surface_folds_an_ordered_sequence_from_append_markers() -> None:
    events = [ev(0, "turn/start", {"turn": 1}, op=None), ev(1), ev(2)]
    assert fold_surface(events).nodes == [1, 2]


def test_surface_empty_surface_yields_empty_nodes() -> None:
    s = fresh()
    s.append("turn/start", {"turn": 1})
    s.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    assert s.surface.nodes == [] and s.derive_messages() == []


def test_surface_picks_up_new_events_incrementally() -> None:
    s = fresh()
    s.append("turn/start", {"turn": 1})
    s.append("user/message", user_message(), surface_op="append")
    s.append("user/message", user_message(), surface_op="append")
    s.append("command/run", {})
    s.append("user/message", user_message(), surface_op="append")
    assert s.surface.nodes == [1, 2, 4]


def test_surface_replays_identically_from_a_seeded_log_with_markers() -> None:
    s = fresh()
    s.append("turn/start", {"turn": 1})
    for _ in range(2):
        s.append("user/message", user_message(), surface_op="append")
    s.append("command/run", {})
    s.append("user/message", user_message(), surface_op="append")
    replay = Session.create("s", seed=s.events)
    assert replay.surface.nodes == [1, 2, 4]
    assert replay.derive_messages() == s.derive_messages()


def test_surface_rebuild_with_replace_splices_out_shadowed_nodes() -> None:
    events = [ev(0, "turn/start", {"turn": 1}, op=None), ev(1), ev(2), ev(3),
              ev(4, op=replace(1, 3), sources=[1, 2, 3])]
    assert fold_surface(events).nodes == [4]


def test_surface_replace_with_both_ends_at_real_nodes_splices_only_the_range() -> None:
    events = [ev(0), ev(1), ev(2), ev(3, op=replace(0, 1), sources=[0, 1])]
    assert fold_surface(events).nodes == [3, 2]


def test_surface_single_node_replacement() -> None:
    events = [ev(0), ev(1), ev(2, op=replace(1, 1), sources=[1])]
    assert fold_surface(events).nodes == [0, 2]


@pytest.mark.parametrize(("op", "fragment"), [
    (replace(7, 0), "start seq 7 not found in surface"),
    (replace(0, 7), "end seq 7 not found in surface"),
    (replace(1, 0), r"start seq 1 \(index 1\) is after end seq 0 \(index 0\)"),
])
def test_surface_throws_on_a_bad_replace_range(op: dict[str, Any], fragment: str) -> None:
    with pytest.raises(EventRejectedError, match=fragment) as info:
        fold_surface([ev(0), ev(1), ev(2, op=op, sources=[0, 1])])
    assert info.value.code == "SURFACE" and info.value.where["seq"] == 2


def test_surface_source_event_seqs_are_snapshot_so_caller_mutation_is_isolated() -> None:
    s = fresh()
    s.append("user/message", user_message(), surface_op="append")
    sources = [0]
    event = s.append("user/message", user_message(), surface_op="append",
                     source_event_seqs=sources)
    sources.append(5)
    assert event.source_event_seqs == [0]


def test_surface_replace_starting_at_a_non_head_position_preserves_order() -> None:
    events = [ev(0), ev(1), ev(2), ev(3, op=replace(1, 1), sources=[1])]
    assert fold_surface(events).nodes == [0, 3, 2]


def test_surface_replace_op_object_is_snapshot_so_caller_mutation_is_isolated() -> None:
    s = fresh()
    s.append("user/message", user_message(), surface_op="append")
    op = replace(0, 0)
    event = s.append("user/message", user_message(), surface_op=op, source_event_seqs=[0])
    op["start"] = 99
    assert event.surface_op == replace(0, 0)
    assert s.surface.nodes == [1]


# --- deriveMessages with surface ------------------------------------------------------------


def test_derive_messages_uses_the_surface_and_skips_non_surface_events() -> None:
    s = fresh()
    s.append("turn/start", {"turn": 1})
    s.append("user/message", user_message("q"), surface_op="append")
    s.append("assistant/chunk", {"turn": 1, "step": 1, "chunk": {"type": "text-delta",
                                                                 "index": 0, "text": "a"}})
    s.append("assistant/message", assistant_data(1, 1, [{"type": "text", "text": "a"}]),
             surface_op="append", source_event_seqs=[2])
    s.append("step/end", {"turn": 1, "step": 1})
    assert [m["role"] for m in s.derive_messages()] == ["user", "assistant"]


def test_derive_messages_respects_replace_and_excludes_shadowed_nodes() -> None:
    s = fresh()
    for text in ("a", "b", "c"):
        s.append("user/message", user_message(text), surface_op="append")
    s.append("user/message", user_message("summary"), surface_op=replace(0, 1),
             source_event_seqs=[0, 1])
    assert [m["content"][0]["text"] for m in s.derive_messages()] == ["summary", "c"]


def test_derive_messages_injected_context_and_user_messages_appear_on_surface() -> None:
    s = fresh()
    s.append("user/message", user_message("ctx", source={"kind": "plugin", "plugin": "p"}),
             surface_op="append")
    s.append("user/message", user_message("me"), surface_op="append")
    assert s.surface.nodes == [0, 1]
    assert len(s.derive_messages()) == 2


# --- Session.append surface opts ------------------------------------------------------------


def test_session_append_records_source_event_seqs_and_surface_op_on_the_event() -> None:
    s = fresh()
    s.append("command/done", {})
    event = s.append("assistant/message", assistant_data(1, 1, [{"type": "text", "text": "a"}]),
                     surface_op="append", source_event_seqs=[0])
    assert event.source_event_seqs == [0] and event.surface_op == "append"


def test_session_derive_messages_skips_a_node_that_derives_to_null() -> None:
    s = fresh()
    s.append("assistant/message", assistant_data(1, 1, [], usage={"inputTokens": 1,
                                                                  "outputTokens": 0}),
             surface_op="append")
    assert s.surface.nodes == [0] and s.derive_messages() == []


def test_session_a_non_surface_event_carries_no_surface_fields() -> None:
    event = fresh().append("turn/start", {"turn": 1})
    assert "surfaceOp" not in event and "sourceEventSeqs" not in event


def test_session_surface_op_primitives_are_stored_as_is() -> None:
    op = "append"
    event = fresh().append("user/message", user_message(), surface_op=op)
    assert event["surfaceOp"] is op


# --- type guards ----------------------------------------------------------------------------


def test_is_surface_eligible_type_is_true_only_for_message_producing_types() -> None:
    for kind in ("user/message", "assistant/message", "tool/result", "system/message"):
        assert is_surface_eligible_type(kind)
    for kind in ("turn/start", "assistant/chunk", "tool/call", "todo/write", "acme/x"):
        assert not is_surface_eligible_type(kind)


def test_is_surface_event_narrows_and_rejects() -> None:
    assert is_surface_event(ev(0))
    assert not is_surface_event(ev(0, "turn/start", {"turn": 1}, op=None))
    assert not is_surface_event(ev(0, op=None))


def test_surface_guards_split_append_origin_and_replacement_events() -> None:
    appended, replaced = ev(0), ev(1, op=replace(0, 0), sources=[0])
    assert is_append_surface_event(appended) and not is_replacement_surface_event(appended)
    assert is_replacement_surface_event(replaced) and not is_append_surface_event(replaced)
    for event in (ev(0, "turn/start", {"turn": 1}, op=None), ev(0, op=None)):
        assert not is_append_surface_event(event)
        assert not is_replacement_surface_event(event)


def test_surface_replace_generation_counts_replaces() -> None:
    s = fresh()
    s.append("user/message", user_message(), surface_op="append")
    assert s.surface.replace_generation == 0
    s.append("user/message", user_message(), surface_op=replace(0, 0), source_event_seqs=[0])
    assert s.surface.replace_generation == 1


# --- derive_event_message (docs/rules.md#deriving-messages) ---------------------------------------


def test_derive_event_message_projects_each_type_by_identity() -> None:
    user = ev(0)
    system = ev(1, "system/message", system_message())
    assistant = ev(2, "assistant/message", assistant_data(1, 1, [{"type": "text",
                                                                  "text": "x"}]))
    result = _result(3)
    assert derive_event_message(user) is user.data
    assert derive_event_message(system) is system.data
    assert derive_event_message(assistant) is assistant.data["message"]
    assert derive_event_message(result) is result.data["message"]
    assert derive_event_message(ev(4, "assistant/message", assistant_data(1, 1, []))) is None
    assert derive_event_message(ev(5, "turn/start", {"turn": 1}, op=None)) is None


# --- node-0 system/message rule (docs/rules.md#the-system-head) -----------------------------------


def _system_head_session() -> Session:
    s = fresh()
    s.append("system/message", system_message(), surface_op="append")
    s.append("user/message", user_message("a"), surface_op="append")
    s.append("user/message", user_message("b"), surface_op="append")
    return s


def test_surface_rejects_a_non_system_replace_covering_a_system_head() -> None:
    s = _system_head_session()
    with pytest.raises(EventRejectedError, match=r"covering node 0 \(seq 0, a system/message\) "
                                                 "must be a system/message") as info:
        s.append("user/message", user_message("summary"), surface_op=replace(0, 1),
                 source_event_seqs=[0, 1])
    assert info.value.code == "SURFACE"
    assert s.surface.nodes == [0, 1, 2]


def test_surface_rejects_a_system_replace_covering_more_than_the_head() -> None:
    s = _system_head_session()
    with pytest.raises(EventRejectedError, match=r"found system/message covering 2 node"):
        s.append("system/message", system_message(), surface_op=replace(0, 1),
                 source_event_seqs=[0, 1])


def test_surface_accepts_a_system_replace_of_exactly_the_head() -> None:
    s = _system_head_session()
    s.append("system/message", system_message(), surface_op=replace(0, 0),
             source_event_seqs=[0])
    assert s.surface.nodes == [3, 1, 2]
    assert s.derive_messages()[0]["role"] == "system"


def test_surface_allows_compaction_after_a_system_head() -> None:
    s = _system_head_session()
    s.append("user/message", user_message("summary"), surface_op=replace(1, 2),
             source_event_seqs=[1, 2])
    assert s.surface.nodes == [0, 3]


def test_surface_node_zero_rule_runs_after_provenance() -> None:
    # order: structure, range, provenance, tool-result rule, then node 0
    s = _system_head_session()
    with pytest.raises(EventRejectedError, match="missing 0"):
        s.append("user/message", user_message(), surface_op=replace(0, 0))


def test_surface_replace_of_a_user_head_needs_no_system_type() -> None:
    events = [ev(0), ev(1, op=replace(0, 0), sources=[0])]
    assert fold_surface(events).nodes == [1]


def test_surface_system_head_rule_applies_in_seeds() -> None:
    s = _system_head_session()
    seed = [_thaw(e) for e in s.events]
    seed.append({"type": "user/message", "seq": 3, "time": 9, "data": user_message(),
                 "surfaceOp": replace(0, 0), "sourceEventSeqs": [0]})
    with pytest.raises(EventRejectedError, match="invalid seed event at index 3: surface replace "
                                                 "covering node 0"):
        Session.create("s", seed=seed)


# --- property: online surface == offline fold (docs/testing.md#what-the-tests-cover) --------------


@settings(max_examples=examples(40), deadline=None)
@given(log_scripts(open_tail=None))
def test_surface_online_state_equals_fold_surface(script: Any) -> None:
    s = apply_script(fresh(), script)
    fold = fold_surface(s.events)
    assert fold.nodes == list(s.surface.nodes)
    assert len(fold.replacements) == s.surface.replace_generation
    restored = Session.restore("s", s.events, s.header)
    assert list(restored.surface.nodes)[:len(fold.nodes)] == fold.nodes


def test_surface_inflated_nodes_swaps_lazy_nodes_for_one_array_seen_by_its_view() -> None:
    # one place owns the invariant: the surface and its live view hold the same node list
    seqs = list(range(0, 3000, 3))
    lazy = LazyNodes(NodeSeqs.unpack_tailed(NodeSeqs(seqs).pack_tailed(4), 3000))
    surface = Surface(lazy, 2)
    view = surface.nodes
    whole = surface.inflated_nodes()
    assert type(whole) is array and whole == array("q", seqs)
    assert surface.inflated_nodes() is whole  # swapped once
    whole.append(3001)  # the session's hot path appends to the list it keeps
    assert surface.nodes is view and len(view) == 1001 and view[-1] == 3001
    assert view == [*seqs, 3001]
    plain = [1, 4]
    assert Surface(plain).inflated_nodes() is plain


@pytest.mark.parametrize("step", [3, 300])  # one-byte differences ("b"), int64 ones ("d")
def test_tailed_node_seqs_inflate_their_head_once_for_every_full_view(
        step: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import dsh.session._surface as surface_module

    inflations = [0]
    for name in ("_inflate", "_inflate_narrow"):
        real = getattr(surface_module, name)

        def counting(*args: Any, _real: Any = real) -> Any:
            inflations[0] += 1
            return _real(*args)

        monkeypatch.setattr(surface_module, name, counting)
    seqs = list(range(0, 1000 * step, step))
    tailed = NodeSeqs.unpack_tailed(NodeSeqs(seqs).pack_tailed(4), 1000 * step)
    # a hand-off (a resumed session's own array) inflates for itself: nothing kept
    assert tailed.to_array() == array("q", seqs) and inflations == [1] and tailed.head_packed
    assert list(tailed) == seqs and inflations == [2]
    assert list(tailed) == seqs and tailed.to_array() == array("q", seqs)
    assert list(reversed(tailed)) == seqs[::-1] and tailed[5] == seqs[5]
    assert inflations == [2]  # before: one inflation per full view
    mine = tailed.to_array()  # the caller's own array: changing it changes no later view
    mine.append(-1)
    assert list(tailed) == seqs
    assert list(tailed.extended(array("q", [1000 * step]))) == [*seqs, 1000 * step]
    lazy = LazyNodes(tailed)  # a restored surface, appended to after the views
    lazy.append(1000 * step + 1)
    assert list(lazy) == [*seqs, 1000 * step + 1] and list(tailed) == seqs
    assert inflations == [2]


def _packed_head_by_hand(seqs: list[int]) -> tuple[bool, bytes]:
    """docs/formats.md#restore-points: zlib'd differences (the first from 0), a byte each when
    every one lies in 0 .. 255, else little-endian int64s."""
    import sys
    import zlib
    differences = [b - a for a, b in zip([0, *seqs], seqs, strict=False)]
    if all(0 <= d <= 255 for d in differences):
        return True, zlib.compress(bytes(differences), 1)
    wide = array("q", differences)
    if sys.byteorder == "big":
        wide.byteswap()
    return False, zlib.compress(wide.tobytes(), 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**40), max_size=80).map(sorted)
       | st.lists(st.integers(0, 600), max_size=80), st.integers(-1, 90))
def test_node_seqs_pack_their_head_as_the_format_says(seqs: list[int], tail: int) -> None:
    # the packs build their one-byte differences without an int64 copy (below): the bytes
    # stay the documented ones in either form, and read back to the same seqs
    narrow, packed = _packed_head_by_hand(seqs)
    nodes = NodeSeqs(seqs)
    assert nodes.pack_best() == (narrow, packed)
    assert nodes.pack_narrow() == (packed if narrow else None)
    split = max(len(seqs) - max(tail, 0), 0)
    pack = nodes.pack_tailed(tail)
    head_narrow, head_packed = _packed_head_by_hand(seqs[:split])
    assert tuple(pack) == (split, max(seqs[:split], default=-1), head_narrow,
                           tuple(seqs[split:]), head_packed)
    bound = max(seqs, default=0) + len(seqs) + 1
    assert list(NodeSeqs.unpack_tailed(pack, bound)) == seqs


def test_a_tailed_pack_of_many_nodes_makes_no_int64_copy_of_them() -> None:
    # a session's close writes a restore point of its whole surface: packing 200k nodes held
    # ~5.7 MB of temporaries (the head's copy, its int64 differences, their bytes, a bytearray
    # of those), on top of the session at its peak; now the one-byte differences alone
    import tracemalloc
    count = 200_000
    nodes = NodeSeqs(array("q", range(0, 3 * count, 3)))
    tracemalloc.start()
    try:
        pack = nodes.pack_tailed(64)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert pack.head_count == count - 64 and pack.narrow
    assert peak < 4 * count, peak  # (zlib's own state is ~270 kB of it)

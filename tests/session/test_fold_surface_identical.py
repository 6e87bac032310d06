"""fold_surface (its position map, _IndexedSurface, and its shortcut for plain appends) folds
every log exactly as the session's own incremental Surface does: the same nodes and
replacements on a log it accepts, the same refusal (type, code, message, seq) on one it does
not (docs/rules.md#surface-ops, docs/rules.md#the-surface).

The logs are drawn with damage on purpose: replaces whose start or end is not on the surface
(never there, taken off by an earlier run, a seq not yet written), runs over nodes an earlier
run replaced, start after end, repeated and skipped seqs, missing and malformed markers and
provenance. ``DSH_HYPOTHESIS_EXAMPLES`` raises the example count (tests/strategies.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh._errors import DshError
from dsh.interop._history import _removed, history
from dsh.session._surface import Surface, SurfaceFold, SurfaceReplacement, fold_surface
from tests.strategies import examples

_TYPES = ("user/message", "assistant/message", "tool/result", "system/message", "turn/start")


def _data(kind: str, text: str, removal: bool) -> dict[str, Any]:
    if kind == "tool/result":  # one call answered: a rewrite differs in its content only
        return {"message": {"id": "r", "role": "user", "source": {"kind": "tool", "callId": "c"},
                            "content": [{"type": "tool-result", "toolCallId": "c",
                                         "content": [{"type": "text", "text": text}],
                                         "isError": False}]}}
    if kind == "assistant/message":
        content = [] if removal else [{"type": "text", "text": text}]
        return {"message": {"id": f"a{text}", "role": "assistant", "content": content}}
    if kind == "turn/start":
        return {"turn": 1}
    return {"id": f"u{text}", "role": "user", "content": [{"type": "text", "text": text}],
            "source": {"kind": "user"}}


@st.composite
def logs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A log of up to 16 events, well formed but for a damage here and there (1 in 10)."""
    events: list[dict[str, Any]] = []
    nodes: list[int] = []  # the surface as the log so far leaves it, when well formed
    gone: list[int] = []  # nodes a run took off
    for index in range(draw(st.integers(0, 16))):
        damage = draw(st.sampled_from([None] * 9 + ["damaged"]))
        kind = draw(st.sampled_from(_TYPES))
        event: dict[str, Any] = {"type": kind, "seq": index, "time": 1,
                                 "data": _data(kind, str(draw(st.integers(0, 3))),
                                               draw(st.booleans()))}
        if kind != "turn/start":
            low = 1 if nodes and events[nodes[0]]["type"] == "system/message" else 0
            if len(nodes) > low and kind != "system/message" and draw(st.booleans()):
                first = draw(st.integers(low, len(nodes) - 1))
                last = draw(st.integers(first, len(nodes) - 1))
                if kind == "tool/result" and events[nodes[first]]["type"] != "tool/result":
                    kind = event["type"] = "user/message"  # a result rewrites a result only
                    event["data"] = _data(kind, "r", False)
                if kind == "tool/result":
                    last = first
                start, end = nodes[first], nodes[last]
                event["surfaceOp"] = {"op": "replace", "start": start, "end": end}
                event["sourceEventSeqs"] = list(range(index))  # covers any run
                gone.extend(nodes[first:last + 1])
                nodes[first:last + 1] = [index]
            else:
                event["surfaceOp"] = "append"
                nodes.append(index)
        if damage:
            kinds = ["seq", "op", "sources", "future", "swapped"] + ["gone"] * bool(gone)
            how = draw(st.sampled_from(kinds))
            op = event.get("surfaceOp")
            if how == "seq":
                event["seq"] = draw(st.sampled_from([index - 1, index + 1, 0]))
            elif how == "op":
                event["surfaceOp"] = draw(st.sampled_from(["Append", 1, None, [],
                                                           {"op": "replace", "start": 0}]))
            elif how == "sources":
                event["sourceEventSeqs"] = draw(st.sampled_from([[], [0, 0], [index], [-1]]))
            elif isinstance(op, dict):
                if how == "swapped":
                    event["surfaceOp"] = {**op, "start": op["end"], "end": op["start"]}
                else:  # a start or end not on the surface: taken off, or not yet written
                    off = index + 1 if how == "future" else draw(st.sampled_from(gone))
                    event["surfaceOp"] = {**op, draw(st.sampled_from(["start", "end"])): off}
        events.append(event)
    return events


def _session_fold(events: Sequence[Mapping[str, Any]]) -> SurfaceFold:
    """The fold as a session makes it: Surface.plan and apply, one event at a time."""
    surface = Surface()
    replacements: list[SurfaceReplacement] = []
    for index, event in enumerate(events):
        plan = surface.plan(event, index, events)
        if plan is not None and plan.start_index >= 0:
            op = event["surfaceOp"]
            shadowed = tuple(surface.nodes[plan.start_index:plan.end_index + 1])
            replacements.append(SurfaceReplacement(plan.seq, op["start"], op["end"], shadowed))
        surface.apply(plan)
    return SurfaceFold(list(surface.nodes), replacements)


def _outcome(fold: Any, events: Sequence[Mapping[str, Any]]) -> Any:
    try:
        return fold(events)
    except DshError as error:
        return type(error).__name__, error.code, error.message, error.where


_SETTINGS = settings(max_examples=examples(150), deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(logs())
def test_fold_surface_folds_every_log_as_the_session_does(events: list[dict[str, Any]]) -> None:
    assert _outcome(fold_surface, events) == _outcome(_session_fold, events)


def _removed_by_walking(events: Sequence[Mapping[str, Any]], removals: set[int],
                        rewrites_to: Mapping[int, int]) -> frozenset[int]:
    """The removed set of interop/_history.py before it walked fold_surface (its own fold)."""
    nodes: list[int] = []
    stands_for: dict[int, list[int]] = {}
    out: set[int] = set()
    for event in events:
        seq, op = event["seq"], event.get("surfaceOp")
        if op is None:
            continue
        if not isinstance(op, Mapping):
            nodes.append(seq)
            stands_for[seq] = [seq]
            continue
        first, last = nodes.index(op["start"]), nodes.index(op["end"])
        run = [e for node in nodes[first:last + 1] for e in stands_for.pop(node, ())]
        nodes[first:last + 1] = [seq]
        if seq in removals:
            out.update(run)
            stands_for[seq] = []
        elif seq in rewrites_to:
            stands_for[seq] = run
        else:
            stands_for[seq] = [seq, *run]
    return frozenset(out)


@_SETTINGS
@given(logs(), st.data())
def test_a_removal_takes_the_same_entries_off_as_its_own_fold_did(
        events: list[dict[str, Any]], data: st.DataObject) -> None:
    # on every log a session accepts: the fold it walks now is the session's
    if not isinstance(_outcome(_session_fold, events), SurfaceFold):
        return
    replaces = [int(e["seq"]) for e in events if isinstance(e.get("surfaceOp"), Mapping)]
    removals = set(data.draw(st.lists(st.sampled_from(replaces), unique=True))) if replaces \
        else set()
    rewrites = {seq: data.draw(st.integers(0, seq)) for seq in replaces if seq not in removals
                and data.draw(st.booleans())}
    assert _removed(events, removals, rewrites) == _removed_by_walking(events, removals,
                                                                      rewrites)
    list(history(events))  # and the exporters' walk of it runs through

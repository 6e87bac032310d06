"""Hypothesis strategies and log builders shared by the test suite.

* :func:`hostile_json` — lossless JSON that stresses the codec (lone surrogates, ``__proto__``
  keys, safe-integer edges, deep-ish nesting, control characters, U+2028).
* :func:`non_json` — values :func:`dsh.json.snapshot_json` must refuse, alone or nested.
* :func:`log_scripts` — abstract scripts of well-formed agent activity: turns with steps,
  streamed chunks, assistant tool calls with ``tool/call`` + ``tool/result``, injected user
  messages, plugin log-only events, compaction-style ``user/message`` replaces, content-only
  ``tool/result`` rewrites, a ``system/message`` head, and optionally an open final turn.
  :func:`apply_script` plays a script onto a :class:`~dsh.session._session.Session` through
  ``append`` (so every event is validated exactly as live events are).
* Plain builders (:func:`user_message`, :func:`assistant_data`, :func:`tool_result_data`) and
  :class:`StepClock`, used directly by example tests.

Example counts: ``settings(max_examples=examples(25))`` reads ``DSH_HYPOTHESIS_EXAMPLES``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from dsh._errors import EventRejectedError
from dsh.json import MAX_SAFE_INTEGER
from dsh.session._session import Session

# --- settings -------------------------------------------------------------------------------


def examples(default: int) -> int:
    """Hypothesis example count: ``$DSH_HYPOTHESIS_EXAMPLES`` when set, else ``default``."""
    value = os.environ.get("DSH_HYPOTHESIS_EXAMPLES")
    return int(value) if value else default


# --- plain builders -------------------------------------------------------------------------


class StepClock:
    """A deterministic clock: starts at ``start`` ms and advances ``step`` ms per call."""

    def __init__(self, start: int = 1_700_000_000_000, step: int = 1) -> None:
        self.now = start
        self.step = step

    def __call__(self) -> int:
        value = self.now
        self.now += self.step
        return value


_ids = iter(range(1, 10**9))


def next_id(prefix: str = "m") -> str:
    """A unique, readable message id for tests."""
    return f"{prefix}-{next(_ids)}"


def user_message(text: str = "hello", *, source: dict[str, Any] | None = None,
                 message_id: str | None = None, role: str = "user") -> dict[str, Any]:
    """A plain user message dict (the data of ``user/message``)."""
    return {"content": [{"type": "text", "text": text}], "source": source or {"kind": "user"},
            "role": role, "id": message_id or next_id("u")}


def system_message(text: str = "You are a careful agent.") -> dict[str, Any]:
    """A plain system message dict (the data of ``system/message``)."""
    return user_message(text, source={"kind": "plugin", "plugin": "system"}, role="system",
                        message_id=next_id("s"))


def assistant_data(turn: int, step: int, blocks: Sequence[dict[str, Any]], *,
                   usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """The data of an ``assistant/message`` event."""
    data: dict[str, Any] = {"turn": turn, "step": step, "message": {
        "role": "assistant", "content": list(blocks),
        "source": {"kind": "model", "provider": "deepseek", "model": "deepseek-v4-flash"},
        "id": next_id("a")}}
    if usage is not None:
        data["usage"] = usage
    return data


def tool_call_block(call_id: str, name: str = "read_file",
                    arguments: str = '{"path":"a.txt"}') -> dict[str, Any]:
    """A ``tool-call`` content block."""
    return {"type": "tool-call", "id": call_id, "name": name, "arguments": arguments}


def tool_result_data(turn: int, step: int, call_id: str, text: str = "ok", *,
                     is_error: bool = False, message_id: str | None = None) -> dict[str, Any]:
    """The data of a ``tool/result`` event answering ``call_id``."""
    return {"turn": turn, "step": step, "message": {
        "source": {"kind": "tool", "callId": call_id},
        "content": [{"type": "tool-result", "toolCallId": call_id,
                     "content": [{"type": "text", "text": text}], "isError": is_error}],
        "role": "user", "id": message_id or next_id("r")}}


def request_header_data(model: str = "deepseek-v4-flash",
                        reason: str = "initial") -> dict[str, Any]:
    """The data of a ``request/header`` event."""
    return {"header": {"config": {"provider": "deepseek", "model": model}}, "reason": reason}


def completed_turn(session: Session, turn: int, *, text: str = "hi",
                   call_ids: Sequence[str] = ()) -> None:
    """Append one well-formed completed turn (optionally with answered tool calls)."""
    session.append("turn/start", {"turn": turn})
    session.append("step/start", {"turn": turn, "step": 1})
    session.append("user/message", user_message(text), surface_op="append")
    blocks = [{"type": "text", "text": "working"}, *(tool_call_block(c) for c in call_ids)]
    session.append("assistant/message", assistant_data(turn, 1, blocks), surface_op="append")
    for call_id in call_ids:
        call = session.append("tool/call", {"turn": turn, "step": 1, "callId": call_id,
                                            "name": "read_file", "arguments": "{}"})
        session.append("tool/result", tool_result_data(turn, 1, call_id),
                       surface_op="append", source_event_seqs=[call.seq])
    session.append("step/end", {"turn": turn, "step": 1})
    session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})


# --- what a resumed session accepts next ---------------------------------------------------

_LATE_CALL = assistant_data(99, 1, [tool_call_block("late")])
_LATE_RESULT = tool_result_data(99, 1, "late")
_SUMMARY = {"id": "sum", "role": "user", "source": {"kind": "plugin", "plugin": "compact",
                                                    "compactionId": "c"},
            "content": [{"type": "text", "text": "summary"}]}
_RESULTS = {cid: tool_result_data(1, 1, cid) for cid in ("call-1-1-0", "never-made")}


def probe_appends(session: Session) -> list[object]:
    """Appends a resumed session may see next; each outcome (event or refusal code).

    A second result for an early call (accepted only if that call was made), an orphan
    result (refused), a compaction replace, and a new turn with a call and its result.
    """
    out: list[object] = []

    def attempt(kind: str, data: Any, **kw: Any) -> None:
        try:
            out.append(dict(session.append(kind, data, **kw)))
        except EventRejectedError as exc:
            out.append(exc.code)

    attempt("tool/result", _RESULTS["call-1-1-0"], surface_op="append")
    attempt("tool/result", _RESULTS["never-made"], surface_op="append")
    nodes = list(session.surface.nodes)
    if len(nodes) > 1:
        attempt("user/message", _SUMMARY,
                surface_op={"op": "replace", "start": nodes[1], "end": nodes[-1]},
                source_event_seqs=nodes[1:])
    attempt("turn/start", {"turn": 99})
    attempt("assistant/message", _LATE_CALL, surface_op="append")
    attempt("tool/result", _LATE_RESULT, surface_op="append")
    return out


# --- hostile JSON ---------------------------------------------------------------------------

_HOSTILE_STRINGS = ["", "__proto__", "constructor", "a\ud800b", "\udfff", "x\u2028y\u2029",
                    "\x00\x1f\"\\", "line\nbreak", "\U0001f600", "\u00e9\u0301"]

_safe_ints = st.one_of(
    st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER),
    st.sampled_from([0, 1, -1, MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER]))
_floats = st.floats(allow_nan=False, allow_infinity=False).filter(
    lambda f: f != 0.0 and not f.is_integer())
_strings = st.one_of(st.text(max_size=12), st.sampled_from(_HOSTILE_STRINGS))
_scalars = st.one_of(st.none(), st.booleans(), _safe_ints, _floats, _strings)


def hostile_json(max_leaves: int = 25) -> st.SearchStrategy[Any]:
    """Lossless JSON values (plain dict/list) that stress the codec and snapshots."""
    keys = st.one_of(st.text(max_size=6), st.sampled_from(_HOSTILE_STRINGS))
    return st.recursive(
        _scalars,
        lambda children: st.one_of(st.lists(children, max_size=4),
                                   st.dictionaries(keys, children, max_size=4)),
        max_leaves=max_leaves)


class _Opaque:
    """An object that is not JSON."""


_BAD_LEAVES: list[Any] = [float("nan"), float("inf"), float("-inf"), -0.0, 2**53, -(2**53),
                          (1, 2), {1, 2}, b"bytes", _Opaque(), {1: "int key"}, frozenset()]


def non_json() -> st.SearchStrategy[Any]:
    """Values that are not lossless JSON: a bad leaf, possibly nested in lists/dicts."""
    leaf = st.sampled_from(_BAD_LEAVES)
    return st.recursive(
        leaf,
        lambda inner: st.one_of(st.builds(lambda x: [1, x], inner),
                                st.builds(lambda x: {"k": x, "ok": True}, inner)),
        max_leaves=4)


# --- well-formed logs -----------------------------------------------------------------------


@dataclass(frozen=True)
class StepSpec:
    """One model call: chunk count, tool calls (answered or not), whether it streams text."""

    chunks: int
    calls: int
    answered: int


@dataclass(frozen=True)
class TurnSpec:
    """One turn: its steps, and ``stop_after`` (an event count to stop at for an open tail)."""

    steps: tuple[StepSpec, ...]
    stop_after: int | None = None


@dataclass(frozen=True)
class Action:
    """One script step: ``kind`` in turn, inject, plugin, compact, rewrite, todo."""

    kind: str
    turn: TurnSpec | None = None
    a: int = 0
    b: int = 0
    text: str = "x"


@dataclass
class Script:
    """A generated log script: an optional system head, then actions."""

    system_head: bool
    actions: list[Action] = field(default_factory=list)


_step_specs = st.builds(
    lambda chunks, calls, answered: StepSpec(chunks, calls, min(calls, answered)),
    st.integers(0, 4), st.integers(0, 3), st.integers(0, 3))
_turn_specs = st.builds(TurnSpec, st.lists(_step_specs, min_size=0, max_size=3).map(tuple))
_small_text = st.sampled_from(["a", "summary", "\ud800", "\u2028", "pruned"])

_actions = st.one_of(
    st.builds(Action, kind=st.just("turn"), turn=_turn_specs),
    st.builds(Action, kind=st.just("inject"), text=_small_text),
    st.builds(Action, kind=st.just("plugin"), text=_small_text),
    st.builds(Action, kind=st.just("todo"), text=_small_text),
    st.builds(Action, kind=st.just("compact"), a=st.integers(0, 50), b=st.integers(0, 50),
              text=_small_text),
    st.builds(Action, kind=st.just("rewrite"), a=st.integers(0, 50), text=_small_text),
)


def log_scripts(*, open_tail: bool | None = False, max_actions: int = 8,
                ) -> st.SearchStrategy[Script]:
    """Scripts of well-formed activity; ``open_tail`` None means "sometimes open"."""
    tail = st.booleans() if open_tail is None else st.just(open_tail)

    def build(system_head: bool, actions: list[Action], tail_open: bool,
              last: TurnSpec, stop: int) -> Script:
        script = Script(system_head, list(actions))
        if tail_open:
            script.actions.append(Action("turn", TurnSpec(last.steps or (StepSpec(1, 1, 0),),
                                                          stop_after=stop)))
        return script

    return st.builds(build, st.booleans(), st.lists(_actions, max_size=max_actions), tail,
                     _turn_specs, st.integers(1, 20))


class _Player:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.turn = 0
        self.budget: int | None = None
        self.header_logged = False

    def emit(self, kind: str, data: Any, **kw: Any) -> bool:
        """Append unless the open-tail budget is spent; return False once it is."""
        if self.budget is not None:
            if self.budget <= 0:
                return False
            self.budget -= 1
        self.session.append(kind, data, **kw)
        return True

    def play_turn(self, spec: TurnSpec) -> None:
        self.turn += 1
        turn = self.turn
        self.budget = spec.stop_after
        try:
            self._turn_body(turn, spec)
        finally:
            self.budget = None

    def _turn_body(self, turn: int, spec: TurnSpec) -> None:
        s = self.session
        if not self.emit("turn/start", {"turn": turn}):
            return
        for step_no, step in enumerate(spec.steps, start=1):
            if not self.emit("step/start", {"turn": turn, "step": step_no}):
                return
            if step_no == 1 and not self.emit("user/message", user_message(f"turn {turn}"),
                                              surface_op="append"):
                return
            if not self.header_logged:
                if not self.emit("request/header", request_header_data()):
                    return
                self.header_logged = True
            chunk_seqs = []
            for index in range(step.chunks):
                if not self.emit("assistant/chunk", {"turn": turn, "step": step_no, "chunk": {
                        "type": "text-delta", "index": 0, "text": f"t{index}"}}):
                    return
                chunk_seqs.append(s.seq - 1)
            call_ids = [f"call-{turn}-{step_no}-{i}" for i in range(step.calls)]
            blocks = ([{"type": "text", "text": "ok"}] if step.chunks else []) + [
                tool_call_block(c) for c in call_ids]
            if not self.emit("assistant/message", assistant_data(turn, step_no, blocks, usage={
                    "inputTokens": 10, "outputTokens": step.chunks}), surface_op="append",
                    source_event_seqs=chunk_seqs):
                return
            for call_id in call_ids[:step.answered]:
                if not self.emit("tool/call", {"turn": turn, "step": step_no, "callId": call_id,
                                               "name": "read_file", "arguments": "{}"}):
                    return
                call_seq = s.seq - 1
                if not self.emit("tool/result", tool_result_data(turn, step_no, call_id),
                                 surface_op="append", source_event_seqs=[call_seq]):
                    return
            for call_id in call_ids[step.answered:]:
                # an unanswered call still needs an error result inside a closed step
                if not self.emit("tool/result", tool_result_data(
                        turn, step_no, call_id, "skipped", is_error=True), surface_op="append"):
                    return
            if not self.emit("step/end", {"turn": turn, "step": step_no}):
                return
        if spec.stop_after is not None:
            return  # an open tail never closes its turn
        self.emit("turn/end", {"turn": turn, "reason": {"kind": "completed"}})

    def compact(self, action: Action) -> None:
        s = self.session
        nodes = list(s.surface.nodes)
        if not nodes:
            return
        i, j = sorted((action.a % len(nodes), action.b % len(nodes)))
        if s.event_at(nodes[0]).type == "system/message" and i == 0:
            if len(nodes) == 1:
                return
            i = 1
            j = max(j, 1)
        s.append("user/message", user_message(action.text, source={
            "kind": "plugin", "plugin": "compact", "compactionId": "c"}),
            surface_op={"op": "replace", "start": nodes[i], "end": nodes[j]},
            source_event_seqs=nodes[i:j + 1])

    def rewrite(self, action: Action) -> None:
        s = self.session
        results = [n for n in s.surface.nodes if s.event_at(n).type == "tool/result"]
        if not results:
            return
        target = s.event_at(results[action.a % len(results)])
        data = target.data
        message = data["message"]
        block = message["content"][0]
        new_block = {**block, "content": [{"type": "text", "text": action.text}]}
        new_data = {**data, "message": {**message, "content": [new_block]}}
        s.append("tool/result", new_data,
                 surface_op={"op": "replace", "start": target.seq, "end": target.seq},
                 source_event_seqs=[target.seq])


def apply_script(session: Session, script: Script,
                 after: Callable[[], object] | None = None) -> Session:
    """Append the events of ``script`` to ``session`` through ``Session.append``.

    ``after()`` (e.g. a flush) runs after each action, so a store sees many batches.
    """
    player = _Player(session)
    if script.system_head and not session.surface.nodes:
        session.append("system/message", system_message(), surface_op="append")
    for action in script.actions:
        if action.kind == "turn":
            assert action.turn is not None
            player.play_turn(action.turn)
        elif action.kind == "inject":
            session.append("user/message", user_message(action.text, source={
                "kind": "plugin", "plugin": "notes", "form": "notice", "summary": "n"}),
                surface_op="append")
        elif action.kind == "plugin":
            session.append("plan/mode", {"active": bool(len(action.text) % 2)})
        elif action.kind == "todo":
            session.append("todo/write", {"todos": [
                {"content": action.text, "status": "pending"}]})
        elif action.kind == "compact":
            player.compact(action)
        elif action.kind == "rewrite":
            player.rewrite(action)
        if after is not None:
            after()
    return session


# --- OpenAI Agents SDK items ------------------------------------------------------------------


_CALL_IDS = st.sampled_from(["call_a", "call_b", "call_c"])
_TEXT = st.text(max_size=12)


def responses_items() -> st.SearchStrategy[dict[str, Any]]:
    """One Responses input item as the SDK hands it to ``add_items``, or an odd one.

    Prompts (text or parts), system and developer messages, assistant output, reasoning,
    ``function_call`` and ``function_call_output`` over three call ids (so calls repeat, go
    unanswered and get answered twice), other input items, opaque envelopes, and a
    ``function_call`` without a name (``add_items`` refuses it).
    """
    parts = st.lists(st.fixed_dictionaries({"type": st.just("input_text"), "text": _TEXT}),
                     max_size=2)
    return st.one_of(
        st.fixed_dictionaries({"role": st.just("user"), "content": st.one_of(_TEXT, parts)}),
        st.fixed_dictionaries({"role": st.sampled_from(["system", "developer"]),
                               "content": _TEXT}),
        st.fixed_dictionaries({"type": st.just("message"), "role": st.just("assistant"),
                               "content": st.lists(st.fixed_dictionaries(
                                   {"type": st.just("output_text"), "text": _TEXT}),
                                   max_size=2)}),
        st.fixed_dictionaries({"type": st.just("reasoning"), "summary": st.lists(
            st.fixed_dictionaries({"type": st.just("summary_text"), "text": _TEXT}),
            max_size=1)}),
        st.fixed_dictionaries({"type": st.just("function_call"), "call_id": _CALL_IDS,
                               "name": st.sampled_from(["read_file", "ls", ""]),
                               "arguments": st.just('{"path": "a"}')}),
        st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": _CALL_IDS,
                               "output": _TEXT}),
        st.fixed_dictionaries({"type": st.sampled_from(["item_reference", "computer_call_output"]),
                               "id": _TEXT}),
        st.fixed_dictionaries({"payload": _TEXT}),
    )


def responses_batches(max_batches: int = 6) -> st.SearchStrategy[list[list[dict[str, Any]]]]:
    """The ``add_items`` batches of one SDK session: lists of :func:`responses_items`."""
    return st.lists(st.lists(responses_items(), max_size=5), min_size=1, max_size=max_batches)

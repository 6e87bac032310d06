"""A model view any provider accepts, from any sequence of appends the core accepts
(docs/rules.md#a-model-view-any-provider-accepts).

Hypothesis drives raw ``Session.append`` with messages, tool calls, results for any call
(made or not, answered or not), content rewrites and log-only events, keeping whatever the
session accepts. Whenever the surface ends with no tool call open (when a loop would call the
model), the request each provider's own builder makes from the view must pass the provider
validator, and the builder must not have had to invent a result for an unanswered call or turn
a result into text: every tool result of the view reaches the provider as a tool result.
``DSH_HYPOTHESIS_EXAMPLES`` raises the example count.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh._errors import EventRejectedError
from dsh.agent._provider import LlmRequest
from dsh.agent.providers import AnthropicProvider, OpenAIChatProvider
from dsh.interop._export import MISSING_RESULT_TEXT, validate_conversation
from dsh.json import snapshot_json
from dsh.session._session import Session
from tests.strategies import (
    StepClock,
    assistant_data,
    examples,
    system_message,
    tool_call_block,
    tool_result_data,
    user_message,
)

_OPENAI = OpenAIChatProvider(model="gpt-test", api_key="sk-test", base_url="http://127.0.0.1:9")
_ANTHROPIC = AnthropicProvider(model="claude-test", api_key="sk-test",
                               base_url="http://127.0.0.1:9")
_WORDS = st.text(alphabet="abc xyz", min_size=1, max_size=6).filter(str.strip)

_actions = st.one_of(
    st.tuples(st.just("user"), _WORDS),
    st.tuples(st.just("system"), _WORDS),
    st.tuples(st.just("assistant"), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("result"), st.integers(0, 20)),
    st.tuples(st.just("rewrite"), st.integers(0, 20)),
    st.tuples(st.just("log"), st.just("")),
)


class _Driver:
    """Plays actions through ``Session.append``; a refused append leaves nothing behind."""

    def __init__(self) -> None:
        self.session = Session.create("s", clock=StepClock())
        self.calls: list[str] = []
        self.refused: list[str] = []

    def append(self, kind: str, data: Any, **kw: Any) -> None:
        try:
            self.session.append(kind, data, **kw)
        except EventRejectedError as exc:
            self.refused.append(exc.code)

    def play(self, action: tuple[Any, ...]) -> None:
        kind = action[0]
        if kind == "user":
            self.append("user/message", user_message(action[1]), surface_op="append")
        elif kind == "system":
            self.append("system/message", system_message(action[1]), surface_op="append")
        elif kind == "assistant":
            ids = [f"c{len(self.calls) + i}" for i in range(action[1])]
            blocks = ([{"type": "text", "text": "ok"}] if action[2] else []) + [
                tool_call_block(c) for c in ids]
            before = len(self.session.events)
            self.append("assistant/message", assistant_data(1, 1, blocks), surface_op="append")
            if len(self.session.events) > before:
                self.calls.extend(ids)
        elif kind == "result":
            pool = [*self.calls, "never-made"]
            self.append("tool/result", tool_result_data(1, 1, pool[action[1] % len(pool)]),
                        surface_op="append")
        elif kind == "rewrite":
            self._rewrite(action[1])
        else:
            self.append("plan/mode", {"active": True})

    def _rewrite(self, pick: int) -> None:
        s = self.session
        results = [n for n in s.surface.nodes if s.event_at(n).type == "tool/result"]
        if not results:
            return
        target = s.event_at(results[pick % len(results)])
        message = target.data["message"]
        block = {**message["content"][0], "content": [{"type": "text", "text": "short"}]}
        self.append("tool/result", {**target.data, "message": {**message, "content": [block]}},
                    surface_op={"op": "replace", "start": target.seq, "end": target.seq},
                    source_event_seqs=[target.seq])

    def open_calls(self) -> list[str]:
        """Calls the surface leaves unanswered at its end (what a loop answers before a call)."""
        s = self.session
        answered: set[str] = set()
        for seq in reversed(s.surface.nodes):
            event = s.event_at(seq)
            if event.type == "tool/result":
                answered.add(event.data["message"]["source"]["callId"])
                continue
            if event.type == "assistant/message":
                return [b["id"] for b in event.data["message"]["content"]
                        if b["type"] == "tool-call" and b["id"] not in answered]
            break
        return []


def _check_requests(session: Session) -> None:
    view = tuple(session.derive_messages())
    if not any(m["role"] != "system" for m in view):
        return  # nothing a provider would be asked about
    request = LlmRequest(session_id="s", messages=view, header=snapshot_json(
        {"config": {"provider": "openai", "model": "gpt-test"}, "system": "Be brief."}))
    results = sum(1 for m in view for b in m["content"] if b["type"] == "tool-result")
    openai = _OPENAI.request_messages(request)
    assert validate_conversation(openai, "openai") == [], openai
    assert [m["content"] for m in openai if m["role"] == "tool"].count(MISSING_RESULT_TEXT) == 0
    assert sum(1 for m in openai if m["role"] == "tool") == results, openai
    anthropic = _ANTHROPIC.request_messages(request)
    assert validate_conversation(anthropic, "anthropic") == [], anthropic
    blocks = [b for m in anthropic["messages"] if isinstance(m["content"], list)
              for b in m["content"]]
    assert sum(1 for b in blocks if b.get("type") == "tool_result") == results, anthropic
    assert not any(b.get("type") == "text" and "[tool result for call" in b.get("text", "")
                   for b in blocks), anthropic


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(actions=st.lists(_actions, max_size=24))
def test_any_accepted_appends_give_a_view_every_provider_accepts(
        actions: list[tuple[Any, ...]]) -> None:
    driver = _Driver()
    for action in actions:
        driver.play(action)
        if not driver.open_calls():
            _check_requests(driver.session)
    for call_id in driver.open_calls():  # answer what is open, as the loop does
        driver.append("tool/result", tool_result_data(1, 1, call_id), surface_op="append")
    assert driver.open_calls() == []
    _check_requests(driver.session)


def test_the_campaign_reproducer_is_refused_and_the_view_stays_valid() -> None:
    """The campaign's case: a user/message between a tool call and its result."""
    driver = _Driver()
    for action in [("user", "go"), ("assistant", 1, True), ("user", "wait"), ("result", 0)]:
        driver.play(action)
    assert driver.refused == ["OPEN_TOOL_CALL"]
    _check_requests(driver.session)

"""Exporters of derived messages to OpenAI Chat Completions and Anthropic Messages, and the
conversation checker (docs/interop.md#exporters; messages per docs/events.md#the-message-model,
docs/rules.md#deriving-messages)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh.interop import to_anthropic, to_openai, validate_conversation
from dsh.interop._export import MISSING_RESULT_TEXT
from dsh.session._session import Session

pytestmark = pytest.mark.no_speedups

EXAMPLES = int(os.environ.get("DSH_HYPOTHESIS_EXAMPLES", "60"))


def user(text: str, mid: str = "u") -> dict[str, Any]:
    return {"id": mid, "role": "user", "content": [{"type": "text", "text": text}],
            "source": {"kind": "user"}}


def assistant(*blocks: dict[str, Any], mid: str = "a") -> dict[str, Any]:
    return {"id": mid, "role": "assistant", "content": list(blocks),
            "source": {"kind": "model", "provider": "p", "model": "m"}}


def call(cid: str, name: str = "read", args: str = '{"path":"a"}') -> dict[str, Any]:
    return {"type": "tool-call", "id": cid, "name": name, "arguments": args}


def result(cid: str, text: str = "ok", *, error: bool = False) -> dict[str, Any]:
    return {"id": f"r-{cid}", "role": "user", "source": {"kind": "tool", "callId": cid},
            "content": [{"type": "tool-result", "toolCallId": cid, "isError": error,
                         "content": [{"type": "text", "text": text}]}]}


def test_to_openai_maps_tool_calls_and_results() -> None:
    msgs = [{"id": "s", "role": "system", "content": [{"type": "text", "text": "sys"}],
             "source": {"kind": "plugin", "plugin": "x"}},
            user("hi"), assistant({"type": "reasoning", "text": "think"},
                                  {"type": "text", "text": "reading"}, call("c1")),
            result("c1", "file body"), assistant({"type": "text", "text": "done"})]
    assert to_openai(msgs) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "reading", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "read", "arguments": '{"path":"a"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "file body"},
        {"role": "assistant", "content": "done"},
    ]
    assert to_openai(msgs, include_reasoning=True)[2]["reasoning_content"] == "think"


def test_to_anthropic_maps_blocks_and_merges_user_turns() -> None:
    msgs = [user("first", "u1"), user("second", "u2"),
            assistant({"type": "reasoning", "text": "t", "signature": "sig"},
                      {"type": "reasoning", "text": "unsigned"}, call("c1")),
            result("c1", "bad", error=True), user("more", "u3")]
    body = to_anthropic(msgs)
    assert body == {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "first"},
                                     {"type": "text", "text": "second"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "t", "signature": "sig"},
            {"type": "tool_use", "id": "c1", "name": "read", "input": {"path": "a"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "is_error": True,
             "content": [{"type": "text", "text": "bad"}]},
            {"type": "text", "text": "more"}]},
    ]}
    assert validate_conversation(body, "anthropic") == []


def test_export_converts_orphan_result_to_user_text() -> None:
    """An orphan result never reaches the provider as a result, so no export starts with one."""
    msgs = [result("gone", "late output"), user("next")]
    openai = to_openai(msgs)
    assert openai == [{"role": "user", "content": "[tool result for call gone]\nlate output"},
                      {"role": "user", "content": "next"}]
    anthropic = to_anthropic(msgs)["messages"]
    assert anthropic == [{"role": "user", "content": [
        {"type": "text", "text": "[tool result for call gone]\nlate output"},
        {"type": "text", "text": "next"}]}]
    assert validate_conversation(openai, "openai") == []
    assert validate_conversation(anthropic, "anthropic") == []


def test_export_answers_unanswered_calls_with_synthetic_result() -> None:
    msgs = [user("go"), assistant(call("c1"), call("c2")), result("c1")]
    openai = to_openai(msgs)
    assert openai[-1] == {"role": "tool", "tool_call_id": "c2", "content": MISSING_RESULT_TEXT}
    anthropic = to_anthropic(msgs)
    assert anthropic["messages"][-1]["content"][-1] == {
        "type": "tool_result", "tool_use_id": "c2", "is_error": True,
        "content": [{"type": "text", "text": MISSING_RESULT_TEXT}]}
    assert validate_conversation(openai, "openai") == []
    assert validate_conversation(anthropic, "anthropic") == []


def test_export_replaces_lone_surrogates_in_output_only() -> None:
    session = Session.create("s", clock=lambda: 0)
    session.append("turn/start", {"turn": 1})
    session.append("step/start", {"turn": 1, "step": 1})
    session.append("user/message", user("bad \ud800 text"), surface_op="append")
    msgs = session.derive_messages()
    assert msgs[0]["content"][0]["text"] == "bad \ud800 text"
    assert to_openai(msgs)[0]["content"] == "bad \ufffd text"
    assert to_anthropic(msgs)["messages"][0]["content"][0]["text"] == "bad \ufffd text"
    assert validate_conversation([{"role": "user", "content": "x\udc00"}], "openai") == [
        "$[0].content: string holds a lone surrogate (invalid UTF-8 on the wire)"]


def test_to_anthropic_puts_a_user_turn_first_and_lifts_system() -> None:
    msgs = [{"id": "s", "role": "system", "content": [{"type": "text", "text": "rules"}],
             "source": {"kind": "plugin", "plugin": "x"}},
            assistant({"type": "text", "text": "continuing"})]
    body = to_anthropic(msgs)
    assert body["system"] == "rules"
    assert body["messages"][0] == {"role": "user", "content": [
        {"type": "text", "text": "[earlier conversation not included]"}]}


def test_to_anthropic_passes_anthropic_raw_blocks_and_drops_others() -> None:
    raw = {"type": "compaction", "content": "Summary"}
    msgs = [user("hi"), assistant({"type": "provider-raw", "provider": "anthropic", "block": raw},
                                  {"type": "provider-raw", "provider": "openai", "block": {}},
                                  {"type": "text", "text": "hello"})]
    assert to_anthropic(msgs)["messages"][1]["content"] == [raw, {"type": "text",
                                                                  "text": "hello"}]
    assert to_openai(msgs)[1] == {"role": "assistant", "content": "hello"}


def test_validate_conversation_reports_each_problem() -> None:
    openai = [{"role": "tool", "tool_call_id": "x", "content": "?"},
              {"role": "assistant", "content": None, "tool_calls": [
                  {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
              {"role": "tool", "tool_call_id": "c1", "content": "a"},
              {"role": "tool", "tool_call_id": "c1", "content": "b"},
              {"role": "assistant", "content": None, "tool_calls": [
                  {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
              {"role": "user", "content": "skip"},
              {"role": "wizard", "content": ""}]
    assert validate_conversation(openai, "openai") == [
        "message 0: conversation starts with a tool result",
        "message 0: orphan tool result for unknown call x",
        "message 3: tool call c1 answered more than once",
        "message 5: tool calls c2 are not answered before the next message",
        "message 6: unknown role 'wizard'",
    ]
    anthropic = [{"role": "assistant", "content": [{"type": "tool_use", "id": "t1"}]},
                 {"role": "assistant", "content": []},
                 {"role": "user", "content": [{"type": "text", "text": "x"},
                                              {"type": "tool_result", "tool_use_id": "t9"}]}]
    assert validate_conversation(anthropic, "anthropic") == [
        "message 0: the first message must have role user",
        "message 1: role assistant repeats; roles must alternate",
        "message 1: content is empty",
        "message 1: tool_use t1 not answered in the next user message",
        "message 2: tool_result t9 after other content",
        "message 2: tool_result t9 answers no outstanding tool_use (orphan or duplicate)",
    ]


def test_validate_conversation_refuses_unknown_provider() -> None:
    try:
        validate_conversation([], "gemini")
    except ValueError as exc:
        assert "gemini" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("expected ValueError")


_ids = st.sampled_from(["c1", "c2", "c3", "c4"])
_message = st.one_of(
    st.builds(user, st.text(max_size=5)),
    st.builds(lambda ids, text: assistant(*([{"type": "text", "text": text}] if text else []),
                                          *[call(i) for i in dict.fromkeys(ids)]),
              st.lists(_ids, max_size=3), st.text(max_size=3)),
    st.builds(result, _ids, st.text(max_size=3)),
    st.just({"id": "s", "role": "system", "content": [{"type": "text", "text": "sys"}],
             "source": {"kind": "plugin", "plugin": "x"}}),
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(_message, max_size=12))
def test_export_any_message_sequence_validates(msgs: list[dict[str, Any]]) -> None:
    """Whatever the surface holds (orphans, dangling calls, repeated roles), exports are valid."""
    assert validate_conversation(to_openai(msgs), "openai") == []
    assert validate_conversation(to_anthropic(msgs), "anthropic") == []

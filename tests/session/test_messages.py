"""Message constructors (docs/events.md#messages): shapes, key order, fresh ids, frozen results."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from dsh._errors import InvalidJsonError
from dsh._messages import (
    create_assistant_message,
    create_message,
    create_system_message,
    create_tool_result_message,
    create_user_message,
    new_message_id,
)
from dsh.json import FrozenDict, dumps
from dsh.session._session import Session

UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def test_new_message_id_is_a_fresh_uuid4() -> None:
    first, second = new_message_id(), new_message_id()
    assert UUID4.match(first) and UUID4.match(second) and first != second


def test_new_message_ids_are_uuid4_text_with_every_random_digit_drawn() -> None:
    ids = [new_message_id() for _ in range(2000)]
    assert len(set(ids)) == 2000
    for text in ids:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, text)
    # each of the 30 hex digits that are not fixed by the version takes many values, and the
    # variant digit takes all four of 8, 9, a, b: the 122 random bits are all random
    digits = [text.replace("-", "") for text in ids]
    for position in range(32):
        seen = {d[position] for d in digits}
        if position == 12:
            assert seen == {"4"}
        elif position == 16:
            assert seen == set("89ab")
        else:
            assert len(seen) == 16, position


def test_create_message_copies_input_adds_a_fresh_id_last_and_freezes() -> None:
    source: dict[str, Any] = {"role": "user", "content": [{"type": "text", "text": "a"}],
                              "source": {"kind": "user"}, "id": "stale"}
    message = create_message(source)
    assert isinstance(message, FrozenDict)
    assert list(message) == ["role", "content", "source", "id"]
    assert message["id"] != "stale" and UUID4.match(message["id"])
    source["content"].append("x")
    assert message["content"] == [{"type": "text", "text": "a"}]
    with pytest.raises(TypeError):
        message["content"].append({"type": "text", "text": "b"})


def test_create_user_message_matches_dsh_key_order() -> None:
    message = create_user_message({"content": [{"type": "text", "text": "hi"}],
                                   "source": {"kind": "user"}})
    assert list(message) == ["content", "source", "role", "id"]
    assert message["role"] == "user"


def test_create_system_message_has_role_system() -> None:
    message = create_system_message({"content": [{"type": "text", "text": "rules"}],
                                     "source": {"kind": "plugin", "plugin": "sys"}})
    assert message["role"] == "system" and list(message)[-2:] == ["role", "id"]


def test_create_assistant_message_has_a_model_source() -> None:
    message = create_assistant_message(content=[{"type": "text", "text": "x"}],
                                       provider="deepseek", model="v4")
    assert list(message) == ["role", "content", "source", "id"]
    assert message["source"] == {"kind": "model", "provider": "deepseek", "model": "v4"}
    replay = create_assistant_message(content=[], provider="p", model="m",
                                      replay_state={"r": 1})
    assert replay["source"]["replayState"] == {"r": 1}


def test_create_tool_result_message_wraps_one_tool_result_block() -> None:
    message = create_tool_result_message(call_id="c1", content=[{"type": "text", "text": "ok"}],
                                         is_error=True)
    assert dumps({k: v for k, v in message.items() if k != "id"}) == (
        b'{"source":{"kind":"tool","callId":"c1"},"content":[{"type":"tool-result",'
        b'"toolCallId":"c1","content":[{"type":"text","text":"ok"}],"isError":true}],'
        b'"role":"user"}')


def test_constructed_messages_pass_seed_shape_validation() -> None:
    user = create_user_message({"content": [], "source": {"kind": "user"}})
    assistant = create_assistant_message(content=[{"type": "tool-call", "id": "c1",
                                                   "name": "n", "arguments": "{}"}],
                                         provider="p", model="m")
    result = create_tool_result_message(call_id="c1", content=[])
    system = create_system_message({"content": [], "source": {"kind": "plugin",
                                                              "plugin": "s"}})
    source = Session.create("s")
    source.append("system/message", system, surface_op="append")
    source.append("user/message", user, surface_op="append")
    source.append("assistant/message", {"turn": 1, "step": 1, "message": assistant},
                  surface_op="append")
    source.append("tool/result", {"turn": 1, "step": 1, "message": result},
                  surface_op="append")
    replay = Session.create("s", seed=source.events)
    assert replay.derive_messages() == [system, user, assistant, result]


def test_constructors_refuse_non_json_content() -> None:
    with pytest.raises(InvalidJsonError):
        create_user_message({"content": [float("nan")], "source": {"kind": "user"}})

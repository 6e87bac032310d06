"""What ``Session.append`` refuses at once so a log it writes always reads back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh import (
    ConfigError,
    EventRejectedError,
    Session,
    UnknownEventTypeError,
    create_assistant_message,
    create_system_message,
    create_tool_result_message,
    create_user_message,
    register_event_type,
)

PROMPT = {"content": [{"type": "text", "text": "Run it"}], "source": {"kind": "user"}}


def _opened(session: Session) -> None:
    session.append("turn/start", {"turn": 1})
    session.append("step/start", {"turn": 1, "step": 1})


def _result(call_id: str) -> dict[str, Any]:
    return {"turn": 1, "step": 1, "message": create_tool_result_message(
        call_id=call_id, content=[{"type": "text", "text": "ok"}])}


@pytest.fixture
def registered() -> Iterator[list[Any]]:
    seen: list[Any] = []

    def check(data: Any) -> None:
        seen.append(data)
        if not isinstance(data, dict) or not isinstance(data.get("label"), str):
            raise ValueError("data needs a string 'label'")

    remove = register_event_type("myapp/checkpoint", check)
    yield seen
    remove()


def test_append_refuses_a_typo_of_a_known_type_and_names_it() -> None:
    session = Session.create("s")
    _opened(session)
    with pytest.raises(EventRejectedError) as refused:
        session.append("step/strat", {"turn": 1, "step": 2})
    assert refused.value.code == "UNKNOWN_EVENT_TYPE"
    assert refused.value.message.startswith(
        'unknown event type "step/strat" (did you mean "step/start"?) at seq 2')
    assert 'dsh.register_event_type("step/strat")' in refused.value.message
    assert len(session.events) == 2  # nothing committed


def test_append_refuses_an_unknown_type_without_a_guess_unless_ignorable() -> None:
    session = Session.create("s")
    with pytest.raises(EventRejectedError) as refused:
        session.append("myapp/note", {"text": "hi"})
    assert "did you mean" not in refused.value.message
    event = session.append("myapp/note", {"text": "hi"}, ignorable=True)
    assert event.ignorable and event.seq == 0


def test_a_registered_type_is_validated_and_written_ignorable(registered: list[Any],
                                                              tmp_path: Path) -> None:
    url = f"jsonl://{tmp_path / 'logs'}"
    with dsh.open(url) as store:
        session = store.session("s")
        event = session.append("myapp/checkpoint", {"label": "v1"})
        assert event.ignorable and registered == [{"label": "v1"}]
        with pytest.raises(EventRejectedError) as refused:
            session.append("myapp/checkpoint", {"label": 3})
        assert refused.value.code == "CUSTOM_EVENT_INVALID"
        assert "data needs a string 'label'" in refused.value.message
        assert [e.seq for e in session.events] == [0]
        # a typo of a registered type is recognised too
        with pytest.raises(EventRejectedError, match='did you mean "myapp/checkpoint"'):
            session.append("myapp/checkpont", {"label": "v2"})
    # another reader that never registered the type keeps and skips it
    with dsh.open(url) as store:
        [stored] = store.read("s").stored_events
    assert stored["type"] == "myapp/checkpoint" and stored["ignorable"] is True


def test_register_event_type_refuses_dsh_types_and_bad_names() -> None:
    with pytest.raises(ConfigError) as reserved:
        register_event_type("turn/start")
    assert reserved.value.code == "EVENT_TYPE_RESERVED"
    for name in ("checkpoint", "/x", "x/"):
        with pytest.raises(ConfigError) as bad:
            register_event_type(name)
        assert bad.value.code == "INVALID_EVENT_TYPE"


def test_append_refuses_a_tool_result_for_a_call_never_made() -> None:
    session = Session.create("s")
    _opened(session)
    session.append("user/message", create_user_message(PROMPT), surface_op="append")
    with pytest.raises(EventRejectedError) as refused:
        session.append("tool/result", _result("call_9"), surface_op="append")
    assert refused.value.code == "ORPHAN_TOOL_RESULT"
    assert "answers call 'call_9', which no earlier assistant message" in refused.value.message
    assert len(session.events) == 3
    answer = create_assistant_message(
        content=[{"type": "tool-call", "id": "call_9", "name": "run", "input": {}}],
        provider="p", model="m")
    session.append("assistant/message", {"turn": 1, "step": 1, "message": answer},
                   surface_op="append")
    assert session.append("tool/result", _result("call_9"), surface_op="append").seq == 4


def test_append_accepts_a_user_message_outside_a_turn_as_dsh_does() -> None:
    # Documented in Session.append: dsh writes compaction checkpoints this way.
    session = Session.create("s")
    event = session.append("user/message", create_user_message(PROMPT), surface_op="append")
    assert event.seq == 0


@pytest.mark.parametrize("etype", ["assistant/message", "tool/result"])
def test_missing_wrapper_error_shows_the_expected_shape(etype: str) -> None:
    session = Session.create("s")
    _opened(session)
    bare = create_assistant_message(content=[{"type": "text", "text": "hi"}], provider="p",
                                    model="m")
    with pytest.raises(EventRejectedError) as refused:
        session.append(etype, bare, surface_op="append")
    message = refused.value.message
    assert "lacks an identified message (expected data {turn, step, message}" in message
    assert "{'turn': 1, 'step': 1, 'message': ...}" in message
    assert "found keys content, id, role, source" in message


def test_reader_says_an_unknown_stored_type_looks_like_a_typo(tmp_path: Path) -> None:
    # A log written by something else with a misspelt type: the reader names the likely typo.
    root = tmp_path / "logs"
    with dsh.open(f"jsonl://{root}") as store:
        store.session("t").append("turn/start", {"turn": 1})
    [path] = root.rglob("session.jsonl")
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"type": "step/strat", "seq": 1, "time": 2**41,
                            "data": {"turn": 1, "step": 1}}) + "\n")
    with dsh.open(f"jsonl://{root}") as store, \
            pytest.raises(UnknownEventTypeError) as refused:
        store.read("t")
    assert "'step/strat' at seq 1, which looks like a typo of 'step/start'" in str(refused.value)


def _calls(*call_ids: str) -> dict[str, Any]:
    return {"turn": 1, "step": 1, "message": create_assistant_message(
        content=[{"type": "tool-call", "id": c, "name": "run", "input": {}} for c in call_ids],
        provider="p", model="m")}


def test_append_refuses_a_message_inside_an_open_tool_call_pair() -> None:
    """A user/message between an assistant's tool call and its result (the campaign's case)."""
    session = Session.create("s")
    _opened(session)
    session.append("user/message", create_user_message(PROMPT), surface_op="append")
    made = session.append("assistant/message", _calls("c1", "c2"), surface_op="append")
    session.append("tool/result", _result("c1"), surface_op="append")
    before = len(session.events)
    for kind, data in (("user/message", create_user_message(PROMPT)),
                       ("system/message", create_system_message(PROMPT)),
                       ("assistant/message", _calls("c3"))):
        with pytest.raises(EventRejectedError) as refused:
            session.append(kind, data, surface_op="append")
        assert refused.value.code == "OPEN_TOOL_CALL"
        assert refused.value.where["seq"] == before
        assert refused.value.where["open_calls"] == "c2"
        assert refused.value.where["call_seq"] == made["seq"]
        assert f"seq {before} would sit inside an open tool call/result pair" \
            in refused.value.message
    assert len(session.events) == before  # nothing committed
    session.append("tool/result", _result("c2"), surface_op="append")
    session.append("user/message", create_user_message(PROMPT), surface_op="append")


def test_append_refuses_a_second_or_late_result_for_a_call() -> None:
    session = Session.create("s")
    _opened(session)
    session.append("assistant/message", _calls("c1", "c2"), surface_op="append")
    session.append("tool/result", _result("c1"), surface_op="append")
    with pytest.raises(EventRejectedError) as refused:
        session.append("tool/result", _result("c1"), surface_op="append")
    assert refused.value.code == "DUPLICATE_TOOL_RESULT"
    assert refused.value.where["call_id"] == "c1"
    session.append("tool/result", _result("c2"), surface_op="append")
    session.append("user/message", create_user_message(PROMPT), surface_op="append")
    with pytest.raises(EventRejectedError) as late:
        session.append("tool/result", _result("c2"), surface_op="append")
    assert late.value.code == "ORPHAN_TOOL_RESULT"
    assert "not open at the end of the surface" in late.value.message


def test_a_content_rewrite_of_a_result_is_still_accepted_inside_a_pair() -> None:
    """The pruner's replace is not a fresh message: it keeps the pair as it was."""
    session = Session.create("s")
    _opened(session)
    session.append("assistant/message", _calls("c1", "c2"), surface_op="append")
    first = session.append("tool/result", _result("c1"), surface_op="append")
    shorter = {"turn": 1, "step": 1, "message": {**first["data"]["message"], "content": [
        {**first["data"]["message"]["content"][0], "content": [{"type": "text", "text": "."}]}]}}
    session.append("tool/result", shorter, surface_op={
        "op": "replace", "start": first["seq"], "end": first["seq"]},
        source_event_seqs=[first["seq"]])
    session.append("tool/result", _result("c2"), surface_op="append")

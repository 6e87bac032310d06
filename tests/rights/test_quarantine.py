"""Quarantine and unquarantine on every real backend: the model view loses the messages and
stays a valid request, the log loses nothing, the round trip gives the same view back.

Rule: docs/forgetting.md#quarantine.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import dsh
from dsh import RightsError
from dsh.interop import to_anthropic, to_openai
from dsh.rights import PLACEHOLDER_TEXT, quarantine, quarantine_state, unquarantine
from tests.rights.conftest import (
    REPO,
    SECRETS,
    assert_valid_anthropic,
    assert_valid_openai,
    build,
    run_cli,
)

USER, ASSISTANT, TOOL = 2, 5, 7  # the prompt, the reasoning + call, the .env output


def _view(store: dsh.Store, session_id: str = "s1") -> list[Any]:
    read = store.inspect(session_id)
    return dsh.Session.restore(session_id, read.events, read.header).derive_messages()


@pytest.mark.no_speedups
def test_a_round_trip_hides_then_restores_the_model_view_and_keeps_the_log(url: str) -> None:
    build(url)
    with dsh.open(url) as store:
        before_view = _view(store)
        before_log = store.read("s1").stored_events
        result = quarantine(store, "s1", [TOOL, USER, ASSISTANT], reason="keys leaked",
                            by="alice")
        assert [seq for seq, _ in result.changed] == [USER, ASSISTANT, TOOL]
        hidden = _view(store)
        log = store.read("s1").stored_events
    assert log[:len(before_log)] == before_log  # nothing of the log changed
    assert len(hidden) == len(before_view)
    assert [m["role"] for m in hidden] == [m["role"] for m in before_view]
    text = json.dumps(list(hidden))
    assert not any(secret in text for secret in SECRETS.values())
    assert text.count(PLACEHOLDER_TEXT) == 3
    assert_valid_openai({"messages": to_openai(hidden)})
    assert_valid_anthropic(to_anthropic(hidden))
    record = log[result.record_seq]
    assert record["type"] == "quarantine/apply" and record["ignorable"] is True
    assert record["data"]["reason"] == "keys leaked" and record["data"]["by"] == "alice"
    state = quarantine_state(log)
    assert {seq: s.quarantined for seq, s in state.items()} == {USER: True, ASSISTANT: True,
                                                                TOOL: True}
    with dsh.open(url) as store:
        back = unquarantine(store, "s1", [USER, ASSISTANT, TOOL])
        assert back.unchanged == ()
        assert _view(store) == before_view
        log = store.read("s1").stored_events
    assert log[:len(before_log)] == before_log
    assert not any(s.quarantined for s in quarantine_state(log).values())
    run_cli("verify", "--store", url, "s1")


@pytest.mark.no_speedups
def test_quarantine_is_idempotent_and_refuses_what_is_not_a_visible_message(
        tmp_path: Any) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    build(url)
    with dsh.open(url) as store:
        quarantine(store, "s1", [USER])
        again = quarantine(store, "s1", [USER])
        assert again.changed == () and again.unchanged == (USER,) and again.written == 0
        count = len(store.read("s1").stored_events)
        for seq, code in ((6, "NOT_A_MESSAGE"), (999, "NO_SUCH_SEQ")):
            with pytest.raises(RightsError) as caught:
                quarantine(store, "s1", [TOOL, seq])
            assert caught.value.code == code and caught.value.where["seq"] == seq
            if code == "NOT_A_MESSAGE":  # the event's type quoted, after its article
                assert f"event {seq} of session 's1' is a '" in str(caught.value), caught.value
        with pytest.raises(RightsError) as caught:
            unquarantine(store, "s1", [TOOL])
        assert caught.value.code == "NOT_QUARANTINED"
        placeholder = quarantine_state(store.read("s1").stored_events)[USER].node
        with pytest.raises(RightsError) as caught:
            quarantine(store, "s1", [placeholder])  # a replace is not a message as appended
        assert caught.value.code == "NOT_A_MESSAGE"
        assert len(store.read("s1").stored_events) == count  # refusals wrote nothing


def test_a_seq_past_the_stored_log_is_named_as_missing_with_the_real_last_seq(
        tmp_path: Any) -> None:
    # before: an imported session's restore adds an in-memory session/end-seed marker, so
    # `dsh quarantine ID 99999` said "its last seq is 19" for a log ending at 18, and seq 19
    # was refused as "a session/end-seed" the log does not hold
    url = f"sqlite://{tmp_path}/s.db"
    simple = REPO / "src/dsh/examples/transcripts/claude-code/simple.jsonl"
    run_cli("import", "--store", url, str(simple))
    sid = "11111111-2222-4333-8444-555555555555"
    with dsh.open(url) as store:
        last = len(store.read(sid).stored_events) - 1
        for seq in (last + 1, 99999):
            with pytest.raises(RightsError) as caught:
                quarantine(store, sid, [seq])
            assert caught.value.code == "NO_SUCH_SEQ" and caught.value.where["seq"] == seq
            assert f"its last seq is {last})" in str(caught.value)
        assert len(store.read(sid).stored_events) == last + 1

def test_a_compacted_message_is_not_in_view(tmp_path: Any) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    build(url, padding=400)
    done = run_cli("compact", "--store", url, "s1", "--json")
    assert USER in json.loads(done.stdout)["shadowedSeqs"]
    with dsh.open(url) as store, pytest.raises(RightsError) as caught:
        quarantine(store, "s1", [USER])
    assert caught.value.code == "NOT_IN_VIEW"


def test_the_cli_quarantines_shows_why_and_unquarantines(tmp_path: Any) -> None:
    url = f"jsonl://{tmp_path}/logs"
    build(url)
    done = run_cli("quarantine", "--store", url, "s1", str(TOOL), "--reason",
                   "env file\x1b[31m", "--by", "bob", "--json")
    outcome = json.loads(done.stdout)
    placeholder = outcome["changed"][0]["node"]
    assert outcome["changed"] == [{"seq": TOOL, "node": placeholder}]
    shown = run_cli("show", "--store", url, "s1").stdout
    assert f"QUARANTINED #{TOOL}" in shown and "by bob; reason: env file\\x1b[31m" in shown
    assert "\x1b" not in shown  # the reason is session text: escaped, never sent raw
    messages = run_cli("messages", "--store", url, "s1", "--format", "openai").stdout
    assert SECRETS["tool"] not in messages and PLACEHOLDER_TEXT in messages
    refused = run_cli("quarantine", "--store", url, "s1", "6", check=False)
    assert refused.returncode == 1 and "error[NOT_A_MESSAGE]" in refused.stderr
    done = run_cli("unquarantine", "--store", url, "s1", str(TOOL))
    assert f"#{TOOL} unquarantined" in done.stdout
    assert SECRETS["tool"] in run_cli("messages", "--store", url, "s1").stdout
    run_cli("verify", "--store", url, "s1")

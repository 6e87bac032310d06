"""Durable approvals meet forgetting: a call whose arguments were redacted or erased never runs.

Rule: docs/effects.md#approvals-and-forgetting. Real stores (SQLite, JSONL), the real
``dsh.rights`` operations and the real ``dsh approve`` command in a child process.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh.agent import (
    AgentError,
    ScriptedCall,
    ScriptedProvider,
    ScriptedReply,
    ToolContext,
    approve,
    deny,
    pending_approvals,
    tool,
)
from dsh.agent._effects import EffectLedger
from dsh.rights import erase, quarantine, redact, unquarantine
from tests.agent.helpers import CONFIG, assert_verifies

sent: list[str] = []


@tool(name="send", needs_approval=True)
def send(text: str, ctx: ToolContext) -> str:
    """Send a message; a person must say yes first.

    Args:
        text: What to send.
    """
    sent.append(text)
    return f"sent {text}"


@pytest.fixture(autouse=True)
def _fresh() -> None:
    sent.clear()


@pytest.fixture(params=["sqlite", "jsonl"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/s.db" if request.param == "sqlite" else f"jsonl://{tmp_path}"


def _blocked(url: str) -> int:
    """Run a turn that asks to send a secret; return the seq of the assistant message."""
    async def go() -> int:
        with dsh.open(url) as store:
            provider = ScriptedProvider([ScriptedReply(text="sending it", tool_calls=(
                ScriptedCall(name="send", arguments={"text": "hunter2 to bob"}, id="c1"),))])
            agent = await store.agent("s1", provider=provider, config=CONFIG, tools=[send])
            result = await agent.run("send hunter2 to bob")
            assert result.pending_approvals == ("c1",)
            seq = next(e["seq"] for e in agent.session.events
                       if e["type"] == "assistant/message")
            await agent.aclose()
            return seq
    return asyncio.run(go())


def _resume(url: str) -> tuple[list[dict[str, Any]], str]:
    """Resume the session; return its ``tool/recovery`` decisions and the call's result text."""
    async def go() -> tuple[list[dict[str, Any]], str]:
        with dsh.open(url) as store:
            provider = ScriptedProvider([ScriptedReply(text="done")])
            agent = await store.agent("s1", provider=provider, config=CONFIG, tools=[send])
            await agent.run()
            assert_verifies(agent.session)
            decisions = [dict(e["data"]) for e in agent.session.events
                         if e["type"] == "tool/recovery"]
            text = next(" ".join(b["text"] for b in block["content"] if b["type"] == "text")
                        for message in agent.session.derive_messages()
                        for block in message.get("content") or ()
                        if block.get("type") == "tool-result")
            await agent.aclose()
            return decisions, text
    return asyncio.run(go())


def _event_count(url: str) -> int:
    with dsh.open(url) as store:
        session = store.session("s1")
        count = len(session.events)
        store.dispose(session)
        return count


FORGET = {
    "match on the arguments": lambda store, seq: redact(store, "s1", match="hunter2"),
    "the message by seq": lambda store, seq: redact(store, "s1", seqs=[seq]),
    "erasure": lambda store, seq: erase(store, ["s1"]),
}


@pytest.mark.parametrize("how", list(FORGET))
def test_a_call_whose_arguments_were_forgotten_cannot_be_approved(url: str, how: str) -> None:
    seq = _blocked(url)
    with dsh.open(url) as store:
        FORGET[how](store, seq)
    before = _event_count(url)
    with dsh.open(url) as store, pytest.raises(AgentError) as info:
        approve(store, "s1", "c1", by="alice")
    error = info.value
    assert error.code == "APPROVAL_ARGUMENTS_REDACTED"
    assert "call 'c1' in session 's1' cannot be approved: its arguments were redacted or erased " \
           "after the approval was requested (redaction/applied at seq " in str(error)
    assert "deny it (dsh deny s1 c1) and ask for the call again in a new turn" in str(error)
    assert _event_count(url) == before  # the refusal wrote nothing
    with dsh.open(url) as store:
        deny(store, "s1", "c1", by="alice")
    decisions, text = _resume(url)
    assert sent == []
    assert [d["decision"] for d in decisions] == ["deny"]
    assert text == "This call did not run: approval was denied by alice."


def test_a_redaction_that_left_the_arguments_alone_does_not_block_the_yes(url: str) -> None:
    _blocked(url)
    with dsh.open(url) as store:
        changed = redact(store, "s1", match="sending it")  # the message's text, not the call
        assert changed.record_seq is not None
        approve(store, "s1", "c1", by="alice")
    decisions, text = _resume(url)
    assert sent == ["hunter2 to bob"]
    assert [d["decision"] for d in decisions] == ["run"]
    assert text == "Approved by alice. Its result: sent hunter2 to bob"


@pytest.mark.parametrize("how", list(FORGET))
def test_a_call_forgotten_after_its_yes_is_recorded_as_not_run(url: str, how: str) -> None:
    seq = _blocked(url)
    with dsh.open(url) as store:
        approve(store, "s1", "c1", by="alice")
        FORGET[how](store, seq)
    with dsh.open(url) as store:  # plan() decides it: the loop only carries it out
        session = store.session("s1")
        ledger = EffectLedger()
        ledger.feed(session.events)
        actions, unserved = ledger.plan(now_ms=0, effects={})  # (no tool needed to deny)
        assert [(a.kind, a.record.call_id) for a in actions] == [("forgotten", "c1")]
        assert unserved == []
        store.dispose(session)
    decisions, text = _resume(url)
    assert sent == []  # before the fix: ['[REDACTED] to bob'] or a run with '{}'
    assert [(d["decision"], d["cause"], d.get("reason")) for d in decisions] == [
        ("deny", "approval", "arguments redacted after the answer")]
    assert text == ("This call did not run: its arguments were redacted or erased after it was "
                    "approved, so what was approved can no longer be run. Ask for it again if it "
                    "is still needed.")


def test_dsh_approve_refuses_a_redacted_call_and_says_what_to_do(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    _blocked(url)
    repo = Path(__file__).resolve().parents[2]
    redacted = subprocess.run([sys.executable, "-m", "dsh.cli", "redact", "s1", "--match",
                               "hunter2", "--store", url], cwd=repo, capture_output=True,
                              text=True, timeout=120)
    assert redacted.returncode == 0, redacted.stderr
    done = subprocess.run([sys.executable, "-m", "dsh.cli", "approve", "s1", "c1", "--store",
                           url], cwd=repo, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout
    assert "error[APPROVAL_ARGUMENTS_REDACTED]: call 'c1' in session 's1' cannot be approved" \
        in done.stderr
    assert "deny it (dsh deny s1 c1)" in done.stderr


def test_a_quarantined_call_waits_and_is_approved_only_once_given_back(url: str) -> None:
    # docs/effects.md#approvals-and-forgetting: before, a quarantine's placeholder (the call
    # with arguments {}) made the ledger forget the request: approve said NO_PENDING_APPROVAL,
    # and after an unquarantine the request was lost for good
    seq = _blocked(url)
    with dsh.open(url) as store:
        applied = quarantine(store, "s1", [seq]).record_seq
    before = _event_count(url)
    with dsh.open(url) as store, pytest.raises(AgentError) as info:
        approve(store, "s1", "c1", by="alice")
    assert info.value.code == "APPROVAL_CALL_QUARANTINED"
    assert info.value.where["seq"] == applied
    assert str(info.value) == (
        f"call 'c1' in session 's1' cannot be approved while it is quarantined: its message "
        f"(seq {seq}) is withheld from the model view by the quarantine/apply at seq {applied}; "
        f"give it back first (dsh unquarantine s1 {seq}) and approve it then, or deny it "
        f"(dsh deny s1 c1)")
    assert _event_count(url) == before  # the refusal wrote nothing
    with dsh.open(url) as store:
        assert [p.call_id for p in pending_approvals(store.session("s1"))] == ["c1"]
    with dsh.open(url) as store:
        unquarantine(store, "s1", [seq])
        approve(store, "s1", "c1", by="alice")
    decisions, text = _resume(url)
    assert sent == ["hunter2 to bob"]  # the arguments the person was asked about
    assert [d["decision"] for d in decisions] == ["run"]
    assert text == "Approved by alice. Its result: sent hunter2 to bob"


def test_a_quarantined_call_can_be_denied(url: str) -> None:
    seq = _blocked(url)
    with dsh.open(url) as store:
        quarantine(store, "s1", [seq])
        deny(store, "s1", "c1", by="alice")
    decisions, _ = _resume(url)
    assert sent == []
    assert [d["decision"] for d in decisions] == ["deny"]


def test_a_call_quarantined_after_its_yes_is_recorded_as_not_run(url: str) -> None:
    # docs/effects.md#approvals-and-forgetting: approve refuses a quarantined call, so a yes
    # given before the quarantine does not run while it holds (before: sent hunter2 to bob)
    seq = _blocked(url)
    with dsh.open(url) as store:
        approve(store, "s1", "c1", by="alice")
        applied = quarantine(store, "s1", [seq]).record_seq
    with dsh.open(url) as store:
        session = store.session("s1")
        ledger = EffectLedger()
        ledger.feed(session.events)
        actions, _ = ledger.plan(now_ms=0, effects={})
        assert [(a.kind, a.record.call_id, a.record.quarantined_by) for a in actions] == [
            ("quarantined", "c1", applied)]
        store.dispose(session)
    decisions, text = _resume(url)
    assert sent == []
    assert [(d["decision"], d["cause"], d.get("reason")) for d in decisions] == [
        ("deny", "approval", "call quarantined after the answer")]
    assert text == ("This call did not run: its message was quarantined after it was approved "
                    "(withheld from the model view), and a quarantined call is not run. Ask for "
                    "it again if it is still needed.")
    with dsh.open(url) as store:  # given back after the decision: the denial stands
        unquarantine(store, "s1", [seq])
        session = store.session("s1")
        ledger = EffectLedger()
        ledger.feed(session.events)
        assert ledger.plan(now_ms=0, effects={}) == ([], [])
        store.dispose(session)


def test_a_yes_quarantined_then_given_back_before_the_run_runs(url: str) -> None:
    seq = _blocked(url)
    with dsh.open(url) as store:
        approve(store, "s1", "c1", by="alice")
        quarantine(store, "s1", [seq])
        unquarantine(store, "s1", [seq])
    decisions, text = _resume(url)
    assert sent == ["hunter2 to bob"]  # the arguments the yes was given to
    assert [(d["decision"], d.get("reason")) for d in decisions] == [("run", None)]
    assert text == "Approved by alice. Its result: sent hunter2 to bob"


def _blocked_two(url: str) -> int:
    """Run a turn whose one assistant message asks for two sends (c1, c2); return its seq."""
    async def go() -> int:
        with dsh.open(url) as store:
            provider = ScriptedProvider([ScriptedReply(text="sending both", tool_calls=(
                ScriptedCall(name="send", arguments={"text": "hunter2 to bob"}, id="c1"),
                ScriptedCall(name="send", arguments={"text": "hi to carol"}, id="c2")))])
            agent = await store.agent("s1", provider=provider, config=CONFIG, tools=[send])
            result = await agent.run("send both")
            assert sorted(result.pending_approvals) == ["c1", "c2"]
            seqs = [e["seq"] for e in agent.session.events if e["type"] == "assistant/message"]
            await agent.aclose()
            assert len(seqs) == 1  # both calls in one message
            return seqs[0]
    return asyncio.run(go())


def _planned(url: str) -> list[tuple[str, str]]:
    with dsh.open(url) as store:
        session = store.session("s1")
        ledger = EffectLedger()
        ledger.feed(session.events)
        actions, _ = ledger.plan(now_ms=0, effects={})
        store.dispose(session)
        return sorted((a.record.call_id, a.kind) for a in actions)


def test_every_call_of_a_quarantined_message_refuses_its_yes(url: str) -> None:
    # before: the seq named only the message's last call, so c1 was approved while withheld
    seq = _blocked_two(url)
    with dsh.open(url) as store:
        quarantine(store, "s1", [seq])
    for call_id in ("c1", "c2"):
        with dsh.open(url) as store, pytest.raises(AgentError) as info:
            approve(store, "s1", call_id, by="alice")
        assert info.value.code == "APPROVAL_CALL_QUARANTINED"


def test_every_yes_of_a_message_quarantined_after_it_is_not_run(url: str) -> None:
    seq = _blocked_two(url)
    with dsh.open(url) as store:
        approve(store, "s1", "c1", by="alice")
        approve(store, "s1", "c2", by="alice")
        quarantine(store, "s1", [seq])
    assert _planned(url) == [("c1", "quarantined"), ("c2", "quarantined")]  # before: c1 "run"


def test_every_yes_of_a_redacted_message_is_forgotten(url: str) -> None:
    seq = _blocked_two(url)
    with dsh.open(url) as store:
        approve(store, "s1", "c1", by="alice")
        approve(store, "s1", "c2", by="alice")
        redact(store, "s1", seqs=[seq])
    assert _planned(url) == [("c1", "forgotten"), ("c2", "forgotten")]  # before: c1 "run"

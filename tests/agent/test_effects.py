"""Effect classes, idempotency keys, resume decisions and durable approvals (docs/effects.md).

Crashes here are logs that end inside a turn, as a killed process leaves them: a recorder
writes the call and the store is closed without ending the turn; resume's repair closes it.
The same behaviours in real killed processes are in ``test_effect_faults.py``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh.agent import (
    Agent,
    AgentError,
    ScriptedCall,
    ScriptedProvider,
    ScriptedReply,
    ToolContext,
    ToolOutput,
    approve,
    deny,
    idempotency_key,
    pending_approvals,
    shell_tool,
    tool,
    workspace_tools,
)
from dsh.agent._effects import EffectLedger
from tests.agent.helpers import CONFIG, assert_verifies

runs: list[tuple[str, str, int]] = []
effects_found: dict[str, ToolOutput] = {}


def _note(name: str, ctx: ToolContext) -> str:
    runs.append((name, ctx.idempotency_key, ctx.attempt))
    return f"{name} ran"


@tool(name="look", effect="read_only")
def look(ctx: ToolContext) -> str:
    """Read something."""
    return _note("look", ctx)


@tool(name="pay", effect="idempotent")
def pay(amount: int, ctx: ToolContext) -> str:
    """Pay, idempotently.

    Args:
        amount: Cents.
    """
    return _note("pay", ctx)


def _find(key: str) -> ToolOutput | None:
    return effects_found.get(key)


@tool(name="transfer", effect="reconcilable", reconcile=_find)
def transfer(amount: int, ctx: ToolContext) -> str:
    """Transfer, found again by key.

    Args:
        amount: Cents.
    """
    return _note("transfer", ctx)


@tool(name="charge")
def charge(amount: int, ctx: ToolContext) -> str:
    """Charge a card (irreversible by default).

    Args:
        amount: Cents.
    """
    return _note("charge", ctx)


@tool(name="wire", needs_approval=True)
def wire(amount: int, ctx: ToolContext) -> str:
    """Wire money; a person must say yes first.

    Args:
        amount: Cents.
    """
    return _note("wire", ctx)


TOOLS = [look, pay, transfer, charge, wire]
ARGS = {"look": "{}", "pay": '{"amount":5}', "transfer": '{"amount":5}',
        "charge": '{"amount":5}', "wire": '{"amount":5}'}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    runs.clear()
    effects_found.clear()


def _crash_inside(url: str, name: str, *, recorded: bool = True, sid: str = "s1") -> str:
    """Write a session whose turn stops after ``name``'s tool/call (or before it)."""
    found = next(t for t in TOOLS if t.name == name)
    with dsh.open(url) as store:
        recorder = store.recorder(sid)
        session = recorder.session
        turn = recorder.turn()
        step = turn.step()
        step.user_message("go")
        step.request(CONFIG, tools=[t.declaration() for t in TOOLS])
        step.assistant([{"type": "tool-call", "id": "c1", "name": name,
                         "arguments": ARGS[name]}])
        key = ""
        if recorded:
            key = step.tool_call("c1", effect=found.effect)["data"]["idempotencyKey"]
        store.flush(session)
    return key  # the store closed with the turn open: a crash, as far as the log knows


async def _resume(url: str, replies: int = 1, **options: Any) -> tuple[Agent, Any]:
    store = dsh.open(url)
    provider = ScriptedProvider([ScriptedReply(text="done")] * replies)
    options.setdefault("tools", TOOLS)
    agent = await store.agent("s1", provider=provider, config=CONFIG, **options)
    return agent, store


def _decisions(agent: Agent) -> list[Mapping[str, Any]]:
    return [e["data"] for e in agent.session.events if e["type"] == "tool/recovery"]


def _result_text(agent: Agent, call_id: str = "c1") -> str:
    for message in agent.session.derive_messages():
        for block in message.get("content") or ():
            if block.get("type") == "tool-result" and block["toolCallId"] == call_id:
                return " ".join(b["text"] for b in block["content"] if b["type"] == "text")
    raise AssertionError(f"no result for {call_id}")


def _run(url: str, **options: Any) -> tuple[Agent, list[Any]]:
    async def go() -> tuple[Agent, list[Any]]:
        agent, store = await _resume(url, **options)
        try:
            await agent.run()
            assert_verifies(agent.session)
            return agent, list(agent.session.events)
        finally:
            await agent.aclose()
            store.close()
    return asyncio.run(go())


# --- declarations ------------------------------------------------------------------------------

def test_tool_effect_defaults_to_irreversible_and_refuses_unknown_classes() -> None:
    assert charge.effect == "irreversible" and pay.effect == "idempotent"
    with pytest.raises(AgentError, match="effect must be one of read_only, idempotent") as info:
        tool(name="odd", effect="sometimes")(lambda: None)  # type: ignore[call-overload]
    assert info.value.code == "TOOL"
    with pytest.raises(AgentError, match="reconcilable tool needs reconcile="):
        @tool(effect="reconcilable")
        def nothing_to_ask() -> str:
            """No reconcile."""
            return ""
    with pytest.raises(AgentError, match="only a reconcilable one takes it"):
        @tool(effect="idempotent", reconcile=_find)
        def asks_anyway() -> str:
            """Reconcile on an idempotent tool."""
            return ""


def test_builtin_tools_declare_their_effect_classes(tmp_path: Path) -> None:
    assert {t.name: t.effect for t in workspace_tools(tmp_path)} == {
        "read_file": "read_only", "list_dir": "read_only", "glob": "read_only",
        "grep": "read_only"}
    assert shell_tool(tmp_path).effect == "irreversible"
    assert not shell_tool(tmp_path).needs_approval
    durable = shell_tool(tmp_path, approve="durable", effect="idempotent")
    assert (durable.effect, durable.needs_approval) == ("idempotent", True)


# --- idempotency keys --------------------------------------------------------------------------

def test_idempotency_key_is_a_pure_function_of_session_seq_and_epoch() -> None:
    key = idempotency_key("s1", 7, 3, created_at=1_700_000_000_000)
    assert key == idempotency_key("s1", 7, 3, created_at=1_700_000_000_000)
    assert key.startswith("dsh-") and len(key) == 44
    others = {idempotency_key("s1", 8, 3, created_at=1_700_000_000_000),
              idempotency_key("s1", 7, 4, created_at=1_700_000_000_000),
              idempotency_key("s2", 7, 3, created_at=1_700_000_000_000),
              idempotency_key("s1", 7, 3, created_at=1_700_000_000_001)}
    assert key not in others and len(others) == 4


def test_the_tool_call_records_its_effect_and_key_and_the_body_receives_that_key(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"

    async def go() -> list[Any]:
        with dsh.open(url) as store:
            provider = ScriptedProvider([
                ScriptedReply(tool_calls=(ScriptedCall(name="pay", arguments={"amount": 5},
                                                       id="c1"),)),
                ScriptedReply(text="paid")])
            agent = await store.agent("s1", provider=provider, config=CONFIG, tools=TOOLS)
            await agent.run("pay")
            await agent.aclose()
            return list(agent.session.events)

    events = asyncio.run(go())
    call = next(e for e in events if e["type"] == "tool/call")
    key = idempotency_key("s1", call["seq"], 0, created_at=_created_at(url))
    assert call["data"]["effect"] == "idempotent"
    assert call["data"]["idempotencyKey"] == key
    assert runs == [("pay", key, 1)]


def _created_at(url: str) -> int:
    with dsh.open(url) as store:
        return int(store.read("s1").header["createdAt"])


# --- resume decisions --------------------------------------------------------------------------

def test_an_interrupted_read_only_call_runs_again_and_the_model_gets_its_result(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    _crash_inside(url, "look")
    agent, events = _run(url)
    assert [(d["decision"], d["effect"], d["cause"], d["attempt"]) for d in _decisions(agent)] \
        == [("run", "read_only", "interrupted", 2)]
    assert [r[0] for r in runs] == ["look"]
    text = _result_text(agent)
    assert "it was run again after the restart" in text and text.endswith("look ran")
    rewrite = next(e for e in events if e["type"] == "tool/result"
                   and e.get("surfaceOp") != "append")
    closer = next(e for e in events if e["type"] == "tool/result"
                  and e.get("surfaceOp") == "append")
    assert rewrite["surfaceOp"] == {"op": "replace", "start": closer["seq"],
                                    "end": closer["seq"]}
    assert events[-1]["data"]["reason"] == {"kind": "completed"}  # the model answered


def test_an_interrupted_idempotent_call_runs_again_with_the_recorded_key(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    key = _crash_inside(url, "pay")
    agent, _ = _run(url)
    assert runs == [("pay", key, 2)]
    decision = _decisions(agent)[0]
    assert (decision["decision"], decision["idempotencyKey"]) == ("run", key)
    assert "with the same idempotency key" in _result_text(agent)


def test_an_interrupted_reconcilable_call_records_what_reconcile_found(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    key = _crash_inside(url, "transfer")
    effects_found[key] = ToolOutput(content="transfer tr_1 done")
    agent, _ = _run(url)
    assert runs == []  # found: never ran again
    assert [d["decision"] for d in _decisions(agent)] == ["reconcile"]
    assert _result_text(agent).endswith("found that it took effect. Its result: "
                                        "transfer tr_1 done")


def test_an_interrupted_reconcilable_call_that_did_not_happen_runs_again(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    key = _crash_inside(url, "transfer")
    agent, _ = _run(url)
    assert runs == [("transfer", key, 2)]
    assert [(d["decision"], d.get("reason")) for d in _decisions(agent)] == [
        ("reconcile", None), ("run", "reconcile found no effect")]
    assert "found no effect, so it was run once more" in _result_text(agent)


def test_an_interrupted_irreversible_call_is_never_run_again_and_a_person_is_asked(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    _crash_inside(url, "charge")
    agent, _ = _run(url)
    assert runs == []
    assert [d["decision"] for d in _decisions(agent)] == ["in-doubt"]
    assert "outcome is unknown" in _result_text(agent)  # answered as the repair answered it
    waiting = pending_approvals(agent.session)
    assert [(p.call_id, p.name, p.reason, p.arguments) for p in waiting] == [
        ("c1", "charge", "in-doubt", '{"amount":5}')]
    # A second resume decides nothing new: the call waits for the person.
    with pytest.raises(AgentError) as info:
        _run(url)
    assert info.value.code == "AWAITING_APPROVAL" and "c1 (charge" in info.value.message

    with dsh.open(url) as store:
        approve(store, "s1", "c1", by="ops", note="checked: no charge on the card")
    agent, _ = _run(url)
    assert [r[0] for r in runs] == ["charge"] and runs[0][2] == 2
    assert "ops approved running it again" in _result_text(agent)
    assert pending_approvals(agent.session) == []


def test_a_call_that_never_started_is_logged_and_left_to_the_model(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    _crash_inside(url, "charge", recorded=False)
    agent, _ = _run(url)
    assert runs == []
    assert [d["decision"] for d in _decisions(agent)] == ["not-started"]
    assert "before the \"charge\" tool call c1 was recorded as started" in _result_text(agent)


def test_a_resume_without_the_tool_decides_nothing_for_its_calls(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    _crash_inside(url, "pay")
    agent, _ = _run(url, tools=[look])
    assert _decisions(agent) == [] and runs == []
    assert "this agent has no such tool" in caplog.text
    ledger = EffectLedger()
    ledger.feed(agent.session.events)
    assert ledger.records["c1"].closer == "TOOL_OUTCOME_UNKNOWN"  # a later agent decides


# --- durable approvals -------------------------------------------------------------------------

def _blocked_run(url: str, clock: Any = None) -> Any:
    async def go() -> Any:
        with dsh.open(url) as store:
            provider = ScriptedProvider([ScriptedReply(text="wiring", tool_calls=(
                ScriptedCall(name="wire", arguments={"amount": 5}, id="c1"),))])
            agent = await store.agent("s1", provider=provider, config=CONFIG,
                                 tools=TOOLS, approval_timeout_ms=60_000,
                                 **({"clock": clock} if clock else {}))
            result = await agent.run("wire 5")
            await agent.aclose()
            return result
    return asyncio.run(go())


def test_a_tool_that_needs_approval_records_the_request_and_ends_the_turn_blocked(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    result = _blocked_run(url, clock=lambda: 1_000_000)
    assert result.reason == {"kind": "blocked"} and result.pending_approvals == ("c1",)
    assert runs == []
    with dsh.open(url) as store:
        session = store.session("s1")
        request = next(e for e in session.events if e["type"] == "approval/requested")
        assert request["ignorable"] is True
        assert dict(request["data"]) == {"callId": "c1", "turn": 1, "step": 1, "name": "wire",
                                         "arguments": '{"amount":5}', "effect": "irreversible",
                                         "reason": "tool", "deadline": 1_060_000}
        store.dispose(session)


def test_a_denial_is_recorded_and_the_model_is_told(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    _blocked_run(url)
    with dsh.open(url) as store:
        answer = deny(store, "s1", "c1", by="alice", note="wrong account")
    assert dict(answer["data"]) == {"callId": "c1", "requestedSeq": answer["data"]["requestedSeq"],
                                    "decision": "denied", "by": "alice", "reason": "tool",
                                    "note": "wrong account"}
    sent: list[Any] = []
    agent, _ = _run(url, request_hook=lambda r: sent.append(r) or r)
    assert runs == []
    told = "This call did not run: approval was denied by alice (wrong account)."
    assert _result_text(agent) == told
    assert told in str(sent[0].messages[-1])  # the model's request carries it


def test_an_approval_after_its_deadline_is_a_recorded_denial(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    _blocked_run(url, clock=lambda: 1_000_000)
    with dsh.open(url) as store, pytest.raises(AgentError) as info:
        approve(store, "s1", "c1", clock=lambda: 1_060_000)
    assert info.value.code == "APPROVAL_EXPIRED"
    agent, _ = _run(url, clock=lambda: 1_060_001)
    assert runs == []
    answers = [e["data"] for e in agent.session.events if e["type"] == "approval/answered"]
    assert [(a["decision"], a["by"]) for a in answers] == [("denied", "deadline")]
    assert _result_text(agent).startswith("This call did not run: nobody answered before the "
                                          "deadline")


def test_a_deadline_that_passes_unanswered_is_recorded_at_the_next_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    _blocked_run(url, clock=lambda: 1_000_000)
    agent, _ = _run(url, clock=lambda: 2_000_000)
    answers = [e["data"] for e in agent.session.events if e["type"] == "approval/answered"]
    assert [(a["decision"], a["by"]) for a in answers] == [("denied", "deadline")]
    assert "nobody answered before the deadline" in _result_text(agent)
    assert runs == []


def test_an_answer_needs_a_waiting_request(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    _blocked_run(url)
    with dsh.open(url) as store:
        with pytest.raises(AgentError, match=r"no approval waiting for call 'c9' \(waiting: c1"):
            approve(store, "s1", "c9")
        approve(store, "s1", "c1", by="bob")
        with pytest.raises(AgentError) as info:
            deny(store, "s1", "c1")
    assert info.value.code == "NO_PENDING_APPROVAL"
    assert "it was already approved by bob (seq " in str(info.value)
    assert "the next resumed run runs the call (waiting: none)" in str(info.value)


APPROVAL_CHILD = textwrap.dedent('''
    import asyncio, sys
    import dsh
    from dsh.agent import Agent, ScriptedCall, ScriptedProvider, ScriptedReply
    from tests.agent.test_effects import CONFIG, TOOLS, runs

    url, stage = sys.argv[1:3]

    async def main():
        with dsh.open(url) as store:
            if stage == "ask":
                provider = ScriptedProvider([ScriptedReply(text="wiring", tool_calls=(
                    ScriptedCall(name="wire", arguments={"amount": 5}, id="c1"),))])
                agent = await store.agent("s1", provider=provider, config=CONFIG,
                                     tools=TOOLS)
                result = await agent.run("wire 5")
                print(result.reason["kind"], ",".join(result.pending_approvals))
            else:
                provider = ScriptedProvider([ScriptedReply(text="wired, thanks")])
                agent = await store.agent("s1", provider=provider, config=CONFIG, tools=TOOLS)
                result = await agent.run()
                print(result.reason["kind"], result.text, runs)
            await agent.aclose()

    asyncio.run(main())
''')


def test_an_approval_answered_by_another_process_is_carried_out_by_a_third(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    repo = Path(__file__).resolve().parents[2]

    def child(*argv: str) -> str:
        done = subprocess.run([sys.executable, *argv], cwd=repo, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert child("-c", APPROVAL_CHILD, url, "ask") == "blocked c1"  # the process exits here
    waiting = child("-m", "dsh.cli", "show", "s1", "--store", url)
    assert "? approval asked  #" in waiting and "wire [c1]  needs a person's yes; dsh approve / " \
        "dsh deny c1 until" in waiting
    wrong = subprocess.run([sys.executable, "-m", "dsh.cli", "deny", "s1", "c7", "--store", url],
                           cwd=repo, capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 1
    assert "error[NO_PENDING_APPROVAL]: session 's1' has no approval waiting for call 'c7' " \
           "(waiting: c1)" in wrong.stderr
    out = json.loads(child("-m", "dsh.cli", "approve", "s1", "c1", "--store", url, "--by", "bob",
                           "--json"))
    assert (out["decision"], out["by"], out["callId"]) == ("approved", "bob", "c1")
    ran = child("-c", APPROVAL_CHILD, url, "resume")
    assert ran.startswith("completed wired, thanks [('wire', 'dsh-")
    late = subprocess.run([sys.executable, "-m", "dsh.cli", "deny", "s1", "c1", "--store", url],
                          cwd=repo, capture_output=True, text=True, timeout=120)
    assert late.returncode == 1
    assert "no approval waiting for call 'c1': its request (seq " in late.stderr
    assert "was answered and the answer carried out (waiting: none)" in late.stderr
    shown = json.loads(child("-m", "dsh.cli", "show", "s1", "--store", url, "--json"))
    kinds = [(i["kind"], i.get("decision")) for i in shown["items"]
             if i["kind"] in ("approval", "approval-answer", "recovery", "replacement")]
    assert kinds == [("approval", None), ("approval-answer", "approved"), ("recovery", "run"),
                     ("replacement", None)]
    rewritten = next(i for i in shown["items"] if i["kind"] == "replacement")
    assert rewritten["what"] == "rewritten tool result"
    with dsh.open(url) as store:
        session = store.session("s1")
        kinds = [e["type"] for e in session.events]
        assert kinds.count("approval/requested") == 1 and kinds.count("tool/recovery") == 1
        store.dispose(session)


def test_dsh_deny_says_the_next_run_tells_the_model_not_that_it_runs_the_call(
        tmp_path: Path) -> None:
    # before: "call c1 denied by ...; the next resumed run carries it out"
    url = f"sqlite:///{tmp_path}/s.db"
    _blocked_run(url)
    denied = subprocess.run([sys.executable, "-m", "dsh.cli", "deny", "s1", "c1", "--store", url,
                             "--by", "alice"], capture_output=True, text=True, timeout=120)
    assert denied.returncode == 0, denied.stderr
    assert "s1: call c1 denied by alice (seq " in denied.stdout
    assert denied.stdout.rstrip().endswith(
        "the next resumed run tells the model the call was denied"), denied.stdout
    assert "carries it out" not in denied.stdout

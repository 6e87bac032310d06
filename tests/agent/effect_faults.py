"""Fault injection around tool calls: an agent process SIGKILLed at every point, then resumed.

One *trial* is one session whose model calls one tool of one effect class, which talks to the
payments server (:mod:`tests.agent.payments`):

1. a process runs the agent and is killed at ``first`` (a failpoint around the call: before the
   body, inside it before or after the side effect, after the body before the result is
   durable);
2. optionally a process resumes it and is killed at ``second`` (while resume decides and acts:
   ``recovery.decided``, inside the re-run's body, ``recovery.after-action``); a point the
   resume never reaches (an irreversible call is never run again) lets it finish;
3. a last process resumes and finishes the turn.

The child writes the failpoint's name to a pipe and blocks; the parent reads it (no sleeps),
SIGKILLs the child and checks the signal. A child that ends without reaching its point closes
the pipe (EOF). Then :func:`check_trial` reads the store and the server's counts: no duplicate
effect for idempotent and reconcilable tools, no second body start of an irreversible one, and
every call the model made has a result on the surface, or an approval waits for a person.

Used by ``tests/agent/test_effect_faults.py`` (fresh interpreters, a few dozen kills) and by
``bench/bench_effects.py`` (forked from a pre-imported parent, 1,000 kills per class).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsh.agent import ToolContext, ToolOutput, tool
from dsh.agent._failpoints import failpoint

KLASSES = ("read_only", "idempotent", "reconcilable", "irreversible")
FIRST_POINTS = ("tool.before-body", "effect.before", "effect.after", "tool.after-body")
SECOND_POINTS = ("", "recovery.decided", "effect.before", "effect.after",
                 "recovery.after-action")
CONFIG = {"provider": "scripted", "model": "m1"}
REPO = Path(__file__).resolve().parents[2]


def _http(server: str, method: str, path: str, body: dict[str, Any] | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(server + path, data=data, method=method,
                                     headers={"content-type": "application/json",
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def make_tools(server: str) -> list[Any]:
    """One tool per effect class, each calling the payments server around its effect."""
    def start(ctx: ToolContext) -> str:
        label = f"{ctx.session_id}/{ctx.call_id}"
        _http(server, "POST", "/start", {"label": label})
        return label

    @tool(name="read_only", effect="read_only")
    def read_only(ctx: ToolContext) -> str:
        """Read the balance."""
        start(ctx)
        failpoint("effect.before")
        _, found = _http(server, "GET", "/balance")
        failpoint("effect.after")
        return f"balance {found['balance']}"

    @tool(name="idempotent", effect="idempotent")
    def idempotent(amount: int, ctx: ToolContext) -> str:
        """Pay with the call's idempotency key.

        Args:
            amount: Cents.
        """
        label = start(ctx)
        failpoint("effect.before")
        _, paid = _http(server, "POST", "/pay", {"label": label, "amount": amount},
                        {"Idempotency-Key": ctx.idempotency_key})
        failpoint("effect.after")
        return f"paid {paid['id']}"

    def find_transfer(key: str) -> ToolOutput | None:
        status, found = _http(server, "GET", f"/transfer?reference={key}")
        return ToolOutput(content=f"transferred {found['id']}") if status == 200 else None

    @tool(name="reconcilable", effect="reconcilable", reconcile=find_transfer)
    def reconcilable(amount: int, ctx: ToolContext) -> str:
        """Transfer, referenced by the call's idempotency key.

        Args:
            amount: Cents.
        """
        label = start(ctx)
        failpoint("effect.before")
        _, made = _http(server, "POST", "/transfer", {"label": label, "amount": amount,
                                                     "reference": ctx.idempotency_key})
        failpoint("effect.after")
        return f"transferred {made['id']}"

    @tool(name="irreversible")
    def irreversible(amount: int, ctx: ToolContext) -> str:
        """Charge a card (no key, no look-up).

        Args:
            amount: Cents.
        """
        label = start(ctx)
        failpoint("effect.before")
        _, charged = _http(server, "POST", "/charge", {"label": label, "amount": amount})
        failpoint("effect.after")
        return f"charged {charged['id']}"

    return [read_only, idempotent, reconcilable, irreversible]


# --- the agent process -----------------------------------------------------------------------

def warm_up() -> None:
    """Build the tools and run one in-memory turn, so forked children start warm.

    Leaves no thread running (asyncio.run joins its worker threads), so forking stays safe.
    """
    from dsh.agent import Agent, ScriptedCall, ScriptedProvider, ScriptedReply
    from dsh.session import SessionStore

    tools = make_tools("http://127.0.0.1:9")
    provider = ScriptedProvider([ScriptedReply(tool_calls=(ScriptedCall(name="nothing"),)),
                                 ScriptedReply(text="done")])

    async def turn() -> None:
        agent = Agent.create(SessionStore(), provider, config=CONFIG, tools=tools)
        await agent.run("warm up")
        await agent.aclose()

    asyncio.run(turn())


def child(url: str, session_id: str, klass: str, server: str, stage: str, kill_at: str,
          fd: int) -> None:
    """Run one stage of a trial in this process; block forever at ``kill_at``."""
    import dsh
    from dsh import SessionBusyError
    from dsh._errors import AgentError
    from dsh.agent import Agent, ScriptedCall, ScriptedProvider, ScriptedReply
    from dsh.agent._failpoints import set_failpoint_hook

    def hook(point: str) -> None:
        if point == kill_at:
            os.write(fd, point.encode())
            time.sleep(3600)  # frozen here until the parent's SIGKILL

    set_failpoint_hook(hook)
    tools = make_tools(server)
    arguments = {} if klass == "read_only" else {"amount": 500}
    done = [ScriptedReply(text="done")] * 4

    async def main() -> None:
        store = dsh.open(url).sessions
        try:
            if stage == "first":
                provider = ScriptedProvider([ScriptedReply(text="calling", tool_calls=(
                    ScriptedCall(name=klass, arguments=arguments, id="c1"),)), *done])
                agent = Agent.create(store, provider, session_id=session_id, config=CONFIG,
                                     tools=tools)
                await agent.run("do it")
            else:
                deadline = time.monotonic() + 60
                while True:  # a killed PostgreSQL writer's lease runs out first
                    try:
                        agent = await Agent.resume(store, session_id, ScriptedProvider(done),
                                                   config=CONFIG, tools=tools)
                        break
                    except SessionBusyError:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.05)
                try:
                    await agent.run()
                except AgentError as error:  # an earlier stage already finished the turn
                    if error.code not in ("NOTHING_TO_RUN", "AWAITING_APPROVAL"):
                        raise
            await agent.aclose()
        finally:
            store.close()

    asyncio.run(main())


@dataclass
class Stage:
    """What became of one agent process."""

    kill_at: str
    killed: bool


Spawn = Callable[[list[str]], Stage]


def _marker(read: int) -> str:
    """The failpoint the child reached, or '' when it ended without reaching one (EOF)."""
    try:
        return os.read(read, 200).decode()
    finally:
        os.close(read)


def spawn_process(args: list[str]) -> Stage:
    """Run a stage in a fresh interpreter (``python -m tests.agent.effect_faults``)."""
    read, write = os.pipe()
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen([sys.executable, "-m", "tests.agent.effect_faults", *args,
                                    str(write)], pass_fds=(write,), cwd=REPO,
                                   stdout=subprocess.DEVNULL, stderr=errors)
        os.close(write)
        reached = _marker(read)
        if reached:
            process.send_signal(signal.SIGKILL)
            code = process.wait(60)
            assert code == -signal.SIGKILL, code
            return Stage(reached, True)
        code = process.wait(120)
        if code != 0:
            errors.seek(0)
            raise AssertionError(f"stage {args} exited {code}: {errors.read().decode()[-3000:]}")
        return Stage(args[-1], False)


def spawn_fork(args: list[str]) -> Stage:
    """Run a stage in a child forked from this (pre-imported, thread-free) process."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        code = 0
        try:
            child(*args, fd=write)  # type: ignore[misc]
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        os._exit(code)
    os.close(write)
    reached = _marker(read)
    if reached:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        return Stage(reached, True)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise AssertionError(f"stage {args} exited {os.waitstatus_to_exitcode(status)}")
    return Stage(args[-1], False)


# --- a trial ---------------------------------------------------------------------------------

@dataclass
class Trial:
    """One session's history and what the checks found."""

    klass: str
    first: str
    second: str
    stages: list[Stage] = field(default_factory=list)
    kills: int = 0
    started: int = 0
    applied: int = 0
    duplicates: int = 0
    reruns: int = 0
    unanswered: int = 0
    pending_approval: bool = False


def run_trial(spawn: Spawn, url: str, server: str, session_id: str, klass: str, first: str,
              second: str) -> Trial:
    """Kill at ``first``, then (if given) resume and kill at ``second``, then finish."""
    trial = Trial(klass, first, second)
    base = [url, session_id, klass, server]
    trial.stages.append(spawn([*base, "first", first]))
    if second:
        trial.stages.append(spawn([*base, "resume", second]))
    trial.stages.append(spawn([*base, "resume", ""]))
    trial.kills = sum(stage.killed for stage in trial.stages)
    return trial


def check_trial(trial: Trial, url: str, server: str, session_id: str) -> Trial:
    """Fill the counts of ``trial`` from the server and the stored log."""
    import dsh
    from dsh.agent._effects import EffectLedger
    from dsh.session import Session

    label = f"{session_id}/c1"
    _, counts = _http(server, "GET", "/counts")
    trial.started = counts["started"].get(label, 0)
    bucket = {"idempotent": "pay", "reconcilable": "transfer", "irreversible": "charge"}
    trial.applied = counts[bucket[trial.klass]].get(label, 0) if trial.klass in bucket else 0
    trial.duplicates = max(0, trial.applied - 1)
    if trial.klass == "irreversible":
        trial.reruns = max(0, trial.started - 1)
    with dsh.open(url) as store:
        read = store.read(session_id)
    session = Session.restore(session_id, read.events, read.header,
                              inherited_event_count=read.header.get("seedLength") or 0)
    answered: set[str] = set()
    asked: list[str] = []
    for message in session.derive_messages():
        for block in message.get("content") or ():
            if block.get("type") == "tool-call":
                asked.append(block["id"])
            elif block.get("type") == "tool-result":
                answered.add(block["toolCallId"])
    ledger = EffectLedger()
    ledger.feed(read.events)
    waiting = {p.call_id for p in ledger.pending_approvals()}
    trial.pending_approval = "c1" in waiting
    # A call counts as answered when its result is on the surface and is not an unresolved
    # "outcome unknown" (that one must have a person asked about it).
    for call in asked:
        record = ledger.records.get(call)
        in_doubt = record is not None and (record.closer == "TOOL_OUTCOME_UNKNOWN"
                                           or record.open_decision is not None)
        if call not in waiting and (call not in answered or in_doubt):
            trial.unanswered += 1
    return trial


def main() -> None:
    *args, fd = sys.argv[1:]
    child(*args, fd=int(fd))  # type: ignore[call-arg]


if __name__ == "__main__":
    main()

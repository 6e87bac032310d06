"""Logs written before clears and pops went onto the surface (a12a84a..bef2f0b^).

That dsh recorded a LangChain ``clear()`` as an ignorable ``langchain/clear {through}`` mark
after ending the turn, and a ``pop`` as ``<fmt>/pop {seq, index}``: the adapter's own read
honours them, so every reader must too, and a writer's resume appends the removals they stand
for once (docs/forgetting.md#logs-from-before-surface-removals).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.adapters.conftest import dsh, dsh_events, dsh_messages
from tests.adapters.test_cleared import SECRET, _no_title_holds_the_secret
from tests.agent.providers.servers import ScriptedServer, Stream, openai_reply

OLD = ("lc-old", "sdk-old", "tool-old")
"""The sessions :func:`_old_logs` writes: a LangChain clear, an SDK pop of a prompt, an SDK pop
of a tool output whose call stays."""


def _old_cleared(store: str, sid: str = "old") -> None:
    """Session ``sid``: the secret, then a clear the way a12a84a's ``LiveLog.clear`` wrote it."""
    from dsh.adapters.langchain import DshChatMessageHistory

    history = DshChatMessageHistory(sid, store)
    history.add_user_message(f"my password is {SECRET}")
    history.add_ai_message("noted")
    shaper = history._log.open()
    shaper.end_turn()
    shaper.mark("langchain/clear", {"through": shaper.session.seq - 1})  # the old shape
    history.add_user_message("and now something else")  # written after the clear
    history.add_ai_message("sure")
    history.close()


def _old_popped(store: str, sid: str, *, tool: bool = False, marks: int = 1) -> None:
    """Session ``sid``: the secret in a prompt (or a tool output), then a12a84a's ``pop_item``
    mark of that event (``marks`` times); ``noted`` stays."""
    from dsh.adapters.openai_agents import DshSession

    async def fill() -> None:
        session = DshSession(sid, store)
        if tool:
            await session.add_items([
                {"role": "user", "content": "read the vault"},
                {"type": "function_call", "call_id": "c1", "name": "vault", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": SECRET},
                {"role": "assistant", "content": "noted"}])
        else:
            await session.add_items([{"role": "user", "content": f"my password is {SECRET}"},
                                     {"role": "assistant", "content": "noted"}])
        shaper = session._log.open()
        kind = "tool/result" if tool else "user/message"
        seq = next(e["seq"] for e in shaper.session.events if e["type"] == kind)
        shaper.end_turn()
        for _ in range(marks):
            shaper.mark("openai-agents/pop", {"seq": seq, "index": 0})  # a12a84a's pop_item
        assert SECRET not in json.dumps(await session.get_items())
        session.close()

    asyncio.run(fill())


def _old_logs(store: str) -> None:
    _old_cleared(store, OLD[0])
    _old_popped(store, OLD[1])
    _old_popped(store, OLD[2], tool=True)


def _removals(store: str, sid: str) -> list[dict[str, Any]]:
    """The surface removals the stored log holds (assistant replaces and result placeholders)."""
    return [e for e in dsh_events(sid, store) if e.get("surfaceOp") not in (None, "append")]


def _run(store: str, sid: str, server: ScriptedServer, home: Path) -> None:
    """``dsh run --session sid`` against the local server; its request holds no secret."""
    server.add(Stream(openai_reply("ok")))
    env = {**os.environ, "OPENAI_API_KEY": "test", "DSH_HOME": str(home)}
    proc = subprocess.run([sys.executable, "-m", "dsh.cli", "run", "--session", sid,
                           "--store", store, "--provider", "openai-compatible", "--base-url",
                           server.base_url + "/v1", "--model", "gpt-test", "what did I say?"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    sent = json.dumps(server.requests[-1])
    assert "what did I say?" in sent and SECRET not in sent


def _thanked(store: str, sid: str) -> list[Any]:
    """``add_items`` of one prompt to SDK session ``sid`` (a writer's resume), then its items."""
    from dsh.adapters.openai_agents import DshSession

    async def resumed() -> list[Any]:
        session = DshSession(sid, store)
        await session.add_items([{"role": "user", "content": "thanks"}])
        items = await session.get_items()
        session.close()
        return items

    return asyncio.run(resumed())


@contextlib.contextmanager
def _store(kind: str, tmp_path: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'sessions.db'}"
    elif kind == "jsonl":
        yield f"jsonl:///{tmp_path / 'store'}"
    else:
        from dsh.testing._stores import postgres_unreachable, temporary_postgres_url

        reason = postgres_unreachable()
        if reason is not None:
            pytest.skip(f"SKIPPED LOUDLY: {reason}")
        with temporary_postgres_url() as url:
            yield url


def test_an_old_clear_mark_leaves_dsh_messages(tmp_path: Path) -> None:
    from dsh.adapters.langchain import DshChatMessageHistory

    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    _old_cleared(store)
    again = DshChatMessageHistory("old", store)
    assert [m.content for m in again.messages] == ["and now something else", "sure"]
    again.close()
    sent = json.dumps(dsh_messages("old", store))
    assert SECRET not in sent and "something else" in sent


def test_an_old_pop_mark_leaves_dsh_messages(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    _old_popped(store, "popped")
    sent = json.dumps(dsh_messages("popped", store))
    assert SECRET not in sent and "noted" in sent


@pytest.mark.parametrize("tool", [False, True])
def test_an_event_popped_by_two_old_marks_is_removed_once(tmp_path: Path, tool: bool) -> None:
    # before: a tool output two marks named was withheld twice, the second replace of a node
    # no longer on the surface refused (error[SURFACE] from dsh messages; every writer's
    # resume failed, so the session could not be written again)
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    _old_popped(store, "twice", tool=tool, marks=2)
    sent = json.dumps(dsh_messages("twice", store))
    assert SECRET not in sent and "noted" in sent
    items = _thanked(store, "twice")
    assert SECRET not in json.dumps(items) and items[-1] == {"role": "user", "content": "thanks"}
    assert len(_removals(store, "twice")) == 1
    dsh("verify", "twice", "--store", store)


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_readers_mark_what_old_marks_removed_and_write_nothing(kind: str,
                                                               tmp_path: Path) -> None:
    """Before any writer resumed the log: titles, ``dsh show``, search marks and verify."""
    with _store(kind, tmp_path) as store:
        _old_logs(store)
        before = {sid: dsh_events(sid, store) for sid in OLD}
        for sid in OLD:
            shown = dsh("show", sid, "--store", store)
            assert "REMOVED from the model view" in shown, shown
            assert SECRET in shown  # the log keeps the bytes, marked
            _no_title_holds_the_secret(store, sid, shown)
            dsh("verify", sid, "--store", store)
            assert SECRET not in json.dumps(dsh_messages(sid, store))
        assert {sid: dsh_events(sid, store) for sid in OLD} == before  # readers wrote nothing
        rows = {r["id"]: r for r in json.loads(dsh("ls", "--store", store, "--json"))}
        assert rows["lc-old"]["title"] == "and now something else"
        assert rows["sdk-old"]["title"] is None
        assert rows["tool-old"]["title"] == "read the vault"


@pytest.mark.parametrize("kind", ["sqlite", "jsonl", "postgresql"])
def test_dsh_run_on_an_old_log_sends_none_of_it_and_appends_the_removal_once(
        kind: str, tmp_path: Path) -> None:
    with _store(kind, tmp_path) as store, ScriptedServer() as server:
        _old_logs(store)
        for sid in OLD:
            assert _removals(store, sid) == []
            _run(store, sid, server, tmp_path / "home")
            written = _removals(store, sid)
            assert len(written) == 1, written  # the log now says it: every reader honours it
            _run(store, sid, server, tmp_path / "home")
            assert _removals(store, sid) == written  # once
            shown = dsh("show", sid, "--store", store)
            assert "REMOVED from the model view" in shown and SECRET in shown
            _no_title_holds_the_secret(store, sid, shown)
            dsh("verify", sid, "--store", store)
        placeholder = _removals(store, "tool-old")[0]
        assert placeholder["type"] == "tool/result"  # the call stays answered


def test_an_adapter_resume_appends_the_removal_and_keeps_its_view(tmp_path: Path) -> None:
    from dsh.adapters.langchain import DshChatMessageHistory

    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    _old_logs(store)
    history = DshChatMessageHistory("lc-old", store)
    history.add_user_message("one more")  # a write: the resume appends the removal first
    assert [m.content for m in history.messages] == ["and now something else", "sure",
                                                     "one more"]
    history.close()

    items = _thanked(store, "tool-old")
    assert SECRET not in json.dumps(items)
    assert [i.get("type") for i in items] == [None, "function_call", None, None]
    for sid in ("lc-old", "tool-old"):
        assert len(_removals(store, sid)) == 1
        dsh("verify", sid, "--store", store)
        assert SECRET not in json.dumps(dsh_messages(sid, store))


@pytest.mark.parametrize("known", [True, False])
def test_a_resume_through_a_restore_point_finds_old_marks_in_its_prefix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, known: bool) -> None:
    """docs/formats.md#restore-points: a format 3 state names the prefix's old marks, so the
    resume reads only the tail; a format 2 one (written before) cannot say, so the resume
    reads the whole log once, and its writer leaves a format 3 one."""
    from dataclasses import replace

    import dsh as dsh_api
    from dsh.persistence import Persistence, open_backend
    from dsh.persistence import _restore_point as rp
    from dsh.session import PagedLog, RestoreFold

    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    with monkeypatch.context() as patched:
        if not known:  # a writer before format 3: states that do not know their old marks
            state = RestoreFold.state
            patched.setattr(RestoreFold, "state",
                            lambda self: replace(state(self), old_marks=None))
        _old_cleared(store, "lc-old")

    def restore_point() -> tuple[int, Any]:
        with Persistence(open_backend(store)) as persistence, \
                persistence.open("lc-old", "read") as handle:
            point, _, _ = handle.read_from_restore_point()
            return point.state.event_count, point.state.old_marks

    cut, marks = restore_point()
    assert (marks is None) is not known
    assert known is (marks is not None and marks.through >= 0)
    monkeypatch.setattr(PagedLog, "__getitem__", _no_prefix_read(PagedLog.__getitem__, cut))
    used = rp.stats["used"]
    with dsh_api.open(store).sessions as sessions:
        session = sessions.resume("lc-old")
        assert isinstance(session._log, PagedLog) is known
        assert SECRET not in repr(list(session.derive_messages()))
        sessions.flush(session)
    assert (rp.stats["used"] == used + 1) is known
    assert len(_removals(store, "lc-old")) == 1
    _, marks = restore_point()
    assert marks is not None and marks.through >= 0  # format 3 now (kept by the writer)


def _no_prefix_read(getitem: Any, cut: int) -> Any:
    """``PagedLog.__getitem__`` refusing a slice that starts before ``cut`` (a prefix read)."""
    def guarded(self: Any, index: Any) -> Any:
        if isinstance(index, slice) and (index.start or 0) < cut and self._cut == cut:
            raise AssertionError(f"the resume read the prefix ({index})")
        return getitem(self, index)
    return guarded


def test_published_dsh_reads_a_log_whose_old_marks_were_applied(tmp_path: Path) -> None:
    import dsh as dsh_api
    from tests.persistence.test_restore_point import peer_export

    root = tmp_path / "store"
    store = f"jsonl:///{root}"
    _old_logs(store)
    with dsh_api.open(store).sessions as sessions:
        for sid in OLD:
            sessions.flush(sessions.resume(sid))
    out = tmp_path / "export"
    peer_export(root, out)
    for sid in OLD:
        view = json.loads((out / f"{sid}.json").read_text())
        assert [e["type"] for e in view["events"]] == [e["type"] for e in dsh_events(sid, store)]
        assert any(e.get("surfaceOp") not in (None, "append") for e in view["events"])


def test_the_viewer_marks_what_old_marks_removed(tmp_path: Path) -> None:
    from tests.view import stores
    from tests.view.test_fresh import _get, _stop

    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    _old_logs(store)
    server, base, token = stores.start_view(store)
    try:
        t = f"token={urllib.parse.quote(token)}"
        status, listing = _get(base, f"/?{t}")
        assert status == 200 and all(sid in listing for sid in OLD) and SECRET not in listing
        for sid in OLD:
            status, page = _get(base, f"/s/{sid}?{t}")
            assert status == 200 and "REMOVED from the model view" in page
            heads = re.findall(r"<title>.*?</title>|<h1.*?</h1>", page, re.S)
            assert heads and not any(SECRET in h for h in heads)
            status, found = _get(base, f"/s/{sid}/search?q=hunter2&{t}")
            items = re.findall(r'<li class="hit">.*?</li>', found, re.S)
            assert status == 200 and items and all(
                "REMOVED from the model view" in i for i in items), items
    finally:
        _stop(server)


def test_dsh_chat_on_an_old_log_sends_none_of_it(tmp_path: Path) -> None:
    pexpect = pytest.importorskip("pexpect")
    from tests.cli.test_chat import spawn

    store = f"sqlite:///{tmp_path / 'home' / 'sessions.db'}"  # the chat's ($DSH_HOME)
    (tmp_path / "home").mkdir()
    _old_logs(store)
    with ScriptedServer() as server:
        for sid in OLD:
            server.add(Stream(openai_reply("ok")))
            chat = spawn(tmp_path, server, sid)
            chat.expect_exact("you> ")
            chat.sendline("what did I say?")
            chat.expect_exact("ok")
            chat.expect_exact("you> ")
            chat.sendeof()  # Ctrl+D at the prompt ends the chat
            chat.expect(pexpect.EOF)
            chat.close()
            sent = json.dumps(server.requests[-1])
            assert chat.exitstatus == 0 and "what did I say?" in sent and SECRET not in sent
            assert len(_removals(store, sid)) == 1
            dsh("verify", sid, "--store", store)

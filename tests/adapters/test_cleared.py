"""Cleared means cleared: what a framework clears, pops or drops never reaches a model again.

For each adapter, a secret goes into the session, the framework removes it (SDK
``clear_session`` / ``pop_item``, LangChain ``clear()``, LangGraph ``delete_thread`` and a
``RemoveMessage``, Pydantic AI ``clear()``), and then the next model request — captured by a local
OpenAI-protocol server — holds none of it, from the framework and from ``dsh run --session``;
``dsh show`` marks the removal and the log still holds the bytes.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.adapters.conftest import dsh, dsh_messages
from tests.adapters.kill_child import run
from tests.agent.providers.servers import ScriptedServer, Stream, openai_reply

SECRET = "hunter2-4f9a"


def _no_secret(server: ScriptedServer) -> None:
    assert server.requests, "the model was asked"
    assert SECRET not in json.dumps(server.requests[-1])


def _dsh_run_sends_no_secret(store: str, session: str, server: ScriptedServer) -> None:
    server.add(Stream(openai_reply("ok")))
    env = {**os.environ, "OPENAI_API_KEY": "test", "DSH_HOME": str(Path(store[10:]).parent)}
    proc = subprocess.run([sys.executable, "-m", "dsh.cli", "run", "--session", session,
                           "--store", store, "--provider", "openai-compatible", "--base-url",
                           server.base_url + "/v1", "--model", "gpt-test", "what did I say?"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    _no_secret(server)


def _shown_removed(store: str, session: str) -> None:
    shown = dsh("show", session, "--store", store)
    assert "REMOVED from the model view" in shown
    assert SECRET in shown  # the log kept the bytes: dsh show still shows what was removed
    dsh("verify", session, "--store", store)
    _no_title_holds_the_secret(store, session, shown)


def _no_title_holds_the_secret(store: str, session: str, shown: str) -> None:
    """No title shows what was removed; a search marks each hit in it (docs/forgetting.md)."""
    assert SECRET not in shown.splitlines()[0]  # dsh show's head: 'session ID  TITLE'
    assert SECRET not in json.dumps(json.loads(dsh("show", session, "--store", store,
                                                   "--json"))["session"])
    listed = dsh("ls", "--store", store)
    assert session in listed and SECRET not in listed
    rows = json.loads(dsh("ls", "--store", store, "--json"))
    assert session in [r["id"] for r in rows] and SECRET not in json.dumps(rows)
    hits = [h for h in json.loads(dsh("search", "hunter2", "--store", store, "--json"))["hits"]
            if h["session"] == session]
    assert hits and all(h["removed"] in ("clear", "quarantine") for h in hits
                        if SECRET in h["snippet"])
    text = dsh("search", "hunter2", "--store", store)
    assert all("REMOVED" in line or "QUARANTINED" in line
               for line in text.splitlines() if SECRET in line and line.startswith(session))


def test_sdk_clear_session_and_pop_item(tmp_path: Path) -> None:
    from dsh.adapters.openai_agents import DshSession

    store = f"sqlite:///{tmp_path / 'sessions.db'}"

    async def fill() -> None:
        for sid in ("cleared", "popped"):
            session = DshSession(sid, store)
            await session.add_items([{"role": "user", "content": f"my password is {SECRET}"},
                                     {"role": "assistant", "content": "noted"}])
            if sid == "cleared":
                await session.clear_session()
            else:
                await session.add_items([{"role": "user", "content": f"again: {SECRET}"}])
                assert (await session.pop_item() or {})["content"] == f"again: {SECRET}"
                await session.pop_item()
                await session.pop_item()
            assert await session.get_items() == []
            session.close()
    asyncio.run(fill())
    with ScriptedServer() as server:
        for sid in ("cleared", "popped"):
            server.add(Stream(openai_reply("hello")))
            run("openai-agents", store, sid, server.base_url + "/v1", "hi")
            _no_secret(server)
            _dsh_run_sends_no_secret(store, sid, server)
            _shown_removed(store, sid)


def langchain_cleared(store: str) -> Any:
    """Session ``lc`` told the secret through ``DshChatMessageHistory``, then ``clear()``ed;
    the history, still open."""
    from langchain_core.messages import AIMessage, HumanMessage

    from dsh.adapters.langchain import DshChatMessageHistory

    history = DshChatMessageHistory("lc", store)
    history.add_messages([HumanMessage(f"my password is {SECRET}"), AIMessage("noted")])
    history.clear()
    return history


def sdk_cleared(store: str, cleared: str, popped: str, batches: list[list[Any]]) -> None:
    """Two SDK sessions given ``batches`` (``add_items`` each): ``cleared`` then
    ``clear_session()``ed, ``popped`` with its last two items ``pop_item()``ed."""
    from dsh.adapters.openai_agents import DshSession

    async def fill() -> None:
        for sid in (cleared, popped):
            session = DshSession(sid, store)
            for items in batches:
                await session.add_items(items)
            if sid == cleared:
                await session.clear_session()
            else:
                await session.pop_item()
                await session.pop_item()
            session.close()
    asyncio.run(fill())


def pydantic_ai_cleared(store: str) -> None:
    """Session ``pa`` told the secret through ``DshMessageHistory``, then ``clear()``ed."""
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

    from dsh.adapters.pydantic_ai import DshMessageHistory

    with DshMessageHistory("pa", store) as history:
        history.record([ModelRequest(parts=[UserPromptPart(f"my password is {SECRET}")]),
                        ModelResponse(parts=[TextPart("noted")])])
        history.clear()
        assert history.load() == []


def test_langchain_history_clear(tmp_path: Path) -> None:
    from langchain_openai import ChatOpenAI

    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    history = langchain_cleared(store)
    history.add_user_message("hi")
    with ScriptedServer() as server:
        server.add(Stream(openai_reply("hello")))
        model = ChatOpenAI(model="gpt-test", base_url=server.base_url + "/v1", api_key="test",
                           streaming=True, max_retries=0)
        history.add_message(model.invoke(history.messages))
        history.close()
        _no_secret(server)
        _dsh_run_sends_no_secret(store, "lc", server)
    _shown_removed(store, "lc")


def langgraph_removed_and_deleted(store: str, server: ScriptedServer) -> None:
    """Threads ``removed`` (its secret messages dropped by ``RemoveMessage``) and ``deleted``
    (``delete_thread``), each told the secret first."""
    from langchain.agents import create_agent
    from langchain_core.messages import RemoveMessage
    from langchain_openai import ChatOpenAI

    from dsh.adapters.langgraph import DshSaver

    base = server.base_url + "/v1"
    server.add(Stream(openai_reply("noted")), Stream(openai_reply("noted")))
    run("langgraph", store, "removed", base, f"my password is {SECRET}")
    run("langgraph", store, "deleted", base, f"my password is {SECRET}")
    with DshSaver.from_url(store) as saver:
        agent = create_agent(ChatOpenAI(model="gpt-test", base_url=base, api_key="test"),
                             tools=[], checkpointer=saver)
        config: Any = {"configurable": {"thread_id": "removed"}}
        secret_ids = [m.id for m in agent.get_state(config).values["messages"]
                      if SECRET in str(m.content)]
        assert secret_ids
        agent.update_state(config, {"messages": [RemoveMessage(id=i) for i in secret_ids]})
        saver.delete_thread("deleted")


def test_langgraph_remove_message_and_delete_thread(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    with ScriptedServer() as server:
        base = server.base_url + "/v1"
        langgraph_removed_and_deleted(store, server)
        for sid in ("removed", "deleted"):
            server.add(Stream(openai_reply("hello")))
            run("langgraph", store, sid, base, "hi")
            _no_secret(server)
            _dsh_run_sends_no_secret(store, sid, server)
            _shown_removed(store, sid)


def test_pydantic_ai_history_clear(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    pydantic_ai_cleared(store)
    with ScriptedServer() as server:
        server.add(Stream(openai_reply("hello")))
        run("pydantic-ai", store, "pa", server.base_url + "/v1", "hi")
        _no_secret(server)
        _dsh_run_sends_no_secret(store, "pa", server)
    _shown_removed(store, "pa")


def test_langgraph_delete_thread_with_erase_on_delete_removes_the_bytes(tmp_path: Path) -> None:
    # erase_on_delete hands delete_thread to dsh.rights.erase
    # (docs/adapters.md#langgraph-and-langchain-agents)
    import dsh as dsh_api
    from dsh.adapters.langgraph import DshSaver
    from dsh.rights import store_log
    from tests.rights.test_redact import store_bytes

    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    with ScriptedServer() as server:
        base = server.base_url + "/v1"
        server.add(Stream(openai_reply("noted")))
        run("langgraph", store, "erased", base, f"my password is {SECRET}")
        with DshSaver.from_url(store) as saver:
            saver.copy_thread("erased", "erased-copy")
        assert SECRET.encode() in b"".join(raw for _, raw in store_bytes(store))
        with DshSaver.from_url(store, erase_on_delete=True) as saver:
            config: Any = {"configurable": {"thread_id": "erased"}}
            assert saver.get_tuple(config) is not None
            saver.delete_thread("erased")
            assert saver.get_tuple(config) is None
        assert SECRET.encode() not in b"".join(raw for _, raw in store_bytes(store))
        with dsh_api.open(store) as opened:
            [record] = store_log(opened).deletions()
            assert record["sessions"] == ["erased", "erased-copy"]
            assert record["reason"] == "LangGraph delete_thread"
        dsh("verify", "--all", "--store", store)
        server.add(Stream(openai_reply("hello")))
        run("langgraph", store, "erased", base, "hi")  # a later run starts afresh
        _no_secret(server)


def test_sdk_pop_of_a_tool_output_keeps_its_call_answered(tmp_path: Path) -> None:
    # pop_item of a function_call_output (the SDK allows it) takes the output off the model view
    # but keeps the call answered by a placeholder: before, the call was left without a result
    # and `dsh verify` reported UNANSWERED_TOOL_CALL (docs/adapters.md#cleared-means-cleared)
    from dsh.adapters.openai_agents import DshSession

    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    user = {"role": "user", "content": "deploy"}
    call = {"type": "function_call", "call_id": "c1", "name": "deploy", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": f"token {SECRET}"}

    async def fill() -> None:
        session = DshSession("popped-output", store)
        await session.add_items([user, call, output])
        assert await session.pop_item() == output
        assert await session.get_items() == [user, call]
        session.close()
    asyncio.run(fill())
    _shown_removed(store, "popped-output")  # dsh verify included
    with ScriptedServer() as server:
        _dsh_run_sends_no_secret(store, "popped-output", server)

    async def reopen() -> None:
        session = DshSession("popped-output", store)
        items = await session.get_items()
        assert items[:2] == [user, call]
        assert all(SECRET not in json.dumps(item) for item in items)
        while await session.get_items(1) != [call]:
            await session.pop_item()
        assert await session.pop_item() == call  # its placeholder result leaves with it
        assert await session.get_items() == [user]
        session.close()
    asyncio.run(reopen())
    dsh("verify", "popped-output", "--store", store)
    assert dsh_messages("popped-output", store) == [{"role": "user", "content": "deploy"}]


def test_pydantic_ai_conversation_delete_leaves_the_model_view(tmp_path: Path) -> None:
    # DshConversationStore.delete: before, the conversation stopped loading but `dsh messages`
    # and `dsh run --session` still sent its messages (docs/adapters.md#cleared-means-cleared)
    from pydantic_ai import Agent
    from pydantic_ai.conversation import Conversation
    from pydantic_ai.models.test import TestModel

    from dsh.adapters.pydantic_ai_store import DshConversationStore

    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    agent = Agent(TestModel())

    async def body() -> None:
        async with DshConversationStore(store) as conversations:
            fresh = Conversation(conversation_id="pa-del")
            first = await agent.run(f"my password is {SECRET}", conversation=fresh)
            await conversations.save(first)
            held = await conversations.load("pa-del")
            assert held is not None
            await conversations.save(await agent.run(f"again: {SECRET}", conversation=held))
            loaded = await conversations.load("pa-del")
            assert loaded is not None
            # a branch continues in pa-del~2; the line it left stays in pa-del
            kept = len(first.all_messages())
            branched = await conversations.branch("pa-del", at=kept,
                                                  expected_revision=loaded.revision)
            await conversations.save(await agent.run("other", conversation=branched))
            await conversations.delete("pa-del")
            assert await conversations.load("pa-del") is None
    asyncio.run(body())
    for line in ("pa-del", "pa-del~2"):
        assert SECRET not in json.dumps(dsh_messages(line, store))
        _shown_removed(store, line)
    with ScriptedServer() as server:
        _dsh_run_sends_no_secret(store, "pa-del", server)


def test_pydantic_ai_conversation_delete_clears_the_lines_it_moved_to_only(
        tmp_path: Path) -> None:
    # delete clears the sessions the conversation's pydantic-ai/moved events name. Probing
    # `<id>~2`, `<id>~3`, ... took a conversation that is merely named "pa-del~2" for a line of
    # "pa-del" and cleared it (the branch went on in pa-del~3), and a probe stops at the first
    # id missing, so a gap hid every line after it.
    from pydantic_ai import Agent
    from pydantic_ai.conversation import Conversation
    from pydantic_ai.models.test import TestModel

    from dsh.adapters.pydantic_ai_store import DshConversationStore

    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    agent = Agent(TestModel())

    async def body() -> None:
        async with DshConversationStore(store) as conversations:
            other = Conversation(conversation_id="pa-del~2")
            await conversations.save(await agent.run("another conversation", conversation=other))
            first = await agent.run(f"my password is {SECRET}",
                                    conversation=Conversation(conversation_id="pa-del"))
            await conversations.save(first)
            loaded = await conversations.load("pa-del")
            assert loaded is not None
            branched = await conversations.branch("pa-del", at=1,
                                                  expected_revision=loaded.revision)
            await conversations.save(await agent.run(f"again: {SECRET}", conversation=branched))
            await conversations.delete("pa-del")
            assert await conversations.load("pa-del") is None
            kept = await conversations.load("pa-del~2")
            assert kept is not None and len(kept.messages) == 2
    asyncio.run(body())
    ids = sorted(row["id"] for row in json.loads(dsh("ls", "--store", store, "--json")))
    assert ids == ["pa-del", "pa-del~2", "pa-del~3"]  # the branch went on in pa-del~3
    for line in ("pa-del", "pa-del~3"):
        assert SECRET not in json.dumps(dsh_messages(line, store))
        _shown_removed(store, line)
    assert "another conversation" in json.dumps(dsh_messages("pa-del~2", store))
    assert "REMOVED from the model view" not in dsh("show", "pa-del~2", "--store", store)


def test_the_adapters_markers_are_the_ones_the_listing_knows() -> None:
    # the listing (below the adapters) recognises a removal and a withheld result by these
    from dsh.adapters import _log
    from dsh.persistence import _listing

    assert (_log.REMOVAL_MODEL, _log.REMOVED_RESULT_TEXT) == (
        _listing.REMOVAL_MODEL, _listing.REMOVED_RESULT_TEXT)


def test_no_title_shows_what_a_clear_or_quarantine_removed(tmp_path: Path) -> None:
    # every framework's clear and a quarantine by a real dsh process, then every place that
    # titles a session: dsh ls (text, --json), dsh show's head, the viewer's listing, its
    # filter, a session page's <title>, <h1> and tree; the searches mark the removed hits
    # (docs/forgetting.md#what-titles-show, docs/stores.md#search)
    import re
    import urllib.parse

    from dsh.adapters.openai_agents import DshSession
    from tests.view import stores
    from tests.view.test_fresh import _get, _stop

    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    told = f"my password is {SECRET}"

    sdk_cleared(store, "sdk-cleared", "sdk-popped",
                [[{"role": "user", "content": told}, {"role": "assistant", "content": "noted"}]])
    langchain_cleared(store).close()
    pydantic_ai_cleared(store)
    session = DshSession("quarantined", store)
    asyncio.run(session.add_items([{"role": "user", "content": told},
                                   {"role": "assistant", "content": "noted"},
                                   {"role": "user", "content": "and deploy"}]))
    session.close()
    first = json.loads(dsh("show", "quarantined", "--store", store, "--json"))["items"]
    seq = next(i["seq"] for i in first if SECRET in json.dumps(i))
    dsh("quarantine", "quarantined", str(seq), "--store", store)
    sids = ("sdk-cleared", "sdk-popped", "lc", "pa", "quarantined")
    for sid in sids:
        shown = dsh("show", sid, "--store", store)
        assert SECRET in shown  # the log keeps the bytes, marked
        _no_title_holds_the_secret(store, sid, shown)
    rows = {r["id"]: r for r in json.loads(dsh("ls", "--store", store, "--json"))}
    assert rows["quarantined"]["title"] == "and deploy" and rows["lc"]["title"] is None
    server, base, token = stores.start_view(store)
    try:
        t = f"token={urllib.parse.quote(token)}"
        status, listing = _get(base, f"/?{t}")
        assert status == 200 and all(sid in listing for sid in sids)
        assert "hunter2" not in listing and "and deploy" in listing
        status, filtered = _get(base, f"/?q=hunter2&{t}")
        assert status == 200 and not any(f">{sid}<" in filtered for sid in sids)
        for sid in sids:
            for path in (f"/s/{sid}?{t}", f"/s/{sid}/tree?{t}"):
                status, page = _get(base, path)
                assert status == 200, path
                heads = re.findall(r"<title>.*?</title>|<h1.*?</h1>", page, re.S)
                assert heads and not any("hunter2" in h for h in heads), (path, heads)
            status, tree = _get(base, f"/s/{sid}/tree?{t}")
            assert "hunter2" not in tree
        for sid in sids:  # one session's search marks them too
            status, found = _get(base, f"/s/{sid}/search?q=hunter2&{t}")
            items = re.findall(r'<li class="hit">.*?</li>', found, re.S)
            assert status == 200 and items and all(
                "REMOVED from the model view" in i or "QUARANTINED" in i for i in items), items
        status, found = _get(base, f"/search?q=hunter2&{t}")
        assert status == 200
        items = re.findall(r'<li class="hit">.*?</li>', found, re.S)
        assert len(items) == len(sids) and all(
            "REMOVED from the model view" in i or "QUARANTINED" in i for i in items), items
    finally:
        _stop(server)

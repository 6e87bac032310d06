"""The front door: ``dsh.open(url)`` gives one ``dsh.Store``, and nothing appended is lost.

A script that ends without ``flush()`` once lost its appends (JSONL: nothing stored, SQLite:
only the header); these tests run real interpreters and read the store back cold. The rest
drive every method of the store over real files: sessions, reads, listing, tail, fork,
recorders, agents, and the deprecated second ways.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

import dsh
from dsh import ConfigError, SessionBusyError, create_user_message
from dsh.session import SessionStore

pytestmark = pytest.mark.no_speedups

PROMPT = {"content": [{"type": "text", "text": "Hi!"}], "source": {"kind": "user"}}


def _urls(tmp_path: Path) -> dict[str, str]:
    return {"sqlite": f"sqlite://{tmp_path / 'sessions.db'}",
            "jsonl": f"jsonl://{tmp_path / 'logs'}"}


def _stored_types(url: str, session_id: str) -> list[str]:
    with dsh.open(url) as store:
        return [e["type"] for e in store.read(session_id).stored_events]


def _turn(session: dsh.Session, turn: int) -> None:
    session.append("turn/start", {"turn": turn})
    session.append("step/start", {"turn": turn, "step": 1})
    session.append("user/message", create_user_message(PROMPT), surface_op="append")
    session.append("step/end", {"turn": turn, "step": 1})
    session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})


TURN_TYPES = ["turn/start", "step/start", "user/message", "step/end", "turn/end"]


@pytest.mark.parametrize("backend", ["sqlite", "jsonl"])
def test_script_ending_without_flush_or_close_keeps_every_append(tmp_path: Path,
                                                                backend: str) -> None:
    # No flush, no close, no with: the interpreter-exit drain writes the pending window.
    url = _urls(tmp_path)[backend]
    script = (
        "import dsh\n"
        f"store = dsh.open({url!r})\n"
        "s = store.session('demo')\n"
        "s.append('turn/start', {'turn': 1})\n"
        "s.append('step/start', {'turn': 1, 'step': 1})\n"
        "s.append('step/end', {'turn': 1, 'step': 1})\n"
        "s.append('turn/end', {'turn': 1, 'reason': {'kind': 'completed'}})\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert _stored_types(url, "demo") == ["turn/start", "step/start", "step/end", "turn/end"]


@pytest.mark.parametrize("backend", ["sqlite", "jsonl"])
def test_with_block_drains_and_session_resumes_or_creates(tmp_path: Path, backend: str) -> None:
    url = _urls(tmp_path)[backend]
    with dsh.open(url) as store:
        first = store.session("demo")
        assert store.session("demo") is first  # the live one, not a second copy
        _turn(first, 1)
    assert store.closed
    assert _stored_types(url, "demo") == TURN_TYPES
    with dsh.open(url) as store:
        again = store.session("demo")  # resumed from disk, marked by the end of its seed
        assert [e["type"] for e in again.events] == [*TURN_TYPES, "session/end-seed"]
        _turn(again, 2)
    assert _stored_types(url, "demo") == [*TURN_TYPES, "session/end-seed", *TURN_TYPES]


def test_close_releases_write_ownership_and_refuses_new_sessions(tmp_path: Path) -> None:
    url = _urls(tmp_path)["sqlite"]
    store = dsh.open(url)
    store.session("demo").append("turn/start", {"turn": 1})
    with dsh.open(url) as other, pytest.raises(SessionBusyError):
        other.session("demo")
    store.close()
    store.close()  # idempotent
    with pytest.raises(ConfigError) as refused:
        store.session("demo")
    assert refused.value.code == "STORE_CLOSED"
    with dsh.open(url) as other:
        resumed = other.session("demo")
        # the open turn was closed by the resume's crash repair, after the stored turn/start
        assert [e["type"] for e in resumed.events][:1] == ["turn/start"]
        assert resumed.events[-2]["type"] == "turn/end"


@pytest.mark.parametrize("backend", ["sqlite", "jsonl"])
def test_append_after_close_is_refused_and_the_stored_log_is_unchanged(tmp_path: Path,
                                                                       backend: str) -> None:
    # Found by a new user: the append returned an event that no store would ever hold.
    url = _urls(tmp_path)[backend]
    with dsh.open(url) as store:
        session = store.session("demo")
        _turn(session, 1)
    with pytest.raises(ConfigError) as caught:
        session.append("myapp/note", {"n": 1}, ignorable=True)
    assert caught.value.code == "STORE_CLOSED"
    assert "open the store again" in caught.value.message
    assert session.seq == len(TURN_TYPES)  # the refused event was not committed
    with dsh.open(url) as store:
        resumed = store.session("demo")
        assert [e["type"] for e in resumed.events] == [*TURN_TYPES, "session/end-seed"]
        resumed.append("myapp/note", {"n": 1}, ignorable=True)  # the resumed one appends
    assert _stored_types(url, "demo")[-1] == "myapp/note"


def test_append_after_dispose_from_a_persisted_store_is_refused(tmp_path: Path) -> None:
    with dsh.open(_urls(tmp_path)["sqlite"]) as store:
        session = store.session("demo")
        store.dispose(session)
        with pytest.raises(ConfigError) as caught:
            _turn(session, 1)
        assert caught.value.code == "SESSION_DISPOSED"
        assert store.session("demo").seq == 1  # resumed: nothing was stored, then its end-seed


@pytest.mark.parametrize(("given", "shown"), [("plain.db", "'sqlite:plain.db'"),
                                              ("./logs/", "'jsonl:./logs'")])
def test_a_plain_path_is_refused_with_the_url_to_write_instead(given: str, shown: str) -> None:
    with pytest.raises(ConfigError, match="has no scheme") as caught:
        dsh.open(given)
    assert f"(for this path: {shown};" in caught.value.message


# -- one object: reads, listing, fork, tail, recorders and agents ---------------------------

CONFIG = {"provider": "scripted", "model": "demo"}


def _stored(url: str, session_id: str, turns: int, *, open_turn: bool = False) -> None:
    with dsh.open(url) as store:
        session = store.session(session_id)
        for turn in range(1, turns + 1):
            _turn(session, turn)
        if open_turn:
            session.append("turn/start", {"turn": turns + 1})


@pytest.mark.parametrize("backend", ["sqlite", "jsonl"])
def test_read_inspect_exists_and_list_write_nothing(tmp_path: Path, backend: str) -> None:
    url = _urls(tmp_path)[backend]
    _stored(url, "a", 1)
    _stored(url, "b", 2, open_turn=True)
    with dsh.open(url) as store:
        assert store.exists("a") and not store.exists("nope")
        read = store.read("b")
        assert len(read.stored_events) == 2 * len(TURN_TYPES) + 1
        assert [e["type"] for e in read.closers] == ["turn/end"]  # in memory only
        assert store.inspect("b").events == read.events
        listed = store.list()
        assert [(e.id, e.events, e.turns) for e in sorted(listed, key=lambda e: e.id)] == [
            ("a", len(TURN_TYPES), 1), ("b", 2 * len(TURN_TYPES) + 1, 3)]
        assert not store.sessions.list()  # nothing was made live
    assert _stored_types(url, "b")[-1] == "turn/start"  # the open turn is still open on disk


def test_list_raises_for_an_unreadable_log_or_collects_it(tmp_path: Path) -> None:
    url = _urls(tmp_path)["jsonl"]
    _stored(url, "good", 1)
    _stored(url, "bad", 2)
    (log,) = (tmp_path / "logs").rglob("bad/session.jsonl")
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join([*lines[:3], b'{"type": broken\n', *lines[4:]]))
    with dsh.open(url) as store:
        with pytest.raises(dsh.LogCorruptError):
            store.list()
        errors: list[dsh.DshError] = []
        assert [e.id for e in store.list(errors=errors)] == ["good"]
        assert [e.where["session_id"] for e in errors] == ["bad"]


@pytest.mark.parametrize("backend", ["sqlite", "jsonl"])
def test_fork_branches_a_stored_session_and_a_live_one(tmp_path: Path, backend: str) -> None:
    url = _urls(tmp_path)[backend]
    _stored(url, "parent", 2)
    with dsh.open(url) as store:
        assert store.fork("parent", 4) == "parent-fork-1"  # stored: the parent stays unlocked
        live = store.session("parent")
        child = store.fork("parent", len(TURN_TYPES) + 1, child_id="branch")  # inside turn 2
        assert store.sessions.get("branch") is not None
        with pytest.raises(dsh.SessionForkError) as taken:
            store.fork("parent", child_id="branch")
        assert taken.value.code == "SESSION_ALREADY_EXISTS"
        assert live.seq == 2 * len(TURN_TYPES) + 1  # its end-seed only: the fork wrote nothing
    assert child == "branch"
    with dsh.open(url) as store:
        first = store.read("parent-fork-1")
        assert first.header["parentSession"] == "parent" and first.header["seedLength"] == 5
        branch = [e["type"] for e in store.read("branch").stored_events]
        assert branch[len(TURN_TYPES) + 2:] == ["session/end-seed", "step/end", "turn/end"]


def test_tail_follows_commits_of_another_store_without_gap(tmp_path: Path) -> None:
    url = _urls(tmp_path)["jsonl"]
    _stored(url, "s", 1)

    async def follow() -> list[int]:
        seen: list[int] = []
        async with dsh.open(url) as writer, dsh.open(url) as reader:
            session = writer.session("s")  # resumed: seq 5 is its end-seed
            async for event in reader.tail("s", 2, poll_ms=5):
                seen.append(event["seq"])
                if event["seq"] == len(TURN_TYPES) - 1:
                    _turn(session, 2)
                    await writer.aflush(session)
                if event["seq"] == 2 * len(TURN_TYPES):
                    break
        return seen

    assert asyncio.run(follow()) == list(range(2, 2 * len(TURN_TYPES) + 1))


def test_recorder_is_bound_to_the_store_and_each_turn_is_durable(tmp_path: Path) -> None:
    url = _urls(tmp_path)["sqlite"]
    with dsh.open(url) as store:
        recorder = store.recorder("demo", header={"cwd": "/work"})
        assert recorder.store is store.sessions
        with recorder.turn() as turn, turn.step() as step:
            step.user_message("Hi!")
            step.request(CONFIG)
            step.assistant("Hello.")
        with dsh.open(url) as other:  # flushed when the turn ended, before the block ends
            stored = other.read("demo")
    assert stored.header["cwd"] == "/work"
    assert [e["type"] for e in stored.stored_events][-2:] == ["step/end", "turn/end"]


def test_agent_creates_resumes_and_takes_a_live_session(tmp_path: Path) -> None:
    from dsh.agent import ScriptedProvider, ScriptedReply

    url = _urls(tmp_path)["sqlite"]

    async def run(text: str) -> tuple[int, str, bool]:
        async with dsh.open(url) as store:
            agent = await store.agent("a", provider=ScriptedProvider(
                [ScriptedReply(text=text)]), config=CONFIG, system="Be brief.")
            result = await agent.run("Hello?")
            again = await store.agent("a", provider=ScriptedProvider([]), config=CONFIG)
            return result.turn, result.text, again.session is agent.session

    assert asyncio.run(run("first")) == (1, "first", True)
    assert asyncio.run(run("second")) == (2, "second", True)
    with dsh.open(url) as store:
        assert [e["type"] for e in store.read("a").stored_events].count("turn/end") == 2


def test_agent_without_an_id_starts_a_new_session(tmp_path: Path) -> None:
    from dsh.agent import ScriptedProvider, ScriptedReply

    async def run() -> str:
        async with dsh.open(_urls(tmp_path)["jsonl"]) as store:
            agent = await store.agent(provider=ScriptedProvider([ScriptedReply(text="ok")]),
                                      config=CONFIG)
            await agent.run("Hi")
            return agent.session.id

    first, second = asyncio.run(run()), asyncio.run(run())
    assert first != second and len(first) == 36


def test_flush_of_one_or_every_session_and_of_an_id_not_live(tmp_path: Path) -> None:
    url = _urls(tmp_path)["jsonl"]
    with dsh.open(url, write_behind=dsh.WriteBehind(batch_window_ms=60_000)) as store:
        a, b = store.session("a"), store.session("b")
        _turn(a, 1)
        _turn(b, 1)
        store.flush("a")
        with dsh.open(url) as other:
            assert len(other.read("a").stored_events) == len(TURN_TYPES)
            with pytest.raises(dsh.SessionNotFoundError):
                other.read("b")  # nothing of b written yet: the window is a minute
        store.flush()
        with dsh.open(url) as other:
            assert len(other.read("b").stored_events) == len(TURN_TYPES)
        with pytest.raises(dsh.SessionNotFoundError) as not_live:
            store.flush("c")
        assert not_live.value.code == "SESSION_NOT_LIVE"
        assert repr(store) == f"<dsh.Store {url!r}>"
    assert repr(store) == f"<dsh.Store {url!r} closed>"


def test_the_second_ways_still_work_for_a_release_and_name_the_front_door(
        tmp_path: Path) -> None:
    from dsh.agent import Agent, Recorder, ScriptedProvider

    url = _urls(tmp_path)["sqlite"]
    with pytest.warns(DeprecationWarning, match=r"use dsh\.open\(url\)"):
        core = dsh.SessionStore
    assert core is SessionStore
    with dsh.open(url) as store:
        with pytest.warns(DeprecationWarning, match=r"use store\.recorder\(session_id\)"):
            recorder = Recorder(store.session("r"), store=store)  # type: ignore[arg-type]
        assert recorder.store is store.sessions
        with pytest.warns(DeprecationWarning, match=r"use await store\.agent\("):
            agent = Agent.create(store, ScriptedProvider([]), session_id="g",  # type: ignore[arg-type]
                                 config=CONFIG)
        assert store.sessions.get("g") is agent.session


def test_open_store_is_a_deprecated_alias_naming_dsh_open(tmp_path: Path) -> None:
    from dsh.persistence import Persistence, open_store

    with pytest.warns(DeprecationWarning, match=r"use dsh\.open\(url\)") as caught:
        facade = open_store(_urls(tmp_path)["sqlite"])
    assert isinstance(facade, Persistence) and caught[0].filename == __file__
    facade.close()
    with pytest.warns(DeprecationWarning, match=r"use dsh\.open\(url\)"):
        dsh.open_store("memory:").close()

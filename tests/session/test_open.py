"""``dsh.open(url)`` and ``SessionStore`` as a context manager: nothing appended is lost.

Issue 9 item 3: a script that ends without ``flush()`` lost its appends (JSONL: nothing stored,
SQLite: only the header). These tests run real interpreters and read the store back cold.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import dsh
from dsh import ConfigError, SessionBusyError, create_user_message, open_store

PROMPT = {"content": [{"type": "text", "text": "Hi!"}], "source": {"kind": "user"}}


def _urls(tmp_path: Path) -> dict[str, str]:
    return {"sqlite": f"sqlite://{tmp_path / 'sessions.db'}",
            "jsonl": f"jsonl://{tmp_path / 'logs'}"}


def _stored_types(url: str, session_id: str) -> list[str]:
    with open_store(url) as persistence, persistence.open(session_id, "read") as handle:
        return [e["type"] for e in handle.read(0).events]


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


def test_a_detached_in_memory_session_keeps_working() -> None:
    store = dsh.SessionStore()
    session = store.create("demo")
    store.dispose(session)
    _turn(session, 1)
    assert session.seq == len(TURN_TYPES)


@pytest.mark.parametrize(("given", "shown"), [("plain.db", "'sqlite:plain.db'"),
                                              ("./logs/", "'jsonl:./logs'")])
def test_a_plain_path_is_refused_with_the_url_to_write_instead(given: str, shown: str) -> None:
    with pytest.raises(ConfigError, match="has no scheme") as caught:
        dsh.open(given)
    assert f"(for this path: {shown};" in caught.value.message

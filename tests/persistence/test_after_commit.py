"""Commit means committed: nothing after a durable commit fails the flush
(docs/rules.md#commit-means-committed).

The campaign's reproducers: a lone surrogate in a session title made the JSONL listing journal
raise after the batch was durable (the flush failed, the write-behind re-sent the batch, every
later flush failed with ``SEQ_MISMATCH`` and ``dsh ls`` failed for the whole store); on SQLite
a seal step raising anything but ``OSError`` after ``COMMIT`` did the same. Then a failure of
every kind is injected into each post-commit step on each backend that has it: every flush
succeeds, each failure reaches the store's observers, nothing is stored twice, and a fresh
read gives every event (the seal repaired: the full read checks every sealed byte).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh.persistence import _chain
from dsh.persistence import _restore_point as rp
from dsh.persistence._after_commit import AfterCommitFailure
from dsh.persistence.jsonl import _backend as jsonl_backend
from dsh.persistence.sqlite import _backend as sqlite_backend
from dsh.persistence.sqlite import _restore_point as sqlite_rp
from dsh.session import RestoreFold
from tests.cli.test_cli import Dsh

SURROGATE = "bad \ud800 title"


class Watcher:
    """A store observer that keeps the post-commit failures it is told about."""

    def __init__(self) -> None:
        self.failures: list[AfterCommitFailure] = []

    def on_after_commit_failure(self, session: Any, failure: AfterCommitFailure) -> None:
        self.failures.append(failure)


def user(text: str) -> dict[str, Any]:
    return {"id": f"u-{text}", "role": "user", "source": {"kind": "user"},
            "content": [{"type": "text", "text": text}]}


def test_surrogate_title_jsonl_flushes_and_lists(tmp_path: Path) -> None:
    url = f"jsonl://{tmp_path}/store"
    with dsh.open(url) as store:
        watcher = Watcher()
        store.sessions.observe(watcher)
        session = store.session("s1")
        session.append("session/title", {"title": SURROGATE})
        store.flush(session)
        session.append("session/title", {"title": "second \udfff"})
        store.flush(session)  # main: SEQ_MISMATCH, the first batch was sent again
        session.append("user/message", user("hi"), surface_op="append")
        store.flush(session)
    assert watcher.failures == []  # the journal now carries the surrogate itself
    with dsh.open(url) as store:
        events = store.read("s1").events
        assert [e["type"] for e in events] == ["session/title", "session/title", "user/message"]
        assert events[1]["data"]["title"] == "second \udfff"
        [entry] = store.list()
        assert entry.title == "second \udfff" and entry.events == 3
    run = Dsh(tmp_path)("ls", "--store", url)  # main: error[BUG] for the whole store
    assert "second \\udfff" in run.stdout and "error" not in run.stderr


class Boom(Exception):
    """Not an OSError: the kind of failure the handles used to let out after a commit."""


def _raise(*args: Any, **kwargs: Any) -> Any:
    raise Boom("injected after the commit")


# (backend, step) -> the attributes replaced by a raiser while the session is written
INJECT: dict[tuple[str, str], list[tuple[Any, str]]] = {
    ("jsonl", "seal"): [(jsonl_backend, "append_batch_to"), (jsonl_backend, "reset_seal")],
    ("jsonl", "seal-crc"): [(jsonl_backend, "crc_of")],
    ("jsonl", "seal-chain"): [(_chain, "new_record"), (jsonl_backend, "publish_head")],
    ("jsonl", "listing"): [(jsonl_backend, "note_flushed")],
    ("jsonl", "restore-point"): [(rp, "encode_restore_point")],
    ("jsonl", "restore-fold"): [(RestoreFold, "feed")],
    ("jsonl+zstd", "seal"): [(jsonl_backend, "append_chain_to"), (jsonl_backend, "reset_seal")],
    ("jsonl+zstd", "listing"): [(jsonl_backend, "note_flushed")],
    ("jsonl+zstd", "restore-point"): [(rp, "encode_restore_point")],
    # the SQLite seal: its records and bytes built in one pass (batch_seal), then one write
    ("sqlite", "seal"): [(sqlite_backend, "write_all"), (sqlite_backend, "reset_seal")],
    ("sqlite", "seal-crc"): [(sqlite_backend, "batch_seal")],
    ("sqlite", "seal-chain"): [(_chain, "new_record"), (sqlite_backend, "publish_head")],
    ("sqlite", "anchor"): [(sqlite_rp, "last_row_digest")],
    ("sqlite", "restore-point"): [(rp, "encode_restore_point")],
    ("sqlite", "restore-fold"): [(RestoreFold, "feed")],
}
URLS = {"jsonl": "jsonl://{root}/store", "jsonl+zstd": "jsonl+zstd://{root}/store",
        "sqlite": "sqlite://{root}/store.db"}


@pytest.mark.parametrize(("backend", "step"), sorted(INJECT))
def test_failure_after_commit_never_fails_the_flush(tmp_path: Path, backend: str, step: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rp, "RESTORE_POINT_EVERY_EVENTS", 2)  # a restore point at each flush
    url = URLS[backend].format(root=tmp_path)
    with dsh.open(url) as store:
        store.session("s1")  # created and stored before the faults
        store.flush(store.sessions.get("s1"))  # type: ignore[arg-type]
    watcher = Watcher()
    with dsh.open(url) as store:
        store.sessions.observe(watcher)
        session = store.session("s1")
        with monkeypatch.context() as faults:
            for owner, name in INJECT[backend, step]:
                faults.setattr(owner, name, _raise)
            for n in range(4):
                session.append("user/message", user(f"m{n}"), surface_op="append")
                session.append("user/message", user(f"n{n}"), surface_op="append")
                store.flush(session)  # never raises: the batch is durable
        session.append("user/message", user("after"), surface_op="append")
        store.flush(session)  # the faults are gone: the next flush repairs
        expected = [e["data"] for e in session.events]
    want = {"seal-crc": "seal", "seal-chain": "seal"}.get(step, step)
    assert watcher.failures, "the failure was not reported to the observers"
    steps = {f.step for f in watcher.failures}
    if step == "seal":  # the restore point's digest goes into the seal too, which fails
        steps.discard("restore-point")
    assert steps == {want}
    assert all(isinstance(f.error, Boom) and f.session_id == "s1" and f.repair
               for f in watcher.failures)
    with dsh.open(url) as store:
        read = store.read("s1")  # checks every seal record over the log
        assert [e["data"] for e in read.events] == expected  # nothing twice, nothing lost
        assert [e["seq"] for e in read.events] == list(range(len(expected)))
        resumed = store.session("s1")
        assert [e["data"] for e in resumed.events[:len(expected)]] == expected


def test_sqlite_seal_failure_after_commit_is_repaired(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The SQLite reproducer: the seal step raised a non-OSError after COMMIT."""
    url = f"sqlite://{tmp_path}/store.db"
    with dsh.open(url) as store:
        session = store.session("s1")
        session.append("user/message", user("a"), surface_op="append")
        store.flush(session)
        with monkeypatch.context() as faults:
            faults.setattr(sqlite_backend, "write_all", _raise)
            faults.setattr(sqlite_backend, "reset_seal", _raise)
            session.append("user/message", user("b"), surface_op="append")
            store.flush(session)  # main: the flush raised and the retry hit SEQ_MISMATCH
            session.append("user/message", user("c"), surface_op="append")
            store.flush(session)
        session.append("user/message", user("d"), surface_op="append")
        store.flush(session)
    seal = Path(f"{tmp_path}/store.db.dsh-seals")
    assert any(seal.iterdir())
    with dsh.open(url) as store:
        texts = [e["data"]["content"][0]["text"] for e in store.read("s1").events]
    assert texts == ["a", "b", "c", "d"]


def test_zstd_chain_sidecar_failures_say_their_repair(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The Zstandard chain step runs through AfterCommit.run, worded as the raw seal's."""
    url = f"jsonl+zstd://{tmp_path}/store"
    watcher = Watcher()
    with dsh.open(url) as store:
        store.sessions.observe(watcher)
        session = store.session("s1")
        session.append("user/message", user("a"), surface_op="append")
        store.flush(session)
        [sidecar] = (tmp_path / "store").rglob("*.seal")
        with monkeypatch.context() as faults:
            faults.setattr(jsonl_backend, "append_chain_to", _raise)
            session.append("user/message", user("b"), surface_op="append")
            store.flush(session)  # never raises: the frames are durable
        session.append("user/message", user("c"), surface_op="append")
        store.flush(session)  # rewrites the sidecar whole
    [failure] = watcher.failures
    assert (failure.step, type(failure.error)) == ("seal", Boom)
    assert failure.repair == f"the next flush rewrites the chain sidecar {sidecar} whole"
    sidecar.write_bytes(b"not a seal at all" * 8)  # damaged: read at the next first flush
    watcher = Watcher()
    with dsh.open(url) as store:
        store.sessions.observe(watcher)
        session = store.session("s1")
        session.append("user/message", user("d"), surface_op="append")
        store.flush(session)  # the frames are durable, the damaged sidecar is not written over
    [failure] = watcher.failures
    assert failure.step == "seal" and isinstance(failure.error, dsh.LogCorruptError)
    assert failure.repair == (f"the chain sidecar {sidecar} is damaged: move it aside (a new "
                              f"chain starts) or restore it")
    assert sidecar.read_bytes() == b"not a seal at all" * 8

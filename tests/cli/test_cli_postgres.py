"""The `dsh` command on PostgreSQL stores: convert between every backend, the session commands,
`events --follow`, `migrate`. Skipped, saying so, only when no server answers."""

from __future__ import annotations

import contextlib
import itertools
import json
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsh import open as dsh_open
from dsh.testing import make
from dsh.testing._stores import postgres_unreachable, temporary_postgres_url
from tests.cli.test_cli import Dsh, interrupted_log, jsonl_store, long_log, stored_events

_REASON = postgres_unreachable()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"SKIPPED LOUDLY: {_REASON}")


@pytest.fixture
def pg() -> Iterator[str]:
    with temporary_postgres_url() as url:
        yield url


def _all_events(url: str) -> dict[str, list[object]]:
    with dsh_open(url) as store:
        ids = sorted(str(h["id"]) for h in store.persistence.list_headers())
    return {sid: stored_events(url, sid) for sid in ids}


def test_convert_through_every_backend_keeps_every_event(tmp_path: Path, pg: str) -> None:
    dsh = Dsh(tmp_path)
    source = f"sqlite://{tmp_path}/source.db"
    dsh("import", "--examples", "--store", source)
    original = _all_events(source)
    assert len(original) >= 8 and sum(len(v) for v in original.values()) > 100
    with temporary_postgres_url() as pg_again:
        chain = [source, pg, f"jsonl+zstd://{tmp_path}/z", f"jsonl://{tmp_path}/raw", pg_again,
                 f"sqlite://{tmp_path}/back.db"]
        for src, dst in itertools.pairwise(chain):
            outcome = dsh.json("convert", "--from", src, "--to", dst, "--json")
            assert outcome["copied"] == len(original)
            assert outcome["events"] == sum(len(v) for v in original.values())
        assert _all_events(pg) == original
        assert _all_events(pg_again) == original
    assert _all_events(chain[-1]) == original


def test_session_commands_work_on_postgresql(tmp_path: Path, pg: str) -> None:
    dsh = Dsh(tmp_path)
    files = jsonl_store(tmp_path / "files", {"crashed": interrupted_log(), "long": long_log()})
    dsh("convert", "--from", files, "--to", pg)
    rows = {r["id"]: r for r in dsh.json("ls", "--store", pg, "--json")}
    assert set(rows) == {"crashed", "long"} and rows["long"]["events"] == 18
    assert "turn 1 is still open" in dsh("show", "crashed", "--store", pg).stdout
    resumed = dsh.json("resume", "crashed", "--store", pg, "--json")
    assert [c["type"] for c in resumed["closers"]] == ["tool/result", "step/end", "turn/end"]
    assert [e["seq"] for e in stored_events(pg, "crashed")] == list(range(8))
    dsh("verify", "crashed", "--store", pg)
    fork = dsh.json("fork", "long", "--at", "5", "--as", "child", "--store", pg, "--json")
    assert fork["seedLength"] == 6
    assert stored_events(pg, "child")[:6] == stored_events(pg, "long")[:6]
    compacted = dsh.json("compact", "long", "--store", pg, "--json")
    assert compacted["shadowedSeqs"] == [2, 3, 8, 9, 14]
    assert [e["type"] for e in stored_events(pg, "long")[18:]] == [
        "session/end-seed", "compaction/start", "compaction/summary", "user/message",
        "compaction/end"]
    dsh("verify", "long", "--store", pg)
    assert len(dsh.event_lines("long", "--store", pg)) == 23


def test_events_follow_prints_new_commits_as_they_land(tmp_path: Path, pg: str) -> None:
    dsh = Dsh(tmp_path)
    store = dsh_open(pg).persistence
    store.create({"version": 0, "id": "live", "createdAt": 1})
    handle = store.open("live", "write")
    try:
        handle.append([make("session/title", 0, {"title": "zero"}),
                       make("session/title", 1, {"title": "one"})])
        proc = subprocess.Popen([sys.executable, "-m", "dsh.cli", "events", "live", "--follow",
                                 "--from", "1", "--store", pg], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=dsh.env)
        assert proc.stdout is not None
        # A reader thread, not select(): one readline may buffer several lines, and select on the
        # pipe would then wait for bytes that were already read.
        lines: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout],  # type: ignore[union-attr]
                                  daemon=True)
        reader.start()

        def line() -> dict[str, object]:
            try:
                text = lines.get(timeout=60)  # hang guard only
            except queue.Empty:
                raise AssertionError("dsh events --follow printed nothing") from None
            out: dict[str, object] = json.loads(text)
            return out

        try:
            assert line()["seq"] == 1
            for seq in (2, 3, 4):
                handle.append([make("session/title", seq, {"title": f"n{seq}"})])
                got = line()
                assert got["seq"] == seq and got["data"] == {"title": f"n{seq}"}
            handle.append([make("session/title", 5, {"title": "a"}),
                           make("session/title", 6, {"title": "b"})])
            assert [line()["seq"], line()["seq"]] == [5, 6]
        finally:
            proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):  # asserted below, pipes closed
                proc.wait(60)
            proc.kill()  # no-op when it has exited; never leave it running
            proc.wait()
            reader.join(10)  # the pipe is at EOF now; join before closing it under the thread
            proc.stdout.close()
            assert proc.stderr is not None
            err = proc.stderr.read()
            proc.stderr.close()
        assert proc.returncode == 130, f"exit {proc.returncode} after SIGINT; stderr: {err}"
        assert err == ""  # Ctrl-C is how following ends: not an error
    finally:
        handle.close()
        store.close()


def test_init_tells_an_existing_empty_postgresql_store_from_a_new_one(
        tmp_path: Path, pg: str) -> None:
    # fresh-user walk: 'dsh init --store postgresql://...' said "created an empty store" every
    # time the store held no session, also after 'dsh migrate' or an earlier init had made it
    dsh = Dsh(tmp_path)
    assert dsh("init", "--store", pg).stdout == f"created an empty store at {pg}\n"
    assert dsh("init", "--store", pg).stdout == (f"{pg} already exists (0 sessions); left as "
                                                 "it is\n")
    assert dsh.json("init", "--store", pg, "--json") == {"store": pg, "created": False,
                                                         "sessions": 0}
    with temporary_postgres_url() as migrated:
        dsh("migrate", "--store", migrated)
        assert dsh.json("init", "--store", migrated, "--json")["created"] is False
    dsh("import", "--examples", "--store", pg)
    assert dsh("init", "--store", pg).stdout == (f"{pg} already exists (12 sessions); left as "
                                                 "it is\n")


def test_migrate_on_a_file_store_has_nothing_to_do(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    dsh("init", "--store", f"sqlite://{tmp_path}/x.db")
    outcome = dsh.json("migrate", "--store", f"sqlite://{tmp_path}/x.db", "--json")
    assert outcome["migrated"] is False and outcome["schemaVersion"] == 17


@pytest.mark.parametrize("store", ["sqlite://{}/typo.db", "jsonl://{}/typo", "{}/typo.db"])
def test_migrate_refuses_a_file_store_that_does_not_exist_and_creates_nothing(
        tmp_path: Path, store: str) -> None:
    # before: 'dsh migrate --store typo.db' created an empty store at the mistyped path
    dsh = Dsh(tmp_path)
    url = store.format(tmp_path)
    proc = dsh("migrate", "--store", url, "--json", check=1)
    assert json.loads(proc.stderr)["code"] == "STORE_NOT_FOUND"
    assert proc.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["user-home"]

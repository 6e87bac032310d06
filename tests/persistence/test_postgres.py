"""PostgreSQL: fenced writers across real processes, migrations, connection loss.

Every test runs against the server at ``$DSH_TEST_POSTGRES_URL`` (default 127.0.0.1:5432) in a
throw-away schema; the module is skipped, saying so, only when no server answers.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from dsh._errors import (
    ConfigError,
    LeaseLostError,
    PersistenceError,
    SessionBusyError,
    SessionFormatUnsupportedError,
    SessionNotFoundError,
)
from dsh.persistence import Persistence, open_backend
from dsh.persistence._legacy import stored_prescan
from dsh.persistence.postgres._backend import PostgresBackend, parse_postgres_url
from dsh.persistence.postgres._schema import MIGRATIONS, SCHEMA_VERSION
from dsh.persistence.sqlite import _schema as row_schema
from dsh.persistence.sqlite._schema import c_decode_rows
from dsh.session import KNOWN_EVENT_TYPES, Event
from dsh.testing import LogBuilder, header, make
from dsh.testing._stores import postgres_base_url, postgres_unreachable, temporary_postgres_url

_REASON = postgres_unreachable()
pytestmark = pytest.mark.skipif(_REASON is not None,
                                reason=f"SKIPPED LOUDLY: {_REASON}")

WORKER = Path(__file__).with_name("_pg_worker.py")
ANSWER_WAIT_S = 120  # a hang guard for a stuck child, not a timing assertion


@pytest.fixture
def pg_url() -> Iterator[str]:
    with temporary_postgres_url(lease_ms=600) as url:
        yield url


@pytest.fixture
def backend(pg_url: str) -> Iterator[Any]:
    """A backend on ``pg_url`` holding a created session ``s`` with no events; closed after."""
    opened = open_backend(pg_url)
    try:
        opened.create(header("s"))
        yield opened
    finally:
        opened.close()


def _schema(url: str) -> str:
    return parse_postgres_url(url)[1]["schema"]


def _sql(query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(postgres_base_url(), autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


class Worker:
    """One `_pg_worker.py` process: a host with its own connections and lease."""

    def __init__(self, url: str, session_id: str = "s") -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.proc = subprocess.Popen([sys.executable, str(WORKER), url, session_id],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env)
        self.pid = self.proc.pid

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], ANSWER_WAIT_S)
        assert ready, "worker did not answer"
        result: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return result

    def __call__(self, line: str) -> dict[str, Any]:
        self.send(line)
        return self.answer()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop()


def _wait_until_lease_expired(url: str, session_id: str = "s") -> None:
    # Waits on the database clock; the deadline only guards against a hang.
    deadline = time.monotonic() + ANSWER_WAIT_S
    while time.monotonic() < deadline:
        rows = _sql(f'SELECT lease_expires_at <= clock_timestamp() FROM "{_schema(url)}".sessions '
                    "WHERE id = %s", session_id)
        if rows and rows[0][0]:
            return
        time.sleep(0.05)
    raise AssertionError("lease never expired")


def _stored(url: str, session_id: str = "s") -> list[Any]:
    backend = open_backend(url)
    try:
        with backend.open(session_id) as handle:
            return list(handle.read().events)
    finally:
        backend.close()


def _created(url: str, session_id: str = "s") -> None:
    backend = open_backend(url)
    try:
        backend.create(header(session_id))
    finally:
        backend.close()


def test_sigstopped_holder_past_its_lease_is_refused_after_takeover(
        pg_url: str, workers: list[Worker]) -> None:
    _created(pg_url)
    first = Worker(pg_url)
    workers.append(first)
    assert first("open")["epoch"] == 1
    assert first("append 3")["seqs"] == [0, 1, 2]
    os.kill(first.pid, signal.SIGSTOP)
    _wait_until_lease_expired(pg_url)
    second = Worker(pg_url)
    workers.append(second)
    assert second("open")["epoch"] == 2
    assert second("append 2")["seqs"] == [3, 4]
    os.kill(first.pid, signal.SIGCONT)
    refused = first("append 1")
    assert refused["ok"] is False
    assert refused["error"] == "LeaseLostError" and refused["code"] == "LEASE_LOST"
    assert refused["where"]["epoch"] == 2 and refused["where"]["pid"] == second.pid
    events = _stored(pg_url)
    assert [e["seq"] for e in events] == [0, 1, 2, 3, 4]
    owners = [e["data"]["title"].split(":")[0] for e in events]
    assert owners == [str(first.pid)] * 3 + [str(second.pid)] * 2
    assert second("append 1")["seqs"] == [5]


_DISPOSED_LOSER = """
import json, logging, sys, threading
import dsh
kept = []
class Keep(logging.Handler):
    def emit(self, record):
        kept.append([record.name, record.levelname, record.getMessage(),
                     record.exc_info is not None, record.thread == threading.main_thread().ident])
logging.basicConfig(level=logging.WARNING)  # what a user sees on stderr
logging.getLogger().addHandler(Keep())
store = dsh.open(sys.argv[1])
session = store.session("s")
session.append("session/title", {"title": "before the takeover"})
store.flush(session)
print("ready", flush=True)
sys.stdin.readline()
session.append("session/title", {"title": "after it"})
before = len(kept)
store.dispose(session)
during = kept[before:]
try:
    store.close()
    closed = None
except dsh.WriteFailedError as exc:
    closed = type(exc.__cause__).__name__
print(json.dumps({"during": during, "all": kept, "closed": closed}), flush=True)
"""


def test_a_writer_disposed_after_a_takeover_warns_once_without_a_traceback(
        pg_url: str) -> None:
    # docs/errors.md#leaselosterror: the loser's final write at dispose is refused with
    # LeaseLostError; before, the on_disposed observer path logged it with two tracebacks
    # (ERROR 'retirement ... failed' and 'on_disposed observer ... failed')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    loser = subprocess.Popen([sys.executable, "-c", _DISPOSED_LOSER, pg_url],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert loser.stdout is not None and loser.stdout.readline() == "ready\n"
        os.kill(loser.pid, signal.SIGSTOP)
        _wait_until_lease_expired(pg_url)
        backend = open_backend(pg_url)
        try:
            with backend.open("s", "write") as winner:
                assert winner.epoch == 2
                os.kill(loser.pid, signal.SIGCONT)
                out, err = loser.communicate("go\n", timeout=ANSWER_WAIT_S)
        finally:
            backend.close()
    finally:
        if loser.poll() is None:
            os.kill(loser.pid, signal.SIGCONT)
            loser.kill()
            loser.communicate()
    assert loser.returncode == 0, err
    report = json.loads(out)
    # the dispose (on the main thread) says it once: the session, the new holder, no traceback
    said = [r for r in report["during"] if r[4]]
    assert [(name, level) for name, level, *_ in said] == [("dsh.persistence", "WARNING")], said
    message = said[0][2]
    assert message.startswith("session 's': its final write at dispose was refused (LEASE_LOST), "
                              f"another process (pid {os.getpid()} on ") and "epoch 2" in message
    assert not any(exc_info for *_, exc_info, _main in report["all"]), report["all"]
    assert "Traceback" not in err and "ERROR" not in err, err
    assert report["closed"] == "LeaseLostError"  # close still says the last event was not written
    assert [e["data"]["title"] for e in _stored(pg_url)] == ["before the takeover"]


def _holding(url: str, workers: list[Worker]) -> Worker:
    """A worker process holding the lease of a fresh session ``s`` at epoch 1."""
    _created(url)
    holder = Worker(url)
    workers.append(holder)
    assert holder("open")["epoch"] == 1
    return holder


def test_killed_holder_on_this_host_is_taken_over_at_once(
        workers: list[Worker], caplog: pytest.LogCaptureFixture) -> None:
    # docs/stores.md#takeover: a lease held by a process dead on this host does not make the
    # next writer wait for its expiry (a 60 s lease here); the epoch is bumped and logged.
    with temporary_postgres_url(lease_ms=60_000) as url:
        holder = _holding(url, workers)
        holder("append 4")
        holder.proc.send_signal(signal.SIGKILL)
        assert holder.proc.wait() == -signal.SIGKILL
        backend = open_backend(url)
        try:
            with caplog.at_level("WARNING", logger="dsh.persistence.postgres._backend"), \
                    backend.open("s", "write") as handle:
                assert handle.epoch == 2  # type: ignore[attr-defined]
                assert len(handle.read().events) == 4
                handle.append([make("session/title", 4, {"title": "after takeover"})])
        finally:
            backend.close()
        taken = [r.getMessage() for r in caplog.records if "took over the lease" in r.getMessage()]
        assert len(taken) == 1
        assert f"pid {holder.pid}" in taken[0] and "epoch 1 -> 2" in taken[0]
        assert [e["seq"] for e in _stored(url)] == [0, 1, 2, 3, 4]


def test_dead_holder_on_another_host_waits_for_its_lease(workers: list[Worker]) -> None:
    # A pid names a process only on its own host: a holder elsewhere is never judged by it.
    with temporary_postgres_url(lease_ms=60_000) as url:
        holder = _holding(url, workers)
        holder.proc.send_signal(signal.SIGKILL)
        holder.proc.wait()
        for column, value in (("lease_host", "elsewhere"), ("lease_node", "other-boot/1")):
            _sql(f'UPDATE "{_schema(url)}".sessions SET {column} = %s', value)
            backend = open_backend(url)
            try:
                with pytest.raises(SessionBusyError) as info:
                    backend.open("s", "write").close()
                assert info.value.where["pid"] == holder.pid
                assert info.value.where["epoch"] == 1
                assert info.value.where["holder"] == "another process"  # waited for
            finally:
                backend.close()


def test_a_lease_held_in_this_process_is_refused_at_once_not_waited_for(pg_url: str) -> None:
    # docs/errors.md#sessionbusyerror: another handle of this process renews its lease until it
    # is closed, so no wait frees it; before, the busy error named no holder and a waiting
    # writer tried until its deadline (as the SQLite and JSONL locks, it now gives up at once)
    from dsh.adapters._log import wait_for_writer

    first, second = open_backend(pg_url), open_backend(pg_url)
    try:
        first.create(header("s"))
        held = first.open("s", "write")
        tries: list[Any] = []

        def attempt() -> Any:
            try:
                return second.open("s", "write")
            except SessionBusyError as exc:
                tries.append(exc.where.get("holder"))
                raise

        with pytest.raises(SessionBusyError) as info:
            wait_for_writer(attempt, 600.0)
        assert tries == ["this process"]  # one try: never waited
        assert info.value.where["session_id"] == "s"
        assert "'s' is being written by this process (pid " in info.value.message
        assert info.value.message.endswith("close it first")
        held.close()  # the release frees it for the same backend and the other
        second.open("s", "write").close()
    finally:
        first.close()
        second.close()


def test_holder_wrongly_judged_dead_is_fenced(workers: list[Worker]) -> None:
    # If a live holder's pid were taken for dead (say its row named a pid that exited), the
    # takeover bumps the epoch: the live holder's next append is refused, nothing merged.
    with temporary_postgres_url(lease_ms=60_000) as url:
        holder = _holding(url, workers)
        assert holder("append 2")["seqs"] == [0, 1]
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        _sql(f'UPDATE "{_schema(url)}".sessions SET lease_pid = %s', gone.pid)
        backend = open_backend(url)
        try:
            with backend.open("s", "write") as handle:
                assert handle.epoch == 2  # type: ignore[attr-defined]
                refused = holder("append 1")
                assert refused["ok"] is False and refused["code"] == "LEASE_LOST"
                assert refused["where"]["epoch"] == 2
                handle.append([make("session/title", 2, {"title": "new holder"})])
        finally:
            backend.close()
        events = _stored(url)
        assert [e["seq"] for e in events] == [0, 1, 2]
        assert events[2]["data"]["title"] == "new holder"


def _block_seq(url: str, seq: int) -> psycopg.Connection[Any]:
    """Hold an uncommitted row at ``seq`` so a writer's batch stops there, mid-batch."""
    conn = psycopg.connect(postgres_base_url())
    conn.execute(f'INSERT INTO "{_schema(url)}".events (session_id, seq, type, time, data) '
                 "VALUES ('s', %s, 'session/title', 1, '{}')", (seq,))
    return conn


def _terminate_waiting_writer(worker: Worker) -> int:
    deadline = time.monotonic() + ANSWER_WAIT_S
    while time.monotonic() < deadline:
        rows = _sql("SELECT pid FROM pg_stat_activity WHERE application_name = %s AND "
                    "wait_event_type = 'Lock'", f"dsh pid {worker.pid}")
        if rows:
            assert _sql("SELECT pg_terminate_backend(%s)", rows[0][0]) == [(True,)]
            return int(rows[0][0])
        time.sleep(0.02)
    raise AssertionError("the writer never reached the blocked row")


@pytest.mark.parametrize("retries", [1, 0])
def test_terminated_connection_mid_batch_is_all_or_nothing_and_recovers(
        retries: int, workers: list[Worker]) -> None:
    with temporary_postgres_url() as base:
        url = f"{base}&reconnect_retries={retries}"
        _created(url)
        writer = Worker(url)
        workers.append(writer)
        writer("open")
        writer("append 2")
        blocker = _block_seq(url, 7)
        writer.send("append 10")  # seqs 2..11; the insert of seq 7 waits on the blocker
        _terminate_waiting_writer(writer)
        # During the wait rows 2..6 were inserted in the writer's transaction: none is visible.
        assert [e["seq"] for e in _stored(url)] == [0, 1]
        blocker.rollback()
        blocker.close()
        answer = writer.answer()
        if retries:
            assert answer["ok"] is True and answer["seqs"] == list(range(2, 12))
            assert answer["recovered"] == 1
        else:
            assert answer["ok"] is False and answer["code"] == "CONNECTION_LOST"
            assert "nothing was written" in answer["message"]
            assert [e["seq"] for e in _stored(url)] == [0, 1]
            # the writer keeps its lease and recovers by sending the batch again
            assert writer("append 10")["seqs"] == list(range(2, 12))
        assert [e["seq"] for e in _stored(url)] == list(range(12))


def test_hosts_starting_at_once_apply_each_migration_once() -> None:
    with temporary_postgres_url() as url:
        code = ("import sys; from dsh.persistence import open_backend; "
                "b = open_backend(sys.argv[1]); print(b.schema_version); b.close()")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        procs = [subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE,
                                  text=True, env=env) for _ in range(6)]
        outputs = [p.communicate(timeout=ANSWER_WAIT_S)[0].strip() for p in procs]
        assert [p.returncode for p in procs] == [0] * 6
        assert outputs == [str(SCHEMA_VERSION)] * 6
        schema = _schema(url)
        assert _sql(f'SELECT version FROM "{schema}".dsh_migrations ORDER BY version') == [
            (n,) for n, _, _ in MIGRATIONS]
        assert _sql(f'SELECT count(*) FROM "{schema}".store_state') == [(1,)]


def _at_migration_1(url: str) -> str:
    """Lay out the URL's schema as migration 1 left it; return the schema name."""
    schema = _schema(url)
    number, name, statements = MIGRATIONS[0]
    _sql(f'CREATE SCHEMA "{schema}"')
    _sql(f'CREATE TABLE "{schema}".dsh_migrations (version integer PRIMARY KEY, '
         "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
    for statement in statements:
        _sql(statement.replace("{s}", f'"{schema}"'))
    _sql(f'INSERT INTO "{schema}".dsh_migrations (version, name) VALUES (%s, %s)', number, name)
    return schema


def test_migrate_brings_an_older_schema_forward_and_refuses_a_newer_one() -> None:
    with temporary_postgres_url() as url:
        schema = _at_migration_1(url)
        behind = Persistence(open_backend(f"{url}&migrate=false"))  # sends nothing yet
        try:  # refused by the first statement, a read carrying the check included
            for first_use in (lambda: behind.read("s"), lambda: behind.exists("s")):
                with pytest.raises(PersistenceError) as info:
                    first_use()
                assert info.value.code == "MIGRATION_REQUIRED"
                assert "dsh migrate" in info.value.message
        finally:
            behind.close()
        proc = subprocess.run([sys.executable, "-m", "dsh.cli", "migrate", "--store", url,
                               "--json"], capture_output=True, text=True, timeout=ANSWER_WAIT_S,
                              check=False)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["schemaVersion"] == SCHEMA_VERSION
        backend = open_backend(f"{url}&migrate=false")
        backend.create(header("s"))
        with backend.open("s", "write") as handle:
            assert handle.epoch == 1  # type: ignore[attr-defined]
        backend.close()
        _sql(f'INSERT INTO "{schema}".dsh_migrations (version, name) VALUES (99, %s)', "future")
        ahead = Persistence(open_backend(url))
        try:
            for first_use in (lambda: ahead.read("s"), lambda: ahead.open("s", "write")):
                with pytest.raises(SessionFormatUnsupportedError, match="upgrade dsh"):
                    first_use()
        finally:
            ahead.close()
        ahead = Persistence(open_backend(url))
        try:  # a new pool whose first statement is the lease: it moved nothing
            with pytest.raises(SessionFormatUnsupportedError, match="upgrade dsh"):
                ahead.open("s", "write")
        finally:
            ahead.close()
        assert _sql(f'SELECT lease_epoch, lease_owner FROM "{schema}".sessions') == [(1, None)]


def test_busy_error_names_the_holder_and_read_handles_still_read(pg_url: str) -> None:
    store = Persistence(open_backend(pg_url))
    try:
        store.create(header("s"))
        with store.open("s", "write") as handle:
            handle.append([make("session/title", 0, {"title": "x"})])
            with pytest.raises(SessionBusyError) as info:
                store.open("s", "write")
            assert info.value.where["pid"] == os.getpid()
            assert info.value.where["epoch"] == 1
            assert not isinstance(info.value, LeaseLostError)
            with store.open("s") as reader:
                assert len(reader.read().events) == 1
        with store.open("s", "write") as handle:
            assert handle.epoch == 2  # type: ignore[attr-defined]
    finally:
        store.close()


def test_lease_is_renewed_in_the_background(pg_url: str, backend: Any) -> None:
    with backend.open("s", "write") as handle:
        schema = _schema(pg_url)
        first = _sql(f'SELECT lease_expires_at FROM "{schema}".sessions')[0][0]
        deadline = time.monotonic() + ANSWER_WAIT_S
        while _sql(f'SELECT lease_expires_at FROM "{schema}".sessions')[0][0] == first:
            assert time.monotonic() < deadline, "lease was never renewed"
            time.sleep(0.05)
        time.sleep(1.2)  # two lease lengths: only the renewal keeps the lease ours
        handle.append([make("session/title", 0, {"title": "still mine"})])


def test_bad_postgres_options_are_config_errors() -> None:
    base = postgres_base_url()
    for option in ("lease_ms=5", "lease_ms=abc", "pool_size=0", "migrate=maybe",
                   "schema=Bad-Name"):
        with pytest.raises(ConfigError):
            open_backend(f"{base}?{option}")
    with pytest.raises(PersistenceError) as info:
        PostgresBackend("postgresql://postgres@127.0.0.1:1/none")
    assert info.value.code == "DATABASE_UNREACHABLE"


def test_a_server_that_answers_no_is_named_with_its_reason_not_a_timeout() -> None:
    # before: both were DATABASE_UNREACHABLE "no connection within 10 s", though the server
    # answered at once
    parts = urlsplit(postgres_base_url())
    missing = urlunsplit(parts._replace(path="/h_newuser2_no_such_db"))
    with pytest.raises(PersistenceError) as info:
        PostgresBackend(missing)
    assert info.value.code == "DATABASE_NOT_FOUND"
    assert "database 'h_newuser2_no_such_db' does not exist" in info.value.message
    assert "createdb h_newuser2_no_such_db" in info.value.message
    assert "within" not in info.value.message
    netloc = "h_newuser2_no_role@" + parts.netloc.rpartition("@")[2]
    with pytest.raises(PersistenceError) as info:
        PostgresBackend(urlunsplit(parts._replace(netloc=netloc)))
    assert info.value.code == "DATABASE_REFUSED"
    assert 'role "h_newuser2_no_role" does not exist' in info.value.message


def test_ids_follow_the_rule_every_backend_shares(pg_url: str) -> None:
    backend = open_backend(pg_url)
    try:
        for bad in ("bad\ud800id", "x" * 300):
            assert backend.exists(bad) is False
            with pytest.raises(ConfigError) as info:
                backend.open(bad, "write")
            assert info.value.code == "INVALID_ID"
        backend.create(header("ok-id"))
        assert backend.exists("ok-id")
    finally:
        backend.close()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_takeover_of_a_writer_paused_inside_its_append_transaction(
        pg_url: str, workers: list[Worker]) -> None:
    """A holder frozen with the session row locked (docs/stores.md#takeover)."""
    _created(pg_url)
    first = Worker(pg_url)
    workers.append(first)
    assert first("open")["epoch"] == 1
    assert first("append 2")["seqs"] == [0, 1]
    first.send("append-pause 3")  # locks the row, then SIGSTOPs itself mid-transaction
    deadline = time.monotonic() + ANSWER_WAIT_S  # hang guard
    while not _stopped(first.pid):
        assert time.monotonic() < deadline, "the worker never paused"
        time.sleep(0.02)
    backend = open_backend(pg_url)
    outcome: list[Any] = []

    def take_over() -> None:
        try:
            while True:
                try:
                    outcome.append(backend.open("s", "write"))
                    return
                except SessionBusyError as exc:  # its lease has not run out yet
                    time.sleep(max(0.05, exc.where.get("expires_in_ms", 0) / 1000))
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=take_over, daemon=True)
    thread.start()
    thread.join(ANSWER_WAIT_S)  # main: blocked on the row lock for as long as the pause lasts
    try:
        assert not thread.is_alive(), "the takeover waited on the paused writer's row lock"
        [handle] = outcome
        assert not isinstance(handle, BaseException), handle
        assert handle.epoch == 2
        handle.read()
        handle.append([Event({"type": "session/title", "seq": seq, "time": 1,
                              "data": {"title": f"new:{seq}"}}) for seq in (2, 3)])
        handle.close()
    finally:
        os.kill(first.pid, signal.SIGCONT)
    late = first.answer()  # its commit resumes after the takeover
    assert late["ok"] is False and late["code"] == "LEASE_LOST", late
    assert late["where"]["epoch"] == 2
    titles = [e["data"]["title"] for e in _stored(pg_url)]
    assert titles[2:] == ["new:2", "new:3"] and len(titles) == 4  # nothing of the late batch
    backend.close()


def test_big_and_small_batches_store_the_same_rows_by_copy_and_by_one_statement(
        pg_url: str, backend: Any) -> None:
    # A batch above ONE_STATEMENT_MAX_ROWS goes by COPY inside the fenced transaction, a
    # small one as one statement; both store exactly the events (zstd payloads included).
    from dsh.persistence.postgres._backend import ONE_STATEMENT_MAX_ROWS

    big = "word " * 2000  # >= 4 KiB: stored zstd-compressed
    odd = 'a\\b\tc\nd\re "q" \\N é ✓'  # what COPY's text format escapes, and more
    events = [make("session/title", seq, {"title": big if seq % 7 == 0 else f"t{seq}{odd}"})
              for seq in range(ONE_STATEMENT_MAX_ROWS * 2 + 5)]
    with backend.open("s", "write") as handle:
        handle.append(events[:3])  # one statement
        handle.append(events[3:ONE_STATEMENT_MAX_ROWS * 2 + 3])  # COPY
        handle.append(events[ONE_STATEMENT_MAX_ROWS * 2 + 3:])  # one statement
    zstd = _sql(f'SELECT count(*) FROM "{_schema(pg_url)}".events WHERE data_zstd IS NOT '
                "NULL")[0][0]
    assert zstd == len([e for e in events if e["seq"] % 7 == 0])
    assert [dict(e) for e in _stored(pg_url)] == [dict(e) for e in events]


def test_deleting_a_session_row_deletes_its_events_and_chain_without_foreign_keys(
        pg_url: str, backend: Any) -> None:
    # Migration 10: no reference check per inserted row (every insert holds the session row
    # locked); the trigger on sessions deletes a session's rows as ON DELETE CASCADE did.
    schema = _schema(pg_url)
    backend.create(header("other"))
    for sid in ("s", "other"):
        with backend.open(sid, "write") as handle:
            handle.append([make("session/title", 0, {"title": "a"})])
            handle.append([make("session/title", 1, {"title": "b"})])
    assert _sql("SELECT conrelid::regclass::text FROM pg_constraint WHERE contype = 'f' AND "
                "connamespace = %s::regnamespace AND conrelid::regclass::text LIKE ANY "
                "(ARRAY[%s, %s])", schema, f"{schema}.events", f"{schema}.chain") == []
    _sql(f'DELETE FROM "{schema}".sessions WHERE id = %s', "s")
    for table in ("events", "chain"):
        counts = dict(_sql(f'SELECT session_id, count(*) FROM "{schema}".{table} '
                           "GROUP BY session_id"))
        assert counts == {"other": 2}, table
    assert [e["seq"] for e in _stored(pg_url, "other")] == [0, 1]


def _pooled(url: str, expected: int) -> int:
    """Connections this process holds to the server (the pool's: named ``dsh pid N``).

    The server drops a closed connection from ``pg_stat_activity`` when its backend has exited,
    a moment after the client closed it (longer on a loaded machine), so the count is read again
    until it is ``expected`` or 10 s have passed; the last count is returned either way.
    """
    deadline = time.monotonic() + 10
    while True:
        count = int(_sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                         f"dsh pid {os.getpid()}")[0][0])
        if count == expected or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def test_backends_on_one_url_share_a_pool_and_its_schema_check(pg_url: str) -> None:
    """docs/stores.md#connections-and-the-schema-check."""
    first = open_backend(pg_url)
    try:
        first.create(header("s1"))
        with first.open("s1", "write") as handle:
            handle.append([make("session/title", 0, {"title": "one"})])
        assert _pooled(pg_url, 1) == 1
        # a second backend checks nothing: it is handed the first one's check and connection
        _sql(f'UPDATE "{_schema(pg_url)}".store_state SET store_id = gen_random_uuid()')
        second = open_backend(pg_url)
        assert second.store_id == first.store_id  # type: ignore[attr-defined]
        assert _pooled(pg_url, 1) == 1
        assert [e["seq"] for e in second.open("s1").read().events] == [0]
        second.close()
        assert _pooled(pg_url, 1) == 1  # still held by the first
        with first.open("s1", "read") as handle:
            assert len(handle.read().events) == 1
    finally:
        first.close()
    assert _pooled(pg_url, 0) == 0  # the last holder closed it
    # a new pool checks again and sees the store id as stored now
    third = open_backend(pg_url)
    try:
        stored = _sql(f'SELECT store_id::text FROM "{_schema(pg_url)}".store_state')[0][0]
        assert third.store_id == stored  # type: ignore[attr-defined]
    finally:
        third.close()


def test_a_dropped_schema_is_created_again_by_the_next_open(pg_url: str) -> None:
    keeper = open_backend(pg_url)  # keeps the pool (and its schema check) alive
    try:
        dropped = open_backend(pg_url)
        dropped.create(header("s1"))
        dropped.drop()  # type: ignore[attr-defined]
        again = open_backend(pg_url)
        again.create(header("s1"))  # the tables are there again
        assert again.exists("s1")
        again.close()
    finally:
        keeper.close()


def test_a_connection_returned_mid_transaction_is_rolled_back_and_reused(pg_url: str) -> None:
    conninfo, schema = _conninfo_and_schema(pg_url)
    backend = PostgresBackend(conninfo, schema=schema, pool_size=1)
    try:
        backend.create(header("s1"))
        with pytest.raises(RuntimeError), backend._conn("test", None) as conn:
            conn.execute("BEGIN")
            conn.execute(f'DELETE FROM "{_schema(pg_url)}".sessions')
            raise RuntimeError("left inside the transaction")
        with backend._conn("test", None) as conn:  # the same (only) connection
            assert conn.autocommit
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert backend.exists("s1")  # the delete was rolled back
    finally:
        backend.close()


def test_a_read_only_open_takes_no_lease(pg_url: str, backend: Any) -> None:
    with backend.open("s", "write") as handle:
        handle.append([make("session/title", 0, {"title": "one"})])
        epoch = _sql(f'SELECT lease_epoch FROM "{_schema(pg_url)}".sessions')[0][0]
        persistence = Persistence(open_backend(pg_url))
        try:  # a writer holds the lease; reading neither waits nor takes it
            assert len(persistence.read("s").events) == 1
        finally:
            persistence.close()
        assert _sql(f'SELECT lease_epoch FROM "{_schema(pg_url)}".sessions')[0][0] == epoch


def _conninfo_and_schema(url: str) -> tuple[str, str]:
    conninfo, options = parse_postgres_url(url)
    return conninfo, options["schema"]


class RoundTrips:
    """What the pool's connections send, read from libpq's trace of each (``PQtrace``).

    Each simple ``Query`` message and each ``Sync`` (ending a parse/bind/execute) is one round
    trip: the client waits for the server's ``ReadyForQuery`` before it sends anything else.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from dsh.persistence.postgres._pool import SharedPool

        self._traced: list[list[Any]] = []  # [connection, its current trace file]
        connect = SharedPool._connect
        self._restore = lambda: monkeypatch.setattr(SharedPool, "_connect", connect)

        def traced(pool: SharedPool) -> Any:
            conn = connect(pool)
            self._traced.append([conn, self._trace(conn)])
            return conn

        monkeypatch.setattr(SharedPool, "_connect", traced)

    @staticmethod
    def _trace(conn: Any) -> Any:
        out = tempfile.TemporaryFile()  # noqa: SIM115 - closed by sent() and close()
        conn.pgconn.trace(out.fileno())
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        return out

    def sent(self) -> list[str]:
        """The round trips since the last call: a ``Query``'s text, or the statement synced."""
        trips: list[str] = []
        for traced in self._traced:
            conn, out = traced
            if conn.closed:
                continue
            conn.pgconn.untrace()  # flushes the trace
            out.seek(0)
            parsed = ""
            for line in out.read().decode("utf-8", "replace").splitlines():
                fields = line.split("\t")
                if fields[0] != "F" or len(fields) < 3:
                    continue
                if fields[2] == "Query":
                    trips.append(fields[3].strip())
                elif fields[2] == "Parse":  # fields[3]: the statement's name, then its text
                    parsed = fields[3].strip()
                elif fields[2] == "Sync":  # no Parse since the last Sync: a prepared one
                    trips.append(parsed or "(a prepared statement)")
                    parsed = ""
            out.close()
            traced[1] = self._trace(conn)
        return trips

    def close(self) -> None:
        """Stop tracing (before the pool closes its connections); new ones are not traced."""
        self._restore()
        for conn, out in self._traced:
            if not conn.closed:
                conn.pgconn.untrace()
            out.close()


def test_a_read_is_one_round_trip_with_the_schema_check_folded_in(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/stores.md#connections-and-the-schema-check: a fresh pool's read of a session is
    one message (schema state, session row, rows, one snapshot); a commit one statement."""
    with temporary_postgres_url(lease_ms=60_000) as url:  # no renewal inside the test
        writer = open_backend(url)
        writer.create(header("s"))
        with writer.open("s", "write") as handle:
            handle.append([make("session/title", seq, {"title": f"t{seq}"}) for seq in (0, 1)])
        writer.close()
        trips = RoundTrips(monkeypatch)
        store = Persistence(open_backend(url))  # a new pool: connects, sends nothing
        try:
            assert trips.sent() == []
            assert len(store.read("s").events) == 2
            [read] = trips.sent()
            assert "dsh_migrations" in read and "FROM" in read and "events" in read
            with pytest.raises(SessionNotFoundError):  # the same message answers existence
                store.read("missing")
            assert len(trips.sent()) == 1
            with store.open("s", "write") as handle:  # the lease, head and restore point
                assert len(trips.sent()) == 1
                handle.append([make("session/title", 2, {"title": "t2"})])
                [append] = trips.sent()  # one statement: fence, rows, head, lease, NOTIFY
                assert "WITH fence AS" in append
                # a flush's restore point: its anchor is one snapshot in one message
                assert handle.restore_point_anchor().event_count == 3  # type: ignore[attr-defined]
                [anchor] = trips.sent()
                assert "READ ONLY" in anchor and "ORDER BY seq DESC LIMIT 1" in anchor
            [release] = trips.sent()
            assert "lease_owner = NULL" in release
        finally:
            trips.close()
            store.close()
        trips = RoundTrips(monkeypatch)
        store = Persistence(open_backend(url))
        try:  # a new pool whose first statement takes the lease: the check rides with it
            with store.open("s", "write"):
                [take] = trips.sent()
                assert "dsh_migrations" in take and "lease_epoch + 1" in take
        finally:
            trips.close()
            store.close()


def test_a_resume_of_a_short_log_reads_its_rows_in_the_lease_message(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/stores.md#connections-and-the-schema-check: ``open(id, "write")`` reads, under the
    lease its message takes, the rows of a log of at most RESUME_READ_MAX_EVENTS events without
    a restore point; the resume's whole read then sends nothing, and a write drops them."""
    from dsh.persistence.postgres._backend import RESUME_READ_MAX_EVENTS
    from dsh.session import SessionStore

    with temporary_postgres_url(lease_ms=60_000) as url:
        writer = open_backend(url)
        for sid, count in (("short", 3), ("long", RESUME_READ_MAX_EVENTS + 1)):
            writer.create(header(sid))
            with writer.open(sid, "write") as handle:
                handle.append([make("session/title", seq, {"title": f"t{seq}"})
                               for seq in range(count)])
        writer.close()
        trips = RoundTrips(monkeypatch)
        store = Persistence(open_backend(url))
        try:
            with store.open("short", "write") as handle:
                [take] = trips.sent()
                assert "lease_epoch + 1" in take and "FROM" in take and ".events" in take
                read = handle.read(0)
                assert [e["seq"] for e in read.events] == [0, 1, 2]
                assert read.header["id"] == "short" and trips.sent() == []
                assert len(handle.read(0).events) == 3  # read again: from the database
                assert len(trips.sent()) == 1
            trips.sent()  # the release
            with store.open("short", "write") as handle:  # an append drops what was read
                handle.append([make("session/title", 3, {"title": "t3"})])
                trips.sent()
                assert len(handle.read(0).events) == 4
                assert len(trips.sent()) == 1
            trips.sent()
            with store.open("long", "write") as handle:  # too long: read on its own
                trips.sent()
                assert len(handle.read(0).events) == RESUME_READ_MAX_EVENTS + 1
                assert len(trips.sent()) == 1
            trips.sent()
            # the resume of a short log: lookup, lease with the rows, the end-seed marker's
            # append; nothing else before the release
            sessions = SessionStore(persistence=store)
            resumed = sessions.session("short")
            assert len(resumed.events) == 5
            sessions.flush(resumed)
            sent = trips.sent()
            assert len(sent) == 3 and "lease_epoch + 1" in sent[1], sent
            sessions.close()
        finally:
            trips.close()
            store.close()


def test_a_read_through_a_schema_that_is_behind_migrates_it_first() -> None:
    """A pool's first read meets a schema at migration 1 (columns missing): checked in
    full, migrated, then read (docs/stores.md#connections-and-the-schema-check)."""
    with temporary_postgres_url() as url:
        schema = _at_migration_1(url)
        _sql(f'INSERT INTO "{schema}".sessions (id, version, created_at, incarnation) VALUES '
             "('old', 0, 1, gen_random_uuid())")
        store = Persistence(open_backend(url))
        try:
            read = store.read("old")
            assert read.header["id"] == "old" and read.events == ()
        finally:
            store.close()
        assert _sql(f'SELECT max(version) FROM "{schema}".dsh_migrations') == [
            (SCHEMA_VERSION,)]


def test_dsh_open_takes_create_schema_and_refuses_a_missing_store_without_creating_it(
        pg_url: str) -> None:
    # before: the CLI set the backend's create_schema attribute after dsh.open; the library
    # had no way to ask for it (dsh.open(url, create_schema=False) was a TypeError)
    import dsh

    schema = _schema(pg_url)
    with dsh.open(pg_url, create_schema=False) as store, \
            pytest.raises(ConfigError) as refused:
        store.list()
    assert refused.value.code == "STORE_NOT_FOUND"
    assert f"PostgreSQL schema {schema!r} holds no dsh store" in refused.value.message
    assert "create_schema=True" in refused.value.message
    assert _sql("SELECT 1 FROM pg_namespace WHERE nspname = %s", schema) == []
    with dsh.open(pg_url) as store:  # the default creates it, as before
        store.session("s1").append("user/message", {
            "id": "u1", "role": "user", "source": {"kind": "user"},
            "content": [{"type": "text", "text": "hello"}]}, surface_op="append")
    with dsh.open(pg_url, create_schema=False) as store:  # a store now: nothing refused
        assert [entry.header["id"] for entry in store.list()] == ["s1"]


def _turns(handle: Any, turns: int) -> list[Event]:
    """Append ``turns`` closed turns (a prompt and an answer each) through ``handle``."""
    log = LogBuilder("s")
    for turn in range(1, turns + 1):
        log.turn_start(turn)
        log.user(f"prompt {turn}")
        log.turn_end(turn)
    events = list(log.events)
    handle.append(events)
    return events


@pytest.mark.no_speedups
def test_a_whole_read_hands_the_pipeline_its_seq_proof_and_prescan(backend: Any) -> None:
    """A whole read decodes every row at the next seq from 0: the pipeline is told so.

    (Before: neither was passed, and the pipeline checked every seq again in Python and ran
    the prescan pass over the events a second time.)
    """
    with backend.open("s", "write") as handle:
        written = _turns(handle, 3)
    cold = backend.read_whole("s")
    assert [e["seq"] for e in cold.events] == list(range(len(written)))
    assert cold.contiguous is True
    if c_decode_rows is not None:  # noted by the C pass, as the pipeline's prescan answers
        assert cold.prescan == stored_prescan(list(cold.events), KNOWN_EVENT_TYPES) == (-1, -1)
    else:
        assert cold.prescan is None
    with backend.open("s", "read") as handle:
        suffix = handle.read(2)  # not from 0: the pipeline checks for itself
    assert [e["seq"] for e in suffix.events] == list(range(2, len(written)))
    assert (suffix.contiguous, suffix.prescan) == (False, None)


@pytest.mark.no_speedups
def test_a_read_decodes_each_row_once(backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last intact turn/end is looked for only when a row does not continue the log.

    (Before: every scan decoded the last turn/end row in Python first, then again in C.)
    """
    with backend.open("s", "write") as handle:
        _turns(handle, 3)
    decoded: list[int] = []
    real = row_schema.decode_row

    def counted(row: Any, version: int) -> Any:
        decoded.append(row[1])
        return real(row, version)

    monkeypatch.setattr(row_schema, "decode_row", counted)
    events = backend.read_whole("s").events
    if c_decode_rows is not None:
        assert decoded == []  # the C pass took every row
    else:
        assert sorted(decoded) == sorted(set(decoded)) == [e["seq"] for e in events]


def test_url_options_reach_libpq_as_libpq_reads_the_url(pg_url: str) -> None:
    """A "+" in a URL option is a plus, %2B a plus, %20 a space: as libpq reads the URL.

    (Before: a918246 re-encoded the parsed options with %20, and the parse had read each "+"
    as a space, so 'options=-c%20dsh.probe%3Da+b' reached the server as '-c dsh.probe=a b',
    not libpq's '-c dsh.probe=a+b'; a password=... with a "+" was changed the same way.)
    """
    query = "options=-c%20dsh.probe%3Da+b%2Bc"
    assert psycopg.conninfo.conninfo_to_dict(f"postgresql://h/db?{query}")["options"] \
        == "-c dsh.probe=a+b+c"  # libpq's own reading
    backend = open_backend(f"{pg_url}&{query}")
    try:
        with backend._conn("test", None, check=False) as conn:
            probe = conn.execute("SELECT current_setting('dsh.probe')").fetchone()
    finally:
        backend.close()
    assert probe == ("a+b+c",)


def test_options_in_the_url_are_kept_beside_the_lease_settings(pg_url: str) -> None:
    """libpq ``options`` of the URL reach the server together with the lease's own settings."""
    with_options = f"{pg_url}&options=-c%20statement_timeout%3D12345"
    for url, timeout in ((pg_url, None), (with_options, "12345ms")):
        backend = open_backend(url)
        try:
            with backend._conn("test", None, check=False) as conn:
                settings = conn.execute("SELECT current_setting('lock_timeout'), "
                                        "current_setting('statement_timeout')").fetchone()
        finally:
            backend.close()
        assert settings[0] == "600ms"  # the lease (pg_url's lease_ms=600)
        assert settings[1] == (timeout or "0")

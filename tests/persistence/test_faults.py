"""Fault injection on the JSONL writer.

ENOSPC, EIO, a short write followed by ENOSPC, a failing fsync and a failing ftruncate, alone
and in every pair, at each of the first calls of a writer that stores 4 batches and retries
each batch until it is acknowledged: nothing acknowledged is lost, nothing is stored twice, the
log always loads, and the writer never silently stops (every failure is raised).

``DSH_FAULT_CALLS`` widens the window of call numbers the faults are placed at (default 4).
"""

from __future__ import annotations

import errno
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsh._errors import DshError, PersistenceError, WriteFailedError
from dsh.persistence import Persistence, open_backend
from dsh.persistence.jsonl._backend import JsonlBackend, parse_log
from dsh.session._events import Event
from dsh.session._store import SessionStore
from dsh.testing import CWD, LogBuilder, header, plain, user

CALLS = int(os.environ.get("DSH_FAULT_CALLS", "4"))
KINDS = ("write_enospc", "write_eio", "write_short_enospc", "fsync_eio", "ftruncate_eio")
_TARGET = {"write_enospc": "write", "write_eio": "write", "write_short_enospc": "write",
           "fsync_eio": "fsync", "ftruncate_eio": "ftruncate"}


class FaultyOs:
    """Replaces a backend's write/fsync/ftruncate; each planned (kind, n) fails the n-th call."""

    def __init__(self, backend: JsonlBackend, plan: set[tuple[str, int]]) -> None:
        self.plan = plan
        self.calls = {"write": 0, "fsync": 0, "ftruncate": 0}
        self.fired: list[tuple[str, int]] = []
        backend._os_write = self.write
        backend._os_fsync = self.fsync
        backend._os_ftruncate = self.ftruncate

    def _due(self, target: str) -> str | None:
        self.calls[target] += 1
        n = self.calls[target]
        for kind, at in self.plan:
            if _TARGET[kind] == target and at == n:
                self.fired.append((kind, n))
                return kind
        return None

    def write(self, fd: int, data: Any) -> int:
        kind = self._due("write")
        if kind == "write_short_enospc":
            # a short write: half the bytes land, the next call finds the disk full
            self.plan.add(("write_enospc", self.calls["write"] + 1))
            return os.write(fd, bytes(data[:max(1, len(data) // 2)]))
        if kind is not None:
            code = errno.ENOSPC if kind == "write_enospc" else errno.EIO
            raise OSError(code, os.strerror(code))
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        if self._due("fsync") is not None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        if self._due("ftruncate") is not None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        os.ftruncate(fd, size)


def _batches() -> list[list[Event]]:
    builder = LogBuilder()
    for i in range(4):
        builder.completed_turn(f"prompt {i}")
    events = builder.events
    step = len(events) // 4
    return [list(events[k * step:(k + 1) * step if k < 3 else len(events)]) for k in range(4)]


BATCHES = _batches()


def _plans() -> Iterator[set[tuple[str, int]]]:
    points = [(kind, n) for kind in KINDS for n in range(1, CALLS + 1)]
    for point in points:
        yield {point}
    for a, b in itertools.combinations(points, 2):
        yield {a, b}


def stored_events(persistence: Any, sid: str) -> list[dict[str, Any]]:
    with persistence.open(sid) as handle:
        return plain(handle.read().events)


def _log_events(backend: JsonlBackend, path: Path) -> list[Event]:
    parsed = parse_log(path.read_bytes(), compression=backend.compression, path=str(path))
    return parsed.events


def _store_with_retries(backend: JsonlBackend) -> tuple[int, int]:
    """Write every batch, retrying each until acknowledged; return (acknowledged, failures)."""
    failures = 0
    acknowledged = 0
    backend.create(header("s"))
    with backend.open("s", "write") as handle:
        for batch in BATCHES:
            for _attempt in range(12):
                try:
                    handle.append(batch)
                    handle.flush()
                except (OSError, DshError) as exc:
                    failures += 1
                    assert not isinstance(exc, DshError) or \
                        (isinstance(exc, PersistenceError) and exc.code == "LOG_END_UNKNOWN"), exc
                    continue
                acknowledged += len(batch)
                break
            else:
                pytest.fail(f"batch at seq {batch[0].seq} never acknowledged")
    return acknowledged, failures


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_transient_faults_alone_and_in_pairs_lose_and_duplicate_nothing(
        tmp_path: Path, compression: str) -> None:
    expected = [e for batch in BATCHES for e in batch]
    runs = 0
    fired_total = 0
    for index, plan in enumerate(_plans()):
        root = tmp_path / f"r{index}"
        backend = JsonlBackend(root, compression=compression)  # type: ignore[arg-type]
        faults = FaultyOs(backend, set(plan))
        acknowledged, failures = _store_with_retries(backend)
        # every fault that failed a call the writer needed was raised, none swallowed
        assert failures >= len([k for k, _ in faults.fired
                                if k in ("write_enospc", "write_eio", "fsync_eio")])
        path = backend.locate(header("s"))
        assert acknowledged == len(expected)
        assert _log_events(backend, path) == expected, (plan, faults.fired)
        runs += 1
        fired_total += len(faults.fired)
    assert runs == len(KINDS) * CALLS + len(list(itertools.combinations(range(
        len(KINDS) * CALLS), 2)))
    assert fired_total > runs  # the plans really fired


def test_fsync_then_rollback_failure_does_not_store_the_retried_batch_twice(
        tmp_path: Path) -> None:
    # the reproducer: fsync EIO, the rollback ftruncate fails too, the batch is retried
    backend = JsonlBackend(tmp_path / "root")
    backend.create(header("s"))
    with backend.open("s", "write") as handle:
        handle.append(BATCHES[0])
        handle.flush()
        faults = FaultyOs(backend, {("fsync_eio", 1), ("ftruncate_eio", 1)})
        handle.append(BATCHES[1])
        with pytest.raises(OSError):
            handle.flush()
        assert faults.fired == [("fsync_eio", 1), ("ftruncate_eio", 1)]
        path = backend.locate(header("s"))
        assert path.stat().st_size > 0
        handle.append(BATCHES[1])  # re-reads the real end, cuts its own unacknowledged bytes
        handle.flush()
        handle.append(BATCHES[2])
        handle.flush()
    assert _log_events(backend, path) == BATCHES[0] + BATCHES[1] + BATCHES[2]


def test_persistent_rollback_failure_refuses_to_write_with_a_typed_error(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path / "root")
    backend.create(header("s"))
    with backend.open("s", "write") as handle:
        handle.append(BATCHES[0])
        handle.flush()
        path = backend.locate(header("s"))
        durable = path.stat().st_size
        FaultyOs(backend, {("write_short_enospc", 1), *(("ftruncate_eio", n)
                                                        for n in range(1, 5))})
        with pytest.raises(OSError) as first:
            handle.append(BATCHES[1])
        assert first.value.errno == errno.ENOSPC
        assert path.stat().st_size > durable  # the half-written batch stayed
        for _ in range(3):
            with pytest.raises(PersistenceError) as refused:
                handle.append(BATCHES[1])
            assert refused.value.code == "LOG_END_UNKNOWN"
            assert refused.value.where["byte_offset"] == durable
            assert str(path) in refused.value.message
        # the log loads: the acknowledged batch, then what of the half batch is complete
        parsed = parse_log(path.read_bytes(), compression="none", path=str(path))
        assert parsed.events == (BATCHES[0] + BATCHES[1])[:len(parsed.events)]
        assert len(BATCHES[0]) <= len(parsed.events) < len(BATCHES[0] + BATCHES[1])
        assert parsed.torn is not None
        handle.append(BATCHES[1])  # the 5th truncation works
        handle.flush()
    assert _log_events(backend, path) == BATCHES[0] + BATCHES[1]


def _turn(session: Any, n: int) -> None:
    session.append("turn/start", {"turn": n})
    session.append("step/start", {"turn": n, "step": 1})
    session.append("user/message", user(f"q{n}", f"u{n}"), surface_op="append")
    session.append("step/end", {"turn": n, "step": 1})
    session.append("turn/end", {"turn": n, "reason": {"kind": "completed"}})


def test_write_behind_reports_every_failure_and_resumes(tmp_path: Path) -> None:
    # through the store: a failed write is raised by flush, the next flush completes it
    persistence = Persistence(open_backend(f"jsonl://{tmp_path}/root"))
    backend = persistence.backend
    assert isinstance(backend, JsonlBackend)
    store = SessionStore(persistence)
    session = store.create("s", header={"cwd": CWD})
    _turn(session, 1)
    store.flush(session)
    faults = FaultyOs(backend, {("fsync_eio", 1), ("ftruncate_eio", 1), ("fsync_eio", 2)})
    _turn(session, 2)
    with pytest.raises(WriteFailedError):
        store.flush(session)
    with pytest.raises(WriteFailedError):  # the cut of its own bytes needs an fsync too
        store.flush(session)
    store.flush(session)
    assert faults.fired == [("fsync_eio", 1), ("ftruncate_eio", 1), ("fsync_eio", 2)]
    _turn(session, 3)
    store.flush(session)
    assert stored_events(persistence, "s") == plain(session.events)
    store.dispose(session)
    persistence.close()

"""Connections to one PostgreSQL server, shared by every backend of this process on the same URL.

Invariants this module owns (docs/stores.md#connections-and-the-schema-check,
docs/stores.md#takeover):

* one :class:`SharedPool` per ``(process, conninfo, lease_ms, pool size)``: a second backend on
  the same URL reuses the first one's connections and its schema check; the pool closes when
  the last backend holding it closes. A pool made before a ``fork`` is never used (nor closed)
  by the child, whose sockets it would share;
* every connection is opened with its session settings in the startup packet, so no statement
  is spent on them: autocommit; ``idle_in_transaction_session_timeout = lease_ms`` (a writer
  paused inside its append transaction, by SIGSTOP, a frozen VM or a partition, loses the
  transaction and the row lock with it one lease after its last statement; its late commit
  then fails and is settled against the lease epoch, refused); ``lock_timeout = lease_ms`` (no
  statement waits on a row lock longer than a lease; a takeover retries once the holder's lock
  is gone). Rule: docs/stores.md#takeover;
* the first connection is opened by the backend itself, in the caller's thread (no background
  thread, no connection opened twice); later ones are opened on demand up to the pool size;
* a connection comes back to the pool only idle and in autocommit: one returned inside a
  transaction is rolled back, a broken or closed one is dropped (the next caller opens a fresh
  one).

psycopg 3 is imported by the caller (``_backend``), never at this module's import.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any, Final

__all__ = ["PoolTimeoutError", "SharedPool", "acquire_pool", "release_pool"]


class PoolTimeoutError(Exception):
    """No connection could be had: all in use for the whole wait, or the server refused one.

    ``__cause__`` is the connect error when there was one.
    """


_POOLS: dict[tuple[int, str, int, int], SharedPool] = {}
_POOLS_LOCK: Final = threading.Lock()


class SharedPool:
    """At most ``max_size`` autocommit connections to ``conninfo``, handed out one at a time.

    Args:
        psycopg: The imported ``psycopg`` module.
        conninfo: libpq connection URL or string.
        lease_ms: The lease (ms): ``lock_timeout`` and ``idle_in_transaction_session_timeout``
            of every connection (docs/stores.md#takeover).
        max_size: Most connections open at once (>= 1).
        timeout_s: Longest wait for a connection (s), and the connect timeout.
    """

    def __init__(self, psycopg: Any, conninfo: str, *, lease_ms: int, max_size: int,
                 timeout_s: float) -> None:
        self._psycopg = psycopg
        self.conninfo = conninfo
        self.max_size = max_size
        self.timeout_s = timeout_s
        self._settings = (f"-c lock_timeout={int(lease_ms)} "
                          f"-c idle_in_transaction_session_timeout={int(lease_ms)}")
        self._idle: list[Any] = []
        self._open = 0  # connections out or idle
        self._cond = threading.Condition()
        self._closed = False
        self.users = 0
        self.schemas: dict[str, tuple[int, str]] = {}
        """Schemas checked through this pool: name -> (schema version, store id)."""

    def _connect(self) -> Any:
        """A new connection with the session settings in its startup packet."""
        psycopg = self._psycopg
        merged = self._settings
        # A conninfo that does not spell "options" (nor percent-escapes a key) names none:
        # libpq's parse (~0.1 ms of a fresh process, psycopg's connect parses twice more) is
        # spent only when one may be there to keep.
        if "options" in self.conninfo or "%" in self.conninfo:
            options = psycopg.conninfo.conninfo_to_dict(self.conninfo).get("options")
            merged = f"{options} {self._settings}" if options else self._settings
        try:
            return psycopg.connect(self.conninfo, autocommit=True, options=merged,
                                   connect_timeout=int(self.timeout_s),
                                   application_name=f"dsh pid {os.getpid()}")
        except psycopg.OperationalError as exc:
            raise PoolTimeoutError(str(exc).strip()) from exc

    def _take(self) -> Any:
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while True:
                if self._closed:
                    raise PoolTimeoutError("the pool is closed")
                if self._idle:
                    return self._idle.pop()
                if self._open < self.max_size:
                    self._open += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PoolTimeoutError(f"all {self.max_size} connections stayed in use for "
                                           f"{self.timeout_s:g} s")
                self._cond.wait(left)
        try:
            return self._connect()
        except BaseException:
            with self._cond:
                self._open -= 1
                self._cond.notify()
            raise

    def _give_back(self, conn: Any) -> None:
        pq = self._psycopg.pq
        keep = not conn.closed and not conn.broken
        if keep and conn.info.transaction_status != pq.TransactionStatus.IDLE:
            try:  # returned inside a transaction (an error mid-block): end it here
                conn.rollback()
            except self._psycopg.Error:
                keep = False
            keep = keep and conn.info.transaction_status == pq.TransactionStatus.IDLE
        if keep and not conn.autocommit:
            conn.autocommit = True  # every statement of a pooled connection commits itself
        with self._cond:
            if keep and not self._closed:
                self._idle.append(conn)
                conn = None
            else:
                self._open -= 1
            self._cond.notify()
        if conn is not None:
            conn.close()

    @contextlib.contextmanager
    def connection(self) -> Iterator[Any]:
        """An idle connection (opened if none is and the pool is below its size) for the block.

        Raises:
            PoolTimeoutError: none within ``timeout_s``, or the server refused a new one.
        """
        conn = self._take()
        try:
            yield conn
        finally:
            self._give_back(conn)

    def close(self) -> None:
        """Close the idle connections; ones still out are closed when they come back."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            conn.close()


def acquire_pool(psycopg: Any, conninfo: str, *, lease_ms: int, max_size: int,
                 timeout_s: float) -> SharedPool:
    """The process's pool for these settings (made on first use); the caller now holds it.

    Every call is matched by one :func:`release_pool`.
    """
    key = (os.getpid(), conninfo, lease_ms, max_size)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = SharedPool(psycopg, conninfo, lease_ms=lease_ms,
                                            max_size=max_size, timeout_s=timeout_s)
        pool.users += 1
        return pool


def release_pool(pool: SharedPool) -> None:
    """Let go of a pool from :func:`acquire_pool`; the last holder closes it."""
    with _POOLS_LOCK:
        pool.users -= 1
        if pool.users > 0:
            return
        for key, found in list(_POOLS.items()):
            if found is pool:
                del _POOLS[key]
    pool.close()

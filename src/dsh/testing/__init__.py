"""Test kit for dsh backends: the conformance suite, log builders and store helpers.

* :class:`BackendContract` (:mod:`dsh.testing._contract`) — the storage contract as a pytest
  base class; subclass it with a ``make_store`` for your backend.
* :class:`LogBuilder` — the one log builder: well-formed logs through a real ``Session``, or
  raw envelopes (``checked=False``); :func:`make` one raw event, :func:`header` a header,
  :func:`user`, :func:`assistant`, :func:`tool_result` event data, :func:`plain` for equality.
* :mod:`dsh.testing._stores` — URLs of fresh bundled stores, PostgreSQL in a throw-away schema,
  and torn-tail injection in each backend's own form.
* :mod:`dsh.testing._damage` — byte edits of stored logs and every read path, for reader fuzzing.

Needs pytest (the ``test`` extra); nothing under ``dsh`` imports this package.
"""

from dsh.testing._contract import BackendContract
from dsh.testing._logs import (
    CREATED_AT,
    CWD,
    LogBuilder,
    assistant,
    fixed_clock,
    frozen,
    header,
    make,
    plain,
    tool_result,
    user,
)
from dsh.testing._stores import (
    BUNDLED_BACKENDS,
    inject_torn_tail,
    postgres_unreachable,
    store_url,
    temporary_postgres_url,
)

__all__ = [
    "BUNDLED_BACKENDS",
    "CREATED_AT",
    "CWD",
    "BackendContract",
    "LogBuilder",
    "assistant",
    "fixed_clock",
    "frozen",
    "header",
    "inject_torn_tail",
    "make",
    "plain",
    "postgres_unreachable",
    "store_url",
    "temporary_postgres_url",
    "tool_result",
    "user",
]

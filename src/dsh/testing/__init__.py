"""Test kit for dsh backends: the conformance suite, log builders and store helpers.

* :class:`BackendContract` (:mod:`dsh.testing._contract`) — the storage contract as a pytest
  base class; subclass it with a ``make_store`` for your backend.
* :mod:`dsh.testing._logs` — :class:`LogBuilder` and envelope helpers that make well-formed logs.
* :mod:`dsh.testing._stores` — URLs of fresh bundled stores, PostgreSQL in a throw-away schema,
  and torn-tail injection in each backend's own form.
* :mod:`dsh.testing._damage` — byte edits of stored logs and every read path, for reader fuzzing.

Needs pytest (the ``test`` extra); nothing under ``dsh`` imports this package.
"""

from dsh.testing._contract import BackendContract
from dsh.testing._logs import LogBuilder, header, make, plain
from dsh.testing._stores import (
    BUNDLED_BACKENDS,
    inject_torn_tail,
    postgres_unreachable,
    store_url,
    temporary_postgres_url,
)

__all__ = [
    "BUNDLED_BACKENDS",
    "BackendContract",
    "LogBuilder",
    "header",
    "inject_torn_tail",
    "make",
    "plain",
    "postgres_unreachable",
    "store_url",
    "temporary_postgres_url",
]

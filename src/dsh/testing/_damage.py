"""Damaged stores for reader fuzzing: byte edits, every read path, the property they check.

One vocabulary serves the bounded CI fuzz (``tests/persistence/test_reader_fuzz.py``, edits drawn
by hypothesis) and the long runs by hand (``tools/fuzz/fuzz_readers.py``, edits drawn by
:func:`random_edits`): an :data:`Edit` is ``(where, how, blob)`` and :func:`apply_edits` applies
a list of them. The property: any bytes where a log belongs give, on every path of
:data:`READ_PATHS`, success or a ``DshError``, never another exception.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Literal

from dsh._errors import DshError
from dsh.persistence import Persistence, open_backend
from dsh.session import Event, SessionStore
from dsh.testing._logs import LogBuilder

StoreKind = Literal["jsonl", "jsonl-zstd", "sqlite"]
STORE_KINDS: Final[tuple[StoreKind, ...]] = ("jsonl", "jsonl-zstd", "sqlite")
"""The file-backed layouts a reader is fuzzed on."""

EditKind = Literal["flip", "nul", "cut", "insert"]
EDIT_KINDS: Final[tuple[EditKind, ...]] = ("flip", "nul", "cut", "insert")

Edit = tuple[float, str, bytes]
"""``(where, how, blob)``: ``where`` in [0, 1] is the position as a fraction of the current
length; ``how`` is one of :data:`EDIT_KINDS`: ``flip`` XORs the byte there with ``blob[0]`` (1
if that is 0), ``nul`` overwrites ``len(blob)`` bytes with NUL, ``cut`` drops everything from
there, ``insert`` inserts ``blob`` there."""

READ_PATHS: Final = ("list_headers", "list", "read", "inspect", "load", "resume")
"""Every way a store reads a session, in the order :func:`read_every_way` runs them."""


def apply_edits(data: bytes, edits: Sequence[Edit]) -> bytes:
    """Return ``data`` with ``edits`` applied in order (see :data:`Edit`).

    Raises:
        ValueError: an edit's ``how`` is not one of :data:`EDIT_KINDS`.
    """
    out = bytearray(data)
    for where, how, blob in edits:
        pos = min(int(where * len(out)), max(len(out) - 1, 0))
        if how == "flip":
            if out:
                out[pos] ^= blob[0] or 1
        elif how == "nul":
            out[pos:pos + len(blob)] = b"\0" * len(out[pos:pos + len(blob)])
        elif how == "cut":
            del out[pos:]
        elif how == "insert":
            out[pos:pos] = blob
        else:
            raise ValueError(f"edit kind {how!r} is not one of {', '.join(EDIT_KINDS)}")
    return bytes(out)


def random_edits(rng: random.Random) -> list[Edit]:
    """One to three edits: a one-bit flip, a NUL run of 1-63 bytes, a cut or 1-7 new bytes."""
    edits: list[Edit] = []
    for _ in range(rng.randrange(1, 4)):
        how = rng.choice(EDIT_KINDS)
        blob = (bytes([1 << rng.randrange(8)]) if how == "flip"
                else b"\0" * rng.randrange(1, 64) if how == "nul"
                else rng.randbytes(rng.randrange(1, 8)))
        edits.append((rng.random(), how, blob))
    return edits


def fuzz_events(session_id: str = "s") -> list[Event]:
    """The log damaged by the fuzzers: three completed turns (chunks in the second), one open."""
    builder = LogBuilder(session_id)
    for i in range(3):
        builder.completed_turn(f"prompt {i}", chunks=4 if i == 1 else 0)
    builder.open_turn()
    return list(builder.events)


def store_url_of(kind: StoreKind, root: Path) -> str:
    """The store URL of layout ``kind`` at ``root`` (SQLite: the file ``root/store.db``)."""
    if kind == "sqlite":
        return f"sqlite://{root / 'store.db'}"
    return f"{'jsonl+zstd' if kind == 'jsonl-zstd' else 'jsonl'}://{root}"


def read_every_way(url: str, session_id: str = "s") -> list[str]:
    """Run every path of :data:`READ_PATHS` over ``session_id``, each on a fresh store.

    Returns:
        One outcome per path: ``ok`` or the ``code`` of the ``DshError`` it raised.

    Raises:
        Exception: whatever else a path raised (the property is broken), unchanged.
    """
    outcomes: list[str] = []
    for op in READ_PATHS:
        persistence = Persistence(open_backend(url))
        try:
            if op == "resume":
                store = SessionStore(persistence)
                persistence.resume(store, session_id)
                store.close()
            elif op in ("list_headers", "list"):
                getattr(persistence, op)()
            else:
                getattr(persistence, op)(session_id)
            outcomes.append("ok")
        except DshError as exc:
            outcomes.append(exc.code)
        finally:
            persistence.close()
    return outcomes

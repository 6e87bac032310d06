"""The damage campaign kept as tests: every store reader, any bytes at all.

* Property (hypothesis): for any bytes where a raw JSONL, zstd JSONL or SQLite log belongs,
  every read path (``read``, ``inspect``, ``list``, ``list_headers``, ``load``, ``resume``)
  either succeeds or raises a :class:`~dsh._errors.DshError`, never anything else.
* Corruption sweep per backend: every truncation offset of the last records, random byte flips
  and NUL runs over a stored log: the load returns exactly a committed prefix or raises
  ``LogCorruptError``, never altered or missing events silently, and no load ever removes a
  committed byte (what a repair cut is in the saved ``.torn-`` file).

``DSH_FUZZ_EXAMPLES`` sets the hypothesis examples and the sweep's flip/NUL counts (default 40).
"""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh._errors import LogCorruptError
from dsh.persistence import Persistence, open_backend
from dsh.persistence.jsonl._backend import JsonlBackend
from dsh.persistence.sqlite._backend import SqliteBackend
from dsh.session._events import Event
from dsh.testing import header
from dsh.testing._damage import (
    EDIT_KINDS,
    STORE_KINDS,
    Edit,
    StoreKind,
    apply_edits,
    fuzz_events,
    read_every_way,
    store_url_of,
)

EXAMPLES = int(os.environ.get("DSH_FUZZ_EXAMPLES", "40"))
SESSION = Path("--workspace-demo-app--") / "s"
KINDS = STORE_KINDS


EVENTS = fuzz_events()


def _store(kind: StoreKind, root: Path) -> Path:
    """Store EVENTS in 4 batches; return the log file (SQLite: the database)."""
    if kind == "sqlite":
        root.mkdir(mode=0o700, parents=True)
        backend: JsonlBackend | SqliteBackend = SqliteBackend(root / "store.db",
                                                              journal_mode="delete")
    else:
        backend = JsonlBackend(root, compression="zstd" if kind == "jsonl-zstd" else "none")
    backend.create(header("s"))
    step = len(EVENTS) // 4 + 1
    with backend.open("s", "write") as handle:
        for k in range(0, len(EVENTS), step):
            handle.append(EVENTS[k:k + step])
            handle.flush()
    backend.close()
    if kind == "sqlite":
        return root / "store.db"
    return root / SESSION / ("session.jsonl.zstd" if kind == "jsonl-zstd" else "session.jsonl")


_TEMPLATES: dict[str, tuple[Path, bytes, dict[str, bytes]]] = {}


def _template(kind: StoreKind, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes,
                                                                              dict[str, bytes]]:
    """A stored log per kind: its root, file bytes and sidecar files (name → bytes)."""
    if kind not in _TEMPLATES:
        root = tmp_path_factory.mktemp(f"template-{kind}") / "store"
        path = _store(kind, root)
        sidecars = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
                    if p.is_file() and p != path and "lock" not in p.name}
        _TEMPLATES[kind] = (root, path.read_bytes(), sidecars)
    return _TEMPLATES[kind]


def _place(kind: StoreKind, root: Path, data: bytes, sidecars: dict[str, bytes]) -> Path:
    if kind == "sqlite":
        root.mkdir(mode=0o700, parents=True)
        path = root / "store.db"
    else:
        path = root / SESSION / ("session.jsonl.zstd" if kind == "jsonl-zstd"
                                 else "session.jsonl")
        path.parent.mkdir(mode=0o700, parents=True)
    for name, content in sidecars.items():
        (root / name).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    path.write_bytes(data)
    os.chmod(path, 0o600)
    return path


def _all_readers(kind: StoreKind, root: Path) -> list[str]:
    """Every read path over session ``s``; returns the outcomes (ok or an error code)."""
    return read_every_way(store_url_of(kind, root))


# --- property: typed error or success, for any bytes -------------------------------------------

_FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture,
                                        HealthCheck.too_slow])

_edits = st.lists(st.tuples(st.floats(0, 1), st.sampled_from(EDIT_KINDS),
                            st.binary(min_size=1, max_size=8)), min_size=1, max_size=4)


@pytest.mark.parametrize("kind", KINDS)
@_FUZZ
@given(edits=_edits)
def test_damaged_logs_give_typed_errors_or_success(kind: StoreKind, edits: list[Edit],
                                                   tmp_path_factory: pytest.TempPathFactory
                                                   ) -> None:
    _, data, sidecars = _template(kind, tmp_path_factory)
    root = tmp_path_factory.mktemp("fuzz") / "store"
    _place(kind, root, apply_edits(data, edits), sidecars)
    assert len(_all_readers(kind, root)) == 6


_jsonish = st.recursive(
    st.none() | st.booleans() | st.integers(-2**60, 2**60) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["type", "seq", "time", "data", "turn", "step",
                                       "message", "callId", "seq0", "time0", "texts",
                                       "surfaceOp", "ignorable", "sourceEventSeqs"]),
                      inner, max_size=5), max_leaves=12)


@pytest.mark.parametrize("kind", ["jsonl", "jsonl-zstd"])
@_FUZZ
@given(records=st.lists(_jsonish, min_size=1, max_size=5), tail=st.binary(max_size=6))
def test_arbitrary_records_give_typed_errors_or_success(
        kind: StoreKind, records: list[object], tail: bytes,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    import json

    _, data, _ = _template(kind, tmp_path_factory)
    body = b"".join(json.dumps(r).encode() + b"\n" for r in records) + tail
    if kind == "jsonl-zstd":
        body = zstandard.ZstdCompressor(write_checksum=True).compress(body)
    root = tmp_path_factory.mktemp("records") / "store"
    _place(kind, root, data + body, {})  # no seal: as if another writer appended
    assert len(_all_readers(kind, root)) == 6


# --- corruption sweep: exactly a committed prefix, or LogCorruptError ---------------------------

def _load_checked(kind: StoreKind, root: Path, damaged: bytes, path: Path) -> list[Event] | None:
    """Load; check the result is a prefix of EVENTS and that no committed byte vanished."""
    persistence = Persistence(open_backend(store_url_of(kind, root)))
    try:
        loaded = persistence.load("s")
    except LogCorruptError:
        if kind != "sqlite":
            assert path.read_bytes() == damaged  # a refused log is left as it was
        return None
    finally:
        persistence.close()
    stored = list(loaded.stored_events)
    assert stored == EVENTS[:len(stored)], "a load returned altered events"
    if kind != "sqlite":
        now = path.read_bytes()
        cuts = [p.read_bytes() for p in path.parent.iterdir() if ".torn-" in p.name]
        assert len(cuts) <= 1
        kept = len(damaged) - len(cuts[0]) if cuts else len(damaged)
        assert damaged.endswith(cuts[0] if cuts else b"")
        assert now.startswith(damaged[:kept]), "a load removed a committed byte"
    return stored


def _sweep_cases(kind: StoreKind, data: bytes) -> list[bytes]:
    rng = random.Random(f"sweep-{kind}")
    cases: list[bytes] = []
    if kind != "sqlite":
        # every truncation offset of the last two records (raw) / last frame (zstd)
        last = data.rindex(b"\n", 0, data.rindex(b"\n", 0, len(data) - 1)) + 1 \
            if kind == "jsonl" else len(data) - 200
        cases += [data[:n] for n in range(max(last, 1), len(data))]
        # a torn fragment or NUL fill after the log
        cases += [data + b'{"type":"turn/st', data + b"\0" * 64]
    for _ in range(EXAMPLES * 5):
        damaged = bytearray(data)
        damaged[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        cases.append(bytes(damaged))
    for _ in range(EXAMPLES):
        damaged = bytearray(data)
        at = rng.randrange(len(data))
        damaged[at:at + rng.randrange(1, 64)] = b"\0" * len(damaged[at:at + 64])
        cases.append(bytes(damaged[:len(data)]))
    return cases


@pytest.mark.parametrize("kind", KINDS)
def test_corruption_sweep_never_returns_altered_or_missing_events(
        kind: StoreKind, tmp_path_factory: pytest.TempPathFactory) -> None:
    _, data, sidecars = _template(kind, tmp_path_factory)
    base = tmp_path_factory.mktemp(f"sweep-{kind}")
    full = corrupt = prefix = 0
    for index, damaged in enumerate(_sweep_cases(kind, data)):
        root = base / str(index)
        path = _place(kind, root, damaged, sidecars)
        stored = _load_checked(kind, root, damaged, path)
        if stored is None:
            corrupt += 1
        elif len(stored) == len(EVENTS):
            full += 1
        else:
            prefix += 1
        shutil.rmtree(root)
    assert corrupt > 0 and full + corrupt + prefix == len(_sweep_cases(kind, data))
    if kind != "sqlite":
        assert full > 0  # the appended fragment and NUL fill: the committed log, nothing more
    if kind == "jsonl":
        assert prefix == 0  # raw: every committed byte is sealed, so a cut is corruption


def test_sqlite_template_is_a_real_dsh_file(tmp_path_factory: pytest.TempPathFactory) -> None:
    root, _, _ = _template("sqlite", tmp_path_factory)
    conn = sqlite3.connect(root / "store.db")
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 17
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] > 0
    finally:
        conn.close()

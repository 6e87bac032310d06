"""Coverage-guided fuzzing of every store reader (atheris), for long runs by hand.

The property is the one ``tests/persistence/test_reader_fuzz.py`` checks in CI on a bounded
number of examples: any bytes where a raw JSONL log, a zstd JSONL log or a SQLite database
belongs give, on every read path (``list_headers``, ``list``, ``read``, ``inspect``, ``load``,
``resume``), success or a ``DshError``, never another exception. A load that succeeds must also
keep every byte it cut (a ``.torn-`` file beside the log). The first input byte picks the
backend; the rest is the file.

Usage (from the repository root, with ``pip install atheris``)::

    python tools/fuzz/fuzz_readers.py --seed-corpus CORPUS_DIR   # write real logs as seeds
    python tools/fuzz/fuzz_readers.py -atheris_runs=100000 -max_len=65536 CORPUS_DIR
    python tools/fuzz/fuzz_readers.py --replay FILE...            # re-check saved crashes
    python tools/fuzz/fuzz_readers.py --mutate 5000               # no atheris: random edits

``--mutate N`` applies N random flips, NUL runs, cuts and insertions to the seed logs and
prints the counts (iterations, typed errors, untyped errors); it needs no atheris.
A failure is raised as ``AssertionError`` so atheris saves the input as ``crash-*``.
"""

from __future__ import annotations

import random
import shutil
import sqlite3
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from dsh.persistence import Persistence, open_backend  # noqa: E402  (after the path setup above)
from dsh.testing._damage import (  # noqa: E402
    STORE_KINDS,
    StoreKind,
    apply_edits,
    fuzz_events,
    random_edits,
    read_every_way,
    store_url_of,
)

KINDS = STORE_KINDS
"""Backend chosen by the first input byte, modulo this list's length."""

_WORK = Path(tempfile.mkdtemp(prefix="dsh-fuzz-readers-"))
_SESSION = Path("--w-p--") / "s"


def _layout(kind: StoreKind, root: Path) -> tuple[Path, str]:
    """The log file of layout ``kind`` under ``root``, and its store URL."""
    if kind == "sqlite":
        return root / "store.db", store_url_of(kind, root)
    name = "session.jsonl.zstd" if kind == "jsonl-zstd" else "session.jsonl"
    return root / _SESSION / name, store_url_of(kind, root)


def check(data: bytes) -> str:
    """Run every reader over ``data``; return ``ok`` or the first error code.

    Raises:
        AssertionError: an exception that is not a ``DshError``, or a load that removed bytes
            without saving them.
    """
    if not data:
        return "empty"
    kind = KINDS[data[0] % len(KINDS)]
    body = data[1:]
    root = _WORK / "store"
    shutil.rmtree(root, ignore_errors=True)
    path, url = _layout(kind, root)
    path.parent.mkdir(mode=0o700, parents=True)
    path.write_bytes(body)
    path.chmod(0o600)
    try:
        outcomes = read_every_way(url)
    except BaseException as exc:  # the property: nothing but DshError
        raise AssertionError(f"{kind}: untyped {exc!r}") from exc
    if kind != "sqlite":
        cut = b"".join(p.read_bytes() for p in path.parent.glob("*.torn-*"))
        kept = len(body) - len(cut)
        assert body.endswith(cut) and path.read_bytes().startswith(body[:kept]), \
            "a read removed committed bytes without saving them"
    return next((outcome for outcome in outcomes if outcome != "ok"), "ok")


def _seeds() -> list[bytes]:
    """Real logs of each backend (prefixed with their backend byte)."""
    events = fuzz_events()
    out = []
    for index, kind in enumerate(KINDS):
        root = _WORK / f"seed-{kind}"
        root.mkdir(mode=0o700)
        path, url = _layout(kind, root)
        persistence = Persistence(open_backend(url))
        persistence.create({"version": 0, "id": "s", "createdAt": 1, "cwd": "/w/p"})
        with persistence.open("s", "write") as handle:
            for k in range(0, len(events), 9):
                handle.append(events[k:k + 9])
                handle.flush()
        persistence.close()
        if kind == "sqlite":  # fold the WAL into the file: the seed is one file
            conn = sqlite3.connect(path)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.close()
        out.append(bytes([index]) + path.read_bytes())
    return out


def _mutate(seed: bytes, rng: random.Random) -> bytes:
    """The seed's backend byte, then its file with the CI fuzz's kinds of edits (random)."""
    return seed[:1] + apply_edits(seed[1:], random_edits(rng))


def main() -> None:
    """Dispatch ``--seed-corpus``, ``--replay``, ``--mutate`` or atheris."""
    args = sys.argv[1:]
    if args[:1] == ["--seed-corpus"]:
        corpus = Path(args[1])
        corpus.mkdir(parents=True, exist_ok=True)
        for index, seed in enumerate(_seeds()):
            (corpus / f"seed-{KINDS[index]}").write_bytes(seed)
        args = ["-atheris_runs=0", *args[1:]]
    if args[:1] == ["--replay"]:
        for name in args[1:]:
            print(name, check(Path(name).read_bytes()))
        return
    if args[:1] == ["--mutate"]:
        rng = random.Random(8)
        seeds = _seeds()
        outcomes: Counter[str] = Counter()
        for _ in range(int(args[1])):
            try:
                outcomes[check(_mutate(rng.choice(seeds), rng))] += 1
            except AssertionError as exc:
                outcomes[f"UNTYPED {exc}"] += 1
        untyped = sum(v for k, v in outcomes.items() if k.startswith("UNTYPED"))
        print(f"iterations {int(args[1])}, untyped errors {untyped}")
        for code, count in outcomes.most_common():
            print(f"  {count:6d} {code}")
        return
    import atheris

    atheris.Setup([sys.argv[0], *args], check)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

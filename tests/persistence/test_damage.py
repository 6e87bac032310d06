"""Damage never deletes or hides committed events: reproducers as regression tests.

zstd middle-frame damage is corruption, never a torn tail (item 1); what a repair cuts is saved
beside the log first and ``dsh verify`` lists it (item 2); a NUL-filled tail after the last
zstd frame is torn (item 6).
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from dsh._errors import LogCorruptError
from dsh.json import dumps
from dsh.persistence import Persistence, open_backend
from dsh.persistence.jsonl._backend import JsonlBackend
from dsh.persistence.jsonl._format import scan_zstd_frames
from dsh.persistence.sqlite._backend import SqliteBackend
from dsh.session._events import Event
from dsh.testing import LogBuilder, header, make
from dsh.testing._damage import read_every_way
from tests.persistence import _seal_layout

SESSION_DIR = Path("--workspace-demo-app--") / "s"


def _four_batches(backend: JsonlBackend | SqliteBackend) -> list[int]:
    """Store 4 completed turns as 4 durable batches; return the seq each batch starts at."""
    builder = LogBuilder()
    for i in range(4):
        builder.completed_turn(f"prompt {i}")
    events = builder.events
    step = len(events) // 4
    backend.create(header("s"))
    with backend.open("s", "write") as handle:
        for k in range(4):
            handle.append(list(events[k * step:(k + 1) * step if k < 3 else len(events)]))
            handle.flush()
    return [k * step for k in range(4)]


def _zstd_log(tmp_path: Path) -> tuple[JsonlBackend, Path]:
    backend = JsonlBackend(tmp_path / "root", compression="zstd")
    _four_batches(backend)
    return backend, tmp_path / "root" / SESSION_DIR / "session.jsonl.zstd"


def _cuts(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if ".torn-" in p.name)


# --- item 1: a damaged middle frame is corruption ------------------------------------------

def test_zstd_damaged_middle_frame_header_is_corruption_and_nothing_is_truncated(
        tmp_path: Path) -> None:
    backend, path = _zstd_log(tmp_path)
    data = path.read_bytes()
    frames, torn = scan_zstd_frames(data, path=str(path))
    assert torn is None and len(frames) == 5  # header frame + one per batch
    start = frames[2][0]  # a middle frame: complete frames follow it
    url = f"jsonl+zstd://{tmp_path}/root"
    # every bit of the frame header and first block header (the block-size field included)
    for pos in range(start + 4, start + 12):
        for bit in range(8):
            damaged = bytearray(data)
            damaged[pos] ^= 1 << bit
            path.write_bytes(bytes(damaged))
            with backend.open("s") as handle, pytest.raises(LogCorruptError) as caught:
                handle.read()
            assert caught.value.where["path"] == str(path)
            assert isinstance(caught.value.where["byte_offset"], int)
            with pytest.raises(LogCorruptError):
                Persistence(open_backend(url)).load("s")  # load would truncate a torn tail
            assert path.read_bytes() == bytes(damaged), (pos, bit)
    assert _cuts(path.parent) == []


def test_zstd_block_size_grown_past_later_frames_names_the_damaged_frame(tmp_path: Path) -> None:
    # the reproducer: a block-size field grown so the frame seems to run past the file's end
    backend, path = _zstd_log(tmp_path)
    data = path.read_bytes()
    frames, _ = scan_zstd_frames(data, path=str(path))
    start = frames[1][0]
    descriptor = data[start + 4]
    header_len = 4 + 1 + (0 if descriptor & 0x20 else 1) + (0, 1, 2, 4)[descriptor & 3] \
        + ((1 if descriptor & 0x20 else 0), 2, 4, 8)[descriptor >> 6]
    block = start + header_len
    damaged = bytearray(data)
    damaged[block + 2] |= 0x1F  # block size += ~64 KiB: the walker runs off the end
    path.write_bytes(bytes(damaged))
    with backend.open("s", "write") as handle, pytest.raises(LogCorruptError) as caught:
        handle.read()
    assert caught.value.where["byte_offset"] == start
    assert f"frame at byte {start} is damaged" in caught.value.message
    assert path.read_bytes() == bytes(damaged)


def test_zstd_frame_without_content_checksum_is_corruption(tmp_path: Path) -> None:
    import zstandard

    backend, path = _zstd_log(tmp_path)
    with open(path, "ab") as f:
        f.write(zstandard.ZstdCompressor(write_checksum=False).compress(b"x"))
    with backend.open("s") as handle, pytest.raises(LogCorruptError, match="no content checksum"):
        handle.read()


# --- item 6: NUL bytes after the last zstd frame are a torn tail ----------------------------

@pytest.mark.parametrize("zeros", [1, 3, 4, 4096])
def test_zstd_nul_filled_tail_is_torn_and_saved_before_truncation(tmp_path: Path,
                                                                   zeros: int) -> None:
    backend, path = _zstd_log(tmp_path)
    original = path.read_bytes()
    with backend.open("s") as handle:
        events = handle.read().events
    path.write_bytes(original + b"\0" * zeros)
    with backend.open("s", "write") as handle:
        cold = handle.read()
        assert cold.torn is not None and cold.torn.byte_offset == len(original)
        assert cold.events == events
        handle.append([])  # the repair
    assert path.read_bytes() == original
    [cut] = _cuts(path.parent)
    assert cut.read_bytes() == b"\0" * zeros
    assert cut.stat().st_mode & 0o777 == 0o600


def test_zstd_nul_run_inside_the_log_is_still_corruption(tmp_path: Path) -> None:
    backend, path = _zstd_log(tmp_path)
    data = path.read_bytes()
    frames, _ = scan_zstd_frames(data, path=str(path))
    start, end = frames[3]
    path.write_bytes(data[:start] + b"\0" * (end - start) + data[end:])
    with backend.open("s") as handle, pytest.raises(LogCorruptError) as caught:
        handle.read()
    assert caught.value.where["byte_offset"] == start


# --- item 2: what a repair cuts is saved beside the log first -------------------------------

def test_raw_torn_tail_is_saved_beside_the_log_before_truncation(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path / "root")
    _four_batches(backend)
    path = tmp_path / "root" / SESSION_DIR / "session.jsonl"
    committed = path.read_bytes()
    fragment = b'{"type":"turn/start","seq":24,"ti'
    path.write_bytes(committed + fragment)
    assert backend.saved_cuts("s") == []
    resumed = Persistence(open_backend(f"jsonl://{tmp_path}/root")).load("s")
    assert resumed.torn is not None
    assert path.read_bytes() == committed
    [cut] = _cuts(path.parent)
    assert cut.read_bytes() == fragment
    assert cut.name.startswith("session.jsonl.torn-") and cut.name.endswith(f"-{os.getpid()}")
    assert backend.saved_cuts("s") == [str(cut)]


def test_zstd_torn_frame_is_saved_beside_the_log(tmp_path: Path) -> None:
    import zstandard

    _, path = _zstd_log(tmp_path)
    committed = path.read_bytes()
    frame = zstandard.ZstdCompressor(write_checksum=True).compress(b'{"type":"turn/st')
    path.write_bytes(committed + frame[:-3])
    Persistence(open_backend(f"jsonl+zstd://{tmp_path}/root")).load("s")
    assert path.read_bytes() == committed
    [cut] = _cuts(path.parent)
    assert cut.read_bytes() == frame[:-3]


def test_sqlite_torn_rows_are_saved_beside_the_database(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    backend = SqliteBackend(db)
    _four_batches(backend)
    backend.inject_torn_tail("s")
    with backend.open("s", "write") as handle:
        cold = handle.read()
        assert cold.torn is not None
        count = len(cold.events)
        handle.append([make("todo/write", count, {})])
    [saved] = backend.saved_cuts("s")
    assert Path(saved).parent == tmp_path / "store.db.dsh-cuts"
    assert (tmp_path / "store.db.dsh-cuts").stat().st_mode & 0o777 == 0o700
    text = Path(saved).read_text()
    assert f'"seq": {count}' in text and text.endswith("\n")
    backend.close()


def test_dsh_verify_lists_saved_cuts(tmp_path: Path) -> None:
    backend = JsonlBackend(tmp_path / "root")
    _four_batches(backend)
    path = tmp_path / "root" / SESSION_DIR / "session.jsonl"
    path.write_bytes(path.read_bytes() + b'{"type":"tu')
    Persistence(open_backend(f"jsonl://{tmp_path}/root")).load("s")
    [cut] = _cuts(path.parent)
    env = {**os.environ, "DSH_HOME": str(tmp_path / "home"), "HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "dsh.cli", "verify", "s", "--store",
                           f"jsonl://{tmp_path}/root"], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert str(cut) in proc.stderr and "torn-tail repair cut" in proc.stderr


# --- item 5: every committed raw JSONL byte is sealed ---------------------------------------

def _raw_log(tmp_path: Path) -> tuple[JsonlBackend, Path]:
    backend = JsonlBackend(tmp_path / "root")
    _four_batches(backend)
    return backend, tmp_path / "root" / SESSION_DIR / "session.jsonl"


def test_raw_seal_has_one_record_per_durable_batch_from_byte_zero(tmp_path: Path) -> None:
    from dsh.persistence._seal import read_seal

    _, path = _raw_log(tmp_path)
    seal = read_seal(path.with_name("session.jsonl.seal"))
    assert seal is not None and len(seal.records) == 4
    assert seal.records[0][0] == 0 and seal.end == path.stat().st_size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(seal.records))


def test_raw_every_committed_byte_flip_is_corruption(tmp_path: Path) -> None:
    backend, path = _raw_log(tmp_path)
    data = path.read_bytes()
    rng = random.Random(8)
    for pos in sorted(rng.sample(range(len(data)), 150)):
        damaged = bytearray(data)
        damaged[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(damaged))
        with backend.open("s") as handle, pytest.raises(LogCorruptError) as caught:
            handle.read()
        assert caught.value.where["path"] == str(path)
        assert caught.value.where["byte_offset"] <= pos
        assert isinstance(caught.value.where["line"], int)
    path.write_bytes(data)


def test_raw_sealed_bytes_cut_off_are_corruption_and_the_log_is_not_repaired(
        tmp_path: Path) -> None:
    _, path = _raw_log(tmp_path)
    data = path.read_bytes()
    last_line = data.rindex(b"\n", 0, len(data) - 1) + 1
    path.write_bytes(data[:last_line])  # a whole committed record gone: no reader rule sees it
    with pytest.raises(LogCorruptError, match="committed data was cut off"):
        Persistence(open_backend(f"jsonl://{tmp_path}/root")).load("s")
    assert path.read_bytes() == data[:last_line]


def test_raw_bytes_another_writer_appended_are_read_then_sealed(tmp_path: Path) -> None:
    # dsh itself appends without a seal: the unsealed tail is read by the format rules, and
    # the next write through us seals it together with its own batch
    from dsh.persistence._seal import read_seal

    backend, path = _raw_log(tmp_path)
    with backend.open("s") as handle:
        count = len(handle.read().events)
    extra = dumps(make("todo/write", count, {})) + b"\n"
    with open(path, "ab") as f:
        f.write(extra)
    with backend.open("s", "write") as handle:
        assert len(handle.read().events) == count + 1
        handle.append([make("todo/write", count + 1, {})])
        handle.flush()
    seal = read_seal(path.with_name("session.jsonl.seal"))
    assert seal is not None and seal.end == path.stat().st_size and len(seal.records) == 5


@pytest.mark.parametrize("tail", [b"\0" * 20, b"\x01\x02\x03", b"\0" * 7])
def test_raw_seal_damaged_by_a_crash_is_ignored_and_rewritten(tmp_path: Path,
                                                              tail: bytes) -> None:
    from dsh.persistence._seal import read_seal

    backend, path = _raw_log(tmp_path)
    seal_path = path.with_name("session.jsonl.seal")
    with open(seal_path, "ab") as f:
        f.write(tail)
    with backend.open("s", "write") as handle:
        count = len(handle.read().events)
        handle.append([make("todo/write", count, {})])
        handle.flush()
    seal = read_seal(seal_path)
    assert seal is not None and seal.end == path.stat().st_size
    layout = _seal_layout.positions(seal_path.read_bytes())
    assert [kind for kind, _, _ in layout].count("range") == len(seal.records)
    assert layout[-1][1] + layout[-1][2] == seal_path.stat().st_size  # the torn tail is gone


def test_raw_seal_that_is_not_a_seal_is_reported(tmp_path: Path) -> None:
    backend, path = _raw_log(tmp_path)
    path.with_name("session.jsonl.seal").write_bytes(b"garbage, not a seal at all")
    with backend.open("s") as handle, pytest.raises(LogCorruptError) as caught:
        handle.read()
    assert caught.value.code == "SEAL_CORRUPT" and "move it aside" in caught.value.message


# --- items 4, 5, 7: SQLite reads prove they saw every committed row -------------------------

def _sqlite_log(tmp_path: Path, turns: int = 4) -> tuple[Path, list[Event]]:
    import sqlite3

    root = tmp_path / "db"
    root.mkdir(mode=0o700)
    db = root / "store.db"
    backend = SqliteBackend(db)
    builder = LogBuilder()
    for i in range(turns):
        builder.completed_turn(f"prompt {i}")
    events = list(builder.events)
    backend.create(header("s"))
    with backend.open("s", "write") as handle:
        for k in range(0, len(events), 50):
            handle.append(events[k:k + 50])
    backend.close()
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return db, events


def _read_sqlite(db: Path) -> list[Event]:
    backend = SqliteBackend(db)
    try:
        with backend.open("s") as handle:
            return list(handle.read().events)
    finally:
        backend.close()


def test_sqlite_damaged_events_index_is_corruption_never_a_short_log(tmp_path: Path) -> None:
    import sqlite3

    db, events = _sqlite_log(tmp_path, turns=100)
    conn = sqlite3.connect(db)
    leaves = [p for (p,) in conn.execute(
        "SELECT pageno FROM dbstat WHERE name = 'sqlite_autoindex_events_1' "
        "AND pagetype = 'leaf'")]
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    assert len(leaves) >= 2
    original = db.read_bytes()
    rng = random.Random(4)
    outcomes: list[str] = []
    for page in leaves[:2]:
        for _ in range(15):
            damaged = bytearray(original)
            damaged[(page - 1) * page_size + rng.randrange(8, page_size)] ^= 1 << rng.randrange(8)
            db.write_bytes(bytes(damaged))
            try:
                read = _read_sqlite(db)
            except LogCorruptError as exc:
                assert exc.where["path"] == str(db)
                outcomes.append("missing" if "are missing" in exc.message else "corrupt")
                continue
            assert read == events  # a flip the read survives changes nothing
            outcomes.append("full")
    assert "missing" in outcomes  # the seal caught rows a damaged index hid


def test_sqlite_edited_row_columns_are_corruption(tmp_path: Path) -> None:
    import sqlite3

    for index, statement in enumerate((
            "UPDATE events SET time = time + 1 WHERE seq = 7",
            "UPDATE events SET type = 'session/title' WHERE seq = 2",
            "UPDATE events SET data = replace(data, 'prompt 1', 'prompt 9')",
            "DELETE FROM events WHERE seq = (SELECT max(seq) FROM events)")):
        (tmp_path / str(index)).mkdir()
        db, _ = _sqlite_log(tmp_path / str(index))
        conn = sqlite3.connect(db)
        conn.execute(statement)
        conn.commit()
        conn.close()
        with pytest.raises(LogCorruptError) as caught:
            _read_sqlite(db)
        assert caught.value.where["session_id"] == "s", statement


def test_sqlite_append_over_hidden_rows_is_corruption_not_a_stale_writer(tmp_path: Path) -> None:
    import sqlite3

    db, events = _sqlite_log(tmp_path)
    conn = sqlite3.connect(db)
    conn.execute("DELETE FROM events WHERE seq >= 20")
    conn.commit()
    conn.close()
    backend = SqliteBackend(db)
    with backend.open("s", "write") as handle, pytest.raises(LogCorruptError) as caught:
        handle.append([make("todo/write", len(events), {})])
    assert caught.value.where["seq"] == 20 and "committed" in caught.value.message
    backend.close()


def test_sqlite_damaged_store_identity_is_corruption(tmp_path: Path) -> None:
    import sqlite3

    db, _ = _sqlite_log(tmp_path)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE persistence_state SET store_id = 'not-a-uuid'")
    conn.commit()
    conn.close()
    with pytest.raises(LogCorruptError, match="quick_check says: ok"):
        _read_sqlite(db)


def test_sqlite_malformed_file_is_corruption(tmp_path: Path) -> None:
    db, _ = _sqlite_log(tmp_path)
    data = bytearray(db.read_bytes())
    data[4096:8192] = b"\xff" * 4096  # page 2 destroyed
    db.write_bytes(bytes(data))
    with pytest.raises(LogCorruptError):
        _read_sqlite(db)


# --- item 8: store readers never raise an untyped error -------------------------------------

_HEADER = b'{"type":"session","version":0,"id":"s","createdAt":1,"delegationDepth":0}\n'
_OPEN_TURN = (b'{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}\n'
              b'{"type":"step/start","seq":1,"time":1,"data":{"turn":1,"step":1}}\n')


@pytest.mark.parametrize("body", [
    b'{"type":1,"seq":0,"time":1,"data":{}}\n',
    b'{"type":["todo/write"],"seq":0,"time":1,"data":{}}\n',
    b'{"type":{"x":1},"seq":0,"time":1,"data":{},"ignorable":true}\n',
    _OPEN_TURN + b'{"type":"tool/call","seq":2,"time":1,"data":{"turn":1,"step":1,'
                 b'"callId":["c"],"name":"x","arguments":"{}"}}\n',
    _OPEN_TURN + b'{"type":"tool/result","seq":2,"time":1,"data":{"turn":1,"step":1,'
                 b'"message":{"id":"r","role":"user","content":[],"source":{"kind":"tool",'
                 b'"callId":{"a":1}}}}}\n',
    b'{"type":"todo/write","seq":0,"time":1,"data":' + b"[" * 50_000 + b"]" * 50_000 + b"}\n",
    b'{"type":"todo/write","seq":0,"time":1,"data":' + b'{"a":' * 30_000 + b"1"
    + b"}" * 30_000 + b"}\n",
], ids=["type-int", "type-list", "type-object", "callid-list", "result-callid-object",
        "deep-array", "deep-object"])
def test_hostile_records_give_typed_errors_or_success(tmp_path: Path, body: bytes) -> None:
    folder = tmp_path / "root" / "_no-cwd" / "s"
    folder.mkdir(parents=True)
    (folder / "session.jsonl").write_bytes(_HEADER + body)
    outcomes = read_every_way(f"jsonl://{tmp_path / 'root'}")
    assert len(outcomes) == 6  # every reader returned or raised a DshError


def test_record_with_a_non_string_type_is_not_an_event(tmp_path: Path) -> None:
    from dsh.persistence.jsonl._backend import parse_log

    data = _HEADER + b'{"type":["a"],"seq":0,"time":1,"data":{}}\n' \
        + b'{"type":"todo/write","seq":0,"time":1,"data":{}}\n'
    with pytest.raises(LogCorruptError, match="type is not a string") as caught:
        parse_log(data, compression="none", path="p")
    assert caught.value.where["line"] == 2


def test_verify_reports_a_non_string_type_as_a_violation() -> None:
    from dsh._verify import verify_events

    found = verify_events([{"type": ["a"], "seq": 0, "time": 1, "data": {}}])
    assert [v.rule for v in found] == ["INVALID_LOG"] and "not a string" in found[0].message


def test_sqlite_damaged_schema_text_is_corruption(tmp_path: Path) -> None:
    db, _ = _sqlite_log(tmp_path)
    data = bytearray(db.read_bytes())
    at = data.index(b"delegation_depth INTEGER") + len("delegation_depth IN")
    data[at] = 0xC5  # not UTF-8: SQLite's own error message quotes it
    db.write_bytes(bytes(data))
    with pytest.raises(LogCorruptError, match="damaged"):
        _read_sqlite(db)


# --- item 10: one id rule on every backend ---------------------------------------------------

_BAD_IDS = {"too-long-ascii": "a" * 256, "too-long-encoded": "é" * 52,
            "lone-surrogate": "id-\ud800"}
_GOOD_IDS = {"longest-ascii": "a" * 255, "longest-encoded": "é" * 51, "pair": "id-\U0001f600"}


@pytest.mark.parametrize("name", sorted(_BAD_IDS))
def test_ids_no_backend_can_store_are_refused_alike(backend_kind: str, tmp_path: Path,
                                                    name: str) -> None:
    from dsh._errors import ConfigError, EventRejectedError

    from .conftest import store_url

    sid = _BAD_IDS[name]
    persistence = Persistence(open_backend(store_url(backend_kind, tmp_path)))
    try:
        with pytest.raises(EventRejectedError) as caught:
            persistence.create(header(sid))
        assert caught.value.code == "HEADER" and "storable on every backend" in caught.value.message
        assert persistence.exists(sid) is False
        if backend_kind != "memory":
            with pytest.raises(ConfigError) as refused:
                persistence.open(sid)
            assert refused.value.code == "INVALID_ID"
    finally:
        persistence.close()


@pytest.mark.parametrize("name", sorted(_GOOD_IDS))
def test_ids_at_the_limit_are_stored_on_every_backend(backend_kind: str, tmp_path: Path,
                                                      name: str) -> None:
    from .conftest import store_url

    sid = _GOOD_IDS[name]
    persistence = Persistence(open_backend(store_url(backend_kind, tmp_path)))
    try:
        persistence.create(header(sid))
        with persistence.open(sid, "write") as handle:
            handle.read()
            handle.append([make("todo/write", 0, {})])
            handle.flush()
        with persistence.open(sid) as handle:
            assert len(handle.read().events) == 1
    finally:
        persistence.close()


# --- item 11: no symlink where a store file or folder belongs; folders 0700 ------------------

def test_store_root_and_project_folders_are_private(tmp_path: Path) -> None:
    _raw_log(tmp_path)
    root = tmp_path / "root"
    for folder in (root, root / SESSION_DIR.parent, root / SESSION_DIR):
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    for name in ("session.jsonl", "session.lock", "session.jsonl.seal"):
        assert (root / SESSION_DIR / name).stat().st_mode & 0o777 == 0o600, name


@pytest.mark.parametrize("where", ["session folder", "session log", "project folder",
                                   "lock file"])
def test_jsonl_symlinks_in_the_store_are_refused(tmp_path: Path, where: str) -> None:
    from dsh._errors import PersistenceError

    _, path = _raw_log(tmp_path)
    outside = tmp_path / "outside"
    victim = {"session folder": path.parent, "session log": path,
              "project folder": path.parent.parent, "lock file": path.with_name("session.lock")
              }[where]
    victim.rename(outside)
    victim.symlink_to(outside)
    before = outside.stat().st_mtime_ns
    with pytest.raises(PersistenceError) as caught, \
            JsonlBackend(tmp_path / "root").open("s", "write") as handle:
        handle.read()
        handle.append([make("todo/write", 24, {})])
    assert caught.value.code == "SYMLINK" and str(victim) in caught.value.message
    assert outside.stat().st_mtime_ns == before


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_jsonl_a_fifo_or_folder_where_the_log_belongs_is_named_not_waited_on(
        tmp_path: Path, kind: str) -> None:
    # before: opening a FIFO there blocked every reader (dsh show, ls, verify, view) forever,
    # and a folder was error[BUG] IsADirectoryError
    import threading

    from dsh._errors import PersistenceError

    backend, path = _raw_log(tmp_path)
    path.unlink()
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    outcome: list[object] = []

    def read_it() -> None:
        try:
            with backend.open("s", "read") as handle:
                handle.read()
        except Exception as exc:
            outcome.append(exc)
        try:
            outcome.append(list(backend.list_headers()))
        except Exception as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read_it, daemon=True)
    reader.start()
    reader.join(30)
    if reader.is_alive() and kind == "fifo":  # let the blocked open go, then fail the test
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    assert not reader.is_alive(), "a reader blocked on what sits where the log belongs"
    refused, listed = outcome
    assert isinstance(refused, PersistenceError) and refused.code == "NOT_A_FILE"
    assert str(path) in refused.message
    assert ("FIFO" if kind == "fifo" else "folder") in refused.message
    assert [h["id"] for h in listed] == ["s"]  # still listed, so verify --all names it
    verified = subprocess.run([sys.executable, "-m", "dsh.cli", "verify", "--all", "--store",
                               f"jsonl:{tmp_path / 'root'}"], capture_output=True, text=True,
                              timeout=60)
    assert verified.returncode == 1
    assert "s seq - NOT_A_FILE: " in verified.stdout and "error[BUG]" not in verified.stderr


def test_sqlite_symlinked_lock_folder_is_refused(tmp_path: Path) -> None:
    from dsh._errors import PersistenceError

    db, _ = _sqlite_log(tmp_path)
    locks = db.with_name("store.db.dsh-locks")
    outside = tmp_path / "elsewhere"
    locks.rename(outside)
    locks.symlink_to(outside)
    backend = SqliteBackend(db)
    with pytest.raises(PersistenceError) as caught:
        backend.open("s", "write")
    assert caught.value.code == "SYMLINK"
    backend.close()

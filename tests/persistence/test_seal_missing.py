"""A lost seal cannot switch integrity off (docs/formats.md#integrity-seals).

A raw JSONL log this library writes says in its header line that its writers seal it
(``"dshSeal": 1``), and its seal exists before the log is linked into place. A reader that then
finds no seal refuses the log (``SEAL_MISSING``, naming the seal) instead of reading it
unverified, and a writer refuses to seal its bytes again; only ``dsh verify --reseal`` rebuilds
it. Real files: the campaign's reproducer deletes the seal and flips bytes in the log, which
used to load changed events in about one flip in six. ``DSH_CRASH_RUNS`` raises the flip count.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh import LogCorruptError
from dsh.persistence.jsonl import _backend as jsonl_backend
from dsh.persistence.jsonl._format import SEAL_MARK
from dsh.rights import redact

FLIPS = int(os.environ.get("DSH_CRASH_RUNS", "12"))


def user(text: str) -> dict[str, Any]:
    return {"id": f"u-{text}", "role": "user", "source": {"kind": "user"},
            "content": [{"type": "text", "text": text}]}


def _write(root: Path, count: int = 8) -> tuple[str, Path, Path]:
    url = f"jsonl://{root}/store"
    with dsh.open(url) as store:
        session = store.session("s1")
        for n in range(count):
            session.append("user/message", user(f"message {n:03d}"), surface_op="append")
            store.flush(session)
    [log] = (root / "store").glob("*/*/session.jsonl")
    return url, log, log.with_name("session.jsonl.seal")


def _texts(url: str) -> list[str]:
    with dsh.open(url) as store:
        return [e["data"]["content"][0]["text"] for e in store.read("s1").events
                if e["type"] == "user/message"]


def test_a_new_raw_log_is_marked_and_its_seal_exists(tmp_path: Path) -> None:
    _, log, seal = _write(tmp_path)
    assert log.read_bytes().split(b"\n", 1)[0].endswith(SEAL_MARK[:-1])
    assert seal.is_file()


@pytest.mark.parametrize("damage", ["deleted", "emptied", "header only"])
def test_a_missing_seal_refuses_reads_and_writes_and_is_never_resealed(
        tmp_path: Path, damage: str) -> None:
    url, _log, seal = _write(tmp_path)
    if damage == "deleted":
        seal.unlink()
    elif damage == "emptied":
        seal.write_bytes(b"")
    else:
        seal.write_bytes(seal.read_bytes()[:12])  # magic and identity, no record
    for attempt in range(2):
        with pytest.raises(LogCorruptError) as refused, dsh.open(url) as store:
            if attempt == 0:
                store.read("s1")
            else:  # a writer: resume, append, flush
                session = store.session("s1")
                session.append("user/message", user("more"), surface_op="append")
                store.flush(session)
        assert refused.value.code == "SEAL_MISSING"
        assert refused.value.where["path"] == str(seal)
        assert "dsh verify --reseal s1" in refused.value.message
    assert not seal.exists() or len(seal.read_bytes()) <= 12  # nobody sealed it again


def test_byte_flips_in_a_log_whose_seal_is_lost_never_load_changed_events(
        tmp_path: Path) -> None:
    """The campaign's reproducer: the seal deleted, one byte of the log changed."""
    url, log, seal = _write(tmp_path, 12)
    original = log.read_bytes()
    body = original.index(b"\n") + 1
    seal.unlink()
    step = max(1, (len(original) - body) // FLIPS)
    for offset in range(body, len(original) - 1, step):
        flipped = bytearray(original)
        flipped[offset] ^= 0x04
        log.write_bytes(bytes(flipped))
        with pytest.raises(LogCorruptError) as refused:  # main: some flips loaded silently
            _texts(url)
        assert refused.value.code in ("SEAL_MISSING", "LOG_CORRUPT"), refused.value.code


def test_an_edit_of_the_mark_itself_is_damage_while_the_seal_exists(tmp_path: Path) -> None:
    """With the seal present, the header line is sealed like every other byte."""
    url, log, _ = _write(tmp_path)
    data = bytearray(log.read_bytes())
    data[data.index(b"dshSeal") + 1] ^= 0x01  # one letter of the key changed
    log.write_bytes(bytes(data))
    with pytest.raises(LogCorruptError):
        _texts(url)


def test_an_unmarked_log_without_a_seal_still_reads(tmp_path: Path) -> None:
    """A log dsh (or an older writer) wrote carries no mark: no seal is expected."""
    url, log, seal = _write(tmp_path)
    seal.unlink()
    data = log.read_bytes()
    head, rest = data.split(b"\n", 1)
    assert head.endswith(SEAL_MARK[:-1])
    log.write_bytes(head[:-(len(SEAL_MARK) - 1)] + b"}\n" + rest)
    assert _texts(url) == [f"message {n:03d}" for n in range(8)]
    with dsh.open(url) as store:  # and the next writer seals it, as before
        session = store.session("s1")
        session.append("user/message", user("more"), surface_op="append")
        store.flush(session)
    assert seal.is_file()


def test_a_resume_through_a_restore_point_refuses_a_missing_seal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dsh.persistence import _restore_point as rp

    monkeypatch.setattr(rp, "RESTORE_POINT_EVERY_EVENTS", 1)
    url, log, seal = _write(tmp_path)
    assert list(log.parent.glob("*.ckpt"))
    seal.unlink()
    with pytest.raises(LogCorruptError) as refused, dsh.open(url) as store:
        store.session("s1")
    assert refused.value.code == "SEAL_MISSING"


def test_the_seal_is_in_place_before_the_log_is_linked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash between the two leaves a seal and no log, never a marked log without seal."""
    seen: list[bool] = []
    real = os.link

    def link(src: Any, dst: Any, **kw: Any) -> None:
        seen.append(Path(dst).with_name("session.jsonl.seal").is_file())
        raise OSError(5, "I/O error (injected)")

    monkeypatch.setattr(jsonl_backend.os, "link", link)
    url = f"jsonl://{tmp_path}/store"
    with dsh.open(url) as store:
        session = store.session("s1")
        session.append("user/message", user("a"), surface_op="append")
        with pytest.raises(dsh.WriteFailedError):
            store.flush(session)
        assert seen and all(seen)
        assert not list((tmp_path / "store").glob("*/*/session.jsonl*"))  # nothing left behind
        monkeypatch.setattr(jsonl_backend.os, "link", real)
        store.flush(session)
    assert _texts(url) == ["a"]
    assert list((tmp_path / "store").glob("*/*/session.jsonl.seal"))


def test_dsh_verify_names_a_missing_seal_and_reseal_rebuilds_it(tmp_path: Path) -> None:
    url, _log, seal = _write(tmp_path)
    seal.unlink()
    env = {**os.environ, "DSH_HOME": str(tmp_path / "home"), "NO_COLOR": "1"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dsh.cli", *args, "--store", url],
                              capture_output=True, text=True, env=env, timeout=120, check=False)

    refused = run("verify", "s1")
    assert refused.returncode == 1, refused.stderr
    assert "SEAL_MISSING" in refused.stdout
    rebuilt = run("verify", "s1", "--reseal")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert "rebuilt" in rebuilt.stderr
    assert seal.is_file()
    assert _texts(url) == [f"message {n:03d}" for n in range(8)]


# --- a log cut inside committed data (docs/rules.md#crash-safety) ----------------------------


def _write_store(root: Path, scheme: str, count: int = 10) -> tuple[str, Path]:
    url = f"{scheme}://{root}/store"
    with dsh.open(url) as store:
        session = store.session("s1")
        for n in range(count):
            session.append("user/message", user(f"message {n:03d} " + "x" * 200),
                           surface_op="append")
            store.flush(session)
    [log] = [path for path in (root / "store").glob("*/*/session.jsonl*")
             if path.name in ("session.jsonl", "session.jsonl.zstd")]
    return url, log


def test_a_zstd_log_cut_inside_committed_frames_is_an_error_naming_file_and_offset(
        tmp_path: Path) -> None:
    """The campaign's reproducer: 299 cuts in 300 loaded as a shorter log."""
    url, log = _write_store(tmp_path, "jsonl+zstd")
    assert log.name == "session.jsonl.zstd"
    original = log.read_bytes()
    cuts = sorted({len(original) * k // (FLIPS + 1) for k in range(1, FLIPS + 1)})
    refused = 0
    for cut in cuts:
        log.write_bytes(original[:cut])
        try:
            _texts(url)
        except LogCorruptError as exc:
            refused += 1
            assert exc.where["path"] == str(log)
            assert isinstance(exc.where["byte_offset"], int)
            assert exc.where["byte_offset"] <= cut
    log.write_bytes(original)
    assert refused == len(cuts)  # a cut exactly at a frame boundary too (test_zstd_cut.py)
    assert len(_texts(url)) == 10


def test_a_torn_frame_a_crash_leaves_after_the_committed_log_still_loads(
        tmp_path: Path) -> None:
    url, log = _write_store(tmp_path, "jsonl+zstd")
    original = log.read_bytes()
    last_frame = original.rindex(b"\x28\xb5\x2f\xfd")  # the last batch, as if never synced
    with log.open("ab") as f:
        f.write(original[last_frame:last_frame + 9])
    assert len(_texts(url)) == 10
    with dsh.open(url) as store:  # a writer cuts it after saving it, as before
        session = store.session("s1")
        session.append("user/message", user("more"), surface_op="append")
        store.flush(session)
    assert len(_texts(url)) == 11


def test_a_reader_racing_a_writer_that_flushes_meanwhile_is_not_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader sees a batch half written; the writer then finishes and journals it.

    The chain sidecar, read before the log, does not chain that batch yet: its record is
    appended after the batch's frames are durable (docs/formats.md#zstandard-chain).
    """
    url, log = _write_store(tmp_path, "jsonl+zstd", 9)
    sidecar = log.with_name(log.name + ".seal")
    chained_before = sidecar.read_bytes()
    with dsh.open(url) as store:
        session = store.session("s1")
        session.append("user/message", user("message 009"), surface_op="append")
        store.flush(session)
    original, chained = log.read_bytes(), sidecar.read_bytes()
    last = original.rindex(b"\x28\xb5\x2f\xfd")
    log.write_bytes(original[:-3])  # the last batch is still being written
    sidecar.write_bytes(chained_before)  # and not chained yet
    real = jsonl_backend.recorded_flush

    def writer_finishes(root: Path, key: str) -> Any:
        log.write_bytes(original)  # ... and is flushed, chained and journaled before the check
        sidecar.write_bytes(chained)
        return real(root, key)

    monkeypatch.setattr(jsonl_backend, "recorded_flush", writer_finishes)
    assert last < len(original) - 3
    with dsh.open(url) as store:  # not refused: what was, or is, there
        assert 10 <= len(store.read("s1").events) <= 12


def test_paging_a_log_without_restore_point_refuses_a_missing_seal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading by page (no restore point) falls back to the full read, which names it."""
    from dsh.persistence import Persistence, _pages, open_backend, read_pages

    monkeypatch.setattr(_pages, "RANGED_MIN_EVENTS", 8)
    monkeypatch.setattr(_pages, "TAIL_EVENTS", 4)
    url, log, seal = _write(tmp_path, 40)
    for ckpt in log.parent.glob("*.ckpt"):
        ckpt.unlink()
    seal.unlink()
    with Persistence(open_backend(url)) as persistence, pytest.raises(LogCorruptError) as refused:
        read_pages(persistence, "s1")
    assert refused.value.code == "SEAL_MISSING"


_REWRITE_KILLED = """
import os, sys
import dsh
from dsh.persistence.jsonl import _backend as jsonl_backend
from dsh.rights import redact

url, at = sys.argv[1], sys.argv[2]
real = os.replace


def replace(src, dst, **kw):
    name = os.path.basename(str(dst))
    if at == "before the log" and name == "session.jsonl":
        os._exit(9)  # the old seal is aside, the new one staged, the old log in place
    if at == "before the seal" and name == "session.jsonl.seal":
        os._exit(9)  # the new log in place, its seal staged
    real(src, dst, **kw)


jsonl_backend.os.replace = replace
with dsh.open(url) as store:
    redact(store, "s1", match="message 003")
"""


@pytest.mark.parametrize("at", ["before the log", "before the seal"])
def test_a_rewrite_killed_between_its_renames_leaves_a_session_that_reads(
        tmp_path: Path, at: str) -> None:
    """A redaction killed between renaming the log and its seal: the staged seal is adopted.

    docs/formats.md#integrity-seals: the old seal is moved aside, not deleted, and a reader
    that finds a marked log without its seal adopts a staged seal that verifies its bytes.
    """
    url, _log, seal = _write(tmp_path)
    killed = subprocess.run([sys.executable, "-c", _REWRITE_KILLED, url, at], check=False)
    assert killed.returncode == 9
    assert not seal.exists()
    assert len(list(seal.parent.glob(".session.jsonl.seal.*.tmp"))) == 2
    texts = _texts(url)  # a reader uses the staged seal as it is
    expected = [f"message {n:03d}" for n in range(8)]
    if at == "before the seal":
        assert "message 003" not in texts and len(texts) == 8
    else:
        assert texts == expected
    with dsh.open(url) as store:  # a writer adopts it and drops the other
        session = store.session("s1")
        session.append("user/message", user("more"), surface_op="append")
        store.flush(session)
    assert seal.is_file() and not list(seal.parent.glob(".session.jsonl.seal.*.tmp"))
    assert _texts(url)[-1] == "more"
    with dsh.open(url) as store:
        redact(store, "s1", match="message 003")
    assert "message 003" not in _texts(url)

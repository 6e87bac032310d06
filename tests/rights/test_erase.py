"""Erasure on every real backend: the erased session, the copies its fork holds and the
summary derived from it leave every store byte; everything else is unchanged; the receipt
lists what was touched and ``dsh verify --receipt`` checks it.

Rule: docs/forgetting.md#erasure.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh import RightsError
from dsh.interop import to_anthropic, to_openai
from dsh.rights import erase, store_log, verify_receipt
from dsh.rights._storelog import receipt_digest
from dsh.testing._stores import postgres_unreachable, temporary_postgres_url
from tests.rights.conftest import (
    SECRETS,
    assert_valid_anthropic,
    assert_valid_openai,
    build,
    run_cli,
)
from tests.rights.test_redact import store_bytes

OTHER = "left alone: the other tenant's note"
CHILD = "the child's own question"
MATCHED = "matched by cwd: MATCHED-7f3a"


def _populate(url: str) -> None:
    build(url, padding=300)
    run_cli("compact", "--store", url, "s1")
    run_cli("fork", "--store", url, "s1", "--as", "s1-child")
    with dsh.open(url) as store:
        for sid, cwd, text in (("s1-child", None, CHILD), ("t-acme", "/home/acme/app", MATCHED),
                               ("t-other", "/home/other/app", OTHER)):
            if cwd is not None:
                store.session(sid, header={"cwd": cwd})
            recorder = store.recorder(sid)
            with recorder.turn() as turn, turn.step() as step:
                step.user_message(text)
                step.request({"provider": "deepseek", "model": "deepseek-chat"})
                step.assistant("noted")


def test_erase_removes_a_session_everywhere_and_the_receipt_checks(url: str,
                                                                   tmp_path: Path) -> None:
    _populate(url)
    with dsh.open(url) as store:
        before = {sid: store.read(sid).stored_events for sid in ("s1-child", "t-other")}
    receipt = tmp_path / "receipt.json"
    run_cli("erase", "--store", url, "s1", "--where", "cwd=/home/acme/app", "--receipt",
            str(receipt), "--reason", "art. 17 request")
    made = json.loads(receipt.read_text())
    roles = {s["id"]: s["role"] for s in made["sessions"]}
    assert roles == {"s1": "erased", "t-acme": "erased", "s1-child": "descendant"}
    assert made["subjects"] == ["s1", "t-acme"]
    everything = b"\n".join(raw for _, raw in store_bytes(url))
    for secret in [*SECRETS.values(), MATCHED]:
        assert secret.encode() not in everything, secret
    assert CHILD.encode() in everything and OTHER.encode() in everything
    with dsh.open(url) as store:
        assert store.read("t-other").stored_events == before["t-other"]
        child = store.read("s1-child")
        seed = child.header["seedLength"]
        kept = before["s1-child"]
        # the child's own events after the cut are unchanged (the record is appended)
        assert child.stored_events[seed + 1:len(kept)] == kept[seed + 1:]
        view = dsh.Session.restore("s1-child", child.events, child.header,
                                   inherited_event_count=seed).derive_messages()
        assert verify_receipt(store, made) == []
    assert_valid_openai({"messages": to_openai(view)})
    assert_valid_anthropic(to_anthropic(view))
    assert CHILD in json.dumps(list(view))
    run_cli("verify", "--store", url, "--all")
    done = run_cli("verify", "--store", url, "--receipt", str(receipt))
    assert "holds" in done.stdout
    forged = json.loads(receipt.read_text())
    forged["sessions"][0]["items"][0]["tombstone"] = "0" * 64
    (tmp_path / "forged.json").write_text(json.dumps(forged))
    done = run_cli("verify", "--store", url, "--receipt", str(tmp_path / "forged.json"),
                   check=False)
    assert done.returncode == 1 and "is not the tombstone the receipt lists" in done.stdout


def test_verify_receipt_names_a_changed_receipt_and_a_malformed_one(tmp_path: Path) -> None:
    """A receipt is the proof of what was removed (docs/forgetting.md#receipts): one whose
    salt or commitment was changed, or that leaves a session out, does not hold (each passed
    before: only tombstone digests were compared), and a receipt of the wrong shape is one
    problem naming the place (before: error[BUG] AttributeError, ValueError, OverflowError)."""
    url = f"jsonl:{tmp_path / 'j'}"
    _populate(url)
    receipt = tmp_path / "receipt.json"
    run_cli("erase", "--store", url, "s1", "--receipt", str(receipt))
    made = json.loads(receipt.read_text())
    assert [s["id"] for s in made["sessions"]] == ["s1", "s1-child"]

    def changed(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
        copy = json.loads(json.dumps(made))
        target = copy
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return copy

    item = ("sessions", 0, "items", 0)
    with dsh.open(url) as store:
        assert verify_receipt(store, made) == []
        unrecorded = [f"no store/erased record of the store log names this receipt (SHA-256 "
                      f"{receipt_digest(r)}): it was changed after it was written, or is "
                      f"another store's" for r in (changed((*item, "salt"), "00" * 16),
                                                   changed(("sessions",), made["sessions"][:1]),
                                                   changed((*item, "commitment"), "0" * 64))]
        assert verify_receipt(store, changed((*item, "salt"), "00" * 16)) == unrecorded[:1]
        assert verify_receipt(store, changed(("sessions",), made["sessions"][:1])) == \
            unrecorded[1:2]
        record = made["sessions"][0]["recordSeq"]
        assert verify_receipt(store, changed((*item, "commitment"), "0" * 64)) == [
            unrecorded[2], f"s1: seq {record} is not the redaction record this receipt names"]
        for path, value, where in (
                (("sessions",), "x", "sessions is not a list"),
                (("sessions", 1), 7, "sessions[1] is not an object"),
                ((*item, "seq"), "zz", "sessions[0].items[0].seq is not a whole number"),
                ((*item, "seq"), 1e300, "sessions[0].items[0].seq is not a whole number"),
                ((*item, "tombstone"), None,
                 "sessions[0].items[0] has no commitment and tombstone digests"),
                (("sessions", 0, "items"), None, "sessions[0].items is not a list"),
                (("sessions", 0, "recordSeq"), "3", "sessions[0].recordSeq is not a whole "
                                                     "number")):
            assert verify_receipt(store, changed(path, value)) == [
                f"not a dsh receipt: {where}"], where
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(changed((*item, "seq"), 1e400)).replace("1e+400", "1e400"))
    done = run_cli("verify", "--store", url, "--receipt", str(forged), check=False)
    assert done.returncode == 1 and "BUG" not in done.stderr, done.stderr
    assert done.stdout.splitlines()[0] == \
        "not a dsh receipt: sessions[0].items[0].seq is not a whole number"


def test_erase_needs_a_subject_and_a_receipt(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    build(url)
    with dsh.open(url) as store, pytest.raises(RightsError) as caught:
        erase(store, where={"cwd": "/nowhere"})
    assert caught.value.code == "NOTHING_SELECTED"
    done = run_cli("erase", "--store", url, "s1", check=False)
    assert done.returncode == 2 and "--receipt" in done.stderr
    done = run_cli("erase", "--store", url, "nope", "--receipt", str(tmp_path / "r"),
                   check=False)
    assert done.returncode == 1 and "SESSION_NOT_FOUND" in done.stderr


def test_a_scrub_another_reader_blocks_is_named_on_stderr(tmp_path: Path) -> None:
    # before: the erasure printed only "erased" while the WAL checkpoint was busy (done: false
    # in the receipt) and the erased text stayed in the database file
    import sqlite3

    db = tmp_path / "s.db"
    url = f"sqlite://{db}"
    build(url, padding=300)
    reader = sqlite3.connect(db)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM events").fetchone()
        held = run_cli("erase", "--store", url, "s1", "--receipt", str(tmp_path / "r1.json"))
    finally:
        reader.rollback()
        reader.close()
    made = json.loads((tmp_path / "r1.json").read_text())
    busy = [t for entry in made["sessions"] for t in entry["touched"] if t.get("done") is False]
    assert busy and all(t["path"] == str(db) for t in busy)
    assert f"warning: s1: {busy[0]['action']} on {db} did not run" in held.stderr
    assert "run the same command again" in held.stderr
    again = run_cli("erase", "--store", url, "s1", "--receipt", str(tmp_path / "r2.json"))
    assert "warning" not in again.stderr
    assert all(secret.encode() not in db.read_bytes() for secret in SECRETS.values())


def test_erasing_an_erased_session_again_tombstones_nothing(tmp_path: Path) -> None:
    # before: a tool call's arguments, tombstoned to "{}" by the first erasure, counted as
    # content on every later one: each `dsh erase` / `dsh rm --purge` of the same session
    # appended a redaction/applied record re-tombstoning the same calls (seqs 7 and 8 here)
    url = f"sqlite://{tmp_path}/s.db"
    build(url)
    with dsh.open(url) as store:
        first = erase(store, ["s1"])
        length = len(store.read("s1").stored_events)
        second = erase(store, ["s1"])
        assert [s.items for s in second.sessions] == [()]
        assert [s.record_seq for s in second.sessions] == [None]
        assert len(store.read("s1").stored_events) == length
        assert first.sessions[0].items


_INTERRUPTED_AFTER_FIRST = """
import os, signal, sys
from dsh.rights import _erase
delete_cuts = _erase._delete_cuts
def delete_cuts_then_ctrl_c(persistence, session_id):
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the first session is being erased
    return delete_cuts(persistence, session_id)
_erase._delete_cuts = delete_cuts_then_ctrl_c
from dsh.cli import main
main(sys.argv[1:])
"""


@pytest.mark.parametrize("command", [["erase"], ["rm", "--purge"]], ids=["erase", "purge"])
def test_ctrl_c_mid_erasure_writes_the_receipt_of_what_was_erased(tmp_path: Path,
                                                                  command: list[str]) -> None:
    # before: Ctrl-C after some sessions were erased printed only "error[INTERRUPTED]": no
    # receipt, no line per erased session and no store/erased record for them
    import subprocess
    import sys

    url = f"sqlite://{tmp_path}/s.db"
    for sid in ("s1", "s2", "s3"):
        build(url, sid)
    receipt = tmp_path / "r.json"
    done = subprocess.run([sys.executable, "-c", _INTERRUPTED_AFTER_FIRST, *command, "--store",
                           url, "s1", "s2", "s3", "--receipt", str(receipt)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr
    assert "interrupted after 1 session: the receipt lists those erased" in done.stderr
    made = json.loads(receipt.read_text())
    assert [s["id"] for s in made["sessions"]] == ["s1"]
    assert done.stdout.splitlines()[0].startswith("s1: erased, ")
    with dsh.open(url) as store:
        assert verify_receipt(store, made) == []
        records = store_log(store).deletions()
        assert [r["sessions"] for r in records] == [["s1"]]
        # s2 and s3 untouched: their secrets are still there for the next run to erase
        assert SECRETS["user"] in json.dumps(list(store.read("s2").stored_events))
    run_cli("verify", "--store", url, "--all")
    again = run_cli(*command, "--store", url, "s1", "s2", "s3", "--receipt",
                    str(tmp_path / "r2.json"))
    assert "s2: erased" in again.stdout and "s3: erased" in again.stdout
    everything = b"\n".join(raw for _, raw in store_bytes(url))
    assert all(secret.encode() not in everything for secret in SECRETS.values())


def test_erase_takes_over_a_killed_postgres_writer_on_this_host_at_once(tmp_path: Path) -> None:
    """docs/forgetting.md#how-an-operation-runs: a writer killed with SIGKILL on this host holds
    a 60 s lease, yet `dsh erase` with no --wait takes the session over and erases it."""
    reason = postgres_unreachable()
    if reason is not None:
        pytest.skip(f"SKIPPED LOUDLY: {reason}")
    with temporary_postgres_url(lease_ms=60_000) as url:
        build(url)
        holder = subprocess.Popen(
            [sys.executable, "-c", "import dsh, sys, time\n"
             "store = dsh.open(sys.argv[1]); store.session('s1')\n"
             "print('held', flush=True); time.sleep(600)", url],
            stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
        done = run_cli("erase", "--store", url, "s1", "--receipt", str(tmp_path / "r.json"))
        assert "s1: erased" in done.stdout
        assert SECRETS["user"].encode() not in store_bytes(url)


def test_an_erased_session_keeps_its_header_cwd_and_jsonl_folder_names(tmp_path: Path) -> None:
    # docs/forgetting.md#what-forgetting-cannot-reach: by design the header stays (cwd and
    # metadata), and on JSONL the folder names derived from the cwd and the id stay on disk
    from dsh.json import snapshot_json
    from dsh.persistence import Persistence, open_backend
    from dsh.session._events import make_event

    url = f"jsonl:{tmp_path / 'root'}"
    backend = open_backend(url)
    backend.create({"version": 0, "id": "alice-tax-2026", "createdAt": 1,
                    "cwd": "/home/alice/acme", "metadata": {"client": "acme"}})
    with backend.open("alice-tax-2026", "write") as handle:
        handle.read()
        handle.append([make_event("session/title", 0, 2, snapshot_json({"title": "taxes"}))])
    backend.close()
    persistence = Persistence(open_backend(url))
    try:
        erase(persistence, ["alice-tax-2026"], reason="request", by="test")
        (header,) = persistence.list_headers()
    finally:
        persistence.close()
    assert header["cwd"] == "/home/alice/acme" and dict(header["metadata"]) == {"client": "acme"}
    log = tmp_path / "root" / "--home-alice-acme--" / "alice-tax-2026" / "session.jsonl"
    assert b"taxes" not in log.read_bytes()

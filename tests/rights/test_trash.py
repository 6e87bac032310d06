"""The trash on every real backend: ``dsh rm`` hides a session and keeps it byte for byte,
``dsh restore`` gives it back, ``dsh rm --purge`` erases it; each is one store-log record that
names sessions and never holds their content.

Rule: docs/forgetting.md#deletion-with-a-way-back, docs/forgetting.md#the-store-log.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dsh
from dsh import RightsError, SessionNotFoundError
from dsh.persistence import STORE_LOG_ID
from dsh.rights import erase, purge, restore, store_log, trash, verify_receipt
from dsh.rights._storelog import receipt_digest
from tests.rights.conftest import SECRETS, build, run_cli
from tests.rights.test_redact import store_bytes


def _ids(url: str, *flags: str) -> list[str]:
    rows = json.loads(run_cli("ls", "--store", url, "--json", *flags).stdout)
    return sorted(row["id"] for row in rows)


def _two(url: str) -> None:
    build(url)
    with dsh.open(url) as store:
        recorder = store.recorder("s2")
        with recorder.turn() as turn, turn.step() as step:
            step.user_message("a second session")
            step.request({"provider": "deepseek", "model": "deepseek-chat"})
            step.assistant("kept")


def test_rm_hides_a_session_unchanged_and_restore_gives_it_back(url: str) -> None:
    _two(url)
    with dsh.open(url) as store:
        before = store.read("s1").stored_events
    done = run_cli("rm", "--store", url, "s1", "--reason", "done with it")
    assert "s1: moved to the trash" in done.stdout
    assert _ids(url) == ["s2"]
    assert _ids(url, "--trash") == ["s1"]
    assert _ids(url, "--all") == ["s1", "s2"]
    with dsh.open(url) as store:
        assert store.read("s1").stored_events == before  # not one byte of it changed
        state = store_log(store)
        assert set(state.trash) == {"s1"} and state.trash["s1"].reason == "done with it"
        assert STORE_LOG_ID not in {h["id"] for h in store.persistence.list_headers()}
        assert trash(store, ["s1"]).unchanged == ("s1",)
    run_cli("restore", "--store", url, "s1")
    assert _ids(url) == ["s1", "s2"]
    with dsh.open(url) as store:
        assert store.read("s1").stored_events == before
        assert store_log(store).trash == {}
        assert [r["type"] for r in store_log(store).records] == ["store/trashed",
                                                                   "store/restored"]
        assert restore(store, ["s1"]).unchanged == ("s1",)
    run_cli("verify", "--store", url, "--all")


def test_rm_purge_erases_and_restore_refuses_it(url: str, tmp_path: Path) -> None:
    _two(url)
    receipt = tmp_path / "purge.json"
    run_cli("rm", "--store", url, "--purge", "s1", "--receipt", str(receipt),
            "--reason", "art. 17")
    everything = b"\n".join(raw for _, raw in store_bytes(url))
    for secret in SECRETS.values():
        assert secret.encode() not in everything, secret  # the store log holds none either
    assert _ids(url) == ["s2"]
    assert _ids(url, "--trash") == ["s1"]
    made = json.loads(receipt.read_text())
    with dsh.open(url) as store:
        assert verify_receipt(store, made) == []
        deletions = store_log(store).deletions()
        assert len(deletions) == 1
        record = deletions[0]
        assert record["purge"] is True and record["sessions"] == ["s1"]
        assert record["receipt"] == receipt_digest(made)
        assert record["reason"] == "art. 17" and record["events"] > 0
        assert store_log(store).trash["s1"].purged_ms is not None
        with pytest.raises(RightsError) as refused:
            restore(store, ["s1"])
        assert refused.value.code == "PURGED"
    refused_cli = run_cli("restore", "--store", url, "s1", check=False)
    assert refused_cli.returncode == 1 and "PURGED" in refused_cli.stderr
    run_cli("verify", "--store", url, "--receipt", str(receipt))


def test_erase_is_recorded_in_the_store_log_without_content(url: str) -> None:
    _two(url)
    with dsh.open(url) as store:
        made = erase(store, ["s1"], reason="asked")
        [record] = store_log(store).deletions()
        assert record["purge"] is False and record["subjects"] == ["s1"]
        assert record["receipt"] == receipt_digest(made.to_json())
        # an erased session is still listed (not in the trash): erasure is not removal
        assert {e.id for e in store.list()} == {"s1", "s2"}


def test_trash_refuses_an_unknown_session_and_records_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    build(url)
    with dsh.open(url) as store:
        with pytest.raises(SessionNotFoundError):
            trash(store, ["s1", "nope"])
        with pytest.raises(SessionNotFoundError):
            trash(store, [STORE_LOG_ID])
        assert store_log(store).records == ()
        assert not store.persistence.exists(STORE_LOG_ID)
        result = purge(store, ["s1"])
        assert [s.session_id for s in result.sessions] == ["s1"]
        assert trash(store, ["s1"]).unchanged == ("s1",)  # purged stays purged
        assert store_log(store).trash["s1"].purged_ms is not None

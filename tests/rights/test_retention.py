"""Retention as data on every real backend: policies kept in the store log, ``dsh gc``
explaining (nothing changes) and ``dsh gc --apply`` archiving, trashing and purging, each
recorded with the policy that asked for it.

Rule: docs/forgetting.md#retention.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dsh
from dsh import ConfigError
from dsh.rights import (
    RetentionPolicy,
    clear_retention,
    gc,
    retention_policies,
    set_retention,
    store_log,
    verify_receipt,
)
from dsh.rights._retention import DAY_MS, pick_policy
from dsh.rights._storelog import receipt_digest
from tests.rights.conftest import SECRETS, build, run_cli
from tests.rights.test_redact import store_bytes


def _populate(url: str) -> int:
    """s1 (no cwd, secrets) and s2 (cwd /home/acme/app); the latest activity, epoch ms."""
    build(url)
    with dsh.open(url) as store:
        store.session("s2", header={"cwd": "/home/acme/app"})
        recorder = store.recorder("s2")
        with recorder.turn() as turn, turn.step() as step:
            step.user_message("acme keeps this")
            step.request({"provider": "deepseek", "model": "deepseek-chat"})
            step.assistant("kept")
        return max(e.last_activity_ms for e in store.list())


def test_gc_archives_trashes_and_purges_as_the_policies_say(url: str) -> None:
    last = _populate(url)
    with dsh.open(url) as store:
        # what gc reads is what dsh ls shows: the same headers and last activity
        pairs, errors = store.persistence.list_activity()
        assert errors == []
        assert {h["id"]: (dict(h), t) for h, t in pairs} == {
            e.id: (dict(e.header), e.last_activity_ms) for e in store.list(which="all")}
        assert gc(store, now_ms=last + 400 * DAY_MS).items == ()  # no policy: keep all
        set_retention(store, RetentionPolicy(archive_after_days=30, trash_after_days=60,
                                             purge_after_days=30))
        set_retention(store, RetentionPolicy(where={"cwd": "/home/acme/app"}, keep=True))
        before = store.read("s1").stored_events
        explained = gc(store, now_ms=last + 31 * DAY_MS)
        assert [(i.session_id, i.action, i.scope) for i in explained.items] == [
            ("s1", "archive", "store")]
        assert "archives after 30 days" in explained.items[0].why
        assert explained.kept == 1 and not explained.applied
        assert store_log(store).archived == {}  # explaining writes nothing
        applied = gc(store, now_ms=last + 31 * DAY_MS, apply=True)
        assert applied.applied and [e.id for e in store.list()] == ["s2"]
        assert [e.id for e in store.list(which="archived")] == ["s1"]
        assert gc(store, now_ms=last + 31 * DAY_MS).items == ()  # archived once
        gc(store, now_ms=last + 61 * DAY_MS, apply=True)
        assert store.read("s1").stored_events == before  # the trash keeps every byte
        trashed = store_log(store).trash["s1"]
        assert trashed.policy == {} and trashed.reason == "retention policy store"
        assert gc(store, now_ms=trashed.trashed_ms + 29 * DAY_MS).items == ()
        purged = gc(store, now_ms=trashed.trashed_ms + 30 * DAY_MS, apply=True)
        assert [(i.session_id, i.action) for i in purged.items] == [("s1", "purge")]
        assert purged.receipt is not None
        assert verify_receipt(store, purged.receipt.to_json()) == []
        [record] = store_log(store).deletions()
        assert record["purge"] is True and record["policies"] == {"store": ["s1"]}
        assert record["receipt"] == receipt_digest(purged.receipt.to_json())
        assert [e.id for e in store.list()] == ["s2"]
    everything = b"\n".join(raw for _, raw in store_bytes(url))
    for secret in SECRETS.values():
        assert secret.encode() not in everything, secret
    assert b"acme keeps this" in everything


def test_gc_cli_explains_by_default_and_applies_on_demand(url: str, tmp_path: Path) -> None:
    _populate(url)
    run_cli("retention", "--store", url, "--trash-after", "0", "--purge-after", "0")
    run_cli("retention", "--store", url, "--where", "cwd=/home/acme/app", "--keep")
    listed = run_cli("retention", "--store", url).stdout
    assert "store: trash after 0 days, purge after 0 days" in listed
    assert "cwd=/home/acme/app: keep" in listed
    explained = run_cli("gc", "--store", url)
    assert "s1: would move to the trash: no activity for" in explained.stdout
    assert "2 sessions examined: 0 to archive, 1 to trash, 0 to purge, 1 kept" in \
        explained.stdout
    assert "s2" not in explained.stdout.split("examined")[0]
    with dsh.open(url) as store:
        assert store_log(store).trash == {}
    run_cli("gc", "--store", url, "--apply")
    receipt = tmp_path / "gc.json"
    done = run_cli("gc", "--store", url, "--apply", "--receipt", str(receipt), "--json")
    report = json.loads(done.stdout)
    assert [(i["id"], i["action"]) for i in report["items"]] == [("s1", "purge")]
    run_cli("verify", "--store", url, "--receipt", str(receipt))
    log = run_cli("gc", "--store", url, "--log").stdout
    kinds = [line.split()[4] for line in log.splitlines()]
    assert kinds == ["store/retention", "store/retention", "store/trashed", "store/erased"]
    for secret in SECRETS.values():
        assert secret not in log
    cleared = run_cli("retention", "--store", url, "--where", "cwd=/home/acme/app", "--clear")
    assert "removed the retention policy for cwd=/home/acme/app" in cleared.stderr
    assert "cwd=/home/acme/app" not in run_cli("retention", "--store", url).stdout


def test_the_most_specific_policy_wins_then_the_latest(tmp_path: Path) -> None:
    store_wide = RetentionPolicy(trash_after_days=10)
    acme = RetentionPolicy(where={"cwd": "/a"}, trash_after_days=20)
    acme_later = RetentionPolicy(where={"origin": "subagent"}, trash_after_days=30)
    both = RetentionPolicy(where={"cwd": "/a", "origin": "subagent"}, keep=True)
    policies = (store_wide, acme, acme_later)
    assert pick_policy(policies, {"cwd": "/b"}) is store_wide
    assert pick_policy(policies, {"cwd": "/a"}) is acme
    assert pick_policy(policies, {"cwd": "/a", "origin": "subagent"}) is acme_later
    assert pick_policy((*policies, both), {"cwd": "/a", "origin": "subagent"}) is both
    assert pick_policy((acme,), {}) is None
    url = f"sqlite:///{tmp_path}/s.db"
    build(url)
    with dsh.open(url) as store:
        set_retention(store, store_wide)
        set_retention(store, RetentionPolicy(archive_after_days=5))  # replaces the scope
        assert retention_policies(store) == (RetentionPolicy(archive_after_days=5),)
        assert clear_retention(store, {}) and not clear_retention(store, {})
        assert retention_policies(store) == ()


@pytest.mark.parametrize("fields", [{}, {"keep": True, "trash_after_days": 3},
                                    {"trash_after_days": -1},
                                    {"archive_after_days": True}])
def test_a_policy_that_says_nothing_or_too_much_is_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as refused:
        RetentionPolicy(**fields)  # type: ignore[arg-type]
    assert refused.value.code == "BAD_POLICY"


def test_a_restored_session_is_not_taken_back_by_the_next_gc(url: str) -> None:
    # The bundled examples are months old: every policy below acts on them at once.
    run_cli("import", "--examples", "--store", url)

    def listed() -> list[str]:
        return [r["id"] for r in json.loads(run_cli("ls", "--store", url, "--json").stdout)]

    def applied() -> dict[str, str]:
        done = json.loads(run_cli("gc", "--store", url, "--apply", "--json").stdout)
        return {i["id"]: i["action"] for i in done["items"]}

    new = listed()  # dated by their files: today
    run_cli("retention", "--store", url, "--archive-after", "30")
    archived = applied()
    ids = sorted(archived)  # dated by their events: months ago
    assert len(ids) >= 3 and archived == dict.fromkeys(ids, "archive")
    new = [sid for sid in new if sid not in archived]
    assert sorted(listed()) == sorted(new)
    run_cli("restore", ids[0], "--store", url)
    assert applied() == {}  # a restore is activity: the archive is not done again
    assert sorted(listed()) == sorted([*new, ids[0]])
    run_cli("retention", "--store", url, "--trash-after", "60")
    assert applied() == dict.fromkeys(ids[1:], "trash")
    run_cli("restore", ids[1], "--store", url)
    assert applied() == {}
    assert sorted(listed()) == sorted([*new, *ids[:2]])
    with dsh.open(url) as store:
        log = store_log(store)
        assert set(log.restored) == {ids[0], ids[1]}
        assert set(log.trash) == set(ids[2:])


def test_a_fresh_fork_is_active_for_gc_as_dsh_ls_shows_it(tmp_path: Path) -> None:
    # before: dsh ls showed a fork made now as active now (its header's createdAt: creating a
    # fork is activity), while dsh gc counted from its inherited events' times and trashed it
    # at once: "no activity for 335 days"
    store = f"sqlite:{tmp_path / 's.db'}"
    simple = "11111111-2222-4333-8444-555555555555"  # events of 2026-01-05
    run_cli("import", "--examples", "--store", store)
    run_cli("fork", simple, "--as", "fresh", "--store", store)
    run_cli("retention", "--trash-after", "30", "--purge-after", "60", "--store", store)
    listed = {r["id"]: r["lastActivityMs"]
              for r in json.loads(run_cli("ls", "--json", "--store", store).stdout)}
    report = json.loads(run_cli("gc", "--json", "--store", store).stdout)
    now = report["now"]
    assert now - listed["fresh"] < DAY_MS and now - listed[simple] > 30 * DAY_MS
    actions = {item["id"]: item["action"] for item in report["items"]}
    assert actions[simple] == "trash" and "fresh" not in actions


def test_gc_says_one_day_not_one_days(url: str) -> None:
    last = _populate(url)
    with dsh.open(url) as store:
        set_retention(store, RetentionPolicy(trash_after_days=1))
        explained = gc(store, now_ms=last + 2 * DAY_MS)
    assert explained.items and all(i.action == "trash" for i in explained.items)
    why = explained.items[0].why
    assert why.endswith("policy store trashes after 1 day"), why  # before: "after 1 days"

"""`dsh convert` carries a store's trash, archive, retention policies and deletion records (its
store log) in every direction, or refuses, before copying anything, a target that cannot take
them. Real processes, real SQLite, JSONL and PostgreSQL stores.

Rule: docs/stores.md#moving-between-stores, docs/forgetting.md#the-store-log.
"""

from __future__ import annotations

import itertools
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from dsh.persistence import STORE_LOG_ID
from dsh.testing._stores import postgres_unreachable, temporary_postgres_url
from tests.cli.test_cli import Dsh


def _state(dsh: Dsh, url: str) -> dict[str, Any]:
    """What a user sees of a store: each listing, the policies and the store log's records."""
    def rows(*which: str) -> list[dict[str, Any]]:
        listed = dsh.json("ls", *which, "--store", url, "--json")
        return sorted(listed, key=lambda r: r["id"])

    return {"ls": rows(), "trash": rows("--trash"), "archived": rows("--archived"),
            "all": rows("--all"),
            "retention": dsh.json("retention", "--store", url, "--json"),
            "storeLog": dsh.event_lines(STORE_LOG_ID, "--store", url)}


def _build_source(dsh: Dsh, folder: Path) -> tuple[Path, dict[str, Any]]:
    """A SQLite store of the bundled examples with one session trashed, one purged, the old
    others archived by a policy but one restored, and a second policy kept for a scope."""
    source = f"sqlite://{folder}/source.db"
    dsh("import", "--examples", "--store", source)
    ids = [r["id"] for r in dsh.json("ls", "--store", source, "--json")]
    dsh("retention", "--archive-after", "1", "--store", source)
    dsh("retention", "--where", "cwd=/srv/kept", "--keep", "--store", source)
    # the examples dated by their events are months old (those dated by their files may not be)
    old = [i["id"] for i in dsh.json("gc", "--store", source, "--json")["items"]]
    assert len(old) >= 5
    dsh("rm", old[0], "--reason", "done with it", "--store", source)
    dsh("rm", "--purge", old[1], "--store", source)
    dsh("gc", "--apply", "--store", source)
    dsh("restore", old[2], "--store", source)
    state = _state(dsh, source)
    # the source is what the walk saw: each state present, so carrying it is what is checked
    assert sorted(r["id"] for r in state["ls"]) == sorted(
        [old[2], *(sid for sid in ids if sid not in old)])
    trash = {r["id"]: r for r in state["trash"]}
    assert set(trash) == {old[0], old[1]}
    assert trash[old[0]]["trashReason"] == "done with it" and not trash[old[0]].get("purged")
    assert trash[old[1]]["purged"] is True
    assert {r["id"] for r in state["archived"]} == set(old[3:])
    assert len(state["retention"]) == 2
    return folder / "source.db", state


@pytest.fixture(scope="module")
def built_source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The source store built once for the module (its walk is ~16 dsh processes): each test
    converts from its own copy of the file."""
    folder = tmp_path_factory.mktemp("convert-source")
    return _build_source(Dsh(folder), folder)


@pytest.fixture
def source(built_source: tuple[Path, dict[str, Any]],
           tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """This test's copy of the built source store and its state as the walk saw it: the
    database and every file beside it named after it (its seals), with their modes (dsh
    refuses a database others may read)."""
    built, state = built_source
    for path in built.parent.glob(built.name + "*"):
        if path.is_dir():
            shutil.copytree(path, tmp_path / path.name)
        else:
            shutil.copy2(path, tmp_path / path.name)
    return f"sqlite://{tmp_path}/{built.name}", state


def test_convert_carries_the_store_log_between_files(
        tmp_path: Path, source: tuple[str, dict[str, Any]]) -> None:
    dsh = Dsh(tmp_path)
    source_url, expected = source
    chain = [source_url, f"jsonl://{tmp_path}/raw", f"jsonl+zstd://{tmp_path}/z",
             f"sqlite://{tmp_path}/back.db"]
    for src, dst in itertools.pairwise(chain):
        proc = dsh("convert", "--from", src, "--to", dst)
        assert "carried the store log (trash, archive, retention policies)" in proc.stdout
        assert _state(dsh, dst) == expected, dst
    again = dsh.json("convert", "--from", chain[1], "--to", chain[-1], "--json")
    assert (again["copied"], again["storeLog"]) == (0, "present")


@pytest.mark.skipif(postgres_unreachable() is not None,
                    reason=f"SKIPPED LOUDLY: {postgres_unreachable()}")
def test_convert_carries_the_store_log_to_and_from_postgresql(
        tmp_path: Path, source: tuple[str, dict[str, Any]]) -> None:
    dsh = Dsh(tmp_path)
    source_url, expected = source
    with temporary_postgres_url() as pg, temporary_postgres_url() as pg_again:
        chain = [source_url, pg, f"jsonl://{tmp_path}/raw", pg_again, f"sqlite://{tmp_path}/b.db"]
        for src, dst in itertools.pairwise(chain):
            outcome = dsh.json("convert", "--from", src, "--to", dst, "--json")
            assert outcome["storeLog"] == "copied"
            assert _state(dsh, dst) == expected, dst
        # gc in the copy judges as in the source: the restored session is not taken back
        assert dsh.json("gc", "--store", pg, "--json")["items"] == []


def test_convert_refuses_a_target_with_another_store_log(
        tmp_path: Path, source: tuple[str, dict[str, Any]]) -> None:
    dsh = Dsh(tmp_path)
    source_url, _ = source
    target = f"jsonl://{tmp_path}/other"
    dsh("import", "--examples", "--store", target)
    dsh("retention", "--keep", "--store", target)
    before = _state(dsh, target)
    proc = dsh("convert", "--from", source_url, "--to", target, check=1)
    assert "CONVERT_CONFLICT" in proc.stderr and "store log" in proc.stderr
    assert _state(dsh, target) == before  # nothing copied


def test_convert_refuses_a_schema_14_target_for_a_store_log(
        tmp_path: Path, source: tuple[str, dict[str, Any]]) -> None:
    dsh = Dsh(tmp_path)
    source_url, _ = source
    target = tmp_path / "old.db"
    proc = dsh("convert", "--from", source_url, "--to", f"sqlite://{target}?schema=14", check=1)
    assert "UNSTORABLE_IN_TARGET" in proc.stderr and "store log" in proc.stderr
    assert "nothing was copied" in proc.stderr
    conn = sqlite3.connect(target)
    try:
        assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0
    finally:
        conn.close()

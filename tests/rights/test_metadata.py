"""Header metadata on every real backend: a tenant or user id given at creation survives in the
stored header, travels to forks, and ``dsh erase --where`` and retention scopes select on it.

Rule: docs/formats.md#header-metadata, docs/forgetting.md#erasure, docs/forgetting.md#retention.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dsh
from dsh import EventRejectedError
from dsh.rights import RetentionPolicy, gc, set_retention
from tests.rights.conftest import run_cli
from tests.rights.test_redact import store_bytes

ACME = "acme's private note 41c7"
GLOBEX = "globex's private note 9d2e"


def _write(url: str) -> None:
    with dsh.open(url) as store:
        for sid, tenant, user, text in (("a1", "acme", "u-1", ACME),
                                        ("a2", "acme", "u-2", ACME + " again"),
                                        ("g1", "globex", "u-1", GLOBEX)):
            store.session(sid, header={"cwd": "/srv/app", "tenant": tenant, "user": user,
                                       "vip": tenant == "acme", "dropped": ["not", "scalar"]})
            recorder = store.recorder(sid)
            with recorder.turn() as turn, turn.step() as step:
                step.user_message(text)
                step.request({"provider": "deepseek", "model": "deepseek-chat"})
                step.assistant("noted")


def test_metadata_survives_in_the_stored_header_and_forks_inherit_it(url: str) -> None:
    _write(url)
    run_cli("fork", "--store", url, "a1", "--as", "a1-child")
    with dsh.open(url) as store:
        headers = {h["id"]: h for h in store.persistence.list_headers()}
        assert dict(headers["a1"]["metadata"]) == {"tenant": "acme", "user": "u-1",
                                                   "vip": True}
        assert "dropped" not in headers["a1"] and "tenant" not in headers["a1"]
        assert headers["a1"]["cwd"] == "/srv/app"
        assert store.read("g1").header["metadata"]["tenant"] == "globex"
        assert dict(headers["a1-child"]["metadata"]) == dict(headers["a1"]["metadata"])
        assert {e.id: e.header.get("metadata", {}).get("user") for e in store.list()} == {
            "a1": "u-1", "a2": "u-2", "g1": "u-1", "a1-child": "u-1"}
    run_cli("verify", "--store", url, "--all")


def test_erase_where_selects_on_metadata(url: str, tmp_path: Path) -> None:
    _write(url)
    receipt = tmp_path / "acme.json"
    run_cli("erase", "--store", url, "--where", "tenant=acme", "--where", "vip=true",
            "--receipt", str(receipt))
    assert json.loads(receipt.read_text())["subjects"] == ["a1", "a2"]
    everything = b"\n".join(raw for _, raw in store_bytes(url))
    assert ACME.encode() not in everything and GLOBEX.encode() in everything
    run_cli("verify", "--store", url, "--receipt", str(receipt))
    again = run_cli("erase", "--store", url, "--where", "metadata.user=u-1", "--receipt",
                    str(tmp_path / "u1.json"))
    assert "g1: erased" in again.stdout and "a1: erased" in again.stdout
    assert GLOBEX.encode() not in b"\n".join(raw for _, raw in store_bytes(url))


def test_a_retention_scope_selects_on_metadata(url: str) -> None:
    _write(url)
    with dsh.open(url) as store:
        set_retention(store, RetentionPolicy(where={"tenant": "globex"}, trash_after_days=0))
        assert [(i.session_id, i.scope) for i in gc(store).items] == [("g1", "tenant=globex")]


@pytest.mark.parametrize("metadata", [{"a": [1]}, {"": "x"}, {"a b": "x"},
                                      {"k": "v" * 1025}, {f"k{i}": i for i in range(33)},
                                      "tenant=acme"])
def test_metadata_that_breaks_the_rules_is_refused(tmp_path: Path, metadata: object) -> None:
    with dsh.open(f"sqlite:///{tmp_path}/s.db") as store:
        with pytest.raises(EventRejectedError) as refused:
            store.persistence.create({"version": 0, "id": "x", "createdAt": 1,
                                      "metadata": metadata})
        assert refused.value.code == "HEADER"
        assert not store.persistence.exists("x")


def test_a_jsonl_log_with_metadata_loads_in_the_published_dsh(tmp_path: Path) -> None:
    # docs/formats.md#header-metadata: dsh drops the unknown header key and reads the log
    import os
    import shutil
    import subprocess

    from dsh.json import dumps

    root = Path(os.environ.get("DSH_NODE_DIR") or "/tmp/dsh-node")
    node = root / "nodebin" / "node_modules" / "node" / "bin" / "node"
    if not node.is_file():
        pytest.skip("SKIPPED LOUDLY: the published dsh is not set up (run "
                    "../shared/peers/dsh-node/setup.sh /tmp/dsh-node or set DSH_NODE_DIR)")
    url = f"jsonl://{tmp_path}/logs"
    _write(url)
    scratch = tmp_path / "scratch"
    shutil.copytree(tmp_path / "logs", scratch)
    out = tmp_path / "export"
    proc = subprocess.run([str(node), str(root / "app" / "export.mjs"), "jsonl", str(scratch),
                           str(out)], capture_output=True, text=True, cwd=root / "app",
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    view = json.loads((out / "a1.json").read_text())
    with dsh.open(url) as store:
        assert store.read("a1").header["metadata"]["tenant"] == "acme"
        ours = [json.loads(dumps(e)) for e in store.read("a1").stored_events]
    assert view["events"] == ours

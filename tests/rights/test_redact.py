"""Redaction on every real backend: after ``dsh redact --secrets`` no byte of any store file
(or PostgreSQL row) holds a secret, the log verifies, the model view is a valid request, and
the receipt's commitments match the removed events.

Rule: docs/forgetting.md#redaction.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh import RightsError
from dsh._verify import verify_events
from dsh.interop import to_anthropic, to_openai
from dsh.json import FrozenDict, dumps
from dsh.rights import REDACTED_TEXT, find_secrets, redact, verify_receipt
from dsh.rights._forks import fork_children
from dsh.session import Event
from tests.rights.conftest import (
    SECRETS,
    assert_valid_anthropic,
    assert_valid_openai,
    build,
    run_cli,
)


def store_bytes(url: str) -> list[tuple[str, bytes]]:
    """Every byte of the store: each file under a file store's folder (the SQLite file, its
    WAL and sidecars, every JSONL log and sidecar), or every PostgreSQL row, decompressed."""
    if url.startswith("postgresql"):
        import psycopg
        import zstandard

        from dsh.testing._stores import postgres_base_url

        schema = url.split("schema=")[1].split("&")[0]
        out: list[tuple[str, bytes]] = []
        with psycopg.connect(postgres_base_url()) as conn:
            for table in ("events", "sessions"):
                for row in conn.execute(f'SELECT * FROM "{schema}".{table}'):
                    for value in row:
                        if isinstance(value, bytes | memoryview):
                            raw = bytes(value)
                            with contextlib.suppress(zstandard.ZstdError):
                                raw = zstandard.ZstdDecompressor().decompress(raw)
                            out.append((table, raw))
                        elif value is not None:
                            out.append((table, str(value).encode()))
        return out
    root = Path(url.split("://", 1)[1])
    folder = root.parent if root.suffix == ".db" else root
    out = []
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            raw = path.read_bytes()
            if path.name.endswith(".zstd"):
                import zstandard

                with zstandard.ZstdDecompressor().stream_reader(
                        io.BytesIO(raw), read_across_frames=True) as frames:
                    raw += frames.read()
            out.append((str(path), raw))
    return out


def leaks(url: str) -> list[tuple[str, str]]:
    return [(where, name) for where, raw in store_bytes(url)
            for name, secret in SECRETS.items() if secret.encode() in raw]


def test_redact_secrets_leaves_no_secret_in_any_store_byte(url: str, tmp_path: Path) -> None:
    build(url, padding=300)
    run_cli("compact", "--store", url, "s1")  # a checkpoint summary derived from the secrets
    run_cli("fork", "--store", url, "s1", "--as", "s1-child")  # a child with a copied prefix
    with dsh.open(url) as store:
        originals = {sid: store.read(sid).stored_events for sid in ("s1", "s1-child")}
    assert leaks(url)  # the secrets are there to begin with
    receipt = tmp_path / "receipt.json"
    dry = json.loads(run_cli("redact", "--store", url, "s1", "--secrets", "--dry-run",
                             "--json").stdout)
    assert dry["dryRun"] and {i["seq"] for i in dry["items"]} >= {2, 5, 6, 7}
    with dsh.open(url) as store:
        assert store.read("s1").stored_events == originals["s1"]  # the dry run wrote nothing
    run_cli("redact", "--store", url, "s1", "--secrets", "--receipt", str(receipt),
            "--reason", "keys pasted")
    run_cli("redact", "--store", url, "s1-child", "--secrets")
    assert leaks(url) == []
    for sid in ("s1", "s1-child"):
        run_cli("verify", "--store", url, sid)
    made = json.loads(receipt.read_text())
    assert oct(receipt.stat().st_mode & 0o777) == "0o600"
    with dsh.open(url) as store:
        read = store.read("s1")
        events = read.stored_events
        view = dsh.Session.restore("s1", read.events, read.header).derive_messages()
    original = originals["s1"]
    for item in made["items"]:
        seq = item["seq"]
        assert events[seq]["seq"] == seq and events[seq]["type"] == original[seq]["type"]
        assert events[seq]["time"] == original[seq]["time"]
        salt = bytes.fromhex(item["salt"])
        assert hashlib.sha256(salt + dumps(original[seq])).hexdigest() == item["commitment"]
    record = events[made["recordSeq"]]
    assert record["type"] == "redaction/applied" and record["data"]["reason"] == "keys pasted"
    assert "salt" not in json.dumps(dict(record["data"]))  # salts stay with the receipt
    unchanged = {i["seq"] for i in made["items"]}
    assert all(events[s] == original[s] for s in range(len(original)) if s not in unchanged)
    assert REDACTED_TEXT in json.dumps(list(view))
    assert_valid_openai({"messages": to_openai(view)})
    assert_valid_anthropic(to_anthropic(view))
    assert any(t.get("action") == "rows replaced" or t.get("action") == "rewritten"
               for t in made["touched"])


def test_a_receipt_that_lists_a_seq_twice_does_not_verify(tmp_path: Path) -> None:
    # docs/forgetting.md#receipts: a redaction receipt is checked item by item against its
    # record; a second item for the same seq (a made-up commitment put first) was folded away
    # by the seq-keyed reading, and the receipt verified clean
    url = f"jsonl://{tmp_path}/logs"
    build(url)
    with dsh.open(url) as store:
        made = json.loads(json.dumps(redact(store, "s1", seqs=[7, 2], by="carol").to_json()))
        assert verify_receipt(store, made) == []
        made["items"].insert(0, {**made["items"][0], "commitment": "0" * 64,
                                 "salt": "00" * 16})
        assert verify_receipt(store, made) == [
            f"not a dsh receipt: items[1].seq {made['items'][0]['seq']} is listed twice"]


def test_redact_seq_tombstones_whole_events_and_verify_catches_a_later_change(
        tmp_path: Path) -> None:
    url = f"jsonl://{tmp_path}/logs"
    build(url)
    with dsh.open(url) as store:
        result = redact(store, "s1", seqs=[7, 2], by="carol")
        read = store.read("s1")
    assert [i.seq for i in result.items] == [2, 7]
    events = list(read.stored_events)
    assert events[2]["data"]["content"] == [{"type": "text", "text": REDACTED_TEXT}]
    block = events[7]["data"]["message"]["content"][0]
    assert block["toolCallId"] == "c1" and block["content"][0]["text"] == REDACTED_TEXT
    assert verify_events(events, header=read.header) == []
    changed = json.loads(dumps(events[2]))
    changed["data"]["content"][0]["text"] = "[redacted]"
    events[2] = Event(FrozenDict(changed))
    rules = [v.rule for v in verify_events(events, header=read.header)]
    assert rules == ["REDACTION_TOMBSTONE"]


def test_redact_match_and_refusals(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    build(url)
    with dsh.open(url) as store:
        result = redact(store, "s1", match=r"REGION=\w+")
        assert [(i.seq, i.type, i.spans) for i in result.items] == [(7, "tool/result", 1)]
        with pytest.raises(RightsError) as caught:
            redact(store, "s1", match="(")
        assert caught.value.code == "BAD_PATTERN"
        with pytest.raises(RightsError) as caught:
            redact(store, "s1")
        assert caught.value.code == "NOTHING_SELECTED"
        assert redact(store, "s1", match="REGION=eu").items == ()  # nothing left: no write
    done = run_cli("redact", "--store", url, "s1", "--seq", "999", check=False)
    assert done.returncode == 1 and "error[NO_SUCH_SEQ]" in done.stderr


def test_find_secrets_knows_the_formats_agents_leak() -> None:
    text = ("key sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz012345 and AIzaSyA1234567890abcdefghijkl"
            "mnopqrstuv\nexport DB_PASSWORD=hunter2\n-----BEGIN RSA PRIVATE KEY-----\nMIIE\n"
            "-----END RSA PRIVATE KEY-----\nAuthorization: Bearer abcdefghijklmnop1234 "
            "postgres://app:s3cr3t@db/x")
    found = [text[a:b] for a, b in find_secrets(text)]
    assert "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz012345" in found
    assert "AIzaSyA1234567890abcdefghijklmnopqrstuv" in found
    assert "hunter2" in found and "s3cr3t" in found and "abcdefghijklmnop1234" in found
    assert any(f.startswith("-----BEGIN RSA PRIVATE KEY") for f in found)
    assert find_secrets("hello world, line 5 of the file") == []


def test_a_redacted_jsonl_log_loads_in_the_published_dsh(tmp_path: Path) -> None:
    root = Path(os.environ.get("DSH_NODE_DIR") or "/tmp/dsh-node")
    node = root / "nodebin" / "node_modules" / "node" / "bin" / "node"
    if not node.is_file():
        pytest.skip("SKIPPED LOUDLY: the published dsh is not set up (run "
                    "../shared/peers/dsh-node/setup.sh /tmp/dsh-node or set DSH_NODE_DIR)")
    url = f"jsonl://{tmp_path}/logs"
    build(url)
    run_cli("redact", "--store", url, "s1", "--secrets")
    scratch = tmp_path / "scratch"
    shutil.copytree(tmp_path / "logs", scratch)
    out = tmp_path / "export"
    proc = subprocess.run([str(node), str(root / "app" / "export.mjs"), "jsonl", str(scratch),
                           str(out)], capture_output=True, text=True, cwd=root / "app",
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    view: dict[str, Any] = json.loads((out / "s1.json").read_text())
    with dsh.open(url) as store:
        ours = [json.loads(dumps(e)) for e in store.read("s1").stored_events]
    assert view["events"] == ours
    assert not any(secret in json.dumps(view) for secret in SECRETS.values())
    assert REDACTED_TEXT in json.dumps(view["messages"])


def test_a_redaction_names_the_forks_that_keep_their_own_copy(tmp_path: Path) -> None:
    # before: 'dsh redact p --secrets' said only what it tombstoned in p, while p's fork kept
    # the key as it was (a redaction rewrites one log; erasure is what reaches forks)
    url = f"sqlite://{tmp_path}/s.db"
    build(url)
    run_cli("fork", "--store", url, "s1", "--as", "kid")
    run_cli("fork", "--store", url, "kid", "--at", "3", "--as", "grandkid")
    run_cli("fork", "--store", url, "s1", "--at", "1", "--as", "early")  # forked before the key
    done = run_cli("redact", "--store", url, "s1", "--secrets")
    changed = [int(line.split("#")[1].split()[0]) for line in done.stdout.splitlines()
               if ": would redact" in line or ": redacted" in line]
    assert changed and min(changed) <= 3
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, done.stderr
    assert warnings[0].startswith(f"warning: kid (a fork of s1) keeps its own copy of "
                                  f"{len(changed)} event")
    assert f"(#{', #'.join(map(str, changed))})" in warnings[0]
    assert warnings[1].startswith("warning: grandkid (a fork of kid) keeps")
    assert "early" not in done.stderr
    with dsh.open(url) as store:  # what the warning says: the fork still holds the key
        assert SECRETS["user"] in json.dumps([dict(e) for e in store.read("kid").events])
        # the one lineage map the warning and erasure walk (rights/_forks.py)
        children = fork_children(store)
        kid_seed = store.persistence.read("kid").header["seedLength"]
        assert children == {"s1": [("early", 2), ("kid", kid_seed)], "kid": [("grandkid", 4)]}

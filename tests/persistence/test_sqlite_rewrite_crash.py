"""A SQLite rewrite SIGKILLed at each of its failpoints keeps the seal chain.

A redaction or erasure stages the new seal beside the old one, commits the new rows, then
renames the staged seal into place (docs/formats.md#integrity-seals). A real child process
is killed with SIGKILL at every point in between; after each kill the session reads as the
state before or the state after, ``dsh verify --against`` holds the proof kept before the
rewrite (the chain survived), and the next writer adopts the staged seal and chains on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import dsh
from dsh.persistence import _seal
from dsh.rights import erase, redact
from tests.persistence.test_seal_chain import _cli, _write, user

BATCHES = 5
SECRET = '"text": "message 002"'

_KILLED = """
import os, signal, sys
import dsh
from dsh._failpoints import set_failpoint_hook
from dsh.rights import erase, redact
from tests.persistence.test_seal_chain import _cli, _write, user

url, at, how = sys.argv[1:4]


def hook(point):
    if point == at:
        os.kill(os.getpid(), signal.SIGKILL)


set_failpoint_hook(hook)
with dsh.open(url) as store:
    if how == "erase":
        erase(store, ["s1"])
    else:
        redact(store, "s1", match="message 002")
print("finished")
"""


def _texts(url: str) -> list[str]:
    with dsh.open(url) as store:
        return [json.dumps(e["data"]) for e in store.read("s1").events]


@pytest.mark.parametrize("how", ["redact", "erase"])
@pytest.mark.parametrize("at", ["sqlite.rewrite.staged", "sqlite.rewrite.commit",
                                "sqlite.rewrite.committed"])
def test_a_rewrite_killed_at_each_point_keeps_the_chain_a_kept_proof_holds(
        tmp_path: Path, at: str, how: str) -> None:
    url, seal = _write(tmp_path, "sqlite", BATCHES)
    kept = tmp_path / "proof.json"
    out = _cli(tmp_path, url, "s1", "--proof", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    kept.write_text(out.stdout, encoding="utf-8")
    head = json.loads(out.stdout)["proof"]["sessions"][0]["head"]
    staged = _seal.staged_name(seal)

    killed = subprocess.run([sys.executable, "-c", _KILLED, url, at, how], check=False,
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert staged.is_file()  # staged before the transaction, renamed only after its commit
    changed = at == "sqlite.rewrite.committed"
    texts = _texts(url)  # a reader uses the seal that verifies the rows, staged or not
    assert any(SECRET in t for t in texts) is not changed
    assert (len(texts) > BATCHES) is changed  # the rewrite appends its own record events
    out = _cli(tmp_path, url, "s1", "--against", str(kept), "--proof", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    proof = json.loads(out.stdout)["proof"]["sessions"][0]
    assert proof["batches"] == BATCHES + (1 if changed else 0)
    assert proof["hashes"][:BATCHES] == json.loads(kept.read_text())["proof"]["sessions"][0][
        "hashes"]
    assert changed or proof["head"] == head

    with dsh.open(url) as store:  # a writer adopts the staged seal (or drops it) and chains on
        session = store.session("s1")
        session.append("user/message", user("more"), surface_op="append")
        store.flush(session)
    assert not staged.exists()
    found = _seal.read_seal(seal)
    assert found is not None and len(found.chain) == BATCHES + (2 if changed else 1)
    out = _cli(tmp_path, url, "s1", "--against", str(kept))
    assert out.returncode == 0, out.stdout + out.stderr
    with dsh.open(url) as store:  # running the operation again completes it
        if how == "erase":
            erase(store, ["s1"])
        else:
            redact(store, "s1", match="message 002")
    assert not any(SECRET in t for t in _texts(url))
    out = _cli(tmp_path, url, "s1", "--against", str(kept))
    assert out.returncode == 0, out.stdout + out.stderr

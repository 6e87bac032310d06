"""An erased or purged session is not brought back by importing its transcript again.

Rule: docs/forgetting.md#erasure-and-import. Real stores (SQLite, JSONL folder, PostgreSQL
when reachable), the bundled examples, the ``dsh`` command in fresh processes. The erase and the
purge run on every backend (each backend stores the erasure record and the trash in its own
way); a changed transcript of an erased session runs on SQLite only: the decision
reads the erasure record from the stored log, which the erase test reads back on every backend.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsh.testing._stores import postgres_unreachable, temporary_postgres_url
from tests.cli.test_new_user_walk import dsh

SECRET = "my password is hunter2-erase-me"


@pytest.fixture(params=["sqlite", "jsonl", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'sessions.db'}"
    elif request.param == "jsonl":
        yield f"{tmp_path / 'logs'}/"
    else:
        reason = postgres_unreachable()
        if reason:
            pytest.skip(reason)
        with temporary_postgres_url() as url:
            yield url


def _json(tmp_path: Path, *args: str) -> tuple[dict[str, Any], str]:
    done = dsh(tmp_path, *args, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout), done.stderr


def _examples(tmp_path: Path, store: str, *extra: str) -> tuple[dict[str, Any], str]:
    return _json(tmp_path, "import", "--examples", "--store", store, *extra)


def _one_from(report: dict[str, Any], folder: str) -> str:
    return next(e["session"] for e in report["imported"] if f"/{folder}/" in e["path"])


def test_erase_then_import_again_keeps_it_erased_until_include_erased(
        tmp_path: Path, store: str) -> None:
    first, _ = _examples(tmp_path, store)
    listed = len(first["imported"])
    # openai-chat is read whole, claude-code streamed: both import paths
    whole, streamed = _one_from(first, "openai-chat"), _one_from(first, "claude-code")
    receipt = tmp_path / "receipt.json"
    erased = dsh(tmp_path, "erase", whole, streamed, "--receipt", str(receipt),
                 "--store", store)
    assert erased.returncode == 0, erased.stdout + erased.stderr
    assert ("2 sessions came from 'dsh import': importing the same transcript again skips it"
            in erased.stdout)

    again, err = _examples(tmp_path, store)
    assert sorted(e["session"] for e in again["erased"]) == sorted([whole, streamed])
    assert again["imported"] == [] and again["superseded"] == []
    assert len(again["skipped"]) == listed - 2
    assert ("skipped 2 transcripts erased before (dsh erase, dsh rm --purge); pass "
            "--include-erased to import them again") in " ".join(err.split())
    # the text form says it per file and counts it
    text = dsh(tmp_path, "import", "--examples", "--store", store)
    assert text.returncode == 0
    assert f"{whole}  erased before, not imported again" in text.stdout
    assert "2 skipped (erased before)" in text.stdout
    # nothing was written: the receipt still verifies, no session came back
    verified = dsh(tmp_path, "verify", "--receipt", str(receipt), "--store", store)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    ls, _ = _json(tmp_path, "ls", "--all", "--store", store)
    assert len(ls) == listed

    back, _ = _examples(tmp_path, store, "--include-erased")
    assert back["erased"] == []
    assert sorted(e["session"] for e in back["superseded"]) == sorted([whole, streamed])
    new = next(e["by"] for e in back["superseded"] if e["session"] == whole)
    shown = dsh(tmp_path, "show", new, "--store", store)
    assert shown.returncode == 0 and "[REDACTED]" not in shown.stdout
    # imported again under the new id: a routine import leaves it alone now
    routine, _ = _examples(tmp_path, store)
    assert sorted(e["session"] for e in routine["erased"]) == sorted([whole, streamed])
    assert routine["imported"] == [] and routine["superseded"] == []


def test_purge_then_import_again_keeps_it_purged(tmp_path: Path, store: str) -> None:
    first, _ = _examples(tmp_path, store)
    sid = _one_from(first, "codex")
    purged = dsh(tmp_path, "rm", "--purge", sid, "--store", store)
    assert purged.returncode == 0, purged.stdout + purged.stderr
    again, err = _examples(tmp_path, store)
    assert [e["session"] for e in again["erased"]] == [sid]
    assert again["imported"] == [] and again["superseded"] == []
    assert "pass --include-erased to import it again" in " ".join(err.split())
    back, _ = _examples(tmp_path, store, "--include-erased")
    assert [e["session"] for e in back["superseded"]] == [sid]


def test_a_changed_transcript_of_an_erased_session_is_still_skipped(tmp_path: Path) -> None:
    from dsh.cli._cmd_import import examples_dir

    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    bundled = examples_dir()
    assert bundled is not None
    source = tmp_path / "chat.json"
    shutil.copy(next((bundled / "openai-chat").glob("*.json")), source)
    doc = json.loads(source.read_text())
    messages = doc["messages"] if isinstance(doc, dict) else doc
    messages.append({"role": "user", "content": SECRET})
    source.write_text(json.dumps(doc))
    first, _ = _json(tmp_path, "import", str(source), "--store", store)
    sid = first["imported"][0]["session"]
    receipt = tmp_path / "r.json"
    assert dsh(tmp_path, "erase", sid, "--receipt", str(receipt), "--store",
               store).returncode == 0
    # the same file grown, and edited where it was imported: the same conversation
    messages.append({"role": "user", "content": "and one more line"})
    source.write_text(json.dumps(doc))
    grown, _ = _json(tmp_path, "import", str(source), "--store", store)
    assert [e["session"] for e in grown["erased"]] == [sid] and grown["updated"] == []
    messages[-2]["content"] = SECRET + " (edited)"
    source.write_text(json.dumps(doc))
    edited, _ = _json(tmp_path, "import", str(source), "--store", store)
    assert [e["session"] for e in edited["erased"]] == [sid] and edited["superseded"] == []
    exported = dsh(tmp_path, "export", sid, "--store", store)
    assert SECRET not in exported.stdout + exported.stderr

"""An import killed half-way: what the other commands say of it (docs/interop.md#staged-imports).

Real ``dsh import`` processes on a real Claude Code transcript of two 5,000-event batches and a
real SQLite store: the import is SIGKILLed once its first batch is appended (a hook in the
process sends the signal, so the moment is the same on every run). ``dsh verify`` and ``dsh
resume`` then name the half-written import and the command that completes it (resume writes
nothing), ``dsh ls --trash`` shows why the session is in the trash, and the next import says it
completed an interrupted import. Also: ``dsh ls --trash`` shows a ``dsh rm --reason``, and
``dsh show --from`` past the end or inside a turn (docs/cli.md#dsh-show).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.cli.test_cli import EXAMPLES, Dsh
from tests.cli.test_import_memory import _transcript

SESSION = "5e551011-0000-4000-8000-00000000abcd"
REASON = "dsh import: being written, listed once complete"

_KILLED_AFTER_FIRST_BATCH = """
import os, signal, sys
from dsh.session import SeedStream
settle = SeedStream.settle
def settle_then_die(self):
    settle(self)  # the first batch is appended: die as a kill -9 would
    os.kill(os.getpid(), signal.SIGKILL)
SeedStream.settle = settle_then_die
from dsh.cli import main
main(sys.argv[1:])
"""


def _killed_import(tmp_path: Path) -> tuple[Dsh, str, Path]:
    dsh = Dsh(tmp_path)
    source = tmp_path / f"{SESSION}.jsonl"
    _transcript(source, 3)  # about 10,000 events: two 5,000-event batches
    store = f"sqlite:{tmp_path / 'store.db'}"
    killed = subprocess.run([sys.executable, "-c", _KILLED_AFTER_FIRST_BATCH, "import",
                             str(source), "--store", store], env=dsh.env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    return dsh, store, source


def _events(dsh: Dsh, store: str) -> list[dict[str, object]]:
    return dsh.event_lines(SESSION, "--store", store)


def test_a_killed_import_is_named_by_verify_refused_by_resume_and_completed(
        tmp_path: Path) -> None:
    dsh, store, source = _killed_import(tmp_path)
    written = _events(dsh, store)
    assert 0 < len(written) < 10_000
    again = f"'dsh import {source}' again to complete it"

    verified = dsh("verify", "--all", "--store", store)
    assert f"note: {SESSION}: a half-written import" in verified.stderr
    assert again in verified.stderr
    assert "dsh resume" not in verified.stderr

    refused = dsh("resume", SESSION, "--store", store, check=1)
    assert refused.stderr.startswith(f"error[IMPORT_INCOMPLETE]: session '{SESSION}' is a "
                                     "half-written import")
    assert again in refused.stderr
    error = json.loads(dsh("resume", SESSION, "--store", store, "--json", check=1).stderr)
    assert (error["code"], error["session_id"]) == ("IMPORT_INCOMPLETE", SESSION)
    assert _events(dsh, store) == written  # resume wrote nothing

    trash = dsh("ls", "--trash", "--store", store).stdout.splitlines()
    assert trash[0].split()[-1] == "REASON"
    assert trash[1].startswith(SESSION) and trash[1].endswith(REASON)
    assert [(r["id"], r["trashReason"]) for r in
            dsh.json("ls", "--trash", "--json", "--store", store)] == [(SESSION, REASON)]

    completed = dsh("import", str(source), "--store", store)
    appended = 10_000 - len(written)  # roughly: the exact figure is the report's
    lines = completed.stdout.splitlines()
    assert lines[0].startswith(f"completed {SESSION}  +")
    assert "an interrupted import, now complete and listed" in lines[0]
    assert lines[-1] == ("0 imported, 0 skipped (already imported), 0 failed, "
                         "1 completed (interrupted imports)")
    assert "source grew" not in completed.stdout
    rows = dsh.json("ls", "--json", "--store", store)
    assert [r["id"] for r in rows] == [SESSION] and "trashReason" not in rows[0]
    assert rows[0]["events"] > len(written) + appended // 2
    dsh("verify", SESSION, "--store", store)
    again_json = json.loads(dsh("import", str(source), "--store", store, "--json").stdout)
    assert again_json["completed"] == [] and again_json["skipped"] == [
        {"path": str(source), "session": SESSION}]


def test_a_completion_reported_in_json(tmp_path: Path) -> None:
    dsh, store, source = _killed_import(tmp_path)
    before = len(_events(dsh, store))
    report = json.loads(dsh("import", str(source), "--store", store, "--json").stdout)
    assert report["updated"] == [] and report["imported"] == []
    [done] = report["completed"]
    assert (done["path"], done["session"]) == (str(source), SESSION)
    # the appended events and the completion's own import/source record
    assert before + done["appended"] + 1 == len(_events(dsh, store))


def test_ls_trash_shows_the_reason_of_dsh_rm(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    store = f"sqlite:{tmp_path / 'store.db'}"
    dsh("import", str(EXAMPLES / "transcripts" / "claude-code"), "--store", store)
    first, second = sorted(r["id"] for r in dsh.json("ls", "--json", "--store", store))[:2]
    dsh("rm", first, "--reason", "the tester asked", "--store", store)
    dsh("rm", second, "--store", store)
    lines = dsh("ls", "--trash", "--store", store).stdout.splitlines()
    assert lines[0].endswith("SOURCE       REASON")
    assert {line.split()[0]: line.split("claude-code")[-1].strip() for line in lines[1:]} == {
        first: "the tester asked", second: "-"}
    assert {r["id"]: r["trashReason"] for r in
            dsh.json("ls", "--trash", "--json", "--store", store)} == {
        first: "the tester asked", second: None}
    assert "trashReason" not in dsh.json("ls", "--all", "--json", "--store", store)[0]


def _turn_starts(dsh: Dsh, sid: str, store: str) -> list[tuple[int, int]]:
    return [(e["seq"], e["data"]["turn"]) for e in  # type: ignore[index]
            dsh.event_lines(sid, "--type", "turn/start", "--store", store)]


def _richest(tmp_path: Path) -> tuple[Dsh, str, str, int]:
    dsh = Dsh(tmp_path)
    store = f"sqlite:{tmp_path / 'store.db'}"
    dsh("import", str(EXAMPLES / "transcripts" / "claude-code"), "--store", store)
    row = max(dsh.json("ls", "--json", "--store", store), key=lambda r: r["turns"])
    return dsh, store, row["id"], row["events"] - 1


def test_show_from_past_the_end(tmp_path: Path) -> None:
    dsh, store, sid, last = _richest(tmp_path)
    past = dsh("show", sid, "--from", str(last + 1), "--store", store, check=1)
    assert past.stdout == ""
    assert past.stderr.startswith(f"error[SEQ_NOT_FOUND]: session '{sid}' ends at seq {last}, "
                                  f"before --from {last + 1}; 'dsh show {sid} --last 20' "
                                  "shows its end")
    dsh("show", sid, "--from", str(last), "--store", store)  # the last seq is in range


def test_show_from_inside_a_turn_names_the_turn(tmp_path: Path) -> None:
    dsh, store, sid, _ = _richest(tmp_path)
    (_, first_turn), (opens, turn) = _turn_starts(dsh, sid, store)[:2]
    inside = dsh("show", sid, "--from", str(opens + 2), "--store", store).stdout.splitlines()
    assert inside[2].startswith(f"── turn {turn} ──")
    assert not any(f"── turn {first_turn} ──" in line for line in inside)
    at = dsh("show", sid, "--from", str(opens), "--store", store).stdout.splitlines()
    assert at[2].startswith(f"── turn {turn} ──")
    assert sum(line.startswith("── turn ") for line in at) == sum(
        line.startswith("── turn ") for line in inside)  # printed once, not twice
    items = dsh.json("show", sid, "--from", str(opens + 2), "--json", "--store", store)["items"]
    assert items[0] == {"kind": "turn", "seq": opens, "turn": turn,
                        "time": items[0]["time"]}


_KILLED_WHEN_STAGED = """
import os, signal, sys
import dsh.rights
trash = dsh.rights.trash
def trash_then_die(*args, **kwargs):
    trash(*args, **kwargs)  # staged in the trash, before any event is written
    os.kill(os.getpid(), signal.SIGKILL)
dsh.rights.trash = trash_then_die
from dsh.cli import main
main(sys.argv[1:])
"""


def test_an_import_killed_before_its_first_event_is_completed_and_listed(
        tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    source = tmp_path / f"{SESSION}.jsonl"
    _transcript(source, 3)
    store = f"sqlite:{tmp_path / 'store.db'}"
    killed = subprocess.run([sys.executable, "-c", _KILLED_WHEN_STAGED, "import", str(source),
                             "--store", store], env=dsh.env, capture_output=True, text=True,
                            timeout=300, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert _events(dsh, store) == []
    assert "a half-written import" in dsh("verify", "--all", "--store", store).stderr
    report = json.loads(dsh("import", str(source), "--store", store, "--json").stdout)
    assert report["imported"] == [] and [c["session"] for c in report["completed"]] == [SESSION]
    assert report["completed"][0]["appended"] == len(_events(dsh, store)) > 10_000
    assert [r["id"] for r in dsh.json("ls", "--json", "--store", store)] == [SESSION]
    dsh("verify", SESSION, "--store", store)

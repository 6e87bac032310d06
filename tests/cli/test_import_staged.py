"""A streamed import failing late leaves no partial session listed (docs/interop.md#staged-imports).

Real ``dsh import`` processes on real files and a real SQLite store: a Claude Code transcript
long enough to take several batches whose last line cannot be mapped (found only when the
second read reaches it, after earlier batches were written), and one whose writes fail on a
full file-size budget (``RLIMIT_FSIZE``: every write past it fails with EFBIG, as a full disk
does). In both cases ``dsh ls`` lists nothing, ``dsh ls --trash`` names the staged session, and
importing the repaired file completes it: listed, whole, verified.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

from tests.cli.test_cli import Dsh
from tests.cli.test_import_memory import _transcript

SESSION = "5e551011-0000-4000-8000-00000000abcd"


def _long_transcript(folder: Path) -> Path:
    path = folder / f"{SESSION}.jsonl"
    _transcript(path, 3)  # about 10,000 events: more than one 5,000-event batch
    return path


def _listed(dsh: Dsh, store: str, *extra: str) -> list[str]:
    return [row["id"] for row in dsh.json("ls", "--json", "--store", store, *extra)]


def _complete(dsh: Dsh, store: str, good: Path) -> None:
    """Importing the repaired file lists the session, whole and verified."""
    dsh("import", str(good), "--store", store)
    assert _listed(dsh, store) == [SESSION]
    assert _listed(dsh, store, "--trash") == []
    fresh = f"sqlite:{good.parent / 'fresh.db'}"
    dsh("import", str(good), "--store", fresh)
    # the same model view as a fresh import; the completion adds one import/source record
    assert dsh.json("messages", SESSION, "--store", store) == dsh.json(
        "messages", SESSION, "--store", fresh)
    assert dsh.json("ls", "--json", "--store", store)[0]["events"] == dsh.json(
        "ls", "--json", "--store", fresh)[0]["events"] + 1
    dsh("verify", SESSION, "--store", store)


def test_an_unmappable_last_line_leaves_nothing_listed(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    good = _long_transcript(tmp_path)
    bad = tmp_path / "bad" / good.name
    bad.parent.mkdir()
    text = good.read_text(encoding="utf-8")
    last = json.loads(text.splitlines()[-1])["uuid"]
    record = {"type": "user", "uuid": "u-last", "parentUuid": last, "sessionId": SESSION,
              "timestamp": "2026-02-10T23:00:00.000Z"}  # a user line without a message
    bad.write_text(text + json.dumps(record) + "\n", encoding="utf-8")
    store = f"sqlite:{tmp_path / 'store.db'}"
    failed = dsh("import", str(bad), "--store", store, "--json", check=1)
    reason = json.loads(failed.stdout)["failed"][0]["reason"]
    assert f'{bad}:{len(text.splitlines()) + 1}: a Claude Code user line needs a "message" ' \
        "object; fix or delete that line" in reason and "wait in the trash" in reason
    assert _listed(dsh, store) == []
    assert _listed(dsh, store, "--trash") == [SESSION]
    _complete(dsh, store, good)


_LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.RLIM_INFINITY))
from dsh.cli import main
main(sys.argv[2:])
"""


def test_a_write_failing_late_leaves_nothing_listed(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    good = _long_transcript(tmp_path)
    store_file = tmp_path / "store.db"
    store = f"sqlite:{store_file}"
    dsh("init", "--store", store)  # the store exists, empty
    limit = 4_000_000  # the first batches fit (the whole store takes 7.4 MB), the last do not
    failed = subprocess.run([sys.executable, "-c", _LIMITED, str(limit), "import", str(good),
                             "--store", store, "--json"], env=dsh.env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert "wait in the trash" in json.loads(failed.stdout)["failed"][0]["reason"]
    assert resource.getrlimit(resource.RLIMIT_FSIZE)[0] == resource.RLIM_INFINITY
    assert _listed(dsh, store) == []
    assert _listed(dsh, store, "--trash") == [SESSION]
    _complete(dsh, store, good)

"""Sessions the standard-format tests run over: every corpus and bundled-example import, and the
dsh-written stores in tests/fixtures (read with their repair closers, as `dsh export` reads)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dsh.interop import ImportedSession, SessionLog, import_file
from dsh.json import thaw
from tests.conftest import DSH_LOGS
from tests.interop.helpers import CORPUS, EXAMPLES


def transcript_files() -> list[str]:
    """Names (relative to the shared folder or the examples) of every transcript file."""
    names = []
    if (CORPUS / "MANIFEST.json").is_file():
        manifest = json.loads((CORPUS / "MANIFEST.json").read_text())
        names += [f"corpus/{f['file']}" for f in manifest["files"]
                  if "/subagents/" not in f["file"]]
    names += [f"examples/{p.relative_to(EXAMPLES)}" for p in sorted(EXAMPLES.rglob("*.*"))]
    return sorted(names)


def transcript_path(name: str) -> Path:
    kind, rest = name.split("/", 1)
    return (CORPUS if kind == "corpus" else EXAMPLES) / rest


def imported(name: str) -> list[ImportedSession]:
    return import_file(transcript_path(name))


def fixture_logs(tmp: Path) -> Iterator[tuple[str, SessionLog]]:
    """The sessions of the dsh-written JSONL store (copied first: reading may repair)."""
    import dsh

    root = tmp / "dsh-logs"
    shutil.copytree(DSH_LOGS / "jsonl" / "main", root)
    with dsh.open(f"jsonl://{root}") as store:
        for header in sorted(store.persistence.list_headers(), key=lambda h: str(h["id"])):
            read = store.read(str(header["id"]))
            yield str(header["id"]), SessionLog(read.header, read.events)


def view(log: Any) -> list[str]:
    """The model view of a session (header + events), as canonical JSON per message."""
    from dsh.session import Session

    if isinstance(log, ImportedSession):
        return [json.dumps(thaw(m), sort_keys=True)
                for m in log.to_session(clock=lambda: 0).derive_messages()]
    events = list(log.events)
    session = Session.restore(str(log.header["id"]), events, log.header,
                              inherited_event_count=log.header.get("seedLength") or 0)
    return [json.dumps(thaw(m), sort_keys=True) for m in session.derive_messages()]


def cli(store: Path) -> Any:
    """A runner of `python -m dsh.cli ARGS --store STORE` that returns stdout (exit 0 asserted)."""
    import subprocess
    import sys

    def run(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "dsh.cli", *args, "--store", str(store)],
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    return run


UNSAFE_ARGUMENTS = {"big": '{"id": 12345678901234567890123, "n": 1.0}',
                    "nan": '{"x": NaN, "y": [-Infinity, 2]}', "plain": '{"path": "a.txt"}'}
"""Call arguments by call id: numbers no JSON reader keeps exactly (a snowflake id beyond
±(2^53-1), NaN and Infinity), and plain ones."""


def write_unsafe_calls(db: Path, arguments: dict[str, str] | None = None) -> None:
    """Store session ``ids`` in the SQLite file ``db``: one turn calling ``lookup`` with each
    of ``arguments`` (default :data:`UNSAFE_ARGUMENTS`), each answered ``found``, then
    ``done``."""
    import dsh

    calls = UNSAFE_ARGUMENTS if arguments is None else arguments
    with dsh.open(f"sqlite:{db}") as store:
        recorder = store.recorder("ids")
        with recorder.turn() as turn:
            with turn.step() as step:
                step.user_message("look them up")
                step.request({"provider": "deepseek", "model": "deepseek-chat"})
                step.assistant([{"type": "tool-call", "id": name, "name": "lookup",
                                 "arguments": text} for name, text in calls.items()])
                for name in calls:
                    step.tool_call(name)
                    step.tool_result(name, "found")
            with turn.step() as step:
                step.assistant("done")


def strict_json(text: str) -> Any:
    """``text`` parsed as JSON proper: ``NaN``/``Infinity`` fail the test."""
    def not_json(constant: str) -> None:
        raise AssertionError(f"{constant} in the export: not JSON")

    return json.loads(text, parse_constant=not_json)

"""Stores the viewer tests show: real dsh-logs and corpus sessions, hostile text, damage."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import dsh
from dsh.testing import postgres_unreachable, temporary_postgres_url
from dsh.testing._logs import assistant, fixed_clock, tool_result, user

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / "tests" / "fixtures" / "dsh-logs"
CORPUS = REPO / "tests" / "corpus"
PROJECT = "--workspace-demo-app--"

HOSTILE_SCRIPT = "<script>alert('xss-script')</script>"
HOSTILE_IMG = "<img src=x onerror=\"alert('xss-img')\">"
HOSTILE_LINK = "<a href=\"javascript:alert('xss-link')\">click me</a>"
HOSTILE_TERMINAL = "\x1b[2J\x1b]0;pwned\x07 bidi:\u202eevil\u202c"
BIG_LINE_CHARS = 10 * 1024 * 1024


def copy_dsh_logs(root: Path) -> None:
    """Put dsh's own sessions (normal, fork, compaction, two crashes) into the JSONL store."""
    target = root / PROJECT
    target.mkdir(parents=True, exist_ok=True)
    for store, ids in (("main", ["s1-normal", "s4-fork-of-s1", "s5-compaction"]),
                       ("crash-before-resume", ["s2a-crash-after-tool-call",
                                                "s2b-crash-before-tool-call"])):
        for sid in ids:
            shutil.copytree(LOGS / "jsonl" / store / PROJECT / sid, target / sid)
    for path in root.rglob("*"):
        path.chmod(0o700 if path.is_dir() else 0o600)


def import_corpus(url: str, files: list[str]) -> None:
    """Import corpus transcripts with the real `dsh import`."""
    subprocess.run([sys.executable, "-m", "dsh.cli", "import", *[str(CORPUS / f) for f in files],
                    "--store", url], check=True, capture_output=True, timeout=300)


def write_hostile(url: str, session_id: str = "hostile") -> None:
    """A session whose text is markup, script, terminal escapes and one 10 MB line."""
    clock = fixed_clock()
    with dsh.open(url, clock=clock) as store:
        s = store.session(session_id, header={"version": 0, "id": session_id,
                                              "createdAt": 1_767_225_600_000,
                                              "cwd": "/workspace/demo-app"})
        s.append("turn/start", {"turn": 1})
        s.append("step/start", {"turn": 1, "step": 1})
        s.append("user/message", user(f"{HOSTILE_SCRIPT} and {HOSTILE_IMG} and {HOSTILE_LINK}",
                                      "u1"), surface_op="append")
        s.append("assistant/message", assistant(1, 1, f"terminal {HOSTILE_TERMINAL}", "a1",
                                                [("c1", "bash")]), surface_op="append")
        s.append("tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "bash",
                               "arguments": "{}"})
        s.append("tool/result", tool_result(1, 1, "c1", "x" * BIG_LINE_CHARS),
                 surface_op="append", source_event_seqs=[4])
        s.append("step/end", {"turn": 1, "step": 1})
        s.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})


def write_turns(session: dsh.Session, turns: int) -> None:
    """``turns`` completed turns of a question and its answer (6 events, 2 messages each)."""
    for turn in range(1, turns + 1):
        session.append("turn/start", {"turn": turn})
        session.append("step/start", {"turn": turn, "step": 1})
        session.append("user/message", user(f"question {turn}", f"u{turn}"),
                       surface_op="append")
        session.append("assistant/message", assistant(turn, 1, f"answer {turn}", f"a{turn}"),
                       surface_op="append")
        session.append("step/end", {"turn": turn, "step": 1})
        session.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})


def write_damaged(url: str, root: Path, session_id: str = "damaged") -> Path:
    """A JSONL session of three turns whose fifth line no longer parses; returns its file."""
    clock = fixed_clock()
    with dsh.open(url, clock=clock) as store:
        s = store.session(session_id, header={"version": 0, "id": session_id,
                                              "createdAt": 1_767_225_600_000,
                                              "cwd": "/workspace/demo-app"})
        write_turns(s, 3)
    path = next(root.rglob(f"{session_id}/session.jsonl"))
    lines = path.read_bytes().split(b"\n")
    lines[8] = b'{"type": "user/message", "seq": 7, oops'  # seq 7's line: not JSON any more
    path.write_bytes(b"\n".join(lines))
    return path


@contextlib.contextmanager
def store_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A store URL of ``backend`` (``jsonl``, ``sqlite``, ``postgres``: a temporary schema,
    skipped when PostgreSQL is unreachable)."""
    if backend == "postgres":
        reason = postgres_unreachable()
        if reason is not None:
            pytest.skip(reason)
        with temporary_postgres_url() as url:
            yield url
    elif backend == "jsonl":
        yield f"jsonl:{tmp_path / 'j'}"
    else:
        yield f"sqlite:{tmp_path / 's.db'}"


def start_view(url: str, *, stderr: int = subprocess.DEVNULL
               ) -> tuple[subprocess.Popen[str], str, str]:
    """``dsh view --store url`` on a free port: the process, its base URL and its token."""
    server = subprocess.Popen([sys.executable, "-m", "dsh.cli", "view", "--store", url,
                               "--no-browser", "--port", "0"], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=stderr, text=True)
    assert server.stdout is not None
    base, token = server.stdout.readline().strip().split("/?token=")
    return server, base, token

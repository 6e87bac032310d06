"""No untyped error, no wrong blame (docs/rules.md#readers-of-a-log-being-written, REPAIR_FAILED).

The campaign's reproducers: JSON nested 20,000 levels deep in a log line (valid in dsh) made
the reader or an error message raise ``RecursionError`` and ``dsh messages`` fail as a bug; a
torn-tail repair on a full disk let a raw ``OSError`` out of a resume, which the CLI then
blamed on its own output; a reader of a JSONL session being written every turn gave up with
``UNSTABLE_READ``.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh._errors import LogCorruptError, PersistenceError
from dsh.persistence.jsonl import _backend as jsonl_backend
from tests.cli.test_cli import Dsh

DEPTH = 20_000


def user(text: str) -> dict[str, Any]:
    return {"id": f"u-{text}", "role": "user", "source": {"kind": "user"},
            "content": [{"type": "text", "text": text}]}


def _jsonl_session(root: Path, turns: int = 1) -> tuple[str, Path]:
    url = f"jsonl://{root}/store"
    with dsh.open(url) as store:
        session = store.session("s1")
        for n in range(turns):
            session.append("user/message", user(f"m{n}"), surface_op="append")
            store.flush(session)
    [log] = (root / "store").glob("*/*/session.jsonl")
    return url, log


def _append_line(log: Path, line: str) -> None:
    with open(log, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def test_deep_nesting_reads_prints_and_exports(tmp_path: Path) -> None:
    url, log = _jsonl_session(tmp_path)
    deep_list = "[" * DEPTH + "]" * DEPTH
    deep_dict = '{"a":' * DEPTH + "1" + "}" * DEPTH
    _append_line(log, '{"seq":1,"type":"x/deep","time":1,"ignorable":true,'
                      f'"data":{{"v":{deep_list}}}}}')
    _append_line(log, '{"seq":2,"type":"user/message","time":1,"data":{"id":"u2","role":"user",'
                      f'"source":{{"kind":"user"}},"meta":{deep_dict},'
                      '"content":[{"type":"text","text":"y"}]},"surfaceOp":"append"}')
    with dsh.open(url) as store:
        events = store.read("s1").events
        assert len(events) == 3
        text = repr(events[1])  # main: RecursionError in FrozenList.__repr__
        assert text.startswith("Event(") and text.count("[") >= DEPTH
        assert len(store.session("s1").derive_messages()) == 2
    run = Dsh(tmp_path)
    for args in (["events", "s1"], ["messages", "s1"], ["show", "s1"], ["verify", "s1"],
                 ["export", "s1", "--format", "openai"]):
        out = run(*args, "--store", url)  # main: dsh messages exited with error[BUG]
        assert "error" not in out.stderr
    assert run("messages", "s1", "--store", url).stdout.count('{"a": ') == DEPTH


def test_deep_line_with_an_unrepresentable_number_is_corruption(tmp_path: Path) -> None:
    url, log = _jsonl_session(tmp_path)
    deep = "[" * DEPTH + "1152921504606846976" + "]" * DEPTH  # 2**60: JavaScript rounds it
    _append_line(log, f'{{"seq":1,"type":"x/deep","time":1,"ignorable":true,"data":{deep}}}')
    _append_line(log, '{"seq":2,"type":"x/deep","time":1,"ignorable":true,"data":{}}')
    with dsh.open(url) as store, pytest.raises(LogCorruptError) as caught:
        store.read("s1")  # main: RecursionError
    assert caught.value.where["line"] == 3
    assert "JavaScript reader cannot represent" in caught.value.message


def _tear(log: Path) -> bytes:
    _append_line(log, '{"seq":1,"type":"user/message","time":1,"data":{"id":"torn"')
    return log.read_bytes()


def test_full_disk_torn_tail_repair_is_typed(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    url, log = _jsonl_session(tmp_path)
    before = _tear(log)

    def disk_full(*args: Any) -> Path:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(jsonl_backend, "save_cut", disk_full)
    with dsh.open(url) as store, pytest.raises(PersistenceError) as caught:
        store.session("s1")  # main: a raw OSError
    assert caught.value.code == "REPAIR_FAILED"
    assert str(log) in caught.value.message and "free space" in caught.value.message
    assert log.read_bytes() == before  # nothing cut: the bytes could not be saved first


def test_full_disk_repair_in_the_cli_is_not_blamed_on_the_output(tmp_path: Path) -> None:
    url, log = _jsonl_session(tmp_path)
    before = _tear(log)
    child = (
        "import errno, os, sys\n"
        "from dsh.persistence.jsonl import _backend as b\n"
        "def full(*a):\n"
        "    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
        "b.save_cut = full\n"
        "from dsh.cli._app import main\n"
        "main(sys.argv[1:])\n")
    proc = subprocess.run([sys.executable, "-c", child, "resume", "s1", "--store", url],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("error[REPAIR_FAILED]"), proc.stderr  # main: OUTPUT_FAILED
    assert "output" not in proc.stderr
    assert log.read_bytes() == before


def test_reader_of_a_log_being_written_reads_a_committed_prefix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that appends a record between any two stats of the reader (every turn)."""
    url, log = _jsonl_session(tmp_path, turns=3)
    real_stat = os.stat
    seq = [3]

    def busy_stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if os.fspath(path) == str(log):
            # the rest of the record started last time, then the first half of the next one:
            # the file never ends on a record boundary when the reader looks
            record = b'{"seq":%d,"type":"x/tick","time":1,"ignorable":true,"data":{}}\n'
            with open(log, "ab") as f:
                if seq[0] > 3:
                    f.write((record % (seq[0] - 1))[20:])
                f.write((record % seq[0])[:20])
            seq[0] += 1
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", busy_stat)
    with dsh.open(url) as store:
        read = store.read("s1")  # main: UNSTABLE_READ after 50 tries
    monkeypatch.setattr(os, "stat", real_stat)
    with open(log, "ab") as f:  # the writer finishes its last record
        f.write((b'{"seq":%d,"type":"x/tick","time":1,"ignorable":true,"data":{}}\n'
                 % (seq[0] - 1))[20:])
    assert read.torn is None
    seqs = [e["seq"] for e in read.events]
    assert seqs == list(range(len(seqs))) and len(seqs) >= 4
    assert [e["type"] for e in read.events[:3]] == ["user/message"] * 3
    with dsh.open(url) as store:  # the prefix read is a state the log was in
        assert [e["seq"] for e in store.read("s1").events][:len(seqs)] == seqs

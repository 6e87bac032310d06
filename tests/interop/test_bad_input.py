"""Bad input gives a clear ImportFormatError naming path, line and format."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import threading
from pathlib import Path

import pytest

from dsh._errors import ImportFormatError
from dsh.interop import FORMATS, detect_format, import_file
from tests.interop.helpers import EXAMPLES


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("fmt", ["auto", *FORMATS])
def test_import_missing_file_is_refused(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / "absent.jsonl"
    with pytest.raises(ImportFormatError) as info:
        import_file(path, fmt)
    assert info.value.where["path"] == str(path)
    assert "cannot read" in info.value.message


def test_import_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ImportFormatError, match="is a folder, not a regular file"):
        import_file(tmp_path, "claude-code")


@pytest.mark.parametrize("fmt", ["auto", *FORMATS])
def test_import_fifo_is_refused_at_once(tmp_path: Path, fmt: str) -> None:
    """A FIFO given as a transcript is refused, not waited on."""
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            import_file(fifo, fmt)
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)
        else:
            outcome.append(None)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)
    if worker.is_alive():  # main: blocked in open() waiting for a writer; release it
        with open(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK), "wb"):
            pass
        worker.join(60)
        pytest.fail("importing a FIFO blocked waiting for a writer")
    [error] = outcome
    assert isinstance(error, ImportFormatError)
    assert "is a FIFO (named pipe), not a regular file" in error.message
    assert error.where["path"] == str(fifo)


@pytest.mark.parametrize("fmt", ["auto", *FORMATS])
def test_import_empty_file_is_refused(tmp_path: Path, fmt: str) -> None:
    path = _write(tmp_path, "empty.jsonl", b"\n  \n")
    with pytest.raises(ImportFormatError, match="empty") as info:
        import_file(path, fmt)
    assert info.value.where["line"] == 1


@pytest.mark.parametrize("fmt", ["auto", *FORMATS])
def test_import_binary_file_is_refused(tmp_path: Path, fmt: str) -> None:
    path = _write(tmp_path, "blob.jsonl", b'{"type":"user"}\n\x00\x01\x02binary')
    with pytest.raises(ImportFormatError, match="holds a NUL byte") as info:
        import_file(path, fmt)
    assert info.value.where["byte_offset"] == 16
    assert info.value.message.startswith(f"{path}:2: ")  # the line and column of the byte
    assert "a NUL byte at column 1 (byte offset 16)" in info.value.message


def test_import_non_utf8_file_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "latin.jsonl", b'{"type":"user","text":"caf\xe9"}\n')
    with pytest.raises(ImportFormatError, match="not valid UTF-8") as info:
        import_file(path, "claude-code")
    assert info.value.where["format"] == "claude-code"
    assert info.value.message == (f"{path}:1: claude-code transcript is not valid UTF-8 at "
                                  "column 27 (byte offset 26); expected JSON text: save the "
                                  "file as UTF-8")


def test_import_truncated_last_line_names_the_line(tmp_path: Path) -> None:
    source = (EXAMPLES / "dsh" / "session.jsonl").read_bytes()
    torn = source[: source.rindex(b"\n", 0, len(source) - 1) + 40]
    path = _write(tmp_path, "torn.jsonl", torn)
    line = torn.count(b"\n") + 1
    at = re.escape(str(path))
    with pytest.raises(ImportFormatError, match=f"^{at}:{line}: dsh transcript ends with a "
                       "truncated record") as info:
        import_file(path, "dsh")
    assert info.value.where == {"path": str(path), "line": line, "format": "dsh"}


def test_a_live_log_being_written_imports_the_lines_before_its_torn_last_one(
        tmp_path: Path) -> None:
    source = (EXAMPLES / "claude-code" / "simple.jsonl").read_bytes()
    torn = source[: source.rindex(b"\n", 0, len(source) - 1) + 40]
    path = _write(tmp_path, "torn.jsonl", torn)
    whole = _write(tmp_path, "whole.jsonl", torn[: torn.rindex(b"\n") + 1])
    for fmt in ("claude-code", "auto"):  # detection reads the same way
        [cut] = import_file(path, fmt)
        assert cut.torn_line == 7
        [complete] = import_file(whole, fmt)
        assert complete.torn_line is None
        assert [e["type"] for e in cut.events] == [e["type"] for e in complete.events]


def test_import_malformed_middle_line_names_the_line(tmp_path: Path) -> None:
    lines = (EXAMPLES / "codex" / "legacy-interrupted.jsonl").read_text().split("\n")
    lines[2] = lines[2][:-3]
    path = _write(tmp_path, "bad.jsonl", "\n".join(lines).encode())
    with pytest.raises(ImportFormatError,
                       match=r"bad.jsonl:3: codex record is not valid JSON at column \d+") as info:
        import_file(path, "codex")
    assert info.value.where["line"] == 3


@pytest.mark.parametrize("fmt", ["openai-chat", "gemini-cli", "swe-agent", "atif"])
def test_a_whole_document_format_given_jsonl_says_document_and_names_the_format_to_pass(
        tmp_path: Path, fmt: str) -> None:
    # before: "record is not valid JSON at column 1: unexpected content after document; fix or
    # delete that line", as if the file were a JSONL of that format
    path = _write(tmp_path, "t.jsonl", b'{"a": 1}\n{"b": 2}\n')
    with pytest.raises(ImportFormatError) as info:
        import_file(path, fmt)
    assert str(info.value) == (
        f"{path}:2: {fmt} document is not valid JSON at column 1: unexpected content after "
        f"document; the file holds one JSON value per line (JSONL), not one {fmt} JSON "
        "document: pass the --format the file is in, or leave --format out to detect it")
    broken = _write(tmp_path, "t.json", b'{"a":\n')  # one document, cut short
    with pytest.raises(ImportFormatError, match=r"t.json:2: .* document is not valid JSON "
                                                r"at column 1: .*; fix the document$"):
        import_file(broken, fmt)


@pytest.mark.parametrize(("example", "wrong"), [
    ("claude-code/simple.jsonl", "codex"),
    ("codex/rollout-compacted-aborted.jsonl", "claude-code"),
    ("dsh/session.jsonl", "claude-code"),
    ("claude-code/simple.jsonl", "dsh"),
    ("openai-chat/conversation.json", "swe-agent"),
    ("openai-chat/conversation.json", "openhands"),
    ("openai-chat/conversation.json", "anthropic"),
    ("openhands/trajectory.json", "openai-chat"),
    ("swe-agent/run.traj", "openai-chat"),
    ("anthropic/request.json", "mini-swe-agent"),
    ("claude-code/simple.jsonl", "openai-chat"),
])
def test_import_wrong_format_is_refused(tmp_path: Path, example: str, wrong: str) -> None:
    path = tmp_path / Path(example).name
    shutil.copy(EXAMPLES / example, path)
    with pytest.raises(ImportFormatError) as info:
        import_file(path, wrong)
    assert info.value.where["format"] == wrong
    assert info.value.where["path"] == str(path)


def test_import_unknown_format_name_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text("[]")
    with pytest.raises(ImportFormatError, match="unknown transcript format 'cursor'"):
        import_file(path, "cursor")


@pytest.mark.parametrize("doc", [{"hello": "world"}, 42, "text", [1, 2, 3]])
def test_detect_unknown_json_is_refused(tmp_path: Path, doc: object) -> None:
    path = tmp_path / "unknown.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ImportFormatError, match=r"not a supported transcript format \(a JSON "
                       r".*; supported: claude-code, codex, .*gemini-cli") as info:
        detect_format(path)
    assert info.value.where["format"] == "auto"


def test_detect_unknown_jsonl_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "unknown.jsonl"
    path.write_text('{"a": 1}\n{"b": 2}\n')
    with pytest.raises(ImportFormatError, match="not a supported transcript format") as info:
        import_file(path)
    assert info.value.where["line"] == 1


def test_dsh_log_with_other_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "v1.jsonl"
    path.write_text('{"type":"session","version":1,"id":"s","createdAt":0}\n')
    with pytest.raises(ImportFormatError, match="header version is 1"):
        import_file(path, "dsh")


def test_dsh_log_with_gap_in_seq_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gap.jsonl"
    path.write_text('{"type":"session","version":0,"id":"s","createdAt":0}\n'
                    '{"type":"turn/start","seq":1,"time":0,"data":{"turn":1}}\n')
    with pytest.raises(ImportFormatError, match="seq 1; expected 0") as info:
        import_file(path, "dsh")
    assert info.value.where["line"] == 2


def test_claude_code_non_object_line_is_refused(tmp_path: Path) -> None:
    source = (EXAMPLES / "claude-code" / "simple.jsonl").read_text()
    path = tmp_path / "s.jsonl"
    path.write_text(source + "[1, 2]\n")
    with pytest.raises(ImportFormatError, match=r"s.jsonl:8: a Claude Code record must be a JSON "
                       r"object with a string \"type\" field; this line is an array") as info:
        import_file(path, "claude-code")
    assert info.value.where["line"] == 8


BAD_INPUTS = {
    "random bytes": bytes(random.Random(7).randrange(256) for _ in range(400)),
    "truncated line": b'{"a": 1}\n{"type": "assi',
    "not UTF-8": b'{"a": 1}\n{"b": "caf\xe9"}\n',
    "not JSON": b'not json\n{"a": 1}\n',
    "an array": b'[1, 2, 3]\n',
    "a number": b"42\n",
    "a string": b'"text"',
    "a wrong object": b'{"type": 7, "history": 3, "messages": {}}\n',
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_every_importer_names_file_line_first_then_what_was_wrong_and_what_to_do(
        tmp_path: Path, fmt: str, name: str) -> None:
    # before: only Claude Code's and the JSON decoder's errors began "FILE:LINE: "; the others
    # said "at line N" (or "first line N", "line N must be", a byte offset and no line) in
    # their own words, some with nothing to do (docs/interop.md#bad-input)
    path = _write(tmp_path, "bad.jsonl", BAD_INPUTS[name])
    with pytest.raises(ImportFormatError) as info:
        for top in import_file(path, fmt):
            for session in top.walk():
                session.to_session()
    message, where = info.value.message, info.value.where
    assert where["path"] == str(path) and where["format"] == fmt
    assert message.startswith(f"{path}:{where['line']}: "), message
    assert re.search(r"\bline \d|first line|offset \d+\)$", message) is None, message
    if name in ("random bytes", "not UTF-8", "not JSON"):  # a fault with a column names it
        assert re.search(r" at column \d+", message), message
    what_to_do = ("fix ", "pass ", "save ", "cut ", "re-copy", "remove ", "check ", "import ")
    assert any(verb in message.split(": ", 1)[1] for verb in what_to_do), message

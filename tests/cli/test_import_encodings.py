"""``dsh import`` and files in the wrong encoding: UTF-16/32 named, misencoded JSON failed.

Rules: docs/cli.md (import, in a folder) and docs/interop.md#what-an-importer-reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsh import ImportFormatError
from dsh.interop import import_file
from tests.cli.test_cli import EXAMPLES, Dsh

SIMPLE = EXAMPLES / "transcripts" / "claude-code" / "simple.jsonl"


def _latin1_transcript() -> bytes:
    """The simple Claude Code example with one message holding é saved as Latin-1."""
    text = SIMPLE.read_text(encoding="utf-8")
    first, rest = text.split("\n", 1)
    record = json.loads(first)
    record["message"] = {"role": "user", "content": "café"}
    return (json.dumps(record, ensure_ascii=False) + "\n" + rest).encode("latin-1")


def test_utf16_and_utf32_files_are_named_with_what_to_do(tmp_path: Path) -> None:
    cli = Dsh(tmp_path)
    text = SIMPLE.read_text(encoding="utf-8")
    for encoding, name in (("utf-16", "UTF-16"), ("utf-16-le", "UTF-16"),
                           ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32"),
                           ("utf-32-le", "UTF-32")):
        path = tmp_path / f"{encoding}.json"
        path.write_bytes(text.encode(encoding))
        result = cli("import", str(path), check=1)
        assert result.stdout.startswith(f"failed    {path}:1: this file is {name}; save it as "
                                        "UTF-8 (e.g. PowerShell's > writes UTF-16)"), result.stdout
        assert "NUL byte" not in result.stdout and "binary" not in result.stdout
        with pytest.raises(ImportFormatError) as refused:
            import_file(path, "auto")
        assert refused.value.code == "IMPORT_FORMAT" and refused.value.where == {
            "path": str(path), "line": 1, "format": "auto", "encoding": name}


def test_in_a_folder_misencoded_json_fails_and_binary_files_are_ignored(tmp_path: Path) -> None:
    cli = Dsh(tmp_path)
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "latin1.jsonl").write_bytes(_latin1_transcript())
    (folder / "utf16.jsonl").write_bytes(SIMPLE.read_text(encoding="utf-8").encode("utf-16"))
    (folder / "image.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x01")
    (folder / "notes.json").write_bytes("caf\xe9 au lait\n".encode("latin-1"))  # no JSON
    result = cli("import", str(folder), "--store", f"sqlite:{tmp_path / 's.db'}", check=1)
    lines = result.stdout.splitlines()
    assert [line.split()[:2] for line in lines[:-1]] == [
        ["failed", f"{folder / 'latin1.jsonl'}:1:"],
        ["failed", f"{folder / 'utf16.jsonl'}:1:"]]
    assert "is not valid UTF-8" in lines[0] and "this file is UTF-16" in lines[1]
    assert lines[-1] == ("0 imported, 0 skipped (already imported), 2 failed, 2 ignored (not "
                         "transcripts; --verbose lists them)")


def test_a_folder_walk_decides_by_the_errors_kind_not_by_words_in_its_path(
        tmp_path: Path) -> None:
    # before: failed or ignored was read from the message text, which starts with the path,
    # so a misencoded transcript under a folder named "NUL byte" was ignored, and a damaged
    # one under "not a supported transcript format" too
    cli = Dsh(tmp_path)
    folder = tmp_path / "NUL byte" / "not a supported transcript format"
    folder.mkdir(parents=True)
    (folder / "latin1.jsonl").write_bytes(_latin1_transcript())
    (folder / "torn.jsonl").write_bytes(SIMPLE.read_bytes() + b"{not json\n")
    (folder / "image.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x01")
    (folder / "notes.yaml").write_text("a: 1\n")
    result = cli("import", str(tmp_path / "NUL byte"), "--store", f"sqlite:{tmp_path / 's.db'}",
                 "--json", check=1)
    summary = json.loads(result.stdout)
    assert [(f["path"], f["code"], f["kind"]) for f in summary["failed"]] == [
        (str(folder / "latin1.jsonl"), "IMPORT_FORMAT", "encoding"),
        (str(folder / "torn.jsonl"), "IMPORT_FORMAT", "invalid")]
    assert sorted((f["path"], f["code"], f["kind"]) for f in summary["ignored"]) == [
        (str(folder / "image.json"), "IMPORT_FORMAT", "binary"),
        (str(folder / "notes.yaml"), "IMPORT_FORMAT", "unsupported")]


def test_import_json_names_the_code_of_each_failure(tmp_path: Path) -> None:
    # before: a failed entry under --json had only path and reason
    cli = Dsh(tmp_path)
    (tmp_path / "x.db").write_bytes(b"SQLite format 3\x00" + bytes(100))
    (tmp_path / "empty.jsonl").write_bytes(b"")
    result = cli("import", str(tmp_path / "x.db"), str(tmp_path / "empty.jsonl"), "--store",
                 f"sqlite:{tmp_path / 's.db'}", "--json", check=1)
    failed = json.loads(result.stdout)["failed"]
    assert [(f["path"], f["code"], f["kind"]) for f in failed] == [
        (str(tmp_path / "x.db"), "IMPORT_FORMAT", "sqlite"),
        (str(tmp_path / "empty.jsonl"), "IMPORT_FORMAT", "empty")]
    assert failed[0]["reason"].startswith("this is a SQLite database, not a transcript")
    with pytest.raises(ImportFormatError) as refused:
        import_file(tmp_path / "x.db", "auto")
    assert refused.value.kind == "sqlite"
    assert refused.value.to_json()["kind"] == "sqlite"


@pytest.mark.parametrize("fmt", [(), ("--format", "claude-code"), ("--format", "openai-chat")])
def test_in_a_folder_an_empty_file_is_ignored_and_named_it_fails(
        tmp_path: Path, fmt: tuple[str, ...]) -> None:
    # before: an empty .jsonl in a folder (Claude Code leaves some) was `failed`, exit 1 on
    # every `dsh import` of that folder, for a file that holds no session to import
    cli = Dsh(tmp_path)
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "empty.jsonl").write_bytes(b"")
    (folder / "blank.json").write_bytes(b"\n  \r\n")
    store = ("--store", f"sqlite:{tmp_path / 's.db'}")
    result = cli("import", str(folder), *fmt, *store, "--json", check=0)
    summary = json.loads(result.stdout)
    assert summary["failed"] == []
    assert sorted((i["path"], i["code"], i["kind"]) for i in summary["ignored"]) == [
        (str(folder / "blank.json"), "IMPORT_FORMAT", "empty"),
        (str(folder / "empty.jsonl"), "IMPORT_FORMAT", "empty")]
    assert all(i["reason"].endswith("is empty; expected at least one record")
               for i in summary["ignored"])
    shown = cli("import", str(folder), *fmt, *store, check=0).stdout
    assert shown.splitlines()[-1] == ("0 imported, 0 skipped (already imported), 0 failed, "
                                      "2 ignored (not transcripts; --verbose lists them)")
    named = cli("import", str(folder / "empty.jsonl"), *fmt, *store, check=1)
    assert named.stdout.startswith(f"failed    {folder / 'empty.jsonl'}:1: ")
    assert "is empty; expected at least one record" in named.stdout

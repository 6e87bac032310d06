"""The corpus the tests read is in the repository, each file under a licence that allows it."""

from __future__ import annotations

import hashlib
import json

from tests.conftest import CORPUS


def test_every_corpus_file_is_in_the_repository_with_its_licence_and_notice() -> None:
    manifest = json.loads((CORPUS / "MANIFEST.json").read_text(encoding="utf-8"))
    notice = (CORPUS / "NOTICE.md").read_text(encoding="utf-8")
    assert "Permission is hereby granted, free of charge" in notice
    listed = set()
    for entry in manifest["files"]:
        path = CORPUS / entry["file"]
        assert str(entry["license"]).startswith("MIT"), entry["file"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"], entry["file"]
        assert f"https://github.com/{entry['origin_repo'].split(' ')[0]}" in notice
        listed.add(path)
    data = {p for p in CORPUS.rglob("*") if p.is_file()
            and p.name not in ("MANIFEST.json", "README.md", "NOTICE.md")}
    assert data == listed  # nothing unlisted, so nothing without a named licence
    assert [e["license"] for e in manifest["left_out"]] == ["none stated"]
    assert len(listed) == 35

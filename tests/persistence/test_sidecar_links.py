"""Readers refuse symlinked sidecar folders as writers do (docs/formats.md#file-modes-and-symlinks).

A SQLite store keeps its seals in ``<db>.dsh-seals`` and its restore points in
``<db>.dsh-checkpoints``; with either folder replaced by a link to a folder elsewhere, a write
was refused (``SYMLINK``) but a read followed the link and trusted what it found there.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import dsh
from dsh._errors import PersistenceError
from dsh.persistence import _restore_point as rp


def user(text: str) -> dict[str, Any]:
    return {"id": f"u-{text}", "role": "user", "source": {"kind": "user"},
            "content": [{"type": "text", "text": text}]}


def _store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(rp, "RESTORE_POINT_EVERY_EVENTS", 2)
    url = f"sqlite://{tmp_path}/store.db"
    with dsh.open(url) as store:
        session = store.session("s1")
        for n in range(4):
            session.append("user/message", user(f"m{n}"), surface_op="append")
            store.flush(session)
    return url


def _link_aside(folder: Path, elsewhere: Path) -> None:
    shutil.move(str(folder), str(elsewhere))
    folder.symlink_to(elsewhere, target_is_directory=True)


def test_read_refuses_a_symlinked_seal_folder(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    url = _store(tmp_path, monkeypatch)
    seals = tmp_path / "store.db.dsh-seals"
    assert any(seals.iterdir())
    _link_aside(seals, tmp_path / "elsewhere-seals")
    with dsh.open(url) as store, pytest.raises(PersistenceError) as caught:
        store.read("s1")  # main: followed the link
    assert caught.value.code == "SYMLINK"
    assert str(seals) in caught.value.message


def test_resume_ignores_a_symlinked_restore_point_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = _store(tmp_path, monkeypatch)
    points = tmp_path / "store.db.dsh-checkpoints"
    [point] = points.iterdir()
    elsewhere = tmp_path / "elsewhere-points"
    _link_aside(points, elsewhere)
    opened: list[str] = []
    real = rp.read_restore_point_file

    def spy(path: Path) -> bytes:
        try:
            data = real(path)
        except rp.RestorePointRefused as exc:
            opened.append(str(exc))
            raise
        opened.append("used")
        return data

    monkeypatch.setattr(rp, "read_restore_point_file", spy)
    with dsh.open(url) as store:
        session = store.session("s1")  # the full read: same session
        assert [e["data"]["content"][0]["text"] for e in session.events[:4]] == [
            "m0", "m1", "m2", "m3"]
    assert opened and "used" not in opened  # main: read through the link
    assert (elsewhere / point.name).exists()


def test_a_private_folder_is_made_once_and_never_through_a_link_or_over_a_file(
        tmp_path: Path) -> None:
    # docs/formats.md#file-modes-and-symlinks: folders made 0700; a symlink where one belongs
    # is refused (SYMLINK) even when it leads to a folder, a file there is NOT_A_DIRECTORY
    import stat

    from dsh.persistence._paths import mkdir_private

    folder = tmp_path / "a" / "locks"
    assert mkdir_private(folder, "locks") is True
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert mkdir_private(folder, "locks") is False  # there already
    link = tmp_path / "link"
    link.symlink_to(folder)
    with pytest.raises(PersistenceError) as caught:
        mkdir_private(link, "locks")
    assert caught.value.code == "SYMLINK"
    (tmp_path / "file").write_text("")
    with pytest.raises(PersistenceError) as caught:
        mkdir_private(tmp_path / "file", "locks")
    assert caught.value.code == "NOT_A_DIRECTORY"

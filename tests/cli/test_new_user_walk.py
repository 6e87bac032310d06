"""A second new-user walk: what it found, each as a real ``dsh`` process on a real store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DSH = [sys.executable, "-m", "dsh.cli"]
SIMPLE = "11111111-2222-4333-8444-555555555555"  # a bundled example of 19 events, one turn


def dsh(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_API_KEY") and not k.startswith("DSH_")}
    env.update({"DSH_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)})
    return subprocess.run([*DSH, *args], env=env, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


@pytest.fixture
def bad_store(tmp_path: Path) -> str:
    """A JSONL store of the examples whose session 1111… ends with a user/message of no shape.

    Appended by hand after the seal, as another program would: the read takes it (no seal
    covers it) and the model view refuses it (SHAPE at seq 19).
    """
    store = f"jsonl://{tmp_path / 'j'}"
    assert dsh(tmp_path, "import", "--examples", "--store", store).returncode == 0
    (log,) = (tmp_path / "j").glob(f"*/{SIMPLE}/session.jsonl")
    with log.open("a") as out:
        out.write('{"type":"user/message","seq":19,"time":1,"data":{"x\\u001b":"A"}}\n')
    return store


def test_show_marks_an_event_the_model_view_refuses_and_exits_1(
        tmp_path: Path, bad_store: str) -> None:
    # before: dsh show printed the transcript without seq 19 and exited 0, while dsh messages
    # and dsh verify refused it
    messages = dsh(tmp_path, "messages", "1111", "--store", bad_store)
    assert messages.returncode == 1 and "error[SHAPE]" in messages.stderr
    for args in ((), ("--last", "1"), ("--from", "19")):
        shown = dsh(tmp_path, "show", "1111", "--store", bad_store, *args)
        assert shown.returncode == 1, args
        mark = [line for line in shown.stdout.splitlines() if line.startswith("✗")]
        assert mark == ["✗ invalid event  #19  user/message  SHAPE: user/message at seq 19 "
                        "lacks an identified message (expected data to be the message itself: "
                        "{id, role: 'user', content, source}, e.g. from create_user_message(); "
                        "found keys x\\x1b)"], args
        assert "\x1b" not in shown.stdout + shown.stderr
        (line,) = shown.stderr.splitlines()
        assert line.startswith(f"error[SHAPE]: session '{SIMPLE}' holds an event the model view "
                               "refuses (marked in the transcript): user/message at seq 19")
        assert f"'dsh verify {SIMPLE}' lists every problem" in line
    assert "notes.txt has 3 lines." in dsh(tmp_path, "show", "1111", "--store",
                                            bad_store).stdout  # the rest is still shown
    as_json = dsh(tmp_path, "show", "1111", "--store", bad_store, "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["items"][-1] == {
        "kind": "invalid", "seq": 19, "type": "user/message", "code": "SHAPE",
        "problem": "user/message at seq 19 lacks an identified message (expected data to be "
                   "the message itself: {id, role: 'user', content, source}, e.g. from "
                   "create_user_message(); found keys x\x1b)"}
    assert json.loads(as_json.stderr)["code"] == "SHAPE"


def test_a_message_without_its_surface_op_is_marked_too(tmp_path: Path) -> None:
    store = f"jsonl://{tmp_path / 'j'}"
    assert dsh(tmp_path, "import", "--examples", "--store", store).returncode == 0
    (log,) = (tmp_path / "j").glob(f"*/{SIMPLE}/session.jsonl")
    with log.open("a") as out:
        out.write(json.dumps({"type": "user/message", "seq": 19, "time": 1, "data": {
            "id": "u9", "role": "user", "content": [{"type": "text", "text": "hidden"}],
            "source": {"kind": "user"}}}) + "\n")
    shown = dsh(tmp_path, "show", "1111", "--store", store)
    assert shown.returncode == 1
    assert ("✗ invalid event  #19  user/message  SURFACE: session event 'user/message' at seq "
            "19 is surface-eligible and requires a surfaceOp marker") in shown.stdout
    assert "error[SURFACE]" in shown.stderr


def test_view_marks_the_invalid_event_as_show_does(tmp_path: Path, bad_store: str) -> None:
    from starlette.testclient import TestClient

    from dsh.view import ViewStore, create_app

    store = ViewStore(bad_store)
    try:
        with TestClient(create_app(store, token="t0k3n-walk")) as client:
            page = client.get(f"/s/{SIMPLE}?token=t0k3n-walk").text
    finally:
        store.close()
    assert 'id="seq-19"' in page
    assert "✗ invalid event user/message SHAPE: user/message at seq 19 lacks an identified " \
           "message" in page
    assert "found keys x\\x1b)" in page

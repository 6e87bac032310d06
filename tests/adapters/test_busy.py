"""A session another process writes: adapters read it without the write lock, and a write
waits (``wait=`` seconds, 5 by default as the CLI) then names the holder."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsh._errors import SessionBusyError

HOLDER = """
import asyncio, sys, time
from dsh.adapters.openai_agents import DshSession
async def main():
    s = DshSession("held", sys.argv[1])
    await s.add_items([{"role": "user", "content": "mine"}])
    print("ready", flush=True)
    time.sleep(120)
asyncio.run(main())
"""


def test_reads_go_through_and_a_write_names_the_holder(tmp_path: Path) -> None:
    from dsh.adapters.langgraph import DshSaver
    from dsh.adapters.openai_agents import DshSession

    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, store], stdout=subprocess.PIPE,
                              text=True, env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        session = DshSession("held", store, wait=0.3)
        assert asyncio.run(session.get_items()) == [{"role": "user", "content": "mine"}]
        with pytest.raises(SessionBusyError) as caught:
            asyncio.run(session.add_items([{"role": "user", "content": "theirs"}]))
        assert f"pid {holder.pid}" in caught.value.message
        assert "waited 0.3 s" in caught.value.message
        session.close()
        with DshSaver.from_url(store, wait=0.3) as saver:
            config = {"configurable": {"thread_id": "held", "checkpoint_ns": ""}}
            assert saver.get_tuple(config) is None  # read: no lock, nothing of LangGraph's
            with pytest.raises(SessionBusyError, match=f"pid {holder.pid}"):
                saver.put_writes({"configurable": {**config["configurable"],
                                                   "checkpoint_id": "x"}}, [("a", 1)], "t")
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()

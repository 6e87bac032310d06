"""pytest plugin: run any of the Agents SDK's own test files with DshSession as SQLiteSession.

For the files not vendored into ``tests/adapters/sdk_session_tests`` (the SDK's whole
``test_agent_runner.py``, say). Before the test modules import, ``agents.SQLiteSession`` is
replaced by the ``SQLiteSession`` of ``tests/adapters/sdk_session_tests/_substitute.py`` (a
DshSession with SQLiteSession's constructor), loaded by path: the SDK's own ``tests`` package
shadows ours. From an unpacked sdist (``pip download openai-agents==V --no-deps
--no-binary :all:``)::

    cd openai_agents-V
    PYTHONPATH=/path/to/dsh/tools/vendor python -m pytest -p sdk_substitute_plugin \\
        tests/test_agent_runner.py tests/test_agent_runner_streamed.py

Tests that look inside SQLiteSession (its sqlite3 connections, tables or private hooks such as
``_get_compaction_snapshot``) fail with an ``AttributeError`` or a missing table: they test
SQLiteSession itself, not the session contract.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import agents
import agents.memory
import agents.memory.sqlite_session

_SHIM = (Path(__file__).resolve().parents[2] / "tests" / "adapters" / "sdk_session_tests"
         / "_substitute.py")
_spec = importlib.util.spec_from_file_location("dsh_sdk_substitute", _SHIM)
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)

for _holder in (agents, agents.memory, agents.memory.sqlite_session):
    _holder.SQLiteSession = _module.SQLiteSession  # type: ignore[attr-defined]

"""The standard formats are optional extras: `import dsh` (and the interop, agent and CLI
packages) load none of their libraries; an export that needs none of them works without them."""

from __future__ import annotations

import subprocess
import sys

LIBRARIES = ("opentelemetry", "atif", "inspect_ai", "acp", "claude_agent_sdk", "google.protobuf")


def test_import_dsh_and_its_packages_loads_no_standard_library() -> None:
    code = ("import sys, dsh, dsh.interop, dsh.agent, dsh.cli._app\n"
            f"print([m for m in {LIBRARIES!r} if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.strip()
    assert out == "[]"


def test_every_export_runs_with_the_libraries_blocked() -> None:
    # A meta-path finder refuses the libraries: the exporters write plain JSON themselves.
    code = (
        "import sys, importlib.abc\n"
        f"BLOCKED = {LIBRARIES!r}\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.startswith(BLOCKED):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from dsh.interop import (import_file, to_atif, to_otlp_json, to_inspect_log,\n"
        "                         to_claude_code, to_codex)\n"
        "from tests.interop.helpers import EXAMPLES\n"
        "[s] = import_file(EXAMPLES / 'claude-code' / 'long-debugging.jsonl')\n"
        "for export in (to_atif, to_otlp_json, to_inspect_log, to_claude_code, to_codex):\n"
        "    assert export(s)\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.strip()
    assert out == "ok"

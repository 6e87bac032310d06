"""``import dsh`` (and the providers package) must not import the provider SDKs."""

from __future__ import annotations

import subprocess
import sys


def test_import_dsh_imports_no_provider_sdk() -> None:
    code = ("import sys, dsh, dsh.agent, dsh.agent.providers; "
            "print(sorted(m for m in ('openai', 'anthropic', 'httpx', 'httpx2') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"

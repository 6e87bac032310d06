"""Install lines a new user can run: from the checkout, the published form only when labelled."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PUBLISHED = re.compile(r"pip install[^`\n]*dsh-session\[")


def test_docs_install_extras_from_the_checkout_and_label_the_published_form() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for page in pages:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if PUBLISHED.search(line):
                assert "Published form" in line or "published form" in line, (
                    f"{page.name}:{number}: {line.strip()}")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "    .venv/bin/pip install -q -e '.[openai]'" in readme


def test_missing_extra_names_the_command_that_works_for_this_install(tmp_path: Path) -> None:
    # An openai package that cannot be imported: the hint must install from this checkout.
    (tmp_path / "shadow" / "openai").mkdir(parents=True)
    (tmp_path / "shadow" / "openai" / "__init__.py").write_text(
        "raise ImportError('openai is not installed here')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "shadow"), "OPENAI_API_KEY": "sk-test",
           "DSH_HOME": str(tmp_path / "home")}
    result = subprocess.run([sys.executable, "-m", "dsh.cli", "run", "hi", "--provider",
                             "openai"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.startswith("error[MISSING_EXTRA]")
    assert f"-m pip install -e '{REPO}[openai]'" in result.stderr
    assert "dsh-session[" not in result.stderr

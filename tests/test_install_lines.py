"""Install lines a new user can run: from the checkout, the published form only when labelled."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
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


def _distribution_closure(names: set[str]) -> set[str]:
    """The installed distributions ``names`` bring: each with its requirements, in turn.

    A requirement of an extra, or one not installed here (a marker for another platform), is
    left out: what it would provide is not what a bare install gives.
    """
    seen: set[str] = set()
    todo = [canonical(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            requirements = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
        for requirement in requirements:
            if "extra ==" not in requirement:
                todo.append(canonical(re.split(r"[\s\[<>=!~;(]", requirement, maxsplit=1)[0]))
    return seen


def canonical(name: str) -> str:
    """A distribution name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def test_each_adapter_section_installs_what_its_snippets_import() -> None:
    # fresh-user walk: the LangGraph section said "pip install -e '.[langgraph]'", and its
    # first snippet line, 'from langchain.agents import create_agent', failed: the extra is
    # LangGraph alone
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))[
        "project"]["optional-dependencies"]
    owners = metadata.packages_distributions()
    text = (REPO / "docs" / "adapters.md").read_text(encoding="utf-8")
    checked = 0
    for section in re.split(r"\n## ", text)[1:]:
        install = re.search(r"pip install -e '\.\[([\w-]+)\]'((?: [\w-]+)*)`", section)
        snippets = re.findall(r"```python\n(.*?)```", section, re.S)
        if not snippets:
            continue
        assert install, f"adapters.md section {section.splitlines()[0]!r} has no install line"
        named = {re.split(r"[<>=\[]", r, maxsplit=1)[0] for r in extras[install[1]]}
        named |= set(install[2].split())
        installed = _distribution_closure(named) | {"dsh-session"}
        for snippet in snippets:
            for node in ast.walk(ast.parse(snippet)):
                modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                           [node.module] if isinstance(node, ast.ImportFrom) and node.module
                           else [])
                for module in modules:
                    top = module.split(".")[0]
                    if top in sys.stdlib_module_names or top == "dsh":
                        continue
                    dists = {canonical(d) for d in owners.get(top, [])}
                    assert dists & installed, (
                        f"adapters.md {section.splitlines()[0]!r}: the snippet imports {module}, "
                        f"which {install[0]!r} does not install (it comes from {sorted(dists)})")
                    checked += 1
    assert checked >= 8

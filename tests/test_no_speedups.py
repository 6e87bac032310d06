"""The C accelerator is for speed only: the pure-Python run is real and reaches every package.

``scripts/test`` runs the tests marked ``no_speedups`` a second time with ``DSH_NO_SPEEDUPS=1``
(docs/testing.md#without-the-c-accelerator, docs/architecture.md#the-c-accelerator). These
checks keep that run honest: with the variable set nothing of ``dsh._speedups`` is in use, and
every package and top-level module of ``src/dsh`` has marked tests.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dsh.json as dj

pytestmark = pytest.mark.no_speedups

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "dsh"
ACCELERATED = sorted(name for name in vars(dj) if name.startswith("c_"))
"""The accelerator's functions as ``dsh.json`` hands them out (None when it is off)."""


def test_dsh_no_speedups_turns_every_c_function_off() -> None:
    probe = ("import sys, dsh.json as dj; "
             "print(dj._speedups is None, sys.modules.get('dsh._speedups') is None, "
             f"[n for n in {ACCELERATED!r} if getattr(dj, n) is not None])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, env={**os.environ, "DSH_NO_SPEEDUPS": "1"}).stdout
    assert out.split() == ["True", "True", "[]"]
    assert len(ACCELERATED) >= 10
    if os.environ.get("DSH_NO_SPEEDUPS"):  # this very run is the pure-Python one
        assert dj._speedups is None and all(getattr(dj, n) is None for n in ACCELERATED)


def _marked(path: Path) -> bool:
    return "pytest.mark.no_speedups" in path.read_text(encoding="utf-8")


def _imported_dsh_parts(path: Path) -> set[str]:
    """The first name after ``dsh.`` of every module ``path`` imports (``dsh.session`` etc.)."""
    parts: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        parts.update(name.split(".")[1] for name in names
                     if name.startswith("dsh.") and name.count(".") >= 1)
    return parts


def test_every_package_has_tests_that_run_without_the_accelerator() -> None:
    tests = [path for path in (REPO / "tests").rglob("test_*.py") if _marked(path)]
    covered: set[str] = set()
    for path in tests:
        relative = path.relative_to(REPO / "tests").parts
        if len(relative) > 1:
            covered.add(relative[0])  # tests/<package>/ tests that package
        else:
            covered.add(path.stem.removeprefix("test_"))  # test_<module>.py tests that module
        covered |= {part.lstrip("_") for part in _imported_dsh_parts(path)}
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    modules = {"json", "transcript", "store", "verify"}  # the top-level modules with a front
    missing = sorted((packages | modules) - covered)
    assert missing == [], "mark some quick tests of these no_speedups (docs/testing.md)"

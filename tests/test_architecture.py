"""The layering promises of DESIGN §2: the core does no I/O, and every public name is documented."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import dsh

SRC = Path(__file__).resolve().parents[1] / "src" / "dsh"
IO_MODULES = {"os", "pathlib", "threading", "sqlite3", "socket", "subprocess", "io", "shutil",
              "tempfile", "filelock", "zstandard", "orjson"}


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_session_core_imports_no_io_module() -> None:
    # DESIGN §2: "The core (session/) does no I/O and never sleeps."
    offenders = {
        f"{path.name}: {sorted(_imported_roots(path) & IO_MODULES)}"
        for path in sorted((SRC / "session").glob("*.py"))
        if _imported_roots(path) & IO_MODULES
    }
    assert offenders == set()


def test_every_public_name_has_a_docstring() -> None:
    # STYLE §10: walk dsh.__all__ (and each subpackage's) for docstrings.
    missing = []
    for module_name in ["dsh", "dsh.json", "dsh._errors", "dsh.session", "dsh.persistence",
                        "dsh.compaction", "dsh.interop", "dsh.agent.providers"]:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and not inspect.getdoc(obj):
                missing.append(f"{module_name}.{name}")
    assert missing == []


def test_dsh_errors_all_derive_from_dsh_error() -> None:
    from dsh import _errors as errors
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.DshError), name
    assert dsh.__doc__

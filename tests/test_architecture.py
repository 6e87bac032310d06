"""The layering promises: the core does no I/O, privacy is by name, no two files lean on each other.

Rule: docs/architecture.md#the-dependency-rule. The facts come from the source itself
(tests/architecture.py reads it with ``ast``; ``python -m tests.architecture -v`` lists them).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import dsh
from tests import architecture as arch

SRC = Path(__file__).resolve().parents[1] / "src" / "dsh"
IO_MODULES = {"os", "pathlib", "threading", "sqlite3", "socket", "subprocess", "io", "shutil",
              "tempfile", "filelock", "zstandard", "orjson"}

PUBLIC_MODULES = arch.PUBLIC_MODULES

THIRD_PARTY_PATCHES = {
    "dsh.cli._help": {"_usage_display_name"},  # typer's TyperArgument: names arguments as we do
}
"""Private attributes of other libraries' classes that dsh patches on purpose, with why."""


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_session_core_imports_no_io_module() -> None:
    # The core (session/) does no I/O and never sleeps.
    offenders = {
        f"{path.name}: {sorted(_imported_roots(path) & IO_MODULES)}"
        for path in sorted((SRC / "session").glob("*.py"))
        if _imported_roots(path) & IO_MODULES
    }
    assert offenders == set()


def test_no_module_inside_dsh_imports_the_front_door_package() -> None:
    # `import dsh` loads the front door (the store and, lazily, the agent layer): a module
    # below it that imported it would sit above itself. The applications on top (the CLI and
    # the viewer) may.
    found = sorted({f"{imp.importer}:{imp.line}" for name in arch.modules()
                    if not name.startswith(("dsh.cli", "dsh.view")) and name != "dsh"
                    for imp in arch.imports(name) if imp.module == "dsh" and imp.target == "dsh"})
    assert found == []


def test_dsh_errors_all_derive_from_dsh_error() -> None:
    from dsh import _errors as errors

    classes = [obj for obj in vars(errors).values()
               if inspect.isclass(obj) and issubclass(obj, Exception)
               and obj.__module__ in ("dsh", "dsh._errors")]
    assert len(classes) > 15
    assert all(issubclass(cls, errors.DshError) for cls in classes)
    assert dsh.__doc__


def test_no_import_cycle_between_files() -> None:
    # Two files that import each other (at module level, in a function or under
    # TYPE_CHECKING) are one design unit split in two; each cycle is listed by its files.
    assert arch.cycles() == []


def test_no_private_import_across_packages() -> None:
    # A `_module` (or a `_name` of a package) is reached only from inside its package;
    # others import through the package's __init__.
    assert arch.private_imports() == []


def test_no_probe_of_a_backend() -> None:
    # A backend declares what it offers (its capabilities); nothing asks its class name or
    # probes its attributes (docs/stores.md#capabilities).
    assert arch.backend_probes() == []


def _patched(finding: str) -> bool:
    module, _, rest = finding.partition(":")
    return rest.rsplit(".", 1)[-1] in THIRD_PARTY_PATCHES.get(module, set())


def test_no_private_attribute_reach_across_modules() -> None:
    # The owning class offers a method or property instead; only the third-party patches
    # above reach into another library's class.
    found = arch.private_attribute_accesses()
    assert [f for f in found if not _patched(f)] == []
    assert {f.partition(":")[0] for f in found if _patched(f)} <= set(THIRD_PARTY_PATCHES)

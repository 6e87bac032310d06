"""The public surface is pinned: what each public module exports is in tests/public_api.txt.

A change to a public module's exports (a new name, a removed one) fails here until the snapshot
is updated on purpose: ``DSH_UPDATE_PUBLIC_API=1 pytest tests/test_public_api.py`` rewrites it,
and the diff is reviewed with the change. Rule: docs/architecture.md#public-modules.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import inspect
import os
import subprocess
import sys
import types
from itertools import pairwise
from pathlib import Path

import pytest

import dsh
from tests.architecture import PUBLIC_MODULES

SNAPSHOT = Path(__file__).with_name("public_api.txt")


def exported(module_name: str) -> list[str]:
    """The names a public module exports: its ``__all__``, else its public non-module names."""
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items()
                 if not n.startswith("_") and not isinstance(v, types.ModuleType)
                 and n != "annotations"]
    return sorted(names)


def surface() -> str:
    """The snapshot text: one ``[module]`` section per public module, one name a line."""
    lines: list[str] = []
    for module_name in PUBLIC_MODULES:
        lines.append(f"[{module_name}]")
        lines.extend(exported(module_name))
        lines.append("")
    return "\n".join(lines)


def test_the_public_surface_matches_the_snapshot() -> None:
    # A fresh interpreter: what a user's `import` sees, whatever other tests in this process
    # imported, patched or loaded lazily before this one.
    now = subprocess.run([sys.executable, "-c",
                          "from tests.test_public_api import surface; print(surface(), end='')"],
                         cwd=SNAPSHOT.parents[1], capture_output=True, text=True,
                         check=True).stdout
    if os.environ.get("DSH_UPDATE_PUBLIC_API") == "1":
        SNAPSHOT.write_text(now, encoding="utf-8")
    pinned = SNAPSHOT.read_text(encoding="utf-8")
    diff = "\n".join(difflib.unified_diff(pinned.splitlines(), now.splitlines(),
                                          "tests/public_api.txt", "the code", lineterm=""))
    assert now == pinned, ("the public surface changed; if on purpose, run "
                           "DSH_UPDATE_PUBLIC_API=1 pytest tests/test_public_api.py and commit "
                           f"the snapshot with the change:\n{diff}")


def test_every_public_name_and_public_member_has_a_docstring() -> None:
    missing, undocumented = [], []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in exported(module_name):
            if not hasattr(module, name):
                missing.append(f"{module_name}.{name}")
                continue
            obj = getattr(module, name)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and not inspect.getdoc(obj):
                undocumented.append(f"{module_name}.{name}")
            if inspect.isclass(obj):
                undocumented.extend(f"{module_name}.{name}.{attr}"
                                    for attr, value in vars(obj).items()
                                    if not attr.startswith("_") and _undocumented(value))
    assert missing == [] and undocumented == []


def test_each_attribute_docstring_follows_its_own_assignment() -> None:
    """No string statement follows another: the second is a docstring whose name lost it.

    (Before: ef2cedc put ``_HELD_RESUME_ITEMS`` and its docstring between
    ``dsh.adapters.openai_agents.FORMAT`` and FORMAT's, which documentation tools then showed
    under no name.)
    """
    strays = []
    for path in sorted((Path(__file__).parents[1] / "src").rglob("*.py")):
        bodies = [ast.parse(path.read_text(encoding="utf-8")).body]
        while bodies:
            body = bodies.pop()
            bodies.extend(node.body for node in body if isinstance(node, ast.ClassDef))
            strays.extend(f"{path.name}:{node.lineno}" for before, node in pairwise(body)
                          if _is_string(before) and _is_string(node))
    assert strays == []


def _is_string(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
        and isinstance(node.value.value, str)


def _undocumented(value: object) -> bool:
    if isinstance(value, property):
        return not (value.fget and value.fget.__doc__)
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    return inspect.isfunction(value) and not value.__doc__


def test_dir_of_dsh_lists_only_the_public_api() -> None:
    assert dir(dsh) == sorted([*dsh.__all__, "__version__"])
    assert "persistence" not in dir(dsh) and "session" not in dir(dsh)
    assert "open" in dir(dsh) and "Store" in dir(dsh) and "SessionStore" not in dir(dsh)


def test_public_classes_print_as_dsh_names() -> None:
    # Errors and the main classes print as dsh.X in tracebacks.
    assert repr(dsh.Store) == "<class 'dsh.Store'>"
    assert dsh.SessionBusyError.__module__ == dsh.Session.__module__ == "dsh"


def _public_callables() -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = []
    for name in dsh.__all__:
        obj = getattr(dsh, name)
        if inspect.isclass(obj):
            found.append((name, obj))
            found.extend((f"{name}.{attr}", value) for attr, value in vars(obj).items()
                         if callable(value) and (not attr.startswith("_") or attr == "__init__"))
        elif callable(obj):
            found.append((name, obj))
    return found


def test_help_shows_no_private_parameters() -> None:
    private = []
    for name, obj in _public_callables():
        try:
            signature = inspect.signature(obj)  # type: ignore[arg-type]
        except (TypeError, ValueError):  # builtins without a signature
            continue
        private.extend(f"{name}({p})" for p in signature.parameters if p.startswith("_"))
    assert len(_public_callables()) > 60
    assert private == []


def test_help_of_a_submodule_class_works_in_a_fresh_interpreter() -> None:
    # `help(dsh.persistence._facade.Persistence)` right after `import dsh`, with no import
    # of the submodule first: the attribute must resolve (it raised AttributeError before).
    script = ("import dsh, pydoc\n"
              "print(pydoc.render_doc(dsh.persistence._facade.Persistence, renderer="
              "pydoc.plaintext).splitlines()[2])\n"
              "print(dsh.persistence.jsonl._backend.__name__)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60).stdout.splitlines()
    assert out == ["class Persistence(builtins.object)", "dsh.persistence.jsonl._backend"]


def _fresh_modules(script: str) -> list[str]:
    """The ``dsh`` modules loaded after ``script`` runs in a fresh interpreter, sorted."""
    out = subprocess.run([sys.executable, "-c", script + "\nimport sys\n"
                          "print(*sorted(m for m in sys.modules if m.split('.')[0] == 'dsh'))"],
                         cwd=SNAPSHOT.parents[1], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    return out.split()


def test_import_dsh_loads_only_the_errors_and_every_public_name_resolves() -> None:
    # PEP 562: `import dsh` loads the errors and the version; each other public name loads its
    # module on first use (docs/architecture.md#public-modules), and then prints as dsh.X.
    assert _fresh_modules("import dsh") == ["dsh", "dsh._errors", "dsh._version"]
    script = ("import dsh\n"
              "missing = [n for n in dsh.__all__ if getattr(dsh, n, None) is None]\n"
              "assert missing == [], missing\n"
              "assert dsh.Session.__module__ == dsh.Store.__module__ == 'dsh'\n"
              "assert dsh.persistence.sqlite.__name__ == 'dsh.persistence.sqlite'\n"
              "assert dir(dsh) == sorted([*dsh.__all__, '__version__'])\n")
    loaded = _fresh_modules(script)
    assert {"dsh.session", "dsh._store", "dsh.compaction"} <= set(loaded)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        dsh.no_such_name  # noqa: B018


def test_a_name_that_is_no_identifier_is_no_attribute_of_dsh() -> None:
    # the submodule fallback of dsh.__getattr__ asks only for identifiers: hasattr answers
    # False (find_spec("dsh.x.y") raised ModuleNotFoundError through hasattr)
    for name in ("x.y", ".", "..session", "session.x"):
        assert not hasattr(dsh, name)
        with pytest.raises(AttributeError, match="no attribute"):
            getattr(dsh, name)


def test_an_adapter_import_loads_no_agent_loop_compaction_or_front_door() -> None:
    pytest.importorskip("agents")
    loaded = set(_fresh_modules("import dsh.adapters.openai_agents"))
    assert "dsh.adapters.openai_agents" in loaded and "dsh.session" in loaded
    assert loaded.isdisjoint({"dsh.agent._loop", "dsh._store", "dsh.compaction"})

"""Static facts about src/dsh read from the source with ``ast``: imports, privacy, cycles.

Used by tests/test_architecture.py; ``python -m tests.architecture`` prints the counts.

Terms:

* a module's *package* is the package that contains it (``dsh.session._store`` → ``dsh.session``;
  a package's ``__init__`` belongs to the package itself, ``dsh.session``);
* a *private* module path is one with a ``_``-prefixed component (dunders aside); it may be
  imported only by modules inside the package that contains that component;
* an import edge goes from a file to the file of the module it names (``from pkg import name``
  names ``pkg.name`` when that is a module, else ``pkg``); function-level imports count, and so
  do imports under ``if TYPE_CHECKING:`` (two files that name each other are one design unit
  even when one side only annotates with the other).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = SRC / "dsh"

PUBLIC_MODULES = ("dsh", "dsh.agent", "dsh.agent.providers", "dsh.adapters",
                  "dsh.adapters.langchain", "dsh.adapters.langgraph",
                  "dsh.adapters.openai_agents", "dsh.adapters.pydantic_ai",
                  "dsh.adapters.pydantic_ai_store", "dsh.interop", "dsh.json",
                  "dsh.persistence", "dsh.rights", "dsh.testing", "dsh.transcript")
"""Every module a user imports (docs/architecture.md#public-modules); everything else is a
private module (``_name``) or a package interface for dsh's own packages."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of src/dsh by dotted name (packages by their ``__init__.py``)."""
    return {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))
            if "examples" not in path.relative_to(ROOT).parts}


@cache
def tree(name: str) -> ast.Module:
    """The parsed source of module ``name``."""
    return ast.parse(modules()[name].read_text(encoding="utf-8"))


def is_package(name: str) -> bool:
    """Whether ``name`` is a package (an ``__init__.py``)."""
    return modules()[name].name == "__init__.py"


def package_of(name: str) -> str:
    """The package a module belongs to (a package belongs to itself)."""
    return name if is_package(name) else name.rpartition(".")[0]


def _is_private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def private_owner(target: str) -> str | None:
    """The package that owns the first private component of ``target``, or None if public."""
    parts = target.split(".")
    for index, part in enumerate(parts):
        if _is_private(part):
            return ".".join(parts[:index])
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


@dataclass(frozen=True)
class Import:
    """One imported name: ``module`` as written (absolute), and ``name`` for ``from`` imports."""

    importer: str
    module: str
    name: str | None
    line: int

    @property
    def target(self) -> str:
        """The module this import loads: ``module.name`` when that is a module, else ``module``."""
        if self.name is not None and f"{self.module}.{self.name}" in modules():
            return f"{self.module}.{self.name}"
        return self.module


def _runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under ``node`` except the bodies of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield other
                yield from _runtime_nodes(other)
            continue
        yield child
        yield from _runtime_nodes(child)


def _absolute(importer: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = package_of(importer).split(".")
    base = base[:len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


@cache
def imports(name: str, *, runtime_only: bool = False) -> tuple[Import, ...]:
    """The dsh imports of module ``name`` (function-level ones included; ``runtime_only``
    leaves out those under ``if TYPE_CHECKING:``)."""
    nodes = _runtime_nodes(tree(name)) if runtime_only else ast.walk(tree(name))
    found: list[Import] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found.extend(Import(name, alias.name, None, node.lineno) for alias in node.names
                         if alias.name.split(".")[0] == "dsh")
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(name, node)
            if module.split(".")[0] == "dsh":
                found.extend(Import(name, module, alias.name, node.lineno)
                             for alias in node.names)
    return tuple(found)


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def private_imports() -> list[str]:
    """Imports of a private module or name from outside the package that owns it.

    Type-checking imports count too: the rule is about where a name is reached from.
    """
    found = []
    for name in modules():
        for imp in imports(name, runtime_only=False):
            owner = private_owner(imp.target)
            if owner is not None and not _inside(name, owner):
                found.append(f"{name}:{imp.line}: {imp.target}"
                             + (f" ({imp.name})" if imp.name else ""))
            elif (imp.name is not None and _is_private(imp.name)
                  and imp.target == imp.module and not _inside(name, package_of(imp.module))):
                found.append(f"{name}:{imp.line}: {imp.module}.{imp.name}")
    return found


def import_graph() -> dict[str, set[str]]:
    """Module → the dsh modules it imports at run time (edges to known files only)."""
    graph: dict[str, set[str]] = {name: set() for name in modules()}
    for name in modules():
        for imp in imports(name):
            if imp.target in modules() and imp.target != name:
                graph[name].add(imp.target)
    return graph


def cycles() -> list[list[str]]:
    """The strongly connected components of the import graph with more than one module."""
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _own_private_attributes(name: str) -> set[str]:
    """Private names a module defines: ``self._x =``, ``def _x``, class-level ``_x``, slots."""
    own: set[str] = set()
    for node in ast.walk(tree(name)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            own.add(node.attr)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    own.add(target.id)
                    if target.id == "__slots__" and node.value is not None:
                        own.update(elt.value for elt in ast.walk(node.value)
                                   if isinstance(elt, ast.Constant)
                                   and isinstance(elt.value, str))
    return {attr for attr in own if _is_private(attr)}


def private_attribute_accesses() -> list[str]:
    """Reads or writes of ``x._name`` where the module does not define ``_name`` itself.

    ``self._name`` and ``cls._name`` are the object's own; a private attribute the same module
    defines (another instance of its own class) is the module's business. What is left reaches
    into an object (or module) defined elsewhere.
    """
    found = []
    for name in modules():
        own = _own_private_attributes(name)
        for node in ast.walk(tree(name)):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr in own:
                continue
            found.append(f"{name}:{node.lineno}: .{node.attr}")
    return found


def backend_probes() -> list[str]:
    """Places that probe a backend instead of asking its declared capabilities.

    A probe is ``hasattr(b, ...)`` or ``getattr(b, ..., default)`` on an expression that names
    a backend, or ``type(b).__name__`` of one (docs/stores.md#capabilities: the caller asks the
    ``capabilities`` flags, never the class or its attributes).
    """
    found = []
    for name in modules():
        for node in ast.walk(tree(name)):
            subject: ast.expr | None = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
                if node.func.id == "hasattr" or (node.func.id == "getattr" and len(node.args) == 3):
                    subject = node.args[0]
            elif (isinstance(node, ast.Attribute) and node.attr == "__name__"
                  and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                  and node.value.func.id == "type" and node.value.args):
                subject = node.value.args[0]
            if subject is not None and "backend" in ast.unparse(subject).lower():
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return found


def exported_names() -> dict[str, list[str]]:
    """Module → its ``__all__`` (modules that have one)."""
    out: dict[str, list[str]] = {}
    for name in modules():
        for node in tree(name).body:
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                value = node.value
                if isinstance(value, (ast.List, ast.Tuple)):
                    out[name] = [e.value for e in value.elts
                                 if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return out


def main() -> None:
    """Print the counts (and, with ``-v``, every finding)."""
    verbose = "-v" in sys.argv
    exported = exported_names()
    sections = {
        "private imports across packages": private_imports(),
        "private attribute accesses across modules": private_attribute_accesses(),
        "import cycles": [" <-> ".join(c) for c in cycles()],
        "backend probes": backend_probes(),
    }
    print(f"exported names: {sum(map(len, exported.values()))} in {len(exported)} modules "
          f"({sum(1 for m in exported if not is_package(m))} of them not a package __init__)")
    for title, items in sections.items():
        print(f"{title}: {len(items)}")
        if verbose:
            for item in items:
                print(f"    {item}")


if __name__ == "__main__":
    main()

"""What a library user sees at the prompt: ``dir(dsh)``, ``help()`` (issue 9 item 18)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import dsh


def test_dir_of_dsh_lists_only_the_public_api() -> None:
    assert dir(dsh) == sorted([*dsh.__all__, "__version__"])
    assert "persistence" not in dir(dsh) and "session" not in dir(dsh)
    assert "open" in dir(dsh) and "Store" in dir(dsh) and "SessionStore" not in dir(dsh)


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

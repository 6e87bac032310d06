"""Lazy package exports (PEP 562): a package's names load their modules on first use.

A package whose public names would import heavy modules (the agent loop, provider SDK glue)
lists them here instead, so importing one light submodule of it stays light.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(package: str, namespace: dict[str, Any], names: Mapping[str, str],
                 public: Iterable[str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """Return the ``(__getattr__, __dir__)`` pair of a package with lazily loaded names.

    Args:
        package: The package's ``__name__`` (named in the ``AttributeError``).
        namespace: Its ``globals()``: a loaded name is stored there, so later lookups are
            plain attribute reads.
        names: Public name → the module that defines it.
        public: The package's ``__all__`` (listed by ``dir()`` before anything loads).

    Returns:
        The two module-level functions PEP 562 looks up; ``__getattr__`` raises
        ``AttributeError`` for a name that is neither loaded nor listed.
    """
    listed = frozenset(public)

    def __getattr__(name: str) -> object:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | listed)

    return __getattr__, __dir__

"""The ``dsh`` console script's module: outside the ``dsh`` package, so Ctrl-C is ours at once.

The console script imports this module first. Were it a module of ``dsh``, Python would run
``dsh/__init__.py`` (a third of a second on a busy machine) before any handler of ours could
catch a Ctrl-C, and print a ``KeyboardInterrupt`` traceback. Here nothing of ``dsh`` is loaded
until inside :func:`main`'s ``try``. Rule: docs/cli.md#exit-status-and-errors.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: run ``dsh`` (``dsh.cli.main``) with ``argv``.

    A Ctrl-C while ``dsh`` itself loads ends with exit 130 and one ``error[INTERRUPTED]`` line,
    as ``dsh.cli.main`` ends one while the command's modules load or once it runs.

    Raises:
        SystemExit: always, with the exit status (0/1/2/130).
    """
    try:
        from dsh.cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("error[INTERRUPTED]: interrupted\n")
        raise SystemExit(130) from None
    run(argv)

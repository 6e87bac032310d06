"""``dsh.cli.main``, light enough that a Ctrl-C while the command loads is ours.

The console script enters through ``_dsh_cli`` (outside the package, for a Ctrl-C while the
``dsh`` package itself loads), which calls this.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    """Run the ``dsh`` command with ``argv`` and exit with its status (``python -m dsh.cli``).

    The command's modules load here, not when ``dsh.cli`` is imported: loading takes about a
    second on a busy machine, and a Ctrl-C meanwhile ends with exit 130 and one
    ``error[INTERRUPTED]`` line, as it does once a command runs, never a traceback.

    Raises:
        SystemExit: always, with the exit status (0/1/2/130).

    Rule: docs/cli.md#exit-status-and-errors.
    """
    try:
        from dsh.cli._app import main as run

        run(argv)
    except KeyboardInterrupt:
        sys.stderr.write("error[INTERRUPTED]: interrupted\n")
        raise SystemExit(130) from None

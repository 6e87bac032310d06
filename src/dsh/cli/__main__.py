"""``python -m dsh.cli``: the same as the ``dsh`` console script."""

from __future__ import annotations

from dsh.cli import main

if __name__ == "__main__":
    main()

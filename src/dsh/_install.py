"""How to install an optional extra, said in a form that works where dsh was installed from.

dsh is installed from a checkout (``pip install -e .``) until it is published, so the
``MISSING_EXTRA`` hints name the command that works for this install: for an editable or a
local-folder install, ``pip install -e '<checkout>[extra]'`` run by this interpreter; else the
published name ``dsh-session[extra]`` (docs/errors.md#configerror).
"""

from __future__ import annotations

import json
import shlex
import sys
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlparse

DISTRIBUTION = "dsh-session"
"""The distribution name in pyproject.toml."""


@cache
def _source_dir() -> Path | None:
    """The folder dsh was installed from (PEP 610 ``direct_url.json``), when it is local."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        text = distribution(DISTRIBUTION).read_text("direct_url.json")
    except PackageNotFoundError:
        return None
    if not text:
        return None
    try:
        url = str(json.loads(text).get("url") or "")
    except (ValueError, AttributeError):
        return None
    parsed = urlparse(url)
    if parsed.scheme != "file":
        return None
    folder = Path(unquote(parsed.path))
    return folder if (folder / "pyproject.toml").is_file() else None


def install_hint(extra: str) -> str:
    """The shell command that installs ``extra`` into the running interpreter's environment.

    Returns ``<python> -m pip install -e '<checkout>[extra]'`` when dsh was installed from a
    local checkout, else ``pip install 'dsh-session[extra]'`` (the published form).
    """
    folder = _source_dir()
    if folder is None:
        return f"pip install '{DISTRIBUTION}[{extra}]'"
    return (f"{shlex.quote(sys.executable)} -m pip install -e "
            f"{shlex.quote(f'{folder}[{extra}]')}")

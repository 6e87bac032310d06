"""``dsh export`` in the standard formats: otel, atif, inspect, claude-code, codex.

Each writes the whole history of a session (docs/standards.md); ``--install`` places a
claude-code or codex file where that agent lists its sessions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from dsh import ConfigError
from dsh.cli._common import stderr_console


def _json_bytes(value: Any, *, lines: bool = False) -> bytes:
    if lines:
        text = "".join(json.dumps(v, ensure_ascii=False) + "\n" for v in value)
    else:
        text = json.dumps(value, ensure_ascii=False, indent=2) + "\n"
    return text.encode("utf-8", errors="backslashreplace")


def render(log: Any, fmt: str, *, content: bool = False) -> tuple[bytes, Path | None]:
    """The bytes of ``log`` in ``fmt`` and the path ``--install`` would write them to.

    Raises:
        ConfigError: an unknown format.
    """
    from dsh import interop

    if fmt == "atif":
        return _json_bytes(interop.to_atif(log)), None
    if fmt == "inspect":
        return _json_bytes(interop.to_inspect_log(log)), None
    if fmt == "otel":
        return _json_bytes(interop.to_otlp_json(log, capture_content=content)), None
    raise ConfigError(f"unknown export format {fmt!r}")


def write_standard(log: Any, fmt: str, output: Path | None, *, install: bool,
                   content: bool = False) -> None:
    """Write ``log`` in ``fmt`` to ``output``, stdout, or (``install``) the agent's folder.

    Raises:
        ConfigError: ``--install`` with a format that has no install place, with ``-o``, or a
            file that cannot be written (naming it).
    """
    data, place = render(log, fmt, content=content)
    if install:
        if place is None:
            raise ConfigError(f"--install is for --format claude-code or codex, not {fmt}")
        if output is not None:
            raise ConfigError("--install chooses the file itself; leave out -o")
        output = place
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create {output.parent}: {exc.strerror or exc}",
                              path=str(output.parent)) from exc
    write_output(data, output)


def write_output(data: bytes, output: Path | None) -> None:
    """Write ``data`` to ``output`` (saying so on stderr), or to stdout when it is None.

    Raises:
        ConfigError: the file cannot be written (naming it).
    """
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    try:
        output.write_bytes(data)
    except OSError as exc:
        raise ConfigError(f"cannot write the export to {output}: {exc.strerror or exc}",
                          path=str(output)) from exc
    stderr_console().print(f"wrote {len(data)} bytes to {output}", markup=False)

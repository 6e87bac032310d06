"""``dsh export`` in the standard formats: otel, atif, inspect, claude-code, codex.

Each writes the whole history of a session (docs/standards.md); ``--install`` places a
claude-code or codex file where that agent lists its sessions.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from dsh import ConfigError
from dsh.cli._common import stderr_console
from dsh.cli._render import escape_json_controls, json_text


def _json_bytes(value: Any, *, lines: bool = False) -> bytes:
    """``value`` as UTF-8 JSON text (``lines``: each item on a line of its own).

    DEL, C1 controls and bidi overrides are ``\\uXXXX`` escapes: the same values, and session
    text printed to a terminal drives none of it (docs/cli.md#output).
    """
    if lines:
        text = "".join(json_text(v, indent=None) + "\n" for v in value)
    else:
        text = json_text(value, indent=2) + "\n"
    return escape_json_controls(text.encode("utf-8", errors="backslashreplace"))


def render(log: Any, fmt: str, output: Path | None, *, install: bool,
           content: bool = False) -> dict[Path | None, bytes]:
    """The files ``log`` becomes in ``fmt``: path (None: stdout) → bytes.

    ``install`` (claude-code, codex) names the file where that agent lists its sessions; a
    claude-code file written to a path gets its subagent files beside it.

    Raises:
        ConfigError: an unknown format; ``--install`` with another format or with ``-o``.
    """
    from dsh import interop

    if install and fmt not in ("claude-code", "codex"):
        raise ConfigError(f"--install is for --format claude-code or codex, not {fmt}")
    if install and output is not None:
        raise ConfigError("--install chooses the file itself; leave out -o")
    cwd = str(log.header.get("cwd") or Path.cwd())
    if fmt == "claude-code":
        main = interop.claude_code_install_path(log, Path.home(), cwd=cwd) if install \
            else output
        if main is None:
            return {None: _json_bytes(interop.to_claude_code(log, cwd=cwd), lines=True)}
        return {path: _json_bytes(lines, lines=True) for path, lines in
                interop.claude_code_files(log, main, cwd=cwd).items()}
    if fmt == "codex":
        path = interop.codex_install_path(log, Path.home()) if install else output
        return {path: _json_bytes(interop.to_codex(log, cwd=cwd), lines=True)}
    if fmt == "atif":
        doc = interop.to_atif(log)
    elif fmt == "inspect":
        doc = interop.to_inspect_log(log)
    elif fmt == "otel":
        doc = interop.to_otlp_json(log, capture_content=content)
    else:
        raise ConfigError(f"unknown export format {fmt!r}")
    return {output: _json_bytes(doc)}


def write_standard(log: Any, fmt: str, output: Path | None, *, install: bool,
                   content: bool = False) -> None:
    """Write ``log`` in ``fmt`` to ``output``, stdout, or (``install``) the agent's folder.

    Raises:
        ConfigError: see :func:`render`; a folder or file that cannot be written (naming it).
    """
    for path, data in render(log, fmt, output, install=install, content=content).items():
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"cannot create {path.parent}: {exc.strerror or exc}",
                                  path=str(path.parent)) from exc
        write_output(data, path)


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

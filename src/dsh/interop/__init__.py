"""Transcript interop: import other agents' transcripts as dsh logs, export the model view.

Public entry points (what the CLI calls):

* :func:`detect_format` — format name of a file (``claude-code``, ``codex``, ``openai-chat``,
  ``anthropic``, ``openhands``, ``openhands-resolver``, ``gemini-cli``, ``swe-agent``,
  ``mini-swe-agent``, ``dsh``).
* :func:`import_file` — ``path, format="auto" -> list[ImportedSession]`` (a session's
  subagents are in its ``children``); :meth:`ImportedSession.to_session` seeds a Session.
* :func:`stream_file` — the same sessions as :class:`StreamedSession` objects whose events
  come in batches as the file is read (``dsh import`` writes them so, in bounded memory).
* :func:`to_openai`, :func:`to_anthropic` — derived messages to provider requests
  (``target_model=`` leaves out reasoning of other models: :func:`without_foreign_reasoning`).
* :func:`validate_conversation` — problems of a provider conversation (empty when valid).

Every importer is a pure mapping from one file to events (docs/interop.md#mapping-rules); bad input
raises :class:`dsh._errors.ImportFormatError` with ``path``, ``line`` and ``format``.

The public names are ``__all__``; a name imported here as ``name as name`` and left out of it
(``plan_reimport``, ``anthropic_usage``, ...) is for dsh's own packages, not public API.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from dsh._errors import ImportFormatError

# For dsh's own packages (the CLI's re-import, the providers' usage mapping), not public API.
from dsh.interop._anthropic import anthropic_usage as anthropic_usage
from dsh.interop._anthropic import import_anthropic
from dsh.interop._atif import ATIF_VERSION, import_atif, to_atif, validate_atif
from dsh.interop._claude_code import import_claude_code, stream_claude_code
from dsh.interop._codex import import_codex, stream_codex
from dsh.interop._common import (
    ImportBatch,
    ImportedSession,
    StreamedSession,
    collect,
    mapping_errors,
    torn_tails,
)
from dsh.interop._detect import FORMATS, detect_format
from dsh.interop._dsh_log import import_dsh_log
from dsh.interop._dsh_log_stream import stream_dsh_log
from dsh.interop._export import (
    to_anthropic,
    to_openai,
    validate_conversation,
    without_foreign_reasoning,
)
from dsh.interop._gemini_cli import import_gemini_cli
from dsh.interop._handoff import (
    claude_code_files,
    claude_code_install_path,
    claude_project_slug,
    codex_install_path,
    handoff_session_id,
    to_claude_code,
    to_codex,
)
from dsh.interop._history import LogLike, SessionLog
from dsh.interop._inspect import to_inspect_log
from dsh.interop._openai_chat import import_openai_chat
from dsh.interop._openhands import import_openhands
from dsh.interop._openhands_resolver import import_openhands_resolver
from dsh.interop._otel import SpanMapper, SpanRecord, span_records, to_otlp_json
from dsh.interop._reimport import ReimportPlan as ReimportPlan
from dsh.interop._reimport import plan_reimport as plan_reimport
from dsh.interop._reimport import superseding as superseding
from dsh.interop._swe_agent import import_mini_swe_agent, import_swe_agent

__all__ = [
    "ATIF_VERSION",
    "FORMATS",
    "IMPORTERS",
    "STREAMING_FORMATS",
    "ImportBatch",
    "ImportedSession",
    "LogLike",
    "SessionLog",
    "SpanMapper",
    "SpanRecord",
    "StreamedSession",
    "claude_code_files",
    "claude_code_install_path",
    "claude_project_slug",
    "collect",
    "codex_install_path",
    "detect_format",
    "handoff_session_id",
    "import_file",
    "span_records",
    "stream_file",
    "to_anthropic",
    "to_atif",
    "to_claude_code",
    "to_codex",
    "to_inspect_log",
    "to_openai",
    "to_otlp_json",
    "validate_atif",
    "validate_conversation",
    "without_foreign_reasoning",
]

IMPORTERS: Final[dict[str, Callable[[Path], list[ImportedSession]]]] = {
    "claude-code": import_claude_code,
    "codex": import_codex,
    "openai-chat": import_openai_chat,
    "anthropic": import_anthropic,
    "openhands": import_openhands,
    "openhands-resolver": import_openhands_resolver,
    "gemini-cli": import_gemini_cli,
    "swe-agent": import_swe_agent,
    "mini-swe-agent": import_mini_swe_agent,
    "dsh": import_dsh_log,
    "atif": import_atif,
}
"""Format name -> importer ``(path) -> list[ImportedSession]``."""


_STREAMERS: Final[dict[str, Callable[[Path], Iterator[StreamedSession]]]] = {
    "claude-code": stream_claude_code,
    "codex": stream_codex,
    "dsh": stream_dsh_log,
}

STREAMING_FORMATS: Final = frozenset(_STREAMERS)
"""Formats :func:`stream_file` reads line by line in bounded memory; the others are read whole
and handed out as one batch per session (docs/interop.md#streaming-imports)."""


def _unknown(path: Path, format: str) -> ImportFormatError:
    return ImportFormatError(
        f"unknown transcript format {format!r}; expected auto or one of "
        f"{', '.join(FORMATS)}", path=str(path), format=format)


def stream_file(path: str | Path, format: str = "auto") -> Iterator[StreamedSession]:
    """Import one transcript file as a stream: session by session, events batch by batch.

    The sessions and events are those of :func:`import_file` (parents before their children,
    :attr:`StreamedSession.parent` naming the parent). For :data:`STREAMING_FORMATS` the file
    is read as the batches are asked for, so memory stays bounded whatever its size
    (docs/interop.md#streaming-imports); other formats are read whole first. Consume one
    session's batches before asking for the next session.

    Args:
        path: The file.
        format: A name from :data:`FORMATS`, or ``"auto"``.

    Yields:
        The sessions; their :attr:`StreamedSession.batches` raise as below when iterated.

    Raises:
        ImportFormatError: as :func:`import_file`, when the next session or batch is asked for;
            a batch may fail after earlier batches were handed out (a record the importer
            cannot map, found only where it is read).
    """
    p = Path(path)
    if format == "auto":
        format = detect_format(p)
    streamer = _STREAMERS.get(format)
    if streamer is None:
        if format not in IMPORTERS:
            raise _unknown(p, format)
        stack: list[tuple[ImportedSession, str | None]] = [
            (top, None) for top in reversed(import_file(p, format))]
        while stack:
            session, parent = stack.pop()
            yield StreamedSession.of(session, parent)
            stack.extend((child, session.session_id) for child in reversed(session.children))
        return
    with mapping_errors(p, format), torn_tails():
        for stream in streamer(p):
            stream.batches = _guarded(stream.batches, p, format)
            yield stream


def _guarded(batches: Iterator[ImportBatch], path: Path, fmt: str) -> Iterator[ImportBatch]:
    """``batches`` with an unexpected failure of the mapping turned into ImportFormatError."""
    while True:
        with mapping_errors(path, fmt):
            batch = next(batches, None)
        if batch is None:
            return
        yield batch


def import_file(path: str | Path, format: str = "auto") -> list[ImportedSession]:
    """Import one transcript file.

    Args:
        path: The file (Claude Code subagent files next to it are picked up as children).
        format: A name from :data:`FORMATS`, or ``"auto"`` to use :func:`detect_format`.

    Returns:
        The imported sessions (one for most formats; one per cassette / output line for
        multi-conversation files); each has ``children`` for subagents.

    Raises:
        ImportFormatError: unknown ``format``; unreadable, empty, binary or truncated file (a
            Claude Code or Codex log whose last line is still being written imports the lines
            before it, and each session it feeds has ``torn_line`` set);
            content that is not the given format; a record of a shape the importer does not
            map (code ``IMPORT_UNMAPPED``, naming the line). Nothing else, for any bytes.
    """
    p = Path(path)
    if format == "auto":
        format = detect_format(p)
    importer = IMPORTERS.get(format)
    if importer is None:
        raise _unknown(p, format)
    with mapping_errors(p, format), torn_tails() as torn:
        imported = importer(p)
    if torn:  # a live log's last line was being written: say which sessions lack it
        cut = dict(torn)
        for top in imported:
            for session in top.walk():
                line = cut.get(str(Path(session.source_path).resolve())) if (
                    session.source_path) else None
                if line is not None:
                    session.torn_line = line
    return imported

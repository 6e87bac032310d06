"""``dsh export`` (one session for a provider, or as dsh JSONL) and ``dsh convert``."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, cast

import typer

from dsh import (
    ConfigError,
    EventRejectedError,
    LogCorruptError,
    PersistenceError,
)
from dsh.cli import _render as render
from dsh.cli._common import (
    JsonOption,
    SessionArg,
    StoreOption,
    TargetModelOption,
    cli_store,
    json_mode,
    model_view,
    read_session,
    stdout_console,
)
from dsh.cli._progress import progress
from dsh.cli._standards import write_output, write_standard
from dsh.json import dumps, json_equal
from dsh.persistence import STORE_LOG_ID

if TYPE_CHECKING:
    from dsh.json import FrozenDict
    from dsh.persistence import ChecksStorable, Inspection, Persistence
    from dsh.session import Event

class ExportFormat(enum.StrEnum):
    """``--format`` of ``dsh export``."""

    openai = "openai"
    anthropic = "anthropic"
    dsh_jsonl = "dsh-jsonl"
    otel = "otel"
    atif = "atif"
    inspect = "inspect"
    claude_code = "claude-code"
    codex = "codex"
    markdown = "markdown"
    html = "html"


_STANDARD: Final = frozenset({ExportFormat.otel, ExportFormat.atif, ExportFormat.inspect,
                              ExportFormat.claude_code, ExportFormat.codex})
"""Formats written from the whole history (docs/standards.md), not from the model view."""


_JSONL_HEADER_KEYS: Final = ("version", "id", "createdAt", "cwd", "parentSession", "seedLength",
                             "origin", "delegationDepth", "agentPreset")


def _dsh_jsonl(read: Inspection) -> bytes:
    """The stored log as one raw dsh JSONL file: header line, then one event per line.

    Header key order and the always-present ``delegationDepth`` follow docs/formats.md#header-line.
    """
    header: dict[str, Any] = {"type": "session"}
    for key in _JSONL_HEADER_KEYS:
        if key == "delegationDepth":
            header[key] = read.header.get(key) or 0
        elif read.header.get(key) is not None:
            header[key] = read.header[key]
    return b"".join([dumps(header) + b"\n",
                     *(dumps(e) + b"\n" for e in read.stored_events)])


def export(
    session_id: SessionArg,
    format: Annotated[ExportFormat, typer.Option("--format", help="Output format.",
                                                 show_default=False)],
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", metavar="FILE", show_default=False,
        help="Write to FILE instead of stdout.")] = None,
    target_model: TargetModelOption = None,
    content: Annotated[bool, typer.Option(
        "--content", help="otel: record message content on the spans (prompts, answers, tool "
                          "arguments and results); left out by default.")] = False,
    install: Annotated[bool, typer.Option(
        "--install", help="claude-code, codex: write the file where that agent lists its "
                          "sessions (~/.claude/projects/<slug>/, ~/.codex/sessions/Y/M/D/).")
                       ] = False,
    store: StoreOption = None,
) -> None:
    """Export a session: a provider request, the dsh JSONL log, or a standard format.

    openai, anthropic: the request body of the model view; dsh-jsonl: the log itself; otel:
    its OpenTelemetry GenAI spans as OTLP/JSON; atif, inspect: an ATIF trajectory or an Inspect
    AI eval log of the whole history; claude-code, codex: a session file that agent resumes
    (--install puts it where the agent lists its sessions) (docs/standards.md); markdown,
    html: the transcript dsh show prints, as a document.
    """
    with progress("exporting") as bar:
        bar.describe("reading the log")
        with cli_store(store, create=False) as sessions:
            read = read_session(sessions, session_id)
            log = stored_log(sessions.persistence, read) if format in _STANDARD else None
        bar.describe(f"writing {format.value}")
        if log is not None:
            try:
                write_standard(log, str(format.value), output, install=install,
                               content=content)
            except EventRejectedError as error:  # a clear's removals walk the surface fold
                sid = str(read.header["id"])
                raise LogCorruptError(
                    f"session {sid!r} (or a subagent session bundled with it) cannot be "
                    f"exported as {format.value}: its log breaks a surface rule no session "
                    f"accepts ({error.message}); 'dsh verify {sid}' lists every violation, and "
                    "--format dsh-jsonl exports the log as it is",
                    session_id=sid, seq=error.where.get("seq")) from error
            return
        if install:
            raise ConfigError(f"--install is for --format claude-code or codex, not "
                              f"{format.value}")
        if format is ExportFormat.dsh_jsonl:
            data = _dsh_jsonl(read)
        elif format in (ExportFormat.markdown, ExportFormat.html):
            data = _document(read, str(format.value)).encode("utf-8",
                                                              errors="backslashreplace")
        else:
            view = model_view(read, str(format.value), target_model)
            text = render.json_text(view, indent=2) + "\n"
            data = render.escape_json_controls(text.encode("utf-8", errors="backslashreplace"))
    write_output(data, output)


def _document(read: Inspection, fmt: str) -> str:
    """The human transcript of ``dsh show`` as a Markdown or HTML document."""
    from dsh.cli._common import source_format
    from dsh.cli._document import to_html, to_markdown
    from dsh.cli._render_entries import show_entries
    from dsh.transcript import build

    events = read.stored_events
    row = render.session_row(read.header, events, source_format=source_format(events))
    entries = show_entries(build(events, header=read.header))
    return (to_markdown if fmt == "markdown" else to_html)(read.header, entries, row)


def stored_log(persistence: Persistence, read: Inspection) -> Any:
    """The stored session as a :class:`dsh.interop.SessionLog`, with its subagent sessions.

    Children are the subagent sessions of the store (``origin`` ``subagent``) whose header
    names it as ``parentSession``; a fork is a session of its own, never bundled. Events are
    the stored log plus its in-memory repair closers (an interrupted turn reads closed);
    nothing is written.
    """
    from dsh.interop import SessionLog

    by_parent: dict[str, list[str]] = {}
    for h in persistence.list_headers():
        if h.get("origin") == "subagent" and isinstance(h.get("parentSession"), str):
            by_parent.setdefault(str(h["parentSession"]), []).append(str(h["id"]))

    def build(current: Inspection, seen: frozenset[str]) -> SessionLog:
        sid = str(current.header["id"])
        kids = sorted(k for k in by_parent.get(sid, ()) if k not in seen)
        return SessionLog(current.header, current.events,
                          tuple(build(persistence.read(k), seen | {k}) for k in kids))

    return build(read, frozenset({str(read.header["id"])}))


def _same_header(a: FrozenDict, b: FrozenDict) -> bool:
    # Backends differ only in how they store a top-level delegationDepth (JSONL writes 0,
    # SQLite leaves it NULL; docs/formats.md#header-line, dsh-logs README).
    def plain(header: FrozenDict) -> dict[str, Any]:
        return {k: v for k, v in header.items() if not (k == "delegationDepth" and not v)}

    return json_equal(plain(a), plain(b))


def _check_storable(target: Persistence, session_id: str, events: Sequence[Event]) -> None:
    """Refuse, before anything is created, a session the target's layout cannot hold."""
    if not target.backend.capabilities.storable_check:
        return
    try:
        cast("ChecksStorable", target.backend).check_storable(events)
    except EventRejectedError as exc:
        raise PersistenceError(
            f"session {session_id!r} cannot be converted into {target.url}: {exc.message}",
            code="UNSTORABLE_IN_TARGET", session_id=session_id,
            seq=exc.where.get("seq")) from exc


def _copy_session(source: Persistence, target: Persistence, sid: str) -> int | None:
    """Copy one session (header, then all its events in one batch) and verify the copy.

    Returns:
        How many events were copied, or None when the target already held an equal log.

    Raises:
        PersistenceError: ``CONVERT_CONFLICT`` (the target holds a different log under that
            id), ``CONVERT_MISMATCH`` (the copy did not read back equal),
            ``UNSTORABLE_IN_TARGET`` (before the session is created there).
    """
    with source.open(sid, "read") as handle:
        cold = handle.read(0)
    if target.exists(sid):
        _check_same(target, sid, cold.events)
        return None
    _check_storable(target, sid, cold.events)
    target.create(cold.header)
    with target.open(sid, "write") as handle:
        handle.append(cold.events)
        handle.flush()
    with target.open(sid, "read") as handle:
        back = handle.read(0)
    if not (json_equal(list(back.events), list(cold.events))
            and _same_header(back.header, cold.header)):
        raise PersistenceError(
            f"session {sid!r} did not read back equal from {target.url} after the "
            "copy", code="CONVERT_MISMATCH", session_id=sid)
    return len(cold.events)


def _check_same(target: Persistence, sid: str, events: Sequence[Event]) -> None:
    with target.open(sid, "read") as handle:
        present = handle.read(0)
    if not json_equal(list(present.events), list(events)):
        raise PersistenceError(
            f"session {sid!r} already exists in {target.url} with a different log "
            f"({len(present.events)} vs {len(events)} events); convert into "
            "an empty store", code="CONVERT_CONFLICT", session_id=sid)


def _check_store_log(source: Persistence, target: Persistence) -> bool:
    """Whether the source keeps a store log to carry; refuse, before any copy, one that cannot.

    The store log (docs/forgetting.md#the-store-log) holds the trash, the archive, the
    retention policies and the deletion records of the whole store: a copy without it would
    list trashed and archived sessions again and forget the policies, so a target that holds
    a different store log, or cannot store its (ignorable) records, is refused.
    """
    if not source.exists(STORE_LOG_ID):
        return False
    with source.open(STORE_LOG_ID, "read") as handle:
        events = handle.read(0).events
    if target.exists(STORE_LOG_ID):
        try:
            _check_same(target, STORE_LOG_ID, events)
        except PersistenceError as exc:
            raise PersistenceError(
                f"{target.url} already keeps a store log (trash, archive, retention policies) "
                f"that differs from {source.url}'s; convert into an empty store",
                code="CONVERT_CONFLICT", session_id=STORE_LOG_ID) from exc
    try:
        _check_storable(target, STORE_LOG_ID, events)
    except PersistenceError as exc:
        cause = exc.__cause__
        detail = cause.message if isinstance(cause, EventRejectedError) else exc.message
        raise PersistenceError(
            f"{source.url} keeps a store log (trash, archive, retention policies: "
            f"docs/stores.md#moving-between-stores) that {target.url} cannot hold: "
            f"{detail}; nothing was copied", code="UNSTORABLE_IN_TARGET",
            session_id=STORE_LOG_ID) from exc
    return True


def _copy_store(source: Persistence, target: Persistence) -> dict[str, Any]:
    """Copy the store log, then every session, and verify each copy.

    Rule: docs/stores.md#moving-between-stores.

    Returns:
        ``{"from", "to", "sessions", "copied", "skipped", "events", "storeLog"}``:
        ``storeLog`` is ``copied``, ``present`` (the target held it already) or None (the
        source has none).

    Raises:
        PersistenceError: code ``CONVERT_MISMATCH`` when a copy does not read back equal;
            ``CONVERT_CONFLICT`` when the target holds a different log under an id (for the
            store log: before anything is copied); ``UNSTORABLE_IN_TARGET`` (before the
            session is created there, for the store log before anything is) when the target's
            layout cannot hold one of its events.
    """
    ids = sorted(str(h["id"]) for h in source.list_headers())
    store_log = None
    if _check_store_log(source, target):
        # First, so that a copy stopped midway never lists a session the source hid; running
        # the convert again finds it present and goes on.
        store_log = "present" if _copy_session(source, target, STORE_LOG_ID) is None \
            else "copied"
    copied = skipped = event_count = 0
    with progress("copying", total=len(ids)) as bar:
        for sid in ids:
            bar.describe(sid)
            count = _copy_session(source, target, sid)
            if count is None:
                skipped += 1
            else:
                copied += 1
                event_count += count
            bar.advance()
    return {"from": source.url, "to": target.url, "sessions": len(ids), "copied": copied,
            "skipped": skipped, "events": event_count, "storeLog": store_log}


def convert(
    source: Annotated[str, typer.Option("--from", metavar="URL", show_default=False,
                                        help="Store to read.")],
    target: Annotated[str, typer.Option("--to", metavar="URL", show_default=False,
                                        help="Store to write; sqlite:///new.db?schema=14 creates "
                                             "a file the published dsh SQLite backend reads.")],
    json_: JsonOption = False,
) -> None:
    """Copy a store's sessions, trash, archive and policies into another; each copy verified."""
    json_mode(json_)
    with cli_store(source, create=False) as reader, cli_store(target) as writer:
        outcome = _copy_store(reader.persistence, writer.persistence)
    if json_:
        render.write_json(outcome)
        return
    stdout_console().print(f"copied {render.plural(outcome['copied'], 'session')} "
                           f"({render.plural(outcome['events'], 'event')}) from "
                           f"{outcome['from']} to {outcome['to']}; skipped "
                           f"{outcome['skipped']} already present"
                           + ("; carried the store log (trash, archive, retention policies)"
                              if outcome["storeLog"] == "copied" else "")
                           + "; every copy read back equal", markup=False)

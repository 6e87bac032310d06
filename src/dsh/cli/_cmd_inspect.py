"""``dsh ls``, ``show``, ``events``, ``messages``: read-only views of stored sessions."""

from __future__ import annotations

import enum
import shlex
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from itertools import chain
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

import typer

from dsh import (
    DshError,
    EventRejectedError,
    SessionNotFoundError,
)
from dsh._errors import printable
from dsh.cli import _render as render
from dsh.cli._common import (
    JsonOption,
    SessionArg,
    StoreOption,
    TargetModelOption,
    cli_store,
    json_mode,
    missing_default_store,
    model_view,
    read_session,
    require_session,
    source_format,
    sqlite_stores_in,
    stdout_console,
)
from dsh.cli._errors import EXIT_FAILED, format_error_line
from dsh.cli._progress import Bar, progress
from dsh.cli._render import plural
from dsh.persistence import read_pages, search_words

if TYPE_CHECKING:
    from dsh import Event, Store
    from dsh.persistence import ListingEntry, Persistence, StoredPages

    # imported by show's functions, not here: ls, search, events and messages never load it
    from dsh.transcript import Entry, InvalidEvent, TurnStart

def _rows(sessions: Store, which: Literal["listed", "trash", "archived", "all"] = "listed"
          ) -> tuple[list[render.SessionRow], list[DshError]]:
    """Rows of every readable session (newest activity first) and the errors of the others.

    From the store's listing index (``Store.list``): unchanged logs are not read.
    """
    unreadable: list[DshError] = []
    entries = sessions.list(errors=unreadable, which=which)
    rows = [render.entry_row(entry) for entry in entries]
    # Most recent activity first, by the time the row shows: for a source without timestamps
    # that is the file's time the importer stamped (shown as such), not a later place.
    rows.sort(key=lambda r: (-r.last_activity_ms, r.id))
    return rows, unreadable


def ls(store: StoreOption = None, json_: JsonOption = False,
       trash: Annotated[bool, typer.Option(
           "--trash", help="List the trash instead ('dsh rm' put them there).")] = False,
       archived: Annotated[bool, typer.Option(
           "--archived", help="List the archived sessions instead (a retention policy "
                              "archived them).")] = False,
       all_: Annotated[bool, typer.Option(
           "--all", help="List every stored session, trashed and archived ones too.")
       ] = False) -> None:
    """List the sessions in the store, most recent activity first.

    Sessions in the trash or archived are left out unless asked for
    (docs/forgetting.md#deletion-with-a-way-back); ``--trash`` also says why each is there
    (the reason ``dsh rm --reason``, a retention policy or ``dsh import`` gave). A session
    whose log cannot be read is reported on stderr (one ``error[CODE]`` line each, `dsh
    verify` tells more) and makes the exit status 1; the others are still listed.
    """
    json_mode(json_)
    if trash + archived + all_ > 1:
        raise typer.BadParameter("give at most one of --trash, --archived and --all")
    which: Literal["listed", "trash", "archived", "all"] = (
        "trash" if trash else "archived" if archived else "all" if all_ else "listed")
    missing = missing_default_store() if store is None else None
    if missing is not None:  # a read creates no store: nothing to list yet (exit 0)
        if json_:
            render.write_json([])
        else:
            render.print_text(f"no sessions yet: the default store {missing} does not exist;"
                              " 'dsh import' adds some (try 'dsh import --examples')",
                              stderr=True)
        return
    with cli_store(store, create=False) as sessions:
        url = sessions.url
        rows, unreadable = _rows(sessions, which)
        if which == "trash":  # why each is there: `dsh rm --reason`, a policy, an import
            from dataclasses import replace

            from dsh.rights import store_log

            trashed = store_log(sessions.persistence).trash
            rows = [replace(row, trash_reason=getattr(trashed.get(row.id), "reason", None) or "",
                            purged=getattr(trashed.get(row.id), "purged_ms", None) is not None)
                    for row in rows]
        hidden = len(_rows(sessions, "all")[0]) if not rows and which == "listed" else 0
    if json_:
        render.write_json([row.to_json() for row in rows])
    elif rows and render.plain_stream() is not None:
        # Piped to a program: whole values, printed without loading rich (5,000 rows: ~60 ms).
        render.print_text(render.render_sessions_table(rows, width=None))
    elif rows:
        console = stdout_console()
        width = console.width if console.is_terminal else None  # piped: whole values
        table = render.render_sessions_table(rows, width=width)
        head, _, body = table.partition("\n")
        from rich.text import Text  # a terminal: the column heads stand out (colour rules:
        # make_console; NO_COLOR and TERM=dumb turn it off)

        console.print(Text(head, style="bold"), markup=False, highlight=False)
        if body:
            console.print(body, markup=False, highlight=False)
    elif not unreadable and which == "trash":
        render.print_text("the trash is empty ('dsh rm ID' moves a session there)", stderr=True)
    elif not unreadable and which == "archived":
        render.print_text("no archived sessions (a retention policy archives them: "
                          "'dsh retention --archive-after DAYS')", stderr=True)
    elif not unreadable and hidden:
        render.print_text(f"no sessions listed: {render.plural(hidden, 'session')} in the trash "
                          "or archived ('dsh ls --all' lists them, 'dsh restore ID' gives one "
                          "back)", stderr=True)
    elif not unreadable:
        found = sqlite_stores_in(url)
        hint = (f"; this folder holds a SQLite store: --store {found[0]}" if len(found) == 1
                else "; this folder holds SQLite stores: " + ", ".join(
                    f"--store {path}" for path in found) if found else "")
        render.print_text(f"no sessions in the store {url}{hint}; 'dsh import' adds some "
                          "(try 'dsh import --examples')", stderr=True)
    for error in unreadable:
        sys.stderr.write(format_error_line(error) + "\n")
    if unreadable:
        raise typer.Exit(EXIT_FAILED)


_PAGE_ENTRIES: Final = 200
"""Entries ``dsh show`` prints at once: the first batch is out before the rest is read."""


def _listed_if_removed(persistence: Persistence, pages: StoredPages, sid: str
                       ) -> ListingEntry | Literal["pages"] | None:
    """What titles a paged session: its listing entry if it may hold a removal, else its pages.

    A clear or quarantine past the pages read can take the title's prompt off the model view
    (docs/forgetting.md#what-titles-show): then the listing's title, which folds the whole
    log, is shown (None: the listing could not read it). The listing reads the whole store, so
    a log known to hold no removal is titled from its first pages (``"pages"``): one whose
    restore point counts no surface replacement before its cut and whose tail holds none
    (every clear, pop, delete and quarantine is one), or, failing that, one the
    backend finds no removal or quarantine record in (:class:`~dsh.persistence.KnowsRemovals`:
    one query).
    """
    from dsh.persistence import KnowsRemovals

    restore = pages.restore
    if restore is not None and restore.replace_generation == 0 and all(
            event.get("surfaceOp") in (None, "append")
            for event in pages.events[restore.event_count:]):
        return "pages"
    backend = persistence.backend
    if isinstance(backend, KnowsRemovals):
        try:
            if sid not in backend.removal_events([sid]):
                return "pages"
        except DshError:  # the listing below tells, or names the damage
            pass
    return next((e for e in persistence.list_entries()[0] if e.id == sid), None)


def show(
    session_id: SessionArg,
    full: Annotated[bool, typer.Option("--full", help="Do not clip long tool results.")] = False,
    last: Annotated[int | None, typer.Option(
        "--last", metavar="N", min=1, show_default=False,
        help="Only the last N entries (messages, tool results, checkpoints, ...).")] = None,
    from_seq: Annotated[int | None, typer.Option(
        "--from", metavar="SEQ", min=0, show_default=False,
        help="Only the entries of events from this seq on.")] = None,
    turn: Annotated[int | None, typer.Option(
        "--turn", metavar="N", min=0, show_default=False,
        help="Only turn N.")] = None,
    store: StoreOption = None,
    json_: JsonOption = False,
) -> None:
    """Show a session as a transcript: messages, tool calls with results, checkpoints, repairs.

    The transcript is read and printed a page at a time, so the first screen of a big session
    comes at once and ``dsh show ID | head`` stops reading when ``head`` has enough.
    """
    json_mode(json_)
    if sum(option is not None for option in (last, from_seq, turn)) > 1:
        raise typer.BadParameter("pass at most one of --last, --from and --turn",
                                 param_hint="'--last' / '--from' / '--turn'")
    with cli_store(store, create=False) as sessions:
        sid = require_session(sessions, session_id)
        pages = read_pages(sessions.persistence, sid)
        events, header = pages.events, pages.header
        if pages.paged:
            listed = _listed_if_removed(sessions.persistence, pages, sid)
            row = render.paged_session_row(header, events, listed=listed)
        else:
            row = render.session_row(header, events, source_format=source_format(events))
        entries = _chosen_entries(events, header, sid, last=last, from_seq=from_seq, turn=turn)
        invalid: list[InvalidEvent] = []
        entries = _noting_invalid(entries, invalid)
        if json_:
            render.write_json({"session": row.to_json(), "header": header,
                               "items": [entry.to_json() for entry in entries]})
        else:
            # loads dsh.transcript: of this module's commands only show renders a transcript
            from dsh.cli._render_entries import render_entries

            console = stdout_console()
            console.print(render.render_show_head(header, row))
            batch: list[Entry] = []
            for entry in entries:
                batch.append(entry)
                if len(batch) >= _PAGE_ENTRIES:
                    console.print(render_entries(batch, full=full))
                    batch = []
            if batch:
                console.print(render_entries(batch, full=full))
    if invalid:
        raise _invalid_error(sid, invalid)


def _noting_invalid(entries: Iterable[Entry], found: list[InvalidEvent]) -> Iterator[Entry]:
    """``entries`` as they come, each :class:`InvalidEvent` among them also put in ``found``."""
    from dsh.transcript import InvalidEvent  # once per call: the loop below is per entry

    for entry in entries:
        if isinstance(entry, InvalidEvent):
            found.append(entry)
        yield entry


def _invalid_error(session_id: str, invalid: Sequence[InvalidEvent]) -> EventRejectedError:
    """The error ``dsh show`` ends with when it marked invalid events (docs/cli.md#dsh-show).

    ``dsh messages`` refuses such a session with the first problem; ``show`` prints the
    transcript with each one marked, then exits 1 with this line naming the first and the count.
    """
    first = invalid[0]
    more = f" (and {plural(len(invalid) - 1, 'more invalid event')} marked in the transcript)" \
        if len(invalid) > 1 else " (marked in the transcript)"
    return EventRejectedError(
        f"session {session_id!r} holds an event the model view refuses{more}: {first.problem}; "
        f"'dsh verify {session_id}' lists every problem", code=first.code,
        session_id=session_id, seq=first.seq)


def _chosen_entries(events: Sequence[Event], header: Mapping[str, Any], session_id: str, *,
                    last: int | None, from_seq: int | None, turn: int | None,
                    start: int | None = None) -> Iterable[Entry]:
    """The entries ``dsh show`` prints for the options given, lazily where it can.

    ``from_seq`` inside a turn, and ``last`` entries that begin inside one, start with that
    turn's :class:`TurnStart` (read back, so the ``── turn N ──`` line says which turn the
    entries belong to; docs/cli.md#dsh-show).

    Raises:
        SessionNotFoundError: code ``TURN_NOT_FOUND`` when ``turn`` names no turn of the log,
            ``SEQ_NOT_FOUND`` when ``from_seq`` is past its last event.
    """
    from dsh.cli._render_entries import shown
    from dsh.transcript import iter_entries, last_entries, turn_span

    if last is not None:
        chosen = last_entries(events, last, keep=shown, header=header)
        opening = _opening_turn(events, chosen[0].seq) if chosen else None
        return chosen if opening is None else (opening, *chosen)
    if from_seq and from_seq >= len(events):
        raise SessionNotFoundError(
            f"session {session_id!r} "
            + (f"ends at seq {len(events) - 1}" if events else "holds no events")
            + f", before --from {from_seq}; "
            f"'dsh show {_typed(session_id)} --last 20' shows its end", code="SEQ_NOT_FOUND",
            session_id=session_id, seq=from_seq)
    if from_seq:
        opening = _opening_turn(events, from_seq)
        rest = _chosen_entries(events, header, session_id, last=None, from_seq=None, turn=None,
                               start=from_seq)
        return rest if opening is None else chain([opening], rest)
    start, stop = (start or 0), None
    if turn is not None:
        span = turn_span(events, turn)
        if span is None:
            raise SessionNotFoundError(
                f"session {session_id!r} has no turn {turn}; 'dsh ls' gives its number of "
                f"turns, 'dsh show {_typed(session_id)} --last 20' shows its end",
                code="TURN_NOT_FOUND",
                session_id=session_id)
        start, stop = span
    return (entry for entry in iter_entries(events, start=start, stop=stop, header=header)
            if shown(entry))


def _typed(session_id: str) -> str:
    """``session_id`` as a shell word for a hint (``ID`` for an id a line cannot hold as typed).

    An error is one line: an id with a newline or another control character is not spelled
    into the command it suggests.
    """
    return shlex.quote(session_id) if session_id.isprintable() else "ID"


def _opening_turn(events: Sequence[Event], start: int) -> TurnStart | None:
    """The ``turn/start`` of the turn event ``start`` falls inside (not at its start), if any.

    Looked for at most :data:`DEFAULT_LOOKBACK` events back, as the transcript fold does; a
    ``turn/end`` on the way means ``start`` is between turns.
    """
    from dsh.transcript import DEFAULT_LOOKBACK, TurnStart

    if events[start].get("type") == "turn/start":
        return None  # the fold prints that one itself
    for index in range(start - 1, max(0, start - DEFAULT_LOOKBACK) - 1, -1):
        event = events[index]
        if event["type"] == "turn/end":
            return None
        if event["type"] == "turn/start":
            data = event.get("data")
            number = data.get("turn") if isinstance(data, Mapping) else None
            return TurnStart(seq=index, time=event["time"],
                             turn=number if type(number) is int else None)
    return None


def events(
    session_id: SessionArg,
    from_seq: Annotated[int, typer.Option("--from", metavar="SEQ", min=0,
                                          help="First seq to print.")] = 0,
    types: Annotated[list[str] | None, typer.Option(
        "--type", metavar="T", show_default=False,
        help="Only events of this type (repeatable; globs such as 'compaction/*').")] = None,
    store: StoreOption = None,
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="Keep printing new events as they are committed.")] = False,
) -> None:
    """Print the log as JSON lines, terminal controls escaped.

    Each line is a committed event in dsh's wire format, its values the log's own; control
    characters (C0, DEL, C1) and bidi overrides are written as JSON escapes (``\\u001b``) so
    the terminal shows them instead of obeying them (docs/cli.md#output). For the log's exact
    bytes: ``dsh export --format dsh-jsonl``.
    """
    from fnmatch import fnmatchcase

    if follow:
        from dsh.cli._cmd_store import follow_events
        follow_events(store, session_id, from_seq, list(types or ()))
        return

    with cli_store(store, create=False) as sessions:
        session_id = require_session(sessions, session_id)
        with sessions.persistence.open(session_id, "read") as handle:
            stored = handle.read(from_seq).events
    if not types:
        render.write_json_lines(stored)
        return
    patterns = list(types)
    selected = [e for e in stored if any(fnmatchcase(e["type"], p) for p in patterns)]
    render.write_json_lines(selected)
    if not selected:  # a typo must not look like a session without such events
        import difflib

        present = sorted({str(e["type"]) for e in stored})
        close = [m for p in patterns for m in difflib.get_close_matches(p, present, n=1)]
        where = f" from seq {from_seq}" if from_seq else ""
        if close:
            hint = f"; did you mean {close[0]!r}?"
        elif present:  # nothing close: name what there is, so the next try can pick one
            shown = ", ".join(present[:12]) + (f", … ({len(present) - 12} more)"
                                              if len(present) > 12 else "")
            hint = f"; its types: {shown}"
        else:
            hint = ""
        render.print_text(f"note: no event of session {session_id}{where} has a type "
                          f"matching {' or '.join(repr(p) for p in patterns)}{hint}",
                          stderr=True)


class MessageFormat(enum.StrEnum):
    """``--format`` of ``dsh messages``."""

    dsh = "dsh"
    openai = "openai"
    anthropic = "anthropic"


def messages(
    session_id: SessionArg,
    format: Annotated[MessageFormat, typer.Option(
        "--format", help="dsh messages, or a provider's request shape.")] = MessageFormat.dsh,
    target_model: TargetModelOption = None,
    store: StoreOption = None,
) -> None:
    """Print what the model sees: the messages derived from the log's surface, as JSON.

    An interrupted turn is shown as the repair would close it (nothing is written).
    """
    with cli_store(store, create=False) as sessions:
        read = read_session(sessions, session_id)
    render.write_json(model_view(read, str(format.value), target_model))



def search(
    words: Annotated[list[str], typer.Argument(
        metavar="QUERY...", show_default=False,
        help="Words to find in the messages of every session (all of them; the last also as "
             "a prefix); quoting them is optional.")],
    limit: Annotated[int, typer.Option("--limit", metavar="N", min=1,
                                       help="Hits printed at most.")] = 20,
    rebuild: Annotated[bool, typer.Option(
        "--rebuild", help="Build the store's search index again from every log.")] = False,
    trash: Annotated[bool, typer.Option(
        "--trash", help="Search the sessions in the trash too ('dsh rm' put them there).")
    ] = False,
    store: StoreOption = None,
    json_: JsonOption = False,
) -> None:
    """Search the messages of every session of the store: session, seq and a snippet per hit.

    SQLite and JSONL stores keep a full-text index beside them, brought up to date with the
    logs that changed since the last search; other stores are read whole. Sessions in the
    trash are left out, of the hits and of the count of sessions searched, unless
    ``--trash``; the store log is never counted (docs/stores.md#search).
    """
    json_mode(json_)
    query = " ".join(words)
    if not search_words(query):
        raise typer.BadParameter(f"{printable(query)!r} holds no word to search for: give "
                                 "letters or digits (punctuation alone matches nothing)",
                                 param_hint="QUERY")
    with cli_store(store, create=False) as sessions, ExitStack() as shown:
        bars: list[Bar] = []

        def indexing(done: int, total: int, session_id: str) -> None:
            # Drawn only once the index has logs to read (a first search, or after writes):
            # sessions indexed of those to index, the one being read, the time spent.
            if not bars:
                bars.append(shown.enter_context(progress("indexing", total=total)))
            elif done:
                bars[0].advance()
            bars[0].describe(printable(session_id))

        results = sessions.search(query, limit=limit, rebuild=rebuild, trash=trash,
                                  progress=indexing)
    if json_:
        render.write_json({"query": query, "hits": [render.hit_json(hit) for hit in results.hits],
                           "sessions": results.sessions, "indexed": results.indexed,
                           "unreadable": list(results.unreadable)})
        return
    if results.hits:
        stdout_console().print(render.render_hits(results.hits), markup=False,
                               highlight=False)
    else:
        searched = render.plural(results.sessions, "session")
        render.print_text(f"no message holds {printable(query)!r} in {searched}", stderr=True)
    for sid in results.unreadable:
        sys.stderr.write(f"note: session {printable(sid)!r} was left out: its log cannot be "
                         "read ('dsh verify' names the damage)\n")

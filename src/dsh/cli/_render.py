"""Rendering for the `dsh` command: JSON output, session tables, show's header, search hits (rich).

Everything here is a pure function of already-loaded data (headers, events, rows): it reads no
store. Human output goes through :mod:`rich` (colour only when the stream is a terminal); user
text is always wrapped in :class:`rich.text.Text`, never parsed as markup. Machine output is JSON:
``--json`` documents through :func:`write_json`, raw logs through :func:`write_json_lines` (the
exact wire bytes of :func:`dsh.json.dumps`). rich is imported by the functions that use it
(~30 ms): ``dsh ls`` piped to a program prints its plain table without it (:func:`plain_stream`).
A transcript's entries are rendered by :mod:`dsh.cli._render_entries`, the one that imports
:mod:`dsh.transcript`: a command that prints no transcript does not load it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any, Final, Literal

from dsh._errors import has_unprintable, printable
from dsh.json import dumps

if TYPE_CHECKING:
    from rich.console import Console, Group, RenderableType
    from rich.text import Text

    from dsh.persistence import ListingEntry, SearchHit



# -- output streams --------------------------------------------------------------------------

_PIPE_WIDTH: Final = 120
"""Layout width (characters) for tables when the output is not a terminal and ``COLUMNS`` is
unset (rich would otherwise squeeze tables into 80 columns)."""


def make_console(*, stderr: bool = False) -> Console:
    """Return a rich console on stdout (or stderr) that colours only a terminal.

    ``soft_wrap`` keeps long lines whole when the output is piped; ``highlight`` is off so user
    text is never recoloured; control characters in text are printed as escapes
    (:func:`printable`). ``NO_COLOR`` and ``TERM=dumb`` are honoured by rich. Piped output
    is laid out 120 columns wide unless ``COLUMNS`` says otherwise.
    """
    from dsh.cli._console import SafeConsole  # rich is imported with it (~30 ms)

    stream = sys.stderr if stderr else sys.stdout
    piped = not (hasattr(stream, "isatty") and stream.isatty())
    width = _PIPE_WIDTH if piped and "COLUMNS" not in os.environ else None
    return SafeConsole(stderr=stderr, highlight=False, soft_wrap=True, emoji=False,
                       width=width)


def plain_stream(*, stderr: bool = False) -> IO[str] | None:
    """Return stdout (or stderr) when rich would not treat it as a terminal, else None.

    Rule: the stream is not a TTY (``isatty()`` answers False), neither ``FORCE_COLOR`` nor
    ``TTY_COMPATIBLE`` is set (rich reads both) and this is not IPython or Jupyter (rich
    renders there itself). On such a stream a :func:`make_console` prints plain text
    unchanged, so :func:`print_text` may write it without rich. Any doubt answers None.
    """
    import builtins

    stream = sys.stderr if stderr else sys.stdout
    isatty = getattr(stream, "isatty", None)
    if (stream is None or isatty is None or hasattr(stream, "rich_proxied_file")
            or "FORCE_COLOR" in os.environ or "TTY_COMPATIBLE" in os.environ
            or hasattr(builtins, "get_ipython")):
        return None
    try:
        return None if isatty() else stream
    except ValueError:  # a closed stream: let rich decide
        return None


def print_text(text: str, *, stderr: bool = False) -> None:
    """Print ``text`` and a newline as ``make_console().print(text, markup=False)`` does.

    Rule: where :func:`plain_stream` gives a stream and ``text`` holds no tab and nothing
    :func:`printable` would escape, rich's soft-wrapped output is ``text`` itself (no wrap, no
    crop, no style), so it is written and flushed directly; otherwise the console prints it.
    """
    stream = plain_stream(stderr=stderr)
    if stream is not None and "\t" not in text and not has_unprintable(text):
        stream.write(text + "\n")
        stream.flush()
        return
    make_console(stderr=stderr).print(text, markup=False, highlight=False)


def _to_plain(value: Any) -> Any:
    # Frozen containers are dict/list subclasses; json handles them, but tuples from our rows
    # must become lists.
    if isinstance(value, tuple):
        return [_to_plain(v) for v in value]
    return value


class _Close:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _iterative_json(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False)`` on one line without recursion (any depth)."""
    parts: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if type(item) is _Close:
            parts.append(item.text)
        elif isinstance(item, dict):
            if not item:
                parts.append("{}")
                continue
            stack.append(_Close("}"))
            entries = list(item.items())
            for i in range(len(entries) - 1, -1, -1):
                key, child = entries[i]
                stack.append(child)
                stack.append(_Close(("{" if i == 0 else ", ")
                                    + json.dumps(str(key), ensure_ascii=False) + ": "))
        elif isinstance(item, list | tuple):
            if not item:
                parts.append("[]")
                continue
            stack.append(_Close("]"))
            for i in range(len(item) - 1, -1, -1):
                stack.append(item[i])
                stack.append(_Close("[" if i == 0 else ", "))
        else:
            try:
                parts.append(json.dumps(item, ensure_ascii=False))
            except TypeError:
                parts.append(json.dumps(str(item), ensure_ascii=False))
    return "".join(parts)


def json_text(value: Any, *, indent: int | None = 2) -> str:
    """``value`` as JSON text (``ensure_ascii=False``), at any nesting depth.

    The standard encoder recurses (a log line may nest 20,000 levels deep, valid in dsh): past
    its limit the value comes from an iterative encoder, on one line (indenting 20,000 levels
    would write gigabytes of spaces; see ``docs/cli.md#output``).
    """
    try:
        return json.dumps(_to_plain(value), ensure_ascii=False, indent=indent,
                          default=_to_plain)
    except RecursionError:
        return _iterative_json(value)


_RAW_CONTROL = re.compile(rb"\x7f|\xc2[\x80-\x9f]|\xe2\x80[\xaa-\xae]|\xe2\x81[\xa6-\xa9]")
"""DEL, the C1 controls (U+0080-U+009F) and the bidi embeddings, overrides and isolates
(U+202A-U+202E, U+2066-U+2069) in UTF-8: JSON lets them through raw."""

_RAW_BIDI = re.compile(rb"\xe2(?:\x80[\xaa-\xae]|\x81[\xa6-\xa9])")
"""The bidi part of ``_RAW_CONTROL`` alone: a fast first test for text with other U+2xxx
(quotes, dashes, ellipses), which most lines of prose hold."""


def _control_escape(match: re.Match[bytes]) -> bytes:
    return b"\\u%04x" % ord(match.group(0).decode("utf-8"))


def escape_json_controls(data: bytes) -> bytes:
    """JSON text with DEL, C1 controls and bidi overrides as ``\\uXXXX`` escapes (the same value).

    JSON encoders escape C0 controls but pass DEL, U+0080-U+009F and U+202A-U+202E,
    U+2066-U+2069 raw: a terminal obeys U+009B (CSI) as it obeys ESC [, and a bidi override
    reorders the line it is printed on ("Trojan Source"). In JSON text these code points occur
    only inside strings, so the escape changes no value (``docs/cli.md#output``).
    """
    if b"\x7f" in data or b"\xc2" in data or (b"\xe2" in data and _RAW_BIDI.search(data)):
        return _RAW_CONTROL.sub(_control_escape, data)
    return data


def write_json(value: Any, *, stream: IO[bytes] | None = None, indent: int | None = 2) -> None:
    """Write one JSON document and a newline to stdout (binary).

    Lone surrogates (dsh allows them in strings) are written as ``\\udXXX`` escapes, so the
    output is valid UTF-8 and valid JSON; DEL, C1 controls and bidi overrides as ``\\uXXXX``
    (:func:`escape_json_controls`). Any nesting depth is written (see :func:`json_text`).
    """
    text = json_text(value, indent=indent)
    out = stream if stream is not None else sys.stdout.buffer
    out.write(escape_json_controls(text.encode("utf-8", errors="backslashreplace")) + b"\n")
    out.flush()


def write_json_lines(values: Iterable[Any], *, stream: IO[bytes] | None = None) -> int:
    """Write each value as one compact JSON line in dsh's wire encoding; return the line count.

    The bytes are the log's own but for DEL, C1 controls and bidi overrides, escaped as
    ``\\uXXXX`` (the same JSON value; :func:`escape_json_controls`).
    """
    out = stream if stream is not None else sys.stdout.buffer
    count = 0
    for value in values:
        out.write(escape_json_controls(dumps(value)) + b"\n")
        count += 1
    out.flush()
    return count


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """Return ``"<count> <noun>"`` with the noun's plural unless the count is 1.

    ``plural("1", "turn")`` is ``1 turn``, ``plural(2, "turn")`` is ``2 turns``; irregular
    nouns pass ``plural_form``.
    """
    return f"{count} {noun if count == 1 else (plural_form or noun + 's')}"


def format_ms(epoch_ms: int | None) -> str:
    """Format epoch milliseconds as ``YYYY-MM-DD HH:MM`` UTC (``-`` for None)."""
    if epoch_ms is None:
        return "-"
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M")


def _iso_ms(epoch_ms: int | None) -> str | None:
    if epoch_ms is None:
        return None
    stamp = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


# -- session rows (dsh ls) -------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class SessionRow:
    """One row of ``dsh ls`` and of ``dsh ls --json``.

    Attributes:
        id: Session id.
        title: Last ``session/title``, else the first user prompt (its first line, whole),
            else None.
        turns: Number of ``turn/start`` events.
        events: Committed events.
        last_activity_ms: The later of the last event's ``time`` and header ``createdAt``
            (epoch ms): creating a fork is activity, though its events are inherited.
        parent_session: Header ``parentSession`` (fork lineage) or None.
        seed_length: Header ``seedLength`` (events inherited from the parent) or None.
        source_format: Where the log came from: ``dsh`` for a native log, else the importer's
            format name (``claude-code``, ``codex``, …).
        created_at_ms: Header ``createdAt`` (epoch ms).
        timed: False for an imported session whose source had no timestamps (the importer
            stamped every event with the file's modification time and said so in
            ``import/source``).
        origin: Header ``origin`` (``"subagent"`` for a subagent's session) or None.
        trash_reason: ``dsh ls --trash`` only: why the session is in the trash (the
            ``store/trashed`` record's reason), ``""`` when it was given none; None elsewhere.
        purged: ``dsh ls --trash`` only: the session was purged (its content erased; it stays
            in the trash as tombstones).
    """

    id: str
    title: str | None
    turns: int
    events: int
    last_activity_ms: int
    parent_session: str | None
    seed_length: int | None
    source_format: str
    created_at_ms: int
    timed: bool = True
    origin: str | None = None
    trash_reason: str | None = None
    purged: bool = False

    @property
    def lineage(self) -> str:
        """``fork of <parent> @<seq>``, ``subagent of <parent>`` (a subagent), or ``-``."""
        return self.lineage_with(self.parent_session)

    def lineage_with(self, parent: str | None) -> str:
        """:attr:`lineage` naming the parent as ``parent`` (a short prefix of its id)."""
        if self.parent_session is None or parent is None:
            return "-"
        label = "subagent of" if self.origin == "subagent" else "fork of"
        if self.seed_length and self.origin != "subagent":
            return f"{label} {parent} @{self.seed_length - 1}"
        return f"{label} {parent}"

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object; its keys are stable (camelCase like dsh's wire format)."""
        return {
            "id": self.id,
            "title": self.title,
            "turns": self.turns,
            "events": self.events,
            "lastActivityMs": self.last_activity_ms,
            "lastActivity": _iso_ms(self.last_activity_ms),
            "createdAtMs": self.created_at_ms,
            "parentSession": self.parent_session,
            "seedLength": self.seed_length,
            "lineage": None if self.parent_session is None else self.lineage,
            "sourceFormat": self.source_format,
            "timed": self.timed,
        } | ({} if self.trash_reason is None else {"trashReason": self.trash_reason or None,
                                                    "purged": self.purged})


_SPACES: Final = re.compile(r"[^\S\x00-\x08\x0b-\x1f\x7f-\x9f]+")
"""A run of whitespace that is not a control character (a lone CR, VT, FF stay, escaped)."""


def one_line(text: str) -> str:
    """``text`` as one line: each run of spaces, tabs and line ends one space, none at the ends.

    Control characters that are whitespace to Python (a lone CR, VT, FF, U+001C to U+001F,
    NEL) are kept, for :func:`printable` to show as escapes: never dropped (docs/cli.md#output).
    """
    return _SPACES.sub(" ", text).strip(" ")


def _first_line(text: str) -> str:
    # The listing's first line (dsh.persistence.first_line), each run of spaces in it one space.
    from dsh.persistence import first_line

    return one_line(first_line(text) or "")


def session_row(header: Mapping[str, Any], events: Sequence[Mapping[str, Any]], *,
                source_format: str) -> SessionRow:
    """Build the ``dsh ls`` row of one session from its header and committed events.

    The same row as the listing index gives (:func:`entry_row` of
    :func:`dsh.persistence.summarize`).

    Args:
        header: The stored ``SessionHeader`` wire object (``id``, ``createdAt``, …).
        events: Its committed events (wire objects), seq order.
        source_format: Format name recorded for the session (``dsh`` when native).
    """
    from dsh.persistence import summarize

    return dataclasses.replace(entry_row(summarize(header, events)),
                               source_format=source_format)


def paged_session_row(header: Mapping[str, Any], events: Sequence[Mapping[str, Any]], *,
                      listed: ListingEntry | Literal["pages"] | None,
                      head: int = 256) -> SessionRow:
    """The row of a session read by page, without reading its whole log.

    Rule (docs/cli.md#dsh-show): the title is the store listing's (``listed``, the session's
    entry in ``Persistence.list_entries``: of what the model view holds now, a clear after
    the first ``head`` events included; None when the listing could not read the log: no
    title), or, with ``listed="pages"`` (a log known to hold no removal or quarantine
    record: nothing left the model view), that of the first ``head`` events; the source
    comes from the first ``head`` events, the turns are the number of the last
    ``turn/start`` (turns are numbered from 1), the events and the last activity from the
    log's length and last event.
    """
    from dsh.persistence import summarize

    first = summarize(header, events[:head])
    if listed != "pages":
        first = dataclasses.replace(first, title=listed.title if listed else None,
                                    first_prompt=listed.first_prompt if listed else None)
    turns = first.turns
    for index in range(len(events) - 1, head - 1, -1):
        event = events[index]
        if event.get("type") == "turn/start":
            data = event.get("data")
            number = data.get("turn") if isinstance(data, Mapping) else None
            turns = max(turns, number) if type(number) is int else turns
            break
    last = int(events[-1]["time"]) if len(events) else first.last_activity_ms
    return entry_row(dataclasses.replace(first, events=len(events), turns=turns,
                                         last_activity_ms=max(last, first.last_activity_ms)))


def entry_row(entry: ListingEntry) -> SessionRow:
    """The ``dsh ls`` row of a listing entry (the same row :func:`session_row` builds)."""
    created = int(entry.header.get("createdAt", 0))
    return SessionRow(
        id=entry.id,
        title=_first_line(entry.title) if entry.title else (
            _first_line(entry.first_prompt) if entry.first_prompt else None),
        turns=entry.turns,
        events=entry.events,
        last_activity_ms=max(entry.last_activity_ms, created),
        parent_session=entry.header.get("parentSession"),
        seed_length=entry.header.get("seedLength"),
        source_format=entry.source_format,
        created_at_ms=created,
        timed=entry.timed,
        origin=entry.header.get("origin"),
    )


def _cut_shown(text: str, width: int) -> str:
    """``text`` escaped (:func:`printable`) in at most ``width`` characters, cut with ``…``.

    Cut between escapes, never inside one: a control character is shown whole (``\\x07``)
    or not at all (docs/cli.md#output).
    """
    shown = printable(text)
    if len(shown) <= width:
        return shown
    room, kept = max(width - 1, 0), []
    for char in text:
        piece = printable(char)
        room -= len(piece)
        if room < 0:
            break
        kept.append(piece)
    return "".join(kept) + "…"


SHORT_PARENT: Final = 8
"""Characters of a parent id LINEAGE shows at least (more where that prefix is ambiguous)."""


def _short_ids(ids: Sequence[str], among: Sequence[str]) -> dict[str, str]:
    """Each of ``ids`` cut to its shortest unique prefix of :data:`SHORT_PARENT`+ characters.

    Unique: it starts no other id of ``among`` (the whole id when no prefix does).
    """
    out: dict[str, str] = {}
    others = sorted(set(among))
    for sid in set(ids):
        size = SHORT_PARENT
        while size < len(sid) and any(o != sid and o.startswith(sid[:size]) for o in others):
            size += 1
        out[sid] = sid[:size]
    return out


def activity_cell(row: SessionRow) -> str:
    """LAST ACTIVITY of ``dsh ls``: the time, then ``file`` when it is the file's time.

    ``file``: the source had no times of its own, so the import stamped its events with the
    file's modification time.
    """
    return format_ms(row.last_activity_ms) + ("" if row.timed else " file")


def render_sessions_table(rows: Sequence[SessionRow], *, width: int | None = 120) -> str:
    """Return the ``dsh ls`` table as text: id, title, turns, events, activity, lineage, source.

    Plain columns, not a rich table: every column is always shown (rich drops columns it cannot
    fit). Ids, numbers, dates and lineage (it names a parent id) are never cut. On a terminal
    (``width`` its columns) the title takes the width left on the line, 12 to 48 characters,
    cut with an ellipsis; ``width=None`` (output piped to a program) prints every title whole.
    A narrow screen gets lines longer than the screen rather than missing data. Rows of the
    trash (:attr:`SessionRow.trash_reason` set) add REASON, why each was trashed, never cut
    (``purged`` first for a purged one: docs/forgetting.md#deletion-with-a-way-back). A
    session whose source had no timestamps shows the file's time followed by ``file``. LINEAGE names
    the parent by a short prefix of its id (8 characters, more where needed to be unique).
    Control characters are shown as escapes (:func:`printable`, docs/cli.md#output) and the
    columns are measured on the escaped text, so they stay aligned; a title is cut between
    escapes, never inside one.
    """
    short = _short_ids([r.parent_session for r in rows if r.parent_session],
                       [r.id for r in rows])
    # Escaped before measuring: an escape is wider than the control it shows (docs/cli.md#output)
    ids = [printable(r.id) for r in rows]
    raw_titles = [r.title or "-" for r in rows]
    titles = [printable(t) for t in raw_titles]
    lineages = [printable(r.lineage_with(short.get(r.parent_session or ""))) for r in rows]
    activity = [activity_cell(r) for r in rows]
    widths = {
        "ID": max([2, *(len(x) for x in ids)]),
        "TURNS": max([5, *(len(str(r.turns)) for r in rows)]),
        "EVENTS": max([6, *(len(str(r.events)) for r in rows)]),
        "LAST ACTIVITY (UTC)": max([19, *(len(a) for a in activity)]),
        "LINEAGE": max([7, *(len(x) for x in lineages)]),
        "SOURCE": max([6, *(len(r.source_format) for r in rows)]),
    }
    fixed = sum(widths.values()) + 2 * 6
    longest = max([5, *(len(x) for x in titles)])
    title_width = longest if width is None else max(12, min(48, longest, width - fixed))
    header = ["ID", "TITLE", "TURNS", "EVENTS", "LAST ACTIVITY (UTC)", "LINEAGE", "SOURCE"]
    cells = [header] + [[sid, _cut_shown(title, title_width), str(r.turns), str(r.events),
                         when, lineage, r.source_format]
                        for r, sid, title, when, lineage
                        in zip(rows, ids, raw_titles, activity, lineages, strict=True)]
    sizes = [widths["ID"], title_width, widths["TURNS"], widths["EVENTS"],
             widths["LAST ACTIVITY (UTC)"], widths["LINEAGE"], widths["SOURCE"]]
    if any(r.trash_reason is not None for r in rows):  # dsh ls --trash: why, last and whole
        reasons = [printable(("purged" + (f"; {r.trash_reason}" if r.trash_reason else ""))
                             if r.purged else r.trash_reason or "-") for r in rows]
        for line, reason in zip(cells, ["REASON", *reasons], strict=True):
            line.append(reason)
        sizes.append(max(len(x) for x in ["REASON", *reasons]))
    right = {2, 3}
    lines = []
    for row in cells:
        parts = [cell.rjust(size) if i in right else cell.ljust(size)
                 for i, (cell, size) in enumerate(zip(row, sizes, strict=True))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


# -- transcripts (dsh show) ------------------------------------------------------------------

_ROLE_STYLE: Final = {"user": "bold green", "assistant": "bold blue", "tool": "bold magenta",
                      "system": "bold yellow"}


def render_show_head(header: Mapping[str, Any], row: SessionRow) -> Group:
    """The header block ``dsh show`` prints first: the session's id and title, then its facts.

    Args:
        header: The session's stored header.
        row: The session's ``dsh ls`` row (title, counts, lineage).
    """
    from rich.console import Group

    from dsh.cli._console import SafeText as Text

    title = Text(f"session {row.id}", style="bold")
    if row.title:
        title.append(f"  {row.title}")
    facts = [plural(row.events, "event"), plural(row.turns, "turn"),
             f"source {row.source_format}",
             f"created {format_ms(row.created_at_ms)} UTC",
             f"last activity {format_ms(row.last_activity_ms)} UTC" if row.timed
             else f"last activity {format_ms(row.last_activity_ms)} UTC (the file's time)"]
    if header.get("cwd"):
        facts.append(f"cwd {header['cwd']}")
    if row.parent_session:
        facts.append(row.lineage)
    return Group(title, Text(" · ".join(facts), style="dim"))


# -- search ----------------------------------------------------------------------------------

def hit_json(hit: SearchHit) -> dict[str, Any]:
    """A hit of ``dsh search --json``: session, seq, role, snippet and match, text escaped.

    Session text is untrusted: control characters and bidi overrides are shown as escapes
    (:func:`dsh.transcript.printable`) here too, so a program that prints a snippet is safe.
    """
    out = hit.to_json()
    out["snippet"] = printable(out["snippet"])
    out["match"] = printable(out["match"])
    return out


REMOVED_MARKS: Final = {"clear": "REMOVED from the model view (clear)",
                        "quarantine": "QUARANTINED (withheld from the model view)"}
"""What ``dsh search`` prints before a hit in a message that left the model view."""


def render_hits(hits: Sequence[SearchHit]) -> Group:
    """``dsh search``: one line per hit, ``ID  #SEQ  role  [MARK]  …before MATCH after…``.

    MARK (:data:`REMOVED_MARKS`) only for a hit in a message that left the model view.
    """
    from rich.console import Group

    from dsh.cli._console import SafeText as Text

    lines = []
    for hit in hits:
        line = Text(hit.session_id, style="bold")
        line.append(f"  #{hit.seq}", style="dim")
        line.append(f"  {hit.role}  ", style=_ROLE_STYLE.get(hit.role, "bold"))
        if hit.removed is not None:  # docs/stores.md#search: told apart from live text
            line.append(REMOVED_MARKS.get(hit.removed, "REMOVED") + "  ", style="bold red")
        line.append(hit.before)
        line.append(hit.match, style="bold reverse")
        line.append(hit.after)
        lines.append(line)
    return Group(*lines)


# -- verify and import -----------------------------------------------------------------------

def render_import_summary(imported: Sequence[tuple[str, str, str]],
                          skipped: Sequence[tuple[str, str]],
                          failed: Sequence[tuple[str, str, str, str]],
                          ignored: Sequence[tuple[str, str, str, str]] = (),
                          updated: Sequence[tuple[str, str, int]] = (),
                          superseded: Sequence[tuple[str, str, str]] = (),
                          completed: Sequence[tuple[str, str, int]] = (),
                          erased: Sequence[tuple[str, str]] = (), *,
                          counts: bool = True) -> Group:
    """Return the ``dsh import`` summary: one line per file, then the counts.

    Args:
        imported: ``(path, session id, format)`` per imported session.
        skipped: ``(path, session id)`` per session already in the store.
        failed: ``(path, reason, code, kind)`` per file that could not be imported (nothing
            was written); ``code`` and ``kind`` are the error's (:class:`ImportFormatError`).
        ignored: ``(path, reason, code, kind)`` per file found in a folder that is not a
            transcript.
        updated: ``(path, session id, events appended)`` per session whose source grew.
        superseded: ``(path, old id, new id)`` per source that changed where it was imported.
        completed: ``(path, session id, events appended)`` per session an interrupted import
            left half-written, now complete (docs/interop.md#staged-imports).
        erased: ``(path, session id)`` per source whose session was erased or purged, not
            imported again (docs/forgetting.md#erasure-and-import).
        counts: End with the counts line (``dsh import`` prints the lines of each file as it
            goes, then only the counts).
    """
    from rich.console import Group

    from dsh.cli._console import SafeText as Text

    parts: list[RenderableType] = []
    for path, session_id, count in updated:
        parts.append(Text.assemble(("updated   ", "green"),
                                   f"{session_id}  +{count} events (the source grew)  {path}"))
    for path, session_id, count in completed:
        parts.append(Text.assemble(("completed ", "green"),
                                   f"{session_id}  +{count} events: an interrupted import, "
                                   f"now complete and listed  {path}"))
    for path, old, new in superseded:
        parts.append(Text.assemble(("changed   ", "yellow"),
                                   f"{old}  its source differs from the stored session "
                                   f"(changed where it was imported, or continued both in "
                                   f"dsh and in the source); kept, and imported again as "
                                   f"{new}  {path}"))
    for path, session_id, fmt in imported:
        parts.append(Text.assemble(("imported  ", "green"), f"{session_id}  ({fmt})  {path}"))
    for path, session_id in skipped:
        parts.append(Text.assemble(("skipped   ", "dim"),
                                   f"{session_id}  already imported  {path}"))
    for path, session_id in erased:
        parts.append(Text.assemble(("skipped   ", "dim"),
                                   f"{session_id}  erased before, not imported again "
                                   f"(--include-erased imports it)  {path}"))
    for path, reason, _code, _kind in failed:
        # a reason that starts "path:line:" names the path already
        said = reason if reason.startswith(f"{path}:") else f"{path}: {reason}"
        parts.append(Text.assemble(("failed    ", "bold red"), said))
    for path, reason, _code, _kind in ignored:
        parts.append(Text.assemble(("ignored   ", "dim"), f"{path}: {reason}"))
    if counts:
        parts.append(render_import_counts(imported, skipped, failed, ignored, updated,
                                          completed, erased=erased))
    return Group(*parts)


def render_import_counts(imported: Sequence[Any], skipped: Sequence[Any], failed: Sequence[Any],
                         ignored: Sequence[Any] = (), updated: Sequence[Any] = (),
                         completed: Sequence[Any] = (), *, ignored_listed: bool = True,
                         erased: Sequence[Any] = ()) -> Text:
    """Return the last line of ``dsh import``: how many sessions each outcome had.

    ``ignored_listed`` False: the files that are not transcripts were counted, not listed
    (``dsh import`` without ``--verbose``), and the line says how to list them.
    """
    from dsh.cli._console import SafeText as Text

    line = (f"{len(imported)} imported, {len(skipped)} skipped (already imported), "
            f"{len(failed)} failed")
    if ignored:
        line += (f", {len(ignored)} ignored (not transcripts)" if ignored_listed else
                 f", {len(ignored)} ignored (not transcripts; --verbose lists them)")
    if updated:
        line += f", {len(updated)} updated (source grew)"
    if completed:
        line += f", {len(completed)} completed (interrupted imports)"
    if erased:
        line += f", {len(erased)} skipped (erased before)"
    return Text(line, style="bold")

"""Rendering for the `dsh` command: JSON output, session tables and human transcripts (rich).

Everything here is a pure function of already-loaded data (headers, events, rows): it reads no
store. Human output goes through :mod:`rich` (colour only when the stream is a terminal); user
text is always wrapped in :class:`rich.text.Text`, never parsed as markup. Machine output is JSON:
``--json`` documents through :func:`write_json`, raw logs through :func:`write_json_lines` (the
exact wire bytes of :func:`dsh.json.dumps`). rich is imported by the functions that use it
(~30 ms): ``dsh ls`` piped to a program prints its plain table without it (:func:`plain_stream`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any, Final

from dsh.json import dumps

if TYPE_CHECKING:
    from rich.console import Console, Group, RenderableType
    from rich.text import Text

    from dsh.persistence import ListingEntry

__all__ = [
    "COMPACT_PLUGIN",
    "REPAIR_CODES",
    "SessionRow",
    "TranscriptItem",
    "Violation",
    "format_ms",
    "make_console",
    "plain_stream",
    "plural",
    "print_text",
    "printable",
    "render_import_summary",
    "render_sessions_table",
    "render_transcript",
    "render_violations",
    "session_row",
    "transcript_items",
    "write_json",
    "write_json_lines",
]

COMPACT_PLUGIN: Final = "compact"
"""``source.plugin`` of a compaction checkpoint message (persistence spec §9.1)."""

REPAIR_CODES: Final = frozenset({"TOOL_OUTCOME_UNKNOWN", "TOOL_NOT_STARTED"})
"""``tool/result.data.error.code`` of a synthetic repair result (core spec §9.2)."""

_TOOL_RESULT_PREVIEW_LINES: Final = 12
"""Lines of a tool result (or checkpoint summary) ``dsh show`` prints without ``--full``."""


# -- output streams --------------------------------------------------------------------------

_PIPE_WIDTH: Final = 120
"""Layout width (characters) for tables when the output is not a terminal and ``COLUMNS`` is
unset (rich would otherwise squeeze tables into 80 columns)."""


# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional overrides and
# isolates ("Trojan Source"): a log holds text from models, tools and imported transcripts,
# and none of it may move the cursor, retitle the window or reorder what a person reads.
_UNPRINTABLE: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """Return ``text`` with terminal control characters shown as escapes (``\\x1b``).

    Tab and newline are kept; every other C0 control, DEL, the C1 controls and the Unicode
    bidirectional overrides are replaced by their ``\\xNN`` / ``\\uNNNN`` spelling, so session
    text can never drive the terminal it is printed on.
    """
    return _UNPRINTABLE.sub(_escape_char, text) if _UNPRINTABLE.search(text) else text


def make_console(*, stderr: bool = False) -> Console:
    """Return a rich console on stdout (or stderr) that colours only a terminal.

    ``soft_wrap`` keeps long lines whole when the output is piped; ``highlight`` is off so user
    text is never recoloured; control characters in text are printed as escapes
    (:func:`printable`). ``NO_COLOR`` and ``TERM=dumb`` are honoured by rich. Piped output
    is laid out 120 columns wide unless ``COLUMNS`` says otherwise.
    """
    from dsh.cli._console import SafeConsole

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
    if stream is not None and "\t" not in text and not _UNPRINTABLE.search(text):
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


def write_json(value: Any, *, stream: IO[bytes] | None = None, indent: int | None = 2) -> None:
    """Write one JSON document and a newline to stdout (binary).

    Lone surrogates (dsh allows them in strings) are written as ``\\udXXX`` escapes, so the
    output is valid UTF-8 and valid JSON.
    """
    text = json.dumps(_to_plain(value), ensure_ascii=False, indent=indent,
                      default=_to_plain)
    out = stream if stream is not None else sys.stdout.buffer
    out.write(text.encode("utf-8", errors="backslashreplace") + b"\n")
    out.flush()


def write_json_lines(values: Iterable[Any], *, stream: IO[bytes] | None = None) -> int:
    """Write each value as one compact JSON line in dsh's wire encoding; return the line count."""
    out = stream if stream is not None else sys.stdout.buffer
    count = 0
    for value in values:
        out.write(dumps(value) + b"\n")
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
            stamped every event with one time and said so in ``import/source``).
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

    @property
    def lineage(self) -> str:
        """``fork of <parent> @<seq>`` for a fork, else ``-``."""
        if self.parent_session is None:
            return "-"
        if self.seed_length:
            return f"fork of {self.parent_session} @{self.seed_length - 1}"
        return f"fork of {self.parent_session}"

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
        }


def _first_line(text: str) -> str:
    return " ".join(text.strip().split("\n", 1)[0].split())


def _message_text(content: Any) -> str:
    """Concatenate the ``text`` blocks of a content list (or a plain string)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(block["text"] for block in content
                     if isinstance(block, Mapping) and block.get("type") == "text"
                     and isinstance(block.get("text"), str))


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
    )


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def render_sessions_table(rows: Sequence[SessionRow], *, width: int | None = 120) -> str:
    """Return the ``dsh ls`` table as text: id, title, turns, events, activity, lineage, source.

    Plain columns, not a rich table: every column is always shown (rich drops columns it cannot
    fit). Ids, numbers, dates and lineage (it names a parent id) are never cut. On a terminal
    (``width`` its columns) the title takes the width left on the line, 12 to 48 characters,
    cut with an ellipsis; ``width=None`` (output piped to a program) prints every title whole.
    A narrow screen gets lines longer than the screen rather than missing data. A session
    whose source had no timestamps shows ``-`` as its last activity.
    """
    lineages = [r.lineage for r in rows]
    widths = {
        "ID": max([2, *(len(r.id) for r in rows)]),
        "TURNS": max([5, *(len(str(r.turns)) for r in rows)]),
        "EVENTS": max([6, *(len(str(r.events)) for r in rows)]),
        "LAST ACTIVITY (UTC)": 19,
        "LINEAGE": max([7, *(len(x) for x in lineages)]),
        "SOURCE": max([6, *(len(r.source_format) for r in rows)]),
    }
    fixed = sum(widths.values()) + 2 * 6
    longest = max([5, *(len(r.title or "-") for r in rows)])
    title_width = longest if width is None else max(12, min(48, longest, width - fixed))
    header = ["ID", "TITLE", "TURNS", "EVENTS", "LAST ACTIVITY (UTC)", "LINEAGE", "SOURCE"]
    cells = [header] + [[r.id, _cut(r.title or "-", title_width), str(r.turns), str(r.events),
                         format_ms(r.last_activity_ms if r.timed else None), lineage,
                         r.source_format]
                        for r, lineage in zip(rows, lineages, strict=True)]
    sizes = [widths["ID"], title_width, widths["TURNS"], widths["EVENTS"], 19,
             widths["LINEAGE"], widths["SOURCE"]]
    right = {2, 3}
    lines = []
    for row in cells:
        parts = [cell.rjust(size) if i in right else cell.ljust(size)
                 for i, (cell, size) in enumerate(zip(row, sizes, strict=True))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


# -- transcripts (dsh show) ------------------------------------------------------------------

TranscriptItem = dict[str, Any]
"""One entry of a transcript: ``{"kind": ..., "seq": ..., ...}`` (see :func:`transcript_items`)."""


def _blocks(content: Any) -> list[dict[str, Any]]:
    """Simplify content blocks for display: text/reasoning/tool-call/tool-result/image/other."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    out: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind in ("text", "reasoning"):
            out.append({"type": kind, "text": block.get("text", "")})
        elif kind == "tool-call":
            out.append({"type": "tool-call", "id": block.get("id"), "name": block.get("name"),
                        "arguments": block.get("arguments")})
        elif kind == "tool-result":
            out.append({"type": "tool-result", "toolCallId": block.get("toolCallId"),
                        "isError": block.get("isError") is True,
                        "text": _message_text(block.get("content")),
                        "blocks": _blocks(block.get("content"))})
        elif kind == "image":
            attachment = block.get("attachment")
            media = attachment.get("mediaType") if isinstance(attachment, Mapping) else None
            out.append({"type": "image", "mediaType": media})
        else:
            out.append({"type": str(kind)})
    return out


def _replace_range(op: Any) -> tuple[int, int] | None:
    if isinstance(op, Mapping) and op.get("op") == "replace":
        return int(op["start"]), int(op["end"])
    return None


def transcript_items(events: Sequence[Mapping[str, Any]]) -> list[TranscriptItem]:
    """Turn a log into transcript entries, in log order.

    Kinds: ``turn`` (a ``turn/start``), ``message`` (an append-origin surface event, ``role``
    user/assistant/tool/system, ``blocks``; tool results carry ``callId``, ``toolName``,
    ``isError`` and ``repair`` (the code of a crash-repair result) or ``synthetic`` (the error
    code of a result an importer supplied because the transcript recorded none); assistant messages
    ``interrupted``), ``checkpoint`` (a compaction replacement: ``replaces`` [start, end] seqs,
    ``shadowedSeqs``, ``summary`` text), ``replacement`` (any other replace, e.g. a pruned tool
    result), ``turn-end`` (only when the reason is not ``completed``: ``reason``, and
    ``repaired`` for ``interrupted``), ``fork`` (an inherited ``session/end-seed``),
    ``compaction-failed`` (a ``compaction/end`` with ``error``) and ``open-turn`` (the log ends
    inside a turn: it needs ``dsh resume``).

    Args:
        events: Committed events (wire objects) in seq order.
    Rule: append-origin surface events are the transcript (core spec §7.1 ``isAppendSurfaceEvent``).
    """
    items: list[TranscriptItem] = []
    tool_names: dict[str, str] = {}
    open_turn: int | None = None
    for event in events:
        kind = event["type"]
        seq = event["seq"]
        data = event.get("data")
        data = data if isinstance(data, Mapping) else {}
        op = event.get("surfaceOp")
        if kind == "turn/start":
            open_turn = data.get("turn")
            items.append({"kind": "turn", "seq": seq, "turn": open_turn, "time": event["time"]})
        elif kind == "turn/end":
            open_turn = None
            reason = data.get("reason")
            reason_kind = reason.get("kind") if isinstance(reason, Mapping) else None
            if reason_kind != "completed":
                item: TranscriptItem = {"kind": "turn-end", "seq": seq, "turn": data.get("turn"),
                                        "reason": reason_kind}
                if reason_kind == "error" and isinstance(reason, Mapping):
                    error = reason.get("error")
                    if isinstance(error, Mapping):
                        item["error"] = error.get("message")
                if reason_kind == "aborted" and isinstance(reason, Mapping):
                    cause = reason.get("reason")
                    if isinstance(cause, Mapping):
                        item["cause"] = cause.get("kind")
                item["repaired"] = reason_kind in ("interrupted", "forked")
                items.append(item)
        elif kind == "tool/call":
            tool_names[str(data.get("callId"))] = str(data.get("name"))
        elif kind == "session/end-seed" and data.get("inherited") is True:
            items.append({"kind": "fork", "seq": seq, "inheritedEvents": seq})
        elif kind == "compaction/end" and data.get("error") is not None:
            items.append({"kind": "compaction-failed", "seq": seq,
                          "error": str(data.get("error"))})
        elif kind in ("user/message", "assistant/message", "tool/result", "system/message"):
            replaced = _replace_range(op)
            if replaced is not None:
                items.append(_replacement_item(event, data, replaced))
            elif op == "append":
                items.append(_message_item(event, data, tool_names))
    if open_turn is not None:
        items.append({"kind": "open-turn", "seq": events[-1]["seq"], "turn": open_turn})
    return items


def _message_item(event: Mapping[str, Any], data: Mapping[str, Any],
                  tool_names: dict[str, str]) -> TranscriptItem:
    kind = event["type"]
    message = data if kind in ("user/message", "system/message") else data.get("message")
    message = message if isinstance(message, Mapping) else {}
    role = {"assistant/message": "assistant", "tool/result": "tool",
            "system/message": "system"}.get(kind, "user")
    blocks = _blocks(message.get("content"))
    item: TranscriptItem = {"kind": "message", "seq": event["seq"], "role": role,
                            "blocks": blocks}
    source = message.get("source")
    if isinstance(source, Mapping) and source.get("kind") not in (None, "user", "tool", "model"):
        # Injected context (a plugin, an importer, a subagent report): say who put it there.
        plugin = source.get("plugin")
        item["source"] = f"{source.get('kind')} {plugin}" if plugin else source.get("kind")
    if kind == "assistant/message":
        for block in blocks:
            if block["type"] == "tool-call":
                tool_names.setdefault(str(block["id"]), str(block["name"]))
        if isinstance(source, Mapping) and source.get("model"):
            item["model"] = f"{source.get('provider')}/{source.get('model')}"
        if data.get("interrupted") is True:
            item["interrupted"] = True
    elif kind == "tool/result":
        call_id = source.get("callId") if isinstance(source, Mapping) else None
        result = next((b for b in blocks if b["type"] == "tool-result"), None)
        item["callId"] = call_id
        item["toolName"] = tool_names.get(str(call_id))
        item["isError"] = bool(result and result["isError"])
        error = data.get("error")
        code = error.get("code") if isinstance(error, Mapping) else None
        meta = data.get("meta")
        imported = meta.get("import") if isinstance(meta, Mapping) else None
        if isinstance(imported, Mapping) and imported.get("synthetic") is True:
            # The importer supplied this result: the transcript recorded none (or an abort).
            item["synthetic"] = code if isinstance(code, str) else "IMPORTED"
        elif code in REPAIR_CODES:
            item["repair"] = code
    return item


def _replacement_item(event: Mapping[str, Any], data: Mapping[str, Any],
                      replaced: tuple[int, int]) -> TranscriptItem:
    kind = event["type"]
    message = data if kind in ("user/message", "system/message") else data.get("message")
    message = message if isinstance(message, Mapping) else {}
    source = message.get("source")
    shadowed = event.get("sourceEventSeqs")
    is_checkpoint = (isinstance(source, Mapping) and source.get("kind") == "plugin"
                     and source.get("plugin") == COMPACT_PLUGIN)
    if is_checkpoint:
        text = _message_text(message.get("content"))
        start, _, rest = text.partition("<compacted-summary>")
        summary = rest.partition("</compacted-summary>")[0] if rest else start
        # sourceEventSeqs = [compaction/start, compaction/summary, *shadowed] (spec §9.2).
        shadowed_seqs = list(shadowed[2:]) if isinstance(shadowed, list) else []
        return {"kind": "checkpoint", "seq": event["seq"], "replaces": list(replaced),
                "shadowedSeqs": shadowed_seqs, "summary": summary.strip("\n")}
    what = "pruned tool result" if kind == "tool/result" else f"replacement {kind}"
    return {"kind": "replacement", "seq": event["seq"], "replaces": list(replaced),
            "what": what, "blocks": _blocks(message.get("content"))}


_ROLE_STYLE: Final = {"user": "bold green", "assistant": "bold blue", "tool": "bold magenta",
                      "system": "bold yellow"}


def _clip(text: str, full: bool, limit: int = _TOOL_RESULT_PREVIEW_LINES) -> str:
    lines = text.rstrip("\n").split("\n")
    if full or len(lines) <= limit:
        return "\n".join(lines)
    more = plural(len(lines) - limit, "more line")
    return "\n".join([*lines[:limit], f"… ({more}; --full shows all)"])


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.split("\n"))


def _render_blocks(blocks: Sequence[Mapping[str, Any]], full: bool, *,
                   clip_text: bool) -> Iterator[Text]:
    from rich.text import Text

    for block in blocks:
        kind = block["type"]
        if kind == "text":
            body = _clip(block["text"], full) if clip_text else block["text"].rstrip("\n")
            yield Text(_indent(body))
        elif kind == "reasoning":
            yield Text(_indent("(reasoning) " + _clip(block["text"], full)), style="dim italic")
        elif kind == "tool-call":
            line = Text("  → ", style="magenta")
            line.append(str(block["name"]), style="bold magenta")
            line.append(" " + _clip(str(block.get("arguments") or ""), full, 3), style="magenta")
            line.append(f"  [{block['id']}]", style="dim")
            yield line
        elif kind == "tool-result":
            yield Text(_indent(_clip(block["text"], full), "  │ "),
                       style="red" if block["isError"] else "")
        elif kind == "image":
            yield Text(f"  [image {block.get('mediaType') or '?'}]", style="dim")
        else:
            yield Text(f"  [{kind} block]", style="dim")


def _render_item(item: TranscriptItem, full: bool) -> Iterator[RenderableType]:
    from rich.text import Text

    kind = item["kind"]
    seq = item["seq"]
    if kind == "turn":
        yield Text(f"── turn {item['turn']} ", style="bold").append("─" * 40, style="dim")
    elif kind == "message":
        role = item["role"]
        head = Text(role, style=_ROLE_STYLE.get(role, "bold"))
        head.append(f"  #{seq}", style="dim")
        if role == "tool":
            head.append(f"  {item.get('toolName') or 'tool'} [{item.get('callId')}]")
            if item.get("synthetic"):
                head.append(f"  SUPPLIED BY IMPORT ({item['synthetic']}: the transcript has "
                            "no result)", style="bold yellow")
            elif item.get("repair"):
                head.append(f"  REPAIRED ({item['repair']})", style="bold yellow")
            elif item.get("isError"):
                head.append("  error", style="bold red")
        if item.get("model"):
            head.append(f"  {item['model']}", style="dim")
        if item.get("source"):
            head.append(f"  ({item['source']})", style="dim")
        if item.get("interrupted"):
            head.append("  INTERRUPTED (partial output)", style="bold yellow")
        yield head
        yield from _render_blocks(item["blocks"], full, clip_text=role == "tool")
    elif kind == "checkpoint":
        start, end = item["replaces"]
        yield Text(f"⟲ compaction checkpoint  #{seq}  replaces #{start}–#{end} "
                   f"({plural(len(item['shadowedSeqs']), 'message')})", style="bold cyan")
        yield Text(_indent(_clip(item["summary"], full)), style="cyan")
    elif kind == "replacement":
        start, end = item["replaces"]
        span = f"#{start}" if start == end else f"#{start}–#{end}"
        yield Text(f"✂ {item['what']}  #{seq}  replaces {span}", style="bold cyan")
    elif kind == "turn-end":
        reason = item["reason"]
        if reason == "interrupted":
            text = f"⚠ turn {item['turn']} interrupted; closed by crash repair  #{seq}"
        elif reason == "forked":
            text = f"⚠ turn {item['turn']} was open at the fork cut; closed in this fork  #{seq}"
        elif reason == "aborted":
            text = f"⚠ turn {item['turn']} aborted ({item.get('cause') or 'unknown'})  #{seq}"
        elif reason == "error":
            text = f"⚠ turn {item['turn']} failed: {item.get('error') or 'error'}  #{seq}"
        else:
            text = f"⚠ turn {item['turn']} ended: {reason}  #{seq}"
        yield Text(text, style="bold yellow")
    elif kind == "fork":
        yield Text(f"── forked here: events #0–#{seq - 1} are inherited from the parent "
                   f"(end-seed #{seq}) ──", style="bold cyan")
    elif kind == "compaction-failed":
        yield Text(f"⚠ compaction failed  #{seq}: {item['error']}", style="bold yellow")
    elif kind == "open-turn":
        yield Text(f"⚠ turn {item['turn']} is still open: the log ends mid-turn (last #{seq}); "
                   "`dsh resume` closes it", style="bold yellow")


def render_transcript(header: Mapping[str, Any], items: Sequence[TranscriptItem], *,
                      row: SessionRow, full: bool = False) -> Group:
    """Return the human transcript of ``dsh show``: a header block, then each item.

    Tool results and checkpoint summaries are clipped to 12 lines unless ``full``.
    """
    from rich.console import Group
    from rich.text import Text

    parts: list[RenderableType] = []
    title = Text(f"session {row.id}", style="bold")
    if row.title:
        title.append(f"  {row.title}")
    parts.append(title)
    facts = [plural(row.events, "event"), plural(row.turns, "turn"),
             f"source {row.source_format}",
             f"created {format_ms(row.created_at_ms)} UTC",
             f"last activity {format_ms(row.last_activity_ms)} UTC"]
    if header.get("cwd"):
        facts.append(f"cwd {header['cwd']}")
    if row.parent_session:
        facts.append(row.lineage)
    parts.append(Text(" · ".join(facts), style="dim"))
    for item in items:
        parts.extend(_render_item(item, full))
    return Group(*parts)


# -- verify and import -----------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class Violation:
    """One problem ``dsh verify`` found: session, seq (None when not tied to one), rule, message."""

    session_id: str
    seq: int | None
    rule: str
    message: str

    def to_json(self) -> dict[str, Any]:
        """``{"session", "seq", "rule", "message"}`` for ``--json``."""
        return {"session": self.session_id, "seq": self.seq, "rule": self.rule,
                "message": self.message}

    def line(self) -> str:
        """``<session> seq <N> <RULE>: <message>`` (``seq -`` when there is no seq)."""
        seq = "-" if self.seq is None else str(self.seq)
        message = " ".join(self.message.split())
        return f"{self.session_id} seq {seq} {self.rule}: {message}"


def render_violations(violations: Sequence[Violation]) -> Text:
    """Return one line per violation, in the order found."""
    from rich.text import Text

    return Text("\n".join(v.line() for v in violations))


def render_import_summary(imported: Sequence[tuple[str, str, str]],
                          skipped: Sequence[tuple[str, str]],
                          failed: Sequence[tuple[str, str]],
                          ignored: Sequence[tuple[str, str]] = (),
                          updated: Sequence[tuple[str, str, int]] = (),
                          superseded: Sequence[tuple[str, str, str]] = (), *,
                          counts: bool = True) -> Group:
    """Return the ``dsh import`` summary: one line per file, then the counts.

    Args:
        imported: ``(path, session id, format)`` per imported session.
        skipped: ``(path, session id)`` per session already in the store.
        failed: ``(path, reason)`` per file that could not be imported (nothing was written).
        ignored: ``(path, reason)`` per file found in a folder that is not a transcript.
        updated: ``(path, session id, events appended)`` per session whose source grew.
        superseded: ``(path, old id, new id)`` per source that changed where it was imported.
        counts: End with the counts line (``dsh import`` prints the lines of each file as it
            goes, then only the counts).
    """
    from rich.console import Group
    from rich.text import Text

    parts: list[RenderableType] = []
    for path, session_id, count in updated:
        parts.append(Text.assemble(("updated   ", "green"),
                                   f"{session_id}  +{count} events (the source grew)  {path}"))
    for path, old, new in superseded:
        parts.append(Text.assemble(("changed   ", "yellow"),
                                   f"{old}  its source changed where it was imported; "
                                   f"kept, and imported again as {new}  {path}"))
    for path, session_id, fmt in imported:
        parts.append(Text.assemble(("imported  ", "green"), f"{session_id}  ({fmt})  {path}"))
    for path, session_id in skipped:
        parts.append(Text.assemble(("skipped   ", "dim"),
                                   f"{session_id}  already imported  {path}"))
    for path, reason in failed:
        parts.append(Text.assemble(("failed    ", "bold red"), f"{path}: {reason}"))
    for path, reason in ignored:
        parts.append(Text.assemble(("ignored   ", "dim"), f"{path}: {reason}"))
    if counts:
        parts.append(render_import_counts(imported, skipped, failed, ignored, updated))
    return Group(*parts)


def render_import_counts(imported: Sequence[Any], skipped: Sequence[Any], failed: Sequence[Any],
                         ignored: Sequence[Any] = (), updated: Sequence[Any] = ()) -> Text:
    """Return the last line of ``dsh import``: how many sessions each outcome had."""
    from rich.text import Text

    line = (f"{len(imported)} imported, {len(skipped)} skipped (already imported), "
            f"{len(failed)} failed")
    if ignored:
        line += f", {len(ignored)} ignored (not transcripts)"
    if updated:
        line += f", {len(updated)} updated (source grew)"
    return Text(line, style="bold")

"""``dsh export --format markdown|html``: the human transcript as a document to keep or share.

Both are rendered from :mod:`dsh.transcript` (the model ``dsh show`` prints), entry by entry,
in log order: a heading per turn, each message with its role and model, tool calls with their
arguments, tool results (marked when in error, repaired or cut off), checkpoints, replacements
(a clear's removal and a quarantine placeholder marked as ``dsh show`` marks them), fork cuts
and how each turn ended. Session text is untrusted (docs/view.md#safety): Markdown puts it in
fenced blocks whose fence is longer than any backtick run inside, with control characters
shown as escapes; HTML escapes every piece of it and carries no script.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

from dsh.cli import _render as render
from dsh.transcript import (
    Block,
    Checkpoint,
    Entry,
    ForkCut,
    ImageBlock,
    Message,
    OpenTurn,
    ReasoningBlock,
    Replacement,
    TextBlock,
    ToolCallBlock,
    ToolResult,
    ToolResultBlock,
    TurnEnd,
    TurnStart,
    printable,
)

_CSS: Final = (
    "body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;"
    "color:#222}h1{font-size:1.3rem}h2{font-size:1.1rem;border-top:1px solid #ccc;"
    "padding-top:.6rem}.meta{color:#666;font-size:.9rem}.entry{margin:.8rem 0}"
    ".role{font-weight:600}.seq{color:#888;font-size:.85rem}pre{white-space:pre-wrap;"
    "background:#f6f6f6;padding:.5rem;border-radius:4px;margin:.3rem 0}"
    ".warn{color:#a15c00;font-weight:600}.reasoning{color:#666;font-style:italic}")


def _line(entry: Entry) -> tuple[str, str | None]:
    """The entry's one-line head (plain text) and its warning, if any."""
    seq = entry.seq
    if isinstance(entry, Message):
        head = f"{entry.role} #{seq}" + (f" · {entry.model}" if entry.model else "") + (
            f" · ({entry.origin})" if entry.origin else "")
        warn = ("cut off: streamed when the process stopped, never recorded as a reply"
                if entry.cut_off else "interrupted (partial output)" if entry.interrupted
                else None)
        return head, warn
    if isinstance(entry, ToolResult):
        head = f"tool #{seq} · {entry.tool_name or '?'} [{entry.call_id or '?'}]"
        if entry.repair:
            return head, f"repaired ({entry.error_code})"
        if entry.is_error:
            return head, "error" + (f" ({entry.error_code})" if entry.error_code else "")
        return head, None
    if isinstance(entry, Checkpoint):
        start, end = entry.replaces
        return f"compaction checkpoint #{seq} · replaces #{start}–#{end}", None
    if isinstance(entry, Replacement):
        # what dsh show says of it: a removal or a quarantine is marked as such
        # (docs/adapters.md#cleared-means-cleared, docs/forgetting.md#quarantine)
        start, end = entry.replaces
        span = f"#{start}" if start == end else f"#{start}–#{end}"
        return f"{entry.what} #{seq} · replaces {span}", None
    if isinstance(entry, TurnEnd):
        what = entry.reason or "ended"
        if entry.repaired:
            return f"turn {entry.turn} {what} #{seq}", "closed by crash repair"
        return f"turn {entry.turn} {what} #{seq}", entry.error or entry.cause
    if isinstance(entry, ForkCut):
        return f"fork point #{seq} · {entry.inherited_events} events inherited", None
    if isinstance(entry, OpenTurn):
        return f"turn {entry.turn} is still open: the log ends mid-turn (last #{seq})", None
    return f"{entry.kind} #{seq}", None


def _texts(blocks: Sequence[Block]) -> Iterator[tuple[str, str]]:
    """``(style, text)`` per block: text, reasoning, a tool call, a result, an image."""
    for block in blocks:
        if isinstance(block, TextBlock):
            yield "text", block.text
        elif isinstance(block, ReasoningBlock):
            yield "reasoning", block.text
        elif isinstance(block, ToolCallBlock):
            arguments = block.arguments if isinstance(block.arguments, str) else json.dumps(
                block.arguments, ensure_ascii=False)
            yield "call", f"→ {block.name or '?'} {arguments}  [{block.id or '?'}]"
        elif isinstance(block, ToolResultBlock):
            yield "text", block.text
        elif isinstance(block, ImageBlock):
            yield "text", f"[image {block.media_type or ''}]".replace(" ]", "]")
        else:
            yield "text", f"[{getattr(block, 'type', block.kind)} block]"


def _body(entry: Entry) -> list[tuple[str, str]]:
    if isinstance(entry, Message | ToolResult):
        return list(_texts(entry.blocks))
    if isinstance(entry, Checkpoint):
        return [("text", entry.summary)]
    return []


def _fence(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def to_markdown(header: Mapping[str, Any], entries: Sequence[Entry],
                row: render.SessionRow) -> str:
    """The transcript as Markdown: session text in fenced blocks, heads as plain lines."""
    out = [f"# Session {_md_inline(row.id)}", ""]
    if row.title:
        out += [f"**{_md_inline(row.title)}**", ""]
    out += [" · ".join(_facts(header, row, _md_inline)), ""]
    for entry in entries:
        if isinstance(entry, TurnStart):
            out += [f"## Turn {entry.turn}", ""]
            continue
        head, warn = _line(entry)
        out.append(f"**{_md_inline(head)}**" + (f" — *{_md_inline(warn)}*" if warn else ""))
        out.append("")
        for style, text in _body(entry):
            shown = printable(text.rstrip("\n"))
            fence = _fence(shown)
            out += [f"{fence}{'text' if style != 'reasoning' else 'reasoning'}", shown, fence, ""]
    return "\n".join(out).rstrip("\n") + "\n"


def _facts(header: Mapping[str, Any], row: render.SessionRow,
           session_text: Callable[[str], str]) -> list[str]:
    """The session's head line pieces; ``session_text`` makes cwd and lineage safe to embed."""
    facts = [render.plural(row.events, "event"), render.plural(row.turns, "turn"),
             f"source {row.source_format}",
             f"created {render.format_ms(row.created_at_ms)} UTC",
             f"last activity {render.format_ms(row.last_activity_ms)} UTC"]
    if header.get("cwd"):
        facts.append(f"cwd {session_text(str(header['cwd']))}")
    if row.parent_session:
        facts.append(session_text(row.lineage))
    return facts


def _md_inline(text: str) -> str:
    """One line of untrusted text safe inside Markdown emphasis (no markup, no HTML).

    Runs of spaces are one space (:func:`~dsh.cli._render.one_line`); control characters are
    shown as escapes, never taken for spaces (docs/cli.md#output).
    """
    shown = printable(render.one_line(text))
    return re.sub(r"([\\`*_\[\]<>|~&])", r"\\\1", shown)


def to_html(header: Mapping[str, Any], entries: Sequence[Entry],
            row: render.SessionRow) -> str:
    """The transcript as one self-contained HTML page: every piece of session text escaped."""
    def esc(text: str) -> str:
        return html.escape(printable(text), quote=True)

    title = f"Session {row.id}" + (f" — {row.title}" if row.title else "")
    facts = _facts(header, row, str)
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>",
           f"<h1>{esc(title)}</h1>", f'<p class="meta">{esc(" · ".join(facts))}</p>']
    for entry in entries:
        if isinstance(entry, TurnStart):
            out.append(f"<h2>Turn {esc(str(entry.turn))}</h2>")
            continue
        head, warn = _line(entry)
        parts = [f'<div class="entry"><div><span class="role">{esc(head)}</span>']
        if warn:
            parts.append(f' <span class="warn">{esc(warn)}</span>')
        parts.append("</div>")
        for style, text in _body(entry):
            css = ' class="reasoning"' if style == "reasoning" else ""
            parts.append(f"<pre{css}>{esc(text.rstrip(chr(10)))}</pre>")
        parts.append("</div>")
        out.append("".join(parts))
    out.append("</body></html>")
    return "\n".join(out) + "\n"

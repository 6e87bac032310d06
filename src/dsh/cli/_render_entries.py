"""How ``dsh show`` renders a transcript's entries (rich), and which entries it prints.

Messages, tool calls and results, checkpoints, replacements, repairs and the effect entries.

Split from :mod:`dsh.cli._render` so that only the commands that render a transcript (``dsh
show``, chat's ``/show``, ``dsh export --format markdown|html``) load :mod:`dsh.transcript`:
its dataclasses' generated methods are compiled when it is imported (~50 ms of every start).
The entry types are module globals here, so the per-entry functions look them up as before.
User text is always wrapped in :class:`rich.text.Text`, never parsed as markup.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final

from dsh.cli._render import _ROLE_STYLE, SessionRow, format_ms, plural, render_show_head
from dsh.transcript import (
    SHOW_KINDS,
    ApprovalAnswer,
    ApprovalAsked,
    Block,
    Checkpoint,
    CompactionFailed,
    Entry,
    ForkCut,
    ImageBlock,
    InvalidEvent,
    Message,
    OpenTurn,
    ReasoningBlock,
    Recovery,
    Replacement,
    TextBlock,
    ToolCallBlock,
    ToolResult,
    ToolResultBlock,
    Transcript,
    TurnEnd,
    TurnStart,
)

if TYPE_CHECKING:
    from rich.console import Group, RenderableType
    from rich.text import Text


_TOOL_RESULT_PREVIEW_LINES: Final = 12
"""Lines of a tool result (or checkpoint summary) ``dsh show`` prints without ``--full``."""


def show_entries(transcript: Transcript) -> list[Entry]:
    """The entries ``dsh show`` prints, in log order.

    Those of :data:`dsh.transcript.SHOW_KINDS`, less the turn ends whose reason is ``completed``.
    """
    return [entry for entry in transcript.entries if shown(entry)]


_MORE_HINT: ContextVar[str] = ContextVar("dsh_more_hint", default="--full shows all")
"""What a clipped block says shows the rest (``dsh show``'s ``--full``, chat's ``/show full``)."""


def _clip(text: str, full: bool, limit: int = _TOOL_RESULT_PREVIEW_LINES) -> str:
    lines = text.rstrip("\n").split("\n")
    if full or len(lines) <= limit:
        return "\n".join(lines)
    more = plural(len(lines) - limit, "more line")
    return "\n".join([*lines[:limit], f"… ({more}; {_MORE_HINT.get()})"])


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.split("\n"))


def _render_blocks(blocks: Sequence[Block], full: bool, *, clip_text: bool) -> Iterator[Text]:
    from dsh.cli._console import SafeText as Text

    for block in blocks:
        if isinstance(block, TextBlock):
            body = _clip(block.text, full) if clip_text else block.text.rstrip("\n")
            yield Text(_indent(body))
        elif isinstance(block, ReasoningBlock):
            yield Text(_indent("(reasoning) " + _clip(block.text, full)), style="dim italic")
        elif isinstance(block, ToolCallBlock):
            line = Text("  → ", style="magenta")
            line.append(str(block.name), style="bold magenta")
            line.append(" " + _clip(str(block.arguments or ""), full, 3), style="magenta")
            line.append(f"  [{block.id}]", style="dim")
            yield line
        elif isinstance(block, ToolResultBlock):
            yield Text(_indent(_clip(block.text, full), "  │ "),
                       style="red" if block.is_error else "")
        elif isinstance(block, ImageBlock):
            yield Text(f"  [image {block.media_type or '?'}]", style="dim")
        else:
            yield Text(f"  [{block.type} block]", style="dim")


def _cache_note(usage: Mapping[str, Any] | None, share: float | None) -> str:
    """``cache 93% of 12.3k input tokens`` for a request's usage, or '' without one."""
    if share is None or usage is None:
        return ""
    total = sum(v for k, v in usage.items() if type(v) is int
                and k in ("inputTokens", "cacheReadTokens", "cacheWriteTokens"))
    size = f"{total / 1000:.1f}k" if total >= 1000 else str(total)
    return f"cache {share:.0%} of {size} input tokens"


def _render_entry(entry: Entry, full: bool) -> Iterator[RenderableType]:
    from dsh.cli._console import SafeText as Text

    seq = entry.seq
    if isinstance(entry, TurnStart):
        yield Text(f"── turn {entry.turn} ", style="bold").append("─" * 40, style="dim")
    elif isinstance(entry, Message | ToolResult):
        role = "tool" if isinstance(entry, ToolResult) else entry.role
        head = Text(role, style=_ROLE_STYLE.get(role, "bold"))
        head.append(f"  #{seq}", style="dim")
        if isinstance(entry, ToolResult):
            head.append(f"  {entry.tool_name or 'tool'} [{entry.call_id}]")
            if entry.synthetic:
                head.append(f"  SUPPLIED BY IMPORT ({entry.synthetic}: the transcript has "
                            "no result)", style="bold yellow")
            elif entry.repair:
                head.append(f"  REPAIRED ({entry.repair})", style="bold yellow")
            elif entry.is_error:
                head.append("  error", style="bold red")
        else:
            if entry.model:
                head.append(f"  {entry.model}", style="dim")
            cache = _cache_note(entry.usage, entry.cached_share)
            if cache:
                head.append(f"  {cache}", style="dim")
        origin = entry.origin if isinstance(entry, Message) else None
        if origin:
            head.append(f"  ({origin})", style="dim")
        if isinstance(entry, Message) and entry.interrupted:
            head.append("  INTERRUPTED (partial output)", style="bold yellow")
        if isinstance(entry, Message) and entry.cut_off:
            head.append("  CUT OFF (streamed when the process stopped; never recorded as a "
                        "reply, the model did not see it)", style="bold yellow")
        yield head
        yield from _render_blocks(entry.blocks, full, clip_text=role == "tool")
    elif isinstance(entry, Checkpoint):
        start, end = entry.replaces
        yield Text(f"⟲ compaction checkpoint  #{seq}  replaces #{start}–#{end} "
                   f"({plural(len(entry.shadowed_seqs), 'message')})", style="bold cyan")
        cache = _cache_note(entry.summary_usage, entry.summary_cached_share)
        if cache:
            yield Text(f"  summary request: {cache}", style="dim cyan")
        yield Text(_indent(_clip(entry.summary, full)), style="cyan")
    elif isinstance(entry, Replacement):
        start, end = entry.replaces
        span = f"#{start}" if start == end else f"#{start}–#{end}"
        yield Text(f"✂ {entry.what}  #{seq}  replaces {span}", style="bold cyan")
        if entry.what == "rewritten tool result":
            yield from _render_blocks(entry.blocks, full, clip_text=True)
    elif isinstance(entry, TurnEnd):
        reason = entry.reason
        if reason == "interrupted":
            text = f"⚠ turn {entry.turn} interrupted; closed by crash repair  #{seq}"
        elif reason == "forked":
            text = f"⚠ turn {entry.turn} was open at the fork cut; closed in this fork  #{seq}"
        elif reason == "aborted":
            text = f"⚠ turn {entry.turn} aborted ({entry.cause or 'unknown'})  #{seq}"
        elif reason == "error":
            text = f"⚠ turn {entry.turn} failed: {entry.error or 'error'}  #{seq}"
        else:
            text = f"⚠ turn {entry.turn} ended: {reason}  #{seq}"
        yield Text(text, style="bold yellow")
    elif isinstance(entry, ForkCut):
        yield Text(f"── forked here: events #0–#{seq - 1} are inherited from the parent "
                   f"(end-seed #{seq}) ──", style="bold cyan")
    elif isinstance(entry, CompactionFailed):
        yield Text(f"⚠ compaction failed  #{seq}: {entry.error}", style="bold yellow")
    elif isinstance(entry, InvalidEvent):
        yield Text(f"✗ invalid event  #{seq}  {entry.type}  {entry.code}: {entry.problem}",
                   style="bold red")
    elif isinstance(entry, OpenTurn):
        yield Text(f"⚠ turn {entry.turn} is still open: the log ends mid-turn (last #{seq}); "
                   "`dsh resume` closes it", style="bold yellow")
    else:
        yield from _render_effect(entry, full)


def _render_effect(entry: Entry, full: bool) -> Iterator[RenderableType]:
    """The effect entries (docs/effects.md): approvals, answers, resume decisions."""
    from dsh.cli._console import SafeText as Text

    seq = entry.seq
    if isinstance(entry, ApprovalAsked):
        why = "in doubt after a crash: yes runs it again" if entry.reason == "in-doubt" \
            else "needs a person's yes"
        until = f"until {format_ms(entry.deadline)} UTC" if entry.deadline else ""
        yield Text(f"? approval asked  #{seq}  {entry.tool_name} [{entry.call_id}]  {why}; "
                   f"dsh approve / dsh deny {entry.call_id} {until}".rstrip(),
                   style="bold yellow")
    elif isinstance(entry, ApprovalAnswer):
        note = f": {entry.note}" if entry.note else ""
        yield Text(f"✓ approval {entry.decision} by {entry.by}  #{seq}  [{entry.call_id}]{note}",
                   style="bold green" if entry.decision == "approved" else "bold yellow")
    elif isinstance(entry, Recovery):
        what = {"run": f"ran it again (attempt {entry.attempt})",
                "reconcile": "asked the tool whether it took effect",
                "in-doubt": "left it in doubt and asked a person",
                "not-started": "left it: it never started",
                "deny": "told the model it was denied"}.get(str(entry.decision),
                                                           str(entry.decision))
        if entry.cause == "approval" and entry.decision == "run" and entry.attempt == 1:
            what = "ran it after the approval"
        reason = f" ({entry.reason})" if entry.reason else ""
        yield Text(f"↻ resume decided  #{seq}  {entry.tool_name} [{entry.call_id}] "
                   f"{entry.effect}: {what}{reason}", style="bold cyan")


def render_entries(entries: Iterable[Entry], *, full: bool = False) -> Group:
    """The renderables of ``entries`` (a batch of :func:`show_entries`), for one print."""
    from rich.console import Group

    parts: list[RenderableType] = []
    for entry in entries:
        parts.extend(_render_entry(entry, full))
    return Group(*parts)


def render_transcript(header: Mapping[str, Any], entries: Sequence[Entry], *,
                      row: SessionRow, full: bool = False,
                      more_hint: str = "--full shows all") -> Group:
    """Return the human transcript of ``dsh show``: a header block, then each entry.

    Args:
        header: The session's stored header.
        entries: The entries to print (:func:`show_entries` of the session's transcript).
        row: The session's ``dsh ls`` row (title, counts, lineage).
        full: Print tool results and checkpoint summaries whole (else 12 lines each).
        more_hint: What a clipped block says shows the rest (chat: ``/show full``).
    """
    token = _MORE_HINT.set(more_hint)
    try:
        return _render_transcript(header, entries, row=row, full=full)
    finally:
        _MORE_HINT.reset(token)


def _render_transcript(header: Mapping[str, Any], entries: Sequence[Entry], *,
                       row: SessionRow, full: bool) -> Group:
    from rich.console import Group

    return Group(render_show_head(header, row), render_entries(entries, full=full))


def shown(entry: Entry) -> bool:
    """Whether ``dsh show`` prints ``entry`` (the rule of :func:`show_entries`)."""
    return entry.kind in SHOW_KINDS and not (isinstance(entry, TurnEnd)
                                             and entry.reason == "completed")


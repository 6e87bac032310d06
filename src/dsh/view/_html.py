"""HTML for the viewer: templates, and the filters that keep session text inert.

Session text is untrusted (models, tools and imported transcripts wrote it). Every value reaches
the page through Jinja2 with autoescaping on, after :func:`dsh.transcript.printable` has shown
control characters and bidi overrides as escapes; nothing from a log is ever put in an
attribute that runs code (there is no inline script or style at all: the page's
Content-Security-Policy forbids them), and links are built here from ids and seqs, never taken
from session text. Long text is clipped: a 10 MB line is sent only when asked for.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import quote, urlencode

import jinja2
import markupsafe

from dsh.json import thaw
from dsh.transcript import printable

CLIP_CHARS: Final = 4000
"""Characters of one text shown before "show all"."""

CLIP_LINES: Final = 40
"""Lines of one text shown before "show all"."""

CLIP_BLOCKS: Final = 40
"""Blocks of one message shown before "show all" (an imported message may hold 100,000)."""

_IMAGE_TYPES: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


@dataclass(frozen=True, slots=True)
class Clip:
    """A text cut for display: what is shown, and how much is not."""

    shown: str
    hidden_lines: int
    hidden_chars: int

    @property
    def clipped(self) -> bool:
        """True when part of the text is not shown."""
        return self.hidden_chars > 0


def clip(text: object, lines: int = CLIP_LINES, chars: int = CLIP_CHARS) -> Clip:
    """Cut ``text`` to ``lines`` lines and ``chars`` characters (whichever is shorter)."""
    value = text if isinstance(text, str) else ("" if text is None else str(text))
    value = value.rstrip("\n")
    shown = value[:chars]
    parts = shown.split("\n")
    if len(parts) > lines:
        shown = "\n".join(parts[:lines])
    hidden = len(value) - len(shown)
    return Clip(shown, value.count("\n") - shown.count("\n") if hidden else 0, hidden)


def session_url(session_id: str, *parts: object, **query: object) -> str:
    """The viewer's path of a session (``/s/<id>/<parts>?<query>``), every part quoted."""
    path = "/s/" + quote(session_id, safe="")
    for part in parts:
        path += "/" + quote(str(part), safe="")
    kept = {k: v for k, v in query.items() if v is not None}
    return path + ("?" + urlencode(kept) if kept else "")


def url(path: str, **query: object) -> str:
    """``path?query`` with the query encoded (None values left out)."""
    kept = {k: v for k, v in query.items() if v is not None}
    return path + ("?" + urlencode(kept) if kept else "")


def _text(value: object) -> str:
    return printable(value if isinstance(value, str) else ("" if value is None else str(value)))


def _ms(epoch_ms: object) -> str:
    if type(epoch_ms) is not int:
        return "-"
    try:
        return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return str(epoch_ms)


def _json(value: object) -> str:
    return json.dumps(thaw(value), ensure_ascii=False, indent=2)


def _arguments(value: object) -> str:
    """A tool call's raw arguments, pretty when they are a JSON object's text."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return json.dumps(parsed, ensure_ascii=False, indent=2) if isinstance(
            parsed, dict | list) else value
    return _json(value)


def _image_src(media_type: object, data: object) -> str | None:
    if media_type in _IMAGE_TYPES and isinstance(data, str) and data.isascii() and \
            all(c.isalnum() or c in "+/=\n" for c in data[:4096]):
        return f"data:{media_type};base64,{data.replace(chr(10), '')}"
    return None


def _usage(usage: Mapping[str, Any] | None) -> str:
    if not usage:
        return ""
    names = {"inputTokens": "in", "outputTokens": "out", "cacheReadTokens": "cache read",
             "cacheWriteTokens": "cache write", "reasoningTokens": "reasoning"}
    return " · ".join(f"{names.get(k, k)} {v:,}" for k, v in usage.items() if type(v) is int)


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("dsh.view", "templates"),
    autoescape=True,
    undefined=jinja2.ChainableUndefined,  # a key a log lacks renders as nothing
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters.update(t=_text, ms=_ms, json=_json, clip=clip, arguments=_arguments,
                    usage=_usage)
_ENV.globals.update(session_url=session_url, url=url, image_src=_image_src,
                    CLIP_CHARS=CLIP_CHARS, CLIP_BLOCKS=CLIP_BLOCKS)


def _cell_ms(epoch_ms: int) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch_ms / 1000))
    except (OverflowError, OSError, ValueError):
        return str(epoch_ms)


def size_text(size: int | None) -> str:
    """Bytes as a person reads them (``812 B``, ``4.2 KB``, ``1.3 MB``); ``-``: unknown."""
    if size is None:
        return "-"
    if size < 1000:
        return f"{size} B"
    value = float(size)
    for unit in ("KB", "MB", "GB", "TB"):
        value /= 1000
        if value < 999.95 or unit == "TB":
            return f"{value:.1f} {unit}"
    return f"{size} B"  # pragma: no cover - the loop always returns


def session_rows(infos: Sequence[Any], parents: Mapping[str, int]) -> markupsafe.Markup:
    """The ``<tr>`` rows of the session list (5,000 rows: a template loop costs ~5x this)."""
    esc = markupsafe.escape
    out: list[str] = []
    for s in infos:
        sid = s.id
        link = esc(session_url(sid))
        if s.parent:
            lineage = (f'<a href="{esc(session_url(sid, "tree"))}">fork of '
                       f'{esc(printable(s.parent))} @{s.cut_seq}</a>')
        elif sid in parents:
            lineage = f'<a href="{esc(session_url(sid, "tree"))}">{parents[sid]} fork(s)</a>'
        else:
            lineage = ""
        out.append(
            f'<tr><td><a href="{link}">{esc(printable(sid))}</a></td>'
            f'<td class="title">{esc(printable(s.title or "-"))}</td>'
            f'<td class="src">{esc(printable(s.source))}</td>'
            f'<td class="model">{esc(printable(s.model or "-"))}</td>'
            f'<td class="cwd">{esc(printable(s.cwd or ""))}</td>'
            f'<td class="time">{_cell_ms(s.first_activity_ms) if s.timed else "-"}</td>'
            f'<td class="time">{_cell_ms(s.last_activity_ms) if s.timed else "-"}</td>'
            f'<td class="num">{s.turns}</td><td class="num">{s.events:,}</td>'
            f'<td class="num">{size_text(s.size_bytes)}</td>'
            f'<td class="time">{_cell_ms(s.created_ms)}</td><td class="lineage">{lineage}</td>'
            '</tr>')
    return markupsafe.Markup("\n".join(out))


_ENV.globals["session_rows"] = session_rows


def warm() -> None:
    """Compile every template now (a first page would otherwise pay ~0.5 s for it)."""
    for name in _ENV.list_templates():
        _ENV.get_template(name)


def render(template: str, **context: Any) -> bytes:
    """Render a template to UTF-8 bytes; a lone surrogate is written as its ``\\udXXX`` escape.

    Raises:
        jinja2.TemplateError: a template bug (never session content).
    """
    text = _ENV.get_template(template).render(**context)
    return text.encode("utf-8", errors="backslashreplace")

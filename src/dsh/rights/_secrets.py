"""Finding credentials in session text: detect-secrets plus the formats agents leak most.

Rule: docs/forgetting.md#finding-secrets. :func:`secret_spans` returns the ``(start, end)``
character spans of one string that look like credentials. Two sources, merged:

* the patterns below (provider API keys, cloud keys, tokens, private keys, ``.env`` lines whose
  name says key, token, secret or password, bearer tokens, passwords in URLs); a pattern with a
  group redacts the group only (the value, not the name);
* every plugin of detect-secrets (the ``forget`` extra), run line by line; a hit is widened to
  the whole token around it (detect-secrets reports some tokens by their prefix only).

Without detect-secrets installed the patterns still run; :func:`detector_names` says which
detectors ran, and the redaction record keeps it.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any, Final

PATTERNS: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    ("private key", re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----[\s\S]*?"
                               r"-----END [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----")),
    ("anthropic key", re.compile(r"sk-ant-[A-Za-z0-9_\-]{20,}")),
    ("openai-style key", re.compile(r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}")),
    ("google api key", re.compile(r"AIza[0-9A-Za-z_\-]{35}")),
    ("aws access key", re.compile(r"(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}")),
    ("github token", re.compile(r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})")),
    ("gitlab token", re.compile(r"glpat-[A-Za-z0-9_\-]{20,}")),
    ("slack token", re.compile(r"xox[abposr]-[A-Za-z0-9\-]{10,}")),
    ("stripe key", re.compile(r"(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}")),
    ("hugging face token", re.compile(r"hf_[A-Za-z0-9]{30,}")),
    ("jwt", re.compile(r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}")),
    ("env secret", re.compile(
        r"(?im)^[ \t]*(?:export[ \t]+)?[A-Z_][A-Z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|PWD|"
        r"CREDENTIALS?|AUTH)[A-Z0-9_]*[ \t]*[=:][ \t]*([^\s].*?)[ \t]*$")),
    ("bearer token", re.compile(r"(?i)\bbearer[ \t]+([A-Za-z0-9_\-.=+/]{16,})")),
    ("url password", re.compile(r"://[^/\s:@]+:([^/\s@]+)@")),
)
"""The formats agents leak most, each ``(name, pattern)``; a group marks the value to redact."""

_TOKEN_CHARS: Final = re.compile(r"[A-Za-z0-9_\-+/.~]")


@cache
def _plugins() -> tuple[Any, ...] | None:
    """detect-secrets' plugins, or None when the package is not installed."""
    try:
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    except ImportError:
        return None
    classes: list[Any] = list(get_mapping_from_secret_type_to_class().values())
    return tuple(cls() for cls in classes)


def detector_names() -> tuple[str, ...]:
    """Names of the detectors :func:`secret_spans` runs in this process."""
    plugins = _plugins()
    extra = ("detect-secrets",) if plugins is not None else ()
    return (*(name for name, _ in PATTERNS), *extra)


def _widen(text: str, start: int, end: int) -> tuple[int, int]:
    while start > 0 and _TOKEN_CHARS.match(text[start - 1]):
        start -= 1
    while end < len(text) and (_TOKEN_CHARS.match(text[end]) or text[end] == "="):
        end += 1
    return start, end


def _detect_secrets_spans(text: str) -> list[tuple[int, int]]:
    plugins = _plugins()
    if not plugins:
        return []
    from detect_secrets.settings import default_settings

    spans: list[tuple[int, int]] = []
    offset = 0
    with default_settings():
        for line in text.split("\n"):
            for plugin in plugins:
                for found in plugin.analyze_line(filename="session", line=line, line_number=1):
                    value = found.secret_value
                    if not isinstance(value, str) or len(value) < 3:
                        continue
                    at = line.find(value)
                    while at >= 0:
                        spans.append(_widen(text, offset + at, offset + at + len(value)))
                        at = line.find(value, at + len(value))
            offset += len(line) + 1
    return spans


def merge_spans(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, non-overlapping, non-empty spans covering the same characters."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def secret_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of ``text`` that look like credentials (sorted, non-overlapping).

    Rule: docs/forgetting.md#finding-secrets.
    """
    spans: list[tuple[int, int]] = []
    for _, pattern in PATTERNS:
        for match in pattern.finditer(text):
            group = 1 if pattern.groups and match.group(1) is not None else 0
            spans.append(match.span(group))
    spans.extend(_detect_secrets_spans(text))
    return merge_spans(spans)


def pattern_spans(pattern: re.Pattern[str], text: str) -> list[tuple[int, int]]:
    """Spans of every match of ``pattern`` in ``text`` (``--match``)."""
    return merge_spans([m.span() for m in pattern.finditer(text)])

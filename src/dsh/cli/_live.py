"""What ``dsh run`` and ``dsh chat`` show while the agent works, read from the log as it grows.

A :class:`LiveView` observes the session (``session.observe``): every ``assistant/chunk`` text
delta goes to the answer stream as it is appended, reasoning dimmed, tool calls and results as
one compact line each on the side stream. What the terminal shows is therefore exactly what the
log recorded, in the order it was recorded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, TextIO

_DIM: Final = "\x1b[2m"
_RESET: Final = "\x1b[0m"
_ARGS_CHARS: Final = 80
_RESULT_CHARS: Final = 100


def short(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _args(arguments: object) -> str:
    if not isinstance(arguments, str):
        return ""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return short(arguments, _ARGS_CHARS)
    if isinstance(value, dict):
        return short(", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}"
                               for k, v in value.items()), _ARGS_CHARS)
    return short(json.dumps(value, ensure_ascii=False), _ARGS_CHARS)


def _result_text(message: Mapping[str, Any]) -> str:
    parts: list[str] = []
    for block in message.get("content") or []:
        for inner in block.get("content") or [] if isinstance(block, Mapping) else []:
            if isinstance(inner, Mapping) and isinstance(inner.get("text"), str):
                parts.append(inner["text"])
    return "\n".join(parts)


class LiveView:
    """A session observer printing the agent's work as the log records it.

    Args:
        out: Where the answer text goes (stdout).
        err: Where reasoning, tool calls, results, retries and notices go (stderr).
        color: Dim reasoning and notices with ANSI codes.
        answer: False to print nothing on ``out`` (``dsh run --json`` prints its result once).
    """

    def __init__(self, out: TextIO, err: TextIO, *, color: bool = False,
                 answer: bool = True) -> None:
        self.out = out
        self.err = err
        self.color = color
        self.answer = answer
        self.text_open = False  # answer text printed since the last newline
        self.reasoning_open = False
        self.interrupted = False  # the turn's interrupted message was announced
        self.failed_turns = 0  # turns shown ending with an error ([turn failed: ...])

    def _note(self, text: str) -> None:
        self._end_lines()
        self.err.write(f"{_DIM}{text}{_RESET}\n" if self.color else f"{text}\n")
        self.err.flush()

    def _end_lines(self) -> None:
        if self.reasoning_open:
            self.err.write(_RESET + "\n" if self.color else "\n")
            self.err.flush()
            self.reasoning_open = False
        if self.text_open:
            self.out.write("\n")
            self.out.flush()
            self.text_open = False

    def __call__(self, session: object, event: Mapping[str, Any]) -> None:
        """Show one committed event (the observer protocol of ``Session.observe``)."""
        kind = event["type"]
        data = event.get("data")
        if not isinstance(data, Mapping):
            return
        if kind == "assistant/chunk":
            self._chunk(data.get("chunk") or {})
        elif kind == "assistant/message" and data.get("interrupted"):
            self._note("[interrupted: the partial answer above is kept in the log]")
            self.interrupted = True
        elif kind == "tool/call":
            name = str(data.get("name"))
            self._note(f"⚙ {name}({_args(data.get('arguments'))})")
        elif kind == "tool/result" and event.get("surfaceOp") == "append":
            message = data.get("message") or {}
            error = data.get("error")
            text = short(_result_text(message), _RESULT_CHARS)
            if error or any(isinstance(b, Mapping) and b.get("isError")
                            for b in message.get("content") or []):
                code = error.get("code") if isinstance(error, Mapping) else "error"
                self._note(f"  ↳ {code}: {text}")
            else:
                self._note(f"  ↳ {text or '(no output)'}")
        elif kind == "llm/retry":
            failure = data.get("failure") or data.get("error") or {}
            code = failure.get("code") if isinstance(failure, Mapping) else None
            wait = data.get("delayMs")
            self._note(f"[retrying after {code or 'a failure'}"
                       + (f", waiting {wait} ms]" if isinstance(wait, int) else "]"))
        elif kind == "compaction/end":
            self._note("[compacted: older history summarised]")
        elif kind == "turn/end":
            self._end_lines()
            reason = data.get("reason") or {}
            what = reason.get("kind") if isinstance(reason, Mapping) else None
            if what == "error":
                self.failed_turns += 1
                error = reason.get("error") or {}
                self._note(f"[turn failed: {error.get('code')}: {error.get('message')}]")
            elif what == "aborted" and self.interrupted:
                pass  # already said
            elif what not in ("completed", None):
                self._note(f"[turn ended: {what}]")
            self.interrupted = False

    def _chunk(self, chunk: Mapping[str, Any]) -> None:
        kind = chunk.get("type")
        text = chunk.get("text")
        if not isinstance(text, str) or not text:
            return
        if kind == "reasoning-delta":
            if not self.reasoning_open:
                self.err.write(_DIM if self.color else "")
                self.reasoning_open = True
            self.err.write(text)
            self.err.flush()
        elif kind == "text-delta" and self.answer:
            if self.reasoning_open:
                self._end_lines()
            self.out.write(text)
            self.out.flush()
            self.text_open = not text.endswith("\n")

    def close(self) -> None:
        """End any open line (call when the turn is over)."""
        self._end_lines()

"""The history of a session as the standard-format exporters walk it.

A trajectory format (ATIF, Inspect, a Claude Code or Codex file) records every message in the
order it entered the model's view, not only the view left at the end, except what was taken
off the view on purpose. :func:`history` walks a log's events and yields one :class:`Entry`
per message that entered the view and was not removed from it:

* an append (``surfaceOp: "append"``) is an entry at its own place;
* a *rewrite* — a ``replace`` of exactly one node by an event of the same type, as the tool-result
  pruner, a system-prompt change, a quarantine placeholder (and the unquarantine that restores
  the message) and an adapter's pop of one item out of a grouped answer write — is not an entry
  of its own: the rewritten node's entry carries the newest message instead (the view holds
  that one, so a quarantined message is its placeholder here);
* a *removal* — a ``replace`` whose event projects no message (the empty ``assistant/message``
  of a framework's clear, pop or delete) — is no entry, and every entry its run stood for
  leaves the history with it (a compaction checkpoint inside the run takes the messages it
  shadowed along);
* any other ``replace`` (a compaction's checkpoint message) is an entry whose ``shadows`` names
  the first and last message ids it took the place of.

Applying the entries in order — append each message, and for an entry with ``shadows`` remove the
run of view messages from the first id to the last before appending it — gives exactly
``Session.derive_messages()`` of the log. Rule: docs/standards.md#what-the-exports-hold.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from dsh.json import MAX_SAFE_INTEGER
from dsh.session import fold_surface


class LogLike(Protocol):
    """What an exporter reads: a header, the events, the subagent sessions (children).

    :class:`dsh.interop.ImportedSession` and :class:`SessionLog` are.
    """

    @property
    def header(self) -> Mapping[str, Any]:
        """The session header (wire ``SessionHeader``)."""
        ...

    @property
    def events(self) -> Sequence[Mapping[str, Any]]:
        """The log, seq order."""
        ...

    @property
    def children(self) -> Sequence[LogLike]:
        """The subagent sessions, each a log of its own."""
        ...


@dataclass(frozen=True, slots=True)
class SessionLog:
    """A session as the exporters read it (a :class:`LogLike`).

    Attributes:
        header: The session header (``id``, ``createdAt`` epoch ms, ``cwd``?, …).
        events: Its wire events in seq order (a stored log with its repair closers, so an
            interrupted turn reads closed).
        children: Its subagent sessions (``parentSession`` = this id), each a SessionLog.
    """

    header: Mapping[str, Any]
    events: Sequence[Mapping[str, Any]]
    children: Sequence[SessionLog] = ()


@dataclass(frozen=True, slots=True)
class Entry:
    """One message that entered the model's view.

    Attributes:
        seq: Seq of the event that appended it (for a rewritten node: the original append).
        event: The event whose message this is (the newest rewrite of the node).
        message: The message ``{id, role, content, source}``.
        shadows: ``(first id, last id)`` of the view run a checkpoint message replaced, else
            None.
        time: Epoch ms of the appending event.
    """

    seq: int
    event: Mapping[str, Any]
    message: Mapping[str, Any]
    shadows: tuple[str, str] | None
    time: int


def _message(event: Mapping[str, Any]) -> Mapping[str, Any] | None:
    etype = event.get("type")
    data = event.get("data")
    if not isinstance(data, Mapping):
        return None
    if etype in ("user/message", "system/message"):
        return data
    if etype in ("assistant/message", "tool/result"):
        message = data.get("message")
        if isinstance(message, Mapping) and message.get("content"):
            return message
    return None


def history(events: Sequence[Mapping[str, Any]]) -> Iterator[Entry]:
    """Yield the entries of ``events`` in log order (module docstring).

    Args:
        events: Wire events ``{type, seq, time, data, surfaceOp?, …}`` in seq order.

    Raises:
        EventRejectedError: in a log holding a removal, the first refusal of the session's
            surface fold (e.g. code ``SURFACE`` naming the seq of a replace that names no run
            of the surface: a log no session accepted).
    """
    by_seq = {int(e["seq"]): e for e in events if isinstance(e.get("seq"), int)}
    newest: dict[int, Mapping[str, Any]] = {}
    rewrites: set[int] = set()
    rewrites_to: dict[int, int] = {}  # a rewrite's seq -> the node it rewrote first
    quarantined = _quarantine_replaces(events)
    removals: set[int] = set()
    for event in events:
        op = event.get("surfaceOp")
        if not (isinstance(op, Mapping) and op.get("op") == "replace"):
            continue
        if _message(event) is None:
            removals.add(int(event["seq"]))
            continue
        start, end = op.get("start"), op.get("end")
        target = by_seq.get(start) if start == end and isinstance(start, int) else None
        if target is not None and target.get("type") == event.get("type") and (
                event.get("type") in _REWRITTEN or event.get("seq") in quarantined):
            root = rewrites_to.get(int(start), int(start))  # type: ignore[arg-type]
            newest[root] = event
            rewrites.add(int(event["seq"]))
            rewrites_to[int(event["seq"])] = root
    removed = _removed(events, removals, rewrites_to) if removals else frozenset()
    # ids of the messages each node shows now (a rewrite shows its own id)
    for event in events:
        seq = event.get("seq")
        op = event.get("surfaceOp")
        if op is None or not isinstance(seq, int) or seq in rewrites or seq in removed:
            continue
        shown = newest.get(seq, event)
        message = _message(shown)
        if message is None:
            continue
        shadows = None
        if isinstance(op, Mapping):
            first = _shown_id(by_seq, newest, rewrites_to, op.get("start"))
            last = _shown_id(by_seq, newest, rewrites_to, op.get("end"))
            if first is None or last is None:
                continue
            shadows = (first, last)
        yield Entry(seq, shown, message, shadows, int(event.get("time") or 0))


_REWRITTEN: Final = frozenset({"tool/result", "system/message", "assistant/message"})
"""Types whose one-node replace by the same type is a rewrite: the pruner's and a recovered
outcome's tool result, a new system prompt, an adapter's pop of one item out of a grouped
answer (a compaction checkpoint is a ``user/message``). A ``user/message`` is rewritten only by
a quarantine."""


def _quarantine_replaces(events: Sequence[Mapping[str, Any]]) -> frozenset[int]:
    """Seqs of the placeholders and restoring replaces the quarantine records announce.

    docs/forgetting.md#quarantine: ``quarantine/apply {items: [{seq, placeholder}]}`` and
    ``quarantine/release {items: [{seq, placeholder, restored}]}``.
    """
    found: set[int] = set()
    for event in events:
        kind = event.get("type")
        if kind not in ("quarantine/apply", "quarantine/release"):
            continue
        data = event.get("data")
        items = data.get("items") if isinstance(data, Mapping) else None
        for item in items if isinstance(items, Sequence) else ():
            if not isinstance(item, Mapping):
                continue
            seq = item.get("placeholder" if kind == "quarantine/apply" else "restored")
            if isinstance(seq, int) and not isinstance(seq, bool):
                found.add(seq)
    return frozenset(found)


def _removed(events: Sequence[Mapping[str, Any]], removals: set[int],
             rewrites_to: Mapping[int, int]) -> frozenset[int]:
    """Seqs of the entries a removal took off the view (module docstring).

    Walks the replacements of the session's own surface fold (:func:`fold_surface`,
    docs/rules.md#surface-ops), keeping for each node the entries it stands for: an append
    itself, a rewrite its node's, a checkpoint itself and what it shadowed, a removal none. A
    removal's run takes all of them out.

    Raises:
        EventRejectedError: the fold's first refusal (code ``SURFACE`` naming the seq of a
            replace whose start or end is not on the surface, or whose start comes after its
            end: a log no session accepted).
    """
    stands_for: dict[int, list[int]] = {}  # a replace's node -> its entries (an append: itself)
    out: set[int] = set()
    for seq, _start, _end, shadowed in fold_surface(events).replacements:
        run = [e for node in shadowed for e in stands_for.pop(node, (node,))]
        if seq in removals:
            out.update(run)
            stands_for[seq] = []
        elif seq in rewrites_to:
            stands_for[seq] = run
        else:
            stands_for[seq] = [seq, *run]
    return frozenset(out)


def _shown_id(by_seq: Mapping[int, Mapping[str, Any]],
              newest: Mapping[int, Mapping[str, Any]], rewrites_to: Mapping[int, int],
              seq: object) -> str | None:
    """Id of the message the surface node ``seq`` shows (its newest rewrite's)."""
    if not isinstance(seq, int) or seq not in by_seq:
        return None
    root = rewrites_to.get(seq, seq)
    message = _message(newest.get(root, by_seq[seq])) or _message(by_seq[seq])
    return str(message["id"]) if message is not None else None


def usage_of(event: Mapping[str, Any]) -> dict[str, int]:
    """An assistant event's token usage ``{inputTokens, outputTokens, cacheReadTokens?, …}``.

    Counts are disjoint (cached input is not in ``inputTokens``); an event without usage gives
    ``{}``.
    """
    data = event.get("data")
    usage = data.get("usage") if isinstance(data, Mapping) else None
    if not isinstance(usage, Mapping):
        return {}
    return {str(k): int(v) for k, v in usage.items()
            if isinstance(v, int) and not isinstance(v, bool)}


def iso_time(ms: int) -> str:
    """Epoch ms as ISO 8601 UTC with milliseconds and a ``Z``, e.g. ``2025-01-02T03:04:05.678Z``."""
    when = _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def block_text(block: Mapping[str, Any]) -> str:
    """The text a content block shows in a text-only format ('' for none).

    ``text``: its text; ``image``: ``[image <name>]`` (the log keeps a reference, not the
    bytes); ``provider-raw``: the raw block's ``text`` when it has one.
    """
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "image":
        att = block.get("attachment")
        name = (att.get("name") or att.get("attachmentId")) if isinstance(att, Mapping) else None
        return f"[image {name}]" if name else "[image]"
    if kind == "provider-raw":
        raw = block.get("block")
        if isinstance(raw, Mapping) and isinstance(raw.get("text"), str):
            return str(raw["text"])
    return ""


def safe_numbers(value: Any) -> Any:
    """``value`` with each number no JSON reader keeps exactly as its decimal text.

    Such a number is an integer beyond ±(2^53-1) (a JavaScript reader, such as a log viewer,
    rounds it) or ``NaN``/``Infinity`` (not JSON at all). ``value`` itself (the same object)
    when it holds none, so ``safe_numbers(v) is v`` tells whether anything changed.
    Rule: docs/standards.md (ATIF, Inspect AI: the exact text rides beside it).
    """
    if isinstance(value, dict | list):
        pairs = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
        done = [(k, safe_numbers(v)) for k, v in pairs]
        if all(new is old for (_, new), (_, old) in zip(done, pairs, strict=True)):
            return value
        return dict(done) if isinstance(value, dict) else [v for _, v in done]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SAFE_INTEGER:
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value

"""Listing without reading logs: one summary per session from a per-store index.

``dsh ls`` needs, per session, the header, the committed event count, the last event time, the
number of turns, the title (last ``session/title``, else the first prompt a person typed, of
what the model view still holds: :func:`shown_titles`) and where the log came from (the first
``import/source`` format). Reading every log for that costs
O(total events); this module answers from data kept apart from the logs:

* PostgreSQL: every append stores the entry (:func:`stored_entry`) and the data bytes in the
  session row, in the transaction that moves its head; the listing reads the sessions rows.
* SQLite (:func:`sqlite_entries`): a few aggregate queries over the store's own tables (the
  sessions rows, the last row of every session, and the rows of the few event types a summary
  needs); only those rows are decoded.
* JSONL (:class:`JsonlIndex`): a sidecar file ``.dsh-listing.json`` in the store root maps each
  log to its summary and the log's stat signature (size, mtime, ctime, inode). A log whose
  signature matches is not opened; a missing, stale or unreadable index entry is rebuilt from
  a full read of that one log, and the index is rewritten (atomically) when anything changed.
  The index is a cache, never the truth: deleting it only costs one full read per log.
  Writers keep it at flush: a JSONL write handle folds what it flushed into the entry it
  started from (:class:`EntryFold`) and appends one line to ``.dsh-listing.journal``; the next
  listing merges the journal (later lines win) into the index and empties it; so does the
  writer whose line takes the journal past ``JOURNAL_FOLD_BYTES`` (every writer's first flush
  reads the journal back to find its entry: it must stay short while nobody lists), and writers
  stop adding lines past ``JOURNAL_MAX_BYTES`` should folding fail. A writer that cannot know the
  entry (a log read with a torn tail, no matching index entry) writes nothing: the listing
  then reads that log in full, as before.

Rule: docs/stores.md#opening-a-store (``list``); summaries equal what a full read gives
(``tests/persistence/test_listing.py`` compares them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final

import orjson

from dsh._errors import DshError
from dsh.json import FrozenDict, snapshot_json, thaw
from dsh.json import dumps as json_dumps
from dsh.json import loads as json_loads
from dsh.session import (
    NO_OLD_MARKS,
    OLD_MARK_TYPES,
    REMOVAL_MODEL,
    REMOVED_RESULT_TEXT,
    OldMarks,
)

__all__ = ["HIDING_SQL", "HIDING_TYPES", "INDEX_NAME", "JOURNAL_NAME", "MAY_REMOVE_SQL",
           "REMOVAL_MODEL", "REMOVED_RESULT_TEXT", "SOURCE_EVENT_TYPE", "NodeFold",
           "STORED_VERSION", "EntryFold", "JsonlIndex", "ListingEntry", "ReadFn",
           "entry_from_stored", "first_line", "is_hiding", "is_untimed", "note_flushed",
           "prompt_of", "read_entries", "recorded_flush", "removed_messages", "reply_model",
           "request_model", "shown_titles", "signature", "source_format", "stored_entry",
           "summarize"]

log = logging.getLogger("dsh.persistence")

INDEX_NAME: Final = ".dsh-listing.json"
"""The JSONL listing sidecar in the store root (a cache; safe to delete)."""

JOURNAL_NAME: Final = ".dsh-listing.journal"
"""Entries JSONL writers noted at flush since the index was last written (a cache too)."""

JOURNAL_MAX_BYTES: Final = 8 * 1024 * 1024
"""Writers stop adding journal lines past this size until a listing merges the journal."""

JOURNAL_FOLD_BYTES: Final = 128 * 1024
"""A writer whose line takes the journal past this size merges it into the index (about one
flush in 200 of one session; a resume's first flush reads the whole journal back)."""

_INDEX_VERSION: Final = 6
# 3: first_activity_ms and model; 4: first_line; 5: titles of what the model view holds
# (shown_titles): entries of versions <= 4 may hold a cleared or quarantined prompt; 6: the
# old adapter marks honoured (entries of version 5 may hold a prompt one cleared)

STORED_VERSION: Final = 3
"""Version of a writer's entry stored beside the log (PostgreSQL's ``listing``): 2 follows
:func:`shown_titles`, 3 with the old adapter marks honoured; one with no version (1) may hold
a removed prompt, one of version 2 a prompt an old mark cleared (see
:func:`entry_from_stored`)."""

HIDING_TYPES: Final = ("quarantine/apply", "quarantine/release", *sorted(OLD_MARK_TYPES))
"""Records of a quarantine (the replaces they announce take messages off the view or back) and
an earlier dsh's old adapter marks (docs/forgetting.md#logs-from-before-surface-removals)."""

HIDING_SQL: Final = ", ".join(f"'{kind}'" for kind in HIDING_TYPES)
""":data:`HIDING_TYPES` as an SQL list (inside ``type IN (...)``)."""

MAY_REMOVE_SQL: Final = (
    f"(type IN ({HIDING_SQL}) OR (type IN ('assistant/message', "
    "'tool/result') AND surface_op IS NOT NULL AND surface_op <> '\"append\"'))")
"""SQL condition (SQLite and PostgreSQL ``events`` rows) of the records without which
:func:`removed_messages` finds nothing: a quarantine record (a placeholder takes a message off
only when a ``quarantine/apply`` names it), an old adapter mark, an ``assistant/message``
replace (an adapter's removal) and a ``tool/result`` replace (a popped tool output's
placeholder). A log holding none
of them has no removed message (docs/stores.md#search)."""
SOURCE_EVENT_TYPE: Final = "import/source"


@dataclass(frozen=True, slots=True)
class ListingEntry:
    """What ``dsh ls`` shows of one session, as a full read would compute it.

    Attributes:
        id: Session id.
        header: The stored header (wire ``SessionHeader``).
        events: Committed events (a torn tail excluded).
        last_activity_ms: ``time`` of the last committed event, else header ``createdAt``.
        turns: Number of ``turn/start`` events.
        title: The last ``session/title`` title (raw), or None; None too when a message
            recorded before it has left the model view since (it may tell of what was removed).
        first_prompt: First line of the text of the first ``user/message`` appended to the
            surface that a person typed (source kind ``user`` or none; non-blank) and that the
            model view still holds (:func:`shown_titles`), or None.
        source_format: The first ``import/source`` event's ``format``, else ``"dsh"``.
        timed: False when that ``import/source`` says ``timestamps: false`` and nothing was
            appended after it (its times are one stamp, not real activity).
        first_activity_ms: ``time`` of the first event (seq 0), or None (an entry an older
            dsh indexed).
        model: The model named by the last ``request/context`` (its ``model``) or
            ``request/header`` (``header.config.model``), else by the first assistant message
            (``source.model``), else None.
        size_bytes: Bytes the log takes in storage (the JSONL file; SQLite and PostgreSQL:
            the rows' data), or None where the store cannot tell without reading the log
            (memory).
            Not compared: a full read does not know it.
    """

    id: str
    header: FrozenDict
    events: int
    last_activity_ms: int
    turns: int
    title: str | None
    first_prompt: str | None
    source_format: str
    timed: bool = True
    first_activity_ms: int | None = None
    model: str | None = None
    size_bytes: int | None = field(default=None, compare=False)


_FIELDS: Final = tuple(f.name for f in fields(ListingEntry))


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(block["text"] for block in content
                     if isinstance(block, Mapping) and block.get("type") == "text"
                     and isinstance(block.get("text"), str))


def prompt_of(event: Mapping[str, Any]) -> str | None:
    """The first-prompt text of a ``user/message`` event, or None if it does not qualify."""
    if event.get("surfaceOp") != "append":
        return None
    data = event.get("data")
    source = data.get("source") if isinstance(data, Mapping) else None
    # The first prompt is what a person typed, not injected context.
    if isinstance(source, Mapping) and source.get("kind") not in (None, "user"):
        return None
    text = _message_text(data.get("content") if isinstance(data, Mapping) else None)
    return first_line(text)


_EDGE_SPACES: Final = re.compile(r"^[^\S\x00-\x08\x0b-\x1f\x7f-\x9f]+|"
                                 r"[^\S\x00-\x08\x0b-\x1f\x7f-\x9f]+$")
"""Whitespace that is no control character (space, tab, NBSP…) at either end of a line."""


def first_line(text: str) -> str | None:
    """The first line of ``text`` that holds more than spaces, or None when none does.

    Lines end at LF (the CR of a CRLF goes with it); the spaces (whitespace that is no control
    character) at the line's ends are dropped, every control character is kept, a lone CR,
    VT, FF or NEL among them: untrusted text is shown escaped, never silently altered
    (docs/rules.md#listing, docs/cli.md#output).
    """
    for line in text.split("\n"):
        shown = _EDGE_SPACES.sub("", line.removesuffix("\r"))
        if shown:
            return shown
    return None


def is_untimed(event: Mapping[str, Any]) -> bool:
    """An ``import/source`` whose source had no timestamps (every event got one stamp)."""
    data = event.get("data")
    return isinstance(data, Mapping) and data.get("timestamps") is False


def request_model(event: Mapping[str, Any]) -> str | None:
    """The model a ``request/context`` or ``request/header`` event names, or None."""
    data = event.get("data")
    if not isinstance(data, Mapping):
        return None
    if event.get("type") == "request/header":
        header = data.get("header")
        config = header.get("config") if isinstance(header, Mapping) else None
        data = config if isinstance(config, Mapping) else {}
    model = data.get("model")
    return model if isinstance(model, str) and model else None


def reply_model(event: Mapping[str, Any]) -> str | None:
    """The model an ``assistant/message`` event's message names (``source.model``), or None."""
    data = event.get("data")
    message = data.get("message") if isinstance(data, Mapping) else None
    source = message.get("source") if isinstance(message, Mapping) else None
    model = source.get("model") if isinstance(source, Mapping) else None
    return model if isinstance(model, str) and model else None


def source_format(event: Mapping[str, Any]) -> str:
    """The format an ``import/source`` event names (``"dsh"`` when it names none)."""
    data = event.get("data")
    fmt = data.get("format") if isinstance(data, Mapping) else None
    return fmt if isinstance(fmt, str) and fmt else "dsh"


def is_hiding(event: Mapping[str, Any]) -> bool:
    """Whether ``event`` may take a message off the model view or put one back.

    An adapter's removal (an ``assistant/message`` replace: docs/adapters.md#cleared-means-cleared)
    and a quarantine's records (docs/forgetting.md#quarantine). Any assistant replace counts (a
    pop out of a grouped answer too): the listing then recomputes the titles from the log.
    """
    kind = event["type"]
    return kind in HIDING_TYPES or (kind == "assistant/message"
                                    and event.get("surfaceOp") not in (None, "append"))


def _is_removal(event: Mapping[str, Any]) -> bool:
    data = event.get("data")
    message = data.get("message") if isinstance(data, Mapping) else None
    source = message.get("source") if isinstance(message, Mapping) else None
    return (isinstance(source, Mapping) and source.get("provider") == "dsh"
            and source.get("model") == REMOVAL_MODEL and "removal" in source)


def _quarantine_items(events: Sequence[Mapping[str, Any]]) -> tuple[set[int], dict[int, int]]:
    """Placeholders the quarantine records name, and each restoring replace's original seq."""
    placeholders: set[int] = set()
    restores: dict[int, int] = {}
    for event in events:
        kind = event["type"]
        if kind not in HIDING_TYPES:
            continue
        data = event.get("data")
        items = data.get("items") if isinstance(data, Mapping) else None
        for item in items if isinstance(items, list | tuple) else ():
            if not isinstance(item, Mapping):
                continue
            seq = item.get("seq")
            if kind == "quarantine/apply":
                if type(item.get("placeholder")) is int:
                    placeholders.add(item["placeholder"])
            elif type(item.get("restored")) is int and type(seq) is int:
                restores[item["restored"]] = seq
    return placeholders, restores


class NodeFold:
    """The surface of a log being folded, each node with the appended messages it stands for.

    Unlike :func:`dsh.session.fold_surface` it takes any subset of a log that holds its
    message events (the SQLite listing reads only those) and never refuses: a replace naming
    no run is skipped. Rule: docs/rules.md#surface-ops. A map of each node's position keeps a
    one-node replace (a pruned result, a rewrite) O(1); a run of several nodes re-indexes the
    nodes after it, as the session's own fold moves them.

    Attributes:
        nodes: The node seqs in surface order.
        stands_for: Node seq → the appended message seqs it stands for (the caller sets a
            replace's after :meth:`replace`).
    """

    __slots__ = ("nodes", "stands_for", "where")

    def __init__(self) -> None:
        self.nodes: list[int] = []
        self.where: dict[int, int] = {}
        self.stands_for: dict[int, list[int]] = {}

    def append(self, seq: int) -> None:
        """An appended node, standing for itself."""
        self.where[seq] = len(self.nodes)
        self.nodes.append(seq)
        self.stands_for[seq] = [seq]

    def replace(self, seq: int, start: object, end: object) -> list[int] | None:
        """Put node ``seq`` in place of the run ``start..end``; what that run stood for.

        Returns:
            The seqs the run's nodes stood for (their entries are dropped; the caller says what
            ``seq`` stands for), or None, nothing changed, when ``start`` or ``end`` is no node
            or the start comes after the end (a log no session accepted).
        """
        nodes, where = self.nodes, self.where
        first = where.get(start, -1) if type(start) is int else -1
        last = where.get(end, -1) if type(end) is int else -1
        if first < 0 or last < first:
            return None
        run_nodes = nodes[first:last + 1]
        run = [e for node in run_nodes for e in self.stands_for.pop(node, ())]
        for node in run_nodes:
            del where[node]
        nodes[first:last + 1] = [seq]
        where[seq] = first
        if last > first:  # the nodes after the run moved up
            for index in range(first + 1, len(nodes)):
                where[nodes[index]] = index
        return run


def _fold_view(events: Sequence[Mapping[str, Any]]
               ) -> tuple[set[int], dict[int, str], list[int], tuple[int, str] | None]:
    """Fold the surface: ``(shown, why, appended, title)`` (see :func:`shown_titles`).

    ``shown``: the appended messages some node stands for; ``why``: for the others an adapter's
    removal or a quarantine took off, ``"clear"`` or ``"quarantine"``; ``appended``: every
    appended message's seq; ``title``: the last ``session/title`` (seq, text), or None.
    """
    placeholders, restores = _quarantine_items(events)
    marks = NO_OLD_MARKS
    fold = NodeFold()
    stands_for = fold.stands_for
    appended: list[int] = []
    why: dict[int, str] = {}
    withholding: list[int] = []
    title: tuple[int, str] | None = None
    for event in events:
        seq, op = event.get("seq"), event.get("surfaceOp")
        if type(seq) is not int:
            continue
        if event["type"] == "session/title":
            data = event.get("data")
            if isinstance(data, Mapping) and isinstance(data.get("title"), str):
                title = (seq, data["title"])
            continue
        if op is None:
            if event["type"] in OLD_MARK_TYPES:
                marks = marks.taking((event,))
            continue
        if not isinstance(op, Mapping):
            fold.append(seq)
            appended.append(seq)
            continue
        run = fold.replace(seq, op.get("start"), op.get("end"))
        if run is None:
            continue  # a replace naming no run: no session accepted it; nothing stands for it
        if seq in placeholders:
            stands_for[seq] = []
            why.update(dict.fromkeys(run, "quarantine"))
        elif event["type"] == "assistant/message" and _is_removal(event):
            stands_for[seq] = []
            why.update(dict.fromkeys(run, "clear"))
        elif seq in restores:
            stands_for[seq] = [restores[seq]]
        else:
            stands_for[seq] = run
            if event["type"] == "tool/result" and _is_withheld_result(event):
                withholding.append(seq)
    if marks:
        _take_old_marks(fold, marks, events, why)
    shown = {e for kept in stands_for.values() for e in kept}
    removed = {seq: w for seq, w in why.items() if seq not in shown}
    # a popped tool output: its placeholder answers the call (titles: no message of a person)
    removed.update((e, "clear") for p in withholding for e in stands_for.get(p, ()))
    return shown, removed, appended, title


def _take_old_marks(fold: NodeFold, marks: OldMarks, events: Sequence[Mapping[str, Any]],
                    why: dict[int, str]) -> None:
    """Take off ``fold`` the nodes an earlier dsh's old adapter marks removed, in memory.

    What :func:`dsh.session.apply_old_marks` appends for them, folded: every node up to a
    clear's ``through`` (a ``system/message`` at node 0 stays) and each popped node stand for
    nothing, their messages removed as by a ``clear`` (a popped tool output too: a placeholder
    would answer its call). Nodes already off the surface are not there to take.
    Rule: docs/forgetting.md#logs-from-before-surface-removals.
    """
    nodes = fold.nodes
    popped = {seq for seq, _ in marks.popped}
    first = nodes[0] if nodes else -1
    system_first = any(e.get("seq") == first and e["type"] == "system/message"
                       for e in events if e.get("surfaceOp") is not None)
    for position, node in enumerate(nodes):
        if (node <= marks.through or node in popped) and not (position == 0 and system_first):
            why.update(dict.fromkeys(fold.stands_for.get(node, ()), "clear"))
            fold.stands_for[node] = []


def _is_withheld_result(event: Mapping[str, Any]) -> bool:
    """An adapter's placeholder of a popped tool output (docs/adapters.md#cleared-means-cleared)."""
    data = event.get("data")
    message = data.get("message") if isinstance(data, Mapping) else None
    blocks = message.get("content") if isinstance(message, Mapping) else None
    return isinstance(blocks, list | tuple) and any(
        isinstance(block, Mapping) and _message_text(block.get("content")) == REMOVED_RESULT_TEXT
        for block in blocks)


def removed_messages(events: Sequence[Mapping[str, Any]]) -> dict[int, str]:
    """The appended messages of a whole log that left its model view, and why.

    Returns:
        seq → ``"clear"`` (an adapter's clear, pop or delete:
        docs/adapters.md#cleared-means-cleared) or ``"quarantine"``
        (docs/forgetting.md#quarantine), for each ``surfaceOp: "append"`` message no surface
        node stands for any more; a compacted message is not removed, a released one is back.
    """
    return _fold_view(events)[1]


def shown_titles(events: Sequence[Mapping[str, Any]]) -> tuple[str | None, str | None]:
    """``(title, first_prompt)`` of a whole log, of what its model view still holds.

    The surface is folded (docs/rules.md#surface-ops), each node standing for the appended
    messages it shows: an append itself; a compaction checkpoint or a rewrite (a pruned tool
    result, a new system prompt) what its run stood for (a summary keeps its prompts: compaction
    is no forgetting); an adapter's removal and a quarantine placeholder nothing; a quarantine's
    restoring replace the original message. ``first_prompt`` is the first line of the first
    typed prompt (:func:`prompt_of`) a node stands for, as its bytes are now (a redaction's
    ``[REDACTED]``); the ``title`` is the last ``session/title``, unless a message recorded
    before it is one no node stands for (it may tell of it). A log that never took a message
    off gives what the plain fold gives.

    Rule: docs/forgetting.md#what-titles-show.
    """
    shown, _, appended, title = _fold_view(events)
    by_seq = {int(e["seq"]): e for e in events if e["type"] == "user/message"}
    prompt = None
    for seq in sorted(shown):
        event = by_seq.get(seq)
        if event is not None:
            prompt = prompt_of(event)
            if prompt is not None:
                break
    if title is not None and any(seq < title[0] and seq not in shown for seq in appended):
        title = None
    return (title[1] if title is not None else None), prompt


def summarize(header: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> ListingEntry:
    """The listing entry of a session from its header and committed events (one pass)."""
    frozen = header if isinstance(header, FrozenDict) else snapshot_json(header)
    start = ListingEntry(str(header["id"]), frozen, 0, int(header.get("createdAt", 0)), 0,
                         None, None, "dsh")
    fold = EntryFold(start, False)
    fold.extend(events)  # never False: it starts knowing no import/source was seen
    return fold.entry


class EntryFold:
    """The listing entry of one log, kept up to date by its writer as batches become durable.

    It continues :func:`summarize`'s one pass from a known entry, so :attr:`entry` always
    equals what a full read of the durable log would summarise.

    Args:
        entry: The entry of the log as it stands (a fresh session: ``summarize(header, [])``).
        source_seen: Whether an ``import/source`` was among those events; None when unknown
            (an entry whose source is ``"dsh"`` may or may not have seen one).
    """

    __slots__ = ("_source_seen", "_untimed_at", "entry", "legacy")

    def __init__(self, entry: ListingEntry, source_seen: bool | None) -> None:
        self.entry = entry
        self.legacy = False
        """True for an entry stored before :data:`STORED_VERSION` 2: its titles are right only
        for a log that holds no :func:`is_hiding` event (the reader checks)."""
        self._source_seen = source_seen
        # a timestamp-less import/source stamps every event with one time: the entry is
        # untimed exactly while the last time is still that stamp (times never decrease)
        self._untimed_at = None if entry.timed else entry.last_activity_ms

    @classmethod
    def start(cls, header: Mapping[str, Any]) -> EntryFold:
        """The fold of a session that has no events yet."""
        return cls(summarize(header, ()), False)

    @classmethod
    def resume(cls, entry: ListingEntry) -> EntryFold:
        """The fold continuing an index entry read back for the log as it stands."""
        return cls(entry, True if entry.source_format != "dsh" else None)

    @property
    def source_seen(self) -> bool | None:
        """Whether an ``import/source`` was folded in (None: unknown); stored beside the entry."""
        return self._source_seen

    def extend(self, events: Sequence[Mapping[str, Any]]) -> bool:
        """Fold durable events (in seq order) in; False when the entry cannot be known.

        False means an ``import/source`` arrived while it is unknown whether an earlier one
        was seen (the first one decides the source), or, in a fold that did not start at the
        first event, a removal or a quarantine record (:func:`is_hiding`: the titles then
        depend on the whole log): the caller stops keeping the entry, and the listing reads
        the log in full (:func:`shown_titles`).
        """
        if not events:
            return True
        e = self.entry
        title, prompt, source, turns = e.title, e.first_prompt, e.source_format, e.turns
        model = e.model
        seen, untimed_at = self._source_seen, self._untimed_at
        hiding = False
        for event in events:
            kind = event["type"]
            if (kind == "assistant/message" or kind in HIDING_TYPES) and is_hiding(event):
                # what it takes off may be the prompt, and what titles then lies before this
                # batch: only the whole log tells (a fold from the first event knows it)
                if e.events:
                    return False
                hiding = True
            if kind == "turn/start":
                turns += 1
            elif kind == "request/header" or kind == "request/context":
                model = request_model(event) or model
            elif kind == "assistant/message" and model is None:
                model = reply_model(event)
            elif kind == "session/title":
                data = event["data"]
                if isinstance(data, Mapping) and isinstance(data.get("title"), str):
                    title = data["title"]
            elif kind == "user/message" and prompt is None:
                prompt = prompt_of(event)
            elif kind == SOURCE_EVENT_TYPE and not seen:
                if seen is None:
                    return False
                seen = True
                source = source_format(event)
                if is_untimed(event):
                    untimed_at = int(event["time"])
        if hiding:
            title, prompt = shown_titles(events)
        last = int(events[-1]["time"])
        first = int(events[0]["time"]) if e.events == 0 else e.first_activity_ms
        self.entry = ListingEntry(e.id, e.header, e.events + len(events), last, turns, title,
                                  prompt, source, untimed_at is None or last != untimed_at,
                                  first, model)
        self._source_seen, self._untimed_at = seen, untimed_at
        return True


def _encode(value: Any) -> bytes:
    """JSON bytes of an index or journal item; lone surrogates (valid in dsh logs) escaped."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:  # a lone surrogate in a title or a header: dsh's codec
        # escapes it; a frozen top level is encoded as is (the stat signature's nanosecond
        # times are beyond what a snapshot accepts, and this is our own data)
        return json_dumps(FrozenDict(value))


def _decode(data: bytes) -> Any:
    """An index or journal item; raises ``orjson.JSONDecodeError`` when it is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        try:  # dsh's codec reads the lone surrogates _encode escaped
            return thaw(json_loads(data))
        except DshError:
            pass
        raise


def note_flushed(root: Path, key: str, sig: list[int], entry: ListingEntry) -> None:
    """Append one ``(key, sig, entry)`` line to the store's listing journal (one write).

    A failure is logged and ignored: the index is a cache, and the listing then reads the
    log in full.
    """
    line = _encode({"key": key, "sig": sig, "entry": _to_json(entry),
                    "v": _INDEX_VERSION}) + b"\n"
    try:
        fd = os.open(os.path.join(root, JOURNAL_NAME), os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                     0o600)
        try:
            size = os.fstat(fd).st_size
            # bounded while nobody lists: past the cap the listing reads the newest logs
            if size < JOURNAL_MAX_BYTES:
                os.write(fd, line)
        finally:
            os.close(fd)
    except OSError as exc:
        log.info("listing journal in %s not written (%s); listing reads the log", root, exc)
        return
    if size + len(line) >= JOURNAL_FOLD_BYTES:
        JsonlIndex(Path(root)).save()  # merges the journal and empties it (errors: logged)


def recorded_flush(root: Path, key: str) -> tuple[list[int], ListingEntry] | None:
    """The signature and entry last recorded for log ``key``: its journal line, else the index.

    What :class:`JsonlIndex` would hold for ``key`` (the journal's last complete line for it
    wins), found without decoding the rest: a writer journals a log's signature only after its
    flush made the bytes durable, so the size in it was committed (a reader's check that a log
    was not cut inside committed data, docs/formats.md#listing-index). ``None`` when neither
    records the log. Each file is read once; the journal before the index (a listing that
    merges meanwhile moves lines from the journal into the index, never away from both).

    Raises:
        OSError: a file exists but cannot be read.
    """
    name = _encode(key)
    data = _read_if_any(root / JOURNAL_NAME)
    needle = b'{"key":' + name + b',"sig":'
    end = len(data)
    while data:
        pos = data.rfind(needle, 0, end)
        if pos < 0:
            break
        end = pos
        stop = data.find(b"\n", pos)
        if (pos and data[pos - 1] != 0x0A) or stop < 0:
            continue  # not a line start, or a line a writer is still writing
        try:
            item = _decode(data[pos:stop])
        except orjson.JSONDecodeError:
            continue
        found = _sig_entry(item)
        if found is not None:
            return found
    data = _read_if_any(root / INDEX_NAME)
    # a key followed by an item can only be one of "logs": inside a JSON string every quote is
    # escaped, and no header or metadata key holds the '/' every log key has
    pos = data.find(name + b':{"sig":')
    if pos < 0:
        return None
    start, window = pos + len(name) + 1, 64 * 1024
    while True:
        # a character the window cuts in two is dropped: the item must end before it
        text = data[start:start + window].decode("utf-8", "ignore")
        try:
            item = json.JSONDecoder().raw_decode(text)[0]
        except (json.JSONDecodeError, RecursionError):
            if start + window >= len(data):
                return None
            window *= 4
            continue
        return _sig_entry(item)


_READ_CACHE: dict[str, tuple[tuple[int, ...], bytes]] = {}
"""The bytes of the listing files :func:`recorded_flush` last read, by path, with their stat."""

_READ_CACHE_PATHS: Final = 8


def _read_if_any(path: Path) -> bytes:
    """The file's bytes (empty when it does not exist), reused while its stat is unchanged.

    A listing that reads many logs in full (a copied store: every signature changed) checks
    each against the same index: it is read once, not once a log.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return b""
    try:
        st = os.fstat(fd)
        stamp = (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        cached = _READ_CACHE.get(str(path))
        if cached is not None and cached[0] == stamp:
            return cached[1]
        chunks, got = [], 0
        while True:
            chunk = os.read(fd, max(st.st_size - got, 0) + 65536)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) == st.st_size:  # not cached while a writer is appending to it
        if len(_READ_CACHE) >= _READ_CACHE_PATHS:
            _READ_CACHE.clear()
        _READ_CACHE[str(path)] = (stamp, data)
    return data


def _sig_entry(item: Any) -> tuple[list[int], ListingEntry] | None:
    if not isinstance(item, dict):
        return None
    sig, entry = item.get("sig"), _from_json(item.get("entry"))
    if entry is None or not isinstance(sig, list) or not all(type(v) is int for v in sig):
        return None
    return sig, entry


def _to_json(entry: ListingEntry) -> dict[str, Any]:
    # by hand: dataclasses.asdict deep-copies the header, a cost on every JSONL flush
    return {field: getattr(entry, field) for field in _FIELDS}


def _from_json(value: Any) -> ListingEntry | None:
    """An entry from its index form, or None when it is not exactly that form."""
    if not isinstance(value, dict):
        return None
    try:
        entry = ListingEntry(**value)
    except TypeError:
        return None
    ints = (entry.events, entry.last_activity_ms, entry.turns)
    if not all(type(v) is int for v in ints) or type(entry.id) is not str \
            or type(entry.timed) is not bool \
            or not isinstance(entry.header, dict) or entry.header.get("id") != entry.id \
            or type(entry.source_format) is not str \
            or not all(v is None or type(v) is str
                       for v in (entry.title, entry.first_prompt, entry.model)) \
            or not all(v is None or type(v) is int
                       for v in (entry.first_activity_ms, entry.size_bytes)):
        return None
    return ListingEntry(entry.id, snapshot_json(entry.header), entry.events,
                        entry.last_activity_ms, entry.turns, entry.title, entry.first_prompt,
                        entry.source_format, entry.timed, entry.first_activity_ms, entry.model)


def stored_entry(fold: EntryFold) -> str:
    """A writer's fold as the text a database keeps beside the log (PostgreSQL's ``listing``).

    The entry in its index form (``size_bytes`` left out: kept apart) and ``sourceSeen``.
    """
    return _encode({"entry": _to_json(fold.entry) | {"size_bytes": None},
                    "sourceSeen": fold.source_seen, "v": STORED_VERSION}).decode()


def entry_from_stored(text: str) -> EntryFold | None:
    """The fold :func:`stored_entry` wrote, or None when ``text`` is not exactly that form.

    An entry with no ``"v"`` (stored before version 2) or of version 2 comes back marked
    :attr:`EntryFold.legacy`: it is right only if the log holds no :func:`is_hiding` event
    (version 2 did not honour an old adapter mark).
    """
    try:
        value = _decode(text.encode("utf-8", "surrogatepass"))
    except (orjson.JSONDecodeError, UnicodeError):
        return None
    if not isinstance(value, dict) or value.get("sourceSeen") not in (True, False, None):
        return None
    entry = _from_json(value.get("entry"))
    if entry is None or value.get("v", 1) not in (1, 2, STORED_VERSION):
        return None
    fold = EntryFold(entry, value["sourceSeen"])
    fold.legacy = value.get("v", 1) < STORED_VERSION
    return fold


def signature(st: os.stat_result) -> list[int]:
    """What identifies one state of a log file: size, mtime ns, ctime ns, inode, device."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


class JsonlIndex:
    """The JSONL listing sidecar of one store root (see the module docstring).

    Args:
        root: The store root; the index is ``root / .dsh-listing.json``.
    """

    def __init__(self, root: Path) -> None:
        self.path = root / INDEX_NAME
        self.journal = root / JOURNAL_NAME
        self._entries: dict[str, tuple[list[int], ListingEntry]] = {}
        self._changed = False
        self._journaled = False
        self._load()
        self._load_journal()

    def _load(self) -> None:
        try:
            raw = _decode(self.path.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, orjson.JSONDecodeError) as exc:
            log.info("listing index %s unreadable (%s); it is rebuilt", self.path, exc)
            self._changed = True
            return
        if not isinstance(raw, dict) or raw.get("version") != _INDEX_VERSION \
                or not isinstance(raw.get("logs"), dict):
            self._changed = True
            return
        for key, item in raw["logs"].items():
            if not isinstance(item, dict):
                continue
            sig = item.get("sig")
            entry = _from_json(item.get("entry"))
            if entry is not None and isinstance(sig, list) and all(type(v) is int for v in sig):
                self._entries[key] = (sig, entry)

    def _load_journal(self) -> None:
        try:
            data = self.journal.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.info("listing journal %s unreadable (%s); its logs are read", self.journal, exc)
            return
        self._journaled = bool(data)
        for line in data.split(b"\n"):
            try:
                item = _decode(line) if line else None
            except orjson.JSONDecodeError:
                continue  # a line a writer was still writing: that log is read in full
            if not isinstance(item, dict) or type(item.get("key")) is not str \
                    or item.get("v") != _INDEX_VERSION:
                continue  # (no "v": an older writer's line, whose titles may hold removed text)
            sig = item.get("sig")
            entry = _from_json(item.get("entry"))
            if entry is not None and isinstance(sig, list) and all(type(v) is int for v in sig):
                self._entries[item["key"]] = (sig, entry)
                self._changed = True

    def lookup(self, key: str, sig: list[int]) -> ListingEntry | None:
        """The entry of the log ``key`` (a root-relative path) if its signature still matches."""
        found = self._entries.get(key)
        return found[1] if found is not None and found[0] == sig else None

    def put(self, key: str, sig: list[int], entry: ListingEntry) -> None:
        """Record the entry of log ``key`` as of signature ``sig``."""
        self._entries[key] = (sig, entry)
        self._changed = True

    def retain(self, keys: Iterable[str]) -> None:
        """Forget logs not in ``keys`` (deleted sessions)."""
        keep = set(keys)
        for key in list(self._entries):
            if key not in keep:
                del self._entries[key]
                self._changed = True

    def save(self) -> None:
        """Write the index atomically if it changed; a read-only store just keeps no index."""
        if not self._changed:
            return
        payload = _encode({"version": _INDEX_VERSION, "logs": {
            key: {"sig": sig, "entry": _to_json(entry)}
            for key, (sig, entry) in sorted(self._entries.items())}})
        tmp = self.path.with_name(f"{self.path.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                view = memoryview(payload)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            self._changed = False
            if self._journaled:
                # merged above; a line a writer adds meanwhile is lost, so its log is read
                os.truncate(self.journal, 0)
                self._journaled = False
        except OSError as exc:
            log.info("listing index %s not written (%s); listing still works", self.path, exc)
            with contextlib.suppress(OSError):
                os.unlink(tmp)


# --- the backends ----------------------------------------------------------------------------

ReadFn = Callable[[str], tuple[FrozenDict, Sequence[Mapping[str, Any]]]]
"""``read(session_id) -> (header, committed events)``: the full read of one session."""


def read_entries(session_ids: Iterable[str], read: ReadFn
                 ) -> tuple[list[ListingEntry], list[DshError]]:
    """Entries of the given sessions from a full read of each (the plain backends' listing).

    Returns:
        The entries of sessions with at least one event, in ``session_ids`` order, and one
        error per log that could not be read (``where["session_id"]`` names it); one damaged
        log never hides the others.
    """
    entries: list[ListingEntry] = []
    errors: list[DshError] = []
    for sid in session_ids:
        try:
            header, events = read(sid)
        except DshError as error:
            error.where.setdefault("session_id", sid)
            errors.append(error)
            continue
        if events:
            entries.append(summarize(header, events))
    return entries, errors

"""The LangGraph saver's index of one thread, folded from its log and kept beside it.

:class:`ThreadIndex` says where each checkpoint, channel value and pending write of a thread
is in its dsh log (event seqs); the values themselves stay in the log and are read from there
when a checkpoint is built. The index is derived data: :func:`encode_index` writes it as an
aside of the thread's session (docs/stores.md#asides) with an anchor naming the events it
covers (their count and a digest of the last one), and :func:`decode_index` takes it back only
when that anchor matches the log; a reader then folds only the events after it (the tail). A
missing, stale or unreadable index is folded afresh from the whole log, which gives the same
answer (docs/adapters.md#fast-reads-of-a-thread).

The aside (format 4) is two JSON lines: a short *head* (the anchor, each namespace's last
checkpoint, the value rows and delta links that checkpoint most likely reads, the tool-call
answers and branch tips), then the whole index. A cold read of a thread's latest checkpoint
parses the head only (:func:`decode_index` with ``head=True``): an index marked
:attr:`ThreadIndex.partial`, which answers exactly for what it holds and says so when asked for
anything else (:attr:`ThreadIndex.missed`), so the caller reads the whole index instead.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from dsh.adapters._log import records_of
from dsh.adapters.langchain import FORMAT as LANGCHAIN_FORMAT
from dsh.session import Event, PagedLog

INDEX_ASIDE: Final = "langgraph-index"
"""The aside's name beside a thread's session."""
INDEX_VERSION: Final = 4
"""Version 4 puts a head line before the whole index; 3 (a list delta's blob row names the seq
of the value it extends) and 2 are read too."""

CHECKPOINT_EVENT: Final = "langgraph/checkpoint"
WRITES_EVENT: Final = "langgraph/writes"
DROP_EVENT: Final = "langgraph/drop"

_MESSAGES: Final = "messages"
WHOLE_EVERY_BOUND: Final = 1024
"""The longest delta chain the head follows (a writer stores a whole value every 64)."""

Writes = dict[tuple[str, int], tuple[str, str, Mapping[str, Any]]]
"""(task id, write index) -> (task path, channel, stored value)."""


@dataclass(slots=True)
class CheckpointEntry:
    """Where one checkpoint is in the log: its event's seq, its parent, its writes' events."""

    seq: int
    parent: str | None
    writes_at: list[int] = field(default_factory=list)  # seqs of its langgraph/writes events


@dataclass(slots=True)
class Namespace:
    """The checkpoints of one namespace, by id and in id order."""

    checkpoints: dict[str, CheckpointEntry] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # ids, ascending

    def add(self, checkpoint_id: str, entry: CheckpointEntry) -> None:
        if checkpoint_id not in self.checkpoints:
            bisect.insort(self.order, checkpoint_id)
        self.checkpoints[checkpoint_id] = entry

    def drop(self, checkpoint_id: str) -> None:
        if self.checkpoints.pop(checkpoint_id, None) is not None:
            self.order.remove(checkpoint_id)


class ThreadIndex:
    """Checkpoints, channel-value locations and projected messages of one thread, by seq.

    Attributes:
        namespaces: Checkpoint namespace -> its checkpoints.
        blobs: ``(ns, channel, version)`` -> seq of the checkpoint event storing that value.
        links: ``(ns, channel, seq)`` of a value stored as a list delta -> the seq of the
            event storing the value it extends (its chain's next link; a whole value, and a
            delta carrying a whole copy, has none). Not known for values taken from a
            version 2 index.
        projected: LangChain message id -> seq of the surface event made from it.
        answered: Tool call id -> seq of its ``tool/result``; a later ``tool/call`` reusing the
            id removes it (that result answered the earlier call).
        branches: Checkpoint id -> the fork session its messages are projected onto, for
            checkpoints of the root namespace that are not on the thread's own session.
        tips: Branch ("" for the thread's own session, else a fork session id) -> the id of
            the last root-namespace checkpoint put on it.
        current: The branch of the last root-namespace checkpoint put.
        seen: Events folded so far (the index covers ``events[:seen]``).
        partial: Only the head was read: each namespace's last checkpoint and the values and
            links it most likely reads (:func:`decode_index` with ``head=True``); ``projected``
            is empty. Never kept beside the log, never written through.
        missed: A partial index was asked for what it does not hold, or folded an event it
            cannot take exactly (a drop; a delta on a value it does not know): its answers
            are not to be trusted; read the whole index.
    """

    def __init__(self) -> None:
        self.namespaces: dict[str, Namespace] = {}
        self.blobs: dict[tuple[str, str, Any], int] = {}
        self.links: dict[tuple[str, str, int], int] = {}
        self.projected: dict[str, int] = {}
        self.answered: dict[str, int] = {}
        self.branches: dict[str, str] = {}
        self.tips: dict[str, str] = {}
        self.current = ""
        self.seen = 0
        self.partial = False
        self.missed = False

    def reset(self) -> None:
        """Forget every checkpoint and value (``delete_thread``'s drop)."""
        self.namespaces.clear()
        self.blobs.clear()
        self.links.clear()
        self.tips.clear()
        self.current = ""

    def branch(self, checkpoint_id: Any) -> str:
        """The branch a root-namespace checkpoint's messages are on ("": the thread's own)."""
        return self.branches.get(str(checkpoint_id), "") if checkpoint_id else ""

    def entry(self, ns: str, checkpoint_id: Any) -> CheckpointEntry | None:
        space = self.namespaces.get(ns)
        return space.checkpoints.get(str(checkpoint_id)) if space is not None else None

    def fold(self, events: Sequence[Event]) -> None:
        """Take in the events appended since the last fold (``events``: the whole log)."""
        for event in events[self.seen:]:
            kind = event["type"]
            if kind == CHECKPOINT_EVENT:
                data = event["data"]
                ns, seq = data["ns"], event["seq"]
                versions = data["versions"]
                for channel, stored in data["values"].items():
                    key = (ns, channel, versions[channel])
                    self.blobs[key] = seq
                    # a delta with a whole copy ends a chain as a whole value does
                    delta = "d" in stored and not has_copy(stored)
                    base = self.blobs.get((ns, channel, stored["d"])) if delta else None
                    if base is not None:
                        self.links[(ns, channel, seq)] = base
                    elif delta and self.partial:
                        self.missed = True
                self.namespaces.setdefault(ns, Namespace()).add(
                    data["id"], CheckpointEntry(seq, data["parent"]))
                if ns == "" and _MESSAGES in versions:
                    branch = data.get("branch") or ""
                    if branch:
                        self.branches[data["id"]] = branch
                    self.tips[branch] = data["id"]
                    self.current = branch
            elif kind == WRITES_EVENT:
                data = event["data"]
                found = self.entry(data["ns"], data["cp"])
                if found is not None:
                    found.writes_at.append(event["seq"])
            elif kind == DROP_EVENT:
                data = event["data"]
                if self.partial:  # what a drop leaves latest may be a checkpoint not read
                    self.missed = True
                if data.get("all"):
                    self.reset()
                else:
                    space = self.namespaces.get(data["ns"])
                    for checkpoint_id in data["ids"] if space is not None else ():
                        space.drop(checkpoint_id)  # type: ignore[union-attr]
            elif kind == "tool/call":
                # a provider may give a later call an earlier one's id (call_0 per request):
                # that earlier call's result does not answer this one
                self.answered.pop(str(event["data"].get("callId")), None)
            elif kind == "tool/result":
                message = event["data"]["message"]
                self.answered[str(message["source"].get("callId"))] = event["seq"]
            if kind in ("user/message", "assistant/message", "tool/result"):
                records = records_of(event, LANGCHAIN_FORMAT)
                if records:
                    message_id = records[0].get("data", {}).get("id")
                    if isinstance(message_id, str):
                        self.projected[message_id] = event["seq"]
        self.seen = len(events)


def has_copy(stored: Mapping[str, Any]) -> bool:
    """True when a stored list delta (``{"d", "k", "a"}``) also holds its whole value.

    Rule: docs/formats.md#langgraph-checkpoint-events (a copy is ``j``, or ``t`` with its
    bytes).
    """
    return "t" in stored or "j" in stored


class IndexMisledError(Exception):
    """An index taken from beside the log named an event that is not the one it says.

    A damaged or forged aside whose anchor still matches (docs/adapters.md#fast-reads-of-a-thread):
    the read that met it folds the log afresh instead of failing with whatever a wrong event
    gave (a bare ``KeyError``, an ``IndexError`` for a negative seq).
    """


def event_at(events: Sequence[Event], seq: Any, kind: str, **fields: Any) -> Mapping[str, Any]:
    """The data of the event at ``seq`` an index names, checked to be what the index says.

    ``kind``: its type; ``fields``: data members it must hold with these values.

    Raises:
        IndexMisledError: ``seq`` is no int in the log, or the event there is of another type
            or holds other values.
    """
    if type(seq) is not int or not 0 <= seq < len(events):
        raise IndexMisledError(f"seq {seq!r} is not in the log ({len(events)} events)")
    event = events[seq]
    data = event["data"]
    if event["type"] != kind or not isinstance(data, dict) or any(
            data.get(name, _ABSENT) != value for name, value in fields.items()):
        raise IndexMisledError(f"event {seq} is no {kind} of {fields!r}")
    return data


_ABSENT: Final = object()


def writes_of(entry: CheckpointEntry, events: Sequence[Event], ns: str,
              checkpoint_id: str) -> Writes:
    """The pending writes of a checkpoint, read from its writes events in log order.

    The first write of a task and index stays; a special one (index < 0: error, interrupt…)
    replaces an earlier one, as LangGraph's own savers do.

    Raises:
        IndexMisledError: a seq of ``entry.writes_at`` names no writes event of that checkpoint.
    """
    writes: Writes = {}
    for seq in entry.writes_at:
        data = event_at(events, seq, WRITES_EVENT, ns=ns)
        if str(data.get("cp")) != checkpoint_id:  # as fold() files it
            raise IndexMisledError(f"event {seq} holds writes of another checkpoint")
        for idx, channel, stored in data["w"]:
            key = (data["task"], idx)
            if idx < 0 or key not in writes:
                writes[key] = (data["path"], channel, stored)
    return writes


def event_digest(event: Event) -> str:
    """A digest of one event as JSON (the anchor of an index on its last covered event)."""
    return hashlib.sha256(orjson.dumps(event)).hexdigest()[:32]


def encode_index(index: ThreadIndex, events: Sequence[Event]) -> bytes | None:
    """The aside bytes of ``index`` (covering ``events[:index.seen]``); None for nothing to do.

    Two JSON lines: the head (see the module docstring), then the whole index. None too when
    a channel version is not plain JSON (the index then is not kept), or for a partial index.
    """
    count = index.seen
    if count == 0 or index.partial:
        return None
    anchor = {"v": INDEX_VERSION, "count": count, "last": event_digest(events[count - 1])}
    rows = [[ns, channel, version, seq, index.links.get((ns, channel, seq))]
            for (ns, channel, version), seq in index.blobs.items()]
    heads = {ns: space.order[-1] for ns, space in index.namespaces.items() if space.order}
    head = {**anchor,
            "ns": {ns: _entry_row(cid, index.namespaces[ns].checkpoints[cid])
                   for ns, cid in heads.items()},
            "blobs": _head_rows(rows, heads), "answered": index.answered,
            "branches": {cid: index.branches[cid] for cid in heads.values()
                         if cid in index.branches},
            "tips": index.tips, "current": index.current}
    body = {**anchor,
            "ns": {ns: [_entry_row(cid, space.checkpoints[cid]) for cid in space.order]
                   for ns, space in index.namespaces.items()},
            "blobs": rows, "projected": index.projected, "answered": index.answered,
            "branches": index.branches, "tips": index.tips, "current": index.current}
    try:
        return orjson.dumps(head) + b"\n" + orjson.dumps(body)
    except (orjson.JSONEncodeError, TypeError):
        return None


def _entry_row(checkpoint_id: str, entry: CheckpointEntry) -> list[Any]:
    return [checkpoint_id, entry.seq, entry.parent, entry.writes_at]


def _head_rows(rows: list[list[Any]], heads: Mapping[str, str]) -> list[list[Any]]:
    """The value rows a namespace's last checkpoint most likely reads, with their chains.

    Per channel of a namespace with checkpoints, the value stored last (what a thread that
    did not travel back in time reads), then each value its delta extends, down to a whole
    one. A read asking for any other value finds it missing and reads the whole index.
    """
    newest: dict[tuple[str, str], list[Any]] = {}
    by_seq: dict[tuple[str, str, int], list[Any]] = {}
    for row in rows:
        ns, channel, _, seq, _ = row
        if ns in heads:
            by_seq[(ns, channel, seq)] = row
            found = newest.get((ns, channel))
            if found is None or seq > found[3]:
                newest[(ns, channel)] = row
    out: list[list[Any]] = []
    for first in newest.values():
        link: list[Any] | None = first
        for _ in range(WHOLE_EVERY_BOUND):
            if link is None:
                break
            out.append(link)
            base = link[4]
            link = by_seq.get((link[0], link[1], base)) if base is not None else None
    return out


def decode_index(data: bytes, events: Sequence[Event], stored: int, *,
                 wanted: Callable[[ThreadIndex], Iterable[int]] | None = None,
                 head: bool = False) -> ThreadIndex | None:
    """The index in ``data`` when its anchor matches ``events`` (``stored`` committed), else None.

    Its anchor must name at most the committed events and the digest of the last one it
    covers; a body that does not parse or has another shape is None as well (folded afresh).
    ``head``: parse only a format 4 index's head line (a :attr:`ThreadIndex.partial` index;
    ``data`` may be that line alone, with its newline); an older format is read whole.
    On a paged log, the last covered event and the seqs ``wanted`` names from the index (what
    the caller reads next) are read in one source call before the anchor is checked
    (:meth:`dsh.session.PagedLog.pick`); an index whose anchor then fails is not used.
    """
    try:
        first, newline, rest = data.partition(b"\n")
        body = orjson.loads(first if head or not newline else rest)
        count = body["count"]
        version = body.get("v")
        if version not in (2, 3, INDEX_VERSION) or type(count) is not int \
                or not 0 < count <= stored or (version == INDEX_VERSION) != bool(newline):
            return None
        index = ThreadIndex()
        if version == INDEX_VERSION and head:
            index.partial = True
            for ns, (cid, seq, parent, writes_at) in body["ns"].items():
                index.namespaces[ns] = Namespace(
                    {cid: CheckpointEntry(int(seq), parent, list(writes_at))}, [cid])
        else:
            for ns, rows in body["ns"].items():
                space = index.namespaces[ns] = Namespace(
                    {cid: CheckpointEntry(int(seq), parent, list(writes_at))
                     for cid, seq, parent, writes_at in rows}, [row[0] for row in rows])
                if len(space.order) != len(space.checkpoints) \
                        or space.order != sorted(space.order):
                    return None
        rows = body["blobs"]
        if version == 2:
            index.blobs = {(ns, channel, value_version): int(seq)
                           for ns, channel, value_version, seq in rows}
        else:
            index.blobs = {(ns, channel, value_version): int(seq)
                           for ns, channel, value_version, seq, _ in rows}
            index.links = {(ns, channel, int(seq)): int(base)
                           for ns, channel, _, seq, base in rows if base is not None}
        # the parsed maps are the index's own (no copies): their shape is checked
        index.projected = {} if index.partial else _str_map(body["projected"])
        index.answered = _str_map(body["answered"])
        index.branches = _str_map(body["branches"])
        index.tips = _str_map(body["tips"])
        index.current = str(body["current"])
        index.seen = count
        if isinstance(events, PagedLog):
            events.pick([count - 1, *(wanted(index) if wanted is not None else ())])
        if event_digest(events[count - 1]) != body["last"]:
            return None
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError,
            IndexError):
        return None
    return index


def _str_map(value: Any) -> Any:
    """``value`` itself when it is a dict (parsed JSON: string keys), else TypeError."""
    if type(value) is not dict:
        raise TypeError(f"an index map is a JSON object, got {type(value).__name__}")
    return value

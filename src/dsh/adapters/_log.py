"""What the framework adapters share: the live session they write, its turn shape, records.

A framework hands the adapter a flat list of messages; dsh wants them inside turns and steps
(docs/events.md#a-turn-event-by-event). :class:`TurnShaper` infers that bracket and writes through
dsh's recorder (:mod:`dsh.agent._recorder`), so an adapter cannot write a malformed log. A resumed
(crash-repaired) or forked session continues with the next turn number.

Each framework record is kept verbatim under :data:`RECORD_KEY` (``{"format", "records":
[...]}``): in the message's ``source`` (sources are extensible, docs/events.md#messages), and for a
``tool/result`` in its ``data.meta`` (tool-private data). A reader gets back exactly what the
framework wrote, while ``content`` holds dsh blocks for the model view.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, MutableSequence, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar, cast, overload

import orjson

from dsh._errors import (
    HELD_HERE_ADVICE,
    AdapterClosedError,
    AdapterError,
    LogCorruptError,
    SessionBusyError,
    SessionNotFoundError,
)
from dsh.adapters._records import RECORD_KEY as RECORD_KEY
from dsh.adapters._records import record_picker, records_at
from dsh.agent import Recorder, StepRecorder, TurnRecorder
from dsh.json import FrozenDict, FrozenList, thaw
from dsh.persistence import (
    HoldsResume,
    Persistence,
    SelectsEvents,
    WriteBehind,
    conforms,
    open_backend,
    read_pages,
)
from dsh.session import (
    PAGE_EVENTS,
    REMOVAL_MODEL,
    Event,
    NodeSeqs,
    PagedLog,
    Session,
    SessionStore,
    append_removals,
    append_withheld,
    open_turn_closers,
    removal_runs,
)
from dsh.session import REMOVED_RESULT_TEXT as REMOVED_RESULT_TEXT

_T = TypeVar("_T")

DEFAULT_WAIT_S: Final = 5.0
"""How long an adapter waits for a session another process is writing (seconds), as the CLI."""

logger = logging.getLogger(__name__)


def _holder(error: SessionBusyError) -> str:
    since = error.where.get("since")
    text = error.holder_phrase()
    if isinstance(since, int):
        text += f" since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since / 1000))}"
    return text


def wait_for_writer(open_session: Callable[[], _T], wait_s: float) -> _T:
    """Call ``open_session`` until the session's other writer lets go, for up to ``wait_s``.

    Returns:
        What ``open_session`` returned.

    Raises:
        SessionBusyError: still held after ``wait_s`` seconds (or held by this process, which
            never lets go while we wait); the message names the holder (pid, host, since) and
            how long was waited.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return open_session()
        except SessionBusyError as error:
            here = error.held_here
            if here or time.monotonic() >= deadline:
                sid = error.where.get("session_id")
                advice = (HELD_HERE_ADVICE if here else
                          f"waited {wait_s:g} s for it. Let that process finish (or stop it), "
                          "or pass a longer wait=")
                raise SessionBusyError(
                    f"session {sid!r} is being written by {_holder(error)}; {advice}",
                    code=error.code, session_id=str(sid) if sid else None) from error
            time.sleep(0.05)


def is_removal(event: Mapping[str, Any]) -> bool:
    """True for the empty ``assistant/message`` replace that :func:`remove_from_surface` writes."""
    if event["type"] != "assistant/message" or event.get("surfaceOp") in (None, "append"):
        return False
    data = event["data"]  # (an object in a valid log; a changed row's data may be anything)
    message = data.get("message") if isinstance(data, Mapping) else None
    source = message.get("source") if isinstance(message, Mapping) else None
    return (isinstance(source, Mapping) and source.get("provider") == "dsh"
            and source.get("model") == REMOVAL_MODEL and "removal" in source)


def remove_from_surface(shaper: TurnShaper, seqs: Sequence[int], *, form: str,
                        replacement: Mapping[str, Any] | None = None) -> list[Event]:
    """Take the surface nodes ``seqs`` off the model view; the log keeps their bytes.

    Each run of consecutive surface nodes among ``seqs`` is shadowed by one ``assistant/message``
    replace whose content is empty, which projects no message (core: an assistant message with
    empty content derives none), citing the nodes it shadows in ``sourceEventSeqs``. Each sits
    in a step of its own, in one turn, so the log keeps its turn/step invariants. With
    ``replacement`` (one run only), that assistant message stands in for the run instead (a pop
    of one record out of a grouped event). A ``system/message`` at surface node 0 stays: only a
    system message may shadow it. (:func:`dsh.session.append_removals` writes them.)

    Args:
        shaper: The live session's turn bracket; its open turn is ended first.
        seqs: Surface node seqs to remove (others are ignored).
        form: Why (``clear``, ``pop``, ``langgraph-state``...), kept in the source.
        replacement: An assistant message to put in place of the run instead of nothing.

    Returns:
        The appended events (turn and step brackets included).

    Rule: docs/adapters.md#cleared-means-cleared
    """
    session = shaper.session
    runs = removal_runs(session, seqs)
    if not runs:
        return []
    if replacement is not None and len(runs) != 1:
        raise AdapterError(f"a replacement stands in for one run of surface nodes; got "
                           f"{len(runs)}", code="ADAPTER_ITEM", session_id=session.id)
    shaper.end_turn()
    return append_removals(session, runs, form=form, turn=shaper.recorder.next_turn,
                           replacement=replacement)


def withhold_result(shaper: TurnShaper, seq: int, fmt: str) -> Event:
    """Take the ``tool/result`` at surface node ``seq`` off the model view; its call stays answered.

    A popped function output leaves its call on the view, and every call needs a result
    (``dsh verify``, a provider's request): the node is replaced, in a turn and step of its
    own, by a content-only rewrite of the result (as a quarantine placeholder is,
    docs/forgetting.md#quarantine) whose text is :data:`REMOVED_RESULT_TEXT`, and an
    ``<fmt>/closed-early`` mark names the placeholder, so the framework reads no item for it
    (:func:`dsh.session.append_withheld` writes them). The log keeps the result's bytes.

    Returns:
        The placeholder event.

    Rule: docs/adapters.md#cleared-means-cleared
    """
    shaper.end_turn()
    return append_withheld(shaper.session, seq, fmt, turn=shaper.recorder.next_turn)


def _call_ids(records: Sequence[Any]) -> set[str]:
    """The call ids of the function-call records among ``records`` (Responses items)."""
    return {str(r.get("call_id")) for r in records
            if isinstance(r, Mapping) and r.get("type") == "function_call"}


def _results_of(session: Session, seq: int, call_ids: set[str]) -> list[int]:
    """The surface nodes after ``seq`` that are ``tool/result`` answering one of ``call_ids``.

    A call that leaves the model view takes its result with it (a placeholder
    :func:`withhold_result` left, or a result the framework never read): a result whose call is
    gone is an orphan (``dsh verify``).
    """
    if not call_ids:
        return []
    found = []
    for node in reversed(session.surface.nodes):  # (results follow their call: the tail only)
        if node == seq:
            break
        event = session.event_at(node)
        source = (message_of(event) or {}).get("source")
        if (event["type"] == "tool/result" and isinstance(source, Mapping)
                and source.get("callId") in call_ids):
            found.append(node)
    return found[::-1]


PREFETCH_EVENTS: Final = 4096
"""Events of the log a whole-history read selects from per storage read (see
:meth:`LiveLog.view`): the rows read at once, bounding the memory of the read."""

LOADS_TEXTS: Final = 256
"""Records parsed by one ``orjson.loads`` when a read returns many (see ``_loads_texts``).

What one parse holds beside the records it returns (the joined text and orjson's document of
it) is a transient peak: 2,048 SDK items a parse put ~1.5 MB more on a 10k-item process's peak
RSS than 256 (VmHWM, medians of 5 fresh processes), for the same CPU (~3.3 ms for 10k items at
2,048, 1,024, 512, 256 or 128 a parse)."""


HELD_READ_RECORDS: Final = 1024
"""The most records :meth:`LiveLog.records_held` returns on the caller's thread (see there).

Parsing them takes well under the interpreter's 5 ms thread switch interval (0.36 ms for
1,024 SDK items at load 15 on this machine): work that holds the GIL that briefly keeps an
event loop thread waiting as long on a worker thread as on its own, so only a read that can
wait for storage or for a lock gains anything from a thread hop."""


RESTORE_POINT_TAIL: Final = 256
"""The adapters' stores keep a restore point at most about this many events behind a live
session's end, and one at its end when the session is closed (``WriteBehind.restore_point_tail``):
a framework reads its sessions cold, in another process, far more often than it writes them."""


def open_store(url: str, *, flush_only: bool = False) -> Persistence:
    """The store at ``url`` as the adapters open it, with their restore point policy.

    See :data:`RESTORE_POINT_TAIL` and docs/rules.md#restore-points-are-never-the-truth.
    ``flush_only``: its sessions are written by their flushes only, on the caller's thread,
    with no writer thread (``WriteBehind.flush_only``): for an adapter that flushes after
    every call.

    Raises:
        DshError: what :func:`dsh.persistence.open_backend` raises for the URL.
    """
    return Persistence(open_backend(url), write_behind=WriteBehind(
        restore_point_tail=RESTORE_POINT_TAIL, flush_only=flush_only))


def default_store_url() -> str:
    """``sqlite:///<$DSH_HOME or ~/.dsh>/sessions.db``, the store the ``dsh`` command reads."""
    home = Path(os.environ.get("DSH_HOME") or Path.home() / ".dsh").expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'sessions.db'}"


def with_records(source: Mapping[str, Any], fmt: str, records: Sequence[Any]) -> dict[str, Any]:
    """Return ``source`` plus ``{RECORD_KEY: {"format": fmt, "records": records}}``."""
    return {**source, RECORD_KEY: {"format": fmt, "records": list(records)}}


def message_of(event: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The message of a surface event (``data`` or ``data.message``), else None."""
    # dict checks, not Mapping: stored events are frozen dicts, and this runs once per item
    # of a cold read (the abc check was a fifth of it)
    etype = event["type"]
    data = event["data"]
    if etype in ("user/message", "system/message"):
        return data if isinstance(data, dict) else None
    if etype in ("assistant/message", "tool/result") and isinstance(data, dict):
        message = data.get("message")
        return message if isinstance(message, dict) else None
    return None


def records_of(event: Mapping[str, Any], fmt: str) -> Sequence[Any] | None:
    """The framework records (frozen, as stored) a surface event was made from, or None.

    None when the event carries no record of format ``fmt``: it was written by dsh itself (a
    crash-repair result, a compaction summary) or by another tool.
    """
    return records_at(event["type"], event["data"], fmt)


def _encode(record: Any) -> bytes | None:
    """``record`` as JSON bytes, or None when orjson cannot hold it (a lone surrogate).

    The bytes are a copy of exactly their length: orjson's own result keeps the whole 4 KiB
    buffer it wrote into, which for a cache of 100k short items is 400 MB.
    """
    try:
        return memoryview(orjson.dumps(record)).tobytes()
    except orjson.JSONEncodeError:
        return None


def _copy(event: Event, index: int, fmt: str,
          synthesize: Callable[[Event], Sequence[Any]]) -> Any:
    """A fresh plain copy of record ``index`` of ``event`` (the path for unencodable ones)."""
    records = records_of(event, fmt)
    record = (records if records is not None else synthesize(event))[index]
    return thaw(record) if isinstance(record, FrozenDict | FrozenList) else copy.deepcopy(record)


def text_of(blocks: Any) -> str:
    """The text of ``text`` blocks (and of nested tool-result content), joined by newlines."""
    parts: list[str] = []
    for block in blocks if isinstance(blocks, Sequence) else ():
        if not isinstance(block, Mapping):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif block.get("type") == "tool-result":
            parts.append(text_of(block.get("content")))
    return "\n".join(parts)


class TurnShaper:
    """Puts a framework's flat message list into turns and steps through dsh's recorder.

    Rules (the framework says nothing about turns, so they are inferred):

    * a user message opens a turn, or joins the open step while it has no model output yet;
      after model output it ends the turn (``completed``) and opens the next;
    * model output opens a turn if none is open, and the next step when the open step already
      has its assistant message;
    * a tool result answers a pending ``tool/call`` of the open step;
    * other input after model output goes into the next step.

    Ending a step or turn answers calls left without a result (the recorder's rule), so the
    model view never shows a call without its result. The framework never saw those results:
    their seqs are logged in an ignorable ``<fmt>/closed-early {seqs}`` event, and
    :meth:`LiveLog.view` leaves them out when it gives the framework its records back.

    Args:
        recorder: The recorder of the live session (its log ends outside any turn).
        fmt: The adapter's record format, the namespace of its custom event types.
    """

    def __init__(self, recorder: Recorder, fmt: str) -> None:
        self.recorder = recorder
        self.fmt = fmt
        self._turn: TurnRecorder | None = None
        self._step: StepRecorder | None = None

    def _closing(self, close: Callable[[], object], step: StepRecorder | None) -> None:
        """Run ``close`` (a step or turn end) and log the results it had to synthesize.

        ``step`` is the open step ``close`` ends (None: none is open). Ending a step
        synthesizes a result only for a call of it that has none (the recorder's rule): with
        none unanswered, nothing is looked for.
        """
        if step is None or not step.unanswered:
            close()
            return
        before = self.session.seq
        close()
        synthesized = [event["seq"] for event in self.session.events[before:]
                       if event["type"] == "tool/result"]
        if synthesized:
            self.mark(f"{self.fmt}/closed-early", {"seqs": synthesized})

    @property
    def session(self) -> Session:
        """The live session recorded into."""
        return self.recorder.session

    def _open_step(self, *, after_model: bool) -> StepRecorder:
        if self._turn is None:
            self._turn = self.recorder.turn()
        if self._step is not None and after_model and self._step.assistant_event is not None:
            self._closing(self._step.end, self._step)
            self._step = None
        if self._step is None:
            self._step = self._turn.step()
        return self._step

    @property
    def pending(self) -> tuple[str, ...]:
        """Call ids of the open step's assistant message that have no result yet."""
        return self._step.unanswered if self._step is not None else ()

    def end_turn(self) -> None:
        """End the open turn as ``completed`` (answering unanswered calls); no-op between turns."""
        if self._turn is not None:
            self._closing(self._turn.end, self._turn.current_step)
        self._turn = self._step = None

    def user(self, message: Mapping[str, Any]) -> Event:
        """Append a whole user message (a turn's input)."""
        if self._step is not None and self._step.assistant_event is not None:
            self.end_turn()
        return self._open_step(after_model=False).user_message(message)

    def input(self, message: Mapping[str, Any]) -> Event:
        """Append a whole user message that is not a prompt (it stays in the open turn)."""
        return self._open_step(after_model=True).user_message(message)

    def assistant(self, message: Mapping[str, Any]) -> Event:
        """Append a whole assistant message; its tool-call blocks are then :meth:`tool_call`."""
        return self._open_step(after_model=True).assistant(message=message)

    def tool_call(self, call_id: str) -> Event:
        """Append ``tool/call`` for a tool-call block of the step's assistant message."""
        assert self._step is not None
        return self._step.tool_call(call_id)

    def dispatch(self, call_id: str) -> Event | None:
        """Append ``tool/call`` for ``call_id`` unless it is recorded (or answered) already.

        Returns:
            The appended event, or None when there was nothing to record.
        """
        step = self._step
        if step is None or call_id not in step.unanswered or call_id in step.dispatched:
            return None
        return step.tool_call(call_id)

    def can_answer(self, call_id: str) -> bool:
        """True when ``call_id`` was called in the open step and has no result yet."""
        return call_id in self.pending

    def tool_result(self, call_id: str, content: list[Any], *, records: Sequence[Any],
                    fmt: str, is_error: bool = False) -> Event:
        """Append the ``tool/result`` of ``call_id`` (check :meth:`can_answer` first).

        The records are kept in ``data.meta`` (the recorder makes the message itself).
        """
        assert self._step is not None
        self.dispatch(call_id)
        return self._step.tool_result(call_id, content, is_error=is_error,
                                      meta={RECORD_KEY: {"format": fmt, "records": list(records)}})

    def mark(self, etype: str, data: Mapping[str, Any]) -> Event:
        """Append an adapter operation (pop, clear) as an ``ignorable`` custom event."""
        return self.recorder.custom(etype, dict(data))


class _Marks:
    """What an adapter's own events say about the model view of its records.

    ``<fmt>/records {seq, records}`` (records standing for an earlier event), and from logs
    written before removals went onto the surface: ``<fmt>/pop {seq, index}``,
    ``<fmt>/clear {through}``; ``<fmt>/closed-early {seqs}`` (results the framework never saw).

    Every mark is about an earlier event, so the log is read lazily from its end: a walk back
    along the surface calls :meth:`cover` with each seq before it uses that seq's marks, and
    only the events after that seq are read (the tail, for ``get_items(limit)``).

    A mark of another shape than the adapter writes (a row changed, or appended by another
    program) is ``LogCorruptError`` naming ``session_id`` and its seq, never a bare
    ``KeyError`` nor records taken from it (docs/rules.md#the-read-pipeline).

    Args:
        fmt: The adapter's record format.
        events: The log as it is now (its later events come through :meth:`feed`).
        session_id: The session, named in errors.
    """

    def __init__(self, fmt: str, events: Sequence[Event], session_id: str | None = None) -> None:
        self.session_id = session_id
        self.damage: LogCorruptError | None = None  # the first bad mark taken in (_bad)
        self.kinds = (f"{fmt}/records", f"{fmt}/pop", f"{fmt}/clear", f"{fmt}/closed-early")
        self.kind_set = frozenset(self.kinds)  # (a selection tests every row of a range)
        self.removed: set[tuple[int, int]] = set()
        self.cleared_through = -1
        self.overrides: dict[int, Sequence[Any]] = {}
        self.events = events
        self.low = self.seen = len(events)  # events[low:seen] are taken in

    @property
    def needs_walk(self) -> bool:
        """Whether the model view needs the walk back along the surface.

        False when every mark is taken in (``low == 0``) and none removes, clears or
        overrides a record: then each surface node's records, in order, are the view.
        """
        return self.low != 0 or bool(self.removed or self.overrides) or self.cleared_through >= 0

    def feed(self, events: Sequence[Event]) -> None:
        """Take in the events appended since the last call (``events``: the log now)."""
        self.events = events
        if self.seen < len(events):
            self.overrides.update(self._take(events[self.seen:]))
            self.seen = len(events)

    def cover(self, seq: int) -> None:
        """Take in every event after ``seq`` (all marks about ``seq`` lie there).

        Down to the page holding ``seq``: a walk back takes in a page at a time.
        """
        if seq + 1 < self.low:
            low = min(seq + 1, seq // PAGE_EVENTS * PAGE_EVENTS)
            for target, records in self._take(self.events[low:self.low]).items():
                self.overrides.setdefault(target, records)  # a later mark wins
            self.low = low

    def take_below(self, low: int, marks: Sequence[Mapping[str, Any]]) -> None:
        """Take in ``events[low:self.low]``, given as the adapter marks among them (in order)."""
        if low < self.low:
            for target, records in self._take(marks).items():
                self.overrides.setdefault(target, records)  # a later mark wins
            self.low = low

    def _take(self, events: Sequence[Mapping[str, Any]]) -> dict[int, Sequence[Any]]:
        """Take in ``events`` (in order); returns the records overrides among them."""
        overrides: dict[int, Sequence[Any]] = {}
        kinds = self.kinds
        records, pop, clear, early = kinds
        for event in events:
            kind = event["type"]
            if kind not in kinds:
                continue
            if kind == records:
                overrides[self._int(event, "seq")] = self._list(event, "records")
            elif kind == pop:
                self.removed.add((self._int(event, "seq"), self._int(event, "index")))
            elif kind == clear:
                self.cleared_through = max(self.cleared_through, self._int(event, "through"))
            elif kind == early:
                seqs = self._list(event, "seqs")
                if not all(type(seq) is int for seq in seqs):
                    raise self._bad(event, "seqs")
                self.removed.update((seq, 0) for seq in seqs)
        return overrides

    def _bad(self, event: Mapping[str, Any], field: str) -> LogCorruptError:
        """A mark whose ``data.<field>`` is missing or of the wrong shape, named.

        The first one is kept as :attr:`damage`: the stored log holds it for good, so the
        adapter's next write is refused (:meth:`LiveLog._found_damage`).
        """
        seq = event.get("seq")
        bad = LogCorruptError(
            f"stored session {self.session_id!r} failed validation: the adapter mark "
            f"{event['type']} at seq {seq} has no valid data.{field} (as this adapter writes "
            "it); run dsh verify", session_id=self.session_id,
            seq=seq if type(seq) is int else None)
        if self.damage is None:
            self.damage = bad
        return bad

    def _int(self, event: Mapping[str, Any], field: str) -> int:
        """``data.<field>`` of a mark: an int (not a bool), else :meth:`_bad`."""
        data = event["data"]
        value = data.get(field) if isinstance(data, Mapping) else None
        if type(value) is not int:
            raise self._bad(event, field)
        return value

    def _list(self, event: Mapping[str, Any], field: str) -> Sequence[Any]:
        """``data.<field>`` of a mark: a JSON array (a list, frozen or not), else :meth:`_bad`."""
        data = event["data"]
        value = data.get(field) if isinstance(data, Mapping) else None
        if not isinstance(value, list):
            raise self._bad(event, field)
        return value


def surface_nodes(events: Sequence[Event], nodes: Sequence[int] = (), *,
                  session_id: str | None = None) -> Sequence[int]:
    """The surface node seqs of a stored log (appends and replaces, in order), read-only.

    ``nodes``: the surface before ``events`` (a restore point's), folded on from there. A
    restore point's packed seqs stay the int64 array they were checked through, not copied
    (no int object per node, and no copy of 800 KB at 100k items: a cold read of the latest
    items walks back only a few of them, and the write's resume then takes that array over
    without inflating the packed nodes again); seqs ``events`` append follow them
    (:class:`_NodesThen`). A replace among ``events`` folds into a copy.

    Raises:
        LogCorruptError: a replace whose start or end is not on the surface, or whose end
            lies before its start (a row no writer wrote: a resume refuses it the same way),
            naming ``session_id`` and the replace's seq, never a bare ``ValueError`` nor a
            wrong surface (docs/rules.md#the-read-pipeline).
    """
    if isinstance(nodes, NodeSeqs):
        more: list[int] = []
        for event in events:
            op = event.get("surfaceOp")
            if op is None:
                continue
            if op != "append":
                break
            more.append(event["seq"])
        else:
            return _NodesThen(nodes, more) if more else nodes
    out: MutableSequence[int] = (
        NodeSeqs.from_little_endian(nodes.little_endian()).to_array()
        if isinstance(nodes, NodeSeqs) else list(nodes))
    for event in events:
        op = event.get("surfaceOp")
        if op is None:
            continue
        if op == "append":
            out.append(event["seq"])
        else:
            first, last = _replaced(out, event, session_id)
            del out[first + 1:last + 1]
            out[first] = event["seq"]
    return out


def _replaced(nodes: Sequence[int], event: Event, session_id: str | None) -> tuple[int, int]:
    """The positions in ``nodes`` of the first and last node ``event``'s replace shadows.

    Raises:
        LogCorruptError: its start or end is not in ``nodes``, or the end lies before the
            start (what Surface.plan refuses at a resume, named as the resume names it).
    """
    op, seq = event["surfaceOp"], event["seq"]
    start, end = (op.get("start"), op.get("end")) if isinstance(op, Mapping) else (None, None)
    try:
        first = nodes.index(start)  # (None, or no int: not found)
        last = nodes.index(end)
    except (ValueError, TypeError):
        first = last = -1
    if first < 0 or last < first:
        raise LogCorruptError(
            f"stored session {session_id!r} failed validation: the surface replace at seq "
            f"{seq} shadows no run of surface nodes (its start or end is not on the surface, "
            "or the end lies before the start)", session_id=session_id, seq=seq)
    return first, last


class _NodesThen(Sequence[int]):
    """Read-only node seqs: a restore point's packed ones, then the seqs appended after its cut.

    Args:
        base: The restore point's nodes (not copied).
        more: The seqs appended since, in order.
    """

    __slots__ = ("_base", "_more", "_split")

    def __init__(self, base: NodeSeqs, more: list[int]) -> None:
        self._base = base
        self._more = more
        self._split = len(base)

    def __len__(self) -> int:
        return self._split + len(self._more)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            split = self._split
            if step == 1:  # a run: one slice of the base (a tailed base reads its tail alone)
                return [*self._base[min(start, split):min(max(stop, start), split)],
                        *self._more[max(start - split, 0):max(stop - split, 0)]]
            return [self[i] for i in range(start, stop, step)]
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError("node index out of range")
        split = self._split
        return self._base[position] if position < split else self._more[position - split]

    def __iter__(self) -> Iterator[int]:
        # (C-level: a whole-history read passes over every node several times)
        return itertools.chain(self._base, self._more)

    def __reversed__(self) -> Iterator[int]:
        # (a generator: the base's walk back, which may inflate its head, starts only when
        # the walk reaches it; a limited read stops in the seqs after the cut)
        yield from reversed(self._more)
        yield from reversed(self._base)


def read_stored(persistence: Persistence, session_id: str, *,
                aside_heads: Sequence[str] = (),
                heads: dict[str, bytes | None] | None = None,
                ) -> tuple[Sequence[Event], int, tuple[Event, ...], Sequence[int]] | None:
    """The stored log as a resume would see it, read without a lock; None when not stored.

    Read by page through the log's restore point when it has one (only its tail is read now;
    earlier events are paged in when indexed), else whole. The heads of the asides
    ``aside_heads`` names, where the backend reads them with the lookup
    (:attr:`dsh.persistence.StoredPages.aside_heads`), are put in ``heads``.

    Returns:
        ``(events, stored, closers, nodes)``: the committed events then the repair closers a
        resume would append (in memory only), the count of committed events, the closers, and
        the surface node seqs of ``events`` (read-only).

    Raises:
        LogCorruptError, SessionFormatUnsupportedError, UnknownEventTypeError: as a full read.

    Rule: docs/adapters.md#busy-sessions-reads-and-names
    """
    try:
        pages = read_pages(persistence, session_id, aside_heads=aside_heads)
    except SessionNotFoundError:
        return None
    if heads is not None:
        heads.update(pages.aside_heads)
    state = pages.restore
    events: Sequence[Event]
    if not pages.paged:
        events, closers = pages.events, pages.closers
        nodes = surface_nodes((*events, *closers) if closers else events,
                              session_id=session_id)
    elif state is None or not isinstance(pages.events, PagedLog):  # paged by range
        read = persistence.read(session_id)
        events, closers = read.stored_events, read.closers
        nodes = surface_nodes(read.events, session_id=session_id)
    else:
        log = pages.events
        cut = state.event_count
        tail = list(log[cut:])
        # the closers a resume appends (persistence's resume reads the same window)
        if state.turn_open and not any(e["type"] in ("turn/start", "turn/end") for e in tail):
            window, base = [*log[state.turn_boundary:cut], *tail], state.turn_boundary
        else:
            window, base = tail, cut
        closers = open_turn_closers(window, "interrupted", base_seq=base)
        events = log
        nodes = surface_nodes(tail + list(closers), state.nodes, session_id=session_id)
    stored = len(events)
    if closers:
        if isinstance(events, PagedLog):
            events.extend(closers)
        else:
            events = (*events, *closers)
    return events, stored, closers, nodes


def _loads_texts(texts: list[bytes]) -> list[Any]:
    """The values of JSON ``texts`` in order, parsed :data:`LOADS_TEXTS` at a time.

    Each part is one ``orjson.loads`` of an array text built in one copy (its brackets put on
    its first and last text, not added to the whole). Parts bound what a parse holds beside
    its result: ``orjson.loads`` of one array of 100k SDK items (14 MB of text) held the
    array text and the parser's document of all of it at once, ~40 MB of RSS above the
    records it returned, at the peak of a whole-history read.
    """
    out: list[Any] = []
    for at in range(0, len(texts), LOADS_TEXTS):
        part = texts[at:at + LOADS_TEXTS]
        part[0] = b"[" + part[0]
        part[-1] = part[-1] + b"]"  # (the first again when there is one text)
        out.extend(orjson.loads(b",".join(part)))
    return out


def _whole_view(nodes: Sequence[int], marks: _Marks,
                cache: dict[int, tuple[bytes | None, ...]]) -> list[Any] | None:
    """:meth:`LiveLog._view` of the whole history in C-level passes, when nothing needs a walk.

    That is: every mark taken in (``marks.low == 0``), none of them removing, clearing or
    overriding anything, and every node's records in ``cache`` as exactly one JSON text (what
    the walk's common case appends, one by one). Then the walk's answer is each node's one
    record at index 0, in node order: returned as those records alone (parsed by
    ``_loads_texts``, one per node of ``nodes``). None otherwise (the walk runs).
    """
    if marks.needs_walk:
        return None
    found = cast("Iterator[tuple[bytes | None, ...]]", map(cache.get, nodes))
    try:  # (one pass over the nodes: each cache entry unpacked as it is looked up)
        texts = [text for (text,) in found]
    except TypeError:  # a node not cut (None: dsh wrote it, or the cut declined it)
        return None
    except ValueError:  # a node of no record or of several
        return None
    try:  # (no `None in texts` first: a compare a text, a twentieth of the view's parse)
        return _loads_texts(cast("list[bytes]", texts))
    except TypeError:  # a record orjson could not encode (None): the walk copies it
        return None


@dataclass(slots=True, kw_only=True)
class _ColdView:
    """A read of the stored log before any write: what a resume would see, and its walk.

    Attributes:
        stored: Committed events (the closers follow them).
        closers: The repair a resume would append.
        events: The committed events then the closers (paged or resident).
        nodes: The surface node seqs of ``events``.
        marks: The adapter marks taken in so far (lazily, from the end).
        encoded: Records encoded so far, by seq.
    """

    stored: int
    closers: tuple[Event, ...]
    events: Sequence[Event]
    nodes: Sequence[int]
    marks: _Marks
    encoded: dict[int, tuple[bytes | None, ...]]


class LiveLog:
    """One framework session's dsh session, opened for writing on first use.

    Opening creates the stored session, or resumes it: a turn a crash left open is closed by
    dsh's repair (appended ``tool/result`` errors for unanswered calls, ``step/end``,
    ``turn/end {kind: "interrupted"}``) before anything else is written. The write handle is
    exclusive across processes until :meth:`close`. Every method takes :attr:`lock`; callers
    hold it while they read or append.

    Args:
        session_id: The dsh session id.
        store: A store URL (``sqlite:///…``, ``jsonl:///…``, ``memory:``); None:
            :func:`default_store_url`.
        fmt: The adapter's record format (see :class:`TurnShaper`).
        owner: The adapter's class name, for messages ("DshSession is closed").
        persistence: An open store to use (and leave open) instead of opening ``store``: the
            sessions of one conversation store share it (a ``memory:`` URL names a new store
            each time it is opened).
        wait: Seconds :meth:`open` waits for a session another process is writing.
        select_whole: A whole-history read before any write selects the model view from the
            log instead of walking it page by page (see :meth:`_prefetch`); the SDK session
            turns it on (its reads are checked equal to the walk's).
        flush_only: The store opened for ``store`` writes only at :meth:`flush` and
            :meth:`close`, with no writer thread (:func:`open_store`); for an adapter whose
            every call that appends ends with a flush.

    Raises:
        AdapterClosedError: (from :meth:`open`) the adapter was closed (``ADAPTER_CLOSED``).
        SessionBusyError: another writer still holds the session after ``wait`` seconds (the
            message names it).
    """

    def __init__(self, session_id: str, store: str | None, fmt: str, owner: str, *,
                 persistence: Persistence | None = None, wait: float = DEFAULT_WAIT_S,
                 select_whole: bool = False, flush_only: bool = False) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise AdapterError(f"session_id must be a non-empty string (got {session_id!r})",
                               code="ADAPTER_SESSION_ID")
        self.session_id = session_id
        self.fmt = fmt
        self.owner = owner
        self.store_url = store if store is not None else default_store_url()
        self.lock = threading.RLock()
        self.wait = wait
        self.select_whole = select_whole
        self.flush_only = flush_only
        self._persistence: Persistence | None = None
        self._shared = persistence
        self._store: SessionStore | None = None
        self._shaper: TurnShaper | None = None
        self._closed = False
        self._marks: _Marks | None = None  # of the live session, from open()
        self._reader: Persistence | None = None  # the store a read before any write opened
        self._encoded: dict[int, tuple[bytes | None, ...]] = {}  # seq -> its records as JSON
        # the live session's whole-view texts: (replace generation, nodes, texts, per node)
        self._live: tuple[int, int, list[bytes], list[tuple[bytes, ...]], bool] | None = None
        self._cold: _ColdView | None = None  # what the last read before any write found
        self._damage: LogCorruptError | None = None  # the first damage such a read found
        self._holding: HoldsResume | None = None  # the handle open(append_next=True) armed

    def open(self, *, append_next: bool = False) -> TurnShaper:
        """Return the shaper of the live session, opening (creating or resuming) it first.

        ``append_next``: the caller appends and flushes right after this returns, then calls
        :meth:`release_hold` (in a ``finally``). A resume through a SQLite restore point then
        reads and checks the stored log in the write transaction that append commits
        (:class:`~dsh.persistence._contract.HoldsResume`, docs/rules.md#resume): the first
        write is one transaction.
        """
        with self.lock:
            if self._closed:
                raise AdapterClosedError(f"{self.owner} is closed (session {self.session_id!r}); "
                                         f"make a new {self.owner} to use the session again",
                                         session_id=self.session_id)
            if self._shaper is None:
                damage = self._found_damage()
                if damage is not None:
                    raise LogCorruptError(
                        f"session {self.session_id!r} is not opened for writing: a read of its "
                        f"stored log found it damaged ({damage.message}); nothing is appended "
                        "to a damaged log", code=damage.code, **damage.where) from damage
                persistence = (self._shared or self._reader
                               or open_store(self.store_url, flush_only=self.flush_only))
                self._reader = None
                stored = self._cold is not None  # a read found it: resume without asking
                collecting = gc.isenabled()
                gc.disable()  # the cold read builds the log's containers: see view()
                try:
                    store = SessionStore(persistence=persistence)

                    def arm(handle: object) -> None:
                        if append_next and conforms(handle, HoldsResume):  # type: ignore[type-abstract]  # (a protocol is the class asked about)
                            handle.hold_for_append()
                            self._holding = handle

                    def resume() -> Session:
                        return persistence.resume(store, self.session_id, on_handle=arm)

                    def resume_or_create() -> Session:
                        if stored:
                            with contextlib.suppress(SessionNotFoundError):  # removed since
                                return resume()
                        return (resume() if persistence.exists(self.session_id)
                                else store.create(self.session_id))

                    session = wait_for_writer(resume_or_create, self.wait)
                except BaseException:
                    if self._shared is None:
                        persistence.close()
                    raise
                finally:
                    if collecting:
                        gc.enable()
                self._persistence, self._store = persistence, store
                self._marks = self._adopt_cold(session)
                self._shaper = TurnShaper(Recorder(session, store=store,
                                                   flush_on_turn_end=False), self.fmt)
            return self._shaper

    def release_hold(self) -> None:
        """End the write transaction ``open(append_next=True)`` held, if no append took it."""
        handle, self._holding = self._holding, None
        if handle is not None:
            handle.release_hold()

    def _found_damage(self) -> LogCorruptError | None:
        """The first damage a read before the write found in the stored log, or None.

        A page-in of the cold read's walk, or its selective read of the whole history, that
        found a row its seal no longer vouches for (:attr:`PagedLog.damage`), or an adapter
        mark of a shape this adapter never writes (:attr:`_Marks.damage`: structural damage,
        there for good): the write is then refused, as a live session's writer appends
        nothing more to a log a page-in found damaged (docs/rules.md#verified-page-in). Kept
        when a later read replaces the cold view (the damaged row is still there).
        """
        cold = self._cold
        if self._damage is None and cold is not None:
            if isinstance(cold.events, PagedLog):
                self._damage = cold.events.damage
            if self._damage is None:
                self._damage = cold.marks.damage
        return self._damage

    def _adopt_cold(self, session: Session) -> _Marks:
        """The live session's marks; a read before the write hands over what it walked.

        The records encoded and the marks taken in by reads before the write stay valid when
        the resumed log is the one they read: the same committed events (a writer appends
        only, and an erasure appends its own event) and the same closers at the same seqs.
        """
        cold, self._cold = self._cold, None
        events = session.events
        if cold is not None and session.first_live_seq == len(cold.events) \
                and tuple(events[cold.stored:len(cold.events)]) == cold.closers:
            self._encoded = cold.encoded
            cold.marks.feed(events)
            return cold.marks
        return _Marks(self.fmt, events, self.session_id)

    @property
    def session(self) -> Session:
        """The live dsh session (opened on first use)."""
        return self.open().session

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def view(self, synthesize: Callable[[Event], Sequence[Any]], limit: int | None = None
             ) -> list[tuple[int, int, Any]]:
        """The framework's records along the surface (the model view), in order.

        Args:
            synthesize: Records standing for an event that holds none of this format (dsh
                or another tool wrote it: a repair result, a compaction summary).
            limit: Only the latest ``limit`` records (walks back from the end); None: all.

        Returns:
            ``(seq, index, record)`` triples with fresh plain copies of the records, minus
            popped and cleared records and results the framework never saw
            (``<fmt>/closed-early``). Each event's records are encoded once and cached (events
            never change), so a call costs one JSON parse of the records it returns.

        Raises:
            LogCorruptError: a row read (or paged in) no longer matches its seal record; it
                is noted, and the next write is refused (:meth:`open`).
        """
        found = self._read(synthesize, limit)
        if isinstance(found, tuple):  # the whole history, each node's one record at index 0
            nodes, records = found
            return [(seq, 0, record) for seq, record in zip(nodes, records, strict=True)]
        return found

    def records(self, synthesize: Callable[[Event], Sequence[Any]],
                limit: int | None = None) -> list[Any]:
        """The records of :meth:`view` alone, in order (fresh plain copies; same arguments).

        What a framework's read of its items returns; raises as :meth:`view` does.

        A whole history that needs no walk is returned as parsed, without a ``(seq, index,
        record)`` triple per record (two list passes over 100k items).
        """
        found = self._read(synthesize, limit)
        if isinstance(found, tuple):
            return found[1]
        return [record for _, _, record in found]

    def records_held(self, synthesize: Callable[[Event], Sequence[Any]], *,
                     most: int = HELD_READ_RECORDS) -> list[Any] | None:
        """:meth:`records` of the whole history when it needs no storage read and no wait.

        That is: the session is held for writing and not closed, :attr:`lock` is free (taken
        without blocking), the adapter's marks (fed the events appended since the last read,
        all resident) need no walk, the last whole-history read's texts are kept for the
        surface as it is (no replace since) and every node appended since was appended by
        this writer (resident: ``seq >= first_live_seq``), and the view holds about ``most``
        records or fewer. The answer is then :meth:`records`' own (the same call, under the
        same lock): the kept texts extended by the new nodes and parsed into fresh copies,
        reading nothing from storage. None otherwise: read on a worker thread as ever.

        For an adapter whose reads otherwise hop to a worker thread (``asyncio.to_thread``):
        a held session's ``get_items()`` of a few hundred items is ~0.1 ms of work that holds
        the GIL throughout, which keeps an event loop waiting as long on a worker as on its
        own thread (:data:`HELD_READ_RECORDS`), while the hop costs both threads ~50 us.

        Raises:
            LogCorruptError: as :meth:`records` (never from storage here: nothing is read).
        """
        if not self.lock.acquire(blocking=False):
            return None  # (a writer holds it, perhaps through a sync: wait on a worker)
        try:
            shaper, marks, kept = self._shaper, self._marks, self._live
            if shaper is None or self._closed or marks is None or kept is None:
                return None
            session = shaper.session
            live_from = session.first_live_seq  # (events from here on are the resident tail)
            if marks.seen < live_from:
                return None
            marks.feed(session.events)  # (resident events only: what records() feeds first)
            surface = session.surface
            nodes = surface.nodes
            done = kept[1]
            if marks.needs_walk or kept[0] != surface.replace_generation \
                    or done > len(nodes) or len(kept[2]) + len(nodes) - done > most \
                    or (done < len(nodes) and nodes[done] < live_from):
                return None
            return self.records(synthesize)
        finally:
            self.lock.release()

    def _read(self, synthesize: Callable[[Event], Sequence[Any]], limit: int | None
              ) -> tuple[Sequence[int], list[Any]] | list[tuple[int, int, Any]]:
        """:meth:`view`'s read: ``(nodes, records)`` from :func:`_whole_view`, else triples."""
        # The records are fresh containers by the hundred thousand: a collection pass in
        # between would walk them all again and again (seconds at 100k), so none runs here.
        collecting = gc.isenabled()
        gc.disable()
        try:
            with self.lock:
                if self._shaper is None and not self._closed:
                    cold = self._cold_read()
                    if cold is None:
                        return []
                    if self.select_whole:
                        self._prefetch(cold.events, cold.nodes, cold.marks, cold.encoded,
                                       limit)
                        whole = (_whole_view(cold.nodes, cold.marks, cold.encoded)
                                 if limit is None else None)
                        if whole is not None:
                            return cold.nodes, whole
                    return self._view(cold.nodes, cold.events.__getitem__, cold.marks,
                                      cold.encoded, synthesize, limit)
                marks = self._live_marks()
                session = self.session
                if limit is None:
                    surface = session.surface
                    texts = self._live_texts(surface.nodes, session.event_at, marks,
                                             synthesize, surface.replace_generation)
                    if texts is not None:  # a held session's whole history: no walk
                        nodes = session.surface.nodes
                        items = _loads_texts(texts[0]) if texts[0] else []
                        if texts[2]:
                            # (so one record a node, at index 0: view() makes the triples)
                            return nodes, items
                        keys = [(seq, index) for seq, found in zip(nodes, texts[1], strict=True)
                                for index in range(len(found))]
                        return [(seq, index, item) for (seq, index), item
                                in zip(keys, items, strict=True)]
                return self._view(session.surface.nodes, session.event_at, marks,
                                  self._encoded, synthesize, limit)
        finally:
            if collecting:
                gc.enable()

    def _live_texts(self, nodes: Sequence[int], event_at: Callable[[int], Event],
                    marks: _Marks, synthesize: Callable[[Event], Sequence[Any]],
                    generation: int
                    ) -> tuple[list[bytes], list[tuple[bytes, ...]], bool] | None:
        """The JSON texts of the live model view's records, when no walk is needed; else None.

        No walk is needed when every mark is taken in (``marks.low == 0``) and none removes,
        clears or overrides a record: then :meth:`_view`'s answer is each surface node's
        records in order. Nodes not encoded yet (appended since the last read) are encoded
        into the cache as :meth:`_view` would. None also when a record is one orjson cannot
        encode (the walk copies it).

        The answer is kept and extended by the next call while the surface's
        ``replace_generation`` is ``generation`` (no replace since: its nodes only grew, so
        the kept prefix is still theirs): a held session's ``get_items()`` after an
        ``add_items`` looks up and encodes only the nodes appended since, not every node.

        Returns:
            ``(texts, encoded, single)``: the texts in order, each node's (a tuple of its
            records' texts, along ``nodes``), both read-only (kept for the next call), and
            whether every node holds exactly one record.
        """
        if marks.needs_walk:
            return None
        kept = self._live
        if kept is not None and kept[0] == generation and kept[1] <= len(nodes):
            done, texts, encoded, single = kept[1], kept[2], kept[3], kept[4]
        else:
            done, texts, encoded, single = 0, [], [], True
        if done == len(nodes):
            return texts, encoded, single
        fresh = nodes[done:] if done else nodes
        cache = self._encoded
        more = list(map(cache.get, fresh))
        if None in more:
            fmt = self.fmt
            at = more.index(None)
            while True:
                seq = fresh[at]
                event = event_at(seq)
                records = records_of(event, fmt)
                if records is None:
                    records = () if is_removal(event) else synthesize(event)
                more[at] = cache[seq] = tuple(map(_encode, records))
                try:
                    at = more.index(None, at + 1)
                except ValueError:
                    break
        added = [text for found in cast("list[tuple[bytes | None, ...]]", more)
                 for text in found]
        if None in added:
            return None  # (the kept prefix stays: these nodes are looked at again next time)
        texts.extend(cast("list[bytes]", added))
        encoded.extend(cast("list[tuple[bytes, ...]]", more))
        single = single and len(added) == len(more) and () not in more
        self._live = (generation, len(nodes), texts, encoded, single)
        return texts, encoded, single

    def _live_marks(self) -> _Marks:
        """The marks of the live session, fed its latest events (opens it first)."""
        session = self.session
        assert self._marks is not None  # set by open()
        self._marks.feed(session.events)
        return self._marks

    def _cold_read(self) -> _ColdView | None:
        """The stored log as a resume would see it (repair closers included), and its surface.

        Read by page through the log's restore point when it has one (only the tail is read
        now; a walk back pages earlier events in), else whole. No lock is taken. What an
        earlier read walked (records encoded, marks) is kept while the log is unchanged. None
        when the session is not stored yet.
        """
        persistence = self._shared or self._reader
        if persistence is None:
            persistence = self._reader = open_store(self.store_url, flush_only=self.flush_only)
        found = read_stored(persistence, self.session_id)
        if found is None:
            return None
        events, stored, closers, nodes = found
        prior = self._cold
        if prior is not None and prior.stored == stored and prior.closers == closers:
            # the same log (appends only; an erasure appends its own event): keep the walk
            prior.marks.events = events
            prior.events, prior.nodes = events, nodes
            return prior
        # a fresh cache: a writer elsewhere may since have written other events where the
        # closers were
        self._found_damage()  # (kept: the damaged row is still there)
        self._cold = _ColdView(stored=stored, closers=closers, events=events, nodes=nodes,
                               marks=_Marks(self.fmt, events, self.session_id), encoded={})
        return self._cold

    def _prefetch(self, events: Sequence[Event], nodes: Sequence[int], marks: _Marks,
                  cache: dict[int, tuple[bytes | None, ...]], limit: int | None = None) -> None:
        """Encode the records of every surface node below the cut, for a whole-history walk.

        With ``limit``, of the last ``limit`` surface nodes only (a ``get_items(limit)``: the
        walk pages in whatever it needs beyond them, a node removed since, say), reading the
        range from the first of them on.

        A paged log's walk would page in (decode, freeze) every event before its cut: the turn
        and step brackets and ``tool/call`` events too, about 2.75 events per record. Where
        the page-in source can select (:class:`~dsh.persistence.SelectsEvents`), each
        :data:`PREFETCH_EVENTS` range is read once, every row of it checked against the
        integrity seal as a page-in is (docs/rules.md#verified-page-in), and only the surface
        nodes and the adapter's marks among it are decoded; the marks are taken in as the
        walk would (:meth:`_Marks.take_below`). A node holding no record of this format
        (dsh wrote it: a repair result, a compaction summary) is left to the walk. Where the
        source cannot vouch for a range, the walk pages it in as before.
        """
        if marks.low == 0 or not isinstance(events, PagedLog) \
                or not conforms(events.source, SelectsEvents):  # type: ignore[type-abstract]  # (a protocol is the class asked about)
            return  # (marks taken in down to seq 0: a walk before this one read it all)
        source, cut = events.source, events.cut
        pick = record_picker(self.fmt)
        if marks.low > cut:  # the resident tail first (marks are taken in from the end)
            tail = events[cut:marks.low]
            marks.take_below(cut, [e for e in tail if e["type"] in marks.kinds])
        last = nodes if limit is None else nodes[len(nodes) - min(limit, len(nodes)):]
        # the nodes not encoded yet, in one C-level pass; those at or past marks.low stay in
        # (no range read below reaches them, and neither the lowest wanted nor a pick changes)
        wanted = set(last)
        if cache:
            wanted.difference_update(cache)
        stop = marks.low
        fmt = self.fmt
        lowest = min(wanted, default=stop)
        floor = 0 if limit is None else lowest  # (marks below it are of earlier events)
        while stop > lowest:
            start = max(floor, stop - PREFETCH_EVENTS)
            # (the records cut from the checked rows go straight to the cache: `found` holds
            # the rest, decoded)
            with events.noting_damage():  # (a write after this read must know)
                found = source.read_selected(start, stop, wanted, marks.kind_set, pick,
                                             into=cache)
            if found is None:
                return
            marks.take_below(start, [e for e in found if e["type"] in marks.kinds])
            if marks.cleared_through >= 0:  # a clear mark of old logs: the walk stops there
                wanted = {seq for seq in wanted if seq > marks.cleared_through}
                lowest = min(wanted, default=stop)
            for event in found:
                seq = event["seq"]
                if seq in wanted:
                    records = records_of(event, fmt)
                    if records is not None:
                        cache[seq] = tuple(map(_encode, records))
                    elif is_removal(event):
                        cache[seq] = ()
            stop = start

    def _view(self, nodes: Sequence[int], event_at: Callable[[int], Event], marks: _Marks,
              cache: dict[int, tuple[bytes | None, ...]],
              synthesize: Callable[[Event], Sequence[Any]],
              limit: int | None) -> list[tuple[int, int, Any]]:
        picked: list[tuple[int, int, bytes | None]] = []
        removed = marks.removed
        overrides = marks.overrides  # (cover adds to this dict in place)
        append = picked.append
        for seq in reversed(nodes):
            if limit is not None and len(picked) >= limit:
                break
            if seq + 1 < marks.low:  # (cover's own test: a call per node costs a tenth here)
                marks.cover(seq)
            if seq <= marks.cleared_through:
                break
            encoded = cache.get(seq) if seq not in overrides else None
            if encoded is not None and len(encoded) == 1 and not removed:
                append((seq, 0, encoded[0]))  # the common node: one record, nothing popped
                continue
            if encoded is None:
                event = event_at(seq)
                records = marks.overrides.get(seq) or records_of(event, self.fmt)
                if records is None:
                    records = () if is_removal(event) else synthesize(event)
                encoded = cache[seq] = tuple(_encode(r) for r in records)
            for index in range(len(encoded) - 1, -1, -1):
                if not removed or (seq, index) not in removed:
                    append((seq, index, encoded[index]))
        picked.reverse()
        if limit is not None:
            picked = picked[-limit:]
        fast = iter(_loads_texts([b for _, _, b in picked if b is not None]))
        return [(seq, index, next(fast) if encoded is not None
                 else _copy(event_at(seq), index, self.fmt, synthesize))
                for seq, index, encoded in picked]

    def records_at(self, seq: int) -> list[Any]:
        """The records event ``seq`` stands for now (plain copies; [] for none)."""
        marks = self._live_marks()
        marks.cover(seq)
        found = (marks.overrides.get(seq) or records_of(self.session.event_at(seq), self.fmt)
                 or ())
        return [thaw(r) if isinstance(r, FrozenDict | FrozenList) else r for r in found]

    def supersede(self, seq: int, records: Sequence[Any]) -> None:
        """Log that event ``seq`` stands for ``records`` from now on (``<fmt>/records``).

        For a framework that hands over its own copy of items dsh recorded earlier from a
        hook: the model view keeps the event, the framework reads its own copy back.
        """
        self.open().mark(f"{self.fmt}/records", {"seq": seq, "records": list(records)})

    def pop(self, seq: int, index: int,
            rebuild: Callable[[list[Any]], Mapping[str, Any]] | None = None) -> None:
        """Take record ``index`` of event ``seq`` off the model view (a surface removal).

        An event holding other records too is replaced by ``rebuild(the other records)``
        (an assistant message), when given; otherwise the whole event leaves the surface.
        Rule: docs/adapters.md#cleared-means-cleared
        """
        shaper = self.open()
        rest = self.records_at(seq)
        if shaper.session.event_at(seq)["type"] == "tool/result":
            # the call stays on the view: a result must still answer it (dsh verify)
            withhold_result(shaper, seq, self.fmt)
        elif rebuild is not None and len(rest) > 1 and 0 <= index < len(rest):
            gone = _call_ids([rest[index]])
            del rest[index]
            remove_from_surface(shaper, [seq], form="pop", replacement=rebuild(rest))
            remove_from_surface(shaper, _results_of(shaper.session, seq, gone), form="pop")
        else:
            event = shaper.session.event_at(seq)
            gone = {str(b.get("id")) for b in (message_of(event) or {}).get("content") or ()
                    if isinstance(b, Mapping) and b.get("type") == "tool-call"}
            answers = _results_of(shaper.session, seq, gone)
            remove_from_surface(shaper, [seq, *answers], form="pop")

    def clear(self) -> None:
        """End the open turn and take every message so far off the model view.

        The messages leave the surface (one removal, :func:`remove_from_surface`); the log
        keeps their bytes, ``dsh show`` marks them removed.
        Rule: docs/adapters.md#cleared-means-cleared
        """
        shaper = self.open()
        shaper.end_turn()
        remove_from_surface(shaper, list(shaper.session.surface.nodes), form="clear")

    def fork(self, boundary: int, child_id: str) -> None:
        """Fork the live session after seq ``boundary`` into the new stored session ``child_id``.

        dsh's fork (docs/rules.md#fork): the child holds a copy of events ``0..boundary``, the
        inherited end-seed marker and, for a cut inside a turn, ``forked`` closers; it names
        this session as its parent. It is stored and released here, for a writer to resume.

        Raises:
            SessionForkError: ``child_id`` exists, or ``boundary`` is not a seq of the log.
        """
        with self.lock:
            shaper = self.open()
            store = self._store
            assert store is not None  # set by open()
            store.flush(shaper.session)
            child = store.fork(shaper.session, boundary, child_id)
            store.flush(child)
            store.dispose(child)

    def flush(self) -> None:
        """The durability barrier: return once everything appended is stored."""
        with self.lock:
            if self._store is not None and self._shaper is not None:
                self._store.flush(self._shaper.session)

    def close(self) -> None:
        """Flush, release the write handle and close the store; later use raises.

        A session whose stored log a read found damaged is released without a flush, logged
        as a WARNING: its writer appends nothing more to that log (a flush would only raise
        the damage the call that found it raised), docs/rules.md#verified-page-in.
        """
        with self.lock:
            if self._closed:
                return
            self._closed = True
            persistence, store, shaper = self._persistence, self._store, self._shaper
            self._persistence = self._store = self._shaper = None
            if self._reader is not None:
                self._reader.close()
                self._reader = None
            if persistence is None:
                return
            try:
                if store is not None and shaper is not None:
                    damage = shaper.session.log_damage
                    if damage is None:
                        store.flush(shaper.session)
                    else:
                        # raised by the call that found it; nothing more is written to that
                        # log, not even the resume's end-seed (docs/rules.md#verified-page-in)
                        logger.warning("%s %r closes without a flush: a read found its stored "
                                       "log damaged (%s)", self.owner, self.session_id,
                                       damage.message)
                    store.dispose(shaper.session)
            finally:
                if self._shared is None:
                    persistence.close()

"""Restore state: what a restore derives from a log prefix, as a value a restore point can carry.

A :class:`RestoreState` is the part of ``Session.restore`` that depends on the events before a
cut: the surface (node seqs, replace generation), the request-header and request-context folds,
the inherited end-seed markers after the fork cut, the last turn boundary (where crash repair
must start reading), and the last event's type and time. :class:`RestoreFold` computes it
incrementally from committed events, as a writer sees them, with no access to the log.

Invariants this module owns: ``RestoreFold`` fed the events ``0 .. n-1`` yields exactly the state
a full ``Session.restore`` of those events holds (tested against it); the wire form round-trips
and is validated field by field, so a damaged restore point is refused, never half-used.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dsh.json import MAX_SAFE_INTEGER, FrozenDict, c_fold_plain, snapshot_json
from dsh.session._events import SURFACE_EVENT_TYPES, Event
from dsh.session._old_marks import NO_OLD_MARKS, OLD_MARK_TYPES, OldMarks
from dsh.session._session import Session, canonical_header
from dsh.session._surface import NodeSeqs, replace_nodes

_END_SEED: Final = "session/end-seed"
_NO_NODES: Final = NodeSeqs()
_TURN_BOUNDARIES: Final = ("turn/start", "turn/end")
_WIRE_KEYS_1: Final = frozenset({"eventCount", "lastTime", "lastType", "nodes",
                                 "replaceGeneration", "requestHeader", "requestContext",
                                 "inheritedMarkers", "turnBoundary", "turnOpen"})
_WIRE_KEYS_2: Final = _WIRE_KEYS_1 | {"lastTurn"}
_WIRE_KEYS_3: Final = _WIRE_KEYS_2 | {"oldMarks"}
_FOLD_STOPS: Final = frozenset({"request/header", "request/context", _END_SEED,
                                *OLD_MARK_TYPES})
"""The non-surface types :meth:`RestoreFold.feed`'s loop folds itself (the accelerator's
pass stops there): every type the loop's branches name, but the turn boundaries."""


def _turn_of(event: Event) -> int:
    """A ``turn/start``'s ``turn`` when it is an integer, else 0 (what the recorder takes)."""
    data = event["data"]
    turn = data.get("turn") if isinstance(data, dict) else None
    return turn if type(turn) is int else 0


def _count(value: object, what: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_SAFE_INTEGER:
        raise ValueError(f"restore state field {what} must be a non-negative safe integer "
                         f"(found {value!r})")
    return value


def _optional_map(value: object, what: str) -> FrozenDict | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"restore state field {what} must be an object or null")
    frozen = snapshot_json(value)
    assert isinstance(frozen, FrozenDict)  # a dict snapshots to a FrozenDict
    return frozen


@dataclass(frozen=True, slots=True, kw_only=True)
class RestoreState:
    """The restore-relevant state of a log prefix of ``event_count`` events.

    Attributes:
        event_count: Events covered (seqs ``0 .. event_count - 1``); at least 1.
        last_time: The ``time`` of event ``event_count - 1`` (epoch ms).
        last_type: Its type (a restore appends a plain end-seed unless it is one).
        nodes: Surface node seqs in model order, kept packed (:class:`NodeSeqs`: 8 bytes a
            node, equal to the tuple of the same seqs; any iterable of seqs given is packed).
        replace_generation: Committed surface replacements.
        request_header: The canonical request header folded so far, or None.
        request_context: The latest ``request/context`` data (as :meth:`Session.request_context`
            returns it: normally an object, but any JSON value the log holds), or None.
        inherited_markers: ``session/end-seed {inherited: true}`` events at or after the fork
            cut (``seedLength``); a restore refuses more than one.
        turn_boundary: Seq of the last ``turn/start`` or ``turn/end``, or -1 when none.
        turn_open: True when that boundary is a ``turn/start`` (repair reads from it).
        last_turn: The ``turn`` of the last ``turn/start`` (0 when there is none or its
            ``turn`` is no integer): the number a resumed session's recorder continues from;
            None when unknown (a state read from a format 1 restore point, and a fold
            continuing from one until its next ``turn/start``).
        old_marks: The old adapter marks (``<fmt>/clear``, ``<fmt>/pop``) among the covered
            events (:class:`~dsh.session.OldMarks`, docs/formats.md#old-adapter-marks), so a
            resume reading only the tail knows them; None when unknown (a state read from a
            format 1 or 2 restore point, which a writer's resume does not use).
    """

    event_count: int
    last_time: int
    last_type: str
    nodes: NodeSeqs
    replace_generation: int
    request_header: FrozenDict | None
    request_context: FrozenDict | None
    inherited_markers: int
    turn_boundary: int
    turn_open: bool
    last_turn: int | None = None
    old_marks: OldMarks | None = None

    def __post_init__(self) -> None:
        if type(self.nodes) is not NodeSeqs:
            object.__setattr__(self, "nodes", NodeSeqs(self.nodes))

    def to_wire(self, *, nodes: bool = True) -> dict[str, Any]:
        """Return the JSON object form (camelCase keys), for :meth:`from_wire`.

        With ``nodes=False`` the ``nodes`` key is left out (a caller that packs them itself).
        ``lastTurn`` is there when known (the format 2 state, docs/formats.md#restore-points),
        and ``oldMarks`` when both are (format 3).
        """
        wire = {"eventCount": self.event_count, "lastTime": self.last_time,
                "lastType": self.last_type, "replaceGeneration": self.replace_generation,
                "requestHeader": self.request_header, "requestContext": self.request_context,
                "inheritedMarkers": self.inherited_markers, "turnBoundary": self.turn_boundary,
                "turnOpen": self.turn_open}
        if self.last_turn is not None:
            wire["lastTurn"] = self.last_turn
            if self.old_marks is not None:
                wire["oldMarks"] = self.old_marks.to_wire()
        if nodes:
            wire["nodes"] = list(self.nodes)
        return wire

    @classmethod
    def from_wire(cls, value: object, *, decoded_nodes: NodeSeqs | None = None,
                  last_turn: bool | None = None, old_marks: bool | None = None
                  ) -> RestoreState:
        """Validate and build a state from :meth:`to_wire` output.

        Args:
            value: The wire object.
            last_turn: True: the object must hold ``lastTurn`` (a format 2 restore point);
                False: it must not (format 1: :attr:`last_turn` is then None); None: either.
            old_marks: True: the object must hold ``oldMarks`` too (format 3); False: it must
                not (formats 1 and 2: :attr:`old_marks` is then None); None: either.
            decoded_nodes: The node seqs when the caller decoded ``value``'s ``nodes`` from a
                packed form (then only their range is checked here, in one pass over the
                packed buffer: no int object per node).

        Raises:
            ValueError: a field is missing, extra, or of the wrong type or range.
        """
        if not isinstance(value, Mapping):
            raise ValueError("restore state must be an object")
        if last_turn is None:
            last_turn = "lastTurn" in value
        if old_marks is None:
            old_marks = "oldMarks" in value
        keys = (_WIRE_KEYS_3 if old_marks and last_turn else _WIRE_KEYS_2 if last_turn
                else _WIRE_KEYS_1)
        if set(value) != keys:
            raise ValueError(f"restore state keys differ: {sorted(set(value) ^ keys)}")
        count = _count(value["eventCount"], "eventCount")
        if count < 1:
            raise ValueError("restore state covers no event")
        last_time = value["lastTime"]
        if type(last_time) is not int or abs(last_time) > MAX_SAFE_INTEGER:
            raise ValueError("restore state field lastTime must be a safe integer")
        if type(value["lastType"]) is not str:
            raise ValueError("restore state field lastType must be a string")
        if decoded_nodes is not None:
            nodes = decoded_nodes
            if not nodes.all_below(count):
                raise ValueError("restore state field nodes must be seqs below eventCount")
        else:
            listed = value["nodes"]
            # the common case in C-speed builtins (few nodes: many are stored packed)
            if not isinstance(listed, list) or (listed and not (
                    set(map(type, listed)) == {int} and min(listed) >= 0
                    and max(listed) < count)):
                raise ValueError("restore state field nodes must be seqs below eventCount")
            nodes = NodeSeqs(listed)
        boundary = value["turnBoundary"]
        if type(boundary) is not int or not -1 <= boundary < count:
            raise ValueError("restore state field turnBoundary must be -1 or a seq")
        if type(value["turnOpen"]) is not bool or (value["turnOpen"] and boundary < 0):
            raise ValueError("restore state field turnOpen must be a boolean (false without "
                             "a boundary)")
        return cls(event_count=count, last_time=last_time, last_type=value["lastType"],
                   last_turn=_count(value["lastTurn"], "lastTurn") if last_turn else None,
                   nodes=nodes,
                   replace_generation=_count(value["replaceGeneration"], "replaceGeneration"),
                   request_header=_optional_map(value["requestHeader"], "requestHeader"),
                   # any JSON value: Session.request_context returns the data as it is
                   request_context=snapshot_json(value["requestContext"]),
                   inherited_markers=_count(value["inheritedMarkers"], "inheritedMarkers"),
                   turn_boundary=boundary, turn_open=value["turnOpen"],
                   old_marks=(OldMarks.from_wire(value["oldMarks"]) if old_marks and last_turn
                              else None))


class RestoreFold:
    """Fold committed events into a :class:`RestoreState`, one batch at a time.

    Events must be fed in seq order, each exactly once; events already covered (seq below
    :attr:`event_count`) are skipped, so a retried batch is harmless. The fold does not
    validate: it only ever sees events a session already accepted.

    The surface is kept as an int64 array; a fold continuing from a resumed session shares the
    packed nodes of the state it was restored from and holds only the seqs appended since
    (merged at the first replace, or copied once per restore point written), so adopting a
    resumed session costs no copy of its surface.

    Args:
        inherited: The session's inherited event count (its header ``seedLength`` or 0).
    """

    __slots__ = ("_base", "_boundary", "_count", "_gen", "_inherited", "_last_time",
                 "_last_turn", "_last_type", "_markers", "_nodes", "_old", "_open", "_rc",
                 "_rh")

    def __init__(self, inherited: int = 0) -> None:
        self._inherited = inherited
        self._count = 0
        self._last_time = 0
        self._last_type = ""
        self._base = _NO_NODES  # shared, never changed: the nodes before self._nodes
        self._nodes: array[int] = array("q")
        self._gen = 0
        self._rh: FrozenDict | None = None
        self._rc: FrozenDict | None = None
        self._markers = 0
        self._boundary = -1
        self._open = False
        self._last_turn: int | None = 0
        self._old: OldMarks | None = NO_OLD_MARKS

    @classmethod
    def of_session(cls, session: Session, base: RestoreState | None = None, *,
                   old_marks: OldMarks | None = None) -> RestoreFold:
        """A fold holding the state of ``session``'s whole current log, taken from its folds.

        Args:
            session: A session not being appended to during the call.
            base: The state the session was restored from when it was paged in (its turn
                boundary is then taken from it instead of reading the paged prefix).
            old_marks: The old adapter marks of the session's whole log when the caller
                knows them (a resume found them); None: the base's and the window's.
        """
        fold = cls(session.inherited_event_count)
        events = session.events
        count = len(events)
        fold._count = count
        if count:
            last = events[count - 1]
            fold._last_time = last["time"]
            fold._last_type = last["type"]
        nodes = session.surface.nodes
        fold._gen = session.surface.replace_generation
        if base is not None and fold._gen == base.replace_generation \
                and len(nodes) >= len(base.nodes):
            # no replace since the restore: the surface is the state's nodes and the appends
            fold._base = base.nodes
            fold._nodes = array("q", nodes[len(base.nodes):])
        else:
            fold._nodes = array("q", nodes)
        fold._rh = session.request_header()
        fold._rc = session.request_context()
        floor = base.event_count if base is not None else 0
        window = events[floor:]  # a paged log serves its tail without paging anything in
        index = len(window) - 1
        while index >= 0 and window[index]["type"] not in _TURN_BOUNDARIES:
            index -= 1
        if index >= 0:
            fold._boundary = floor + index
            fold._open = window[index]["type"] == "turn/start"
        elif base is not None:
            fold._boundary, fold._open = base.turn_boundary, base.turn_open
        # the last turn/start: in the window, else the base's (None: it did not know), else none
        start = index
        while start >= 0 and window[start]["type"] != "turn/start":
            start -= 1
        fold._last_turn = (_turn_of(window[start]) if start >= 0
                           else base.last_turn if base is not None else 0)
        # the old adapter marks: the base's (None: it did not know them) and the window's
        if old_marks is not None:
            fold._old = old_marks
        else:
            old = base.old_marks if base is not None else NO_OLD_MARKS
            fold._old = None if old is None else old.taking(window)
        # The seed's markers were counted when it was admitted; only appends since can add one.
        fold._markers = session.seed_marker_count + sum(
            1 for event in events[session.first_live_seq:]
            if event["type"] == _END_SEED and _is_inherited_marker(event))
        return fold

    @property
    def event_count(self) -> int:
        """Events folded so far."""
        return self._count

    def feed(self, events: Sequence[Event]) -> None:
        """Fold ``events`` (seq order; those below :attr:`event_count` are skipped).

        A writer folds every durable batch after its commit
        (docs/rules.md#restore-points-are-never-the-truth): the accelerator folds the events
        that need none of the loop below (plain events, surface appends, turn boundaries) in
        one call, up to the first one it leaves to the loop.
        """
        if c_fold_plain is not None and type(events) is list:
            index, count, last_time, last_type, boundary, turn_open, last_turn, appended = \
                c_fold_plain(events, self._count, SURFACE_EVENT_TYPES, _FOLD_STOPS)
            if appended:
                self._nodes.extend(appended)
            if last_type is not None:  # an event was folded
                self._count, self._last_time, self._last_type = count, last_time, last_type
            if boundary is not None:
                self._boundary, self._open = boundary, turn_open
            if last_turn is not None:
                self._last_turn = last_turn
            if index == len(events):
                return
            events = events[index:]
        nodes = self._nodes
        for event in events:
            seq = event["seq"]
            if seq < self._count:
                continue
            etype = event["type"]
            if etype in SURFACE_EVENT_TYPES:
                op = event.get("surfaceOp")
                if op == "append":
                    nodes.append(seq)
                elif isinstance(op, dict):
                    if self._base:  # a replace may reach into the shared nodes: merge once
                        merged = self._base.to_array()
                        merged.extend(nodes)
                        nodes = self._nodes = merged
                        self._base = _NO_NODES
                    replace_nodes(nodes, nodes.index(op["start"]), nodes.index(op["end"]), seq)
                    self._gen += 1
            elif etype == "request/header":
                self._rh = canonical_header(event["data"]["header"])
            elif etype == "request/context":
                data = event["data"]
                # As Session.request_context: the data as it is, whatever its JSON kind.
                self._rc = data if isinstance(data, FrozenDict) else snapshot_json(data)
            elif etype in _TURN_BOUNDARIES:
                self._boundary = seq
                self._open = etype == "turn/start"
                if self._open:
                    self._last_turn = _turn_of(event)
            elif etype == _END_SEED and seq >= self._inherited and _is_inherited_marker(event):
                self._markers += 1
            elif etype in OLD_MARK_TYPES and self._old is not None:
                self._old = self._old.taking((event,))
            self._count = seq + 1
            self._last_time = event["time"]
            self._last_type = etype

    def state(self) -> RestoreState:
        """The state of the events folded so far.

        Raises:
            ValueError: nothing was folded yet.
        """
        if self._count < 1:
            raise ValueError("a restore state needs at least one event")
        return RestoreState(event_count=self._count, last_time=self._last_time,
                            last_type=self._last_type,
                            nodes=self._base.extended(self._nodes),
                            replace_generation=self._gen, request_header=self._rh,
                            request_context=self._rc, inherited_markers=self._markers,
                            turn_boundary=self._boundary, turn_open=self._open,
                            last_turn=self._last_turn, old_marks=self._old)


def _is_inherited_marker(event: Event) -> bool:
    data = event["data"]
    return isinstance(data, dict) and data.get("inherited") is True

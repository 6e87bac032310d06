"""The surface: the ordered seqs of message events the model currently sees.

Invariants this module owns (docs/rules.md#the-surface, docs/rules.md#resume):

* only surface-eligible events (``user/message``, ``assistant/message``, ``tool/result``,
  ``system/message``) carry ``surfaceOp``/``sourceEventSeqs``, and they must carry ``surfaceOp``;
* an ``"append"`` pushes the event's seq; a replace splices out an inclusive range of *current*
  surface positions and puts the event's seq at the range's start position;
* a replace cites every node it shadows in ``sourceEventSeqs``; a ``tool/result`` replace rewrites
  exactly one ``tool/result`` and changes only its result content; a replace covering node 0 while
  node 0 is a ``system/message`` must itself be a ``system/message`` covering exactly that node;
* planning never changes state, so a refused event leaves no trace; ``replace_generation`` counts
  committed replacements.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Final, NamedTuple, overload

from dsh._errors import EventRejectedError
from dsh.json import MAX_SAFE_INTEGER, FrozenDict, json_equal
from dsh.session._events import SURFACE_EVENT_TYPES, Event

_MISSING: Final = object()


class SurfacePlan(NamedTuple):
    """How one validated event changes the surface.

    Attributes:
        seq: The event's seq (the node it adds).
        start_index: Surface position where a replace starts, or -1 for an append.
        end_index: Surface position where a replace ends (inclusive), or -1 for an append.
    """

    seq: int
    start_index: int
    end_index: int


class SurfaceReplacement(NamedTuple):
    """One committed replace, as :func:`fold_surface` reports it.

    Attributes:
        seq: The replacing event's seq.
        start: The declared ``surfaceOp.start`` seq.
        end: The declared ``surfaceOp.end`` seq.
        shadowed_seqs: The nodes actually removed, in surface order.
    """

    seq: int
    start: int
    end: int
    shadowed_seqs: tuple[int, ...]


class SurfaceFold(NamedTuple):
    """The result of a full replay: final nodes and every replacement in event order."""

    nodes: list[int]
    replacements: list[SurfaceReplacement]


class SurfaceNodes(Sequence[int]):
    """A read-only live view of the surface's node seqs; its identity never changes.

    It compares equal to a list or tuple with the same seqs. Rule: docs/rules.md#the-surface.
    """

    __slots__ = ("_nodes",)

    def __init__(self, nodes: list[int]) -> None:
        self._nodes = nodes

    def __len__(self) -> int:
        return len(self._nodes)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...

    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        if isinstance(index, slice):
            return tuple(self._nodes[index])
        return self._nodes[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self._nodes)

    def __contains__(self, value: object) -> bool:
        return value in self._nodes

    def index(self, value: Any, start: int = 0, stop: int = MAX_SAFE_INTEGER) -> int:
        """Return the surface position of seq ``value`` (``ValueError`` when absent)."""
        return self._nodes.index(value, start, stop)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SurfaceNodes):
            return self._nodes == other._nodes
        if isinstance(other, list | tuple):
            return self._nodes == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a live view is not hashable

    def __repr__(self) -> str:
        return f"SurfaceNodes({self._nodes!r})"


_INT_ONLY: Final = {int}


def _is_seq(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_SAFE_INTEGER


def _reject(message: str, event: Any, code: str = "SURFACE") -> EventRejectedError:
    return EventRejectedError(message, code=code, seq=event.get("seq"),
                              event_type=event.get("type"))


def _check_sources(event: Any, sources: Any, shadowed: Sequence[int]) -> None:
    """Provenance rules for ``sourceEventSeqs`` (docs/rules.md#provenance), in order."""
    seq = event["seq"]
    if sources is not _MISSING:
        if not isinstance(sources, list):
            raise _reject(f"sourceEventSeqs on event at seq {seq} must be an array when present "
                          f"(found {type(sources).__name__})", event)
        if not sources and event["type"] != "assistant/message":
            raise _reject(f"sourceEventSeqs on event at seq {seq} must not be empty except on "
                          "assistant/message", event)
        # The common case in C-speed builtins (a streamed message cites dozens of chunks):
        # only ints, all in [0, seq). Anything else takes the loops below, in rule order.
        plain = not sources or (set(map(type, sources)) == _INT_ONLY and min(sources) >= 0
                                and max(sources) < seq)
        if not plain:
            for item in sources:
                if not _is_seq(item):
                    raise _reject(f"sourceEventSeqs on event at seq {seq} must densely contain "
                                  f"non-negative safe integers (found {item!r})", event)
        cited = set(sources)
        if len(cited) != len(sources):
            raise _reject(f"sourceEventSeqs on event at seq {seq} must not contain duplicates",
                          event)
        if not plain:
            for item in sources:
                if item >= seq:
                    raise _reject(f"sourceEventSeqs must reference earlier events: {item} >= "
                                  f"current seq {seq}", event)
    else:
        cited = set()
    if shadowed:
        missing = [s for s in shadowed if s not in cited]
        if missing:
            raise _reject("surface replace: sourceEventSeqs must include every shadowed surface "
                          f"node; missing {', '.join(map(str, missing))} (event at seq {seq})",
                          event)


def _blank_result_payload(data: Any) -> Any:
    """Copy ``data`` with ``message.content[0].content`` set to None, when that path exists."""
    if not isinstance(data, dict):
        return data
    message = data.get("message")
    if not isinstance(message, dict):
        return data
    content = message.get("content")
    if not isinstance(content, list) or not content or not isinstance(content[0], dict):
        return data
    block = {**content[0], "content": None}
    return {**data, "message": {**message, "content": [block, *content[1:]]}}


def _check_tool_result_rewrite(event: Any, shadowed: Sequence[int], events: Sequence[Any],
                               base_seq: int) -> None:
    """Tool-result rewrite rule (docs/rules.md#tool-result-rewrites)."""
    if len(shadowed) != 1:
        raise _reject("tool/result surface replacement must rewrite exactly one current node "
                      f"(covers {len(shadowed)}: {', '.join(map(str, shadowed))})", event)
    index = shadowed[0] - base_seq
    target = events[index] if 0 <= index < len(events) else None
    if target is None or target["type"] != "tool/result":
        found = "outside the loaded window" if target is None else target["type"]
        raise _reject("tool/result surface replacement must target a current tool/result "
                      f"(seq {shadowed[0]} is {found})", event)
    if not json_equal(_blank_result_payload(target["data"]),
                      _blank_result_payload(event["data"])):
        raise _reject("tool/result surface replacement may change only content (the replaced "
                      f"result is seq {shadowed[0]})", event)


class Surface:
    """Incremental surface state: ``nodes`` and ``replace_generation``.

    :meth:`plan` validates one candidate and returns a :class:`SurfacePlan` without changing
    anything; :meth:`apply` commits it. ``nodes`` is a :class:`SurfaceNodes` view whose identity
    is stable across appends. Rule: docs/rules.md#surface-ops, docs/rules.md#the-surface.

    Args:
        node_list: The list the node seqs live in. A session passes a list of its own and
            appends a plain surface append to it directly on its hot path (the same list, so
            :meth:`apply` and the view see it); default a new, empty list.
        replace_generation: The generation to start from (a restore's).
    """

    __slots__ = ("_nodes", "_replace_generation", "_view")

    def __init__(self, node_list: list[int] | None = None, replace_generation: int = 0) -> None:
        self._nodes: list[int] = [] if node_list is None else node_list
        self._view = SurfaceNodes(self._nodes)
        self._replace_generation = replace_generation

    @classmethod
    def resume(cls, nodes: Sequence[int], replace_generation: int) -> Surface:
        """A surface holding ``nodes`` after ``replace_generation`` replaces (a restore state's).

        The state of a log prefix, as :class:`~dsh.session.RestoreState` carries it; the events
        after that prefix are then planned and applied as usual.
        """
        surface = cls()
        surface._nodes.extend(nodes)
        surface._replace_generation = replace_generation
        return surface

    @property
    def nodes(self) -> SurfaceNodes:
        """The current node seqs in model order (read-only, live, stable identity)."""
        return self._view

    @property
    def replace_generation(self) -> int:
        """How many replacements have been committed; changes whenever positions are rewritten."""
        return self._replace_generation

    def plan(self, event: Any, expected_seq: int, events: Sequence[Any],
             base_seq: int = 0) -> SurfacePlan | None:
        """Validate ``event`` as the next event and say how it would change the surface.

        Args:
            event: The candidate (an :class:`Event` or any envelope mapping).
            expected_seq: The seq the next event must have.
            events: The loaded event window, indexed by ``seq - base_seq``; used to look up the
                target of a ``tool/result`` rewrite and the event at surface node 0.
            base_seq: The seq of ``events[0]``.

        Returns:
            None for a log-only event; otherwise the plan to :meth:`apply`.

        Raises:
            EventRejectedError: code ``SEQ_NOT_CONTIGUOUS`` for a seq other than
                ``expected_seq``; code ``SURFACE`` for a marker, range, provenance, tool-result
                rewrite or system-head violation (checks in docs/rules.md#surface-ops, then the
                node-0 rule of docs/rules.md#resume). Nothing changes.
        """
        seq = event["seq"]
        if seq != expected_seq or type(seq) is not int:
            raise _reject(f"session event seq {seq!r} is not contiguous; expected {expected_seq}",
                          event, "SEQ_NOT_CONTIGUOUS")
        etype = event["type"]
        op = event.get("surfaceOp", _MISSING)
        if etype not in SURFACE_EVENT_TYPES:
            if op is not _MISSING:
                raise _reject(f"session event {etype!r} at seq {seq} is not surface-eligible and "
                              "cannot carry surfaceOp", event)
            if "sourceEventSeqs" in event:
                raise _reject(f"session event {etype!r} at seq {seq} is not surface-eligible and "
                              "cannot carry sourceEventSeqs", event)
            return None
        if op is _MISSING:
            raise _reject(f"session event {etype!r} at seq {seq} is surface-eligible and requires "
                          "a surfaceOp marker", event)
        sources = event.get("sourceEventSeqs", _MISSING)
        if op == "append":
            if sources is not _MISSING:
                _check_sources(event, sources, ())
            return SurfacePlan(seq, -1, -1)
        if not isinstance(op, dict):
            raise _reject(f"session event {etype!r} at seq {seq} carries an invalid surfaceOp "
                          f"({op!r}); expected \"append\" or a replace object", event)
        if (op.keys() != {"op", "start", "end"} or op["op"] != "replace"
                or not _is_seq(op["start"]) or not _is_seq(op["end"])):
            raise _reject(f"session event {etype!r} at seq {seq} carries an invalid replace "
                          f"surfaceOp ({dict(op)!r}); expected exactly op=\"replace\" and "
                          "non-negative safe integer start and end", event)
        start, end = op["start"], op["end"]
        nodes = self._nodes
        try:
            start_index = nodes.index(start)
        except ValueError:
            raise _reject(f"surface replace: start seq {start} not found in surface (event at "
                          f"seq {seq})", event) from None
        try:
            end_index = nodes.index(end)
        except ValueError:
            raise _reject(f"surface replace: end seq {end} not found in surface (event at seq "
                          f"{seq})", event) from None
        if start_index > end_index:
            raise _reject(f"surface replace: start seq {start} (index {start_index}) is after end "
                          f"seq {end} (index {end_index}) (event at seq {seq})", event)
        shadowed = nodes[start_index:end_index + 1]
        _check_sources(event, sources, shadowed)
        if etype == "tool/result":
            _check_tool_result_rewrite(event, shadowed, events, base_seq)
        if start_index == 0:
            index = nodes[0] - base_seq
            head = events[index] if 0 <= index < len(events) else None
            if head is not None and head["type"] == "system/message" and (
                    etype != "system/message" or end_index != 0):
                raise _reject(f"surface replace covering node 0 (seq {nodes[0]}, a "
                              "system/message) must be a system/message replacing exactly that "
                              f"node; found {etype} covering {end_index + 1} node(s) (event at "
                              f"seq {seq})", event)
        return SurfacePlan(seq, start_index, end_index)

    def apply(self, plan: SurfacePlan | None) -> None:
        """Commit a plan returned by :meth:`plan` for the event just committed."""
        if plan is None:
            return
        seq, start_index, end_index = plan
        if start_index < 0:
            self._nodes.append(seq)
        else:
            self._nodes[start_index:end_index + 1] = [seq]
            self._replace_generation += 1

    def __repr__(self) -> str:
        return (f"Surface(nodes={self._nodes!r}, "
                f"replace_generation={self._replace_generation})")


def fold_surface(events: Sequence[Any]) -> SurfaceFold:
    """Replay a whole log from seq 0 and return its surface and every replacement.

    Args:
        events: A log whose event at index ``i`` must have seq ``i``.

    Returns:
        :class:`SurfaceFold` with detached copies: the final node list and one
        :class:`SurfaceReplacement` per replace, in event order. Equal to the online state of a
        session that appended the same events.

    Raises:
        EventRejectedError: the first violation, exactly as the incremental :class:`Surface`
            reports it.

    Rule: docs/rules.md#the-surface.
    """
    surface = Surface()
    replacements: list[SurfaceReplacement] = []
    for index, event in enumerate(events):
        plan = surface.plan(event, index, events)
        if plan is not None and plan.start_index >= 0:
            op = event["surfaceOp"]
            shadowed = tuple(surface._nodes[plan.start_index:plan.end_index + 1])
            replacements.append(SurfaceReplacement(plan.seq, op["start"], op["end"], shadowed))
        surface.apply(plan)
    return SurfaceFold(list(surface._nodes), replacements)


def derive_event_message(event: Event | FrozenDict) -> FrozenDict | None:
    """Return the model message one event projects, or None.

    Returns:
        ``user/message`` and ``system/message``: the event's ``data`` (the whole message);
        ``assistant/message``: ``data["message"]`` unless its content is empty (then None);
        ``tool/result``: ``data["message"]``; any other type: None. The returned value is the
        frozen object stored in the log (no copy). ``surfaceOp`` is not consulted.

    Rule: docs/rules.md#deriving-messages, docs/rules.md#the-system-head for ``system/message``.
    """
    etype = event["type"]
    if etype == "user/message" or etype == "system/message":
        return event["data"]  # type: ignore[no-any-return]
    if etype == "assistant/message":
        message = event["data"]["message"]
        return message if message["content"] else None
    if etype == "tool/result":
        return event["data"]["message"]  # type: ignore[no-any-return]
    return None

"""Derived views: a registry of pure folds over a session's events, cached per session.

Invariants this module owns (core spec §14.2):

* a projection unit is a pure, synchronous fold ``apply(state, event) -> state`` from
  ``init()``; it returns the *same object* for events it ignores, and its state is plain JSON;
* the log is the only authority: a cached cell is reused only while it still describes a prefix
  of the session's log (its watermark event is the same object, at a seq the log still has);
  otherwise the cell is refolded from ``init()``, and a cell behind the log folds the tail;
* one unit per key: registrants of the same key and ``state_version`` share it (reference
  counted); another version for a live key is refused;
* units with a ``view`` are client-visible (snapshots, change listeners); units without one are
  host-only (checkpointed, never published);
* checkpoints are detached deep copies: changing one cannot change a cached state.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dsh._errors import ConfigError, DshError
from dsh.json import JsonValue, is_safe_int, thaw
from dsh.session import Event

logger = logging.getLogger(__name__)

ChangeListener = Callable[[Any, str, JsonValue, int], None]
"""``listener(session, key, view, seq)``: a client-visible unit's view changed at ``seq``."""


class _Session(Protocol):
    @property
    def seq(self) -> int: ...

    def event_at(self, seq: int) -> Event: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ProjectionDefinition:
    """One projection unit (core spec §14.2 ``ProjectionDefinition``).

    Attributes:
        key: Unique name of the derived value (e.g. ``"todo"``).
        init: Returns the state of an empty log (plain JSON).
        apply: ``apply(state, event) -> state``; pure and synchronous; returns ``state`` itself
            for events it ignores.
        state_version: Non-negative safe integer; bump it when the state's shape changes, so
            stored checkpoints of the old shape are refolded instead of trusted.
        parse_state: The state schema: returns the state if valid, raises ``ValueError`` (or a
            ``DshError``) if not. Used on restored checkpoint rows. ``None`` accepts any JSON.
        view: Client view of the state; ``None`` makes the unit host-only.
        parse_view: The view schema, applied to every published view (same contract as
            ``parse_state``); ``None`` accepts any JSON.
    """

    key: str
    init: Callable[[], JsonValue]
    apply: Callable[[JsonValue, Event], JsonValue]
    state_version: int
    parse_state: Callable[[JsonValue], JsonValue] | None = None
    view: Callable[[JsonValue], JsonValue] | None = None
    parse_view: Callable[[JsonValue], JsonValue] | None = None

    @property
    def client_visible(self) -> bool:
        """True when the unit has a ``view`` (published to clients)."""
        return self.view is not None


@dataclass(frozen=True, slots=True)
class ProjectionRestore:
    """Result of :meth:`ProjectionRegistry.restore`.

    Attributes:
        snapshot: ``{"asOfSeq": end_seq, "values": {key: view}}`` (client-visible units).
        rows: Refreshed checkpoint rows ``{key: {"ver", "seq": end_seq, "val"}}`` (all units).
    """

    snapshot: dict[str, Any]
    rows: dict[str, dict[str, Any]]


class ProjectionScope:
    """Registrations and listeners owned by one component; closing it releases them all.

    The Python stand-in for the reference's fiber ownership (core spec §14.2: registration is
    an effect of the calling fiber and is undone when it unloads). Use as a context manager or
    call :meth:`close`; closing twice is harmless.
    """

    def __init__(self, registry: ProjectionRegistry) -> None:
        self._registry = registry
        self._disposers: list[Callable[[], None]] = []

    def register(self, definition: ProjectionDefinition) -> Callable[[], None]:
        """:meth:`ProjectionRegistry.register`, released when the scope closes."""
        dispose = self._registry.register(definition)
        self._disposers.append(dispose)
        return dispose

    def on_changed(self, listener: ChangeListener) -> Callable[[], None]:
        """:meth:`ProjectionRegistry.on_changed`, removed when the scope closes."""
        remove = self._registry.on_changed(listener)
        self._disposers.append(remove)
        return remove

    def close(self) -> None:
        """Release everything this scope registered, newest first."""
        while self._disposers:
            self._disposers.pop()()

    def __enter__(self) -> ProjectionScope:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Unit:
    __slots__ = ("definition", "refs")

    def __init__(self, definition: ProjectionDefinition) -> None:
        self.definition = definition
        self.refs = 0


class _Cell:
    """One unit's state for one session: ``state`` folds events ``0..observed_seq``."""

    __slots__ = ("observed_event", "observed_seq", "state")

    def __init__(self, state: JsonValue, observed_seq: int, observed_event: Event | None) -> None:
        self.state = state
        self.observed_seq = observed_seq
        self.observed_event = observed_event


def _parse(parser: Callable[[JsonValue], JsonValue] | None, value: JsonValue, what: str,
           key: str) -> JsonValue:
    if parser is None:
        return value
    try:
        return parser(value)
    except (ValueError, TypeError, DshError) as exc:
        raise ConfigError(f"projection {key!r}: {what} does not match its schema ({exc})",
        code="PROJECTION_SCHEMA") from exc


class ProjectionRegistry:
    """Registry of derived-view units over sessions (core spec §14.2 ``sessionProjections``).

    Drive it with :meth:`attach` (``session.observe``) or call :meth:`on_event` yourself; reads
    (:meth:`state_of`, :meth:`snapshot`, :meth:`checkpoint`) catch up from the log on their own,
    so an unattached session still answers correctly.
    """

    def __init__(self) -> None:
        self._units: dict[str, _Unit] = {}
        self._cells: weakref.WeakKeyDictionary[Any, dict[str, _Cell]] = \
            weakref.WeakKeyDictionary()
        self._listeners: list[ChangeListener] = []

    # --- registration ---------------------------------------------------------------------

    def register(self, definition: ProjectionDefinition) -> Callable[[], None]:
        """Register a unit; return its disposer (idempotent).

        Raises:
            ConfigError: ``state_version`` is not a non-negative safe integer (code
                PROJECTION_VERSION), or ``key`` is live with another ``state_version`` (code
                PROJECTION_VERSION_CONFLICT).
        Rule: core spec §14.2 (``register``, shared keys, reference counting).
        """
        version = definition.state_version
        if not is_safe_int(version) or version < 0:
            raise ConfigError(f"projection {definition.key!r}: stateVersion must be a "
                              f"non-negative safe integer, got {version!r}",
                              code="PROJECTION_VERSION")
        unit = self._units.get(definition.key)
        if unit is None:
            unit = self._units[definition.key] = _Unit(definition)
        elif unit.definition.state_version != version:
            raise ConfigError(
                f"projection {definition.key!r} is registered with stateVersion "
                f"{unit.definition.state_version}; refusing stateVersion {version} while it is "
                "live", code="PROJECTION_VERSION_CONFLICT")
        unit.refs += 1
        disposed = False

        def dispose() -> None:
            nonlocal disposed
            if disposed:
                return
            disposed = True
            unit.refs -= 1
            if unit.refs == 0 and self._units.get(definition.key) is unit:
                del self._units[definition.key]
                for cells in self._cells.values():
                    cells.pop(definition.key, None)

        return dispose

    def scope(self) -> ProjectionScope:
        """Return a :class:`ProjectionScope` whose registrations end when it closes."""
        return ProjectionScope(self)

    def keys(self) -> tuple[str, ...]:
        """Return the registered keys, in registration order."""
        return tuple(self._units)

    def on_changed(self, listener: ChangeListener) -> Callable[[], None]:
        """Add a change listener for client-visible units; return its remover."""
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    def attach(self, session: Any) -> Callable[[], None]:
        """Drive this registry from ``session.observe``; return the unsubscribe function."""
        unsubscribe: Callable[[], None] = session.observe(self.on_event)
        return unsubscribe

    # --- driving --------------------------------------------------------------------------

    def _session_cells(self, session: Any) -> dict[str, _Cell]:
        cells = self._cells.get(session)
        if cells is None:
            cells = self._cells[session] = {}
        return cells

    def _cell(self, session: _Session, unit: _Unit, upto: int) -> _Cell:
        """Return the unit's cell folded over at least events ``0..upto`` (-1 = none)."""
        # event_at reads one slot; copying the whole log per driven event would be O(n^2).
        event_at = session.event_at
        length = session.seq
        definition = unit.definition
        cells = self._session_cells(session)
        cell = cells.get(definition.key)
        if cell is not None and cell.observed_seq >= 0 and (
                cell.observed_seq >= length
                or event_at(cell.observed_seq) is not cell.observed_event):
            cell = None  # not a prefix of this log any more: never trust it, refold
        if cell is None:
            cell = _Cell(definition.init(), -1, None)
        if cell.observed_seq >= upto:
            cells[definition.key] = cell
            return cell
        state = cell.state
        apply = definition.apply
        event: Event | None = None
        for seq in range(cell.observed_seq + 1, upto + 1):
            event = event_at(seq)
            state = apply(state, event)
        cell = _Cell(state, upto, event)
        cells[definition.key] = cell
        return cell

    def on_event(self, session: Any, event: Event) -> None:
        """Fold one committed event into every unit's cell and notify view changes.

        A cell that is missing is first built from ``events[0 .. event.seq)``. Listeners get
        ``(session, key, parsed view, event.seq)`` when the state object changed identity.
        Rule: core spec §14.2 (drive).
        """
        for unit in tuple(self._units.values()):
            before = self._cell(session, unit, event.seq - 1)
            if before.observed_seq >= event.seq:
                continue  # a read already folded this event lazily
            previous = before.state
            after = self._cell(session, unit, event.seq)
            definition = unit.definition
            if after.state is previous or definition.view is None or not self._listeners:
                continue
            view = _parse(definition.parse_view, definition.view(after.state), "view",
                          definition.key)
            for listener in tuple(self._listeners):
                listener(session, definition.key, view, event.seq)

    # --- reads ----------------------------------------------------------------------------

    def state_of(self, session: Any, key: str) -> JsonValue:
        """Return the unit's current state for ``session`` (folded lazily); None if unknown."""
        unit = self._units.get(key)
        if unit is None:
            return None
        return self._cell(session, unit, session.seq - 1).state

    def snapshot(self, session: Any) -> dict[str, Any]:
        """Return ``{"asOfSeq": seq - 1, "values": {key: view}}`` over client-visible units.

        ``asOfSeq`` is -1 for an empty log. Raises ConfigError (PROJECTION_SCHEMA) when a view
        fails its own schema.
        """
        last = session.seq - 1
        values: dict[str, JsonValue] = {}
        for key, unit in self._units.items():
            definition = unit.definition
            if definition.view is None:
                continue
            state = self._cell(session, unit, last).state
            values[key] = _parse(definition.parse_view, definition.view(state), "view", key)
        return {"asOfSeq": last, "values": values}

    def checkpoint(self, session: Any) -> dict[str, dict[str, Any]]:
        """Return ``{key: {"ver", "seq", "val"}}`` for every unit (host-only included).

        ``val`` is a detached deep copy; ``seq`` is the cell's watermark (the last folded seq).
        """
        last = session.seq - 1
        rows: dict[str, dict[str, Any]] = {}
        for key, unit in self._units.items():
            cell = self._cell(session, unit, last)
            rows[key] = {"ver": unit.definition.state_version, "seq": cell.observed_seq,
                         "val": thaw(cell.state)}
        return rows

    def _usable_version(self, rows: Mapping[str, Any], unit: _Unit) -> Mapping[str, Any] | None:
        row = rows.get(unit.definition.key)
        if isinstance(row, Mapping) and row.get("ver") == unit.definition.state_version \
                and is_safe_int(row.get("seq")):
            return row
        return None

    def restore_floor(self, checkpoint: Mapping[str, Any]) -> int | None:
        """Return the seq a tail read must start at to restore from ``checkpoint``.

        ``None`` with no units. Otherwise, per unit, ``need = max(row.seq + 1, 0)`` for a
        version-matching row (else 0); the answer is ``max(min(need) - 1, 0)``: one below, so the
        read proves the log still reaches the watermark. Rule: core spec §14.2.
        """
        if not self._units:
            return None
        needs = []
        for unit in self._units.values():
            row = self._usable_version(checkpoint, unit)
            needs.append(max(row["seq"] + 1, 0) if row is not None else 0)
        return max(min(needs) - 1, 0)

    def view_checkpoint(self, checkpoint: Mapping[str, Any]) -> dict[str, JsonValue]:
        """Return client views straight from version-matching, schema-valid rows (no log read).

        Rows with another version, or whose state fails ``parse_state``, are omitted.
        """
        values: dict[str, JsonValue] = {}
        for key, unit in self._units.items():
            definition = unit.definition
            row = self._usable_version(checkpoint, unit)
            if definition.view is None or row is None:
                continue
            try:
                state = _parse(definition.parse_state, row.get("val"), "checkpoint state", key)
            except ConfigError:
                continue
            values[key] = _parse(definition.parse_view, definition.view(state), "view", key)
        return values

    def restore(self, checkpoint: Mapping[str, Any], events: Sequence[Event],
                base_seq: int = 0) -> ProjectionRestore:
        """Rebuild every unit from checkpoint rows plus the events after them.

        Args:
            checkpoint: Rows as :meth:`checkpoint` returns them.
            events: A contiguous slice of the log starting at ``base_seq``.
            base_seq: Seq of ``events[0]`` (0 for a full log).

        Returns:
            A :class:`ProjectionRestore` as of ``end_seq`` = the last event's seq, or
            ``base_seq - 1`` for an empty slice.

        Raises:
            ConfigError: a usable row fails ``parse_state`` (PROJECTION_SCHEMA); a row is
                unusable (other version, or a watermark outside ``[base_seq - 1, end_seq]``,
                e.g. a log that shrank) while ``base_seq > 0``, so the caller must re-read from
                seq 0 (PROJECTION_REREAD).
        Rule: core spec §14.2 (``restore``); a cache is never authoritative.
        """
        end_seq = events[-1].seq if events else base_seq - 1
        values: dict[str, JsonValue] = {}
        rows: dict[str, dict[str, Any]] = {}
        for key, unit in self._units.items():
            definition = unit.definition
            row = self._usable_version(checkpoint, unit)
            if row is not None and not (base_seq - 1 <= row["seq"] <= end_seq):
                row = None
            if row is None and base_seq > 0:
                raise ConfigError(
                    f"projection {key!r}: checkpoint row cannot be continued from the events "
                    f"read from seq {base_seq} (version mismatch or watermark outside "
                    f"[{base_seq - 1}, {end_seq}]); re-read the log from seq 0",
                    code="PROJECTION_REREAD")
            if row is None:
                state, start = definition.init(), base_seq
            else:
                state = _parse(definition.parse_state, row.get("val"), "checkpoint state", key)
                start = row["seq"] + 1
            for event in _tail(events, base_seq, start):
                state = definition.apply(state, event)
            rows[key] = {"ver": definition.state_version, "seq": end_seq, "val": thaw(state)}
            if definition.view is not None:
                values[key] = _parse(definition.parse_view, definition.view(state), "view", key)
        return ProjectionRestore({"asOfSeq": end_seq, "values": values}, rows)


def _tail(events: Sequence[Event], base_seq: int, start: int) -> Iterable[Event]:
    for index in range(max(start - base_seq, 0), len(events)):
        yield events[index]

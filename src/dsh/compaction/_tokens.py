"""Token estimates: the reference token meter's heuristic, in UTF-16 code units.

Invariants this module owns (docs/rules.md#token-estimates):

* every length is counted in UTF-16 code units, as JavaScript's ``String.length`` does (a code
  point above U+FFFF counts 2, a lone surrogate counts 1), so our prices equal the
  ``shadowedTokenCount`` values dsh writes into its logs;
* a text or reasoning block costs ``ceil(len / 4) + 4``; a tool-call block
  ``ceil(len(name) / 4) + ceil(len(arguments) / 4) + 4``; a tool-result block its nested
  content's price ``+ 4``; any other block ``4 + ceil(len(JSON) / 4)``; a message its blocks
  ``+ 4``; a system prompt ``ceil(len / 4) + 4``; tool schemas ``ceil(len(JSON) / 4) + 4``;
* a price depends only on the event, and events never change, so a session's node prices are
  cached by seq.

Calibration: on the s5-compaction fixture (``../shared/dsh-logs``), the eight nodes dsh
compacted price to 312 (its logged ``compaction/summary.shadowedTokenCount``) and the pruned
tool result at seq 170 to 913 (its logged ``compaction/prune.shadowedTokenCount``).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from dsh.json import JsonValue, dumps
from dsh.session import Event, derive_event_message

CHARS_PER_TOKEN: Final = 4
"""UTF-16 code units per estimated token ("4 UTF-16 units per token").

Rule: docs/rules.md#token-estimates.
"""

BLOCK_OVERHEAD_TOKENS: Final = 4
"""Tokens added per content block, system prompt and tool list (docs/rules.md#token-estimates)."""

MESSAGE_OVERHEAD_TOKENS: Final = 4
"""Tokens added per message for its role (docs/rules.md#token-estimates)."""


def utf16_length(text: str) -> int:
    """Return ``text``'s length in UTF-16 code units (JavaScript ``String.length``).

    A code point above U+FFFF counts 2; a lone surrogate (dsh logs may hold them) counts 1.
    Rule: docs/rules.md#token-estimates (everything that counts characters counts UTF-16 code
        units).
    """
    if text.isascii():
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _quarter(units: int) -> int:
    return -(-units // CHARS_PER_TOKEN)  # ceil without a float round trip


def estimate_text_tokens(text: str) -> int:
    """Return ``ceil(utf16_length(text) / 4)``, the bare price of a string (no overhead)."""
    return _quarter(utf16_length(text))


def estimate_json_tokens(value: JsonValue) -> int:
    """Return ``ceil(len(JSON.stringify(value)) / 4)`` in UTF-16 units (no overhead).

    The JSON text is :func:`dsh.json.dumps`'s compact form, which matches ``JSON.stringify``
    for every value dsh can log (non-ASCII stays raw, lone surrogates are escaped).
    """
    return estimate_text_tokens(dumps(value).decode("utf-8"))


def estimate_block_tokens(block: Mapping[str, Any]) -> int:
    """Return the estimated tokens of one content block (docs/rules.md#token-estimates).

    Args:
        block: A content block ``{"type": ..., ...}``: ``text``/``reasoning`` (``text`` key),
            ``tool-call`` (``name``, ``arguments`` string), ``tool-result`` (nested ``content``
            list of blocks) or anything else (priced by its JSON text).

    Returns:
        Tokens, always >= 4.
    """
    return _blocks_tokens((block,))


def _blocks_tokens(blocks: Iterable[Any]) -> int:
    # The hot path of every measurement: one loop, no per-block calls for common blocks.
    total = 0
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" or kind == "reasoning":
            text = block.get("text")
            if text.__class__ is str:
                units = len(text) if text.isascii() else utf16_length(text)
                total += -(-units // 4) + 4
                continue
        elif kind == "tool-call":
            name, arguments = block.get("name"), block.get("arguments")
            if name.__class__ is str and arguments.__class__ is str:
                total += (-(-utf16_length(name) // 4) - (-utf16_length(arguments) // 4)
                          + BLOCK_OVERHEAD_TOKENS)
                continue
        elif kind == "tool-result":
            nested = block.get("content")
            if isinstance(nested, list):
                total += _blocks_tokens(nested) + BLOCK_OVERHEAD_TOKENS
                continue
        # Unknown or malformed blocks (images, future types) are priced by their JSON text.
        total += BLOCK_OVERHEAD_TOKENS + estimate_json_tokens(block)
    return total


def estimate_message_tokens(message: Mapping[str, Any] | None) -> int:
    """Return a message's estimated tokens: its blocks plus 4 for the role; 0 for ``None``.

    ``None`` is what an empty ``assistant/message`` projects to: it is never sent, so it costs
    nothing. Rule: docs/rules.md#token-estimates.
    """
    if message is None:
        return 0
    content = message.get("content")
    blocks: Iterable[Any] = content if isinstance(content, list) else ()
    return _blocks_tokens(blocks) + MESSAGE_OVERHEAD_TOKENS


def estimate_system_tokens(system: str | None) -> int:
    """Return a system prompt's price, ``ceil(len / 4) + 4``; 0 when there is none."""
    if system is None:
        return 0
    return estimate_text_tokens(system) + BLOCK_OVERHEAD_TOKENS


def estimate_tools_tokens(tools: Sequence[JsonValue] | None) -> int:
    """Return the tool schemas' price, ``ceil(len(JSON) / 4) + 4``; 0 for none or ``[]``."""
    if not tools:
        return 0
    return estimate_json_tokens(tools) + BLOCK_OVERHEAD_TOKENS


def estimate_event_tokens(event: Event) -> int:
    """Return the price of the message a surface event projects to (0 for log-only events).

    Rule: docs/rules.md#token-estimates (the meter prices a node by its derived message).
    """
    return estimate_message_tokens(derive_event_message(event))


# seq -> price per session: a session's seq always names the same immutable event, so a price
# never goes stale. Plain int dicts keep the garbage collector out of the hot path.
_session_prices: weakref.WeakKeyDictionary[Any, dict[int, int]] = weakref.WeakKeyDictionary()


def _prices_of(session: Any) -> dict[int, int]:
    try:
        prices = _session_prices.get(session)
        if prices is None:
            prices = _session_prices[session] = {}
    except TypeError:  # not weakly referenceable: price afresh every time
        return {}
    return prices


class _SurfaceSession(Protocol):
    @property
    def events(self) -> Sequence[Event]: ...

    @property
    def surface(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class PricedNode:
    """One surface node and its estimated tokens.

    Attributes:
        seq: The node's event seq.
        tokens: Its projected message's price (docs/rules.md#token-estimates).
    """

    seq: int
    tokens: int


@dataclass(frozen=True, slots=True)
class SurfaceMeasurement:
    """A priced snapshot of a session's surface (the meter's view).

    Rule: docs/rules.md#span-selection, docs/rules.md#token-estimates.

    Attributes:
        seqs: Every current surface node's seq, in surface order.
        prices: Each node's estimated tokens, parallel to ``seqs``.
        replace_generation: The surface's ``replace_generation`` when measured.
        surface_tokens: Sum of the node prices.
        envelope_tokens: System prompt plus tool schemas of the latest ``request/header``
            (0 when none was logged).
        total_tokens: ``envelope_tokens + surface_tokens`` (the heuristic total; the reference
            may instead anchor on provider-reported usage, see the module notes in
            ``dsh.compaction``).
    """

    # Two flat tuples, not one object per node: on a large heap, allocating one tracked object
    # per node wakes the garbage collector's full passes and costs more than the pricing.
    seqs: tuple[int, ...]
    prices: tuple[int, ...]
    replace_generation: int
    surface_tokens: int
    envelope_tokens: int
    total_tokens: int

    @property
    def nodes(self) -> tuple[PricedNode, ...]:
        """The nodes as :class:`PricedNode` pairs (built on each read; prefer seqs/prices)."""
        return tuple(map(PricedNode, self.seqs, self.prices))


def _latest_header(session: _SurfaceSession) -> Mapping[str, Any] | None:
    # Session.request_header() folds the log once and caches; fall back to a backward scan.
    request_header = getattr(session, "request_header", None)
    if callable(request_header):
        found = request_header()
        return found if isinstance(found, Mapping) else None
    for event in reversed(session.events):
        if event["type"] == "request/header":
            data = event["data"]
            if isinstance(data, dict) and isinstance(data.get("header"), dict):
                header: Mapping[str, Any] = data["header"]
                return header
    return None


def node_prices(session: _SurfaceSession, seqs: Iterable[int]) -> list[int]:
    """Return the estimated tokens of the events at ``seqs`` (cached per session by seq).

    Rule: docs/rules.md#token-estimates; the same prices :func:`measure_surface` reports.
    """
    events = session.events
    prices = _prices_of(session)
    out: list[int] = []
    for seq in seqs:
        price = prices.get(seq)
        if price is None:
            price = prices[seq] = estimate_event_tokens(events[seq])
        out.append(price)
    return out


def measure_surface(session: _SurfaceSession) -> SurfaceMeasurement:
    """Price every node of ``session``'s current surface and the logged request envelope.

    Args:
        session: A :class:`dsh.session._session.Session` (anything with ``events`` and
            ``surface.nodes`` / ``surface.replace_generation``).

    Returns:
        A :class:`SurfaceMeasurement`; O(surface nodes) (prices are cached per session) plus the
        latest ``request/header`` (``Session.request_header()``, itself cached).
    Rule: docs/rules.md#token-estimates (heuristic prices; provider-usage baselines are not used).
    """
    surface = session.surface
    seqs = tuple(surface.nodes)
    prices = tuple(node_prices(session, seqs))
    surface_tokens = sum(prices)
    header = _latest_header(session)
    envelope = 0
    if header is not None:
        system = header.get("system")
        tools = header.get("tools")
        envelope = (estimate_system_tokens(system if isinstance(system, str) else None)
                    + estimate_tools_tokens(tools if isinstance(tools, list) else None))
    return SurfaceMeasurement(seqs, prices, surface.replace_generation, surface_tokens, envelope,
                              surface_tokens + envelope)

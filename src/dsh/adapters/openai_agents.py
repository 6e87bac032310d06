"""dsh as the session memory of the OpenAI Agents SDK: :class:`DshSession`.

``DshSession(session_id, store=URL)`` implements the SDK's ``Session`` protocol and behaves as
the SDK's ``SQLiteSession`` does: ``get_items(limit)`` returns the latest ``limit`` items in
order (``limit`` given beats ``session_settings.limit``; ``limit <= 0`` gives none), each
``add_items`` batch is validated whole before anything is written and is durable when the call
returns, ``pop_item`` returns and removes the newest item.

Responses input items map onto core dsh events:

* ``role`` user messages → ``user/message``; system and developer messages too, with source
  ``{kind: "plugin", plugin: "openai-agents", form: role}`` (as dsh's Codex importer keeps
  developer messages);
* consecutive model output (assistant ``message``, ``reasoning``, ``function_call``, hosted
  tool calls) → one ``assistant/message`` (text, reasoning, ``tool-call`` blocks; other items
  as ``provider-raw`` blocks), then one ``tool/call`` per ``function_call``;
* ``function_call_output`` → the ``tool/result`` answering that call (an output whose call is
  not pending in the open step becomes a ``user/message`` instead, so pairing stays balanced);
* any other input item (``*_output``, ``item_reference``, approvals), and any object that is
  no Responses item at all (no ``type``, no ``role``: the envelopes the SDK's
  ``EncryptedSession`` stores in the session it wraps) → a ``user/message`` holding it as a
  ``provider-raw`` block.

Every item is also kept verbatim in its message's source (:data:`dsh.adapters._log.RECORD_KEY`),
so ``get_items`` returns exactly what ``add_items`` received, field for field. Items come from
the surface (the model view), so what dsh adds is seen too: a crash-repair ``tool/result``
reads back as a ``function_call_output``, a compaction summary as a user message. ``pop_item``
and ``clear_session`` append ``ignorable`` ``openai-agents/pop`` and ``openai-agents/clear``
events: the log keeps every byte and readers that do not know them skip them. A ``limit``
window is ``SQLiteSession``'s: it may start with a ``function_call_output`` whose call it cut
off, which the SDK's Runner leaves out of the model input (the SDK's own limit test checks
that on DshSession); dsh's own model view never splits a call from its output.

Where this differs from ``SQLiteSession``: a negative ``limit`` gives no items
(``SQLiteSession`` passes it to SQL's ``LIMIT`` and gives every item; no SDK test asks for
either). A closed session raises :class:`dsh._errors.AdapterClosedError`, a ``RuntimeError`` as
``SQLiteSession``'s is.

Needs ``pip install 'dsh-session[openai-agents]'``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

from dsh._errors import AdapterError, InvalidJsonError
from dsh._install import install_hint
from dsh._messages import create_assistant_message, create_user_message
from dsh.adapters._log import (
    DEFAULT_WAIT_S,
    LiveLog,
    TurnShaper,
    message_of,
    remove_from_surface,
    text_of,
    with_records,
)
from dsh.json import snapshot_json
from dsh.session import Event

try:
    from agents import RunHooks
    from agents.memory import SessionABC, SessionSettings
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("dsh.adapters.openai_agents needs the OpenAI Agents SDK: "
                      f"{install_hint('openai-agents')}") from exc
try:  # the SDK's own check of a settings dict (names the unknown fields), where it has one
    from agents.memory.session_settings import coerce_session_settings
except ImportError:  # pragma: no cover - SDK releases before it: the dataclass checks alone
    def coerce_session_settings(value: SessionSettings | dict[str, Any]) -> SessionSettings:
        return value if isinstance(value, SessionSettings) else SessionSettings(**value)

if TYPE_CHECKING:
    from agents import TResponseInputItem

__all__ = ["FORMAT", "DshRunHooks", "DshSession", "items_to_events"]

FORMAT: Final = "openai-agents"
"""The record format name of Responses input items in a message source."""

_HELD_RESUME_ITEMS: Final = 64
"""The most items an ``add_items`` call converts inside its resume's write transaction.

A first write of at most this many items resumes in the SQLite ``BEGIN IMMEDIATE`` its append
commits (docs/rules.md#resume); a bigger one resumes as any resume does, so the store's write
lock is not held while its items become events (every other writer of the store waits for it:
at load 35, 2,000 items held it 3.3 s, 0.7 s of it their append)."""


_TEXT_PARTS: Final = frozenset({"input_text", "output_text", "text", "summary_text",
                                "reasoning_text"})
_INPUT_ONLY: Final = frozenset({"item_reference", "mcp_approval_response"})


def _kind(item: Mapping[str, Any]) -> str:
    """``user``, ``system``, ``model``, ``call``, ``output`` or ``input`` (other input items)."""
    itype = item.get("type")
    role = item.get("role")
    if itype is None and not isinstance(role, str):
        return "input"  # not a Responses item (an EncryptedSession envelope, say): kept opaque
    if itype in (None, "message") and isinstance(role, str):
        if role == "user":
            return "user"
        if role in ("system", "developer"):
            return "system"
        return "model"
    if itype == "function_call":
        return "call"
    if itype == "function_call_output":
        return "output"
    if isinstance(itype, str) and (itype.endswith("_output") or itype.endswith("_response")
                                   or itype in _INPUT_ONLY):
        return "input"
    return "model"


def _blocks(content: Any) -> list[dict[str, Any]]:
    """The dsh blocks of a Responses ``content``/``output``: text parts as text, others raw."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        return [] if content is None else [{"type": "text", "text": json.dumps(content)}]
    out: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, Mapping) and part.get("type") in _TEXT_PARTS \
                and isinstance(part.get("text"), str):
            out.append({"type": "text", "text": part["text"]})
        elif isinstance(part, Mapping) and part.get("type") == "refusal":
            out.append({"type": "text", "text": str(part.get("refusal", ""))})
        else:
            out.append({"type": "provider-raw", "provider": "openai", "block": part})
    return out


def _model_blocks(item: Mapping[str, Any]) -> list[dict[str, Any]]:
    itype = item.get("type")
    if itype in (None, "message"):
        return _blocks(item.get("content"))
    if itype == "reasoning":
        parts = [*(item.get("summary") or []), *(item.get("content") or [])]
        return [{"type": "reasoning", "text": text_of(_blocks(parts))}]
    if itype == "function_call":
        return [{"type": "tool-call", "id": str(item.get("call_id")),
                 "name": str(item.get("name")), "arguments": str(item.get("arguments", ""))}]
    return [{"type": "provider-raw", "provider": "openai", "block": item}]


def _normalize(items: Any, session_id: str) -> list[dict[str, Any]]:
    """Frozen JSON copies of ``items`` (the values ``SQLiteSession`` stores), checked whole.

    An item of plain JSON types (``dict``, ``list``, ``str``, ``int``, ``float``, ``bool``,
    None: what the SDK hands over) is checked and copied in one pass (:func:`snapshot_json`),
    and the events made of it reuse that copy instead of walking the item again. Any other
    item goes through ``json.dumps`` first, as ``SQLiteSession`` stores it (tuples become
    lists, enum members their values, keys strings), then the same check.
    """
    if not isinstance(items, list):
        raise AdapterError(f"add_items takes a list of items (got {type(items).__name__})",
                           code="ADAPTER_ITEM", session_id=session_id)
    out: list[dict[str, Any]] = []
    calls: dict[str, int] = {}  # call id -> item index: the recorder refuses a repeated id
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise AdapterError(f"item {index} of add_items is not a JSON object (a Responses "
                               f"input item); got {item!r:.80}; nothing was written",
                               code="ADAPTER_ITEM", session_id=session_id, line=index)
        try:
            try:
                plain = cast("dict[str, Any]", snapshot_json(item))
            except InvalidJsonError:  # not of plain JSON types: as SQLiteSession encodes it
                plain = cast("dict[str, Any]", snapshot_json(json.loads(json.dumps(item))))
        except (TypeError, ValueError) as exc:
            raise AdapterError(f"item {index} of add_items is not JSON dsh can store ({exc}); "
                               f"nothing was written", code="ADAPTER_ITEM",
                               session_id=session_id, line=index) from exc
        if plain.get("type") == "function_call":
            call_id, name = plain.get("call_id"), plain.get("name")
            if not (isinstance(call_id, str) and call_id and isinstance(name, str) and name):
                raise AdapterError(f"item {index} of add_items is a function_call without a "
                                   f"call_id or name; nothing was written", code="ADAPTER_ITEM",
                                   session_id=session_id, line=index)
            if call_id in calls:
                raise AdapterError(f"item {index} of add_items repeats function_call call_id "
                                   f"{call_id!r} of item {calls[call_id]}; nothing was written",
                                   code="ADAPTER_ITEM", session_id=session_id, line=index)
            calls[call_id] = index
        out.append(plain)
    return out


def _assistant_of(group: Sequence[Mapping[str, Any]], *, model: str,
                  provider: str = "openai") -> dict[str, Any]:
    """The ``assistant/message`` message of consecutive model items, keeping them as records."""
    blocks = [block for entry in group for block in _model_blocks(entry)]
    message = create_assistant_message(content=blocks, provider=provider, model=model)
    return {**message, "source": with_records(message["source"], FORMAT, group)}


def items_to_events(shaper: TurnShaper, items: Sequence[Mapping[str, Any]], *,
                    model: str, dispatch: bool = True, provider: str = "openai") -> list[Event]:
    """Append ``items`` (plain JSON Responses input items) as core events; return them.

    Args:
        shaper: The live session's turn bracket.
        items: Items already checked by the caller (JSON objects, lossless).
        model: Model name written into assistant message sources.
        dispatch: Append ``tool/call`` for each ``function_call`` at once (False: the run
            hooks append it when the tool body starts, see :meth:`DshSession.run_hooks`).
        provider: Provider written into assistant message sources.

    Returns:
        The appended events, in order (bracket events included).

    Rule: the mapping in this module's docstring; a batch whose last item is model output
    with no call pending closes the turn (``turn/end {kind: "completed"}``).
    """
    before = shaper.session.seq
    _append_items(shaper, items, model=model, dispatch=dispatch, provider=provider)
    return list(shaper.session.events[before:])


def _append_items(shaper: TurnShaper, items: Sequence[Mapping[str, Any]], *, model: str,
                  dispatch: bool, provider: str) -> None:
    """:func:`items_to_events` without gathering the events (``add_items`` needs none)."""
    kinds = [_kind(item) for item in items]
    count = len(items)
    index = 0
    while index < count:
        item = items[index]
        kind = kinds[index]
        if kind in ("user", "system"):
            source = ({"kind": "user"} if kind == "user" else
                      {"kind": "plugin", "plugin": FORMAT, "form": str(item.get("role"))})
            shaper.user(create_user_message({"content": _blocks(item.get("content")),
                                             "source": with_records(source, FORMAT, [item])}))
            index += 1
        elif kind in ("model", "call"):
            group = []
            while index < count and kinds[index] in ("model", "call"):
                group.append(items[index])
                index += 1
            shaper.assistant(_assistant_of(group, model=model, provider=provider))
            for entry in group if dispatch else ():
                if entry.get("type") == "function_call":
                    shaper.tool_call(str(entry.get("call_id")))
        else:
            call_id = str(item.get("call_id")) if kind == "output" else ""
            if kind == "output" and shaper.can_answer(call_id):
                shaper.tool_result(call_id, _blocks(item.get("output")), records=[item],
                                   fmt=FORMAT)
            else:
                blocks = (_blocks(item.get("output")) if kind == "output"
                          else [{"type": "provider-raw", "provider": "openai", "block": item}])
                shaper.input(create_user_message({"content": blocks, "source": with_records(
                    {"kind": "plugin", "plugin": FORMAT,
                     "form": str(item.get("type") or "opaque")},
                    FORMAT, [item])}))
            index += 1
    if items and kinds[-1] == "model" and not shaper.pending:
        shaper.end_turn()


def _synthesized(event: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Items for a surface event dsh wrote itself (repair result, compaction summary, …)."""
    message = message_of(event) or {}
    content = message.get("content")
    etype = event["type"]
    if etype == "tool/result":
        call_id = message.get("source", {}).get("callId")
        return [{"type": "function_call_output", "call_id": call_id, "output": text_of(content)}]
    if etype == "assistant/message":
        items: list[dict[str, Any]] = []
        text = text_of(content)
        if text:
            items.append({"role": "assistant", "content": text})
        items.extend({"type": "function_call", "call_id": b.get("id"), "name": b.get("name"),
                      "arguments": b.get("arguments")}
                     for b in content or () if isinstance(b, Mapping)
                     and b.get("type") == "tool-call")
        return items
    return [{"role": "system" if etype == "system/message" else "user",
             "content": text_of(content)}]


class DshSession(SessionABC):
    """An OpenAI Agents SDK session stored as a dsh session log.

    Args:
        session_id: The SDK session id, used as the dsh session id (``dsh show ID``).
        store: Store URL (``sqlite:///path.db``, ``jsonl:///dir``, ``memory:``); default
            ``sqlite:///$DSH_HOME/sessions.db``, the store the ``dsh`` command reads.
        session_settings: ``SessionSettings`` (or a dict of its fields); default
            ``SessionSettings()``, whose ``limit`` ``get_items`` uses when given none.
        model: Model name recorded in assistant message sources (dsh shows it) when the run
            hooks are not used; with them the agent's own model is recorded.
        provider: Provider recorded beside ``model``.
        wait: Seconds a write waits for a session another process is writing (default 5, as
            the CLI); reads never wait (they take no lock).

    The session is opened on first use and held for writing (exclusively, across processes)
    until :meth:`close`; an interrupted turn left by a crashed process is repaired then.

    Raises:
        AdapterError: ``ADAPTER_SESSION_ID`` for an empty id; from the methods:
            ``ADAPTER_ITEM`` for an item that is not a lossless JSON object,
            ``ADAPTER_CLOSED`` after :meth:`close`.
        SessionBusyError: another process (or object) holds the session for writing.
    """

    def __init__(self, session_id: str, store: str | None = None, *,
                 session_settings: SessionSettings | Mapping[str, Any] | None = None,
                 model: str = "unknown", provider: str = "openai",
                 wait: float = DEFAULT_WAIT_S) -> None:
        # every call that appends ends with a flush: no writer thread (WriteBehind.flush_only)
        self._log = LiveLog(session_id, store, FORMAT, type(self).__name__, wait=wait,
                            select_whole=True, flush_only=True)
        self.session_id = session_id
        # (None first: a fresh process's first isinstance(None, Mapping) walks the ABC's
        # registry, 0.1 ms of a cold open)
        self.session_settings = (SessionSettings() if session_settings is None
                                 else coerce_session_settings(dict(session_settings))
                                 if isinstance(session_settings, Mapping)
                                 else session_settings)
        self.model = model
        self.provider = provider
        self._provisional: tuple[int, list[dict[str, Any]]] | None = None

    def run_hooks(self) -> DshRunHooks:
        """Run hooks that make the model's answer and each tool call durable as they happen.

        Pass them with the session: ``Runner.run(agent, text, session=session,
        hooks=session.run_hooks())``. Without them the SDK hands a step's items to the session
        only after its tool bodies ran, so a crash inside one leaves no trace of the call.
        """
        return DshRunHooks(self)

    def _record_answer(self, items: list[dict[str, Any]], model: str) -> None:
        """The model's output, durable before any of its tools runs (from the run hooks).

        An answer that calls no tool is written with the ``add_items`` the SDK makes next (it
        hands the same items over at the end of the turn).
        """
        with self._log.lock:
            shaper = self._log.open()
            self._settle()
            if not items:
                return
            before = shaper.session.seq
            with shaper.session.batch():
                _append_items(shaper, items, model=model, dispatch=False,
                              provider=self.provider)
            made = [e for e in shaper.session.events[before:]
                    if e["type"] == "assistant/message"]
            self._provisional = (made[-1]["seq"], items) if made else None
            if shaper.pending:
                self._log.flush()

    def _record_dispatch(self, call_id: str) -> None:
        """A tool body is about to run: its ``tool/call``, durable (from the run hooks)."""
        with self._log.lock:
            shaper = self._log.open()
            if shaper.dispatch(call_id) is not None:
                self._log.flush()

    def _settle(self) -> None:
        """Forget a hook-recorded answer the SDK did not hand over (nothing to match)."""
        self._provisional = None

    def _take_provisional(self, shaper: TurnShaper, items: list[dict[str, Any]]
                          ) -> list[dict[str, Any]]:
        """Match the batch's leading model items with the hook-recorded answer.

        Returns:
            The items still to write. Matched items are not written again; when the SDK's
            copies differ from the hook's, ``openai-agents/records`` makes them the ones
            ``get_items`` returns. An answer the batch does not carry leaves the model view.
        """
        if self._provisional is None:
            return items
        seq, recorded = self._provisional
        self._provisional = None
        head = items[:len(recorded)]
        if [_item_key(i) for i in head] == [_item_key(i) for i in recorded]:
            if head != recorded:
                self._log.supersede(seq, head)
            rest = items[len(recorded):]
            if not rest and not shaper.pending:
                shaper.end_turn()
            return rest
        remove_from_surface(shaper, [seq], form="superseded")
        return items

    @property
    def store_url(self) -> str:
        """The store URL this session lives in."""
        return self._log.store_url

    def _visible(self, limit: int | None = None) -> list[tuple[int, int, Any]]:
        return self._log.view(_synthesized, limit)

    def _get_sync(self, limit: int | None) -> list[TResponseInputItem]:
        with self._log.lock:
            if limit is not None and limit <= 0:
                return []
            return self._log.records(_synthesized, limit)

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """Return the latest ``limit`` items in order (all when ``limit`` and the setting are None).

        Args:
            limit: Maximum count; None uses ``session_settings.limit``; ``<= 0`` returns ``[]``
                (``SQLiteSession`` returns every item for a negative limit).

        Returns:
            Items as ``add_items`` received them (fresh copies), plus items for what dsh added
            (crash-repair outputs, compaction summaries). As with ``SQLiteSession``, a window
            may start with a ``function_call_output`` whose call it cut off; the SDK's Runner
            leaves such an output out of the model input (the SDK's own session-limit test
            checks this against DshSession), and dsh's own model view never splits a pair.

        Read on a worker thread (``asyncio.to_thread``), except a held session's whole history
        when it is in memory (:meth:`dsh.adapters._log.LiveLog.records_held`, docs/adapters.md).
        """
        settings = self.session_settings
        effective = limit if limit is not None or settings is None else settings.limit
        if effective is None:
            # a held session's history in memory: no thread hop (LiveLog.records_held)
            held = self._log.records_held(_synthesized)
            if held is not None:
                return held
        return await asyncio.to_thread(self._get_sync, effective)

    def _add_sync(self, items: list[dict[str, Any]]) -> None:
        with self._log.lock:
            # a first write resumes in the transaction its flush commits (one transaction),
            # unless converting its items would hold the store's write lock long
            shaper = self._log.open(append_next=len(items) <= _HELD_RESUME_ITEMS)
            try:
                # one publication (one queueing for the writer) for the call's events, each
                # checked as it is appended (docs/rules.md#live-sessions)
                with shaper.session.batch():
                    items = self._take_provisional(shaper, items)
                    if items:
                        _append_items(shaper, items, model=self.model, dispatch=True,
                                      provider=self.provider)
                self._log.flush()
            finally:
                self._log.release_hold()

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` as one batch; durable when this returns.

        Raises:
            AdapterError: ``ADAPTER_ITEM`` naming the first bad item; nothing is written.
        """
        plain = _normalize(items, self.session_id)
        if self._log.closed:
            self._log.open()  # raises ADAPTER_CLOSED, like SQLiteSession on a closed session
        if plain:
            await asyncio.to_thread(self._add_sync, plain)

    def _pop_sync(self) -> TResponseInputItem | None:
        with self._log.lock:
            visible = self._visible(1)
            if not visible:
                return None
            seq, index, item = visible[-1]
            self._settle()
            self._log.pop(seq, index, rebuild=lambda rest: _assistant_of(
                rest, model=self.model, provider=self.provider))
            self._log.flush()
            return item  # type: ignore[no-any-return]

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item (None when empty): it leaves the model view.

        Rule: docs/adapters.md#cleared-means-cleared
        """
        return await asyncio.to_thread(self._pop_sync)

    def _clear_sync(self) -> None:
        with self._log.lock:
            self._settle()
            self._log.clear()
            self._log.flush()

    async def clear_session(self) -> None:
        """Take every item so far off the model view; the log keeps them (``dsh show``).

        Rule: docs/adapters.md#cleared-means-cleared
        """
        await asyncio.to_thread(self._clear_sync)

    def close(self) -> None:
        """Flush and release the session (the write lock); later calls raise ADAPTER_CLOSED."""
        self._log.close()


def _item_key(item: Mapping[str, Any]) -> tuple[Any, ...]:
    """What identifies a model output item across the SDK's copies of it."""
    return (item.get("type"), item.get("role"), item.get("call_id") or item.get("id"))


def _model_name(agent: Any, default: str) -> tuple[str, str]:
    """``(provider, model)`` of an SDK agent's model, as recorded (docs/adapters.md).

    A name (``"gpt-4.1"``; ``"litellm/anthropic/…"`` is split at its first ``/``), or a
    ``Model`` object's ``model`` attribute when it is a non-empty string (the SDK's own
    models hold their name there), provider ``openai``; any other ``Model`` object is
    recorded by its class name, provider ``custom``; no model at all gives ``default``.
    """
    model = getattr(agent, "model", None)
    if isinstance(model, str):
        if "/" in model:
            provider, _, name = model.partition("/")
            return provider, name
        return "openai", model or default
    held = getattr(model, "model", None)
    if isinstance(held, str) and held:
        return "openai", held
    if model is not None:
        return "custom", type(model).__name__
    return "openai", default


class DshRunHooks(RunHooks[Any]):
    """The SDK run hooks of a :class:`DshSession` (see :meth:`DshSession.run_hooks`).

    ``on_llm_end`` appends the model's answer (its ``assistant/message``) and flushes it;
    ``on_tool_start`` appends the call's ``tool/call`` and flushes it, before the tool body
    runs. When the SDK later hands the same items to ``add_items`` they are not written again.
    A process killed inside a tool body leaves a log whose repair answers that call with an
    outcome-unknown result, and calls whose bodies never started with an aborted one.

    Args:
        session: The session the run uses.
    """

    def __init__(self, session: DshSession) -> None:
        self.session = session

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        """Record the model's answer, durable before any of its tools runs."""
        items = json.loads(json.dumps(response.to_input_items(), default=str))
        provider, model = _model_name(agent, self.session.model)
        self.session.provider = provider
        await asyncio.to_thread(self.session._record_answer, items, model)

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        """Record the ``tool/call`` of the call about to run, durable before its body."""
        call_id = getattr(context, "tool_call_id", None)
        if isinstance(call_id, str) and call_id:
            await asyncio.to_thread(self.session._record_dispatch, call_id)

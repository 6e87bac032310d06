"""dsh as the message history of Pydantic AI agents: :class:`DshMessageHistory`.

Load a session as ``message_history``, let the run record itself as it goes, and hand over
what it added::

    history = DshMessageHistory("chat-1", store="sqlite:///sessions.db")
    result = agent.run_sync("Hi!", message_history=history.load(),
                            capabilities=[history.capability()])
    history.record(result.new_messages())

The capability (:meth:`DshMessageHistory.capability`) makes the run durable inside: the prompt
before the model is asked, the model's answer and its tool calls before any tool body runs,
each tool result before the next model request. ``record`` then writes only what the capability
did not (and nothing twice). Without the capability a run is recorded when ``record`` is called.

Messages go through ``ModelMessagesTypeAdapter`` (the JSON form Pydantic AI documents for
storing histories) and map onto core dsh events:

* a ``ModelRequest``'s ``system-prompt`` and ``user-prompt`` parts → ``user/message`` (system
  prompts with source ``{kind: "plugin", plugin: "pydantic-ai", form: "system"}``), its
  ``tool-return`` parts → the ``tool/result`` answering that call (an outcome other than
  ``success`` marks it an error), other parts → a ``user/message`` holding their text;
* a ``ModelResponse`` → one ``assistant/message`` (``text``, ``thinking`` as reasoning,
  ``tool-call`` blocks, other parts as ``provider-raw``), then one ``tool/call`` per tool call.

Each message is kept verbatim (on its first event), so :meth:`DshMessageHistory.load` returns
exactly what was recorded; what dsh adds reads back too (a crash-repair result as a
``ModelRequest`` with a ``tool-return`` part, a compaction summary as a user prompt). A recorded
run ends its turn (``completed``) unless a tool call is left waiting (deferred tools).

Needs ``pip install 'dsh-session[pydantic-ai]'``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from dsh._errors import AdapterError
from dsh._install import install_hint
from dsh._messages import create_assistant_message, create_user_message
from dsh.adapters._log import (
    DEFAULT_WAIT_S,
    LiveLog,
    TurnShaper,
    message_of,
    text_of,
    with_records,
)
from dsh.json import snapshot_json
from dsh.session import Event

try:
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.messages import (
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelRequest,
        ModelResponse,
    )
    from pydantic_core import PydanticSerializationError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("dsh.adapters.pydantic_ai needs Pydantic AI: "
                      f"{install_hint('pydantic-ai')}") from exc

__all__ = ["FORMAT", "DshCapability", "DshMessageHistory", "message_events",
           "messages_to_events"]

FORMAT: Final = "pydantic-ai"
"""The record format name of Pydantic AI messages (``ModelMessagesTypeAdapter`` JSON)."""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(c, str) for c in content):
        return "\n".join(content)
    return json.dumps(content)


def _prompt_blocks(content: Any) -> list[dict[str, Any]]:
    """The dsh blocks of a user prompt: strings as text, files and images raw."""
    parts = content if isinstance(content, list) else [content]
    return [{"type": "text", "text": p} if isinstance(p, str)
            else {"type": "provider-raw", "provider": FORMAT, "block": p} for p in parts]


def _response_blocks(parts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for part in parts:
        kind = part.get("part_kind")
        if kind == "text":
            blocks.append({"type": "text", "text": str(part.get("content", ""))})
        elif kind == "thinking":
            blocks.append({"type": "reasoning", "text": str(part.get("content", ""))})
        elif kind == "tool-call":
            args = part.get("args")
            blocks.append({"type": "tool-call", "id": str(part.get("tool_call_id")),
                           "name": str(part.get("tool_name")),
                           "arguments": args if isinstance(args, str) else json.dumps(args or {})})
        else:
            blocks.append({"type": "provider-raw", "provider": FORMAT, "block": part})
    return blocks


def _request_events(shaper: TurnShaper, record: dict[str, Any]) -> Event:
    """Append a request's parts; the first event carries the record, and is returned."""
    holder: Event | None = None

    def records() -> list[Any]:
        return [record] if holder is None else []

    for part in record.get("parts") or ():
        kind = part.get("part_kind")
        call_id = str(part.get("tool_call_id"))
        if kind in ("system-prompt", "user-prompt"):
            source = ({"kind": "user"} if kind == "user-prompt" else
                      {"kind": "plugin", "plugin": FORMAT, "form": "system"})
            event = shaper.user(create_user_message({
                "content": _prompt_blocks(part.get("content")),
                "source": with_records(source, FORMAT, records())}))
        elif kind == "tool-return" and shaper.can_answer(call_id):
            event = shaper.tool_result(
                call_id, [{"type": "text", "text": _text(part.get("content"))}],
                records=records(), fmt=FORMAT,
                is_error=part.get("outcome", "success") != "success")
        else:
            event = shaper.input(create_user_message({
                "content": [{"type": "text", "text": _text(part.get("content"))}],
                "source": with_records({"kind": "plugin", "plugin": FORMAT, "form": str(kind)},
                                       FORMAT, records())}))
        holder = holder or event
    if holder is None:  # a request with instructions only still needs a place for its record
        holder = shaper.input(create_user_message({"content": [], "source": with_records(
            {"kind": "plugin", "plugin": FORMAT, "form": "request"}, FORMAT, [record])}))
    return holder


def message_events(shaper: TurnShaper, record: dict[str, Any]) -> tuple[int, int]:
    """Append one message (a ``ModelMessagesTypeAdapter`` JSON record) as core events.

    Returns:
        ``(holder, last)``: the seq of the event that keeps the record verbatim, and the seq of
        the message's last event (its ``tool/call`` events included). The turn is left open.
    """
    if record.get("kind") == "response":
        parts = record.get("parts") or []
        made = create_assistant_message(
            content=_response_blocks(parts),
            provider=str(record.get("provider_name") or FORMAT),
            model=str(record.get("model_name") or "unknown"))
        holder = shaper.assistant({**made, "source": with_records(made["source"], FORMAT,
                                                                  [record])})
        for part in parts:
            if part.get("part_kind") == "tool-call":
                shaper.tool_call(str(part.get("tool_call_id")))
    else:
        holder = _request_events(shaper, record)
    return holder["seq"], shaper.session.seq - 1


def messages_to_events(shaper: TurnShaper, records: Sequence[dict[str, Any]]) -> list[Event]:
    """Append messages (``ModelMessagesTypeAdapter`` JSON records) as core events.

    Returns:
        The appended events, in order; the turn ends (``completed``) unless a call is pending.
    """
    before = shaper.session.seq
    for record in records:
        message_events(shaper, record)
    if not shaper.pending:
        shaper.end_turn()
    return list(shaper.session.events[before:])


def _synthesized(event: Event) -> list[Any]:
    """Message records for an event dsh wrote itself (repair result, compaction summary)."""
    message = message_of(event) or {}
    content = message.get("content")
    etype = event["type"]
    if etype == "tool/result":
        name = event["data"].get("error", {}).get("name", "tool")
        return [{"kind": "request", "parts": [{
            "part_kind": "tool-return", "tool_name": str(name), "content": text_of(content),
            "tool_call_id": str(message["source"]["callId"]), "outcome": "failed"}]}]
    if etype == "assistant/message":
        return [{"kind": "response", "parts": [{"part_kind": "text",
                                                "content": text_of(content)}]}]
    kind = "system-prompt" if etype == "system/message" else "user-prompt"
    return [{"kind": "request", "parts": [{"part_kind": kind, "content": text_of(content)}]}]


class DshMessageHistory:
    """A Pydantic AI message history stored as a dsh session log.

    Args:
        session_id: The dsh session id (``dsh show ID``).
        store: Store URL (``sqlite:///path.db``, ``jsonl:///dir``, ``memory:``); default
            ``sqlite:///$DSH_HOME/sessions.db``, the store the ``dsh`` command reads.

    The session is opened on first use and held for writing (exclusively, across processes)
    until :meth:`close`; an interrupted turn left by a crashed process is repaired then. Also a
    context manager (closes on exit).

    Raises:
        AdapterError: ``ADAPTER_SESSION_ID`` for an empty id; from :meth:`record`
            ``ADAPTER_ITEM`` when the messages do not serialize (nothing is written);
            ``ADAPTER_CLOSED`` after :meth:`close`.
        SessionBusyError: another process (or object) holds the session for writing.
    """

    def __init__(self, session_id: str, store: str | None = None, *,
                 wait: float = DEFAULT_WAIT_S) -> None:
        self._log = LiveLog(session_id, store, FORMAT, type(self).__name__, wait=wait)
        self.session_id = session_id
        self._known = 0  # messages of the run's history already in the log
        self._in_run: list[tuple[int, dict[str, Any]]] = []  # (holder seq, record) this run

    def capability(self) -> DshCapability:
        """A Pydantic AI capability that records the run as it goes (see the module docstring).

        Pass it per run: ``agent.run(..., message_history=history.load(),
        capabilities=[history.capability()])``.
        """
        return DshCapability(self)

    def _record_live(self, messages: Sequence[ModelMessage]) -> None:
        """Append the run's messages past those already in the log; durable on return."""
        fresh = list(messages[self._known:])
        if not fresh:
            return
        records = self._dump(fresh)
        with self._log.lock:
            shaper = self._log.open()
            for record in records:
                holder, _ = message_events(shaper, record)
                self._in_run.append((holder, record))
            self._known = len(messages)
            self._log.flush()

    def _dispatch(self, call_id: str) -> None:
        """A tool body is about to run: its ``tool/call``, durable."""
        with self._log.lock:
            if self._log.open().dispatch(call_id) is not None:
                self._log.flush()

    @property
    def store_url(self) -> str:
        """The store URL this history lives in."""
        return self._log.store_url

    def load(self) -> list[ModelMessage]:
        """The history along dsh's model view, ready for ``agent.run(message_history=...)``."""
        with self._log.lock:
            records = self._log.records(_synthesized)
            self._known, self._in_run = len(records), []
        return ModelMessagesTypeAdapter.validate_python(records)

    def record(self, messages: Sequence[ModelMessage]) -> list[Event]:
        """Append a run's messages (``result.new_messages()``) as one batch; durable on return.

        Messages the run's capability already recorded are not written again (one whose
        content changed since is superseded by its final form, ``pydantic-ai/records``).

        Returns:
            The appended events (the turn ends ``completed`` unless a call is left waiting).

        Raises:
            AdapterError: ``ADAPTER_ITEM`` when the messages do not serialize to JSON dsh can
                store; nothing is written.
        """
        records = self._dump(messages)
        with self._log.lock:
            shaper = self._log.open()
            in_run, self._in_run = self._in_run, []
            matched = 0
            for (holder, recorded), record in zip(in_run, records, strict=False):
                if record != recorded:  # the run changed it after the capability saw it
                    self._log.supersede(holder, [record])
                matched += 1
            events = list(messages_to_events(shaper, records[matched:]))
            self._known += len(records) - matched
            self._log.flush()
            return events

    def _dump(self, messages: Sequence[ModelMessage]) -> list[dict[str, Any]]:
        """The messages as ``ModelMessagesTypeAdapter`` JSON records, checked.

        Raises:
            AdapterError: ``ADAPTER_ITEM``, see :meth:`record`.
        """
        for index, message in enumerate(messages):
            if not isinstance(message, ModelRequest | ModelResponse):
                raise AdapterError(f"message {index} for session {self.session_id!r} is not a "
                                   f"ModelRequest or ModelResponse (got "
                                   f"{type(message).__name__}); nothing was written",
                                   code="ADAPTER_ITEM", session_id=self.session_id, line=index)
        try:
            records: list[dict[str, Any]] = ModelMessagesTypeAdapter.dump_python(
                list(messages), mode="json", warnings="error")
            snapshot_json(records)
        except (TypeError, ValueError, PydanticSerializationError) as exc:
            raise AdapterError(f"messages for session {self.session_id!r} do not serialize to "
                               f"JSON dsh can store ({exc}); nothing was written",
                               code="ADAPTER_ITEM", session_id=self.session_id) from exc
        for index, record in enumerate(records):
            ids = [p.get("tool_call_id") for p in record.get("parts") or ()
                   if p.get("part_kind") == "tool-call"]
            if record.get("kind") == "response" and len(ids) != len(set(ids)):
                raise AdapterError(f"message {index} for session {self.session_id!r} repeats a "
                                   f"tool_call_id ({ids}); nothing was written",
                                   code="ADAPTER_ITEM", session_id=self.session_id, line=index)
        return records

    def clear(self) -> None:
        """Take every message so far off the model view; the log keeps them (``dsh show``).

        Rule: docs/adapters.md#cleared-means-cleared
        """
        with self._log.lock:
            self._log.clear()
            self._log.flush()

    def close(self) -> None:
        """Flush and release the session (the write lock); later calls raise ADAPTER_CLOSED."""
        self._log.close()

    def __enter__(self) -> DshMessageHistory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DshCapability(AbstractCapability[Any]):
    """Records a Pydantic AI run into a :class:`DshMessageHistory` as it goes.

    Before each model request the run's new messages (the prompt, tool results) are appended
    and flushed; after it the model's response (its tool calls become tool-call blocks); before
    each tool body its ``tool/call``. A process killed anywhere in the run leaves a log whose
    resume gives the next run the prompt, the calls and an outcome-unknown result for a call
    whose body may have run.

    Args:
        history: The history the run was loaded from.
    """

    def __init__(self, history: DshMessageHistory) -> None:
        self.history = history

    async def before_model_request(self, ctx: Any, request_context: Any) -> Any:
        """Make the run's messages so far durable before the model is asked."""
        await asyncio.to_thread(self.history._record_live, list(ctx.messages))
        return request_context

    async def after_model_request(self, ctx: Any, *, request_context: Any,
                                  response: ModelResponse) -> ModelResponse:
        """Make the model's response durable before anything acts on it."""
        messages = list(ctx.messages)
        if not messages or messages[-1] is not response:
            messages.append(response)
        await asyncio.to_thread(self.history._record_live, messages)
        return response

    async def wrap_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any,
                                handler: Any) -> Any:
        """Record the call's ``tool/call`` (durable), then run its body."""
        await asyncio.to_thread(self.history._dispatch, str(call.tool_call_id))
        return await handler(args)

"""dsh as a LangChain chat message history: :class:`DshChatMessageHistory`.

``DshChatMessageHistory(session_id, store=URL)`` is a ``BaseChatMessageHistory`` (``messages``,
``add_messages``, ``aadd_messages``, ``clear``, ``aclear``; so ``RunnableWithMessageHistory``
and every chain that takes a history can use it). Messages map onto core dsh events:

* ``HumanMessage`` → ``user/message``; ``SystemMessage`` → ``user/message`` with source
  ``{kind: "plugin", plugin: "langchain", form: "system"}`` (a system prompt inside the log;
  dsh's ``system/message`` is reserved for the surface head);
* ``AIMessage`` → ``assistant/message`` (text blocks, ``tool-call`` blocks for its
  ``tool_calls``, arguments as JSON text), then one ``tool/call`` per tool call;
* ``ToolMessage`` → the ``tool/result`` answering its ``tool_call_id`` (``status="error"``
  marks it an error); one whose call is not pending becomes a ``user/message``;
* any other message → a ``user/message`` holding its text.

Each message is also kept verbatim (``message_to_dict``), so ``messages`` returns exactly what
was added, type and fields; what dsh adds reads back too (a crash-repair result as a
``ToolMessage`` with ``status="error"``, a compaction summary as a ``HumanMessage``).
``clear()`` appends an ``ignorable`` ``langchain/clear`` event: the log keeps every byte.

Needs ``pip install 'dsh-session[langchain]'``.
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
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
        message_to_dict,
        messages_from_dict,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("dsh.adapters.langchain needs langchain-core: "
                      f"{install_hint('langchain')}") from exc

__all__ = ["FORMAT", "DshChatMessageHistory", "message_record", "messages_to_events", "model_of"]

FORMAT: Final = "langchain"
"""The record format name of LangChain messages (``message_to_dict`` form)."""


def _blocks(content: Any) -> list[dict[str, Any]]:
    """The dsh blocks of a LangChain ``content`` (a string, or a list of strings and blocks)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    out: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else ():
        if isinstance(part, str):
            out.append({"type": "text", "text": part})
        elif isinstance(part, Mapping) and part.get("type") == "text" \
                and isinstance(part.get("text"), str):
            out.append({"type": "text", "text": part["text"]})
        else:
            out.append({"type": "provider-raw", "provider": "langchain", "block": part})
    return out


def message_record(message: Any, index: int, session_id: str) -> dict[str, Any]:
    """The ``message_to_dict`` record of ``message`` as plain JSON, checked.

    Raises:
        AdapterError: ``ADAPTER_ITEM`` naming ``index`` when ``message`` is not a
            ``BaseMessage``, repeats a tool call id, or does not serialize to JSON.
    """
    if not isinstance(message, BaseMessage):
        raise AdapterError(f"message {index} is not a LangChain BaseMessage (got "
                           f"{type(message).__name__}); nothing was written",
                           code="ADAPTER_ITEM", session_id=session_id, line=index)
    if isinstance(message, AIMessage):
        ids = [call.get("id") for call in message.tool_calls if call.get("id")]
        if len(ids) != len(set(ids)) or not all(call.get("name") for call in message.tool_calls):
            raise AdapterError(f"message {index} (ai) has tool calls with a repeated id or no "
                               f"name ({ids}); nothing was written", code="ADAPTER_ITEM",
                               session_id=session_id, line=index)
    try:
        record: dict[str, Any] = json.loads(json.dumps(message_to_dict(message)))
        snapshot_json(record)
    except (TypeError, ValueError) as exc:
        raise AdapterError(f"message {index} ({message.type}) is not JSON dsh can store "
                           f"({exc}); nothing was written", code="ADAPTER_ITEM",
                           session_id=session_id, line=index) from exc
    return record


def model_of(message: AIMessage, default: str) -> tuple[str, str]:
    """``(provider, model)`` an ``AIMessage`` says it came from (its ``response_metadata``).

    LangChain chat models put ``model_provider`` and ``model_name`` (or ``model``) there; a
    message without them gives ``("langchain", default)``.
    """
    meta = message.response_metadata or {}
    provider = meta.get("model_provider")
    name = meta.get("model_name") or meta.get("model")
    return (provider if isinstance(provider, str) and provider else FORMAT,
            name if isinstance(name, str) and name else default)


def messages_to_events(shaper: TurnShaper, messages: Sequence[BaseMessage],
                       records: Sequence[dict[str, Any]], *, model: str) -> list[Event]:
    """Append ``messages`` (with their ``message_to_dict`` records) as core events.

    Returns:
        The appended events, in order. A batch ending with an ``AIMessage`` that has no tool
        calls ends the turn (``completed``).
    """
    before = shaper.session.seq
    for message, record in zip(messages, records, strict=True):
        if isinstance(message, HumanMessage | SystemMessage):
            source = ({"kind": "user"} if isinstance(message, HumanMessage) else
                      {"kind": "plugin", "plugin": FORMAT, "form": "system"})
            shaper.user(create_user_message({"content": _blocks(message.content),
                                             "source": with_records(source, FORMAT, [record])}))
        elif isinstance(message, AIMessage):
            calls = [(call.get("id") or f"call_{message.id or before}_{i}", call)
                     for i, call in enumerate(message.tool_calls)]
            blocks = _blocks(message.content) + [
                {"type": "tool-call", "id": call_id, "name": call["name"],
                 "arguments": json.dumps(call.get("args", {}))} for call_id, call in calls]
            provider, name = model_of(message, model)
            made = create_assistant_message(content=blocks, provider=provider, model=name)
            shaper.assistant({**made, "source": with_records(made["source"], FORMAT,
                                                             [record])})
            for call_id, _ in calls:
                shaper.tool_call(call_id)
        elif isinstance(message, ToolMessage) and shaper.can_answer(message.tool_call_id):
            shaper.tool_result(message.tool_call_id, _blocks(message.content), records=[record],
                               fmt=FORMAT, is_error=message.status == "error")
        else:
            shaper.input(create_user_message({
                "content": _blocks(message.content) or [{"type": "text", "text": ""}],
                "source": with_records({"kind": "plugin", "plugin": FORMAT,
                                        "form": message.type}, FORMAT, [record])}))
    last = messages[-1] if messages else None
    if isinstance(last, AIMessage) and not shaper.pending:
        shaper.end_turn()
    return list(shaper.session.events[before:])


def _synthesized(event: Event) -> list[Any]:
    """Message records for an event dsh wrote itself (repair result, compaction summary)."""
    message = message_of(event) or {}
    content = message.get("content")
    etype = event["type"]
    if etype == "tool/result":
        block = content[0] if content else {}
        made: BaseMessage = ToolMessage(content=text_of(content),
                                        tool_call_id=str(message["source"]["callId"]),
                                        status="error" if block.get("isError") else "success")
    elif etype == "assistant/message":
        made = AIMessage(content=text_of(content), tool_calls=[
            {"id": b["id"], "name": b["name"], "args": _args(b.get("arguments"))}
            for b in content or () if b.get("type") == "tool-call"])
    elif etype == "system/message":
        made = SystemMessage(content=text_of(content))
    else:
        made = HumanMessage(content=text_of(content))
    return [message_to_dict(made)]


def _args(arguments: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else {}
    except ValueError:
        return {"_raw": arguments}
    return parsed if isinstance(parsed, dict) else {"_value": parsed}


class DshChatMessageHistory(BaseChatMessageHistory):
    """A LangChain chat message history stored as a dsh session log.

    Args:
        session_id: The dsh session id (``dsh show ID``).
        store: Store URL (``sqlite:///path.db``, ``jsonl:///dir``, ``memory:``); default
            ``sqlite:///$DSH_HOME/sessions.db``, the store the ``dsh`` command reads.
        model: Model name recorded for an ``AIMessage`` whose ``response_metadata`` names none
            (LangChain chat models put ``model_provider`` and ``model_name`` there).
        wait: Seconds to wait for a session another process is writing (default 5).

    The session is opened on first use and held for writing (exclusively, across processes)
    until :meth:`close`; an interrupted turn left by a crashed process is repaired then.

    Raises:
        AdapterError: ``ADAPTER_SESSION_ID`` for an empty id; from :meth:`add_messages`
            ``ADAPTER_ITEM`` naming the first message that is not a ``BaseMessage`` or not
            JSON (nothing of the batch is written); ``ADAPTER_CLOSED`` after :meth:`close`.
        SessionBusyError: another process (or object) holds the session for writing.
    """

    def __init__(self, session_id: str, store: str | None = None, *,
                 model: str = "unknown", wait: float = DEFAULT_WAIT_S) -> None:
        self._log = LiveLog(session_id, store, FORMAT, type(self).__name__, wait=wait)
        self.session_id = session_id
        self.model = model

    @property
    def store_url(self) -> str:
        """The store URL this history lives in."""
        return self._log.store_url

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The history along dsh's model view: what was added, plus what dsh added."""
        with self._log.lock:
            records = self._log.records(_synthesized)
        return messages_from_dict(records)

    async def aget_messages(self) -> list[BaseMessage]:
        """Async :attr:`messages` (in a worker thread)."""
        return await asyncio.to_thread(lambda: self.messages)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append ``messages`` as one batch; durable when this returns.

        Raises:
            AdapterError: ``ADAPTER_ITEM`` naming the first bad message; nothing is written.
        """
        records = [message_record(m, i, self.session_id) for i, m in enumerate(messages)]
        with self._log.lock:
            shaper = self._log.open()
            if records:
                messages_to_events(shaper, list(messages), records, model=self.model)
                self._log.flush()

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Async :meth:`add_messages` (in a worker thread)."""
        await asyncio.to_thread(self.add_messages, messages)

    def clear(self) -> None:
        """Hide every message so far from :attr:`messages`; the log keeps them (``dsh show``)."""
        with self._log.lock:
            self._log.clear()
            self._log.flush()

    async def aclear(self) -> None:
        """Async :meth:`clear` (in a worker thread)."""
        await asyncio.to_thread(self.clear)

    def close(self) -> None:
        """Flush and release the session (the write lock); later calls raise ADAPTER_CLOSED."""
        self._log.close()

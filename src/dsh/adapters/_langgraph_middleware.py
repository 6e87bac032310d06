"""The LangChain ``create_agent`` middleware of :class:`dsh.adapters.langgraph.DshSaver`.

Kept apart so that ``dsh.adapters.langgraph`` needs only LangGraph; this module needs the
``langchain`` package (``create_agent``'s home).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from langchain.agents.middleware import AgentMiddleware


class _Saver(Protocol):
    """What the middleware uses of :class:`dsh.adapters.langgraph.DshSaver`."""

    def current_thread(self) -> str | None: ...

    def record_messages(self, thread_id: str, messages: Sequence[Any]) -> None: ...

    def answer_open_calls(self, thread_id: str | None,
                          messages: Sequence[Any]) -> list[Any]: ...

    def wrap_tool_call(self, request: Any, execute: Callable[[Any], Any]) -> Any: ...

    async def awrap_tool_call(self, request: Any,
                              execute: Callable[[Any], Awaitable[Any]]) -> Any: ...


class DshMiddleware(AgentMiddleware):
    """Makes an agent's prompt, answers and tool calls durable as the run goes.

    Args:
        saver: The checkpointer the agent runs with.
    """

    def __init__(self, saver: _Saver) -> None:
        super().__init__()
        self.saver = saver

    def _record(self, request: Any, response: Any = None) -> None:
        thread_id = self.saver.current_thread()
        if thread_id is None:
            return
        messages = list(request.state.get("messages") or request.messages)
        if response is not None:
            messages.extend(getattr(response, "result", None) or ())
        self.saver.record_messages(thread_id, messages)

    def _answered(self, request: Any) -> Any:
        """``request`` with no call left unanswered (see ``DshSaver.answer_open_calls``)."""
        messages = request.messages
        answered = self.saver.answer_open_calls(self.saver.current_thread(), messages)
        return request if answered is messages else request.override(messages=answered)

    def _before_model(self, request: Any) -> Any:
        self._record(request)
        return self._answered(request)

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Prompt durable before the call, answer and tool calls durable after it.

        The model is never sent a call without an answer: one left open in the state gets
        dsh's (its logged result or an outcome-unknown closer).
        """
        sent = self._before_model(request)
        response = handler(sent)
        self._record(request, response)
        return response

    async def awrap_model_call(self, request: Any,
                               handler: Callable[[Any], Awaitable[Any]]) -> Any:
        """Async :meth:`wrap_model_call`."""
        sent = await asyncio.to_thread(self._before_model, request)
        response = await handler(sent)
        await asyncio.to_thread(self._record, request, response)
        return response

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """See :meth:`DshSaver.wrap_tool_call`."""
        return self.saver.wrap_tool_call(request, handler)

    async def awrap_tool_call(self, request: Any,
                              handler: Callable[[Any], Awaitable[Any]]) -> Any:
        """See :meth:`DshSaver.awrap_tool_call`."""
        return await self.saver.awrap_tool_call(request, handler)

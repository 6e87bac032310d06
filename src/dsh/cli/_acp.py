"""An Agent Client Protocol agent over a dsh store and dsh's agent loop (``dsh acp``).

An editor (Zed, JetBrains, any ACP client) starts ``dsh acp`` and speaks JSON-RPC on its stdio.
Every session it creates or continues is an ordinary dsh session in the store (``dsh show``
it). Rule: docs/standards.md#agent-client-protocol.

* ``session/new`` creates a session (header ``cwd`` = the editor's folder);
* ``session/prompt`` runs one turn of the agent loop; what the log records streams back as
  ``session/update`` notifications while it happens (text and reasoning deltas, a tool call when
  its ``tool/call`` is logged, its result when the ``tool/result`` is), and the stop reason
  follows the ``turn/end`` reason (``end_turn``, ``max_tokens``, ``cancelled``);
* ``session/cancel`` cancels the running turn: the loop records what streamed, aborts the tools
  and ends the turn ``aborted`` before the prompt answers ``cancelled``;
* ``session/load`` resumes a stored session (an interrupted turn is closed first) and replays
  its history, in log order, as ``session/update`` notifications before it answers;
* ``session/resume`` resumes without the replay; ``session/fork`` forks the session (the
  child inherits every event; the live session when it is open here, else the stored log) and
  answers the child's id; ``session/list`` lists the store's
  sessions (``cwd``, title, last activity), optionally of one folder.

The ``agent-client-protocol`` package (extra ``acp``) is imported by this module only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Literal
from uuid import uuid4

from acp import (
    PROTOCOL_VERSION,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PromptResponse,
    RequestError,
    start_tool_call,
    text_block,
    tool_content,
    update_agent_message_text,
    update_agent_thought_text,
    update_tool_call,
    update_user_message_text,
)
from acp.schema import (
    AgentCapabilities,
    ForkSessionResponse,
    Implementation,
    ListSessionsResponse,
    ResumeSessionResponse,
    SessionCapabilities,
    SessionForkCapabilities,
    SessionInfo,
    SessionListCapabilities,
    SessionResumeCapabilities,
)

from dsh._errors import DshError, EventRejectedError
from dsh.cli._common import fresh_session_id

if TYPE_CHECKING:
    from dsh import Store
    from dsh.agent import Agent
    from dsh.session import Event, Session

__all__ = ["DshAcpAgent", "history_updates", "live_updates"]

logger = logging.getLogger(__name__)

StopReason = Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]
_STOP: Final[dict[str, StopReason]] = {"completed": "end_turn", "max-tokens": "max_tokens",
                                       "aborted": "cancelled", "blocked": "refusal"}

AgentOptions = Callable[[str], dict[str, Any]]
"""``cwd -> options``: the :class:`dsh.agent.Agent` options for a session in that folder
(``config``, ``tools``, ``system``, ``context_window``)."""

StoreOpener = Callable[[bool], "Store | None"]
"""``create -> store``: the store, opened at the first call that finds or creates it and the
same one after. With ``create=False`` it is None (nothing created, nothing opened) while the
store does not exist; with True it is created if need be (docs/cli.md#stores-and-ids)."""


def _text(blocks: Any) -> str:
    return "".join(str(b.get("text", "")) for b in blocks or []
                   if isinstance(b, Mapping) and b.get("type") == "text")


def _result_update(data: Mapping[str, Any]) -> Any:
    message = data.get("message") if isinstance(data.get("message"), Mapping) else {}
    assert isinstance(message, Mapping)
    [block] = [b for b in message.get("content") or [] if isinstance(b, Mapping)] or [{}]
    source = message.get("source") if isinstance(message.get("source"), Mapping) else {}
    call_id = str(source.get("callId")) if isinstance(source, Mapping) else ""
    return update_tool_call(call_id, status="failed" if block.get("isError") else "completed",
                            content=[tool_content(text_block(_text(block.get("content"))))],
                            raw_output=_text(block.get("content")))


def live_updates(event: Mapping[str, Any]) -> list[Any]:
    """The ``session/update`` payloads one committed event streams to the editor (in order).

    ``assistant/chunk`` text and reasoning deltas, ``tool/call`` (a pending tool call),
    ``tool/result`` (its completion with the result text); nothing for other events.
    """
    etype = event.get("type")
    data = event.get("data") if isinstance(event.get("data"), Mapping) else {}
    assert isinstance(data, Mapping)
    if etype == "assistant/chunk":
        chunk = data.get("chunk") if isinstance(data.get("chunk"), Mapping) else {}
        assert isinstance(chunk, Mapping)
        if chunk.get("type") == "text-delta" and chunk.get("text"):
            return [update_agent_message_text(str(chunk["text"]))]
        if chunk.get("type") == "reasoning-delta" and chunk.get("text"):
            return [update_agent_thought_text(str(chunk["text"]))]
        return []
    if etype == "tool/call":
        return [start_tool_call(str(data.get("callId")), str(data.get("name", "")),
                                kind="other", status="in_progress",
                                raw_input=str(data.get("arguments", "")))]
    if etype == "tool/result":
        return [_result_update(data)]
    return []


def history_updates(events: Any) -> list[Any]:
    """The ``session/update`` payloads replaying a stored log's history, in log order.

    Each user message that entered the model's view is a user message chunk; each answer its
    reasoning, text and tool calls (pending); each tool result completes its call.
    """
    out: list[Any] = []
    for event in events:
        if event.get("ignorable") or event.get("surfaceOp") is None:
            continue
        etype = event["type"]
        data = event["data"]
        if etype == "user/message" and _text(data.get("content")):
            out.append(update_user_message_text(_text(data.get("content"))))
        elif etype == "assistant/message":
            for block in data["message"].get("content") or []:
                kind = block.get("type")
                if kind == "reasoning" and block.get("text"):
                    out.append(update_agent_thought_text(str(block["text"])))
                elif kind == "text" and block.get("text"):
                    out.append(update_agent_message_text(str(block["text"])))
                elif kind == "tool-call":
                    out.append(start_tool_call(str(block.get("id")), str(block.get("name", "")),
                                               kind="other", status="pending",
                                               raw_input=str(block.get("arguments", ""))))
        elif etype == "tool/result":
            out.append(_result_update(data))
    return out


def _request_key(message: Any, *, answer: bool) -> str | None:
    """The id of a JSON-RPC request (``answer=False``) or of an answer to one, as a key."""
    if not isinstance(message, dict) or "id" not in message or ("method" in message) == answer:
        return None
    return json.dumps(message["id"], sort_keys=True)


class StdioTransport:
    """The ACP connection's messages over stdin and stdout, whatever files they are.

    Unlike the package's own stdio (asyncio pipe transports), stdin and stdout may be regular
    files as well as pipes, sockets or terminals (``dsh acp < request.json > answer.json``).
    The end of stdin is passed on only once every request read has been answered, so a client
    that writes its requests and closes stdin (``echo '{...}' | dsh acp``) still gets its
    answers. Messages are newline-delimited JSON; a line that is not JSON, or JSON but not an
    object (a batch array, a bare value), is logged and skipped.
    Rule: docs/standards.md#agent-client-protocol.
    """

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._messages: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._pending: set[str] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._write_lock = asyncio.Lock()
        self._ended: list[asyncio.Task[None]] = []
        threading.Thread(target=self._read, name="dsh-acp-stdin", daemon=True).start()

    def _read(self) -> None:
        loop = self._loop
        with contextlib.suppress(RuntimeError):  # the loop closed: dsh acp is shutting down
            try:
                for line in iter(sys.stdin.buffer.readline, b""):
                    loop.call_soon_threadsafe(self._incoming, line)
            finally:
                loop.call_soon_threadsafe(self._end)

    def _incoming(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = json.loads(line)
        except ValueError:
            logger.warning("dsh acp: a line of stdin is not JSON; skipped")
            return
        if not isinstance(message, dict):  # a batch array or a bare value: the acp package's
            # receive loop would fail on it and end the whole connection
            logger.warning("dsh acp: a line of stdin is JSON but not a JSON-RPC message object "
                           "(found %s); skipped", type(message).__name__)
            return
        key = _request_key(message, answer=False)
        if key is not None:
            self._pending.add(key)
            self._idle.clear()
        self._messages.put_nowait(message)

    def _end(self) -> None:
        async def after_the_answers() -> None:
            await self._idle.wait()
            self._messages.put_nowait(None)

        self._ended.append(self._loop.create_task(after_the_answers()))

    async def receive(self) -> dict[str, Any] | None:
        """The next message from stdin; None at its end (once every request is answered)."""
        return await self._messages.get()

    async def send(self, message: dict[str, Any]) -> None:
        """Write one message as a line of stdout."""
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode("utf-8")

        def put() -> None:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()

        async with self._write_lock:
            await asyncio.to_thread(put)
        key = _request_key(message, answer=True)
        if key is not None:
            self._pending.discard(key)
            if not self._pending:
                self._idle.set()

    async def close(self) -> None:
        """Nothing to release: stdout is flushed at each message."""


class DshAcpAgent:
    """The ACP agent: one dsh store, one agent loop per open session.

    The store is opened lazily: a read (list, load, resume, fork) of a store that does not
    exist answers as an empty store would and creates nothing; the first ``session/new`` that
    has a model creates it. So a client that connects, lists and quits leaves nothing behind.

    Args:
        store: Opens the store sessions live in (``dsh.open(url)``), at first need.
        provider: The model backend every session's loop uses, or None when it could not be
            set up: then every method that needs a loop (new, load, resume, prompt)
            answers an error carrying ``unavailable``, and the others still work.
        options: The loop's options for a session's folder.
        unavailable: Why there is no provider (the ``DshError`` that prevented it).
    """

    def __init__(self, store: StoreOpener, provider: Any, options: AgentOptions, *,
                 unavailable: DshError | None = None) -> None:
        self._open_store = store
        self._provider = provider
        self._unavailable = unavailable
        self._options = options
        self._agents: dict[str, Agent] = {}
        self._running: dict[str, asyncio.Task[Any]] = {}
        self._conn: Any = None

    def on_connect(self, conn: Any) -> None:
        """Keep the client connection (``session/update`` goes through it)."""
        self._conn = conn

    async def initialize(self, protocol_version: int, client_capabilities: Any = None,
                         client_info: Any = None, **kwargs: Any) -> InitializeResponse:
        """Answer with dsh's capabilities: load, list, fork and resume."""
        from dsh import __version__

        sessions = SessionCapabilities(list=SessionListCapabilities(),
                                       fork=SessionForkCapabilities(),
                                       resume=SessionResumeCapabilities())
        return InitializeResponse(
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(load_session=True,
                                                 session_capabilities=sessions),
            agent_info=Implementation(name="dsh", title="dsh", version=__version__))

    async def authenticate(self, method_id: str, **kwargs: Any) -> None:
        """No authentication: the provider key comes from dsh's environment."""
        return None

    async def new_session(self, cwd: str, mcp_servers: Any = None,
                          **kwargs: Any) -> NewSessionResponse:
        """Create a session in the store whose header names ``cwd``.

        Raises:
            RequestError: invalid params (the ``EventRejectedError``'s code and message) when
                the header is refused, such as a ``cwd`` that is not an absolute path
                (docs/formats.md#the-session-header).
        """
        session_id = str(uuid4())
        try:
            self._agents[session_id] = self._live(session_id, cwd, {"cwd": cwd})
        except EventRejectedError as exc:  # the header refused: the client's params
            raise RequestError.invalid_params({"code": exc.code, "message": exc.message}) from exc
        return NewSessionResponse(session_id=session_id)

    def _need_provider(self) -> None:
        if self._provider is None:
            problem = self._unavailable
            raise RequestError.auth_required(
                {"code": problem.code if problem else "NO_PROVIDER",
                 "message": problem.message if problem else "no model provider"})

    def _live(self, session_id: str, cwd: str, header: Mapping[str, Any] | None) -> Agent:
        """The loop over ``session_id`` live in this store (created with ``header`` if new)."""
        from dsh.agent import Agent

        self._need_provider()
        store = self._open_store(True)
        assert store is not None  # created if need be
        session = store.session(session_id, header=header)
        return Agent(session, self._provider, store=store.sessions, **self._options(cwd))

    async def _open(self, session_id: str, cwd: str) -> Agent:
        agent = self._agents.get(session_id)
        if agent is None:
            store = self._open_store(False)
            if store is None or not store.exists(session_id):
                raise RequestError.resource_not_found(session_id)
            self._need_provider()
            try:
                agent = await store.agent(session_id, provider=self._provider,
                                          **self._options(cwd))
            except DshError as exc:
                raise RequestError.internal_error({"reason": exc.message}) from exc
            self._agents[session_id] = agent
        return agent

    async def load_session(self, cwd: str, session_id: str, mcp_servers: Any = None,
                           **kwargs: Any) -> LoadSessionResponse:
        """Resume ``session_id`` and replay its history as updates before answering."""
        agent = await self._open(session_id, cwd)
        for update in history_updates(list(agent.session.events)):
            await self._conn.session_update(session_id=session_id, update=update)
        return LoadSessionResponse()

    async def resume_session(self, cwd: str, session_id: str, mcp_servers: Any = None,
                             **kwargs: Any) -> ResumeSessionResponse:
        """Resume ``session_id`` without replaying it."""
        await self._open(session_id, cwd)
        return ResumeSessionResponse()

    async def fork_session(self, cwd: str, session_id: str, mcp_servers: Any = None,
                           **kwargs: Any) -> ForkSessionResponse:
        """Fork ``session_id`` with every event inherited; answer the child's id.

        A session open here is forked from its live log (the child is live here too, with its
        own loop); a stored one from disk, off the event loop.
        """
        store = self._open_store(False)
        if store is None:  # no store yet: nothing to fork
            raise RequestError.resource_not_found(session_id)
        name = fresh_session_id(store)
        live = session_id in self._agents
        try:
            if live:
                child = store.fork(session_id, child_id=name)
            else:
                child = await asyncio.to_thread(store.fork, session_id, child_id=name)
        except DshError as exc:
            raise RequestError.resource_not_found(session_id) from exc
        if live:
            self._agents[child] = self._live(child, cwd, None)
        return ForkSessionResponse(session_id=str(child))

    async def list_sessions(self, cwd: str | None = None, cursor: str | None = None,
                            **kwargs: Any) -> ListSessionsResponse:
        """Every stored session (of ``cwd`` when given), newest activity first."""
        import datetime as dt

        store = self._open_store(False)
        rows = [] if store is None else await asyncio.to_thread(store.list)
        out = []
        for row in rows:
            header = row.header
            where = str(header.get("cwd") or "")
            if cwd is not None and where != cwd:
                continue
            when = dt.datetime.fromtimestamp(row.last_activity_ms / 1000, tz=dt.UTC)
            out.append(SessionInfo(session_id=str(header["id"]), cwd=where or "/",
                                   title=row.title or row.first_prompt,
                                   updated_at=when.isoformat()))
        return ListSessionsResponse(sessions=out)

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        """Run one turn; stream what the log records; answer the turn's stop reason."""
        agent = self._agents.get(session_id)
        if agent is None:
            raise RequestError.resource_not_found(session_id)
        text = "\n".join(getattr(block, "text", "") for block in prompt
                         if getattr(block, "type", None) == "text")
        queue: asyncio.Queue[Any] = asyncio.Queue()

        def observe(session: Session, event: Event) -> None:
            for update in live_updates(event):
                queue.put_nowait(update)

        async def pump() -> None:
            while True:
                update = await queue.get()
                if update is None:
                    return
                await self._conn.session_update(session_id=session_id, update=update)

        sender = asyncio.create_task(pump())
        stop = agent.session.observe(observe)
        task = asyncio.create_task(agent.run(text))
        self._running[session_id] = task
        try:
            result = await task
            reason = str(result.reason.get("kind"))
        except asyncio.CancelledError:
            if not task.cancelled():
                raise  # this request itself was cancelled
            reason = "aborted"
        except DshError as exc:
            logger.warning("session %s: the turn failed: %s", session_id, exc)
            reason = "error"
        finally:
            self._running.pop(session_id, None)
            stop()
            queue.put_nowait(None)
            await sender
        if reason == "error":
            raise RequestError.internal_error({"reason": "the model call failed; see dsh show "
                                                         f"{session_id}"})
        return PromptResponse(stop_reason=_STOP.get(reason, "end_turn"))

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        """Cancel the running turn of ``session_id`` (nothing when none runs)."""
        task = self._running.get(session_id)
        if task is not None:
            task.cancel()

    async def close(self) -> None:
        """Cancel running turns and let them end (their logs are closed properly)."""
        for task in list(self._running.values()):
            task.cancel()
        for task in list(self._running.values()):
            try:
                await task
            except (asyncio.CancelledError, Exception):
                logger.debug("a turn ended while dsh acp shut down", exc_info=True)

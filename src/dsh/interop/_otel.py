"""A session's events as OpenTelemetry GenAI spans: one mapping, live and after the fact.

:class:`SpanMapper` reads events one at a time, in log order, and opens and closes
:class:`SpanRecord` s (Rule: docs/standards.md#opentelemetry):

* ``invoke_agent dsh`` per turn (``turn/start`` … ``turn/end``; ``dsh.turn.end_reason``; an
  ``error`` end sets ``error.type`` to the failure code and the status to error);
* ``chat {model}`` per model request, from ``step/start`` to the step's ``assistant/message``
  (retries inside it are span events ``dsh.llm.retry``, as one logical request): provider,
  request and response model, usage (``gen_ai.usage.input_tokens`` counts cached input too;
  ``…cache_read.input_tokens``, ``…cache_creation.input_tokens``, ``output_tokens``) and
  ``gen_ai.response.finish_reasons``;
* ``execute_tool {name}`` per tool call (``tool/call`` … its ``tool/result``;
  ``gen_ai.tool.call.id``, ``gen_ai.tool.name``; an error result sets ``error.type``);
* ``update_memory dsh`` per compaction (``compaction/start`` … ``compaction/end``), a memory
  operation, child of the turn that ran it (a root span between turns); one that gave up
  (``compaction/end`` with an ``error``) has ``error.type`` the error's class;
* every span carries ``gen_ai.conversation.id`` = the session id. Message content (prompts,
  answers, tool arguments and results) is recorded only with ``capture_content=True``.

Span times are the events' own times (epoch ms), so a live run and a replay of its stored log
give the same spans. :func:`to_otlp_json` replays a whole log (and its subagent sessions) as an
OTLP/JSON ``ExportTraceServiceRequest``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from dsh.interop._history import LogLike, usage_of

AGENT_NAME: Final = "dsh"
SCOPE: Final = "dsh"

_FINISH: Final = {"stop": "stop", "tool-calls": "tool_calls", "max-tokens": "length",
                  "aborted": "aborted", "error": "error"}
"""dsh finish kinds → ``gen_ai.response.finish_reasons`` values (OpenAI's words)."""


@dataclass(eq=False)
class SpanRecord:
    """One span as the mapper builds it.

    Attributes:
        key: Stable identity within the session, e.g. ``"turn:3"``, ``"tool:call_1"``.
        name: Span name, e.g. ``"chat gpt-5"``.
        kind: ``"internal"`` or ``"client"`` (the model request).
        parent: The parent span, or None for a root.
        start_ms / end_ms: Event times (epoch ms); ``end_ms`` None while open.
        attributes: OpenTelemetry attributes (str, int, bool, float or lists of str).
        events: ``(name, time_ms, attributes)`` span events.
        error: ``error.type`` when the operation failed, else None.
        seq: Seq of the event that opened it (stable span ids in a replay).
    """

    key: str
    name: str
    kind: Literal["internal", "client"]
    parent: SpanRecord | None
    start_ms: int
    seq: int
    end_ms: int | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    error: str | None = None


Action = tuple[Literal["start", "end"], SpanRecord]


def _parts(content: Sequence[Any]) -> list[dict[str, Any]]:
    """Dsh blocks as GenAI message parts (``text``, ``reasoning``, ``tool_call``, …)."""
    parts: list[dict[str, Any]] = []
    for b in content:
        if not isinstance(b, Mapping):
            continue
        kind = b.get("type")
        if kind == "text":
            parts.append({"type": "text", "content": str(b.get("text", ""))})
        elif kind == "reasoning":
            parts.append({"type": "reasoning", "content": str(b.get("text", ""))})
        elif kind == "tool-call":
            parts.append({"type": "tool_call", "id": str(b.get("id")),
                          "name": str(b.get("name", "")), "arguments": b.get("arguments")})
        elif kind == "tool-result":
            inner = [str(x.get("text", "")) for x in b.get("content") or []
                     if isinstance(x, Mapping) and x.get("type") == "text"]
            parts.append({"type": "tool_call_response", "id": str(b.get("toolCallId")),
                          "response": "\n".join(inner)})
        else:
            parts.append({"type": str(kind)})
    return parts


def _message_json(messages: Sequence[Mapping[str, Any]]) -> str:
    out = [{"role": "tool" if (m.get("source") or {}).get("kind") == "tool" else m.get("role"),
            "parts": _parts(m.get("content") or [])} for m in messages]
    return json.dumps(out, ensure_ascii=False, default=str)


def _message_of(event: Mapping[str, Any]) -> Mapping[str, Any] | None:
    data = event.get("data")
    if not isinstance(data, Mapping):
        return None
    if event.get("type") in ("user/message", "system/message"):
        return data
    message = data.get("message")
    return message if isinstance(message, Mapping) else None


class SpanMapper:
    """Turns a session's events, fed in log order, into span starts and ends.

    Args:
        session_id: The session (``gen_ai.conversation.id``).
        capture_content: Record message content (``gen_ai.input.messages``,
            ``gen_ai.output.messages``, tool arguments and results). Off by default: content may
            be sensitive, as the GenAI conventions say.
    """

    def __init__(self, session_id: str, *, capture_content: bool = False) -> None:
        self.session_id = session_id
        self.capture_content = capture_content
        self.turn: SpanRecord | None = None
        self.chat: SpanRecord | None = None
        self.chat_done: SpanRecord | None = None  # ended at step/end, error still to learn
        self.tools: dict[str, SpanRecord] = {}
        self.memory: SpanRecord | None = None
        self.provider: str | None = None
        self.model: str | None = None
        self.by_seq: dict[int, Mapping[str, Any]] = {}
        self.view: list[int] = []  # surface nodes (seqs), kept only to capture content

    # -- helpers

    def _open(self, key: str, name: str, kind: Literal["internal", "client"],
              parent: SpanRecord | None, event: Mapping[str, Any], operation: str,
              out: list[Action]) -> SpanRecord:
        span = SpanRecord(key, name, kind, parent, int(event.get("time") or 0),
                          int(event.get("seq") or 0))
        span.attributes["gen_ai.operation.name"] = operation
        span.attributes["gen_ai.conversation.id"] = self.session_id
        out.append(("start", span))
        return span

    def _close(self, span: SpanRecord, time_ms: int, out: list[Action]) -> None:
        span.end_ms = max(time_ms, span.start_ms)
        out.append(("end", span))

    def _flush_chat(self, out: list[Action], error: str | None = None) -> None:
        span = self.chat_done
        if span is not None:
            if error is not None and span.error is None:
                span.error = error
            self.chat_done = None
            out.append(("end", span))

    # -- the mapping

    def feed(self, event: Mapping[str, Any]) -> list[Action]:
        """Map one event; return the spans it opens and closes, in order.

        A closed span is final (``end_ms``, attributes and ``error`` set). A chat span left
        without an answer at ``step/end`` is closed at that time but reported when the next
        event says why (the turn's error), so its ``error`` names the failure.
        """
        out: list[Action] = []
        etype = str(event.get("type"))
        data = event.get("data") if isinstance(event.get("data"), Mapping) else {}
        assert isinstance(data, Mapping)
        time_ms = int(event.get("time") or 0)
        seq = event.get("seq")
        if isinstance(seq, int):
            self.by_seq[seq] = event
            self._track_view(event, seq)
        if etype != "turn/end":
            self._flush_chat(out)
        if etype == "turn/start":
            self._end_turn(time_ms, None, out)
            span = self._open(f"turn:{data.get('turn')}", f"invoke_agent {AGENT_NAME}",
                              "internal", None, event, "invoke_agent", out)
            span.attributes["gen_ai.agent.name"] = AGENT_NAME
            span.attributes["dsh.turn"] = int(data.get("turn") or 0)
            self.turn = span
        elif etype == "turn/end":
            reason = data.get("reason") if isinstance(data.get("reason"), Mapping) else {}
            self._end_turn(time_ms, reason, out)
        elif etype == "step/start":
            self._open_chat(event, data, out)
        elif etype in ("request/header", "request/context"):
            self._request(data)
        elif etype == "llm/retry" and self.chat is not None:
            failure = data.get("failure") if isinstance(data.get("failure"), Mapping) else {}
            self.chat.events.append(("dsh.llm.retry", time_ms, {
                "dsh.retry.attempt": int(data.get("attempt") or 0),
                "dsh.retry.cause": str(data.get("cause", "")),
                "error.type": str(failure.get("code", "")) if isinstance(failure, Mapping)
                else ""}))
        elif etype == "assistant/message":
            self._answer(event, data, time_ms, out)
        elif etype == "step/end" and self.chat is not None:
            self.chat.end_ms = max(time_ms, self.chat.start_ms)
            self.chat_done, self.chat = self.chat, None
        elif etype == "tool/call":
            self._tool_call(event, data, out)
        elif etype == "tool/result":
            self._tool_result(data, time_ms, out)
        elif etype == "compaction/start":
            self.memory = self._open(f"compaction:{data.get('compactionId')}",
                                     f"update_memory {AGENT_NAME}", "internal", self.turn,
                                     event, "update_memory", out)
            self.memory.attributes["dsh.compaction.id"] = str(data.get("compactionId"))
        elif etype == "compaction/summary" and self.memory is not None:
            self.memory.attributes["dsh.compaction.shadowed_tokens"] = int(
                data.get("shadowedTokenCount") or 0)
            self.memory.attributes["dsh.compaction.shadowed_events"] = len(
                data.get("shadowedSeqs") or [])
        elif etype == "compaction/end" and self.memory is not None:
            failure = data.get("error")
            if failure:  # the compaction gave up; nothing was replaced
                self.memory.error = str(failure).split(":", 1)[0] or "compaction_failed"
            self._close(self.memory, time_ms, out)
            self.memory = None
        return out

    def finish(self, time_ms: int | None = None) -> list[Action]:
        """Close every span still open (a log cut mid-turn) at ``time_ms`` or its start."""
        out: list[Action] = []
        self._flush_chat(out)
        for span in [*self.tools.values(), self.chat, self.memory, self.turn]:
            if span is not None:
                span.attributes["dsh.incomplete"] = True
                self._close(span, span.start_ms if time_ms is None else time_ms, out)
        self.tools.clear()
        self.chat = self.memory = self.turn = None
        return out

    def _track_view(self, event: Mapping[str, Any], seq: int) -> None:
        if not self.capture_content:
            return
        op = event.get("surfaceOp")
        if op == "append":
            self.view.append(seq)
        elif isinstance(op, Mapping) and op.get("start") in self.view and op.get(
                "end") in self.view:
            first, last = self.view.index(op["start"]), self.view.index(op["end"])
            self.view[first:last + 1] = [seq]

    def _request(self, data: Mapping[str, Any]) -> None:
        header = data.get("header")
        config = header.get("config") if isinstance(header, Mapping) else data
        if isinstance(config, Mapping):
            self.provider = str(config.get("provider") or self.provider or "") or None
            self.model = str(config.get("model") or self.model or "") or None
        if self.chat is not None:
            self._name_chat(self.chat)

    def _name_chat(self, span: SpanRecord) -> None:
        if self.model:
            span.name = f"chat {self.model}"
            span.attributes["gen_ai.request.model"] = self.model
        if self.provider:
            span.attributes["gen_ai.provider.name"] = self.provider

    def _open_chat(self, event: Mapping[str, Any], data: Mapping[str, Any],
                   out: list[Action]) -> None:
        span = self._open(f"chat:{data.get('turn')}:{data.get('step')}", "chat", "client",
                          self.turn, event, "chat", out)
        span.attributes["dsh.step"] = int(data.get("step") or 0)
        self._name_chat(span)
        self.chat = span

    def _answer(self, event: Mapping[str, Any], data: Mapping[str, Any], time_ms: int,
                out: list[Action]) -> None:
        span = self.chat
        if span is None:  # an answer outside a step: a log written by hand
            span = self._open(f"chat:seq:{event.get('seq')}", "chat", "client", self.turn,
                              event, "chat", out)
        message = data.get("message") if isinstance(data.get("message"), Mapping) else {}
        assert isinstance(message, Mapping)
        source = message.get("source") if isinstance(message.get("source"), Mapping) else {}
        assert isinstance(source, Mapping)
        provider = source.get("provider") or self.provider
        model = source.get("model")
        if provider:
            span.attributes["gen_ai.provider.name"] = str(provider)
        if model:
            span.attributes["gen_ai.response.model"] = str(model)
            span.attributes.setdefault("gen_ai.request.model", str(model))
            if span.name == "chat":
                span.name = f"chat {span.attributes['gen_ai.request.model']}"
        if isinstance(message.get("id"), str):
            span.attributes["gen_ai.response.id"] = message["id"]
        usage = usage_of(event)
        if usage:
            read = usage.get("cacheReadTokens", 0)
            write = usage.get("cacheWriteTokens", 0)
            span.attributes["gen_ai.usage.input_tokens"] = usage.get("inputTokens", 0) + read \
                + write
            span.attributes["gen_ai.usage.output_tokens"] = usage.get("outputTokens", 0)
            if "cacheReadTokens" in usage:
                span.attributes["gen_ai.usage.cache_read.input_tokens"] = read
            if "cacheWriteTokens" in usage:
                span.attributes["gen_ai.usage.cache_creation.input_tokens"] = write
            if "reasoningTokens" in usage:
                span.attributes["gen_ai.usage.reasoning.output_tokens"] = usage[
                    "reasoningTokens"]
        reason = self._finish_reason(event, data, message)
        span.attributes["gen_ai.response.finish_reasons"] = [reason]
        if self.capture_content:
            seq = event.get("seq")
            earlier = [m for s in self.view if s != seq
                       if (m := _message_of(self.by_seq[s])) is not None]
            span.attributes["gen_ai.input.messages"] = _message_json(earlier)
            span.attributes["gen_ai.output.messages"] = _message_json([message])
        self._close(span, time_ms, out)
        self.chat = None

    def _finish_reason(self, event: Mapping[str, Any], data: Mapping[str, Any],
                       message: Mapping[str, Any]) -> str:
        for seq in reversed(event.get("sourceEventSeqs") or []):
            chunk = self.by_seq.get(seq, {}).get("data")
            chunk = chunk.get("chunk") if isinstance(chunk, Mapping) else None
            if isinstance(chunk, Mapping) and chunk.get("type") == "finish":
                reason = chunk.get("reason")
                kind = reason.get("kind") if isinstance(reason, Mapping) else reason
                return _FINISH.get(str(kind), str(kind))
        if data.get("interrupted"):
            return "aborted"
        calls = any(isinstance(b, Mapping) and b.get("type") == "tool-call"
                    for b in message.get("content") or [])
        return "tool_calls" if calls else "stop"

    def _tool_call(self, event: Mapping[str, Any], data: Mapping[str, Any],
                   out: list[Action]) -> None:
        call_id = str(data.get("callId"))
        name = str(data.get("name", ""))
        span = self._open(f"tool:{call_id}", f"execute_tool {name}".strip(), "internal",
                          self.turn, event, "execute_tool", out)
        span.attributes.update({"gen_ai.tool.name": name, "gen_ai.tool.call.id": call_id,
                                "gen_ai.tool.type": "function"})
        if self.capture_content:
            span.attributes["gen_ai.tool.call.arguments"] = str(data.get("arguments", ""))
        self.tools[call_id] = span

    def _tool_result(self, data: Mapping[str, Any], time_ms: int, out: list[Action]) -> None:
        message = data.get("message") if isinstance(data.get("message"), Mapping) else {}
        assert isinstance(message, Mapping)
        source = message.get("source") if isinstance(message.get("source"), Mapping) else {}
        call_id = str(source.get("callId")) if isinstance(source, Mapping) else ""
        span = self.tools.pop(call_id, None)
        if span is None:
            return  # a result with no recorded call (an import that never saw it): no span
        blocks = [b for b in message.get("content") or [] if isinstance(b, Mapping)]
        failed = any(b.get("isError") for b in blocks)
        error = data.get("error") if isinstance(data.get("error"), Mapping) else None
        if failed:
            code = error.get("code") if isinstance(error, Mapping) else None
            span.error = str(code or "tool_error")
        if self.capture_content:
            span.attributes["gen_ai.tool.call.result"] = json.dumps(
                _parts(blocks)[0].get("response", "") if blocks else "", ensure_ascii=False)
        self._close(span, time_ms, out)

    def _end_turn(self, time_ms: int, reason: Mapping[str, Any] | None,
                  out: list[Action]) -> None:
        kind = str(reason.get("kind")) if reason else None
        failure = reason.get("error") if reason else None
        code = (str(failure.get("code") or "error") if isinstance(failure, Mapping)
                else "error") if kind == "error" else None
        self._flush_chat(out, code or ("aborted" if kind == "aborted" else None))
        for span in self.tools.values():
            span.error = span.error or ("aborted" if kind == "aborted" else "no_result")
            self._close(span, time_ms, out)
        self.tools.clear()
        if self.chat is not None:  # cancelled before the step ended
            self.chat.error = code or "aborted"
            self._close(self.chat, time_ms, out)
            self.chat = None
        turn = self.turn
        if turn is None:
            return
        if kind is not None:
            turn.attributes["dsh.turn.end_reason"] = kind
        if code is not None:
            turn.error = code
        self._close(turn, time_ms, out)
        self.turn = None


def span_records(events: Sequence[Mapping[str, Any]], session_id: str, *,
                 capture_content: bool = False) -> list[SpanRecord]:
    """Every span of a log, closed, in the order they started (the replay mapping).

    Spans still open at the end (a log cut mid-turn) are closed at the last event's time and
    marked ``dsh.incomplete``.
    """
    mapper = SpanMapper(session_id, capture_content=capture_content)
    started: list[SpanRecord] = []
    for event in events:
        started.extend(span for action, span in mapper.feed(event) if action == "start")
    last = int(events[-1].get("time") or 0) if events else 0
    mapper.finish(last)
    return started


# --- OTLP/JSON -------------------------------------------------------------------------------


def _hex_id(*parts: str, size: int) -> str:
    return hashlib.sha256("\x00".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[
        :size * 2]


def _value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list | tuple):
        return {"arrayValue": {"values": [_value(v) for v in value]}}
    return {"stringValue": str(value)}


def _attributes(attributes: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in attributes.items()]


def _span_json(span: SpanRecord, trace_id: str, ids: dict[int, str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": trace_id, "spanId": ids[id(span)], "name": span.name,
        "kind": 3 if span.kind == "client" else 1,
        "startTimeUnixNano": str(span.start_ms * 1_000_000),
        "endTimeUnixNano": str((span.end_ms if span.end_ms is not None else span.start_ms)
                               * 1_000_000),
        "attributes": _attributes({**span.attributes, **(
            {"error.type": span.error} if span.error else {})}),
    }
    if span.parent is not None:
        out["parentSpanId"] = ids[id(span.parent)]
    if span.events:
        out["events"] = [{"timeUnixNano": str(t * 1_000_000), "name": name,
                          "attributes": _attributes(attrs)} for name, t, attrs in span.events]
    out["status"] = {"code": 2, "message": span.error} if span.error else {"code": 0}
    return out


def _log_spans(log: LogLike, capture_content: bool) -> list[dict[str, Any]]:
    session_id = str(log.header.get("id", ""))
    records = span_records(log.events, session_id, capture_content=capture_content)
    trace_id = _hex_id("dsh-trace", session_id, size=16)
    ids = {id(s): _hex_id("dsh-span", session_id, s.key, str(s.seq), size=8) for s in records}
    spans = [_span_json(s, trace_id, ids) for s in records]
    for child in log.children:
        spans.extend(_log_spans(child, capture_content))
    return spans


def to_otlp_json(log: LogLike, *, capture_content: bool = False) -> dict[str, Any]:
    """Replay a session (and its subagent sessions) as an OTLP/JSON trace export request.

    Args:
        log: ``header``, ``events``, ``children`` (an ImportedSession or a SessionLog).
        capture_content: Include message content (off by default).

    Returns:
        ``{"resourceSpans": [{"resource": {service.name dsh}, "scopeSpans": [{"scope",
        "spans"}]}]}`` in the OTLP/JSON encoding (ids as hex; times as decimal strings of
        epoch ns). Each session is one trace (trace id derived from the session id, span ids
        from the span's place in the log), so exporting twice gives the same document.
    """
    from dsh._version import __version__

    return {"resourceSpans": [{
        "resource": {"attributes": _attributes({"service.name": AGENT_NAME})},
        "scopeSpans": [{"scope": {"name": SCOPE, "version": __version__},
                        "spans": _log_spans(log, capture_content)}]}]}

"""Local scripted model servers speaking the providers' real streaming wire protocols.

A :class:`ScriptedServer` listens on 127.0.0.1 (port 0) in a thread and answers each POST with
the next scripted behaviour: an SSE stream (``Stream``), an HTTP error with the provider's real
error body (``Fail``), a stream whose connection is dropped part way (``Cut``) or one that stops
sending (``Stall``). Every request body it receives is kept, parsed, in ``requests``.

SSE bodies go out with chunked transfer encoding, as the real services send them, so a dropped
connection is a protocol error on the client side and not a silently short body.

Builders below produce the event lists of OpenAI Chat Completions chunks and Anthropic Messages
events the way the services emit them (shapes checked against the SDKs' own types and docs).

:class:`PrefixCache` imitates the providers' prompt caching: a :class:`Dynamic` behaviour asks it
for each request's usage, which counts as cached the longest prefix of the request already seen,
by the provider's rules, and reports it in the provider's usage fields.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# --- behaviours -------------------------------------------------------------------------------


@dataclass
class Stream:
    """Send these SSE events (``(event name or None, data)``) and end the body properly."""

    events: list[tuple[str | None, Any]]


@dataclass
class Fail:
    """Answer with ``status``, a JSON ``body`` and extra ``headers``."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Cut:
    """Send the first events of a stream, then drop the connection without ending the body."""

    events: list[tuple[str | None, Any]]


@dataclass
class Stall:
    """Send the first events, then send nothing more until the server closes."""

    events: list[tuple[str | None, Any]]


@dataclass
class Dynamic:
    """Build the behaviour from the parsed request body when the request arrives."""

    make: Callable[[Any], Stream | Fail | Cut | Stall]


Behaviour = Stream | Fail | Cut | Stall | Dynamic


class ScriptedServer:
    """A threaded HTTP server answering each POST with the next scripted behaviour.

    Use as a context manager; ``base_url`` is ``http://127.0.0.1:<port>`` plus ``prefix``.
    Requests past the end of the script get a 500 naming the overrun, so a test that sends more
    requests than it scripted fails loudly.
    """

    def __init__(self, script: Sequence[Behaviour] = (), *, prefix: str = "") -> None:
        self.script: list[Behaviour] = list(script)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.02}, daemon=True)
        self.prefix = prefix

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}{self.prefix}"

    def add(self, *behaviours: Behaviour) -> None:
        with self._lock:
            self.script.extend(behaviours)

    def _next(self, path: str, headers: dict[str, str], body: Any) -> Behaviour:
        with self._lock:
            self.paths.append(path)
            self.headers.append(headers)
            self.requests.append(body)
            if not self.script:
                return Fail(500, {"error": {"message": f"script overrun at request "
                                                      f"{len(self.requests)}"}})
            return self.script.pop(0)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._released.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)


def _sse_frames(events: Sequence[tuple[str | None, Any]]) -> Iterator[bytes]:
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
        head = f"event: {name}\n" if name else ""
        yield f"{head}data: {text}\n\n".encode()


def _handler_for(server: ScriptedServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            body = json.loads(raw) if raw else None
            behaviour = server._next(self.path, {k.lower(): v for k, v in self.headers.items()},
                                     body)
            if isinstance(behaviour, Dynamic):
                behaviour = behaviour.make(body)
            if isinstance(behaviour, Fail):
                payload = json.dumps(behaviour.body).encode()
                self.send_response(behaviour.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                for k, v in behaviour.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.send_header("connection", "close")
            self.end_headers()
            for frame in _sse_frames(behaviour.events):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                self.wfile.flush()
            if isinstance(behaviour, Stream):
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            elif isinstance(behaviour, Stall):
                server._released.wait(60)
            self.close_connection = True

    return Handler


# --- OpenAI Chat Completions chunks -------------------------------------------------------------


def _chunk(delta: dict[str, Any] | None, *, finish: str | None = None,
           usage: dict[str, Any] | None = None, model: str = "gpt-test") -> dict[str, Any]:
    choices = [] if delta is None else [
        {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    return {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 1764547200,
            "model": model, "system_fingerprint": "fp_test", "choices": choices, "usage": usage}


def openai_usage(prompt: int = 12, completion: int = 5, *, cached: int = 0,
                 reasoning: int = 0) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": reasoning}}


def openai_reply(text: str = "", *, reasoning: str = "",
                 tool_calls: Sequence[tuple[str, str, str]] = (),
                 usage: dict[str, Any] | None = None, finish: str | None = None,
                 pieces: int = 2, reasoning_field: str = "reasoning_content",
                 ) -> list[tuple[str | None, Any]]:
    """A Chat Completions stream: role chunk, reasoning deltas, text deltas, tool-call deltas
    (parallel calls interleaved by ``index`` like the service does), finish, usage, ``[DONE]``.

    DeepSeek sends reasoning as ``reasoning_content``; vLLM and OpenRouter as ``reasoning``.
    """
    out: list[tuple[str | None, Any]] = [(None, _chunk({"role": "assistant", "content": ""}))]

    def split(s: str) -> list[str]:
        step = max(1, -(-len(s) // pieces))
        return [s[i:i + step] for i in range(0, len(s), step)] or []

    for part in split(reasoning):
        out.append((None, _chunk({reasoning_field: part, "content": None})))
    for part in split(text):
        out.append((None, _chunk({"content": part})))
    for i, (call_id, name, _) in enumerate(tool_calls):
        out.append((None, _chunk({"tool_calls": [
            {"index": i, "id": call_id, "type": "function",
             "function": {"name": name, "arguments": ""}}]})))
    # Argument pieces of parallel calls arrive interleaved.
    arg_parts = [split(args) for _, _, args in tool_calls]
    for j in range(max((len(p) for p in arg_parts), default=0)):
        for i, parts in enumerate(arg_parts):
            if j < len(parts):
                out.append((None, _chunk({"tool_calls": [
                    {"index": i, "function": {"arguments": parts[j]}}]})))
    reason = finish or ("tool_calls" if tool_calls else "stop")
    out.append((None, _chunk({}, finish=reason)))
    out.append((None, _chunk(None, usage=usage or openai_usage())))
    out.append((None, "[DONE]"))
    return out


def openai_error(status: int, message: str, *, type_: str, code: str | None,
                 param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


OPENAI_OVERFLOW = openai_error(
    400, "This model's maximum context length is 128000 tokens. However, your messages "
    "resulted in 130412 tokens. Please reduce the length of the messages.",
    type_="invalid_request_error", code="context_length_exceeded", param="messages")
DEEPSEEK_OVERFLOW = openai_error(
    400, "This model's maximum context length is 131072 tokens. However, you requested 131134 "
    "tokens (122942 in the messages, 8192 in the completion). Please reduce the length of the "
    "messages or completion.", type_="invalid_request_error", code="invalid_request_error")
OPENAI_RATE_LIMIT = openai_error(429, "Rate limit reached for requests", type_="requests",
                                 code="rate_limit_exceeded")
OPENAI_SERVER_ERROR = openai_error(500, "The server had an error while processing your request.",
                                   type_="server_error", code=None)


# --- Anthropic Messages events ------------------------------------------------------------------


def anthropic_usage(input_tokens: int = 20, output_tokens: int = 7, *, cache_read: int = 0,
                    cache_write: int = 0) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": cache_write, "cache_read_input_tokens": cache_read}


def anthropic_reply(text: str = "", *, thinking: str = "", signature: str = "",
                    redacted: str = "", tool_uses: Sequence[tuple[str, str, str]] = (),
                    usage: dict[str, Any] | None = None, stop_reason: str | None = None,
                    model: str = "claude-test", pieces: int = 2) -> list[tuple[str | None, Any]]:
    """A Messages stream: message_start, thinking (+ signature_delta), redacted thinking, text,
    tool_use blocks with input_json_delta pieces, message_delta with usage, message_stop."""
    u = usage or anthropic_usage()
    start_usage = dict(u, output_tokens=1)
    out: list[tuple[str | None, Any]] = [("message_start", {"type": "message_start", "message": {
        "id": "msg_test", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": start_usage}})]

    def split(s: str) -> list[str]:
        step = max(1, -(-len(s) // pieces))
        return [s[i:i + step] for i in range(0, len(s), step)]

    index = 0

    def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
        nonlocal index
        out.append(("content_block_start", {"type": "content_block_start", "index": index,
                                            "content_block": start}))
        for d in deltas:
            out.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                "delta": d}))
        out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1

    if thinking:
        block({"type": "thinking", "thinking": "", "signature": ""},
              [{"type": "thinking_delta", "thinking": p} for p in split(thinking)]
              + [{"type": "signature_delta", "signature": signature}])
    if redacted:
        block({"type": "redacted_thinking", "data": redacted}, [])
    if text:
        block({"type": "text", "text": ""},
              [{"type": "text_delta", "text": p} for p in split(text)])
    for call_id, name, args in tool_uses:
        block({"type": "tool_use", "id": call_id, "name": name, "input": {}},
              [{"type": "input_json_delta", "partial_json": p} for p in split(args)])
    out.append(("ping", {"type": "ping"}))
    reason = stop_reason or ("tool_use" if tool_uses else "end_turn")
    out.append(("message_delta", {"type": "message_delta",
                                  "delta": {"stop_reason": reason, "stop_sequence": None},
                                  "usage": {"output_tokens": u["output_tokens"]}}))
    out.append(("message_stop", {"type": "message_stop"}))
    return out


def anthropic_error(type_: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": type_, "message": message},
            "request_id": "req_test"}


ANTHROPIC_OVERFLOW = anthropic_error("invalid_request_error",
                                     "prompt is too long: 208310 tokens > 200000 maximum")
ANTHROPIC_RATE_LIMIT = anthropic_error("rate_limit_error", "Number of request tokens has "
                                       "exceeded your per-minute rate limit")
ANTHROPIC_OVERLOADED = anthropic_error("overloaded_error", "Overloaded")
ANTHROPIC_SERVER_ERROR = anthropic_error("api_error", "Internal server error")


# --- prompt caching -----------------------------------------------------------------------------


def _tokens(size_bytes: int) -> int:
    """The server's token count of ``size_bytes`` bytes of prompt (4 bytes a token)."""
    return -(-size_bytes // 4)


def _unit(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, sort_keys=True).encode()


def _shared_bytes(units: Sequence[bytes], seen: Sequence[bytes]) -> int:
    """Bytes of the longest common prefix of two prompts given as units (unit-wise, then bytes)."""
    total = 0
    for ours, theirs in zip(units, seen, strict=False):
        if ours == theirs:
            total += len(ours)
            continue
        limit = min(len(ours), len(theirs))
        same = 0
        while same < limit and ours[same] == theirs[same]:
            same += 1
        return total + same
    return total


class PrefixCache:
    """The providers' prompt caching, imitated over the requests one server has seen.

    * OpenAI (automatic): the prompt is the tools, then the messages; the cached part is the
      longest prefix (in bytes, 4 a token) shared with any earlier prompt, counted in 128-token
      increments and only from 1024 tokens on; ``prompt_tokens`` is the whole prompt and
      ``prompt_tokens_details.cached_tokens`` the cached part.
    * Anthropic (explicit ``cache_control``): the prompt is a list of blocks (each tool, the
      system text, every content block of every message); a block marked ``cache_control``
      writes the prefix ending with it (from 1024 tokens on); a request reads the longest
      written prefix that ends at one of its marks or up to 20 blocks before one. Usage:
      ``input_tokens`` (after the read and written parts), ``cache_read_input_tokens``,
      ``cache_creation_input_tokens``. The marks themselves are not part of the bytes.
    """

    MIN_TOKENS = 1024
    OPENAI_STEP_TOKENS = 128
    LOOKBACK_BLOCKS = 20

    def __init__(self) -> None:
        self._openai: list[list[bytes]] = []
        self._written: set[str] = set()
        self.log: list[dict[str, int]] = []  # per request: total and cached tokens

    def openai_usage(self, body: Any, completion_tokens: int = 20) -> dict[str, Any]:
        """Usage of one Chat Completions request (and remember its prompt)."""
        units = [_unit(t) for t in body.get("tools") or ()] + [
            _unit(m) for m in body.get("messages") or ()]
        total = _tokens(sum(len(u) for u in units))
        shared = max((_shared_bytes(units, seen) for seen in self._openai), default=0)
        cached = shared // 4 // self.OPENAI_STEP_TOKENS * self.OPENAI_STEP_TOKENS
        if cached < self.MIN_TOKENS:
            cached = 0
        self._openai.append(units)
        self.log.append({"total": total, "cached": cached})
        return openai_usage(total, completion_tokens, cached=cached)

    @staticmethod
    def _anthropic_blocks(body: Any) -> list[tuple[bytes, bool]]:
        """``(bytes, marked)`` per block, in prompt order, without the ``cache_control`` marks."""
        out: list[tuple[bytes, bool]] = []

        def add(value: Any, prefix: str = "") -> None:
            marked = isinstance(value, dict) and "cache_control" in value
            if marked:
                value = {k: v for k, v in value.items() if k != "cache_control"}
            out.append((prefix.encode() + _unit(value), marked))

        for tool in body.get("tools") or ():
            add(tool)
        system = body.get("system")
        for block in [system] if isinstance(system, str) else system or ():
            add(block, "system:")
        for message in body.get("messages") or ():
            content = message.get("content")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            for index, block in enumerate(blocks or ()):
                add(block, f"{message.get('role')}:" if index == 0 else "")
        return out

    def anthropic_usage(self, body: Any, output_tokens: int = 20) -> dict[str, Any]:
        """Usage of one Messages request (and write the prefixes its marks end)."""
        blocks = self._anthropic_blocks(body)
        chain: list[str] = []
        ends: list[int] = []
        digest = hashlib.sha256()
        size = 0
        for data, _ in blocks:
            digest.update(data)
            chain.append(digest.copy().hexdigest())
            size += len(data)
            ends.append(_tokens(size))
        total = ends[-1] if ends else 0
        marks = [i for i, (_, marked) in enumerate(blocks) if marked]
        read = 0
        for mark in marks:
            for index in range(mark, max(-1, mark - self.LOOKBACK_BLOCKS - 1), -1):
                if chain[index] in self._written:
                    read = max(read, ends[index])
                    break
        last = marks[-1] if marks else -1
        written = ends[last] if last >= 0 and ends[last] >= self.MIN_TOKENS else 0
        for mark in marks:
            if ends[mark] >= self.MIN_TOKENS:
                self._written.add(chain[mark])
        creation = max(0, written - read)
        self.log.append({"total": total, "cached": read})
        return anthropic_usage(total - read - creation, output_tokens, cache_read=read,
                               cache_write=creation)


def openai_cached(cache: PrefixCache, text: str = "",
                  tool_calls: Sequence[tuple[str, str, str]] = ()) -> Dynamic:
    """A Chat Completions reply whose usage the cache computes from the request."""
    return Dynamic(lambda body: Stream(openai_reply(text, tool_calls=tool_calls,
                                                    usage=cache.openai_usage(body))))


def anthropic_cached(cache: PrefixCache, text: str = "",
                     tool_uses: Sequence[tuple[str, str, str]] = ()) -> Dynamic:
    """A Messages reply whose usage the cache computes from the request."""
    return Dynamic(lambda body: Stream(anthropic_reply(text, tool_uses=tool_uses,
                                                       usage=cache.anthropic_usage(body))))


# --- OpenAI Responses events --------------------------------------------------------------------


def responses_usage(input_tokens: int = 20, output_tokens: int = 7, *, cached: int = 0,
                    reasoning: int = 0) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens_details": {"reasoning_tokens": reasoning}}


def _response(status: str, output: list[Any], usage: dict[str, Any] | None,
              model: str, incomplete: str | None = None,
              error: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": "resp_test", "object": "response", "created_at": 1764547200,
            "status": status, "model": model, "output": output, "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": [], "usage": usage, "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": None, "metadata": {}, "temperature": None, "top_p": None}


def responses_reply(text: str = "", *, reasoning: str = "", encrypted: str = "",
                    tool_calls: Sequence[tuple[str, str, str]] = (),
                    usage: dict[str, Any] | None = None, incomplete: str | None = None,
                    model: str = "gpt-test", pieces: int = 2) -> list[tuple[str | None, Any]]:
    """A Responses stream: response.created, a reasoning item (summary deltas, encrypted
    content), a message item (output_text deltas), function_call items (argument deltas), then
    response.completed (or response.incomplete with ``incomplete``), as the API emits them."""
    seq = iter(range(10_000))
    out: list[tuple[str | None, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        out.append((kind, {"type": kind, "sequence_number": next(seq), **fields}))

    def split(s: str) -> list[str]:
        step = max(1, -(-len(s) // pieces))
        return [s[i:i + step] for i in range(0, len(s), step)]

    emit("response.created", response=_response("in_progress", [], None, model))
    items: list[dict[str, Any]] = []
    index = 0
    if reasoning:
        rid = "rs_1"
        emit("response.output_item.added", output_index=index,
             item={"type": "reasoning", "id": rid, "summary": []})
        for part in split(reasoning):
            emit("response.reasoning_summary_text.delta", item_id=rid, output_index=index,
                 summary_index=0, delta=part)
        item = {"type": "reasoning", "id": rid,
                "summary": [{"type": "summary_text", "text": reasoning}]}
        if encrypted:
            item["encrypted_content"] = encrypted
        emit("response.output_item.done", output_index=index, item=item)
        items.append(item)
        index += 1
    if text:
        mid = "msg_1"
        emit("response.output_item.added", output_index=index,
             item={"type": "message", "id": mid, "role": "assistant", "status": "in_progress",
                   "content": []})
        for part in split(text):
            emit("response.output_text.delta", item_id=mid, output_index=index,
                 content_index=0, delta=part, logprobs=[])
        item = {"type": "message", "id": mid, "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}
        emit("response.output_item.done", output_index=index, item=item)
        items.append(item)
        index += 1
    for call_id, name, args in tool_calls:
        fid = f"fc_{index}"
        emit("response.output_item.added", output_index=index,
             item={"type": "function_call", "id": fid, "call_id": call_id, "name": name,
                   "arguments": "", "status": "in_progress"})
        for part in split(args):
            emit("response.function_call_arguments.delta", item_id=fid, output_index=index,
                 delta=part)
        item = {"type": "function_call", "id": fid, "call_id": call_id, "name": name,
                "arguments": args, "status": "completed"}
        emit("response.output_item.done", output_index=index, item=item)
        items.append(item)
        index += 1
    final = usage or responses_usage()
    if incomplete:
        emit("response.incomplete",
             response=_response("incomplete", items, final, model, incomplete=incomplete))
    else:
        emit("response.completed", response=_response("completed", items, final, model))
    return out


def responses_failed(code: str, message: str, model: str = "gpt-test"
                     ) -> list[tuple[str | None, Any]]:
    """A Responses stream that fails after it was created (``response.failed``)."""
    return [("response.created", {"type": "response.created", "sequence_number": 0,
                                  "response": _response("in_progress", [], None, model)}),
            ("response.failed", {"type": "response.failed", "sequence_number": 1,
                                 "response": _response("failed", [], None, model,
                                                       error={"code": code,
                                                              "message": message})})]

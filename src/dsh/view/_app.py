"""The viewer's web application: routes, the token gate and the security headers (starlette).

Read-only: every route reads through :class:`~dsh.view._data.ViewStore`; nothing writes to the
store. Pages are rendered on the server (:mod:`dsh.view._html`); the one script and the one
style sheet are files of this package, so the page loads nothing from the network and the
Content-Security-Policy can forbid inline script and style, frames, plugins and any other
origin. Every request but ``/static`` needs the token: ``?token=`` (then kept in a cookie for
the session's links) or that cookie.

Errors: a missing session or route is a 404 page that links back to the list; a damaged
session is a page that shows what is readable and names the damage; anything else that fails
is a 500 page naming the error, never a bare 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import UTC, datetime
from http.cookies import CookieError, SimpleCookie
from importlib import resources
from typing import Any, Final
from urllib.parse import parse_qs, quote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dsh import DshError, SessionNotFoundError
from dsh.json import dumps, thaw
from dsh.transcript import (
    Checkpoint,
    Entry,
    ModelRequest,
    ToolResult,
    TranscriptFold,
    blocks_of,
    build,
    entries_at,
    model_request,
    model_tail,
)
from dsh.transcript import Message as TranscriptMessage
from dsh.view._data import Damage, OpenSession, SessionInfo, ViewStore, common_prefix
from dsh.view._hosts import host_allowed
from dsh.view._html import render, session_url, warm
from dsh.view._search import search_session, search_store

logger = logging.getLogger(__name__)

PAGE_EVENTS: Final = 500
"""Events of one transcript page."""

MODEL_MESSAGES: Final = 200
"""Messages of a model view shown at most (the last ones; the page says how many are not)."""

TAIL_FOLD_EVENTS: Final = 8192
"""A model view that would fold more events than this reads its last messages back first."""

SHADOWED_INLINE: Final = 100
"""Shadowed messages a checkpoint shows inline when expanded (the rest on a page of their own)."""

COOKIE: Final = "dsh_view_token"
"""The cookie that keeps the token (its SHA-256, hex) for the links of one browser session."""

CSP: Final = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
              "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
"""The Content-Security-Policy of every response: no inline script or style, no other origin."""

_HEADERS: Final = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]

_COLUMNS: Final = (
    ("id", "id", lambda i: i.id),
    ("title", "title", lambda i: ((i.title or "").casefold(), i.id)),
    ("source", "source", lambda i: (i.source, i.id)),
    ("model", "model", lambda i: ((i.model or "").casefold(), i.id)),
    ("cwd", "cwd", lambda i: (i.cwd or "", i.id)),
    ("first", "first activity (UTC)", lambda i: (i.first_activity_ms, i.id)),
    ("activity", "last activity (UTC)", lambda i: (i.last_activity_ms, i.id)),
    ("turns", "turns", lambda i: (i.turns, i.id)),
    ("events", "events", lambda i: (i.events, i.id)),
    ("size", "size", lambda i: (i.size_bytes if i.size_bytes is not None else -1, i.id)),
    ("created", "created (UTC)", lambda i: (i.created_ms, i.id)),
)
"""The session list's sortable columns: ``(key, label, sort key)``, in table order."""

_SORT_KEYS: Final[dict[str, Callable[[SessionInfo], Any]]] = {k: f for k, _, f in _COLUMNS}

_ASCENDING_FIRST: Final = frozenset({"id", "title", "source", "model", "cwd"})
"""Columns whose first click sorts ascending (text); the others start with the largest."""


def _html(body: bytes, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type="text/html; charset=utf-8")


class _Gate:
    """ASGI middleware: the token gate and the security headers on every response."""

    def __init__(self, app: ASGIApp, token: str, store_url: str,
                 bind: tuple[str, int] | None = None) -> None:
        self.app = app
        self.bind = bind
        self.token = token.encode("utf-8", "surrogatepass")
        # the cookie carries the token's digest, hex: any token (spaces, quotes, non-ASCII)
        # then round-trips through a Cookie header, and the secret itself is not sent back
        self.cookie = hashlib.sha256(self.token).hexdigest().encode()
        self.store_url = store_url

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        given = (query.get("token") or [None])[0]
        cookie = SimpleCookie()
        for name, value in scope.get("headers", ()):
            if name == b"cookie":
                with contextlib.suppress(CookieError):  # a malformed cookie header: no token
                    cookie.load(value.decode("latin-1"))
        kept = cookie[COOKIE].value if COOKIE in cookie else None
        # compared as bytes: compare_digest refuses str with non-ASCII characters (a TypeError)
        by_query = given is not None and hmac.compare_digest(
            given.encode("utf-8", "surrogatepass"), self.token)
        allowed = by_query or (kept is not None and hmac.compare_digest(
            kept.encode("utf-8", "surrogatepass"), self.cookie))

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.extend(_HEADERS)
                if by_query:
                    headers.append((b"set-cookie", COOKIE.encode() + b"=" + self.cookie
                                    + b"; Path=/; HttpOnly; SameSite=Strict"))
                message = {**message, "headers": headers}
            await send(message)

        host = next((v.decode("latin-1") for n, v in scope.get("headers", ()) if n == b"host"),
                    "")
        if self.bind is not None and not host_allowed(host, *self.bind):
            body = render("error.html", title="wrong host", store_url=self.store_url,
                          heading="This viewer does not answer for this host",
                          message=f"The request names host {host!r}; open the URL that "
                          "`dsh view` printed (a name that is not the viewer's own is refused "
                          "against DNS rebinding).")
            await _html(body, 400)(scope, receive, send_with_headers)
            return
        if not allowed and not path.startswith("/static/"):
            body = render("error.html", title="token needed", store_url=self.store_url,
                          heading="This viewer needs its token",
                          message="Open the URL that `dsh view` printed (it carries ?token=...).")
            await _html(body, 403)(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)


class _Viewer:
    """The route handlers over one store (sync handlers run in starlette's thread pool)."""

    def __init__(self, store: ViewStore, stopping: asyncio.Event | None = None) -> None:
        self.store = store
        self.stopping = stopping

    # -- helpers ---------------------------------------------------------------------------

    def page(self, template: str, status: int = 200, **context: Any) -> Response:
        context.setdefault("store_url", self.store.url)
        return _html(render(template, **context), status)

    def not_found(self, what: str) -> Response:
        return self.page("error.html", 404, title="not found", heading="Not found",
                         message=what)

    def open(self, request: Request) -> OpenSession | Response:
        sid = request.path_params["sid"]
        try:
            return self.store.open_session(sid)
        except SessionNotFoundError:
            return self.not_found(f"There is no session {sid!r} in this store.")

    def open_at(self, request: Request) -> tuple[OpenSession, int] | Response:
        """The session and the ``seq`` a ``/s/{sid}/…/{seq}`` URL names, or its 404 page."""
        opened = self.open(request)
        if isinstance(opened, Response):
            return opened
        seq: int = request.path_params["seq"]
        if not 0 <= seq < len(opened.events):
            return self.not_found(f"Session {opened.id!r} has no event #{seq} "
                                  f"(it holds {len(opened.events)} events).")
        return opened, seq

    @staticmethod
    def _int(request: Request, name: str) -> int | None:
        value = request.query_params.get(name)
        if value is None or not value.strip().lstrip("-").isdigit():
            return None
        return int(value)

    # -- the list --------------------------------------------------------------------------

    def sessions(self, request: Request) -> Response:
        infos, errors = self.store.listing()
        params = request.query_params
        q = params.get("q", "").strip()
        source = params.get("source", "")
        since, until = params.get("since", ""), params.get("until", "")
        sort = params.get("sort", "activity")
        sort = sort if sort in _SORT_KEYS else "activity"
        direction = params.get("dir", "")
        if direction not in ("asc", "desc"):
            direction = "asc" if sort in _ASCENDING_FIRST else "desc"
        shown = _filter(infos, q, source, since, until)
        shown = sorted(shown, key=_SORT_KEYS[sort], reverse=direction == "desc")
        columns = [(key, label, "asc" if key == sort and direction == "desc" else "desc"
                    if key == sort or key not in _ASCENDING_FIRST else "asc")
                   for key, label, _ in _COLUMNS]
        parents: dict[str, int] = {}
        for info in infos:
            if info.parent is not None:
                parents[info.parent] = parents.get(info.parent, 0) + 1
        return self.page("sessions.html", title="sessions", shown=shown, total=len(infos),
                         errors=errors, q=q, source=source, since=since, until=until,
                         sort=sort, direction=direction, columns=columns, parents=parents,
                         sources=sorted({i.source for i in infos}))

    # -- one session -----------------------------------------------------------------------

    def session(self, request: Request) -> Response:
        opened = self.open(request)
        if isinstance(opened, Response):
            return opened
        events = opened.events
        count = len(events)
        at = self._int(request, "at")
        start = self._int(request, "start")
        if at is not None:
            start = max(0, min(at, count - 1)) // PAGE_EVENTS * PAGE_EVENTS
        elif start is None:
            start = max(0, count - PAGE_EVENTS)
        start = max(0, min(start, max(count - 1, 0)))
        stop = min(count, start + PAGE_EVENTS)
        try:
            page = build(events, start=start, stop=stop, header=opened.header)
            entries: Sequence[Entry] = page.entries
        except DshError as error:  # a page-in found damage after the session opened
            return self.damaged_page(opened, error, start)
        shadows = self._shadows(events, entries)
        model_seq, model_answer = _model_target(entries, stop)
        live = stop == count and opened.damage is None
        return self.page(
            "session.html", title=opened.header.get("id", opened.id), sid=opened.id,
            header=opened.header, info=self.store.info(opened.id, read=False), count=count,
            start=start,
            stop=stop, page_events=PAGE_EVENTS,
            entries=entries, shadows=shadows, damage=opened.damage, torn=opened.torn,
            paged=opened.paged, model_seq=model_seq, model_answer=model_answer,
            live_url=f"/s/{_q(opened.id)}/live?from={count}" if live else None)

    def damaged_page(self, opened: OpenSession, error: DshError, start: int) -> Response:
        return self.page("session.html", title=opened.id, sid=opened.id, header=opened.header,
                         info=self.store.info(opened.id, read=False), count=start, start=0,
                         stop=start or 0,
                         page_events=PAGE_EVENTS, entries=(), shadows={},
                         damage=Damage.of(error), torn=False, paged=opened.paged,
                         model_seq=None, model_answer=None, live_url=None)

    @staticmethod
    def _shadows(events: Sequence[Any], entries: Sequence[Entry]) -> dict[int, tuple[Entry, ...]]:
        out: dict[int, tuple[Entry, ...]] = {}
        for entry in entries:
            if isinstance(entry, Checkpoint):
                out[entry.seq] = entries_at(events, entry.shadowed_seqs[:SHADOWED_INLINE])
        return out

    def span(self, request: Request) -> Response:
        at = self.open_at(request)
        if isinstance(at, Response):
            return at
        opened, seq = at
        events = opened.events
        found = entries_at(events, [seq])
        checkpoint = found[0] if found and isinstance(found[0], Checkpoint) else None
        if checkpoint is None:
            return self.not_found(f"Event #{seq} of {opened.id!r} is not a compaction checkpoint.")
        limit = 5000
        entries = entries_at(events, checkpoint.shadowed_seqs[:limit])
        return self.page("span.html", title=f"{opened.id} #{seq} shadowed", sid=opened.id,
                         seq=seq, entries=entries, total=len(checkpoint.shadowed_seqs),
                         shown=len(entries), hidden=len(checkpoint.shadowed_seqs) > limit)

    def event(self, request: Request) -> Response:
        at = self.open_at(request)
        if isinstance(at, Response):
            return at
        opened, seq = at
        events = opened.events
        event = events[seq]
        if request.query_params.get("format") == "json":
            return Response(dumps(event), media_type="application/json")
        body = json.dumps(thaw(event), ensure_ascii=False, indent=2)
        return self.page("event.html", title=f"{opened.id} #{seq}", sid=opened.id, seq=seq,
                         type=event.get("type"), body=body, count=len(events))

    def text(self, request: Request) -> Response:
        at = self.open_at(request)
        if isinstance(at, Response):
            return at
        opened, seq = at
        return self.page("text.html", title=f"{opened.id} #{seq}", sid=opened.id, seq=seq,
                         entries=entries_at(opened.events, [seq]))

    def model(self, request: Request) -> Response:
        at = self.open_at(request)
        if isinstance(at, Response):
            return at
        opened, seq = at
        events = opened.events
        answer = self._int(request, "answer")
        part = request.query_params.get("part")
        since = self.store.folded(opened.id, events, seq)
        restore = opened.restore
        begin = max(since.seq + 1 if since is not None else 0,
                    restore.event_count if restore is not None
                    and restore.event_count <= seq + 1 else 0)
        context: dict[str, Any] | None = None
        if part != "header" and seq + 1 - begin > TAIL_FOLD_EVENTS:
            # a long fold ahead: read the last messages back from the request first, and
            # fold the header and the count in a part of their own (docs/view.md#the-model-view)
            context = _tail_context(events, seq, answer,
                                    session_url(opened.id, "model", seq, answer=answer,
                                                fragment=1, part="header"))
        if context is None:
            if since is None and seq > PAGE_EVENTS:
                # fold to a page before and keep that too: the page's other requests continue
                # from it (docs/view.md#the-model-view)
                with contextlib.suppress(DshError):  # the full fold below names what is wrong
                    since = model_request(events, seq - PAGE_EVENTS, last=0, restore=restore)
                    self.store.keep_fold(opened.id, since, events)
            context, folded = _model_context(events, seq, answer, restore, since)
            if folded is not None and folded is not since:
                self.store.keep_fold(opened.id, folded, events)
        context.update(sid=opened.id, seq=seq)
        if part == "header" and not context.get("error"):
            return _html(render("_model_header.html", **context))
        if request.query_params.get("fragment") or part == "header":
            return _html(render("_model.html", **context))
        return self.page("model.html", title=f"{opened.id} model view #{seq}", **context)

    def search_in(self, request: Request) -> Response:
        opened = self.open(request)
        if isinstance(opened, Response):
            return opened
        query = request.query_params.get("q", "")
        hits = search_session(opened.id, opened.events, query)
        return self.page("search.html", title=f"search {opened.id}", sid=opened.id,
                         query=query, hits=hits, note="",
                         action=f"/s/{_q(opened.id)}/search")

    # -- the store -------------------------------------------------------------------------

    def search(self, request: Request) -> Response:
        query = request.query_params.get("q", "")
        results = search_store(self.store, query)
        note = "" if results.complete else (
            f"showing the first {len(results.hits)} hits (newest first) in "
            f"{results.sessions_searched} sessions; refine the query")
        return self.page("search.html", title="search", sid=None, query=query,
                         hits=results.hits, note=note, action="/search")

    def tree(self, request: Request) -> Response:
        sid = request.path_params["sid"]
        if not self.store.exists(sid):
            return self.not_found(f"There is no session {sid!r} in this store.")
        root, children = self.store.family(sid)
        family: list[SessionInfo] = []
        stack = [root] if root is not None else []
        while stack:
            node = stack.pop()
            family.append(node)
            stack.extend(reversed(children.get(node.id, [])))
        me = next((f for f in family if f.id == sid), None)
        other = me.parent if me is not None and me.parent else next(
            (f.id for f in family if f.id != sid), None)
        return self.page("tree.html", title=f"{sid} tree", sid=sid, root=root,
                         children=children, family=family, pick_a=other, pick_b=sid)

    def diff(self, request: Request) -> Response:
        a = request.query_params.get("a", "")
        b = request.query_params.get("b", "")
        for sid in (a, b):
            if not sid or not self.store.exists(sid):
                return self.not_found(f"There is no session {sid!r} in this store.")
        left, right = self.store.open_session(a), self.store.open_session(b)
        hint = None
        for one, two in ((left, right), (right, left)):
            if two.header.get("parentSession") == one.id:
                seed = two.header.get("seedLength")
                hint = seed if type(seed) is int else None
        common = common_prefix(left.events, right.events, hint=hint)
        page_a = build(left.events, start=common, stop=common + PAGE_EVENTS, header=left.header)
        page_b = build(right.events, start=common, stop=common + PAGE_EVENTS,
                       header=right.header)
        limited = (len(left.events) - common > PAGE_EVENTS
                   or len(right.events) - common > PAGE_EVENTS)
        return self.page("diff.html", title=f"diff {a} {b}", a=a, b=b, common=common,
                         count_a=len(left.events), count_b=len(right.events),
                         entries_a=page_a.entries, entries_b=page_b.entries, limited=limited,
                         page_events=PAGE_EVENTS)

    # -- live ------------------------------------------------------------------------------

    async def live(self, request: Request) -> Response:
        sid = request.path_params["sid"]
        from_seq = self._int(request, "from") or 0
        try:
            opened = await asyncio.to_thread(self.store.open_session, sid)
        except SessionNotFoundError:
            return PlainTextResponse("no such session", status_code=404)
        events = opened.events
        from_seq = max(0, min(from_seq, len(events)))
        fold = TranscriptFold(emit_from=from_seq, seed_length=_int_or_none(
            opened.header.get("seedLength")))
        begin = max(0, from_seq - 4096)
        await asyncio.to_thread(lambda: fold.feed(events[begin:from_seq]))
        return StreamingResponse(self._stream(request, sid, from_seq, fold, events),
                                 media_type="text/event-stream",
                                 headers={"X-Accel-Buffering": "no"})

    async def _stream(self, request: Request, sid: str, from_seq: int, fold: TranscriptFold,
                      events: Sequence[Any]) -> AsyncIterator[bytes]:
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for event in self.store.tail(sid, from_seq):
                    await queue.put(event)
            except DshError as error:
                await queue.put(error)

        task = asyncio.create_task(pump())
        # the server stopping (Ctrl-C) ends the stream, so the shutdown finds no request still
        # running to cancel (which uvicorn reported as a traceback)
        stop = asyncio.ensure_future(self.stopping.wait()) if self.stopping is not None \
            else asyncio.get_running_loop().create_future()
        try:
            yield b"retry: 2000\n\n"
            while True:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, stop}, timeout=10,
                                             return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()  # nothing taken from the queue: a cancelled get is safe
                    if stop in done:
                        return
                    if await request.is_disconnected():
                        return
                    yield b": keep-alive\n\n"
                    continue
                item = getter.result()
                batch = [item]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                new = [e for e in batch if not isinstance(e, DshError)]
                if new:
                    entries = fold.feed(new)
                    last = new[-1]["seq"]
                    html = render("_entries.html", entries=entries, sid=sid,
                                  shadows=self._shadows(events, entries)) if entries else b""
                    yield _sse("entries", html, last)
                    yield _sse("count", str(last + 1).encode(), last)
                for error in (e for e in batch if isinstance(e, DshError)):
                    yield _sse("damage", f"{error.code}: {error.message}".encode(), None)
                    return
        finally:
            stop.cancel()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, DshError):
                await task


def _sse(name: str, data: bytes, seq: int | None) -> bytes:
    lines = [b"event: " + name.encode()]
    if seq is not None:
        lines.append(b"id: " + str(seq).encode())
    lines.extend(b"data: " + line for line in data.split(b"\n"))
    return b"\n".join(lines) + b"\n\n"


def _q(value: str) -> str:
    return quote(value, safe="")


def _int_or_none(value: object) -> int | None:
    return value if type(value) is int else None


def _day_ms(text: str, end: bool) -> int | None:
    try:
        day = datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        return None
    return int(day.timestamp() * 1000) + (86_400_000 - 1 if end else 0)


def _filter(infos: Sequence[SessionInfo], q: str, source: str, since: str, until: str
            ) -> list[SessionInfo]:
    """The sessions matching the list's filters (docs/view.md#what-it-shows).

    ``q``: a case-insensitive substring of the id, title, cwd, model or parent; ``source``:
    the source exactly; ``since``/``until`` (``YYYY-MM-DD``, UTC, inclusive): sessions active
    in that range (last activity on or after ``since``, first activity on or before ``until``).
    """
    needle = q.casefold()
    low, high = _day_ms(since, False), _day_ms(until, True)
    out = []
    for info in infos:
        if source and info.source != source:
            continue
        if low is not None and info.last_activity_ms < low:
            continue
        if high is not None and min(info.first_activity_ms, info.created_ms) > high:
            continue
        if needle and not any(needle in value.casefold() for value in (
                info.id, info.title or "", info.cwd or "", info.model or "", info.parent or "")):
            continue
        out.append(info)
    return out


def _model_target(entries: Sequence[Entry], stop: int) -> tuple[int | None, int | None]:
    """The request the model pane shows first: the page's last model call, else its end."""
    for entry in reversed(entries):
        if isinstance(entry, TranscriptMessage) and entry.request_seq is not None:
            return entry.request_seq, entry.seq
    return (stop - 1, None) if stop > 0 else (None, None)


def _model_context(events: Sequence[Any], seq: int, answer_seq: int | None,
                   restore: Any = None, since: ModelRequest | None = None
                   ) -> tuple[dict[str, Any], ModelRequest | None]:
    """The template context of the model view at ``seq`` (the last messages, the header).

    The fold starts from ``restore`` (a restore point's state) or continues from ``since``
    (a model view of the same log kept from an earlier request), whichever is later; the
    view folded is returned beside the context (None when the surface does not fold).
    """
    try:
        request = model_request(events, seq, last=MODEL_MESSAGES, restore=restore,
                                since=since)
    except DshError as error:
        return {"error": f"the surface at #{seq} cannot be derived: {error}",
                "answer": None}, None
    context = _request_context(events, request.messages, request.header, request.context,
                               answer_seq)
    context.update(total=len(request.nodes),
                   hidden=max(0, len(request.nodes) - MODEL_MESSAGES))
    return context, request


def _tail_context(events: Sequence[Any], seq: int, answer_seq: int | None,
                  header_src: str) -> dict[str, Any] | None:
    """The model view at ``seq`` from its last messages read back (None: fold it instead).

    When the events read back hold no request header or context, ``header_src`` (the part
    that folds them from the whole log) is loaded by the page in their place.
    """
    try:
        tail = model_tail(events, seq, last=MODEL_MESSAGES)
    except DshError:
        return None  # the full fold names what is wrong
    if tail is None or tail.complete:
        return None
    context = _request_context(events, tail.messages, tail.header, tail.context, answer_seq)
    context.update(total=None, hidden=0, header_src=None if tail.header_known
                   and tail.context_known else header_src)
    return context


def _request_context(events: Sequence[Any], messages: Sequence[tuple[int, Any]],
                     header: Mapping[str, Any] | None, request_context: Any,
                     answer_seq: int | None) -> dict[str, Any]:
    """The template context of one model view's header, messages and answer."""
    header = header or {}
    config = header.get("config") if isinstance(header.get("config"), Mapping) else None
    raw_tools = header.get("tools")
    tools: list[Any] = list(raw_tools) if isinstance(raw_tools, list) else []
    system = header.get("system")
    items = []
    for node, message in messages:
        source = message.get("source")
        items.append({"seq": node, "role": str(message.get("role")),
                      "blocks": blocks_of(message.get("content")),
                      "checkpoint": isinstance(source, Mapping)
                      and source.get("plugin") == "compact"})
    answer = None
    if answer_seq is not None and 0 <= answer_seq < len(events):
        found = entries_at(events, [answer_seq])
        if found and isinstance(found[0], TranscriptMessage | ToolResult):
            answer = found[0]
    return {"config": config, "tools": [t for t in tools if isinstance(t, Mapping)],
            "system": system if isinstance(system, str) else (
                "\n".join(str(b.get("text")) for b in system if isinstance(b, Mapping))
                if isinstance(system, list) else None),
            "context": request_context, "messages": items, "answer": answer, "error": None,
            "header_src": None}


def create_app(store: ViewStore, *, token: str, stopping: asyncio.Event | None = None,
               bind: tuple[str, int] | None = None) -> ASGIApp:
    """The viewer's ASGI application over ``store``, gated by ``token``.

    Args:
        store: The store to show (the caller closes it).
        token: The secret every request must carry (``?token=`` or the cookie it sets).
        stopping: Set when the server stops: live streams then end (None: they end only
            when their reader goes).
        bind: The host and port the viewer listens on: a request whose ``Host`` header names
            another (:func:`dsh.view._hosts.host_allowed`) is a 400 page; None checks no
            ``Host`` (an app served on no socket of its own).

    Returns:
        An ASGI app: ``/`` the sessions, ``/s/<id>`` a session (``?start=``, ``?at=``),
        ``/s/<id>/e/<seq>`` an event, ``/s/<id>/model/<seq>`` what the model was sent,
        ``/s/<id>/span/<seq>`` what a checkpoint shadows, ``/s/<id>/tree``, ``/diff?a=&b=``,
        ``/search?q=``, ``/s/<id>/search?q=``, ``/s/<id>/live?from=`` (server-sent events).
    """
    warm()
    viewer = _Viewer(store, stopping)
    static = resources.files("dsh.view") / "static"

    async def not_found(request: Request, exc: Exception) -> Response:
        return viewer.not_found(f"Nothing is at {request.url.path}.")

    async def failed(request: Request, exc: Exception) -> Response:
        logger.exception("dsh view failed on %s", request.url.path)
        if isinstance(exc, DshError):
            message = f"error[{exc.code}]: {exc.message}"
        else:
            message = f"{type(exc).__name__}: {exc} (a bug in dsh view; please report it)"
        return viewer.page("error.html", 500, title="error", heading="This page failed",
                           message=message)

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def no_icon(request: Request) -> Response:
        return Response(status_code=204)

    routes = [
        Route("/", viewer.sessions),
        Route("/search", viewer.search),
        Route("/diff", viewer.diff),
        Route("/health", health),
        Route("/favicon.ico", no_icon),
        Route("/s/{sid}", viewer.session),
        Route("/s/{sid}/e/{seq:int}", viewer.event),
        Route("/s/{sid}/e/{seq:int}/text", viewer.text),
        Route("/s/{sid}/model/{seq:int}", viewer.model),
        Route("/s/{sid}/span/{seq:int}", viewer.span),
        Route("/s/{sid}/tree", viewer.tree),
        Route("/s/{sid}/search", viewer.search_in),
        Route("/s/{sid}/live", viewer.live),
        Mount("/static", app=StaticFiles(directory=str(static)), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found, Exception: failed})
    return _Gate(app, token, store.url, bind)

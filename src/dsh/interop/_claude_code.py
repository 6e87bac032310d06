"""Claude Code transcripts (``~/.claude/projects/<cwd>/<sessionId>.jsonl``) into dsh events.

What is read (corpus README "Claude Code"):

* The model-visible thread is the ``parentUuid`` path from the last message entry back to the
  root (a ``compact_boundary`` continues through ``logicalParentUuid``). Claude Code chains
  parallel tool calls awkwardly, so the branch is widened with every line sharing a
  ``message.id`` with a branch line and every ``tool_result`` answering a branch ``tool_use``.
  Message entries off that branch (rewinds, edits) are kept as ``import/claude-code/off-branch``.
  A broken link (a ``parentUuid``/``logicalParentUuid`` naming no line, or a cycle) is common
  in the field: the branch continues from the nearest earlier message line in file order, and
  the repair is kept as an ignorable ``import/claude-code/chain-repair`` event, so an import
  keeps every message and always verifies.
* One ``assistant/message`` per API response: lines sharing ``message.id`` are merged (blocks in
  file order, the last line's ``usage``); ``tool_use`` → ``tool-call`` (arguments = the input
  as JSON text), ``thinking`` → ``reasoning`` (signature kept on the block), other blocks are
  kept as ``{"type": "provider-raw", "provider": "anthropic", "block": …}``.
* ``tool_result`` blocks → ``tool/result`` (``toolUseResult`` UI data goes to ``meta``).
* ``[Request interrupted by user…]`` → that text as a user message, then ``turn/end`` aborted
  ``{kind: "user"}``.
* ``compact_boundary`` + the ``isCompactSummary`` entry → a compaction whose replacing
  ``user/message`` holds the summary text the model continued from.
* Sidechains: inline ``isSidechain`` entries (1.0.x) and ``<sessionId>/subagents/agent-*.jsonl``
  files (2.1.x) become child sessions (header ``parentSession``, ``origin: "subagent"``).
* A ``summary`` line (Claude Code's title of a conversation) becomes a ``session/title``
  ``{title}`` event; the one whose ``leafUuid`` is on the model-visible branch wins, else the
  last one.
* ``progress``, ``file-history-snapshot``, ``queue-operation``, ``summary`` and ``system`` lines
  are kept as ignorable ``import/claude-code/<type>`` events; every mapped message line is also
  kept, minus its ``message.content`` (which the mapped event holds), as an ignorable
  ``import/claude-code/envelope`` event (uuid, parentUuid, timestamp, requestId, usage, …).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Final

from dsh.interop._anthropic import (
    ARGUMENTS_ENCODER,
    anthropic_blocks,
    anthropic_usage,
    result_blocks,
)
from dsh.interop._claude_code_index import (
    ACTIVE,
    FIRST_PART,
    LATER_PART,
    PROGRESS,
    SIDE,
    BranchIndex,
    Flagged,
)
from dsh.interop._common import (
    EventBuilder,
    ImportBatch,
    ImportedSession,
    JsonlSource,
    JsonObj,
    PendingCall,
    StreamedSession,
    collect,
    derived_id,
    note_line,
    parse_time,
    stable_session_id,
    str_or_none,
    text_blocks,
    token_count,
    usable_id,
)
from dsh.json import c_claude_envelope, c_claude_line, c_claude_map

FORMAT: Final = "claude-code"
_MESSAGE_TYPES: Final = frozenset({"user", "assistant"})
_INTERRUPT_PREFIX: Final = "[Request interrupted by user"
_NOT_TYPED_PREFIXES: Final = ("<local-command-stdout>", "<local-command-caveat>",
                              "<local-command-stderr>")
_KNOWN_TYPES: Final = frozenset({"user", "assistant", "system", "progress", "summary",
                                 "file-history-snapshot", "queue-operation"})


def looks_like_claude_code(record: object) -> bool:
    """True when a decoded JSONL record has the shape of a Claude Code transcript line."""
    if not isinstance(record, dict):
        return False
    kind = record.get("type")
    if not isinstance(kind, str):
        return False
    if kind in ("user", "assistant", "system", "progress"):
        return "uuid" in record and ("sessionId" in record or "parentUuid" in record)
    if kind == "summary":
        return "leafUuid" in record
    return kind in ("file-history-snapshot", "queue-operation") and (
        "messageId" in record or "operation" in record)


def import_claude_code(path: Path) -> list[ImportedSession]:
    """Import one Claude Code transcript (and its subagent files) as dsh sessions.

    Args:
        path: The ``<sessionId>.jsonl`` file (or a subagent ``agent-*.jsonl`` file).

    Returns:
        One session; inline sidechains and ``<stem>/subagents/agent-*.jsonl`` files are its
        ``children``.

    Raises:
        ImportFormatError: unreadable/empty/binary file, a non-JSON or torn line, a line that is
            not a JSON object, or a file without any Claude Code record.
    """
    return collect(stream_claude_code(path))


def stream_claude_code(path: Path, parent: str | None = None) -> Iterator[StreamedSession]:
    """Stream one Claude Code transcript: the session, then its children (parents first).

    Two reads of the file (docs/interop.md#streaming-imports): the first keeps only what
    chooses the model-visible branch in a :class:`BranchIndex` (each record's uuid, link, type,
    response id and tool ids, in a temporary SQLite database; one byte a record in memory,
    none for a blank line) and
    the session's identity; the second maps the main session's lines as they are read, a batch
    of events at a time. An API response split over several lines is merged by reading its
    other lines ahead (by offset; kept until the second read reaches them). Inline sidechains
    and subagents mirrored in ``agent_progress`` lines are read as whole sessions (one at a
    time, after the main one); ``subagents/agent-*.jsonl`` files are streamed in turn.

    Raises:
        ImportFormatError: as :func:`import_claude_code`, when a batch or the next session is
            asked for.
    """
    src = JsonlSource(path, FORMAT, live=True)
    index = BranchIndex()
    try:
        scan = _Scan(index)
        for rec, line, offset, record in src.records():
            scan.add(path, rec, line, offset, record)
        if not scan.claude_code:
            raise _error(path, scan.first_line, "no Claude Code transcript record from this "
                         "line on (expected user/assistant lines with uuid and sessionId); "
                         "pass the --format the file is in")
        index.resolve(scan.mainline, lambda at: src.record_at(*index.place(at)))
    except BaseException:
        index.close()
        raise
    own_session = usable_id(scan.session)
    if scan.mainline or scan.agent is None:
        session_id = stable_session_id(path, FORMAT, own_session)
        header_extra: JsonObj = {}
    else:
        session_id = _child_id(own_session or str(path.resolve()), f"agent-{scan.agent}")
        header_extra = {"origin": "subagent", "delegationDepth": 1}
        if own_session:
            header_extra["parentSession"] = own_session
    if parent is not None:
        header_extra["parentSession"] = parent
    flags = index.flags
    side = Flagged(flags, SIDE)
    has_side = bool(side)
    b = EventBuilder(FORMAT, session_id, path)
    b.model = ("anthropic", "unknown")
    first = scan.first_time(has_side)
    if first is not None:
        b.at(first)
    header = b.header(cwd=scan.first_cwd(has_side), extra=header_extra,
                      stamp=not scan.timed(has_side))
    stream = StreamedSession(session_id, header, iter(()), FORMAT, str(path.resolve()), parent,
                             src.torn_line)
    ahead: dict[int, JsonObj] = {}  # later parts of a split response (by record number)
    reader: list[BinaryIO] = []  # the file, open for those reads while the session is mapped

    def part_records(rec: int, record: JsonObj) -> list[Any]:
        """The records of the API response ``rec`` opens (``[record]`` for a whole one)."""
        if not flags[rec] & FIRST_PART:
            return [record]
        out: list[Any] = []
        for at, line, offset in index.parts(rec):
            if at == rec:
                out.append(record)
                continue
            if not reader:
                reader.append(path.open("rb"))
            r = src.record_at(line, offset, reader[0])
            if len(ahead) < _AHEAD_LIMIT:
                ahead[at] = r
            out.append(r)
        return out

    def blocks_of(key: str, rec: int, record: JsonObj) -> tuple[list[JsonObj], Any]:
        blocks: list[JsonObj] = []
        usage: Any = None
        for r in part_records(rec, record):
            msg = r.get("message") if isinstance(r, dict) else None
            if not isinstance(msg, dict):
                continue
            blocks.extend(anthropic_blocks(msg.get("content")))
            if isinstance(msg.get("usage"), dict):
                usage = msg["usage"]
        return blocks, usage

    read = [0]  # the offset of the line being mapped

    def records() -> Iterator[tuple[int, int, JsonObj]]:
        # no inline sidechain: no record to leave out (and no membership test a record)
        for rec, line, offset, r in src.records(side if has_side else None, exclude=True,
                                                ahead=ahead):
            read[0] = offset
            yield line, rec, r

    def mapper(entries: Iterator[tuple[int, int, JsonObj]]) -> Generator[None, None, None]:
        return _map(b, entries, path, lambda rec, uid: bool(flags[rec] & ACTIVE),
                    index.repairs, index.title_line, blocks_of,
                    lambda key, rec: bool(flags[rec] & LATER_PART))

    c_map = c_claude_map  # the accelerator's mapper of a common line (None: the reference)

    def quick_batches(c_map: Any) -> Iterator[ImportBatch]:
        """The batches of :func:`_map`, ``claude_map`` asked first on each line, in one loop.

        A line ``claude_map`` declines is fed to the reference loop, which keeps its state (the
        compact boundary) across the lines it is fed; the lines ``claude_map`` mapped never
        reach it. No generator layers or callbacks a line beyond the file's records.
        """
        state, repairs = vars(b), index.repairs
        title = index.title_line or 0
        feed: deque[tuple[int, int, JsonObj]] = deque()
        # one declined line is fed at a time: _map takes it and yields
        mapping = mapper(iter(feed.popleft, None))
        set_line = note_line
        try:
            for rec, line, offset, r in src.records(side if has_side else None, exclude=True,
                                                    ahead=ahead):
                read[0] = offset
                set_line(line)
                if not c_map(state, r, line, rec, flags[rec], repairs, title, PendingCall,
                             ARGUMENTS_ENCODER, part_records):
                    feed.append((line, rec, r))
                    next(mapping)
                if len(b.events) >= STREAM_BATCH_EVENTS:
                    yield ImportBatch(*b.drain(), end=offset)
        finally:
            mapping.close()

    def batches() -> Iterator[ImportBatch]:
        try:
            if c_map is not None:
                yield from quick_batches(c_map)
            else:
                for _ in mapper(records()):
                    if len(b.events) >= STREAM_BATCH_EVENTS:
                        yield ImportBatch(*b.drain(), end=read[0])
            b.finish()
            if b.events:
                yield ImportBatch(*b.drain(), end=src.size)
        finally:
            index.close()
            for f in reader:
                f.close()

    stream.batches = batches()
    yield stream
    if has_side:
        side_entries = [(line, r) for _, line, _, r in src.records(side)]
        for root_uuid, group in _sidechain_groups(side_entries):
            child_id = _child_id(session_id, f"sidechain-{root_uuid}")
            child = _build(group, path, child_id, {
                "parentSession": session_id, "origin": "subagent", "delegationDepth": 1})
            child.torn_line = src.torn_line
            yield StreamedSession.of(child, session_id)
        del side_entries
    sub_dir = path.with_suffix("") / "subagents"
    filed: set[str] = set()
    if scan.mainline and sub_dir.is_dir():
        for sub in sorted(sub_dir.glob("agent-*.jsonl")):
            yield from stream_claude_code(sub, session_id)
            filed.add(sub.stem[len("agent-"):])
    if scan.progress:
        progress = [(line, r) for rec, line, _, r in src.records(Flagged(flags, PROGRESS))
                    if rec not in side]
        for agent, group in _progress_agents(progress).items():
            if agent in filed:
                continue
            child_id = _child_id(session_id, f"agent-{agent}")
            built = _build(group, path, child_id, {
                "parentSession": session_id, "origin": "subagent", "delegationDepth": 1},
                linear=True)
            built.torn_line = src.torn_line
            yield StreamedSession.of(built, session_id)


STREAM_BATCH_EVENTS: Final = 5_000
"""Events a streamed Claude Code session hands out at a time."""

_AHEAD_LIMIT: Final = 256
"""Lines read ahead (later parts of split responses) kept for the second read to reuse."""


class _Scan:
    """The first read of a Claude Code file: its identity, the branch skeleton to the index."""

    def __init__(self, index: BranchIndex) -> None:
        self.index = index
        self.claude_code = False
        self.first_line = 0
        self.mainline = False
        self.progress = False
        self.session: str | None = None
        self.agent: str | None = None
        # first timestamp / cwd / whether a later time parses: over all lines, and over lines
        # that are not sidechain candidates (isSidechain with a uuid)
        self._first_ts: dict[bool, object] = {}
        self._timed: dict[bool, bool] = {}  # some timestamp parses (looked for until one does)
        self._cwds: dict[bool, object] = {}
        self._settled = False  # the three above are found: only the skeleton is left

    def add(self, path: Path, rec: int, line: int, offset: int, r: Any) -> None:
        """Keep one decoded record: in C for the common one once the identity is settled.

        ``rec``: its record number (blank lines not counted); ``line``: its file line.
        """
        if self._settled and c_claude_line is not None:
            got = c_claude_line(r, rec, line, offset)
            if got is not None:  # what _add answers (a dict with a str type, not a title)
                bits, row, tools = got
                if bits & 1:
                    self.mainline = True
                # r is a dict here: no agentId key, nothing for _identity to find in it
                if self.session is None or (self.agent is None and "agentId" in r):
                    self._identity(r)
                if bits & 4:
                    self.progress = True
                self.index.add_row(row, tools, bool(bits & 2), bool(bits & 4))
                return
        self._add(path, rec, line, offset, r)
        # from here on only the branch skeleton and the identity are left to find
        self._settled = (self.claude_code and len(self._first_ts) == 2
                         and len(self._cwds) == 2 and all(self._timed.values()))

    def _add(self, path: Path, rec: int, line: int, offset: int, r: Any) -> None:
        """The reference of :meth:`add` (what ``c_claude_line`` shortcuts)."""
        if not isinstance(r, dict) or not isinstance(r.get("type"), str):
            raise _not_a_record(path, line, r)
        if not self.first_line:
            self.first_line = line
        kind = r["type"]
        if not self.claude_code:
            self.claude_code = looks_like_claude_code(r)
        if kind in _MESSAGE_TYPES and not r.get("isSidechain"):
            self.mainline = True
        self._identity(r)
        candidate = bool(r.get("isSidechain")) and _uuid(r) is not None
        if len(self._first_ts) < 2 or len(self._cwds) < 2 or not all(self._timed.values()):
            for group in ((False, True) if not candidate else (False,)):
                # group False: every line; True: the lines that stay in the main session anyway
                stamp = r.get("timestamp")
                if stamp:
                    self._first_ts.setdefault(group, stamp)
                    if not self._timed.get(group):
                        self._timed[group] = parse_time(stamp) is not None
                if group not in self._cwds and isinstance(r.get("cwd"), str):
                    self._cwds[group] = r["cwd"]
        data = r.get("data")
        progress = kind == "progress" and isinstance(data, dict) and data.get(
            "type") == "agent_progress"
        self.progress = self.progress or progress
        self.index.add(rec, line, offset, kind, candidate, progress, r)

    def _identity(self, r: JsonObj) -> None:
        """The first usable ``sessionId`` and ``agentId`` of the file."""
        if self.session is None:
            value = r.get("sessionId")
            if isinstance(value, str) and value:
                self.session = value
        if self.agent is None:
            value = r.get("agentId")
            if isinstance(value, str) and value:
                self.agent = value

    def first_time(self, side: bool) -> object:
        """The first non-empty timestamp of the main session's lines."""
        return self._first_ts.get(side)

    def timed(self, side: bool) -> bool:
        """True when some timestamp of the main session's lines parses (else: stamped)."""
        return self._timed.get(side, False)

    def first_cwd(self, side: bool) -> object:
        """The first string cwd of the main session's lines."""
        return self._cwds.get(side)


def _progress_agents(entries: list[tuple[int, JsonObj]]) -> dict[str, list[tuple[int, JsonObj]]]:
    """Rebuild subagent transcripts mirrored into ``agent_progress`` lines (2.1.x).

    Each progress line's ``data.message`` is one subagent message entry; they are linear (no
    usable ``parentUuid``), in file order, grouped by ``data.agentId``.
    """
    agents: dict[str, list[tuple[int, JsonObj]]] = {}
    for line, r in entries:
        data = r.get("data")
        if r.get("type") != "progress" or not isinstance(data, dict):
            continue
        inner = data.get("message")
        agent = data.get("agentId")
        if (data.get("type") != "agent_progress" or not isinstance(agent, str)
                or not isinstance(inner, dict) or inner.get("type") not in ("user", "assistant")):
            continue
        entry = dict(inner)
        entry.setdefault("uuid", f"{r.get('uuid')}:message")
        entry.setdefault("timestamp", r.get("timestamp"))
        entry.setdefault("cwd", r.get("cwd"))
        entry["isSidechain"] = True
        entry["agentId"] = agent
        agents.setdefault(agent, []).append((line, entry))
    return agents


def _child_id(parent: str, name: str) -> str:
    return derived_id(f"{FORMAT}:{parent}:{name}")


def _uuid(record: JsonObj) -> str | None:
    """A line's ``uuid`` when it is a usable string (damaged lines may hold anything)."""
    return str_or_none(record.get("uuid"))


def _response_key(record: JsonObj, line: int) -> str:
    """The key merging the lines of one API response: ``message.id``, else the line's uuid."""
    msg = record.get("message")
    own = str_or_none(msg.get("id")) if isinstance(msg, dict) else None
    return own or _uuid(record) or f"line-{line}"


def _error(path: Path, line: int, message: str) -> Exception:
    from dsh._errors import ImportFormatError

    return ImportFormatError(message, path=str(path), line=line, format=FORMAT)


_JSON_KINDS: Final = {dict: "an object", list: "an array", str: "a string", int: "a number",
                     float: "a number", bool: "a boolean", type(None): "null"}


def _not_a_record(path: Path, line: int, r: Any) -> Exception:
    """The error for a line that is not a Claude Code record (an object with a string type).

    Says what the line is instead; an object's keys are the file's text, shown through
    :func:`dsh.transcript.printable` (docs/cli.md#output) and cut to the first few.
    """
    from dsh._errors import ImportFormatError
    from dsh.transcript import printable

    if isinstance(r, dict):
        keys = ", ".join(printable(repr(k) if not k.isidentifier() else k) for k in list(r)[:8])
        more = f", … {len(r) - 8} more" if len(r) > 8 else ""
        found = (f"this object's \"type\" is {_JSON_KINDS.get(type(r['type']), 'not a string')}"
                 if "type" in r else f"this object has none (keys: {keys or 'none'}{more})")
        what = f"needs a string \"type\" field; {found}"
    else:
        what = ("must be a JSON object with a string \"type\" field; this line is "
                f"{_JSON_KINDS[type(r)]}")
    return ImportFormatError(f"{path}:{line}: a Claude Code record {what}; fix or delete that "
                             "line", path=str(path), line=line, format=FORMAT)


def _sidechain_groups(
        side: list[tuple[int, JsonObj]]) -> list[tuple[str, list[tuple[int, JsonObj]]]]:
    """Group inline sidechain entries by the root their ``parentUuid`` chain reaches."""
    by_uuid = {u: r for _, r in side if (u := _uuid(r)) is not None}
    roots: dict[str, str] = {}

    def root_of(u: str) -> str:
        seen: list[str] = []
        cur = u
        while True:
            if cur in roots:
                found = roots[cur]
                break
            parent = by_uuid[cur].get("parentUuid")
            if not isinstance(parent, str) or parent not in by_uuid or parent in seen:
                found = cur
                break
            seen.append(cur)
            cur = parent
        for s in seen:
            roots[s] = found
        roots[u] = found
        return found

    groups: dict[str, list[tuple[int, JsonObj]]] = {}
    for line, r in side:
        groups.setdefault(root_of(str(_uuid(r))), []).append((line, r))
    return list(groups.items())


def _active_set(entries: list[tuple[int, JsonObj]]) -> tuple[set[str], dict[str, JsonObj]]:
    """Uuids of the model-visible branch (widened as the module docstring says), and repairs.

    The branch follows parent links from the last message line while they are sound. A link
    naming no line (or a line already on the branch: a cycle) is broken: the walk continues
    from the nearest earlier message line (file order) not yet on the branch, so nothing before
    the break is lost. Each repair is returned by the uuid of the line whose link was broken:
    ``{"line", "uuid", "brokenLink": parentUuid|logicalParentUuid, "missing", "linkedTo"}``.
    """
    order = [(line, u) for line, r in entries if (u := _uuid(r)) is not None
             and r.get("type") in ("user", "assistant", "system")]
    by_uuid = {u: r for _, r in entries if (u := _uuid(r)) is not None}
    position = {u: i for i, (_, u) in enumerate(order)}
    lines = dict((u, line) for line, u in order)
    chain: set[str] = set()
    repairs: dict[str, JsonObj] = {}
    cur = order[-1][1] if order else None
    while cur is not None and cur not in chain:
        chain.add(cur)
        node = by_uuid[cur]
        field_name = "parentUuid"
        nxt = node.get("parentUuid")
        if nxt is None and node.get("subtype") == "compact_boundary":
            field_name, nxt = "logicalParentUuid", node.get("logicalParentUuid")
        if nxt is None:
            break  # a root: the conversation starts here
        if isinstance(nxt, str) and nxt in by_uuid and nxt not in chain:
            cur = nxt
            continue
        back = position.get(cur, len(order)) - 1
        while back >= 0 and order[back][1] in chain:
            back -= 1
        linked = order[back][1] if back >= 0 else None
        repairs[cur] = {"line": lines.get(cur), "uuid": cur, "brokenLink": field_name,
                        "missing": nxt, "linkedTo": linked}
        cur = linked
    message_ids = {_message_id(r) for u, r in by_uuid.items()
                   if u in chain and r.get("type") == "assistant"}
    message_ids.discard(None)
    call_ids: set[str] = set()
    for u, r in by_uuid.items():
        if r.get("type") == "assistant" and _message_id(r) in message_ids:
            chain.add(u)
    for u in chain:
        r = by_uuid[u]
        msg = r.get("message")
        if (r.get("type") == "assistant" and isinstance(msg, dict)
                and isinstance(msg.get("content"), list)):
            call_ids.update(b["id"] for b in msg["content"]
                            if isinstance(b, dict) and b.get("type") == "tool_use"
                            and isinstance(b.get("id"), str))
    for u, r in by_uuid.items():
        msg = r.get("message")
        if (r.get("type") == "user" and isinstance(msg, dict)
                and isinstance(msg.get("content"), list)
                and any(isinstance(b, dict) and b.get("type") == "tool_result"
                        and str_or_none(b.get("tool_use_id")) in call_ids
                        for b in msg["content"])):
            chain.add(u)
    return chain, repairs


def _message_id(record: JsonObj) -> str | None:
    msg = record.get("message")
    return str_or_none(msg.get("id")) if isinstance(msg, dict) else None


def _user_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content
                       if isinstance(b, dict) and isinstance(b.get("text"), str))
    return ""


def _build(entries: list[tuple[int, JsonObj]], path: Path, session_id: str,
           header_extra: JsonObj, *, linear: bool = False) -> ImportedSession:
    """Map a whole group of lines (a sidechain, a mirrored subagent) held in memory."""
    b = EventBuilder(FORMAT, session_id, path)
    b.model = ("anthropic", "unknown")
    active, repairs = (({u for _, r in entries if (u := _uuid(r)) is not None}, {}) if linear
                       else _active_set(entries))
    for _, r in entries:
        if r.get("timestamp"):
            b.at(r["timestamp"])
            break
    # Merge every active line of one API response (they may interleave with results).
    merged: dict[str, list[JsonObj]] = {}
    last_usage: dict[str, Any] = {}
    for line, r in entries:
        note_line(line)
        msg = r.get("message")
        if r.get("type") == "assistant" and _uuid(r) in active and isinstance(msg, dict):
            key = _response_key(r, line)
            merged.setdefault(key, []).extend(anthropic_blocks(msg.get("content")))
            if isinstance(msg.get("usage"), dict):
                last_usage[key] = msg["usage"]
    cwd = next((r["cwd"] for _, r in entries if isinstance(r.get("cwd"), str)), None)
    emitted: set[str] = set()

    def repeated(key: str, line: int) -> bool:
        if key in emitted:
            return True
        emitted.add(key)
        return False

    for _ in _map(b, ((line, line, r) for line, r in entries), path,
                  lambda line, uid: uid in active, repairs,
                  _title_line(entries, active),
                  lambda key, line, r: (merged[key], last_usage.get(key)), repeated):
        pass
    b.finish()
    header = b.header(cwd=cwd, extra=header_extra)
    return b.imported(header)


_Blocks = Callable[[str, int, JsonObj], tuple[list[JsonObj], Any]]
"""``(response key, at, record) -> (merged blocks, last usage)`` of an API response."""


def _map(b: EventBuilder, entries: Iterator[tuple[int, int, JsonObj]], path: Path,
         is_active: Callable[[int, str | None], bool], repairs: dict[str, JsonObj],
         title_line: int | None, blocks_of: _Blocks,
         repeated: Callable[[str, int], bool]) -> Generator[None, None, None]:
    """Map lines to events on ``b``, yielding after each line (a streaming caller drains).

    ``entries``: ``(file line, at, record)``, ``at`` being what the callbacks know the line by
    (its record number in a streamed read, its line in a whole one); ``is_active(at, uuid)``:
    the line is on the model-visible branch; ``repeated(key, at)``: an earlier line of the same
    API response was mapped already (its merged message holds this one); ``title_line``: the
    file line of the title. This loop is the reference of the accelerator's ``claude_map``: a
    streamed read asks that first and feeds this loop only the lines it declines
    (docs/interop.md#streaming-imports).
    """
    boundary: JsonObj | None = None
    for line, at, r in entries:
        note_line(line)
        kind = r["type"]
        b.at(r.get("timestamp"))
        uid = _uuid(r)
        if uid in repairs:
            b.ignorable("chain-repair", repairs[uid])
        if kind in _MESSAGE_TYPES and not is_active(at, uid):
            b.ignorable("off-branch", r)
            yield None
            continue
        if kind in _MESSAGE_TYPES:
            b.ignorable("envelope", _envelope(r))
        if kind == "assistant":
            msg = r.get("message")
            if not isinstance(msg, dict):
                raise _error(path, line, "a Claude Code assistant line needs a \"message\" "
                             "object; fix or delete that line")
            key = _response_key(r, line)
            if repeated(key, at):
                yield None
                continue
            model = msg.get("model") if isinstance(msg.get("model"), str) else None
            blocks, usage = blocks_of(key, at, r)
            b.assistant(blocks, provider="anthropic", model=model, message_id=key,
                        usage=anthropic_usage(usage))
        elif kind == "user":
            _user_entry(b, r, line, path, boundary)
            if r.get("isCompactSummary"):
                boundary = None
        elif (kind == "system" and r.get("subtype") == "compact_boundary"
              and is_active(at, uid)):
            boundary = r
            b.ignorable("system", r)
        elif kind in _KNOWN_TYPES:
            b.ignorable(kind, r)
            if line == title_line:
                b.emit("session/title", {"title": r["summary"]})
        else:
            b.ignorable("unknown", r)
        yield None


def _title_line(entries: list[tuple[int, JsonObj]], active: set[str]) -> int | None:
    """The line of the ``summary`` that titles the session (module docstring), or None."""
    titles = [(line, r) for line, r in entries if r.get("type") == "summary"
              and isinstance(r.get("summary"), str) and r["summary"].strip()]
    on_branch = [line for line, r in titles if str_or_none(r.get("leafUuid")) in active]
    candidates = on_branch or [line for line, _ in titles]
    return candidates[-1] if candidates else None


def _envelope(record: JsonObj) -> JsonObj:
    """A mapped line without its message content (the content lives in the mapped event)."""
    if c_claude_envelope is not None:
        return c_claude_envelope(record)
    msg = record.get("message")
    if not isinstance(msg, dict):
        return record
    return {**record, "message": {k: v for k, v in msg.items() if k != "content"}}


def _user_entry(b: EventBuilder, r: JsonObj, line: int, path: Path,
                boundary: JsonObj | None) -> None:
    msg = r.get("message")
    if not isinstance(msg, dict):
        raise _error(path, line, "a Claude Code user line needs a \"message\" object; fix or "
                     "delete that line")
    content = msg.get("content")
    uid = _uuid(r)
    if r.get("isCompactSummary"):
        compact = (boundary or {}).get("compactMetadata")
        info: JsonObj = compact if isinstance(compact, dict) else {}
        text = _user_text(content)
        b.compaction([{"type": "text", "text": text}], summary=[{"type": "text", "text": text}],
                     compaction_id=str((boundary or {}).get("uuid") or uid),
                     provider="anthropic", token_count=token_count(info.get("preTokens")),
                     extra={"trigger": info["trigger"]} if isinstance(info.get("trigger"), str)
                     else None)
        return
    if isinstance(content, list) and any(isinstance(x, dict) and x.get("type") == "tool_result"
                                         for x in content):
        rest: list[JsonObj] = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                sidecar: JsonObj = {"uuid": uid}
                if "toolUseResult" in r:
                    sidecar["toolUseResult"] = r["toolUseResult"]
                b.tool_result(str(block.get("tool_use_id", "")),
                              result_blocks(block.get("content")),
                              is_error=bool(block.get("is_error")),
                              message_id=f"{uid}:{block.get('tool_use_id')}",
                              meta={"claudeCode": sidecar})
            else:
                rest.append(block)
        if rest:
            b.user(result_blocks(rest), message_id=f"{uid}:text", prompt=False,
                   source={"kind": "plugin", "plugin": "claude-code"})
        return
    text = _user_text(content)
    blocks = text_blocks(content) if isinstance(content, str) else result_blocks(content)
    if text.startswith(_INTERRUPT_PREFIX):
        b.user(blocks, message_id=uid, prompt=False, in_step=False,
               source={"kind": "plugin", "plugin": "claude-code"})
        b.abort_turn()
        return
    typed = not r.get("isMeta") and not text.lstrip().startswith(_NOT_TYPED_PREFIXES)
    source: JsonObj = {"kind": "user"} if typed else {"kind": "plugin", "plugin": "claude-code"}
    b.user(blocks, message_id=uid, prompt=typed, source=source)

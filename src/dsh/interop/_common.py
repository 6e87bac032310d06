"""Shared pieces of the importers: the result type, source reading, and the event builder.

Every importer is a pure mapping ``source file -> ImportedSession``: it reads the file, walks its
records and drives a :class:`EventBuilder`, which writes well-formed dsh events in the typical
order of docs/events.md#a-turn-event-by-event (``turn/start``, ``step/start``, ``user/message``,
``assistant/message``, ``tool/call`` + ``tool/result`` pairs, ``step/end``, ``turn/end``). The
builder tracks the surface (docs/rules.md#the-surface) so a compaction can shadow exactly the
current nodes, and it never leaves a closed step with an unanswered tool call. Records that carry
nothing for the model become ``ignorable: true`` events of type ``import/<format>/<kind>`` whose
data is the raw record (docs/events.md#known-types-and-ignorable-events), so nothing from the source
is lost and dsh readers still load the log.

Every imported session also records where it came from: one ignorable ``import/source`` event
(:func:`source_event_data`: format, path as given, SHA-256 of the file, importer version). The
builder writes it as seq 0, stamped with the time of the first mapped event, so it sits outside
every turn and step; importers that keep a log's own seqs (dsh logs) append it last.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json as _stdjson
import os
import stat
import uuid
from collections.abc import Container, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Final, Literal

import orjson

from dsh._errors import DshError, EventRejectedError, ImportFormatError, InvalidJsonError
from dsh.json import (
    MAX_SAFE_INTEGER,
    c_decode_plain,
    c_line_scan,
    c_utc_millis,
    has_long_number,
    loads_plain,
)

if TYPE_CHECKING:
    from dsh.session import Session


JsonObj = dict[str, Any]
"""A plain (thawed) JSON object as the importers handle it."""

IMPORT_SOURCE_TYPE: Final = "import/source"
"""Type of the one ignorable event per imported session naming its source file (ours; an
ignorable event that dsh readers skip, docs/events.md#known-types-and-ignorable-events)."""

IMPORTER_VERSION: Final = 2
"""Version of the importers' mapping rules, written into ``import/source``; bumped whenever the
same source file would map to different events."""

IMPORT_NAMESPACE: Final = uuid.UUID("6c0b9f43-4d3e-5c2a-9a57-0d5f1e2b7c11")
"""uuid5 namespace of imported session ids (ours; any fixed UUID works)."""

TOOL_OUTCOME_UNKNOWN_TEXT: Final = (
    "The imported transcript records no result for this tool call, so its outcome is unknown. "
    "Retry only if the tool is read-only or idempotent; otherwise first verify external state "
    "or ask the user.")
"""Model-facing text of a result the importer had to supply.

Rule: docs/rules.md#model-facing-text (the same spirit as the repair texts).
"""

ABORTED_TEXT: Final = "The tool call was aborted by the user before a result was recorded."

TERMINAL_TOOLS: Final = frozenset({"finish", "submit", "task_complete", "attempt_completion"})
"""Tools that end an agent's task (OpenHands, SWE-agent, …): a transcript whose last response
called only these, all answered, ended its turn; it was not cut off."""


@dataclass
class ImportedSession:
    """One imported session: a dsh header and a complete, valid seed of events.

    Attributes:
        session_id: Stable id (the source's own id, else uuid5 of resolved path + format).
        header: dsh ``SessionHeader`` fields (``version`` 0, ``id``, ``createdAt`` epoch ms,
            optional absolute ``cwd``, ``parentSession``, ``origin: "subagent"``,
            ``delegationDepth``) — docs/formats.md#the-session-header.
        events: Wire envelopes ``{type, seq, time, data, sourceEventSeqs?, surfaceOp?,
            ignorable?}``, seqs contiguous from 0, times non-decreasing epoch ms.
        children: Subagent / sidechain sessions (their header names this one as parent).
        source_format: Format name, e.g. ``"claude-code"``.
        source_path: The file read (as given, resolved).
        lines: Source line (1-based) each event was mapped from, by seq; None for events the
            importer wrote itself (closers, ``import/source``). May be shorter than ``events``.
        torn_line: The source's last line (1-based) when it was still being written (no
            newline and not JSON yet): left out, the complete lines before it imported
            (docs/interop.md#live-transcripts); None when the file ended cleanly.
    """

    session_id: str
    header: JsonObj
    events: list[JsonObj]
    children: list[ImportedSession] = field(default_factory=list)
    source_format: str = ""
    source_path: str = ""
    lines: list[int | None] = field(default_factory=list)
    torn_line: int | None = None

    def walk(self) -> Iterator[ImportedSession]:
        """Yield this session, then every descendant depth-first."""
        yield self
        for child in self.children:
            yield from child.walk()

    def to_session(self, *, clock: Any = None) -> Session:
        """Build a live :class:`dsh.session._session.Session` seeded with :attr:`events`.

        The seed is validated like live appends (docs/rules.md#seed-validation); the Session adds
        the ``session/end-seed`` marker (docs/rules.md#the-end-seed-marker).

        Raises:
            ImportFormatError: the seed is refused, naming the source file and the line the
                refused event came from. For a dsh log (or the dsh blocks an ATIF export
                keeps) that is bad input (code ``IMPORT_FORMAT``); for any other format the
                importer mapped input it does not understand into a bad event (code
                ``IMPORT_UNMAPPED``: please report it with the source file).
        """
        from dsh.session import Session  # lazy: interop sits above the core

        inherited = self.header.get("seedLength", 0)
        try:
            return Session.create(self.session_id, seed=self.events, header=self.header,
                                  inherited_event_count=inherited if isinstance(inherited, int)
                                  else 0, clock=clock)
        except EventRejectedError as exc:
            index = exc.where.get("seed_index")
            line = (self.lines[index] if isinstance(index, int) and 0 <= index < len(self.lines)
                    else None)
            raise seed_refused(exc, line, self.source_format, self.source_path) from exc


def seed_refused(exc: EventRejectedError, line: int | None, fmt: str,
                 path: str) -> ImportFormatError:
    """The ImportFormatError of an imported seed the session refused (:meth:`to_session`)."""
    where = ("the event mapped from this line" if line and path else
             f"the event mapped from line {line}" if line else "an imported event")
    return ImportFormatError(
        f"{_kind(fmt)} transcript cannot become a dsh session: {where} is refused "
        f"({exc.message})", code=None if fmt in _NATIVE else UNMAPPED_CODE,
        path=path or None, line=line, format=fmt)


@dataclass
class ImportBatch:
    """Events of one streamed session, in seq order, with the source line of each.

    Attributes:
        events: Wire envelopes as in :attr:`ImportedSession.events` (seqs continue the
            previous batch's).
        lines: Source line (1-based) of each event, None for events the importer wrote itself.
        end: Bytes of the source read for this batch and the ones before it (for progress),
            None when the importer does not say.
    """

    events: list[JsonObj]
    lines: list[int | None]
    end: int | None = None


@dataclass
class StreamedSession:
    """One session of a streaming import (:func:`dsh.interop.stream_file`).

    The header is known first; the events follow in :attr:`batches`, read from the source as
    they are asked for, so only a batch is held at a time (docs/interop.md#streaming-imports).
    Exhaust (or drop) one session's batches before asking the stream for the next session.

    Attributes:
        session_id: As :attr:`ImportedSession.session_id`.
        header: As :attr:`ImportedSession.header`.
        batches: The events, a batch at a time; iterating may raise ``ImportFormatError``
            (a record the importer cannot map, a refused mapping) naming the file and line.
        source_format: Format name.
        source_path: The file read (resolved).
        parent: Session id of the streamed session this one is a child of (subagents,
            sidechains), None for a top-level session. Parents come before their children.
        torn_line: As :attr:`ImportedSession.torn_line`.
    """

    session_id: str
    header: JsonObj
    batches: Iterator[ImportBatch]
    source_format: str = ""
    source_path: str = ""
    parent: str | None = None
    torn_line: int | None = None

    def refused(self, exc: EventRejectedError, batch: ImportBatch) -> ImportFormatError:
        """The ImportFormatError of ``batch`` refused by seed validation (naming its line)."""
        index = exc.where.get("seed_index")
        first = batch.events[0].get("seq", 0) if batch.events else 0
        offset = index - first if isinstance(index, int) and isinstance(first, int) else -1
        line = batch.lines[offset] if 0 <= offset < len(batch.lines) else None
        return seed_refused(exc, line, self.source_format, self.source_path)

    @classmethod
    def of(cls, imported: ImportedSession, parent: str | None = None) -> StreamedSession:
        """A materialised session as a stream of one batch (formats that need the whole file)."""
        batch = ImportBatch(imported.events, [
            *imported.lines, *[None] * (len(imported.events) - len(imported.lines))])
        return cls(imported.session_id, imported.header, iter([batch]),
                   imported.source_format, imported.source_path, parent, imported.torn_line)


def collect(streams: Iterable[StreamedSession]) -> list[ImportedSession]:
    """Materialise streamed sessions: each with all its events, children under their parent.

    Raises:
        ImportFormatError: as the stream does.
    """
    tops: list[ImportedSession] = []
    by_id: dict[str, ImportedSession] = {}
    for stream in streams:
        events: list[JsonObj] = []
        lines: list[int | None] = []
        for batch in stream.batches:
            events.extend(batch.events)
            lines.extend(batch.lines)
        session = ImportedSession(stream.session_id, stream.header, events, [],
                                  stream.source_format, stream.source_path, lines,
                                  stream.torn_line)
        parent = by_id.get(stream.parent) if stream.parent is not None else None
        (parent.children if parent is not None else tops).append(session)
        by_id[stream.session_id] = session
    return tops


_NATIVE: Final = frozenset({"dsh", "atif"})
"""Formats whose files may carry dsh events or messages verbatim (a dsh log; the ``extra.dsh``
of an ATIF export): a refused seed is bad input there, not an importer gap."""


# --- unexpected shapes --------------------------------------------------------------------

UNMAPPED_CODE: Final = "IMPORT_UNMAPPED"
"""``ImportFormatError.code`` of input an importer's mapping rules do not cover (fuzzing looks
for it: every such case is a missing check in an importer)."""

_LINE: ContextVar[int | None] = ContextVar("dsh_import_line", default=None)
_TORN: ContextVar[list[tuple[str, int]] | None] = ContextVar("dsh_import_torn", default=None)


@contextmanager
def torn_tails() -> Iterator[list[tuple[str, int]]]:
    """Collect ``(resolved path, line)`` of each torn last line a live read left out."""
    found: list[tuple[str, int]] = []
    token = _TORN.set(found)
    try:
        yield found
    finally:
        _TORN.reset(token)


def note_line(line: int | None) -> None:
    """Record the source line an importer is mapping (named by :func:`mapping_errors`)."""
    _LINE.set(line)


_UNEXPECTED: Final = (TypeError, ValueError, KeyError, AttributeError, IndexError,
                      RecursionError, UnicodeError, OverflowError)


@contextmanager
def mapping_errors(path: Path, fmt: str) -> Iterator[None]:
    """Turn a failure of an importer on input it does not expect into an ImportFormatError.

    Every importer checks the shapes it relies on; this is the backstop for a shape no check
    covers, so any bytes at all give a typed error naming the file and the line being mapped
    (code :data:`UNMAPPED_CODE`) instead of a Python traceback.

    Raises:
        ImportFormatError: in place of the unexpected exception (chained to it).
    """
    token = _LINE.set(None)
    try:
        yield
    except DshError:
        raise
    except _UNEXPECTED as exc:
        line = _LINE.get()
        raise ImportFormatError(
            f"{_kind(fmt)} transcript has a record this importer cannot map "
            f"({type(exc).__name__}: {str(exc)[:200]}); check the record, or report it with "
            "the file if it is valid", code=UNMAPPED_CODE, path=str(path), line=line,
            format=fmt) from exc
    finally:
        _LINE.reset(token)


# --- reading ------------------------------------------------------------------------------


def _kind(fmt: str) -> str:
    """How a message names the source: its format, or just "the" when it is still unknown."""
    return "the" if fmt == "auto" else fmt


class _NotRegular(Exception):
    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


_KINDS: Final = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                 (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                 (stat.S_ISDIR, "a folder"))


def read_regular_file(path: Path) -> bytes:
    """The bytes of a regular file; never blocks on a FIFO or a device.

    The file is opened non-blocking and checked with ``fstat`` on the open descriptor (no
    window between the check and the read), so a FIFO, socket or device given as a
    transcript is refused instead of waiting forever for a writer
    (``docs/interop.md#what-an-importer-reads``).

    Raises:
        OSError: the file cannot be opened or read.
        _NotRegular: it is not a regular file (``kind`` names what it is).
    """
    with open_regular(path) as f:
        return f.read()


@contextmanager
def open_regular(path: Path) -> Iterator[BinaryIO]:
    """Open a regular file for reading in binary, as :func:`read_regular_file` checks it.

    Raises:
        OSError: the file cannot be opened.
        _NotRegular: it is not a regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _NotRegular(next((kind for test, kind in _KINDS if test(mode)),
                                   "not a regular file"))
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as f:
            yield f
    finally:
        os.close(fd)


def _check_bytes(path: Path, fmt: str, *, text: bool, head: bytes, nul: int | None,
                 bad_utf8: int | None) -> None:
    """Refuse an empty file, a SQLite database, UTF-16/32 text, NUL bytes, bad UTF-8, in order.

    Raises:
        ImportFormatError: naming the first of those the file has.
    """
    if not text:
        raise ImportFormatError(
            f"{_kind(fmt)} transcript is empty; expected at least one record", path=str(path),
            line=1, format=fmt, kind="empty")
    if head.startswith(b"SQLite format 3\x00"):
        raise ImportFormatError(
            "this is a SQLite database, not a transcript; if it is a dsh store, read it with "
            f"--store {path}, or copy its sessions with 'dsh convert --from {path} --to STORE'",
            path=str(path), format=fmt, kind="sqlite")
    wide = wide_encoding(head) if nul is not None or bad_utf8 is not None else None
    if wide is not None:
        raise ImportFormatError(
            f"this file is {wide}; save it as UTF-8 (e.g. PowerShell's > writes UTF-16)",
            path=str(path), line=1, format=fmt, encoding=wide, kind="encoding")
    if nul is not None:
        line, column = _line_column(path, nul)
        raise ImportFormatError(
            f"{_kind(fmt)} transcript holds a NUL byte at column {column} (byte offset {nul}); "
            "expected UTF-8 JSON text, found binary data: import the transcript, not this file",
            path=str(path), line=line, byte_offset=nul, format=fmt, kind="binary")
    if bad_utf8 is not None:
        line, column = _line_column(path, bad_utf8)
        raise ImportFormatError(
            f"{_kind(fmt)} transcript is not valid UTF-8 at column {column} (byte offset "
            f"{bad_utf8}); expected JSON text: save the file as UTF-8", path=str(path),
            line=line, byte_offset=bad_utf8, format=fmt, kind="encoding")


def wide_encoding(head: bytes) -> str | None:
    """``"UTF-16"`` or ``"UTF-32"`` when the first bytes of a file are text in that encoding.

    Args:
        head: The file's first bytes (16 are enough; fewer than 4 never match but by a BOM).

    Returns:
        The encoding's name, from a byte order mark (``FF FE``, ``FE FF``, ``FF FE 00 00``,
        ``00 00 FE FF``) or, without one, from the pattern ASCII text has in it: a NUL byte
        every other byte (UTF-16) or three in every four (UTF-32), the other bytes not NUL;
        None otherwise (docs/interop.md#bad-input).
    """
    if head.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "UTF-32"
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "UTF-16"
    words = head[:len(head) - len(head) % 4]
    for size, name in ((4, "UTF-32"), (2, "UTF-16")):
        if len(words) < 4:
            return None
        units = [words[i:i + size] for i in range(0, len(words), size)]
        for at in (0, size - 1):  # the non-NUL byte of each unit: first (LE) or last (BE)
            if all(unit[at] != 0 and unit.count(0) == size - 1 for unit in units):
                return name
    return None


def _line_column(path: Path, offset: int) -> tuple[int, int]:
    """The 1-based line and column (characters, a bad byte counting as one) of byte ``offset``.

    Read again from the start, a chunk at a time (only when an error names the spot), so the
    memory does not grow with the file. A file that cannot be read again gives line 1 and the
    byte offset plus one.
    """
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    line, column, done = 1, 0, 0
    try:
        with open_regular(path) as f:
            while done < offset and (chunk := f.read(min(_SCAN_CHUNK, offset - done))):
                done += len(chunk)
                text = decoder.decode(chunk)
                if "\n" in text:
                    line += text.count("\n")
                    column = len(text) - text.rindex("\n") - 1
                else:
                    column += len(text)
    except (OSError, _NotRegular):
        return 1, offset + 1
    return line, column + len(decoder.decode(b"", final=True)) + 1


@contextmanager
def _source_errors(path: Path, fmt: str) -> Iterator[None]:
    """Turn a failure to open or read a source into its ImportFormatError."""
    try:
        yield
    except OSError as exc:
        raise ImportFormatError(
            f"cannot read {_kind(fmt)} transcript: {exc.strerror or exc}", path=str(path),
            format=fmt, kind="unreadable") from exc
    except _NotRegular as exc:
        raise ImportFormatError(
            f"{path} is {exc.kind}, not a regular file; dsh imports transcript files only "
            "(copy the data into a file first)", path=str(path), format=fmt,
            kind="unreadable") from None


def read_source_bytes(path: Path, fmt: str) -> bytes:
    """Return the file's bytes, refusing unreadable, empty and binary files.

    Raises:
        ImportFormatError: the file cannot be read, is empty, is a SQLite database, holds NUL
            bytes or is not UTF-8.
    """
    with _source_errors(path, fmt):
        raw = read_regular_file(path)
    bad_utf8: int | None = None
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad_utf8 = exc.start
    _check_bytes(path, fmt, text=bool(raw.strip()), head=raw[:16],
                 nul=raw.index(b"\x00") if b"\x00" in raw else None, bad_utf8=bad_utf8)
    source_sha256(path, raw)
    return raw


_DIGESTS: dict[tuple[str, int, int], str] = {}
"""SHA-256 of source files read, by (resolved path, mtime ns, size); cleared when it holds
:data:`_DIGEST_LIMIT` entries."""

_DIGEST_LIMIT: Final = 64


def _file_key(path: Path) -> tuple[str, int, int]:
    found = path.stat()
    return str(path.resolve()), found.st_mtime_ns, found.st_size


def source_sha256(path: Path, raw: bytes | None = None) -> str:
    """Return the hex SHA-256 of a source file (64 lowercase hex digits).

    Digests are kept per (resolved path, mtime ns, size) and :func:`read_source_bytes` records
    the digest of the bytes it read, so an import hashes exactly the bytes it mapped and a
    multi-session file is hashed once.

    Args:
        path: The source file.
        raw: Its bytes when the caller already holds them (the digest is recorded).

    Raises:
        ImportFormatError: the file cannot be read (only when ``raw`` is not given).
    """
    try:
        key = _file_key(path)
        if raw is None:
            cached = _DIGESTS.get(key)
            if cached is not None:
                return cached
            raw = read_regular_file(path)
    except _NotRegular as exc:
        raise ImportFormatError(f"{path} is {exc.kind}, not a regular file; dsh imports "
                                "transcript files only", path=str(path),
                                kind="unreadable") from None
    except OSError as exc:
        if raw is not None:
            return hashlib.sha256(raw).hexdigest()
        raise ImportFormatError(f"cannot read transcript to hash it: {exc.strerror or exc}",
                                path=str(path), kind="unreadable") from exc
    digest = hashlib.sha256(raw).hexdigest()
    if len(_DIGESTS) >= _DIGEST_LIMIT:
        _DIGESTS.clear()
    _DIGESTS[key] = digest
    return digest


def source_event_data(path: Path, fmt: str) -> JsonObj:
    """Return the data of an ``import/source`` event.

    Shape: ``{"format": <format name>, "path": <path as given to the importer>, "sha256": <hex
    digest of the file's bytes>, "size": <bytes covered>, "importerVersion":
    IMPORTER_VERSION}``; a re-import that appends to a grown source records the same again
    (:mod:`dsh.interop._reimport`).

    Raises:
        ImportFormatError: the file cannot be read.
    """
    digest = source_sha256(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ImportFormatError(f"cannot read transcript: {exc.strerror or exc}",
                                path=str(path), format=fmt, kind="unreadable") from exc
    return {"format": fmt, "path": str(path), "sha256": digest, "size": size,
            "importerVersion": IMPORTER_VERSION}


MAX_RECORD_DEPTH: Final = 500
"""Deepest JSON nesting a source record may have (arrays + objects). Real transcripts nest a few
dozen levels; the mapping code walks values recursively, so deeper records are refused."""


def _depth(value: Any) -> int:
    """Nesting depth of a JSON value (0 for a scalar), walked iteratively."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, dict):
            current = list(current.values())
        if isinstance(current, list):
            depth += 1
            deepest = max(deepest, depth)
            stack.extend((item, depth) for item in current if isinstance(item, dict | list))
    return deepest


def _fault(text: bytes, error: InvalidJsonError, line: int) -> tuple[int, str]:
    """The file line of the fault in ``text`` (starting at ``line``) and ``at column N: why``.

    The column counts characters within that file line, from 1 (the parser's own message
    counts lines within the record, which reads as a contradiction of the file line). A fault
    only the lossless rules see (docs/formats.md#lossless-json) keeps ``error``'s text.
    """
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError as bad:
        if "surrogate" not in bad.msg and "recursion" not in bad.msg:
            return line + bad.lineno - 1, f"at column {bad.colno}: {bad.msg}"
    return line, f"({error.message})"


def _one_value_per_line(text: bytes) -> bool:
    """True when ``text`` has two or more non-blank lines and its first one is JSON alone."""
    lines = [part for part in text.split(b"\n") if part.strip()]
    if len(lines) < 2:
        return False
    try:
        orjson.loads(lines[0])
    except orjson.JSONDecodeError:
        return False
    return True


def decode_line(text: bytes, path: Path, fmt: str, line: int, *,
                unit: Literal["record", "document"] = "record") -> Any:
    """Decode one record (a line without its newline) of a ``fmt`` source, plain containers.

    With ``unit="document"`` ``text`` is a whole-file document (line 1 on), and errors say
    "document"; one that is JSONL instead (one JSON value per line) is told to pass the
    --format it is in (docs/interop.md#bad-input).

    Rule: docs/formats.md#lossless-json (as :func:`dsh.json.loads_plain`), records nest at most
    :data:`MAX_RECORD_DEPTH` levels.

    Raises:
        ImportFormatError: not valid JSON, or nested deeper than :data:`MAX_RECORD_DEPTH`
            (naming ``path`` and ``line``).
    """
    if c_line_scan is not None and type(text) is bytes:  # both byte scans in one C pass
        long_number, brackets = c_line_scan(text)
    else:
        long_number, brackets = has_long_number(text), text.count(b"[") + text.count(b"{")
    try:
        value = loads_plain(text, long_number=long_number)
    except InvalidJsonError as exc:
        line, where = _fault(text, exc, line)
        advice = "fix or delete that line"
        if unit == "document":
            advice = "fix the document"
            if _one_value_per_line(text):
                advice = ("the file holds one JSON value per line (JSONL)"
                          + ("" if fmt == "auto" else f", not one {fmt} JSON document")
                          + ": pass the --format the file is in, or leave --format out to "
                          "detect it")
        raise ImportFormatError(
            f"{path}:{line}: {_kind(fmt)} {unit} is not valid JSON {where}; {advice}",
            path=str(path), line=line, format=fmt) from exc
    # Counting brackets bounds the depth from above, so the walk runs only on suspect records.
    if brackets > MAX_RECORD_DEPTH and _depth(value) > MAX_RECORD_DEPTH:
        raise ImportFormatError(
            f"{_kind(fmt)} {unit} nests JSON deeper than {MAX_RECORD_DEPTH} "
            "levels; no transcript format nests that deep, so the file is not a transcript "
            "(or is damaged)", path=str(path), line=line, format=fmt)
    return value


def read_jsonl_records(path: Path, fmt: str, *, live: bool = False) -> list[tuple[int, Any]]:
    r"""Parse a JSONL file into ``(1-based line, value)`` pairs, skipping blank lines.

    Records are split on ``\\n`` only (docs/formats.md#lossless-json); a trailing ``\\r`` is
    tolerated. With ``live`` (a log an agent appends to while it runs: Claude Code, Codex), a
    last line without a newline that is not valid JSON is being written: it is left out and
    noted for :func:`torn_tails` (docs/interop.md#live-transcripts), when a complete record
    precedes it.

    Raises:
        ImportFormatError: unreadable/empty/binary file, or a line that is not JSON (a torn
            last line is reported with its line number as truncated, unless ``live``).
    """
    raw = read_source_bytes(path, fmt)
    parts = raw.split(b"\n")
    out: list[tuple[int, Any]] = []
    last = len(parts)
    for index, part in enumerate(parts, start=1):
        chunk = part[:-1] if part.endswith(b"\r") else part
        if not chunk.strip():
            continue
        try:
            out.append((index, decode_line(chunk, path, fmt, index)))
        except ImportFormatError as exc:
            if index == last and not raw.endswith(b"\n"):
                if live and out:
                    torn = _TORN.get()
                    if torn is not None:
                        torn.append((str(path.resolve()), index))
                    continue
                raise ImportFormatError(
                    f"{_kind(fmt)} transcript ends with a truncated record (no newline and not "
                    f"valid JSON); cut the torn tail or re-copy the file",
                    path=str(path), line=index, format=fmt) from exc
            raise
    return out


_SCAN_CHUNK: Final = 1 << 20
"""Bytes :class:`JsonlSource` reads at a time (its memory does not grow with the file)."""


class JsonlSource:
    r"""A JSONL source read line by line, in memory that does not grow with the file.

    Opening it checks the whole file as :func:`read_source_bytes` does, a megabyte at a time
    (regular, readable, not empty, not SQLite, no NUL byte, UTF-8; the same errors in the same
    order) and records its SHA-256 for ``import/source``; :meth:`records` then decodes the
    lines as :func:`read_jsonl_records` does, as many times as an importer needs
    (docs/interop.md#streaming-imports). Only the ``size`` bytes checked are ever read, so a
    live log that grows meanwhile is read as it was when opened.

    Args:
        path: The file.
        fmt: Its format name (in errors).
        live: A log an agent appends to: a torn last line is left out (:attr:`torn_line`).

    Raises:
        ImportFormatError: as :func:`read_source_bytes`.
    """

    def __init__(self, path: Path, fmt: str, *, live: bool = False) -> None:
        self.path = path
        self.fmt = fmt
        self.live = live
        self.torn_line: int | None = None
        self.size = self._scan()

    def _scan(self) -> int:
        import codecs

        path, fmt = self.path, self.fmt
        digest = hashlib.sha256()
        decoder = codecs.getincrementaldecoder("utf-8")()
        size = 0
        head = b""
        text = False
        nul: int | None = None
        bad_utf8: int | None = None
        with _source_errors(path, fmt), open_regular(path) as f:
            while chunk := f.read(_SCAN_CHUNK):
                digest.update(chunk)
                if len(head) < 16:
                    head += chunk[:16]
                text = text or bool(chunk.strip())
                if nul is None and b"\x00" in chunk:
                    nul = size + chunk.index(b"\x00")
                if bad_utf8 is None:
                    pending = len(decoder.getstate()[0])
                    # ASCII after a whole character is valid UTF-8 as it is: no str to build
                    if pending or not chunk.isascii():
                        try:
                            decoder.decode(chunk)
                        except UnicodeDecodeError as exc:
                            bad_utf8 = size - pending + exc.start
                size += len(chunk)
        if bad_utf8 is None:
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                bad_utf8 = size - len(decoder.getstate()[0])
        _check_bytes(path, fmt, text=text, head=head, nul=nul, bad_utf8=bad_utf8)
        try:
            key = _file_key(path)
        except OSError:
            key = None
        if key is not None and key[2] == size:
            if len(_DIGESTS) >= _DIGEST_LIMIT:
                _DIGESTS.clear()
            _DIGESTS[key] = digest.hexdigest()
        return size

    def lines(self) -> Iterator[tuple[int, int, bytes, bool]]:
        r"""Yield ``(1-based line, byte offset, bytes, ended)`` per non-blank line.

        The bytes lack the newline (and a ``\r`` before it); ``ended`` is False for a last line
        without a newline. Blank lines (empty or ASCII whitespace only) are counted, not
        yielded; a read that holds nothing else is counted without splitting it.
        """
        left = self.size
        offset = 0
        index = 0
        pending: list[bytes] = []  # the start of a line that a read cut (no newline yet)
        with self.path.open("rb") as f:
            # a megabyte at a time, split on newlines: no Python work per byte read, little
            # per line (the lines of a read are split in one C call)
            while left > 0 and (block := f.read(min(_SCAN_CHUNK, left))):
                left -= len(block)
                cut = block.rfind(b"\n")
                if cut < 0:
                    pending.append(block)
                    continue
                ended = b"".join((*pending, block[:cut])) if pending else block[:cut]
                pending = [block[cut + 1:]] if cut + 1 < len(block) else []
                if ended.isspace():  # blank lines only (a run of them): counted in C
                    index += ended.count(b"\n") + 1
                    offset += len(ended) + 1
                    continue
                carriage = b"\r" in ended  # else no line of this read can end with one
                for part in ended.split(b"\n"):
                    index += 1
                    start = offset
                    offset += len(part) + 1
                    if carriage and part.endswith(b"\r"):
                        part = part[:-1]
                    # not blank (isspace() stops at the first other byte: no copy of the line)
                    if part and not part.isspace():
                        yield index, start, part, True
        if pending:
            last = b"".join(pending)
            chunk = last[:-1] if last.endswith(b"\r") else last
            if chunk.strip():
                yield index + 1, offset, chunk, False

    def records(self, wanted: Container[int] | None = None, *, exclude: bool = False,
                ahead: dict[int, Any] | None = None
                ) -> Iterator[tuple[int, int, int, Any]]:
        """Yield ``(record, line, byte offset, decoded value)`` per record, in file order.

        ``record`` numbers the records (the non-blank lines) from 1, blank lines not counted,
        so an index an importer keys by it grows with the records, not with the lines (a file
        of mostly blank lines costs what its records cost); ``line`` is the 1-based file line
        that errors name (docs/interop.md#streaming-imports).

        Args:
            wanted: Only these records (by number) are decoded and yielded (None: every one).
            exclude: Yield the records *not* in ``wanted`` instead.
            ahead: Records already decoded (exactly), by number: taken from it (and removed)
                instead of decoding the line again.

        Raises:
            ImportFormatError: a line that is not JSON (a torn last line of a live log is left
                out and named by :attr:`torn_line` once the lines are exhausted).
        """
        path, fmt = self.path, self.fmt
        seen = False
        rec = 0
        for index, offset, chunk, ended in self.lines():
            rec += 1
            last = not ended  # the last line, without a newline
            if wanted is not None and (rec in wanted) == exclude:
                seen = True
                continue
            if ahead and rec in ahead:
                seen = True
                yield rec, index, offset, ahead.pop(rec)
                continue
            # the common line in one C call; None: decode_line decodes it (and names errors)
            value = c_decode_plain(chunk, MAX_RECORD_DEPTH) if c_decode_plain is not None else None
            try:
                if value is None:
                    value = decode_line(chunk, path, fmt, index)
            except ImportFormatError as exc:
                if last:
                    if self.live and seen:
                        self.torn_line = index
                        torn = _TORN.get()
                        if torn is not None and (str(path.resolve()), index) not in torn:
                            torn.append((str(path.resolve()), index))
                        continue
                    raise ImportFormatError(
                        f"{_kind(fmt)} transcript ends with a truncated record (no newline and "
                        "not valid JSON); cut the torn tail or re-copy the file",
                        path=str(path), line=index, format=fmt) from exc
                raise
            seen = True
            yield rec, index, offset, value

    def record_at(self, line: int, offset: int, f: BinaryIO | None = None) -> Any:
        """Decode the record of ``line`` again, read at ``offset`` (from :meth:`records`).

        ``f``: the file already open for reading (binary), else it is opened for this read.
        """
        if f is None:
            with self.path.open("rb") as opened:
                return self.record_at(line, offset, opened)
        f.seek(offset)
        part = f.readline(max(0, self.size - offset))
        chunk = part[:-1] if part.endswith(b"\n") else part
        if chunk.endswith(b"\r"):
            chunk = chunk[:-1]
        # the common line in one C call, as records() decodes it (None: decode_line decides)
        value = c_decode_plain(chunk, MAX_RECORD_DEPTH) if c_decode_plain is not None else None
        return decode_line(chunk, self.path, self.fmt, line) if value is None else value


def read_json_document(path: Path, fmt: str) -> Any:
    """Parse a whole-file JSON document.

    Raises:
        ImportFormatError: unreadable/empty/binary file or malformed JSON.
    """
    raw = read_source_bytes(path, fmt)
    note_line(1)
    return decode_line(raw, path, fmt, 1, unit="document")


def usable_id(value: object) -> str | None:
    """``value`` when it can serve as a session id as it is, else None.

    Usable: a non-blank string of printable characters that every store can name a session by
    (:func:`session_id_problem`: valid Unicode, a short enough folder name).
    """
    from dsh.persistence import session_id_problem  # lazy: only when an id is checked

    if not isinstance(value, str) or not value.strip() or not value.isprintable():
        return None
    return value if session_id_problem(value) is None else None


def derived_id(name: str) -> str:
    """A uuid5 (in :data:`IMPORT_NAMESPACE`) of ``name``; lone surrogates are hashed as is."""
    # uuid.uuid5 itself, but on bytes: it would refuse a lone surrogate (Python 3.11).
    digest = hashlib.sha1(IMPORT_NAMESPACE.bytes + name.encode("utf-8", "surrogatepass"),
                          usedforsecurity=False).digest()
    return str(uuid.UUID(bytes=digest[:16], version=5))


def stable_session_id(path: Path, fmt: str, own_id: object = None) -> str:
    """The session id of an import: the source's own id when usable, else a uuid5.

    The uuid5 is over ``"<format>:<resolved path>"`` so re-importing one file yields one id; an
    own id that no store could hold (see :func:`usable_id`) is replaced the same way (the raw
    source record keeps it).
    """
    return usable_id(own_id) or derived_id(f"{fmt}:{path.resolve()}")


def parse_time(value: object) -> int | None:
    """Convert an ISO-8601 string or epoch seconds/ms number to epoch ms; None if unusable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        # Numbers below 1e11 are seconds (1e11 s is year 5138; 1e11 ms is 1973).
        ms = int(value * 1000 if abs(value) < 1e11 else value)
        # A time outside the JSON-safe epoch range cannot be a real stamp: ignore it.
        return ms if 0 <= ms <= MAX_SAFE_INTEGER else None
    if isinstance(value, str) and value:
        quick = c_utc_millis(value) if c_utc_millis is not None else None
        if quick is None:
            quick = _utc_millis(value)
        if quick is not None:
            # what parse_time(quick) gives for a millisecond count (a quick time before 1973
            # is below 1e11 and taken as seconds, as parse_time(quick) takes it)
            return quick if 1e11 <= quick <= MAX_SAFE_INTEGER else parse_time(quick)
        text = value.strip().replace("Z", "+00:00")
        try:
            when = _dt.datetime.fromisoformat(text)
        except ValueError:
            try:
                return parse_time(float(text))
            except ValueError:
                return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=_dt.UTC)
        try:
            return parse_time(int(when.timestamp() * 1000))
        except (OverflowError, OSError, ValueError):
            return None  # a date the platform clock cannot place (year 1 in a far zone, …)
    return None


_MINUTES: dict[str, int | None] = {}
"""Microseconds since the epoch of the ``YYYY-MM-DDTHH:MM`` prefixes seen by
:func:`_utc_millis` (None: not a time); cleared when it holds :data:`_MINUTES_LIMIT`."""

_MINUTES_LIMIT: Final = 4096


def _utc_millis(text: str) -> int | None:
    """``int(datetime.fromisoformat(text).timestamp() * 1000)`` for ``YYYY-MM-DDTHH:MM:SS.mmmZ``.

    The shape every Claude Code line stamps, read without building a datetime (the same
    arithmetic: whole microseconds over 10**6, then times 1000); None for any other text,
    which takes the general path. The date, hour and minute are read once per distinct
    prefix (a transcript's lines share them), the seconds and milliseconds on every call.
    """
    if len(text) != 24 or text[23] != "Z" or text[16] != ":" or text[19] != ".":
        return None
    prefix = text[:16]
    base = _MINUTES.get(prefix, -1)
    if base == -1:
        base = _minute_micros(prefix)
        if len(_MINUTES) >= _MINUTES_LIMIT:
            _MINUTES.clear()
        _MINUTES[prefix] = base
    digits = text[17:19] + text[20:23]
    if base is None or not digits.isascii() or not digits.isdigit():
        return None
    seconds = int(digits[:2])
    if seconds > 59:
        return None
    micros = base + seconds * 10**6 + int(digits[2:]) * 1000
    return int(micros / 10**6 * 1000)


def _minute_micros(prefix: str) -> int | None:
    """Microseconds since the epoch of ``YYYY-MM-DDTHH:MM`` (UTC), or None if it is not one."""
    if (prefix[10] != "T" or prefix[4] != "-" or prefix[7] != "-" or prefix[13] != ":"
            or not prefix.isascii()):
        return None
    date, digits = prefix[:10], prefix[11:13] + prefix[14:16]
    if not digits.isdigit() or not (date[:4] + date[5:7] + date[8:]).isdigit():
        return None
    try:
        day = _dt.date.fromisoformat(date).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        return None
    hours, minutes = int(digits[:2]), int(digits[2:])
    if hours > 23 or minutes > 59:
        return None
    return (day * 86400 + hours * 3600 + minutes * 60) * 10**6


_EPOCH_ORDINAL: Final = _dt.date(1970, 1, 1).toordinal()


def token_count(value: object) -> int:
    """A source token count as a non-negative int; 0 when absent or not a usable count.

    Accepts ints and integral floats (``12.0``) and decimal digit strings; negative, fractional,
    boolean and other values count 0 (the raw usage stays in the kept source record).
    """
    if isinstance(value, bool):
        return 0
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().isdecimal() and len(value.strip()) < 16:
        value = int(value.strip())
    return value if isinstance(value, int) and 0 <= value <= MAX_SAFE_INTEGER else 0


def token_usage(raw: object, fields: dict[str, str]) -> JsonObj | None:
    """A provider's usage object as a dsh ``TokenUsage``, or None when ``raw`` is no object.

    Args:
        raw: The source usage, e.g. ``{"input_tokens": 10, "output_tokens": 2}``.
        fields: dsh key → source key, e.g. ``{"inputTokens": "input_tokens", …}``.
            ``inputTokens`` and ``outputTokens`` are always written; other keys only when the
            source has them. Counts go through :func:`token_count` (unusable counts are 0).
    """
    if not isinstance(raw, dict):
        return None
    usage: JsonObj = {}
    for key, source in fields.items():
        value = raw.get(source)
        if value is None and key not in ("inputTokens", "outputTokens"):
            continue
        # a plain count as token_count keeps it, without the call
        usage[key] = (value if type(value) is int and 0 <= value <= MAX_SAFE_INTEGER
                      else token_count(value))
    return usage


def json_text(value: object) -> str:
    """Render a JSON value as text for a content block (lone surrogates kept as they are)."""
    return _stdjson.dumps(value, ensure_ascii=False)


def str_or_none(value: object) -> str | None:
    """``value`` when it is a non-empty string, else None (ids and names in source records)."""
    return value if isinstance(value, str) and value else None


def text_blocks(value: object) -> list[JsonObj]:
    """Turn provider content (string, list of parts, or anything else) into dsh text blocks.

    Strings become one text block; lists keep their ``text`` parts (any part with a string
    ``text``) and render other parts as compact JSON text, so nothing model-visible is dropped.
    """
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if isinstance(value, list):
        out: list[JsonObj] = []
        for part in value:
            if isinstance(part, str):
                out.append({"type": "text", "text": part})
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append({"type": "text", "text": part["text"]})
            else:
                out.append({"type": "text", "text": json_text(part)})
        return out
    return [{"type": "text", "text": json_text(value)}]


# --- the builder --------------------------------------------------------------------------


@dataclass
class PendingCall:
    """A call of the open step not answered yet.

    Its step, the seq of its ``tool/call`` and its tool name (the accelerator's ``claude_map``
    makes them too).
    """

    step: int
    call_seq: int
    name: str


class EventBuilder:
    """Writes a well-formed dsh event sequence from importer calls.

    Rule: docs/events.md#a-turn-event-by-event, docs/rules.md#the-surface.

    Turn/step rules: a user message opens a turn if none is open and a new step if the open step
    already has its model response; an assistant message opens a turn/step likewise (transcripts
    may start mid-turn). Each ``tool-call`` block of an assistant message gets a ``tool/call``
    right after it; a result is a ``tool/result`` appended with ``sourceEventSeqs = [call seq]``.
    Closing a step answers every still-unanswered call with an ``isError`` result stating the
    outcome is unknown (``TOOL_OUTCOME_UNKNOWN``), or aborted (``ABORTED``) when the turn was
    aborted, so no closed step holds a dangling call (as the repair closers do,
    docs/rules.md#closers).

    Args:
        fmt: Format name used in ``import/<format>/<kind>`` types and messages.
        session_id: Id used to derive deterministic message ids ``<session_id>:<seq>``.
        path: Source path, for errors.
    """

    def __init__(self, fmt: str, session_id: str, path: Path) -> None:
        self.fmt = fmt
        self.session_id = session_id
        self.path = path
        self.events: list[JsonObj] = []  # since the last drain() (all of them if never drained)
        self.lines: list[int | None] = []
        self._drained = 0  # events handed out by drain(): seqs below it are gone from here
        self._first_time: int | None = None
        self._system_seqs: set[int] = set()
        self._step_calls: list[str] = []  # tool names of the open step's model response
        self.time = 0
        self._time_seen = False
        self.turn = 0
        self.turn_open = False
        self.step = 0
        self.step_open = False
        self.step_answered = False  # the open step already has its assistant message
        self.pending: dict[str, PendingCall] = {}
        self.nodes: list[int] = []
        self.user_prompts = 0
        self.tool_calls = 0
        self.compactions = 0
        self.model: tuple[str, str] = (fmt, "unknown")
        self._source_written = False

    # -- low level

    @property
    def seq(self) -> int:
        """The seq the next event gets."""
        return self._drained + len(self.events)

    def drain(self) -> tuple[list[JsonObj], list[int | None]]:
        """Hand out the events written since the last drain, with their source lines.

        A streaming importer drains after each source record or batch, so the builder holds
        only what it has not handed out yet (docs/interop.md#streaming-imports). Drain only once
        the clock has seen a time (or :meth:`header` stamped one): a source without any
        timestamp re-stamps every event at :meth:`header`, which needs them all.

        Returns:
            ``(events, lines)``: wire envelopes in seq order and the source line of each.
        """
        events, lines = self.events, self.lines
        self._drained += len(events)
        self.events, self.lines = [], []
        return events, lines

    def at(self, when: object) -> None:
        """Advance the clock to a source timestamp (ISO text or epoch); never moves back."""
        ms = parse_time(when)
        if ms is None:
            return
        if not self._time_seen or ms > self.time:
            self.time = max(ms, 0) if not self._time_seen else ms
        self._time_seen = True

    @property
    def time_seen(self) -> bool:
        """True once the clock has read a source time (or :meth:`header` stamped one)."""
        return self._time_seen

    def first_time(self) -> int:
        """Time of the first event (0 for an empty log): the header's ``createdAt``."""
        return self._first_time if self._first_time is not None else max(self.time, 0)

    def emit(self, type: str, data: Any, *, surface_op: Any = None,
             source_event_seqs: list[int] | None = None, ignorable: bool = False) -> int:
        """Append one envelope and return its seq.

        The first call writes the ``import/source`` event first (seq 0, same time).
        """
        if not self._source_written:
            self._write_source()
        seq = self._drained + len(self.events)
        event: JsonObj = {"type": type, "seq": seq, "time": self.time, "data": data}
        if source_event_seqs is not None:
            event["sourceEventSeqs"] = list(source_event_seqs)
        if surface_op is not None:
            event["surfaceOp"] = surface_op
            if surface_op == "append":
                self.nodes.append(seq)
        if ignorable:
            event["ignorable"] = True
        self.events.append(event)
        self.lines.append(None if type == IMPORT_SOURCE_TYPE else _LINE.get())
        if self._first_time is None:
            self._first_time = self.time
        if type == "system/message":
            self._system_seqs.add(seq)
        elif type == "step/start":
            self._step_calls = []
        elif type == "assistant/message":
            self._step_calls = [str(b.get("name", "")) for b in data["message"]["content"]
                                if b.get("type") == "tool-call"]
        return seq

    def _write_source(self) -> None:
        # Seq 0: before any turn, so it sits outside every turn and step
        # (docs/events.md#known-types-and-ignorable-events: an ignorable event is free-standing).
        self._source_written = True
        self.emit(IMPORT_SOURCE_TYPE, source_event_data(self.path, self.fmt), ignorable=True)

    def ignorable(self, kind: str, raw: Any) -> int:
        """Keep a source record that carries nothing for the model.

        Rule: docs/events.md#known-types-and-ignorable-events.
        """
        return self.emit(f"import/{self.fmt}/{kind}", raw, ignorable=True)

    def message_id(self, preferred: object = None) -> str:
        """A non-empty message id: the source's own when usable, else ``<session>:<seq>``."""
        if isinstance(preferred, str) and preferred:
            return preferred
        return f"{self.session_id}:{self.seq}"

    # -- turns and steps

    def open_turn(self) -> None:
        """Open a new turn (closing a finished previous one as completed)."""
        if self.turn_open:
            self.end_turn({"kind": "completed"})
        self.turn += 1
        self.step = 0
        self.turn_open = True
        self.emit("turn/start", {"turn": self.turn})

    def _open_step(self) -> None:
        if not self.turn_open:
            self.open_turn()
        self.step += 1
        self.step_open = True
        self.step_answered = False
        self.emit("step/start", {"turn": self.turn, "step": self.step})

    def close_step(self, *, aborted: bool = False) -> None:
        """Close the open step, answering unanswered calls first (see class docstring)."""
        if not self.step_open:
            return
        for call_id in list(self.pending):
            text = ABORTED_TEXT if aborted else TOOL_OUTCOME_UNKNOWN_TEXT
            error = ({"name": "AbortError", "code": "ABORTED"} if aborted else
                     {"name": "ToolOutcomeUnknownError", "code": "TOOL_OUTCOME_UNKNOWN"})
            self.tool_result(call_id, [{"type": "text", "text": text}], is_error=True,
                             error=error, meta={"import": {"synthetic": True}})
        self.pending.clear()
        self.emit("step/end", {"turn": self.turn, "step": self.step})
        self.step_open = False
        self.step_answered = False

    def end_turn(self, reason: JsonObj) -> None:
        """Close the open step and turn with ``reason``; no-op if none open.

        Rule: docs/events.md#turnend.
        """
        if not self.turn_open:
            return
        aborted = reason.get("kind") == "aborted"
        self.close_step(aborted=aborted)
        self.emit("turn/end", {"turn": self.turn, "reason": reason})
        self.turn_open = False

    def abort_turn(self) -> None:
        """Close the open turn as aborted by the user (``reason: {kind: "user"}``).

        Rule: docs/events.md#turnend.
        """
        self.end_turn({"kind": "aborted", "reason": {"kind": "user"}})

    # -- messages

    def user(self, content: list[JsonObj], *, source: JsonObj | None = None,
             message_id: object = None, prompt: bool = True, new_turn: bool = False,
             continues: bool = False, in_step: bool = True) -> int:
        """Append a ``user/message`` (surfaceOp append) inside a step.

        Args:
            content: dsh content blocks.
            source: Message source; default ``{"kind": "user"}``.
            message_id: Source id to keep, else a derived one.
            prompt: True when a person typed it (counted in :attr:`user_prompts`).
            new_turn: Start a new turn even if the open one has not finished.
            continues: Never start a new turn (text-mode agents whose observations are user
                messages); otherwise a message after a finished turn (its last response asked
                for no tool) starts a new turn.
            in_step: False puts the message between steps of the open turn (closing the open
                step first), as for an interrupt notice; ``user/message`` is unconstrained by
                the invariants (docs/rules.md#turns-and-steps).
        """
        if self.turn_open and (new_turn or (self.turn_finished() and not continues)):
            self.end_turn({"kind": "completed"})
        if not in_step:
            self.close_step(aborted=True)
            if not self.turn_open:
                self.open_turn()
        elif self.step_open and self.step_answered:
            self.close_step()
        if in_step and not self.step_open:
            self._open_step()
        if prompt:
            self.user_prompts += 1
        message = {"id": self.message_id(message_id), "role": "user", "content": content,
                   "source": source or {"kind": "user"}}
        return self.emit("user/message", message, surface_op="append")

    def system(self, content: list[JsonObj], *, message_id: object = None,
               source: JsonObj | None = None) -> int:
        """Append a ``system/message`` (surface head), outside any step.

        Rule: docs/rules.md#the-system-head.
        """
        message = {"id": self.message_id(message_id), "role": "system", "content": content,
                   "source": source or {"kind": "plugin", "plugin": f"import/{self.fmt}",
                                        "form": "instructions"}}
        return self.emit("system/message", message, surface_op="append")

    def assistant(self, content: list[JsonObj], *, provider: str | None = None,
                  model: str | None = None, message_id: object = None,
                  usage: JsonObj | None = None, replay_state: Any = None) -> int:
        """Append an ``assistant/message`` and one ``tool/call`` per tool-call block.

        Provider/model default to the last ones seen (``self.model``); empty strings are
        replaced because the session requires non-empty ones (docs/rules.md#seed-validation).
        """
        if self.step_open and self.step_answered:
            self.close_step()
        if not self.step_open:
            self._open_step()
        for index, block in enumerate(content):
            # A call the source left without an id still needs one to be answered
            # (docs/rules.md#seed-validation).
            if block.get("type") == "tool-call" and not str_or_none(block.get("id")):
                content[index] = {**block, "id": f"{self.session_id}:{self.seq}:call-{index}"}
        prov = str_or_none(provider) or self.model[0]
        mod = str_or_none(model) or self.model[1]
        self.model = (prov, mod)
        source: JsonObj = {"kind": "model", "provider": prov, "model": mod}
        if replay_state is not None:
            source["replayState"] = replay_state
        message = {"id": self.message_id(message_id), "role": "assistant", "content": content,
                   "source": source}
        data: JsonObj = {"turn": self.turn, "step": self.step, "message": message}
        if usage is not None:
            data["usage"] = usage
        seq = self.emit("assistant/message", data, surface_op="append")
        self.step_answered = True
        for block in content:
            if block.get("type") == "tool-call":
                call_id = str(block["id"])
                call_seq = self.emit("tool/call", {
                    "turn": self.turn, "step": self.step, "callId": call_id,
                    "name": block.get("name", ""), "arguments": block.get("arguments", "")})
                # A reused id answers the newest call first (SWE-agent replays reuse ids).
                self.pending.pop(call_id, None)
                self.pending[call_id] = PendingCall(self.step, call_seq, str(block.get("name", "")))
                self.tool_calls += 1
        return seq

    def has_pending(self, call_id: str) -> bool:
        """True when ``call_id`` is an unanswered call of the open step."""
        return call_id in self.pending

    def tool_result(self, call_id: str, content: list[JsonObj], *, is_error: bool = False,
                    message_id: object = None, error: JsonObj | None = None,
                    meta: Any = None) -> int:
        """Append the ``tool/result`` answering ``call_id``.

        A result for a call that is not pending (an orphan: its call is on another branch or
        outside an excerpt) is kept as a ``user/message`` with the result text, source
        ``{kind:"plugin", plugin:"import/<fmt>", form:"relay"}``, so the model view keeps it
        without breaking tool pairing.
        """
        call = self.pending.pop(call_id, None)
        if call is None or not self.step_open:
            text = [{"type": "text", "text": f"[tool result for call {call_id}]"}, *content]
            return self.user(text, source={"kind": "plugin", "plugin": f"import/{self.fmt}",
                                           "form": "relay"}, message_id=message_id,
                             prompt=False)
        block: JsonObj = {"type": "tool-result", "toolCallId": call_id, "content": content,
                          "isError": bool(is_error)}
        message = {"id": self.message_id(message_id), "role": "user",
                   "source": {"kind": "tool", "callId": call_id}, "content": [block]}
        data: JsonObj = {"turn": self.turn, "step": call.step, "message": message}
        if error is not None:
            data["error"] = error
        if meta is not None:
            data["meta"] = meta
        return self.emit("tool/result", data, surface_op="append",
                         source_event_seqs=[call.call_seq])

    # -- compaction

    def compaction(self, replacement: list[JsonObj], *, summary: list[JsonObj] | None = None,
                   compaction_id: str | None = None, provider: str | None = None,
                   model: str | None = None, token_count: int = 0,
                   extra: JsonObj | None = None, shadow: list[int] | None = None,
                   message_id: object = None, source: JsonObj | None = None) -> int:
        """Write a compaction: start, summary, a replacing ``user/message``, end.

        Rule: docs/rules.md#surface-ops.

        Returns the seq of the replacing message (of the appended summary when nothing is
        shadowed). ``shadow`` (a run of current surface nodes) narrows what is replaced, as a
        compaction that keeps the recent tail does; ``message_id`` and ``source`` keep the
        replacing message's own (a re-import of a dsh export).

        The replacement shadows every current surface node except a leading ``system/message``
        (docs/rules.md#the-system-head: only a system replace may cover it); its ``sourceEventSeqs``
        list the start and summary events and every shadowed node. A finished turn is closed first
        (the compaction then sits between turns, ``turn: null``); otherwise the open step is closed
        so no call is left pending across the cut. With nothing to shadow (the history it
        summarised is not in the source) no bracket is written: the summary is appended as a
        ``user/message`` (source ``{kind: "plugin", plugin: "import/<fmt>", form: "summary"}``)
        after an ignorable ``import/<fmt>/compaction-without-history`` record.
        """
        if self.turn_finished():
            self.end_turn({"kind": "completed"})  # compacted between turns
        self.close_step()
        cid = compaction_id or f"{self.session_id}:compaction:{self.compactions + 1}"
        shadow = list(self.nodes) if shadow is None else list(shadow)
        if shadow and shadow[0] in self._system_seqs:
            shadow = shadow[1:]
        if not shadow:
            # A bracket must shadow at least one node (compaction rules), so keep the text only.
            self.ignorable("compaction-without-history", {"compactionId": cid})
            return self.user(replacement, prompt=False, source={
                "kind": "plugin", "plugin": f"import/{self.fmt}", "form": "summary"})
        turn = self.turn if self.turn_open else None
        start_seq = self.emit("compaction/start", {"compactionId": cid, "turn": turn})
        summary_data: JsonObj = {
            "compactionId": cid, "summary": summary if summary is not None else replacement,
            "shadowedRange": {"start": shadow[0], "end": shadow[-1]},
            "shadowedSeqs": shadow, "shadowedTokenCount": token_count,
            "provider": provider or self.model[0], "model": model or self.model[1]}
        if extra:
            summary_data.update(extra)
        summary_seq = self.emit("compaction/summary", summary_data)
        message = {"id": self.message_id(message_id), "role": "user", "content": replacement,
                   "source": source or {"kind": "plugin", "plugin": "compact",
                                        "compactionId": cid}}
        op = {"op": "replace", "start": shadow[0], "end": shadow[-1]}
        seq = self.emit("user/message", message, surface_op=op,
                        source_event_seqs=[start_seq, summary_seq, *shadow])
        first = self.nodes.index(shadow[0])
        self.nodes[first:first + len(shadow)] = [seq]
        self.emit("compaction/end", {"compactionId": cid, "turn": turn})
        self.compactions += 1
        return seq

    # -- end of input

    def finish(self) -> bool:
        """Close the last turn unless the transcript stopped mid-turn; return ``interrupted``.

        The last turn is left open (for ``interrupted_turn_closers`` / ``dsh resume``,
        docs/rules.md#repair) when a call is unanswered, when the last model response asked for
        tools other than :data:`TERMINAL_TOOLS`, or when input arrived after the last model
        response; otherwise it ends ``completed``.
        """
        if not self.turn_open:
            return False
        called = self._last_step_calls()
        terminal = bool(called) and all(name in TERMINAL_TOOLS for name in called)
        if self.pending or not self.step_open or not self.step_answered or (
                called and not terminal):
            return True
        self.end_turn({"kind": "completed"})
        return False

    def turn_finished(self) -> bool:
        """True when the open turn's last model response answered without asking for tools."""
        return (self.turn_open and self.step_open and self.step_answered and not self.pending
                and not self._last_step_called())

    def _last_step_called(self) -> bool:
        return bool(self._last_step_calls())

    def _last_step_calls(self) -> list[str]:
        """Tool names the open step's model response called (empty if none or no response)."""
        return self._step_calls

    def header(self, *, cwd: object = None, extra: JsonObj | None = None,
               stamp: bool = True) -> JsonObj:
        """A dsh header for these events: version 0, id, createdAt = first event time.

        Also writes the ``import/source`` event when no event was written yet. A source with no
        timestamps at all (SWE-agent trajectories, OpenAI and Anthropic request bodies) is
        stamped with the file's modification time, not the 1970 epoch (unless ``stamp`` is
        False: a streaming importer that knows a later record has a time).
        """
        if not self._source_written:
            self._write_source()
        if stamp and not self._time_seen:
            try:
                mtime = int(self.path.stat().st_mtime * 1000)
            except OSError:
                mtime = 0
            if self._drained:
                raise RuntimeError("EventBuilder.header: events without a time were drained")
            for event in self.events:
                event["time"] = mtime
                if event["type"] == IMPORT_SOURCE_TYPE:  # dsh ls orders such sessions apart
                    event["data"] = {**event["data"], "timestamps": False}
            self.time = mtime
            self._first_time = mtime if self.events else None
            self._time_seen = True  # later source times may only move the clock forward
        header: JsonObj = {"version": 0, "id": self.session_id, "createdAt": self.first_time()}
        if isinstance(cwd, str) and cwd.startswith("/") and "{{" not in cwd:
            header["cwd"] = cwd
        if extra:
            header.update(extra)
        return header

    def imported(self, header: JsonObj) -> ImportedSession:
        """The :class:`ImportedSession` of these events under ``header`` (no children yet)."""
        return ImportedSession(self.session_id, header, self.events, [], self.fmt,
                               str(self.path.resolve()), self.lines)

    def fail(self, message: str, *, line: int | None = None) -> ImportFormatError:
        """Build an :class:`ImportFormatError` located at this builder's source."""
        return ImportFormatError(message, path=str(self.path), line=line, format=self.fmt)

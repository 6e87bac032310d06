"""Every error dsh raises on purpose, in one tree at the bottom of the import graph.

Each error has a stable ``code`` (upper snake case unless the reference spells it otherwise) and
keeps where it happened in ``where`` (``seq=``, ``seed_index=``, ``path=``, ``line=``,
``byte_offset=``, ``json_path=``), so the CLI can print it and ``--json`` can report it::

    DshError
    ├── InvalidJsonError(ValueError)          json_path, e.g. $.data.content[3].text
    ├── EventRejectedError(ValueError)        rule code, event type, seq or seed_index
    │   └── InvariantError                    code INVARIANT (docs/rules.md#turns-and-steps)
    ├── SessionForkError                      code: SESSION_ALREADY_EXISTS | SESSION_NOT_FOUND |
    │                                         SESSION_NOT_LIVE | INVALID_BOUNDARY | OPEN_TURN
    ├── SessionNotFoundError(LookupError)
    ├── SessionExistsError
    ├── ConfigError(ValueError)               the option or URL part that is wrong
    ├── PersistenceError
    │   ├── SessionBusyError                  holder pid, host, since
    │   │   └── LeaseLostError                a fenced writer's lease was taken over
    │   ├── LogCorruptError                   path, line, byte_offset, seq
    │   │   └── SealDamagedError              the seal beside the log, not the log: path
    │   │                                     (the seal), seq, batch, writer
    │   ├── SessionFormatUnsupportedError     version found, versions read; says "upgrade"
    │   ├── UnknownEventTypeError             type and seq of a required unknown event
    │   └── WriteFailedError                  raised by the next flush(), cause chained
    ├── CompactionError                       code: busy | cancelled | changed | summary |
    │                                         commit | persistence | range | unbalanced |
    │                                         owner | pressure
    ├── AdapterError(ValueError)              code ADAPTER_ITEM | ADAPTER_SESSION_ID | ...
    │   ├── AdapterClosedError(RuntimeError)  code ADAPTER_CLOSED: used after close()
    │   └── AdapterLookupError(LookupError)   code ADAPTER_ENTRY: a stored entry is missing
    ├── ImportFormatError                     source path, line, format
    ├── LlmFailureError                       a model call failed: failure {message, code,
    │                                         status?}, retryable, context_overflow
    ├── AgentError                            the agent loop refused or stopped: code
    │                                         MAX_STEPS | NOT_IDLE | TOOL | APPROVAL | ...
    └── RightsError                           quarantine, redaction, erasure refused: code
                                              NOT_IN_VIEW | NOT_A_MESSAGE | NO_SUCH_SEQ | ...
"""

from __future__ import annotations

import re
from typing import ClassVar, Final, Literal, TypeAlias

Where = int | str | None


class DshError(Exception):
    """Base of every error dsh raises on purpose; catch this one.

    Args:
        message: One sentence: the rule, found vs expected, where, and the fix if any.
        code: Overrides the class's default ``code``.
        **where: Location fields (``seq``, ``seed_index``, ``path``, ``line``, ``byte_offset``,
            ``json_path``, ``session_id``); ``None`` values are dropped.
    """

    default_code: ClassVar[str] = "DSH_ERROR"

    def __init__(self, message: str, *, code: str | None = None, **where: Where) -> None:
        super().__init__(message)
        self.message = message
        self.code: str = code or self.default_code
        self.where: dict[str, int | str] = {k: v for k, v in where.items() if v is not None}

    def to_json(self) -> dict[str, object]:
        """Return ``{"error": class name, "code", "message", **where}`` for ``--json`` output."""
        return {"error": type(self).__name__, "code": self.code, "message": self.message,
                **self.where}


class InvalidJsonError(DshError, ValueError):
    """A value is not lossless JSON; ``where["json_path"]`` names the spot.

    Rule: docs/formats.md#lossless-json.
    """

    default_code = "INVALID_JSON"


class EventRejectedError(DshError, ValueError):
    """An event, seed or header was refused before anything was committed.

    Rules: docs/rules.md#what-append-refuses, docs/rules.md#seed-validation,
    docs/rules.md#the-surface.

    ``code`` names the rule (for example ``SEQ_NOT_CONTIGUOUS``, ``SURFACE``, ``ENVELOPE``,
    ``HEADER``, ``NON_JSON``, ``LEGACY``, ``REENTRANT_APPEND``); ``where`` carries ``seq`` or
    ``seed_index`` and ``event_type``.
    """

    default_code = "EVENT_REJECTED"


class InvariantError(EventRejectedError):
    """The optional session-log invariant companion vetoed an event.

    Rule: docs/rules.md#turns-and-steps.
    """

    default_code = "INVARIANT"


class SessionForkError(DshError):
    """``SessionStore.fork`` refused (docs/rules.md#fork).

    ``code`` is one of ``SESSION_ALREADY_EXISTS``, ``SESSION_NOT_FOUND``, ``SESSION_NOT_LIVE``,
    ``INVALID_BOUNDARY``, ``OPEN_TURN``.
    """

    default_code = "INVALID_BOUNDARY"


class SessionNotFoundError(DshError, LookupError):
    """No session with that id exists in the store or backend."""

    default_code = "SESSION_NOT_FOUND"


class SessionExistsError(DshError):
    """A session with that id already exists (store ``prepare``/``create``, backend ``create``)."""

    default_code = "SESSION_ALREADY_EXISTS"


class ConfigError(DshError, ValueError):
    """An option, URL or setting is wrong; the message names the part and the accepted range."""

    default_code = "CONFIG"


class PersistenceError(DshError):
    """Base of the storage errors (docs/rules.md#persistence)."""

    default_code = "PERSISTENCE"


class SessionBusyError(PersistenceError):
    """Another writer holds the session; ``where`` names the holder (pid, host, since)."""

    default_code = "SESSION_BUSY"

    @property
    def held_here(self) -> bool:
        """True when another handle or session object of this process holds the session.

        Told by ``where["holder"] == "this process"``, never by the message, which quotes the
        owner file's host (anyone's text). No wait frees such a holder: it lets go only when
        closed, so a waiting writer gives up on it at once (docs/errors.md#sessionbusyerror).
        """
        return self.where.get("holder") == "this process"

    def holder_phrase(self) -> str:
        """Name the holder for a message: ``this process (pid 12 on h)`` or ``another process``.

        ``this process`` when :attr:`held_here`, else ``another process``; followed by the
        holder's pid and host from ``where`` when a pid is known (the host already escaped,
        docs/errors.md#sessionbusyerror).
        """
        pid, host = self.where.get("pid"), self.where.get("host")
        text = "this process" if self.held_here else "another process"
        if pid is not None:
            text += f" (pid {pid}" + (f" on {host}" if host else "") + ")"
        return text


HELD_HERE_ADVICE: Final = ("another handle or session object of this process holds it, which "
                           "no wait frees: close it first")
"""What frees a session held by this process (:attr:`SessionBusyError.held_here`), for messages."""


class LeaseLostError(SessionBusyError):
    """A write handle's lease expired and another writer took the session over (PostgreSQL).

    Nothing of the refused batch was written; ``where`` names the new holder (pid, host, since,
    epoch). Open the session again for writing once that holder is gone.
    """

    default_code = "LEASE_LOST"


class LogCorruptError(PersistenceError):
    """A stored log cannot be read as written; ``where`` has path, line, byte_offset, seq."""

    default_code = "LOG_CORRUPT"


def restore_point_mismatch(part: str, why: str, *, session_id: str = "",
                           where: str = "") -> LogCorruptError:
    """The error for a restore point whose packed ``part`` does not hold what it claims.

    Args:
        part: what was inflated: ``"surface"`` or ``"page-in index"``.
        why: what did not match, e.g. ``"its entries do not rise"``.
        session_id: the session whose restore point it is ("" when not known).
        where: where that restore point is kept: a sidecar path, a table row ("" when not
            known).

    Returns:
        A :class:`LogCorruptError` with code ``RESTORE_POINT_MISMATCH``, its ``where`` naming
        ``session_id`` and ``restore_point`` when known. Such a point passed its digest and
        seal checks; the log itself is not judged (docs/errors.md): deleting the restore
        point makes resumes read the whole log.
    """
    whose = f"session {session_id!r}: " if session_id else ""
    kept = f" ({where})" if where else ""
    named: dict[str, str] = {}
    if session_id:
        named["session_id"] = session_id
    if where:
        named["restore_point"] = where
    return LogCorruptError(f"{whose}the {part} of the restore point{kept} does not hold what it "
                           f"claims ({why}); delete that restore point and resumes read the "
                           "whole log", code="RESTORE_POINT_MISMATCH", **named)


class SealDamagedError(LogCorruptError):
    """The integrity seal beside a log is missing or damaged; the log itself is not judged.

    ``where`` has ``path`` (the seal file), and for a chain record ``seq``, ``batch`` and
    ``writer``. Codes ``SEAL_CORRUPT`` (default), ``SEAL_UNREADABLE``, ``SEAL_TRUNCATED``,
    ``SEAL_CHAIN_BROKEN``, ``SEAL_MISSING`` (docs/formats.md#integrity-seals). A subclass of
    :class:`LogCorruptError`: the session cannot be read verified either way.
    """

    default_code = "SEAL_CORRUPT"


class SessionFormatUnsupportedError(PersistenceError):
    """The stored format version is not one this dsh reads: nothing is damaged, upgrade dsh."""

    default_code = "FORMAT_UNSUPPORTED"


class UnknownEventTypeError(PersistenceError):
    """A stored event has a type this reader does not know and is not ``ignorable``."""

    default_code = "UNKNOWN_EVENT_TYPE"


class WriteFailedError(PersistenceError):
    """A background write failed; raised by the next ``flush()`` with the cause chained."""

    default_code = "WRITE_FAILED"


class CompactionError(DshError):
    """A compaction failed or was refused (docs/rules.md#compaction).

    ``code`` is ``busy`` (another compaction holds the lock, or an open turn blocks a manual one),
    ``cancelled``, ``changed`` (the surface moved under the summarizer), ``summary`` (empty or
    not smaller than what it shadows), ``commit``, ``persistence``, ``range`` (a seq not on the
    surface, a reversed span, or a span over a node-0 ``system/message``), ``unbalanced`` (the
    span would separate a tool call from its result), ``owner`` (automatic compaction outside its
    turn) or ``pressure`` (nothing to compact under the configured budget).
    """

    default_code = "commit"


ImportFailureKind: TypeAlias = Literal["unsupported", "sqlite", "binary", "encoding",
                                       "unreadable", "empty", "invalid"]
"""What a file refused by an importer is: :attr:`ImportFormatError.kind`."""


class ImportFormatError(DshError):
    """A transcript could not be imported; ``where`` has path, line and format.

    Rule (docs/interop.md#bad-input): an error located at a line of a file says
    so first, as compilers do: given ``path`` and ``line``, the message starts
    ``path:line: `` (added here unless it already starts with ``path:``), then says what was
    wrong there (``at column N`` when known) and what to do.
    """

    default_code = "IMPORT_FORMAT"

    def __init__(self, message: str, *, code: str | None = None, kind: ImportFailureKind =
                 "invalid", **where: Where) -> None:
        path, line = where.get("path"), where.get("line")
        if path and line is not None and not message.startswith(f"{path}:"):
            message = f"{path}:{line}: {message}"
        super().__init__(message, code=code, **where)
        self.kind: ImportFailureKind = kind
        """What the file is, as the raising site knew it (docs/errors.md#importformaterror):
        ``"unsupported"`` (no transcript format matches), ``"sqlite"`` (a SQLite database),
        ``"binary"`` (a NUL byte), ``"encoding"`` (UTF-16/32, or not UTF-8), ``"unreadable"``
        (cannot be read, or no regular file), ``"empty"`` (no bytes but blanks),
        ``"invalid"`` (a transcript that is damaged
        or that the importer refuses: everything else)."""

    def to_json(self) -> dict[str, object]:
        """:meth:`DshError.to_json` with ``kind`` after ``code``."""
        return {"error": type(self).__name__, "code": self.code, "kind": self.kind,
                "message": self.message, **self.where}


class LlmFailureError(DshError):
    """A model call failed; raised by providers, handled by the agent loop.

    Rule: docs/agent.md#retries-and-context-overflow.

    Args:
        message: What failed, in one sentence (provider, model, HTTP status when known).
        code: Provider or dsh failure code, e.g. ``RATE_LIMITED``, ``CONTEXT_OVERFLOW``.
        retryable: True when the same request may succeed later (rate limit, overload,
            timeout, dropped connection); the loop retries it with backoff.
        context_overflow: True when the request was too large for the model's context window;
            the loop compacts and retries once.
        retry_after_ms: The provider's retry hint in milliseconds, or None.
        status: HTTP status, or None.
        request_id: The provider's request id, or None.

    Attributes:
        failure: The wire form written into ``turn/end {kind: "error", error}`` and
            ``llm/retry`` events: ``{message, code, status?, providerRetryAfterMs?,
            requestId?}``.
    """

    default_code = "LLM_FAILURE"

    def __init__(self, message: str, *, code: str | None = None, retryable: bool = False,
                 context_overflow: bool = False, retry_after_ms: int | None = None,
                 status: int | None = None, request_id: str | None = None) -> None:
        super().__init__(message, code=code, status=status, request_id=request_id)
        self.retryable = retryable
        self.context_overflow = context_overflow
        self.retry_after_ms = retry_after_ms
        self.status = status
        self.request_id = request_id

    @property
    def failure(self) -> dict[str, object]:
        """The failure as the wire ``LlmFailure`` mapping (docs/events.md#messages)."""
        out: dict[str, object] = {"message": self.message, "code": self.code}
        if self.status is not None:
            out["status"] = self.status
        if self.retry_after_ms is not None:
            out["providerRetryAfterMs"] = self.retry_after_ms
        if self.request_id is not None:
            out["requestId"] = self.request_id
        return out


class AgentError(DshError):
    """The agent loop refused a call or could not go on (docs/agent.md#the-agent-loop).

    ``code`` is ``MAX_STEPS`` (the turn reached its step limit), ``NOT_IDLE`` (a second run
    while one is active), ``SESSION_CLOSED`` (the agent was closed), ``TOOL`` (a tool
    definition is invalid: name, schema, duplicate) or ``RECORDER`` (a recording call out of
    order: a step outside a turn, a result without its call, a second assistant message).
    """

    default_code = "AGENT"


class AdapterError(DshError, ValueError):
    """A framework adapter refused its input or a call (``dsh.adapters``).

    ``code`` is ``ADAPTER_ITEM`` (a framework item or message it cannot map: not an object,
    no role or type, not JSON), ``ADAPTER_SESSION_ID`` (an empty or non-string id) or
    ``ADAPTER_CLOSED`` (the adapter object was closed). ``where`` names the session and the
    index of the item in the call.
    """

    default_code = "ADAPTER"


class AdapterClosedError(AdapterError, RuntimeError):
    """An adapter object was used after its ``close()`` (code ``ADAPTER_CLOSED``).

    Also a ``RuntimeError``, as the frameworks' own stores raise for a closed session (the
    Agents SDK's ``SQLiteSession``), so existing handlers keep working.
    """

    default_code = "ADAPTER_CLOSED"


class AdapterLookupError(AdapterError, LookupError):
    """An adapter was asked for a stored item it does not have (code ``ADAPTER_ENTRY``).

    Also a ``LookupError``, which is what a framework's store contract promises for a missing
    entry (Pydantic AI's ``ConversationStore.read_entry``).
    """

    default_code = "ADAPTER_ENTRY"


class RightsError(DshError):
    """Quarantine, redaction or erasure refused (``dsh.rights``, docs/forgetting.md).

    ``code`` is ``NO_SUCH_SEQ`` (a seq the log does not hold), ``NOT_A_MESSAGE`` (the event is
    not a message the model can see), ``NOT_IN_VIEW`` (the message is not on the model view:
    a compaction or another replace shadows it), ``NOT_QUARANTINED`` (an unquarantine of a
    message that is not quarantined), ``OPEN_TURN`` (another writer left a turn open between
    the repair and this operation), ``NOTHING_SELECTED`` or ``PURGED`` (a restore of a
    purged session); ``where`` names the session and the seq.
    """

    default_code = "RIGHTS"


# -- text safety --------------------------------------------------------------------------------

# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional overrides and
# isolates ("Trojan Source"): a log holds text from models, tools and imported transcripts,
# and none of it may move a terminal's cursor, retitle its window or reorder what a person reads.
_UNPRINTABLE: Final = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """Return ``text`` with control characters and bidi overrides shown as escapes (``\\x1b``).

    Tab and newline are kept; every other C0 control, DEL, the C1 controls and the Unicode
    bidirectional embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069) and lone
    surrogates (U+D800-U+DFFF, which a log may hold and no output encoding can write) are
    replaced by their ``\\xNN`` / ``\\uNNNN`` spelling, so session text can never drive the
    terminal it is printed on nor reorder the text around it, and columns measured on the
    escaped text stay aligned. Markup is not touched: an HTML
    renderer escapes it too.
    """
    return _UNPRINTABLE.sub(_escape_char, text) if _UNPRINTABLE.search(text) else text


def has_unprintable(text: str) -> bool:
    """Whether :func:`printable` would change ``text``."""
    return _UNPRINTABLE.search(text) is not None

"""Types of the optional C accelerator ``dsh._speedups`` (built from ``_speedups.c``).

Every function is a faster twin of a pure-Python reference and gives the same result; where
it meets input the reference must judge it raises :class:`Fallback` or stops early, and the
caller's Python path runs (docs/architecture.md#the-c-accelerator). ``dsh.json`` loads the
module (unless ``DSH_NO_SPEEDUPS`` is set) and hands the functions out, ``None`` when absent.
"""

from array import array
from collections.abc import Callable, Container, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Final

API_VERSION: Final[int]
"""The argument conventions this build implements (``dsh.json`` refuses another)."""

SOURCE_SHA256: Final[str]
"""The SHA-256 (hex) of the ``_speedups.c`` this module was built from ("" when not built by
setup.py); ``dsh.json`` compares it with the source beside the module, when there is one."""

SHA_NI: Final[int]
"""1 when ``chain_leaves`` hashes with the x86 SHA extensions, 0 when it calls hashlib."""

CLMUL: Final[int]
"""1 when ``read_rows``' seal check computes crc32 by carry-less multiplication, 0: zlib's."""

class Fallback(Exception):
    """The value is left to the caller's Python reference, which decides and names problems."""

def configure(frozen_dict_type: type[dict[str, Any]], frozen_list_type: type[list[Any]],
              max_safe_int: int, /) -> None:
    """Bind the frozen container types and the safe-integer bound; called once by dsh.json."""

def freeze_parsed(obj: object, /) -> Any:
    """Freeze what ``orjson.loads`` returned (reference: ``dsh.json`` ``_freeze_parsed``)."""

def snapshot(obj: object, /) -> Any:
    """The fast path of ``dsh.json.snapshot_json`` (reference: its ``_fast`` walk)."""

def snapshot_events(seed: Sequence[Any], start: int, event_type: type[Any], out: list[Any],
                    owned: bool = ..., /) -> int:
    """Freeze ``seed[start:]`` as ``event_type`` into ``out``; the index Python must judge.

    ``owned``: containers only the seed references are frozen in place, not copied.
    Reference: ``dsh.session._session._frozen_prefix``.
    """

def untrack(obj: object, /) -> bool:
    """Take a validated frozen container out of the cyclic GC; whether it now is out."""

def scan_lines(buf: bytes | bytearray, pos: int, expected: int, line: int,
               loads: Callable[[Any], Any], event_type: type[Any], events: list[Any],
               first_seqs: array[int], first_lines: array[int], known_types: AbstractSet[str],
               prescan: list[int] | None, /) -> tuple[int, int, int]:
    """Ordinary JSONL lines from ``pos``: ``(pos, line, expected)`` where it stopped."""

def admit_plain(seed: Sequence[Any], start: int, base: int, event_type: type[Any],
                surface_types: AbstractSet[str], nodes: list[int], cache: dict[int, Any],
                stop_types: AbstractSet[str] = ..., /) -> int:
    """Admit plain seed events from ``start``; the index of the first one Python must admit.

    An event whose type is in ``stop_types`` (the turn-shaped types) goes to Python unless its
    data has the common shape the core shape check accepts.
    """

def decode_rows(rows: list[Any], i: int, expected: int, loads: Callable[[Any], Any],
                event_type: type[Any], events: list[Any], varints: bool, packed_limit: int,
                min_members: int, max_members: int, known_types: AbstractSet[str] = ...,
                prescan: list[int] | None = ..., /) -> tuple[int, int]:
    """Ordinary SQLite rows from ``i``: ``(i, expected)``; ``prescan`` as in scan_lines."""

def message_shape_ok(event: Mapping[str, Any], /) -> bool:
    """True when the Python message-shape check would accept ``event`` (False: let it run)."""

def stored_prescan(events: Sequence[Any], known_types: AbstractSet[str], /) -> tuple[int, int]:
    """``(legacy_at, unknown_at)``; reference: ``dsh.persistence._legacy.python_stored_prescan``."""

def rows_text(rows: list[Any], start: int = ..., stop: int = ..., skip: int = ..., /) -> bytes:
    """The text a seal checksums over ``rows[start:stop]``, each row's columns from ``skip``.

    Reference: ``_seal.rows_text`` of those rows without their first ``skip`` columns.
    """

def encode_rows(events: Sequence[Any], schema_version: int, dumps: Callable[[Any], bytes],
                encode_large: Callable[[bytes], Any], threshold: int, /) -> list[Any]:
    """SQLite rows of scalar events; reference: ``dsh.persistence.sqlite._schema`` encode loop."""

def encode_sealed_rows(events: Sequence[Any], schema_version: int, dumps: Callable[[Any], bytes],
                       encode_large: Callable[[bytes], Any], threshold: int, batch_key: bytes,
                       sha256: Callable[[bytes], Any], /) -> tuple[list[Any], bytes]:
    """``encode_rows``'s rows and ``chain_digest`` of the batch under ``batch_key``, one pass.

    References: ``dsh.persistence.sqlite._schema.encode_batch`` and
    ``dsh.persistence._chain.event_leaves``.
    """

def seqs_contiguous(events: Sequence[Any], base: int, event_type: type[Any] = ..., /) -> bool:
    """True when every event's ``seq`` is ``base`` + its index (False: the Python loop names it).

    With ``event_type``, also each event exactly of that type with frozen ``data``.
    """

def gather_messages(nodes: list[int] | array[int], start: int, cache: Mapping[int, Any],
                    out: list[Any], /) -> int:
    """Append cached messages of ``nodes[start:]``; the index of the first uncached node."""

def seqs_below(seqs: array[int], bound: int, /) -> bool:
    """True when every seq of the int64 array lies in ``0 .. bound - 1``."""

def running_sums_below(seqs: array[int], bound: int, /) -> bool:
    """Differences to running sums in place; True when every sum lies in ``0 .. bound - 1``."""

def widen_sums_below(seqs: array[int], differences: bytes, bound: int, /) -> bool:
    """Fill ``seqs`` with the running sums of one-byte ``differences``; all below ``bound``?"""

def canonical(value: Any, dumps: Callable[[Any], bytes], /) -> bytes:
    """``dsh.json.dumps_canonical(value)`` of a frozen container (``dumps``: ``orjson.dumps``)."""

def chain_leaves(events: Sequence[Mapping[str, Any]], batch_key: bytes,
                 sha256: Callable[[bytes], Any], dumps: Callable[[Any], bytes], /
                 ) -> list[bytes]:
    """A batch's seal chain leaves under ``batch_key`` (reference: ``_chain.event_leaves``)."""

def chain_digest(events: Sequence[Mapping[str, Any]], start: int, stop: int, batch_key: bytes,
                 sha256: Callable[[bytes], Any], dumps: Callable[[Any], bytes], /) -> bytes:
    """The digest of ``events[start:stop]``'s chain leaves under ``batch_key``, in one pass.

    Reference: ``_chain.batch_digest(_chain.event_leaves(...))`` of the slice.
    """

def plain_numbers(value: object, /) -> bool:
    """The number check of ``dsh.json.loads_plain`` in place (reference: ``_plain_numbers``)."""

def line_scan(data: bytes, /) -> tuple[bool, int]:
    """``(has_long_number(data), data.count(b"[") + data.count(b"{"))`` in one pass."""

def record_texts(text: str, path: tuple[str, ...], fmt: str, need: str | None = ...,
                 /) -> tuple[bytes, ...] | None:
    """The JSON texts of the records at ``path`` of a stored event's data, or None.

    Reference: ``dsh.adapters._records.python_record_texts`` (equal values when not None).
    """

def pick_rows(rows: list[Any], start: int, stop: int, seqs: Container[int],
              types: Container[str], paths: dict[str, tuple[tuple[str, ...], str | None]],
              fmt: str, into: dict[int, tuple[bytes, ...]], /) -> list[Any]:
    """A selective read's pass over checked SQLite rows: the rows left to decode, in order.

    Puts ``into[seq]`` the records ``record_texts`` cuts from each plain row it serves.
    Reference: the pass of ``SqlitePrefixSource.read_selected`` without the accelerator.
    """

def claude_line(record: object, rec: int, line: int, offset: int,
                /) -> tuple[int, tuple[Any, ...], list[tuple[int, str | bytes, int]]] | None:
    """What the first read of a Claude Code import keeps of a record: ``(bits, row, tools)``.

    ``rec``: its record number (blank lines not counted), the key of the row and tools;
    ``line``: its file line (kept in the row, and in a response key ``line-N``).

    References: ``dsh.interop._claude_code._Scan.add`` and ``BranchIndex.add`` (bits 1: a main
    user/assistant line, 2: an inline sidechain candidate, 4: an ``agent_progress`` line; row and
    tools as ``BranchIndex`` stores them). None for a record that is not a dict with a str type,
    or a ``summary`` line: the Python path takes those.
    """

def utc_millis(text: object, /) -> int | None:
    """``dsh.interop._common._utc_millis(text)`` for an ASCII ``YYYY-MM-DDTHH:MM:SS.mmmZ``.

    None for other text (and times a double cannot carry exactly): the Python function answers.
    """

def claude_envelope(record: dict[str, Any], /) -> dict[str, Any]:
    """A Claude Code line without ``message.content`` (reference: ``_claude_code._envelope``)."""

def claude_blocks(content: object, encode: Callable[[Any], str],
                  /) -> list[dict[str, Any]] | None:
    """``dsh.interop._anthropic.anthropic_blocks(content)`` for a list of blocks.

    ``encode`` renders a ``tool_use`` input as the reference does. None when ``content`` is not
    a list, or holds a dict subclass, a dict with a key that is not an exact str, or a block
    whose ``type`` is not of an exact JSON type (a str subclass, say): the Python function
    answers.
    """

def claude_usage(raw: object, /) -> dict[str, int] | None:
    """``dsh.interop._anthropic.anthropic_usage(raw)`` when ``raw`` is a dict of plain counts.

    Each of the four counts absent, null or an int in [0, 2**53 - 1]; None otherwise (the
    Python function answers).
    """

def claude_map(state: dict[str, Any], record: Any, line: int, rec: int, flags: int,
               repairs: dict[str, Any], title_line: int, call: Callable[..., Any],
               encode: Callable[[Any], str],
               parts: Callable[[int, Any], list[Any]], /) -> bool:
    """Map one Claude Code line of the second read to its events, as ``_claude_code._map``.

    ``state``: the ``EventBuilder``'s ``__dict__`` (read and written); ``line``: the file line
    each event is noted with; ``rec``: the record number; ``flags``: its ``BranchIndex`` flags;
    ``title_line``: the title's line (0: none); ``call``: the pending-call class; ``encode``:
    the ``tool_use`` input encoder; ``parts(rec, record)``: the records of the API response
    the line opens. True when mapped; False, nothing written, for a line the reference maps.
    """

def decode_plain(data: bytes, max_depth: int, /) -> Any:
    """``dsh.interop._common.decode_line(data, …)`` for the common line, else None.

    None: a possible long number, more than ``max_depth`` brackets, JSON orjson refuses, numbers
    ``plain_numbers`` leaves to the exact path (or the line ``null``): the Python function decodes.
    """

def sqlite_bind(library: str | None, /) -> bool:
    """Resolve the SQLite C functions ``read_rows`` calls from ``library`` (already loaded)."""

def sqlite_open(uri: str, /) -> object:
    """A read-only SQLite connection of its own (a capsule) for ``read_rows``."""

def read_rows(conn: object, sql: str, session_id: str, lo: int, hi: int,
              records: list[tuple[int, int, int]], start: int, stop: int, seqs: Container[int],
              types: Container[str], paths: dict[str, tuple[tuple[str, ...], str | None]],
              fmt: str, /) -> tuple[int, list[Any] | None, dict[int, tuple[bytes, ...]] | None]:
    """``_verified_rows`` then ``pick_rows`` through SQLite's C API: ``(checked, rows, picked)``.

    Reference: ``SqlitePrefixSource.read_selected``'s Python read (``_verified_rows``).
    """

def crc32(data: bytes | bytearray | memoryview, value: int = ..., /) -> int:
    """``zlib.crc32(data, value)`` as ``read_rows``' seal check computes it (see :data:`CLMUL`)."""

def seal_batch(rows: list[tuple[Any, ...]], start: int, end: int, page_events: int,
               hashed: bytes | None, keys: bytes | None, /
               ) -> tuple[list[tuple[int, int, int]], bytes]:
    """One SQLite batch's seal records (``row_records``) and the bytes that append them.

    The bytes are those ``append_batch_to`` writes for the records and the chain record
    ``hashed + keys`` (none when ``hashed`` is None). Raises :class:`Fallback` for anything
    the Python path treats otherwise.
    """

def fold_plain(events: list[Any], count: int, surface_types: AbstractSet[str],
               stop_types: AbstractSet[str], /
               ) -> tuple[int, int, Any, str | None, int | None, bool, int | None, list[int]]:
    """``RestoreFold.feed`` over ``events`` up to the first event it leaves to Python.

    Returns ``(index, count, last_time, last_type, boundary, turn_open, last_turn, appended)``.
    """

def chain_hash(hashed: bytes, sha256: Callable[[bytes], Any], /) -> bytes:
    """SHA-256 of the seal chain's domain and ``hashed``.

    By SHA-NI when :data:`SHA_NI`, else through ``sha256`` (hashlib's constructor).
    """

def append_event(event_type: type[Any], type: str, seq: int, time: int, data: Any,
                 sources: Any, op: Any, ignorable: bool, core: bool, /) -> Any:
    """The event ``Session.append`` commits, or None where its Python check must judge.

    ``{type, seq, time, data[, sourceEventSeqs][, surfaceOp][, ignorable: true]}`` as an
    ``event_type``; with ``core`` (a core-shaped type) only when the message or turn shape is
    one the check accepts. Reference: the Python build in ``Session.append``.
    """

"""dsh as LangGraph's checkpointer: :class:`DshSaver` (sync and async ``BaseCheckpointSaver``).

Each LangGraph thread is a dsh session (``dsh show THREAD_ID``); what a graph saves is appended
to it as events:

* ``put`` appends one ignorable ``langgraph/checkpoint`` event: the checkpoint's id, parent,
  namespace, timestamp, channel versions, versions seen, metadata, and only the channel values
  whose version changed (``new_versions``). A list value that extends the list stored for the
  channel before it (``add_messages`` state) is stored as the items it adds
  (``{"d": base version, "k": kept count, "a": [added items]}``), so a thread's storage grows
  with its messages, not with the whole state at every super-step; a list is stored whole
  again at least every :data:`WHOLE_EVERY` checkpoints, and every :data:`WHOLE_COPY_EVERY`
  deltas a delta carries a copy of the whole list too, so building one checkpoint reads at most
  that many deltas;
* the thread's index (where each checkpoint, value and write is in the log) is kept beside the
  log as an aside of its session and checked against the log by a reader, which then folds
  only the events after it (docs/adapters.md#fast-reads-of-a-thread);
* ``put_writes`` appends one ignorable ``langgraph/writes`` event (task id, task path, the
  writes); a write LangGraph sends again (same task and index) is not stored twice;
* the root namespace's ``messages`` channel is projected onto the surface as core events
  (``user/message``, ``assistant/message`` with ``tool/call``, ``tool/result``, each keeping the
  LangChain message verbatim as :mod:`dsh.adapters.langchain` does), so ``dsh show``,
  ``dsh messages`` and exports show the conversation; messages leaving the state (a
  ``RemoveMessage``, ``delete_thread``) leave the model view by a surface removal
  (:func:`dsh.adapters._log.remove_from_surface`);
* a run or ``update_state`` from an earlier checkpoint (a LangGraph fork) starts a branch whose
  messages go onto a dsh fork ``<thread>~<n>`` of the thread's session (or of the branch it
  forks), while checkpoints and writes stay on the thread's session
  (docs/adapters.md#time-travel-and-forks);
* ``delete_thread``, ``delete_for_runs`` and ``prune`` append ignorable ``langgraph/drop``
  events: the dropped checkpoints no longer load or list, and the log keeps every byte;
  ``copy_thread`` is a dsh fork of the thread's session (``dsh show`` names its parent).

Values go through the saver's ``serde`` (LangGraph's ``JsonPlusSerializer`` by default) except
plain JSON (strings, integers, booleans, None, and lists and string-keyed dicts of them), which
is stored as JSON; the serde's bytes are stored as Latin-1 text, or past 4 KiB as a Zstandard
frame (docs/formats.md#langgraph-checkpoint-events).

Durable inside a run: LangGraph hands a checkpointer the model's answer only after the model
node ends, on a background thread, and may run the tool node before that write lands. For an
agent built with LangChain's ``create_agent``, add ``middleware=[saver.middleware()]``: the
prompt is durable before the model is called, the answer and every tool call before any tool
body runs, and a call whose body may have run when the process died is answered with dsh's
outcome-unknown result instead of being run again. A hand-built graph passes
``wrap_tool_call=saver.wrap_tool_call`` to its ``ToolNode`` for the same guarantee on tools.

Needs ``pip install 'dsh-session[langgraph]'``.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import gc
import logging
import random
import threading
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, TypeVar

import zstandard

from dsh._errors import AdapterError, DshError, LogCorruptError
from dsh._install import install_hint

try:
    from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, messages_from_dict
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        PendingWrite,
        empty_checkpoint,
        get_checkpoint_id,
        get_serializable_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.config import get_config
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    # before dsh.adapters.langchain (imported below) can name its own extra: the langgraph
    # extra brings langchain-core too
    raise ImportError("dsh.adapters.langgraph needs LangGraph: "
                      f"{install_hint('langgraph')}") from exc
from dsh.adapters._langgraph_index import CHECKPOINT_EVENT as _CHECKPOINT_EVENT
from dsh.adapters._langgraph_index import DROP_EVENT as _DROP_EVENT
from dsh.adapters._langgraph_index import (
    INDEX_ASIDE,
    CheckpointEntry,
    IndexMisledError,
    Namespace,
    ThreadIndex,
    Writes,
    decode_index,
    encode_index,
    event_at,
    has_copy,
    writes_of,
)
from dsh.adapters._langgraph_index import WRITES_EVENT as _WRITES_EVENT
from dsh.adapters._log import (
    DEFAULT_WAIT_S,
    LiveLog,
    default_store_url,
    open_store,
    read_stored,
    records_of,
    remove_from_surface,
    surface_nodes,
    text_of,
)
from dsh.adapters.langchain import FORMAT as LANGCHAIN_FORMAT
from dsh.adapters.langchain import message_record, messages_to_events
from dsh.json import MAX_SAFE_INTEGER, FrozenDict, FrozenList, thaw
from dsh.persistence import Persistence
from dsh.session import Event, closer_text

__all__ = ["CHECKPOINT_EVENT", "DROP_EVENT", "FORMAT", "WRITES_EVENT", "DshSaver"]

FORMAT: Final = "langgraph"
"""The namespace of the saver's events."""
CHECKPOINT_EVENT: Final = _CHECKPOINT_EVENT
"""One ``put``: a checkpoint and the channel values that changed."""
WRITES_EVENT: Final = _WRITES_EVENT
"""One ``put_writes``: a task's pending writes against a checkpoint."""
DROP_EVENT: Final = _DROP_EVENT
"""Checkpoints that no longer load: ``{"all": true}`` (delete_thread) or ``{"ns", "ids"}``."""
WHOLE_EVERY: Final = 64
"""A list channel is stored whole at least every this many checkpoints (else as a delta), so
building a checkpoint reads at most this many of the thread's events for it."""
WHOLE_COPY_EVERY: Final = 16
"""Every this many deltas of a chain, the delta carries the whole list as well (compressed):
``get_tuple`` stops there; ``list`` reads on through the delta to the whole value, which
serves every checkpoint it lists above it (docs/formats.md#langgraph-checkpoint-events)."""
COMPRESS_FROM_BYTES: Final = 4096
"""A value the serde encodes to more bytes than this is stored as a Zstandard frame (base64);
a shorter one as Latin-1 text (docs/formats.md#langgraph-checkpoint-events)."""
INDEX_EVERY: Final = 256
"""The writer keeps the thread's index beside the log again once this many events are newer
than the index there (and at close), so a cold read folds at most about this many."""

_logger = logging.getLogger(__name__)
_T = TypeVar("_T")

_MESSAGES: Final = "messages"
_ONE_SHOT_MAX_BYTES: Final = 64 * 1024 * 1024
"""A compressed value declaring at most this size is inflated into one buffer of that size."""
_TOP_LEVEL: Final = frozenset({"v", "id", "ts", "channel_values", "channel_versions",
                               "versions_seen"})


# -- values -------------------------------------------------------------------------------------

def _plain(value: Any, depth: int = 0) -> bool:
    """True when ``value`` is JSON that reads back as the same Python value and types."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return bool(-MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER)
    if depth > 64:
        return False
    if kind is list:
        return all(_plain(item, depth + 1) for item in value)
    if kind is dict:
        return all(type(key) is str and _plain(item, depth + 1)
                   for key, item in value.items())
    return False


class _Codec:
    """Values to JSON-storable form and back, through the saver's serde.

    A stored value is ``{"j": json}`` (plain JSON), or the serde's ``(type, bytes)``: bytes of
    at most :data:`COMPRESS_FROM_BYTES` as ``{"t": type, "l": text}``, the text holding one
    character per byte (code points 0-255, the bytes' Latin-1 decoding), longer ones as
    ``{"t": type, "z": base64}`` of one Zstandard frame of them (with its content checksum).
    The earlier form ``{"t": type, "b": base64}`` (still read) made the store read, inflate
    and check as JSON a third more text than the value's bytes, then the saver decode it all
    from base64; a whole ``messages`` list of 720 KB is now 19 KB of text in its event, the
    frame inflated straight into the bytes the serde reads
    (docs/formats.md#langgraph-checkpoint-events).
    """

    def __init__(self, serde: SerializerProtocol) -> None:
        self.serde = serde
        # one per saver: its calls hold the saver's lock (the objects are not thread-safe)
        self._packer = zstandard.ZstdCompressor(level=3, write_checksum=True)
        self._unpacker = zstandard.ZstdDecompressor()

    def encode(self, value: Any) -> dict[str, Any]:
        if _plain(value):
            return {"j": value}
        kind, blob = self.serde.dumps_typed(value)
        if len(blob) > COMPRESS_FROM_BYTES:
            return {"t": kind, "z": base64.b64encode(self._packer.compress(blob)).decode()}
        return {"t": kind, "l": blob.decode("latin-1")}

    def decode(self, stored: Mapping[str, Any]) -> Any:
        """The value ``stored`` holds.

        Raises:
            LogCorruptError: a compressed value that is not one whole Zstandard frame whose
                checksum matches (the log was changed outside dsh).
        """
        if "j" in stored:
            value = stored["j"]
            return thaw(value) if isinstance(value, FrozenDict | FrozenList) else value
        text = stored.get("l")
        if text is not None:
            return self.serde.loads_typed((stored["t"], text.encode("latin-1")))
        packed = stored.get("z")
        if packed is not None:
            return self.serde.loads_typed((stored["t"], self._unpack(packed)))
        return self.serde.loads_typed((stored["t"], base64.b64decode(stored["b"])))

    def _unpack(self, packed: str) -> bytes:
        frame = base64.b64decode(packed)
        try:
            if 0 <= zstandard.frame_content_size(frame) <= _ONE_SHOT_MAX_BYTES:
                # one allocation of the declared size; zstd checks that size, the checksum
                # and that nothing follows the frame
                blob: bytes = self._unpacker.decompress(frame, allow_extra_data=False)
                return blob
            # a size not declared, or larger: streamed, the declared size not trusted
            unpacker = self._unpacker.decompressobj()
            blob = unpacker.decompress(frame)
        except zstandard.ZstdError as exc:
            raise LogCorruptError(f"a LangGraph value stored compressed does not decode "
                                  f"({exc}); the log was changed outside dsh") from exc
        if not unpacker.eof or unpacker.unused_data:
            raise LogCorruptError("a LangGraph value stored compressed is not one whole "
                                  "Zstandard frame; the log was changed outside dsh")
        return blob


def _pending_tool_messages(pending: Sequence[PendingWrite]) -> Iterator[ToolMessage]:
    """The ToolMessages of the pending ``messages`` writes, in order."""
    for _, channel, value in pending:
        if channel == _MESSAGES:
            for message in value if isinstance(value, list) else [value]:
                if isinstance(message, ToolMessage):
                    yield message


def _written_results(pending: Sequence[PendingWrite]) -> dict[str, ToolMessage]:
    """Each tool call id the pending ``messages`` writes answer, with that ToolMessage."""
    results: dict[str, ToolMessage] = {}
    for message in _pending_tool_messages(pending):
        results.setdefault(message.tool_call_id, message)
    return results


def _align_written(messages: Sequence[Any], pending: Sequence[PendingWrite]) -> None:
    """Give each pending ToolMessage the id of the one in ``messages`` answering its call.

    LangGraph's ``add_messages`` replaces a message whose id it already holds, in place: a
    resumed run that applies the pending writes then keeps one answer per call, and a run
    given new input (which discards them) keeps the one ``messages`` holds.
    """
    ids = {m.tool_call_id: m.id for m in messages if isinstance(m, ToolMessage) and m.id}
    for message in _pending_tool_messages(pending):
        if message.tool_call_id in ids:
            message.id = ids[message.tool_call_id]


def _answers_of_calls(messages: Sequence[Any]) -> tuple[list[Any], list[bool]]:
    """``messages`` less each second answer to one call, and whether each call is answered.

    A ToolMessage answers the latest call before it with its ``tool_call_id``: a provider may
    give a later turn's call an earlier one's id (docs/adapters.md#langgraph-and-langchain-agents),
    whose answer does not answer the later call, nor is the later call's answer a second one
    (nor the answer to a second call with one id in one AIMessage). The flags follow the
    AIMessages' calls in order (as :func:`_answers_after_calls` asks).
    """
    answered: list[bool] = []
    latest: dict[Any, list[int]] = {}  # id -> the calls of the latest AIMessage naming it
    loose: set[str] = set()  # answers to no call before them
    once: list[Any] = []
    for message in messages:
        if isinstance(message, ToolMessage):
            calls = latest.get(message.tool_call_id)
            if calls is None:
                if message.tool_call_id in loose:
                    continue
                loose.add(message.tool_call_id)
            else:
                at = next((i for i in calls if not answered[i]), None)
                if at is None:
                    continue  # every call with its id is answered: a second answer
                answered[at] = True
        elif isinstance(message, AIMessage):
            named: dict[Any, list[int]] = {}
            for call in message.tool_calls:
                named.setdefault(call.get("id"), []).append(len(answered))
                answered.append(False)
            latest.update(named)
        once.append(message)
    return once, answered


def _answers_after_calls(messages: Sequence[Any],
                         answer: Callable[[Mapping[str, Any]], ToolMessage | None]
                         ) -> list[Any]:
    """``messages`` with each AIMessage call's ``answer(call)`` added where not None.

    Each answer goes right after that message's own ToolMessages, as a model request orders
    a call's results.
    """
    out: list[Any] = []
    pending: list[ToolMessage] = []
    for message in messages:
        if pending and not isinstance(message, ToolMessage):
            out.extend(pending)
            pending = []
        out.append(message)
        if isinstance(message, AIMessage):
            pending.extend(found for found in map(answer, message.tool_calls)
                           if found is not None)
    out.extend(pending)
    return out


def _extends(value: list[Any], base: list[Any]) -> bool:
    if len(value) < len(base):
        return False
    return all(new is old or new == old for new, old in zip(value, base, strict=False))


# -- the index of one thread ----------------------------------------------------------------------

@dataclass(slots=True)
class _Stored:
    """A read of a stored thread (see :func:`dsh.adapters._log.read_stored`)."""

    events: Sequence[Event]
    stored: int
    closers: tuple[Event, ...]
    nodes: Sequence[int]


class _Thread:
    """What the saver knows of one thread: its index, and for its writer the latest values."""

    def __init__(self, thread_id: str, index: ThreadIndex | None = None) -> None:
        self.thread_id = thread_id
        self.index = index if index is not None else ThreadIndex()
        self.latest: dict[tuple[str, str], tuple[Any, Any]] = {}  # (ns, ch) -> (version, value)
        self.depth: dict[tuple[str, str], int] = {}  # (ns, ch) -> deltas since a whole value
        self.cold: _Stored | None = None  # the last read of a thread this saver does not write
        self.start = self.kept = self.index.seen  # events the index beside the log covers

    @property
    def namespaces(self) -> dict[str, Namespace]:
        return self.index.namespaces

    @property
    def projected(self) -> dict[str, int]:
        return self.index.projected

    @property
    def answered(self) -> dict[str, int]:
        return self.index.answered

    def fold(self, events: Sequence[Event]) -> None:
        """Take in the events appended since the last fold."""
        dropped_all = self.index.namespaces and any(
            event["type"] == DROP_EVENT and event["data"].get("all")
            for event in events[self.index.seen:])
        self.index.fold(events)
        if dropped_all:
            self.latest.clear()
            self.depth.clear()


# -- the saver -------------------------------------------------------------------------------------

def _configurable(config: RunnableConfig) -> Mapping[str, Any]:
    conf = config.get("configurable") or {}
    if not isinstance(conf.get("thread_id"), str | int) or conf.get("thread_id") == "":
        raise AdapterError("a LangGraph config needs configurable.thread_id (the dsh session "
                           f"id); got {dict(conf)!r}", code="ADAPTER_SESSION_ID")
    return conf


class DshSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer whose threads are dsh sessions (see the module docstring).

    Args:
        store: Store URL (``sqlite:///path.db``, ``jsonl:///dir``, ``postgresql://…``,
            ``memory:``); default ``sqlite:///$DSH_HOME/sessions.db``, the store the ``dsh``
            command reads.
        serde: LangGraph serializer for values that are not plain JSON (default: LangGraph's).
        wait: Seconds to wait for a thread another process is writing before giving up with
            :class:`~dsh.SessionBusyError` naming that process (default 5, as the CLI).
        erase_on_delete: After ``delete_thread`` (and ``prune(strategy="delete")``) hides the
            thread, hand it to :func:`dsh.rights.erase`: its bytes leave the store too, and so
            do the copies its forks (``copy_thread``) hold; recorded in the store log
            (docs/adapters.md#langgraph-and-langchain-agents, docs/forgetting.md#erasure).

    A thread this saver writes is held for writing (exclusively, across processes) until
    :meth:`close`; reading a thread it does not write takes no lock. Usable as ``with`` and
    ``async with`` (closes on exit), as :meth:`from_url` returns it.

    Raises:
        AdapterError: ``ADAPTER_SESSION_ID`` for a config without a thread id.
        SessionBusyError: a thread to write is held by another process past ``wait``.
    """

    def __init__(self, store: str | None = None, *, serde: SerializerProtocol | None = None,
                 wait: float = DEFAULT_WAIT_S, erase_on_delete: bool = False) -> None:
        super().__init__(serde=serde)
        self.erase_on_delete = erase_on_delete
        self.store_url = store if store is not None else default_store_url()
        self.wait = wait
        self._persistence: Persistence = open_store(self.store_url)
        self._codec = _Codec(self.serde)
        self._logs: dict[str, LiveLog] = {}
        # messages written against a checkpoint LangGraph has not put yet (it saves on a
        # background thread): projected onto that checkpoint's branch once it is put
        self._deferred: dict[tuple[str, str], list[Any]] = {}
        self._threads: dict[str, _Thread] = {}
        self._asides_trusted = True  # until an index beside a log named a wrong event
        self._lock = threading.RLock()
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> DshSaver:
        """A saver on the store at ``url``; use it as ``with DshSaver.from_url(url) as saver``."""
        return cls(url, **options)

    # -- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush and release every thread this saver writes, then close the store."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._deferred.clear()
            logs, self._logs = list(self._logs.items()), {}
            try:
                for thread_id, log in logs:
                    thread = self._threads.get(thread_id)
                    if thread is not None and not log.closed:
                        log.flush()
                        thread.fold(log.session.events)
                        if thread.index.seen > thread.kept:
                            self._keep_index(thread, log.session.events)
                    log.close()
            finally:
                self._persistence.close()

    def __enter__(self) -> DshSaver:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    async def __aenter__(self) -> DshSaver:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await asyncio.to_thread(self.close)

    # -- threads ---------------------------------------------------------------------------------

    def _writer(self, thread_id: str) -> LiveLog:
        log = self._logs.get(thread_id)
        if log is None:
            log = LiveLog(thread_id, self.store_url, FORMAT, type(self).__name__,
                          persistence=self._persistence, wait=self.wait)
            log.open()
            self._logs[thread_id] = log
            cold = self._threads.pop(thread_id, None)
            events = log.session.events
            if cold is not None and cold.cold is not None and not cold.cold.closers \
                    and not cold.index.partial \
                    and cold.index.seen == cold.cold.stored <= len(events):
                # the resumed log is the one read (appends only): keep its index
                self._threads[thread_id] = _Thread(thread_id, cold.index)
        return log

    def _thread(self, thread_id: str, *, write: bool = False,
                want: tuple[str, str | None] | None = None,
                head: bool = False) -> _Thread | None:
        """The thread's index, folded up to its last event; None when nothing is stored.

        A thread first met here starts from the index kept beside its log when that index
        matches the log, and folds only the events after it
        (docs/adapters.md#fast-reads-of-a-thread). ``want`` names the checkpoint a cold read
        builds next (namespace, id or None for the latest): its events are read with the
        index's anchor, in one call (:func:`_wanted`). ``head``: for the latest checkpoint,
        only the index's head is parsed (a partial index; see
        :attr:`~dsh.adapters._langgraph_index.ThreadIndex.missed` for when it is not enough).
        """
        if write:
            events: Sequence[Event] = self._writer(thread_id).session.events
            stored = len(events)
        elif thread_id in self._logs:
            events = self._logs[thread_id].session.events
            stored = len(events)
        else:
            # with the closers a resume would commit: a call cut off by a crash reads as
            # answered (outcome unknown), as it will once the thread is written; through the
            # restore point, only what was appended since the last read is read and folded
            head = head and want is not None and want[1] is None
            heads: dict[str, bytes | None] = {}  # the index's head, read with the lookup
            found = read_stored(self._persistence, thread_id,
                                aside_heads=(INDEX_ASIDE,) if head else (), heads=heads)
            if found is None:
                return None
            events, stored, closers, nodes = found
            thread = self._threads.get(thread_id)
            if thread is not None and (thread.cold is None or stored < thread.cold.stored or (
                    thread.cold.closers and (stored, closers) != (thread.cold.stored,
                                                                  thread.cold.closers))
                                       or (thread.index.partial and not head)):
                thread = None  # another writer's log, or where closers were: fold it afresh
            wanted = None if want is None else lambda index: _wanted(index, *want, nodes)
            if thread is None:
                thread = self._threads[thread_id] = self._kept_thread(
                    thread_id, events, stored, wanted, head=head, heads=heads)
            thread.cold = _Stored(events, stored, closers, nodes)
            thread.fold(events)
            if thread.index.missed:  # the head could not take the tail: the whole index
                thread = self._threads[thread_id] = self._kept_thread(
                    thread_id, events, stored, wanted)
                thread.cold = _Stored(events, stored, closers, nodes)
                thread.fold(events)
            if not closers and not thread.index.partial \
                    and thread.index.seen - thread.kept >= INDEX_EVERY:
                self._keep_index(thread, events)  # a reader that folded much leaves its work
            return thread
        thread = self._threads.get(thread_id)
        if thread is None:
            thread = self._threads[thread_id] = self._kept_thread(thread_id, events, stored)
        thread.fold(events)
        return thread

    def _kept_thread(self, thread_id: str, events: Sequence[Event], stored: int,
                     wanted: Callable[[ThreadIndex], Iterable[int]] | None = None, *,
                     head: bool = False, heads: Mapping[str, bytes | None] | None = None
                     ) -> _Thread:
        """A thread starting from the index kept beside its log, when it matches the log.

        ``wanted``: the seqs read next, by the index; ``head``: its head only (see
        :func:`decode_index`), taken from ``heads`` when the lookup read it there, else read
        alone (the whole aside is then read only for an index without a head).
        """
        if not self._asides_trusted:
            return _Thread(thread_id)
        line = (heads or {}).get(INDEX_ASIDE, b"")
        if head and heads is not None and INDEX_ASIDE not in heads:  # not read with the lookup
            line = self._read_index(thread_id, head=True)
        if head and line is None:  # no index beside the log
            return _Thread(thread_id)
        if head and line:
            return _Thread(thread_id, decode_index(line, events, stored, wanted=wanted,
                                                   head=True))
        data = self._read_index(thread_id)
        index = (decode_index(data, events, stored, wanted=wanted, head=head)
                 if data is not None else None)
        return _Thread(thread_id, index)

    def _read_index(self, thread_id: str, *, head: bool = False) -> bytes | None:
        """The index beside the thread's log (``head``: its head), None when none can be read."""
        try:
            return self._persistence.read_aside(thread_id, INDEX_ASIDE, head=head)
        except (OSError, DshError) as exc:
            _logger.warning("the LangGraph index of thread %r could not be read (%s); "
                            "folding its log", thread_id, exc)
            return None

    def _misled(self, exc: IndexMisledError) -> None:
        """Stop trusting indexes beside the logs: one named a wrong event (damaged or forged).

        Every thread this saver took from one is folded from its log afresh (a writer's
        too, from the log it holds), so the read that met it gives what a full fold gives;
        a fold that becomes due keeps a right index there again
        (docs/adapters.md#fast-reads-of-a-thread).
        """
        _logger.warning("a LangGraph index kept beside a log named a wrong event (%s); this "
                        "saver folds the threads' logs instead", exc)
        self._asides_trusted = False
        for thread_id, thread in list(self._threads.items()):
            if thread.start == 0:
                continue
            del self._threads[thread_id]
            log = self._logs.get(thread_id)
            if log is not None:
                fresh = self._threads[thread_id] = _Thread(thread_id)
                fresh.fold(log.session.events)

    def _through_index(self, thread_id: str, thread: _Thread,
                       read: Callable[[_Thread], _T]) -> tuple[_Thread, _T]:
        """``read(thread)`` for a writer, again on its log folded afresh if the index misled.

        A writer's reads through the index (the checkpoint a new one continues, the writes
        already stored) run before it appends anything, so a second run appends once.
        """
        try:
            return thread, read(thread)
        except IndexMisledError as exc:
            self._misled(exc)
            fresh = self._thread(thread_id, write=True)
            assert fresh is not None
            return fresh, read(fresh)

    def _keep_index(self, thread: _Thread, events: Sequence[Event]) -> None:
        """Keep the thread's index beside its log (after a commit; a failure is only logged).

        Only committed events may be covered: the writer calls this after a flush, a reader
        only when no repair closers were folded.
        """
        data = encode_index(thread.index, events)
        if data is None:
            return
        try:
            self._persistence.write_aside(thread.thread_id, INDEX_ASIDE, data)
        except (OSError, DshError) as exc:
            _logger.warning("the LangGraph index of thread %r could not be kept beside its "
                            "log (%s); readers fold the log instead", thread.thread_id, exc)
            return
        thread.kept = thread.index.seen

    def _on(self, thread: _Thread, branch: str) -> _Thread | None:
        """The thread of the session a branch's messages are on ("": the thread itself)."""
        return self._thread(branch) if branch else thread

    def _flushed(self, log: LiveLog, thread: _Thread) -> None:
        """After a durable flush: fold what was appended, keep the index when it is due."""
        thread.fold(log.session.events)
        if thread.index.seen - thread.kept >= INDEX_EVERY:
            self._keep_index(thread, log.session.events)

    # -- reading -----------------------------------------------------------------------------

    def _value(self, thread: _Thread, ns: str, channel: str, version: Any,
               memo: dict[tuple[str, str, Any], Any], *, copies: bool = True) -> Any:
        """The value of ``channel`` at ``version``, rebuilding list deltas from their bases.

        A delta names its base version; the chain ends at a whole value at most
        :data:`WHOLE_EVERY` links back, each link one event read from the log, or with
        ``copies`` at the first delta carrying a whole copy (:data:`WHOLE_COPY_EVERY`).
        """
        key = (ns, channel, version)
        chain: list[tuple[tuple[str, str, Any], Mapping[str, Any]]] = []
        value: Any = _MISSING
        events = self._events(thread.thread_id)
        while True:
            if key in memo:
                value = memo[key]
                break
            latest = thread.latest.get((ns, channel))
            if latest is not None and latest[0] == key[2]:
                value = latest[1]
                break
            seq = thread.index.blobs.get(key)
            if seq is None:
                if thread.start and not thread.index.partial:
                    # a whole index from beside the log lacks a value the log stores
                    raise IndexMisledError(f"no {channel!r} at {version!r} in the index")
                # a partial index may not hold it: the caller reads the whole index
                thread.index.missed = thread.index.partial
                value = _MISSING
                break
            data = event_at(events, seq, _CHECKPOINT_EVENT, ns=ns)
            if data["versions"].get(channel) != key[2] or channel not in data["values"]:
                raise IndexMisledError(f"event {seq} stores no {channel!r} at {key[2]!r}")
            stored = data["values"][channel]
            if "d" in stored and not (copies and has_copy(stored)):
                chain.append((key, stored))
                key = (ns, channel, stored["d"])
                continue
            value = _MISSING if "e" in stored else self._codec.decode(stored)
            memo[key] = value
            break
        for link_key, stored in reversed(chain):
            base = value if isinstance(value, list) else []
            value = base[:stored["k"]] + [self._codec.decode(item) for item in stored["a"]]
            memo[link_key] = value
        return value

    def _metadata(self, thread: _Thread, ns: str, checkpoint_id: str) -> Any:
        return self._codec.decode(self._checkpoint(thread, ns, checkpoint_id)[1]["meta"])

    def _checkpoint(self, thread: _Thread, ns: str, checkpoint_id: str
                    ) -> tuple[CheckpointEntry, Mapping[str, Any]]:
        """The index's entry of a checkpoint and its event's data, checked to be that one.

        Raises:
            IndexMisledError: the seq the index gives holds another event.
        """
        entry = thread.namespaces[ns].checkpoints[checkpoint_id]
        return entry, event_at(self._events(thread.thread_id), entry.seq, _CHECKPOINT_EVENT,
                               ns=ns, id=checkpoint_id)

    def _tuple(self, thread: _Thread, ns: str, checkpoint_id: str,
               memo: dict[tuple[str, str, Any], Any], *, copies: bool = True
               ) -> CheckpointTuple:
        """The checkpoint's tuple; ``copies``: see :meth:`_value`."""
        entry, data = self._checkpoint(thread, ns, checkpoint_id)
        events = self._events(thread.thread_id)
        values: dict[str, Any] = {}
        for channel, version in data["versions"].items():
            value = self._value(thread, ns, channel, version, memo, copies=copies)
            if value is not _MISSING:
                values[channel] = list(value) if isinstance(value, list) else value
        writes = sorted(writes_of(entry, events, ns, checkpoint_id).items(),
                        key=lambda item: (item[1][0], *item[0]))
        pending: list[PendingWrite] = [(task, channel, self._codec.decode(stored))
                                       for (task, _), (_, channel, stored) in writes]
        if ns == "" and isinstance(values.get(_MESSAGES), list):
            on = self._on(thread, thread.index.branch(checkpoint_id)) or thread
            values[_MESSAGES] = self._answered_calls(on, values[_MESSAGES],
                                                     written=_written_results(pending).keys())
        checkpoint: dict[str, Any] = {
            "v": data["v"], "id": checkpoint_id, "ts": data["ts"], "channel_values": values,
            "channel_versions": thaw(data["versions"]), "versions_seen": thaw(data["seen"])}
        for key, stored in data["rest"].items():
            checkpoint[key] = self._codec.decode(stored)
        conf = {"thread_id": thread.thread_id, "checkpoint_ns": ns,
                "checkpoint_id": checkpoint_id}
        parent: RunnableConfig | None = None
        if entry.parent is not None:
            parent = {"configurable": {"thread_id": thread.thread_id, "checkpoint_ns": ns,
                                       "checkpoint_id": entry.parent}}
        return CheckpointTuple({"configurable": conf}, checkpoint,  # type: ignore[arg-type]
                               self._codec.decode(data["meta"]), parent, pending)

    def _result_of(self, thread: _Thread, call_id: str) -> ToolMessage | None:
        """The result dsh's log holds for tool call ``call_id`` as a ToolMessage, or None."""
        seq = thread.answered.get(call_id)
        if seq is None:
            return None
        message = event_at(self._events(thread.thread_id), seq, "tool/result")["message"]
        if message.get("source", {}).get("callId") != call_id:
            raise IndexMisledError(f"event {seq} answers another call than {call_id!r}")
        content = message["content"]
        failed = bool(content and content[0].get("isError"))
        return ToolMessage(content=text_of(content), tool_call_id=call_id,
                           status="error" if failed else "success", id=f"dsh-{call_id}")

    def _answered_calls(self, thread: _Thread, messages: list[Any], *,
                        written: Collection[str] = frozenset(),
                        carried: Mapping[str, ToolMessage] | None = None) -> list[Any]:
        """``messages`` plus the answers dsh's log holds and the state lacks.

        Each AIMessage call that the state never got an answer to but dsh's log did (crash
        repair: outcome unknown) gets that result as a ToolMessage after it, so the graph
        resumes with the result dsh recorded instead of running the call again. A call in
        ``written`` (answered by the checkpoint's pending writes, which LangGraph applies on
        resume: a tools task whose writes were stored before the process died, its next
        checkpoint not) gets none, or the model would see two results for it. A call in
        ``carried`` gets that ToolMessage (the pending write's own result, given an id that
        :func:`_align_written` then puts on the pending write) before dsh's log is asked.
        """
        carried = carried or {}
        if not thread.answered and not carried:
            return messages  # dsh holds no result at all: nothing to add (a cold read's case)
        flags = iter(_answers_of_calls(messages)[1])

        def answer(call: Mapping[str, Any]) -> ToolMessage | None:
            call_id = call.get("id")
            if next(flags) or not isinstance(call_id, str) or call_id in written:
                return None
            result = self._carried(carried.get(call_id), call_id)
            if result is None and thread.answered:
                result = self._result_of(thread, call_id)
            if result is not None:
                result.name = call.get("name")
            return result

        return _answers_after_calls(messages, answer)

    @staticmethod
    def _carried(message: ToolMessage | None, call_id: str) -> ToolMessage | None:
        """A copy of a pending write's ToolMessage, with an id (``dsh-w-<call id>`` if none)."""
        if message is None:
            return None
        return message.model_copy(update={"id": message.id or f"dsh-w-{call_id}"})

    def _events(self, thread_id: str) -> Sequence[Event]:
        log = self._logs.get(thread_id)
        if log is not None:
            return log.session.events
        thread = self._threads.get(thread_id)
        if thread is not None and thread.cold is not None:
            return thread.cold.events  # what _thread() read for this call
        return self._persistence.read(thread_id).events

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``, else the thread's latest).

        Returns:
            The tuple with the full channel values and the pending writes (in LangGraph's
            ``writes_sort_key`` order), or None when the thread or checkpoint is not stored.
        """
        conf = _configurable(config)
        with self._lock, _no_collection():
            try:
                return self._checked_get_tuple(config, conf)
            except IndexMisledError as exc:
                self._misled(exc)
                return self._checked_get_tuple(config, conf)

    def _checked_get_tuple(self, config: RunnableConfig, conf: Mapping[str, Any]
                           ) -> CheckpointTuple | None:
        """:meth:`get_tuple`'s answer from the index's head, or its whole when that is short."""
        found = self._get_tuple(config, conf, head=True)
        thread = self._threads.get(str(conf["thread_id"]))
        if thread is not None and thread.index.missed:
            del self._threads[thread.thread_id]  # the head was not enough: read it whole
            found = self._get_tuple(config, conf, head=False)
        return found

    def _get_tuple(self, config: RunnableConfig, conf: Mapping[str, Any], *, head: bool
                   ) -> CheckpointTuple | None:
        """:meth:`get_tuple`'s answer; ``head``: from the index's head when it is enough."""
        ns = conf.get("checkpoint_ns", "")
        thread = self._thread(str(conf["thread_id"]),
                              want=(ns, get_checkpoint_id(config) or None), head=head)
        space = thread.namespaces.get(ns) if thread else None
        latest = ns == "" and not get_checkpoint_id(config)
        if thread is None or space is None or not space.order:
            return self._unsaved(thread) if thread is not None and latest else None
        checkpoint_id = get_checkpoint_id(config) or space.order[-1]
        if checkpoint_id not in space.checkpoints:
            return None
        found = self._tuple(thread, ns, checkpoint_id, {})
        values = found.checkpoint["channel_values"]
        messages = values.get(_MESSAGES)
        on = self._on(thread, thread.index.branch(checkpoint_id)) if latest else None
        if on is not None and isinstance(messages, list):
            # A tool result the pending writes hold comes back only when LangGraph applies
            # them, on a resume (None or a Command as input); a run given new input discards
            # them. So the messages carry that result (the surface's copy, or the write's own)
            # and the pending write takes the same id: applied, it replaces it in place
            # (docs/adapters.md#langgraph-and-langchain-agents).
            pending = found.pending_writes or ()
            carried = _written_results(pending)
            ahead = self._recorded_ahead(on, messages)
            if ahead or carried:
                values[_MESSAGES] = self._answered_calls(on, [*messages, *ahead],
                                                         carried=carried)
                _align_written(values[_MESSAGES], pending)
        return found

    def _recorded_ahead(self, thread: _Thread, messages: Sequence[Any]) -> list[Any]:
        """The messages made durable on the surface after the last one ``messages`` holds.

        LangGraph saves a checkpoint on a background thread and may start the next step, a
        tool body included, before the save lands; a crash then leaves the latest checkpoint
        behind what the middleware had made durable (the prompt, the model's answer, its tool
        calls). Walking the surface back from its end to the last message the checkpoint holds
        gives those messages back, so the next run is sent what the log holds
        (docs/adapters.md#langgraph-and-langchain-agents).
        """
        last = messages[-1].id if messages and isinstance(messages[-1], BaseMessage) else None
        held: set[Any] | None = None  # every id the checkpoint holds, made only when needed
        log = self._logs.get(thread.thread_id)
        events = self._events(thread.thread_id)
        nodes = (log.session.surface.nodes if log is not None
                 else thread.cold.nodes if thread.cold is not None else surface_nodes(events))
        ahead: list[Any] = []
        for seq in reversed(nodes):
            records = records_of(events[seq], LANGCHAIN_FORMAT)
            if not records:
                continue  # dsh's own events; a repair's result comes back with its call
            found = records[0].get("data", {}).get("id")
            if found is not None and found == last:
                break  # the checkpoint's last message: the usual end of the walk
            if held is None:
                held = {m.id for m in messages if isinstance(m, BaseMessage)}
            if found in held:
                break
            ahead.extend(thaw(r) if isinstance(r, FrozenDict) else r for r in reversed(records))
        ahead.reverse()
        return messages_from_dict(ahead)

    def _unsaved(self, thread: _Thread) -> CheckpointTuple | None:
        """A checkpoint standing for a thread whose run died before LangGraph saved any.

        It holds the messages the middleware made durable (with dsh's answers to calls cut
        off), so the next run starts from them; None when the surface holds none. It is not
        stored: ``list`` never shows it, and the next ``put`` names it as its parent.
        """
        messages = self._recorded_ahead(thread, ())
        if not messages:
            return None
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {_MESSAGES: self._answered_calls(thread, messages)}
        checkpoint["channel_versions"] = {_MESSAGES: self.get_next_version(None, None)}
        conf = {"thread_id": thread.thread_id, "checkpoint_ns": "",
                "checkpoint_id": checkpoint["id"]}
        metadata: CheckpointMetadata = {"source": "input", "step": -1, "parents": {}}
        return CheckpointTuple({"configurable": conf}, checkpoint, metadata, None, [])

    def _thread_ids(self) -> Sequence[str]:
        """The stored sessions that are threads: not the branch forks ``<thread>~<n>``."""
        out = []
        for header in self._persistence.list_headers():
            session_id, parent = str(header["id"]), header.get("parentSession")
            root, _, number = session_id.rpartition("~")
            if isinstance(parent, str) and number.isdigit() and (
                    parent == root or parent.startswith(f"{root}~")):
                continue  # a branch of thread ``root``, forked from it or from its branch
            out.append(session_id)
        return out

    def _listed(self, config: RunnableConfig | None, filter: dict[str, Any] | None,
                before: RunnableConfig | None, limit: int | None) -> list[CheckpointTuple]:
        with self._lock, _no_collection():
            if config is None:
                thread_ids = self._thread_ids()
            else:
                thread_ids = [str(_configurable(config)["thread_id"])]
            wanted_ns = (config.get("configurable") or {}).get("checkpoint_ns") \
                if config else None
            wanted_id = get_checkpoint_id(config) if config else None
            before_id = get_checkpoint_id(before) if before else None
            out: list[CheckpointTuple] = []
            for thread_id in thread_ids:
                thread = self._thread(thread_id)
                if thread is None:
                    continue
                memo: dict[tuple[str, str, Any], Any] = {}
                for ns, space in thread.namespaces.items():
                    if wanted_ns is not None and ns != wanted_ns:
                        continue
                    for checkpoint_id in reversed(space.order):
                        if limit is not None and len(out) >= limit:
                            return out
                        if wanted_id is not None and checkpoint_id != wanted_id:
                            continue
                        if before_id is not None and checkpoint_id >= before_id:
                            continue
                        if filter:
                            metadata = self._metadata(thread, ns, checkpoint_id)
                            if any(metadata.get(k) != v for k, v in filter.items()):
                                continue
                        # through the deltas down to the whole value, not a whole copy:
                        # one whole decode serves every checkpoint listed above it
                        out.append(self._tuple(thread, ns, checkpoint_id, memo,
                                               copies=False))
            return out

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, of ``config``'s thread (every thread for None).

        Only the namespace ``config`` names (when it names one), only those whose metadata has
        every ``filter`` item, older than ``before``, at most ``limit``.
        """
        yield from self._checked_listed(config, filter, before, limit)

    def _checked_listed(self, config: RunnableConfig | None, filter: dict[str, Any] | None,
                        before: RunnableConfig | None, limit: int | None
                        ) -> Sequence[CheckpointTuple]:
        """:meth:`_listed`, read again from the logs when an index beside one misled it.

        Shared by :meth:`list` and :meth:`alist`, so both meet a damaged or forged index the
        same way (docs/adapters.md#fast-reads-of-a-thread).
        """
        try:
            return self._listed(config, filter, before, limit)
        except IndexMisledError as exc:
            with self._lock:
                self._misled(exc)
            return self._listed(config, filter, before, limit)

    # -- writing -----------------------------------------------------------------------------

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        """Append the checkpoint (changed channel values only); durable when this returns.

        Returns:
            The config naming the stored checkpoint (thread, namespace, id).
        """
        conf = _configurable(config)
        thread_id, ns = str(conf["thread_id"]), conf.get("checkpoint_ns", "")
        with self._lock:
            log = self._writer(thread_id)
            thread = self._thread(thread_id, write=True)
            assert thread is not None
            values = checkpoint["channel_values"]
            stored: dict[str, Any] = {}
            depth: dict[str, int] = {}
            for channel in new_versions:
                if channel not in values:
                    stored[channel] = {"e": 1}
                    continue
                value = values[channel]
                previous = thread.latest.get((ns, channel))
                links = thread.depth.get((ns, channel), 0)
                if (type(value) is list and previous is not None
                        and type(previous[1]) is list and previous[1]
                        and links < WHOLE_EVERY
                        and (ns, channel, previous[0]) in thread.index.blobs
                        and _extends(value, previous[1])):
                    stored[channel] = {"d": previous[0], "k": len(previous[1]),
                                       "a": [self._codec.encode(item)
                                             for item in value[len(previous[1]):]]}
                    depth[channel] = links + 1
                    if depth[channel] % WHOLE_COPY_EVERY == 0:
                        stored[channel].update(self._codec.encode(value))
                else:
                    stored[channel] = self._codec.encode(value)
                    depth[channel] = 0
            branch = ""
            if ns == "" and isinstance(values.get(_MESSAGES), list):
                thread, branch = self._through_index(thread_id, thread, lambda t: self._place(
                    t, conf.get("checkpoint_id"), values[_MESSAGES]))
            deferred = self._deferred.pop((thread_id, checkpoint["id"]), None) \
                if ns == "" else None
            if ns == "":
                self._drop_deferred(thread_id, before=checkpoint["id"])
            meta = get_serializable_checkpoint_metadata(config, metadata)
            rest = {key: self._codec.encode(value) for key, value in checkpoint.items()
                    if key not in _TOP_LEVEL}
            log.open().mark(CHECKPOINT_EVENT, {
                "ns": ns, "id": checkpoint["id"], "parent": conf.get("checkpoint_id"),
                "ts": checkpoint["ts"], "v": checkpoint["v"],
                "versions": dict(checkpoint["channel_versions"]),
                "seen": {node: dict(seen) for node, seen in checkpoint["versions_seen"].items()},
                "meta": self._codec.encode(meta), "values": stored, "rest": rest,
                **({"branch": branch} if branch else {})})
            log.flush()
            self._flushed(log, thread)
            if deferred:
                self._project_on(thread, branch, deferred)
            for channel, version in new_versions.items():
                if channel in values:
                    thread.latest[(ns, channel)] = (version, values[channel])
                    thread.depth[(ns, channel)] = depth[channel]
                else:
                    thread.latest.pop((ns, channel), None)
                    thread.depth.pop((ns, channel), None)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                 "checkpoint_id": checkpoint["id"]}}

    def _drop_deferred(self, thread_id: str, *, before: str | None = None) -> None:
        """Forget the messages held for checkpoints of ``thread_id`` that will not be put.

        LangGraph puts a run's checkpoints one after another in the order it makes them (and
        checkpoint ids grow in that order), so once a checkpoint is put, one made before it
        that was not put never will be (its save failed, or the run ended without it): the
        messages written against it stay in the log's writes and leave memory, so nothing is
        held from one run into the next. ``before`` None: every one of the thread
        (``close``, ``delete_thread``).
        """
        for key in [key for key in self._deferred
                    if key[0] == thread_id and (before is None or key[1] < before)]:
            del self._deferred[key]

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        """Append a task's writes against the checkpoint ``config`` names; durable on return.

        A regular write already stored for the same task and index is not stored again; a
        special one (error, interrupt, …) replaces it, as LangGraph's own savers do.
        """
        conf = _configurable(config)
        thread_id, ns = str(conf["thread_id"]), conf.get("checkpoint_ns", "")
        checkpoint_id = conf.get("checkpoint_id")
        with self._lock:
            log = self._writer(thread_id)
            thread = self._thread(thread_id, write=True)
            assert thread is not None

            def held_by(t: _Thread) -> tuple[CheckpointEntry | None, Writes]:
                found = t.index.entry(ns, checkpoint_id)
                return found, (writes_of(found, log.session.events, ns, str(checkpoint_id))
                               if found is not None else {})

            thread, (entry, held) = self._through_index(thread_id, thread, held_by)
            rows = []
            for index, (channel, value) in enumerate(writes):
                idx = WRITES_IDX_MAP.get(channel, index)
                if idx >= 0 and (task_id, idx) in held:
                    continue
                rows.append([idx, channel, self._codec.encode(value)])
                if ns == "" and channel == _MESSAGES:
                    added = value if isinstance(value, list) else [value]
                    if entry is None and isinstance(checkpoint_id, str):
                        # its branch is known once LangGraph puts the checkpoint
                        self._deferred.setdefault((thread_id, checkpoint_id), []).extend(added)
                    else:
                        self._project_on(thread, thread.index.branch(checkpoint_id), added)
            if not rows:
                return
            log.open().mark(WRITES_EVENT, {"ns": ns, "cp": checkpoint_id, "task": task_id,
                                           "path": task_path, "w": rows})
            log.flush()
            self._flushed(log, thread)

    def _project(self, log: LiveLog, thread: _Thread, messages: Sequence[Any], *,
                 gone: Sequence[str] = ()) -> None:
        """Put the state's messages on the surface: new ones appended, ``gone`` ids removed."""
        wanted = [m for m in messages if isinstance(m, BaseMessage) and isinstance(m.id, str)]
        if gone:
            on_surface = set(log.session.surface.nodes)
            leaving = [(message_id, thread.projected[message_id]) for message_id in gone
                       if thread.projected.get(message_id) in on_surface]
            if leaving:
                remove_from_surface(log.open(), [seq for _, seq in leaving],
                                    form="langgraph-state")
                for message_id, _ in leaving:
                    del thread.projected[message_id]
        fresh = []
        for message in wanted:
            if message.id in thread.projected:
                continue
            answered = (thread.answered.get(message.tool_call_id)
                        if isinstance(message, ToolMessage) else None)
            if answered is not None:  # dsh already holds this call's result (its repair)
                thread.projected[message.id] = answered  # type: ignore[index]
                continue
            fresh.append(message)
        if not fresh:
            return
        shaper = log.open()
        records = [message_record(m, i, thread.thread_id) for i, m in enumerate(fresh)]
        messages_to_events(shaper, fresh, records, model="unknown")
        thread.fold(shaper.session.events)

    def _project_on(self, thread: _Thread, branch: str, messages: Sequence[Any], *,
                    gone: Sequence[str] = ()) -> None:
        """Project ``messages`` onto a branch's session ("": the thread's own), durably."""
        session_id = branch or thread.thread_id
        log = self._writer(session_id)
        target = self._thread(session_id, write=True)
        assert target is not None
        self._project(log, target, messages, gone=gone)
        if branch:
            log.flush()
            self._flushed(log, target)

    def _line(self, thread: _Thread, checkpoint_id: str | None) -> Sequence[Any] | None:
        """The ``messages`` a root-namespace checkpoint holds (None: none, or not stored)."""
        entry = thread.index.entry("", checkpoint_id) if checkpoint_id else None
        if entry is None:
            return None
        version = self._checkpoint(thread, "", str(checkpoint_id))[1]["versions"].get(_MESSAGES)
        value = self._value(thread, "", _MESSAGES, version, {}) if version is not None else None
        return value if isinstance(value, list) else None

    def _place(self, thread: _Thread, parent: Any, messages: Sequence[Any]) -> str:
        """Project a root checkpoint's messages onto its branch; returns the branch ("" own).

        A checkpoint continues its parent's branch. One whose parent is not the last
        checkpoint of that branch and whose messages do not extend that last checkpoint's (a
        run or ``update_state`` from an earlier checkpoint: a fork in LangGraph's sense) starts
        a new branch: a dsh fork ``<thread>~<n>`` of the branch's session, cut after the last
        message the two lines share, onto which its messages go; the branch it left keeps its
        conversation. A checkpoint on the last one of its branch that drops messages
        (``RemoveMessage``) takes them off that branch's model view instead
        (docs/adapters.md#time-travel-and-forks).
        """
        index = thread.index
        source = index.branch(parent)
        tip = index.tips.get(source)
        line = self._line(thread, tip) if parent and index.entry("", parent) else None
        if line is None or _extends([*messages], [*line]):
            self._project_on(thread, source, messages)
            return source
        if str(parent) != tip:
            child = self._fork_branch(thread, source, line, messages)
            if child is not None:
                self._project_on(thread, child, messages)
                return child
        ids = {m.id for m in messages if isinstance(m, BaseMessage)}
        gone = [m.id for m in line
                if isinstance(m, BaseMessage) and isinstance(m.id, str) and m.id not in ids]
        self._project_on(thread, source, messages, gone=gone)
        return source

    def _fork_branch(self, thread: _Thread, source: str, line: Sequence[Any],
                     messages: Sequence[Any]) -> str | None:
        """Fork the source branch's session where ``messages`` leaves ``line``; the child's id.

        The cut is after the event of the last message both lines share, and the events up
        to the next message on the model view (its step and turn ends); with none shared,
        before the first message. None when that place is not on the session's model view.
        """
        session_id = source or thread.thread_id
        log = self._writer(session_id)
        target = self._thread(session_id, write=True)
        assert target is not None
        shared: Any = None
        for old, new in zip(line, messages, strict=False):
            if not (isinstance(old, BaseMessage) and isinstance(new, BaseMessage)
                    and old.id == new.id):
                break
            shared = old
        session = log.session
        nodes = session.surface.nodes
        if shared is None:
            boundary = nodes[0] - 1 if nodes else -1
        else:
            seq = target.projected.get(shared.id) if isinstance(shared.id, str) else None
            if seq is None or seq not in nodes:
                return None
            after = nodes.index(seq) + 1
            boundary = nodes[after] - 1 if after < len(nodes) else len(session.events) - 1
        if boundary < 0:
            return None
        number = 1
        while (f"{thread.thread_id}~{number}" in self._logs
               or self._persistence.exists(f"{thread.thread_id}~{number}")):
            number += 1
        child = f"{thread.thread_id}~{number}"
        log.fork(boundary, child)
        return child

    def delete_thread(self, thread_id: str) -> None:
        """Hide every checkpoint and write of the thread; its log keeps the bytes, unless erased.

        Its messages leave the model view (a surface removal); a later ``put`` starts afresh.
        With ``erase_on_delete`` the thread is then erased (:func:`dsh.rights.erase`, reason
        ``LangGraph delete_thread``): the saver releases it and every byte of its content,
        and of its forks' copies, leaves the store. A thread that is not stored is left alone.

        Raises:
            SessionBusyError: with ``erase_on_delete``, another process writes the thread or
                one of its forks (it stays hidden; delete it again to erase it).
        """
        thread_id = str(thread_id)
        with self._lock:
            if thread_id not in self._logs and not self._persistence.exists(thread_id):
                return
            log = self._writer(thread_id)
            thread = self._thread(thread_id, write=True)
            assert thread is not None
            branches = sorted(branch for branch in thread.index.tips if branch)
            for branch in branches:  # each branch's conversation leaves its model view too
                if self._persistence.exists(branch):
                    on = self._thread(branch, write=True)
                    assert on is not None
                    self._project_on(thread, branch, [], gone=list(on.projected))
            self._project(log, thread, [], gone=list(thread.projected))
            log.open().mark(DROP_EVENT, {"all": True})
            log.flush()
            self._drop_deferred(thread_id)
            self._flushed(log, thread)
            if self.erase_on_delete:
                self._erase([thread_id, *(b for b in branches
                                          if self._persistence.exists(b))])

    def _erase(self, session_ids: Sequence[str]) -> None:
        """Release the thread's (and its branches') write ownership and erase them.

        Rule: docs/adapters.md#langgraph-and-langchain-agents.
        """
        from dsh.rights import erase

        for session_id in session_ids:
            log = self._logs.pop(session_id, None)
            self._threads.pop(session_id, None)
            if log is not None:
                log.close()
        erase(self._persistence, session_ids, reason="LangGraph delete_thread",
              by="dsh.adapters.langgraph")

    def _drop(self, thread_id: str,
              keep: Callable[[_Thread, str, str, CheckpointEntry], bool]) -> None:
        """Hide the thread's checkpoints ``keep`` refuses (one drop event a namespace).

        They are chosen before anything is appended, so when an index beside the log misled
        the choice (``keep`` read a wrong event through it) the saver stops trusting asides
        (WARNING) and chooses again on the log folded afresh
        (docs/adapters.md#fast-reads-of-a-thread).
        """
        def chosen(thread: _Thread) -> dict[str, list[str]]:
            drops = {ns: [cid for cid in space.order
                          if not keep(thread, ns, cid, space.checkpoints[cid])]
                     for ns, space in thread.namespaces.items()}
            return {ns: ids for ns, ids in drops.items() if ids}

        thread = self._thread(thread_id)
        if thread is None:
            return
        try:
            drops = chosen(thread)
        except IndexMisledError as exc:
            self._misled(exc)
            thread = self._thread(thread_id)
            assert thread is not None
            drops = chosen(thread)
        if not drops:
            return
        log = self._writer(thread_id)
        for ns, ids in drops.items():
            log.open().mark(DROP_EVENT, {"ns": ns, "ids": ids})
        log.flush()
        thread = self._thread(thread_id, write=True)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Hide the checkpoints (and their writes) whose metadata ``run_id`` is in ``run_ids``."""
        wanted = set(run_ids)
        if not wanted:
            return
        with self._lock:
            for thread_id in self._thread_ids():
                self._drop(thread_id, lambda thread, ns, cid, _entry: self._metadata(
                    thread, ns, cid).get("run_id") not in wanted)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Hide old checkpoints: ``keep_latest`` keeps each namespace's newest one.

        ``delete`` hides the whole thread, as :meth:`delete_thread`.

        Raises:
            AdapterError: ``ADAPTER_PRUNE_STRATEGY`` for another strategy.
        """
        if strategy not in ("keep_latest", "delete"):
            raise AdapterError(f"prune strategy must be 'keep_latest' or 'delete' (got "
                               f"{strategy!r})", code="ADAPTER_PRUNE_STRATEGY")
        with self._lock:
            for thread_id in map(str, thread_ids):
                if strategy == "delete":
                    self.delete_thread(thread_id)
                    continue
                self._drop(thread_id, _is_newest)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy a thread as a dsh fork of its session (the child names its parent).

        A source that is not stored leaves the target alone.

        Raises:
            SessionForkError: the target session already exists.
        """
        source, target = str(source_thread_id), str(target_thread_id)
        with self._lock:
            log = self._logs.pop(source, None)
            if log is not None:
                log.close()  # a stored fork reads the parent as stored: release it first
                self._threads.pop(source, None)
            if not self._persistence.exists(source):
                return
            self._persistence.fork(source, None, target)

    # -- durable inside a run -------------------------------------------------------------------

    def current_thread(self) -> str | None:
        """The thread id of the graph run calling us, when it runs in the root namespace.

        None outside a graph run, and inside a subgraph (its checkpoints are its own).
        """
        try:
            conf = get_config().get("configurable") or {}
        except RuntimeError:
            return None  # called outside a graph run
        thread_id = conf.get("thread_id")
        if thread_id is None or "|" in str(conf.get("checkpoint_ns", "")):
            return None
        return str(thread_id)

    def record_messages(self, thread_id: str, messages: Sequence[Any]) -> None:
        """Make the state's ``messages`` durable on the thread's surface now (new ones only).

        The middleware calls this before the model is asked and before any tool body runs.
        """
        with self._lock:
            log = self._writer(thread_id)
            thread = self._thread(thread_id, write=True)
            assert thread is not None
            self._project_on(thread, thread.index.current, messages)
            log.flush()

    def answer_open_calls(self, thread_id: str | None,
                          messages: Sequence[Any]) -> builtins.list[Any]:
        """``messages`` (a model request's) with every unanswered tool call answered.

        A model is never sent a call without a result, nor one with two (docs/rules.md#repair).
        Each AIMessage call no ToolMessage in ``messages`` answers gets, right after its
        message's answers, the result dsh's log holds for it on ``thread_id`` (a crash
        repair's), else dsh's outcome-unknown closer: the call may have run. A call answered
        twice (a resume that ran again a task whose answer the restored state already held)
        is sent its first answer only. A ToolMessage answers the latest call before it with
        its id (:func:`_answers_of_calls`: a later turn's call may reuse an earlier one's).
        The state is not changed; only what the model is sent.
        Returns ``messages`` itself when nothing is open or repeated.
        """
        once, answered = _answers_of_calls(messages)
        if len(once) < len(messages):
            messages = once
        if all(answered):
            return messages if isinstance(messages, list) else list(messages)
        flags = iter(answered)
        with self._lock:
            thread = self._thread(thread_id) if thread_id is not None else None
            if thread is not None:
                thread = self._on(thread, thread.index.current) or thread
            return _answers_after_calls(messages, lambda call: None if next(flags)
                                        else self._closer(thread, call))

    def _closer(self, thread: _Thread | None, call: Mapping[str, Any]) -> ToolMessage:
        """The answer to an open ``call``: dsh's logged result, else an outcome-unknown one."""
        call_id = str(call.get("id"))
        result = self._result_of(thread, call_id) if thread is not None else None
        if result is None:
            text = closer_text("interrupted", started=True, call_id=call_id,
                               tool_name=call.get("name"))
            result = ToolMessage(content=text, tool_call_id=call_id, status="error",
                                 id=f"dsh-{call_id}")
        result.name = call.get("name")
        return result

    def _before_tool(self, request: Any) -> ToolMessage | None:
        """Record the call before its body runs; the recorded result if dsh has one."""
        thread_id = self.current_thread()
        call = request.tool_call
        call_id = call.get("id")
        if thread_id is None or not isinstance(call_id, str):
            return None
        with self._lock:
            self.record_messages(thread_id, _state_messages(request.state))
            thread = self._thread(thread_id, write=True)
            assert thread is not None
            branch = thread.index.current
            result = self._result_of(self._on(thread, branch) or thread, call_id)
        if result is not None:
            result.name = call.get("name")
        return result

    def wrap_tool_call(self, request: Any, execute: Callable[[Any], Any]) -> Any:
        """For ``ToolNode(wrap_tool_call=...)``: the call is durable before its body runs.

        A call dsh already has a result for (a crash repair's outcome-unknown one) is answered
        with that result and not run again.
        """
        recorded = self._before_tool(request)
        return recorded if recorded is not None else execute(request)

    async def awrap_tool_call(self, request: Any,
                              execute: Callable[[Any], Awaitable[Any]]) -> Any:
        """Async :meth:`wrap_tool_call`."""
        recorded = await asyncio.to_thread(self._before_tool, request)
        return recorded if recorded is not None else await execute(request)

    def middleware(self) -> Any:
        """A LangChain ``create_agent`` middleware keeping the run durable as it goes.

        Before each model call the prompt (the state's messages) is durable; after it the
        model's answer and its tool calls; before each tool body :meth:`wrap_tool_call` runs.
        Add it with ``create_agent(..., checkpointer=saver, middleware=[saver.middleware()])``.
        """
        from dsh.adapters._langgraph_middleware import DshMiddleware
        return DshMiddleware(self)

    # -- version ids ---------------------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A version id greater than ``current``: a zero-padded counter and a random tail.

        The tail is written with 16 decimals (``0.0005592311143513``), not as ``repr`` of the
        float, which gives a small one 19 or more digits after the point: short ids, and no
        digit run a JSON reader could take for a long integer (dsh's own,
        :func:`dsh.json.has_long_number`, reads a run after a ``.`` as no integer's).
        """
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():.16f}"

    # -- async twins -------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async :meth:`get_tuple` (in a worker thread)."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None
                    ) -> AsyncIterator[CheckpointTuple]:
        """Async :meth:`list` (the listing is read in a worker thread)."""
        for item in await asyncio.to_thread(self._checked_listed, config, filter, before,
                                            limit):
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions
                   ) -> RunnableConfig:
        """Async :meth:`put` (in a worker thread)."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        """Async :meth:`put_writes` (in a worker thread)."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async :meth:`delete_thread` (in a worker thread)."""
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async :meth:`delete_for_runs` (in a worker thread)."""
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async :meth:`copy_thread` (in a worker thread)."""
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async :meth:`prune` (in a worker thread)."""
        await asyncio.to_thread(lambda: self.prune(thread_ids, strategy=strategy))


_MISSING: Final[Any] = object()


_collection_lock = threading.Lock()
_collection_holds = 0  # reads inside _no_collection now, across savers and threads
_collection_saved: tuple[int, ...] = ()  # the thresholds the first of them found


@contextmanager
def _no_collection() -> Iterator[None]:
    """No older-generation collection while a read builds its values; the youngest runs as ever.

    Decoding a long ``messages`` list makes thousands of containers, none of them garbage. A
    pass over the older generations in between walks them, and the objects before them, again
    (the peer's 1-2 ms in a cold read). Collections of the youngest generation stay on: each
    walks the ~700 objects made since the last, still in the CPU's cache, so all of them cost
    ~0.6 ms, where holding every collection off and walking the read's ~8,500 containers in one
    pass at its end cost 1.5-2.5 ms. The older generations' thresholds are raised while any read
    holds this (a count shared by the savers of the process, so that concurrent reads restore
    the thresholds once, when the last ends) and each put back after unless something else set
    it meanwhile (setting the youngest's alone leaves the older ones raised: they are put
    back); the containers of the read are walked there at the next older-generation pass,
    as any others (docs/adapters.md#fast-reads-of-a-thread).
    """
    global _collection_holds, _collection_saved
    with _collection_lock:
        if _collection_holds == 0:
            _collection_saved = gc.get_threshold()
            gc.set_threshold(_collection_saved[0], _HELD_THRESHOLD, _HELD_THRESHOLD)
        _collection_holds += 1
    try:
        yield
    finally:
        with _collection_lock:
            _collection_holds -= 1
            if _collection_holds == 0:
                # each older generation's threshold still the raised one is put back; one set
                # meanwhile stays, and so does the youngest's (gc.set_threshold(n) sets it
                # alone and keeps the older ones raised: they must still come back)
                young, *older = gc.get_threshold()
                gc.set_threshold(young, *(saved if held == _HELD_THRESHOLD else held for held, saved
                                          in zip(older, _collection_saved[1:], strict=True)))


_HELD_THRESHOLD: Final = 1 << 30
"""The older generations' threshold while a read holds them off (never reached)."""


def _wanted(index: ThreadIndex, ns: str, checkpoint_id: str | None,
            nodes: Sequence[int]) -> list[int]:
    """The seqs a cold ``get_tuple`` of a checkpoint reads, as far as the index tells.

    Its event and its writes' events, the chain of each list delta it stores (the events of
    the values it extends, down to a whole one: at most :data:`WHOLE_EVERY` links), and the
    last surface nodes (where the walk for messages recorded ahead starts). Any other event
    the read needs (a value stored by an earlier checkpoint) is paged in as ever.
    """
    space = index.namespaces.get(ns)
    seqs = list(nodes[-2:])
    if space is None or not space.order:
        return seqs
    entry = space.checkpoints.get(checkpoint_id or space.order[-1])
    if entry is None:
        return seqs
    at = entry.seq
    seqs += [at, *entry.writes_at]
    links = index.links
    for space_ns, channel, seq in [key for key in links if key[2] == at]:
        for _ in range(WHOLE_EVERY + 1):  # a chain ends at a whole value by then
            base = links.get((space_ns, channel, seq))
            if base is None:
                break
            seq = base
            seqs.append(seq)
    return seqs


def _is_newest(thread: _Thread, ns: str, checkpoint_id: str, _entry: CheckpointEntry) -> bool:
    """A keep-predicate for :meth:`DshSaver._drop`: the namespace's newest checkpoint."""
    return thread.namespaces[ns].order[-1] == checkpoint_id


def _state_messages(state: Any) -> list[Any]:
    """The messages of a graph state (a dict, a list of messages, or an object with them)."""
    if isinstance(state, dict):
        found = state.get(_MESSAGES)
    elif isinstance(state, list):
        found = state
    else:
        found = getattr(state, _MESSAGES, None)
    return list(found) if isinstance(found, list) else []

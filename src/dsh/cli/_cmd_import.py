"""``dsh import``: transcripts of other agents (and dsh logs) into the store."""

from __future__ import annotations

import enum
import errno
import gc
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from dataclasses import replace as dataclass_replace
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from dsh import (
    ConfigError,
    DshError,
    EventRejectedError,
    ImportFormatError,
    Session,
)
from dsh.cli import _render as render
from dsh.cli._common import (
    DEFAULT_WAIT_S,
    STAGING_REASON,
    TRANSCRIPT_SUFFIXES,
    JsonOption,
    StoreOption,
    WaitOption,
    cli_store,
    deferred_interrupts,
    json_mode,
    stderr_console,
    stdout_console,
)
from dsh.cli._errors import EXIT_FAILED, STATE
from dsh.cli._progress import Bar, progress

if TYPE_CHECKING:
    from rich.console import Console

    from dsh.interop import ImportedSession, StreamedSession
    from dsh.persistence import Handle, Persistence
    from dsh.session import Event

WRITE_BATCH_EVENTS: Final = 20_000
"""Events ``dsh import`` writes and flushes at once (a 300k-event session: 15 batches)."""


class ImportFormat(enum.StrEnum):
    """``--format`` of ``dsh import``: a source format, or ``auto`` to detect it per file."""

    auto = "auto"
    claude_code = "claude-code"
    codex = "codex"
    openai_chat = "openai-chat"
    anthropic = "anthropic"
    openhands = "openhands"
    openhands_resolver = "openhands-resolver"
    gemini_cli = "gemini-cli"
    swe_agent = "swe-agent"
    mini_swe_agent = "mini-swe-agent"
    dsh = "dsh"
    atif = "atif"


def examples_dir() -> Path | None:
    """Return the bundled example transcripts (package data ``dsh/examples/transcripts``).

    Found through :mod:`importlib.resources` only, so an editable and a regular install give
    the same folder. Returns None when this install ships no examples (or they are inside a
    zip archive, which ``dsh import`` cannot walk).
    """
    from importlib.resources import files

    bundled = files("dsh").joinpath("examples", "transcripts")
    if not bundled.is_dir():
        return None
    path = Path(str(bundled))
    return path if path.is_dir() else None


def user_log_dirs() -> list[Path]:
    """Return the user's own agent log folders that hold files: Claude Code's and Codex's."""
    home = Path.home()
    candidates = [home / ".claude" / "projects", home / ".codex" / "sessions"]
    return [path for path in candidates
            if path.is_dir() and any(p.is_file() for p in path.rglob("*.jsonl"))]


def _is_claude_subagent(path: Path) -> bool:
    # <sid>/subagents/agent-*.jsonl is imported as a child of <sid>.jsonl next to that folder.
    if path.parent.name != "subagents":
        return False
    session_dir = path.parent.parent
    return (session_dir.parent / f"{session_dir.name}.jsonl").is_file()


def _walk(paths: Sequence[Path], bar: Bar | None = None,
          unreadable: list[Path] | None = None) -> Iterator[tuple[Path, bool]]:
    """Yield ``(file, explicit)``: given files as is, folders walked in sorted order.

    A folder is walked depth first, each folder's names sorted (the order of sorting every
    path found), as it is read: the first files come before the whole tree is listed, and
    ``bar`` says which folder is being read. Hidden files and folders are passed over, and so
    are links to folders; a folder that cannot be read is put in ``unreadable``.
    """
    for path in paths:
        if path.is_dir():
            yield from ((found, False) for found in _files_under(path, bar, unreadable)
                        if not _is_claude_subagent(found))
        else:
            yield path, True


def _files_under(folder: Path, bar: Bar | None,
                 unreadable: list[Path] | None) -> Iterator[Path]:
    if bar is not None:
        bar.describe(str(folder))
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda entry: entry.name)
    except OSError:
        if unreadable is not None:
            unreadable.append(folder)
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
            is_file = not is_dir and entry.is_file()
        except OSError:
            continue  # gone since it was listed
        if is_dir:
            yield from _files_under(Path(entry.path), bar, unreadable)
        elif is_file and os.path.splitext(entry.name)[1].lower() in TRANSCRIPT_SUFFIXES:
            yield Path(entry.path)


@dataclass(slots=True)
class ImportReport:
    """What ``dsh import`` did, per file (``--json`` keys: imported, skipped, failed, ignored)."""

    imported: list[tuple[str, str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str, str, str]] = field(default_factory=list)
    ignored: list[tuple[str, str, str, str]] = field(default_factory=list)
    updated: list[tuple[str, str, int]] = field(default_factory=list)
    superseded: list[tuple[str, str, str]] = field(default_factory=list)
    cut: list[tuple[str, int]] = field(default_factory=list)
    completed: list[tuple[str, str, int]] = field(default_factory=list)
    erased: list[tuple[str, str]] = field(default_factory=list)

    def _lists(self) -> tuple[list[Any], ...]:
        return (self.imported, self.skipped, self.failed, self.ignored, self.updated,
                self.superseded, self.completed, self.erased)

    def sizes(self) -> tuple[int, ...]:
        """How many outcomes of each kind are recorded (to print only what comes next)."""
        return tuple(len(entries) for entries in self._lists())

    def since(self, sizes: tuple[int, ...]) -> tuple[list[Any], ...]:
        """The outcomes of each kind recorded after :meth:`sizes` returned ``sizes``."""
        return tuple(entries[size:] for entries, size in zip(self._lists(), sizes, strict=True))

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` summary with stable keys.

        ``updated``: events appended to a session whose source grew; ``superseded``: a source
        that changed where it was imported, imported again as a new session (``by``);
        ``cut``: a live log whose last line was still being written, left out (``line``);
        ``completed``: a session an interrupted import left half-written, completed
        (``appended``) and listed again (docs/interop.md#staged-imports); ``erased``: a source
        whose session was erased or purged, not imported again (``--include-erased`` imports
        it; docs/forgetting.md#erasure-and-import).
        """
        return {
            "imported": [{"path": p, "session": s, "format": f} for p, s, f in self.imported],
            "updated": [{"path": p, "session": s, "appended": n} for p, s, n in self.updated],
            "superseded": [{"path": p, "session": s, "by": n} for p, s, n in self.superseded],
            "skipped": [{"path": p, "session": s} for p, s in self.skipped],
            "failed": [{"path": p, "reason": r, "code": c, "kind": k}
                       for p, r, c, k in self.failed],
            "ignored": [{"path": p, "reason": r, "code": c, "kind": k}
                        for p, r, c, k in self.ignored],
            "cut": [{"path": p, "line": n} for p, n in self.cut],
            "completed": [{"path": p, "session": s, "appended": n}
                          for p, s, n in self.completed],
            "erased": [{"path": p, "session": s} for p, s in self.erased],
        }


def _reason(error: DshError) -> str:
    return " ".join(error.message.split())


def _outcome(shown: str, error: DshError, prefix: str = "", suffix: str = ""
             ) -> tuple[str, str, str, str]:
    """A failed or ignored file: ``(path, reason, code, kind)`` (``--json`` keys)."""
    kind = error.kind if isinstance(error, ImportFormatError) else "invalid"
    return shown, prefix + _reason(error) + suffix, error.code, kind


def _stored_count(persistence: Persistence, session_id: str) -> int:
    with persistence.open(session_id, "read") as handle:
        return len(handle.read(0).events)


class _FileBar:
    """The progress bar while one file is imported: its bytes counted as batches are read."""

    def __init__(self, bar: Bar, size: int) -> None:
        self._bar = bar
        self._size = size
        self._done = 0

    def describe(self, text: str) -> None:
        """Say what is being done now (see :meth:`Bar.describe`)."""
        self._bar.describe(text)

    def reached(self, offset: int | None) -> None:
        """The file is read up to byte ``offset`` (None: unknown, nothing moves)."""
        if offset is not None and min(offset, self._size) > self._done:
            self._bar.advance(min(offset, self._size) - self._done)
            self._done = min(offset, self._size)

    def finish(self) -> None:
        """The file is done (imported, skipped or failed): count the rest of its bytes."""
        self.reached(self._size)


def _import_one(persistence: Persistence, path: Path, fmt: str, explicit: bool,
                report: ImportReport, bar: _FileBar, include_erased: bool = False) -> None:
    """Import one file: streamed (docs/interop.md#streaming-imports) or validated whole first."""
    from dsh.interop import STREAMING_FORMATS, detect_format, import_file

    shown = str(path)
    try:
        detected = detect_format(path) if fmt == "auto" else fmt
    except ImportFormatError as error:
        # Found by walking a folder: a file that is not a transcript at all is ignored; one
        # that is JSON records with damage (a torn last line, a bad line) failed; so is JSON
        # text in the wrong encoding (not UTF-8, UTF-16/32: a transcript saved badly); binary
        # bytes (a NUL byte that is no UTF-16/32) are not a transcript (docs/cli.md#commands).
        # Told by the kind the raising site gave, never by the message's words.
        damaged = error.kind == "invalid" and "line" in error.where
        if explicit or damaged or _misencoded_json(path, error):
            report.failed.append(_outcome(shown, error))
        else:
            report.ignored.append(_outcome(shown, error))
        return
    if detected in STREAMING_FORMATS:
        with _uninterrupted():
            _stream_file(persistence, path, shown, detected, report, bar, include_erased,
                         explicit=explicit)
        return
    try:
        sessions = [s for top in import_file(path, detected) for s in top.walk()]
        # Validate every session of the file first (seed rules, docs/rules.md#seed-validation), so a
        # bad file writes nothing at all.
        built = [(s, s.to_session()) for s in sessions]
    except DshError as error:
        _refused(report, explicit, error, _outcome(shown, error))
        return
    _note_cut(report, path, shown, sessions)
    with _uninterrupted():
        _write_file(persistence, built, shown, detected, report, include_erased)


def _refused(report: ImportReport, explicit: bool, error: DshError,
             outcome: tuple[str, str, str, str]) -> None:
    """Count a refused file: an empty one found in a folder is ignored, any other failed.

    Rule (docs/cli.md#commands): a file of no bytes but blanks holds no session, so it is no
    transcript to fail on every import of its folder (Claude Code leaves empty ones); named on
    the command line, it fails as any other.
    """
    empty = isinstance(error, ImportFormatError) and error.kind == "empty"
    (report.ignored if empty and not explicit else report.failed).append(outcome)


def _misencoded_json(path: Path, error: ImportFormatError) -> bool:
    """Whether ``error`` refused JSON text in the wrong encoding (rule: docs/cli.md#commands).

    True when the bytes are UTF-16/32 or not UTF-8 without a NUL byte, and the file's first
    character (past blanks and a byte order mark) is ``{`` or ``[``.
    """
    if error.kind != "encoding":
        return False
    try:
        with path.open("rb") as f:  # a regular file: the error came from reading it whole
            head = f.read(64)
    except OSError:  # gone or unreadable since: the refusal stands as it was (ignored)
        return False
    # NUL bytes are passed over too, so UTF-16/32 JSON counts.
    return head.lstrip(b"\xef\xbb\xbf\xff\xfe\x00 \t\r\n")[:1] in (b"{", b"[")


def _note_cut(report: ImportReport, path: Path, shown: str,
              sessions: Iterable[ImportedSession | StreamedSession]) -> None:
    report.cut.extend(sorted({(s.source_path if s.source_path != str(path.resolve()) else shown,
                               s.torn_line) for s in sessions if s.torn_line is not None}))


def _stream_file(persistence: Persistence, path: Path, shown: str, detected: str,
                 report: ImportReport, bar: _FileBar, include_erased: bool = False, *,
                 explicit: bool = True) -> None:
    """Import a file session by session as it is read, a batch at a time.

    Every line is decoded and the branch chosen before the first write (the first of the two
    reads), so a damaged file writes nothing. A session of more than one batch is written
    staged: in the trash (hidden from ``dsh ls``) until its last batch is durable, then given
    back; a failure later (a record that cannot be mapped, found only when its batch is read;
    a full disk) leaves it there, listed by nobody, and the next import of the file completes
    it (docs/interop.md#staged-imports).
    """
    from dsh.interop import collect, stream_file

    streamed: list[StreamedSession] = []
    staged: list[str] = []  # the session being written staged, while it is
    try:
        for stream in stream_file(path, detected):
            streamed.append(stream)
            sid = stream.session_id
            if persistence.exists(sid):
                # Imported before: compared whole with what is stored (re-import rules).
                imported = collect([dataclass_replace(stream, parent=None)])[0]
                _write_file(persistence, [(imported, imported.to_session())], shown, detected,
                            report, include_erased)
                _publish_leftover(persistence, sid, report)
                continue
            _write_stream(persistence, stream, bar, staged)
            report.imported.append((shown, sid, stream.source_format or detected))
    except DshError as error:
        kept = (f" (nothing of it is listed: the events written so far wait in the trash "
                f"as session {staged[0]}, and importing the fixed file completes them)"
                ) if staged else ""
        _refused(report, explicit, error, _outcome(shown, error, suffix=kept))
        return
    _note_cut(report, path, shown, streamed)


def _publish_leftover(persistence: Persistence, sid: str, report: ImportReport) -> None:
    """Give back a session an interrupted staged import left in the trash, once complete.

    Runs after the re-import rules brought the stored session up to its source (skipped as
    the same, or appended to); its outcome becomes ``completed`` (the events appended). A
    source that changed was imported as a new session instead, and the leftover stays in the
    trash (the trash policies purge it).
    """
    from dsh.rights import restore, store_log

    entry = store_log(persistence).trash.get(sid)
    if entry is None or entry.reason != STAGING_REASON or entry.purged_ms is not None:
        return
    # Its outcome is the completion, not "already imported" or "the source grew".
    done: tuple[str, str, int] | None = None
    for skipped in [s for s in report.skipped if s[1] == sid]:
        report.skipped.remove(skipped)
        done = (skipped[0], sid, 0)
    for updated in [u for u in report.updated if u[1] == sid]:
        report.updated.remove(updated)
        done = updated
    for imported in [i for i in report.imported if i[1] == sid]:  # killed before any event
        report.imported.remove(imported)
        done = (imported[0], sid, _stored_count(persistence, sid))
    if done is not None:
        restore(persistence, [sid], by="dsh import")
        report.completed.append(done)


def _write_stream(persistence: Persistence, stream: StreamedSession, bar: _FileBar,
                  staged: list[str]) -> int:
    """Validate and write one new streamed session; return the events written.

    Each batch passes the session's seed validation (:class:`dsh.session.SeedStream`) before it is
    appended and flushed (a batch at a time, so the store keeps nothing of it pending: memory
    stays one batch whatever the store; docs/interop.md#streaming-imports). The first two
    batches are read before anything is written: a session of one batch is created and written
    at once; a longer one is staged in the trash (``staged`` names it meanwhile) and given
    back after the flush (docs/interop.md#staged-imports).

    Raises:
        ImportFormatError: a batch the importer or seed validation refused.
        DshError: a write the store refused.
    """
    from dsh.interop import ImportBatch
    from dsh.rights import restore, trash
    from dsh.session import SeedStream

    sid = stream.session_id
    opened: list[Handle] = []

    def stored(start: int, stop: int) -> Sequence[Event]:
        return opened[0].read(start).events[:stop - start]

    inherited = stream.header.get("seedLength", 0)
    try:
        # owned: each batch is the importer's alone, so its events are frozen in place
        seed = SeedStream(sid, header=stream.header, reader=stored,
                          inherited_event_count=inherited if isinstance(inherited, int) else 0,
                          owned=True)
    except EventRejectedError as exc:
        raise stream.refused(exc, ImportBatch([], [])) from exc
    batches = iter(stream.batches)
    head = [batch for batch in (next(batches, None), next(batches, None)) if batch is not None]
    persistence.create(stream.header)
    if len(head) > 1:
        trash(persistence, [sid], reason=STAGING_REASON, by="dsh import")
        staged.append(sid)
    done = 0
    with persistence.open(sid, "write") as handle:
        opened.append(handle)
        for batch in chain(head, batches):
            try:
                events = seed.admit(batch.events)
            except EventRejectedError as exc:
                raise stream.refused(exc, batch) from exc
            handle.append(events)
            # Flushed batch by batch: a store that seals at flush (JSONL) would otherwise hold
            # every event of the session until the end (444 MB for a 44 MB transcript).
            handle.flush()
            seed.settle()
            done += len(events)
            bar.describe(f"{sid[:8]}… {done:,} events")
            if stream.parent is None:  # a child's lines are not where the file was read
                bar.reached(batch.end)
        try:
            seed.finish()
        except EventRejectedError as exc:
            raise stream.refused(exc, ImportBatch([], [])) from exc
        handle.flush()
    if staged:
        restore(persistence, [sid], by="dsh import")
        staged.clear()
    return done


@contextmanager
def _uninterrupted() -> Iterator[None]:
    """Defer Ctrl+C until a file's sessions are written, so none is left half-imported.

    Reading and validating a file stay interruptible (nothing is written then); the writes of
    one file (create, append, flush per session) finish first, then the interrupt is raised.
    """
    with deferred_interrupts() as caught:
        yield
    if caught:
        raise KeyboardInterrupt


def _write_file(persistence: Persistence, built: list[tuple[ImportedSession, Session]],
                shown: str, detected: str, report: ImportReport,
                include_erased: bool = False) -> None:
    """Write the validated sessions of one file (the report gets one outcome each)."""
    for imported, session in built:
        sid = imported.session_id
        stored = _stored_count(persistence, sid) if persistence.exists(sid) else None
        if stored:
            newer = _reimport(persistence, imported, shown, report, include_erased)
            if newer is None:
                continue
            imported, session, sid, stored = newer, newer.to_session(), newer.session_id, None
        try:
            if stored is None:
                persistence.create(session.header)
            # The importer's events exactly (the Session added only its end-seed marker), a
            # batch at a time: one batch's rows are encoded at once, not the whole log's.
            events, count = session.events, len(imported.events)
            with persistence.open(sid, "write") as handle:
                for start in range(0, count, WRITE_BATCH_EVENTS):
                    handle.append(events[start:min(count, start + WRITE_BATCH_EVENTS)])
                    handle.flush()
        except DshError as error:
            report.failed.append(_outcome(shown, error, prefix=f"{sid}: "))
            return
        report.imported.append((shown, sid, imported.source_format or detected))


def _reimport(persistence: Persistence, fresh: ImportedSession, shown: str,
              report: ImportReport, include_erased: bool = False) -> ImportedSession | None:
    """A source imported before: append what it gained, or give the superseding session.

    A stored session that was erased or purged (its log holds a ``redaction/applied {mode:
    "erasure"}`` record) is the tombstone of its source's identity: the source is not imported
    again (outcome ``erased``) unless ``include_erased``, whatever the file holds now (it is
    the same conversation; docs/forgetting.md#erasure-and-import).

    Returns the session still to write (a changed source under a new id, not yet stored), or
    None when this is done (skipped, appended, erased before or already superseded).
    """
    from dsh.interop import plan_reimport, superseding

    sid = fresh.session_id
    read = persistence.read(sid)
    if not include_erased and _was_erased(read.stored_events):
        report.erased.append((shown, sid))
        return None
    plan = plan_reimport(read.stored_events, fresh)
    if plan.kind == "same":
        report.skipped.append((shown, sid))
        return None
    if plan.kind == "append":
        # Validated as one log with what is stored (seed rules), then appended as Events.
        known = len(read.stored_events)
        grown = Session.create(sid, seed=[*read.stored_events, *plan.events],
                               header=read.header,
                               inherited_event_count=read.header.get("seedLength") or 0)
        with persistence.open(sid, "write") as handle:
            handle.append(grown.events[known:known + len(plan.events)])
            handle.flush()
        report.updated.append((shown, sid, len(plan.events) - 1))
        return None
    newer = superseding(fresh, sid, plan.changed_at)
    if persistence.exists(newer.session_id):
        # imported so before: compare
        return _reimport(persistence, newer, shown, report, include_erased)
    report.superseded.append((shown, sid, newer.session_id))
    return newer


def _was_erased(events: Sequence[Any]) -> bool:
    """Whether a stored log holds an erasure's record (``redaction/applied {mode: "erasure"}``).

    Both ``dsh erase`` and ``dsh rm --purge`` append one to every session they tombstone
    (docs/forgetting.md#erasure); a redaction's record has another mode.
    """
    for event in events:
        if event.get("type") == "redaction/applied":
            data = event.get("data")
            if isinstance(data, Mapping) and data.get("mode") == "erasure":
                return True
    return False


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # gone or unreadable: the import itself says so
        return 0


@contextmanager
def _bulk_gc() -> Iterator[None]:
    """Run the cycle collector less often while importing.

    An import allocates millions of short-lived, acyclic containers (decoded records, events):
    at the default thresholds the young collections run every 700 of them and the full ones
    walk whatever the import holds (a third of the CPU time of a large Claude Code import when
    its branch index was held as dicts). Garbage without cycles is freed by reference counting
    whatever the thresholds.
    """
    previous = gc.get_threshold()
    gc.set_threshold(_GC_THRESHOLD, 20, 100)
    try:
        yield
    finally:
        gc.set_threshold(*previous)


_GC_THRESHOLD: Final = 50_000
"""Allocations between young-generation collections during an import (CPython's default: 700)."""


def _import_paths(persistence: Persistence, paths: Sequence[Path], fmt: str,
                  console: Console, *, verbose: bool = False,
                  include_erased: bool = False) -> ImportReport:
    with _bulk_gc():
        return _import_all(persistence, paths, fmt, console, verbose=verbose,
                           include_erased=include_erased)


def _import_all(persistence: Persistence, paths: Sequence[Path], fmt: str,
                console: Console, *, verbose: bool, include_erased: bool) -> ImportReport:
    report = ImportReport()
    unreadable: list[Path] = []
    with progress("looking for transcripts in") as scan:  # a spinner: `dsh import /` is long
        files = list(_walk(paths, scan, unreadable))
    if unreadable:
        console.print(f"note: {render.plural(len(unreadable), 'folder')} could not be read and "
                      f"{'was' if len(unreadable) == 1 else 'were'} passed over: "
                      + ", ".join(map(str, unreadable[:3]))
                      + (", …" if len(unreadable) > 3 else ""), markup=False, highlight=False)
    for path, explicit in files:
        if explicit and not path.exists():
            raise ConfigError(f"cannot import {path}: {_why_missing(path)}", path=str(path),
                              code="PATH_NOT_FOUND")
    for path in paths:
        if path.is_dir() and not any(found.parent.is_relative_to(path) for found, _ in files):
            console.print(f"note: {path} holds no transcript file (looked for "
                          f"{', '.join(sorted(TRANSCRIPT_SUFFIXES))} outside hidden folders)",
                          markup=False, highlight=False)
    out = None if STATE.json else stdout_console()
    done = 0
    sizes = [_size(path) for path, _ in files]
    with progress("importing", total=sum(sizes), bytes_=True) as bar:
        shown = report.sizes()

        def show_outcome() -> None:
            # Each file's outcome as it happens, above the bar; never twice, never half: an
            # interrupt waits until the line is out and counted.
            nonlocal shown, done
            with _uninterrupted():
                if report.sizes() != shown:
                    done += 1
                    new = list(report.since(shown))
                    if not verbose:  # not transcripts: counted, listed with --verbose
                        new[3] = []
                    if out is not None and any(new):
                        out.print(render.render_import_summary(*new, counts=False))
                    shown = report.sizes()

        try:
            for (path, explicit), size in zip(files, sizes, strict=True):
                bar.describe(path.name)
                file_bar = _FileBar(bar, size)
                _import_one(persistence, path, fmt, explicit, report, file_bar, include_erased)
                show_outcome()
                file_bar.finish()
        except KeyboardInterrupt:
            # An interrupt deferred while a file was written arrives once it is complete:
            # that file's outcome is recorded, so it is listed like the others.
            show_outcome()
            console.print(f"interrupted after {done} of {render.plural(len(files), 'file')}: "
                          "what is listed above was imported; the file being read when "
                          "interrupted left nothing behind", markup=False, highlight=False)
            raise
    return report


def _why_missing(path: Path) -> str:
    """Why ``path``, named on the command line, cannot be read: absent, a loop, a dangling link."""
    loop = "it is a symlink loop (a link that leads back to itself); name the real file"
    try:
        path.resolve(strict=True)
    except RuntimeError:  # Python 3.11 raises this for a loop of links
        return loop
    except OSError as error:
        if error.errno == errno.ELOOP:
            return loop
        if path.is_symlink():
            return (f"it is a symlink to {os.readlink(path)}, which does not exist; point the "
                    "link at a file, or name the real file")
    return ("no such file or folder; check the path ('dsh import' without one reads your "
            "Claude Code and Codex logs)")


def _default_roots(examples: bool, err: Console) -> list[Path]:
    """What ``dsh import`` reads without a path: the bundled examples, or the user's own logs.

    Raises:
        ConfigError: code ``NOTHING_TO_IMPORT`` when there is nothing of the kind asked for.
    """
    if examples:
        bundled = examples_dir()
        if bundled is None:
            raise ConfigError("this install has no bundled examples (they are package data "
                              "of dsh); reinstall dsh, or pass a file or folder to import",
                              code="NOTHING_TO_IMPORT")
        err.print(f"importing the bundled examples from {bundled}", markup=False,
                  highlight=False)
        return [bundled]
    roots = user_log_dirs()
    if not roots:
        home = Path.home()
        raise ConfigError(f"nothing to import: no Claude Code or Codex logs in "
                          f"{home / '.claude' / 'projects'} or {home / '.codex' / 'sessions'}; "
                          "pass a file or folder, or try the bundled examples with "
                          "'dsh import --examples'", code="NOTHING_TO_IMPORT")
    err.print(f"importing your agent logs from {', '.join(map(str, roots))}", markup=False,
              highlight=False)
    return roots


def _given_paths(texts: Sequence[str]) -> list[Path]:
    # An empty text is refused, not read as '.': `dsh import "$UNSET"` must not import the
    # current folder (docs/cli.md#exit-status-and-errors).
    for position, text in enumerate(texts, 1):
        if not text:
            raise typer.BadParameter(
                f"path {position} is empty; name a transcript file or a folder ('.' for this "
                "folder), or give no path to import your own agent logs", param_hint="'PATH'")
    return [Path(text) for text in texts]


def import_(
    paths: Annotated[list[str] | None, typer.Argument(
        metavar="PATH", show_default=False,
        help="Files or folders to import. Without a path: your own Claude Code and Codex logs "
             "(~/.claude/projects, ~/.codex/sessions).")] = None,
    examples: Annotated[bool, typer.Option(
        "--examples", help="Import the transcripts bundled with dsh (a demo), nothing else.")
    ] = False,
    format: Annotated[ImportFormat, typer.Option(
        "--format", help="Source format; auto detects it per file.")] = ImportFormat.auto,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Also list each file found in a folder that is not a "
                                "transcript (they are counted either way).")] = False,
    include_erased: Annotated[bool, typer.Option(
        "--include-erased", help="Also import again a transcript whose session was erased "
                                 "(dsh erase, dsh rm --purge); skipped otherwise.")] = False,
    store: StoreOption = None,
    wait: WaitOption = DEFAULT_WAIT_S,
    json_: JsonOption = False,
) -> None:
    """Import transcripts of other agents (and dsh logs) into the store.

    Re-importing is idempotent: a source file maps to a stable session id; a session already in
    the store is skipped, gets the records its source gained appended, or (when the part
    imported before changed) the source is imported as a new session that names the old one.
    A source whose session was erased or purged is skipped, saying so (--include-erased
    imports it again).
    A file that fails to read or validate leaves nothing behind in the store; a write the store
    refuses part-way (a full disk) leaves a prefix the next import of the file completes. Exit 1
    when a file failed.
    """
    json_mode(json_)
    err = stderr_console()
    if examples and paths:
        raise typer.BadParameter("give paths or --examples, not both",
                                 param_hint="'PATH' / '--examples'")
    roots = _given_paths(paths) if paths else _default_roots(examples, err)
    with cli_store(store, wait=wait) as sessions:
        report = _import_paths(sessions.persistence, roots, str(format.value), err,
                               verbose=verbose, include_erased=include_erased)
    if report.erased:
        # On stderr in both modes: the --json summary lists them under "erased".
        err.print(f"note: skipped {render.plural(len(report.erased), 'transcript')} erased "
                  "before (dsh erase, dsh rm --purge); pass --include-erased to import "
                  f"{'it' if len(report.erased) == 1 else 'them'} again", markup=False,
                  highlight=False)
    if json_:
        render.write_json(report.to_json())
    else:
        for path, line in report.cut:
            err.print(f"note: {path}: its last line ({line}) is cut off, still being written "
                      "(no newline, not JSON yet); the complete lines before it were imported: "
                      "import it again once it is complete", markup=False,
                      highlight=False)
        stdout_console().print(render.render_import_counts(
            report.imported, report.skipped, report.failed, report.ignored, report.updated,
            report.completed, ignored_listed=verbose, erased=report.erased))
    if report.failed:
        raise typer.Exit(EXIT_FAILED)


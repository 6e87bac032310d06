"""``dsh resume``, ``fork``, ``compact``: the commands that append to a session."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dsh import (
    CompactionError,
    DigestSummarizer,
    PersistenceError,
    SessionForkError,
    Store,
    compact_now,
    compact_surface_region,
)
from dsh.cli import _render as render
from dsh.cli._common import (
    DEFAULT_WAIT_S,
    JsonOption,
    SessionArg,
    StoreOption,
    WaitOption,
    cli_store,
    fresh_session_id,
    import_again_hint,
    json_mode,
    refuse_empty_id,
    refuse_unprintable_id,
    require_session,
    restored_session,
    staged_imports,
    stdout_console,
)
from dsh.cli._progress import progress

if TYPE_CHECKING:
    from dsh.compaction import CompactionResult

def resume(session_id: SessionArg, store: StoreOption = None,
           wait: WaitOption = DEFAULT_WAIT_S, json_: JsonOption = False) -> None:
    """Commit the repair of an interrupted turn: results for unanswered calls, step, turn end.

    Takes the session's write lock, truncates a torn tail, appends the closers and flushes; a
    balanced log is left untouched (docs/rules.md#the-read-pipeline).

    Raises:
        PersistenceError: code ``IMPORT_INCOMPLETE`` for a session a ``dsh import`` left
            half-written (docs/interop.md#staged-imports): importing its file again completes it.
    """
    json_mode(json_)
    with cli_store(store, create=False, wait=wait) as sessions:
        session_id = require_session(sessions, session_id, writes=True)
        if session_id in staged_imports(sessions.persistence):
            hint = import_again_hint(sessions.persistence.read(session_id).stored_events)
            raise PersistenceError(
                f"session {session_id!r} is a half-written import ('dsh import' stopped before "
                f"the end of its file; it waits in the trash): run '{hint}' again to complete "
                "it; resume would close a turn the file goes on with",
                code="IMPORT_INCOMPLETE", session_id=session_id)
        inspection = sessions.persistence.load(session_id)
    closers = list(inspection.closers)
    torn = inspection.torn.reason if inspection.torn is not None else None
    if json_:
        render.write_json({"id": session_id, "closers": closers, "tornTail": torn,
                           "events": len(inspection.events)})
        return
    out = stdout_console()
    if torn:
        out.print(f"{session_id}: truncated a torn tail ({torn})", markup=False)
    if closers:
        out.print(f"{session_id}: closed interrupted turn with "
                  f"{render.plural(len(closers), 'event')} at seq "
                  f"{closers[0]['seq']}–{closers[-1]['seq']} "
                  f"({', '.join(c['type'] for c in closers)})", markup=False)
    elif not torn:
        out.print(f"{session_id}: nothing to repair (no open turn)", markup=False)


def _boundary_for_people(sessions: Store, session_id: str, at: int) -> SessionForkError:
    """``dsh fork --at SEQ``'s one-line refusal of a seq the session does not have.

    Rule (docs/errors.md, ``INVALID_BOUNDARY``): what was wrong, the seqs the session has and
    what to pass, each once (the library's message plus ``(seq=N)`` said the seq twice).
    """
    count = len(sessions.read(session_id).stored_events)
    if not count:
        return SessionForkError(
            f"--at {at}: session {session_id!r} has no events to fork at; leave --at out to "
            "fork it as it is", code="INVALID_BOUNDARY", session_id=session_id)
    return SessionForkError(
        f"--at {at}: session {session_id!r} has no event at seq {at}, its seqs run from 0 to "
        f"{count - 1}; pass --at a seq in that range ('dsh events {session_id}' lists them), or "
        "leave --at out to fork at its last event", code="INVALID_BOUNDARY",
        session_id=session_id)


def fork(
    session_id: SessionArg,
    at: Annotated[int | None, typer.Option(
        "--at", metavar="SEQ", show_default=False,
        help="Last inherited seq, inclusive (default: the last event).")] = None,
    as_: Annotated[str | None, typer.Option(
        "--as", metavar="NEW", show_default=False,
        callback=refuse_empty_id("give the child's id, or leave --as out for a new random one"),
        help="Child session id (default: a new random id whose first 8 characters no "
             "other session starts with, so short prefixes stay unique).")] = None,
    store: StoreOption = None,
    wait: WaitOption = DEFAULT_WAIT_S,
    json_: JsonOption = False,
) -> None:
    """Fork a session: the child inherits events 0..SEQ and continues on its own.

    A cut inside a turn closes it in the child with ``forked`` closers (docs/rules.md#fork); the
    parent's log is not changed.
    """
    json_mode(json_)
    refuse_unprintable_id(as_, "'--as'")
    with cli_store(store, create=False, wait=wait) as sessions:
        session_id = require_session(sessions, session_id)
        try:
            child_id = sessions.fork(session_id, at,
                                     child_id=as_ or fresh_session_id(sessions))
        except SessionForkError as error:
            if error.code == "INVALID_BOUNDARY" and at is not None:
                raise _boundary_for_people(sessions, session_id, at) from error
            if error.code != "SESSION_ALREADY_EXISTS":
                raise
            raise SessionForkError(f"{error.message}; choose another id with --as",
                                   code=error.code, **error.where) from error
        child = sessions.read(child_id)
        seed_length = child.header.get("seedLength")
        events = len(child.stored_events)
        outcome: dict[str, Any] = {"id": child_id, "parent": session_id,
                                   "boundary": seed_length - 1 if seed_length else None,
                                   "seedLength": seed_length, "events": events}
    if json_:
        render.write_json(outcome)
        return
    stdout_console().print(f"forked {session_id} at seq {outcome['boundary']} as {outcome['id']} "
                           f"({render.plural(events, 'event')})", markup=False)


def _parse_range(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    start, sep, end = value.partition(":")
    if not sep or not start.strip().isdigit() or not end.strip().isdigit():
        raise typer.BadParameter(f"expected A:B (two surface seqs), got {value!r}",
                                 param_hint="'--range'")
    return int(start), int(end)


class SummarizerName(enum.StrEnum):
    """``--summarizer`` of ``dsh compact``."""

    digest = "digest"


def compact(
    session_id: SessionArg,
    range_: Annotated[str | None, typer.Option(
        "--range", metavar="A:B", show_default=False,
        help="Surface seqs to replace, inclusive (default: all but the newest balanced "
             "unit).")] = None,
    summarizer: Annotated[SummarizerName, typer.Option(
        "--summarizer", help="How to write the checkpoint (digest: offline, deterministic).")
    ] = SummarizerName.digest,
    store: StoreOption = None,
    wait: WaitOption = DEFAULT_WAIT_S,
    json_: JsonOption = False,
) -> None:
    """Compact a span of the model surface into one checkpoint message.

    Rehearses the compaction on a detached copy first (the digest summarizer is
    deterministic), so a refusal (a span too small to be worth compacting, a summary that
    would not shrink it) or "nothing to compact" writes nothing. Otherwise resumes the session
    (repairing an interrupted turn), runs a manual compaction between turns
    (docs/rules.md#the-transaction, docs/rules.md#automatic-compaction) and flushes.
    """
    json_mode(json_)
    span = _parse_range(range_)
    digest = DigestSummarizer()

    def run_on(session: Any, flush: Callable[[], None] | None) -> CompactionResult | None:
        if span is None:
            return compact_now(session, summarizer=digest, flush=flush)
        return compact_surface_region(session, span[0], span[1], summarizer=digest,
                                      flush=flush)

    with cli_store(store, create=False, wait=wait) as sessions, progress("compacting") as bar:
        bar.describe("reading the log")
        read = sessions.read(require_session(sessions, session_id, writes=True))
        session_id = str(read.header["id"])
        try:
            bar.describe("rehearsing on a copy")
            rehearsal = run_on(restored_session(read), None)
        except CompactionError as error:
            if error.code != "SUMMARY":
                raise
            # Too small to be worth a checkpoint, or a summary that would not shrink it: a
            # finding, not a failure; nothing was written.
            reason = " ".join(error.message.split()).removesuffix("; nothing was written")
            if json_:
                render.write_json({"id": session_id, "compacted": False, "reason": reason})
            else:
                stdout_console().print(f"{session_id}: nothing worth compacting: {reason}",
                                       markup=False)
            return
        result = None
        if rehearsal is not None:
            bar.describe("resuming the session")
            session = sessions.session(session_id)

            def flush() -> None:
                sessions.flush(session)

            bar.describe("compacting and writing")
            result = run_on(session, flush)
            sessions.flush(session)
    outcome: dict[str, Any] | None = None if result is None else {
        "id": session_id, "compactionId": result.compaction_id,
        "startSeq": result.start_seq, "summarySeq": result.summary_seq,
        "checkpointSeq": result.replacement_seq, "endSeq": result.end_seq,
        "shadowedRange": list(result.shadowed_range),
        "shadowedSeqs": list(result.shadowed_seqs),
        "shadowedTokenCount": result.shadowed_token_count,
        "checkpointTokenCount": result.checkpoint_token_count,
    }
    if json_:
        render.write_json(outcome)
        return
    if outcome is None:
        stdout_console().print(
            f"{session_id}: nothing to compact (the surface is one balanced unit)", markup=False)
        return
    shadowed = outcome["shadowedSeqs"]
    stdout_console().print(
        f"{session_id}: compacted {render.plural(len(shadowed), 'surface message')} "
        f"(#{shadowed[0]}–#{shadowed[-1]}, ~{outcome['shadowedTokenCount']} tokens) into "
        f"checkpoint #{outcome['checkpointSeq']} (~{outcome['checkpointTokenCount']} tokens)",
        markup=False)


"""``dsh verify``: the read pipeline and every log invariant, per session."""

from __future__ import annotations

import gc
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast

import typer

from dsh import (
    ConfigError,
    DshError,
    Violation,
)
from dsh._errors import printable
from dsh.cli import _render as render
from dsh.cli._common import (
    STORED_ID_FIX,
    JsonOption,
    StoreOption,
    cli_store,
    import_again_hint,
    json_mode,
    refuse_empty_id,
    require_session,
    staged_imports,
    stderr_console,
    stdout_console,
)
from dsh.cli._errors import EXIT_FAILED
from dsh.cli._progress import progress

if TYPE_CHECKING:
    from collections.abc import Mapping

    from dsh.persistence import ChainProof, Persistence

def _where_seq(error: DshError) -> int | None:
    for key in ("seq", "seed_index"):
        value = error.where.get(key)
        if isinstance(value, int):
            return value
    return None


def _verify(persistence: Persistence, session_id: str, notes: list[str],
            restore_points: dict[str, dict[str, object]], proofs: dict[str, ChainProof],
            kept: Mapping[str, Mapping[str, object]] | None, proof: bool,
            staged: bool = False) -> list[Violation]:
    """Check one stored session: the read pipeline, then :func:`dsh._verify.verify_events`.

    Rules: docs/rules.md#the-read-pipeline (read pipeline: a refusal is one violation with its error
    code); then every rule of :func:`dsh._verify.verify_events`. The restore point is
    checked against the full read: a warning when a resume would ignore it (one that matches
    is only entered in ``restore_points``, for the caller to count), and a
    ``RESTORE_POINT_MISMATCH`` violation when a resume would use it yet it does not match, a
    ``RESTORE_POINT_FORGED`` one when its digest is not one the integrity seal recorded
    (docs/rules.md#restore-points-are-never-the-truth). Then the seal chain against the events,
    and a kept proof when given (docs/formats.md#the-seal-chain, docs/cli.md#chain-proofs).
    A ``staged`` session (a half-written import) is noted as one, to be imported again, not
    resumed (docs/interop.md#staged-imports).
    """
    from dsh._verify import verify_events
    from dsh.cli._proof import attribute, check_chain

    try:
        cuts = persistence.saved_cuts(session_id)
    except DshError:  # no log to find (a FIFO or a link where it belongs): the read names it
        cuts = ()
    notes.extend(f"{session_id}: {cut} holds what a torn-tail repair cut from the log; "
                 "inspect it, then delete it" for cut in cuts)
    try:
        read = persistence.read(session_id)
    except DshError as error:
        seq, message = attribute(persistence, session_id, error)
        where = _where_seq(error)
        return [Violation(where if where is not None else seq, error.code, message, session_id)]
    stored = read.stored_events  # one copy of the log without its closers, for every check
    if read.torn is not None:
        notes.append(f"{session_id}: torn tail after the committed log ({read.torn.reason}); "
                     "'dsh resume' truncates it")
    if staged:
        notes.append(f"{session_id}: a half-written import ('dsh import' stopped before the end "
                     "of its file; it waits in the trash): run "
                     f"'{import_again_hint(stored)}' again to complete it")
    elif read.closers:
        notes.append(f"{session_id}: the last turn is open (interrupted); 'dsh resume' closes it")
    check = persistence.check_restore_point(session_id, read)
    restore_points[session_id] = {"status": check.status, "eventCount": check.event_count,
                               "message": check.message}
    rule = {"misleading": "RESTORE_POINT_MISMATCH", "forged": "RESTORE_POINT_FORGED"}
    found = [Violation(None, rule[check.status], check.message, session_id)
             ] if check.status in rule else []
    found += check_chain(persistence, session_id, stored, proofs, kept,
                         notes if proof or kept is not None else None)
    if check.status == "ignored":  # a consistent one is counted by the caller
        notes.append(f"{session_id}: {check.message}")
    return found + [replace(v, session_id=session_id)
                    for v in verify_events(stored, header=read.header,
                                          closers=read.closers)]


def verify(
    session_id: Annotated[str | None, typer.Argument(
        metavar="ID", show_default=False, callback=refuse_empty_id(STORED_ID_FIX),
        help="Session to verify (a unique prefix of its id will do).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Verify every session.")] = False,
    receipt: Annotated[Path | None, typer.Option(
        "--receipt", metavar="FILE", show_default=False,
        help="Check an erasure or redaction receipt against the store instead.")] = None,
    reseal: Annotated[bool, typer.Option(
        "--reseal", help="Rebuild the integrity seal of ID over its log as it is now (after "
        "SEAL_MISSING or another SEAL_* error: a lost seal is never rebuilt otherwise), then "
        "verify. Refused (LOG_CORRUPT) when the seal is readable and the log fails it.")
    ] = False,
    proof: Annotated[bool, typer.Option(
        "--proof", help="Also print each session's seal chain head (head hash, batches, last "
        "seq, writer, incarnation); keep the --json output to check the store against "
        "later.")] = False,
    against: Annotated[Path | None, typer.Option(
        "--against", metavar="FILE", show_default=False,
        help="Check the store against a kept proof ('dsh verify --proof --json' output): any "
        "batch it counted that was removed or changed is a violation. Without ID or --all, "
        "the sessions the proof names.")] = None,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Also note each restore point that matches the full read "
        "(without it, one line counts them).")] = False,
    store: StoreOption = None,
    json_: JsonOption = False,
) -> None:
    """Check envelopes, surface, tool pairing and log invariants; exit 1 on any violation.

    Prints one line per violation: session, seq, rule, message. Also checks each projection
    restore point against the full read (one note counting those that match, one per session
    with ``--verbose``; a warning when a resume ignores it; a violation
    when a resume would use it although the log changed under it).
    """
    json_mode(json_)
    if receipt is not None:
        _verify_receipt(receipt, store, json_)
        return
    from dsh.cli._proof import load_kept, proof_document

    kept = load_kept(against) if against is not None else None
    if session_id is not None and all_:
        raise typer.BadParameter("give a session ID or --all, not both",
                                 param_hint="'ID' / '--all'")
    if session_id is None and not all_ and kept is None:
        raise typer.BadParameter("give a session ID or --all (--against FILE alone checks "
                                 "the sessions its proof names)", param_hint="'ID' / '--all'")
    if reseal and session_id is None:
        raise typer.BadParameter("--reseal rebuilds the seal of one session: give its ID",
                                 param_hint="'--reseal'")
    notes: list[str] = []
    restore_points: dict[str, dict[str, object]] = {}
    proofs: dict[str, ChainProof] = {}
    found: list[Violation] = []
    with cli_store(store, create=False) as sessions:
        persistence = sessions.persistence
        if all_:
            ids = sorted({str(h["id"]) for h in persistence.list_headers()} | set(kept or ()))
        elif session_id is None and kept is not None:  # the sessions the kept proof names
            ids = sorted(kept)
        else:
            ids = [require_session(sessions, str(session_id))]
        if reseal:
            notes.append(_reseal(persistence, ids[0]))
        staged = staged_imports(persistence)
        with progress("verifying", total=len(ids)) as bar:
            for sid in ids:
                bar.describe(sid)
                if kept is not None and not persistence.exists(sid):
                    found.append(Violation(None, "PROOF_GONE", f"session {sid!r} is in the "
                                           f"kept proof but no longer stored", sid))
                    continue
                # A session's read builds millions of containers (rows, events, leaves) and
                # none of them is cyclic: a collection pass in between would walk them all
                # again and again (~0.35 s of 5 s at 1M events), so none runs while one is
                # checked; what it freed goes when its last reference does, as always.
                collecting = gc.isenabled()
                gc.disable()
                try:
                    found.extend(_verify(persistence, sid, notes, restore_points, proofs,
                                         kept, proof, sid in staged))
                finally:
                    if collecting:
                        gc.enable()
                bar.advance()
    matching = [sid for sid in ids if restore_points.get(sid, {}).get("status") == "consistent"]
    if verbose:
        notes.extend(f"{sid}: {restore_points[sid]['message']}" for sid in matching)
    elif matching:
        notes.append(f"{render.plural(len(matching), 'restore point')} matched the full read "
                     "(a resume reads only the events after each; --verbose lists them)")
    if json_:
        render.write_json({"sessions": len(ids), "violations": [v.to_json() for v in found],
                           "notes": notes, "restorePoints": restore_points}
                          | ({"proof": proof_document(proofs)} if proof else {}))
    else:
        for violation in found:
            sys.stdout.write(printable(violation.line()) + "\n")
        if proof:
            for sid in sorted(proofs):
                sys.stdout.write(printable("proof " + proofs[sid].line()) + "\n")
        sys.stdout.flush()
    err = stderr_console()
    for note in notes:
        err.print(f"note: {note}", markup=False)
    broken = len({v.session_id for v in found})
    # The verdict is the command's result: stdout (the JSON document carries it with --json).
    if not json_:
        stdout_console().print(f"verified {render.plural(len(ids), 'session')}: "
                               + (f"{render.plural(len(found), 'violation')} in "
                                  f"{render.plural(broken, 'session')}" if found
                                  else "all valid"), markup=False)
    if found:
        raise typer.Exit(EXIT_FAILED)



def _reseal(persistence: Persistence, session_id: str) -> str:
    """``dsh verify --reseal ID``: rebuild a lost seal on request (docs/formats.md#integrity-seals).

    A log that passes its present seal keeps that seal and its chain, extended over the bytes or
    rows past its end when it covers part of the log only.

    Raises:
        ConfigError: code ``NO_SEAL``: the store keeps no seals.
        LogCorruptError: the seal is present and readable and the log fails it (the log is
            what is damaged; nothing is written), or the log breaks its format's rules.
    """
    from dsh.persistence import Reseals

    backend = persistence.backend
    if not backend.capabilities.reseal:
        raise ConfigError("this store keeps no integrity seals to rebuild (PostgreSQL and the "
                          "memory store have none)", code="NO_SEAL", session_id=session_id)
    done = cast(Reseals, backend).reseal(session_id)
    if done.extended:
        return (f"{session_id}: integrity seal {done.path} kept and extended: the log passes it "
                "and it covered part of the log; the bytes or rows past its end are sealed and "
                "chained after its chain, which goes on")
    if done.kept:
        return (f"{session_id}: integrity seal {done.path} kept: the log passes it and it covers "
                "the whole log, so its chain goes on")
    return (f"{session_id}: integrity seal {done.path} rebuilt over the log as it is now, its "
            "chain started again; bytes changed while it was lost or damaged are sealed too")


def _verify_receipt(path: Path, store: str | None, json_: bool) -> None:
    """``dsh verify --receipt FILE``: the receipt against the store (docs/forgetting.md#receipts).

    The store is ``--store``, else the one the receipt names.
    """
    from dsh.rights import verify_receipt

    try:
        text = path.read_bytes()  # bytes: a file not UTF-8 is "not JSON" below, not a BUG
    except OSError as exc:
        # the OS's reason alone ("No such file or directory"), not Python's "[Errno 2] ..."
        raise typer.BadParameter(f"cannot read receipt {path}: {exc.strerror or exc}; pass "
                                 "the file 'dsh erase --receipt FILE' wrote",
                                 param_hint="'--receipt'") from exc
    try:
        receipt = json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"{path} is not a receipt (not JSON: {exc})",
                                 param_hint="'--receipt'") from exc
    if not isinstance(receipt, dict):
        raise typer.BadParameter(f"{path} is not a receipt (not a JSON object)",
                                 param_hint="'--receipt'")
    url = store or receipt.get("store")
    with cli_store(url if isinstance(url, str) else None, create=False) as sessions:
        problems = verify_receipt(sessions, receipt)
    if json_:
        render.write_json({"receipt": str(path), "problems": problems})
    else:
        for problem in problems:
            sys.stdout.write(printable(problem) + "\n")
        sys.stdout.flush()
        stdout_console().print(f"receipt {path}: " + (
            f"{render.plural(len(problems), 'problem')}" if problems else "holds"),
            markup=False)
    if problems:
        raise typer.Exit(EXIT_FAILED)

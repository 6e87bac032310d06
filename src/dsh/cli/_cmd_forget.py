"""``dsh quarantine``, ``unquarantine``, ``redact``, ``erase``, ``rm``, ``restore``: forgetting.

Rule: docs/forgetting.md.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import stat
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from dsh import ConfigError
from dsh._install import install_hint
from dsh.cli import _render as render
from dsh.cli._common import (
    DEFAULT_WAIT_S,
    STORED_ID_FIX,
    JsonOption,
    SessionArg,
    StoreOption,
    WaitOption,
    cli_store,
    deferred_interrupts,
    json_mode,
    refuse_empty_id,
    require_session,
    stderr_console,
    stdout_console,
)
from dsh.cli._progress import Bar, progress
from dsh.rights import (
    ErasureReceipt,
    QuarantineResult,
    RedactionResult,
    RetentionPolicy,
    TrashResult,
    clear_retention,
    fork_copies,
    retention_policies,
    set_retention,
    store_log,
)
from dsh.rights import erase as erase_sessions
from dsh.rights import gc as run_gc
from dsh.rights import purge as purge_sessions
from dsh.rights import quarantine as quarantine_messages
from dsh.rights import redact as redact_session
from dsh.rights import restore as restore_sessions
from dsh.rights import trash as trash_sessions
from dsh.rights import unquarantine as unquarantine_messages

SeqsArg = Annotated[list[int], typer.Argument(
    metavar="SEQ...", show_default=False,
    help="Seqs of messages ('dsh show' prints them as #seq).")]
ByOption = Annotated[str | None, typer.Option(
    "--by", metavar="NAME", show_default=False, help="Who does it (default: user@host).")]


def _who(by: str | None) -> str:
    return by if by else f"{getpass.getuser()}@{socket.gethostname()}"


def _report(verb: str, result: QuarantineResult, json_: bool) -> None:
    if json_:
        render.write_json(result.to_json())
        return
    out = stdout_console()
    for seq, node in result.changed:
        out.print(f"{result.session_id}: #{seq} {verb} (now #{node} on the model view)",
                  markup=False)
    for seq in result.unchanged:
        out.print(f"{result.session_id}: #{seq} unchanged (already {verb}, or never shown to "
                  f"the model)", markup=False)


def quarantine(session_id: SessionArg, seqs: SeqsArg,
               reason: Annotated[str | None, typer.Option(
                   "--reason", metavar="TEXT", show_default=False,
                   help="Why; kept in the log and shown by 'dsh show', never sent to the "
                        "model.")] = None,
               by: ByOption = None, store: StoreOption = None,
               wait: WaitOption = DEFAULT_WAIT_S, json_: JsonOption = False) -> None:
    """Withhold messages from the model view; the log keeps them (undo: dsh unquarantine).

    Each message is replaced on the model view by a placeholder of the same role that keeps
    tool calls paired with their results; a quarantine record says what, when, why and who
    (docs/forgetting.md#quarantine).
    """
    json_mode(json_)
    with cli_store(store, create=False, wait=wait) as sessions:
        session_id = require_session(sessions, session_id, writes=True)
        result = quarantine_messages(sessions, session_id, seqs, reason=reason, by=_who(by))
    _report("quarantined", result, json_)


def unquarantine(session_id: SessionArg, seqs: SeqsArg, by: ByOption = None,
                 store: StoreOption = None, wait: WaitOption = DEFAULT_WAIT_S,
                 json_: JsonOption = False) -> None:
    """Give quarantined messages back to the model view exactly as they were."""
    json_mode(json_)
    with cli_store(store, create=False, wait=wait) as sessions:
        session_id = require_session(sessions, session_id, writes=True)
        result = unquarantine_messages(sessions, session_id, seqs, by=_who(by))
    _report("unquarantined", result, json_)


ForceOption = Annotated[bool, typer.Option(
    "--force", help="Overwrite an existing --receipt FILE (it may hold the only copy of an "
                    "earlier operation's salts).")]


def check_receipt(path: Path | None, *, force: bool = False) -> None:
    """Refuse, before anything is changed, a receipt FILE that cannot be written.

    The receipt holds the only copy of the salts that open the commitments
    (docs/forgetting.md#receipts), so it is checked first: a new file in an existing folder
    (created and removed again), or with ``force`` an existing regular file opened for
    writing. An existing file may be an earlier receipt, whose salts would be lost.

    Raises:
        typer.BadParameter: ``--receipt`` names an existing file without ``force``, a folder,
            a link, a FIFO, a file in a missing folder, or a file that cannot be written;
            nothing was changed.
    """
    if path is None:
        return
    try:
        try:
            info: os.stat_result | None = os.lstat(path)
        except FileNotFoundError:
            info = None
        if info is None:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
            os.unlink(path)
        elif not stat.S_ISREG(info.st_mode):
            raise typer.BadParameter(f"{path} is not a regular file; nothing was changed",
                                     param_hint="'--receipt'")
        elif not force:
            raise typer.BadParameter(f"{path} already exists (an earlier receipt holds the only "
                                     "copy of its salts); name a new file, or pass --force to "
                                     "overwrite it; nothing was changed",
                                     param_hint="'--receipt'")
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_NOFOLLOW))
    except OSError as exc:
        raise typer.BadParameter(f"cannot write the receipt to {path}: "
                                 f"{exc.strerror or exc}; nothing was changed",
                                 param_hint="'--receipt'") from None


def write_receipt(path: Path, receipt: dict[str, object]) -> None:
    """Write a receipt as JSON, mode 0600 (it holds the commitments' salts), even over a file.

    Raises:
        ConfigError: code ``RECEIPT_NOT_WRITTEN``: the operation is committed, but the file
            could not be written after :func:`check_receipt` passed (a full disk).
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            os.fchmod(fd, 0o600)  # a file overwritten with --force would keep its mode
            json.dump(receipt, out, indent=2)
            out.write("\n")
    except OSError as exc:
        raise ConfigError(f"the operation is committed, but its receipt could not be written to "
                          f"{path}: {exc.strerror or exc}; the salts that open its commitments "
                          "are lost (the store log keeps the receipt's digest)",
                          code="RECEIPT_NOT_WRITTEN", path=str(path)) from None


def warn_unfinished(session_id: str, touched: Iterable[Mapping[str, Any]]) -> None:
    """Say on stderr which steps after the commit did not run (``done: false`` in the receipt).

    A scrub that could not run (another process holds a read transaction on the SQLite file)
    leaves the removed bytes in the database file or its WAL until it does
    (docs/forgetting.md#how-storage-is-rewritten); the command still succeeds, so this is
    where a person learns to run it again.
    """
    err = stderr_console()
    for step in touched:
        if step.get("done", True) is False:
            why = f" ({step['error']})" if step.get("error") else ""
            err.print(f"warning: {session_id}: {step.get('action')} on {step.get('path')} did "
                      f"not run{why}: what was removed may stay in that file until it does; "
                      "run the same command again once no other process has the store open",
                      markup=False)


def _report_redaction(result: RedactionResult, receipt: Path | None, json_: bool) -> None:
    if receipt is not None and not result.dry_run:
        write_receipt(receipt, result.to_json())
    warn_unfinished(result.session_id, result.touched)
    if result.mode == "secrets" and "detect-secrets" not in result.detectors:
        # docs/forgetting.md#finding-secrets: without the extra only dsh's patterns ran
        stderr_console().print(
            "warning: the secrets detector detect-secrets is not installed: only dsh's own "
            "patterns looked for secrets; install it with the 'forget' extra: "
            f"{install_hint('forget')}", markup=False)
    if json_:
        render.write_json(result.to_json())
        return
    out = stdout_console()
    verb = "would redact" if result.dry_run else "redacted"
    for item in result.items:
        out.print(f"{result.session_id}: #{item.seq} {item.type}: {verb} "
                  f"{render.plural(item.spans, 'span')}", markup=False)
    if not result.items:
        out.print(f"{result.session_id}: nothing to redact", markup=False)
    elif not result.dry_run:
        out.print(f"{result.session_id}: {render.plural(len(result.items), 'event')} "
                  f"tombstoned; record #{result.record_seq}"
                  + (f"; receipt {receipt}" if receipt is not None else ""), markup=False)


def redact(session_id: SessionArg,
           seq: Annotated[list[int] | None, typer.Option(
               "--seq", metavar="N", show_default=False,
               help="An event whose whole content goes (repeat for more).")] = None,
           match: Annotated[str | None, typer.Option(
               "--match", metavar="REGEX", show_default=False,
               help="Remove every match of this regular expression, in every event.")] = None,
           secrets: Annotated[bool, typer.Option(
               "--secrets", help="Remove what looks like a credential (API keys, cloud keys, "
                                 "tokens, private keys, .env secrets), in every event.")
           ] = False,
           dry_run: Annotated[bool, typer.Option(
               "--dry-run", help="List what would go, by seq; change nothing.")] = False,
           receipt: Annotated[Path | None, typer.Option(
               "--receipt", metavar="FILE", show_default=False,
               help="Write the receipt (commitments and their salts) to FILE, mode 0600.")
           ] = None,
           reason: Annotated[str | None, typer.Option(
               "--reason", metavar="TEXT", show_default=False, help="Why; kept in the log.")
           ] = None,
           force: ForceOption = False,
           by: ByOption = None, store: StoreOption = None,
           wait: WaitOption = DEFAULT_WAIT_S, json_: JsonOption = False) -> None:
    """Remove content from storage on every backend, leaving tombstones (docs/forgetting.md).

    Exactly one of --seq, --match and --secrets. Each changed event keeps its seq, type and
    time; its content becomes [REDACTED] and a commitment to the removed bytes is recorded.
    """
    json_mode(json_)
    check_receipt(None if dry_run else receipt, force=force)
    with cli_store(store, create=False, wait=wait) as sessions:
        session_id = require_session(sessions, session_id, writes=not dry_run)
        result = redact_session(sessions, session_id, seqs=seq or None, match=match,
                                secrets=secrets, dry_run=dry_run, reason=reason,
                                by=_who(by))
        copies = fork_copies(sessions, session_id, [item.seq for item in result.items])
    _report_redaction(result, receipt, json_)
    err = stderr_console()
    for fork, parent, seqs in copies:
        verb = "would keep" if dry_run else "keeps"
        err.print(f"warning: {fork} (a fork of {parent}) {verb} its own copy of "
                  f"{render.plural(len(seqs), 'event')} redacted here "
                  f"(#{', #'.join(map(str, seqs))}): redact it too, or 'dsh erase' the parent "
                  "(which reaches its forks)", markup=False)


def policy_label(where: dict[str, str]) -> str:
    """How a policy's scope is named: ``the whole store`` or ``KEY=VALUE,...``."""
    return ",".join(f"{k}={v}" for k, v in sorted(where.items())) or "the whole store"


def _where(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {pair!r}",
                                     param_hint="'--where'")
        out[key.strip()] = value
    return out


def erase(session_ids: Annotated[list[str] | None, typer.Argument(
              metavar="[ID]...", show_default=False, callback=refuse_empty_id(STORED_ID_FIX),
              help="Sessions to erase: ids, or unique prefixes of them (the id a prefix "
                   "matched is named first).")] = None,
          where: Annotated[list[str] | None, typer.Option(
              "--where", metavar="KEY=VALUE", show_default=False,
              help="Also erase every session whose header has KEY equal to VALUE (repeat: "
                   "all must hold).")] = None,
          receipt: Annotated[Path, typer.Option(
              "--receipt", metavar="FILE", show_default=False,
              help="Where to write the receipt (JSON, mode 0600); 'dsh verify --receipt "
                   "FILE' checks it later.")] = Path("-"),
          reason: Annotated[str | None, typer.Option(
              "--reason", metavar="TEXT", show_default=False, help="Why; kept in the log.")
          ] = None,
          force: ForceOption = False,
          by: ByOption = None, store: StoreOption = None,
          wait: WaitOption = DEFAULT_WAIT_S, json_: JsonOption = False) -> None:
    """Erase sessions' content everywhere in the store, forks' copies included; write a receipt.

    Every event becomes a tombstone (seq, type and time kept, content gone, a commitment
    recorded); fork descendants lose their copies of it and what was derived from it; saved
    cuts, restore points, the listing index, SQLite's WAL and free pages are scrubbed
    (docs/forgetting.md#erasure).
    """
    json_mode(json_)
    if str(receipt) == "-":
        raise typer.BadParameter("an erasure needs --receipt FILE (its proof)",
                                 param_hint="'--receipt'")
    check_receipt(receipt, force=force)
    scope = _where(where or []) or None  # a usage error before any note on the sessions named
    # it acts on stored sessions only: no store is created to find none (docs/cli.md)
    with cli_store(store, create=False, wait=wait) as sessions:
        ids = [require_session(sessions, sid, writes=True) for sid in session_ids or ()]
        with deferred_interrupts() as interrupted:
            made = erase_sessions(sessions, ids, where=scope,
                                  reason=reason, by=_who(by), stop=lambda: bool(interrupted))
    _report_erasure(made, receipt, json_)
    _end_if_interrupted(made, interrupted)


def _end_if_interrupted(made: ErasureReceipt, interrupted: list[int]) -> None:
    if interrupted:
        # docs/forgetting.md#erasure: what is done is in the receipt; the rest is untouched
        sys.stderr.write(f"interrupted after {render.plural(len(made.sessions), 'session')}: "
                         f"the receipt lists those erased; the others are as they were; run "
                         f"the same command again to erase them\n")
        raise KeyboardInterrupt


def _report_erasure(made: ErasureReceipt, receipt: Path | None, json_: bool) -> None:
    if receipt is not None:
        write_receipt(receipt, made.to_json())
    for done in made.sessions:
        warn_unfinished(done.session_id, done.touched)
    if json_:
        render.write_json(made.to_json())
        return
    out = stdout_console()
    for done in made.sessions:
        out.print(f"{done.session_id}: {done.role}, {render.plural(len(done.items), 'event')} "
                  f"tombstoned", markup=False)
    imported = sum(any(item.type == "import/source" for item in done.items)
                   for done in made.sessions)
    if imported:
        # docs/forgetting.md#erasure-and-import: the erased id keeps a re-import out
        out.print(f"{render.plural(imported, 'session')} came from 'dsh import': importing "
                  "the same transcript again skips it (--include-erased imports it again)",
                  markup=False, highlight=False)
    if receipt is not None:
        out.print(f"receipt {receipt}", markup=False)


SessionsArg = Annotated[list[str], typer.Argument(
    metavar="ID...", show_default=False, callback=refuse_empty_id(STORED_ID_FIX),
    help="Session ids, or unique prefixes of them (see 'dsh ls').")]


def _report_trash(verb: str, result: TrashResult, json_: bool) -> None:
    if json_:
        render.write_json(result.to_json())
        return
    out = stdout_console()
    for sid in result.changed:
        out.print(f"{sid}: {verb}", markup=False)
    for sid in result.unchanged:
        out.print(f"{sid}: unchanged (already {verb})", markup=False)


def rm(session_ids: SessionsArg,
       purge: Annotated[bool, typer.Option(
           "--purge", help="Erase the sessions for good instead (as 'dsh erase'; forks lose "
                           "their copies); they cannot be restored.")] = False,
       receipt: Annotated[Path | None, typer.Option(
           "--receipt", metavar="FILE", show_default=False,
           help="With --purge: write the erasure's receipt to FILE (JSON, mode 0600).")
       ] = None,
       reason: Annotated[str | None, typer.Option(
           "--reason", metavar="TEXT", show_default=False,
           help="Why; kept in the store log.")] = None,
       force: ForceOption = False,
       by: ByOption = None, store: StoreOption = None,
       wait: WaitOption = DEFAULT_WAIT_S, json_: JsonOption = False) -> None:
    """Move sessions to the trash: hidden from 'dsh ls', kept as they are ('dsh restore').

    Nothing of a session is changed; the store log records what, when, why and who. With
    --purge the sessions are erased (docs/forgetting.md#deletion-with-a-way-back).
    """
    json_mode(json_)
    if receipt is not None and not purge:
        raise typer.BadParameter("--receipt goes with --purge (moving to the trash erases "
                                 "nothing)", param_hint="'--receipt'")
    check_receipt(receipt, force=force)
    with cli_store(store, create=False, wait=wait) as sessions:
        ids = [require_session(sessions, sid, writes=True) for sid in session_ids]
        if purge:
            with deferred_interrupts() as interrupted:
                made = purge_sessions(sessions, ids, reason=reason, by=_who(by),
                                      stop=lambda: bool(interrupted))
        else:
            result = trash_sessions(sessions, ids, reason=reason, by=_who(by))
    if purge:
        _report_erasure(made, receipt, json_)
        _end_if_interrupted(made, interrupted)
    else:
        _report_trash("moved to the trash", result, json_)


def restore(session_ids: SessionsArg, by: ByOption = None, store: StoreOption = None,
            wait: WaitOption = DEFAULT_WAIT_S, json_: JsonOption = False) -> None:
    """Give sessions back from the trash or the archive, exactly as they were."""
    json_mode(json_)
    with cli_store(store, create=False, wait=wait) as sessions:
        ids = [require_session(sessions, sid, writes=True) for sid in session_ids]
        result = restore_sessions(sessions, ids, by=_who(by))
    _report_trash("restored", result, json_)


def _drawn(bar: Bar) -> Callable[[str, int, int], None]:
    """A ``dsh.rights.gc`` progress callback that moves ``bar``."""
    seen: dict[str, int] = {}

    def step(phase: str, done: int, total: int) -> None:
        if phase not in seen:
            seen[phase] = 0
            bar.describe(phase)
            bar.total(total)
        bar.advance(done - seen[phase])
        seen[phase] = done

    return step


def gc(apply: Annotated[bool, typer.Option(
           "--apply", help="Do what the policies ask for (default: only explain it).")
       ] = False,
       receipt: Annotated[Path | None, typer.Option(
           "--receipt", metavar="FILE", show_default=False,
           help="With --apply: write the purges' erasure receipt to FILE (JSON, mode 0600).")
       ] = None,
       log: Annotated[bool, typer.Option(
           "--log", help="Print the store log instead: every trash, restore, archive, "
                         "erasure and policy record, oldest first (no content).")] = False,
       force: ForceOption = False,
       by: ByOption = None, store: StoreOption = None,
       wait: WaitOption = DEFAULT_WAIT_S, json_: JsonOption = False) -> None:
    """Explain what the store's retention policies would archive, trash and purge now, and why.

    Nothing is changed without --apply. A store with no policy ('dsh retention') keeps
    everything (docs/forgetting.md#retention).
    """
    json_mode(json_)
    if receipt is not None and not apply:
        raise typer.BadParameter("--receipt goes with --apply", param_hint="'--receipt'")
    check_receipt(receipt, force=force)
    if log:
        with cli_store(store, create=False) as sessions:
            records = store_log(sessions).records
        if json_:
            render.write_json([dict(r) for r in records])
            return
        out = stdout_console()
        for record in records:
            data = {k: v for k, v in record.items() if k not in ("seq", "time", "type")}
            out.print(f"#{record['seq']} {render.format_ms(record['time'])} UTC {record['type']} "
                      f"{json.dumps(data, ensure_ascii=False)}", markup=False)
        if not records:
            out.print("the store log is empty: nothing was trashed, erased or set",
                      markup=False)
        return
    # a read without --apply, and with it an act on stored sessions: either way a missing
    # store is refused, not created (docs/cli.md)
    with cli_store(store, create=False, wait=wait) as sessions, progress("gc") as bar:
        report = run_gc(sessions, apply=apply, by=_who(by),
                        progress=_drawn(bar) if bar.drawn else None)
    if receipt is not None and report.receipt is not None:
        write_receipt(receipt, report.receipt.to_json())
    for erased in report.receipt.sessions if report.receipt is not None else ():
        warn_unfinished(erased.session_id, erased.touched)
    if json_:
        render.write_json(report.to_json())
        return
    out = stdout_console()
    verbs = {"archive": "archived" if apply else "would archive",
             "trash": "moved to the trash" if apply else "would move to the trash",
             "purge": "purged" if apply else "would purge"}
    for item in report.items:
        out.print(f"{item.session_id}: {verbs[item.action]}: {item.why}", markup=False)
    out.print(f"{render.plural(report.examined, 'session')} examined: "
              f"{report.count('archive')} to archive, {report.count('trash')} to trash, "
              f"{report.count('purge')} to purge, {report.kept} kept"
              + ("" if apply or not report.items else "; run 'dsh gc --apply' to do it")
              + (f"; receipt {receipt}" if receipt is not None and report.receipt else ""),
              markup=False)
    for sid in report.unreadable:
        out.print(f"{sid}: unreadable, left alone ('dsh verify {sid}')", markup=False)


def _day_option(flag: str, text: str) -> Any:
    return typer.Option(flag, metavar="DAYS", min=0, show_default=False, help=text)


def retention(where: Annotated[list[str] | None, typer.Option(
                  "--where", metavar="KEY=VALUE", show_default=False,
                  help="The policy's scope: sessions whose header has KEY equal to VALUE "
                       "(repeat: all must hold; none: the whole store).")] = None,
              keep: Annotated[bool, typer.Option(
                  "--keep", help="Keep the scope's sessions forever.")] = False,
              archive_after: Annotated[int | None, _day_option(
                  "--archive-after", "Archive (hide, keep) after DAYS without activity.")
              ] = None,
              trash_after: Annotated[int | None, _day_option(
                  "--trash-after", "Move to the trash after DAYS without activity.")] = None,
              purge_after: Annotated[int | None, _day_option(
                  "--purge-after", "Purge (erase) DAYS after going to the trash.")] = None,
              clear: Annotated[bool, typer.Option(
                  "--clear", help="Remove the scope's policy.")] = False,
              by: ByOption = None, store: StoreOption = None,
              wait: WaitOption = DEFAULT_WAIT_S, json_: JsonOption = False) -> None:
    """Set, clear or (with no option) list the store's retention policies; 'dsh gc' applies them.

    Policies are data in the store log; the most specific scope covering a session wins
    (docs/forgetting.md#retention).
    """
    json_mode(json_)
    scope = _where(where or [])
    setting = keep or any(d is not None for d in (archive_after, trash_after, purge_after))
    if clear and setting:
        raise typer.BadParameter("--clear takes only --where")
    # listing is a read and a missing store has no policy to clear: either is refused (a
    # missing store is STORE_NOT_FOUND, as for the other commands), only setting creates one
    with cli_store(store, create=setting, wait=wait) as sessions:
        if clear:
            if not clear_retention(sessions, scope, by=_who(by)):
                raise typer.BadParameter(f"no policy for {policy_label(scope)}",
                                         param_hint="'--where'")
            stderr_console().print(f"removed the retention policy for {policy_label(scope)}",
                                   markup=False)
        elif setting:
            covered = set_retention(sessions, RetentionPolicy(
                where=scope, keep=keep, archive_after_days=archive_after,
                trash_after_days=trash_after, purge_after_days=purge_after), by=_who(by))
            if scope and not covered:  # most likely a key no header has
                stderr_console().print(
                    f"note: no stored session matches {policy_label(scope)}; the policy "
                    "covers those that match later (--where looks at header fields such as "
                    "cwd, and the header's metadata: docs/forgetting.md#retention)",
                    markup=False)
        policies = retention_policies(sessions)
    if json_:
        render.write_json([p.to_json() for p in policies])
        return
    out = stdout_console()
    for policy in policies:
        rules = ["keep"] if policy.keep else [
            f"{name} after {render.plural(days, 'day')}" for name, days in (
                ("archive", policy.archive_after_days), ("trash", policy.trash_after_days),
                ("purge", policy.purge_after_days)) if days is not None]
        out.print(f"{policy.scope}: {', '.join(rules)}", markup=False)
    if not policies:
        out.print("no retention policy: the store keeps everything", markup=False)

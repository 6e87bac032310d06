"""What a memory must be able to forget: quarantine, redaction, erasure, the trash.

Every operation is itself recorded in the log it changes, runs under the session's write
ownership and commits as one atomic batch (docs/forgetting.md):

* :func:`quarantine` withholds messages from the model view and keeps the log intact;
  :func:`unquarantine` gives them back exactly; :func:`quarantine_state` folds the records;
* :func:`redact` removes whole events' content, or the spans of every string that match a
  pattern or look like credentials (:func:`find_secrets`), from storage on every backend,
  leaving tombstones and commitments; the result is the receipt;
* :func:`erase` removes whole sessions' content, and the copies fork descendants hold of it,
  from every place in the store; :func:`verify_receipt` checks its receipt later;
* :func:`trash` hides sessions from listings and keeps them, :func:`restore` gives them back,
  :func:`purge` erases them for good; :func:`store_log` reads the store log, where each of
  these (and every erasure) is recorded without content;
* :class:`RetentionPolicy` (stored by :func:`set_retention`) says what a store keeps, archives,
  trashes and purges after how many days; :func:`gc` explains what the policies ask for now,
  and does it with ``apply=True``.

Operations take a ``dsh.Store`` (or its ``persistence`` facade) and a stored session id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsh._lazy import lazy_exports
from dsh.session import QUARANTINE_APPLY, QUARANTINE_RELEASE, REDACTION_APPLIED

if TYPE_CHECKING:  # loaded on first use (see __getattr__): `dsh ls` reads the store log alone
    from dsh.rights._erase import (
        ErasedSession,
        ErasureReceipt,
        erase,
        verify_receipt,
    )

    # for dsh's own packages (the CLI's redaction warning), not public API
    from dsh.rights._forks import fork_copies as fork_copies
    from dsh.rights._quarantine import (
        PLACEHOLDER_TEXT,
        QuarantineResult,
        QuarantineState,
        quarantine,
        quarantine_state,
        unquarantine,
    )
    from dsh.rights._redact import (
        REDACTED_TEXT,
        RedactedEvent,
        RedactionResult,
        find_secrets,
        redact,
    )
    from dsh.rights._retention import (
        GcItem,
        GcReport,
        RetentionPolicy,
        clear_retention,
        gc,
        retention_policies,
        set_retention,
    )
    from dsh.rights._storelog import StoreLog, TrashEntry, store_log
    from dsh.rights._trash import TrashResult, purge, restore, trash

__all__ = [
    "PLACEHOLDER_TEXT",
    "QUARANTINE_APPLY",
    "QUARANTINE_RELEASE",
    "REDACTED_TEXT",
    "REDACTION_APPLIED",
    "ErasedSession",
    "ErasureReceipt",
    "GcItem",
    "GcReport",
    "QuarantineResult",
    "QuarantineState",
    "RedactedEvent",
    "RedactionResult",
    "RetentionPolicy",
    "StoreLog",
    "TrashEntry",
    "TrashResult",
    "clear_retention",
    "erase",
    "find_secrets",
    "gc",
    "purge",
    "quarantine",
    "quarantine_state",
    "redact",
    "restore",
    "retention_policies",
    "set_retention",
    "store_log",
    "trash",
    "unquarantine",
    "verify_receipt",
]

# Each operation loads with its module: the erasure verifier, the secret scanner (detect-secrets
# or re2 when installed) and the retention planner stay out of a process that only lists.
__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    **dict.fromkeys(("ErasedSession", "ErasureReceipt", "erase", "verify_receipt"),
                    "dsh.rights._erase"),
    "fork_copies": "dsh.rights._forks",
    **dict.fromkeys(("PLACEHOLDER_TEXT", "QuarantineResult", "QuarantineState", "quarantine",
                     "quarantine_state", "unquarantine"), "dsh.rights._quarantine"),
    **dict.fromkeys(("REDACTED_TEXT", "RedactedEvent", "RedactionResult", "find_secrets",
                     "redact"), "dsh.rights._redact"),
    **dict.fromkeys(("GcItem", "GcReport", "RetentionPolicy", "clear_retention", "gc",
                     "retention_policies", "set_retention"), "dsh.rights._retention"),
    **dict.fromkeys(("StoreLog", "TrashEntry", "store_log"), "dsh.rights._storelog"),
    **dict.fromkeys(("TrashResult", "purge", "restore", "trash"), "dsh.rights._trash"),
}, __all__)

"""What a memory must be able to forget: quarantine (and, next, redaction and erasure).

Every operation is itself recorded in the log it changes, runs under the session's write
ownership and commits as one atomic batch (docs/forgetting.md):

* :func:`quarantine` withholds messages from the model view and keeps the log intact;
  :func:`unquarantine` gives them back exactly; :func:`quarantine_state` folds the records.

Operations take a ``dsh.Store`` (or its ``persistence`` facade) and a stored session id.
"""

from __future__ import annotations

from dsh.rights._quarantine import (
    PLACEHOLDER_TEXT,
    QUARANTINE_APPLY,
    QUARANTINE_RELEASE,
    QuarantineResult,
    QuarantineState,
    quarantine,
    quarantine_state,
    unquarantine,
)

__all__ = [
    "PLACEHOLDER_TEXT",
    "QUARANTINE_APPLY",
    "QUARANTINE_RELEASE",
    "QuarantineResult",
    "QuarantineState",
    "quarantine",
    "quarantine_state",
    "unquarantine",
]

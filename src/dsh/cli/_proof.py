"""``dsh verify --proof`` and ``--against FILE``: the seal chain's heads, kept and checked later.

Rules: docs/formats.md#the-seal-chain (what a chain commits to), docs/cli.md#chain-proofs (what
the commands print and compare).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import typer

from dsh import ConfigError, DshError, Violation

if TYPE_CHECKING:
    from dsh.persistence import ChainProof, Persistence
    from dsh.session import Event

PROOF_KIND = "dsh-chain-proof"


def check_chain(persistence: Persistence, session_id: str, events: Sequence[Event],
                proofs: dict[str, ChainProof], kept: Mapping[str, Mapping[str, object]] | None,
                notes: list[str] | None) -> list[Violation]:
    """Check a session's seal chain against the events a full read returned.

    Adds the session's proof to ``proofs`` and, with ``kept`` (a kept proof by session),
    compares it. A store that keeps the chain itself (PostgreSQL) is asked for its records;
    a store without a chain (memory) or a seal without a chain is a note in ``notes``
    (``None``: not asked for a proof, no note).

    Returns:
        One violation per finding (``CHAIN_*``, ``PROOF_*``, or a ``SEAL_*`` code of a
        damaged seal), each naming seq, batch and writer in its message.
    """
    from dsh.persistence import KeepsChain, Reseals, compare_proof, prove_chain

    backend = persistence.backend
    if not backend.capabilities.reseal and not backend.capabilities.chain_records:
        if notes is not None:
            notes.append(f"{session_id}: this store keeps no integrity seals, so no chain")
        return []
    try:
        if backend.capabilities.chain_records:
            chain = cast(KeepsChain, backend).chain_records(session_id)
            proof, problems, records = prove_chain(
                session_id, chain.where, chain.incarnation, events, records=chain.records,
                stored=chain.stored, head=(chain.batches, chain.head))
        else:
            seal_path, incarnation = cast(Reseals, backend).seal_chain(session_id)
            proof, problems, records = prove_chain(session_id, seal_path, incarnation, events)
    except ConfigError as exc:  # a store whose seal_chain says it keeps none (NO_SEAL)
        if notes is not None:
            notes.append(f"{session_id}: {exc.message}")
        return []
    except DshError as exc:
        return [Violation(None, exc.code, exc.message, session_id)]
    proofs[session_id] = proof
    found: list[Violation] = []
    for problem in problems:
        if problem.code == "CHAIN_NONE":
            if notes is not None:
                notes.append(problem.message)
            continue
        found.append(Violation(problem.seq, problem.code, _with_writer(problem.message,
                                                                      problem.writer),
                               session_id))
    if kept is not None and session_id in kept:
        for problem in compare_proof(kept[session_id], proof, records):
            found.append(Violation(problem.seq, problem.code, problem.message, session_id))
    return found


def _with_writer(message: str, writer: str | None) -> str:
    return message if writer is None or writer in message else f"{message} (writer {writer})"


def attribute(persistence: Persistence, session_id: str, error: DshError
              ) -> tuple[int | None, str]:
    """``error``'s seq and message, naming the chained batch (seq range, writer) of the seq.

    Rule: docs/cli.md#chain-proofs.

    The seq is the error's own, else, for a raw JSONL log, that of the first event at its
    ``byte_offset`` (:func:`_seq_at`); None when neither is known.
    """
    from dsh.persistence import KeepsChain, Reseals, chain_record_at

    seq = error.where.get("seq")
    if not isinstance(seq, int):
        seq = _seq_at(error.where.get("path"), error.where.get("byte_offset"))
    capabilities = persistence.backend.capabilities
    if seq is None or not (capabilities.reseal or capabilities.chain_records):
        return seq, error.message
    try:
        if capabilities.chain_records:  # PostgreSQL: the records the store keeps
            records = cast(KeepsChain, persistence.backend).chain_records(session_id).records
            record = next((r for r in records if r.first <= seq < r.end), None)
        else:
            seal_path, _ = cast(Reseals, persistence.backend).seal_chain(session_id)
            record = chain_record_at(seal_path, seq)
    except (DshError, OSError):
        return seq, error.message
    return seq, error.message if record is None else \
        f"{error.message}; it lies in {record.where()}"


def _seq_at(path: object, offset: object) -> int | None:
    """The seq of the first event at ``offset`` of a raw JSONL log (a line start), or None.

    Reads the line before it: the header (seq 0 follows), an event (its seq + 1) or a chunk
    row (its last member's seq + 1) (docs/formats.md#chunk-rows). Offset 0 is the header's
    own line, which a log's first sealed range starts with: when it is a header, seq 0 is the
    first event after it (a header that is not one is no event's).
    """
    if not isinstance(path, str) or not isinstance(offset, int) or not path.endswith(".jsonl"):
        return None
    try:
        with open(path, "rb") as f:
            if offset == 0:
                line = f.readline(65536)
            else:
                f.seek(max(0, offset - 65536))
                before = f.read(offset - max(0, offset - 65536))
                line = before[:-1].rsplit(b"\n", 1)[-1] if before.endswith(b"\n") else b""
        record = json.loads(line)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    if record.get("type") == "session":
        return 0
    if isinstance(record.get("seq"), int):
        return int(record["seq"]) + 1
    texts = record.get("data", {}).get("texts") if isinstance(record.get("data"), dict) else None
    texts = texts if isinstance(texts, list) else record.get("data", {}).get("args")
    if isinstance(record.get("seq0"), int) and isinstance(texts, list):
        return int(record["seq0"]) + len(texts)
    return None


def load_kept(path: Path) -> dict[str, Mapping[str, object]]:
    """A kept proof by session: ``dsh verify --proof --json`` output, or its ``proof`` object.

    Raises:
        typer.BadParameter: the file cannot be read or is not a proof.
    """
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"cannot read proof {path}: {exc}",
                                 param_hint="'--against'") from exc
    if isinstance(document, dict) and isinstance(document.get("proof"), dict):
        document = document["proof"]
    sessions = document.get("sessions") if isinstance(document, dict) else None
    if not isinstance(document, dict) or document.get("kind") != PROOF_KIND \
            or not isinstance(sessions, list):
        raise typer.BadParameter(f"{path} is not a chain proof (the JSON of 'dsh verify "
                                 f"--proof --json')", param_hint="'--against'")
    return {str(s.get("session")): s for s in sessions if isinstance(s, dict)}


def proof_document(proofs: Mapping[str, ChainProof]) -> dict[str, object]:
    """The ``proof`` object of ``--proof --json``: ``{kind, sessions: [...]}``."""
    return {"kind": PROOF_KIND, "sessions": [p.to_json() for _, p in sorted(proofs.items())]}

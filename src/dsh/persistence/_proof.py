"""Chain proofs: what ``dsh verify --proof`` prints, and a kept proof checked against the store.

Rules: docs/formats.md#the-seal-chain, docs/cli.md#chain-proofs.

:func:`prove_chain` checks a session's seal chain against the events a full read returned (each
batch's leaves against its record, each record's incarnation) and returns the proof an
auditor keeps: head hash, batch count, last seq, writer, incarnation, and the first 8 bytes
of every record's hash. :func:`compare_proof` checks a kept proof against a later one: the chain
may only have grown; a batch it counted that is gone, or whose hash differs, is named with
its seq range and writer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dsh.persistence._chain import ChainRecord, events_digest, incarnation_bytes
from dsh.persistence._seal import read_seal
from dsh.session import Event

__all__ = ["ChainProblem", "ChainProof", "chain_record_at", "compare_proof", "prove_chain"]

_SHORT = 16
"""Hex digits of each record's hash a proof keeps (its first 8 bytes)."""


@dataclass(frozen=True, slots=True)
class ChainProblem:
    """One finding: a stable ``code``, a sentence, and where (seq, batch, writer)."""

    code: str
    message: str
    seq: int | None = None
    batch: int | None = None
    writer: str | None = None


@dataclass(frozen=True, slots=True)
class ChainProof:
    """The chain head of one session, as an auditor keeps it.

    Attributes:
        session_id: The session.
        seal: The seal file.
        head: Hex SHA-256 of the last record ("" when nothing is chained).
        batches: Records in the chain.
        first_seq: First seq chained (events before it predate the chain).
        last_seq: Last seq chained (-1 when nothing is).
        writer: The last record's writer.
        incarnation: Hex of the 16 incarnation bytes the records bind.
        hashes: First 16 hex digits of each record's hash, oldest first.
        gaps: ``[first, end)`` seq ranges between records that no record covers.
    """

    session_id: str
    seal: str
    head: str
    batches: int
    first_seq: int
    last_seq: int
    writer: str
    incarnation: str
    hashes: tuple[str, ...] = ()
    gaps: tuple[tuple[int, int], ...] = field(default=())

    def to_json(self) -> dict[str, object]:
        """The proof as JSON.

        ``{session, seal, head, batches, firstSeq, lastSeq, writer, incarnation, hashes,
        gaps}``.
        """
        return {"session": self.session_id, "seal": self.seal, "head": self.head,
                "batches": self.batches, "firstSeq": self.first_seq, "lastSeq": self.last_seq,
                "writer": self.writer, "incarnation": self.incarnation,
                "hashes": list(self.hashes), "gaps": [list(g) for g in self.gaps]}

    def line(self) -> str:
        """One line: session, head, batches, last seq, writer, incarnation."""
        return (f"{self.session_id}  head {self.head or '-'}  batches {self.batches}  "
                f"last seq {self.last_seq}  writer {self.writer or '-'}  "
                f"incarnation {self.incarnation}")


def prove_chain(session_id: str, seal_path: str, incarnation: str, events: Sequence[Event],
                *, records: Sequence[ChainRecord] | None = None,
                stored: Sequence[bytes] | None = None, head: tuple[int, bytes] | None = None
                ) -> tuple[ChainProof, list[ChainProblem], list[ChainRecord]]:
    """Check the chain of ``seal_path`` against ``events`` (a full read, seq order).

    Args:
        session_id: Named in problems.
        seal_path: The session's seal file (with ``records``: where they are kept).
        incarnation: What the records must bind (``Reseals.seal_chain``).
        events: Every committed event of the session.
        records: The chain as a store keeps it itself (``KeepsChain.chain_records``); its
            links are checked here (``CHAIN_BROKEN``), as ``read_seal`` checks a seal's.
        stored: With ``records``: the hash stored beside each record; one that is not the
            record's recomputed hash is ``CHAIN_BROKEN`` naming that record.
        head: With ``records``: the chain head the store keeps apart (record count, last
            hash; ``KeptChain.batches`` and ``.head``): fewer records than it counts is
            ``CHAIN_CUT`` naming the missing batches, another last hash ``CHAIN_BROKEN``.

    Returns:
        The proof, the problems found, and the chain's records. Problems: ``CHAIN_EVENTS``
        (a batch's events are not the ones its record committed to), ``CHAIN_CUT`` (the log
        ends before a chained batch), ``CHAIN_INCARNATION`` (a record written for another
        incarnation), ``CHAIN_BROKEN`` (with ``records``: a record that does not link to
        the one before it, or out of seq order, or whose hash is not the stored one or the
        head's: a record was changed, removed or reordered, named where it can be told; its
        events are then not also reported as ``CHAIN_EVENTS``), ``CHAIN_CUT`` (also: the
        table holds fewer records than the head counts),
        ``CHAIN_NONE`` (the seal has no chain: written before the chain, or none at all).

    Raises:
        LogCorruptError: the seal file is damaged (``SEAL_*`` codes, see ``read_seal``).
    """
    inc = incarnation_bytes(incarnation)
    problems: list[ChainProblem] = []
    changed: set[int] = set()  # records found changed: their events are not blamed
    if records is None:
        seal = read_seal(Path(seal_path))
        chain: list[ChainRecord] = seal.chain if seal is not None else []
    else:
        chain = list(records)
        problems.extend(_broken_links(session_id, seal_path, chain, stored, head, len(events),
                                      changed))
    if not chain:
        problems.append(ChainProblem("CHAIN_NONE", f"session {session_id!r}: its seal "
                                     f"{seal_path} holds no hash chain (written before the "
                                     f"chain, or missing); nothing to prove yet"))
    gaps: list[tuple[int, int]] = []
    prev_end = chain[0].first if chain else 0
    for index, record in enumerate(chain):
        at = (record.first, index, str(record.writer))
        if record.first > prev_end:
            gaps.append((prev_end, record.first))
        prev_end = record.end
        if record.incarnation != inc:
            problems.append(ChainProblem(
                "CHAIN_INCARNATION", f"session {session_id!r}: {record.where()} (batch "
                f"{index}) was sealed for another incarnation of the session", *at))
        if record.end > len(events):
            problems.append(ChainProblem(
                "CHAIN_CUT", f"session {session_id!r}: the log ends at seq {len(events) - 1}, "
                f"but the chain in {seal_path} commits to {record.where()} (batch {index}): "
                f"committed events were removed", *at))
            break
        try:
            same = events_digest(record, events, record.first, record.end) == record.digest
        except ValueError as exc:
            same = False
            note = f" (its key part is damaged: {exc})"
        else:
            note = ""
        if not same and index not in changed:
            problems.append(ChainProblem(
                "CHAIN_EVENTS", f"session {session_id!r}: the events of {record.where()} "
                f"(batch {index}) are not the ones the seal chain in {seal_path} committed "
                f"to{note}: they were modified, removed or reordered, or the record's key "
                f"part (not hashed) was changed", *at))
    last = chain[-1] if chain else None
    proof = ChainProof(session_id, seal_path, last.hash.hex() if last else "", len(chain),
                       chain[0].first if chain else 0, last.end - 1 if last else -1,
                       str(last.writer) if last else "", inc.hex(),
                       tuple(r.hash.hex()[:_SHORT] for r in chain), tuple(gaps))
    return proof, problems, chain


def _broken_links(session_id: str, where: str, chain: Sequence[ChainRecord],
                  stored: Sequence[bytes] | None, head: tuple[int, bytes] | None,
                  count: int, changed: set[int]) -> list[ChainProblem]:
    """``CHAIN_BROKEN`` / ``CHAIN_CUT`` for a chain a store keeps itself; adds to ``changed``.

    Who is blamed (docs/formats.md#the-seal-chain): a record whose stored hash is not its
    recomputed one was changed; the last record must hash to the ``head`` kept apart; a link
    that breaks between two records blames the earlier one when the later one still hashes
    to what follows it (the record after it, or the head), else the later one.
    """
    found: list[ChainProblem] = []

    def broken(index: int, why: str) -> None:
        record = chain[index]
        changed.add(index)
        found.append(ChainProblem(
            "CHAIN_BROKEN", f"session {session_id!r}: the chain record of {record.where()} "
            f"(batch {index}) in {where} {why}", record.first, index, str(record.writer)))

    n = len(chain)
    tip = head[1] if head is not None and head[0] == n else None  # what the last must hash to
    for index, record in enumerate(chain):
        if stored is not None and index < len(stored) and stored[index] != record.hash:
            broken(index, "was changed: its stored hash is not the SHA-256 of its hashed part")
    for index, record in enumerate(chain):
        prev = chain[index - 1] if index else None
        if (prev.hash if prev is not None else bytes(32)) != record.prev:
            if prev is not None and index - 1 in changed:
                continue  # the earlier record is already named
            onward = chain[index + 1].prev if index + 1 < n else tip
            if prev is not None and prev.end != record.first:
                broken(index, f"does not link to the record before it (which ends at seq "
                              f"{prev.end - 1}): records between them were removed")
            elif prev is not None and index not in changed and onward == record.hash:
                broken(index - 1, "was changed: it no longer hashes to what the record after "
                                  "it links to")
            else:
                broken(index, "does not link to the record before it: a record was changed, "
                              "removed or reordered")
        elif record.end <= record.first or (prev is not None and record.first < prev.end):
            broken(index, "covers seqs out of order: a record was changed or reordered")
    if head is None:
        return found
    batches, last_hash = head
    last = chain[-1] if chain else None
    if n < batches and (last is None or last.hash != last_hash):
        start = last.end if last is not None else 0
        seqs = (f"seq {start}..{count - 1} as the log holds them now" if count > start
                else f"the seqs from {start}")
        found.append(ChainProblem(
            "CHAIN_CUT", f"session {session_id!r}: {where} holds {n} chain records, but the "
            f"session row's chain head counts {batches}: batches {n}..{batches - 1} "
            f"({seqs}) were removed", start, n, None))
    elif last is not None and (n != batches or last.hash != last_hash) and n - 1 not in changed:
        broken(n - 1, f"does not hash to the chain head the session row holds ({batches} "
                      f"records, last hash {last_hash.hex()[:_SHORT]}): it was changed, or "
                      f"records were removed or added")
    return found


def compare_proof(kept: Mapping[str, object], now: ChainProof | None, records: Sequence[ChainRecord]
            = ()) -> list[ChainProblem]:
    """Check a kept proof (:meth:`ChainProof.to_json`) against the session's proof now.

    The chain may only have grown since: every batch the kept proof counts must still be
    there with the same hash, and the last one must hash to the kept head.

    Args:
        kept: One session's entry of a kept proof.
        now: The proof now (``None``: the session is gone).
        records: The chain now, to name a differing batch's seq range and writer.

    Returns:
        ``PROOF_GONE``, ``PROOF_INCARNATION``, ``PROOF_TRUNCATED`` or ``PROOF_CHANGED``
        findings (empty: the kept proof holds).
    """
    sid = str(kept.get("session"))
    batches = kept.get("batches")
    hashes = kept.get("hashes")
    head = kept.get("head")
    if not isinstance(batches, int) or not isinstance(head, str) or not isinstance(
            hashes, list):
        return [ChainProblem("PROOF_MALFORMED", f"session {sid!r}: the kept proof has no "
                             f"head, batches and hashes")]
    if now is None:
        return [ChainProblem("PROOF_GONE", f"session {sid!r} is no longer stored; the proof "
                             f"counted {batches} batches up to seq {kept.get('lastSeq')}")]
    if kept.get("incarnation") != now.incarnation:
        return [ChainProblem("PROOF_INCARNATION", f"session {sid!r} is another incarnation "
                             f"now: it was deleted and created again, or its header changed")]

    def where(i: int) -> dict[str, object]:
        if i < len(records):
            r = records[i]
            return {"seq": r.first, "batch": i, "writer": str(r.writer),
                    "what": f"{r.where()} (batch {i})"}
        return {"seq": None, "batch": i, "writer": None, "what": f"batch {i}"}

    for i, short in enumerate(hashes):
        if i >= len(now.hashes):
            return [ChainProblem(
                "PROOF_TRUNCATED", f"session {sid!r}: the chain now holds {now.batches} "
                f"batches up to seq {now.last_seq}; the proof counted {batches} up to seq "
                f"{kept.get('lastSeq')} (last written by {kept.get('writer')}): batches "
                f"{i}..{batches - 1} were removed", seq=now.last_seq + 1, batch=i,
                writer=str(kept.get("writer")) or None)]
        if now.hashes[i] != short:
            w = where(i)
            return [ChainProblem(
                "PROOF_CHANGED", f"session {sid!r}: {w['what']} differs from the kept proof: "
                f"its events or its record were modified, removed or reordered, and the "
                f"chain was rebuilt from there", seq=w["seq"] if isinstance(w["seq"], int)
                else None, batch=i, writer=w["writer"] if isinstance(w["writer"], str)
                else None)]
    if batches and (batches > len(records) or records[batches - 1].hash.hex() != head):
        return [ChainProblem("PROOF_CHANGED", f"session {sid!r}: the record at the kept head "
                             f"(batch {batches - 1}) no longer hashes to {head}",
                             batch=batches - 1)]
    return []


def chain_record_at(seal_path: str, seq: int) -> ChainRecord | None:
    """The chain record of ``seal_path`` whose batch holds ``seq`` (``None``: none does).

    Raises:
        LogCorruptError: the seal file is damaged.
    """
    seal = read_seal(Path(seal_path))
    for record in seal.chain if seal is not None else []:
        if record.first <= seq < record.end:
            return record
    return None

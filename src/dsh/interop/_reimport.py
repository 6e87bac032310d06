"""Importing a source again: a grown transcript appends, a changed one becomes a new session.

A fresh import of the same file is compared with the stored log, event by event, skipping
``import/source`` events on both sides and ignoring times (a turn the earlier import closed at
the end of the file is closed at the next record's time now). Seqs are compared through the
mapping built along the way, so references (``sourceEventSeqs``, a replace's ``surfaceOp``,
a compaction's ``shadowedSeqs``/``shadowedRange``) match whatever seqs the stored log has.

* Everything stored matches and nothing is new: :data:`SAME` (nothing to do). The same when
  the whole fresh import matches the start of the stored log: the events after it were
  written in dsh (a resume's repair, a compaction, a chat turn), not imported, so the imported
  region is unchanged.
* Everything stored matches a prefix of the fresh import: :data:`APPEND`; the new events are
  written after one ignorable ``import/source`` event naming the source as it is now
  (``sha256``, ``size`` in bytes, ``appendedFrom``: the first appended seq), seqs renumbered,
  references mapped, times never before the stored log's last time.
* Anything stored differs (the source was edited, Claude Code picked another branch, or the
  session was continued both in dsh and in its source): :data:`CHANGED`; :func:`superseding`
  gives the fresh import under a new id whose ``import/source`` names the stored session
  (``supersedes``), so nothing stored is lost or altered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from dsh.interop._common import IMPORT_SOURCE_TYPE, ImportedSession, JsonObj, derived_id
from dsh.json import json_equal, thaw

SAME: Final = "same"
APPEND: Final = "append"
CHANGED: Final = "changed"

@dataclass(frozen=True)
class ReimportPlan:
    """What importing a source again does to its stored session.

    Attributes:
        kind: :data:`SAME`, :data:`APPEND` or :data:`CHANGED`.
        events: For :data:`APPEND`, the wire events to append (seqs from the stored length,
            the ``import/source`` marker first); otherwise empty.
        changed_at: For :data:`CHANGED`, the stored seq of the first event that differs (the
            stored length when the stored log is longer than the fresh import).
    """

    kind: Literal["same", "append", "changed"]
    events: list[JsonObj] = field(default_factory=list)
    changed_at: int | None = None


def _map_seq(value: Any, seqs: Mapping[int, int]) -> Any:
    return seqs.get(value, value) if type(value) is int else value


def _mapped(event: Mapping[str, Any], seqs: Mapping[int, int]) -> JsonObj:
    """``event`` (plain copy) with every seq reference translated through ``seqs``."""
    out: JsonObj = thaw(event)  # a plain deep copy (of a frozen event too)
    if isinstance(out.get("sourceEventSeqs"), list):
        out["sourceEventSeqs"] = [_map_seq(s, seqs) for s in out["sourceEventSeqs"]]
    op = out.get("surfaceOp")
    if isinstance(op, dict):
        out["surfaceOp"] = {k: _map_seq(v, seqs) if k in ("start", "end") else v
                            for k, v in op.items()}
    data = out.get("data")
    if isinstance(data, dict) and out.get("type") == "compaction/summary":
        if isinstance(data.get("shadowedSeqs"), list):
            data["shadowedSeqs"] = [_map_seq(s, seqs) for s in data["shadowedSeqs"]]
        if isinstance(data.get("shadowedRange"), dict):
            data["shadowedRange"] = {k: _map_seq(v, seqs)
                                     for k, v in data["shadowedRange"].items()}
    return out


def _same(stored: Mapping[str, Any], fresh: JsonObj) -> bool:
    keys = ("type", "data", "surfaceOp", "sourceEventSeqs", "ignorable")
    return all(json_equal(stored.get(k), fresh.get(k)) for k in keys)


def plan_reimport(stored: Sequence[Mapping[str, Any]], fresh: ImportedSession) -> ReimportPlan:
    """Compare a stored imported log with a fresh import of its source (module docstring).

    Args:
        stored: The stored events in seq order (wire mappings or frozen events).
        fresh: The source imported again (same session id).

    Returns:
        The plan; for :data:`APPEND` its events are ready to append as they are.
    """
    kept = [e for e in stored if e.get("type") != IMPORT_SOURCE_TYPE]
    new = [e for e in fresh.events if e.get("type") != IMPORT_SOURCE_TYPE]
    seqs: dict[int, int] = {}
    index = 0
    while index < min(len(kept), len(new)) and _same(kept[index], _mapped(new[index], seqs)):
        seqs[int(new[index]["seq"])] = int(kept[index]["seq"])
        index += 1
    if index == len(new):
        # Everything the source holds is stored; what follows it was written in dsh (a
        # resume's repair, a compaction, a chat): the imported region is unchanged.
        return ReimportPlan(SAME)
    if index < len(kept):
        held = _before_closers(kept[index:], new[index:], seqs)
        if held is None:
            return ReimportPlan(CHANGED, changed_at=int(kept[index]["seq"]))
        tail = [*held, *new[index + len(held) + len(kept) - index:]]
    else:
        tail = new[len(kept):]
    if not tail:
        return ReimportPlan(SAME)
    next_seq = len(stored)
    last_time = int(stored[-1]["time"]) if stored else 0
    source = next((e for e in fresh.events if e.get("type") == IMPORT_SOURCE_TYPE), None)
    marker_data: JsonObj = dict(source["data"]) if source is not None else {}
    marker_data["appendedFrom"] = next_seq + 1
    out: list[JsonObj] = [{"type": IMPORT_SOURCE_TYPE, "seq": next_seq, "time": last_time,
                           "data": marker_data, "ignorable": True}]
    for offset, event in enumerate(tail, start=1):
        seqs[int(event["seq"])] = next_seq + offset
    for offset, event in enumerate(tail, start=1):
        moved = _mapped(event, seqs)
        moved["seq"] = next_seq + offset
        last_time = max(last_time, int(moved["time"]))
        moved["time"] = last_time
        out.append(moved)
    return ReimportPlan(APPEND, out)


_CLOSERS: Final = frozenset({"step/end", "turn/end"})


def _before_closers(rest: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]],
                    seqs: dict[int, int]) -> list[JsonObj] | None:
    """The fresh ignorables standing before the stored log's last closers, or None.

    The earlier import closed its finished last turn at the end of the file; the fresh import
    closes it when the next record arrives, after that record's ignorable copy. When ``rest``
    (the stored events left) is only such closers and ``new`` holds them after ignorable
    events, the closers match (``seqs`` is extended) and those ignorables are returned to be
    appended after them.
    """
    if not rest or not all(e.get("type") in _CLOSERS for e in rest):
        return None
    held = 0
    while held < len(new) and new[held].get("ignorable") is True:
        held += 1
    closers = new[held:held + len(rest)]
    if len(closers) < len(rest) or not all(
            _same(old, _mapped(event, seqs)) for old, event in zip(rest, closers, strict=True)):
        return None
    for old, event in zip(rest, closers, strict=True):
        seqs[int(event["seq"])] = int(old["seq"])
    return [dict(e) for e in new[:held]]


def superseding(fresh: ImportedSession, old_id: str, changed_at: int | None) -> ImportedSession:
    """The fresh import as a new session that names the stored one it supersedes.

    The id is a uuid5 of the old id and the source's SHA-256, so importing the same changed
    source again finds this session. The ``import/source`` data gains ``supersedes: {session,
    changedAtSeq}``; children keep their own ids (each is compared on its own).
    """
    source = next((e for e in fresh.events if e.get("type") == IMPORT_SOURCE_TYPE), None)
    digest = str(source["data"].get("sha256")) if source is not None else ""
    new_id = derived_id(f"{old_id}:superseded-by:{digest}")
    events = [dict(e) for e in fresh.events]
    for event in events:
        if event.get("type") == IMPORT_SOURCE_TYPE:
            event["data"] = {**event["data"], "supersedes": {"session": old_id,
                                                             "changedAtSeq": changed_at}}
            break
    header = {**fresh.header, "id": new_id}
    return replace(fresh, session_id=new_id, header=header, events=events, children=[])

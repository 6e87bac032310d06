"""The agent inbox: pending user input, logged before it changes, rebuilt on resume.

Two lists (docs/agent.md#the-inbox): ``next-turn`` (prompts; the first step of a turn claims one)
and ``next-step`` (steering; every step claims all of it). Every change appends one
``agent/inbox/spliced {target, start, removedCount?, inserted, outcome?}`` event *before* the
lists change, in JavaScript ``splice`` coordinates: an insertion is ``start = len, inserted =
[message]``; a claim is a pure deletion (``removedCount``, ``inserted: []``, no outcome); a
cancellation is a deletion with ``outcome: "canceled"``. Nothing is logged when nothing
changes. Message ids are unique across both lists. The events are written ``ignorable``, so
every dsh reader keeps them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Literal, TypeAlias

from dsh._errors import AgentError
from dsh.json import FrozenDict
from dsh.session import Event

logger = logging.getLogger(__name__)

INBOX_EVENT: Final = "agent/inbox/spliced"

InboxTarget: TypeAlias = Literal["next-turn", "next-step"]
"""Which pending list a splice changes."""


class Inbox:
    """The two pending lists of one agent.

    Args:
        log: Appends one ``agent/inbox/spliced`` data object to the session and returns the
            event (the agent passes its recorder's writer).
    """

    def __init__(self, log: Callable[[dict[str, Any]], Event]) -> None:
        self._log = log
        self._lists: dict[str, list[FrozenDict]] = {"next-turn": [], "next-step": []}

    @property
    def next_turn(self) -> tuple[FrozenDict, ...]:
        """Pending prompts, oldest first."""
        return tuple(self._lists["next-turn"])

    @property
    def next_step(self) -> tuple[FrozenDict, ...]:
        """Pending steering messages, oldest first."""
        return tuple(self._lists["next-step"])

    def has_work(self) -> bool:
        """True when either list holds a message."""
        return bool(self._lists["next-turn"] or self._lists["next-step"])

    def push(self, target: InboxTarget, message: FrozenDict) -> Event:
        """Queue ``message`` at the end of ``target``; returns the splice event.

        Raises:
            AgentError: code ``INBOX`` for an unknown target or a message id already queued.
        """
        pending = self._target(target)
        ids = {m.get("id") for queue in self._lists.values() for m in queue}
        if message.get("id") in ids:
            raise AgentError(f"message {message.get('id')!r} is already in the inbox; message "
                             f"ids must be unique", code="INBOX")
        event = self._log({"target": target, "start": len(pending), "inserted": [message]})
        pending.append(message)
        return event

    def claim(self, target: InboxTarget, count: int | None = None) -> list[FrozenDict]:
        """Remove and return the first ``count`` messages (all when None) of ``target``."""
        pending = self._target(target)
        taken = len(pending) if count is None else min(count, len(pending))
        if taken == 0:
            return []
        self._log({"target": target, "start": 0, "removedCount": taken, "inserted": []})
        claimed = pending[:taken]
        del pending[:taken]
        return claimed

    def cancel(self, target: InboxTarget | None = None) -> list[FrozenDict]:
        """Drop every pending message of ``target`` (both lists when None), logged canceled."""
        dropped: list[FrozenDict] = []
        for name in ((target,) if target is not None else ("next-turn", "next-step")):
            pending = self._target(name)
            if pending:
                self._log({"target": name, "start": 0, "removedCount": len(pending),
                           "inserted": [], "outcome": "canceled"})
                dropped.extend(pending)
                pending.clear()
        return dropped

    def _target(self, target: str) -> list[FrozenDict]:
        try:
            return self._lists[target]
        except KeyError:
            raise AgentError(f"inbox target {target!r} is not 'next-turn' or 'next-step'",
                             code="INBOX") from None

    def replay(self, events: Iterable[Event]) -> None:
        """Rebuild the lists from logged splices (resume; docs/rules.md#resume).

        Splices with an unknown target or malformed coordinates were written by something
        else and say nothing this inbox can apply: each is logged (WARNING, with its seq) and
        left out.
        """
        for event in events:
            if event["type"] != INBOX_EVENT:
                continue
            data = event["data"]
            ok = isinstance(data, Mapping) and data.get("target") in self._lists
            start = data.get("start") if ok else None
            removed = data.get("removedCount", 0) if ok else None
            inserted = (data.get("inserted") or []) if ok else None
            if type(start) is not int or type(removed) is not int or not isinstance(
                    inserted, Sequence):
                logger.warning("inbox splice at seq %s is malformed; not replayed",
                               event["seq"])
                continue
            pending = self._lists[data["target"]]
            pending[start:start + removed] = list(inserted)

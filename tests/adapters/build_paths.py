"""What ``DshSession.add_items`` builds of a batch sequence, for the build-path equivalence tests.

:func:`outcomes` runs the SDK session's build path (``_normalize``, then ``_append_items``
through the turn shaper and the recorder into ``Session.append``, inside one ``batch()`` as
``add_items`` does) on a fresh session whose clock and message ids count up, so two runs of
the same batches give the same bytes wherever their code paths agree.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

import dsh._messages
from dsh.adapters._log import TurnShaper
from dsh.adapters.openai_agents import FORMAT, _append_items, _normalize
from dsh.agent import Recorder
from dsh.json import dumps
from dsh.session import Session


def outcomes(batches: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each batch's appended events (their JSON text) and the error it raised, if any.

    An error is ``[type name, code, message, where]``; the batches after it go on with the
    same shaper, as the next ``add_items`` of a live session would.
    """
    ids = itertools.count()
    ticks = itertools.count(1_000)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dsh._messages, "new_message_id", lambda: f"m{next(ids)}")
        session = Session.create("equivalence", clock=lambda: next(ticks))
        shaper = TurnShaper(Recorder(session), FORMAT)
        found: list[dict[str, Any]] = []
        for items in batches:
            before = session.seq
            error = None
            try:
                plain = _normalize(items, "equivalence")
                with session.batch():
                    _append_items(shaper, plain, model="gpt-test", dispatch=True,
                                  provider="openai")
            except Exception as exc:  # recorded and compared, whatever refused the batch
                error = [type(exc).__name__, getattr(exc, "code", None), str(exc),
                         {k: str(v) for k, v in getattr(exc, "where", {}).items()}]
            found.append({"events": [dumps(event).decode() for event in
                                     session.events[before:]], "error": error})
        return found

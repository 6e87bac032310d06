"""SIGKILL around every tool call, in real processes, against a counting payments server.

Each trial kills the agent at one point around one call (before the body, inside it before and
after the side effect, after the body before the result is durable), optionally kills the
resume while it decides and acts, then resumes to the end (see
:mod:`tests.agent.effect_faults`). The promises: no duplicate effect for idempotent and
reconcilable tools, no second run of an irreversible one, and no call left without a result or
a pending approval. A bounded set runs here (a few dozen kills); ``bench/bench_effects.py``
runs 1,000 kills per class. ``DSH_EFFECT_TRIALS=all`` runs every combination here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsh.testing._stores import postgres_unreachable, temporary_postgres_url
from tests.agent.effect_faults import (
    FIRST_POINTS,
    KLASSES,
    SECOND_POINTS,
    Trial,
    check_trial,
    run_trial,
    spawn_process,
)
from tests.agent.payments import PaymentsServer

# Every class at every first point, and per class one resume killed where it acts again.
BOUNDED = [(klass, first, "") for klass in KLASSES for first in FIRST_POINTS] + [
    ("read_only", "effect.after", "effect.after"),
    ("idempotent", "effect.after", "recovery.decided"),
    ("idempotent", "tool.before-body", "effect.after"),
    ("reconcilable", "effect.before", "effect.before"),
    ("reconcilable", "tool.after-body", "recovery.decided"),
    ("irreversible", "effect.after", "recovery.decided"),  # never reached: it does not re-run
]
ALL = [(k, f, s) for k in KLASSES for f in FIRST_POINTS for s in SECOND_POINTS]
CASES = ALL if os.environ.get("DSH_EFFECT_TRIALS") == "all" else BOUNDED


@pytest.fixture
def postgres_url() -> Iterator[str]:
    reason = postgres_unreachable()
    if reason is not None:
        pytest.skip(f"SKIPPED LOUDLY: {reason}")
    with temporary_postgres_url(lease_ms=300) as url:
        yield url


@pytest.fixture(scope="module")
def server() -> Iterator[PaymentsServer]:
    with PaymentsServer() as running:
        yield running


def _assert_promises(trial: Trial) -> None:
    assert trial.duplicates == 0, trial
    assert trial.reruns == 0, trial
    assert trial.unanswered == 0, trial
    if trial.klass in ("idempotent", "reconcilable"):
        assert trial.applied == 1, trial  # the effect happened, exactly once
    if trial.klass == "irreversible":
        # In doubt after every kill point around it: a person is asked, the body never re-ran.
        assert trial.pending_approval, trial
        assert trial.started <= 1, trial


@pytest.mark.parametrize(("klass", "first", "second"), CASES,
                         ids=[f"{k}-{f}-{s or 'finish'}" for k, f, s in CASES])
def test_a_killed_tool_call_is_never_repeated_nor_left_unanswered(
        server: PaymentsServer, tmp_path: Path, klass: str, first: str, second: str) -> None:
    url = f"sqlite:///{tmp_path}/sessions.db"
    session_id = f"{klass}-{first}-{second}"  # the server counts per session and call
    trial = run_trial(spawn_process, url, server.url, session_id, klass, first, second)
    assert trial.stages[0].killed and trial.stages[0].kill_at == first
    check_trial(trial, url, server.url, session_id)
    _assert_promises(trial)


@pytest.mark.parametrize(("klass", "first"), [("idempotent", "effect.after"),
                                              ("reconcilable", "effect.after")])
def test_a_killed_call_on_postgresql_reuses_the_key_of_the_epoch_that_recorded_it(
        server: PaymentsServer, postgres_url: str, klass: str, first: str) -> None:
    # The resumed writer holds a newer lease epoch; the re-run still uses the recorded key, so
    # the server sees one key and applies the effect once.
    session_id = f"fault-{klass}"
    trial = run_trial(spawn_process, postgres_url, server.url, session_id, klass, first, "")
    check_trial(trial, postgres_url, server.url, session_id)
    _assert_promises(trial)
    recorded, final = _recorded_and_final_epochs(postgres_url, session_id)
    assert recorded < final  # the re-run's writer held a newer lease than the call's


def _recorded_and_final_epochs(url: str, session_id: str) -> tuple[int, int]:
    """The epoch the call's key was derived from, and the session's lease epoch at the end."""
    import psycopg

    import dsh
    from dsh.agent import idempotency_key

    with dsh.open(url) as store:
        read = store.read(session_id)
    events, created_at = read.events, read.header["createdAt"]
    call = next(e for e in events if e["type"] == "tool/call")
    reruns = [e for e in events if e["type"] == "tool/recovery"]
    assert reruns and {e["data"]["idempotencyKey"] for e in reruns} == {
        call["data"]["idempotencyKey"]}
    recorded = next(epoch for epoch in range(100) if idempotency_key(
        session_id, call["seq"], epoch, created_at=created_at) == call["data"]["idempotencyKey"])
    base, _, query = url.partition("?")
    schema = dict(part.split("=", 1) for part in query.split("&"))["schema"]
    with psycopg.connect(base) as conn:
        row = conn.execute(f"SELECT lease_epoch FROM {schema}.sessions WHERE id = %s",
                           (session_id,)).fetchone()
    assert row is not None
    return recorded, int(row[0])

"""LangGraph's published checkpointer conformance suite, in full, against DshSaver.

Runs ``langgraph-checkpoint-conformance`` (every base and extended capability) on a dsh SQLite
store and on PostgreSQL, and prints the suite's own report into the test output (CI shows it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from dsh.adapters.langgraph import DshSaver
from dsh.testing._stores import postgres_unreachable, temporary_postgres_url


def _run(name: str, url_for: object) -> None:
    @checkpointer_test(name=name)
    async def factory() -> AsyncIterator[DshSaver]:
        async with url_for() as url, DshSaver.from_url(url) as saver:  # type: ignore[operator]
            yield saver

    report = asyncio.run(validate(factory))
    report.print_report()
    failures = {cap: result.failures for cap, result in report.results.items()
                if result.passed is not True}
    assert not failures, failures
    assert {cap for cap, r in report.results.items() if r.passed} == {
        cap.value for cap in ALL_CAPABILITIES}


class _Url:
    def __init__(self, make: object) -> None:
        self.make = make

    async def __aenter__(self) -> str:
        self.cm = self.make()  # type: ignore[operator]
        return str(self.cm.__enter__())

    async def __aexit__(self, *exc: object) -> None:
        self.cm.__exit__(*exc)


def test_conformance_on_sqlite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    count = iter(range(1000))

    class Fresh:
        def __enter__(self) -> str:
            return f"sqlite:///{tmp_path / f'suite-{next(count)}.db'}"

        def __exit__(self, *exc: object) -> None:
            pass

    with capsys.disabled():
        _run("DshSaver on dsh SQLite", lambda: _Url(Fresh))


@pytest.mark.skipif(postgres_unreachable() is not None,
                    reason=f"SKIPPED LOUDLY: {postgres_unreachable()}")
def test_conformance_on_postgresql(capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        _run("DshSaver on dsh PostgreSQL", lambda: _Url(temporary_postgres_url))

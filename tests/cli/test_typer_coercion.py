"""The deferred typer coercion of dsh.cli._help: typer's own results, and typer as it is when
its internals move (src/dsh/cli/_help.py ``_deferred_coercion``, docs/cli.md)."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Annotated, Any

import pytest
import typer
from typer import _coercion, core
from typer.testing import CliRunner

from dsh.cli._help import _deferred_coercion


class Color(enum.Enum):
    red = "red"
    blue = "blue"


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def main(name: str,
             count: Annotated[int, typer.Option(min=1, max=100)] = 1,
             free: Annotated[int, typer.Option()] = 0,
             clamped: Annotated[int, typer.Option(min=0, max=5, clamp=True)] = 0,
             path: Annotated[Path | None, typer.Option()] = None,
             color: Annotated[Color, typer.Option()] = Color.red,
             wait: Annotated[float, typer.Option(min=0)] = 5.0,
             paths: Annotated[list[Path] | None, typer.Option("--p")] = None,
             ratio: Annotated[float, typer.Option(min=0, max=1, clamp=True)] = 1.5,
             texts: Annotated[list[str] | None, typer.Option("--t")] = None) -> None:
        typer.echo(repr((name, count, free, clamped, path, color, wait, paths, ratio, texts)))

    return app


ARGS = [["x"], ["x y"], ["٣"], ["x", "--count", "7"], ["x", "--count", "007"],
        ["x", "--count", "0"], ["x", "--count", "101"], ["x", "--count", "٣"],
        ["x", "--count", " 7"], ["x", "--count", "1_0"], ["x", "--count", "+7"],
        ["x", "--count", "seven"], ["x", "--free", "99999999999999999999999"],
        ["x", "--free", "-3"], ["x", "--clamped", "9"], ["x", "--path", "a/b"],
        ["x", "--color", "blue"], ["x", "--color", "green"], ["x", "--wait", "2.5"],
        ["x", "--wait", "-1"], ["x", "--wait", "nan"], ["x", "--wait", "inf"],
        ["x", "--p", "a/b", "--p", "", "--p", ".", "--p", "a//b/", "--p", "~/x", "--p", "-"],
        ["x", "--p", "/nonexistent/\udcff"], ["x", "--ratio", "0.5"],
        ["x", "--t", "", "--t", "a b", "--t", "٣"]]


def _outputs() -> list[tuple[int, str]]:
    runner = CliRunner()
    results = [runner.invoke(_app(), args) for args in ARGS]
    return [(result.exit_code, result.output) for result in results]


@pytest.fixture
def typer_own(monkeypatch: pytest.MonkeyPatch) -> Any:
    """typer's hook as typer ships it (the patch undone for the test)."""
    _deferred_coercion()
    own = core.build_runtime_param.__wrapped__  # type: ignore[attr-defined]
    monkeypatch.setattr(core, "build_runtime_param", own)
    return own


def test_the_deferred_coercion_gives_typers_own_results_and_errors(
        typer_own: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    own = _outputs()
    _deferred_coercion()
    assert core.build_runtime_param is not typer_own
    assert _outputs() == own
    assert own[3] == (0, "('x', 7, 0, 0, None, <Color.red: 'red'>, 5.0, None, 1.0, None)\n")
    assert own[-1] == (0, "('x', 1, 0, 0, None, <Color.red: 'red'>, 5.0, None, 1.0, "
                          "['', 'a b', '٣'])\n")
    assert "[PosixPath('a/b'), PosixPath('.'), PosixPath('.'), PosixPath('a/b'), " \
        "PosixPath('~/x'), PosixPath('-')]" in own[22][1]
    assert own[6][0] == 2 and "less than or equal to 100" in own[6][1]  # typer's error


def test_typer_runs_as_it_is_when_its_runtime_param_changes(
        typer_own: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    own = _outputs()

    @dataclasses.dataclass(frozen=True)
    class Moved(_coercion.RuntimeParam):  # a field the patch does not know
        strict: bool = False

    monkeypatch.setattr(_coercion, "RuntimeParam", Moved)
    _deferred_coercion()
    assert core.build_runtime_param is typer_own
    monkeypatch.delattr(core, "build_runtime_param")
    _deferred_coercion()  # no hook at all: nothing to patch, no error
    monkeypatch.setattr(core, "build_runtime_param", typer_own, raising=False)
    assert _outputs() == own


def test_a_descriptor_it_cannot_read_gets_typers_own_runtime_param(typer_own: Any) -> None:
    _deferred_coercion()
    descriptor = _coercion.resolve_type_descriptor(annotation=int,
                                                   parameter_info=typer.Option(0))

    class Moved:  # a descriptor without is_choice
        annotation = descriptor.annotation
        parameter_info = descriptor.parameter_info
        file_annotation = descriptor.file_annotation

    param = core.build_runtime_param(Moved())  # type: ignore[arg-type]
    assert type(param) is type(typer_own(descriptor))
    assert type(core.build_runtime_param(descriptor)) is not type(param)

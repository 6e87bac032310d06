"""Coverage-guided fuzzing of every importer (atheris), for long runs by hand.

The property is the one ``tests/interop/test_fuzz.py`` checks in CI on a bounded number of
examples: any bytes given to any importer (and to format detection) give sessions that seed a
dsh Session, or an ``ImportFormatError`` naming the file — never another exception, and never
the ``IMPORT_UNMAPPED`` backstop (each such case is a missing check in an importer). The first
input byte picks the format (and file suffix); the rest is the file.

Usage (from the repository root, with ``pip install atheris``)::

    python tools/fuzz/fuzz_importers.py -atheris_runs=200000 -max_len=65536 CORPUS_DIR
    python tools/fuzz/fuzz_importers.py --seed-corpus CORPUS_DIR  # write seeds, then fuzz it
    python tools/fuzz/fuzz_importers.py --replay FILE...           # re-check saved crashes

``--seed-corpus`` fills the folder with the bundled example transcripts, the test fixtures (and
the shared corpus when ``DSH_SHARED`` or ``../shared`` has one), each prefixed with its format
byte.
A failure is raised as ``AssertionError`` so atheris saves the input as ``crash-*``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from dsh._errors import ImportFormatError  # noqa: E402  (after the path setup above)
from dsh.interop import FORMATS, import_file  # noqa: E402
from dsh.interop._common import UNMAPPED_CODE  # noqa: E402

CHOICES = [(fmt, suffix) for fmt in ("auto", *FORMATS) for suffix in (".jsonl", ".json")]
"""(format, file suffix) chosen by the first input byte, modulo this list's length."""

_WORK = Path(tempfile.mkdtemp(prefix="dsh-fuzz-importers-"))


def check(data: bytes) -> None:
    """Import ``data[1:]`` as the format ``data[0]`` names; raise AssertionError on a bug."""
    if not data:
        return
    fmt, suffix = CHOICES[data[0] % len(CHOICES)]
    path = _WORK / f"input{suffix}"
    path.write_bytes(data[1:])
    try:
        for top in import_file(path, fmt):
            for imported in top.walk():
                imported.to_session(clock=lambda: 0)
    except ImportFormatError as error:
        if error.code == UNMAPPED_CODE or "path" not in error.where:
            raise AssertionError(f"{fmt}: {error.code}: {error}") from error
    except Exception as error:
        raise AssertionError(f"{fmt}: untyped {type(error).__name__}: {error}") from error


def seed_corpus(folder: Path) -> int:
    """Write every example transcript into ``folder`` prefixed with its format byte."""
    folder.mkdir(parents=True, exist_ok=True)
    shared = Path(os.environ.get("DSH_SHARED", REPO.parent / "shared")) / "corpus"
    roots = [REPO / "src" / "dsh" / "examples" / "transcripts", REPO / "tests" / "interop" /
             "fixtures", shared]
    count = 0
    for root in roots:
        for source in sorted(root.rglob("*")) if root.is_dir() else []:
            fmt = source.relative_to(root).parts[0]
            suffix = ".jsonl" if source.suffix == ".jsonl" else ".json"
            if not source.is_file() or (fmt, suffix) not in CHOICES:
                continue
            if source.stat().st_size > 1 << 20:
                continue
            tag = bytes([CHOICES.index((fmt, suffix))])
            (folder / f"{fmt}-{source.name}").write_bytes(tag + source.read_bytes())
            count += 1
    return count


def main(argv: list[str]) -> int:
    """Run atheris (``argv`` as libFuzzer flags), or ``--replay`` / ``--seed-corpus``."""
    if argv[1:2] == ["--replay"]:
        for name in argv[2:]:
            check(Path(name).read_bytes())
            print(f"ok {name}")
        return 0
    if argv[1:2] == ["--seed-corpus"]:
        folder = Path(argv[2])
        print(f"wrote {seed_corpus(folder)} seeds to {folder}")
        argv = [argv[0], str(folder), *argv[3:]]
    import atheris  # type: ignore[import-not-found]  # optional: only for long runs

    atheris.instrument_all()  # coverage of dsh (imported above) guides the mutations
    atheris.Setup(argv, check)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

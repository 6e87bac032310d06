"""``dsh import`` of a Claude Code transcript of mostly blank lines: memory does not grow by line.

docs/interop.md#streaming-imports: the branch index is keyed by record (a non-blank line), not
by file line, so blank lines cost nothing but counting. Before, its flags and its two arrays
were sized by the last line's number: 9 bytes a blank line (a 300 MB file of blank lines needed
2.7 GB). The same transcript is imported in a fresh process with and without a run of
:data:`BLANK_LINES` blank lines in the middle (and blank, CRLF and whitespace-only lines
between its records); the peak RSS of that child (``ru_maxrss``) may differ only by noise.
"""

from __future__ import annotations

from pathlib import Path

from tests.cli.test_cli import Dsh
from tests.cli.test_import_memory import _peak_mb, _transcript

BLANK_LINES = 50_000_000
"""The run of blank lines (50 MB): before the fix it cost 9 bytes a line, 450 MB."""
GROWTH_BOUND_MB = 25


def _spaced(source: Path, target: Path, blank_run: int) -> None:
    """``source``'s records with blank lines between them, and ``blank_run`` in the middle.

    A summary (title) line is added, so the branch is chosen by the full resolve (the one
    that also held two 4-byte arrays a line), not by the linear shortcut.
    """
    records = source.read_bytes().splitlines()
    gaps = [b"", b"\n", b"\r\n", b"  \t\n", b"\n\n\x0c \r\n"]
    with target.open("wb") as out:
        for i, record in enumerate(records):
            if i == len(records) // 2:
                out.write(b"\n" * blank_run)
            out.write(gaps[i % len(gaps)] + record + (b"\r\n" if i % 3 == 0 else b"\n"))
        out.write(b'{"type":"summary","summary":"Serving","leafUuid":"nowhere"}\n\n \n')


def test_blank_lines_do_not_grow_the_import_peak_memory(tmp_path: Path) -> None:
    dsh = Dsh(tmp_path)
    plain = tmp_path / "plain.jsonl"
    _transcript(plain, 1)
    peaks, events = [], []
    for run in (0, BLANK_LINES):
        transcript = tmp_path / f"blank{run}" / "5e551011-0000-4000-8000-00000000abcd.jsonl"
        transcript.parent.mkdir()
        _spaced(plain, transcript, run)
        url = f"sqlite:{tmp_path / f'blank{run}.db'}"
        peaks.append(_peak_mb(dsh, transcript, url))
        events.append(dsh.json("ls", "--json", "--store", url)[0]["events"])
    assert events[0] == events[1] > 1000
    assert peaks[1] - peaks[0] < GROWTH_BOUND_MB, peaks

"""A streamed dsh-log import equals the whole-file one: same events, same refusals.

``stream_file(path, "dsh")`` verifies the log without holding it (``verify_paged`` over a view
that decodes lines again); ``import_dsh_log`` reads and verifies it whole
(docs/interop.md#streaming-imports). Both run here on the same files: random well-formed logs,
the same with one event damaged (a key dropped or set, so ``dsh verify`` refuses it at a
known seq), a line that is no JSON, a bad header, and packed chunk rows; the outcome (the
sessions, or the error's message and line) must be identical. The streamed import keeps the
first read's frozen events of the log's first lines (``HELD_LOG_BYTES``, ``HELD_EVENTS``)
and decodes the rest again: the byte bound is drawn too (nothing held, a prefix, the whole
log), so both ways of serving an event are compared with the whole-file import.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh import ImportFormatError
from dsh.interop import _dsh_log_stream, collect, stream_file
from dsh.interop._dsh_log import import_dsh_log
from dsh.json import dumps, thaw
from dsh.session._session import Session
from tests.strategies import StepClock, apply_script, examples, log_scripts

_DAMAGE = [("seq", 99), ("seq", True), ("time", "1"), ("type", 3), ("type", "request/header-delta"),
           ("type", "session/end-seed"), ("extra", 1), ("ignorable", True), ("data", None),
           ("drop", "data"), ("type", "user/message"), ("type", "turn/start"),
           ("type", "tool/result"), ("type", "x/unknown"), ("data", {"turn": 0}),
           ("surfaceOp", "append"), ("sourceEventSeqs", [99]), ("drop", "surfaceOp"),
           ("drop", "seq"), ("drop", "time"), ("line", b"{not json"), ("line", b"[1, 2]"),
           ("header", {"type": "session", "version": 1, "id": "x"}),
           ("header", {"type": "event"}),
           ("row", {"type": "text-chunks", "seq0": 0, "data": {"texts": ["a", "b"], "dt": [1],
                                                             "turn": 1, "step": 1, "index": 0}}),
           ("row", {"type": "text-chunks", "data": {"texts": [], "dt": []}})]


def _outcome(path: Path, streamed: bool, held: int = 0,
             read_bytes: int = _dsh_log_stream._READ_BYTES) -> tuple[Any, ...]:
    kept = _dsh_log_stream.HELD_LOG_BYTES, _dsh_log_stream._READ_BYTES
    _dsh_log_stream.HELD_LOG_BYTES = held  # type: ignore[misc]  # drawn: see the docstring
    _dsh_log_stream._READ_BYTES = read_bytes  # type: ignore[misc]  # drawn, as held
    try:
        sessions = collect(stream_file(path, "dsh")) if streamed else import_dsh_log(path)
    except ImportFormatError as error:
        return "refused", error.message, error.where.get("line")
    finally:
        # restored
        _dsh_log_stream.HELD_LOG_BYTES, _dsh_log_stream._READ_BYTES = kept  # type: ignore[misc]
    # lines: None for the trailing import/source event, listed or left off
    return "imported", [(s.session_id, s.header, [thaw(e) for e in s.events],
                         [*s.lines, *[None] * (len(s.events) - len(s.lines))])
                        for s in sessions]


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(script=log_scripts(open_tail=None), damage=st.one_of(
    st.none(), st.tuples(st.floats(0, 1), st.sampled_from(_DAMAGE))),
    held=st.one_of(st.just(0), st.integers(1, 4000), st.just(1 << 40)),
    gap=st.sampled_from([b"\n", b"\n", b"\n\n", b"\r\n \t\n\n"]),
    read_bytes=st.sampled_from([1, 300, 4 << 20]))
def test_streamed_dsh_log_import_matches_whole(script: Any, damage: Any, held: int, gap: bytes,
                                               read_bytes: int) -> None:
    """Also with blank lines between the lines (the later lines read back a few bytes at a
    time, or one at a time), naming the same file lines."""
    session = Session.create("s", clock=StepClock())
    apply_script(session, script)
    head: dict[str, Any] = {"type": "session", **thaw(session.header)}
    lines = [dumps(head), *(dumps(event) for event in session.events)]
    if damage is not None and len(lines) > 1:
        i = 1 + min(len(lines) - 2, int((len(lines) - 1) * damage[0]))
        key, value = damage[1]
        if key == "line":
            lines[i] = value
        elif key == "header":
            lines[0] = dumps(value)
        elif key == "row":
            lines[i] = dumps({**value, "seq0": i - 1} if "seq0" in value else value)
        else:
            fields = thaw(session.events[i - 1])
            if key == "drop":
                fields.pop(value, None)
            else:
                fields[key] = value
            lines[i] = dumps(fields)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "session.jsonl"
        path.write_bytes(gap.join(lines) + b"\n")
        assert _outcome(path, True, held, read_bytes) == _outcome(path, False)


def test_streamed_dsh_log_import_refuses_a_true_seq_as_the_whole_file_import_does(
        tmp_path: Path) -> None:
    # `true == 1`: the line check passes a seq `true` at seq 1; the paged view cannot serve it
    # (its pages are checked by integer seq), so such a log is read whole, as it was refused.
    session = Session.create("s", clock=StepClock())
    session.append("turn/start", {"turn": 1})
    session.append("step/start", {"turn": 1, "step": 1})
    events = [thaw(event) for event in session.events]
    events[1]["seq"] = True
    path = tmp_path / "session.jsonl"
    path.write_bytes(b"\n".join([dumps({"type": "session", **thaw(session.header)}),
                                 *(dumps(event) for event in events)]) + b"\n")
    whole = _outcome(path, False)
    assert whole[0] == "refused"
    assert _outcome(path, True) == _outcome(path, True, 1 << 40) == whole

"""An adapter's records cut out of a stored event's JSON text, for a whole-history read.

A framework record is kept verbatim in its message: a whole-history read wants those records,
not the message around them, so it takes their JSON texts from the row's text, checked against
the seal first, and leaves the rest unparsed (docs/rules.md#verified-page-in,
docs/adapters.md#busy-sessions-reads-and-names). The C accelerator's
``record_texts`` does that without a parse; :func:`python_record_texts` is its reference (it
parses), and runs when the accelerator is not built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import orjson

from dsh.json import c_record_texts
from dsh.persistence import RecordCut

__all__ = ["RECORD_PATHS", "RecordPicker", "python_record_texts", "record_picker", "records_at"]

RECORD_KEY: Final = "adapterRecord"
"""Key holding the framework records a message was made from: in the message's ``source``,
for a ``tool/result`` in ``data.meta``."""

RECORD_PATHS: Final[Mapping[str, tuple[tuple[str, ...], str | None]]] = {
    "user/message": (("source", RECORD_KEY), None),
    "system/message": (("source", RECORD_KEY), None),
    "assistant/message": (("message", "source", RECORD_KEY), None),
    "tool/result": (("meta", RECORD_KEY), "message"),
}
"""Per event type: where its data holds the records, and a member that must be an object
(a ``tool/result`` keeps its records in ``data.meta`` beside its ``data.message``): the one
place :func:`records_at` (so ``dsh.adapters._log.records_of``) and the C cut read it from."""


def records_at(etype: str, data: Any, fmt: str) -> list[Any] | None:
    """The records of format ``fmt`` that the data of an event of type ``etype`` holds, or None.

    Args:
        etype: The event's type (only those in :data:`RECORD_PATHS` hold records).
        data: The event's ``data`` (a dict, frozen or plain; anything else holds none).
        fmt: The record format wanted.

    Returns:
        The ``records`` list at the type's path, as stored; None when the type holds no
        records, a member on the way (or the one that must be) is not an object, the format
        differs or ``records`` is not a list.
    """
    where = RECORD_PATHS.get(etype)
    return None if where is None else _records_in(data, where[0], fmt, where[1])


def _records_in(value: Any, path: tuple[str, ...], fmt: str, need: str | None) -> list[Any] | None:
    """The ``records`` list at ``path`` of the object ``value`` (see :func:`records_at`)."""
    if not isinstance(value, dict) or (need is not None
                                       and not isinstance(value.get(need), dict)):
        return None
    for name in path:
        value = value.get(name) if isinstance(value, dict) else None
    if not isinstance(value, dict) or value.get("format") != fmt:
        return None
    records = value.get("records")
    return records if isinstance(records, list) else None


def python_record_texts(text: str, path: tuple[str, ...], fmt: str,
                        need: str | None = None) -> tuple[bytes, ...] | None:
    """The JSON texts of the records of format ``fmt`` at ``path`` of the JSON object ``text``.

    Args:
        text: A stored event's data, as JSON text.
        path: Object members from the top to the record holder ``{"format", "records"}``.
        fmt: The record format wanted.
        need: A member of the top object that must be an object too (None: no such check).

    Returns:
        Each record as JSON (UTF-8 bytes), in order; None when ``text`` is not a JSON object
        orjson reads, a member on the way is not an object, the format differs or ``records``
        is not an array. (The accelerator may also give None where it cannot vouch for its
        cut; where it gives texts, they decode to these values.)
    """
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    records = _records_in(value, path, fmt, need)
    return None if records is None else tuple(orjson.dumps(record) for record in records)


class RecordPicker:
    """``pick(event type, data text)``: the records of format ``fmt`` a row holds, or None.

    For :meth:`dsh.persistence.SelectsEvents.read_selected`'s ``pick``: None for an event type
    that holds no records, or a row the cut cannot serve (the reader then decodes it whole).

    Args:
        fmt: The adapter's record format.
        accelerated: Use the C accelerator when it is built (False: the Python reference).

    Attributes:
        cut: What the picker cuts (:data:`RECORD_PATHS`, ``fmt``) when it is the accelerator's
            ``record_texts``, so that a source may cut its rows in its own C pass
            (:class:`~dsh.persistence.PicksRecords`); None for the Python reference.
    """

    __slots__ = ("_cut", "_fmt", "cut")

    def __init__(self, fmt: str, *, accelerated: bool = True) -> None:
        fast = c_record_texts if accelerated else None
        self._cut: Callable[[str, tuple[str, ...], str, str | None],
                            tuple[bytes, ...] | None] = (fast if fast is not None
                                                         else python_record_texts)
        self._fmt = fmt
        self.cut = RecordCut(dict(RECORD_PATHS), fmt) if fast is not None else None

    def __call__(self, etype: str, text: str) -> tuple[bytes, ...] | None:
        where = RECORD_PATHS.get(etype)
        return None if where is None else self._cut(text, where[0], self._fmt, where[1])


def record_picker(fmt: str, *, accelerated: bool = True) -> RecordPicker:
    """The :class:`RecordPicker` of format ``fmt`` (see there)."""
    return RecordPicker(fmt, accelerated=accelerated)

"""Where the records of a seal file sit, for tests that damage them.

Layout: docs/formats.md#the-seal-chain.
"""

from __future__ import annotations

from dsh.persistence import _chain, _seal


def header_size(data: bytes) -> int:
    """Bytes before the first record: magic, identity length, identity, head slots (v2)."""
    size = len(_seal.MAGIC) + 4 + int.from_bytes(data[8:12], "little")
    return size + (2 * _chain.HEAD_SLOT if data.startswith(_seal.MAGIC2) else 0)


def positions(data: bytes) -> list[tuple[str, int, int]]:
    """``(kind, offset, size)`` of every record: ``range``, ``chain`` or ``mark``."""
    out: list[tuple[str, int, int]] = []
    pos = header_size(data)
    while pos + 20 <= len(data):
        start = int.from_bytes(data[pos:pos + 8], "little")
        if start == _chain.CHAIN_MARK:
            found = _chain.decode_record(data, pos)
            assert found is not None
            out.append(("chain", pos, found[1] - pos))
            pos = found[1]
        else:
            out.append(("mark" if start == _seal.RESTORE_POINT_MARK else "range", pos, 20))
            pos += 20
    return out


def unpublish(data: bytes, batches: int) -> bytes:
    """``data`` with a head that counts only its first ``batches`` chain records: the seal as
    a writer that crashed before publishing a later head left it."""
    records = [_chain.decode_record(data, pos) for kind, pos, _ in positions(data)
               if kind == "chain"]
    chain = [found[0] for found in records if found is not None][:batches]
    head = _chain.Head(1, len(chain), chain[-1].end if chain else 0,
                       chain[-1].hash if chain else bytes(32))
    at = header_size(data) - 2 * _chain.HEAD_SLOT
    slots = _chain.encode_head(head) + bytes(_chain.HEAD_SLOT)
    return data[:at] + slots + data[at + len(slots):]

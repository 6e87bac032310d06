"""Zstandard frames of a JSONL log: one (de)compressor per thread and the checked frame decode.

Shared by the backend (writes, full reads) and the restore-point reader (page-ins); no disk.
"""

from __future__ import annotations

import threading

import zstandard

from dsh._errors import LogCorruptError

_ZSTD = threading.local()  # zstandard (de)compressor contexts are not thread-safe


def decompressor() -> zstandard.ZstdDecompressor:
    """This thread's decompressor."""
    dctx: zstandard.ZstdDecompressor | None = getattr(_ZSTD, "dctx", None)
    if dctx is None:
        dctx = _ZSTD.dctx = zstandard.ZstdDecompressor()
    return dctx


def compressor() -> zstandard.ZstdCompressor:
    """This thread's compressor (level 3, content checksum on)."""
    # docs/formats.md#zstandard-files: default level 3, content checksum on, no dictionary
    cctx: zstandard.ZstdCompressor | None = getattr(_ZSTD, "cctx", None)
    if cctx is None:
        cctx = _ZSTD.cctx = zstandard.ZstdCompressor(level=3, write_checksum=True)
    return cctx


def decompress_frame(frame: bytes, start: int, path: str) -> bytes:
    """The plaintext of one complete frame found at file offset ``start`` of ``path``.

    Raises:
        LogCorruptError: the frame has no content checksum, fails it, or is incomplete.
    """
    # Every frame dsh and we write carries a content checksum (docs/formats.md#zstandard-files),
    # which libzstd verifies on decompression: it is the integrity check of every committed zstd
    # byte.
    if not frame[4] & 0x04:
        raise LogCorruptError(f"corrupt session log: frame at byte {start} carries no content "
                              f"checksum (dsh always writes one) in {path}", path=path,
                              byte_offset=start)
    try:
        dobj = decompressor().decompressobj()
        out = dobj.decompress(frame)
    except zstandard.ZstdError as exc:
        raise LogCorruptError(f"corrupt session log: frame at byte {start} failed validation "
                              f"({exc}) in {path}", path=path, byte_offset=start) from exc
    if not dobj.eof:
        raise LogCorruptError(f"corrupt session log: frame at byte {start} failed validation "
                              f"(incomplete frame) in {path}", path=path, byte_offset=start)
    return out

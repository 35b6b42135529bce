"""What the codecs read a compressed file's bytes from: a descriptor of a local file, or a positional
source (an object in a bucket, :class:`~rank_dataset.files.io.ObjectFile`), through the same
three calls: :func:`pread`, :func:`size_of` and :func:`file_object`.
"""

from __future__ import annotations

import io
import os

from rank_dataset.files.io.base import Positional, PositionalIO

__all__ = ["Positional", "RawFile", "file_object", "pread", "size_of"]


RawFile = int | Positional


def pread(raw: RawFile, count: int, offset: int) -> bytes:
    """Up to ``count`` bytes at ``offset`` (fewer at the end)."""
    return os.pread(raw, count, offset) if isinstance(raw, int) else raw.pread(count, offset)


def size_of(raw: RawFile) -> int:
    return os.fstat(raw).st_size if isinstance(raw, int) else raw.size


def file_object(raw: RawFile) -> io.RawIOBase:
    """A file object reading ``raw`` (a descriptor stays the caller's to close)."""
    return io.FileIO(raw, "rb", closefd=False) if isinstance(raw, int) else PositionalIO(raw)

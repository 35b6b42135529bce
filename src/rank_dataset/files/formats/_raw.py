"""What the codecs read a compressed file's bytes from: a descriptor of a local file, or a positional
source (an object in a bucket, :class:`~rank_dataset.files.io.ObjectFile`), through the same
three calls: :func:`pread`, :func:`size_of` and :func:`file_object`.
"""

from __future__ import annotations

import io
import os
from typing import Protocol

__all__ = ["Positional", "RawFile", "file_object", "pread", "size_of"]


class Positional(Protocol):
    """Bytes read by position, as ``os.pread`` reads a descriptor (short only at the end)."""

    @property
    def size(self) -> int: ...

    def pread(self, count: int, offset: int) -> bytes: ...


RawFile = int | Positional


def pread(raw: RawFile, count: int, offset: int) -> bytes:
    """Up to ``count`` bytes at ``offset`` (fewer at the end)."""
    return os.pread(raw, count, offset) if isinstance(raw, int) else raw.pread(count, offset)


def size_of(raw: RawFile) -> int:
    return os.fstat(raw).st_size if isinstance(raw, int) else raw.size


class _PositionalIO(io.RawIOBase):
    """A seekable read-only file object over a positional source (for indexed_gzip's ``fileobj``)."""

    def __init__(self, raw: Positional) -> None:
        self._raw, self._pos = raw, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._raw.size}[whence]
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self._raw.pread(len(buffer), self._pos)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


def file_object(raw: RawFile) -> io.RawIOBase:
    """A file object reading ``raw`` (a descriptor stays the caller's to close)."""
    return io.FileIO(raw, "rb", closefd=False) if isinstance(raw, int) else _PositionalIO(raw)

"""Where a meta file's bytes come from (:class:`ByteSource`): what the formats, the index and the readers
read through, unaware of whether the bytes are on a disk or in a bucket.

A source has an identity (:attr:`ByteSource.key`: what identifies its content without reading it; a
local file's size, mtime, ctime and inode, an object's size and ETag), positional reads that are
exact (a short one means the content changed: :class:`~rank_dataset.errors.MetaFileChangedError`),
and streaming reads front to back. :meth:`ByteSource.check` tells whether the content is still the one
the key describes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["ENDS", "STREAM_BLOCK", "ByteSource", "hash_ends", "read_ends"]

#: Bytes of each end of a file that identify it cheaply, with its size (:func:`read_ends`).
ENDS = 1 << 16
#: Bytes a streaming read hands out at a time, by default.
STREAM_BLOCK = 16 << 20


class ByteSource(Protocol):
    """The bytes of one meta file, open until :meth:`close` (or the end of a ``with`` block)."""

    @property
    def path(self) -> Path:
        """What names the file in messages (a local path; an object store's URL)."""
        ...

    @property
    def size(self) -> int:
        """Its bytes, as its key says."""
        ...

    def read(self, offset: int, count: int) -> bytes:
        """Bytes ``[offset, offset + count)``, exactly.

        Raises:
            MetaFileChangedError: the file ends before them (it shrank).
        """
        ...

    def read_into(self, out: npt.NDArray[np.uint8], offset: int) -> None:
        """Fill ``out`` from ``offset``, exactly.

        Raises:
            ShortRead: the file ends first (the caller says what that means).
        """
        ...

    def stream(self, start: int = 0, stop: int | None = None, block: int = STREAM_BLOCK) -> Iterator[bytes]:
        """Bytes ``[start, stop)`` (to the end, by default) in order, at most ``block`` at a time."""
        ...

    def check(self) -> None:
        """Raise MetaFileChangedError if the content is no longer the one of the key."""
        ...

    def close(self) -> None: ...


class Positional(Protocol):
    """What :func:`read_ends` reads: a size and exact positional reads (a :class:`ByteSource` has both)."""

    @property
    def size(self) -> int: ...

    def read_into(self, out: npt.NDArray[np.uint8], offset: int) -> None: ...


def read_ends(source: Positional) -> bytes:
    """The first and the last :data:`ENDS` bytes of ``source`` (all of it, twice, if it is shorter):
    what the index's cache and the fingerprint identify a file's content by, with its size.

    Raises:
        ShortRead: the file ends before its size (it shrank).
    """
    head = np.empty(min(source.size, ENDS), np.uint8)
    tail = np.empty_like(head)
    source.read_into(head, 0)
    source.read_into(tail, source.size - tail.size)
    return head.tobytes() + tail.tobytes()


def hash_ends(source: Positional) -> bytes:
    """A 16-byte hash of :func:`read_ends`: what an index cache is checked against."""
    return hashlib.blake2b(read_ends(source), digest_size=16).digest()

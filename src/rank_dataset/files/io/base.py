"""Where a meta file's bytes come from (:class:`ByteSource`): what the formats, the index and the readers
read through, unaware of whether the bytes are on a disk or in a bucket.

A source has an identity (:attr:`ByteSource.key`: what identifies its content without reading it; a
local file's size, mtime, ctime and inode, an object's URL, size and ETag), positional reads that are
exact (a short one means the content changed: :class:`~rank_dataset.errors.MetaFileChangedError`),
and streaming reads front to back. :meth:`ByteSource.check` tells whether the content is still the one
the key describes.
"""

from __future__ import annotations

import abc
import hashlib
import io
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np

from rank_dataset.core.arrays import UInt8Array

__all__ = [
    "ENDS",
    "STREAM_BLOCK",
    "ByteSource",
    "FileKey",
    "ObjectKey",
    "Positional",
    "PositionalIO",
    "SourceKey",
    "hash_ends",
    "read_ends",
]

#: Bytes of each end of a file that identify it cheaply, with its size (:func:`read_ends`).
ENDS = 1 << 16
#: Bytes a streaming read hands out at a time, by default.
STREAM_BLOCK = 16 << 20


@dataclass(frozen=True)
class FileKey:
    """What identifies a file's content without reading it: ``fstat`` fields that change with it."""

    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    device: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileKey:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)

    def __reduce__(self) -> tuple[type[FileKey], tuple[int, int, int, int, int]]:
        # Positional: a key travels in every pickled dataset (to each DataLoader worker).
        return FileKey, (self.size, self.mtime_ns, self.ctime_ns, self.inode, self.device)

    def matches(self, st: os.stat_result) -> bool:
        """Whether ``st`` is this file unchanged (the common case of :meth:`change`, without objects)."""
        mine = (self.size, self.mtime_ns, self.ctime_ns, self.inode, self.device)
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev) == mine

    def digest(self) -> bytes:
        """What a cache's header holds of this key, but for its size; not the device, which one file shared
        over NFS has a different one on each client (git leaves st_dev out of its index check for that reason)."""
        packed = struct.pack("<qqqq", self.size, self.mtime_ns, self.ctime_ns, self.inode)
        return hashlib.blake2b(packed, digest_size=24).digest()

    def change(self, now: SourceKey) -> str | None:
        """What differs between the file as indexed (``self``) and ``now``, in words; None if nothing."""
        if not isinstance(now, FileKey):
            return "it was replaced by an object"
        if (now.inode, now.device) != (self.inode, self.device):
            return "it was replaced by another file (another inode)"
        if now.size != self.size:
            return f"its size changed from {self.size:,} to {now.size:,} bytes"
        if now.mtime_ns != self.mtime_ns:
            return "it was modified (its mtime changed)"
        if now.ctime_ns != self.ctime_ns:
            return "it was modified or its mtime was set back (its ctime changed)"
        return None


@dataclass(frozen=True)
class ObjectKey:
    """What identifies an object's content without reading it: its URL, size and ETag (or, from a server
    that gives no ETag, its last-modified time)."""

    url: str
    size: int
    etag: str | None
    modified: str | None = None

    def digest(self) -> bytes:
        """What a cache's header holds of this key, but for its size."""
        return hashlib.blake2b(f"{self.url}\n{self.etag}\n{self.modified}".encode(), digest_size=24).digest()

    def change(self, now: SourceKey) -> str | None:
        """What differs between the object as indexed (``self``) and ``now``, in words; None if nothing."""
        if not isinstance(now, ObjectKey) or now.url != self.url:
            return "it was replaced by another object"
        if now.size != self.size:
            return f"its size changed from {self.size:,} to {now.size:,} bytes"
        if now.etag != self.etag:
            return f"it was replaced (its ETag changed from {self.etag} to {now.etag})"
        if now.modified != self.modified:
            return "it was replaced (its last-modified time changed)"
        return None


#: What identifies a source's content: a local file's :class:`FileKey`, an object's :class:`ObjectKey`.
SourceKey = FileKey | ObjectKey


_S = TypeVar("_S", bound="ByteSource")


class ByteSource(abc.ABC):
    """The bytes of one meta file, open until :meth:`close` (or the end of a ``with`` block). A store
    subclasses it: its reads, its :meth:`check` and what :meth:`close` releases are all it writes."""

    #: What names the file in messages (a local path; an object store's URL).
    path: Path
    #: What identifies its content (checked at open, or by :meth:`check`).
    key: SourceKey
    #: Whether it is a file of this machine's file systems (which a descriptor reads), not an object.
    local = False

    @property
    def size(self) -> int:
        """Its bytes, as its key says."""
        return self.key.size

    @abc.abstractmethod
    def read(self, offset: int, count: int) -> bytes:
        """Bytes ``[offset, offset + count)``, exactly.

        Raises:
            MetaFileChangedError: the file ends before them (it shrank).
        """

    @abc.abstractmethod
    def read_into(self, out: UInt8Array, offset: int, until: int | None = None) -> None:
        """Fill ``out`` from ``offset``, exactly. ``until``: reads go on in order and none asks past
        ``until`` (a hint, which a source may use to read ahead).

        Raises:
            ShortRead: the file ends first (the caller says what that means).
        """

    @abc.abstractmethod
    def pread(self, count: int, offset: int) -> bytes:
        """As ``os.pread``: up to ``count`` bytes at ``offset`` (fewer at the end only)."""

    @abc.abstractmethod
    def check(self) -> None:
        """Raise MetaFileChangedError if the content is no longer the one of the key."""

    def stream(self, start: int = 0, stop: int | None = None, block: int = STREAM_BLOCK) -> Iterator[bytes]:
        """Bytes ``[start, stop)`` (to the end, by default) in order, at most ``block`` at a time."""
        stop = self.size if stop is None else stop
        while start < stop:
            piece = self.read(start, min(block, stop - start))
            start += len(piece)
            yield piece

    def close(self) -> None:  # noqa: B027 (not abstract: most stores hold nothing to release)
        """Release what it holds (by default, nothing)."""

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Positional(Protocol):
    """Bytes read by position, as ``os.pread`` reads a descriptor (short only at the end)."""

    @property
    def size(self) -> int: ...

    def pread(self, count: int, offset: int) -> bytes: ...


class PositionalIO(io.RawIOBase):
    """A seekable read-only file object over a positional source (for indexed_gzip's and pyarrow's
    ``fileobj``)."""

    def __init__(self, source: Positional) -> None:
        self._source, self._pos = source, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._source.size}[whence]
        self._pos = max(base + offset, 0)
        return self._pos

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self._source.pread(len(buffer), self._pos)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


def read_ends(source: ByteSource) -> bytes:
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


def hash_ends(source: ByteSource) -> bytes:
    """A 16-byte hash of :func:`read_ends`: what an index cache is checked against."""
    return hashlib.blake2b(read_ends(source), digest_size=16).digest()

"""A meta file on a local (or network) file system: :class:`LocalFile`, identified by :class:`FileKey`.

A file is read with positional reads, never through a shared map: a map of a file that shrinks kills
the process with SIGBUS, a positional read comes back short, which is told as the change it is.
"""

from __future__ import annotations

import os
from pathlib import Path

from rank_dataset.core.arrays import UInt8Array
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.io.base import ByteSource, FileKey, SourceKey
from rank_dataset.files.io.pread import pread_exact

__all__ = ["FileKey", "LocalFile", "raise_if_changed", "read_exact"]


def raise_if_changed(path: Path, key: SourceKey, st: os.stat_result) -> None:
    """Raise MetaFileChangedError saying how if ``st`` is not the file ``key`` describes."""
    if not isinstance(key, FileKey) or not key.matches(st):
        what = key.change(FileKey.of(st))
        if what is not None:
            raise MetaFileChangedError(path, what)


def read_exact(fd: int, path: Path, offset: int, count: int) -> bytes:
    """``count`` bytes at ``offset`` of the file ``path`` open at ``fd``.

    Raises:
        MetaFileChangedError: the file ends before them (it shrank).
    """
    raw = os.pread(fd, count, offset)
    if len(raw) < count:
        raise MetaFileChangedError(path, "it shrank while being read")
    return raw


class LocalFile(ByteSource):
    """The local file ``path`` open for reading.

    With ``key``, the file must be the one ``key`` describes (else MetaFileChangedError, as for a file
    gone: it was deleted or moved; with ``checked=False``, the caller checks it later, after a read);
    without, it is the file as it is now (FileNotFoundError if none).
    """

    def __init__(self, path: Path, key: SourceKey | None = None, *, checked: bool = True) -> None:
        self.path = path
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if key is None:
                raise
            raise MetaFileChangedError(path, "it was deleted or moved") from None
        if key is not None and not checked:
            self.key = key
            return
        try:
            st = os.fstat(self.fd)
            if key is not None:
                raise_if_changed(path, key, st)
        except BaseException:
            os.close(self.fd)
            raise
        self.key = FileKey.of(st) if key is None else key

    local = True

    def read(self, offset: int, count: int) -> bytes:
        return read_exact(self.fd, self.path, offset, count)

    def read_into(self, out: UInt8Array, offset: int, until: int | None = None) -> None:
        pread_exact(self.fd, out, offset)

    def pread(self, count: int, offset: int) -> bytes:
        return os.pread(self.fd, count, offset)

    def check_open(self) -> None:
        """Raise MetaFileChangedError if the open file (by descriptor) is not the one of the key."""
        raise_if_changed(self.path, self.key, os.fstat(self.fd))

    def check(self) -> None:
        """Raise MetaFileChangedError unless both the descriptor and the path are still the file of the key."""
        self.check_open()
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            raise MetaFileChangedError(self.path, "it was deleted or moved") from None
        raise_if_changed(self.path, self.key, now)

    def detach(self) -> int:
        """The descriptor, now the caller's to close (this source no longer holds it)."""
        fd, self.fd = self.fd, -1
        return fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

"""The text of a meta file as the collective reader reads it: a plain file's bytes, or the
decompressed bytes of a gzip or zstd file, read from its checkpoints (made by its index), each read
checked against the file's key so that a file changed under a slice is told, never read as lines.

A compressed file's slices start at checkpoints (:meth:`Text.snap`): a rank then decompresses its
own slice and the few bytes past its end that finish its last line, not the spans before it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt

from rank_dataset.errors import CorruptMetaFileError, MetaFileChangedError
from rank_dataset.files.formats import Checkpoints, DecompressedView
from rank_dataset.files.index import FileKey
from rank_dataset.files.scan import NEWLINE

__all__ = ["READ", "Reading", "Text", "chunks", "open_checked"]

READ = 16 << 20  # bytes per sequential read of a slice, counting its lines


class Text:
    """The text of the meta file at ``path``, which ``key`` describes: its own bytes, or for a gzip or
    zstd file (``checkpoints`` given) its decompressed ones.

    Args:
        path: the file.
        key: the file as it was when the reader was made (any change since is an error).
        checkpoints: a compressed file's checkpoints (from its index); None for a plain file.
    """

    def __init__(self, path: Path, key: FileKey, checkpoints: Checkpoints | None = None) -> None:
        self.path, self.key, self.checkpoints = path, key, checkpoints
        #: Bytes of text: the file's size, or a compressed file's decompressed size.
        self.size = key.size if checkpoints is None else checkpoints.size

    def snap(self, x: int) -> int:
        """Where a slice that should start near byte ``x`` of the text may start: ``x`` in a plain file;
        in a compressed one the checkpoint nearest ``x`` (so that no rank decompresses another's span)."""
        if self.checkpoints is None:
            return x
        starts = self.checkpoints.points[:, 0]
        row = int(np.argmin(np.abs(starts - x)))
        return int(starts[row])

    def compressed(self, lo: int, hi: int) -> int:
        """Bytes of the file that reading text ``[lo, hi)`` takes (its checkpoints' span, compressed)."""
        if self.checkpoints is None or lo >= hi:
            return max(hi - lo, 0)
        a, b = self.checkpoints.compressed_span(lo, hi, self.key.size)
        return b - a

    def reading(self) -> Reading:
        """A :class:`Reading` of the text (the caller closes it), the file checked against the key."""
        fd = _open(self.path, self.key)
        try:
            return Reading(self, fd)
        except BaseException:
            os.close(fd)
            raise

    @contextlib.contextmanager
    def open(self) -> Iterator[Reading]:
        """A :class:`Reading` of the text, the file checked against the key on entry and once the
        reading is done."""
        reading = self.reading()
        try:
            yield reading
            reading.check()
        finally:
            reading.close()


class Reading:
    """Reads of a :class:`Text` through one descriptor (and, for a compressed file, one decoder, which
    goes on from where the read before stopped: reads in order decompress each span once)."""

    def __init__(self, text: Text, fd: int) -> None:
        self.text, self.fd = text, fd
        self._view = None if text.checkpoints is None else DecompressedView(text.path, fd, text.checkpoints)
        self._closed = False

    def read(self, offset: int, count: int) -> bytes:
        """Up to ``count`` bytes of text from ``offset`` (fewer at its end)."""
        count = max(0, min(count, self.text.size - offset))
        if self._view is None:
            return os.pread(self.fd, count, offset)
        return self._decompressed(offset, offset + count)

    def read_into(self, buf: npt.NDArray[np.uint8], offset: int, until: int | None = None) -> None:
        """Fill ``buf`` from byte ``offset`` of the text (``until``: as :meth:`DecompressedView.read`'s).

        Raises:
            MetaFileChangedError: the file ends first, or changed.
            CorruptMetaFileError: a compressed file cannot be decoded there (and has not changed).
        """
        path = self.text.path
        if self._view is not None:
            if offset + buf.size > self.text.size:
                raise MetaFileChangedError(path, "it shrank while being read")
            buf[:] = np.frombuffer(self._decompressed(offset, offset + buf.size, until), np.uint8)
            return
        view, done = buf.data, 0
        while done < buf.size:
            got = os.preadv(self.fd, [view[done:]], offset + done)
            if got == 0:
                raise MetaFileChangedError(path, "it shrank while being read")
            done += got

    def check(self) -> None:
        """Raise MetaFileChangedError if the file (by descriptor or by path) is not the one of the key."""
        _check_open(self.text.path, self.text.key, self.fd)

    def _decompressed(self, a: int, b: int, until: int | None = None) -> bytes:
        assert self._view is not None
        try:
            return self._view.read(a, b, until)
        except CorruptMetaFileError:
            self.check()  # a file rewritten under the reader is that, not corrupt
            raise

    def close(self) -> None:
        """Free the decoder and the descriptor."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._view is not None:
                self._view.close()
        finally:
            os.close(self.fd)


@contextlib.contextmanager
def open_checked(path: Path, key: FileKey) -> Iterator[int]:
    """A descriptor of ``path``, checked against ``key`` on entry and once the reading is done."""
    fd = _open(path, key)
    try:
        yield fd
        _check_open(path, key, fd)
    finally:
        os.close(fd)


def _open(path: Path, key: FileKey) -> int:
    """A descriptor of ``path``, which must be the file ``key`` describes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise MetaFileChangedError(path, "it was deleted or moved") from None
    try:
        _check(path, key, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_open(path: Path, key: FileKey, fd: int) -> None:
    """Raise MetaFileChangedError unless both ``fd`` and ``path`` are still the file of ``key``."""
    _check(path, key, os.fstat(fd))
    try:
        now = os.stat(path)
    except FileNotFoundError:
        raise MetaFileChangedError(path, "it was deleted or moved") from None
    _check(path, key, now)


def _check(path: Path, key: FileKey, st: os.stat_result) -> None:
    if not key.matches(st):
        what = key.change(FileKey.of(st))
        if what is not None:
            raise MetaFileChangedError(path, what)


def chunks(reading: Reading, lo: int, hi: int) -> Iterator[tuple[npt.NDArray[np.uint8], int, bool]]:
    """``(buf, offset, last)``: bytes ``[lo, hi)`` of the text, :data:`READ` bytes a read, in pieces
    that each end at a line boundary (``last``: the piece ends the text, so bytes after its final
    newline form a line). ``lo`` starts a line; ``hi`` ends one or the text."""
    carry: npt.NDArray[np.uint8] = np.zeros(0, np.uint8)
    pos = lo
    while pos < hi:
        n = min(READ, hi - pos)
        buf = np.empty(carry.size + n, np.uint8)
        buf[: carry.size] = carry
        reading.read_into(buf[carry.size :], pos, until=hi)
        start, pos = pos - carry.size, pos + n
        if pos >= hi:
            yield buf, start, hi == reading.text.size
            return
        cut = _last_newline(buf)
        if cut < 0:  # a line longer than a read: read on
            carry = buf
            continue
        yield buf[: cut + 1], start, False
        carry = buf[cut + 1 :].copy()


def _last_newline(buf: npt.NDArray[np.uint8]) -> int:
    for tail in (1 << 16, buf.size):
        hits = np.flatnonzero(buf[-tail:] == NEWLINE)
        if hits.size:
            return int(buf.size - min(tail, buf.size) + hits[-1])
    return -1

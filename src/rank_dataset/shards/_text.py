"""The text of a meta file as the collective reader reads it: a plain file's bytes, or the
decompressed bytes of a gzip or zstd file, read from its checkpoints (made by its index), each read
checked against the file's key so that a file changed under a slice is told, never read as lines.

A compressed file's slices start at checkpoints (:meth:`Text.snap`): a rank then decompresses its
own slice and the few bytes past its end that finish its last line, not the spans before it.

What the collective reader asks of a text (this module's :class:`Text`, or a Parquet file's
:class:`~rank_dataset.shards._rows.RowsText`): :attr:`~Text.planned` bytes to cut into slices,
:meth:`~Text.line_start` where a slice may start, :meth:`~Text.count` the samples of a piece, and a
:meth:`~Text.reading` whose :meth:`~Reading.lines` reads a piece again and finds its samples.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from rank_dataset.errors import CorruptMetaFileError, MetaFileChangedError
from rank_dataset.files.formats import Checkpoints, DecompressedView
from rank_dataset.files.index.scan import scan_buffer
from rank_dataset.files.io import ByteSource, FileKey, ShortRead, SourceKey, open_source
from rank_dataset.files.read.lines import line_pieces

__all__ = [
    "READ",
    "Lines",
    "Reading",
    "SourceReading",
    "SourceText",
    "Text",
    "chunks",
]

READ = 4 << 20  # bytes per sequential read of a slice, counting its lines (the scan finds them in cache)
_PROBE = 4096  # bytes first looked at to find where a slice starts (doubled until a newline is found)


@dataclass(frozen=True)
class Lines:
    """The samples found in a piece of a text: where each starts (counted from the piece's start) and
    its length, the lines they span (newlines; a Parquet file's rows), the piece's bytes of text, and
    whether they are all ASCII."""

    starts: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int64]
    newlines: int
    nbytes: int
    ascii: bool


class SourceReading:
    """Reads of a meta file through one source (:attr:`source`), checked against the file's key."""

    source: ByteSource

    def check(self) -> None:
        """Raise MetaFileChangedError if the file (by descriptor or by path) is not the one of the key.
        (An object's reads were each pinned to its ETag: nothing more to ask.)"""
        if self.source.local:
            self.source.check()

    def close(self) -> None:
        """Free what the reading holds, its source too."""
        self.source.close()


R = TypeVar("R", bound=SourceReading)


class SourceText(Generic[R]):
    """A meta file at ``path``, which ``key`` describes, as the collective reader reads it: through
    readings (``R``), each of one source opened against the key."""

    path: Path
    key: SourceKey

    def _reading_of(self, source: ByteSource) -> R:
        raise NotImplementedError

    def reading(self) -> R:
        """A reading of the file (the caller closes it), checked against the key (an object's reads
        each pinned to it)."""
        source = open_source(self.path, key=self.key, checked=isinstance(self.key, FileKey))
        try:
            return self._reading_of(source)
        except BaseException:
            source.close()
            raise

    @contextlib.contextmanager
    def open(self) -> Iterator[R]:
        """A reading of the file, checked against the key on entry and once the reading is done."""
        reading = self.reading()
        try:
            yield reading
            reading.check()
        finally:
            reading.close()


class Text(SourceText["Reading"]):
    """The text of the meta file at ``path``, which ``key`` describes: its own bytes, or for a gzip or
    zstd file (``checkpoints`` given) its decompressed ones.

    Args:
        path: the file.
        key: the file as it was when the reader was made (any change since is an error).
        checkpoints: a compressed file's checkpoints (from its index); None for a plain file.
    """

    def __init__(self, path: Path, key: SourceKey, checkpoints: Checkpoints | None = None) -> None:
        self.path, self.key, self.checkpoints = path, key, checkpoints
        #: Bytes of text: the file's size, or a compressed file's decompressed size.
        self.size = key.size if checkpoints is None else checkpoints.size

    @property
    def planned(self) -> int:
        """Bytes of text, as the slices are cut before the count (a Parquet file's differ)."""
        return self.size

    def line_start(self, x: int) -> int:
        """Where a slice that should start near byte ``x`` starts: the first line at or after
        :meth:`snap` gives (at a checkpoint of a compressed file, the first after it, so that finding
        it decompresses from there, not from the checkpoint before), or :attr:`size`."""
        local = self.snap(x)
        if local == 0:
            return 0
        # A plain file's slice starts after the first newline at or after local - 1 (at local itself
        # where a line starts there).
        pos, step = (local if self.checkpoints is not None else local - 1), _PROBE
        with self.open() as reading:
            while pos < self.size:
                piece = reading.read(pos, step)
                if not piece:
                    raise MetaFileChangedError(self.path, "it shrank while being read")
                hit = piece.find(b"\n")
                if hit >= 0:
                    return pos + hit + 1
                pos += len(piece)
                step = min(2 * step, READ)
        return self.size

    def count(self, a: int, b: int) -> Iterator[Lines]:
        """The samples of bytes ``[a, b)`` (``a`` starts a line, ``b`` ends one or the text), read
        :data:`READ` bytes at a time."""
        with self.open() as reading:
            for buf, offset, last in chunks(reading, a, b):
                chunk = scan_buffer(buf, offset, last)
                yield Lines(chunk.starts - a, chunk.lengths, chunk.newlines, buf.size, chunk.ascii)

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

    def _reading_of(self, source: ByteSource) -> Reading:
        return Reading(self, source)


class Reading(SourceReading):
    """Reads of a :class:`Text` through one source (an object's read in order in large GETs) and, for a
    compressed file, one decoder, which goes on from where the read before stopped: reads in order
    decompress each span once."""

    def __init__(self, text: Text, source: ByteSource) -> None:
        self.text, self.source = text, source
        raw = getattr(source, "fd", -1) if source.local else source
        self._view = None if text.checkpoints is None else DecompressedView(text.path, raw, text.checkpoints)
        self._closed = False

    def read(self, offset: int, count: int) -> bytes:
        """Up to ``count`` bytes of text from ``offset`` (fewer at its end)."""
        count = max(0, min(count, self.text.size - offset))
        if self._view is None:
            return self.source.read(offset, count)
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
        try:  # a slice read in order (an object's: GETs of many reads' bytes)
            self.source.read_into(buf, offset, until=self.text.size if until is None else until)
        except ShortRead:
            raise MetaFileChangedError(path, "it shrank while being read") from None

    def lines(self, buf: npt.NDArray[np.uint8], offset: int, until: int | None = None) -> Lines:
        """Fill ``buf`` from byte ``offset`` of the text (which starts a line; ``buf`` ends one or the
        text) as :meth:`read_into` does, and find its samples."""
        self.read_into(buf, offset, until)
        chunk = scan_buffer(buf, offset, offset + buf.size == self.text.size)
        return Lines(chunk.starts - offset, chunk.lengths, chunk.newlines, buf.size, chunk.ascii)

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
            self.source.close()


def chunks(reading: Reading, lo: int, hi: int) -> Iterator[tuple[npt.NDArray[np.uint8], int, bool]]:
    """``(buf, offset, last)``: bytes ``[lo, hi)`` of the text in pieces of whole lines,
    :data:`READ` bytes a read, as :func:`~rank_dataset.files.read.lines.line_pieces` cuts them
    (``last``: the piece ends the text, so bytes after its final newline form a line). ``lo`` starts
    a line; ``hi`` ends one or the text. Each piece is valid until the next is asked for."""
    for buf, offset in line_pieces(reading.read_into, lo, hi, READ):
        yield buf, offset, offset + buf.size == reading.text.size

"""The lines of a meta file as a grouping reads them, front to back, checked against the file: a
text file's through its :class:`~rank_dataset.files.io.LocalFile`, a compressed file's in one
checked decompression (no checkpoint needed), a Parquet file's rows a row group at a time."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import numpy as np

from rank_dataset.core.arrays import Int64Array, UInt8Array
from rank_dataset.errors import CorruptMetaFileError, MetaFileChangedError
from rank_dataset.files.formats import ParquetRows, decompress
from rank_dataset.files.group._block_labels import PAD
from rank_dataset.files.index.load import FileKey, Index, SpanReader, line_mark
from rank_dataset.files.index.scan import CR, NEWLINE
from rank_dataset.files.io import ByteSource, LocalFile, open_source
from rank_dataset.files.io.pread import ShortRead
from rank_dataset.files.read.file import bytes_of

BLOCK = 1 << 20  # lines read at a time for a function key
CHUNK = 8 << 20  # bytes of lines a chunk of whole samples holds, about (chunks)
STREAM_BLOCK = 4 << 20  # decompressed bytes a compressed file's decoder hands out at a time


class _Stream:
    """The bytes of a meta file read front to back, ``blocks`` as they come, of which only the bytes
    not yet passed are held: a compressed file's decompressed bytes (one checked decompression,
    :func:`~rank_dataset.files.formats.decompress`: a grouping reads the whole file in order, so it
    needs no checkpoint), or an object's bytes (its ranged GETs in order, pinned to its ETag)."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self._blocks = blocks
        self._held = bytearray()
        self._base = 0  # the offset of _held[0]

    def read_into(self, out: UInt8Array, lo: int, until: int | None = None) -> None:
        """Fill ``out`` with bytes ``[lo, lo + out.size)``; ``lo`` never below an earlier read's.

        Raises:
            ShortRead: the decompressed bytes end first.
        """
        if lo < self._base:
            raise ValueError(f"the decompressed bytes are read in order: byte {lo:,} is behind {self._base:,}")
        hi = lo + out.size
        while self._base + len(self._held) < hi:
            piece = next(self._blocks, None)
            if piece is None:
                raise ShortRead(hi)
            self._held += piece
        del self._held[: lo - self._base]
        self._base = lo
        out[:] = np.frombuffer(self._held, np.uint8, out.size)

    def total(self) -> int:
        """The length of the bytes: what is left of them read (and counted only)."""
        return self._base + len(self._held) + sum(map(len, self._blocks))


class TextLines:
    """The lines of an indexed file, a block of samples at a time, checked against the file (against
    its decompressed bytes, for a compressed file)."""

    def __init__(self, path: Path, index: Index, source: ByteSource) -> None:
        self.path, self.index, self.source = path, index, source
        self.fd = cast(LocalFile, source).fd if source.local else None
        self.stream: _Stream | None = None
        if index.format.compressed:
            raw = self.fd if self.fd is not None else source
            self.stream = _Stream(decompress(path, raw, index.format, block=STREAM_BLOCK))
        elif self.fd is None:  # an object: read front to back (a label grouping's blocks too)
            self.stream = _Stream(source.stream(block=STREAM_BLOCK))

    def read_into(self, out: UInt8Array, lo: int) -> None:
        """Fill ``out`` with bytes ``[lo, lo + out.size)`` of the file (decompressed), in order.

        Raises:
            ShortRead: the file ends first.
        """
        if self.stream is None:
            self.source.read_into(out, lo)
        else:
            self.stream.read_into(out, lo)

    @contextlib.contextmanager
    def _entries(self) -> Iterator[SpanReader]:
        """The index's entries while the file is read: the file ending early, or the index's cache
        changing, told as the change of the file it is."""
        try:
            with SpanReader(self.index) as reader:
                yield reader
        except ShortRead:
            raise MetaFileChangedError(self.path, "it shrank while being read") from None
        except LookupError as exc:
            raise MetaFileChangedError(self.path, f"its index cache changed while it was read ({exc})") from None

    def blocks(self) -> Iterator[tuple[int, int, UInt8Array, Int64Array]]:
        """Yield ``(first, base, buf, spans)``: samples ``first ..`` are ``buf[spans[i, 0]:spans[i, 1]]``,
        and ``buf[j]`` is byte ``base + j`` of the file; ``buf`` has :data:`~rank_dataset.files.group._block_labels.PAD`
        bytes before the first sample."""
        n, size = self.index.count, self.index.size
        with self._entries() as reader:
            for first in range(0, n, BLOCK):
                starts, lengths = reader.take(np.arange(first, min(first + BLOCK, n), dtype=np.int64))
                spans = np.stack([starts, starts + lengths], axis=1).astype(np.int64, copy=False)
                lo, hi = int(spans[0, 0]), int(spans[-1, 1])
                # The byte after the last line too (its newline, if any), so every line's end is checked.
                stop = min(hi + 1, size)
                buf = np.empty(PAD + stop - lo + 1, np.uint8)
                buf[:PAD] = NEWLINE
                buf[-1] = NEWLINE
                self.read_into(buf[PAD : PAD + stop - lo], lo)
                spans += PAD - lo
                # A line ends at a newline, a "\r\n" or the end of the file: anything else is an index
                # that no longer describes the bytes.
                after = buf[spans[:, 1]]
                if not (bool(((after == NEWLINE) | (after == CR)).all()) and bool((spans[:, 1] > spans[:, 0]).all())):
                    raise MetaFileChangedError(self.path, "its lines no longer end where its index says")
                yield first, lo - PAD, buf, spans

    def chunks(self, size: int = CHUNK) -> Iterator[tuple[int, int, int, UInt8Array, SpanReader]]:
        """Yield ``(first, n, base, data, reader)``: ``data`` is bytes ``base ..`` of the file (decompressed), from
        the start of sample ``first`` to the end of sample ``first + n - 1``, the blank lines between included;
        about ``size`` bytes (at most :data:`BLOCK` samples; fewer, down to one, where lines run longer than the
        file's mean), read into one buffer that the next chunk reuses. ``reader`` gives the samples' spans.

        Checked against the index at its ends only (the byte before ``data`` ends a line, the byte after it is a
        line's end): the caller counts the samples ``data`` holds against ``n``.
        """
        total, extent = self.index.count, self.index.size
        per = max(1, min(BLOCK, size * total // max(extent, 1)))
        buf = np.empty(0, np.uint8)
        with self._entries() as reader:
            first = 0
            while first < total:
                n = min(per, total - first)
                lo = int(reader.take(np.array([first], np.int64))[0][0])
                while True:
                    starts, lengths = reader.take(np.array([first + n - 1], np.int64))
                    hi = int(starts[0] + lengths[0])
                    if hi - lo <= 4 * size or n == 1:
                        break
                    n = max(1, n // 4)  # longer lines here than the file's mean: fewer of them
                # The byte before (a newline, but before the first sample) and the one after (a newline or
                # "\r\n"'s "\r", but at the end of the file).
                before = 1 if first else 0
                stop = min(hi + 1, extent)
                if not lo < hi <= extent:
                    raise MetaFileChangedError(self.path, "its lines no longer end where its index says")
                if stop - lo + before > buf.size:
                    buf = np.empty((stop - lo + before) * 5 // 4, np.uint8)
                view = buf[: stop - lo + before]
                self.read_into(view, lo - before)
                if (before and view[0] != NEWLINE) or (stop > hi and view[-1] not in (NEWLINE, CR)):
                    raise MetaFileChangedError(self.path, "its lines no longer end where its index says")
                yield first, n, lo, view[before : before + hi - lo], reader
                per = max(1, min(BLOCK, n * size // max(hi - lo, 1)))
                first += n

    def text_blocks(self) -> Iterator[list[tuple[str, Callable[[], str]]]]:
        """Each block's samples as ``(text, where)``."""
        for _, base, buf, spans in self.blocks():
            data = buf.tobytes()
            yield [
                (data[start:end].decode("utf-8", "replace"), functools.partial(self.where, base + start))
                for start, end in spans.tolist()
            ]

    def where(self, start: int) -> str:
        """``path:line`` of the line starting at byte ``start`` of the file (decompressed): the
        newlines after the index's mark before it counted, as :meth:`MetaFile.where
        <rank_dataset.files.read.metafile.MetaFile.where>` counts them."""
        try:
            with SpanReader(self.index) as reader:
                offset, line = line_mark(reader.marks(), start)
            return f"{self.path}:{line + bytes_of(self.path).count_newlines(self.index, offset, start) + 1}"
        except (LookupError, OSError, CorruptMetaFileError, MetaFileChangedError):
            return f"{self.path}, {'decompressed ' if self.index.format.compressed else ''}byte {start:,}"


@contextlib.contextmanager
def open_checked(path: Path, index: Index) -> Iterator[TextLines | ParquetLines]:
    """The file's lines, checked on entry and exit to be those of the file ``index`` describes; an
    error while they are read (a line without a label, corrupt compressed data) from a file that has
    changed meanwhile is that change. A Parquet file's rows are checked as the file reader checks them.
    """
    if index.format.rows:
        with bytes_of(path).rows(index) as rows:
            yield ParquetLines(path, index, rows)
        return
    source = open_source(path, key=index.key, checked=False)
    if not source.local:  # an object: checked to be the one indexed (one HEAD), every GET pinned to its ETag
        source.check()
        yield TextLines(path, index, source)
        return
    local = cast(LocalFile, source)
    try:
        for when in ("", " while it was grouped"):
            what = index.key.change(FileKey.of(os.fstat(local.fd)))
            if what is not None:
                raise MetaFileChangedError(path, what + when)
            if not when:
                try:
                    yield TextLines(path, index, local)
                except ValueError as exc:  # CorruptMetaFileError too
                    what = index.key.change(FileKey.of(os.fstat(local.fd)))
                    if what is None or isinstance(exc, MetaFileChangedError):
                        raise
                    raise MetaFileChangedError(path, what + " while it was grouped") from exc
    finally:
        local.close()


class ParquetLines:
    """The rows of an indexed Parquet file (checked by :meth:`MetaFile.rows`), a row group at a time:
    every row is a sample, its line the chosen columns joined by tabs, as the file reader gives it."""

    def __init__(self, path: Path, index: Index, rows: ParquetRows) -> None:
        self.path, self.index, self.rows = path, index, rows

    def where(self, row: int) -> str:
        return f"{self.path}, row {row}"

    def text_blocks(self) -> Iterator[list[tuple[str, Callable[[], str]]]]:
        """Each row group's rows as ``(text, where)``."""
        bounds = self.rows.bounds.tolist()
        for g, first in enumerate(bounds[:-1]):
            data, offsets = self.rows.group(g)
            cuts = offsets.tolist()
            yield [
                (data[a:b].decode("utf-8", "replace"), functools.partial(self.where, first + k))
                for k, (a, b) in enumerate(itertools.pairwise(cuts))
            ]

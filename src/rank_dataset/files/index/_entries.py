"""Readers of an index: the spans of samples (:class:`SpanReader`, :func:`read_entry`), the marks and
a compressed file's checkpoints."""

from __future__ import annotations

import mmap
import os
from typing import TYPE_CHECKING

import numpy as np

from rank_dataset.core.arrays import Int64Array, UInt64Array
from rank_dataset.files.index._cachefile import (
    DATA_OFFSET,
    ENTRY,
    HEADER,
    Index,
    decode,
    length_bits,
    read_header,
    read_pairs,
)
from rank_dataset.files.io.pread import ShortRead, Window

if TYPE_CHECKING:
    from rank_dataset.files.formats import Checkpoints

MAPPED_ROWS = 1 << 12  # a read of fewer samples may take their entries from a map of the cache (see _entries_map)
_MAPPED_MIN = 1 << 16  # entries (512 KiB) a cache holds at least to be mapped; smaller ones are a few reads
_MAPS = 16  # caches kept mapped by a process, newest last (each map holds a descriptor of its file)
_maps: dict[tuple[int, int, int, int], UInt64Array] = {}


def read_entry(index: Index, local: int) -> tuple[int, int]:
    """``(start, length)`` of sample ``local`` of the file: for one sample, one read of the cache's
    header (checked) and one of its entry, nothing else.

    Raises:
        LookupError: as :class:`SpanReader`.
    """
    if index.cache is None or index.count <= local:
        with SpanReader(index) as reader:
            starts, lengths = reader.take(np.array([local], np.int64))
        return int(starts[0]), int(lengths[0])
    try:
        fd = os.open(index.cache, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise LookupError(f"the index cache {index.cache} cannot be opened ({exc.strerror})") from None
    try:
        head, raw = os.pread(fd, HEADER.size, 0), os.pread(fd, ENTRY, DATA_OFFSET + ENTRY * local)
    finally:
        os.close(fd)
    # The header as a cache of this index writes it, the device aside (as FileKey.digest).
    key_bytes, count_bytes = index.header_fields
    if len(raw) != ENTRY or head[:40] != key_bytes or head[48:80] != count_bytes:
        raise LookupError(f"the index cache {index.cache} was replaced or damaged")
    entry, bits = int.from_bytes(raw, "little"), length_bits(index.bits_size)
    length = entry & ((1 << bits) - 1)
    if length == (1 << bits) - 1 and head[80:88] != bytes(8):  # a long line: its length is in the table
        with SpanReader(index) as reader:
            starts, lengths = reader.take(np.array([local], np.int64))
        return int(starts[0]), int(lengths[0])
    return entry >> bits, length


class SpanReader:
    """The spans of one file's samples while a shard is built: from the cache (open until
    :meth:`close`), reading only the pages of entries asked for, with positional reads into one
    reusable buffer (nothing is mapped, so a build's resident memory holds no more of the index than
    one batch's pages); or from memory. With ``mapped`` (for a small read: a batch of random samples),
    from the process's map of a large cache instead (see :func:`_entries_map`).

    Raises (from the constructor):
        LookupError: the cache is gone or no longer holds this index (its header differs), or the
            index was in another process's memory.
    """

    def __init__(self, index: Index, *, mapped: bool = False) -> None:
        self._index = index
        self._mapped = mapped
        self._fd: int | None = None
        self._table = index.memory
        self._window = Window()
        self._size = index.bits_size
        if index.cache is None:
            if index.memory is None:
                raise LookupError("the index was built in another process's memory")
            self._longs = index.memory.longs
            return
        try:
            self._fd = os.open(index.cache, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise LookupError(f"the index cache {index.cache} cannot be opened ({exc.strerror})") from None
        header = read_header(self._fd)
        if (
            header is None
            or not header.describes(index.key, index.ends_hash)
            or (header.count, header.ascii, header.extent, header.bound)
            != (index.count, index.ascii, index.size, index.bits_size)
        ):
            self.close()
            raise LookupError(f"the index cache {index.cache} was replaced or damaged")
        self._header = header
        self._longs = self._pairs(header.longs_at, header.longs)

    def _pairs(self, offset: int, count: int) -> Int64Array:
        assert self._fd is not None
        try:
            return read_pairs(self._fd, offset, count)
        except ShortRead:
            raise LookupError(f"the index cache {self._index.cache} was damaged") from None

    def _damaged(self) -> LookupError:
        return LookupError(f"the index cache {self._index.cache} was damaged (shorter than its header says)")

    def take(self, local: Int64Array) -> tuple[Int64Array, Int64Array]:
        """``(starts, lengths)`` of samples ``local`` of the file (in range; best roughly ascending
        and close together, as one batch of a build: the pages from the lowest to the highest entry
        that some entry asked for are read)."""
        if self._table is not None:
            entries = self._table.entries[local]
        elif not local.size:
            entries = np.empty(0, "<u8")
        else:
            fd = self._fd
            assert fd is not None  # with no table, the constructor opened the cache
            if self._mapped and self._header.count >= _MAPPED_MIN:
                try:
                    entries = _entries_map(fd, self._header.count)[local]
                except ValueError:
                    raise self._damaged() from None
            else:
                at = DATA_OFFSET + ENTRY * local
                try:
                    buf, shift = self._window.load(fd, at, at + ENTRY, self._header.longs_at)
                except ShortRead:
                    raise self._damaged() from None
                # Entries start at multiples of 8 in the file, and so in buf (runs start and end at entries).
                entries = buf[: buf.size - buf.size % ENTRY].view("<u8")[(at - shift) // ENTRY]
        return decode(entries, local, self._size, self._longs)

    def marks(self) -> Int64Array:
        """The file's marks: ``(k, 2)`` rows (offset, line number), by offset."""
        if self._table is not None:
            return self._table.marks
        return self._pairs(self._header.marks_at, self._header.marks)

    def checkpoints(self) -> Checkpoints:
        """A compressed file's checkpoints.

        Raises:
            LookupError: the cache holds none that can be read (damaged).
        """
        if self._table is not None:
            raw = self._table.extra
        else:
            assert self._fd is not None
            at = self._header.extra_at
            raw = os.pread(self._fd, os.fstat(self._fd).st_size - at, at)
        from rank_dataset.files.formats import Checkpoints  # on first use: a compressed file's

        try:
            return Checkpoints.from_bytes(raw)
        except ValueError as exc:
            raise LookupError(f"the checkpoints in the index cache {self._index.cache} are damaged ({exc})") from None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> SpanReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _entries_map(fd: int, count: int) -> UInt64Array:
    """The ``count`` entries of the sealed cache open at ``fd``, through a read-only map kept for the
    process's later small takes.

    A batch of random samples (a sampler's, at the meta server) would otherwise cost a ``pread`` an
    entry, as much as reading its line; mapped, it costs a page fault the first time a page is touched
    and nothing after. A cache is never written in place (a rebuild writes a new file and renames it),
    so a map stays the bytes it was checked as; keyed by the file's identity, a replaced cache is mapped
    anew. The pages are the page cache's, shared by every process that maps them; large takes (a
    shard's build) keep reading only the pages they need, and map nothing.
    """
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    entries = _maps.get(key)
    if entries is None:
        if len(_maps) >= _MAPS:
            del _maps[next(iter(_maps))]
        # Unmapped when the array goes (it holds the map's buffer).
        entries = np.frombuffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ), "<u8", count=count, offset=DATA_OFFSET)
        _maps[key] = entries
    return entries


def read_checkpoints(index: Index) -> Checkpoints:
    """The checkpoints of the compressed file ``index`` describes.

    Raises:
        LookupError: as :class:`SpanReader`, or none can be read.
    """
    with SpanReader(index) as reader:
        return reader.checkpoints()


def line_mark(marks: Int64Array, start: int) -> tuple[int, int]:
    """``(offset, line)`` of the last mark at or before byte ``start`` (line numbers from 0): the
    line number of ``start``'s line is ``line`` plus the newlines in ``[offset, start)``. ``(0, 0)``
    where the marks cannot be trusted (not increasing), so the count starts at the beginning."""
    if not marks.size or not (bool((np.diff(marks, axis=0) >= 0).all()) and marks[0, 0] >= 0 and marks[0, 1] >= 0):
        return 0, 0
    at = int(np.searchsorted(marks[:, 0], start, side="right")) - 1
    return (0, 0) if at < 0 else (int(marks[at, 0]), int(marks[at, 1]))

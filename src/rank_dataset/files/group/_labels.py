"""Grouping by label: the integer after a line's last run of whitespace, parsed in numpy a block at a
time (:mod:`rank_dataset.files.group._block_labels`), each block sorted by label in threads, then merged by a
stable counting sort."""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np

from rank_dataset.core.arrays import Int64Array, UInt8Array, UInt32Array, prefix_sums, ranges
from rank_dataset.core.parsers import LineError, parse_label, quote
from rank_dataset.core.threads import THREADS
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.group._block_labels import PAD, BlockLabels, block_labels
from rank_dataset.files.group._lines import ParquetLines, TextLines
from rank_dataset.files.index.scan import CR, NEWLINE, chunk_bounds
from rank_dataset.files.io.pread import ShortRead
from rank_dataset.files.read.lines import line_pieces

_CHUNK = 8 << 20  # bytes of the file parsed at a time for key="label": a block's temporaries stay in cache


@dataclass(frozen=True)
class Grouping:
    """Keys in order, the ``C + 1`` bounds of their groups, and the sample numbers group after group."""

    keys: list[Any]
    bounds: Int64Array
    order: Int64Array

    def as_dict(self) -> dict[Any, np.ndarray]:
        """``{key: its sample numbers}``, each a read-only view of :attr:`order`."""
        self.order.flags.writeable = False
        bounds = self.bounds.tolist()
        return {k: self.order[a:b] for k, a, b in zip(self.keys, bounds, bounds[1:])}


#: Given the keys and the bounds of their groups, the int64 array the sample numbers are placed in.
Place = Callable[[list[Any], Int64Array], Int64Array]


def in_memory(keys: list[Any], bounds: Int64Array) -> Int64Array:
    return np.empty(int(bounds[-1]), np.int64)


def label_grouping(lines: TextLines, place: Place) -> Grouping:
    """Group the samples by their integer label: each block of the file parsed and sorted by label on
    its own (two threads; numpy releases the GIL), then every block's samples scattered to their
    places, a stable counting sort. Only the result is N-sized, and each block's order (4 bytes a
    sample) until it is placed. A compressed file's blocks are decompressed in this thread, in
    order (the decoders release the GIL too), while the threads parse the blocks before."""
    fd, size = lines.fd, lines.index.size
    scratch = threading.local()

    def part(lo: int, hi: int, data: UInt8Array | None = None) -> _SortedBlock:
        buf = getattr(scratch, "buf", None)
        if buf is None or buf.size < PAD + hi - lo + 1:
            buf = scratch.buf = np.empty(max(PAD + _CHUNK + 1, PAD + hi - lo + 1), np.uint8)
        end = PAD + hi - lo
        buf[:PAD] = NEWLINE
        if data is not None:
            buf[PAD:end] = data
        else:
            try:
                lines.source.read_into(buf[PAD:end], lo)
            except ShortRead:
                raise MetaFileChangedError(lines.path, "it shrank while being read") from None
        if buf[end - 1] != NEWLINE:
            if hi != size:  # blocks end just past a newline
                raise MetaFileChangedError(lines.path, "it changed while it was grouped")
            buf[end] = NEWLINE  # the last line has no newline of its own
            end += 1
        found = block_labels(buf[:end], end, file_start=lo == 0)
        _parse_others(buf, found, lambda row, start: lines.where(lo + start - PAD))
        return _SortedBlock.of(found.labels)

    def blocks() -> Iterator[Callable[[], _SortedBlock]]:
        if lines.stream is None:  # a local text file: its blocks read in the threads
            with open(cast(int, fd), "rb", closefd=False) as f:
                bounds = chunk_bounds(cast(BinaryIO, f), size, _CHUNK)
            yield from (functools.partial(part, lo, hi) for lo, hi in itertools.pairwise(bounds))
            return
        try:
            for data, lo in line_pieces(lines.stream.read_into, 0, size, _CHUNK, reuse=False):
                yield functools.partial(part, lo, lo + data.size, data)
        except ShortRead:
            pass  # told below, with the length the bytes have
        read = lines.stream.total()
        if read != size:
            raise MetaFileChangedError(lines.path, f"it decompresses to {read:,} bytes, its index {size:,}")

    return _sorted_blocks(blocks(), lines.path, lines.index.count, place)


def _sorted_blocks(blocks: Iterable[Callable[[], _SortedBlock]], path: Path, count: int, place: Place) -> Grouping:
    """The grouping of the file whose blocks, in order, ``blocks`` sort: each run in a pool of
    :data:`~rank_dataset.core.threads.THREADS` threads, a few ahead of the one merged next (so that
    only their bytes are held; the first bad line of the file is the one named), then merged."""
    with ThreadPoolExecutor(THREADS) as pool:
        parsing: list[Future[_SortedBlock]] = []
        try:
            for block in blocks:
                parsing.append(pool.submit(block))
                if len(parsing) > THREADS:
                    parsing[-THREADS - 1].result()
            parts = [job.result() for job in parsing]
        except BaseException:
            for job in parsing:
                job.cancel()
            raise
        return _merge(parts, path, count, place, pool)


def _merge(parts: list[_SortedBlock], path: Path, count: int, place: Place, pool: ThreadPoolExecutor) -> Grouping:
    """The grouping of the file whose blocks, in order, are ``parts``: each block's samples scattered
    to their places (a stable counting sort over the blocks)."""
    found = sum(p.perm.size for p in parts)
    if found != count:
        raise MetaFileChangedError(path, f"it holds {found:,} samples, its index {count:,}")
    keys = np.unique(np.concatenate([p.keys for p in parts]))
    codes = [np.searchsorted(keys, p.keys) for p in parts]
    totals = np.zeros(keys.size, np.int64)
    for code, p in zip(codes, parts):
        totals[code] += p.sizes  # a block's keys are distinct
    group_bounds = prefix_sums(totals)
    keys_list = keys.tolist()
    order = place(keys_list, group_bounds)
    cursor = group_bounds[:-1].copy()
    placed: list[Future[None]] = []
    base = 0
    for code, p in zip(codes, parts):
        placed.append(pool.submit(p.place, order, cursor[code], base))
        cursor[code] += p.sizes
        base += p.perm.size
    for done in placed:
        done.result()
    return Grouping(keys_list, group_bounds, order)


def _parse_others(buf: UInt8Array, found: BlockLabels, where: Callable[[int, int], str]) -> None:
    """Fill in the labels of the block's samples that are not of the common form (``found.todo``),
    each by the label parser; ``where(row, start)`` names a line that has none."""
    for row, start, stop in zip(found.todo.tolist(), found.starts.tolist(), found.ends.tolist()):
        line = buf[start:stop].tobytes().decode("utf-8", "replace")
        try:
            found.labels[row] = parse_label(line)[1]
        except LineError as exc:
            raise ValueError(f"{where(row, start)}: {exc}") from None
        except OverflowError:
            raise ValueError(f"{where(row, start)}: label outside the int64 range in line {quote(line)}") from None


def _parquet_labels(self: ParquetLines, g: int) -> Int64Array:
    """The label of every row of row group ``g`` of a Parquet file (``self``): in numpy as for text
    where each row is one non-blank line (the rows put back to back, each with a newline), else row by row; or, where
    the last column holds them (integers, none null), that column alone."""
    labels = self.rows.last_integers(g)
    if labels is not None:
        return labels
    buf, starts, lengths = self.rows.group_text(g, PAD)
    first, n = int(self.rows.bounds[g]), starts.size
    if n and int(np.count_nonzero(buf == NEWLINE)) == PAD + n and not bool((buf == CR).any()):
        found = block_labels(buf, buf.size, file_start=False)
        if found.labels.size == n:  # no blank row (a text file would skip it; here it is a sample)
            _parse_others(buf, found, lambda row, start: self.where(first + row))
            return found.labels
    rows = BlockLabels(np.empty(n, np.int64), np.arange(n, dtype=np.int64), starts, starts + lengths)
    _parse_others(buf, rows, lambda row, start: self.where(first + row))
    return rows.labels


def parquet_label_grouping(lines: ParquetLines, place: Place) -> Grouping:
    """Group a Parquet file's rows by label, a row group a block (decoded and sorted by label in the pool)."""
    groups = range(len(lines.rows.bounds) - 1)  # pyarrow releases the GIL: two row groups at once
    blocks = (lambda g=g: _SortedBlock.of(_parquet_labels(lines, g)) for g in groups)
    return _sorted_blocks(blocks, lines.path, lines.index.count, place)


@dataclass(frozen=True)
class _SortedBlock:
    """One block's samples in label order: ``perm`` (stable, numbered within the block), and the
    block's distinct labels, ascending, with how many samples have each."""

    perm: UInt32Array
    keys: Int64Array
    sizes: Int64Array

    @classmethod
    def of(cls, labels: Int64Array) -> _SortedBlock:
        if not labels.size:
            return cls(np.empty(0, np.uint32), np.empty(0, np.int64), np.empty(0, np.int64))
        lo = int(labels.min())
        span = int(labels.max()) - lo
        if span < 1 << 16:  # a stable sort of 16-bit values is a radix sort: linear
            offset = (labels - lo).astype(np.uint16)
            perm = np.argsort(offset, kind="stable")
            sizes = np.bincount(offset, minlength=span + 1)
            keys = np.flatnonzero(sizes)
            return cls(perm.astype(np.uint32), keys + lo, sizes[keys])
        if span < 1 << 32:  # two radix passes, low half then high half
            offset = (labels - lo).astype(np.uint32)
            perm = np.argsort((offset & 0xFFFF).astype(np.uint16), kind="stable")
            perm = perm[np.argsort((offset[perm] >> 16).astype(np.uint16), kind="stable")]
        else:
            perm = np.argsort(labels, kind="stable")
        ordered = labels[perm]
        heads = np.concatenate(([0], np.flatnonzero(ordered[1:] != ordered[:-1]) + 1))
        return cls(perm.astype(np.uint32), ordered[heads], np.diff(np.append(heads, ordered.size)))

    def place(self, order: Int64Array, at: Int64Array, base: int) -> None:
        """Write samples ``base + perm`` into ``order``, those of key ``keys[k]`` from ``at[k]`` on."""
        order[ranges(at, self.sizes)] = self.perm.astype(np.int64) + base

"""The visiting plan of a read: each file's rows in file order at the granularity of a bucket of
samples (:class:`FileRows`), cut into batches whose index entries are read together, and the starts
the first pass keeps for the second (:class:`KeptStarts`)."""

from __future__ import annotations

import itertools
import mmap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from rank_dataset.core import native
from rank_dataset.core.arrays import Int64Array, IntegerArray, UInt32Array
from rank_dataset.core.residency import free_pages
from rank_dataset.core.threads import HELPED_ITEMS, THREADS
from rank_dataset.plan.bounds import Bounds

if TYPE_CHECKING:
    from rank_dataset.files.read.file import IndexedFile

__all__ = ["THREADED_ROWS", "bucket_order"]


_INDEX_BYTES = 2 << 20  # index bytes a batch of rows is read with, at most (about)


_ENTRY_BYTES = 8  # an index entry


_PAGE = 4096


THREADED_ROWS = 1 << 16  # builds of fewer rows copy in one thread (starting threads costs a millisecond)


BATCH_ROWS = 1 << 15  # rows copied at a time, bounding the temporaries of a batch


_KEPT_SPAN = 1 << 32  # a batch's starts are kept as offsets from its lowest: less apart than this


_BUCKET_BITS = 12  # rows are visited in file order at the granularity of 1/4096 of the samples


# Reads of at most this many rows are sorted in full, one batch a file: their index entries span at
# most 2 pages each where they are read as one range (see Window.load), so about _INDEX_BYTES.
_SORTED_ROWS = 1 << 12


@dataclass(frozen=True)
class FileRows:
    """The rows (item numbers) of ``indices`` that are samples of file ``number``, in visiting order,
    and where each batch of them starts: consecutive buckets whose index entries are read with about
    ``_INDEX_BYTES`` at most, at most ``BATCH_ROWS`` rows."""

    number: int
    file: IndexedFile
    base: int
    rows: IntegerArray
    cuts: list[int]
    # Where ``rows`` lives if in a map of its own (at element ``first`` of it): the second pass frees
    # each batch's pages once it has taken them, as it does the kept starts.
    map: mmap.mmap | None = None
    first: int = 0

    def free(self, a: int, b: int) -> None:
        """Free the pages of ``rows[a:b]`` (a page shared with other rows stays): they are done with."""
        if self.map is not None:
            size = self.rows.itemsize
            free_pages(self.map, size * (self.first + a), size * (self.first + b))

    def parts(self, part: tuple[int, int] = (0, 1), *, runs: bool = False) -> list[tuple[int, int, int]]:
        """``(j, a, b)`` of each batch ``j`` of ``part`` ``(t, k)`` (every k-th from the t-th; with
        ``runs``, the t-th of k runs of consecutive batches): it holds ``rows[a:b]``."""
        t, k = part
        every = [(j, a, b) for j, (a, b) in enumerate(itertools.pairwise(self.cuts))]
        if runs:
            return every[len(every) * t // k : len(every) * (t + 1) // k]
        return every[t::k]

    def batches(
        self, indices: Int64Array, part: tuple[int, int] = (0, 1), only: Sequence[int] | None = None
    ) -> Iterator[tuple[int, Int64Array, Int64Array]]:
        """``(j, rows, local)`` of each batch ``j`` of ``part`` (with ``only``: of those batches): the
        item numbers and the samples' numbers in the file."""
        for j, a, b in self.parts(part) if only is None else [(j, self.cuts[j], self.cuts[j + 1]) for j in only]:
            rows = self.rows[a:b].astype(np.int64)
            yield j, rows, indices[rows] - self.base


def file_rows(files: Sequence[IndexedFile], bounds: Bounds, indices: Int64Array) -> list[FileRows]:
    """Each file's rows of ``indices``, in file order at the granularity of a bucket of samples, and
    cut into batches."""
    n, n_total = indices.size, bounds.total
    if n <= _SORTED_ROWS:
        return sorted_file_rows(files, bounds, indices)
    shift = _bucket_shift(n_total)
    keys = _bucket_keys(indices, shift)
    # One counting sort (the rows and each bucket's count): a fifth of numpy's stable argsort's time.
    rows, counts = native.bucket_order(keys, 1 << _BUCKET_BITS, np.uint32 if n < 1 << 32 else np.int64)
    visits = []
    if len(files) == 1:
        groups = [(0, 0, n)]
    else:
        file_of = bounds.part_of(indices[rows])
        regroup = np.argsort(file_of, kind="stable")  # visiting order kept within each file
        file_ends = np.cumsum(np.bincount(file_of, minlength=len(files))).tolist()
        rows = rows[regroup]
        del regroup, file_of
        groups = [(f, lo, hi) for f, (lo, hi) in enumerate(itertools.pairwise([0, *file_ends])) if hi > lo]
    mm = None
    if n >= THREADED_ROWS:  # in a map of its own, whose pages the second pass frees as it goes
        mm = mmap.mmap(-1, rows.nbytes, flags=mmap.MAP_PRIVATE)
        mapped: np.ndarray = np.frombuffer(mm, rows.dtype)
        mapped[:] = rows
        rows = mapped
    for f, lo, hi in groups:
        mine = rows[lo:hi]
        if len(groups) > 1:  # this file's rows only
            counts = np.bincount(keys[mine], minlength=1 << _BUCKET_BITS)
        # The index bytes a bucket's rows are read with: a page a row at most, its entries at most.
        cost = np.minimum(counts * _PAGE, _ENTRY_BYTES << shift)
        region = np.cumsum(cost) // _INDEX_BYTES
        last = np.flatnonzero(np.diff(region, append=region[-1] + 1))  # each region's last bucket
        cuts = [0]
        for end in np.cumsum(counts)[last].tolist():
            while end - cuts[-1] > BATCH_ROWS:
                cuts.append(cuts[-1] + BATCH_ROWS)
            if end > cuts[-1]:
                cuts.append(end)
        visits.append(FileRows(f, files[f], int(bounds.starts[f]), mine, cuts, mm, lo))
    return visits


def _bucket_shift(total: int) -> int:
    """How far sample numbers of ``total`` are shifted to give their bucket (1/4096 of ``total``)."""
    return max(0, (total - 1).bit_length() - _BUCKET_BITS)


def _bucket_keys(indices: Int64Array, shift: int) -> npt.NDArray[np.uint16]:
    keys = np.empty(indices.size, np.uint16)
    for lo in range(0, indices.size, BATCH_ROWS):  # a slice at a time: no n-sized int64 temporary
        np.right_shift(indices[lo : lo + BATCH_ROWS], shift, out=keys[lo : lo + BATCH_ROWS], casting="unsafe")
    return keys


def bucket_order(indices: Int64Array, total: int) -> npt.NDArray[np.intp]:
    """An order of ``indices`` (sample numbers below ``total``) in file order at the granularity a
    read visits them (1/4096 of ``total``): a read of ``indices[order]`` writes its shard almost in
    the order it reads the files, a few times faster than into a random order. A stable radix sort.

    Examples:
        >>> bucket_order(np.array([9000, 5, 4097]), 10_000).tolist()
        [1, 2, 0]
    """
    order: npt.NDArray[np.intp] = native.bucket_order(_bucket_keys(indices, _bucket_shift(total)), 1 << _BUCKET_BITS)[0]
    return order


def sorted_file_rows(files: Sequence[IndexedFile], bounds: Bounds, indices: Int64Array) -> list[FileRows]:
    """The visits of a small read (at most ``_SORTED_ROWS`` rows): its rows in file order exactly,
    one batch a file (sorting a few thousand numbers costs less than bucketing them)."""
    order = np.argsort(indices, kind="stable")
    rows = order.astype(np.uint32)
    ends = np.searchsorted(indices[order], bounds.starts, side="left").tolist()
    return [
        FileRows(f, files[f], int(bounds.starts[f]), rows[lo:hi], [0, hi - lo])
        for f, (lo, hi) in enumerate(itertools.pairwise(ends))
        if hi > lo
    ]


@dataclass
class KeptStarts:
    """The starts of a visit's rows, which the first pass keeps for the second, so that a build
    reads the index once: in visiting order, as 4-byte offsets from their batch's lowest start (a
    batch whose rows lie 4 GiB apart or more is not kept, and the second pass reads its entries
    again)."""

    offsets: UInt32Array
    bases: list[int | None]
    # Where ``offsets`` lives if in a map of its own: the second pass frees each batch's pages once
    # it has taken them, so that they are gone by the time the shard is whole (the build's peak).
    map: mmap.mmap | None = None

    @classmethod
    def of(cls, visit: FileRows) -> KeptStarts:
        n, batches = visit.rows.size, len(visit.cuts) - 1
        if n < THREADED_ROWS:
            return cls(np.empty(n, np.uint32), [None] * batches)
        mm = mmap.mmap(-1, 4 * n, flags=mmap.MAP_PRIVATE)
        return cls(np.frombuffer(mm, np.uint32, n), [None] * batches, mm)

    def free(self) -> None:
        """Let go of the offsets (and their map): done with."""
        self.offsets, self.map = self.offsets[:0].copy(), None

    def take(self, j: int, a: int, b: int) -> Int64Array | None:
        """The starts of batch ``j`` (rows ``a`` to ``b`` in visiting order), or None if not kept;
        its offsets are freed (a page shared with another batch's stays)."""
        base = self.bases[j]
        if base is None:
            return None
        starts = self.offsets[a:b].astype(np.int64)
        starts += base
        if self.map is not None:
            free_pages(self.map, 4 * a, 4 * b)
        return starts

    def keep(self, j: int, a: int, starts: Int64Array) -> None:
        """Keep ``starts``, those of batch ``j``, whose rows begin at ``a`` in visiting order."""
        if not starts.size:
            return
        low = int(starts.min())
        if int(starts.max()) - low < _KEPT_SPAN:
            np.subtract(starts, low, out=self.offsets[a : a + starts.size], casting="unsafe")
            self.bases[j] = low  # (each batch is one thread's: a list item set is atomic)


def threads_for(visit: FileRows) -> int:
    """Threads to read a visit's rows with: one for fewer than ``HELPED_ITEMS`` (a helper thread keeps
    a few MiB resident for good; and starting one costs about a millisecond, which a mix of thousands
    of files would pay for each)."""
    return THREADS if visit.rows.size >= HELPED_ITEMS else 1

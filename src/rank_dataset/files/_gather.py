"""The gather engine behind :meth:`MetaFile.read <rank_dataset.files.metafile.MetaFile.read>`: copies a
set of samples, each at its exact length, into a ShardWriter in item order, checking every line
against the bytes it was copied from. No torch.

A read visits each file's rows (:class:`_FileRows`) in file order at the granularity of a bucket of
samples, in batches, in two passes: the first reads the index entries of a batch, whose lengths fix
where each line goes, and keeps their starts (:class:`_KeptStarts`); the second reads the lines, a
window of the file at a time, checks them and copies them into place. The sample numbers
(:class:`SampleNumbers`) are released between the passes where they can be made again. A Parquet
file's rows are read by row group in both passes (:func:`_parquet_lengths`, :func:`_parquet_copy`):
its index holds no lengths, so the first pass decodes the row groups that hold its rows for theirs.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import mmap
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rank_dataset.core.residency import free_pages
from rank_dataset.core.shard import ShardWriter, copy_rows
from rank_dataset.core.threads import HELPED_ITEMS, THREADS, in_threads
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files._pread import _GAP, ByteSource, Window
from rank_dataset.files.formats import Format, SpanSource
from rank_dataset.files.index import (
    MAPPED_ROWS,
    SpanReader,
    line_mark,
    read_entry,
    spans_are_sane,
)
from rank_dataset.files.scan import BLANK, BOM, CR, NEWLINE
from rank_dataset.plan.bounds import Bounds

if TYPE_CHECKING:
    from rank_dataset.files.metafile import _File

__all__ = [
    "THREADED_ROWS",
    "IndexMismatch",
    "SampleNumbers",
    "bucket_order",
    "check_utf8",
    "gather",
    "line_position",
    "read_one",
]


# Lines are copied in batches that each span about this many bytes of the file, read into one
# reusable buffer: large enough that a build makes few numpy calls per batch, small enough to bound
# its memory.
_WINDOW = 2 << 20


# A batch wider than the window is read row by row (see _batches): at most this many rows, too few
# for Window.load to read its whole span instead (it does where the rows average two a page).
_SPARSE_ROWS = 2 * _WINDOW // 4096


_ROW_EXTRA = 3  # bytes a sparse row is read with beyond its own: the byte before it, its line ending (_copy_rows)


_INDEX_BYTES = 2 << 20  # index bytes a batch of rows is read with, at most (about)


_ENTRY_BYTES = 8  # an index entry


_PAGE = 4096


THREADED_ROWS = 1 << 16  # builds of fewer rows copy in one thread (starting threads costs a millisecond)


_BATCH_ROWS = 1 << 15  # rows copied at a time, bounding the temporaries of a batch


_KEPT_SPAN = 1 << 32  # a batch's starts are kept as offsets from its lowest: less apart than this


# A file of one decoder thread is read by more threads only where a batch of _BATCH_ROWS rows spans
# this many decompressed bytes at most, on average (a few of its spans, which the batch pins).
_SHARED_SPAN = 16 << 20


class IndexMismatch(Exception):
    """The index of file ``file`` cannot be used as it is: ``corrupt`` (its spans disagree with the
    unchanged file: rebuild it) or gone (the cache was removed or replaced: load it again)."""

    def __init__(self, file: int, *, corrupt: bool) -> None:
        super().__init__(file, corrupt)
        self.file, self.corrupt = file, corrupt


def _span(f: _File, file: int, local: int) -> tuple[int, int]:
    """``(start, end)`` of sample ``local`` of file number ``file``, checked to lie inside the file."""
    try:
        start, length = read_entry(f.index, local)
    except LookupError:
        raise IndexMismatch(file, corrupt=False) from None
    if not (start >= 0 and length > 0 and start + length <= f.index.size):
        raise IndexMismatch(file, corrupt=True)
    return start, start + length


def line_position(f: _File, file: int, local: int) -> tuple[int, int, int]:
    """``(offset, line, start)``: sample ``local``'s start, and the mark before it (see
    :func:`~rank_dataset.files.index.line_mark`). A Parquet file's rows are lines ``(0, local, 0)``."""
    if f.index.format is Format.PARQUET:
        return 0, local, 0
    start, _ = _span(f, file, local)
    try:
        with SpanReader(f.index) as reader:
            marks = reader.marks()
    except LookupError:
        raise IndexMismatch(file, corrupt=False) from None
    return (*line_mark(marks, start), start)


def read_one(f: _File, file: int, local: int) -> bytes:
    """The bytes of one sample, checked as a build checks them: one read of the index (its header
    and entry) and one of the file, checked against the index's key once the line is read
    (:meth:`_FileBytes.read_once`: what ``mf[i]`` costs). A Parquet file's row: its row group decoded."""
    if f.index.format is Format.PARQUET:
        with f.bytes.rows(f.index) as rows:
            return rows.lines(np.array([local], np.int64))[0]
    start, end = _span(f, file, local)
    lo = 0 if start == len(BOM) else max(start - 1, 0)  # as _check_from
    hi = min(end + 2, f.index.size)
    raw = f.bytes.read_once(f.index, lo, hi - lo)
    line = raw[start - lo : end - lo]
    tail = raw[end - lo : end - lo + 2]
    if start == 0 or (start == len(BOM) and raw[:3] == BOM):
        start_ok = not (start == 0 and raw[:3] == BOM)
    else:
        start_ok = raw[start - 1 - lo] == NEWLINE
    end_ok = (tail[:1] in (b"\n", b"") and line[-1:] != b"\r") or (tail[:1] == b"\r" and tail[1:] in (b"\n", b""))
    if not (start_ok and end_ok and b"\n" not in line and line.strip(b" \t\r\x0b\x0c")):
        raise IndexMismatch(file, corrupt=True)
    return line


def _batches(
    positions: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64], window: int, max_rows: int
) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive runs of rows at ``positions`` (roughly ascending) of
    ``lengths`` bytes, each of which costs about ``window`` bytes to read and holds at most
    ``max_rows`` rows.

    A batch costs the bytes it spans, or, where less, what its rows are read with one by one (see
    :meth:`Window.load`): each row with the bytes around it that a check needs (``_ROW_EXTRA``), and
    the bytes from the row before it where they are less than ``_GAP`` apart (read in the same call).
    A batch wider than ``window`` holds at most ``_SPARSE_ROWS`` rows, so that it is read row by row.
    """
    if not positions.size:
        return []
    top = np.maximum.accumulate(positions)  # rows jitter: the running maximum
    ends = np.maximum.accumulate(positions + lengths)
    gaps = np.empty_like(ends)
    gaps[0] = 0
    np.subtract(positions[1:] - _ROW_EXTRA, ends[:-1], out=gaps[1:])
    gaps[gaps > _GAP] = 0  # a row far from the others is read alone
    np.maximum(gaps, 0, out=gaps)
    cost = lengths + _ROW_EXTRA + gaps
    sparse = np.cumsum(cost)
    cuts, n = [0], positions.size
    while cuts[-1] < n:
        a = cuts[-1]
        by_span = int(np.searchsorted(top, int(positions[a]) + window, side="right"))
        by_rows = int(np.searchsorted(sparse, int(sparse[a] - cost[a]) + window, side="right"))
        cuts.append(min(max(by_span, min(by_rows, a + _SPARSE_ROWS), a + 1), a + max_rows, n))
    return list(itertools.pairwise(cuts))


class SampleNumbers:
    """The sample numbers of a read; where they can be made again (``make``), the build lets go of
    them once it no longer needs them."""

    def __init__(self, indices: npt.NDArray[np.int64], make: Callable[[], npt.NDArray[np.int64]] | None = None) -> None:
        self._indices: npt.NDArray[np.int64] | None = indices
        self._make = make
        self.size = indices.size

    def get(self) -> npt.NDArray[np.int64]:
        if self._indices is None:
            assert self._make is not None
            self._indices = self._make()
        return self._indices

    def release(self) -> None:
        """Drop this hold on the numbers if they can be made again."""
        if self._make is not None:
            self._indices = None


def gather(files: Sequence[_File], bounds: Bounds, samples: SampleNumbers, *, ids: bool) -> ShardWriter:
    """A ShardWriter holding the lines of samples ``indices``, back to back in ``indices``' order.

    Rows are visited in file order at the granularity of 1/4096 of the samples (a cheap radix sort
    instead of a full one; a small read is sorted in full), in two passes. The first reads the index
    entries of a batch of rows at a time, keeps their lengths, which fix where each line goes, and
    their starts (:class:`_KeptStarts`); the second reads the lines, a window of the file at a time,
    checks them against the file's bytes and copies each at its exact length into its place in item
    order (:func:`~rank_dataset.core.shard.copy_rows`). So a build reads the index once and holds little
    beyond its shard and two 4-byte numbers a row (its place in the visiting order, its start),
    besides ``indices``.

    Raises:
        MetaFileChangedError: a file is not the one indexed.
        IndexMismatch: an index cannot be used as it is.
    """
    indices = samples.get()
    n = indices.size
    if not n:
        writer = ShardWriter(0, 0, ids=ids)
        writer.bounds[0] = 0
        return writer
    visits = _file_rows(files, bounds, indices)
    long_lines = any(f.index.size >= 1 << 32 for f in files)
    lengths = np.empty(n, np.int64 if long_lines else np.uint32)  # in item order
    kept = [_KeptStarts.of(visit) for visit in visits]
    parquet_kept: dict[int, _ParquetKept] = {}
    for visit, starts in zip(visits, kept):
        # (No name may keep ``lengths`` alive past the ``del`` below: a partial, not a local function.)
        if visit.file.index.format is Format.PARQUET:
            parquet_kept[visit.number] = _parquet_lengths(visit, indices, lengths)
            continue
        in_threads(functools.partial(_take_lengths, visit, indices, lengths, starts), _threads(visit))
    writer = ShardWriter(n, int(lengths.sum(dtype=np.int64)), ids=ids)
    writer.bounds[0] = 0
    np.cumsum(lengths, dtype=writer.bounds.dtype, out=writer.bounds[1:])
    del lengths
    if writer.ids is not None:
        writer.ids[:] = indices
    # The second pass needs the sample numbers only for batches whose starts were not kept.
    del indices
    parquet = [visit for visit in visits if visit.file.index.format is Format.PARQUET]
    if not parquet and all(base is not None for starts in kept for base in starts.bases):
        samples.release()
    for visit, starts in zip(visits, kept):
        file = visit.file
        if file.index.format is Format.PARQUET:
            _parquet_copy(visit, samples.get(), writer, parquet_kept.pop(visit.number))
            continue
        with file.bytes.open(file.index) as fd:
            work = functools.partial(_copy_part, visit, fd=fd, writer=writer)
            serial = fd if isinstance(fd, SpanSource) and fd.serial else None
            if serial is not None and _dense(visit, serial.checkpoints.size):
                # One decoder thread makes the spans in order: the threads take the next batch each as
                # they finish one, its spans pinned meanwhile (with a part each, one would fall behind
                # and ask for spans long let go of, decoded again from the frame's start). Only where
                # the rows are dense: a batch of sparse rows spans many spans, which it would all pin,
                # and two batches far apart could not both be decoded in order.
                shared = _Shared(_kept_spans(visit, samples, starts, (0, 1)), serial)
                in_threads(lambda _: work(shared), _threads(visit))  # noqa: B023
            else:
                # A compressed file's threads take a run of batches each: they share no decoded span
                # but at a run's ends (taking every other batch, each thread asked for every span, and
                # one decoded again each span the other had decoded and its source had let go of).
                spans = functools.partial(_kept_spans, visit, samples, starts, runs=not isinstance(fd, int))
                in_threads(lambda part: work(spans(part)), 1 if serial is not None else _threads(visit))  # noqa: B023
        starts.free()
    # Each row starts after a newline and ends at one (checked as it was read): a newline inside a
    # row means its span covers more than one line. One pass over the copied bytes finds it. (A
    # Parquet row is one sample whatever it holds: a newline in one is passed over.)
    bad = writer.find(b"\n")
    while bad >= 0:
        row = int(np.searchsorted(writer.bounds, bad, side="right")) - 1
        f = bounds.locate(int(samples.get()[row]))[0]
        if files[f].index.format is Format.PARQUET:
            bad = writer.find(b"\n", int(writer.bounds[row + 1]))
            continue
        with files[f].bytes.open(files[f].index) as fd:
            files[f].bytes.check(fd, files[f].index.key)
        raise IndexMismatch(f, corrupt=True)
    return writer


_BUCKET_BITS = 12  # rows are visited in file order at the granularity of 1/4096 of the samples


# Reads of at most this many rows are sorted in full, one batch a file: their index entries span at
# most 2 pages each where they are read as one range (see Window.load), so about _INDEX_BYTES.
_SORTED_ROWS = 1 << 12


@dataclass(frozen=True)
class _FileRows:
    """The rows (item numbers) of ``indices`` that are samples of file ``number``, in visiting order,
    and where each batch of them starts: consecutive buckets whose index entries are read with about
    ``_INDEX_BYTES`` at most, at most ``_BATCH_ROWS`` rows."""

    number: int
    file: _File
    base: int
    rows: npt.NDArray[np.integer[Any]]
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
        self, indices: npt.NDArray[np.int64], part: tuple[int, int] = (0, 1), only: Sequence[int] | None = None
    ) -> Iterator[tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int64]]]:
        """``(j, rows, local)`` of each batch ``j`` of ``part`` (with ``only``: of those batches): the
        item numbers and the samples' numbers in the file."""
        for j, a, b in self.parts(part) if only is None else [(j, self.cuts[j], self.cuts[j + 1]) for j in only]:
            rows = self.rows[a:b].astype(np.int64)
            yield j, rows, indices[rows] - self.base


def _file_rows(files: Sequence[_File], bounds: Bounds, indices: npt.NDArray[np.int64]) -> list[_FileRows]:
    """Each file's rows of ``indices``, in file order at the granularity of a bucket of samples, and
    cut into batches."""
    n, n_total = indices.size, bounds.total
    if n <= _SORTED_ROWS:
        return _sorted_file_rows(files, bounds, indices)
    shift = _bucket_shift(n_total)
    keys = _bucket_keys(indices, shift)
    order = np.argsort(keys, kind="stable")  # a radix sort of 16-bit keys
    rows = order.astype(np.uint32) if n < 1 << 32 else order
    del order
    counts = np.bincount(keys, minlength=1 << _BUCKET_BITS)  # in item order: no gather
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
        mapped: npt.NDArray[Any] = np.frombuffer(mm, rows.dtype)
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
            while end - cuts[-1] > _BATCH_ROWS:
                cuts.append(cuts[-1] + _BATCH_ROWS)
            if end > cuts[-1]:
                cuts.append(end)
        visits.append(_FileRows(f, files[f], int(bounds.starts[f]), mine, cuts, mm, lo))
    return visits


def _bucket_shift(total: int) -> int:
    """How far sample numbers of ``total`` are shifted to give their bucket (1/4096 of ``total``)."""
    return max(0, (total - 1).bit_length() - _BUCKET_BITS)


def _bucket_keys(indices: npt.NDArray[np.int64], shift: int) -> npt.NDArray[np.uint16]:
    keys = np.empty(indices.size, np.uint16)
    for lo in range(0, indices.size, _BATCH_ROWS):  # a slice at a time: no n-sized int64 temporary
        np.right_shift(indices[lo : lo + _BATCH_ROWS], shift, out=keys[lo : lo + _BATCH_ROWS], casting="unsafe")
    return keys


def bucket_order(indices: npt.NDArray[np.int64], total: int) -> npt.NDArray[np.intp]:
    """An order of ``indices`` (sample numbers below ``total``) in file order at the granularity a
    read visits them (1/4096 of ``total``): a read of ``indices[order]`` writes its shard almost in
    the order it reads the files, a few times faster than into a random order. A stable radix sort.

    Examples:
        >>> bucket_order(np.array([9000, 5, 4097]), 10_000).tolist()
        [1, 2, 0]
    """
    return np.argsort(_bucket_keys(indices, _bucket_shift(total)), kind="stable")


def _sorted_file_rows(files: Sequence[_File], bounds: Bounds, indices: npt.NDArray[np.int64]) -> list[_FileRows]:
    """The visits of a small read (at most ``_SORTED_ROWS`` rows): its rows in file order exactly,
    one batch a file (sorting a few thousand numbers costs less than bucketing them)."""
    order = np.argsort(indices, kind="stable")
    rows = order.astype(np.uint32)
    ends = np.searchsorted(indices[order], bounds.starts, side="left").tolist()
    return [
        _FileRows(f, files[f], int(bounds.starts[f]), rows[lo:hi], [0, hi - lo])
        for f, (lo, hi) in enumerate(itertools.pairwise(ends))
        if hi > lo
    ]


def _take_lengths(
    visit: _FileRows, indices: npt.NDArray[np.int64], out: npt.NDArray[Any], kept: _KeptStarts, part: tuple[int, int]
) -> None:
    """Set ``out[row]`` to the length of each row of ``visit``'s batches of ``part`` (see
    :func:`_spans_of`), and keep their starts in ``kept``."""
    for j, (rows, starts, took) in _spans_of(visit, indices, part):
        out[rows] = took  # the parts' rows are disjoint
        kept.keep(j, visit.cuts[j], starts)


@dataclass
class _KeptStarts:
    """The starts of a visit's rows, which the first pass keeps for the second, so that a build
    reads the index once: in visiting order, as 4-byte offsets from their batch's lowest start (a
    batch whose rows lie 4 GiB apart or more is not kept, and the second pass reads its entries
    again)."""

    offsets: npt.NDArray[np.uint32]
    bases: list[int | None]
    # Where ``offsets`` lives if in a map of its own: the second pass frees each batch's pages once
    # it has taken them, so that they are gone by the time the shard is whole (the build's peak).
    map: mmap.mmap | None = None

    @classmethod
    def of(cls, visit: _FileRows) -> _KeptStarts:
        n, batches = visit.rows.size, len(visit.cuts) - 1
        if n < THREADED_ROWS:
            return cls(np.empty(n, np.uint32), [None] * batches)
        mm = mmap.mmap(-1, 4 * n, flags=mmap.MAP_PRIVATE)
        return cls(np.frombuffer(mm, np.uint32, n), [None] * batches, mm)

    def free(self) -> None:
        """Let go of the offsets (and their map): done with."""
        self.offsets, self.map = self.offsets[:0].copy(), None

    def take(self, j: int, a: int, b: int) -> npt.NDArray[np.int64] | None:
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

    def keep(self, j: int, a: int, starts: npt.NDArray[np.int64]) -> None:
        """Keep ``starts``, those of batch ``j``, whose rows begin at ``a`` in visiting order."""
        if not starts.size:
            return
        low = int(starts.min())
        if int(starts.max()) - low < _KEPT_SPAN:
            np.subtract(starts, low, out=self.offsets[a : a + starts.size], casting="unsafe")
            self.bases[j] = low  # (each batch is one thread's: a list item set is atomic)


# (rows, starts, lengths) of a batch read from the index; for the second pass, lengths None where the first gave them.
_Batch = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]


_Kept = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64] | None]


def _kept_spans(
    visit: _FileRows, samples: SampleNumbers, kept: _KeptStarts, part: tuple[int, int], *, runs: bool = False
) -> Iterator[_Kept]:
    """``(rows, starts, lengths)`` of each batch of ``visit`` of ``part`` (see :meth:`_FileRows.parts`)
    for the second pass: the starts the first pass kept, the lengths None (those it gave the shard's
    bounds); a batch not kept is read from the index again, its lengths to be checked against the bounds."""
    parts = visit.parts(part, runs=runs)
    missing = [j for j, _, _ in parts if kept.bases[j] is None]
    again = _spans_of(visit, samples.get(), part, only=missing) if missing else iter(())
    for j, a, b in parts:
        starts = kept.take(j, a, b)
        if starts is None:
            batch: _Kept = next(again)[1]
        else:
            batch = visit.rows[a:b].astype(np.int64), starts, None
        visit.free(a, b)
        yield batch


def _threads(visit: _FileRows) -> int:
    """Threads to read a visit's rows with: one for fewer than ``HELPED_ITEMS`` (a helper thread keeps
    a few MiB resident for good; and starting one costs about a millisecond, which a mix of thousands
    of files would pay for each)."""
    return THREADS if visit.rows.size >= HELPED_ITEMS else 1


def _dense(visit: _FileRows, size: int) -> bool:
    """Whether a batch of ``visit``'s rows spans at most ``_SHARED_SPAN`` of the file's ``size`` bytes, on average."""
    return visit.rows.size * _SHARED_SPAN >= _BATCH_ROWS * size


class _Shared(Iterator[_Kept]):
    """The batches of ``batches`` for several threads at once, each batch to one of them, in order.
    A batch's spans of ``source`` are pinned as it is taken, until its thread takes the next: one
    that lags finds them kept, whatever the others decoded meanwhile."""

    def __init__(self, batches: Iterator[_Kept], source: SpanSource) -> None:
        self._batches, self._source, self._lock = batches, source, threading.Lock()
        self._held = threading.local()

    def __next__(self) -> _Kept:
        held: tuple[int, int] | None = getattr(self._held, "spans", None)
        if held is not None:
            self._held.spans = None
            self._source.unpin(*held)
        with self._lock:
            batch = next(self._batches)
            starts = batch[1]
            if starts.size:
                self._held.spans = self._source.pin(int(starts.min()), int(starts.max()))
        return batch


def _parquet_groups(
    visit: _FileRows, indices: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], list[tuple[int, int, int]]]:
    """``(rows, local, groups)`` of a Parquet file's visit: its item numbers and their row numbers in
    the file, both ordered by row group, and ``(g, a, b)`` for each row group ``g`` they touch
    (``rows[a:b]`` lie in it)."""
    layout = visit.file.index.parquet
    assert layout is not None
    rows = visit.rows.astype(np.int64)
    local = indices[rows] - visit.base
    bounds = np.asarray(layout.bounds, np.int64)
    group = np.searchsorted(bounds, local, side="right") - 1
    order = np.argsort(group, kind="stable")  # rows come in buckets of file order: nearly sorted
    rows, local, group = rows[order], local[order], group[order]
    cuts = np.flatnonzero(np.diff(group)) + 1
    starts = [0, *cuts.tolist()]
    ends = [*cuts.tolist(), rows.size]
    return rows, local - bounds[group], [(int(group[a]), a, b) for a, b in zip(starts, ends)]


# A Parquet read's first pass keeps the rows it decoded, packed, up to this many bytes, so that the
# second pass decodes only the row groups past it again (the shard of one rank of many is all kept).
_PARQUET_KEPT = 256 << 20


@dataclass
class _ParquetKept:
    """The rows of each row group the first pass decoded, packed back to back (row group -> bytes),
    while they total at most ``_PARQUET_KEPT`` bytes."""

    rows: dict[int, npt.NDArray[np.uint8]]
    lock: threading.Lock
    nbytes: int = 0

    def keep(
        self, g: int, data: npt.NDArray[np.uint8], src: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]
    ) -> None:
        total = int(lengths.sum())
        with self.lock:
            if self.nbytes + total > _PARQUET_KEPT:
                return
            self.nbytes += total
        packed = np.empty(total, np.uint8)
        copy_rows(data, src, lengths, packed, np.cumsum(lengths) - lengths)
        self.rows[g] = packed


def _parquet_lengths(visit: _FileRows, indices: npt.NDArray[np.int64], out: npt.NDArray[Any]) -> _ParquetKept:
    """Set ``out[row]`` to the length of each row of a Parquet file's ``visit``: its row groups
    decoded (those that hold its rows; in threads, each with a reader of its own). What it kept of
    the rows for the second pass."""
    rows, local, groups = _parquet_groups(visit, indices)
    kept = _ParquetKept({}, threading.Lock())

    def work(part: tuple[int, int]) -> None:
        t, k = part
        with visit.file.bytes.rows(visit.file.index) as reader:
            for g, a, b in groups[t::k]:
                data, offsets = reader.group_array(g, local[a:b])
                src, lengths = offsets[:-1], np.diff(offsets)
                out[rows[a:b]] = lengths
                kept.keep(g, data, src, lengths)

    in_threads(work, min(_threads(visit), max(len(groups), 1)))
    return kept


def _parquet_copy(visit: _FileRows, indices: npt.NDArray[np.int64], writer: ShardWriter, kept: _ParquetKept) -> None:
    """Copy the rows of a Parquet file's ``visit`` into ``writer``: those the first pass kept, and
    those of the other row groups decoded again.

    Raises:
        MetaFileChangedError: a row's length is not what the first pass found (the file changed).
    """
    rows, local, groups = _parquet_groups(visit, indices)

    def work(part: tuple[int, int]) -> None:
        t, k = part
        with contextlib.ExitStack() as stack:
            reader = None
            for g, a, b in groups[t::k]:
                dst = writer.bounds[rows[a:b]].astype(np.int64)
                packed = kept.rows.pop(g, None)
                if packed is not None:
                    lengths = (writer.bounds[rows[a:b] + 1] - dst).astype(np.int64)
                    copy_rows(packed, np.cumsum(lengths) - lengths, lengths, writer.data, dst)
                    continue
                if reader is None:
                    reader = stack.enter_context(visit.file.bytes.rows(visit.file.index))
                data, offsets = reader.group_array(g, local[a:b])
                src, lengths = offsets[:-1], np.diff(offsets)
                if not np.array_equal(writer.bounds[rows[a:b] + 1] - dst, lengths):
                    raise MetaFileChangedError(visit.file.path, f"its row group {g} changed while it was read")
                copy_rows(data, src, lengths, writer.data, dst)

    in_threads(work, min(_threads(visit), max(len(groups), 1)))


def _copy_part(
    visit: _FileRows,
    batches: Iterator[_Kept],
    fd: int | ByteSource,
    writer: ShardWriter,
) -> None:
    """Copy the rows of ``batches`` of ``visit`` from the file open at ``fd`` into ``writer``."""
    file, window = visit.file, Window()
    for rows, starts, took in batches:
        dst = writer.bounds[rows]
        lengths = (writer.bounds[rows + 1] - dst).astype(np.int64, copy=False)
        # Entries read again: the cache could have been replaced since the first pass.
        if took is not None and not np.array_equal(lengths, took):
            raise IndexMismatch(visit.number, corrupt=True)
        if not _copy_rows(fd, file.index.size, window, starts, lengths, dst, writer.data):
            file.bytes.check(fd, file.index.key)  # a file changed meanwhile is that error
            raise IndexMismatch(visit.number, corrupt=True)


def _spans_of(
    visit: _FileRows, indices: npt.NDArray[np.int64], part: tuple[int, int] = (0, 1), only: Sequence[int] | None = None
) -> Iterator[tuple[int, _Batch]]:
    """``(j, (rows, starts, lengths))`` of each batch ``j`` of ``visit`` (of ``part`` ``(t, k)``: every
    k-th from the t-th; with ``only``, of those batches), from the index, checked to lie inside the
    file (the bytes they point at are checked when they are copied). The index is opened at the
    first batch."""
    size = visit.file.index.size
    try:
        # A small read (a batch of random samples) takes its entries from the process's map of the
        # cache; a shard's build reads only the pages it needs and maps nothing (it would stay resident).
        with SpanReader(visit.file.index, mapped=indices.size < MAPPED_ROWS) as reader:
            for j, rows, local in visit.batches(indices, part, only):
                starts, lengths = reader.take(local)
                if not spans_are_sane(starts, lengths, size, ordered=False):
                    raise IndexMismatch(visit.number, corrupt=True)
                yield j, (rows, starts, lengths)
    except LookupError:
        raise IndexMismatch(visit.number, corrupt=False) from None


def _check_from(s: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Where the bytes needed to check samples starting at ``s`` begin: the byte before each (the
    whole byte order mark for a sample that may follow one)."""
    return np.where(s == len(BOM), 0, np.maximum(s - 1, 0))


def _copy_rows(
    fd: int | ByteSource,
    size: int,
    window: Window,
    first: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    dst: npt.NDArray[np.integer[Any]],
    data: npt.NDArray[np.uint8],
) -> bool:
    """Copy rows of one file (``lengths`` bytes at ``first``, in about file order) to ``dst`` in
    ``data``; False, before copying a batch, if one of its rows is not a line of the file.

    Rows go in batches that each span about ``_WINDOW`` bytes of the file (rows are in file order up
    to a little jitter), each read once into ``window``, checked there and copied from it.
    """
    for a, b in _batches(first, lengths, _WINDOW, _BATCH_ROWS):
        s, e = first[a:b], first[a:b] + lengths[a:b]
        buf, shift = window.load(fd, _check_from(s), e + 2, size, pad=8)
        if not (_bounds_ok(buf, shift, s, e, size) and _rows_ok(buf, s - shift, e - shift)):
            return False
        copy_rows(buf, s - shift, lengths[a:b], data, dst[a:b])
    return True


def _bounds_ok(
    buf: npt.NDArray[np.uint8],
    shift: int | npt.NDArray[np.int64],
    s: npt.NDArray[np.int64],
    e: npt.NDArray[np.int64],
    size: int,
) -> bool:
    """Whether every span ``[s, e)`` is bounded as a sample is: it starts the file (after a byte
    order mark, if the file has one) or follows a newline, and its end is a line ending (``\\n`` not
    after ``\\r``, ``\\r\\n``, ``\\r`` at the end of the file) or the end of the file.

    ``buf[x - shift]`` is byte ``x`` of the file for ``x`` in ``[s - 1, e + 2)`` (``[0, e + 2)`` for a
    row that may follow a byte order mark), and ``buf`` has at least 2 bytes more after ``e``.
    """
    # The common case first, in a few passes: after a newline, before a newline not after a CR.
    rs, re_ = s - shift, e - shift  # where the rows are in buf
    ok = (buf[rs - 1] == NEWLINE) & (buf[re_] == NEWLINE) & (buf[re_ - 1] != CR) & (s != 0)
    if bool(ok.all()):
        return True
    rows = np.flatnonzero(~ok)  # the first sample, the last, CRLF endings, and wrong spans
    s, e, rs, re_ = s[rows], e[rows], rs[rows], re_[rows]
    # A row that may follow the byte order mark was read from the file's first byte on.
    head = np.flatnonzero(s <= len(BOM))
    zero = int(rs[head[0]] - s[head[0]]) if head.size else 0  # where byte 0 of the file is in buf
    bom = bool(head.size) and size >= len(BOM) and buf[zero : zero + len(BOM)].tobytes() == BOM
    after_newline = buf[np.maximum(rs - 1, 0)] == NEWLINE
    start_ok = np.where(s == 0, not bom, after_newline | ((s == len(BOM)) & bom))
    last, c1, c2 = buf[re_ - 1], buf[re_], buf[re_ + 1]
    at_eof = e >= size
    plain_end = (at_eof | (c1 == NEWLINE)) & (last != CR)
    cr_end = ~at_eof & (c1 == CR) & ((e + 1 >= size) | (c2 == NEWLINE))
    return bool((start_ok & (plain_end | cr_end)).all())


def _rows_ok(buf: npt.NDArray[np.uint8], s: npt.NDArray[np.int64], e: npt.NDArray[np.int64]) -> bool:
    """Whether each row ``buf[s:e]`` holds something other than whitespace (newlines inside rows are
    looked for once the whole shard is copied)."""
    # Only a row that starts with whitespace can be blank: check those in full (they are rare).
    maybe_blank = np.flatnonzero(BLANK[buf[s]])
    return all(_line_ok(buf[x:y]) for x, y in zip(s[maybe_blank].tolist(), e[maybe_blank].tolist()))


def _line_ok(line: npt.NDArray[np.uint8]) -> bool:
    """Whether ``line`` holds no newline and something other than whitespace."""
    return not bool((line == NEWLINE).any()) and not bool(BLANK[line].all())


def check_utf8(
    where: Callable[[int], str],
    data: npt.NDArray[np.uint8],
    bounds: npt.NDArray[np.integer[Any]],
) -> None:
    """Raise ValueError naming file and line (``where(row)``) of a row that is not valid UTF-8.

    ``data`` holds the rows back to back, row ``i`` at ``bounds[i]:bounds[i + 1]``.
    """

    def fail(row: int) -> None:
        try:
            data[bounds[row] : bounds[row + 1]].tobytes().decode("utf-8")
            reason = "invalid byte sequence"  # pragma: no cover - callers pass an invalid row
        except UnicodeDecodeError as exc:
            reason = f"{exc.reason} at byte {exc.start}"
        raise ValueError(f"{where(row)}: line is not valid UTF-8 ({reason})")

    starts, ends = bounds[:-1], bounds[1:]
    nonempty = np.flatnonzero(ends > starts)
    first = data[starts[nonempty]]
    # A line that starts with a continuation byte is invalid on its own; with none such, a
    # sequence cut at a line boundary cannot pass as valid, so whole runs of lines can be decoded.
    bad = nonempty[(first >= 0x80) & (first < 0xC0)]
    if bad.size:
        fail(int(bad[0]))
    cuts = [*bounds[: -1 : 1 << 16].tolist(), int(bounds[-1])]
    view = data.data
    for a, b in itertools.pairwise(cuts):
        try:
            str(view[a:b], "utf-8")
        except UnicodeDecodeError as exc:
            fail(int(np.searchsorted(bounds, a + exc.start, side="right")) - 1)

"""The gather engine behind :meth:`MetaFile.read <rank_dataset.files.read.metafile.MetaFile.read>`: copies a
set of samples, each at its exact length, into a ShardWriter in item order, checking every line
against the bytes it was copied from.

A read visits each file's rows in file order at the granularity of a bucket of samples, in batches
(the visiting plan: :mod:`rank_dataset.files.read._visits`), in two passes: the first reads the index
entries of a batch, whose lengths fix where each line goes, and keeps their starts; the second reads
the lines, a window of the file at a time, checks them (:mod:`rank_dataset.files.read.lines`) and copies
them into place. The sample numbers (:class:`SampleNumbers`) are released between the passes where
they can be made again. A Parquet file's rows are read by row group in both passes
(:mod:`rank_dataset.files.read._parquet_gather`): its index holds no lengths, so the first pass decodes
the row groups that hold its rows for theirs. Also the single reads of ``mf[i]`` (:func:`read_one`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from rank_dataset.core import native
from rank_dataset.core.arrays import Int64Array, IntegerArray, UInt8Array
from rank_dataset.core.native import BOM, NEWLINE
from rank_dataset.core.shard import ShardWriter
from rank_dataset.core.threads import in_threads
from rank_dataset.files.index.load import (
    MAPPED_ROWS,
    SpanReader,
    line_mark,
    read_entry,
    spans_are_sane,
)
from rank_dataset.files.io.pread import GAP, RangeLoader, Window, dense
from rank_dataset.files.read import _visits
from rank_dataset.files.read._visits import (
    THREADED_ROWS,
    FileRows,
    KeptStarts,
    bucket_order,
    file_rows,
    threads_for,
)
from rank_dataset.files.read.lines import check_from, check_utf8, window_ok
from rank_dataset.plan.bounds import Bounds

if TYPE_CHECKING:
    from rank_dataset.files.formats import SpanSource
    from rank_dataset.files.read._parquet_gather import ParquetKept
    from rank_dataset.files.read.file import IndexedFile

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


# Bytes read past the last row start of a dense batch copied in one pass (_gather_window): its line
# and the two bytes after it, unless it is longer (then the batch is copied the general way).
_TAIL = 16 << 10


_ROW_EXTRA = 3  # bytes a sparse row is read with beyond its own: the byte before it, its line ending (_copy_file_rows)


# A file of one decoder thread is read by more threads only where a batch of BATCH_ROWS rows spans
# this many decompressed bytes at most, on average (a few of its spans, which the batch pins).
_SHARED_SPAN = 16 << 20


class IndexMismatch(Exception):
    """The index of file ``file`` cannot be used as it is: ``corrupt`` (its spans disagree with the
    unchanged file: rebuild it) or gone (the cache was removed or replaced: load it again)."""

    def __init__(self, file: int, *, corrupt: bool) -> None:
        super().__init__(file, corrupt)
        self.file, self.corrupt = file, corrupt


def _span(f: IndexedFile, file: int, local: int) -> tuple[int, int]:
    """``(start, end)`` of sample ``local`` of file number ``file``, checked to lie inside the file."""
    try:
        start, length = read_entry(f.index, local)
    except LookupError:
        raise IndexMismatch(file, corrupt=False) from None
    if not (start >= 0 and length > 0 and start + length <= f.index.size):
        raise IndexMismatch(file, corrupt=True)
    return start, start + length


def line_position(f: IndexedFile, file: int, local: int) -> tuple[int, int, int]:
    """``(offset, line, start)``: sample ``local``'s start, and the mark before it (see
    :func:`~rank_dataset.files.index.load.line_mark`). A Parquet file's rows are lines ``(0, local, 0)``."""
    if f.index.format.rows:
        return 0, local, 0
    start, _ = _span(f, file, local)
    try:
        with SpanReader(f.index) as reader:
            marks = reader.marks()
    except LookupError:
        raise IndexMismatch(file, corrupt=False) from None
    return (*line_mark(marks, start), start)


def read_one(f: IndexedFile, file: int, local: int) -> bytes:
    """The bytes of one sample, checked as a build checks them: one read of the index (its header
    and entry) and one of the file, checked against the index's key once the line is read
    (:meth:`FileBytes.read_once`: what ``mf[i]`` costs). A Parquet file's row: its row group decoded."""
    if f.index.format.rows:
        with f.bytes.rows(f.index) as rows:
            return rows.lines(np.array([local], np.int64))[0]
    start, end = _span(f, file, local)
    lo = 0 if start == len(BOM) else max(start - 1, 0)  # as check_from
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


def _batches(positions: Int64Array, lengths: Int64Array, window: int, max_rows: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive runs of rows at ``positions`` (roughly ascending) of
    ``lengths`` bytes, each of which costs about ``window`` bytes to read and holds at most
    ``max_rows`` rows.

    A batch costs the bytes it spans, or, where less, what its rows are read with one by one (see
    :meth:`Window.load`): each row with the bytes around it that a check needs (``_ROW_EXTRA``), and
    the bytes from the row before it where they are less than ``GAP`` apart (read in the same call).
    A batch wider than ``window`` holds at most ``_SPARSE_ROWS`` rows, so that it is read row by row.
    """
    if not positions.size:
        return []
    top = np.maximum.accumulate(positions)  # rows jitter: the running maximum
    ends = np.maximum.accumulate(positions + lengths)
    gaps = np.empty_like(ends)
    gaps[0] = 0
    np.subtract(positions[1:] - _ROW_EXTRA, ends[:-1], out=gaps[1:])
    gaps[gaps > GAP] = 0  # a row far from the others is read alone
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

    def __init__(self, indices: Int64Array, make: Callable[[], Int64Array] | None = None) -> None:
        self._indices: Int64Array | None = indices
        self._make = make
        self.size = indices.size

    def get(self) -> Int64Array:
        if self._indices is None:
            assert self._make is not None
            self._indices = self._make()
        return self._indices

    def release(self) -> None:
        """Drop this hold on the numbers if they can be made again."""
        if self._make is not None:
            self._indices = None


def gather(
    files: Sequence[IndexedFile], bounds: Bounds, samples: SampleNumbers, *, ids: bool, shared: bool = True
) -> ShardWriter:
    """A ShardWriter holding the lines of the sample numbers ``samples`` gives (``samples.get()``), back to
    back in their order, read from ``files`` (whose samples ``bounds`` numbers); ``ids``: the writer keeps
    the sample numbers; ``shared``: in a shareable segment (else in private memory).

    In the two passes the module describes, it holds little beyond its shard and two 4-byte numbers a row
    (its place in the visiting order, its start, :class:`KeptStarts`), besides the sample numbers.

    Raises:
        MetaFileChangedError: a file is not the one indexed.
        IndexMismatch: an index cannot be used as it is.
    """
    indices = samples.get()
    n = indices.size
    if not n:
        writer = ShardWriter(0, 0, ids=ids, shared=shared)
        writer.bounds[0] = 0
        return writer
    with contextlib.ExitStack() as ahead:  # (closes a source opened ahead if the build fails before its pass)
        # The first file's source opened, and a one-frame zstd file's decoding started, as early as
        # its rows are known: before they are planned where they are all the read's.
        first = _open_ahead(files[0], n, ahead) if len(files) == 1 else None
        visits = file_rows(files, bounds, indices)
        if len(files) > 1:
            first = _open_ahead(visits[0].file, visits[0].rows.size, ahead)
        writer, kept, parquet_kept = _first_pass(visits, indices, ids=ids, shared=shared)
        if writer.ids is not None:
            writer.ids[:] = indices
        # The second pass needs the sample numbers only for batches whose starts were not kept.
        del indices
        parquet = [visit for visit in visits if visit.file.index.format.rows]
        if not parquet and all(base is not None for starts in kept for base in starts.bases):
            samples.release()
        for visit, starts in zip(visits, kept):
            file = visit.file
            if file.index.format.rows:
                from rank_dataset.files.read._parquet_gather import parquet_copy

                parquet_copy(visit, samples.get(), writer, parquet_kept.pop(visit.number))
                continue
            if first is not None and visit is visits[0]:
                with ahead.pop_all():  # the source opened ahead, closed (and the file checked) at its pass's end
                    _second_pass(visit, samples, starts, writer, first)
            else:
                with file.bytes.open(file.index) as fd:
                    _second_pass(visit, samples, starts, writer, fd)
            starts.free()
    # Each row starts after a newline and ends at one (checked as it was read): a newline inside a
    # row means its span covers more than one line. The native checks looked for it in each window;
    # on numpy, one pass over the copied bytes finds it. (A Parquet row is one sample whatever it
    # holds: a newline in one is passed over.)
    bad = -1 if native.FUSED else writer.find(b"\n")
    while bad >= 0:
        row = int(np.searchsorted(writer.bounds, bad, side="right")) - 1
        f = bounds.locate(int(samples.get()[row]))[0]
        if files[f].index.format.rows:
            bad = writer.find(b"\n", int(writer.bounds[row + 1]))
            continue
        with files[f].bytes.open(files[f].index) as fd:
            files[f].bytes.check(fd, files[f].index.key)
        raise IndexMismatch(f, corrupt=True)
    return writer


def _open_ahead(file: IndexedFile, rows: int, ahead: contextlib.ExitStack) -> SpanSource | None:
    """The source of ``file`` opened (into ``ahead``) before the first pass where a read's ``rows`` of
    it are dense in a compressed file, and a one-frame zstd file's decoding started
    (:meth:`SpanSource.read_ahead`): its first spans are decoded while the first pass reads the index.
    None elsewhere (the second pass opens the file)."""
    if not file.index.format.compressed or file.index.format.rows or not _dense(rows, file.index.size):
        return None
    from rank_dataset.files.formats import SpanSource  # a compressed file's: its module on first use

    source = ahead.enter_context(file.bytes.open(file.index))
    assert isinstance(source, SpanSource)
    source.read_ahead()
    return source


def _first_pass(
    visits: list[FileRows], indices: Int64Array, *, ids: bool, shared: bool
) -> tuple[ShardWriter, list[KeptStarts], dict[int, ParquetKept]]:
    """The first pass: the index entries of every row read, the shard made (its bounds set from the
    rows' lengths), the starts kept (:class:`KeptStarts`, a visit each) and Parquet's row groups."""
    n = indices.size
    long_lines = any(visit.file.index.size >= 1 << 32 for visit in visits)
    lengths = np.empty(n, np.int64 if long_lines else np.uint32)  # in item order
    kept = [KeptStarts.of(visit) for visit in visits]
    parquet_kept: dict[int, ParquetKept] = {}
    for visit, starts in zip(visits, kept):
        # (No name may keep ``lengths`` alive past this function: a partial, not a local function.)
        if visit.file.index.format.rows:
            from rank_dataset.files.read._parquet_gather import parquet_lengths  # on first use: a Parquet file's

            parquet_kept[visit.number] = parquet_lengths(visit, indices, lengths)
            continue
        in_threads(functools.partial(_take_lengths, visit, indices, lengths, starts), threads_for(visit))
    writer = ShardWriter(n, int(lengths.sum(dtype=np.int64)), ids=ids, shared=shared)
    writer.bounds[0] = 0
    np.cumsum(lengths, dtype=writer.bounds.dtype, out=writer.bounds[1:])
    return writer, kept, parquet_kept


def _second_pass(
    visit: FileRows, samples: SampleNumbers, starts: KeptStarts, writer: ShardWriter, fd: int | RangeLoader
) -> None:
    """The second pass over ``visit``'s file, open at ``fd``: its rows copied into ``writer``."""
    work = functools.partial(_copy_part, visit, fd=fd, writer=writer)
    serial = None
    if not isinstance(fd, int):  # a text file's is a descriptor: the spans' module is a compressed file's
        from rank_dataset.files.formats import SpanSource

        serial = fd if isinstance(fd, SpanSource) and fd.serial else None
    if serial is not None and _dense(visit.rows.size, serial.checkpoints.size):
        # One decoder thread makes the spans in order: the threads take the next batch each as
        # they finish one, its spans pinned meanwhile (with a part each, one would fall behind
        # and ask for spans long let go of, decoded again from the frame's start). Only where
        # the rows are dense: a batch of sparse rows spans many spans, which it would all pin,
        # and two batches far apart could not both be decoded in order.
        in_order = _SharedBatches(_kept_spans(visit, samples, starts, (0, 1)), serial)
        in_threads(lambda _: work(in_order), threads_for(visit))
    else:
        # A compressed file's threads take a run of batches each: they share no decoded span
        # but at a run's ends (taking every other batch, each thread asked for every span, and
        # one decoded again each span the other had decoded and its source had let go of).
        spans = functools.partial(_kept_spans, visit, samples, starts, runs=not isinstance(fd, int))
        in_threads(lambda part: work(spans(part)), 1 if serial is not None else threads_for(visit))


def _take_lengths(
    visit: FileRows, indices: Int64Array, out: np.ndarray, kept: KeptStarts, part: tuple[int, int]
) -> None:
    """Set ``out[row]`` to the length of each row of ``visit``'s batches of ``part`` (see
    :func:`_spans_of`), and keep their starts in ``kept``."""
    for j, (rows, starts, took) in _spans_of(visit, indices, part):
        out[rows] = took  # the parts' rows are disjoint
        kept.keep(j, visit.cuts[j], starts)


# (rows, starts, lengths) of a batch read from the index; for the second pass, lengths None where the first gave them.
_Batch = tuple[Int64Array, Int64Array, Int64Array]


_BatchSpans = tuple[Int64Array, Int64Array, Int64Array | None]


def _kept_spans(
    visit: FileRows, samples: SampleNumbers, kept: KeptStarts, part: tuple[int, int], *, runs: bool = False
) -> Iterator[_BatchSpans]:
    """``(rows, starts, lengths)`` of each batch of ``visit`` of ``part`` (see :meth:`FileRows.parts`)
    for the second pass: the starts the first pass kept, the lengths None (those it gave the shard's
    bounds); a batch not kept is read from the index again, its lengths to be checked against the bounds."""
    parts = visit.parts(part, runs=runs)
    missing = [j for j, _, _ in parts if kept.bases[j] is None]
    again = _spans_of(visit, samples.get(), part, only=missing) if missing else iter(())
    for j, a, b in parts:
        starts = kept.take(j, a, b)
        if starts is None:
            batch: _BatchSpans = next(again)[1]
        else:
            batch = visit.rows[a:b].astype(np.int64), starts, None
        visit.free(a, b)
        yield batch


def _dense(rows: int, size: int) -> bool:
    """Whether a batch of a visit's ``rows`` spans at most ``_SHARED_SPAN`` of the file's ``size`` bytes, on average."""
    return rows * _SHARED_SPAN >= _visits.BATCH_ROWS * size


class _SharedBatches(Iterator[_BatchSpans]):
    """The batches of ``batches`` for several threads at once, each batch to one of them, in order.
    A batch's spans of ``source`` are pinned as it is taken, until its thread takes the next: one
    that lags finds them kept, whatever the others decoded meanwhile."""

    def __init__(self, batches: Iterator[_BatchSpans], source: SpanSource) -> None:
        self._batches, self._source, self._lock = batches, source, threading.Lock()
        self._held = threading.local()

    def __next__(self) -> _BatchSpans:
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


def _copy_part(
    visit: FileRows,
    batches: Iterator[_BatchSpans],
    fd: int | RangeLoader,
    writer: ShardWriter,
) -> None:
    """Copy the rows of ``batches`` of ``visit`` from the file open at ``fd`` into ``writer``."""
    file, window = visit.file, Window()
    fused = native.FUSED
    for rows, starts, took in batches:
        if fused and took is None:
            done = _gather_window(fd, file.index.size, window, rows, starts, writer)
            if done is False:
                file.bytes.check(fd, file.index.key)  # a file changed meanwhile is that error
                raise IndexMismatch(visit.number, corrupt=True)
            if done:
                continue
        dst = writer.bounds[rows]
        lengths = (writer.bounds[rows + 1] - dst).astype(np.int64, copy=False)
        # Entries read again: the cache could have been replaced since the first pass.
        if took is not None and not np.array_equal(lengths, took):
            raise IndexMismatch(visit.number, corrupt=True)
        if not _copy_file_rows(fd, file.index.size, window, starts, lengths, dst, writer.data):
            file.bytes.check(fd, file.index.key)  # a file changed meanwhile is that error
            raise IndexMismatch(visit.number, corrupt=True)


def _gather_window(
    fd: int | RangeLoader,
    size: int,
    window: Window,
    rows: Int64Array,
    starts: Int64Array,
    writer: ShardWriter,
) -> bool | None:
    """Copy a dense batch of rows (``starts`` in the file, going to rows ``rows`` of ``writer``) from one
    window of the file in one native pass that takes each row's place and length from the shard's
    offsets, checks it and copies it: whether every row was a sample (False: the first that is not
    stops the copy); None where the batch is not dense, or a row's bytes run past what was read
    (a line longer than ``_TAIL`` among its last): the caller copies it the general way.
    """
    if not starts.size:
        return True
    lo, top = int(starts.min()), int(starts.max())
    if top - lo > _WINDOW or not dense(starts.size, lo, top + 1):
        return None
    first, stop = (0 if lo == len(BOM) else max(lo - 1, 0)), min(top + _TAIL, size)
    # Exactly the bytes read (no padding): a row whose checks need a byte past them is refused, not misread.
    held = window.span(fd, first, stop)
    if held is None:
        return None
    buf, shift = held
    bom = first == 0 and size >= len(BOM) and buf[: len(BOM)].tobytes() == BOM
    try:
        return native.gather_lines(buf, shift, starts, rows, writer.bounds, writer.data, size, bom) < 0
    except ValueError:  # bytes past the window (a long line), or a row outside the shard
        return None


def _spans_of(
    visit: FileRows, indices: Int64Array, part: tuple[int, int] = (0, 1), only: Sequence[int] | None = None
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


def _copy_file_rows(
    fd: int | RangeLoader,
    size: int,
    window: Window,
    first: Int64Array,
    lengths: Int64Array,
    dst: IntegerArray,
    data: UInt8Array,
) -> bool:
    """Copy rows of one file (``lengths`` bytes at ``first``, in about file order) to ``dst`` in
    ``data``; False, before copying a batch, if one of its rows is not a line of the file.

    Rows go in batches that each span about ``_WINDOW`` bytes of the file (rows are in file order up
    to a little jitter), each read once into ``window``, checked there and copied from it.
    """
    for a, b in _batches(first, lengths, _WINDOW, _visits.BATCH_ROWS):
        s, e = first[a:b], first[a:b] + lengths[a:b]
        buf, shift = window.load(fd, check_from(s), e + 2, size, pad=8)
        if not window_ok(buf, shift, s, e, size)[0]:
            return False
        native.copy_rows(buf, s - shift, lengths[a:b], data, dst[a:b])
    return True

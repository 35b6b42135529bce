"""A Parquet file's part of a gather: its rows read by row group in both passes (its index holds no
lengths: the first pass decodes the row groups that hold its rows for theirs, and keeps what it can
for the second)."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import numpy as np

from rank_dataset.core import native
from rank_dataset.core.arrays import Int64Array, UInt8Array
from rank_dataset.core.shard import ShardWriter
from rank_dataset.core.threads import in_threads
from rank_dataset.errors import MetaFileChangedError
from rank_dataset.files.read._visits import FileRows, threads_for

__all__ = ["ParquetKept", "parquet_copy", "parquet_lengths"]


def _parquet_groups(visit: FileRows, indices: Int64Array) -> tuple[Int64Array, Int64Array, list[tuple[int, int, int]]]:
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
class ParquetKept:
    """The rows of each row group the first pass decoded, packed back to back (row group -> bytes),
    while they total at most ``_PARQUET_KEPT`` bytes."""

    rows: dict[int, UInt8Array]
    lock: threading.Lock
    nbytes: int = 0

    def keep(self, g: int, data: UInt8Array, src: Int64Array, lengths: Int64Array) -> None:
        total = int(lengths.sum())
        with self.lock:
            if self.nbytes + total > _PARQUET_KEPT:
                return
            self.nbytes += total
        packed = np.empty(total, np.uint8)
        native.pack_rows(data, src, lengths, packed, np.empty(lengths.size + 1, np.int64))
        self.rows[g] = packed


def parquet_lengths(visit: FileRows, indices: Int64Array, out: np.ndarray) -> ParquetKept:
    """Set ``out[row]`` to the length of each row of a Parquet file's ``visit``: its row groups
    decoded (those that hold its rows; in threads, each with a reader of its own). What it kept of
    the rows for the second pass."""
    rows, local, groups = _parquet_groups(visit, indices)
    kept = ParquetKept({}, threading.Lock())

    def work(part: tuple[int, int]) -> None:
        t, k = part
        with visit.file.bytes.rows(visit.file.index) as reader:
            for g, a, b in groups[t::k]:
                data, offsets = reader.group_array(g, local[a:b])
                src, lengths = offsets[:-1], np.diff(offsets)
                out[rows[a:b]] = lengths
                kept.keep(g, data, src, lengths)

    in_threads(work, min(threads_for(visit), max(len(groups), 1)))
    return kept


def parquet_copy(visit: FileRows, indices: Int64Array, writer: ShardWriter, kept: ParquetKept) -> None:
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
                    native.copy_rows(packed, np.cumsum(lengths) - lengths, lengths, writer.data, dst)
                    continue
                if reader is None:
                    reader = stack.enter_context(visit.file.bytes.rows(visit.file.index))
                data, offsets = reader.group_array(g, local[a:b])
                src, lengths = offsets[:-1], np.diff(offsets)
                if not np.array_equal(writer.bounds[rows[a:b] + 1] - dst, lengths):
                    raise MetaFileChangedError(visit.file.path, f"its row group {g} changed while it was read")
                native.copy_rows(data, src, lengths, writer.data, dst)

    in_threads(work, min(threads_for(visit), max(len(groups), 1)))

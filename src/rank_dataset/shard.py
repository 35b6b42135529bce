"""Shard: a rank's lines in compact form, one bytes buffer and two offset arrays.

Line ``i`` of a shard is ``data[starts[i]:ends[i]]``. Three numpy arrays instead of ``R`` Python
strings: forked DataLoader workers share their pages (nothing in them carries a refcount), and a
worker started with spawn or forkserver receives a handle to shared memory, not a pickled copy.
"""

from __future__ import annotations

import itertools
import mmap
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset import _shm
from rank_dataset._malloc import return_freed_memory
from rank_dataset.index import MetaFile, drop_pages

__all__ = ["Shard"]

# Lines are copied in batches of about this many bytes, after each of which the file pages they
# came from are dropped from this process's resident set.
_WINDOW = 16 << 20
_MAX_WIDTH = 4096
_INDEX_STEP = 1 << 18  # index entries gathered at a time, their pages dropped after

_IntArray = npt.NDArray[np.integer[Any]]


def _offset_dtype(total: int) -> np.dtype[Any]:
    return np.dtype(np.uint32) if total < 1 << 32 else np.dtype(np.int64)


class Shard:
    """Lines held as one ``uint8`` buffer plus per-line ``starts`` and ``ends`` offsets into it.

    Args:
        data: the bytes of the lines (uint8 array, or any bytes-like object).
        starts: where line ``i`` starts in ``data``.
        ends: where line ``i`` ends in ``data`` (exclusive).
        ids: optionally, the sample number of each line (int64), kept with the lines.
        source: describes where the lines came from, for error messages.

    Example:
        >>> s = Shard.from_lines([b"a 1", b"bb 2"])
        >>> len(s), s.text(1)
        (2, 'bb 2')
    """

    def __init__(
        self,
        data: Any,
        starts: _IntArray,
        ends: _IntArray,
        *,
        ids: npt.NDArray[np.int64] | None = None,
        source: str = "shard",
    ) -> None:
        data = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data
        if data.dtype != np.uint8 or data.ndim != 1:
            raise TypeError(f"data must be a 1-D uint8 array, got {data.dtype} with shape {data.shape}")
        starts, ends = np.asarray(starts), np.asarray(ends)
        if starts.shape != ends.shape or starts.ndim != 1:
            raise ValueError(f"starts and ends must be 1-D of one length, got {starts.shape} and {ends.shape}")
        if starts.size and (int(starts.min()) < 0 or int(ends.max()) > data.size or bool((ends < starts).any())):
            raise ValueError(f"offsets out of range for {data.size} bytes of data")
        if ids is not None and np.shape(ids) != starts.shape:
            raise ValueError(f"ids must have one entry per line, got shape {np.shape(ids)} for {starts.size} lines")
        self.source = source
        self._set(data, starts, ends, None if ids is None else np.asarray(ids, np.int64))
        self._handle: _shm.Handle | None = None

    def _set(
        self, data: npt.NDArray[np.uint8], starts: _IntArray, ends: _IntArray, ids: npt.NDArray[np.int64] | None
    ) -> None:
        for a in (data, starts, ends, ids):
            if a is not None:
                a.flags.writeable = False
        self.data, self.starts, self.ends, self.ids = data, starts, ends, ids
        # memoryview indexing returns plain ints and bytes slices, far cheaper than numpy scalars.
        # Item access slices a bytes or mmap object (which yields bytes, cheap to decode) at plain
        # ints from memoryviews: several times faster than numpy indexing, and nothing is copied
        # up front. Data in any other buffer is copied once into bytes.
        root: Any = data
        while True:  # the object that owns the memory, under numpy views and memoryviews
            if isinstance(root, np.ndarray) and root.base is not None:
                root = root.base
            elif isinstance(root, memoryview):
                root = root.obj
            else:
                break
        if isinstance(root, (bytes, mmap.mmap)) and data.size:
            self._raw: bytes | mmap.mmap = root
            self._offset = data.ctypes.data - np.frombuffer(root, np.uint8).ctypes.data
        else:
            self._raw, self._offset = data.tobytes(), 0
        self._mv_starts = starts.data
        self._mv_ends = ends.data

    @classmethod
    def from_lines(
        cls, lines: Sequence[bytes], *, ids: npt.NDArray[np.int64] | None = None, source: str = "shard"
    ) -> Shard:
        """A shard holding ``lines`` (bytes without line endings), in order."""
        lengths = np.fromiter((len(x) for x in lines), np.int64, len(lines))
        ends = np.cumsum(lengths)
        dtype = _offset_dtype(int(ends[-1]) if ends.size else 0)
        starts = (ends - lengths).astype(dtype)
        data = np.frombuffer(b"".join(lines), np.uint8)
        return cls(data, starts, ends.astype(dtype), ids=ids, source=source)

    @classmethod
    def from_meta(cls, meta: MetaFile, indices: npt.NDArray[np.int64]) -> Shard:
        """Read the samples ``indices`` of ``meta`` (in that order) into a new shard.

        Reads the index entries and the lines of these samples only, in file order.

        Raises:
            ValueError: a line is not valid UTF-8 (the message names its file and line).
        """
        indices = np.asarray(indices, np.int64)
        data, starts, ends = _gather(meta, indices)
        return_freed_memory()
        return cls(data, starts, ends, ids=indices, source=", ".join(str(p) for p in meta.paths))

    def __len__(self) -> int:
        return len(self._mv_starts)

    @property
    def nbytes(self) -> int:
        """Bytes held: the lines and the offsets."""
        return sum(int(a.nbytes) for a in (self.data, self.starts, self.ends, self.ids) if a is not None)

    def raw(self, i: int) -> bytes:
        """Line ``i`` as bytes."""
        return self._raw[self._offset + self._mv_starts[i] : self._offset + self._mv_ends[i]]

    def text(self, i: int) -> str:
        """Line ``i`` as str (the shard was checked to be UTF-8 when it was built)."""
        return self._raw[self._offset + self._mv_starts[i] : self._offset + self._mv_ends[i]].decode()

    def texts(self, indices: Sequence[int]) -> list[str]:
        """Lines ``indices`` as a list of str."""
        raw, off, starts, ends = self._raw, self._offset, self._mv_starts, self._mv_ends
        return [raw[off + starts[i] : off + ends[i]].decode() for i in indices]

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled only to reach a spawn or forkserver worker: move the arrays to shared memory
        # once, keep using the shared copy here too, and send the worker a handle to it.
        if self._handle is None:
            arrays = [self.data, self.starts, self.ends] + ([self.ids] if self.ids is not None else [])
            handle, views = _shm.share(self, arrays)
            self._set(views[0], views[1], views[2], views[3] if len(views) > 3 else None)
            self._handle = handle
        return (_attach, (self._handle, self.source))


def _attach(handle: _shm.Handle, source: str) -> Shard:
    arrays = _shm.attach(handle)
    shard = Shard.__new__(Shard)
    shard.source = source
    shard._set(arrays[0], arrays[1], arrays[2], arrays[3] if len(arrays) > 3 else None)
    shard._handle = handle
    return shard


def _gather(
    meta: MetaFile, indices: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.integer[Any]], npt.NDArray[np.integer[Any]]]:
    """The bytes of samples ``indices`` and the offsets of each in them, ``indices``' order kept.

    Lines are copied as fixed-width rows (their length rounded up to a multiple of 8, the tail being
    whatever follows the line in the file), one numpy gather per block of rows, so a shard costs at
    most 7 bytes a line more than its text. Rows are visited in file order at the granularity of
    1/4096 of the samples: a cheap radix sort instead of a full one.
    """
    if not indices.size:
        return np.empty(0, np.uint8), np.empty(0, np.uint32), np.empty(0, np.uint32)
    n_total = len(meta)
    shift = max(0, (n_total - 1).bit_length() - 12)
    order = np.argsort((indices >> shift).astype(np.uint16), kind="stable")
    sorted_idx = indices[order]
    first = np.empty(indices.size, np.int64)  # where each row starts in its file, in visiting order
    lengths = np.empty(indices.size, np.int64)
    bounds = meta.file_bounds
    files = np.searchsorted(bounds, sorted_idx, side="right") - 1 if len(bounds) > 2 else None
    for f in range(len(bounds) - 1):
        rows = np.flatnonzero(files == f) if files is not None else np.arange(indices.size)
        # np.take of whole rows is several times faster than fancy indexing the 2-D index.
        spans = np.asarray(meta.file_spans(f))
        for lo in range(0, rows.size, _INDEX_STEP):
            part = rows[lo : lo + _INDEX_STEP]
            local = sorted_idx[part] - bounds[f]
            got = np.take(spans, local, axis=0)
            first[part] = got[:, 0]
            lengths[part] = got[:, 1] - got[:, 0]
            meta.release_index_pages(f, int(local.min()), int(local.max()) + 1)
    del sorted_idx
    code = ((np.maximum(lengths, 1) + 7) >> 3).astype(np.uint16)  # the row width in units of 8 bytes
    code[lengths > _MAX_WIDTH] = 0  # long rows: copied one by one, at their exact length
    # Lay rows out by (file, width), keeping the visiting order within each group, so that every
    # group is one contiguous run of fixed-width records in data.
    key = code if files is None else (files.astype(np.uint32) << 16) | code
    layout = np.argsort(key, kind="stable")
    laid_width = code[layout].astype(np.int64) << 3
    exact = laid_width == 0
    laid_width[exact] = lengths[layout[exact]]
    total = int(laid_width.sum())
    # An anonymous shared map, not the heap: forked workers share it outright, it is returned to
    # the OS whole when the shard goes, and slicing it yields bytes quickly.
    data = np.frombuffer(mmap.mmap(-1, max(total, 1)), np.uint8, count=total)
    row_starts = np.empty(indices.size, np.int64)
    row_starts[layout] = np.cumsum(laid_width) - laid_width
    del laid_width, exact
    dtype = _offset_dtype(total)
    starts = np.empty(indices.size, dtype)
    starts[order] = row_starts
    ends = starts.copy()
    ends[order] += lengths.astype(dtype)
    del order
    laid_key = key[layout]
    # An ASCII file needs no UTF-8 check; otherwise row tails are zeroed so that whole runs of
    # rows can be decoded at once, a NUL ending every line that is shorter than its row.
    check = not all(meta.file_is_ascii(f) for f in range(len(bounds) - 1))
    for group in np.split(layout, np.flatnonzero(laid_key[1:] != laid_key[:-1]) + 1):
        f = int(files[group[0]]) if files is not None else 0
        w = int(code[group[0]]) << 3
        _copy_rows(meta.file_map(f), first, lengths, group, w, data, row_starts, zero_tails=check)
    for f in range(len(bounds) - 1):
        meta.release_pages(f)
    if check:
        _check_utf8(meta, indices, data, starts, ends)
    return data, starts, ends


def _copy_rows(
    mm: mmap.mmap,
    first: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    width: int,
    data: npt.NDArray[np.uint8],
    row_starts: npt.NDArray[np.int64],
    *,
    zero_tails: bool,
) -> None:
    """Copy ``rows`` of one file into ``data`` at ``row_starts``, ``width`` bytes each (0: exact).

    Rows go in batches that each span at most about ``_WINDOW`` bytes of the file (rows are in file
    order up to a little jitter), and each batch's file pages are dropped from the resident set
    after it, so the build never holds much of the file.
    """
    fbytes = np.frombuffer(mm, np.uint8)
    starts_in_file = first[rows]
    # Windows of the file a row could start at: a byte view with a stride of one byte, whose
    # elements are ``width``-byte records, so that one fancy index copies whole rows.
    windows = None
    if 0 < width <= fbytes.size:
        windows = np.ndarray((fbytes.size - width + 1,), dtype=f"V{width}", buffer=mm, strides=(1,))
    region = np.maximum.accumulate(starts_in_file) // _WINDOW
    cuts = np.flatnonzero(region[1:] != region[:-1]) + 1
    max_rows = max(1, _WINDOW // max(width, 1))
    if cuts.size == 0 or np.diff(cuts, prepend=0, append=rows.size).max() > max_rows:
        cuts = np.union1d(cuts, np.arange(max_rows, rows.size, max_rows))
    for batch in np.split(np.arange(rows.size), cuts):
        if not batch.size:
            continue
        b_first, b_rows = starts_in_file[batch], rows[batch]
        dst = row_starts[b_rows]
        fits = windows is not None and int(b_first.max()) <= fbytes.size - width
        if fits and int(dst[-1] - dst[0]) == width * (b_rows.size - 1):
            # Rows of one width land back to back: one copy for the batch.
            out = data[dst[0] : dst[0] + width * b_rows.size]
            out[:] = windows[b_first].view(np.uint8)  # type: ignore[index]
            if zero_tails:
                block = out.reshape(b_rows.size, width)
                block[np.arange(width) >= lengths[b_rows][:, None]] = 0
        else:  # rows with no full window left before the end of the file, or of no fixed width
            for s, n, o in zip(b_first.tolist(), lengths[b_rows].tolist(), dst.tolist()):
                data[o : o + n] = fbytes[s : s + n]
                data[o + n : o + width] = 0
        drop_pages(mm, int(b_first.min()), int(b_first.max()) + max(width, int(lengths[b_rows].max()), 1))


def _check_utf8(
    meta: MetaFile,
    indices: npt.NDArray[np.int64],
    data: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.integer[Any]],
    ends: npt.NDArray[np.integer[Any]],
) -> None:
    """Raise ValueError naming file and line of a sample that is not valid UTF-8.

    ``data`` holds the lines, each followed by zero bytes up to the start of the next one.
    """

    def fail(row: int) -> None:
        try:
            data[starts[row] : ends[row]].tobytes().decode("utf-8")
            reason = "invalid byte sequence"  # pragma: no cover - callers pass an invalid row
        except UnicodeDecodeError as exc:
            reason = f"{exc.reason} at byte {exc.start}"
        raise ValueError(f"{meta.where(int(indices[row]))}: line is not valid UTF-8 ({reason})")

    nonempty = np.flatnonzero(ends > starts)
    first = data[starts[nonempty]]
    # A line that starts with a continuation byte is invalid on its own; with none such, a
    # sequence cut at a line boundary cannot pass as valid, so whole runs of lines can be decoded.
    bad = nonempty[(first >= 0x80) & (first < 0xC0)]
    if bad.size:
        fail(int(bad[0]))
    layout = np.sort(starts[nonempty])
    cuts = [*layout[:: 1 << 16].tolist(), data.size]
    view = data.data
    for a, b in itertools.pairwise(cuts):
        try:
            str(view[a:b], "utf-8")
        except UnicodeDecodeError as exc:
            pos = a + exc.start
            fail(int(np.flatnonzero((starts <= pos) & (ends > pos))[0]))

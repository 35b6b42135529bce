"""Shard: a rank's lines in compact form, their bytes back to back in item order and ``n + 1`` offsets.

Line ``i`` of a shard is ``data[bounds[i]:bounds[i + 1]]``: a shard costs its lines' bytes plus 4
bytes a line (8 once its text passes 4 GiB), and no Python object per line, so forked DataLoader
workers share its pages (nothing in them carries a refcount). Sample numbers are kept only when asked
for (``ids``); a dataset recomputes them from its plan instead.

A shard built by :meth:`MetaFile.read <rank_dataset.files.read.metafile.MetaFile.read>` (or made shareable with
:meth:`Shard.shared`) lives in one shareable segment (:mod:`rank_dataset.core.shm`): a 64-byte header,
the offsets, the ids if any, then the lines. Pickling such a shard sends a handle to that segment,
never the data, and unpickling maps the same pages, in any process of the same user.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from rank_dataset.core import native
from rank_dataset.core import shm as _shm
from rank_dataset.core.arrays import Int64Array, IntegerArray, UInt8Array
from rank_dataset.core.residency import anonymous_map, populate_map

__all__ = ["Shard", "ShardWriter", "offset_dtype"]


# magic, offset itemsize, lines, offset of bounds, offset of ids (0: none), offset of data, data bytes
_HEADER = struct.Struct("<4sIQQQQQ")
_MAGIC = b"RDSH"
_ALIGN = 64


def offset_dtype(total: int) -> np.dtype[Any]:
    """The dtype of offsets into ``total`` bytes (``total`` itself included): uint32 where it fits."""
    return np.dtype(np.uint32) if total < 1 << 32 else np.dtype(np.int64)


def _align(x: int) -> int:
    return -(-x // _ALIGN) * _ALIGN


def _checked(data: Any, starts: IntegerArray, ends: IntegerArray) -> tuple[UInt8Array, IntegerArray, IntegerArray]:
    """``data`` as a uint8 array and the offsets as arrays, checked to describe lines within it."""
    data = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data
    if data.dtype != np.uint8 or data.ndim != 1:
        raise TypeError(f"data must be a 1-D uint8 array, got {data.dtype} with shape {data.shape}")
    starts, ends = np.asarray(starts), np.asarray(ends)
    if starts.shape != ends.shape or starts.ndim != 1:
        raise ValueError(f"starts and ends must be 1-D of one length, got {starts.shape} and {ends.shape}")
    if starts.size and (int(starts.min()) < 0 or int(ends.max()) > data.size or bool((ends < starts).any())):
        raise ValueError(f"offsets out of range for {data.size} bytes of data")
    return data, starts, ends


class ShardWriter:
    """A new shard of ``n`` lines and ``nbytes`` bytes of text, in a new shareable segment (with
    ``shared=False``, in this process's private memory: see :meth:`MetaFile.read
    <rank_dataset.files.read.metafile.MetaFile.read>`).

    Fill ``bounds`` (``n + 1`` offsets into ``data``, ascending, ``bounds[n] == nbytes``) and
    ``ids`` if asked for, write the lines into ``data``, then call :meth:`finish`. With ``populate``, its
    pages are faulted in here, at once (for a writer that fills every byte).
    """

    def __init__(self, n: int, nbytes: int, *, ids: bool = False, shared: bool = True, populate: bool = False) -> None:
        dtype = offset_dtype(nbytes)
        bounds_off = _ALIGN
        ids_off = _align(bounds_off + (n + 1) * dtype.itemsize) if ids else 0
        data_off = _align((ids_off + 8 * n) if ids else (bounds_off + (n + 1) * dtype.itemsize))
        # A shared segment's pages are faulted in one 4 KiB page at a time as the lines land; a private
        # map takes huge pages where the system allows them, one fault per 2 MiB.
        self.segment: _shm.Segment | None = _shm.Segment(data_off + nbytes) if shared else None
        self._map = anonymous_map(data_off + nbytes) if self.segment is None else self.segment.map()
        _HEADER.pack_into(self._map, 0, _MAGIC, dtype.itemsize, n, bounds_off, ids_off, data_off, nbytes)
        if populate:  # every page is written once: faulted in at once, not a page a write
            populate_map(self._map, 0, data_off + nbytes)
        self.bounds: IntegerArray = np.frombuffer(self._map, dtype, n + 1, bounds_off)
        self.ids: Int64Array | None = np.frombuffer(self._map, np.int64, n, ids_off) if ids else None
        self.data: UInt8Array = np.frombuffer(self._map, np.uint8, nbytes, data_off)
        self._data_off, self._nbytes = data_off, nbytes

    def find(self, byte: bytes, start: int = 0) -> int:
        """Where ``byte`` first occurs in ``data`` (at or after ``start``), or -1 (a memchr of the map)."""
        at = self._map.find(byte, self._data_off + start, self._data_off + self._nbytes)
        return at - self._data_off if at >= 0 else -1

    def finish(self) -> Shard:
        """The shard written (read-only from now on)."""
        if self.segment is None:  # private: no handle (pickling moves it to a segment first)
            shard = Shard.__new__(Shard)
            shard._set(self.data, self.bounds, self.ids, None, None)
        else:
            shard = Shard._over_map(self._map, self.segment.handle, self.segment)
        del self.bounds, self.ids, self.data
        return shard


class Shard:
    """Lines held as one ``uint8`` buffer plus ``n + 1`` offsets into it, in item order.

    Args:
        data: bytes holding the lines (uint8 array, or any bytes-like object).
        starts: where line ``i`` starts in ``data``.
        ends: where line ``i`` ends in ``data`` (exclusive).
        ids: optionally, the sample number of each line (int64), kept with the lines.

    Lines that already lie back to back in item order (``starts[i + 1] == ends[i]``) are used where
    they are; others are copied into a new buffer in that layout.

    Examples:
        >>> s = Shard(b"bb 2a 1", np.array([4, 0]), np.array([7, 4]))
        >>> len(s), s.text(1), s.bounds.tolist()
        (2, 'bb 2', [0, 3, 7])
    """

    data: UInt8Array
    bounds: IntegerArray
    ids: Int64Array | None

    def __init__(
        self,
        data: Any,
        starts: IntegerArray,
        ends: IntegerArray,
        *,
        ids: Int64Array | None = None,
    ) -> None:
        data, starts, ends = _checked(data, starts, ends)
        if ids is not None and np.shape(ids) != starts.shape:
            raise ValueError(f"ids must have one entry per line, got shape {np.shape(ids)} for {starts.size} lines")
        n = starts.size
        if n and bool((starts[1:] == ends[:-1]).all()):  # already back to back: no copy
            bounds = np.empty(n + 1, offset_dtype(data.size))
            bounds[:-1] = starts
            bounds[-1] = ends[-1]
        else:
            lengths = ends.astype(np.int64) - starts
            total = int(lengths.sum())
            bounds = np.zeros(n + 1, offset_dtype(total))
            # In a map of its own, which item access slices as it is (a heap array it would copy).
            packed: UInt8Array = np.empty(0, np.uint8)
            if total:
                packed = np.frombuffer(anonymous_map(total), np.uint8)
            native.pack_rows(data, starts, lengths, packed, bounds)  # the offsets and the rows, one call
            data = packed
        self._set(data, bounds, None if ids is None else np.array(ids, np.int64), None, None)

    @classmethod
    def shared_from(cls, data: Any, starts: IntegerArray, ends: IntegerArray) -> Shard:
        """A shard of the lines ``data[starts[i]:ends[i]]``, packed straight into a new shareable
        segment, without sample numbers: ``Shard(data, starts, ends).shared()`` with one copy of
        the lines less (what a rank does with a shard it receives).

        Examples:
            >>> s = Shard.shared_from(b"b 1\\na 0", np.array([4, 0]), np.array([7, 3]))
            >>> s.texts([0, 1]), s.handle is not None
            (['a 0', 'b 1'], True)
        """
        data, starts, ends = _checked(data, starts, ends)
        n = starts.size
        if n and bool((starts[1:] == ends[:-1]).all()):  # back to back already: one slice
            first, last = int(starts[0]), int(ends[-1])
            writer = ShardWriter(n, last - first)
            np.subtract(starts, first, out=writer.bounds[:-1], casting="unsafe")
            writer.bounds[-1] = last - first
            writer.data[:] = data[first:last]
            return writer.finish()
        lengths = ends.astype(np.int64) - starts
        writer = ShardWriter(n, int(lengths.sum()))
        native.pack_rows(data, starts, lengths, writer.data, writer.bounds)  # the offsets and the rows, one call
        return writer.finish()

    @classmethod
    def attach(cls, handle: _shm.Handle) -> Shard:
        """The shard in the segment of ``handle``, mapped read-only (see :meth:`shared`).

        Raises:
            rank_dataset.core.shm.SegmentGone: its creator released it.
        """
        return cls._over_map(_shm.attach(handle), handle, None)

    @classmethod
    def _over_map(cls, mm: mmap.mmap, handle: _shm.Handle, segment: _shm.Segment | None) -> Shard:
        magic, itemsize, n, bounds_off, ids_off, data_off, nbytes = _HEADER.unpack_from(mm, 0)
        if magic != _MAGIC:
            raise ValueError(f"not a shard segment: {handle.open_path()}")
        dtype = np.dtype(np.uint32) if itemsize == 4 else np.dtype(np.int64)
        shard = cls.__new__(cls)
        shard._set(
            np.frombuffer(mm, np.uint8, nbytes, data_off),
            np.frombuffer(mm, dtype, n + 1, bounds_off),
            np.frombuffer(mm, np.int64, n, ids_off) if ids_off else None,
            handle,
            segment,
        )
        return shard

    def _set(
        self,
        data: UInt8Array,
        bounds: IntegerArray,
        ids: Int64Array | None,
        handle: _shm.Handle | None,
        segment: _shm.Segment | None,
    ) -> None:
        for a in (data, bounds, ids):
            if a is not None:
                a.flags.writeable = False
        self.data, self.bounds, self.ids = data, bounds, ids
        self.handle = handle  # where the shard lives, if in a shareable segment
        self.segment = segment  # this process's hold on that segment, if it created it
        # Item access slices a bytes or mmap object (which yields bytes, cheap to decode) at plain
        # ints read from a memoryview, not numpy indexing, and nothing is copied up front. Data in
        # any other buffer is copied once into bytes.
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
        self._mv = bounds.data

    def __len__(self) -> int:
        return len(self._mv) - 1

    @property
    def starts(self) -> IntegerArray:
        """Where each line starts in ``data`` (a view of ``bounds``)."""
        return self.bounds[:-1]

    @property
    def ends(self) -> IntegerArray:
        """Where each line ends in ``data`` (a view of ``bounds``)."""
        return self.bounds[1:]

    @property
    def nbytes(self) -> int:
        """Bytes held: the lines, the offsets and the ids if any."""
        return sum(int(a.nbytes) for a in (self.data, self.bounds, self.ids) if a is not None)

    @property
    def text_bytes(self) -> int:
        """The bytes of the lines themselves."""
        return int(self.bounds[-1] - self.bounds[0]) if len(self) else 0

    def text(self, i: int) -> str:
        """Line ``i`` as str (the shard was checked to be UTF-8 when it was built); negative ``i``
        counts from the end. The one expression every item access goes through."""
        b, off = self._mv, self._offset
        try:
            if i >= 0:
                return self._raw[off + b[i] : off + b[i + 1]].decode()
        except IndexError:
            pass
        return self._wrapped(i)

    def _wrapped(self, i: int) -> str:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"line {i} is out of range for a shard of {n} lines")
        return self.text(int(i) % n)

    def texts(self, indices: Sequence[int]) -> list[str]:
        """Lines ``indices`` as a list of str."""
        raw, off, b = self._raw, self._offset, self._mv
        try:
            if all(i >= 0 for i in indices):
                return [raw[off + b[i] : off + b[i + 1]].decode() for i in indices]
        except IndexError:
            pass
        return [self._wrapped(i) for i in indices]

    def without_ids(self) -> Shard:
        """The same lines (the same memory) without the sample numbers."""
        shard = Shard.__new__(Shard)
        shard.__dict__.update(self.__dict__)
        shard.ids = None
        return shard

    def rows(self, start: int, stop: int) -> Shard:
        """Lines ``[start, stop)`` as a shard over the same bytes: offsets from 0 (of the dtype a shard
        of just these lines has), the ids (if any) a view. Not in a segment of its own.

        Raises:
            IndexError: not ``0 <= start <= stop <= len(self)``.

        Examples:
            >>> s = Shard(b"abbccc", np.array([0, 1, 3]), np.array([1, 3, 6])).rows(1, 3)
            >>> s.texts([0, 1]), s.bounds.tolist()
            (['bb', 'ccc'], [0, 2, 5])
        """
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"rows [{start}, {stop}) are not within a shard of {len(self)} lines")
        lo, hi = int(self.bounds[start]), int(self.bounds[stop])
        bounds = (self.bounds[start : stop + 1] - np.array(lo, self.bounds.dtype)).astype(offset_dtype(hi - lo))
        ids = None if self.ids is None else self.ids[start:stop]
        shard = Shard.__new__(Shard)
        shard._set(self.data[lo:hi], bounds, ids, None, None)
        return shard

    def shared(self) -> Shard:
        """This shard if it lives in a shareable segment, else a copy of it in a new one."""
        if self.handle is not None:
            return self
        writer = ShardWriter(len(self), self.text_bytes, ids=self.ids is not None)
        writer.bounds[:] = self.bounds - self.bounds[0]
        writer.data[:] = self.data[int(self.bounds[0]) : int(self.bounds[-1])]
        if writer.ids is not None and self.ids is not None:
            writer.ids[:] = self.ids
        return writer.finish()

    def release(self) -> None:
        """Give up this process's hold on the segment (if it created it): the memory lives on only
        while some process maps it. The shard itself stays readable here."""
        if self.segment is not None:
            self.segment.close()

    def __reduce__(self) -> tuple[Any, ...]:
        # A handle to the segment, never the data: move to a segment first if need be, and keep
        # using the shared copy here too (so the bytes are not held twice).
        if self.handle is None:
            self.__dict__.update(self.shared().__dict__)
        return (Shard.attach, (self.handle,))

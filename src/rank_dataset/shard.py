"""Shard: a rank's lines in compact form, one bytes buffer and two offset arrays.

Line ``i`` of a shard is ``data[starts[i]:ends[i]]``. Three numpy arrays instead of ``R`` Python
strings: forked DataLoader workers share their pages (nothing in them carries a refcount), and a
worker started with spawn or forkserver receives a handle to shared memory, not a pickled copy.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rank_dataset import _shm

__all__ = ["Shard", "new_buffer", "offset_dtype"]

_IntArray = npt.NDArray[np.integer[Any]]


def offset_dtype(total: int) -> np.dtype[Any]:
    """The dtype of offsets into ``total`` bytes: uint32 where it fits."""
    return np.dtype(np.uint32) if total < 1 << 32 else np.dtype(np.int64)


def new_buffer(nbytes: int) -> npt.NDArray[np.uint8]:
    """A writable buffer for a shard's bytes.

    An anonymous shared map, not the heap: forked workers share it outright, it is returned to the
    OS whole when the shard goes, and slicing it yields bytes quickly.
    """
    return np.frombuffer(mmap.mmap(-1, max(nbytes, 1)), np.uint8, count=nbytes)


class Shard:
    """Lines held as one ``uint8`` buffer plus per-line ``starts`` and ``ends`` offsets into it.

    Args:
        data: the bytes of the lines (uint8 array, or any bytes-like object).
        starts: where line ``i`` starts in ``data``.
        ends: where line ``i`` ends in ``data`` (exclusive).
        ids: optionally, the sample number of each line (int64), kept with the lines.

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
    def from_lines(cls, lines: Sequence[bytes], *, ids: npt.NDArray[np.int64] | None = None) -> Shard:
        """A shard holding ``lines`` (bytes without line endings), in order."""
        lengths = np.fromiter((len(x) for x in lines), np.int64, len(lines))
        ends = np.cumsum(lengths)
        dtype = offset_dtype(int(ends[-1]) if ends.size else 0)
        starts = (ends - lengths).astype(dtype)
        data = np.frombuffer(b"".join(lines), np.uint8)
        return cls(data, starts, ends.astype(dtype), ids=ids)

    def __len__(self) -> int:
        return len(self._mv_starts)

    @property
    def nbytes(self) -> int:
        """Bytes held: the lines and the offsets."""
        return sum(int(a.nbytes) for a in (self.data, self.starts, self.ends, self.ids) if a is not None)

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
        return (_attach, (self._handle,))


def _attach(handle: _shm.Handle) -> Shard:
    arrays = _shm.attach(handle)
    shard = Shard.__new__(Shard)
    shard._set(arrays[0], arrays[1], arrays[2], arrays[3] if len(arrays) > 3 else None)
    shard._handle = handle
    return shard

"""Positional reads of a file into a reusable buffer, page-granular.

Reading a file through a shared map kills the process with SIGBUS when the file shrinks under the
map; a positional read returns short instead, which the caller turns into an error. The buffer is
reused from one window of the file to the next, and where the wanted ranges are sparse only they are
read, so a sparse shard (one line in a hundred) does not copy the whole file.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading
from collections.abc import Callable
from typing import Protocol

import numpy as np

from rank_dataset.core.arrays import Int64Array, UInt8Array
from rank_dataset.core.residency import anonymous_map

__all__ = ["RangeLoader", "ShortRead", "Window", "dense", "pread_exact"]

_PAGE = mmap.PAGESIZE
GAP = 2 * _PAGE  # bytes between two wanted ranges that are read rather than skipped
_SMALL = 1 << 20  # window buffers up to this size are heap arrays (a map costs syscalls and faults)...
_ROOM = 1 << 20  # a window's map is a whole number of these, with an eighth to spare
_MAIN = threading.main_thread()  # ...in the main thread only: see _small


def dense(count: int, lo: int, hi: int) -> bool:
    """Whether ``count`` ranges within bytes ``[lo, hi)`` lie two a page on average: every page is
    needed, so the bytes from the first to the last are taken whole."""
    return count * _PAGE >= 2 * (hi - lo)


def _small() -> int:
    """The largest buffer a window of this thread takes from the heap: ``_SMALL`` in the main thread,
    none in another. glibc serves another thread from an arena of its own and keeps that arena's top
    resident for good (``malloc_trim`` leaves it alone), so a build thread's buffers would stay in the
    process's memory, and in every DataLoader worker forked from it; a map is unmapped whole."""
    return _SMALL if threading.current_thread() is _MAIN else 0


class ShortRead(OSError):
    """The file ended before ``offset``: it is shorter than the caller expected."""

    def __init__(self, offset: int) -> None:
        super().__init__(f"the file ends before byte {offset}")
        self.offset = offset


def pread_exact(fd: int, out: UInt8Array, offset: int) -> None:
    """Fill ``out`` from ``fd`` at ``offset``, else raise ShortRead."""
    view = out.data
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            raise ShortRead(offset + done)
        done += got


class RangeLoader(Protocol):
    """Bytes read otherwise than from a descriptor (a compressed file's decompressed bytes): what
    :meth:`Window.load` hands its reads to."""

    def load(
        self,
        starts: Int64Array,
        stops: Int64Array,
        end: int,
        pad: int = 0,
        buffer: Callable[[int], UInt8Array] | None = None,
    ) -> tuple[UInt8Array, int | Int64Array]: ...


class Window:
    """A reusable buffer holding the parts of a file that a batch of byte ranges needs."""

    def __init__(self) -> None:
        self._buf: UInt8Array = np.empty(0, np.uint8)

    def _buffer(self, size: int) -> UInt8Array:
        if self._buf.size < size:
            if size > _small():
                # Large: a private anonymous map, not the heap: unmapped whole when the window goes, so a
                # build leaves no freed-but-resident heap pages behind for forked DataLoader workers to
                # share. With room to grow (a build's windows differ by a few percent: without it, a map
                # a few batches, each faulted in afresh), in huge pages where the system allows them.
                room = -(-(size + size // 8) // _ROOM) * _ROOM
                self._buf = np.frombuffer(anonymous_map(room), np.uint8)
            else:
                self._buf = np.empty(size, np.uint8)
        return self._buf[:size]

    def span(self, fd: int | RangeLoader, lo: int, hi: int) -> tuple[UInt8Array, int] | None:
        """Bytes ``[lo, hi)`` of ``fd`` (``hi`` within the file), read whole in one call: ``(buf, lo)``,
        byte ``x`` at ``buf[x - lo]``, ``buf`` exactly ``hi - lo`` bytes; None where a
        :class:`RangeLoader` holds them otherwise than in one piece.

        Raises:
            ShortRead: the file ends before ``hi``.
        """
        if not isinstance(fd, int):
            buf, shift = fd.load(np.array([lo], np.int64), np.array([hi], np.int64), hi, 0, self._buffer)
            at = shift if isinstance(shift, int) else int(shift[0]) if shift.size == 1 else None
            return None if at is None or lo - at < 0 or buf.size < hi - at else (buf[lo - at : hi - at], lo)
        buf = self._buffer(max(hi - lo, 0))
        pread_exact(fd, buf, lo)
        return buf, lo

    def load(
        self,
        fd: int | RangeLoader,
        starts: Int64Array,
        stops: Int64Array,
        end: int,
        pad: int = 0,
    ) -> tuple[UInt8Array, int | Int64Array]:
        """Read the ranges ``[starts[i], stops[i])`` (cut at ``end``, the file size expected) of ``fd``
        (a :class:`RangeLoader` reads them itself).

        Returns ``(buf, shift)``: byte ``x`` of the file is ``buf[x - shift[i]]`` for every ``x`` in
        range ``i`` (``shift`` an int where one shift serves every range); other bytes of ``buf``
        are unspecified. ``buf`` has ``pad`` bytes more than the ranges need, so that fixed-width
        records starting in a range never run past it. Where the ranges are dense (two a page on
        average), the span from the first to the last is read in one call; where they are sparse,
        only the ranges, those less than ``GAP`` apart in one call with the bytes between them,
        back to back (so the buffer holds what the ranges need, however far apart they are).

        Raises:
            ShortRead: the file ends before ``end``.
        """
        if not isinstance(fd, int):
            return fd.load(starts, stops, end, pad, self._buffer)
        lo = int(starts.min())
        hi = min(int(stops.max()), end)
        if hi <= lo:
            return self._buffer(pad), lo
        if dense(starts.size, lo, hi):
            buf = self._buffer(hi - lo + pad)
            pread_exact(fd, buf[: hi - lo], lo)
            return buf, lo
        n = starts.size
        # Sparse: the ranges alone, merged into runs where they overlap or lie close (a call costs
        # about what copying a few KiB does), read back to back into a buffer of what they need.
        # (Few numpy calls, and no sort where the ranges come in order: a small read's rows do.)
        ordered = n < 2 or bool((starts[1:] >= starts[:-1]).all())
        order = None if ordered else starts.argsort(kind="stable")
        first = np.minimum(starts if order is None else starts[order], hi)
        top = np.maximum(stops if order is None else stops[order], first)
        np.minimum(top, hi, out=top)
        np.maximum.accumulate(top, out=top)
        opens = np.empty(n, np.bool_)  # where each run opens: its first range
        opens[0] = True
        np.greater(first[1:], top[:-1] + GAP, out=opens[1:])
        closes = np.empty(n, np.bool_)  # and its last
        closes[:-1] = opens[1:]
        closes[-1] = True
        run_starts, run_stops = first[opens], top[closes]
        at = np.zeros(run_starts.size + 1, np.int64)  # where each run goes in the buffer
        np.cumsum(run_stops - run_starts, out=at[1:])
        if at[-1] <= _small():
            buf = _read_runs(fd, run_starts, run_stops, int(at[-1]), pad)
        else:
            buf = self._buffer(int(at[-1]) + pad)
            view = buf.data
            for a, b, to in zip(run_starts.tolist(), run_stops.tolist(), at.tolist()):
                if os.preadv(fd, [view[to : to + b - a]], a) != b - a:
                    pread_exact(fd, buf[to : to + b - a], a)  # finish a short read, or raise
        run_of = opens.cumsum()
        run_of -= 1
        moved = (run_starts - at[:-1])[run_of]  # in order
        if order is None:
            return buf, moved
        shift = np.empty(n, np.int64)
        shift[order] = moved
        return buf, shift


def _read_runs(fd: int, starts: Int64Array, stops: Int64Array, total: int, pad: int) -> UInt8Array:
    """Bytes ``[starts[i], stops[i])`` of ``fd`` (``total`` in all) back to back, and ``pad`` zero
    bytes (read-only).

    One ``pread`` a run, each returning a new ``bytes``, joined once: for many small runs, half the
    cost of reading each into a slice of one buffer.

    Raises:
        ShortRead: the file ends before a run does.
    """
    want, at = (stops - starts).tolist(), starts.tolist()
    parts = list(map(os.pread, itertools.repeat(fd, len(want)), want, at))
    parts.append(bytes(pad))
    joined = b"".join(parts)
    if len(joined) != total + pad:
        for i, (part, n, offset) in enumerate(zip(parts, want, at)):
            if len(part) != n:  # finish a short read, or raise
                rest = np.empty(n - len(part), np.uint8)
                pread_exact(fd, rest, offset + len(part))
                parts[i] = part + rest.tobytes()
        joined = b"".join(parts)
    return np.frombuffer(joined, np.uint8)

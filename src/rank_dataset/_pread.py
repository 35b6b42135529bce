"""Positional reads of a file into a reusable buffer, page-granular, and newline counting. No torch.

Reading a file through a shared map kills the process with SIGBUS when the file shrinks under the
map; a positional read returns short instead, which the caller turns into an error. The buffer is
reused from one window of the file to the next, and only the pages that some wanted range touches
are read, so a sparse shard (one line in a hundred) does not copy the whole file.
"""

from __future__ import annotations

import mmap
import os

import numpy as np
import numpy.typing as npt

__all__ = ["ShortRead", "Window", "count_newlines", "pread_exact", "read_ends"]

_PAGE = mmap.PAGESIZE
_GAP = 2  # pages between two wanted ranges that are read rather than skipped
_COUNT_CHUNK = 16 << 20


class ShortRead(OSError):
    """The file ended before ``offset``: it is shorter than the caller expected."""

    def __init__(self, offset: int) -> None:
        super().__init__(f"the file ends before byte {offset}")
        self.offset = offset


def pread_exact(fd: int, out: npt.NDArray[np.uint8], offset: int) -> None:
    """Fill ``out`` from ``fd`` at ``offset``, else raise ShortRead."""
    view = out.data
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            raise ShortRead(offset + done)
        done += got


def read_ends(fd: int, size: int, n: int) -> bytes:
    """The first ``n`` bytes and the last ``n`` bytes of a file of ``size`` bytes (all of it, twice,
    if it is shorter): what identifies a file cheaply, with its size."""
    head = np.empty(min(size, n), np.uint8)
    tail = np.empty_like(head)
    pread_exact(fd, head, 0)
    pread_exact(fd, tail, size - tail.size)
    return head.tobytes() + tail.tobytes()


class Window:
    """A reusable buffer holding the parts of a file that a batch of byte ranges needs."""

    def __init__(self) -> None:
        self._buf = np.empty(0, np.uint8)

    def load(
        self, fd: int, starts: npt.NDArray[np.int64], stops: npt.NDArray[np.int64], end: int, pad: int = 0
    ) -> tuple[npt.NDArray[np.uint8], int]:
        """Read the ranges ``[starts[i], stops[i])`` (cut at ``end``, the file size expected) of ``fd``.

        Returns ``(buf, lo)``: byte ``x`` of the file is ``buf[x - lo]`` for every ``x`` in a range;
        other bytes of ``buf`` are unspecified. ``buf`` has ``pad`` bytes more than the ranges need, so
        that fixed-width records starting in a range never run past it. Every page that a range
        touches is read whole, adjacent pages in one call.

        Raises:
            ShortRead: the file ends before ``end``.
        """
        lo = int(starts.min())
        hi = min(int(stops.max()), end)
        if self._buf.size < hi - lo + pad:
            # An anonymous map, not the heap: unmapped whole when the window goes, so a build leaves no
            # freed-but-resident heap pages behind for forked DataLoader workers to share.
            self._buf = np.frombuffer(mmap.mmap(-1, hi - lo + pad), np.uint8)
        buf = self._buf[: hi - lo + pad]
        if hi <= lo:
            return buf, lo
        if starts.size * _PAGE >= 2 * (hi - lo):  # two ranges a page on average: every page is needed
            pread_exact(fd, buf[: hi - lo], lo)
            return buf, lo
        base = lo // _PAGE
        pages = (hi - 1) // _PAGE - base + 1
        first = np.minimum(starts, hi - 1) // _PAGE - base
        last = (np.minimum(np.maximum(stops, starts + 1), hi) - 1) // _PAGE - base
        # Pages covered by some range: +1 where a range's first page is, -1 past its last one.
        cover = np.cumsum(np.bincount(first, minlength=pages + 1) - np.bincount(last + 1, minlength=pages + 1))
        runs = np.flatnonzero(np.diff((cover[:pages] > 0).astype(np.int8), prepend=0, append=0)).reshape(-1, 2)
        # A call costs about what copying a page does: runs with a page or two between them are one.
        keep = np.flatnonzero(runs[1:, 0] - runs[:-1, 1] > _GAP)
        run_starts = np.maximum((base + runs[np.r_[0, keep + 1], 0]) * _PAGE, lo)
        run_stops = np.minimum((base + runs[np.r_[keep, len(runs) - 1], 1]) * _PAGE, hi)
        view = buf.data
        for a, b in zip(run_starts.tolist(), run_stops.tolist()):
            if os.preadv(fd, [view[a - lo : b - lo]], a) != b - a:
                pread_exact(fd, buf[a - lo : b - lo], a)  # finish a short read, or raise
        return buf, lo


def count_newlines(fd: int, stop: int, start: int = 0) -> int:
    """The number of ``\\n`` in bytes ``[start, stop)`` of ``fd`` (or up to its end, if shorter), read
    16 MiB at a time, so locating a line of a 50 GB file costs 16 MiB of memory, not 50 GB."""
    buf = np.empty(max(0, min(stop - start, _COUNT_CHUNK)), np.uint8)
    count, offset = 0, start
    while offset < stop:
        part = buf[: min(buf.size, stop - offset)]
        got = os.preadv(fd, [part.data], offset)
        if got == 0:
            break
        count += int(np.count_nonzero(part[:got] == 10))
        offset += got
    return count

"""Keeping a process's resident set small: dropping read pages, returning freed heap to the OS."""

from __future__ import annotations

import ctypes
import functools
import mmap
from typing import Any

__all__ = ["drop_pages", "free_pages", "return_freed_memory"]


def drop_pages(mm: mmap.mmap, start: int, stop: int) -> None:
    """Drop ``[start, stop)`` of a read-only file map from the resident set (the page cache keeps it)."""
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if advice is None:  # not on this platform: the pages stay mapped, which is only a cost
        return
    start -= start % mmap.PAGESIZE
    stop = min(stop, len(mm))
    if stop > start:
        mm.madvise(advice, start, stop - start)


def free_pages(mm: mmap.mmap, start: int, stop: int) -> None:
    """Free the pages of an anonymous private map that lie wholly inside ``[start, stop)`` (a page
    that also holds bytes outside it is kept): they read as zeros from now on."""
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if advice is None:
        return
    page = mmap.PAGESIZE
    start, stop = -(-start // page) * page, min(stop, len(mm)) // page * page
    if stop > start:
        mm.madvise(advice, start, stop - start)


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def return_freed_memory() -> None:
    """Hand the build's freed temporaries back to the OS.

    glibc keeps freed heap memory for reuse, and after large numpy arrays it serves even tens of MiB
    from the heap: without this, a rank would keep several times its shard's size resident after a
    build, and every DataLoader worker forked later would share (and be charged for) those pages.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)

"""Keeping a process's resident set small: huge-page maps, freeing pages, returning freed heap to the OS."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import mmap
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

__all__ = [
    "anonymous_map",
    "free_pages",
    "freeze_inherited_objects",
    "populate_map",
    "return_freed_memory",
    "settle_before_each_fork",
    "settle_before_fork",
    "small_pages",
]

_HUGE = 2 << 20  # a transparent huge page (x86-64, arm64 with 4 KiB pages)


def anonymous_map(size: int) -> mmap.mmap:
    """A new private anonymous map of ``size`` bytes (``size > 0``), unmapped whole when it goes.

    From 2 MiB on it asks for transparent huge pages (where the system leaves them to
    ``madvise``): filling it then takes one fault per 2 MiB instead of one per 4 KiB page.
    """
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None and size >= _HUGE:
        with contextlib.suppress(OSError):  # a kernel without THP says EINVAL: small pages, then
            mm.madvise(advice)
    return mm


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


# madvise's MADV_POPULATE_WRITE (Linux 5.14; Python's mmap names it from 3.13 on)
_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23 if sys.platform.startswith("linux") else None)


def populate_map(mm: mmap.mmap, start: int, stop: int) -> None:
    """Fault in the pages of a writable shared or private map that hold bytes ``[start, stop)``, in one
    system call instead of one fault a 4 KiB page as they are first written (nothing where the kernel
    cannot: they fault in as they are written then). Their bytes are unchanged."""
    if _POPULATE_WRITE is None:
        return
    page = mmap.PAGESIZE
    start, stop = start // page * page, min(stop, len(mm))
    if stop > start:
        with contextlib.suppress(OSError):  # EINVAL before Linux 5.14; ENOMEM, EFAULT: left to the faults
            mm.madvise(_POPULATE_WRITE, start, stop - start)


@functools.cache
def _numpy_huge_pages() -> Any:
    # numpy's switch for the huge-page advice it gives each new array of 4 MiB or more (None: a numpy without it).
    for module in ("_core", "core"):
        setter = getattr(getattr(getattr(np, module, None), "multiarray", None), "_set_madvise_hugepage", None)
        if setter is not None:
            return setter
    return None


_small: list[int] = [0]  # how many small_pages() blocks are open
_small_lock = threading.Lock()


@contextlib.contextmanager
def small_pages() -> Iterator[None]:
    """While inside, numpy's new large arrays (in any thread) take small pages: numpy asks huge pages for
    each array of 4 MiB or more, and where the kernel defragments memory for them on demand (Linux's
    ``defrag=madvise``, a common default) a busy host may compact memory at each such fault, many
    times the cost of the pages themselves; a small page costs a bounded fault. For work that fills
    many new arrays once (a shard's build). Nested and concurrent blocks restore numpy's setting when
    the last one exits."""
    setter = _numpy_huge_pages()
    if setter is None:
        yield
        return
    with _small_lock:
        if not _small[0]:
            _small.append(bool(setter(False)))  # numpy's own setting, restored by the last to exit
        _small[0] += 1
    try:
        yield
    finally:
        with _small_lock:
            _small[0] -= 1
            if not _small[0]:
                setter(_small.pop())


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


def settle_before_fork() -> None:
    """Collect all garbage (a full collection), then :func:`return_freed_memory`: what a process about to fork
    workers that share its pages does first.

    A full collection writes to the header of every object the collector tracks: in a process with forked
    children alive, each page holding such objects is then copied (the process writes its own copy, the
    children keep the old one), the pages of every module imported included. CPython runs one once the
    objects that survived since the last reach a quarter of the rest, and a build leaves many (modules
    imported, the plan), which a pass's allocations could then tip over while its workers run. A full
    collection now starts that count afresh, before any worker shares the pages, and frees the build's
    reference cycles before the freed memory is handed back.
    """
    gc.collect()
    return_freed_memory()


def _settle_if_grown() -> None:
    # The oldest generation's count is the number of middle-generation collections since the last full one:
    # zero means nothing has moved into the oldest generation since (no survivors pending), so a collection
    # now would scan the whole heap for nothing. The second and later workers of one DataLoader find it so.
    if gc.get_count()[2]:
        settle_before_fork()


_registered: set[str] = set()  # the fork hooks registered in this process, by name


def _at_fork_once(name: str, **hooks: Callable[[], object]) -> None:
    """``os.register_at_fork(**hooks)`` once per process for ``name`` (where processes fork)."""
    if name not in _registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(**hooks)
        _registered.add(name)


def settle_before_each_fork() -> None:
    """From now on, ``os.fork`` in this process (a fork DataLoader worker starting, whichever framework starts
    it) first runs :func:`settle_before_fork` if objects moved into the collector's oldest generation since its
    last full collection; once per process.

    A process that never forks pays nothing, and one that forks several workers in a row collects once. A child
    that execs (``subprocess`` without ``preexec_fn``, spawn and forkserver workers) does not run the hook.
    """
    _at_fork_once("settle", before=_settle_if_grown)


def freeze_inherited_objects() -> None:
    """From now on, a process forked from this one (a fork DataLoader worker) moves the objects it inherits to
    the garbage collector's permanent generation as it starts (``gc.freeze``), once per process.

    A collection in the child writes to the header of every object of the generations it collects: each page of
    the parent's objects it reaches is copied into the child (a full collection reaches them all). Frozen, the
    inherited objects are never traversed by the child's collections: their pages stay shared. The cost, in the
    forked child only: a reference cycle among inherited objects that becomes garbage there is not freed until
    the child exits (its new objects are collected as before). The parent is untouched: nothing is frozen there,
    and a child that execs (subprocess) starts afresh.
    """
    _at_fork_once("freeze", after_in_child=gc.freeze)

"""Freeing pages of a build's own maps (only whole pages inside the range, never a neighbour's); new maps."""

from __future__ import annotations

import mmap
import os
import re
from pathlib import Path

import numpy as np
import pytest

from rank_dataset.core.residency import (
    anonymous_map,
    free_pages,
    populate_map,
    settle_before_each_fork,
    settle_before_fork,
    small_pages,
)

PAGE = mmap.PAGESIZE


def test_free_pages_frees_only_pages_wholly_inside_the_range() -> None:
    mm = mmap.mmap(-1, 5 * PAGE, flags=mmap.MAP_PRIVATE)
    a = np.frombuffer(mm, np.uint8)
    a[:] = 1
    free_pages(mm, 100, 4 * PAGE + 10)  # pages 1-3 lie wholly inside; 0 and 4 hold bytes outside
    pages = a.reshape(5, PAGE)
    assert pages[0].all() and pages[4].all()
    assert not pages[1:4].any()  # freed: they read as zeros


def test_free_pages_of_a_range_within_one_page_frees_nothing() -> None:
    mm = mmap.mmap(-1, 2 * PAGE, flags=mmap.MAP_PRIVATE)
    a = np.frombuffer(mm, np.uint8)
    a[:] = 7
    free_pages(mm, 10, PAGE - 10)
    free_pages(mm, PAGE + 1, 3 * PAGE)  # past the end of the map: cut at it, and page 1 is partial
    assert (a == 7).all()


def _rss_kib() -> int:
    return int(re.search(r"^Rss:\s+(\d+)", Path("/proc/self/smaps_rollup").read_text(), re.M).group(1))


def _populates() -> bool:
    """Whether this kernel has madvise's MADV_POPULATE_WRITE (Linux 5.14)."""
    release = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return bool(release) and (int(release.group(1)), int(release.group(2))) >= (5, 14)


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="no /proc/self/smaps_rollup here")
def test_populate_map_maps_a_shared_maps_pages_in_before_any_write_and_keeps_its_bytes() -> None:
    if not _populates():
        pytest.skip("no MADV_POPULATE_WRITE before Linux 5.14 (populate_map then does nothing)")
    fd = os.memfd_create("populate_test")
    try:
        os.ftruncate(fd, 16 << 20)
        mm = mmap.mmap(fd, 16 << 20)
    finally:
        os.close(fd)
    mm[5 * PAGE : 5 * PAGE + 3] = b"abc"  # one page written before
    before = _rss_kib()
    populate_map(mm, PAGE + 1, 12 << 20)  # from inside page 1: that page too
    grown = _rss_kib() - before
    assert (12 << 10) - 12 <= grown <= (12 << 10) + 256, f"{grown} KiB mapped in for 12 MiB less a page"
    assert mm[5 * PAGE : 5 * PAGE + 3] == b"abc" and mm[:PAGE] == bytes(PAGE) and mm[-PAGE:] == bytes(PAGE)
    populate_map(mm, 0, 64 << 20)  # past the end: cut at it
    assert _rss_kib() - before >= (16 << 10) - 8 - 64
    mm.close()


def _anon_huge_kib() -> int:
    return int(re.search(r"AnonHugePages:\s+(\d+)", Path("/proc/self/smaps_rollup").read_text()).group(1))


@pytest.mark.parametrize("size", [1, 5000, 3 << 20])
def test_anonymous_map_is_a_private_zeroed_map_of_its_size(size: int) -> None:
    mm = anonymous_map(size)
    a = np.frombuffer(mm, np.uint8)
    assert a.size == size and not a.any()
    a[:] = 9
    assert (a == 9).all()


def test_a_large_anonymous_map_is_filled_with_huge_pages_where_the_system_gives_them_on_request() -> None:
    setting = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not setting.exists() or "[never]" in setting.read_text() or not Path("/proc/self/smaps_rollup").exists():
        pytest.skip("no transparent huge pages here")
    before = _anon_huge_kib()
    mm = anonymous_map(16 << 20)
    np.frombuffer(mm, np.uint8)[:] = 1
    # 16 MiB holds at least 7 aligned 2 MiB pages; the kernel may fall back to small pages when
    # memory is fragmented, so ask for some, not all.
    assert _anon_huge_kib() - before >= 2048, "no huge page backs a 16 MiB map that asked for them"


def _numpy_advice() -> bool | None:
    """Whether numpy asks huge pages for its large arrays now (None: a numpy without the switch)."""
    setter = getattr(getattr(getattr(np, "_core", None), "multiarray", None), "_set_madvise_hugepage", None)
    if setter is None:
        return None
    now = bool(setter(True))
    setter(now)
    return now


def test_small_pages_puts_numpys_large_arrays_in_small_pages_and_restores_its_setting_after_the_last_block() -> None:
    setting = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not setting.exists() or "[madvise]" not in setting.read_text() or not Path("/proc/self/smaps_rollup").exists():
        pytest.skip("huge pages are not given on request here (only then does numpy's advice decide)")
    before = _numpy_advice()
    if before is None:
        pytest.skip("this numpy has no huge-page switch")
    huge = _anon_huge_kib()
    with small_pages():
        with small_pages():  # nested: the outer block still holds after the inner one exits
            pass
        assert _numpy_advice() is False
        a = np.ones(32 << 20, np.uint8)  # numpy would ask huge pages for it
        assert _anon_huge_kib() - huge < 2048, "an array made inside small_pages() took huge pages"
    assert _numpy_advice() is before
    del a


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="fork hooks are POSIX")
def test_a_forked_child_freezes_what_it_inherits_and_the_parent_does_not() -> None:
    import gc

    from rank_dataset.core.residency import freeze_inherited_objects

    freeze_inherited_objects()
    freeze_inherited_objects()  # once per process: a second call registers nothing more
    assert gc.get_freeze_count() == 0  # the parent's collections go on as before
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and leave without running the parent's test machinery
        try:
            os.write(write, str(gc.get_freeze_count()).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        frozen = int(os.read(read, 64).decode())
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert frozen > 1000  # every object the child inherited (a test process holds tens of thousands)
    assert gc.get_freeze_count() == 0


class _Node:
    def __init__(self) -> None:
        self.me = self


def test_settle_before_fork_collects_every_generation_and_frees_cycles() -> None:
    import gc
    import weakref

    full: list[int] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:  # the oldest
            full.append(info["collected"])

    node = _Node()
    gone = weakref.ref(node)
    del node  # a reference cycle: only a collection frees it
    gc.callbacks.append(record)
    try:
        settle_before_fork()
    finally:
        gc.callbacks.remove(record)
    assert gone() is None
    assert len(full) == 1 and full[0] >= 1  # one full collection, which freed the cycle


def _full_collections_in_a_fork() -> int:
    """Fork a child that exits at once; the full collections the parent ran for it."""
    import gc

    full: list[int] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            full.append(1)

    gc.callbacks.append(record)
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
    finally:
        gc.callbacks.remove(record)
    os.waitpid(pid, 0)
    return len(full)


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="fork hooks are POSIX")
def test_a_fork_collects_first_when_the_oldest_generation_grew_since_the_last_full_collection() -> None:
    import gc
    import weakref

    settle_before_each_fork()
    settle_before_each_fork()  # once per process: a second call registers nothing more
    enabled = gc.isenabled()
    gc.disable()  # only what the hook asks for runs
    try:
        node = _Node()
        gone = weakref.ref(node)
        gc.collect(1)  # the survivors (the node among them) move into the oldest generation
        del node  # a reference cycle in the oldest generation: only a full collection frees it
        assert gone() is not None
        first = _full_collections_in_a_fork()
        assert gone() is None  # the hook's full collection freed it before the fork
        second = _full_collections_in_a_fork()  # nothing moved since: no scan of the whole heap
        gc.collect(1)
        third = _full_collections_in_a_fork()
    finally:
        if enabled:
            gc.enable()
    assert (first, second, third) == (1, 0, 1)

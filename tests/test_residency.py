"""Freeing pages of a build's own maps: only whole pages inside the range, never a neighbour's."""

from __future__ import annotations

import mmap

import numpy as np

from rank_dataset._residency import free_pages

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

"""Returning freed heap memory to the OS (glibc), after the large temporaries of a shard build."""

from __future__ import annotations

import ctypes
import functools
from typing import Any


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

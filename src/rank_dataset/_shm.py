"""Numpy arrays in named shared memory, so a child process maps them instead of unpickling a copy.

A segment is a file in ``/dev/shm`` (or the temporary directory where there is none), mapped with
``mmap``; a handle to it is the file's path and the arrays' layout. The process that created a
segment removes its name when the owner object is collected; processes that mapped it keep their
mapping until they drop it, as with any unlinked file.

Segments are named ``rank_dataset_<random>``, or ``rank_dataset_<tag>_<random>`` when the
environment sets ``RANK_DATASET_SHM_TAG``, so that a job (or a test session) can find the segments
that its own processes left behind.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

_SHM_DIR = "/dev/shm"
TAG_ENV = "RANK_DATASET_SHM_TAG"


@dataclass(frozen=True)
class Handle:
    """What a child needs to map the arrays again: the segment path and each array's layout."""

    path: str
    layout: tuple[tuple[str, int, int], ...]  # (dtype, length, byte offset) per array


def _segment_dir() -> str:
    return _SHM_DIR if os.path.isdir(_SHM_DIR) and os.access(_SHM_DIR, os.W_OK) else tempfile.gettempdir()


def share(owner: object, arrays: Sequence[npt.NDArray[Any]]) -> tuple[Handle, list[npt.NDArray[Any]]]:
    """Copy 1-D ``arrays`` into one new segment tied to ``owner``'s lifetime.

    Returns the handle and views of the copies (which ``owner`` should keep instead of the originals).
    """
    layout = []
    offset = 0
    for a in arrays:
        offset = -(-offset // 64) * 64  # keep every array aligned for its dtype
        layout.append((a.dtype.str, int(a.size), offset))
        offset += a.nbytes
    tag = os.environ.get(TAG_ENV, "")
    fd, path = tempfile.mkstemp(prefix=f"rank_dataset_{tag}_" if tag else "rank_dataset_", dir=_segment_dir())
    try:
        os.ftruncate(fd, max(offset, 1))
        mm = mmap.mmap(fd, max(offset, 1))
    finally:
        os.close(fd)
    weakref.finalize(owner, _unlink, path, os.getpid())
    handle = Handle(path, tuple(layout))
    views = _views(mm, handle)
    for view, a in zip(views, arrays):
        view[...] = a
    return handle, views


def attach(handle: Handle) -> list[npt.NDArray[Any]]:
    """Map the arrays of ``handle`` read-only. Raises FileNotFoundError if the segment is gone."""
    with open(handle.path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    return _views(mm, handle)


def _views(mm: mmap.mmap, handle: Handle) -> list[npt.NDArray[Any]]:
    # Each view keeps the map alive through its base, so the map is unmapped with the last view.
    return [np.frombuffer(mm, dtype=np.dtype(dt), count=n, offset=off) for dt, n, off in handle.layout]


def _unlink(path: str, creator: int) -> None:
    # A forked child holds a copy of the owner: only the creating process removes the name.
    if os.getpid() != creator:
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)

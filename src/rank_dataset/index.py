"""The line-offset index of a meta file and its cache on disk. No torch.

The index of a file is the ``(n, 2)`` int64 array of the byte spans of its samples (see
:mod:`rank_dataset.scan`), cached beside the file (or in the user cache directory), keyed by the
file's path, size and mtime, and memory-mapped when read back.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from platformdirs import user_cache_dir

from rank_dataset._residency import drop_pages
from rank_dataset.scan import scan, scan_chunks

__all__ = ["CACHE_DIR_ENV", "Index", "load_index"]

#: Environment variable naming a directory for index caches, used instead of the meta file's own.
CACHE_DIR_ENV = "RANK_DATASET_CACHE_DIR"

_MAGIC = b"RDIDX\x00\x00\x01"
_HEADER = struct.Struct("<8sqqqq")  # magic, file size, file mtime_ns, number of samples, flags
_FLAG_ASCII = 1
_DATA_OFFSET = 64


@dataclass(frozen=True)
class Index:
    """The spans of a file's samples, and whether the file is pure ASCII."""

    spans: npt.NDArray[np.int64]
    ascii: bool
    map: mmap.mmap | None = None  # the cache file's map, when the spans live there

    def release_pages(self, start: int = 0, stop: int | None = None) -> None:
        """Drop the pages of the spans of samples ``[start, stop)`` from this process's resident set."""
        if self.map is not None:
            end = len(self.map) if stop is None else _DATA_OFFSET + 16 * stop
            drop_pages(self.map, _DATA_OFFSET + 16 * start, end)


def _cache_paths(path: Path) -> list[Path]:
    """Where the index of ``path`` may live, in order of preference."""
    digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:32]
    name = f"{path.name}.{digest}.rdidx"
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return [Path(override) / name]
    return [path.with_name(f".{path.name}.rdidx"), Path(user_cache_dir("rank-dataset")) / name]


def _read_cache(cache: Path, size: int, mtime_ns: int) -> Index | None:
    try:
        with open(cache, "rb") as f:
            magic, c_size, c_mtime, n, flags = _HEADER.unpack(f.read(_HEADER.size))
    except (OSError, struct.error):
        return None
    if magic != _MAGIC or c_size != size or c_mtime != mtime_ns:
        return None
    if cache.stat().st_size != _DATA_OFFSET + 16 * n:
        return None
    ascii_only = bool(flags & _FLAG_ASCII)
    if n == 0:
        return Index(np.empty((0, 2), np.int64), ascii_only)
    with open(cache, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    spans = np.frombuffer(mm, dtype="<i8", count=2 * n, offset=_DATA_OFFSET).reshape(n, 2)
    return Index(spans, ascii_only, mm)


def _write_cache(cache: Path, path: Path, size: int, mtime_ns: int) -> bool:
    """Index ``path`` straight into ``cache``.

    The index is written to a temporary file that is then renamed into place, so that concurrent
    builders all succeed and a reader never sees half a file.
    """
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache.parent, prefix=cache.name, suffix=".tmp")
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.seek(_DATA_OFFSET)
            n, ascii_only = 0, True
            for spans, ascii_chunk in scan_chunks(path):
                f.write(spans.astype("<i8", copy=False).data)
                n += len(spans)
                ascii_only = ascii_only and ascii_chunk
            f.seek(0)
            f.write(_HEADER.pack(_MAGIC, size, mtime_ns, n, _FLAG_ASCII if ascii_only else 0))
        os.replace(tmp, cache)
        return True
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        return False


def load_index(path: Path) -> Index:
    """The index of ``path``: from its cache, else built (and cached where a location is writable)."""
    st = path.stat()
    candidates = _cache_paths(path)
    for cache in candidates:
        index = _read_cache(cache, st.st_size, st.st_mtime_ns)
        if index is not None:
            return index
    for cache in candidates:
        if _write_cache(cache, path, st.st_size, st.st_mtime_ns):
            index = _read_cache(cache, st.st_size, st.st_mtime_ns)
            if index is not None:
                return index
    # No writable cache location (or the file changed while being indexed): index in memory.
    return Index(*scan(path))
